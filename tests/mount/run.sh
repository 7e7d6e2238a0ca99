#!/usr/bin/env bash
# The mount test suite: real programs against a tandemfs mounted through FUSE.
#
# usage: tests/mount/run.sh PATH/TO/tandem
#
# Needs root, /dev/fuse and these packages (.ci/run installs them):
#   fuse3 (fusermount3), rsync, git, python3, attr (setfattr/getfattr),
#   util-linux (setpriv, fallocate), coreutils, tar, diffutils, findutils,
#   gawk or mawk, and a C compiler
#   (cc) for the C example (that one test is skipped without it); fio and stress-ng for the
#   torture tests of the same names (skipped without them).
#
# Prints one line per test and ends with exactly "N passed, N failed"; exits nonzero when any
# test failed. Each test runs in its own bash with `set -e -o pipefail` and a time limit; its
# output goes to a log whose tail is printed when it fails. After each group of tests the
# volume is unmounted, checked with `tandem fsck` and mounted again.

set -u

if [ $# -ne 1 ] || [ ! -x "$1" ]; then
    echo "usage: $0 PATH/TO/tandem" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (it mounts, chowns and switches users)" >&2
    exit 2
fi
if [ ! -e /dev/fuse ]; then
    echo "$0: /dev/fuse is missing" >&2
    exit 2
fi

TANDEM=$(realpath "$1")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
TESTS="$REPO/tests/mount"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tandem-mount-test.XXXXXX")
# The unprivileged tests walk through this directory as nobody.
chmod 755 "$WORK"
IMG="$WORK/volume.img"
MNT="$WORK/mnt"
LOCAL="$WORK/local"
LOGS="$WORK/logs"
mkdir -p "$MNT" "$LOCAL" "$LOGS"
# Trees from the system to copy around, present on any machine with a C toolchain: all of
# /usr/include (thousands of files) for cp -a, a smaller part of it for the other programs.
SYSTEM_HEADERS=/usr/include
INCLUDE_TREE=/usr/include/linux
export TANDEM REPO TESTS WORK IMG MNT LOCAL LOGS SYSTEM_HEADERS INCLUDE_TREE

# TRANSPORT=dev-fuse (the default) or TRANSPORT=uring runs every mount of the suite over that
# FUSE transport: `tandem mount` reads TANDEM_FUSE_TRANSPORT when no -o transport= is given.
# Over io_uring a mount fails rather than fall back, so no test passes on the other transport.
TRANSPORT=${TRANSPORT:-dev-fuse}
export TANDEM_FUSE_TRANSPORT=$TRANSPORT
echo "FUSE transport of every mount: $TRANSPORT"

passed=0
failed=0
suite_start=$(date +%s)

# usage: ONLY=REGEX tests/mount/run.sh PATH/TO/tandem runs only the tests whose names match.

# Field 5 of mountinfo is the mount point; the type follows the " - " separator.
is_mounted() {
    awk -v point="$MNT" '$5 == point && / - fuse/ { found = 1 } END { exit !found }' /proc/self/mountinfo
}

cleanup() {
    local point
    for point in $(awk -v work="$WORK/" 'index($5, work) == 1 { print $5 }' /proc/self/mountinfo); do
        "$TANDEM" umount "$point" >/dev/null 2>&1 || umount -l "$point" 2>/dev/null
    done
    if [ "${KEEP_WORK:-0}" = 1 ]; then
        echo "work directory kept: $WORK"
    else
        rm -rf --one-file-system "$WORK"
    fi
}
trap cleanup EXIT

# run_test NAME FUNCTION [LIMIT_SECONDS]
run_test() {
    local name=$1 function=$2 limit=${3:-120}
    local log="$LOGS/$name.log" start end status
    # ONLY=REGEX runs just the matching tests (those that set up their own volume).
    if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then return 0; fi
    start=$(date +%s%N)
    timeout --kill-after=10 "$limit" bash -c 'set -e -o pipefail; "$@"' run_test "$function" \
        >"$log" 2>&1
    status=$?
    end=$(date +%s%N)
    local tenths=$(( (end - start) / 100000000 ))
    local seconds="$(( tenths / 10 )).$(( tenths % 10 ))"
    if [ $status -eq 0 ]; then
        passed=$((passed + 1))
        echo "PASS $name (${seconds}s)"
    else
        failed=$((failed + 1))
        if [ $status -eq 124 ] || [ $status -eq 137 ]; then
            echo "FAIL $name (timed out after ${limit}s)"
        else
            echo "FAIL $name (exit $status, ${seconds}s)"
        fi
        tail -n 25 "$log" | sed 's/^/    | /'
        # Later tests need the volume mounted: bring it back after a failure that left it
        # unmounted (the failure is already counted).
        if ! is_mounted && [ "$function" != test_final_unmount_and_fsck ]; then
            echo "    (mounting the volume again for the remaining tests)"
            bash -c mount_volume >>"$log" 2>&1 || true
        fi
    fi
}

skip_test() {
    echo "SKIP $1 ($2)"
}

# ---------------------------------------------------------------- helpers (run inside tests)

# Each background mount writes its own log; a panic in the mount process, or a mount that finds
# the volume not cleanly unmounted after a clean `tandem umount`, fails the test at hand.
mount_volume() {
    local log output
    log="$LOGS/mount-$(date +%s%N).log"
    echo "$log" >"$WORK/current-mount-log"
    output=$("$TANDEM" mount "$IMG" "$MNT" -d --log-file "$log" -o "${1:-allow_other,default_permissions}")
    echo "$output"
    if grep -q "not unmounted cleanly" <<<"$output"; then
        echo "the volume was not clean although the previous unmount succeeded"
        return 1
    fi
    awk -v point="$MNT" '$5 == point && / - fuse\.tandemfs / { found = 1 } END { exit !found }' \
        /proc/self/mountinfo
}

unmount_volume() {
    "$TANDEM" umount "$MNT"
    if is_mounted; then echo "still mounted after umount"; return 1; fi
    check_mount_log
}

# Fails when the log of the current (or just ended) mount process shows a panic.
check_mount_log() {
    local log
    log=$(cat "$WORK/current-mount-log")
    if grep -q "panicked" "$log"; then
        echo "the mount process panicked; its log ($log):"
        grep -v '^  ' "$log"
        return 1
    fi
}

as_nobody() {
    setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"
}

# expect_failure "MESSAGE PART" COMMAND...: the command must fail and say MESSAGE PART.
expect_failure() {
    local expected=$1 output
    shift
    if output=$("$@" 2>&1); then
        echo "expected failure ($expected) but succeeded: $*"
        return 1
    fi
    if ! grep -qi -- "$expected" <<<"$output"; then
        echo "expected '$expected' from: $*"
        echo "got: $output"
        return 1
    fi
}

# A listing of a tree that covers names, types, modes, owners, sizes of files, link targets
# and modification times, for comparing copies.
tree_listing() {
    (cd "$1" && find . -mindepth 1 \( -type d -printf '%y %P %m %U %G %T@\n' \) -o \
        -printf '%y %P %m %U %G %s %T@ %l\n' | LC_ALL=C sort)
}

same_tree() {
    diff -r --no-dereference "$1" "$2"
    diff <(tree_listing "$1") <(tree_listing "$2")
}

export -f is_mounted mount_volume unmount_volume check_mount_log as_nobody expect_failure tree_listing same_tree

# ---------------------------------------------------------------- group 1: real programs

test_mkfs_and_mount() {
    "$TANDEM" mkfs "$IMG" --size 2G
    mount_volume
    test "$(stat -f -c '%l' "$MNT")" = 255
    df -P "$MNT" | tail -1
    test "$(stat -c %i "$MNT")" = 1
}

test_cp_source_tree() {
    cp -a "$REPO/crates" "$MNT/crates"
    same_tree "$REPO/crates" "$MNT/crates"
}

test_cp_include_tree() {
    cp -a "$SYSTEM_HEADERS" "$MNT/include"
    same_tree "$SYSTEM_HEADERS" "$MNT/include"
}

test_tar_roundtrip() {
    # POSIX (pax) archives keep nanosecond times, so the listings can be compared exactly.
    tar --format=posix -C "$MNT/crates" -cf "$LOCAL/crates.tar" .
    mkdir "$MNT/untar"
    tar -C "$MNT/untar" -xpf "$LOCAL/crates.tar"
    same_tree "$REPO/crates" "$MNT/untar"
    # And an archive written on the mount, extracted to local disk.
    tar --format=posix -C "$(dirname "$INCLUDE_TREE")" -cf "$MNT/include.tar" "$(basename "$INCLUDE_TREE")"
    mkdir "$LOCAL/untar"
    tar -C "$LOCAL/untar" -xpf "$MNT/include.tar"
    same_tree "$INCLUDE_TREE" "$LOCAL/untar/$(basename "$INCLUDE_TREE")"
}

test_git_repository() {
    cd "$MNT"
    git init -q project
    cp -a "$REPO/crates/tandem-fuse" project/
    cd project
    git add -A
    git -c user.name=Test -c user.email=test@example.invalid commit -q -m "first"
    echo "// changed" >>tandem-fuse/src/lib.rs
    git -c user.name=Test -c user.email=test@example.invalid commit -q -am "second"
    test "$(git log --oneline | wc -l)" -eq 2
    test "$(git log -1 --format=%s)" = second
    test -z "$(git status --porcelain)"
    git gc -q
    git fsck --strict
    git checkout -q HEAD~1
    cmp tandem-fuse/src/lib.rs "$REPO/crates/tandem-fuse/src/lib.rs"
}

test_rsync() {
    rsync -a "$INCLUDE_TREE/" "$MNT/rsync/"
    same_tree "$INCLUDE_TREE" "$MNT/rsync"
    # A second run finds nothing to do: sizes and times were kept exactly.
    changes=$(rsync -ai "$INCLUDE_TREE/" "$MNT/rsync/")
    test -z "$changes" || { echo "second rsync changed: $changes"; exit 1; }
    # Deletions propagate.
    rsync -a "$MNT/rsync/" "$LOCAL/rsync/"
    rm -f "$LOCAL/rsync/"*.h
    rsync -a --delete "$LOCAL/rsync/" "$MNT/rsync/"
    same_tree "$LOCAL/rsync" "$MNT/rsync"
}

test_find() {
    diff <(cd "$REPO/crates" && find . | LC_ALL=C sort) <(cd "$MNT/crates" && find . | LC_ALL=C sort)
    test "$(find "$MNT/include" -type f | wc -l)" -eq "$(find "$SYSTEM_HEADERS" -type f | wc -l)"
    test "$(find "$MNT/include" -type l | wc -l)" -eq "$(find "$SYSTEM_HEADERS" -type l | wc -l)"
    test "$(find "$MNT/crates" -name '*.rs' | wc -l)" -eq "$(find "$REPO/crates" -name '*.rs' | wc -l)"
}

test_links() {
    mkdir "$MNT/links"
    cd "$MNT/links"
    echo "linked data" >a
    ln a b
    test "$(stat -c %h a)" -eq 2
    test "$(stat -c %i a)" = "$(stat -c %i b)"
    rm a
    test "$(cat b)" = "linked data"
    test "$(stat -c %h b)" -eq 1
    ln -s b symbolic
    test "$(readlink symbolic)" = b
    test "$(cat symbolic)" = "linked data"
    ln -s ../nowhere dangling
    test -L dangling
    test ! -e dangling
    mkdir directory
    ln -s directory directory-link
    touch directory-link/through
    test -f directory/through
    expect_failure "not \(allowed\|permitted\)" ln directory directory-hard
    long_target=$(printf 'x%.0s' $(seq 1 4000))
    ln -s "$long_target" long-link
    test "$(readlink long-link)" = "$long_target"
}

test_chmod_chown() {
    mkdir "$MNT/modes"
    cd "$MNT/modes"
    touch f
    chmod 0751 f
    test "$(stat -c %a f)" = 751
    chmod u+s,g+s f
    test "$(stat -c %a f)" = 6751
    # Like every Linux file system, chown of a regular file drops set-user-ID, and
    # set-group-ID when the group may execute.
    chown 65534:65534 f
    test "$(stat -c %u:%g f)" = 65534:65534
    test "$(stat -c %a f)" = 751
    chown root:root f
    test "$(stat -c %U f)" = root
    # Set-group-ID directories hand their group (and, to subdirectories, the bit) down.
    mkdir g
    chown 0:65534 g
    chmod 2775 g
    touch g/file
    mkdir g/sub
    test "$(stat -c %g g/file)" = 65534
    test "$(stat -c %g g/sub)" = 65534
    test "$(( 0$(stat -c %a g/sub) & 02000 ))" -ne 0
    # Timestamps: explicit and now.
    TZ=UTC touch -d '2001-02-03 04:05:06.123456789' f
    test "$(TZ=UTC stat -c %y f)" = "2001-02-03 04:05:06.123456789 +0000"
    touch f
    test "$(stat -c %Y f)" -ge "$(( $(date +%s) - 60 ))"
}

# ---------------------------------------------------------------- group 2: file contents

test_truncate() {
    head -c 300000 /dev/urandom >"$LOCAL/truncate"
    cp "$LOCAL/truncate" "$MNT/truncate"
    for size in 100000 2M +12345 0 7 4097; do
        truncate -s "$size" "$LOCAL/truncate"
        truncate -s "$size" "$MNT/truncate"
        cmp "$LOCAL/truncate" "$MNT/truncate"
        test "$(stat -c %s "$LOCAL/truncate")" = "$(stat -c %s "$MNT/truncate")"
    done
}

test_dd() {
    dd if=/dev/urandom of="$LOCAL/random" bs=1M count=16 status=none
    dd if="$LOCAL/random" of="$MNT/random" bs=64k conv=fsync status=none
    cmp "$LOCAL/random" "$MNT/random"
    # Odd block sizes and in-place overwrites.
    dd if=/dev/urandom of="$LOCAL/patch" bs=1000 count=37 status=none
    for target in "$LOCAL/random" "$MNT/random"; do
        dd if="$LOCAL/patch" of="$target" bs=1000 seek=777 conv=notrunc status=none
        dd if="$LOCAL/patch" of="$target" bs=7 seek=2396714 conv=notrunc status=none
    done
    cmp "$LOCAL/random" "$MNT/random"
    dd if="$MNT/random" bs=333 skip=1001 count=50 status=none | cmp - \
        <(dd if="$LOCAL/random" bs=333 skip=1001 count=50 status=none)
}

test_large_sparse_file() {
    head -c 1048576 /dev/urandom >"$LOCAL/chunk"
    # 1 MiB of data at 5 GiB: the file is larger than 4 GiB but almost all hole.
    dd if="$LOCAL/chunk" of="$MNT/big" bs=1M seek=5120 conv=notrunc status=none
    test "$(stat -c %s "$MNT/big")" -eq $(( 5 * 1024 * 1024 * 1024 + 1048576 ))
    dd if="$MNT/big" bs=1M skip=5120 count=1 status=none | cmp - "$LOCAL/chunk"
    dd if="$MNT/big" bs=1M skip=4096 count=1 status=none | cmp - <(head -c 1048576 /dev/zero)
    test "$(( $(stat -c %b "$MNT/big") * 512 ))" -lt $(( 64 * 1024 * 1024 ))
    # A write across the 4 GiB boundary, read back exactly.
    python3 - "$MNT/big" <<'EOF'
import os, sys
descriptor = os.open(sys.argv[1], os.O_RDWR)
boundary = 1 << 32
data = bytes(range(256)) * 8
os.pwrite(descriptor, data, boundary - 1000)
assert os.pread(descriptor, len(data), boundary - 1000) == data
assert os.pread(descriptor, 10, boundary - 1010) == bytes(10)
os.close(descriptor)
EOF
    truncate -s 6G "$MNT/sparse6g"
    test "$(stat -c %s "$MNT/sparse6g")" -eq $(( 6 * 1024 * 1024 * 1024 ))
    dd if="$MNT/sparse6g" bs=1M skip=6000 count=2 status=none | cmp - <(head -c 2097152 /dev/zero)
    rm "$MNT/sparse6g"
}

test_fallocate() {
    head -c 1048576 /dev/urandom >"$LOCAL/falloc"
    cp "$LOCAL/falloc" "$MNT/falloc"
    for target in "$LOCAL/falloc" "$MNT/falloc"; do
        fallocate -l 2M "$target"                       # mode 0: extends
        fallocate -n -o 2M -l 1M "$target"              # KEEP_SIZE: size unchanged
        fallocate -p -o 4096 -l 10000 "$target"         # PUNCH_HOLE | KEEP_SIZE
        fallocate -z -o 300001 -l 5000 "$target"        # ZERO_RANGE inside
        fallocate -z -o 2097152 -l 100000 "$target"     # ZERO_RANGE past the end: extends
    done
    test "$(stat -c %s "$MNT/falloc")" -eq $(( 2097152 + 100000 ))
    test "$(stat -c %s "$LOCAL/falloc")" = "$(stat -c %s "$MNT/falloc")"
    cmp "$LOCAL/falloc" "$MNT/falloc"
    # Byte-granular insert and collapse do not travel through fallocate (see docs/FUSE.md).
    python3 - "$MNT/falloc" <<'EOF'
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
descriptor = os.open(sys.argv[1], os.O_RDWR)
for mode in (0x20, 0x08):  # INSERT_RANGE, COLLAPSE_RANGE
    result = libc.fallocate(descriptor, mode, ctypes.c_long(0), ctypes.c_long(4096))
    assert result == -1 and ctypes.get_errno() == errno.EOPNOTSUPP, (mode, ctypes.get_errno())
EOF
}

# FUSE over io_uring, whatever the suite's transport: a small volume mounted with
# -o transport=uring says so in its log, and files created, stat-ed, written, read back and
# unlinked from two processes (so requests arrive on more than one CPU's queue) come out right.
test_uring_create_stat_unlink() {
    local image="$WORK/uring.img" mountpoint="$WORK/uring-mnt" log="$LOGS/uring-mount.log"
    mkdir -p "$mountpoint"
    "$TANDEM" mkfs "$image" --size 128M
    "$TANDEM" mount "$image" "$mountpoint" -d --log-file "$log" -o allow_other,default_permissions,transport=uring
    grep -q "serves through io_uring" "$log" || { sleep 1; grep "serves through io_uring" "$log"; }
    local pids=()
    for worker in 1 2; do
        (
            for index in $(seq 200); do
                name="$mountpoint/w$worker-$index"
                printf 'worker %s file %s\n' "$worker" "$index" >"$name"
                [ "$(stat -c %s "$name")" -gt 0 ]
                grep -q "file $index\$" "$name"
                rm "$name"
                [ ! -e "$name" ]
            done
        ) &
        pids+=($!)
    done
    wait "${pids[0]}" && wait "${pids[1]}"
    [ -z "$(ls -A "$mountpoint")" ]
    "$TANDEM" umount "$mountpoint"
    if grep -q panicked "$log"; then grep -v '^  ' "$log"; exit 1; fi
    "$TANDEM" fsck "$image"
    rm -f "$image"
}

# posix_fallocate promises that later writes into the range do not fail for lack of space; on
# a full volume, overwrites of written data take no new blocks either (both work on ext4).
test_fallocated_space_on_full_volume() {
    local image="$WORK/reserve.img" mountpoint="$WORK/reserve-mnt" log="$LOGS/reserve-mount.log"
    mkdir -p "$mountpoint"
    "$TANDEM" mkfs "$image" --size 128M
    "$TANDEM" mount "$image" "$mountpoint" -d --log-file "$log" -o allow_other,default_permissions
    fallocate -l $(( 128 * 1048576 * 6 / 10 )) "$mountpoint/A"
    if dd if=/dev/zero of="$mountpoint/B" bs=1M count=200 2>"$WORK/fill.err"; then
        echo "the volume never filled"
        exit 1
    fi
    grep "No space left" "$WORK/fill.err"
    head -c 4194304 /dev/urandom >"$LOCAL/reserve-data"
    dd if="$LOCAL/reserve-data" of="$mountpoint/A" bs=1M count=4 conv=notrunc,fsync status=none
    dd if="$LOCAL/reserve-data" of="$mountpoint/B" bs=1M count=2 seek=1 conv=notrunc,fsync status=none
    cmp -n 4194304 "$LOCAL/reserve-data" "$mountpoint/A"
    cmp -n 2097152 "$LOCAL/reserve-data" <(tail -c +1048577 "$mountpoint/B")
    "$TANDEM" umount "$mountpoint"
    if grep -q panicked "$log"; then grep -v '^  ' "$log"; exit 1; fi
    "$TANDEM" fsck "$image"
    rm -f "$image"
}

# A bit flipped in a file's data block on the image (format 4 data checksums): fsck names the
# block and exits 1, reads of that block through the mount fail with EIO (never other bytes)
# and the mount log says which inode and block, and the blocks before it still read.
test_damaged_data_is_eio() {
    local image="$WORK/damaged.img" mountpoint="$WORK/damaged-mnt" log="$LOGS/damaged-mount.log"
    mkdir -p "$mountpoint"
    "$TANDEM" mkfs "$image" --size 64M
    "$TANDEM" mount "$image" "$mountpoint" -d --log-file "$log" -o allow_other,default_permissions
    head -c 20000 /dev/urandom >"$LOCAL/damaged-data"
    cp "$LOCAL/damaged-data" "$mountpoint/f"
    "$TANDEM" umount "$mountpoint"
    # The second block of the file at home: the copy block-aligned in the data region (the
    # log holds the same bytes unaligned).
    python3 - "$image" "$LOCAL/damaged-data" <<'PYTHON'
import sys
image, data = bytearray(open(sys.argv[1], "rb").read()), open(sys.argv[2], "rb").read()
block, at, found = data[4096:8192], -1, []
while (at := image.find(block, at + 1)) >= 0:
    if at % 4096 == 0:
        found.append(at)
assert len(found) == 1, found
image[found[0] + 100] ^= 0x04
open(sys.argv[1], "wb").write(image)
PYTHON
    local status=0
    "$TANDEM" fsck "$image" >"$WORK/damaged-fsck.out" 2>&1 || status=$?
    cat "$WORK/damaged-fsck.out"
    [ "$status" -eq 1 ]
    grep -q "file offset 4096: data block" "$WORK/damaged-fsck.out"
    # The summary does not promise that a repair brings the data back.
    grep -q "1 data block stays damaged" "$WORK/damaged-fsck.out"
    "$TANDEM" mount "$image" "$mountpoint" -d --log-file "$log" -o allow_other,default_permissions
    expect_failure "Input/output error" cat "$mountpoint/f"
    expect_failure "Input/output error" dd if="$mountpoint/f" of=/dev/null bs=4096 skip=1 count=1
    cmp -n 4096 "$LOCAL/damaged-data" "$mountpoint/f"
    "$TANDEM" umount "$mountpoint"
    grep -q "corruption detected, answering EIO: inode .*data block" "$log"
    if grep -q panicked "$log"; then grep -v '^  ' "$log"; exit 1; fi
    rm -f "$image"
}

# st_blocks counts fallocated blocks at once, as on ext4 (2048 sectors for 1 MiB), not only
# once the back end has applied the allocation.
test_blocks_after_fallocate() {
    fallocate -l 1M "$MNT/blocks-falloc"
    test "$(stat -c %b "$MNT/blocks-falloc")" -eq 2048
    head -c 8192 /dev/zero >>"$MNT/blocks-falloc"
    test "$(stat -c %b "$MNT/blocks-falloc")" -eq 2064
    rm "$MNT/blocks-falloc"
}

# relatime, ext4's default: a read moves an access time that is not after the last change,
# and the moved time survives a remount.
test_relatime() {
    echo a >"$MNT/atime"
    local before after
    before=$(stat -c %x "$MNT/atime")
    sleep 1.1
    cat "$MNT/atime" >/dev/null
    after=$(stat -c %x "$MNT/atime")
    echo "before $before, after $after"
    test "$after" != "$before"
    unmount_volume
    mount_volume
    test "$(stat -c %x "$MNT/atime")" = "$after"
    rm "$MNT/atime"
}

# SEEK_DATA and SEEK_HOLE before the start or at or past the end: ENXIO, as on ext4.
test_seek_outside_the_file() {
    printf 'some data' >"$MNT/seek"
    python3 - "$MNT/seek" <<'PYTHON'
import errno, os, sys
descriptor = os.open(sys.argv[1], os.O_RDONLY)
for whence in (os.SEEK_DATA, os.SEEK_HOLE):
    for offset in (-1, 9, 100):
        try:
            os.lseek(descriptor, offset, whence)
        except OSError as error:
            assert error.errno == errno.ENXIO, (offset, whence, error)
        else:
            raise AssertionError(f"lseek({offset}, {whence}) succeeded")
assert os.lseek(descriptor, 3, os.SEEK_DATA) == 3
assert os.lseek(descriptor, 3, os.SEEK_HOLE) == 9
PYTHON
    rm "$MNT/seek"
}

# File handles (what an NFS export of the mount hands out) stay valid after the kernel has
# dropped the inodes: open_by_handle_at then makes the kernel look up "." in the file's node
# id, and ".." to reconnect a directory. A removed file's handle is stale.
test_file_handles() {
    cc -Wall -Wextra -Werror -o "$WORK/file_handles" "$TESTS/file_handles.c"
    mkdir -p "$MNT/handles/deep/er"
    echo "kept by handle" >"$MNT/handles/deep/er/file"
    echo gone >"$MNT/handles/gone"
    "$WORK/file_handles" save "$MNT/handles/deep/er/file" "$WORK/file.handle"
    "$WORK/file_handles" save "$MNT/handles/deep/er" "$WORK/directory.handle"
    "$WORK/file_handles" save "$MNT/handles/gone" "$WORK/gone.handle"
    rm "$MNT/handles/gone"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    test "$("$WORK/file_handles" open "$MNT" "$WORK/file.handle")" = "kept by handle"
    echo 3 >/proc/sys/vm/drop_caches
    "$WORK/file_handles" open "$MNT" "$WORK/directory.handle" | grep -qx file
    echo 3 >/proc/sys/vm/drop_caches
    local status=0
    "$WORK/file_handles" open "$MNT" "$WORK/gone.handle" || status=$?
    test "$status" -eq 3
    rm -r "$MNT/handles"
}

test_random_io() {
    python3 "$TESTS/random_io.py" "$MNT/random-a.bin" 42 1500 &
    first=$!
    python3 "$TESTS/random_io.py" "$MNT/random-b.bin" 7 1500 8388608 &
    second=$!
    wait $first
    wait $second
}

test_parallel_writers() {
    mkdir "$MNT/shared"
    writer() {
        local job=$1 index directory
        for index in $(seq 1 120); do
            directory="$MNT/shared/d$(( index % 6 ))/sub$(( index % 2 ))"
            mkdir -p "$directory"
            printf 'job %s file %s\n%s\n' "$job" "$index" "$(seq "$index")" >"$directory/w${job}_$index.tmp"
            mv "$directory/w${job}_$index.tmp" "$directory/w${job}_$index"
            if (( index % 10 == 0 )); then
                rm "$MNT/shared/d$(( (index - 5) % 6 ))/sub$(( (index - 5) % 2 ))/w${job}_$(( index - 5 ))"
            fi
        done
    }
    for job in 1 2 3 4; do writer "$job" & done
    wait
    for job in 1 2 3 4; do
        for index in $(seq 1 120); do
            file="$MNT/shared/d$(( index % 6 ))/sub$(( index % 2 ))/w${job}_$index"
            if (( (index + 5) % 10 == 0 )); then
                test ! -e "$file"
            else
                diff "$file" <(printf 'job %s file %s\n%s\n' "$job" "$index" "$(seq "$index")")
            fi
        done
    done
    test "$(find "$MNT/shared" -type f | wc -l)" -eq $(( 4 * 108 ))
    test -z "$(find "$MNT/shared" -name '*.tmp')"
}

test_xattrs() {
    touch "$MNT/xattr"
    setfattr -n user.colour -v blue "$MNT/xattr"
    test "$(getfattr --only-values -n user.colour "$MNT/xattr")" = blue
    big=$(head -c 3000 /dev/zero | tr '\0' 'v')
    setfattr -n user.big -v "$big" "$MNT/xattr"
    test "$(getfattr --only-values -n user.big "$MNT/xattr")" = "$big"
    getfattr -d "$MNT/xattr" | grep 'user.colour="blue"' >/dev/null
    setfattr -x user.colour "$MNT/xattr"
    expect_failure "No such attribute" getfattr -n user.colour "$MNT/xattr"
    mkdir "$MNT/xattr-dir"
    setfattr -n user.on-directory -v yes "$MNT/xattr-dir"
    test "$(getfattr --only-values -n user.on-directory "$MNT/xattr-dir")" = yes
    python3 - "$MNT/xattr" <<'EOF'
import ctypes, errno, os, sys
path = sys.argv[1].encode()
libc = ctypes.CDLL(None, use_errno=True)
# A size-0 probe returns the size; a buffer one byte short gets ERANGE.
size = libc.getxattr(path, b"user.big", None, ctypes.c_size_t(0))
assert size == 3000, size
buffer = ctypes.create_string_buffer(2999)
assert libc.getxattr(path, b"user.big", buffer, ctypes.c_size_t(2999)) == -1
assert ctypes.get_errno() == errno.ERANGE
list_size = libc.listxattr(path, None, ctypes.c_size_t(0))
assert list_size == len(b"user.big\0"), list_size
small = ctypes.create_string_buffer(3)
assert libc.listxattr(path, small, ctypes.c_size_t(3)) == -1 and ctypes.get_errno() == errno.ERANGE
try:
    os.setxattr(sys.argv[1], "user.big", b"x", os.XATTR_CREATE)
    raise SystemExit("XATTR_CREATE on an existing attribute succeeded")
except OSError as error:
    assert error.errno == errno.EEXIST, error
try:
    os.setxattr(sys.argv[1], "user.missing", b"x", os.XATTR_REPLACE)
    raise SystemExit("XATTR_REPLACE on a missing attribute succeeded")
except OSError as error:
    assert error.errno == errno.ENODATA, error
EOF
}

test_mmap() {
    python3 - "$MNT/mapped" <<'EOF'
import mmap, os, sys
path = sys.argv[1]
size = 3 * 4096 + 100
descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(descriptor, size)
with mmap.mmap(descriptor, size) as mapping:
    for offset in (0, 4095, 8192, size - 7):
        mapping[offset:offset + 7] = b"MAPPED!"
    mapping.flush()
expected = bytearray(size)
for offset in (0, 4095, 8192, size - 7):
    expected[offset:offset + 7] = b"MAPPED!"
os.close(descriptor)
with open(path, "rb") as handle:
    assert handle.read() == bytes(expected)
# Writes through write(2) are visible in an existing mapping.
descriptor = os.open(path, os.O_RDWR)
with mmap.mmap(descriptor, size, prot=mmap.PROT_READ) as mapping:
    os.pwrite(descriptor, b"written", 5000)
    assert mapping[5000:5007] == b"written"
os.close(descriptor)
EOF
}

test_rename() {
    mkdir -p "$MNT/rename/a" "$MNT/rename/b" "$MNT/rename/empty" "$MNT/rename/full/x"
    cd "$MNT/rename"
    echo one >a/one
    echo two >b/two
    mv a/one b/two
    test "$(cat b/two)" = one
    test ! -e a/one
    mv b/two a/moved
    mv empty a/empty-moved
    mkdir target-empty
    mv -T full target-empty
    test -d target-empty/x
    mkdir nonempty-source; touch nonempty-source/f
    mkdir -p nonempty-target/g
    expect_failure "not empty" mv -T nonempty-source nonempty-target
    python3 - <<'EOF'
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, NOREPLACE, EXCHANGE = -100, 1, 2
open("left", "w").write("left")
open("right", "w").write("right")
assert libc.renameat2(AT_FDCWD, b"left", AT_FDCWD, b"right", NOREPLACE) == -1
assert ctypes.get_errno() == errno.EEXIST
assert libc.renameat2(AT_FDCWD, b"left", AT_FDCWD, b"right", EXCHANGE) == 0
assert open("left").read() == "right" and open("right").read() == "left"
os.mkdir("directory-side")
assert libc.renameat2(AT_FDCWD, b"left", AT_FDCWD, b"directory-side", EXCHANGE) == 0
assert os.path.isdir("left") and open("directory-side").read() == "right"
assert libc.renameat2(AT_FDCWD, b"right", AT_FDCWD, b"new-name", NOREPLACE) == 0
EOF
}

test_open_semantics() {
    python3 - "$MNT" <<'EOF'
import errno, os, sys
root = sys.argv[1]
path = os.path.join(root, "open-semantics")
descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
os.write(descriptor, b"0123456789")
os.close(descriptor)
try:
    os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    raise SystemExit("O_EXCL on an existing file succeeded")
except FileExistsError:
    pass
# O_APPEND from two descriptors interleaves at the end.
first = os.open(path, os.O_WRONLY | os.O_APPEND)
second = os.open(path, os.O_WRONLY | os.O_APPEND)
os.write(first, b"A")
os.write(second, b"B")
os.write(first, b"C")
os.close(first)
os.close(second)
assert open(path, "rb").read() == b"0123456789ABC"
# O_TRUNC empties.
os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))
assert os.stat(path).st_size == 0
# An unlinked file stays usable while open.
descriptor = os.open(path, os.O_RDWR)
os.write(descriptor, b"still here")
os.unlink(path)
assert not os.path.exists(path)
assert os.pread(descriptor, 100, 0) == b"still here"
os.pwrite(descriptor, b"and writable", 20)
assert os.fstat(descriptor).st_size == 32
os.close(descriptor)
# Errors the kernel gets from the engine.
for name, expected in ((b"n" * 256, errno.ENAMETOOLONG),):
    try:
        os.open(os.path.join(root.encode(), name), os.O_CREAT | os.O_WRONLY)
        raise SystemExit("a 256-byte name was accepted")
    except OSError as error:
        assert error.errno == expected, error
