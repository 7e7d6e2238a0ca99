//! What applying a record needs from the volume ([`ApplyStore`]), and the two ways to give it:
//! the volume itself, for one applier holding the volume lock across a batch, and
//! [`RecordStore`], for one of several apply workers that share the volume.
//!
//! A `RecordStore` takes the volume lock only for a moment per block or inode, so workers on
//! disjoint inodes run side by side. Readers of the volume (the front end's lookups, other
//! workers) must still never see half of a record: a directory whose leaf split is half
//! written, an index that points at a block already freed. So everything a record changes that
//! others can reach — metadata blocks, inode records, frees — is kept in the store and goes to
//! the volume in one step under one lock hold at [`RecordStore::commit`]. What others cannot
//! reach before then goes at once: allocations (a new block is reachable only through the
//! changes held back) and file data (the front end serves unapplied writes from its own state).
//!
//! The stores share a [`Memo`] of the blocks and inodes they read or committed, so that the
//! volume lock stays out of the inner loop of a directory walk. It is right because only
//! records change the blocks and inodes of a file (the front end only reads the volume), and a
//! record that changes them is applied by a store, which updates the memo at its commit, and
//! only one store at a time applies records that name a given inode. Whatever changes the
//! volume another way (a batch applied with the volume held) clears the memo first. A
//! checkpoint does not need to: it seals dirty blocks copy-on-write (`BlockCache::seal_dirty`
//! takes `Arc::make_mut`, so a block the memo shares is copied, not changed) and writes only
//! the trailer, which no structure reads; and the frees it makes reusable are of blocks whose
//! records already forgot them at their commit.

use crate::block::inode::Inode;
use crate::block::meta::{BlockKind, DataStore, Decoded, MetaStore, SharedBlock};
use crate::block::volume::Volume;
use crate::error::{Error, Result};
use crate::extent;
use crate::{FastHashMap, FastHashSet};
use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Extended attributes of one inode, by name.
pub type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// The volume as the record appliers see it: blocks for the directory and extent trees, inode
/// records, extended attributes and the few superblock fields a record changes.
pub trait ApplyStore: extent::Store {
    /// The record being applied: frees are tagged with it.
    fn begin_record(&mut self, lsn: u64);
    fn read_inode(&mut self, inode_number: u64) -> Result<Inode>;
    fn write_inode(&mut self, inode: &Inode) -> Result<()>;
    fn create_inode(&mut self, inode: &Inode) -> Result<()>;
    fn delete_inode(&mut self, inode_number: u64) -> Result<()>;
    fn read_xattrs(&mut self, block_number: u64) -> Result<Xattrs>;
    fn write_xattrs(&mut self, inode: &mut Inode, attributes: &Xattrs) -> Result<()>;
    /// Raises the superblock's next inode generation to at least `generation`.
    fn raise_next_generation(&mut self, generation: u64);
    fn orphan_head(&mut self) -> u64;
    fn set_orphan_head(&mut self, inode_number: u64);
    fn inode_count(&mut self) -> u64;
    /// Takes blocks claimed for a direct write, with their checksum entries
    /// (`Volume::take_claimed_data`).
    fn take_claimed_data(&mut self, first: u64, count: u64, entries: &[u32]) -> Result<()>;
}

impl ApplyStore for Volume {
    fn begin_record(&mut self, lsn: u64) {
        self.current_lsn = lsn;
    }
    fn take_claimed_data(&mut self, first: u64, count: u64, entries: &[u32]) -> Result<()> {
        Volume::take_claimed_data(self, first, count, entries)
    }
    fn read_inode(&mut self, inode_number: u64) -> Result<Inode> {
        Volume::read_inode(self, inode_number)
    }
    fn write_inode(&mut self, inode: &Inode) -> Result<()> {
        Volume::write_inode(self, inode)
    }
    fn create_inode(&mut self, inode: &Inode) -> Result<()> {
        Volume::create_inode(self, inode)
    }
    fn delete_inode(&mut self, inode_number: u64) -> Result<()> {
        Volume::delete_inode(self, inode_number)
    }
    fn read_xattrs(&mut self, block_number: u64) -> Result<Xattrs> {
        Volume::read_xattrs(self, block_number)
    }
    fn write_xattrs(&mut self, inode: &mut Inode, attributes: &Xattrs) -> Result<()> {
        Volume::write_xattrs(self, inode, attributes)
    }
    fn raise_next_generation(&mut self, generation: u64) {
        self.superblock.next_generation = self.superblock.next_generation.max(generation);
    }
    fn orphan_head(&mut self) -> u64 {
        self.superblock.orphan_head
    }
    fn set_orphan_head(&mut self, inode_number: u64) {
        self.superblock.orphan_head = inode_number;
    }
    fn inode_count(&mut self) -> u64 {
        self.superblock.inode_count
    }
}

/// An inode change held until commit, in the order the record made it.
enum InodeChange {
    Create(Inode),
    Write(Inode),
    Delete(u64),
}

impl InodeChange {
    fn inode_number(&self) -> u64 {
        match self {
            InodeChange::Create(inode) | InodeChange::Write(inode) => inode.inode_number,
            InodeChange::Delete(inode_number) => *inode_number,
        }
    }
}

