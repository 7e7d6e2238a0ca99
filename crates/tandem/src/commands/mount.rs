//! `tandem mount` and `tandem umount`.
//!
//! A background mount (`-d`) does not fork: forking a Rust process after it has opened the image
//! would leave locks and threads in a state nobody can reason about. Instead the parent re-runs
//! this same executable without `-d` in a new session with its output going to a log file, and
//! waits until the mount shows up in /proc/self/mountinfo (success) or the child exits (failure,
//! whose log it prints). `tandem umount` returns only once the serving process has flushed the
//! volume and exited (the adapter waits for it), so an `fsck` right after it finds the image free.

use crate::error::{CliError, CliResult, EXIT_FAILURE, EXIT_SUCCESS};
use crate::fuse_api::{self, MountConfig};
use crate::image::{self, Access};
use crate::mountinfo;
use crate::size::format_count;
use clap::Args;
use std::io::{IsTerminal, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tandemfs::fs::{AccessTimeUpdates, MountOptions, MountReport};
use tandemfs::FileSystem;

#[derive(Args)]
pub struct MountArguments {
    /// Image file or block device holding a tandemfs volume
    pub image: PathBuf,
    /// Existing directory to mount on
    pub mountpoint: PathBuf,
    /// Run in the background; returns once the mount is visible
    #[arg(long = "daemon", short = 'd')]
    pub daemon: bool,
    /// Comma-separated options: allow_other, default_permissions, ro, rw, remount (with ro or
    /// rw, on a mounted volume), dev, suid (root only), noexec, noatime (access times never move; the default is relatime), strictatime (every read moves them), threads=N (FUSE request threads), poll_us=N (over /dev/fuse one of them polls for N microseconds after each request instead of sleeping; default 50 on machines of 8 cores or more, else 0; docs/FUSE.md), read_ahead_kb=N (the mount's read-ahead, root only; default 8192; 0: the kernel's 128),
    /// transport=auto|uring|dev-fuse (FUSE over io_uring where the kernel allows it, only it, or only /dev/fuse),
    /// uring_move_min_bytes=N (over io_uring, reads of N bytes or more are served off the caller's CPU; 0: never; default 131072),
    /// backend_workers=N (threads applying the log; default half the cores, at least 2), checkpoint_interval_ms=N (default 5000), mmp_interval_ms=N,
    /// direct_write_min_bytes=N (writes of N bytes or more into unmapped bytes go straight home, not through the log; 0: none; default 65536), direct_write_overlap_min_bytes=N (direct writes of N bytes or more compute their checksums on a second thread while their bytes go home; default 0: never; docs/FUSE.md),
    /// backlog_image_logs=N (how many image logs' worth of changes may wait to be applied, 1 to 1024; default 64),
    /// compact_factor=F (files whose cuts leave them holding more than F times their bytes are compacted in the background; 0: never; default 1.25); mount(8)'s defaults, auto, noauto, user, users, nouser, owner, group,
    /// _netdev, nofail, async, exec, atime, relatime, nodev, nosuid, x-* and comment=* are
    /// accepted and change nothing
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Where a background mount writes its messages (default: in the tandem runtime directory)
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Key file of an encrypted volume (exactly 64 bytes; also -o key_file=FILE); without it,
    /// its passphrase is asked on the terminal
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

#[derive(Args)]
pub struct UmountArguments {
    /// Directory where a tandemfs volume is mounted
    pub mountpoint: PathBuf,
}

/// Set in the environment of the process a background mount starts, so it knows nobody is at a
/// terminal to press Ctrl-C.
const BACKGROUND_CHILD_VARIABLE: &str = "TANDEM_BACKGROUND_MOUNT";

/// Mount options from `-o`, checked before anything is opened.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ParsedOptions {
    pub allow_other: bool,
    pub default_permissions: bool,
    pub read_only: bool,
    pub threads: usize,
    /// `poll_us=N`: one /dev/fuse worker polls this long after a request (0: none); unset,
    /// the adapter's default for the machine's cores.
    pub poll_microseconds: Option<u64>,
    /// `uring_move_min_bytes=N`: io_uring requests of N bytes or more leave their queue's CPU;
    /// unset, the adapter's default.
    pub uring_move_min_bytes: Option<usize>,
    /// `read_ahead_kb=N`: the mount's read-ahead in KiB (0: the kernel's); unset, the adapter's
    /// default.
    pub read_ahead_kib: Option<u32>,
    /// Device files and set-id bits work (root only).
    pub dev: bool,
    pub suid: bool,
    pub no_exec: bool,
    pub no_atime: bool,
    /// Every read moves the access time (`strictatime`); otherwise relatime, unless `noatime`.
    pub strict_atime: bool,
    /// Switch a mounted volume to `read_only` instead of mounting.
    pub remount: bool,
    pub mmp_interval_ms: Option<u32>,
    /// Threads applying the log to the volume (0: half the cores, at least 2).
    pub backend_workers: usize,
    /// How often a checkpoint is taken at the least (`None`: the library's default).
    pub checkpoint_interval_ms: Option<u64>,
    /// Writes of at least this many bytes go straight home (`None`: the library's default).
    pub direct_write_min_bytes: Option<u64>,
    /// Direct writes of at least this many bytes overlap their checksums with their home
    /// write (`None`: the library's default, off).
    pub direct_write_overlap_min_bytes: Option<u64>,
    /// `backlog_image_logs=N` (`None`: the library's default).
    pub backlog_image_logs: Option<u64>,
    /// `compact_factor=F` (`None`: the library's default).
    pub compact_factor: Option<f64>,
    /// The key file of an encrypted volume (`--key-file` or `-o key_file=FILE`).
    pub key_file: Option<PathBuf>,
    /// `transport=auto|uring|dev-fuse` (`None`: the adapter's default, dev-fuse).
    pub transport: Option<crate::fuse_api::FuseTransport>,
}

/// Options mount(8) and /etc/fstab pass that mean nothing to a tandemfs mount (they steer
/// mount(8) itself, or ask for what a tandemfs mount does anyway).
const IGNORED_OPTIONS: [&str; 16] = [
    "defaults", "auto", "noauto", "user", "users", "nouser", "owner", "group", "_netdev", "nofail", "async", "exec",
    "atime", "relatime", "nodev", "nosuid",
];

/// Options of a FUSE mount as the kernel lists them (`user_id=0,group_id=0,...`): mount(8)
/// passes them back to the helper on `-o remount`; they are the mount's own and change nothing.
const KERNEL_FUSE_OPTIONS: [&str; 8] =
    ["user_id=", "group_id=", "rootmode=", "fd=", "max_read=", "blksize=", "subtype=", "fsname="];

/// Largest `uring_move_min_bytes` taken: the largest request (1 MiB); above it nothing moves,
/// which 0 says more plainly.
const URING_MOVE_MIN_BYTES_MAX: usize = 1 << 20;

const KNOWN_OPTIONS: &str =
    "allow_other, default_permissions, ro, rw, remount, dev, suid, noexec, noatime, strictatime, \
     threads=N, poll_us=N, read_ahead_kb=N, transport=auto|uring|dev-fuse, uring_move_min_bytes=N, backend_workers=N, checkpoint_interval_ms=N, mmp_interval_ms=N, direct_write_min_bytes=N, direct_write_overlap_min_bytes=N, backlog_image_logs=N, compact_factor=F, key_file=FILE, and mount(8)'s defaults, auto, noauto, user, users, nouser, owner, group, \
     _netdev, nofail, async, exec, atime, relatime, nodev, nosuid, x-*, comment=*, and on a remount the \
     kernel's user_id=, group_id=, rootmode=, fd=, max_read=, blksize=, subtype=, fsname=";

pub fn parse_options(lists: &[String]) -> CliResult<ParsedOptions> {
    let mut parsed = ParsedOptions::default();
    for item in lists.iter().flat_map(|list| list.split(',')).map(str::trim).filter(|item| !item.is_empty()) {
        match item {
            "allow_other" => parsed.allow_other = true,
            "default_permissions" => parsed.default_permissions = true,
            "ro" => parsed.read_only = true,
            "rw" => parsed.read_only = false,
            "remount" => parsed.remount = true,
            "dev" => parsed.dev = true,
            "suid" => parsed.suid = true,
            "noexec" => parsed.no_exec = true,
            "noatime" => parsed.no_atime = true,
            "strictatime" => {
                parsed.strict_atime = true;
                parsed.no_atime = false;
            }
            _ if IGNORED_OPTIONS.contains(&item) => {
                // `nodev`, `nosuid`, `exec`, `atime` and `relatime` undo an earlier opposite.
                match item {
                    "nodev" => parsed.dev = false,
                    "nosuid" => parsed.suid = false,
                    "exec" => parsed.no_exec = false,
                    "atime" | "relatime" => {
                        parsed.no_atime = false;
                        parsed.strict_atime = false;
                    }
                    _ => {}
                }
            }
            _ if item.starts_with("x-") || item.starts_with("comment=") => {}
            // What the kernel shows for a FUSE mount, which mount(8) hands back on a remount.
            _ if KERNEL_FUSE_OPTIONS.iter().any(|prefix| item.starts_with(prefix)) => {}
            _ => match item.split_once('=') {
                Some(("threads", count)) => {
                    parsed.threads =
                        count.parse().ok().filter(|&value: &usize| (1..=1024).contains(&value)).ok_or_else(|| {
                            CliError::new(format!("-o threads={count}: expected a whole number from 1 to 1024"))
                        })?;
                }
                Some(("poll_us", value)) => {
                    parsed.poll_microseconds =
                        Some(at_most("poll_us", value, crate::fuse_api::POLL_MICROSECONDS_MAX, "microseconds")?);
                }
                Some(("read_ahead_kb", value)) => {
                    parsed.read_ahead_kib =
                        Some(at_most("read_ahead_kb", value, crate::fuse_api::READ_AHEAD_KIB_MAX, "KiB")?);
                }
                Some(("uring_move_min_bytes", value)) => {
                    parsed.uring_move_min_bytes =
                        Some(at_most("uring_move_min_bytes", value, URING_MOVE_MIN_BYTES_MAX, "bytes")?);
                }
                Some(("transport", name)) => {
                    parsed.transport =
                        Some(name.parse().map_err(|why| CliError::new(format!("-o transport={name}: {why}")))?);
                }
                Some(("backend_workers", count)) => {
                    let most = tandemfs::backend::parallel::WORKERS_MAX;
                    parsed.backend_workers =
                        count.parse().ok().filter(|value: &usize| (1..=most).contains(value)).ok_or_else(|| {
                            CliError::new(format!(
                                "-o backend_workers={count}: expected a whole number from 1 to {most}"
                            ))
                        })?;
                }
                Some(("checkpoint_interval_ms", value)) => {
                    use tandemfs::fs::types::{CHECKPOINT_INTERVAL_MS_MAX, CHECKPOINT_INTERVAL_MS_MIN};
                    let range = CHECKPOINT_INTERVAL_MS_MIN..=CHECKPOINT_INTERVAL_MS_MAX;
                    parsed.checkpoint_interval_ms =
                        Some(value.parse().ok().filter(|value| range.contains(value)).ok_or_else(|| {
                            CliError::new(format!(
                                "-o checkpoint_interval_ms={value}: expected milliseconds from {} to {}",
                                range.start(),
                                range.end()
                            ))
                        })?);
                }
                Some(("direct_write_min_bytes", value)) => {
                    parsed.direct_write_min_bytes = Some(value.parse().map_err(|_| {
                        CliError::new(format!(
                            "-o direct_write_min_bytes={value}: expected a whole number of bytes (0: every write through the log)"
                        ))
                    })?);
                }
                Some(("direct_write_overlap_min_bytes", value)) => {
                    parsed.direct_write_overlap_min_bytes = Some(value.parse().map_err(|_| {
                        CliError::new(format!(
                            "-o direct_write_overlap_min_bytes={value}: expected a whole number of bytes (0: never)"
                        ))
                    })?);
                }
                Some(("backlog_image_logs", value)) => {
                    let range = 1..=tandemfs::fs::types::BACKLOG_IMAGE_LOGS_MAX;
                    parsed.backlog_image_logs =
                        Some(value.parse().ok().filter(|count| range.contains(count)).ok_or_else(|| {
                            CliError::new(format!(
                                "-o backlog_image_logs={value}: expected a whole number from 1 to {}",
                                range.end()
                            ))
                        })?);
                }
                Some(("compact_factor", value)) => {
                    parsed.compact_factor =
                        Some(value.parse().ok().filter(|factor: &f64| *factor == 0.0 || (*factor >= 1.0 && factor.is_finite())).ok_or_else(|| {
                            CliError::new(format!(
                                "-o compact_factor={value}: expected 0 (no background compaction) or a number of at least 1"
                            ))
                        })?);
                }
                Some(("mmp_interval_ms", value)) => {
                    let range = tandemfs::block::mmp::MIN_INTERVAL_MS..=tandemfs::block::mmp::MAX_INTERVAL_MS;
                    parsed.mmp_interval_ms =
                        Some(value.parse().ok().filter(|value| range.contains(value)).ok_or_else(|| {
                            CliError::new(format!(
                                "-o mmp_interval_ms={value}: expected milliseconds from {} to {}",
                                range.start(),
                                range.end()
                            ))
                        })?);
                }
                Some(("key_file", path)) if !path.is_empty() => parsed.key_file = Some(PathBuf::from(path)),
                _ => return Err(CliError::new(format!("unknown mount option '{item}' (known: {KNOWN_OPTIONS})"))),
            },
        }
    }
    Ok(parsed)
}

/// `dev` and `suid` let files on the volume act as devices and set-id programs: the kernel
/// allows it to root only, and saying so here beats its EPERM.
fn check_privileged_options(options: &ParsedOptions) -> CliResult<()> {
    // SAFETY: geteuid has no arguments and cannot fail.
    if (options.dev || options.suid) && unsafe { libc::geteuid() } != 0 {
        return Err(CliError::new("-o dev and -o suid need root: a FUSE mount by another user is always nodev,nosuid"));
    }
    Ok(())
}

/// Checks that the mount point is an existing directory and returns its canonical form (the form
/// mountinfo uses).
fn canonical_mountpoint(path: &Path) -> CliResult<PathBuf> {
    let canonical = std::fs::canonicalize(path).map_err(|error| {
        if error.kind() == std::io::ErrorKind::NotFound {
            CliError::new(format!("mount point {} does not exist (create it with mkdir)", path.display()))
        } else {
            CliError::new(format!("cannot use mount point {}: {error}", path.display()))
        }
    })?;
    if !canonical.is_dir() {
        return Err(CliError::new(format!("mount point {} is not a directory", path.display())));
    }
    Ok(canonical)
}

/// FUSE needs /dev/fuse; say so plainly instead of failing deep in the adapter.
pub fn require_fuse() -> CliResult<()> {
    if Path::new("/dev/fuse").exists() {
        Ok(())
    } else {
        Err(CliError::new(
            "FUSE is not available: /dev/fuse is missing (install fuse3 and load the fuse module with 'modprobe fuse')",
        ))
    }
}

/// Directory for the default logs of background mounts: /run/tandem as root, else per user.
pub fn runtime_directory() -> PathBuf {
    // SAFETY: geteuid has no arguments and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let directory = if uid == 0 {
        PathBuf::from("/run/tandem")
    } else if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(runtime).join("tandem")
    } else {
        std::env::temp_dir().join(format!("tandem-{uid}"))
    };
    let _ = std::fs::create_dir_all(&directory);
    directory
}

