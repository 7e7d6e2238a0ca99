//! Shared data blocks through the file system (format version 8): random inserts of bytes,
//! collapses, writes, truncates and punches at byte offsets of one file, against a model. Every
//! 100 operations the back end applies everything and the whole file is compared byte for byte
//! with the model, and the space it holds is checked against what it maps; every 500 the volume
//! is unmounted and fsck, which counts every shared block's references against the generation
//! table and every block against the bitmap, must be clean, then it is mounted again (so the
//! pack rooms start anew). `TANDEM_SEED=n` reproduces one seed.

mod common;

use common::*;
use rand::Rng;
use std::sync::Arc;
use tandemfs::fs::{FileType, MountOptions, SetAttributes, ROOT_INODE};
use tandemfs::{fsck, FileSystem};

const OPERATIONS: usize = 3000;

/// One random operation on `inode`, mirrored in `model`.
fn step(fs: &FileSystem, inode: u64, rng: &mut rand::rngs::SmallRng, model: &mut Vec<u8>) {
    let length = model.len();
    let offset = rng.gen_range(0..=length);
    match rng.gen_range(0..10) {
        0..=3 => {
            let count = if rng.gen_bool(0.9) { rng.gen_range(1..=300) } else { rng.gen_range(1..=9000) };
            let bytes = pattern(rng, count);
            fs.insert(inode, offset as u64, &bytes).unwrap();
            model.splice(offset..offset, bytes);
        }
        4 | 5 if offset < length => {
            let count = rng.gen_range(1..=5000).min(length - offset);
            fs.collapse_range(inode, offset as u64, count as u64).unwrap();
            model.drain(offset..offset + count);
        }
        6 => {
            let count = rng.gen_range(1..=3000);
            let bytes = pattern(rng, count);
            assert_eq!(fs.write(inode, offset as u64, &bytes).unwrap(), count);
            if model.len() < offset + count {
                model.resize(offset + count, 0);
            }
            model[offset..offset + count].copy_from_slice(&bytes);
        }
        7 if offset < length => {
            let count = rng.gen_range(1..=6000).min(length - offset);
            fs.punch_hole(inode, offset as u64, count as u64).unwrap();
            model[offset..offset + count].fill(0);
        }
        8 => {
            // Mostly trims, sometimes grows with a hole.
            let size = if rng.gen_bool(0.8) { offset } else { length + rng.gen_range(1..=5000) };
            fs.set_attributes(inode, &SetAttributes { size_bytes: Some(size as u64), ..SetAttributes::default() })
                .unwrap();
            model.resize(size, 0);
        }
        _ => {
            // An insert of bytes followed at once by a collapse of some of them: merges of
            // neighbours that share a block, and last references of pack blocks.
            let count = rng.gen_range(2..=200);
            let bytes = pattern(rng, count);
            fs.insert(inode, offset as u64, &bytes).unwrap();
            model.splice(offset..offset, bytes);
            let cut = rng.gen_range(1..count);
            fs.collapse_range(inode, offset as u64, cut as u64).unwrap();
            model.drain(offset..offset + cut);
        }
    }
}

fn compare(fs: &FileSystem, inode: u64, model: &[u8], what: &str) {
    let mut back = vec![0u8; model.len() + 1];
    assert_eq!(fs.read(inode, 0, &mut back).unwrap(), model.len(), "{what}: length");
    let wrong = back.iter().zip(model).filter(|(got, want)| got != want).count();
    assert_eq!(
        wrong,
        0,
        "{what}: {wrong} bytes differ, first at {:?}",
        back.iter().zip(model).position(|(got, want)| got != want)
    );
    let space = fs.space_use(inode).unwrap();
    let mapped = model.iter().len() as u64;
    assert!(space.mapped_bytes <= mapped, "{what}: {space:?} maps more than the file");
    // An extent's bytes touch at most two blocks more than they fill, and shared ones count once.
    assert!(
        space.data_blocks * 4096 <= space.mapped_bytes + 2 * 4096 * space.extents,
        "{what}: holds more than its extents can: {space:?}"
    );
}

