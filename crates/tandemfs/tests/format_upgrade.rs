//! A volume of an earlier format version (5 to 8) is read by this build and taken forward to
//! the current one (9) by its first read-write mount, before anything of this build reaches home.
//! Versions 6 to 8 only widened what the volume may hold (a free leaving its generation-table and
//! checksum entries, the compaction and direct-write records, shared blocks), so an older volume
//! is first recorded as version 8. Version 9 moves checkpoint images out of the record log into
//! an image log carved from the record log's data ring: the mount replays the old log as it was
//! written, checkpoints into it as version 8 did, and then splits the emptied log.
//!
//! The volume is a real version-8 one: `tests/data/v8-crashed.bin` was written by the version-8
//! build (commit 7918998, the program in `tests/data/README.md`) and killed with records pending
//! after a checkpoint whose images are in its log.

mod common;

use common::{forget_dead_mount, killed_mount, writes_of_a_mount};
use std::sync::Arc;
use tandemfs::block::superblock::{Superblock, FORMAT_VERSION, OFFSET_CRC, OFFSET_VERSION};
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

/// The version-8 volume, decoded: runs of (u32 zero bytes, u32 literal bytes, the literal).
fn version_8_image() -> Vec<u8> {
    let encoded = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/v8-crashed.bin")).unwrap();
    let mut image = Vec::with_capacity(16 << 20);
    let mut at = 0;
    while at < encoded.len() {
        let zeros = u32::from_le_bytes(encoded[at..at + 4].try_into().unwrap()) as usize;
        let literal = u32::from_le_bytes(encoded[at + 4..at + 8].try_into().unwrap()) as usize;
        image.resize(image.len() + zeros, 0);
        image.extend_from_slice(&encoded[at + 8..at + 8 + literal]);
        at += 8 + literal;
    }
    assert_eq!(image.len(), 16 << 20);
    // The killed version-8 mount's stamp, which every mount would wait out.
    let memory = MemoryDevice::from_bytes(image);
    forget_dead_mount(&(Arc::new(memory.clone()) as Arc<dyn Device>));
    memory.to_bytes()
}

