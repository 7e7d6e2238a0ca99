//! The metadata block cache. Blocks are kept unsealed in memory; the trailer is written when a
//! checkpoint takes an image. Dirty blocks stay until a checkpoint takes them; clean blocks are
//! evicted in least-recently-used order once the cache holds more than its bound.

use super::meta::{BlockBuf, BlockKind, SharedBlock};
use super::mirror::{is_mirrored_kind, HomeGeometry, HomeMirror};
use crate::FastHashMap;
use std::collections::VecDeque;
use std::sync::Arc;

struct Entry {
    block: SharedBlock,
    kind: BlockKind,
    dirty: bool,
    /// Dirty and sealed into the images of a checkpoint still on its way home, unchanged since:
    /// the next checkpoint will not need it (`mark_clean_if_unchanged` cleans it).
    sealed: bool,
    stamp: u64,
}

pub struct BlockCache {
    entries: FastHashMap<u64, Entry>,
    /// (block, stamp) in use order; an element is stale when the entry's stamp moved on.
    recency: VecDeque<(u64, u64)>,
    dirty_count: usize,
    /// Entries `sealed`: `dirty_count - sealed_count` is what the next checkpoint would write.
    sealed_count: usize,
    clock: u64,
    capacity_blocks: usize,
    pub hits: u64,
    pub misses: u64,
    /// The blocks lookups read without the volume lock (`block::mirror`): every change of a
    /// mirrored kind here forgets the block there, inside a change of its sequence.
    mirror: Arc<HomeMirror>,
    /// The mirror's stripes whose change has begun in this lock hold (or in one that ended
    /// without `end_change`): their counters are odd until `end_change`.
    changing_stripes: Vec<usize>,
}

impl BlockCache {
    /// A cache with a mirror of its own (for volumes no reader shares: mkfs, fsck, tests).
    pub fn new(capacity_blocks: usize) -> BlockCache {
        let geometry = HomeGeometry { inode_table_start: 0, inode_count: 0, first_data_block: 0, block_count: 0 };
        BlockCache::with_mirror(capacity_blocks, Arc::new(HomeMirror::new(capacity_blocks, geometry)))
    }

    pub fn with_mirror(capacity_blocks: usize, mirror: Arc<HomeMirror>) -> BlockCache {
        assert!(capacity_blocks >= 16);
        BlockCache {
            entries: FastHashMap::default(),
            recency: VecDeque::new(),
            dirty_count: 0,
            sealed_count: 0,
            clock: 0,
            capacity_blocks,
            hits: 0,
            misses: 0,
            mirror,
            changing_stripes: Vec::new(),
        }
    }

    pub fn mirror(&self) -> &Arc<HomeMirror> {
        &self.mirror
    }

    /// Block `block_number` is about to change or go: if lookups may read it (`mirrored`), a
    /// change of its stripe in the mirror begins (once per lock hold) and the mirror forgets
    /// it, before anything changes.
    fn forget_mirrored(&mut self, block_number: u64, mirrored: bool) {
        if !mirrored {
            return;
        }
        if let Some(stripe) = self.mirror.begin_change(block_number) {
            self.changing_stripes.push(stripe);
        }
        self.mirror.remove(block_number);
    }

    /// The change of mirrored blocks made in this lock hold is whole: readers may trust the
    /// mirror again. Called just before the volume lock is let go.
    pub fn end_change(&mut self) {
        for stripe in self.changing_stripes.drain(..) {
            self.mirror.end_change(stripe);
        }
    }

    fn touch(&mut self, block_number: u64) -> u64 {
        self.clock += 1;
        self.recency.push_back((block_number, self.clock));
        self.clock
    }

    /// A shared reference to a cached block, if present with the expected kind.
    pub fn get(&mut self, block_number: u64, kind: BlockKind) -> Option<SharedBlock> {
        let stamp = self.clock + 1;
        let entry = self.entries.get_mut(&block_number)?;
        if entry.kind != kind {
            return None;
        }
        entry.stamp = stamp;
        let shared = entry.block.clone();
        self.touch(block_number);
        self.hits += 1;
        Some(shared)
    }

    /// Whether the block is cached as any kind: then something in memory uses it.
    pub fn holds(&self, block_number: u64) -> bool {
        self.entries.contains_key(&block_number)
    }

    /// Drops every clean block for which `in_use` says no (fsck's repair, after it rebuilt the
    /// bitmaps: what it read of blocks that turned out unreferenced must not look in use).
    pub fn forget_clean_unless(&mut self, in_use: impl Fn(u64) -> bool) {
        let begun = self.mirror.begin_change_of_all();
        self.changing_stripes.extend(begun);
        self.mirror.clear();
        self.entries.retain(|block_number, entry| entry.dirty || in_use(*block_number));
    }

