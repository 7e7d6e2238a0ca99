//! The sharded front end under threads that touch several directories at once: a ring of
//! directories, threads creating, linking, renaming across the ring, unlinking, moving shared
//! directories into each other (cycle attempts included) and racing on shared names. A lock
//! taken out of order deadlocks (the watchdog fails the test instead of hanging); a lost update
//! shows as a wrong link or entry count, a name lost or doubled, or an fsck problem. At the end
//! every thread's own files are where its model says, the tree reads back the same after a
//! remount, and fsck is clean.

mod common;

use common::*;
use rand::Rng;
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;
use tandemfs::fs::*;
use tandemfs::{fsck, Error, FileSystem};

const THREADS: usize = 6;
const OPERATIONS_PER_THREAD: usize = 2500;
const RING: usize = 5;
/// Directories every thread moves around the ring and into each other.
const NOMADS: usize = 6;
/// Names in every ring directory that all threads create, rename and unlink.
const HOT_NAMES: usize = 4;
/// A run without a deadlock takes seconds; this is far beyond it.
const WATCHDOG: Duration = Duration::from_secs(300);

/// A thread's own files: (ring index, name) → file serial. One file may have several names.
type Owned = BTreeMap<(usize, String), u64>;

fn payload(thread: usize, serial: u64) -> Vec<u8> {
    format!("thread {thread} file {serial}").into_bytes()
}

/// Expected outcomes of racing operations on shared names and directories.
fn tolerated(error: &Error) -> bool {
    matches!(error, Error::NotFound | Error::Exists | Error::NotEmpty | Error::InvalidArgument(_) | Error::NotDirectory)
}

