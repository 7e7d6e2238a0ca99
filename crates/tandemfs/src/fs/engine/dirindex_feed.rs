//! The directory index inside a mount (issue 9): `IndexFeed` turns every batch the back end
//! applies into `tandem_accel::dirindex::IndexUpdate`s, queues them (bounded) and applies them
//! to the index from a thread of its own, and learns directories the index has not been told
//! about; `IndexAdapter` is the `BatchIndex` that answers batch lookups, resolves and stats from
//! that index once it has caught up with every change acknowledged before the batch began, and
//! leaves the rest to the CPU twin. Installed with `FileSystem::install_directory_index`. The
//! rules (freshness, completeness, what is left to the CPU) are in docs/BATCH.md, "The directory
//! index".

use super::batch::{BatchAnswer, BatchIndex, ClaimAnswer, IndexCreate};
use super::*;
use crate::backend::record::{AttributeImage, RenameKind};
use std::collections::VecDeque;
use std::sync::Weak;
use std::time::{Duration, Instant};
use tandem_accel::dirindex::{
    CpuDirectoryIndex, CreateEntry, CreateResult, DirectoryIndex, GpuDirectoryIndex, GpuIndexConfig, IndexAttributes,
    IndexKind, IndexUpdate, LookupResult, ResolveResult, Settle, StatResult, MAXIMUM_PATH_BYTES,
};

/// Records waiting for the feeder at most. Past it the back end waits for room, up to
/// `PUSH_WAIT_MAX`: the index keeps up or the feed stops (it never drops a record silently).
const QUEUE_RECORDS_MAX: usize = 1 << 16;
/// Longest the back end waits for room in a full queue; past it the feed latches failed and
/// the index answers nothing more (the CPU twin answers everything).
const PUSH_WAIT_MAX: Duration = Duration::from_secs(2);
/// Records the feeder takes for one `apply` of the index at most: one call per many batches
/// when the back end runs ahead, short enough that a waiting batch sees progress.
const APPLY_RECORDS_MAX: usize = 1 << 14;
/// Pending requests to learn a directory at most; more are dropped (asked again later).
const LEARN_REQUESTS_MAX: usize = 1 << 16;
/// Entries learnt in one back-end pass at most: learning there reads the applied H-tree under
/// the volume lock on the back end's own thread, so a pass pays little for it. A directory is
/// always learnt whole, so a turn may pass this by one directory.
const LEARN_ENTRIES_PER_PASS: u64 = 1024;
/// Entries learnt in one idle turn of the feeder at most (the volume is quiet then).
const LEARN_ENTRIES_PER_IDLE_TURN: u64 = 16384;
/// Directories with more entries than this are never learnt (they stay unknown unless made
/// while the index was installed): listing one would hold the volume too long.
const LEARN_DIRECTORY_ENTRIES_MAX: u64 = 1 << 16;
/// The feeder's wait for work when the queue is empty (bounds each wait; it also looks for a
/// quiet volume to learn directories on then).
const FEEDER_IDLE_WAIT: Duration = Duration::from_millis(10);
/// Create-batch records above `fed_lsn` the feed counts as reflected through their claims at
/// most (`IndexFeed::names_current`); past that a group waits for the feed's own pace.
const REFLECTED_RECORDS_MAX: usize = 4096;
/// Longest `detach` waits for the feeder thread to finish its apply.
const FEEDER_STOP_WAIT: Duration = Duration::from_secs(30);

/// Which engine serves the directory index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexEngine {
    /// `CpuDirectoryIndex` on all cores (the default).
    Cpu,
    /// `GpuDirectoryIndex`; installing fails when no GPU can be opened.
    Gpu,
    /// The GPU when the machine has one, else the CPU twin. A GPU that is there but does not
    /// start (its kernel refused, its memory short) is an error, not a quiet fall back: the
    /// caller asked for the GPU where there is one and must learn why it did not get it.
    GpuOrCpu,
}

/// How `FileSystem::install_directory_index` sets the index up.
#[derive(Debug, Clone)]
pub struct DirectoryIndexOptions {
    pub engine: IndexEngine,
    /// Batches shorter than this are answered by the CPU twin alone; `None` takes the engine's
    /// default (`MIN_BATCH_CPU_DEFAULT`, `MIN_BATCH_GPU_DEFAULT`).
    pub min_batch: Option<usize>,
    /// Longest a batch waits for the index to catch up with the changes acknowledged before it
    /// began, in milliseconds; past it (or at once with 0) the CPU twin answers the batch.
    pub catch_up_wait_ms: u64,
    /// Directory entries the GPU tables are sized for (`GpuIndexConfig::for_entries`).
    pub gpu_entries: usize,
    /// Threads of the CPU twin's batches; 0 takes one per core.
    pub cpu_threads: usize,
}

/// Batches the CPU-twin index serves from: below this, the single calls on all cores cost
/// less than building the index's request arrays.
pub const MIN_BATCH_CPU_DEFAULT: usize = 64;
/// Batches the GPU index serves from: one command costs about 15 µs on the H100 host
/// (docs/GPUDIR.md), which the CPU twin spends on about a thousand cached resolves.
pub const MIN_BATCH_GPU_DEFAULT: usize = 4096;
/// `DirectoryIndexOptions::catch_up_wait_ms` by default.
pub const CATCH_UP_WAIT_MS_DEFAULT: u64 = 200;

impl Default for DirectoryIndexOptions {
    fn default() -> Self {
        DirectoryIndexOptions {
            engine: IndexEngine::Cpu,
            min_batch: None,
            catch_up_wait_ms: CATCH_UP_WAIT_MS_DEFAULT,
            gpu_entries: 1 << 20,
            cpu_threads: 0,
        }
    }
}

/// What the feed and the adapter did since the index was installed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirectoryIndexStatistics {
    /// The index's own name (engine, device).
    pub engine: String,
    /// Every record up to this lsn is reflected in the index.
    pub fed_lsn: u64,
    pub records_fed: u64,
    pub updates_applied: u64,
    pub apply_calls: u64,
    /// Changes the index had no room for (it then gives no negative answers).
    pub overflowed: u64,
    pub directories_learnt: u64,
    /// Batches the index found caught up at once, after a wait, or declined (not caught up
    /// within `catch_up_wait_ms`: the CPU twin answered them).
    pub batches_current: u64,
    pub batches_waited: u64,
    pub batches_declined: u64,
    /// Create groups whose names the index decided (claims), and groups it took no part in
    /// because it had not caught up with every change acknowledged before (the front end
    /// decided them).
    pub create_groups_claimed: u64,
    pub create_groups_declined: u64,
    /// Names the index claimed (free) and found taken, in the groups it decided.
    pub names_claimed: u64,
    pub names_found_taken: u64,
    /// Why the feed stopped, if it did (the index then answers nothing).
    pub failure: Option<String>,
}

/// One unit of the feed queue, in the order the volume went through them.
enum FeedItem {
    /// The records of one applied batch and the blocks its inodes own after it.
    Applied { records: Vec<Arc<Op>>, owned_blocks: Vec<(u64, u64)>, last_lsn: u64 },
    /// Directories read from the volume when it held exactly the records up to `lsn`.
    Learnt { updates: Vec<IndexUpdate>, directories: Vec<u64>, lsn: u64 },
}

impl FeedItem {
    /// What the item counts for against `QUEUE_RECORDS_MAX`.
    fn weight(&self) -> usize {
        match self {
            FeedItem::Applied { records, .. } => records.len().max(1),
            FeedItem::Learnt { updates, .. } => updates.len().div_ceil(4).max(1),
        }
    }
}

#[derive(Default)]
struct FeedQueue {
    items: VecDeque<FeedItem>,
    weight: usize,
}

