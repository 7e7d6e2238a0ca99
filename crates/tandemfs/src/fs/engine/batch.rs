//! The batch API: many lookups, path resolutions, stats, creates or `mkdir -p`s in one call,
//! answered per request and in request order, never one error for the whole batch.
//!
//! The CPU twin answers every request with the single call (`lookup`, `resolve_path`,
//! `get_attributes`, `create`, `make_directory_all`) on all cores: workers take blocks of the
//! batch in turn, so the answers are exactly those of the single calls, made concurrently. A
//! `BatchIndex` (the seam for the GPU directory index of issue 9) may answer lookups, resolves
//! and stats of batches at least its `min_batch` long; what it leaves, the CPU twin answers.
//! A batch of creates is made in groups, each logged as one `CreateBatch` record
//! (`create_batch.rs`); the index may decide which names of a group are free (a tentative
//! claim, settled once the record is in the log: `BatchIndex::claim_creates`), and the CPU
//! stays the authority for durability.
//! See docs/BATCH.md.

use super::*;
use std::hash::BuildHasher;

/// Requests one worker takes at a time: many, so that taking a block costs nothing beside
/// answering it; few, so that the last blocks still spread over all workers.
const BLOCK_REQUESTS: usize = 256;
/// Workers of one batch at most, whatever the machine reports.
const WORKERS_MAX: usize = 256;
/// Buckets of a create batch per worker: requests on the same name share a bucket (so they run
/// in request order); several buckets per worker even out the load.
const BUCKETS_PER_WORKER: usize = 8;

/// Batches at least this long are made as `Op::CreateBatch` records (a group of creates per
/// record, `create_batch`); shorter ones as single creates on all cores.
pub const CREATE_BATCH_RECORDS_FROM: usize = 2;

/// One request of `FileSystem::create_batch`: the arguments of `FileSystem::create`.
#[derive(Debug, Clone, Copy)]
pub struct CreateRequest<'a> {
    pub parent: InodeNumber,
    pub name: &'a [u8],
    pub file_type: FileType,
    pub permissions: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
}

/// One create of a group as the index sees it: the new entry and the inode it is for.
#[derive(Debug, Clone, Copy)]
pub struct IndexCreate<'a> {
    pub parent: InodeNumber,
    pub name: &'a [u8],
    pub inode: InodeNumber,
    pub file_type: FileType,
}

/// What the index says of one create's name (`BatchIndex::claim_creates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAnswer {
    /// The name is taken, by this inode (an entry, or an earlier request's claim).
    Taken(InodeNumber),
    /// The name was free and is claimed for the request's inode now: invisible to every query
    /// until it is settled.
    Claimed,
    /// The index cannot tell: the caller decides (its own lookup).
    Unknown,
}

/// One answer of a batch: `None` until someone answered it.
pub type BatchAnswer = Option<Result<Attributes>>;

/// A directory index that answers lookups, path resolutions and stats of whole batches beside
/// the CPU engine: the seam where `tandem_accel::dirindex::DirectoryIndex` (GPU or its CPU twin)
/// plugs in. Installed with `FileSystem::set_batch_index`.
///
/// The contract, which the batch API cannot check and the index must keep:
/// - every answer it gives is one the single call could have given at some moment between the
///   start and the end of the batch call: it reflects every change acknowledged to any caller
///   before the batch call began (whoever feeds it hands it each change before a later batch
///   can ask, or the index answers only what it knows to be current);
/// - where it cannot promise that (a directory it has not learnt, a symbolic link in a path, an
///   index that failed), it leaves the answer `None` and the CPU twin answers;
/// - path resolution follows the single call's rules: no permission checks (`resolve_path`
///   checks none; the FUSE kernel checks search permission itself), symbolic links followed in
///   every component but the last, `..` of the root is the root;
/// - an `Err` from a call means the index answered nothing: all its answers are dropped.
pub trait BatchIndex: Send + Sync {
    /// The smallest batch it serves: below this, the CPU twin is faster (calibrated).
    fn min_batch(&self) -> usize;
    /// Fills `answers[i]` for `requests[i]` = (parent, name) where it can.
    fn lookup(&self, requests: &[(InodeNumber, &[u8])], answers: &mut [BatchAnswer]) -> Result<()>;
    /// Fills `answers[i]` for `paths[i]` where it can.
    fn resolve(&self, paths: &[&[u8]], answers: &mut [BatchAnswer]) -> Result<()>;
    /// Fills `answers[i]` for `inodes[i]` where it can.
    fn stat(&self, inodes: &[InodeNumber], answers: &mut [BatchAnswer]) -> Result<()>;

