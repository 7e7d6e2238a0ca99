//! The ring entries: one thread per entry, each with its own small io_uring, its header and
//! payload buffers registered with the kernel for one FUSE queue (one queue per CPU), pinned to
//! that CPU where the scheduler allows.
//!
//! Why a thread per entry rather than one thread serving all entries of a queue: the kernel
//! hands a request to any available entry of the caller's CPU's queue. A request may block in
//! the kernel on another request of the same queue (the insert / collapse invalidation writes
//! dirty mmap pages back first, and those writes arrive on the queue of the CPU doing the
//! invalidation, the server thread's own). A thread serving several entries could then be
//! blocked while one of its own entries holds the write it waits for; a thread with one entry
//! is either serving it or waiting on it, so the queue's other threads serve the write.
//!
//! Why a large READ may leave the queue's CPU: the kernel queues a request on the CPU its
//! caller runs on, so one reader's read-ahead all lands on the reader's own queue, whose threads
//! are pinned to the reader's CPU. Served there, each 1 MiB read (the volume's copy into the
//! payload, then the kernel's copy into the page cache at the commit) takes turns with the
//! reader's own copying on one CPU, however many entries the queue has, where /dev/fuse's
//! workers run on idle CPUs beside the reader (0.53x of /dev/fuse's sequential reads on the
//! 16-core host, docs/FUSE.md). So a thread given a READ of at least
//! [`QueueShape::move_min_bytes`] widens its affinity to all the process's CPUs, and keeps it
//! wide while large reads keep coming: woken for the next one, the scheduler runs it on an idle
//! CPU (its own when the reader sleeps). The first other request pins it back before it is
//! served, so small requests keep the same-CPU round trip. Widening to the *other* CPUs only
//! (forcing a migration off the reader's) lost on the shared 2-core VM, where the other CPU
//! was the busy one: 0.64x of /dev/fuse against 0.80x staying pinned (docs/BENCHMARKS.md).
//! WRITEs stay: a writer waits in `write(2)` for its reply, so there is nothing of its own to
//! overlap with, and moving only added a migration (and, on a busy machine, a wait for the
//! other CPU) to each 1 MiB write.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::{RawDispatcher, ReplySink};
use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::abi::{self, RequestHeader};

/// Room before the payload for the in-header and the fixed argument, so that a request whose
/// payload the kernel wrote in place is contiguous with them without copying the payload.
/// A multiple of 8 (`fuse_in_header`'s alignment) and at least 40 + 128.
const PREFIX_BYTES: usize = 256;
const _: () = assert!(PREFIX_BYTES >= abi::IN_HEADER_BYTES + abi::OP_IN_BYTES && PREFIX_BYTES % 64 == 0);

/// How often a waiting thread looks at the stop flag: bounds how long [`Queues::stop`] waits.
const STOP_POLL: Duration = Duration::from_millis(500);
/// How long [`Queues::start`] waits for every thread to report its registration.
const REGISTRATION_WAIT: Duration = Duration::from_secs(5);
/// Registrations a thread retries after the kernel dropped its entry with an unexpected error.
const REREGISTRATIONS_MAX: u32 = 3;

/// Errors on a completion that mean the connection is gone (unmount, abort): the kernel has
/// let go of the entry and the thread ends.
fn connection_gone(errno: i32) -> bool {
    matches!(errno, libc::ENOTCONN | libc::ECANCELED | libc::ENODEV | libc::ECONNABORTED)
}

/// Shape of the queues.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueShape {
    /// FUSE queues: the kernel's count of possible CPUs (it needs an entry in each).
    pub(crate) queues: usize,
    /// Entries (and threads) per queue.
    pub(crate) entries_per_queue: usize,
    /// Payload buffer of each entry: at least the kernel's largest request or reply.
    pub(crate) payload_bytes: usize,
    /// READ requests of at least this many bytes may be served off the queue's CPU (module
    /// documentation); 0: every request on its queue's CPU.
    pub(crate) move_min_bytes: usize,
}

