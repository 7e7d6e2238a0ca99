//! The FlexTree in memory for the span of one operation.
//!
//! An operation opens a `Tree` on a copy of the root, reads the nodes it needs into a private
//! cache, changes them there, and at the end either commits (writes the changed nodes once,
//! then frees what the operation released) or aborts (gives back what the operation
//! allocated and leaves the tree exactly as it was). So an `Error::NoSpace` or a corrupt node
//! found half way never leaves a half-changed tree behind.

use std::collections::HashSet;
use std::sync::Arc;

use super::format::*;
use super::Store;
use crate::block::meta::{BlockKind, BLOCK_SIZE, BLOCK_SIZE_U64};
use crate::error::{Error, Result};
use crate::FastHashMap;

/// The node id that names the root area (never a block number: block numbers stay below
/// `MAX_BLOCK_NUMBER`).
const ROOT_ID: u64 = u64::MAX;
/// Largest run of data blocks asked for at once; a longer range takes several runs, which
/// merge into one extent when the allocator hands them out contiguously.
const MAX_RUN_BLOCKS: u64 = 1 << 15;

struct CachedNode {
    level: usize,
    /// Shared with the form the store keeps (`DecodedNode`) until the first change, which
    /// takes them over or copies them (`entries_mut`): a node only read costs no copy, and a
    /// node written at commit hands its entries to the store instead of a copy.
    entries: Arc<Vec<Entry>>,
    /// The sum of the entries' lengths, known since the last change (None: not yet summed).
    /// A search loads the nodes of its path again and again in one operation; summing up to 253
    /// entries each time was 6% of a collapse's CPU time (perf, `flex_probe`).
    length: Option<u64>,
    dirty: bool,
}

impl CachedNode {
    fn new(level: usize, entries: Vec<Entry>) -> CachedNode {
        CachedNode { level, entries: Arc::new(entries), length: None, dirty: true }
    }
}

/// A node's entries as a store keeps them between operations (`MetaStore::decoded`), with the
/// level and subtree length they were checked against.
struct DecodedNode {
    level: usize,
    length: u64,
    entries: Arc<Vec<Entry>>,
}

/// The entries of a kept decoded node (tests: who shares them).
#[cfg(test)]
pub(crate) fn kept_entries(decoded: &crate::block::meta::Decoded) -> Option<Arc<Vec<Entry>>> {
    decoded.clone().downcast::<DecodedNode>().ok().map(|node| node.entries.clone())
}

/// Where a byte position lies: the path from the root to a leaf as (node, entry index), and
/// the distance from the start of the leaf entry. At the end of the file the leaf index is one
/// past the last entry and the distance 0.
pub(crate) struct Location {
    pub path: Vec<(u64, usize)>,
    pub offset_in_entry: u64,
}

impl Location {
    fn leaf(&self) -> u64 {
        self.path.last().expect("path has a leaf").0
    }
    fn index(&self) -> usize {
        self.path.last().expect("path has a leaf").1
    }
}

/// Where the last search or change of the tree left off (`Tree::locate`): the path from the root
/// to a leaf, with the leaf's index of one entry, the file byte where the leaf starts and where
/// that entry starts. A search that falls inside the same leaf walks from there instead of
/// descending from the root and summing each level's entries again: an insert of data searched
/// four times for the place (the cut, the hole, its fill, the merge after it) and a collapse
/// twice (the removal, the merge), and the searches were a fifth to a quarter of their
/// instructions (callgrind, `flex_probe`). Valid only while the tree keeps its shape: every
/// change of a node's entries (`entries_mut`) and every node made or freed forgets it, and
/// `splice` carries it over its own change of one leaf, which moves no entry before the change.
/// The path is held in place (no allocation: a search's `Vec` clones cost more than the walk).
#[derive(Clone)]
struct Hint {
    steps: [(u64, usize); MAX_DEPTH + 1],
    depth: usize,
    leaf_start: u64,
    entry_start: u64,
}

impl Hint {
    fn new(path: &[(u64, usize)], leaf_start: u64, entry_start: u64) -> Hint {
        assert!(!path.is_empty() && path.len() <= MAX_DEPTH + 1, "a path is bounded by the depth");
        let mut steps = [(0, 0); MAX_DEPTH + 1];
        steps[..path.len()].copy_from_slice(path);
        Hint { steps, depth: path.len(), leaf_start, entry_start }
    }

    fn path(&self) -> &[(u64, usize)] {
        &self.steps[..self.depth]
    }

    fn leaf(&self) -> (u64, usize) {
        self.steps[self.depth - 1]
    }
}

pub(crate) struct Tree<'s> {
    store: &'s mut dyn Store,
    depth: usize,
    root: Vec<Entry>,
    length: u64,
    blocks_owned: u64,
    /// The nodes this operation read or made, by block number. Fx hashing: the operation looks
    /// nodes up by number at every step of every search and change, and SipHash was 2–3% of a
    /// collapse's CPU time.
    nodes: FastHashMap<u64, CachedNode>,
    new_data: Vec<(u64, u64)>,
    new_meta: Vec<u64>,
    freed_data: Vec<(u64, u64)>,
    freed_meta: Vec<u64>,
    /// References of shared data blocks as this operation leaves them (0: not shared), written
    /// to the store at commit (docs/EXTENTS.md, *Shared blocks*).
    shares: FastHashMap<u64, u64>,
    /// The file whose small runs this operation packs into shared blocks (`pack_place`); None:
    /// no packing.
    pub pack_file: Option<u64>,
    /// The pack block's free room as this operation leaves it: (block, bytes used).
    pack_room: Option<(u64, u64)>,
    pack_loaded: bool,
    pack_changed: bool,
    /// Where the last search or change left off (`Hint`); not kept across `suspend`.
    hint: Option<Hint>,
    /// Searches that descended from the root (tests: how many a change needs).
    #[cfg(test)]
    descents: usize,
}

/// Runs inside a file shorter than this are packed into the file's pack block
/// (`Tree::pack_place`); longer ones get blocks of their own.
pub const PACK_MAX_BYTES: u64 = BLOCK_SIZE_U64 / 2;

/// A cut inside a block copies the left part's bytes into a new block while the file holds at
/// most `1 + 1 / COPY_SLACK_DIVISOR` times its bytes, and shares the block beyond that
/// (`Tree::cut`): 1/16 keeps space well under issue 12's 1.2× with no compaction.
pub const COPY_SLACK_DIVISOR: u64 = 16;

fn kind_of_level(level: usize) -> BlockKind {
    if level == 0 {
        BlockKind::ExtentLeaf
    } else {
        BlockKind::ExtentInternal
    }
}

fn round_up_to_block(address: u64) -> u64 {
    address.div_ceil(BLOCK_SIZE_U64) * BLOCK_SIZE_U64
}

/// The one entry two neighbours become, if they can be one: two holes, or two extents of the
/// same state whose bytes continue each other. When they continue each other inside a block,
/// both reference that block, and the merged extent gives one reference back: that block is
/// the second value.
fn merged(left: Entry, right: Entry) -> Option<(Entry, Option<u64>)> {
    if left.is_hole() && right.is_hole() {
        let length = left.length + right.length;
        return (length <= MAX_FILE_BYTES).then(|| (Entry::hole(length), None));
    }
    if !left.is_hole()
        && !right.is_hole()
        && left.unwritten == right.unwritten
        && left.address + left.length == right.address
        && left.length + right.length <= MAX_FILE_BYTES
    {
        let shared = (!right.address.is_multiple_of(BLOCK_SIZE_U64)).then_some(right.address / BLOCK_SIZE_U64);
        return Some((Entry::data(left.address, left.length + right.length, left.unwritten), shared));
    }
    None
}

