//! The superblock: geometry, feature flags, identity, log tail and checkpoint state, kept in two
//! copies (blocks 0 and 1). Each write goes to the copy the sequence number selects, so a torn
//! superblock write always leaves the other, older copy intact.

use super::codec::*;
use super::meta::{BLOCK_SIZE, BLOCK_SIZE_U64, META_PAYLOAD_BYTES};
use crate::device::Device;
use crate::error::{Error, Result};

pub const MAGIC: [u8; 8] = *b"TANDEMFS";
pub const FORMAT_VERSION: u32 = 10;
/// The oldest version this build reads and takes forward: version 6 only lets a free leave a
/// data block's generation-table and checksum entries behind, version 7 only adds the
/// compaction and create-batch records to the log, and version 8 lets the extents of a file
/// share a data block (its references counted in the generation table, docs/EXTENTS.md) and adds
/// the direct-write record, so every version-5, -6 or -7 volume is a valid version-8 volume.
/// Version 9 moves checkpoint images out of the record log into an image log of their own,
/// carved out of the old log's data ring: a read-write mount of an older volume replays and
/// checkpoints it as it was (images in the record log), then splits the emptied log
/// (`Superblock::split_log_for_images`, `backend::upgrade_to_image_log`), recording this
/// build's version. Version 10 only adds the insert-of-data record to the log, so a version-9
/// volume is a valid version-10 one: its first read-write mount records 10 before anything else
/// (`backend::open`); its log's old records replay as they are.
pub const OLDEST_READABLE_VERSION: u32 = 5;
/// The first version with an image log.
pub const IMAGE_LOG_VERSION: u32 = 9;
/// Counters the superblock keeps (sequence, lsn, generation, mounts, checkpoints) stay below
/// this: at a billion a second it takes 146 years to reach.
pub const COUNTER_LIMIT: u64 = 1 << 62;
/// Inode records per inode-table block (256-byte records in the 4064-byte payload).
pub const INODES_PER_BLOCK: u64 = 15;
/// Bits per bitmap block (the 4064-byte payload).
pub const BITS_PER_BITMAP_BLOCK: u64 = (META_PAYLOAD_BYTES * 8) as u64;
/// Expected generations (u64) per generation-table block (the 4064-byte payload).
pub const GENERATIONS_PER_TABLE_BLOCK: u64 = (META_PAYLOAD_BYTES / 8) as u64;
/// Levels of the generation table at most: 508^8 blocks is far more than a volume holds.
pub const MAX_GENERATION_TABLE_LEVELS: usize = 8;
const _: () = assert!(INODES_PER_BLOCK as usize * 256 <= META_PAYLOAD_BYTES);
const _: () = assert!(GENERATIONS_PER_TABLE_BLOCK as usize * 8 == META_PAYLOAD_BYTES);
/// Data checksums (CRC32C, u32) per checksum-table block (the 4064-byte payload).
pub const CHECKSUMS_PER_TABLE_BLOCK: u64 = (META_PAYLOAD_BYTES / 4) as u64;
const _: () = assert!(CHECKSUMS_PER_TABLE_BLOCK as usize * 4 == META_PAYLOAD_BYTES);
const _: () = assert!(CHECKSUMS_PER_TABLE_BLOCK == 1016);
/// Smallest volume mkfs accepts.
pub const MIN_VOLUME_BYTES: u64 = 16 << 20;
pub const MIN_LOG_BYTES: u64 = 4 << 20;
pub const MAX_LOG_BYTES: u64 = 1 << 30;
/// Log blocks a volume needs per block-bitmap block (see `Superblock::layout`): 17 MiB for a
/// 64 GiB volume; a volume above 4 TiB needs more than `MAX_LOG_BYTES`, which its default log
/// and its limit then grow to (a 16 TiB volume: a 4 GiB log, 0.025%).
pub const LOG_BLOCKS_PER_BITMAP_BLOCK: u64 = 8;
pub const STATE_CLEAN: u32 = 1;
pub const STATE_MOUNTED: u32 = 2;
/// `features_incompat` bit: the volume is encrypted (see `crate::crypt`). A build that does
/// not know it must not read the volume, whose blocks past the header are ciphertext.
pub const FEATURE_INCOMPAT_ENCRYPTED: u64 = 1;
/// Every incompatible feature this build knows.
pub const FEATURES_INCOMPAT_KNOWN: u64 = FEATURE_INCOMPAT_ENCRYPTED;

