//! Mounts a memory-backed volume through the kernel and drives the adapter with ordinary file
//! system calls. Needs root and /dev/fuse; elsewhere each test says so and passes without
//! running (CI runs as root; the real-programs suite is tests/mount/run.sh).

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tandem_fuse::{ioctl, mount_background, uring_availability, BackgroundMount, FuseTransport, MountConfig};
use tandemfs::device::MemoryDevice;
use tandemfs::fs::{FormatOptions, MountOptions};
use tandemfs::FileSystem;

struct MountedVolume {
    mount: Option<BackgroundMount>,
    fs: FileSystem,
    directory: PathBuf,
}

impl MountedVolume {
    fn path(&self, name: &str) -> PathBuf {
        self.directory.join(name)
    }
}

impl Drop for MountedVolume {
    fn drop(&mut self) {
        if let Some(mut mount) = self.mount.take() {
            mount.unmount().expect("unmount");
        }
        self.fs.unmount().expect("engine unmount");
        let _ = fs::remove_dir(&self.directory);
    }
}

fn mounted() -> Option<MountedVolume> {
    mounted_with(&MountConfig::default())
}

fn mounted_with(config: &MountConfig) -> Option<MountedVolume> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: mounting needs root and /dev/fuse");
        return None;
    }
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let directory = std::env::temp_dir().join(format!(
        "tandem-fuse-test-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&directory).unwrap();
    let device = Arc::new(MemoryDevice::new(256 << 20));
    FileSystem::format(device.clone(), &FormatOptions::default()).expect("format");
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).expect("engine mount");
    let mount = mount_background(fs.clone(), &directory, config).expect("FUSE mount");
    Some(MountedVolume { mount: Some(mount), fs, directory })
}