/// A stable short name for a mount point (FNV-1a of its canonical path): file names must not
/// depend on how long or odd the path is.
fn mountpoint_key(mountpoint: &Path) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in mountpoint.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// Where a background mount writes its messages unless `--log-file` says otherwise.
fn default_log_path(mountpoint: &Path) -> PathBuf {
    runtime_directory().join(format!("mount-{}.log", mountpoint_key(mountpoint)))
}

/// Prints what mount found, in the words the README promises.
pub fn describe_report(report: &MountReport) {
    if let Some(warning) = &report.superblock_warning {
        println!("warning: {warning}");
    }
    if let Some(reason) = &report.forced_read_only {
        println!("{reason}: mounting read-only");
    }
    if let Some(owner) = &report.mmp_taken_over_from {
        println!("took the volume over from {owner}, which stopped without unmounting");
    }
    if let (Some(version), true) = (report.format_upgraded_from, report.read_only) {
        println!("format version {version}: read as it is (a read-write mount takes it forward)");
    } else if let Some(version) = report.format_upgraded_from {
        println!(
            "format version {version} taken forward to {}: a tandem older than this one no longer mounts the volume",
            tandemfs::block::superblock::FORMAT_VERSION
        );
    }
    if report.was_dirty {
        println!("the volume was not unmounted cleanly; recovering from the log");
    }
    if report.replayed_in_memory {
        println!(
            "replayed {} log records in memory only (read-only mount: the volume is not changed; a read-write mount replays them on disk)",
            format_count(report.records_replayed)
        );
    } else if report.records_replayed > 0 {
        println!("replayed {} log records", format_count(report.records_replayed));
    }
    if report.checkpoint_completed {
        println!("completed an interrupted checkpoint");
    }
    if report.orphans_reclaimed > 0 {
        println!("reclaimed {} orphan inodes", format_count(report.orphans_reclaimed));
    }
}