// Field offsets, defined once (see docs/FORMAT.md, "Superblock").
pub const OFFSET_MAGIC: usize = 0;
pub const OFFSET_VERSION: usize = 8;
pub const OFFSET_BLOCK_SIZE: usize = 12;
pub const OFFSET_SEQUENCE: usize = 16;
pub const OFFSET_BLOCK_COUNT: usize = 24;
pub const OFFSET_UUID: usize = 32;
pub const OFFSET_HASH_SEED: usize = 48;
pub const OFFSET_FEATURES_COMPAT: usize = 64;
pub const OFFSET_FEATURES_INCOMPAT: usize = 72;
pub const OFFSET_FEATURES_RO_COMPAT: usize = 80;
pub const OFFSET_LOG_HEADER_START: usize = 88;
pub const OFFSET_LOG_HEADER_BLOCKS: usize = 96;
pub const OFFSET_LOG_DATA_START: usize = 104;
pub const OFFSET_LOG_DATA_BLOCKS: usize = 112;
pub const OFFSET_BLOCK_BITMAP_START: usize = 120;
pub const OFFSET_BLOCK_BITMAP_BLOCKS: usize = 128;
pub const OFFSET_INODE_BITMAP_START: usize = 136;
pub const OFFSET_INODE_BITMAP_BLOCKS: usize = 144;
pub const OFFSET_INODE_TABLE_START: usize = 152;
pub const OFFSET_INODE_TABLE_BLOCKS: usize = 160;
pub const OFFSET_INODE_COUNT: usize = 168;
pub const OFFSET_FIRST_DATA_BLOCK: usize = 176;
pub const OFFSET_LOG_TAIL_LSN: usize = 184;
pub const OFFSET_LOG_TAIL_DATA_POSITION: usize = 192;
pub const OFFSET_CHECKPOINT_LSN: usize = 200;
pub const OFFSET_ORPHAN_HEAD: usize = 208;
pub const OFFSET_NEXT_GENERATION: usize = 216;
pub const OFFSET_STATE: usize = 224;
pub const OFFSET_FORMAT_TIME: usize = 232;
pub const OFFSET_MOUNT_TIME: usize = 240;
pub const OFFSET_CHECKPOINT_TIME: usize = 248;
pub const OFFSET_MOUNT_COUNT: usize = 256;
pub const OFFSET_CHECKPOINT_COUNT: usize = 264;
pub const OFFSET_FREE_BLOCKS: usize = 272;
pub const OFFSET_FREE_INODES: usize = 280;
/// Version 2: inode-table blocks from the table's start that hold valid contents (see
/// `inode_table_initialized_blocks`).
pub const OFFSET_INODE_TABLE_INITIALIZED_BLOCKS: usize = 288;
/// Multi-mount protection (see `block::mmp`): the MMP block and its default refresh interval.
pub const OFFSET_MMP_BLOCK: usize = 296;
pub const OFFSET_MMP_INTERVAL_MS: usize = 304;
/// Bytes 308..320 are reserved for multi-mount protection and zero.
pub const MMP_RESERVED_END: usize = 320;
/// Version 3: the generation table (see `generation_table_levels`) and the generation of the
/// last checkpoint that wrote metadata home, which its top block carries.
pub const OFFSET_GENERATION_TABLE_START: usize = 320;
pub const OFFSET_GENERATION_TABLE_BLOCKS: usize = 328;
pub const OFFSET_METADATA_GENERATION: usize = 336;
/// Version 4: the data checksum table (see `checksum_table_blocks`).
pub const OFFSET_CHECKSUM_TABLE_START: usize = 344;
pub const OFFSET_CHECKSUM_TABLE_BLOCKS: usize = 352;
/// Version 5: the key-slot region of an encrypted volume (see `crate::crypt`), right after the
/// MMP block; 0 blocks on a plain volume.
pub const OFFSET_KEY_SLOT_START: usize = 360;
pub const OFFSET_KEY_SLOT_BLOCKS: usize = 368;
/// Version 9: the image log (checkpoint images, `docs/LOG.md`), two rings right after the record
/// log's data ring, and its tail. Zero before version 9.
pub const OFFSET_IMAGE_LOG_HEADER_START: usize = 376;
pub const OFFSET_IMAGE_LOG_HEADER_BLOCKS: usize = OFFSET_IMAGE_LOG_HEADER_START + 8;
pub const OFFSET_IMAGE_LOG_DATA_START: usize = OFFSET_IMAGE_LOG_HEADER_BLOCKS + 8;
pub const OFFSET_IMAGE_LOG_DATA_BLOCKS: usize = OFFSET_IMAGE_LOG_DATA_START + 8;
pub const OFFSET_IMAGE_LOG_TAIL_LSN: usize = OFFSET_IMAGE_LOG_DATA_BLOCKS + 8;
pub const OFFSET_IMAGE_LOG_TAIL_DATA_POSITION: usize = OFFSET_IMAGE_LOG_TAIL_LSN + 8;
/// Bytes from here to the checksum are zero.
pub const USED_BYTES: usize = OFFSET_IMAGE_LOG_TAIL_DATA_POSITION + 8;
const _: () = assert!(OFFSET_IMAGE_LOG_HEADER_START == 376 && USED_BYTES == 424);
pub const OFFSET_CRC: usize = 4092;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// The version the volume was read with (`OLDEST_READABLE_VERSION..=FORMAT_VERSION`), for
    /// reports; `encode` always writes `FORMAT_VERSION`.
    pub format_version: u32,
    pub sequence: u64,
    pub block_count: u64,
    pub uuid: [u8; 16],
    pub hash_seed: [u32; 4],
    pub features_compat: u64,
    pub features_incompat: u64,
    pub features_ro_compat: u64,
    pub log_header_start: u64,
    pub log_header_blocks: u64,
    pub log_data_start: u64,
    pub log_data_blocks: u64,
    pub block_bitmap_start: u64,
    pub block_bitmap_blocks: u64,
    pub inode_bitmap_start: u64,
    pub inode_bitmap_blocks: u64,
    pub inode_table_start: u64,
    pub inode_table_blocks: u64,
    pub inode_count: u64,
    pub first_data_block: u64,
    pub log_tail_lsn: u64,
    pub log_tail_data_position: u64,
    pub checkpoint_lsn: u64,
    pub orphan_head: u64,
    pub next_generation: u64,
    pub state: u32,
    pub format_time_ns: i64,
    pub mount_time_ns: i64,
    pub checkpoint_time_ns: i64,
    pub mount_count: u64,
    pub checkpoint_count: u64,
    pub free_blocks: u64,
    pub free_inodes: u64,
    /// The lazy inode table (mke2fs's `lazy_itable_init`): inode-table blocks at index this or
    /// later were never written by this file system and read as all free (zeros) without a
    /// device read, so mkfs need not zero the table. Before a checkpoint writes an inode-table
    /// block at or past the mark, the blocks between are zeroed on the device; the mark then
    /// moves in the superblock the checkpoint writes after its images are home. Never shrinks.
    pub inode_table_initialized_blocks: u64,
    /// The multi-mount protection block: right after the inode table, before the first data
    /// block.
    pub mmp_block: u64,
    /// How often a mount refreshes the MMP block unless its options say otherwise.
    pub mmp_interval_ms: u32,
    /// The generation table: for every block of the volume, the generation its metadata image
    /// last went home with (see `block::volume`, *Generation table*). Right after the MMP block.
    pub generation_table_start: u64,
    pub generation_table_blocks: u64,
    /// The generation of the last checkpoint that wrote metadata home: the generation the top
    /// generation-table block carries; the next checkpoint writes with one more. 0: none yet.
    pub metadata_generation: u64,
    /// The data checksum table: a CRC32C for every volume block that holds file data (see
    /// `block::volume`, *Data checksum table*). Right after the generation table.
    pub checksum_table_start: u64,
    pub checksum_table_blocks: u64,
    /// The key-slot region (version 5): `crate::crypt::KEY_SLOT_COUNT` blocks right after the
    /// MMP block on an encrypted volume (`FEATURE_INCOMPAT_ENCRYPTED`), none on a plain one.
    /// Like the superblocks and the MMP block it is never encrypted.
    pub key_slot_start: u64,
    pub key_slot_blocks: u64,
    /// Version 9: the image log's rings (0 before) and its tail (lsn 0 before).
    pub image_log_header_start: u64,
    pub image_log_header_blocks: u64,
    pub image_log_data_start: u64,
    pub image_log_data_blocks: u64,
    pub image_log_tail_lsn: u64,
    pub image_log_tail_data_position: u64,
}

/// Blocks of the data checksum table of a volume of `block_count` blocks: one u32 per block.
pub fn checksum_table_blocks(block_count: u64) -> u64 {
    block_count.max(1).div_ceil(CHECKSUMS_PER_TABLE_BLOCK)
}

/// The generation table's levels, lowest first, as (first block relative to the table's start,
/// blocks): level 0 holds one generation per volume block, level k + 1 one per block of level k,
/// and the last level is one block, whose generation the superblock holds.
pub fn generation_table_levels(block_count: u64) -> Vec<(u64, u64)> {
    let mut levels = Vec::with_capacity(MAX_GENERATION_TABLE_LEVELS);
    let mut covered = block_count.max(1);
    let mut start = 0;
    for _ in 0..MAX_GENERATION_TABLE_LEVELS {
        let blocks = covered.div_ceil(GENERATIONS_PER_TABLE_BLOCK);
        levels.push((start, blocks));
        start += blocks;
        if blocks == 1 {
            return levels;
        }
        covered = blocks;
    }
    unreachable!("a volume of {block_count} blocks needs more than {MAX_GENERATION_TABLE_LEVELS} table levels");
}

/// Blocks of the generation table of a volume of `block_count` blocks.
pub fn generation_table_blocks(block_count: u64) -> u64 {
    generation_table_levels(block_count).iter().map(|(_, blocks)| blocks).sum()
}

/// How the blocks after the record log's header ring are shared between the record log's data
/// ring and the image log (version 9): half each, the image log's header ring taking a 32nd of
/// its half (a checkpoint of `n` images takes `n / 64 + 2` header slots, 64 to a block, so this
/// leaves twice the slots its data ring can use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogSplit {
    pub record_data_blocks: u64,
    pub image_header_blocks: u64,
    pub image_data_blocks: u64,
}