/// A tree between the changes of one run (`super::FileRun`): everything a `Tree` holds but
/// the store it borrows, so that the run's next change resumes where the last one stopped, with
/// the nodes it read and changed still decoded and nothing written or freed yet.
pub(crate) struct Suspended {
    depth: usize,
    root: Vec<Entry>,
    length: u64,
    blocks_owned: u64,
    nodes: FastHashMap<u64, CachedNode>,
    new_data: Vec<(u64, u64)>,
    new_meta: Vec<u64>,
    freed_data: Vec<(u64, u64)>,
    freed_meta: Vec<u64>,
    shares: FastHashMap<u64, u64>,
    pack_file: Option<u64>,
    pack_room: Option<(u64, u64)>,
    pack_loaded: bool,
    pack_changed: bool,
}

impl Suspended {
    /// A tree on `root` that no change has touched yet.
    pub fn new(root: &ExtentRoot, pack_file: Option<u64>) -> Suspended {
        Suspended {
            depth: root.depth(),
            root: root.root_entries().to_vec(),
            length: root.length_bytes(),
            blocks_owned: root.blocks_owned(),
            nodes: FastHashMap::default(),
            new_data: Vec::new(),
            new_meta: Vec::new(),
            freed_data: Vec::new(),
            freed_meta: Vec::new(),
            shares: FastHashMap::default(),
            pack_file,
            pack_room: None,
            pack_loaded: false,
            pack_changed: false,
        }
    }

