//! Mounting and unmounting: the API the `tandem` command calls.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::{INodeNo, MountOption, Notifier, Session, SessionACL};
use tandemfs::fs::{FileSystem, InodeNumber};

use crate::adapter::{Adapter, MAX_REQUEST_BYTES};
use crate::counters::{RequestCounters, RequestCounts};
use crate::uring::queue::{QueueShape, Queues};
use crate::uring::{self, FuseTransport, TransportReport};

/// The file system type shown in /proc/mounts is `fuse.` followed by this.
const SUBTYPE: &str = "tandemfs";

/// How long [`unmount`] waits for the serving process to finish writing after the kernel
/// let go of the mount.
const SERVER_EXIT_WAIT: Duration = Duration::from_secs(120);

/// Read-ahead of a mount by default (`MountConfig::read_ahead_kib`), set through its backing
/// device info in sysfs. The kernel starts a FUSE mount at 128 KiB (and offers no more in
/// INIT), so a sequential reader pays one round trip per 128 KiB. The kernel splits a window
/// into requests of at most 1 MiB (256 pages) and sends them together as background requests:
/// at 1 MiB one sequential reader had at most 2 READs in flight, so at most 2 workers copied
/// for it; at 8 MiB up to 16 (docs/FUSE.md, "Sequential write and read"), enough for every
/// worker (`threads` is at most 8 by default) to copy a request of its own. Sequential
/// detection ramps the window up from a few pages, so small random reads are not made larger.
pub const READ_AHEAD_KIB_DEFAULT: u32 = 8192;

/// The largest `MountConfig::read_ahead_kib` taken: 64 MiB of page cache per reader's window.
pub const READ_AHEAD_KIB_MAX: u32 = 65536;

/// How a volume is mounted.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Let users other than the one who mounted use the mount (needs `user_allow_other` in
    /// /etc/fuse.conf when the mounting user is not root).
    pub allow_other: bool,
    /// Let the kernel check permission bits (recommended; see docs/FUSE.md).
    pub default_permissions: bool,
    /// FUSE worker threads; at least 2 are used (see docs/FUSE.md).
    pub threads: usize,
    pub read_only: bool,
    /// Honour device files (`dev`) and set-user/group-id bits (`suid`). FUSE mounts are
    /// `nodev,nosuid` unless asked; only root may ask (the kernel refuses others).
    pub dev: bool,
    pub suid: bool,
    /// `noexec` and `noatime`, as for any mount.
    pub no_exec: bool,
    pub no_atime: bool,
    /// The "source" column of /proc/mounts.
    pub volume_name: String,
    /// How requests travel: only /dev/fuse (`DevFuse`, the default: io_uring halved one
    /// reader's sequential reads on the 16-core host), io_uring where allowed (`Auto`), or only
    /// io_uring (docs/FUSE.md, "Transports").
    pub transport: FuseTransport,
    /// io_uring entries (each with its own thread) per CPU queue; at least 2 (see
    /// `uring::queue` for why).
    pub uring_entries_per_queue: usize,
    /// Over io_uring: READ requests of at least this many bytes are served off the
    /// CPU of the queue they arrived on (docs/FUSE.md, "Transports"); 0: all on their queue's
    /// CPU. Default [`URING_MOVE_MIN_BYTES_DEFAULT`].
    pub uring_move_min_bytes: usize,
    /// Over /dev/fuse: microseconds one worker keeps polling /dev/fuse without sleeping after
    /// it last found a request (at most `POLL_MICROSECONDS_MAX`); 0: every worker sleeps in
    /// read(2). The default is `default_poll_microseconds` of the machine's cores.
    /// docs/FUSE.md, "Polling worker", says what it costs and buys.
    pub poll_microseconds: u64,
    /// Read-ahead of the mount in KiB (root only: it is written to sysfs), at most
    /// [`READ_AHEAD_KIB_MAX`]; 0 leaves the kernel's 128 KiB. Default
    /// [`READ_AHEAD_KIB_DEFAULT`].
    pub read_ahead_kib: u32,
}

/// Requests of this many bytes or more leave their io_uring queue's CPU by default: a
/// read-ahead request of one sequential reader grows to 1 MiB, while a 4 KiB read or a stat
/// stays beside its caller.
pub const URING_MOVE_MIN_BYTES_DEFAULT: usize = 128 * 1024;

/// The longest `MountConfig::poll_microseconds` taken: a poller is meant to bridge the gap
/// between one caller's requests, not to hold a core while the mount is idle.
pub const POLL_MICROSECONDS_MAX: u64 = 10_000;

/// Cores from which a mount polls by default: the poller's core must be one the callers and
/// the back end can spare. On the 2-core VM polling lost (creates 100–245 µs against 57–213);
/// on the 16-core host it doubled encrypted creates and unlinks (docs/BENCHMARKS.md, session 16).
pub const POLL_CORES_MIN: usize = 8;

/// The poll a mount gets by default where it polls: 50 µs covers the 6–10 µs between one
/// caller's requests many times over, and 200 µs bought no more on the host.
pub const POLL_MICROSECONDS_DEFAULT: u64 = 50;
const _: () = assert!(POLL_MICROSECONDS_DEFAULT <= POLL_MICROSECONDS_MAX);