/// Opens and mounts the engine on `image` with the default options.
pub fn open_volume(image_path: &Path) -> CliResult<(FileSystem, MountReport)> {
    open_volume_with(image_path, &ParsedOptions::default())
}

/// Opens and mounts the engine on `image`: the shared first half of every mount. A medium that
/// refuses writes (no write permission, an immutable file, a read-only device or file system)
/// is opened read-only, and the engine then mounts it read-only and says so in its report.
pub fn open_volume_with(image_path: &Path, options: &ParsedOptions) -> CliResult<(FileSystem, MountReport)> {
    let device = open_medium(image_path)?;
    // An encrypted volume is unlocked before the mount writes anything (its MMP stamp).
    let device = crate::secret::unlock(image_path, device, options.key_file.as_deref())?;
    let access_time = match (options.no_atime, options.strict_atime) {
        (true, _) => AccessTimeUpdates::Never,
        (false, true) => AccessTimeUpdates::Strict,
        (false, false) => AccessTimeUpdates::Relative,
    };
    let mount_options = MountOptions {
        read_only: options.read_only,
        mmp_interval_ms: options.mmp_interval_ms,
        access_time,
        backend_workers: options.backend_workers,
        checkpoint_interval_ms: options
            .checkpoint_interval_ms
            .unwrap_or(tandemfs::fs::types::CHECKPOINT_INTERVAL_MS_DEFAULT),
        direct_write_min_bytes: options
            .direct_write_min_bytes
            .unwrap_or(tandemfs::fs::types::DIRECT_WRITE_MIN_BYTES_DEFAULT),
        direct_write_overlap_min_bytes: options
            .direct_write_overlap_min_bytes
            .unwrap_or(tandemfs::fs::types::DIRECT_WRITE_OVERLAP_MIN_BYTES_DEFAULT),
        backlog_image_logs: options.backlog_image_logs.unwrap_or(tandemfs::log::BACKLOG_CHECKPOINTS),
        background_compact_factor: options
            .compact_factor
            .unwrap_or(tandemfs::fs::types::BACKGROUND_COMPACT_FACTOR_DEFAULT),
        ..MountOptions::default()
    };
    FileSystem::mount(device, &mount_options).map_err(|error| match error {
        tandemfs::Error::InUse(words) => CliError::new(format!("cannot mount {}: {words}", image_path.display())),
        other => CliError::new(format!("cannot mount the volume on {}: {other}", image_path.display())),
    })
}