impl LogSplit {
    pub fn of(data_blocks: u64) -> LogSplit {
        assert!(data_blocks >= 16, "a log data ring of {data_blocks} blocks");
        let image_blocks = data_blocks / 2;
        let image_header_blocks = (image_blocks / 32).max(2);
        let split = LogSplit {
            record_data_blocks: data_blocks - image_blocks,
            image_header_blocks,
            image_data_blocks: image_blocks - image_header_blocks,
        };
        assert!(split.record_data_blocks + split.image_header_blocks + split.image_data_blocks == data_blocks);
        split
    }
}

impl Superblock {
    /// Computes the layout of a new volume of `block_count` blocks.
    pub fn layout(block_count: u64, inode_count: Option<u64>, log_bytes: Option<u64>) -> Result<Superblock> {
        Superblock::layout_with_key_slots(block_count, inode_count, log_bytes, 0)
    }

    /// The layout of a new volume with `key_slot_blocks` blocks of key slots after the MMP
    /// block (an encrypted volume; 0 for a plain one, which `layout` gives).
    pub fn layout_with_key_slots(
        block_count: u64,
        inode_count: Option<u64>,
        log_bytes: Option<u64>,
        key_slot_blocks: u64,
    ) -> Result<Superblock> {
        assert!(key_slot_blocks <= 64, "{key_slot_blocks} key-slot blocks");
        let volume_bytes = block_count.saturating_mul(BLOCK_SIZE_U64);
        if volume_bytes < MIN_VOLUME_BYTES {
            return Err(Error::invalid(format!(
                "a volume needs at least {} MiB; this one has {} bytes",
                MIN_VOLUME_BYTES >> 20,
                volume_bytes
            )));
        }
        // One record may free every data block of the volume, which dirties the whole block
        // bitmap: its images must fit in one checkpoint, in the log's reserve (half the log),
        // beside what other records dirtied meanwhile (up to half the reserve before a
        // checkpoint is due).
        let bitmap_log_bytes =
            LOG_BLOCKS_PER_BITMAP_BLOCK * block_count.div_ceil(BITS_PER_BITMAP_BLOCK) * BLOCK_SIZE_U64;
        let min_log_bytes = bitmap_log_bytes.next_multiple_of(1 << 20).max(MIN_LOG_BYTES);
        let max_log_bytes = MAX_LOG_BYTES.max(min_log_bytes);
        let log_bytes = log_bytes.unwrap_or((volume_bytes / 16).clamp(MIN_LOG_BYTES, MAX_LOG_BYTES).max(min_log_bytes));
        if log_bytes < min_log_bytes && log_bytes >= MIN_LOG_BYTES {
            return Err(Error::invalid(format!(
                "a log of {} MiB is too small for a volume of {} MiB: at least {} MiB (a checkpoint must hold the whole block bitmap)",
                log_bytes >> 20,
                volume_bytes >> 20,
                min_log_bytes >> 20
            )));
        }
        if !(min_log_bytes..=max_log_bytes).contains(&log_bytes) || log_bytes > volume_bytes / 2 {
            return Err(Error::invalid(format!(
                "log size {log_bytes} bytes must be between {} MiB, {} MiB and half the volume",
                min_log_bytes >> 20,
                max_log_bytes >> 20
            )));
        }
        let log_blocks = log_bytes / BLOCK_SIZE_U64;
        // One 64-byte header per record; metadata records are small, so an eighth of the log
        // for headers leaves room for about as many records as the data ring can hold.
        let log_header_blocks = (log_blocks / 8).max(16);
        let split = LogSplit::of(log_blocks - log_header_blocks);
        let inode_count = inode_count.unwrap_or(volume_bytes / (16 << 10));
        let inode_count = inode_count.max(INODES_PER_BLOCK).div_ceil(INODES_PER_BLOCK) * INODES_PER_BLOCK;
        let inode_table_blocks = inode_count / INODES_PER_BLOCK;
        let block_bitmap_blocks = block_count.div_ceil(BITS_PER_BITMAP_BLOCK);
        let inode_bitmap_blocks = inode_count.div_ceil(BITS_PER_BITMAP_BLOCK);
        let log_header_start = 2;
        let log_data_start = log_header_start + log_header_blocks;
        let log_data_blocks = split.record_data_blocks;
        let image_log_header_start = log_data_start + log_data_blocks;
        let image_log_data_start = image_log_header_start + split.image_header_blocks;
        let block_bitmap_start = image_log_data_start + split.image_data_blocks;
        let inode_bitmap_start = block_bitmap_start + block_bitmap_blocks;
        let inode_table_start = inode_bitmap_start + inode_bitmap_blocks;
        let mmp_block = inode_table_start + inode_table_blocks;
        let key_slot_start = mmp_block + 1;
        let generation_table_start = key_slot_start + key_slot_blocks;
        let generation_table_blocks = generation_table_blocks(block_count);
        let checksum_table_start = generation_table_start + generation_table_blocks;
        let checksum_table_blocks = checksum_table_blocks(block_count);
        let first_data_block = checksum_table_start + checksum_table_blocks;
        // Leave at least 1/8 of the volume for data and directories.
        if first_data_block.saturating_add(block_count / 8) > block_count {
            return Err(Error::invalid(format!(
                "{inode_count} inodes and a {log_bytes}-byte log leave too little room for data on a {volume_bytes}-byte volume"
            )));
        }
        Ok(Superblock {
            format_version: FORMAT_VERSION,
            sequence: 1,
            block_count,
            uuid: [0; 16],
            hash_seed: [0; 4],
            features_compat: 0,
            features_incompat: if key_slot_blocks > 0 { FEATURE_INCOMPAT_ENCRYPTED } else { 0 },
            features_ro_compat: 0,
            log_header_start,
            log_header_blocks,
            log_data_start,
            log_data_blocks,
            block_bitmap_start,
            block_bitmap_blocks,
            inode_bitmap_start,
            inode_bitmap_blocks,
            inode_table_start,
            inode_table_blocks,
            inode_count,
            first_data_block,
            log_tail_lsn: 1,
            log_tail_data_position: 0,
            checkpoint_lsn: 0,
            orphan_head: 0,
            next_generation: 1,
            state: STATE_CLEAN,
            format_time_ns: 0,
            mount_time_ns: 0,
            checkpoint_time_ns: 0,
            mount_count: 0,
            checkpoint_count: 0,
            free_blocks: block_count - first_data_block,
            free_inodes: inode_count,
            inode_table_initialized_blocks: 0,
            mmp_block,
            mmp_interval_ms: crate::block::mmp::DEFAULT_INTERVAL_MS,
            generation_table_start,
            generation_table_blocks,
            metadata_generation: 0,
            checksum_table_start,
            checksum_table_blocks,
            key_slot_start,
            key_slot_blocks,
            image_log_header_start,
            image_log_header_blocks: split.image_header_blocks,
            image_log_data_start,
            image_log_data_blocks: split.image_data_blocks,
            image_log_tail_lsn: crate::log::LogPosition::START.lsn,
            image_log_tail_data_position: crate::log::LogPosition::START.data_position,
        })
    }

