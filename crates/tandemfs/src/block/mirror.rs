//! The home mirror: the blocks that lookups read (inode-table blocks and H-tree blocks), as
//! the volume's cache holds them, readable without the volume lock.
//!
//! Why: a lookup of a name the front end does not hold walks the parent's H-tree and reads the
//! target's inode. With the volume lock held for the walk, threads resolving paths past the
//! front end's caches took turns (issue 9: 106k resolutions/s on 16 threads, the lock's spin a
//! fifth of the samples). Readers now take `SharedBlock`s from this mirror instead, and check
//! the sequence counters of the blocks they read (a seqlock per stripe of blocks) so that they never answer from part
//! of a change. See docs/ARCHITECTURE.md, *Readers of home without the volume lock*.
//!
//! What protects what:
//! - An entry is inserted only by a holder of the volume lock, from what the volume's cache
//!   (or the checked device read behind it) returns then, and every change of a block of a
//!   mirrored kind in the cache (`BlockCache::modify`, `put_dirty`, `remove`, ...) removes it
//!   from the mirror first, under the same lock. So an entry always holds the block's current
//!   content. Blocks are immutable while shared: a change copies a block someone still holds
//!   (`Arc::make_mut`), so a reader's `SharedBlock` never changes under it.
//! - Each block has a sequence counter, shared by the blocks of its *stripe* (block number
//!   modulo `SEQUENCE_STRIPES`). A lock hold that changes a mirrored block makes its stripe's
//!   counter odd before the block changes (once per hold) and even again just before the
//!   volume lock is let go (`BlockCache::end_change`), so every block a hold changes is "under
//!   change" from before its change until the whole hold (the unit in which records reach the
//!   volume: a worker's commit, a held batch) is done. A reader notes each block's counter
//!   (even) before it takes the block and checks, after its last read, that none of the
//!   counters it noted moved: then no hold changed any block it read between its first read
//!   and its check, and every block it read holds what it held after the last hold that
//!   changed it ended. A hold that changes only other blocks (another directory's leaves and
//!   inode-table blocks) does not disturb it. See docs/ARCHITECTURE.md.
//! - A change that fails half way poisons the mirror (`poison`, before the lock is let go) and
//!   leaves its stripes odd (`Volume::end_change` does not end them on a half-changed volume),
//!   so every reader that checks afterwards falls back to the lock, which answers `Shutdown`.

use super::meta::{BlockKind, SharedBlock};
use crate::FastHashMap;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Shards of the mirror, by block number: readers of different blocks take different locks.
const SHARD_COUNT: usize = 64;

/// Sequence counters, one per stripe of blocks (block number modulo this). Blocks of one
/// stripe share a counter, so a change of one makes readers of the others read again; with
/// 16,384 stripes (128 KiB), a volume of up to 64 MiB gives every block a counter of its own,
/// and on a larger one a hold touching a few blocks disturbs a reader of a few others about
/// once in a thousand. Consecutive blocks (a run of inode-table blocks, neighbouring leaves)
/// never share a stripe.
pub const SEQUENCE_STRIPES: usize = 1 << 14;

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
    /// Per stripe: odd while a lock hold is changing one of its blocks (see the module comment).
    stripes: Box<[AtomicU64]>,
    /// A change failed half way: no read of the mirror may be kept.
    poisoned: AtomicBool,
    shards: Box<[PaddedShard]>,
    /// Entries of one generation of one shard at most.
    generation_entries_max: usize,
    geometry: HomeGeometry,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Reads of home refused because a change overlapped them, and read again.
    pub retries: AtomicU64,
    /// Reads of home that went to the volume lock (a change under way, or overlapping every try).
    pub fallbacks: AtomicU64,
}

