//! A mount with a polling worker (`MountConfig::poll_microseconds`) serves concurrent callers
//! exactly as one without, and its poller ends with the unmount, which closes every /dev/fuse
//! descriptor of the mount. A test binary of its own, so
//! that no other mount of this process opens /dev/fuse descriptors while they are inspected.
//! Needs root and /dev/fuse; elsewhere it says so and passes without running.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_fuse::{mount_background, FuseTransport, MountConfig};
use tandemfs::device::MemoryDevice;
use tandemfs::fs::{FormatOptions, MountOptions};
use tandemfs::FileSystem;

/// This process's /dev/fuse descriptors not in `earlier`: (descriptor, opened non-blocking).
fn fuse_descriptors(earlier: &[(String, bool)]) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if fs::read_link(entry.path()).ok().as_deref() != Some(Path::new("/dev/fuse")) {
            continue;
        }
        let name = entry.file_name().into_string().unwrap();
        if earlier.iter().any(|(known, _)| *known == name) {
            continue;
        }
        let Ok(info) = fs::read_to_string(format!("/proc/self/fdinfo/{name}")) else { continue };
        let flags = info.lines().find_map(|line| line.strip_prefix("flags:")).expect("flags line");
        let flags = u32::from_str_radix(flags.trim(), 8).expect("octal flags");
        found.push((name, flags & libc::O_NONBLOCK as u32 != 0));
    }
    found
}

/// Four threads each create, write, read back, rename and remove their own files in one shared
/// directory; returns what each read back, in order.
fn four_callers(root: &Path) -> Vec<Vec<u8>> {
    let callers: Vec<_> = (0..4u8)
        .map(|caller| {
            let root: PathBuf = root.to_path_buf();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for index in 0..150u32 {
                    let name = root.join(format!("c{caller}-{index}"));
                    let contents: Vec<u8> = (0..(index % 7) * 700 + 1).map(|byte| (byte as u8) ^ caller).collect();
                    fs::write(&name, &contents).unwrap();
                    let back = fs::read(&name).unwrap();
                    assert_eq!(back, contents, "{}", name.display());
                    let renamed = name.with_extension("moved");
                    fs::rename(&name, &renamed).unwrap();
                    assert_eq!(fs::metadata(&renamed).unwrap().len(), contents.len() as u64);
                    fs::remove_file(&renamed).unwrap();
                    seen.push(back[0]);
                }
                seen
            })
        })
        .collect();
    callers.into_iter().map(|caller| caller.join().expect("caller")).collect()
}

#[test]
fn a_polling_worker_serves_concurrent_callers_like_sleeping_ones() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: mounting needs root and /dev/fuse");
        return;
    }
    let mut results = Vec::new();
    for poll_microseconds in [0, 200] {
        let directory =
            std::env::temp_dir().join(format!("tandem-fuse-poll-{}-{poll_microseconds}", std::process::id()));
        fs::create_dir_all(&directory).unwrap();
        let device = Arc::new(MemoryDevice::new(128 << 20));
        FileSystem::format(device.clone(), &FormatOptions::default()).expect("format");
        let (fs, _) = FileSystem::mount(device, &MountOptions::default()).expect("engine mount");
        let config =
            MountConfig { threads: 4, transport: FuseTransport::DevFuse, poll_microseconds, ..Default::default() };
        let earlier = fuse_descriptors(&[]);
        let mut mount = mount_background(fs.clone(), &directory, &config).expect("FUSE mount");
        // The poller reads its own descriptor without blocking; every other worker blocks.
        // The workers clone their descriptors once the session runs.
        let mut descriptors = fuse_descriptors(&earlier);
        let started = Instant::now();
        while descriptors.len() < 4 && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
            descriptors = fuse_descriptors(&earlier);
        }
        assert_eq!(descriptors.len(), 4, "{descriptors:?}");
        let polling = descriptors.iter().filter(|(_, non_blocking)| *non_blocking).count();
        assert_eq!(polling, usize::from(poll_microseconds > 0), "{descriptors:?}");
        results.push(four_callers(&directory));
        assert_eq!(fs::read_dir(&directory).unwrap().count(), 0);
        // The poller, asleep in poll(2) by now, ends with the unmount (which joins it).
        let started = Instant::now();
        mount.unmount().expect("unmount");
        assert!(started.elapsed() < Duration::from_secs(10), "unmount took {:?}", started.elapsed());
        // Every descriptor the mount opened is closed by the unmount, not only by the drop.
        assert_eq!(fuse_descriptors(&earlier), Vec::new(), "left open after the unmount");
        drop(mount);
        fs.unmount().expect("engine unmount");
        fs::remove_dir(&directory).unwrap();
    }
    assert_eq!(results[0], results[1]);
}
