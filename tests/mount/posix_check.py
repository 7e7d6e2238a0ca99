#!/usr/bin/env python3
"""POSIX semantics checks in the style of pjdfstest, run as root in an empty directory.

usage: posix_check.py DIRECTORY [CHECK...]

Each check prints PASS or FAIL with what differed; the script exits 1 when any failed. The
expectations are Linux's (checked against ext4): which of atime / mtime / ctime each
operation changes, directory link counts, rename corner cases, name lengths, ENOTDIR through
files, O_EXCL on symlinks, set-ID clearing, sticky directories, permissions as `nobody`,
readdir while the directory changes, and statfs against df.

Times are checked without depending on the clock's speed: before an operation, atime and
mtime are set to a fixed old value, and the operation waits until the coarse kernel clock
has moved on from the ctime before acting, so "changed" and "unchanged" are both exact.
"""
import ctypes
import ctypes.util
import errno
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time

CLOCK_REALTIME_COARSE = 5  # linux/time.h
OLD_NANOSECONDS = 1_000_000_000 * 1_000_000_000  # 2001-09-09, well before any test run
NOBODY = pwd.getpwnam("nobody")

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

results = {"passed": 0, "failed": 0}


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def expect_errno(expected, function, *arguments, **keywords):
    """Calls function(*arguments, **keywords), which must fail with errno `expected`."""
    try:
        function(*arguments, **keywords)
    except OSError as error:
        expect(error.errno == expected,
               f"{function.__name__}{arguments}: {errno.errorcode.get(error.errno)}, "
               f"expected {errno.errorcode[expected]}")
        return
    raise CheckFailed(f"{function.__name__}{arguments} succeeded, expected {errno.errorcode[expected]}")


# ---------------------------------------------------------------------------- times

def age(path):
    """Sets atime and mtime to an old value and waits until ctime is in the clock's past."""
    os.utime(path, ns=(OLD_NANOSECONDS, OLD_NANOSECONDS), follow_symlinks=False)
    ctime = os.lstat(path).st_ctime_ns
    # The kernel's coarse clock ticks every few milliseconds: wait (bounded) until a fresh
    # timestamp would differ from the ctime just written.
    for _ in range(200):
        if time.clock_gettime_ns(CLOCK_REALTIME_COARSE) > ctime:
            break
        time.sleep(0.002)
    time.sleep(0.005)


def changed_times(path, before):
    after = os.lstat(path)
    return "".join(
        letter for letter, field in (("a", "st_atime_ns"), ("m", "st_mtime_ns"), ("c", "st_ctime_ns"))
        if getattr(after, field) != getattr(before, field)
    )


def times_after(operation, paths):
    """Runs operation() and returns, for each path, which of a/m/c changed ("" for none)."""
    for path in paths:
        age(path)
    before = {path: os.lstat(path) for path in paths}
    operation()
    return [changed_times(path, before[path]) for path in paths]


