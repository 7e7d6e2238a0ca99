//! POSIX details that third-party file-system suites check through a mount, pinned down at the
//! engine, which owns them: each test here started as a bug found by the mount torture tests
//! (tests/mount/posix_check.py, fill_check.py).

mod common;

use common::*;
use tandemfs::fs::*;
use tandemfs::{Error, FileSystem};

fn mounted(size_bytes: u64) -> FileSystem {
    let (_memory, device) = memory_volume(size_bytes, false);
    FileSystem::mount(device, &MountOptions::default()).unwrap().0
}

/// truncate(2), ftruncate(2) and open(O_TRUNC) to the size a file already has still update
/// mtime and ctime, as on ext4 (xfstests generic/313). The FUSE kernel sends only the size.
#[test]
fn truncate_to_the_same_size_updates_mtime() {
    let fs = mounted(64 << 20);
    let file = fs.create(ROOT_INODE, b"file", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, b"0123456789").unwrap();
    for size in [10, 0, 0] {
        let old = SetAttributes {
            access_time: Some(TimeToSet::Nanoseconds(5)),
            modify_time: Some(TimeToSet::Nanoseconds(5)),
            ..SetAttributes::default()
        };
        let before = fs.set_attributes(file, &old).unwrap();
        assert_eq!(before.modify_time_ns, 5);
        let after = fs.set_attributes(file, &SetAttributes { size_bytes: Some(size), ..SetAttributes::default() });
        let after = after.unwrap();
        assert_eq!(after.size_bytes, size);
        assert_ne!(after.modify_time_ns, 5, "truncate to {size} left mtime alone");
        assert!(after.change_time_ns >= before.change_time_ns);
        assert_eq!(after.access_time_ns, 5, "truncate changed atime");
    }
    fs.unmount().unwrap();
}

