//! A device backed by a regular file (an image) or a block device.
//!
//! The synchronous path runs on the calling thread, through io_uring where the kernel allows it
//! (`uring.rs`: per-thread rings, O_DIRECT where the medium takes it) and otherwise as plain
//! pread/pwrite/fdatasync. `submit` hands batches to a pool of worker threads (see `worker.rs`),
//! started on first use so that tools which never submit (mkfs, fsck) never start threads; the
//! workers use the same transport.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::uring::{Direction, UringEngine};
use super::worker::{WorkerPool, MAXIMUM_QUEUE_DEPTH_BATCHES, MAXIMUM_WORKER_COUNT};
use super::{check_range, run_batch, Device, IoRequest, IoTicket};
use crate::error::{Error, Result};

/// How to open a [`FileDevice`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileDeviceOptions {
    /// Create the image if it does not exist and make a regular file at least this long
    /// (zero-filled, sparse where the file system allows). An existing longer image is never
    /// shrunk. For a block device it is the smallest acceptable size.
    pub create_size_bytes: Option<u64>,
    /// Take an exclusive `flock` on the image; a second opener that asks for it is refused
    /// with an error that says the image is in use.
    pub lock_exclusive: bool,
    /// Open without write permission; writes fail with `Error::ReadOnly`.
    pub read_only: bool,
}

/// Shape of the I/O path of a [`FileDevice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncOptions {
    /// Worker threads; each owns one queue.
    pub worker_count: usize,
    /// Batches each worker's queue holds before `submit` blocks.
    pub queue_depth_batches: usize,
    /// Which system calls move the bytes. The default picks io_uring when the kernel allows it;
    /// tests and benchmarks force the others.
    pub transport: TransportChoice,
}

impl Default for AsyncOptions {
    fn default() -> AsyncOptions {
        // Two workers keep one request in flight while another completes, which is what a
        // single NVMe queue or a file on a fast SSD needs; more is a per-volume choice.
        // pread/pwrite by default: on the 16-core host's ext4 (a virtio disk) the engine's
        // requests, issued one at a time, ran slower through io_uring with O_DIRECT than
        // through the page cache in every row of `tandem bench device` (sequential write 1,257
        // against 1,581 MiB/s, read 1,040 against 1,365, random 4 KiB writes 19k against 101k
        // IOPS), the page cache absorbing writes that the log's and the checkpoint's flushes
        // make durable in bulk. `Automatic` is for callers that want io_uring where it runs.
        AsyncOptions { worker_count: 2, queue_depth_batches: 64, transport: TransportChoice::Syscalls }
    }
}

/// The transport a [`FileDevice`] should use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransportChoice {
    /// `IoUringDirect` where it pays; pread/pwrite where io_uring or `O_DIRECT` is refused, and
    /// for an image in RAM (tmpfs, ramfs), where io_uring costs a hop to a kernel worker per
    /// request and pread/pwrite are ten times faster (docs/BENCHMARKS.md).
    Automatic,
    /// io_uring with `O_DIRECT` for transfers in whole 4096-byte blocks; the page-cache
    /// transfers (the others) and flushes are pread/pwrite/fdatasync. Pread/pwrite where
    /// io_uring or `O_DIRECT` is refused.
    IoUringDirect,
    /// io_uring for everything, through the page cache (no `O_DIRECT`), flushes included;
    /// pread/pwrite where io_uring is refused.
    IoUringBuffered,
    /// pread/pwrite/fdatasync, as before io_uring: the default (see `AsyncOptions::default`).
    #[default]
    Syscalls,
}

/// Which transport a [`FileDevice`] runs, why, and how its transfers went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportStatistics {
    /// "io_uring" or "pread/pwrite".
    pub name: &'static str,
    /// Whether aligned transfers go through `O_DIRECT` now.
    pub direct: bool,
    /// Why io_uring or `O_DIRECT` is not used, where it was wanted; empty otherwise.
    pub note: String,
    /// Transfers that went direct (through io_uring) and those that went through the page cache
    /// (through the ring with `IoUringBuffered`, else pread/pwrite); not counted (zero) when the
    /// transport is pread/pwrite from the start.
    pub direct_transfers: usize,
    pub buffered_transfers: usize,
}

impl std::fmt::Display for TransportStatistics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}", self.name)?;
        if self.name == "io_uring" {
            let shape = if self.direct { " + O_DIRECT (page-cache transfers: pread/pwrite)" } else { " (page cache)" };
            write!(formatter, "{shape}")?;
        }
        if !self.note.is_empty() {
            write!(formatter, " ({})", self.note)?;
        }
        Ok(())
    }
}

/// A regular file or block device. Dropping it stops its workers (after they finish the
/// batches already queued), then closes the file, which also releases the lock.
pub struct FileDevice {
    // Field order does not matter for shutdown: the pool joins its threads in its own `drop`,
    // and the file closes only when the last `Arc` (the workers hold clones) goes away.
    workers: OnceLock<Option<WorkerPool>>,
    shared: Arc<FileShared>,
    async_options: AsyncOptions,
    /// A second descriptor with `O_DIRECT`, for `read_uncached` and `write_through` on a block
    /// device; opened on first use.
    direct: OnceLock<std::result::Result<File, String>>,
    is_block_device: bool,
}

/// What both the calling threads and the workers use: the open file, its fixed size and the
/// transport.
struct FileShared {
    // Declared before `file`: the rings go before the descriptor they name.
    uring: Option<UringEngine>,
    /// Why io_uring or O_DIRECT is not in use where it was wanted (said once, in the statistics).
    transport_note: String,
    file: File,
    path: PathBuf,
    size_bytes: u64,
    read_only: bool,
}