/// The default `poll_microseconds` on a machine with `cores` cores.
pub fn default_poll_microseconds(cores: usize) -> u64 {
    if cores >= POLL_CORES_MIN {
        POLL_MICROSECONDS_DEFAULT
    } else {
        0
    }
}

impl Default for MountConfig {
    fn default() -> MountConfig {
        let cores = std::thread::available_parallelism().map_or(2, |count| count.get());
        MountConfig {
            allow_other: false,
            default_permissions: true,
            threads: cores.clamp(2, 8),
            read_only: false,
            dev: false,
            suid: false,
            no_exec: false,
            no_atime: false,
            volume_name: "tandemfs".to_string(),
            transport: FuseTransport::DevFuse,
            uring_entries_per_queue: 2,
            uring_move_min_bytes: URING_MOVE_MIN_BYTES_DEFAULT,
            poll_microseconds: default_poll_microseconds(cores),
            read_ahead_kib: READ_AHEAD_KIB_DEFAULT,
        }
    }
}

/// `over_dev_fuse`: requests come through /dev/fuse only (no io_uring asked for), the one case
/// where a polling worker serves them; over io_uring it would only wait for FORGETs.
fn session_config(config: &MountConfig, over_dev_fuse: bool) -> fuser::Config {
    let mut options = vec![
        MountOption::FSName(if config.volume_name.is_empty() {
            SUBTYPE.to_string()
        } else {
            config.volume_name.clone()
        }),
        // Passed as a kernel option so that a direct mount by root records the type
        // `fuse.tandemfs` too (fuser's own Subtype option only reaches fusermount).
        MountOption::CUSTOM(format!("subtype={SUBTYPE}")),
    ];
    if config.default_permissions {
        options.push(MountOption::DefaultPermissions);
    }
    options.push(if config.read_only { MountOption::RO } else { MountOption::RW });
    // fuser adds nodev and nosuid unless these are present.
    if config.dev {
        options.push(MountOption::Dev);
    }
    if config.suid {
        options.push(MountOption::Suid);
    }
    if config.no_exec {
        options.push(MountOption::NoExec);
    }
    if config.no_atime {
        options.push(MountOption::NoAtime);
    }
    let mut session = fuser::Config::default();
    session.mount_options = options;
    session.acl = if config.allow_other { SessionACL::All } else { SessionACL::Owner };
    // A request that invalidates cached pages (insert, collapse) may make the kernel write
    // dirty mmap pages back first, which another worker must serve: never fewer than two.
    session.n_threads = Some(config.threads.max(2));
    session.clone_fd = true;
    assert!(config.poll_microseconds <= POLL_MICROSECONDS_MAX, "poll of {} µs", config.poll_microseconds);
    if over_dev_fuse && config.poll_microseconds > 0 {
        session.spin = Some(Duration::from_micros(config.poll_microseconds));
    }
    session
}

/// Writes log records at warning level and above (or the level in `TANDEM_LOG`: error, warn,
/// info, debug, trace) to standard error, which a background mount sends to its log file.
/// Without it the adapter's error lines (corruption, I/O errors) and fuser's warnings would be
/// lost, since the `log` crate drops records when no logger is installed. An application that
/// installed its own logger keeps it.
struct StandardErrorLogger;

/// The log target of the one line per mount that says which transport serves it and why:
/// written at `info` but shown at the default `warn` level too.
const TRANSPORT_LOG_TARGET: &str = "tandemfs::transport";

/// The level the mount log shows (`TANDEM_LOG`, else warn), apart from the transport line.
static LOG_LEVEL: OnceLock<log::LevelFilter> = OnceLock::new();

impl log::Log for StandardErrorLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= *LOG_LEVEL.get().unwrap_or(&log::LevelFilter::Warn)
            || (metadata.target() == TRANSPORT_LOG_TARGET && metadata.level() <= log::Level::Info)
    }
    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let message = record.args().to_string();
        // When the session ends because the mount went away (umount, `tandem umount`), fuser
        // still tries to unmount on its way out and reports the kernel's EINVAL: the normal
        // end of every mount, not worth a warning in the log.
        if record.target().starts_with("fuser")
            && message.starts_with("Failed to umount filesystem")
            && message.contains("os error 22")
        {
            return;
        }
        // The kernel answers ENOENT to a reply whose request no longer waits: above all
        // fuser's ENOSYS to an INTERRUPT of a request that io_uring served (the kernel looks for
        // it among /dev/fuse's requests only, so it keeps sending interrupts), or of one that
        // completed meanwhile. Nothing is lost; not worth an error line per signal.
        if record.target().starts_with("fuser")
            && message.starts_with("Failed to send FUSE reply")
            && message.contains("os error 2)")
        {
            return;
        }
        eprintln!("[{}] {message}", record.level());
    }
    fn flush(&self) {}
}

fn install_logger() {
    static LOGGER: StandardErrorLogger = StandardErrorLogger;
    if log::set_logger(&LOGGER).is_ok() {
        let level = std::env::var("TANDEM_LOG")
            .ok()
            .and_then(|value| value.parse::<log::LevelFilter>().ok())
            .unwrap_or(log::LevelFilter::Warn);
        let _ = LOG_LEVEL.set(level);
        // Info passes the macros' filter so that the transport line reaches `enabled`, which
        // drops other info records below the chosen level (a few, none per request).
        log::set_max_level(level.max(log::LevelFilter::Info));
    }
}

