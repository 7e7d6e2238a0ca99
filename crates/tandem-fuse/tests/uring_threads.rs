//! The io_uring queue threads end with the mount. A test binary of its own, so that no other
//! mount of this process starts or ends queue threads while they are counted. Needs root,
//! /dev/fuse and FUSE over io_uring allowed by the kernel; elsewhere it says so and passes
//! without running.

use std::fs;
use std::sync::Arc;

use tandem_fuse::{mount_background, uring_availability, FuseTransport, MountConfig};
use tandemfs::device::MemoryDevice;
use tandemfs::fs::{FormatOptions, MountOptions};
use tandemfs::FileSystem;

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// The kernel's FUSE queue count: one per possible CPU.
fn possible_cpus() -> usize {
    let list = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let highest = list.trim().split(',').map(|range| range.rsplit('-').next().unwrap().parse::<usize>().unwrap()).max();
    highest.unwrap() + 1
}

#[test]
fn unmount_stops_every_io_uring_queue_thread() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: mounting needs root and /dev/fuse");
        return;
    }
    if let Err(why) = uring_availability() {
        eprintln!("skipped: {why}");
        return;
    }
    let directory = std::env::temp_dir().join(format!("tandem-fuse-uring-threads-{}", std::process::id()));
    fs::create_dir_all(&directory).unwrap();
    let device = Arc::new(MemoryDevice::new(64 << 20));
    FileSystem::format(device.clone(), &FormatOptions::default()).expect("format");
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).expect("engine mount");
    let config = MountConfig { transport: FuseTransport::Uring, ..MountConfig::default() };
    assert_eq!(threads_named("tandemfs-uring"), 0);
    let mut mount = mount_background(fs.clone(), &directory, &config).expect("FUSE mount");
    assert_eq!(threads_named("tandemfs-uring"), config.uring_entries_per_queue * possible_cpus());
    fs::write(directory.join("file"), b"served").unwrap();
    assert_eq!(fs::read(directory.join("file")).unwrap(), b"served");
    mount.unmount().expect("unmount");
    assert_eq!(threads_named("tandemfs-uring"), 0, "queue threads left after the unmount");
    fs.unmount().expect("engine unmount");
    let _ = fs::remove_dir(&directory);
}
