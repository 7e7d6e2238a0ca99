//! Large writes straight home (direct-write records, format version 8): the bytes go to newly
//! claimed blocks, through the device stack, before a record that only maps them is logged.
//! Here: reads before and after the record is applied, a full volume half way through a
//! write (nothing leaks, the file keeps what was acknowledged), an encrypted volume whose
//! direct blocks are encrypted and checksum-checked on every read, and damage in a direct block
//! caught by its checksum. The crash cases are in `crash.rs`, the random ones in `model.rs`.

mod common;

use common::*;
use tandemfs::block::meta::BLOCK_SIZE;
use tandemfs::device::Device;
use tandemfs::error::Error;
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

fn pattern_bytes(length: usize, seed: u8) -> Vec<u8> {
    (0..length).map(|index| (index % 241) as u8 ^ seed).collect()
}

/// Inline back end (records apply only when asked), writes of 64 KiB or more go direct, each
/// computing its checksums and pending copy on the writing thread (the default).
fn options() -> MountOptions {
    MountOptions { direct_write_min_bytes: 64 << 10, direct_write_overlap_min_bytes: 0, ..inline_options() }
}

/// As `options`, with every direct write computing its checksums and pending copy on a second
/// thread while its bytes go home (`-o direct_write_overlap_min_bytes`).
fn overlapping_options() -> MountOptions {
    MountOptions { direct_write_overlap_min_bytes: 64 << 10, ..options() }
}

fn new_file(fs: &FileSystem, name: &[u8]) -> u64 {
    fs.create(ROOT_INODE, name, FileType::Regular, 0o644, 0, 0, 0).unwrap().inode
}

fn read_all(fs: &FileSystem, inode: u64) -> Result<Vec<u8>, Error> {
    let size = fs.get_attributes(inode)?.size_bytes as usize;
    let mut buffer = vec![0u8; size];
    let read = fs.read(inode, 0, &mut buffer)?;
    assert_eq!(read, size);
    Ok(buffer)
}

#[test]
fn reads_see_a_direct_write_before_and_after_it_is_applied() {
    reads_see_direct_writes(&options());
}

#[test]
fn reads_see_an_overlapped_direct_write_before_and_after_it_is_applied() {
    reads_see_direct_writes(&overlapping_options());
}

fn reads_see_direct_writes(options: &MountOptions) {
    let (_memory, device) = memory_volume(64 << 20, false);
    let (fs, _) = FileSystem::mount(device.clone(), options).unwrap();
    let file = new_file(&fs, b"f");
    let small = pattern_bytes(10_000, 1);
    fs.write(file, 0, &small).unwrap();
    // An append at an odd offset: straight home.
    let large = pattern_bytes(300_001, 2);
    fs.write(file, 10_000, &large).unwrap();
    assert_eq!(fs.direct_write_records(), 1);
    let mut expected = small.clone();
    expected.extend_from_slice(&large);
    assert!(read_all(&fs, file).unwrap() == expected, "before the record is applied");
    fs.sync().unwrap();
    fs.run_backend().unwrap();
    assert!(read_all(&fs, file).unwrap() == expected, "after it is applied");
    // A small logged write into the direct blocks; a large one over written bytes stays on
    // the log (in place: no new blocks for bytes that have them).
    fs.write(file, 100_000, b"small over direct").unwrap();
    expected[100_000..100_017].copy_from_slice(b"small over direct");
    fs.write(file, 200_000, &pattern_bytes(100_000, 3)).unwrap();
    expected[200_000..300_000].copy_from_slice(&pattern_bytes(100_000, 3));
    assert_eq!(fs.direct_write_records(), 1, "an overwrite is not direct");
    // Into a punched hole, once the punch is applied: direct again. The direct bytes start
    // at file byte 10,000 on a block boundary, so the punch frees whole blocks from 75,536.
    fs.punch_hole(file, 75_536, 131_072).unwrap();
    fs.sync().unwrap();
    fs.run_backend().unwrap();
    fs.write(file, 75_536, &pattern_bytes(131_072, 4)).unwrap();
    expected[75_536..206_608].copy_from_slice(&pattern_bytes(131_072, 4));
    assert_eq!(fs.direct_write_records(), 2, "a hole is filled straight home");
    assert!(read_all(&fs, file).unwrap() == expected);
    fs.unmount().unwrap();
    drop(fs);
    assert!(fsck::check(device.clone()).unwrap().is_clean());
    let (fs, _) = FileSystem::mount(device, options).unwrap();
    assert!(read_all(&fs, file).unwrap() == expected, "after a remount");
    fs.unmount().unwrap();
}