/// A mounted session and, when io_uring runs, its queues.
struct Serving {
    session: Session<Adapter>,
    queues: Option<Queues>,
    transport: TransportReport,
    notifier: Notifier,
}

/// How long an unmount waits for the io_uring queue threads (they end as soon as the kernel
/// lets go of their entries, which the unmount does).
const QUEUE_STOP_WAIT: Duration = Duration::from_secs(5);

/// `resolved_mountpoint` is the path as /proc/self/mountinfo will show it, resolved before
/// mounting (afterwards resolving it needs the server, which only answers once `run` starts).
fn start_session(
    fs: FileSystem,
    mountpoint: &Path,
    resolved_mountpoint: &Path,
    config: &MountConfig,
    counters: Arc<RequestCounters>,
) -> io::Result<Serving> {
    install_logger();
    let notifier = Arc::new(OnceLock::<Notifier>::new());
    // Whether to ask the kernel for io_uring in INIT; an explicit `uring` that cannot be had
    // fails here, before anything is mounted.
    let uring_wish = match (config.transport, uring::availability()) {
        (FuseTransport::DevFuse, _) => Err(
            "the default (-o transport=auto or uring serves through io_uring where the kernel allows it; docs/FUSE.md)"
                .to_string(),
        ),
        (_, Ok(())) => Ok(Arc::new(AtomicBool::new(false))),
        (FuseTransport::Uring, Err(why)) => return Err(io::Error::other(format!("transport=uring: {why}"))),
        (FuseTransport::Auto, Err(why)) => Err(why),
    };
    let adapter =
        Adapter::new(fs, config.default_permissions, notifier.clone(), counters, uring_wish.as_ref().ok().cloned());
    let second_handle = adapter.second_handle();
    let session = Session::new(adapter, mountpoint, &session_config(config, uring_wish.is_err()))
        .map_err(|error| io::Error::new(error.kind(), format!("mounting {}: {error}", mountpoint.display())))?;
    // `Session::new` has completed the INIT handshake, and the kernel sets the mount's
    // read-ahead while it processes the INIT reply, so this value is not overwritten.
    if config.read_ahead_kib > 0 {
        let kib = config.read_ahead_kib.min(READ_AHEAD_KIB_MAX);
        if let Err(error) = set_read_ahead(resolved_mountpoint, kib) {
            // Only speed depends on it; a non-root mount may not write to sysfs.
            log::info!("tandemfs: read-ahead of {} stays at the kernel's default: {error}", mountpoint.display());
        }
    }
    // Requests are served only once `run` starts, so the notifier is in place before the
    // first one.
    let _ = notifier.set(session.notifier());
    let (queues, transport) = match uring_wish {
        Err(why) => (None, TransportReport { transport: FuseTransport::DevFuse, reason: why }),
        Ok(granted) => match start_queues(&session, second_handle, &granted, config) {
            Ok((queues, reason)) => (Some(queues), TransportReport { transport: FuseTransport::Uring, reason }),
            // Dropping the session unmounts.
            Err(why) if config.transport == FuseTransport::Uring => {
                return Err(io::Error::other(format!("transport=uring: {why}")))
            }
            Err(why) => (None, TransportReport { transport: FuseTransport::DevFuse, reason: why }),
        },
    };
    log::info!(target: TRANSPORT_LOG_TARGET, "tandemfs: {} serves through {transport}", mountpoint.display());
    let notifier = session.notifier();
    Ok(Serving { session, queues, transport, notifier })
}

/// Starts the io_uring queues of a session whose INIT asked for them; the reason for the
/// log, or why io_uring does not run (the caller then serves through /dev/fuse, which the
/// kernel keeps using until every queue has an entry).
fn start_queues(
    session: &Session<Adapter>,
    handle: Adapter,
    granted: &AtomicBool,
    config: &MountConfig,
) -> Result<(Queues, String), String> {
    if !granted.load(Ordering::Acquire) {
        return Err("the kernel did not offer FUSE_OVER_IO_URING in INIT".to_string());
    }
    let device = session
        .as_fd()
        .try_clone_to_owned()
        .map_err(|error| format!("duplicating the /dev/fuse descriptor: {error}"))?;
    let shape = QueueShape {
        queues: uring::queue_count(),
        entries_per_queue: config.uring_entries_per_queue.max(2),
        payload_bytes: MAX_REQUEST_BYTES as usize,
        move_min_bytes: config.uring_move_min_bytes,
    };
    let queues = Queues::start(Arc::new(device), Arc::new(session.raw_dispatcher(handle)), shape)?;
    let pinning = match queues.unpinned {
        0 => "each pinned to its CPU".to_string(),
        unpinned => format!("{unpinned} of them not pinned: the scheduler refused"),
    };
    Ok((
        queues,
        format!(
            "{} queues of {} entries, {pinning}, {}; {} is Y",
            shape.queues,
            shape.entries_per_queue,
            match shape.move_min_bytes {
                0 => "every request served on its queue's CPU".to_string(),
                bytes => format!("reads of {bytes} bytes or more served on any CPU"),
            },
            uring::ENABLE_PARAMETER
        ),
    ))
}

