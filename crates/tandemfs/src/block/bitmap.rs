//! Bitmaps of allocated blocks and inodes, held whole in memory and written through to their
//! metadata blocks at checkpoints. A block bitmap keeps two views: `persistent` (what the next
//! checkpoint records: every applied allocation and free) and `available` (what may be handed
//! out now). A freed block leaves `available` only once the checkpoint that records the free is
//! durable: until then a crash could bring back the state in which the block is still in use,
//! and its old contents must still be there.

use super::meta::{BlockKind, BLOCK_SIZE, META_PAYLOAD_BYTES};
use super::superblock::BITS_PER_BITMAP_BLOCK;
use crate::error::{Error, Result};
use std::collections::BTreeSet;

const WORDS_PER_BITMAP_BLOCK: usize = META_PAYLOAD_BYTES / 8;

/// The summary levels of a bitmap of `words` words in which every word has bits to hand out:
/// only the bits for words past the end of each level's children are set.
fn empty_summary(words: usize) -> Vec<Vec<u64>> {
    let mut levels = Vec::new();
    let mut children = words;
    // Bounded: each level has 64 times fewer words than the one below, down to one.
    loop {
        let length = children.div_ceil(64).max(1);
        let mut level = vec![0u64; length];
        if children < length * 64 {
            // Children past the end never have a bit to hand out.
            let first_past = children % 64;
            level[length - 1] = if first_past == 0 { u64::MAX } else { !0u64 << first_past };
        }
        let done = length == 1;
        levels.push(level);
        if done {
            return levels;
        }
        children = length;
    }
}

pub struct Bitmap {
    /// Bits that the next checkpoint writes.
    persistent: Vec<u64>,
    /// Bits that allocation must not hand out (persistent plus frees not yet checkpointed).
    available: Vec<u64>,
    /// A tree of summaries over `available` for the search, in memory only (rebuilt from the
    /// bitmap blocks at mount, as `available` is). Level 0 has one bit per word of `available`,
    /// set when that word has no bit left to hand out; level `k + 1` one bit per word of level
    /// `k`, set when all 64 bits of that word are set; bits for words past the end of the level
    /// below are set; the last level is one word. A search from a hint finds the next word with
    /// a free bit in O(log₆₄ n) looks (`next_clear`): 3 levels on an 8 GiB volume, 4 up to
    /// 512 TiB. Kept in step by `note_word` after every change of an `available` word.
    summary: Vec<Vec<u64>>,
    bit_count: u64,
    /// Bitmap blocks (by index within the bitmap region) changed since the last checkpoint.
    dirty_blocks: BTreeSet<u64>,
    /// Freed but not yet reusable: (lsn of the freeing record, first bit, count).
    pending_frees: Vec<(u64, u64, u64)>,
    /// Bits in `pending_frees`.
    pending_free_total: u64,
    free_count: u64,
    cursor: u64,
    /// Where the next metadata block is looked for (`allocate_meta`), within the metadata zone.
    meta_cursor: u64,
    /// Whether metadata blocks come from their own zone (`set_metadata_zone`: volumes on
    /// erasure-coded arrays); otherwise `allocate_meta` is `allocate` of one bit.
    metadata_zone: bool,
    pub kind: BlockKind,
}

impl Bitmap {
    pub fn new(bit_count: u64, kind: BlockKind) -> Bitmap {
        let words = bit_count.div_ceil(64) as usize;
        let mut bitmap = Bitmap {
            persistent: vec![0; words],
            available: vec![0; words],
            summary: empty_summary(words),
            bit_count,
            dirty_blocks: BTreeSet::new(),
            pending_frees: Vec::new(),
            pending_free_total: 0,
            free_count: bit_count,
            cursor: 0,
            meta_cursor: 0,
            metadata_zone: false,
            kind,
        };
        // Bits past the end of the last word are never free.
        let tail_bits = bit_count % 64;
        if tail_bits != 0 {
            let mask = !0u64 << tail_bits;
            *bitmap.persistent.last_mut().unwrap() |= mask;
            *bitmap.available.last_mut().unwrap() |= mask;
            bitmap.note_word(words - 1);
        }
        bitmap
    }

