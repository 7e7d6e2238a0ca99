//! `TailCache`: the plaintext of the few blocks an [`super::EncryptedDevice`] wrote partially
//! last, so that the next partial write to one of them (the log's header and data rings grow by
//! a few hundred bytes per group commit, a file grows by its appends) changes the bytes in
//! memory instead of reading the block from the device and decrypting it first.
//!
//! Coherence: once every write to a block has completed, an entry for that block holds exactly
//! the plaintext of what the device holds, or there is no entry. Reads never use the cache (the
//! device is the truth; the cache only saves the read of a read-modify-write). The rules:
//!
//! - Every write registers the blocks it covers as in flight before it reaches the device
//!   ([`TailCache::begin_write`]) and unregisters them once the device call returned
//!   ([`TailCache::end_write`]), which drops every entry in its range except those it offered.
//! - Only a partial write that holds its block's read-modify-write lock offers an entry
//!   ([`TailCache::offer`]), with the block's new plaintext, before its device write. The offer
//!   is refused (and any entry dropped) while another write covering that block is in flight.
//!
//! - A read of one whole block may leave its plaintext in a single extra slot
//!   ([`TailCache::note_read`]), kept apart so that reads never push the written blocks out: a
//!   file system checks a block's checksum before it writes part of it, and the write then
//!   needs no read of its own. It is kept only where no write was in flight when the read
//!   started and none began before it ended ([`TailCache::read_ticket`]), so the device held
//!   those bytes all along; writes treat it like any entry.
//!
//! So an entry is made only while no other write to its block is under way and before the
//! offering write reaches the device; any write that starts later either holds the same lock
//! (a partial write, which replaces the entry before its own device write) or drops the entry
//! when it ends. A write whose end is never seen (a batch whose ticket is dropped or fails)
//! disables the cache for good: it is an optimisation, and a stale entry would be wrong bytes.

use std::ops::Range;

use parking_lot::Mutex;
use zeroize::Zeroize;

use crate::block::meta::BLOCK_SIZE;

/// Blocks kept: the log's header block and data block (two where a record crosses a block)
/// and the last blocks of a few files being appended to. 64 KiB of plaintext at most.
pub const CACHED_BLOCKS_MAX: usize = 16;
/// Writes in flight at once above which the cache gives up (it would have to scan them all on
/// each offer): far more than the threads of a mount, so in practice never.
const WRITES_IN_FLIGHT_MAX: usize = 1024;

/// A write registered with [`TailCache::begin_write`]; hand it back to `end_write`.
#[must_use]
pub struct WriteToken {
    id: u64,
}

pub struct TailCache {
    state: Mutex<State>,
}

struct State {
    entries: Vec<Entry>,
    /// The plaintext of the last whole block read (`note_read`), if no write touched it since.
    read_entry: Option<Entry>,
    in_flight: Vec<(u64, Range<u64>)>,
    next_write_id: u64,
    /// Advances on every lookup and offer: the entry with the smallest `last_use` goes first.
    clock: u64,
    disabled: bool,
    hits: u64,
}

struct Entry {
    block_number: u64,
    plaintext: Box<[u8]>,
    last_use: u64,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.plaintext.zeroize();
    }
}

impl State {
    fn overlaps_other_write(&self, id: u64, block_number: u64) -> bool {
        self.in_flight.iter().any(|(other, range)| *other != id && range.contains(&block_number))
    }

    fn remove(&mut self, block_number: u64) {
        self.entries.retain(|entry| entry.block_number != block_number);
        if self.read_entry.as_ref().is_some_and(|entry| entry.block_number == block_number) {
            self.read_entry = None;
        }
    }
}

impl TailCache {
    pub fn new() -> TailCache {
        let state = State {
            entries: Vec::with_capacity(CACHED_BLOCKS_MAX),
            read_entry: None,
            in_flight: Vec::new(),
            next_write_id: 0,
            clock: 0,
            disabled: false,
            hits: 0,
        };
        TailCache { state: Mutex::new(state) }
    }

    /// Registers a write of `blocks` (block numbers) that is about to reach the device.
    pub fn begin_write(&self, blocks: Range<u64>) -> WriteToken {
        assert!(blocks.start < blocks.end);
        let mut state = self.state.lock();
        let id = state.next_write_id;
        state.next_write_id += 1;
        if state.in_flight.len() >= WRITES_IN_FLIGHT_MAX {
            Self::disable_locked(&mut state);
        }
        if !state.disabled {
            state.in_flight.push((id, blocks));
        }
        WriteToken { id }
    }