/// Mounts `fs` at `mountpoint` and serves it on this thread until it is unmounted, by
/// `umount`, [`unmount`] or `tandem umount`, or until the process receives SIGINT, SIGTERM or
/// SIGHUP (then it unmounts itself). Makes every change durable (`fs.sync`) before returning;
/// the caller then calls `fs.unmount()`.
/// The requests a mount served, per kind, in its log at `info` once it is unmounted
/// (`TANDEM_LOG=info`): with the operations a program ran, the kernel round trips each cost.
fn log_requests_served(mountpoint: &Path, counters: &RequestCounters) {
    let counts = counters.snapshot();
    log::info!(
        "tandemfs: {} served {} FUSE requests: {counts:?}; at most {} READs at once",
        mountpoint.display(),
        counts.total(),
        counters.reads_at_once_most()
    );
}

pub fn mount_foreground(fs: FileSystem, mountpoint: &Path, config: &MountConfig) -> io::Result<()> {
    // Resolved before mounting: afterwards, looking at the path may need the server, which
    // only starts answering in `run`.
    let resolved_mountpoint = canonical_or_absolute(mountpoint);
    let marker = ServingMarker::claim(mountpoint)?;
    let blocked = BlockedSignals::block()?;
    let counters = Arc::new(RequestCounters::default());
    let serving = match start_session(fs.clone(), mountpoint, &resolved_mountpoint, config, counters.clone()) {
        Ok(serving) => serving,
        Err(error) => {
            drop(blocked);
            return Err(error);
        }
    };
    let watcher = SignalWatcher::start(resolved_mountpoint)?;
    let control = RemountControl::start(&marker, fs.clone())?;
    let Serving { session, queues, transport: _, notifier: _ } = serving;
    let served = session.run();
    if let Some(mut queues) = queues {
        queues.stop(QUEUE_STOP_WAIT);
    }
    log_requests_served(mountpoint, &counters);
    control.stop();
    watcher.stop();
    let synced = fs.sync();
    drop(blocked);
    // The marker stays claimed until this process exits, which is after the caller's
    // `fs.unmount()`: `unmount` waits for that, so a command run after `tandem umount`
    // (fsck, a new mount) finds the volume complete.
    marker.keep_until_exit();
    served?;
    synced.map_err(|error| io::Error::other(format!("final sync: {error}")))
}

/// The READs a mount served over io_uring, and where (`MountConfig::uring_move_min_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringReads {
    /// READs served, of any size.
    pub reads: u64,
    /// READs served by a thread moved off its queue's CPU (large enough to move).
    pub moved: u64,
    /// READs served on another CPU than their queue's, which is the caller's CPU.
    pub served_elsewhere: u64,
}

/// A volume served by a background thread of this process.
pub struct BackgroundMount {
    mountpoint: PathBuf,
    server: Option<JoinHandle<io::Result<()>>>,
    fs: FileSystem,
    control: Option<RemountControl>,
    counters: Arc<RequestCounters>,
    queues: Option<Queues>,
    transport: TransportReport,
    /// Tells the kernel about changes made through the library behind its back. Dropped at
    /// the unmount: it holds a /dev/fuse descriptor, which outlived the mount before.
    notifier: Option<Notifier>,
    _marker: ServingMarker,
}

/// Mounts `fs` at `mountpoint` and serves it on background threads. Unmount with
/// [`BackgroundMount::unmount`]; dropping the value unmounts too (lazily if busy).
pub fn mount_background(fs: FileSystem, mountpoint: &Path, config: &MountConfig) -> io::Result<BackgroundMount> {
    let resolved_mountpoint = canonical_or_absolute(mountpoint);
    let marker = ServingMarker::claim(mountpoint)?;
    marker.mark_background();
    let counters = Arc::new(RequestCounters::default());
    let Serving { session, queues, transport, notifier } =
        start_session(fs.clone(), mountpoint, &resolved_mountpoint, config, counters.clone())?;
    let control = RemountControl::start(&marker, fs.clone())?;
    let server = std::thread::Builder::new().name("tandemfs-fuse".to_string()).spawn(move || session.run())?;
    Ok(BackgroundMount {
        mountpoint: resolved_mountpoint,
        server: Some(server),
        fs,
        control: Some(control),
        counters,
        queues,
        transport,
        notifier: Some(notifier),
        _marker: marker,
    })
}

impl BackgroundMount {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The transport this mount serves through, and why.
    pub fn transport(&self) -> &TransportReport {
        &self.transport
    }

    /// The requests this mount has served so far, per kind. Asynchronous ones (RELEASE,
    /// FORGET) arrive after the system call that caused them has returned.
    pub fn request_counts(&self) -> RequestCounts {
        self.counters.snapshot()
    }

    /// The most READs the mount served at the same time so far (over either transport): how
    /// many workers one reader's read-ahead kept busy at once.
    pub fn reads_at_once_most(&self) -> u64 {
        self.counters.reads_at_once_most()
    }