/// A write larger than one log record that runs out of space part-way must report the bytes
/// it did write (a short write, as write(2) does), not an error after changing the file:
/// otherwise the caller believes nothing was written while the file grew.
#[test]
fn write_that_fills_the_volume_is_short_not_failed() {
    let fs = mounted(32 << 20);
    let file = fs.create(ROOT_INODE, b"fill", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    // Larger than the biggest log record (a sixteenth of the data area, at most 1 MiB), so
    // every call is several records.
    let chunk = vec![0x5Au8; 3 << 20];
    let mut acknowledged = 0u64;
    let mut filled = false;
    // Bounded: a 32 MiB volume fills within a dozen 3 MiB writes.
    for _ in 0..32 {
        match fs.write(file, acknowledged, &chunk) {
            Ok(written) => {
                assert!(written > 0 && written <= chunk.len());
                acknowledged += written as u64;
                let size = fs.get_attributes(file).unwrap().size_bytes;
                assert_eq!(size, acknowledged, "size after a write that reported {written} bytes");
            }
            Err(Error::NoSpace) => {
                let size = fs.get_attributes(file).unwrap().size_bytes;
                assert_eq!(size, acknowledged, "a write that failed with ENOSPC changed the size");
                filled = true;
                break;
            }
            Err(error) => panic!("unexpected error {error}"),
        }
    }
    assert!(filled, "the volume never filled");
    let mut buffer = vec![0u8; acknowledged as usize];
    assert_eq!(fs.read(file, 0, &mut buffer).unwrap(), acknowledged as usize);
    assert!(buffer.iter().all(|byte| *byte == 0x5A));
    fs.unmount().unwrap();
}

/// An insert of data is all or error: when the volume fills part-way through writing the
/// inserted bytes, it must not report success with zeros in part of the range.
#[test]
fn insert_that_fills_the_volume_fails_instead_of_leaving_zeros() {
    let fs = mounted(32 << 20);
    let fill = fs.create(ROOT_INODE, b"fill", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let chunk = vec![0x5Au8; 1 << 20];
    let mut size = 0u64;
    // Bounded: a 32 MiB volume fills within 32 writes of 1 MiB.
    for _ in 0..64 {
        match fs.write(fill, size, &chunk) {
            Ok(written) => size += written as u64,
            Err(Error::NoSpace) => break,
            Err(error) => panic!("unexpected error {error}"),
        }
    }
    // Give back about 1 MiB, then insert three times that much.
    let shrink = SetAttributes { size_bytes: Some(size - (1 << 20)), ..SetAttributes::default() };
    fs.set_attributes(fill, &shrink).unwrap();
    let file = fs.create(ROOT_INODE, b"edited", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, b"head-tail").unwrap();
    let data = vec![0xC3u8; 3 << 20];
    match fs.insert(file, 4, &data) {
        Ok(()) => {
            let mut buffer = vec![0u8; data.len() + 9];
            assert_eq!(fs.read(file, 0, &mut buffer).unwrap(), buffer.len());
            assert_eq!(&buffer[..4], b"head");
            assert!(buffer[4..4 + data.len()].iter().all(|byte| *byte == 0xC3), "insert reported success with zeros");
        }
        Err(Error::NoSpace) => {
            // All or nothing: the file is exactly as it was.
            assert_eq!(fs.get_attributes(file).unwrap().size_bytes, 9);
            let mut buffer = [0u8; 9];
            assert_eq!(fs.read(file, 0, &mut buffer).unwrap(), 9);
            assert_eq!(&buffer, b"head-tail");
        }
        Err(error) => panic!("unexpected error {error}"),
    }
    fs.unmount().unwrap();
}

/// Extended attributes live in the namespaces Linux file systems store (user, trusted,
/// security); ext4 answers another prefix, or none, with EOPNOTSUPP and an empty name after
/// the prefix with EINVAL. The FUSE kernel passes every name through to the engine.
#[test]
fn xattr_names_outside_the_known_namespaces_are_refused() {
    let fs = mounted(64 << 20);
    let file = fs.create(ROOT_INODE, b"file", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    for name in [&b"bogus.name"[..], b"user", b"name", b"system.other", b"os2.name", b"USER.upper"] {
        let result = fs.set_xattr(file, name, b"v", XattrMode::CreateOrReplace);
        assert!(matches!(result, Err(Error::NotSupported)), "set {:?}: {result:?}", String::from_utf8_lossy(name));
        assert!(matches!(fs.get_xattr(file, name), Err(Error::NotSupported)));
        assert!(matches!(fs.remove_xattr(file, name), Err(Error::NotSupported)));
    }
    for name in [&b"user."[..], b"trusted.", b"security."] {
        let result = fs.set_xattr(file, name, b"v", XattrMode::CreateOrReplace);
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "set {:?}: {result:?}",
            String::from_utf8_lossy(name)
        );
    }
    for name in [&b"user.a"[..], b"trusted.b", b"security.c"] {
        fs.set_xattr(file, name, b"v", XattrMode::CreateOrReplace).unwrap();
        assert_eq!(fs.get_xattr(file, name).unwrap(), b"v");
    }
    assert_eq!(fs.list_xattr(file).unwrap().len(), 3);
    fs.unmount().unwrap();
}

/// A directory renamed into a parent that has the most links a directory may have is refused
/// with EMLINK, as mkdir there is; it used to push the parent past LINK_MAX.
#[test]
fn rename_of_a_directory_into_a_full_parent_is_too_many_links() {
    // Each directory takes a 4 KiB leaf: 65,000 of them need more than 256 MiB.
    let fs = mounted(512 << 20);
    let full = fs.make_directory(ROOT_INODE, b"full", 0o755, 0, 0).unwrap().inode;
    // Bounded: LINK_MAX - 2 subdirectories bring the parent to LINK_MAX links.
    for index in 0..LINK_MAX - 2 {
        fs.make_directory(full, format!("{index}").as_bytes(), 0o755, 0, 0).unwrap();
    }
    assert_eq!(fs.get_attributes(full).unwrap().link_count, LINK_MAX);
    assert!(matches!(fs.make_directory(full, b"one-more", 0o755, 0, 0), Err(Error::TooManyLinks)));
    let other = fs.make_directory(ROOT_INODE, b"other", 0o755, 0, 0).unwrap().inode;
    fs.make_directory(other, b"moving", 0o755, 0, 0).unwrap();
    let result = fs.rename(other, b"moving", full, b"moving", RenameMode::Replace);
    assert!(matches!(result, Err(Error::TooManyLinks)), "{result:?}");
    let result = fs.rename(other, b"moving", full, b"0", RenameMode::Exchange);
    assert!(result.is_ok(), "an exchange of two directories leaves the counts alone: {result:?}");
    assert_eq!(fs.get_attributes(full).unwrap().link_count, LINK_MAX);
    // A file may still move in, and a directory within the same parent may be renamed.
    fs.create(other, b"file", FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.rename(other, b"file", full, b"file", RenameMode::Replace).unwrap();
    fs.rename(full, b"1", full, b"renamed", RenameMode::Replace).unwrap();
    fs.unmount().unwrap();
}

/// Many directories made as fast as the front end takes them, in one parent, with no
/// checkpoint asked for. Each applied mkdir dirties a new leaf, and the back end writes the
/// images of dirty blocks into the log's reserve at every checkpoint; the tail cannot pass
/// those images while older records wait. A backlog of tens of thousands of mkdirs used to fill
/// the reserve, so the back end failed its checkpoint with NoSpace at about 26,800 directories
/// on this volume and shut the volume down, and a remount failed the same way in its replay.
/// The front end now bounds the backlog by the image blocks it may stand for.
#[test]
fn a_large_backlog_of_mkdirs_keeps_the_volume_usable_and_mountable() {
    let (_memory, device) = memory_volume(512 << 20, false);
    let fs = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap().0;
    let parent = fs.make_directory(ROOT_INODE, b"parent", 0o755, 0, 0).unwrap().inode;
    let count = 40_000u64;
    // Bounded: 40,000 directories, each a leaf: about 160 MiB of the 512.
    for index in 0..count {
        if let Err(error) = fs.make_directory(parent, format!("directory-{index}").as_bytes(), 0o755, 0, 0) {
            panic!("mkdir {index}: {error:?} ({:?}, statistics {:?})", fs.failure(), fs.statistics());
        }
    }
    assert_eq!(fs.get_attributes(parent).unwrap().link_count, 2 + count as u32);
    fs.unmount().unwrap();
    let report = tandemfs::fsck::check(device.clone()).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let fs = FileSystem::mount(device, &MountOptions::default()).unwrap().0;
    assert_eq!(fs.get_attributes(parent).unwrap().link_count, 2 + count as u32);
    assert!(fs.lookup(parent, format!("directory-{}", count - 1).as_bytes()).is_ok());
    fs.unmount().unwrap();
}

/// Writes `chunk_bytes` chunks to a new file until the volume refuses (NoSpace or a short
/// write); returns the file and the bytes it holds. Bounded by the volume's size.
fn fill_with_new_file(fs: &FileSystem, name: &[u8], volume_bytes: u64) -> (InodeNumber, u64) {
    let file = fs.create(ROOT_INODE, name, FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let chunk = vec![0xB0u8; 1 << 20];
    let mut written = 0u64;
    for _ in 0..=volume_bytes / chunk.len() as u64 {
        match fs.write(file, written, &chunk) {
            Ok(count) if count == chunk.len() => written += count as u64,
            Ok(count) => {
                written += count as u64;
                break;
            }
            Err(Error::NoSpace) => break,
            Err(error) => panic!("filling: {error}"),
        }
    }
    (file, written)
}

/// posix_fallocate promises that later writes into the range do not fail for lack of space:
/// on a full volume, writes into a fallocated range, and overwrites of data written earlier,
/// take no new blocks and must succeed, as on ext4 (the 128 MiB reproduction:
/// `fallocate -l 60% A`, fill with B until ENOSPC, `dd bs=1M count=4 conv=notrunc of=A`).
#[test]
fn fallocated_and_written_space_takes_writes_on_a_full_volume() {
    for background in [true, false] {
        let volume_bytes = 128u64 << 20;
        let (_memory, device) = memory_volume(volume_bytes, false);
        let options = MountOptions { background_backend: background, ..MountOptions::default() };
        let fs = FileSystem::mount(device, &options).unwrap().0;
        let reserved = fs.create(ROOT_INODE, b"A", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
        let reserved_bytes = volume_bytes * 6 / 10;
        fs.allocate(reserved, 0, reserved_bytes, false).unwrap();
        let (filler, filled_bytes) = fill_with_new_file(&fs, b"B", volume_bytes);
        assert!(filled_bytes > 0 && filled_bytes < volume_bytes - reserved_bytes);
        assert!(matches!(fs.write(filler, filled_bytes, &[1u8; 1 << 20]), Err(Error::NoSpace)), "not full");
        // Into the fallocated range: 4 MiB at the start, and a piece at an odd offset.
        let data: Vec<u8> = (0..4u32 << 20).map(|index| (index % 251) as u8).collect();
        assert_eq!(fs.write(reserved, 0, &data).unwrap(), data.len(), "background {background}");
        assert_eq!(fs.write(reserved, reserved_bytes - 100_001, &data[..100_000]).unwrap(), 100_000);
        // Over data written earlier, in both files.
        assert_eq!(fs.write(reserved, 1000, &data[..1 << 20]).unwrap(), 1 << 20);
        assert_eq!(fs.write(filler, 4096 * 3 + 7, &data[..2 << 20]).unwrap(), 2 << 20);
        fs.sync().unwrap();
        let mut buffer = vec![0u8; 1 << 20];
        fs.read(reserved, 1000, &mut buffer).unwrap();
        assert!(buffer == data[..1 << 20]);
        fs.read(filler, 4096 * 3 + 7, &mut buffer).unwrap();
        assert!(buffer == data[..1 << 20]);
        fs.read(reserved, (4 << 20) - 10, &mut buffer[..20]).unwrap();
        assert_eq!(&buffer[..10], &data[(4 << 20) - 10..]);
        assert_eq!(&buffer[10..20], &[0u8; 10]);
        // A truncate (an extent-tree change, no new data) works on the full volume too.
        let shrink = SetAttributes { size_bytes: Some(filled_bytes - 12_345), ..SetAttributes::default() };
        fs.set_attributes(filler, &shrink).unwrap();
        fs.unmount().unwrap();
    }
}

/// `st_blocks` counts blocks a file owns as soon as the operation returns, before the back
/// end has applied it, and the count agrees with the volume's afterwards (ext4: `xfs_io -f -c
/// "falloc 0 1m" f; stat -c %b f` gives 2048).
#[test]
fn blocks_are_counted_at_once_for_fallocate_and_writes() {
    let (_memory, device) = memory_volume(64 << 20, false);
    let fs = FileSystem::mount(device, &inline_options()).unwrap().0;
    let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.run_backend().unwrap();
    fs.allocate(file, 0, 1 << 20, false).unwrap();
    assert_eq!(fs.get_attributes(file).unwrap().blocks_512, 2048, "right after fallocate");
    fs.run_backend().unwrap();
    assert_eq!(fs.get_attributes(file).unwrap().blocks_512, 2048, "after the back end applied it");
    // Appending 8 KiB past the end adds 16 sectors; KEEP_SIZE past the end adds nothing.
    fs.write(file, 1 << 20, &[9u8; 8192]).unwrap();
    fs.allocate(file, (1 << 20) + 8192, 1 << 20, true).unwrap();
    assert_eq!(fs.get_attributes(file).unwrap().blocks_512, 2048 + 16, "after an append");
    fs.run_backend().unwrap();
    assert_eq!(fs.get_attributes(file).unwrap().blocks_512, 2048 + 16);
    // Writing into the fallocated range takes no data blocks, before it is applied and after
    // (then the volume may count an extent-tree node for the split, as ext4 counts its
    // extent blocks in st_blocks).
    fs.write(file, 4096, &[7u8; 65536]).unwrap();
    assert_eq!(fs.get_attributes(file).unwrap().blocks_512, 2048 + 16, "write into fallocated space");
    fs.run_backend().unwrap();
    assert!(fs.get_attributes(file).unwrap().blocks_512 <= 2048 + 16 + 8);
    // A second file fallocated right after its creation, before anything is applied.
    let fresh = fs.create(ROOT_INODE, b"g", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.allocate(fresh, 0, 40960, false).unwrap();
    assert_eq!(fs.get_attributes(fresh).unwrap().blocks_512, 80);
    fs.run_backend().unwrap();
    assert_eq!(fs.get_attributes(fresh).unwrap().blocks_512, 80);
    fs.unmount().unwrap();
}

/// Reading moves the access time as ext4's default `relatime` does: when it is not after the
/// last change, and then not again until the file changes (or a day passes); it is recorded
/// like any attribute change, so a remount keeps it. `noatime` never moves it.
#[test]
fn reads_move_the_access_time_under_relatime() {
    let (_memory, device) = memory_volume(32 << 20, false);
    let fs = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap().0;
    let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, b"a\n").unwrap();
    let old = SetAttributes { access_time: Some(TimeToSet::Nanoseconds(1_000)), ..SetAttributes::default() };
    fs.set_attributes(file, &old).unwrap();
    let mut buffer = [0u8; 16];
    assert_eq!(fs.read(file, 0, &mut buffer).unwrap(), 2);
    let moved = fs.get_attributes(file).unwrap();
    assert!(moved.access_time_ns > moved.change_time_ns, "atime after a read: {moved:?}");
    let next_lsn = fs.log_statistics().next_lsn;
    // Now after every change: further reads change nothing and append nothing.
    for _ in 0..100 {
        fs.read(file, 0, &mut buffer).unwrap();
    }
    assert_eq!(fs.get_attributes(file).unwrap().access_time_ns, moved.access_time_ns);
    assert_eq!(fs.log_statistics().next_lsn, next_lsn, "reads appended records");
    // A write makes the next read move it again.
    fs.write(file, 2, b"b").unwrap();
    fs.read(file, 0, &mut buffer).unwrap();
    let again = fs.get_attributes(file).unwrap();
    assert!(again.access_time_ns > again.modify_time_ns);
    fs.unmount().unwrap();
    let fs = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap().0;
    assert_eq!(fs.get_attributes(file).unwrap().access_time_ns, again.access_time_ns, "lost at remount");
    fs.set_attributes(file, &old).unwrap();
    fs.unmount().unwrap();
    let options = MountOptions { access_time: AccessTimeUpdates::Never, ..MountOptions::default() };
    let fs = FileSystem::mount(device, &options).unwrap().0;
    fs.read(file, 0, &mut buffer).unwrap();
    assert_eq!(fs.get_attributes(file).unwrap().access_time_ns, 1_000, "noatime moved it");
    fs.unmount().unwrap();
}

#[test]
fn relatime_moves_a_day_old_access_time_and_strictatime_moves_every_time() {
    let day = RELATIME_INTERVAL_NS;
    let now = 10 * day;
    let relative = AccessTimeUpdates::Relative;
    assert!(relative.read_moves(now - 5, now - 5, now - 5, now), "equal to mtime");
    assert!(relative.read_moves(now - 9, now - 5, now - 9, now), "before mtime");
    assert!(!relative.read_moves(now - 4, now - 5, now - 6, now), "after both, recent");
    assert!(relative.read_moves(now - day, now - 2 * day, now - 2 * day, now), "a day old");
    assert!(AccessTimeUpdates::Strict.read_moves(now - 1, 0, 0, now));
    assert!(!AccessTimeUpdates::Never.read_moves(0, now, now, now));
}

/// A symbolic link's target takes a data block, and `st_blocks` says so from the create on,
/// the same before the back end applied it, after, and after a remount (it used to read 0
/// until the link's view was loaded again from the volume).
#[test]
fn a_symbolic_link_counts_its_block_from_the_start() {
    let (_memory, device) = memory_volume(64 << 20, false);
    let fs = FileSystem::mount(device.clone(), &inline_options()).unwrap().0;
    let link = fs.symlink(ROOT_INODE, b"l", b"some/target", 0, 0).unwrap().inode;
    let long = fs.symlink(ROOT_INODE, b"long", &[b'x'; 4000], 0, 0).unwrap().inode;
    let blocks = |fs: &FileSystem| [link, long].map(|inode| fs.get_attributes(inode).unwrap().blocks_512);
    assert_eq!(blocks(&fs), [8, 8], "right after the create");
    fs.run_backend().unwrap();
    assert_eq!(blocks(&fs), [8, 8], "applied");
    fs.unmount().unwrap();
    let fs = FileSystem::mount(device, &inline_options()).unwrap().0;
    assert_eq!(blocks(&fs), [8, 8], "after a remount");
    fs.unmount().unwrap();
}
