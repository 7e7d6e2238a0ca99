/*
 * The C side of crates/tandem-capi/tests/c_entry.rs: opens the image given as argv[1], checks
 * what tandem_batch.h promises for bad arguments and a few known names, then resolves every
 * path of the file argv[2] (one a line) in one batch and prints "result inode mode" a line for
 * the Rust test to compare with the single calls. Exit 0 when every check held.
 */
#include "tandem_batch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

_Static_assert(sizeof(struct tandem_attributes) == 88, "struct tandem_attributes layout");

static int failures;

#define CHECK(condition)                                                                     \
	do {                                                                                 \
		if (!(condition)) {                                                          \
			fprintf(stderr, "batch_test.c:%d: check failed: %s\n", __LINE__,     \
				#condition);                                                 \
			failures++;                                                          \
		}                                                                            \
	} while (0)

#define PATHS_MAX 100000
#define LINE_BYTES 8192

static void check_arguments(tandem_fs *fs)
{
	struct tandem_lookup lookup = { TANDEM_ROOT_INODE, (const uint8_t *)"a", 1 };
	struct tandem_attributes attributes;
	int32_t result = 1;
	tandem_fs *other = NULL;

	CHECK(tandem_open(NULL, 0, &other) == -EINVAL);
	CHECK(tandem_open("/nonexistent/tandem.img", 0, &other) == -ENOENT);
	CHECK(tandem_open("x", 0x80, &other) == -EINVAL);
	CHECK(tandem_lookup_batch(NULL, &lookup, 1, &attributes, &result) == -EBADF);
	CHECK(tandem_lookup_batch((tandem_fs *)0x1234, &lookup, 1, &attributes, &result) == -EBADF);
	CHECK(tandem_lookup_batch(fs, NULL, 1, &attributes, &result) == -EINVAL);
	CHECK(tandem_lookup_batch(fs, &lookup, 1, NULL, &result) == -EINVAL);
	CHECK(tandem_lookup_batch(fs, &lookup, 1, &attributes, NULL) == -EINVAL);
	CHECK(tandem_lookup_batch(fs, &lookup, TANDEM_BATCH_MAX + 1, &attributes, &result) == -EINVAL);
	CHECK(tandem_lookup_batch(fs, &lookup, 1, &attributes, (int32_t *)&attributes) == -EINVAL);
	CHECK(tandem_lookup_batch(fs, NULL, 0, NULL, NULL) == 0);
	CHECK(tandem_resolve_paths(fs, NULL, 0, NULL, NULL) == 0);
	CHECK(result == 1); /* nothing was answered by the refused calls */
}

static void check_lookups(tandem_fs *fs)
{
	static uint8_t long_name[300];
	struct tandem_lookup lookups[7];
	struct tandem_attributes attributes[7];
	int32_t results[7];

	memset(long_name, 'n', sizeof(long_name));
	lookups[0] = (struct tandem_lookup){ TANDEM_ROOT_INODE, (const uint8_t *)"a", 1 };
	lookups[1] = (struct tandem_lookup){ TANDEM_ROOT_INODE, (const uint8_t *)"missing", 7 };
	lookups[2] = (struct tandem_lookup){ TANDEM_ROOT_INODE, long_name, 256 };
	lookups[3] = (struct tandem_lookup){ TANDEM_ROOT_INODE, NULL, 3 };
	lookups[4] = (struct tandem_lookup){ TANDEM_ROOT_INODE, long_name, (size_t)1 << 60 };
	lookups[5] = (struct tandem_lookup){ 987654321, (const uint8_t *)"a", 1 };
	lookups[6] = (struct tandem_lookup){ TANDEM_ROOT_INODE, (const uint8_t *)"a/b", 3 };
	CHECK(tandem_lookup_batch(fs, lookups, 7, attributes, results) == 0);
	CHECK(results[0] == 0 && S_ISDIR(attributes[0].mode) && attributes[0].inode > 1);
	CHECK(results[1] == -ENOENT);
	CHECK(results[2] == -ENAMETOOLONG);
	CHECK(results[3] == -EFAULT);
	CHECK(results[4] == -ENAMETOOLONG);
	CHECK(results[5] == -ENOENT);
	CHECK(results[6] == -EINVAL);
	CHECK(attributes[1].inode == 0); /* failed requests leave zeroed attributes */

	/* "b" looked up in "a" by the inode the first lookup gave. */
	lookups[0] = (struct tandem_lookup){ attributes[0].inode, (const uint8_t *)"b", 1 };
	CHECK(tandem_lookup_batch(fs, lookups, 1, attributes, results) == 0);
	CHECK(results[0] == 0 && S_ISDIR(attributes[0].mode));
}

/* Reads argv[2]'s paths, resolves them in one batch, prints one line per path. */
static void resolve_file(tandem_fs *fs, const char *list)
{
	FILE *file = fopen(list, "r");
	struct tandem_path *paths = calloc(PATHS_MAX, sizeof(*paths));
	struct tandem_attributes *attributes = calloc(PATHS_MAX, sizeof(*attributes));
	int32_t *results = calloc(PATHS_MAX, sizeof(*results));
	char line[LINE_BYTES];
	size_t count = 0;

	CHECK(file != NULL && paths != NULL && attributes != NULL && results != NULL);
	if (file == NULL || paths == NULL || attributes == NULL || results == NULL)
		return;
	while (count < PATHS_MAX && fgets(line, sizeof(line), file) != NULL) {
		size_t length = strcspn(line, "\n");
		uint8_t *copy = malloc(length + 1);
		CHECK(copy != NULL);
		if (copy == NULL)
			break;
		memcpy(copy, line, length);
		paths[count].bytes = copy;
		paths[count].length = length;
		count++;
	}
	fclose(file);
	CHECK(tandem_resolve_paths(fs, paths, count, attributes, results) == 0);
	for (size_t index = 0; index < count; index++) {
		printf("%d %llu %o\n", results[index],
		       results[index] == 0 ? (unsigned long long)attributes[index].inode : 0ULL,
		       results[index] == 0 ? attributes[index].mode : 0u);
		free((void *)paths[index].bytes);
	}
	free(paths);
	free(attributes);
	free(results);
}

int main(int argc, char **argv)
{
	tandem_fs *fs = NULL;
	int opened;

	if (argc != 3) {
		fprintf(stderr, "usage: %s IMAGE PATH_LIST\n", argv[0]);
		return 2;
	}
	opened = tandem_open(argv[1], 0, &fs);
	if (opened != 0) {
		fprintf(stderr, "tandem_open(%s): %s\n", argv[1], strerror(-opened));
		return 1;
	}
	{
		tandem_fs *again = NULL;
		CHECK(tandem_open(argv[1], TANDEM_OPEN_READ_ONLY, &again) == -EBUSY);
	}
	check_arguments(fs);
	check_lookups(fs);
	resolve_file(fs, argv[2]);
	CHECK(tandem_close(fs) == 0);
	CHECK(tandem_close(fs) == -EBADF);
	if (failures != 0) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	return 0;
}