    /// Over io_uring, the READs served so far and where; None over /dev/fuse.
    pub fn uring_reads(&self) -> Option<UringReads> {
        self.queues.as_ref().map(|queues| UringReads {
            reads: queues.counters.reads.load(Ordering::Relaxed),
            moved: queues.counters.moved.load(Ordering::Relaxed),
            served_elsewhere: queues.counters.reads_elsewhere.load(Ordering::Relaxed),
        })
    }

    /// The notifier while the mount stands; ENOTCONN once it is unmounted.
    fn notifier(&self) -> io::Result<&Notifier> {
        self.notifier.as_ref().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotConnected, format!("{} is no longer mounted", self.mountpoint.display()))
        })
    }

    /// Tells the kernel to forget what it cached about `name` in directory `parent`, a
    /// negative entry included (FUSE_NOTIFY_INVAL_ENTRY). The mount's caches trust that every
    /// change comes through the kernel (docs/FUSE.md, "Caching"); a program that changes a
    /// name through the library (a clone of the `FileSystem` this mount serves) calls this
    /// afterwards so that the mount sees the change. A name the kernel holds nothing of is
    /// not an error.
    pub fn invalidate_entry(&self, parent: InodeNumber, name: &OsStr) -> io::Result<()> {
        match self.notifier()?.inval_entry(INodeNo(parent), name) {
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            result => result,
        }
    }

    /// Tells the kernel to drop its cached attributes and pages of `inode`
    /// (FUSE_NOTIFY_INVAL_INODE over the whole file): after the library changed the file's
    /// contents or attributes behind the mount's back, as [`Self::invalidate_entry`] for names.
    pub fn invalidate_inode(&self, inode: InodeNumber) -> io::Result<()> {
        match self.notifier()?.inval_inode(INodeNo(inode), 0, 0) {
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            result => result,
        }
    }

    /// Unmounts (fails with EBUSY while files are open, and may then be called again), waits
    /// for the server threads, and makes every change durable. After success, dropping the
    /// value does nothing more.
    pub fn unmount(&mut self) -> io::Result<()> {
        self.finish(false)
    }

    fn finish(&mut self, lazily_if_busy: bool) -> io::Result<()> {
        let Some(server) = self.server.take() else {
            return Ok(());
        };
        if let Err(error) = kernel_unmount(&self.mountpoint, lazily_if_busy) {
            self.server = Some(server);
            return Err(error);
        }
        let served = server.join().unwrap_or_else(|_| Err(io::Error::other("FUSE server thread panicked")));
        self.notifier = None;
        if let Some(mut queues) = self.queues.take() {
            queues.stop(QUEUE_STOP_WAIT);
        }
        log_requests_served(&self.mountpoint, &self.counters);
        if let Some(control) = self.control.take() {
            control.stop();
        }
        let synced = self.fs.sync();
        served?;
        synced.map_err(|error| io::Error::other(format!("final sync: {error}")))
    }
}

impl Drop for BackgroundMount {
    fn drop(&mut self) {
        if let Err(error) = self.finish(true) {
            log::error!("tandemfs: unmounting {}: {error}", self.mountpoint.display());
        }
    }
}

/// Unmounts the tandemfs mounted at `mountpoint` and waits until the process serving it has
/// finished (so the volume is complete on its device when this returns). Fails with a clear
/// message when nothing, or something other than tandemfs, is mounted there, and with EBUSY
/// while files on it are open.
pub fn unmount(mountpoint: &Path) -> io::Result<()> {
    let path = canonical_or_absolute(mountpoint);
    let Some(file_system_type) = mounted_type(&path)? else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a mount point", path.display())));
    };
    if file_system_type != format!("fuse.{SUBTYPE}") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is a {file_system_type} mount, not tandemfs", path.display()),
        ));
    }
    kernel_unmount(&path, false)?;
    let deadline = Instant::now() + SERVER_EXIT_WAIT;
    while ServingMarker::is_claimed(&path) {
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{} was unmounted, but its server is still writing after {} s",
                    path.display(),
                    SERVER_EXIT_WAIT.as_secs()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `realpath` of the mount point, or the path made absolute when it cannot be resolved (a
/// mount whose server died answers ENOTCONN to every lookup).
fn canonical_or_absolute(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| std::path::absolute(path).unwrap_or(path.to_path_buf()))
}

/// The type (`fuse.tandemfs`, `ext4`, ...) of the file system mounted exactly at `path`.
fn mounted_type(path: &Path) -> io::Result<Option<String>> {
    Ok(mounted_at(path)?.map(|(file_system_type, _)| file_system_type))
}

/// Sets the read-ahead of the tandemfs mount at `mountpoint` (resolved) to `kib` KiB, through
/// `/sys/class/bdi/MAJOR:MINOR/read_ahead_kb` of its anonymous device (root only).
fn set_read_ahead(mountpoint: &Path, kib: u32) -> io::Result<()> {
    let Some((file_system_type, device)) = mounted_at(mountpoint)? else {
        return Err(io::Error::new(io::ErrorKind::NotFound, "the mount is not in /proc/self/mountinfo"));
    };
    let well_formed = device
        .split_once(':')
        .is_some_and(|(major, minor)| major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok());
    if file_system_type != format!("fuse.{SUBTYPE}") || !well_formed {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected mount entry: type {file_system_type}, device {device}"),
        ));
    }
    std::fs::write(format!("/sys/class/bdi/{device}/read_ahead_kb"), format!("{kib}\n"))
}

