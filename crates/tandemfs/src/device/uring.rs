//! The io_uring transport of `FileDevice`: reads, writes and flushes submitted through io_uring
//! rings instead of pread/pwrite/fdatasync system calls.
//!
//! Shape: a small pool of rings (one per core, 2 to 8), each behind its own lock. A thread is
//! bound to one ring for its whole life (threads take ring slots round-robin the first time they
//! do I/O), in the spirit of testFS's per-thread submission queues: threads of different slots
//! never meet, and threads that share a slot queue behind each other. A ring is built the first
//! time its slot is used, so a tool that does little I/O builds one ring.
//!
//! Requests run one after another, exactly as on the syscall path (a later request of a batch
//! sees an earlier one's writes; a batch stops at its first failure). Inside one request, an
//! aligned transfer (offset and length multiples of 4096) goes through the `O_DIRECT`
//! descriptor when the medium accepts `O_DIRECT`: it is cut into 128 KiB pieces, copied through
//! the ring's registered (pinned, 4096-aligned) bounce buffers, with up to 8 pieces in flight, so
//! one large request keeps the device's queue full. Any other transfer goes through the buffered
//! descriptor straight from the caller's buffer. The kernel keeps the two descriptors coherent
//! (a direct transfer writes back and drops the page-cache pages of its range), and the engine
//! never has two transfers of one range in flight at once. If the medium accepted `O_DIRECT` at
//! open but refuses a direct transfer (`EINVAL`), direct transfers are turned off for the device
//! and the request is redone buffered.
//!
//! Durability is the syscall path's: a transfer is acknowledged only when every piece of it has
//! completed, short transfers are continued (a read that ends early, a write that moves nothing,
//! are the same errors as on the syscall path), and a flush is `IORING_OP_FSYNC` with
//! `IORING_FSYNC_DATASYNC` (fdatasync), never retried into a false success after a failure.
//!
//! Memory safety: the kernel writes into buffers named by in-flight entries, so no function here
//! returns while one of its entries is in flight; a ring that cannot be waited on any more (the
//! wait itself fails with an unexpected error) is a fatal error, because returning would hand
//! memory the kernel may still write to back to the caller.

use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::Mutex;

use super::file::{path_error, AlignedBuffer, DIRECT_ALIGNMENT_BYTES, MAXIMUM_INTERRUPTED_RETRIES};
use crate::error::Result;

/// Bytes of one bounce buffer, i.e. of one direct piece in flight.
const PIECE_BYTES: usize = 128 << 10;
/// Bounce buffers per ring: the most direct pieces in flight for one request.
const PIECES_IN_FLIGHT: usize = 8;
/// Submission queue entries per ring: every piece in flight plus headroom.
const RING_ENTRIES: u32 = 32;
/// Largest buffered transfer handed to the kernel at once (io_uring lengths are 32-bit).
const MAXIMUM_BUFFERED_PIECE_BYTES: usize = 1 << 30;
/// Bounds on the ring pool.
const MINIMUM_RING_COUNT: usize = 2;
const MAXIMUM_RING_COUNT: usize = 8;

/// Index of the buffered descriptor among the registered files, and of the direct one.
const BUFFERED_FILE_INDEX: u32 = 0;
const DIRECT_FILE_INDEX: u32 = 1;

/// A descriptor as an entry names it: an index into the ring's registered files, or the raw fd.
#[derive(Clone, Copy)]
enum FileRef {
    Fixed(u32),
    Raw(RawFd),
}

/// Builds opcode `$op` on `$file` with the remaining constructor arguments.
macro_rules! target_entry {
    ($file:expr, $op:ident $(, $argument:expr)*) => {
        match $file {
            FileRef::Fixed(index) => opcode::$op::new(types::Fixed(index) $(, $argument)*),
            FileRef::Raw(raw) => opcode::$op::new(types::Fd(raw) $(, $argument)*),
        }
    };
}

/// What one completion says about a read or write.
enum Outcome {
    Moved(usize),
    Retry,
    Failed(std::io::Error),
}
use Outcome::{Failed, Moved, Retry};

