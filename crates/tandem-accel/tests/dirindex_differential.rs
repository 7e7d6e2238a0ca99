//! Issue 9: the GPU directory index against its CPU twin. Random trees (size from
//! `TANDEM_DIRINDEX_ENTRIES`, default 200000, up to 10M), the same random updates applied to
//! both, then random lookups, resolves, stats and lists compared answer for answer, including
//! batches from several host threads at once. Without a GPU (no driver, no device, no NVRTC)
//! it prints "no GPU: skipped" and passes; a GPU that is there and whose index does not open
//! (NVRTC or ptxas refusing the kernel, memory, a launch) fails the test with the reason; the same generator also runs twin against twin (1 thread against all) so CI checks
//! the harness itself. Seeded: each seed is printed; `TANDEM_SEED=N` runs that seed alone.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use tandem_accel::dirindex::{
    CpuDirectoryIndex, CreateEntry, CreateResult, Credentials, DirectoryIndex, GpuDirectoryIndex, GpuIndexConfig,
    IndexAttributes, IndexKind, IndexUpdate, ListResult, LookupResult, ResolveResult, Settle, SettleResult, StatResult,
    MAXIMUM_NAME_BYTES,
};

const ROOT: u64 = 1;
/// One GPU index at a time in this process: opening one allocates device and pinned memory,
/// which CUDA may order behind work already running — another index's kernel never finishes.
static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
const DEFAULT_ENTRIES: usize = 200_000;
const MAXIMUM_ENTRIES: usize = 10_000_000;
/// Updates per apply call while building (several commands each on the GPU).
const BUILD_BATCH: usize = 250_000;
const CREDENTIALS: [Credentials; 4] = [
    Credentials { uid: 0, gid: 0 },
    Credentials { uid: 1000, gid: 100 },
    Credentials { uid: 1001, gid: 100 },
    Credentials { uid: 1002, gid: 200 },
];

/// The GPU index, or None (after printing why) when the machine has no GPU to use. Any other
/// failure to open fails the test: a kernel that does not compile or launch on a GPU that is
/// there must never read as "no GPU" (it once hid a kernel the host's NVRTC refused).
fn open_gpu_or_skip(config: GpuIndexConfig) -> Option<GpuDirectoryIndex> {
    match GpuDirectoryIndex::open(ROOT, config) {
        Ok(gpu) => Some(gpu),
        Err(tandem_accel::AccelError::NoGpu(reason)) => {
            println!("no GPU: skipped ({reason})");
            None
        }
        Err(error) => panic!("a GPU is present but the directory index did not open: {error}"),
    }
}

fn seeds(default: impl IntoIterator<Item = u64>) -> Vec<u64> {
    match std::env::var("TANDEM_SEED") {
        Ok(seed) => vec![seed.parse().expect("TANDEM_SEED is a number")],
        Err(_) => default.into_iter().collect(),
    }
}

fn entries_wanted() -> usize {
    let entries = std::env::var("TANDEM_DIRINDEX_ENTRIES")
        .ok()
        .map(|text| text.parse::<usize>().expect("TANDEM_DIRINDEX_ENTRIES is a number"))
        .unwrap_or(DEFAULT_ENTRIES);
    assert!((100..=MAXIMUM_ENTRIES).contains(&entries), "TANDEM_DIRINDEX_ENTRIES must be 100..=10M");
    entries
}

/// A name of 1..=255 bytes, any byte but '/' and NUL, never "." or ".."; mostly short.
fn random_name(rng: &mut StdRng) -> Vec<u8> {
    let length = match rng.gen_range(0..20) {
        0 => MAXIMUM_NAME_BYTES - rng.gen_range(0..3),
        1 => rng.gen_range(1..=MAXIMUM_NAME_BYTES),
        2..=4 => rng.gen_range(1..=8),
        _ => rng.gen_range(4..=24),
    };
    loop {
        let name: Vec<u8> = (0..length)
            .map(|_| if rng.gen_bool(0.8) { rng.gen_range(b'a'..=b'z') } else { rng.gen_range(1..=255u8) })
            .map(|byte| if byte == b'/' { b'_' } else { byte })
            .collect();
        if name != b"." && name != b".." {
            return name;
        }
    }
}

fn random_permissions(rng: &mut StdRng) -> u32 {
    match rng.gen_range(0..10) {
        0 => 0o700,
        1 => 0o711,
        2 => 0o070,
        3 => 0o000,
        4 => 0o751,
        _ => 0o755,
    }
}

fn random_attributes(rng: &mut StdRng, inode: u64, kind: IndexKind, parent: u64) -> IndexAttributes {
    IndexAttributes {
        inode,
        generation: rng.gen(),
        size_bytes: rng.gen(),
        blocks_512: rng.gen(),
        atime_ns: rng.gen(),
        mtime_ns: rng.gen(),
        ctime_ns: rng.gen(),
        btime_ns: rng.gen(),
        rdev: rng.gen(),
        parent: if kind == IndexKind::Directory { parent } else { 0 },
        kind,
        permissions: if kind == IndexKind::Directory { random_permissions(rng) } else { rng.gen_range(0..=0o7777) },
        uid: 1000 + rng.gen_range(0..3),
        gid: if rng.gen_bool(0.5) { 100 } else { 200 },
        link_count: rng.gen_range(1..5),
        reserved: 0,
    }
}

/// What the generator knows of the tree (to make paths and updates that mostly hit).
struct Tree {
    directories: Vec<u64>,
    directory_set: HashSet<u64>,
    children: HashMap<u64, Vec<(Vec<u8>, u64)>>,
    names: HashSet<(u64, Vec<u8>)>,
    next_inode: u64,
    /// One directory with many entries (lists that take several commands), 0 before build.
    wide: u64,
}

impl Tree {
    fn new() -> Self {
        Tree {
            directories: vec![ROOT],
            directory_set: HashSet::from([ROOT]),
            children: HashMap::new(),
            names: HashSet::new(),
            next_inode: ROOT + 1,
            wide: 0,
        }
    }

    /// A parent biased to recent directories, so trees get deep.
    fn random_directory(&self, rng: &mut StdRng) -> u64 {
        let count = self.directories.len();
        if rng.gen_bool(0.5) {
            self.directories[count - 1 - rng.gen_range(0..count.min(16))]
        } else {
            self.directories[rng.gen_range(0..count)]
        }
    }

    /// A new child: its entry, usually its attributes, and for directories usually `complete`.
    fn add_child(&mut self, rng: &mut StdRng, updates: &mut Vec<IndexUpdate>) {
        let parent = self.random_directory(rng);
        let name = (0..16).map(|_| random_name(rng)).find(|name| !self.names.contains(&(parent, name.clone())));
        let Some(name) = name else { return };
        let inode = self.next_inode;
        self.next_inode += 1;
        let kind = match rng.gen_range(0..100) {
            0..=14 => IndexKind::Directory,
            15..=19 => IndexKind::Symlink,
            20 => IndexKind::Other,
            _ => IndexKind::File,
        };
        updates.push(IndexUpdate::InsertEntry { parent, name: name.clone(), child: inode });
        if rng.gen_range(0..100) < 97 {
            updates.push(IndexUpdate::SetAttributes(random_attributes(rng, inode, kind, parent)));
        }
        if kind == IndexKind::Directory {
            self.directories.push(inode);
            self.directory_set.insert(inode);
            if rng.gen_range(0..100) < 85 {
                updates.push(IndexUpdate::MarkComplete(inode));
            }
        }
        self.children.entry(parent).or_default().push((name.clone(), inode));
        self.names.insert((parent, name));
    }

    fn random_entry(&self, rng: &mut StdRng) -> Option<(u64, Vec<u8>, u64)> {
        let parent = self.random_directory(rng);
        let children = self.children.get(&parent)?;
        let (name, child) = &children[rng.gen_range(0..children.len())];
        Some((parent, name.clone(), *child))
    }

    /// A path that walks the tree, with '.', '..', empty components, misses, names too long
    /// and trailing slashes sprinkled in, or now and then plain noise.
    fn random_path(&self, rng: &mut StdRng) -> Vec<u8> {
        if rng.gen_range(0..40) == 0 {
            let length = rng.gen_range(0..64);
            return (0..length).map(|_| if rng.gen_bool(0.3) { b'/' } else { rng.gen_range(b'a'..=b'c') }).collect();
        }
        let mut path = Vec::new();
        if rng.gen_bool(0.7) {
            path.push(b'/');
        }
        let mut current = ROOT;
        let depth = rng.gen_range(0..8);
        for _ in 0..depth {
            // Mostly stop at a non-directory (the rest checks NotDirectory).
            if !self.directory_set.contains(&current) && rng.gen_bool(0.9) {
                break;
            }
            let component: Vec<u8> = match rng.gen_range(0..30) {
                0 => b".".to_vec(),
                1 => b"..".to_vec(),
                2 => Vec::new(),
                3 => random_name(rng),
                4 => vec![b'x'; MAXIMUM_NAME_BYTES + 1],
                _ => match self.children.get(&current) {
                    Some(children) => {
                        // Prefer subdirectories, so walks go deep.
                        let pick = (0..8)
                            .map(|_| &children[rng.gen_range(0..children.len())])
                            .find(|(_, child)| self.directory_set.contains(child))
                            .filter(|_| rng.gen_bool(0.7))
                            .unwrap_or(&children[rng.gen_range(0..children.len())]);
                        current = pick.1;
                        pick.0.clone()
                    }
                    None => random_name(rng),
                },
            };
            path.extend_from_slice(&component);
            path.push(b'/');
        }
        if !path.is_empty() && rng.gen_bool(0.7) {
            path.pop();
        }
        path
    }
}

/// Random changes: removals, new children, attribute changes (permissions too), completeness
/// flips, inode removals, drops, and the same key changed several times in one batch.
fn random_updates(rng: &mut StdRng, tree: &mut Tree, count: usize) -> Vec<IndexUpdate> {
    let mut updates = Vec::with_capacity(count);
    while updates.len() < count {
        match rng.gen_range(0..100) {
            0..=29 => tree.add_child(rng, &mut updates),
            30..=44 => {
                if let Some((parent, name, _)) = tree.random_entry(rng) {
                    updates.push(IndexUpdate::RemoveEntry { parent, name });
                }
            }
            45..=59 => {
                let inode = rng.gen_range(ROOT..tree.next_inode);
                let kind = if tree.directories.contains(&inode) { IndexKind::Directory } else { IndexKind::File };
                updates.push(IndexUpdate::SetAttributes(random_attributes(rng, inode, kind, ROOT)));
            }
            60..=64 => updates.push(IndexUpdate::RemoveInode(rng.gen_range(ROOT..tree.next_inode))),
            65..=72 => updates.push(IndexUpdate::MarkIncomplete(tree.random_directory(rng))),
            73..=84 => updates.push(IndexUpdate::MarkComplete(tree.random_directory(rng))),
            85..=86 => updates.push(IndexUpdate::DropDirectory(tree.random_directory(rng))),
            _ => {
                // One key, changed again and again in one batch: order must hold.
                if let Some((parent, name, child)) = tree.random_entry(rng) {
                    updates.push(IndexUpdate::RemoveEntry { parent, name: name.clone() });
                    updates.push(IndexUpdate::InsertEntry { parent, name: name.clone(), child: child + 1 });
                    updates.push(IndexUpdate::InsertEntry { parent, name, child });
                    updates.push(IndexUpdate::MarkIncomplete(parent));
                    updates.push(IndexUpdate::MarkComplete(parent));
                }
            }
        }
    }
    updates
}

fn build(rng: &mut StdRng, entries: usize, indexes: &[&dyn DirectoryIndex]) -> Tree {
    let mut tree = Tree::new();
    let mut root = random_attributes(rng, ROOT, IndexKind::Directory, ROOT);
    root.permissions = 0o755;
    let mut updates = vec![IndexUpdate::SetAttributes(root), IndexUpdate::MarkComplete(ROOT)];
    let mut added = 0;
    while added < entries {
        tree.add_child(rng, &mut updates);
        added += 1;
        if updates.len() >= BUILD_BATCH || added == entries {
            apply_everywhere(indexes, &updates);
            updates.clear();
        }
    }
    add_wide_directory(rng, &mut tree, (entries / 4).min(100_000), indexes);
    tree
}

