//! Checkpoint images in a log of their own (format version 9, docs/LOG.md *The image log*).
//!
//! Since appends no longer pledge room for images, the records after the tail may have dirtied
//! far more metadata than one checkpoint holds. Replay must then checkpoint as it goes, as the
//! running back end does, and a crash anywhere in such a replay must leave a volume the next
//! mount replays whole.

mod common;

use common::*;
use std::sync::Arc;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

/// New directories, each with a leaf block of its own: one image each at the next checkpoint.
const DIRECTORIES: usize = 3_000;

/// A 256 MiB volume with the smallest log (4 MiB: an image log of about 430 images), and the
/// records of `DIRECTORIES` mkdirs durable after its tail, none applied: a killed mount with
/// no back-end thread.
fn backlog_volume() -> (MemoryDevice, Vec<u8>) {
    let memory = MemoryDevice::with_crash_model(256 << 20);
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    let options = FormatOptions { log_bytes: Some(4 << 20), hash_seed: Some([1, 2, 3, 4]), ..FormatOptions::default() };
    FileSystem::format(device.clone(), &options).unwrap();
    // A backlog of many image logs: the mkdirs all wait after the checkpoint, unapplied.
    let mount = MountOptions {
        background_backend: false,
        flush_delay_us: u64::MAX,
        backlog_image_logs: 64,
        ..MountOptions::default()
    };
    let (fs, _) = FileSystem::mount(device, &mount).unwrap();
    fs.checkpoint().unwrap();
    for index in 0..DIRECTORIES {
        fs.make_directory(ROOT_INODE, format!("d{index}").as_bytes(), 0o755, 0, 0).unwrap();
    }
    fs.sync().unwrap();
    assert_eq!(fs.log_statistics().checkpoints, 1, "no checkpoint may run during the backlog");
    drop(fs); // killed: no unmount
    forget_dead_mount(&(Arc::new(memory.clone()) as Arc<dyn Device>));
    let image = memory.to_bytes();
    (memory, image)
}

fn assert_whole(device: Arc<dyn Device>) -> MountReport {
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.is_clean(), "fsck: {:#?}", report.problems);
    let (fs, mount) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    for index in 0..DIRECTORIES {
        let attributes = fs.lookup(ROOT_INODE, format!("d{index}").as_bytes()).unwrap();
        assert_eq!(attributes.file_type, FileType::Directory);
    }
    fs.unmount().unwrap();
    drop(fs);
    let report = fsck::check(device).unwrap();
    assert!(report.is_clean(), "fsck after the remount: {:#?}", report.problems);
    mount
}

#[test]
fn a_replay_larger_than_the_image_log_checkpoints_as_it_goes() {
    let (_, image) = backlog_volume();
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(image));
    let mount = assert_whole(device);
    assert!(mount.records_replayed >= DIRECTORIES as u64, "{mount:?}");
    // Without checkpoints on the way the replay's images would not fit the image log, and the
    // mount would fail with no space.
    assert!(mount.replay_checkpoints >= 2, "{mount:?}");
}

#[test]
fn a_crash_anywhere_in_a_checkpointing_replay_loses_nothing() {
    let (_, image) = backlog_volume();
    // How many writes a whole replay makes, to spread the crash points over it.
    let replay_writes = writes_of_a_mount(&image);
    assert!(replay_writes > 100, "{replay_writes}");
    for (step, seed) in seeds(0..12).into_iter().enumerate() {
        let crash_after = replay_writes * (step as u64 + 1) / 13;
        let device = killed_mount(&image, crash_after, seed);
        assert_whole(device);
    }
}