/// Maps a completion's result to the syscall path's outcomes: zero bytes is end of file for a
/// read and a refused write; EINTR and EAGAIN are retried.
fn classify(direction: Direction, result: i32) -> Outcome {
    if result > 0 {
        return Moved(result as usize);
    }
    if result == 0 {
        return Failed(match direction {
            Direction::Read => std::io::Error::new(ErrorKind::UnexpectedEof, "image ends before the device size"),
            Direction::Write => std::io::Error::new(ErrorKind::WriteZero, "device accepted no bytes"),
        });
    }
    let error = std::io::Error::from_raw_os_error(-result);
    match error.raw_os_error() {
        Some(libc::EINTR) | Some(libc::EAGAIN) => Retry,
        _ => Failed(error),
    }
}

/// Keeps the failure at the lowest offset: the one the syscall path would have hit first.
fn keep_first(first: &mut Option<(u64, std::io::Error)>, position: u64, error: std::io::Error) {
    if first.as_ref().is_none_or(|(kept, _)| position < *kept) {
        *first = Some((position, error));
    }
}

/// Start and length of direct piece `piece` of a `length`-byte transfer.
fn piece_extent(piece: usize, length: usize) -> (usize, usize) {
    let start = piece * PIECE_BYTES;
    assert!(start < length, "piece {piece} beyond a {length}-byte transfer");
    (start, PIECE_BYTES.min(length - start))
}

/// Source of ring slots, shared by every device: each thread takes the next slot the first time
/// it does I/O through any io_uring device.
static NEXT_RING_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static RING_SLOT: usize = NEXT_RING_SLOT.fetch_add(1, Ordering::Relaxed);
}

/// What a transfer does with its bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    Read,
    Write,
}

impl Direction {
    fn operation(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
        }
    }
}

/// The io_uring engine of one open image.
pub(crate) struct UringEngine {
    rings: Vec<Mutex<Option<Ring>>>,
    buffered_fd: RawFd,
    /// The `O_DIRECT` descriptor, when the medium accepted one at open.
    direct: Option<File>,
    /// Cleared for good when the medium refuses a direct transfer it accepted at open.
    direct_enabled: AtomicBool,
    /// Whether page-cache transfers and flushes go through the rings (else pread/pwrite/fdatasync).
    page_cache_through_ring: bool,
    /// Counters for the statistics: transfers that went direct, and those that went buffered.
    direct_transfers: AtomicUsize,
    buffered_transfers: AtomicUsize,
}

/// One ring with its bounce buffers.
struct Ring {
    ring: IoUring,
    bounce: Vec<AlignedBuffer>,
    /// Whether the bounce buffers are registered (READ_FIXED/WRITE_FIXED) and the descriptors
    /// are registered files; where the kernel refuses (a locked-memory limit), plain entries.
    registered_buffers: bool,
    registered_files: bool,
    /// The buffered descriptor and the direct one (-1 when there is none).
    descriptors: [RawFd; 2],
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel tears a ring down asynchronously, and registered files keep their open file
        // descriptions alive until it has: the image's exclusive lock would outlive the device.
        // Unregistering drops those references now (nothing is in flight between calls).
        if self.registered_files {
            let _ = self.ring.submitter().unregister_files();
        }
    }
}

/// A second descriptor on the image with `O_DIRECT`, or `None` where the medium refuses it. The
/// path is opened again, so the new descriptor must be checked to name the same file: an image
/// renamed or replaced in between would otherwise take the direct writes.
fn open_direct(file: &File, path: &Path, read_only: bool) -> Option<File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let direct =
        std::fs::OpenOptions::new().read(true).write(!read_only).custom_flags(libc::O_DIRECT).open(path).ok()?;
    let (original, reopened) = (file.metadata().ok()?, direct.metadata().ok()?);
    (original.dev() == reopened.dev() && original.ino() == reopened.ino()).then_some(direct)
}

/// The outcome of a direct attempt that the medium refused: redo buffered.
struct DirectRefused;