os.mkdir(os.path.join(root, "not-empty"))
open(os.path.join(root, "not-empty", "f"), "w").close()
try:
    os.rmdir(os.path.join(root, "not-empty"))
    raise SystemExit("rmdir of a non-empty directory succeeded")
except OSError as error:
    assert error.errno == errno.ENOTEMPTY, error
try:
    os.open(os.path.join(root, "not-empty", "f", "below-a-file"), os.O_RDONLY)
    raise SystemExit("a path through a file resolved")
except OSError as error:
    assert error.errno == errno.ENOTDIR, error
# SEEK_DATA / SEEK_HOLE see the whole file as data.
descriptor = os.open(os.path.join(root, "not-empty", "f"), os.O_RDWR)
os.write(descriptor, b"x" * 5000)
assert os.lseek(descriptor, 10, os.SEEK_DATA) == 10
assert os.lseek(descriptor, 10, os.SEEK_HOLE) == 5000
os.close(descriptor)
EOF
}

test_special_files() {
    mkdir "$MNT/special"
    cd "$MNT/special"
    mkfifo fifo
    test -p fifo
    mknod character c 1 3
    test -c character
    test "$(stat -c '%t:%T' character)" = 1:3
    mknod block b 7 0
    test -b block
    python3 -c "import socket; s = socket.socket(socket.AF_UNIX); s.bind('socket')"
    test -S socket
    # A FIFO on the mount passes data between processes.
    (echo through-the-fifo >fifo &)
    test "$(cat fifo)" = through-the-fifo
}