/// `changes` without the inode writes that a later change of the same inode supersedes; the
/// rest keep their order. A create or delete always stays (they move the inode bitmap).
fn superseded_writes_dropped(changes: Vec<InodeChange>) -> Vec<InodeChange> {
    let number_of = InodeChange::inode_number;
    let mut changed_later: crate::FastHashSet<u64> = Default::default();
    let mut kept: Vec<InodeChange> = Vec::with_capacity(changes.len());
    for change in changes.into_iter().rev() {
        let superseded = matches!(change, InodeChange::Write(_)) && changed_later.contains(&number_of(&change));
        changed_later.insert(number_of(&change));
        if !superseded {
            kept.push(change);
        }
    }
    kept.reverse();
    kept
}

/// Shards of the memo, and what each holds at most before it forgets everything it holds:
/// 16,384 blocks (64 MiB at worst, but mostly shared with the block cache) and 65,536 inodes.
const MEMO_SHARDS: usize = 64;
const MEMO_BLOCKS_PER_SHARD: usize = 256;
const MEMO_INODES_PER_SHARD: usize = 1024;
/// Decoded extent nodes kept per shard: 1,024 in all, each with its 4 KiB block and up to
/// 253 entries (about 12 MiB at worst).
const MEMO_NODES_PER_SHARD: usize = 16;
/// Unchanged blocks one store keeps from its own reads: a group of `COMMIT_RECORDS_MAX`
/// creates in one directory walks a few dozen leaves; 1,024 blocks share their buffers with the
/// memo and the block cache, so they cost a map entry each.
const SEEN_BLOCKS_MAX: usize = 1024;

/// Blocks and inodes as the apply workers last read or committed them (see the module
/// comment). Sharded by number, so that workers on different files do not meet.
pub struct Memo {
    blocks: Vec<Mutex<FastHashMap<u64, (BlockKind, SharedBlock)>>>,
    inodes: Vec<Mutex<FastHashMap<u64, Inode>>>,
    /// Decoded forms of blocks (`MetaStore::decoded`), each with the very buffer it was
    /// decoded from: held here, that buffer cannot change in place (`Arc::make_mut` copies a
    /// shared one) nor be freed and its address reused, so a match by pointer is always right.
    decoded: Vec<Mutex<FastHashMap<u64, (SharedBlock, Decoded)>>>,
}

impl Default for Memo {
    fn default() -> Memo {
        Memo {
            blocks: (0..MEMO_SHARDS).map(|_| Mutex::new(FastHashMap::default())).collect(),
            inodes: (0..MEMO_SHARDS).map(|_| Mutex::new(FastHashMap::default())).collect(),
            decoded: (0..MEMO_SHARDS).map(|_| Mutex::new(FastHashMap::default())).collect(),
        }
    }
}

impl Memo {
    fn shard_of(number: u64) -> usize {
        (number.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % MEMO_SHARDS
    }

    fn block(&self, block_number: u64, kind: BlockKind) -> Option<SharedBlock> {
        let shard = self.blocks[Self::shard_of(block_number)].lock();
        shard.get(&block_number).filter(|(known_kind, _)| *known_kind == kind).map(|(_, block)| block.clone())
    }

    fn put_block(&self, block_number: u64, kind: BlockKind, block: SharedBlock) {
        let mut shard = self.blocks[Self::shard_of(block_number)].lock();
        if shard.len() >= MEMO_BLOCKS_PER_SHARD && !shard.contains_key(&block_number) {
            shard.clear();
        }
        shard.insert(block_number, (kind, block));
    }

    fn forget_block(&self, block_number: u64) {
        self.blocks[Self::shard_of(block_number)].lock().remove(&block_number);
    }

    fn decoded(&self, block_number: u64, block: &SharedBlock) -> Option<Decoded> {
        let shard = self.decoded[Self::shard_of(block_number)].lock();
        shard.get(&block_number).filter(|(held, _)| Arc::ptr_eq(held, block)).map(|(_, decoded)| decoded.clone())
    }

    fn put_decoded(&self, block_number: u64, block: &SharedBlock, decoded: Decoded) {
        let mut shard = self.decoded[Self::shard_of(block_number)].lock();
        if shard.len() >= MEMO_NODES_PER_SHARD && !shard.contains_key(&block_number) {
            shard.clear();
        }
        shard.insert(block_number, (block.clone(), decoded));
    }

    fn inode(&self, inode_number: u64) -> Option<Inode> {
        self.inodes[Self::shard_of(inode_number)].lock().get(&inode_number).cloned()
    }

    fn put_inode(&self, inode: &Inode) {
        let mut shard = self.inodes[Self::shard_of(inode.inode_number)].lock();
        if shard.len() >= MEMO_INODES_PER_SHARD && !shard.contains_key(&inode.inode_number) {
            shard.clear();
        }
        shard.insert(inode.inode_number, inode.clone());
    }

    fn forget_inode(&self, inode_number: u64) {
        self.inodes[Self::shard_of(inode_number)].lock().remove(&inode_number);
    }

    /// Forgets everything: the volume is about to change in a way the memo does not see.
    pub fn clear(&self) {
        for shard in &self.blocks {
            shard.lock().clear();
        }
        for shard in &self.inodes {
            shard.lock().clear();
        }
        for shard in &self.decoded {
            shard.lock().clear();
        }
    }
}

/// Tries of the volume lock before a waiter parks, on a machine with `SPIN_CORES_MIN` cores or
/// more. The lock is held a few microseconds at a time, while handing it to a parked waiter
/// costs it a wake-up of tens: with 16 workers, waits for the lock summed to four to eight times
/// its holds. About as many tries as a hold lasts.
const SPIN_TRIES: u32 = 4096;
/// Fewer cores than this: park at once (a spinning waiter would take the core from the holder;
/// on the 2-core machine spinning made the workers slower).
const SPIN_CORES_MIN: usize = 8;

/// `volume.lock()`, spinning first where there are cores to spin on.
fn lock_spinning(volume: &Mutex<Volume>) -> MutexGuard<'_, Volume> {
    static SPIN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let tries = *SPIN.get_or_init(|| {
        let cores = std::thread::available_parallelism().map(|cores| cores.get()).unwrap_or(1);
        if cores >= SPIN_CORES_MIN {
            SPIN_TRIES
        } else {
            0
        }
    });
    // Bounded by `tries`. Reads the lock's state before trying, so that waiters spin on their
    // own cached copy rather than bouncing the line between cores.
    for _ in 0..tries {
        if !volume.is_locked() {
            if let Some(guard) = volume.try_lock() {
                return guard;
            }
        }
        std::hint::spin_loop();
    }
    volume.lock()
}