/// What the queue threads count, for `BackgroundMount::uring_reads` (printed by `bench mount`).
#[derive(Debug, Default)]
pub(crate) struct QueueCounters {
    /// READs served with the thread's affinity widened beyond its queue's CPU.
    pub(crate) moved: AtomicU64,
    /// READs served, of any size.
    pub(crate) reads: AtomicU64,
    /// READs whose reply was built on another CPU than their queue's: the caller's CPU, as
    /// the kernel picks the queue by it (a moved thread may still run there, where the
    /// scheduler finds it best, e.g. while the reader sleeps; a pinned one always does).
    pub(crate) reads_elsewhere: AtomicU64,
}

/// The running entry threads.
pub(crate) struct Queues {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    ended: Receiver<()>,
    /// Threads that could not be pinned to their queue's CPU (the mount log says so once).
    pub(crate) unpinned: usize,
    pub(crate) counters: Arc<QueueCounters>,
}

/// One thread's start-up report: pinned or not, or why registration failed.
type Registration = Result<bool, String>;

impl Queues {
    /// Starts `shape.queues * shape.entries_per_queue` threads, each registering one entry on
    /// `device` (the connection's /dev/fuse descriptor), and waits until each has registered.
    /// If any is refused, the others are stopped and the refusal is returned in words (the
    /// caller then keeps serving through /dev/fuse: until every queue has an entry, the kernel
    /// keeps using it).
    pub(crate) fn start<FS: fuser::Filesystem>(
        device: Arc<OwnedFd>,
        dispatcher: Arc<RawDispatcher<FS>>,
        shape: QueueShape,
    ) -> Result<Queues, String> {
        assert!(shape.queues >= 1 && shape.queues <= u16::MAX as usize, "queues {}", shape.queues);
        assert!(shape.entries_per_queue >= 1, "entries per queue {}", shape.entries_per_queue);
        let stop = Arc::new(AtomicBool::new(false));
        let thread_count = shape.queues * shape.entries_per_queue;
        let (ended_sender, ended) = sync_channel(thread_count);
        let (report_sender, reports) = sync_channel::<Registration>(thread_count);
        let counters = Arc::new(QueueCounters::default());
        let mut queues = Queues {
            stop: stop.clone(),
            threads: Vec::with_capacity(thread_count),
            ended,
            unpinned: 0,
            counters: counters.clone(),
        };
        // Read before any thread pins itself: the CPUs this process may run on.
        let allowed = allowed_cpus();
        for index in 0..thread_count {
            let queue = (index % shape.queues) as u16;
            let entry = Entry {
                device: device.clone(),
                dispatcher: dispatcher.clone(),
                queue,
                payload_bytes: shape.payload_bytes,
                stop: stop.clone(),
                wide: allowed.filter(|set| shape.move_min_bytes > 0 && cpu_count(set) >= 2),
                move_min_bytes: shape.move_min_bytes,
                counters: counters.clone(),
            };
            let report = report_sender.clone();
            let ended = ended_sender.clone();
            let spawned = std::thread::Builder::new().name(format!("tandemfs-uring-{queue}")).spawn(move || {
                entry.serve(report);
                let _ = ended.send(());
            });
            match spawned {
                Ok(thread) => queues.threads.push(thread),
                Err(error) => {
                    queues.stop(STOP_POLL * 5);
                    return Err(format!("starting queue thread {index}: {error}"));
                }
            }
        }
        let deadline = Instant::now() + REGISTRATION_WAIT;
        for _ in 0..thread_count {
            let wait = deadline.saturating_duration_since(Instant::now());
            let report = match reports.recv_timeout(wait) {
                Ok(report) => report,
                Err(_) => Err(format!("a queue thread did not register within {REGISTRATION_WAIT:?}")),
            };
            match report {
                Ok(true) => {}
                Ok(false) => queues.unpinned += 1,
                Err(refusal) => {
                    queues.stop(STOP_POLL * 5);
                    return Err(refusal);
                }
            }
        }
        Ok(queues)
    }