/// The image opened for writing, or read-only when the medium refuses writes. Either way it
/// holds the exclusive lock, the fast first check against a second mount of the same path.
fn open_medium(image_path: &Path) -> CliResult<std::sync::Arc<dyn tandemfs::device::Device>> {
    // An array's members (a list, or one member): docs/RAID.md.
    if crate::array::names_array(image_path) {
        crate::array::check_paths(image_path)?;
        let array = crate::array::open(image_path, Access::WRITE)?;
        // `tandem status` shows the mounted array's counters from this.
        crate::array::publish_live(&array);
        // `tandem rebuild` reaches the mount through this.
        crate::control::serve(&array);
        return Ok(array);
    }
    image::check_image_path(image_path)?;
    let writable =
        tandemfs::device::FileDeviceOptions { create_size_bytes: None, lock_exclusive: true, read_only: false };
    match tandemfs::device::FileDevice::open(image_path, writable) {
        Ok(device) => Ok(std::sync::Arc::new(device)),
        // EACCES and EPERM (an immutable file) are both PermissionDenied; EROFS is its own.
        Err(tandemfs::Error::Io { source, .. })
            if matches!(
                source.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            Ok(image::open(image_path, Access::CHECK)?)
        }
        // The shared opener words every other failure (missing, locked by a mount, ...).
        Err(_) => Ok(image::open(image_path, Access::WRITE)?),
    }
}

