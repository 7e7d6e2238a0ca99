//! The batch API (`resolve_paths`, `lookup_batch`, `stat_batch`, `create_batch`,
//! `make_directory_all_batch`) against the single calls made one by one: on random trees with
//! names of every length, paths with `.`, `..`, empty components, symbolic links (relative,
//! absolute, dangling, loops), missing components and files used as directories; creates and
//! `mkdir -p` on twin volumes compared name by name and checked by fsck; batches answered while
//! other threads change the tree; and the seam where a directory index answers part of a batch.
//!
//! Permissions: the single calls check none (`lookup` and `resolve_path` take no credentials;
//! the FUSE kernel checks search permission before it asks), so the batch API checks none
//! either, and `no_permission_rule_beyond_the_single_calls` pins that down.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tandemfs::device::Device;
use tandemfs::fs::*;
use tandemfs::{fsck, Error, FileSystem};

const VOLUME_BYTES: u64 = 256 << 20;

/// A random tree made with single calls, and what the tests need to aim at it.
struct Tree {
    /// Every path made (no leading '/'), directories first among their children.
    paths: Vec<Vec<u8>>,
    directories: Vec<u64>,
    files: Vec<u64>,
    /// Every name made, with its parent.
    entries: Vec<(u64, Vec<u8>)>,
}

/// A name of `length` bytes that is not "." or ".." and holds no '/' or NUL.
fn name_of_length(length: usize, rng: &mut SmallRng) -> Vec<u8> {
    loop {
        let name: Vec<u8> = (0..length)
            .map(|_| match rng.gen_range(0..4) {
                0 => rng.gen_range(1..=255u8),
                _ => rng.gen_range(b'a'..=b'z'),
            })
            .filter(|byte| *byte != b'/')
            .collect();
        if name.len() == length && name != b"." && name != b".." {
            return name;
        }
    }
}

/// A name length from short to the limit, the limit and one past it most often among the long.
fn random_length(rng: &mut SmallRng) -> usize {
    match rng.gen_range(0..10) {
        0..=4 => rng.gen_range(1..=12),
        5..=6 => rng.gen_range(13..=NAME_MAX_BYTES),
        7 => NAME_MAX_BYTES,
        8 => NAME_MAX_BYTES - 1,
        _ => rng.gen_range(1..=3),
    }
}

fn join_bytes(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent.is_empty() {
        name.to_vec()
    } else {
        [parent, b"/", name].concat()
    }
}

fn mount_fresh() -> (FileSystem, Arc<dyn Device>) {
    let (_memory, device) = memory_volume(VOLUME_BYTES, false);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    (fs, device)
}

/// Builds a random tree of about `directories` directories, each with a few files and some
/// symbolic links: relative ones (to a sibling, up and over with "..", dangling), absolute
/// ones, and loops (a link to itself, two links to each other).
fn build_tree(fs: &FileSystem, rng: &mut SmallRng, directories: usize) -> Tree {
    let mut tree = Tree { paths: Vec::new(), directories: vec![ROOT_INODE], files: Vec::new(), entries: Vec::new() };
    let mut directory_paths: Vec<(u64, Vec<u8>)> = vec![(ROOT_INODE, Vec::new())];
    for _ in 0..directories {
        let (parent, parent_path) = directory_paths.choose(rng).unwrap().clone();
        let name = name_of_length(random_length(rng), rng);
        let Ok(made) = fs.make_directory(parent, &name, 0o755, 0, 0) else { continue };
        let path = join_bytes(&parent_path, &name);
        tree.paths.push(path.clone());
        tree.entries.push((parent, name.clone()));
        tree.directories.push(made.inode);
        directory_paths.push((made.inode, path));
    }
    for (directory, directory_path) in directory_paths.clone() {
        for _ in 0..rng.gen_range(0..6) {
            let name = name_of_length(random_length(rng), rng);
            let Ok(made) = fs.create(directory, &name, FileType::Regular, 0o644, 0, 0, 0) else { continue };
            tree.paths.push(join_bytes(&directory_path, &name));
            tree.entries.push((directory, name));
            tree.files.push(made.inode);
        }
    }
    for (directory, directory_path) in directory_paths.iter().step_by(3) {
        let some_path = tree.paths.choose(rng).unwrap().clone();
        let up = b"../".repeat(directory_path.split(|byte| *byte == b'/').filter(|part| !part.is_empty()).count());
        let links: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b"to-absolute".to_vec(), [b"/".as_slice(), &some_path].concat()),
            (b"to-relative".to_vec(), [up.as_slice(), &some_path].concat()),
            (b"to-parent".to_vec(), b"..".to_vec()),
            (b"to-self-dir".to_vec(), b".".to_vec()),
            (b"dangling".to_vec(), b"no/such/thing".to_vec()),
            (b"loop-self".to_vec(), b"loop-self".to_vec()),
            (b"loop-a".to_vec(), b"loop-b/x".to_vec()),
            (b"loop-b".to_vec(), b"loop-a/x".to_vec()),
        ];
        for (name, target) in links {
            if fs.symlink(*directory, &name, &target, 0, 0).is_ok() {
                tree.paths.push(join_bytes(directory_path, &name));
                tree.entries.push((*directory, name));
            }
        }
    }
    tree
}

