//! The back end's room: it owns the volume, the queue of records waiting to be applied, the
//! applied lsn, the checkpoint policy, its thread and the failure latch. The front end appends
//! through `enqueue`, reads the volume through `volume`, and learns what each applied batch
//! changed through a `FrontSink`: the back end never reaches into the front end's state.
//!
//! A failure latches: an apply or checkpoint error, or a panic in the back-end thread, marks
//! the back end failed, keeps the first reason, and wakes every waiter. Every wait here is
//! bounded or wakes on the latch, so callers get `Error::Shutdown`, never a hang.

use super::deposits::{self, Consumer, Deposits};
use super::parallel::{self, ApplyPool, Job, JobContext};
use super::store::{LockTimes, Memo, TimedVolume};
use super::{checkpoint_finish, checkpoint_snapshot, Applier, DataRun};
use crate::backend::record::Op;
use crate::block::mirror::HomeMirror;
use crate::block::volume::Volume;
use crate::error::{Error, Result};
use crate::log::{Log, Pledges};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Records applied with the volume lock held before it is let go: small enough that a
/// front-end lookup waiting for the lock is not held up for long.
const BATCH_RECORDS_MAX: usize = 32;
/// Records per pass with several apply workers: enough that the groups of independent records
/// keep every worker busy, few enough that a pass (and so `wait_applied`) stays short. Workers
/// hold the volume lock only per block, so the batch does not hold up readers.
const PARALLEL_BATCH_RECORDS_MAX: usize = 1024;
/// Batches in flight on the workers at once. Each directory's groups wait only for its own
/// earlier groups, so a few batches in flight keep every worker busy while the largest group of
/// the oldest one finishes; the log's reserve bounds the images of the records in them (`pass`).
const JOBS_IN_FLIGHT_MAX: usize = 16;
/// How long a pass with nothing new to hand out waits for the oldest batch in flight before it
/// looks at the queue again.
const IN_FLIGHT_WAIT: Duration = Duration::from_micros(250);
/// How long stopping or a quiet change of the volume waits for a batch on the workers: as long
/// as the workers may take before they are declared stuck.
const IN_FLIGHT_STOP_WAIT: Duration = Duration::from_secs(600);
/// Below this many free blocks, with frees pending, the back end checkpoints before it applies
/// more: comfortably above what one batch of records allocates.
const BACKEND_LOW_WATER_BLOCKS: u64 = 1024;
/// Log bytes a record takes besides a write's data: its encoded attributes and names.
const RECORD_OVERHEAD_BYTES: usize = 256;
/// Passes of a drain before it declares the back end stuck: each pass applies at least one
/// record, and the queue holds at most what the log holds. A pass that applies nothing waits
/// `IDLE_PASS_WAIT` first, so a drain gives up after minutes, not after a burst of spinning.
const DRAIN_PASSES_MAX: usize = 1 << 20;
/// What a drain waits after a pass that applied nothing although records are missing: a
/// record before them is still between its append and its deposit.
const IDLE_PASS_WAIT: Duration = Duration::from_micros(100);
/// How long a waiter sleeps between looks at the latch (a lost wake-up costs this much).
const WAIT_SLICE: Duration = Duration::from_millis(50);
/// How long a caller refused for a full backlog waits for the back-end thread to apply a
/// batch before it drains in its own thread (a batch takes milliseconds; a checkpoint longer).
const ROOM_WAIT_MAX: Duration = Duration::from_secs(2);
/// How long the thread sleeps when the next record to apply is durable but its appender has
/// not deposited it yet (it is between its append and its deposit, a few instructions).
const DEPOSIT_WAIT: Duration = Duration::from_millis(1);

const STATE_RUNNING: u8 = 0;
const STATE_STOPPED: u8 = 1;
const STATE_FAILED: u8 = 2;

/// A record appended to the log and waiting to be applied.
pub struct Queued {
    pub lsn: u64,
    pub op: Arc<Op>,
    /// Blocks the front end promised this record; returned when it is applied.
    pub reserved_blocks: u64,
    /// Bound on the metadata blocks applying it may dirty, pledged in the log (`log::pledge`).
    pub image_blocks: u64,
}

/// What the back end has applied since mount, and how.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendStatistics {
    /// Apply workers (1: every record applies in the pass's own thread).
    pub workers: u64,
    /// Records applied by the workers side by side, and the batches and groups they came in.
    pub parallel_records: u64,
    pub parallel_batches: u64,
    pub parallel_groups: u64,
    /// Wall time of the parallel batches, and the time the workers were busy in them (summed
    /// over workers), in nanoseconds: their ratio is how many workers were busy on average.
    pub parallel_ns: u64,
    pub worker_busy_ns: u64,
    /// Of that busy time, what the workers spent waiting for the volume lock and holding it
    /// (summed over workers, in nanoseconds): the held share is applied one worker at a time.
    pub worker_lock_wait_ns: u64,
    pub worker_lock_held_ns: u64,
    /// How often the workers took the volume lock.
    pub worker_lock_takes: u64,
    /// The front end's takes of the volume lock (views loaded, names looked up in the applied
    /// H-tree, inode-table blocks checked, reads of home data), and its time waiting for the
    /// lock and holding it, in nanoseconds.
    pub front_lock_takes: u64,
    pub front_lock_wait_ns: u64,
    pub front_lock_held_ns: u64,
    /// Records applied with the volume held throughout: one worker, a batch of one group, a
    /// batch with a record that reaches beyond its inodes, or free space running low.
    pub held_records: u64,
    /// Runs of data records of one file that the held apply committed as one change of the
    /// file's tree (`Applier::apply_in_run`): fewer than the data records they hold.
    pub data_runs: u64,
    pub checkpoints: u64,
    /// Checkpoints whose images went to the log and home in their own thread while the passes
    /// went on (taken when due, not forced).
    pub checkpoints_beside: u64,
    /// Time spent applying batches (both ways), in nanoseconds.
    pub apply_ns: u64,
    /// Time the passes stood still for checkpoints (snapshots, and waits for a checkpoint's
    /// thread), in nanoseconds.
    pub checkpoint_ns: u64,
    /// Drains asked for by callers (a full backlog, a full log, unmount), and the time they
    /// waited in all, in nanoseconds.
    pub drains: u64,
    pub drain_ns: u64,
    /// Callers that waited for the back-end thread to apply a batch (their backlog share was
    /// full), and the time they waited in all, in nanoseconds.
    pub room_waits: u64,
    pub room_wait_ns: u64,
}

/// What one applied batch changed that the front end keeps in its own state.
pub struct BatchSummary<'a> {
    /// The applied records, in lsn order.
    pub records: &'a [Queued],
    /// (inode, blocks it owns now) for every inode the batch left in use; the last count of an
    /// inode is the current one.
    pub owned_blocks: Vec<(u64, u64)>,
    pub free_blocks: u64,
    pub pending_free_blocks: u64,
    pub last_lsn: u64,
}

