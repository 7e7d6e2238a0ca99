//! Background compaction (issue 12): the policy that decides, without a caller asking, which
//! regular files are rewritten into whole blocks, when, and how much work each pass may do.
//! It owns the queue of files whose shape changed (noted as the back end applies their range
//! records), the sweep of each (measure, then compact), the compactor thread and its pacing.
//! It changes nothing itself: a compaction is a `RangeKind::Compact` record logged through the
//! front end (`FileSystem::range_operation`, as `defrag` logs it), so the back end applies it
//! and a replay after a crash applies it again to the same bytes (docs/EXTENTS.md,
//! *Compaction*, *Background compaction*).
//!
//! A sweep walks the applied extent tree from a cursor, at most `EXTENTS_PER_PASS` extents per
//! pass under the volume lock: first to add up the bytes the file maps (the blocks it holds
//! are the root's `blocks_owned`), then, when it holds more than `factor` times those bytes,
//! to log compaction records for the runs that hold more blocks than their bytes need, at most
//! `RECORDS_PER_PASS` a pass. The thread waits for its records to be applied and then sleeps
//! `IO_SHARE_DIVISOR - 1` times as long as the pass took, so that compaction takes about a
//! tenth of the back end's time while it has work; it skips passes while the back end has a
//! backlog, and does nothing at all on a read-only mount.

use super::{FileSystem, Inner};
use crate::backend::record::RangeKind;
use crate::block::meta::BLOCK_SIZE_U64;
use crate::error::{Error, Result};
use crate::extent::{self, ExtentRoot};
use crate::fs::types::FileType;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Weak;
use std::time::{Duration, Instant};

/// Extents one pass walks under the volume lock: a few hundred microseconds of lookups and
/// readers held up at most.
const EXTENTS_PER_PASS: u64 = 4096;
/// Compaction records one pass logs: at most 4 × `COMPACT_RUN_MAX_BYTES` (16 MiB) rewritten.
const RECORDS_PER_PASS: usize = 4;
/// The compactor sleeps `IO_SHARE_DIVISOR - 1` times what a pass took (its walk and the
/// application of its records): about a tenth of the back end's time while it has work.
const IO_SHARE_DIVISOR: u32 = 10;
/// The longest pause between passes of a sweep, whatever the last one took.
const PAUSE_MAX: Duration = Duration::from_secs(1);
/// How long the thread waits for a file to be noted before it looks at the latch again.
const IDLE_WAIT: Duration = Duration::from_millis(500);
/// Records waiting to be applied above which a pass is put off: the foreground comes first.
const BACKLOG_RECORDS_MAX: u64 = 256;
/// How long a pass put off for the backlog waits before it looks again.
const BACKLOG_WAIT: Duration = Duration::from_millis(20);
/// Files the queue holds; past this, files noted are not queued until the queue shrinks (they
/// are noted again by their next change, or compacted by `tandem defrag`).
const QUEUE_FILES_MAX: usize = 4096;
/// Changes a file found below the factor must see before it is measured again: at least this
/// many, and at least one per `REMEASURE_EXTENTS_PER_CHANGE` extents of it, so that measuring
/// (a walk of every extent) costs a few dozen extent visits per change however large the file
/// is. A change adds at most a couple of blocks, so the file drifts little above the factor
/// meanwhile, and the next sweep brings it back.
const REMEASURE_CHANGES_MIN: u64 = 64;
const REMEASURE_EXTENTS_PER_CHANGE: u64 = 64;
/// A file is compacted only when it holds at least this many blocks more than its bytes need:
/// a small file's amplification is mostly its last block's rounding, which no compaction
/// gives back.
const EXCESS_BLOCKS_MIN: u64 = 16;

/// What background compaction did since mount (`FileSystem::compaction_statistics`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CompactionStatistics {
    /// Passes that walked a file's extents.
    pub passes: u64,
    /// Sweeps that measured a whole file.
    pub files_measured: u64,
    /// Sweeps that found a file above the factor and compacted it to its end.
    pub files_compacted: u64,
    /// Compaction records logged.
    pub records: u64,
    /// Bytes those records covered.
    pub record_bytes: u64,
}

/// Where the sweep of one file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Adding up the bytes mapped from `cursor` on.
    Measure { mapped_bytes: u64, extents: u64 },
    /// Logging compaction records for the runs from `cursor` on.
    Compact,
}