/// A random path aimed at the tree: a path made, with `.`, `..`, empty components, missing or
/// over-long components, components under files, and links followed mid-path.
fn random_path(rng: &mut SmallRng, tree: &Tree) -> Vec<u8> {
    let base = tree.paths.choose(rng).unwrap();
    let mut components: Vec<Vec<u8>> = base.split(|byte| *byte == b'/').map(|part| part.to_vec()).collect();
    for _ in 0..rng.gen_range(0..3) {
        let at = rng.gen_range(0..=components.len());
        let inserted: Vec<u8> = match rng.gen_range(0..8) {
            0 => b".".to_vec(),
            1 => b"..".to_vec(),
            2 => Vec::new(),
            3 => name_of_length(NAME_MAX_BYTES + 1, rng),
            4 => name_of_length(rng.gen_range(1..=8), rng),
            5 => tree.paths.choose(rng).unwrap().rsplit(|byte| *byte == b'/').next().unwrap().to_vec(),
            6 => b"x".to_vec(),
            _ => b"..".to_vec(),
        };
        components.insert(at, inserted);
    }
    let mut path = components.join(&b'/');
    if rng.gen_bool(0.2) {
        path.insert(0, b'/');
    }
    if rng.gen_bool(0.1) {
        path.push(b'/');
    }
    path
}

/// Compares batch answers with the single calls', request by request.
fn assert_same(
    what: &str,
    batch: &[Result<Attributes, Error>],
    single: &[Result<Attributes, Error>],
    shown: &dyn Fn(usize) -> String,
) {
    assert_eq!(batch.len(), single.len(), "{what}: answer count");
    for (position, (from_batch, from_single)) in batch.iter().zip(single).enumerate() {
        let same = match (from_batch, from_single) {
            (Ok(left), Ok(right)) => left == right,
            (Err(left), Err(right)) => format!("{left:?}") == format!("{right:?}"),
            _ => false,
        };
        assert!(same, "{what} {position} ({}): batch {from_batch:?}, single {from_single:?}", shown(position));
    }
}

fn settle(fs: &FileSystem) {
    // Attributes of directories follow the back end's work (blocks); compare at rest.
    fs.sync().unwrap();
    fs.checkpoint().unwrap();
}

#[test]
fn read_batches_equal_the_single_calls_on_random_trees() {
    for seed in seeds([11, 12, 13]) {
        let mut rng = rng(seed);
        let (fs, _device) = mount_fresh();
        let tree = build_tree(&fs, &mut rng, 150);
        settle(&fs);
        let paths: Vec<Vec<u8>> = (0..3000).map(|_| random_path(&mut rng, &tree)).collect();
        let batch = fs.resolve_paths(&paths);
        let single: Vec<_> = paths.iter().map(|path| fs.resolve_path(path)).collect();
        assert_same("resolve", &batch, &single, &|position| String::from_utf8_lossy(&paths[position]).into_owned());
        let found = batch.iter().filter(|answer| answer.is_ok()).count();
        assert!(found > 300 && found < 2900, "seed {seed}: {found} of 3000 paths found: the mix is off");
        for kind in [Error::Loop, Error::NotDirectory, Error::NameTooLong, Error::NotFound] {
            let wanted = format!("{kind:?}");
            assert!(
                batch.iter().any(|answer| matches!(answer, Err(error) if format!("{error:?}") == wanted)),
                "seed {seed}: no path answered {wanted}"
            );
        }

        let lookups = random_lookups(&mut rng, &tree, 3000);
        let batch = fs.lookup_batch(&lookups);
        let single: Vec<_> = lookups.iter().map(|(parent, name)| fs.lookup(*parent, name)).collect();
        assert_same("lookup", &batch, &single, &|position| {
            format!("{} {:?}", lookups[position].0, String::from_utf8_lossy(&lookups[position].1))
        });

        let mut inodes: Vec<u64> = tree.directories.iter().chain(&tree.files).copied().collect();
        inodes.extend([0, u64::MAX, 1 << 40]);
        inodes.extend((0..500).map(|_| rng.gen_range(1..VOLUME_BYTES / 2048 + 10)));
        inodes.shuffle(&mut rng);
        let batch = fs.stat_batch(&inodes);
        let single: Vec<_> = inodes.iter().map(|inode| fs.get_attributes(*inode)).collect();
        assert_same("stat", &batch, &single, &|position| inodes[position].to_string());
        fs.unmount().unwrap();
    }
}

/// Lookups of names made, ".", "..", missing names of every length up to one past the limit,
/// invalid names, in directories, files (not a directory) and inodes that do not exist.
fn random_lookups(rng: &mut SmallRng, tree: &Tree, count: usize) -> Vec<(u64, Vec<u8>)> {
    (0..count)
        .map(|_| match rng.gen_range(0..10) {
            0..=4 => tree.entries.choose(rng).unwrap().clone(),
            5 => (*tree.directories.choose(rng).unwrap(), [b".".as_slice(), b".."].choose(rng).unwrap().to_vec()),
            6 => (*tree.directories.choose(rng).unwrap(), name_of_length(rng.gen_range(1..=NAME_MAX_BYTES + 2), rng)),
            7 => (*tree.files.choose(rng).unwrap_or(&ROOT_INODE), name_of_length(3, rng)),
            8 => (*[0, u64::MAX, 999_999].choose(rng).unwrap(), b"a".to_vec()),
            _ => (
                *tree.directories.choose(rng).unwrap(),
                [b"".as_slice(), b"a/b", b"a\0b"].choose(rng).unwrap().to_vec(),
            ),
        })
        .collect()
}

#[test]
fn names_of_every_length_resolve_as_one_by_one() {
    let (fs, _device) = mount_fresh();
    let mut rng = rng(21);
    let directory = fs.make_directory(ROOT_INODE, b"lengths", 0o755, 0, 0).unwrap().inode;
    let mut paths = Vec::new();
    let mut lookups = Vec::new();
    for length in 1..=NAME_MAX_BYTES + 3 {
        let name = name_of_length(length, &mut rng);
        let made = fs.create(directory, &name, FileType::Regular, 0o600, 0, 0, 0);
        assert_eq!(made.is_ok(), length <= NAME_MAX_BYTES, "length {length}: {made:?}");
        paths.push(join_bytes(b"lengths", &name));
        lookups.push((directory, name));
    }
    settle(&fs);
    let batch = fs.resolve_paths(&paths);
    let single: Vec<_> = paths.iter().map(|path| fs.resolve_path(path)).collect();
    assert_same("resolve", &batch, &single, &|position| format!("length {}", position + 1));
    assert!(batch[..NAME_MAX_BYTES].iter().all(|answer| answer.is_ok()));
    assert!(batch[NAME_MAX_BYTES..].iter().all(|answer| matches!(answer, Err(Error::NameTooLong))));
    let batch = fs.lookup_batch(&lookups);
    let single: Vec<_> = lookups.iter().map(|(parent, name)| fs.lookup(*parent, name)).collect();
    assert_same("lookup", &batch, &single, &|position| format!("length {}", position + 1));
    fs.unmount().unwrap();
}

