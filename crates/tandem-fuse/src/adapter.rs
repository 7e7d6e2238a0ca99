//! The `fuser::Filesystem` implementation: one method per FUSE request, each decoding its
//! arguments, calling the engine and answering with attributes, data or an errno.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig,
    LockOwner, Notifier, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use tandemfs::error::Error;
use tandemfs::fs::{Attributes, FileSystem, FileType, InodeNumber, RenameMode, SetAttributes, TimeToSet, XattrMode};

use crate::counters::{RequestCounters, RequestKind};
use crate::errno::fuse_errno;
use crate::ioctl::{self, RangeRequest};
use crate::permissions::{self, Caller, EXECUTE, READ, WRITE};

/// How long the kernel may trust a name lookup (positive or negative) and an inode's
/// attributes without asking again. Every change to the volume while it is mounted passes
/// through this kernel mount, which updates or drops its own cached entries and attributes
/// when it forwards a change; the one change it cannot see coming (insert and collapse through
/// ioctl) is followed by an explicit invalidation. So the timeouts can be long: an hour.
const CACHE_TIMEOUT: Duration = Duration::from_secs(3600);

/// `st_blksize` reported to applications: the engine's block size, the unit in which they
/// should size their writes.
const PREFERRED_IO_BYTES: u32 = 4096;

/// `FALLOC_FL_*` values of fallocate(2).
const FALLOCATE_KEEP_SIZE: i32 = 0x01;
const FALLOCATE_PUNCH_HOLE: i32 = 0x02;
const FALLOCATE_COLLAPSE_RANGE: i32 = 0x08;
const FALLOCATE_ZERO_RANGE: i32 = 0x10;
const FALLOCATE_INSERT_RANGE: i32 = 0x20;

/// Size of one readdirplus record without its name (entry, attributes, padding), and how many
/// bytes of records to gather per request: enough to fill the kernel's usual one-page buffer
/// several times over without fetching attributes for many entries that will not fit.
const DIRECTORY_PLUS_ENTRY_BYTES: usize = 152;
const DIRECTORY_PLUS_BATCH_BYTES: usize = 32 << 10;

/// The largest read buffer a worker thread keeps between requests: the kernel's largest read
/// (256 pages). A larger request (a kernel with a higher page limit) gets a buffer of its own
/// that is freed afterwards.
const READ_BUFFER_KEPT_BYTES_MAX: usize = 1 << 20;

/// The largest read or write request: 256 pages, the kernel's default `max_pages` limit.
pub(crate) const MAX_REQUEST_BYTES: u32 = 1 << 20;

