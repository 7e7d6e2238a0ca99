//! The failure latch with many threads at work: eight threads create, write, rename across
//! directories, set attributes, fsync and read, in shared and private directories, while the
//! back end applies and checkpoints in its own thread. Then the device starts failing every
//! write of the back end (home blocks, bitmaps, inode table: everywhere but the log and the
//! multi-mount protection block), so that the failure starts in the back end and not in a
//! caller's log flush. Every thread must get an error within a bound, and every change after
//! it too; reads answer or fail but never hang; unmount completes; and the image left behind
//! mounts, keeps what was synced before the fault, and passes fsck.

mod common;

use common::*;
use rand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tandemfs::block::meta::BLOCK_SIZE_U64;
use tandemfs::block::superblock::Superblock;
use tandemfs::device::{CrashMode, Device, Fault, FaultOperation};
use tandemfs::fs::*;
use tandemfs::{fsck, Error, FileSystem};

const THREADS: u64 = 8;
/// Far above what any call here needs when it works; a call that takes longer is hung.
const CALL_BOUND: Duration = Duration::from_secs(60);
/// How long the threads work before the fault, so that the back end is busy when it comes.
const WORK_BEFORE_FAULT: Duration = Duration::from_millis(400);
/// Operations a thread may still complete after the fault before the test calls the latch
/// broken: the back end fails at its next write home (a checkpoint, due after a few MiB of
/// log), and every later change must fail.
const OPERATIONS_AFTER_FAULT_MAX: u64 = 200_000;
/// Names per thread in each directory: few enough that the live data (at most 48 KiB a file)
/// stays far below the volume, so that no error but the fault's can come.
const NAMES_PER_THREAD: u64 = 20;
/// Bound on a thread's loop before the fault (the fault comes after `WORK_BEFORE_FAULT`).
const OPERATIONS_BEFORE_FAULT_MAX: u64 = 10_000_000;

/// Runs `call` on its own thread and fails the test if it does not return within the bound.
fn bounded<T: Send + 'static>(what: &str, call: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(call());
    });
    receiver.recv_timeout(CALL_BOUND).unwrap_or_else(|_| panic!("{what} did not return within {CALL_BOUND:?}"))
}

/// One change or read; returns the error of a change that failed.
fn operation(
    fs: &FileSystem,
    rng: &mut rand::rngs::SmallRng,
    thread: u64,
    serial: u64,
    directories: &[u64],
) -> Result<(), Error> {
    let directory = directories[rng.gen_range(0..directories.len())];
    let name = format!("t{thread}-{}", rng.gen_range(0..NAMES_PER_THREAD));
    let lookup = fs.lookup(directory, name.as_bytes());
    match rng.gen_range(0..10) {
        0..=2 => {
            let file = match lookup {
                Ok(file) => file,
                Err(Error::NotFound) => fs.create(directory, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0)?,
                Err(error) => return Err(error),
            };
            let length = rng.gen_range(1..=16_384);
            let bytes = pattern(rng, length);
            fs.write(file.inode, rng.gen_range(0..32_768), &bytes)?;
            if serial.is_multiple_of(8) {
                fs.fsync(file.inode, false)?;
            }
        }
        3 | 4 => {
            let target = directories[rng.gen_range(0..directories.len())];
            let target_name = format!("t{thread}-{}", rng.gen_range(0..NAMES_PER_THREAD));
            match fs.rename(directory, name.as_bytes(), target, target_name.as_bytes(), RenameMode::Replace) {
                Ok(()) | Err(Error::NotFound) => {}
                Err(error) => return Err(error),
            }
        }
        5 => match fs.unlink(directory, name.as_bytes()) {
            Ok(()) | Err(Error::NotFound) => {}
            Err(error) => return Err(error),
        },
        6 => {
            if let Ok(file) = lookup {
                fs.set_xattr(file.inode, b"user.serial", &serial.to_le_bytes(), XattrMode::CreateOrReplace)?;
            }
        }
        7 => {
            if serial.is_multiple_of(4) {
                fs.sync()?;
            }
        }
        _ => {
            // Reads may answer from the cache after the failure: only their bound is checked.
            if let Ok(file) = lookup {
                let mut buffer = vec![0u8; 4096];
                let _ = fs.read(file.inode, 0, &mut buffer);
            }
            let _ = fs.read_directory(directory, 0, &mut |_| true);
        }
    }
    Ok(())
}