fn add_wide_directory(rng: &mut StdRng, tree: &mut Tree, children: usize, indexes: &[&dyn DirectoryIndex]) {
    let wide = tree.next_inode;
    tree.next_inode += 1 + children as u64;
    tree.wide = wide;
    let mut attributes = random_attributes(rng, wide, IndexKind::Directory, ROOT);
    attributes.permissions = 0o755;
    let mut updates = vec![
        IndexUpdate::SetAttributes(attributes),
        IndexUpdate::InsertEntry { parent: ROOT, name: b"wide".to_vec(), child: wide },
        IndexUpdate::MarkComplete(wide),
    ];
    let mut names = HashSet::new();
    for child in 1..=children as u64 {
        let name = random_name(rng);
        if names.insert(name.clone()) {
            updates.push(IndexUpdate::InsertEntry { parent: wide, name: name.clone(), child: wide + child });
            updates.push(IndexUpdate::SetAttributes(random_attributes(rng, wide + child, IndexKind::File, wide)));
            tree.children.entry(wide).or_default().push((name.clone(), wide + child));
            tree.names.insert((wide, name));
        }
    }
    tree.directories.push(wide);
    tree.directory_set.insert(wide);
    tree.children.entry(ROOT).or_default().push((b"wide".to_vec(), wide));
    apply_everywhere(indexes, &updates);
}

fn apply_everywhere(indexes: &[&dyn DirectoryIndex], updates: &[IndexUpdate]) {
    let reports: Vec<_> = indexes.iter().map(|index| index.apply(updates).expect("apply")).collect();
    for (index, report) in indexes.iter().zip(&reports) {
        assert_eq!(report.applied, updates.len(), "{}", index.name());
        assert_eq!(report.overflowed, 0, "{} ran out of room: size the test's tables up", index.name());
    }
}

/// Random lookups: existing entries, misses, names under files, unknown parents, names of
/// every length.
fn random_lookups(rng: &mut StdRng, tree: &Tree, count: usize) -> Vec<(u64, Vec<u8>)> {
    (0..count)
        .map(|_| match rng.gen_range(0..10) {
            0..=4 => tree.random_entry(rng).map(|(parent, name, _)| (parent, name)).unwrap_or((ROOT, b"a".to_vec())),
            5..=6 => (tree.random_directory(rng), random_name(rng)),
            7 => (rng.gen_range(ROOT..tree.next_inode + 10), random_name(rng)),
            8 => (tree.random_directory(rng), vec![rng.gen_range(b'a'..=b'z'); rng.gen_range(1..=MAXIMUM_NAME_BYTES)]),
            _ => (tree.random_directory(rng), b".".to_vec()),
        })
        .collect()
}

fn compare_everything(
    rng: &mut StdRng,
    tree: &Tree,
    reference: &dyn DirectoryIndex,
    other: &dyn DirectoryIndex,
    queries: usize,
) {
    let lookups = random_lookups(rng, tree, queries);
    let borrowed_lookups: Vec<(u64, &[u8])> = lookups.iter().map(|(parent, name)| (*parent, &name[..])).collect();
    let expected_lookups = reference.lookup(&borrowed_lookups).expect("reference lookup");
    let answered = other.lookup(&borrowed_lookups).expect("lookup");
    for (index, request) in borrowed_lookups.iter().enumerate() {
        assert!(
            expected_lookups[index] == answered[index],
            "lookup {request:?}: {:?} vs {:?}",
            expected_lookups[index],
            answered[index]
        );
    }
    let paths: Vec<Vec<u8>> = (0..queries).map(|_| tree.random_path(rng)).collect();
    let borrowed: Vec<&[u8]> = paths.iter().map(|path| &path[..]).collect();
    let mut kinds: HashMap<String, usize> = HashMap::new();
    for credentials in CREDENTIALS {
        let expected = reference.resolve(&borrowed, credentials).expect("reference resolve");
        for answer in &expected {
            let kind = format!("{answer:?}");
            *kinds.entry(kind.split('(').next().unwrap_or("").to_string()).or_default() += 1;
        }
        let answered = other.resolve(&borrowed, credentials).expect("resolve");
        for (index, path) in borrowed.iter().enumerate() {
            assert!(
                expected[index] == answered[index],
                "resolve {:?} as {credentials:?}: {:?} vs {:?}",
                String::from_utf8_lossy(path),
                expected[index],
                answered[index]
            );
        }
    }
    if queries >= 10_000 {
        let mut kinds: Vec<_> = kinds.into_iter().collect();
        kinds.sort();
        println!("  resolve answers: {kinds:?}");
    }
    let inodes: Vec<u64> = (0..queries).map(|_| rng.gen_range(ROOT..tree.next_inode + 10)).collect();
    assert!(reference.stat(&inodes).expect("reference stat") == other.stat(&inodes).expect("stat"), "stats differ");
    let mut directories: Vec<u64> = (0..20).map(|_| tree.random_directory(rng)).collect();
    directories.push(ROOT);
    directories.push(tree.wide);
    directories.push(tree.next_inode + 1);
    for directory in directories {
        let expected = reference.list(directory).expect("reference list");
        let answered = other.list(directory).expect("list");
        assert!(expected == answered, "list {directory}: {} vs {}", describe(&expected), describe(&answered));
    }
    // The `_into` calls answer the same into vectors that hold stale answers of another batch.
    let mut reused_lookups = reference.lookup(&borrowed_lookups[..borrowed_lookups.len() / 3]).unwrap();
    other.lookup_into(&borrowed_lookups, &mut reused_lookups).expect("lookup_into");
    assert!(reused_lookups == expected_lookups, "lookup_into differs from lookup");
    let mut reused_resolves = vec![ResolveResult::NeedsCpu; 7];
    other.resolve_into(&borrowed, CREDENTIALS[1], &mut reused_resolves).expect("resolve_into");
    assert!(reused_resolves == reference.resolve(&borrowed, CREDENTIALS[1]).unwrap(), "resolve_into differs");
    let mut reused_stats = reference.stat(&inodes[..inodes.len() / 2]).unwrap();
    other.stat_into(&inodes, &mut reused_stats).expect("stat_into");
    assert!(reused_stats == reference.stat(&inodes).unwrap(), "stat_into differs from stat");
    // Batches of one (the mapped-memory path on the GPU).
    for (parent, name) in lookups.iter().take(50) {
        let request = [(*parent, &name[..])];
        assert_eq!(reference.lookup(&request).unwrap(), other.lookup(&request).unwrap(), "single lookup");
    }
}

fn describe(list: &ListResult) -> String {
    match list {
        ListResult::Listed(entries) => format!("{} entries", entries.len()),
        ListResult::Unknown => "unknown".into(),
    }
}

/// Several host threads at once: queries against a fixed state, then disjoint updates (each
/// thread its own new directory) racing each other, compared at the end.
fn concurrent_rounds(
    seed: u64,
    tree: &Tree,
    queries: usize,
    reference: &dyn DirectoryIndex,
    other: &dyn DirectoryIndex,
) {
    const THREADS: u64 = 4;
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed * 1000 + thread);
                compare_everything(&mut rng, tree, reference, other, queries);
            });
        }
    });
    let base = tree.next_inode + 1_000_000;
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed * 2000 + thread);
                let directory = base + thread * 10_000;
                let mut updates = vec![
                    IndexUpdate::SetAttributes(random_attributes(&mut rng, directory, IndexKind::Directory, ROOT)),
                    IndexUpdate::InsertEntry {
                        parent: ROOT,
                        name: format!("racer{thread}").into_bytes(),
                        child: directory,
                    },
                    IndexUpdate::MarkComplete(directory),
                ];
                for child in 1..2000 {
                    let inode = directory + child;
                    updates.push(IndexUpdate::InsertEntry {
                        parent: directory,
                        name: random_name(&mut rng),
                        child: inode,
                    });
                    updates.push(IndexUpdate::SetAttributes(random_attributes(
                        &mut rng,
                        inode,
                        IndexKind::File,
                        directory,
                    )));
                }
                for chunk in updates.chunks(700) {
                    reference.apply(chunk).expect("reference apply");
                    other.apply(chunk).expect("apply");
                }
                assert!(reference.list(directory).unwrap() == other.list(directory).unwrap(), "racer {thread} list");
            });
        }
    });
}

/// Batches of 0, 1, 2, 31 and 32 requests of every kind through the trait (the GPU engine sends
/// them the express way), a path of 3,001 bytes (past the KiB the kernel loads with the
/// command) and a lone "/", against the reference.
fn compare_small_batches(rng: &mut StdRng, tree: &Tree, reference: &dyn DirectoryIndex, other: &dyn DirectoryIndex) {
    for round in 0..50 {
        let count = [0, 1, 2, 31, 32][round % 5];
        let lookups = random_lookups(rng, tree, count);
        let lookups: Vec<(u64, &[u8])> = lookups.iter().map(|(parent, name)| (*parent, &name[..])).collect();
        assert_eq!(other.lookup(&lookups).unwrap(), reference.lookup(&lookups).unwrap(), "small lookups {round}");
        let paths: Vec<Vec<u8>> = (0..count).map(|_| tree.random_path(rng)).collect();
        let paths: Vec<&[u8]> = paths.iter().map(|path| &path[..]).collect();
        let user = CREDENTIALS[rng.gen_range(0..CREDENTIALS.len())];
        assert_eq!(
            other.resolve(&paths, user).unwrap(),
            reference.resolve(&paths, user).unwrap(),
            "small resolves {round}"
        );
        let inodes: Vec<u64> = (0..count).map(|_| rng.gen_range(1..tree.next_inode + 10)).collect();
        assert_eq!(other.stat(&inodes).unwrap(), reference.stat(&inodes).unwrap(), "small stats {round}");
    }
    let mut long = b"./".repeat(1_500);
    long.push(b'.');
    let paths: [&[u8]; 2] = [&long, b"/"];
    let expected = reference.resolve(&paths, Credentials::ROOT).unwrap();
    assert!(matches!(expected[0], ResolveResult::Found(_)));
    assert_eq!(other.resolve(&paths, Credentials::ROOT).unwrap(), expected, "a path past the first KiB");
}

/// A create request with its name owned: (parent, name, attributes).
type OwnedCreate = (u64, Vec<u8>, IndexAttributes);

/// A random create batch of `count`: most into three hot directories (many creates race in one
/// directory), names already there, names twice in the batch, parents that are files, unknown
/// or made earlier in the same batch, a fifth of them directories. Owned names and attributes.
fn random_creates(rng: &mut StdRng, tree: &mut Tree, count: usize) -> Vec<(u64, Vec<u8>, IndexAttributes)> {
    let hot: Vec<u64> = (0..3).map(|_| tree.random_directory(rng)).collect();
    let mut made_directories: Vec<u64> = Vec::new();
    let mut creates: Vec<(u64, Vec<u8>, IndexAttributes)> = Vec::with_capacity(count);
    for _ in 0..count {
        let parent = match rng.gen_range(0..100) {
            0..=59 => hot[rng.gen_range(0..hot.len())],
            60..=64 => tree.random_entry(rng).map_or(ROOT, |(_, _, child)| child),
            65..=67 => tree.next_inode + 5_000_000 + rng.gen_range(0..1000),
            68..=79 if !made_directories.is_empty() => made_directories[rng.gen_range(0..made_directories.len())],
            _ => tree.random_directory(rng),
        };
        let name = match rng.gen_range(0..100) {
            0..=14 => tree.children.get(&parent).map(|children| children[rng.gen_range(0..children.len())].0.clone()),
            15..=24 => creates.iter().rev().find(|(earlier, _, _)| *earlier == parent).map(|(_, name, _)| name.clone()),
            _ => None,
        }
        .unwrap_or_else(|| random_name(rng));
        let inode = tree.next_inode;
        tree.next_inode += 1;
        let kind = if rng.gen_range(0..5) == 0 { IndexKind::Directory } else { IndexKind::File };
        if kind == IndexKind::Directory {
            made_directories.push(inode);
        }
        creates.push((parent, name, random_attributes(rng, inode, kind, parent)));
    }
    creates
}

