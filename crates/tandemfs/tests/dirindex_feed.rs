//! The directory index inside a mount (`FileSystem::install_directory_index`): the back end
//! feeds it every applied batch, it learns directories made before it was installed, and the
//! batch API answers from it exactly what the single calls answer, never older than a change
//! acknowledged before the batch began. The CPU twin of the index runs here (CI); the same
//! tests run the GPU engine when `TANDEM_INDEX_ENGINE=gpu` is set and a GPU opens
//! (`gpu_adapter_answers_equal_the_single_calls` is the one for the GPU host; it says why it
//! skips when there is none).
//!
//! The counters (`batch_statistics().index_answers`, `directory_index_statistics()`) are
//! checked as well as the answers: a test fails if the index silently declines everything.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_accel::dirindex::{
    ApplyReport, CpuDirectoryIndex, Credentials, DirectoryIndex, IndexUpdate, ListResult, LookupResult, ResolveResult,
    StatResult,
};
use tandemfs::device::Device;
use tandemfs::fs::*;
use tandemfs::{Error, FileSystem};

const VOLUME_BYTES: u64 = 256 << 20;
/// Longest a test waits for the feeder to learn a tree.
const LEARN_WAIT: Duration = Duration::from_secs(30);

fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// The engine the tests install: the CPU twin, or the GPU when `TANDEM_INDEX_ENGINE=gpu`.
fn engine_from_environment() -> IndexEngine {
    match std::env::var("TANDEM_INDEX_ENGINE").as_deref() {
        Ok("gpu") => IndexEngine::Gpu,
        _ => IndexEngine::Cpu,
    }
}

fn index_options(engine: IndexEngine, catch_up_wait_ms: u64) -> DirectoryIndexOptions {
    DirectoryIndexOptions {
        engine,
        min_batch: Some(16),
        catch_up_wait_ms,
        gpu_entries: 1 << 16,
        ..DirectoryIndexOptions::default()
    }
}

fn mount(options: &MountOptions) -> (FileSystem, Arc<dyn Device>) {
    let (_memory, device) = memory_volume(VOLUME_BYTES, false);
    let (fs, _) = FileSystem::mount(device.clone(), options).unwrap();
    (fs, device)
}

fn same(left: &Result<Attributes, Error>, right: &Result<Attributes, Error>) -> bool {
    match (left, right) {
        (Ok(left), Ok(right)) => left == right,
        (Err(left), Err(right)) => format!("{left:?}") == format!("{right:?}"),
        _ => false,
    }
}

/// Each batch answer equals the single call's answer made before the batch or the one made
/// after it (the tree may move on between; only the caller's own changes are in both).
fn assert_between(
    what: &str,
    before: &[Result<Attributes, Error>],
    batch: &[Result<Attributes, Error>],
    after: &[Result<Attributes, Error>],
    shown: &dyn Fn(usize) -> String,
) {
    assert_eq!(batch.len(), before.len(), "{what}: answer count");
    for position in 0..batch.len() {
        assert!(
            same(&batch[position], &before[position]) || same(&batch[position], &after[position]),
            "{what} {position} ({}): batch {:?}, single before {:?}, after {:?}",
            shown(position),
            batch[position],
            before[position],
            after[position]
        );
    }
}

/// A tree made with single calls before the index is installed: directories, files, symbolic
/// links; every path made and every (parent, name).
struct Tree {
    paths: Vec<Vec<u8>>,
    entries: Vec<(u64, Vec<u8>)>,
    inodes: Vec<u64>,
    directories: usize,
}

fn short_name(rng: &mut SmallRng) -> Vec<u8> {
    let length = if rng.gen_bool(0.05) { rng.gen_range(100..=NAME_MAX_BYTES) } else { rng.gen_range(3..=12) };
    (0..length).map(|_| rng.gen_range(b'a'..=b'z')).collect()
}

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent.is_empty() {
        name.to_vec()
    } else {
        [parent, b"/", name].concat()
    }
}

fn build_tree(fs: &FileSystem, rng: &mut SmallRng, directories: usize) -> Tree {
    let mut tree = Tree { paths: Vec::new(), entries: Vec::new(), inodes: vec![ROOT_INODE], directories: 1 };
    let mut made: Vec<(u64, Vec<u8>)> = vec![(ROOT_INODE, Vec::new())];
    for _ in 0..directories {
        let (parent, parent_path) = made.choose(rng).unwrap().clone();
        let name = short_name(rng);
        let Ok(attributes) = fs.make_directory(parent, &name, 0o755, 0, 0) else { continue };
        tree.paths.push(join(&parent_path, &name));
        tree.entries.push((parent, name.clone()));
        tree.inodes.push(attributes.inode);
        tree.directories += 1;
        made.push((attributes.inode, join(&parent_path, &name)));
    }
    for (directory, path) in made.clone() {
        for _ in 0..rng.gen_range(0..8) {
            let name = short_name(rng);
            let Ok(attributes) = fs.create(directory, &name, FileType::Regular, 0o644, 0, 0, 0) else { continue };
            tree.paths.push(join(&path, &name));
            tree.entries.push((directory, name));
            tree.inodes.push(attributes.inode);
        }
        if rng.gen_bool(0.2) && fs.symlink(directory, b"link", b"..", 0, 0).is_ok() {
            tree.paths.push(join(&path, b"link/"));
            tree.entries.push((directory, b"link".to_vec()));
        }
    }
    // Applied whole before the caller installs an index, so that the index learns every
    // directory from the volume: one made while the index is installed reaches it through the
    // feed and is never counted as learnt (the backlog may hold the whole tree unapplied).
    fs.checkpoint().unwrap();
    tree
}

/// A path aimed at the tree: a path made, sometimes with `.`, `..`, an empty component, a
/// missing or over-long name, or a name under a file.
fn random_path(rng: &mut SmallRng, tree: &Tree) -> Vec<u8> {
    let mut path = tree.paths.choose(rng).unwrap().clone();
    match rng.gen_range(0..10) {
        0 => path.extend_from_slice(b"/.."),
        1 => path = [b"./".as_slice(), &path].concat(),
        2 => path.extend_from_slice(b"/missing"),
        3 => path.extend_from_slice(&[b'/'; 1].repeat(2)),
        4 => path = [b"/".as_slice(), &path, b"/", &[b'n'; NAME_MAX_BYTES + 1]].concat(),
        5 => path.extend_from_slice(b"/x/y"),
        _ => {}
    }
    path
}