fn worker(fs: FileSystem, ring: Vec<u64>, nomads: Vec<String>, thread: usize) -> Owned {
    let mut rng = rng(7000 + thread as u64);
    let mut owned: Owned = BTreeMap::new();
    let mut serial = 0u64;
    for operation in 0..OPERATIONS_PER_THREAD {
        let keys: Vec<(usize, String)> = owned.keys().cloned().collect();
        let pick = |rng: &mut rand::rngs::SmallRng| keys[rng.gen_range(0..keys.len())].clone();
        match rng.gen_range(0..12) {
            0..=2 => {
                serial += 1;
                let directory = rng.gen_range(0..RING);
                let name = format!("t{thread}-{serial}");
                let made = fs.create(ring[directory], name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
                fs.write(made.inode, 0, &payload(thread, serial)).unwrap();
                owned.insert((directory, name), serial);
            }
            3 | 4 if !keys.is_empty() => {
                // Across the ring, sometimes over another name of the same thread.
                let (from, name) = pick(&mut rng);
                let to = rng.gen_range(0..RING);
                let new_name = if rng.gen_bool(0.3) && keys.len() > 1 {
                    pick(&mut rng).1
                } else {
                    format!("t{thread}-r{operation}")
                };
                // The same name, or two names of one file (where rename does nothing).
                if (from, &name) == (to, &new_name)
                    || owned.get(&(to, new_name.clone())) == Some(&owned[&(from, name.clone())])
                {
                    continue;
                }
                fs.rename(ring[from], name.as_bytes(), ring[to], new_name.as_bytes(), RenameMode::Replace).unwrap();
                let file = owned.remove(&(from, name)).unwrap();
                owned.insert((to, new_name), file);
            }
            5 if !keys.is_empty() => {
                let (from, name) = pick(&mut rng);
                let to = rng.gen_range(0..RING);
                let new_name = format!("t{thread}-l{operation}");
                let attributes = fs.lookup(ring[from], name.as_bytes()).unwrap();
                fs.link(attributes.inode, ring[to], new_name.as_bytes()).unwrap();
                let file = owned[&(from, name)];
                owned.insert((to, new_name), file);
            }
            6 if !keys.is_empty() => {
                let (from, name) = pick(&mut rng);
                fs.unlink(ring[from], name.as_bytes()).unwrap();
                owned.remove(&(from, name));
            }
            7 => {
                // A shared name: create, rename across the ring or unlink, whoever wins.
                let directory = rng.gen_range(0..RING);
                let name = format!("hot-{}", rng.gen_range(0..HOT_NAMES));
                let result = match rng.gen_range(0..3) {
                    0 => fs.create(ring[directory], name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).map(drop),
                    1 => {
                        let to = rng.gen_range(0..RING);
                        fs.rename(ring[directory], name.as_bytes(), ring[to], name.as_bytes(), RenameMode::Replace)
                    }
                    _ => fs.unlink(ring[directory], name.as_bytes()),
                };
                if let Err(error) = result {
                    assert!(tolerated(&error), "thread {thread}: {name}: {error}");
                }
            }
            8 => {
                // A shared directory moved from where it may be to a ring directory or into
                // another shared directory: cycles must be refused however the moves race.
                let nomad = &nomads[rng.gen_range(0..NOMADS)];
                let from = nomad_parent(&fs, &ring, &nomads, &mut rng);
                let to = nomad_parent(&fs, &ring, &nomads, &mut rng);
                if let (Some(from), Some(to)) = (from, to) {
                    if let Err(error) = fs.rename(from, nomad.as_bytes(), to, nomad.as_bytes(), RenameMode::NoReplace) {
                        assert!(tolerated(&error), "thread {thread}: moving {nomad}: {error}");
                    }
                }
            }
            9 => {
                // A directory made and removed while others create in shared places.
                let directory = rng.gen_range(0..RING);
                let name = format!("t{thread}-d{operation}");
                let made = fs.make_directory(ring[directory], name.as_bytes(), 0o755, 0, 0).unwrap();
                fs.create(made.inode, b"inner", FileType::Regular, 0o644, 0, 0, 0).unwrap();
                assert!(matches!(fs.remove_directory(ring[directory], name.as_bytes()), Err(Error::NotEmpty)));
                fs.unlink(made.inode, b"inner").unwrap();
                fs.remove_directory(ring[directory], name.as_bytes()).unwrap();
            }
            _ if !keys.is_empty() => {
                let (directory, name) = pick(&mut rng);
                let attributes = fs.lookup(ring[directory], name.as_bytes()).unwrap();
                let names = owned.values().filter(|file| **file == owned[&(directory, name.clone())]).count();
                assert_eq!(attributes.link_count as usize, names, "thread {thread}: links of {name}");
                let mut buffer = vec![0u8; attributes.size_bytes as usize];
                fs.read(attributes.inode, 0, &mut buffer).unwrap();
                assert_eq!(buffer, payload(thread, owned[&(directory, name)]));
            }
            _ => {}
        }
    }
    owned
}

/// A ring directory or a shared directory found by its name in a ring directory (or `None`
/// when it was not there when looked for).
fn nomad_parent(fs: &FileSystem, ring: &[u64], nomads: &[String], rng: &mut rand::rngs::SmallRng) -> Option<u64> {
    if rng.gen_bool(0.5) {
        return Some(ring[rng.gen_range(0..RING)]);
    }
    let nomad = &nomads[rng.gen_range(0..NOMADS)];
    for _ in 0..4 {
        let parent = ring[rng.gen_range(0..RING)];
        if let Ok(found) = fs.lookup(parent, nomad.as_bytes()) {
            return Some(found.inode);
        }
    }
    None
}

/// Checks every thread's files against its model, and the ring's names against them all.
fn check_owned(fs: &FileSystem, ring: &[u64], all: &[(usize, Owned)]) {
    for (index, directory) in ring.iter().enumerate() {
        let mut listed = Vec::new();
        fs.read_directory(*directory, 2, &mut |entry| {
            let name = String::from_utf8(entry.name.clone()).unwrap();
            if name.starts_with('t') && !name.contains("-d") {
                listed.push(name);
            }
            true
        })
        .unwrap();
        listed.sort();
        let mut wanted: Vec<String> = all
            .iter()
            .flat_map(|(_, owned)| {
                owned.keys().filter(|(ring_index, _)| *ring_index == index).map(|(_, name)| name.clone())
            })
            .collect();
        wanted.sort();
        assert_eq!(listed, wanted, "ring directory {index}");
    }
    for (thread, owned) in all {
        for ((directory, name), file) in owned {
            let attributes = fs.lookup(ring[*directory], name.as_bytes()).unwrap();
            let names = owned.values().filter(|other| *other == file).count();
            assert_eq!(attributes.link_count as usize, names, "{name}: link count");
            let mut buffer = vec![0u8; attributes.size_bytes as usize];
            fs.read(attributes.inode, 0, &mut buffer).unwrap();
            assert_eq!(buffer, payload(*thread, *file), "{name}: contents");
        }
    }
}

/// Every shared directory is reachable from the root exactly once, and every directory's link
/// count is 2 plus its subdirectories.
fn check_directories(fs: &FileSystem, nomads: &[String]) {
    let mut found: BTreeMap<String, usize> = BTreeMap::new();
    let mut stack = vec![ROOT_INODE];
    let mut visited = 0usize;
    while let Some(directory) = stack.pop() {
        visited += 1;
        assert!(visited < 100_000, "the tree does not end: a directory cycle");
        let mut subdirectories = 0;
        fs.read_directory(directory, 2, &mut |entry| {
            if entry.file_type == FileType::Directory {
                subdirectories += 1;
                stack.push(entry.inode);
                *found.entry(String::from_utf8(entry.name.clone()).unwrap()).or_default() += 1;
            }
            true
        })
        .unwrap();
        let attributes = fs.get_attributes(directory).unwrap();
        assert_eq!(attributes.link_count, 2 + subdirectories, "directory {directory}: link count");
    }
    for nomad in nomads {
        assert_eq!(found.get(nomad), Some(&1), "{nomad} is not reachable exactly once");
    }
}

#[test]
fn threads_across_a_ring_of_directories_keep_every_invariant() {
    let (_memory, device) = memory_volume(256 << 20, false);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let ring: Vec<u64> = (0..RING)
        .map(|index| fs.make_directory(ROOT_INODE, format!("ring{index}").as_bytes(), 0o755, 0, 0).unwrap().inode)
        .collect();
    let nomads: Vec<String> = (0..NOMADS).map(|index| format!("nomad{index}")).collect();
    for (index, nomad) in nomads.iter().enumerate() {
        fs.make_directory(ring[index % RING], nomad.as_bytes(), 0o755, 0, 0).unwrap();
    }
    let (done, finished) = mpsc::channel();
    for thread in 0..THREADS {
        let (fs, ring, nomads, done) = (fs.clone(), ring.clone(), nomads.clone(), done.clone());
        std::thread::spawn(move || {
            let owned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker(fs, ring, nomads, thread)));
            let _ = done.send((thread, owned));
        });
    }
    let mut all = Vec::new();
    for _ in 0..THREADS {
        let (thread, owned) = finished.recv_timeout(WATCHDOG).expect("a worker is stuck: a lock-order deadlock");
        match owned {
            Ok(owned) => all.push((thread, owned)),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
    check_owned(&fs, &ring, &all);
    check_directories(&fs, &nomads);
    let before = read_back(&fs).unwrap();
    fs.unmount().unwrap();
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.is_clean(), "fsck: {:#?}", report.problems);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let after = read_back(&fs).unwrap();
    assert!(same_tree(&before, &after), "after a remount: {}", first_difference(&before, &after));
    check_owned(&fs, &ring, &all);
    check_directories(&fs, &nomads);
    fs.unmount().unwrap();
}
