//! The lazy inode table (issue 13, finding 11): mkfs leaves the inode table as it found it and
//! the superblock's initialized mark says which blocks hold valid contents. These tests format
//! devices full of old bytes, so that any read past the mark, or a mark that moves before the
//! blocks under it are zero or valid, shows up as a corruption error or a missing file.

mod common;

use common::*;
use std::sync::Arc;
use tandemfs::block::superblock::{Superblock, INODES_PER_BLOCK};
use tandemfs::device::{CrashMode, Device, Fault, FaultOperation, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

const VOLUME_BYTES: u64 = 32 << 20;
/// Enough files to span several inode-table blocks (15 inodes each).
const FILE_COUNT: u64 = 100;

/// A device whose every byte is old garbage, formatted.
fn formatted_over_garbage() -> MemoryDevice {
    let bytes: Vec<u8> = (0..VOLUME_BYTES).map(|index| (index as u8).wrapping_mul(31) ^ 0xA5).collect();
    let memory = MemoryDevice::from_bytes_with_crash_model(bytes);
    let options = FormatOptions { hash_seed: Some([1, 2, 3, 4]), uuid: Some([9; 16]), ..FormatOptions::default() };
    FileSystem::format(Arc::new(memory.clone()), &options).expect("format");
    memory
}

fn content(index: u64) -> Vec<u8> {
    format!("file {index} of the lazy inode table test\n").into_bytes().repeat(index as usize % 7 + 1)
}

fn create_files(fs: &FileSystem, range: std::ops::Range<u64>) {
    for index in range {
        let name = format!("file-{index}");
        let inode = fs.create(ROOT_INODE, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
        assert_eq!(fs.write(inode, 0, &content(index)).unwrap(), content(index).len());
    }
}

fn check_files(fs: &FileSystem, range: std::ops::Range<u64>) {
    for index in range {
        let name = format!("file-{index}");
        let attributes = fs.lookup(ROOT_INODE, name.as_bytes()).unwrap_or_else(|error| panic!("{name}: {error}"));
        let mut buffer = vec![0u8; attributes.size_bytes as usize];
        assert_eq!(fs.read(attributes.inode, 0, &mut buffer).unwrap(), buffer.len());
        assert_eq!(buffer, content(index), "{name}");
    }
}

fn assert_clean(memory: &MemoryDevice) {
    let report = fsck::check(Arc::new(memory.clone())).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
}

#[test]
fn mkfs_leaves_the_table_and_the_mark_grows_with_use() {
    let memory = formatted_over_garbage();
    let superblock = Superblock::read_best(&memory).unwrap();
    // Only the root inode's block was written.
    assert_eq!(superblock.inode_table_initialized_blocks, 1);
    let table_byte = (superblock.inode_table_start + 5) * 4096;
    let mut old = vec![0u8; 4096];
    memory.read_at(table_byte, &mut old).unwrap();
    assert!(old.iter().any(|&byte| byte != 0), "mkfs zeroed the inode table");
    assert_clean(&memory);

    let device: Arc<dyn Device> = Arc::new(memory.clone());
    let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
    create_files(&fs, 0..FILE_COUNT);
    fs.unmount().unwrap();
    let superblock = Superblock::read_best(&memory).unwrap();
    assert!(superblock.inode_table_initialized_blocks >= (FILE_COUNT + 1).div_ceil(INODES_PER_BLOCK));
    assert!(superblock.inode_table_initialized_blocks < superblock.inode_table_blocks);
    assert_clean(&memory);
    let (fs, _) = FileSystem::mount(Arc::new(memory.clone()), &inline_options()).unwrap();
    check_files(&fs, 0..FILE_COUNT);
    fs.unmount().unwrap();
}

/// The checkpoint writes inode-table blocks past the mark home and then fails to write the
/// superblock that moves the mark (a crash between the two): the next mount must complete the
/// checkpoint from the log, move the mark, and lose nothing; fsck must agree before and after.
#[test]
fn a_crash_before_the_mark_moves_loses_nothing() {
    let memory = formatted_over_garbage();
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
    create_files(&fs, 0..10);
    fs.checkpoint().unwrap();
    create_files(&fs, 10..FILE_COUNT);
    fs.sync().unwrap();
    let mark_before = Superblock::read_best(&memory).unwrap().inode_table_initialized_blocks;
    // Superblock writes fail from now on: the checkpoint gets its images home, not the mark.
    memory.inject(Fault::always(FaultOperation::Write).in_range(0, 2 * 4096));
    assert!(fs.checkpoint().is_err(), "the superblock write was to fail");
    drop(fs);
    let memory = memory.crash(7, CrashMode::KeepAll);
    let superblock = Superblock::read_best(&memory).unwrap();
    assert_eq!(superblock.inode_table_initialized_blocks, mark_before, "the mark moved without its superblock");
    let start = superblock.inode_table_start;
    let mut block = vec![0u8; 4096];
    memory.read_at((start + mark_before) * 4096, &mut block).unwrap();
    assert!(block.iter().any(|&byte| byte != 0), "the checkpoint was to write past the mark");
    assert_clean(&memory);
    let (fs, report) = FileSystem::mount(Arc::new(memory.clone()), &inline_options()).unwrap();
    assert!(report.checkpoint_completed || report.records_replayed > 0, "{report:?}");
    check_files(&fs, 0..FILE_COUNT);
    fs.unmount().unwrap();
    let mark_after = Superblock::read_best(&memory).unwrap().inode_table_initialized_blocks;
    assert!(mark_after > mark_before, "mark {mark_after} did not pass {mark_before}");
    assert_clean(&memory);
}