    /// Nodes held decoded, changed or only read (a run's bound on memory).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

impl<'s> Tree<'s> {
    pub fn open(store: &'s mut dyn Store, root: &ExtentRoot) -> Tree<'s> {
        Tree::resume(store, Suspended::new(root, None))
    }

    /// Continues a suspended tree on `store` (the store it was suspended from).
    pub fn resume(store: &'s mut dyn Store, state: Suspended) -> Tree<'s> {
        Tree {
            store,
            depth: state.depth,
            root: state.root,
            length: state.length,
            blocks_owned: state.blocks_owned,
            nodes: state.nodes,
            new_data: state.new_data,
            new_meta: state.new_meta,
            freed_data: state.freed_data,
            freed_meta: state.freed_meta,
            shares: state.shares,
            pack_file: state.pack_file,
            pack_room: state.pack_room,
            pack_loaded: state.pack_loaded,
            pack_changed: state.pack_changed,
            hint: None,
            #[cfg(test)]
            descents: 0,
        }
    }

    /// Lets go of the store, keeping every change made so far uncommitted: `resume` and
    /// `commit` (or `abort`) later, on the same store, with nothing else changing this file's
    /// tree, counts or pack room in between.
    pub fn suspend(self) -> Suspended {
        Suspended {
            depth: self.depth,
            root: self.root,
            length: self.length,
            blocks_owned: self.blocks_owned,
            nodes: self.nodes,
            new_data: self.new_data,
            new_meta: self.new_meta,
            freed_data: self.freed_data,
            freed_meta: self.freed_meta,
            shares: self.shares,
            pack_file: self.pack_file,
            pack_room: self.pack_room,
            pack_loaded: self.pack_loaded,
            pack_changed: self.pack_changed,
        }
    }

    pub fn length(&self) -> u64 {
        self.length
    }

    /// Writes every changed node once, then frees what the operation released.
    pub fn commit(mut self) -> Result<ExtentRoot> {
        if self.blocks_owned >= MAX_BLOCK_NUMBER {
            // Only a corrupt count read from the root can get here; refuse before writing.
            self.abort();
            return Err(Error::corruption("extent root field blocks_owned: out of range"));
        }
        assert!(self.root.len() <= ROOT_CAPACITY, "root overflow survived rebalancing");
        let mut dirty: Vec<u64> = self.nodes.iter().filter(|(_, node)| node.dirty).map(|(id, _)| *id).collect();
        dirty.sort_unstable();
        for id in dirty {
            let node = self.nodes.remove(&id).expect("listed above");
            let (block, length) = encode_node(node.level, &node.entries);
            let block = Arc::new(block);
            self.store.write_meta(id, kind_of_level(node.level), block.clone())?;
            // The next operation on this node finds it decoded (the entries are what was
            // encoded), and takes them over without a copy: the tree is done with them.
            let decoded = DecodedNode { level: node.level, length, entries: node.entries };
            self.store.keep_decoded(id, &block, Arc::new(decoded));
        }
        // Counts before frees: a block whose last reference went is recorded unshared, then freed.
        let mut shares: Vec<(u64, u64)> = self.shares.drain().collect();
        shares.sort_unstable();
        for (block, references) in shares {
            self.store.set_shared_references(block, references)?;
        }
        let mut seen = HashSet::new();
        for id in std::mem::take(&mut self.freed_meta) {
            // A corrupt tree could name one block twice; freeing it twice would hurt the volume.
            if !seen.insert(id) {
                return Err(Error::corruption(format!("extent node {id} reached twice while freeing")));
            }
            self.store.free_meta(id)?;
        }
        if let (Some(file), true) = (self.pack_file, self.pack_changed) {
            self.store.set_pack_room(file, self.pack_room);
        }
        for (first, count) in std::mem::take(&mut self.freed_data) {
            // A pack block freed with its last run has no room to offer any more.
            self.store.forget_pack_room(first, count);
            self.store.free_data(first, count)?;
        }
        Ok(ExtentRoot::from_parts(self.depth, &self.root, self.length, self.blocks_owned))
    }

    /// Searches that descended from the root so far (tests).
    #[cfg(test)]
    pub(crate) fn descents(&self) -> usize {
        self.descents
    }

    /// The entries of node `id` as this operation holds them (tests: who shares them).
    #[cfg(test)]
    pub(crate) fn node_entries(&self, id: u64) -> Option<&Arc<Vec<Entry>>> {
        self.nodes.get(&id).map(|node| &node.entries)
    }

    /// Changes nothing in node `id`'s entries but takes them for a change, as every change does.
    #[cfg(test)]
    pub(crate) fn touch_node(&mut self, id: u64) {
        self.entries_mut(id);
    }

    /// Gives back what this operation allocated; the stored tree was never touched.
    pub fn abort(self) {
        for (first, count) in self.new_data {
            let _ = self.store.free_data(first, count);
        }
        for id in self.new_meta {
            let _ = self.store.free_meta(id);
        }
    }

    // ----- node cache -----

    fn entries(&self, id: u64) -> &Vec<Entry> {
        if id == ROOT_ID {
            &self.root
        } else {
            &self.nodes.get(&id).expect("node loaded before use").entries
        }
    }

    fn entries_mut(&mut self, id: u64) -> &mut Vec<Entry> {
        self.hint = None;
        if id == ROOT_ID {
            &mut self.root
        } else {
            let node = self.nodes.get_mut(&id).expect("node loaded before use");
            node.dirty = true;
            node.length = None;
            if Arc::get_mut(&mut node.entries).is_none() {
                // The first change takes the entries over from the store, which forgets its
                // kept form (the block it describes is about to be written anew); where someone
                // else holds them too, it copies them, with room for the entries a change adds
                // before the node is split (an exact copy grew, and was copied again, at the
                // first insert).
                self.store.forget_decoded(id);
                if Arc::get_mut(&mut node.entries).is_none() {
                    let mut copy = Vec::with_capacity(NODE_CAPACITY + NODE_GROWTH_ROOM);
                    copy.extend_from_slice(&node.entries);
                    node.entries = Arc::new(copy);
                }
            }
            let entries = Arc::get_mut(&mut node.entries).expect("held only here");
            // Entries taken over may have come from a split (`split_off` allocates exactly).
            if entries.capacity() < NODE_CAPACITY + NODE_GROWTH_ROOM {
                entries.reserve_exact(NODE_CAPACITY + NODE_GROWTH_ROOM - entries.len());
            }
            entries
        }
    }

    /// Brings node `id` into the cache, checking that it is what its parent says it is.
    fn load(&mut self, id: u64, level: usize, expected_length: u64) -> Result<()> {
        assert!(id != ROOT_ID);
        if let Some(node) = self.nodes.get_mut(&id) {
            if node.length.is_none() {
                node.length = sum_lengths(&node.entries);
            }
            if node.level != level || node.length != Some(expected_length) {
                return Err(Error::corruption(format!("extent node {id} is referenced from two places")));
            }
            return Ok(());
        }
        if id == 0 || id >= MAX_BLOCK_NUMBER {
            return Err(Error::corruption(format!("extent tree names block {id}, out of range")));
        }
        let block = self.store.read_meta(id, kind_of_level(level))?;
        let kept = self.store.decoded(id, &block).and_then(|decoded| decoded.downcast::<DecodedNode>().ok());
        let entries = match kept {
            // Decoded from this very buffer with the same level and length checked: the same
            // entries `decode_node` would give again.
            Some(node) if node.level == level && node.length == expected_length => node.entries.clone(),
            _ => {
                let entries = Arc::new(decode_node(&block[..], id, level, expected_length)?);
                let node = DecodedNode { level, length: expected_length, entries: entries.clone() };
                self.store.keep_decoded(id, &block, Arc::new(node));
                entries
            }
        };
        self.nodes.insert(id, CachedNode { level, entries, length: Some(expected_length), dirty: false });
        Ok(())
    }

    fn allocate_node(&mut self, near: u64) -> Result<u64> {
        self.hint = None;
        let id = self.store.allocate_meta(near)?;
        self.new_meta.push(id);
        if id == 0 || id >= MAX_BLOCK_NUMBER || self.nodes.contains_key(&id) {
            return Err(Error::corruption(format!("allocator returned block {id} for an extent node")));
        }
        self.blocks_owned += 1;
        Ok(id)
    }

    fn free_node(&mut self, id: u64) {
        assert!(id != ROOT_ID);
        self.hint = None;
        self.nodes.remove(&id);
        self.freed_meta.push(id);
        self.blocks_owned = self.blocks_owned.saturating_sub(1);
    }

    fn allocate_data(&mut self, near: u64, count: u64) -> Result<(u64, u64)> {
        assert!(count > 0);
        let (first, given) = self.store.allocate_data(near, count)?;
        self.new_data.push((first, given));
        if given == 0 || given > count || first == 0 || first.saturating_add(given) >= MAX_BLOCK_NUMBER {
            return Err(Error::corruption(format!("allocator returned {given} blocks at {first} for {count} asked")));
        }
        self.blocks_owned += given;
        Ok((first, given))
    }

    fn release_extent(&mut self, entry: Entry) -> Result<()> {
        if let Some((first, count)) = entry.blocks() {
            self.release_blocks(first, count)?;
        }
        Ok(())
    }

    // ----- shared blocks -----

    /// The references of data block `block` as this operation has left them so far.
    fn references(&mut self, block: u64) -> Result<u64> {
        if let Some(references) = self.shares.get(&block) {
            return Ok(*references);
        }
        self.store.shared_references(block)
    }

    /// One more extent references `block`, which one extent at least already references: a
    /// block that was not shared now has two references.
    fn add_reference(&mut self, block: u64) -> Result<()> {
        let references = match self.references(block)? {
            0 => 2,
            count if count < crate::block::meta::MAX_SHARED_REFERENCES => count + 1,
            count => return Err(Error::corruption(format!("data block {block}: {count} references, too many"))),
        };
        self.shares.insert(block, references);
        Ok(())
    }

    /// One extent stops referencing `block`; returns whether that was the last reference (the
    /// block is to be freed, and is recorded unshared). A block once shared stays marked shared
    /// (1 reference) while one extent still holds it, so its free room is never filled (see
    /// *Replay* in docs/EXTENTS.md).
    fn drop_reference(&mut self, block: u64) -> Result<bool> {
        let references = self.references(block)?;
        if references <= 1 {
            if references == 1 {
                self.shares.insert(block, 0);
            }
            return Ok(true);
        }
        self.shares.insert(block, references - 1);
        Ok(false)
    }

    // ----- search -----

    /// Finds the leaf entry that holds byte `position` (or the end of the file).
    pub fn locate(&mut self, position: u64) -> Result<Location> {
        assert!(position <= self.length);
        if let Some(location) = self.locate_near_hint(position) {
            #[cfg(debug_assertions)]
            self.check_hinted(position, &location);
            return Ok(location);
        }
        self.descend(position)
    }

    /// Searches from the root, summing each level's entries down to the leaf holding
    /// `position`, and leaves the hint there.
    fn descend(&mut self, position: u64) -> Result<Location> {
        #[cfg(test)]
        {
            self.descents += 1;
        }
        let mut path = Vec::with_capacity(self.depth + 1);
        let mut id = ROOT_ID;
        let mut level = self.depth;
        let mut remaining = position;
        let mut node_length = self.length;
        for _ in 0..=MAX_DEPTH {
            if id != ROOT_ID {
                self.load(id, level, node_length)?;
            }
            let entries = self.entries(id);
            let mut start = 0u64;
            if level == 0 {
                let mut index = entries.len();
                for (at, entry) in entries.iter().enumerate() {
                    if remaining < start + entry.length {
                        index = at;
                        break;
                    }
                    start += entry.length;
                }
                if index == entries.len() && remaining != start {
                    return Err(Error::corruption(format!("extent node {id}: lengths do not reach byte {position}")));
                }
                path.push((id, index));
                let leaf_start = position - remaining;
                self.hint = Some(Hint::new(&path, leaf_start, leaf_start + start));
                return Ok(Location { path, offset_in_entry: remaining - start });
            }
            if entries.is_empty() {
                return Err(Error::corruption(format!("extent node {id}: internal node without entries")));
            }
            // The end of the file descends into the last child, so appends land in the last leaf.
            let mut chosen = entries.len() - 1;
            for (index, entry) in entries.iter().enumerate() {
                if remaining < start + entry.length {
                    chosen = index;
                    break;
                }
                if index + 1 < entries.len() {
                    start += entry.length;
                }
            }
            let child = entries[chosen];
            if remaining < start || remaining - start > child.length {
                return Err(Error::corruption(format!("extent node {id}: lengths do not reach byte {position}")));
            }
            path.push((id, chosen));
            remaining -= start;
            node_length = child.length;
            id = child.address;
            level -= 1;
        }
        Err(Error::corruption("extent tree deeper than its root says"))
    }

    /// `position` found from the hint, when it lies in the hint's leaf: a walk over the entries
    /// between the hinted one and the one holding `position`, none of the levels above. None
    /// when there is no hint or `position` lies outside its leaf (then `descend`). The leaf's
    /// range is where a descent would end for `position`: from its first byte up to, not
    /// including, its end, or up to the end of the file for the file's last leaf.
    fn locate_near_hint(&mut self, position: u64) -> Option<Location> {
        let hint = self.hint.as_mut()?;
        let (leaf, hinted) = hint.leaf();
        let (entries, leaf_length): (&[Entry], Option<u64>) = if leaf == ROOT_ID {
            (&self.root, Some(self.length))
        } else {
            let node = self.nodes.get(&leaf)?;
            (&node.entries, node.length)
        };
        let leaf_end = hint.leaf_start.checked_add(leaf_length?)?;
        if position < hint.leaf_start || position > leaf_end || (position == leaf_end && leaf_end != self.length) {
            return None;
        }
        let mut index = hinted.min(entries.len());
        let mut start = hint.entry_start;
        // Both walks are bounded by the leaf's entries: each step moves one entry.
        while position < start {
            index = index.checked_sub(1)?;
            start = start.checked_sub(entries[index].length)?;
        }
        while index < entries.len() && position - start >= entries[index].length {
            start += entries[index].length;
            index += 1;
        }
        if index == entries.len() && position != start {
            return None;
        }
        hint.steps[hint.depth - 1].1 = index;
        hint.entry_start = start;
        Some(Location { path: hint.path().to_vec(), offset_in_entry: position - start })
    }

    /// Debug builds: a location found from the hint is the one a descent from the root finds.
    /// The descent loads no node the hint's path did not (they are all held), and the hint
    /// is left as the hinted search left it.
    #[cfg(debug_assertions)]
    fn check_hinted(&mut self, position: u64, location: &Location) {
        let hint = self.hint.clone();
        #[cfg(test)]
        let descents = self.descents;
        let descended = self.descend(position).expect("the hint's path was searched before");
        assert_eq!(descended.path, location.path, "hinted search of byte {position}: another path");
        assert_eq!(descended.offset_in_entry, location.offset_in_entry, "hinted search of byte {position}");
        self.hint = hint;
        #[cfg(test)]
        {
            self.descents = descents;
        }
    }

    /// The hint that `splice` of the leaf of `path` at entry `start` leaves, taken before the
    /// change: the leaf's start and entry `start`'s, which a change from `start` on keeps. None
    /// when the hint is of another leaf.
    fn hint_at(&self, path: &[(u64, usize)], start: usize) -> Option<Hint> {
        let hint = self.hint.as_ref()?;
        let (leaf, _) = *path.last()?;
        let (hinted_leaf, hinted) = hint.leaf();
        if hint.depth != path.len() || hinted_leaf != leaf || hint.path()[..path.len() - 1] != path[..path.len() - 1] {
            return None;
        }
        let entries = self.entries(leaf);
        if hinted > entries.len() || start > entries.len() {
            return None;
        }
        let entry_start = if start <= hinted {
            hint.entry_start.checked_sub(sum_lengths(&entries[start..hinted])?)?
        } else {
            hint.entry_start.checked_add(sum_lengths(&entries[hinted..start])?)?
        };
        let mut carried = Hint::new(path, hint.leaf_start, entry_start);
        carried.steps[carried.depth - 1].1 = start;
        Some(carried)
    }

    fn entry_at(&self, location: &Location) -> Option<Entry> {
        self.entries(location.leaf()).get(location.index()).copied()
    }

    // ----- structural change -----

    /// Replaces `remove` entries from `start` in the leaf of `path` by `insert`, carries the
    /// change of length up the path, and rebalances.
    fn splice(&mut self, path: &[(u64, usize)], start: usize, remove: usize, insert: &[Entry]) -> Result<()> {
        let leaf = path.last().expect("path has a leaf").0;
        assert!(insert.iter().all(|entry| entry.length > 0));
        // Every node on the path grows or shrinks by the same bytes: their summed lengths stay
        // known (`CachedNode::length`), so the operation's next search sums nothing again.
        assert!(path.len() <= MAX_DEPTH + 1, "a path is bounded by the depth");
        let mut known = [None; MAX_DEPTH + 1];
        for (slot, (id, _)) in known.iter_mut().zip(path) {
            *slot = self.nodes.get(id).and_then(|node| node.length);
        }
        let carried = self.hint_at(path, start);
        let entries = self.entries_mut(leaf);
        assert!(start + remove <= entries.len());
        let removed = sum_lengths(&entries[start..start + remove]).expect("validated lengths");
        let added = sum_lengths(insert).expect("new lengths fit");
        entries.splice(start..start + remove, insert.iter().copied());
        for &(id, index) in &path[..path.len() - 1] {
            let entry = &mut self.entries_mut(id)[index];
            assert!(entry.length >= removed);
            entry.length = entry.length - removed + added;
        }
        for (&(id, _), length) in path.iter().zip(known) {
            if let (Some(node), Some(length)) = (self.nodes.get_mut(&id), length) {
                node.length = length.checked_sub(removed).and_then(|length| length.checked_add(added));
            }
        }
        assert!(self.length >= removed);
        self.length = self.length - removed + added;
        assert!(self.length <= MAX_FILE_BYTES);
        // Rebalancing forgets it again if it moves entries between nodes.
        self.hint = carried;
        self.rebalance(path)
    }

    /// Restores the node size bounds along `path`, bottom up: splits nodes over capacity, merges
    /// or refills nodes under the minimum from a sibling, then grows or shrinks the root.
    fn rebalance(&mut self, path: &[(u64, usize)]) -> Result<()> {
        for step in (1..path.len()).rev() {
            let id = path[step].0;
            let (parent, parent_index) = path[step - 1];
            let level = self.depth - step;
            let count = self.entries(id).len();
            if count > NODE_CAPACITY {
                let new_id = self.allocate_node(id)?;
                let moved = self.entries_mut(id).split_off(count / 2);
                let moved_length = sum_lengths(&moved).expect("lengths fit");
                self.nodes.insert(new_id, CachedNode::new(level, moved));
                let parent_entries = self.entries_mut(parent);
                parent_entries[parent_index].length -= moved_length;
                parent_entries.insert(parent_index + 1, Entry::child(new_id, moved_length));
            } else if count < NODE_MIN_ENTRIES {
                let parent_count = self.entries(parent).len();
                if parent_count < 2 {
                    continue;
                }
                let left_index = if parent_index + 1 < parent_count { parent_index } else { parent_index - 1 };
                let right_index = left_index + 1;
                let left = self.entries(parent)[left_index];
                let right = self.entries(parent)[right_index];
                if left.address == right.address {
                    return Err(Error::corruption(format!(
                        "extent node {}: names child {} twice",
                        parent, left.address
                    )));
                }
                self.load(left.address, level, left.length)?;
                self.load(right.address, level, right.length)?;
                let left_count = self.entries(left.address).len();
                let right_count = self.entries(right.address).len();
                let total = left_count + right_count;
                if total <= NODE_CAPACITY {
                    let moved = std::mem::take(self.entries_mut(right.address));
                    self.entries_mut(left.address).extend(moved);
                    let parent_entries = self.entries_mut(parent);
                    parent_entries[left_index].length += right.length;
                    parent_entries.remove(right_index);
                    self.free_node(right.address);
                } else {
                    let target = total / 2;
                    if left_count > target {
                        let moved = self.entries_mut(left.address).split_off(target);
                        self.entries_mut(right.address).splice(0..0, moved);
                    } else {
                        let moved: Vec<Entry> = self.entries_mut(right.address).drain(..target - left_count).collect();
                        self.entries_mut(left.address).extend(moved);
                    }
                    let new_left = sum_lengths(self.entries(left.address)).expect("lengths fit");
                    let parent_entries = self.entries_mut(parent);
                    parent_entries[left_index].length = new_left;
                    parent_entries[right_index].length = left.length + right.length - new_left;
                }
            }
        }
        if self.root.len() > ROOT_CAPACITY {
            if self.depth >= MAX_DEPTH {
                return Err(Error::FileTooLarge);
            }
            let new_id = self.allocate_node(0)?;
            let entries = std::mem::take(&mut self.root);
            self.nodes.insert(new_id, CachedNode::new(self.depth, entries));
            self.root = vec![Entry::child(new_id, self.length)];
            self.depth += 1;
        }
        for _ in 0..=MAX_DEPTH {
            if self.depth == 0 {
                break;
            }
            if self.root.is_empty() {
                self.depth = 0;
                break;
            }
            if self.root.len() != 1 {
                break;
            }
            let child = self.root[0];
            self.load(child.address, self.depth - 1, child.length)?;
            if self.entries(child.address).len() > ROOT_CAPACITY {
                break;
            }
            self.root = std::mem::take(self.entries_mut(child.address));
            self.free_node(child.address);
            self.depth -= 1;
        }
        Ok(())
    }

    /// The entries that replace extent `entry` when its first `left_length` bytes and its bytes
    /// `right_address..right_address + right_length` (up to its end) stay. If the right part
    /// begins inside the left part's last block, the two parts either share that block (its
    /// count of references grows by one, docs/EXTENTS.md, *Shared blocks*) or, while the file
    /// has room to spare (`copy_fits`), the left part's bytes of that block are copied into a
    /// new block at the same offsets and the right part keeps the block, its count unchanged.
    ///
    /// The copy is the cheaper cut: a count lives in the generation-table block of the cut
    /// block, so cuts at random places of a large file each dirty a table block of their own,
    /// which the next checkpoint writes whole; a copy's new block is allocated beside the other
    /// copies and touches no count. Sharing is what keeps many small cuts from holding a block
    /// each. Replay: the bytes copied become unmapped bytes before the right part's first byte,
    /// which nothing writes until the block is freed (they are no extent's room), so a replay
    /// reads what the first application read, up to in-place writes of later records, which
    /// replay writes again over the copy (docs/EXTENTS.md, *Replay*).
    fn cut(&mut self, entry: Entry, left_length: u64, right_address: u64, right_length: u64) -> Result<Vec<Entry>> {
        assert!(!entry.is_hole() && left_length > 0 && right_length > 0);
        assert!(right_address >= entry.address + left_length);
        assert!(right_address + right_length == entry.address + entry.length);
        let left_end = entry.address + left_length;
        let left_last_block = (left_end - 1) / BLOCK_SIZE_U64;
        let right = Entry::data(right_address, right_length, entry.unwritten);
        if right_address / BLOCK_SIZE_U64 != left_last_block {
            return Ok(vec![Entry::data(entry.address, left_length, entry.unwritten), right]);
        }
        if !self.copy_fits() {
            self.add_reference(left_last_block)?;
            return Ok(vec![Entry::data(entry.address, left_length, entry.unwritten), right]);
        }
        let block_start = left_last_block * BLOCK_SIZE_U64;
        let copy_start = entry.address.max(block_start);
        let in_block = (copy_start - block_start) as usize;
        let piece = left_end - copy_start;
        assert!(in_block as u64 + piece < BLOCK_SIZE_U64);
        let (copy_block, _) = self.allocate_data(left_last_block, 1)?;
        if !entry.unwritten {
            self.store.copy_data(left_last_block, copy_block, in_block, piece as usize)?;
        }
        let mut pieces = Vec::with_capacity(3);
        if copy_start > entry.address {
            pieces.push(Entry::data(entry.address, copy_start - entry.address, entry.unwritten));
        }
        pieces.push(Entry::data(copy_block * BLOCK_SIZE_U64 + in_block as u64, piece, entry.unwritten));
        pieces.push(right);
        Ok(pieces)
    }

    /// Whether a cut may copy into a new block (`cut`): while the file, that block included,
    /// holds at most `1 + 1 / COPY_SLACK_DIVISOR` times its bytes. The file's own state decides,
    /// so a replay of the same records from the same checkpoint decides the same way up to
    /// where it packs runs (either way is safe, see `cut`).
    fn copy_fits(&self) -> bool {
        let held_bytes = self.blocks_owned.saturating_add(1).saturating_mul(BLOCK_SIZE_U64);
        held_bytes <= self.length.saturating_add(self.length / COPY_SLACK_DIVISOR)
    }

    /// Gives back the references of one extent to data blocks `first..first + count` (all its
    /// blocks, or the ones a cut leaves behind). Only the first and the last block can be shared
    /// with other extents (every byte of a block between them belongs to this extent), so only
    /// they are looked up; a block is freed when its last reference goes.
    fn release_blocks(&mut self, first: u64, count: u64) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let last = first + count - 1;
        let mut freed = Vec::with_capacity(3);
        if self.drop_reference(first)? {
            freed.push((first, 1));
        }
        if last > first + 1 {
            freed.push((first + 1, last - first - 1));
        }
        if last > first && self.drop_reference(last)? {
            freed.push((last, 1));
        }
        let freed_count: u64 = freed.iter().map(|run| run.1).sum();
        self.blocks_owned = self
            .blocks_owned
            .checked_sub(freed_count)
            .ok_or_else(|| Error::corruption("extent root field blocks_owned: smaller than the blocks in the tree"))?;
        self.forget_freed_pack_room(&freed);
        self.freed_data.extend(freed);
        Ok(())
    }

    /// The pack block goes when its last run goes: its room is offered no more. Commit makes
    /// the store forget it too (`forget_pack_room`), which is enough for one change; a run of
    /// changes (`super::FileRun`) commits later, and its next packed write must not find the
    /// room of a block it has already freed.
    fn forget_freed_pack_room(&mut self, freed: &[(u64, u64)]) {
        let Some(file) = self.pack_file else { return };
        if !self.pack_loaded {
            self.pack_room = self.store.pack_room(file);
            self.pack_loaded = true;
        }
        if let Some((block, _)) = self.pack_room {
            if freed.iter().any(|&(first, count)| (first..first + count).contains(&block)) {
                self.pack_room = None;
                self.pack_changed = true;
            }
        }
    }

    /// Makes `position` the start of an entry. Nothing is copied: a cut inside a block leaves
    /// both parts referencing it (see `cut`).
    pub fn split_at(&mut self, position: u64) -> Result<()> {
        if position >= self.length {
            return Ok(());
        }
        let location = self.locate(position)?;
        let cut = location.offset_in_entry;
        if cut == 0 {
            return Ok(());
        }
        let entry = self.entry_at(&location).expect("position inside an entry");
        let rest = entry.length - cut;
        let mut pieces = Vec::with_capacity(3);
        if entry.is_hole() {
            pieces.push(Entry::hole(cut));
            pieces.push(Entry::hole(rest));
        } else {
            pieces.extend(self.cut(entry, cut, entry.address + cut, rest)?);
        }
        self.splice(&location.path, location.index(), 1, &pieces)
    }

    /// Merges the entry that starts at `position` with its left neighbour when they can be one
    /// (same leaf only; a missed merge across leaves costs an entry, never correctness).
    pub fn coalesce(&mut self, position: u64) -> Result<()> {
        if position == 0 || position >= self.length {
            return Ok(());
        }
        let location = self.locate(position)?;
        let index = location.index();
        if location.offset_in_entry != 0 || index == 0 {
            return Ok(());
        }
        let entries = self.entries(location.leaf());
        if let Some((one, shared)) = merged(entries[index - 1], entries[index]) {
            if let Some(block) = shared {
                // Both neighbours reference the block, so the merge cannot be its last reference.
                if self.references(block)? < 2 || self.drop_reference(block)? {
                    return Err(Error::corruption(format!(
                        "data block {block}: two extents reference it, its count of references says fewer"
                    )));
                }
            }
            self.splice(&location.path, index - 1, 2, &[one])?;
        }
        Ok(())
    }

    /// Inserts a hole of `length` bytes at entry boundary `position`, shifting later bytes up.
    pub fn insert_hole(&mut self, position: u64, length: u64) -> Result<()> {
        self.put_hole(position, length)?;
        self.coalesce(position + length)?;
        self.coalesce(position)
    }

    /// Cuts the tree at `position` and puts a hole of `length` bytes there, shifting later
    /// bytes up; neighbours are left unmerged (the callers merge what they need).
    fn put_hole(&mut self, position: u64, length: u64) -> Result<()> {
        assert!(length > 0);
        if !matches!(self.length.checked_add(length), Some(total) if total <= MAX_FILE_BYTES) {
            return Err(Error::FileTooLarge);
        }
        self.split_at(position)?;
        let location = self.locate(position)?;
        assert_eq!(location.offset_in_entry, 0);
        self.splice(&location.path, location.index(), 0, &[Entry::hole(length)])
    }

    /// Inserts `data` at entry boundary or inside-entry `position`, shifting later bytes up:
    /// what `insert_hole(position, n)` and then `write(position, data)` leave, with the same
    /// cut, the same fill (room, pack block or new blocks, chosen from the same neighbours) and
    /// the same merge with the entry after, but one search for the place where those two make
    /// nine. The hole is filled where it is put, so it is never merged with a neighbouring hole
    /// and split off again (which changes no byte, only where the entries lie in the leaves).
    pub fn insert_data(&mut self, position: u64, data: &[u8]) -> Result<()> {
        let length = data.len() as u64;
        assert!(length > 0 && position <= self.length);
        self.put_hole(position, length)?;
        let end = position + length;
        self.fill_hole(position, end, Some((data, position)))?;
        self.coalesce(end)
    }

    /// Removes bytes `start..end`, shifting later bytes down and releasing their blocks.
    /// Extents cut at either end are trimmed and keep their blocks, so nothing is copied (a range
    /// inside one block in the middle of one extent leaves both ends referencing that block).
    pub fn remove_range(&mut self, start: u64, end: u64) -> Result<()> {
        assert!(start <= end && end <= self.length);
        let mut remaining = end - start;
        // Each round removes at least one byte, or ends the loop.
        while remaining > 0 {
            let location = self.locate(start)?;
            let index = location.index();
            let offset = location.offset_in_entry;
            let entry =
                self.entry_at(&location).ok_or_else(|| Error::corruption("extent tree ends before its length"))?;
            if offset > 0 {
                let tail = entry.length - offset;
                let replacement = if tail <= remaining {
                    // The range starts inside this entry and covers its tail: keep the head.
                    if let Some((first, count)) = entry.blocks() {
                        let kept_blocks = (entry.address + offset - 1) / BLOCK_SIZE_U64 - first + 1;
                        self.release_blocks(first + kept_blocks, count - kept_blocks)?;
                    }
                    remaining -= tail;
                    if entry.is_hole() {
                        vec![Entry::hole(offset)]
                    } else {
                        vec![Entry::data(entry.address, offset, entry.unwritten)]
                    }
                } else if entry.is_hole() {
                    let shorter = entry.length - remaining;
                    remaining = 0;
                    vec![Entry::hole(shorter)]
                } else {
                    // The range lies strictly inside this extent: keep both ends.
                    let right_address = entry.address + offset + remaining;
                    let right_length = entry.length - offset - remaining;
                    let left_last_block = (entry.address + offset - 1) / BLOCK_SIZE_U64;
                    let right_first_block = right_address / BLOCK_SIZE_U64;
                    if right_first_block > left_last_block + 1 {
                        self.release_blocks(left_last_block + 1, right_first_block - left_last_block - 1)?;
                    }
                    remaining = 0;
                    self.cut(entry, offset, right_address, right_length)?
                };
                self.splice(&location.path, index, 1, &replacement)?;
                continue;
            }
            let entries = self.entries(location.leaf());
            let mut count = 0;
            let mut covered = 0u64;
            while index + count < entries.len() && covered + entries[index + count].length <= remaining {
                covered += entries[index + count].length;
                count += 1;
            }
            if count > 0 {
                let released: Vec<Entry> = entries[index..index + count].to_vec();
                for entry in released {
                    self.release_extent(entry)?;
                }
                self.splice(&location.path, index, count, &[])?;
                remaining -= covered;
                continue;
            }
            // The range ends inside this entry: drop its head, keep the rest and its blocks.
            let rest = entry.length - remaining;
            let replacement = if entry.is_hole() {
                Entry::hole(rest)
            } else {
                let new_address = entry.address + remaining;
                let first = entry.address / BLOCK_SIZE_U64;
                self.release_blocks(first, new_address / BLOCK_SIZE_U64 - first)?;
                Entry::data(new_address, rest, entry.unwritten)
            };
            self.splice(&location.path, index, 1, &[replacement])?;
            remaining = 0;
        }
        self.coalesce(start)
    }

    /// Extends the file with a hole up to `new_length`.
    pub fn grow(&mut self, new_length: u64) -> Result<()> {
        assert!(new_length >= self.length);
        if new_length > MAX_FILE_BYTES {
            return Err(Error::FileTooLarge);
        }
        if new_length > self.length {
            let old_length = self.length;
            self.insert_hole(old_length, new_length - old_length)?;
        }
        Ok(())
    }

    /// Gives the hole that covers exactly `start..end` blocks: written with `data` (whose first
    /// byte belongs at `data_start`), or unwritten when `data` is None. Where the extent just
    /// before is of the same kind and its blocks can continue, it grows instead of a new extent
    /// being added: this is what keeps sequential appends in one extent.
    pub fn fill_hole(&mut self, start: u64, end: u64, data: Option<(&[u8], u64)>) -> Result<()> {
        let unwritten = data.is_none();
        let mut position = start;
        while position < end {
            let location = self.locate(position)?;
            let index = location.index();
            let hole = self.entry_at(&location);
            if location.offset_in_entry != 0
                || !matches!(hole, Some(hole) if hole.is_hole() && hole.length == end - position)
            {
                return Err(Error::corruption("extent tree changed shape while filling a hole"));
            }
            let hole_length = end - position;
            let previous = if index > 0 { Some(self.entries(location.leaf())[index - 1]) } else { None };
            let previous = previous.filter(|entry| !entry.is_hole() && entry.unwritten == unwritten);
            let taken;
            let (replace_start, replace_count, mut replacement);
            let write_at;
            // The bytes go to the start of blocks this fill was just handed, whose other bytes
            // nothing maps: written with zeros after them, so no old byte is read for the checksum.
            let mut fresh = false;
            // The rest of the previous extent's last block is free room it may fill only if the
            // block was never shared (docs/EXTENTS.md, *Replay*).
            let previous_room = match previous {
                Some(previous) if (previous.address + previous.length) % BLOCK_SIZE_U64 != 0 => {
                    self.references((previous.address + previous.length) / BLOCK_SIZE_U64)? == 0
                }
                _ => false,
            };
            let pack = data.is_some() && !previous_room && end < self.length && hole_length < PACK_MAX_BYTES;
            let packed = if pack { self.pack_place(hole_length, previous)? } else { None };
            match previous {
                _ if packed.is_some() => {
                    // A small run inside the file goes into the free room of the file's pack block.
                    let (address, new_block) = packed.expect("checked");
                    write_at = address;
                    fresh = new_block;
                    taken = hole_length;
                    replacement = vec![Entry::data(write_at, taken, unwritten)];
                    (replace_start, replace_count) = (index, 1);
                }
                Some(previous) if previous_room => {
                    // The rest of the previous extent's last block is its own: use it first.
                    let end_address = previous.address + previous.length;
                    taken = hole_length.min(BLOCK_SIZE_U64 - end_address % BLOCK_SIZE_U64);
                    write_at = end_address;
                    replacement = vec![Entry::data(previous.address, previous.length + taken, unwritten)];
                    (replace_start, replace_count) = (index - 1, 2);
                }
                _ => {
                    let near = previous.map_or(0, |previous| (previous.address + previous.length) / BLOCK_SIZE_U64);
                    let wanted = hole_length.div_ceil(BLOCK_SIZE_U64).min(MAX_RUN_BLOCKS);
                    let (first, given) = self.allocate_data(near, wanted)?;
                    taken = hole_length.min(given * BLOCK_SIZE_U64);
                    write_at = first * BLOCK_SIZE_U64;
                    fresh = true;
                    match previous {
                        Some(previous) if previous.address + previous.length == write_at => {
                            replacement = vec![Entry::data(previous.address, previous.length + taken, unwritten)];
                            (replace_start, replace_count) = (index - 1, 2);
                        }
                        _ => {
                            replacement = vec![Entry::data(write_at, taken, unwritten)];
                            (replace_start, replace_count) = (index, 1);
                        }
                    }
                }
            }
            if let Some((bytes, data_start)) = data {
                let from = (position - data_start) as usize;
                let chunk = &bytes[from..from + taken as usize];
                if fresh {
                    assert!(write_at.is_multiple_of(BLOCK_SIZE_U64), "fresh blocks are written from their start");
                    self.store.write_fresh(write_at / BLOCK_SIZE_U64, chunk)?;
                } else {
                    self.store.write_data(write_at / BLOCK_SIZE_U64, (write_at % BLOCK_SIZE_U64) as usize, chunk)?;
                }
            }
            if hole_length > taken {
                replacement.push(Entry::hole(hole_length - taken));
            }
            self.splice(&location.path, replace_start, replace_count, &replacement)?;
            position += taken;
        }
        Ok(())
    }

    /// Where `length` bytes (less than `PACK_MAX_BYTES`) of the file go in its pack block: the
    /// free room after the last run packed there, or the start of a new block (allocated near
    /// `previous`, marked shared from the start so that no extent fills its room the other way).
    /// None when this tree packs nothing (`pack_file`). Every byte of the room has never been
    /// mapped since the block was handed out, so nothing read it (docs/EXTENTS.md, *Packing*).
    /// Returns the address and whether the block is new (nothing written in it yet).
    fn pack_place(&mut self, length: u64, previous: Option<Entry>) -> Result<Option<(u64, bool)>> {
        assert!(length > 0 && length < PACK_MAX_BYTES);
        let Some(file) = self.pack_file else { return Ok(None) };
        if !self.pack_loaded {
            self.pack_room = self.store.pack_room(file);
            self.pack_loaded = true;
        }
        if let Some((block, used)) = self.pack_room {
            if used + length <= BLOCK_SIZE_U64 {
                if self.references(block)? == 0 {
                    return Err(Error::corruption(format!("pack block {block} is not marked shared")));
                }
                self.add_reference(block)?;
                self.pack_room = (used + length < BLOCK_SIZE_U64).then_some((block, used + length));
                self.pack_changed = true;
                return Ok(Some((block * BLOCK_SIZE_U64 + used, false)));
            }
        }
        let near = previous.map_or(0, |previous| (previous.address + previous.length) / BLOCK_SIZE_U64);
        let (block, _) = self.allocate_data(near, 1)?;
        self.shares.insert(block, 1);
        self.pack_room = Some((block, length));
        self.pack_changed = true;
        Ok(Some((block * BLOCK_SIZE_U64, true)))
    }

    /// Gives the hole `start..end` written extents over `runs`, data blocks its caller took
    /// from the allocator itself (a direct write's, filled before its record was logged): the
    /// range's bytes start at the first run's first block and fill the runs in order, and the
    /// runs hold exactly the blocks the range needs. Nothing is allocated or written here.
    pub fn map_hole(&mut self, start: u64, end: u64, runs: &[(u64, u64)]) -> Result<()> {
        assert!(start < end && end <= self.length);
        let blocks: u64 = runs.iter().map(|run| run.1).sum();
        if blocks != (end - start).div_ceil(BLOCK_SIZE_U64) {
            return Err(Error::corruption(format!("{blocks} blocks mapped for {} bytes", end - start)));
        }
        self.split_at(start)?;
        self.split_at(end)?;
        let mut position = start;
        // Bounded by the runs: each pass maps one.
        for &(first, count) in runs {
            let location = self.locate(position)?;
            let hole = self.entry_at(&location);
            if location.offset_in_entry != 0
                || !matches!(hole, Some(hole) if hole.is_hole() && hole.length == end - position)
            {
                return Err(Error::corruption("extent tree changed shape while mapping a direct write"));
            }
            if count == 0 || first == 0 || first.saturating_add(count) >= MAX_BLOCK_NUMBER {
                return Err(Error::corruption(format!("direct write maps {count} blocks at {first}")));
            }
            let taken = (end - position).min(count * BLOCK_SIZE_U64);
            let mut replacement = vec![Entry::data(first * BLOCK_SIZE_U64, taken, false)];
            if end - position > taken {
                replacement.push(Entry::hole(end - position - taken));
            }
            self.splice(&location.path, location.index(), 1, &replacement)?;
            self.blocks_owned += count;
            self.coalesce(position)?;
            position += taken;
        }
        self.coalesce(end)
    }

    /// Writes `data` at `offset`: in place over written extents, into unwritten extents (which
    /// become written, widened to whole blocks with zeros so that no cut inside a block is
    /// needed), and into new blocks over holes. Past the end the file first grows by a hole.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset + data.len() as u64;
        if end > self.length {
            self.grow(end)?;
        }
        let mut position = offset;
        while position < end {
            let location = self.locate(position)?;
            let entry =
                self.entry_at(&location).ok_or_else(|| Error::corruption("extent tree ends before its length"))?;
            let entry_start = position - location.offset_in_entry;
            let segment_end = end.min(entry_start + entry.length);
            let chunk = &data[(position - offset) as usize..(segment_end - offset) as usize];
            if entry.is_hole() {
                self.split_at(position)?;
                self.split_at(segment_end)?;
                self.fill_hole(position, segment_end, Some((data, offset)))?;
                self.coalesce(segment_end)?;
            } else if !entry.unwritten {
                let address = entry.address + location.offset_in_entry;
                self.store.write_data(address / BLOCK_SIZE_U64, (address % BLOCK_SIZE_U64) as usize, chunk)?;
            } else {
                self.write_unwritten(entry_start, entry, position, chunk)?;
            }
            position = segment_end;
        }
        Ok(())
    }

