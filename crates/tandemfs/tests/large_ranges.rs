//! Ranges of data larger than one checkpoint can image: every data block handed out needs its
//! generation-table entry in the next checkpoint's images (one table block per ~2 MiB), so a
//! single record handing out tens of gigabytes needed more images than a small log's reserve
//! holds; the back end then failed with no space, and the volume could not mount again (its
//! replay needed the same checkpoint). A large fallocate is now made in pieces.
//!
//! Frees had the same problem the other way (each freed block's entry went back to 0, and its
//! data checksum was cleared): since format version 6 a free changes only the block bitmap, so
//! a file of any size is deleted, truncated or punched in one record.

use std::path::PathBuf;
use std::sync::Arc;
use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

/// A sparse image in the temporary directory, removed when dropped.
struct ScratchImage(PathBuf);

impl Drop for ScratchImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn open(image: &ScratchImage, create_size_bytes: Option<u64>) -> Arc<dyn Device> {
    let options = FileDeviceOptions { create_size_bytes, lock_exclusive: true, read_only: false };
    Arc::new(FileDevice::open(&image.0, options).unwrap())
}

/// The largest volume the smallest log may have (its checkpoints must hold the whole block
/// bitmap): the log's reserve holds about 430 images, and 6 GiB of data blocks touch 3,000
/// generation-table blocks and 1,500 checksum-table blocks.
const VOLUME_BYTES: u64 = 12 << 30;

/// A fresh 12 GiB volume with a 4 MiB log in `name`, mounted.
fn small_log_volume(name: &str) -> (ScratchImage, Arc<dyn Device>, FileSystem) {
    let image = ScratchImage(std::env::temp_dir().join(format!("tandem-{name}-{}.img", std::process::id())));
    let device = open(&image, Some(VOLUME_BYTES));
    let format = FormatOptions { inode_count: Some(4096), log_bytes: Some(4 << 20), ..FormatOptions::default() };
    FileSystem::format(device.clone(), &format).unwrap();
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    (image, device, fs)
}

/// Unmounts `fs`, checks the image with fsck (clean) and mounts it again.
fn remount_checked(image: &ScratchImage, fs: FileSystem, device: Arc<dyn Device>) -> FileSystem {
    fs.unmount().unwrap();
    drop(fs);
    drop(device);
    let device = open(image, None);
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.problems.is_empty(), "fsck: {:?}", report.problems);
    FileSystem::mount(device, &MountOptions::default()).unwrap().0
}

#[test]
fn a_fallocate_larger_than_the_log_can_image_at_once_is_made_in_pieces() {
    let allocated_bytes: u64 = 6 << 30;
    let (image, device, fs) = small_log_volume("large-ranges");
    let file = fs.create(ROOT_INODE, b"big", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.allocate(file, 0, allocated_bytes, false).unwrap();
    fs.checkpoint().unwrap();
    assert_eq!(fs.failure(), None);
    let fs = remount_checked(&image, fs, device);
    let attributes = fs.lookup(ROOT_INODE, b"big").unwrap();
    assert_eq!(attributes.size_bytes, allocated_bytes);
    assert_eq!(attributes.blocks_512, allocated_bytes / 512);
    fs.unmount().unwrap();
}

#[test]
fn a_file_larger_than_the_log_can_image_at_once_is_punched_truncated_and_deleted() {
    let allocated_bytes: u64 = 9 << 30;
    let (image, device, fs) = small_log_volume("large-frees");
    let mut files = Vec::new();
    for name in [&b"punched"[..], b"truncated", b"deleted"] {
        let file = fs.create(ROOT_INODE, name, FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
        fs.allocate(file, 0, allocated_bytes / 3, false).unwrap();
        files.push(file);
    }
    // Written data has checksums: their entries are left behind by the frees below.
    fs.write(files[0], (1 << 30) + 5, b"kept").unwrap();
    fs.checkpoint().unwrap();
    // Everything but the first gigabyte and a few bytes after it; everything past 1 MiB; all.
    fs.punch_hole(files[0], (1 << 30) + 4096, allocated_bytes / 3 - (1 << 30) - 4096).unwrap();
    fs.set_attributes(files[1], &SetAttributes { size_bytes: Some(1 << 20), ..SetAttributes::default() }).unwrap();
    fs.unlink(ROOT_INODE, b"deleted").unwrap();
    fs.checkpoint().unwrap();
    assert_eq!(fs.failure(), None);
    // The space is free again: a new file takes it (allocation clears the stale checksums).
    let again = fs.create(ROOT_INODE, b"again", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.allocate(again, 0, allocated_bytes / 2, false).unwrap();
    fs.write(again, 12345, b"fresh").unwrap();
    let fs = remount_checked(&image, fs, device);
    let mut buffer = [0u8; 5];
    let punched = fs.lookup(ROOT_INODE, b"punched").unwrap();
    fs.read(punched.inode, (1 << 30) + 4, &mut buffer).unwrap();
    assert_eq!(&buffer, b"\0kept");
    assert_eq!(fs.lookup(ROOT_INODE, b"truncated").unwrap().size_bytes, 1 << 20);
    assert!(fs.lookup(ROOT_INODE, b"deleted").is_err());
    let again = fs.lookup(ROOT_INODE, b"again").unwrap();
    fs.read(again.inode, 12345, &mut buffer).unwrap();
    assert_eq!(&buffer, b"fresh");
    fs.unmount().unwrap();
}

#[test]
fn a_log_too_small_for_the_volume_s_bitmap_is_refused_at_format() {
    let image = ScratchImage(std::env::temp_dir().join(format!("tandem-small-log-{}.img", std::process::id())));
    let device = open(&image, Some(64 << 30));
    let format = FormatOptions { log_bytes: Some(4 << 20), ..FormatOptions::default() };
    let error = FileSystem::format(device.clone(), &format).unwrap_err().to_string();
    assert!(error.contains("a log of 4 MiB is too small for a volume of 65536 MiB: at least 17 MiB"), "{error}");
    let format = FormatOptions { log_bytes: Some(17 << 20), ..FormatOptions::default() };
    FileSystem::format(device, &format).unwrap();
}
