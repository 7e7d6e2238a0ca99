//! POSIX details that third-party file-system suites check through a mount, pinned down at the
//! engine, which owns them: each test here started as a bug found by the mount torture tests
//! (tests/mount/posix_check.py, fill_check.py).

mod common;

use common::*;
use tandemfs::fs::*;
use tandemfs::FileSystem;

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