    fn write_unwritten(&mut self, entry_start: u64, entry: Entry, position: u64, chunk: &[u8]) -> Result<()> {
        let data_address = entry.address + (position - entry_start);
        let data_end_address = data_address + chunk.len() as u64;
        let first_address = entry.address.max(data_address / BLOCK_SIZE_U64 * BLOCK_SIZE_U64);
        let last_address = (entry.address + entry.length).min(round_up_to_block(data_end_address));
        let zeros = [0u8; BLOCK_SIZE];
        if first_address < data_address {
            let count = (data_address - first_address) as usize;
            self.store.write_data(
                first_address / BLOCK_SIZE_U64,
                (first_address % BLOCK_SIZE_U64) as usize,
                &zeros[..count],
            )?;
        }
        self.store.write_data(data_address / BLOCK_SIZE_U64, (data_address % BLOCK_SIZE_U64) as usize, chunk)?;
        if data_end_address < last_address {
            let count = (last_address - data_end_address) as usize;
            self.store.write_data(
                data_end_address / BLOCK_SIZE_U64,
                (data_end_address % BLOCK_SIZE_U64) as usize,
                &zeros[..count],
            )?;
        }
        let start = entry_start + (first_address - entry.address);
        let end = entry_start + (last_address - entry.address);
        self.set_unwritten(start, end, false)
    }

