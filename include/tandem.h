/*
 * tandem.h - C interface to tandemfs.
 *
 * Byte-granular insert and collapse on a file of a mounted tandemfs (tandem mount).
 *
 * fallocate(2) cannot do this through FUSE: the kernel's FUSE client answers
 * FALLOC_FL_INSERT_RANGE and FALLOC_FL_COLLAPSE_RANGE with EOPNOTSUPP without asking the
 * file system, and those flags only take block-aligned ranges anyway. tandemfs therefore
 * defines two ioctl commands on an open file. Both take a struct tandem_range.
 *
 *   TANDEM_IOC_INSERT    Insert `length` bytes at `offset` (offset <= file size); the bytes
 *                        after `offset` move up by `length`.
 *                        data == 0: the inserted bytes are a hole and read as zeros.
 *                        data != 0: the inserted bytes are the `length` bytes at address
 *                        `data` in the caller's memory, inserted in one operation.
 *   TANDEM_IOC_COLLAPSE  Remove `length` bytes at `offset` (offset + length <= file size);
 *                        the bytes after the range move down. `data` must be 0.
 *
 * The file must be open for writing. The ioctl returns 0, or -1 with errno set:
 *   EBADF       the file is not open for writing
 *   EINVAL      the range lies outside the file, or COLLAPSE with data != 0
 *   EFAULT      data points at memory the caller cannot read
 *   ENOSPC, EFBIG, EIO, EROFS  as for write(2)
 *   ENOTTY      the file is not on tandemfs
 *   EOPNOTSUPP  (INSERT with data != 0 only) the server could not copy the bytes out of the
 *               caller. FUSE delivers only the fixed-size struct to the server, which then
 *               reads `data` from the calling process with process_vm_readv(2); that is
 *               refused when the server may not trace the caller (another user, another PID
 *               namespace) or for more than TANDEM_INLINE_INSERT_MAX bytes. Fall back to
 *               inserting a hole and writing the data into it with pwrite(2), as
 *               tandem_insert() below does. The result is the same; only a concurrent
 *               reader may briefly see zeros.
 *
 * After either command the server drops the kernel's cached pages from `offset` on and the
 * cached size, so read(2) and mmap(2) see the new layout. Call fstat(2) after the ioctl if
 * the same process next appends with O_APPEND (the helpers below do).
 */
#ifndef TANDEM_H
#define TANDEM_H

#include <errno.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tandem_range {
	uint64_t offset; /* byte offset in the file */
	uint64_t length; /* bytes to insert or remove */
	uint64_t data;   /* INSERT: address of `length` bytes, or 0 for zeros; COLLAPSE: 0 */
};

#define TANDEM_IOC_MAGIC 0xD4
#define TANDEM_IOC_INSERT _IOW(TANDEM_IOC_MAGIC, 1, struct tandem_range)
#define TANDEM_IOC_COLLAPSE _IOW(TANDEM_IOC_MAGIC, 2, struct tandem_range)

/*
 * TANDEM_IOC_DEFRAG (compaction, `tandem defrag`): when the file holds more than
 * factor_millis / 1000 times the bytes it maps, its fragmented runs of extents are rewritten
 * into whole blocks (every byte, the size and the times stay; the old blocks are free at the
 * next checkpoint). The caller sets factor_millis (at least 1000; UINT64_MAX only reports);
 * the server fills in the rest. EINVAL for a factor below 1000, EBADF when not open for
 * writing.
 */
struct tandem_defrag {
	uint64_t factor_millis;     /* in: compact above this many thousandths of the bytes */
	uint64_t mapped_bytes;      /* out: bytes of written and unwritten extents */
	uint64_t held_bytes_before; /* out: bytes of blocks held before */
	uint64_t held_bytes_after;  /* out: bytes of blocks held after */
	uint64_t records;           /* out: compaction records logged (0: nothing to do) */
};

#define TANDEM_IOC_DEFRAG _IOWR(TANDEM_IOC_MAGIC, 3, struct tandem_defrag)

/* Largest INSERT with data that the server copies in one piece (64 MiB). */
#define TANDEM_INLINE_INSERT_MAX ((uint64_t)64 << 20)

/* Inserts `length` zero bytes at `offset`. Returns 0 or -1 with errno set. */
static inline int tandem_insert_zeros(int fd, uint64_t offset, uint64_t length)
{
	struct tandem_range range = { offset, length, 0 };
	struct stat status;
	if (length == 0)
		return 0;
	if (ioctl(fd, TANDEM_IOC_INSERT, &range) != 0)
		return -1;
	return fstat(fd, &status);
}

/* Inserts the `length` bytes at `data` at `offset`. Returns 0 or -1 with errno set. */
static inline int tandem_insert(int fd, uint64_t offset, const void *data, uint64_t length)
{
	struct tandem_range range = { offset, length, (uint64_t)(uintptr_t)data };
	const char *bytes = (const char *)data;
	uint64_t written = 0;
	struct stat status;
	if (length == 0)
		return 0;
	if (length <= TANDEM_INLINE_INSERT_MAX) {
		if (ioctl(fd, TANDEM_IOC_INSERT, &range) == 0)
			return fstat(fd, &status);
		if (errno != EOPNOTSUPP)
			return -1;
	}
	if (tandem_insert_zeros(fd, offset, length) != 0)
		return -1;
	while (written < length) {
		ssize_t count = pwrite(fd, bytes + written, length - written, (off_t)(offset + written));
		if (count < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		written += (uint64_t)count;
	}
	return 0;
}

/* Removes `length` bytes at `offset`. Returns 0 or -1 with errno set. */
static inline int tandem_collapse(int fd, uint64_t offset, uint64_t length)
{
	struct tandem_range range = { offset, length, 0 };
	struct stat status;
	if (length == 0)
		return 0;
	if (ioctl(fd, TANDEM_IOC_COLLAPSE, &range) != 0)
		return -1;
	return fstat(fd, &status);
}

#ifdef __cplusplus
}
#endif

#endif /* TANDEM_H */