/// The adapter's configuration: its defaults (kernel permission checks on, a thread per core up
/// to its limit) with what `-o` asked for on top.
pub fn mount_config(options: &ParsedOptions, image: &Path) -> MountConfig {
    let defaults = MountConfig::default();
    MountConfig {
        allow_other: options.allow_other,
        default_permissions: options.default_permissions || defaults.default_permissions,
        threads: if options.threads == 0 { defaults.threads } else { options.threads },
        read_only: options.read_only,
        dev: options.dev,
        suid: options.suid,
        no_exec: options.no_exec,
        no_atime: options.no_atime,
        volume_name: image.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or(defaults.volume_name),
        transport: options.transport.unwrap_or(defaults.transport),
        uring_entries_per_queue: defaults.uring_entries_per_queue,
        uring_move_min_bytes: options.uring_move_min_bytes.unwrap_or(defaults.uring_move_min_bytes),
        poll_microseconds: options.poll_microseconds.unwrap_or(defaults.poll_microseconds),
        read_ahead_kib: options.read_ahead_kib.unwrap_or(defaults.read_ahead_kib),
    }
}

/// The environment variable that picks the FUSE transport when `-o transport=` does not (the
/// mount suite runs whole on one transport with it, fstab and helper mounts included).
const TRANSPORT_VARIABLE: &str = "TANDEM_FUSE_TRANSPORT";

pub fn run_mount(arguments: MountArguments) -> CliResult<i32> {
    let mut options = parse_options(&arguments.options)?;
    if options.transport.is_none() {
        if let Ok(name) = std::env::var(TRANSPORT_VARIABLE) {
            options.transport =
                Some(name.parse().map_err(|why| CliError::new(format!("{TRANSPORT_VARIABLE}={name}: {why}")))?);
        }
    }
    if arguments.key_file.is_some() {
        options.key_file = arguments.key_file.clone();
    }
    check_privileged_options(&options)?;
    let mountpoint = canonical_mountpoint(&arguments.mountpoint)?;
    if options.remount {
        return run_remount(&mountpoint, options.read_only);
    }
    crate::array::check_paths(&arguments.image)?;
    require_fuse()?;
    if arguments.daemon {
        run_daemon_parent(&arguments, &mountpoint, &options)
    } else {
        run_foreground(&arguments.image, &mountpoint, &options)
    }
}

/// `-o remount,ro` and `-o remount,rw` on a mounted volume.
fn run_remount(mountpoint: &Path, read_only: bool) -> CliResult<i32> {
    fuse_api::remount(mountpoint, read_only)
        .map_err(|error| CliError::new(format!("cannot remount {}: {error}", mountpoint.display())))?;
    println!("remounted {} {}", mountpoint.display(), if read_only { "read-only" } else { "read-write" });
    Ok(EXIT_SUCCESS)
}

fn run_foreground(image_path: &Path, mountpoint: &Path, options: &ParsedOptions) -> CliResult<i32> {
    let (fs, report) = open_volume_with(image_path, options)?;
    describe_report(&report);
    // A medium that refuses writes makes the mount read-only whatever -o said.
    let options = &ParsedOptions { read_only: report.read_only, ..options.clone() };
    // The adapter reports nothing between "mounted" and "unmounted", so say what is about to
    // happen rather than claim it already has.
    let stop_hint = if std::env::var_os(BACKGROUND_CHILD_VARIABLE).is_some() {
        String::new()
    } else {
        format!("; stop with Ctrl-C or 'tandem umount {}'", mountpoint.display())
    };
    println!(
        "serving {} on {}{}{stop_hint}",
        image_path.display(),
        mountpoint.display(),
        if options.read_only { " read-only" } else { "" }
    );
    let _ = std::io::stdout().flush();
    crate::control::set_mountpoint(mountpoint);
    let served = fuse_api::mount_foreground(fs.clone(), mountpoint, &mount_config(options, image_path));
    // A rebuild running in this mount stops first (the array as it was before it), so that
    // nothing holds the array past the close below.
    crate::control::stop();
    // Whatever ended the mount (umount, a signal, an error), flush and close the volume so it is
    // clean on disk before this process lets go of its lock.
    let closed = fs.unmount();
    // An array under the volume is closed here, not when its last holder lets go.
    let closed = closed.and_then(|()| crate::array::close_mounted());
    crate::array::stop_live();
    if let Err(error) = served {
        return Err(CliError::new(format!("cannot mount on {}: {error}", mountpoint.display())));
    }
    closed.map_err(|error| {
        CliError::new(format!("cannot close the volume on {} cleanly: {error}", image_path.display()))
    })?;
    println!("unmounted {}; volume flushed and clean", mountpoint.display());
    Ok(EXIT_SUCCESS)
}

