//! The `FileSystem` handle: front-end operations, the back-end driver, mount and unmount.

use super::front::{Front, InodeView, PendingWrite};
use super::types::*;
use crate::backend::record::{AttributeImage, Disposition, Op, RangeKind, RenameKind, XATTR_VALUE_MAX_BYTES};
use crate::backend::{self, now_ns, Applier};
use crate::block::bitmap::Bitmap;
use crate::block::inode::Inode;
use crate::block::meta::{BlockKind, BLOCK_SIZE_U64};
use crate::block::superblock::{Superblock, STATE_CLEAN, STATE_MOUNTED};
use crate::block::volume::{Volume, XATTR_BLOCK_PAYLOAD_BYTES};
use crate::device::Device;
use crate::dir::{self, DirRoot};
use crate::error::{Error, Result};
use crate::extent::{self, ExtentRoot, MAX_FILE_BYTES};
use crate::log::{Log, LogOptions};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Records applied per back-end pass before the volume lock is let go: small enough that a
/// front-end lookup waiting for the lock is not held up for long.
const BATCH_RECORDS_MAX: usize = 32;
/// Attempts of an operation that must wait for log space, its share of the backlog or free
/// blocks: the first after a checkpoint of what is applied, the others after full drains. A
/// drain lets one thread through; other threads may take the room again before this one
/// retries, hence more than a few attempts. A volume that is really full answers NoSpace after
/// this many drains (each cheap then).
const SPACE_ATTEMPTS_MAX: usize = 64;
/// Attempts of an optimistic read before it holds the front end still.
const READ_ATTEMPTS_MAX: usize = 8;
/// Symbolic links followed while resolving one path.
const SYMLINK_FOLLOW_MAX: usize = 40;
/// Directory levels walked looking for a rename loop.
const DEPTH_WALK_MAX: usize = 1 << 16;
/// A checkpoint is taken at least this often while records are applied.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);
/// Blocks besides its new ones that applying one record typically dirties: its inode's table
/// block, its parent's leaf or index block, a bitmap block. A record's new metadata blocks are
/// counted up to a namespace operation's reservation; file data goes home from the log's data
/// ring, not through checkpoint images, and a write's worst-case extent-tree reservation is
/// rarely used, so the budget below is an average bound with a margin, not a worst case.
const IMAGE_BLOCKS_PER_RECORD: u64 = 3;

/// How many image blocks the unapplied backlog may stand for: a quarter of the log's reserve, so
/// that the images of the blocks already dirty (the back end checkpoints before they pass half
/// the reserve) and those of the whole backlog fit in it together.
fn image_budget_blocks(usage: &crate::log::LogUsage) -> u64 {
    let reserve_bytes = usage.data_bytes_capacity - usage.data_bytes_normal;
    (reserve_bytes / 4 / BLOCK_SIZE_U64).max(8 * (NAMESPACE_RESERVE_BLOCKS + IMAGE_BLOCKS_PER_RECORD))
}

/// Below this many free blocks, with frees pending, the back end checkpoints before it applies
/// more: comfortably above what one batch of records allocates.
const BACKEND_LOW_WATER_BLOCKS: u64 = 1024;
/// Blocks a namespace operation may need: a leaf and an index block of the parent's H-tree,
/// the new directory's first leaf or the symlink's data block, one spare.
const NAMESPACE_RESERVE_BLOCKS: u64 = 4;
/// Extended attribute namespaces that `set_xattr` and friends accept.
const XATTR_NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
/// Extra blocks any data operation may need for the extent tree and split ends.
const DATA_RESERVE_BLOCKS: u64 = 16;

struct Queued {
    lsn: u64,
    op: Arc<Op>,
    reserved_blocks: u64,
    /// Bound on the metadata blocks applying it may dirty (see `Front::queued_image_blocks`).
    image_blocks: u64,
}

const STATE_RUNNING: u8 = 0;
const STATE_UNMOUNTED: u8 = 1;
const STATE_FAILED: u8 = 2;

struct Inner {
    device: Arc<dyn Device>,
    log: Arc<Log>,
    volume: Mutex<Volume>,
    applier: Applier,
    front: Mutex<Front>,
    queue: Mutex<VecDeque<Queued>>,
    queue_signal: Condvar,
    applied_lsn: Mutex<u64>,
    applied_signal: Condvar,
    /// One back-end pass or checkpoint at a time, from the thread or from a waiting caller.
    backend_lock: Mutex<BackendState>,
    state: std::sync::atomic::AtomicU8,
    failure: Mutex<Option<String>>,
    stop: AtomicBool,
    options: MountOptions,
    inode_count: u64,
    max_record_data_bytes: usize,
    checkpoints: AtomicU64,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct BackendState {
    last_checkpoint: Instant,
    applied_since_checkpoint: u64,
    /// Log data bytes of the records applied since the last checkpoint (approximate).
    applied_bytes_since_checkpoint: u64,
}

/// Log bytes a record takes besides a write's data: its encoded attributes and names.
const RECORD_OVERHEAD_BYTES: usize = 256;

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
    // ------------------------------------------------------------------ format and mount

    /// Writes an empty file system on `device` (mkfs).
    pub fn format(device: Arc<dyn Device>, options: &FormatOptions) -> Result<()> {
        let block_count = device.size_bytes() / BLOCK_SIZE_U64;
        let mut superblock = Superblock::layout(block_count, options.inode_count, options.log_bytes)?;
        superblock.uuid = options.uuid.unwrap_or_else(random_bytes::<16>);
        superblock.hash_seed = options.hash_seed.unwrap_or_else(|| {
            let bytes = random_bytes::<16>();
            std::array::from_fn(|index| u32::from_le_bytes(bytes[index * 4..index * 4 + 4].try_into().unwrap()))
        });
        let now = now_ns();
        superblock.format_time_ns = now;
        Log::format(device.as_ref(), &superblock.log_geometry())?;
        // Old contents of the inode table would not parse: zero it. Other regions are either
        // written here (bitmaps) or allocated before use.
        let zeros = vec![0u8; 1 << 20];
        let table_start = superblock.inode_table_start * BLOCK_SIZE_U64;
        let table_end = table_start + superblock.inode_table_blocks * BLOCK_SIZE_U64;
        let mut position = table_start;
        while position < table_end {
            let length = (table_end - position).min(zeros.len() as u64) as usize;
            device.write_at(position, &zeros[..length])?;
            position += length as u64;
        }
        let mut volume = Volume::new_empty(device.clone(), superblock.clone(), 1024);
        volume.blocks.set_range(0, superblock.first_data_block);
        volume.blocks.mark_all_dirty();
        volume.inodes.mark_all_dirty();
        volume.current_lsn = 0;
        let root = dir::create(&mut volume)?;
        let root_inode = Inode {
            inode_number: ROOT_INODE,
            generation: 1,
            mode: FileType::Directory.mode_bits() | 0o755,
            link_count: 2,
            uid: options.root_owner.map_or(0, |(uid, _)| uid),
            gid: options.root_owner.map_or(0, |(_, gid)| gid),
            size_bytes: 0,
            blocks_owned: 0,
            access_time_ns: now,
            modify_time_ns: now,
            change_time_ns: now,
            birth_time_ns: now,
            rdev: 0,
            parent: ROOT_INODE,
            orphan_next: 0,
            xattr_block: 0,
            flags: 0,
            root_area: root.encode(),
        };
        volume.create_inode(&root_inode)?;
        let images = volume.snapshot_images();
        Volume::write_images_home(device.as_ref(), &images)?;
        volume.images_home(&images);
        let mut superblock = volume.superblock.clone();
        superblock.next_generation = 2;
        superblock.free_blocks = volume.blocks.free_count();
        superblock.free_inodes = volume.inodes.free_count();
        device.flush()?;
        // Both copies, so that neither holds an older file system's superblock.
        superblock.sequence = 1;
        superblock.write(device.as_ref())?;
        superblock.sequence = 2;
        superblock.write(device.as_ref())?;
        device.flush()
    }

