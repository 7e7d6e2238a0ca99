//! The front end's state: what callers see before the back end has applied it.
//!
//! - `views`: the current attributes of every inode with changes not yet applied, and of
//!   recently used ones (the NICFS inode cache);
//! - `names`: directory entries added or removed but not yet applied (the name overlay), and
//!   applied ones found in H-trees (the lookup cache), in one table;
//! - per-inode `pending_writes`: bytes written but not yet merged home (the per-block update
//!   lists), laid over home data on read.
//!
//! A view is the truth while it exists; it is loaded from the volume when absent, which is
//! only ever the case when nothing about that inode is pending.

use crate::backend::record::AttributeImage;
use crate::block::bitmap::Bitmap;
use crate::fs::types::{Attributes, FileType};
use crate::FastHashMap;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Views kept without pending changes before the least recently used are dropped.
pub const VIEW_CACHE_LIMIT: usize = 200_000;

/// Hashes an inode number so that neighbouring numbers land in neighbouring slots of a table:
/// the low bits (which choose the slot) are the number itself, the top bits (which hashbrown
/// keeps as a tag to tell slots apart) are mixed from it. Numbers are handed out in order, so
/// the views of files made together, and stat'ed together, share cache lines and pages instead
/// of costing a cache miss each.
#[derive(Default, Clone, Copy)]
pub struct InodeNumberHasher {
    hash: u64,
}

impl std::hash::Hasher for InodeNumberHasher {
    fn finish(&self) -> u64 {
        self.hash
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; any other key still gets a valid (slower) hash.
        for byte in bytes {
            self.write_u64(self.hash.rotate_left(8) ^ *byte as u64);
        }
    }

    fn write_u64(&mut self, number: u64) {
        let tag = number.wrapping_mul(0x9e37_79b9_7f4a_7c15) & 0xfe00_0000_0000_0000;
        self.hash = (number & !0xfe00_0000_0000_0000) | tag;
    }
}

/// Views by inode number.
pub type ViewMap = std::collections::HashMap<u64, InodeView, std::hash::BuildHasherDefault<InodeNumberHasher>>;

pub struct PendingWrite {
    pub lsn: u64,
    pub offset: u64,
    pub data: Arc<[u8]>,
}

pub struct InodeView {
    pub attributes: AttributeImage,
    /// Blocks owned as of the last applied change.
    pub blocks_owned: u64,
    /// Directories: entries, counting pending changes.
    pub entry_count: u64,
    /// The last record that changed this inode.
    pub last_change_lsn: u64,
    /// The last record that changed the shape of this file (truncate, insert, collapse, punch,
    /// zero, allocate) or, for a directory, its entries. Reads wait until it is applied.
    pub structural_lsn: u64,
    /// In lsn order: the back end trims the front as it applies.
    pub pending_writes: VecDeque<PendingWrite>,
    /// (lsn, blocks) of the records not yet applied that give this file new blocks (writes,
    /// allocate, zero range), in lsn order: `st_blocks` counts them at once, and applying the
    /// record replaces its estimate with the volume's own count in `blocks_owned`.
    pub pending_blocks: VecDeque<(u64, u64)>,
    pub open_count: u32,
    /// Unlinked while open: reclaimed at the last release.
    pub orphaned: bool,
    /// Freed: the number may be reused once this view is replaced.
    pub reclaimed: bool,
    /// Extended attributes, loaded on first use.
    pub xattrs: Option<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Changes with every record, so a reader can tell that its snapshot went stale.
    pub change_counter: u64,
    /// Directories: every entry is in the name overlay or the lookup cache, so a name found in
    /// neither does not exist and needs no H-tree walk. True for directories made since mount
    /// (they start empty); cleared whenever the lookup cache is emptied.
    pub complete: bool,
    /// The front end's use clock when the view was last used; written under the shared lock
    /// by readers (a relaxed store to the view's own line, so readers share nothing).
    pub last_use: std::sync::atomic::AtomicU64,
}