#[derive(Debug)]
struct Sweep {
    inode: u64,
    cursor: u64,
    phase: Phase,
    /// The file changed again since this sweep began: measure it again when it ends.
    changed: bool,
    /// Set when a measure found the file below the factor: the changes it must see before it
    /// is measured again.
    rest_for: Option<u64>,
}

#[derive(Default)]
struct Queue {
    sweeps: VecDeque<Sweep>,
    queued: HashSet<u64>,
    /// Files measured below the factor: the changes each must see before it is queued again
    /// (at most `QUEUE_FILES_MAX`; a file left out is queued at its next change).
    resting: HashMap<u64, u64>,
}

/// The compactor's shared state: in `Inner`, and seen by its thread through a weak handle.
pub(super) struct Compactor {
    /// Held over `factor` times the bytes mapped starts a compaction; 0 turns it off.
    factor: f64,
    queue: Mutex<Queue>,
    signal: Condvar,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    passes: AtomicU64,
    files_measured: AtomicU64,
    files_compacted: AtomicU64,
    records: AtomicU64,
    record_bytes: AtomicU64,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionPass {
    /// No file queued, a read-only mount, or compaction turned off.
    Idle,
    /// The back end has a backlog: the pass was put off.
    Deferred,
    /// A file's extents were walked; `records` compaction records were logged.
    Worked { records: usize },
}

impl Compactor {
    pub(super) fn new(factor: f64) -> Compactor {
        assert!(factor == 0.0 || (factor >= 1.0 && factor.is_finite()), "checked by mount");
        Compactor {
            factor,
            queue: Mutex::new(Queue::default()),
            signal: Condvar::new(),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            passes: AtomicU64::new(0),
            files_measured: AtomicU64::new(0),
            files_compacted: AtomicU64::new(0),
            records: AtomicU64::new(0),
            record_bytes: AtomicU64::new(0),
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.factor > 0.0
    }

    /// Notes that regular file `inode` changed shape (an applied insert, collapse, punch or
    /// zero range): it is measured again. Cheap: called by the front end's sink per batch.
    pub(super) fn note_changed(&self, inode: u64) {
        if !self.enabled() {
            return;
        }
        let mut queue = self.queue.lock();
        if let Some(changes_left) = queue.resting.get_mut(&inode) {
            *changes_left = changes_left.saturating_sub(1);
            if *changes_left > 0 {
                return;
            }
            queue.resting.remove(&inode);
        }
        if queue.queued.contains(&inode) {
            if let Some(sweep) = queue.sweeps.iter_mut().find(|sweep| sweep.inode == inode) {
                sweep.changed = true;
            }
            return;
        }
        if queue.sweeps.len() >= QUEUE_FILES_MAX {
            return;
        }
        queue.queued.insert(inode);
        let phase = Phase::Measure { mapped_bytes: 0, extents: 0 };
        queue.sweeps.push_back(Sweep { inode, cursor: 0, phase, changed: false, rest_for: None });
        drop(queue);
        self.signal.notify_one();
    }

    /// Starts the compactor thread; it holds the file system only while a pass runs, so the
    /// mount ends as before (`stop` joins it first).
    pub(super) fn start(&self, inner: Weak<Inner>) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let handle = std::thread::Builder::new()
            .name("tandem-compact".into())
            .spawn(move || run(inner))
            .map_err(|error| Error::Io { operation: "start compaction thread", offset: 0, source: error })?;
        *self.thread.lock() = Some(handle);
        Ok(())
    }

    /// Stops the thread and waits for its pass to end; idempotent.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.signal.notify_all();
        let handle = self.thread.lock().take();
        if let Some(handle) = handle {
            // The thread's own last handle may end the mount: it must not wait for itself.
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }

    fn statistics(&self) -> CompactionStatistics {
        CompactionStatistics {
            passes: self.passes.load(Ordering::Relaxed),
            files_measured: self.files_measured.load(Ordering::Relaxed),
            files_compacted: self.files_compacted.load(Ordering::Relaxed),
            records: self.records.load(Ordering::Relaxed),
            record_bytes: self.record_bytes.load(Ordering::Relaxed),
        }
    }