/// Directories asked to be learnt, in the order asked, each once.
#[derive(Default)]
struct LearnRequests {
    order: VecDeque<u64>,
    asked: crate::FastHashSet<u64>,
    /// Numbers that were not a directory or too big to learn when read: not asked again (so
    /// that lookups in a huge directory do not make every pass read it), until the set is
    /// full and starts over.
    declined: crate::FastHashSet<u64>,
}

#[derive(Default)]
struct FeedCounters {
    records_fed: AtomicU64,
    updates_applied: AtomicU64,
    apply_calls: AtomicU64,
    overflowed: AtomicU64,
    directories_learnt: AtomicU64,
    batches_current: AtomicU64,
    batches_waited: AtomicU64,
    batches_declined: AtomicU64,
    create_groups_claimed: AtomicU64,
    create_groups_declined: AtomicU64,
    names_claimed: AtomicU64,
    names_found_taken: AtomicU64,
}

/// The feed: shared by the back end's `batch_applied` (producer), the feeder thread (consumer)
/// and the adapter (which waits for it to catch up).
pub(super) struct IndexFeed {
    index: Arc<dyn DirectoryIndex>,
    queue: Mutex<FeedQueue>,
    /// Signalled when items are queued (the feeder waits) and when they are taken (a pusher
    /// waits for room).
    queue_signal: parking_lot::Condvar,
    /// Every record up to this lsn is reflected in the index.
    fed_lsn: Mutex<u64>,
    fed_signal: parking_lot::Condvar,
    learn: Mutex<LearnRequests>,
    failure: Mutex<Option<String>>,
    failed: AtomicBool,
    stop: AtomicBool,
    feeder: Mutex<Option<std::thread::JoinHandle<()>>>,
    counters: FeedCounters,
    /// Lsns above `fed_lsn` of create-batch records whose every name the index holds already
    /// (each create of the record was claimed and committed): for claims, the index reflects
    /// them as if fed (`names_current`). Pruned as `fed_lsn` passes them; at most
    /// `REFLECTED_RECORDS_MAX`.
    reflected: Mutex<std::collections::BTreeSet<u64>>,
}