/// The front end's side of the back end: told after each batch and each checkpoint.
pub trait FrontSink: Send + Sync {
    fn batch_applied(&self, summary: &BatchSummary<'_>);
    /// A checkpoint made freed blocks reusable.
    fn space_changed(&self, free_blocks: u64, pending_free_blocks: u64);
}

/// What `apply_batch` reports: how many records of the batch it applied, and the state after.
struct AppliedBatch {
    applied_count: usize,
    owned_blocks: Vec<(u64, u64)>,
    free_blocks: u64,
    pending_free_blocks: u64,
}

/// Waits until the workers are done with every batch in `policy` (without making any applied):
/// before the volume changes another way or the pool stops.
fn wait_for_workers(policy: &CheckpointPolicy) {
    for flight in &policy.jobs {
        flight.job.wait_finished(IN_FLIGHT_STOP_WAIT);
    }
}

/// A batch handed to the workers and not yet made applied.
struct InFlight {
    job: Arc<Job>,
    batch: Vec<Queued>,
    /// The image bounds of its records, summed.
    image_blocks: u64,
}

struct CheckpointPolicy {
    /// Batches handed to the workers, oldest first; made applied in this order.
    jobs: VecDeque<InFlight>,
    /// When the workers last went from no batch in flight to one.
    pipeline_since: Option<Instant>,
    last_checkpoint: Instant,
    applied_since_checkpoint: u64,
    /// Log data bytes of the records applied since the last checkpoint (approximate).
    applied_bytes_since_checkpoint: u64,
    /// The checkpoint whose images are on their way to the log and home in a thread of its own
    /// while passes go on applying (background mode only): at most one at a time.
    in_flight: Option<std::thread::JoinHandle<Result<()>>>,
}

impl CheckpointPolicy {
    /// The image bounds of every record in the batches on the workers.
    fn in_flight_image_blocks(&self) -> u64 {
        self.jobs.iter().map(|flight| flight.image_blocks).sum()
    }
}

/// What a caught panic said, for the failure latch.
pub(super) fn panic_reason(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Latches the back end failed when a pass unwinds, in the back-end thread or in a caller that
/// drives the back end itself, so that no waiter is left waiting for a pass that died.
struct PanicLatch<'a>(&'a Backend);

impl Drop for PanicLatch<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail(&Error::invalid("back end panicked while applying records"));
        }
    }
}

pub struct Backend {
    log: Arc<Log>,
    volume: Arc<Mutex<Volume>>,
    applier: Applier,
    /// The apply workers (the pass only hands them batches); `None` with one worker, when every
    /// record applies in the pass's own thread with the volume held.
    pool: Option<ApplyPool>,
    /// The log's pledge of checkpoint images (`log::pledge`): the front end's appends count
    /// their records' bounds in it, and the back end releases them as the records apply.
    pledges: Arc<Pledges>,
    /// What the workers' stores last read or committed (see `store::Memo`).
    memo: Arc<Memo>,
    /// Where appenders deposit their records, without a lock (`deposits`).
    deposits: Deposits,
    /// The consumed lsn, taken by passes; its condvar wakes the thread.
    queue: Mutex<Consumer>,
    queue_signal: Condvar,
    applied_lsn: Mutex<u64>,
    /// Mirrors `applied_lsn` for readers that need no wait.
    applied_lsn_fast: crossbeam_utils::CachePadded<AtomicU64>,
    /// The highest record deposited: a drain is done when the applied lsn reaches it (an empty
    /// queue is not enough: the thread may hold a batch it has taken but not yet applied).
    /// Records apply in lsn order, so every record deposited before it is applied then too.
    last_queued_lsn: crossbeam_utils::CachePadded<AtomicU64>,
    applied_signal: Condvar,
    /// One pass or checkpoint at a time, from the thread or from a waiting caller.
    policy: Mutex<CheckpointPolicy>,
    state: crossbeam_utils::CachePadded<AtomicU8>,
    failure: Mutex<Option<String>>,
    stop: AtomicBool,
    /// Records are applied by the back-end thread; otherwise by callers that need a result.
    background: bool,
    checkpoints: AtomicU64,
    /// Counters for `statistics`.
    parallel_records: AtomicU64,
    parallel_batches: AtomicU64,
    parallel_groups: AtomicU64,
    parallel_ns: AtomicU64,
    worker_busy_ns: AtomicU64,
    worker_lock_wait_ns: AtomicU64,
    worker_lock_held_ns: AtomicU64,
    worker_lock_takes: AtomicU64,
    front_lock: LockTimes,
    /// The volume's mirror of the blocks lookups read (`block::mirror`), for readers that do
    /// not take the volume lock.
    mirror: Arc<HomeMirror>,
    /// `Volume::half_changed_flag`: a change failed half way under the volume lock, and this
    /// back end is about to latch failed (a worker's failed commit latches only when its batch
    /// is collected); changes are refused from the moment it is set.
    half_changed: Arc<AtomicBool>,
    checkpoint_ns: AtomicU64,
    checkpoints_beside: AtomicU64,
    /// A checkpoint is due at least this often while records are applied
    /// (`MountOptions::checkpoint_interval_ms`).
    checkpoint_interval_ms: AtomicU64,
    held_records: AtomicU64,
    data_runs: AtomicU64,
    apply_ns: AtomicU64,
    drains: AtomicU64,
    drain_ns: AtomicU64,
    room_waits: AtomicU64,
    room_wait_ns: AtomicU64,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Backend {
    /// A back end with `workers` appliers (see `parallel`); one applies every record in the
    /// pass's own thread with the volume held, as a single back end does.
    pub fn new(
        volume: Volume,
        log: Arc<Log>,
        applier: Applier,
        applied_lsn: u64,
        background: bool,
        workers: usize,
    ) -> Result<Arc<Backend>> {
        let pool = if workers > 1 { Some(ApplyPool::start(workers)?) } else { None };
        let mut volume = volume;
        volume.set_image_gauge(log.pledges().dirty_gauge());
        let mirror = volume.home_mirror();
        let half_changed = volume.half_changed_flag();
        let (deposits, consumer) = Deposits::new(applied_lsn, log.geometry().header_slots);
        Ok(Arc::new(Backend {
            mirror,
            half_changed,
            pledges: log.pledges().clone(),
            log,
            volume: Arc::new(Mutex::new(volume)),
            applier,
            pool,
            memo: Arc::new(Memo::default()),
            deposits,
            queue: Mutex::new(consumer),
            queue_signal: Condvar::new(),
            applied_lsn: Mutex::new(applied_lsn),
            applied_lsn_fast: crossbeam_utils::CachePadded::new(AtomicU64::new(applied_lsn)),
            last_queued_lsn: crossbeam_utils::CachePadded::new(AtomicU64::new(applied_lsn)),
            applied_signal: Condvar::new(),
            policy: Mutex::new(CheckpointPolicy {
                jobs: VecDeque::new(),
                pipeline_since: None,
                last_checkpoint: Instant::now(),
                applied_since_checkpoint: 0,
                applied_bytes_since_checkpoint: 0,
                in_flight: None,
            }),
            state: crossbeam_utils::CachePadded::new(AtomicU8::new(STATE_RUNNING)),
            failure: Mutex::new(None),
            stop: AtomicBool::new(false),
            background,
            checkpoints: AtomicU64::new(0),
            parallel_records: AtomicU64::new(0),
            parallel_batches: AtomicU64::new(0),
            parallel_groups: AtomicU64::new(0),
            parallel_ns: AtomicU64::new(0),
            worker_busy_ns: AtomicU64::new(0),
            worker_lock_wait_ns: AtomicU64::new(0),
            worker_lock_held_ns: AtomicU64::new(0),
            worker_lock_takes: AtomicU64::new(0),
            front_lock: LockTimes::default(),
            checkpoint_ns: AtomicU64::new(0),
            checkpoints_beside: AtomicU64::new(0),
            checkpoint_interval_ms: AtomicU64::new(crate::fs::types::CHECKPOINT_INTERVAL_MS_DEFAULT),
            held_records: AtomicU64::new(0),
            data_runs: AtomicU64::new(0),
            apply_ns: AtomicU64::new(0),
            drains: AtomicU64::new(0),
            drain_ns: AtomicU64::new(0),
            room_waits: AtomicU64::new(0),
            room_wait_ns: AtomicU64::new(0),
            thread: Mutex::new(None),
        }))
    }

    /// The log's pledge of checkpoint images (see `log::pledge`).
    pub fn pledges(&self) -> &Pledges {
        &self.pledges
    }

    /// How many appliers this back end runs.
    pub fn workers(&self) -> usize {
        self.pool.as_ref().map_or(1, ApplyPool::workers)
    }

    /// Starts the back-end thread (background mode only). A panic in it latches the failure.
    pub fn start(self: &Arc<Self>, sink: Arc<dyn FrontSink>) -> Result<()> {
        assert!(self.background, "a back end without a thread is driven by its callers");
        let backend = self.clone();
        let handle = std::thread::Builder::new()
            .name("tandem-backend".into())
            .spawn(move || {
                let run = std::panic::AssertUnwindSafe(|| backend.run(sink.as_ref()));
                if let Err(panic) = std::panic::catch_unwind(run) {
                    let reason = panic_reason(panic.as_ref());
                    backend.fail(&Error::invalid(format!("back end panicked: {reason}")));
                }
            })
            .map_err(|error| Error::Io { operation: "start back-end thread", offset: 0, source: error })?;
        *self.thread.lock() = Some(handle);
        Ok(())
    }

    /// How often a checkpoint is due at the least while records are applied.
    pub fn set_checkpoint_interval(&self, interval: Duration) {
        assert!(!interval.is_zero(), "a checkpoint interval of zero");
        self.checkpoint_interval_ms.store(interval.as_millis().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Stops the thread and waits for it; idempotent.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.queue_signal.notify_all();
        if let Some(handle) = self.thread.lock().take() {
            let _ = handle.join();
        }
        // A checkpoint still writing must be done before the caller writes the superblock or
        // lets the next mount in; its failure latches like any other. So must batches still on
        // the workers (the thread finishes them as it ends; a caller's pass may have left some).
        let mut policy = self.policy.lock();
        wait_for_workers(&policy);
        if let Some(in_flight) = policy.in_flight.take() {
            let _ = self.join_checkpoint(in_flight);
        }
        drop(policy);
        if let Some(pool) = &self.pool {
            pool.stop();
        }
    }

    /// The volume, for the front end's reads of home state; timed (`front_lock_*`).
    /// `Shutdown` once a record failed half way (`Volume::check_whole`): the back end has
    /// latched, and what the volume holds may be part of that record.
    pub fn volume(&self) -> Result<TimedVolume<'_>> {
        self.front_lock.lock_whole(&self.volume)
    }

    /// `volume` if nobody holds the volume lock now, without waiting; `None` if somebody does.
    pub fn try_volume(&self) -> Result<Option<TimedVolume<'_>>> {
        self.front_lock.try_lock_whole(&self.volume)
    }