    /// Opens the volume, replays the log if needed, reclaims orphans.
    pub fn mount(device: Arc<dyn Device>, options: &MountOptions) -> Result<(FileSystem, MountReport)> {
        let log_options = LogOptions {
            flush_delay_us: if options.background_backend { options.flush_delay_us } else { u64::MAX / 4 },
            reserve_fraction: 0.5,
        };
        let cache_blocks = (options.cache_bytes / BLOCK_SIZE_U64).max(64) as usize;
        let (volume, log, applier, report) = backend::open_volume(device.clone(), log_options, cache_blocks, true)?;
        volume.check_bitmaps_trusted()?;
        let last_lsn = log.next_lsn() - 1;
        let volume = Mutex::new(volume);
        if report.records_replayed > 0 || report.orphans_reclaimed > 0 {
            backend::checkpoint(&volume, &log, last_lsn, &|| None)?;
        }
        let mut volume = volume.into_inner();
        let superblock = &mut volume.superblock;
        superblock.state = STATE_MOUNTED;
        superblock.mount_count += 1;
        superblock.mount_time_ns = now_ns();
        superblock.sequence += 1;
        superblock.write(device.as_ref())?;
        device.flush()?;

        let inode_count = volume.superblock.inode_count;
        let mut inode_numbers = Bitmap::new(inode_count, BlockKind::InodeBitmap);
        for bit in 0..inode_count {
            if volume.inodes.is_set(bit) {
                inode_numbers.set_range(bit, 1);
            }
        }
        let front = Front {
            views: Default::default(),
            names: Default::default(),
            inode_numbers,
            next_generation: volume.superblock.next_generation,
            reserved_blocks: 0,
            free_blocks: volume.free_blocks(),
            pending_free_blocks: 0,
            queued_image_blocks: 0,
            image_budget_blocks: image_budget_blocks(&log.usage()),
            refused_for_backlog: false,
            use_clock: 0,
        };
        let usage = log.usage();
        // A record must fit the log many times over; a write larger than this is split.
        let max_record_data_bytes = ((usage.data_bytes_normal / 16) as usize).clamp(4096, 1 << 20);
        let inner = Arc::new(Inner {
            device,
            log,
            volume: Mutex::new(volume),
            applier,
            front: Mutex::new(front),
            queue: Mutex::new(VecDeque::new()),
            queue_signal: Condvar::new(),
            applied_lsn: Mutex::new(last_lsn),
            applied_signal: Condvar::new(),
            backend_lock: Mutex::new(BackendState {
                last_checkpoint: Instant::now(),
                applied_since_checkpoint: 0,
                applied_bytes_since_checkpoint: 0,
            }),
            state: std::sync::atomic::AtomicU8::new(STATE_RUNNING),
            failure: Mutex::new(None),
            stop: AtomicBool::new(false),
            options: options.clone(),
            inode_count,
            max_record_data_bytes,
            checkpoints: AtomicU64::new(0),
            thread: Mutex::new(None),
        });
        let file_system = FileSystem { inner };
        if options.background_backend {
            let worker = file_system.clone();
            let handle = std::thread::Builder::new()
                .name("tandem-backend".into())
                .spawn(move || worker.backend_thread())
                .map_err(|error| Error::Io { operation: "start back-end thread", offset: 0, source: error })?;
            *file_system.inner.thread.lock() = Some(handle);
        }
        Ok((file_system, report))
    }

    /// Applies and checkpoints everything, marks the volume clean. Later calls fail with `Shutdown`.
    pub fn unmount(&self) -> Result<()> {
        let inner = &self.inner;
        if inner.state.load(Ordering::Acquire) == STATE_UNMOUNTED {
            return Ok(());
        }
        let result = (|| {
            self.check_running()?;
            inner.log.flush()?;
            self.drain_and_checkpoint()?;
            Ok(())
        })();
        inner.stop.store(true, Ordering::Release);
        inner.queue_signal.notify_all();
        if let Some(handle) = inner.thread.lock().take() {
            let _ = handle.join();
        }
        result?;
        let _backend = inner.backend_lock.lock();
        let mut volume = inner.volume.lock();
        let superblock = &mut volume.superblock;
        superblock.state = STATE_CLEAN;
        superblock.sequence += 1;
        superblock.write(inner.device.as_ref())?;
        inner.device.flush()?;
        inner.log.shutdown()?;
        inner.state.store(STATE_UNMOUNTED, Ordering::Release);
        Ok(())
    }

    fn check_running(&self) -> Result<()> {
        match self.inner.state.load(Ordering::Acquire) {
            STATE_RUNNING => Ok(()),
            _ => Err(Error::Shutdown),
        }
    }

    fn fail(&self, error: &Error) {
        let mut failure = self.inner.failure.lock();
        if failure.is_none() {
            *failure = Some(error.to_string());
        }
        self.inner.state.store(STATE_FAILED, Ordering::Release);
        self.inner.applied_signal.notify_all();
    }

