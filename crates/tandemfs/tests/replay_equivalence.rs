//! Issue 7's concurrency test: T threads doing random operations on shared and private
//! directories (renames across directories and over existing targets, of files and of
//! directories, included; creates one by one and in create batches, whose `CreateBatch`
//! records replay as their creates) while the back end runs in its own thread. At the end the whole tree
//! (names, types, inode numbers, link counts, modes, sizes, bytes, symlink targets, xattrs,
//! times) is recorded, and must come back the same
//! (a) from the durable image after a crash, whose mount replays the log in lsn order from the
//!     last checkpoint (once with the back end's unflushed writes lost, once with them kept),
//! (b) after a clean unmount and remount,
//! and fsck must be clean on every image. Each thread's choices follow its seed; the
//! interleaving does not. `TANDEM_SEED=n cargo test --release --test replay_equivalence`.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::{fsck, Error, FileSystem};

const THREADS: u64 = 8;
const OPERATIONS_PER_THREAD: u64 = 5_000;
const SHARED_DIRECTORIES: u64 = 3;
/// Names are drawn from this few per directory, so that threads collide on them.
const NAMES_PER_DIRECTORY: u64 = 10;
const FILE_BYTES_MAX: u64 = 48 * 1024;
const VOLUME_BYTES: u64 = 256 << 20;
/// A log far larger than the run writes, so that the back end's checkpoint policy (a share of
/// the log applied) does not take one and the replay covers most of the run. Its timer (5 s)
/// still may: then replay covers the suffix since that checkpoint.
const LOG_BYTES: u64 = 128 << 20;
/// Upper bound on the entries of the tree, for the walk's loop.
const TREE_ENTRIES_MAX: usize = 1 << 20;

/// Everything the tree says about one name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    inode: u64,
    file_type: FileType,
    permissions: u32,
    link_count: u32,
    uid: u32,
    gid: u32,
    size_bytes: u64,
    modify_time_ns: i64,
    change_time_ns: i64,
    /// File bytes or symlink target.
    contents: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

type Tree = BTreeMap<String, Entry>;

fn entry_of(fs: &FileSystem, attributes: &Attributes) -> Result<Entry, Error> {
    let contents = match attributes.file_type {
        FileType::Regular => {
            let mut data = vec![0u8; attributes.size_bytes as usize];
            let read = fs.read(attributes.inode, 0, &mut data)?;
            assert_eq!(read, data.len(), "inode {}: short read", attributes.inode);
            data
        }
        FileType::Symlink => fs.read_link(attributes.inode)?,
        _ => Vec::new(),
    };
    let mut xattrs = BTreeMap::new();
    if attributes.file_type != FileType::Symlink {
        for name in fs.list_xattr(attributes.inode)? {
            let value = fs.get_xattr(attributes.inode, &name)?;
            xattrs.insert(name, value);
        }
    }
    Ok(Entry {
        inode: attributes.inode,
        file_type: attributes.file_type,
        permissions: attributes.permissions,
        link_count: attributes.link_count,
        uid: attributes.uid,
        gid: attributes.gid,
        size_bytes: attributes.size_bytes,
        modify_time_ns: attributes.modify_time_ns,
        change_time_ns: attributes.change_time_ns,
        contents,
        xattrs,
    })
}