    /// Waits up to `timeout` for a file to be noted or the stop; returns whether stopping.
    fn wait(&self, timeout: Duration) -> bool {
        let mut queue = self.queue.lock();
        if !self.stop.load(Ordering::Acquire) {
            self.signal.wait_for(&mut queue, timeout);
        }
        self.stop.load(Ordering::Acquire)
    }
}

/// The compactor thread: a pass, then a pause that keeps its share, until stopped or the mount
/// is gone. An error in a pass drops that file's sweep (a failed volume answers every pass
/// with an error, and the thread idles until unmount stops it).
fn run(inner: Weak<Inner>) {
    loop {
        let Some(inner) = inner.upgrade() else { return };
        let compactor = &inner.compactor;
        if compactor.stop.load(Ordering::Acquire) {
            return;
        }
        let fs = FileSystem { inner: inner.clone() };
        let started = Instant::now();
        let stopping = match fs.compaction_pass() {
            Ok(CompactionPass::Worked { .. }) => {
                compactor.wait_stop_only((started.elapsed() * (IO_SHARE_DIVISOR - 1)).min(PAUSE_MAX))
            }
            Ok(CompactionPass::Deferred) => compactor.wait_stop_only(BACKLOG_WAIT),
            Ok(CompactionPass::Idle) | Err(_) => compactor.wait(IDLE_WAIT),
        };
        if stopping {
            return;
        }
    }
}

impl Compactor {
    /// Sleeps `pause` unless stopped meanwhile (a noted file does not cut the pause short:
    /// the pause is the share's); returns whether stopping.
    fn wait_stop_only(&self, pause: Duration) -> bool {
        let deadline = Instant::now() + pause;
        let mut queue = self.queue.lock();
        // Bounded: each wait ends by the deadline.
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.signal.wait_for(&mut queue, deadline - now);
        }
        self.stop.load(Ordering::Acquire)
    }
}

impl FileSystem {
    /// What background compaction did since mount.
    pub fn compaction_statistics(&self) -> CompactionStatistics {
        self.inner.compactor.statistics()
    }

    /// Queues regular file `inode` for background compaction as if it had just changed shape
    /// (the back end queues a file by itself when it applies an insert, collapse, punch or zero
    /// range of it). Does nothing when compaction is off.
    pub fn queue_for_compaction(&self, inode: u64) {
        self.inner.compactor.note_changed(inode);
    }

    /// One pass of background compaction in the caller's thread (the compactor thread runs
    /// these; a mount without a back-end thread has none, and its caller drives it): one step
    /// of the first queued file's sweep, bounded by `EXTENTS_PER_PASS` and `RECORDS_PER_PASS`.
    /// The records it logs are applied like any other (in this thread's wait for them, or by
    /// the caller's `run_backend`).
    pub fn compaction_pass(&self) -> Result<CompactionPass> {
        let compactor = &self.inner.compactor;
        if !compactor.enabled() || self.is_read_only() {
            return Ok(CompactionPass::Idle);
        }
        self.check_running()?;
        let backend = &self.inner.backend;
        if backend.last_queued_lsn().saturating_sub(backend.applied_lsn()) > BACKLOG_RECORDS_MAX {
            return Ok(CompactionPass::Deferred);
        }
        let Some(mut sweep) = compactor.queue.lock().sweeps.pop_front() else {
            return Ok(CompactionPass::Idle);
        };
        compactor.passes.fetch_add(1, Ordering::Relaxed);
        let stepped = self.sweep_step(&mut sweep);
        let mut queue = compactor.queue.lock();
        match stepped {
            // Not done: back at the end of the queue, after the other files' turns.
            Ok((records, false)) => {
                queue.sweeps.push_back(sweep);
                Ok(CompactionPass::Worked { records })
            }
            // Compacted while it changed: measured again at once. A file measured below the
            // factor rests instead, whatever changed meanwhile (those changes were counted
            // loosely: a file changed without pause would otherwise be measured without pause).
            Ok((records, true)) if sweep.changed && sweep.rest_for.is_none() => {
                sweep.cursor = 0;
                sweep.phase = Phase::Measure { mapped_bytes: 0, extents: 0 };
                sweep.changed = false;
                queue.sweeps.push_back(sweep);
                Ok(CompactionPass::Worked { records })
            }
            Ok((records, true)) => {
                queue.queued.remove(&sweep.inode);
                if let Some(changes) = sweep.rest_for {
                    if queue.resting.len() < QUEUE_FILES_MAX {
                        queue.resting.insert(sweep.inode, changes);
                    }
                }
                Ok(CompactionPass::Worked { records })
            }
            // The file went, or is not a regular file: nothing to compact.
            Err(Error::NotFound | Error::IsDirectory | Error::InvalidArgument(_)) => {
                queue.queued.remove(&sweep.inode);
                Ok(CompactionPass::Worked { records: 0 })
            }
            // Typically `ReadOnly` (a remount meanwhile) or `NoSpace`: the sweep ends, the next
            // change of the file starts another.
            Err(error) => {
                queue.queued.remove(&sweep.inode);
                Err(error)
            }
        }
    }