    /// Takes a volume of a version before 9 to version 9's geometry: the second half of the
    /// record log's data ring becomes the image log (`LogSplit`), which starts empty. Only for a
    /// log with nothing after its tail (replayed and checkpointed): the record log's positions
    /// go on from the tail, and no payload before it is read again. The caller formats the image
    /// log's header ring before it writes this superblock.
    pub fn split_log_for_images(&mut self) {
        assert!(self.format_version < IMAGE_LOG_VERSION, "version {} has an image log", self.format_version);
        assert!(self.image_log_header_blocks == 0 && self.image_log_data_blocks == 0);
        let split = LogSplit::of(self.log_data_blocks);
        self.log_data_blocks = split.record_data_blocks;
        self.image_log_header_start = self.log_data_start + split.record_data_blocks;
        self.image_log_header_blocks = split.image_header_blocks;
        self.image_log_data_start = self.image_log_header_start + split.image_header_blocks;
        self.image_log_data_blocks = split.image_data_blocks;
        self.image_log_tail_lsn = crate::log::LogPosition::START.lsn;
        self.image_log_tail_data_position = crate::log::LogPosition::START.data_position;
        // The log is empty, so nothing in it predates what later versions add (an insert-of-data
        // record, version 10).
        self.format_version = FORMAT_VERSION;
    }

    /// Blocks of both logs, the image log included.
    pub fn log_blocks(&self) -> u64 {
        self.log_header_blocks + self.log_data_blocks + self.image_log_header_blocks + self.image_log_data_blocks
    }

    /// Whether checkpoint images go to an image log of their own (version 9 on) or into the
    /// record log, as before.
    pub fn has_image_log(&self) -> bool {
        self.format_version >= IMAGE_LOG_VERSION
    }

    pub fn encode(&self) -> Box<[u8; BLOCK_SIZE]> {
        let mut block = Box::new([0u8; BLOCK_SIZE]);
        let bytes = &mut block[..];
        bytes[OFFSET_MAGIC..OFFSET_MAGIC + 8].copy_from_slice(&MAGIC);
        put_u32(bytes, OFFSET_VERSION, self.format_version);
        put_u32(bytes, OFFSET_BLOCK_SIZE, BLOCK_SIZE as u32);
        put_u64(bytes, OFFSET_SEQUENCE, self.sequence);
        put_u64(bytes, OFFSET_BLOCK_COUNT, self.block_count);
        bytes[OFFSET_UUID..OFFSET_UUID + 16].copy_from_slice(&self.uuid);
        for (index, word) in self.hash_seed.iter().enumerate() {
            put_u32(bytes, OFFSET_HASH_SEED + 4 * index, *word);
        }
        put_u64(bytes, OFFSET_FEATURES_COMPAT, self.features_compat);
        put_u64(bytes, OFFSET_FEATURES_INCOMPAT, self.features_incompat);
        put_u64(bytes, OFFSET_FEATURES_RO_COMPAT, self.features_ro_compat);
        put_u64(bytes, OFFSET_LOG_HEADER_START, self.log_header_start);
        put_u64(bytes, OFFSET_LOG_HEADER_BLOCKS, self.log_header_blocks);
        put_u64(bytes, OFFSET_LOG_DATA_START, self.log_data_start);
        put_u64(bytes, OFFSET_LOG_DATA_BLOCKS, self.log_data_blocks);
        put_u64(bytes, OFFSET_BLOCK_BITMAP_START, self.block_bitmap_start);
        put_u64(bytes, OFFSET_BLOCK_BITMAP_BLOCKS, self.block_bitmap_blocks);
        put_u64(bytes, OFFSET_INODE_BITMAP_START, self.inode_bitmap_start);
        put_u64(bytes, OFFSET_INODE_BITMAP_BLOCKS, self.inode_bitmap_blocks);
        put_u64(bytes, OFFSET_INODE_TABLE_START, self.inode_table_start);
        put_u64(bytes, OFFSET_INODE_TABLE_BLOCKS, self.inode_table_blocks);
        put_u64(bytes, OFFSET_INODE_COUNT, self.inode_count);
        put_u64(bytes, OFFSET_FIRST_DATA_BLOCK, self.first_data_block);
        put_u64(bytes, OFFSET_LOG_TAIL_LSN, self.log_tail_lsn);
        put_u64(bytes, OFFSET_LOG_TAIL_DATA_POSITION, self.log_tail_data_position);
        put_u64(bytes, OFFSET_CHECKPOINT_LSN, self.checkpoint_lsn);
        put_u64(bytes, OFFSET_ORPHAN_HEAD, self.orphan_head);
        put_u64(bytes, OFFSET_NEXT_GENERATION, self.next_generation);
        put_u32(bytes, OFFSET_STATE, self.state);
        put_i64(bytes, OFFSET_FORMAT_TIME, self.format_time_ns);
        put_i64(bytes, OFFSET_MOUNT_TIME, self.mount_time_ns);
        put_i64(bytes, OFFSET_CHECKPOINT_TIME, self.checkpoint_time_ns);
        put_u64(bytes, OFFSET_MOUNT_COUNT, self.mount_count);
        put_u64(bytes, OFFSET_CHECKPOINT_COUNT, self.checkpoint_count);
        put_u64(bytes, OFFSET_FREE_BLOCKS, self.free_blocks);
        put_u64(bytes, OFFSET_FREE_INODES, self.free_inodes);
        put_u64(bytes, OFFSET_INODE_TABLE_INITIALIZED_BLOCKS, self.inode_table_initialized_blocks);
        put_u64(bytes, OFFSET_MMP_BLOCK, self.mmp_block);
        put_u32(bytes, OFFSET_MMP_INTERVAL_MS, self.mmp_interval_ms);
        put_u64(bytes, OFFSET_GENERATION_TABLE_START, self.generation_table_start);
        put_u64(bytes, OFFSET_GENERATION_TABLE_BLOCKS, self.generation_table_blocks);
        put_u64(bytes, OFFSET_METADATA_GENERATION, self.metadata_generation);
        put_u64(bytes, OFFSET_CHECKSUM_TABLE_START, self.checksum_table_start);
        put_u64(bytes, OFFSET_CHECKSUM_TABLE_BLOCKS, self.checksum_table_blocks);
        put_u64(bytes, OFFSET_KEY_SLOT_START, self.key_slot_start);
        put_u64(bytes, OFFSET_KEY_SLOT_BLOCKS, self.key_slot_blocks);
        put_u64(bytes, OFFSET_IMAGE_LOG_HEADER_START, self.image_log_header_start);
        put_u64(bytes, OFFSET_IMAGE_LOG_HEADER_BLOCKS, self.image_log_header_blocks);
        put_u64(bytes, OFFSET_IMAGE_LOG_DATA_START, self.image_log_data_start);
        put_u64(bytes, OFFSET_IMAGE_LOG_DATA_BLOCKS, self.image_log_data_blocks);
        put_u64(bytes, OFFSET_IMAGE_LOG_TAIL_LSN, self.image_log_tail_lsn);
        put_u64(bytes, OFFSET_IMAGE_LOG_TAIL_DATA_POSITION, self.image_log_tail_data_position);
        let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
        put_u32(bytes, OFFSET_CRC, crc);
        block
    }