impl HomeMirror {
    /// A mirror of at most about `capacity_blocks` blocks (the volume cache's bound: the
    /// blocks are shared with the cache while both hold them).
    pub fn new(capacity_blocks: usize, geometry: HomeGeometry) -> HomeMirror {
        HomeMirror {
            stripes: (0..SEQUENCE_STRIPES).map(|_| AtomicU64::new(0)).collect(),
            poisoned: AtomicBool::new(false),
            shards: (0..SHARD_COUNT).map(|_| PaddedShard(RwLock::new(Shard::default()))).collect(),
            generation_entries_max: (capacity_blocks / SHARD_COUNT / 2).max(4),
            geometry,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
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
    /// the block's stripe odd (`begin_change`).
    pub fn remove(&self, block_number: u64) {
        debug_assert!(
            self.stripes[stripe_of(block_number)].load(Ordering::Relaxed) % 2 == 1,
            "a change outside begin_change"
        );
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

    /// A change of `block_number` begins: its stripe's counter becomes odd, unless this hold
    /// (or one that ended without `end_change`, whose stripes are still listed by the cache)
    /// already made it odd. Returns the stripe the caller must end (`end_change`) before it
    /// lets the volume lock go. The caller holds the volume lock: only its holder changes the
    /// counters, so an odd counter is one of this hold's.
    pub fn begin_change(&self, block_number: u64) -> Option<usize> {
        let stripe = stripe_of(block_number);
        let counter = &self.stripes[stripe];
        if counter.load(Ordering::Relaxed) % 2 == 1 {
            return None;
        }
        counter.fetch_add(1, Ordering::SeqCst);
        Some(stripe)
    }

    /// A change of every block begins (a repair, before `clear`): returns the stripes begun.
    pub fn begin_change_of_all(&self) -> Vec<usize> {
        (0..SEQUENCE_STRIPES as u64).filter_map(|stripe| self.begin_change(stripe)).collect()
    }

    /// The change of `stripe`'s blocks is whole. The caller holds the volume lock.
    pub fn end_change(&self, stripe: usize) {
        let before = self.stripes[stripe].fetch_add(1, Ordering::SeqCst);
        assert!(before % 2 == 1, "a change of stripe {stripe} ended that never began");
    }

    /// A change failed half way: from now on no reader keeps what it read here. The caller
    /// holds the volume lock.
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
    }

    /// Where a reader of `block_number` starts: its stripe and the stripe's counter, if no
    /// change of the stripe is under way (`None` while one is).
    pub fn read_begin(&self, block_number: u64) -> Option<(usize, u64)> {
        let stripe = stripe_of(block_number);
        let sequence = self.stripes[stripe].load(Ordering::SeqCst);
        sequence.is_multiple_of(2).then_some((stripe, sequence))
    }

    /// Whether every stripe a reader noted (`read_begin`) still has the counter it noted, and
    /// no change failed half way: then every block read in between (from the mirror, or under
    /// the volume lock) is of one moment. Called after the reader's last read.
    pub fn read_valid(&self, noted: impl IntoIterator<Item = (usize, u64)>) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        !self.poisoned.load(Ordering::SeqCst)
            && noted.into_iter().all(|(stripe, sequence)| self.stripes[stripe].load(Ordering::SeqCst) == sequence)
    }

    /// The counter of `stripe` now (for a reader checking versions it noted earlier).
    pub fn stripe_counter(&self, stripe: usize) -> u64 {
        self.stripes[stripe].load(Ordering::SeqCst)
    }

    /// Whether a change failed half way (then every read goes to the lock).
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }
}

/// The stripe of a block's sequence counter.
pub fn stripe_of(block_number: u64) -> usize {
    (block_number % SEQUENCE_STRIPES as u64) as usize
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
    fn a_change_between_begin_and_check_invalidates_only_reads_of_its_blocks() {
        let mirror = HomeMirror::new(1024, geometry());
        let read_of_7 = mirror.read_begin(7).expect("no change under way");
        let read_of_8 = mirror.read_begin(8).expect("no change under way");
        assert!(mirror.read_valid([read_of_7, read_of_8]));
        let stripe = mirror.begin_change(7).expect("a change begins");
        assert_eq!(mirror.begin_change(7), None, "a stripe begins once per hold");
        assert!(mirror.read_begin(7).is_none(), "a reader of block 7 does not start during its change");
        assert!(mirror.read_begin(8).is_some(), "a reader of block 8 does");
        mirror.remove(7);
        mirror.end_change(stripe);
        assert!(!mirror.read_valid([read_of_7]), "a read of block 7 across its change must be refused");
        assert!(mirror.read_valid([read_of_8]), "a read of block 8 is not disturbed");
        assert!(!mirror.read_valid([read_of_8, read_of_7]));
        let again = mirror.read_begin(7).unwrap();
        assert!(mirror.read_valid([again]));
        let same_stripe = mirror.read_begin(7 + SEQUENCE_STRIPES as u64).unwrap();
        assert_eq!(same_stripe, again, "blocks of one stripe share the counter");
        mirror.poison();
        assert!(!mirror.read_valid([again]), "nothing read is kept once a change failed half way");
    }
}