#[test]
fn files_directories_and_links_round_trip() {
    let Some(volume) = mounted() else { return };
    fs::create_dir(volume.path("directory")).unwrap();
    fs::write(volume.path("directory/file"), b"contents").unwrap();
    assert_eq!(fs::read(volume.path("directory/file")).unwrap(), b"contents");
    fs::rename(volume.path("directory/file"), volume.path("renamed")).unwrap();
    fs::hard_link(volume.path("renamed"), volume.path("second-name")).unwrap();
    assert_eq!(fs::metadata(volume.path("renamed")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("renamed", volume.path("symbolic")).unwrap();
    assert_eq!(fs::read_link(volume.path("symbolic")).unwrap(), Path::new("renamed"));
    assert_eq!(fs::read(volume.path("symbolic")).unwrap(), b"contents");
    let mut names: Vec<String> = fs::read_dir(&volume.directory)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["directory", "renamed", "second-name", "symbolic"]);
    fs::set_permissions(volume.path("renamed"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(volume.path("second-name")).unwrap().mode() & 0o7777, 0o640);
    fs::remove_file(volume.path("renamed")).unwrap();
    assert_eq!(fs::read(volume.path("second-name")).unwrap(), b"contents");
    fs::remove_dir(volume.path("directory")).unwrap();
}

#[test]
fn engine_errors_arrive_as_errno() {
    let Some(volume) = mounted() else { return };
    assert_eq!(File::open(volume.path("missing")).unwrap_err().kind(), ErrorKind::NotFound);
    fs::create_dir(volume.path("full")).unwrap();
    fs::write(volume.path("full/file"), b"x").unwrap();
    assert_eq!(fs::create_dir(volume.path("full")).unwrap_err().kind(), ErrorKind::AlreadyExists);
    assert_eq!(fs::remove_dir(volume.path("full")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
    let long_name = "n".repeat(256);
    assert_eq!(File::create(volume.path(&long_name)).unwrap_err().raw_os_error(), Some(libc::ENAMETOOLONG));
    assert_eq!(File::open(volume.path("full/file/below")).unwrap_err().raw_os_error(), Some(libc::ENOTDIR));
}

/// Drops the kernel's cached pages of `file`, so that the next reads reach the server.
fn drop_cached_pages(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only reads its integer arguments.
    let result = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(result, 0, "posix_fadvise");
}

/// One sequential reader keeps several workers copying at once: the kernel sends a read-ahead
/// window's 1 MiB requests together, and at 1 MiB of read-ahead it had at most 2 in flight.
#[test]
fn one_sequential_reader_keeps_several_workers_reading() {
    for (read_ahead_kib, most_at_least, most_at_most) in [(tandem_fuse::READ_AHEAD_KIB_DEFAULT, 3, 4), (1024, 1, 2)] {
        let config = MountConfig {
            threads: 4,
            transport: FuseTransport::DevFuse,
            read_ahead_kib,
            poll_microseconds: 0,
            ..MountConfig::default()
        };
        let Some(volume) = mounted_with(&config) else { return };
        let chunk: Vec<u8> = (0..1usize << 20).map(|index| (index % 253) as u8).collect();
        let mut file = File::create(volume.path("large")).unwrap();
        for _ in 0..48 {
            file.write_all(&chunk).unwrap();
        }
        drop(file);
        let mut file = File::open(volume.path("large")).unwrap();
        drop_cached_pages(&file);
        let mut buffer = vec![0u8; 1 << 20];
        for index in 0..48 {
            file.read_exact(&mut buffer).unwrap();
            assert!(buffer == chunk, "MiB {index} differs");
        }
        let most = volume.mount.as_ref().unwrap().reads_at_once_most();
        assert!(
            (most_at_least..=most_at_most).contains(&most),
            "read-ahead {read_ahead_kib} KiB: at most {most} READs at once, expected {most_at_least}..={most_at_most}"
        );
    }
}

#[test]
fn sequential_reads_use_the_default_read_ahead_and_reused_buffers_stay_exact() {
    let Some(volume) = mounted() else { return };
    // The server set the mount's read-ahead to 8 MiB through sysfs (root runs this test).
    let device = fs::metadata(&volume.directory).unwrap().dev();
    let read_ahead =
        fs::read_to_string(format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(device), libc::minor(device)))
            .unwrap();
    assert_eq!(read_ahead.trim(), tandem_fuse::READ_AHEAD_KIB_DEFAULT.to_string());

    // Several closes, none of which sends a FLUSH (FOPEN_NOFLUSH).
    let pattern: Vec<u8> = (0..(3usize << 20) + 777).map(|index| (index % 251) as u8).collect();
    for round in 0..3 {
        let mut file = File::create(volume.path("pattern")).unwrap();
        file.write_all(&pattern[..pattern.len() - round]).unwrap();
    }
    let expected = &pattern[..pattern.len() - 2];
    let mut file = File::open(volume.path("pattern")).unwrap();
    drop_cached_pages(&file);
    let mut whole = Vec::new();
    file.read_to_end(&mut whole).unwrap();
    assert!(whole == expected, "sequential read differs from what was written");
    // A short read at the end after large ones: the worker's buffer still holds bytes of the
    // earlier reads past the end of the file, and none of them may be returned.
    drop_cached_pages(&file);
    let mut tail = vec![0xEEu8; 8192];
    let count = file.read_at(&mut tail, expected.len() as u64 - 100).unwrap();
    assert_eq!(count, 100);
    assert_eq!(&tail[..100], &expected[expected.len() - 100..]);
    assert_eq!(file.metadata().unwrap().len(), expected.len() as u64);
}

#[test]
fn large_offsets_and_unlinked_open_files() {
    let Some(volume) = mounted() else { return };
    let file = OpenOptions::new().read(true).write(true).create_new(true).open(volume.path("sparse")).unwrap();
    let far = (5u64 << 30) + 123;
    file.write_all_at(b"far away", far).unwrap();
    assert_eq!(file.metadata().unwrap().len(), far + 8);
    let mut buffer = [1u8; 8];
    file.read_exact_at(&mut buffer, far).unwrap();
    assert_eq!(&buffer, b"far away");
    file.read_exact_at(&mut buffer, 4 << 30).unwrap();
    assert_eq!(buffer, [0u8; 8]);
    fs::remove_file(volume.path("sparse")).unwrap();
    file.write_all_at(b"still alive", 0).unwrap();
    let mut start = [0u8; 11];
    file.read_exact_at(&mut start, 0).unwrap();
    assert_eq!(&start, b"still alive");
}

#[test]
fn insert_and_collapse_through_ioctl() {
    let Some(volume) = mounted() else { return };
    let path = volume.path("edited");
    fs::write(&path, b"hello world").unwrap();
    let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    ioctl::insert_data(&file, 5, b", dear").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"hello, dear world");
    ioctl::insert_zeros(&file, 0, 2).unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"\0\0hello, dear world");
    ioctl::collapse(&file, 0, 9).unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"dear world");
    let mut through_descriptor = String::new();
    (&file).read_to_string(&mut through_descriptor).unwrap();
    assert_eq!(through_descriptor, "dear world");
    // Beyond the end, and through a read-only descriptor: refused, file unchanged.
    assert_eq!(ioctl::collapse(&file, 5, 100).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    let read_only = File::open(&path).unwrap();
    assert_eq!(ioctl::insert_zeros(&read_only, 0, 1).unwrap_err().raw_os_error(), Some(libc::EBADF));
    assert_eq!(fs::read(&path).unwrap(), b"dear world");
    // Appending after an insert lands at the new end.
    let mut appender = OpenOptions::new().append(true).open(&path).unwrap();
    ioctl::insert_zeros(&file, 0, 1).unwrap();
    appender.write_all(b"!").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"\0dear world!");
}