    /// Writes `count` zero bytes at physical byte `address` (inside blocks the file owns).
    fn write_zeros(&mut self, address: u64, count: u64) -> Result<()> {
        let zeros = [0u8; BLOCK_SIZE];
        let mut done = 0;
        while done < count {
            let at = address + done;
            let take = (count - done).min(BLOCK_SIZE_U64 - at % BLOCK_SIZE_U64);
            self.store.write_data(at / BLOCK_SIZE_U64, (at % BLOCK_SIZE_U64) as usize, &zeros[..take as usize])?;
            done += take;
        }
        Ok(())
    }

    /// Makes `start..end` read as zeros without changing the length: `punch` turns the whole
    /// blocks inside the range into a hole and frees them, otherwise they are kept and marked
    /// unwritten. Bytes that share a block with bytes outside the range are zeroed in place, so
    /// no cut falls inside a block and no block is copied.
    pub fn clear(&mut self, start: u64, end: u64, punch: bool) -> Result<()> {
        assert!(start <= end && end <= self.length);
        let mut position = start;
        while position < end {
            let location = self.locate(position)?;
            let entry =
                self.entry_at(&location).ok_or_else(|| Error::corruption("extent tree ends before its length"))?;
            let entry_start = position - location.offset_in_entry;
            let entry_end = entry_start + entry.length;
            let piece_end = end.min(entry_end);
            if entry.is_hole() || (entry.unwritten && !punch) {
                position = piece_end;
                continue;
            }
            let physical = |logical: u64| entry.address + (logical - entry_start);
            let logical = |address: u64| entry_start + (address - entry.address);
            // Cut only at block boundaries or at the extent's own ends.
            let cut_start = if position == entry_start {
                position
            } else {
                logical(round_up_to_block(physical(position)).min(physical(piece_end)))
            };
            let cut_end = if piece_end == entry_end {
                piece_end
            } else {
                logical((physical(piece_end) / BLOCK_SIZE_U64 * BLOCK_SIZE_U64).max(physical(position)))
            };
            if cut_start >= cut_end {
                if !entry.unwritten {
                    self.write_zeros(physical(position), piece_end - position)?;
                }
                position = piece_end;
                continue;
            }
            if !entry.unwritten {
                self.write_zeros(physical(position), cut_start - position)?;
                self.write_zeros(physical(cut_end), piece_end - cut_end)?;
            }
            self.split_at(cut_start)?;
            self.split_at(cut_end)?;
            let location = self.locate(cut_start)?;
            let inner = self
                .entry_at(&location)
                .filter(|inner| location.offset_in_entry == 0 && inner.length == cut_end - cut_start)
                .ok_or_else(|| Error::corruption("extent tree changed shape while clearing a range"))?;
            let replacement = if punch {
                self.release_extent(inner)?;
                Entry::hole(inner.length)
            } else {
                Entry::data(inner.address, inner.length, true)
            };
            self.splice(&location.path, location.index(), 1, &[replacement])?;
            self.coalesce(cut_end)?;
            self.coalesce(cut_start)?;
            position = piece_end;
        }
        self.coalesce(end)?;
        self.coalesce(start)
    }