impl IndexFeed {
    fn new(index: Arc<dyn DirectoryIndex>, fed_lsn: u64) -> IndexFeed {
        IndexFeed {
            index,
            queue: Mutex::new(FeedQueue::default()),
            queue_signal: parking_lot::Condvar::new(),
            fed_lsn: Mutex::new(fed_lsn),
            fed_signal: parking_lot::Condvar::new(),
            learn: Mutex::new(LearnRequests::default()),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            feeder: Mutex::new(None),
            counters: FeedCounters::default(),
            reflected: Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// Whether the index holds every name change of every record up to `acknowledged`: fed,
    /// or (above `fed_lsn`) a create-batch record whose creates were all committed as claims.
    /// Lsns are consecutive (one a record), so every one in between is looked for.
    fn names_current(&self, acknowledged: u64) -> bool {
        let fed = self.fed_lsn();
        if fed >= acknowledged {
            return true;
        }
        let mut reflected = self.reflected.lock();
        reflected.retain(|lsn| *lsn > fed);
        acknowledged - fed <= REFLECTED_RECORDS_MAX as u64
            && (fed + 1..=acknowledged).all(|lsn| reflected.contains(&lsn))
    }

    /// Notes that the index holds every name of record `lsn` (see `names_current`).
    fn note_reflected(&self, lsn: u64) {
        let fed = self.fed_lsn();
        let mut reflected = self.reflected.lock();
        if lsn > fed && reflected.len() < REFLECTED_RECORDS_MAX {
            reflected.insert(lsn);
        }
    }

    fn fail(&self, reason: String) {
        let mut failure = self.failure.lock();
        if failure.is_none() {
            *failure = Some(reason);
        }
        self.failed.store(true, Ordering::Release);
        drop(failure);
        self.queue_signal.notify_all();
        self.fed_signal.notify_all();
    }

    fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// `Err` with the reason once the feed has failed: the index may have missed a change.
    fn check(&self) -> Result<()> {
        if !self.is_failed() {
            return Ok(());
        }
        Err(Error::invalid(format!("directory index feed failed: {}", self.failure.lock().clone().unwrap_or_default())))
    }

    fn fed_lsn(&self) -> u64 {
        *self.fed_lsn.lock()
    }

    /// Asks for `directory` to be learnt (read from the volume and marked complete).
    fn ask_to_learn(&self, directory: u64) {
        let mut learn = self.learn.lock();
        if learn.order.len() < LEARN_REQUESTS_MAX
            && !learn.declined.contains(&directory)
            && learn.asked.insert(directory)
        {
            learn.order.push_back(directory);
        }
    }

    fn decline(&self, directory: u64) {
        let mut learn = self.learn.lock();
        if learn.declined.len() >= LEARN_REQUESTS_MAX {
            learn.declined.clear();
        }
        learn.declined.insert(directory);
    }

    fn has_learn_requests(&self) -> bool {
        !self.learn.lock().order.is_empty()
    }

    /// The directory asked for first, taken off the requests.
    fn next_to_learn(&self) -> Option<u64> {
        let mut learn = self.learn.lock();
        let directory = learn.order.pop_front()?;
        learn.asked.remove(&directory);
        Some(directory)
    }

    /// Queues `item`, waiting (bounded) for room; a feed that cannot get room fails.
    fn push(&self, item: FeedItem) {
        let weight = item.weight();
        let deadline = Instant::now() + PUSH_WAIT_MAX;
        let mut queue = self.queue.lock();
        // Bounded: each turn ends by the deadline.
        while queue.weight + weight > QUEUE_RECORDS_MAX && !queue.items.is_empty() {
            if self.is_failed() || self.stop.load(Ordering::Acquire) {
                return;
            }
            if self.queue_signal.wait_until(&mut queue, deadline).timed_out() {
                drop(queue);
                self.fail(format!("the index fell behind: {QUEUE_RECORDS_MAX} records waited {PUSH_WAIT_MAX:?}"));
                return;
            }
        }
        if self.is_failed() || self.stop.load(Ordering::Acquire) {
            return;
        }
        queue.weight += weight;
        queue.items.push_back(item);
        drop(queue);
        self.queue_signal.notify_all();
    }

    /// The back end applied a batch (called from `FrontSink::batch_applied`, after the front
    /// end's own bookkeeping). The records are only queued here (their `Arc`s cloned); the
    /// feeder turns them into updates. Directories asked to be learnt are read now, while the
    /// volume holds exactly the records up to `summary.last_lsn` (no pass runs beside this one).
    pub(super) fn batch_applied(&self, fs: &FileSystem, summary: &BatchSummary<'_>) {
        if self.is_failed() || self.stop.load(Ordering::Acquire) {
            return;
        }
        let records: Vec<Arc<Op>> = summary.records.iter().map(|queued| queued.op.clone()).collect();
        self.counters.records_fed.fetch_add(records.len() as u64, Ordering::Relaxed);
        let owned_blocks = summary.owned_blocks.clone();
        self.push(FeedItem::Applied { records, owned_blocks, last_lsn: summary.last_lsn });
        if self.has_learn_requests() {
            if let Some(item) = self.learn_turn(fs, summary.last_lsn, LEARN_ENTRIES_PER_PASS) {
                self.push(item);
            }
        }
    }

    /// Reads directories asked for from the volume, which the caller knows holds exactly the
    /// records up to `lsn`: each directory whole, its entries and their attributes, then
    /// marked complete; about `budget` entries at most. `None` when nothing was learnt.
    fn learn_turn(&self, fs: &FileSystem, lsn: u64, budget: u64) -> Option<FeedItem> {
        let mut updates = Vec::new();
        let mut entries = 0u64;
        let mut directories = Vec::new();
        // Bounded: each turn of the loop counts at least one entry against the budget.
        while entries < budget {
            let Some(directory) = self.next_to_learn() else { break };
            match learn_directory(fs, directory, lsn) {
                Ok(Some(learnt)) => {
                    entries += learnt.entries.len() as u64 + 1;
                    directories.push(directory);
                    learnt.append_updates(&mut updates);
                    for (_, child) in &learnt.entries {
                        if child.kind == IndexKind::Directory {
                            // The index grows down the tree: a learnt directory's subdirectories
                            // are learnt on later turns.
                            self.ask_to_learn(child.inode);
                        }
                    }
                }
                // Not a directory, freed, or too big: stays unknown.
                Ok(None) => {
                    entries += 1;
                    self.decline(directory);
                }
                // A volume that refuses readers (a failed record): asked again later.
                Err(_) => {
                    self.ask_to_learn(directory);
                    break;
                }
            }
        }
        (!updates.is_empty()).then_some(FeedItem::Learnt { updates, directories, lsn })
    }

    /// The feeder thread's loop: takes queued items, turns them into updates, applies them to
    /// the index in one call and moves `fed_lsn`; when idle, learns directories on a quiet
    /// volume. Ends at `stop` or when the feed fails.
    fn run(&self, inner: Weak<Inner>) {
        while !self.stop.load(Ordering::Acquire) && !self.is_failed() {
            let items = self.take_items();
            if items.is_empty() {
                self.idle_turn(&inner);
                continue;
            }
            // An index that panics answers nothing more, rather than leave the feed behind
            // and every batch waiting for it.
            let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.apply_items(items)));
            match applied {
                Ok(Ok(())) => {}
                Ok(Err(reason)) => self.fail(reason),
                Err(panic) => {
                    let reason = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()));
                    self.fail(format!("index panicked: {}", reason.unwrap_or_default()));
                }
            }
        }
    }

    /// Queued items up to `APPLY_RECORDS_MAX` records (at least one item), or none after
    /// waiting `FEEDER_IDLE_WAIT`.
    fn take_items(&self) -> Vec<FeedItem> {
        let mut queue = self.queue.lock();
        if queue.items.is_empty() {
            self.queue_signal.wait_for(&mut queue, FEEDER_IDLE_WAIT);
        }
        let mut taken = Vec::new();
        let mut weight = 0;
        while let Some(item) = queue.items.front() {
            if !taken.is_empty() && weight + item.weight() > APPLY_RECORDS_MAX {
                break;
            }
            weight += item.weight();
            taken.push(queue.items.pop_front().expect("front exists"));
        }
        queue.weight -= weight;
        drop(queue);
        if !taken.is_empty() {
            self.queue_signal.notify_all();
        }
        taken
    }

    /// Applies `items` to the index in one call (so a query sees all of them or none of them)
    /// and moves `fed_lsn` to the last item's lsn.
    fn apply_items(&self, items: Vec<FeedItem>) -> std::result::Result<(), String> {
        let mut updates = Vec::new();
        let mut last_lsn = 0;
        for item in items {
            match item {
                FeedItem::Applied { records, owned_blocks, last_lsn: lsn } => {
                    updates_of_records(&records, &owned_blocks, &mut updates);
                    last_lsn = lsn;
                }
                FeedItem::Learnt { updates: learnt, directories, lsn } => {
                    updates.extend(learnt);
                    self.counters.directories_learnt.fetch_add(directories.len() as u64, Ordering::Relaxed);
                    last_lsn = lsn;
                }
            }
        }
        // One call, so that a query sees all of these batches or none of them.
        compact_updates(&mut updates);
        let report = self.index.apply(&updates).map_err(|error| format!("index apply failed: {error}"))?;
        if report.applied != updates.len() {
            return Err(format!("index applied {} of {} updates", report.applied, updates.len()));
        }
        let counters = &self.counters;
        counters.apply_calls.fetch_add(1, Ordering::Relaxed);
        counters.updates_applied.fetch_add(updates.len() as u64, Ordering::Relaxed);
        counters.overflowed.fetch_add(report.overflowed as u64, Ordering::Relaxed);
        self.advance(last_lsn);
        Ok(())
    }

    fn advance(&self, lsn: u64) {
        let mut fed = self.fed_lsn.lock();
        *fed = (*fed).max(lsn);
        drop(fed);
        self.fed_signal.notify_all();
    }

    /// Nothing queued: if the volume is quiet (everything queued is applied, checked under the
    /// volume lock so that no pass can apply meanwhile), everything applied has reached the
    /// index, so `fed_lsn` moves to the applied lsn; and directories asked for are learnt.
    fn idle_turn(&self, inner: &Weak<Inner>) {
        let Some(inner) = inner.upgrade() else {
            self.stop.store(true, Ordering::Release);
            return;
        };
        let fs = FileSystem { inner };
        let backend = &fs.inner.backend;
        let fed = self.fed_lsn();
        let wanted = backend.last_queued_lsn() > fed || self.has_learn_requests();
        // The volume lock is taken only when the lsns say the volume may be quiet.
        let maybe_quiet = backend.applied_lsn() == backend.last_queued_lsn();
        if !wanted || !maybe_quiet || backend.is_failed() || backend.is_stopped() {
            return;
        }
        let Some(quiet_lsn) = self.quiet_lsn(&fs) else { return };
        if !self.has_learn_requests() {
            self.advance(quiet_lsn);
            return;
        }
        // Learnt outside the volume lock (it reads views, and a view's lock is taken before the
        // volume's elsewhere), so the volume is checked to be still at `quiet_lsn` afterwards,
        // under the lock, and the item queued before the lock is let go: no later batch can be
        // queued ahead of it.
        let Some(item) = self.learn_turn(&fs, quiet_lsn, LEARN_ENTRIES_PER_IDLE_TURN) else {
            self.advance(quiet_lsn);
            return;
        };
        let still_quiet = backend.volume().ok().map(|_volume| {
            let quiet =
                backend.applied_lsn() == quiet_lsn && backend.last_queued_lsn() == quiet_lsn && self.queue_is_empty();
            if quiet {
                self.push(item);
                return None;
            }
            Some(item)
        });
        // The volume moved on meanwhile: what was read may be older than a batch the feed
        // already has, so it is dropped and the directories are asked for again.
        if let Some(Some(FeedItem::Learnt { directories, .. })) = still_quiet {
            directories.into_iter().for_each(|directory| self.ask_to_learn(directory));
        }
    }

    fn queue_is_empty(&self) -> bool {
        self.queue.lock().items.is_empty()
    }

    /// The applied lsn when the volume is quiet (nothing queued beyond it) and the feed has
    /// taken every batch applied so far (its queue is empty); `None` otherwise.
    fn quiet_lsn(&self, fs: &FileSystem) -> Option<u64> {
        let backend = &fs.inner.backend;
        let _volume = backend.volume().ok()?;
        let applied = backend.applied_lsn();
        (backend.last_queued_lsn() == applied && self.queue_is_empty()).then_some(applied)
    }

    /// Waits until `fed_lsn` reaches `lsn`, until `deadline` at most; false if it did not.
    fn wait_fed(&self, lsn: u64, deadline: Instant) -> bool {
        let mut fed = self.fed_lsn.lock();
        // Bounded: each turn ends by the deadline.
        while *fed < lsn {
            if self.is_failed() || self.fed_signal.wait_until(&mut fed, deadline).timed_out() {
                return *fed >= lsn;
            }
        }
        true
    }

    /// Stops the feeder thread (bounded wait) and makes later pushes no-ops.
    fn detach(&self) {
        self.stop.store(true, Ordering::Release);
        self.queue_signal.notify_all();
        self.fed_signal.notify_all();
        let Some(handle) = self.feeder.lock().take() else { return };
        let deadline = Instant::now() + FEEDER_STOP_WAIT;
        // Bounded by the deadline: a feeder stuck in the index (a GPU that hangs) is left
        // behind rather than waited for; it ends when its call returns.
        while !handle.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if handle.is_finished() {
            let _ = handle.join();
        }
    }

    fn statistics(&self) -> DirectoryIndexStatistics {
        let counters = &self.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        DirectoryIndexStatistics {
            engine: self.index.name(),
            fed_lsn: self.fed_lsn(),
            records_fed: load(&counters.records_fed),
            updates_applied: load(&counters.updates_applied),
            apply_calls: load(&counters.apply_calls),
            overflowed: load(&counters.overflowed),
            directories_learnt: load(&counters.directories_learnt),
            batches_current: load(&counters.batches_current),
            batches_waited: load(&counters.batches_waited),
            batches_declined: load(&counters.batches_declined),
            create_groups_claimed: load(&counters.create_groups_claimed),
            create_groups_declined: load(&counters.create_groups_declined),
            names_claimed: load(&counters.names_claimed),
            names_found_taken: load(&counters.names_found_taken),
            failure: self.failure.lock().clone(),
        }
    }
}

