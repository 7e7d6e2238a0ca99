/* File handles of the mount suite (test_file_handles in run.sh): what an NFS server does with
 * a re-exported volume.
 *
 *   file_handles save PATH HANDLE_FILE     name_to_handle_at(PATH), written to HANDLE_FILE
 *   file_handles open MOUNT HANDLE_FILE    open_by_handle_at through MOUNT; a regular file's
 *                                          bytes go to standard output, a directory's entries
 *                                          one per line (sorted by the caller)
 *
 * Exits 3 when open_by_handle_at fails with ESTALE (so the caller can expect it for a removed
 * file), 1 for any other failure. Needs CAP_DAC_READ_SEARCH (root). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HANDLE_BYTES_MAX 128

static int fail(const char *what) {
    fprintf(stderr, "file_handles: %s: %s\n", what, strerror(errno));
    return 1;
}

static int save(const char *path, const char *handle_path) {
    char storage[sizeof(struct file_handle) + HANDLE_BYTES_MAX];
    struct file_handle *handle = (struct file_handle *)storage;
    int mount_id;
    handle->handle_bytes = HANDLE_BYTES_MAX;
    if (name_to_handle_at(AT_FDCWD, path, handle, &mount_id, 0) != 0) return fail("name_to_handle_at");
    FILE *out = fopen(handle_path, "wb");
    if (out == NULL) return fail("opening the handle file");
    size_t bytes = sizeof(struct file_handle) + handle->handle_bytes;
    if (fwrite(handle, 1, bytes, out) != bytes || fclose(out) != 0) return fail("writing the handle file");
    return 0;
}

static int copy_out(int descriptor) {
    char buffer[65536];
    for (int rounds = 0; rounds < 1 << 20; rounds++) {
        ssize_t count = read(descriptor, buffer, sizeof buffer);
        if (count < 0) return fail("read");
        if (count == 0) return 0;
        if (fwrite(buffer, 1, (size_t)count, stdout) != (size_t)count) return fail("write");
    }
    fprintf(stderr, "file_handles: file too long\n");
    return 1;
}

static int list(int descriptor) {
    DIR *directory = fdopendir(descriptor);
    if (directory == NULL) return fail("fdopendir");
    struct dirent *entry;
    errno = 0;
    while ((entry = readdir(directory)) != NULL) printf("%s\n", entry->d_name);
    if (errno != 0) return fail("readdir");
    closedir(directory);
    return 0;
}

static int open_handle(const char *mount, const char *handle_path) {
    char storage[sizeof(struct file_handle) + HANDLE_BYTES_MAX];
    struct file_handle *handle = (struct file_handle *)storage;
    FILE *in = fopen(handle_path, "rb");
    if (in == NULL) return fail("opening the handle file");
    size_t count = fread(storage, 1, sizeof storage, in);
    fclose(in);
    if (count < sizeof(struct file_handle) || handle->handle_bytes > HANDLE_BYTES_MAX ||
        count != sizeof(struct file_handle) + handle->handle_bytes) {
        fprintf(stderr, "file_handles: %s is not a saved handle\n", handle_path);
        return 1;
    }
    int mount_descriptor = open(mount, O_RDONLY | O_DIRECTORY);
    if (mount_descriptor < 0) return fail("opening the mount point");
    int descriptor = open_by_handle_at(mount_descriptor, handle, O_RDONLY);
    if (descriptor < 0) {
        if (errno == ESTALE) {
            fprintf(stderr, "file_handles: open_by_handle_at: %s\n", strerror(errno));
            return 3;
        }
        return fail("open_by_handle_at");
    }
    struct stat status;
    if (fstat(descriptor, &status) != 0) return fail("fstat");
    return S_ISDIR(status.st_mode) ? list(descriptor) : copy_out(descriptor);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "save") == 0) return save(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "open") == 0) return open_handle(argv[2], argv[3]);
    fprintf(stderr, "usage: file_handles save PATH HANDLE_FILE | open MOUNT HANDLE_FILE\n");
    return 2;
}