/// How often one user of the volume lock (a worker's store, the front end) took it, and how
/// long it waited for it and held it, in nanoseconds.
#[derive(Default)]
pub struct LockTimes {
    takes: AtomicU64,
    wait_ns: AtomicU64,
    held_ns: AtomicU64,
}

impl LockTimes {
    /// Takes `volume`'s lock, counting the take and the wait now and the hold when the guard
    /// drops.
    pub fn lock<'s>(&'s self, volume: &'s Mutex<Volume>) -> TimedVolume<'s> {
        let started = Instant::now();
        let guard = lock_spinning(volume);
        let acquired = Instant::now();
        self.takes.fetch_add(1, Ordering::Relaxed);
        self.wait_ns.fetch_add((acquired - started).as_nanos() as u64, Ordering::Relaxed);
        TimedVolume { guard, acquired, held_ns: &self.held_ns }
    }

    /// `lock`, for a reader: `Shutdown` when a change failed half way with the volume held
    /// (`Volume::check_whole`), so that no one answers from part of a record.
    pub fn lock_whole<'s>(&'s self, volume: &'s Mutex<Volume>) -> Result<TimedVolume<'s>> {
        let guard = self.lock(volume);
        guard.check_whole()?;
        Ok(guard)
    }

    /// `lock_whole` if nobody holds the lock now; `None` if somebody does.
    pub fn try_lock_whole<'s>(&'s self, volume: &'s Mutex<Volume>) -> Result<Option<TimedVolume<'s>>> {
        if volume.is_locked() {
            return Ok(None);
        }
        let Some(guard) = volume.try_lock() else {
            return Ok(None);
        };
        let acquired = Instant::now();
        self.takes.fetch_add(1, Ordering::Relaxed);
        let guard = TimedVolume { guard, acquired, held_ns: &self.held_ns };
        guard.check_whole()?;
        Ok(Some(guard))
    }

    /// (takes, wait, hold) so far.
    pub fn totals(&self) -> (u64, u64, u64) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        (load(&self.takes), load(&self.wait_ns), load(&self.held_ns))
    }
}

/// The volume lock taken through `LockTimes::lock`, timed until it drops.
pub struct TimedVolume<'s> {
    guard: MutexGuard<'s, Volume>,
    acquired: Instant,
    held_ns: &'s AtomicU64,
}

impl std::ops::Deref for TimedVolume<'_> {
    type Target = Volume;
    fn deref(&self) -> &Volume {
        &self.guard
    }
}

impl std::ops::DerefMut for TimedVolume<'_> {
    fn deref_mut(&mut self) -> &mut Volume {
        &mut self.guard
    }
}

