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
use crate::fs::types::{Attributes, FileType};
use crate::FastHashMap;
use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Views kept, over all shards, before the least recently used without pending changes are
/// dropped. A view takes about 300 bytes with its slot (`InodeView` is 256), so this bounds
/// them at about 120 MiB; it holds the working set of 16 threads with 20,000 files each, whose
/// stats would otherwise each load a view under the volume lock.
pub const VIEW_CACHE_LIMIT: usize = 400_000;

/// Hashes an inode number so that neighbouring numbers of a view shard land in neighbouring
/// slots of its table: the low bits (which choose the slot) are the number without its shard
/// bits, the top bits (which hashbrown keeps as a tag to tell slots apart) are mixed from it.
/// Numbers are handed out in order, so the views of files made together, and stat'ed together,
/// share pages instead of costing a cache miss each.
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
        // A shard holds one run of each window of `VIEW_RUN * SHARD_COUNT` numbers
        // (`Front::view_shard_index`), so the bits that pick the run within a window say
        // nothing within a shard: they are dropped here, or the numbers of a shard would all
        // land in one `SHARD_COUNT`-th of its table's slots.
        let within_shard = ((number >> (SHARD_BITS + VIEW_RUN_BITS)) << VIEW_RUN_BITS) | (number & (VIEW_RUN - 1));
        let tag = number.wrapping_mul(0x9e37_79b9_7f4a_7c15) & 0xfe00_0000_0000_0000;
        self.hash = (within_shard & !0xfe00_0000_0000_0000) | tag;
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
    /// neither does not exist and needs no H-tree walk, while this equals the epoch of the
    /// directory's name shard (`NameShard::epoch`). Set for directories made since mount (they
    /// start empty); a shard that drops entries moves its epoch on, which ends the completeness
    /// of all its directories at once without touching their views. 0: not complete.
    pub complete_epoch: u64,
    /// The front end's use clock when the view was last used; written under a shard's shared
    /// lock by readers (a relaxed store to the view's own line, so readers share nothing).
    pub last_use: AtomicU64,
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
            complete_epoch: 0,
            last_use: AtomicU64::new(0),
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

    /// The blocks the file owns, counting those of records not yet applied (written data,
    /// fallocated space): they are the file's already, as on ext4, for `du`, `stat` and
    /// sparse-file heuristics, and for the images a record that frees them may need.
    pub fn blocks_with_pending(&self) -> u64 {
        self.blocks_owned + self.pending_blocks.iter().map(|(_, blocks)| blocks).sum::<u64>()
    }

    pub fn to_attributes(&self) -> Attributes {
        let image = &self.attributes;
        Attributes {
            inode: image.inode_number,
            generation: image.generation,
            file_type: image.file_type(),
            permissions: image.mode & 0o7777,
            link_count: image.link_count,
            uid: image.uid,
            gid: image.gid,
            size_bytes: image.size_bytes,
            blocks_512: self.blocks_with_pending() * 8,
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

/// Entries kept, over all name shards, before the applied ones are dropped. Each entry is a
/// table slot of about 64 bytes (names longer than 22 bytes add a heap copy), so the tables
/// hold about 32 MiB of short names at this bound. Entries of records not yet applied are never
/// dropped (they are the truth until then); the log's size bounds them, and a shard then holds
/// at most twice them.
pub const LOOKUP_CACHE_LIMIT: usize = 500_000;

/// Shards of the view map and of the name table. Views are sharded by inode number, names by
/// their directory's number, so that one directory's names live in one shard. A create
/// write-locks two view shards (its directory's and its new file's), so with 16 threads each
/// creating in its own directory, a file's shard was another thread's directory's in one create
/// of four with 64 shards, and the off-CPU profile had the creating threads asleep on view
/// locks more than half of the time; 256 shards made 16-thread creates 1.3× faster on the host
/// (BENCHMARKS.md, *More shards*), and 1,024 no faster again.
pub const SHARD_COUNT: usize = 1 << SHARD_BITS;
const SHARD_BITS: u32 = 8;
/// Consecutive inode numbers whose views share a shard (see `Front::view_shard_index`).
const VIEW_RUN: u64 = 1 << VIEW_RUN_BITS;
const VIEW_RUN_BITS: u32 = 4;
/// A name shard's share of `LOOKUP_CACHE_LIMIT`: past it, the shard looks at the total.
const NAME_SHARD_SHARE: usize = LOOKUP_CACHE_LIMIT / SHARD_COUNT;
/// A view shard's share of `VIEW_CACHE_LIMIT`.
const VIEW_SHARD_LIMIT: usize = VIEW_CACHE_LIMIT / SHARD_COUNT;

/// The name overlay and the lookup cache in one table, so that resolving a name is a single
/// probe with a borrowed key: no allocation, no H-tree walk. A name change replaces the entry
/// (the H-tree answer it held is about to be replaced).
pub struct NameTable {
    entries: FastHashMap<NameKey, NameEntry>,
    /// Size at which applied entries are dropped.
    trim_at: usize,
    /// Moves on whenever a name change is recorded or entries are dropped (not when an H-tree
    /// answer is cached): a lookup that walked the H-tree under the read lock caches its
    /// answer later only if this has not moved, so no change it missed can be hidden.
    changes: u64,
}

impl Default for NameTable {
    fn default() -> NameTable {
        NameTable { entries: Default::default(), trim_at: NAME_SHARD_SHARE, changes: 0 }
    }
}

impl NameTable {
    pub fn get(&self, parent: u64, name: &[u8]) -> Option<&NameEntry> {
        self.entries.get(&(parent, name) as &dyn NameKeyParts)
    }

    /// Records a name change by record `lsn`; the caller has made room.
    pub fn set(&mut self, parent: u64, name: &[u8], target: Option<(u64, FileType)>, lsn: u64) {
        assert!(lsn > 0, "a name change needs the lsn of its record");
        self.changes += 1;
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
    /// the table, the bound moves to twice their number (and at least `floor`) so that the scan
    /// is not repeated for every new entry.
    fn make_room(&mut self, applied_lsn: u64, floor: usize) -> bool {
        if self.entries.len() < self.trim_at {
            return false;
        }
        let before = self.entries.len();
        self.changes += 1;
        self.entries.retain(|_, entry| entry.lsn > applied_lsn);
        self.trim_at = floor.max(self.entries.len() * 2);
        self.entries.len() < before
    }

    /// Drops the entry of a name that the record `lsn`, now applied, removed, unless a later
    /// record set it again: the H-tree says "absent" as well now, and such entries would fill
    /// the table with the names of deleted files. Returns whether it dropped the entry.
    pub fn forget_removed(&mut self, parent: u64, name: &[u8], lsn: u64) -> bool {
        let key = &(parent, name) as &dyn NameKeyParts;
        if self.entries.get(key).is_some_and(|entry| entry.target.is_none() && entry.lsn <= lsn) {
            self.changes += 1;
            self.entries.remove(key);
            return true;
        }
        false
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The change counter (see `changes`).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Keeps each shard's lock on cache lines of its own, so that threads working in different
/// shards never bounce one line between their cores.
#[repr(align(128))]
pub struct Padded<T>(pub T);

/// One shard of the view map: the views of the inode numbers that fall into it.
pub struct ViewShard {
    pub views: ViewMap,
    /// Views this shard dropped so far: a caller that let go of the shard can tell that a view
    /// it saw was dropped and loaded again (its change counter restarted).
    pub evictions: u64,
    /// Size past which `trim` looks for views to drop.
    trim_at: usize,
}

impl ViewShard {
    fn new() -> ViewShard {
        ViewShard { views: Default::default(), evictions: 0, trim_at: VIEW_SHARD_LIMIT }
    }

    /// When the shard is past its share of `VIEW_CACHE_LIMIT`, drops views with nothing
    /// pending, least recently used first, down to half the share; never those in `keep` (the
    /// caller holds them). If pending views alone fill the shard, the next scan waits until it
    /// has doubled, so that it is not repeated for every new view.
    pub fn trim(&mut self, applied_lsn: u64, keep: &[u64]) {
        if self.views.len() <= self.trim_at {
            return;
        }
        let mut candidates: Vec<(u64, u64)> = self
            .views
            .iter()
            .filter(|(number, view)| {
                view.last_change_lsn <= applied_lsn
                    && view.open_count == 0
                    && view.pending_writes.is_empty()
                    && !keep.contains(number)
            })
            .map(|(number, view)| (view.last_use.load(Ordering::Relaxed), *number))
            .collect();
        candidates.sort_unstable();
        let excess = self.views.len().saturating_sub(VIEW_SHARD_LIMIT / 2);
        for (_, number) in candidates.into_iter().take(excess) {
            self.views.remove(&number);
            self.evictions += 1;
        }
        self.trim_at = VIEW_SHARD_LIMIT.max(self.views.len() * 2);
    }
}

/// One shard of the name table: the names of the directories whose numbers fall into it.
#[derive(Default)]
pub struct NameShard {
    pub table: NameTable,
    /// The entries this shard last counted into `Front::names_total`.
    counted: usize,
}

/// The blocks the front end may promise, as atomics: a reservation is a compare-and-swap on
/// `available` and never takes more than is free; the back end's reports move `available` by
/// one `fetch_add` each, so the two never disagree even for a moment.
pub struct Space {
    /// Blocks free in the volume as of the last applied batch, less those promised to records
    /// not yet applied. Signed: the back end may take blocks that nobody reserved (extent-tree
    /// nodes beyond the reserve) and so report fewer free blocks than were promised.
    available: CachePadded<AtomicI64>,
    /// Blocks promised to records not yet applied (for `statfs`).
    reserved: CachePadded<AtomicU64>,
    /// Blocks free in the volume as of the last applied batch.
    free: CachePadded<AtomicU64>,
    /// Blocks freed but not reusable before the next checkpoint.
    pending_free: CachePadded<AtomicU64>,
    /// Blocks of `free` that only extent-tree reserves may promise (see
    /// `engine::tree_pool_blocks`).
    pub tree_pool_blocks: u64,
}

impl Space {
    pub fn new(free_blocks: u64, tree_pool_blocks: u64) -> Space {
        Space {
            available: CachePadded::new(AtomicI64::new(free_blocks as i64)),
            reserved: CachePadded::new(AtomicU64::new(0)),
            free: CachePadded::new(AtomicU64::new(free_blocks)),
            pending_free: CachePadded::new(AtomicU64::new(0)),
            tree_pool_blocks,
        }
    }

    /// Reserves `new_blocks` that a record certainly takes, which must leave the tree pool
    /// untouched, and `tree_blocks` that it may take for extent-tree nodes, which may come out
    /// of the pool. False when the volume cannot promise them now.
    pub fn reserve(&self, new_blocks: u64, tree_blocks: u64) -> bool {
        let total = (new_blocks + tree_blocks) as i64;
        let needed = if new_blocks > 0 { total.max((new_blocks + self.tree_pool_blocks) as i64) } else { total };
        let taken = self.available.fetch_update(Ordering::AcqRel, Ordering::Acquire, |available| {
            (available >= needed).then_some(available - total)
        });
        if taken.is_err() {
            return false;
        }
        self.reserved.fetch_add(new_blocks + tree_blocks, Ordering::Relaxed);
        true
    }

    /// Returns a reservation that was not used (the append was refused).
    pub fn unreserve(&self, blocks: u64) {
        self.reserved.fetch_sub(blocks, Ordering::Relaxed);
        self.available.fetch_add(blocks as i64, Ordering::AcqRel);
    }

    /// The back end applied records that had `returned_blocks` reserved, and the volume now
    /// has `free_blocks` free and `pending_free_blocks` waiting for a checkpoint.
    pub fn applied(&self, returned_blocks: u64, free_blocks: u64, pending_free_blocks: u64) {
        let previous_free = self.free.swap(free_blocks, Ordering::AcqRel);
        self.reserved.fetch_sub(returned_blocks, Ordering::Relaxed);
        let delta = returned_blocks as i64 + free_blocks as i64 - previous_free as i64;
        self.available.fetch_add(delta, Ordering::AcqRel);
        self.pending_free.store(pending_free_blocks, Ordering::Release);
    }

    /// Blocks `statfs` reports free: freed blocks wait for a checkpoint before reuse, but they
    /// are free (`df` after `rm` should say so at once); the tree pool is not free for new
    /// data, as ext4 leaves its reserved clusters out of f_bavail.
    pub fn statfs_free_blocks(&self) -> u64 {
        let free = self.free.load(Ordering::Acquire) + self.pending_free.load(Ordering::Acquire);
        free.saturating_sub(self.reserved.load(Ordering::Acquire) + self.tree_pool_blocks)
    }
}

/// Inode-table blocks whose free records one look at the volume checks (see `InodeGroup::take`):
/// creators took the volume lock every 16 creates, and with the apply workers holding it the
/// wait for it was a tenth of their context switches.
const VERIFY_BLOCKS_AT_ONCE: u64 = 16;
/// When fewer checked blocks than this lie ahead of the one a number comes from, each create
/// that enters a new block looks at the next unchecked ones if the volume lock is free at that
/// moment (`VerifyWait::IfFree`), so that a creator rarely reaches an unchecked block and has
/// to wait for the lock. Waiting there cost 16 creating threads 2.5 s of 16 thread-seconds on
/// the host: the apply workers pass the lock among themselves, and a waiting creator was served
/// after about 0.6 ms, when parking_lot's fairness timer handed it over.
const VERIFY_AHEAD_BLOCKS: u64 = VERIFY_BLOCKS_AT_ONCE / 2;
/// Table blocks per allocation group (at least; larger volumes get larger groups).
const GROUP_TABLE_BLOCKS: u64 = 64;
/// Most allocation groups: past this, groups grow instead.
const GROUPS_MAX: u64 = 1024;

/// The inode numbers of one allocation group: numbers `first_number..first_number + count`,
/// whole inode-table blocks.
struct InodeGroup {
    first_number: u64,
    count: u64,
    /// Bit n set: number `first_number + n` is in use (or refused, see `take`).
    in_use: Vec<u64>,
    free: u64,
    /// Where the next search starts (up to `count`): numbers are handed out in order, not
    /// reused at once.
    cursor: u64,
    /// Bit b set: the free numbers of the group's table block b have been checked to have
    /// free (all-zero) records on the volume.
    verified: Vec<u64>,
}

fn bit(words: &[u64], index: u64) -> bool {
    words[(index / 64) as usize] & (1 << (index % 64)) != 0
}

/// The first clear bit at or after `start` and before `end`, a word at a time (a nearly full
/// group is searched at every create once the allocator has come round).
fn first_clear(words: &[u64], start: u64, end: u64) -> Option<u64> {
    assert!(end <= words.len() as u64 * 64, "a search past the bitmap");
    let mut index = start;
    // Bounded: each turn moves `index` to the next word or returns.
    while index < end {
        let word = words[(index / 64) as usize] | ((1u64 << (index % 64)) - 1);
        if word != u64::MAX {
            let found = (index / 64) * 64 + u64::from((!word).trailing_zeros());
            return (found < end).then_some(found);
        }
        index = (index / 64 + 1) * 64;
    }
    None
}

fn set_bit(words: &mut [u64], index: u64, value: bool) {
    let mask = 1u64 << (index % 64);
    if value {
        words[(index / 64) as usize] |= mask;
    } else {
        words[(index / 64) as usize] &= !mask;
    }
}

/// Whether a check of free inode numbers waits for the volume lock.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum VerifyWait {
    /// The numbers are about to be handed out: wait.
    Always,
    /// A look ahead: only if nobody holds the lock now.
    IfFree,
}

/// Checks the on-volume records of free inode numbers before they are handed out; answers the
/// numbers whose record is in use, each with its error; `None` when it did not look (the lock
/// was held and `VerifyWait::IfFree` said not to wait); an error when it could not look.
pub type VerifyFree<'a> =
    dyn FnMut(&[u64], VerifyWait) -> crate::error::Result<Option<Vec<(u64, crate::error::Error)>>> + 'a;

impl InodeGroup {
    /// Hands out the next free number from the cursor on, or `None` when there is none up to
    /// the group's end (with `wrap`, up to the cursor again): numbers go out in order and a
    /// freed one is not reused until the allocator comes round again, as a single next-fit
    /// bitmap would do it.
    /// The first number taken from a table block has the block checked first, with up to
    /// `VERIFY_BLOCKS_AT_ONCE - 1` unchecked blocks after it: every free number of them must
    /// have an all-zero record on the volume (a record in use under a clear bit means the
    /// bitmap lost a write). Numbers that fail are never handed out, and the first failure is
    /// returned. A number that enters a new block with few checked blocks ahead looks at the
    /// next ones if the volume lock is free (`VERIFY_AHEAD_BLOCKS`); a failure found so is
    /// returned the same way, before the number is taken.
    /// The first unchecked table block within `VERIFY_AHEAD_BLOCKS` after `block`, if any.
    fn unverified_ahead(&self, block: u64) -> Option<u64> {
        let blocks_in_group = self.count.div_ceil(crate::block::superblock::INODES_PER_BLOCK);
        let end = (block + 1 + VERIFY_AHEAD_BLOCKS).min(blocks_in_group);
        (block + 1..end).find(|next| !bit(&self.verified, *next))
    }

    /// Checks table block `block` and the unchecked blocks after it, up to
    /// `VERIFY_BLOCKS_AT_ONCE`, in one look (one volume lock): numbers go out in order, so they
    /// are next. Marks them checked and the refused numbers in use; the first refusal is the
    /// error. `Ok(false)`: `wait` was `IfFree` and the lock was held, nothing was looked at.
    fn verify_from(&mut self, block: u64, verify: &mut VerifyFree<'_>, wait: VerifyWait) -> crate::error::Result<bool> {
        let per_block = crate::block::superblock::INODES_PER_BLOCK;
        let blocks_in_group = self.count.div_ceil(per_block);
        assert!(block < blocks_in_group && !bit(&self.verified, block), "a check of an unchecked block of the group");
        let mut last_block = block;
        while last_block + 1 < blocks_in_group
            && last_block + 1 < block + VERIFY_BLOCKS_AT_ONCE
            && !bit(&self.verified, last_block + 1)
        {
            last_block += 1;
        }
        let first = block * per_block;
        let end = ((last_block + 1) * per_block).min(self.count);
        let free_numbers: Vec<u64> =
            (first..end).filter(|index| !bit(&self.in_use, *index)).map(|index| self.first_number + index).collect();
        let Some(refused) = verify(&free_numbers, wait)? else {
            assert_eq!(wait, VerifyWait::IfFree, "only a look ahead may skip the check");
            return Ok(false);
        };
        for checked in block..=last_block {
            set_bit(&mut self.verified, checked, true);
        }
        let mut first_error = None;
        for (number, error) in refused {
            let index = number - self.first_number;
            assert!(index < self.count && !bit(&self.in_use, index), "only free numbers are checked");
            set_bit(&mut self.in_use, index, true);
            self.free -= 1;
            first_error.get_or_insert(error);
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(true),
        }
    }

    fn take(&mut self, verify: &mut VerifyFree<'_>, wrap: bool) -> crate::error::Result<Option<u64>> {
        if self.free == 0 {
            return Ok(None);
        }
        let ahead = first_clear(&self.in_use, self.cursor, self.count);
        let offset = if wrap { ahead.or_else(|| first_clear(&self.in_use, 0, self.cursor)) } else { ahead };
        let Some(offset) = offset else {
            return Ok(None);
        };
        let per_block = crate::block::superblock::INODES_PER_BLOCK;
        let block = offset / per_block;
        if !bit(&self.verified, block) {
            let looked = self.verify_from(block, verify, VerifyWait::Always)?;
            assert!(looked, "a waiting check always looks");
        } else if self.cursor == 0 || (self.cursor - 1) / per_block != block {
            // The first number of this block: a look ahead, at most once per block.
            if let Some(next) = self.unverified_ahead(block) {
                self.verify_from(next, verify, VerifyWait::IfFree)?;
            }
        }
        set_bit(&mut self.in_use, offset, true);
        self.free -= 1;
        self.cursor = offset + 1;
        Ok(Some(self.first_number + offset))
    }
}

thread_local! {
    /// The allocator (by address) and group this thread last took a number from: where it
    /// goes on when its parent's group is full, so that threads spread over groups.
    static GROUP_HINT: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, usize::MAX)) };
}

/// Inode numbers the front end may hand out, in allocation groups (as XFS and ext4 have them),
/// each behind its own mutex: creators in different groups never wait for each other. A
/// number is taken from the parent's group, else from the group this thread last used, else
/// from a group nobody has used yet, else from any group with room.
pub struct InodeGroups {
    groups: Box<[Padded<Mutex<InodeGroup>>]>,
    group_inodes: u64,
    /// The first group no number has been taken from since mount (nor was in use at mount).
    frontier: AtomicUsize,
    /// Where the next new directory looks for a roomy group once no fresh one is left: moves
    /// on with each, so that directories made side by side land in different groups.
    spread_turn: AtomicUsize,
}

impl InodeGroups {
    /// Groups over `inode_count` numbers; `in_use(number)` says which are taken at mount.
    pub fn new(inode_count: u64, in_use: impl Fn(u64) -> bool) -> InodeGroups {
        let per_block = crate::block::superblock::INODES_PER_BLOCK;
        let least = per_block * GROUP_TABLE_BLOCKS;
        let group_inodes = inode_count.div_ceil(GROUPS_MAX).div_ceil(least).max(1) * least;
        let group_count = inode_count.div_ceil(group_inodes);
        let mut frontier = 0;
        let groups: Vec<Padded<Mutex<InodeGroup>>> = (0..group_count)
            .map(|index| {
                let first_number = index * group_inodes + 1;
                let count = group_inodes.min(inode_count - index * group_inodes);
                let mut group = InodeGroup {
                    first_number,
                    count,
                    in_use: vec![0; count.div_ceil(64) as usize],
                    free: count,
                    cursor: 0,
                    verified: vec![0; count.div_ceil(per_block).div_ceil(64) as usize],
                };
                for offset in 0..count {
                    if in_use(first_number + offset) {
                        set_bit(&mut group.in_use, offset, true);
                        group.free -= 1;
                        frontier = index as usize + 1;
                    }
                }
                Padded(Mutex::new(group))
            })
            .collect();
        InodeGroups {
            groups: groups.into_boxed_slice(),
            group_inodes,
            frontier: AtomicUsize::new(frontier),
            spread_turn: AtomicUsize::new(0),
        }
    }

    fn group_of(&self, number: u64) -> usize {
        assert!(number > 0, "inode numbers start at 1");
        ((number - 1) / self.group_inodes) as usize
    }

    /// Takes a free number, starting in the group of `near` (the parent directory). A new
    /// directory (`spread`) starts in a group nobody has used since mount while there is one,
    /// as ext4's Orlov allocator spreads directories: its files then fill its own group, so
    /// directories worked on side by side do not share inode-table blocks, view shards or the
    /// group's lock.
    pub fn allocate(&self, near: u64, spread: bool, verify: &mut VerifyFree<'_>) -> crate::error::Result<u64> {
        let group_count = self.groups.len();
        let identity = self as *const InodeGroups as usize;
        let start = self.group_of(near).min(group_count - 1);
        let try_group = |index: usize, verify: &mut VerifyFree<'_>, wrap: bool| -> crate::error::Result<Option<u64>> {
            let taken = self.groups[index].0.lock().take(verify, wrap)?;
            if taken.is_some() {
                GROUP_HINT.with(|hint| hint.set((identity, index)));
            }
            Ok(taken)
        };
        if spread {
            if let Some(number) = self.take_fresh(&try_group, verify)? {
                return Ok(number);
            }
            if let Some(number) = self.take_roomy(&try_group, verify)? {
                return Ok(number);
            }
        }
        if let Some(number) = try_group(start, verify, false)? {
            return Ok(number);
        }
        let (owner, hinted) = GROUP_HINT.with(|hint| hint.get());
        if owner == identity && hinted < group_count && hinted != start {
            if let Some(number) = try_group(hinted, verify, false)? {
                return Ok(number);
            }
        }
        if let Some(number) = self.take_fresh(&try_group, verify)? {
            return Ok(number);
        }
        // Every group is used: come round again, from the parent's group on.
        for step in 0..group_count {
            if let Some(number) = try_group((start + step) % group_count, verify, true)? {
                return Ok(number);
            }
        }
        Err(crate::error::Error::NoSpace)
    }

    /// A number from a group nobody has taken from since mount, if one is left.
    fn take_fresh(&self, try_group: &TryGroup<'_>, verify: &mut VerifyFree<'_>) -> crate::error::Result<Option<u64>> {
        let group_count = self.groups.len();
        for _ in 0..group_count {
            let fresh = self.frontier.fetch_add(1, Ordering::AcqRel);
            if fresh >= group_count {
                self.frontier.store(group_count, Ordering::Release);
                return Ok(None);
            }
            if let Some(number) = try_group(fresh, verify, false)? {
                return Ok(Some(number));
            }
        }
        Ok(None)
    }

    /// For a new directory once every group has been used: a number from a group at least
    /// half free, looking from a point that moves on with each directory (Orlov's spread, with
    /// the turn standing in for his average). Without it every directory made then took its
    /// number from its parent's group, so threads creating in their own new directories all
    /// filled one group: one group lock, neighbouring numbers, the same view shards (16 threads
    /// fell from 600k to 90k creates/s on the host). `None` when no group is half free.
    fn take_roomy(&self, try_group: &TryGroup<'_>, verify: &mut VerifyFree<'_>) -> crate::error::Result<Option<u64>> {
        let group_count = self.groups.len();
        // Each directory starts about the golden ratio of the groups further on than the one
        // before, so directories made in a row start far apart; the scan then goes round.
        let stride = (((group_count as u64 * 0x9E37_79B9) >> 32) as usize) | 1;
        let start = self.spread_turn.fetch_add(1, Ordering::Relaxed).wrapping_mul(stride) % group_count;
        for step in 0..group_count {
            let index = (start + step) % group_count;
            if self.groups[index].0.lock().free * 2 < self.group_inodes {
                continue;
            }
            if let Some(number) = try_group(index, verify, true)? {
                return Ok(Some(number));
            }
        }
        Ok(None)
    }

    /// Returns a number for reuse.
    pub fn free_now(&self, number: u64) {
        let mut group = self.groups[self.group_of(number)].0.lock();
        let offset = number - group.first_number;
        assert!(offset < group.count && bit(&group.in_use, offset), "inode {number} freed while free");
        set_bit(&mut group.in_use, offset, false);
        group.free += 1;
    }

    /// Numbers free now (for `statfs`: takes each group's lock in turn).
    pub fn free_count(&self) -> u64 {
        self.groups.iter().map(|group| group.0.lock().free).sum()
    }
}