    /// Brings the summary bits above `available` word `word` in step with the word, level by
    /// level, stopping at the first level whose word keeps its fullness.
    #[inline]
    fn note_word(&mut self, word: usize) {
        let mut index = word;
        let mut full = self.available[word] == u64::MAX;
        for level in self.summary.iter_mut() {
            let (slot, mask) = (index / 64, 1u64 << (index % 64));
            let before = level[slot];
            let after = if full { before | mask } else { before & !mask };
            level[slot] = after;
            if (before == u64::MAX) == (after == u64::MAX) {
                return;
            }
            full = after == u64::MAX;
            index = slot;
        }
    }

    /// The first word at or after `word` that has a bit to hand out, by the summary.
    fn next_open_word(&self, word: usize) -> Option<usize> {
        let open = self.next_clear(0, word)?;
        debug_assert!(open < self.available.len() && self.available[open] != u64::MAX);
        Some(open)
    }

    /// The first index at or after `from` whose bit is clear in summary level `level`: a look
    /// at `from`'s word, else the next open word of this level found one level up, so at most
    /// two looks per level (recursion bounded by the levels, at most 11 for 2^64 bits).
    fn next_clear(&self, level: usize, from: usize) -> Option<usize> {
        let bits = &self.summary[level];
        let slot = from / 64;
        let word = *bits.get(slot)? | ((1u64 << (from % 64)) - 1);
        if word != u64::MAX {
            return Some(slot * 64 + (!word).trailing_zeros() as usize);
        }
        if level + 1 == self.summary.len() {
            return None;
        }
        let next_slot = self.next_clear(level + 1, slot + 1)?;
        // A clear bit one level up names a word of this level that exists and is not full.
        Some(next_slot * 64 + (!bits[next_slot]).trailing_zeros() as usize)
    }