/// Waits until the feeder has learnt at least `directories` directories and the index answers
/// a lookup batch; panics after `LEARN_WAIT`.
fn wait_until_learnt(fs: &FileSystem, directories: usize) {
    let deadline = Instant::now() + LEARN_WAIT;
    loop {
        let statistics = fs.directory_index_statistics().expect("an index is installed");
        assert!(statistics.failure.is_none(), "feed failed: {statistics:?}");
        if statistics.directories_learnt as usize >= directories {
            return;
        }
        assert!(Instant::now() < deadline, "index learnt too little: {statistics:?}, want {directories}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A tree made before the index was installed is learnt from the volume (the root, then down
/// the tree), and then every lookup, resolve and stat batch equals the single calls, with the
/// index answering all but the symbolic links.
#[test]
fn a_tree_made_before_the_index_is_learnt_and_answered_as_the_single_calls() {
    for seed in seeds([1, 2]) {
        let (fs, _device) = mount(&MountOptions::default());
        let mut rng = rng(seed);
        let tree = build_tree(&fs, &mut rng, 120);
        fs.sync().unwrap();
        let name = fs.install_directory_index(&index_options(engine_from_environment(), 2_000)).unwrap();
        wait_until_learnt(&fs, tree.directories);
        let paths: Vec<Vec<u8>> = (0..2000).map(|_| random_path(&mut rng, &tree)).collect();
        let mut lookups: Vec<(u64, Vec<u8>)> =
            (0..2000).map(|_| tree.entries.choose(&mut rng).unwrap().clone()).collect();
        lookups.extend([(ROOT_INODE, b"missing".to_vec()), (ROOT_INODE, b".".to_vec()), (ROOT_INODE, vec![b'q'; 300])]);
        let inodes: Vec<u64> = (0..2000).map(|_| *tree.inodes.choose(&mut rng).unwrap()).collect();
        let before = fs.batch_statistics();
        let (resolved, looked_up, statted) =
            (fs.resolve_paths(&paths), fs.lookup_batch(&lookups), fs.stat_batch(&inodes));
        let after = fs.batch_statistics();
        let shown = |position: usize| format!("seed {seed}, index {name}, request {position}");
        let single: Vec<_> = paths.iter().map(|path| fs.resolve_path(path)).collect();
        assert_between("resolve", &single, &resolved, &single, &|p| {
            format!("{} path {:?}", shown(p), String::from_utf8_lossy(&paths[p]))
        });
        let single: Vec<_> = lookups.iter().map(|(parent, name)| fs.lookup(*parent, name)).collect();
        assert_between("lookup", &single, &looked_up, &single, &shown);
        let single: Vec<_> = inodes.iter().map(|inode| fs.get_attributes(*inode)).collect();
        assert_between("stat", &single, &statted, &single, &shown);
        let asked = (paths.len() + lookups.len() + inodes.len()) as u64;
        let by_index = after.index_answers - before.index_answers;
        println!("learnt tree, seed {seed}: the index answered {by_index} of {asked}");
        assert!(by_index * 10 >= asked * 8, "seed {seed}: the index answered {by_index} of {asked}");
        assert_eq!(after.index_failures, before.index_failures);
        fs.unmount().unwrap();
        assert!(fs.directory_index_statistics().is_none(), "unmount removes the index");
    }
}

/// What a name in a thread's subtree is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Directory,
    Symlink,
}

/// One name a thread made.
#[derive(Clone)]
struct Node {
    parent: u64,
    name: Vec<u8>,
    inode: u64,
    kind: Kind,
    alive: bool,
}

/// One thread's own subtree, as it made it: every name it made, alive or removed.
struct Own {
    top: u64,
    top_path: Vec<u8>,
    nodes: Vec<Node>,
    /// Files unlinked while open (orphans), released a few changes later.
    open_orphans: Vec<u64>,
}

impl Own {
    fn live(&self, kind: Kind) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&at| self.nodes[at].alive && self.nodes[at].kind == kind).collect()
    }

    fn directories(&self) -> Vec<u64> {
        let mut directories = vec![self.top];
        directories.extend(self.live(Kind::Directory).into_iter().map(|at| self.nodes[at].inode));
        directories
    }

    /// The path of node `at` from the root, through its parents as the model has them.
    fn path(&self, at: usize) -> Vec<u8> {
        let node = &self.nodes[at];
        let parent_path = if node.parent == self.top {
            self.top_path.clone()
        } else {
            match self.nodes.iter().position(|up| up.inode == node.parent && up.alive) {
                Some(up) => self.path(up),
                None => self.top_path.clone(),
            }
        };
        join(&parent_path, &node.name)
    }

    fn name_in(&self, directory: u64, rng: &mut SmallRng) -> Vec<u8> {
        let existing: Vec<&Vec<u8>> = self
            .nodes
            .iter()
            .filter(|node| node.parent == directory && node.alive && node.kind != Kind::Directory)
            .map(|node| &node.name)
            .collect();
        if !existing.is_empty() && rng.gen_bool(0.2) {
            return existing.choose(rng).unwrap().to_vec();
        }
        short_name(rng)
    }

    fn add(&mut self, parent: u64, name: Vec<u8>, inode: u64, kind: Kind) {
        self.nodes.push(Node { parent, name, inode, kind, alive: true });
    }

    /// Marks the live name (parent, name) removed.
    fn remove_name(&mut self, parent: u64, name: &[u8]) {
        for node in self.nodes.iter_mut().filter(|node| node.parent == parent && node.name == name && node.alive) {
            node.alive = false;
        }
    }

    /// One random change: create, mkdir, symlink, link, unlink (sometimes while open), rename
    /// (files anywhere in the subtree, replacing a file sometimes; directories to the top; now
    /// and then an exchange), setattr, truncate, write, punch, allocate, set an xattr.
    fn change(&mut self, fs: &FileSystem, rng: &mut SmallRng) {
        let directory = *self.directories().choose(rng).unwrap();
        let files = self.live(Kind::File);
        let file = files.choose(rng).copied();
        match (rng.gen_range(0..20), file) {
            (0..=3, _) => {
                let name = short_name(rng);
                if let Ok(made) = fs.create(directory, &name, FileType::Regular, 0o640, 1, 2, 0) {
                    self.add(directory, name, made.inode, Kind::File);
                }
            }
            (4, _) => {
                let name = short_name(rng);
                if let Ok(made) = fs.make_directory(directory, &name, 0o750, 1, 2) {
                    self.add(directory, name, made.inode, Kind::Directory);
                }
            }
            (5, _) => {
                let name = short_name(rng);
                if let Ok(made) = fs.symlink(directory, &name, b"../elsewhere", 1, 2) {
                    self.add(directory, name, made.inode, Kind::Symlink);
                }
            }
            (6, Some(at)) => {
                let name = short_name(rng);
                let inode = self.nodes[at].inode;
                if fs.link(inode, directory, &name).is_ok() {
                    self.add(directory, name, inode, Kind::File);
                }
            }
            (7 | 8, Some(at)) => {
                let Node { parent, name, inode, .. } = self.nodes[at].clone();
                let keep_open = rng.gen_bool(0.2);
                if keep_open {
                    fs.open_inode(inode).unwrap();
                    self.open_orphans.push(inode);
                }
                fs.unlink(parent, &name).unwrap();
                self.nodes[at].alive = false;
            }
            (9 | 10, Some(at)) => {
                let Node { parent, name, inode, .. } = self.nodes[at].clone();
                if rng.gen_bool(0.1) {
                    // An exchange with another file: the index forgets both directories.
                    let Some(&other) = files.iter().find(|&&other| other != at) else { return };
                    let Node { parent: other_parent, name: other_name, inode: other_inode, .. } =
                        self.nodes[other].clone();
                    fs.rename(parent, &name, other_parent, &other_name, RenameMode::Exchange).unwrap();
                    self.nodes[at].inode = other_inode;
                    self.nodes[other].inode = inode;
                    return;
                }
                let new_name = self.name_in(directory, rng);
                if (parent, &name) == (directory, &new_name) {
                    return;
                }
                // A file's name may collide with a directory's: refused, nothing changes.
                let Ok(()) = fs.rename(parent, &name, directory, &new_name, RenameMode::Replace) else { return };
                self.remove_name(directory, &new_name);
                self.nodes[at].alive = false;
                self.add(directory, new_name, inode, Kind::File);
            }
            (11, _) => {
                let Some(&at) = self.live(Kind::Directory).choose(rng) else { return };
                let Node { parent, name, inode, .. } = self.nodes[at].clone();
                let new_name = short_name(rng);
                if fs.rename(parent, &name, self.top, &new_name, RenameMode::NoReplace).is_ok() {
                    self.nodes[at].alive = false;
                    self.add(self.top, new_name, inode, Kind::Directory);
                }
            }
            (12 | 13, Some(at)) => {
                let inode = self.nodes[at].inode;
                let data = vec![rng.gen::<u8>(); rng.gen_range(1..3 * 4096)];
                fs.write(inode, rng.gen_range(0..64 << 10), &data).unwrap();
            }
            (14, Some(at)) => {
                let inode = self.nodes[at].inode;
                let changes =
                    SetAttributes { size_bytes: Some(rng.gen_range(0..32 << 10)), ..SetAttributes::default() };
                fs.set_attributes(inode, &changes).unwrap();
            }
            (15, Some(at)) => {
                let inode = self.nodes[at].inode;
                let (offset, length) = (rng.gen_range(0..16) * 4096, rng.gen_range(1..4) * 4096);
                if rng.gen_bool(0.5) {
                    fs.punch_hole(inode, offset, length).unwrap();
                } else {
                    fs.allocate(inode, offset, length, rng.gen_bool(0.5)).unwrap();
                }
            }
            (16, Some(at)) => {
                let value = vec![b'v'; rng.gen_range(1..64)];
                fs.set_xattr(self.nodes[at].inode, b"user.tag", &value, XattrMode::CreateOrReplace).unwrap();
            }
            (17, _) if !self.open_orphans.is_empty() => {
                let inode = self.open_orphans.swap_remove(0);
                fs.release_inode(inode).unwrap();
            }
            _ => {
                let kind = *[Kind::File, Kind::Directory, Kind::Symlink].choose(rng).unwrap();
                let Some(&at) = self.live(kind).choose(rng) else { return };
                let changes = SetAttributes {
                    permissions: Some(rng.gen_range(0..0o7777)),
                    uid: rng.gen_bool(0.3).then(|| rng.gen_range(0..100)),
                    modify_time: Some(TimeToSet::Nanoseconds(rng.gen_range(0..1 << 40))),
                    ..SetAttributes::default()
                };
                fs.set_attributes(self.nodes[at].inode, &changes).unwrap();
            }
        }
    }

    /// Releases every file it kept open.
    fn release_all(&mut self, fs: &FileSystem) {
        for inode in self.open_orphans.drain(..) {
            fs.release_inode(inode).unwrap();
        }
    }
}