    /// Tells every thread to end and waits for them, at most `wait` in all (threads end by
    /// themselves when the connection goes away; a thread still serving a request when the
    /// wait runs out is left to finish it and is not joined).
    pub(crate) fn stop(&mut self, wait: Duration) {
        self.stop.store(true, Ordering::Release);
        let deadline = Instant::now() + wait;
        let mut ended = 0;
        while ended < self.threads.len() {
            match self.ended.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(()) => ended += 1,
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        if ended == self.threads.len() {
            for thread in self.threads.drain(..) {
                let _ = thread.join();
            }
        } else {
            log::warn!(
                "tandemfs: {} of {} io_uring queue threads still busy after {wait:?}; not waiting for them",
                self.threads.len() - ended,
                self.threads.len()
            );
            self.threads.clear();
        }
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop(STOP_POLL * 5);
        }
    }
}

/// The memory of one entry: a header buffer and a buffer with [`PREFIX_BYTES`] of room
/// followed by the payload. Raw allocations, because the kernel writes into them while no
/// reference to them exists, and the request handed to the dispatcher and the reply written
/// into the payload are disjoint ranges of one allocation.
struct EntryMemory {
    header: *mut RequestHeader,
    buffer: *mut u8,
    buffer_layout: Layout,
}

impl EntryMemory {
    fn new(payload_bytes: usize) -> io::Result<EntryMemory> {
        let header_layout = Layout::new::<RequestHeader>();
        let buffer_layout = Layout::from_size_align(PREFIX_BYTES + payload_bytes, 4096)
            .map_err(|error| io::Error::other(format!("payload of {payload_bytes} bytes: {error}")))?;
        // SAFETY: both layouts have a non-zero size.
        let header = unsafe { alloc_zeroed(header_layout) } as *mut RequestHeader;
        let buffer = unsafe { alloc_zeroed(buffer_layout) };
        if header.is_null() || buffer.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        Ok(EntryMemory { header, buffer, buffer_layout })
    }

    fn payload(&self) -> *mut u8 {
        // SAFETY: the buffer is PREFIX_BYTES + payload bytes long.
        unsafe { self.buffer.add(PREFIX_BYTES) }
    }

    fn payload_capacity(&self) -> usize {
        self.buffer_layout.size() - PREFIX_BYTES
    }

    /// Frees the memory: only once the kernel no longer holds the entry.
    fn free(self) {
        // SAFETY: allocated in `new` with these layouts, and freed once.
        unsafe {
            dealloc(self.header as *mut u8, Layout::new::<RequestHeader>());
            dealloc(self.buffer, self.buffer_layout);
        }
    }
}

/// What one entry thread owns.
struct Entry<FS: fuser::Filesystem> {
    device: Arc<OwnedFd>,
    dispatcher: Arc<RawDispatcher<FS>>,
    queue: u16,
    payload_bytes: usize,
    stop: Arc<AtomicBool>,
    /// The CPUs a large READ may be served on: all the process's; None when large reads stay
    /// on the queue's CPU (moving is off, or there is no other CPU).
    wide: Option<libc::cpu_set_t>,
    move_min_bytes: usize,
    counters: Arc<QueueCounters>,
}

/// How an entry's service ended.
enum End {
    /// The kernel let go of the entry (connection gone): its memory may be freed.
    Released,
    /// The thread stops while the kernel may still hold the entry: its memory is leaked,
    /// because the kernel could still write into it.
    StillRegistered,
}

impl<FS: fuser::Filesystem> Entry<FS> {
    fn serve(self, report: SyncSender<Registration>) {
        let memory = match EntryMemory::new(self.payload_bytes) {
            Ok(memory) => memory,
            Err(error) => {
                let _ = report.send(Err(format!("queue {}: entry buffers: {error}", self.queue)));
                return;
            }
        };
        let pinned = pin_to_cpu(self.queue as usize);
        let mut ring = match IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(4) {
            Ok(ring) => ring,
            Err(error) => {
                let _ = report.send(Err(format!("io_uring_setup with 128-byte entries: {error}")));
                memory.free();
                return;
            }
        };
        let end = self.run(&mut ring, &memory, pinned, report);
        drop(ring);
        match end {
            End::Released => memory.free(),
            // Not freed (`EntryMemory` frees only through `free`): the kernel may still write
            // into an entry it holds until the ring's descriptor, closed above, is torn down.
            End::StillRegistered => {}
        }
    }

