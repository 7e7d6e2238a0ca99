//! Shared pieces of the engine's integration tests: a reference model of the namespace and file
//! contents, a seeded random operation generator, and a walker that reads a whole volume back.
#![allow(dead_code)]

pub mod ops;
pub mod threads;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::{Error, FileSystem};

/// What a path holds in the reference model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File { data: Vec<u8>, xattrs: BTreeMap<Vec<u8>, Vec<u8>> },
    Directory { xattrs: BTreeMap<Vec<u8>, Vec<u8>> },
    Symlink { target: Vec<u8> },
}

/// The reference model: a map from path to node, plus hard-link groups (paths sharing a file).
/// Paths are '/'-joined names without a leading slash; "" is the root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Model {
    pub nodes: BTreeMap<String, Node>,
    /// For files: the identity shared by hard links (path of the first name → all names).
    pub link_group: BTreeMap<String, u64>,
    pub next_group: u64,
}

pub fn parent_of(path: &str) -> &str {
    path.rfind('/').map(|index| &path[..index]).unwrap_or("")
}
pub fn name_of(path: &str) -> &str {
    path.rfind('/').map(|index| &path[index + 1..]).unwrap_or(path)
}
pub fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

impl Model {
    pub fn new() -> Model {
        let mut model = Model::default();
        model.nodes.insert(String::new(), Node::Directory { xattrs: BTreeMap::new() });
        model
    }
    pub fn children(&self, directory: &str) -> Vec<String> {
        let prefix = if directory.is_empty() { String::new() } else { format!("{directory}/") };
        self.nodes
            .range(prefix.clone()..)
            .take_while(|(path, _)| path.starts_with(&prefix))
            .filter(|(path, _)| !path.is_empty() && !path[prefix.len()..].contains('/'))
            .map(|(path, _)| path.clone())
            .collect()
    }
    pub fn is_dir(&self, path: &str) -> bool {
        matches!(self.nodes.get(path), Some(Node::Directory { .. }))
    }
    /// Every path sharing the file at `path` (itself included).
    pub fn links(&self, path: &str) -> Vec<String> {
        match self.link_group.get(path) {
            Some(group) => self.link_group.iter().filter(|(_, g)| *g == group).map(|(p, _)| p.clone()).collect(),
            None => vec![path.to_string()],
        }
    }
    /// Applies a change to a file's node and every hard link of it.
    pub fn update_file(&mut self, path: &str, change: impl Fn(&mut Node)) {
        for link in self.links(path) {
            change(self.nodes.get_mut(&link).unwrap());
        }
    }
    pub fn remove_subtree(&mut self, path: &str) {
        let prefix = format!("{path}/");
        let doomed: Vec<String> =
            self.nodes.keys().filter(|key| *key == path || key.starts_with(&prefix)).cloned().collect();
        for key in doomed {
            self.nodes.remove(&key);
            self.link_group.remove(&key);
        }
    }
    /// Moves a subtree from `from` to `to`.
    pub fn move_subtree(&mut self, from: &str, to: &str) {
        let prefix = format!("{from}/");
        let moving: Vec<String> =
            self.nodes.keys().filter(|key| *key == from || key.starts_with(&prefix)).cloned().collect();
        let mut moved = Vec::new();
        for key in moving {
            let node = self.nodes.remove(&key).unwrap();
            let group = self.link_group.remove(&key);
            let new_key = format!("{to}{}", &key[from.len()..]);
            moved.push((new_key, node, group));
        }
        for (key, node, group) in moved {
            if let Some(group) = group {
                self.link_group.insert(key.clone(), group);
            }
            self.nodes.insert(key, node);
        }
    }
}

/// Reads the whole volume into a model (paths, contents, symlink targets, xattrs) and checks
/// link counts and readdir on the way.
pub fn read_back(fs: &FileSystem) -> Result<Model, Error> {
    read_back_under(fs, ROOT_INODE)
}

