//! The home mirror: the blocks that lookups read (inode-table blocks and H-tree blocks), as
//! the volume's cache holds them, readable without the volume lock.
//!
//! Why: a lookup of a name the front end does not hold walks the parent's H-tree and reads the
//! target's inode. With the volume lock held for the walk, threads resolving paths past the
//! front end's caches took turns (issue 9: 106k resolutions/s on 16 threads, the lock's spin a
//! fifth of the samples). Readers now take `SharedBlock`s from this mirror instead, and check
//! a sequence counter around what they read (a seqlock) so that they never answer from part
//! of a change. See docs/ARCHITECTURE.md, *Readers of home without the volume lock*.
//!
//! What protects what:
//! - An entry is inserted only by a holder of the volume lock, from what the volume's cache
//!   (or the checked device read behind it) returns then, and every change of a block of a
//!   mirrored kind in the cache (`BlockCache::modify`, `put_dirty`, `remove`, ...) removes it
//!   from the mirror first, under the same lock. So an entry always holds the block's current
//!   content. Blocks are immutable while shared: a change copies a block someone still holds
//!   (`Arc::make_mut`), so a reader's `SharedBlock` never changes under it.
//! - A change of mirrored blocks makes `sequence` odd before its first such block changes and
//!   even again just before the volume lock is let go (`end_change`), so a lock hold, which is
//!   the unit in which records reach the volume (a worker's commit, a held batch), is one step
//!   of the counter. A reader reads `sequence` (even) before and checks it is unchanged after:
//!   then no change of a mirrored block overlapped its reads, and they are all of one moment.
//!   A reader that keeps finding it moved falls back to reading under the volume lock.
//! - A change that fails half way leaves the counter odd (`Volume::end_change` does not end it
//!   on a half-changed volume), so every reader falls back to the lock, which answers
//!   `Shutdown`.

use super::meta::{BlockKind, SharedBlock};
use crate::FastHashMap;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Shards of the mirror, by block number: readers of different blocks take different locks.
const SHARD_COUNT: usize = 64;

/// The blocks a lookup reads: only these are mirrored, and only their changes move the
/// sequence (the generation table, bitmaps and extent blocks change at every checkpoint and
/// write without disturbing a reader).
pub fn is_mirrored_kind(kind: BlockKind) -> bool {
    matches!(kind, BlockKind::InodeTable | BlockKind::DirLeaf | BlockKind::DirIndex)
}

/// The volume's geometry that a reader of inode records needs, fixed for the mount.
#[derive(Debug, Clone, Copy)]
pub struct HomeGeometry {
    pub inode_table_start: u64,
    pub inode_count: u64,
    pub first_data_block: u64,
    pub block_count: u64,
}

/// One shard: two generations of entries, so that the shard is bounded without a recency list
/// (a hit in the old generation moves the entry to the young one; when the young one is full,
/// the old one is dropped and the young one becomes old).
#[derive(Default)]
struct Shard {
    young: FastHashMap<u64, (BlockKind, SharedBlock)>,
    old: FastHashMap<u64, (BlockKind, SharedBlock)>,
}

/// Keeps each shard's lock on cache lines of its own.
#[repr(align(128))]
struct PaddedShard(RwLock<Shard>);