# ---------------------------------------------------------------- group 3: users and editing

test_permissions_unprivileged() {
    mkdir "$MNT/perm"
    chmod 755 "$MNT/perm"
    echo secret >"$MNT/perm/secret"; chmod 600 "$MNT/perm/secret"
    echo public >"$MNT/perm/public"; chmod 644 "$MNT/perm/public"
    mkdir "$MNT/perm/private"; chmod 700 "$MNT/perm/private"
    test "$(as_nobody cat "$MNT/perm/public")" = public
    expect_failure "Permission denied" as_nobody cat "$MNT/perm/secret"
    expect_failure "Permission denied" as_nobody sh -c "echo x >>'$MNT/perm/public'"
    expect_failure "Permission denied" as_nobody touch "$MNT/perm/new"
    expect_failure "Permission denied" as_nobody ls "$MNT/perm/private"
    expect_failure "Permission denied" as_nobody rm -f "$MNT/perm/public"
    expect_failure "not permitted" as_nobody chmod 777 "$MNT/perm/public"
    expect_failure "not permitted" as_nobody chown nobody "$MNT/perm/public"
    # Sticky, world-writable directory: everyone creates, only owners remove.
    mkdir "$MNT/sticky"; chmod 1777 "$MNT/sticky"
    echo root >"$MNT/sticky/rootfile"; chmod 666 "$MNT/sticky/rootfile"
    as_nobody sh -c "echo mine >'$MNT/sticky/nobodyfile'"
    test "$(stat -c %U:%G "$MNT/sticky/nobodyfile")" = nobody:nogroup
    as_nobody sh -c "echo appended >>'$MNT/sticky/rootfile'"
    as_nobody touch "$MNT/sticky/rootfile"
    expect_failure "not permitted" as_nobody touch -d 2000-01-01 "$MNT/sticky/rootfile"
    expect_failure "not permitted" as_nobody rm -f "$MNT/sticky/rootfile"
    expect_failure "not permitted" as_nobody mv "$MNT/sticky/rootfile" "$MNT/sticky/renamed"
    as_nobody chmod 640 "$MNT/sticky/nobodyfile"
    test "$(stat -c %a "$MNT/sticky/nobodyfile")" = 640
    expect_failure "not permitted" as_nobody chgrp root "$MNT/sticky/nobodyfile"
    as_nobody mkdir "$MNT/sticky/nobody-dir"
    as_nobody rm "$MNT/sticky/nobodyfile"
    rm "$MNT/sticky/rootfile"
    # A write by someone other than the owner clears set-user-ID and set-group-ID.
    echo privileged >"$MNT/sticky/setid"; chmod 6777 "$MNT/sticky/setid"
    as_nobody sh -c "echo change >>'$MNT/sticky/setid'"
    test "$(stat -c %a "$MNT/sticky/setid")" = 777
    # Set-group-ID on a file of a group the caller is not in is dropped.
    touch "$MNT/sticky/g"
    chown nobody:root "$MNT/sticky/g"
    as_nobody chmod 2755 "$MNT/sticky/g"
    test "$(stat -c %a "$MNT/sticky/g")" = 755
}

