//! The repair test: a populated volume, one metadata block of each kind damaged in each way a
//! disk damages blocks (zeroed, random bytes, a stale older version, a block written to the wrong
//! place). fsck must see it, `fsck::repair` must fix it, a second check must be clean, a second
//! repair must find nothing, and after a mount every file whose own metadata was not damaged
//! must read back exactly (under its name, or under /lost+found when only its name was lost).

mod common;

use common::*;
use rand::RngCore;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tandemfs::block::meta::{verify_block, BlockKind, BLOCK_SIZE, TRAILER_BLOCK_OFFSET, TRAILER_KIND_OFFSET};
use tandemfs::block::superblock::{Superblock, INODES_PER_BLOCK};
use tandemfs::block::volume::Volume;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::dir::DirRoot;
use tandemfs::extent::ExtentRoot;
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

/// Names in the big directory: enough for several index blocks.
const BIG_DIRECTORY_ENTRIES: usize = 3000;

/// What a file should hold, by inode number: its bytes and extended attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Content {
    data: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

struct Volumes {
    /// The image before the last round of changes: the source of stale blocks.
    older: Vec<u8>,
    image: Vec<u8>,
    files: BTreeMap<u64, Content>,
}

fn populate(fs: &FileSystem, rng: &mut rand::rngs::SmallRng) {
    let big = fs.make_directory(ROOT_INODE, b"big", 0o755, 0, 0).unwrap();
    for index in 0..BIG_DIRECTORY_ENTRIES {
        let name = format!("entry-with-a-long-name-{index:05}");
        let file = fs.create(big.inode, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
        if index % 50 == 0 {
            fs.write(file.inode, 0, &pattern(rng, 100 + index)).unwrap();
        }
    }
    for directory in 0..4 {
        let made = fs.make_directory(ROOT_INODE, format!("d{directory}").as_bytes(), 0o755, 0, 0).unwrap();
        for index in 0..40 {
            let file =
                fs.create(made.inode, format!("f{index}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
            if index == 0 && directory < 2 {
                // Fragmented: writes with holes between them make extent tree blocks, enough
                // of them for an internal node.
                for piece in 0..400u64 {
                    fs.write(file.inode, piece * 9000, &pattern(rng, 500)).unwrap();
                }
                fs.set_xattr(file.inode, b"user.tag", format!("tag {index}").as_bytes(), XattrMode::CreateOrReplace)
                    .unwrap();
            } else {
                fs.write(file.inode, 0, &pattern(rng, 700 * index)).unwrap();
                if index % 5 == 0 {
                    fs.set_xattr(file.inode, b"user.n", format!("{index}").as_bytes(), XattrMode::CreateOrReplace)
                        .unwrap();
                }
            }
        }
        fs.symlink(made.inode, b"link", b"../big", 0, 0).unwrap();
    }
}

/// A second round that changes a block of every kind, so that the older image holds stale
/// versions of them.
fn change(fs: &FileSystem, rng: &mut rand::rngs::SmallRng) {
    let big = fs.lookup(ROOT_INODE, b"big").unwrap();
    for index in 0..800 {
        let name = format!("later-{index:04}");
        let file = fs.create(big.inode, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
        fs.write(file.inode, 0, &pattern(rng, 700)).unwrap();
    }
    for directory in 0..4 {
        let parent = fs.lookup(ROOT_INODE, format!("d{directory}").as_bytes()).unwrap();
        if directory < 2 {
            let file = fs.lookup(parent.inode, b"f0").unwrap();
            for piece in 0..40u64 {
                fs.write(file.inode, 2_704_000 + piece * 9000, &pattern(rng, 300)).unwrap();
            }
            fs.set_xattr(file.inode, b"user.later", b"changed", XattrMode::CreateOrReplace).unwrap();
        }
        for index in (5..40).step_by(5) {
            let file = fs.lookup(parent.inode, format!("f{index}").as_bytes()).unwrap();
            fs.set_xattr(file.inode, b"user.n", b"changed", XattrMode::CreateOrReplace).unwrap();
        }
        for index in 40..45 {
            fs.create(parent.inode, format!("f{index}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
        }
    }
}

/// Every file on the volume by inode: what a repair must keep.
fn contents(fs: &FileSystem) -> BTreeMap<u64, Content> {
    let mut files = BTreeMap::new();
    let mut stack = vec![ROOT_INODE];
    while let Some(directory) = stack.pop() {
        let mut entries = Vec::new();
        fs.read_directory(directory, 0, &mut |entry| {
            entries.push(entry.clone());
            true
        })
        .unwrap();
        for entry in entries.into_iter().skip(2) {
            match entry.file_type {
                FileType::Directory => stack.push(entry.inode),
                FileType::Regular => {
                    let content = read_content(fs, entry.inode).unwrap();
                    files.insert(entry.inode, content);
                }
                _ => {}
            }
        }
    }
    files
}

fn read_content(fs: &FileSystem, inode: u64) -> Result<Content, tandemfs::Error> {
    let attributes = fs.get_attributes(inode)?;
    let mut data = vec![0u8; attributes.size_bytes as usize];
    let read = fs.read(inode, 0, &mut data)?;
    data.truncate(read);
    let mut xattrs = BTreeMap::new();
    for name in fs.list_xattr(inode)? {
        let value = fs.get_xattr(inode, &name)?;
        xattrs.insert(name, value);
    }
    Ok(Content { data, xattrs })
}

fn build() -> Volumes {
    let memory = MemoryDevice::new(32 << 20);
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    let options = FormatOptions {
        inode_count: Some(4500),
        hash_seed: Some([5, 6, 7, 8]),
        uuid: Some([3; 16]),
        ..FormatOptions::default()
    };
    FileSystem::format(device.clone(), &options).unwrap();
    let mut rng = rng(13);
    let (fs, _) = FileSystem::mount(device.clone(), &inline_options()).unwrap();
    populate(&fs, &mut rng);
    fs.unmount().unwrap();
    let older = memory.to_bytes();
    let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
    change(&fs, &mut rng);
    let files = contents(&fs);
    fs.unmount().unwrap();
    Volumes { older, image: memory.to_bytes(), files }
}

/// Who owns each metadata block of the data region, and which inodes each inode-table block
/// holds: read through the engine's own structures.
struct Owners {
    /// (kind, block) → owning inode, for directory, extent and xattr blocks.
    blocks: BTreeMap<u64, (BlockKind, u64)>,
}

fn owners(image: &[u8]) -> Owners {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(image.to_vec()));
    let superblock = Superblock::read_best(device.as_ref()).unwrap();
    let mut volume = Volume::load(device, superblock.clone(), 1024).unwrap();
    let mut blocks = BTreeMap::new();
    for bit in volume.inodes.iter_set().collect::<Vec<_>>() {
        let number = bit + 1;
        let inode = volume.read_inode(number).unwrap();
        if inode.xattr_block != 0 {
            blocks.insert(inode.xattr_block, (BlockKind::Xattr, number));
        }
        match inode.file_type() {
            FileType::Directory => {
                let root = DirRoot::decode(&inode.root_area).unwrap();
                let checked = tandemfs::dir::check(&mut volume, &root, &superblock.hash_seed);
                for block in checked.blocks {
                    blocks.insert(block, (BlockKind::DirLeaf, number));
                }
            }
            FileType::Regular | FileType::Symlink => {
                let root = ExtentRoot::decode(&inode.root_area).unwrap();
                let checked = tandemfs::extent::check(&mut volume, &root);
                for block in checked.tree_blocks {
                    blocks.insert(block, (BlockKind::ExtentLeaf, number));
                }
            }
            _ => {}
        }
    }
    Owners { blocks }
}

fn block_kind(image: &[u8], number: u64) -> Option<BlockKind> {
    let block: &[u8; BLOCK_SIZE] = image[number as usize * BLOCK_SIZE..][..BLOCK_SIZE].try_into().unwrap();
    let kind = u32::from_le_bytes(block[TRAILER_KIND_OFFSET..TRAILER_KIND_OFFSET + 4].try_into().unwrap());
    let address = u64::from_le_bytes(block[TRAILER_BLOCK_OFFSET..TRAILER_BLOCK_OFFSET + 8].try_into().unwrap());
    let kind = BlockKind::from_u32(kind)?;
    (address == number && verify_block(block, kind, number).is_ok()).then_some(kind)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Damage {
    Zeroed,
    Random,
    /// The block's older version put back, as a lost write leaves it.
    Stale,
    /// Another block of the same kind written here.
    Misdirected,
}

/// The block of each kind to damage, and the inodes whose own metadata it is (their data or
/// attributes may be lost); every other file must read back exactly.
struct Target {
    what: &'static str,
    block: u64,
    /// Another block of the same kind, for the misdirected write.
    other: u64,
    affected: BTreeSet<u64>,
    /// Only the extended attributes of `affected` may change (their data must survive).
    xattrs_only: bool,
}

fn targets(volumes: &Volumes) -> Vec<Target> {
    let image = &volumes.image;
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(image.clone()));
    let superblock = Superblock::read_best(device.as_ref()).unwrap();
    let owners = owners(image);
    let kinds_in_data: Vec<(u64, BlockKind)> = (superblock.first_data_block..superblock.block_count)
        .filter_map(|block| block_kind(image, block).map(|kind| (block, kind)))
        .filter(|(block, _)| owners.blocks.contains_key(block))
        .collect();
    let of_kind = |kind: BlockKind| -> Vec<u64> {
        kinds_in_data.iter().filter(|(_, found)| *found == kind).map(|(block, _)| *block).collect()
    };
    let none = BTreeSet::new;
    let mut targets = Vec::new();
    // The bitmaps and superblocks: no file's own metadata.
    targets.push(Target {
        what: "block bitmap",
        block: superblock.block_bitmap_start,
        other: superblock.inode_bitmap_start,
        affected: none(),
        xattrs_only: false,
    });
    targets.push(Target {
        what: "inode bitmap",
        block: superblock.inode_bitmap_start,
        other: superblock.block_bitmap_start,
        affected: none(),
        xattrs_only: false,
    });
    for copy in 0..2 {
        targets.push(Target {
            what: if copy == 0 { "superblock copy 0" } else { "superblock copy 1" },
            block: copy,
            other: superblock.block_bitmap_start,
            affected: none(),
            xattrs_only: false,
        });
    }
    // The data checksum table block with the most checksums: the repair rebuilds it from the
    // data as it is (undamaged here), so every file reads back.
    let table = superblock.checksum_table_start..superblock.checksum_table_start + superblock.checksum_table_blocks;
    let entries = |block: u64| {
        let bytes = &image[block as usize * BLOCK_SIZE..block as usize * BLOCK_SIZE + 4064];
        bytes.chunks_exact(4).filter(|entry| entry.iter().any(|byte| *byte != 0)).count()
    };
    let fullest = table.clone().max_by_key(|block| entries(*block)).unwrap();
    assert!(entries(fullest) > 0, "the volume has no data checksums");
    targets.push(Target {
        what: "data checksum table block",
        block: fullest,
        other: table
            .clone()
            .find(|block| *block != fullest && entries(*block) > 0)
            .unwrap_or(superblock.block_bitmap_start),
        affected: none(),
        xattrs_only: false,
    });
    // An inode-table block holding files of the big directory (not the root's block).
    let some_file = *volumes.files.keys().find(|inode| **inode > 3 * INODES_PER_BLOCK).unwrap();
    let index = (some_file - 1) / INODES_PER_BLOCK;
    targets.push(Target {
        what: "inode-table block",
        block: superblock.inode_table_start + index,
        other: superblock.inode_table_start + index + 1,
        affected: (index * INODES_PER_BLOCK + 1..=(index + 1) * INODES_PER_BLOCK).collect(),
        xattrs_only: false,
    });
    for (what, kind, xattrs_only, affects_owner) in [
        ("directory leaf", BlockKind::DirLeaf, false, false),
        ("directory index block", BlockKind::DirIndex, false, false),
        ("extent leaf", BlockKind::ExtentLeaf, false, true),
        ("extent internal node", BlockKind::ExtentInternal, false, true),
        ("xattr block", BlockKind::Xattr, true, true),
    ] {
        let blocks = of_kind(kind);
        assert!(!blocks.is_empty(), "the volume has no {what}");
        // A block that changed since the older image, so that its stale version differs (else
        // one in the middle of the population); the misdirected write brings another block of
        // the kind, or a directory leaf.
        let block_range = |block: u64| block as usize * BLOCK_SIZE..(block as usize + 1) * BLOCK_SIZE;
        let changed: Vec<u64> = blocks
            .iter()
            .copied()
            .filter(|block| volumes.older[block_range(*block)] != image[block_range(*block)])
            .collect();
        let block = changed.get(changed.len() / 2).copied().unwrap_or(blocks[blocks.len() / 2]);
        let other = blocks.iter().copied().find(|other| *other != block).unwrap_or(of_kind(BlockKind::DirLeaf)[0]);
        let owner = owners.blocks[&block].1;
        targets.push(Target {
            what,
            block,
            other,
            affected: if affects_owner { BTreeSet::from([owner]) } else { BTreeSet::new() },
            xattrs_only,
        });
    }
    targets
}

fn damaged(volumes: &Volumes, target: &Target, damage: Damage, rng: &mut rand::rngs::SmallRng) -> Option<Vec<u8>> {
    let mut image = volumes.image.clone();
    let range = target.block as usize * BLOCK_SIZE..(target.block as usize + 1) * BLOCK_SIZE;
    match damage {
        Damage::Zeroed => image[range].fill(0),
        Damage::Random => rng.fill_bytes(&mut image[range]),
        Damage::Stale => {
            if volumes.older[range.clone()] == image[range.clone()] {
                return None;
            }
            image[range.clone()].copy_from_slice(&volumes.older[range]);
        }
        Damage::Misdirected => {
            let source = target.other as usize * BLOCK_SIZE;
            let bytes = volumes.image[source..source + BLOCK_SIZE].to_vec();
            image[range].copy_from_slice(&bytes);
        }
    }
    Some(image)
}

/// Mounts the repaired volume and compares every file not affected by the damage, by inode.
fn verify_files(device: Arc<dyn Device>, volumes: &Volumes, target: &Target, label: &str) {
    let (fs, _) =
        FileSystem::mount(device, &inline_options()).unwrap_or_else(|error| panic!("{label}: mount: {error}"));
    let found = contents(&fs);
    for (inode, expected) in &volumes.files {
        let affected = target.affected.contains(inode);
        if affected && !target.xattrs_only {
            continue;
        }
        let back = found.get(inode).unwrap_or_else(|| panic!("{label}: file inode {inode} is gone after repair"));
        assert_eq!(back.data, expected.data, "{label}: inode {inode} reads back other bytes");
        if !affected {
            assert_eq!(back.xattrs, expected.xattrs, "{label}: inode {inode} has other attributes");
        }
    }
    fs.unmount().unwrap();
}

#[test]
fn repair_fixes_each_damaged_metadata_block_kind() {
    let volumes = build();
    let mut rng = rng(21);
    let mut trials = 0;
    for target in targets(&volumes) {
        for damage in [Damage::Zeroed, Damage::Random, Damage::Stale, Damage::Misdirected] {
            let Some(image) = damaged(&volumes, &target, damage, &mut rng) else { continue };
            let label = format!("{} (block {}) {damage:?}", target.what, target.block);
            trials += 1;
            let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(image));
            let before = fsck::check(device.clone()).unwrap();
            // Every damage is detectable: a stale block carries an older generation than the
            // generation table expects (format version 3).
            assert!(!before.is_clean(), "{label}: fsck finds nothing");

            let dry = fsck::repair(device.clone(), false, &mut |_| {}).unwrap();
            assert_eq!(
                fsck::check(device.clone()).unwrap().problems,
                before.problems,
                "{label}: -n changed the volume"
            );
            assert!(dry.after.is_clean(), "{label}: a dry run would leave {:?}", dry.after.problems);

            let repaired = fsck::repair(device.clone(), true, &mut |_| {}).unwrap();
            if std::env::var("REPAIR_SHOW").is_ok() {
                eprintln!("== {label}: {} problems, {} changes", before.problems.len(), repaired.change_count());
                for line in repaired.changes.iter().take(6) {
                    eprintln!("   {line}");
                }
            }
            assert!(repaired.change_count() > 0, "{label}: repair changed nothing");
            assert!(
                repaired.after.is_clean(),
                "{label}: after repair: {:?}\nchanges: {:?}",
                repaired.after.problems,
                repaired.changes
            );
            let again = fsck::repair(device.clone(), true, &mut |_| {}).unwrap();
            assert!(again.changes.is_empty(), "{label}: a second repair changes {:?}", again.changes);
            assert!(again.after.is_clean(), "{label}: second check {:?}", again.after.problems);
            verify_files(device, &volumes, &target, &label);
        }
    }
    assert!(trials >= 39, "only {trials} trials ran");
}

/// Names lost with a damaged directory leaf: their files come back under /lost+found, intact.
#[test]
fn lost_names_go_to_lost_and_found() {
    let volumes = build();
    // Zero the first leaf of the big directory (inode 2), then the root's only leaf (inode 1):
    // the names in it are lost, and what they named must come back under /lost+found with
    // every byte (finding 2: one zeroed root leaf made the whole tree answer EIO).
    let owners = owners(&volumes.image);
    for directory in [2, ROOT_INODE] {
        let leaf = owners
            .blocks
            .iter()
            .find(|(block, (_, owner))| {
                *owner == directory && block_kind(&volumes.image, **block) == Some(BlockKind::DirLeaf)
            })
            .map(|(block, _)| *block)
            .unwrap();
        let mut image = volumes.image.clone();
        image[leaf as usize * BLOCK_SIZE..][..BLOCK_SIZE].fill(0);
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(image));
        let repaired = fsck::repair(device.clone(), true, &mut |_| {}).unwrap();
        assert!(repaired.after.is_clean(), "{:?}\n{:#?}", repaired.after.problems, &repaired.changes[..3]);
        assert!(repaired.changes.iter().any(|line| line.contains("lost+found")), "{:?}", repaired.changes);
        let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
        let lost = fs.lookup(ROOT_INODE, b"lost+found").unwrap();
        assert_eq!(lost.file_type, FileType::Directory);
        let mut names = 0;
        fs.read_directory(lost.inode, 0, &mut |_| {
            names += 1;
            true
        })
        .unwrap();
        assert!(names > 2, "lost+found is empty");
        let found = contents(&fs);
        for (inode, expected) in &volumes.files {
            assert_eq!(found.get(inode), Some(expected), "directory {directory}: inode {inode}");
        }
        fs.unmount().unwrap();
    }
}

/// Finding 7: a zeroed superblock copy is a problem for fsck and a warning in the mount report,
/// whichever copy it is; the repair rewrites it.
#[test]
fn a_zeroed_superblock_copy_is_reported_and_rewritten() {
    for copy in 0..2usize {
        let memory = MemoryDevice::new(32 << 20);
        let device: Arc<dyn Device> = Arc::new(memory.clone());
        FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
        let (fs, report) = FileSystem::mount(device.clone(), &inline_options()).unwrap();
        assert!(report.superblock_warning.is_none(), "{report:?}");
        fs.create(ROOT_INODE, b"kept", FileType::Regular, 0o644, 0, 0, 0).unwrap();
        fs.unmount().unwrap();
        device.write_at(copy as u64 * BLOCK_SIZE as u64, &[0u8; BLOCK_SIZE]).unwrap();

        let checked = fsck::check(device.clone()).unwrap();
        assert!(!checked.is_clean(), "copy {copy}: fsck says clean");
        assert!(checked.problems[0].contains(&format!("superblock copy {copy}")), "{:?}", checked.problems);
        let (fs, report) = FileSystem::mount(device.clone(), &inline_options()).unwrap();
        let warning = report.superblock_warning.unwrap_or_else(|| panic!("copy {copy}: mount says nothing"));
        assert!(warning.contains(&format!("used copy {}", 1 - copy)), "{warning}");
        fs.unmount().unwrap();

        device.write_at(copy as u64 * BLOCK_SIZE as u64, &[0u8; BLOCK_SIZE]).unwrap();
        let repaired = fsck::repair(device.clone(), true, &mut |_| {}).unwrap();
        assert_eq!(repaired.changes.len(), 1, "{:?}", repaired.changes);
        assert!(fsck::check(device.clone()).unwrap().is_clean());
        let (fs, report) = FileSystem::mount(device, &inline_options()).unwrap();
        assert!(report.superblock_warning.is_none(), "{report:?}");
        fs.lookup(ROOT_INODE, b"kept").unwrap();
        fs.unmount().unwrap();
    }
}

/// Power lost during a superblock write leaves the copy being written unreadable while the
/// volume is marked mounted: fsck notes it (not a problem), and the next mount rewrites it.
#[test]
fn a_superblock_copy_torn_by_a_crash_is_a_note_and_the_next_mount_rewrites_it() {
    let memory = MemoryDevice::new(32 << 20);
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
    let (fs, _) = FileSystem::mount(device.clone(), &inline_options()).unwrap();
    fs.create(ROOT_INODE, b"kept", FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.sync().unwrap();
    // The crash: the image as the medium holds it now, the mount never unmounted; the copy the
    // next superblock write would have gone to is half written.
    let crashed = memory.crash(7, tandemfs::device::CrashMode::KeepAll);
    drop(fs);
    let crashed_device: Arc<dyn Device> = Arc::new(crashed.clone());
    let copies = Superblock::read_both(crashed_device.as_ref()).unwrap();
    assert_eq!(copies.best.state, tandemfs::block::superblock::STATE_MOUNTED);
    let torn_copy = 1 - copies.best_copy;
    let mut half = vec![0u8; BLOCK_SIZE];
    crashed_device.read_at(torn_copy * BLOCK_SIZE as u64, &mut half).unwrap();
    half[BLOCK_SIZE / 2..].fill(0xA5);
    crashed_device.write_at(torn_copy * BLOCK_SIZE as u64, &half).unwrap();

    let checked = fsck::check(crashed_device.clone()).unwrap();
    assert!(checked.is_clean(), "{:?}", checked.problems);
    assert_eq!(checked.notes.len(), 1, "{:?}", checked.notes);
    assert!(checked.notes[0].contains(&format!("superblock copy {torn_copy}")), "{:?}", checked.notes);
    let (fs, _) = FileSystem::mount(crashed_device.clone(), &inline_options()).unwrap();
    fs.lookup(ROOT_INODE, b"kept").unwrap();
    fs.unmount().unwrap();
    let checked = fsck::check(crashed_device.clone()).unwrap();
    assert!(checked.is_clean() && checked.notes.is_empty(), "{:?} {:?}", checked.problems, checked.notes);

    // The same damage on a cleanly unmounted volume is a problem: no crash explains it.
    crashed_device.write_at(0, &half).unwrap();
    let copies = Superblock::read_both(crashed_device.as_ref()).unwrap();
    assert!(copies.other_torn && copies.best.state != tandemfs::block::superblock::STATE_MOUNTED);
    assert!(!fsck::check(crashed_device).unwrap().is_clean());
}

/// Power lost during a mount's own first superblock write (the one that marks the volume
/// mounted) leaves that copy torn on a volume still marked clean: a note too, since the torn
/// copy holds the next sequence number; the mount after rewrites it.
#[test]
fn a_mounts_first_superblock_write_torn_by_a_crash_is_a_note() {
    let memory = MemoryDevice::new(32 << 20);
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
    let copies = Superblock::read_both(device.as_ref()).unwrap();
    assert_eq!(copies.best.state, tandemfs::block::superblock::STATE_CLEAN);
    let mut next = copies.best.clone();
    next.sequence += 1;
    next.state = tandemfs::block::superblock::STATE_MOUNTED;
    let torn_copy = next.sequence % 2;
    assert_eq!(torn_copy, 1 - copies.best_copy);
    // The first half of the new copy reached the medium, the rest is what the copy held.
    let mut bytes = vec![0u8; BLOCK_SIZE];
    device.read_at(torn_copy * BLOCK_SIZE as u64, &mut bytes).unwrap();
    bytes[..BLOCK_SIZE / 2].copy_from_slice(&next.encode()[..BLOCK_SIZE / 2]);
    bytes[BLOCK_SIZE - 64..].fill(0x5A);
    device.write_at(torn_copy * BLOCK_SIZE as u64, &bytes).unwrap();
    let checked = fsck::check(device.clone()).unwrap();
    assert!(checked.is_clean(), "{:?}", checked.problems);
    assert_eq!(checked.notes.len(), 1, "{:?}", checked.notes);
    assert!(checked.notes[0].contains("first superblock write torn"), "{:?}", checked.notes);
    let (fs, _) = FileSystem::mount(device.clone(), &inline_options()).unwrap();
    fs.unmount().unwrap();
    let checked = fsck::check(device).unwrap();
    assert!(checked.is_clean() && checked.notes.is_empty(), "{:?} {:?}", checked.problems, checked.notes);
}

/// A volume left by a crash: the repair replays the log as a mount would, then repairs; the
/// files acknowledged before the crash are there.
#[test]
fn repair_of_a_crashed_volume_replays_its_log_first() {
    let memory = MemoryDevice::new(32 << 20);
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
    let (fs, _) = FileSystem::mount(device.clone(), &inline_options()).unwrap();
    let file = fs.create(ROOT_INODE, b"after-crash", FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.write(file.inode, 0, b"acknowledged bytes").unwrap();
    fs.fsync(file.inode, false).unwrap();
    // The crash: the image as it is now, without the unmount's checkpoint.
    let image = memory.to_bytes();
    drop(fs);
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(image));
    assert!(fsck::check(device.clone()).unwrap().log_records_pending > 0);
    let repaired = fsck::repair(device.clone(), true, &mut |_| {}).unwrap();
    assert!(repaired.changes.is_empty(), "{:?}", repaired.changes);
    assert_eq!(repaired.notes.len(), 1, "{:?}", repaired.notes);
    let checked = fsck::check(device.clone()).unwrap();
    assert!(checked.is_clean() && checked.log_records_pending == 0, "{checked:?}");
    let (fs, report) = FileSystem::mount(device, &inline_options()).unwrap();
    assert_eq!(report.records_replayed, 0);
    let found = fs.lookup(ROOT_INODE, b"after-crash").unwrap();
    let mut buffer = vec![0u8; 18];
    fs.read(found.inode, 0, &mut buffer).unwrap();
    assert_eq!(&buffer, b"acknowledged bytes");
    fs.unmount().unwrap();
}

/// Every path on the volume with its inode and, for regular files, what reading it gave;
/// directory listings that failed are counted as errors.
/// A path's inode and, for a regular file, what reading it gave.
type Walked = BTreeMap<String, (u64, Option<Result<Content, String>>)>;

fn walk_checked(fs: &FileSystem) -> (Walked, Vec<String>) {
    let mut found = BTreeMap::new();
    let mut errors = Vec::new();
    let mut stack = vec![(ROOT_INODE, String::new())];
    // Bounded: every directory is visited once on a tree; a corrupt cycle ends at the bound.
    for _ in 0..100_000 {
        let Some((directory, path)) = stack.pop() else { break };
        let mut entries = Vec::new();
        if let Err(error) = fs.read_directory(directory, 0, &mut |entry| {
            entries.push(entry.clone());
            true
        }) {
            errors.push(format!("{path}/: {error}"));
        }
        for entry in entries.into_iter().filter(|entry| entry.name != b"." && entry.name != b"..") {
            let child = format!("{path}/{}", String::from_utf8_lossy(&entry.name));
            // A lookup goes through the directory's index, which a listing does not read.
            match fs.lookup(directory, &entry.name) {
                Ok(found) => assert_eq!(found.inode, entry.inode, "lookup of {child} gives another inode than readdir"),
                Err(error) => errors.push(format!("{child}: lookup: {error}")),
            }
            let content = match entry.file_type {
                FileType::Directory => {
                    stack.push((entry.inode, child.clone()));
                    None
                }
                FileType::Regular => Some(read_content(fs, entry.inode).map_err(|error| error.to_string())),
                _ => None,
            };
            if let Some(Err(error)) = &content {
                errors.push(format!("{child}: {error}"));
            }
            found.insert(child, (entry.inode, content));
        }
    }
    (found, errors)
}

/// A stale block (an older, internally valid version, as a lost write leaves it) of every
/// metadata kind: fsck names it stale, and a mount either refuses or every read gives the
/// right name and bytes or an error, and some read gives the error (format version 3's
/// generations; before them a stale block was taken for the truth).
#[test]
fn stale_blocks_are_errors_never_wrong_answers() {
    let volumes = build();
    let expected = {
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(volumes.image.clone()));
        let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
        let (found, errors) = walk_checked(&fs);
        assert!(errors.is_empty(), "{errors:?}");
        fs.unmount().unwrap();
        found
    };
    let mut rng = rng(34);
    let mut kinds = BTreeSet::new();
    // The generation table's own blocks: its top block, and the level-0 block that covers the
    // first data blocks (the directories of the population, all changed since the older image).
    let superblock = Superblock::read_best(&MemoryDevice::from_bytes(volumes.image.clone())).unwrap();
    let table_top = superblock.generation_table_start + superblock.generation_table_blocks - 1;
    let table_data = superblock.generation_table_start
        + superblock.first_data_block / tandemfs::block::superblock::GENERATIONS_PER_TABLE_BLOCK;
    let table_targets = [("generation table top block", table_top), ("generation table block", table_data)]
        .map(|(what, block)| Target { what, block, other: block, affected: BTreeSet::new(), xattrs_only: false });
    for target in targets(&volumes).into_iter().chain(table_targets) {
        if target.what.starts_with("superblock") {
            continue;
        }
        let Some(image) = damaged(&volumes, &target, Damage::Stale, &mut rng) else { continue };
        let label = format!("{} (block {}) stale", target.what, target.block);
        kinds.insert(target.what);
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(image));
        let checked = fsck::check(device.clone()).unwrap();
        assert!(
            checked.problems.iter().any(|problem| problem.contains("stale block")),
            "{label}: fsck does not call it stale: {:?}",
            checked.problems
        );
        match FileSystem::mount(device, &inline_options()) {
            Err(error) => assert!(error.is_corruption(), "{label}: mount: {error}"),
            Ok((fs, _)) => {
                let (found, errors) = walk_checked(&fs);
                for (path, (inode, content)) in &found {
                    let Some((expected_inode, expected_content)) = expected.get(path) else {
                        panic!("{label}: a name that was never there: {path}");
                    };
                    assert_eq!(inode, expected_inode, "{label}: {path} names another inode");
                    if let (Some(Ok(content)), Some(Ok(expected_content))) = (content, expected_content) {
                        assert_eq!(content, expected_content, "{label}: {path} reads back other bytes");
                    }
                }
                let missing = expected.keys().filter(|path| !found.contains_key(*path)).count();
                assert!(
                    !errors.is_empty(),
                    "{label}: no read reports the stale block ({missing} names missing without an error)"
                );
                assert!(
                    errors.iter().any(|error| error.contains("stale block")),
                    "{label}: the errors do not name the stale block: {:?}",
                    &errors[..errors.len().min(3)]
                );
                drop(fs);
            }
        }
    }
    assert_eq!(kinds.len(), 11, "stale versions of only {kinds:?}");
}

/// A damaged generation-table block would make every metadata block it covers fail its check;
/// repair rebuilds it from those blocks' trailers, so no file is lost with it.
#[test]
fn a_damaged_generation_table_block_is_rebuilt_and_loses_no_file() {
    let volumes = build();
    let mut rng = rng(55);
    let superblock = Superblock::read_best(&MemoryDevice::from_bytes(volumes.image.clone())).unwrap();
    let table_top = superblock.generation_table_start + superblock.generation_table_blocks - 1;
    let per_block = tandemfs::block::superblock::GENERATIONS_PER_TABLE_BLOCK;
    // Level 0 blocks covering the fixed tables and the first data blocks (the population's
    // directories, extent nodes and xattr blocks).
    let level0 = |block: u64| superblock.generation_table_start + block / per_block;
    let mut blocks = vec![table_top, level0(superblock.inode_table_start), level0(superblock.first_data_block)];
    blocks.dedup();
    let mut trials = 0;
    for block in blocks {
        let target = Target {
            what: "generation table block",
            block,
            other: block,
            affected: BTreeSet::new(),
            xattrs_only: false,
        };
        for damage in [Damage::Zeroed, Damage::Random, Damage::Stale] {
            let Some(image) = damaged(&volumes, &target, damage, &mut rng) else { continue };
            let label = format!("generation table block {block} {damage:?}");
            trials += 1;
            let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(image));
            assert!(!fsck::check(device.clone()).unwrap().is_clean(), "{label}: fsck finds nothing");
            let repaired = fsck::repair(device.clone(), true, &mut |_| {}).unwrap();
            assert!(
                repaired.changes.iter().any(|change| change.contains("rebuilt from the trailers")),
                "{label}: the table block was not rebuilt: {:?}",
                repaired.changes
            );
            assert!(repaired.after.is_clean(), "{label}: after repair: {:?}", repaired.after.problems);
            let again = fsck::repair(device.clone(), true, &mut |_| {}).unwrap();
            assert!(again.changes.is_empty(), "{label}: a second repair changes {:?}", again.changes);
            // Every file reads back byte for byte: nothing it owns was damaged.
            verify_files(device, &volumes, &target, &label);
        }
    }
    assert!(trials >= 6, "only {trials} trials ran");
}
