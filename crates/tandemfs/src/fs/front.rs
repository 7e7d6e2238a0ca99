//! The front end's state: what callers see before the back end has applied it.
//!
//! - `views`: the current attributes of every inode with changes not yet applied, and of
//!   recently used ones (the NICFS inode cache);
//! - `names`: directory entries added or removed but not yet applied (the name overlay);
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
    pub last_use: u64,
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
            open_count: 0,
            orphaned: false,
            reclaimed: false,
            xattrs: None,
            change_counter: 0,
            complete: false,
            last_use: 0,
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

    pub fn to_attributes(&self) -> Attributes {
        let image = &self.attributes;
        // Pending data is not placed yet; count it so that `du` and sparse-file heuristics see
        // written bytes at once.
        let pending_blocks: u64 =
            self.pending_writes.iter().map(|write| (write.data.len() as u64).div_ceil(4096)).sum();
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

/// A name in a directory: (directory inode, name bytes).
pub type NameKey = (u64, Vec<u8>);

pub struct NameOverlay {
    pub target: Option<(u64, FileType)>,
    pub lsn: u64,
}

/// Entries kept in the lookup cache before it is emptied and starts over.
pub const LOOKUP_CACHE_LIMIT: usize = 500_000;

pub struct Front {
    pub views: FastHashMap<u64, InodeView>,
    pub names: FastHashMap<NameKey, NameOverlay>,
    /// Applied names found in H-trees (GPU4FS's lookup cache). Only the overlay is newer: a
    /// name change removes its key here when it enters the overlay.
    pub lookups: FastHashMap<NameKey, Option<(u64, FileType)>>,
    /// Inode numbers the front end may hand out (bit n - 1 is inode n).
    pub inode_numbers: Bitmap,
    pub next_generation: u64,
    /// Blocks promised to records not yet applied.
    pub reserved_blocks: u64,
    /// Blocks free in the volume as of the last applied batch.
    pub free_blocks: u64,
    /// Blocks freed but not reusable before the next checkpoint.
    pub pending_free_blocks: u64,
    /// Sum of the image-block bounds of the records not yet applied; `append` keeps it within
    /// `image_budget_blocks`, so a checkpoint covering the whole backlog fits in the log.
    pub queued_image_blocks: u64,
    pub image_budget_blocks: u64,
    pub use_clock: u64,
}

impl Front {
    /// Empties the lookup cache when full; directories can then no longer be complete.
    pub fn make_room_in_lookups(&mut self) {
        if self.lookups.len() >= LOOKUP_CACHE_LIMIT {
            self.lookups.clear();
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
            .map(|(number, view)| (view.last_use, *number))
            .collect();
        candidates.sort_unstable();
        let excess = self.views.len() - VIEW_CACHE_LIMIT / 2;
        for (_, number) in candidates.into_iter().take(excess) {
            self.views.remove(&number);
        }
    }
}
