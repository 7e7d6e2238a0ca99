//! Ranges of data larger than one checkpoint can image: every data block handed out needs its
//! generation-table entry in the next checkpoint's images (one table block per ~2 MiB), so a
//! single record handing out tens of gigabytes needed more images than a small log's reserve
//! holds; the back end then failed with no space, and the volume could not mount again (its
//! replay needed the same checkpoint). A large fallocate is now made in pieces.

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

#[test]
fn a_fallocate_larger_than_the_log_can_image_at_once_is_made_in_pieces() {
    let image = ScratchImage(std::env::temp_dir().join(format!("tandem-large-ranges-{}.img", std::process::id())));
    let volume_bytes: u64 = 16 << 30;
    let allocated_bytes: u64 = 8 << 30;
    let device = open(&image, Some(volume_bytes));
    // The smallest log: its reserve holds a few hundred images, and 8 GiB of data blocks
    // touch 4,000 generation-table blocks.
    let format = FormatOptions { inode_count: Some(4096), log_bytes: Some(4 << 20), ..FormatOptions::default() };
    FileSystem::format(device.clone(), &format).unwrap();
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let file = fs.create(ROOT_INODE, b"big", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.allocate(file, 0, allocated_bytes, false).unwrap();
    fs.checkpoint().unwrap();
    assert_eq!(fs.failure(), None);
    fs.unmount().unwrap();
    drop(fs);
    drop(device);

    let device = open(&image, None);
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.problems.is_empty(), "fsck: {:?}", report.problems);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let attributes = fs.lookup(ROOT_INODE, b"big").unwrap();
    assert_eq!(attributes.size_bytes, allocated_bytes);
    assert_eq!(attributes.blocks_512, allocated_bytes / 512);
    fs.unmount().unwrap();
}