/// Walks the whole volume. Checks on the way that no directory is reached twice (a cycle or a
/// second parent), that lookup agrees with readdir, and that link counts match the names found.
fn record_tree(fs: &FileSystem) -> Tree {
    let mut tree = Tree::new();
    let root = fs.get_attributes(ROOT_INODE).unwrap();
    tree.insert(String::new(), entry_of(fs, &root).unwrap());
    let mut visited = BTreeSet::from([ROOT_INODE]);
    let mut names_of_inode: BTreeMap<u64, usize> = BTreeMap::new();
    let mut subdirectories: BTreeMap<u64, u32> = BTreeMap::new();
    let mut stack = vec![(String::new(), ROOT_INODE)];
    while let Some((path, directory)) = stack.pop() {
        let mut entries = Vec::new();
        fs.read_directory(directory, 2, &mut |entry| {
            entries.push(entry.clone());
            true
        })
        .unwrap_or_else(|error| panic!("{path:?}: readdir: {error}"));
        let mut names = BTreeSet::new();
        for listed in entries {
            assert!(names.insert(listed.name.clone()), "{path:?}: {:?} listed twice", listed.name);
            let child = join(&path, &String::from_utf8(listed.name.clone()).expect("test names are UTF-8"));
            let attributes = fs.lookup(directory, &listed.name).unwrap_or_else(|error| panic!("{child:?}: {error}"));
            assert_eq!(attributes.inode, listed.inode, "{child:?}: lookup and readdir disagree");
            assert_eq!(attributes.file_type, listed.file_type, "{child:?}: type");
            if attributes.file_type == FileType::Directory {
                assert!(visited.insert(attributes.inode), "{child:?}: directory {} reached twice", attributes.inode);
                *subdirectories.entry(directory).or_default() += 1;
                stack.push((child.clone(), attributes.inode));
            } else {
                *names_of_inode.entry(attributes.inode).or_default() += 1;
            }
            tree.insert(child.clone(), entry_of(fs, &attributes).unwrap_or_else(|error| panic!("{child:?}: {error}")));
            assert!(tree.len() <= TREE_ENTRIES_MAX, "the tree grows without bound");
        }
    }
    for (path, entry) in &tree {
        let expected = match entry.file_type {
            FileType::Directory => 2 + subdirectories.get(&entry.inode).copied().unwrap_or(0) as usize,
            _ => names_of_inode[&entry.inode],
        };
        assert_eq!(entry.link_count as usize, expected, "{path:?}: link count");
    }
    tree
}

fn first_difference(left: &Tree, right: &Tree) -> String {
    for (path, entry) in left {
        match right.get(path) {
            None => return format!("{path:?} only in the first"),
            Some(other) if other != entry => {
                let short = |entry: &Entry| {
                    let mut entry = entry.clone();
                    entry.contents.truncate(16);
                    format!("{entry:?}")
                };
                return format!("{path:?} differs:\n  {}\n  {}", short(entry), short(other));
            }
            _ => {}
        }
    }
    match right.keys().find(|path| !left.contains_key(*path)) {
        Some(path) => format!("{path:?} only in the second"),
        None => "no difference".into(),
    }
}

fn assert_same(what: &str, seed: u64, expected: &Tree, got: &Tree) {
    assert!(expected == got, "seed {seed}: {what}: {}", first_difference(expected, got));
}

/// Whether an error is one another thread's change can cause. Anything else (I/O, corruption,
/// shutdown, no space) fails the test.
fn allowed(error: &Error) -> bool {
    matches!(
        error,
        Error::NotFound
            | Error::Exists
            | Error::NotDirectory
            | Error::IsDirectory
            | Error::NotEmpty
            | Error::InvalidArgument(_)
            | Error::NoData
    )
}

fn name(rng: &mut SmallRng) -> String {
    format!("n{}", rng.gen_range(0..NAMES_PER_DIRECTORY))
}

/// Operation kinds, for the tally of what succeeded.
const KINDS: [&str; 16] = [
    "create", "mkdir", "symlink", "write", "truncate", "insert", "collapse", "link", "unlink", "rmdir", "rename",
    "xattr", "chmod", "fsync", "readdir", "read",
];

struct Worker {
    fs: FileSystem,
    /// Per kind: (succeeded, refused with an allowed error).
    tally: [(u64, u64); KINDS.len()],
    thread: u64,
    shared: Vec<u64>,
    private: u64,
    rng: SmallRng,
}

impl Worker {
    /// A directory to work in: a shared one or the thread's own, or one level below it.
    fn directory(&mut self) -> u64 {
        let base =
            if self.rng.gen_bool(0.6) { self.shared[self.rng.gen_range(0..self.shared.len())] } else { self.private };
        if self.rng.gen_bool(0.4) {
            let below = name(&mut self.rng);
            if let Ok(attributes) = self.fs.lookup(base, below.as_bytes()) {
                if attributes.file_type == FileType::Directory {
                    return attributes.inode;
                }
            }
        }
        base
    }

    /// A regular file in a random directory, if the name drawn holds one now.
    fn file(&mut self) -> Option<Attributes> {
        let directory = self.directory();
        let drawn = name(&mut self.rng);
        self.fs.lookup(directory, drawn.as_bytes()).ok().filter(|attributes| attributes.file_type == FileType::Regular)
    }