    /// Registers the entry, reports, then serves requests until the connection goes away or
    /// the stop flag is seen.
    fn run(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        memory: &EntryMemory,
        pinned: bool,
        report: SyncSender<Registration>,
    ) -> End {
        let sink = Arc::new(EntrySink::new(memory.payload(), memory.payload_capacity()));
        let mut first = match self.register(ring, memory) {
            Ok(arrived) => {
                let _ = report.send(Ok(pinned));
                arrived
            }
            Err(refusal) => {
                let _ = report.send(Err(refusal));
                return End::Released;
            }
        };
        drop(report);
        let mut reregistrations = 0;
        // Whether the thread's affinity is widened beyond its queue's CPU (`place`).
        let mut wide = false;
        loop {
            let completion = match first.take() {
                Some(completion) => completion,
                None => match self.wait(ring) {
                    Some(completion) => completion,
                    None => return End::StillRegistered,
                },
            };
            if completion < 0 {
                let errno = -completion;
                if connection_gone(errno) {
                    return End::Released;
                }
                reregistrations += 1;
                log::error!(
                    "tandemfs: io_uring queue {}: the kernel dropped an entry: {}",
                    self.queue,
                    io::Error::from_raw_os_error(errno)
                );
                if reregistrations > REREGISTRATIONS_MAX {
                    return End::Released;
                }
                match self.register(ring, memory) {
                    Ok(arrived) => first = arrived,
                    Err(refusal) => {
                        log::error!("tandemfs: io_uring queue {}: registering again: {refusal}", self.queue);
                        return End::Released;
                    }
                }
                continue;
            }
            // SAFETY: the completion says the kernel wrote a request into the entry and holds it
            // no more until the commit below; nothing else refers to the header.
            let header = unsafe { &mut *memory.header };
            let commit_id = match abi::arrival(header, memory.payload_capacity()) {
                Ok(arrival) => {
                    let read_bytes = abi::read_bytes(header, &arrival);
                    if pinned {
                        wide = self.place(wide, read_bytes);
                    }
                    self.serve_request(memory, header, &arrival, &sink);
                    if read_bytes > 0 {
                        self.count_read();
                    }
                    arrival.commit_id
                }
                Err(problem) => {
                    log::error!("tandemfs: io_uring queue {}: malformed request: {problem}", self.queue);
                    let unique = abi::unique_of(header);
                    abi::set_reply(header, &abi::error_out_header(unique, libc::EIO), 0);
                    // The malformed part was the sizes; the commit id is echoed as the kernel
                    // wrote it, so that the request ends with EIO.
                    abi::commit_id_of(header)
                }
            };
            let commit = opcode::UringCmd80::new(types::Fd(self.device.as_raw_fd()), abi::CMD_COMMIT_AND_FETCH)
                .cmd(abi::command(commit_id, self.queue))
                .build();
            // SAFETY: the entry names no memory but the command area; the registered buffers
            // stay allocated while the kernel holds the entry (see `End`).
            if let Err(error) = unsafe { ring.submission().push(&commit) } {
                log::error!("tandemfs: io_uring queue {}: submission queue full: {error}", self.queue);
                return End::StillRegistered;
            }
        }
    }