impl UringEngine {
    /// Builds the engine for `file`, or says why io_uring cannot be used. `try_direct` asks for
    /// an `O_DIRECT` descriptor (refused quietly by media without it, such as old tmpfs).
    pub(crate) fn new(
        file: &File,
        path: &Path,
        read_only: bool,
        try_direct: bool,
        page_cache_through_ring: bool,
    ) -> std::result::Result<UringEngine, String> {
        let direct = if try_direct { open_direct(file, path, read_only) } else { None };
        let ring_count = std::thread::available_parallelism()
            .map_or(MINIMUM_RING_COUNT, |count| count.get())
            .clamp(MINIMUM_RING_COUNT, MAXIMUM_RING_COUNT);
        let mut rings: Vec<Mutex<Option<Ring>>> = (0..ring_count).map(|_| Mutex::new(None)).collect();
        // The first ring is the probe: containers often refuse io_uring_setup (seccomp, or the
        // sysctl kernel.io_uring_disabled), and then the device uses the syscalls.
        let first = Ring::build(file.as_raw_fd(), direct.as_ref().map(AsRawFd::as_raw_fd))
            .map_err(|error| format!("io_uring refused: {error}"))?;
        rings[0] = Mutex::new(Some(first));
        Ok(UringEngine {
            rings,
            buffered_fd: file.as_raw_fd(),
            direct_enabled: AtomicBool::new(direct.is_some()),
            page_cache_through_ring,
            direct,
            direct_transfers: AtomicUsize::new(0),
            buffered_transfers: AtomicUsize::new(0),
        })
    }

    /// Whether aligned transfers go through `O_DIRECT` now.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct_enabled.load(Ordering::Relaxed)
    }

    /// Transfers that went direct and buffered since open.
    pub(crate) fn transfer_counts(&self) -> (usize, usize) {
        (self.direct_transfers.load(Ordering::Relaxed), self.buffered_transfers.load(Ordering::Relaxed))
    }

    /// Runs `work` on the calling thread's ring, building the ring on first use. `None` when that
    /// ring cannot be built (a resource limit reached after open): the caller then uses the
    /// syscall path, which gives the same results.
    fn with_ring<T>(&self, work: impl FnOnce(&mut Ring) -> T) -> Option<T> {
        let slot = RING_SLOT.with(|slot| *slot) % self.rings.len();
        let mut guard = self.rings[slot].lock();
        if guard.is_none() {
            let direct_fd = self.direct.as_ref().map(AsRawFd::as_raw_fd);
            *guard = Some(Ring::build(self.buffered_fd, direct_fd).ok()?);
        }
        guard.as_mut().map(work)
    }

    /// Reads or writes `length` bytes at `offset` between the file and `pointer`. The caller
    /// checked the range and owns the buffer for the whole call. `None`: no ring for this thread.
    pub(crate) fn transfer(
        &self,
        direction: Direction,
        offset: u64,
        pointer: *mut u8,
        length: usize,
        path: &Path,
    ) -> Option<Result<()>> {
        if length == 0 {
            return Some(Ok(()));
        }
        let aligned =
            offset.is_multiple_of(DIRECT_ALIGNMENT_BYTES as u64) && length.is_multiple_of(DIRECT_ALIGNMENT_BYTES);
        if aligned && self.is_direct() {
            // `?`: no ring for this thread, the syscalls do it.
            let attempt = self.with_ring(|ring| {
                #[cfg(test)]
                if tests_hooks::REFUSE_DIRECT.with(std::cell::Cell::get) {
                    return Err(DirectRefused);
                }
                ring.direct_transfer(direction, offset, pointer, length, path)
            })?;
            match attempt {
                Ok(result) => {
                    self.direct_transfers.fetch_add(1, Ordering::Relaxed);
                    return Some(result);
                }
                // Turned off for the whole device: a medium that refuses one aligned direct
                // transfer refuses them all, and retrying each costs a round trip.
                Err(DirectRefused) => self.direct_enabled.store(false, Ordering::Relaxed),
            }
        }
        self.buffered_transfers.fetch_add(1, Ordering::Relaxed);
        if !self.page_cache_through_ring {
            // A page-cache transfer gains nothing from a ring when the caller waits for it, and
            // costs a hop to a kernel worker where the file system cannot do it without
            // blocking: pread/pwrite do it (measured in docs/BENCHMARKS.md).
            return None;
        }
        self.with_ring(|ring| ring.buffered_transfer(direction, offset, pointer, length, path))
    }

    /// fdatasync through the ring. `None`: the syscall does it (no ring for this thread, or
    /// page-cache work is not sent through the ring).
    pub(crate) fn flush(&self, path: &Path) -> Option<Result<()>> {
        if !self.page_cache_through_ring {
            return None;
        }
        self.with_ring(|ring| ring.flush(path))
    }

    /// Whether page-cache transfers and flushes go through the rings too.
    pub(crate) fn runs_page_cache_through_ring(&self) -> bool {
        self.page_cache_through_ring
    }
}