/// A directory read from the volume: its attributes and every entry with its child's.
struct LearntDirectory {
    directory: IndexAttributes,
    entries: Vec<(Vec<u8>, IndexAttributes)>,
}

impl LearntDirectory {
    /// The updates that make the index hold this directory whole. No drop first: the entries
    /// the index holds are always a subset of the directory's (every removal is fed, and an
    /// exchange removes both names), so inserting every entry makes it whole; a drop would also
    /// cost the GPU a scan of its entry table.
    fn append_updates(&self, updates: &mut Vec<IndexUpdate>) {
        let number = self.directory.inode;
        updates.push(IndexUpdate::SetAttributes(self.directory));
        for (name, child) in &self.entries {
            updates.push(IndexUpdate::SetAttributes(*child));
            updates.push(IndexUpdate::InsertEntry { parent: number, name: name.clone(), child: child.inode });
        }
        updates.push(IndexUpdate::MarkComplete(number));
    }
}

/// Reads `directory` from the volume, which holds exactly the records up to `lsn`. `None` when
/// it is not a directory (any more), or too big to learn.
fn learn_directory(fs: &FileSystem, directory: u64, lsn: u64) -> Result<Option<LearntDirectory>> {
    if directory == 0 || directory > fs.inner.inode_count {
        return Ok(None);
    }
    let seed = fs.inner.backend.applier().hash_seed;
    // Read as of one moment without the volume lock (`read_home`): the back end applies on
    // meanwhile, and the caller's check that the volume is still at `lsn` afterwards tells
    // whether that moment was `lsn`.
    let learnt = fs.read_home(|home| {
        let Some(inode) = home.inode(directory)? else { return Ok(None) };
        if inode.file_type() != FileType::Directory {
            return Ok(None);
        }
        let root = DirRoot::decode(&inode.root_area)?;
        if root.entry_count() > LEARN_DIRECTORY_ENTRIES_MAX {
            return Ok(None);
        }
        let directory_image = (AttributeImage::from_inode(&inode), inode.blocks_owned);
        let mut entries: Vec<(Vec<u8>, u64)> = Vec::new();
        dir::readdir(home.meta(), &root, &seed, 2, &mut |entry| {
            entries.push((entry.name.clone(), entry.inode));
            // Bounded by the entry count checked above (and the H-tree's own bounds).
            entries.len() as u64 <= LEARN_DIRECTORY_ENTRIES_MAX
        })?;
        // A listing cut short, or a name no lookup can ask for, would make the index answer
        // NotFound for a name that exists: such a directory stays unknown (fsck's business).
        if entries.len() as u64 > LEARN_DIRECTORY_ENTRIES_MAX || !entries.iter().all(|(name, _)| indexable_name(name)) {
            return Ok(None);
        }
        let mut listed: Vec<(Vec<u8>, u64, AttributeImage, u64)> = Vec::with_capacity(entries.len());
        for (name, number) in entries {
            let child = home.inode(number)?.ok_or(Error::NotFound)?;
            listed.push((name, number, AttributeImage::from_inode(&child), child.blocks_owned));
        }
        Ok(Some((directory_image, listed)))
    })?;
    let Some((directory_image, listed)) = learnt else { return Ok(None) };
    // Outside the volume lock (a view's lock comes before the volume's elsewhere): a view whose
    // last change is applied is what the front end answers, and may differ from the volume in
    // its block count (a file made since mount counts 0 until a record touches it again).
    let attributes = |number: u64, image: AttributeImage, blocks: u64| {
        let (image, blocks) = fs.view_as_of(number, lsn).unwrap_or((image, blocks));
        index_attributes(&image, blocks)
    };
    let directory_attributes = attributes(directory, directory_image.0, directory_image.1);
    let entries =
        listed.into_iter().map(|(name, number, image, blocks)| (name, attributes(number, image, blocks))).collect();
    Ok(Some(LearntDirectory { directory: directory_attributes, entries }))
}

impl FileSystem {
    /// The attributes and owned blocks of `number`'s cached view if its last change is at or
    /// below `lsn` (so the view says what the volume at `lsn` says, in the front end's words).
    fn view_as_of(&self, number: u64, lsn: u64) -> Option<(AttributeImage, u64)> {
        let shard = self.inner.front.read_views(number);
        let view = shard.views.get(&number).filter(|view| !view.reclaimed)?;
        (view.last_change_lsn <= lsn && view.pending_blocks.is_empty())
            .then(|| (view.attributes.clone(), view.blocks_owned))
    }
}

/// A name the index can store and the single call would look up: what `check_name` lets
/// through (the index also refuses `/`, empty names, `.` and `..`, and knows no NUL rule).
fn indexable_name(name: &[u8]) -> bool {
    check_name(name).is_ok()
}

fn index_kind(file_type: FileType) -> IndexKind {
    match file_type {
        FileType::Regular => IndexKind::File,
        FileType::Directory => IndexKind::Directory,
        FileType::Symlink => IndexKind::Symlink,
        _ => IndexKind::Other,
    }
}

/// The index's record of an inode whose front-end view holds `image` and owns `blocks`.
fn index_attributes(image: &AttributeImage, blocks_owned: u64) -> IndexAttributes {
    let file_type = image.file_type();
    IndexAttributes {
        inode: image.inode_number,
        generation: image.generation,
        size_bytes: image.size_bytes,
        blocks_512: blocks_owned * 8,
        atime_ns: image.access_time_ns,
        mtime_ns: image.modify_time_ns,
        ctime_ns: image.change_time_ns,
        btime_ns: image.birth_time_ns,
        rdev: image.rdev,
        parent: if file_type == FileType::Directory { image.parent } else { 0 },
        kind: index_kind(file_type),
        permissions: image.mode & 0o7777,
        uid: image.uid,
        gid: image.gid,
        link_count: image.link_count,
        reserved: 0,
    }
}

/// The index's record of an inode a create made with `attributes` in `parent` (a new view:
/// the same record `index_attributes` makes of its image, which the feed applies later).
fn created_record(attributes: &Attributes, parent: InodeNumber) -> IndexAttributes {
    IndexAttributes {
        inode: attributes.inode,
        generation: attributes.generation,
        size_bytes: attributes.size_bytes,
        blocks_512: attributes.blocks_512,
        atime_ns: attributes.access_time_ns,
        mtime_ns: attributes.modify_time_ns,
        ctime_ns: attributes.change_time_ns,
        btime_ns: attributes.birth_time_ns,
        rdev: attributes.rdev,
        parent: if attributes.file_type == FileType::Directory { parent } else { 0 },
        kind: index_kind(attributes.file_type),
        permissions: attributes.permissions,
        uid: attributes.uid,
        gid: attributes.gid,
        link_count: attributes.link_count,
        reserved: 0,
    }
}