def check_times(work):
    directory = os.path.join(work, "times")
    os.mkdir(directory)
    other_directory = os.path.join(work, "times-other")
    os.mkdir(other_directory)
    path = os.path.join(directory, "file")
    problems = []

    def verify(name, got, expected):
        if got != expected:
            problems.append(f"{name}: changed {got}, expected {expected}")

    # create: the parent's mtime and ctime (the new file's times are all new).
    got = times_after(lambda: os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)), [directory])
    verify("create (parent)", got, ["mc"])
    # write: the file's mtime and ctime; not the parent.
    def write():
        descriptor = os.open(path, os.O_WRONLY)
        os.write(descriptor, b"hello")
        os.close(descriptor)
    verify("write (file, parent)", times_after(write, [path, directory]), ["mc", ""])
    # read: with relatime and an atime older than mtime, atime changes.
    def read():
        descriptor = os.open(path, os.O_RDONLY)
        os.read(descriptor, 10)
        os.close(descriptor)
    verify("open+read without change (file)", times_after(lambda: None, [path]), [""])
    # truncate to another size and to the same size.
    verify("truncate shorter", times_after(lambda: os.truncate(path, 2), [path]), ["mc"])
    verify("truncate longer", times_after(lambda: os.truncate(path, 100), [path]), ["mc"])
    verify("ftruncate same size", times_after(lambda: ftruncate_path(path, 100), [path]), ["mc"])
    verify("open O_TRUNC", times_after(lambda: os.close(os.open(path, os.O_WRONLY | os.O_TRUNC)), [path]), ["mc"])
    verify("chmod", times_after(lambda: os.chmod(path, 0o600), [path, directory]), ["c", ""])
    verify("chown", times_after(lambda: os.chown(path, 1, 1), [path, directory]), ["c", ""])
    os.chown(path, 0, 0)
    link = os.path.join(directory, "link")
    verify("link (file, parent)", times_after(lambda: os.link(path, link), [path, directory]), ["c", "mc"])
    verify("unlink of a link (file, parent)", times_after(lambda: os.unlink(link), [path, directory]),
           ["c", "mc"])
    renamed = os.path.join(other_directory, "renamed")
    age(path)
    before = os.lstat(path)
    got = times_after(lambda: os.rename(path, renamed), [directory, other_directory])
    # The renamed file's own times: Linux file systems update its ctime.
    verify("rename file across directories (file, source, target)", [changed_times(renamed, before)] + got,
           ["c", "mc", "mc"])
    path = renamed
    subdirectory = os.path.join(directory, "sub")
    os.mkdir(subdirectory)
    moved = os.path.join(other_directory, "sub")
    age(subdirectory)
    before = os.lstat(subdirectory)
    got = times_after(lambda: os.rename(subdirectory, moved), [directory, other_directory])
    after = os.lstat(moved)
    verify("rename directory across directories (source, target)", got, ["mc", "mc"])
    verify("rename directory across directories (the directory's ctime)",
           "c" if after.st_ctime_ns != before.st_ctime_ns else "", "c")
    verify("rmdir (parent)", times_after(lambda: os.rmdir(moved), [other_directory]), ["mc"])
    verify("mkdir (parent)", times_after(lambda: os.mkdir(moved), [other_directory]), ["mc"])
    symlink = os.path.join(other_directory, "symlink")
    verify("symlink (parent)", times_after(lambda: os.symlink("target", symlink), [other_directory]), ["mc"])
    # utimensat: UTIME_NOW sets to now, UTIME_OMIT leaves alone, both change ctime unless both
    # are UTIME_OMIT.
    verify("utimensat NOW NOW", times_after(lambda: utimensat(path, "now", "now"), [path]), ["amc"])
    verify("utimensat NOW OMIT", times_after(lambda: utimensat(path, "now", "omit"), [path]), ["ac"])
    verify("utimensat OMIT NOW", times_after(lambda: utimensat(path, "omit", "now"), [path]), ["mc"])
    verify("utimensat OMIT OMIT", times_after(lambda: utimensat(path, "omit", "omit"), [path]), [""])
    age(path)
    utimensat(path, (5, 123456789), "omit")
    status = os.lstat(path)
    expect(status.st_atime_ns == 5_123_456_789 and status.st_mtime_ns == OLD_NANOSECONDS,
           f"utimensat (5.123456789, OMIT) gave atime {status.st_atime_ns}, mtime {status.st_mtime_ns}")
    # Times before 1970 keep their nanoseconds: (-1 s, +250 ms) is 1969-12-31 23:59:59.25.
    for value in (-750_000_000, -1_000_000_000_000_000_000 + 5, -1, 1, 2 ** 33 * 1_000_000_000 + 999_999_999):
        os.utime(path, ns=(value, value))
        status = os.lstat(path)
        expect(status.st_atime_ns == value and status.st_mtime_ns == value,
               f"utime to {value} ns gave atime {status.st_atime_ns}, mtime {status.st_mtime_ns}")
    # Setting times by hand to the same values still changes ctime.
    verify("utime to explicit values (ctime)",
           times_after(lambda: os.utime(path, ns=(OLD_NANOSECONDS, OLD_NANOSECONDS)), [path]), ["c"])
    # setxattr changes ctime only.
    verify("setxattr", times_after(lambda: os.setxattr(path, "user.k", b"v"), [path]), ["c"])
    verify("removexattr", times_after(lambda: os.removexattr(path, "user.k"), [path]), ["c"])
    expect(not problems, "; ".join(problems))


def ftruncate_path(path, size):
    descriptor = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(descriptor, size)
    finally:
        os.close(descriptor)


class Timespec(ctypes.Structure):
    _fields_ = [("seconds", ctypes.c_long), ("nanoseconds", ctypes.c_long)]


UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
AT_FDCWD = -100


def utimensat(path, access, modification):
    def spec(value):
        if value == "now":
            return Timespec(0, UTIME_NOW)
        if value == "omit":
            return Timespec(0, UTIME_OMIT)
        return Timespec(*value)
    times = (Timespec * 2)(spec(access), spec(modification))
    if libc.utimensat(AT_FDCWD, os.fsencode(path), times, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)


# ---------------------------------------------------------------------------- links, names

def check_directory_link_counts(work):
    top = os.path.join(work, "nlink")
    os.mkdir(top)
    expect(os.stat(top).st_nlink == 2, f"new directory nlink {os.stat(top).st_nlink}")
    for index in range(3):
        os.mkdir(os.path.join(top, f"d{index}"))
    open(os.path.join(top, "file"), "w").close()
    expect(os.stat(top).st_nlink == 5, f"3 subdirectories + a file: nlink {os.stat(top).st_nlink}, expected 5")
    other = os.path.join(work, "nlink-other")
    os.mkdir(other)
    os.rename(os.path.join(top, "d0"), os.path.join(other, "d0"))
    expect(os.stat(top).st_nlink == 4, f"after moving one out: nlink {os.stat(top).st_nlink}, expected 4")
    expect(os.stat(other).st_nlink == 3, f"target after the move: nlink {os.stat(other).st_nlink}, expected 3")
    # A directory renamed over an empty directory: the count of the parent drops by one.
    os.rename(os.path.join(top, "d1"), os.path.join(top, "d2"))
    expect(os.stat(top).st_nlink == 3, f"after rename over an empty sibling: nlink {os.stat(top).st_nlink}")
    # Exchange of a directory and a file across directories moves the count.
    os.rmdir(os.path.join(top, "d2"))
    expect(os.stat(top).st_nlink == 2, f"after rmdir of all: nlink {os.stat(top).st_nlink}")
    file_path = os.path.join(top, "file")
    expect(os.stat(file_path).st_nlink == 1, "file nlink")
    os.link(file_path, file_path + ".2")
    expect(os.stat(file_path).st_nlink == 2, "file nlink after link")
    os.unlink(file_path + ".2")
    expect(os.stat(file_path).st_nlink == 1, "file nlink after unlink")
    # An open, unlinked file has nlink 0.
    descriptor = os.open(file_path, os.O_RDONLY)
    os.unlink(file_path)
    expect(os.fstat(descriptor).st_nlink == 0, f"unlinked open file nlink {os.fstat(descriptor).st_nlink}")
    os.close(descriptor)