impl Drop for TimedVolume<'_> {
    fn drop(&mut self) {
        // What this hold changed is whole now: readers of the mirror may trust it again.
        self.guard.end_change();
        self.held_ns.fetch_add(self.acquired.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// One worker's view of the shared volume while it applies the records of one group, in lsn
/// order, committing them a few at a time (see the module comment). Records that change the orphan list or extended attributes are not applied
/// through it: the dispatcher applies batches holding them with the volume lock held
/// throughout (`parallel::needs_whole_volume`), because those changes reach inodes and blocks
/// beyond the record's own.
pub struct RecordStore<'a> {
    volume: &'a Mutex<Volume>,
    memo: &'a Memo,
    /// This store's takes of the volume lock, its waits and holds: the share of applying that
    /// does not run side by side (`BackendStatistics::worker_lock_held_ns`).
    lock_times: LockTimes,
    lsn: u64,
    /// Metadata blocks written, by number: read back by this record, never yet by others.
    blocks: BTreeMap<u64, (BlockKind, SharedBlock)>,
    /// Held blocks handed to a change without a copy (`release_for_change`): each comes back
    /// by `write_meta`, or the store's work fails and is never committed.
    lent: FastHashSet<u64>,
    /// Unchanged blocks this store has read (or committed), as it read them: only this store's
    /// group changes the blocks of its inodes while it runs (the module comment), so a second
    /// read needs neither the memo's shard lock nor its map. At most `SEEN_BLOCKS_MAX`.
    seen: FastHashMap<u64, (BlockKind, SharedBlock)>,
    inodes: Vec<InodeChange>,
    /// Place in `inodes` of each inode's last change: a directory's inode is read by every
    /// record of its group, and `inodes` grows to `COMMIT_RECORDS_MAX` records' changes.
    last_change: FastHashMap<u64, usize>,
    freed_meta: Vec<u64>,
    freed_data: Vec<(u64, u64)>,
    next_generation: u64,
}

impl<'a> RecordStore<'a> {
    pub fn new(volume: &'a Mutex<Volume>, memo: &'a Memo) -> RecordStore<'a> {
        RecordStore {
            volume,
            memo,
            lock_times: LockTimes::default(),
            lsn: 0,
            blocks: BTreeMap::new(),
            lent: FastHashSet::default(),
            seen: FastHashMap::default(),
            inodes: Vec::new(),
            last_change: FastHashMap::default(),
            freed_meta: Vec::new(),
            freed_data: Vec::new(),
            next_generation: 0,
        }
    }

    /// The volume lock, timed: the wait now, the hold when the guard drops.
    fn lock_volume(&self) -> Result<TimedVolume<'_>> {
        self.lock_times.lock_whole(self.volume)
    }

    /// Reads the inodes of `inode_numbers` that the memo lacks in one hold of the volume lock,
    /// into the memo: a group's records then find them there instead of taking the lock once
    /// each (an unlink reads the inode it removes, which the memo has mostly forgotten since
    /// its create). Only a shortcut: a number that is free or fails its checks is left for the
    /// record's own read, which reports it as it always did.
    pub fn prefetch_inodes(&self, inode_numbers: &[u64]) {
        let missing: Vec<u64> =
            inode_numbers.iter().copied().filter(|number| self.memo.inode(*number).is_none()).collect();
        if missing.is_empty() {
            return;
        }
        let read: Vec<Inode> = {
            // A volume refused to readers leaves the reads to the records, which report it.
            let Ok(mut volume) = self.lock_volume() else { return };
            missing.into_iter().filter_map(|inode_number| volume.read_inode(inode_number).ok()).collect()
        };
        // The memo's shards are taken with the volume lock let go (ARCHITECTURE.md's lock order).
        for inode in &read {
            self.memo.put_inode(inode);
        }
    }

    /// How often this store took the volume lock.
    pub fn lock_count(&self) -> u64 {
        self.lock_times.totals().0
    }

    /// Nanoseconds this store waited for the volume lock and held it.
    pub fn lock_times_ns(&self) -> (u64, u64) {
        let (_, wait_ns, held_ns) = self.lock_times.totals();
        (wait_ns, held_ns)
    }

    /// Hands the changes of the records applied since the last commit to the volume in one
    /// lock hold, in the order a single applier makes them: blocks, inode records (created,
    /// written, deleted, in record order), then frees, tagged with the last record's lsn (a
    /// free becomes reusable after a checkpoint covering its record; a later tag only waits
    /// longer). A reader of the volume sees none or all of these records.
    ///
    /// Two things keep the hold short, since the workers queue on it: a write of an inode that
    /// a later change of the same commit supersedes is skipped (a directory's inode is written
    /// by every create in it, once per commit is enough), and the memo learns the changes after
    /// the lock is let go (only this store's group names these inodes and blocks, and a block
    /// freed here is not reused before a checkpoint, which waits for the batch).
    pub fn commit(&mut self) -> Result<()> {
        assert!(self.lsn != 0, "commit without a record");
        if let Some(block_number) = self.lent.iter().next() {
            // A change that failed after the store let go of its held copy: that copy is gone,
            // and committing the rest would lose it.
            return Err(Error::invalid(format!("block {block_number} lent to a change that never came back")));
        }
        let blocks = std::mem::take(&mut self.blocks);
        self.last_change.clear();
        let inodes = superseded_writes_dropped(std::mem::take(&mut self.inodes));
        let freed_meta = std::mem::take(&mut self.freed_meta);
        let freed_data = std::mem::take(&mut self.freed_data);
        let generation = std::mem::take(&mut self.next_generation);
        {
            let mut volume = self.lock_volume()?;
            volume.current_lsn = self.lsn;
            let committed = (|| -> Result<()> {
                for (block_number, (kind, block)) in &blocks {
                    volume.write_meta(*block_number, *kind, block.clone())?;
                }
                for change in &inodes {
                    match change {
                        InodeChange::Create(inode) => volume.create_inode(inode)?,
                        InodeChange::Write(inode) => volume.write_inode(inode)?,
                        InodeChange::Delete(inode_number) => volume.delete_inode(*inode_number)?,
                    }
                }
                for block_number in &freed_meta {
                    volume.free_meta(*block_number)?;
                }
                for (first, count) in &freed_data {
                    volume.free_data(*first, *count)?;
                }
                Ok(())
            })();
            // An inode-table block that fails to read leaves the records' blocks in the
            // volume without their inodes: no one may read that half (the lock is still ours).
            if let Err(error) = committed {
                volume.mark_half_changed(&error);
                return Err(error);
            }
            volume.superblock.next_generation = volume.superblock.next_generation.max(generation);
            // Before the group's bounds leave the log's pledge (see `log::pledge`).
            volume.publish_image_estimate();
        }
        for (block_number, (kind, block)) in blocks {
            self.note_seen(block_number, kind, &block);
            self.memo.put_block(block_number, kind, block);
        }
        for change in inodes {
            match change {
                InodeChange::Create(inode) | InodeChange::Write(inode) => self.memo.put_inode(&inode),
                InodeChange::Delete(inode_number) => self.memo.forget_inode(inode_number),
            }
        }
        for block_number in freed_meta {
            self.seen.remove(&block_number);
            self.memo.forget_block(block_number);
        }
        Ok(())
    }

    /// The last change of `inode_number` held back, if any.
    fn held_inode(&self, inode_number: u64) -> Option<Result<Inode>> {
        let change = &self.inodes[*self.last_change.get(&inode_number)?];
        assert_eq!(change.inode_number(), inode_number, "the map points at the inode's own change");
        match change {
            InodeChange::Create(inode) | InodeChange::Write(inode) => Some(Ok(inode.clone())),
            InodeChange::Delete(_) => Some(Err(Error::NotFound)),
        }
    }

    /// Holds `change` back until commit, in record order.
    fn hold_inode_change(&mut self, change: InodeChange) {
        self.last_change.insert(change.inode_number(), self.inodes.len());
        self.inodes.push(change);
    }

    /// Remembers an unchanged block as read (see `seen`); forgets them all past the bound.
    fn note_seen(&mut self, block_number: u64, kind: BlockKind, block: &SharedBlock) {
        if self.seen.len() >= SEEN_BLOCKS_MAX {
            self.seen.clear();
        }
        self.seen.insert(block_number, (kind, block.clone()));
    }
}