/// Rewrites both superblock copies as `version`, with their checksums.
fn set_version(device: &dyn Device, version: u32) {
    for copy in 0..2u64 {
        let mut block = vec![0u8; 4096];
        device.read_at(copy * 4096, &mut block).unwrap();
        block[OFFSET_VERSION..OFFSET_VERSION + 4].copy_from_slice(&version.to_le_bytes());
        let crc = tandem_accel::crc32c(0, &block[..OFFSET_CRC]);
        block[OFFSET_CRC..OFFSET_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        device.write_at(copy * 4096, &block).unwrap();
    }
}

fn on_disk_version(device: &dyn Device) -> u32 {
    Superblock::read_both(device).unwrap().best.format_version
}

fn read_all(fs: &FileSystem, directory: &[u8], name: &str) -> Option<Vec<u8>> {
    let directory = fs.lookup(ROOT_INODE, directory).ok()?.inode;
    let attributes = fs.lookup(directory, name.as_bytes()).ok()?;
    let mut data = vec![0u8; attributes.size_bytes as usize];
    fs.read(attributes.inode, 0, &mut data).unwrap();
    Some(data)
}

/// Everything the version-8 build acknowledged before it was killed: checkpointed files, files
/// applied but not checkpointed, and records never applied (an unlink among them).
fn assert_version_8_files(fs: &FileSystem) {
    for index in 0..20u8 {
        let expected = (index != 3).then(|| vec![index + 1; 5000 + index as usize * 100]);
        assert_eq!(read_all(fs, b"checkpointed", &format!("f{index}")), expected, "f{index}");
    }
    for index in 0..10u8 {
        assert_eq!(read_all(fs, b"applied", &format!("a{index}")), Some(vec![0x40 + index; 3000]), "a{index}");
        assert_eq!(read_all(fs, b"pending", &format!("p{index}")), Some(vec![0x80 + index; 7000]), "p{index}");
    }
}

#[test]
fn a_version_5_volume_mounts_and_is_taken_forward_by_a_read_write_mount() {
    taken_forward(5);
}

#[test]
fn a_version_6_volume_mounts_and_is_taken_forward_by_a_read_write_mount() {
    taken_forward(6);
}

#[test]
fn a_version_7_volume_mounts_and_is_taken_forward_by_a_read_write_mount() {
    taken_forward(7);
}

#[test]
fn a_version_8_volume_mounts_and_is_taken_forward_by_a_read_write_mount() {
    taken_forward(8);
}

/// A volume of `old` is read as it is by fsck and a read-only mount, and taken to the current
/// version by the first read-write mount, with every acknowledged change; what each later
/// version added then works on it.
fn taken_forward(old: u32) {
    assert!(old < FORMAT_VERSION);
    let memory = MemoryDevice::from_bytes(version_8_image());
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    assert_eq!(on_disk_version(device.as_ref()), 8);
    set_version(device.as_ref(), old);

    // fsck reads it as it is and says what a mount will do; nothing is written.
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.problems.is_empty(), "fsck: {:?}", report.problems);
    let lines = fsck::inspect(device.clone()).unwrap();
    let version = lines.lines.iter().find(|(name, _)| name == "format version").unwrap();
    let expected = format!("{old} (the next read-write mount records {FORMAT_VERSION})");
    assert!(version.1.starts_with(&expected), "{version:?}");
    let images = lines.lines.iter().find(|(name, _)| name == "image log").unwrap();
    assert!(images.1.starts_with("none"), "{images:?}");
    assert_eq!(on_disk_version(device.as_ref()), old);

    // A read-only mount leaves the medium as it is.
    let before = memory.to_bytes();
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let (fs, report) = FileSystem::mount(device.clone(), &read_only).unwrap();
    assert_eq!(report.format_upgraded_from, Some(old));
    assert_version_8_files(&fs);
    fs.unmount().unwrap();
    drop(fs);
    assert!(memory.to_bytes() == before, "a read-only mount wrote to the medium");

    let (fs, report) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    assert_eq!(report.format_upgraded_from, Some(old));
    assert_eq!(on_disk_version(device.as_ref()), FORMAT_VERSION);
    assert_version_8_files(&fs);
    let file = fs.create(ROOT_INODE, b"kept", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, b"version five").unwrap();
    // What versions 7 and 8 add: inserts inside a block share it between the two parts of the
    // cut extent, and a compaction record, logged and applied on the taken-forward volume.
    for step in 0..40u64 {
        fs.insert(file, (step * 7) % 12, b"x").unwrap();
    }
    let defrag = fs.defrag(file, 1.0).unwrap();
    assert!(defrag.records > 0 && defrag.after.data_blocks == 1, "{defrag:?}");
    let mut buffer = [0u8; 52];
    fs.read(file, 0, &mut buffer).unwrap();
    assert_eq!(buffer.iter().filter(|byte| **byte == b'x').count(), 40);
    // What version 8 adds: a large write goes straight home, through a direct-write record.
    let large: Vec<u8> = (0..(1u32 << 20)).map(|index| (index % 251) as u8).collect();
    let records_before = fs.direct_write_records();
    fs.write(file, 1 << 20, &large).unwrap();
    assert!(fs.direct_write_records() > records_before);
    let mut back = vec![0u8; large.len()];
    fs.read(file, 1 << 20, &mut back).unwrap();
    assert!(back == large);
    // What version 9 adds: checkpoints into the image log, many of them.
    for round in 0..5 {
        fs.make_directory(ROOT_INODE, format!("round{round}").as_bytes(), 0o755, 0, 0).unwrap();
        fs.checkpoint().unwrap();
    }
    fs.unlink(ROOT_INODE, b"kept").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let lines = fsck::inspect(device.clone()).unwrap();
    let images = lines.lines.iter().find(|(name, _)| name == "image log").unwrap();
    assert!(images.1.contains("checkpoint images"), "{images:?}");
    let (fs, report) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    assert_eq!(report.format_upgraded_from, None);
    assert_version_8_files(&fs);
    fs.unmount().unwrap();
    assert!(fsck::check(device).unwrap().problems.is_empty());
}