test_insert_collapse_commands() {
    python3 "$TESTS/insert_collapse_check.py" "$TANDEM" "$MNT/edit.bin" 7 60
    # Edges: at the end, everything, and errors.
    printf 'abcdef' >"$MNT/edge"
    "$TANDEM" insert "$MNT/edge" 6 --zeros 2
    test "$(od -An -c "$MNT/edge" | tr -d ' ')" = 'abcdef\0\0'
    "$TANDEM" collapse "$MNT/edge" 0 8
    test "$(stat -c %s "$MNT/edge")" -eq 0
    printf 'abc' >"$MNT/edge"
    if "$TANDEM" collapse "$MNT/edge" 2 5 2>/dev/null; then echo "collapse past the end succeeded"; exit 1; fi
    if "$TANDEM" insert "$MNT/edge" 10 --zeros 1 2>/dev/null; then echo "insert past the end succeeded"; exit 1; fi
    test "$(cat "$MNT/edge")" = abc
}

test_insert_large_data() {
    head -c 20000000 /dev/urandom >"$LOCAL/large"
    head -c 3000000 /dev/urandom >"$LOCAL/insertion"
    cp "$LOCAL/large" "$MNT/large"
    "$TANDEM" insert "$MNT/large" 12345 --from "$LOCAL/insertion"
    { head -c 12345 "$LOCAL/large"; cat "$LOCAL/insertion"; tail -c +12346 "$LOCAL/large"; } \
        | cmp - "$MNT/large"
    "$TANDEM" collapse "$MNT/large" 12345 3000000
    cmp "$LOCAL/large" "$MNT/large"
}