/// The single calls' answer for an index record; `None` for a kind the index does not tell
/// apart (devices, FIFOs and sockets are all `Other`), which the CPU twin answers.
fn attributes_of(record: &IndexAttributes) -> Option<Attributes> {
    let file_type = match record.kind {
        IndexKind::File => FileType::Regular,
        IndexKind::Directory => FileType::Directory,
        IndexKind::Symlink => FileType::Symlink,
        IndexKind::Other => return None,
    };
    Some(Attributes {
        inode: record.inode,
        generation: record.generation,
        file_type,
        permissions: record.permissions,
        link_count: record.link_count,
        uid: record.uid,
        gid: record.gid,
        size_bytes: record.size_bytes,
        blocks_512: record.blocks_512,
        access_time_ns: record.atime_ns,
        modify_time_ns: record.mtime_ns,
        change_time_ns: record.ctime_ns,
        birth_time_ns: record.btime_ns,
        rdev: record.rdev,
    })
}

/// The index updates that bring it from the state before `records` to the state after them.
/// Attributes are the records' images (what the front end's views hold), with the blocks the
/// batch left each inode owning; an inode made by the batch and not counted owns 0 blocks, as
/// its new view does. An image whose block count is unknown makes the index forget the inode
/// rather than hold a wrong count.
fn updates_of_records(records: &[Arc<Op>], owned_blocks: &[(u64, u64)], updates: &mut Vec<IndexUpdate>) {
    let owned: crate::FastHashMap<u64, u64> = owned_blocks.iter().copied().collect();
    let mut made: crate::FastHashSet<u64> = Default::default();
    let set = |updates: &mut Vec<IndexUpdate>, made: &crate::FastHashSet<u64>, image: &AttributeImage| {
        let number = image.inode_number;
        match owned.get(&number).copied().or_else(|| made.contains(&number).then_some(0)) {
            Some(blocks) => updates.push(IndexUpdate::SetAttributes(index_attributes(image, blocks))),
            None => updates.push(IndexUpdate::RemoveInode(number)),
        }
    };
    // A freed inode: its attributes are forgotten, and its number loses any completeness it
    // had as a directory (a freed directory is empty, so no entry stays behind; without the
    // flag, a lookup under the number's next owner cannot answer NotFound for want of
    // attributes). No `DropDirectory`: it would cost the GPU a scan of its entry table.
    let forget = |updates: &mut Vec<IndexUpdate>, number: u64| {
        updates.push(IndexUpdate::RemoveInode(number));
        updates.push(IndexUpdate::MarkIncomplete(number));
    };
    for op in records {
        match op.as_ref() {
            Op::Create { parent, name, inode, .. } => {
                let number = inode.inode_number;
                made.insert(number);
                set(updates, &made, parent);
                set(updates, &made, inode);
                updates.push(IndexUpdate::InsertEntry {
                    parent: parent.inode_number,
                    name: name.clone(),
                    child: number,
                });
                if inode.file_type() == FileType::Directory {
                    // Made empty: every entry it will have comes through a record (a directory
                    // the number was before was empty when it was freed).
                    updates.push(IndexUpdate::MarkComplete(number));
                }
            }
            Op::CreateBatch { parents, creates } => {
                // As that many creates: the new inodes first, so that each parent's image (its
                // state after the record) is set knowing them.
                for create in creates {
                    let number = create.inode.inode_number;
                    made.insert(number);
                    set(updates, &made, &create.inode);
                    let parent = parents[create.parent as usize].inode_number;
                    updates.push(IndexUpdate::InsertEntry { parent, name: create.name.clone(), child: number });
                    if create.inode.file_type() == FileType::Directory {
                        updates.push(IndexUpdate::MarkComplete(number));
                    }
                }
                for parent in parents {
                    set(updates, &made, parent);
                }
            }
            Op::Link { parent, name, inode } => {
                set(updates, &made, parent);
                set(updates, &made, inode);
                let child = inode.inode_number;
                updates.push(IndexUpdate::InsertEntry { parent: parent.inode_number, name: name.clone(), child });
            }
            Op::Unlink { parent, name, inode, disposition } => {
                set(updates, &made, parent);
                updates.push(IndexUpdate::RemoveEntry { parent: parent.inode_number, name: name.clone() });
                match disposition {
                    Disposition::Reclaim => forget(updates, inode.inode_number),
                    Disposition::Keep | Disposition::Orphan => set(updates, &made, inode),
                }
            }
            Op::Rename { parent, name, new_parent, new_name, kind, replaced, images } => {
                for image in images {
                    set(updates, &made, image);
                }
                updates.push(IndexUpdate::RemoveEntry { parent: *parent, name: name.clone() });
                updates.push(IndexUpdate::RemoveEntry { parent: *new_parent, name: new_name.clone() });
                let replaced_number = replaced.map(|(number, _)| number);
                // The moved inode is the one image that is neither directory nor the replaced
                // inode (the record names it only through its image).
                let mut moved = images
                    .iter()
                    .map(|image| image.inode_number)
                    .filter(|number| *number != *parent && *number != *new_parent && Some(*number) != replaced_number);
                match (kind, moved.next(), moved.next()) {
                    (RenameKind::Move, Some(child), None) => {
                        updates.push(IndexUpdate::InsertEntry { parent: *new_parent, name: new_name.clone(), child });
                    }
                    // An exchange (or a record this reading cannot place): both names are
                    // forgotten and both directories learnt again when asked.
                    _ => {
                        updates.push(IndexUpdate::MarkIncomplete(*parent));
                        updates.push(IndexUpdate::MarkIncomplete(*new_parent));
                    }
                }
                if let Some((number, Disposition::Reclaim)) = replaced {
                    forget(updates, *number);
                }
            }
            Op::SetAttributes { inode, .. }
            | Op::Write { inode, .. }
            | Op::DirectWrite { inode, .. }
            | Op::Range { inode, .. }
            | Op::SetXattr { inode, .. }
            | Op::RemoveXattr { inode, .. } => set(updates, &made, inode),
            Op::Reclaim { inode_number } => forget(updates, *inode_number),
        }
    }
}

/// What one update decides: the attributes of an inode, one entry, or a directory's
/// completeness. The index keeps the three apart (docs/GPUDIR.md), so within one `apply` only
/// the last update of each key counts.
#[derive(PartialEq, Eq, Hash)]
enum UpdateKey<'a> {
    Attributes(u64),
    Entry(u64, &'a [u8]),
    Completeness(u64),
}

fn update_key(update: &IndexUpdate) -> Option<UpdateKey<'_>> {
    Some(match update {
        IndexUpdate::SetAttributes(attributes) => UpdateKey::Attributes(attributes.inode),
        IndexUpdate::RemoveInode(number) => UpdateKey::Attributes(*number),
        IndexUpdate::InsertEntry { parent, name, .. } | IndexUpdate::RemoveEntry { parent, name } => {
            UpdateKey::Entry(*parent, name)
        }
        IndexUpdate::MarkComplete(number) | IndexUpdate::MarkIncomplete(number) => UpdateKey::Completeness(*number),
        IndexUpdate::DropDirectory(_) => return None,
    })
}