def check_rename_corner_cases(work):
    top = os.path.join(work, "rename")
    os.mkdir(top)
    a = os.path.join(top, "a")
    with open(a, "w") as file:
        file.write("a")
    os.rename(a, a)
    expect(open(a).read() == "a", "rename over itself lost the file")
    b = os.path.join(top, "b")
    os.link(a, b)
    os.rename(a, b)  # POSIX: both names of one file: nothing happens
    expect(os.path.exists(a) and os.path.exists(b), "rename over a hard link of itself removed a name")
    expect(os.stat(a).st_nlink == 2, f"nlink after rename over own link {os.stat(a).st_nlink}")
    directory = os.path.join(top, "dir")
    os.makedirs(os.path.join(directory, "sub", "deeper"))
    expect_errno(errno.EINVAL, os.rename, directory, os.path.join(directory, "sub", "inside"))
    expect_errno(errno.EINVAL, os.rename, directory, os.path.join(directory, "sub", "deeper", "x"))
    full = os.path.join(top, "full")
    os.makedirs(os.path.join(full, "child"))
    try:
        os.rename(directory, full)
        raise CheckFailed("rename over a non-empty directory succeeded")
    except OSError as error:
        expect(error.errno in (errno.ENOTEMPTY, errno.EEXIST), f"over non-empty: {errno.errorcode[error.errno]}")
    expect_errno(errno.EISDIR, os.rename, a, full)
    expect_errno(errno.ENOTDIR, os.rename, full, a)
    expect_errno(errno.ENOENT, os.rename, os.path.join(top, "missing"), os.path.join(top, "x"))
    # Directory over an empty directory works and keeps the contents.
    empty = os.path.join(top, "empty")
    os.mkdir(empty)
    os.rename(directory, empty)
    expect(os.path.isdir(os.path.join(empty, "sub", "deeper")), "directory over empty lost its contents")
    expect(not os.path.exists(directory), "source still there")
    # A file over a file replaces it; the replaced inode stays readable while open.
    c = os.path.join(top, "c")
    with open(c, "w") as file:
        file.write("c")
    descriptor = os.open(c, os.O_RDONLY)
    with open(os.path.join(top, "d"), "w") as file:
        file.write("d")
    os.rename(os.path.join(top, "d"), c)
    expect(open(c).read() == "d", "replaced target has wrong content")
    expect(os.pread(descriptor, 10, 0) == b"c", "open replaced file unreadable")
    expect(os.fstat(descriptor).st_nlink == 0, "replaced file nlink")
    os.close(descriptor)
    # Symlink renamed; the target does not move.
    os.symlink("a", os.path.join(top, "s"))
    os.rename(os.path.join(top, "s"), os.path.join(top, "s2"))
    expect(os.readlink(os.path.join(top, "s2")) == "a", "symlink target after rename")
    # '..' of a moved directory points at the new parent.
    os.rename(os.path.join(empty, "sub"), os.path.join(top, "sub"))
    expect(os.stat(os.path.join(top, "sub", "..")).st_ino == os.stat(top).st_ino, "'..' after move")


def check_name_lengths(work):
    top = os.path.join(work, "names")
    os.mkdir(top)
    name255 = "x" * 255
    name256 = "y" * 256
    open(os.path.join(top, name255), "w").close()
    expect(name255 in os.listdir(top), "255-byte name not listed")
    expect_errno(errno.ENAMETOOLONG, os.open, os.path.join(top, name256), os.O_CREAT | os.O_WRONLY)
    expect_errno(errno.ENAMETOOLONG, os.mkdir, os.path.join(top, name256))
    expect_errno(errno.ENAMETOOLONG, os.symlink, "t", os.path.join(top, name256))
    expect_errno(errno.ENAMETOOLONG, os.link, os.path.join(top, name255), os.path.join(top, name256))
    expect_errno(errno.ENAMETOOLONG, os.rename, os.path.join(top, name255), os.path.join(top, name256))
    expect_errno(errno.ENAMETOOLONG, os.stat, os.path.join(top, name256))
    os.mkdir(os.path.join(top, "d" * 255))
    os.rename(os.path.join(top, name255), os.path.join(top, "d" * 255, "z" * 255))
    expect(os.path.exists(os.path.join(top, "d" * 255, "z" * 255)), "rename to 255 bytes")
    # Multi-byte characters: 255 bytes is the limit, not 255 characters.
    expect_errno(errno.ENAMETOOLONG, os.mkdir, os.path.join(top, "é" * 128))
    os.mkdir(os.path.join(top, "é" * 127))
    # Long symlink targets: 4095 bytes work, 4096 do not.
    os.symlink("t" * 4095, os.path.join(top, "long-link"))
    expect(os.readlink(os.path.join(top, "long-link")) == "t" * 4095, "4095-byte target")
    expect_errno(errno.ENAMETOOLONG, os.symlink, "t" * 4096, os.path.join(top, "too-long-link"))


