//! Over io_uring, a reader's large READs are served by threads free to leave the reader's CPU.
//! The kernel queues a request on the queue of its caller's CPU, whose threads are pinned
//! there; served there, a sequential reader's read-ahead takes turns with the reader on one CPU. A test binary of its
//! own, so that no other mount's threads or readers of this process share its CPUs' queues.
//! Needs root, /dev/fuse, FUSE over io_uring allowed by the kernel and at least two CPUs;
//! elsewhere it says so and passes without running.

use std::fs;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use tandem_fuse::{mount_background, uring_availability, FuseTransport, MountConfig, UringReads};
use tandemfs::device::MemoryDevice;
use tandemfs::fs::{FormatOptions, MountOptions};
use tandemfs::FileSystem;

const FILE_BYTES: usize = 24 << 20;

/// Why the test cannot run here, if it cannot.
fn cannot_run() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        return Some("mounting needs root and /dev/fuse".to_string());
    }
    if let Err(why) = uring_availability() {
        return Some(why);
    }
    if allowed_cpus().len() < 2 {
        return Some("one CPU: no other CPU to serve a read on".to_string());
    }
    None
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set, filled by the kernel.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
        (0..8 * std::mem::size_of::<libc::cpu_set_t>()).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect()
    }
}

/// io_uring queue threads of this process whose affinity allows more than one CPU (a pinned
/// one allows its queue's CPU only), read from /proc (`Cpus_allowed_list`), not from the
/// transport's own counters. (Thread names are cut to 15 bytes, so the queue is not in them.)
fn wide_queue_threads() -> usize {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| {
            let path = task.ok()?.path();
            let comm = fs::read_to_string(path.join("comm")).ok()?;
            comm.starts_with("tandemfs-uring").then(|| fs::read_to_string(path.join("status")).ok())?
        })
        .filter(|status| {
            let allowed = status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:")).unwrap_or("");
            allowed.trim().parse::<usize>().is_err()
        })
        .count()
}

/// Mounts a fresh volume holding one file of FILE_BYTES made through the library (so the kernel
/// has none of its pages), reads it through the mount from a thread pinned to one CPU in 1 MiB
/// reads, and returns what the queues counted and how many queue threads were free to run on
/// more than their queue's CPU right after the last read (before the close, whose RELEASE would
/// pin a thread back).
fn read_through_mount(move_min_bytes: usize) -> (UringReads, usize) {
    let directory =
        std::env::temp_dir().join(format!("tandem-fuse-uring-reads-{}-{move_min_bytes}", std::process::id()));
    fs::create_dir_all(&directory).unwrap();
    let device = Arc::new(MemoryDevice::new(128 << 20));
    FileSystem::format(device.clone(), &FormatOptions::default()).expect("format");
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).expect("engine mount");
    let pattern: Vec<u8> = (0..FILE_BYTES).map(|index| (index % 251) as u8).collect();
    let file =
        fs.create(tandemfs::fs::ROOT_INODE, b"big", tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).expect("create");
    fs.write(file.inode, 0, &pattern).expect("write");
    let config =
        MountConfig { transport: FuseTransport::Uring, uring_move_min_bytes: move_min_bytes, ..MountConfig::default() };
    let mut mount = mount_background(fs.clone(), &directory, &config).expect("FUSE mount");
    let reader_cpu = allowed_cpus()[0];
    let path = directory.join("big");
    let read = std::thread::spawn(move || {
        // SAFETY: a set with one CPU this process may use.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(reader_cpu, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        }
        let mut bytes = Vec::with_capacity(FILE_BYTES);
        let mut file = fs::File::open(&path).expect("open through the mount");
        let mut chunk = vec![0u8; 1 << 20];
        loop {
            let count = file.read(&mut chunk).expect("read through the mount");
            if count == 0 {
                break;
            }
            bytes.extend_from_slice(&chunk[..count]);
        }
        (bytes, wide_queue_threads())
    });
    let (bytes, wide) = read.join().expect("reader");
    assert!(bytes == pattern, "the bytes read through the mount are the ones written");
    let reads = mount.uring_reads().expect("served over io_uring");
    mount.unmount().expect("unmount");
    fs.unmount().expect("engine unmount");
    let _ = fs::remove_dir(&directory);
    (reads, wide)
}

#[test]
fn a_readers_large_reads_are_served_by_threads_free_to_leave_its_cpu() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    // Moving off: every READ is served by a thread pinned to the reader's CPU, its queue's
    // (what the transport did before reads moved), so every READ is served there.
    let (pinned, wide) = read_through_mount(0);
    assert!(pinned.reads > 0, "{pinned:?}");
    assert_eq!(wide, 0, "every queue thread pinned to its CPU");
    assert_eq!(pinned.moved, 0, "{pinned:?}");
    assert_eq!(pinned.served_elsewhere, 0, "all on the reader's CPU: {pinned:?}");
    // The default: the thread that served the read-ahead (requests of up to 1 MiB) may run on
    // any CPU, and still may after the last read. Where the scheduler ran it depends on what
    // else the machine runs (the reader's CPU is the right one while the reader sleeps), so it
    // is printed, not checked.
    let (moved, wide) = read_through_mount(tandem_fuse::URING_MOVE_MIN_BYTES_DEFAULT);
    assert!(wide >= 1, "a queue thread free to leave its (the reader's) CPU: {moved:?}");
    assert!(moved.moved > 0 && moved.moved <= moved.reads, "{moved:?}");
    assert!(moved.served_elsewhere <= moved.moved, "{moved:?}");
    eprintln!("{moved:?}");
}
