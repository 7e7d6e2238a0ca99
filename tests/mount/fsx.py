#!/usr/bin/env python3
"""fsx-style seeded random operations on one file, every read checked against a shadow copy.

usage: fsx.py run FILE SEED OPERATIONS SHADOW [MAX_SIZE_BYTES]
       fsx.py compare FILE SHADOW

`run` applies OPERATIONS random operations to FILE (created empty) and mirrors each in a
shadow copy in memory: unaligned writes, reads, truncation up and down, fallocate (allocate,
keep-size, punch hole, zero range with and without keep-size), writes and reads through mmap
with msync, copy_file_range within the file and from a second file, O_APPEND writes through a
second descriptor, fsync, closing and reopening, and tandemfs's byte-granular insert (zeros
and data) and collapse ioctls. After each operation the size is checked, and after each read
the bytes. At the end the whole file is compared and the shadow is written to SHADOW, so that
`compare` can check the file again after an unmount, fsck and remount.

Exits 1 with the seed, the operation number and a log of the last operations on the first
mismatch, so a failure reproduces with the same seed.
"""
import collections
import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import random
import struct
import sys

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10

# include/tandem.h: struct tandem_range { u64 offset, length, data }; _IOW(0xD4, n, 24 bytes).
TANDEM_IOC_INSERT = 0x4018D401
TANDEM_IOC_COLLAPSE = 0x4018D402