/// A create batch on both indexes: the answers must be equal; the tree learns what was made.
fn create_everywhere(
    rng: &mut StdRng,
    tree: &mut Tree,
    count: usize,
    reference: &dyn DirectoryIndex,
    other: &dyn DirectoryIndex,
) {
    let creates = random_creates(rng, tree, count);
    let requests: Vec<CreateEntry<'_>> = creates
        .iter()
        .map(|(parent, name, attributes)| CreateEntry { parent: *parent, name, attributes: *attributes })
        .collect();
    let expected = reference.create_entries(&requests).expect("reference creates");
    let answered = other.create_entries(&requests).expect("creates");
    for (index, request) in requests.iter().enumerate() {
        assert_eq!(expected[index], answered[index], "create {index} of {count}: {request:?}");
    }
    let made = expected.iter().filter(|result| **result == CreateResult::Created).count();
    let exists = expected.iter().filter(|result| matches!(result, CreateResult::Exists(_))).count();
    let others = expected.len() - made - exists;
    assert!(
        made > count / 10 && exists > count / 100 && others > 0,
        "the batch exercises every rule: {made} {exists} {others}"
    );
    for (request, result) in requests.iter().zip(&expected) {
        if *result != CreateResult::Created {
            continue;
        }
        let (parent, child) = (request.parent, request.attributes.inode);
        tree.children.entry(parent).or_default().push((request.name.to_vec(), child));
        tree.names.insert((parent, request.name.to_vec()));
        if request.attributes.kind == IndexKind::Directory {
            tree.directories.push(child);
            tree.directory_set.insert(child);
        }
    }
}

fn requests_of(creates: &[OwnedCreate]) -> Vec<CreateEntry<'_>> {
    creates
        .iter()
        .map(|(parent, name, attributes)| CreateEntry { parent: *parent, name, attributes: *attributes })
        .collect()
}

/// Tentative creates on both indexes (docs/GPUDIR.md, "Tentative creates"), step by step with
/// the answers compared at each: claims of a random create batch; claims invisible to lookups
/// and stats; the same names claimed again (`Exists` of the claim); applies that insert or
/// remove some claimed names (the back end's feed getting there before the settle); then a
/// random half committed with new attributes and the rest aborted, and everything settled
/// again (`NotPending`). The tree learns what the commits and the inserts made.
fn claim_everywhere(
    rng: &mut StdRng,
    tree: &mut Tree,
    count: usize,
    reference: &dyn DirectoryIndex,
    other: &dyn DirectoryIndex,
) {
    let both = [reference, other];
    let creates = random_creates(rng, tree, count);
    let requests = requests_of(&creates);
    let claimed = reference.claim_entries(&requests).expect("reference claims");
    assert_eq!(claimed, other.claim_entries(&requests).expect("claims"), "claims of {count}");
    let claims: Vec<OwnedCreate> = creates
        .iter()
        .zip(&claimed)
        .filter(|(_, result)| **result == CreateResult::Created)
        .map(|(create, _)| create.clone())
        .collect();
    let exists = claimed.iter().filter(|result| matches!(result, CreateResult::Exists(_))).count();
    assert!(claims.len() > count / 10 && exists > count / 100, "every rule: {} {exists}", claims.len());
    // Nothing of a claim is visible to a query.
    let lookups: Vec<(u64, &[u8])> = claims.iter().map(|(parent, name, _)| (*parent, &name[..])).collect();
    let inodes: Vec<u64> = claims.iter().map(|(_, _, attributes)| attributes.inode).collect();
    for index in both {
        assert!(index.lookup(&lookups).unwrap().iter().all(|answer| !matches!(answer, LookupResult::Found(_))));
        assert!(index.stat(&inodes).unwrap().iter().all(|answer| *answer == StatResult::Unknown));
    }
    assert_eq!(reference.lookup(&lookups).unwrap(), other.lookup(&lookups).unwrap());
    // The same names again, for other inodes: the claim answers, as a full entry would.
    let again: Vec<OwnedCreate> = claims
        .iter()
        .take(claims.len() / 3)
        .map(|(parent, name, attributes)| {
            tree.next_inode += 1;
            (*parent, name.clone(), IndexAttributes { inode: tree.next_inode, ..*attributes })
        })
        .collect();
    let expected: Vec<CreateResult> =
        claims[..again.len()].iter().map(|(_, _, a)| CreateResult::Exists(a.inode)).collect();
    for index in both {
        assert_eq!(index.claim_entries(&requests_of(&again)).unwrap(), expected, "{}", index.name());
        assert_eq!(index.create_entries(&requests_of(&again)).unwrap(), expected, "{}", index.name());
    }
    // The feed reaches some claimed names first: an insert (another child) or a removal.
    let mut updates = Vec::new();
    for (parent, name, _) in &claims {
        match rng.gen_range(0..10) {
            0 => {
                tree.next_inode += 1;
                let child = tree.next_inode;
                updates.push(IndexUpdate::InsertEntry { parent: *parent, name: name.clone(), child });
                tree.children.entry(*parent).or_default().push((name.clone(), child));
                tree.names.insert((*parent, name.clone()));
            }
            1 => updates.push(IndexUpdate::RemoveEntry { parent: *parent, name: name.clone() }),
            _ => {}
        }
    }
    apply_everywhere(&both, &updates);
    // Commit a random half (with attributes other than the claim's), abort the rest.
    let (mut commits, mut aborts): (Vec<OwnedCreate>, Vec<OwnedCreate>) = (Vec::new(), Vec::new());
    for (parent, name, attributes) in &claims {
        if rng.gen_bool(0.5) {
            let settled = random_attributes(rng, attributes.inode, attributes.kind, *parent);
            commits.push((*parent, name.clone(), settled));
        } else {
            aborts.push((*parent, name.clone(), *attributes));
        }
    }
    for (settle, list) in [(Settle::Commit, &commits), (Settle::Abort, &aborts)] {
        let expected = reference.settle_claims(&requests_of(list), settle).expect("reference settles");
        assert_eq!(expected, other.settle_claims(&requests_of(list), settle).expect("settles"), "{settle:?}");
        let settled = expected.iter().filter(|result| **result == SettleResult::Settled).count();
        assert!(settled > list.len() * 7 / 10 && settled < list.len(), "{settle:?}: {settled} of {}", list.len());
        for index in both {
            let again = index.settle_claims(&requests_of(list), settle).unwrap();
            assert!(again.iter().all(|result| *result == SettleResult::NotPending), "settled twice");
        }
        if settle == Settle::Commit {
            for ((parent, name, attributes), result) in list.iter().zip(&expected) {
                if *result != SettleResult::Settled {
                    continue;
                }
                let found = reference.lookup(&[(*parent, &name[..])]).unwrap()[0];
                assert_eq!(found, LookupResult::Found(*attributes), "a commit is its entry");
                tree.children.entry(*parent).or_default().push((name.clone(), attributes.inode));
                tree.names.insert((*parent, name.clone()));
                if attributes.kind == IndexKind::Directory {
                    tree.directories.push(attributes.inode);
                    tree.directory_set.insert(attributes.inode);
                }
            }
        }
    }
}

fn run_seed(seed: u64, entries: usize, reference: &dyn DirectoryIndex, other: &dyn DirectoryIndex) {
    run_seed_sized(seed, entries, (entries / 2).clamp(10_000, 1_000_000), reference, other)
}