test_insert_ioctl_semantics() {
    python3 - "$MNT/ioctl" <<'EOF'
import errno, fcntl, mmap, os, struct, sys, ctypes
path = sys.argv[1]
INSERT, COLLAPSE = 0x4018D401, 0x4018D402
with open(path, "wb") as handle:
    handle.write(b"A" * 4096 + b"B" * 4096)
descriptor = os.open(path, os.O_RDWR)
mapping = mmap.mmap(descriptor, 8192, prot=mmap.PROT_READ)
assert mapping[4095:4097] == b"AB"
data = ctypes.create_string_buffer(b"xyz", 3)
fcntl.ioctl(descriptor, INSERT, struct.pack("QQQ", 4096, 3, ctypes.addressof(data)))
# The kernel's cached pages were dropped: the mapping and read(2) see the shifted bytes.
assert mapping[4095:4100] == b"AxyzB", mapping[4095:4100]
assert os.pread(descriptor, 5, 4095) == b"AxyzB"
assert os.fstat(descriptor).st_size == 8195
fcntl.ioctl(descriptor, COLLAPSE, struct.pack("QQQ", 0, 4096, 0))
assert os.pread(descriptor, 4, 0) == b"xyzB"
assert mapping[0:4] == b"xyzB"
mapping.close()
# COLLAPSE with a data pointer is refused.
try:
    fcntl.ioctl(descriptor, COLLAPSE, struct.pack("QQQ", 0, 1, 1))
    raise SystemExit("COLLAPSE with data accepted")
except OSError as error:
    assert error.errno == errno.EINVAL, error
os.close(descriptor)
# A read-only descriptor may not change the file.
descriptor = os.open(path, os.O_RDONLY)
try:
    fcntl.ioctl(descriptor, INSERT, struct.pack("QQQ", 0, 1, 0))
    raise SystemExit("INSERT through a read-only descriptor accepted")
except OSError as error:
    assert error.errno == errno.EBADF, error
# An O_APPEND writer whose kernel still has the size from before an insert (nobody asked for
# attributes in between) still appends at the real end.
descriptor = os.open(path, os.O_RDWR | os.O_TRUNC)
os.write(descriptor, b"0123456789")
fcntl.ioctl(descriptor, INSERT, struct.pack("QQQ", 0, 5, 0))
appender = os.open(path, os.O_WRONLY | os.O_APPEND)
os.write(appender, b"END")
os.close(appender)
assert os.pread(descriptor, 100, 0) == bytes(5) + b"0123456789END", os.pread(descriptor, 100, 0)
os.close(descriptor)
descriptor = os.open(path, os.O_RDONLY)
# Unknown commands are not ours.
try:
    fcntl.ioctl(descriptor, 0x4018D4FF, struct.pack("QQQ", 0, 0, 0))
    raise SystemExit("unknown ioctl accepted")
except OSError as error:
    assert error.errno == errno.ENOTTY, error
os.close(descriptor)
EOF
}

# Pages written through mmap and not yet written back move with an insert or collapse: the
# adapter has the kernel write them back before the shift, not after it at the old offsets.
test_insert_after_dirty_mmap() {
    python3 - "$MNT/dirty-mmap" <<'EOF'
import ctypes, fcntl, mmap, os, struct, sys
path = sys.argv[1]
INSERT, COLLAPSE = 0x4018D401, 0x4018D402
descriptor = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
os.write(descriptor, b"A" * 8192)
os.fsync(descriptor)
mapping = mmap.mmap(descriptor, 8192)
mapping[0:4096] = b"B" * 4096  # dirty, no msync
data = ctypes.create_string_buffer(b"I" * 100, 100)
fcntl.ioctl(descriptor, INSERT, struct.pack("QQQ", 0, 100, ctypes.addressof(data)))
got = os.pread(descriptor, 10000, 0)
assert got == b"I" * 100 + b"B" * 4096 + b"A" * 4096, (len(got), got[:8], got[4090:4110])
mapping.close()
os.ftruncate(descriptor, 0)
os.pwrite(descriptor, b"A" * 8192, 0)
os.fsync(descriptor)
mapping = mmap.mmap(descriptor, 8192)
mapping[4096:8192] = b"C" * 4096
fcntl.ioctl(descriptor, COLLAPSE, struct.pack("QQQ", 0, 100, 0))
got = os.pread(descriptor, 10000, 0)
assert got == b"A" * 3996 + b"C" * 4096, (len(got), got[3990:4000])
mapping.close()
os.close(descriptor)
EOF
}

test_c_example() {
    cc -Wall -Wextra -Werror -I "$REPO/include" -o "$WORK/insert_collapse" \
        "$REPO/examples/insert_collapse.c"
    "$WORK/insert_collapse" "$MNT/c-example.txt"
}

# ---------------------------------------------------------------- remount and lifecycle

# Checksums of every file, except that files over 64 MiB (the sparse ones) are represented by
# their size and the checksum of their last MiB: reading 5 GiB of hole twice would dominate the
# suite's time.
file_checksums() {
    (cd "$MNT" && find . -type f -size -64M -print0 | LC_ALL=C sort -z | xargs -0 -r md5sum)
    (cd "$MNT" && find . -type f -size +64M -print0 | LC_ALL=C sort -z |
        while IFS= read -r -d '' file; do
            echo "$file $(stat -c %s "$file") $(tail -c 1048576 "$file" | md5sum)"
        done)
}

record_state() {
    file_checksums >"$WORK/sums"
    tree_listing "$MNT" >"$WORK/listing"
}

check_state() {
    diff <(file_checksums) "$WORK/sums"
    diff <(tree_listing "$MNT") "$WORK/listing"
}
export -f file_checksums record_state check_state

# The process serving $MNT: the one whose command line is `tandem mount $IMG $MNT ...`.
mount_process_id() {
    local directory arguments
    for directory in /proc/[0-9]*; do
        arguments=$(tr '\0' ' ' <"$directory/cmdline" 2>/dev/null) || continue
        case "$arguments" in
        *" mount $IMG $MNT "*) echo "${directory#/proc/}"; return 0 ;;
        esac
    done
    return 1
}
export -f mount_process_id

test_unmount_fsck_remount() {
    record_state
    unmount_volume
    "$TANDEM" fsck "$IMG"
    mount_volume
    check_state
    same_tree "$REPO/crates" "$MNT/crates"
}

test_unmount_refuses_while_busy() {
    exec 9<"$MNT/crates/tandem-fuse/Cargo.toml"
    if "$TANDEM" umount "$MNT" 2>"$WORK/busy.err"; then
        echo "umount succeeded while a file was open"
        exit 1
    fi
    cat "$WORK/busy.err"
    exec 9<&-
    is_mounted
}

test_unmount_refuses_other_file_systems() {
    expect_failure "not" "$TANDEM" umount /proc
    expect_failure "not" "$TANDEM" umount "$LOCAL"
}