fn run(seed: u64) {
    let (memory, _) = memory_volume(64 << 20, false);
    let device: Arc<dyn tandemfs::device::Device> = Arc::new(memory);
    let mut fs = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap().0;
    let inode = fs.create(ROOT_INODE, b"shared", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let mut rng = rng(seed);
    let mut model = pattern(&mut rng, 200_000);
    assert_eq!(fs.write(inode, 0, &model).unwrap(), model.len());
    for operation in 1..=OPERATIONS {
        step(&fs, inode, &mut rng, &mut model);
        if model.len() > 600_000 {
            fs.collapse_range(inode, 0, 300_000).unwrap();
            model.drain(..300_000);
        }
        if operation % 100 == 0 {
            fs.run_backend().unwrap();
            compare(&fs, inode, &model, &format!("seed {seed} operation {operation}"));
        }
        if operation % 500 == 0 {
            fs.unmount().unwrap();
            drop(fs);
            let report = fsck::check(device.clone()).unwrap();
            assert!(report.is_clean(), "seed {seed} operation {operation}: fsck: {:#?}", report.problems);
            fs = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap().0;
        }
    }
    // Everything away: every block goes with its last reference.
    fs.set_attributes(inode, &SetAttributes { size_bytes: Some(0), ..SetAttributes::default() }).unwrap();
    fs.run_backend().unwrap();
    let space = fs.space_use(inode).unwrap();
    assert_eq!(space.data_blocks, 0, "seed {seed}: blocks kept past their last reference: {space:?}");
    fs.unmount().unwrap();
    drop(fs);
    let report = fsck::check(device).unwrap();
    assert!(report.is_clean(), "seed {seed}: fsck at the end: {:#?}", report.problems);
}

#[test]
fn random_byte_edits_share_blocks_and_keep_every_byte() {
    for seed in seeds(0..3) {
        run(seed);
    }
}

/// The counts of shared blocks live in the generation table: when the table blocks that cover a
/// file's shared blocks are lost (zeroed), fsck finds them damaged, and the repair rebuilds them
/// from the blocks' trailers (a data block gets 0) and then records each shared block's count
/// again from the extents that reference it, keeping the file whole. A second repair changes
/// nothing, fsck is clean, every byte reads back, and deleting the file frees every block, fsck
/// clean again (a count left too low would free a block early, one too high would leak it).
#[test]
fn lost_counts_are_recorded_again_by_the_repair() {
    use tandemfs::block::superblock::{Superblock, GENERATIONS_PER_TABLE_BLOCK};
    let (memory, _) = memory_volume(64 << 20, false);
    let device: Arc<dyn tandemfs::device::Device> = Arc::new(memory.clone());
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let inode = fs.create(ROOT_INODE, b"shared", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let mut rng = rng(31);
    let mut model = pattern(&mut rng, 100_000);
    assert_eq!(fs.write(inode, 0, &model).unwrap(), model.len());
    for step in 0..200usize {
        let offset = (step * 499) % model.len();
        let bytes = pattern(&mut rng, 40);
        fs.insert(inode, offset as u64, &bytes).unwrap();
        model.splice(offset..offset, bytes);
    }
    fs.unmount().unwrap();
    drop(fs);
    assert!(fsck::check(device.clone()).unwrap().is_clean());
    // Zero the level-0 table blocks that cover the first 2,032 data blocks (the file's).
    let superblock = Superblock::read_best(&memory).unwrap();
    let first = superblock.first_data_block / GENERATIONS_PER_TABLE_BLOCK;
    for index in first..first + 4 {
        device.write_at((superblock.generation_table_start + index) * 4096, &[0u8; 4096]).unwrap();
    }
    assert!(!fsck::check(device.clone()).unwrap().is_clean(), "fsck finds nothing");
    let repaired = fsck::repair(device.clone(), true, &mut |_| {}).unwrap();
    let recorded = repaired.changes.iter().filter(|change| change.contains("references were recorded")).count();
    assert!(recorded > 20, "{recorded} counts recorded again: {:?}", repaired.changes);
    assert!(repaired.after.is_clean(), "after repair: {:?}", repaired.after.problems);
    let again = fsck::repair(device.clone(), true, &mut |_| {}).unwrap();
    assert!(again.changes.is_empty(), "a second repair changes {:?}", again.changes);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let mut back = vec![0u8; model.len() + 1];
    assert_eq!(fs.read(inode, 0, &mut back).unwrap(), model.len());
    assert!(back[..model.len()] == model[..], "the repair changed the file's bytes");
    fs.unlink(ROOT_INODE, b"shared").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    // fsck finds a block marked in use that nothing references (a leak), or the reverse.
    let report = fsck::check(device).unwrap();
    assert!(report.is_clean(), "after the delete: {:?}", report.problems);
}