def check_paths_through_files(work):
    top = os.path.join(work, "notdir")
    os.mkdir(top)
    path = os.path.join(top, "file")
    open(path, "w").close()
    expect_errno(errno.ENOTDIR, os.stat, os.path.join(path, "x"))
    expect_errno(errno.ENOTDIR, os.open, os.path.join(path, "x"), os.O_CREAT | os.O_WRONLY)
    expect_errno(errno.ENOTDIR, os.mkdir, os.path.join(path, "x"))
    expect_errno(errno.ENOTDIR, os.unlink, os.path.join(path, "x"))
    expect_errno(errno.ENOTDIR, os.rename, os.path.join(path, "x"), os.path.join(top, "y"))
    expect_errno(errno.ENOTDIR, os.rename, path, os.path.join(path, "y"))
    expect_errno(errno.ENOTDIR, os.open, path + "/", os.O_RDONLY)
    expect_errno(errno.ENOTDIR, os.rmdir, path)
    expect_errno(errno.ENOTDIR, os.listdir, path)
    expect_errno(errno.EISDIR, os.unlink, top)
    expect_errno(errno.EISDIR, os.open, top, os.O_WRONLY)
    expect_errno(errno.ENOTEMPTY, os.rmdir, top)
    expect_errno(errno.EEXIST, os.mkdir, top)
    expect_errno(errno.EEXIST, os.link, path, path)
    expect_errno(errno.EPERM, os.link, top, os.path.join(top, "dirlink"))
    expect_errno(errno.ENOENT, os.open, os.path.join(top, "missing", "x"), os.O_CREAT | os.O_WRONLY)
    # The symlink loop
    os.symlink("loop2", os.path.join(top, "loop1"))
    os.symlink("loop1", os.path.join(top, "loop2"))
    expect_errno(errno.ELOOP, os.stat, os.path.join(top, "loop1"))