/// Takes a number from group `index` (wrapping round it when the flag says so).
type TryGroup<'a> = dyn Fn(usize, &mut VerifyFree<'_>, bool) -> crate::error::Result<Option<u64>> + 'a;

/// A name shard's lock. Every lookup and stat of a name read-locks its directory's shard, so
/// when many threads work in one directory they all meet on that lock: with one lock word that
/// every reader increments, 16 threads stat'ing one shared directory ran slower than ext4
/// (BENCHMARKS.md, *Readers of one directory*). A sharded lock gives each reader thread one of
/// several words, each on its own cache line; a writer takes them all, which costs a create or
/// an unlink a few uncontended lock takes. Never poisoned: as parking_lot's locks, a panic
/// while holding it leaves the data to the next holder (the engine latches failures itself).
pub struct NameShardLock(ShardedLock<NameShard>);

pub type NameReadGuard<'a> = ShardedLockReadGuard<'a, NameShard>;
pub type NameWriteGuard<'a> = ShardedLockWriteGuard<'a, NameShard>;

impl NameShardLock {
    fn new() -> NameShardLock {
        NameShardLock(ShardedLock::new(NameShard::default()))
    }

    pub fn read(&self) -> NameReadGuard<'_> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn write(&self) -> NameWriteGuard<'_> {
        self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The write lock if nobody holds the shard now.
    pub fn try_write(&self) -> Option<NameWriteGuard<'_>> {
        match self.0.try_write() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// Write locks on a set of name shards, taken in index order (see `Front::lock_names`).
pub struct NameLocks<'a> {
    guards: Vec<(usize, NameWriteGuard<'a>)>,
}

impl NameLocks<'_> {
    /// The locked shard holding the names of `directory`.
    pub fn shard(&mut self, directory: u64) -> &mut NameShard {
        let index = Front::name_shard_index(directory);
        let (_, guard) = self.guards.iter_mut().find(|(held, _)| *held == index).expect("name shard locked");
        guard
    }
}

/// Write locks on a set of view shards, taken in index order (see `Front::lock_views`).
pub struct ViewLocks<'a> {
    guards: Vec<(usize, RwLockWriteGuard<'a, ViewShard>)>,
}

impl<'a> ViewLocks<'a> {
    /// The locked shard holding the view of `number`.
    pub fn shard(&mut self, number: u64) -> &mut ViewShard {
        let index = Front::view_shard_index(number);
        let (_, guard) = self.guards.iter_mut().find(|(held, _)| *held == index).expect("view shard locked");
        guard
    }