/// One seed with `queries` requests per batch (smaller for the slow host build of the
/// serving loop).
fn run_seed_sized(
    seed: u64,
    entries: usize,
    queries: usize,
    reference: &dyn DirectoryIndex,
    other: &dyn DirectoryIndex,
) {
    println!(
        "seed {seed} (TANDEM_SEED={seed} repeats it), {entries} entries: {} vs {}",
        reference.name(),
        other.name()
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tree = build(&mut rng, entries, &[reference, other]);
    compare_everything(&mut rng, &tree, reference, other, queries);
    compare_small_batches(&mut rng, &tree, reference, other);
    for round in 0..3 {
        let updates = random_updates(&mut rng, &mut tree, (entries / 20).clamp(1000, 200_000));
        apply_everywhere(&[reference, other], &updates);
        compare_everything(&mut rng, &tree, reference, other, queries / 4);
        println!("  round {round}: {} updates applied, answers equal", updates.len());
    }
    for round in 0..2 {
        let count = (entries / 20).clamp(2_000, 200_000);
        create_everywhere(&mut rng, &mut tree, count, reference, other);
        compare_everything(&mut rng, &tree, reference, other, queries / 4);
        println!("  creates {round}: {count} creates, answers and the index after them equal");
    }
    let count = (entries / 20).clamp(2_000, 200_000);
    claim_everywhere(&mut rng, &mut tree, count, reference, other);
    compare_everything(&mut rng, &tree, reference, other, queries / 4);
    println!("  claims: {count} tentative creates claimed, committed and aborted; answers equal");
    concurrent_rounds(seed, &tree, (queries / 5).max(100), reference, other);
    println!("  concurrent batches from 4 threads: answers equal");
}

/// Sized for the test's trees with room to spare (no overflow is allowed to hide a difference),
/// and small staging buffers so batches span several commands and lists several pages.
fn gpu_config(entries: usize) -> GpuIndexConfig {
    let mut config = GpuIndexConfig::for_entries(entries * 2 + 100_000);
    config.arena_bytes = (entries * 2 + 100_000) * 64;
    config.staging_bytes = 1 << 20;
    config
}

#[test]
fn gpu_answers_equal_the_cpu_twin() {
    let entries = entries_wanted();
    let _one_index_at_a_time = GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for seed in seeds(0..2) {
        let Some(gpu) = open_gpu_or_skip(gpu_config(entries)) else { return };
        println!("{}", gpu.describe());
        let cpu = CpuDirectoryIndex::new(ROOT, 0).unwrap();
        run_seed(seed, entries, &cpu, &gpu);
        println!("  {}", gpu.describe());
    }
}

/// The same with large commands copied to device memory and back by DMA (the optional
/// `copy_above_bytes` path), on a smaller tree.
#[test]
fn gpu_with_copies_equals_the_cpu_twin() {
    let _one_index_at_a_time = GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let entries = entries_wanted().min(50_000);
    let mut config = gpu_config(entries);
    config.copy_above_bytes = Some(64 << 10);
    // Each staging buffer gets a copy stream of its own: 8, as this test has always run (the
    // default of 16 buffers would be 16 streams beside the kernel's, over the driver's 8
    // hardware queues unless CUDA_DEVICE_MAX_CONNECTIONS says more).
    config.staging_buffers = 8;
    let Some(gpu) = open_gpu_or_skip(config) else { return };
    let cpu = CpuDirectoryIndex::new(ROOT, 0).unwrap();
    run_seed(7, entries, &cpu, &gpu);
    println!("  {}", gpu.describe());
}

/// The kernel's own source, compiled for the host (tests/dirindex_emulator.cpp) and driven
/// through the same wire format, against the twin: CI runs the table, apply, walk and list
/// code of dirindex.cu without a GPU, four host threads per command so inserts race for slots.
#[test]
fn kernel_source_on_the_host_equals_the_cpu_twin() {
    let kernel = match emulator::EmulatedKernel::build(ROOT, 400_000) {
        Ok(kernel) => kernel,
        Err(reason) => {
            println!("no C++ compiler: skipped ({reason})");
            return;
        }
    };
    for seed in seeds(20..22) {
        let kernel = emulator::EmulatedKernel::build(ROOT, 400_000).expect("built once already");
        let cpu = CpuDirectoryIndex::new(ROOT, 2).unwrap();
        run_seed(seed, 30_000, &cpu, &kernel);
    }
    drop(kernel);
}

/// The walk carries the record a lookup found as the attributes of the inode it walks to, so
/// the kernel must store a record only under its own inode: an apply whose key is not the
/// record's inode is a command error, and nothing of it is stored.
#[test]
fn kernel_source_refuses_a_record_under_another_inode() {
    let kernel = match emulator::EmulatedKernel::build(ROOT, 1024) {
        Ok(kernel) => kernel,
        Err(reason) => {
            println!("no C++ compiler: skipped ({reason})");
            return;
        }
    };
    let record = IndexAttributes::new(7, IndexKind::File, 0o644);
    let updates = [IndexUpdate::SetAttributes(record)];
    assert!(kernel.apply_with_key(&updates, 7).is_ok(), "its own inode is stored");
    assert_eq!(kernel.stat(&[7]).unwrap(), vec![tandem_accel::dirindex::StatResult::Found(record)]);
    let error = kernel.apply_with_key(&updates, 8).expect_err("a record under inode 8 is refused");
    assert!(error.to_string().contains("error 2"), "{error}");
    assert_eq!(kernel.stat(&[8]).unwrap(), vec![tandem_accel::dirindex::StatResult::Unknown]);
}

/// The kernel's answer to running out of room: every change it could not store is counted,
/// and from then on it gives no negative answer (a correct cache, only a less useful one).
#[test]
fn kernel_source_overflow_turns_negatives_into_unknown() {
    let kernel = match emulator::EmulatedKernel::build(ROOT, 1024) {
        Ok(kernel) => kernel,
        Err(reason) => {
            println!("no C++ compiler: skipped ({reason})");
            return;
        }
    };
    let mut root = IndexAttributes::new(ROOT, IndexKind::Directory, 0o755);
    root.parent = ROOT;
    let setup = [IndexUpdate::SetAttributes(root), IndexUpdate::MarkComplete(ROOT)];
    assert_eq!(kernel.apply(&setup).unwrap().overflowed, 0);
    assert_eq!(kernel.lookup(&[(ROOT, b"absent")]).unwrap()[0], tandem_accel::dirindex::LookupResult::NotFound);
    let inserts: Vec<IndexUpdate> = (0..4000u64)
        .map(|i| IndexUpdate::InsertEntry { parent: ROOT, name: format!("file-{i:06}").into_bytes(), child: 10 + i })
        .collect();
    let report = kernel.apply(&inserts).unwrap();
    assert_eq!(report.applied, 4000);
    assert!(report.overflowed > 0 && report.overflowed < 4000, "{report:?}");
    assert_eq!(kernel.lookup(&[(ROOT, b"absent")]).unwrap()[0], tandem_accel::dirindex::LookupResult::Unknown);
    assert_eq!(kernel.list(ROOT).unwrap(), ListResult::Unknown);
    let paths: Vec<&[u8]> = vec![b"/absent"];
    assert_eq!(kernel.resolve(&paths, Credentials::ROOT).unwrap()[0], tandem_accel::dirindex::ResolveResult::NeedsCpu);
}

/// Names of at most 7 bytes live in their entry slot, so a walk compares them without a load
/// from the arena: they take no arena words, longer ones take theirs, and every name of 1 to
/// 40 bytes is found, listed, resolved, replaced, removed and created as the twin does.
#[test]
fn kernel_source_keeps_short_names_in_their_slots() {
    let kernel = match emulator::EmulatedKernel::build(ROOT, 4096) {
        Ok(kernel) => kernel,
        Err(reason) => {
            println!("no C++ compiler: skipped ({reason})");
            return;
        }
    };
    let cpu = CpuDirectoryIndex::new(ROOT, 2).unwrap();
    let mut root = IndexAttributes::new(ROOT, IndexKind::Directory, 0o755);
    root.parent = ROOT;
    let mut updates = vec![IndexUpdate::SetAttributes(root), IndexUpdate::MarkComplete(ROOT)];
    // A name of every length from 1 to 40 bytes, and one ending in a zero-looking byte pattern.
    let names: Vec<Vec<u8>> =
        (1..=40usize).map(|length| (0..length).map(|i| b'a' + (i % 26) as u8).collect()).collect();
    for (index, name) in names.iter().enumerate() {
        let child = 100 + index as u64;
        updates.push(IndexUpdate::InsertEntry { parent: ROOT, name: name.clone(), child });
        let kind = if index % 2 == 0 { IndexKind::Directory } else { IndexKind::File };
        let mut attributes = IndexAttributes::new(child, kind, 0o755);
        attributes.parent = ROOT;
        updates.push(IndexUpdate::SetAttributes(attributes));
        if kind == IndexKind::Directory {
            updates.push(IndexUpdate::MarkComplete(child));
        }
    }
    assert_eq!(kernel.apply(&updates).unwrap().overflowed, 0);
    cpu.apply(&updates).unwrap();
    let long_words: u64 = names.iter().filter(|name| name.len() > 7).map(|name| name.len().div_ceil(8) as u64).sum();
    assert_eq!(kernel.arena_words(), long_words, "short names took arena words");
    let compare = |label: &str| {
        let lookups: Vec<(u64, &[u8])> =
            names.iter().map(|name| (ROOT, &name[..])).chain([(ROOT, &b"abcdefg"[..7])]).collect();
        assert_eq!(kernel.lookup(&lookups).unwrap(), cpu.lookup(&lookups).unwrap(), "{label}");
        let mut absent: Vec<(u64, Vec<u8>)> = names.iter().map(|name| (ROOT, [&name[..], b"x"].concat())).collect();
        absent.push((ROOT, b"b".to_vec()));
        let absent: Vec<(u64, &[u8])> = absent.iter().map(|(parent, name)| (*parent, &name[..])).collect();
        assert_eq!(kernel.lookup(&absent).unwrap(), cpu.lookup(&absent).unwrap(), "{label}");
        let paths: Vec<Vec<u8>> = names
            .iter()
            .flat_map(|name| [[b"/", &name[..]].concat(), [b"/", &name[..], b"/.", b"/../", &name[..], b"/"].concat()])
            .collect();
        let paths: Vec<&[u8]> = paths.iter().map(|path| &path[..]).collect();
        assert_eq!(
            kernel.resolve(&paths, Credentials::ROOT).unwrap(),
            cpu.resolve(&paths, Credentials::ROOT).unwrap(),
            "{label}"
        );
        assert_eq!(kernel.list(ROOT).unwrap(), cpu.list(ROOT).unwrap(), "{label}");
    };
    compare("inserted");
    // Replaced children and removed names, short and long.
    let mut changes = Vec::new();
    for (index, name) in names.iter().enumerate().step_by(3) {
        changes.push(IndexUpdate::InsertEntry {
            parent: ROOT,
            name: name.clone(),
            child: 100 + ((index as u64 + 1) % 40),
        });
    }
    for name in names.iter().skip(1).step_by(5) {
        changes.push(IndexUpdate::RemoveEntry { parent: ROOT, name: name.clone() });
    }
    kernel.apply(&changes).unwrap();
    cpu.apply(&changes).unwrap();
    compare("changed");
    // Creates of short and long names, some of them taken already.
    let create_names: Vec<Vec<u8>> =
        (1..=12usize).map(|length| vec![b'q'; length]).chain([names[0].clone(), names[9].clone()]).collect();
    let requests: Vec<CreateEntry<'_>> = create_names
        .iter()
        .enumerate()
        .map(|(index, name)| CreateEntry {
            parent: ROOT,
            name,
            attributes: IndexAttributes {
                parent: 0,
                ..IndexAttributes::new(1000 + index as u64, IndexKind::File, 0o644)
            },
        })
        .collect();
    assert_eq!(kernel.create_entries(&requests).unwrap(), cpu.create_entries(&requests).unwrap());
    compare("created");
}

mod emulator {
    use super::*;
    use std::ffi::{c_void, CString};
    use std::path::PathBuf;
    use std::sync::Mutex;
    use tandem_accel::dirindex::resolve_within_limit;
    use tandem_accel::dirindex::wire::{self, Layout, Segment};
    use tandem_accel::dirindex::{LookupResult, ResolveResult, StatResult};
    use tandem_accel::{AccelError, Result};

    type Open = unsafe extern "C" fn(u64, u64, u64, u64) -> *mut c_void;
    type Close = unsafe extern "C" fn(*mut c_void);
    type Serve = unsafe extern "C" fn(*mut c_void, *mut u8, u64, u32);
    type Counts = unsafe extern "C" fn(*mut c_void, *mut u64, *mut u64, *mut u64, *mut u64);
    type Command = unsafe extern "C" fn(
        *mut c_void,
        u32,
        u32,
        *const u8,
        u64,
        *mut u8,
        u64,
        u64,
        u64,
        u64,
        u32,
        *mut u64,
        *mut u64,
    ) -> u32;

    /// Host threads per command.
    const THREADS: u32 = 4;
    const LIST_BYTES: usize = 16 << 20;

    /// dirindex.cu compiled for the host, behind the DirectoryIndex trait.
    pub struct EmulatedKernel {
        state: Mutex<usize>,
        close: Close,
        command: Command,
        serve: Serve,
        counts: Counts,
        root: u64,
        entry_slots: u64,
    }

    fn compile(directory: &std::path::Path) -> std::result::Result<PathBuf, String> {
        let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        std::fs::create_dir_all(directory).map_err(|error| error.to_string())?;
        let library = directory.join("libdirindex_emulator.so");
        let output = std::process::Command::new(std::env::var("CXX").unwrap_or_else(|_| "c++".into()))
            .args([
                "-std=c++17",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Wno-unknown-pragmas",
                "-shared",
                "-fPIC",
                "-pthread",
                "-o",
            ])
            .arg(&library)
            .arg(manifest.join("tests/dirindex_emulator.cpp"))
            .arg("-I")
            .arg(manifest.join("src/dirindex"))
            .output()
            .map_err(|error| format!("cannot run c++: {error}"))?;
        if !output.status.success() {
            panic!("dirindex.cu does not compile for the host:\n{}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(library)
    }

    fn symbol(handle: *mut c_void, name: &str) -> *mut c_void {
        let name = CString::new(name).unwrap();
        // SAFETY: dlsym on a handle dlopen returned.
        let pointer = unsafe { libc::dlsym(handle, name.as_ptr()) };
        assert!(!pointer.is_null(), "{name:?} missing from the emulator");
        pointer
    }

    /// Compiles and loads the emulator once per process (the file is removed once loaded).
    fn library() -> std::result::Result<(Open, Close, Command, Serve, Counts), String> {
        type Symbols = (usize, usize, usize, usize, usize);
        static LIBRARY: std::sync::OnceLock<std::result::Result<Symbols, String>> = std::sync::OnceLock::new();
        let loaded = LIBRARY.get_or_init(|| {
            let directory = std::env::temp_dir().join(format!("tandem-dirindex-emulator-{}", std::process::id()));
            let library = compile(&directory)?;
            let path = CString::new(library.to_string_lossy().as_bytes()).unwrap();
            // SAFETY: dlopen of the library just built; kept loaded for the process.
            let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            let _ = std::fs::remove_dir_all(&directory);
            assert!(!handle.is_null(), "cannot load {}", library.display());
            Ok((
                symbol(handle, "dirindex_emulator_open") as usize,
                symbol(handle, "dirindex_emulator_close") as usize,
                symbol(handle, "dirindex_emulator_command") as usize,
                symbol(handle, "dirindex_emulator_serve") as usize,
                symbol(handle, "dirindex_emulator_counts") as usize,
            ))
        });
        let (open, close, command, serve, counts) = loaded.clone()?;
        // SAFETY: the symbols have exactly these C signatures in dirindex_emulator.cpp.
        unsafe {
            Ok((
                std::mem::transmute::<usize, Open>(open),
                std::mem::transmute::<usize, Close>(close),
                std::mem::transmute::<usize, Command>(command),
                std::mem::transmute::<usize, Serve>(serve),
                std::mem::transmute::<usize, Counts>(counts),
            ))
        }
    }

    impl EmulatedKernel {
        pub fn build(root: u64, entries: usize) -> std::result::Result<Self, String> {
            let (open, close, command, serve, counts) = library()?;
            let slots = ((entries + entries / 2).max(1024)).next_power_of_two() as u64;
            // SAFETY: plain sizes; the emulator owns what it allocates until close.
            let state = unsafe { open(slots, slots, (entries * 64 / 8) as u64, root) };
            Ok(EmulatedKernel {
                state: Mutex::new(state as usize),
                close,
                command,
                serve,
                counts,
                root,
                entry_slots: slots,
            })
        }

        /// Runs one command over `buffer` (requests at 0, answers at `layout.answers_offset`).
        fn run(
            &self,
            opcode: u32,
            count: usize,
            buffer: &mut [u64],
            layout: &Layout,
            arguments: [u64; 3],
        ) -> Result<(u64, u64)> {
            assert!(layout.total_bytes() <= buffer.len() * 8);
            let state = self.state.lock().unwrap();
            let base = buffer.as_mut_ptr() as *mut u8;
            let (mut result0, mut result1) = (0, 0);
            // SAFETY: the buffer outlives the call and holds the layout.
            let error = unsafe {
                (self.command)(
                    *state as *mut c_void,
                    opcode,
                    count as u32,
                    base,
                    layout.request_bytes as u64,
                    base.add(layout.answers_offset),
                    layout.answers_bytes as u64,
                    arguments[0],
                    arguments[1],
                    arguments[2],
                    THREADS,
                    &mut result0,
                    &mut result1,
                )
            };
            if error != 0 {
                return Err(AccelError::Device(format!("emulated kernel error {error}")));
            }
            Ok((result0, result1))
        }

        /// One create command of every request at once, without cutting the batch: requests
        /// that share a key race for it on the command's host threads.
        pub fn create_unsegmented(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
            self.create_records(requests, (wire::COMMAND_CREATE, 0), wire::decode_creates_into)
        }

        /// `create_unsegmented` of a tentative create: claims of one name race for it.
        pub fn claim_unsegmented(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
            self.create_records(requests, (wire::COMMAND_CREATE, wire::CREATE_PENDING), wire::decode_creates_into)
        }

        /// One command of create records (a create, a claim or a settle), uncut.
        pub fn create_records<T: Copy>(
            &self,
            requests: &[CreateEntry<'_>],
            (opcode, argument0): (u32, u64),
            decode: fn(&[u8], &mut [std::mem::MaybeUninit<T>]) -> Result<()>,
        ) -> Result<Vec<T>> {
            let mut buffer = Self::buffer(wire::create_sizes(requests));
            let layout = wire::encode_creates(requests, Self::bytes(&mut buffer));
            self.run(opcode, requests.len(), &mut buffer, &layout, [argument0, 0, 0])?;
            let bytes = &Self::bytes(&mut buffer)[layout.answers_offset..layout.total_bytes()];
            wire::decoded(requests.len(), |out| decode(bytes, out))
        }

        /// Creates, claims or settles cut as the GPU engine cuts them.
        fn create_cut<T: Copy>(
            &self,
            requests: &[CreateEntry<'_>],
            command: (u32, u64),
            decode: fn(&[u8], &mut [std::mem::MaybeUninit<T>]) -> Result<()>,
        ) -> Result<Vec<T>> {
            let mut answers = Vec::with_capacity(requests.len());
            for (start, end) in wire::create_segments(requests, 64 << 20) {
                answers.extend(self.create_records(&requests[start..end], command, decode)?);
            }
            Ok(answers)
        }

        /// Applies one `SetAttributes` with the key word of its request set to `key`, as a
        /// host that broke the layout's rule would send it.
        pub fn apply_with_key(&self, updates: &[IndexUpdate], key: u64) -> Result<(u64, u64)> {
            assert!(updates.len() == 1 && matches!(updates[0], IndexUpdate::SetAttributes(_)));
            let mut buffer = Self::buffer(wire::apply_sizes(updates));
            let layout = wire::encode_updates(updates, Self::bytes(&mut buffer));
            Self::bytes(&mut buffer)[8..16].copy_from_slice(&key.to_le_bytes());
            self.run(wire::COMMAND_APPLY, 1, &mut buffer, &layout, [0; 3])
        }

        /// Runs the kernel's persistent serving loop over `ring` (RING_MEMORY_BYTES) as `blocks`
        /// blocks of 32 host threads until it is told to stop. Commands through `command` must
        /// not run meanwhile.
        pub fn serve(&self, ring: *mut u8, blocks: u32) {
            let state = *self.state.lock().unwrap();
            // SAFETY: the ring memory outlives this call (the caller joins before freeing it).
            unsafe {
                (self.serve)(state as *mut c_void, ring, tandem_accel::dirindex::ring::RING_SLOTS as u64, blocks)
            };
        }

        /// Commands the serving loop served by block 0 alone, by the whole grid and by the
        /// express path.
        pub fn served_counts(&self) -> (u64, u64, u64) {
            let (alone, grid, express, _) = self.counts();
            (alone, grid, express)
        }

        /// Words of the name arena in use.
        pub fn arena_words(&self) -> u64 {
            self.counts().3
        }

        fn counts(&self) -> (u64, u64, u64, u64) {
            let state = *self.state.lock().unwrap();
            let (mut alone, mut grid, mut express, mut arena) = (0, 0, 0, 0);
            // SAFETY: out-parameters; the emulator lives until close.
            unsafe { (self.counts)(state as *mut c_void, &mut alone, &mut grid, &mut express, &mut arena) };
            (alone, grid, express, arena)
        }

        pub fn entry_slots(&self) -> u64 {
            self.entry_slots
        }

        pub fn buffer(sizes: impl Iterator<Item = (usize, usize)>) -> Vec<u64> {
            let (requests, answers) = sizes.fold((0, 0), |(r, a), (request, answer)| (r + request, a + answer));
            vec![0u64; (requests + answers) / 8 + 32]
        }

        pub fn bytes(buffer: &mut [u64]) -> &mut [u8] {
            // SAFETY: the same memory as bytes.
            unsafe { std::slice::from_raw_parts_mut(buffer.as_mut_ptr() as *mut u8, buffer.len() * 8) }
        }
    }

    impl Drop for EmulatedKernel {
        fn drop(&mut self) {
            // SAFETY: opened by dirindex_emulator_open, closed once.
            unsafe { (self.close)(*self.state.lock().unwrap() as *mut c_void) };
        }
    }

    impl DirectoryIndex for EmulatedKernel {
        fn name(&self) -> String {
            format!("dirindex.cu on the host ({THREADS} threads a command)")
        }

        fn create_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
            self.create_cut(requests, (wire::COMMAND_CREATE, 0), wire::decode_creates_into)
        }

        fn claim_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
            self.create_cut(requests, (wire::COMMAND_CREATE, wire::CREATE_PENDING), wire::decode_creates_into)
        }

        fn settle_claims(&self, requests: &[CreateEntry<'_>], settle: Settle) -> Result<Vec<SettleResult>> {
            let command = (wire::COMMAND_SETTLE, wire::settle_argument(settle));
            self.create_cut(requests, command, wire::decode_settles_into)
        }

        fn root(&self) -> u64 {
            self.root
        }

        fn apply(&self, updates: &[IndexUpdate]) -> Result<tandem_accel::dirindex::ApplyReport> {
            let mut report = tandem_accel::dirindex::ApplyReport::default();
            for segment in wire::segments(updates, 64 << 20) {
                match segment {
                    Segment::Updates { start, end } => {
                        let part = &updates[start..end];
                        let mut buffer = Self::buffer(wire::apply_sizes(part));
                        let layout = wire::encode_updates(part, Self::bytes(&mut buffer));
                        let (overflows, _) = self.run(wire::COMMAND_APPLY, part.len(), &mut buffer, &layout, [0; 3])?;
                        wire::add_reports(&mut report, part.len(), overflows);
                    }
                    Segment::Drop(directory) => {
                        let layout = Layout { request_bytes: 0, answers_offset: 0, answers_bytes: 0 };
                        self.run(wire::COMMAND_DROP, 0, &mut [0u64; 1], &layout, [directory, 0, 0])?;
                        wire::add_reports(&mut report, 1, 0);
                    }
                }
            }
            Ok(report)
        }

        fn lookup(&self, requests: &[(u64, &[u8])]) -> Result<Vec<LookupResult>> {
            let mut buffer = Self::buffer(wire::lookup_sizes(requests));
            let layout = wire::encode_lookups(requests, Self::bytes(&mut buffer));
            self.run(wire::COMMAND_LOOKUP, requests.len(), &mut buffer, &layout, [0; 3])?;
            let bytes = Self::bytes(&mut buffer);
            wire::decode_lookups(
                &bytes[layout.answers_offset..layout.answers_offset + layout.answers_bytes],
                requests.len(),
            )
        }

        fn resolve(&self, paths: &[&[u8]], credentials: Credentials) -> Result<Vec<ResolveResult>> {
            resolve_within_limit(paths, |short| {
                let mut buffer = Self::buffer(wire::resolve_sizes(short));
                let layout = wire::encode_resolves(short, Self::bytes(&mut buffer));
                let arguments = [credentials.uid as u64, credentials.gid as u64, 0];
                self.run(wire::COMMAND_RESOLVE, short.len(), &mut buffer, &layout, arguments)?;
                let bytes = Self::bytes(&mut buffer);
                wire::decode_resolves(
                    &bytes[layout.answers_offset..layout.answers_offset + layout.answers_bytes],
                    short.len(),
                )
            })
        }

        fn stat(&self, inodes: &[u64]) -> Result<Vec<StatResult>> {
            let mut buffer = Self::buffer(wire::stat_sizes(inodes));
            let layout = wire::encode_stats(inodes, Self::bytes(&mut buffer));
            self.run(wire::COMMAND_STAT, inodes.len(), &mut buffer, &layout, [0; 3])?;
            let bytes = Self::bytes(&mut buffer);
            wire::decode_stats(&bytes[layout.answers_offset..layout.answers_offset + layout.answers_bytes], inodes)
        }

        fn list(&self, directory: u64) -> Result<ListResult> {
            let mut buffer = vec![0u64; LIST_BYTES / 8];
            let layout = Layout { request_bytes: 0, answers_offset: 0, answers_bytes: LIST_BYTES };
            let (needed, complete) =
                self.run(wire::COMMAND_LIST, 0, &mut buffer, &layout, [directory, 0, self.entry_slots])?;
            assert!(needed as usize <= LIST_BYTES, "listing of {needed} bytes: make LIST_BYTES larger");
            let entries = wire::decode_list(Self::bytes(&mut buffer), needed as usize)?;
            Ok(wire::list_result(complete == 1, entries))
        }
    }
}

/// A directory tree for create tests: the root and `directories` complete directories under it
/// (inodes 2..), applied to every index.
fn create_tree(directories: u64, indexes: &[&dyn DirectoryIndex]) {
    let mut updates = vec![
        IndexUpdate::SetAttributes(IndexAttributes {
            parent: ROOT,
            ..IndexAttributes::new(ROOT, IndexKind::Directory, 0o755)
        }),
        IndexUpdate::MarkComplete(ROOT),
    ];
    for directory in 0..directories {
        let inode = 2 + directory;
        updates.push(IndexUpdate::InsertEntry {
            parent: ROOT,
            name: format!("d{directory}").into_bytes(),
            child: inode,
        });
        updates.push(IndexUpdate::SetAttributes(IndexAttributes {
            parent: ROOT,
            ..IndexAttributes::new(inode, IndexKind::Directory, 0o755)
        }));
        updates.push(IndexUpdate::MarkComplete(inode));
    }
    apply_everywhere(indexes, &updates);
}

/// Checks one create batch's answers where requests share names: of each (parent, name) exactly
/// one request is `Created` and every other names its inode (`Exists`), and a lookup finds the
/// winner. Returns the winners' (parent, name, inode).
fn check_one_winner_per_name(
    index: &dyn DirectoryIndex,
    requests: &[CreateEntry<'_>],
    answers: &[CreateResult],
) -> Vec<(u64, Vec<u8>, u64)> {
    let mut winners: HashMap<(u64, &[u8]), u64> = HashMap::new();
    for (request, answer) in requests.iter().zip(answers) {
        if *answer == CreateResult::Created {
            let earlier = winners.insert((request.parent, request.name), request.attributes.inode);
            assert!(earlier.is_none(), "{:?} created twice", String::from_utf8_lossy(request.name));
        }
    }
    for (request, answer) in requests.iter().zip(answers) {
        let winner = winners.get(&(request.parent, request.name)).copied();
        assert!(winner.is_some(), "nobody created {:?}", String::from_utf8_lossy(request.name));
        if *answer != CreateResult::Created {
            assert_eq!(*answer, CreateResult::Exists(winner.unwrap()), "a loser names the winner");
        }
    }
    let lookups: Vec<(u64, &[u8])> = winners.keys().copied().collect();
    for ((parent, name), found) in lookups.iter().zip(index.lookup(&lookups).unwrap()) {
        match found {
            tandem_accel::dirindex::LookupResult::Found(attributes) => {
                assert_eq!(attributes.inode, winners[&(*parent, *name)]);
            }
            other => panic!("lookup of a created name: {other:?}"),
        }
    }
    winners.into_iter().map(|((parent, name), inode)| (parent, name.to_vec(), inode)).collect()
}

/// `threads` host threads create at once into `directories` directories, each thread every
/// name of a shared list in its own order (so every name is asked for `threads` times at once,
/// from different calls): one winner a name, the others told its inode, and the index lists
/// exactly the winners.
fn creates_from_many_threads(index: &dyn DirectoryIndex, threads: u64, directories: u64, names: u64) {
    create_tree(directories, &[index]);
    let first_inode = 1_000_000u64;
    let answers: Vec<(Vec<OwnedCreate>, Vec<CreateResult>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(900 + thread);
                    let mut order: Vec<u64> = (0..directories * names).collect();
                    for position in (1..order.len()).rev() {
                        order.swap(position, rng.gen_range(0..=position));
                    }
                    let mut answers = Vec::new();
                    let mut asked = Vec::new();
                    for chunk in order.chunks(997) {
                        let creates: Vec<(u64, Vec<u8>, IndexAttributes)> = chunk
                            .iter()
                            .map(|&serial| {
                                let parent = 2 + serial % directories;
                                let inode = first_inode + thread * directories * names + serial;
                                let attributes = random_attributes(&mut rng, inode, IndexKind::File, parent);
                                (parent, format!("name-{}", serial / directories).into_bytes(), attributes)
                            })
                            .collect();
                        let requests: Vec<CreateEntry<'_>> = creates
                            .iter()
                            .map(|(parent, name, attributes)| CreateEntry {
                                parent: *parent,
                                name,
                                attributes: *attributes,
                            })
                            .collect();
                        answers.extend(index.create_entries(&requests).expect("creates"));
                        asked.extend(creates);
                    }
                    (asked, answers)
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().expect("create thread")).collect()
    });
    let asked: Vec<(u64, Vec<u8>, IndexAttributes)> = answers.iter().flat_map(|(asked, _)| asked.clone()).collect();
    let results: Vec<CreateResult> = answers.iter().flat_map(|(_, results)| results.clone()).collect();
    let requests: Vec<CreateEntry<'_>> = asked
        .iter()
        .map(|(parent, name, attributes)| CreateEntry { parent: *parent, name, attributes: *attributes })
        .collect();
    let winners = check_one_winner_per_name(index, &requests, &results);
    assert_eq!(winners.len() as u64, directories * names);
    for directory in 0..directories {
        match index.list(2 + directory).unwrap() {
            ListResult::Listed(entries) => assert_eq!(entries.len() as u64, names, "directory {directory}"),
            ListResult::Unknown => panic!("a complete directory lists"),
        }
    }
}

#[test]
fn twin_creates_from_many_threads_make_one_entry_a_name() {
    let index = CpuDirectoryIndex::new(ROOT, 0).unwrap();
    creates_from_many_threads(&index, 8, 3, 2_000);
}

/// The kernel's create on host threads with no cutting of the batch: requests for the same
/// name race inside one command (four host threads), and still one wins.
#[test]
fn kernel_source_creates_of_one_name_race_to_one_entry() {
    let kernel = match emulator::EmulatedKernel::build(ROOT, 200_000) {
        Ok(kernel) => kernel,
        Err(reason) => {
            println!("no C++ compiler: skipped ({reason})");
            return;
        }
    };
    create_tree(2, &[&kernel]);
    let mut rng = StdRng::seed_from_u64(5);
    let mut next_inode = 1_000u64;
    for round in 0..30 {
        let mut creates = Vec::new();
        for name in 0..50 {
            for _ in 0..rng.gen_range(1..12) {
                let parent = 2 + name % 2;
                creates.push((
                    parent,
                    format!("r{round}-{name}").into_bytes(),
                    random_attributes(&mut rng, next_inode, IndexKind::File, parent),
                ));
                next_inode += 1;
            }
        }
        for position in (1..creates.len()).rev() {
            creates.swap(position, rng.gen_range(0..=position));
        }
        let requests: Vec<CreateEntry<'_>> = creates
            .iter()
            .map(|(parent, name, attributes)| CreateEntry { parent: *parent, name, attributes: *attributes })
            .collect();
        let answers = kernel.create_unsegmented(&requests).expect("one command");
        check_one_winner_per_name(&kernel, &requests, &answers);
    }
    // One name asked for by every request of a command: the threads start together and walk
    // the same chain to the same empty slot.
    for round in 0..2000 {
        let creates: Vec<(u64, Vec<u8>, IndexAttributes)> = (0..8)
            .map(|_| {
                next_inode += 1;
                (2, format!("same-{round}").into_bytes(), random_attributes(&mut rng, next_inode, IndexKind::File, 2))
            })
            .collect();
        let requests: Vec<CreateEntry<'_>> = creates
            .iter()
            .map(|(parent, name, attributes)| CreateEntry { parent: *parent, name, attributes: *attributes })
            .collect();
        let answers = kernel.create_unsegmented(&requests).expect("one command");
        check_one_winner_per_name(&kernel, &requests, &answers);
    }
    match kernel.list(2).unwrap() {
        ListResult::Listed(entries) => {
            let names: HashSet<&Vec<u8>> = entries.iter().map(|(name, _)| name).collect();
            assert_eq!(names.len(), entries.len(), "a name listed twice");
        }
        ListResult::Unknown => panic!("a complete directory lists"),
    }
}

/// The kernel's tentative create on host threads, uncut: claims of one name race inside one
/// command and one wins (the losers wait on its busy slot and find it pending: `Exists` of the
/// winner); the claims stay invisible until the settle; an abort frees every name again and a
/// commit makes exactly the winners the entries.
#[test]
fn kernel_source_claims_of_one_name_race_to_one_claim() {
    let kernel = match emulator::EmulatedKernel::build(ROOT, 200_000) {
        Ok(kernel) => kernel,
        Err(reason) => {
            println!("no C++ compiler: skipped ({reason})");
            return;
        }
    };
    create_tree(2, &[&kernel]);
    let mut rng = StdRng::seed_from_u64(6);
    let mut next_inode = 1_000u64;
    for round in 0..400 {
        let mut creates: Vec<OwnedCreate> = Vec::new();
        for name in 0..8 {
            for _ in 0..rng.gen_range(1..6) {
                let parent = 2 + name % 2;
                next_inode += 1;
                let attributes = random_attributes(&mut rng, next_inode, IndexKind::File, parent);
                creates.push((parent, format!("c{round}-{name}").into_bytes(), attributes));
            }
        }
        for position in (1..creates.len()).rev() {
            creates.swap(position, rng.gen_range(0..=position));
        }
        let requests = requests_of(&creates);
        let answers = kernel.claim_unsegmented(&requests).expect("one command");
        let winners: Vec<CreateEntry<'_>> = requests
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| **answer == CreateResult::Created)
            .map(|(request, _)| *request)
            .collect();
        let lookups: Vec<(u64, &[u8])> = winners.iter().map(|winner| (winner.parent, winner.name)).collect();
        assert!(kernel.lookup(&lookups).unwrap().iter().all(|answer| *answer == LookupResult::NotFound));
        if round % 2 == 0 {
            let settled = kernel.settle_claims(&winners, Settle::Abort).unwrap();
            assert!(settled.iter().all(|result| *result == SettleResult::Settled));
            assert!(kernel.lookup(&lookups).unwrap().iter().all(|answer| *answer == LookupResult::NotFound));
            assert_eq!(kernel.claim_entries(&winners).unwrap(), vec![CreateResult::Created; winners.len()]);
        }
        let settled = kernel.settle_claims(&winners, Settle::Commit).unwrap();
        assert!(settled.iter().all(|result| *result == SettleResult::Settled));
        check_one_winner_per_name(&kernel, &requests, &answers);
    }
    match kernel.list(2).unwrap() {
        ListResult::Listed(entries) => {
            let names: HashSet<&Vec<u8>> = entries.iter().map(|(name, _)| name).collect();
            assert_eq!(names.len(), entries.len(), "a name listed twice");
            assert_eq!(entries.len(), 400 * 4, "every claimed name committed once");
        }
        ListResult::Unknown => panic!("a complete directory lists"),
    }
}

/// A big tentative create on `index` against the twin: `creates` claims into `directories`
/// directories (a tenth of the names asked for twice), then every other claimed directory's
/// claims committed and the rest aborted, then lists, stats and the settles again compared.
fn claims_equal_the_twin(index: &dyn DirectoryIndex, creates: u64, directories: u64) {
    let cpu = CpuDirectoryIndex::new(ROOT, 0).unwrap();
    create_tree(directories, &[&cpu, index]);
    let mut rng = StdRng::seed_from_u64(12);
    let first_inode = 10_000_000u64;
    let owned: Vec<OwnedCreate> = (0..creates)
        .map(|serial| {
            let parent = 2 + serial % directories;
            let kind = if serial % 50 == 0 { IndexKind::Directory } else { IndexKind::File };
            // Every tenth name of a directory is the one before it again.
            let name = serial / directories;
            let name = if name % 10 == 9 { name - 1 } else { name };
            (parent, format!("p{name}").into_bytes(), random_attributes(&mut rng, first_inode + serial, kind, parent))
        })
        .collect();
    let requests = requests_of(&owned);
    let expected = cpu.claim_entries(&requests).unwrap();
    let answered = index.claim_entries(&requests).unwrap();
    let differ = expected.iter().zip(&answered).filter(|(a, b)| a != b).count();
    assert!(differ == 0, "{differ} claim answers differ");
    let claimed: Vec<CreateEntry<'_>> = requests
        .iter()
        .zip(&expected)
        .filter(|(_, result)| **result == CreateResult::Created)
        .map(|(request, _)| *request)
        .collect();
    assert!(claimed.len() as u64 > creates * 8 / 10 && (claimed.len() as u64) < creates);
    let inodes: Vec<u64> = (0..creates).map(|serial| first_inode + serial).collect();
    assert!(index.stat(&inodes).unwrap().iter().all(|answer| *answer == StatResult::Unknown), "claims are unseen");
    let (commits, aborts): (Vec<CreateEntry<'_>>, Vec<CreateEntry<'_>>) =
        claimed.iter().partition(|request| request.parent % 2 == 0);
    for (settle, part) in [(Settle::Commit, &commits), (Settle::Abort, &aborts)] {
        let expected = cpu.settle_claims(part, settle).unwrap();
        assert!(expected.iter().all(|result| *result == SettleResult::Settled));
        assert!(expected == index.settle_claims(part, settle).unwrap(), "{settle:?} answers differ");
        assert!(index.settle_claims(part, settle).unwrap().iter().all(|result| *result == SettleResult::NotPending));
    }
    for directory in 0..directories {
        assert_eq!(cpu.list(2 + directory).unwrap(), index.list(2 + directory).unwrap(), "directory {directory}");
    }
    assert!(cpu.stat(&inodes).unwrap() == index.stat(&inodes).unwrap(), "stats after the settles differ");
    println!(
        "  {creates} claims into {directories} directories, {} committed, {} aborted: equal to the twin",
        commits.len(),
        aborts.len()
    );
}

/// The kernel's source on the host: a tentative create of 60,000 names against the twin.
#[test]
fn kernel_source_claims_equal_the_twin() {
    let kernel = match emulator::EmulatedKernel::build(ROOT, 200_000) {
        Ok(kernel) => kernel,
        Err(reason) => {
            println!("no C++ compiler: skipped ({reason})");
            return;
        }
    };
    claims_equal_the_twin(&kernel, 60_000, 100);
}

/// On the GPU: a million claims into a thousand directories from every SM, committed and
/// aborted, against the twin.
#[test]
fn gpu_claims_from_many_sms_equal_the_twin() {
    let _one_index_at_a_time = GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(gpu) = open_gpu_or_skip(gpu_config(1_500_000)) else { return };
    claims_equal_the_twin(&gpu, 1_000_000, 1_000);
    println!("  {}", gpu.describe());
}

/// The GPU engine from many host threads at once (each call holds the ring for its commands),
/// then a million creates into a thousand directories in one batch, against the twin: the same
/// answers and the same listings (every SM inserts into the same directories at once).
#[test]
fn gpu_creates_from_many_sms_equal_the_twin() {
    let _one_index_at_a_time = GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(gpu) = open_gpu_or_skip(gpu_config(1_500_000)) else { return };
    creates_from_many_threads(&gpu, 8, 3, 2_000);
    println!("  many threads: one entry a name; {}", gpu.describe());
    drop(gpu);
    let gpu = GpuDirectoryIndex::open(ROOT, gpu_config(1_500_000)).expect("opened before");
    let cpu = CpuDirectoryIndex::new(ROOT, 0).unwrap();
    let directories = 1_000u64;
    create_tree(directories, &[&cpu, &gpu]);
    let mut rng = StdRng::seed_from_u64(11);
    let creates: Vec<(u64, Vec<u8>, IndexAttributes)> = (0..1_000_000u64)
        .map(|serial| {
            let parent = 2 + serial % directories;
            let kind = if serial % 50 == 0 { IndexKind::Directory } else { IndexKind::File };
            (
                parent,
                format!("f{}", serial / directories).into_bytes(),
                random_attributes(&mut rng, 10_000 + serial, kind, parent),
            )
        })
        .collect();
    let requests: Vec<CreateEntry<'_>> = creates
        .iter()
        .map(|(parent, name, attributes)| CreateEntry { parent: *parent, name, attributes: *attributes })
        .collect();
    let expected = cpu.create_entries(&requests).unwrap();
    let answered = gpu.create_entries(&requests).unwrap();
    assert_eq!(expected.iter().filter(|result| **result == CreateResult::Created).count(), 1_000_000);
    assert!(expected == answered, "{} answers differ", expected.iter().zip(&answered).filter(|(a, b)| a != b).count());
    for directory in 0..directories {
        assert_eq!(cpu.list(2 + directory).unwrap(), gpu.list(2 + directory).unwrap(), "directory {directory}");
    }
    let inodes: Vec<u64> = (0..1_000_000u64).map(|serial| 10_000 + serial).collect();
    assert!(cpu.stat(&inodes).unwrap() == gpu.stat(&inodes).unwrap(), "stats after the creates differ");
    // The same batch again: every name exists now, naming the same inodes on both.
    let again: Vec<CreateEntry<'_>> = requests
        .iter()
        .map(|request| CreateEntry {
            attributes: IndexAttributes { inode: request.attributes.inode + 2_000_000, ..request.attributes },
            ..*request
        })
        .collect();
    assert!(cpu.create_entries(&again).unwrap() == gpu.create_entries(&again).unwrap());
    println!("  1,000,000 creates into 1,000 directories: equal answers, listings and stats; {}", gpu.describe());
}

/// The persistent serving loop itself (dirindex_serve_kernel, as one block of 32 host
/// threads) behind the Rust half of the ring (`dirindex::ring::Ring`, the one the GPU engine
/// uses): the whole harness, concurrent submitters and ring wrap-around included, then stop.
#[test]
fn kernel_serving_loop_on_the_host_answers_through_the_ring() {
    let kernel = match emulator::EmulatedKernel::build(ROOT, 100_000) {
        Ok(kernel) => std::sync::Arc::new(kernel),
        Err(reason) => {
            println!("no C++ compiler: skipped ({reason})");
            return;
        }
    };
    let served = ring_index::RingIndex::new(std::sync::Arc::clone(&kernel));
    let cpu = CpuDirectoryIndex::new(ROOT, 2).unwrap();
    run_seed_sized(31, 5_000, 1_000, &cpu, &served);
    // More commands than ring slots from several threads at once.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..100 {
                    assert_eq!(served.stat(&[ROOT]).unwrap(), cpu.stat(&[ROOT]).unwrap());
                }
            });
        }
    });
    // Express commands of every kind and size, against the twin: one request, a full warp,
    // the empty command, a path past the prefetched KiB, and requests the kernel refuses.
    let mut rng = StdRng::seed_from_u64(77);
    let tree = build(&mut rng, 2_000, &[&cpu, &served]);
    for round in 0..40 {
        let count = [0, 1, 2, 31, 32][round % 5];
        let lookups = random_lookups(&mut rng, &tree, count);
        let lookups: Vec<(u64, &[u8])> = lookups.iter().map(|(parent, name)| (*parent, &name[..])).collect();
        assert_eq!(served.express_lookup(&lookups).unwrap(), cpu.lookup(&lookups).unwrap(), "round {round}");
        let paths: Vec<Vec<u8>> = (0..count).map(|_| tree.random_path(&mut rng)).collect();
        let paths: Vec<&[u8]> = paths.iter().map(|path| &path[..]).collect();
        let user = Credentials { uid: rng.gen_range(0..3), gid: rng.gen_range(0..3) };
        assert_eq!(served.express_resolve(&paths, user).unwrap(), cpu.resolve(&paths, user).unwrap(), "round {round}");
        let inodes: Vec<u64> = (0..count).map(|_| rng.gen_range(1..3_000)).collect();
        assert_eq!(served.express_stat(&inodes).unwrap(), cpu.stat(&inodes).unwrap(), "round {round}");
    }
    let mut long = Vec::new();
    while long.len() < 3_000 {
        long.extend_from_slice(b"./");
    }
    long.extend_from_slice(b".");
    let long_paths: [&[u8]; 2] = [&long, b"/"];
    let expected = cpu.resolve(&long_paths, Credentials::ROOT).unwrap();
    assert_eq!(served.express_resolve(&long_paths, Credentials::ROOT).unwrap(), expected);
    assert!(matches!(expected[0], ResolveResult::Found(_)));
    // A NOP answers; a request of a name of 0 bytes is refused (status, not a hang).
    served.nop();
    // The latency probe answers with its stamps in order, on both clocks, and changes nothing.
    for loads in [0, 1, 32, tandem_accel::dirindex::ring::PROBE_MAXIMUM_LOADS] {
        let probe = served.probe_latency(loads, u64::from(loads) * 7 + 1);
        assert!(probe.ns[0] > 0 && probe.ns.windows(2).all(|pair| pair[0] <= pair[1]), "{probe:?}");
        assert!(probe.cycles[0] > 0 && probe.cycles.windows(2).all(|pair| pair[0] <= pair[1]), "{probe:?}");
    }
    assert_eq!(served.express_resolve(&long_paths, Credentials::ROOT).unwrap(), expected);
    assert!(served.express_lookup(&[(ROOT, b"")]).is_err());
    served.stop();
    // Every way of serving ran: single requests (half of them) and small applies by block 0
    // alone, the other single requests by warp 0's express path, batches and lists by the grid.
    let (alone, grid, express) = kernel.served_counts();
    println!("commands served by block 0 alone: {alone}, by the grid: {grid}, express: {express}");
    assert!(alone >= 200 && grid > 10 && express >= 300, "alone {alone}, grid {grid}, express {express}");
}