    /// Marks the extents in `start..end` written or unwritten (holes stay holes).
    pub fn set_unwritten(&mut self, start: u64, end: u64, unwritten: bool) -> Result<()> {
        self.split_at(start)?;
        self.split_at(end)?;
        let mut position = start;
        while position < end {
            let location = self.locate(position)?;
            let entry =
                self.entry_at(&location).ok_or_else(|| Error::corruption("extent tree ends before its length"))?;
            if location.offset_in_entry != 0 {
                return Err(Error::corruption("extent tree changed shape while marking extents"));
            }
            if !entry.is_hole() && entry.unwritten != unwritten {
                let changed = Entry::data(entry.address, entry.length, unwritten);
                self.splice(&location.path, location.index(), 1, &[changed])?;
            }
            position += entry.length;
        }
        self.coalesce(end)?;
        self.coalesce(start)
    }

    /// Reserves blocks for the holes in `start..end` as unwritten extents.
    pub fn allocate(&mut self, start: u64, end: u64) -> Result<()> {
        assert!(end <= self.length);
        // Only holes are cut (which copies nothing): extents with blocks are left whole.
        let mut position = start;
        while position < end {
            let location = self.locate(position)?;
            let entry =
                self.entry_at(&location).ok_or_else(|| Error::corruption("extent tree ends before its length"))?;
            // A merge behind us may have made `position` fall inside an extent.
            let piece_end = end.min(position - location.offset_in_entry + entry.length);
            if entry.is_hole() {
                self.split_at(position)?;
                self.split_at(piece_end)?;
                self.fill_hole(position, piece_end, None)?;
                self.coalesce(piece_end)?;
            }
            position = piece_end;
        }
        self.coalesce(end)?;
        self.coalesce(start)
    }