    /// The blocks lookups read without the volume lock (`block::mirror`).
    pub fn home_mirror(&self) -> &HomeMirror {
        &self.mirror
    }

    /// The volume for fields no record changes half way (the superblock's geometry, counters):
    /// statistics, which still answer after a failure.
    pub fn volume_for_statistics(&self) -> TimedVolume<'_> {
        self.front_lock.lock(&self.volume)
    }

    /// Runs `change` on the volume with no pass or checkpoint in progress (both take the policy
    /// lock first): for superblock writes outside checkpoints (unmount, remount).
    pub fn with_volume_quiet<T>(&self, change: impl FnOnce(&mut Volume) -> T) -> T {
        let mut policy = self.policy.lock();
        // Batches still on the workers finish first (the next pass makes them applied; an
        // error among them latches there).
        wait_for_workers(&policy);
        // The superblock this writes must not be overtaken by a checkpoint's (its failure
        // latches; the caller's own write then fails or is moot).
        if let Some(in_flight) = policy.in_flight.take() {
            let _ = self.join_checkpoint(in_flight);
        }
        let mut volume = self.volume.lock();
        let result = change(&mut volume);
        volume.end_change();
        result
    }

    pub fn applier(&self) -> &Applier {
        &self.applier
    }

    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    pub fn applied_lsn(&self) -> u64 {
        self.applied_lsn_fast.load(Ordering::Acquire)
    }

    /// The lsn of the last record queued: every change acknowledged to a caller is at or below
    /// it (the directory index's freshness rule, docs/BATCH.md).
    pub fn last_queued_lsn(&self) -> u64 {
        self.last_queued_lsn.load(Ordering::Acquire)
    }

    pub fn checkpoints(&self) -> u64 {
        self.checkpoints.load(Ordering::Relaxed)
    }

    pub fn statistics(&self) -> BackendStatistics {
        let (front_lock_takes, front_lock_wait_ns, front_lock_held_ns) = self.front_lock.totals();
        BackendStatistics {
            workers: self.workers() as u64,
            parallel_records: self.parallel_records.load(Ordering::Relaxed),
            parallel_batches: self.parallel_batches.load(Ordering::Relaxed),
            parallel_groups: self.parallel_groups.load(Ordering::Relaxed),
            parallel_ns: self.parallel_ns.load(Ordering::Relaxed),
            worker_busy_ns: self.worker_busy_ns.load(Ordering::Relaxed),
            worker_lock_wait_ns: self.worker_lock_wait_ns.load(Ordering::Relaxed),
            worker_lock_held_ns: self.worker_lock_held_ns.load(Ordering::Relaxed),
            worker_lock_takes: self.worker_lock_takes.load(Ordering::Relaxed),
            front_lock_takes,
            front_lock_wait_ns,
            front_lock_held_ns,
            checkpoints_beside: self.checkpoints_beside.load(Ordering::Relaxed),
            checkpoint_ns: self.checkpoint_ns.load(Ordering::Relaxed),
            held_records: self.held_records.load(Ordering::Relaxed),
            data_runs: self.data_runs.load(Ordering::Relaxed),
            checkpoints: self.checkpoints(),
            apply_ns: self.apply_ns.load(Ordering::Relaxed),
            drains: self.drains.load(Ordering::Relaxed),
            drain_ns: self.drain_ns.load(Ordering::Relaxed),
            room_waits: self.room_waits.load(Ordering::Relaxed),
            room_wait_ns: self.room_wait_ns.load(Ordering::Relaxed),
        }
    }

    // ------------------------------------------------------------------ the latch

    /// Ok while running; `Shutdown` once stopped or failed.
    pub fn check_running(&self) -> Result<()> {
        match self.state.load(Ordering::Acquire) {
            STATE_RUNNING if !self.half_changed.load(Ordering::Acquire) => Ok(()),
            _ => Err(Error::Shutdown),
        }
    }

    pub fn is_failed(&self) -> bool {
        self.state.load(Ordering::Acquire) == STATE_FAILED
    }

    /// Latches the failure (the first reason is kept) and wakes every waiter.
    pub fn fail(&self, error: &Error) {
        {
            let mut failure = self.failure.lock();
            if failure.is_none() {
                *failure = Some(error.to_string());
            }
        }
        self.state.store(STATE_FAILED, Ordering::Release);
        // Notify with the mutexes taken, so a waiter between its check and its wait cannot
        // miss the wake-up.
        drop(self.applied_lsn.lock());
        self.applied_signal.notify_all();
        drop(self.queue.lock());
        self.queue_signal.notify_all();
    }

    /// Marks the back end stopped after a clean unmount: later calls get `Shutdown`.
    pub fn mark_stopped(&self) {
        let _ = self.state.compare_exchange(STATE_RUNNING, STATE_STOPPED, Ordering::AcqRel, Ordering::Acquire);
    }

    pub fn is_stopped(&self) -> bool {
        self.state.load(Ordering::Acquire) == STATE_STOPPED
    }

    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    // ------------------------------------------------------------------ appends

    /// Appends a record through `append_to_log` (which must use `Log::append`, never
    /// `append_reserved`: reserve records are the back end's own and are never queued), then
    /// deposits it at its lsn. Safe to call from many threads at once: no lock is held while
    /// the log copies the record, and the deposit takes none (`deposits`). Until
    /// the deposit, the log knows the lsn as a logical record, so neither a pass nor a
    /// checkpoint's "first unapplied record" passes over it. `None` when the log is full.
    pub fn enqueue(
        &self,
        op: Op,
        reserved_blocks: u64,
        image_blocks: u64,
        append_to_log: impl FnOnce(&Op) -> Result<Option<u64>>,
    ) -> Result<Option<u64>> {
        let lsn = match append_to_log(&op) {
            Ok(Some(lsn)) => lsn,
            Ok(None) => return Ok(None),
            Err(error) => {
                self.fail(&error);
                return Err(error);
            }
        };
        self.deposits.deposit(Queued { lsn, op: Arc::new(op), reserved_blocks, image_blocks });
        self.last_queued_lsn.fetch_max(lsn, Ordering::AcqRel);
        Ok(Some(lsn))
    }

    /// Takes the next durable records deposited, in lsn order (`Consumer::take_prefix`).
    fn take_prefix(&self, durable_lsn: u64, max: usize, image_blocks_max: u64) -> Vec<Queued> {
        let passes_over = |lsn| deposits::log_passes_over(&self.log, lsn);
        self.queue.lock().take_prefix(&self.deposits, durable_lsn, max, image_blocks_max, &passes_over)
    }

    // ------------------------------------------------------------------ the thread

    fn run(&self, sink: &dyn FrontSink) {
        self.run_passes(sink);
        // Whatever is still on the workers is made applied before the thread ends (an error
        // latches; after a failure nothing is, and this only waits for the workers to let go
        // of the volume).
        let mut policy = self.policy.lock();
        if self.finish_in_flight(&mut policy, sink).is_err() {
            wait_for_workers(&policy);
        }
    }

    fn run_passes(&self, sink: &dyn FrontSink) {
        while !self.stop.load(Ordering::Acquire) {
            match self.pass(sink) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(_) => return,
            }
            let durable = self.log.durable_lsn();
            let waiting = self.queue.lock().first_waiting(self.last_queued_lsn.load(Ordering::Acquire));
            match waiting {
                // Records are waiting to become durable: the log's flusher makes them so.
                Some(lsn) if lsn > durable => {
                    if let Err(error) = self.log.wait_for_durable_above(durable, Duration::from_millis(5)) {
                        self.fail(&error);
                        return;
                    }
                }
                // Durable, yet the pass took nothing: a record before it is still on its way
                // from its appender to the queue.
                Some(_) => {
                    let mut queue = self.queue.lock();
                    if !self.stop.load(Ordering::Acquire) && !self.is_failed() {
                        self.queue_signal.wait_for(&mut queue, DEPOSIT_WAIT);
                    }
                }
                None => {
                    let mut queue = self.queue.lock();
                    let last_queued = self.last_queued_lsn.load(Ordering::Acquire);
                    if queue.first_waiting(last_queued).is_none()
                        && !self.stop.load(Ordering::Acquire)
                        && !self.is_failed()
                    {
                        self.queue_signal.wait_for(&mut queue, Duration::from_millis(200));
                    }
                }
            }
        }
    }

    /// Applies durable queued records; returns whether it applied any (or any batch handed to
    /// the workers is still in flight). Also checkpoints when the log or the dirty set has
    /// grown, or time has passed.
    ///
    /// With a back-end thread and apply workers, a batch that splits into groups goes to the
    /// workers and the pass returns at once: batches overlap (`parallel::Job`), and each is made
    /// applied (the front end told, the applied lsn moved) when it and every batch before it are
    /// done. A checkpoint, a batch applied with the volume held, and the end of the thread wait
    /// until none is in flight. Without a thread, every pass finishes what it started.
    pub fn pass(&self, sink: &dyn FrontSink) -> Result<bool> {
        // First, so that it drops last: every lock below is released before it latches.
        let _latch_on_panic = PanicLatch(self);
        let mut policy = self.policy.lock();
        if self.is_failed() {
            return Err(Error::Shutdown);
        }
        let mut progressed = self.publish_finished(&mut policy, sink)?;
        let durable = self.log.durable_lsn();
        let batch_max = if self.pool.is_some() { PARALLEL_BATCH_RECORDS_MAX } else { BATCH_RECORDS_MAX };
        // The next checkpoint images the blocks dirty now and those of every record in flight
        // (they are applied before its snapshot), and its images must fit the log's reserve
        // (see `log::pledge`): hand out only records whose bounds still fit beside them.
        let in_flight_blocks = policy.in_flight_image_blocks();
        let room_blocks =
            self.log.reserve_image_blocks().saturating_sub(self.pledges.dirty_blocks() + in_flight_blocks);
        let mut batch: Vec<Queued> =
            if policy.jobs.len() < JOBS_IN_FLIGHT_MAX && (room_blocks > 0 || policy.jobs.is_empty()) {
                self.take_prefix(durable, batch_max, room_blocks)
            } else {
                Vec::new()
            };
        if batch.is_empty() {
            if let Some(head) = policy.jobs.front() {
                // Nothing new to hand out: wait a little for the oldest batch in flight.
                head.job.wait_finished(IN_FLIGHT_WAIT);
                progressed |= self.publish_finished(&mut policy, sink)?;
                progressed |= !policy.jobs.is_empty();
            }
            self.maybe_checkpoint(&mut policy, false, sink)?;
            return Ok(progressed);
        }
        if let Some(pool) = &self.pool {
            let groups = parallel::group_by_inode(&batch);
            if (groups.len() > 1 || !policy.jobs.is_empty())
                && !batch.iter().any(|queued| parallel::needs_whole_volume(&queued.op))
                && !self.space_low_for(&batch, &policy)
            {
                self.submit_batch(pool, &mut policy, batch, groups);
                if !self.background {
                    self.finish_in_flight(&mut policy, sink)?;
                }
                self.maybe_checkpoint(&mut policy, false, sink)?;
                return Ok(true);
            }
        }
        // The volume held throughout: nothing else may be applying.
        self.finish_in_flight(&mut policy, sink)?;
        let started = Instant::now();
        let AppliedBatch { applied_count, owned_blocks, free_blocks, pending_free_blocks } =
            self.apply_batch_held(&batch)?;
        self.apply_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let space_low = applied_count < batch.len();
        if space_low {
            // Back to the head of the queue, in lsn order: they precede everything queued since.
            let leftover = batch.split_off(applied_count);
            self.queue.lock().put_back(&self.deposits, leftover);
        }
        self.publish_applied(&mut policy, &batch, owned_blocks, free_blocks, pending_free_blocks, sink);
        self.maybe_checkpoint(&mut policy, space_low, sink)?;
        Ok(true)
    }

    /// Whether free blocks run so low that `batch`, with the batches in flight, might need a
    /// checkpoint half way: such a batch is applied record by record with the volume held,
    /// which stops to checkpoint.
    fn space_low_for(&self, batch: &[Queued], policy: &CheckpointPolicy) -> bool {
        let images_bound: u64 =
            batch.iter().map(|queued| queued.image_blocks).sum::<u64>() + policy.in_flight_image_blocks();
        let volume = self.volume.lock();
        volume.free_blocks() < BACKEND_LOW_WATER_BLOCKS + images_bound && volume.blocks.pending_free_count() > 0
    }

    /// Hands `batch` to the workers; it is made applied by a later `publish_finished`.
    fn submit_batch(&self, pool: &ApplyPool, policy: &mut CheckpointPolicy, batch: Vec<Queued>, groups: Vec<Vec<u32>>) {
        let context =
            JobContext { volume: &self.volume, memo: &self.memo, applier: &self.applier, pledges: &self.pledges };
        let job = Arc::new(Job::new(pool.next_job_id(), context, &batch, groups));
        pool.submit(&job);
        if policy.jobs.is_empty() {
            policy.pipeline_since = Some(Instant::now());
        }
        let image_blocks = batch.iter().map(|queued| queued.image_blocks).sum();
        policy.jobs.push_back(InFlight { job, batch, image_blocks });
        assert!(policy.jobs.len() <= JOBS_IN_FLIGHT_MAX);
    }

    /// Makes applied the finished batches at the head of those in flight, in order; returns
    /// whether there were any.
    fn publish_finished(&self, policy: &mut CheckpointPolicy, sink: &dyn FrontSink) -> Result<bool> {
        let mut published = false;
        while policy.jobs.front().is_some_and(|flight| flight.job.is_finished()) {
            let flight = policy.jobs.pop_front().expect("a batch in flight");
            self.publish_job(policy, flight, sink)?;
            published = true;
        }
        Ok(published)
    }

    /// Waits for every batch in flight and makes each applied, in order.
    fn finish_in_flight(&self, policy: &mut CheckpointPolicy, sink: &dyn FrontSink) -> Result<()> {
        while let Some(flight) = policy.jobs.pop_front() {
            self.publish_job(policy, flight, sink)?;
        }
        Ok(())
    }

    /// Collects one batch from the workers (waiting for it) and makes it applied; latches its
    /// error.
    fn publish_job(&self, policy: &mut CheckpointPolicy, flight: InFlight, sink: &dyn FrontSink) -> Result<()> {
        // Once the back end has failed nothing more is made applied: a batch after the one that
        // failed may have finished on the workers, but the records of the failed one before it
        // are not all in the volume, and the applied lsn must stay a watermark below which
        // everything is. (Making such a later batch applied let the front end answer from the
        // volume as if the failed batch's records were there: a listing missing a name, a read
        // answering NotFound.)
        if self.is_failed() {
            return Err(Error::Shutdown);
        }
        let report = flight.job.wait().inspect_err(|error| self.fail(error))?;
        // The pipeline's time is counted at every collected batch, not only when it empties: a
        // pipeline kept busy for a whole run counted nothing before, and the statistics read
        // then showed its workers' busy time over a span of zero.
        if let Some(since) = policy.pipeline_since {
            let now = Instant::now();
            let elapsed_ns = now.duration_since(since).as_nanos() as u64;
            self.parallel_ns.fetch_add(elapsed_ns, Ordering::Relaxed);
            self.apply_ns.fetch_add(elapsed_ns, Ordering::Relaxed);
            policy.pipeline_since = (!policy.jobs.is_empty()).then_some(now);
        }
        self.worker_busy_ns.fetch_add(report.busy_ns, Ordering::Relaxed);
        self.worker_lock_wait_ns.fetch_add(report.lock_wait_ns, Ordering::Relaxed);
        self.worker_lock_held_ns.fetch_add(report.lock_held_ns, Ordering::Relaxed);
        self.worker_lock_takes.fetch_add(report.lock_takes, Ordering::Relaxed);
        self.parallel_records.fetch_add(flight.batch.len() as u64, Ordering::Relaxed);
        self.parallel_batches.fetch_add(1, Ordering::Relaxed);
        self.parallel_groups.fetch_add(flight.job.group_count() as u64, Ordering::Relaxed);
        let (free_blocks, pending_free_blocks) = {
            let volume = self.volume.lock();
            (volume.free_blocks(), volume.blocks.pending_free_count())
        };
        self.publish_applied(policy, &flight.batch, report.owned_blocks, free_blocks, pending_free_blocks, sink);
        Ok(())
    }

    /// Tells the front end what `batch` changed and moves the applied lsn to its last record.
    fn publish_applied(
        &self,
        policy: &mut CheckpointPolicy,
        batch: &[Queued],
        owned_blocks: Vec<(u64, u64)>,
        free_blocks: u64,
        pending_free_blocks: u64,
        sink: &dyn FrontSink,
    ) {
        let last_lsn = batch.last().expect("at least one record is applied per batch").lsn;
        sink.batch_applied(&BatchSummary { records: batch, owned_blocks, free_blocks, pending_free_blocks, last_lsn });
        {
            let mut applied = self.applied_lsn.lock();
            assert!(last_lsn > *applied, "records apply in lsn order");
            *applied = last_lsn;
            self.applied_lsn_fast.store(last_lsn, Ordering::Release);
        }
        self.applied_signal.notify_all();
        policy.applied_since_checkpoint += batch.len() as u64;
        policy.applied_bytes_since_checkpoint +=
            batch.iter().map(|queued| (RECORD_OVERHEAD_BYTES + queued.op.tail().len()) as u64).sum::<u64>();
    }

    /// Applies a batch in this thread, holding the volume lock for `BATCH_RECORDS_MAX` records
    /// at a time; stops early when free blocks run low (see below).
    fn apply_batch_held(&self, batch: &[Queued]) -> Result<AppliedBatch> {
        // Changes made with the volume held do not pass through the workers' memo.
        if self.pool.is_some() {
            self.memo.clear();
        }
        let mut owned: Vec<(u64, u64)> = Vec::new();
        let mut applied_count = 0;
        let mut volume = self.volume.lock();
        // Data records of one file in a row share one tree open and commit (issue 12,
        // `Applier::apply_in_run`); the run ends before every look at the volume below.
        let mut run = None;
        for queued in batch {
            let boundary = applied_count > 0 && applied_count % BATCH_RECORDS_MAX == 0;
            let low = volume.free_blocks() < BACKEND_LOW_WATER_BLOCKS;
            if boundary || low {
                if let Err(error) = self.end_run_held(&mut volume, &mut run, &mut owned) {
                    return Err(self.fail_held(volume, error));
                }
            }
            if boundary {
                // Appenders may read the dirt while the lock is let go.
                volume.publish_image_estimate();
                // The records so far are whole: readers of the mirror may trust it meanwhile.
                volume.end_change();
                MutexGuard::bump(&mut volume);
            }
            // Blocks the back end frees (leaves that compaction empties, for one) are reusable
            // only after a checkpoint records the free. When free blocks run low while some are
            // pending, stop the batch and checkpoint first, rather than fail an allocation that
            // the next checkpoint would have satisfied. At least one record is applied per
            // pass, so the back end always makes progress.
            if applied_count > 0
                && volume.free_blocks() < BACKEND_LOW_WATER_BLOCKS
                && volume.blocks.pending_free_count() > 0
            {
                break;
            }
            match self.applier.apply_in_run(&mut *volume, queued.lsn, &queued.op, &mut run) {
                Ok(written) => owned.extend(written),
                Err(error) => {
                    self.applier.abort_run(&mut *volume, &mut run);
                    return Err(self.fail_held(volume, error));
                }
            }
            applied_count += 1;
        }
        if let Err(error) = self.end_run_held(&mut volume, &mut run, &mut owned) {
            return Err(self.fail_held(volume, error));
        }
        self.held_records.fetch_add(applied_count as u64, Ordering::Relaxed);
        // Their dirt first, then their bounds (see `Pledges::total_blocks`); records put back
        // for the next pass keep theirs.
        volume.publish_image_estimate();
        volume.end_change();
        self.pledges.records_applied(batch[..applied_count].iter().map(|queued| queued.image_blocks).sum());
        Ok(AppliedBatch {
            applied_count,
            owned_blocks: owned,
            free_blocks: volume.free_blocks(),
            pending_free_blocks: volume.blocks.pending_free_count(),
        })
    }

    /// Ends the data run `run` if one is open (`Applier::end_run`), counting it.
    fn end_run_held(&self, volume: &mut Volume, run: &mut Option<DataRun>, owned: &mut Vec<(u64, u64)>) -> Result<()> {
        if run.is_some() {
            owned.extend(self.applier.end_run(volume, run)?);
            self.data_runs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// An error applying records with the volume held: the records may be half applied (a
    /// directory entry without its count), and readers must find that out before they can take
    /// the lock; then the back end stops.
    fn fail_held(&self, mut volume: MutexGuard<'_, Volume>, error: Error) -> Error {
        volume.mark_half_changed(&error);
        drop(volume);
        self.fail(&error);
        error
    }

    /// Takes a checkpoint when one is due (or `force`). In background mode only its snapshot
    /// stops the passes: the images travel to the log and home in a thread of their own while
    /// the next batches apply (`backend::checkpoint_finish` says why that is safe), and the
    /// next call collects it. A forced checkpoint (unmount, free blocks running low, an
    /// explicit call) is waited for, as is one in flight before it: the caller needs what it
    /// makes reusable.
    fn maybe_checkpoint(&self, policy: &mut CheckpointPolicy, force: bool, sink: &dyn FrontSink) -> Result<()> {
        let mut due = force || self.checkpoint_due(policy);
        if due && !policy.jobs.is_empty() {
            // A checkpoint covers exactly the applied prefix, with no worker changing the
            // volume under its snapshot: the batches in flight finish first (and may make one
            // due that was not).
            self.finish_in_flight(policy, sink)?;
            due = force || self.checkpoint_due(policy);
        }
        // One in flight is collected when it is done, and waited for when the next one is due:
        // the passes must not run on while a due checkpoint cannot start, or the dirty set would
        // outgrow the half of the log's reserve that each checkpoint's images may take (the
        // images of the one before may still be in the log: its tail stops at the first record
        // after what it covers, which a pass beside it applied, but which precedes its images).
        if let Some(in_flight) = policy.in_flight.take() {
            if !due && !in_flight.is_finished() {
                policy.in_flight = Some(in_flight);
                return Ok(());
            }
            self.join_checkpoint(in_flight)?;
            self.report_space(sink);
        }
        if !due || (policy.applied_since_checkpoint == 0 && !force) {
            return Ok(());
        }
        let applied = *self.applied_lsn.lock();
        // The workers' memo stays: a checkpoint changes no payload the memo can hold (see
        // `store::Memo`). Clearing it here cost every directory's working set a reload under
        // the volume lock after each checkpoint, a third of the workers' lock takes.
        let started = Instant::now();
        let snapshot =
            checkpoint_snapshot(&self.volume, applied, Some(&self.pledges)).inspect_err(|error| self.fail(error))?;
        policy.last_checkpoint = Instant::now();
        policy.applied_since_checkpoint = 0;
        policy.applied_bytes_since_checkpoint = 0;
        let finished = if self.background {
            let (volume, log) = (self.volume.clone(), self.log.clone());
            let spawned = std::thread::Builder::new()
                .name("tandem-checkpoint".into())
                .spawn(move || checkpoint_finish(&volume, &log, snapshot))
                .map_err(|error| Error::Io { operation: "start checkpoint thread", offset: 0, source: error });
            match spawned {
                Ok(handle) if !force => {
                    policy.in_flight = Some(handle);
                    self.checkpoints_beside.fetch_add(1, Ordering::Relaxed);
                    None
                }
                Ok(handle) => Some(self.join_checkpoint(handle)),
                Err(error) => Some(Err(error)),
            }
        } else {
            Some(checkpoint_finish(&self.volume, &self.log, snapshot).map(|()| {
                self.checkpoints.fetch_add(1, Ordering::Relaxed);
            }))
        };
        self.checkpoint_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match finished {
            None => Ok(()),
            Some(Ok(())) => {
                self.report_space(sink);
                Ok(())
            }
            Some(Err(error)) => {
                self.fail(&error);
                Err(error)
            }
        }
    }

    /// Whether the records applied since the last checkpoint call for one now.
    fn checkpoint_due(&self, policy: &CheckpointPolicy) -> bool {
        if policy.applied_since_checkpoint == 0 {
            return false;
        }
        let usage = self.log.usage();
        let (image_blocks, free_blocks, pending_free_blocks) = {
            let volume = self.volume.lock();
            (volume.image_estimate_blocks(), volume.free_blocks(), volume.blocks.pending_free_count())
        };
        // A checkpoint frees the log only up to the last applied record, so it is due when what
        // was applied since the last one fills a good part of the log's normal share, not when
        // the log is full of records still waiting to be applied (checkpointing then would only
        // add images). Its images go to the reserve: take one while they fill half of it, so
        // that the other half takes the records in flight (see `pass`).
        let interval = Duration::from_millis(self.checkpoint_interval_ms.load(Ordering::Relaxed));
        policy.applied_bytes_since_checkpoint * 4 > usage.data_bytes_normal
            || policy.applied_since_checkpoint * 4 > usage.header_slots_normal
            || image_blocks * 2 > self.log.reserve_image_blocks()
            // Freed blocks wait for a checkpoint before reuse: take one before they are a
            // large share of what the volume could hand out.
            || pending_free_blocks * 2 > free_blocks
            || policy.last_checkpoint.elapsed() > interval
    }

    /// Waits for a checkpoint's thread; latches its failure (or panic).
    fn join_checkpoint(&self, handle: std::thread::JoinHandle<Result<()>>) -> Result<()> {
        let waited = Instant::now();
        let finished = handle.join().unwrap_or_else(|panic| {
            Err(Error::invalid(format!("checkpoint thread panicked: {}", panic_reason(&*panic))))
        });
        self.checkpoint_ns.fetch_add(waited.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match finished {
            Ok(()) => {
                self.checkpoints.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                self.fail(&error);
                Err(error)
            }
        }
    }

    /// Tells the front end the free counts after a checkpoint made frees reusable.
    fn report_space(&self, sink: &dyn FrontSink) {
        let (free_blocks, pending_free_blocks) = {
            let volume = self.volume.lock();
            (volume.free_blocks(), volume.blocks.pending_free_count())
        };
        sink.space_changed(free_blocks, pending_free_blocks);
    }

    // ------------------------------------------------------------------ drains and waits

    /// Makes every appended record durable and applies all of them; checkpoints only where the
    /// back end's own rules call for one.
    pub fn drain(&self, sink: &dyn FrontSink) -> Result<()> {
        let started = Instant::now();
        let drained = self.drain_all(sink);
        self.drains.fetch_add(1, Ordering::Relaxed);
        self.drain_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        drained
    }

    fn drain_all(&self, sink: &dyn FrontSink) -> Result<()> {
        // Checkpoint records never enter the queue: once the applied lsn reaches the last
        // queued record, every logical record appended before the call is applied. A pass
        // waits for one the thread is running, so this also waits for a batch in flight.
        let target_lsn = self.last_queued_lsn.load(Ordering::Acquire);
        for _ in 0..DRAIN_PASSES_MAX {
            self.log.flush()?;
            if self.applied_lsn() >= target_lsn {
                return Ok(());
            }
            if !self.pass(sink)? {
                std::thread::sleep(IDLE_PASS_WAIT);
            }
        }
        let error = Error::invalid("back end made no progress while draining");
        self.fail(&error);
        Err(error)
    }

    /// Waits until the back end releases part of the log's pledge of images after the release
    /// count `releases_seen` (read before the refused admission): the caller's append was refused
    /// because the backlog is full, and applying any group of records releases its share. The
    /// log is flushed first, since the back end applies only durable records. Without a
    /// back-end thread, or when nothing is released for `ROOM_WAIT_MAX`, drains in this thread
    /// instead. Unlike `drain`, this does not wait for the whole backlog: many threads refused
    /// at once all go on as soon as the first groups of the next batch are applied.
    pub fn wait_for_room(&self, releases_seen: u64, sink: &dyn FrontSink) -> Result<()> {
        if !self.background {
            return self.drain(sink);
        }
        let started = Instant::now();
        let seen = releases_seen;
        self.log.flush()?;
        self.queue_signal.notify_all();
        let give_up = || self.is_failed() || self.stop.load(Ordering::Acquire);
        if self.pledges.wait_released(seen, ROOM_WAIT_MAX, WAIT_SLICE, &give_up) {
            self.room_waits.fetch_add(1, Ordering::Relaxed);
            self.room_wait_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            return Ok(());
        }
        if give_up() {
            return Err(Error::Shutdown);
        }
        self.drain(sink)
    }

    /// Drains, then checkpoints: frees log space, returns reserved blocks and makes freed
    /// blocks reusable.
    pub fn drain_and_checkpoint(&self, sink: &dyn FrontSink) -> Result<()> {
        self.drain(sink)?;
        let mut policy = self.policy.lock();
        self.maybe_checkpoint(&mut policy, true, sink)
    }

    /// Checkpoints the records applied since the last checkpoint when they hold at least a
    /// sixteenth of the log's normal share (records or bytes); false when they hold less, which
    /// would not be worth a checkpoint's images.
    pub fn checkpoint_applied(&self, sink: &dyn FrontSink) -> Result<bool> {
        let usage = self.log.usage();
        let mut policy = self.policy.lock();
        if policy.applied_since_checkpoint * 16 < usage.header_slots_normal
            && policy.applied_bytes_since_checkpoint * 16 < usage.data_bytes_normal
        {
            return Ok(false);
        }
        self.maybe_checkpoint(&mut policy, true, sink)?;
        Ok(true)
    }

    /// Waits until the record `lsn` has been applied; `Shutdown` as soon as the back end fails.
    pub fn wait_applied(&self, lsn: u64, sink: &dyn FrontSink) -> Result<()> {
        if self.applied_lsn() >= lsn {
            return Ok(());
        }
        self.log.flush()?;
        if !self.background {
            for _ in 0..DRAIN_PASSES_MAX {
                if self.applied_lsn() >= lsn {
                    return Ok(());
                }
                if !self.pass(sink)? {
                    std::thread::sleep(IDLE_PASS_WAIT);
                    self.log.flush()?;
                }
            }
            let error = Error::invalid(format!("back end made no progress towards lsn {lsn}"));
            self.fail(&error);
            return Err(error);
        }
        self.queue_signal.notify_all();
        let mut applied = self.applied_lsn.lock();
        while *applied < lsn {
            if self.is_failed() {
                return Err(Error::Shutdown);
            }
            if self.stop.load(Ordering::Acquire) {
                // The thread is gone: nothing will apply the record.
                return Err(Error::Shutdown);
            }
            self.applied_signal.wait_for(&mut applied, WAIT_SLICE);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::open_volume;
    use crate::backend::record::AttributeImage;
    use crate::device::{Device, MemoryDevice};
    use crate::fs::types::{FormatOptions, ROOT_INODE};
    use crate::fs::FileSystem;
    use crate::log::LogOptions;

    struct PanickingSink;

    impl FrontSink for PanickingSink {
        fn batch_applied(&self, _summary: &BatchSummary<'_>) {
            panic!("injected fault in the front end's bookkeeping");
        }
        fn space_changed(&self, _free_blocks: u64, _pending_free_blocks: u64) {}
    }

    fn backend_on_fresh_volume(background: bool) -> Arc<Backend> {
        backend_with_workers(background, 1)
    }

    fn backend_with_workers(background: bool, workers: usize) -> Arc<Backend> {
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
        FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
        let log_options = LogOptions { flush_delay_us: 1_000, reserve_fraction: 0.5 };
        let (volume, log, applier, _) = open_volume(device, log_options, 1024, true).unwrap();
        let applied_lsn = log.next_lsn() - 1;
        Backend::new(volume, log, applier, applied_lsn, background, workers).unwrap()
    }

    /// Appends an attribute record for the root that changes nothing.
    fn enqueue_root_touch(backend: &Backend) -> u64 {
        let root = backend.volume().unwrap().read_inode(ROOT_INODE).unwrap();
        let op = Op::SetAttributes { inode: AttributeImage::from_inode(&root), truncate: false };
        let head = op.encode_head();
        let log = backend.log().clone();
        backend.enqueue(op, 0, 0, |op| log.append(op.kind(), &[&head, op.tail()])).unwrap().unwrap()
    }

    /// A change that failed half way under the volume lock (a worker's commit) refuses every
    /// later change at once, before the back end collects the failed batch and latches: a
    /// reader refused by the half-changed volume must never see a later change acknowledged.
    #[test]
    fn a_half_changed_volume_refuses_changes_before_the_failure_is_latched() {
        let backend = backend_on_fresh_volume(false);
        backend.check_running().unwrap();
        backend.volume.lock().mark_half_changed(&Error::corruption("a commit failed half way"));
        assert!(!backend.is_failed(), "the failure is not latched yet");
        assert!(matches!(backend.check_running(), Err(Error::Shutdown)));
    }

    struct QuietSink;

    impl FrontSink for QuietSink {
        fn batch_applied(&self, _summary: &BatchSummary<'_>) {}
        fn space_changed(&self, _free_blocks: u64, _pending_free_blocks: u64) {}
    }

    /// Enqueues a root touch whose appender stops between its append and its deposit until
    /// `proceed` is passed (`reached` is passed once it got its lsn).
    fn enqueue_root_touch_stalled(
        backend: &Backend,
        reached: &std::sync::Barrier,
        proceed: &std::sync::Barrier,
    ) -> Option<u64> {
        let root = backend.volume().unwrap().read_inode(ROOT_INODE).unwrap();
        let op = Op::SetAttributes { inode: AttributeImage::from_inode(&root), truncate: false };
        let head = op.encode_head();
        let log = backend.log().clone();
        let append = |op: &Op| {
            let appended = log.append(op.kind(), &[&head, op.tail()]);
            reached.wait();
            proceed.wait();
            appended
        };
        backend.enqueue(op, 0, 0, append).unwrap()
    }

    /// Once the back end has failed, a batch that finished on the workers is not made applied:
    /// the applied lsn is a watermark below which every record is in the volume, and the batch
    /// that failed may lie below this one. (A streaming pass made such a batch applied at the
    /// end of its thread; `crash_threads` then listed directories without the failed batch's
    /// names.)
    #[test]
    fn nothing_is_made_applied_after_a_failure() {
        let backend = backend_with_workers(false, 4);
        let before = backend.applied_lsn();
        let lsn = enqueue_root_touch(&backend);
        backend.log.flush().unwrap();
        let mut policy = backend.policy.lock();
        let batch = backend.take_prefix(backend.log.durable_lsn(), 16, u64::MAX);
        assert_eq!(batch.len(), 1);
        let groups = parallel::group_by_inode(&batch);
        backend.submit_batch(backend.pool.as_ref().unwrap(), &mut policy, batch, groups);
        assert!(policy.jobs[0].job.wait_finished(Duration::from_secs(60)), "the workers apply the batch");
        backend.fail(&Error::invalid("an earlier batch failed"));
        assert!(matches!(backend.finish_in_flight(&mut policy, &QuietSink), Err(Error::Shutdown)));
        assert_eq!(backend.applied_lsn(), before, "record {lsn} was made applied after the failure");
        drop(policy);
        backend.stop();
    }

    /// A record appended but not yet deposited holds up the records after it: a pass applies
    /// none of them, and a checkpoint's tail stops at it, not at a later one.
    /// Appending does not hold the queue: others enqueue meanwhile.
    #[test]
    fn a_record_on_its_way_to_the_queue_is_not_passed_over() {
        let backend = backend_on_fresh_volume(false);
        let before = backend.applied_lsn();
        let reached = std::sync::Barrier::new(2);
        let proceed = std::sync::Barrier::new(2);
        std::thread::scope(|scope| {
            let stalled = scope.spawn(|| enqueue_root_touch_stalled(&backend, &reached, &proceed));
            reached.wait();
            let later = enqueue_root_touch(&backend);
            backend.log().flush().unwrap();
            assert!(backend.log().durable_lsn() >= later);
            assert!(!backend.pass(&QuietSink).unwrap(), "a pass skipped the record on its way");
            assert_eq!(backend.applied_lsn(), before);
            // A checkpoint's tail stops at it: the log knows it as a logical record from its
            // reservation on (`backend::checkpoint_finish`).
            assert_eq!(backend.log().appended_with_reserve(later - 1), Some(false));
            proceed.wait();
            let stalled_lsn = stalled.join().unwrap().unwrap();
            assert_eq!(stalled_lsn, later - 1);
            backend.drain(&QuietSink).unwrap();
            assert_eq!(backend.applied_lsn(), later);
        });
    }

    /// Many threads enqueue at once while checkpoints append their own records in between:
    /// the back end applies every record, in lsn order, and a drain means all of them.
    #[test]
    fn parallel_enqueues_apply_in_lsn_order_around_checkpoints() {
        let backend = backend_on_fresh_volume(true);
        let applied: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(Vec::new()));
        struct RecordingSink(Arc<Mutex<Vec<u64>>>);
        impl FrontSink for RecordingSink {
            fn batch_applied(&self, summary: &BatchSummary<'_>) {
                self.0.lock().extend(summary.records.iter().map(|queued| queued.lsn));
            }
            fn space_changed(&self, _free_blocks: u64, _pending_free_blocks: u64) {}
        }
        let sink = Arc::new(RecordingSink(applied.clone()));
        backend.start(sink.clone()).unwrap();
        let mut lsns: Vec<u64> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..6)
                .map(|_| scope.spawn(|| (0..150).map(|_| enqueue_root_touch(&backend)).collect::<Vec<u64>>()))
                .collect();
            for _ in 0..5 {
                backend.drain_and_checkpoint(sink.as_ref()).unwrap();
            }
            workers.into_iter().flat_map(|worker| worker.join().unwrap()).collect()
        });
        backend.drain_and_checkpoint(sink.as_ref()).unwrap();
        assert!(backend.checkpoints() >= 1);
        lsns.sort_unstable();
        assert_eq!(*applied.lock(), lsns, "applied in lsn order, each once");
        assert_eq!(backend.applied_lsn(), *lsns.last().unwrap());
        backend.stop();
    }

    /// Appends `op` as a record of its own and returns its lsn.
    fn enqueue_op(backend: &Backend, op: Op) -> u64 {
        let head = op.encode_head();
        let log = backend.log().clone();
        backend.enqueue(op, 0, 0, |op| log.append(op.kind(), &[&head, op.tail()])).unwrap().unwrap()
    }

    /// The entries the root's list holds, read as a front-end reader would but past the
    /// refusal, to show what the refusal keeps from readers.
    fn list_root_unchecked(backend: &Backend) -> Result<u64> {
        let mut volume = backend.volume_for_statistics();
        let root = crate::dir::DirRoot::decode(&volume.read_inode(ROOT_INODE)?.root_area)?;
        let mut listed = 0;
        crate::dir::readdir(&mut *volume, &root, &backend.applier().hash_seed, 2, &mut |_| {
            listed += 1;
            true
        })?;
        Ok(listed)
    }

    /// A regular file's attributes, a child of the root.
    fn file_image(number: u64) -> AttributeImage {
        let mut inode = crate::block::inode::Inode::empty_directory(number, 1, 0o644, ROOT_INODE, 0);
        inode.mode = 0o100644;
        inode.link_count = 1;
        AttributeImage::from_inode(&inode)
    }

    fn create_op(parent: &AttributeImage, name: &[u8], inode: AttributeImage) -> Op {
        Op::Create { parent: parent.clone(), name: name.to_vec(), inode, symlink_target: vec![] }
    }

    /// The same on the parallel path: a worker's commit that fails after it wrote the
    /// directory's blocks (here the create of an inode already in use, seen only at the
    /// commit) must leave the volume refusing readers before it lets go of the lock.
    #[test]
    fn a_commit_failed_half_way_is_never_read() {
        let backend = backend_with_workers(false, 2);
        let root = AttributeImage::from_inode(&backend.volume().unwrap().read_inode(ROOT_INODE).unwrap());
        let directory = AttributeImage::from_inode(&crate::block::inode::Inode::empty_directory(2, 1, 0o755, 1, 0));
        enqueue_op(&backend, create_op(&root, b"d", directory.clone()));
        enqueue_op(&backend, create_op(&root, b"a", file_image(3)));
        backend.drain(&QuietSink).unwrap();
        assert_eq!(list_root_unchecked(&backend).unwrap(), 2);
        // Two groups ({root, 3} and {d, 4}), so the batch goes to the workers. (Applied with
        // the volume held, the create would fail before its entry is inserted, and the last
        // assertion would fail.)
        enqueue_op(&backend, create_op(&root, b"x", file_image(3)));
        enqueue_op(&backend, create_op(&directory, b"y", file_image(4)));
        backend.log().flush().unwrap();
        assert!(backend.pass(&QuietSink).is_err());
        assert!(backend.is_failed());
        assert!(matches!(backend.volume(), Err(Error::Shutdown)), "a reader was let in after a half commit");
        assert!(list_root_unchecked(&backend).is_err(), "the commit left nothing half made: the test shows nothing");
        backend.stop();
    }

    /// A record that fails half way (here an unlink whose entry names another inode: the entry
    /// is gone from the list before the mismatch is seen) leaves the volume refusing every
    /// reader, so that no lookup or listing answers from half a record. The crash test with
    /// threads met this as "directory list holds N entries, its root counts N+1" when the
    /// device died under a record and a reader took the volume lock before the latch.
    #[test]
    fn a_record_failed_half_way_is_never_read() {
        let backend = backend_on_fresh_volume(false);
        let root = AttributeImage::from_inode(&backend.volume().unwrap().read_inode(ROOT_INODE).unwrap());
        for (number, name) in [(2u64, b"a"), (3, b"b")] {
            enqueue_op(&backend, create_op(&root, name, file_image(number)));
        }
        backend.drain(&QuietSink).unwrap();
        assert_eq!(list_root_unchecked(&backend).unwrap(), 2);
        let mismatched = Op::Unlink {
            parent: root.clone(),
            name: b"a".to_vec(),
            inode: file_image(3),
            disposition: crate::backend::record::Disposition::Reclaim,
        };
        let lsn = enqueue_op(&backend, mismatched);
        backend.log().flush().unwrap();
        assert!(matches!(backend.pass(&QuietSink), Err(Error::Corruption { .. })));
        assert!(backend.is_failed());
        assert!(matches!(backend.volume(), Err(Error::Shutdown)), "a reader was let in after a half-applied record");
        assert!(list_root_unchecked(&backend).is_err(), "the record left nothing half made: the test shows nothing");
        assert!(matches!(backend.wait_applied(lsn, &QuietSink), Err(Error::Shutdown)));
    }

    #[test]
    fn a_panic_in_the_backend_thread_latches_and_wakes_waiters() {
        let backend = backend_on_fresh_volume(true);
        backend.start(Arc::new(PanickingSink)).unwrap();
        let lsn = enqueue_root_touch(&backend);
        assert!(matches!(backend.wait_applied(lsn, &PanickingSink), Err(Error::Shutdown)));
        assert!(backend.failure().unwrap().contains("panicked"));
        assert!(backend.check_running().is_err());
        backend.stop();
    }

    #[test]
    fn a_panic_in_an_inline_pass_latches() {
        let backend = backend_on_fresh_volume(false);
        let lsn = enqueue_root_touch(&backend);
        backend.log().flush().unwrap();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| backend.pass(&PanickingSink)));
        assert!(unwound.is_err());
        assert!(backend.is_failed());
        assert!(matches!(backend.wait_applied(lsn, &PanickingSink), Err(Error::Shutdown)));
    }
}