impl InodeView {
    pub fn new(attributes: AttributeImage, blocks_owned: u64, entry_count: u64) -> InodeView {
        InodeView {
            attributes,
            blocks_owned,
            entry_count,
            last_change_lsn: 0,
            structural_lsn: 0,
            pending_writes: VecDeque::new(),
            pending_blocks: VecDeque::new(),
            open_count: 0,
            orphaned: false,
            reclaimed: false,
            xattrs: None,
            change_counter: 0,
            complete: false,
            last_use: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn file_type(&self) -> FileType {
        self.attributes.file_type()
    }

    /// Drops pending writes that records up to `lsn` have made part of the home data.
    pub fn forget_writes_through(&mut self, lsn: u64) {
        while self.pending_writes.front().is_some_and(|write| write.lsn <= lsn) {
            self.pending_writes.pop_front();
        }
    }

    /// Drops the block estimates of records up to `lsn`, which the back end has applied.
    pub fn forget_blocks_through(&mut self, lsn: u64) {
        while self.pending_blocks.front().is_some_and(|(pending_lsn, _)| *pending_lsn <= lsn) {
            self.pending_blocks.pop_front();
        }
    }

    /// Records that the record `lsn` will give this file `blocks` new blocks.
    pub fn add_pending_blocks(&mut self, lsn: u64, blocks: u64) {
        assert!(self.pending_blocks.back().is_none_or(|(last, _)| *last < lsn), "block estimates in lsn order");
        if blocks > 0 {
            self.pending_blocks.push_back((lsn, blocks));
        }
    }

    pub fn to_attributes(&self) -> Attributes {
        let image = &self.attributes;
        // Blocks of records not yet applied (written data, fallocated space) are the file's
        // already, as on ext4: `du`, `stat` and sparse-file heuristics see them at once.
        let pending_blocks: u64 = self.pending_blocks.iter().map(|(_, blocks)| blocks).sum();
        Attributes {
            inode: image.inode_number,
            generation: image.generation,
            file_type: image.file_type(),
            permissions: image.mode & 0o7777,
            link_count: image.link_count,
            uid: image.uid,
            gid: image.gid,
            size_bytes: image.size_bytes,
            blocks_512: (self.blocks_owned + pending_blocks) * 8,
            access_time_ns: image.access_time_ns,
            modify_time_ns: image.modify_time_ns,
            change_time_ns: image.change_time_ns,
            birth_time_ns: image.birth_time_ns,
            rdev: image.rdev,
        }
    }
}

/// Names up to this many bytes are stored inside the table's slot, so that comparing a probed
/// key needs no second memory access; longer ones (rare) live on the heap.
const INLINE_NAME_BYTES: usize = 22;

/// The bytes of an entry name, inline when short.
#[derive(Clone)]
enum NameBytes {
    Inline { length: u8, bytes: [u8; INLINE_NAME_BYTES] },
    Heap(Box<[u8]>),
}

impl NameBytes {
    fn new(name: &[u8]) -> NameBytes {
        if name.len() <= INLINE_NAME_BYTES {
            let mut bytes = [0u8; INLINE_NAME_BYTES];
            bytes[..name.len()].copy_from_slice(name);
            NameBytes::Inline { length: name.len() as u8, bytes }
        } else {
            NameBytes::Heap(name.into())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            NameBytes::Inline { length, bytes } => &bytes[..*length as usize],
            NameBytes::Heap(bytes) => bytes,
        }
    }
}

/// A name in a directory: (directory inode, name bytes), as stored in the name table.
#[derive(Clone)]
pub struct NameKey {
    parent: u64,
    name: NameBytes,
}

/// What a name key and a borrowed (parent, name) pair have in common, so that the table can be
/// probed with a borrowed name: a lookup allocates nothing.
trait NameKeyParts {
    fn parts(&self) -> (u64, &[u8]);
}

impl NameKeyParts for NameKey {
    fn parts(&self) -> (u64, &[u8]) {
        (self.parent, self.name.as_slice())
    }
}

impl NameKeyParts for (u64, &[u8]) {
    fn parts(&self) -> (u64, &[u8]) {
        (self.0, self.1)
    }
}

impl std::hash::Hash for dyn NameKeyParts + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let (parent, name) = self.parts();
        parent.hash(state);
        name.hash(state);
    }
}

impl PartialEq for dyn NameKeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn NameKeyParts + '_ {}

// Hash and equality of a stored key must be those of its borrowed form (the `Borrow` contract).
impl std::hash::Hash for NameKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self as &dyn NameKeyParts).hash(state)
    }
}

impl PartialEq for NameKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for NameKey {}

impl<'a> std::borrow::Borrow<dyn NameKeyParts + 'a> for NameKey {
    fn borrow(&self) -> &(dyn NameKeyParts + 'a) {
        self
    }
}