/// Over fallocated space a large write stays on the log and goes in place: a full volume
/// still takes it (`posix_fallocate`'s promise), where a direct write would need new blocks.
#[test]
fn a_large_write_into_fallocated_space_on_a_full_volume_succeeds() {
    let (_memory, device) = memory_volume(32 << 20, false);
    let (fs, _) = FileSystem::mount(device, &options()).unwrap();
    let reserved = new_file(&fs, b"reserved");
    fs.allocate(reserved, 0, 4 << 20, false).unwrap();
    let filler = new_file(&fs, b"filler");
    let chunk = pattern_bytes(1 << 20, 5);
    let mut filled = 0u64;
    for _ in 0..64 {
        match fs.write(filler, filled, &chunk) {
            Ok(count) => filled += count as u64,
            Err(Error::NoSpace) => break,
            Err(error) => panic!("filling: {error}"),
        }
    }
    assert!(matches!(fs.write(filler, filled, &chunk), Err(Error::NoSpace)), "the volume is full");
    let before = fs.direct_write_records();
    let data = pattern_bytes(2 << 20, 6);
    assert_eq!(fs.write(reserved, 4096, &data).unwrap(), data.len());
    assert_eq!(fs.direct_write_records(), before);
    fs.sync().unwrap();
    let mut back = vec![0u8; data.len()];
    fs.read(reserved, 4096, &mut back).unwrap();
    assert!(back == data);
    fs.unmount().unwrap();
}

/// A write of several direct records (16 MiB each at most) on a volume that fills half way: the records before the
/// full one stay (a short write, as write(2) reports it), the one that found no space is not
/// logged, and its claimed blocks go back: after a remount the free count is what the file's
/// blocks leave, and fsck is clean.
#[test]
fn a_full_volume_half_way_through_a_direct_write_leaks_nothing() {
    let (_memory, device) = memory_volume(64 << 20, false);
    let (fs, _) = FileSystem::mount(device.clone(), &options()).unwrap();
    let file = new_file(&fs, b"big");
    fs.sync().unwrap();
    fs.run_backend().unwrap();
    fs.checkpoint().unwrap();
    let free_before = fs.statistics().unwrap().blocks_free;
    let too_much = pattern_bytes(100 << 20, 4);
    let written = match fs.write(file, 0, &too_much) {
        Ok(count) => count,
        Err(error) => panic!("the first records fit: a short write, not {error}"),
    };
    assert!(written > 0 && written < too_much.len(), "{written} of {} bytes", too_much.len());
    // The next write gets the error, and changes nothing.
    let error = fs.write(file, written as u64, &too_much[written..]).unwrap_err();
    assert!(matches!(error, Error::NoSpace), "{error}");
    assert_eq!(fs.get_attributes(file).unwrap().size_bytes, written as u64);
    assert!(read_all(&fs, file).unwrap() == too_much[..written]);
    // The failed record's claims went back: what the volume says is free can be written and
    // applied (a claim kept would leave the back end short of the blocks promised).
    fs.sync().unwrap();
    fs.run_backend().unwrap();
    let free = fs.statistics().unwrap().blocks_free;
    assert!(free > 64, "{free} blocks left");
    let rest = new_file(&fs, b"rest");
    let fill = pattern_bytes((free as usize - 48) * BLOCK_SIZE, 7);
    assert_eq!(fs.write(rest, 0, &fill).unwrap(), fill.len());
    fs.sync().unwrap();
    fs.run_backend().unwrap();
    assert!(read_all(&fs, rest).unwrap() == fill);
    fs.unlink(ROOT_INODE, b"rest").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
    let (fs, _) = FileSystem::mount(device.clone(), &options()).unwrap();
    let used = free_before - fs.statistics().unwrap().blocks_free;
    let data_blocks = written.div_ceil(BLOCK_SIZE) as u64;
    // The file's data blocks and a few extent-tree blocks; a leaked claim would be thousands.
    assert!(used >= data_blocks && used <= data_blocks + 8, "{used} blocks used for {data_blocks} of data");
    // Delete it: every block comes back.
    fs.unlink(ROOT_INODE, b"big").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let (fs, _) = FileSystem::mount(device, &options()).unwrap();
    fs.checkpoint().unwrap();
    assert_eq!(fs.statistics().unwrap().blocks_free, free_before);
    fs.unmount().unwrap();
}

