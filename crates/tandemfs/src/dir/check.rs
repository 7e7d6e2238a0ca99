//! Consistency check of one directory for fsck: reads everything, trusts nothing, reports every
//! problem in words and never panics.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::format::*;
use super::hash::{half_md4, HashSeed};
use crate::block::meta::{BlockKind, MetaStore, SharedBlock};

/// What `check` found.
#[derive(Debug, Default, Clone)]
pub struct DirCheck {
    /// Every block the directory owns (leaves and index blocks), ascending.
    pub blocks: Vec<u64>,
    /// Every entry reached: (name, inode, file type).
    pub entries: Vec<(Vec<u8>, u64, u8)>,
    pub problems: Vec<String>,
}

struct Checker<'a> {
    store: &'a mut dyn MetaStore,
    /// The allocation bitmap of every leaf in the chain. Only bitmaps are kept, so that a
    /// directory of millions of entries is checked in little memory.
    leaves: BTreeMap<u64, Bitmap>,
    /// Leaves the list walk read lately.
    cache: HashMap<u64, SharedBlock>,
    result: DirCheck,
}

type Bitmap = [u8; LEAF_BITMAP_BYTES];

/// Leaves the list walk keeps in memory at once.
const CHECK_CACHED_BLOCKS: usize = 64;

fn bitmap_bit(bitmap: &Bitmap, slot: usize) -> bool {
    bitmap[slot / 8] & (1 << (slot % 8)) != 0
}