/// What the front end knows about a name: where it points (`None`: absent), and the record
/// that set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameEntry {
    pub target: Option<(u64, FileType)>,
    /// The record that set the name; 0 for an answer found in the H-tree. While this record is
    /// not applied the entry is the name overlay; once it is, the H-tree says the same and the
    /// entry is a lookup-cache entry (GPU4FS's lookup cache) that may be dropped. Comparing with
    /// the applied lsn tells the two apart, so the back end never has to visit the table.
    pub lsn: u64,
}

/// Entries kept before the applied ones are dropped. Each entry is a table slot of about 64
/// bytes (names longer than 22 bytes add a heap copy), so the table holds about 32 MiB of short
/// names at this bound. Entries of records not yet applied are never dropped (they are the
/// truth until then); the log's size bounds them, and the table then holds at most twice them.
pub const LOOKUP_CACHE_LIMIT: usize = 500_000;

/// The name overlay and the lookup cache in one table, so that resolving a name is a single
/// probe with a borrowed key: no allocation, no H-tree walk. A name change replaces the entry
/// (the H-tree answer it held is about to be replaced).
pub struct NameTable {
    entries: FastHashMap<NameKey, NameEntry>,
    /// Size at which applied entries are dropped.
    trim_at: usize,
}

impl Default for NameTable {
    fn default() -> NameTable {
        NameTable { entries: Default::default(), trim_at: LOOKUP_CACHE_LIMIT }
    }
}

impl NameTable {
    pub fn get(&self, parent: u64, name: &[u8]) -> Option<&NameEntry> {
        self.entries.get(&(parent, name) as &dyn NameKeyParts)
    }

    /// Records a name change by record `lsn`; the caller has made room.
    pub fn set(&mut self, parent: u64, name: &[u8], target: Option<(u64, FileType)>, lsn: u64) {
        assert!(lsn > 0, "a name change needs the lsn of its record");
        let entry = NameEntry { target, lsn };
        match self.entries.get_mut(&(parent, name) as &dyn NameKeyParts) {
            Some(existing) => *existing = entry,
            None => {
                self.entries.insert(NameKey { parent, name: NameBytes::new(name) }, entry);
            }
        }
    }

    /// Keeps an answer found in the H-tree; the caller has made room.
    pub fn cache_applied(&mut self, parent: u64, name: &[u8], target: Option<(u64, FileType)>) {
        let key = NameKey { parent, name: NameBytes::new(name) };
        let previous = self.entries.insert(key, NameEntry { target, lsn: 0 });
        assert!(previous.is_none(), "a name in the table is never looked up in the H-tree");
    }