/// The type and the device (`MAJOR:MINOR`) of the file system mounted exactly at `path`.
fn mounted_at(path: &Path) -> io::Result<Option<(String, String)>> {
    let mount_table = std::fs::read_to_string("/proc/self/mountinfo")?;
    let wanted = path.as_os_str().as_bytes();
    // The last mount at a path hides the earlier ones.
    let mut found = None;
    for line in mount_table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(separator) = fields.iter().position(|field| *field == "-") else {
            continue;
        };
        if fields.len() < 5 || separator + 1 >= fields.len() {
            continue;
        }
        if unescape_mount_field(fields[4]) == wanted {
            found = Some((fields[separator + 1].to_string(), fields[2].to_string()));
        }
    }
    Ok(found)
}

/// Mount tables write space, tab, newline and backslash as `\` and three octal digits.
fn unescape_mount_field(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\' && index + 3 < bytes.len() {
            let digits = &field[index + 1..index + 4];
            if let Ok(value) = u8::from_str_radix(digits, 8) {
                out.push(value);
                index += 4;
                continue;
            }
        }
        out.push(bytes[index]);
        index += 1;
    }
    out
}

/// Asks the kernel to unmount. Root calls umount2 directly; other users go through the
/// set-user-ID fusermount3. With `lazily_if_busy`, a busy mount is detached instead (the
/// kernel finishes the unmount when the last file is closed).
/// How long a busy mount is retried before unmounting reports it busy (or detaches it).
const UNMOUNT_BUSY_GRACE: Duration = Duration::from_secs(2);

fn kernel_unmount(path: &Path, lazily_if_busy: bool) -> io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mount point contains NUL"))?;
    // A mount can be busy for a moment after its last file was closed: a child that another
    // thread of the closing process has forked holds a copy of every descriptor until it
    // execs. So busy is retried for a short, bounded time before it is reported.
    let busy_deadline = Instant::now() + UNMOUNT_BUSY_GRACE;
    let error = loop {
        // SAFETY: `c_path` is a valid NUL-terminated string for the duration of the call.
        if unsafe { libc::umount2(c_path.as_ptr(), 0) } == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EBUSY) || Instant::now() >= busy_deadline {
            break error;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    match error.raw_os_error() {
        Some(libc::EBUSY) if lazily_if_busy => {
            // SAFETY: as above.
            if unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) } == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
        Some(libc::EBUSY) => Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("{} is busy: files or directories on it are still in use", path.display()),
        )),
        // EINVAL: not (or no longer) a mount point, for example after an external umount.
        Some(libc::EINVAL) => Ok(()),
        Some(libc::EPERM) => fusermount_unmount(path, lazily_if_busy),
        _ => Err(error),
    }
}

fn fusermount_unmount(path: &Path, lazily: bool) -> io::Result<()> {
    let mut last_error = None;
    for program in ["fusermount3", "fusermount"] {
        let mut command = std::process::Command::new(program);
        command.arg("-u");
        if lazily {
            command.arg("-z");
        }
        match command.arg("--").arg(path).output() {
            Ok(output) if output.status.success() => return Ok(()),
            Ok(output) => {
                return Err(io::Error::other(format!(
                    "{program} -u {}: {}",
                    path.display(),
                    String::from_utf8_lossy(&output.stderr).trim()
                )))
            }
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| io::Error::other("fusermount3 not found")))
}

/// A name in the abstract Unix socket namespace, held by the process that serves a mount
/// point for as long as it may still write to the volume. [`unmount`] waits for it to be
/// released; the kernel releases it when the holder exits, even if killed.
struct ServingMarker {
    name: Vec<u8>,
    socket: Option<UnixDatagram>,
}

/// Markers kept by `mount_foreground` until process exit, by name, so that serving the same
/// mount point again in this process reuses the claim instead of failing on it.
fn kept_markers() -> &'static Mutex<HashMap<Vec<u8>, UnixDatagram>> {
    static KEPT: OnceLock<Mutex<HashMap<Vec<u8>, UnixDatagram>>> = OnceLock::new();
    KEPT.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Names held by background mounts of this process. [`unmount`] called in this process for one
/// of them must not wait for the name: the owner (`BackgroundMount`) releases it only after
/// its own unmount, which may be the very call waiting.
fn background_markers() -> &'static Mutex<HashSet<Vec<u8>>> {
    static HELD: OnceLock<Mutex<HashSet<Vec<u8>>>> = OnceLock::new();
    HELD.get_or_init(|| Mutex::new(HashSet::new()))
}

impl ServingMarker {
    fn name_for(mountpoint: &Path) -> Vec<u8> {
        // FNV-1a of the path keeps the name short whatever the path's length.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in mountpoint.as_os_str().as_bytes() {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("tandemfs-serving-{hash:016x}").into_bytes()
    }

    fn bind(name: &[u8]) -> io::Result<UnixDatagram> {
        use std::os::linux::net::SocketAddrExt;
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        UnixDatagram::bind_addr(&address)
    }