    /// Tentative creates of one group (docs/BATCH.md, "Creates through the index"): for each
    /// request in order whether its name is taken, claiming the free ones for the request's
    /// inode. The caller holds the name shards of every parent from this call to
    /// `settle_creates`, so nothing else changes those names meanwhile. `Ok(None)`: the index
    /// takes no part (not caught up with every change acknowledged before, or it cannot
    /// claim) and nothing was claimed. The default takes no part.
    fn claim_creates(&self, requests: &[IndexCreate<'_>]) -> Result<Option<Vec<ClaimAnswer>>> {
        let _ = requests;
        Ok(None)
    }

    /// Whether `claim_creates` would take part now (a hint, so that a group takes inode
    /// numbers for the claims only then: the answer may change before the claim).
    fn may_claim(&self) -> bool {
        false
    }

    /// Ends the claims of `requests` (those answered `Claimed`): `made[i]` `Some` commits the
    /// create with the attributes it was made with (its record is in the log), `None` aborts
    /// it. `record`: the lsn of the group's record when every create in it was claimed and is
    /// committed here, so that the index holds every name change of that record (it may then
    /// decide later groups before the feed applied it). An `Err` means the claims may be left
    /// pending: the index must then answer nothing any more (the adapter fails its feed).
    fn settle_creates(
        &self,
        requests: &[IndexCreate<'_>],
        made: &[Option<Attributes>],
        record: Option<u64>,
    ) -> Result<()> {
        let _ = (requests, made, record);
        Ok(())
    }
}

/// Statistics of the batch API since the mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStatistics {
    /// Batches (of every kind) served.
    pub batches: u64,
    /// Requests answered by the installed `BatchIndex`.
    pub index_answers: u64,
    /// Requests answered by the CPU twin.
    pub cpu_answers: u64,
    /// Index calls that failed (their batches were answered by the CPU twin).
    pub index_failures: u64,
}

/// The batch API's state in a mount: the installed index and the counters.
#[derive(Default)]
pub(super) struct BatchState {
    pub(super) index: parking_lot::RwLock<Option<Arc<dyn BatchIndex>>>,
    /// The feed of the installed directory index (`dirindex_feed`), which the back end's
    /// `batch_applied` hands each applied batch.
    pub(super) feed: parking_lot::RwLock<Option<Arc<super::dirindex_feed::IndexFeed>>>,
    batches: AtomicU64,
    index_answers: AtomicU64,
    cpu_answers: AtomicU64,
    pub(super) index_failures: AtomicU64,
}

/// The kinds of request an index may answer, with their requests.
enum IndexRequests<'a> {
    Lookup(Vec<(InodeNumber, &'a [u8])>),
    Resolve(Vec<&'a [u8]>),
    Stat(&'a [InodeNumber]),
}

impl FileSystem {
    /// `lookup(parent, name)` for every request, answers in request order.
    pub fn lookup_batch<N: AsRef<[u8]> + Sync>(&self, requests: &[(InodeNumber, N)]) -> Vec<Result<Attributes>> {
        self.serve(
            requests,
            || IndexRequests::Lookup(requests.iter().map(|(parent, name)| (*parent, name.as_ref())).collect()),
            |(parent, name)| self.lookup(*parent, name.as_ref()),
        )
    }

    /// `resolve_path(path)` for every path, answers in request order.
    pub fn resolve_paths<P: AsRef<[u8]> + Sync>(&self, paths: &[P]) -> Vec<Result<Attributes>> {
        self.serve(
            paths,
            || IndexRequests::Resolve(paths.iter().map(|path| path.as_ref()).collect()),
            |path| self.resolve_path(path.as_ref()),
        )
    }

    /// `get_attributes(inode)` for every inode, answers in request order.
    pub fn stat_batch(&self, inodes: &[InodeNumber]) -> Vec<Result<Attributes>> {
        self.serve(inodes, || IndexRequests::Stat(inodes), |inode| self.get_attributes(*inode))
    }

    /// `create(...)` for every request, answers in request order. Requests in the same
    /// directory run in request order (the first of a name gets the file, the others `Exists`,
    /// as one by one); requests in different directories run concurrently. From
    /// `CREATE_BATCH_RECORDS_FROM` requests on, a group of up to 512 creates is one logged
    /// `CreateBatch` record; a shorter batch runs the single `create`.
    pub fn create_batch(&self, requests: &[CreateRequest<'_>]) -> Vec<Result<Attributes>> {
        if requests.len() >= CREATE_BATCH_RECORDS_FROM {
            let answers = self.create_batch_logged(requests);
            self.count_batch(0, answers.len());
            return answers;
        }
        let answers = map_keyed(
            requests,
            |request| rustc_hash::FxBuildHasher.hash_one((request.parent, request.name)),
            |request| {
                self.create(
                    request.parent,
                    request.name,
                    request.file_type,
                    request.permissions,
                    request.uid,
                    request.gid,
                    request.rdev,
                )
            },
        );
        self.count_batch(0, answers.len());
        answers
    }

    /// `make_directory_all(path, ...)` for every path, answers in request order. Paths may share
    /// components: each is made once (`make_directory_all` takes a directory another caller made
    /// first), so the tree equals the one the calls one by one would leave, in any order.
    pub fn make_directory_all_batch<P: AsRef<[u8]> + Sync>(
        &self,
        paths: &[P],
        permissions: u32,
        uid: u32,
        gid: u32,
    ) -> Vec<Result<Attributes>> {
        let paths: Vec<&[u8]> = paths.iter().map(|path| path.as_ref()).collect();
        let answers = self.make_directory_all_logged(&paths, permissions, uid, gid);
        self.count_batch(0, answers.len());
        answers
    }

    /// Installs (or with `None` removes) the index that answers lookups, resolves and stats of
    /// batches at least its `min_batch` long. The caller keeps it current: see `BatchIndex`.
    /// `unmount` removes it. A directory index installed with `install_directory_index` stops
    /// being fed.
    pub fn set_batch_index(&self, index: Option<Arc<dyn BatchIndex>>) {
        *self.inner.batch.index.write() = index;
        self.detach_index_feed();
    }

    /// The installed batch index, if any.
    pub fn batch_index(&self) -> Option<Arc<dyn BatchIndex>> {
        self.inner.batch.index.read().clone()
    }

    pub fn batch_statistics(&self) -> BatchStatistics {
        let batch = &self.inner.batch;
        BatchStatistics {
            batches: batch.batches.load(Ordering::Relaxed),
            index_answers: batch.index_answers.load(Ordering::Relaxed),
            cpu_answers: batch.cpu_answers.load(Ordering::Relaxed),
            index_failures: batch.index_failures.load(Ordering::Relaxed),
        }
    }

    fn count_batch(&self, index_answers: usize, cpu_answers: usize) {
        let batch = &self.inner.batch;
        batch.batches.fetch_add(1, Ordering::Relaxed);
        batch.index_answers.fetch_add(index_answers as u64, Ordering::Relaxed);
        batch.cpu_answers.fetch_add(cpu_answers as u64, Ordering::Relaxed);
    }

    /// Answers a read-only batch: the installed index first where the batch is long enough for
    /// it, then the CPU twin (`single` on all cores) for every request the index left.
    fn serve<'a, T: Sync>(
        &self,
        requests: &'a [T],
        index_requests: impl FnOnce() -> IndexRequests<'a>,
        single: impl Fn(&T) -> Result<Attributes> + Sync,
    ) -> Vec<Result<Attributes>> {
        let index = self.batch_index().filter(|index| requests.len() >= index.min_batch().max(1));
        let Some(index) = index else {
            let answers = map_parallel(requests, single);
            self.count_batch(0, answers.len());
            return answers;
        };
        let mut answers: Vec<BatchAnswer> = (0..requests.len()).map(|_| None).collect();
        let asked = match index_requests() {
            IndexRequests::Lookup(lookups) => index.lookup(&lookups, &mut answers),
            IndexRequests::Resolve(paths) => index.resolve(&paths, &mut answers),
            IndexRequests::Stat(inodes) => index.stat(inodes, &mut answers),
        };
        if asked.is_err() {
            // What a failing index wrote is not to be trusted; the CPU twin answers it all.
            self.inner.batch.index_failures.fetch_add(1, Ordering::Relaxed);
            answers.iter_mut().for_each(|answer| *answer = None);
        }
        let left: Vec<usize> = (0..requests.len()).filter(|position| answers[*position].is_none()).collect();
        let cpu = map_parallel(&left, |position| single(&requests[*position]));
        self.count_batch(requests.len() - left.len(), left.len());
        for (position, answer) in left.into_iter().zip(cpu) {
            answers[position] = Some(answer);
        }
        answers.into_iter().map(|answer| answer.expect("answered by the index or the CPU twin")).collect()
    }
}

/// Workers for a batch of `requests`: every core, but no more than there are blocks.
fn worker_count(requests: usize) -> usize {
    let cores = crate::sync::cores();
    cores.min(requests.div_ceil(BLOCK_REQUESTS)).clamp(1, WORKERS_MAX)
}

/// `answer` of every item, in item order, on all cores: workers take blocks of
/// `BLOCK_REQUESTS` items in turn and write the answers in place.
pub(super) fn map_parallel<T: Sync, R: Send>(items: &[T], answer: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = worker_count(items.len());
    if workers <= 1 {
        return items.iter().map(answer).collect();
    }
    let mut answers: Vec<R> = Vec::with_capacity(items.len());
    {
        let slots = &mut answers.spare_capacity_mut()[..items.len()];
        let blocks = Mutex::new(items.chunks(BLOCK_REQUESTS).zip(slots.chunks_mut(BLOCK_REQUESTS)));
        let (blocks, answer) = (&blocks, &answer);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                // Bounded: each turn takes one of the finitely many blocks, or ends.
                scope.spawn(move || loop {
                    let Some((block_items, block_slots)) = blocks.lock().next() else { break };
                    for (item, slot) in block_items.iter().zip(block_slots.iter_mut()) {
                        slot.write(answer(item));
                    }
                });
            }
        });
    }
    // SAFETY: the blocks cover the first `items.len()` slots; every block was taken by exactly
    // one worker, which wrote all its slots; the scope joined every worker, and one that
    // panicked made `scope` panic before this line (the written answers then leak, safely).
    unsafe { answers.set_len(items.len()) };
    answers
}

/// `answer` of every item, in item order, on all cores, where items with the same `key` are
/// answered one after the other in item order (by the same worker).
fn map_keyed<T: Sync, R: Send>(items: &[T], key: impl Fn(&T) -> u64, answer: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = worker_count(items.len());
    if workers <= 1 {
        return items.iter().map(answer).collect();
    }
    let keyed = items.iter().enumerate().map(|(position, item)| (position, key(item)));
    let answers = map_buckets(items.len(), keyed, workers, |bucket, answered| {
        answered.extend(bucket.iter().map(|position| (*position, answer(&items[*position]))));
    });
    answers.into_iter().map(|answer| answer.expect("every request is in one bucket")).collect()
}

/// Deals the `(position, key)` pairs into buckets by key (equal keys share a bucket, in the
/// order given) and runs `answer_bucket` on every bucket on `workers` threads, each taking the
/// next bucket when it is done with one; `answer_bucket` adds `(position, answer)` pairs.
/// Returns `count` slots, `None` where no answer was given.
pub(super) fn map_buckets<R: Send>(
    count: usize,
    keyed: impl Iterator<Item = (usize, u64)>,
    workers: usize,
    answer_bucket: impl Fn(&[usize], &mut Vec<(usize, R)>) + Sync,
) -> Vec<Option<R>> {
    assert!(workers >= 1);
    let bucket_count = workers * BUCKETS_PER_WORKER;
    let mut buckets: Vec<Vec<usize>> = vec![Vec::new(); bucket_count];
    for (position, key) in keyed {
        assert!(position < count);
        buckets[(key % bucket_count as u64) as usize].push(position);
    }
    let next_bucket = AtomicU64::new(0);
    let (buckets, answer_bucket, next_bucket) = (&buckets, &answer_bucket, &next_bucket);
    let answered: Vec<Vec<(usize, R)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(move || {
                    let mut answered = Vec::new();
                    // Bounded: each turn takes one of the `bucket_count` buckets, or ends.
                    loop {
                        let taken = next_bucket.fetch_add(1, Ordering::Relaxed) as usize;
                        let Some(bucket) = buckets.get(taken) else { break };
                        answer_bucket(bucket, &mut answered);
                    }
                    answered
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    });
    let mut answers: Vec<Option<R>> = (0..count).map(|_| None).collect();
    for (position, result) in answered.into_iter().flatten() {
        debug_assert!(answers[position].is_none(), "request {position} answered twice");
        answers[position] = Some(result);
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_parallel_keeps_order_for_every_length() {
        for length in [0, 1, BLOCK_REQUESTS - 1, BLOCK_REQUESTS, BLOCK_REQUESTS + 1, 10 * BLOCK_REQUESTS + 7] {
            let items: Vec<u64> = (0..length as u64).collect();
            let answers = map_parallel(&items, |item| item * 3 + 1);
            assert_eq!(answers, items.iter().map(|item| item * 3 + 1).collect::<Vec<_>>(), "length {length}");
        }
    }

    #[test]
    fn map_keyed_runs_equal_keys_in_order() {
        let items: Vec<(u64, u64)> = (0..20_000u64).map(|position| (position % 37, position)).collect();
        let seen: Vec<Mutex<Vec<u64>>> = (0..37).map(|_| Mutex::new(Vec::new())).collect();
        let answers = map_keyed(
            &items,
            |(key, _)| *key,
            |(key, position)| {
                seen[*key as usize].lock().push(*position);
                *position
            },
        );
        assert_eq!(answers, (0..20_000u64).collect::<Vec<_>>());
        for (key, order) in seen.iter().enumerate() {
            let order = order.lock();
            assert!(order.windows(2).all(|pair| pair[0] < pair[1]), "key {key} out of order");
            assert_eq!(order.len(), items.iter().filter(|(item_key, _)| *item_key == key as u64).count());
        }
    }
}