impl Drop for FileShared {
    fn drop(&mut self) {
        // The lock belongs to the open file description, which a ring being torn down in the
        // kernel may still reference for a moment after the rings are gone: release it
        // explicitly so that the image can be taken again as soon as the device is dropped.
        // Harmless where no lock was taken.
        // SAFETY: the descriptor is open (the file is dropped after this).
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Upper bound on retries of one system call interrupted by signals. A signal storm that
/// outlasts it is reported instead of looping forever.
pub(super) const MAXIMUM_INTERRUPTED_RETRIES: u32 = 1000;

impl FileDevice {
    /// Opens `path` as a device with the default asynchronous shape.
    pub fn open(path: impl AsRef<Path>, options: FileDeviceOptions) -> Result<FileDevice> {
        FileDevice::open_with_async_options(path, options, AsyncOptions::default())
    }

    /// Opens `path` as a device; `async_options` shapes the worker pool behind `submit`.
    pub fn open_with_async_options(
        path: impl AsRef<Path>,
        options: FileDeviceOptions,
        async_options: AsyncOptions,
    ) -> Result<FileDevice> {
        let path = path.as_ref();
        if !(1..=MAXIMUM_WORKER_COUNT).contains(&async_options.worker_count) {
            return Err(Error::invalid(format!(
                "worker count {} outside 1..={MAXIMUM_WORKER_COUNT}",
                async_options.worker_count
            )));
        }
        if !(1..=MAXIMUM_QUEUE_DEPTH_BATCHES).contains(&async_options.queue_depth_batches) {
            return Err(Error::invalid(format!(
                "queue depth {} outside 1..={MAXIMUM_QUEUE_DEPTH_BATCHES}",
                async_options.queue_depth_batches
            )));
        }
        if options.read_only && options.create_size_bytes.is_some() {
            return Err(Error::invalid(format!(
                "{}: cannot create an image while opening it read-only",
                path.display()
            )));
        }

        let file = OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .create(options.create_size_bytes.is_some())
            .truncate(false)
            .open(path)
            .map_err(|error| path_error("open", 0, path, error))?;

        // Lock before anything that could change the image: resizing someone else's live
        // image is exactly what the lock exists to prevent.
        if options.lock_exclusive {
            lock_exclusive(&file, path)?;
        }

        let metadata = file.metadata().map_err(|error| path_error("stat", 0, path, error))?;
        let file_type = metadata.file_type();
        let size_bytes = if file_type.is_block_device() {
            // Linux lets a read-only block device (`losetup -r`, `blockdev --setro`) be opened
            // for writing and fails each write instead: refuse the open, as for a read-only file,
            // so that callers can fall back to a read-only open.
            if !options.read_only && block_device_is_read_only(&file) {
                return Err(path_error(
                    "open",
                    0,
                    path,
                    std::io::Error::new(ErrorKind::ReadOnlyFilesystem, "the block device is read-only"),
                ));
            }
            let size_bytes = block_device_size_bytes(&file, path)?;
            if let Some(wanted) = options.create_size_bytes {
                if wanted > size_bytes {
                    return Err(Error::invalid(format!(
                        "{}: block device holds {size_bytes} bytes, {wanted} were asked for",
                        path.display()
                    )));
                }
            }
            size_bytes
        } else if file_type.is_file() {
            let mut size_bytes = metadata.len();
            if let Some(wanted) = options.create_size_bytes {
                if wanted > size_bytes {
                    file.set_len(wanted).map_err(|error| path_error("resize", wanted, path, error))?;
                    size_bytes = wanted;
                }
            }
            size_bytes
        } else {
            return Err(Error::invalid(format!("{}: neither a regular file nor a block device", path.display())));
        };

        let (uring, transport_note) = match async_options.transport {
            TransportChoice::Syscalls => (None, String::new()),
            TransportChoice::Automatic if file_type.is_file() && is_in_ram(&file) => {
                (None, "the image is in RAM, on tmpfs: pread/pwrite beat io_uring there".to_string())
            }
            choice => {
                let direct = choice != TransportChoice::IoUringBuffered;
                match UringEngine::new(&file, path, options.read_only, direct, !direct) {
                    // Without O_DIRECT this shape sends nothing through the rings.
                    Ok(engine) if direct && !engine.is_direct() => (None, "the medium refuses O_DIRECT".to_string()),
                    Ok(engine) => (Some(engine), String::new()),
                    Err(reason) => (None, reason),
                }
            }
        };

        Ok(FileDevice {
            workers: OnceLock::new(),
            shared: Arc::new(FileShared {
                uring,
                transport_note,
                file,
                path: path.to_path_buf(),
                size_bytes,
                read_only: options.read_only,
            }),
            async_options,
            direct: OnceLock::new(),
            is_block_device: file_type.is_block_device(),
        })
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    pub fn is_read_only(&self) -> bool {
        self.shared.read_only
    }

    /// The transport in use and why, and the transfers it moved; `to_string()` gives the line
    /// that `tandem mount` and the benchmarks print ("io_uring + O_DIRECT", "pread/pwrite
    /// (io_uring refused: ...)").
    pub fn transport(&self) -> TransportStatistics {
        match &self.shared.uring {
            Some(engine) => {
                let (direct_transfers, buffered_transfers) = engine.transfer_counts();
                let direct = engine.is_direct();
                let mut note = self.shared.transport_note.clone();
                if note.is_empty() && !direct && !engine.runs_page_cache_through_ring() {
                    note = "the medium refused an O_DIRECT transfer".to_string();
                }
                let name = if direct || engine.runs_page_cache_through_ring() { "io_uring" } else { "pread/pwrite" };
                TransportStatistics { name, direct, note, direct_transfers, buffered_transfers }
            }
            None => TransportStatistics {
                name: "pread/pwrite",
                direct: false,
                note: self.shared.transport_note.clone(),
                direct_transfers: 0,
                buffered_transfers: 0,
            },
        }
    }

    /// The `O_DIRECT` descriptor of a block device, opened once.
    fn direct_file(&self) -> Result<&File> {
        let opened = self.direct.get_or_init(|| {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .read(true)
                .write(!self.shared.read_only)
                .custom_flags(libc::O_DIRECT)
                .open(&self.shared.path)
                .map_err(|error| error.to_string())
        });
        opened.as_ref().map_err(|error| {
            path_error("open with O_DIRECT", 0, &self.shared.path, std::io::Error::other(error.clone()))
        })
    }

    /// One aligned transfer through the `O_DIRECT` descriptor: `length` bytes at `offset`, both
    /// multiples of `DIRECT_ALIGNMENT_BYTES`.
    fn direct_transfer(&self, offset: u64, read_into: Option<&mut [u8]>, write_from: Option<&[u8]>) -> Result<()> {
        let length = read_into.as_ref().map_or_else(|| write_from.map_or(0, <[u8]>::len), |buffer| buffer.len());
        check_range(self.shared.size_bytes, offset, length, "uncached transfer")?;
        if !offset.is_multiple_of(DIRECT_ALIGNMENT_BYTES as u64)
            || !length.is_multiple_of(DIRECT_ALIGNMENT_BYTES)
            || length == 0
        {
            return Err(Error::invalid(format!(
                "uncached transfer of {length} bytes at {offset} is not in whole {DIRECT_ALIGNMENT_BYTES}-byte blocks"
            )));
        }
        let file = self.direct_file()?;
        let mut aligned = AlignedBuffer::new(length);
        let operation = if write_from.is_some() { "uncached write" } else { "uncached read" };
        if let Some(data) = write_from {
            aligned.bytes_mut().copy_from_slice(data);
        }
        let mut interrupted_retries = 0u32;
        loop {
            // One call moves the whole aligned buffer or fails: O_DIRECT transfers of a few
            // blocks on a block device are not split short.
            let moved = if write_from.is_some() {
                file.write_at(aligned.bytes_mut(), offset)
            } else {
                file.read_at(aligned.bytes_mut(), offset)
            };
            match moved {
                Ok(count) if count == length => break,
                Ok(count) => {
                    return Err(path_error(
                        operation,
                        offset,
                        &self.shared.path,
                        std::io::Error::new(ErrorKind::UnexpectedEof, format!("moved {count} of {length} bytes")),
                    ))
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {
                    interrupted_retries += 1;
                    if interrupted_retries > MAXIMUM_INTERRUPTED_RETRIES {
                        return Err(path_error(operation, offset, &self.shared.path, error));
                    }
                }
                Err(error) => return Err(path_error(operation, offset, &self.shared.path, error)),
            }
        }
        if let Some(buffer) = read_into {
            buffer.copy_from_slice(aligned.bytes_mut());
        }
        Ok(())
    }

    fn worker_pool(&self) -> Option<&WorkerPool> {
        self.workers
            .get_or_init(|| {
                let target: Arc<dyn Device> = self.shared.clone();
                // Failing to start threads (resource limits) is not a reason to fail I/O: the
                // batch then runs on the caller's thread, which gives the same results.
                WorkerPool::start(
                    target,
                    self.async_options.worker_count,
                    self.async_options.queue_depth_batches,
                    "tandemfs-io",
                )
                .ok()
            })
            .as_ref()
    }
}

/// Alignment of `O_DIRECT` transfers: a 4096-byte logical block covers every device we accept.
pub(super) const DIRECT_ALIGNMENT_BYTES: usize = 4096;

/// A heap buffer aligned for `O_DIRECT`.
pub(super) struct AlignedBuffer {
    pointer: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer owns its memory exclusively; moving it between threads moves that ownership.
unsafe impl Send for AlignedBuffer {}

impl AlignedBuffer {
    /// The first byte; valid for the buffer's length while the buffer lives.
    pub(super) fn pointer(&self) -> *mut u8 {
        self.pointer
    }

    pub(super) fn new(length: usize) -> AlignedBuffer {
        assert!(length > 0 && length.is_multiple_of(DIRECT_ALIGNMENT_BYTES));
        let layout = std::alloc::Layout::from_size_align(length, DIRECT_ALIGNMENT_BYTES).expect("valid layout");
        // SAFETY: the layout has a non-zero size; the memory is zeroed, so it is initialised.
        let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
        if pointer.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuffer { pointer, layout }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `pointer` owns `layout.size()` initialised bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.pointer, self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.pointer, self.layout) };
    }
}

impl std::fmt::Debug for FileDevice {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("FileDevice")
            .field("path", &self.shared.path)
            .field("size_bytes", &self.shared.size_bytes)
            .field("read_only", &self.shared.read_only)
            .finish()
    }
}

impl Device for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.shared.size_bytes
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.shared.read_at(offset, buffer)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.shared.write_at(offset, data)
    }