/// Reads the subtree under the directory `top` into a model whose root is `top`. Hard links
/// must stay inside the subtree (link counts are checked against the names found in it).
pub fn read_back_under(fs: &FileSystem, top: u64) -> Result<Model, Error> {
    let mut model = Model::new();
    let mut root_xattrs = BTreeMap::new();
    for name in fs.list_xattr(top)? {
        let value = fs.get_xattr(top, &name)?;
        root_xattrs.insert(name, value);
    }
    model.nodes.insert(String::new(), Node::Directory { xattrs: root_xattrs });
    let mut inode_paths: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut stack = vec![(String::new(), top)];
    while let Some((path, inode)) = stack.pop() {
        let mut entries = Vec::new();
        fs.read_directory(inode, 0, &mut |entry| {
            entries.push(entry.clone());
            true
        })?;
        assert!(
            entries.len() >= 2 && entries[0].name == b"." && entries[1].name == b"..",
            "listing starts with . and .."
        );
        let mut names = std::collections::BTreeSet::new();
        for entry in &entries[2..] {
            assert!(names.insert(entry.name.clone()), "{path}: entry {:?} listed twice", entry.name);
            let name = String::from_utf8(entry.name.clone()).expect("test names are UTF-8");
            let child = join(&path, &name);
            let attributes = fs.lookup(inode, &entry.name)?;
            assert_eq!(attributes.inode, entry.inode, "{child}: lookup and readdir disagree");
            assert_eq!(attributes.file_type, entry.file_type, "{child}: type");
            let xattrs = |inode: u64| -> Result<BTreeMap<Vec<u8>, Vec<u8>>, Error> {
                let mut map = BTreeMap::new();
                for name in fs.list_xattr(inode)? {
                    let value = fs.get_xattr(inode, &name)?;
                    map.insert(name, value);
                }
                Ok(map)
            };
            match entry.file_type {
                FileType::Directory => {
                    model.nodes.insert(child.clone(), Node::Directory { xattrs: xattrs(entry.inode)? });
                    stack.push((child, entry.inode));
                }
                FileType::Regular => {
                    let mut data = vec![0u8; attributes.size_bytes as usize];
                    let read = fs.read(entry.inode, 0, &mut data)?;
                    assert_eq!(read, data.len(), "{child}: short read");
                    model.nodes.insert(child.clone(), Node::File { data, xattrs: xattrs(entry.inode)? });
                    inode_paths.entry(entry.inode).or_default().push(child);
                }
                FileType::Symlink => {
                    model.nodes.insert(child, Node::Symlink { target: fs.read_link(entry.inode)? });
                }
                other => panic!("{child}: unexpected type {other:?}"),
            }
        }
    }
    for (inode, paths) in inode_paths {
        let attributes = fs.get_attributes(inode)?;
        assert_eq!(attributes.link_count as usize, paths.len(), "inode {inode} ({paths:?}): link count");
        if paths.len() > 1 {
            let group = model.next_group;
            model.next_group += 1;
            for path in paths {
                model.link_group.insert(path, group);
            }
        }
    }
    Ok(model)
}

/// Two models describe the same tree (hard-link groups compared as partitions of paths).
pub fn same_tree(left: &Model, right: &Model) -> bool {
    if left.nodes != right.nodes {
        return false;
    }
    let groups = |model: &Model| {
        let mut by_group: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for (path, group) in &model.link_group {
            by_group.entry(*group).or_default().push(path.clone());
        }
        let mut sets: Vec<Vec<String>> = by_group.into_values().filter(|paths| paths.len() > 1).collect();
        sets.sort();
        sets
    };
    groups(left) == groups(right)
}

pub fn first_difference(left: &Model, right: &Model) -> String {
    for (path, node) in &left.nodes {
        match right.nodes.get(path) {
            None => return format!("{path:?} only in the first"),
            Some(other) if other != node => {
                return format!("{path:?} differs: {:?} vs {:?}", abbreviate(node), abbreviate(other));
            }
            _ => {}
        }
    }
    for path in right.nodes.keys() {
        if !left.nodes.contains_key(path) {
            return format!("{path:?} only in the second");
        }
    }
    "hard-link groups differ".into()
}

fn abbreviate(node: &Node) -> String {
    match node {
        Node::File { data, xattrs } => format!("file of {} bytes, {} xattrs", data.len(), xattrs.len()),
        other => format!("{other:?}"),
    }
}

pub fn memory_volume(size_bytes: u64, crash_model: bool) -> (MemoryDevice, Arc<dyn Device>) {
    memory_volume_with(size_bytes, crash_model, None)
}

/// The passphrase of the encrypted variants of the tests.
pub fn test_secret() -> tandemfs::crypt::Secret {
    tandemfs::crypt::Secret::from_passphrase("the encrypted variant's passphrase".into()).unwrap()
}

/// A formatted memory volume, encrypted under `key` (at `KdfCost::for_tests`) when given. The
/// device returned is the raw memory: mount and fsck take the key in their options.
pub fn memory_volume_with(
    size_bytes: u64,
    crash_model: bool,
    key: Option<&tandemfs::crypt::Secret>,
) -> (MemoryDevice, Arc<dyn Device>) {
    let memory = if crash_model { MemoryDevice::with_crash_model(size_bytes) } else { MemoryDevice::new(size_bytes) };
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    // One inode per 2 KiB: the large-directory workloads create tens of thousands of names.
    let encryption = key.map(|secret| tandemfs::crypt::Encryption {
        secret: secret.clone(),
        cost: tandemfs::crypt::KdfCost::for_tests(),
    });
    let options = FormatOptions {
        hash_seed: Some([1, 2, 3, 4]),
        uuid: Some([9; 16]),
        inode_count: Some(size_bytes / 2048),
        encryption,
        ..FormatOptions::default()
    };
    FileSystem::format(device.clone(), &options).expect("format");
    (memory, device)
}

/// The back-end worker counts the thread tests run with: one applier holding the volume, and
/// several that apply records on disjoint inodes side by side (more workers than the
/// machine's cores still interleave them).
pub const BACKEND_WORKER_COUNTS: &[usize] = &[1, 4];

/// Default mount options with `backend_workers` apply workers.
pub fn worker_options(backend_workers: usize) -> MountOptions {
    assert!(backend_workers >= 1);
    MountOptions { backend_workers, ..MountOptions::default() }
}

