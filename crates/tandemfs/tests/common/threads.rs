//! Pieces of the multi-threaded model and crash tests. Each thread owns a private subtree,
//! driven by `ops::Driver` against the thread's own model, and a few thread-unique names in
//! one shared directory (`SharedFiles`), so that its expected state does not depend on how the
//! threads interleave, while their changes still meet in one directory and one log.

use super::ops::{Driver, Step, Workload};
use super::*;
use rand::Rng;
use std::collections::BTreeSet;

/// The directory every thread also works in.
pub const SHARED_DIRECTORY: &str = "shared";
/// Names per thread in the shared directory: few, so that renames land on existing ones.
const SHARED_NAMES_PER_THREAD: u64 = 6;
const SHARED_WRITE_BYTES_MAX: usize = 6000;
const SHARED_FILE_BYTES_MAX: u64 = 40_000;

pub fn private_root(thread: u64) -> String {
    format!("t{thread}")
}

/// Makes the shared directory and every thread's private root; returns the shared one's inode.
pub fn make_directories(fs: &FileSystem, threads: u64) -> u64 {
    let shared = fs.make_directory(ROOT_INODE, SHARED_DIRECTORY.as_bytes(), 0o777, 0, 0).unwrap().inode;
    for thread in 0..threads {
        fs.make_directory(ROOT_INODE, private_root(thread).as_bytes(), 0o755, 0, 0).unwrap();
    }
    shared
}

/// Passes I/O failures and shutdown up (the crash test injects them); any other error is a
/// disagreement with the model and fails the test.
fn outcome<T>(what: &str, result: Result<T, Error>) -> Result<T, Error> {
    match result {
        Ok(value) => Ok(value),
        Err(error @ (Error::Io { .. } | Error::Shutdown)) => Err(error),
        Err(error) => panic!("{what}: {error:?}"),
    }
}

/// One thread's files in the shared directory (name → contents) and its empty directories
/// there (which move the shared directory's link count, a field every thread changes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedFiles {
    pub thread: u64,
    pub files: BTreeMap<String, Vec<u8>>,
    pub directories: BTreeSet<String>,
}

impl SharedFiles {
    pub fn new(thread: u64) -> SharedFiles {
        SharedFiles { thread, files: BTreeMap::new(), directories: BTreeSet::new() }
    }

    fn prefix(thread: u64) -> String {
        format!("t{thread}-")
    }

    fn random_name(&self, rng: &mut SmallRng) -> String {
        format!("{}s{}", SharedFiles::prefix(self.thread), rng.gen_range(0..SHARED_NAMES_PER_THREAD))
    }

    fn existing(&self, rng: &mut SmallRng) -> Option<String> {
        let names: Vec<&String> = self.files.keys().collect();
        (!names.is_empty()).then(|| names[rng.gen_range(0..names.len())].clone())
    }

    /// One random operation on the thread's names in the shared directory `directory`.
    pub fn step(&mut self, fs: &FileSystem, rng: &mut SmallRng, directory: u64) -> Step {
        let thread = self.thread;
        match rng.gen_range(0..8) {
            6 => {
                let name = format!("{}d{}", SharedFiles::prefix(thread), rng.gen_range(0..SHARED_NAMES_PER_THREAD));
                let what = format!("thread {thread}: mkdir shared {name}");
                match fs.make_directory(directory, name.as_bytes(), 0o755, 0, 0) {
                    Ok(_) => assert!(self.directories.insert(name), "{what}: succeeded over an existing name"),
                    Err(Error::Exists) => assert!(self.directories.contains(&name), "{what}: Exists"),
                    Err(error) => outcome(&what, Err(error))?,
                }
            }
            7 => {
                let names: Vec<&String> = self.directories.iter().collect();
                let Some(name) = (!names.is_empty()).then(|| names[rng.gen_range(0..names.len())].clone()) else {
                    return Ok(());
                };
                outcome(&format!("thread {thread}: rmdir {name}"), fs.remove_directory(directory, name.as_bytes()))?;
                self.directories.remove(&name);
            }
            0 => {
                let name = self.random_name(rng);
                let result = fs.create(directory, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0);
                match (result, self.files.contains_key(&name)) {
                    (Ok(_), false) => {
                        self.files.insert(name, Vec::new());
                    }
                    (Err(Error::Exists), true) => {}
                    (result, present) => {
                        outcome(&format!("thread {thread}: create shared {name} (present: {present})"), result)?;
                        panic!("thread {thread}: create shared {name}: succeeded over an existing name");
                    }
                }
            }
            1 | 2 => {
                let Some(name) = self.existing(rng) else { return Ok(()) };
                let size = self.files[&name].len() as u64;
                let offset = rng.gen_range(0..=size.min(SHARED_FILE_BYTES_MAX));
                let length = rng.gen_range(1..=SHARED_WRITE_BYTES_MAX);
                let bytes = pattern(rng, length);
                let inode = outcome(&format!("thread {thread}: lookup {name}"), fs.lookup(directory, name.as_bytes()))?;
                outcome(&format!("thread {thread}: write {name}"), fs.write(inode.inode, offset, &bytes))?;
                let data = self.files.get_mut(&name).unwrap();
                let end = offset as usize + bytes.len();
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[offset as usize..end].copy_from_slice(&bytes);
            }
            3 => {
                // Over an existing name of this thread about half the time.
                let Some(source) = self.existing(rng) else { return Ok(()) };
                let target = self.random_name(rng);
                outcome(
                    &format!("thread {thread}: rename {source} -> {target}"),
                    fs.rename(directory, source.as_bytes(), directory, target.as_bytes(), RenameMode::Replace),
                )?;
                let data = self.files.remove(&source).unwrap();
                self.files.insert(target, data);
            }
            4 => {
                let Some(name) = self.existing(rng) else { return Ok(()) };
                outcome(&format!("thread {thread}: unlink {name}"), fs.unlink(directory, name.as_bytes()))?;
                self.files.remove(&name);
            }
            _ => {
                let found = outcome(
                    &format!("thread {thread}: read back the shared directory"),
                    SharedFiles::read_back(fs, directory, thread),
                )?;
                assert!(found == *self, "thread {thread}: shared files differ: {:?}", self.difference(&found));
            }
        }
        Ok(())
    }