    fn step(&mut self, operation: u64) {
        let what = format!("thread {} operation {operation}", self.thread);
        let fs = self.fs.clone();
        let choice = self.rng.gen_range(0..100);
        let kind = [10, 15, 17, 30, 34, 40, 44, 48, 54, 58, 76, 84, 88, 90, 95, 100]
            .iter()
            .position(|&end| choice < end)
            .unwrap();
        let result: Result<(), Error> = match choice {
            0..=4 => {
                let directory = self.directory();
                let drawn = name(&mut self.rng);
                fs.create(directory, drawn.as_bytes(), FileType::Regular, 0o644, 1, 2, 0).map(drop)
            }
            5..=9 => {
                // A create batch (one `CreateBatch` record a group): 2 to 6 names in one or two
                // directories, a file or a directory each, a name possibly twice.
                let directories = [self.directory(), self.directory()];
                let drawn: Vec<(u64, String, FileType)> = (0..self.rng.gen_range(2..=6))
                    .map(|_| {
                        let file_type = if self.rng.gen_bool(0.2) { FileType::Directory } else { FileType::Regular };
                        (directories[self.rng.gen_range(0..2)], name(&mut self.rng), file_type)
                    })
                    .collect();
                let requests: Vec<CreateRequest> = drawn
                    .iter()
                    .map(|(parent, name, file_type)| CreateRequest {
                        parent: *parent,
                        name: name.as_bytes(),
                        file_type: *file_type,
                        permissions: 0o640,
                        uid: 5,
                        gid: 6,
                        rdev: 0,
                    })
                    .collect();
                fs.create_batch(&requests)
                    .into_iter()
                    .find(|answer| answer.is_err())
                    .map_or(Ok(()), |answer| answer.map(drop))
            }
            10..=14 => {
                let directory = self.directory();
                let drawn = name(&mut self.rng);
                fs.make_directory(directory, drawn.as_bytes(), 0o755, 3, 4).map(drop)
            }
            15..=16 => {
                let directory = self.directory();
                let drawn = name(&mut self.rng);
                let target = format!("target-{}", self.rng.gen_range(0..100));
                fs.symlink(directory, drawn.as_bytes(), target.as_bytes(), 0, 0).map(drop)
            }
            17..=29 => match self.file() {
                Some(file) => {
                    let offset = self.rng.gen_range(0..=file.size_bytes + 4096).min(FILE_BYTES_MAX);
                    let length = self.rng.gen_range(1..=(FILE_BYTES_MAX - offset).clamp(1, 4_000));
                    let bytes = pattern(&mut self.rng, length as usize);
                    fs.write(file.inode, offset, &bytes).map(drop)
                }
                None => Ok(()),
            },
            30..=33 => match self.file() {
                Some(file) => {
                    let size = self.rng.gen_range(0..=(file.size_bytes + 8192).min(FILE_BYTES_MAX));
                    let changes = SetAttributes { size_bytes: Some(size), ..SetAttributes::default() };
                    fs.set_attributes(file.inode, &changes).map(drop)
                }
                None => Ok(()),
            },
            34..=39 => match self.file() {
                Some(file) if file.size_bytes < FILE_BYTES_MAX - 6000 => {
                    // At a byte offset, mostly inside a block; the size may change under us
                    // (InvalidArgument past the end).
                    let offset = self.rng.gen_range(0..=file.size_bytes);
                    let length = self.rng.gen_range(1..=3000u64);
                    if self.rng.gen_bool(0.6) {
                        let bytes = pattern(&mut self.rng, length as usize);
                        fs.insert(file.inode, offset, &bytes)
                    } else {
                        fs.insert_range(file.inode, offset, length)
                    }
                }
                _ => Ok(()),
            },
            40..=43 => match self.file() {
                Some(file) if file.size_bytes > 0 => {
                    let offset = self.rng.gen_range(0..file.size_bytes);
                    let length = self.rng.gen_range(1..=file.size_bytes - offset);
                    fs.collapse_range(file.inode, offset, length)
                }
                _ => Ok(()),
            },
            44..=47 => match self.file() {
                Some(file) => {
                    let directory = self.directory();
                    let drawn = name(&mut self.rng);
                    fs.link(file.inode, directory, drawn.as_bytes()).map(drop)
                }
                None => Ok(()),
            },
            48..=53 => {
                let directory = self.directory();
                let drawn = name(&mut self.rng);
                fs.unlink(directory, drawn.as_bytes())
            }
            54..=57 => {
                let directory = self.directory();
                let drawn = name(&mut self.rng);
                fs.remove_directory(directory, drawn.as_bytes())
            }
            58..=75 => {
                // Within a directory or across, over an existing name half the time (the pool
                // is small), of files and directories alike.
                let from = self.directory();
                let to = if self.rng.gen_bool(0.3) { from } else { self.directory() };
                let (source, target) = (name(&mut self.rng), name(&mut self.rng));
                let mode = match self.rng.gen_range(0..10) {
                    0 => RenameMode::NoReplace,
                    1 => RenameMode::Exchange,
                    _ => RenameMode::Replace,
                };
                fs.rename(from, source.as_bytes(), to, target.as_bytes(), mode)
            }
            76..=83 => {
                let directory = self.directory();
                let drawn = name(&mut self.rng);
                match fs.lookup(directory, drawn.as_bytes()) {
                    Ok(attributes) if attributes.file_type != FileType::Symlink => {
                        let key = format!("user.k{}", self.rng.gen_range(0..4));
                        if self.rng.gen_bool(0.75) {
                            let length = self.rng.gen_range(0..200);
                            let value = pattern(&mut self.rng, length);
                            fs.set_xattr(attributes.inode, key.as_bytes(), &value, XattrMode::CreateOrReplace)
                        } else {
                            fs.remove_xattr(attributes.inode, key.as_bytes())
                        }
                    }
                    Ok(_) => Ok(()),
                    Err(error) => Err(error),
                }
            }
            84..=87 => {
                let directory = self.directory();
                let drawn = name(&mut self.rng);
                let permissions = self.rng.gen_range(0..0o1000);
                match fs.lookup(directory, drawn.as_bytes()) {
                    Ok(attributes) if attributes.file_type != FileType::Symlink => {
                        let changes = SetAttributes { permissions: Some(permissions), ..SetAttributes::default() };
                        fs.set_attributes(attributes.inode, &changes).map(drop)
                    }
                    Ok(_) => Ok(()),
                    Err(error) => Err(error),
                }
            }
            88..=89 => match self.file() {
                Some(file) => fs.fsync(file.inode, false),
                None => Ok(()),
            },
            90..=94 => {
                // Reads race with the writers: they must answer, not agree with anything.
                let directory = self.directory();
                fs.read_directory(directory, 0, &mut |_| true)
            }
            _ => match self.file() {
                Some(file) => {
                    let mut buffer = vec![0u8; file.size_bytes as usize + 100];
                    fs.read(file.inode, 0, &mut buffer).map(drop)
                }
                None => Ok(()),
            },
        };
        if let Err(error) = &result {
            assert!(allowed(error), "{what}: {error:?} (the volume's failure: {:?})", fs.failure());
        }
        if result.is_ok() {
            self.tally[kind].0 += 1;
        } else {
            self.tally[kind].1 += 1;
        }
    }
}