    /// Where this thread serves the request that arrived, given whether its affinity is wide
    /// (`wide`) now; whether it is wide afterwards. A READ of at least `move_min_bytes` widens
    /// it to the process's CPUs (`Entry::wide`); any other request pins it back to its queue's CPU
    /// first. It stays wide between large reads, so that a reader's read-ahead keeps being
    /// served wherever a CPU is free, and a burst costs two affinity changes, not two per read.
    fn place(&self, wide: bool, read_bytes: usize) -> bool {
        let Some(wide_set) = self.wide.as_ref() else { return false };
        let large = read_bytes >= self.move_min_bytes;
        if large && !wide {
            // SAFETY: `wide_set` is a valid, non-empty CPU set of the size passed.
            let widened = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), wide_set) } == 0;
            if widened {
                self.counters.moved.fetch_add(1, Ordering::Relaxed);
            }
            return widened;
        }
        if large {
            self.counters.moved.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        if wide && !pin_to_cpu(self.queue as usize) {
            log::warn!("tandemfs: io_uring queue {}: could not pin the thread back to its CPU", self.queue);
        }
        false
    }

    /// Counts a READ just served, and whether it was served off its queue's CPU.
    fn count_read(&self) {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        if current_cpu() != Some(self.queue as usize) {
            self.counters.reads_elsewhere.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Submits the REGISTER and returns a completion that already arrived with it (a request,
    /// or nothing yet). A refusal completes during the submission, so it is seen here.
    fn register(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        memory: &EntryMemory,
    ) -> Result<Option<i32>, String> {
        let vectors = [
            libc::iovec { iov_base: memory.header as *mut libc::c_void, iov_len: abi::REQUEST_HEADER_BYTES },
            libc::iovec { iov_base: memory.payload() as *mut libc::c_void, iov_len: memory.payload_capacity() },
        ];
        let register = opcode::UringCmd80::new(types::Fd(self.device.as_raw_fd()), abi::CMD_REGISTER)
            .cmd(abi::command(0, self.queue))
            .addr(Some(vectors.as_ptr() as u64))
            .build();
        let register = with_length(register, abi::REGISTER_IOVEC_COUNT);
        // SAFETY: the iovec array lives until `submit` returns (the kernel copies it while
        // registering), and the buffers it names outlive the entry's registration (`End`).
        unsafe { ring.submission().push(&register) }.map_err(|error| format!("queueing REGISTER: {error}"))?;
        ring.submit().map_err(|error| format!("io_uring_enter (REGISTER on queue {}): {error}", self.queue))?;
        match ring.completion().next() {
            None => Ok(None),
            Some(completion) if completion.result() < 0 => Err(format!(
                "FUSE_IO_URING_CMD_REGISTER on queue {}: {}",
                self.queue,
                io::Error::from_raw_os_error(-completion.result())
            )),
            Some(completion) => Ok(Some(completion.result())),
        }
    }

    /// Submits what is queued and waits for the next completion; None once the stop flag is
    /// set (checked every [`STOP_POLL`]) or the ring fails.
    fn wait(&self, ring: &mut IoUring<squeue::Entry128, cqueue::Entry>) -> Option<i32> {
        let timeout = types::Timespec::from(STOP_POLL);
        loop {
            if let Some(completion) = ring.completion().next() {
                return Some(completion.result());
            }
            if self.stop.load(Ordering::Acquire) {
                return None;
            }
            let arguments = types::SubmitArgs::new().timespec(&timeout);
            match ring.submitter().submit_with_args(1, &arguments) {
                Ok(_) => {}
                Err(error) if matches!(error.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR)) => {}
                Err(error) => {
                    log::error!("tandemfs: io_uring queue {}: waiting: {error}", self.queue);
                    return None;
                }
            }
        }
    }

    /// Hands one arrived request to the dispatcher and puts its reply into the entry.
    fn serve_request(
        &self,
        memory: &EntryMemory,
        header: &mut RequestHeader,
        arrival: &abi::Arrival,
        sink: &Arc<EntrySink>,
    ) {
        let prefix_bytes = abi::IN_HEADER_BYTES + arrival.op_in_bytes;
        let start = PREFIX_BYTES - prefix_bytes;
        let length = prefix_bytes + arrival.payload_bytes;
        // SAFETY: [start, PREFIX_BYTES) is the room before the payload, which the kernel never
        // writes; the payload's first `payload_bytes` bytes are the request's, written by the
        // kernel before the completion.
        unsafe {
            let room = memory.buffer.add(start);
            std::ptr::copy_nonoverlapping(header.0.as_ptr(), room, abi::IN_HEADER_BYTES);
            std::ptr::copy_nonoverlapping(
                header.0.as_ptr().add(abi::OP_IN_OFFSET),
                room.add(abi::IN_HEADER_BYTES),
                arrival.op_in_bytes,
            );
        }
        // A request with no payload lies wholly before the payload buffer, so its reply may be
        // written there directly; otherwise the reply is gathered aside until the dispatcher is
        // done with the request's bytes.
        let direct = arrival.payload_bytes == 0;
        sink.arm(direct);
        if direct {
            REPLY_AREA.with(|area| area.set(Some((memory.payload(), memory.payload_capacity()))));
        }
        let served = if start % 8 == 0 {
            // SAFETY: see above; the slice ends before any byte the sink writes while armed
            // directly, and in gathering mode the sink writes nothing into the buffer.
            let request = unsafe { std::slice::from_raw_parts(memory.buffer.add(start), length) };
            self.dispatcher.dispatch(request, sink.clone())
        } else {
            // A fixed argument whose size is not a multiple of 8 (none in protocol 7.42): copy
            // to an aligned buffer, as fuser's parser wants the in-header 8-byte aligned.
            let mut aligned = vec![0u64; length.div_ceil(8)];
            // SAFETY: as above; `aligned` holds `length` bytes.
            let request = unsafe {
                std::ptr::copy_nonoverlapping(memory.buffer.add(start), aligned.as_mut_ptr() as *mut u8, length);
                std::slice::from_raw_parts(aligned.as_ptr() as *const u8, length)
            };
            self.dispatcher.dispatch(request, sink.clone())
        };
        REPLY_AREA.with(|area| area.set(None));
        let unique = abi::unique_of(header);
        match sink.disarm() {
            Some((out_header, payload_bytes)) => abi::set_reply(header, &out_header, payload_bytes),
            None => {
                if served {
                    log::error!("tandemfs: io_uring queue {}: request {unique} ended without a reply", self.queue);
                } else {
                    log::error!("tandemfs: io_uring queue {}: request {unique} could not be decoded", self.queue);
                }
                abi::set_reply(header, &abi::error_out_header(unique, libc::EIO), 0);
            }
        }
    }
}

/// Sets `len` of a built 128-byte entry, which the io-uring crate's `UringCmd80` leaves 0.
fn with_length(entry: squeue::Entry128, length: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
    bytes[abi::SQE_LEN_OFFSET..abi::SQE_LEN_OFFSET + 4].copy_from_slice(&length.to_ne_bytes());
    // SAFETY: the bytes are a valid entry with one plain integer field changed.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

/// Pins the calling thread to `cpu`; false where that is not allowed (a CPU outside this
/// process's set, or offline).
fn pin_to_cpu(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET bounds-checks against its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return false;
        }
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// The CPUs this process may run on; None where the kernel does not say.
fn allowed_cpus() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is an empty set, filled by the kernel up to its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
    }
}

