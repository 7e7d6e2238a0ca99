//! Names and small appends on a volume whose log is small enough to fill many times over: every
//! lookup must give the right answer (present, renamed, removed) while names move from the
//! overlay to the lookup cache, while a full log makes operations checkpoint or drain, and after
//! a remount; fsync'ed appends keep their size; fsck stays clean.

mod common;

use common::*;
use std::collections::BTreeMap;
use tandemfs::fs::*;
use tandemfs::{fsck, Error, FileSystem};

const NAMES: u64 = 30_000;

/// The name's expected state after the workload: Some(original index) where it exists.
fn expected_names() -> BTreeMap<String, Option<u64>> {
    let mut names = BTreeMap::new();
    for index in 0..NAMES {
        let created = format!("n{index}");
        if index % 5 == 0 {
            names.insert(created, None);
        } else if index % 3 == 0 {
            names.insert(created, None);
            names.insert(format!("renamed-{index}"), Some(index));
        } else {
            names.insert(created, Some(index));
        }
    }
    names
}

fn check(fs: &FileSystem, directory: u64, inodes: &BTreeMap<u64, u64>, appended: u64) {
    for (name, expected) in expected_names() {
        match (fs.lookup(directory, name.as_bytes()), expected) {
            (Ok(attributes), Some(index)) => assert_eq!(attributes.inode, inodes[&index], "{name}"),
            (Err(Error::NotFound), None) => {}
            (found, expected) => panic!("{name}: found {found:?}, expected {expected:?}"),
        }
    }
    let append = fs.lookup(ROOT_INODE, b"append").unwrap();
    assert_eq!(append.size_bytes, appended);
}

#[test]
fn names_stay_right_while_a_small_log_fills() {
    // The smallest log (4 MiB) fills many times over. Before the front end bounded its backlog
    // by checkpoint images, a checkpoint's images overflowed this log's reserve and the back end
    // shut the volume down.
    let (_memory, device) = memory_volume(256 << 20, false);
    let options = FormatOptions { log_bytes: Some(4 << 20), inode_count: Some(NAMES + 1024), ..Default::default() };
    FileSystem::format(device.clone(), &options).unwrap();
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let directory = fs.make_directory(ROOT_INODE, b"d", 0o755, 0, 0).unwrap().inode;
    let append = fs.create(ROOT_INODE, b"append", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let mut inodes = BTreeMap::new();
    let mut appended = 0u64;
    for index in 0..NAMES {
        let name = format!("n{index}");
        let inode = fs
            .create(directory, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0)
            .unwrap_or_else(|error| panic!("create {name}: {error}; {:?}; {:?}", fs.statistics(), fs.log_statistics()))
            .inode;
        inodes.insert(index, inode);
        // Right after the create (not applied yet) the name resolves from the overlay.
        assert_eq!(fs.lookup(directory, name.as_bytes()).unwrap().inode, inode);
        if index % 5 == 0 {
            fs.unlink(directory, name.as_bytes()).unwrap();
            assert!(matches!(fs.lookup(directory, name.as_bytes()), Err(Error::NotFound)));
        } else if index % 3 == 0 {
            let new_name = format!("renamed-{index}");
            fs.rename(directory, name.as_bytes(), directory, new_name.as_bytes(), RenameMode::Replace).unwrap();
            assert!(matches!(fs.lookup(directory, name.as_bytes()), Err(Error::NotFound)));
        }
        if index % 10 == 0 {
            fs.write(append, appended, &[0x5a; 256]).unwrap();
            fs.fsync(append, false).unwrap();
            appended += 256;
        }
        // Older names, by now applied and in the lookup cache or the H-tree, still resolve.
        if index % 1000 == 999 {
            let old = index / 2;
            let found = fs.lookup(directory, format!("n{old}").as_bytes()).map(|attributes| attributes.inode);
            match (old % 5, old % 3) {
                (0, _) | (_, 0) => assert!(matches!(found, Err(Error::NotFound))),
                _ => assert_eq!(found.unwrap(), inodes[&old]),
            }
        }
    }
    assert!(fs.log_statistics().checkpoints > 1, "the log should have filled and been checkpointed");
    check(&fs, directory, &inodes, appended);
    fs.unmount().unwrap();
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.is_clean(), "fsck: {:#?}", report.problems);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    // After a remount every answer comes from the H-tree first, then from the cache.
    check(&fs, directory, &inodes, appended);
    check(&fs, directory, &inodes, appended);
    fs.unmount().unwrap();
}
