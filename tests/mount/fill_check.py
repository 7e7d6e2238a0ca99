#!/usr/bin/env python3
"""Fills a volume until ENOSPC and checks that nothing acknowledged is lost.

usage: fill_check.py fill DIRECTORY MANIFEST SEED
       fill_check.py verify DIRECTORY MANIFEST

`fill` writes files of mixed sizes (small ones, ones that cross page and extent boundaries,
large ones) with seeded contents until the volume answers ENOSPC, fsyncing some of them. A
file whose every write and close succeeded is recorded in MANIFEST with its size and digest,
a file cut short by ENOSPC with the prefix that was acknowledged. On the full volume it then
tries metadata operations (create, mkdir, symlink, rename, xattr, truncate up, fallocate):
each must either work or fail with ENOSPC (or EDQUOT/EFBIG), never with anything else, and
what worked is recorded as well. Finally it overwrites existing bytes in place, which a
copy-on-write or log-structured file system may refuse, but must not corrupt.

`verify` (after unmount, fsck and remount) checks every recorded file, then removes half of
them and checks that the space can be written again.
"""
import errno
import hashlib
import json
import os
import random
import sys

ACCEPTED = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
SIZES = [1, 100, 4095, 4096, 4097, 65535, 65537, 300_000, 1 << 20, 3 << 20]


def data_for(seed, name, length):
    stamp = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return (stamp * (length // len(stamp) + 1))[:length]


def fill(directory, manifest_path, seed):
    generator = random.Random(seed)
    manifest = {"seed": seed, "files": {}, "directories": [], "symlinks": {}}
    full = False
    # Bounded: a 64 MiB volume holds far fewer than 100,000 files of these sizes.
    for index in range(100_000):
        name = f"f{index:06}"
        path = os.path.join(directory, name)
        length = generator.choice(SIZES)
        content = data_for(seed, name, length)
        acknowledged = 0
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        except OSError as error:
            if error.errno not in ACCEPTED:
                raise
            full = True
            break
        try:
            while acknowledged < length:
                step = min(length - acknowledged, generator.choice([4096, 65536, 1 << 20]))
                written = os.write(descriptor, content[acknowledged:acknowledged + step])
                acknowledged += written
            if index % 7 == 0:
                os.fsync(descriptor)
        except OSError as error:
            if error.errno not in ACCEPTED:
                raise
            full = True
        finally:
            try:
                os.close(descriptor)
            except OSError as error:
                if error.errno not in ACCEPTED:
                    raise
        manifest["files"][name] = {"size": acknowledged, "length": length}
        if full:
            break
    if not full:
        raise SystemExit("fill_check: the volume never filled up")
    print(f"fill_check: full after {len(manifest['files'])} files")
    # Metadata operations on the full volume: success or ENOSPC, nothing else.
    outcomes = {}

    def attempt(what, function):
        try:
            function()
            outcomes[what] = "ok"
            return True
        except OSError as error:
            if error.errno not in ACCEPTED:
                raise SystemExit(f"fill_check: {what} on a full volume failed with {errno.errorcode[error.errno]}")
            outcomes[what] = errno.errorcode[error.errno]
            return False

    for index in range(200):
        name = f"d{index:04}"
        if attempt(f"mkdir {index}", lambda: os.mkdir(os.path.join(directory, name))):
            manifest["directories"].append(name)
    for index in range(200):
        name = f"s{index:04}"
        if attempt(f"symlink {index}", lambda: os.symlink("t" * 300, os.path.join(directory, name))):
            manifest["symlinks"][name] = "t" * 300
    for index in range(200):
        name = f"e{index:04}"

        def create_empty():
            os.close(os.open(os.path.join(directory, name), os.O_CREAT | os.O_WRONLY, 0o644))
        if attempt(f"create {index}", create_empty):
            manifest["files"][name] = {"size": 0, "length": 0}
    first = sorted(manifest["files"])[0]
    if attempt("rename", lambda: os.rename(os.path.join(directory, first), os.path.join(directory, "renamed"))):
        manifest["files"]["renamed"] = manifest["files"].pop(first)
        manifest.setdefault("renamed_from", {})["renamed"] = first
    attempt("setxattr", lambda: os.setxattr(os.path.join(directory, sorted(manifest["files"])[1]), "user.k", b"v" * 2000))
    target = sorted(manifest["files"])[2]
    if attempt("truncate up", lambda: os.truncate(os.path.join(directory, target), 50 << 20)):
        manifest["files"][target]["size_after_truncate"] = 50 << 20
    # In-place overwrite of an existing file of at least a page: either works or ENOSPC, and
    # then the old bytes are still there.
    for name, entry in sorted(manifest["files"].items()):
        if entry["size"] >= 8192 and "size_after_truncate" not in entry:
            def overwrite():
                descriptor = os.open(os.path.join(directory, name), os.O_WRONLY)
                try:
                    os.pwrite(descriptor, b"\xAA" * 4096, 4096)
                finally:
                    os.close(descriptor)
            if attempt("overwrite in place", overwrite):
                entry["overwritten"] = True
            break
    manifest["outcomes"] = outcomes
    with open(manifest_path, "w") as file:
        json.dump(manifest, file)
    print("fill_check: on the full volume: " + ", ".join(
        f"{what} {result}" for what, result in sorted(outcomes.items()) if not what[-1].isdigit() or what.endswith(" 0")))


def expected_content(seed, name, entry, origin):
    content = bytearray(data_for(seed, origin, entry["length"])[:entry["size"]])
    if entry.get("overwritten"):
        content[4096:8192] = b"\xAA" * 4096
    if "size_after_truncate" in entry:
        content.extend(bytes(entry["size_after_truncate"] - len(content)))
    return bytes(content)


def verify(directory, manifest_path):
    with open(manifest_path) as file:
        manifest = json.load(file)
    seed = manifest["seed"]
    renamed_from = manifest.get("renamed_from", {})
    problems = []
    for name, entry in manifest["files"].items():
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as file:
                got = file.read()
        except OSError as error:
            problems.append(f"{name}: {error}")
            continue
        expected = expected_content(seed, name, entry, renamed_from.get(name, name))
        if got != expected:
            problems.append(f"{name}: {len(got)} bytes, expected {len(expected)} acknowledged bytes"
                            + ("" if len(got) != len(expected) else " (contents differ)"))
    for name in manifest["directories"]:
        if not os.path.isdir(os.path.join(directory, name)):
            problems.append(f"directory {name} missing")
    for name, target in manifest["symlinks"].items():
        try:
            if os.readlink(os.path.join(directory, name)) != target:
                problems.append(f"symlink {name} has the wrong target")
        except OSError as error:
            problems.append(f"symlink {name}: {error}")
    for problem in problems[:20]:
        print(f"fill_check: {problem}", file=sys.stderr)
    if problems:
        raise SystemExit(f"fill_check: {len(problems)} acknowledged changes lost or wrong")
    # Remove half the files; the space can be written again.
    names = sorted(manifest["files"])
    freed = 0
    for name in names[::2]:
        freed += manifest["files"][name]["size"]
        os.unlink(os.path.join(directory, name))
    os.sync()
    again = min(freed // 2, 16 << 20)
    with open(os.path.join(directory, "again"), "wb") as file:
        file.write(b"z" * again)
        file.flush()
        os.fsync(file.fileno())
    print(f"fill_check: {len(manifest['files'])} files, {len(manifest['directories'])} directories and "
          f"{len(manifest['symlinks'])} symlinks intact; {again} bytes written again after removing half")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "fill":
        fill(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) == 4 and sys.argv[1] == "verify":
        verify(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
