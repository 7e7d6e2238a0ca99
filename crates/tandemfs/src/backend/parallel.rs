//! The parallel back end: a batch of durable records is split into groups that share no inode,
//! and a pool of apply workers applies the groups side by side, each group's records in lsn
//! order, each record through its own [`RecordStore`].
//!
//! Why this keeps the single-applier result: a record reads and writes only the inodes it names
//! (its parents, its own inode, a replaced or moved inode) and the blocks those inodes own; the
//! allocators and the inode table are shared but each use of them is one step under the volume
//! lock, and allocation does not change what any record means. So two records that name no
//! common inode commute, and records that do are kept in one group, in lsn order. The few
//! records that reach beyond their inodes (the orphan list in the superblock links inodes of
//! other records; extended-attribute blocks are swapped while the inode still points at the old
//! one) make their whole batch apply with the volume held, as before (`needs_whole_volume`).
//!
//! Batches overlap: the dispatcher hands each batch to the pool as soon as its records are
//! durable, and a group waits only for the earlier groups (of any batch) that name one of its
//! inodes (`Scheduler`), so each directory's records stream through the workers while a slow
//! group elsewhere finishes. The batch stays the unit of everything else: batches are made
//! applied in lsn order, each only when every group of it is done (the applied lsn stays a
//! watermark below which everything is applied, and nothing is made applied after a failure);
//! a checkpoint waits until no batch is in flight, so it still covers exactly a prefix of the
//! log and a crash still leaves "checkpoint + durable records".

use super::driver::Queued;
use super::record::{Disposition, Op};
use super::store::{Memo, RecordStore};
use super::Applier;
use crate::block::volume::Volume;
use crate::error::{Error, Result};
use crate::log::Pledges;
use crate::FastHashMap;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most apply workers a back end runs, whatever the machine has: the volume lock they share
/// stops paying beyond this.
pub const WORKERS_MAX: usize = 64;
/// Records a worker applies before it hands their changes to the volume in one lock hold: the
/// volume lock is taken once per this many records, and a store holds at most this many
/// records' changes. Most groups of a 1,024-record batch are smaller, so a group commits once.
/// The workers queue on the volume lock, and each hand-over costs a wake-up: on the 16-core
/// host, 32 took the lock 93,000 times for 1.28 million creates and unlinks and waited 8–10 s
/// for it; committing once per group took it 57,000–62,000 times, waited 5.6–9 s, and created
/// and unlinked 13–34 % faster (`tandem bench meta --threads 1,16 --layout private`).
const COMMIT_RECORDS_MAX: usize = 256;
/// How long an idle worker sleeps between looks at the stop flag.
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// How long the dispatcher waits for the workers to finish one batch before it declares them
/// stuck: a batch is at most `PARALLEL_BATCH_RECORDS_MAX` records, each of bounded work.
const BATCH_WAIT_MAX: Duration = Duration::from_secs(600);
/// How often the dispatcher looks at the clock while it waits.
const BATCH_WAIT_SLICE: Duration = Duration::from_millis(50);

/// The worker count when the mount names none: half the cores, at least 2, within
/// `WORKERS_MAX`. The callers' own threads (the FUSE server's, a program's) run the front end on
/// the same cores: with one worker per core, 16 creating threads on 16 cores were preempted by
/// the workers more often than they waited for anything else, and 8 workers created and
/// unlinked 9–11% faster than 16 (BENCHMARKS.md, *mimalloc and half the cores as workers*).
pub fn default_workers() -> usize {
    let cores = std::thread::available_parallelism().map(|cores| cores.get()).unwrap_or(1);
    (cores / 2).clamp(2, WORKERS_MAX)
}