fn mount(device: &MemoryDevice) -> (FileSystem, MountReport) {
    let device: Arc<dyn Device> = Arc::new(device.clone());
    // Reads move no access times: recording the tree must not change it. Four apply workers,
    // whatever the machine has, so that records apply side by side.
    let options = MountOptions { access_time: AccessTimeUpdates::Never, backend_workers: 4, ..MountOptions::default() };
    FileSystem::mount(device, &options).expect("mount")
}

fn fsck_clean(seed: u64, what: &str, device: &MemoryDevice) {
    let report = fsck::check(Arc::new(device.clone())).unwrap();
    assert!(report.is_clean(), "seed {seed}: fsck {what}: {:#?}", report.problems);
}

fn run(seed: u64) {
    println!("replay equivalence: seed {seed} (TANDEM_SEED={seed} reproduces the choices)");
    let memory = MemoryDevice::with_crash_model(VOLUME_BYTES);
    let options = FormatOptions {
        hash_seed: Some([5, 6, 7, 8]),
        uuid: Some([3; 16]),
        inode_count: Some(VOLUME_BYTES / 4096),
        log_bytes: Some(LOG_BYTES),
        ..FormatOptions::default()
    };
    FileSystem::format(Arc::new(memory.clone()), &options).expect("format");
    let (fs, _) = mount(&memory);
    let shared: Vec<u64> = (0..SHARED_DIRECTORIES)
        .map(|index| fs.make_directory(ROOT_INODE, format!("shared{index}").as_bytes(), 0o755, 0, 0).unwrap().inode)
        .collect();
    let private: Vec<u64> = (0..THREADS)
        .map(|thread| fs.make_directory(ROOT_INODE, format!("private{thread}").as_bytes(), 0o700, 0, 0).unwrap().inode)
        .collect();
    fs.checkpoint().unwrap();
    let handles: Vec<_> = (0..THREADS)
        .map(|thread| {
            let mut worker = Worker {
                fs: fs.clone(),
                tally: [(0, 0); KINDS.len()],
                thread,
                shared: shared.clone(),
                private: private[thread as usize],
                rng: rng(seed.wrapping_mul(1_000_003).wrapping_add(thread)),
            };
            std::thread::spawn(move || {
                for operation in 0..OPERATIONS_PER_THREAD {
                    worker.step(operation);
                }
                worker.tally
            })
        })
        .collect();
    let mut tally = [(0u64, 0u64); KINDS.len()];
    for handle in handles {
        for (total, counts) in tally.iter_mut().zip(handle.join().expect("a worker thread failed")) {
            total.0 += counts.0;
            total.1 += counts.1;
        }
    }
    let line: Vec<String> =
        KINDS.iter().zip(tally).map(|(kind, (done, refused))| format!("{kind} {done}/{refused}")).collect();
    println!("seed {seed}: succeeded/refused: {}", line.join(", "));
    fs.sync().unwrap();
    assert_eq!(fs.failure(), None, "seed {seed}");
    let live = record_tree(&fs);
    let log = fs.log_statistics();
    println!(
        "seed {seed}: {} names; {} records since the last checkpoint, {} checkpoints during the run",
        live.len(),
        log.records_since_checkpoint,
        log.checkpoints
    );

    // The images a crash at this point could leave, taken while the mount lives (each copy is
    // one instant of the device): the durable one, where every write the back end issued since
    // the last flush is lost, so that the tree comes from the checkpoint and the log alone; and
    // the current one (a killed mount), where replay runs over data the back end applied.
    let durable = MemoryDevice::from_bytes_with_crash_model(memory.durable_bytes());
    let current = MemoryDevice::from_bytes_with_crash_model(memory.to_bytes());

    // (b) A clean unmount and remount. (First, so that no keeper of this process holds the
    // multi-mount protection stamp the images carry.)
    fs.unmount().unwrap();
    fsck_clean(seed, "after unmount", &memory);
    let (remounted, report) = mount(&memory);
    assert_eq!(report.records_replayed, 0, "seed {seed}: a clean unmount leaves nothing to replay");
    assert_same("after a clean remount", seed, &live, &record_tree(&remounted));
    remounted.unmount().unwrap();
    fsck_clean(seed, "at the end", &memory);

    // (a) Each crash image, replayed in lsn order from its checkpoint on mount.
    for (what, image) in [("the durable image", durable), ("the current image", current)] {
        fsck_clean(seed, &format!("of {what}"), &image);
        let (replayed, report) = mount(&image);
        assert!(report.records_replayed > 0, "seed {seed}: {what}: nothing was replayed");
        println!("seed {seed}: {what}: {} records replayed", report.records_replayed);
        assert_same(&format!("after replay of {what}"), seed, &live, &record_tree(&replayed));
        replayed.unmount().unwrap();
        fsck_clean(seed, &format!("of {what} after replay and unmount"), &image);
        let (remounted, _) = mount(&image);
        assert_same(&format!("{what}, replayed and remounted"), seed, &live, &record_tree(&remounted));
        remounted.unmount().unwrap();
    }
}

#[test]
fn threads_racing_in_shared_directories_equal_a_sequential_replay() {
    let seeds = seeds([1, 2, 3]);
    for seed in seeds {
        run(seed);
    }
}