impl Ring {
    fn build(buffered_fd: RawFd, direct_fd: Option<RawFd>) -> std::io::Result<Ring> {
        #[cfg(test)]
        if tests_hooks::REFUSE_RINGS.with(std::cell::Cell::get) {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        let ring = IoUring::new(RING_ENTRIES)?;
        let bounce: Vec<AlignedBuffer> = if direct_fd.is_some() {
            (0..PIECES_IN_FLIGHT).map(|_| AlignedBuffer::new(PIECE_BYTES)).collect()
        } else {
            Vec::new()
        };
        let mut registered_buffers = false;
        if !bounce.is_empty() {
            let vectors: Vec<libc::iovec> = bounce
                .iter()
                .map(|buffer| libc::iovec { iov_base: buffer.pointer().cast(), iov_len: PIECE_BYTES })
                .collect();
            // SAFETY: the buffers live as long as the ring (both are fields of this `Ring`, and
            // the ring is dropped first: it is declared first).
            registered_buffers = unsafe { ring.submitter().register_buffers(&vectors) }.is_ok();
        }
        let files: Vec<RawFd> = std::iter::once(buffered_fd).chain(direct_fd).collect();
        let registered_files = ring.submitter().register_files(&files).is_ok();
        Ok(Ring {
            ring,
            bounce,
            registered_buffers,
            registered_files,
            descriptors: [buffered_fd, direct_fd.unwrap_or(-1)],
        })
    }

    /// Pushes `entry` tagged with `user_data` and submits it; no wait.
    fn push(&mut self, entry: squeue::Entry, user_data: u64) {
        let entry = entry.user_data(user_data);
        // SAFETY: every entry names memory that its caller keeps alive until its completion is
        // reaped (see `wait_one`), and no caller pushes more than the ring holds.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        assert!(pushed.is_ok(), "io_uring submission queue overflow: more than {RING_ENTRIES} entries in flight");
    }

    /// Submits what was pushed and waits for one completion: (user_data, result).
    fn wait_one(&mut self) -> (u64, i32) {
        let mut interrupted_retries = 0u32;
        loop {
            if let Some(completion) = self.ring.completion().next() {
                return (completion.user_data(), completion.result());
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(error)
                    if matches!(error.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)) =>
                {
                    interrupted_retries += 1;
                    assert!(
                        interrupted_retries <= MAXIMUM_INTERRUPTED_RETRIES * 10,
                        "io_uring wait kept failing with {error} while I/O was in flight"
                    );
                }
                // Returning would free memory the kernel may still write: fatal.
                Err(error) => panic!("io_uring wait failed with I/O in flight: {error}"),
            }
        }
    }

    fn file(&self, index: u32) -> FileRef {
        if self.registered_files {
            FileRef::Fixed(index)
        } else {
            FileRef::Raw(self.descriptors[index as usize])
        }
    }