/// Whether a record changes state beyond the inodes it names, so that its batch must apply
/// with the volume held throughout (see the module comment).
pub fn needs_whole_volume(op: &Op) -> bool {
    match op {
        Op::Unlink { disposition, .. } => *disposition == Disposition::Orphan,
        Op::Rename { replaced, .. } => matches!(replaced, Some((_, Disposition::Orphan))),
        Op::Reclaim { .. } | Op::SetXattr { .. } | Op::RemoveXattr { .. } => true,
        Op::Create { .. }
        | Op::CreateBatch { .. }
        | Op::Link { .. }
        | Op::SetAttributes { .. }
        | Op::Write { .. }
        | Op::DirectWrite { .. }
        | Op::Range { .. } => false,
    }
}

/// Every inode a record reads or writes.
fn inodes_named(op: &Op, out: &mut Vec<u64>) {
    out.clear();
    match op {
        Op::Create { parent, inode, .. } | Op::Link { parent, inode, .. } | Op::Unlink { parent, inode, .. } => {
            out.extend([parent.inode_number, inode.inode_number]);
        }
        Op::Rename { parent, new_parent, replaced, images, .. } => {
            out.extend([*parent, *new_parent]);
            out.extend(replaced.iter().map(|(number, _)| *number));
            out.extend(images.iter().map(|image| image.inode_number));
        }
        Op::SetAttributes { inode, .. }
        | Op::Write { inode, .. }
        | Op::DirectWrite { inode, .. }
        | Op::Range { inode, .. }
        | Op::SetXattr { inode, .. }
        | Op::RemoveXattr { inode, .. } => out.push(inode.inode_number),
        Op::Reclaim { inode_number } => out.push(*inode_number),
        Op::CreateBatch { parents, creates } => {
            out.extend(parents.iter().map(|parent| parent.inode_number));
            out.extend(creates.iter().map(|create| create.inode.inode_number));
        }
    }
}

/// Splits `records` into groups that name no common inode; each group lists its records'
/// places in `records`, in lsn order. Groups come largest first, so that the longest chains
/// start first.
pub fn group_by_inode(records: &[Queued]) -> Vec<Vec<u32>> {
    assert!(records.len() < u32::MAX as usize);
    assert!(records.windows(2).all(|pair| pair[0].lsn < pair[1].lsn), "a batch is in lsn order");
    // Union-find over record places: the records that name an inode join the first that did.
    let mut leader: Vec<u32> = (0..records.len() as u32).collect();
    fn find(leader: &mut [u32], mut place: u32) -> u32 {
        while leader[place as usize] != place {
            let up = leader[leader[place as usize] as usize];
            leader[place as usize] = up;
            place = up;
        }
        place
    }
    let mut first_naming: FastHashMap<u64, u32> = FastHashMap::default();
    let mut named = Vec::new();
    for (place, queued) in records.iter().enumerate() {
        inodes_named(&queued.op, &mut named);
        for inode_number in &named {
            let earlier = *first_naming.entry(*inode_number).or_insert(place as u32);
            let (a, b) = (find(&mut leader, earlier), find(&mut leader, place as u32));
            if a != b {
                leader[a.max(b) as usize] = a.min(b);
            }
        }
    }
    let mut group_of_leader: FastHashMap<u32, usize> = FastHashMap::default();
    let mut groups: Vec<Vec<u32>> = Vec::new();
    for place in 0..records.len() as u32 {
        let root = find(&mut leader, place);
        let group = *group_of_leader.entry(root).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(place);
    }
    groups.sort_by_key(|group| std::cmp::Reverse(group.len()));
    groups
}

/// One batch handed to the workers.
///
/// Batches overlap: the dispatcher hands a batch to the pool as soon as its records are
/// durable, while groups of earlier batches still run. A group of a later batch that names an
/// inode of a group still running (or still waiting) waits for exactly that group, not for the
/// whole batch before it, so each directory's records stream through the workers one group
/// after another while unrelated directories go on beside them (see [`ApplyPool::submit`]).
pub struct Job {
    id: u64,
    volume: Arc<Mutex<Volume>>,
    memo: Arc<Memo>,
    applier: Applier,
    records: Vec<(u64, Arc<Op>)>,
    groups: Vec<Vec<u32>>,
    /// Per group, every inode its records name, sorted, once each: what later groups wait on.
    group_inodes: Vec<Vec<u64>>,
    /// Per group, the image bounds of its records: released from the log's pledge as soon as
    /// the group is committed (its dirt is then in the volume's estimate), so that appenders
    /// need not wait for the batch's last group.
    group_image_blocks: Vec<u64>,
    pledges: Arc<Pledges>,
    outcome: Mutex<Outcome>,
    finished: Condvar,
}