    /// Copies the cached plaintext of `block_number` into `buffer` (one block); false where it
    /// is not cached. The caller holds the block's read-modify-write lock and has begun its
    /// write, so the entry cannot change before it offers the block's new plaintext.
    pub fn lookup(&self, block_number: u64, buffer: &mut [u8]) -> bool {
        assert_eq!(buffer.len(), BLOCK_SIZE);
        let mut state = self.state.lock();
        state.clock += 1;
        let clock = state.clock;
        let State { entries, read_entry, .. } = &mut *state;
        let found = entries.iter_mut().find(|entry| entry.block_number == block_number);
        let Some(entry) = found.or(read_entry.as_mut().filter(|entry| entry.block_number == block_number)) else {
            return false;
        };
        entry.last_use = clock;
        buffer.copy_from_slice(&entry.plaintext);
        state.hits += 1;
        true
    }

    /// Records `plaintext` as the new contents of `block_number`, which the write `token`
    /// covers and is about to write; the caller holds the block's read-modify-write lock.
    /// Refused (the entry dropped) while another write covering the block is in flight.
    pub fn offer(&self, token: &WriteToken, block_number: u64, plaintext: &[u8]) {
        assert_eq!(plaintext.len(), BLOCK_SIZE);
        let mut state = self.state.lock();
        if state.disabled || state.overlaps_other_write(token.id, block_number) {
            state.remove(block_number);
            return;
        }
        state.clock += 1;
        let clock = state.clock;
        if state.read_entry.as_ref().is_some_and(|entry| entry.block_number == block_number) {
            state.read_entry = None; // it moves among the written blocks
        }
        if let Some(entry) = state.entries.iter_mut().find(|entry| entry.block_number == block_number) {
            entry.plaintext.copy_from_slice(plaintext);
            entry.last_use = clock;
            return;
        }
        if state.entries.len() < CACHED_BLOCKS_MAX {
            let entry = Entry { block_number, plaintext: plaintext.into(), last_use: clock };
            state.entries.push(entry);
            return;
        }
        let victim = state.entries.iter_mut().min_by_key(|entry| entry.last_use).expect("the cache is full");
        victim.block_number = block_number;
        victim.plaintext.copy_from_slice(plaintext);
        victim.last_use = clock;
    }

    /// Ends the write `token` of `blocks`: drops the entries of its blocks but those in
    /// `offered` (all of them where the write failed: the device may hold any mix of old and
    /// new sectors).
    pub fn end_write(&self, token: WriteToken, blocks: Range<u64>, offered: &[u64], succeeded: bool) {
        let mut state = self.state.lock();
        if let Some(index) = state.in_flight.iter().position(|(id, _)| *id == token.id) {
            state.in_flight.swap_remove(index);
        }
        state.entries.retain(|entry| {
            !blocks.contains(&entry.block_number) || (succeeded && offered.contains(&entry.block_number))
        });
        if state.read_entry.as_ref().is_some_and(|entry| blocks.contains(&entry.block_number)) {
            state.read_entry = None;
        }
    }

    /// Before a read of the whole block `block_number`: what to hand to `note_read` after it,
    /// or nothing where a write to the block is in flight (the read may see either side).
    pub fn read_ticket(&self, block_number: u64) -> Option<u64> {
        let state = self.state.lock();
        let busy = state.disabled || state.in_flight.iter().any(|(_, range)| range.contains(&block_number));
        (!busy).then_some(state.next_write_id)
    }

    /// After the read that `read_ticket` gave `ticket` for: keeps `plaintext` as the block's
    /// contents unless some write began since (the device may no longer hold it).
    pub fn note_read(&self, ticket: u64, block_number: u64, plaintext: &[u8]) {
        assert_eq!(plaintext.len(), BLOCK_SIZE);
        let mut state = self.state.lock();
        if state.disabled || state.next_write_id != ticket {
            return;
        }
        if state.entries.iter().any(|entry| entry.block_number == block_number) {
            return; // the same bytes, kept already
        }
        state.clock += 1;
        let last_use = state.clock;
        match &mut state.read_entry {
            Some(entry) => {
                entry.block_number = block_number;
                entry.plaintext.copy_from_slice(plaintext);
                entry.last_use = last_use;
            }
            None => state.read_entry = Some(Entry { block_number, plaintext: plaintext.into(), last_use }),
        }
    }

    /// Drops every entry and makes no more: a write's end can no longer be told.
    pub fn disable(&self) {
        Self::disable_locked(&mut self.state.lock());
    }

    fn disable_locked(state: &mut State) {
        state.disabled = true;
        state.entries.clear();
        state.read_entry = None;
        state.in_flight.clear();
    }

    /// Partial writes that found their block here (tests and statistics).
    pub fn hits(&self) -> u64 {
        self.state.lock().hits
    }