test_sigterm_unmounts_cleanly() {
    record_state
    pid=$(mount_process_id)
    test -n "$pid"
    kill -TERM "$pid"
    for _ in $(seq 1 600); do
        if ! is_mounted && ! kill -0 "$pid" 2>/dev/null; then break; fi
        sleep 0.1
    done
    if is_mounted; then echo "still mounted after SIGTERM"; exit 1; fi
    if kill -0 "$pid" 2>/dev/null; then echo "process $pid still running"; exit 1; fi
    check_mount_log
    "$TANDEM" fsck "$IMG"
    mount_volume
    check_state
}

test_kill_9_recovers() {
    record_state
    dd if=/dev/urandom of="$MNT/interrupted" bs=1M count=64 status=none &
    writer=$!
    sleep 0.3
    pid=$(mount_process_id)
    test -n "$pid"
    kill -KILL "$pid"
    wait "$writer" || true
    # A mount whose server died answers ENOTCONN; tandem umount still removes it.
    "$TANDEM" umount "$MNT"
    if is_mounted; then echo "the dead mount is still there"; exit 1; fi
    "$TANDEM" fsck "$IMG"
    log="$LOGS/mount-after-kill.log"
    echo "$log" >"$WORK/current-mount-log"
    "$TANDEM" mount "$IMG" "$MNT" -d --log-file "$log" -o allow_other,default_permissions
    is_mounted
    rm -f "$MNT/interrupted"
    check_state
}

test_read_only_mount() {
    unmount_volume
    mount_volume ro,allow_other,default_permissions
    cmp "$REPO/crates/tandem-fuse/Cargo.toml" "$MNT/crates/tandem-fuse/Cargo.toml"
    expect_failure "Read-only" touch "$MNT/new-file"
    expect_failure "Read-only" mkdir "$MNT/new-directory"
    expect_failure "Read-only" sh -c "echo x >>'$MNT/crates/tandem-fuse/Cargo.toml'"
    unmount_volume
    "$TANDEM" fsck "$IMG"
    mount_volume
    check_state
}

test_rm_rf_large_tree() {
    rm -rf "$MNT/include"
    test ! -e "$MNT/include"
    # Names are free again at once.
    mkdir "$MNT/include"
    rmdir "$MNT/include"
}

test_no_space() {
    local image="$WORK/small.img" mountpoint="$WORK/small-mnt" log="$LOGS/small-mount.log"
    mkdir -p "$mountpoint"
    "$TANDEM" mkfs "$image" --size 64M
    "$TANDEM" mount "$image" "$mountpoint" -d --log-file "$log" -o allow_other,default_permissions
    echo survivor >"$mountpoint/survivor"
    if dd if=/dev/zero of="$mountpoint/fill" bs=1M count=200 2>"$WORK/dd.err"; then
        echo "200 MiB fitted into a 64 MiB volume"
        exit 1
    fi
    grep "No space left" "$WORK/dd.err"
    test "$(cat "$mountpoint/survivor")" = survivor
    rm "$mountpoint/fill"
    # The space is usable again.
    dd if=/dev/zero of="$mountpoint/again" bs=1M count=16 status=none
    "$TANDEM" umount "$mountpoint"
    if grep -q panicked "$log"; then grep -v '^  ' "$log"; exit 1; fi
    "$TANDEM" fsck "$image"
}

# A normal user formats an image of their own, mounts it through the set-user-ID fusermount3,
# uses it, and unmounts it: no root anywhere in the path. Distributions make /dev/fuse
# world-writable (0666); minimal images may leave it 0600, so the test opens it up for its run and
# puts the mode back afterwards.
test_mount_as_normal_user() {
    # Not local: the EXIT trap runs after the function has returned.
    user_home="$WORK/user-home"
    command -v fusermount3 >/dev/null || { echo "fusermount3 is needed"; exit 1; }
    fuse_mode=$(stat -c %a /dev/fuse)
    trap 'chmod "$fuse_mode" /dev/fuse; as_nobody "$TANDEM" umount "$user_home/mnt" 2>/dev/null || true' EXIT
    local home=$user_home
    chmod 666 /dev/fuse
    mkdir -p "$home/mnt"
    chown -R nobody:nogroup "$home"
    # mkfs gives the root directory to whoever runs it.
    as_nobody "$TANDEM" mkfs "$home/volume.img" --size 64M
    as_nobody "$TANDEM" mount "$home/volume.img" "$home/mnt" -d --log-file "$home/mount.log"
    awk -v point="$home/mnt" '$5 == point && / - fuse\.tandemfs / { found = 1 } END { exit !found }' \
        /proc/self/mountinfo
    as_nobody mkdir "$home/mnt/directory"
    as_nobody sh -c "echo 'written by nobody' >'$home/mnt/directory/file'"
    test "$(as_nobody stat -c %U:%G "$home/mnt" "$home/mnt/directory/file" | sort -u)" = nobody:nogroup
    # The image is locked while mounted: a second mount is refused and says why.
    mkdir -p "$home/second"
    chown nobody:nogroup "$home/second"
    expect_failure "in use" as_nobody "$TANDEM" mount "$home/volume.img" "$home/second"
    # Without allow_other, nobody else (root included) may look in.
    expect_failure "Permission denied" ls "$home/mnt"
    as_nobody "$TANDEM" umount "$home/mnt"
    if grep -q panicked "$home/mount.log"; then grep -v '^  ' "$home/mount.log"; exit 1; fi
    as_nobody "$TANDEM" fsck "$home/volume.img"
    as_nobody "$TANDEM" mount "$home/volume.img" "$home/mnt" -d --log-file "$home/mount.log"
    test "$(as_nobody cat "$home/mnt/directory/file")" = "written by nobody"
    as_nobody "$TANDEM" umount "$home/mnt"
}

# ---------------------------------------------------------------- multi-mount protection, read-only

# A volume of its own for these tests, so the main volume is not disturbed. Prints nothing.
mmp_volume() {
    MMP_IMG="$WORK/mmp.img"
    MMP_A="$WORK/mmp-a"
    MMP_B="$WORK/mmp-b"
    mkdir -p "$MMP_A" "$MMP_B"
    rm -f "$MMP_IMG"
    "$TANDEM" mkfs "$MMP_IMG" --size 64M >/dev/null
}

# The pid a background mount printed ("... in the background (process N, ...").
printed_pid() {
    sed -n 's/.*in the background (process \([0-9]*\),.*/\1/p' <<<"$1"
}

# Removes the loop devices and mounts a test left behind.
mmp_cleanup() {
    local point
    for point in "$WORK/mmp-a" "$WORK/mmp-b"; do
        "$TANDEM" umount "$point" >/dev/null 2>&1 || umount -l "$point" 2>/dev/null || true
    done
    losetup -j "$WORK/mmp.img" -O NAME -n 2>/dev/null | while read -r device; do losetup -d "$device"; done
    chattr -i "$WORK/mmp.img" 2>/dev/null || true
}
export -f mmp_volume printed_pid mmp_cleanup

# Finding 1: the flock covers one path; a loop device is another path to the same bytes. The
# second mount, through the loop device, must be refused with the first one's host and pid.
test_mmp_loop_device_refused() {
    trap mmp_cleanup EXIT
    mmp_volume
    output=$("$TANDEM" mount "$MMP_IMG" "$MMP_A" -d --log-file "$LOGS/mmp-a.log" -o mmp_interval_ms=200)
    pid=$(printed_pid "$output")
    test -n "$pid"
    echo "through the image" >"$MMP_A/first"
    loop=$(losetup -f --show "$MMP_IMG")
    expect_failure "volume is in use by pid $pid on host $(uname -n)" \
        "$TANDEM" mount "$loop" "$MMP_B" -d --log-file "$LOGS/mmp-b.log"
    if awk -v point="$MMP_B" '$5 == point { found = 1 } END { exit !found }' /proc/self/mountinfo; then
        echo "the second mount went through"; exit 1
    fi
    # A hard link is a third path: the lock on the shared inode refuses it at once.
    ln "$MMP_IMG" "$WORK/mmp-link.img"
    expect_failure "in use" "$TANDEM" mount "$WORK/mmp-link.img" "$MMP_B" -d --log-file "$LOGS/mmp-b.log"
    rm "$WORK/mmp-link.img"
    # stat through the loop device says who holds the volume.
    "$TANDEM" stat "$loop" | grep -i "in use by pid $pid"
    "$TANDEM" umount "$MMP_A"
    # Unmounted cleanly: the loop device mounts at once and sees what the first mount wrote.
    "$TANDEM" mount "$loop" "$MMP_B" -d --log-file "$LOGS/mmp-b.log"
    test "$(cat "$MMP_B/first")" = "through the image"
    "$TANDEM" umount "$MMP_B"
    losetup -d "$loop"
    "$TANDEM" fsck "$MMP_IMG"
}

# A mount killed with SIGKILL leaves its MMP block stamped; the next mount (through another
# path) waits long enough to see that nobody refreshes it, then takes the volume over.
test_mmp_killed_mounter_taken_over() {
    trap mmp_cleanup EXIT
    mmp_volume
    output=$("$TANDEM" mount "$MMP_IMG" "$MMP_A" -d --log-file "$LOGS/mmp-a.log" -o mmp_interval_ms=200)
    pid=$(printed_pid "$output")
    echo "acknowledged" >"$MMP_A/kept"
    sync "$MMP_A/kept"
    kill -KILL "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    "$TANDEM" umount "$MMP_A"
    loop=$(losetup -f --show "$MMP_IMG")
    start=$(date +%s%N)
    output=$("$TANDEM" mount "$loop" "$MMP_B" -d --log-file "$LOGS/mmp-b.log")
    echo "$output"
    elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    grep -q "took the volume over from pid $pid on host $(uname -n)" <<<"$output"
    # It waited for at least twice the dead mount's interval.
    test "$elapsed_ms" -ge 400
    test "$(cat "$MMP_B/kept")" = "acknowledged"
    "$TANDEM" umount "$MMP_B"
    losetup -d "$loop"
    "$TANDEM" fsck "$MMP_IMG"
}

