//! Many threads creating, renaming, writing, reading and listing in shared directories, with
//! the back end running in its own thread. Each thread checks its own files as it goes; at the
//! end every directory must hold exactly the union of what the threads left, before and after
//! a remount, and fsck must be clean.

mod common;

use common::*;
use rand::Rng;
use std::collections::BTreeMap;
use std::sync::Arc;
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

const THREADS: u64 = 8;
const OPERATIONS_PER_THREAD: u64 = 6000;
const DIRECTORIES: u64 = 4;

fn contents(thread: u64, serial: u64, version: u64) -> Vec<u8> {
    let length = ((thread * 131 + serial * 17 + version * 7) % 9000) as usize;
    (0..length).map(|index| (thread as usize * 31 + serial as usize * 7 + version as usize + index) as u8).collect()
}

/// Returns the thread's surviving files: (directory index, name) → contents.
fn worker(fs: FileSystem, directories: Vec<u64>, thread: u64) -> BTreeMap<(usize, String), Vec<u8>> {
    let mut rng = rng(1000 + thread);
    let mut files: BTreeMap<(usize, String), Vec<u8>> = BTreeMap::new();
    let mut serial = 0u64;
    for operation in 0..OPERATIONS_PER_THREAD {
        let choice = rng.gen_range(0..10);
        let existing: Vec<(usize, String)> = files.keys().cloned().collect();
        match choice {
            0..=2 => {
                serial += 1;
                let directory = rng.gen_range(0..directories.len());
                let name = format!("t{thread}-{serial}");
                let made =
                    fs.create(directories[directory], name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
                let data = contents(thread, serial, 0);
                fs.write(made.inode, 0, &data).unwrap();
                files.insert((directory, name), data);
            }
            3 | 4 if !existing.is_empty() => {
                let (directory, name) = existing[rng.gen_range(0..existing.len())].clone();
                let target_directory = rng.gen_range(0..directories.len());
                let target_name = format!("t{thread}-r{operation}");
                fs.rename(
                    directories[directory],
                    name.as_bytes(),
                    directories[target_directory],
                    target_name.as_bytes(),
                    RenameMode::Replace,
                )
                .unwrap();
                let data = files.remove(&(directory, name)).unwrap();
                files.insert((target_directory, target_name), data);
            }
            5 if !existing.is_empty() => {
                let key = existing[rng.gen_range(0..existing.len())].clone();
                let inode = fs.lookup(directories[key.0], key.1.as_bytes()).unwrap().inode;
                let data = contents(thread, operation, 1);
                fs.set_attributes(inode, &SetAttributes { size_bytes: Some(0), ..Default::default() }).unwrap();
                fs.write(inode, 0, &data).unwrap();
                files.insert(key, data);
            }
            6 if !existing.is_empty() => {
                let key = existing[rng.gen_range(0..existing.len())].clone();
                fs.unlink(directories[key.0], key.1.as_bytes()).unwrap();
                files.remove(&key);
            }
            7 => {
                // List a shared directory: no name twice, every own file present.
                let directory = rng.gen_range(0..directories.len());
                let mut seen = std::collections::BTreeSet::new();
                fs.read_directory(directories[directory], 0, &mut |entry| {
                    assert!(seen.insert(entry.name.clone()), "{:?} listed twice", entry.name);
                    true
                })
                .unwrap();
                for (own_directory, name) in files.keys() {
                    if *own_directory == directory {
                        assert!(seen.contains(name.as_bytes()), "thread {thread}: {name} missing from a listing");
                    }
                }
            }
            _ if !existing.is_empty() => {
                let key = existing[rng.gen_range(0..existing.len())].clone();
                let attributes = fs.lookup(directories[key.0], key.1.as_bytes()).unwrap();
                let mut buffer = vec![0u8; attributes.size_bytes as usize];
                fs.read(attributes.inode, 0, &mut buffer).unwrap();
                assert_eq!(buffer, files[&key], "thread {thread}: contents of {}", key.1);
            }
            _ => {}
        }
    }
    files
}

fn check_all(fs: &FileSystem, directories: &[u64], expected: &BTreeMap<(usize, String), Vec<u8>>) {
    for (index, directory) in directories.iter().enumerate() {
        let mut names = Vec::new();
        fs.read_directory(*directory, 2, &mut |entry| {
            names.push(String::from_utf8(entry.name.clone()).unwrap());
            true
        })
        .unwrap();
        names.sort();
        let wanted: Vec<String> = expected.keys().filter(|(d, _)| *d == index).map(|(_, name)| name.clone()).collect();
        assert_eq!(names, wanted, "directory {index}");
    }
    for ((index, name), data) in expected {
        let attributes = fs.lookup(directories[*index], name.as_bytes()).unwrap();
        let mut buffer = vec![0u8; attributes.size_bytes as usize];
        fs.read(attributes.inode, 0, &mut buffer).unwrap();
        assert_eq!(&buffer, data, "{name}");
    }
}

#[test]
fn threads_share_directories() {
    let (_memory, device) = memory_volume(256 << 20, false);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let directories: Vec<u64> = (0..DIRECTORIES)
        .map(|index| fs.make_directory(ROOT_INODE, format!("shared{index}").as_bytes(), 0o755, 0, 0).unwrap().inode)
        .collect();
    let handles: Vec<_> = (0..THREADS)
        .map(|thread| {
            let fs = fs.clone();
            let directories = directories.clone();
            std::thread::spawn(move || worker(fs, directories, thread))
        })
        .collect();
    let mut expected = BTreeMap::new();
    for handle in handles {
        expected.extend(handle.join().expect("a worker thread failed"));
    }
    check_all(&fs, &directories, &expected);
    fs.unmount().unwrap();
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.is_clean(), "fsck: {:#?}", report.problems);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    check_all(&fs, &directories, &expected);
    fs.unmount().unwrap();
    let _ = Arc::new(());
}
