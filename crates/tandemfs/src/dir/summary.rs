//! Summaries of regions for lookups of the applied H-tree (issue 9): a lookup of a name the
//! front end does not hold walks the name's region record by record, and each record sits on a
//! cache line of its own that the walk reaches only through the record before it (`perf`: 75%
//! of `find`'s time on the first load of each record). A summary is a region's keys and
//! positions in one array, read once by a full walk and then searched by bisection, so that a
//! lookup reads the index path, the summary and the one record whose hash matches.
//!
//! A summary is trusted only while the blocks it was read from are unchanged: the store that
//! reads them (`VersionedStore`, the home mirror's reader) notes a version of each block read
//! (the mirror's stripe counters), the summary keeps the versions noted during its walk, and a
//! lookup uses it only if every one of them is still current (then every block is as it was
//! when read, and the walk, a function of those blocks, would find the same). A summary read
//! across a change carries a version noted before the change and is never used. Nothing on
//! disk changes.

use super::format::*;
use super::session::Session;
use super::{check_name, index, name_order_hash, HashSeed};
use crate::block::meta::MetaStore;
use crate::error::{Error, Result};
use crate::FastHashMap;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Entries a summary holds at most: regions split at `REGION_SPLIT_ENTRIES`, and a larger one
/// (damage, or a count this code does not expect) is walked rather than summarised.
const SUMMARY_ENTRIES_MAX: usize = 2 * REGION_SPLIT_ENTRIES as usize;

/// Shards of the cache, by dummy position.
const SHARD_COUNT: usize = 64;

/// A store whose block reads carry versions (`(slot, counter)` pairs, unchanged exactly while
/// the block is): the home mirror's reader, which notes them for its own check anyway.
pub trait VersionedStore {
    fn meta(&mut self) -> &mut dyn MetaStore;
    /// How many versions the reads so far noted.
    fn noted_count(&self) -> usize;
    /// The versions noted from the `start`-th on.
    fn noted_since(&self, start: usize) -> Vec<(usize, u64)>;
    /// Whether all of `versions` are current; if so they are noted as if their blocks were
    /// read now (the caller's check at the end covers them).
    fn still_current(&mut self, versions: &[(usize, u64)]) -> bool;
}

/// One region, as a full walk from its dummy read it.
pub struct RegionSummary {
    region_hash: u32,
    /// (key, position) of the region's entries, in list order (ascending keys, checked).
    entries: Box<[(u64, u64)]>,
    /// The hash of each entry's key, beside them: the bisection reads a quarter of the bytes.
    hashes: Box<[u32]>,
    /// The hash of the next region's dummy; `None` where the list ends.
    next_region_hash: Option<u32>,
    /// The versions of the blocks the walk read (`VersionedStore`).
    versions: Box<[(usize, u64)]>,
}

#[derive(Default)]
struct Shard {
    young: FastHashMap<u64, Arc<RegionSummary>>,
    old: FastHashMap<u64, Arc<RegionSummary>>,
}

#[repr(align(128))]
struct PaddedShard(RwLock<Shard>);

/// Summaries by the position of their region's dummy, bounded (two generations per shard, as
/// the home mirror). Positions are unique on the volume while their leaf holds them; a leaf
/// reused for something else has a new version, so a summary found under a stale position is
/// refused by its versions.
pub struct RegionCache {
    shards: Box<[PaddedShard]>,
    generation_entries_max: usize,
    /// Lookups answered from a summary (built now or before).
    pub summarised: AtomicU64,
    /// Summaries built (a region's first lookup, or one after a change of its blocks).
    pub built: AtomicU64,
}

impl RegionCache {
    /// A cache of at most about `capacity` summaries (each about a leaf's bytes at most).
    pub fn new(capacity: usize) -> RegionCache {
        RegionCache {
            shards: (0..SHARD_COUNT).map(|_| PaddedShard(RwLock::new(Shard::default()))).collect(),
            generation_entries_max: (capacity / SHARD_COUNT / 2).max(4),
            summarised: AtomicU64::new(0),
            built: AtomicU64::new(0),
        }
    }

    fn shard(&self, position: u64) -> &RwLock<Shard> {
        let mixed = position.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(mixed >> (64 - SHARD_COUNT.trailing_zeros())) as usize].0
    }

    fn get(&self, position: u64) -> Option<Arc<RegionSummary>> {
        let entries = self.shard(position).read();
        entries.young.get(&position).or_else(|| entries.old.get(&position)).cloned()
    }

    fn insert(&self, position: u64, summary: Arc<RegionSummary>) {
        let mut entries = self.shard(position).write();
        entries.old.remove(&position);
        if entries.young.len() >= self.generation_entries_max {
            entries.old = std::mem::take(&mut entries.young);
        }
        entries.young.insert(position, summary);
    }

    /// Summaries held now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.0.read().young.len() + shard.0.read().old.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a full walk of a region found.