    /// When the table is at its bound, drops every entry whose record is applied (records up to
    /// `applied_lsn`); returns whether it dropped any. Pending entries stay; if they alone fill
    /// the table, the bound moves to twice their number so that the scan is not repeated for
    /// every new entry.
    fn make_room(&mut self, applied_lsn: u64) -> bool {
        if self.entries.len() < self.trim_at {
            return false;
        }
        let before = self.entries.len();
        self.entries.retain(|_, entry| entry.lsn > applied_lsn);
        self.trim_at = LOOKUP_CACHE_LIMIT.max(self.entries.len() * 2);
        self.entries.len() < before
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

pub struct Front {
    pub views: ViewMap,
    /// The name overlay and the lookup cache.
    pub names: NameTable,
    /// Inode numbers the front end may hand out (bit n - 1 is inode n).
    pub inode_numbers: Bitmap,
    pub next_generation: u64,
    /// Blocks promised to records not yet applied.
    pub reserved_blocks: u64,
    /// Blocks free in the volume as of the last applied batch.
    pub free_blocks: u64,
    /// Blocks of `free_blocks` that only extent-tree reserves may promise (see
    /// `engine::tree_pool_blocks`).
    pub tree_pool_blocks: u64,
    /// Blocks freed but not reusable before the next checkpoint.
    pub pending_free_blocks: u64,
    /// Sum of the image-block bounds of the records not yet applied; `append` keeps it within
    /// `image_budget_blocks`, so a checkpoint covering the whole backlog fits in the log.
    pub queued_image_blocks: u64,
    pub image_budget_blocks: u64,
    /// The last refused append was refused for the backlog bound alone (see `with_space`).
    pub refused_for_backlog: bool,
    /// Views dropped by `trim_views` so far: a caller that unlocked the front end can tell
    /// that a view it saw was dropped and loaded again (its change counter restarted).
    pub view_evictions: u64,
    pub use_clock: u64,
}

impl Front {
    /// Makes room in the name table before an entry is added: drops the lookup cache when it
    /// is full (names of records up to `applied_lsn`). Directories can then no longer be
    /// complete, since the names they had there are gone.
    pub fn make_room_for_name(&mut self, applied_lsn: u64) {
        if self.names.make_room(applied_lsn) {
            for view in self.views.values_mut() {
                view.complete = false;
            }
        }
    }

    /// Drops views with nothing pending, least recently used first, down to half the limit.
    pub fn trim_views(&mut self, applied_lsn: u64) {
        if self.views.len() <= VIEW_CACHE_LIMIT {
            return;
        }
        let mut candidates: Vec<(u64, u64)> = self
            .views
            .iter()
            .filter(|(_, view)| {
                view.last_change_lsn <= applied_lsn && view.open_count == 0 && view.pending_writes.is_empty()
            })
            .map(|(number, view)| (view.last_use.load(std::sync::atomic::Ordering::Relaxed), *number))
            .collect();
        candidates.sort_unstable();
        let excess = self.views.len() - VIEW_CACHE_LIMIT / 2;
        for (_, number) in candidates.into_iter().take(excess) {
            self.views.remove(&number);
            self.view_evictions += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with_limit(limit: usize) -> NameTable {
        NameTable { entries: Default::default(), trim_at: limit }
    }

    #[test]
    fn probes_with_borrowed_names_find_short_and_long_names() {
        let mut table = NameTable::default();
        let long = vec![b'x'; 200];
        table.set(7, b"short", Some((10, FileType::Regular)), 1);
        table.set(7, &long, Some((11, FileType::Directory)), 2);
        table.cache_applied(8, b"short", None);
        assert_eq!(table.get(7, b"short").unwrap().target, Some((10, FileType::Regular)));
        assert_eq!(table.get(7, &long).unwrap().target, Some((11, FileType::Directory)));
        assert_eq!(table.get(8, b"short").unwrap().target, None);
        assert!(table.get(7, b"shor").is_none());
        assert!(table.get(9, b"short").is_none());
        // A name exactly at the inline bound and one past it are distinct keys.
        let at_bound = vec![b'y'; INLINE_NAME_BYTES];
        let past_bound = vec![b'y'; INLINE_NAME_BYTES + 1];
        table.set(7, &at_bound, Some((12, FileType::Regular)), 3);
        assert!(table.get(7, &past_bound).is_none());
        table.set(7, &past_bound, Some((13, FileType::Regular)), 4);
        assert_eq!(table.get(7, &at_bound).unwrap().target, Some((12, FileType::Regular)));
        assert_eq!(table.get(7, &past_bound).unwrap().target, Some((13, FileType::Regular)));
    }

    #[test]
    fn a_change_replaces_the_cached_answer() {
        let mut table = NameTable::default();
        table.cache_applied(1, b"a", Some((5, FileType::Regular)));
        table.set(1, b"a", None, 9);
        assert_eq!(table.get(1, b"a"), Some(&NameEntry { target: None, lsn: 9 }));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn making_room_drops_only_applied_entries() {
        let mut table = table_with_limit(4);
        table.cache_applied(1, b"h", Some((2, FileType::Regular)));
        for (index, name) in [b"a", b"b", b"c"].iter().enumerate() {
            table.set(1, *name, Some((10 + index as u64, FileType::Regular)), 10 + index as u64);
        }
        // Records up to 10 applied: "h" (from the H-tree) and "a" may go, "b" and "c" stay.
        assert!(table.make_room(10));
        assert_eq!(table.len(), 2);
        assert!(table.get(1, b"a").is_none() && table.get(1, b"h").is_none());
        assert!(table.get(1, b"b").is_some() && table.get(1, b"c").is_some());
        // Below the bound nothing is dropped, applied or not.
        assert!(!table.make_room(100));
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn pending_entries_alone_move_the_bound() {
        let mut table = table_with_limit(2);
        table.set(1, b"a", None, 5);
        table.set(1, b"b", None, 6);
        assert!(!table.make_room(1));
        assert_eq!(table.len(), 2);
        assert!(table.trim_at >= 4, "the next scan waits until the table has doubled");
    }

    #[test]
    fn neighbouring_inode_numbers_hash_to_neighbouring_slots() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let build = BuildHasherDefault::<InodeNumberHasher>::default();
        let low_bits = |number: u64| build.hash_one(number) & 0xffff;
        assert_eq!(low_bits(1000) + 1, low_bits(1001));
        assert_ne!(build.hash_one(1000u64) >> 57, build.hash_one(1001u64) >> 57);
    }
}