    /// Decodes and validates one copy. `device_blocks` is the device size in blocks.
    pub fn decode(bytes: &[u8; BLOCK_SIZE], copy: u64, device_blocks: u64) -> Result<Superblock> {
        let bytes = &bytes[..];
        let fail = |what: String| Err(Error::corruption(format!("superblock copy {copy}: {what}")));
        if bytes[OFFSET_MAGIC..OFFSET_MAGIC + 8] != MAGIC {
            return fail("no tandemfs magic number".into());
        }
        let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
        if crc != get_u32(bytes, OFFSET_CRC) {
            return fail(format!("checksum {:#010x} stored, {crc:#010x} computed", get_u32(bytes, OFFSET_CRC)));
        }
        let version = get_u32(bytes, OFFSET_VERSION);
        if version < OLDEST_READABLE_VERSION {
            return fail(format!(
                "format version {version} is older than this build's {FORMAT_VERSION}; mount it with the tandem that made it and copy the files to a volume made by this build's mkfs"
            ));
        }
        if version > FORMAT_VERSION {
            return fail(format!(
                "format version {version} is newer than this build's {FORMAT_VERSION}; use a newer tandem"
            ));
        }
        if bytes[OFFSET_MMP_INTERVAL_MS + 4..MMP_RESERVED_END].iter().any(|byte| *byte != 0) {
            return fail("reserved multi-mount protection bytes 308..320 are not zero".into());
        }
        if get_u32(bytes, OFFSET_BLOCK_SIZE) != BLOCK_SIZE as u32 {
            return fail(format!("block size {} is not {BLOCK_SIZE}", get_u32(bytes, OFFSET_BLOCK_SIZE)));
        }
        let mut hash_seed = [0u32; 4];
        for (index, word) in hash_seed.iter_mut().enumerate() {
            *word = get_u32(bytes, OFFSET_HASH_SEED + 4 * index);
        }
        let superblock = Superblock {
            format_version: version,
            sequence: get_u64(bytes, OFFSET_SEQUENCE),
            block_count: get_u64(bytes, OFFSET_BLOCK_COUNT),
            uuid: bytes[OFFSET_UUID..OFFSET_UUID + 16].try_into().unwrap(),
            hash_seed,
            features_compat: get_u64(bytes, OFFSET_FEATURES_COMPAT),
            features_incompat: get_u64(bytes, OFFSET_FEATURES_INCOMPAT),
            features_ro_compat: get_u64(bytes, OFFSET_FEATURES_RO_COMPAT),
            log_header_start: get_u64(bytes, OFFSET_LOG_HEADER_START),
            log_header_blocks: get_u64(bytes, OFFSET_LOG_HEADER_BLOCKS),
            log_data_start: get_u64(bytes, OFFSET_LOG_DATA_START),
            log_data_blocks: get_u64(bytes, OFFSET_LOG_DATA_BLOCKS),
            block_bitmap_start: get_u64(bytes, OFFSET_BLOCK_BITMAP_START),
            block_bitmap_blocks: get_u64(bytes, OFFSET_BLOCK_BITMAP_BLOCKS),
            inode_bitmap_start: get_u64(bytes, OFFSET_INODE_BITMAP_START),
            inode_bitmap_blocks: get_u64(bytes, OFFSET_INODE_BITMAP_BLOCKS),
            inode_table_start: get_u64(bytes, OFFSET_INODE_TABLE_START),
            inode_table_blocks: get_u64(bytes, OFFSET_INODE_TABLE_BLOCKS),
            inode_count: get_u64(bytes, OFFSET_INODE_COUNT),
            first_data_block: get_u64(bytes, OFFSET_FIRST_DATA_BLOCK),
            log_tail_lsn: get_u64(bytes, OFFSET_LOG_TAIL_LSN),
            log_tail_data_position: get_u64(bytes, OFFSET_LOG_TAIL_DATA_POSITION),
            checkpoint_lsn: get_u64(bytes, OFFSET_CHECKPOINT_LSN),
            orphan_head: get_u64(bytes, OFFSET_ORPHAN_HEAD),
            next_generation: get_u64(bytes, OFFSET_NEXT_GENERATION),
            state: get_u32(bytes, OFFSET_STATE),
            format_time_ns: get_i64(bytes, OFFSET_FORMAT_TIME),
            mount_time_ns: get_i64(bytes, OFFSET_MOUNT_TIME),
            checkpoint_time_ns: get_i64(bytes, OFFSET_CHECKPOINT_TIME),
            mount_count: get_u64(bytes, OFFSET_MOUNT_COUNT),
            checkpoint_count: get_u64(bytes, OFFSET_CHECKPOINT_COUNT),
            free_blocks: get_u64(bytes, OFFSET_FREE_BLOCKS),
            free_inodes: get_u64(bytes, OFFSET_FREE_INODES),
            inode_table_initialized_blocks: get_u64(bytes, OFFSET_INODE_TABLE_INITIALIZED_BLOCKS),
            mmp_block: get_u64(bytes, OFFSET_MMP_BLOCK),
            mmp_interval_ms: get_u32(bytes, OFFSET_MMP_INTERVAL_MS),
            generation_table_start: get_u64(bytes, OFFSET_GENERATION_TABLE_START),
            generation_table_blocks: get_u64(bytes, OFFSET_GENERATION_TABLE_BLOCKS),
            metadata_generation: get_u64(bytes, OFFSET_METADATA_GENERATION),
            checksum_table_start: get_u64(bytes, OFFSET_CHECKSUM_TABLE_START),
            checksum_table_blocks: get_u64(bytes, OFFSET_CHECKSUM_TABLE_BLOCKS),
            key_slot_start: get_u64(bytes, OFFSET_KEY_SLOT_START),
            key_slot_blocks: get_u64(bytes, OFFSET_KEY_SLOT_BLOCKS),
            image_log_header_start: get_u64(bytes, OFFSET_IMAGE_LOG_HEADER_START),
            image_log_header_blocks: get_u64(bytes, OFFSET_IMAGE_LOG_HEADER_BLOCKS),
            image_log_data_start: get_u64(bytes, OFFSET_IMAGE_LOG_DATA_START),
            image_log_data_blocks: get_u64(bytes, OFFSET_IMAGE_LOG_DATA_BLOCKS),
            image_log_tail_lsn: get_u64(bytes, OFFSET_IMAGE_LOG_TAIL_LSN),
            image_log_tail_data_position: get_u64(bytes, OFFSET_IMAGE_LOG_TAIL_DATA_POSITION),
        };
        match superblock.validate(device_blocks) {
            Ok(()) => Ok(superblock),
            Err(Error::Corruption { what }) => fail(what),
            Err(other) => Err(other),
        }
    }