    fn flush(&self) -> Result<()> {
        self.shared.flush()
    }

    fn is_read_only(&self) -> bool {
        self.shared.read_only
    }

    fn read_uncached(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        // A regular file has one page cache, shared by every path to it (hard links, bind
        // mounts, other processes, a loop device reading its backing file): a plain read is
        // current. A block device's own page cache is not updated by writes through the file
        // behind a loop device, so its reads go around it.
        if self.is_block_device {
            self.direct_transfer(offset, Some(buffer), None)
        } else {
            self.shared.read_at(offset, buffer)
        }
    }

    fn write_through(&self, offset: u64, data: &[u8]) -> Result<()> {
        if self.shared.read_only {
            return Err(Error::ReadOnly);
        }
        if self.is_block_device {
            self.direct_transfer(offset, None, Some(data))?;
        } else {
            self.shared.write_at(offset, data)?;
        }
        self.shared.flush()
    }

    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        match self.worker_pool() {
            Some(pool) => pool.submit(batch),
            None => IoTicket::ready(run_batch(self.shared.as_ref(), batch)),
        }
    }
}

impl Device for FileShared {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        check_range(self.size_bytes, offset, buffer.len(), "read")?;
        if let Some(engine) = &self.uring {
            // `None`: this thread has no ring (a resource limit); the syscalls below do the same.
            if let Some(result) =
                engine.transfer(Direction::Read, offset, buffer.as_mut_ptr(), buffer.len(), &self.path)
            {
                return result;
            }
        }
        let mut done_bytes = 0usize;
        let mut interrupted_retries = 0u32;
        // Each pass moves at least one byte or ends with an error, so the loop is bounded by
        // the buffer length plus the retry bound.
        while done_bytes < buffer.len() {
            let position = offset + done_bytes as u64;
            match self.file.read_at(&mut buffer[done_bytes..], position) {
                Ok(0) => {
                    // The image was shortened behind our back: the size checked at open is stale.
                    return Err(path_error(
                        "read",
                        position,
                        &self.path,
                        std::io::Error::new(ErrorKind::UnexpectedEof, "image ends before the device size"),
                    ));
                }
                Ok(count) => done_bytes += count,
                Err(error) if error.kind() == ErrorKind::Interrupted => {
                    interrupted_retries += 1;
                    if interrupted_retries > MAXIMUM_INTERRUPTED_RETRIES {
                        return Err(path_error("read", position, &self.path, error));
                    }
                }
                Err(error) => return Err(path_error("read", position, &self.path, error)),
            }
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        check_range(self.size_bytes, offset, data.len(), "write")?;
        if let Some(engine) = &self.uring {
            // The engine only reads through the pointer of a write.
            let pointer = data.as_ptr().cast_mut();
            if let Some(result) = engine.transfer(Direction::Write, offset, pointer, data.len(), &self.path) {
                return result;
            }
        }
        let mut done_bytes = 0usize;
        let mut interrupted_retries = 0u32;
        while done_bytes < data.len() {
            let position = offset + done_bytes as u64;
            match self.file.write_at(&data[done_bytes..], position) {
                Ok(0) => {
                    // pwrite returning 0 for a non-empty buffer would loop forever if retried.
                    return Err(path_error(
                        "write",
                        position,
                        &self.path,
                        std::io::Error::new(ErrorKind::WriteZero, "device accepted no bytes"),
                    ));
                }
                Ok(count) => done_bytes += count,
                Err(error) if error.kind() == ErrorKind::Interrupted => {
                    interrupted_retries += 1;
                    if interrupted_retries > MAXIMUM_INTERRUPTED_RETRIES {
                        return Err(path_error("write", position, &self.path, error));
                    }
                }
                Err(error) => return Err(path_error("write", position, &self.path, error)),
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        if self.read_only {
            // Nothing was written through this handle, so nothing of ours can be volatile.
            return Ok(());
        }
        if let Some(result) = self.uring.as_ref().and_then(|engine| engine.flush(&self.path)) {
            return result;
        }
        let mut interrupted_retries = 0u32;
        loop {
            // fdatasync: the data and the metadata needed to read it back (the file length),
            // not timestamps.
            match self.file.sync_data() {
                Ok(()) => return Ok(()),
                Err(error) if error.kind() == ErrorKind::Interrupted => {
                    interrupted_retries += 1;
                    if interrupted_retries > MAXIMUM_INTERRUPTED_RETRIES {
                        return Err(path_error("flush", 0, &self.path, error));
                    }
                }
                // Not retried otherwise: after a failed fdatasync the kernel may have dropped
                // the dirty pages, so a second success would not mean the data is durable.
                Err(error) => return Err(path_error("flush", 0, &self.path, error)),
            }
        }
    }
}

/// An I/O error whose message names the image, so a user with several volumes knows which
/// one failed.
pub(super) fn path_error(operation: &'static str, offset: u64, path: &Path, error: std::io::Error) -> Error {
    Error::Io { operation, offset, source: std::io::Error::new(error.kind(), format!("{}: {error}", path.display())) }
}

fn lock_exclusive(file: &File, path: &Path) -> Result<()> {
    let mut interrupted_retries = 0u32;
    loop {
        // flock (not fcntl) locks belong to the open file description, so a second open in
        // this same process is refused too, which is what tests and a double mount need.
        let status = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if status == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        match error.kind() {
            ErrorKind::Interrupted if interrupted_retries < MAXIMUM_INTERRUPTED_RETRIES => {
                interrupted_retries += 1;
            }
            ErrorKind::WouldBlock => {
                return Err(Error::Io {
                    operation: "exclusive lock",
                    offset: 0,
                    source: std::io::Error::new(
                        ErrorKind::WouldBlock,
                        format!(
                            "{}: the image is in use by another process (it holds the exclusive lock)",
                            path.display()
                        ),
                    ),
                });
            }
            _ => return Err(path_error("exclusive lock", 0, path, error)),
        }
    }
}

/// Whether the file lives in RAM (tmpfs, ramfs): `fstatfs`'s magic number. Only asked of
/// regular files: a block device's node lives on devtmpfs whatever its medium.
fn is_in_ram(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: fstatfs writes one struct through the pointer, which outlives the call.
    let mut status: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut status) } != 0 {
        return false;
    }
    matches!(status.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// Whether the block device refuses writes (`BLKROGET`, `_IO(0x12, 94)`); false where unknown.
#[cfg(target_os = "linux")]
fn block_device_is_read_only(file: &File) -> bool {
    const BLKROGET: u64 = (0x12 << 8) | 94;
    let mut read_only: libc::c_int = 0;
    // SAFETY: the kernel writes one int through the pointer, which outlives the call.
    let status = unsafe { libc::ioctl(file.as_raw_fd(), BLKROGET as _, &mut read_only as *mut libc::c_int) };
    status == 0 && read_only != 0
}

#[cfg(not(target_os = "linux"))]
fn block_device_is_read_only(_file: &File) -> bool {
    false
}

/// `BLKGETSIZE64` is `_IOR(0x12, 114, size_t)`; the encoding of the read direction differs on
/// the architectures that inherited it from older Unix ABIs.
#[cfg(target_os = "linux")]
const fn block_get_size_64_request() -> u64 {
    let read_direction: u64 = if cfg!(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "sparc",
        target_arch = "sparc64"
    )) {
        2 << 29
    } else {
        2 << 30
    };
    let argument_size_bytes = std::mem::size_of::<libc::size_t>() as u64;
    read_direction | (argument_size_bytes << 16) | (0x12 << 8) | 114
}

#[cfg(target_os = "linux")]
fn block_device_size_bytes(file: &File, path: &Path) -> Result<u64> {
    let mut size_bytes: u64 = 0;
    // The kernel writes a u64 through the pointer; `size_bytes` outlives the call.
    let status =
        unsafe { libc::ioctl(file.as_raw_fd(), block_get_size_64_request() as _, &mut size_bytes as *mut u64) };
    if status != 0 {
        return Err(path_error("block device size", 0, path, std::io::Error::last_os_error()));
    }
    Ok(size_bytes)
}

#[cfg(not(target_os = "linux"))]
fn block_device_size_bytes(file: &File, path: &Path) -> Result<u64> {
    use std::io::{Seek, SeekFrom};
    // Without BLKGETSIZE64, the end of a block device is where seeking to the end lands.
    let mut handle = file;
    handle.seek(SeekFrom::End(0)).map_err(|error| path_error("block device size", 0, path, error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::IoCompletion;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh path in the temporary directory, removed when dropped.
    struct TemporaryPath(PathBuf);

    impl TemporaryPath {
        fn new(label: &str) -> TemporaryPath {
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanoseconds = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|duration| duration.subsec_nanos())
                .unwrap_or(0);
            TemporaryPath(
                std::env::temp_dir()
                    .join(format!("tandemfs-device-{label}-{}-{unique}-{nanoseconds}.img", std::process::id())),
            )
        }
    }

    impl Drop for TemporaryPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn create(path: &Path, size_bytes: u64) -> FileDevice {
        FileDevice::open(
            path,
            FileDeviceOptions { create_size_bytes: Some(size_bytes), lock_exclusive: false, read_only: false },
        )
        .expect("create image")
    }

    /// Every transport a test runs on. Where the machine refuses io_uring, the first two run as
    /// pread/pwrite and say so (each test prints the transport it got).
    const TRANSPORTS: [TransportChoice; 4] = [
        TransportChoice::Automatic,
        TransportChoice::IoUringDirect,
        TransportChoice::IoUringBuffered,
        TransportChoice::Syscalls,
    ];

    fn create_with(path: &Path, size_bytes: u64, transport: TransportChoice) -> FileDevice {
        let device = FileDevice::open_with_async_options(
            path,
            FileDeviceOptions { create_size_bytes: Some(size_bytes), ..FileDeviceOptions::default() },
            AsyncOptions { transport, ..AsyncOptions::default() },
        )
        .expect("create image");
        eprintln!("{transport:?} on {}: transport {}", path.display(), device.transport());
        device
    }

    fn pattern(length: usize, seed: u8) -> Vec<u8> {
        (0..length).map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn file_round_trip_survives_reopen() {
        let path = TemporaryPath::new("round-trip");
        let data = pattern(10_000, 7);
        {
            let device = create(&path.0, 1 << 20);
            assert_eq!(device.size_bytes(), 1 << 20);
            device.write_at(4093, &data).unwrap();
            device.flush().unwrap();
            let mut buffer = vec![0u8; data.len()];
            device.read_at(4093, &mut buffer).unwrap();
            assert_eq!(buffer, data);
        }
        let device = FileDevice::open(&path.0, FileDeviceOptions { read_only: true, ..Default::default() }).unwrap();
        assert_eq!(device.size_bytes(), 1 << 20);
        let mut buffer = vec![0u8; data.len()];
        device.read_at(4093, &mut buffer).unwrap();
        assert_eq!(buffer, data);
        // Bytes never written read back as zero: the image is created zero-filled.
        let mut untouched = vec![0xffu8; 512];
        device.read_at(0, &mut untouched).unwrap();
        assert!(untouched.iter().all(|&byte| byte == 0));
        assert!(matches!(device.write_at(0, &[1]), Err(Error::ReadOnly)));
    }

    #[test]
    fn file_short_and_long_transfers() {
        for transport in TRANSPORTS {
            short_and_long_transfers(transport);
        }
    }

    fn short_and_long_transfers(transport: TransportChoice) {
        let path = TemporaryPath::new("lengths");
        let size_bytes = 8 << 20;
        let device = create_with(&path.0, size_bytes, transport);
        // Empty, one byte, and a transfer bigger than one pread usually moves at once on
        // some systems; the last one ends exactly at the device end.
        device.write_at(0, &[]).unwrap();
        device.write_at(17, &[0xab]).unwrap();
        let long = pattern(6 << 20, 3);
        let long_offset = size_bytes - long.len() as u64;
        device.write_at(long_offset, &long).unwrap();
        let mut one = [0u8; 1];
        device.read_at(17, &mut one).unwrap();
        assert_eq!(one, [0xab]);
        let mut empty = [0u8; 0];
        device.read_at(size_bytes, &mut empty).unwrap();
        let mut buffer = vec![0u8; long.len()];
        device.read_at(long_offset, &mut buffer).unwrap();
        assert_eq!(buffer, long);
    }

    #[test]
    fn file_out_of_range_is_invalid_argument() {
        for transport in TRANSPORTS {
            out_of_range_is_invalid_argument(transport);
        }
    }

    fn out_of_range_is_invalid_argument(transport: TransportChoice) {
        let path = TemporaryPath::new("range");
        let device = create_with(&path.0, 4096, transport);
        let mut buffer = [0u8; 16];
        assert!(matches!(device.read_at(4090, &mut buffer), Err(Error::InvalidArgument(_))));
        assert!(matches!(device.read_at(u64::MAX - 3, &mut buffer), Err(Error::InvalidArgument(_))));
        assert!(matches!(device.write_at(4096, &[1]), Err(Error::InvalidArgument(_))));
        assert!(matches!(device.write_at(u64::MAX, &[1]), Err(Error::InvalidArgument(_))));
        let completions = device.submit(vec![IoRequest::Read { offset: 8000, buffer: vec![0; 8] }]).wait();
        assert!(matches!(completions, Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn file_second_exclusive_open_is_refused() {
        let path = TemporaryPath::new("lock");
        let options = FileDeviceOptions { create_size_bytes: Some(4096), lock_exclusive: true, read_only: false };
        let first = FileDevice::open(&path.0, options.clone()).unwrap();
        let refused = FileDevice::open(&path.0, options.clone()).expect_err("second exclusive open must fail");
        assert!(
            refused.to_string().contains("in use by another process"),
            "message should say the image is in use: {refused}"
        );
        assert!(matches!(&refused, Error::Io { source, .. } if source.kind() == ErrorKind::WouldBlock));
        // The lock belongs to the open device: once it is gone the image can be taken again.
        drop(first);
        FileDevice::open(&path.0, options).expect("lock released with the device");
    }

    #[test]
    fn file_missing_image_and_bad_options_are_errors() {
        let path = TemporaryPath::new("missing");
        let missing = FileDevice::open(&path.0, FileDeviceOptions::default()).expect_err("no such image");
        assert!(matches!(&missing, Error::Io { source, .. } if source.kind() == ErrorKind::NotFound));
        let conflicting = FileDeviceOptions { create_size_bytes: Some(4096), lock_exclusive: false, read_only: true };
        assert!(matches!(FileDevice::open(&path.0, conflicting), Err(Error::InvalidArgument(_))));
        let no_workers = AsyncOptions { worker_count: 0, queue_depth_batches: 1, ..AsyncOptions::default() };
        assert!(matches!(
            FileDevice::open_with_async_options(&path.0, FileDeviceOptions::default(), no_workers),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn file_existing_image_grows_but_never_shrinks() {
        let path = TemporaryPath::new("resize");
        drop(create(&path.0, 8192));
        assert_eq!(create(&path.0, 4096).size_bytes(), 8192);
        assert_eq!(create(&path.0, 16384).size_bytes(), 16384);
    }

    /// Opt-in, because it needs a block device: set `TANDEMFS_TEST_BLOCK_DEVICE` to one. It is
    /// only opened read-only, and its size must agree with where seeking to its end lands.
    #[test]
    fn file_block_device_size_from_ioctl() {
        use std::io::{Seek, SeekFrom};
        let Some(path) = std::env::var_os("TANDEMFS_TEST_BLOCK_DEVICE") else {
            return;
        };
        let device = FileDevice::open(&path, FileDeviceOptions { read_only: true, ..Default::default() })
            .expect("open block device read-only");
        let mut handle = File::open(&path).unwrap();
        let end_bytes = handle.seek(SeekFrom::End(0)).unwrap();
        assert!(device.size_bytes() > 0);
        assert_eq!(device.size_bytes(), end_bytes);
        let mut last_sector = [0u8; 512];
        device.read_at(device.size_bytes() - 512, &mut last_sector).unwrap();
    }

    #[test]
    fn file_async_batches_complete_in_order() {
        for transport in TRANSPORTS {
            async_batches_complete_in_order(transport);
        }
    }

    fn async_batches_complete_in_order(transport: TransportChoice) {
        let path = TemporaryPath::new("async");
        let device = create_with(&path.0, 1 << 20, transport);
        let mut tickets = Vec::new();
        // Each batch writes, flushes, then reads back the same place; the per-thread queue
        // must keep batches of this thread in submission order, so later batches see earlier
        // writes of the overlapping first block.
        for batch_index in 0..32u64 {
            let data = pattern(4096, batch_index as u8);
            tickets.push(device.submit(vec![
                IoRequest::Write { offset: 0, data: data.clone() },
                IoRequest::Write { offset: 4096 * (batch_index + 1), data: data.clone() },
                IoRequest::Flush,
                IoRequest::Read { offset: 0, buffer: vec![0; 4096] },
                IoRequest::Read { offset: 4096 * (batch_index + 1), buffer: vec![0; 4096] },
            ]));
        }
        for (batch_index, ticket) in tickets.into_iter().enumerate() {
            let expected = pattern(4096, batch_index as u8);
            let completions = ticket.wait().unwrap();
            assert_eq!(completions.len(), 5);
            assert!(matches!(&completions[0], IoCompletion::Write(data) if *data == expected));
            assert!(matches!(&completions[1], IoCompletion::Write(data) if *data == expected));
            assert!(matches!(&completions[2], IoCompletion::Flush));
            assert!(matches!(&completions[3], IoCompletion::Read(data) if *data == expected));
            assert!(matches!(&completions[4], IoCompletion::Read(data) if *data == expected));
        }
        let mut last = vec![0u8; 4096];
        device.read_at(0, &mut last).unwrap();
        assert_eq!(last, pattern(4096, 31));
    }

    #[test]
    fn file_async_stops_at_first_error_and_workers_stop_on_drop() {
        let path = TemporaryPath::new("async-error");
        let device = create(&path.0, 8192);
        let result = device
            .submit(vec![
                IoRequest::Write { offset: 0, data: vec![5; 16] },
                IoRequest::Write { offset: 8190, data: vec![5; 16] },
                IoRequest::Write { offset: 16, data: vec![6; 16] },
            ])
            .wait();
        assert!(matches!(result, Err(Error::InvalidArgument(_))));
        let mut buffer = [0u8; 32];
        device.read_at(0, &mut buffer).unwrap();
        assert_eq!(&buffer[..16], &[5; 16]);
        assert_eq!(&buffer[16..], &[0; 16], "requests after the failed one must not run");

        // A ticket left unwaited must not keep the device from closing: drop joins the
        // workers after they drained their queues.
        let pending = device.submit(vec![IoRequest::Write { offset: 32, data: vec![7; 8] }]);
        drop(device);
        assert!(pending.wait().is_ok());
        let reopened = create(&path.0, 8192);
        let mut written = [0u8; 8];
        reopened.read_at(32, &mut written).unwrap();
        assert_eq!(written, [7; 8]);
    }

    #[test]
    fn file_async_from_many_threads() {
        for transport in TRANSPORTS {
            async_from_many_threads(transport);
        }
    }

    fn async_from_many_threads(transport: TransportChoice) {
        let path = TemporaryPath::new("async-threads");
        let device = Arc::new(create_with(&path.0, 1 << 20, transport));
        let threads: Vec<_> = (0..4u64)
            .map(|thread_index| {
                let device = Arc::clone(&device);
                std::thread::spawn(move || {
                    for round in 0..50u64 {
                        let offset = thread_index * 65536 + (round % 16) * 4096;
                        let data = pattern(4096, (thread_index * 50 + round) as u8);
                        let completions = device
                            .submit(vec![
                                IoRequest::Write { offset, data: data.clone() },
                                IoRequest::Read { offset, buffer: vec![0; 4096] },
                            ])
                            .wait()
                            .unwrap();
                        assert!(matches!(&completions[1], IoCompletion::Read(read) if *read == data));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }

    /// One random transfer: half in whole 4096-byte blocks (the direct path where there is one,
    /// up to 1.25 MiB so that one request keeps every bounce buffer busy), half at any byte.
    fn random_extent(random: &mut rand::rngs::SmallRng, size_bytes: usize) -> (usize, usize) {
        use rand::Rng;
        if random.gen_bool(0.5) {
            let blocks = size_bytes / 4096;
            let start = random.gen_range(0..blocks);
            let count = random.gen_range(1..=(blocks - start).min(320));
            (start * 4096, count * 4096)
        } else {
            let offset = random.gen_range(0..=size_bytes);
            let length = random.gen_range(0..=(size_bytes - offset).min(300_000));
            (offset, length)
        }
    }

    /// Random writes, reads and flushes, through the synchronous calls and through batches,
    /// checked against a model of the image on every read and once more after a reopen.
    fn random_round_trips(transport: TransportChoice, seed: u64) {
        use rand::{Rng, RngCore, SeedableRng};
        let path = TemporaryPath::new("model");
        let size_bytes = 4usize << 20;
        let mut model = vec![0u8; size_bytes];
        let device = create_with(&path.0, size_bytes as u64, transport);
        let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
        for step in 0..300 {
            let (offset, length) = random_extent(&mut random, size_bytes);
            let batched = step % 3 == 0;
            match random.gen_range(0..5) {
                0 | 1 => {
                    let mut data = vec![0u8; length];
                    random.fill_bytes(&mut data);
                    model[offset..offset + length].copy_from_slice(&data);
                    if batched {
                        device.submit(vec![IoRequest::Write { offset: offset as u64, data }]).wait().unwrap();
                    } else {
                        device.write_at(offset as u64, &data).unwrap();
                    }
                }
                2 | 3 => {
                    let read = if batched {
                        let request = IoRequest::Read { offset: offset as u64, buffer: vec![0xee; length] };
                        match device.submit(vec![request]).wait().unwrap().pop() {
                            Some(IoCompletion::Read(buffer)) => buffer,
                            other => panic!("a read completed as {other:?}"),
                        }
                    } else {
                        let mut buffer = vec![0xee; length];
                        device.read_at(offset as u64, &mut buffer).unwrap();
                        buffer
                    };
                    assert!(read == model[offset..offset + length], "step {step}: {length} bytes at {offset} differ");
                }
                _ => device.flush().unwrap(),
            }
        }
        device.flush().unwrap();
        let statistics = device.transport();
        eprintln!("{transport:?}: {statistics:?}");
        if statistics.name == "io_uring" && statistics.direct {
            assert!(statistics.direct_transfers > 0 && statistics.buffered_transfers > 0, "{statistics:?}");
        }
        drop(device);
        let reopened = FileDevice::open_with_async_options(
            &path.0,
            FileDeviceOptions { read_only: true, ..FileDeviceOptions::default() },
            AsyncOptions { transport: TransportChoice::Syscalls, ..AsyncOptions::default() },
        )
        .unwrap();
        let mut image = vec![0u8; size_bytes];
        reopened.read_at(0, &mut image).unwrap();
        assert!(image == model, "{transport:?}: the reopened image differs from the model");
    }

    #[test]
    fn file_random_round_trips_match_a_model_on_every_transport() {
        for (index, transport) in TRANSPORTS.into_iter().enumerate() {
            random_round_trips(transport, 0x7a4d_0000 + index as u64);
        }
    }

    #[test]
    fn file_concurrent_threads_match_their_models_on_every_transport() {
        use rand::{Rng, RngCore, SeedableRng};
        for transport in TRANSPORTS {
            let path = TemporaryPath::new("threads-model");
            let region_bytes = 1usize << 20;
            let thread_count = 4;
            let device = Arc::new(create_with(&path.0, (region_bytes * thread_count) as u64, transport));
            // More threads than rings share rings: each thread owns one region and its model.
            let threads: Vec<_> = (0..thread_count)
                .map(|thread_index| {
                    let device = Arc::clone(&device);
                    std::thread::spawn(move || {
                        let base = thread_index * region_bytes;
                        let mut model = vec![0u8; region_bytes];
                        let mut random = rand::rngs::SmallRng::seed_from_u64(thread_index as u64);
                        for _ in 0..150 {
                            let (offset, length) = random_extent(&mut random, region_bytes);
                            if random.gen_bool(0.5) {
                                let mut data = vec![0u8; length];
                                random.fill_bytes(&mut data);
                                model[offset..offset + length].copy_from_slice(&data);
                                device.write_at((base + offset) as u64, &data).unwrap();
                            } else {
                                let mut buffer = vec![0u8; length];
                                device.read_at((base + offset) as u64, &mut buffer).unwrap();
                                assert!(buffer == model[offset..offset + length]);
                            }
                        }
                        device.flush().unwrap();
                        model
                    })
                })
                .collect();
            let models: Vec<Vec<u8>> = threads.into_iter().map(|thread| thread.join().unwrap()).collect();
            let mut image = vec![0u8; region_bytes * thread_count];
            device.read_at(0, &mut image).unwrap();
            assert!(image == models.concat(), "{transport:?}: the image differs from the threads' models");
        }
    }

    #[test]
    fn file_shortened_image_reads_are_eof_errors_on_every_transport() {
        for transport in TRANSPORTS {
            let path = TemporaryPath::new("shortened");
            let device = create_with(&path.0, 1 << 20, transport);
            device.write_at(0, &pattern(1 << 20, 9)).unwrap();
            device.flush().unwrap();
            OpenOptions::new().write(true).open(&path.0).unwrap().set_len(512 << 10).unwrap();
            // Aligned (direct where there is one: its piece comes back short) and unaligned.
            for (offset, length) in [((512 << 10) - 4096, 8192usize), ((512 << 10) - 100, 300)] {
                let mut buffer = vec![0u8; length];
                let error = device.read_at(offset, &mut buffer).expect_err("a read past the shortened end");
                assert!(
                    matches!(&error, Error::Io { operation: "read", offset: at, source }
                        if source.kind() == ErrorKind::UnexpectedEof && *at == 512 << 10),
                    "{transport:?}: {error:?}"
                );
            }
            let mut inside = vec![0u8; 4096];
            device.read_at((512 << 10) - 4096, &mut inside).unwrap();
            assert_eq!(inside, pattern(1 << 20, 9)[(512 << 10) - 4096..512 << 10]);
        }
    }

    #[test]
    fn file_falls_back_to_syscalls_when_io_uring_is_refused() {
        let path = TemporaryPath::new("refused");
        super::super::uring::tests_hooks::REFUSE_RINGS.with(|refuse| refuse.set(true));
        let device = create_with(&path.0, 1 << 20, TransportChoice::IoUringDirect);
        super::super::uring::tests_hooks::REFUSE_RINGS.with(|refuse| refuse.set(false));
        let statistics = device.transport();
        assert_eq!(statistics.name, "pread/pwrite");
        assert!(statistics.note.contains("io_uring refused"), "the reason is said: {statistics:?}");
        assert!(device.transport().to_string().starts_with("pread/pwrite (io_uring refused"));
        let data = pattern(8192, 4);
        device.write_at(4096, &data).unwrap();
        device.flush().unwrap();
        let mut buffer = vec![0u8; data.len()];
        device.read_at(4096, &mut buffer).unwrap();
        assert_eq!(buffer, data);

        let forced = create_with(&path.0, 1 << 20, TransportChoice::Syscalls);
        assert_eq!(forced.transport().to_string(), "pread/pwrite");
    }

    #[test]
    fn file_direct_refused_at_transfer_falls_back_to_the_page_cache() {
        let path = TemporaryPath::new("direct-refused");
        let device = create_with(&path.0, 1 << 20, TransportChoice::IoUringDirect);
        if !device.transport().direct {
            eprintln!("skipped: no O_DIRECT here ({})", device.transport());
            return;
        }
        let data = pattern(65536, 2);
        super::super::uring::tests_hooks::REFUSE_DIRECT.with(|refuse| refuse.set(true));
        let written = device.write_at(65536, &data);
        super::super::uring::tests_hooks::REFUSE_DIRECT.with(|refuse| refuse.set(false));
        written.unwrap();
        let statistics = device.transport();
        assert!(!statistics.direct, "direct transfers are off after a refusal: {statistics:?}");
        assert_eq!(statistics.buffered_transfers, 1);
        let mut buffer = vec![0u8; data.len()];
        device.read_at(65536, &mut buffer).unwrap();
        assert_eq!(buffer, data);
        assert_eq!(device.transport().direct_transfers, 0);
    }

    /// tmpfs takes `O_DIRECT` on some kernels and refuses it on others; either way every
    /// transfer, aligned or not, must work there.
    #[test]
    fn file_transports_work_on_tmpfs() {
        let directory = Path::new("/dev/shm");
        if !directory.is_dir() {
            eprintln!("skipped: no /dev/shm");
            return;
        }
        for transport in TRANSPORTS {
            let path = TemporaryPath(directory.join(format!("tandemfs-device-tmpfs-{}.img", std::process::id())));
            let device = create_with(&path.0, 2 << 20, transport);
            if transport == TransportChoice::Automatic {
                assert_eq!(device.transport().name, "pread/pwrite", "tmpfs is RAM: {}", device.transport());
            }
            for (offset, length) in [(0u64, 1usize << 20), (4093, 10_000), (8192, 4096)] {
                let data = pattern(length, offset as u8);
                device.write_at(offset, &data).unwrap();
                let mut buffer = vec![0u8; length];
                device.read_at(offset, &mut buffer).unwrap();
                assert_eq!(buffer, data, "{transport:?}: {length} bytes at {offset}");
            }
            device.flush().unwrap();
        }
    }
}