mod ring_index {
    use super::emulator::EmulatedKernel;
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, MutexGuard};
    use std::time::Duration;
    use tandem_accel::dirindex::ring::{self, Ring, RingCommand, RING_MEMORY_BYTES};
    use tandem_accel::dirindex::wire::{self, Layout, Segment};
    use tandem_accel::dirindex::wire::{LOOKUP_RECORD_BYTES, RESOLVE_RECORD_BYTES, STAT_RECORD_BYTES};
    use tandem_accel::dirindex::{resolve_within_limit, ApplyReport, LookupResult, ResolveResult, StatResult};
    use tandem_accel::{AccelError, Result};

    const LIST_BYTES: usize = 16 << 20;
    /// Emulated blocks: more than one, so the finished count spans blocks as on the GPU.
    const SERVING_BLOCKS: u32 = 2;

    /// The ring over plain memory, served by the host build of the kernel on its own thread.
    pub struct RingIndex {
        ring: Ring,
        _memory: Vec<u64>,
        kernel: Arc<EmulatedKernel>,
        stopped: Arc<AtomicBool>,
        server: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
        /// Small query batches alternate between the express path and block 0's batch path,
        /// so that both are compared with the twin.
        calls: std::sync::atomic::AtomicU64,
    }

    impl RingIndex {
        pub fn new(kernel: Arc<EmulatedKernel>) -> Self {
            let mut memory = vec![0u64; RING_MEMORY_BYTES / 8];
            let address = memory.as_mut_ptr() as usize;
            // SAFETY: RING_MEMORY_BYTES of zeroed, aligned memory kept until the server is joined.
            let ring = unsafe { Ring::new(address as *mut u8, Duration::from_secs(60)) };
            let stopped = Arc::new(AtomicBool::new(false));
            let server = {
                let (kernel, stopped) = (Arc::clone(&kernel), Arc::clone(&stopped));
                std::thread::spawn(move || {
                    kernel.serve(address as *mut u8, SERVING_BLOCKS);
                    stopped.store(true, Ordering::Release);
                })
            };
            RingIndex {
                ring,
                _memory: memory,
                kernel,
                stopped,
                server: std::sync::Mutex::new(Some(server)),
                calls: std::sync::atomic::AtomicU64::new(0),
            }
        }

        fn alive(&self) -> Result<()> {
            if self.stopped.load(Ordering::Acquire) {
                return Err(AccelError::Device("the serving loop returned".into()));
            }
            Ok(())
        }

        fn command(buffer: &mut [u64], opcode: u32, count: usize, layout: &Layout, arguments: [u64; 3]) -> RingCommand {
            let base = buffer.as_mut_ptr() as u64;
            RingCommand {
                opcode,
                count: count as u32,
                requests: base,
                request_bytes: layout.request_bytes as u64,
                answers: base + layout.answers_offset as u64,
                answer_bytes: layout.answers_bytes as u64,
                arguments,
            }
        }

        /// Submits under `next` and waits for the answer.
        fn run_held(&self, next: &mut MutexGuard<'_, u64>, command: &RingCommand) -> Result<(u64, u64)> {
            let (slot, sequence) = self.ring.submit(next, command)?;
            let completion = self.ring.wait(slot, sequence, &mut || self.alive())?;
            if completion.status != 0 {
                return Err(AccelError::Device(format!("kernel error {}", completion.status)));
            }
            Ok((completion.result0, completion.result1))
        }

        /// Submits, lets other submitters in, then waits.
        fn run(&self, command: &RingCommand) -> Result<(u64, u64)> {
            let (slot, sequence) = self.ring.submit(&mut self.ring.lock(), command)?;
            let completion = self.ring.wait(slot, sequence, &mut || self.alive())?;
            assert_eq!(completion.status, 0, "kernel error");
            Ok((completion.result0, completion.result1))
        }

        pub fn stop(&self) {
            let command = RingCommand { opcode: wire::COMMAND_STOP, ..RingCommand::default() };
            self.run(&command).expect("stop answered");
            let server = self.server.lock().unwrap().take().expect("stopped once");
            server.join().expect("serving loop panicked");
            assert!(self.stopped.load(Ordering::Acquire));
        }

        /// Whether this small batch goes the express way (every other one does).
        fn take_express<R>(&self, requests: &[R], request_bytes: impl Fn(&R) -> usize) -> bool {
            ring::fits_express(requests, request_bytes) && self.calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2)
        }

        fn express_query<R, T: Copy>(
            &self,
            requests: &[R],
            command: (u32, [u64; 3]),
            encode: impl FnOnce(&[R], &mut [u8]) -> Layout,
            decode: impl FnOnce(&[u8], &[R], &mut [std::mem::MaybeUninit<T>]) -> Result<()>,
        ) -> Result<Vec<T>> {
            let mut out = Vec::new();
            let failure = |reason: String| AccelError::Device(reason);
            let stamps = ring::express_query(
                &self.ring,
                requests,
                command,
                encode,
                decode,
                &mut || self.alive(),
                &failure,
                &mut out,
            )?;
            Self::check_stamps(&stamps);
            Ok(out)
        }

        /// The stamps the benchmark splits a round trip with: each side's in order, and the
        /// kernel's span (doorbell seen → answers stored) inside the host's wait (doorbell rung →
        /// done seen). The host build's GPU clock is the host's monotonic clock, as `Instant`'s.
        fn check_stamps(stamps: &ring::ExpressStamps) {
            let (host, kernel) = (stamps.host, stamps.kernel);
            assert!(host.called <= host.encoded && host.encoded <= host.published, "{host:?}");
            assert!(host.published <= host.done_seen && host.done_seen <= host.decoded, "{host:?}");
            assert!(kernel.seen_ns > 0 && kernel.seen_ns <= kernel.staged_ns, "{kernel:?}");
            assert!(kernel.staged_ns <= kernel.walked_ns && kernel.walked_ns <= kernel.answered_ns, "{kernel:?}");
            // A walk's step stamps, where it got that far, lie in order inside staged → walked.
            let mut previous = kernel.staged_ns;
            for step in kernel.step_ns.into_iter().filter(|&step| step != 0) {
                assert!(previous <= step && step <= kernel.walked_ns, "{kernel:?}");
                previous = step;
            }
            assert!(kernel.step_ns[0] != 0 || kernel.step_ns[1] == 0, "{kernel:?}");
            assert!(kernel.staged_cycles <= kernel.answered_cycles, "{kernel:?}");
            let kernel_span = Duration::from_nanos(kernel.answered_ns - kernel.seen_ns);
            let waited = host.done_seen - host.published;
            assert!(kernel_span <= waited, "kernel span {kernel_span:?} outside the host's wait {waited:?}");
        }

        pub fn express_lookup(&self, requests: &[(u64, &[u8])]) -> Result<Vec<LookupResult>> {
            self.express_query(requests, (wire::COMMAND_LOOKUP, [0; 3]), wire::encode_lookups, |bytes, _, out| {
                wire::decode_lookups_into(bytes, out)
            })
        }

        pub fn express_resolve(&self, paths: &[&[u8]], credentials: Credentials) -> Result<Vec<ResolveResult>> {
            let arguments = [credentials.uid as u64, credentials.gid as u64, 0];
            self.express_query(paths, (wire::COMMAND_RESOLVE, arguments), wire::encode_resolves, |bytes, _, out| {
                wire::decode_resolves_into(bytes, out)
            })
        }

        pub fn express_stat(&self, inodes: &[u64]) -> Result<Vec<StatResult>> {
            self.express_query(inodes, (wire::COMMAND_STAT, [0; 3]), wire::encode_stats, wire::decode_stats_into)
        }

        pub fn probe_latency(&self, loads: u32, seed: u64) -> ring::ProbeStamps {
            let failure = |reason: String| AccelError::Device(reason);
            ring::latency_probe(&self.ring, loads, seed, &mut || self.alive(), &failure).expect("a probe is answered")
        }

        pub fn nop(&self) {
            let command = RingCommand { opcode: wire::COMMAND_NOP, ..RingCommand::default() };
            assert_eq!(self.run(&command).expect("a NOP is answered"), (0, 0));
        }

        /// Creates, claims or settles through the ring, cut as the GPU engine cuts them, the
        /// ring held for all of their commands.
        fn create_commands<T: Copy>(
            &self,
            requests: &[CreateEntry<'_>],
            (opcode, argument0): (u32, u64),
            decode: fn(&[u8], &mut [std::mem::MaybeUninit<T>]) -> Result<()>,
        ) -> Result<Vec<T>> {
            let mut answers = Vec::with_capacity(requests.len());
            let mut next = self.ring.lock();
            for (start, end) in wire::create_segments(requests, 64 << 20) {
                let part = &requests[start..end];
                let mut buffer = EmulatedKernel::buffer(wire::create_sizes(part));
                let layout = wire::encode_creates(part, EmulatedKernel::bytes(&mut buffer));
                let command = Self::command(&mut buffer, opcode, part.len(), &layout, [argument0, 0, 0]);
                self.run_held(&mut next, &command)?;
                let bytes = Self::answers(&mut buffer, &layout);
                answers.extend(wire::decoded(part.len(), |out| decode(&bytes, out))?);
            }
            Ok(answers)
        }

        fn answers(buffer: &mut [u64], layout: &Layout) -> Vec<u8> {
            EmulatedKernel::bytes(buffer)[layout.answers_offset..layout.answers_offset + layout.answers_bytes].to_vec()
        }
    }

    /// A test that failed before `stop` leaves the serving loop polling the ring: its memory is
    /// leaked then rather than freed under it (which ended the test process with SIGSEGV
    /// instead of the failure's message).
    impl Drop for RingIndex {
        fn drop(&mut self) {
            if !self.stopped.load(Ordering::Acquire) {
                std::mem::forget(std::mem::take(&mut self._memory));
            }
        }
    }

    impl DirectoryIndex for RingIndex {
        fn name(&self) -> String {
            "dirindex.cu's serving loop on the host, through the ring".into()
        }

        fn create_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
            self.create_commands(requests, (wire::COMMAND_CREATE, 0), wire::decode_creates_into)
        }

        fn claim_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
            self.create_commands(requests, (wire::COMMAND_CREATE, wire::CREATE_PENDING), wire::decode_creates_into)
        }

        fn settle_claims(&self, requests: &[CreateEntry<'_>], settle: Settle) -> Result<Vec<SettleResult>> {
            let command = (wire::COMMAND_SETTLE, wire::settle_argument(settle));
            self.create_commands(requests, command, wire::decode_settles_into)
        }

        fn root(&self) -> u64 {
            ROOT
        }

        fn apply(&self, updates: &[IndexUpdate]) -> Result<ApplyReport> {
            let mut report = ApplyReport::default();
            let mut next = self.ring.lock();
            for segment in wire::segments(updates, 64 << 20) {
                match segment {
                    Segment::Updates { start, end } => {
                        let part = &updates[start..end];
                        let mut buffer = EmulatedKernel::buffer(wire::apply_sizes(part));
                        let layout = wire::encode_updates(part, EmulatedKernel::bytes(&mut buffer));
                        let command = Self::command(&mut buffer, wire::COMMAND_APPLY, part.len(), &layout, [0; 3]);
                        let (overflows, _) = self.run_held(&mut next, &command)?;
                        wire::add_reports(&mut report, part.len(), overflows);
                    }
                    Segment::Drop(directory) => {
                        let layout = Layout { request_bytes: 0, answers_offset: 0, answers_bytes: 0 };
                        let command = Self::command(&mut [0u64], wire::COMMAND_DROP, 0, &layout, [directory, 0, 0]);
                        self.run_held(&mut next, &command)?;
                        wire::add_reports(&mut report, 1, 0);
                    }
                }
            }
            Ok(report)
        }

        fn lookup(&self, requests: &[(u64, &[u8])]) -> Result<Vec<LookupResult>> {
            if self.take_express(requests, |(_, name)| LOOKUP_RECORD_BYTES + wire::padded(name.len())) {
                return self.express_lookup(requests);
            }
            let mut buffer = EmulatedKernel::buffer(wire::lookup_sizes(requests));
            let layout = wire::encode_lookups(requests, EmulatedKernel::bytes(&mut buffer));
            self.run(&Self::command(&mut buffer, wire::COMMAND_LOOKUP, requests.len(), &layout, [0; 3]))?;
            wire::decode_lookups(&Self::answers(&mut buffer, &layout), requests.len())
        }

        fn resolve(&self, paths: &[&[u8]], credentials: Credentials) -> Result<Vec<ResolveResult>> {
            resolve_within_limit(paths, |short| {
                if self.take_express(short, |path| RESOLVE_RECORD_BYTES + wire::padded(path.len())) {
                    return self.express_resolve(short, credentials);
                }
                let mut buffer = EmulatedKernel::buffer(wire::resolve_sizes(short));
                let layout = wire::encode_resolves(short, EmulatedKernel::bytes(&mut buffer));
                let arguments = [credentials.uid as u64, credentials.gid as u64, 0];
                self.run(&Self::command(&mut buffer, wire::COMMAND_RESOLVE, short.len(), &layout, arguments))?;
                wire::decode_resolves(&Self::answers(&mut buffer, &layout), short.len())
            })
        }

        fn stat(&self, inodes: &[u64]) -> Result<Vec<StatResult>> {
            if self.take_express(inodes, |_| STAT_RECORD_BYTES) {
                return self.express_stat(inodes);
            }
            let mut buffer = EmulatedKernel::buffer(wire::stat_sizes(inodes));
            let layout = wire::encode_stats(inodes, EmulatedKernel::bytes(&mut buffer));
            self.run(&Self::command(&mut buffer, wire::COMMAND_STAT, inodes.len(), &layout, [0; 3]))?;
            wire::decode_stats(&Self::answers(&mut buffer, &layout), inodes)
        }

        fn list(&self, directory: u64) -> Result<ListResult> {
            let mut buffer = vec![0u64; LIST_BYTES / 8];
            let layout = Layout { request_bytes: 0, answers_offset: 0, answers_bytes: LIST_BYTES };
            let arguments = [directory, 0, self.kernel.entry_slots()];
            let (needed, complete) =
                self.run(&Self::command(&mut buffer, wire::COMMAND_LIST, 0, &layout, arguments))?;
            assert!(needed as usize <= LIST_BYTES);
            let entries = wire::decode_list(EmulatedKernel::bytes(&mut buffer), needed as usize)?;
            Ok(wire::list_result(complete == 1, entries))
        }
    }
}