# Encrypted volumes through the mount: a tree copied in reads back the same after a remount,
# its names and contents are nowhere in the image, and without the key (or with another) the
# mount is refused in one line and the image is left as it was.
test_encrypted_round_trip() {
    local image="$WORK/encrypted.img" point="$WORK/encrypted" key="$WORK/encrypted.key"
    mkdir -p "$point"
    head -c 64 /dev/urandom >"$key"
    rm -f "$image"
    "$TANDEM" mkfs --encrypt --key-file "$key" --kdf-time-ms 50 --size 128M "$image" | grep "created encrypted"
    "$TANDEM" mount "$image" "$point" -d --key-file "$key" --log-file "$LOGS/encrypted-mount.log"
    cp -a "$INCLUDE_TREE" "$point/include"
    mkdir "$point/aardvark-secret-directory"
    printf 'zebra-plaintext-marker-%s\n' $(seq 1 200) >"$point/aardvark-secret-directory/zebra-notes.txt"
    "$TANDEM" umount "$point"
    if grep -c -a -e "zebra-plaintext-marker" -e "aardvark-secret-directory" "$image"; then
        echo "plaintext found in the encrypted image"; exit 1
    fi
    "$TANDEM" fsck --key-file "$key" "$image"
    before=$(sha256sum <"$image")
    expect_failure "is encrypted: give --key-file FILE or its passphrase" \
        "$TANDEM" mount "$image" "$point" --log-file "$LOGS/encrypted-mount.log" </dev/null
    head -c 64 /dev/urandom >"$key.wrong"
    expect_failure "wrong passphrase or key file" \
        "$TANDEM" mount "$image" "$point" -d --key-file "$key.wrong" --log-file "$LOGS/encrypted-mount.log"
    test "$(sha256sum <"$image")" = "$before"
    # mount(8)'s helper takes the key file as an option too.
    "$TANDEM" mount "$image" "$point" -d -o key_file="$key" --log-file "$LOGS/encrypted-mount.log"
    diff -r "$INCLUDE_TREE" "$point/include"
    test "$(wc -l <"$point/aardvark-secret-directory/zebra-notes.txt")" = 200
    "$TANDEM" umount "$point"
    "$TANDEM" fsck --key-file "$key" "$image"
    rm -f "$image"
}

# Finding 6: -o ro and read-only media write nothing, even when the log needs replay.
test_read_only_writes_nothing() {
    trap mmp_cleanup EXIT
    mmp_volume
    "$TANDEM" mount "$MMP_IMG" "$MMP_A" -d --log-file "$LOGS/mmp-a.log"
    echo "checkpointed" >"$MMP_A/old"
    "$TANDEM" umount "$MMP_A"
    # A short MMP interval: the mounts below wait twice that to see the killed mount is gone.
    "$TANDEM" mount "$MMP_IMG" "$MMP_A" -d --log-file "$LOGS/mmp-a.log" -o mmp_interval_ms=200 >/dev/null
    pid=$(mount_pid_of "$MMP_A")
    echo "only in the log" >"$MMP_A/pending"
    sync "$MMP_A/pending"
    kill -KILL "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    "$TANDEM" umount "$MMP_A"
    before=$(sha256sum <"$MMP_IMG")

    # -o ro on a writable image.
    output=$("$TANDEM" mount "$MMP_IMG" "$MMP_A" -d --log-file "$LOGS/mmp-a.log" -o ro)
    echo "$output"
    grep -q "in memory only" <<<"$output"
    test "$(cat "$MMP_A/pending")" = "only in the log"
    test "$(cat "$MMP_A/old")" = "checkpointed"
    expect_failure "Read-only" touch "$MMP_A/new"
    "$TANDEM" umount "$MMP_A"
    test "$(sha256sum <"$MMP_IMG")" = "$before"

    # An immutable image mounts read-only by itself.
    chattr +i "$MMP_IMG"
    output=$("$TANDEM" mount "$MMP_IMG" "$MMP_A" -d --log-file "$LOGS/mmp-a.log")
    echo "$output"
    grep -q "mounting read-only" <<<"$output"
    test "$(cat "$MMP_A/pending")" = "only in the log"
    expect_failure "Read-only" touch "$MMP_A/new"
    "$TANDEM" umount "$MMP_A"
    chattr -i "$MMP_IMG"
    test "$(sha256sum <"$MMP_IMG")" = "$before"

    # So does a read-only loop device.
    loop=$(losetup -r -f --show "$MMP_IMG")
    output=$("$TANDEM" mount "$loop" "$MMP_A" -d --log-file "$LOGS/mmp-a.log")
    echo "$output"
    grep -q "mounting read-only" <<<"$output"
    test "$(cat "$MMP_A/pending")" = "only in the log"
    "$TANDEM" umount "$MMP_A"
    losetup -d "$loop"
    test "$(sha256sum <"$MMP_IMG")" = "$before"

    # The replay is still due, and a read-write mount does it.
    output=$("$TANDEM" mount "$MMP_IMG" "$MMP_A" -d --log-file "$LOGS/mmp-a.log")
    grep -q "replayed" <<<"$output"
    test "$(cat "$MMP_A/pending")" = "only in the log"
    "$TANDEM" umount "$MMP_A"
    "$TANDEM" fsck "$MMP_IMG"
}

# The pid serving the mount at $1.
mount_pid_of() {
    local directory arguments
    for directory in /proc/[0-9]*; do
        arguments=$(tr '\0' ' ' 2>/dev/null <"$directory/cmdline") || continue
        case "$arguments" in
        *" mount "*" $1 "*) echo "${directory#/proc/}"; return 0 ;;
        esac
    done
    return 1
}
export -f mount_pid_of

# dev and suid for root; refused with a clear message for anyone else.
test_dev_suid_for_root() {
    trap mmp_cleanup EXIT
    mmp_volume
    "$TANDEM" mount "$MMP_IMG" "$MMP_A" -d --log-file "$LOGS/mmp-a.log" -o dev,suid
    options=$(awk -v point="$MMP_A" '$5 == point { print $6 }' /proc/self/mountinfo)
    echo "mount options: $options"
    if grep -qE 'nosuid|nodev' <<<"$options"; then echo "still nosuid/nodev"; exit 1; fi
    mknod "$MMP_A/null" c 1 3
    echo discarded >"$MMP_A/null"
    "$TANDEM" umount "$MMP_A"
    "$TANDEM" mount "$MMP_IMG" "$MMP_A" -d --log-file "$LOGS/mmp-a.log"
    options=$(awk -v point="$MMP_A" '$5 == point { print $6 }' /proc/self/mountinfo)
    grep -q nodev <<<"$options"
    expect_failure "Permission denied" sh -c "echo x >'$MMP_A/null'"
    "$TANDEM" umount "$MMP_A"
    expect_failure "need root" as_nobody "$TANDEM" mount "$MMP_IMG" "$MMP_B" -o dev
}

# mount(8) finds the helper for -t fuse.tandemfs and for fstab lines, and remounts through it.
test_mount_helper() {
    # An installed helper is set aside for the test and put back afterwards.
    helper_backup="$WORK/mount.fuse.tandemfs.installed"
    trap 'mmp_cleanup; rm -f /sbin/mount.fuse.tandemfs; test ! -e "$helper_backup" && test ! -L "$helper_backup" || mv "$helper_backup" /sbin/mount.fuse.tandemfs' EXIT
    if [ -e /sbin/mount.fuse.tandemfs ] || [ -L /sbin/mount.fuse.tandemfs ]; then
        mv /sbin/mount.fuse.tandemfs "$helper_backup"
    fi
    ln -s "$TANDEM" /sbin/mount.fuse.tandemfs
    mmp_volume
    mount -t fuse.tandemfs "$MMP_IMG" "$MMP_A" -o noauto,_netdev,nofail,x-test.option=1
    awk -v point="$MMP_A" '$5 == point && / - fuse\.tandemfs / { found = 1 } END { exit !found }' \
        /proc/self/mountinfo
    echo "through mount(8)" >"$MMP_A/file"
    mount -o remount,ro "$MMP_A"
    expect_failure "Read-only" touch "$MMP_A/refused"
    # Remounted read-only: everything is on the image, checkpointed and clean.
    "$TANDEM" stat "$MMP_IMG" | grep -E "state: +clean"
    mount -o remount,rw "$MMP_A"
    echo "after remount" >"$MMP_A/second"
    expect_failure "unknown mount option" mount -t fuse.tandemfs -o nosuchoption "$MMP_IMG" "$MMP_B"
    "$TANDEM" umount "$MMP_A"
    # An fstab line.
    echo "$MMP_IMG $MMP_A fuse.tandemfs defaults,noauto 0 0" >"$WORK/fstab"
    mount -T "$WORK/fstab" "$MMP_A"
    test "$(cat "$MMP_A/file" "$MMP_A/second")" = "through mount(8)
after remount"
    "$TANDEM" umount "$MMP_A"
    "$TANDEM" fsck "$MMP_IMG"
}

# ---------------------------------------------------------------- torture: what outside suites run