#[test]
fn extended_attributes() {
    let Some(volume) = mounted() else { return };
    let path = volume.path("attributed");
    fs::write(&path, b"").unwrap();
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let name = c"user.test";
    let value = b"value";
    // SAFETY: all pointers are valid for the lengths given.
    unsafe {
        assert_eq!(libc::setxattr(c_path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0), 0);
        assert_eq!(libc::getxattr(c_path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0), 5);
        let mut small = [0u8; 2];
        assert_eq!(libc::getxattr(c_path.as_ptr(), name.as_ptr(), small.as_mut_ptr().cast(), 2), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ERANGE));
        let mut list = [0u8; 64];
        let length = libc::listxattr(c_path.as_ptr(), list.as_mut_ptr().cast(), list.len());
        assert_eq!(&list[..length as usize], b"user.test\0");
        assert_eq!(libc::removexattr(c_path.as_ptr(), name.as_ptr()), 0);
        assert_eq!(libc::getxattr(c_path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENODATA));
    }
}

#[test]
fn unmount_by_path_returns_for_a_background_mount_of_this_process() {
    let Some(mut volume) = mounted() else { return };
    fs::write(volume.path("kept"), b"kept").unwrap();
    let started = std::time::Instant::now();
    tandem_fuse::unmount(&volume.directory).unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "unmount waited for itself");
    // The background mount sees the mount gone; finishing it is then only a join and a sync.
    volume.mount.take().unwrap().unmount().unwrap();
    let mut buffer = vec![0u8; 4];
    let found = volume.fs.lookup(tandemfs::fs::ROOT_INODE, b"kept").unwrap();
    assert_eq!(volume.fs.read(found.inode, 0, &mut buffer).unwrap(), 4);
    assert_eq!(buffer, b"kept");
}

fn which_setpriv() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|directory| Path::new(directory).join("setpriv"))
        .find(|candidate| candidate.exists())
}

/// Runs `command` as nobody:nogroup with no supplementary groups; true when it succeeded.
fn as_nobody(command: &[&str]) -> bool {
    std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .args(command)
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .expect("setpriv (util-linux) is needed")
        .success()
}