    /// Copies bytes `offset..offset + buffer.len()` (inside the file) into `buffer`.
    pub fn read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        let end = offset + buffer.len() as u64;
        assert!(end <= self.length);
        let mut position = offset;
        while position < end {
            let location = self.locate(position)?;
            let entries = self.entries(location.leaf());
            let mut skip = location.offset_in_entry;
            let mut pieces = Vec::new();
            let mut piece_position = position;
            for entry in &entries[location.index()..] {
                if piece_position >= end {
                    break;
                }
                let count = (entry.length - skip).min(end - piece_position);
                pieces.push((piece_position, *entry, skip, count));
                piece_position += count;
                skip = 0;
            }
            if pieces.is_empty() {
                return Err(Error::corruption("extent tree ends before its length"));
            }
            for (piece_position, entry, skip, count) in pieces {
                let from = (piece_position - offset) as usize;
                let target = &mut buffer[from..from + count as usize];
                if entry.is_hole() || entry.unwritten {
                    target.fill(0);
                } else {
                    let address = entry.address + skip;
                    // A damaged data block is reported with where it lies in the file.
                    self.store
                        .read_data(address / BLOCK_SIZE_U64, (address % BLOCK_SIZE_U64) as usize, target)
                        .map_err(|error| match error {
                            Error::Corruption { what } => Error::corruption(format!(
                                "file bytes {piece_position}..{}: {what}",
                                piece_position + count
                            )),
                            other => other,
                        })?;
                }
            }
            position = piece_position;
        }
        Ok(())
    }

    /// Calls `visit` for every entry in order from the one holding byte `from`; stops when it
    /// returns false.
    pub fn visit(&mut self, from: u64, visit: &mut dyn FnMut(u64, Entry) -> bool) -> Result<()> {
        if from >= self.length {
            return Ok(());
        }
        // Start at the entry holding `from`: one descent, then leaf by leaf.
        let mut position = from - self.locate(from)?.offset_in_entry;
        while position < self.length {
            let location = self.locate(position)?;
            if location.offset_in_entry != 0 {
                return Err(Error::corruption("extent tree walk lost its place"));
            }
            let entries: Vec<Entry> = self.entries(location.leaf())[location.index()..].to_vec();
            if entries.is_empty() {
                return Err(Error::corruption("extent tree ends before its length"));
            }
            for entry in entries {
                if !visit(position, entry) {
                    return Ok(());
                }
                position += entry.length;
            }
        }
        Ok(())
    }
}