    pub fn bit_count(&self) -> u64 {
        self.bit_count
    }
    pub fn free_count(&self) -> u64 {
        self.free_count
    }
    pub fn is_set(&self, bit: u64) -> bool {
        assert!(bit < self.bit_count);
        self.persistent[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }
    pub fn is_available(&self, bit: u64) -> bool {
        bit < self.bit_count && self.available[(bit / 64) as usize] & (1 << (bit % 64)) == 0
    }

    fn mark_dirty(&mut self, first: u64, count: u64) {
        let first_block = first / BITS_PER_BITMAP_BLOCK;
        let last_block = (first + count - 1) / BITS_PER_BITMAP_BLOCK;
        for block in first_block..=last_block {
            self.dirty_blocks.insert(block);
        }
    }

    /// Marks `[first, first + count)` allocated in both views. Every bit must be available.
    pub fn set_range(&mut self, first: u64, count: u64) {
        assert!(count > 0 && first + count <= self.bit_count);
        let mut bit = first;
        // Bounded by `count`: each pass sets the rest of one word.
        while bit < first + count {
            let (word, shift) = ((bit / 64) as usize, bit % 64);
            let width = (64 - shift).min(first + count - bit);
            let mask = (u64::MAX >> (64 - width)) << shift;
            assert!(
                self.available[word] & mask == 0,
                "bit {} allocated twice",
                bit + (self.available[word] & mask).trailing_zeros() as u64 - shift
            );
            self.available[word] |= mask;
            self.persistent[word] |= mask;
            self.note_word(word);
            bit += width;
        }
        self.free_count -= count;
        self.mark_dirty(first, count);
    }

    /// Records the free of `[first, first + count)` by the record `lsn`. The bits become
    /// available after `release_checkpointed(lsn)`. Freeing a free bit is corruption (a block
    /// referenced twice), reported rather than asserted because the reference came from disk.
    pub fn free_range(&mut self, first: u64, count: u64, lsn: u64) -> Result<()> {
        if count == 0 || first.checked_add(count).is_none_or(|end| end > self.bit_count) {
            return Err(Error::corruption(format!("{:?}: free of {count} at {first} is out of range", self.kind)));
        }
        for bit in first..first + count {
            if !self.is_set(bit) {
                return Err(Error::corruption(format!("{:?}: bit {bit} freed while not allocated", self.kind)));
            }
        }
        for bit in first..first + count {
            self.persistent[(bit / 64) as usize] &= !(1u64 << (bit % 64));
        }
        self.mark_dirty(first, count);
        self.pending_frees.push((lsn, first, count));
        self.pending_free_total += count;
        Ok(())
    }

    /// Frees immediately in both views: for state that never reached a checkpoint (the front
    /// end's inode numbers, which are reused only in log order).
    pub fn free_now(&mut self, first: u64, count: u64) {
        for bit in first..first + count {
            let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
            assert!(self.available[word] & mask != 0);
            self.available[word] &= !mask;
            self.persistent[word] &= !mask;
            self.note_word(word);
        }
        self.free_count += count;
        self.mark_dirty(first, count);
    }

    /// The checkpoint covering every record up to `lsn` is durable: frees up to it are reusable.
    pub fn release_checkpointed(&mut self, lsn: u64) {
        let mut released = 0;
        let mut index = 0;
        while index < self.pending_frees.len() {
            let (free_lsn, first, count) = self.pending_frees[index];
            if free_lsn <= lsn {
                for bit in first..first + count {
                    let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
                    // A bit may have been freed, then allocated again is impossible (not
                    // available), so it is still marked unavailable here.
                    debug_assert!(self.available[word] & mask != 0);
                    if self.persistent[word] & mask == 0 {
                        self.available[word] &= !mask;
                        self.note_word(word);
                        released += 1;
                    }
                }
                self.pending_frees.swap_remove(index);
                self.pending_free_total -= count;
            } else {
                index += 1;
            }
        }
        self.free_count += released;
    }

    /// Frees not yet reusable, in bits.
    pub fn pending_free_count(&self) -> u64 {
        self.pending_free_total
    }

    /// Finds up to `count` contiguous available bits, preferring `near`, and allocates them.
    /// Returns (first, count given) or `NoSpace`.
    pub fn allocate(&mut self, near: u64, count: u64, floor: u64) -> Result<(u64, u64)> {
        assert!(count > 0);
        let start = if near >= floor && near < self.bit_count { near } else { self.cursor.max(floor) };
        let first = self.find_available(start, floor).ok_or(Error::NoSpace)?;
        let length = self.available_run(first, count);
        self.set_range(first, length);
        self.cursor = first + length;
        Ok((first, length))
    }

    /// Metadata blocks from their own zone (`allocate_meta`) or among the data.
    pub fn set_metadata_zone(&mut self, zone: bool) {
        self.metadata_zone = zone;
    }

    /// Allocates one bit for a metadata block (directory, extent-tree and xattr blocks) in the
    /// *metadata zone*, the last eighth of the bits from `floor` on: from `near` when it lies
    /// there (a directory's next block near its last one), else from where the last metadata
    /// block was taken. File data is allocated from the front (`allocate`, whose cursor this
    /// does not move), so metadata blocks lie together instead of one between every few data
    /// blocks. That is for erasure-coded arrays: a checkpoint writes its images of changed
    /// metadata blocks home, and spread out, each one leaves a stripe partial (its other rows
    /// read, partial parity logged); together, a checkpoint's images fill stripes
    /// (docs/RAID.md, *Held home writes*). When the zone is full the search goes on from
    /// `floor`, like any allocation. Returns the bit or `NoSpace`.
    pub fn allocate_meta(&mut self, near: u64, floor: u64) -> Result<u64> {
        if !self.metadata_zone {
            return self.allocate(near, 1, floor).map(|(first, _)| first);
        }
        let zone = floor + self.bit_count.saturating_sub(floor) / 8 * 7;
        let start = if near >= zone && near < self.bit_count { near } else { self.meta_cursor.max(zone) };
        let first = self.find_available(start.min(self.bit_count), floor).ok_or(Error::NoSpace)?;
        self.set_range(first, 1);
        self.meta_cursor = first + 1;
        Ok(first)
    }

    /// Claims up to `count` contiguous available bits, preferring `near`, for a direct write
    /// (`FileSystem::write` of a large range): they leave `available`, so nothing else is
    /// handed them, but not `persistent`, so no checkpoint records them. A crash forgets the
    /// claim and the bits are free again; the record that maps them takes them
    /// (`take_claimed`). The free count is not moved: the front end's reservation covers the
    /// bits until they are taken. Returns (first, count given) or `NoSpace`.
    pub fn claim(&mut self, near: u64, count: u64, floor: u64) -> Result<(u64, u64)> {
        assert!(count > 0);
        let start = if near >= floor && near < self.bit_count { near } else { self.cursor.max(floor) };
        let first = self.find_available(start, floor).ok_or(Error::NoSpace)?;
        let length = self.available_run(first, count);
        self.set_available(first, length, true);
        self.cursor = first + length;
        Ok((first, length))
    }

    /// Claims exactly `[first, first + count)` (replay: the blocks of direct-write records
    /// after the checkpoint, before any record is replayed). A bit not available is corruption:
    /// a direct write only ever claims blocks the checkpoint holds free.
    pub fn claim_exact(&mut self, first: u64, count: u64) -> Result<()> {
        if count == 0 || first.checked_add(count).is_none_or(|end| end > self.bit_count) {
            return Err(Error::corruption(format!("{:?}: claim of {count} at {first} is out of range", self.kind)));
        }
        if let Some(bit) = (first..first + count).find(|bit| !self.is_available(*bit)) {
            return Err(Error::corruption(format!("{:?}: bit {bit} claimed by a direct write is in use", self.kind)));
        }
        self.set_available(first, count, true);
        Ok(())
    }

    /// Gives back a claim that no record will take (the direct write failed).
    pub fn unclaim(&mut self, first: u64, count: u64) {
        assert!(count > 0 && first + count <= self.bit_count);
        assert!(
            (first..first + count).all(|bit| !self.is_available(bit) && !self.is_set(bit)),
            "unclaim of bits not claimed"
        );
        self.set_available(first, count, false);
    }

    /// Makes claimed bits allocated: the record that maps them is being applied. Every bit must
    /// be claimed (unavailable and not persistent); anything else is corruption.
    pub fn take_claimed(&mut self, first: u64, count: u64) -> Result<()> {
        if count == 0 || first.checked_add(count).is_none_or(|end| end > self.bit_count) {
            return Err(Error::corruption(format!("{:?}: take of {count} at {first} is out of range", self.kind)));
        }
        if let Some(bit) = (first..first + count).find(|bit| self.is_available(*bit) || self.is_set(*bit)) {
            return Err(Error::corruption(format!(
                "{:?}: bit {bit} mapped by a direct write was not claimed for it",
                self.kind
            )));
        }
        for bit in first..first + count {
            self.persistent[(bit / 64) as usize] |= 1u64 << (bit % 64);
        }
        self.free_count -= count;
        self.mark_dirty(first, count);
        Ok(())
    }

    /// Sets (or clears) `[first, first + count)` in `available` alone, a word at a time.
    fn set_available(&mut self, first: u64, count: u64, set: bool) {
        let mut bit = first;
        // Bounded by `count`: each pass covers the rest of one word.
        while bit < first + count {
            let (word, shift) = ((bit / 64) as usize, bit % 64);
            let width = (64 - shift).min(first + count - bit);
            let mask = (u64::MAX >> (64 - width)) << shift;
            if set {
                self.available[word] |= mask;
            } else {
                self.available[word] &= !mask;
            }
            self.note_word(word);
            bit += width;
        }
    }

    /// How many bits from `first` (available) on are available, at most `limit`: a word at a
    /// time, so a run of 32,768 blocks costs 512 looks, not 32,768.
    fn available_run(&self, first: u64, limit: u64) -> u64 {
        let mut length = 0;
        // Bounded by `limit`: each pass either ends the run or moves to the next word.
        while length < limit && first + length < self.bit_count {
            let bit = first + length;
            let rest_of_word = 64 - bit % 64;
            // Bits past the end are set in the last word, so the run stops at the end.
            let free = (self.available[(bit / 64) as usize] >> (bit % 64)).trailing_zeros() as u64;
            length += free.min(rest_of_word);
            if free < rest_of_word {
                break;
            }
        }
        length.min(limit)
    }

    /// The first available bit at or after `start`, wrapping around to `floor`. Past the word
    /// of `start`, the summary tree names the next word with a free bit in O(log n) looks, so a
    /// search from a hint deep inside a used stretch costs the same on any volume size (it used
    /// to scan the words, then one summary level: up to 512 summary words at 8 GiB).
    fn find_available(&self, start: u64, floor: u64) -> Option<u64> {
        let search = |from: u64, to: u64| -> Option<u64> {
            let mut bit = from;
            // At most two passes: the word of `from`, then the open word the summary names.
            while bit < to {
                let word_index = (bit / 64) as usize;
                let word = self.available[word_index] | ((1u64 << (bit % 64)) - 1);
                if word != u64::MAX {
                    let found = word_index as u64 * 64 + (!word).trailing_zeros() as u64;
                    return (found < to).then_some(found);
                }
                bit = self.next_open_word(word_index + 1)? as u64 * 64;
            }
            None
        };
        search(start, self.bit_count).or_else(|| search(floor, start.min(self.bit_count)))
    }

    pub fn bitmap_blocks(&self) -> u64 {
        self.bit_count.div_ceil(BITS_PER_BITMAP_BLOCK)
    }

    /// The payload of bitmap block `index` from the persistent view.
    pub fn encode_block(&self, index: u64) -> Box<[u8; BLOCK_SIZE]> {
        let mut block = Box::new([0u8; BLOCK_SIZE]);
        let first_word = index as usize * WORDS_PER_BITMAP_BLOCK;
        for slot in 0..WORDS_PER_BITMAP_BLOCK {
            if let Some(word) = self.persistent.get(first_word + slot) {
                block[slot * 8..slot * 8 + 8].copy_from_slice(&word.to_le_bytes());
            }
        }
        block
    }

    /// Loads bitmap block `index` (already checksum-verified) into both views.
    pub fn decode_block(&mut self, index: u64, block: &[u8; BLOCK_SIZE]) -> Result<()> {
        let first_word = index as usize * WORDS_PER_BITMAP_BLOCK;
        for slot in 0..WORDS_PER_BITMAP_BLOCK {
            let word_index = first_word + slot;
            let word = u64::from_le_bytes(block[slot * 8..slot * 8 + 8].try_into().unwrap());
            if word_index >= self.persistent.len() {
                if word != 0 {
                    return Err(Error::corruption(format!("{:?} block {index}: bits set past the end", self.kind)));
                }
                continue;
            }
            let tail_mask = if word_index == self.persistent.len() - 1 && !self.bit_count.is_multiple_of(64) {
                !0u64 << (self.bit_count % 64)
            } else {
                0
            };
            if word & tail_mask != tail_mask {
                return Err(Error::corruption(format!("{:?} block {index}: bits past the end are clear", self.kind)));
            }
            let old = self.persistent[word_index];
            self.persistent[word_index] = word;
            self.available[word_index] = word;
            self.note_word(word_index);
            self.free_count =
                self.free_count + (old & !tail_mask).count_ones() as u64 - (word & !tail_mask).count_ones() as u64;
        }
        Ok(())
    }

    /// Bitmap blocks changed since the last `take_dirty_blocks`.
    pub fn dirty_block_count(&self) -> u64 {
        self.dirty_blocks.len() as u64
    }

    pub fn take_dirty_blocks(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.dirty_blocks).into_iter().collect()
    }
    pub fn mark_all_dirty(&mut self) {
        for index in 0..self.bitmap_blocks() {
            self.dirty_blocks.insert(index);
        }
    }