/// The harness itself, in CI: the twin on one thread against the twin on every thread.
#[test]
fn twin_on_one_thread_equals_twin_on_all() {
    for seed in seeds(10..11) {
        let one = CpuDirectoryIndex::new(ROOT, 1).unwrap();
        let all = CpuDirectoryIndex::new(ROOT, 4).unwrap();
        run_seed(seed, 20_000, &one, &all);
    }
}

/// A GPU index that is dropped while idle stops its kernel (and a second one can start).
#[test]
fn gpu_index_opens_and_stops_twice() {
    let _one_index_at_a_time = GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for _ in 0..2 {
        let Some(gpu) = open_gpu_or_skip(GpuIndexConfig::for_entries(1024)) else { return };
        for _ in 0..100 {
            gpu.ping().expect("ping");
        }
        println!("{}", gpu.describe());
    }
}

/// Without a driver, a device or NVRTC, opening the index says NoGpu (what the tests above skip
/// on); with all three, it opens or fails as Device. On this VM (no libcuda) the first.
#[test]
fn gpu_open_says_no_gpu_only_when_the_machine_has_none() {
    let _one_index_at_a_time = GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let probed = tandem_accel::cuda::probe();
    match GpuDirectoryIndex::open(ROOT, GpuIndexConfig::for_entries(1024)) {
        Ok(gpu) => println!("a GPU index opened: {}", gpu.describe()),
        Err(error) if error.is_no_gpu() => println!("no GPU: skipped ({error}); the driver probe says {probed:?}"),
        Err(error) => panic!("a GPU is present but the directory index did not open: {error}"),
    }
    if let Err(reason) = probed {
        let error =
            GpuDirectoryIndex::open(ROOT, GpuIndexConfig::for_entries(1024)).err().expect("no driver, no index");
        assert_eq!(error, tandem_accel::AccelError::NoGpu(reason));
    }
}

/// The benchmark rows (1,000 × 1,000 by default; `TANDEM_DIRINDEX_DIRECTORIES` and
/// `TANDEM_DIRINDEX_FILES` change the shape). Run by hand on the GPU host:
/// `cargo test --release -p tandem-accel --test dirindex_differential -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_directory_index() {
    let _one_index_at_a_time = GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let number = |name: &str, default: usize| {
        std::env::var(name).ok().map(|text| text.parse::<usize>().expect("a number")).unwrap_or(default)
    };
    let config = tandem_accel::dirindex::bench::DirectoryBenchConfig {
        directories: number("TANDEM_DIRINDEX_DIRECTORIES", 1000),
        files_per_directory: number("TANDEM_DIRINDEX_FILES", 1000),
        staging_buffers: number("TANDEM_DIRINDEX_WORKERS", 0),
        blocks: number("TANDEM_DIRINDEX_BLOCKS", 0) as u32,
        ..Default::default()
    };
    let (rows, notes) = tandem_accel::dirindex::bench::run(&config).expect("benchmark");
    println!("{}", tandem_accel::dirindex::bench::render(&rows, &notes));
}
