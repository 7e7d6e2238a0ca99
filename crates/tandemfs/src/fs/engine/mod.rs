//! The `FileSystem` handle: the shared state and the front-end helpers every operation uses.
//! The operations live in the files beside this one, one per section: `lifecycle` (format,
//! mount, unmount, durability), `namespace`, `data`, `xattrs` and `batch` (the batch API). The
//! back end (its thread, queue, checkpoint policy and failure latch) is
//! `backend::driver::Backend`; this handle only drives it and keeps the front end's state
//! current through `FrontSink`.

pub mod batch;
pub mod compactor;
mod create_batch;
mod data;
mod direct;
pub mod dirindex_feed;
mod home;
mod lifecycle;
mod namespace;
mod xattrs;

use super::front::NameEntry;
use super::front::{Front, InodeGroups, InodeView, NameShard, PendingWrite, Space, VerifyWait, ViewLocks, ViewShard};
use super::types::*;
use crate::backend::driver::{Backend, BatchSummary, FrontSink};
use crate::backend::record::{AttributeImage, Disposition, Op, RangeKind, RenameKind, XATTR_VALUE_MAX_BYTES};
use crate::backend::{self, now_ns};
use crate::block::inode::Inode;
use crate::block::meta::BLOCK_SIZE_U64;
use crate::block::mmp::MmpKeeper;
use crate::block::superblock::{
    Superblock, BITS_PER_BITMAP_BLOCK, CHECKSUMS_PER_TABLE_BLOCK, GENERATIONS_PER_TABLE_BLOCK, STATE_CLEAN,
    STATE_MOUNTED,
};
use crate::block::volume::{Volume, XATTR_BLOCK_PAYLOAD_BYTES, XATTR_NAMESPACES};
use crate::device::{Device, Gate};
use crate::dir::{self, DirRoot};
use crate::error::{Error, Result};
use crate::extent::{self, ExtentRoot, MAX_FILE_BYTES};
use crate::log::{Appended, Log, LogOptions};
use parking_lot::{Mutex, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Attempts of an operation that must wait for log space, its share of the backlog or free
/// blocks: the first after a checkpoint of what is applied, the others after full drains. A
/// drain lets one thread through; other threads may take the room again before this one
/// retries, hence more than a few attempts. A volume that is really full answers NoSpace after
/// this many drains (each cheap then).
const SPACE_ATTEMPTS_MAX: usize = 64;
/// Waits of one operation for room in the log's pledge of images. Not a shortage: each wait
/// ends when the back end applies a group of records, and many threads may take that room
/// before this one retries (16 threads creating at once lost 64 turns in a row and answered a
/// false NoSpace), so these do not count as attempts; the bound only keeps the loop finite.
const BACKLOG_WAITS_MAX: usize = 1 << 20;
/// Attempts of an optimistic read before it holds the front end still.
const READ_ATTEMPTS_MAX: usize = 8;
/// Waits of one read for a structural change of its file (a truncate, a hole punched) to be
/// applied before it can read the home data; each is a change another thread made meanwhile,
/// so only a file truncated without pause could reach the bound, which answers `Busy`.
const READ_STRUCTURAL_WAITS_MAX: usize = 1 << 12;
/// Symbolic links followed while resolving one path.
const SYMLINK_FOLLOW_MAX: usize = 40;
/// Directory levels walked looking for a rename loop.
const DEPTH_WALK_MAX: usize = 1 << 16;
/// Blocks besides its new ones that applying one record typically dirties: its inode's table
/// block, its parent's leaf or index block, a bitmap block. A record's new metadata blocks are
/// counted up to a namespace operation's reservation; file data goes home from the log's data
/// ring, not through checkpoint images, and a write's worst-case extent-tree reservation is
/// rarely used, so this is an average bound with a margin, not a worst case (the dirt of
/// applied records is counted exactly: `Volume::image_estimate_blocks`).
const IMAGE_BLOCKS_PER_RECORD: u64 = 3;

thread_local! {
    /// This thread's last refused append was refused for the backlog bound alone (see
    /// `with_space`), with the pledge's release count read before the refusal. Per thread:
    /// with many threads refused at once, one thread's reason must not be taken, or cleared,
    /// by another.
    static REFUSED_FOR_BACKLOG: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Images beyond `IMAGE_BLOCKS_PER_RECORD` that handing out `data_blocks` data blocks in one
/// record may need: the generation table records every data block (a level-0 table block per
/// `GENERATIONS_PER_TABLE_BLOCK` blocks); the data checksum table clears their entries (a
/// table block per `CHECKSUMS_PER_TABLE_BLOCK`, each with a generation-table entry), since a
/// free leaves them behind; and the bitmap blocks the run spans, each with a table entry.
/// Counted past one table block's worth; a smaller run is within the average bound (a
/// fallocate of 32 GiB takes 16,384 table blocks: 64 MiB of images).
pub(super) fn data_run_image_blocks(data_blocks: u64) -> u64 {
    if data_blocks <= GENERATIONS_PER_TABLE_BLOCK {
        return 0;
    }
    data_blocks.div_ceil(GENERATIONS_PER_TABLE_BLOCK)
        + 1
        + 2 * (data_blocks.div_ceil(CHECKSUMS_PER_TABLE_BLOCK) + 1)
        + 2 * (data_blocks.div_ceil(BITS_PER_BITMAP_BLOCK) + 1)
}

/// Images beyond `IMAGE_BLOCKS_PER_RECORD` that freeing up to `data_blocks` data blocks in one
/// record may need. A free changes only the block bitmap (format version 6: the generation
/// and checksum entries stay until the block is handed out again), a bitmap block per
/// `BITS_PER_BITMAP_BLOCK` blocks of a contiguous file plus one at each end, each with a
/// generation-table entry. Like `IMAGE_BLOCKS_PER_RECORD` an average bound, not a worst case:
/// a file scattered in small runs over the volume touches more bitmap blocks, which the
/// volume's exact count of dirty blocks (`Volume::image_estimate_blocks`) then brings to the
/// next checkpoint. Freeing 32 GiB takes 258 bitmap blocks.
pub(super) fn data_free_image_blocks(data_blocks: u64) -> u64 {
    if data_blocks <= BITS_PER_BITMAP_BLOCK {
        return 0;
    }
    2 * (data_blocks.div_ceil(BITS_PER_BITMAP_BLOCK) + 1)
}

/// Blocks a namespace operation may need: a leaf and an index block of the parent's H-tree,
/// the new directory's first leaf or the symlink's data block, one spare.
const NAMESPACE_RESERVE_BLOCKS: u64 = 4;
/// Extra blocks any data operation may need for the extent tree and split ends.
const DATA_RESERVE_BLOCKS: u64 = 16;

/// The checkpoint images a data record pledges: its new and tree blocks (up to a namespace
/// operation's), the fixed share, and the table and bitmap blocks of the blocks it hands out
/// and frees.
fn data_record_image_blocks(new_blocks: u64, tree_blocks: u64, freed_blocks: u64) -> u64 {
    (new_blocks + tree_blocks).min(NAMESPACE_RESERVE_BLOCKS)
        + IMAGE_BLOCKS_PER_RECORD
        + data_run_image_blocks(new_blocks)
        + data_free_image_blocks(freed_blocks)
}

/// Blocks kept back from new data and new names so that the extent-tree reserve of operations
/// that take no new data blocks (an overwrite, a write into fallocated space, a punch, a
/// truncate) is there on a full volume: those must not fail for lack of space, as on ext4,
/// whose `s_resv_clusters` (2% of the volume, at most 4096 clusters) serves the same purpose.
/// The tree blocks such operations really take are rare and few, so the pool lasts.
pub(super) fn tree_pool_blocks(block_count: u64) -> u64 {
    (block_count / 50).clamp(4 * DATA_RESERVE_BLOCKS, 4096)
}

/// Pending writes overlapping a new one that `FileSystem::blocks_to_fill` subtracts from the
/// holes it finds; past this many it answers "unknown" and the write counts all its blocks.
const PENDING_OVERLAPS_MAX: usize = 64;

struct Inner {
    /// The gate (as a device) through which the log, the volume and the superblock write.
    device: Arc<dyn Device>,
    /// The same gate, for switching between read-write, read-only and fenced.
    gate: Arc<Gate>,
    /// The device `mount` was given: multi-mount protection reads and writes its block there.
    medium: Arc<dyn Device>,
    /// Changes are refused with `ReadOnly` (checked in `append`, with the changed inode's view
    /// shard locked; see `remount_read_only`).
    read_only: AtomicBool,
    /// The refresh thread of the multi-mount protection block, while mounted read-write.
    mmp: Mutex<Option<MmpKeeper>>,
    /// The refresh interval this mount uses.
    mmp_interval_ms: u32,
    /// The superblock sequence on the medium when this mount last left it read-only (opened
    /// read-only, or remounted so): a remount read-write checks that nobody changed it since.
    medium_sequence: AtomicU64,
    log: Arc<Log>,
    /// Owns the volume, the queue of unapplied records, the applied lsn and the failure latch.
    backend: Arc<Backend>,
    /// The front end's state in shards (views by inode, names by directory), allocation groups
    /// and atomic counters: no lock covers all of it (see `fs::front`).
    front: Front,
    options: MountOptions,
    inode_count: u64,
    max_record_data_bytes: usize,
    /// Direct-write records logged since mount (`FileSystem::direct_write_records`).
    direct_write_records: AtomicU64,
    /// The batch API's index and counters (see `batch`).
    batch: batch::BatchState,
    /// Background compaction: the files whose shape changed and its thread (`compactor`).
    compactor: compactor::Compactor,
    /// Summaries of the regions lookups of home walked (`dir::RegionCache`, `home`).
    regions: dir::RegionCache,
}

/// A mounted tandemfs volume. Cheap to clone; all methods take `&self` and are thread-safe.
#[derive(Clone)]
pub struct FileSystem {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FileSystem {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("FileSystem").field("inode_count", &self.inner.inode_count).finish_non_exhaustive()
    }
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX_BYTES {
        return Err(Error::NameTooLong);
    }
    // One pass for both forbidden bytes: two `contains` calls cost two memchr set-ups, which
    // for a short name is most of a cached lookup's instructions.
    if name.is_empty() || name == b"." || name == b".." || name.iter().any(|byte| *byte == b'/' || *byte == 0) {
        return Err(Error::invalid(format!("{:?} is not a valid entry name", String::from_utf8_lossy(name))));
    }
    Ok(())
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    if let Ok(mut file) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if file.read_exact(&mut bytes).is_ok() {
            return bytes;
        }
    }
    // No /dev/urandom: derive from the clock and the process; uniqueness is all that matters.
    let mut state = now_ns() as u64 ^ ((std::process::id() as u64) << 32);
    for byte in bytes.iter_mut() {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *byte = (state >> 33) as u8;
    }
    bytes
}

fn attributes_image_of(inode: &Inode) -> AttributeImage {
    AttributeImage::from_inode(inode)
}

impl FileSystem {
    // ------------------------------------------------------------------ front-end helpers

    fn check_number(&self, number: InodeNumber) -> Result<()> {
        if number == 0 || number > self.inner.inode_count {
            return Err(Error::NotFound);
        }
        Ok(())
    }

    /// The view of `number` in `shard` (whose write lock the caller holds), loaded from the
    /// volume when absent. `NotFound` for a freed inode.
    pub(super) fn load_view<'a>(&self, shard: &'a mut ViewShard, number: InodeNumber) -> Result<&'a mut InodeView> {
        self.check_number(number)?;
        let front = &self.inner.front;
        let clock = match shard.views.entry(number) {
            std::collections::hash_map::Entry::Occupied(_) => front.clock(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                // One record of one block: read without the volume lock (`read_home`).
                let (inode, entry_count) = self.read_home(|home| {
                    let inode = home.inode(number)?.ok_or(Error::NotFound)?;
                    let entry_count = if inode.file_type() == FileType::Directory {
                        DirRoot::decode(&inode.root_area)?.entry_count()
                    } else {
                        0
                    };
                    Ok((inode, entry_count))
                })?;
                slot.insert(InodeView::new(attributes_image_of(&inode), inode.blocks_owned, entry_count));
                front.tick()
            }
        };
        let view = shard.views.get_mut(&number).expect("present or inserted above");
        if view.reclaimed {
            return Err(Error::NotFound);
        }
        view.last_use.store(clock, Ordering::Relaxed);
        Ok(view)
    }

    /// Write locks on the view shards of `lock`, with the views of `load` loaded (a subset:
    /// a create locks the shard of a number whose view it is about to make). Shards past their
    /// bound drop old views, never those of `lock`.
    pub(super) fn lock_views(&self, lock: &[InodeNumber], load: &[InodeNumber]) -> Result<ViewLocks<'_>> {
        let mut locks = self.inner.front.lock_views(lock);
        for &number in load {
            assert!(lock.contains(&number), "a view is loaded only under its shard's lock");
            self.load_view(locks.shard(number), number)?;
        }
        let applied = self.applied();
        for &number in lock {
            locks.shard(number).trim(applied, lock);
        }
        Ok(locks)
    }

    /// The write lock on the view shard of `number`, its view loaded.
    pub(super) fn lock_view(&self, number: InodeNumber) -> Result<RwLockWriteGuard<'_, ViewShard>> {
        self.check_number(number)?;
        let mut shard = self.inner.front.write_views(number);
        self.load_view(&mut shard, number)?;
        shard.trim(self.applied(), &[number]);
        Ok(shard)
    }

    /// The read lock on the view shard of `number`, its view loaded: stats and reads of
    /// unrelated inodes never wait for each other, only for a change in the same shard.
    pub(super) fn read_view(&self, number: InodeNumber) -> Result<RwLockReadGuard<'_, ViewShard>> {
        self.check_number(number)?;
        let front = &self.inner.front;
        let shard = front.read_views(number);
        match shard.views.get(&number) {
            Some(view) if view.reclaimed => return Err(Error::NotFound),
            Some(view) => {
                let clock = front.clock();
                // Only a stamp that moves is written: readers dirty no line needlessly.
                if view.last_use.load(Ordering::Relaxed) != clock {
                    view.last_use.store(clock, Ordering::Relaxed);
                }
                return Ok(shard);
            }
            None => {}
        }
        drop(shard);
        Ok(RwLockWriteGuard::downgrade(self.lock_view(number)?))
    }

    /// Runs `read` on the view of `number` under its shard's read lock.
    pub(super) fn with_view<T>(&self, number: InodeNumber, read: impl FnOnce(&InodeView) -> T) -> Result<T> {
        let shard = self.read_view(number)?;
        Ok(read(shard.views.get(&number).expect("loaded by read_view")))
    }

    /// What a change needs to know of a directory before it locks its views, copied out under
    /// the read lock; `NotDirectory` for anything else.
    pub(super) fn directory_info(&self, number: InodeNumber) -> Result<DirectoryInfo> {
        self.with_view(number, |view| {
            if view.file_type() != FileType::Directory {
                return Err(Error::NotDirectory);
            }
            Ok(DirectoryInfo {
                generation: view.attributes.generation,
                link_count: view.attributes.link_count,
                complete_epoch: view.complete_epoch,
                parent: view.attributes.parent,
            })
        })?
    }

    /// The locked view of a directory a change was validated against: `NotFound` when it was
    /// removed (or its number reused) since `info` was taken.
    pub(super) fn locked_directory<'a>(
        views: &'a mut ViewLocks<'_>,
        number: InodeNumber,
        info: &DirectoryInfo,
    ) -> Result<&'a mut InodeView> {
        let view = views.get(number);
        if view.reclaimed || view.attributes.generation != info.generation || view.attributes.link_count == 0 {
            return Err(Error::NotFound);
        }
        Ok(view)
    }

    /// A lookup answered under read locks from the name table and loaded views, as the slow
    /// path would answer it; `None` when that path must load or walk something. A name that
    /// points somewhere needs no look at the directory: a directory with an entry is alive.
    pub(super) fn lookup_if_known(&self, parent: InodeNumber, name: &[u8]) -> Option<Result<Attributes>> {
        let front = &self.inner.front;
        let names = front.read_names(parent);
        let entry = names.table.get(parent, name).copied();
        if let Some(NameEntry { target: Some((number, entry_type)), .. }) = entry {
            let views = front.read_views(number);
            let view = views.views.get(&number).filter(|view| !view.reclaimed)?;
            let clock = front.clock();
            if view.last_use.load(Ordering::Relaxed) != clock {
                view.last_use.store(clock, Ordering::Relaxed);
            }
            if let Err(error) = crate::block::inode::check_entry_type(parent, name, entry_type, view.file_type()) {
                return Some(Err(error));
            }
            return Some(Ok(view.to_attributes()));
        }
        let views = front.read_views(parent);
        let directory = views.views.get(&parent).filter(|view| !view.reclaimed)?;
        if directory.file_type() != FileType::Directory {
            return Some(Err(Error::NotDirectory));
        }
        let complete = directory.complete_epoch != 0 && directory.complete_epoch == front.name_epoch(parent);
        match entry {
            Some(_) => Some(Err(Error::NotFound)),
            None if complete => Some(Err(Error::NotFound)),
            None => None,
        }
    }

    pub(super) fn regular_view(view: &mut InodeView) -> Result<&mut InodeView> {
        match view.file_type() {
            FileType::Regular => Ok(view),
            FileType::Directory => Err(Error::IsDirectory),
            _ => Err(Error::invalid("not a regular file")),
        }
    }

    /// Resolves a name in a directory whose name shard the caller holds: the name table
    /// (overlay and lookup cache, one probe), then the applied H-tree.
    pub(super) fn find_name(
        &self,
        names: &mut NameShard,
        parent: InodeNumber,
        info: &DirectoryInfo,
        name: &[u8],
    ) -> Result<Option<(u64, FileType)>> {
        if let Some(entry) = names.table.get(parent, name) {
            return Ok(entry.target);
        }
        let front = &self.inner.front;
        if info.complete_epoch != 0 && info.complete_epoch == front.name_epoch(parent) {
            return Ok(None);
        }
        let found = self.find_applied_name(parent, info.generation, name)?;
        front.make_room_for_name(parent, names, self.applied());
        names.table.cache_applied(parent, name, found);
        Ok(found)
    }

    /// Looks a name up in the applied H-tree of `parent`, without the volume lock
    /// (`read_home`).
    pub(super) fn find_applied_name(
        &self,
        parent: InodeNumber,
        generation: u64,
        name: &[u8],
    ) -> Result<Option<(u64, FileType)>> {
        let seed = &self.inner.backend.applier().hash_seed;
        self.read_home(|home| {
            let Some(inode) = FileSystem::home_inode_in(home, parent, generation)? else {
                // Created but not yet applied: every entry is still in the overlay.
                return Ok(None);
            };
            let root = DirRoot::decode(&inode.root_area)?;
            home.lookup_name(&root, seed, name)
        })?
        .map(|(number, dirent_type)| {
            let file_type = FileType::from_dirent_type(dirent_type)
                .ok_or_else(|| Error::corruption(format!("directory {parent}: entry type {dirent_type} is unknown")))?;
            Ok((number, file_type))
        })
        .transpose()
    }

    /// The applied inode `number` if it is the same inode as the view (same generation); `None`
    /// while its creation is not applied yet, or while the number still holds a freed
    /// predecessor.
    pub(super) fn home_inode(volume: &mut Volume, number: u64, generation: u64) -> Result<Option<Inode>> {
        match volume.read_inode(number) {
            Ok(inode) if inode.generation == generation => Ok(Some(inode)),
            Ok(_) | Err(Error::NotFound) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Reserves `reserved_blocks`, appends `op` and queues it for the back end; returns its lsn.
    /// `None` when the volume cannot promise the blocks or the log is full (nothing is kept then;
    /// the caller's `with_space` drains the back end and tries again). Called with the locks of
    /// every name and view shard the record changes held, so records that touch a common inode
    /// or directory get lsns in the order in which they were validated.
    pub(super) fn append(&self, op: Op, reserved_blocks: u64) -> Result<Option<u64>> {
        self.append_reserving(op, reserved_blocks, 0, 0)
    }

    /// `append` for a record that takes `new_blocks`, may take up to `tree_blocks` more for its
    /// extent tree (see `Space::reserve`) and may free up to `freed_blocks` data blocks.
    pub(super) fn append_reserving(
        &self,
        op: Op,
        new_blocks: u64,
        tree_blocks: u64,
        freed_blocks: u64,
    ) -> Result<Option<u64>> {
        // Each record carries a bound on the checkpoint images its application may need: the
        // back end hands out batches by it, and the log admits the record only while the
        // backlog's bounds stay under the log's limit (`log::pledge`; since format version 9
        // a few image logs' worth, before it the room left beside the records): past that,
        // the caller waits for the back end to apply some of the backlog.
        let image_blocks = data_record_image_blocks(new_blocks, tree_blocks, freed_blocks);
        self.append_with_pledge(op, new_blocks, tree_blocks, image_blocks)
    }

    /// `append_reserving` for a record whose `new_blocks + tree_blocks` the caller reserved
    /// already (`Space::reserve`), a direct write, which claims its blocks before the record
    /// exists. On success the record owns the reservation (the back end returns it once the
    /// record is applied); otherwise the caller still does.
    pub(super) fn append_reserved_blocks(
        &self,
        op: Op,
        new_blocks: u64,
        tree_blocks: u64,
        freed_blocks: u64,
    ) -> Result<Option<u64>> {
        if self.inner.read_only.load(Ordering::SeqCst) {
            return Err(Error::ReadOnly);
        }
        let image_blocks = data_record_image_blocks(new_blocks, tree_blocks, freed_blocks);
        self.append_holding(op, new_blocks + tree_blocks, image_blocks)
    }

    /// `append` for a record that takes `new_blocks` and pledges `image_blocks` checkpoint
    /// images, both counted by the caller from the record (a create batch: `create_batch`).
    pub(super) fn append_pledging(&self, op: Op, new_blocks: u64, image_blocks: u64) -> Result<Option<u64>> {
        self.append_with_pledge(op, new_blocks, 0, image_blocks)
    }

    fn append_with_pledge(&self, op: Op, new_blocks: u64, tree_blocks: u64, image_blocks: u64) -> Result<Option<u64>> {
        let reserved_blocks = new_blocks + tree_blocks;
        // Every change passes here with a view shard locked; a remount read-only sets the flag
        // and then takes every view shard once, so no change slips in after it.
        if self.inner.read_only.load(Ordering::SeqCst) {
            return Err(Error::ReadOnly);
        }
        let space = &self.inner.front.space;
        if !space.reserve(new_blocks, tree_blocks) {
            return Ok(None);
        }
        let appended = self.append_holding(op, reserved_blocks, image_blocks);
        if !matches!(appended, Ok(Some(_))) {
            space.unreserve(reserved_blocks);
        }
        appended
    }

    /// Appends `op`, which holds a reservation of `reserved_blocks` and pledges `image_blocks`
    /// (see `append_with_pledge`), and deposits it in the back end's queue.
    fn append_holding(&self, op: Op, reserved_blocks: u64, image_blocks: u64) -> Result<Option<u64>> {
        let head = op.encode_head();
        let log = &self.inner.log;
        let releases_seen = log.pledges().releases();
        let refused_for_pledge = std::cell::Cell::new(false);
        let append_to_log = |op: &Op| match log.append_pledged(op.kind(), &[&head, op.tail()], image_blocks)? {
            Appended::At(lsn) => Ok(Some(lsn)),
            Appended::LogFull => Ok(None),
            Appended::Pledged => {
                refused_for_pledge.set(true);
                Ok(None)
            }
        };
        let appended = self.inner.backend.enqueue(op, reserved_blocks, image_blocks, append_to_log);
        if refused_for_pledge.get() {
            REFUSED_FOR_BACKLOG.set(Some(releases_seen));
        }
        appended
    }

    /// Runs `attempt` until it gets log space and blocks. On `Ok(None)` it first checkpoints the
    /// records applied since the last checkpoint, when they are many: that moves the log's tail
    /// and makes freed blocks reusable without applying anything. Only if that was not enough
    /// (or too little was applied) does it drain the whole back end and checkpoint.
    pub(super) fn with_space<T>(&self, mut attempt: impl FnMut() -> Result<Option<T>>) -> Result<T> {
        let mut checkpointed_applied = false;
        let mut backlog_waits = 0usize;
        let mut round = 0usize;
        while round < SPACE_ATTEMPTS_MAX {
            self.check_running()?;
            REFUSED_FOR_BACKLOG.set(None);
            if let Some(value) = attempt()? {
                return Ok(value);
            }
            // Refused only because the backlog stands for too many checkpoint images: applying
            // part of it is all that is needed (the back end checkpoints as it goes), so wait
            // for the next applied group rather than for the whole backlog.
            if let Some(releases_seen) = REFUSED_FOR_BACKLOG.replace(None) {
                if backlog_waits < BACKLOG_WAITS_MAX {
                    backlog_waits += 1;
                    self.inner.backend.wait_for_room(releases_seen, self)?;
                    continue;
                }
            }
            round += 1;
            if round < SPACE_ATTEMPTS_MAX {
                if !checkpointed_applied && self.checkpoint_applied()? {
                    checkpointed_applied = true;
                } else {
                    self.drain_and_checkpoint()?;
                }
            }
        }
        Err(Error::NoSpace)
    }

    /// Checkpoints the records applied since the last checkpoint when they hold at least a
    /// sixteenth of the log's normal share (records or bytes); false when they hold less, which
    /// would not be worth a checkpoint's images.
    pub(super) fn checkpoint_applied(&self) -> Result<bool> {
        self.inner.backend.checkpoint_applied(self)
    }

    /// Records a name change in the overlay (the caller holds the directory's name shard); it
    /// replaces whatever the lookup cache held for the name, since that H-tree answer is about
    /// to change.
    pub(super) fn overlay_name(
        &self,
        names: &mut NameShard,
        parent: u64,
        name: &[u8],
        target: Option<(u64, FileType)>,
        lsn: u64,
    ) {
        self.inner.front.make_room_for_name(parent, names, self.applied());
        names.table.set(parent, name, target, lsn);
    }

    pub(super) fn commit_view(view: &mut InodeView, image: AttributeImage, lsn: u64, structural: bool) {
        assert_eq!(view.attributes.inode_number, image.inode_number, "an image commits to its own view");
        view.attributes = image;
        view.last_change_lsn = lsn;
        if structural {
            view.structural_lsn = lsn;
        }
        view.change_counter += 1;
    }

    /// Takes a free inode number for a new inode in `parent`, from the parent's allocation
    /// group when it has room. A table block's free records are checked to be free on the
    /// volume once, when its first number is taken (see `InodeGroups`), so a create takes the
    /// volume lock once per table block, not once per inode.
    /// A new directory (`directory`) starts a fresh group while there is one (see
    /// `InodeGroups::allocate`).
    pub(super) fn allocate_inode(&self, parent: InodeNumber, directory: bool) -> Result<InodeNumber> {
        let backend = &self.inner.backend;
        self.inner.front.inode_numbers.allocate(parent, directory, &mut |numbers, wait| {
            let mut volume = match wait {
                VerifyWait::Always => backend.volume()?,
                VerifyWait::IfFree => match backend.try_volume()? {
                    Some(volume) => volume,
                    None => return Ok(None),
                },
            };
            let mut refused = Vec::new();
            for &number in numbers {
                match volume.check_inode_free(number) {
                    Ok(()) => {}
                    Err(error @ Error::Corruption { .. }) => refused.push((number, error)),
                    Err(error) => return Err(error),
                }
            }
            Ok(Some(refused))
        })
    }

    pub(super) fn applied(&self) -> u64 {
        self.inner.backend.applied_lsn()
    }

    pub(super) fn drain_and_checkpoint(&self) -> Result<()> {
        self.inner.backend.drain_and_checkpoint(self)
    }

    pub(super) fn wait_applied(&self, lsn: u64) -> Result<()> {
        self.inner.backend.wait_applied(lsn, self)
    }

    pub(super) fn check_running(&self) -> Result<()> {
        self.inner.backend.check_running()
    }

    /// Runs the back end once in the caller's thread (tests without a back-end thread).
    pub fn run_backend(&self) -> Result<()> {
        self.inner.log.flush()?;
        while self.inner.backend.pass(self)? {}
        Ok(())
    }

    /// Forces a checkpoint now (tests, `sync`-heavy tools).
    pub fn checkpoint(&self) -> Result<()> {
        self.check_running()?;
        if self.is_read_only() {
            // Nothing was changed, and a read-only mount writes nothing.
            return Ok(());
        }
        self.drain_and_checkpoint()
    }

    /// Why the volume stopped accepting changes, if it did.
    pub fn failure(&self) -> Option<String> {
        self.inner.backend.failure()
    }
}

/// What one applied batch changed in the view of one inode.
#[derive(Default)]
struct ViewUpdate {
    /// Pending writes of records up to this lsn are home now.
    writes_through: u64,
    /// Block estimates of records up to this lsn are replaced by the volume's count.
    blocks_through: u64,
    /// The blocks the inode owns now.
    owned_blocks: Option<u64>,
    /// A record up to this lsn freed the inode.
    reclaimed_through: u64,
}

/// The front end's bookkeeping after the back end applied a batch or checkpointed. It touches
/// the view shards of the batch's inodes one at a time, briefly, and the counters (atomics):
/// readers elsewhere never wait for it.
impl FrontSink for FileSystem {
    fn batch_applied(&self, summary: &BatchSummary<'_>) {
        let front = &self.inner.front;
        let mut updates: crate::FastHashMap<u64, ViewUpdate> = Default::default();
        let mut returned_blocks = 0;
        // Names removed by the batch: (directory, name, lsn).
        let mut removed: Vec<(u64, &[u8], u64)> = Vec::new();
        for queued in summary.records {
            match queued.op.as_ref() {
                Op::Unlink { parent, name, .. } => removed.push((parent.inode_number, name, queued.lsn)),
                Op::Rename { parent, name, kind: RenameKind::Move, .. } => removed.push((*parent, name, queued.lsn)),
                _ => {}
            }
            // Other names need nothing: an entry of the name table whose record is applied is
            // a lookup-cache entry from now on (its lsn is at most the applied lsn).
            returned_blocks += queued.reserved_blocks;
            // Every pending write has its own record, and applying it makes that write and all
            // earlier ones of the inode part of the home data; structural records drop earlier
            // writes when they are made. Writes and range records (allocate, zero) also carry
            // block estimates, which the volume's count below replaces.
            // A view of an inode freed by an applied record is dropped (the volume answers
            // NotFound from now on), so freed inodes do not crowd live ones out of the cache.
            let mut reclaimed = |number: u64| updates.entry(number).or_default().reclaimed_through = queued.lsn;
            match queued.op.as_ref() {
                Op::Unlink { inode, disposition: Disposition::Reclaim, .. } => reclaimed(inode.inode_number),
                Op::Reclaim { inode_number } => reclaimed(*inode_number),
                Op::Rename { replaced: Some((number, Disposition::Reclaim)), .. } => reclaimed(*number),
                _ => {}
            }
            match queued.op.as_ref() {
                Op::Write { inode, .. } | Op::DirectWrite { inode, .. } => {
                    let update = updates.entry(inode.inode_number).or_default();
                    update.writes_through = queued.lsn;
                    update.blocks_through = queued.lsn;
                    // An insert of data cuts inside blocks, as an insert of a range does.
                    if matches!(queued.op.as_ref(), Op::Write { insert: true, .. }) {
                        self.inner.compactor.note_changed(inode.inode_number);
                    }
                }
                Op::Range { inode, kind, .. } => {
                    updates.entry(inode.inode_number).or_default().blocks_through = queued.lsn;
                    // Cuts inside blocks leave shared and partly used blocks behind.
                    if matches!(
                        kind,
                        RangeKind::Insert | RangeKind::Collapse | RangeKind::PunchHole | RangeKind::ZeroRange
                    ) {
                        self.inner.compactor.note_changed(inode.inode_number);
                    }
                }
                _ => {}
            }
        }
        for &(number, blocks) in &summary.owned_blocks {
            updates.entry(number).or_default().owned_blocks = Some(blocks);
        }
        // Each view with its estimates and its count together, so that a stat never sees the
        // estimate gone and the count not yet in; each shard taken once for all its views of the
        // batch (a batch of creates touches about two views a record, and a lock take each cost
        // the front end's threads that wait on the same shards).
        let mut updates: Vec<(usize, u64, ViewUpdate)> =
            updates.into_iter().map(|(number, update)| (Front::view_shard_index(number), number, update)).collect();
        updates.sort_unstable_by_key(|(shard_index, number, _)| (*shard_index, *number));
        let mut held: Option<(usize, RwLockWriteGuard<'_, ViewShard>)> = None;
        for (shard_index, number, update) in updates {
            if held.as_ref().is_none_or(|(index, _)| *index != shard_index) {
                drop(held.take()); // one shard at a time
                held = Some((shard_index, front.write_views(number)));
            }
            let shard = &mut held.as_mut().expect("taken above").1;
            let Some(view) = shard.views.get_mut(&number) else {
                continue;
            };
            // Still the freed inode (a create may have reused the number since) and nothing
            // about it pending: drop it.
            if view.reclaimed && update.reclaimed_through > 0 && view.last_change_lsn <= update.reclaimed_through {
                shard.views.remove(&number);
                shard.evictions += 1;
                continue;
            }
            view.forget_writes_through(update.writes_through);
            view.forget_blocks_through(update.blocks_through);
            if let Some(blocks) = update.owned_blocks {
                view.blocks_owned = blocks;
            }
        }
        drop(held);
        // A removed name's entry says what the H-tree now says: dropped, so that the names of
        // deleted files do not fill the table (one shard at a time, each taken once a batch).
        removed.sort_by_key(|(directory, _, lsn)| (Front::name_shard_index(*directory), *lsn));
        let mut held: Option<(usize, crate::fs::front::NameWriteGuard<'_>)> = None;
        for (directory, name, lsn) in removed {
            let shard_index = Front::name_shard_index(directory);
            if held.as_ref().is_none_or(|(index, _)| *index != shard_index) {
                drop(held.take());
                held = Some((shard_index, front.write_names(directory)));
            }
            let shard = &mut held.as_mut().expect("taken above").1;
            if shard.table.forget_removed(directory, name, lsn) {
                front.count_names(shard);
            }
        }
        drop(held);
        front.space.applied(returned_blocks, summary.free_blocks, summary.pending_free_blocks);
        // Last, so that a directory it learns sees the views as this batch left them.
        self.feed_directory_index(summary);
    }

    fn space_changed(&self, free_blocks: u64, pending_free_blocks: u64) {
        self.inner.front.space.applied(0, free_blocks, pending_free_blocks);
    }
}

/// A directory as a change saw it before locking its views (see `directory_info`).
#[derive(Clone, Copy, Debug)]
pub(super) struct DirectoryInfo {
    pub generation: u64,
    pub link_count: u32,
    pub complete_epoch: u64,
    pub parent: u64,
}