/// See the module comment.
pub struct HomeMirror {
    sequence: AtomicU64,
    shards: Box<[PaddedShard]>,
    /// Entries of one generation of one shard at most.
    generation_entries_max: usize,
    geometry: HomeGeometry,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl HomeMirror {
    /// A mirror of at most about `capacity_blocks` blocks (the volume cache's bound: the
    /// blocks are shared with the cache while both hold them).
    pub fn new(capacity_blocks: usize, geometry: HomeGeometry) -> HomeMirror {
        HomeMirror {
            sequence: AtomicU64::new(0),
            shards: (0..SHARD_COUNT).map(|_| PaddedShard(RwLock::new(Shard::default()))).collect(),
            generation_entries_max: (capacity_blocks / SHARD_COUNT / 2).max(4),
            geometry,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub fn geometry(&self) -> HomeGeometry {
        self.geometry
    }

    fn shard(&self, block_number: u64) -> &RwLock<Shard> {
        // Neighbouring blocks (one directory's leaves, a run of inode-table blocks) spread.
        let mixed = block_number.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(mixed >> (64 - SHARD_COUNT.trailing_zeros())) as usize].0
    }

    /// The mirrored block, if present with this kind. Takes one shard's read lock; a hit in the
    /// old generation takes its write lock once to move the entry to the young one.
    pub fn get(&self, block_number: u64, kind: BlockKind) -> Option<SharedBlock> {
        let shard = self.shard(block_number);
        let found = {
            let entries = shard.read();
            if let Some((held, block)) = entries.young.get(&block_number) {
                return (*held == kind).then(|| block.clone());
            }
            entries.old.get(&block_number).map(|(held, block)| (*held, block.clone()))
        };
        let (held, block) = found?;
        if held != kind {
            return None;
        }
        let mut entries = shard.write();
        // Moved only if still there: an invalidation between the two locks removed it.
        if let Some(entry) = entries.old.remove(&block_number) {
            Self::insert_young(&mut entries, self.generation_entries_max, block_number, entry);
        }
        Some(block)
    }

    fn insert_young(
        shard: &mut Shard,
        generation_entries_max: usize,
        block_number: u64,
        entry: (BlockKind, SharedBlock),
    ) {
        if shard.young.len() >= generation_entries_max {
            shard.old = std::mem::take(&mut shard.young);
        }
        shard.young.insert(block_number, entry);
    }

    /// Mirrors a block as the volume holds it now. The caller holds the volume lock.
    pub fn insert(&self, block_number: u64, kind: BlockKind, block: SharedBlock) {
        assert!(is_mirrored_kind(kind), "{kind:?} blocks are not mirrored");
        let mut entries = self.shard(block_number).write();
        entries.old.remove(&block_number);
        Self::insert_young(&mut entries, self.generation_entries_max, block_number, (kind, block));
    }

    /// Forgets a block that is about to change. The caller holds the volume lock and has made
    /// the sequence odd (`begin_change`).
    pub fn remove(&self, block_number: u64) {
        debug_assert!(self.sequence.load(Ordering::Relaxed) % 2 == 1, "a change outside begin_change");
        let mut entries = self.shard(block_number).write();
        entries.young.remove(&block_number);
        entries.old.remove(&block_number);
    }

    /// Forgets every block (a repair rebuilt what they were read against).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut entries = shard.0.write();
            entries.young.clear();
            entries.old.clear();
        }
    }

    /// Blocks mirrored now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let entries = shard.0.read();
                entries.young.len() + entries.old.len()
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes the sequence odd: a change of mirrored blocks begins. The caller holds the volume
    /// lock and has not begun one in this hold.
    pub fn begin_change(&self) {
        let before = self.sequence.fetch_add(1, Ordering::SeqCst);
        assert!(before.is_multiple_of(2), "a change begun twice");
    }

    /// Makes the sequence even: the change is whole. The caller holds the volume lock.
    pub fn end_change(&self) {
        let before = self.sequence.fetch_add(1, Ordering::SeqCst);
        assert!(before % 2 == 1, "a change ended that never began");
    }

    /// The sequence when no change is under way, `None` while one is: where a reader starts.
    pub fn read_begin(&self) -> Option<u64> {
        let sequence = self.sequence.load(Ordering::SeqCst);
        sequence.is_multiple_of(2).then_some(sequence)
    }

    /// Whether nothing mirrored changed since `read_begin` returned `started`: then every block
    /// read in between (from the mirror, or under the volume lock) is of one moment.
    pub fn read_valid(&self, started: u64) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.sequence.load(Ordering::SeqCst) == started
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::meta::zeroed_block;
    use std::sync::Arc;

    fn geometry() -> HomeGeometry {
        HomeGeometry { inode_table_start: 10, inode_count: 1024, first_data_block: 100, block_count: 1000 }
    }

    #[test]
    fn entries_are_bounded_and_kinds_kept_apart() {
        let mirror = HomeMirror::new(64 * 16, geometry());
        for block in 0..10_000u64 {
            mirror.insert(block, BlockKind::DirLeaf, Arc::new(zeroed_block()));
        }
        assert!(mirror.len() <= 64 * 16 + 64, "{} entries", mirror.len());
        let last = 9_999;
        assert!(mirror.get(last, BlockKind::DirLeaf).is_some());
        assert!(mirror.get(last, BlockKind::DirIndex).is_none(), "another kind is a miss");
    }

    #[test]
    fn a_change_between_begin_and_check_invalidates_the_read() {
        let mirror = HomeMirror::new(1024, geometry());
        let started = mirror.read_begin().expect("no change under way");
        assert!(mirror.read_valid(started));
        mirror.begin_change();
        assert!(mirror.read_begin().is_none(), "a reader does not start during a change");
        mirror.remove(7);
        mirror.end_change();
        assert!(!mirror.read_valid(started), "a read across a change must be refused");
        let again = mirror.read_begin().unwrap();
        assert!(mirror.read_valid(again));
    }
}