    /// Why the volume stopped accepting changes, if it did.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.lock().clone()
    }

    // ------------------------------------------------------------------ back end driver

    fn backend_thread(&self) {
        let inner = &self.inner;
        while !inner.stop.load(Ordering::Acquire) {
            match self.backend_pass() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(_) => return,
            }
            let durable = inner.log.durable_lsn();
            let waiting = inner.queue.lock().front().map(|queued| queued.lsn);
            match waiting {
                // Records are waiting to become durable: the log's flusher makes them so.
                Some(lsn) if lsn > durable => {
                    if inner.log.wait_for_durable_above(durable, Duration::from_millis(5)).is_err() {
                        return;
                    }
                }
                Some(_) => {}
                None => {
                    let mut queue = inner.queue.lock();
                    if queue.is_empty() && !inner.stop.load(Ordering::Acquire) {
                        inner.queue_signal.wait_for(&mut queue, Duration::from_millis(200));
                    }
                }
            }
        }
    }

    /// Applies durable queued records; returns whether it applied any. Also checkpoints when
    /// the log or the dirty set has grown, or time has passed.
    fn backend_pass(&self) -> Result<bool> {
        let inner = &self.inner;
        let mut backend = inner.backend_lock.lock();
        if inner.state.load(Ordering::Acquire) == STATE_FAILED {
            return Err(Error::Shutdown);
        }
        let durable = inner.log.durable_lsn();
        let mut batch: Vec<Queued> = {
            let mut queue = inner.queue.lock();
            let mut batch = Vec::new();
            while batch.len() < BATCH_RECORDS_MAX && queue.front().is_some_and(|queued| queued.lsn <= durable) {
                batch.push(queue.pop_front().unwrap());
            }
            batch
        };
        if batch.is_empty() {
            self.maybe_checkpoint(&mut backend, false)?;
            return Ok(false);
        }
        let mut owned: Vec<(u64, u64)> = Vec::new();
        let free_blocks;
        let pending_free_blocks;
        let mut applied_count = 0;
        {
            let mut volume = inner.volume.lock();
            for queued in &batch {
                // Blocks the back end frees (leaves that compaction empties, for one) are
                // reusable only after a checkpoint records the free. When free blocks run low
                // while some are pending, stop the batch and checkpoint first, rather than fail
                // an allocation that the next checkpoint would have satisfied. At least one
                // record is applied per pass, so the back end always makes progress.
                if applied_count > 0
                    && volume.free_blocks() < BACKEND_LOW_WATER_BLOCKS
                    && volume.blocks.pending_free_count() > 0
                {
                    break;
                }
                match inner.applier.apply(&mut volume, queued.lsn, &queued.op) {
                    // Later records come later in the list, so the last count of an inode wins.
                    Ok(written) => owned.extend(written),
                    Err(error) => {
                        drop(volume);
                        self.fail(&error);
                        return Err(error);
                    }
                }
                applied_count += 1;
            }
            free_blocks = volume.free_blocks();
            pending_free_blocks = volume.blocks.pending_free_count();
        }
        let space_low = applied_count < batch.len();
        if space_low {
            // Back to the head of the queue, in lsn order: they precede everything queued since.
            let leftover = batch.split_off(applied_count);
            let mut queue = inner.queue.lock();
            for queued in leftover.into_iter().rev() {
                queue.push_front(queued);
            }
        }
        let last = batch.last().expect("at least one record is applied per pass").lsn;
        {
            let mut front = inner.front.lock();
            for queued in &batch {
                // Names need nothing: an entry of the name table whose record is applied is a
                // lookup-cache entry from now on (its lsn is at most the applied lsn).
                front.reserved_blocks -= queued.reserved_blocks;
                front.queued_image_blocks -= queued.image_blocks;
                // Every pending write has its own record, and applying it makes that write and
                // all earlier ones of the inode part of the home data. Other records need no
                // visit: structural ones drop earlier writes when they are made.
                if let Op::Write { inode, .. } = queued.op.as_ref() {
                    if let Some(view) = front.views.get_mut(&inode.inode_number) {
                        view.forget_writes_through(queued.lsn);
                    }
                }
            }
            for (number, blocks) in owned {
                if let Some(view) = front.views.get_mut(&number) {
                    view.blocks_owned = blocks;
                }
            }
            front.free_blocks = free_blocks;
            front.pending_free_blocks = pending_free_blocks;
            front.trim_views(last);
        }
        *inner.applied_lsn.lock() = last;
        inner.applied_signal.notify_all();
        backend.applied_since_checkpoint += batch.len() as u64;
        backend.applied_bytes_since_checkpoint +=
            batch.iter().map(|queued| (RECORD_OVERHEAD_BYTES + queued.op.tail().len()) as u64).sum::<u64>();
        self.maybe_checkpoint(&mut backend, space_low)?;
        Ok(true)
    }

    fn maybe_checkpoint(&self, backend: &mut BackendState, force: bool) -> Result<()> {
        let inner = &self.inner;
        if backend.applied_since_checkpoint == 0 && !force {
            return Ok(());
        }
        let usage = inner.log.usage();
        let (dirty_bytes, free_blocks, pending_free_blocks) = {
            let volume = inner.volume.lock();
            (
                volume.cache_dirty_count() as u64 * BLOCK_SIZE_U64,
                volume.free_blocks(),
                volume.blocks.pending_free_count(),
            )
        };
        // A checkpoint frees the log only up to the last applied record, so it is due when what
        // was applied since the last one fills a good part of the log's normal share, not when
        // the log is full of records still waiting to be applied (checkpointing then would only
        // add images). Its images go to the reserve: take one while they fit in half of it.
        let reserve_bytes = usage.data_bytes_capacity - usage.data_bytes_normal;
        let due = force
            || backend.applied_bytes_since_checkpoint * 4 > usage.data_bytes_normal
            || backend.applied_since_checkpoint * 4 > usage.header_slots_normal
            || dirty_bytes * 2 > reserve_bytes
            // Freed blocks wait for a checkpoint before reuse: take one before they are a
            // large share of what the volume could hand out.
            || pending_free_blocks * 2 > free_blocks
            || backend.last_checkpoint.elapsed() > CHECKPOINT_INTERVAL;
        if !due {
            return Ok(());
        }
        let applied = *inner.applied_lsn.lock();
        // Appends and queueing happen together under the front-end lock: holding it gives a
        // consistent answer to "which appended record is the first not yet applied".
        let first_unapplied = || {
            let _front = inner.front.lock();
            inner.queue.lock().front().map(|queued| queued.lsn)
        };
        if let Err(error) = backend::checkpoint(&inner.volume, &inner.log, applied, &first_unapplied) {
            self.fail(&error);
            return Err(error);
        }
        let (free_blocks, pending_free_blocks) = {
            let volume = inner.volume.lock();
            (volume.free_blocks(), volume.blocks.pending_free_count())
        };
        let mut front = inner.front.lock();
        front.free_blocks = free_blocks;
        front.pending_free_blocks = pending_free_blocks;
        drop(front);
        backend.last_checkpoint = Instant::now();
        backend.applied_since_checkpoint = 0;
        backend.applied_bytes_since_checkpoint = 0;
        inner.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes every appended record durable, applies all of them and checkpoints: frees log
    /// space, returns reserved blocks and makes freed blocks reusable.
    fn drain_and_checkpoint(&self) -> Result<()> {
        self.drain()?;
        let mut backend = self.inner.backend_lock.lock();
        self.maybe_checkpoint(&mut backend, true)
    }

    /// Makes every appended record durable and applies all of them; checkpoints only where the
    /// back end's own rules call for one.
    fn drain(&self) -> Result<()> {
        // Checkpoint records never enter the queue: an empty queue after a flush means every
        // logical record is applied.
        let mut rounds = 0usize;
        loop {
            self.inner.log.flush()?;
            if self.inner.queue.lock().is_empty() {
                break;
            }
            rounds += 1;
            assert!(rounds < 1 << 20, "back end makes no progress");
            self.backend_pass()?;
        }
        Ok(())
    }

    /// Waits until the record `lsn` has been applied.
    fn wait_applied(&self, lsn: u64) -> Result<()> {
        let inner = &self.inner;
        if *inner.applied_lsn.lock() >= lsn {
            return Ok(());
        }
        inner.log.flush()?;
        if !inner.options.background_backend {
            while *inner.applied_lsn.lock() < lsn {
                if !self.backend_pass()? {
                    inner.log.flush()?;
                }
            }
            return Ok(());
        }
        inner.queue_signal.notify_all();
        let mut applied = inner.applied_lsn.lock();
        while *applied < lsn {
            if inner.state.load(Ordering::Acquire) == STATE_FAILED {
                return Err(Error::Shutdown);
            }
            inner.applied_signal.wait_for(&mut applied, Duration::from_millis(50));
        }
        Ok(())
    }

    /// Runs the back end once in the caller's thread (tests without a back-end thread).
    pub fn run_backend(&self) -> Result<()> {
        self.inner.log.flush()?;
        while self.backend_pass()? {}
        Ok(())
    }

    /// Forces a checkpoint now (tests, `sync`-heavy tools).
    pub fn checkpoint(&self) -> Result<()> {
        self.check_running()?;
        self.drain_and_checkpoint()
    }

    // ------------------------------------------------------------------ front-end helpers

    /// The view of `number`, loaded from the volume when absent.
    fn view<'a>(&self, front: &'a mut Front, number: InodeNumber) -> Result<&'a mut InodeView> {
        if number == 0 || number > self.inner.inode_count {
            return Err(Error::NotFound);
        }
        front.use_clock += 1;
        let clock = front.use_clock;
        let view = match front.views.entry(number) {
            std::collections::hash_map::Entry::Occupied(slot) => slot.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let mut volume = self.inner.volume.lock();
                let inode = volume.read_inode(number)?;
                let entry_count = if inode.file_type() == FileType::Directory {
                    DirRoot::decode(&inode.root_area)?.entry_count()
                } else {
                    0
                };
                slot.insert(InodeView::new(attributes_image_of(&inode), inode.blocks_owned, entry_count))
            }
        };
        if view.reclaimed {
            return Err(Error::NotFound);
        }
        view.last_use = clock;
        Ok(view)
    }

    fn regular_view<'a>(&self, front: &'a mut Front, number: InodeNumber) -> Result<&'a mut InodeView> {
        let view = self.view(front, number)?;
        match view.file_type() {
            FileType::Regular => Ok(view),
            FileType::Directory => Err(Error::IsDirectory),
            _ => Err(Error::invalid("not a regular file")),
        }
    }

    fn directory_view<'a>(&self, front: &'a mut Front, number: InodeNumber) -> Result<&'a mut InodeView> {
        let view = self.view(front, number)?;
        if view.file_type() != FileType::Directory {
            return Err(Error::NotDirectory);
        }
        Ok(view)
    }

    /// Resolves a name in a directory: the name table (overlay and lookup cache, one probe),
    /// then the applied H-tree.
    fn find_name(&self, front: &mut Front, parent: InodeNumber, name: &[u8]) -> Result<Option<(u64, FileType)>> {
        let view = self.directory_view(front, parent)?;
        let (generation, complete) = (view.attributes.generation, view.complete);
        if let Some(entry) = front.names.get(parent, name) {
            return Ok(entry.target);
        }
        if complete {
            return Ok(None);
        }
        let found = self.find_applied_name(parent, generation, name)?;
        front.make_room_for_name(self.applied());
        front.names.cache_applied(parent, name, found);
        Ok(found)
    }

    /// Looks a name up in the applied H-tree of `parent`.
    fn find_applied_name(&self, parent: InodeNumber, generation: u64, name: &[u8]) -> Result<Option<(u64, FileType)>> {
        let mut volume = self.inner.volume.lock();
        let Some(inode) = FileSystem::home_inode(&mut volume, parent, generation)? else {
            // Created but not yet applied: every entry is still in the overlay.
            return Ok(None);
        };
        let root = DirRoot::decode(&inode.root_area)?;
        match dir::lookup(&mut *volume, &root, &self.inner.applier.hash_seed, name)? {
            None => Ok(None),
            Some((number, dirent_type)) => {
                let file_type = FileType::from_dirent_type(dirent_type).ok_or_else(|| {
                    Error::corruption(format!("directory {parent}: entry type {dirent_type} is unknown"))
                })?;
                Ok(Some((number, file_type)))
            }
        }
    }

    /// The applied inode `number` if it is the same inode as the view (same generation); `None`
    /// while its creation is not applied yet, or while the number still holds a freed
    /// predecessor.
    fn home_inode(volume: &mut Volume, number: u64, generation: u64) -> Result<Option<Inode>> {
        match volume.read_inode(number) {
            Ok(inode) if inode.generation == generation => Ok(Some(inode)),
            Ok(_) | Err(Error::NotFound) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Reserves blocks for a record; false when the volume cannot promise them now.
    fn reserve(front: &mut Front, blocks: u64) -> bool {
        if front.reserved_blocks + blocks > front.free_blocks {
            return false;
        }
        front.reserved_blocks += blocks;
        true
    }

    /// Reserves `reserved_blocks`, appends `op` and queues it for the back end; returns its lsn.
    /// `None` when the volume cannot promise the blocks or the log is full (nothing is kept then;
    /// the caller's `with_space` drains the back end and tries again). Called with the front-end
    /// lock held, so appends and the queue stay in lsn order.
    fn append(&self, front: &mut Front, op: Op, reserved_blocks: u64) -> Result<Option<u64>> {
        // Every checkpoint writes its block images into the log's reserve, and while records
        // older than them wait, the tail cannot pass those images. A backlog whose application
        // dirties more than the reserve can hold would leave the back end (and a replay after a
        // crash) with nowhere to write a checkpoint. So the backlog is bounded by a budget of
        // image blocks, as well as by log bytes: past it, the caller drains the back end.
        let image_blocks = reserved_blocks.min(NAMESPACE_RESERVE_BLOCKS) + IMAGE_BLOCKS_PER_RECORD;
        if front.queued_image_blocks > 0 && front.queued_image_blocks + image_blocks > front.image_budget_blocks {
            front.refused_for_backlog = true;
            return Ok(None);
        }
        if !FileSystem::reserve(front, reserved_blocks) {
            return Ok(None);
        }
        let head = op.encode_head();
        let lsn = match self.inner.log.append(op.kind(), &[&head, op.tail()]) {
            Ok(Some(lsn)) => lsn,
            Ok(None) => {
                front.reserved_blocks -= reserved_blocks;
                return Ok(None);
            }
            Err(error) => {
                front.reserved_blocks -= reserved_blocks;
                self.fail(&error);
                return Err(error);
            }
        };
        front.queued_image_blocks += image_blocks;
        self.inner.queue.lock().push_back(Queued { lsn, op: Arc::new(op), reserved_blocks, image_blocks });
        Ok(Some(lsn))
    }

    /// Runs `attempt` until it gets log space and blocks. On `Ok(None)` it first checkpoints the
    /// records applied since the last checkpoint, when they are many: that moves the log's tail
    /// and makes freed blocks reusable without applying anything. Only if that was not enough
    /// (or too little was applied) does it drain the whole back end and checkpoint.
    fn with_space<T>(&self, mut attempt: impl FnMut() -> Result<Option<T>>) -> Result<T> {
        let mut checkpointed_applied = false;
        for round in 0..SPACE_ATTEMPTS_MAX {
            self.check_running()?;
            if let Some(value) = attempt()? {
                return Ok(value);
            }
            if round + 1 < SPACE_ATTEMPTS_MAX {
                // Refused only because the backlog stands for too many checkpoint images:
                // applying it is all that is needed, the back end checkpoints as it goes.
                if std::mem::take(&mut self.inner.front.lock().refused_for_backlog) {
                    self.drain()?;
                } else if !checkpointed_applied && self.checkpoint_applied()? {
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
    fn checkpoint_applied(&self) -> Result<bool> {
        let usage = self.inner.log.usage();
        let mut backend = self.inner.backend_lock.lock();
        if backend.applied_since_checkpoint * 16 < usage.header_slots_normal
            && backend.applied_bytes_since_checkpoint * 16 < usage.data_bytes_normal
        {
            return Ok(false);
        }
        self.maybe_checkpoint(&mut backend, true)?;
        Ok(true)
    }

    /// Records a name change in the overlay; it replaces whatever the lookup cache held for the
    /// name, since that H-tree answer is about to change.
    fn overlay_name(&self, front: &mut Front, parent: u64, name: &[u8], target: Option<(u64, FileType)>, lsn: u64) {
        front.make_room_for_name(self.applied());
        front.names.set(parent, name, target, lsn);
    }

    fn commit_view(front: &mut Front, image: AttributeImage, lsn: u64, structural: bool) {
        let view = front.views.get_mut(&image.inode_number).expect("view loaded before the change");
        view.attributes = image;
        view.last_change_lsn = lsn;
        if structural {
            view.structural_lsn = lsn;
        }
        view.change_counter += 1;
    }

    fn applied(&self) -> u64 {
        *self.inner.applied_lsn.lock()
    }

    // ------------------------------------------------------------------ namespace

    pub fn lookup(&self, parent: InodeNumber, name: &[u8]) -> Result<Attributes> {
        if name.len() > NAME_MAX_BYTES {
            return Err(Error::NameTooLong);
        }
        let dots = name == b"." || name == b"..";
        if !dots {
            // Before the lock: the front end is held only for the probes.
            check_name(name)?;
        }
        let mut front = self.inner.front.lock();
        if name == b"." {
            return Ok(self.directory_view(&mut front, parent)?.to_attributes());
        }
        if name == b".." {
            let up = self.directory_view(&mut front, parent)?.attributes.parent;
            return Ok(self.view(&mut front, up)?.to_attributes());
        }
        let (number, entry_type) = self.find_name(&mut front, parent, name)?.ok_or(Error::NotFound)?;
        let view = self
            .view(&mut front, number)
            .map_err(|error| crate::block::inode::entry_target_error(parent, name, number, error))?;
        crate::block::inode::check_entry_type(parent, name, entry_type, view.file_type())?;
        Ok(view.to_attributes())
    }

    pub fn get_attributes(&self, inode: InodeNumber) -> Result<Attributes> {
        let mut front = self.inner.front.lock();
        Ok(self.view(&mut front, inode)?.to_attributes())
    }

    pub fn set_attributes(&self, inode: InodeNumber, changes: &SetAttributes) -> Result<Attributes> {
        if let Some(permissions) = changes.permissions {
            if permissions & !0o7777 != 0 {
                return Err(Error::invalid(format!("mode {permissions:#o} has bits beyond 0o7777")));
            }
        }
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            let view = self.view(&mut front, inode)?;
            let mut image = view.attributes.clone();
            let file_type = view.file_type();
            let now = now_ns();
            let mut truncate = false;
            if let Some(size) = changes.size_bytes {
                match file_type {
                    FileType::Regular => {}
                    FileType::Directory => return Err(Error::IsDirectory),
                    _ => return Err(Error::invalid("size of a special file cannot change")),
                }
                if size > MAX_FILE_BYTES {
                    return Err(Error::FileTooLarge);
                }
                truncate = true;
                // Linux updates mtime on every truncate, to the same size too (ext4 does, and
                // xfstests generic/313 checks it). The FUSE kernel leaves it to the server: it
                // sends no mtime with the size for truncate(2), ftruncate(2) and O_TRUNC.
                image.modify_time_ns = now;
                image.size_bytes = size;
            }
            if let Some(permissions) = changes.permissions {
                image.mode = file_type.mode_bits() | permissions;
            }
            let owner_changed =
                changes.uid.is_some_and(|uid| uid != image.uid) || changes.gid.is_some_and(|gid| gid != image.gid);
            if let Some(uid) = changes.uid {
                image.uid = uid;
            }
            if let Some(gid) = changes.gid {
                image.gid = gid;
            }
            // Linux drops set-user-ID, and set-group-ID on group-executable files, when the owner
            // of a non-directory changes.
            if owner_changed && changes.permissions.is_none() && file_type != FileType::Directory {
                image.mode &= !0o4000;
                if image.mode & 0o010 != 0 {
                    image.mode &= !0o2000;
                }
            }
            match changes.access_time {
                Some(TimeToSet::Now) => image.access_time_ns = now,
                Some(TimeToSet::Nanoseconds(time)) => image.access_time_ns = time,
                None => {}
            }
            match changes.modify_time {
                Some(TimeToSet::Now) => image.modify_time_ns = now,
                Some(TimeToSet::Nanoseconds(time)) => image.modify_time_ns = time,
                None => {}
            }
            image.change_time_ns = now;
            let reserve = if truncate { DATA_RESERVE_BLOCKS } else { 0 };
            let op = Op::SetAttributes { inode: image.clone(), truncate };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, truncate);
            let view = front.views.get_mut(&inode).unwrap();
            if truncate {
                // Writes before the truncate are applied before it: reads wait for it anyway.
                view.forget_writes_through(lsn);
            }
            Ok(Some(view.to_attributes()))
        })
    }

    /// Creates a regular file, FIFO, socket or device node. `Exists` if the name is taken.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: InodeNumber,
        name: &[u8],
        file_type: FileType,
        permissions: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
    ) -> Result<Attributes> {
        match file_type {
            FileType::Directory => return self.make_directory(parent, name, permissions, uid, gid),
            FileType::Symlink => return Err(Error::invalid("use symlink to create a symbolic link")),
            _ => {}
        }
        self.create_node(parent, name, file_type, permissions, uid, gid, rdev, &[])
    }

    pub fn make_directory(
        &self,
        parent: InodeNumber,
        name: &[u8],
        permissions: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attributes> {
        self.create_node(parent, name, FileType::Directory, permissions, uid, gid, 0, &[])
    }

    pub fn symlink(&self, parent: InodeNumber, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attributes> {
        if target.is_empty() || target.contains(&0) {
            return Err(Error::invalid("a symbolic link target must be non-empty and without NUL bytes"));
        }
        if target.len() > SYMLINK_MAX_BYTES {
            return Err(Error::NameTooLong);
        }
        self.create_node(parent, name, FileType::Symlink, 0o777, uid, gid, 0, target)
    }

    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        parent: InodeNumber,
        name: &[u8],
        file_type: FileType,
        permissions: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
        symlink_target: &[u8],
    ) -> Result<Attributes> {
        check_name(name)?;
        if permissions & !0o7777 != 0 {
            return Err(Error::invalid(format!("mode {permissions:#o} has bits beyond 0o7777")));
        }
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            let parent_view = self.directory_view(&mut front, parent)?;
            if parent_view.attributes.link_count == 0 {
                return Err(Error::NotFound);
            }
            let mut parent_image = parent_view.attributes.clone();
            if self.find_name(&mut front, parent, name)?.is_some() {
                return Err(Error::Exists);
            }
            if file_type == FileType::Directory && parent_image.link_count >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            let reserve = NAMESPACE_RESERVE_BLOCKS;
            // No preferred number: the allocator goes on from where it last stopped.
            let number = front.inode_numbers.allocate(u64::MAX, 1, 0)?.0 + 1;
            self.inner.volume.lock().check_inode_free(number)?;
            let generation = front.next_generation;
            let now = now_ns();
            let mut mode = file_type.mode_bits() | permissions;
            let mut gid = gid;
            // A set-group-ID directory passes its group on, and its set-group-ID bit to
            // subdirectories.
            if parent_image.mode & 0o2000 != 0 {
                gid = parent_image.gid;
                if file_type == FileType::Directory {
                    mode |= 0o2000;
                }
            }
            // Only devices keep a device number (as ext4); the decoders refuse one elsewhere.
            let rdev = if matches!(file_type, FileType::CharDevice | FileType::BlockDevice) { rdev } else { 0 };
            let image = AttributeImage {
                inode_number: number,
                generation,
                mode,
                link_count: if file_type == FileType::Directory { 2 } else { 1 },
                uid,
                gid,
                size_bytes: symlink_target.len() as u64,
                access_time_ns: now,
                modify_time_ns: now,
                change_time_ns: now,
                birth_time_ns: now,
                rdev,
                parent: if file_type == FileType::Directory { parent } else { 0 },
                flags: 0,
            };
            parent_image.modify_time_ns = now;
            parent_image.change_time_ns = now;
            if file_type == FileType::Directory {
                parent_image.link_count += 1;
            }
            let op = Op::Create {
                parent: parent_image.clone(),
                name: name.to_vec(),
                inode: image.clone(),
                symlink_target: symlink_target.to_vec(),
            };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                front.inode_numbers.free_now(number - 1, 1);
                return Ok(None);
            };
            front.next_generation += 1;
            FileSystem::commit_view(&mut front, parent_image, lsn, true);
            front.views.get_mut(&parent).unwrap().entry_count += 1;
            let mut view = InodeView::new(image, 0, 0);
            view.last_change_lsn = lsn;
            view.structural_lsn = lsn;
            view.complete = file_type == FileType::Directory;
            let attributes = view.to_attributes();
            front.views.insert(number, view);
            self.overlay_name(&mut front, parent, name, Some((number, file_type)), lsn);
            Ok(Some(attributes))
        })
    }

    /// `mkdir -p` in one call: `path` is relative to the root, components separated by '/'.
    pub fn make_directory_all(&self, path: &[u8], permissions: u32, uid: u32, gid: u32) -> Result<Attributes> {
        let mut current = self.get_attributes(ROOT_INODE)?;
        for component in path.split(|byte| *byte == b'/').filter(|part| !part.is_empty() && *part != b".") {
            current = match self.lookup(current.inode, component) {
                Ok(found) if found.file_type == FileType::Directory => found,
                Ok(_) => return Err(Error::NotDirectory),
                Err(Error::NotFound) => match self.make_directory(current.inode, component, permissions, uid, gid) {
                    Ok(made) => made,
                    // Another caller made it first.
                    Err(Error::Exists) => self.lookup(current.inode, component)?,
                    Err(error) => return Err(error),
                },
                Err(error) => return Err(error),
            };
        }
        Ok(current)
    }

    pub fn read_link(&self, inode: InodeNumber) -> Result<Vec<u8>> {
        let size = {
            let mut front = self.inner.front.lock();
            let view = self.view(&mut front, inode)?;
            if view.file_type() != FileType::Symlink {
                return Err(Error::invalid("not a symbolic link"));
            }
            view.attributes.size_bytes as usize
        };
        if size > SYMLINK_MAX_BYTES {
            return Err(Error::corruption(format!("symbolic link {inode} is {size} bytes long")));
        }
        let mut target = vec![0u8; size];
        let read = self.read_data(inode, 0, &mut target, true)?;
        target.truncate(read);
        Ok(target)
    }

    pub fn link(&self, inode: InodeNumber, new_parent: InodeNumber, new_name: &[u8]) -> Result<Attributes> {
        check_name(new_name)?;
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            let view = self.view(&mut front, inode)?;
            if view.file_type() == FileType::Directory {
                return Err(Error::NotPermitted);
            }
            if view.attributes.link_count == 0 {
                return Err(Error::NotFound);
            }
            if view.attributes.link_count >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            let mut image = view.attributes.clone();
            let parent_view = self.directory_view(&mut front, new_parent)?;
            if parent_view.attributes.link_count == 0 {
                return Err(Error::NotFound);
            }
            let mut parent_image = parent_view.attributes.clone();
            if self.find_name(&mut front, new_parent, new_name)?.is_some() {
                return Err(Error::Exists);
            }
            let reserve = NAMESPACE_RESERVE_BLOCKS;
            let now = now_ns();
            image.link_count += 1;
            image.change_time_ns = now;
            parent_image.modify_time_ns = now;
            parent_image.change_time_ns = now;
            let file_type = image.file_type();
            let op = Op::Link { parent: parent_image.clone(), name: new_name.to_vec(), inode: image.clone() };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, parent_image, lsn, true);
            front.views.get_mut(&new_parent).unwrap().entry_count += 1;
            FileSystem::commit_view(&mut front, image, lsn, false);
            self.overlay_name(&mut front, new_parent, new_name, Some((inode, file_type)), lsn);
            Ok(Some(front.views[&inode].to_attributes()))
        })
    }

    pub fn unlink(&self, parent: InodeNumber, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, false)
    }

    pub fn remove_directory(&self, parent: InodeNumber, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, true)
    }

    /// What becomes of an inode whose link count dropped to `link_count`.
    fn disposition(view: &InodeView, link_count: u32) -> Disposition {
        match (link_count, view.open_count) {
            (0, 0) => Disposition::Reclaim,
            (0, _) => Disposition::Orphan,
            _ => Disposition::Keep,
        }
    }

    /// Records the fate of an inode that lost its last name.
    fn settle(front: &mut Front, number: u64, disposition: Disposition) {
        let view = front.views.get_mut(&number).unwrap();
        match disposition {
            Disposition::Keep => {}
            Disposition::Orphan => view.orphaned = true,
            Disposition::Reclaim => {
                view.reclaimed = true;
                // Records apply in log order, so a later create may reuse the number at once.
                front.inode_numbers.free_now(number - 1, 1);
            }
        }
    }

    fn remove_name(&self, parent: InodeNumber, name: &[u8], directory: bool) -> Result<()> {
        if name == b"." {
            return Err(Error::invalid("cannot remove \".\""));
        }
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        check_name(name)?;
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            let mut parent_image = self.directory_view(&mut front, parent)?.attributes.clone();
            let (number, file_type) = self.find_name(&mut front, parent, name)?.ok_or(Error::NotFound)?;
            let view = self.view(&mut front, number)?;
            match (directory, file_type == FileType::Directory) {
                (false, true) => return Err(Error::IsDirectory),
                (true, false) => return Err(Error::NotDirectory),
                (true, true) if view.entry_count > 0 => return Err(Error::NotEmpty),
                _ => {}
            }
            let mut image = view.attributes.clone();
            let now = now_ns();
            image.link_count = if directory { 0 } else { image.link_count.saturating_sub(1) };
            image.change_time_ns = now;
            let disposition = FileSystem::disposition(view, image.link_count);
            parent_image.modify_time_ns = now;
            parent_image.change_time_ns = now;
            if directory {
                parent_image.link_count -= 1;
            }
            let op =
                Op::Unlink { parent: parent_image.clone(), name: name.to_vec(), inode: image.clone(), disposition };
            let Some(lsn) = self.append(&mut front, op, 0)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, parent_image, lsn, true);
            front.views.get_mut(&parent).unwrap().entry_count -= 1;
            FileSystem::commit_view(&mut front, image, lsn, false);
            FileSystem::settle(&mut front, number, disposition);
            self.overlay_name(&mut front, parent, name, None, lsn);
            Ok(Some(()))
        })
    }

    /// True when `ancestor` is `directory` or one of its ancestors.
    fn is_ancestor(&self, front: &mut Front, ancestor: u64, directory: u64) -> Result<bool> {
        let mut current = directory;
        for _ in 0..DEPTH_WALK_MAX {
            if current == ancestor {
                return Ok(true);
            }
            if current == ROOT_INODE {
                return Ok(false);
            }
            current = self.view(front, current)?.attributes.parent;
        }
        Err(Error::corruption("directory parent chain does not reach the root"))
    }

    pub fn rename(
        &self,
        parent: InodeNumber,
        name: &[u8],
        new_parent: InodeNumber,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        check_name(name)?;
        check_name(new_name)?;
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            self.directory_view(&mut front, parent)?;
            if self.directory_view(&mut front, new_parent)?.attributes.link_count == 0 {
                return Err(Error::NotFound);
            }
            let (source, source_type) = self.find_name(&mut front, parent, name)?.ok_or(Error::NotFound)?;
            let target = self.find_name(&mut front, new_parent, new_name)?;
            if parent == new_parent && name == new_name {
                return if mode == RenameMode::Exchange || mode == RenameMode::Replace {
                    Ok(Some(()))
                } else {
                    Err(Error::Exists)
                };
            }
            match (mode, target) {
                (RenameMode::Exchange, None) => return Err(Error::NotFound),
                (RenameMode::NoReplace, Some(_)) => return Err(Error::Exists),
                _ => {}
            }
            if let Some((target_number, _)) = target {
                if target_number == source && mode == RenameMode::Replace {
                    // Two names of one inode: POSIX says rename does nothing.
                    return Ok(Some(()));
                }
            }
            let source_is_dir = source_type == FileType::Directory;
            if source_is_dir && parent != new_parent && self.is_ancestor(&mut front, source, new_parent)? {
                return Err(Error::invalid("cannot move a directory into itself"));
            }
            let now = now_ns();
            // Working copies of every inode involved; several may be the same inode.
            let mut images: Vec<AttributeImage> = Vec::new();
            let image_of = |front: &mut Front, number: u64, images: &mut Vec<AttributeImage>| -> Result<usize> {
                if let Some(index) = images.iter().position(|image| image.inode_number == number) {
                    return Ok(index);
                }
                images.push(self.view(front, number)?.attributes.clone());
                Ok(images.len() - 1)
            };
            let parent_index = image_of(&mut front, parent, &mut images)?;
            let new_parent_index = image_of(&mut front, new_parent, &mut images)?;
            let source_index = image_of(&mut front, source, &mut images)?;
            for index in [parent_index, new_parent_index] {
                images[index].modify_time_ns = now;
                images[index].change_time_ns = now;
            }
            images[source_index].change_time_ns = now;
            let mut replaced = None;
            let kind;
            let mut entry_delta_parent: i64 = 0;
            let mut entry_delta_new_parent: i64 = 0;
            match (mode, target) {
                (RenameMode::Exchange, Some((other, other_type))) => {
                    kind = RenameKind::Exchange;
                    let other_is_dir = other_type == FileType::Directory;
                    if other_is_dir && parent != new_parent && self.is_ancestor(&mut front, other, parent)? {
                        return Err(Error::invalid("cannot move a directory into itself"));
                    }
                    let other_index = image_of(&mut front, other, &mut images)?;
                    images[other_index].change_time_ns = now;
                    if parent != new_parent {
                        if source_is_dir {
                            images[source_index].parent = new_parent;
                            images[parent_index].link_count -= 1;
                            images[new_parent_index].link_count += 1;
                        }
                        if other_is_dir {
                            images[other_index].parent = parent;
                            images[new_parent_index].link_count -= 1;
                            images[parent_index].link_count += 1;
                        }
                    }
                }
                (_, target) => {
                    kind = RenameKind::Move;
                    entry_delta_parent -= 1;
                    entry_delta_new_parent += 1;
                    if let Some((other, other_type)) = target {
                        let other_is_dir = other_type == FileType::Directory;
                        let other_view = self.view(&mut front, other)?;
                        match (source_is_dir, other_is_dir) {
                            (true, false) => return Err(Error::NotDirectory),
                            (false, true) => return Err(Error::IsDirectory),
                            (true, true) if other_view.entry_count > 0 => return Err(Error::NotEmpty),
                            _ => {}
                        }
                        let other_index = image_of(&mut front, other, &mut images)?;
                        let link_count = if other_is_dir { 0 } else { images[other_index].link_count - 1 };
                        images[other_index].link_count = link_count;
                        images[other_index].change_time_ns = now;
                        if other_is_dir {
                            images[new_parent_index].link_count -= 1;
                        }
                        let disposition = FileSystem::disposition(&front.views[&other], link_count);
                        replaced = Some((other, disposition));
                        entry_delta_new_parent -= 1;
                    }
                    if source_is_dir && parent != new_parent {
                        images[source_index].parent = new_parent;
                        images[parent_index].link_count -= 1;
                        images[new_parent_index].link_count += 1;
                    }
                }
            }
            // A directory moved in adds a link to its new parent: refused at the limit, as
            // make_directory is (EMLINK).
            if parent != new_parent && images[new_parent_index].link_count > LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            let reserve = NAMESPACE_RESERVE_BLOCKS;
            let op = Op::Rename {
                parent,
                name: name.to_vec(),
                new_parent,
                new_name: new_name.to_vec(),
                kind,
                replaced,
                images: images.clone(),
            };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            for image in images {
                let number = image.inode_number;
                let structural = number == parent || number == new_parent;
                FileSystem::commit_view(&mut front, image, lsn, structural);
            }
            let adjust = |view: &mut InodeView, delta: i64| view.entry_count = (view.entry_count as i64 + delta) as u64;
            adjust(front.views.get_mut(&parent).unwrap(), entry_delta_parent);
            adjust(front.views.get_mut(&new_parent).unwrap(), entry_delta_new_parent);
            if let Some((other, disposition)) = replaced {
                FileSystem::settle(&mut front, other, disposition);
            }
            match (kind, target) {
                (RenameKind::Exchange, Some(other)) => self.overlay_name(&mut front, parent, name, Some(other), lsn),
                _ => self.overlay_name(&mut front, parent, name, None, lsn),
            }
            self.overlay_name(&mut front, new_parent, new_name, Some((source, source_type)), lsn);
            Ok(Some(()))
        })
    }

    /// Resolves a '/'-separated path from the root, following symbolic links in all but the
    /// last component.
    pub fn resolve_path(&self, path: &[u8]) -> Result<Attributes> {
        let mut pending: Vec<Vec<u8>> =
            path.split(|byte| *byte == b'/').filter(|part| !part.is_empty()).map(|part| part.to_vec()).rev().collect();
        let mut current = self.get_attributes(ROOT_INODE)?;
        let mut followed = 0usize;
        while let Some(component) = pending.pop() {
            if current.file_type != FileType::Directory {
                return Err(Error::NotDirectory);
            }
            let next = self.lookup(current.inode, &component)?;
            if next.file_type == FileType::Symlink && !pending.is_empty() {
                followed += 1;
                if followed > SYMLINK_FOLLOW_MAX {
                    return Err(Error::Loop);
                }
                let target = self.read_link(next.inode)?;
                if target.first() == Some(&b'/') {
                    current = self.get_attributes(ROOT_INODE)?;
                }
                pending.extend(
                    target.split(|byte| *byte == b'/').filter(|part| !part.is_empty()).map(|part| part.to_vec()).rev(),
                );
                continue;
            }
            current = next;
        }
        Ok(current)
    }

    // ------------------------------------------------------------------ data

    /// Reads up to `buffer.len()` bytes at `offset`; returns bytes read (short at end of file).
    pub fn read(&self, inode: InodeNumber, offset: u64, buffer: &mut [u8]) -> Result<usize> {
        self.read_data(inode, offset, buffer, false)
    }

    fn read_data(&self, inode: InodeNumber, offset: u64, buffer: &mut [u8], allow_symlink: bool) -> Result<usize> {
        for attempt in 0..=READ_ATTEMPTS_MAX {
            // The last attempt holds the front end still so that no change can race it.
            let hold = attempt == READ_ATTEMPTS_MAX;
            let mut front = self.inner.front.lock();
            let view = self.view(&mut front, inode)?;
            match view.file_type() {
                FileType::Regular => {}
                FileType::Symlink if allow_symlink => {}
                FileType::Directory => return Err(Error::IsDirectory),
                _ => return Err(Error::invalid("not a regular file")),
            }
            let size = view.attributes.size_bytes;
            let structural = view.structural_lsn;
            let counter = view.change_counter;
            if structural > self.applied() {
                drop(front);
                self.wait_applied(structural)?;
                continue;
            }
            if offset >= size || buffer.is_empty() {
                return Ok(0);
            }
            let length = (buffer.len() as u64).min(size - offset) as usize;
            let pending: Vec<(u64, Arc<[u8]>)> = view
                .pending_writes
                .iter()
                .filter(|write| write.lsn > structural)
                .filter(|write| {
                    write.offset < offset + length as u64 && write.offset + write.data.len() as u64 > offset
                })
                .map(|write| (write.offset, write.data.clone()))
                .collect();
            let guard = if hold {
                Some(front)
            } else {
                drop(front);
                None
            };
            let target = &mut buffer[..length];
            {
                let mut volume = self.inner.volume.lock();
                let home = volume.read_inode(inode)?;
                let root = ExtentRoot::decode(&home.root_area)?;
                let read = extent::read(&mut *volume, &root, offset, target)?;
                target[read..].fill(0);
            }
            for (write_offset, data) in pending {
                let start = write_offset.max(offset);
                let end = (write_offset + data.len() as u64).min(offset + length as u64);
                target[(start - offset) as usize..(end - offset) as usize]
                    .copy_from_slice(&data[(start - write_offset) as usize..(end - write_offset) as usize]);
            }
            if hold {
                drop(guard);
                return Ok(length);
            }
            let front = self.inner.front.lock();
            if front.views.get(&inode).is_some_and(|view| view.change_counter == counter) {
                return Ok(length);
            }
        }
        unreachable!("the last attempt always returns")
    }

    pub fn write(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > MAX_FILE_BYTES) {
            return Err(Error::FileTooLarge);
        }
        let mut done = 0usize;
        match self.write_records(inode, offset, data, &mut done) {
            Ok(()) => Ok(done),
            // Earlier records are committed: report a short write, as write(2) does, so the
            // caller knows those bytes are in the file; its next write gets the error.
            Err(_) if done > 0 => Ok(done),
            Err(error) => Err(error),
        }
    }

    /// Writes `data` as one or more log records, counting in `done` the bytes committed
    /// before an error.
    fn write_records(&self, inode: InodeNumber, offset: u64, data: &[u8], done: &mut usize) -> Result<()> {
        for chunk in data.chunks(self.inner.max_record_data_bytes) {
            self.write_record(inode, offset + *done as u64, chunk)?;
            *done += chunk.len();
        }
        Ok(())
    }

    fn write_record(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<()> {
        let shared: Arc<[u8]> = Arc::from(data);
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            let view = self.regular_view(&mut front, inode)?;
            let mut image = view.attributes.clone();
            let now = now_ns();
            image.size_bytes = image.size_bytes.max(offset + data.len() as u64);
            image.modify_time_ns = now;
            image.change_time_ns = now;
            let reserve = (data.len() as u64).div_ceil(BLOCK_SIZE_U64) + DATA_RESERVE_BLOCKS;
            let op = Op::Write { inode: image.clone(), offset, data: shared.clone() };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, false);
            front.views.get_mut(&inode).unwrap().pending_writes.push_back(PendingWrite {
                lsn,
                offset,
                data: shared.clone(),
            });
            Ok(Some(()))
        })
    }

    fn range_operation(
        &self,
        inode: InodeNumber,
        kind: RangeKind,
        offset: u64,
        length: u64,
        keep_size: bool,
    ) -> Result<()> {
        if length == 0 {
            return Err(Error::invalid("range length must not be zero"));
        }
        let end = offset.checked_add(length).ok_or(Error::FileTooLarge)?;
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            let view = self.regular_view(&mut front, inode)?;
            let mut image = view.attributes.clone();
            let size = image.size_bytes;
            let new_size = match kind {
                RangeKind::Insert => {
                    if offset > size {
                        return Err(Error::invalid(format!(
                            "insert at {offset} lies beyond the end of the file ({size})"
                        )));
                    }
                    size.checked_add(length).filter(|size| *size <= MAX_FILE_BYTES).ok_or(Error::FileTooLarge)?
                }
                RangeKind::Collapse => {
                    if end > size {
                        return Err(Error::invalid(format!(
                            "collapse of {length} bytes at {offset} runs past the end of the file ({size})"
                        )));
                    }
                    size - length
                }
                RangeKind::PunchHole => size,
                RangeKind::ZeroRange | RangeKind::Allocate => {
                    if end > MAX_FILE_BYTES {
                        return Err(Error::FileTooLarge);
                    }
                    if keep_size {
                        size
                    } else {
                        size.max(end)
                    }
                }
            };
            if kind == RangeKind::PunchHole && offset >= size {
                return Ok(Some(()));
            }
            let now = now_ns();
            image.size_bytes = new_size;
            image.modify_time_ns = now;
            image.change_time_ns = now;
            let reserve = match kind {
                RangeKind::Allocate => length.div_ceil(BLOCK_SIZE_U64) + DATA_RESERVE_BLOCKS,
                _ => DATA_RESERVE_BLOCKS,
            };
            let op = Op::Range { inode: image.clone(), kind, offset, length, keep_size };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, true);
            front.views.get_mut(&inode).unwrap().forget_writes_through(lsn);
            Ok(Some(()))
        })
    }

    /// Inserts `length` bytes of hole at `offset` (≤ size), shifting later bytes up.
    pub fn insert_range(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        self.range_operation(inode, RangeKind::Insert, offset, length, false)
    }

    /// Inserts `data` at `offset` (≤ size), shifting later bytes up.
    pub fn insert(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.insert_range(inode, offset, data.len() as u64)?;
        // Not `write`: a short write would leave zeros in the inserted range and report success.
        self.write_records(inode, offset, data, &mut 0)
    }

    /// Removes `length` bytes at `offset` (offset + length ≤ size), shifting later bytes down.
    pub fn collapse_range(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        self.range_operation(inode, RangeKind::Collapse, offset, length, false)
    }

    pub fn punch_hole(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        self.range_operation(inode, RangeKind::PunchHole, offset, length, true)
    }

    pub fn zero_range(&self, inode: InodeNumber, offset: u64, length: u64, keep_size: bool) -> Result<()> {
        self.range_operation(inode, RangeKind::ZeroRange, offset, length, keep_size)
    }

    /// fallocate mode 0 / KEEP_SIZE: reserves space that reads as zeros.
    pub fn allocate(&self, inode: InodeNumber, offset: u64, length: u64, keep_size: bool) -> Result<()> {
        self.range_operation(inode, RangeKind::Allocate, offset, length, keep_size)
    }

    // ------------------------------------------------------------------ directories

    /// Lists entries after `after_cookie` (0 starts; "." has cookie 1, ".." cookie 2) until
    /// `visit` returns false.
    pub fn read_directory(
        &self,
        inode: InodeNumber,
        after_cookie: u64,
        visit: &mut dyn FnMut(&DirectoryEntry) -> bool,
    ) -> Result<()> {
        let (structural, parent) = {
            let mut front = self.inner.front.lock();
            let view = self.directory_view(&mut front, inode)?;
            (view.structural_lsn, view.attributes.parent)
        };
        self.wait_applied(structural)?;
        if after_cookie < 1
            && !visit(&DirectoryEntry { name: b".".to_vec(), inode, file_type: FileType::Directory, cookie: 1 })
        {
            return Ok(());
        }
        if after_cookie < 2
            && !visit(&DirectoryEntry {
                name: b"..".to_vec(),
                inode: parent,
                file_type: FileType::Directory,
                cookie: 2,
            })
        {
            return Ok(());
        }
        let mut volume = self.inner.volume.lock();
        let home = volume.read_inode(inode)?;
        let root = DirRoot::decode(&home.root_area)?;
        let mut failure = None;
        let seed = self.inner.applier.hash_seed;
        dir::readdir(&mut *volume, &root, &seed, after_cookie.max(2), &mut |entry| {
            let Some(file_type) = FileType::from_dirent_type(entry.file_type) else {
                failure =
                    Some(Error::corruption(format!("directory {inode}: entry type {} is unknown", entry.file_type)));
                return false;
            };
            visit(&DirectoryEntry { name: entry.name.clone(), inode: entry.inode, file_type, cookie: entry.cookie })
        })?;
        failure.map_or(Ok(()), Err)
    }

    // ------------------------------------------------------------------ volume

    pub fn statistics(&self) -> Result<VolumeStatistics> {
        let front = self.inner.front.lock();
        let volume = self.inner.volume.lock();
        Ok(VolumeStatistics {
            block_size_bytes: BLOCK_SIZE_U64 as u32,
            blocks_total: volume.superblock.block_count,
            // Freed blocks wait for a checkpoint before reuse, but they are free: `df` after `rm`
            // should say so at once.
            blocks_free: (front.free_blocks + front.pending_free_blocks).saturating_sub(front.reserved_blocks),
            inodes_total: self.inner.inode_count,
            inodes_free: front.inode_numbers.free_count(),
            name_max_bytes: NAME_MAX_BYTES as u32,
        })
    }

    pub fn log_statistics(&self) -> LogStatistics {
        let usage = self.inner.log.usage();
        let checkpoint_lsn = self.inner.volume.lock().superblock.checkpoint_lsn;
        LogStatistics {
            header_slots: usage.header_slots_capacity,
            data_bytes: usage.data_bytes_capacity,
            records_since_checkpoint: usage.header_slots_used,
            data_bytes_since_checkpoint: usage.data_bytes_used,
            next_lsn: self.inner.log.next_lsn(),
            durable_lsn: self.inner.log.durable_lsn(),
            applied_lsn: self.applied(),
            checkpoint_lsn,
            checkpoints: self.inner.checkpoints.load(Ordering::Relaxed),
        }
    }

    // ------------------------------------------------------------------ extended attributes

    fn load_xattrs(&self, front: &mut Front, inode: InodeNumber) -> Result<()> {
        let view = self.view(front, inode)?;
        let generation = view.attributes.generation;
        if view.xattrs.is_none() {
            let mut volume = self.inner.volume.lock();
            // A new inode whose creation is not applied has no attributes yet.
            let attributes = match FileSystem::home_inode(&mut volume, inode, generation)? {
                Some(home) => volume.read_xattrs(home.xattr_block)?,
                None => Default::default(),
            };
            drop(volume);
            front.views.get_mut(&inode).unwrap().xattrs = Some(attributes);
        }
        Ok(())
    }

    fn check_xattr_name(name: &[u8]) -> Result<()> {
        if name.is_empty() || name.contains(&0) {
            return Err(Error::invalid("extended attribute names are non-empty and without NUL"));
        }
        if name.len() > XATTR_NAME_MAX_BYTES {
            return Err(Error::Range);
        }
        // The namespaces Linux file systems store, as ext4 does: another prefix, or a name
        // without one, is EOPNOTSUPP, and a namespace without a name is EINVAL. (`system.`
        // holds POSIX ACLs, which tandemfs does not implement.) The kernel's FUSE client passes
        // every name through, so the check has to be here.
        let Some(suffix) = XATTR_NAMESPACES.iter().find_map(|prefix| name.strip_prefix(*prefix)) else {
            return Err(Error::NotSupported);
        };
        if suffix.is_empty() {
            return Err(Error::invalid("an extended attribute name needs a name after its namespace"));
        }
        Ok(())
    }

    pub fn set_xattr(&self, inode: InodeNumber, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        FileSystem::check_xattr_name(name)?;
        if value.len() > XATTR_VALUE_MAX_BYTES {
            return Err(Error::NoSpace);
        }
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            self.load_xattrs(&mut front, inode)?;
            let view = front.views.get_mut(&inode).unwrap();
            let attributes = view.xattrs.as_ref().unwrap();
            match (mode, attributes.contains_key(name)) {
                (XattrMode::Create, true) => return Err(Error::Exists),
                (XattrMode::Replace, false) => return Err(Error::NoData),
                _ => {}
            }
            let mut updated = attributes.clone();
            updated.insert(name.to_vec(), value.to_vec());
            if Volume::xattr_encoded_bytes(&updated) > XATTR_BLOCK_PAYLOAD_BYTES {
                return Err(Error::NoSpace);
            }
            let mut image = view.attributes.clone();
            image.change_time_ns = now_ns();
            let reserve = 1;
            let op = Op::SetXattr { inode: image.clone(), name: name.to_vec(), value: value.to_vec() };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, false);
            front.views.get_mut(&inode).unwrap().xattrs = Some(updated);
            Ok(Some(()))
        })
    }

    pub fn get_xattr(&self, inode: InodeNumber, name: &[u8]) -> Result<Vec<u8>> {
        FileSystem::check_xattr_name(name)?;
        let mut front = self.inner.front.lock();
        self.load_xattrs(&mut front, inode)?;
        front.views[&inode].xattrs.as_ref().unwrap().get(name).cloned().ok_or(Error::NoData)
    }

    pub fn list_xattr(&self, inode: InodeNumber) -> Result<Vec<Vec<u8>>> {
        let mut front = self.inner.front.lock();
        self.load_xattrs(&mut front, inode)?;
        Ok(front.views[&inode].xattrs.as_ref().unwrap().keys().cloned().collect())
    }

    pub fn remove_xattr(&self, inode: InodeNumber, name: &[u8]) -> Result<()> {
        FileSystem::check_xattr_name(name)?;
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            self.load_xattrs(&mut front, inode)?;
            let view = front.views.get_mut(&inode).unwrap();
            if !view.xattrs.as_ref().unwrap().contains_key(name) {
                return Err(Error::NoData);
            }
            let mut image = view.attributes.clone();
            image.change_time_ns = now_ns();
            let op = Op::RemoveXattr { inode: image.clone(), name: name.to_vec() };
            let Some(lsn) = self.append(&mut front, op, 0)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, false);
            front.views.get_mut(&inode).unwrap().xattrs.as_mut().unwrap().remove(name);
            Ok(Some(()))
        })
    }

    // ------------------------------------------------------------------ durability and lifetime

    /// Returns once every change to `inode` made before the call is durable.
    pub fn fsync(&self, inode: InodeNumber, _data_only: bool) -> Result<()> {
        self.check_running()?;
        let lsn = {
            let mut front = self.inner.front.lock();
            self.view(&mut front, inode)?.last_change_lsn
        };
        if lsn > 0 {
            self.inner.log.wait_durable(lsn)?;
        }
        Ok(())
    }

    /// Returns once every change made before the call is durable.
    pub fn sync(&self) -> Result<()> {
        self.check_running()?;
        self.inner.log.flush()?;
        Ok(())
    }

    /// Keeps an inode alive while open even if its last name is unlinked.
    pub fn open_inode(&self, inode: InodeNumber) -> Result<()> {
        let mut front = self.inner.front.lock();
        let view = self.view(&mut front, inode)?;
        view.open_count = view.open_count.checked_add(1).ok_or(Error::Busy)?;
        Ok(())
    }

    /// Ends one `open_inode`; an unlinked inode is reclaimed after its last release.
    pub fn release_inode(&self, inode: InodeNumber) -> Result<()> {
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            let view = self.view(&mut front, inode)?;
            if view.open_count == 0 {
                return Err(Error::invalid(format!("inode {inode} released more often than opened")));
            }
            if view.open_count > 1 || !view.orphaned {
                view.open_count -= 1;
                return Ok(Some(()));
            }
            let Some(lsn) = self.append(&mut front, Op::Reclaim { inode_number: inode }, 0)? else {
                return Ok(None);
            };
            let view = front.views.get_mut(&inode).unwrap();
            view.open_count = 0;
            view.orphaned = false;
            view.last_change_lsn = lsn;
            FileSystem::settle(&mut front, inode, Disposition::Reclaim);
            Ok(Some(()))
        })
    }
}