pub fn inline_options() -> MountOptions {
    MountOptions { background_backend: false, ..MountOptions::default() }
}

/// The seeds a seeded test runs: the one in `TANDEM_SEED` when set (to reproduce a failure),
/// else `default`.
pub fn seeds(default: impl IntoIterator<Item = u64>) -> Vec<u64> {
    match std::env::var("TANDEM_SEED") {
        Ok(seed) => vec![seed.parse().expect("TANDEM_SEED is a number")],
        Err(_) => default.into_iter().collect(),
    }
}

/// Takes `fs` down and mounts the volume in `memory` again once fsck finds it clean. `killed`
/// false is a clean unmount; true is a killed mount: everything acknowledged is durable and
/// every write issued so far is kept, wherever the back end was (applying, half way through a
/// checkpoint), so the next mount replays the log over what the back end already applied.
/// Returns the new mount and the device it is on (a new one after a kill).
pub fn remount(
    fs: FileSystem,
    memory: &mut MemoryDevice,
    device: Arc<dyn Device>,
    killed: bool,
    seed: u64,
    options: &MountOptions,
    what: &str,
) -> (FileSystem, Arc<dyn Device>) {
    let device = if killed {
        fs.sync().unwrap();
        *memory = memory.crash(seed, tandemfs::device::CrashMode::KeepAll);
        // Stops the back-end thread; the old device is dead, so this fails.
        let _ = fs.unmount();
        Arc::new(memory.clone()) as Arc<dyn Device>
    } else {
        fs.unmount().unwrap();
        device
    };
    let report = check_with_key(device.clone(), options.key.as_ref());
    assert!(report.is_clean(), "{what}: fsck: {:#?}", report.problems);
    let (fs, _) = FileSystem::mount(device.clone(), options).unwrap();
    (fs, device)
}

/// fsck of the volume on `device`, unlocked with `key` when it is encrypted.
pub fn check_with_key(device: Arc<dyn Device>, key: Option<&tandemfs::crypt::Secret>) -> tandemfs::fsck::FsckReport {
    let options = tandemfs::fsck::FsckOptions { key: key.cloned() };
    tandemfs::fsck::check_with_options(device, &options, &mut |_| {}).unwrap()
}

pub fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// Random bytes of a recognisable pattern (cheap to make, unlikely to repeat by accident).
pub fn pattern(rng: &mut SmallRng, length: usize) -> Vec<u8> {
    let start: u8 = rng.gen();
    let step: u8 = rng.gen_range(1..=255);
    (0..length).map(|index| start.wrapping_add(step.wrapping_mul(index as u8)) ^ (index >> 8) as u8).collect()
}

/// Resolves a model path to an inode through the file system.
pub fn resolve(fs: &FileSystem, path: &str) -> Result<Attributes, Error> {
    fs.resolve_path(path.as_bytes())
}

/// Marks the multi-mount protection block of the volume on `device` clean, as a clean unmount
/// leaves it: a test's mount that died mid-way stamped it, and the next mount would wait out the
/// stamp (twice the dead mount's interval and a second; `tests/mmp.rs` tests that wait). For
/// crash tests whose dead mount is long gone.
pub fn forget_dead_mount(device: &Arc<dyn Device>) {
    let superblock = tandemfs::block::superblock::Superblock::read_best(device.as_ref()).unwrap();
    let location = tandemfs::block::mmp::MmpLocation::of(device.clone(), &superblock);
    let mut record = location.read().unwrap();
    record.sequence = tandemfs::block::mmp::SEQUENCE_CLEAN;
    location.write(&record).unwrap();
}

/// How many writes a mount of the volume `image` makes, with default options, before it is
/// ready: crash tests spread their crash points over them.
pub fn writes_of_a_mount(image: &[u8]) -> u64 {
    let counting = MemoryDevice::from_bytes(image.to_vec());
    counting.reset_counters();
    let (fs, _) = FileSystem::mount(Arc::new(counting.clone()), &MountOptions::default()).unwrap();
    let writes = counting.counters().writes;
    drop(fs);
    writes
}

/// The volume a mount of `image` leaves when it dies at its write number `crash_after` (that
/// write and every later one fail, so the mount must fail): the writes after its last flush
/// kept, dropped or torn by `seed`, its multi-mount stamp forgotten.
pub fn killed_mount(image: &[u8], crash_after: u64, seed: u64) -> Arc<dyn Device> {
    let memory = MemoryDevice::from_bytes_with_crash_model(image.to_vec());
    let fault = tandemfs::device::Fault {
        operation: tandemfs::device::FaultOperation::Write,
        after_operations: crash_after,
        repeat: true,
        range: None,
    };
    memory.inject(fault);
    let mounted = FileSystem::mount(Arc::new(memory.clone()), &MountOptions::default());
    assert!(mounted.is_err(), "a mount whose write {crash_after} fails should fail");
    let survivor = memory.crash(seed, tandemfs::device::CrashMode::Random);
    survivor.clear_faults();
    let device: Arc<dyn Device> = Arc::new(survivor);
    forget_dead_mount(&device);
    device
}