/// The CPUs in `set`.
fn cpu_count(set: &libc::cpu_set_t) -> u32 {
    // SAFETY: counting the bits of a valid set.
    unsafe { libc::CPU_COUNT(set) as u32 }
}

/// The CPU the calling thread runs on.
fn current_cpu() -> Option<usize> {
    // SAFETY: no arguments; -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

thread_local! {
    /// The payload buffer of the entry this thread is serving, while its reply may be built in
    /// place (the request has no payload): see [`reply_area`].
    static REPLY_AREA: std::cell::Cell<Option<(*mut u8, usize)>> = const { std::cell::Cell::new(None) };
}

/// Memory a reply's data may be built in: the payload buffer of the io_uring entry being
/// served on this thread. A reply whose data lies there already is not copied again.
pub(crate) struct ReplyArea {
    start: *mut u8,
    length: usize,
}

impl ReplyArea {
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `reply_area` hands the area out once per request, while the entry thread
        // serves that request and nothing else refers to the payload buffer (the request's bytes
        // lie before it); the sink does not write over data that is already in place.
        unsafe { std::slice::from_raw_parts_mut(self.start, self.length) }
    }
}

/// On an io_uring entry thread serving a request without payload, the first `bytes` of the
/// entry's payload buffer, where the reply's data goes (the out-header travels apart): a read
/// fills it straight from the volume. None elsewhere, when asked twice for one request, or for
/// more than the buffer holds.
pub(crate) fn reply_area(bytes: usize) -> Option<ReplyArea> {
    let (start, capacity) = REPLY_AREA.with(|area| area.take())?;
    (bytes <= capacity).then_some(ReplyArea { start, length: bytes })
}