def check_excl_on_symlink(work):
    top = os.path.join(work, "excl")
    os.mkdir(top)
    dangling = os.path.join(top, "dangling")
    os.symlink("target", dangling)
    expect_errno(errno.EEXIST, os.open, dangling, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    expect(not os.path.exists(os.path.join(top, "target")), "O_EXCL through a dangling symlink created the target")
    # Without O_EXCL the target is created through the link.
    os.close(os.open(dangling, os.O_CREAT | os.O_WRONLY, 0o644))
    expect(os.path.isfile(os.path.join(top, "target")), "O_CREAT through a dangling symlink")
    expect_errno(errno.EEXIST, os.open, dangling, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    expect_errno(errno.ELOOP, os.open, dangling, os.O_RDONLY | os.O_NOFOLLOW)
    expect_errno(errno.EEXIST, os.mkdir, dangling)


# ---------------------------------------------------------------------------- set-ID, users

def as_nobody(function):
    """Runs function() in a child process with nobody's uid and gid; returns its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            function()
            code = 0
        except CheckFailed as error:
            print(f"    as nobody: {error}", file=sys.stderr)
        except Exception as error:  # report and fail, whatever it was
            print(f"    as nobody: {error!r}", file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def run_as_nobody(function, what):
    expect(as_nobody(function) == 0, f"as nobody: {what}")


def check_set_id_bits(work):
    top = os.path.join(work, "setid")
    os.mkdir(top)
    os.chmod(top, 0o777)
    path = os.path.join(top, "file")
    with open(path, "w") as file:
        file.write("x")
    # A write by root keeps the bits (CAP_FSETID).
    os.chmod(path, 0o6777)
    with open(path, "a") as file:
        file.write("root")
    expect(stat.S_IMODE(os.stat(path).st_mode) == 0o6777, f"root write changed mode to {os.stat(path).st_mode:o}")
    # A write by another user clears both (the file is group-executable).
    def write():
        with open(path, "a") as file:
            file.write("nobody")
    run_as_nobody(write, "append to a 6777 file")
    expect(stat.S_IMODE(os.stat(path).st_mode) == 0o777, f"write by nobody left mode {os.stat(path).st_mode:o}")
    # Without group-execute, Linux (since 6.2) still drops set-group-ID when the writer is not
    # in the file's group, as nobody is not.
    os.chmod(path, 0o6766)
    run_as_nobody(write, "append to a 6766 file")
    expect(stat.S_IMODE(os.stat(path).st_mode) == 0o766, f"write to 6766 left mode {os.stat(path).st_mode:o}")
    # A truncate by another user clears them too.
    os.chmod(path, 0o6777)
    run_as_nobody(lambda: os.truncate(path, 1), "truncate a 6777 file")
    expect(stat.S_IMODE(os.stat(path).st_mode) == 0o777, f"truncate by nobody left mode {os.stat(path).st_mode:o}")
    # chown by root clears set-user-ID and (group-executable) set-group-ID on a file.
    os.chmod(path, 0o6755)
    os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    expect(stat.S_IMODE(os.stat(path).st_mode) == 0o755, f"chown by root left mode {os.stat(path).st_mode:o}")
    # chown -1 -1 (no change) by root also clears them on Linux.
    os.chmod(path, 0o6755)
    os.chown(path, -1, -1)
    expect(stat.S_IMODE(os.stat(path).st_mode) == 0o755, f"chown(-1,-1) left mode {os.stat(path).st_mode:o}")
    # chgrp by the owner (nobody, to its own group) clears them.
    os.chown(path, NOBODY.pw_uid, 0)
    os.chmod(path, 0o6755)
    run_as_nobody(lambda: os.chown(path, -1, NOBODY.pw_gid), "chgrp to own group")
    expect(stat.S_IMODE(os.stat(path).st_mode) == 0o755, f"chgrp by owner left mode {os.stat(path).st_mode:o}")
    # Directories keep set-group-ID on chown.
    directory = os.path.join(top, "dir")
    os.mkdir(directory)
    os.chmod(directory, 0o2775)
    os.chown(directory, NOBODY.pw_uid, NOBODY.pw_gid)
    expect(stat.S_IMODE(os.stat(directory).st_mode) == 0o2775, f"chown of a directory: {os.stat(directory).st_mode:o}")
    # A set-group-ID directory passes its group and (for directories) the bit on.
    os.chown(directory, 0, 12345)
    sub = os.path.join(directory, "sub")
    os.mkdir(sub)
    file_inside = os.path.join(directory, "f")
    open(file_inside, "w").close()
    expect(os.stat(sub).st_gid == 12345 and os.stat(sub).st_mode & stat.S_ISGID, "set-group-ID inheritance (dir)")
    expect(os.stat(file_inside).st_gid == 12345, "set-group-ID inheritance (file group)")


def check_sticky_and_permissions(work):
    top = os.path.join(work, "perm")
    os.mkdir(top)
    os.chmod(top, 0o1777)
    root_file = os.path.join(top, "root-file")
    with open(root_file, "w") as file:
        file.write("r")
    os.chmod(root_file, 0o666)

    def nobody_checks():
        expect_errno(errno.EPERM, os.unlink, root_file)
        expect_errno(errno.EPERM, os.rename, root_file, os.path.join(top, "stolen"))
        own = os.path.join(top, "nobody-file")
        with open(own, "w") as file:
            file.write("n")
        # Replacing someone else's file by rename is refused in a sticky directory.
        expect_errno(errno.EPERM, os.rename, own, root_file)
        os.rename(own, own + ".2")
        os.unlink(own + ".2")
        expect_errno(errno.EPERM, os.chmod, root_file, 0o777)
        expect_errno(errno.EPERM, os.chown, root_file, NOBODY.pw_uid, -1)
        expect_errno(errno.EPERM, os.utime, root_file, (1, 1))
        os.utime(root_file, None)  # writable: may set to now
        private = os.path.join(work, "private")
        expect_errno(errno.EACCES, os.listdir, private)
        expect_errno(errno.EACCES, os.stat, os.path.join(private, "inner"))
        expect_errno(errno.EACCES, os.open, os.path.join(work, "read-protected"), os.O_RDONLY)
        expect_errno(errno.EACCES, os.open, os.path.join(work, "read-protected"), os.O_WRONLY)
        expect_errno(errno.EACCES, os.open, os.path.join(work, "listable", "new"), os.O_CREAT | os.O_WRONLY)
        expect_errno(errno.EACCES, os.unlink, os.path.join(work, "listable", "kept"))
        expect(os.listdir(os.path.join(work, "listable")) == ["kept"], "listing of a 0755 directory")
        expect_errno(errno.EACCES, os.listdir, os.path.join(work, "search-only"))
        expect(os.stat(os.path.join(work, "search-only", "known")).st_size == 0, "stat through an x-only directory")
        expect_errno(errno.EACCES, os.stat, os.path.join(work, "list-only", "known"))
        expect(os.listdir(os.path.join(work, "list-only")) == ["known"], "listing of an r-only directory")
        expect_errno(errno.EACCES, os.mkdir, os.path.join(work, "listable", "d"))
        expect_errno(errno.EACCES, os.symlink, "x", os.path.join(work, "listable", "s"))
        expect_errno(errno.EACCES, os.rename, os.path.join(work, "listable", "kept"), os.path.join(top, "kept"))
        expect_errno(errno.EACCES, os.setxattr, os.path.join(work, "listable", "kept"), "user.x", b"1")
        expect_errno(errno.EACCES, os.truncate, os.path.join(work, "listable", "kept"), 0)
        expect(not os.access(os.path.join(work, "listable", "kept"), os.W_OK), "access(W_OK)")
        expect(os.access(os.path.join(work, "listable", "kept"), os.R_OK), "access(R_OK)")
        # Group and other classes: nobody is not in group 0, so "other" bits apply.
        expect_errno(errno.EACCES, os.open, os.path.join(work, "group-only"), os.O_RDONLY)

    private = os.path.join(work, "private")
    os.mkdir(private, 0o700)
    open(os.path.join(private, "inner"), "w").close()
    protected = os.path.join(work, "read-protected")
    open(protected, "w").close()
    os.chmod(protected, 0o600)
    listable = os.path.join(work, "listable")
    os.mkdir(listable)
    os.chmod(listable, 0o755)
    open(os.path.join(listable, "kept"), "w").close()
    os.chmod(os.path.join(listable, "kept"), 0o644)
    for name, mode in (("search-only", 0o711), ("list-only", 0o744)):
        os.mkdir(os.path.join(work, name))
        open(os.path.join(work, name, "known"), "w").close()
        os.chmod(os.path.join(work, name), mode)
    group_only = os.path.join(work, "group-only")
    open(group_only, "w").close()
    os.chmod(group_only, 0o660)
    os.chmod(work, 0o755)
    run_as_nobody(nobody_checks, "sticky directory and permission checks")
    expect(os.path.exists(root_file), "root's file vanished from the sticky directory")


# ---------------------------------------------------------------------------- readdir, statfs

class Dirent(ctypes.Structure):
    _fields_ = [("inode", ctypes.c_uint64), ("offset", ctypes.c_int64), ("record_length", ctypes.c_ushort),
                ("type", ctypes.c_ubyte), ("name", ctypes.c_char * 256)]


libc.opendir.restype = ctypes.c_void_p
libc.opendir.argtypes = [ctypes.c_char_p]
libc.readdir.restype = ctypes.POINTER(Dirent)
libc.readdir.argtypes = [ctypes.c_void_p]
libc.closedir.argtypes = [ctypes.c_void_p]
libc.rewinddir.argtypes = [ctypes.c_void_p]


def check_readdir_while_changing(work):
    top = os.path.join(work, "readdir")
    os.mkdir(top)
    count = 3000
    for index in range(count):
        open(os.path.join(top, f"stable-{index:05}"), "w").close()
    for index in range(count // 2):
        open(os.path.join(top, f"doomed-{index:05}"), "w").close()
    handle = libc.opendir(os.fsencode(top))
    expect(handle, "opendir failed")
    seen = []
    added = set()
    try:
        for step in range(3 * count + 10):
            entry = libc.readdir(handle)
            if not entry:
                break
            seen.append(entry.contents.name.decode())
            # Change the directory while the listing is under way: add new names (which may
            # split leaves) and remove others.
            if step % 10 == 0 and step // 10 < count // 2:
                index = step // 10
                open(os.path.join(top, f"added-{index:05}"), "w").close()
                added.add(f"added-{index:05}")
                os.unlink(os.path.join(top, f"doomed-{index:05}"))
    finally:
        libc.closedir(handle)
    names = [name for name in seen if name not in (".", "..")]
    duplicates = len(names) - len(set(names))
    missing = [f"stable-{index:05}" for index in range(count) if f"stable-{index:05}" not in set(names)]
    expect(duplicates == 0, f"{duplicates} names listed twice while the directory changed")
    expect(not missing, f"{len(missing)} unchanged names not listed, first {missing[:3]}")
    expect(seen.count(".") == 1 and seen.count("..") == 1, "'.' and '..' once each")
    # A fresh listing is exact.
    final = set(os.listdir(top))
    removed = {name.replace("added", "doomed") for name in added}
    expected = ({f"stable-{index:05}" for index in range(count)} | added
                | {f"doomed-{index:05}" for index in range(count // 2)}) - removed
    expect(final == expected, f"final listing differs: {len(final ^ expected)} names")
    # rewinddir after removing everything returns only . and ..
    shutil.rmtree(top)


def check_statfs(work):
    status = os.statvfs(work)
    expect(status.f_bsize > 0 and status.f_frsize > 0, "block size")
    expect(status.f_bfree <= status.f_blocks and status.f_bavail <= status.f_bfree, "free <= total")
    expect(status.f_ffree <= status.f_files, "free inodes <= total")
    expect(status.f_namemax == 255, f"f_namemax {status.f_namemax}")
    output = subprocess.run(["df", "-B1", "--output=size,used,avail", work], check=True, capture_output=True,
                            text=True).stdout.split("\n")[1].split()
    size, used, available = (int(value) for value in output)
    expect(size == status.f_blocks * status.f_frsize, f"df size {size} vs statvfs {status.f_blocks * status.f_frsize}")
    expect(abs(available - status.f_bavail * status.f_frsize) <= 64 << 20, "df available vs statvfs")
    expect(abs(used - (status.f_blocks - status.f_bfree) * status.f_frsize) <= 64 << 20, "df used vs statvfs")
    # Writing 32 MiB and syncing takes about that much space; removing it gives it back.
    path = os.path.join(work, "statfs-fill")
    before = os.statvfs(work)
    with open(path, "wb") as file:
        for _ in range(32):
            file.write(b"s" * (1 << 20))
        file.flush()
        os.fsync(file.fileno())
    os.sync()
    during = os.statvfs(work)
    used_bytes = (before.f_bfree - during.f_bfree) * during.f_frsize
    expect(30 << 20 <= used_bytes <= 40 << 20, f"32 MiB file took {used_bytes} bytes of free space")
    expect(before.f_ffree - during.f_ffree in (1, 0), f"one file took {before.f_ffree - during.f_ffree} inodes")
    expect(os.stat(path).st_blocks * 512 >= 32 << 20, f"st_blocks {os.stat(path).st_blocks} for 32 MiB")
    os.unlink(path)
    os.sync()
    # tandemfs counts the blocks of a removed file as free only once its back end has applied
    # the unlink (a fraction of a second; syncfs does not reach a FUSE server), while ext4 does
    # at once. Allow for that, within a bound.
    for _ in range(300):
        after = os.statvfs(work)
        if abs(int(after.f_bfree) - int(before.f_bfree)) * after.f_frsize <= 1 << 20:
            break
        time.sleep(0.1)
    expect(abs(int(after.f_bfree) - int(before.f_bfree)) * after.f_frsize <= 1 << 20,
           f"free space not given back: {before.f_bfree} before, {after.f_bfree} after")


def check_sparse_and_blocks(work):
    path = os.path.join(work, "sparse")
    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    os.pwrite(descriptor, b"end", 100 << 20)
    os.fsync(descriptor)
    status = os.fstat(descriptor)
    expect(status.st_size == (100 << 20) + 3, "sparse size")
    expect(status.st_blocks * 512 < 1 << 20, f"sparse file of 100 MiB uses {status.st_blocks * 512} bytes")
    expect(os.pread(descriptor, 4096, 50 << 20) == bytes(4096), "hole reads as zeros")
    os.close(descriptor)
    os.unlink(path)


def check_miscellaneous_errors(work):
    path = os.path.join(work, "file")
    with open(path, "w") as file:
        file.write("data")
    descriptor = os.open(path, os.O_RDONLY)
    expect_errno(errno.EINVAL, os.ftruncate, descriptor, 0)
    expect_errno(errno.EBADF, os.write, descriptor, b"x")
    os.close(descriptor)
    expect_errno(errno.EINVAL, os.truncate, path, -1)
    descriptor = os.open(path, os.O_RDWR)
    expect_errno(errno.EFBIG, os.pwrite, descriptor, b"x", 1 << 62)
    expect_errno(errno.EINVAL, os.pwrite, descriptor, b"x", -1)
    # Seeking for data past the end of the file is ENXIO.
    expect_errno(errno.ENXIO, os.lseek, descriptor, 100, os.SEEK_DATA)
    expect_errno(errno.ENXIO, os.lseek, descriptor, 100, os.SEEK_HOLE)
    expect(os.lseek(descriptor, 0, os.SEEK_HOLE) == 4, "SEEK_HOLE in a 4-byte file")
    os.close(descriptor)
    expect_errno(errno.ENOTDIR, os.open, path, os.O_RDONLY | os.O_DIRECTORY)
    expect_errno(errno.EINVAL, os.rmdir, os.path.join(work, "."))
    # A file created with mode 0 is writable through the descriptor that created it.
    zero = os.path.join(work, "mode-zero")
    def create_mode_zero():
        descriptor = os.open(zero, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0)
        os.write(descriptor, b"ok")
        os.close(descriptor)
        expect_errno(errno.EACCES, os.open, zero, os.O_RDONLY)
    os.chmod(work, 0o777)
    run_as_nobody(create_mode_zero, "write through a descriptor of a mode 0 file")
    expect(open(zero).read() == "ok", "content of the mode 0 file")
    # user.* extended attributes are not allowed on symbolic links (EPERM on Linux).
    link = os.path.join(work, "symlink")
    os.symlink("file", link)
    expect_errno(errno.EPERM, os.setxattr, link, "user.k", b"v", 0, follow_symlinks=False)
    os.setxattr(link, "trusted.k", b"v", follow_symlinks=False)
    expect(os.getxattr(link, "trusted.k", follow_symlinks=False) == b"v", "trusted xattr on a symlink")
    # utimensat without following a symlink changes the link, not the target.
    target_before = os.stat(path).st_mtime_ns
    os.utime(link, ns=(7_000_000_000, 7_000_000_000), follow_symlinks=False)
    expect(os.lstat(link).st_mtime_ns == 7_000_000_000, "symlink mtime")
    expect(os.stat(path).st_mtime_ns == target_before, "target mtime changed through a no-follow utime")
    # A removed directory that is still the working directory of somebody: creating in it fails.
    gone = os.path.join(work, "gone")
    os.mkdir(gone)
    descriptor = os.open(gone, os.O_RDONLY | os.O_DIRECTORY)
    os.rmdir(gone)
    expect(os.fstat(descriptor).st_nlink == 0, f"removed directory nlink {os.fstat(descriptor).st_nlink}")
    expect(os.listdir(descriptor) == [], "listing of a removed directory")
    expect_errno(errno.ENOENT, os.open, "new", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=descriptor)
    expect_errno(errno.ENOENT, os.mkdir, "new", dir_fd=descriptor)
    os.close(descriptor)
    # A directory opened for reading cannot be written; a large directory listing with
    # telldir/seekdir resumes where it was.
    many = os.path.join(work, "many")
    os.mkdir(many)
    for index in range(500):
        open(os.path.join(many, f"n{index}"), "w").close()
    handle = libc.opendir(os.fsencode(many))
    first = [libc.readdir(handle).contents.name for _ in range(100)]
    position = libc.telldir(handle)
    following = [libc.readdir(handle).contents.name for _ in range(50)]
    libc.seekdir(handle, position)
    again = [libc.readdir(handle).contents.name for _ in range(50)]
    libc.rewinddir(handle)
    rewound = [libc.readdir(handle).contents.name for _ in range(100)]
    libc.closedir(handle)
    expect(following == again, "seekdir to a telldir position does not resume there")
    expect(rewound == first, "rewinddir does not restart the listing")
    # O_APPEND writes from two descriptors interleave without overwriting.
    log = os.path.join(work, "appended")
    first_descriptor = os.open(log, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    second_descriptor = os.open(log, os.O_WRONLY | os.O_APPEND)
    for index in range(100):
        os.write(first_descriptor if index % 2 else second_descriptor, b"%04d" % index)
    os.close(first_descriptor)
    os.close(second_descriptor)
    expect(open(log, "rb").read() == b"".join(b"%04d" % index for index in range(100)), "O_APPEND interleaving")


def check_rename_exchange_and_noreplace(work):
    first = os.path.join(work, "first")
    second = os.path.join(work, "second")
    os.makedirs(os.path.join(first, "child-dir"))
    os.mkdir(second)
    with open(os.path.join(second, "child-file"), "w") as file:
        file.write("f")
    links_first, links_second = os.stat(first).st_nlink, os.stat(second).st_nlink
    exchange(os.path.join(first, "child-dir"), os.path.join(second, "child-file"))
    expect(os.path.isfile(os.path.join(first, "child-dir")) and os.path.isdir(os.path.join(second, "child-file")),
           "RENAME_EXCHANGE did not swap")
    expect(os.stat(first).st_nlink == links_first - 1, f"first nlink {os.stat(first).st_nlink} after exchange")
    expect(os.stat(second).st_nlink == links_second + 1, f"second nlink {os.stat(second).st_nlink} after exchange")
    expect(os.stat(os.path.join(second, "child-file", "..")).st_ino == os.stat(second).st_ino,
           "'..' of the exchanged directory")
    code = rename_flags(os.path.join(first, "child-dir"), os.path.join(second, "child-file"), 1)
    expect(code == errno.EEXIST, f"RENAME_NOREPLACE over an existing name: {errno.errorcode.get(code, code)}")
    code = rename_flags(os.path.join(first, "missing"), os.path.join(second, "child-file"), 2)
    expect(code == errno.ENOENT, f"RENAME_EXCHANGE with a missing source: {errno.errorcode.get(code, code)}")
    code = rename_flags(first, os.path.join(first, "child-dir2"), 2)
    expect(code in (errno.EINVAL, errno.ENOENT), f"exchange into own subtree: {errno.errorcode.get(code, code)}")


libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
libc.telldir.restype = ctypes.c_long
libc.telldir.argtypes = [ctypes.c_void_p]
libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]


def rename_flags(source, target, flags):
    """renameat2; returns 0 or the errno."""
    if libc.renameat2(AT_FDCWD, os.fsencode(source), AT_FDCWD, os.fsencode(target), flags) != 0:
        return ctypes.get_errno()
    return 0


def exchange(source, target):
    code = rename_flags(source, target, 2)
    expect(code == 0, f"RENAME_EXCHANGE {source} {target}: {errno.errorcode.get(code, code)}")


def check_xattr_namespaces(work):
    path = os.path.join(work, "file")
    open(path, "w").close()
    for name in ("bogus.name", "user", "name", "system.other"):
        expect_errno(errno.EOPNOTSUPP, os.setxattr, path, name, b"v")
        expect_errno(errno.EOPNOTSUPP, os.getxattr, path, name)
    expect_errno(errno.EINVAL, os.setxattr, path, "user.", b"v")
    for name in ("user.a", "trusted.b", "security.c"):
        os.setxattr(path, name, b"value")
        expect(os.getxattr(path, name) == b"value", f"{name} reads back")
    expect(sorted(os.listxattr(path)) == ["security.c", "trusted.b", "user.a"], f"listxattr {os.listxattr(path)}")
    expect_errno(errno.ERANGE, os.setxattr, path, "user." + "n" * 251, b"v")
    expect_errno(errno.E2BIG, os.setxattr, path, "user.big", b"v" * (65536 + 1))
    os.setxattr(path, "user.a", b"", os.XATTR_REPLACE)
    expect(os.getxattr(path, "user.a") == b"", "empty value")
    expect_errno(errno.EEXIST, os.setxattr, path, "user.a", b"x", os.XATTR_CREATE)
    expect_errno(errno.ENODATA, os.setxattr, path, "user.none", b"x", os.XATTR_REPLACE)
    expect_errno(errno.ENODATA, os.removexattr, path, "user.none")


CHECKS = {
    "times": check_times,
    "directory-link-counts": check_directory_link_counts,
    "rename-corner-cases": check_rename_corner_cases,
    "name-lengths": check_name_lengths,
    "paths-through-files": check_paths_through_files,
    "excl-on-symlink": check_excl_on_symlink,
    "set-id-bits": check_set_id_bits,
    "sticky-and-permissions": check_sticky_and_permissions,
    "readdir-while-changing": check_readdir_while_changing,
    "statfs": check_statfs,
    "sparse-blocks": check_sparse_and_blocks,
    "miscellaneous-errors": check_miscellaneous_errors,
    "rename-exchange-noreplace": check_rename_exchange_and_noreplace,
    "xattr-namespaces": check_xattr_namespaces,
}


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    base = sys.argv[1]
    names = sys.argv[2:] or list(CHECKS)
    os.umask(0o022)
    for name in names:
        work = os.path.join(base, name)
        os.mkdir(work)
        try:
            CHECKS[name](work)
            results["passed"] += 1
            print(f"PASS {name}")
        except (CheckFailed, OSError) as error:
            results["failed"] += 1
            print(f"FAIL {name}: {error}")
    print(f"posix_check: {results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
