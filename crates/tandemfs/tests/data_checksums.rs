//! Data checksums (format version 4): a bit flipped in a file's data block makes every read
//! that touches the block fail with a corruption error (EIO at the mount), never return the
//! wrong bytes, and fsck names the inode, the file offset and the block; the blocks around it
//! still read. Every way data moves between blocks (partial writes, insert and collapse inside
//! blocks, punched holes, zeroed ranges, unwritten extents, truncation) reads back and checks
//! clean, before and after a remount.

mod common;

use common::*;
use rand::Rng;
use std::sync::Arc;
use tandemfs::block::meta::{BLOCK_SIZE, BLOCK_SIZE_U64};
use tandemfs::block::superblock::Superblock;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

const VOLUME_BYTES: u64 = 16 << 20;

fn random_bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut rng = rng(seed);
    (0..length).map(|_| rng.gen()).collect()
}

fn mount(memory: &MemoryDevice) -> FileSystem {
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    FileSystem::mount(device, &inline_options()).unwrap().0
}

/// The volume block that holds exactly `bytes` (one block of random data), found by search.
fn block_holding(memory: &MemoryDevice, bytes: &[u8]) -> u64 {
    assert_eq!(bytes.len(), BLOCK_SIZE);
    let superblock = Superblock::read_best(memory).unwrap();
    let mut block = vec![0u8; BLOCK_SIZE];
    (superblock.first_data_block..superblock.block_count)
        .find(|number| {
            memory.read_at(number * BLOCK_SIZE_U64, &mut block).unwrap();
            block == bytes
        })
        .expect("the data block is on the device")
}

fn flip_bit(memory: &MemoryDevice, byte: u64, bit: u8) {
    let mut one = [0u8; 1];
    memory.read_at(byte, &mut one).unwrap();
    memory.write_at(byte, &[one[0] ^ (1 << bit)]).unwrap();
}

fn read_all(fs: &FileSystem, inode: u64, offset: u64, length: usize) -> tandemfs::Result<Vec<u8>> {
    let mut buffer = vec![0u8; length];
    let count = fs.read(inode, offset, &mut buffer)?;
    buffer.truncate(count);
    Ok(buffer)
}

#[test]
fn a_flipped_bit_in_file_data_is_an_error_never_wrong_bytes() {
    let (memory, _) = memory_volume(VOLUME_BYTES, false);
    let data = random_bytes(7, 10 * BLOCK_SIZE + 1000);
    let fs = mount(&memory);
    let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, &data).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let damaged_block = block_holding(&memory, &data[3 * BLOCK_SIZE..4 * BLOCK_SIZE]);
    flip_bit(&memory, damaged_block * BLOCK_SIZE_U64 + 1234, 5);

    let report = fsck::check(Arc::new(memory.clone())).unwrap();
    assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
    assert_eq!(report.damaged_data_blocks, 1, "the CLI says this block stays damaged after a repair");
    let problem = &report.problems[0];
    for part in
        [format!("inode {file}"), format!("file offset {}", 3 * BLOCK_SIZE), format!("data block {damaged_block}")]
    {
        assert!(problem.contains(&part), "fsck says {problem:?}, without {part:?}");
    }

    let fs = mount(&memory);
    // Every read touching the damaged block fails with corruption (EIO at the mount), whole
    // or in part, aligned or not; the message names the inode, the bytes and the block.
    for (offset, length) in
        [(0, data.len()), (3 * BLOCK_SIZE, BLOCK_SIZE), (3 * BLOCK_SIZE + 1234, 1), (2 * BLOCK_SIZE + 10, 5000)]
    {
        let error = read_all(&fs, file, offset as u64, length).unwrap_err();
        assert!(error.is_corruption(), "read of {length} at {offset}: {error:?}");
        let text = error.to_string();
        assert!(
            text.contains(&format!("inode {file}")) && text.contains(&format!("data block {damaged_block}")),
            "{text}"
        );
    }
    // Not even the buffer of a failed read holds the damaged byte.
    let mut buffer = vec![0u8; data.len()];
    assert!(fs.read(file, 0, &mut buffer).unwrap_err().is_corruption());
    let damaged_at = 3 * BLOCK_SIZE + 1234;
    assert_ne!(buffer[damaged_at], data[damaged_at] ^ (1 << 5), "the damaged byte reached the caller");
    // The blocks around it read right.
    for (offset, length) in
        [(0, 3 * BLOCK_SIZE), (4 * BLOCK_SIZE, data.len() - 4 * BLOCK_SIZE), (3 * BLOCK_SIZE - 7, 7)]
    {
        assert_eq!(read_all(&fs, file, offset as u64, length).unwrap(), data[offset..offset + length]);
    }
    // A write over part of the damaged block leaves it damaged (the rest of it is still wrong):
    // it is not blessed by a new checksum.
    fs.write(file, 3 * BLOCK_SIZE as u64, &[0xAA; 100]).unwrap();
    fs.run_backend().unwrap();
    assert!(read_all(&fs, file, 3 * BLOCK_SIZE as u64, 100).unwrap_err().is_corruption());
    // A write of the whole block replaces every damaged byte: the block reads again.
    let fresh = random_bytes(8, BLOCK_SIZE);
    fs.write(file, 3 * BLOCK_SIZE as u64, &fresh).unwrap();
    fs.run_backend().unwrap();
    assert_eq!(read_all(&fs, file, 3 * BLOCK_SIZE as u64, BLOCK_SIZE).unwrap(), fresh);
    fs.unmount().unwrap();
    drop(fs);
    assert!(fsck::check(Arc::new(memory.clone())).unwrap().is_clean());
}

