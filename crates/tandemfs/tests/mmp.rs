//! Multi-mount protection, read-only mounts and remount, through the library.

mod common;

use common::memory_volume;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandemfs::block::mmp::{self, Activity, MmpLocation, MmpRecord};
use tandemfs::block::superblock::Superblock;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::{fsck, Error, FileSystem};

const VOLUME_BYTES: u64 = 64 << 20;

fn options() -> MountOptions {
    MountOptions { mmp_interval_ms: Some(50), ..MountOptions::default() }
}

fn read_only() -> MountOptions {
    MountOptions { read_only: true, ..options() }
}

fn bytes_of(memory: &MemoryDevice) -> Vec<u8> {
    let mut bytes = vec![0u8; memory.size_bytes() as usize];
    memory.read_at(0, &mut bytes).unwrap();
    bytes
}

fn location(device: &Arc<dyn Device>) -> MmpLocation {
    MmpLocation::of(device.clone(), &Superblock::read_best(device.as_ref()).unwrap())
}

fn write_file(fs: &FileSystem, name: &str, data: &[u8]) {
    let file = fs.create(ROOT_INODE, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.write(file.inode, 0, data).unwrap();
}

fn read_file(fs: &FileSystem, name: &str) -> Vec<u8> {
    let file = fs.lookup(ROOT_INODE, name.as_bytes()).unwrap();
    let mut data = vec![0u8; file.size_bytes as usize];
    assert_eq!(fs.read(file.inode, 0, &mut data).unwrap(), data.len());
    data
}

#[test]
fn second_mount_of_the_same_device_is_refused_with_host_and_pid() {
    let (_memory, device) = memory_volume(VOLUME_BYTES, false);
    let (fs, report) = FileSystem::mount(device.clone(), &options()).unwrap();
    assert!(report.mmp_taken_over_from.is_none());
    let error = FileSystem::mount(device.clone(), &options()).unwrap_err();
    assert!(matches!(error, Error::InUse(_)), "{error:?}");
    let message = error.to_string();
    let owner = format!("volume is in use by pid {} on host {}", std::process::id(), mmp::host_name());
    assert!(message.starts_with(&owner), "{message}");
    // A read-only mount must not read a volume that a live mount is changing either.
    assert!(matches!(FileSystem::mount(device.clone(), &read_only()).unwrap_err(), Error::InUse(_)));
    fs.unmount().unwrap();
    assert_eq!(mmp::look(&location(&device)).unwrap(), Activity::Clean);
    FileSystem::mount(device, &options()).unwrap().0.unmount().unwrap();
}

#[test]
fn a_crashed_mount_is_taken_over() {
    let (_memory, device) = memory_volume(VOLUME_BYTES, false);
    // Without a back-end thread, which would keep the mount alive after the drop.
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions { background_backend: false, ..options() }).unwrap();
    write_file(&fs, "kept", b"acknowledged");
    fs.sync().unwrap();
    drop(fs);
    assert!(matches!(mmp::look(&location(&device)).unwrap(), Activity::Recent { .. } | Activity::Stale { .. }));
    let (fs, report) = FileSystem::mount(device.clone(), &options()).unwrap();
    let owner = format!("pid {} on host {}", std::process::id(), mmp::host_name());
    assert_eq!(report.mmp_taken_over_from.as_deref(), Some(owner.as_str()));
    assert_eq!(read_file(&fs, "kept"), b"acknowledged");
    fs.unmount().unwrap();
}

#[test]
fn a_crashed_mount_of_another_process_is_waited_out() {
    let (_memory, device) = memory_volume(VOLUME_BYTES, false);
    let stale = MmpRecord { sequence: 99, time_ns: 0, interval_ms: 100, pid: 4242, host: "elsewhere".into() };
    location(&device).write(&stale).unwrap();
    let started = Instant::now();
    let (fs, report) = FileSystem::mount(device, &options()).unwrap();
    assert_eq!(report.mmp_taken_over_from.as_deref(), Some("pid 4242 on host elsewhere"));
    assert!(started.elapsed() >= mmp::check_wait(100));
    fs.unmount().unwrap();
}

#[test]
fn a_mount_whose_block_is_taken_stops_writing() {
    let (memory, device) = memory_volume(VOLUME_BYTES, false);
    let (fs, _) = FileSystem::mount(device.clone(), &options()).unwrap();
    write_file(&fs, "before", b"x");
    let intruder = MmpRecord { sequence: 7, time_ns: 0, interval_ms: 50, pid: 4242, host: "elsewhere".into() };
    location(&device).write(&intruder).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while fs.failure().is_none() {
        assert!(Instant::now() < deadline, "the refresh never noticed the intruder");
        std::thread::sleep(Duration::from_millis(10));
    }
    let failure = fs.failure().unwrap();
    assert!(failure.contains("pid 4242 on host elsewhere"), "{failure}");
    let fenced = bytes_of(&memory);
    assert!(fs.create(ROOT_INODE, b"after", FileType::Regular, 0o644, 0, 0, 0).is_err());
    assert!(fs.unmount().is_err());
    assert!(bytes_of(&memory) == fenced, "a fenced mount wrote to the device");
    assert_eq!(location(&device).read().unwrap(), intruder);
}

