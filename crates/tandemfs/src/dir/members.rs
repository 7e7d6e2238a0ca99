//! The writers' region index (issue 7): the back end inserts and removes names through `find`,
//! which walked the name's whole region record by record (about 95 records per insert in a full
//! region; `perf`: 45% of the apply workers' time). Here each region a writer met is kept as its
//! members' (key, position) pairs in list order, so that an insert, remove or replace bisects
//! them and then reads only the records it uses: the dummy, the predecessor, the successor and
//! the entries of the name's hash. Nothing on disk changes.
//!
//! A region's pairs are trusted only while the leaves its walk read are the very buffers it read
//! then: a region keeps each leaf's buffer (`SharedBlock`, shared with the block cache) and is
//! used only if the session reads the same buffer again (`Arc::ptr_eq`). Buffers are
//! copy-on-write everywhere (`Arc::make_mut`), and the region's own reference keeps an old
//! buffer alive so its address cannot be reused; so the same buffer is the same bytes, and the
//! walk, a function of those bytes, would find what the pairs say. A change of a leaf by anyone
//! else (another volume, fsck, a checkpoint's seal, a record the back end threw away) gives a new
//! buffer and the region is walked again. What is read is still checked: the records used are
//! compared with the pairs (kind, key, name, links) and a mismatch falls back to the walk.
//!
//! The writers keep their regions current themselves (`Regions::finish`, before the commit): a
//! plain insert, remove or replace updates its region's pairs and takes the buffers it wrote; a
//! region the operation did not update but whose leaf it changed keeps its pairs if none of its
//! records was written (another region's entry placed in free slots of a shared leaf), else it
//! is dropped; splits, merges and compactions drop what they touch, and the next operation on
//! those regions walks them again. An operation that fails, or whose commit fails, puts nothing
//! back: the directory's regions are dropped with it.
//!
//! The cache is one per process, by directory (the block of its first leaf, which a directory
//! keeps for its life) and then by the position of a region's dummy; a directory is taken out
//! for the length of one operation (the back end applies one record at a time to a directory),
//! so workers never share a region. `docs/DIRECTORIES.md` gives the bytes per entry.

use super::format::*;
use super::session::{Changed, Session};
use super::{block_of, check_key_order, check_next_region, check_region_count, index, note_leaf, DirRoot, Found};
use crate::block::meta::{BlockBuf, SharedBlock};
use crate::error::{Error, Result};
use crate::FastHashMap;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Regions the process keeps at most (all directories together): at 16 bytes per member and
/// about 190 members per region, about 25 MiB of pairs when full.
pub const CACHED_REGIONS_MAX: usize = 8192;
/// Regions one directory keeps at most, so that one huge directory leaves room for others.
const DIRECTORY_REGIONS_MAX: usize = CACHED_REGIONS_MAX / 2;
/// Members a kept region holds at most: regions split at `REGION_SPLIT_ENTRIES`; a larger one
/// (a region of one hash, or damage) is walked rather than kept.
const MEMBERS_MAX: usize = 2 * REGION_SPLIT_ENTRIES as usize;
/// Leaves a kept region reads at most (compaction keeps a region in few leaves): bounds the
/// buffers a region pins.
const LEAVES_MAX: usize = 16;
/// Shards of the process's cache, by directory.
const SHARD_COUNT: usize = 16;

/// One region as a full walk from its dummy read it, kept current by the writers.
pub(super) struct Members {
    region_hash: u32,
    dummy: u64,
    /// (key, position) of the region's entries in list order: ascending keys (checked).
    entries: Vec<(u64, u64)>,
    /// The record after the last entry: the next region's dummy, or 0 at the end of the list.
    next: u64,
    next_region_hash: Option<u32>,
    /// The leaves the walk reads (of the dummy, the entries and `next`), each with the buffer.
    leaves: Vec<Leaf>,
}

/// A leaf a region's walk reads.
struct Leaf {
    block: u64,
    /// The buffer as read or committed; None for a leaf an operation just put a record in (it
    /// takes the session's buffer at `Regions::finish`).
    buffer: Option<SharedBlock>,
    /// The region's records in it (its dummy, entries, and the next dummy): at 0 the region no
    /// longer reads it.
    records: u32,
}