/// The passphrase a background mount's child needs: only for an encrypted volume given no key
/// file, asked on this terminal.
fn passphrase_for_child(image_path: &Path, options: &ParsedOptions) -> CliResult<Option<zeroize::Zeroizing<String>>> {
    if options.key_file.is_some() {
        return Ok(None);
    }
    let device = if crate::array::names_array(image_path) {
        // An array (encrypted ones are made with mkfs --devices --encrypt) is looked at through
        // its members without a lock; one that cannot be assembled to look at (dirty and
        // degraded) is left to the child, which assembles it writable and says what is wrong.
        match crate::array::open_volume_device(image_path, Access::LOOK) {
            Ok(device) => device,
            Err(_) => return Ok(None),
        }
    } else {
        image::open(image_path, Access::LOOK)?
    };
    match tandemfs::crypt::is_encrypted(device.as_ref()) {
        Ok(true) if std::io::stdin().is_terminal() => Ok(Some(crate::secret::prompt_once(image_path)?)),
        Ok(true) => {
            Err(CliError::new(format!("{} is encrypted: give --key-file FILE or its passphrase", image_path.display())))
        }
        // A plain volume, or one the child will describe better.
        _ => Ok(None),
    }
}

fn run_daemon_parent(arguments: &MountArguments, mountpoint: &Path, options: &ParsedOptions) -> CliResult<i32> {
    let log_path = arguments.log_file.clone().unwrap_or_else(|| default_log_path(mountpoint));
    // Append, never truncate: a second attempt on the same mount point must not wipe the log of
    // the mount that is already running there. Only what this child writes is shown.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|error| CliError::new(format!("cannot open log file {}: {error}", log_path.display())))?;
    let log_start = log.metadata().map(|metadata| metadata.len()).unwrap_or(0);
    let read_new_log = || {
        let bytes = std::fs::read(&log_path).unwrap_or_default();
        String::from_utf8_lossy(bytes.get(log_start as usize..).unwrap_or_default()).into_owned()
    };
    let log_for_errors = log
        .try_clone()
        .map_err(|error| CliError::new(format!("cannot use log file {}: {error}", log_path.display())))?;
    let executable = std::env::current_exe().map_err(|error| {
        CliError::new(format!("cannot find the tandem executable to run in the background: {error}"))
    })?;
    let mounts_before = mountinfo::fuse_mounts_at(mountpoint);

    let mut command = Command::new(executable);
    command.arg("mount").arg(&arguments.image).arg(mountpoint);
    for list in &arguments.options {
        command.arg("-o").arg(list);
    }
    if let Some(key_file) = &options.key_file {
        command.arg("--key-file").arg(key_file);
    }
    // The child has no terminal: an encrypted volume's passphrase is asked here and handed to
    // it through a pipe on its standard input (never an argument or the environment, which
    // other users can read).
    let passphrase = passphrase_for_child(&arguments.image, options)?;
    let stdin = if passphrase.is_some() { Stdio::piped() } else { Stdio::null() };
    if passphrase.is_some() {
        command.env(crate::secret::PASSPHRASE_ON_STDIN_VARIABLE, "1");
    }
    command.stdin(stdin).stdout(log).stderr(log_for_errors).env(BACKGROUND_CHILD_VARIABLE, "1");
    // SAFETY: setsid is async-signal-safe and touches no memory of ours; it detaches the child
    // from our terminal so closing the shell does not send it SIGHUP.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child =
        command.spawn().map_err(|error| CliError::new(format!("cannot start the background mount: {error}")))?;
    if let (Some(passphrase), Some(mut pipe)) = (passphrase, child.stdin.take()) {
        let mut line = zeroize::Zeroizing::new(passphrase.as_bytes().to_vec());
        line.push(b'\n');
        // A failed write leaves the child without a passphrase: it says so in its log and exits.
        let _ = pipe.write_all(&line);
    }

    let started = Instant::now();
    let patience = Duration::from_secs(600);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            for line in read_new_log().lines() {
                eprintln!("{line}");
            }
            let code = status.code().unwrap_or(EXIT_FAILURE);
            return Err(CliError::with_code(
                format!("the background mount exited before mounting ({status}); log: {}", log_path.display()),
                if code == 0 { EXIT_FAILURE } else { code },
            ));
        }
        if mountinfo::fuse_mounts_at(mountpoint) > mounts_before {
            for line in read_new_log().lines() {
                println!("{line}");
            }
            println!(
                "mounted {} on {} in the background (process {}, log {}); stop it with 'tandem umount {}'",
                arguments.image.display(),
                mountpoint.display(),
                child.id(),
                log_path.display(),
                mountpoint.display()
            );
            return Ok(EXIT_SUCCESS);
        }
        if started.elapsed() > patience {
            return Err(CliError::new(format!(
                "the mount did not appear within {} s; process {} is still starting (log: {})",
                patience.as_secs(),
                child.id(),
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The names under which `tandem` acts as mount(8)'s helper: mount(8) runs
/// `/sbin/mount.fuse.tandemfs SOURCE MOUNTPOINT [-sfnvrw] [-o OPTIONS]` for `-t fuse.tandemfs`
/// and for fstab lines of that type.
pub const HELPER_NAMES: [&str; 2] = ["mount.fuse.tandemfs", "mount.tandemfs"];

/// mount(8)'s helper calling convention, mapped onto `tandem mount -d` (or a remount). The
/// flags mount(8) may add: `-s` (sloppy: unknown options ignored), `-f` (fake: check and do
/// nothing), `-n` (no mtab), `-v` (verbose), `-r` / `-w` (ro / rw), `-t TYPE`, `-N NAMESPACE`
/// (refused: not supported).
pub fn run_helper(arguments: &[String]) -> CliResult<i32> {
    let mut positional = Vec::new();
    let mut lists = Vec::new();
    let mut sloppy = false;
    let mut fake = false;
    let mut index = 0;
    while index < arguments.len() {
        let argument = arguments[index].as_str();
        let value = |index: usize| {
            arguments.get(index + 1).cloned().ok_or_else(|| CliError::new(format!("{argument} needs a value")))
        };
        match argument {
            "-o" => {
                lists.push(value(index)?);
                index += 1;
            }
            "-t" => index += 1,
            "-N" => return Err(CliError::new("-N (mount namespaces) is not supported by the tandemfs mount helper")),
            "-s" => sloppy = true,
            "-f" => fake = true,
            "-n" | "-v" => {}
            "-r" => lists.push("ro".into()),
            "-w" => lists.push("rw".into()),
            _ if argument.starts_with("-o") && argument.len() > 2 => lists.push(argument[2..].to_string()),
            _ if argument.starts_with('-') => return Err(CliError::new(format!("unknown helper flag {argument}"))),
            _ => positional.push(argument.to_string()),
        }
        index += 1;
    }
    let [source, mountpoint] = positional.as_slice() else {
        return Err(CliError::new("usage: mount.fuse.tandemfs IMAGE MOUNTPOINT [-o OPTIONS]"));
    };
    if sloppy {
        // Sloppy: drop what this mount does not know instead of refusing it.
        lists = lists
            .iter()
            .map(|list| {
                list.split(',').filter(|item| parse_options(&[item.to_string()]).is_ok()).collect::<Vec<_>>().join(",")
            })
            .collect();
    }
    let options = parse_options(&lists)?;
    if fake {
        return Ok(EXIT_SUCCESS);
    }
    run_mount(MountArguments {
        image: PathBuf::from(source),
        mountpoint: PathBuf::from(mountpoint),
        daemon: !options.remount,
        options: lists,
        log_file: None,
        key_file: None,
    })
}

pub fn run_umount(arguments: UmountArguments) -> CliResult<i32> {
    // A mount whose process died answers "transport endpoint is not connected" to every lookup,
    // so canonicalize can fail exactly when umount is needed most: fall back to the plain path.
    let mountpoint = match std::fs::canonicalize(&arguments.mountpoint) {
        Ok(path) => path,
        Err(_) => std::path::absolute(&arguments.mountpoint).map_err(|error| {
            CliError::new(format!("cannot use mount point {}: {error}", arguments.mountpoint.display()))
        })?,
    };
    match mountinfo::mount_at(&mountpoint) {
        None => return Err(CliError::new(format!("{} is not a mount point", mountpoint.display()))),
        Some(entry) if !entry.is_fuse() => {
            return Err(CliError::new(format!(
                "{} is a {} mount, not tandemfs; use umount(8) for it",
                mountpoint.display(),
                entry.file_system_type
            )))
        }
        Some(_) => {}
    }
    // The adapter's unmount also waits until the serving process has flushed the volume and
    // exited, so fsck or a new mount can follow this command at once.
    fuse_api::unmount(&mountpoint)
        .map_err(|error| CliError::new(format!("cannot unmount {}: {error}", mountpoint.display())))?;
    println!("unmounted {}", mountpoint.display());
    Ok(EXIT_SUCCESS)
}

/// The value of `-o NAME=VALUE` as a whole number from 0 to `most` (`unit` names it in the
/// one-line error).
fn at_most<T>(name: &str, value: &str, most: T, unit: &str) -> Result<T, CliError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    value
        .parse()
        .ok()
        .filter(|parsed: &T| *parsed <= most)
        .ok_or_else(|| CliError::new(format!("-o {name}={value}: expected {unit} from 0 to {most}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_reject() {
        let parsed = parse_options(&["allow_other,ro".into(), "threads=4".into()]).unwrap();
        assert_eq!(
            parsed,
            ParsedOptions { allow_other: true, read_only: true, threads: 4, ..ParsedOptions::default() }
        );
        let from_fstab = parse_options(&["rw,noauto,user,_netdev,nofail,x-systemd.automount,dev,suid".into()]).unwrap();
        assert!(from_fstab.dev && from_fstab.suid && !from_fstab.read_only);
        let remount = parse_options(&["remount,ro,mmp_interval_ms=500".into()]).unwrap();
        assert!(remount.remount && remount.read_only && remount.mmp_interval_ms == Some(500));
        assert!(parse_options(&["mmp_interval_ms=1".into()]).is_err());
        assert_eq!(parse_options(&["backend_workers=3".into()]).unwrap().backend_workers, 3);
        assert_eq!(parse_options(&["checkpoint_interval_ms=250".into()]).unwrap().checkpoint_interval_ms, Some(250));
        for wrong in ["checkpoint_interval_ms=0", "checkpoint_interval_ms=3600001", "checkpoint_interval_ms=x"] {
            let error = parse_options(&[wrong.into()]).unwrap_err().to_string();
            assert!(error.contains("expected milliseconds from 1 to 3600000"), "{wrong}: {error}");
        }
        for wrong in ["backend_workers=0", "backend_workers=65", "backend_workers=x"] {
            let error = parse_options(&[wrong.into()]).unwrap_err().to_string();
            assert!(error.contains("expected a whole number from 1 to 64"), "{wrong}: {error}");
        }
        assert_eq!(parse_options(&["direct_write_min_bytes=0".into()]).unwrap().direct_write_min_bytes, Some(0));
        assert_eq!(parse_options(&["backlog_image_logs=64".into()]).unwrap().backlog_image_logs, Some(64));
        assert_eq!(parse_options(&["compact_factor=1.5".into()]).unwrap().compact_factor, Some(1.5));
        assert_eq!(parse_options(&["compact_factor=0".into()]).unwrap().compact_factor, Some(0.0));
        for wrong in
            ["compact_factor=0.5", "compact_factor=-1", "compact_factor=inf", "compact_factor=NaN", "compact_factor=x"]
        {
            assert!(parse_options(&[wrong.into()]).is_err(), "{wrong}");
        }
        for wrong in ["backlog_image_logs=0", "backlog_image_logs=1025", "backlog_image_logs=many"] {
            let error = parse_options(&[wrong.into()]).unwrap_err().to_string();
            assert!(error.contains("expected a whole number from 1 to 1024"), "{wrong}: {error}");
        }
        assert_eq!(
            parse_options(&["direct_write_min_bytes=1048576".into()]).unwrap().direct_write_min_bytes,
            Some(1 << 20)
        );
        assert!(parse_options(&["direct_write_min_bytes=-1".into()]).is_err());
        assert_eq!(
            parse_options(&["direct_write_overlap_min_bytes=0".into()]).unwrap().direct_write_overlap_min_bytes,
            Some(0)
        );
        assert!(parse_options(&["direct_write_overlap_min_bytes=x".into()]).is_err());
        assert!(parse_options(&["nosuch".into()]).is_err());
        assert!(parse_options(&["threads=0".into()]).is_err());
        assert!(parse_options(&["threads=x".into()]).is_err());
        assert_eq!(parse_options(&["poll_us=50".into()]).unwrap().poll_microseconds, Some(50));
        assert_eq!(mount_config(&parse_options(&["poll_us=0".into()]).unwrap(), Path::new("i")).poll_microseconds, 0);
        // Unset: the adapter's default for this machine's cores.
        assert_eq!(
            mount_config(&parse_options(&[]).unwrap(), Path::new("i")).poll_microseconds,
            MountConfig::default().poll_microseconds
        );
        assert_eq!(mount_config(&parse_options(&["poll_us=50".into()]).unwrap(), Path::new("i")).poll_microseconds, 50);
        for wrong in ["poll_us=10001", "poll_us=-1", "poll_us=x"] {
            let error = parse_options(&[wrong.into()]).unwrap_err().to_string();
            assert!(error.contains("expected microseconds from 0 to 10000"), "{wrong}: {error}");
        }
        assert_eq!(
            mount_config(&parse_options(&["read_ahead_kb=0".into()]).unwrap(), Path::new("i")).read_ahead_kib,
            0
        );
        assert_eq!(
            mount_config(&parse_options(&[]).unwrap(), Path::new("i")).read_ahead_kib,
            MountConfig::default().read_ahead_kib
        );
        for wrong in ["read_ahead_kb=65537", "read_ahead_kb=-1", "read_ahead_kb=x"] {
            let error = parse_options(&[wrong.into()]).unwrap_err().to_string();
            assert!(error.contains("expected KiB from 0 to 65536"), "{wrong}: {error}");
        }
        assert_eq!(
            parse_options(&["transport=uring".into()]).unwrap().transport,
            Some(crate::fuse_api::FuseTransport::Uring)
        );
        assert!(parse_options(&["transport=pigeon".into()]).is_err());
        assert_eq!(
            mount_config(&parse_options(&["uring_move_min_bytes=0".into()]).unwrap(), Path::new("i"))
                .uring_move_min_bytes,
            0
        );
        assert_eq!(
            mount_config(&parse_options(&[]).unwrap(), Path::new("i")).uring_move_min_bytes,
            MountConfig::default().uring_move_min_bytes
        );
        for wrong in ["uring_move_min_bytes=1048577", "uring_move_min_bytes=x"] {
            let error = parse_options(&[wrong.into()]).unwrap_err().to_string();
            assert!(error.contains("expected bytes from 0 to 1048576"), "{wrong}: {error}");
        }
        assert_eq!(parse_options(&[]).unwrap(), ParsedOptions::default());
    }

    #[test]
    fn helper_refuses_bad_calls_before_touching_anything() {
        assert!(run_helper(&["only-one".into()]).is_err());
        assert!(run_helper(&["a".into(), "b".into(), "-o".into()]).is_err());
        assert!(run_helper(&["a".into(), "b".into(), "-o".into(), "nosuch".into()]).is_err());
        assert!(run_helper(&["a".into(), "b".into(), "-N".into(), "x".into()]).is_err());
        // Fake mode checks the options and stops; sloppy drops the unknown one.
        let fake = ["img", "dir", "-f", "-s", "-o", "rw,nosuch,noauto"].map(String::from);
        assert_eq!(run_helper(&fake).unwrap(), EXIT_SUCCESS);
    }

    #[test]
    fn keys_are_stable_and_distinct() {
        assert_eq!(mountpoint_key(Path::new("/mnt/a")), mountpoint_key(Path::new("/mnt/a")));
        assert_ne!(mountpoint_key(Path::new("/mnt/a")), mountpoint_key(Path::new("/mnt/b")));
    }
}
