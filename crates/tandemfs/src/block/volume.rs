//! `Volume`: the back end's view of the device. It owns the superblock, both bitmaps, the
//! metadata cache and the inode table, and implements `MetaStore` and `DataStore` for the
//! directory and extent structures. Changes stay in memory until a checkpoint takes their images.

use super::bitmap::Bitmap;
use super::cache::BlockCache;
use super::codec::{get_u32, get_u64, put_u32, put_u64};
use super::inode::{Inode, INODE_BYTES};
use super::meta::*;
use super::mirror::{HomeGeometry, HomeMirror};
use super::superblock::{generation_table_levels, Superblock, GENERATIONS_PER_TABLE_BLOCK, INODES_PER_BLOCK};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::fs::types::FileType;
use std::collections::BTreeMap;
use std::sync::Arc;
use tandem_accel::runtime::Accelerator;

mod checksums;
pub use checksums::{
    checksum_entry, checksum_matches, default_accelerator, ChecksumMismatch, DataChecksumStatistics, NO_CHECKSUM,
};

/// Largest total size of one inode's extended attributes (names, values and their lengths).
pub const XATTR_BLOCK_PAYLOAD_BYTES: usize = META_PAYLOAD_BYTES;

/// The namespaces an extended attribute name may have (the front end admits no others).
pub const XATTR_NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// A name the front end admits: a known namespace and a non-empty name after it, no NUL.
pub fn xattr_name_is_valid(name: &[u8]) -> bool {
    !name.contains(&0)
        && name.len() <= crate::fs::types::XATTR_NAME_MAX_BYTES
        && XATTR_NAMESPACES.iter().any(|prefix| name.strip_prefix(*prefix).is_some_and(|rest| !rest.is_empty()))
}

pub struct Volume {
    pub device: Arc<dyn Device>,
    pub superblock: Superblock,
    pub blocks: Bitmap,
    /// Applied inode allocation: bit `n - 1` is inode `n`.
    pub inodes: Bitmap,
    cache: BlockCache,
    /// The record being applied; frees are tagged with it.
    pub current_lsn: u64,
    /// Set at load when the bitmaps disagree with the superblock's free counts.
    pub bitmap_disagreement: Option<String>,
    /// The generation table's levels (`superblock::generation_table_levels`), lowest first.
    table_levels: Vec<(u64, u64)>,
    /// Metadata blocks freed since the last checkpoint's images: it records generation 0 for
    /// them, so that the table names only blocks that hold metadata (see `check_allocated_unused`).
    freed_metadata: Vec<u64>,
    /// Runs of data blocks handed out since the last checkpoint's images: it records
    /// `GENERATION_DATA` for them. A free leaves a data block's entry as it is (format
    /// version 6), so that freeing a file costs its bitmap blocks alone.
    data_handed_out: Vec<(u64, u64)>,
    /// Level-0 generation-table blocks that `data_handed_out` may touch: per run, one per table
    /// block it spans plus one (it may start and end in part of one).
    data_handed_out_table_blocks: u64,
    /// Where `publish_image_estimate` stores its count, when the log's pledge reads it.
    image_gauge: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// Computes the data checksums (`checksums`): the GPU for large batches when present.
    /// Taken at the first checksum, so that a volume that never touches data (mkfs, stat)
    /// never starts the runtime (on a GPU host: the driver and a calibration).
    accelerator: Option<Arc<Accelerator>>,
    /// The log is being replayed: see `set_replaying`.
    replaying: bool,
    checksum_statistics: DataChecksumStatistics,
    /// The data blocks partially written last (`checksums::RecentBlocks`).
    recent_blocks: checksums::RecentBlocks,
    /// Where each file packs its small runs (`DataStore::pack_room`): memory only.
    pack_rooms: PackRooms,
    /// Decoded forms of metadata blocks (`MetaStore::decoded`: extent nodes), each with the
    /// buffer it was decoded from, which therefore cannot change in place or be reused.
    decoded: crate::FastHashMap<u64, (SharedBlock, Decoded)>,
    /// Why a change made with the volume held failed half way, if one did: the cached blocks
    /// and inodes may then hold part of a record, so nothing may read them again
    /// (`check_whole`). Set before the lock is let go, so no reader sees the half.
    half_changed: Option<String>,
    /// `half_changed` as a flag others read without the lock: the back end refuses every
    /// change from the moment a half change is marked, not only once it latches the failure
    /// (a reader refused by `check_whole` must never see a later change acknowledged).
    half_changed_flag: Arc<std::sync::atomic::AtomicBool>,
}

/// `Volume::check_inode_contents` for a volume of this geometry: for readers without the
/// volume lock (`block::mirror`).
pub fn check_inode_contents_within(first_data_block: u64, block_count: u64, inode: &Inode) -> Result<()> {
    let number = inode.inode_number;
    let fail = |what: String| Err(Error::corruption(format!("inode {number}: {what}")));
    match inode.file_type() {
        FileType::Regular | FileType::Symlink => {
            let root = crate::extent::ExtentRoot::decode(&inode.root_area)?;
            if root.length_bytes() != inode.size_bytes {
                return fail(format!(
                    "size {} but its extent tree maps {} bytes",
                    inode.size_bytes,
                    root.length_bytes()
                ));
            }
            if inode.file_type() == FileType::Symlink && !(1..=4095).contains(&inode.size_bytes) {
                return fail(format!("symbolic link of {} bytes", inode.size_bytes));
            }
            // What the inode says it owns is its tree's blocks and its attribute block: a
            // lost attribute pointer (or a changed tree count) shows here, where nothing
            // else would tell the attributes are missing.
            let owned = root.blocks_owned() + u64::from(inode.xattr_block != 0);
            if inode.blocks_owned != owned {
                return fail(format!(
                    "owns {} blocks but its extent tree and attribute block account for {owned}",
                    inode.blocks_owned
                ));
            }
        }
        FileType::Directory => {}
        _ => {
            if inode.size_bytes != 0 || inode.root_area.iter().any(|byte| *byte != 0) {
                return fail("a special file with a size or a root area".into());
            }
        }
    }
    let is_device = matches!(inode.file_type(), FileType::CharDevice | FileType::BlockDevice);
    if !is_device && inode.rdev != 0 {
        return fail(format!("device number {:#x} on a file that is not a device", inode.rdev));
    }
    let data_region = first_data_block..block_count;
    if inode.xattr_block != 0 && !data_region.contains(&inode.xattr_block) {
        return fail(format!("xattr block {} lies outside the data region", inode.xattr_block));
    }
    Ok(())
}

/// One block image of a checkpoint, sealed and ready to write. Shared with the block cache
/// until the block changes again (which copies it), so taking images copies nothing.
pub struct Image {
    pub block_number: u64,
    pub block: SharedBlock,
}