#[test]
fn no_permission_rule_beyond_the_single_calls() {
    let (fs, _device) = mount_fresh();
    let closed = fs.make_directory(ROOT_INODE, b"closed", 0o000, 1000, 1000).unwrap().inode;
    fs.create(closed, b"inside", FileType::Regular, 0o000, 1000, 1000, 0).unwrap();
    let paths: Vec<&[u8]> = vec![b"closed/inside"; 600];
    let single = fs.resolve_path(b"closed/inside");
    assert!(single.is_ok(), "the single call checks no search permission: {single:?}");
    let batch = fs.resolve_paths(&paths);
    assert!(batch.iter().all(|answer| answer.as_ref().ok() == single.as_ref().ok()));
    let lookups = vec![(closed, b"inside".as_slice()); 600];
    assert!(fs.lookup_batch(&lookups).iter().all(|answer| answer.as_ref().ok() == single.as_ref().ok()));
    fs.unmount().unwrap();
}

/// What a create left, for comparing twins: type, permissions, owner, size, links, device.
fn shape(answer: &Result<Attributes, Error>) -> String {
    match answer {
        Ok(attributes) => format!(
            "{:?} {:o} {}:{} size {} links {} rdev {}",
            attributes.file_type,
            attributes.permissions,
            attributes.uid,
            attributes.gid,
            attributes.size_bytes,
            attributes.link_count,
            attributes.rdev
        ),
        Err(error) => format!("{error:?}"),
    }
}

/// What `mkdir -p` answered: a directory made earlier in the batch may have gained children
/// since, so its links and size are not compared, only what the call decides.
fn directory_shape(answer: &Result<Attributes, Error>) -> String {
    match answer {
        Ok(attributes) => {
            format!("{:?} {:o} {}:{}", attributes.file_type, attributes.permissions, attributes.uid, attributes.gid)
        }
        Err(error) => format!("{error:?}"),
    }
}

/// Every path of the volume with its shape, sorted (inode numbers and times differ on twins;
/// a directory's size follows the order its names came in, so only its links count).
fn listing(fs: &FileSystem) -> Vec<(Vec<u8>, String)> {
    let mut found = Vec::new();
    let mut stack = vec![(Vec::new(), ROOT_INODE)];
    while let Some((path, inode)) = stack.pop() {
        let mut entries = Vec::new();
        fs.read_directory(inode, 2, &mut |entry| {
            entries.push(entry.clone());
            true
        })
        .unwrap();
        for entry in entries {
            let child = join_bytes(&path, &entry.name);
            let attributes = fs.get_attributes(entry.inode);
            let shown = match &attributes {
                Ok(directory) if directory.file_type == FileType::Directory => {
                    format!("{} links {}", directory_shape(&attributes), directory.link_count)
                }
                _ => shape(&attributes),
            };
            found.push((child.clone(), shown));
            if entry.file_type == FileType::Directory {
                stack.push((child, entry.inode));
            }
        }
    }
    found.sort();
    found
}

/// Twin volumes with the same tree (same seed), the inodes of their directories in the same
/// order.
fn twins(seed: u64) -> Vec<(FileSystem, Arc<dyn Device>, Tree)> {
    (0..2)
        .map(|_| {
            let (fs, device) = mount_fresh();
            let tree = build_tree(&fs, &mut rng(seed), 60);
            (fs, device, tree)
        })
        .collect()
}