impl Checker<'_> {
    fn problem(&mut self, what: String) {
        self.result.problems.push(what);
    }

    /// Walks the leaf chain; keeps every leaf that reads and validates.
    fn walk_leaves(&mut self, root: &DirRoot) {
        let mut block_number = root.first_leaf;
        let mut previous = 0;
        while block_number != 0 {
            if self.leaves.contains_key(&block_number) {
                self.problem(format!("leaf chain reaches block {block_number} twice"));
                return;
            }
            if self.leaves.len() as u64 >= root.leaf_count {
                self.problem(format!("leaf chain longer than the leaf count {}", root.leaf_count));
                return;
            }
            let block = match self.store.read_meta(block_number, BlockKind::DirLeaf) {
                Ok(block) => block,
                Err(error) => {
                    self.problem(format!("leaf {block_number}: {error}"));
                    return;
                }
            };
            if let Err(error) = validate_leaf(&block, block_number) {
                self.problem(error.to_string());
                return;
            }
            let stored_previous = read_u64(&block[..], LEAF_PREVIOUS_OFFSET);
            if stored_previous != previous {
                self.problem(format!("leaf {block_number}: previous leaf {stored_previous}, expected {previous}"));
            }
            let index_root = read_u64(&block[..], LEAF_INDEX_ROOT_OFFSET);
            let expected_index_root = if block_number == root.first_leaf { root.index_root } else { 0 };
            if index_root != expected_index_root {
                self.problem(format!("leaf {block_number}: index root {index_root}, expected {expected_index_root}"));
            }
            if block_number != root.first_leaf && read_u16(&block[..], LEAF_USED_SLOTS_OFFSET) == 0 {
                self.problem(format!("leaf {block_number} is empty but was not freed"));
            }
            let next = read_u64(&block[..], LEAF_NEXT_OFFSET);
            let mut bitmap = [0u8; LEAF_BITMAP_BYTES];
            bitmap.copy_from_slice(&block[LEAF_BITMAP_OFFSET..LEAF_BITMAP_OFFSET + LEAF_BITMAP_BYTES]);
            self.leaves.insert(block_number, bitmap);
            previous = block_number;
            block_number = next;
        }
        if self.leaves.len() as u64 != root.leaf_count {
            self.problem(format!("leaf chain has {} leaves, the root counts {}", self.leaves.len(), root.leaf_count));
        }
    }

    /// Walks the index; returns the level-0 entries in order (hash, dummy position).
    fn walk_index(&mut self, root: &DirRoot, index_blocks: &mut BTreeSet<u64>) -> Vec<(u32, u64)> {
        let mut regions = Vec::new();
        if root.index_depth == 0 {
            return vec![(0, root.head_position())];
        }
        // (block, level, lowest hash the parent promises, upper bound from the parent)
        let mut pending = vec![(root.index_root, root.index_depth - 1, 0u32, u64::MAX)];
        while let Some((block_number, level, lowest, upper)) = pending.pop() {
            if !index_blocks.insert(block_number) || index_blocks.len() as u64 > root.index_block_count {
                self.problem(format!(
                    "index reaches block {block_number} twice or more blocks than its count {}",
                    root.index_block_count
                ));
                return regions;
            }
            let node = match self
                .store
                .read_meta(block_number, BlockKind::DirIndex)
                .and_then(|block| decode_index(&block, block_number, level))
            {
                Ok(node) => node,
                Err(error) => {
                    self.problem(error.to_string());
                    continue;
                }
            };
            if node.entries[0].0 != lowest {
                self.problem(format!(
                    "index block {block_number}: lowest hash {:#x}, parent says {lowest:#x}",
                    node.entries[0].0
                ));
            }
            if node.entries.last().unwrap().0 as u64 >= upper {
                self.problem(format!("index block {block_number}: hashes reach past the next sibling's {upper:#x}"));
            }
            if level == 0 {
                regions.extend(node.entries.iter().copied());
            } else {
                // Pushed in reverse so that children pop in ascending order.
                for (index, (hash, child)) in node.entries.iter().enumerate().rev() {
                    let child_upper = node.entries.get(index + 1).map(|entry| entry.0 as u64).unwrap_or(upper);
                    pending.push((*child, level - 1, *hash, child_upper));
                }
            }
        }
        if index_blocks.len() as u64 != root.index_block_count {
            self.problem(format!(
                "index has {} blocks, the root counts {}",
                index_blocks.len(),
                root.index_block_count
            ));
        }
        regions
    }

    /// Walks the list from the head dummy, checking order, regions, names and space.
    fn walk_list(&mut self, root: &DirRoot, seed: &HashSeed, regions: &[(u32, u64)]) {
        let mut used: BTreeMap<u64, Bitmap> = BTreeMap::new();
        // Two entries with one name have one hash, and the list keeps equal hashes together, so
        // duplicates are found among the names of the current hash only.
        let mut same_hash_names: (u32, Vec<Vec<u8>>) = (u32::MAX, Vec::new());
        let mut position = root.head_position();
        let mut previous_key: Option<(u64, bool)> = None;
        let mut region_index = 0usize;
        let mut current_region: Option<(u32, u64, u64)> = None; // (hash, stored count, counted)
        let mut steps = 0u64;
        let mut region_total = 0u64;
        while position != 0 {
            steps += 1;
            if steps > root.list_length_bound() {
                self.problem("list longer than the entry and region counts (a cycle?)".into());
                break;
            }
            let (block_number, slot) = match split_position(position, &|| "list".into()) {
                Ok(split) => split,
                Err(error) => {
                    self.problem(error.to_string());
                    break;
                }
            };
            if !self.leaves.contains_key(&block_number) {
                self.problem(format!("list reaches block {block_number}, not in the leaf chain"));
                break;
            }
            if !self.cache.contains_key(&block_number) {
                if self.cache.len() >= CHECK_CACHED_BLOCKS {
                    self.cache.clear();
                }
                match self.store.read_meta(block_number, BlockKind::DirLeaf) {
                    Ok(block) => self.cache.insert(block_number, block),
                    Err(error) => {
                        self.problem(format!("leaf {block_number}: {error}"));
                        break;
                    }
                };
            }
            let block = &self.cache[&block_number];
            let record = match decode_record(block, block_number, slot) {
                Ok(record) => record,
                Err(error) => {
                    self.problem(error.to_string());
                    break;
                }
            };
            let slots_used = used.entry(block_number).or_insert([0; LEAF_BITMAP_BYTES]);
            let mut overlap = false;
            for each in slot..slot + record.slots() {
                overlap |= bitmap_bit(slots_used, each);
                slots_used[each / 8] |= 1 << (each % 8);
            }
            if overlap {
                self.problem(format!("leaf {block_number} slot {slot}: record overlaps another"));
                break;
            }
            // Order: by key, a dummy before the entries of its own hash.
            let order = (record.key, !record.is_dummy);
            if let Some(previous) = previous_key {
                if order <= previous {
                    self.problem(format!("leaf {block_number} slot {slot}: key {:#x} out of order", record.key));
                }
            }
            previous_key = Some(order);
            if record.is_dummy {
                if let Some((hash, stored, counted)) = current_region.take() {
                    if stored != counted {
                        self.problem(format!("region {hash:#x}: count {stored}, holds {counted}"));
                    }
                }
                match regions.get(region_index) {
                    Some((hash, indexed)) if *hash == record.region_hash() && *indexed == position => {}
                    Some((hash, indexed)) => self.problem(format!(
                        "dummy {:#x} at {position:#x}, the index has region {hash:#x} at {indexed:#x}",
                        record.region_hash()
                    )),
                    None => {
                        self.problem(format!("dummy {:#x} at {position:#x} is not in the index", record.region_hash()))
                    }
                }
                region_index += 1;
                region_total += 1;
                current_region = Some((record.region_hash(), record.inode_or_count, 0));
            } else {
                if let Some(region) = current_region.as_mut() {
                    region.2 += 1;
                }
                let name_text = String::from_utf8_lossy(&record.name).into_owned();
                let expected_hash = order_hash(half_md4(seed, &record.name).0);
                if key_hash(record.key) != expected_hash {
                    self.problem(format!(
                        "entry {name_text:?}: stored hash {:#x}, name hashes to {expected_hash:#x}",
                        key_hash(record.key)
                    ));
                }
                if record.key < FIRST_FREE_COOKIE {
                    self.problem(format!("entry {name_text:?}: key {} is a reserved cookie", record.key));
                }
                if same_hash_names.0 != key_hash(record.key) {
                    same_hash_names = (key_hash(record.key), Vec::new());
                }
                if same_hash_names.1.contains(&record.name) {
                    self.problem(format!("entry {name_text:?} appears twice"));
                }
                same_hash_names.1.push(record.name.clone());
                self.result.entries.push((record.name, record.inode_or_count, record.file_type));
            }
            position = record.next;
        }
        if let Some((hash, stored, counted)) = current_region {
            if stored != counted {
                self.problem(format!("region {hash:#x}: count {stored}, holds {counted}"));
            }
        }
        if region_index < regions.len() {
            self.problem(format!("index names {} regions, the list has {region_index}", regions.len()));
        }
        if region_total != root.region_count {
            self.problem(format!("list has {region_total} regions, the root counts {}", root.region_count));
        }
        if self.result.entries.len() as u64 != root.entry_count {
            self.problem(format!(
                "list has {} entries, the root counts {}",
                self.result.entries.len(),
                root.entry_count
            ));
        }
        let mut bitmap_problems = Vec::new();
        for (block_number, bitmap) in &self.leaves {
            let reached = used.get(block_number);
            for slot in FIRST_ENTRY_SLOT..SLOTS_PER_BLOCK {
                let in_use = reached.map(|slots| bitmap_bit(slots, slot)).unwrap_or(false);
                if bitmap_bit(bitmap, slot) != in_use {
                    bitmap_problems.push(format!(
                        "leaf {block_number} slot {slot}: bitmap says {}, the list says {}",
                        if bitmap_bit(bitmap, slot) { "used" } else { "free" },
                        if in_use { "used" } else { "free" }
                    ));
                    break;
                }
            }
        }
        self.result.problems.extend(bitmap_problems);
    }
}

