#!/usr/bin/env python3
"""fsstress-style: several processes change one shared tree at random at the same time.

usage: fsstress.py DIRECTORY SEED PROCESSES OPERATIONS_PER_PROCESS

Each process picks random paths in a small shared namespace (so they collide) and creates,
writes, truncates, links, renames (files and directories, across directories, with
RENAME_EXCHANGE), removes, changes modes and owners, sets extended attributes and fsyncs.
Collisions make ENOENT, EEXIST, ENOTEMPTY, ENOTDIR, EISDIR, EINVAL (a directory into its own
subtree) and ELOOP (symlink cycles) and EPERM (a hard link to a directory) expected; anything else (EIO above all) fails the run. The tree
is then walked and every file read. Run `tandem fsck` after unmounting to check the volume.
"""
import ctypes
import ctypes.util
import errno
import os
import random
import sys

EXPECTED = {errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR, errno.EINVAL, errno.EBUSY,
            errno.EMLINK, errno.EPERM, errno.ELOOP}
NAMES = ["a", "b", "c", "d", "long-name-" + "x" * 40]
DEPTH = 3

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]


def random_path(generator, top):
    parts = [generator.choice(NAMES) for _ in range(generator.randint(1, DEPTH))]
    return os.path.join(top, *parts)


def exchange(source, target):
    if libc.renameat2(-100, os.fsencode(source), -100, os.fsencode(target), 2) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def worker(top, seed, operations):
    generator = random.Random(seed)
    counts = {}
    for _ in range(operations):
        path = random_path(generator, top)
        other = random_path(generator, top)
        choice = generator.randrange(16)
        try:
            if choice == 0:
                os.mkdir(path)
            elif choice in (1, 2):
                descriptor = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
                try:
                    offset = generator.randrange(0, 1 << 20)
                    os.pwrite(descriptor, os.urandom(generator.choice([1, 100, 4096, 70000])), offset)
                    if generator.random() < 0.2:
                        os.fsync(descriptor)
                finally:
                    os.close(descriptor)
            elif choice == 3:
                os.truncate(path, generator.randrange(0, 1 << 20))
            elif choice == 4:
                os.link(path, other)
            elif choice in (5, 6):
                os.rename(path, other)
            elif choice == 7:
                exchange(path, other)
            elif choice == 8:
                os.unlink(path)
            elif choice == 9:
                os.rmdir(path)
            elif choice == 10:
                os.symlink(generator.choice(["a", "../b", "x" * 200]), path)
            elif choice == 11:
                os.chmod(path, generator.choice([0o755, 0o644, 0o700, 0o6755]))
            elif choice == 12:
                os.chown(path, generator.choice([0, 1, 65534]), generator.choice([0, 1, 65534]))
            elif choice == 13:
                os.setxattr(path, "user." + generator.choice(NAMES[:3]), os.urandom(generator.randrange(0, 200)))
            elif choice == 14:
                with open(path, "rb") as file:
                    file.read()
            else:
                os.listdir(path)
            counts["ok"] = counts.get("ok", 0) + 1
        except OSError as error:
            if error.errno not in EXPECTED:
                print(f"fsstress: seed {seed}: operation {choice} on {path} / {other}: {error}", file=sys.stderr)
                return 1
            counts[errno.errorcode[error.errno]] = counts.get(errno.errorcode[error.errno], 0) + 1
    return 0


def walk(top):
    files = directories = 0
    # Bounded by the namespace: at most len(NAMES) ** DEPTH paths.
    for root, names, file_names in os.walk(top):
        directories += len(names)
        for name in file_names:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                with open(path, "rb") as file:
                    file.read()
            files += 1
    return files, directories


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    top, seed, processes, operations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    os.makedirs(top, exist_ok=True)
    children = []
    for index in range(processes):
        pid = os.fork()
        if pid == 0:
            os._exit(worker(top, seed * 1000 + index, operations))
        children.append(pid)
    failed = 0
    for pid in children:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    files, directories = walk(top)
    print(f"fsstress: seed {seed}: {processes} processes x {operations} operations, {failed} failed; "
          f"tree has {files} files and {directories} directories")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