    /// Checks that the geometry is self-consistent and fits the device, so that every later
    /// computation from these fields stays in range.
    pub fn validate(&self, device_blocks: u64) -> Result<()> {
        let fail = |what: String| Err(Error::corruption(what));
        if self.features_incompat & !FEATURES_INCOMPAT_KNOWN != 0 {
            return fail(format!(
                "unknown incompatible features {:#x}",
                self.features_incompat & !FEATURES_INCOMPAT_KNOWN
            ));
        }
        if self.block_count > device_blocks {
            return fail(format!(
                "volume of {} blocks is larger than the {device_blocks}-block device",
                self.block_count
            ));
        }
        if self.block_count < MIN_VOLUME_BYTES / BLOCK_SIZE_U64 {
            return fail(format!("volume of {} blocks is below the minimum", self.block_count));
        }
        let image_log = [
            ("image log header ring", self.image_log_header_start, self.image_log_header_blocks),
            ("image log data ring", self.image_log_data_start, self.image_log_data_blocks),
        ];
        if !self.has_image_log() {
            let fields = [self.image_log_tail_lsn, self.image_log_tail_data_position];
            if image_log.iter().any(|(_, start, blocks)| *start != 0 || *blocks != 0) || fields != [0, 0] {
                return fail(format!("version {} names an image log", self.format_version));
            }
        } else if self.image_log_tail_lsn == 0 || self.image_log_tail_lsn >= COUNTER_LIMIT {
            return fail(format!("image log tail {} is not an lsn", self.image_log_tail_lsn));
        }
        let mut regions = vec![
            ("log header ring", self.log_header_start, self.log_header_blocks),
            ("log data ring", self.log_data_start, self.log_data_blocks),
        ];
        if self.has_image_log() {
            regions.extend(image_log);
        }
        regions.extend([
            ("block bitmap", self.block_bitmap_start, self.block_bitmap_blocks),
            ("inode bitmap", self.inode_bitmap_start, self.inode_bitmap_blocks),
            ("inode table", self.inode_table_start, self.inode_table_blocks),
        ]);
        let mut expected_start = 2u64;
        for (name, start, blocks) in regions {
            if start != expected_start || blocks == 0 || blocks > self.block_count {
                return fail(format!("{name} at block {start} with {blocks} blocks does not follow the previous region at {expected_start}"));
            }
            expected_start = start + blocks;
        }
        if self.mmp_block != expected_start {
            return fail(format!("MMP block {} does not follow the inode table at {expected_start}", self.mmp_block));
        }
        if !(crate::block::mmp::MIN_INTERVAL_MS..=crate::block::mmp::MAX_INTERVAL_MS).contains(&self.mmp_interval_ms) {
            return fail(format!("MMP interval {} ms is out of range", self.mmp_interval_ms));
        }
        expected_start += 1;
        let key_slot_blocks_expected = if self.is_encrypted() { crate::crypt::KEY_SLOT_COUNT as u64 } else { 0 };
        if self.key_slot_start != expected_start || self.key_slot_blocks != key_slot_blocks_expected {
            return fail(format!(
                "key-slot region at block {} with {} blocks does not follow the MMP block or is not {key_slot_blocks_expected} blocks for a volume {}",
                self.key_slot_start,
                self.key_slot_blocks,
                if self.is_encrypted() { "marked encrypted" } else { "not marked encrypted" }
            ));
        }
        expected_start += self.key_slot_blocks;
        if self.generation_table_start != expected_start
            || self.generation_table_blocks != generation_table_blocks(self.block_count)
        {
            return fail(format!(
                "generation table at block {} with {} blocks does not follow the key-slot region or cover the volume",
                self.generation_table_start, self.generation_table_blocks
            ));
        }
        expected_start += self.generation_table_blocks;
        if self.checksum_table_start != expected_start
            || self.checksum_table_blocks != checksum_table_blocks(self.block_count)
        {
            return fail(format!(
                "data checksum table at block {} with {} blocks does not follow the generation table or cover the volume",
                self.checksum_table_start, self.checksum_table_blocks
            ));
        }
        expected_start += self.checksum_table_blocks;
        if self.first_data_block != expected_start || self.first_data_block >= self.block_count {
            return fail(format!("first data block {} is not {expected_start}", self.first_data_block));
        }
        if self.block_bitmap_blocks != self.block_count.div_ceil(BITS_PER_BITMAP_BLOCK) {
            return fail(format!(
                "block bitmap of {} blocks does not cover {} blocks",
                self.block_bitmap_blocks, self.block_count
            ));
        }
        if self.inode_count == 0
            || self.inode_count != self.inode_table_blocks * INODES_PER_BLOCK
            || self.inode_bitmap_blocks != self.inode_count.div_ceil(BITS_PER_BITMAP_BLOCK)
        {
            return fail(format!("inode count {} does not match its table and bitmap", self.inode_count));
        }
        if self.inode_table_initialized_blocks > self.inode_table_blocks {
            return fail(format!(
                "{} inode-table blocks are marked initialized in a table of {}",
                self.inode_table_initialized_blocks, self.inode_table_blocks
            ));
        }
        // Counted on from here (a mount adds one to each): a value no volume can reach is damage,
        // and would wrap to 0, making the other copy look newer than this one.
        let counters = [
            ("sequence", self.sequence),
            ("checkpoint lsn", self.checkpoint_lsn),
            ("next generation", self.next_generation),
            ("mount count", self.mount_count),
            ("checkpoint count", self.checkpoint_count),
        ];
        for (name, value) in counters {
            if value >= COUNTER_LIMIT {
                return fail(format!("{name} {value} is past any count a volume reaches"));
            }
        }
        if self.log_tail_lsn == 0 || self.checkpoint_lsn + 1 != self.log_tail_lsn {
            return fail(format!("log tail {} does not follow checkpoint {}", self.log_tail_lsn, self.checkpoint_lsn));
        }
        if self.orphan_head > self.inode_count {
            return fail(format!("orphan list head {} is not an inode", self.orphan_head));
        }
        if self.state != STATE_CLEAN && self.state != STATE_MOUNTED {
            return fail(format!("unknown state {}", self.state));
        }
        Ok(())
    }

    /// Whether the volume is encrypted (`FEATURE_INCOMPAT_ENCRYPTED`).
    pub fn is_encrypted(&self) -> bool {
        self.features_incompat & FEATURE_INCOMPAT_ENCRYPTED != 0
    }

    /// Whether block `block_number` is stored in plaintext on an encrypted volume: the two
    /// superblocks, the MMP block and the key-slot region, which are read before the key is
    /// known or by other mounters that hold no key.
    pub fn is_plaintext_block(&self, block_number: u64) -> bool {
        block_number < 2 || (self.mmp_block..self.key_slot_start + self.key_slot_blocks).contains(&block_number)
    }

    pub fn log_geometry(&self) -> crate::log::LogGeometry {
        crate::log::LogGeometry {
            header_start_byte: self.log_header_start * BLOCK_SIZE_U64,
            header_slots: self.log_header_blocks * (BLOCK_SIZE_U64 / 64),
            data_start_byte: self.log_data_start * BLOCK_SIZE_U64,
            data_bytes: self.log_data_blocks * BLOCK_SIZE_U64,
        }
    }

    /// The image log's rings (version 9 on), `None` before.
    pub fn image_log_geometry(&self) -> Option<crate::log::LogGeometry> {
        self.has_image_log().then(|| crate::log::LogGeometry {
            header_start_byte: self.image_log_header_start * BLOCK_SIZE_U64,
            header_slots: self.image_log_header_blocks * (BLOCK_SIZE_U64 / 64),
            data_start_byte: self.image_log_data_start * BLOCK_SIZE_U64,
            data_bytes: self.image_log_data_blocks * BLOCK_SIZE_U64,
        })
    }

    /// The image log's tail (version 9 on).
    pub fn image_log_tail(&self) -> crate::log::LogPosition {
        crate::log::LogPosition { lsn: self.image_log_tail_lsn, data_position: self.image_log_tail_data_position }
    }

    /// Reads both copies and returns the valid one with the higher sequence number.
    pub fn read_best(device: &dyn Device) -> Result<Superblock> {
        Superblock::read_both(device).map(|copies| copies.best)
    }