/// Checks the directory rooted at `root`: every block it owns, every entry, every problem.
pub fn check(store: &mut dyn MetaStore, root: &DirRoot, seed: &HashSeed) -> DirCheck {
    let mut checker = Checker { store, leaves: BTreeMap::new(), cache: HashMap::new(), result: DirCheck::default() };
    if let Err(error) = root.validate() {
        checker.problem(error.to_string());
        return checker.result;
    }
    checker.walk_leaves(root);
    let mut index_blocks = BTreeSet::new();
    let regions = checker.walk_index(root, &mut index_blocks);
    checker.walk_list(root, seed, &regions);
    let mut blocks: BTreeSet<u64> = checker.leaves.keys().copied().collect();
    for block_number in index_blocks {
        if !blocks.insert(block_number) {
            checker.problem(format!("block {block_number} is both a leaf and an index block"));
        }
    }
    checker.result.blocks = blocks.into_iter().collect();
    checker.result
}

/// Most blocks `salvage` reads for one directory: a bound on the walk however the pointers are
/// damaged (a directory of millions of entries has tens of thousands of leaves).
const SALVAGE_BLOCKS_MAX: usize = 1 << 22;

/// The entries that can still be read from a damaged directory, for `fsck --repair`, which
/// builds a fresh directory from them. It trusts no single path: it follows the leaf chain
/// both ways, the index down to its regions and every list link, reads each leaf that passes
/// its checks and takes every record its bitmap marks in use. A name found twice is kept once
/// (the first found). Blocks that fail their checks, and blocks `foreign` says belong to
/// someone else, are skipped; their entries are lost.
pub fn salvage(store: &mut dyn MetaStore, root: &DirRoot, foreign: &dyn Fn(u64) -> bool) -> Vec<(Vec<u8>, u64, u8)> {
    let mut entries: Vec<(Vec<u8>, u64, u8)> = Vec::new();
    let mut names: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut seen: BTreeSet<u64> = BTreeSet::new();
    let mut leaves: Vec<u64> = vec![root.first_leaf];
    // Index blocks with the level they should have; a root whose depth is out of range names
    // no index worth reading.
    let mut index_blocks: Vec<(u64, u16)> = Vec::new();
    if root.index_depth > 0 && root.index_depth <= MAX_INDEX_DEPTH {
        index_blocks.push((root.index_root, root.index_depth - 1));
    }
    while seen.len() < SALVAGE_BLOCKS_MAX {
        if let Some((block_number, level)) = index_blocks.pop() {
            if block_number == 0 || foreign(block_number) || !seen.insert(block_number) {
                continue;
            }
            let Ok(node) = store
                .read_meta(block_number, BlockKind::DirIndex)
                .and_then(|block| decode_index(&block, block_number, level))
            else {
                continue;
            };
            for (_, target) in node.entries {
                if level == 0 {
                    leaves.push(target >> POSITION_SLOT_BITS);
                } else {
                    index_blocks.push((target, level - 1));
                }
            }
            continue;
        }
        let Some(block_number) = leaves.pop() else { break };
        if block_number == 0 || foreign(block_number) || !seen.insert(block_number) {
            continue;
        }
        let Ok(block) = store.read_meta(block_number, BlockKind::DirLeaf) else { continue };
        if validate_leaf(&block, block_number).is_err() {
            continue;
        }
        leaves.push(read_u64(&block[..], LEAF_NEXT_OFFSET));
        leaves.push(read_u64(&block[..], LEAF_PREVIOUS_OFFSET));
        let mut slot = FIRST_ENTRY_SLOT;
        while slot < SLOTS_PER_BLOCK {
            if !leaf_bit(&block, slot) {
                slot += 1;
                continue;
            }
            let Ok(record) = decode_record(&block, block_number, slot) else {
                slot += 1;
                continue;
            };
            if position_is_valid(record.next) {
                leaves.push(record.next >> POSITION_SLOT_BITS);
            }
            slot += record.slots().max(1);
            if !record.is_dummy && names.insert(record.name.clone()) {
                entries.push((record.name, record.inode_or_count, record.file_type));
            }
        }
    }
    entries
}