    fn claim(mountpoint: &Path) -> io::Result<ServingMarker> {
        let name = Self::name_for(&canonical_or_absolute(mountpoint));
        if let Some(socket) = kept_markers().lock().expect("marker table").remove(&name) {
            return Ok(ServingMarker { name, socket: Some(socket) });
        }
        match Self::bind(&name) {
            Ok(socket) => Ok(ServingMarker { name, socket: Some(socket) }),
            Err(error) if error.kind() == io::ErrorKind::AddrInUse => Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is already served by another tandemfs process", mountpoint.display()),
            )),
            Err(error) => Err(error),
        }
    }

    fn is_claimed(mountpoint: &Path) -> bool {
        let name = Self::name_for(mountpoint);
        if kept_markers().lock().expect("marker table").contains_key(&name) {
            // Served by this very process, which has finished serving it.
            return false;
        }
        if background_markers().lock().expect("marker table").contains(&name) {
            return false;
        }
        matches!(Self::bind(&name), Err(error) if error.kind() == io::ErrorKind::AddrInUse)
    }

    fn mark_background(&self) {
        background_markers().lock().expect("marker table").insert(self.name.clone());
    }

    fn keep_until_exit(mut self) {
        if let Some(socket) = self.socket.take() {
            kept_markers().lock().expect("marker table").insert(self.name.clone(), socket);
        }
    }
}

impl Drop for ServingMarker {
    fn drop(&mut self) {
        background_markers().lock().expect("marker table").remove(&self.name);
    }
}

/// SIGINT, SIGTERM and SIGHUP blocked in the calling thread (and so in the FUSE worker
/// threads it starts), so that only the watcher thread receives them. Restores the previous
/// mask when dropped.
/// Longest a remount waits for the server's answer: a remount read-write may wait for the
/// multi-mount protection check (twice the longest interval and a margin).
const REMOUNT_ANSWER_WAIT: Duration = Duration::from_secs(700);
/// How often the control thread looks at its stop flag.
const CONTROL_POLL: Duration = Duration::from_millis(200);
const REMOUNT_READ_ONLY: &[u8] = b"remount-ro";
const REMOUNT_READ_WRITE: &[u8] = b"remount-rw";

/// Serves remount requests on the serving marker's socket: `tandem mount -o remount,ro|rw`
/// (and `mount -o remount` through the helper) sends one datagram, and the serving process
/// switches its `FileSystem` and answers `ok` or the error in words.
struct RemountControl {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl RemountControl {
    fn start(marker: &ServingMarker, fs: FileSystem) -> io::Result<RemountControl> {
        let socket = marker.socket.as_ref().expect("a claimed marker holds its socket").try_clone()?;
        socket.set_read_timeout(Some(CONTROL_POLL))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = stop.clone();
        let thread = std::thread::Builder::new().name("tandemfs-remount".to_string()).spawn(move || {
            let mut buffer = [0u8; 64];
            while !stop_seen.load(Ordering::Acquire) {
                let Ok((length, peer)) = socket.recv_from(&mut buffer) else {
                    continue;
                };
                let read_only = match &buffer[..length] {
                    REMOUNT_READ_ONLY => true,
                    REMOUNT_READ_WRITE => false,
                    _ => continue,
                };
                let answer = match fs.set_read_only(read_only) {
                    Ok(()) => "ok".to_string(),
                    Err(error) => format!("error: {error}"),
                };
                log::info!("tandemfs: remount {}: {answer}", if read_only { "ro" } else { "rw" });
                let _ = socket.send_to_addr(answer.as_bytes(), &peer);
            }
        })?;
        Ok(RemountControl { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}

/// Switches the tandemfs mounted at `mountpoint` to read-only or read-write: the serving
/// process switches its volume (read-only: everything durable, checkpointed, marked clean and
/// the MMP block let go; read-write: the MMP block taken again), and the kernel switches the
/// mount. Read-only goes kernel first, so that no write arrives after the volume stopped
/// taking them; read-write goes volume first, so that a refusal leaves the mount as it was.
/// Root only: the kernel refuses a remount to anyone else.
pub fn remount(mountpoint: &Path, read_only: bool) -> io::Result<()> {
    let path = canonical_or_absolute(mountpoint);
    match mounted_type(&path)? {
        Some(found) if found == format!("fuse.{SUBTYPE}") => {}
        Some(found) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is a {found} mount, not tandemfs", path.display()),
            ))
        }
        None => {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a mount point", path.display())))
        }
    }
    if read_only {
        kernel_remount(&path, true)?;
        ask_server(&path, REMOUNT_READ_ONLY)
    } else {
        ask_server(&path, REMOUNT_READ_WRITE)?;
        kernel_remount(&path, false)
    }
}

fn ask_server(mountpoint: &Path, request: &[u8]) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
    let reply_name = format!("tandemfs-remount-{}-{unique}", std::process::id());
    let socket = UnixDatagram::bind_addr(&std::os::unix::net::SocketAddr::from_abstract_name(reply_name.as_bytes())?)?;
    let server = std::os::unix::net::SocketAddr::from_abstract_name(ServingMarker::name_for(mountpoint))?;
    socket.send_to_addr(request, &server).map_err(|error| {
        io::Error::new(error.kind(), format!("no tandemfs process serves {} ({error})", mountpoint.display()))
    })?;
    socket.set_read_timeout(Some(REMOUNT_ANSWER_WAIT))?;
    let mut answer = [0u8; 1024];
    let length = socket.recv(&mut answer).map_err(|error| {
        io::Error::new(error.kind(), format!("the process serving {} did not answer: {error}", mountpoint.display()))
    })?;
    match std::str::from_utf8(&answer[..length]).unwrap_or("error: unreadable answer") {
        "ok" => Ok(()),
        other => Err(io::Error::other(other.trim_start_matches("error: ").to_string())),
    }
}