impl Volume {
    /// A volume whose bitmaps have not been read: for mkfs, which then marks the fixed regions.
    pub fn new_empty(device: Arc<dyn Device>, superblock: Superblock, cache_blocks: usize) -> Volume {
        let mut blocks = Bitmap::new(superblock.block_count, BlockKind::BlockBitmap);
        // On an erasure-coded array metadata blocks lie apart from file data, so that a
        // checkpoint's images fill stripes (docs/RAID.md, *Metadata apart from file data*).
        blocks.set_metadata_zone(device.stripe_bytes().is_some());
        let inodes = Bitmap::new(superblock.inode_count, BlockKind::InodeBitmap);
        let table_levels = generation_table_levels(superblock.block_count);
        let geometry = HomeGeometry {
            inode_table_start: superblock.inode_table_start,
            inode_count: superblock.inode_count,
            first_data_block: superblock.first_data_block,
            block_count: superblock.block_count,
        };
        let mirror = Arc::new(HomeMirror::new(cache_blocks, geometry));
        Volume {
            device,
            superblock,
            blocks,
            inodes,
            cache: BlockCache::with_mirror(cache_blocks, mirror),
            current_lsn: 0,
            bitmap_disagreement: None,
            table_levels,
            freed_metadata: Vec::new(),
            data_handed_out: Vec::new(),
            data_handed_out_table_blocks: 0,
            image_gauge: None,
            accelerator: None,
            replaying: false,
            checksum_statistics: DataChecksumStatistics::default(),
            recent_blocks: checksums::RecentBlocks::default(),
            pack_rooms: PackRooms::default(),
            decoded: crate::FastHashMap::default(),
            half_changed: None,
            half_changed_flag: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    /// Records that a change failed with part of it made (the first reason is kept): from now
    /// on `check_whole` refuses every reader. Call it before letting go of the volume lock.
    pub fn mark_half_changed(&mut self, error: &Error) {
        if self.half_changed.is_none() {
            self.half_changed = Some(error.to_string());
        }
        self.half_changed_flag.store(true, std::sync::atomic::Ordering::Release);
        // Readers of the mirror check it after their reads, so none keeps an answer read
        // after this point (blocks the change did not touch included).
        self.cache.mirror().poison();
    }

    /// Set once a change failed half way (`mark_half_changed`), read without the volume lock.
    pub fn half_changed_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.half_changed_flag.clone()
    }

    /// The blocks lookups read without the volume lock (`block::mirror`).
    pub fn home_mirror(&self) -> Arc<HomeMirror> {
        self.cache.mirror().clone()
    }

    /// The changes made in this hold of the volume lock are whole: readers of the mirror may
    /// trust it again. Called just before the lock is let go (`TimedVolume` does it when it
    /// drops). A half-changed volume keeps its changed stripes odd for good and the mirror
    /// poisoned, so that every reader comes to the lock and gets `Shutdown` there.
    pub fn end_change(&mut self) {
        if self.half_changed.is_none() {
            self.cache.end_change();
        }
    }

    /// Block `block_number` of a mirrored kind read as the volume holds it now (the cache, or
    /// the device, checked), and mirrored: a miss of a reader of the mirror, under the lock.
    pub fn read_for_mirror(&mut self, block_number: u64, kind: BlockKind) -> Result<SharedBlock> {
        self.check_whole()?;
        let block = match kind {
            BlockKind::InodeTable => self.read_inode_table_block(block_number)?,
            _ => self.read_meta(block_number, kind)?,
        };
        self.cache.mirror().insert(block_number, kind, block.clone());
        Ok(block)
    }

    /// `Shutdown` once a change failed half way (`mark_half_changed`): what the volume holds
    /// in memory may be part of a record, and answering from it could be wrong.
    pub fn check_whole(&self) -> Result<()> {
        match self.half_changed {
            None => Ok(()),
            Some(_) => Err(Error::Shutdown),
        }
    }

    /// Loads the bitmaps of a formatted volume.
    pub fn load(device: Arc<dyn Device>, superblock: Superblock, cache_blocks: usize) -> Result<Volume> {
        let mut volume = Volume::new_empty(device, superblock, cache_blocks);
        let superblock = volume.superblock.clone();
        for (start, count, kind) in [
            (superblock.block_bitmap_start, superblock.block_bitmap_blocks, BlockKind::BlockBitmap),
            (superblock.inode_bitmap_start, superblock.inode_bitmap_blocks, BlockKind::InodeBitmap),
        ] {
            // Read the region in large pieces: bitmaps of big volumes span thousands of blocks.
            let chunk_blocks = 256u64;
            let mut index = 0;
            while index < count {
                let blocks = chunk_blocks.min(count - index);
                let mut buffer = vec![0u8; (blocks * BLOCK_SIZE_U64) as usize];
                volume.device.read_at((start + index) * BLOCK_SIZE_U64, &mut buffer)?;
                for offset in 0..blocks {
                    let bytes: &[u8; BLOCK_SIZE] =
                        buffer[(offset as usize) * BLOCK_SIZE..(offset as usize + 1) * BLOCK_SIZE].try_into().unwrap();
                    verify_block(bytes, kind, start + index + offset)?;
                    let expected = volume.expected_generation(0, start + index + offset)?;
                    verify_generation(bytes, kind, start + index + offset, expected)?;
                    let bitmap = if kind == BlockKind::BlockBitmap { &mut volume.blocks } else { &mut volume.inodes };
                    bitmap.decode_block(index + offset, bytes)?;
                }
                index += blocks;
            }
        }
        for block in 0..superblock.first_data_block {
            if !volume.blocks.is_set(block) {
                return Err(Error::corruption(format!("block bitmap: fixed-region block {block} is marked free")));
            }
        }
        volume.bitmap_disagreement = volume.compare_free_counts();
        Ok(volume)
    }

    /// Refuses to hand out anything from bitmaps known to disagree with the superblock (see
    /// `compare_free_counts`). Mount calls this; fsck reports the disagreement and goes on, so
    /// that a repair can rebuild the bitmaps.
    pub fn check_bitmaps_trusted(&self) -> Result<()> {
        match &self.bitmap_disagreement {
            Some(what) => Err(Error::corruption(what.clone())),
            None => Ok(()),
        }
    }

    /// Allocation never trusts a bitmap alone. The superblock's free counts were computed from
    /// the very bitmaps the checkpoint it records wrote home (bitmaps reach home only through
    /// checkpoints), so a bitmap block that lost a write, or a bit changed behind a valid
    /// checksum, shows as a count that disagrees; handing out such a bit could overwrite a live
    /// file. (Mount completing an interrupted checkpoint writes the counts of the bitmaps it
    /// put home.) See docs/FORMAT.md, *Bitmaps*, for what else allocation checks.
    fn compare_free_counts(&self) -> Option<String> {
        [
            ("block", self.blocks.free_count(), self.superblock.free_blocks),
            ("inode", self.inodes.free_count(), self.superblock.free_inodes),
        ]
        .into_iter()
        .find(|(_, counted, recorded)| counted != recorded)
        .map(|(name, counted, recorded)| {
            format!("the {name} bitmap counts {counted} free, the superblock {recorded}: a bitmap block is damaged")
        })
    }

    pub fn cache_dirty_count(&self) -> usize {
        self.cache.dirty_count()
    }
    /// Dirty metadata blocks the next checkpoint would write (`BlockCache::unsealed_dirty_count`):
    /// not those sealed into a checkpoint still on its way home, unless changed since.
    pub fn cache_unsealed_dirty_count(&self) -> usize {
        self.cache.unsealed_dirty_count()
    }
    /// An upper bound on the images of the next checkpoint after the one under way (if any):
    /// every dirty block not sealed by that one and every dirty bitmap block; a level-0
    /// generation-table block for each of them, each freed metadata block and each table block
    /// the runs of data handed out or freed touch, but never more than the level has; and every
    /// block of the table's upper levels (`snapshot_images`). Blocks the checkpoint under way
    /// sealed are its own count.
    pub fn image_estimate_blocks(&self) -> u64 {
        self.image_bound_blocks(self.cache.unsealed_dirty_count() as u64)
    }

    /// An upper bound on the images `snapshot_images` would seal now: the estimate above, with
    /// the blocks a checkpoint sealed and has not made clean (one that failed) counted too.
    pub fn snapshot_bound_blocks(&self) -> u64 {
        self.image_bound_blocks(self.cache.dirty_count() as u64)
    }

    fn image_bound_blocks(&self, dirty_blocks: u64) -> u64 {
        let imaged = dirty_blocks + self.blocks.dirty_block_count() + self.inodes.dirty_block_count();
        let entries_changed = imaged + self.freed_metadata.len() as u64;
        let (_, level_zero_blocks) = self.table_levels[0];
        let level_zero = (entries_changed + self.data_handed_out_table_blocks).min(level_zero_blocks);
        let upper_levels: u64 = self.table_levels.iter().skip(1).map(|(_, blocks)| blocks).sum();
        imaged + level_zero + upper_levels
    }

    /// Stores `image_estimate_blocks` where the log's pledge reads it (see `log::pledge`). Called
    /// with the volume held after every change, so the stores are in the order of the changes.
    pub fn publish_image_estimate(&self) {
        if let Some(gauge) = &self.image_gauge {
            gauge.store(self.image_estimate_blocks(), std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Where `publish_image_estimate` stores from now on; stores the current estimate.
    pub fn set_image_gauge(&mut self, gauge: Arc<std::sync::atomic::AtomicU64>) {
        self.image_gauge = Some(gauge);
        self.publish_image_estimate();
    }

    fn note_data_handed_out(&mut self, first: u64, count: u64) {
        self.data_handed_out.push((first, count));
        self.data_handed_out_table_blocks += count.div_ceil(GENERATIONS_PER_TABLE_BLOCK) + 1;
    }

    pub fn cache_hit_counts(&self) -> (u64, u64) {
        (self.cache.hits, self.cache.misses)
    }

    fn check_metadata_address(&self, block_number: u64, kind: BlockKind) -> Result<()> {
        let allowed = match kind {
            BlockKind::InodeTable => (self.superblock.inode_table_start
                ..self.superblock.inode_table_start + self.superblock.inode_table_blocks)
                .contains(&block_number),
            // Bitmaps are loaded whole at mount; generation-table blocks go through
            // `table_block`, checksum-table blocks through `checksum_table_block`.
            BlockKind::BlockBitmap | BlockKind::InodeBitmap | BlockKind::GenerationTable | BlockKind::DataChecksum => {
                false
            }
            _ => (self.superblock.first_data_block..self.superblock.block_count).contains(&block_number),
        };
        if !allowed {
            return Err(Error::corruption(format!("{kind:?} block address {block_number} lies outside its region")));
        }
        Ok(())
    }

    fn check_data_range(&self, block_number: u64, offset_in_block: usize, length: usize) -> Result<u64> {
        let start = block_number
            .checked_mul(BLOCK_SIZE_U64)
            .and_then(|byte| byte.checked_add(offset_in_block as u64))
            .filter(|_| offset_in_block < BLOCK_SIZE && block_number >= self.superblock.first_data_block);
        let end = start.and_then(|start| start.checked_add(length as u64));
        match (start, end) {
            (Some(start), Some(end)) if end <= self.superblock.block_count * BLOCK_SIZE_U64 => Ok(start),
            _ => Err(Error::corruption(format!(
                "data range of {length} bytes at block {block_number} + {offset_in_block} lies outside the data region"
            ))),
        }
    }

    /// Allocation never trusts the block bitmap alone: blocks it just handed out must not be
    /// in the metadata cache, which holds only blocks in use (a freed block leaves it). A hit
    /// means the bitmap lost the block's bit while something still uses it; the caller fails
    /// with corruption instead of overwriting it. The check costs a hash probe per block. (A
    /// block free on disk never gets here: `read_meta` refuses it, and mount compares the
    /// bitmaps' counts; this guards the bitmaps in memory.)
    /// Drops cached clean blocks that the block bitmap calls free (after fsck's repair rebuilt
    /// it), so that `check_allocated_unused` sees only blocks in use.
    pub fn forget_cached_free_blocks(&mut self) {
        let blocks = &self.blocks;
        self.cache.forget_clean_unless(|block| blocks.is_set(block));
    }

    /// Refuses to hand out blocks `first..first + count` that something still uses although the
    /// block bitmap calls them free (a lost bit): a block held in the metadata cache, or one
    /// whose generation-table entry records metadata. The table records a metadata generation
    /// only for blocks that hold metadata (a checkpoint records 0 for the metadata blocks freed
    /// since the last one), so such an entry under a free bit is metadata that the bitmap lost,
    /// even when it is not cached. `GENERATION_DATA` under a free bit is normal since format
    /// version 6 (a free leaves data entries alone); a data block the bitmap lost is found by
    /// fsck, which walks the files' extents. It costs one table lookup per block, one table
    /// block per 508.
    fn check_allocated_unused(&mut self, first: u64, count: u64) -> Result<()> {
        if let Some(block) = (first..first + count).find(|block| self.cache.holds(*block)) {
            return Err(Error::corruption(format!(
                "block {block} is free in the block bitmap but in use as metadata: not reused"
            )));
        }
        let mut block = first;
        // Bounded by `count`: each pass moves past one table block's worth of blocks.
        while block < first + count {
            let (_, table) = self.table_block(0, block / GENERATIONS_PER_TABLE_BLOCK)?;
            let end = (first + count).min((block / GENERATIONS_PER_TABLE_BLOCK + 1) * GENERATIONS_PER_TABLE_BLOCK);
            for number in block..end {
                let generation = get_u64(&table[..], (number % GENERATIONS_PER_TABLE_BLOCK) as usize * 8);
                if generation != 0 && generation != GENERATION_DATA {
                    return Err(Error::corruption(format!(
                        "block {number} is free in the block bitmap but the generation table records metadata of generation {generation} there: not reused"
                    )));
                }
            }
            block = end;
        }
        Ok(())
    }

    /// Records `GENERATION_DATA` for every block of `runs` (fsck's repair: the file data it
    /// keeps) that the table does not record as data. Returns how many entries it changed.
    pub fn record_data_blocks(&mut self, runs: &[(u64, u64)]) -> Result<u64> {
        let mut changed = 0;
        for (first, count) in runs {
            for block in *first..first + count {
                if references_of_generation(self.expected_generation(0, block)?).is_none() {
                    self.set_expected_generation(0, block, GENERATION_DATA)?;
                    changed += 1;
                }
            }
        }
        Ok(changed)
    }

    /// Records generation 0 for every block the block bitmap calls free whose entry records
    /// metadata (fsck's repair, after it rebuilt the bitmap: blocks it stopped using were not
    /// freed one by one). `GENERATION_DATA` under a free bit is left: a free leaves it too.
    /// Returns how many entries it cleared.
    pub fn forget_generations_of_free_blocks(&mut self) -> Result<u64> {
        let (_, level_blocks) = self.table_levels[0];
        let mut cleared = 0;
        for index in 0..level_blocks {
            let (_, table) = self.table_block(0, index)?;
            let first = index * GENERATIONS_PER_TABLE_BLOCK;
            let free: Vec<u64> = (first..(first + GENERATIONS_PER_TABLE_BLOCK).min(self.superblock.block_count))
                .filter(|number| {
                    let generation = get_u64(&table[..], (number - first) as usize * 8);
                    generation != 0 && generation != GENERATION_DATA && !self.blocks.is_set(*number)
                })
                .collect();
            drop(table);
            for number in free {
                self.set_expected_generation(0, number, 0)?;
                cleared += 1;
            }
        }
        Ok(cleared)
    }

    // ---- inode table ----

    fn inode_location(&self, inode_number: u64) -> Result<(u64, usize)> {
        if inode_number == 0 || inode_number > self.superblock.inode_count {
            return Err(Error::corruption(format!("inode number {inode_number} is out of range")));
        }
        let index = inode_number - 1;
        Ok((
            self.superblock.inode_table_start + index / INODES_PER_BLOCK,
            (index % INODES_PER_BLOCK) as usize * INODE_BYTES,
        ))
    }

    /// Inode-table block `block_number`, checked (an all-zero block holds free inodes), for fsck.
    pub fn read_inode_table_block(&mut self, block_number: u64) -> Result<SharedBlock> {
        self.check_metadata_address(block_number, BlockKind::InodeTable)?;
        self.read_inode_block(block_number)
    }

    fn read_inode_block(&mut self, block_number: u64) -> Result<SharedBlock> {
        if let Some(block) = self.cache.get(block_number, BlockKind::InodeTable) {
            return Ok(block);
        }
        let mut block = zeroed_block();
        // Past the initialized mark the device holds whatever was there before mkfs: the block
        // is all free and is not read (see `Superblock::inode_table_initialized_blocks`).
        let index = block_number - self.superblock.inode_table_start;
        if index < self.superblock.inode_table_initialized_blocks {
            self.device.read_at(block_number * BLOCK_SIZE_U64, &mut block[..])?;
        }
        // Inode-table blocks are written lazily: an all-zero block holds only free inodes, and
        // is what mkfs and the mark's zeroing leave, never a checkpoint (it seals every image).
        if index < self.superblock.inode_table_initialized_blocks {
            let expected = self.expected_generation(0, block_number)?;
            if block.iter().any(|byte| *byte != 0) {
                block = self.checked_or_healed(block_number, BlockKind::InodeTable, expected, block)?;
            } else if expected != 0 {
                return Err(Error::corruption(format!(
                    "InodeTable block {block_number}: all zero, generation {expected} expected (a stale block: a write was lost)"
                )));
            }
        }
        let block = Arc::new(block);
        self.cache.insert_clean(block_number, BlockKind::InodeTable, block.clone());
        Ok(block)
    }

    /// The cached inode-table block, to change in place (read first if absent).
    fn modify_inode_block(&mut self, block_number: u64) -> Result<&mut BlockBuf> {
        if !self.cache.contains(block_number, BlockKind::InodeTable) {
            self.read_inode_block(block_number)?;
        }
        Ok(self.cache.modify(block_number, BlockKind::InodeTable).expect("inode block cached by the read above"))
    }

    /// Reads an allocated inode and checks its record against what it refers to (see
    /// `check_inode_contents`). A free inode is `NotFound`; an allocated inode whose record is
    /// missing or wrong, or a free one whose record is in use, is corruption.
    pub fn read_inode(&mut self, inode_number: u64) -> Result<Inode> {
        let inode = self.read_inode_record(inode_number)?;
        self.check_inode_contents(&inode)?;
        Ok(inode)
    }

    /// Reads an allocated inode's record, checked on its own (`Inode::decode`) but not against
    /// its extent root: for fsck, which reports a size that disagrees with the tree itself.
    pub fn read_inode_record(&mut self, inode_number: u64) -> Result<Inode> {
        let (block_number, offset) = self.inode_location(inode_number)?;
        let allocated = self.inodes.is_set(inode_number - 1);
        let block = self.read_inode_block(block_number)?;
        let record = &block[offset..offset + INODE_BYTES];
        if !allocated {
            // A free number's record is all zero (`delete_inode` clears it). A record in use
            // under a clear bit means the bitmap lost a write: an entry naming it is not a
            // dangling name but a live file the bitmap forgot.
            if record.iter().any(|byte| *byte != 0) {
                return Err(Error::corruption(format!(
                    "inode {inode_number} is free in the inode bitmap but its record is in use"
                )));
            }
            return Err(Error::NotFound);
        }
        match Inode::decode(record, inode_number, self.superblock.inode_count)? {
            Some(inode) => Ok(inode),
            None => Err(Error::corruption(format!("inode {inode_number} is allocated but its record is empty"))),
        }
    }

    /// Replaces inode-table block `block_number` with one of free records, for fsck --repair
    /// when the block is damaged: its inodes are lost, the rest of the table is kept.
    pub fn clear_inode_table_block(&mut self, block_number: u64) -> Result<()> {
        self.check_metadata_address(block_number, BlockKind::InodeTable)?;
        self.cache.put_dirty(block_number, BlockKind::InodeTable, Arc::new(zeroed_block()));
        Ok(())
    }

    /// Zeroes one inode's record whatever the bitmap says (fsck --repair drops an invalid one).
    pub fn clear_inode_record(&mut self, inode_number: u64) -> Result<()> {
        let (block_number, offset) = self.inode_location(inode_number)?;
        let block = self.modify_inode_block(block_number)?;
        block[offset..offset + INODE_BYTES].fill(0);
        Ok(())
    }

    /// Checks an inode's fields against the volume and its own root area: the size of a file or
    /// symbolic link is the length its extent tree maps (a larger size would be served as
    /// endless zeros), an inode without data has an empty root and size, and the xattr block
    /// lies in the data region. Cheap: no block is read.
    pub fn check_inode_contents(&self, inode: &Inode) -> Result<()> {
        check_inode_contents_within(self.superblock.first_data_block, self.superblock.block_count, inode)
    }

    /// Allocation never trusts the inode bitmap alone: before the front end hands out number
    /// `inode_number`, which the bitmaps call free, its record must be free too. A record in use
    /// means the bitmap lost a write, and handing the number out would overwrite a live inode.
    /// A number the applied bitmap still holds is being freed by a record not yet applied (the
    /// back end frees it first, in log order) and is not checked here; `create_inode` checks it
    /// again when the create is applied.
    pub fn check_inode_free(&mut self, inode_number: u64) -> Result<()> {
        let (block_number, offset) = self.inode_location(inode_number)?;
        if self.inodes.is_set(inode_number - 1) {
            return Ok(());
        }
        let block = self.read_inode_block(block_number)?;
        if block[offset..offset + INODE_BYTES].iter().any(|byte| *byte != 0) {
            return Err(Error::corruption(format!(
                "inode {inode_number} is free in the inode bitmap but its record is in use: not reused"
            )));
        }
        Ok(())
    }

    /// Writes an inode's record in place in the cached inode-table block (no block copy).
    pub fn write_inode(&mut self, inode: &Inode) -> Result<()> {
        let (block_number, offset) = self.inode_location(inode.inode_number)?;
        let block = self.modify_inode_block(block_number)?;
        inode.encode(&mut block[offset..offset + INODE_BYTES]);
        Ok(())
    }

    /// Marks an inode allocated (applying a create) and writes its record.
    pub fn create_inode(&mut self, inode: &Inode) -> Result<()> {
        let number = inode.inode_number;
        self.inode_location(number)?;
        if self.inodes.is_set(number - 1) {
            return Err(Error::corruption(format!("inode {number} created while allocated")));
        }
        self.check_inode_free(number)?;
        self.inodes.set_range(number - 1, 1);
        self.write_inode(inode)
    }

    /// Frees an inode's record and number (its blocks are freed by the caller first).
    pub fn delete_inode(&mut self, inode_number: u64) -> Result<()> {
        let (block_number, offset) = self.inode_location(inode_number)?;
        if !self.inodes.is_set(inode_number - 1) {
            return Err(Error::corruption(format!("inode {inode_number} deleted while free")));
        }
        // Inode numbers may be reused at once: records apply in log order and the inode table
        // reaches home only through checkpoint images, so no reuse can overwrite durable state.
        self.inodes.free_now(inode_number - 1, 1);
        let block = self.modify_inode_block(block_number)?;
        block[offset..offset + INODE_BYTES].fill(0);
        Ok(())
    }

    // ---- extended attributes ----

    pub fn read_xattrs(&mut self, block_number: u64) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
        let mut attributes = BTreeMap::new();
        if block_number == 0 {
            return Ok(attributes);
        }
        let block = self.read_meta(block_number, BlockKind::Xattr)?;
        let fail = |what: &str| Err(Error::corruption(format!("xattr block {block_number}: {what}")));
        let count = u16::from_le_bytes([block[0], block[1]]) as usize;
        let mut position = 2usize;
        for _ in 0..count {
            if position + 3 > META_PAYLOAD_BYTES {
                return fail("entry header runs past the block");
            }
            let name_length = block[position] as usize;
            let value_length = u16::from_le_bytes([block[position + 1], block[position + 2]]) as usize;
            position += 3;
            if name_length == 0 || position + name_length + value_length > META_PAYLOAD_BYTES {
                return fail("entry runs past the block");
            }
            let name = block[position..position + name_length].to_vec();
            position += name_length;
            let value = block[position..position + value_length].to_vec();
            position += value_length;
            if !xattr_name_is_valid(&name) {
                return fail("a name the front end would never store");
            }
            if value_length > crate::backend::record::XATTR_VALUE_MAX_BYTES {
                return fail("value longer than any the front end stores");
            }
            // Written sorted by name: anything else is damage (and would hide a duplicate).
            if attributes.last_key_value().is_some_and(|(last, _)| *last >= name) {
                return fail("names out of order");
            }
            attributes.insert(name, value);
        }
        // `write_xattrs` zeroes what follows the list: a count that lost entries, or a length
        // that moved where the list ends, leaves bytes here.
        if block[position..META_PAYLOAD_BYTES].iter().any(|byte| *byte != 0) {
            return fail("bytes after the last entry are not zero");
        }
        Ok(attributes)
    }

    pub fn xattr_encoded_bytes(attributes: &BTreeMap<Vec<u8>, Vec<u8>>) -> usize {
        2 + attributes.iter().map(|(name, value)| 3 + name.len() + value.len()).sum::<usize>()
    }

    /// Writes `attributes` for `inode`, allocating or freeing its xattr block as needed.
    pub fn write_xattrs(&mut self, inode: &mut Inode, attributes: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<()> {
        if attributes.is_empty() {
            if inode.xattr_block != 0 {
                self.free_meta(inode.xattr_block)?;
                inode.xattr_block = 0;
                inode.blocks_owned = inode.blocks_owned.saturating_sub(1);
            }
            return Ok(());
        }
        let encoded_bytes = Volume::xattr_encoded_bytes(attributes);
        assert!(encoded_bytes <= XATTR_BLOCK_PAYLOAD_BYTES, "front end admits only attributes that fit");
        if inode.xattr_block == 0 {
            inode.xattr_block = self.allocate_meta(0)?;
            inode.blocks_owned += 1;
        }
        let mut block = zeroed_block();
        block[0..2].copy_from_slice(&(attributes.len() as u16).to_le_bytes());
        let mut position = 2;
        for (name, value) in attributes {
            block[position] = name.len() as u8;
            block[position + 1..position + 3].copy_from_slice(&(value.len() as u16).to_le_bytes());
            position += 3;
            block[position..position + name.len()].copy_from_slice(name);
            position += name.len();
            block[position..position + value.len()].copy_from_slice(value);
            position += value.len();
        }
        self.write_meta(inode.xattr_block, BlockKind::Xattr, Arc::new(block))
    }

    // ---- checkpoints ----

    /// Sealed images of every changed metadata block, for a checkpoint that writes them while
    /// the volume stays readable: cache blocks stay dirty (pinned) until `images_home`.
    ///
    /// Every image carries the checkpoint's generation (`metadata_generation + 1`) in its
    /// trailer, and the generation table records it as what a read of that block must find:
    /// the table blocks this changes are images of the same checkpoint, level by level up to
    /// the top block, whose generation the superblock this checkpoint writes records
    /// (`metadata_generation` moves now; the blocks that disagree with the device until the
    /// images are home stay pinned in the cache, so no read meets the difference).
    pub fn snapshot_images(&mut self) -> Result<Vec<Image>> {
        // Runs packed after this checkpoint go to blocks handed out after it: a pack block the
        // checkpoint holds keeps the bytes (and so the data checksum) the checkpoint records,
        // which replay, whose pack rooms start empty, would not write again.
        self.pack_rooms.clear();
        let generation = self.superblock.metadata_generation + 1;
        let dirty_bitmaps = [self.blocks.take_dirty_blocks(), self.inodes.take_dirty_blocks()];
        let mut items: Vec<u64> = self
            .cache
            .dirty_blocks()
            .into_iter()
            .filter(|(_, kind)| *kind != BlockKind::GenerationTable)
            .map(|(number, _)| number)
            .collect();
        items.extend(dirty_bitmaps[0].iter().map(|index| self.superblock.block_bitmap_start + index));
        items.extend(dirty_bitmaps[1].iter().map(|index| self.superblock.inode_bitmap_start + index));
        // A freed block is not reused before this checkpoint is durable, so it cannot be among
        // the items too.
        for block in std::mem::take(&mut self.freed_metadata) {
            self.set_expected_generation(0, block, 0)?;
        }
        self.data_handed_out_table_blocks = 0;
        for (first, count) in std::mem::take(&mut self.data_handed_out) {
            // A block shared since it was handed out keeps its count of references.
            self.set_expected_range(first, count, GENERATION_DATA)?;
        }
        let table_start = self.superblock.generation_table_start;
        for level in 0..self.table_levels.len() {
            for item in &items {
                self.set_expected_generation(level, *item, generation)?;
            }
            // The blocks of this level now dirty (changed above, or left by a checkpoint that
            // failed) are the items of the next level.
            let (start, blocks) = self.table_levels[level];
            let range = table_start + start..table_start + start + blocks;
            items = self
                .cache
                .dirty_blocks()
                .into_iter()
                .filter(|(number, kind)| *kind == BlockKind::GenerationTable && range.contains(number))
                .map(|(number, _)| number - range.start)
                .collect();
        }
        let mut images: Vec<Image> = self
            .cache
            .seal_dirty(&mut |block_number, kind, block| seal_block_generation(block, kind, block_number, generation))
            .into_iter()
            .map(|(block_number, block)| Image { block_number, block })
            .collect();
        self.append_bitmap_images(&mut images, dirty_bitmaps, generation);
        if !images.is_empty() {
            self.superblock.metadata_generation = generation;
        }
        images.sort_by_key(|image| image.block_number);
        // Sealed: the next checkpoint's images start from what changes after this one.
        self.publish_image_estimate();
        Ok(images)
    }

    // ---- generation table ----

    /// Checks the generation of a block read from the device outside the cache (fsck's repair
    /// compares the bitmaps on disk) against the generation table.
    pub fn check_generation(&mut self, block: &[u8; BLOCK_SIZE], kind: BlockKind, block_number: u64) -> Result<()> {
        let expected = self.expected_generation(0, block_number)?;
        verify_generation(block, kind, block_number, expected)
    }

    /// The generation a read of item `index` of `level` must find: level 0's items are the
    /// volume's blocks, level k's the blocks of table level k − 1.
    fn expected_generation(&mut self, level: usize, index: u64) -> Result<u64> {
        let (_, block) = self.table_block(level, index / GENERATIONS_PER_TABLE_BLOCK)?;
        Ok(get_u64(&block[..], (index % GENERATIONS_PER_TABLE_BLOCK) as usize * 8))
    }

    /// Records `generation` for item `index` of `level` (see `expected_generation`).
    fn set_expected_generation(&mut self, level: usize, index: u64, generation: u64) -> Result<()> {
        let (number, block) = self.table_block(level, index / GENERATIONS_PER_TABLE_BLOCK)?;
        let offset = (index % GENERATIONS_PER_TABLE_BLOCK) as usize * 8;
        if get_u64(&block[..], offset) != generation {
            drop(block);
            let block =
                self.cache.modify(number, BlockKind::GenerationTable).expect("table block cached by the read above");
            put_u64(&mut block[..], offset, generation);
        }
        Ok(())
    }

    /// Records `value` for volume blocks `first..first + count`, one table block at a time (a
    /// large write hands out thousands of blocks between checkpoints).
    fn set_expected_range(&mut self, first: u64, count: u64, value: u64) -> Result<()> {
        let end = first + count;
        let mut block = first;
        // Bounded by `count`: each pass moves past one table block's worth of blocks.
        while block < end {
            let index = block / GENERATIONS_PER_TABLE_BLOCK;
            let base = index * GENERATIONS_PER_TABLE_BLOCK;
            let stop = end.min(base + GENERATIONS_PER_TABLE_BLOCK);
            let (number, table) = self.table_block(0, index)?;
            // Entries that count the references of a shared data block (format version 8) stay.
            let changes = |old: u64| old != value && references_of_generation(old).is_none_or(|count| count == 0);
            let differs = (block..stop).any(|entry| changes(get_u64(&table[..], (entry - base) as usize * 8)));
            drop(table);
            if differs {
                let table = self
                    .cache
                    .modify(number, BlockKind::GenerationTable)
                    .expect("table block cached by the read above");
                for entry in block..stop {
                    let offset = (entry - base) as usize * 8;
                    if changes(get_u64(&table[..], offset)) {
                        put_u64(&mut table[..], offset, value);
                    }
                }
            }
            block = stop;
        }
        Ok(())
    }

    /// fsck's repair: checks every block of the generation table, top level first, and rebuilds
    /// each one that fails its check (zeroed, damaged, stale) from the trailers of the blocks it
    /// covers: a block that is valid metadata at its own address is recorded with the
    /// generation in its trailer (if no newer than the volume's), anything else with 0 (file
    /// data is recorded again from the files kept, free blocks are cleared, by the repair).
    /// The rebuilt blocks are dirty in the cache: the repair's checkpoint takes them home with
    /// a fresh generation and records that one level up. Returns a line per rebuilt block.
    /// What a rebuild cannot know: a stale block under a rebuilt table block looks current.
    pub fn rebuild_damaged_generation_table(&mut self) -> Result<Vec<String>> {
        let mut rebuilt = Vec::new();
        // Children that a rebuilt block of the level above found damaged: rebuilt directly.
        let mut damaged_children: Vec<u64> = Vec::new();
        for level in (0..self.table_levels.len()).rev() {
            let (_, blocks) = self.table_levels[level];
            let mut damaged_below = Vec::new();
            for index in 0..blocks {
                let why = if damaged_children.contains(&index) {
                    Some("its own block is not a valid table block".to_string())
                } else {
                    match self.table_block(level, index) {
                        Ok(_) => None,
                        Err(Error::Corruption { what }) => Some(what),
                        Err(other) => return Err(other),
                    }
                };
                let Some(why) = why else { continue };
                let (covered, invalid) = self.rebuild_table_block(level, index)?;
                rebuilt.push(format!(
                    "generation table level {level} block {index}: {why}; rebuilt from the trailers of the {covered} blocks it covers"
                ));
                if level > 0 {
                    damaged_below.extend(invalid);
                }
            }
            damaged_children = damaged_below;
        }
        Ok(rebuilt)
    }

    /// Rebuilds table block `index` of `level` from the blocks it covers (see
    /// `rebuild_damaged_generation_table`); returns how many it covers and, for a level above
    /// 0, the covered table blocks that are not valid (their entries are 0 here).
    fn rebuild_table_block(&mut self, level: usize, index: u64) -> Result<(u64, Vec<u64>)> {
        let (start, blocks) = self.table_levels[level];
        let number = self.superblock.generation_table_start + start + index;
        let items = if level == 0 { self.superblock.block_count } else { self.table_levels[level - 1].1 };
        let first = index * GENERATIONS_PER_TABLE_BLOCK;
        let end = items.min(first + GENERATIONS_PER_TABLE_BLOCK);
        assert!(index < blocks && first < end, "table block {index} of level {level} covers nothing");
        let item_base =
            if level == 0 { 0 } else { self.superblock.generation_table_start + self.table_levels[level - 1].0 };
        let mut buffer = vec![0u8; ((end - first) * BLOCK_SIZE_U64) as usize];
        self.device.read_at((item_base + first) * BLOCK_SIZE_U64, &mut buffer)?;
        let mut table = zeroed_block();
        let mut invalid = Vec::new();
        for item in first..end {
            let at = ((item - first) as usize) * BLOCK_SIZE;
            let bytes: &[u8; BLOCK_SIZE] = buffer[at..at + BLOCK_SIZE].try_into().expect("one block");
            let kind = if level == 0 {
                let value = u32::from_le_bytes(bytes[TRAILER_KIND_OFFSET..TRAILER_KIND_OFFSET + 4].try_into().unwrap());
                BlockKind::from_u32(value)
            } else {
                Some(BlockKind::GenerationTable)
            };
            let generation = match kind {
                Some(kind) if verify_block(bytes, kind, item_base + item).is_ok() => block_generation(bytes),
                _ => 0,
            };
            let generation = if generation <= self.superblock.metadata_generation { generation } else { 0 };
            if level > 0 && generation == 0 && bytes.iter().any(|byte| *byte != 0) {
                invalid.push(item);
            }
            put_u64(&mut table[..], ((item - first) as usize) * 8, generation);
        }
        if self.cache.get(number, BlockKind::GenerationTable).is_none() {
            self.cache.insert_clean(number, BlockKind::GenerationTable, Arc::new(zeroed_block()));
        }
        let cached = self.cache.modify(number, BlockKind::GenerationTable).expect("table block cached just above");
        cached[..META_PAYLOAD_BYTES].copy_from_slice(&table[..META_PAYLOAD_BYTES]);
        Ok((end - first, invalid))
    }

    /// Block `index` of table level `level`, checked against the generation the level above
    /// (or, for the top block, the superblock) expects. A block expected at generation 0 was
    /// never written (the table is written lazily, like the inode table): it is all zeros and
    /// not read.
    fn table_block(&mut self, level: usize, index: u64) -> Result<(u64, SharedBlock)> {
        assert!(level < self.table_levels.len());
        let (start, blocks) = self.table_levels[level];
        if index >= blocks {
            return Err(Error::corruption(format!("generation table level {level} has no block {index}")));
        }
        let number = self.superblock.generation_table_start + start + index;
        if let Some(block) = self.cache.get(number, BlockKind::GenerationTable) {
            return Ok((number, block));
        }
        let expected = if level + 1 == self.table_levels.len() {
            self.superblock.metadata_generation
        } else {
            self.expected_generation(level + 1, index)?
        };
        let block = self.load_lazy_table_block(number, BlockKind::GenerationTable, expected)?;
        Ok((number, block))
    }

    /// Reads block `number` of a table written lazily (generation table, checksum table) into
    /// the cache: a block expected at generation 0 was never written and is all zeros, not
    /// read; any other is checked against its kind, number and `expected` generation.
    pub(super) fn load_lazy_table_block(&mut self, number: u64, kind: BlockKind, expected: u64) -> Result<SharedBlock> {
        let block = if expected != 0 { self.read_metadata_checked(number, kind, expected)? } else { zeroed_block() };
        let block = Arc::new(block);
        self.cache.insert_clean(number, kind, block.clone());
        Ok(block)
    }

    /// Metadata block `number` of `kind` read from the device and checked (trailer, address,
    /// `expected` generation). A block that fails is read again through
    /// `Device::read_checked` with the same checks as the judge: an erasure-coded array rebuilds
    /// it from its other members and rewrites the copy that was wrong (self-healing,
    /// docs/RAID.md); on any other device the first failure is the error.
    fn read_metadata_checked(&mut self, number: u64, kind: BlockKind, expected: u64) -> Result<BlockBuf> {
        let mut block = zeroed_block();
        self.device.read_at(number * BLOCK_SIZE_U64, &mut block[..])?;
        self.checked_or_healed(number, kind, expected, block)
    }

    /// `block`, just read as metadata block `number`, if it passes the checks of
    /// `read_metadata_checked`; else the version the device's redundancy gives, or the error.
    fn checked_or_healed(
        &mut self,
        number: u64,
        kind: BlockKind,
        expected: u64,
        mut block: BlockBuf,
    ) -> Result<BlockBuf> {
        let failure =
            match verify_block(&block, kind, number).and_then(|()| verify_generation(&block, kind, number, expected)) {
                Ok(()) => return Ok(block),
                Err(error) => error,
            };
        let check = |bytes: &[u8]| {
            let bytes: &[u8; BLOCK_SIZE] = bytes.try_into().expect("one block read");
            verify_block(bytes, kind, number).is_ok() && verify_generation(bytes, kind, number, expected).is_ok()
        };
        if self.device.read_checked(number * BLOCK_SIZE_U64, &mut block[..], &check)? {
            self.checksum_statistics.healed_blocks += 1;
            return Ok(block);
        }
        Err(failure)
    }

    /// The images from `snapshot_images` are home.
    pub fn images_home(&mut self, images: &[Image]) {
        self.cache.mark_clean_if_unchanged(images.iter().map(|image| (image.block_number, &image.block)));
    }

    fn append_bitmap_images(&mut self, images: &mut Vec<Image>, dirty: [Vec<u64>; 2], generation: u64) {
        let superblock = &self.superblock;
        for ((bitmap, start), dirty) in
            [(&mut self.blocks, superblock.block_bitmap_start), (&mut self.inodes, superblock.inode_bitmap_start)]
                .into_iter()
                .zip(dirty)
        {
            for index in dirty {
                let mut block = bitmap.encode_block(index);
                seal_block_generation(&mut block, bitmap.kind, start + index, generation);
                images.push(Image { block_number: start + index, block: Arc::new(block) });
            }
        }
    }

    /// Writes images to their home blocks, joining neighbours into one write. Inode-table images
    /// at or past `superblock`'s initialized mark first get the blocks between the mark and them
    /// zeroed, and the mark in `superblock` moves past them: the caller writes that superblock
    /// after flushing, so the mark only ever covers blocks that are zero or valid on the device.
    /// A crash before it is written leaves the old mark, which ignores what was written past it;
    /// completing the checkpoint at the next mount writes the images and moves the mark again.
    ///
    /// The images include the top generation-table block, whose generation `superblock` then
    /// records (`metadata_generation`): a mount completing an interrupted checkpoint learns it
    /// this way.
    pub fn write_images_home(device: &dyn Device, superblock: &mut Superblock, images: &[Image]) -> Result<()> {
        let new_mark = initialize_inode_table(device, superblock, images)?;
        write_images(device, images)?;
        superblock.inode_table_initialized_blocks = new_mark;
        let top = superblock.generation_table_start + superblock.generation_table_blocks - 1;
        if let Some(image) = images.iter().find(|image| image.block_number == top) {
            superblock.metadata_generation = block_generation(&image.block);
        }
        Ok(())
    }
}

/// Zeroes the inode-table blocks from `superblock`'s initialized mark up to the last inode-table
/// image, except the images' own blocks, and returns the mark that covers them all.
fn initialize_inode_table(device: &dyn Device, superblock: &Superblock, images: &[Image]) -> Result<u64> {
    let table_start = superblock.inode_table_start;
    let table = table_start..table_start + superblock.inode_table_blocks;
    let mark = superblock.inode_table_initialized_blocks;
    assert!(mark <= superblock.inode_table_blocks);
    let beyond: std::collections::BTreeSet<u64> = images
        .iter()
        .map(|image| image.block_number)
        .filter(|number| table.contains(number) && number - table_start >= mark)
        .map(|number| number - table_start)
        .collect();
    let Some(&last) = beyond.iter().max() else { return Ok(mark) };
    let zeros = vec![0u8; ZEROING_CHUNK_BLOCKS as usize * BLOCK_SIZE];
    let mut index = mark;
    // Bounded by the table: each pass moves `index` past at least one block.
    while index <= last {
        if beyond.contains(&index) {
            index += 1;
            continue;
        }
        let mut end = index + 1;
        while end <= last && end - index < ZEROING_CHUNK_BLOCKS && !beyond.contains(&end) {
            end += 1;
        }
        let bytes = ((end - index) * BLOCK_SIZE_U64) as usize;
        device.write_at((table_start + index) * BLOCK_SIZE_U64, &zeros[..bytes])?;
        index = end;
    }
    Ok(last + 1)
}

/// Largest piece of the inode table zeroed in one write.
const ZEROING_CHUNK_BLOCKS: u64 = 256;

fn write_images(device: &dyn Device, images: &[Image]) -> Result<()> {
    let mut index = 0;
    while index < images.len() {
        let mut end = index + 1;
        while end < images.len() && images[end].block_number == images[end - 1].block_number + 1 && end - index < 256 {
            end += 1;
        }
        if end - index == 1 {
            device.write_at(images[index].block_number * BLOCK_SIZE_U64, &images[index].block[..])?;
        } else {
            let mut buffer = Vec::with_capacity((end - index) * BLOCK_SIZE);
            for image in &images[index..end] {
                buffer.extend_from_slice(&image.block[..]);
            }
            device.write_at(images[index].block_number * BLOCK_SIZE_U64, &buffer)?;
        }
        index = end;
    }
    Ok(())
}

impl Volume {
    /// The checkpoint covering records up to `lsn` is durable: frees up to it become reusable.
    pub fn checkpoint_done(&mut self, lsn: u64) {
        self.blocks.release_checkpointed(lsn);
        self.inodes.release_checkpointed(lsn);
    }

    /// Blocks free for allocation now (frees awaiting a checkpoint excluded).
    pub fn free_blocks(&self) -> u64 {
        self.blocks.free_count()
    }
}

impl MetaStore for Volume {
    fn read_meta(&mut self, block_number: u64, kind: BlockKind) -> Result<SharedBlock> {
        self.check_metadata_address(block_number, kind)?;
        if let Some(block) = self.cache.get(block_number, kind) {
            return Ok(block);
        }
        if !self.blocks.is_set(block_number) {
            return Err(Error::corruption(format!(
                "{kind:?} block {block_number} is referenced but free in the block bitmap"
            )));
        }
        let expected = self.expected_generation(0, block_number)?;
        let block = Arc::new(self.read_metadata_checked(block_number, kind, expected)?);
        self.cache.insert_clean(block_number, kind, block.clone());
        Ok(block)
    }

    fn write_meta(&mut self, block_number: u64, kind: BlockKind, block: SharedBlock) -> Result<()> {
        self.check_metadata_address(block_number, kind)?;
        assert!(self.blocks.is_set(block_number), "write to free metadata block {block_number}");
        self.cache.put_dirty(block_number, kind, block);
        Ok(())
    }

    fn allocate_meta(&mut self, near: u64) -> Result<u64> {
        let block = self.blocks.allocate_meta(near, self.superblock.first_data_block)?;
        self.check_allocated_unused(block, 1)?;
        Ok(block)
    }

    fn free_meta(&mut self, block_number: u64) -> Result<()> {
        if block_number < self.superblock.first_data_block || block_number >= self.superblock.block_count {
            return Err(Error::corruption(format!("free of metadata block {block_number} outside the data region")));
        }
        self.blocks.free_range(block_number, 1, self.current_lsn)?;
        self.cache.remove(block_number);
        self.decoded.remove(&block_number);
        self.freed_metadata.push(block_number);
        Ok(())
    }

    fn decoded(&mut self, block_number: u64, block: &SharedBlock) -> Option<Decoded> {
        let (held, decoded) = self.decoded.get(&block_number)?;
        Arc::ptr_eq(held, block).then(|| decoded.clone())
    }

    fn keep_decoded(&mut self, block_number: u64, block: &SharedBlock, decoded: Decoded) {
        if self.decoded.len() >= DECODED_BLOCKS_MAX && !self.decoded.contains_key(&block_number) {
            self.decoded.clear();
        }
        self.decoded.insert(block_number, (block.clone(), decoded));
    }

    fn forget_decoded(&mut self, block_number: u64) {
        self.decoded.remove(&block_number);
    }
}

/// Decoded metadata blocks the volume keeps (`MetaStore::decoded`): 1,024 extent nodes, each
/// with its 4 KiB block and up to 253 entries (about 12 MiB at worst); all are forgotten when
/// the bound is reached.
const DECODED_BLOCKS_MAX: usize = 1024;

/// File data carries a CRC32C per block in the data checksum table (`checksums`): every read
/// checks the whole blocks it touches, every write records the new checksums of the blocks it
/// changes, allocation and frees clear them.
impl DataStore for Volume {
    fn read_data(&mut self, block_number: u64, offset_in_block: usize, buffer: &mut [u8]) -> Result<()> {
        self.check_data_range(block_number, offset_in_block, buffer.len())?;
        if buffer.is_empty() {
            return Ok(());
        }
        self.read_data_checked(block_number, offset_in_block, buffer)
    }

    fn write_data(&mut self, block_number: u64, offset_in_block: usize, data: &[u8]) -> Result<()> {
        let start = self.check_data_range(block_number, offset_in_block, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        // Computed before the write: a partial block's other bytes are read from the device.
        let entries = self.checksums_after_write(block_number, offset_in_block, data)?;
        // Held: the record this write applies is durable in the log, and replay redoes it, so
        // the log's group commits need not make it durable (the checkpoint's flush does).
        self.device.write_held(start, data)?;
        self.set_data_checksums(block_number, &entries)
    }

    fn write_fresh(&mut self, block_number: u64, data: &[u8]) -> Result<()> {
        self.check_data_range(block_number, 0, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.write_fresh_checked(block_number, data)
    }

    fn copy_data(&mut self, from_block: u64, to_block: u64, offset_in_block: usize, length: usize) -> Result<()> {
        self.check_data_range(from_block, offset_in_block, length)?;
        self.check_data_range(to_block, offset_in_block, length)?;
        self.copy_data_checked(from_block, to_block, offset_in_block, length)
    }

    fn allocate_data(&mut self, near: u64, count: u64) -> Result<(u64, u64)> {
        let (first, given) = self.blocks.allocate(near, count, self.superblock.first_data_block)?;
        self.check_allocated_unused(first, given)?;
        self.note_data_handed_out(first, given);
        // A block handed out holds nothing written yet: the entry a free left behind describes
        // the bytes of the file that had it.
        self.clear_data_checksums(first, given)?;
        Ok((first, given))
    }

    /// Read from the generation table, where a data block's entry is `GENERATION_DATA` (or 0
    /// while the block was handed out since the last checkpoint) unless extents share it (format
    /// version 8: `shared_generation`).
    fn shared_references(&mut self, block_number: u64) -> Result<u64> {
        if block_number < self.superblock.first_data_block || block_number >= self.superblock.block_count {
            return Err(Error::corruption(format!("references of data block {block_number} outside the data region")));
        }
        let generation = self.expected_generation(0, block_number)?;
        if generation == 0 {
            return Ok(0);
        }
        references_of_generation(generation).ok_or_else(|| {
            Error::corruption(format!(
                "data block {block_number}: the generation table records metadata of generation {generation} there"
            ))
        })
    }

    fn set_shared_references(&mut self, block_number: u64, references: u64) -> Result<()> {
        if block_number < self.superblock.first_data_block || block_number >= self.superblock.block_count {
            return Err(Error::corruption(format!("references of data block {block_number} outside the data region")));
        }
        assert!(references <= MAX_SHARED_REFERENCES);
        let value = if references == 0 { GENERATION_DATA } else { shared_generation(references) };
        self.set_expected_generation(0, block_number, value)
    }

    fn pack_room(&mut self, file: u64) -> Option<(u64, u64)> {
        self.pack_rooms.get(file)
    }

    fn set_pack_room(&mut self, file: u64, room: Option<(u64, u64)>) {
        self.pack_rooms.set(file, room);
    }

    fn forget_pack_room(&mut self, first: u64, count: u64) {
        self.pack_rooms.forget(first, count);
    }

    fn free_data(&mut self, first: u64, count: u64) -> Result<()> {
        if first < self.superblock.first_data_block {
            return Err(Error::corruption(format!("free of data block {first} inside the fixed regions")));
        }
        // Only the bitmap changes: the block's generation-table entry stays `GENERATION_DATA`
        // and its checksum stays until the block is handed out again (`allocate_data`), so a
        // free of any size dirties one bitmap block per 32,512 blocks and nothing else.
        self.blocks.free_range(first, count, self.current_lsn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    fn image(block_number: u64, fill: u8) -> Image {
        Image { block_number, block: Arc::new(Box::new([fill; BLOCK_SIZE])) }
    }

    #[test]
    fn images_past_the_mark_zero_the_gap_and_move_the_mark() {
        let device = MemoryDevice::from_bytes(vec![0xEE; 64 << 20]);
        let mut superblock = Superblock::layout((64 << 20) / BLOCK_SIZE_U64, None, None).unwrap();
        superblock.inode_table_initialized_blocks = 2;
        let start = superblock.inode_table_start;
        // Images at table blocks 5 and 7 and one data block; blocks 2, 3, 4 and 6 must be zeroed.
        let images = [image(start + 5, 5), image(start + 7, 7), image(superblock.first_data_block, 9)];
        Volume::write_images_home(&device, &mut superblock, &images).unwrap();
        assert_eq!(superblock.inode_table_initialized_blocks, 8);
        let block_at = |index: u64| {
            let mut bytes = vec![0u8; BLOCK_SIZE];
            device.read_at((start + index) * BLOCK_SIZE_U64, &mut bytes).unwrap();
            bytes
        };
        for (index, expected) in [(0, 0xEE), (1, 0xEE), (2, 0), (3, 0), (4, 0), (5, 5), (6, 0), (7, 7), (8, 0xEE)] {
            assert!(block_at(index).iter().all(|&byte| byte == expected), "table block {index}");
        }
        // Images below the mark move nothing.
        Volume::write_images_home(&device, &mut superblock, &[image(start + 3, 3)]).unwrap();
        assert_eq!(superblock.inode_table_initialized_blocks, 8);
    }

    /// One checkpoint of `volume`'s changes, written home as `backend::checkpoint` does, with the
    /// superblock's generation taken from the images as a mount completing it would.
    fn checkpoint(volume: &mut Volume, device: &MemoryDevice) -> Vec<Image> {
        let images = volume.snapshot_images().unwrap();
        let mut superblock = volume.superblock.clone();
        if !images.is_empty() {
            superblock.metadata_generation = 0;
        }
        Volume::write_images_home(device, &mut superblock, &images).unwrap();
        assert_eq!(superblock.metadata_generation, volume.superblock.metadata_generation);
        volume.images_home(&images);
        images
    }

    /// A decoded form kept for a block is given back only for the very buffer it came from: not
    /// for an equal copy, not after the block was written again, sealed by a checkpoint (which
    /// then copies the buffer the volume shares) or freed.
    #[test]
    fn decoded_blocks_are_kept_for_their_own_buffer_only() {
        let device = Arc::new(MemoryDevice::from_bytes(vec![0; 64 << 20]));
        let superblock = Superblock::layout((64 << 20) / BLOCK_SIZE_U64, None, None).unwrap();
        let mut volume = Volume::new_empty(device.clone(), superblock.clone(), 64);
        volume.blocks.set_range(0, superblock.first_data_block);
        let block = volume.allocate_meta(0).unwrap();
        let written: SharedBlock = Arc::new(zeroed_block());
        volume.write_meta(block, BlockKind::ExtentLeaf, written.clone()).unwrap();
        let read = volume.read_meta(block, BlockKind::ExtentLeaf).unwrap();
        assert!(Arc::ptr_eq(&read, &written), "the cache hands out the buffer written");
        let decoded: Decoded = Arc::new(7u32);
        volume.keep_decoded(block, &read, decoded);
        let kept = volume.decoded(block, &read).expect("kept for its buffer");
        assert_eq!(kept.downcast_ref::<u32>(), Some(&7));
        let equal: SharedBlock = Arc::new((*read).clone());
        assert!(volume.decoded(block, &equal).is_none(), "an equal copy is another buffer");
        // Sealed by a checkpoint: the volume's buffer is copied, since the kept one shares it.
        checkpoint(&mut volume, &device);
        let sealed = volume.read_meta(block, BlockKind::ExtentLeaf).unwrap();
        assert!(!Arc::ptr_eq(&sealed, &read));
        assert!(volume.decoded(block, &sealed).is_none(), "a sealed block is decoded again");
        volume.keep_decoded(block, &sealed, Arc::new(8u32));
        let rewritten: SharedBlock = Arc::new(zeroed_block());
        volume.write_meta(block, BlockKind::ExtentLeaf, rewritten.clone()).unwrap();
        assert!(volume.decoded(block, &rewritten).is_none(), "a block written again is decoded again");
        volume.keep_decoded(block, &rewritten, Arc::new(9u32));
        assert!(volume.decoded(block, &rewritten).is_some());
        // Forgotten when the extent tree takes the entries over for a change.
        volume.forget_decoded(block);
        assert!(volume.decoded(block, &rewritten).is_none(), "a forgotten block keeps nothing");
        volume.keep_decoded(block, &rewritten, Arc::new(10u32));
        volume.free_meta(block).unwrap();
        assert!(volume.decoded(block, &rewritten).is_none(), "a freed block keeps nothing");
    }

    #[test]
    fn a_block_put_back_older_is_stale() {
        let device = Arc::new(MemoryDevice::from_bytes(vec![0; 64 << 20]));
        let superblock = Superblock::layout((64 << 20) / BLOCK_SIZE_U64, None, None).unwrap();
        let mut volume = Volume::new_empty(device.clone(), superblock.clone(), 64);
        volume.blocks.set_range(0, superblock.first_data_block);
        let block = volume.allocate_meta(0).unwrap();
        let mut older = None;
        for generation in 1..=3u64 {
            let mut payload = zeroed_block();
            payload[0] = generation as u8;
            volume.write_meta(block, BlockKind::Xattr, Arc::new(payload)).unwrap();
            let images = checkpoint(&mut volume, &device);
            assert_eq!(volume.superblock.metadata_generation, generation);
            // The block, the bitmap blocks and the table blocks up to the top carry the generation.
            assert!(images.iter().all(|image| block_generation(&image.block) == generation));
            let top = superblock.generation_table_start + superblock.generation_table_blocks - 1;
            assert!(images.iter().any(|image| image.block_number == top));
            if generation == 2 {
                older = Some(images.iter().find(|image| image.block_number == block).unwrap().block.clone());
            }
        }
        // A checkpoint with nothing to write takes no generation.
        assert!(checkpoint(&mut volume, &device).is_empty());
        assert_eq!(volume.superblock.metadata_generation, 3);
        let fresh = |superblock: &Superblock| {
            let mut volume = Volume::new_empty(device.clone(), superblock.clone(), 64);
            volume.blocks.set_range(0, superblock.block_count);
            volume
        };
        assert_eq!(fresh(&volume.superblock).read_meta(block, BlockKind::Xattr).unwrap()[0], 3);
        // The lost write of generation 3 leaves generation 2's valid block behind.
        device.write_at(block * BLOCK_SIZE_U64, &older.unwrap()[..]).unwrap();
        let error = fresh(&volume.superblock).read_meta(block, BlockKind::Xattr).unwrap_err();
        assert!(error.is_corruption());
        assert!(
            error.to_string().contains(&format!("Xattr block {block}: generation 2 stored, 3 expected")),
            "{error}"
        );
        // A superblock that expects another generation of the top table block fails every read.
        let mut wrong = volume.superblock.clone();
        wrong.metadata_generation = 2;
        let error = fresh(&wrong).read_meta(block, BlockKind::Xattr).unwrap_err();
        assert!(error.to_string().contains("GenerationTable block"), "{error}");
    }

    #[test]
    fn table_blocks_past_the_mark_are_not_read() {
        let device = Arc::new(MemoryDevice::from_bytes(vec![0xEE; 64 << 20]));
        let mut superblock = Superblock::layout((64 << 20) / BLOCK_SIZE_U64, None, None).unwrap();
        superblock.inode_table_initialized_blocks = 1;
        let mut volume = Volume::new_empty(device, superblock, 64);
        // Inode 16 lives in table block 1, past the mark: free, although the device holds junk.
        volume.inodes.set_range(15, 1);
        let error = volume.read_inode(16).unwrap_err();
        assert!(error.to_string().contains("record is empty"), "{error}");
        // Block 0 is below the mark and read: the junk there is corruption.
        volume.inodes.set_range(0, 1);
        assert!(volume.read_inode(1).unwrap_err().is_corruption());
    }
}