thread_local! {
    /// The buffer each FUSE worker thread reads file data into before replying.
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Extended attributes that carry POSIX ACLs. The engine has no ACLs and FUSE_POSIX_ACL is
/// not negotiated, so the kernel would pass these through as plain attributes, and storing one
/// would make `cp -a`, tar and rsync believe they had set the mode through it and skip their
/// chmod. Refusing them all with EOPNOTSUPP, as ext4 mounted without ACLs does, makes those
/// programs fall back to chmod.
fn is_acl_attribute(name: &[u8]) -> bool {
    name == b"system.posix_acl_access" || name == b"system.posix_acl_default"
}

/// The extended attribute holding a file's capabilities, which Linux removes whenever the
/// file's contents or owner change.
const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// The permission bits left after what Linux drops on a write or truncation by a caller
/// without CAP_FSETID, and on a change of owner (`setattr_should_drop_suidgid`):
/// set-user-ID, and set-group-ID when the file is group-executable or, since Linux 6.2, when
/// the caller is neither in the file's group nor privileged (`in_group_or_privileged`, asked
/// only when it matters, since it may read /proc).
fn without_set_id(permissions: u32, in_group_or_privileged: impl FnOnce() -> bool) -> u32 {
    let mut kept = permissions & !0o4000;
    if permissions & 0o2000 != 0 && (permissions & 0o010 != 0 || !in_group_or_privileged()) {
        kept &= !0o2000;
    }
    kept
}

const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;

pub(crate) struct Adapter {
    fs: FileSystem,
    /// True when the kernel checks mode bits itself (`default_permissions`).
    kernel_checks_permissions: bool,
    /// Set once the session exists; used to drop cached pages after insert and collapse.
    notifier: Arc<OnceLock<Notifier>>,
    /// Requests served, per kind (read by `BackgroundMount::request_counts`).
    counters: Arc<RequestCounters>,
    /// Set when the mount wants FUSE over io_uring; INIT sets it true when the kernel offered
    /// it and it was asked for.
    io_uring: Option<Arc<AtomicBool>>,
    /// Set by INIT when FUSE_HANDLE_KILLPRIV_V2 was agreed: the kernel then leaves dropping
    /// set-ID bits and capabilities on write, truncate and chown to the file system.
    kills_privileges: Arc<AtomicBool>,
}

impl Adapter {
    pub(crate) fn new(
        fs: FileSystem,
        kernel_checks_permissions: bool,
        notifier: Arc<OnceLock<Notifier>>,
        counters: Arc<RequestCounters>,
        io_uring: Option<Arc<AtomicBool>>,
    ) -> Adapter {
        Adapter { fs, kernel_checks_permissions, notifier, counters, io_uring, kills_privileges: Arc::default() }
    }

    /// A second handle on the same volume, notifier and counters, for the io_uring queues'
    /// dispatcher (the session owns the first). Nothing per request lives in the adapter, so
    /// the two serve alike.
    pub(crate) fn second_handle(&self) -> Adapter {
        let mut second = Adapter::new(
            self.fs.clone(),
            self.kernel_checks_permissions,
            self.notifier.clone(),
            self.counters.clone(),
            None,
        );
        second.kills_privileges = self.kills_privileges.clone();
        second
    }

    /// Drops what Linux drops when a file's contents change (a write, a truncation, an
    /// allocation): its file capabilities, always, and with `kill_set_id` (the caller, who
    /// lacks CAP_FSETID) the set-ID bits `without_set_id` names. Returns whether the mode
    /// changed, so that the caller can tell the kernel its cached mode is stale.
    fn drop_privileges(&self, inode: InodeNumber, kill_set_id: Option<&Caller>) -> Result<bool, Error> {
        match self.fs.get_xattr(inode, CAPABILITY_XATTR) {
            Ok(_) => match self.fs.remove_xattr(inode, CAPABILITY_XATTR) {
                Ok(()) | Err(Error::NoData) => {}
                Err(error) => return Err(error),
            },
            Err(Error::NoData) => {}
            Err(error) => return Err(error),
        }
        let Some(caller) = kill_set_id else { return Ok(false) };
        self.drop_set_id(inode, caller)
    }

    /// Drops set-user-ID and set-group-ID as `without_set_id` says for `caller`; returns
    /// whether the mode changed.
    fn drop_set_id(&self, inode: InodeNumber, caller: &Caller) -> Result<bool, Error> {
        let current = self.fs.get_attributes(inode)?;
        let kept = without_set_id(current.permissions, || caller.is_root() || caller.is_member_of(current.gid));
        if kept == current.permissions {
            return Ok(false);
        }
        let change = SetAttributes { permissions: Some(kept), ..Default::default() };
        self.fs.set_attributes(inode, &change)?;
        Ok(true)
    }

    /// Drops the kernel's cached attributes of `inode` (not its pages): after the file system
    /// changed the mode on its own. Safe before replying to the request at hand, as no page
    /// lock is taken.
    fn invalidate_attributes(&self, inode: InodeNumber) {
        if let Some(notifier) = self.notifier.get() {
            if let Err(error) = notifier.inval_inode(INodeNo(inode), -1, 0) {
                if error.raw_os_error() != Some(libc::ENOENT) {
                    log::warn!("tandemfs: invalidating cached attributes of inode {inode}: {error}");
                }
            }
        }
    }

    /// Access check for mounts without `default_permissions`; with it, the kernel has already
    /// checked and this returns Ok without asking the engine.
    fn check_access(&self, caller: &Caller, inode: InodeNumber, mask: u32) -> Result<(), Errno> {
        if self.kernel_checks_permissions {
            return Ok(());
        }
        let attributes = self.fs.get_attributes(inode).map_err(|error| fuse_errno(&error))?;
        if permissions::allows(caller, &attributes, mask) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// Write and search access to `parent`, and the sticky-directory rule for `name` when it
    /// is being removed or replaced.
    fn check_directory_change(&self, caller: &Caller, parent: InodeNumber, name: Option<&[u8]>) -> Result<(), Errno> {
        if self.kernel_checks_permissions {
            return Ok(());
        }
        let directory = self.fs.get_attributes(parent).map_err(|error| fuse_errno(&error))?;
        if !permissions::allows(caller, &directory, WRITE | EXECUTE) {
            return Err(Errno::EACCES);
        }
        if let Some(name) = name {
            match self.fs.lookup(parent, name) {
                Ok(victim) if !permissions::sticky_allows(caller, &directory, &victim) => return Err(Errno::EPERM),
                _ => {}
            }
        }
        Ok(())
    }

    /// Drops the kernel's cached pages of `inode` from `offset` to the end, and its cached
    /// attributes, after the engine shifted the file's bytes behind the kernel's back.
    fn invalidate_from(&self, inode: InodeNumber, offset: u64) {
        if let Some(notifier) = self.notifier.get() {
            let offset = i64::try_from(offset).unwrap_or(i64::MAX);
            if let Err(error) = notifier.inval_inode(INodeNo(inode), offset, 0) {
                // ENOENT means the kernel holds nothing of this inode: nothing to drop.
                if error.raw_os_error() != Some(libc::ENOENT) {
                    log::warn!("tandemfs: invalidating cached pages of inode {inode}: {error}");
                }
            }
        }
    }

    fn reply_entry(&self, reply: ReplyEntry, result: Result<Attributes, Error>) {
        match result {
            Ok(attributes) => reply.entry(&CACHE_TIMEOUT, &file_attr(&attributes), Generation(attributes.generation)),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn reply_empty(reply: ReplyEmpty, result: Result<(), Error>) {
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    /// The DEFRAG ioctl: compaction of the file when it holds more than the factor asks, with
    /// the space before and after. The bytes do not change, so no cached page is dropped.
    fn defrag(&self, inode: InodeNumber, handle: FileHandle, argument: &[u8]) -> Result<ioctl::DefragRequest, Errno> {
        let Some(mut request) = ioctl::DefragRequest::from_bytes(argument) else {
            return Err(Errno::EINVAL);
        };
        if !opened_for_writing(handle) {
            return Err(Errno::EBADF);
        }
        if request.factor_millis < 1000 {
            return Err(Errno::EINVAL);
        }
        let factor = request.factor_millis as f64 / 1000.0;
        let report = self.fs.defrag(inode, factor).map_err(|error| fuse_errno(&error))?;
        request.mapped_bytes = report.after.mapped_bytes;
        request.held_bytes_before = report.before.held_bytes();
        request.held_bytes_after = report.after.held_bytes();
        request.records = report.records;
        Ok(request)
    }

    fn insert_or_collapse(
        &self,
        caller: &Caller,
        inode: InodeNumber,
        handle: FileHandle,
        command: u32,
        argument: &[u8],
    ) -> Result<(), Errno> {
        let Some(request) = RangeRequest::from_bytes(argument) else {
            return Err(Errno::EINVAL);
        };
        if !opened_for_writing(handle) {
            return Err(Errno::EBADF);
        }
        // Pages dirtied through mmap and not yet written back hold bytes at the offsets before
        // the shift: have the kernel write them back (to another worker) and drop them now, as
        // ext4 flushes before INSERT_RANGE. The invalidation after the change alone would write
        // them back at their old offsets, over the shifted bytes.
        self.invalidate_from(inode, request.offset);
        let result = if command == ioctl::INSERT {
            if request.data == 0 {
                self.fs.insert_range(inode, request.offset, request.length)
            } else {
                if request.length > ioctl::INLINE_INSERT_MAX_BYTES {
                    // Tells the caller to use the hole-then-pwrite path (see `ioctl`).
                    return Err(Errno::from_i32(libc::EOPNOTSUPP));
                }
                let data =
                    ioctl::read_caller_memory(caller.thread_id, request.data, request.length).map_err(|error| {
                        match error.raw_os_error() {
                            Some(libc::EFAULT) => Errno::EFAULT,
                            Some(libc::ENOMEM) => Errno::ENOMEM,
                            // Not allowed to read the caller (another user without ptrace
                            // rights, another PID namespace): let the caller fall back.
                            _ => Errno::from_i32(libc::EOPNOTSUPP),
                        }
                    })?;
                self.fs.insert(inode, request.offset, &data)
            }
        } else {
            if request.data != 0 {
                return Err(Errno::EINVAL);
            }
            self.fs.collapse_range(inode, request.offset, request.length)
        };
        // Invalidate even after a failure: the engine may have changed part of the range.
        self.invalidate_from(inode, request.offset);
        result.map_err(|error| fuse_errno(&error))
    }
}

/// What every open and create of a file tells the kernel. `FOPEN_KEEP_CACHE`: keep the page
/// cache across opens, as nothing changes the file behind the kernel's back without
/// invalidating it. `FOPEN_NOFLUSH` (Linux 5.17 and later; older kernels ignore it): close(2)
/// sends no FLUSH, since nothing is buffered in the adapter and the engine took every write when
/// it arrived. Before, the first FLUSH of a mount was answered ENOSYS, after which the kernel
/// still wrote the file's dirty pages back on every close before skipping FLUSH; now a close
/// costs neither, and pages dirtied through a shared `mmap` go back as on ext4: by the kernel's
/// write-back, msync, fsync or unmount (docs/FUSE.md, "Caching").
const FILE_OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(FopenFlags::FOPEN_NOFLUSH);

/// Open-file handles carry the open flags: that is all the adapter needs later (write access
/// for ioctl, O_APPEND is also sent with each write), so no table of open files is kept.
fn handle_for(flags: OpenFlags) -> FileHandle {
    FileHandle(flags.0 as u32 as u64)
}

fn opened_for_writing(handle: FileHandle) -> bool {
    let flags = OpenFlags(handle.0 as u32 as i32);
    matches!(flags.acc_mode(), OpenAccMode::O_WRONLY | OpenAccMode::O_RDWR)
}

fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

fn system_time(nanoseconds: i64) -> SystemTime {
    if nanoseconds >= 0 {
        UNIX_EPOCH + Duration::from_nanos(nanoseconds as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(nanoseconds.unsigned_abs())
    }
}

fn nanoseconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

fn time_to_set(time: TimeOrNow) -> TimeToSet {
    match time {
        TimeOrNow::Now => TimeToSet::Now,
        TimeOrNow::SpecificTime(time) => TimeToSet::Nanoseconds(requested_nanoseconds(time)),
    }
}

/// A time from a setattr request, in nanoseconds since 1970. The kernel sends whole seconds
/// (negative before 1970) plus 0..10^9 nanoseconds; fuser 0.18 turns a negative pair into
/// epoch - (|seconds| + nanoseconds) instead of epoch - |seconds| + nanoseconds (a TODO in
/// its time.rs), so `touch -d '1969-12-31 23:59:59.25'` would store 23:59:58.75. Undo that.
fn requested_nanoseconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(_) => nanoseconds(time),
        Err(before) => {
            let before = before.duration();
            i64::try_from(before.as_secs())
                .ok()
                .and_then(|seconds| seconds.checked_mul(-1_000_000_000))
                .and_then(|nanoseconds| nanoseconds.checked_add(i64::from(before.subsec_nanos())))
                .unwrap_or(i64::MIN)
        }
    }
}

fn fuse_file_type(file_type: FileType) -> fuser::FileType {
    match file_type {
        FileType::Regular => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
    }
}

pub(crate) fn file_attr(attributes: &Attributes) -> FileAttr {
    FileAttr {
        ino: INodeNo(attributes.inode),
        size: attributes.size_bytes,
        blocks: attributes.blocks_512,
        atime: system_time(attributes.access_time_ns),
        mtime: system_time(attributes.modify_time_ns),
        ctime: system_time(attributes.change_time_ns),
        crtime: system_time(attributes.birth_time_ns),
        kind: fuse_file_type(attributes.file_type),
        perm: (attributes.permissions & 0o7777) as u16,
        nlink: attributes.link_count,
        uid: attributes.uid,
        gid: attributes.gid,
        // FUSE carries device numbers in the kernel's 32-bit encoding, which is what mknod
        // handed the engine.
        rdev: attributes.rdev as u32,
        blksize: PREFERRED_IO_BYTES,
        flags: 0,
    }
}

impl fuser::Filesystem for Adapter {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each wish is optional: ask only for what this kernel offers.
        for wish in [
            // Listing a directory also returns attributes: `ls -l`, `find`, `cp -a` and rsync
            // then need no lookup per entry.
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            // The engine is thread-safe, so lookups and listings in one directory may run
            // in parallel.
            InitFlags::FUSE_PARALLEL_DIROPS,
            // Symbolic links never change, so their targets may stay in the page cache.
            InitFlags::FUSE_CACHE_SYMLINKS,
            // File handles (name_to_handle_at, an NFS export) stay valid after the kernel
            // forgot the inode: it then looks up "." in the handle's node id, and ".." to
            // reconnect a directory. Node ids are inode numbers and generations come from
            // the volume, so both answers are found without any memory of earlier lookups.
            InitFlags::FUSE_EXPORT_SUPPORT,
        ] {
            if config.capabilities().contains(wish) {
                let _ = config.add_capabilities(wish);
            }
        }
        // The file system drops set-user-ID, set-group-ID and file capabilities itself
        // (docs/FUSE.md, "Set-ID bits and capabilities"). The kernel then marks the volume
        // SB_NOSEC, and once a file has been written with no set-ID bit and no
        // `security.capability`, it stops asking for that attribute before every write: one
        // GETXATTR round trip less per write(2), a third of a durable small append.
        if config.capabilities().contains(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            && config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok()
        {
            self.kills_privileges.store(true, Ordering::Release);
        }
        let _ = config.set_max_background(64);
        // Writes of up to 1 MiB, the most the kernel sends anyway (256 pages, FUSE_MAX_PAGES,
        // which fuser asks for): fuser's default of 16 MiB would make the kernel size every
        // io_uring entry's payload buffer for 16 MiB.
        let _ = config.set_max_write(MAX_REQUEST_BYTES);
        if let Some(granted) = &self.io_uring {
            if config.capabilities().contains(InitFlags::FUSE_OVER_IO_URING)
                && config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok()
            {
                granted.store(true, Ordering::Release);
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(error) = self.fs.sync() {
            log::error!("tandemfs: final sync at unmount failed: {error}");
        }
    }

    fn forget(&self, _request: &Request, _inode: INodeNo, _lookups: u64) {
        // The engine keeps no lookup counts (node ids are inode numbers, valid until the inode
        // is reclaimed), so there is nothing to drop; counted so that the requests an unlink
        // costs are visible.
        self.counters.count(RequestKind::Forget);
    }

    fn lookup(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.counters.count(RequestKind::Lookup);
        let name = name_bytes(name);
        // "." and ".." come only from the kernel resolving a file handle (FUSE_EXPORT_SUPPORT),
        // never from a path, and the kernel has already checked the caller's right to do that
        // (open_by_handle_at needs CAP_DAC_READ_SEARCH); "." names any kind of node.
        let from_handle = name == b"." || name == b"..";
        if !from_handle {
            if let Err(errno) = self.check_access(&Caller::of(request), parent.0, EXECUTE) {
                return reply.error(errno);
            }
        }
        let found = if name == b"." { self.fs.get_attributes(parent.0) } else { self.fs.lookup(parent.0, name) };
        match found {
            Ok(attributes) => reply.entry(&CACHE_TIMEOUT, &file_attr(&attributes), Generation(attributes.generation)),
            // A negative entry (inode 0) lets the kernel remember that the name does not
            // exist; creating it later goes through the kernel, which drops that memory.
            Err(Error::NotFound) => {
                let absent = FileAttr {
                    ino: INodeNo(0),
                    size: 0,
                    blocks: 0,
                    atime: UNIX_EPOCH,
                    mtime: UNIX_EPOCH,
                    ctime: UNIX_EPOCH,
                    crtime: UNIX_EPOCH,
                    kind: fuser::FileType::RegularFile,
                    perm: 0,
                    nlink: 0,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    blksize: PREFERRED_IO_BYTES,
                    flags: 0,
                };
                reply.entry(&CACHE_TIMEOUT, &absent, Generation(0))
            }
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn getattr(&self, _request: &Request, inode: INodeNo, _handle: Option<FileHandle>, reply: ReplyAttr) {
        self.counters.count(RequestKind::Getattr);
        match self.fs.get_attributes(inode.0) {
            Ok(attributes) => reply.attr(&CACHE_TIMEOUT, &file_attr(&attributes)),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn setattr(
        &self,
        request: &Request,
        inode: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        access_time: Option<TimeOrNow>,
        modify_time: Option<TimeOrNow>,
        _change_time: Option<SystemTime>,
        handle: Option<FileHandle>,
        _birth_time: Option<SystemTime>,
        _change_time_macos: Option<SystemTime>,
        _backup_time: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        self.counters.count(RequestKind::Setattr);
        // A truncation drops file capabilities whoever truncates (the kernel no longer checks
        // once it marked the file SB_NOSEC-clean; harmless where it already did).
        if size.is_some() {
            if let Err(error) = self.drop_privileges(inode.0, None) {
                return reply.error(fuse_errno(&error));
            }
        }
        let current = match self.fs.get_attributes(inode.0) {
            Ok(current) => current,
            Err(error) => return reply.error(fuse_errno(&error)),
        };
        // FATTR_KILL_SUIDGID (FUSE_HANDLE_KILLPRIV_V2): a chown, or a truncation by a caller
        // without CAP_FSETID. The kernel sends no mode change of its own then; a mode the
        // caller sets explicitly wins. Only removing set-ID bits passes the checks below.
        // Under KILLPRIV_V2 a request that sets nothing at all is the rest of a kill the kernel
        // stripped: chown(-1, -1), or file_remove_privs before a write by a caller without
        // CAP_FSETID (whose WRITE is marked as well).
        let caller = Caller::of(request);
        let nothing_asked = mode.is_none()
            && uid.is_none()
            && gid.is_none()
            && size.is_none()
            && access_time.is_none()
            && modify_time.is_none()
            && handle.is_none();
        let kill = kill_suidgid || (nothing_asked && self.kills_privileges.load(Ordering::Acquire));
        let mode = match mode {
            None if kill && current.file_type == FileType::Regular => {
                let in_group_or_privileged = || caller.is_root() || caller.is_member_of(current.gid);
                Some(without_set_id(current.permissions, in_group_or_privileged))
                    .filter(|kept| *kept != current.permissions)
            }
            mode => mode,
        };
        let changes = SetAttributes {
            permissions: mode.map(|mode| mode & 0o7777),
            uid,
            gid,
            size_bytes: size,
            access_time: access_time.map(time_to_set),
            modify_time: modify_time.map(time_to_set),
        };
        let holds_writable_handle = handle.is_some_and(opened_for_writing);
        let changes = match permissions::check_attribute_change(
            &caller,
            &current,
            changes,
            holds_writable_handle,
            !self.kernel_checks_permissions,
        ) {
            Ok(changes) => changes,
            Err(errno) => return reply.error(Errno::from_i32(errno)),
        };
        match self.fs.set_attributes(inode.0, &changes) {
            Ok(attributes) => reply.attr(&CACHE_TIMEOUT, &file_attr(&attributes)),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn readlink(&self, _request: &Request, inode: INodeNo, reply: ReplyData) {
        self.counters.count(RequestKind::Readlink);
        match self.fs.read_link(inode.0) {
            Ok(target) => reply.data(&target),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn mknod(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.counters.count(RequestKind::Mknod);
        let caller = Caller::of(request);
        if let Err(errno) = self.check_directory_change(&caller, parent.0, None) {
            return reply.error(errno);
        }
        let Some(file_type) = FileType::from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        if file_type == FileType::Directory || file_type == FileType::Symlink {
            return reply.error(Errno::EINVAL);
        }
        // The kernel has already applied the caller's umask to `mode`.
        let result = self.fs.create(
            parent.0,
            name_bytes(name),
            file_type,
            mode & 0o7777,
            caller.uid,
            caller.gid,
            u64::from(rdev),
        );
        self.reply_entry(reply, result);
    }

    fn mkdir(&self, request: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        self.counters.count(RequestKind::Mkdir);
        let caller = Caller::of(request);
        if let Err(errno) = self.check_directory_change(&caller, parent.0, None) {
            return reply.error(errno);
        }
        let result = self.fs.make_directory(parent.0, name_bytes(name), mode & 0o7777, caller.uid, caller.gid);
        self.reply_entry(reply, result);
    }

    fn unlink(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counters.count(RequestKind::Unlink);
        if let Err(errno) = self.check_directory_change(&Caller::of(request), parent.0, Some(name_bytes(name))) {
            return reply.error(errno);
        }
        Self::reply_empty(reply, self.fs.unlink(parent.0, name_bytes(name)));
    }

    fn rmdir(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counters.count(RequestKind::Rmdir);
        if let Err(errno) = self.check_directory_change(&Caller::of(request), parent.0, Some(name_bytes(name))) {
            return reply.error(errno);
        }
        Self::reply_empty(reply, self.fs.remove_directory(parent.0, name_bytes(name)));
    }

    fn symlink(&self, request: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        self.counters.count(RequestKind::Symlink);
        let caller = Caller::of(request);
        if let Err(errno) = self.check_directory_change(&caller, parent.0, None) {
            return reply.error(errno);
        }
        let result =
            self.fs.symlink(parent.0, name_bytes(link_name), target.as_os_str().as_bytes(), caller.uid, caller.gid);
        self.reply_entry(reply, result);
    }

    fn rename(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.counters.count(RequestKind::Rename);
        let mode = if flags.is_empty() {
            RenameMode::Replace
        } else if flags == RenameFlags::RENAME_NOREPLACE {
            RenameMode::NoReplace
        } else if flags == RenameFlags::RENAME_EXCHANGE {
            RenameMode::Exchange
        } else {
            // RENAME_WHITEOUT (overlayfs) and combinations: not supported.
            return reply.error(Errno::EINVAL);
        };
        let caller = Caller::of(request);
        if let Err(errno) = self
            .check_directory_change(&caller, parent.0, Some(name_bytes(name)))
            .and_then(|()| self.check_directory_change(&caller, new_parent.0, Some(name_bytes(new_name))))
        {
            return reply.error(errno);
        }
        Self::reply_empty(reply, self.fs.rename(parent.0, name_bytes(name), new_parent.0, name_bytes(new_name), mode));
    }

    fn link(&self, request: &Request, inode: INodeNo, new_parent: INodeNo, new_name: &OsStr, reply: ReplyEntry) {
        self.counters.count(RequestKind::Link);
        if let Err(errno) = self.check_directory_change(&Caller::of(request), new_parent.0, None) {
            return reply.error(errno);
        }
        let result = self.fs.link(inode.0, new_parent.0, name_bytes(new_name));
        self.reply_entry(reply, result);
    }

    fn open(&self, request: &Request, inode: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.counters.count(RequestKind::Open);
        let mask = match flags.acc_mode() {
            OpenAccMode::O_RDONLY => READ,
            OpenAccMode::O_WRONLY => WRITE,
            OpenAccMode::O_RDWR => READ | WRITE,
        };
        if let Err(errno) = self.check_access(&Caller::of(request), inode.0, mask) {
            return reply.error(errno);
        }
        // O_TRUNC arrives separately as a size change (FUSE_ATOMIC_O_TRUNC is not asked for).
        match self.fs.open_inode(inode.0) {
            Ok(()) => reply.opened(handle_for(flags), FILE_OPEN_FLAGS),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn read(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // In service while the engine copies from the volume, not while the reply is written:
        // a worker whose reply has ended the kernel's request must not count as serving it.
        let in_service = self.counters.read_begins();
        // Over io_uring the data goes straight into the entry's payload buffer, which is where
        // the reply is sent from: no copy between the volume and the kernel's.
        if let Some(mut area) = crate::uring::queue::reply_area(size as usize) {
            let area = area.as_mut_slice();
            let read = self.fs.read(inode.0, offset, area);
            drop(in_service);
            match read {
                Ok(count) => reply.data(&area[..count]),
                Err(error) => reply.error(fuse_errno(&error)),
            }
            return;
        }
        // One buffer per worker thread, reused: a fresh vector per request meant zeroing it,
        // and above 128 KiB an mmap, page faults and munmap, for every read of up to 1 MiB.
        // Bytes past what the engine returned are never sent.
        READ_BUFFER.with_borrow_mut(|buffer| {
            let size = size as usize;
            if buffer.len() < size {
                buffer.resize(size, 0);
            }
            let read = self.fs.read(inode.0, offset, &mut buffer[..size]);
            drop(in_service);
            match read {
                Ok(count) => reply.data(&buffer[..count]),
                Err(error) => reply.error(fuse_errno(&error)),
            }
            if buffer.len() > READ_BUFFER_KEPT_BYTES_MAX {
                *buffer = Vec::new();
            }
        });
    }

    fn write(
        &self,
        request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.counters.count(RequestKind::Write);
        // O_APPEND writes go to the end of the file as the engine knows it. The kernel has
        // computed the offset from its cached size, which is the same unless an insert or
        // collapse changed the size and nobody has asked for attributes since. Write-back of
        // cached pages (FUSE_WRITE_CACHE, from mmap) always has its exact offset.
        let appending = flags.0 & libc::O_APPEND != 0 && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        // Under FUSE_HANDLE_KILLPRIV_V2 the file system drops capabilities and set-ID bits
        // before the data changes, as the kernel's file_remove_privs did; the kernel marks a
        // write by a caller without CAP_FSETID. Page write-back from mmap carries no caller.
        if self.kills_privileges.load(Ordering::Acquire) && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            let caller = Caller::of(request);
            let kill_set_id = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID).then_some(&caller);
            match self.drop_privileges(inode.0, kill_set_id) {
                // The kernel's cached mode still has the bits (a write refreshes only size
                // and times), and exec(2) reads it: drop it now, before the reply.
                Ok(true) => self.invalidate_attributes(inode.0),
                Ok(false) => {}
                Err(error) => return reply.error(fuse_errno(&error)),
            }
        }
        let target = if appending {
            match self.fs.get_attributes(inode.0) {
                Ok(attributes) => attributes.size_bytes,
                Err(error) => return reply.error(fuse_errno(&error)),
            }
        } else {
            offset
        };
        match self.fs.write(inode.0, target, data) {
            Ok(count) => {
                reply.written(count as u32);
                if target != offset {
                    // The kernel put these bytes in its page cache at `offset`: drop those
                    // pages and the cached size. Only after the reply, because the kernel
                    // keeps the pages of a write locked until it is answered.
                    self.invalidate_from(inode.0, offset.min(target));
                }
            }
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn flush(
        &self,
        _request: &Request,
        _inode: INodeNo,
        _handle: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.counters.count(RequestKind::Flush);
        // Only kernels before 5.17 send this (later ones honour FOPEN_NOFLUSH, FILE_OPEN_FLAGS).
        // close(2) promises no durability; fsync does. Nothing is buffered in the adapter, and
        // the engine takes (and checks, space included) every write when it arrives, so a
        // close has nothing to report. ENOSYS makes the kernel stop sending FLUSH for the rest
        // of the mount (it then answers close itself, after writing back dirty mmap pages as
        // before): one round trip less for every close, which is a third of a create.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.counters.count(RequestKind::Release);
        Self::reply_empty(reply, self.fs.release_inode(inode.0));
    }

    fn fsync(&self, _request: &Request, inode: INodeNo, _handle: FileHandle, data_only: bool, reply: ReplyEmpty) {
        self.counters.count(RequestKind::Fsync);
        Self::reply_empty(reply, self.fs.fsync(inode.0, data_only));
    }

    fn opendir(&self, request: &Request, inode: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.counters.count(RequestKind::Opendir);
        if let Err(errno) = self.check_access(&Caller::of(request), inode.0, READ) {
            return reply.error(errno);
        }
        match self.fs.open_inode(inode.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn readdir(&self, _request: &Request, inode: INodeNo, _handle: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.counters.count(RequestKind::Readdir);
        // The kernel's offset is the cookie of the last entry it received; engine cookies stay
        // valid across directory splits, so a listing resumes exactly where it stopped.
        let result = self.fs.read_directory(inode.0, offset, &mut |entry| {
            let full = reply.add(
                INodeNo(entry.inode),
                entry.cookie,
                fuse_file_type(entry.file_type),
                OsStr::from_bytes(&entry.name),
            );
            !full
        });
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn readdirplus(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.counters.count(RequestKind::Readdirplus);
        // Gather a batch of entries first and fetch their attributes after the listing call
        // has returned, so the engine is never re-entered from inside its own directory walk.
        // Entries that do not fit the reply are listed again by the next request, which
        // resumes after the last cookie the kernel received.
        let mut entries = Vec::new();
        let mut estimated_bytes = 0usize;
        let listed = self.fs.read_directory(inode.0, offset, &mut |entry| {
            estimated_bytes += DIRECTORY_PLUS_ENTRY_BYTES + entry.name.len();
            entries.push(entry.clone());
            estimated_bytes < DIRECTORY_PLUS_BATCH_BYTES
        });
        if let Err(error) = listed {
            return reply.error(fuse_errno(&error));
        }
        for entry in entries {
            let attributes = match self.fs.get_attributes(entry.inode) {
                Ok(attributes) => attributes,
                // Removed since the listing: leave it out.
                Err(Error::NotFound) => continue,
                Err(error) => return reply.error(fuse_errno(&error)),
            };
            let full = reply.add(
                INodeNo(entry.inode),
                entry.cookie,
                OsStr::from_bytes(&entry.name),
                &CACHE_TIMEOUT,
                &file_attr(&attributes),
                Generation(attributes.generation),
            );
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.counters.count(RequestKind::Releasedir);
        Self::reply_empty(reply, self.fs.release_inode(inode.0));
    }

    fn fsyncdir(&self, _request: &Request, inode: INodeNo, _handle: FileHandle, data_only: bool, reply: ReplyEmpty) {
        self.counters.count(RequestKind::Fsyncdir);
        Self::reply_empty(reply, self.fs.fsync(inode.0, data_only));
    }

    fn statfs(&self, _request: &Request, _inode: INodeNo, reply: ReplyStatfs) {
        self.counters.count(RequestKind::Statfs);
        match self.fs.statistics() {
            Ok(statistics) => reply.statfs(
                statistics.blocks_total,
                statistics.blocks_free,
                statistics.blocks_free,
                statistics.inodes_total,
                statistics.inodes_free,
                statistics.block_size_bytes,
                statistics.name_max_bytes,
                statistics.block_size_bytes,
            ),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn setxattr(
        &self,
        request: &Request,
        inode: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.counters.count(RequestKind::Setxattr);
        let mode = match flags {
            0 => XattrMode::CreateOrReplace,
            XATTR_CREATE => XattrMode::Create,
            XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        if is_acl_attribute(name_bytes(name)) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        if let Err(errno) = self.check_access(&Caller::of(request), inode.0, WRITE) {
            return reply.error(errno);
        }
        Self::reply_empty(reply, self.fs.set_xattr(inode.0, name_bytes(name), value, mode));
    }

    fn getxattr(&self, request: &Request, inode: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.counters.count(RequestKind::Getxattr);
        if is_acl_attribute(name_bytes(name)) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        if let Err(errno) = self.check_access(&Caller::of(request), inode.0, READ) {
            return reply.error(errno);
        }
        match self.fs.get_xattr(inode.0, name_bytes(name)) {
            // A size-0 request is a probe for the size the caller must allocate.
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
            Ok(value) => reply.data(&value),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn listxattr(&self, request: &Request, inode: INodeNo, size: u32, reply: ReplyXattr) {
        self.counters.count(RequestKind::Listxattr);
        if let Err(errno) = self.check_access(&Caller::of(request), inode.0, READ) {
            return reply.error(errno);
        }
        match self.fs.list_xattr(inode.0) {
            Ok(names) => {
                // The list is the names, each followed by a NUL byte.
                let mut list = Vec::new();
                for name in names {
                    list.extend_from_slice(&name);
                    list.push(0);
                }
                if size == 0 {
                    reply.size(list.len() as u32)
                } else if list.len() > size as usize {
                    reply.error(Errno::from_i32(libc::ERANGE))
                } else {
                    reply.data(&list)
                }
            }
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn removexattr(&self, request: &Request, inode: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counters.count(RequestKind::Removexattr);
        if is_acl_attribute(name_bytes(name)) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        if let Err(errno) = self.check_access(&Caller::of(request), inode.0, WRITE) {
            return reply.error(errno);
        }
        Self::reply_empty(reply, self.fs.remove_xattr(inode.0, name_bytes(name)));
    }

    fn access(&self, request: &Request, inode: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.counters.count(RequestKind::Access);
        // Only called without `default_permissions`. F_OK (mask 0) asks for existence only.
        let wanted = mask.bits() as u32 & (READ | WRITE | EXECUTE);
        match self.fs.get_attributes(inode.0) {
            Ok(attributes) if permissions::allows(&Caller::of(request), &attributes, wanted) => reply.ok(),
            Ok(_) => reply.error(Errno::EACCES),
            Err(error) => reply.error(fuse_errno(&error)),
        }
    }

    fn create(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        kill_suidgid: bool,
        reply: ReplyCreate,
    ) {
        self.counters.count(RequestKind::Create);
        let caller = Caller::of(request);
        if let Err(errno) = self.check_directory_change(&caller, parent.0, None) {
            return reply.error(errno);
        }
        let name = name_bytes(name);
        let created = self.fs.create(parent.0, name, FileType::Regular, mode & 0o7777, caller.uid, caller.gid, 0);
        let attributes = match created {
            Ok(attributes) => attributes,
            // The kernel believed the name was free but another request created it in the
            // meantime: without O_EXCL, open(2) opens the existing file.
            Err(Error::Exists) if flags & libc::O_EXCL == 0 => {
                let existing = match self.fs.lookup(parent.0, name) {
                    Ok(existing) => existing,
                    Err(error) => return reply.error(fuse_errno(&error)),
                };
                if existing.file_type == FileType::Directory {
                    return reply.error(Errno::EISDIR);
                }
                if flags & libc::O_TRUNC != 0 {
                    // FUSE_OPEN_KILL_SUIDGID: an O_TRUNC open by a caller without
                    // CAP_FSETID drops set-ID bits, as truncate(2) would.
                    if let Err(error) = self.drop_privileges(existing.inode, kill_suidgid.then_some(&caller)) {
                        return reply.error(fuse_errno(&error));
                    }
                }
                if flags & libc::O_TRUNC != 0 && existing.size_bytes != 0 {
                    let truncate = SetAttributes { size_bytes: Some(0), ..Default::default() };
                    match self.fs.set_attributes(existing.inode, &truncate) {
                        Ok(attributes) => attributes,
                        Err(error) => return reply.error(fuse_errno(&error)),
                    }
                } else {
                    existing
                }
            }
            Err(error) => return reply.error(fuse_errno(&error)),
        };
        if let Err(error) = self.fs.open_inode(attributes.inode) {
            return reply.error(fuse_errno(&error));
        }
        reply.created(
            &CACHE_TIMEOUT,
            &file_attr(&attributes),
            Generation(attributes.generation),
            handle_for(OpenFlags(flags)),
            FILE_OPEN_FLAGS,
        );
    }

    fn ioctl(
        &self,
        request: &Request,
        inode: INodeNo,
        handle: FileHandle,
        _flags: IoctlFlags,
        command: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.counters.count(RequestKind::Ioctl);
        if command == ioctl::DEFRAG {
            return match self.defrag(inode.0, handle, in_data) {
                Ok(answer) => reply.ioctl(0, &answer.to_bytes()),
                Err(errno) => reply.error(errno),
            };
        }
        if command != ioctl::INSERT && command != ioctl::COLLAPSE {
            // The conventional answer for "this file does not know that ioctl".
            return reply.error(Errno::from_i32(libc::ENOTTY));
        }
        match self.insert_or_collapse(&Caller::of(request), inode.0, handle, command, in_data) {
            Ok(()) => reply.ioctl(0, &[]),
            Err(errno) => reply.error(errno),
        }
    }

    fn fallocate(
        &self,
        request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.counters.count(RequestKind::Fallocate);
        // fallocate(2) drops set-ID bits and capabilities as a write does, but FALLOCATE
        // carries no CAP_FSETID mark, and under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves the
        // change to the file system: anyone but root counts as lacking CAP_FSETID here.
        if self.kills_privileges.load(Ordering::Acquire) {
            let caller = Caller::of(request);
            match self.drop_privileges(inode.0, (!caller.is_root()).then_some(&caller)) {
                Ok(true) => self.invalidate_attributes(inode.0),
                Ok(false) => {}
                Err(error) => return reply.error(fuse_errno(&error)),
            }
        }
        let keep_size = mode & FALLOCATE_KEEP_SIZE != 0;
        let result = match mode & !FALLOCATE_KEEP_SIZE {
            0 => self.fs.allocate(inode.0, offset, length, keep_size),
            // Linux requires KEEP_SIZE with PUNCH_HOLE.
            FALLOCATE_PUNCH_HOLE if keep_size => self.fs.punch_hole(inode.0, offset, length),
            FALLOCATE_ZERO_RANGE => self.fs.zero_range(inode.0, offset, length, keep_size),
            // Today's kernels refuse these two for FUSE before they get here; should one pass
            // them on, the engine does them byte-exactly (and the kernel's cache is dropped).
            FALLOCATE_INSERT_RANGE if !keep_size => {
                // Dirty mmap pages first, as for the ioctl (see `insert_or_collapse`).
                self.invalidate_from(inode.0, offset);
                let result = self.fs.insert_range(inode.0, offset, length);
                self.invalidate_from(inode.0, offset);
                result
            }
            FALLOCATE_COLLAPSE_RANGE if !keep_size => {
                self.invalidate_from(inode.0, offset);
                let result = self.fs.collapse_range(inode.0, offset, length);
                self.invalidate_from(inode.0, offset);
                result
            }
            _ => return reply.error(Errno::from_i32(libc::EOPNOTSUPP)),
        };
        Self::reply_empty(reply, result);
    }

    fn lseek(
        &self,
        _request: &Request,
        inode: INodeNo,
        _handle: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.counters.count(RequestKind::Lseek);
        // The kernel asks only for SEEK_DATA and SEEK_HOLE. The engine does not expose where
        // its holes are, so the whole file counts as data, as POSIX allows: the next data is
        // at `offset`, the next hole is at the end of the file.
        let size = match self.fs.get_attributes(inode.0) {
            Ok(attributes) => attributes.size_bytes,
            Err(error) => return reply.error(fuse_errno(&error)),
        };
        match seek_answer(offset, whence, size) {
            Ok(found) => reply.offset(found),
            Err(errno) => reply.error(errno),
        }
    }
}

/// SEEK_DATA and SEEK_HOLE over a file of `size` bytes that is all data. As on ext4, an offset
/// before the start or at or past the end has no data and no hole after it: ENXIO, not EINVAL
/// (which is for an unknown `whence`).
fn seek_answer(offset: i64, whence: i32, size: u64) -> Result<i64, Errno> {
    if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
        return Err(Errno::EINVAL);
    }
    if offset < 0 || offset as u64 >= size {
        return Err(Errno::ENXIO);
    }
    Ok(if whence == libc::SEEK_DATA { offset } else { i64::try_from(size).unwrap_or(i64::MAX) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeking_outside_the_file_is_no_such_position() {
        for offset in [-1, i64::MIN, 100, 101, i64::MAX] {
            for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
                assert_eq!(seek_answer(offset, whence, 100), Err(Errno::ENXIO), "{offset} {whence}");
            }
        }
        assert_eq!(seek_answer(0, libc::SEEK_DATA, 0), Err(Errno::ENXIO));
        assert_eq!(seek_answer(7, libc::SEEK_DATA, 100), Ok(7));
        assert_eq!(seek_answer(7, libc::SEEK_HOLE, 100), Ok(100));
        assert_eq!(seek_answer(7, libc::SEEK_SET, 100), Err(Errno::EINVAL));
    }

    #[test]
    fn times_round_trip_through_system_time_including_before_1970() {
        for value in [0i64, 1, 1_234_567_891_123_456_789, -1, -1_500_000_000_123] {
            assert_eq!(nanoseconds(system_time(value)), value, "{value}");
        }
    }

    #[test]
    fn times_before_1970_from_the_kernel_keep_their_nanoseconds() {
        // What fuser 0.18 hands over for the kernel's pair (-1 s, 250,000,000 ns).
        let decoded = UNIX_EPOCH - Duration::new(1, 250_000_000);
        assert_eq!(requested_nanoseconds(decoded), -750_000_000);
        assert_eq!(requested_nanoseconds(UNIX_EPOCH - Duration::new(1_000_000_000, 0)), -1_000_000_000_000_000_000);
        assert_eq!(requested_nanoseconds(UNIX_EPOCH + Duration::new(3, 7)), 3_000_000_007);
        assert_eq!(requested_nanoseconds(UNIX_EPOCH - Duration::new(u64::MAX / 2, 0)), i64::MIN);
    }

    #[test]
    fn handles_remember_whether_the_file_was_opened_for_writing() {
        assert!(!opened_for_writing(handle_for(OpenFlags(libc::O_RDONLY))));
        assert!(opened_for_writing(handle_for(OpenFlags(libc::O_WRONLY | libc::O_APPEND))));
        assert!(opened_for_writing(handle_for(OpenFlags(libc::O_RDWR | libc::O_CREAT))));
    }

    #[test]
    fn set_id_bits_are_dropped_as_linux_drops_them() {
        let never_asked = || -> bool { panic!("group membership asked without need") };
        // Set-user-ID always; set-group-ID with group execute, whoever the caller is.
        assert_eq!(without_set_id(0o6777, never_asked), 0o777);
        assert_eq!(without_set_id(0o4755, never_asked), 0o755);
        assert_eq!(without_set_id(0o0755, never_asked), 0o755);
        // Without group execute, set-group-ID stays for members and privileged callers only.
        assert_eq!(without_set_id(0o6766, || true), 0o2766);
        assert_eq!(without_set_id(0o6766, || false), 0o766);
        assert_eq!(without_set_id(0o2644, || false), 0o644);
    }

    #[test]
    fn only_the_two_acl_names_are_refused() {
        assert!(is_acl_attribute(b"system.posix_acl_access"));
        assert!(is_acl_attribute(b"system.posix_acl_default"));
        assert!(!is_acl_attribute(b"user.posix_acl_access"));
        assert!(!is_acl_attribute(b"security.capability"));
    }

    #[test]
    fn attributes_convert_to_fuse_attributes() {
        let attributes = Attributes {
            inode: 42,
            generation: 3,
            file_type: FileType::CharDevice,
            permissions: 0o4755,
            link_count: 2,
            uid: 1000,
            gid: 100,
            size_bytes: 5 << 30,
            blocks_512: 8,
            access_time_ns: 1,
            modify_time_ns: 2,
            change_time_ns: 3,
            birth_time_ns: 4,
            rdev: 0x0103,
        };
        let converted = file_attr(&attributes);
        assert_eq!(converted.ino, INodeNo(42));
        assert_eq!(converted.kind, fuser::FileType::CharDevice);
        assert_eq!(converted.perm, 0o4755);
        assert_eq!(converted.size, 5 << 30);
        assert_eq!(converted.rdev, 0x0103);
        assert_eq!(nanoseconds(converted.mtime), 2);
    }
}