    /// One bounded step of `sweep`; returns the records logged and whether the sweep is over.
    fn sweep_step(&self, sweep: &mut Sweep) -> Result<(usize, bool)> {
        let generation = self.with_view(sweep.inode, |view| match view.file_type() {
            FileType::Regular => Ok(view.attributes.generation),
            FileType::Directory => Err(Error::IsDirectory),
            _ => Err(Error::invalid("not a regular file")),
        })??;
        match sweep.phase {
            Phase::Measure { mapped_bytes, extents } => {
                let step = self.measure_step(sweep.inode, generation, sweep.cursor)?;
                let mapped_bytes = mapped_bytes + step.mapped_bytes;
                let extents = extents + step.extents;
                let Some(blocks_owned) = step.blocks_owned_at_end else {
                    sweep.cursor = step.next_cursor;
                    sweep.phase = Phase::Measure { mapped_bytes, extents };
                    return Ok((0, false));
                };
                self.inner.compactor.files_measured.fetch_add(1, Ordering::Relaxed);
                if !self.worth_compacting(blocks_owned, mapped_bytes) {
                    sweep.rest_for = Some((extents / REMEASURE_EXTENTS_PER_CHANGE).max(REMEASURE_CHANGES_MIN));
                    return Ok((0, true));
                }
                sweep.cursor = 0;
                sweep.phase = Phase::Compact;
                Ok((0, false))
            }
            Phase::Compact => {
                let PiecesStep { pieces, next_cursor, at_end } =
                    self.pieces_step(sweep.inode, generation, sweep.cursor)?;
                for &(offset, length) in &pieces {
                    self.range_operation(sweep.inode, RangeKind::Compact, offset, length, false)?;
                    let compactor = &self.inner.compactor;
                    compactor.records.fetch_add(1, Ordering::Relaxed);
                    compactor.record_bytes.fetch_add(length, Ordering::Relaxed);
                }
                // Waiting here makes the pass's time include applying its records, which the
                // pause after it is measured against (a mount without a back-end thread applies
                // them when its caller runs the back end).
                if !pieces.is_empty() && self.inner.options.background_backend {
                    let lsn = self.with_view(sweep.inode, |view| view.last_change_lsn)?;
                    self.wait_applied(lsn)?;
                }
                sweep.cursor = next_cursor;
                if at_end {
                    self.inner.compactor.files_compacted.fetch_add(1, Ordering::Relaxed);
                }
                Ok((pieces.len(), at_end))
            }
        }
    }

    /// Whether a file holding `blocks_owned` blocks (data and tree) for `mapped_bytes` is worth
    /// a compaction sweep.
    fn worth_compacting(&self, blocks_owned: u64, mapped_bytes: u64) -> bool {
        let needed = mapped_bytes.div_ceil(BLOCK_SIZE_U64);
        let held_bytes = blocks_owned.saturating_mul(BLOCK_SIZE_U64);
        blocks_owned >= needed + EXCESS_BLOCKS_MIN
            && held_bytes as f64 > self.inner.compactor.factor * mapped_bytes.max(1) as f64
    }

    /// Adds up the bytes mapped by at most `EXTENTS_PER_PASS` extents from `cursor`.
    fn measure_step(&self, inode: u64, generation: u64, cursor: u64) -> Result<MeasureStep> {
        let mut volume = self.inner.backend.volume()?;
        let home = FileSystem::home_inode(&mut volume, inode, generation)?.ok_or(Error::NotFound)?;
        let root = ExtentRoot::decode(&home.root_area)?;
        let length = root.length_bytes();
        let mut step = MeasureStep { mapped_bytes: 0, extents: 0, next_cursor: cursor, blocks_owned_at_end: None };
        if cursor < length {
            let mut visited = 0u64;
            extent::extents_from(&mut *volume, &root, cursor, &mut |logical, extent_bytes, physical, _| {
                if visited == EXTENTS_PER_PASS {
                    return false;
                }
                visited += 1;
                step.extents += 1;
                // The first extent may start before the cursor: only its bytes from there on.
                let start = logical.max(cursor);
                if physical.is_some() {
                    step.mapped_bytes += logical + extent_bytes - start;
                }
                step.next_cursor = logical + extent_bytes;
                true
            })?;
        }
        if step.next_cursor >= length {
            step.blocks_owned_at_end = Some(root.blocks_owned());
        }
        Ok(step)
    }