/// Works until a change fails; returns that error and the operations done after the fault.
fn worker(fs: FileSystem, thread: u64, directories: Vec<u64>, faulted: Arc<AtomicBool>) -> (Error, u64) {
    let mut rng = rng(100 + thread);
    let mut after_fault = 0u64;
    for serial in 0..OPERATIONS_BEFORE_FAULT_MAX + OPERATIONS_AFTER_FAULT_MAX {
        let was_faulted = faulted.load(Ordering::Acquire);
        if let Err(error) = operation(&fs, &mut rng, thread, serial, &directories) {
            assert!(was_faulted || faulted.load(Ordering::Acquire), "thread {thread}: {error} before the fault");
            // The latch holds: the next change fails too.
            let late =
                fs.create(directories[0], format!("late-{thread}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0);
            assert!(late.is_err(), "thread {thread}: a change after the failure ({error}) succeeded");
            return (error, after_fault);
        }
        if was_faulted {
            after_fault += 1;
            assert!(
                after_fault <= OPERATIONS_AFTER_FAULT_MAX,
                "thread {thread}: {after_fault} operations succeeded after the back end's writes began to fail"
            );
        }
    }
    panic!("thread {thread}: the fault never came");
}

/// Faults every write outside the log and the MMP block: what the back end writes home.
fn back_end_faults(device: &dyn Device) -> [Fault; 2] {
    let superblock = Superblock::read_best(device).unwrap();
    let home_start_bytes = superblock.block_bitmap_start * BLOCK_SIZE_U64;
    let mmp_bytes = superblock.mmp_block * BLOCK_SIZE_U64;
    let end_bytes = superblock.block_count * BLOCK_SIZE_U64;
    assert!(superblock.log_data_start < superblock.block_bitmap_start && mmp_bytes + BLOCK_SIZE_U64 < end_bytes);
    [
        Fault::always(FaultOperation::Write).in_range(home_start_bytes, mmp_bytes),
        Fault::always(FaultOperation::Write).in_range(mmp_bytes + BLOCK_SIZE_U64, end_bytes),
    ]
}

#[test]
fn a_back_end_fault_while_eight_threads_work_fails_every_caller_within_a_bound() {
    let (memory, device) = memory_volume(64 << 20, true);
    let (fs, _) = FileSystem::mount(device.clone(), &MountOptions::default()).unwrap();
    let shared = fs.make_directory(ROOT_INODE, b"shared", 0o777, 0, 0).unwrap().inode;
    let kept = fs.create(shared, b"kept", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(kept, 0, b"synced before the fault").unwrap();
    let mut directories_of = Vec::new();
    for thread in 0..THREADS {
        let private = fs.make_directory(ROOT_INODE, format!("p{thread}").as_bytes(), 0o755, 0, 0).unwrap().inode;
        directories_of.push(vec![shared, private]);
    }
    fs.sync().unwrap();
    let faults = back_end_faults(device.as_ref());
    let faulted = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = directories_of
        .into_iter()
        .enumerate()
        .map(|(thread, directories)| {
            let (fs, faulted) = (fs.clone(), faulted.clone());
            std::thread::spawn(move || worker(fs, thread as u64, directories, faulted))
        })
        .collect();
    std::thread::sleep(WORK_BEFORE_FAULT);
    let fault_time = Instant::now();
    for fault in faults {
        memory.inject(fault);
    }
    faulted.store(true, Ordering::Release);
    let outcomes =
        bounded("the eight workers", move || workers.into_iter().map(|worker| worker.join()).collect::<Vec<_>>());
    println!("every worker failed {:?} after the fault", fault_time.elapsed());
    for (thread, outcome) in outcomes.into_iter().enumerate() {
        let (error, after_fault) = outcome.unwrap_or_else(|_| panic!("worker {thread} panicked"));
        println!("thread {thread}: {after_fault} operations after the fault, then {error}");
        assert!(
            matches!(error, Error::Io { .. } | Error::Shutdown),
            "thread {thread}: the failure surfaced as {error:?}, not as an I/O error or shutdown"
        );
    }
    let failure = fs.failure().expect("the back end latched a failure");
    println!("latched: {failure}");
    let fs_for_reads = fs.clone();
    bounded("reads after the failure", move || {
        let _ = fs_for_reads.lookup(shared, b"kept");
        let _ = fs_for_reads.read_directory(shared, 0, &mut |_| true);
        let _ = fs_for_reads.get_attributes(kept);
        let _ = fs_for_reads.sync();
    });
    let fs_for_unmount = fs.clone();
    let unmounted = bounded("unmount", move || fs_for_unmount.unmount());
    assert!(unmounted.is_err(), "unmount of a failed volume reports the failure");
    drop(fs);

    // What the failed mount left: a volume that replays, keeps what was synced, passes fsck.
    memory.clear_faults();
    let image = memory.crash(1, CrashMode::KeepAll);
    let report = fsck::check(Arc::new(image.clone())).unwrap();
    assert!(report.is_clean(), "fsck of the image the failed mount left: {:#?}", report.problems);
    let (fs, _) = FileSystem::mount(Arc::new(image.clone()), &MountOptions::default()).unwrap();
    let found = fs.lookup(shared, b"kept").unwrap();
    let mut buffer = vec![0u8; 64];
    let read = fs.read(found.inode, 0, &mut buffer).unwrap();
    assert_eq!(&buffer[..read], b"synced before the fault");
    fs.unmount().unwrap();
    let report = fsck::check(Arc::new(image)).unwrap();
    assert!(report.is_clean(), "fsck after the remount: {:#?}", report.problems);
}
