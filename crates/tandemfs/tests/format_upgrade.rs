//! A volume of an earlier format version (5, 6 or 7) is read by this build and taken forward to
//! the current one (8) by its first read-write mount, before anything of this build reaches home:
//! version 6 only lets a free leave a data block's generation-table and checksum entries,
//! version 7 only adds the compaction record to the log, and version 8 lets extents of a file
//! share a block (counted in the generation table) and adds the direct-write record, so every
//! version-5, -6 or -7 volume is a valid version-8 one, and an older build must then refuse it (a
//! log with a compaction or direct-write record would read as corrupt to it; a shared block would
//! be freed at its first extent's removal).

use std::sync::Arc;
use tandemfs::block::superblock::{Superblock, FORMAT_VERSION, OFFSET_CRC, OFFSET_VERSION};
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

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

/// A volume of `old` is read as it is by fsck and a read-only mount, and recorded as the current
/// version by the first read-write mount; a compaction then works on it.
fn taken_forward(old: u32) {
    assert!(old < FORMAT_VERSION);
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
    FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let file = fs.create(ROOT_INODE, b"kept", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, b"version five").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    set_version(device.as_ref(), old);

    // fsck reads it as it is and says what a mount will do; nothing is written.
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.problems.is_empty(), "fsck: {:?}", report.problems);
    let lines = fsck::inspect(device.clone()).unwrap();
    let version = lines.lines.iter().find(|(name, _)| name == "format version").unwrap();
    let expected = format!("{old} (the next read-write mount records {FORMAT_VERSION})");
    assert!(version.1.starts_with(&expected), "{version:?}");
    assert_eq!(on_disk_version(device.as_ref()), old);

    // A read-only mount leaves the medium at 5.
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let (fs, report) = FileSystem::mount(device.clone(), &read_only).unwrap();
    assert_eq!(report.format_upgraded_from, Some(old));
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(on_disk_version(device.as_ref()), old);

    let (fs, report) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    assert_eq!(report.format_upgraded_from, Some(old));
    assert_eq!(on_disk_version(device.as_ref()), FORMAT_VERSION);
    let mut buffer = [0u8; 12];
    fs.read(file, 0, &mut buffer).unwrap();
    assert_eq!(&buffer, b"version five");
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
    fs.unlink(ROOT_INODE, b"kept").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let (fs, report) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    assert_eq!(report.format_upgraded_from, None);
    fs.unmount().unwrap();
    assert!(fsck::check(device).unwrap().problems.is_empty());
}