impl Members {
    /// Whether the change of a record may change what the region's walk reads: a record of a
    /// key in the region's range (its dummy, its entries: their keys are checked to lie in it
    /// when walked, and keys never change in place), or the next dummy beyond a change of its
    /// count (which the walk does not read).
    fn touched_by(&self, change: &Changed) -> bool {
        let first_key = make_key(self.region_hash, 0);
        let end_key = self.next_region_hash.map_or(u64::MAX, |next| make_key(next, 0));
        (first_key..end_key).contains(&change.key)
            || change.position == self.dummy
            || change.position == self.next && !change.count_only
    }
}

/// What the cache did, for tests and `docs/BENCHMARKS.md`.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterCacheCounts {
    /// Operations whose region was found current.
    pub hits: u64,
    /// Regions walked in full to be kept (first use, or after a change by someone else).
    pub built: u64,
    /// Regions whose records did not match their pairs (then the walk answered).
    pub mismatched: u64,
    /// Regions that kept their pairs through another region's change of a shared leaf.
    pub kept: u64,
    /// Regions dropped because an operation changed their records without updating them.
    pub dropped: u64,
}

/// The regions of one directory, as taken out of the cache for one operation.
#[derive(Default)]
pub(super) struct Regions {
    enabled: bool,
    regions: FastHashMap<u64, Members>,
    /// Leaf → dummies of the kept regions that read it.
    readers: FastHashMap<u64, Vec<u64>>,
    /// Regions this operation updated itself (see `finish`).
    updated: Vec<u64>,
    counts: WriterCacheCounts,
}

impl Regions {
    /// Regions that keep nothing: every `find` walks (the cache off).
    pub fn disabled() -> Regions {
        Regions::default()
    }

    fn add(&mut self, members: Members) {
        assert!(!self.regions.contains_key(&members.dummy));
        for leaf in &members.leaves {
            self.readers.entry(leaf.block).or_default().push(members.dummy);
        }
        self.regions.insert(members.dummy, members);
    }

    fn unread(&mut self, leaf: u64, dummy: u64) {
        if let Some(readers) = self.readers.get_mut(&leaf) {
            readers.retain(|reader| *reader != dummy);
            if readers.is_empty() {
                self.readers.remove(&leaf);
            }
        }
    }

    fn take(&mut self, dummy: u64) -> Option<Members> {
        let members = self.regions.remove(&dummy)?;
        for leaf in &members.leaves {
            self.unread(leaf.block, dummy);
        }
        Some(members)
    }

    /// `super::find` through the kept region of `hash`: the same answer from the pairs, the
    /// records they name checked; a walk where the region is not current or does not match.
    pub fn find(&mut self, session: &mut Session, root: &DirRoot, hash: u32, name: &[u8]) -> Result<Found> {
        if !self.enabled {
            return super::find(session, root, hash, name);
        }
        let (region_hash, dummy) = index::find_region(session, root, hash)?;
        let current = match self.regions.get(&dummy) {
            Some(members) => members.region_hash == region_hash && leaves_current(session, members)?,
            None => false,
        };
        if current {
            self.counts.hits += 1;
        } else {
            self.take(dummy);
            if self.regions.len() < DIRECTORY_REGIONS_MAX {
                if let Some(members) = walk(session, region_hash, dummy)? {
                    self.counts.built += 1;
                    self.add(members);
                }
            }
        }
        if let Some(members) = self.regions.get(&dummy) {
            if let Some(found) = found_in(session, members, hash, name)? {
                return Ok(found);
            }
            self.counts.mismatched += 1;
            self.take(dummy);
        }
        super::find(session, root, hash, name)
    }