    /// Reads both copies: the valid one with the higher sequence number, and what is wrong with
    /// the other, if anything. Every superblock write goes to copy `sequence % 2`, so two healthy
    /// copies are one sequence apart and name the same volume; anything else is worth a word,
    /// because a mount that loses the newer copy would fall back to the other.
    pub fn read_both(device: &dyn Device) -> Result<SuperblockCopies> {
        let device_blocks = device.size_bytes() / BLOCK_SIZE_U64;
        let mut decoded: Vec<std::result::Result<Superblock, String>> = Vec::with_capacity(2);
        let mut torn = [false; 2];
        let mut torn_sequence = [None; 2];
        for copy in 0..2u64 {
            if device.size_bytes() < (copy + 1) * BLOCK_SIZE_U64 {
                decoded.push(Err(format!("superblock copy {copy}: device too small")));
                continue;
            }
            let mut bytes = Box::new([0u8; BLOCK_SIZE]);
            device.read_at(copy * BLOCK_SIZE_U64, &mut bytes[..])?;
            torn[copy as usize] = bytes[OFFSET_MAGIC..OFFSET_MAGIC + 8] == MAGIC
                && tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]) != get_u32(&bytes[..], OFFSET_CRC);
            if torn[copy as usize] {
                torn_sequence[copy as usize] = Some(get_u64(&bytes[..], OFFSET_SEQUENCE));
            }
            decoded.push(Superblock::decode(&bytes, copy, device_blocks).map_err(|error| match error {
                Error::Corruption { what } => what,
                other => other.to_string(),
            }));
        }
        let (first, second) = (decoded.remove(0), decoded.remove(0));
        match (first, second) {
            (Ok(a), Ok(b)) => {
                let (best, best_copy, other, other_copy) =
                    if b.sequence > a.sequence { (b, 1, a, 0) } else { (a, 0, b, 1) };
                let other_problem = if other.uuid != best.uuid {
                    Some(format!(
                        "superblock copy {other_copy} belongs to another volume (uuid differs from copy {best_copy})"
                    ))
                } else if best.sequence != other.sequence + 1 {
                    Some(format!(
                        "superblock copy {other_copy} is stale: sequence {}, copy {best_copy} has {}",
                        other.sequence, best.sequence
                    ))
                } else {
                    None
                };
                Ok(SuperblockCopies { best, best_copy, other_problem, other_torn: false, other_torn_sequence: None })
            }
            (Ok(best), Err(problem)) => Ok(SuperblockCopies {
                best,
                best_copy: 0,
                other_problem: Some(problem),
                other_torn: torn[1],
                other_torn_sequence: torn_sequence[1],
            }),
            (Err(problem), Ok(best)) => Ok(SuperblockCopies {
                best,
                best_copy: 1,
                other_problem: Some(problem),
                other_torn: torn[0],
                other_torn_sequence: torn_sequence[0],
            }),
            (Err(first), Err(second)) => Err(Error::corruption(format!("no valid superblock: {first}; {second}"))),
        }
    }

    /// Writes this superblock into the copy its sequence number selects. The caller flushes.
    pub fn write(&self, device: &dyn Device) -> Result<()> {
        let copy = self.sequence % 2;
        device.write_at(copy * BLOCK_SIZE_U64, &self.encode()[..])
    }
}

/// Both superblock copies as read: the one to use and what is wrong with the other.
#[derive(Debug, Clone)]
pub struct SuperblockCopies {
    pub best: Superblock,
    /// Which copy (0 or 1) `best` came from.
    pub best_copy: u64,
    /// The other copy is invalid, stale or foreign: why, in words. `None` when it is healthy.
    pub other_problem: Option<String>,
    /// The other copy carries the magic number but fails its checksum, as a write torn by a
    /// crash leaves it (zeroed, foreign or random bytes, or a stale copy, are something else).
    pub other_torn: bool,
    /// For a torn other copy: the sequence number its first bytes hold (no checksum vouches for
    /// it). `best.sequence + 1` says the write after `best` began there and was cut short: a
    /// crash during a mount's first superblock write leaves that on a volume marked clean.
    pub other_torn_sequence: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_offsets_fit_and_do_not_overlap() {
        const { assert!(USED_BYTES <= OFFSET_CRC) };
        assert_eq!(OFFSET_INODE_TABLE_INITIALIZED_BLOCKS + 8, OFFSET_MMP_BLOCK);
        assert_eq!(OFFSET_FREE_INODES + 8 + 8, OFFSET_MMP_BLOCK);
        assert_eq!(MMP_RESERVED_END, OFFSET_GENERATION_TABLE_START);
        assert_eq!(OFFSET_METADATA_GENERATION + 8, OFFSET_CHECKSUM_TABLE_START);
        assert_eq!(OFFSET_CHECKSUM_TABLE_BLOCKS + 8, OFFSET_KEY_SLOT_START);
        assert_eq!(OFFSET_KEY_SLOT_BLOCKS + 8, OFFSET_IMAGE_LOG_HEADER_START);
        assert_eq!(BITS_PER_BITMAP_BLOCK, 32_512);
        assert_eq!(GENERATIONS_PER_TABLE_BLOCK, 508);
        assert_eq!(INODES_PER_BLOCK * 256, 3840);
    }

    #[test]
    fn round_trip_and_corruption() {
        let blocks = (64u64 << 20) / BLOCK_SIZE_U64;
        let mut superblock = Superblock::layout(blocks, None, None).unwrap();
        superblock.uuid = [7; 16];
        superblock.hash_seed = [1, 2, 3, 4];
        let bytes = superblock.encode();
        assert_eq!(Superblock::decode(&bytes, 0, blocks).unwrap(), superblock);
        for bit in 0..(USED_BYTES * 8) {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(Superblock::decode(&damaged, 0, blocks).unwrap_err().is_corruption());
        }
    }

    /// A counter no volume reaches, behind a valid checksum, is corruption: a mount adds one to
    /// it, which would overflow (wrapping, the sequence would make the other copy look newer).
    #[test]
    fn counters_past_any_count_are_corruption() {
        let blocks = (64u64 << 20) / BLOCK_SIZE_U64;
        let good = Superblock::layout(blocks, None, None).unwrap();
        good.validate(blocks).unwrap();
        let setters: [fn(&mut Superblock); 5] = [
            |superblock| superblock.sequence = COUNTER_LIMIT,
            |superblock| superblock.checkpoint_lsn = u64::MAX,
            |superblock| superblock.next_generation = u64::MAX,
            |superblock| superblock.mount_count = COUNTER_LIMIT,
            |superblock| superblock.checkpoint_count = u64::MAX,
        ];
        for set in setters {
            let mut superblock = good.clone();
            set(&mut superblock);
            let error = superblock.validate(blocks).unwrap_err();
            assert!(error.is_corruption() && error.to_string().contains("past any count"), "{error}");
        }
    }

    #[test]
    fn an_older_format_version_is_named() {
        let blocks = (64u64 << 20) / BLOCK_SIZE_U64;
        let mut bytes = Superblock::layout(blocks, None, None).unwrap().encode();
        for version in [1, 2, 3, 4] {
            put_u32(&mut bytes[..], OFFSET_VERSION, version);
            let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
            put_u32(&mut bytes[..], OFFSET_CRC, crc);
            let error = Superblock::decode(&bytes, 0, blocks).unwrap_err().to_string();
            assert!(
                error.contains(&format!("format version {version} is older than this build's {FORMAT_VERSION}")),
                "{error}"
            );
        }
    }