#[derive(Default)]
struct Outcome {
    groups_finished: usize,
    /// Time the workers spent applying groups, summed over workers, in nanoseconds.
    busy_ns: u64,
    /// Time the workers' stores waited for the volume lock and held it, summed, in nanoseconds.
    lock_wait_ns: u64,
    lock_held_ns: u64,
    lock_takes: u64,
    owned_blocks: Vec<(u64, u64)>,
    error: Option<Error>,
}

/// What one applied group hands back: the (inode, blocks owned) of the inodes it wrote, and
/// its store's volume-lock (wait, hold) nanoseconds and takes.
type GroupOutcome = (Vec<(u64, u64)>, (u64, u64, u64));

/// What a finished job reports: the blocks owned by the inodes written, and where the workers'
/// time went (all in nanoseconds, summed over workers).
pub struct JobReport {
    pub owned_blocks: Vec<(u64, u64)>,
    pub busy_ns: u64,
    pub lock_wait_ns: u64,
    pub lock_held_ns: u64,
    pub lock_takes: u64,
}

/// What a job needs besides its records: the volume, the workers' memo, the applier and the
/// log's pledge of checkpoint images, shared by every job of one back end.
pub struct JobContext<'a> {
    pub volume: &'a Arc<Mutex<Volume>>,
    pub memo: &'a Arc<Memo>,
    pub applier: &'a Applier,
    pub pledges: &'a Arc<Pledges>,
}