    /// Allocated bits of the persistent view, for fsck.
    pub fn iter_set(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.bit_count).filter(move |bit| self.is_set(*bit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// `find_available` without the summary: every word from `start`, then from `floor`.
    fn naive_find(bitmap: &Bitmap, start: u64, floor: u64) -> Option<u64> {
        (start..bitmap.bit_count).chain(floor..start.min(bitmap.bit_count)).find(|bit| bitmap.is_available(*bit))
    }

    /// Every summary level against the level below it, recomputed from scratch.
    fn check_summary(bitmap: &Bitmap) {
        let mut below: Vec<bool> = bitmap.available.iter().map(|bits| *bits == u64::MAX).collect();
        for (level, words) in bitmap.summary.iter().enumerate() {
            for (index, word) in words.iter().enumerate() {
                for bit in 0..64 {
                    let child = index * 64 + bit;
                    let expected = below.get(child).copied().unwrap_or(true);
                    assert_eq!(word & (1 << bit) != 0, expected, "summary level {level} bit {child}");
                }
            }
            below = words.iter().map(|bits| *bits == u64::MAX).collect();
        }
        assert_eq!(bitmap.summary.last().unwrap().len(), 1, "the last level is one word");
    }

    /// The summary skips only what the plain scan would have passed over: random allocations,
    /// frees, releases and loads, each followed by searches from random places, against a scan
    /// of every bit.
    #[test]
    fn the_summary_finds_what_a_scan_finds() {
        for seed in 0..8u64 {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let bit_count = rng.gen_range(1..300_000u64);
            let mut bitmap = Bitmap::new(bit_count, BlockKind::BlockBitmap);
            let mut lsn = 1;
            for _ in 0..400 {
                match rng.gen_range(0..4) {
                    0 | 1 => {
                        let near = rng.gen_range(0..bit_count);
                        let count = rng.gen_range(1..5_000);
                        if let Ok((first, given)) = bitmap.allocate(near, count, 0) {
                            assert!(given >= 1 && first + given <= bit_count);
                        }
                    }
                    2 => {
                        let first = rng.gen_range(0..bit_count);
                        let count = rng.gen_range(1..=(bit_count - first).min(3_000));
                        if (first..first + count).all(|bit| bitmap.is_set(bit)) {
                            bitmap.free_range(first, count, lsn).unwrap();
                            lsn += 1;
                        }
                    }
                    _ => bitmap.release_checkpointed(rng.gen_range(0..=lsn)),
                }
                check_summary(&bitmap);
                for _ in 0..8 {
                    let (start, floor) = (rng.gen_range(0..bit_count), rng.gen_range(0..bit_count));
                    assert_eq!(bitmap.find_available(start, floor), naive_find(&bitmap, start, floor), "seed {seed}");
                }
            }
            // Loading the blocks rebuilds the summary too.
            let mut copy = Bitmap::new(bit_count, BlockKind::BlockBitmap);
            for index in 0..bitmap.bitmap_blocks() {
                copy.decode_block(index, &bitmap.encode_block(index)).unwrap();
            }
            check_summary(&copy);
        }
    }

    /// A bitmap with four summary levels (64^4 + 77 bits) that is full but for a few bits
    /// far apart: every search from anywhere finds the next of them (or wraps to the first).
    #[test]
    fn the_summary_tree_finds_far_free_bits() {
        let bit_count = 64u64.pow(4) + 77;
        let mut bitmap = Bitmap::new(bit_count, BlockKind::BlockBitmap);
        assert_eq!(bitmap.summary.len(), 4);
        let open = [3u64, 64u64.pow(3) + 5, 64u64.pow(4) - 1, 64u64.pow(4) + 70];
        let mut from = 0;
        for bit in open {
            if bit > from {
                bitmap.set_range(from, bit - from);
            }
            from = bit + 1;
        }
        bitmap.set_range(from, bit_count - from);
        check_summary(&bitmap);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for _ in 0..2_000 {
            let start = rng.gen_range(0..bit_count);
            let expected = open.iter().copied().find(|bit| *bit >= start).unwrap_or(open[0]);
            assert_eq!(bitmap.find_available(start, 0), Some(expected), "from {start}");
        }
        for bit in open {
            assert_eq!(bitmap.allocate(bit.saturating_sub(1_000), 10, 0).unwrap(), (bit, 1));
        }
        check_summary(&bitmap);
        assert!(matches!(bitmap.allocate(0, 1, 0), Err(Error::NoSpace)));
        bitmap.free_now(64u64.pow(3), 200);
        check_summary(&bitmap);
        assert_eq!(bitmap.allocate(5, 1_000, 0).unwrap(), (64u64.pow(3), 200), "a run ends at the first used bit");
    }

    /// A claim (a direct write's blocks) is out of the allocator's view and in no checkpoint's;
    /// taken, it is allocated in both; given back, free again. A free bit that a pending free
    /// still holds cannot be claimed, and a take of bits not claimed is corruption.
    #[test]
    fn claims_are_unavailable_unrecorded_then_taken_or_given_back() {
        let mut bitmap = Bitmap::new(1000, BlockKind::BlockBitmap);
        bitmap.set_range(0, 10);
        let _ = bitmap.take_dirty_blocks();
        let (first, count) = bitmap.claim(0, 100, 10).unwrap();
        assert_eq!((first, count), (10, 100));
        assert!(!bitmap.is_available(50) && !bitmap.is_set(50));
        assert_eq!(bitmap.free_count(), 990, "the reservation covers a claim, not the free count");
        assert_eq!(bitmap.dirty_block_count(), 0, "no checkpoint records a claim");
        assert_eq!(bitmap.allocate(0, 5, 10).unwrap(), (110, 5), "the allocator passes claimed bits by");
        bitmap.take_claimed(10, 60).unwrap();
        assert!(bitmap.is_set(10) && bitmap.is_set(69) && !bitmap.is_set(70));
        assert_eq!(bitmap.free_count(), 925);
        assert!(bitmap.dirty_block_count() > 0);
        bitmap.unclaim(70, 40);
        assert!(bitmap.is_available(70) && bitmap.is_available(109));
        assert!(bitmap.take_claimed(70, 1).unwrap_err().is_corruption(), "given back, not claimed");
        assert!(bitmap.take_claimed(10, 1).unwrap_err().is_corruption(), "taken already");
        // Replay's exact claims: only available bits.
        bitmap.free_range(10, 5, 7).unwrap();
        assert!(bitmap.claim_exact(10, 1).unwrap_err().is_corruption(), "a free waiting for its checkpoint");
        assert!(bitmap.claim_exact(200, 10).is_ok());
        assert!(bitmap.claim_exact(205, 10).unwrap_err().is_corruption(), "claimed twice");
        assert!(bitmap.claim_exact(995, 10).unwrap_err().is_corruption(), "past the end");
        bitmap.take_claimed(200, 10).unwrap();
        assert!(bitmap.is_set(209));
    }

    #[test]
    fn allocate_free_release() {
        let mut bitmap = Bitmap::new(1000, BlockKind::BlockBitmap);
        bitmap.set_range(0, 10);
        assert_eq!(bitmap.free_count(), 990);
        let (first, count) = bitmap.allocate(0, 20, 10).unwrap();
        assert_eq!((first, count), (10, 20));
        bitmap.free_range(10, 20, 5).unwrap();
        assert!(!bitmap.is_set(10));
        assert!(!bitmap.is_available(10), "freed bits wait for the checkpoint");
        assert_eq!(bitmap.free_count(), 970);
        bitmap.release_checkpointed(4);
        assert!(!bitmap.is_available(10));
        bitmap.release_checkpointed(5);
        assert!(bitmap.is_available(10));
        assert_eq!(bitmap.free_count(), 990);
        assert!(bitmap.free_range(10, 1, 6).unwrap_err().is_corruption());
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut bitmap = Bitmap::new(70_000, BlockKind::BlockBitmap);
        bitmap.set_range(5, 40_000);
        let mut copy = Bitmap::new(70_000, BlockKind::BlockBitmap);
        for index in 0..bitmap.bitmap_blocks() {
            copy.decode_block(index, &bitmap.encode_block(index)).unwrap();
        }
        assert_eq!(copy.free_count(), bitmap.free_count());
        assert!(copy.is_set(5) && copy.is_set(40_004) && !copy.is_set(40_005));
    }

    #[test]
    fn exhaustion_is_no_space() {
        let mut bitmap = Bitmap::new(64, BlockKind::BlockBitmap);
        bitmap.allocate(0, 64, 0).unwrap();
        assert!(matches!(bitmap.allocate(0, 1, 0), Err(Error::NoSpace)));
    }

    /// Metadata blocks come from the last eighth of the bits past the floor and file data from
    /// the front, neither moving the other's cursor, so a run of data allocations is not cut
    /// by the directory and extent blocks made between them (on an array, a checkpoint's
    /// metadata images then fill stripes instead of leaving one partial each). A `near` inside
    /// the zone is followed; a full zone goes on from the floor.
    #[test]
    fn metadata_blocks_come_from_their_own_zone_and_data_runs_stay_whole() {
        let mut bitmap = Bitmap::new(1000, BlockKind::BlockBitmap);
        bitmap.set_metadata_zone(true);
        let floor = 200;
        let zone = floor + (1000 - floor) / 8 * 7;
        let mut data = Vec::new();
        let mut meta = Vec::new();
        for _ in 0..10 {
            data.push(bitmap.allocate(0, 4, floor).unwrap());
            meta.push(bitmap.allocate_meta(0, floor).unwrap());
        }
        assert_eq!(data, (0..10).map(|run| (floor + 4 * run, 4)).collect::<Vec<_>>());
        assert_eq!(meta, (0..10).map(|index| zone + index).collect::<Vec<_>>());
        // A near in the zone is followed; one outside it is not.
        assert_eq!(bitmap.allocate_meta(zone + 50, floor).unwrap(), zone + 50);
        assert_eq!(bitmap.allocate_meta(floor + 3, floor).unwrap(), zone + 51);
        // The zone full: the search goes on from the floor, past the data.
        let mut below_zone = 0;
        while let Ok(bit) = bitmap.allocate_meta(0, floor) {
            assert!(bit >= floor);
            below_zone += u64::from(bit < zone);
            assert!(below_zone <= 1000, "the search never ended");
        }
        assert_eq!(below_zone, zone - floor - 40);
        assert_eq!(bitmap.free_count(), floor, "only the bits below the floor are left");
    }
}