/// `mount(2)` with `MS_REMOUNT`, keeping the mount's other flags (nosuid, nodev, noexec,
/// noatime), which a remount would otherwise clear.
fn kernel_remount(mountpoint: &Path, read_only: bool) -> io::Result<()> {
    let c_path = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mount point contains NUL"))?;
    // SAFETY: statvfs fills the zeroed struct; the path is NUL-terminated.
    let mut status = unsafe { std::mem::zeroed::<libc::statvfs>() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut status) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let kept = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
    ];
    let mut flags = libc::MS_REMOUNT;
    for (statvfs_flag, mount_flag) in kept {
        if status.f_flag & statvfs_flag != 0 {
            flags |= mount_flag;
        }
    }
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: every pointer is a NUL-terminated string or null, valid for the call.
    let result = unsafe { libc::mount(std::ptr::null(), c_path.as_ptr(), std::ptr::null(), flags, std::ptr::null()) };
    if result != 0 {
        let error = io::Error::last_os_error();
        return Err(io::Error::new(
            error.kind(),
            format!(
                "remounting {} {}: {error}",
                mountpoint.display(),
                if read_only { "read-only" } else { "read-write" }
            ),
        ));
    }
    Ok(())
}

struct BlockedSignals {
    previous: libc::sigset_t,
}

fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local sigset_t.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

impl BlockedSignals {
    fn block() -> io::Result<BlockedSignals> {
        let set = termination_signals();
        // SAFETY: both pointers refer to valid sigset_t values.
        let mut previous = unsafe { std::mem::zeroed::<libc::sigset_t>() };
        let result = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut previous) };
        if result != 0 {
            return Err(io::Error::from_raw_os_error(result));
        }
        Ok(BlockedSignals { previous })
    }
}

impl Drop for BlockedSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `block`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.previous, std::ptr::null_mut());
        }
    }
}

/// Waits for a termination signal and then unmounts, which ends the session loop.
struct SignalWatcher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl SignalWatcher {
    fn start(mountpoint: PathBuf) -> io::Result<SignalWatcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = stop.clone();
        let thread = std::thread::Builder::new().name("tandemfs-signals".to_string()).spawn(move || {
            let set = termination_signals();
            let timeout = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
            while !stop_seen.load(Ordering::Acquire) {
                // SAFETY: `set` and `timeout` are valid; no siginfo is requested.
                let signal = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &timeout) };
                if signal > 0 {
                    log::info!("tandemfs: signal {signal}, unmounting {}", mountpoint.display());
                    // Lazily if busy: a signal means "stop now", and the kernel finishes
                    // the unmount when the last open file is closed.
                    if let Err(error) = kernel_unmount(&mountpoint, true) {
                        log::error!("tandemfs: unmount after signal failed: {error}");
                    }
                }
            }
        })?;
        Ok(SignalWatcher { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_poll_by_default_only_with_cores_to_spare() {
        assert_eq!(default_poll_microseconds(2), 0);
        assert_eq!(default_poll_microseconds(POLL_CORES_MIN - 1), 0);
        assert_eq!(default_poll_microseconds(POLL_CORES_MIN), POLL_MICROSECONDS_DEFAULT);
        assert_eq!(default_poll_microseconds(128), POLL_MICROSECONDS_DEFAULT);
    }

    #[test]
    fn mount_table_escapes_are_decoded() {
        assert_eq!(unescape_mount_field("/mnt/a\\040b"), b"/mnt/a b".to_vec());
        assert_eq!(unescape_mount_field("/plain"), b"/plain".to_vec());
        assert_eq!(unescape_mount_field("/end\\"), b"/end\\".to_vec());
    }

    #[test]
    fn root_is_a_mount_point_and_a_file_is_not() {
        assert!(mounted_type(Path::new("/")).unwrap().is_some());
        assert!(mounted_type(Path::new("/proc/self/status")).unwrap().is_none());
    }

    #[test]
    fn unmount_refuses_what_is_not_tandemfs() {
        let error = unmount(Path::new("/proc")).unwrap_err();
        assert!(error.to_string().contains("not tandemfs"), "{error}");
        let error = unmount(Path::new("/proc/self")).unwrap_err();
        assert!(error.to_string().contains("not a mount point"), "{error}");
    }

    #[test]
    fn serving_marker_is_seen_while_held() {
        let path = Path::new("/nonexistent/tandemfs/marker/test");
        let marker = ServingMarker::claim(path).unwrap();
        assert!(ServingMarker::is_claimed(path));
        assert!(ServingMarker::claim(path).is_err());
        drop(marker);
        assert!(!ServingMarker::is_claimed(path));
    }
}