/// Where the dispatcher's reply for the request an entry holds goes.
struct EntrySink {
    state: Mutex<SinkState>,
}

struct SinkState {
    /// Between `arm` and `disarm`: a reply is taken only for the request being served.
    armed: bool,
    /// Write the reply's data straight into the payload buffer (else gather it in `aside`).
    direct: bool,
    payload: *mut u8,
    payload_capacity: usize,
    out_header: Option<[u8; abi::OUT_HEADER_BYTES]>,
    payload_bytes: usize,
    aside: Vec<u8>,
}

// SAFETY: `payload` is written only while armed, under the mutex, into the entry's payload
// buffer, which outlives the sink's use (the entry thread arms and disarms around each request).
unsafe impl Send for SinkState {}

impl EntrySink {
    fn new(payload: *mut u8, payload_capacity: usize) -> EntrySink {
        EntrySink {
            state: Mutex::new(SinkState {
                armed: false,
                direct: false,
                payload,
                payload_capacity,
                out_header: None,
                payload_bytes: 0,
                aside: Vec::new(),
            }),
        }
    }

    fn arm(&self, direct: bool) {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.armed = true;
        state.direct = direct;
        state.out_header = None;
        state.payload_bytes = 0;
        state.aside.clear();
    }

    /// Ends the request: its reply's out-header and payload size, the payload now in the
    /// payload buffer; None if no reply came.
    fn disarm(&self) -> Option<([u8; abi::OUT_HEADER_BYTES], usize)> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.armed = false;
        let out_header = state.out_header.take()?;
        if !state.direct {
            assert!(state.aside.len() <= state.payload_capacity, "gathered reply over capacity");
            // SAFETY: the request's bytes are no longer referenced (the dispatcher returned);
            // the payload buffer holds `payload_capacity` bytes.
            unsafe { std::ptr::copy_nonoverlapping(state.aside.as_ptr(), state.payload, state.aside.len()) };
        }
        Some((out_header, state.payload_bytes))
    }
}