/// Keeps the last update of each key and moves the completeness flags to the end. The caller
/// applies `updates` in one call, so no query sees anything in between: the index ends in the
/// same state, with fewer updates (a batch of creates in one directory sets its attributes
/// once), and the GPU engine, which cuts an apply into a new command wherever an inode or an
/// entry comes back (`wire::segments`), gets one or two commands instead of one per `mkdir`.
/// A `DropDirectory` (which the feed does not send) would tie entries to completeness: with
/// one, only attribute updates are compacted.
fn compact_updates(updates: &mut Vec<IndexUpdate>) {
    let has_drop = updates.iter().any(|update| matches!(update, IndexUpdate::DropDirectory(_)));
    let mut keep = vec![true; updates.len()];
    {
        let mut later: std::collections::HashSet<UpdateKey<'_>, rustc_hash::FxBuildHasher> = Default::default();
        for (at, update) in updates.iter().enumerate().rev() {
            match update_key(update) {
                Some(key @ UpdateKey::Attributes(_)) => keep[at] = later.insert(key),
                Some(key) if !has_drop => keep[at] = later.insert(key),
                _ => {}
            }
        }
    }
    let mut kept = keep.into_iter();
    updates.retain(|_| kept.next().expect("one flag per update"));
    if !has_drop {
        // Stable: among themselves the flags keep their order (each number appears once now).
        let (flags, others): (Vec<IndexUpdate>, Vec<IndexUpdate>) = std::mem::take(updates)
            .into_iter()
            .partition(|update| matches!(update, IndexUpdate::MarkComplete(_) | IndexUpdate::MarkIncomplete(_)));
        *updates = others;
        updates.extend(flags);
    }
}

/// The `BatchIndex` over a `DirectoryIndex` fed by an `IndexFeed`: answers only when the index
/// has caught up with every change acknowledged before the batch began, and only what the
/// single call would answer (see docs/BATCH.md for what it leaves to the CPU twin).
pub(super) struct IndexAdapter {
    feed: Arc<IndexFeed>,
    /// The mount, without keeping it alive (the mount holds the adapter).
    inner: Weak<Inner>,
    min_batch: usize,
    catch_up_wait: Duration,
}

fn index_error(error: tandem_accel::error::AccelError) -> Error {
    Error::invalid(format!("directory index: {error}"))
}

impl IndexAdapter {
    fn file_system(&self) -> Result<FileSystem> {
        let inner = self.inner.upgrade().ok_or(Error::Shutdown)?;
        Ok(FileSystem { inner })
    }

    /// Whether the index reflects every change acknowledged before now: the last queued lsn is
    /// read first, then the back end is waited for (it applies only durable records) and the
    /// feed, up to `catch_up_wait`. `Err` when the feed has failed.
    fn caught_up(&self, fs: &FileSystem) -> Result<bool> {
        let feed = &self.feed;
        feed.check()?;
        let acknowledged = fs.inner.backend.last_queued_lsn();
        if feed.fed_lsn() >= acknowledged {
            feed.counters.batches_current.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        let caught_up = !self.catch_up_wait.is_zero() && {
            let deadline = Instant::now() + self.catch_up_wait;
            fs.wait_applied(acknowledged).is_ok() && feed.wait_fed(acknowledged, deadline)
        };
        // A feed that failed while this batch waited for it is a failure, not a decline.
        feed.check()?;
        let counter = if caught_up { &feed.counters.batches_waited } else { &feed.counters.batches_declined };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(caught_up)
    }

    /// The mount and whether to answer at all.
    fn begin(&self) -> Result<Option<FileSystem>> {
        let fs = self.file_system()?;
        Ok(self.caught_up(&fs)?.then_some(fs))
    }
}

impl BatchIndex for IndexAdapter {
    fn min_batch(&self) -> usize {
        self.min_batch
    }

    /// Counts a group it will not take part in as declined (as `claim_creates` does).
    fn may_claim(&self) -> bool {
        let Ok(fs) = self.file_system() else { return false };
        let current = !self.feed.is_failed() && self.feed.names_current(fs.inner.backend.last_queued_lsn());
        if !current {
            self.feed.counters.create_groups_declined.fetch_add(1, Ordering::Relaxed);
        }
        current
    }