    #[cfg(test)]
    pub fn cached_blocks(&self) -> usize {
        self.state.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(value: u8) -> Vec<u8> {
        vec![value; BLOCK_SIZE]
    }

    #[test]
    fn an_offer_while_another_write_is_in_flight_is_refused() {
        let cache = TailCache::new();
        let aligned = cache.begin_write(10..12);
        let partial = cache.begin_write(11..12);
        cache.offer(&partial, 11, &block(1));
        cache.end_write(partial, 11..12, &[11], true);
        let mut buffer = block(0);
        assert!(!cache.lookup(11, &mut buffer), "the aligned write may land after the partial one");
        cache.end_write(aligned, 10..12, &[], true);
        let partial = cache.begin_write(11..12);
        cache.offer(&partial, 11, &block(2));
        cache.end_write(partial, 11..12, &[11], true);
        assert!(cache.lookup(11, &mut buffer));
        assert_eq!(buffer, block(2));
    }

    #[test]
    fn a_write_that_ends_drops_older_entries_of_its_blocks() {
        let cache = TailCache::new();
        let partial = cache.begin_write(5..6);
        cache.offer(&partial, 5, &block(1));
        let aligned = cache.begin_write(4..8);
        cache.end_write(partial, 5..6, &[5], true);
        cache.end_write(aligned, 4..8, &[], true);
        assert!(!cache.lookup(5, &mut block(0)));
    }

    #[test]
    fn a_failed_write_keeps_nothing() {
        let cache = TailCache::new();
        let partial = cache.begin_write(5..6);
        cache.offer(&partial, 5, &block(1));
        cache.end_write(partial, 5..6, &[5], false);
        assert!(!cache.lookup(5, &mut block(0)));
    }

    #[test]
    fn it_keeps_at_most_its_bound_and_evicts_the_least_recently_used() {
        let cache = TailCache::new();
        for number in 0..(CACHED_BLOCKS_MAX as u64 + 5) {
            let token = cache.begin_write(number..number + 1);
            cache.offer(&token, number, &block(number as u8));
            cache.end_write(token, number..number + 1, &[number], true);
            // Block 0 stays in use, so it is never the victim.
            assert!(cache.lookup(0, &mut block(0)));
        }
        assert_eq!(cache.cached_blocks(), CACHED_BLOCKS_MAX);
        assert!(cache.lookup(0, &mut block(0)));
        assert!(!cache.lookup(1, &mut block(0)));
        let last = CACHED_BLOCKS_MAX as u64 + 4;
        let mut buffer = block(0);
        assert!(cache.lookup(last, &mut buffer));
        assert_eq!(buffer, block(last as u8));
    }

    #[test]
    fn a_read_is_kept_only_where_no_write_began_meanwhile() {
        let cache = TailCache::new();
        let ticket = cache.read_ticket(7).unwrap();
        let elsewhere = cache.begin_write(100..101);
        cache.note_read(ticket, 7, &block(1));
        assert!(!cache.lookup(7, &mut block(0)), "a write began while the block was read");
        assert_eq!(cache.read_ticket(100), None, "a write to the block is in flight");
        cache.end_write(elsewhere, 100..101, &[], true);
        let ticket = cache.read_ticket(7).unwrap();
        cache.note_read(ticket, 7, &block(2));
        let mut buffer = block(0);
        assert!(cache.lookup(7, &mut buffer));
        assert_eq!(buffer, block(2));
        // Any write to it drops it; reads never push out written blocks.
        let aligned = cache.begin_write(6..8);
        cache.end_write(aligned, 6..8, &[], true);
        assert!(!cache.lookup(7, &mut block(0)));
        for number in 0..CACHED_BLOCKS_MAX as u64 {
            let token = cache.begin_write(number + 20..number + 21);
            cache.offer(&token, number + 20, &block(3));
            cache.end_write(token, number + 20..number + 21, &[number + 20], true);
        }
        for number in 0..5 {
            let ticket = cache.read_ticket(number).unwrap();
            cache.note_read(ticket, number, &block(4));
        }
        assert!((20..20 + CACHED_BLOCKS_MAX as u64).all(|number| cache.lookup(number, &mut block(0))));
        assert!(cache.lookup(4, &mut block(0)) && !cache.lookup(3, &mut block(0)));
    }

    #[test]
    fn disabled_it_keeps_nothing() {
        let cache = TailCache::new();
        cache.disable();
        let token = cache.begin_write(1..2);
        cache.offer(&token, 1, &block(1));
        cache.end_write(token, 1..2, &[1], true);
        assert!(!cache.lookup(1, &mut block(0)));
    }
}