    /// The loaded view of `number` (loaded by the caller under these locks).
    pub fn get(&mut self, number: u64) -> &mut InodeView {
        self.shard(number).views.get_mut(&number).expect("view loaded under the lock")
    }
}

/// The front end's state, in shards. Lock order: the rename lock, then name shards by index,
/// then view shards by index, then allocation groups (then the back end's queue and log, in
/// `Backend::enqueue`). Nothing here is held while waiting for the back end.
pub struct Front {
    view_shards: Box<[Padded<RwLock<ViewShard>>]>,
    name_shards: Box<[NameShardLock]>,
    /// Each name shard's epoch (see `InodeView::complete_epoch`), changed under its write lock
    /// and read without it by a create that marks a new directory complete.
    name_epochs: Box<[AtomicU64]>,
    /// Entries in all name shards, as last counted by each (see `make_room_for_name`).
    names_total: CachePadded<AtomicI64>,
    /// Cross-directory renames, one at a time (as Linux's `s_vfs_rename_mutex`): while one
    /// checks that a directory is not moved into itself, no other moves a directory.
    pub rename_lock: Mutex<()>,
    pub inode_numbers: InodeGroups,
    pub next_generation: CachePadded<AtomicU64>,
    pub space: Space,
    /// The recency clock: moves on when a view is loaded; uses store its value in the view.
    use_clock: CachePadded<AtomicU64>,
}

/// Bytes a hash table with room for `capacity` entries of type `T` has allocated: hashbrown
/// keeps at most 7 of every 8 buckets full, with one control byte per bucket.
fn table_bytes<T>(capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two();
    (buckets * (std::mem::size_of::<T>() + 1)) as u64
}

impl Front {
    /// Counts the cached views and names and the bytes of their tables, one shard at a time.
    pub fn cache_statistics(&self) -> crate::fs::types::CacheStatistics {
        let mut statistics = crate::fs::types::CacheStatistics::default();
        for shard in self.view_shards.iter() {
            let shard = shard.0.read();
            statistics.views += shard.views.len() as u64;
            statistics.view_table_bytes += table_bytes::<(u64, InodeView)>(shard.views.capacity());
        }
        for shard in self.name_shards.iter() {
            let shard = shard.read();
            let entries = &shard.table.entries;
            statistics.names += entries.len() as u64;
            statistics.name_table_bytes += table_bytes::<(NameKey, NameEntry)>(entries.capacity());
            statistics.name_heap_bytes += entries
                .keys()
                .map(|key| match &key.name {
                    NameBytes::Inline { .. } => 0,
                    NameBytes::Heap(bytes) => bytes.len() as u64,
                })
                .sum::<u64>();
        }
        statistics
    }