    fn buffered_transfer(
        &mut self,
        direction: Direction,
        offset: u64,
        pointer: *mut u8,
        length: usize,
        path: &Path,
    ) -> Result<()> {
        let mut done_bytes = 0usize;
        let mut interrupted_retries = 0u32;
        // Each pass moves at least one byte or ends with an error: bounded by the length plus
        // the retry bound.
        while done_bytes < length {
            let position = offset + done_bytes as u64;
            let piece_bytes = (length - done_bytes).min(MAXIMUM_BUFFERED_PIECE_BYTES) as u32;
            // SAFETY (of the pointer arithmetic): `done_bytes < length`, inside the caller's buffer.
            let piece_pointer = unsafe { pointer.add(done_bytes) };
            let file = self.file(BUFFERED_FILE_INDEX);
            let entry = match direction {
                Direction::Read => target_entry!(file, Read, piece_pointer, piece_bytes).offset(position).build(),
                Direction::Write => {
                    target_entry!(file, Write, piece_pointer.cast_const(), piece_bytes).offset(position).build()
                }
            };
            self.push(entry, 0);
            let (_, result) = self.wait_one();
            match classify(direction, result) {
                Moved(count) => done_bytes += count,
                Retry => {
                    interrupted_retries += 1;
                    if interrupted_retries > MAXIMUM_INTERRUPTED_RETRIES {
                        return Err(path_error(
                            direction.operation(),
                            position,
                            path,
                            std::io::Error::from_raw_os_error(libc::EINTR),
                        ));
                    }
                }
                Failed(error) => return Err(path_error(direction.operation(), position, path, error)),
            }
        }
        Ok(())
    }

