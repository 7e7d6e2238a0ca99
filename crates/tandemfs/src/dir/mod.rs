//! `dir`: GPU4FS H-tree directories (Kittner 2023) over a split-ordered list of entries.
//!
//! Every entry of a directory is a record in ONE singly linked list kept in ascending order of
//! a 64-bit key (the name's half-MD4 hash, then a tiebreak that makes the key unique). Dummy
//! records cut the list into hash regions and count their members; an index of 16-byte
//! (hash, position) entries finds the dummy of the region a hash falls in, so a lookup reads
//! the index path and walks one region. Regions split at a pivot hash by relinking (no entry
//! moves) and merge again when they shrink. Entries move only when a region whose records have
//! spread over too many leaves is compacted; a readdir cookie is the key, not a position, so it
//! stays valid through all of it. `docs/DIRECTORIES.md` describes the structure and its bytes.

mod check;
mod format;
mod hash;
mod index;
mod members;
mod session;
mod summary;
#[cfg(test)]
mod tests;

pub use check::{check, salvage, DirCheck};
pub use format::{
    DirRoot, DIR_ROOT_BYTES, MAX_INDEX_DEPTH, MAX_NAME_BYTES, REGION_MERGE_ENTRIES, REGION_SPLIT_ENTRIES,
};
pub use hash::{half_md4, hash_seed_from_uuid, HashSeed};
pub use members::{writer_cache, WriterCache, WriterCacheCounts, CACHED_REGIONS_MAX};
pub use summary::{lookup_summarised, RegionCache, VersionedStore};

use crate::block::meta::{BlockKind, MetaStore};
use crate::error::{Error, Result};
use format::*;
use members::Regions;
use session::Session;

/// One entry as readdir reports it. `cookie` resumes a listing right after this entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub inode: u64,
    pub file_type: u8,
    pub cookie: u64,
}

/// Leaves a region may spread over beyond the number its records need before it is compacted.
const REGION_LEAF_SLACK: usize = 2;

/// Blocks a readdir keeps in memory at once; a listing of a huge directory stays small.
const READDIR_CACHED_BLOCKS: usize = 64;

/// Runs `operation` on a session over `store` and the root copy; commits both on success,
/// drops both on failure.
fn run<T>(
    store: &mut dyn MetaStore,
    root: &mut DirRoot,
    operation: impl FnOnce(&mut Session, &mut DirRoot) -> Result<T>,
) -> Result<T> {
    root.validate()?;
    let mut session = Session::new(store);
    let mut working = *root;
    match operation(&mut session, &mut working) {
        Ok(value) => {
            // A root that would not pass its own checks means the walk met damage it could not
            // see; better to change nothing.
            if let Err(error) = working.validate() {
                session.abandon();
                return Err(Error::corruption(format!("directory root after an update: {error}")));
            }
            session.commit()?;
            *root = working;
            Ok(value)
        }
        Err(error) => {
            session.abandon();
            Err(error)
        }
    }
}

