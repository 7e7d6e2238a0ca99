/*
 * insert_collapse - insert bytes into and collapse a range of a file on a mounted tandemfs.
 *
 *   cc -Wall -Wextra -I include -o insert_collapse examples/insert_collapse.c
 *   ./insert_collapse /mnt/tandem/example.txt
 *
 * Writes "hello world", inserts ", dear" after "hello", collapses the ", dear " back out
 * together with one more byte, inserts three zero bytes, and prints each state.
 * Exits 0 when every state is as expected.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include "tandem.h"

static int show(int fd, const char *step, const char *expected, size_t expected_length)
{
	char contents[64];
	ssize_t count = pread(fd, contents, sizeof contents, 0);
	size_t index;
	if (count < 0) {
		perror("pread");
		return -1;
	}
	printf("%-22s \"", step);
	for (index = 0; index < (size_t)count; index++) {
		if (contents[index] == '\0')
			printf("\\0");
		else
			putchar(contents[index]);
	}
	printf("\"\n");
	if ((size_t)count != expected_length || memcmp(contents, expected, expected_length) != 0) {
		fprintf(stderr, "unexpected contents after %s\n", step);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const char greeting[] = "hello world";
	static const char insertion[] = ", dear";
	int fd;

	if (argc != 2) {
		fprintf(stderr, "usage: %s FILE-ON-TANDEMFS\n", argv[0]);
		return 2;
	}
	fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	if (pwrite(fd, greeting, strlen(greeting), 0) != (ssize_t)strlen(greeting)) {
		perror("pwrite");
		return 1;
	}
	if (show(fd, "written", "hello world", 11) != 0)
		return 1;

	if (tandem_insert(fd, 5, insertion, strlen(insertion)) != 0) {
		perror("tandem_insert");
		return 1;
	}
	if (show(fd, "after insert at 5", "hello, dear world", 17) != 0)
		return 1;

	/* Remove ", dear w": 8 bytes at offset 5. */
	if (tandem_collapse(fd, 5, 8) != 0) {
		perror("tandem_collapse");
		return 1;
	}
	if (show(fd, "after collapse 5+8", "helloorld", 9) != 0)
		return 1;

	if (tandem_insert_zeros(fd, 0, 3) != 0) {
		perror("tandem_insert_zeros");
		return 1;
	}
	if (show(fd, "after 3 zeros at 0", "\0\0\0helloorld", 12) != 0)
		return 1;

	close(fd);
	return 0;
}