    /// Fills in the leaves of `found` that a walk would have noted (`Found::pairs_walked`): the
    /// dummy's, those of the entries up to and with the one it stops at, and the next dummy's
    /// where it gets that far.
    pub fn walked_leaves(&self, found: &mut Found) {
        let Some(end) = found.pairs_walked.take() else { return };
        let members = self.regions.get(&found.dummy_position).expect("the pairs that found it are kept");
        let entries = &members.entries;
        let mut previous_leaf = block_of(members.dummy);
        found.visited_leaves.push(previous_leaf);
        found.member_leaves.push(previous_leaf);
        for (_, position) in &entries[..(end + 1).min(entries.len())] {
            if block_of(*position) != previous_leaf {
                note_leaf(&mut found.visited_leaves, *position);
                note_leaf(&mut found.member_leaves, *position);
                previous_leaf = block_of(*position);
            }
        }
        if end == entries.len() && members.next != 0 && block_of(members.next) != previous_leaf {
            note_leaf(&mut found.visited_leaves, members.next);
        }
    }

    /// The kept, current pairs of the region of `dummy` (only after `find` used it).
    pub fn entries(&self, dummy: u64) -> Option<&[(u64, u64)]> {
        self.regions.get(&dummy).map(|members| &members.entries[..])
    }

    /// The operation linked a new entry into the region of `dummy` and changed nothing else of
    /// its structure (no split, no record moved).
    pub fn inserted(&mut self, dummy: u64, key: u64, position: u64) {
        let Some(members) = self.regions.get_mut(&dummy) else { return };
        let place = members.entries.partition_point(|(member_key, _)| *member_key < key);
        members.entries.insert(place, (key, position));
        match members.leaves.iter_mut().find(|leaf| leaf.block == block_of(position)) {
            Some(leaf) => leaf.records += 1,
            None => {
                members.leaves.push(Leaf { block: block_of(position), buffer: None, records: 1 });
                let too_many = members.leaves.len() > LEAVES_MAX;
                self.readers.entry(block_of(position)).or_default().push(dummy);
                if too_many {
                    self.take(dummy);
                    self.counts.dropped += 1;
                    return;
                }
            }
        }
        self.updated.push(dummy);
    }

    /// The operation unlinked the entry of `key` at `position` and merged nothing.
    pub fn removed(&mut self, dummy: u64, key: u64, position: u64) {
        let Some(members) = self.regions.get_mut(&dummy) else { return };
        let place = members.entries.partition_point(|(member_key, _)| *member_key < key);
        let leaf = members.leaves.iter().position(|leaf| leaf.block == block_of(position));
        let (Some(leaf), true) = (leaf, members.entries.get(place) == Some(&(key, position))) else {
            self.take(dummy);
            self.counts.dropped += 1;
            return;
        };
        members.entries.remove(place);
        members.leaves[leaf].records -= 1;
        if members.leaves[leaf].records == 0 {
            members.leaves.remove(leaf);
            self.unread(block_of(position), dummy);
        }
        self.updated.push(dummy);
    }

    /// The operation rewrote an entry of the region in place (same key, same position).
    pub fn rewritten(&mut self, dummy: u64) {
        if self.regions.contains_key(&dummy) {
            self.updated.push(dummy);
        }
    }

    /// Brings the kept regions to what the session is about to commit (see the module comment):
    /// the updated ones take the session's buffers, the others keep theirs where the session
    /// changed none of their records, and are dropped otherwise.
    pub fn finish(&mut self, session: &Session) {
        let updated = std::mem::take(&mut self.updated);
        for dummy in &updated {
            self.take_buffers(session, *dummy);
        }
        let changed = session.changed_records();
        let mut unread = Vec::new();
        for (leaf, loaded, written) in session.changed_leaves() {
            let Some(mut readers) = self.readers.remove(&leaf) else { continue };
            readers.retain(|dummy| {
                if updated.contains(dummy) {
                    return true;
                }
                let members = self.regions.get_mut(dummy).expect("a reader is kept");
                let touched = changed
                    .iter()
                    .filter(|change| block_of(change.position) == leaf)
                    .any(|change| members.touched_by(change));
                let held = members.leaves.iter_mut().find(|held| held.block == leaf).expect("a reader reads it");
                let same = held.buffer.as_ref().is_some_and(|buffer| Arc::as_ptr(buffer) as usize == loaded);
                if !touched && loaded != 0 && same {
                    held.buffer = Some(written.clone());
                    self.counts.kept += 1;
                    true
                } else {
                    unread.push(*dummy);
                    false
                }
            });
            if !readers.is_empty() {
                self.readers.insert(leaf, readers);
            }
        }
        for leaf in session.freed_blocks() {
            let readers = self.readers.get(&leaf).map(|readers| readers.to_vec()).unwrap_or_default();
            unread.extend(readers.into_iter().filter(|dummy| !updated.contains(dummy)));
        }
        for dummy in unread {
            if self.take(dummy).is_some() {
                self.counts.dropped += 1;
            }
        }
        self.updated = updated;
        self.updated.clear();
    }