    /// Direct transfer through the bounce buffers, up to `PIECES_IN_FLIGHT` pieces at once.
    /// `Err(DirectRefused)` when the medium refuses direct I/O before anything moved.
    fn direct_transfer(
        &mut self,
        direction: Direction,
        offset: u64,
        pointer: *mut u8,
        length: usize,
        path: &Path,
    ) -> std::result::Result<Result<()>, DirectRefused> {
        let piece_count = length.div_ceil(PIECE_BYTES);
        let mut next_piece = 0usize;
        let mut in_flight = 0usize;
        // Which piece each bounce buffer holds, and how many retries the transfer used.
        let mut slot_piece = [usize::MAX; PIECES_IN_FLIGHT];
        let mut interrupted_retries = 0u32;
        let mut refused = false;
        // The first failure by offset, and pieces that came back short (finished buffered).
        let mut first_failure: Option<(u64, std::io::Error)> = None;
        let mut short_pieces: Vec<(usize, usize)> = Vec::new();
        // Bounded: each pass either submits a piece or reaps one, and a piece is resubmitted
        // only on EINTR/EAGAIN, at most MAXIMUM_INTERRUPTED_RETRIES times in all.
        loop {
            let stop_submitting = refused || first_failure.is_some();
            while !stop_submitting && next_piece < piece_count && in_flight < PIECES_IN_FLIGHT {
                let slot = slot_piece.iter().position(|&piece| piece == usize::MAX).expect("a free bounce buffer");
                self.submit_piece(direction, offset, pointer, length, next_piece, slot);
                slot_piece[slot] = next_piece;
                next_piece += 1;
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            let (user_data, result) = self.wait_one();
            let slot = user_data as usize;
            let piece = slot_piece[slot];
            assert!(piece != usize::MAX, "completion for an idle bounce buffer {slot}");
            in_flight -= 1;
            let (piece_start, piece_bytes) = piece_extent(piece, length);
            let position = offset + piece_start as u64;
            match classify(direction, result) {
                Moved(count) => {
                    if direction == Direction::Read {
                        // SAFETY: the piece lies inside the caller's buffer; the bounce buffer
                        // holds `count <= piece_bytes` bytes the kernel just wrote.
                        unsafe {
                            std::ptr::copy_nonoverlapping(self.bounce[slot].pointer(), pointer.add(piece_start), count)
                        };
                    }
                    if count < piece_bytes {
                        short_pieces.push((piece_start + count, piece_bytes - count));
                    }
                    slot_piece[slot] = usize::MAX;
                }
                Retry if interrupted_retries < MAXIMUM_INTERRUPTED_RETRIES && first_failure.is_none() => {
                    interrupted_retries += 1;
                    self.submit_piece(direction, offset, pointer, length, piece, slot);
                    in_flight += 1;
                }
                Retry => {
                    slot_piece[slot] = usize::MAX;
                    keep_first(&mut first_failure, position, std::io::Error::from_raw_os_error(libc::EINTR));
                }
                Failed(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                    slot_piece[slot] = usize::MAX;
                    refused = true;
                }
                Failed(error) => {
                    slot_piece[slot] = usize::MAX;
                    keep_first(&mut first_failure, position, error);
                }
            }
        }
        if refused {
            // Writes redone buffered land the same bytes again; reads are read again.
            return Err(DirectRefused);
        }
        if let Some((position, error)) = first_failure {
            return Ok(Err(path_error(direction.operation(), position, path, error)));
        }
        // A short direct piece (the image shortened underneath, or a medium that splits) is
        // finished through the buffered descriptor, which reports end of file as the syscall
        // path does.
        for (start, bytes) in short_pieces {
            // SAFETY: `start + bytes <= length`, inside the caller's buffer.
            let result =
                self.buffered_transfer(direction, offset + start as u64, unsafe { pointer.add(start) }, bytes, path);
            if result.is_err() {
                return Ok(result);
            }
        }
        Ok(Ok(()))
    }

    /// Pushes piece `piece` of a direct transfer through bounce buffer `slot`; a write's bytes
    /// are copied into the bounce buffer first.
    fn submit_piece(
        &mut self,
        direction: Direction,
        offset: u64,
        pointer: *mut u8,
        length: usize,
        piece: usize,
        slot: usize,
    ) {
        let (piece_start, piece_bytes) = piece_extent(piece, length);
        let bounce = self.bounce[slot].pointer();
        if direction == Direction::Write {
            // SAFETY: the piece lies inside the caller's buffer, the bounce buffer holds PIECE_BYTES.
            unsafe { std::ptr::copy_nonoverlapping(pointer.add(piece_start), bounce, piece_bytes) };
        }
        let file = self.file(DIRECT_FILE_INDEX);
        let position = offset + piece_start as u64;
        let length = piece_bytes as u32;
        let entry = match (direction, self.registered_buffers) {
            (Direction::Read, true) => {
                target_entry!(file, ReadFixed, bounce, length, slot as u16).offset(position).build()
            }
            (Direction::Write, true) => {
                target_entry!(file, WriteFixed, bounce.cast_const(), length, slot as u16).offset(position).build()
            }
            (Direction::Read, false) => target_entry!(file, Read, bounce, length).offset(position).build(),
            (Direction::Write, false) => {
                target_entry!(file, Write, bounce.cast_const(), length).offset(position).build()
            }
        };
        self.push(entry, slot as u64);
    }

    fn flush(&mut self, path: &Path) -> Result<()> {
        let mut interrupted_retries = 0u32;
        loop {
            let file = self.file(BUFFERED_FILE_INDEX);
            let entry = target_entry!(file, Fsync).flags(types::FsyncFlags::DATASYNC).build();
            self.push(entry, 0);
            let (_, result) = self.wait_one();
            if result >= 0 {
                return Ok(());
            }
            let error = std::io::Error::from_raw_os_error(-result);
            if error.kind() == ErrorKind::Interrupted && interrupted_retries < MAXIMUM_INTERRUPTED_RETRIES {
                interrupted_retries += 1;
                continue;
            }
            // Never retried otherwise: after a failed fdatasync the kernel may have dropped the
            // dirty pages, so a later success would not mean the data is durable.
            return Err(path_error("flush", 0, path, error));
        }
    }
}

/// Test hooks, per thread so that tests running in parallel do not see each other's: refuse to
/// build rings (as a seccomp filter would), or refuse direct transfers (as a medium that accepts
/// `O_DIRECT` at open and refuses the transfers would).
#[cfg(test)]
pub(crate) mod tests_hooks {
    thread_local! {
        pub(crate) static REFUSE_RINGS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        pub(crate) static REFUSE_DIRECT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
}
