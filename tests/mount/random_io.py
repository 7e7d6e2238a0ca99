#!/usr/bin/env python3
"""Seeded random reads and writes on one file, each checked against a shadow copy in memory.

usage: random_io.py FILE SEED OPERATIONS [MAX_SIZE_BYTES]

Mixes small unaligned and large writes, reads, truncations (shrink and grow), fsync, reads
through mmap, and closing and reopening the file, so page-cache and size bookkeeping in the
kernel and the file system are both exercised. Exits 1 with the first mismatch.
"""
import mmap
import os
import random
import sys


def fail(message):
    print(f"random_io: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    path, seed, operations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    max_size = int(sys.argv[4]) if len(sys.argv) > 4 else 4 << 20
    generator = random.Random(seed)
    shadow = bytearray()
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def check_range(offset, length, where):
        got = os.pread(descriptor, length, offset)
        expected = bytes(shadow[offset:offset + length])
        if got != expected:
            first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                         min(len(got), len(expected)))
            fail(f"{where}: read {length} at {offset}: {len(got)} bytes, expected "
                 f"{len(expected)}; first difference at byte {offset + first}")

    for step in range(operations):
        choice = generator.random()
        if choice < 0.45:
            # Writes: mostly small and unaligned, sometimes large.
            if generator.random() < 0.8:
                length = generator.randint(1, 9000)
            else:
                length = generator.randint(64 << 10, 1 << 20)
            offset = generator.randint(0, max(0, max_size - length))
            data = generator.randbytes(length)
            if os.pwrite(descriptor, data, offset) != length:
                fail(f"step {step}: short write")
            if offset > len(shadow):
                shadow.extend(bytes(offset - len(shadow)))
            shadow[offset:offset + length] = data
        elif choice < 0.80:
            offset = generator.randint(0, len(shadow) + 100)
            length = generator.randint(1, 200_000)
            check_range(offset, length, f"step {step}")
        elif choice < 0.86:
            size = generator.randint(0, max_size)
            os.ftruncate(descriptor, size)
            if size < len(shadow):
                del shadow[size:]
            else:
                shadow.extend(bytes(size - len(shadow)))
        elif choice < 0.89:
            os.fsync(descriptor)
        elif choice < 0.94:
            if len(shadow) > 0:
                with mmap.mmap(descriptor, len(shadow), prot=mmap.PROT_READ) as mapping:
                    offset = generator.randint(0, len(shadow) - 1)
                    length = min(generator.randint(1, 100_000), len(shadow) - offset)
                    if mapping[offset:offset + length] != shadow[offset:offset + length]:
                        fail(f"step {step}: mmap read at {offset} differs")
        else:
            os.close(descriptor)
            descriptor = os.open(path, os.O_RDWR)
        if os.fstat(descriptor).st_size != len(shadow):
            fail(f"step {step}: size {os.fstat(descriptor).st_size}, expected {len(shadow)}")

    check_range(0, len(shadow) + 1, "final")
    os.close(descriptor)
    with open(path, "rb") as handle:
        if handle.read() != bytes(shadow):
            fail("final read through a new descriptor differs")


if __name__ == "__main__":
    main()