    /// Claims through the index when it reflects every change acknowledged so far: the caller
    /// holds the name shards of the group's parents, so no change to those names is
    /// acknowledged meanwhile, and none before is missing from the index. No wait here (the
    /// caller holds locks): an index behind declines the group and the front end decides it.
    fn claim_creates(&self, requests: &[IndexCreate<'_>]) -> Result<Option<Vec<ClaimAnswer>>> {
        let fs = self.file_system()?;
        let feed = &self.feed;
        feed.check()?;
        if !feed.names_current(fs.inner.backend.last_queued_lsn()) {
            feed.counters.create_groups_declined.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let asked: Vec<usize> = (0..requests.len())
            .filter(|&position| {
                let request = &requests[position];
                indexable_name(request.name) && request.parent >= 1 && request.parent <= fs.inner.inode_count
            })
            .collect();
        let entries: Vec<CreateEntry<'_>> = asked.iter().map(|&position| claim_entry(&requests[position])).collect();
        let results = match feed.index.claim_entries(&entries) {
            Ok(results) => results,
            Err(error) => {
                // Some claims may be pending: nothing may trust the index any more.
                feed.fail(format!("claiming {} names failed: {error}", entries.len()));
                return Err(index_error(error));
            }
        };
        if results.len() != entries.len() {
            return Err(Error::invalid(format!("index answered {} of {} claims", results.len(), entries.len())));
        }
        let mut answers = vec![ClaimAnswer::Unknown; requests.len()];
        for (position, result) in asked.into_iter().zip(results) {
            answers[position] = match result {
                CreateResult::Created => ClaimAnswer::Claimed,
                CreateResult::Exists(child) => ClaimAnswer::Taken(child),
                CreateResult::NotDirectory | CreateResult::Unknown => {
                    feed.ask_to_learn(requests[position].parent);
                    ClaimAnswer::Unknown
                }
            };
        }
        let counters = &feed.counters;
        counters.create_groups_claimed.fetch_add(1, Ordering::Relaxed);
        let claimed = answers.iter().filter(|answer| **answer == ClaimAnswer::Claimed).count();
        let taken = answers.iter().filter(|answer| matches!(answer, ClaimAnswer::Taken(_))).count();
        counters.names_claimed.fetch_add(claimed as u64, Ordering::Relaxed);
        counters.names_found_taken.fetch_add(taken as u64, Ordering::Relaxed);
        Ok(Some(answers))
    }

    /// Commits the made creates with their attributes and aborts the rest. A claim left
    /// pending would answer its name taken to every later create, so a settle that fails
    /// fails the feed: the index answers nothing any more.
    fn settle_creates(
        &self,
        requests: &[IndexCreate<'_>],
        made: &[Option<Attributes>],
        record: Option<u64>,
    ) -> Result<()> {
        assert_eq!(requests.len(), made.len(), "one outcome per claim");
        let (mut commits, mut aborts) = (Vec::new(), Vec::new());
        for (request, outcome) in requests.iter().zip(made) {
            match outcome {
                Some(attributes) => commits.push(CreateEntry {
                    attributes: created_record(attributes, request.parent),
                    ..claim_entry(request)
                }),
                None => aborts.push(claim_entry(request)),
            }
        }
        for (settle, part) in [(Settle::Commit, &commits), (Settle::Abort, &aborts)] {
            if part.is_empty() {
                continue;
            }
            if let Err(error) = self.feed.index.settle_claims(part, settle) {
                self.feed.fail(format!("settling {} claims failed: {error}", part.len()));
                return Err(index_error(error));
            }
        }
        if let Some(lsn) = record {
            self.feed.note_reflected(lsn);
        }
        Ok(())
    }

    fn lookup(&self, requests: &[(InodeNumber, &[u8])], answers: &mut [BatchAnswer]) -> Result<()> {
        assert_eq!(requests.len(), answers.len(), "one answer per request");
        let Some(fs) = self.begin()? else { return Ok(()) };
        let mut positions = Vec::with_capacity(requests.len());
        let mut asked = Vec::with_capacity(requests.len());
        for (position, &(parent, name)) in requests.iter().enumerate() {
            if name.len() > NAME_MAX_BYTES {
                // The single call's first check, whatever the parent.
                answers[position] = Some(Err(Error::NameTooLong));
            } else if indexable_name(name) && parent >= 1 && parent <= fs.inner.inode_count {
                positions.push(position);
                asked.push((parent, name));
            }
        }
        let results = self.feed.index.lookup(&asked).map_err(index_error)?;
        if results.len() != asked.len() {
            return Err(Error::invalid(format!("index answered {} of {} lookups", results.len(), asked.len())));
        }
        for ((position, (parent, _)), result) in positions.into_iter().zip(asked).zip(results) {
            answers[position] = match result {
                LookupResult::Found(record) => attributes_of(&record).map(Ok),
                LookupResult::NotFound => Some(Err(Error::NotFound)),
                LookupResult::NotDirectory => Some(Err(Error::NotDirectory)),
                LookupResult::Unknown => {
                    self.feed.ask_to_learn(parent);
                    None
                }
            };
        }
        Ok(())
    }

    fn resolve(&self, paths: &[&[u8]], answers: &mut [BatchAnswer]) -> Result<()> {
        assert_eq!(paths.len(), answers.len(), "one answer per path");
        if self.begin()?.is_none() {
            return Ok(());
        }
        let mut positions = Vec::with_capacity(paths.len());
        let mut asked: Vec<&[u8]> = Vec::with_capacity(paths.len());
        for (position, &path) in paths.iter().enumerate() {
            // `resolve_path` has no length limit and refuses NUL in a name (InvalidArgument):
            // such paths are the CPU's.
            if path.len() > MAXIMUM_PATH_BYTES || path.contains(&0) {
                continue;
            }
            // `resolve_path` skips empty components, a trailing '/' included (the index's walk
            // would insist on a directory there), and answers the root for an empty path.
            let trimmed = &path[..path.len() - path.iter().rev().take_while(|byte| **byte == b'/').count()];
            positions.push(position);
            asked.push(if trimmed.is_empty() { b"." } else { trimmed });
        }
        let results =
            self.feed.index.resolve(&asked, tandem_accel::dirindex::Credentials::ROOT).map_err(index_error)?;
        if results.len() != asked.len() {
            return Err(Error::invalid(format!("index answered {} of {} paths", results.len(), asked.len())));
        }
        for (position, result) in positions.into_iter().zip(results) {
            answers[position] = match result {
                ResolveResult::Found(record) => attributes_of(&record).map(Ok),
                ResolveResult::NotFound => Some(Err(Error::NotFound)),
                ResolveResult::NotDirectory => Some(Err(Error::NotDirectory)),
                ResolveResult::NameTooLong => Some(Err(Error::NameTooLong)),
                // Symbolic links, unknown directories; a permission refusal cannot happen as
                // root, and the single call checks none anyway.
                ResolveResult::NeedsCpu | ResolveResult::PermissionDenied => None,
            };
        }
        Ok(())
    }

    fn stat(&self, inodes: &[InodeNumber], answers: &mut [BatchAnswer]) -> Result<()> {
        assert_eq!(inodes.len(), answers.len(), "one answer per inode");
        let Some(fs) = self.begin()? else { return Ok(()) };
        let limit = fs.inner.inode_count;
        let positions: Vec<usize> = (0..inodes.len()).filter(|&p| inodes[p] >= 1 && inodes[p] <= limit).collect();
        let asked: Vec<u64> = positions.iter().map(|&position| inodes[position]).collect();
        let results = self.feed.index.stat(&asked).map_err(index_error)?;
        if results.len() != asked.len() {
            return Err(Error::invalid(format!("index answered {} of {} stats", results.len(), asked.len())));
        }
        for ((position, inode), result) in positions.into_iter().zip(asked).zip(results) {
            answers[position] = match result {
                StatResult::Found(record) if record.inode == inode => attributes_of(&record).map(Ok),
                StatResult::Found(record) => {
                    return Err(Error::invalid(format!("index answered inode {} for {inode}", record.inode)))
                }
                StatResult::Unknown => None,
            };
        }
        Ok(())
    }
}

/// The index's request for a claim: the new entry, for an inode of the request's kind (the
/// rest of its record comes with the commit).
fn claim_entry<'a>(request: &IndexCreate<'a>) -> CreateEntry<'a> {
    let attributes = IndexAttributes::new(request.inode, index_kind(request.file_type), 0);
    CreateEntry { parent: request.parent, name: request.name, attributes }
}

/// Opens the index the options ask for.
fn open_index(options: &DirectoryIndexOptions) -> Result<(Arc<dyn DirectoryIndex>, bool)> {
    let cpu = || -> Result<(Arc<dyn DirectoryIndex>, bool)> {
        let index = CpuDirectoryIndex::new(ROOT_INODE, options.cpu_threads).map_err(index_error)?;
        Ok((Arc::new(index), false))
    };
    let open_gpu = || GpuDirectoryIndex::open(ROOT_INODE, GpuIndexConfig::for_entries(options.gpu_entries));
    let gpu = |index: GpuDirectoryIndex| -> Result<(Arc<dyn DirectoryIndex>, bool)> { Ok((Arc::new(index), true)) };
    match options.engine {
        IndexEngine::Cpu => cpu(),
        IndexEngine::Gpu => gpu(open_gpu().map_err(index_error)?),
        IndexEngine::GpuOrCpu => match open_gpu() {
            Ok(index) => gpu(index),
            Err(error) if error.is_no_gpu() => cpu(),
            Err(error) => Err(index_error(error)),
        },
    }
}

impl FileSystem {
    /// Installs a directory index as the batch API's `BatchIndex`: the CPU twin by default, the
    /// GPU engine when `options.engine` asks for it (and one opens). The index starts empty,
    /// learns the root and, from there, the tree (see docs/BATCH.md); the back end feeds it
    /// every batch it applies from now on. Returns the index's name. Replaces any index
    /// installed before; `unmount` removes it.
    pub fn install_directory_index(&self, options: &DirectoryIndexOptions) -> Result<String> {
        self.check_running()?;
        // The index installed before goes first: a GPU serves one index at a time
        // (docs/GPUDIR.md), and its feed must not see batches meant for the new one.
        self.set_batch_index(None);
        let (index, gpu) = open_index(options)?;
        let min_batch = options.min_batch.unwrap_or(if gpu { MIN_BATCH_GPU_DEFAULT } else { MIN_BATCH_CPU_DEFAULT });
        self.install_directory_index_with(index, min_batch, options.catch_up_wait_ms)
    }

    /// `install_directory_index` with an index the caller opened (a GPU index of its own
    /// configuration, a wrapper in tests). The index must be new (empty) and resolve paths from
    /// the root inode; it serves batches of at least `min_batch` requests.
    pub fn install_directory_index_with(
        &self,
        index: Arc<dyn DirectoryIndex>,
        min_batch: usize,
        catch_up_wait_ms: u64,
    ) -> Result<String> {
        self.check_running()?;
        if index.root() != ROOT_INODE {
            return Err(Error::invalid(format!("a directory index rooted at {}, not the root", index.root())));
        }
        self.set_batch_index(None);
        let name = index.name();
        let feed = Arc::new(IndexFeed::new(index, 0));
        *self.inner.batch.feed.write() = Some(feed.clone());
        // Read after the feed is in place: every batch applied later reaches the feed, and one
        // applied before found the index empty, so there is nothing for it to contradict.
        feed.advance(self.applied());
        feed.ask_to_learn(ROOT_INODE);
        let (runner, inner) = (feed.clone(), Arc::downgrade(&self.inner));
        let spawned = std::thread::Builder::new().name("tandem-dirindex-feed".into()).spawn(move || runner.run(inner));
        let handle = match spawned {
            Ok(handle) => handle,
            Err(error) => {
                self.detach_index_feed();
                return Err(Error::invalid(format!("cannot start the directory index feeder: {error}")));
            }
        };
        *feed.feeder.lock() = Some(handle);
        let adapter = IndexAdapter {
            feed,
            inner: Arc::downgrade(&self.inner),
            min_batch: min_batch.max(1),
            catch_up_wait: Duration::from_millis(catch_up_wait_ms),
        };
        *self.inner.batch.index.write() = Some(Arc::new(adapter));
        Ok(name)
    }