/// A crash anywhere in the upgrading mount (the replay, the version-8 checkpoint, the split)
/// leaves a volume the next mount opens with every acknowledged change: before the superblock
/// that records version 9, the old log is whole; after it, the image log is.
#[test]
fn a_crash_during_the_upgrade_loses_nothing() {
    let image = version_8_image();
    let upgrade_writes = writes_of_a_mount(&image);
    assert!(upgrade_writes > 10, "{upgrade_writes}");
    for (step, seed) in (0..16u64).enumerate() {
        let crash_after = upgrade_writes * step as u64 / 16;
        let device = killed_mount(&image, crash_after, seed);
        let report = fsck::check(device.clone()).unwrap();
        assert!(report.problems.is_empty(), "crash after write {crash_after}: fsck {:?}", report.problems);
        let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
        assert_version_8_files(&fs);
        fs.unmount().unwrap();
        drop(fs);
        assert_eq!(on_disk_version(device.as_ref()), FORMAT_VERSION);
        assert!(fsck::check(device).unwrap().problems.is_empty(), "crash after write {crash_after}");
    }
}

/// Version 10 adds one log record, the insert of data. A version-9 volume, killed with inserts
/// logged the version-9 way (a hole and a write of the bytes into it) after its checkpoint, is
/// read as it is by fsck and a read-only mount; the first read-write mount records 10 before
/// anything else, replays the old records as they are, and logs an insert as one record.
#[test]
fn a_version_9_volume_replays_its_old_inserts_and_is_recorded_as_version_10() {
    let (memory, device) = common::memory_volume(32 << 20, true);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let file = fs.create(ROOT_INODE, b"edited", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let mut model: Vec<u8> = (0..20_000u32).map(|index| (index % 253) as u8).collect();
    fs.write(file, 0, &model).unwrap();
    fs.checkpoint().unwrap();
    for step in 0..30usize {
        let offset = (step * 613) % model.len();
        let bytes = vec![b'a' + (step % 26) as u8; 1 + step * 37];
        fs.insert_range(file, offset as u64, bytes.len() as u64).unwrap();
        fs.write(file, offset as u64, &bytes).unwrap();
        model.splice(offset..offset, bytes);
    }
    fs.fsync(file, false).unwrap();
    let survivor = memory.crash(9, tandemfs::device::CrashMode::KeepAll);
    drop(fs);
    let device: Arc<dyn Device> = Arc::new(survivor.clone());
    set_version(device.as_ref(), 9);
    forget_dead_mount(&device);
    let read_back = |fs: &FileSystem, model: &[u8]| {
        let mut back = vec![0u8; model.len() + 1];
        assert_eq!(fs.read(file, 0, &mut back).unwrap(), model.len());
        assert!(back[..model.len()] == *model, "the file differs after replay");
    };

    let report = fsck::check(device.clone()).unwrap();
    assert!(report.problems.is_empty(), "fsck: {:?}", report.problems);
    let lines = fsck::inspect(device.clone()).unwrap();
    let version = lines.lines.iter().find(|(name, _)| name == "format version").unwrap();
    assert!(version.1.starts_with(&format!("9 (the next read-write mount records {FORMAT_VERSION})")), "{version:?}");
    let before = survivor.to_bytes();
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let (fs, report) = FileSystem::mount(device.clone(), &read_only).unwrap();
    assert_eq!(report.format_upgraded_from, Some(9));
    assert!(report.records_replayed > 0, "the crash must leave the old inserts to replay");
    read_back(&fs, &model);
    fs.unmount().unwrap();
    drop(fs);
    assert!(survivor.to_bytes() == before, "a read-only mount wrote to the medium");
    assert_eq!(on_disk_version(device.as_ref()), 9);

    let (fs, report) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    assert_eq!(report.format_upgraded_from, Some(9));
    assert_eq!(on_disk_version(device.as_ref()), FORMAT_VERSION);
    read_back(&fs, &model);
    let lsn = fs.log_statistics().next_lsn;
    fs.insert(file, 5, b"one record").unwrap();
    assert_eq!(fs.log_statistics().next_lsn, lsn + 1);
    model.splice(5..5, b"one record".iter().copied());
    read_back(&fs, &model);
    fs.unmount().unwrap();
    drop(fs);
    let (fs, report) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    assert_eq!(report.format_upgraded_from, None);
    read_back(&fs, &model);
    fs.unmount().unwrap();
    assert!(fsck::check(device).unwrap().problems.is_empty());
}
