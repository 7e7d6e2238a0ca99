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
//! The batch is the unit of everything else: the applied lsn moves to its last record only when
//! every group is done, and a checkpoint is taken only between batches, so a checkpoint still
//! covers exactly a prefix of the log and a crash still leaves "checkpoint + durable records".

use super::driver::Queued;
use super::record::{Disposition, Op};
use super::room::BacklogRoom;
use super::store::{Memo, RecordStore};
use super::Applier;
use crate::block::volume::Volume;
use crate::error::{Error, Result};
use crate::FastHashMap;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// The worker count when the mount names none: one per core, within `WORKERS_MAX`.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map(|cores| cores.get()).unwrap_or(1).clamp(1, WORKERS_MAX)
}

/// Whether a record changes state beyond the inodes it names, so that its batch must apply
/// with the volume held throughout (see the module comment).
pub fn needs_whole_volume(op: &Op) -> bool {
    match op {
        Op::Unlink { disposition, .. } => *disposition == Disposition::Orphan,
        Op::Rename { replaced, .. } => matches!(replaced, Some((_, Disposition::Orphan))),
        Op::Reclaim { .. } | Op::SetXattr { .. } | Op::RemoveXattr { .. } => true,
        Op::Create { .. } | Op::Link { .. } | Op::SetAttributes { .. } | Op::Write { .. } | Op::Range { .. } => false,
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
        | Op::Range { inode, .. }
        | Op::SetXattr { inode, .. }
        | Op::RemoveXattr { inode, .. } => out.push(inode.inode_number),
        Op::Reclaim { inode_number } => out.push(*inode_number),
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
pub struct Job {
    volume: Arc<Mutex<Volume>>,
    memo: Arc<Memo>,
    applier: Applier,
    records: Vec<(u64, Arc<Op>)>,
    groups: Vec<Vec<u32>>,
    /// Per group, the image-budget bounds of its records: released to `room` as soon as the
    /// group is committed, so that appenders need not wait for the batch's last group.
    group_image_blocks: Vec<u64>,
    room: Arc<BacklogRoom>,
    next_group: AtomicUsize,
    /// Set on the first failure: groups not yet started are passed over.
    stop: AtomicBool,
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

impl Job {
    pub fn new(
        volume: Arc<Mutex<Volume>>,
        memo: Arc<Memo>,
        applier: Applier,
        room: Arc<BacklogRoom>,
        batch: &[Queued],
        groups: Vec<Vec<u32>>,
    ) -> Job {
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), batch.len(), "every record is in one group");
        let group_image_blocks =
            groups.iter().map(|group| group.iter().map(|&place| batch[place as usize].image_blocks).sum()).collect();
        Job {
            group_image_blocks,
            room,
            volume,
            memo,
            applier,
            records: batch.iter().map(|queued| (queued.lsn, queued.op.clone())).collect(),
            groups,
            next_group: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            outcome: Mutex::new(Outcome::default()),
            finished: Condvar::new(),
        }
    }

    /// Takes groups and applies them until none is left. Run by every worker and by the
    /// dispatcher itself.
    fn work(&self) {
        loop {
            let group = self.next_group.fetch_add(1, Ordering::AcqRel);
            if group >= self.groups.len() {
                return;
            }
            let started = Instant::now();
            let result = if self.stop.load(Ordering::Acquire) {
                Ok((Vec::new(), (0, 0, 0)))
            } else {
                let apply = std::panic::AssertUnwindSafe(|| self.apply_group(&self.groups[group]));
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
                    // Applied and committed: its records no longer count against the backlog.
                    // (A group passed over after a failure releases nothing; the volume is
                    // latched failed then.)
                    if !self.stop.load(Ordering::Acquire) {
                        self.room.release(self.group_image_blocks[group]);
                    }
                    outcome.owned_blocks.extend(owned);
                    outcome.lock_wait_ns += lock_wait_ns;
                    outcome.lock_held_ns += lock_held_ns;
                }
                Err(error) => {
                    self.stop.store(true, Ordering::Release);
                    outcome.error.get_or_insert(error);
                }
            }
            outcome.groups_finished += 1;
            if outcome.groups_finished == self.groups.len() {
                self.finished.notify_all();
            }
        }
    }

    /// Applies one group's records in lsn order; returns the blocks owned by the inodes they
    /// wrote and the store's volume-lock wait and hold times.
    fn apply_group(&self, places: &[u32]) -> Result<GroupOutcome> {
        let mut owned = Vec::new();
        let mut store = RecordStore::new(&self.volume, &self.memo);
        store.prefetch_inodes(&self.inodes_named_by(places));
        let mut uncommitted = 0;
        for &place in places {
            if self.stop.load(Ordering::Acquire) {
                break;
            }
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

    /// The inodes the records at `places` may read from the volume, once each: every inode
    /// they name but those a create among them makes (a create writes a fresh record and
    /// reads none; prefetching the new inodes took the volume lock once per group of creates
    /// to find nothing).
    fn inodes_named_by(&self, places: &[u32]) -> Vec<u64> {
        let mut all = Vec::with_capacity(places.len() * 2);
        let mut created = Vec::new();
        let mut named = Vec::new();
        for &place in places {
            let op = &self.records[place as usize].1;
            if let Op::Create { inode, .. } = op.as_ref() {
                created.push(inode.inode_number);
            }
            inodes_named(op, &mut named);
            all.extend_from_slice(&named);
        }
        all.sort_unstable();
        all.dedup();
        created.sort_unstable();
        all.retain(|number| created.binary_search(number).is_err());
        all
    }

    /// Waits until every group is finished; returns the blocks owned by the inodes written and
    /// the time the workers were busy, or the first error. Bounded: workers that stop
    /// answering are an error, not a hang.
    fn wait(&self) -> Result<JobReport> {
        let started = Instant::now();
        let mut outcome = self.outcome.lock();
        while outcome.groups_finished < self.groups.len() {
            if started.elapsed() > BATCH_WAIT_MAX {
                self.stop.store(true, Ordering::Release);
                return Err(Error::invalid("apply workers did not finish a batch"));
            }
            self.finished.wait_for(&mut outcome, BATCH_WAIT_SLICE);
        }
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

struct Slot {
    job: Option<Arc<Job>>,
    /// Counts published jobs, so that a worker takes each job at most once.
    epoch: u64,
    stop: bool,
}

struct PoolShared {
    slot: Mutex<Slot>,
    wake: Condvar,
}

/// Threads that apply the groups of a batch beside the dispatcher.
pub struct ApplyPool {
    shared: Arc<PoolShared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    workers: usize,
}

impl ApplyPool {
    /// A pool of `workers` appliers in all: the dispatcher and `workers - 1` threads.
    pub fn start(workers: usize) -> Result<ApplyPool> {
        assert!((1..=WORKERS_MAX).contains(&workers), "{workers} apply workers");
        let shared =
            Arc::new(PoolShared { slot: Mutex::new(Slot { job: None, epoch: 0, stop: false }), wake: Condvar::new() });
        let mut threads = Vec::with_capacity(workers - 1);
        for index in 1..workers {
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

    /// Applies the job's groups on every worker and the caller; returns when all are done.
    pub fn run(&self, job: Arc<Job>) -> Result<JobReport> {
        {
            let mut slot = self.shared.slot.lock();
            assert!(!slot.stop, "a job after the pool stopped");
            slot.job = Some(job.clone());
            slot.epoch += 1;
        }
        self.shared.wake.notify_all();
        job.work();
        let result = job.wait();
        self.shared.slot.lock().job = None;
        result
    }

    /// Stops the threads and waits for them; idempotent.
    pub fn stop(&self) {
        self.shared.slot.lock().stop = true;
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
    let mut seen_epoch = 0;
    loop {
        let job = {
            let mut slot = shared.slot.lock();
            loop {
                if slot.stop {
                    return;
                }
                if slot.epoch != seen_epoch {
                    seen_epoch = slot.epoch;
                    if let Some(job) = slot.job.clone() {
                        break job;
                    }
                }
                shared.wake.wait_for(&mut slot, IDLE_WAIT);
            }
        };
        job.work();
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
            let batch: Vec<Queued> = (1..=count)
                .map(|lsn| match random.gen_range(0..3) {
                    0 => create(lsn, random.gen_range(1..inodes), random.gen_range(1..inodes)),
                    1 => rename(
                        lsn,
                        random.gen_range(1..inodes),
                        random.gen_range(1..inodes),
                        random.gen_range(1..inodes),
                    ),
                    _ => queued(lsn, Op::SetAttributes { inode: image(random.gen_range(1..inodes)), truncate: false }),
                })
                .collect();
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
