/*
 * tandem_batch.h - C entry point of the tandemfs batch API (no FUSE mount, no kernel).
 *
 * Opens a tandemfs image (a file or a block device) in this process and answers batches of
 * lookups and path resolutions, one answer per request, as FileSystem::lookup_batch and
 * FileSystem::resolve_paths do in Rust (docs/BATCH.md). Link with -ltandem_capi (the cdylib
 * libtandem_capi.so or the staticlib libtandem_capi.a of crates/tandem-capi).
 *
 * Errors are negative errno values:
 *   - a whole call returns one when its arguments cannot be used: a handle that is not open
 *     (-EBADF), a null array with count > 0 or count > TANDEM_BATCH_MAX (-EINVAL); nothing was
 *     answered then;
 *   - otherwise the call returns 0 and results[i] is 0 (attributes[i] filled) or the request's
 *     own error: -ENOENT, -ENOTDIR, -ENAMETOOLONG, -ELOOP, -EINVAL (an invalid name), -EIO,
 *     and -EFAULT for a null name or path with a length > 0. A path longer than
 *     TANDEM_PATH_MAX bytes answers -ENAMETOOLONG without being read.
 * Names and paths are bytes with a length, not NUL-terminated strings. No permission checks
 * are made (the batch API makes none: docs/BATCH.md). All functions are thread-safe; a handle
 * may serve batches from several threads at once. Encrypted volumes are not opened here
 * (tandem_open answers -EACCES, as for a missing key).
 */
#ifndef TANDEM_BATCH_H
#define TANDEM_BATCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The root directory's inode number. */
#define TANDEM_ROOT_INODE 1
/* The most requests in one batch call. */
#define TANDEM_BATCH_MAX ((size_t)1 << 24)
/* The longest path a resolve reads, in bytes. */
#define TANDEM_PATH_MAX 4096
/* tandem_open flags. */
#define TANDEM_OPEN_READ_ONLY 1u

/* An open volume. Opaque. */
typedef struct tandem_fs tandem_fs;

/* What stat reports for one inode. mode holds the S_IFMT type bits and the permissions. Times
 * are nanoseconds since the Unix epoch. */
struct tandem_attributes {
	uint64_t inode;
	uint64_t generation;
	uint32_t mode;
	uint32_t link_count;
	uint32_t uid;
	uint32_t gid;
	uint64_t size_bytes;
	uint64_t blocks_512;
	int64_t access_time_ns;
	int64_t modify_time_ns;
	int64_t change_time_ns;
	int64_t birth_time_ns;
	uint64_t rdev;
};

/* One lookup: the entry `name` (name_length bytes) in directory `parent`. */
struct tandem_lookup {
	uint64_t parent;
	const uint8_t *name;
	size_t name_length;
};

/* One path: '/'-separated from the root, `length` bytes. */
struct tandem_path {
	const uint8_t *bytes;
	size_t length;
};

/* Mounts the tandemfs image at `image_path` (NUL-terminated) in this process, read-write
 * unless flags has TANDEM_OPEN_READ_ONLY. The image stays locked until tandem_close.
 * Returns 0 and *out, or a negative errno (-ENOENT: no such image, -EBUSY: in use,
 * -EINVAL: unknown flags or a null argument, -EIO: not a tandemfs volume or unreadable). */
int tandem_open(const char *image_path, uint32_t flags, tandem_fs **out);

/* Unmounts and frees `fs`: everything acknowledged is on the image. Returns 0 or a negative
 * errno (-EBADF: not an open handle, e.g. closed already; -EIO: the unmount failed, the handle
 * is closed anyway). */
int tandem_close(tandem_fs *fs);

/* Looks up requests[0..count). results[i] and, when it is 0, attributes[i] take the answer of
 * requests[i]. Returns 0, or a negative errno for the whole call (see above). */
int tandem_lookup_batch(tandem_fs *fs, const struct tandem_lookup *requests, size_t count,
			struct tandem_attributes *attributes, int32_t *results);

/* Resolves paths[0..count), following symbolic links in all but the last component.
 * results[i] and, when it is 0, attributes[i] take the answer of paths[i]. Returns 0, or a
 * negative errno for the whole call (see above). */
int tandem_resolve_paths(tandem_fs *fs, const struct tandem_path *paths, size_t count,
			 struct tandem_attributes *attributes, int32_t *results);

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_BATCH_H */