#[test]
fn a_damaged_checksum_table_block_fails_reads_and_fsck() {
    let (memory, _) = memory_volume(VOLUME_BYTES, false);
    let data = random_bytes(9, 3 * BLOCK_SIZE);
    let fs = mount(&memory);
    let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, &data).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let block = block_holding(&memory, &data[..BLOCK_SIZE]);
    let superblock = Superblock::read_best(&memory).unwrap();
    let table_block = superblock.checksum_table_start + block / 1016;
    flip_bit(&memory, table_block * BLOCK_SIZE_U64 + (block % 1016) * 4, 0);
    let report = fsck::check(Arc::new(memory.clone())).unwrap();
    assert!(
        report.problems.iter().any(|problem| problem.contains(&format!("{table_block}"))),
        "{:#?}",
        report.problems
    );
    let fs = mount(&memory);
    assert!(read_all(&fs, file, 0, 10).unwrap_err().is_corruption());
    fs.unmount().unwrap();
    drop(fs);
    // The repair rebuilds the table block from the data as it is now, and says the old
    // checksums were lost; the file reads back.
    let repaired = fsck::repair(Arc::new(memory.clone()), true, &mut |_| {}).unwrap();
    assert!(
        repaired.changes.iter().any(|change| change.contains(&format!("data checksum table block {table_block}"))
            && change.contains("3 data blocks")
            && change.contains("lost")),
        "{:#?}",
        repaired.changes
    );
    assert!(repaired.after.is_clean(), "{:#?}", repaired.after.problems);
    let fs = mount(&memory);
    assert_eq!(read_all(&fs, file, 0, data.len()).unwrap(), data);
}

#[test]
fn repair_reports_damaged_data_it_cannot_recover() {
    let (memory, _) = memory_volume(VOLUME_BYTES, false);
    let data = random_bytes(11, 2 * BLOCK_SIZE);
    let fs = mount(&memory);
    let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, &data).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let block = block_holding(&memory, &data[BLOCK_SIZE..]);
    flip_bit(&memory, block * BLOCK_SIZE_U64 + 17, 2);
    let repaired = fsck::repair(Arc::new(memory.clone()), true, &mut |_| {}).unwrap();
    let problems = &repaired.after.problems;
    assert!(
        problems.len() == 1
            && problems[0].contains(&format!("inode {file}: file offset {BLOCK_SIZE}: data block {block}")),
        "{problems:#?}"
    );
    // Still an error, never the damaged bytes; the block before it reads.
    let fs = mount(&memory);
    assert!(read_all(&fs, file, BLOCK_SIZE as u64, 10).unwrap_err().is_corruption());
    assert_eq!(read_all(&fs, file, 0, BLOCK_SIZE).unwrap(), data[..BLOCK_SIZE]);
}