fn unmount_and_check(fs: FileSystem, device: Arc<dyn Device>) {
    fs.unmount().unwrap();
    let report = fsck::check(device).unwrap();
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

#[test]
fn create_batches_leave_the_tree_one_by_one_leaves() {
    for seed in seeds([31, 32]) {
        let mut twins = twins(seed);
        let (single_fs, single_device, single_tree) = twins.pop().unwrap();
        let (batch_fs, batch_device, batch_tree) = twins.pop().unwrap();
        let mut rng = rng(seed + 1000);
        // Positions into the trees' lists, so each twin names its own inodes.
        let mut plan = Vec::new();
        for _ in 0..4000 {
            let (parent_position, from_files) = match rng.gen_range(0..20) {
                0 => (rng.gen_range(0..batch_tree.files.len()), true),
                _ => (rng.gen_range(0..batch_tree.directories.len()), false),
            };
            let name = match rng.gen_range(0..10) {
                // Names taken already, or taken twice within the batch.
                0 => batch_tree.entries.choose(&mut rng).unwrap().1.clone(),
                1 => format!("dup{}", rng.gen_range(0..20)).into_bytes(),
                2 => name_of_length(NAME_MAX_BYTES + 1, &mut rng),
                3 => b"..".to_vec(),
                _ => name_of_length(random_length(&mut rng), &mut rng),
            };
            let file_type =
                *[FileType::Regular, FileType::Regular, FileType::Directory, FileType::Fifo, FileType::Symlink]
                    .choose(&mut rng)
                    .unwrap();
            let permissions = *[0o644, 0o755, 0o2775, 0o10000].choose(&mut rng).unwrap();
            plan.push((parent_position, from_files, name, file_type, permissions));
        }
        let requests = |tree: &Tree| -> Vec<(u64, usize)> {
            plan.iter()
                .enumerate()
                .map(|(position, (parent_position, from_files, ..))| {
                    (
                        if *from_files { tree.files[*parent_position] } else { tree.directories[*parent_position] },
                        position,
                    )
                })
                .collect()
        };
        let batch_requests: Vec<CreateRequest> = requests(&batch_tree)
            .into_iter()
            .map(|(parent, position)| {
                let (_, _, name, file_type, permissions) = &plan[position];
                CreateRequest {
                    parent,
                    name,
                    file_type: *file_type,
                    permissions: *permissions,
                    uid: 7,
                    gid: 8,
                    rdev: 0,
                }
            })
            .collect();
        let batch = batch_fs.create_batch(&batch_requests);
        let single: Vec<_> = requests(&single_tree)
            .into_iter()
            .map(|(parent, position)| {
                let (_, _, name, file_type, permissions) = &plan[position];
                single_fs.create(parent, name, *file_type, *permissions, 7, 8, 0)
            })
            .collect();
        for (position, (from_batch, from_single)) in batch.iter().zip(&single).enumerate() {
            assert_eq!(shape(from_batch), shape(from_single), "seed {seed} create {position}");
        }
        assert!(batch.iter().filter(|answer| answer.is_ok()).count() > 1000, "seed {seed}: too few creates worked");
        assert!(batch.iter().any(|answer| matches!(answer, Err(Error::Exists))), "seed {seed}: no duplicate met");
        settle(&batch_fs);
        settle(&single_fs);
        assert!(listing(&batch_fs) == listing(&single_fs), "seed {seed}: the trees differ");
        unmount_and_check(batch_fs, batch_device);
        unmount_and_check(single_fs, single_device);
    }
}

#[test]
fn make_directory_all_batches_leave_the_tree_one_by_one_leaves() {
    let mut twins = twins(41);
    let (single_fs, single_device, single_tree) = twins.pop().unwrap();
    let (batch_fs, batch_device, _) = twins.pop().unwrap();
    let mut rng = rng(42);
    let mut paths: Vec<Vec<u8>> = Vec::new();
    for _ in 0..1500 {
        let mut path = match rng.gen_range(0..3) {
            0 => single_tree.paths.choose(&mut rng).unwrap().clone(),
            1 => format!("p{}", rng.gen_range(0..8)).into_bytes(),
            _ => Vec::new(),
        };
        for _ in 0..rng.gen_range(1..4) {
            let component = match rng.gen_range(0..8) {
                0 => b".".to_vec(),
                1 => name_of_length(NAME_MAX_BYTES + 1, &mut rng),
                2 => Vec::new(),
                _ => format!("m{}", rng.gen_range(0..6)).into_bytes(),
            };
            path = join_bytes(&path, &component);
        }
        paths.push(path);
    }
    let batch = batch_fs.make_directory_all_batch(&paths, 0o750, 3, 4);
    let single: Vec<_> = paths.iter().map(|path| single_fs.make_directory_all(path, 0o750, 3, 4)).collect();
    for (position, (from_batch, from_single)) in batch.iter().zip(&single).enumerate() {
        assert_eq!(directory_shape(from_batch), directory_shape(from_single), "mkdir -p {position}");
    }
    assert!(batch.iter().any(|answer| matches!(answer, Err(Error::NotDirectory))), "no path ran through a file");
    settle(&batch_fs);
    settle(&single_fs);
    assert!(listing(&batch_fs) == listing(&single_fs), "the trees differ");
    unmount_and_check(batch_fs, batch_device);
    unmount_and_check(single_fs, single_device);
}

/// The tree of the concurrency test: stable files, names that come and go, a directory that
/// moves between two names, and two symbolic links that swap places.
struct Moving {
    stable: Vec<(Vec<u8>, u64)>,
    d0_files: Vec<u64>,
    d1_files: Vec<u64>,
    inner: u64,
    churn: u64,
    moving: u64,
}

const CHURN_NAMES: usize = 48;
const STABLE_FILES: usize = 64;

fn build_moving(fs: &FileSystem) -> Moving {
    let mut stable = Vec::new();
    let mut files = [Vec::new(), Vec::new()];
    for (directory, directory_files) in files.iter_mut().enumerate() {
        let inode = fs.make_directory(ROOT_INODE, format!("d{directory}").as_bytes(), 0o755, 0, 0).unwrap().inode;
        for file in 0..STABLE_FILES {
            let made = fs.create(inode, format!("f{file}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
            stable.push((format!("d{directory}/f{file}").into_bytes(), made.inode));
            directory_files.push(made.inode);
        }
    }
    let churn = fs.make_directory(ROOT_INODE, b"churn", 0o755, 0, 0).unwrap().inode;
    let moving = fs.make_directory(ROOT_INODE, b"moving", 0o755, 0, 0).unwrap().inode;
    let x = fs.make_directory(moving, b"x", 0o755, 0, 0).unwrap().inode;
    let inner = fs.create(x, b"inner", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.symlink(ROOT_INODE, b"link", b"d0", 0, 0).unwrap();
    fs.symlink(ROOT_INODE, b"other", b"/d1", 0, 0).unwrap();
    let [d0_files, d1_files] = files;
    Moving { stable, d0_files, d1_files, inner, churn, moving }
}

/// Changes the tree until `stop`: names in churn/ made and removed, moving/x renamed to
/// moving/y and back, link and other exchanged. Returns the rounds made.
fn change_until(fs: &FileSystem, tree: &Moving, stop: &AtomicBool, part: usize) -> usize {
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) && rounds < 1_000_000 {
        match part {
            0 => {
                for name in 0..CHURN_NAMES {
                    fs.create(tree.churn, format!("c{name}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
                }
                for name in 0..CHURN_NAMES {
                    fs.unlink(tree.churn, format!("c{name}").as_bytes()).unwrap();
                }
            }
            1 => {
                fs.rename(tree.moving, b"x", tree.moving, b"y", RenameMode::NoReplace).unwrap();
                fs.rename(tree.moving, b"y", tree.moving, b"x", RenameMode::NoReplace).unwrap();
            }
            _ => fs.rename(ROOT_INODE, b"link", ROOT_INODE, b"other", RenameMode::Exchange).unwrap(),
        }
        rounds += 1;
    }
    rounds
}

/// Whether `answer` for `path` is one a single call could have given at some moment.
fn possible(tree: &Moving, path: &[u8], answer: &Result<Attributes, Error>) -> bool {
    let text = String::from_utf8_lossy(path);
    let plain: Vec<&[u8]> = path.split(|byte| *byte == b'/').filter(|part| !part.is_empty() && *part != b".").collect();
    let plain = plain.join(&b'/');
    if let Some((_, inode)) = tree.stable.iter().find(|(stable, _)| *stable == plain) {
        return matches!(answer, Ok(found) if found.inode == *inode);
    }
    if let Some(file) = text.strip_prefix("link/f") {
        let file: usize = file.parse().unwrap();
        return matches!(answer, Ok(found) if found.inode == tree.d0_files[file] || found.inode == tree.d1_files[file]);
    }
    if text.starts_with("churn/c") {
        return matches!(answer, Ok(found) if found.file_type == FileType::Regular)
            || matches!(answer, Err(Error::NotFound));
    }
    if text.ends_with("/inner") {
        return matches!(answer, Ok(found) if found.inode == tree.inner) || matches!(answer, Err(Error::NotFound));
    }
    if text.ends_with("/../../d0/f1") {
        return matches!(answer, Ok(found) if found.inode == tree.d0_files[1])
            || matches!(answer, Err(Error::NotFound));
    }
    panic!("no rule for {text}");
}

fn moving_paths(rng: &mut SmallRng, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|_| match rng.gen_range(0..6) {
            0 => format!("d{}/f{}", rng.gen_range(0..2), rng.gen_range(0..STABLE_FILES)),
            1 => format!("link/f{}", rng.gen_range(0..STABLE_FILES)),
            2 => format!("churn/c{}", rng.gen_range(0..CHURN_NAMES)),
            3 => format!("moving/{}/inner", ["x", "y"][rng.gen_range(0..2)]),
            4 => format!("moving/{}/../../d0/f1", ["x", "y"][rng.gen_range(0..2)]),
            // A stable file under another spelling.
            _ => format!("/./d{}//f{}/", rng.gen_range(0..2), rng.gen_range(0..STABLE_FILES)),
        })
        .map(String::into_bytes)
        .collect()
}

/// Sets its flag when dropped, also while a panic unwinds.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn batches_while_other_threads_change_the_tree() {
    let (fs, _device) = mount_fresh();
    let tree = build_moving(&fs);
    let stop = AtomicBool::new(false);
    let checked = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let changers: Vec<_> = (0..3)
            .map(|part| {
                scope.spawn({
                    let (fs, tree, stop) = (&fs, &tree, &stop);
                    move || change_until(fs, tree, stop, part)
                })
            })
            .collect();
        // A failed check below must still stop the changers, or the scope would wait for them.
        let _stop_on_exit = StopOnDrop(&stop);
        let mut rng = rng(51);
        let started = std::time::Instant::now();
        for round in 0..200 {
            if round >= 8 && started.elapsed() > std::time::Duration::from_secs(4) {
                break;
            }
            let paths = moving_paths(&mut rng, 2048);
            for (path, answer) in paths.iter().zip(fs.resolve_paths(&paths)) {
                assert!(possible(&tree, path, &answer), "{}: {answer:?}", String::from_utf8_lossy(path));
            }
            let names: Vec<(u64, Vec<u8>)> =
                (0..1024).map(|_| (tree.churn, format!("c{}", rng.gen_range(0..CHURN_NAMES)).into_bytes())).collect();
            for answer in fs.lookup_batch(&names) {
                assert!(
                    matches!(answer, Ok(ref found) if found.file_type == FileType::Regular)
                        || matches!(answer, Err(Error::NotFound)),
                    "{answer:?}"
                );
            }
            let inodes: Vec<u64> =
                tree.stable.iter().map(|(_, inode)| *inode).chain([tree.inner, tree.moving]).collect();
            for (inode, answer) in inodes.iter().zip(fs.stat_batch(&inodes)) {
                assert_eq!(answer.unwrap().inode, *inode);
            }
            checked.fetch_add(paths.len() + names.len() + inodes.len(), Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
        for changer in changers {
            assert!(changer.join().unwrap() > 0, "a changer made no round while batches ran");
        }
    });
    assert!(checked.load(Ordering::Relaxed) > 8 * 3000);
    fs.unmount().unwrap();
}

/// An index that answers every other request with the single call and counts what it was asked,
/// or fails every call.
struct HalfIndex {
    fs: FileSystem,
    min_batch: usize,
    fail: bool,
    asked: AtomicUsize,
}

impl BatchIndex for HalfIndex {
    fn min_batch(&self) -> usize {
        self.min_batch
    }
    fn lookup(&self, requests: &[(u64, &[u8])], answers: &mut [BatchAnswer]) -> Result<(), Error> {
        self.answer(answers, |position| self.fs.lookup(requests[position].0, requests[position].1))
    }
    fn resolve(&self, paths: &[&[u8]], answers: &mut [BatchAnswer]) -> Result<(), Error> {
        self.answer(answers, |position| self.fs.resolve_path(paths[position]))
    }
    fn stat(&self, inodes: &[u64], answers: &mut [BatchAnswer]) -> Result<(), Error> {
        self.answer(answers, |position| self.fs.get_attributes(inodes[position]))
    }
}

impl HalfIndex {
    fn answer(
        &self,
        answers: &mut [BatchAnswer],
        single: impl Fn(usize) -> Result<Attributes, Error>,
    ) -> Result<(), Error> {
        self.asked.fetch_add(answers.len(), Ordering::Relaxed);
        for position in (0..answers.len()).step_by(2) {
            // A failing index writes nonsense before it fails: none of it may come through.
            answers[position] = Some(if self.fail { Err(Error::Busy) } else { single(position) });
        }
        if self.fail {
            return Err(Error::Shutdown);
        }
        Ok(())
    }
}

#[test]
fn an_index_answers_part_of_a_batch_and_the_cpu_twin_the_rest() {
    let (fs, _device) = mount_fresh();
    let mut rng = rng(61);
    let tree = build_tree(&fs, &mut rng, 80);
    settle(&fs);
    let paths: Vec<Vec<u8>> = (0..1000).map(|_| random_path(&mut rng, &tree)).collect();
    let lookups = random_lookups(&mut rng, &tree, 1000);
    let inodes: Vec<u64> = tree.files.clone();
    let expected_paths = fs.resolve_paths(&paths);
    let expected_lookups = fs.lookup_batch(&lookups);
    let expected_stats = fs.stat_batch(&inodes);
    for fail in [false, true] {
        let index = Arc::new(HalfIndex { fs: fs.clone(), min_batch: 100, fail, asked: AtomicUsize::new(0) });
        fs.set_batch_index(Some(index.clone()));
        let before = fs.batch_statistics();
        let shown = |position: usize| format!("request {position}, failing index {fail}");
        assert_same("resolve", &fs.resolve_paths(&paths), &expected_paths, &shown);
        assert_same("lookup", &fs.lookup_batch(&lookups), &expected_lookups, &shown);
        assert_same("stat", &fs.stat_batch(&inodes), &expected_stats, &shown);
        // Below the index's smallest batch the CPU twin answers alone.
        assert_same("short resolve", &fs.resolve_paths(&paths[..99]), &expected_paths[..99], &shown);
        let asked = paths.len() + lookups.len() + inodes.len();
        assert_eq!(index.asked.load(Ordering::Relaxed), asked);
        let after = fs.batch_statistics();
        assert_eq!(after.batches - before.batches, 4);
        let by_index = if fail {
            0
        } else {
            [paths.len(), lookups.len(), inodes.len()].map(|length| length.div_ceil(2)).iter().sum::<usize>()
        };
        assert_eq!(after.index_answers - before.index_answers, by_index as u64);
        assert_eq!(after.index_failures - before.index_failures, if fail { 3 } else { 0 });
        assert_eq!(
            (after.index_answers + after.cpu_answers) - (before.index_answers + before.cpu_answers),
            asked as u64 + 99
        );
    }
    // The index holds a handle of the volume: unmount removes it, which also breaks that cycle.
    fs.set_batch_index(Some(Arc::new(HalfIndex {
        fs: fs.clone(),
        min_batch: 1,
        fail: false,
        asked: AtomicUsize::new(0),
    })));
    fs.unmount().unwrap();
    assert!(fs.batch_index().is_none());
}

/// Power fails while a create batch runs: the remounted volume passes fsck, every create of
/// the batch synced before is there, and each create of the interrupted batch is there whole
/// (a regular file with one link) or not at all. A prefix of the log is replayed.
#[test]
fn a_crash_during_a_create_batch_replays_to_a_clean_volume() {
    for seed in seeds([71, 72, 73, 74]) {
        let (mut memory, device) = memory_volume(VOLUME_BYTES, true);
        let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
        let directories: Vec<u64> = fs
            .make_directory_all_batch(&["a", "b", "c", "d/e"], 0o755, 0, 0)
            .into_iter()
            .map(|made| made.unwrap().inode)
            .collect();
        let names: Vec<Vec<u8>> = (0..6000).map(|serial| format!("n{serial}").into_bytes()).collect();
        let requests = |range: std::ops::Range<usize>| -> Vec<CreateRequest> {
            range
                .map(|serial| CreateRequest {
                    parent: directories[serial % directories.len()],
                    name: &names[serial],
                    file_type: FileType::Regular,
                    permissions: 0o640,
                    uid: 1,
                    gid: 2,
                    rdev: 0,
                })
                .collect()
        };
        assert!(fs.create_batch(&requests(0..2000)).iter().all(|made| made.is_ok()));
        fs.sync().unwrap();
        let crash_after_us = rng(seed).gen_range(0..20_000);
        let late = requests(2000..6000);
        let survivor = std::thread::scope(|scope| {
            let running = scope.spawn(|| fs.create_batch(&late));
            std::thread::sleep(std::time::Duration::from_micros(crash_after_us));
            let survivor = memory.crash(seed, tandemfs::device::CrashMode::Random);
            // The batch ends: what it still tries fails on the dead device.
            running.join().unwrap();
            survivor
        });
        let _ = fs.unmount();
        memory = survivor;
        let device: Arc<dyn Device> = Arc::new(memory.clone());
        let report = fsck::check(device.clone()).unwrap();
        assert!(report.is_clean(), "seed {seed}: fsck before the replay: {:?}", report.problems);
        let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
        let lookups: Vec<(u64, &[u8])> =
            (0..6000).map(|serial| (directories[serial % directories.len()], names[serial].as_slice())).collect();
        let found = fs.lookup_batch(&lookups);
        for (serial, answer) in found.iter().enumerate() {
            match answer {
                Ok(file) => assert!(
                    file.file_type == FileType::Regular && file.link_count == 1 && file.permissions == 0o640,
                    "seed {seed}: n{serial}: {file:?}"
                ),
                Err(Error::NotFound) => assert!(serial >= 2000, "seed {seed}: n{serial} was synced but is gone"),
                Err(error) => panic!("seed {seed}: n{serial}: {error:?}"),
            }
        }
        let survived = found[2000..].iter().filter(|answer| answer.is_ok()).count();
        println!("seed {seed}: crash after {crash_after_us} µs, {survived} of the interrupted batch's 4000 creates came back");
        unmount_and_check(fs, device);
    }
}

/// Two create batches and two `mkdir -p` batches on overlapping names at once: each name is
/// made by exactly one request (the others answer `Exists`), every `mkdir -p` succeeds, and
/// the volume passes fsck.
#[test]
fn overlapping_batches_at_once_make_each_name_once() {
    let (fs, device) = mount_fresh();
    let parents: Vec<u64> = fs
        .make_directory_all_batch(&["x", "y", "z"], 0o755, 0, 0)
        .into_iter()
        .map(|made| made.unwrap().inode)
        .collect();
    let names: Vec<Vec<u8>> = (0..3000).map(|serial| format!("o{serial}").into_bytes()).collect();
    let batch = |offset: usize| -> Vec<CreateRequest> {
        (0..3000)
            .map(|serial| {
                let serial = (serial + offset) % 3000;
                CreateRequest {
                    parent: parents[serial % 3],
                    name: &names[serial],
                    file_type: match serial % 5 {
                        0 => FileType::Directory,
                        _ => FileType::Regular,
                    },
                    permissions: 0o700,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                }
            })
            .collect()
    };
    let (first, second) = (batch(0), batch(1500));
    let paths: Vec<String> =
        (0..2000).map(|serial| format!("x/p{}/q{}/r{}", serial % 7, serial % 11, serial % 13)).collect();
    let (made_first, made_second, deep) = std::thread::scope(|scope| {
        let one = scope.spawn(|| fs.create_batch(&first));
        let two = scope.spawn(|| fs.create_batch(&second));
        let three = scope.spawn(|| fs.make_directory_all_batch(&paths, 0o755, 0, 0));
        let four = fs.make_directory_all_batch(&paths, 0o755, 0, 0);
        assert!(four.iter().all(|made| made.is_ok()), "mkdir -p: {:?}", four.iter().find(|made| made.is_err()));
        (one.join().unwrap(), two.join().unwrap(), three.join().unwrap())
    });
    assert!(deep.iter().all(|made| made.is_ok()), "mkdir -p: {:?}", deep.iter().find(|made| made.is_err()));
    let mut made_by = vec![0usize; 3000];
    for (requests, answers) in [(&first, &made_first), (&second, &made_second)] {
        for (request, answer) in requests.iter().zip(answers) {
            let serial: usize = std::str::from_utf8(&request.name[1..]).unwrap().parse().unwrap();
            match answer {
                Ok(_) => made_by[serial] += 1,
                Err(Error::Exists) => {}
                Err(error) => panic!("o{serial}: {error:?}"),
            }
        }
    }
    assert!(made_by.iter().all(|count| *count == 1), "a name made twice or never");
    let lookups: Vec<(u64, &[u8])> = (0..3000).map(|serial| (parents[serial % 3], names[serial].as_slice())).collect();
    assert!(fs.lookup_batch(&lookups).iter().all(|found| found.is_ok()));
    unmount_and_check(fs, device);
}

#[test]
fn dot_dot_of_the_root_is_the_root() {
    let (fs, _device) = mount_fresh();
    let root = fs.get_attributes(ROOT_INODE).unwrap();
    let paths: Vec<&[u8]> = vec![b"..", b"/../..", b"./../.", b""];
    for answer in fs.resolve_paths(&paths) {
        assert_eq!(answer.unwrap(), root);
    }
    assert_eq!(fs.lookup_batch(&[(ROOT_INODE, b"..")])[0].as_ref().unwrap(), &root);
    fs.unmount().unwrap();
}

/// A create batch is logged as a few `CreateBatch` records (a group of up to 512 creates in
/// the same directories each), not one record per create; after a remount that replays them
/// every name is there with its attributes, and fsck is clean.
#[test]
fn a_create_batch_is_a_few_records_that_replay_as_its_creates() {
    let (memory, device) = memory_volume(VOLUME_BYTES, true);
    let options = MountOptions { background_backend: false, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device.clone(), &options).unwrap();
    let parents: Vec<u64> = (0..10)
        .map(|serial| fs.make_directory(ROOT_INODE, format!("p{serial}").as_bytes(), 0o755, 0, 0).unwrap().inode)
        .collect();
    let names: Vec<Vec<u8>> = (0..5000).map(|serial| format!("file-{serial}").into_bytes()).collect();
    let requests: Vec<CreateRequest> = (0..5000)
        .map(|serial| CreateRequest {
            parent: parents[serial % parents.len()],
            name: &names[serial],
            file_type: if serial % 50 == 0 { FileType::Directory } else { FileType::Regular },
            permissions: 0o640,
            uid: 3,
            gid: 4,
            rdev: 0,
        })
        .collect();
    let (before, checkpoints) = (fs.log_statistics().next_lsn, fs.log_statistics().checkpoints);
    let made = fs.create_batch(&requests);
    let records = fs.log_statistics().next_lsn - before;
    assert!(made.iter().all(|answer| answer.is_ok()), "{:?}", made.iter().find(|answer| answer.is_err()));
    // No checkpoint came between (its records would count, and it would apply the batch).
    assert_eq!(fs.log_statistics().checkpoints, checkpoints, "a checkpoint ran during the batch");
    assert!(records <= 5000 / 100, "5000 creates took {records} log records");
    // Nothing applied yet (no back-end thread): after a power cut, the remount replays them.
    fs.sync().unwrap();
    let survivor = memory.crash(5, tandemfs::device::CrashMode::DropAll);
    drop(fs);
    let device: Arc<dyn Device> = Arc::new(survivor);
    let (fs, report) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    assert!(report.records_replayed >= records, "replayed {} of {records}", report.records_replayed);
    let lookups: Vec<(u64, &[u8])> =
        (0..5000).map(|serial| (parents[serial % parents.len()], names[serial].as_slice())).collect();
    for ((answer, request), made) in fs.lookup_batch(&lookups).iter().zip(&requests).zip(&made) {
        let (found, made) = (answer.as_ref().unwrap(), made.as_ref().unwrap());
        assert_eq!((found.inode, found.file_type, found.permissions), (made.inode, request.file_type, 0o640));
        assert_eq!((found.uid, found.gid, found.link_count), (3, 4, made.link_count));
    }
    for parent in &parents {
        let attributes = fs.get_attributes(*parent).unwrap();
        assert_eq!(
            attributes.link_count,
            2 + requests
                .iter()
                .filter(|request| request.parent == *parent && request.file_type == FileType::Directory)
                .count() as u32
        );
    }
    unmount_and_check(fs, device);
}

/// `mkdir -p` batches make each level's missing directories with one create batch: 2000 paths
/// of three levels (10, 200 and 2000 directories) take a tenth as many records as directories
/// at most, and every path answers the directory at its end.
#[test]
fn make_directory_all_batches_log_a_level_in_a_few_records() {
    // No back-end thread: no checkpoint records among the counted ones.
    let (_memory, device) = memory_volume(VOLUME_BYTES, false);
    let options = MountOptions { background_backend: false, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device.clone(), &options).unwrap();
    let paths: Vec<String> =
        (0..2000).map(|serial| format!("top{}/mid{}/leaf{serial}", serial % 10, serial % 200)).collect();
    let before = fs.log_statistics().next_lsn;
    let made = fs.make_directory_all_batch(&paths, 0o750, 1, 2);
    let records = fs.log_statistics().next_lsn - before;
    // About 75 create batch records (at most 32 new directories a record), plus the records of
    // the checkpoints that making room for them may take (no back-end thread applies
    // meanwhile); one record a directory would be 2210.
    assert!(records <= 2210 / 10, "2210 directories took {records} log records");
    for (path, answer) in paths.iter().zip(&made) {
        let made = answer.as_ref().unwrap();
        assert_eq!(fs.resolve_path(path.as_bytes()).unwrap().inode, made.inode, "{path}");
        assert_eq!((made.file_type, made.permissions, made.uid, made.gid), (FileType::Directory, 0o750, 1, 2));
    }
    assert_eq!(fs.resolve_path(b"top3").unwrap().link_count, 2 + 20);
    unmount_and_check(fs, device);
}

/// A directory removed while a create batch makes names in it and in other directories: the
/// requests in the removed one answer `NotFound` (or succeed, and then the removal answers
/// `NotEmpty`), and the requests in the other directories all succeed, whenever the removal
/// lands (a group holds several parents, and a parent can go between its check and its lock).
#[test]
fn a_parent_removed_during_a_create_batch_fails_only_its_own_requests() {
    let (fs, device) = mount_fresh();
    let stable = fs.make_directory(ROOT_INODE, b"stable", 0o755, 0, 0).unwrap().inode;
    let names: Vec<Vec<u8>> = (0..64).map(|serial| format!("s{serial}").into_bytes()).collect();
    for round in 0..1000 {
        let doomed = fs.make_directory(ROOT_INODE, b"doomed", 0o755, 0, 0).unwrap().inode;
        let round_names: Vec<Vec<u8>> =
            names.iter().map(|name| [name.as_slice(), format!("-{round}").as_bytes()].concat()).collect();
        let mut requests: Vec<CreateRequest> = round_names
            .iter()
            .map(|name| CreateRequest {
                parent: stable,
                name,
                file_type: FileType::Regular,
                permissions: 0o644,
                uid: 0,
                gid: 0,
                rdev: 0,
            })
            .collect();
        requests.insert(
            32,
            CreateRequest {
                parent: doomed,
                name: b"inside",
                file_type: FileType::Regular,
                permissions: 0o644,
                uid: 0,
                gid: 0,
                rdev: 0,
            },
        );
        let (made, removed) = std::thread::scope(|scope| {
            let remover = scope.spawn(|| fs.remove_directory(ROOT_INODE, b"doomed"));
            (fs.create_batch(&requests), remover.join().unwrap())
        });
        for (position, answer) in made.iter().enumerate() {
            if position == 32 {
                match (answer, &removed) {
                    (Ok(_), Err(Error::NotEmpty)) | (Err(Error::NotFound), Ok(())) => {}
                    other => panic!("round {round}: the create in the removed directory and the removal: {other:?}"),
                }
            } else {
                assert!(answer.is_ok(), "round {round}: request {position} in a directory nobody removed: {answer:?}");
            }
        }
        if removed.is_err() {
            fs.unlink(doomed, b"inside").unwrap();
            fs.remove_directory(ROOT_INODE, b"doomed").unwrap();
        }
    }
    unmount_and_check(fs, device);
}

/// On a small volume (the smallest log, 4 MiB) a create batch's records still fit what the log
/// admits: thousands of directories and files made in batches, every one answered `Ok`.
#[test]
fn create_batches_fit_the_smallest_log() {
    let (_memory, device) = memory_volume(48 << 20, false);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let paths: Vec<String> = (0..3000).map(|serial| format!("wide{serial}")).collect();
    let made = fs.make_directory_all_batch(&paths, 0o755, 0, 0);
    assert!(made.iter().all(|answer| answer.is_ok()), "{:?}", made.iter().find(|answer| answer.is_err()));
    let names: Vec<Vec<u8>> = (0..6000).map(|serial| format!("small-{serial}").into_bytes()).collect();
    let requests: Vec<CreateRequest> = names
        .iter()
        .enumerate()
        .map(|(serial, name)| CreateRequest {
            parent: made[serial % 7].as_ref().unwrap().inode,
            name,
            file_type: FileType::Regular,
            permissions: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        })
        .collect();
    let created = fs.create_batch(&requests);
    assert!(created.iter().all(|answer| answer.is_ok()), "{:?}", created.iter().find(|answer| answer.is_err()));
    unmount_and_check(fs, device);
}