    /// The updated region of `dummy` takes the session's buffers of its leaves (its pairs are
    /// what the session is about to commit); dropped if the session does not hold one.
    fn take_buffers(&mut self, session: &Session, dummy: u64) {
        let Some(members) = self.regions.get_mut(&dummy) else { return };
        for leaf in &mut members.leaves {
            match session.held_leaf(leaf.block) {
                Some(held) => leaf.buffer = Some(held),
                None => {
                    self.take(dummy);
                    self.counts.dropped += 1;
                    return;
                }
            }
        }
    }
}

/// Whether every leaf the region read is, in this session, the very buffer it read.
fn leaves_current(session: &mut Session, members: &Members) -> Result<bool> {
    for leaf in &members.leaves {
        let Some(buffer) = &leaf.buffer else { return Ok(false) };
        let held: *const BlockBuf = session.leaf(leaf.block)?;
        if !std::ptr::eq(held, Arc::as_ptr(buffer)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Walks the whole region of `dummy` with the checks of `find`; None where it is not kept
/// (more than `MEMBERS_MAX` members or `LEAVES_MAX` leaves, or a count that does not match:
/// the caller's walk then meets what it meets, as before).
fn walk(session: &mut Session, region_hash: u32, dummy: u64) -> Result<Option<Members>> {
    let header = session.header(dummy, &|| format!("region {region_hash:#x} dummy"))?;
    if !header.is_dummy || header.region_hash() != region_hash {
        return Err(Error::corruption(format!(
            "directory index points region {region_hash:#x} at position {dummy:#x}, which is not its dummy"
        )));
    }
    if header.inode_or_count > MEMBERS_MAX as u64 {
        return Ok(None);
    }
    let mut entries = Vec::with_capacity(header.inode_or_count as usize);
    let mut previous_leaf = block_of(dummy);
    let mut leaf = session.leaf_shared(previous_leaf)?;
    let mut leaves = vec![Leaf { block: previous_leaf, buffer: Some(leaf.clone()), records: 1 }];
    let mut current = 0;
    let mut previous_key = header.key;
    let mut position = header.next;
    let mut next_region_hash = None;
    while position != 0 {
        check_region_count(region_hash, header.inode_or_count, entries.len() as u64)?;
        let (block_number, slot) = split_position(position, &|| format!("entry after key {previous_key:#x}"))?;
        if block_number != previous_leaf {
            leaf = session.leaf_shared(block_number)?;
            current = match leaves.iter().position(|held| held.block == block_number) {
                Some(index) => index,
                None => {
                    leaves.push(Leaf { block: block_number, buffer: Some(leaf.clone()), records: 0 });
                    leaves.len() - 1
                }
            };
            previous_leaf = block_number;
        }
        leaves[current].records += 1;
        let record = decode_header(&leaf, block_number, slot)?;
        if record.is_dummy {
            check_next_region(region_hash, record.region_hash())?;
            next_region_hash = Some(record.region_hash());
            break;
        }
        check_key_order(record.key, previous_key, entries.is_empty())?;
        entries.push((record.key, position));
        previous_key = record.key;
        position = record.next;
    }
    // The pairs are kept only for a region whose keys lie below the next region's (what
    // `Members::touched_by` relies on); the walk checks the rest.
    let below_next = match (entries.last(), next_region_hash) {
        (Some((last_key, _)), Some(next)) => *last_key < make_key(next, 0),
        _ => true,
    };
    if entries.len() as u64 != header.inode_or_count || leaves.len() > LEAVES_MAX || !below_next {
        return Ok(None);
    }
    Ok(Some(Members { region_hash, dummy, entries, next: position, next_region_hash, leaves }))
}

/// What `find` returns for `name`, from the region's pairs; the dummy, the entries of the hash,
/// the predecessor and the successor are read and checked against them. None where a record
/// does not match (the caller walks).
fn found_in(session: &mut Session, members: &Members, hash: u32, name: &[u8]) -> Result<Option<Found>> {
    let entries = &members.entries;
    let first = entries.partition_point(|(key, _)| key_hash(*key) < hash);
    let end = first + entries[first..].partition_point(|(key, _)| key_hash(*key) == hash);
    // The checks the walk makes of the region against the hash.
    if members.region_hash > hash {
        return Err(Error::corruption(format!(
            "directory index points region {:#x} at position {:#x}, which is not its dummy",
            members.region_hash, members.dummy
        )));
    }
    if let Some(next) = members.next_region_hash.filter(|next| end == entries.len() && *next <= hash) {
        return Err(Error::corruption(format!(
            "directory index sends hash {hash:#x} to region {:#x}, but region {next:#x} follows",
            members.region_hash
        )));
    }
    let dummy = session.header(members.dummy, &|| "kept region dummy".into())?;
    if !dummy.is_dummy || dummy.region_hash() != members.region_hash || dummy.inode_or_count != entries.len() as u64 {
        return Ok(None);
    }
    let before = |index: usize| if index == 0 { members.dummy } else { entries[index - 1].1 };
    // The record before `index` is the dummy or the entry the pairs say, and links to `next`.
    let linked = |session: &mut Session, index: usize, next: u64| -> Result<bool> {
        let header = session.header(before(index), &|| "kept region predecessor".into())?;
        let expected = if index == 0 { (true, dummy.key) } else { (false, entries[index - 1].0) };
        Ok((header.is_dummy, header.key) == expected && header.next == next)
    };
    let mut found = Found {
        dummy_position: members.dummy,
        predecessor: before(end),
        entry: None,
        same_hash: Vec::new(),
        before_same_hash: before(first),
        visited_leaves: Vec::new(),
        member_leaves: Vec::new(),
        pairs_walked: None,
    };
    for (index, &(key, position)) in entries.iter().enumerate().take(end).skip(first) {
        let header = session.header(position, &|| "kept region entry".into())?;
        if header.is_dummy || header.key != key {
            return Ok(None);
        }
        if session.name_is(position, &header, name)? {
            found.predecessor = before(index);
            if !linked(session, index, position)? {
                return Ok(None);
            }
            found.entry = Some((position, session.record(position, &|| "entry found".into())?));
            return Ok(Some(found));
        }
        found.same_hash.push((position, key as u32));
    }
    let successor = entries.get(end).map_or(members.next, |(_, position)| *position);
    if !linked(session, end, successor)? {
        return Ok(None);
    }
    if let Some(&(key, position)) = entries.get(end) {
        let header = session.header(position, &|| "kept region successor".into())?;
        if header.is_dummy || header.key != key {
            return Ok(None);
        }
    }
    // The leaves the walk would have noted, only where the insert needs them (`walked_leaves`).
    found.pairs_walked = Some(end);
    Ok(Some(found))
}

/// The process's kept regions, by directory (the block of its first leaf).
pub struct WriterCache {
    shards: Box<[Mutex<FastHashMap<u64, Regions>>]>,
    regions_max: usize,
    /// Regions held in the shards now (not those taken out by operations in flight).
    held: AtomicUsize,
    hits: AtomicU64,
    built: AtomicU64,
    mismatched: AtomicU64,
    kept: AtomicU64,
    dropped: AtomicU64,
}

impl WriterCache {
    /// A cache of at most about `regions_max` regions.
    pub fn new(regions_max: usize) -> WriterCache {
        WriterCache {
            shards: (0..SHARD_COUNT).map(|_| Mutex::new(FastHashMap::default())).collect(),
            regions_max,
            held: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            built: AtomicU64::new(0),
            mismatched: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    fn shard(&self, first_leaf: u64) -> &Mutex<FastHashMap<u64, Regions>> {
        let mixed = first_leaf.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(mixed >> (64 - SHARD_COUNT.trailing_zeros())) as usize]
    }

    /// The regions of the directory whose first leaf is `first_leaf`, out of the cache until
    /// `put` (an operation that fails never puts them back).
    pub(super) fn take(&self, first_leaf: u64) -> Regions {
        let mut regions = self.shard(first_leaf).lock().remove(&first_leaf).unwrap_or_default();
        self.held.fetch_sub(regions.regions.len(), Ordering::Relaxed);
        regions.enabled = true;
        regions
    }

    /// Counts what `regions` did; keeps them unless `keep` is false.
    pub(super) fn put(&self, first_leaf: u64, mut regions: Regions, keep: bool) {
        let counts = std::mem::take(&mut regions.counts);
        self.hits.fetch_add(counts.hits, Ordering::Relaxed);
        self.built.fetch_add(counts.built, Ordering::Relaxed);
        self.mismatched.fetch_add(counts.mismatched, Ordering::Relaxed);
        self.kept.fetch_add(counts.kept, Ordering::Relaxed);
        self.dropped.fetch_add(counts.dropped, Ordering::Relaxed);
        let count = regions.regions.len();
        if !keep || count == 0 || count > self.regions_max {
            return;
        }
        self.make_room(first_leaf, count);
        if self.held.load(Ordering::Relaxed) + count > self.regions_max {
            return;
        }
        regions.updated.clear();
        self.held.fetch_add(count, Ordering::Relaxed);
        if let Some(displaced) = self.shard(first_leaf).lock().insert(first_leaf, regions) {
            self.held.fetch_sub(displaced.regions.len(), Ordering::Relaxed);
        }
    }

    /// Forgets whole directories, of this directory's shard first and then of the others in
    /// turn, until `count` more regions fit.
    fn make_room(&self, first_leaf: u64, count: usize) {
        let start = self.shards.iter().position(|shard| std::ptr::eq(shard, self.shard(first_leaf))).unwrap_or(0);
        for turn in 0..SHARD_COUNT {
            if self.held.load(Ordering::Relaxed) + count <= self.regions_max {
                return;
            }
            let mut shard = self.shards[(start + turn) % SHARD_COUNT].lock();
            while self.held.load(Ordering::Relaxed) + count > self.regions_max {
                let Some(victim) = shard.keys().next().copied() else { break };
                let forgotten = shard.remove(&victim).expect("a key just listed");
                self.held.fetch_sub(forgotten.regions.len(), Ordering::Relaxed);
            }
        }
    }

    /// Forgets the directory whose first leaf is `first_leaf` (it is being destroyed).
    pub(super) fn forget(&self, first_leaf: u64) {
        let regions = self.take(first_leaf);
        drop(regions);
    }

    /// Regions held now.
    pub fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the cache did so far.
    pub fn counts(&self) -> WriterCacheCounts {
        WriterCacheCounts {
            hits: self.hits.load(Ordering::Relaxed),
            built: self.built.load(Ordering::Relaxed),
            mismatched: self.mismatched.load(Ordering::Relaxed),
            kept: self.kept.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

/// The process's writers' cache (`CACHED_REGIONS_MAX` regions).
pub fn writer_cache() -> &'static WriterCache {
    static CACHE: OnceLock<WriterCache> = OnceLock::new();
    CACHE.get_or_init(|| WriterCache::new(CACHED_REGIONS_MAX))
}

#[cfg(test)]
impl WriterCache {
    /// Makes every kept region of the directory lie while its leaves stay current: each entry's
    /// position moves to the next entry's (the records must catch it). Whether any was kept.
    pub(super) fn rotate_positions_for_test(&self, first_leaf: u64) -> bool {
        let mut shard = self.shard(first_leaf).lock();
        let Some(regions) = shard.get_mut(&first_leaf) else { return false };
        let mut any = false;
        for members in regions.regions.values_mut().filter(|members| members.entries.len() >= 2) {
            let first = members.entries[0].1;
            let count = members.entries.len();
            for index in 0..count {
                members.entries[index].1 = if index + 1 < count { members.entries[index + 1].1 } else { first };
            }
            any = true;
        }
        any
    }
}