impl Job {
    /// A job for `batch` split into `groups` (from `group_by_inode`); `id` comes from
    /// [`ApplyPool::next_job_id`].
    pub fn new(id: u64, context: JobContext<'_>, batch: &[Queued], groups: Vec<Vec<u32>>) -> Job {
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), batch.len(), "every record is in one group");
        let records: Vec<(u64, Arc<Op>)> = batch.iter().map(|queued| (queued.lsn, queued.op.clone())).collect();
        let group_image_blocks =
            groups.iter().map(|group| group.iter().map(|&place| batch[place as usize].image_blocks).sum()).collect();
        let group_inodes = groups.iter().map(|group| inodes_of(&records, group)).collect();
        Job {
            id,
            group_image_blocks,
            group_inodes,
            pledges: context.pledges.clone(),
            volume: context.volume.clone(),
            memo: context.memo.clone(),
            applier: context.applier.clone(),
            records,
            groups,
            outcome: Mutex::new(Outcome::default()),
            finished: Condvar::new(),
        }
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Applies group `group` (or passes over it once the pool has failed) and counts it
    /// finished. Run by the worker that took it from the ready queue.
    fn run_group(&self, group: usize, failed: &AtomicBool) {
        let started = Instant::now();
        let result = if failed.load(Ordering::Acquire) {
            // Passed over: its job must not be made applied, whichever job failed (a later
            // batch's group can fail while an earlier batch still has groups to run).
            Err(Error::Shutdown)
        } else {
            let apply = std::panic::AssertUnwindSafe(|| self.apply_group(group));
            std::panic::catch_unwind(apply).unwrap_or_else(|panic| {
                let reason = super::driver::panic_reason(panic.as_ref());
                Err(Error::invalid(format!("apply worker panicked: {reason}")))
            })
        };
        let busy_ns = started.elapsed().as_nanos() as u64;
        let mut outcome = self.outcome.lock();
        outcome.busy_ns += busy_ns;
        match result {
            Ok((owned, (lock_wait_ns, lock_held_ns, lock_takes))) => {
                outcome.lock_takes += lock_takes;
                // Applied and committed (its dirt is in the volume's estimate): its records'
                // bounds leave the pledge.
                self.pledges.records_applied(self.group_image_blocks[group]);
                outcome.owned_blocks.extend(owned);
                outcome.lock_wait_ns += lock_wait_ns;
                outcome.lock_held_ns += lock_held_ns;
            }
            Err(error) => {
                failed.store(true, Ordering::Release);
                outcome.error.get_or_insert(error);
            }
        }
        outcome.groups_finished += 1;
        assert!(outcome.groups_finished <= self.groups.len(), "a group finished twice");
        if outcome.groups_finished == self.groups.len() {
            self.finished.notify_all();
        }
    }

    /// Applies one group's records in lsn order; returns the blocks owned by the inodes they
    /// wrote and the store's volume-lock wait and hold times.
    fn apply_group(&self, group: usize) -> Result<GroupOutcome> {
        let places = &self.groups[group];
        let mut owned = Vec::new();
        let mut store = RecordStore::new(&self.volume, &self.memo);
        store.prefetch_inodes(&inodes_read(&self.records, places, &self.group_inodes[group]));
        let mut uncommitted = 0;
        for &place in places {
            let (lsn, op) = &self.records[place as usize];
            owned.extend(self.applier.apply(&mut store, *lsn, op)?);
            uncommitted += 1;
            if uncommitted == COMMIT_RECORDS_MAX {
                store.commit()?;
                uncommitted = 0;
            }
        }
        if uncommitted > 0 {
            store.commit()?;
        }
        let (lock_wait_ns, lock_held_ns) = store.lock_times_ns();
        Ok((owned, (lock_wait_ns, lock_held_ns, store.lock_count())))
    }

    /// Whether every group is finished (applied, failed or passed over).
    pub fn is_finished(&self) -> bool {
        self.outcome.lock().groups_finished == self.groups.len()
    }

    /// Waits up to `timeout` for every group to finish; true when they have.
    pub fn wait_finished(&self, timeout: Duration) -> bool {
        let started = Instant::now();
        let mut outcome = self.outcome.lock();
        while outcome.groups_finished < self.groups.len() {
            let elapsed = started.elapsed();
            if elapsed >= timeout {
                return false;
            }
            self.finished.wait_for(&mut outcome, (timeout - elapsed).min(BATCH_WAIT_SLICE));
        }
        true
    }

    /// Waits until every group is finished; returns the blocks owned by the inodes written and
    /// the time the workers were busy, or the first error. Bounded: workers that stop
    /// answering are an error, not a hang. Called once per job.
    pub fn wait(&self) -> Result<JobReport> {
        if !self.wait_finished(BATCH_WAIT_MAX) {
            return Err(Error::invalid("apply workers did not finish a batch"));
        }
        let mut outcome = self.outcome.lock();
        match outcome.error.take() {
            Some(error) => Err(error),
            None => Ok(JobReport {
                owned_blocks: std::mem::take(&mut outcome.owned_blocks),
                busy_ns: outcome.busy_ns,
                lock_wait_ns: outcome.lock_wait_ns,
                lock_held_ns: outcome.lock_held_ns,
                lock_takes: outcome.lock_takes,
            }),
        }
    }
}

/// Every inode the records at `places` name, sorted, once each.
fn inodes_of(records: &[(u64, Arc<Op>)], places: &[u32]) -> Vec<u64> {
    let mut all = Vec::with_capacity(places.len() * 2);
    let mut named = Vec::new();
    for &place in places {
        inodes_named(&records[place as usize].1, &mut named);
        all.extend_from_slice(&named);
    }
    all.sort_unstable();
    all.dedup();
    all
}

/// The inodes the records at `places` may read from the volume: of `named` (every inode they
/// name, sorted), all but those a create among them makes (it writes a fresh record and reads
/// none; prefetching it took the volume lock once per group of creates to find nothing).
fn inodes_read(records: &[(u64, Arc<Op>)], places: &[u32], named: &[u64]) -> Vec<u64> {
    let mut created: Vec<u64> = Vec::new();
    for &place in places {
        match records[place as usize].1.as_ref() {
            Op::Create { inode, .. } => created.push(inode.inode_number),
            Op::CreateBatch { creates, .. } => created.extend(creates.iter().map(|create| create.inode.inode_number)),
            _ => {}
        }
    }
    created.sort_unstable();
    named.iter().copied().filter(|number| created.binary_search(number).is_err()).collect()
}