/// One change to the file and to its model.
fn apply(fs: &FileSystem, file: u64, model: &mut Vec<u8>, step: usize, rng: &mut rand::rngs::SmallRng) {
    let length = model.len() as u64;
    let offset = if length == 0 { 0 } else { rng.gen_range(0..length) };
    let span = rng.gen_range(1..3 * BLOCK_SIZE as u64);
    match step % 8 {
        0 => {
            let bytes = random_bytes(step as u64, span as usize);
            fs.write(file, offset, &bytes).unwrap();
            let end = offset as usize + bytes.len();
            if model.len() < end {
                model.resize(end, 0);
            }
            model[offset as usize..end].copy_from_slice(&bytes);
        }
        1 => {
            let bytes = random_bytes(step as u64 + 1000, span as usize);
            fs.insert(file, offset, &bytes).unwrap();
            model.splice(offset as usize..offset as usize, bytes);
        }
        2 => {
            let span = span.min(length - offset);
            fs.collapse_range(file, offset, span).unwrap();
            model.drain(offset as usize..(offset + span) as usize);
        }
        3 => {
            fs.punch_hole(file, offset, span).unwrap();
            let end = (offset + span).min(length) as usize;
            model[offset as usize..end].fill(0);
        }
        4 => {
            fs.zero_range(file, offset, span, true).unwrap();
            let end = (offset + span).min(length) as usize;
            model[offset as usize..end].fill(0);
        }
        5 => {
            // Unwritten blocks past the end, then a write into part of them.
            fs.allocate(file, length, span, false).unwrap();
            model.resize((length + span) as usize, 0);
            let at = length + rng.gen_range(0..span);
            let bytes = random_bytes(step as u64 + 2000, rng.gen_range(1..200));
            fs.write(file, at, &bytes).unwrap();
            let end = at as usize + bytes.len();
            if model.len() < end {
                model.resize(end, 0);
            }
            model[at as usize..end].copy_from_slice(&bytes);
        }
        6 => {
            let new_length = rng.gen_range(length / 2..=length + 5000);
            let attributes = SetAttributes { size_bytes: Some(new_length), ..SetAttributes::default() };
            fs.set_attributes(file, &attributes).unwrap();
            model.resize(new_length as usize, 0);
        }
        _ => {
            // Small writes inside one block, at odd offsets.
            for round in 0..5u64 {
                let at = if model.is_empty() { 0 } else { rng.gen_range(0..model.len() as u64) };
                let bytes = random_bytes(step as u64 * 10 + round, rng.gen_range(1..64));
                fs.write(file, at, &bytes).unwrap();
                let end = at as usize + bytes.len();
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[at as usize..end].copy_from_slice(&bytes);
            }
        }
    }
}

#[test]
fn data_moved_between_blocks_keeps_its_checksums() {
    let (memory, _) = memory_volume(VOLUME_BYTES, false);
    let mut rng = rng(17);
    let mut fs = mount(&memory);
    let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let mut model = random_bytes(1, 9 * BLOCK_SIZE + 333);
    fs.write(file, 0, &model).unwrap();
    for step in 0..240 {
        apply(&fs, file, &mut model, step, &mut rng);
        if step % 7 == 0 {
            fs.run_backend().unwrap();
        }
        if step % 13 == 0 {
            fs.checkpoint().unwrap();
        }
        if step % 40 == 39 {
            // Everything applied, checked against the checksums from the device.
            fs.unmount().unwrap();
            drop(fs);
            let report = fsck::check(Arc::new(memory.clone())).unwrap();
            assert!(report.is_clean(), "step {step}: {:#?}", report.problems);
            fs = mount(&memory);
        }
        let back = read_all(&fs, file, 0, model.len() + 10).unwrap_or_else(|error| panic!("step {step}: {error}"));
        assert!(back == model, "step {step}: the file differs from its model");
    }
}

/// An insert inside a damaged block copies part of it to a block of its own: the back end goes
/// on (the volume does not fail over one damaged block), and the damage travels with the copy,
/// so both parts read as errors, never as the damaged bytes.
#[test]
fn an_insert_inside_a_damaged_block_keeps_the_volume_and_the_damage() {
    let (memory, _) = memory_volume(VOLUME_BYTES, false);
    let data = random_bytes(12, 3 * BLOCK_SIZE);
    let fs = mount(&memory);
    let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let other = fs.create(ROOT_INODE, b"g", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, &data).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let block = block_holding(&memory, &data[BLOCK_SIZE..2 * BLOCK_SIZE]);
    flip_bit(&memory, block * BLOCK_SIZE_U64 + 100, 1);
    let fs = mount(&memory);
    let middle = BLOCK_SIZE as u64 + 2000;
    fs.insert(file, middle, b"inserted").unwrap();
    fs.run_backend().unwrap();
    // The bytes before the insert (copied out, damaged byte among them) and after it both fail.
    assert!(read_all(&fs, file, BLOCK_SIZE as u64, 10).unwrap_err().is_corruption());
    assert!(read_all(&fs, file, middle + 8, 10).unwrap_err().is_corruption());
    assert_eq!(read_all(&fs, file, 0, BLOCK_SIZE).unwrap(), data[..BLOCK_SIZE]);
    // The inserted bytes may share the copy's block (it fills the room after the copied
    // bytes): right, or an error, never other bytes.
    match read_all(&fs, file, middle, 8) {
        Ok(bytes) => assert_eq!(bytes, b"inserted"),
        Err(error) => assert!(error.is_corruption(), "{error:?}"),
    }
    // The volume still takes changes.
    fs.write(other, 0, b"still working").unwrap();
    fs.sync().unwrap();
    fs.run_backend().unwrap();
    assert_eq!(read_all(&fs, other, 0, 13).unwrap(), b"still working");
    fs.unmount().unwrap();
    drop(fs);
    let report = fsck::check(Arc::new(memory.clone())).unwrap();
    assert_eq!(report.problems.len(), 2, "{:#?}", report.problems);
}
