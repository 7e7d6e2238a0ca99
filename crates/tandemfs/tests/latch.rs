//! The back end's failure latch: a fault in the back end makes every caller return an error
//! within a bound, never hang, and unmount completes. And the eviction bug that used to kill
//! the back-end thread without latching (a small metadata cache, thousands of creates).

mod common;

use common::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tandemfs::device::{Device, Fault, FaultOperation};
use tandemfs::fs::*;
use tandemfs::{fsck, Error, FileSystem};

/// Far above what any call here needs when it works; a call that takes longer is hung.
const CALL_BOUND: Duration = Duration::from_secs(60);

/// Runs `call` on its own thread and fails the test if it does not return within the bound.
fn bounded<T: Send + 'static>(what: &str, call: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(call());
    });
    receiver.recv_timeout(CALL_BOUND).unwrap_or_else(|_| panic!("{what} did not return within {CALL_BOUND:?}"))
}

#[test]
fn a_small_metadata_cache_survives_thousands_of_creates_in_many_directories() {
    let (_memory, device) = memory_volume(256 << 20, false);
    let options = MountOptions { cache_bytes: 1 << 20, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device.clone(), &options).unwrap();
    let directories: Vec<u64> = (0..50)
        .map(|index| fs.make_directory(ROOT_INODE, format!("d{index}").as_bytes(), 0o755, 0, 0).unwrap().inode)
        .collect();
    for serial in 0..4000u64 {
        let parent = directories[(serial % 50) as usize];
        fs.create(parent, format!("f{serial}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
    }
    let listed = bounded("read_directory", {
        let fs = fs.clone();
        move || {
            directories
                .iter()
                .map(|&directory| {
                    let mut names = 0usize;
                    fs.read_directory(directory, 0, &mut |entry| {
                        names += usize::from(entry.name != b"." && entry.name != b"..");
                        true
                    })
                    .map(|()| names)
                })
                .collect::<Result<Vec<usize>, Error>>()
        }
    });
    assert_eq!(fs.failure(), None);
    assert_eq!(listed.unwrap().iter().sum::<usize>(), 4000, "every name");
    fs.unmount().unwrap();
    assert!(fsck::check(device).unwrap().is_clean());
}

#[test]
fn a_device_fault_in_the_back_end_fails_every_caller_within_a_bound_and_unmount_completes() {
    let (memory, device) = memory_volume(64 << 20, false);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let directory = fs.make_directory(ROOT_INODE, b"d", 0o755, 0, 0).unwrap().inode;
    let file = fs.create(directory, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, &[7u8; 10_000]).unwrap();
    fs.sync().unwrap();
    // From now on every write and flush of the device fails: the log flusher, the back end's
    // checkpoints, everything.
    memory.inject(Fault::always(FaultOperation::Write));
    memory.inject(Fault::always(FaultOperation::Flush));
    let workers: Vec<_> = (0..4u64)
        .map(|thread| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                // Keep changing until the volume refuses: each call returns, the last one an error.
                for serial in 0..1_000_000u64 {
                    let name = format!("t{thread}-{serial}");
                    let made = fs.create(directory, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0);
                    let synced = made.and_then(|attributes| fs.fsync(attributes.inode, false));
                    if let Err(error) = synced {
                        return error;
                    }
                }
                panic!("a million creates and fsyncs succeeded on a device that fails every write");
            })
        })
        .collect();
    let errors =
        bounded("the writers", move || workers.into_iter().map(|worker| worker.join().unwrap()).collect::<Vec<_>>());
    assert_eq!(errors.len(), 4);
    // Readers and waiters get an error or an answer, never a hang.
    let fs_for_reads = fs.clone();
    bounded("reads after the failure", move || {
        let _ = fs_for_reads.read_directory(directory, 0, &mut |_| true);
        let _ = fs_for_reads.lookup(directory, b"f");
        let mut buffer = [0u8; 100];
        let _ = fs_for_reads.read(file, 0, &mut buffer);
    });
    let fs_for_unmount = fs.clone();
    let unmounted = bounded("unmount", move || fs_for_unmount.unmount());
    assert!(unmounted.is_err(), "unmount of a failed volume reports the failure");
    assert!(fs.create(directory, b"late", FileType::Regular, 0o644, 0, 0, 0).is_err());
    drop(device);
}

#[test]
fn an_unmount_after_a_failure_leaves_the_volume_for_replay() {
    let (memory, device) = memory_volume(64 << 20, true);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let file = fs.create(ROOT_INODE, b"kept", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, b"acknowledged").unwrap();
    fs.fsync(file, false).unwrap();
    memory.inject(Fault::always(FaultOperation::Write));
    let _ = fs.create(ROOT_INODE, b"lost", FileType::Regular, 0o644, 0, 0, 0);
    let _ = fs.sync();
    let fs_for_unmount = fs.clone();
    let _ = bounded("unmount", move || fs_for_unmount.unmount());
    memory.clear_faults();
    // What was acknowledged before the fault is still there after a remount.
    let restarted: Arc<dyn Device> = Arc::new(memory.crash(7, tandemfs::device::CrashMode::KeepAll));
    let (fs, _) = FileSystem::mount(restarted, &inline_options()).unwrap();
    let kept = fs.lookup(ROOT_INODE, b"kept").unwrap();
    let mut buffer = [0u8; 12];
    assert_eq!(fs.read(kept.inode, 0, &mut buffer).unwrap(), 12);
    assert_eq!(&buffer, b"acknowledged");
    fs.unmount().unwrap();
}