    pub fn new(inode_numbers: InodeGroups, next_generation: u64, space: Space) -> Front {
        Front {
            view_shards: (0..SHARD_COUNT).map(|_| Padded(RwLock::new(ViewShard::new()))).collect(),
            name_shards: (0..SHARD_COUNT).map(|_| NameShardLock::new()).collect(),
            name_epochs: (0..SHARD_COUNT).map(|_| AtomicU64::new(1)).collect(),
            names_total: CachePadded::new(AtomicI64::new(0)),
            rename_lock: Mutex::new(()),
            inode_numbers,
            next_generation: CachePadded::new(AtomicU64::new(next_generation)),
            space,
            use_clock: CachePadded::new(AtomicU64::new(1)),
        }
    }

    /// Runs of `VIEW_RUN` consecutive numbers share a shard: files made together are
    /// numbered together and stat'ed together, and a run keeps their views side by side in one
    /// table (one shard per number costs a third of the one-thread stat rate in cache misses).
    /// The shard of a view. Runs of `VIEW_RUN` numbers share one; within each window of
    /// `VIEW_RUN * SHARD_COUNT` numbers the runs go round the shards in order, from a shard
    /// that a hash of the window picks. Without that turn every allocation group (they start
    /// at multiples of 1,024) handed its k-th run to the same shard, so threads creating in
    /// their own directories at the same pace met in one shard at every create. Each window
    /// still gives a shard exactly one run, which `InodeNumberHasher` relies on.
    pub fn view_shard_index(number: u64) -> usize {
        let run_in_window = (number >> VIEW_RUN_BITS) % SHARD_COUNT as u64;
        let window = number >> (VIEW_RUN_BITS + SHARD_BITS);
        let turn = window.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARD_BITS);
        ((run_in_window + turn) % SHARD_COUNT as u64) as usize
    }