    /// Whether the block is cached with this kind (no use recorded).
    pub fn contains(&self, block_number: u64, kind: BlockKind) -> bool {
        self.entries.get(&block_number).is_some_and(|entry| entry.kind == kind)
    }

    /// The cached block to change in place, marked dirty; copied first only if someone else
    /// (a checkpoint image in flight) still holds it. None if absent or of another kind.
    pub fn modify(&mut self, block_number: u64, kind: BlockKind) -> Option<&mut BlockBuf> {
        self.clock += 1;
        let stamp = self.clock;
        if self.entries.get(&block_number)?.kind != kind {
            return None;
        }
        self.forget_mirrored(block_number, is_mirrored_kind(kind));
        let entry = self.entries.get_mut(&block_number).expect("checked above");
        entry.stamp = stamp;
        if !entry.dirty {
            entry.dirty = true;
            self.dirty_count += 1;
        }
        if entry.sealed {
            entry.sealed = false;
            self.sealed_count -= 1;
        }
        self.recency.push_back((block_number, stamp));
        // No eviction here (the entry count does not change), but the queue stays bounded.
        self.bound_recency();
        let entry = self.entries.get_mut(&block_number).unwrap();
        Some(Arc::make_mut(&mut entry.block))
    }

    /// Inserts a block read from the device (clean).
    pub fn insert_clean(&mut self, block_number: u64, kind: BlockKind, block: SharedBlock) {
        self.misses += 1;
        let stamp = self.touch(block_number);
        if let Some(old) = self.entries.insert(block_number, Entry { block, kind, dirty: false, sealed: false, stamp })
        {
            assert!(!old.dirty, "clean insert over dirty block {block_number}");
        }
        // The caller reads the block it just inserted (and may modify it next): it must not be
        // the victim, even when every other entry is dirty and pinned.
        self.evict(Some(block_number));
    }

    /// Stores a changed block; it stays until the next checkpoint takes it.
    pub fn put_dirty(&mut self, block_number: u64, kind: BlockKind, block: SharedBlock) {
        let old_kind = self.entries.get(&block_number).map(|entry| entry.kind);
        self.forget_mirrored(block_number, is_mirrored_kind(kind) || old_kind.is_some_and(is_mirrored_kind));
        let stamp = self.touch(block_number);
        match self.entries.get_mut(&block_number) {
            Some(entry) => {
                entry.block = block;
                entry.kind = kind;
                entry.stamp = stamp;
                if !entry.dirty {
                    entry.dirty = true;
                    self.dirty_count += 1;
                }
                if entry.sealed {
                    entry.sealed = false;
                    self.sealed_count -= 1;
                }
            }
            None => {
                self.entries.insert(block_number, Entry { block, kind, dirty: true, sealed: false, stamp });
                self.dirty_count += 1;
            }
        }
        self.evict(None);
    }

    /// Forgets a freed block, dirty or not: its image must never be written again.
    pub fn remove(&mut self, block_number: u64) {
        // The kind is not known when the block is not cached (the mirror may still hold it).
        let kind = self.entries.get(&block_number).map(|entry| entry.kind);
        self.forget_mirrored(block_number, kind.is_none_or(is_mirrored_kind));
        if let Some(entry) = self.entries.remove(&block_number) {
            if entry.dirty {
                self.dirty_count -= 1;
            }
            if entry.sealed {
                self.sealed_count -= 1;
            }
        }
    }

    pub fn dirty_count(&self) -> usize {
        self.dirty_count
    }

    /// Dirty blocks the next checkpoint would write: those not sealed into the images of one
    /// still on its way home, or changed since.
    pub fn unsealed_dirty_count(&self) -> usize {
        self.dirty_count - self.sealed_count
    }

    /// The numbers and kinds of every dirty block, in block order.
    pub fn dirty_blocks(&self) -> Vec<(u64, BlockKind)> {
        let mut dirty: Vec<(u64, BlockKind)> =
            self.entries.iter().filter(|(_, entry)| entry.dirty).map(|(number, entry)| (*number, entry.kind)).collect();
        dirty.sort_unstable_by_key(|(number, _)| *number);
        dirty
    }

    /// Every dirty block, sealed in place by `seal` (the trailer is no part of the payload, so
    /// sealing the cached block changes nothing a reader sees), as shared references: no copy.
    /// They stay dirty, so that they cannot be evicted and read back stale before their images
    /// are home; `mark_clean` follows. A change before then copies the block (`modify`,
    /// `put_dirty` replace it), so the images keep what was sealed.
    pub fn seal_dirty(&mut self, seal: &mut dyn FnMut(u64, BlockKind, &mut BlockBuf)) -> Vec<(u64, SharedBlock)> {
        let mut images: Vec<(u64, SharedBlock)> = Vec::with_capacity(self.dirty_count);
        for (number, entry) in self.entries.iter_mut().filter(|(_, entry)| entry.dirty) {
            seal(*number, entry.kind, Arc::make_mut(&mut entry.block));
            images.push((*number, entry.block.clone()));
            if !entry.sealed {
                entry.sealed = true;
                self.sealed_count += 1;
            }
        }
        images.sort_unstable_by_key(|(block_number, _)| *block_number);
        images
    }