    /// The layout a version-8 mkfs made: the image log's blocks in the record log's data ring.
    fn version_8_layout(blocks: u64) -> Superblock {
        let mut superblock = Superblock::layout(blocks, None, None).unwrap();
        superblock.log_data_blocks += superblock.image_log_header_blocks + superblock.image_log_data_blocks;
        superblock.image_log_header_start = 0;
        superblock.image_log_header_blocks = 0;
        superblock.image_log_data_start = 0;
        superblock.image_log_data_blocks = 0;
        superblock.image_log_tail_lsn = 0;
        superblock.image_log_tail_data_position = 0;
        superblock.format_version = 8;
        superblock
    }

    #[test]
    fn versions_5_to_8_are_read_as_they_are_and_split_to_version_9() {
        let blocks = (64u64 << 20) / BLOCK_SIZE_U64;
        let version_9 = Superblock::layout(blocks, None, None).unwrap();
        for old in [5, 6, 7, 8] {
            let mut superblock = version_8_layout(blocks);
            superblock.format_version = old;
            let decoded = Superblock::decode(&superblock.encode(), 0, blocks).unwrap();
            assert_eq!(decoded.format_version, old);
            assert!(!decoded.has_image_log() && decoded.image_log_geometry().is_none());
            assert_eq!(get_u32(&decoded.encode()[..], OFFSET_VERSION), old);
            // The split gives exactly the rings a version-9 mkfs makes.
            let mut split = decoded;
            split.split_log_for_images();
            assert_eq!(split, Superblock { format_version: FORMAT_VERSION, ..version_9.clone() });
            assert_eq!(Superblock::decode(&split.encode(), 0, blocks).unwrap(), split);
        }
        // An older version naming an image log is damage.
        let mut bytes = version_9.encode();
        put_u32(&mut bytes[..], OFFSET_VERSION, 8);
        let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
        put_u32(&mut bytes[..], OFFSET_CRC, crc);
        let error = Superblock::decode(&bytes, 0, blocks).unwrap_err().to_string();
        assert!(error.contains("version 8 names an image log"), "{error}");
        put_u32(&mut bytes[..], OFFSET_VERSION, 11);
        let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
        put_u32(&mut bytes[..], OFFSET_CRC, crc);
        let error = Superblock::decode(&bytes, 0, blocks).unwrap_err().to_string();
        assert!(error.contains("format version 11 is newer than this build's 10"), "{error}");
        // Version 9 (an image log, no insert-of-data record) is read as it is.
        let mut bytes = version_9.encode();
        put_u32(&mut bytes[..], OFFSET_VERSION, 9);
        let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
        put_u32(&mut bytes[..], OFFSET_CRC, crc);
        let decoded = Superblock::decode(&bytes, 0, blocks).unwrap();
        assert!(decoded.format_version == 9 && decoded.has_image_log());
    }

    #[test]
    fn the_log_holds_the_whole_block_bitmap() {
        for volume_bytes in [64u64 << 20, 12 << 30, 64 << 30, 4 << 40, 16 << 40] {
            let blocks = volume_bytes / BLOCK_SIZE_U64;
            let superblock = Superblock::layout(blocks, None, None).unwrap();
            let log_blocks = superblock.log_blocks();
            assert!(log_blocks >= LOG_BLOCKS_PER_BITMAP_BLOCK * superblock.block_bitmap_blocks, "{volume_bytes}");
            // One checkpoint's images: the whole bitmap, and as much again of other dirt.
            assert!(superblock.image_log_data_blocks >= 3 * superblock.block_bitmap_blocks, "{volume_bytes}");
            let expected_default = (volume_bytes / 16).clamp(MIN_LOG_BYTES, MAX_LOG_BYTES);
            assert!(log_blocks * BLOCK_SIZE_U64 >= expected_default, "{volume_bytes}");
        }
        // 16 TiB: the default log grows past MAX_LOG_BYTES to hold the bitmap.
        let superblock = Superblock::layout((16u64 << 40) / BLOCK_SIZE_U64, None, None).unwrap();
        assert!(superblock.log_blocks() * BLOCK_SIZE_U64 > MAX_LOG_BYTES);
        let error = Superblock::layout((64u64 << 30) / BLOCK_SIZE_U64, None, Some(16 << 20)).unwrap_err().to_string();
        assert!(error.contains("a log of 16 MiB is too small for a volume of 65536 MiB: at least 17 MiB"), "{error}");
    }

    #[test]
    fn generation_table_size() {
        // 16 MiB: 4096 blocks, 9 level-0 blocks and the top.
        assert_eq!(generation_table_levels(4096), vec![(0, 9), (9, 1)]);
        // 1 TiB: 2^28 blocks, 528,417 + 1,041 + 3 + 1 blocks: about 2 GiB, 0.2% of the volume,
        // written lazily (a block no checkpoint wrote is not read).
        let levels = generation_table_levels(1 << 28);
        assert_eq!(levels.iter().map(|(_, blocks)| *blocks).collect::<Vec<_>>(), vec![528_417, 1_041, 3, 1]);
        assert_eq!(generation_table_blocks(1), 1);
    }

    #[test]
    fn checksum_table_size() {
        // 16 MiB: 4096 blocks, 5 table blocks right after the generation table.
        assert_eq!(checksum_table_blocks(4096), 5);
        let superblock = Superblock::layout(4096, None, None).unwrap();
        assert_eq!(superblock.checksum_table_start, superblock.generation_table_start + 10);
        assert_eq!(superblock.first_data_block, superblock.checksum_table_start + 5);
        // 1 TiB: 2^28 blocks, 264,209 table blocks (about 1 GiB, 0.1% of the volume).
        assert_eq!(checksum_table_blocks(1 << 28), 264_209);
    }

    #[test]
    fn encrypted_layout_places_the_key_slots_after_the_mmp_block() {
        let plain = Superblock::layout(4096, None, None).unwrap();
        let slots = crate::crypt::KEY_SLOT_COUNT as u64;
        let mut encrypted = Superblock::layout_with_key_slots(4096, None, None, slots).unwrap();
        assert!(encrypted.is_encrypted() && !plain.is_encrypted());
        assert_eq!(encrypted.key_slot_start, encrypted.mmp_block + 1);
        assert_eq!(encrypted.generation_table_start, plain.generation_table_start + slots);
        assert_eq!(encrypted.first_data_block, plain.first_data_block + slots);
        let plaintext: Vec<u64> =
            (0..encrypted.first_data_block).filter(|b| encrypted.is_plaintext_block(*b)).collect();
        let expected: Vec<u64> =
            [0, 1].into_iter().chain(encrypted.mmp_block..encrypted.mmp_block + 1 + slots).collect();
        assert_eq!(plaintext, expected);
        let bytes = encrypted.encode();
        assert_eq!(Superblock::decode(&bytes, 0, 4096).unwrap(), encrypted);
        // The bit without the slots, or slots without the bit, is corruption.
        encrypted.features_incompat = 0;
        assert!(encrypted.validate(4096).unwrap_err().is_corruption());
        let mut plain_with_bit = plain.clone();
        plain_with_bit.features_incompat = FEATURE_INCOMPAT_ENCRYPTED;
        assert!(plain_with_bit.validate(4096).unwrap_err().is_corruption());
        plain_with_bit.features_incompat = 2;
        assert!(plain_with_bit.validate(4096).unwrap_err().to_string().contains("unknown incompatible features 0x2"));
    }

    #[test]
    fn layout_rejects_tiny_volumes() {
        assert!(Superblock::layout(100, None, None).is_err());
        assert!(Superblock::layout(4096, Some(1 << 30), None).is_err());
    }
}