/// An encrypted volume: a direct write's blocks reach the medium encrypted (the plaintext is
/// nowhere on it), read back whole after a remount through the checksum check, and a byte
/// changed in one of them on the medium fails the read of that block (a corruption error,
/// never wrong bytes) while the blocks around it still read.
#[test]
fn direct_blocks_on_an_encrypted_volume_are_encrypted_and_checked() {
    direct_blocks_encrypted_and_checked(options());
}

/// The same with the checksums computed on a second thread: they still describe the blocks.
#[test]
fn overlapped_direct_blocks_on_an_encrypted_volume_are_encrypted_and_checked() {
    direct_blocks_encrypted_and_checked(overlapping_options());
}

fn direct_blocks_encrypted_and_checked(options: MountOptions) {
    let secret = test_secret();
    let (memory, device) = memory_volume_with(32 << 20, false, Some(&secret));
    let options = MountOptions { key: Some(secret.clone()), ..options };
    let (fs, _) = FileSystem::mount(device.clone(), &options).unwrap();
    let file = new_file(&fs, b"secret");
    let before = memory.to_bytes();
    let data = pattern_bytes(1 << 20, 5);
    fs.write(file, 0, &data).unwrap();
    assert_eq!(fs.direct_write_records(), 1);
    fs.unmount().unwrap();
    drop(fs);
    let after = memory.to_bytes();
    let marker = &data[4096..4096 + 64];
    assert!(!after.windows(64).any(|window| window == marker), "plaintext of a direct block on the medium");
    // The direct blocks: the longest run of blocks that changed.
    let changed: Vec<usize> = (0..after.len() / BLOCK_SIZE)
        .filter(|block| before[block * BLOCK_SIZE..][..BLOCK_SIZE] != after[block * BLOCK_SIZE..][..BLOCK_SIZE])
        .collect();
    let mut best = (0, 0);
    let mut start = 0;
    for index in 1..=changed.len() {
        if index == changed.len() || changed[index] != changed[index - 1] + 1 {
            if index - start > best.1 - best.0 {
                best = (start, index);
            }
            start = index;
        }
    }
    assert!(best.1 - best.0 >= 256, "the 256 direct blocks are not one changed run");
    let report = check_with_key(device.clone(), Some(&secret));
    assert!(report.is_clean(), "{:#?}", report.problems);
    let (fs, _) = FileSystem::mount(device.clone(), &options).unwrap();
    assert!(read_all(&fs, file).unwrap() == data, "read back after a remount");
    fs.unmount().unwrap();
    drop(fs);
    // Damage one direct block (the 10th of the file) on the medium.
    let block = changed[best.0 + 10];
    let mut byte = [0u8; 1];
    memory.read_at((block * BLOCK_SIZE + 100) as u64, &mut byte).unwrap();
    memory.write_at((block * BLOCK_SIZE + 100) as u64, &[byte[0] ^ 0x40]).unwrap();
    let (fs, _) = FileSystem::mount(device, &options).unwrap();
    let mut failed = Vec::new();
    let mut buffer = vec![0u8; BLOCK_SIZE];
    for index in 0..data.len() / BLOCK_SIZE {
        match fs.read(file, (index * BLOCK_SIZE) as u64, &mut buffer) {
            Ok(read) => {
                assert_eq!(read, BLOCK_SIZE);
                assert!(buffer == data[index * BLOCK_SIZE..][..BLOCK_SIZE], "block {index} read wrong bytes");
            }
            Err(error) => {
                assert!(error.is_corruption(), "{error}");
                failed.push(index);
            }
        }
    }
    assert_eq!(failed.len(), 1, "exactly the damaged block fails: {failed:?}");
    fs.unmount().unwrap();
}