impl MetaStore for RecordStore<'_> {
    fn read_meta(&mut self, block_number: u64, kind: BlockKind) -> Result<SharedBlock> {
        if let Some((held_kind, block)) = self.blocks.get(&block_number) {
            if *held_kind != kind {
                return Err(Error::corruption(format!(
                    "block {block_number} is read as {kind:?} after this record wrote it as {held_kind:?}"
                )));
            }
            return Ok(block.clone());
        }
        if self.lent.contains(&block_number) {
            return Err(Error::invalid(format!("block {block_number} read while lent to a change")));
        }
        if let Some((seen_kind, block)) = self.seen.get(&block_number) {
            if *seen_kind == kind {
                return Ok(block.clone());
            }
        }
        assert!(!self.freed_meta.contains(&block_number), "block {block_number} read after its free");
        let block = match self.memo.block(block_number, kind) {
            Some(block) => block,
            None => {
                let block = self.lock_volume()?.read_meta(block_number, kind)?;
                self.memo.put_block(block_number, kind, block.clone());
                block
            }
        };
        self.note_seen(block_number, kind, &block);
        Ok(block)
    }

    fn write_meta(&mut self, block_number: u64, kind: BlockKind, block: SharedBlock) -> Result<()> {
        assert!(!self.freed_meta.contains(&block_number), "block {block_number} written after its free");
        self.lent.remove(&block_number);
        self.seen.remove(&block_number);
        self.blocks.insert(block_number, (kind, block));
        Ok(())
    }

    /// Lets go of the held copy of `block_number` when it is `block` itself: the caller then
    /// owns the only reference and changes it without a copy. It comes back by `write_meta`; a
    /// change that fails instead fails the record and so the store, which then never commits
    /// (`commit` refuses while a block is out).
    fn release_for_change(&mut self, block_number: u64, block: &SharedBlock) {
        if matches!(self.blocks.get(&block_number), Some((_, held)) if Arc::ptr_eq(held, block)) {
            self.blocks.remove(&block_number);
            self.lent.insert(block_number);
        }
    }

    fn decoded(&mut self, block_number: u64, block: &SharedBlock) -> Option<Decoded> {
        self.memo.decoded(block_number, block)
    }

    fn keep_decoded(&mut self, block_number: u64, block: &SharedBlock, decoded: Decoded) {
        self.memo.put_decoded(block_number, block, decoded);
    }

    fn allocate_meta(&mut self, near: u64) -> Result<u64> {
        let mut volume = self.lock_volume()?;
        volume.current_lsn = self.lsn;
        volume.allocate_meta(near)
    }

    fn free_meta(&mut self, block_number: u64) -> Result<()> {
        self.blocks.remove(&block_number);
        self.lent.remove(&block_number);
        self.seen.remove(&block_number);
        self.freed_meta.push(block_number);
        Ok(())
    }
}

impl DataStore for RecordStore<'_> {
    fn read_data(&mut self, block_number: u64, offset_in_block: usize, buffer: &mut [u8]) -> Result<()> {
        self.lock_volume()?.read_data(block_number, offset_in_block, buffer)
    }

    fn write_data(&mut self, block_number: u64, offset_in_block: usize, data: &[u8]) -> Result<()> {
        self.lock_volume()?.write_data(block_number, offset_in_block, data)
    }

    /// The volume's own, which reads nothing (the default is two partial writes, the first of
    /// which reads the rest of its block for the checksum).
    fn write_fresh(&mut self, block_number: u64, data: &[u8]) -> Result<()> {
        self.lock_volume()?.write_fresh(block_number, data)
    }

    /// The volume's own copy, which carries damage in the source over to the copy instead of
    /// failing the record (the default read-then-write would fail on a damaged block).
    fn copy_data(&mut self, from_block: u64, to_block: u64, offset_in_block: usize, length: usize) -> Result<()> {
        self.lock_volume()?.copy_data(from_block, to_block, offset_in_block, length)
    }

    fn allocate_data(&mut self, near: u64, count: u64) -> Result<(u64, u64)> {
        let mut volume = self.lock_volume()?;
        volume.current_lsn = self.lsn;
        volume.allocate_data(near, count)
    }

    fn free_data(&mut self, first: u64, count: u64) -> Result<()> {
        self.freed_data.push((first, count));
        Ok(())
    }

    fn shared_references(&mut self, block_number: u64) -> Result<u64> {
        self.lock_volume()?.shared_references(block_number)
    }

    fn set_shared_references(&mut self, block_number: u64, references: u64) -> Result<()> {
        self.lock_volume()?.set_shared_references(block_number, references)
    }
    // A volume that cannot be locked (stopped) packs nothing more; the record fails elsewhere.
    fn pack_room(&mut self, file: u64) -> Option<(u64, u64)> {
        self.lock_volume().ok()?.pack_room(file)
    }

    fn set_pack_room(&mut self, file: u64, room: Option<(u64, u64)>) {
        if let Ok(mut volume) = self.lock_volume() {
            volume.set_pack_room(file, room);
        }
    }

    fn forget_pack_room(&mut self, first: u64, count: u64) {
        if let Ok(mut volume) = self.lock_volume() {
            volume.forget_pack_room(first, count);
        }
    }
}