    /// The compaction pieces (as `compaction_pieces` finds them) among at most
    /// `EXTENTS_PER_PASS` extents from `cursor`, at most `RECORDS_PER_PASS` of them; returns
    /// them, where the next step starts and whether this one reached the end of the file.
    fn pieces_step(&self, inode: u64, generation: u64, cursor: u64) -> Result<PiecesStep> {
        let piece_max = extent::COMPACT_RUN_MAX_BYTES.min(self.range_piece_bytes());
        let mut volume = self.inner.backend.volume()?;
        let home = FileSystem::home_inode(&mut volume, inode, generation)?.ok_or(Error::NotFound)?;
        let root = ExtentRoot::decode(&home.root_area)?;
        let length = root.length_bytes();
        let mut gather = PieceGather::new(piece_max);
        let mut walked_end = cursor;
        let mut stopped = false;
        if cursor < length {
            let mut visited = 0u64;
            extent::extents_from(&mut *volume, &root, cursor, &mut |logical, extent_bytes, physical, _| {
                // Only whole extents from the cursor on: one it cuts was the last step's.
                if logical < cursor {
                    return true;
                }
                if visited == EXTENTS_PER_PASS || gather.pieces.len() >= RECORDS_PER_PASS {
                    stopped = true;
                    return false;
                }
                visited += 1;
                gather.add(logical, extent_bytes, physical);
                walked_end = logical + extent_bytes;
                true
            })?;
        }
        // A piece still open ends at the last extent walked: a run cut there is still whole
        // extents, and the next step starts after it.
        gather.close();
        let mut pieces = gather.pieces;
        let mut next_cursor = walked_end.max(cursor);
        if pieces.len() > RECORDS_PER_PASS {
            pieces.truncate(RECORDS_PER_PASS);
            let &(offset, bytes) = pieces.last().expect("RECORDS_PER_PASS > 0");
            next_cursor = offset + bytes;
            stopped = true;
        }
        Ok(PiecesStep { pieces, next_cursor, at_end: !stopped })
    }
}

/// What one compaction step found: (offset, length) of each piece to log, where the next step
/// starts, and whether this one reached the end of the file.
struct PiecesStep {
    pieces: Vec<(u64, u64)>,
    next_cursor: u64,
    at_end: bool,
}

struct MeasureStep {
    mapped_bytes: u64,
    extents: u64,
    next_cursor: u64,
    /// The root's `blocks_owned` when this step reached the end of the file.
    blocks_owned_at_end: Option<u64>,
}

/// Gathers compaction pieces from extents in file order, as `FileSystem::compaction_pieces`
/// does: consecutive extents with blocks, up to `piece_max` bytes, whose blocks (each extent's
/// own, a shared end counted once per extent) outnumber what their bytes need.
struct PieceGather {
    piece_max: u64,
    /// (start, end, blocks held) of the piece being gathered.
    current: Option<(u64, u64, u64)>,
    pieces: Vec<(u64, u64)>,
}

impl PieceGather {
    fn new(piece_max: u64) -> PieceGather {
        assert!(piece_max >= BLOCK_SIZE_U64);
        PieceGather { piece_max, current: None, pieces: Vec::new() }
    }

    fn close(&mut self) {
        if let Some((start, end, held)) = self.current.take() {
            if held > (end - start).div_ceil(BLOCK_SIZE_U64) {
                self.pieces.push((start, end - start));
            }
        }
    }

    fn add(&mut self, logical: u64, length: u64, physical: Option<u64>) {
        let Some(address) = physical.filter(|_| length <= self.piece_max) else {
            self.close();
            return;
        };
        let blocks = (address + length - 1) / BLOCK_SIZE_U64 - address / BLOCK_SIZE_U64 + 1;
        match self.current.as_mut() {
            Some(piece) if piece.1 == logical && piece.1 - piece.0 + length <= self.piece_max => {
                piece.1 += length;
                piece.2 += blocks;
            }
            _ => {
                self.close();
                self.current = Some((logical, logical + length, blocks));
            }
        }
    }
}