    /// The shard of a directory's names: a hash of its number, since new directories start
    /// allocation groups (`InodeGroups::allocate`), whose first numbers are all one more than
    /// a multiple of 1,024 and so would all share one shard by a plain remainder.
    pub fn name_shard_index(directory: u64) -> usize {
        // MurmurHash3's 64-bit finalizer: a multiply alone spreads numbers that differ only
        // in high bits (group starts) over a third of the shards.
        let mut mixed = directory;
        mixed ^= mixed >> 33;
        mixed = mixed.wrapping_mul(0xff51_afd7_ed55_8ccd);
        mixed ^= mixed >> 33;
        mixed = mixed.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        mixed ^= mixed >> 33;
        (mixed >> (64 - SHARD_BITS)) as usize
    }

    pub fn read_views(&self, number: u64) -> RwLockReadGuard<'_, ViewShard> {
        self.view_shards[Front::view_shard_index(number)].0.read()
    }

    pub fn write_views(&self, number: u64) -> RwLockWriteGuard<'_, ViewShard> {
        self.view_shards[Front::view_shard_index(number)].0.write()
    }

    pub fn write_names(&self, directory: u64) -> NameWriteGuard<'_> {
        self.name_shards[Front::name_shard_index(directory)].write()
    }

    pub fn read_names(&self, directory: u64) -> NameReadGuard<'_> {
        self.name_shards[Front::name_shard_index(directory)].read()
    }

    /// The write lock on the name shard of `directory` if nobody holds it now.
    pub fn try_write_names(&self, directory: u64) -> Option<NameWriteGuard<'_>> {
        self.name_shards[Front::name_shard_index(directory)].try_write()
    }

    /// Write locks on the name shards of `directories`, in index order.
    pub fn lock_names(&self, directories: &[u64]) -> NameLocks<'_> {
        let mut indexes: Vec<usize> = directories.iter().map(|number| Front::name_shard_index(*number)).collect();
        indexes.sort_unstable();
        indexes.dedup();
        NameLocks { guards: indexes.into_iter().map(|index| (index, self.name_shards[index].write())).collect() }
    }

    /// Write locks on the view shards of `numbers`, in index order.
    pub fn lock_views(&self, numbers: &[u64]) -> ViewLocks<'_> {
        let mut indexes: Vec<usize> = numbers.iter().map(|number| Front::view_shard_index(*number)).collect();
        indexes.sort_unstable();
        indexes.dedup();
        ViewLocks { guards: indexes.into_iter().map(|index| (index, self.view_shards[index].0.write())).collect() }
    }

    /// Takes and lets go of every view shard in turn: a change that held one when the caller
    /// began has appended its record when this returns.
    pub fn wait_for_changes_in_flight(&self) {
        for shard in self.view_shards.iter() {
            drop(shard.0.write());
        }
    }

    /// The recency clock's value, for stamping a view used.
    pub fn clock(&self) -> u64 {
        self.use_clock.load(Ordering::Relaxed)
    }

    /// Moves the recency clock on (a view is loaded) and returns the new value.
    pub fn tick(&self) -> u64 {
        self.use_clock.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The epoch of the name shard of `directory` (see `InodeView::complete_epoch`).
    pub fn name_epoch(&self, directory: u64) -> u64 {
        self.name_epochs[Front::name_shard_index(directory)].load(Ordering::Acquire)
    }

    /// Makes room in the name shard of `directory` before an entry is added. A shard past its
    /// share of `LOOKUP_CACHE_LIMIT` brings the total up to date; when all shards together are
    /// at the bound, it drops its applied entries (records up to `applied_lsn`). Its
    /// directories can then no longer be complete, since the names they had there are gone:
    /// its epoch moves on. So no shard trims while the table as a whole has room (one large
    /// directory may hold most of it), and the shards together hold at most about twice the
    /// bound (each counts itself only when past its share).
    pub fn make_room_for_name(&self, directory: u64, shard: &mut NameShard, applied_lsn: u64) {
        if shard.table.len() < shard.table.trim_at {
            return;
        }
        let total = self.count_names(shard);
        if total < LOOKUP_CACHE_LIMIT as i64 {
            shard.table.trim_at = shard.table.len() + NAME_SHARD_SHARE / 8;
            return;
        }
        if shard.table.make_room(applied_lsn, NAME_SHARD_SHARE) {
            self.name_epochs[Front::name_shard_index(directory)].fetch_add(1, Ordering::AcqRel);
        }
        self.count_names(shard);
    }

    /// Drops every cached answer and view the front end can drop now, as the bounds do when
    /// they are reached: name entries of applied records (each shard's epoch moves on, ending
    /// its directories' completeness) and views with nothing pending, nobody holding them open.
    /// So the next lookups and stats read home: for tests of the readers of home, and for
    /// measuring them on a tree the caches would hold.
    pub fn drop_idle_caches(&self, applied_lsn: u64) {
        for (index, shard) in self.name_shards.iter().enumerate() {
            let mut shard = shard.write();
            let before = shard.table.len();
            shard.table.entries.retain(|_, entry| entry.lsn > applied_lsn);
            if shard.table.len() < before {
                shard.table.changes += 1;
                self.name_epochs[index].fetch_add(1, Ordering::AcqRel);
            }
            self.count_names(&mut shard);
        }
        for shard in self.view_shards.iter() {
            let mut shard = shard.0.write();
            let before = shard.views.len();
            shard.views.retain(|_, view| {
                view.last_change_lsn > applied_lsn || view.open_count != 0 || !view.pending_writes.is_empty()
            });
            shard.evictions += (before - shard.views.len()) as u64;
        }
    }

    /// Brings `names_total` up to date with `shard`; returns the new total. Called where a
    /// shard grows past its share and wherever entries are dropped, so the total may lag
    /// behind growth below the share but never counts entries that are gone.
    pub fn count_names(&self, shard: &mut NameShard) -> i64 {
        let delta = shard.table.len() as i64 - shard.counted as i64;
        shard.counted = shard.table.len();
        self.names_total.fetch_add(delta, Ordering::AcqRel) + delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with_limit(limit: usize) -> NameTable {
        NameTable { entries: Default::default(), trim_at: limit, changes: 0 }
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
    fn an_applied_removal_drops_the_name_unless_set_again() {
        let mut table = NameTable::default();
        table.set(1, b"gone", None, 5);
        table.set(1, b"back", None, 6);
        table.set(1, b"back", Some((9, FileType::Regular)), 8);
        assert!(table.forget_removed(1, b"gone", 5));
        assert!(!table.forget_removed(1, b"back", 6), "set again by a later record");
        assert!(table.get(1, b"gone").is_none());
        assert_eq!(table.get(1, b"back").unwrap().target, Some((9, FileType::Regular)));
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
        assert!(table.make_room(10, 4));
        assert_eq!(table.len(), 2);
        assert!(table.get(1, b"a").is_none() && table.get(1, b"h").is_none());
        assert!(table.get(1, b"b").is_some() && table.get(1, b"c").is_some());
        // Below the bound nothing is dropped, applied or not.
        assert!(!table.make_room(100, 4));
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn the_first_clear_bit_is_found_within_its_range_only() {
        let mut words = vec![u64::MAX; 3];
        assert_eq!(first_clear(&words, 0, 192), None);
        set_bit(&mut words, 130, false);
        assert_eq!(first_clear(&words, 0, 192), Some(130));
        assert_eq!(first_clear(&words, 130, 192), Some(130));
        assert_eq!(first_clear(&words, 131, 192), None);
        assert_eq!(first_clear(&words, 0, 130), None);
        set_bit(&mut words, 5, false);
        assert_eq!(first_clear(&words, 3, 192), Some(5));
        assert_eq!(first_clear(&words, 6, 131), Some(130));
        // Clear bits past `end` in its word do not count.
        let words = vec![u64::MAX >> 4];
        assert_eq!(first_clear(&words, 0, 60), None);
        assert_eq!(first_clear(&words, 0, 61), Some(60));
        assert_eq!(first_clear(&words, 61, 61), None);
    }

    /// Numbers handed out from one fresh group with `verify`, until `count` are out or a take
    /// fails; the waiting checks made, and the numbers.
    fn take_numbers(
        count: usize,
        lock_free: &dyn Fn(usize) -> bool,
        refuse: u64,
    ) -> (Vec<Vec<u64>>, Vec<crate::error::Result<u64>>) {
        let group_inodes = crate::block::superblock::INODES_PER_BLOCK * GROUP_TABLE_BLOCKS;
        let groups = InodeGroups::new(group_inodes, |_| false);
        let mut waited = Vec::new();
        let mut looks = 0;
        let mut verify = |numbers: &[u64], wait: VerifyWait| {
            looks += 1;
            if wait == VerifyWait::IfFree && !lock_free(looks) {
                return Ok(None);
            }
            if wait == VerifyWait::Always {
                waited.push(numbers.to_vec());
            }
            let refused = numbers.iter().filter(|number| **number == refuse);
            Ok(Some(refused.map(|number| (*number, crate::error::Error::corruption("in use"))).collect()))
        };
        let taken = (0..count).map(|_| groups.allocate(1, false, &mut verify)).collect();
        (waited, taken)
    }

    #[test]
    fn creators_check_table_blocks_ahead_while_the_volume_lock_is_free() {
        let per_block = crate::block::superblock::INODES_PER_BLOCK as usize;
        let count = per_block * GROUP_TABLE_BLOCKS as usize;
        // The lock always free: one waiting check, at the first number; the looks ahead cover
        // the rest of the group before any creator reaches an unchecked block.
        let (waited, taken) = take_numbers(count, &|_| true, 0);
        assert_eq!(waited.len(), 1, "{waited:?}");
        let numbers: Vec<u64> = taken.into_iter().map(|number| number.expect("room")).collect();
        assert_eq!(numbers, (1..=count as u64).collect::<Vec<_>>(), "numbers go out in order");
        // The lock always held: every creator that reaches an unchecked block waits, as before.
        let (waited, _) = take_numbers(count, &|_| false, 0);
        assert_eq!(waited.len() as u64, GROUP_TABLE_BLOCKS / VERIFY_BLOCKS_AT_ONCE, "{waited:?}");
        // Held at every other look: still fewer waits than without looks ahead.
        let (waited, _) = take_numbers(count, &|look| look % 2 == 0, 0);
        assert!(waited.len() == 1, "{waited:?}");
    }

    #[test]
    fn a_number_refused_by_a_look_ahead_is_never_handed_out() {
        let per_block = crate::block::superblock::INODES_PER_BLOCK;
        let refuse = 20 * per_block + 3;
        let count = (per_block * GROUP_TABLE_BLOCKS) as usize;
        let (waited, taken) = take_numbers(count, &|_| true, refuse);
        assert_eq!(waited.len(), 1);
        let errors = taken.iter().filter(|outcome| outcome.as_ref().is_err_and(|error| error.is_corruption())).count();
        assert_eq!(errors, 1, "one create reports the refused record");
        let numbers: Vec<u64> = taken.into_iter().filter_map(|outcome| outcome.ok()).collect();
        assert!(!numbers.contains(&refuse));
        assert_eq!(numbers.len(), count - 1, "every other number is handed out");
    }

    #[test]
    fn directories_made_once_every_group_is_used_spread_over_roomy_groups() {
        // Eight groups of 960, every one used since mount: the first four full, the others
        // holding one number each.
        let group_inodes = crate::block::superblock::INODES_PER_BLOCK * GROUP_TABLE_BLOCKS;
        let groups =
            InodeGroups::new(8 * group_inodes, |number| number <= 4 * group_inodes || (number - 1) % group_inodes == 0);
        assert_eq!(groups.groups.len(), 8);
        let mut verify = |_: &[u64], _: VerifyWait| Ok(Some(Vec::new()));
        let made: Vec<usize> =
            (0..4).map(|_| groups.group_of(groups.allocate(1, true, &mut verify).expect("room left"))).collect();
        assert!(made.iter().all(|group| *group >= 4), "directories went to full groups: {made:?}");
        let mut distinct = made.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 1, "directories made in a row share one group: {made:?}");
        // Files still go to their directory's group.
        let directory = groups.allocate(1, true, &mut verify).expect("room left");
        let file = groups.allocate(directory, false, &mut verify).expect("room left");
        assert_eq!(groups.group_of(file), groups.group_of(directory));
    }

    #[test]
    fn pending_entries_alone_move_the_bound() {
        let mut table = table_with_limit(2);
        table.set(1, b"a", None, 5);
        table.set(1, b"b", None, 6);
        assert!(!table.make_room(1, 2));
        assert_eq!(table.len(), 2);
        assert!(table.trim_at >= 4, "the next scan waits until the table has doubled");
    }

    #[test]
    fn neighbouring_inode_numbers_of_a_shard_hash_to_neighbouring_slots() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let build = BuildHasherDefault::<InodeNumberHasher>::default();
        let low_bits = |number: u64| build.hash_one(number) & 0xffff;
        // Neighbours in a run share a shard and take neighbouring slots.
        assert_eq!(Front::view_shard_index(1024), Front::view_shard_index(1025));
        assert_eq!(low_bits(1024) + 1, low_bits(1025));
        assert_ne!(build.hash_one(1024u64) >> 57, build.hash_one(1025u64) >> 57);
        // The shard's run in the next window follows the last one.
        let window = VIEW_RUN * SHARD_COUNT as u64;
        let next_run = (window..2 * window)
            .find(|number| Front::view_shard_index(*number) == Front::view_shard_index(1024))
            .unwrap();
        assert_eq!(next_run % VIEW_RUN, 0);
        assert_eq!(low_bits(1024 + VIEW_RUN - 1) + 1, low_bits(next_run));
        // Each window gives every shard exactly one run.
        for first in [0, window, 7 * window] {
            let mut runs_per_shard = vec![0; SHARD_COUNT];
            for number in (first..first + window).step_by(VIEW_RUN as usize) {
                runs_per_shard[Front::view_shard_index(number)] += 1;
            }
            assert!(runs_per_shard.iter().all(|runs| *runs == 1), "window at {first}");
        }
        // Directories that start groups (numbers one past a multiple of 1,024) spread over
        // the name shards too.
        let name_shards: std::collections::BTreeSet<usize> =
            (0..64u64).map(|group| Front::name_shard_index(group * 1024 + 1)).collect();
        assert!(name_shards.len() > 32, "{} name shards for 64 groups' directories", name_shards.len());
        // Allocation groups start at multiples of 1,024 (plus one): their first runs fall in
        // different shards, not all in one.
        let first_shards: std::collections::BTreeSet<usize> =
            (0..64u64).map(|group| Front::view_shard_index(group * 1024 + 1)).collect();
        assert!(first_shards.len() > 32, "{} shards for 64 groups' first runs", first_shards.len());
        // The numbers of one shard spread over all slots, not a `SHARD_COUNT`-th of them.
        let slots: std::collections::BTreeSet<u64> = (0..64 * window)
            .filter(|number| Front::view_shard_index(*number) == 0)
            .map(|number| low_bits(number) % 16)
            .collect();
        assert_eq!(slots.len(), 16);
    }
}