impl ReplySink for EntrySink {
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !state.armed || state.out_header.is_some() {
            return Err(io::Error::other("a reply outside the request it answers (io_uring entry)"));
        }
        let total: usize = data.iter().map(|slice| slice.len()).sum();
        if total < abi::OUT_HEADER_BYTES || total - abi::OUT_HEADER_BYTES > state.payload_capacity {
            return Err(io::Error::other(format!(
                "reply of {total} bytes for a payload buffer of {}",
                state.payload_capacity
            )));
        }
        let mut out_header = [0u8; abi::OUT_HEADER_BYTES];
        let mut written = 0usize;
        for slice in data {
            let mut bytes: &[u8] = slice;
            if written < abi::OUT_HEADER_BYTES {
                let take = bytes.len().min(abi::OUT_HEADER_BYTES - written);
                out_header[written..written + take].copy_from_slice(&bytes[..take]);
                written += take;
                bytes = &bytes[take..];
            }
            if bytes.is_empty() {
                continue;
            }
            let at = written - abi::OUT_HEADER_BYTES;
            if state.direct {
                // SAFETY: at + len <= total - 16 <= payload_capacity (checked above), and in
                // direct mode the request's bytes lie before the payload buffer. Data built in
                // place (`reply_area`) is already where it belongs.
                let target = unsafe { state.payload.add(at) };
                if !std::ptr::eq(bytes.as_ptr(), target) {
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), target, bytes.len()) };
                }
            } else {
                state.aside.extend_from_slice(bytes);
            }
            written += bytes.len();
        }
        let declared = u32::from_ne_bytes(out_header[..4].try_into().expect("four bytes")) as usize;
        if declared != total {
            return Err(io::Error::other(format!("reply declares {declared} bytes but has {total}")));
        }
        state.payload_bytes = total - abi::OUT_HEADER_BYTES;
        state.out_header = Some(out_header);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply as fuser builds one: an out-header for `data`, then the data in `pieces`.
    fn reply(unique: u64, data: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&((abi::OUT_HEADER_BYTES + data.len()) as u32).to_ne_bytes());
        bytes.extend_from_slice(&0i32.to_ne_bytes());
        bytes.extend_from_slice(&unique.to_ne_bytes());
        bytes.extend_from_slice(data);
        bytes
    }

    fn send_in_pieces(sink: &EntrySink, bytes: &[u8], cut: &[usize]) -> io::Result<()> {
        let mut slices = Vec::new();
        let mut start = 0;
        for &end in cut.iter().chain(std::iter::once(&bytes.len())) {
            slices.push(IoSlice::new(&bytes[start..end]));
            start = end;
        }
        sink.send(&slices)
    }

    #[test]
    fn replies_land_in_the_payload_directly_or_after_the_request() {
        for direct in [true, false] {
            let mut payload = vec![0u8; 64];
            let sink = EntrySink::new(payload.as_mut_ptr(), payload.len());
            sink.arm(direct);
            let bytes = reply(9, b"twenty bytes of data");
            // The out-header split across slices, as a header slice and data slices may be.
            send_in_pieces(&sink, &bytes, &[5, 16, 30]).unwrap();
            let (out_header, payload_bytes) = sink.disarm().expect("a reply");
            assert_eq!(&out_header[..], &bytes[..16]);
            assert_eq!(payload_bytes, 20);
            assert_eq!(&payload[..20], b"twenty bytes of data", "direct: {direct}");
        }
    }

    #[test]
    fn replies_outside_a_request_too_large_or_mis_sized_are_refused() {
        let mut payload = vec![0u8; 8];
        let sink = EntrySink::new(payload.as_mut_ptr(), payload.len());
        assert!(sink.send(&[IoSlice::new(&reply(1, b""))]).is_err(), "not armed");
        sink.arm(true);
        assert!(sink.send(&[IoSlice::new(&reply(1, b"nine byte"))]).is_err(), "over the payload buffer");
        let mut lying = reply(1, b"four");
        lying[0] = 99;
        assert!(sink.send(&[IoSlice::new(&lying)]).is_err(), "length not the reply's");
        assert!(sink.send(&[IoSlice::new(&reply(1, b"four"))]).is_ok());
        assert!(sink.send(&[IoSlice::new(&reply(1, b"four"))]).is_err(), "a second reply");
        assert_eq!(sink.disarm().map(|(_, bytes)| bytes), Some(4));
        assert_eq!(sink.disarm(), None, "nothing after the request ended");
    }

    #[test]
    fn the_reply_area_is_offered_once_per_request_and_only_where_it_fits() {
        assert!(reply_area(1).is_none(), "no entry served on this thread");
        let mut payload = vec![0u8; 16];
        REPLY_AREA.with(|area| area.set(Some((payload.as_mut_ptr(), payload.len()))));
        assert!(reply_area(17).is_none(), "larger than the buffer (and withdrawn)");
        REPLY_AREA.with(|area| area.set(Some((payload.as_mut_ptr(), payload.len()))));
        let mut area = reply_area(8).expect("offered");
        area.as_mut_slice().copy_from_slice(b"in place");
        assert!(reply_area(8).is_none(), "offered once");
        // A reply whose data is already in the payload buffer is not copied over itself.
        let sink = EntrySink::new(payload.as_mut_ptr(), payload.len());
        sink.arm(true);
        let header = &reply(3, b"in place")[..16];
        sink.send(&[IoSlice::new(header), IoSlice::new(area.as_mut_slice())]).unwrap();
        assert_eq!(sink.disarm().map(|(_, bytes)| bytes), Some(8));
        assert_eq!(&payload[..8], b"in place");
    }
}