    /// The files of `thread` found in the shared directory.
    pub fn read_back(fs: &FileSystem, directory: u64, thread: u64) -> Result<SharedFiles, Error> {
        let prefix = SharedFiles::prefix(thread);
        let mut names = Vec::new();
        fs.read_directory(directory, 2, &mut |entry| {
            if entry.name.starts_with(prefix.as_bytes()) {
                names.push(entry.name.clone());
            }
            true
        })?;
        let mut files = BTreeMap::new();
        let mut directories = BTreeSet::new();
        for name in names {
            let attributes = fs.lookup(directory, &name)?;
            if attributes.file_type == FileType::Directory {
                assert_eq!(attributes.link_count, 2, "{name:?}: link count of an empty directory");
                directories.insert(String::from_utf8(name).expect("test names are UTF-8"));
                continue;
            }
            assert_eq!(attributes.file_type, FileType::Regular);
            assert_eq!(attributes.link_count, 1, "{name:?}: link count");
            let mut data = vec![0u8; attributes.size_bytes as usize];
            let read = fs.read(attributes.inode, 0, &mut data)?;
            assert_eq!(read, data.len(), "{name:?}: short read");
            let name = String::from_utf8(name).expect("test names are UTF-8");
            assert!(files.insert(name.clone(), data).is_none(), "{name}: listed twice");
        }
        Ok(SharedFiles { thread, files, directories })
    }

    pub fn difference(&self, other: &SharedFiles) -> String {
        for (name, data) in &self.files {
            match other.files.get(name) {
                None => return format!("{name} only in the first"),
                Some(found) if found != data => {
                    return format!("{name}: {} bytes vs {} bytes, or other bytes", data.len(), found.len());
                }
                _ => {}
            }
        }
        if let Some(name) = other.files.keys().find(|name| !self.files.contains_key(*name)) {
            return format!("{name} only in the second");
        }
        format!("directories {:?} vs {:?}", self.directories, other.directories)
    }
}

/// What one thread expects of the volume: its private subtree and its shared files.
pub struct ThreadState {
    pub thread: u64,
    pub driver: Driver,
    pub shared: SharedFiles,
    pub rng: SmallRng,
}

impl ThreadState {
    pub fn new(seed: u64, thread: u64, workload: Workload) -> ThreadState {
        ThreadState {
            thread,
            driver: Driver::rooted(workload, &private_root(thread)),
            shared: SharedFiles::new(thread),
            rng: rng(seed.wrapping_mul(7919).wrapping_add(thread)),
        }
    }

    /// One random operation: mostly in the private subtree, sometimes in the shared directory.
    pub fn step(&mut self, fs: &FileSystem, shared_directory: u64) -> Step {
        if self.rng.gen_range(0..5) == 0 {
            self.shared.step(fs, &mut self.rng, shared_directory)
        } else {
            self.driver.step(fs, &mut self.rng)
        }
    }

    /// Reads this thread's part of the volume back.
    pub fn read_back(&self, fs: &FileSystem, shared_directory: u64) -> Result<(Model, SharedFiles), Error> {
        let top = resolve(fs, &private_root(self.thread))?.inode;
        Ok((read_back_under(fs, top)?, SharedFiles::read_back(fs, shared_directory, self.thread)?))
    }

    /// Fails the test unless the volume holds exactly what the thread expects.
    pub fn check(&self, fs: &FileSystem, shared_directory: u64, what: &str) {
        let thread = self.thread;
        let (model, shared) =
            self.read_back(fs, shared_directory).unwrap_or_else(|error| panic!("{what}: thread {thread}: {error}"));
        assert!(
            same_tree(&model, &self.driver.model),
            "{what}: thread {thread}: private subtree: {}",
            first_difference(&model, &self.driver.model)
        );
        assert!(shared == self.shared, "{what}: thread {thread}: shared files: {}", self.shared.difference(&shared));
    }
}

/// The shared directory's link count: every thread's subdirectories there move it.
pub fn check_shared_link_count(fs: &FileSystem, shared_directory: u64, subdirectories: usize, what: &str) {
    let attributes = fs.get_attributes(shared_directory).unwrap_or_else(|error| panic!("{what}: {error}"));
    assert_eq!(attributes.link_count as usize, 2 + subdirectories, "{what}: link count of the shared directory");
}