/// As `run`, with the regions of the directory kept by `cache` (`members`): taken out for the
/// operation, brought to what it commits, and put back only if the commit succeeds.
fn run_cached<T>(
    store: &mut dyn MetaStore,
    root: &mut DirRoot,
    cache: Option<&WriterCache>,
    operation: impl FnOnce(&mut Session, &mut DirRoot, &mut Regions) -> Result<T>,
) -> Result<T> {
    root.validate()?;
    let first_leaf = root.first_leaf;
    let mut regions = match cache {
        Some(cache) => cache.take(first_leaf),
        None => Regions::disabled(),
    };
    let mut session = Session::new(store);
    let mut working = *root;
    let mut unchanged = false;
    let result = operation(&mut session, &mut working, &mut regions).and_then(|value| {
        // A root that would not pass its own checks means the walk met damage it could not see.
        working.validate().map_err(|error| Error::corruption(format!("directory root after an update: {error}")))?;
        Ok(value)
    });
    let committed = match result {
        Ok(value) => {
            regions.finish(&session);
            session.commit().map(|()| value)
        }
        Err(error) => {
            // An operation that fails before it changes anything (a name that exists, or is
            // missing) leaves the kept regions as true as they were.
            unchanged = session.is_unchanged();
            session.abandon();
            Err(error)
        }
    };
    if let Some(cache) = cache {
        cache.put(first_leaf, regions, committed.is_ok() || unchanged);
    }
    let value = committed?;
    *root = working;
    Ok(value)
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("empty file name"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

fn name_order_hash(seed: &HashSeed, name: &[u8]) -> u32 {
    order_hash(half_md4(seed, name).0)
}

/// Creates an empty directory: one leaf holding the head dummy (the region of hash 0).
pub fn create(store: &mut dyn MetaStore) -> Result<DirRoot> {
    let mut session = Session::new(store);
    let result = (|| {
        let first_leaf = session.allocate(BlockKind::DirLeaf, 0)?;
        let head =
            Record { key: make_key(0, 0), next: 0, inode_or_count: 0, file_type: 0, is_dummy: true, name: Vec::new() };
        let block = session.leaf_mut(first_leaf)?;
        set_leaf_bits(block, FIRST_ENTRY_SLOT, head.slots(), true);
        write_u16(&mut block[..], LEAF_USED_SLOTS_OFFSET, head.slots() as u16);
        encode_record(block, FIRST_ENTRY_SLOT, &head);
        Ok(DirRoot {
            first_leaf,
            index_root: 0,
            index_depth: 0,
            entry_count: 0,
            region_count: 1,
            leaf_count: 1,
            index_block_count: 0,
        })
    })();
    match result {
        Ok(root) => {
            session.commit()?;
            Ok(root)
        }
        Err(error) => {
            session.abandon();
            Err(error)
        }
    }
}

/// Where a name is or would go, found by walking its region.
struct Found {
    dummy_position: u64,
    /// The record before the place (the entry itself if found: its predecessor).
    predecessor: u64,
    /// The entry with the name, if present.
    entry: Option<(u64, Record)>,
    /// Tiebreaks of entries with the same hash, and the record before each.
    same_hash: Vec<(u64, u32)>,
    /// The last record with a smaller key than every same-hash entry.
    before_same_hash: u64,
    /// Leaves the walk passed through, in order: where a new entry of this region should go,
    /// so that a region's records stay in few blocks and a lookup reads few leaves.
    visited_leaves: Vec<u64>,
    /// The leaves of the dummy and of the region's entries among them (the walk may end on the
    /// next region's dummy, whose leaf need not hold anything of this region).
    member_leaves: Vec<u64>,
    /// Found from a region's kept pairs (`members`) rather than a walk: the two lists above are
    /// empty until `Regions::walked_leaves` fills them in; the number of entries with a hash
    /// not above the name's.
    pairs_walked: Option<usize>,
}

fn note_leaf(leaves: &mut Vec<u64>, position: u64) {
    let block_number = block_of(position);
    if !leaves.contains(&block_number) {
        leaves.push(block_number);
    }
}

/// Walks the region of `hash` looking for `name`; checks the list order on the way.
fn find(session: &mut Session, root: &DirRoot, hash: u32, name: &[u8]) -> Result<Found> {
    let (region_hash, dummy_position) = index::find_region(session, root, hash)?;
    let dummy = session.header(dummy_position, &|| format!("region {region_hash:#x} dummy"))?;
    if !dummy.is_dummy || dummy.region_hash() != region_hash || region_hash > hash {
        return Err(Error::corruption(format!(
            "directory index points region {region_hash:#x} at position {dummy_position:#x}, which is not its dummy"
        )));
    }
    let mut found = Found {
        dummy_position,
        predecessor: dummy_position,
        entry: None,
        same_hash: Vec::new(),
        before_same_hash: dummy_position,
        visited_leaves: Vec::with_capacity(8),
        member_leaves: Vec::with_capacity(8),
        pairs_walked: None,
    };
    found.visited_leaves.push(block_of(dummy_position));
    found.member_leaves.push(block_of(dummy_position));
    let mut previous = dummy_position;
    let mut previous_key = dummy.key;
    let mut position = dummy.next;
    let mut steps = 0u64;
    // The leaf of the record before: consecutive records mostly share a leaf, and the leaf
    // lists need a look only when it changes. The walk holds that leaf and decodes each record
    // from it, going to the session only when the list moves to another leaf (the walk is
    // most of a directory operation's work: about 95 records per insert in a full region).
    let mut previous_leaf = block_of(dummy_position);
    let mut previous_leaf_is_member = true;
    let mut leaf = session.leaf_shared(previous_leaf)?;
    // Headers only: names are compared in place, and only where the hash matches.
    while position != 0 {
        steps += 1;
        check_region_count(region_hash, dummy.inode_or_count, steps - 1)?;
        let (block_number, slot) = split_position(position, &|| format!("entry after {previous:#x}"))?;
        if block_number != previous_leaf {
            leaf = session.leaf_shared(block_number)?;
            note_leaf(&mut found.visited_leaves, position);
            previous_leaf = block_number;
            previous_leaf_is_member = false;
        }
        let record = decode_header(&leaf, block_number, slot)?;
        if record.is_dummy {
            check_next_region(region_hash, record.region_hash())?;
            // A name belongs to the last region whose hash is at or below its own: an index
            // that sent this hash to an earlier region is damaged, and a lookup would miss.
            if record.region_hash() <= hash {
                return Err(Error::corruption(format!(
                    "directory index sends hash {hash:#x} to region {region_hash:#x}, but region {:#x} follows",
                    record.region_hash()
                )));
            }
            break;
        }
        if !previous_leaf_is_member {
            note_leaf(&mut found.member_leaves, position);
            previous_leaf_is_member = true;
        }
        check_key_order(record.key, previous_key, previous == dummy_position)?;
        let record_hash = key_hash(record.key);
        if record_hash > hash {
            break;
        }
        if record_hash < hash {
            found.before_same_hash = position;
        } else {
            if session.name_is(position, &record, name)? {
                found.predecessor = previous;
                found.entry = Some((position, session.record(position, &|| "entry found".into())?));
                return Ok(found);
            }
            found.same_hash.push((position, record.key as u32));
        }
        previous = position;
        previous_key = record.key;
        position = record.next;
    }
    found.predecessor = previous;
    Ok(found)
}

/// A region's walk has met `seen` of its entries: more than its dummy's count is a damaged
/// list (a cycle, or a count that lost a write).
fn check_region_count(region_hash: u32, count: u64, seen: u64) -> Result<()> {
    if seen > count {
        return Err(Error::corruption(format!(
            "directory region {region_hash:#x} holds more entries than its count {count}"
        )));
    }
    Ok(())
}

/// The dummy that ends a region must start a later one.
fn check_next_region(region_hash: u32, next_region_hash: u32) -> Result<()> {
    if next_region_hash <= region_hash {
        return Err(Error::corruption(format!("directory list: dummy {next_region_hash:#x} out of order")));
    }
    Ok(())
}

/// Keys grow along a region's list; the first entry may share its dummy's key.
fn check_key_order(key: u64, previous_key: u64, first: bool) -> Result<()> {
    if key <= previous_key && !first || key < previous_key {
        return Err(Error::corruption(format!("directory list: key {key:#x} after {previous_key:#x}")));
    }
    Ok(())
}

pub fn lookup(store: &mut dyn MetaStore, root: &DirRoot, seed: &HashSeed, name: &[u8]) -> Result<Option<(u64, u8)>> {
    check_name(name)?;
    let mut copy = *root;
    run(store, &mut copy, |session, root| {
        let found = find(session, root, name_order_hash(seed, name), name)?;
        Ok(found.entry.map(|(_, record)| (record.inode_or_count, record.file_type)))
    })
}

/// Finds room for `slots` in the first of `candidates` (leaf blocks) that has it, else in a
/// new leaf linked after the first candidate. Marks the slots and returns the position.
fn place(session: &mut Session, root: &mut DirRoot, candidates: &[u64], slots: usize) -> Result<u64> {
    assert!(!candidates.is_empty());
    if let Some(position) = try_place(session, candidates, slots)? {
        return Ok(position);
    }
    let near = candidates[0];
    let new_block = session.allocate(BlockKind::DirLeaf, near)?;
    let old_next = read_u64(&session.leaf(near)?[..], LEAF_NEXT_OFFSET);
    write_u64(&mut session.leaf_mut(near)?[..], LEAF_NEXT_OFFSET, new_block);
    if old_next != 0 {
        write_u64(&mut session.leaf_mut(old_next)?[..], LEAF_PREVIOUS_OFFSET, new_block);
    }
    let block = session.leaf_mut(new_block)?;
    write_u64(&mut block[..], LEAF_PREVIOUS_OFFSET, near);
    write_u64(&mut block[..], LEAF_NEXT_OFFSET, old_next);
    mark(block, FIRST_ENTRY_SLOT, slots, true);
    root.leaf_count += 1;
    Ok(make_position(new_block, FIRST_ENTRY_SLOT))
}

/// Room for `slots` in the first of `candidates` that has it; marks the slots.
fn try_place(session: &mut Session, candidates: &[u64], slots: usize) -> Result<Option<u64>> {
    assert!((2..=ENTRY_SLOTS_PER_LEAF).contains(&slots));
    for block_number in candidates {
        let block = session.leaf(*block_number)?;
        // The used-slot count (checked against the bitmap on load) rules most full leaves out.
        if ENTRY_SLOTS_PER_LEAF - (read_u16(&block[..], LEAF_USED_SLOTS_OFFSET) as usize) < slots {
            continue;
        }
        if let Some(slot) = free_run(block, slots) {
            mark(session.leaf_mut(*block_number)?, slot, slots, true);
            return Ok(Some(make_position(*block_number, slot)));
        }
    }
    Ok(None)
}

/// Marks or clears slots and keeps the used-slot count in step.
fn mark(block: &mut crate::block::meta::BlockBuf, slot: usize, slots: usize, used: bool) {
    set_leaf_bits(block, slot, slots, used);
    let count = read_u16(&block[..], LEAF_USED_SLOTS_OFFSET) as usize;
    let count = if used {
        count + slots
    } else {
        count.checked_sub(slots).expect("leaf used-slot count below the slots freed")
    };
    assert!(count <= ENTRY_SLOTS_PER_LEAF);
    write_u16(&mut block[..], LEAF_USED_SLOTS_OFFSET, count as u16);
}

/// Frees the slots of a record (of `key`); frees its leaf too once nothing is left in it.
fn release(session: &mut Session, root: &mut DirRoot, position: u64, key: u64, slots: usize) -> Result<()> {
    let (block_number, slot) = split_position(position, &|| "record to free".into())?;
    let block = session.leaf_mut(block_number)?;
    if let Some(free) = (slot..slot + slots).find(|each| !leaf_bit(block, *each)) {
        return Err(Error::corruption(format!("directory leaf {block_number}: slot {free} of a live record is free")));
    }
    mark(block, slot, slots, false);
    let emptied = read_u16(&block[..], LEAF_USED_SLOTS_OFFSET) == 0;
    let previous = read_u64(&block[..], LEAF_PREVIOUS_OFFSET);
    let next = read_u64(&block[..], LEAF_NEXT_OFFSET);
    session.note_released(position, key);
    if !emptied || block_number == root.first_leaf {
        return Ok(());
    }
    if previous == 0 {
        return Err(Error::corruption(format!(
            "directory leaf {block_number} has no previous leaf but is not the first"
        )));
    }
    write_u64(&mut session.leaf_mut(previous)?[..], LEAF_NEXT_OFFSET, next);
    if next != 0 {
        write_u64(&mut session.leaf_mut(next)?[..], LEAF_PREVIOUS_OFFSET, previous);
    }
    session.free(block_number);
    index::decrement(&mut root.leaf_count, "leaf count")?;
    Ok(())
}

fn block_of(position: u64) -> u64 {
    position >> POSITION_SLOT_BITS
}

fn set_next(session: &mut Session, position: u64, next: u64) -> Result<()> {
    session.set_next(position, next)
}

fn add_to_count(session: &mut Session, dummy_position: u64, change: i64) -> Result<u64> {
    let dummy = session.header(dummy_position, &|| "region dummy".into())?;
    if !dummy.is_dummy {
        return Err(Error::corruption(format!("directory: position {dummy_position:#x} should hold a dummy")));
    }
    let count = dummy.inode_or_count.checked_add_signed(change).ok_or_else(|| {
        Error::corruption(format!(
            "directory region {:#x}: member count {} cannot change by {change}",
            dummy.region_hash(),
            dummy.inode_or_count
        ))
    })?;
    session.set_count(dummy_position, &dummy, count)?;
    Ok(count)
}

pub fn insert(
    store: &mut dyn MetaStore,
    root: &mut DirRoot,
    seed: &HashSeed,
    name: &[u8],
    inode: u64,
    file_type: u8,
) -> Result<()> {
    insert_in(Some(writer_cache()), store, root, seed, name, inode, file_type)
}

/// `insert` with the regions kept by `cache` (None: walk every time).
fn insert_in(
    cache: Option<&WriterCache>,
    store: &mut dyn MetaStore,
    root: &mut DirRoot,
    seed: &HashSeed,
    name: &[u8],
    inode: u64,
    file_type: u8,
) -> Result<()> {
    check_name(name)?;
    if name == b"." || name == b".." {
        return Err(Error::Exists);
    }
    let hash = name_order_hash(seed, name);
    run_cached(store, root, cache, |session, root, regions| {
        let mut found = regions.find(session, root, hash, name)?;
        if found.entry.is_some() {
            return Err(Error::Exists);
        }
        // The smallest tiebreak not taken by an entry of the same hash; the new entry goes
        // after the same-hash entries with smaller tiebreaks.
        let mut tiebreak: u32 = if hash == 0 { FIRST_FREE_COOKIE as u32 } else { 0 };
        let mut predecessor = found.before_same_hash;
        for (position, taken) in &found.same_hash {
            if *taken == tiebreak {
                tiebreak = tiebreak.checked_add(1).ok_or(Error::NoSpace)?;
                predecessor = *position;
            } else if *taken > tiebreak {
                break;
            } else {
                predecessor = *position;
            }
        }
        if found.same_hash.is_empty() {
            predecessor = found.predecessor;
        }
        let successor = session.header(predecessor, &|| "insert predecessor".into())?.next;
        let record = Record {
            key: make_key(hash, tiebreak),
            next: successor,
            inode_or_count: inode,
            file_type,
            is_dummy: false,
            name: name.to_vec(),
        };
        let mut candidates = vec![block_of(predecessor)];
        if successor != 0 {
            note_leaf(&mut candidates, successor);
        }
        // Then the leaves the walk passed through (listed only when these two are full).
        let mut position = try_place(session, &candidates, record.slots())?;
        if position.is_none() {
            regions.walked_leaves(&mut found);
            let known = candidates.len();
            for leaf in &found.visited_leaves {
                note_leaf(&mut candidates, *leaf << POSITION_SLOT_BITS);
            }
            position = try_place(session, &candidates[known..], record.slots())?;
        }
        // Then every leaf of the region, so that a region fills its own leaves before it takes
        // a new one: its records then sit in few blocks and a lookup reads few leaves. The rest
        // of the region is walked only when the leaves seen so far are full.
        if position.is_none() {
            let known = candidates.len();
            match regions.entries(found.dummy_position) {
                // The kept pairs are the region as `find` just checked it.
                Some(entries) => {
                    for (_, member) in entries {
                        note_leaf(&mut candidates, *member);
                    }
                }
                None => {
                    for member in &region_members(session, found.dummy_position)?.1 {
                        note_leaf(&mut candidates, member.position);
                    }
                }
            }
            position = try_place(session, &candidates[known..], record.slots())?;
        }
        let took_new_leaf = position.is_none();
        // The predecessor's leaf is always one of the region's (it holds the dummy or an entry).
        let widened = took_new_leaf
            || position.is_some_and(|position| {
                block_of(position) != block_of(predecessor) && {
                    regions.walked_leaves(&mut found);
                    !found.member_leaves.contains(&block_of(position))
                }
            });
        let position = match position {
            Some(position) => position,
            None => place(session, root, &candidates, record.slots())?,
        };
        session.put_record(position, &record)?;
        set_next(session, predecessor, position)?;
        let count = add_to_count(session, found.dummy_position, 1)?;
        root.entry_count += 1;
        if count >= REGION_SPLIT_ENTRIES {
            // The region's pairs are dropped at the end (its records changed, and it is not
            // marked as kept current).
            split_region(session, root, found.dummy_position)?;
            return Ok(());
        }
        // The entry may have widened the region's set of leaves (a new leaf, or the leaf of the
        // next region's dummy): gather the region again if it spread too far.
        if !(widened && compact_region(session, root, found.dummy_position)?) {
            regions.inserted(found.dummy_position, record.key, position);
        }
        Ok(())
    })
}

/// A region as walked: its dummy, its members in order, the next dummy's position (0 at the
/// end of the list).
type Region = (RecordHeader, Vec<Member>, u64);

/// A member of a region: where it is, its key and the slots it takes.
#[derive(Clone, Copy)]
struct Member {
    position: u64,
    key: u64,
    slots: usize,
}

fn region_members(session: &mut Session, dummy_position: u64) -> Result<Region> {
    let dummy = session.header(dummy_position, &|| "region dummy".into())?;
    if !dummy.is_dummy {
        return Err(Error::corruption(format!("directory: position {dummy_position:#x} should hold a dummy")));
    }
    let mut members = Vec::with_capacity(dummy.inode_or_count.min(REGION_SPLIT_ENTRIES) as usize);
    let mut position = dummy.next;
    let mut previous_key = dummy.key;
    while position != 0 {
        let record = session.header(position, &|| "region member".into())?;
        if record.is_dummy {
            if record.key <= dummy.key {
                return Err(Error::corruption(format!(
                    "directory list: dummy {:#x} out of order",
                    record.region_hash()
                )));
            }
            break;
        }
        check_key_order(record.key, previous_key, members.is_empty())?;
        check_region_count(dummy.region_hash(), dummy.inode_or_count, members.len() as u64 + 1)?;
        members.push(Member { position, key: record.key, slots: record.slots() });
        previous_key = record.key;
        position = record.next;
    }
    if members.len() as u64 != dummy.inode_or_count {
        return Err(Error::corruption(format!(
            "directory region {:#x}: count {} but {} entries",
            dummy.region_hash(),
            dummy.inode_or_count,
            members.len()
        )));
    }
    Ok((dummy, members, position))
}

/// Gathers a region's records back into few leaves once they have spread over more than
/// `REGION_LEAF_SLACK` leaves beyond what they need; whether any record moved.
///
/// Splits never move entries, so without this the records of a region would sit in one more
/// shared leaf for every generation of splits it descends from, and a lookup walking the region
/// would read them all. Here the leaves holding most of the region's slots are kept and the
/// records elsewhere move into their free space (or into new leaves). Only positions change;
/// keys, and so readdir cookies, do not. The dummy stays where the index points.
fn compact_region(session: &mut Session, root: &mut DirRoot, dummy_position: u64) -> Result<bool> {
    let (_, members, _) = region_members(session, dummy_position)?;
    let mut slots_by_leaf: Vec<(u64, usize)> = Vec::new();
    let mut total_slots = 0;
    for member in &members {
        total_slots += member.slots;
        match slots_by_leaf.iter_mut().find(|(leaf, _)| *leaf == block_of(member.position)) {
            Some(entry) => entry.1 += member.slots,
            None => slots_by_leaf.push((block_of(member.position), member.slots)),
        }
    }
    let needed_leaves = total_slots.div_ceil(ENTRY_SLOTS_PER_LEAF);
    if slots_by_leaf.len() <= needed_leaves + REGION_LEAF_SLACK {
        return Ok(false);
    }
    // Keep the leaves with most of the region, as many as it needs plus one for fragmentation.
    slots_by_leaf.sort_by(|left, right| right.1.cmp(&left.1).then(left.0.cmp(&right.0)));
    let mut kept: Vec<u64> = slots_by_leaf.iter().take(needed_leaves + 1).map(|(leaf, _)| *leaf).collect();
    let mut predecessor = dummy_position;
    let mut moved = false;
    for member in &members {
        if kept.contains(&block_of(member.position)) {
            predecessor = member.position;
            continue;
        }
        moved = true;
        // Only records that move are copied out whole.
        let record = session.record(member.position, &|| "region member".into())?;
        let new_position = place(session, root, &kept, record.slots())?;
        if !kept.contains(&block_of(new_position)) {
            kept.push(block_of(new_position));
        }
        session.put_record(new_position, &record)?;
        set_next(session, predecessor, new_position)?;
        release(session, root, member.position, record.key, record.slots())?;
        predecessor = new_position;
    }
    Ok(moved)
}

/// Splits a full region at the hash boundary nearest its middle by linking a new dummy in
/// front of the second half. Entries stay where they are. A region whose members all share one
/// hash cannot split and simply grows.
fn split_region(session: &mut Session, root: &mut DirRoot, dummy_position: u64) -> Result<()> {
    let (_, members, _) = region_members(session, dummy_position)?;
    let middle = members.len() / 2;
    let boundary = (1..members.len())
        .filter(|index| key_hash(members[*index].key) != key_hash(members[*index - 1].key))
        .min_by_key(|index| index.abs_diff(middle));
    let Some(boundary) = boundary else {
        return Ok(());
    };
    let pivot = key_hash(members[boundary].key);
    let last_of_first_half = members[boundary - 1].position;
    let first_of_second_half = members[boundary].position;
    let dummy = Record {
        key: make_key(pivot, 0),
        next: first_of_second_half,
        inode_or_count: (members.len() - boundary) as u64,
        file_type: 0,
        is_dummy: true,
        name: Vec::new(),
    };
    let mut candidates = vec![block_of(last_of_first_half)];
    note_leaf(&mut candidates, first_of_second_half);
    for member in &members {
        note_leaf(&mut candidates, member.position);
    }
    let position = place(session, root, &candidates, dummy.slots())?;
    session.put_record(position, &dummy)?;
    set_next(session, last_of_first_half, position)?;
    add_to_count(session, dummy_position, -((members.len() - boundary) as i64))?;
    root.region_count += 1;
    index::insert(session, root, pivot, position)
}

/// Unlinks the dummy at `victim_position` (whose list predecessor is `predecessor`), handing its
/// members to the region of `survivor_position`.
fn merge_into(
    session: &mut Session,
    root: &mut DirRoot,
    survivor_position: u64,
    predecessor: u64,
    victim_position: u64,
) -> Result<()> {
    let victim = session.header(victim_position, &|| "merged dummy".into())?;
    add_to_count(session, survivor_position, victim.inode_or_count as i64)?;
    set_next(session, predecessor, victim.next)?;
    release(session, root, victim_position, victim.key, victim.slots())?;
    index::decrement(&mut root.region_count, "region count")?;
    index::remove(session, root, victim.region_hash())
}

pub fn remove(store: &mut dyn MetaStore, root: &mut DirRoot, seed: &HashSeed, name: &[u8]) -> Result<(u64, u8)> {
    remove_in(Some(writer_cache()), store, root, seed, name)
}

/// `remove` with the regions kept by `cache` (None: walk every time).
fn remove_in(
    cache: Option<&WriterCache>,
    store: &mut dyn MetaStore,
    root: &mut DirRoot,
    seed: &HashSeed,
    name: &[u8],
) -> Result<(u64, u8)> {
    check_name(name)?;
    let hash = name_order_hash(seed, name);
    run_cached(store, root, cache, |session, root, regions| {
        let found = regions.find(session, root, hash, name)?;
        let Some((position, record)) = found.entry else {
            return Err(Error::NotFound);
        };
        set_next(session, found.predecessor, record.next)?;
        release(session, root, position, record.key, record.slots())?;
        let count = add_to_count(session, found.dummy_position, -1)?;
        index::decrement(&mut root.entry_count, "entry count")?;
        // A region above the merge size cannot merge with anything: skip the walk.
        if !(count < REGION_MERGE_ENTRIES && merge_after_remove(session, root, found.dummy_position)?) {
            regions.removed(found.dummy_position, record.key, position);
        }
        Ok((record.inode_or_count, record.file_type))
    })
}

/// Merges the region that just lost an entry with a small neighbour: the next region folds
/// into it, or it folds into the previous one. Whether it merged.
fn merge_after_remove(session: &mut Session, root: &mut DirRoot, dummy_position: u64) -> Result<bool> {
    let dummy = session.header(dummy_position, &|| "region dummy".into())?;
    if !dummy.is_dummy {
        return Err(Error::corruption(format!("directory: position {dummy_position:#x} should hold a dummy")));
    }
    // The next region's dummy is found by walking this region to its end; where the index
    // names it, its count first says whether a merge is possible, and most removes need no walk.
    let (_, _, indexed_next) = index::region_and_next(session, root, dummy.region_hash())?;
    let next_may_merge = match indexed_next {
        Some(next_position) => {
            let next = session.header(next_position, &|| "next region dummy".into())?;
            // A damaged index entry is found by the walk below.
            !next.is_dummy || dummy.inode_or_count.saturating_add(next.inode_or_count) <= REGION_MERGE_ENTRIES
        }
        None => true,
    };
    if next_may_merge {
        let (dummy, members, next_dummy) = region_members(session, dummy_position)?;
        if next_dummy != 0 {
            let next = session.header(next_dummy, &|| "next region dummy".into())?;
            if dummy.inode_or_count.saturating_add(next.inode_or_count) <= REGION_MERGE_ENTRIES {
                let predecessor = members.last().map(|member| member.position).unwrap_or(dummy_position);
                merge_into(session, root, dummy_position, predecessor, next_dummy)?;
                compact_region(session, root, dummy_position)?;
                return Ok(true);
            }
        }
    }
    let region_hash = dummy.region_hash();
    if region_hash == 0 {
        return Ok(false); // the head region has no predecessor and is never removed
    }
    let (_, previous_dummy) = index::find_region(session, root, region_hash - 1)?;
    // Read the count first: the walk to the end of the previous region is needed only to merge.
    let previous_count = session.header(previous_dummy, &|| "previous region dummy".into())?.inode_or_count;
    if previous_count.saturating_add(dummy.inode_or_count) <= REGION_MERGE_ENTRIES {
        let (_, previous_members, after_previous) = region_members(session, previous_dummy)?;
        if after_previous != dummy_position {
            return Err(Error::corruption(format!(
                "directory list: region before {region_hash:#x} does not lead to it"
            )));
        }
        let predecessor = previous_members.last().map(|member| member.position).unwrap_or(previous_dummy);
        merge_into(session, root, previous_dummy, predecessor, dummy_position)?;
        compact_region(session, root, previous_dummy)?;
        return Ok(true);
    }
    Ok(false)
}

pub fn replace(
    store: &mut dyn MetaStore,
    root: &mut DirRoot,
    seed: &HashSeed,
    name: &[u8],
    inode: u64,
    file_type: u8,
) -> Result<(u64, u8)> {
    replace_in(Some(writer_cache()), store, root, seed, name, inode, file_type)
}

/// `replace` with the regions kept by `cache` (None: walk every time).
fn replace_in(
    cache: Option<&WriterCache>,
    store: &mut dyn MetaStore,
    root: &mut DirRoot,
    seed: &HashSeed,
    name: &[u8],
    inode: u64,
    file_type: u8,
) -> Result<(u64, u8)> {
    check_name(name)?;
    let hash = name_order_hash(seed, name);
    run_cached(store, root, cache, |session, root, regions| {
        let found = regions.find(session, root, hash, name)?;
        let Some((position, mut record)) = found.entry else {
            return Err(Error::NotFound);
        };
        let old = (record.inode_or_count, record.file_type);
        record.inode_or_count = inode;
        record.file_type = file_type;
        session.put_record(position, &record)?;
        regions.rewritten(found.dummy_position);
        Ok(old)
    })
}

/// Lists the entries after `after_cookie` in key order until `visit` returns false. Every
/// entry listed is one a lookup finds: its key's hash is its name's, and its name is a valid
/// name; a full listing holds as many entries as the root counts. So a damaged key, name, seed
/// or list link is a corruption error here, not a name that readdir shows and lookup denies.
pub fn readdir(
    store: &mut dyn MetaStore,
    root: &DirRoot,
    seed: &HashSeed,
    after_cookie: u64,
    visit: &mut dyn FnMut(&DirEntry) -> bool,
) -> Result<()> {
    root.validate()?;
    let mut session = Session::with_clean_limit(store, READDIR_CACHED_BLOCKS);
    let start = if after_cookie < FIRST_FREE_COOKIE {
        root.head_position()
    } else if after_cookie >= 1 << 63 {
        return Ok(()); // beyond every key
    } else {
        index::find_region(&mut session, root, key_hash(after_cookie))?.1
    };
    let mut position = start;
    let mut last_key: Option<u64> = None;
    let mut steps = 0u64;
    let mut listed = 0u64;
    while position != 0 {
        steps += 1;
        if steps > root.list_length_bound() {
            return Err(Error::corruption("directory list longer than its entry and region counts (a cycle?)"));
        }
        let record = session.record(position, &|| "readdir".into())?;
        if !record.is_dummy {
            if let Some(last) = last_key {
                if record.key <= last {
                    return Err(Error::corruption(format!("directory list: key {:#x} after {last:#x}", record.key)));
                }
            }
            last_key = Some(record.key);
            check_listed_entry(seed, &record)?;
            listed += 1;
            if record.key > after_cookie {
                let entry = DirEntry {
                    name: record.name,
                    inode: record.inode_or_count,
                    file_type: record.file_type,
                    cookie: record.key,
                };
                if !visit(&entry) {
                    return Ok(());
                }
            }
        }
        position = record.next;
    }
    if start == root.head_position() && listed != root.entry_count() {
        return Err(Error::corruption(format!(
            "directory list holds {listed} entries, its root counts {}",
            root.entry_count()
        )));
    }
    Ok(())
}

/// A listed entry's name is a valid name and hashes to its key.
fn check_listed_entry(seed: &HashSeed, record: &format::Record) -> Result<()> {
    let shown = || String::from_utf8_lossy(&record.name).into_owned();
    if record.name.iter().any(|byte| *byte == 0 || *byte == b'/') || record.name == b"." || record.name == b".." {
        return Err(Error::corruption(format!("directory entry {:?} is not a valid name", shown())));
    }
    let hash = name_order_hash(seed, &record.name);
    if key_hash(record.key) != hash {
        return Err(Error::corruption(format!(
            "directory entry {:?}: key {:#x} does not match its name's hash {hash:#x}",
            shown(),
            record.key
        )));
    }
    Ok(())
}

/// Frees every block of the directory. Walks the leaf chain and the index tree; frees what it
/// can reach even when some of it is damaged, and then reports the damage.
pub fn destroy(store: &mut dyn MetaStore, root: DirRoot) -> Result<()> {
    root.validate()?;
    writer_cache().forget(root.first_leaf);
    let mut blocks = std::collections::BTreeSet::new();
    let mut first_error = None;
    {
        let mut session = Session::with_clean_limit(store, READDIR_CACHED_BLOCKS);
        let mut block_number = root.first_leaf;
        while block_number != 0 {
            if blocks.len() as u64 >= root.leaf_count || !blocks.insert(block_number) {
                first_error = Some(Error::corruption("directory leaf chain longer than its leaf count (a cycle?)"));
                break;
            }
            match session.leaf(block_number) {
                Ok(block) => block_number = read_u64(&block[..], LEAF_NEXT_OFFSET),
                Err(error) => {
                    blocks.remove(&block_number);
                    first_error = Some(error);
                    break;
                }
            }
        }
        if let Err(error) = index::collect_blocks(&mut session, &root, &mut blocks) {
            first_error.get_or_insert(error);
        }
    }
    for block_number in blocks {
        store.free_meta(block_number)?;
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(()),
    }
}