/// With the threshold at 0 every write keeps the log; at 1 even a byte goes straight home.
#[test]
fn the_threshold_picks_the_path() {
    for (threshold, expected) in [(0u64, 0u64), (1, 2)] {
        let (_memory, device) = memory_volume(16 << 20, false);
        let options = MountOptions { direct_write_min_bytes: threshold, ..inline_options() };
        let (fs, _) = FileSystem::mount(device.clone(), &options).unwrap();
        let file = new_file(&fs, b"f");
        fs.write(file, 0, b"x").unwrap();
        fs.write(file, 1, &pattern_bytes(1 << 20, 6)).unwrap();
        assert_eq!(fs.direct_write_records(), expected, "threshold {threshold}");
        let mut expected_bytes = b"x".to_vec();
        expected_bytes.extend_from_slice(&pattern_bytes(1 << 20, 6));
        assert!(read_all(&fs, file).unwrap() == expected_bytes);
        fs.unmount().unwrap();
        drop(fs);
        assert!(fsck::check(device).unwrap().is_clean());
    }
}

/// The device refuses a direct write's data: the write fails with the error, logs nothing and
/// changes nothing, and its claimed blocks and reservation go back at once, so that a write of
/// all the free space then succeeds and applies (it comes back short if the failed one's blocks
/// are still claimed).
#[test]
fn a_failed_direct_write_gives_its_blocks_back() {
    use tandemfs::device::{Fault, FaultOperation};
    let (memory, device) = memory_volume(64 << 20, false);
    let (fs, _) = FileSystem::mount(device.clone(), &options()).unwrap();
    let file = new_file(&fs, b"f");
    fs.write(file, 0, b"before").unwrap();
    fs.sync().unwrap();
    fs.run_backend().unwrap();
    fs.checkpoint().unwrap();
    let free = fs.statistics().unwrap().blocks_free as usize;
    let large = pattern_bytes((free - 48) * BLOCK_SIZE, 8);
    memory.inject(Fault { operation: FaultOperation::Write, after_operations: 0, repeat: false, range: None });
    let error = fs.write(file, 6, &large).unwrap_err();
    assert!(!error.is_corruption(), "{error}");
    assert_eq!(fs.direct_write_records(), 0);
    assert!(read_all(&fs, file).unwrap() == b"before");
    assert_eq!(fs.statistics().unwrap().blocks_free as usize, free);
    assert_eq!(fs.write(file, 6, &large).unwrap(), large.len());
    assert!(fs.direct_write_records() > 0);
    fs.sync().unwrap();
    fs.run_backend().unwrap();
    let mut expected = b"before".to_vec();
    expected.extend_from_slice(&large);
    assert!(read_all(&fs, file).unwrap() == expected);
    fs.unmount().unwrap();
    drop(fs);
    assert!(fsck::check(device).unwrap().is_clean());
}