#[test]
fn read_only_mount_writes_nothing_even_when_it_replays() {
    let (memory, device) = memory_volume(VOLUME_BYTES, false);
    let (fs, _) = FileSystem::mount(device.clone(), &options()).unwrap();
    write_file(&fs, "clean", b"checkpointed");
    fs.unmount().unwrap();
    // A clean volume.
    let before = bytes_of(&memory);
    let (fs, report) = FileSystem::mount(device.clone(), &read_only()).unwrap();
    assert!(report.read_only && !report.replayed_in_memory);
    assert_eq!(read_file(&fs, "clean"), b"checkpointed");
    assert!(matches!(fs.create(ROOT_INODE, b"new", FileType::Regular, 0o644, 0, 0, 0).unwrap_err(), Error::ReadOnly));
    fs.sync().unwrap();
    fs.checkpoint().unwrap();
    fs.unmount().unwrap();
    assert!(bytes_of(&memory) == before, "a read-only mount of a clean volume changed the device");

    // A crashed volume with records to replay.
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions { background_backend: false, ..options() }).unwrap();
    write_file(&fs, "pending", b"only in the log");
    fs.sync().unwrap();
    drop(fs);
    let before = bytes_of(&memory);
    let (fs, report) = FileSystem::mount(device.clone(), &read_only()).unwrap();
    assert!(report.replayed_in_memory && report.records_replayed > 0, "{report:?}");
    assert_eq!(read_file(&fs, "pending"), b"only in the log");
    assert_eq!(read_file(&fs, "clean"), b"checkpointed");
    fs.unmount().unwrap();
    assert!(bytes_of(&memory) == before, "a read-only mount of a crashed volume changed the device");
    // The replay is still due on the medium, and a read-write mount does it.
    let (fs, report) = FileSystem::mount(device, &options()).unwrap();
    assert!(report.records_replayed > 0);
    assert_eq!(read_file(&fs, "pending"), b"only in the log");
    fs.unmount().unwrap();
}

/// A device that refuses writes, as a file opened without write permission does.
struct ReadOnlyMedium(MemoryDevice);

impl Device for ReadOnlyMedium {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> tandemfs::Result<()> {
        self.0.read_at(offset, buffer)
    }
    fn write_at(&self, _offset: u64, _data: &[u8]) -> tandemfs::Result<()> {
        Err(Error::ReadOnly)
    }
    fn flush(&self) -> tandemfs::Result<()> {
        Ok(())
    }
    fn is_read_only(&self) -> bool {
        true
    }
}

#[test]
fn read_only_medium_mounts_read_only_and_cannot_be_remounted_read_write() {
    let (memory, device) = memory_volume(VOLUME_BYTES, false);
    let (fs, _) = FileSystem::mount(device, &MountOptions { background_backend: false, ..options() }).unwrap();
    write_file(&fs, "pending", b"replayed in memory");
    fs.sync().unwrap();
    drop(fs);
    let medium: Arc<dyn Device> = Arc::new(ReadOnlyMedium(memory));
    let (fs, report) = FileSystem::mount(medium, &options()).unwrap();
    assert!(report.read_only && report.forced_read_only.is_some() && report.replayed_in_memory, "{report:?}");
    assert_eq!(read_file(&fs, "pending"), b"replayed in memory");
    assert!(fs.set_read_only(false).is_err());
    assert!(fs.is_read_only());
    fs.unmount().unwrap();
}

#[test]
fn remount_switches_between_read_write_and_read_only() {
    let (_memory, device) = memory_volume(VOLUME_BYTES, false);
    let (fs, _) = FileSystem::mount(device.clone(), &options()).unwrap();
    write_file(&fs, "first", b"1");
    fs.set_read_only(true).unwrap();
    assert!(matches!(
        fs.create(ROOT_INODE, b"refused", FileType::Regular, 0o644, 0, 0, 0).unwrap_err(),
        Error::ReadOnly
    ));
    // Read-only lets go of the block and leaves the volume clean and complete on the medium.
    assert_eq!(mmp::look(&location(&device)).unwrap(), Activity::Clean);
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    fs.set_read_only(false).unwrap();
    assert!(matches!(mmp::look(&location(&device)).unwrap(), Activity::Recent { .. }));
    write_file(&fs, "second", b"2");
    fs.unmount().unwrap();
    let (fs, report) = FileSystem::mount(device, &options()).unwrap();
    assert!(!report.was_dirty);
    assert_eq!(read_file(&fs, "first"), b"1");
    assert_eq!(read_file(&fs, "second"), b"2");
    fs.unmount().unwrap();
}

#[test]
fn remount_read_write_writes_an_in_memory_replay_home_unless_the_volume_changed() {
    let (_memory, device) = memory_volume(VOLUME_BYTES, false);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions { background_backend: false, ..options() }).unwrap();
    write_file(&fs, "pending", b"in the log");
    fs.sync().unwrap();
    drop(fs);
    let (fs, _) = FileSystem::mount(device.clone(), &read_only()).unwrap();
    fs.set_read_only(false).unwrap();
    write_file(&fs, "later", b"after remount");
    fs.unmount().unwrap();
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let (fs, report) = FileSystem::mount(device.clone(), &options()).unwrap();
    assert!(!report.was_dirty && report.records_replayed == 0, "{report:?}");
    assert_eq!(read_file(&fs, "pending"), b"in the log");
    assert_eq!(read_file(&fs, "later"), b"after remount");
    fs.unmount().unwrap();

    // Another mount writes the volume while this one is read-only: remount read-write refused.
    let (reader, _) = FileSystem::mount(device.clone(), &read_only()).unwrap();
    let (writer, _) = FileSystem::mount(device.clone(), &options()).unwrap();
    write_file(&writer, "meanwhile", b"!");
    writer.unmount().unwrap();
    let error = reader.set_read_only(false).unwrap_err();
    assert!(error.to_string().contains("changed by another mount"), "{error}");
    reader.unmount().unwrap();
    assert_eq!(mmp::look(&location(&device)).unwrap(), Activity::Clean);
}