    /// What the installed directory index's feed and adapter did; `None` when none is installed.
    pub fn directory_index_statistics(&self) -> Option<DirectoryIndexStatistics> {
        self.inner.batch.feed.read().as_ref().map(|feed| feed.statistics())
    }

    /// Stops the feed of an installed directory index (its thread ends; the back end stops
    /// feeding it). Called whenever the batch index is replaced or removed.
    pub(super) fn detach_index_feed(&self) {
        let feed = self.inner.batch.feed.write().take();
        if let Some(feed) = feed {
            feed.detach();
        }
    }

    /// The back end applied a batch: the installed directory index's feed gets it.
    pub(super) fn feed_directory_index(&self, summary: &BatchSummary<'_>) {
        let feed = self.inner.batch.feed.read().clone();
        if let Some(feed) = feed {
            feed.batch_applied(self, summary);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(number: u64, mode: u32, parent: u64) -> AttributeImage {
        AttributeImage {
            inode_number: number,
            generation: number + 100,
            mode,
            link_count: 1,
            uid: 7,
            gid: 8,
            size_bytes: 10,
            access_time_ns: 1,
            modify_time_ns: 2,
            change_time_ns: 3,
            birth_time_ns: 4,
            rdev: 0,
            parent,
            flags: 0,
        }
    }

    #[test]
    fn attributes_go_through_the_index_record_unchanged() {
        for (mode, kind) in
            [(0o100644, IndexKind::File), (0o40755, IndexKind::Directory), (0o120777, IndexKind::Symlink)]
        {
            let image = image(5, mode, 1);
            let record = index_attributes(&image, 3);
            assert_eq!(record.kind, kind);
            let mut view = crate::fs::front::InodeView::new(image.clone(), 3, 0);
            view.last_change_lsn = 1;
            assert_eq!(attributes_of(&record), Some(view.to_attributes()), "mode {mode:o}");
        }
        // A FIFO is `Other` in the index: the CPU answers it.
        assert_eq!(attributes_of(&index_attributes(&image(6, 0o10644, 1), 0)), None);
    }

    #[test]
    fn a_rename_moves_the_entry_and_an_exchange_forgets_both_directories() {
        let (a, b, file) = (image(2, 0o40755, 1), image(3, 0o40755, 1), image(9, 0o100644, 0));
        let owned = [(2, 1), (3, 1), (9, 0)];
        let rename = |kind| {
            Arc::new(Op::Rename {
                parent: 2,
                name: b"x".to_vec(),
                new_parent: 3,
                new_name: b"y".to_vec(),
                kind,
                replaced: None,
                images: vec![a.clone(), b.clone(), file.clone()],
            })
        };
        let mut updates = Vec::new();
        updates_of_records(&[rename(RenameKind::Move)], &owned, &mut updates);
        assert!(updates.contains(&IndexUpdate::InsertEntry { parent: 3, name: b"y".to_vec(), child: 9 }));
        assert!(updates.contains(&IndexUpdate::RemoveEntry { parent: 2, name: b"x".to_vec() }));
        let mut updates = Vec::new();
        updates_of_records(&[rename(RenameKind::Exchange)], &owned, &mut updates);
        assert!(updates.contains(&IndexUpdate::MarkIncomplete(2)) && updates.contains(&IndexUpdate::MarkIncomplete(3)));
        assert!(!updates.iter().any(|update| matches!(update, IndexUpdate::InsertEntry { .. })));
    }

    #[test]
    fn only_the_last_update_of_a_key_is_kept_and_flags_go_last() {
        let (a, b) = (index_attributes(&image(4, 0o100644, 0), 1), index_attributes(&image(5, 0o40755, 1), 2));
        let insert = |name: &[u8], child| IndexUpdate::InsertEntry { parent: 5, name: name.to_vec(), child };
        let remove = |name: &[u8]| IndexUpdate::RemoveEntry { parent: 5, name: name.to_vec() };
        let mut updates = vec![
            IndexUpdate::SetAttributes(a),
            IndexUpdate::MarkComplete(5),
            IndexUpdate::SetAttributes(b),
            insert(b"n", 4),
            insert(b"m", 6),
            IndexUpdate::RemoveInode(4),
            remove(b"n"),
            IndexUpdate::MarkIncomplete(5),
            IndexUpdate::MarkComplete(4),
            IndexUpdate::SetAttributes(b),
        ];
        compact_updates(&mut updates);
        let expected = vec![
            insert(b"m", 6),
            IndexUpdate::RemoveInode(4),
            remove(b"n"),
            IndexUpdate::SetAttributes(b),
            IndexUpdate::MarkIncomplete(5),
            IndexUpdate::MarkComplete(4),
        ];
        assert_eq!(updates, expected);
        // With a drop, entries and flags stay as they are.
        let mut updates =
            vec![insert(b"n", 4), IndexUpdate::DropDirectory(5), insert(b"n", 4), IndexUpdate::MarkComplete(5)];
        let unchanged = updates.clone();
        compact_updates(&mut updates);
        assert_eq!(updates, unchanged);
    }

    /// Compacted updates leave the CPU twin as the updates one by one do, on random batches
    /// over a few inodes and names (so that keys come back often).
    #[test]
    fn compacted_updates_leave_the_index_as_the_updates_do() {
        let mut state = 12345u64;
        let mut next = |bound: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % bound
        };
        for _ in 0..50 {
            let updates: Vec<IndexUpdate> = (0..200)
                .map(|_| {
                    let (inode, other) = (2 + next(6), 2 + next(6));
                    let name = vec![b'a' + next(4) as u8];
                    match next(7) {
                        0 => IndexUpdate::SetAttributes(index_attributes(&image(inode, 0o40755, 1), next(3))),
                        1 => IndexUpdate::RemoveInode(inode),
                        2 => IndexUpdate::InsertEntry { parent: inode, name, child: other },
                        3 => IndexUpdate::RemoveEntry { parent: inode, name },
                        4 => IndexUpdate::MarkComplete(inode),
                        5 => IndexUpdate::MarkIncomplete(inode),
                        _ => IndexUpdate::SetAttributes(index_attributes(&image(inode, 0o100644, 0), next(3))),
                    }
                })
                .collect();
            let mut compacted = updates.clone();
            compact_updates(&mut compacted);
            assert!(compacted.len() < updates.len());
            let (plain, compact) = (CpuDirectoryIndex::new(1, 1).unwrap(), CpuDirectoryIndex::new(1, 1).unwrap());
            plain.apply(&updates).unwrap();
            compact.apply(&compacted).unwrap();
            for inode in 2..8u64 {
                assert_eq!(plain.stat(&[inode]).unwrap(), compact.stat(&[inode]).unwrap());
                assert_eq!(plain.list(inode).unwrap(), compact.list(inode).unwrap());
                for name in [b"a", b"b", b"c", b"d", b"e"] {
                    let request = [(inode, name.as_slice())];
                    assert_eq!(plain.lookup(&request).unwrap(), compact.lookup(&request).unwrap());
                }
            }
        }
    }

    #[test]
    fn an_image_without_a_block_count_is_forgotten() {
        let mut updates = Vec::new();
        let op = Arc::new(Op::SetAttributes { inode: image(4, 0o100644, 0), truncate: false });
        updates_of_records(std::slice::from_ref(&op), &[], &mut updates);
        assert_eq!(updates, vec![IndexUpdate::RemoveInode(4)]);
        updates.clear();
        updates_of_records(&[op], &[(4, 2)], &mut updates);
        assert_eq!(updates, vec![IndexUpdate::SetAttributes(index_attributes(&image(4, 0o100644, 0), 2))]);
    }
}