PAGE_BYTES = mmap.PAGESIZE
# Offsets and lengths cluster around these so that operations start and end on both sides of
# page (4 KiB) and larger boundaries, where off-by-one errors live.
BOUNDARIES = [4096, 8192, 65536, 131072, 1 << 20]

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def fallocate(descriptor, mode, offset, length):
    if libc.fallocate(descriptor, mode, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class Failure(Exception):
    pass


class Tester:
    def __init__(self, path, seed, max_size):
        self.path = path
        self.seed = seed
        self.max_size = max_size
        self.generator = random.Random(seed)
        self.shadow = bytearray()
        self.descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.history = collections.deque(maxlen=30)
        self.counts = collections.Counter()
        self.insert_supported = True

    # ------------------------------------------------------------------ choosing numbers

    def offset(self, limit):
        """An offset in [0, limit], often next to a power-of-two boundary."""
        assert limit >= 0
        if limit == 0:
            return 0
        choice = self.generator.random()
        if choice < 0.4:
            boundary = self.generator.choice(BOUNDARIES)
            candidates = [boundary * k + d for k in range(1, 1 + limit // boundary) for d in (-1, 0, 1)]
            candidates = [c for c in candidates if 0 <= c <= limit][:64]
            if candidates:
                return self.generator.choice(candidates)
        if choice < 0.5:
            return limit
        return self.generator.randint(0, limit)

    def length(self, limit):
        """A length in [1, limit]: mostly small, sometimes a page or more, now and then large."""
        assert limit >= 1
        choice = self.generator.random()
        if choice < 0.45:
            value = self.generator.randint(1, 600)
        elif choice < 0.75:
            value = self.generator.choice([PAGE_BYTES - 1, PAGE_BYTES, PAGE_BYTES + 1]) * self.generator.randint(1, 4)
        elif choice < 0.95:
            value = self.generator.randint(1, 200_000)
        else:
            value = self.generator.randint(1, 1 << 20)
        return max(1, min(value, limit))

    def data(self, length):
        # A seeded pattern that differs per call: random bytes are slow to generate in bulk.
        stamp = self.generator.randbytes(16)
        return (stamp * (length // 16 + 1))[:length]

    # ------------------------------------------------------------------ checks

    def fail(self, message):
        raise Failure(message)

    def check_size(self, where):
        size = os.fstat(self.descriptor).st_size
        if size != len(self.shadow):
            self.fail(f"{where}: size {size}, expected {len(self.shadow)}")

    def check_bytes(self, offset, got, where):
        expected = bytes(self.shadow[offset:offset + len(got)])
        if got != expected:
            first = next(i for i in range(len(got)) if i >= len(expected) or got[i] != expected[i])
            self.fail(
                f"{where}: {len(got)} bytes at {offset} differ first at byte {offset + first}: "
                f"got {got[first:first + 16].hex()}, expected {expected[first:first + 16].hex()}"
            )

    def read_range(self, offset, length, where):
        got = bytearray()
        # A bounded loop: each pread returns at least one byte before the end of file.
        for _ in range(length // 4096 + 64):
            if len(got) >= length:
                break
            chunk = os.pread(self.descriptor, length - len(got), offset + len(got))
            if not chunk:
                break
            got += chunk
        expected_length = max(0, min(length, len(self.shadow) - offset))
        if len(got) != expected_length:
            self.fail(f"{where}: read of {length} at {offset} returned {len(got)} bytes, expected {expected_length}")
        self.check_bytes(offset, bytes(got), where)

    def check_all(self, where):
        self.check_size(where)
        self.read_range(0, len(self.shadow), where)

    # ------------------------------------------------------------------ operations

    def op_write(self):
        offset = self.offset(min(len(self.shadow) + 65536, self.max_size - 1))
        length = self.length(self.max_size - offset)
        data = self.data(length)
        self.note(f"write {length} at {offset}")
        written = os.pwrite(self.descriptor, data, offset)
        if written != length:
            self.fail(f"pwrite wrote {written} of {length}")
        self.put(offset, data)
        self.read_range(max(0, offset - 7), length + 14, "read after write")

    def put(self, offset, data):
        end = offset + len(data)
        if end > len(self.shadow):
            self.shadow.extend(bytes(end - len(self.shadow)))
        self.shadow[offset:end] = data

    def op_read(self):
        offset = self.offset(len(self.shadow))
        length = self.length(max(1, self.max_size))
        self.note(f"read {length} at {offset}")
        self.read_range(offset, length, "read")

    def op_truncate(self):
        if self.generator.random() < 0.5:
            size = self.offset(len(self.shadow))
        else:
            size = min(self.max_size, len(self.shadow) + self.length(300_000))
        self.note(f"truncate to {size} from {len(self.shadow)}")
        os.ftruncate(self.descriptor, size)
        self.resize(size)
        self.check_size("truncate")
        self.read_range(max(0, size - 5000), 10000, "read after truncate")

    def resize(self, size):
        if size < len(self.shadow):
            del self.shadow[size:]
        else:
            self.shadow.extend(bytes(size - len(self.shadow)))

    def op_fallocate(self):
        offset = self.offset(min(len(self.shadow) + 8192, self.max_size - 1))
        length = self.length(self.max_size - offset)
        end = offset + length
        mode = self.generator.choice(
            [0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE,
             FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE]
        )
        self.note(f"fallocate mode {mode:#x} {length} at {offset} (size {len(self.shadow)})")
        fallocate(self.descriptor, mode, offset, length)
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            zero_end = min(end, len(self.shadow)) if mode & FALLOC_FL_KEEP_SIZE else end
            if zero_end > offset:
                self.put(offset, bytes(zero_end - offset))
        if not mode & FALLOC_FL_KEEP_SIZE and end > len(self.shadow):
            self.resize(end)
        self.check_size("fallocate")
        self.read_range(max(0, offset - 5), length + 10, "read after fallocate")

    def op_mmap(self):
        if len(self.shadow) == 0:
            return self.op_write()
        offset = self.offset(len(self.shadow) - 1)
        length = self.length(len(self.shadow) - offset)
        page_start = offset - offset % PAGE_BYTES
        region = mmap.mmap(self.descriptor, offset + length - page_start, offset=page_start)
        try:
            if self.generator.random() < 0.5:
                self.note(f"mmap read {length} at {offset}")
                self.check_bytes(offset, region[offset - page_start:offset - page_start + length], "mmap read")
            else:
                data = self.data(length)
                self.note(f"mmap write {length} at {offset}")
                region[offset - page_start:offset - page_start + length] = data
                self.put(offset, data)
                # Half the time without msync: then munmap writes the dirty pages back (FUSE
                # does so when a mapping closes), another path than msync.
                if self.generator.random() < 0.5:
                    region.flush()
        finally:
            region.close()
        self.read_range(max(0, offset - 3), length + 6, "read after mmap")

    def op_copy_range(self):
        if len(self.shadow) == 0:
            return self.op_write()
        source_offset = self.offset(len(self.shadow) - 1)
        length = self.length(len(self.shadow) - source_offset)
        target_offset = self.offset(min(len(self.shadow) + 4096, self.max_size - length))
        if self.generator.random() < 0.5:
            # Within the file, with ranges that must not overlap (copy_file_range refuses that).
            if source_offset < target_offset + length and target_offset < source_offset + length:
                return
            self.note(f"copy_file_range within {length} from {source_offset} to {target_offset}")
            data = bytes(self.shadow[source_offset:source_offset + length])
            copied = self.copy_all(self.descriptor, source_offset, self.descriptor, target_offset, length)
        else:
            data = self.data(length)
            other_path = self.path + ".source"
            other = os.open(other_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.pwrite(other, data, 0)
                self.note(f"copy_file_range from other file {length} to {target_offset}")
                copied = self.copy_all(other, 0, self.descriptor, target_offset, length)
            finally:
                os.close(other)
                os.unlink(other_path)
        if copied != length:
            self.fail(f"copy_file_range copied {copied} of {length}")
        self.put(target_offset, data)
        self.check_size("copy_file_range")
        self.read_range(max(0, target_offset - 3), length + 6, "read after copy_file_range")

    def copy_all(self, source, source_offset, target, target_offset, length):
        copied = 0
        for _ in range(length // 4096 + 64):
            if copied >= length:
                break
            count = os.copy_file_range(source, target, length - copied, source_offset + copied,
                                       target_offset + copied)
            if count == 0:
                break
            copied += count
        return copied

    def op_append(self):
        length = self.length(max(1, min(200_000, self.max_size - len(self.shadow))))
        if len(self.shadow) + length > self.max_size:
            return self.op_truncate()
        data = self.data(length)
        self.note(f"O_APPEND write {length} at end {len(self.shadow)}")
        appender = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            written = os.write(appender, data)
        finally:
            os.close(appender)
        if written != length:
            self.fail(f"append wrote {written} of {length}")
        self.shadow += data
        self.check_size("append")
        self.read_range(max(0, len(self.shadow) - length - 5), length + 10, "read after append")

    def op_insert(self):
        if not self.insert_supported:
            return self.op_write()
        offset = self.offset(len(self.shadow))
        length = self.length(max(1, min(300_000, self.max_size - len(self.shadow))))
        if len(self.shadow) + length > self.max_size:
            return self.op_collapse()
        zeros = self.generator.random() < 0.3
        data = bytes(length) if zeros else self.data(length)
        self.note(f"insert {'zeros' if zeros else 'data'} {length} at {offset} (size {len(self.shadow)})")
        buffer = ctypes.create_string_buffer(data, length)
        address = 0 if zeros else ctypes.addressof(buffer)
        try:
            fcntl.ioctl(self.descriptor, TANDEM_IOC_INSERT, struct.pack("=QQQ", offset, length, address))
        except OSError as error:
            if error.errno == errno.ENOTTY:
                # Not on tandemfs (a comparison run on another file system): do without.
                self.insert_supported = False
                return self.op_write()
            raise
        os.fstat(self.descriptor)
        self.shadow[offset:offset] = data
        self.check_size("insert")
        self.read_range(max(0, offset - 5), length + 10, "read after insert")

    def op_collapse(self):
        if not self.insert_supported or len(self.shadow) == 0:
            return self.op_write()
        offset = self.offset(len(self.shadow) - 1)
        length = self.length(len(self.shadow) - offset)
        self.note(f"collapse {length} at {offset} (size {len(self.shadow)})")
        try:
            fcntl.ioctl(self.descriptor, TANDEM_IOC_COLLAPSE, struct.pack("=QQQ", offset, length, 0))
        except OSError as error:
            if error.errno == errno.ENOTTY:
                self.insert_supported = False
                return self.op_write()
            raise
        os.fstat(self.descriptor)
        del self.shadow[offset:offset + length]
        self.check_size("collapse")
        self.read_range(max(0, offset - 5), 10000, "read after collapse")

    def op_fsync(self):
        self.note("fsync")
        os.fsync(self.descriptor)

    def op_reopen(self):
        self.note("close and reopen")
        os.close(self.descriptor)
        self.descriptor = os.open(self.path, os.O_RDWR)
        self.check_size("reopen")

    OPERATIONS = [
        ("write", 20), ("read", 12), ("truncate", 6), ("fallocate", 8), ("mmap", 8), ("copy_range", 6),
        ("append", 6), ("insert", 8), ("collapse", 7), ("fsync", 2), ("reopen", 2),
    ]

    def note(self, text):
        self.history.append(f"#{self.counts.total()}: {text}")

    def run(self, operations):
        names = [name for name, _ in self.OPERATIONS]
        weights = [weight for _, weight in self.OPERATIONS]
        for number in range(operations):
            name = self.generator.choices(names, weights)[0]
            self.counts[name] += 1
            try:
                getattr(self, "op_" + name)()
                if number % 50 == 49:
                    self.check_all(f"full check after operation {number}")
            except (Failure, OSError) as error:
                print(f"fsx: seed {self.seed}, operation {number} ({name}): {error}", file=sys.stderr)
                print("fsx: last operations:\n  " + "\n  ".join(self.history), file=sys.stderr)
                return False
        self.check_all("final check")
        os.fsync(self.descriptor)
        os.close(self.descriptor)
        print(f"fsx: seed {self.seed}: {operations} operations, final size {len(self.shadow)}, "
              + ", ".join(f"{name} {self.counts[name]}" for name in names))
        return True


def compare(path, shadow_path):
    with open(path, "rb") as file:
        got = file.read()
    with open(shadow_path, "rb") as file:
        expected = file.read()
    if got != expected:
        first = next((i for i in range(min(len(got), len(expected))) if got[i] != expected[i]),
                     min(len(got), len(expected)))
        print(f"fsx compare: {path} ({len(got)} bytes) differs from {shadow_path} ({len(expected)} bytes) "
              f"first at byte {first}", file=sys.stderr)
        return False
    print(f"fsx compare: {path} matches ({len(got)} bytes)")
    return True


def main():
    if len(sys.argv) >= 6 and sys.argv[1] == "run":
        path, seed, operations, shadow_path = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        max_size = int(sys.argv[6]) if len(sys.argv) > 6 else 8 << 20
        tester = Tester(path, seed, max_size)
        try:
            passed = tester.run(operations)
        finally:
            with open(shadow_path, "wb") as file:
                file.write(tester.shadow)
        sys.exit(0 if passed else 1)
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(0 if compare(sys.argv[2], sys.argv[3]) else 1)
    print(__doc__, file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