/// A group of a job, as the scheduler names it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct GroupKey {
    job: u64,
    group: u32,
}

/// A group whose predecessors are all finished, waiting for a worker.
struct Ready {
    job: Arc<Job>,
    group: usize,
}

/// Which groups may run, and which wait for which. Every group that names an inode waits for
/// the group submitted last before it that names the same inode, if that one is not finished:
/// groups are submitted in lsn order, so the groups naming one inode run one after another in
/// lsn order, and groups that name no common inode run side by side and commute. Groups only
/// ever wait for groups submitted earlier, so the waits form no cycle.
#[derive(Default)]
struct Scheduler {
    ready: VecDeque<Ready>,
    /// For each inode named by a group not yet finished, the last such group submitted.
    latest: FastHashMap<u64, GroupKey>,
    /// Groups waiting for others: their job and how many they still wait for.
    waiting: FastHashMap<GroupKey, (Arc<Job>, usize)>,
    /// For each group that others wait for, those others.
    dependents: FastHashMap<GroupKey, Vec<GroupKey>>,
    next_job_id: u64,
    stop: bool,
    /// The inodes named by the groups running now (checked: no two running groups share one).
    running: crate::FastHashSet<u64>,
    /// For each inode named since the pool started, the last job whose group naming it started
    /// (checked: each inode's groups start in job order, which is lsn order). At most one entry
    /// per inode of the volume.
    started_by: FastHashMap<u64, u64>,
}

impl Scheduler {
    /// Takes `job`'s groups in: ready at once or waiting. Returns how many became ready.
    fn submit(&mut self, job: &Arc<Job>) -> usize {
        let mut ready_count = 0;
        let mut waits_for: Vec<GroupKey> = Vec::new();
        for (group, inodes) in job.group_inodes.iter().enumerate() {
            let key = GroupKey { job: job.id, group: group as u32 };
            waits_for.clear();
            for inode_number in inodes {
                if let Some(earlier) = self.latest.insert(*inode_number, key) {
                    assert_ne!(earlier.job, job.id, "the groups of one job name no common inode");
                    if !waits_for.contains(&earlier) {
                        waits_for.push(earlier);
                    }
                }
            }
            if waits_for.is_empty() {
                self.ready.push_back(Ready { job: job.clone(), group });
                ready_count += 1;
                continue;
            }
            for earlier in &waits_for {
                self.dependents.entry(*earlier).or_default().push(key);
            }
            self.waiting.insert(key, (job.clone(), waits_for.len()));
        }
        ready_count
    }

    /// Marks a ready group running, checking the order that the waits exist for.
    fn start(&mut self, ready: &Ready) {
        let job_id = ready.job.id;
        for inode_number in &ready.job.group_inodes[ready.group] {
            assert!(self.running.insert(*inode_number), "two running groups name inode {inode_number}");
            let before = self.started_by.insert(*inode_number, job_id);
            assert!(
                before.is_none_or(|earlier| earlier < job_id),
                "inode {inode_number}: a group of job {job_id} started after one of job {before:?}"
            );
        }
    }

    /// Forgets a finished group and readies the groups that waited only for it, at the front
    /// of the queue (the worker that finished it takes the first: a directory's next group
    /// finds its blocks in that worker's caches). Returns how many became ready.
    fn finish(&mut self, job: &Job, group: usize) -> usize {
        let key = GroupKey { job: job.id, group: group as u32 };
        for inode_number in &job.group_inodes[group] {
            assert!(self.running.remove(inode_number), "a finished group's inode {inode_number} was not running");
            if self.latest.get(inode_number) == Some(&key) {
                self.latest.remove(inode_number);
            }
        }
        let Some(dependents) = self.dependents.remove(&key) else {
            return 0;
        };
        let mut ready_count = 0;
        for dependent in dependents.into_iter().rev() {
            let (_, left) = self.waiting.get_mut(&dependent).expect("a dependent group is waiting");
            assert!(*left > 0);
            *left -= 1;
            if *left == 0 {
                let (job, _) = self.waiting.remove(&dependent).expect("a dependent group is waiting");
                self.ready.push_front(Ready { job, group: dependent.group as usize });
                ready_count += 1;
            }
        }
        ready_count
    }
}