struct WalkedRegion {
    /// (key, position) of its entries in list order.
    entries: Vec<(u64, u64)>,
    /// The next region's hash; `None` where the list ends.
    next_region_hash: Option<u32>,
}

/// Walks the whole region whose dummy is at `dummy_position` with the checks of `find`; `None`
/// if it holds more than `SUMMARY_ENTRIES_MAX` entries (the caller walks as before).
fn walk_region(session: &mut Session, region_hash: u32, dummy_position: u64) -> Result<Option<WalkedRegion>> {
    let dummy = session.header(dummy_position, &|| format!("region {region_hash:#x} dummy"))?;
    if !dummy.is_dummy || dummy.region_hash() != region_hash {
        return Err(Error::corruption(format!(
            "directory index points region {region_hash:#x} at position {dummy_position:#x}, which is not its dummy"
        )));
    }
    if dummy.inode_or_count > SUMMARY_ENTRIES_MAX as u64 {
        return Ok(None);
    }
    let mut entries = Vec::with_capacity(dummy.inode_or_count as usize);
    let mut previous_key = dummy.key;
    let mut position = dummy.next;
    let mut previous_leaf = 0u64;
    let mut leaf = session.leaf_shared(super::block_of(dummy_position))?;
    while position != 0 {
        super::check_region_count(region_hash, dummy.inode_or_count, entries.len() as u64)?;
        let (block_number, slot) = split_position(position, &|| format!("entry after key {previous_key:#x}"))?;
        if block_number != previous_leaf {
            leaf = session.leaf_shared(block_number)?;
            previous_leaf = block_number;
        }
        let record = decode_header(&leaf, block_number, slot)?;
        if record.is_dummy {
            super::check_next_region(region_hash, record.region_hash())?;
            return Ok(Some(WalkedRegion { entries, next_region_hash: Some(record.region_hash()) }));
        }
        super::check_key_order(record.key, previous_key, entries.is_empty())?;
        entries.push((record.key, position));
        previous_key = record.key;
        position = record.next;
    }
    Ok(Some(WalkedRegion { entries, next_region_hash: None }))
}

/// `dir::lookup` through region summaries: the same answer and the same corruption errors for
/// what it reads, from the index path, the region's summary (built by a full walk when absent
/// or out of date) and the records whose hash matches the name's.
pub fn lookup_summarised(
    store: &mut dyn VersionedStore,
    cache: &RegionCache,
    root: &DirRoot,
    seed: &HashSeed,
    name: &[u8],
) -> Result<Option<(u64, u8)>> {
    check_name(name)?;
    root.validate()?;
    let hash = name_order_hash(seed, name);
    let (region_hash, dummy_position) = index::find_region(&mut Session::new(store.meta()), root, hash)?;
    let summary = match cache.get(dummy_position) {
        Some(summary) if store.still_current(&summary.versions) => summary,
        _ => {
            let start = store.noted_count();
            let walked = walk_region(&mut Session::new(store.meta()), region_hash, dummy_position)?;
            let Some(WalkedRegion { entries, next_region_hash }) = walked else {
                return super::lookup(store.meta(), root, seed, name);
            };
            let versions = store.noted_since(start).into_boxed_slice();
            let hashes = entries.iter().map(|(key, _)| key_hash(*key)).collect();
            let entries = entries.into_boxed_slice();
            let summary = Arc::new(RegionSummary { region_hash, entries, hashes, next_region_hash, versions });
            cache.insert(dummy_position, summary.clone());
            cache.built.fetch_add(1, Ordering::Relaxed);
            summary
        }
    };
    cache.summarised.fetch_add(1, Ordering::Relaxed);
    // The checks `find` makes of the region against the hash.
    if summary.region_hash != region_hash || region_hash > hash {
        return Err(Error::corruption(format!(
            "directory index points region {region_hash:#x} at position {dummy_position:#x}, which is not its dummy"
        )));
    }
    if let Some(next) = summary.next_region_hash.filter(|next| *next <= hash) {
        return Err(Error::corruption(format!(
            "directory index sends hash {hash:#x} to region {region_hash:#x}, but region {next:#x} follows"
        )));
    }
    let first = summary.hashes.partition_point(|entry_hash| *entry_hash < hash);
    let mut session = Session::new(store.meta());
    for &(key, position) in summary.entries[first..].iter().take_while(|(key, _)| key_hash(*key) == hash) {
        let header = session.header(position, &|| "entry of a summarised region".into())?;
        if header.is_dummy || header.key != key {
            return Err(Error::corruption(format!(
                "directory list: the record at {position:#x} is not the entry of key {key:#x} its region held"
            )));
        }
        if session.name_is(position, &header, name)? {
            return Ok(Some((header.inode_or_count, header.file_type)));
        }
    }
    Ok(None)
}