impl ApplyStore for RecordStore<'_> {
    fn begin_record(&mut self, lsn: u64) {
        assert!(lsn > self.lsn, "record {lsn} after record {}: a group applies in lsn order", self.lsn);
        self.lsn = lsn;
    }
    /// At once, as allocations go: the blocks are reachable only through changes still held
    /// back, and the front end serves the bytes until the record is applied.
    fn take_claimed_data(&mut self, first: u64, count: u64, entries: &[u32]) -> Result<()> {
        let mut volume = self.lock_volume()?;
        volume.current_lsn = self.lsn;
        volume.take_claimed_data(first, count, entries)
    }
    fn read_inode(&mut self, inode_number: u64) -> Result<Inode> {
        if let Some(held) = self.held_inode(inode_number) {
            return held;
        }
        if let Some(inode) = self.memo.inode(inode_number) {
            return Ok(inode);
        }
        let inode = self.lock_volume()?.read_inode(inode_number)?;
        self.memo.put_inode(&inode);
        Ok(inode)
    }
    fn write_inode(&mut self, inode: &Inode) -> Result<()> {
        self.hold_inode_change(InodeChange::Write(inode.clone()));
        Ok(())
    }
    fn create_inode(&mut self, inode: &Inode) -> Result<()> {
        self.hold_inode_change(InodeChange::Create(inode.clone()));
        Ok(())
    }
    fn delete_inode(&mut self, inode_number: u64) -> Result<()> {
        self.hold_inode_change(InodeChange::Delete(inode_number));
        Ok(())
    }
    fn read_xattrs(&mut self, _block_number: u64) -> Result<Xattrs> {
        unreachable!("records that change extended attributes are applied with the volume held")
    }
    fn write_xattrs(&mut self, _inode: &mut Inode, _attributes: &Xattrs) -> Result<()> {
        unreachable!("records that change extended attributes are applied with the volume held")
    }
    fn raise_next_generation(&mut self, generation: u64) {
        self.next_generation = self.next_generation.max(generation);
    }
    fn orphan_head(&mut self) -> u64 {
        unreachable!("records that change the orphan list are applied with the volume held")
    }
    fn set_orphan_head(&mut self, _inode_number: u64) {
        unreachable!("records that change the orphan list are applied with the volume held")
    }
    fn inode_count(&mut self) -> u64 {
        // Fixed at mkfs: no change can leave it half made.
        self.lock_times.lock(self.volume).superblock.inode_count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::meta::zeroed_block;
    use crate::block::superblock::Superblock;
    use crate::device::MemoryDevice;
    use std::sync::Arc;

    /// A worker's write into blocks just handed out goes through the volume's fresh write:
    /// nothing is read from the device, and the block reads back as the bytes and zeros.
    #[test]
    fn fresh_writes_go_to_the_volume_without_a_read() {
        let device = Arc::new(MemoryDevice::new(64 << 20));
        let superblock = Superblock::layout((64 << 20) / 4096, None, None).unwrap();
        let mut volume = Volume::new_empty(device.clone(), superblock.clone(), 64);
        volume.blocks.set_range(0, superblock.first_data_block);
        let shared = Mutex::new(volume);
        let (block, _) = shared.lock().allocate_data(0, 1).unwrap();
        crate::device::Device::write_at(&*device, block * 4096, &[0xa5; 4096]).unwrap();
        let memo = Memo::default();
        let mut store = RecordStore::new(&shared, &memo);
        store.begin_record(7);
        let reads = device.counters().reads;
        store.write_fresh(block, &[9; 100]).unwrap();
        assert_eq!(device.counters().reads, reads, "the fresh write read the device");
        let mut buffer = vec![0xffu8; 4096];
        shared.lock().read_data(block, 0, &mut buffer).unwrap();
        assert!(buffer[..100].iter().all(|byte| *byte == 9) && buffer[100..].iter().all(|byte| *byte == 0));
    }

    fn volume() -> Mutex<Volume> {
        let device = Arc::new(MemoryDevice::new(64 << 20));
        let superblock = Superblock::layout((64 << 20) / 4096, None, None).unwrap();
        let mut volume = Volume::new_empty(device, superblock.clone(), 64);
        volume.blocks.set_range(0, superblock.first_data_block);
        Mutex::new(volume)
    }

    fn block_of(fill: u8) -> SharedBlock {
        let mut block = zeroed_block();
        block[0] = fill;
        Arc::new(block)
    }

    /// Nothing a record writes or frees reaches the shared volume before its commit, and all of
    /// it does at the commit: a reader holding the volume lock never sees half a record.
    #[test]
    fn a_record_reaches_the_volume_whole_at_its_commit() {
        let shared = volume();
        let kept = shared.lock().allocate_meta(0).unwrap();
        let freed = shared.lock().allocate_meta(0).unwrap();
        for (block, fill) in [(kept, 1), (freed, 2)] {
            shared.lock().write_meta(block, BlockKind::Xattr, block_of(fill)).unwrap();
        }
        let memo = Memo::default();
        let mut store = RecordStore::new(&shared, &memo);
        store.begin_record(7);
        assert_eq!(store.read_meta(kept, BlockKind::Xattr).unwrap()[0], 1);
        store.write_meta(kept, BlockKind::Xattr, block_of(3)).unwrap();
        store.free_meta(freed).unwrap();
        // The record sees its own change; the volume still holds the old state.
        assert_eq!(store.read_meta(kept, BlockKind::Xattr).unwrap()[0], 3);
        assert_eq!(shared.lock().read_meta(kept, BlockKind::Xattr).unwrap()[0], 1);
        assert_eq!(shared.lock().read_meta(freed, BlockKind::Xattr).unwrap()[0], 2);
        assert_eq!(shared.lock().blocks.pending_free_count(), 0);
        store.commit().unwrap();
        assert_eq!(shared.lock().read_meta(kept, BlockKind::Xattr).unwrap()[0], 3);
        assert!(shared.lock().read_meta(freed, BlockKind::Xattr).is_err(), "freed at the commit");
        assert_eq!(shared.lock().blocks.pending_free_count(), 1);
        // The next record starts empty and reads the committed block from what it remembers.
        store.begin_record(8);
        assert_eq!(store.read_meta(kept, BlockKind::Xattr).unwrap()[0], 3);
    }

    /// A group's inodes come in with one hold of the volume lock; a free number is left for the
    /// record's own read, which still says NotFound.
    #[test]
    fn prefetched_inodes_are_read_without_the_volume_lock() {
        let shared = volume();
        let numbers: Vec<u64> = (2..40).collect();
        for &number in &numbers {
            shared.lock().create_inode(&Inode::empty_directory(number, 1, 0o755, 1, 0)).unwrap();
        }
        let memo = Memo::default();
        let mut store = RecordStore::new(&shared, &memo);
        store.begin_record(1);
        store.prefetch_inodes(&[numbers.as_slice(), &[100]].concat());
        assert_eq!(store.lock_count(), 1);
        for &number in &numbers {
            assert_eq!(store.read_inode(number).unwrap().inode_number, number);
        }
        assert_eq!(store.lock_count(), 1, "every prefetched inode came from the memo");
        assert!(matches!(store.read_inode(100), Err(Error::NotFound)));
        assert_eq!(store.lock_count(), 2, "a free number is read on demand");
        // Without the prefetch, each inode takes the lock once.
        let cold = Memo::default();
        let mut store = RecordStore::new(&shared, &cold);
        store.begin_record(1);
        for &number in &numbers {
            store.read_inode(number).unwrap();
        }
        assert_eq!(store.lock_count(), numbers.len() as u64);
    }

    /// The memo outlives a checkpoint: sealing copies the blocks it shares instead of changing
    /// them, the payload it serves is the volume's, and a block changed after the checkpoint
    /// is sealed again by the next one.
    #[test]
    fn remembered_blocks_stay_right_across_a_checkpoint() {
        let shared = volume();
        let block_number = shared.lock().allocate_meta(0).unwrap();
        let memo = Memo::default();
        let mut store = RecordStore::new(&shared, &memo);
        store.begin_record(1);
        store.write_meta(block_number, BlockKind::Xattr, block_of(1)).unwrap();
        store.commit().unwrap();
        let remembered = memo.block(block_number, BlockKind::Xattr).expect("remembered at the commit");
        let images = shared.lock().snapshot_images().unwrap();
        let image = images.iter().find(|image| image.block_number == block_number).expect("the dirty block");
        crate::block::meta::verify_block(&image.block, BlockKind::Xattr, block_number).unwrap();
        assert!(!Arc::ptr_eq(&image.block, &remembered), "sealing copied the shared block");
        let payload = crate::block::meta::META_PAYLOAD_BYTES;
        assert_eq!(image.block[..payload], remembered[..payload]);
        // A later record reads the remembered block, changes it, and the next checkpoint
        // seals the change.
        store.begin_record(2);
        let mut changed = (*store.read_meta(block_number, BlockKind::Xattr).unwrap()).clone();
        assert_eq!(changed[0], 1);
        changed[0] = 2;
        store.write_meta(block_number, BlockKind::Xattr, Arc::new(changed)).unwrap();
        store.commit().unwrap();
        assert_eq!(shared.lock().read_meta(block_number, BlockKind::Xattr).unwrap()[0], 2);
        let images = shared.lock().snapshot_images().unwrap();
        let image = images.iter().find(|image| image.block_number == block_number).expect("dirty again");
        crate::block::meta::verify_block(&image.block, BlockKind::Xattr, block_number).unwrap();
        assert_eq!(image.block[0], 2);
    }

    /// Only writes that a later change of the same inode supersedes are dropped, and the
    /// order of the rest is kept.
    #[test]
    fn a_commit_writes_each_inode_once() {
        let inode = |number: u64, link_count: u32| {
            let mut inode = Inode::empty_directory(number, 1, 0o755, 1, 0);
            inode.link_count = link_count;
            inode
        };
        let changes = vec![
            InodeChange::Create(inode(5, 1)),
            InodeChange::Write(inode(7, 1)),
            InodeChange::Write(inode(5, 2)),
            InodeChange::Write(inode(7, 2)),
            InodeChange::Write(inode(9, 1)),
            InodeChange::Delete(9),
            InodeChange::Write(inode(5, 3)),
        ];
        let kept: Vec<(char, u64, u32)> = superseded_writes_dropped(changes)
            .into_iter()
            .map(|change| match change {
                InodeChange::Create(inode) => ('c', inode.inode_number, inode.link_count),
                InodeChange::Write(inode) => ('w', inode.inode_number, inode.link_count),
                InodeChange::Delete(number) => ('d', number, 0),
            })
            .collect();
        assert_eq!(kept, vec![('c', 5, 1), ('w', 7, 2), ('d', 9, 0), ('w', 5, 3)]);
    }

    /// A block this store changed and still holds is handed to the next change without a
    /// copy; one that never comes back stops the commit instead of losing the change.
    #[test]
    fn a_held_block_is_changed_without_a_copy_and_must_come_back() {
        let shared = volume();
        let block_number = shared.lock().allocate_meta(0).unwrap();
        let memo = Memo::default();
        let mut store = RecordStore::new(&shared, &memo);
        store.begin_record(1);
        store.write_meta(block_number, BlockKind::Xattr, block_of(1)).unwrap();
        let mut block = store.read_meta(block_number, BlockKind::Xattr).unwrap();
        assert!(Arc::get_mut(&mut block).is_none(), "the store holds it too");
        store.release_for_change(block_number, &block);
        Arc::get_mut(&mut block).expect("the only reference after the release")[0] = 2;
        store.write_meta(block_number, BlockKind::Xattr, block).unwrap();
        store.commit().unwrap();
        assert_eq!(shared.lock().read_meta(block_number, BlockKind::Xattr).unwrap()[0], 2);
        // A committed block is shared with the memo and the volume: nothing to let go of.
        store.begin_record(2);
        let mut block = store.read_meta(block_number, BlockKind::Xattr).unwrap();
        store.release_for_change(block_number, &block);
        assert!(Arc::get_mut(&mut block).is_none());
        // Lent and never written back: the store refuses to read it or to commit.
        store.write_meta(block_number, BlockKind::Xattr, block_of(3)).unwrap();
        let block = store.read_meta(block_number, BlockKind::Xattr).unwrap();
        store.release_for_change(block_number, &block);
        drop(block);
        assert!(store.read_meta(block_number, BlockKind::Xattr).is_err());
        assert!(store.commit().is_err());
        assert_eq!(
            shared.lock().read_meta(block_number, BlockKind::Xattr).unwrap()[0],
            2,
            "nothing reached the volume"
        );
    }

    /// A block read once is read again from the store itself (no memo shard, no volume lock),
    /// and what the store commits replaces what it had read.
    #[test]
    fn a_store_reads_each_block_from_the_shared_state_once() {
        let shared = volume();
        let block_number = shared.lock().allocate_meta(0).unwrap();
        shared.lock().write_meta(block_number, BlockKind::Xattr, block_of(1)).unwrap();
        let memo = Memo::default();
        let mut store = RecordStore::new(&shared, &memo);
        store.begin_record(1);
        assert_eq!(store.read_meta(block_number, BlockKind::Xattr).unwrap()[0], 1);
        assert_eq!(store.lock_count(), 1);
        memo.clear();
        assert_eq!(store.read_meta(block_number, BlockKind::Xattr).unwrap()[0], 1);
        assert_eq!(store.lock_count(), 1, "the second read came from the store");
        store.write_meta(block_number, BlockKind::Xattr, block_of(2)).unwrap();
        store.commit().unwrap();
        memo.clear();
        store.begin_record(2);
        assert_eq!(
            store.read_meta(block_number, BlockKind::Xattr).unwrap()[0],
            2,
            "the committed block, not the old read"
        );
        assert_eq!(store.lock_count(), 2, "only the commit took the lock");
        store.free_meta(block_number).unwrap();
        store.commit().unwrap();
        store.begin_record(3);
        assert!(
            store.read_meta(block_number, BlockKind::Xattr).is_err(),
            "a freed block is read from the volume, which refuses it"
        );
    }

    #[test]
    fn a_record_reads_back_the_inodes_it_changed() {
        let shared = volume();
        let memo = Memo::default();
        let mut store = RecordStore::new(&shared, &memo);
        store.begin_record(1);
        let mut inode = Inode::empty_directory(5, 1, 0o755, 1, 0);
        store.create_inode(&inode).unwrap();
        assert_eq!(store.read_inode(5).unwrap(), inode);
        inode.link_count = 2;
        store.write_inode(&inode).unwrap();
        assert_eq!(store.read_inode(5).unwrap().link_count, 2);
        assert!(matches!(shared.lock().read_inode(5), Err(Error::NotFound)), "not on the volume before the commit");
        store.delete_inode(5).unwrap();
        assert!(matches!(store.read_inode(5), Err(Error::NotFound)));
        store.create_inode(&inode).unwrap();
        store.commit().unwrap();
        store.begin_record(2);
        assert_eq!(store.read_inode(5).unwrap().link_count, 2, "after the commit, from the memo");
    }
}