#[test]
fn the_adapter_checks_permissions_when_the_kernel_does_not() {
    let config = MountConfig { allow_other: true, default_permissions: false, ..MountConfig::default() };
    let Some(volume) = mounted_with(&config) else { return };
    let path = |name: &str| volume.path(name).to_str().unwrap().to_string();
    fs::write(volume.path("secret"), b"secret").unwrap();
    fs::set_permissions(volume.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(volume.path("public"), b"public").unwrap();
    fs::set_permissions(volume.path("public"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(volume.path("private")).unwrap();
    fs::set_permissions(volume.path("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::create_dir(volume.path("sticky")).unwrap();
    fs::set_permissions(volume.path("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(volume.path("sticky/root-owned"), b"").unwrap();
    fs::set_permissions(volume.path("sticky/root-owned"), fs::Permissions::from_mode(0o666)).unwrap();

    if which_setpriv().is_none() || !as_nobody(&["test", "-e", &path("public")]) {
        eprintln!("skipped: needs setpriv, and a temporary directory that nobody may traverse");
        return;
    }
    assert!(as_nobody(&["cat", &path("public")]));
    assert!(!as_nobody(&["cat", &path("secret")]));
    assert!(!as_nobody(&["sh", "-c", &format!("echo x >> '{}'", path("public"))]));
    assert!(!as_nobody(&["ls", &path("private")]));
    assert!(!as_nobody(&["touch", &path("new")]));
    assert!(!as_nobody(&["chmod", "777", &path("public")]));
    assert!(!as_nobody(&["chown", "nobody", &path("public")]));
    assert!(as_nobody(&["touch", &path("sticky/mine")]));
    assert!(as_nobody(&["sh", "-c", &format!("echo x >> '{}'", path("sticky/root-owned"))]));
    assert!(!as_nobody(&["rm", "-f", &path("sticky/root-owned")]));
    assert!(!as_nobody(&["touch", "-d", "2001-01-01", &path("sticky/root-owned")]));
    assert!(as_nobody(&["rm", &path("sticky/mine")]));
    assert!(volume.path("sticky/root-owned").exists());
}

/// The kernel round trips behind a create, a stat and an unlink (docs/FUSE.md, "What a create,
/// stat and unlink cost through the mount"): no change to the adapter may add one. Counted by
/// the adapter itself; RELEASE and FORGET arrive after the system call returns, so the
/// counters are read once they stop moving.
#[test]
fn create_stat_and_unlink_cost_no_more_requests_than_the_kernel_asks() {
    let Some(volume) = mounted_with(&MountConfig { transport: FuseTransport::DevFuse, ..MountConfig::default() })
    else {
        return;
    };
    assert_eq!(volume.mount.as_ref().unwrap().transport().transport, FuseTransport::DevFuse);
    check_request_costs(&volume);
}

/// The same counts over io_uring: the transport changes how requests travel, not which.
#[test]
fn create_stat_and_unlink_cost_the_same_requests_over_io_uring() {
    let Some(volume) = mounted_over_io_uring() else { return };
    check_request_costs(&volume);
}

/// A volume mounted with `transport: Uring`; None (saying why) where this machine does not
/// allow it.
fn mounted_over_io_uring() -> Option<MountedVolume> {
    if let Err(why) = uring_availability() {
        eprintln!("skipped: {why}");
        return None;
    }
    let volume = mounted_with(&MountConfig { transport: FuseTransport::Uring, ..MountConfig::default() })?;
    assert_eq!(volume.mount.as_ref().unwrap().transport().transport, FuseTransport::Uring);
    Some(volume)
}

/// Create, stat, write, read back and unlink through the io_uring transport, in several
/// threads so that requests arrive on every CPU's queue.
#[test]
fn create_stat_and_unlink_round_trip_over_io_uring() {
    let Some(volume) = mounted_over_io_uring() else { return };
    fs::create_dir(volume.path("ring")).unwrap();
    let directory = volume.path("ring");
    std::thread::scope(|scope| {
        for worker in 0..4 {
            let directory = &directory;
            scope.spawn(move || {
                for index in 0..100 {
                    let name = directory.join(format!("w{worker}-f{index}"));
                    let contents = format!("worker {worker} file {index}").repeat(index + 1);
                    File::create_new(&name).unwrap().write_all(contents.as_bytes()).unwrap();
                    let metadata = fs::metadata(&name).unwrap();
                    assert_eq!(metadata.len(), contents.len() as u64);
                    assert_eq!(fs::read(&name).unwrap(), contents.as_bytes());
                    fs::remove_file(&name).unwrap();
                    assert_eq!(fs::metadata(&name).unwrap_err().kind(), ErrorKind::NotFound);
                }
            });
        }
    });
    // A 3 MiB write and read: requests of the full 1 MiB payload in both directions.
    let large: Vec<u8> = (0..3u32 << 20).map(|index| (index % 251) as u8).collect();
    fs::write(volume.path("large"), &large).unwrap();
    let file = File::open(volume.path("large")).unwrap();
    drop_cached_pages(&file);
    assert_eq!(fs::read(volume.path("large")).unwrap(), large);
    assert_eq!(fs::read_dir(&directory).unwrap().count(), 0);
}

/// The adapter's counters once they stopped moving (RELEASE and FORGET arrive after the system
/// call that caused them returned).
fn settled_counts(volume: &MountedVolume) -> tandem_fuse::RequestCounts {
    let mount = volume.mount.as_ref().expect("mounted");
    let mut last = mount.request_counts();
    for _ in 0..40 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = mount.request_counts();
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// The requests `operation` costs when run on every name.
fn requests_of<T>(volume: &MountedVolume, names: &[T], mut operation: impl FnMut(&T)) -> tandem_fuse::RequestCounts {
    let before = settled_counts(volume);
    names.iter().for_each(&mut operation);
    settled_counts(volume).since(&before)
}

fn check_request_costs(volume: &MountedVolume) {
    use tandem_fuse::RequestKind;
    fs::create_dir(volume.path("probe")).unwrap();
    const FILES: u64 = 200;
    let names: Vec<PathBuf> = (0..FILES).map(|index| volume.path(&format!("probe/f{index:04}"))).collect();
    let renamed: Vec<(PathBuf, PathBuf)> =
        names.iter().map(|name| (name.clone(), name.with_extension("renamed"))).collect();
    let created = requests_of(volume, &names, |name| {
        OpenOptions::new().write(true).create_new(true).open(name).unwrap();
    });
    let stated = requests_of(volume, &names, |name| {
        fs::metadata(name).unwrap();
    });
    let moved = requests_of(volume, &renamed, |(from, to)| fs::rename(from, to).unwrap());
    let unlinked = requests_of(volume, &renamed, |(_, name)| fs::remove_file(name).unwrap());
    let made = requests_of(volume, &names, |name| fs::create_dir(name).unwrap());
    let removed = requests_of(volume, &names, |name| fs::remove_dir(name).unwrap());
    let mut appender = OpenOptions::new().append(true).create_new(true).open(volume.path("probe/append")).unwrap();
    // The file's first write, which the kernel still checks for capabilities.
    appender.write_all(&[0x5a; 256]).unwrap();
    let appended = requests_of(volume, &names, |_| {
        appender.write_all(&[0x5a; 256]).unwrap();
        appender.sync_all().unwrap();
    });
    drop(appender);
    assert_eq!(fs::metadata(volume.path("probe/append")).unwrap().len(), 256 * (FILES + 1));

    // A create: the parent's GETATTR, LOOKUP, CREATE and RELEASE; no FLUSH (FOPEN_NOFLUSH).
    assert_eq!(created.get(RequestKind::Create), FILES, "{created:?}");
    assert_eq!(created.get(RequestKind::Flush), 0, "{created:?}");
    assert!(created.total() <= 4 * FILES, "{created:?}");
    // A stat of a name the kernel knows: nothing but, at most, one GETATTR of the directory.
    assert!(stated.total() <= 1, "{stated:?}");
    // A rename: the parent's GETATTR, LOOKUP of the new name, RENAME.
    assert_eq!(moved.get(RequestKind::Rename), FILES, "{moved:?}");
    assert!(moved.total() <= 3 * FILES, "{moved:?}");
    // An unlink: the parent's GETATTR, UNLINK and FORGET.
    assert_eq!(unlinked.get(RequestKind::Unlink), FILES, "{unlinked:?}");
    assert!(unlinked.total() <= 3 * FILES, "{unlinked:?}");
    // A mkdir: the parent's GETATTR, LOOKUP, MKDIR (no GETATTR of the new directory: the reply
    // carries its attributes); an rmdir: GETATTR, RMDIR, FORGET.
    assert_eq!(made.get(RequestKind::Mkdir), FILES, "{made:?}");
    assert!(made.total() <= 3 * FILES, "{made:?}");
    assert_eq!(removed.get(RequestKind::Rmdir), FILES, "{removed:?}");
    assert!(removed.total() <= 3 * FILES, "{removed:?}");
    // A durable append: WRITE and FSYNC. With FUSE_HANDLE_KILLPRIV_V2 the kernel stops asking
    // for security.capability before every write once the file had one write without set-ID
    // bits or capabilities (the first write of this file, above, came before the counting).
    assert_eq!(appended.get(RequestKind::Write), FILES, "{appended:?}");
    assert_eq!(appended.get(RequestKind::Fsync), FILES, "{appended:?}");
    assert_eq!(appended.get(RequestKind::Getxattr), 0, "{appended:?}");
    assert_eq!(appended.total(), 2 * FILES, "{appended:?}");
}

/// Opens and creates answer FOPEN_NOFLUSH, so no close of a fresh mount sends a FLUSH, not even
/// the first (which the adapter used to refuse with ENOSYS), and what was written is read back
/// the same after the close and, through the library, after the unmount. (Writes through a
/// shared mmap are checked by the mount suite, in processes of their own: a process that
/// faults on pages of a mount it serves itself can deadlock on its own memory map lock.)
#[test]
fn closes_send_no_flush() {
    use tandem_fuse::RequestKind;
    let Some(mut volume) = mounted() else { return };
    for round in 0..3u8 {
        let mut file = File::create(volume.path("closed")).unwrap();
        file.write_all(&[round; 5000]).unwrap();
        drop(file);
        let reader = File::open(volume.path("closed")).unwrap();
        assert_eq!(fs::read(volume.path("closed")).unwrap(), vec![round; 5000]);
        drop(reader);
    }
    let counts = settled_counts(&volume);
    assert_eq!(counts.get(RequestKind::Flush), 0, "{counts:?}");
    volume.mount.take().expect("mounted").unmount().expect("unmount");
    let stored = volume.fs.lookup(tandemfs::fs::ROOT_INODE, b"closed").expect("the file");
    let mut bytes = vec![0u8; 5000];
    assert_eq!(volume.fs.read(stored.inode, 0, &mut bytes).expect("read"), 5000);
    assert_eq!(bytes, vec![2u8; 5000]);
}

/// The kernel caches negative lookups for an hour (`CACHE_TIMEOUT`): a name that appears
/// through this mount afterwards, by create, rename, link, mkdir or symlink, is seen at once,
/// because the kernel replaces the negative entry itself when it forwards the change.
#[test]
fn a_cached_negative_entry_never_hides_a_name_made_through_the_mount() {
    let Some(volume) = mounted() else { return };
    let missing = |name: &str| {
        assert_eq!(fs::metadata(volume.path(name)).unwrap_err().kind(), ErrorKind::NotFound, "{name}");
    };
    for name in ["renamed", "linked", "made", "symbolic", "created", "exchanged"] {
        missing(name);
        // Twice: the second is answered from the negative entry, without a LOOKUP.
        let before = settled_counts(&volume);
        missing(name);
        assert_eq!(settled_counts(&volume).since(&before).total(), 0, "{name}: negative entry not cached");
    }
    fs::write(volume.path("source"), b"renamed").unwrap();
    fs::rename(volume.path("source"), volume.path("renamed")).unwrap();
    assert_eq!(fs::read(volume.path("renamed")).unwrap(), b"renamed");
    missing("source");
    fs::hard_link(volume.path("renamed"), volume.path("linked")).unwrap();
    assert_eq!(fs::read(volume.path("linked")).unwrap(), b"renamed");
    fs::create_dir(volume.path("made")).unwrap();
    assert!(fs::metadata(volume.path("made")).unwrap().is_dir());
    std::os::unix::fs::symlink("renamed", volume.path("symbolic")).unwrap();
    assert_eq!(fs::read(volume.path("symbolic")).unwrap(), b"renamed");
    OpenOptions::new().write(true).create_new(true).open(volume.path("created")).unwrap();
    assert_eq!(fs::metadata(volume.path("created")).unwrap().len(), 0);
    // Unlinked again, then created again: the unlink leaves a negative entry of its own.
    fs::remove_file(volume.path("created")).unwrap();
    missing("created");
    fs::write(volume.path("created"), b"again").unwrap();
    assert_eq!(fs::read(volume.path("created")).unwrap(), b"again");
    // A rename over a name the kernel knows as missing, from a name it knows as present,
    // then back: both directions are seen.
    fs::rename(volume.path("created"), volume.path("exchanged")).unwrap();
    missing("created");
    assert_eq!(fs::read(volume.path("exchanged")).unwrap(), b"again");
}

/// The library and the mount share a volume in the serving process (`mount_background` is
/// given a `FileSystem` handle, and its clones stay usable). A name the library creates behind
/// the kernel's back is hidden by a negative entry the kernel cached before, until
/// `BackgroundMount::invalidate_entry` tells the kernel; contents changed there stay stale in
/// the page cache until `invalidate_inode`.
#[test]
fn a_name_made_through_the_library_is_seen_once_the_mount_is_told() {
    let Some(volume) = mounted() else { return };
    let path = volume.path("from-library");
    assert_eq!(fs::metadata(&path).unwrap_err().kind(), ErrorKind::NotFound);
    let root = tandemfs::fs::ROOT_INODE;
    let created = volume.fs.create(root, b"from-library", tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).unwrap();
    volume.fs.write(created.inode, 0, b"library").unwrap();
    volume.mount.as_ref().unwrap().invalidate_entry(root, std::ffi::OsStr::new("from-library")).unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"library");
    // Contents changed through the library: the kernel keeps its pages (FOPEN_KEEP_CACHE)
    // and its size until told.
    volume.fs.write(created.inode, 0, b"LIBRARY, longer").unwrap();
    volume.mount.as_ref().unwrap().invalidate_inode(created.inode).unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"LIBRARY, longer");
}

/// Set-ID bits and file capabilities are dropped by the file system under
/// FUSE_HANDLE_KILLPRIV_V2 (docs/FUSE.md, "Set-ID bits and capabilities"), as Linux drops
/// them: a write by root (CAP_FSETID) keeps set-ID bits, a write, truncation or fallocate by
/// another user drops them, and any write drops `security.capability`.
#[test]
fn writes_drop_set_id_bits_and_capabilities_as_linux_does() {
    let Some(volume) = mounted_with(&MountConfig { allow_other: true, ..MountConfig::default() }) else { return };
    let path = volume.path("set-id");
    let text = path.to_str().unwrap().to_string();
    fs::write(&path, b"x").unwrap();
    let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o7777;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o6777)).unwrap();
    OpenOptions::new().append(true).open(&path).unwrap().write_all(b"root").unwrap();
    assert_eq!(mode(&path), 0o6777, "a write by root keeps set-ID bits");
    if which_setpriv().is_none() || !as_nobody(&["test", "-w", &text]) {
        eprintln!("skipped the other user's part: needs setpriv, and a temporary directory that nobody may traverse");
        return;
    }
    let nobody_appends = || assert!(as_nobody(&["sh", "-c", &format!("printf nobody >> '{text}'")]));
    nobody_appends();
    assert_eq!(mode(&path), 0o777, "a write by another user drops both (group-executable)");
    // Without group execute, set-group-ID goes too when the writer is not in the group.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o6766)).unwrap();
    nobody_appends();
    assert_eq!(mode(&path), 0o766);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o6777)).unwrap();
    assert!(as_nobody(&["truncate", "-s", "1", &text]));
    assert_eq!(mode(&path), 0o777, "a truncation by another user drops both");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o6777)).unwrap();
    assert!(as_nobody(&["fallocate", "-l", "8192", &text]));
    assert_eq!(mode(&path), 0o777, "fallocate by another user drops both");
    // chown(-1, -1) by root: set-user-ID goes, and set-group-ID of a group-executable file.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o6755)).unwrap();
    std::os::unix::fs::chown(&path, None, None).unwrap();
    assert_eq!(mode(&path), 0o755);
    // The kernel's cached mode, which exec(2) reads, follows without a stat in between.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o4777)).unwrap();
    nobody_appends();
    let file = File::open(&path).unwrap();
    assert_eq!(file.metadata().unwrap().permissions().mode() & 0o7777, 0o777);
    // Capabilities go on any write, root's included.
    let capability = [1u8, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    set_xattr(&path, "security.capability", &capability);
    let inode = fs::metadata(&path).unwrap().ino();
    assert_eq!(volume.fs.get_xattr(inode, b"security.capability").unwrap(), capability);
    OpenOptions::new().append(true).open(&path).unwrap().write_all(b"root again").unwrap();
    assert!(volume.fs.get_xattr(inode, b"security.capability").is_err(), "capability kept after a write");
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated strings and a live slice; the result is checked.
    let result = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(result, 0, "setxattr: {}", std::io::Error::last_os_error());
}

/// `Auto` runs io_uring exactly where this machine allows it, and otherwise says why not.
#[test]
fn automatic_transport_follows_what_the_kernel_allows() {
    let Some(volume) = mounted_with(&MountConfig { transport: FuseTransport::Auto, ..MountConfig::default() }) else {
        return;
    };
    let report = volume.mount.as_ref().unwrap().transport().clone();
    match uring_availability() {
        Ok(()) => assert_eq!(report.transport, FuseTransport::Uring, "{report}"),
        Err(why) => {
            assert_eq!(report.transport, FuseTransport::DevFuse, "{report}");
            assert_eq!(report.reason, why);
        }
    }
    fs::write(volume.path("file"), b"either way").unwrap();
    assert_eq!(fs::read(volume.path("file")).unwrap(), b"either way");
}