/// Requests about one subtree: every name made (alive or removed, by path and by (parent,
/// name)) and every inode, and the top directory itself.
/// The three kinds of request a batch test asks.
struct Requests {
    paths: Vec<Vec<u8>>,
    lookups: Vec<(u64, Vec<u8>)>,
    inodes: Vec<u64>,
}

fn requests_of(own: &Own) -> Requests {
    let mut paths = vec![own.top_path.clone()];
    let mut lookups = Vec::new();
    let mut inodes = vec![own.top];
    for (at, node) in own.nodes.iter().enumerate() {
        paths.push(own.path(at));
        lookups.push((node.parent, node.name.clone()));
        inodes.push(node.inode);
    }
    Requests { paths, lookups, inodes }
}

/// Several threads change their own subtrees (create, mkdir, symlink, link, unlink while open or
/// not, rename, exchange, setattr, truncate, write, punch, allocate, xattr) and ask batches about them between changes: each answer is one the single call gave just
/// before or just after the batch (both hold the thread's own acknowledged changes), and the
/// index answers most of the requests.
fn threads_change_and_ask(options: &MountOptions, engine: IndexEngine, seed: u64, threads: usize, rounds: usize) {
    let (fs, _device) = mount(options);
    let name = fs.install_directory_index(&index_options(engine, 5_000)).unwrap();
    let tops: Vec<(u64, Vec<u8>)> = (0..threads)
        .map(|thread| {
            let top_path = format!("thread-{thread}").into_bytes();
            (fs.make_directory(ROOT_INODE, &top_path, 0o755, 0, 0).unwrap().inode, top_path)
        })
        .collect();
    let before = fs.batch_statistics();
    let asked: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = tops
            .into_iter()
            .enumerate()
            .map(|(thread, (top, top_path))| {
                let fs = fs.clone();
                let name = name.clone();
                scope.spawn(move || {
                    let mut rng = rng(seed * 100 + thread as u64);
                    let mut own = Own { top, top_path, nodes: Vec::new(), open_orphans: Vec::new() };
                    let mut asked = 0;
                    for round in 0..rounds {
                        for _ in 0..rng.gen_range(1..6) {
                            own.change(&fs, &mut rng);
                        }
                        let Requests { paths, lookups, inodes } = requests_of(&own);
                        let shown = |position: usize| {
                            format!("seed {seed}, thread {thread}, round {round}, {name}, request {position}")
                        };
                        let single_before: Vec<_> = paths.iter().map(|path| fs.resolve_path(path)).collect();
                        let batch = fs.resolve_paths(&paths);
                        let single_after: Vec<_> = paths.iter().map(|path| fs.resolve_path(path)).collect();
                        assert_between("resolve", &single_before, &batch, &single_after, &shown);
                        let single_before: Vec<_> =
                            lookups.iter().map(|(parent, name)| fs.lookup(*parent, name)).collect();
                        let batch = fs.lookup_batch(&lookups);
                        let single_after: Vec<_> =
                            lookups.iter().map(|(parent, name)| fs.lookup(*parent, name)).collect();
                        assert_between("lookup", &single_before, &batch, &single_after, &shown);
                        let single_before: Vec<_> = inodes.iter().map(|inode| fs.get_attributes(*inode)).collect();
                        let batch = fs.stat_batch(&inodes);
                        let single_after: Vec<_> = inodes.iter().map(|inode| fs.get_attributes(*inode)).collect();
                        assert_between("stat", &single_before, &batch, &single_after, &shown);
                        asked += paths.len() + lookups.len() + inodes.len();
                    }
                    own.release_all(&fs);
                    asked
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).sum()
    });
    let after = fs.batch_statistics();
    let statistics = fs.directory_index_statistics().unwrap();
    let by_index = after.index_answers - before.index_answers;
    let all = (after.index_answers + after.cpu_answers) - (before.index_answers + before.cpu_answers);
    assert_eq!(all, asked as u64);
    println!("threads, seed {seed}: the index answered {by_index} of {all}; {statistics:?}");
    assert!(statistics.failure.is_none(), "{statistics:?}");
    // Batches shorter than the index's minimum (a young subtree) and symbolic links aside, the
    // index answers: it must not decline its way through the test.
    assert!(by_index * 10 >= all * 6, "seed {seed}: the index answered {by_index} of {all}: {statistics:?}");
    assert!(statistics.records_fed > 0 && statistics.apply_calls > 0, "{statistics:?}");
    fs.unmount().unwrap();
}

#[test]
fn threads_changing_their_trees_see_their_own_changes_in_index_answers() {
    for seed in seeds([3, 4]) {
        threads_change_and_ask(&MountOptions::default(), engine_from_environment(), seed, 4, 60);
    }
}

#[test]
fn threads_with_several_backend_workers_see_their_own_changes() {
    for seed in seeds([5]) {
        threads_change_and_ask(&worker_options(4), engine_from_environment(), seed, 4, 40);
    }
}

/// Changes acknowledged but not applied (no back-end thread): a batch that may not wait is
/// answered by the CPU twin, right; one that may wait drives the back end, and the index
/// answers it once fed, right; the counters say which did what.
#[test]
fn requests_in_a_directory_with_unapplied_changes_are_answered_right() {
    let (fs, _device) = mount(&inline_options());
    let mut rng = rng(9);
    let tree = build_tree(&fs, &mut rng, 30);
    fs.run_backend().unwrap();
    fs.install_directory_index(&index_options(engine_from_environment(), 0)).unwrap();
    fs.run_backend().unwrap();
    wait_until_learnt(&fs, tree.directories);
    let directory = fs.make_directory(ROOT_INODE, b"changing", 0o755, 0, 0).unwrap().inode;
    let files: Vec<u64> = (0..40)
        .map(|number| {
            fs.create(directory, format!("f{number}").as_bytes(), FileType::Regular, 0o600, 0, 0, 0).unwrap().inode
        })
        .collect();
    fs.run_backend().unwrap();
    let lookups: Vec<(u64, Vec<u8>)> = (0..60).map(|number| (directory, format!("f{number}").into_bytes())).collect();
    let paths: Vec<Vec<u8>> = lookups.iter().map(|(_, name)| [b"changing/".as_slice(), name].concat()).collect();
    let asked = (lookups.len() + paths.len() + files.len()) as u64;
    let ask = |expected_by_index: u64, what: &str| {
        let before = fs.batch_statistics();
        let batches = (fs.lookup_batch(&lookups), fs.resolve_paths(&paths), fs.stat_batch(&files));
        let after = fs.batch_statistics();
        let singles = (
            lookups.iter().map(|(parent, name)| fs.lookup(*parent, name)).collect::<Vec<_>>(),
            paths.iter().map(|path| fs.resolve_path(path)).collect::<Vec<_>>(),
            files.iter().map(|inode| fs.get_attributes(*inode)).collect::<Vec<_>>(),
        );
        let shown = |position: usize| format!("{what}, request {position}");
        assert_between("lookup", &singles.0, &batches.0, &singles.0, &shown);
        assert_between("resolve", &singles.1, &batches.1, &singles.1, &shown);
        assert_between("stat", &singles.2, &batches.2, &singles.2, &shown);
        let by_index = after.index_answers - before.index_answers;
        assert_eq!(by_index, expected_by_index, "{what}: answers of the index");
    };
    // Fed and applied: the index answers (the feeder may need a moment after run_backend).
    wait_for_index(&fs, &lookups);
    ask(asked, "applied");
    // Unapplied: a new name, a removed one, a changed mode.
    fs.create(directory, b"f50", FileType::Regular, 0o600, 0, 0, 0).unwrap();
    fs.unlink(directory, b"f3").unwrap();
    fs.set_attributes(files[7], &SetAttributes { permissions: Some(0o444), ..SetAttributes::default() }).unwrap();
    let declined = fs.directory_index_statistics().unwrap().batches_declined;
    ask(0, "unapplied, no wait");
    assert_eq!(fs.directory_index_statistics().unwrap().batches_declined, declined + 3);
    // The same with a wait allowed: the batch applies the backlog itself and the index answers.
    fs.install_directory_index(&index_options(engine_from_environment(), 10_000)).unwrap();
    fs.run_backend().unwrap();
    wait_until_learnt(&fs, tree.directories + 1);
    fs.create(directory, b"f51", FileType::Regular, 0o600, 0, 0, 0).unwrap();
    fs.unlink(directory, b"f4").unwrap();
    // Two files are gone (freed): the index knows nothing of them, the CPU says NotFound.
    ask(asked - 2, "unapplied, waited");
    assert!(fs.directory_index_statistics().unwrap().batches_waited >= 1);
    fs.unmount().unwrap();
}

/// The CPU twin behind two switches on its `apply`: `fail` makes it fail, `stall` makes it
/// wait while set (at most 20 s). Everything else is the twin's.
struct SwitchedIndex {
    twin: CpuDirectoryIndex,
    fail: AtomicBool,
    stall: AtomicBool,
}

impl SwitchedIndex {
    fn new(fail: bool, stall: bool) -> SwitchedIndex {
        let twin = CpuDirectoryIndex::new(ROOT_INODE, 1).unwrap();
        SwitchedIndex { twin, fail: AtomicBool::new(fail), stall: AtomicBool::new(stall) }
    }
}

impl DirectoryIndex for SwitchedIndex {
    fn name(&self) -> String {
        format!("switched {}", self.twin.name())
    }
    fn root(&self) -> u64 {
        self.twin.root()
    }
    fn apply(&self, updates: &[IndexUpdate]) -> tandem_accel::error::Result<ApplyReport> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.stall.load(Ordering::Relaxed) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.fail.load(Ordering::Relaxed) {
            return Err(tandem_accel::error::AccelError::Device("the test's index failed".into()));
        }
        self.twin.apply(updates)
    }
    fn lookup(&self, requests: &[(u64, &[u8])]) -> tandem_accel::error::Result<Vec<LookupResult>> {
        self.twin.lookup(requests)
    }
    fn resolve(&self, paths: &[&[u8]], credentials: Credentials) -> tandem_accel::error::Result<Vec<ResolveResult>> {
        self.twin.resolve(paths, credentials)
    }
    fn stat(&self, inodes: &[u64]) -> tandem_accel::error::Result<Vec<StatResult>> {
        self.twin.stat(inodes)
    }
    fn list(&self, directory: u64) -> tandem_accel::error::Result<ListResult> {
        self.twin.list(directory)
    }
    fn create_entries(
        &self,
        requests: &[tandem_accel::dirindex::CreateEntry<'_>],
    ) -> tandem_accel::error::Result<Vec<tandem_accel::dirindex::CreateResult>> {
        self.twin.create_entries(requests)
    }
}

/// An index whose `apply` fails stops the feed: from then on every batch is the CPU twin's
/// (counted as index failures), right, and the statistics say why.
#[test]
fn a_failing_index_is_left_and_the_cpu_twin_answers() {
    let (fs, _device) = mount(&MountOptions::default());
    let mut rng = rng(31);
    let tree = build_tree(&fs, &mut rng, 40);
    let index = Arc::new(SwitchedIndex::new(false, false));
    assert!(fs.install_directory_index_with(index.clone(), 16, 2_000).unwrap().starts_with("switched"));
    wait_until_learnt(&fs, tree.directories);
    let lookups: Vec<(u64, Vec<u8>)> = tree.entries.clone();
    wait_for_index(&fs, &lookups);
    index.fail.store(true, Ordering::Relaxed);
    fs.create(ROOT_INODE, b"after the failure", FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.rename(ROOT_INODE, b"after the failure", ROOT_INODE, b"renamed", RenameMode::Replace).unwrap();
    let before = fs.batch_statistics();
    let answers = fs.lookup_batch(&lookups);
    let after = fs.batch_statistics();
    let single: Vec<_> = lookups.iter().map(|(parent, name)| fs.lookup(*parent, name)).collect();
    assert_between("lookup", &single, &answers, &single, &|position| format!("request {position}"));
    assert_eq!(after.index_failures - before.index_failures, 1);
    assert_eq!(after.index_answers, before.index_answers);
    let statistics = fs.directory_index_statistics().unwrap();
    assert!(statistics.failure.as_deref().unwrap_or("").contains("the test's index failed"), "{statistics:?}");
    fs.unmount().unwrap();
}

/// An index that stops taking updates fills the feed's queue; the back end then waits for room
/// a bounded time (2 s), the feed fails instead of dropping records, the changes all succeed,
/// and every later batch is the CPU twin's, right.
#[test]
fn a_stalled_index_fails_its_feed_after_a_bounded_wait() {
    let (fs, _device) = mount(&MountOptions::default());
    let index = Arc::new(SwitchedIndex::new(false, true));
    fs.install_directory_index_with(index.clone(), 16, 100).unwrap();
    let started = Instant::now();
    let directories: Vec<u64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|thread| {
                let fs = fs.clone();
                scope.spawn(move || {
                    let top =
                        fs.make_directory(ROOT_INODE, format!("d{thread}").as_bytes(), 0o755, 0, 0).unwrap().inode;
                    // More records than the queue holds (65536), between the four threads.
                    for number in 0..17_000 {
                        fs.create(top, format!("f{number}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
                    }
                    top
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    fs.checkpoint().unwrap();
    index.stall.store(false, Ordering::Relaxed);
    let statistics = fs.directory_index_statistics().unwrap();
    assert!(statistics.failure.as_deref().unwrap_or("").contains("fell behind"), "{statistics:?}");
    assert!(started.elapsed() < Duration::from_secs(20), "the back end waited {:?}", started.elapsed());
    // Enough requests for the index's minimum batch (16): 4 made and 1 missing per directory.
    let names: [&[u8]; 5] = [b"f0", b"f1", b"f8000", b"f16999", b"no"];
    let lookups: Vec<(u64, Vec<u8>)> =
        directories.iter().flat_map(|top| names.iter().map(|name| (*top, name.to_vec()))).collect();
    let before = fs.batch_statistics();
    let answers = fs.lookup_batch(&lookups);
    let after = fs.batch_statistics();
    let single: Vec<_> = lookups.iter().map(|(parent, name)| fs.lookup(*parent, name)).collect();
    assert_between("lookup", &single, &answers, &single, &|position| format!("request {position}"));
    assert!(answers.iter().filter(|answer| answer.is_ok()).count() == 16, "{answers:?}");
    assert_eq!((after.index_failures - before.index_failures, after.index_answers - before.index_answers), (1, 0));
    fs.unmount().unwrap();
}

/// `GpuOrCpu` takes the CPU twin where no GPU opens (and the GPU where one does).
#[test]
fn gpu_or_cpu_takes_the_twin_without_a_gpu() {
    let (fs, _device) = mount(&MountOptions::default());
    let gpu = fs.install_directory_index(&index_options(IndexEngine::Gpu, 0));
    let either = fs.install_directory_index(&index_options(IndexEngine::GpuOrCpu, 0)).unwrap();
    match gpu {
        Ok(name) => assert_eq!(either.split(':').next(), name.split(':').next(), "a GPU opened: {name}"),
        Err(error) => {
            println!("no GPU ({error:?}): GpuOrCpu took {either}");
            assert!(either.contains("cpu"), "{either}");
        }
    }
    fs.unmount().unwrap();
}

/// Waits (bounded) until a lookup batch is answered by the index.
fn wait_for_index(fs: &FileSystem, lookups: &[(u64, Vec<u8>)]) {
    let deadline = Instant::now() + LEARN_WAIT;
    loop {
        let before = fs.batch_statistics().index_answers;
        fs.lookup_batch(lookups);
        if fs.batch_statistics().index_answers - before == lookups.len() as u64 {
            return;
        }
        assert!(Instant::now() < deadline, "the index never answered: {:?}", fs.directory_index_statistics());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// For the GPU host: the adapter over `GpuDirectoryIndex` against the single calls, on a
/// learnt tree and with threads changing theirs. Skips, saying why, when no GPU opens.
#[test]
fn gpu_adapter_answers_equal_the_single_calls() {
    // Skip only where the machine has no GPU to use (no driver, no device, no NVRTC); a GPU
    // that is there and whose index does not open fails the test with the reason.
    let probe = tandem_accel::dirindex::GpuIndexConfig::for_entries(1024);
    match tandem_accel::dirindex::GpuDirectoryIndex::open(1, probe) {
        Ok(gpu) => drop(gpu),
        Err(error) if error.is_no_gpu() => {
            println!("no GPU: skipped ({error})");
            return;
        }
        Err(error) => panic!("a GPU is present but the directory index did not open: {error}"),
    }
    let (fs, _device) = mount(&MountOptions::default());
    let options = index_options(IndexEngine::Gpu, 5_000);
    let name = fs.install_directory_index(&options).expect("a GPU index opened a moment ago");
    println!("GPU index: {name}");
    fs.unmount().unwrap();
    for seed in [21, 22] {
        let (fs, _device) = mount(&MountOptions::default());
        let mut rng = rng(seed);
        let tree = build_tree(&fs, &mut rng, 300);
        fs.sync().unwrap();
        fs.install_directory_index(&options).unwrap();
        wait_until_learnt(&fs, tree.directories);
        let paths: Vec<Vec<u8>> = (0..20_000).map(|_| random_path(&mut rng, &tree)).collect();
        let lookups: Vec<(u64, Vec<u8>)> =
            (0..20_000).map(|_| tree.entries.choose(&mut rng).unwrap().clone()).collect();
        let inodes: Vec<u64> = (0..20_000).map(|_| *tree.inodes.choose(&mut rng).unwrap()).collect();
        let before = fs.batch_statistics();
        let (resolved, looked_up, statted) =
            (fs.resolve_paths(&paths), fs.lookup_batch(&lookups), fs.stat_batch(&inodes));
        let after = fs.batch_statistics();
        let shown = |position: usize| format!("GPU, seed {seed}, request {position}");
        let single: Vec<_> = paths.iter().map(|path| fs.resolve_path(path)).collect();
        assert_between("resolve", &single, &resolved, &single, &shown);
        let single: Vec<_> = lookups.iter().map(|(parent, name)| fs.lookup(*parent, name)).collect();
        assert_between("lookup", &single, &looked_up, &single, &shown);
        let single: Vec<_> = inodes.iter().map(|inode| fs.get_attributes(*inode)).collect();
        assert_between("stat", &single, &statted, &single, &shown);
        let by_index = after.index_answers - before.index_answers;
        assert!(by_index * 10 >= 60_000 * 8, "GPU answered {by_index} of 60000");
        println!(
            "GPU seed {seed}: {by_index} of 60000 answered by the GPU index; {:?}",
            fs.directory_index_statistics()
        );
        fs.unmount().unwrap();
        threads_change_and_ask(&MountOptions::default(), IndexEngine::Gpu, seed, 4, 40);
    }
}

/// What feeding costs the back end: 4 threads create 5,000 files each (and write 1 KiB to
/// every tenth) with no index and with the CPU twin installed, then the back end is drained;
/// prints creates per second and the back end's apply time. A benchmark, not a check:
/// `cargo test --release -p tandemfs --test dirindex_feed -- --ignored --nocapture bench`.
#[test]
#[ignore]
fn bench_feeding_the_index_beside_the_back_end() {
    const THREADS: usize = 4;
    const FILES: usize = 5_000;
    for round in 0..4 {
        let with_index = round % 2 == 1;
        let (fs, _device) = mount(&MountOptions::default());
        if with_index {
            fs.install_directory_index(&index_options(engine_from_environment(), 200)).unwrap();
        }
        let started = Instant::now();
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let fs = fs.clone();
                scope.spawn(move || {
                    let top =
                        fs.make_directory(ROOT_INODE, format!("t{thread}").as_bytes(), 0o755, 0, 0).unwrap().inode;
                    for number in 0..FILES {
                        let file = fs.create(top, format!("f{number}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0);
                        if number % 10 == 0 {
                            fs.write(file.unwrap().inode, 0, &[7u8; 1024]).unwrap();
                        }
                    }
                });
            }
        });
        let acknowledged = started.elapsed();
        fs.checkpoint().unwrap();
        let applied = started.elapsed();
        let backend = fs.backend_statistics();
        let creates_per_second = (THREADS * FILES) as f64 / acknowledged.as_secs_f64();
        println!(
            "index {with_index}: {creates_per_second:.0} creates/s acknowledged, all applied after {applied:?}, back end applying {:.1} ms; {:?}",
            backend.apply_ns as f64 / 1e6,
            fs.directory_index_statistics()
        );
        fs.unmount().unwrap();
    }
}

/// Batch resolves, lookups and stats through a mount, answered by the CPU twin of the batch
/// API (no index) and by the installed index (`TANDEM_INDEX_ENGINE=gpu` for the GPU), on a
/// tree of `TANDEM_BENCH_DIRECTORIES` (default 100) directories of 100 files; prints requests
/// per second and how many the index answered. A benchmark, not a check:
/// `cargo test --release -p tandemfs --test dirindex_feed -- --ignored --nocapture bench`.
#[test]
#[ignore]
fn bench_batches_through_the_index() {
    let directories: usize =
        std::env::var("TANDEM_BENCH_DIRECTORIES").ok().and_then(|text| text.parse().ok()).unwrap_or(100);
    const FILES: usize = 100;
    const REQUESTS: usize = 200_000;
    let (_memory, device) = memory_volume((directories * FILES * 4096).max(64 << 20) as u64, false);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let mut paths = Vec::new();
    let mut lookups = Vec::new();
    let mut inodes = Vec::new();
    for directory in 0..directories {
        let name = format!("d{directory}");
        let top = fs.make_directory(ROOT_INODE, name.as_bytes(), 0o755, 0, 0).unwrap().inode;
        for file in 0..FILES {
            let file_name = format!("f{file}");
            inodes.push(fs.create(top, file_name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap().inode);
            paths.push(format!("{name}/{file_name}").into_bytes());
            lookups.push((top, file_name.into_bytes()));
        }
    }
    fs.checkpoint().unwrap();
    let mut rng = rng(77);
    let paths: Vec<Vec<u8>> = (0..REQUESTS).map(|_| paths.choose(&mut rng).unwrap().clone()).collect();
    let lookups: Vec<(u64, Vec<u8>)> = (0..REQUESTS).map(|_| lookups.choose(&mut rng).unwrap().clone()).collect();
    let inodes: Vec<u64> = (0..REQUESTS).map(|_| *inodes.choose(&mut rng).unwrap()).collect();
    let run = |what: &str| {
        let before = fs.batch_statistics();
        let started = Instant::now();
        let resolved = fs.resolve_paths(&paths);
        let resolve_time = started.elapsed();
        let started = Instant::now();
        fs.lookup_batch(&lookups);
        let lookup_time = started.elapsed();
        let started = Instant::now();
        fs.stat_batch(&inodes);
        let stat_time = started.elapsed();
        let after = fs.batch_statistics();
        assert!(resolved.iter().all(|answer| answer.is_ok()));
        let rate = |time: Duration| REQUESTS as f64 / time.as_secs_f64() / 1e6;
        println!(
            "{what}: resolve {:.2} M/s, lookup {:.2} M/s, stat {:.2} M/s; {} of {} answered by the index",
            rate(resolve_time),
            rate(lookup_time),
            rate(stat_time),
            after.index_answers - before.index_answers,
            3 * REQUESTS
        );
        resolved
    };
    let by_cpu = run("CPU twin of the batch API");
    let name = fs.install_directory_index(&index_options(engine_from_environment(), 1_000)).unwrap();
    wait_until_learnt(&fs, directories + 1);
    let by_index = run(&format!("index {name}"));
    assert_between("resolve", &by_cpu, &by_index, &by_cpu, &|position| format!("request {position}"));
    fs.unmount().unwrap();
}

/// Creates logged as `CreateBatch` records reach the index like single creates: files and
/// directories made by `create_batch` in directories the index holds whole are answered by the
/// index (lookups, resolves and stats, every one), equal to the single calls, and a name the
/// batch did not make is a `NotFound` from the index, not the CPU.
#[test]
fn creates_of_a_create_batch_are_fed_and_answered_by_the_index() {
    let (fs, _device) = mount(&MountOptions::default());
    fs.install_directory_index(&index_options(engine_from_environment(), 10_000)).unwrap();
    let parents: Vec<u64> = (0..5)
        .map(|serial| fs.make_directory(ROOT_INODE, format!("b{serial}").as_bytes(), 0o755, 0, 0).unwrap().inode)
        .collect();
    let names: Vec<Vec<u8>> = (0..3000).map(|serial| format!("c{serial}").into_bytes()).collect();
    let requests: Vec<CreateRequest> = (0..3000)
        .map(|serial| CreateRequest {
            parent: parents[serial % parents.len()],
            name: &names[serial],
            file_type: if serial % 9 == 0 { FileType::Directory } else { FileType::Regular },
            permissions: 0o600,
            uid: 5,
            gid: 6,
            rdev: 0,
        })
        .collect();
    assert!(fs.create_batch(&requests).iter().all(|made| made.is_ok()));
    let mut lookups: Vec<(u64, Vec<u8>)> =
        (0..3000).map(|serial| (parents[serial % parents.len()], names[serial].clone())).collect();
    lookups.push((parents[0], b"never-made".to_vec()));
    wait_for_index(&fs, &lookups);
    let paths: Vec<Vec<u8>> =
        (0..3000).map(|serial| format!("b{}/c{serial}", serial % parents.len()).into_bytes()).collect();
    let before = fs.batch_statistics();
    let (looked_up, resolved) = (fs.lookup_batch(&lookups), fs.resolve_paths(&paths));
    let inodes: Vec<u64> = resolved.iter().map(|found| found.as_ref().unwrap().inode).collect();
    let stated = fs.stat_batch(&inodes);
    let by_index = fs.batch_statistics().index_answers - before.index_answers;
    assert_eq!(by_index, (lookups.len() + paths.len() + inodes.len()) as u64, "every answer from the index");
    for (position, (parent, name)) in lookups.iter().enumerate() {
        assert!(same(&looked_up[position], &fs.lookup(*parent, name)), "lookup {position}");
    }
    for (position, path) in paths.iter().enumerate() {
        assert!(same(&resolved[position], &fs.resolve_path(path)), "resolve {position}");
        assert!(same(&stated[position], &fs.get_attributes(inodes[position])), "stat {position}");
    }
    assert!(matches!(looked_up.last(), Some(Err(Error::NotFound))));
    fs.unmount().unwrap();
}

/// Names and types of a directory, sorted (without `.` and `..`).
fn listing(fs: &FileSystem, directory: u64) -> Vec<(Vec<u8>, FileType)> {
    let mut entries = Vec::new();
    fs.read_directory(directory, 0, &mut |entry| {
        if entry.name != b"." && entry.name != b".." {
            entries.push((entry.name.clone(), entry.file_type));
        }
        true
    })
    .unwrap();
    entries.sort_by(|left, right| left.0.cmp(&right.0));
    entries
}

/// Lets the index catch up with everything acknowledged: a lookup batch long enough for the
/// index waits for the feed (up to the options' catch-up wait).
fn let_the_index_catch_up(fs: &FileSystem, directory: u64) {
    let lookups: Vec<(u64, Vec<u8>)> =
        (0..32).map(|serial| (directory, format!("probe{serial}").into_bytes())).collect();
    fs.lookup_batch(&lookups);
}

/// `create_batch` with the index deciding which names are free (claims settled once the
/// record is logged) leaves the tree the single creates leave, answer for answer: two mounts,
/// the same random batches (names already there, names twice in a batch, files and
/// directories, a parent that is a file), one with the CPU twin of the index installed and one
/// without. The index must have decided names (claimed some, found some taken), and after the
/// batches its answers equal the single calls.
#[test]
fn create_batches_decided_by_the_index_equal_single_creates() {
    let (with_index, _device_a) = mount(&MountOptions::default());
    let (without, _device_b) = mount(&MountOptions::default());
    with_index.install_directory_index(&index_options(engine_from_environment(), 10_000)).unwrap();
    let mut parents: Vec<(u64, u64)> = Vec::new();
    for serial in 0..6 {
        let name = format!("p{serial}").into_bytes();
        let a = with_index.make_directory(ROOT_INODE, &name, 0o755, 0, 0).unwrap().inode;
        let b = without.make_directory(ROOT_INODE, &name, 0o755, 0, 0).unwrap().inode;
        parents.push((a, b));
    }
    let file_a = with_index.create(ROOT_INODE, b"plain", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let file_b = without.create(ROOT_INODE, b"plain", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    parents.push((file_a, file_b));
    let mut rng = rng(41);
    for round in 0..12 {
        // Even rounds: one directory, one group of at most 512 (the index decides all of it
        // once caught up); odd rounds: spread over the directories, several groups (those
        // that find the feed behind the batch's own records are decided by the front end).
        let count = if round % 2 == 0 { 500 } else { 1500 };
        let picks: Vec<(usize, Vec<u8>, FileType)> = (0..count)
            .map(|_| {
                let parent = match (round % 2, rng.gen_range(0..100)) {
                    (_, 0) => parents.len() - 1,
                    (0, _) => (round / 2) % 6,
                    _ => rng.gen_range(0..6),
                };
                let name = format!("n{}", rng.gen_range(0..600)).into_bytes();
                let file_type = if rng.gen_range(0..6) == 0 { FileType::Directory } else { FileType::Regular };
                (parent, name, file_type)
            })
            .collect();
        let requests = |side: usize| -> Vec<CreateRequest<'_>> {
            picks
                .iter()
                .map(|(parent, name, file_type)| CreateRequest {
                    parent: if side == 0 { parents[*parent].0 } else { parents[*parent].1 },
                    name,
                    file_type: *file_type,
                    permissions: 0o640,
                    uid: 7,
                    gid: 8,
                    rdev: 0,
                })
                .collect()
        };
        let_the_index_catch_up(&with_index, parents[0].0);
        let answered = with_index.create_batch(&requests(0));
        let expected = without.create_batch(&requests(1));
        for (position, (got, wanted)) in answered.iter().zip(&expected).enumerate() {
            match (got, wanted) {
                (Ok(got), Ok(wanted)) => {
                    assert_eq!(
                        (got.file_type, got.permissions),
                        (wanted.file_type, wanted.permissions),
                        "{round} {position}"
                    )
                }
                (Err(got), Err(wanted)) => assert_eq!(format!("{got:?}"), format!("{wanted:?}"), "{round} {position}"),
                _ => panic!("round {round} request {position}: {got:?} against {wanted:?}"),
            }
        }
    }
    for (a, b) in &parents[..6] {
        assert_eq!(listing(&with_index, *a), listing(&without, *b), "the trees differ");
    }
    let statistics = with_index.directory_index_statistics().unwrap();
    println!("{statistics:?}");
    assert!(statistics.create_groups_claimed > 0, "the index decided no group: {statistics:?}");
    assert!(statistics.names_claimed > 300 && statistics.names_found_taken > 500, "{statistics:?}");
    // The index's answers about the made names equal the single calls.
    let lookups: Vec<(u64, Vec<u8>)> =
        (0..600).map(|serial| (parents[serial % 6].0, format!("n{serial}").into_bytes())).collect();
    wait_for_index(&with_index, &lookups);
    let before = with_index.batch_statistics().index_answers;
    let looked_up = with_index.lookup_batch(&lookups);
    assert!(with_index.batch_statistics().index_answers - before >= 500, "the index answered the lookups");
    for (position, (parent, name)) in lookups.iter().enumerate() {
        assert!(same(&looked_up[position], &with_index.lookup(*parent, name)), "lookup {position}");
    }
    with_index.unmount().unwrap();
    without.unmount().unwrap();
}

/// Create batches decided by the index while other threads unlink the same names: every name
/// is made and removed in turns, so per name the successful creates less the successful
/// unlinks (plus 1 if it existed at the start) is 0 or 1 at the end, and it is 1 exactly when
/// the name exists. A claim that brought back a name an acknowledged unlink removed (or a
/// create allowed on a name that existed) breaks the count.
#[test]
fn create_batches_and_unlinks_of_the_same_names_keep_count() {
    let (fs, _device) = mount(&MountOptions::default());
    fs.install_directory_index(&index_options(engine_from_environment(), 10_000)).unwrap();
    let directories: Vec<u64> = (0..4)
        .map(|serial| fs.make_directory(ROOT_INODE, format!("u{serial}").as_bytes(), 0o755, 0, 0).unwrap().inode)
        .collect();
    const NAMES: usize = 300;
    let names: Vec<Vec<u8>> = (0..NAMES).map(|serial| format!("x{serial}").into_bytes()).collect();
    let key = |directory: usize, name: usize| directory * NAMES + name;
    let mut initial = vec![0i64; directories.len() * NAMES];
    for directory in 0..directories.len() {
        for name in (0..NAMES).step_by(2) {
            fs.create(directories[directory], &names[name], FileType::Regular, 0o644, 0, 0, 0).unwrap();
            initial[key(directory, name)] = 1;
        }
    }
    let creates: Vec<std::sync::atomic::AtomicI64> = (0..initial.len()).map(|_| Default::default()).collect();
    let unlinks: Vec<std::sync::atomic::AtomicI64> = (0..initial.len()).map(|_| Default::default()).collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for thread in 0..2u64 {
            let (fs, names, directories, unlinks, stop) = (&fs, &names, &directories, &unlinks, &stop);
            scope.spawn(move || {
                let mut rng = rng(100 + thread);
                // Bounded by the creators' rounds (they set `stop`) and a count.
                for _ in 0..2_000_000 {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let (directory, name) = (rng.gen_range(0..directories.len()), rng.gen_range(0..NAMES));
                    if fs.unlink(directories[directory], &names[name]).is_ok() {
                        unlinks[key(directory, name)].fetch_add(1, Ordering::Relaxed);
                    }
                    // A pause after each, so that the feed catches up with the unlinks at times
                    // and the index decides some groups (it declines while it is behind).
                    std::thread::sleep(Duration::from_micros(rng.gen_range(0..1000)));
                }
            });
        }
        let creators: Vec<_> = (0..2u64)
            .map(|thread| {
                let (fs, names, directories, creates) = (&fs, &names, &directories, &creates);
                scope.spawn(move || {
                    let mut rng = rng(200 + thread);
                    // At least 30 batches each, and on until the index decided a few groups (it declines
                    // while the feed is behind the unlinks), 300 at most.
                    for batch in 0..300 {
                        let decided = fs.directory_index_statistics().unwrap().create_groups_claimed;
                        if batch >= 30 && decided >= 5 {
                            break;
                        }
                        let picks: Vec<(usize, usize)> =
                            (0..400).map(|_| (rng.gen_range(0..directories.len()), rng.gen_range(0..NAMES))).collect();
                        let requests: Vec<CreateRequest<'_>> = picks
                            .iter()
                            .map(|(directory, name)| CreateRequest {
                                parent: directories[*directory],
                                name: &names[*name],
                                file_type: FileType::Regular,
                                permissions: 0o600,
                                uid: 0,
                                gid: 0,
                                rdev: 0,
                            })
                            .collect();
                        for ((directory, name), made) in picks.iter().zip(fs.create_batch(&requests)) {
                            match made {
                                Ok(_) => {
                                    creates[key(*directory, *name)].fetch_add(1, Ordering::Relaxed);
                                }
                                Err(Error::Exists) => {}
                                Err(error) => panic!("create: {error:?}"),
                            }
                        }
                        let_the_index_catch_up(fs, directories[0]);
                    }
                })
            })
            .collect();
        // The unlinkers run until the creators are done.
        for creator in creators {
            creator.join().expect("creator thread");
        }
        stop.store(true, Ordering::Release);
    });
    for (directory, inode) in directories.iter().enumerate() {
        let present: std::collections::HashSet<Vec<u8>> =
            listing(&fs, *inode).into_iter().map(|(name, _)| name).collect();
        for (name, bytes) in names.iter().enumerate() {
            let k = key(directory, name);
            let count = initial[k] + creates[k].load(Ordering::Relaxed) - unlinks[k].load(Ordering::Relaxed);
            assert!(count == 0 || count == 1, "{directory}/{name}: count {count}");
            assert_eq!(present.contains(bytes), count == 1, "{directory}/{name}");
        }
    }
    let statistics = fs.directory_index_statistics().unwrap();
    println!("{statistics:?}");
    assert!(statistics.create_groups_claimed >= 5 && statistics.names_claimed > 0, "{statistics:?}");
    fs.unmount().unwrap();
}