struct PoolShared {
    scheduler: Mutex<Scheduler>,
    wake: Condvar,
    /// Set by the first group that fails: every group after it is passed over (the back end
    /// latches failed when it collects the error).
    failed: AtomicBool,
}

/// Threads that apply the groups of the batches the dispatcher submits.
pub struct ApplyPool {
    shared: Arc<PoolShared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    workers: usize,
}

impl ApplyPool {
    /// A pool of `workers` apply threads (the dispatcher only dispatches).
    pub fn start(workers: usize) -> Result<ApplyPool> {
        assert!((1..=WORKERS_MAX).contains(&workers), "{workers} apply workers");
        let shared = Arc::new(PoolShared {
            scheduler: Mutex::new(Scheduler::default()),
            wake: Condvar::new(),
            failed: AtomicBool::new(false),
        });
        let mut threads = Vec::with_capacity(workers);
        for index in 1..=workers {
            let shared = shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tandem-apply-{index}"))
                .spawn(move || worker_loop(&shared))
                .map_err(|error| Error::Io { operation: "start apply worker", offset: 0, source: error })?;
            threads.push(thread);
        }
        Ok(ApplyPool { shared, threads: Mutex::new(threads), workers })
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The id for the next job: jobs are numbered in the order they are submitted.
    pub fn next_job_id(&self) -> u64 {
        let mut scheduler = self.shared.scheduler.lock();
        scheduler.next_job_id += 1;
        scheduler.next_job_id
    }

    /// Hands `job` to the workers and returns at once; [`Job::wait`] collects it. Jobs must be
    /// submitted in lsn order (each batch after the one before).
    pub fn submit(&self, job: &Arc<Job>) {
        let ready_count = {
            let mut scheduler = self.shared.scheduler.lock();
            assert!(!scheduler.stop, "a job after the pool stopped");
            scheduler.submit(job)
        };
        for _ in 0..ready_count {
            self.shared.wake.notify_one();
        }
    }

    /// Stops the threads once every group handed to them has run, and waits for them;
    /// idempotent.
    pub fn stop(&self) {
        self.shared.scheduler.lock().stop = true;
        self.shared.wake.notify_all();
        for thread in self.threads.lock().drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for ApplyPool {
    fn drop(&mut self) {
        self.stop();
    }
}

fn worker_loop(shared: &PoolShared) {
    loop {
        let ready = {
            let mut scheduler = shared.scheduler.lock();
            loop {
                if let Some(ready) = scheduler.ready.pop_front() {
                    scheduler.start(&ready);
                    break ready;
                }
                // Groups still waiting become ready when the ones they wait for finish, in a
                // worker that is running: an empty queue with the stop flag set is the end.
                if scheduler.stop && scheduler.waiting.is_empty() {
                    return;
                }
                shared.wake.wait_for(&mut scheduler, IDLE_WAIT);
            }
        };
        ready.job.run_group(ready.group, &shared.failed);
        // The groups waiting for this one may start; this worker takes the first itself.
        let ready_count = shared.scheduler.lock().finish(&ready.job, ready.group);
        for _ in 1..ready_count {
            shared.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::record::{AttributeImage, RenameKind};
    use rand::{Rng, SeedableRng};

    fn image(inode_number: u64) -> AttributeImage {
        AttributeImage::from_inode(&crate::block::inode::Inode::empty_directory(inode_number, 1, 0o755, 1, 0))
    }

    fn queued(lsn: u64, op: Op) -> Queued {
        Queued { lsn, op: Arc::new(op), reserved_blocks: 0, image_blocks: 0 }
    }

    fn create(lsn: u64, parent: u64, inode: u64) -> Queued {
        queued(
            lsn,
            Op::Create { parent: image(parent), name: b"n".to_vec(), inode: image(inode), symlink_target: vec![] },
        )
    }

    fn rename(lsn: u64, parent: u64, new_parent: u64, moved: u64) -> Queued {
        queued(
            lsn,
            Op::Rename {
                parent,
                name: b"a".to_vec(),
                new_parent,
                new_name: b"b".to_vec(),
                kind: RenameKind::Move,
                replaced: None,
                images: vec![image(moved)],
            },
        )
    }

    /// A create, a rename or an attribute change over inodes `1..inodes`, at random.
    fn random_record(random: &mut rand::rngs::SmallRng, lsn: u64, inodes: u64) -> Queued {
        match random.gen_range(0..3) {
            0 => create(lsn, random.gen_range(1..inodes), random.gen_range(1..inodes)),
            1 => rename(lsn, random.gen_range(1..inodes), random.gen_range(1..inodes), random.gen_range(1..inodes)),
            _ => queued(lsn, Op::SetAttributes { inode: image(random.gen_range(1..inodes)), truncate: false }),
        }
    }

    /// A job for `batch` on a throwaway volume: the scheduler looks only at its groups.
    fn job_for(
        id: u64,
        batch: &[Queued],
        context: &(Arc<Mutex<Volume>>, Arc<Memo>, Applier, Arc<Pledges>),
    ) -> Arc<Job> {
        let (volume, memo, applier, pledges) = context;
        let context = JobContext { volume, memo, applier, pledges };
        Arc::new(Job::new(id, context, batch, group_by_inode(batch)))
    }

    /// The scheduler against a model: random batches (creates, renames and attribute changes
    /// over a few inodes) submitted while groups start and finish in random order, as workers
    /// would. Every group runs exactly once; no two running groups name one inode (checked by
    /// `Scheduler::start`); the groups naming an inode start in lsn order (checked there too,
    /// and here by the records' lsns); and a group waits only while an earlier group naming
    /// one of its inodes has not finished.
    #[test]
    fn groups_naming_an_inode_run_one_at_a_time_in_lsn_order() {
        let device: Arc<dyn crate::device::Device> = Arc::new(crate::device::MemoryDevice::new(16 << 20));
        crate::fs::FileSystem::format(device.clone(), &crate::fs::types::FormatOptions::default()).unwrap();
        let options = crate::log::LogOptions { flush_delay_us: u64::MAX, reserve_fraction: 0.5 };
        let (volume, _log, applier, _) = crate::backend::open_volume(device, options, 64, true).unwrap();
        let context = (Arc::new(Mutex::new(volume)), Arc::new(Memo::default()), applier, Arc::new(Pledges::default()));
        for seed in 0..40u64 {
            let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
            let mut scheduler = Scheduler::default();
            let mut running: Vec<Ready> = Vec::new();
            let mut started_groups = 0usize;
            let mut submitted_groups = 0usize;
            let mut last_lsn_of: FastHashMap<u64, u64> = FastHashMap::default();
            let mut lsn = 0u64;
            let inodes = random.gen_range(2..12u64);
            // Bounded: each step submits, starts or finishes; jobs stop after 60.
            for step in 0..10_000 {
                let submit = step < 60 * 3 && random.gen_range(0..3) == 0;
                if submit {
                    let count = random.gen_range(1..12u64);
                    let batch: Vec<Queued> = (0..count)
                        .map(|_| {
                            lsn += 1;
                            random_record(&mut random, lsn, inodes)
                        })
                        .collect();
                    scheduler.next_job_id += 1;
                    let job = job_for(scheduler.next_job_id, &batch, &context);
                    submitted_groups += job.group_count();
                    scheduler.submit(&job);
                } else if !scheduler.ready.is_empty() && (running.is_empty() || random.gen_bool(0.5)) {
                    let ready = scheduler.ready.pop_front().unwrap();
                    scheduler.start(&ready);
                    // The records of the group, in lsn order, come after every record naming
                    // the same inodes that started before.
                    let mut named = Vec::new();
                    for &place in &ready.job.groups[ready.group] {
                        let (record_lsn, op) = &ready.job.records[place as usize];
                        inodes_named(op, &mut named);
                        for inode_number in &named {
                            let before = last_lsn_of.insert(*inode_number, *record_lsn);
                            // (A record may name one inode twice: a rename within one directory.)
                            assert!(
                                before.is_none_or(|earlier| earlier <= *record_lsn),
                                "inode {inode_number}: record {record_lsn} after {before:?}"
                            );
                        }
                    }
                    started_groups += 1;
                    running.push(ready);
                } else if !running.is_empty() {
                    let finished = running.swap_remove(random.gen_range(0..running.len()));
                    scheduler.finish(&finished.job, finished.group);
                } else if step >= 60 * 3 {
                    break;
                }
            }
            assert!(running.is_empty() && scheduler.ready.is_empty(), "seed {seed}: work left over");
            assert!(scheduler.waiting.is_empty() && scheduler.dependents.is_empty(), "seed {seed}: a group never ran");
            assert!(scheduler.latest.is_empty() && scheduler.running.is_empty(), "seed {seed}: state left behind");
            assert_eq!(started_groups, submitted_groups, "seed {seed}: every group runs once");
        }
    }

    #[test]
    fn records_naming_a_common_inode_share_a_group_in_lsn_order() {
        // Directories 10 and 20 are apart until a rename joins them through inode 7; 30 stays apart.
        let batch = vec![create(1, 10, 5), create(2, 20, 6), create(3, 30, 8), rename(4, 10, 20, 5), create(5, 20, 9)];
        let groups = group_by_inode(&batch);
        assert_eq!(groups, vec![vec![0, 1, 3, 4], vec![2]]);
    }

    /// Random batches: every record is in exactly one group, each group is in lsn order, and no
    /// inode is named by two groups (the property the parallel apply rests on).
    #[test]
    fn random_batches_split_into_disjoint_groups() {
        let mut random = rand::rngs::SmallRng::seed_from_u64(7);
        for _ in 0..200 {
            let count = random.gen_range(1..200u64);
            let inodes = random.gen_range(2..60u64);
            let batch: Vec<Queued> = (1..=count).map(|lsn| random_record(&mut random, lsn, inodes)).collect();
            let groups = group_by_inode(&batch);
            let mut seen = vec![false; batch.len()];
            let mut owner: FastHashMap<u64, usize> = FastHashMap::default();
            let mut named = Vec::new();
            for (group_index, group) in groups.iter().enumerate() {
                assert!(group.windows(2).all(|pair| pair[0] < pair[1]), "lsn order inside a group");
                for &place in group {
                    assert!(!std::mem::replace(&mut seen[place as usize], true), "a record in two groups");
                    inodes_named(&batch[place as usize].op, &mut named);
                    for inode in &named {
                        assert_eq!(
                            *owner.entry(*inode).or_insert(group_index),
                            group_index,
                            "inode {inode} in two groups"
                        );
                    }
                }
            }
            assert!(seen.iter().all(|&taken| taken));
            assert!(groups.windows(2).all(|pair| pair[0].len() >= pair[1].len()), "largest first");
        }
    }

    #[test]
    fn orphan_list_and_xattr_records_hold_the_volume() {
        let unlink = |disposition| Op::Unlink { parent: image(1), name: b"x".to_vec(), inode: image(2), disposition };
        assert!(!needs_whole_volume(&unlink(Disposition::Keep)));
        assert!(!needs_whole_volume(&unlink(Disposition::Reclaim)));
        assert!(needs_whole_volume(&unlink(Disposition::Orphan)));
        assert!(needs_whole_volume(&Op::Reclaim { inode_number: 2 }));
        assert!(needs_whole_volume(&Op::RemoveXattr { inode: image(2), name: b"user.a".to_vec() }));
    }
}