# fsx-style random operations on two files at once (writes, reads, truncation, fallocate modes,
# mmap, copy_file_range, O_APPEND, insert and collapse ioctls), every read checked against a
# shadow; the shadows are compared again after the unmount, fsck and remount that follow.
test_fsx() {
    python3 "$TESTS/fsx.py" run "$MNT/fsx-a.bin" 1 2500 "$WORK/fsx-a.shadow" &
    first=$!
    python3 "$TESTS/fsx.py" run "$MNT/fsx-b.bin" 2 2500 "$WORK/fsx-b.shadow" 33554432 &
    second=$!
    wait $first
    wait $second
}

test_fsx_after_remount() {
    python3 "$TESTS/fsx.py" compare "$MNT/fsx-a.bin" "$WORK/fsx-a.shadow"
    python3 "$TESTS/fsx.py" compare "$MNT/fsx-b.bin" "$WORK/fsx-b.shadow"
}

# pjdfstest-style POSIX checks (times, link counts, rename corners, name lengths, set-ID bits,
# sticky directories and permissions as nobody, readdir while changing, statfs, xattr names).
test_posix_checks() {
    mkdir "$MNT/posix"
    python3 "$TESTS/posix_check.py" "$MNT/posix"
}

# Four processes creating, writing, linking, renaming (also RENAME_EXCHANGE), removing,
# chmod-ing and setting xattrs in one small shared tree; the fsck that follows checks the result.
test_fsstress() {
    python3 "$TESTS/fsstress.py" "$MNT/fsstress" 7 4 5000
}

# fio writes with several engines, unaligned block sizes and concurrent jobs, verifying every
# block with crc32c.
test_fio_verify() {
    mkdir "$MNT/fio"
    fio --output-format=terse --directory="$MNT/fio" --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --size=8m --numjobs=2 --verify_state_save=0 \
        --name=psync-random --ioengine=psync --rw=randwrite --bsrange=512-300k --bs_unaligned=1 \
        --name=psync-sequential --ioengine=psync --rw=write --bs=129k \
        --name=libaio-random --ioengine=libaio --iodepth=8 --rw=randwrite --bs=4k,12k \
        --name=mmap-random --ioengine=mmap --rw=randwrite --bsrange=4k-64k \
        | awk -F';' '{ print $3, "error=" $5; if ($5 != 0) failed = 1 } END { exit failed }'
    rm -rf "$MNT/fio"
}

# A few seconds of each stress-ng file-system stressor, with verification where it has one.
test_stress_ng() {
    mkdir "$MNT/stress"
    local stressor status
    for stressor in dir dentry rename link xattr fallocate hdd mmap seek lockf fiemap sync-file chmod utime \
        copy-file; do
        status=0
        # Exit status 0: passed; 2: a stressor failed (a verification among them); 3: it could
        # not run. Run it from inside the mount: some stressors use the working directory.
        (cd "$MNT/stress" && stress-ng --"$stressor" 2 --timeout 2 --verify --temp-path "$MNT/stress" \
            --metrics-brief) >"$WORK/stress-ng.out" 2>&1 || status=$?
        grep -E "\] $stressor |fail|error" "$WORK/stress-ng.out" || true
        if [ "$status" -ne 0 ]; then
            cat "$WORK/stress-ng.out"
            echo "stress-ng --$stressor exited with $status"
            return 1
        fi
    done
    rm -rf "$MNT/stress"
}

# A small volume filled until ENOSPC with files, directories and symlinks; after unmount,
# fsck and remount every acknowledged byte is there, and space freed is usable again.
test_fill_volume() {
    local image="$WORK/fill.img" mountpoint="$WORK/fill-mnt" log="$LOGS/fill-mount.log"
    mkdir -p "$mountpoint"
    "$TANDEM" mkfs "$image" --size 64M
    "$TANDEM" mount "$image" "$mountpoint" -d --log-file "$log"
    python3 "$TESTS/fill_check.py" fill "$mountpoint" "$WORK/fill.json" 5
    "$TANDEM" umount "$mountpoint"
    "$TANDEM" fsck "$image"
    "$TANDEM" mount "$image" "$mountpoint" -d --log-file "$log"
    python3 "$TESTS/fill_check.py" verify "$mountpoint" "$WORK/fill.json"
    "$TANDEM" umount "$mountpoint"
    if grep -q panicked "$log"; then grep -v '^  ' "$log"; exit 1; fi
    "$TANDEM" fsck "$image"
    rm -f "$image"
}

test_final_unmount_and_fsck() {
    unmount_volume
    "$TANDEM" fsck "$IMG"
}

fsck_between_groups() {
    unmount_volume
    "$TANDEM" fsck "$IMG"
    mount_volume
}

export -f $(declare -F | awk '{print $3}' | grep -e '^test_' -e '^fsck_between_groups$')

# ---------------------------------------------------------------- the run

run_test mkfs-and-mount test_mkfs_and_mount 60
if [ -z "${ONLY:-}" ] && ! is_mounted; then
    echo "the volume did not mount; stopping"
    echo "$passed passed, $((failed + 1)) failed"
    exit 1
fi
run_test cp-a-source-tree test_cp_source_tree
run_test cp-a-usr-include test_cp_include_tree 180
run_test tar-roundtrip test_tar_roundtrip
run_test git-init-add-commit-log test_git_repository
run_test rsync test_rsync
run_test find test_find
run_test ln-and-ln-s test_links
run_test chmod-chown-setgid-times test_chmod_chown
run_test fsck-after-programs fsck_between_groups

run_test truncate test_truncate
run_test dd test_dd
run_test dd-sparse-over-4GiB test_large_sparse_file
run_test fallocate-modes test_fallocate
run_test fallocated-space-on-full-volume test_fallocated_space_on_full_volume
run_test damaged-data-is-eio test_damaged_data_is_eio
run_test st-blocks-right-after-fallocate test_blocks_after_fallocate
run_test relatime-read-moves-atime test_relatime
run_test seek-data-hole-outside-file test_seek_outside_the_file
if ! command -v cc >/dev/null; then
    skip_test file-handles-after-drop-caches "no C compiler"
elif [ ! -w /proc/sys/vm/drop_caches ]; then
    skip_test file-handles-after-drop-caches "/proc/sys/vm/drop_caches is not writable here"
else
    run_test file-handles-after-drop-caches test_file_handles
fi
run_test random-io-vs-shadow test_random_io 180
run_test parallel-writers-shared-dirs test_parallel_writers
run_test xattr-set-get-list-remove test_xattrs
run_test mmap-write-read test_mmap
run_test rename-noreplace-exchange test_rename
run_test open-excl-append-trunc-unlinked test_open_semantics
run_test fifo-device-socket-nodes test_special_files
run_test fsx-random-operations test_fsx 180
run_test posix-checks test_posix_checks
run_test fsstress-shared-tree test_fsstress
if command -v fio >/dev/null; then
    run_test fio-verify test_fio_verify
else
    skip_test fio-verify "fio is not installed (apt-get install fio)"
fi
if command -v stress-ng >/dev/null; then
    run_test stress-ng-filesystem test_stress_ng 180
else
    skip_test stress-ng-filesystem "stress-ng is not installed (apt-get install stress-ng)"
fi
run_test fsck-after-contents fsck_between_groups
run_test fsx-files-after-remount test_fsx_after_remount

run_test permissions-as-nobody test_permissions_unprivileged
run_test insert-collapse-cli-vs-model test_insert_collapse_commands
run_test insert-collapse-large-data test_insert_large_data
run_test insert-collapse-ioctl-semantics test_insert_ioctl_semantics
run_test insert-collapse-after-dirty-mmap test_insert_after_dirty_mmap
if command -v cc >/dev/null; then
    run_test insert-collapse-c-example test_c_example
else
    skip_test insert-collapse-c-example "no C compiler"
fi
run_test umount-refuses-while-busy test_unmount_refuses_while_busy
run_test umount-refuses-other-file-systems test_unmount_refuses_other_file_systems
run_test umount-fsck-remount-compare test_unmount_fsck_remount
run_test sigterm-unmounts-cleanly test_sigterm_unmounts_cleanly
run_test kill-9-then-umount-fsck-recover test_kill_9_recovers
run_test read-only-mount test_read_only_mount
run_test rm-rf-usr-include-copy test_rm_rf_large_tree
run_test enospc-small-volume test_no_space
run_test fill-volume-nothing-lost test_fill_volume 180
run_test mount-as-normal-user test_mount_as_normal_user
# The MMP and read-only tests go through loop devices; a machine without them skips those.
if losetup -f >/dev/null 2>&1; then
    run_test mmp-loop-device-refused test_mmp_loop_device_refused
    run_test read-only-writes-nothing test_read_only_writes_nothing
else
    skip_test mmp-loop-device-refused "no free loop device (losetup -f)"
    skip_test read-only-writes-nothing "no free loop device (losetup -f)"
fi
run_test mmp-killed-mounter-taken-over test_mmp_killed_mounter_taken_over
uring_state=$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null || echo absent)
if [ "$uring_state" = Y ]; then
    run_test uring-create-stat-unlink test_uring_create_stat_unlink
elif [ "$uring_state" = absent ]; then
    skip_test uring-create-stat-unlink "this kernel has no FUSE over io_uring (Linux 6.14 or later)"
else
    skip_test uring-create-stat-unlink "/sys/module/fuse/parameters/enable_uring is $uring_state"
fi
run_test encrypted-round-trip test_encrypted_round_trip
run_test dev-suid-for-root test_dev_suid_for_root
run_test mount-helper-and-remount test_mount_helper
run_test final-umount-and-fsck test_final_unmount_and_fsck

echo "suite took $(( $(date +%s) - suite_start ))s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