    /// The images of these blocks are home: the entries that still hold the very copy that was
    /// sealed may be evicted again. An entry changed since (a record applied while the
    /// checkpoint ran copies the shared block first, `Arc::make_mut`, or puts a new one) holds
    /// a change the images lack and stays dirty for the next checkpoint.
    pub fn mark_clean_if_unchanged<'a>(&mut self, images: impl Iterator<Item = (u64, &'a SharedBlock)>) {
        for (block_number, image) in images {
            if let Some(entry) = self.entries.get_mut(&block_number) {
                if entry.dirty && Arc::ptr_eq(&entry.block, image) {
                    entry.dirty = false;
                    self.dirty_count -= 1;
                    if entry.sealed {
                        entry.sealed = false;
                        self.sealed_count -= 1;
                    }
                }
            }
        }
        self.evict(None);
    }

    /// Rebuilds the recency queue when stale elements dominate it.
    fn bound_recency(&mut self) {
        if self.recency.len() > 4 * self.capacity_blocks.max(self.entries.len()) {
            let entries = &self.entries;
            self.recency
                .retain(|(block_number, stamp)| entries.get(block_number).is_some_and(|entry| entry.stamp == *stamp));
        }
    }

    /// Drops clean blocks, least recently used first, down to the capacity; never `keep`.
    fn evict(&mut self, keep: Option<u64>) {
        self.bound_recency();
        let mut budget = self.recency.len();
        while self.entries.len() > self.capacity_blocks && budget > 0 {
            budget -= 1;
            let Some((block_number, stamp)) = self.recency.pop_front() else { break };
            let evictable = Some(block_number) != keep
                && self.entries.get(&block_number).is_some_and(|entry| entry.stamp == stamp && !entry.dirty);
            if evictable {
                self.entries.remove(&block_number);
            } else if self.entries.get(&block_number).is_some_and(|entry| entry.stamp == stamp) {
                // Dirty and recent: keep it in the queue for a later pass.
                self.recency.push_back((block_number, stamp));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::meta::zeroed_block;

    #[test]
    fn dirty_blocks_survive_eviction() {
        let mut cache = BlockCache::new(16);
        for block in 0..40u64 {
            let mut buffer = zeroed_block();
            buffer[0] = block as u8;
            if block % 2 == 0 {
                cache.put_dirty(block, BlockKind::DirLeaf, Arc::new(buffer));
            } else {
                cache.insert_clean(block, BlockKind::DirLeaf, Arc::new(buffer));
            }
        }
        assert_eq!(cache.dirty_count(), 20);
        for block in (0..40u64).step_by(2) {
            assert_eq!(cache.get(block, BlockKind::DirLeaf).unwrap()[0], block as u8);
        }
        let images = cache.seal_dirty(&mut |_, _, block| block[1] = 0xAA);
        assert_eq!(images.len(), 20);
        assert!(images.iter().all(|(_, block)| block[1] == 0xAA));
        assert_eq!(cache.dirty_count(), 20, "images leave blocks pinned until they are home");
        // A change after the snapshot copies the block: the image keeps what was sealed.
        cache.modify(0, BlockKind::DirLeaf).unwrap()[1] = 0x55;
        assert_eq!(images[0].1[1], 0xAA);
        assert_eq!(cache.get(0, BlockKind::DirLeaf).unwrap()[1], 0x55);
        assert_eq!(cache.unsealed_dirty_count(), 1, "only the block changed after the seal is new");
        cache.mark_clean_if_unchanged(images.iter().map(|(number, block)| (*number, block)));
        assert_eq!(cache.dirty_count(), 1, "the block changed after the seal holds what the images lack");
        assert_eq!(cache.unsealed_dirty_count(), 1);
        assert_eq!(cache.get(0, BlockKind::DirLeaf).unwrap()[1], 0x55);
        assert!(cache.entries.len() <= 16);
    }

    #[test]
    fn a_clean_insert_into_a_cache_full_of_dirty_blocks_keeps_the_new_block() {
        let mut cache = BlockCache::new(16);
        for block in 0..16u64 {
            cache.put_dirty(block, BlockKind::InodeTable, Arc::new(zeroed_block()));
        }
        cache.insert_clean(100, BlockKind::InodeTable, Arc::new(zeroed_block()));
        assert!(cache.contains(100, BlockKind::InodeTable), "the block just read must stay cached");
        assert!(cache.modify(100, BlockKind::InodeTable).is_some());
    }
}
