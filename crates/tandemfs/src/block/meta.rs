//! The interface between the block layer and the structures built from blocks (`dir`, `extent`).
//!
//! Every metadata block is 4 KiB and ends in a 32-byte trailer that the block layer owns:
//!
//! | offset | size | name         | meaning                                                      |
//! |--------|------|--------------|--------------------------------------------------------------|
//! | 4064   | 4    | kind         | [`BlockKind`] of the block, checked on every read            |
//! | 4068   | 4    | crc32c       | CRC32C of the whole block with this field zeroed             |
//! | 4072   | 8    | block_number | the block's own address, catches misdirected writes          |
//! | 4080   | 8    | generation   | the checkpoint that wrote the block home, catches stale ones |
//! | 4088   | 8    | reserved     | zero                                                         |
//!
//! Structures use bytes `0..META_PAYLOAD_BYTES` and never touch the trailer: the volume seals
//! it when a checkpoint takes the block's image, `read_meta` checks it (the generation against
//! the generation table, `block::volume`) and turns any mismatch into `Error::Corruption`.

use crate::error::{Error, Result};

pub const BLOCK_SIZE: usize = 4096;
pub const BLOCK_SIZE_U64: u64 = BLOCK_SIZE as u64;
/// Version 3 grew the trailer from 16 to 32 bytes for the generation. Every layout inside a
/// metadata block (directory slots and index fanout, extent node fanout, inodes and bitmap
/// bits per block, xattr blocks, the generation table) derives from `META_PAYLOAD_BYTES`.
pub const TRAILER_BYTES: usize = 32;
/// Bytes of a metadata block a structure may use.
pub const META_PAYLOAD_BYTES: usize = BLOCK_SIZE - TRAILER_BYTES;
pub const TRAILER_KIND_OFFSET: usize = META_PAYLOAD_BYTES;
pub const TRAILER_CRC_OFFSET: usize = TRAILER_KIND_OFFSET + 4;
pub const TRAILER_BLOCK_OFFSET: usize = TRAILER_CRC_OFFSET + 4;
pub const TRAILER_GENERATION_OFFSET: usize = TRAILER_BLOCK_OFFSET + 8;
pub const TRAILER_RESERVED_OFFSET: usize = TRAILER_GENERATION_OFFSET + 8;
const _: () = assert!(TRAILER_RESERVED_OFFSET + 8 == BLOCK_SIZE);
const _: () = assert!(META_PAYLOAD_BYTES.is_multiple_of(16));

/// A whole 4 KiB block in memory.
pub type BlockBuf = Box<[u8; BLOCK_SIZE]>;

/// A metadata block shared between the block cache, the operations reading it and checkpoint
/// images: handing one out costs a reference count, not a 4 KiB copy. A writer copies only
/// when the block is shared (`Arc::make_mut`), so a change never shows through another holder.
pub type SharedBlock = std::sync::Arc<BlockBuf>;

pub fn zeroed_block() -> BlockBuf {
    Box::new([0u8; BLOCK_SIZE])
}

/// What a metadata block holds. The value is stored in the trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BlockKind {
    BlockBitmap = 0x424D_4150,     // "BMAP"
    InodeBitmap = 0x494D_4150,     // "IMAP"
    InodeTable = 0x494E_4F44,      // "INOD"
    DirLeaf = 0x444C_4541,         // "DLEA"
    DirIndex = 0x4449_4458,        // "DIDX"
    ExtentLeaf = 0x454C_4541,      // "ELEA"
    ExtentInternal = 0x4549_4E54,  // "EINT"
    Xattr = 0x5841_5454,           // "XATT"
    GenerationTable = 0x4754_4142, // "GTAB"
    DataChecksum = 0x4443_534D,    // "DCSM"
}

impl BlockKind {
    pub const ALL: [BlockKind; 10] = [
        BlockKind::BlockBitmap,
        BlockKind::InodeBitmap,
        BlockKind::InodeTable,
        BlockKind::DirLeaf,
        BlockKind::DirIndex,
        BlockKind::ExtentLeaf,
        BlockKind::ExtentInternal,
        BlockKind::Xattr,
        BlockKind::GenerationTable,
        BlockKind::DataChecksum,
    ];
    pub fn from_u32(value: u32) -> Option<BlockKind> {
        BlockKind::ALL.iter().copied().find(|kind| *kind as u32 == value)
    }
}

/// Fills the trailer of `block` for address `block_number`, keeping the generation the trailer
/// already holds (a block never sealed holds 0). Checkpoints use `seal_block_generation`.
pub fn seal_block(block: &mut [u8; BLOCK_SIZE], kind: BlockKind, block_number: u64) {
    let generation = block_generation(block);
    seal_block_generation(block, kind, block_number, generation);
}

/// Fills the trailer of `block` for address `block_number`, written home by checkpoint
/// `generation`.
pub fn seal_block_generation(block: &mut [u8; BLOCK_SIZE], kind: BlockKind, block_number: u64, generation: u64) {
    block[TRAILER_KIND_OFFSET..TRAILER_KIND_OFFSET + 4].copy_from_slice(&(kind as u32).to_le_bytes());
    block[TRAILER_GENERATION_OFFSET..TRAILER_GENERATION_OFFSET + 8].copy_from_slice(&generation.to_le_bytes());
    block[TRAILER_RESERVED_OFFSET..TRAILER_RESERVED_OFFSET + 8].copy_from_slice(&[0; 8]);
    block[TRAILER_CRC_OFFSET..TRAILER_CRC_OFFSET + 4].copy_from_slice(&[0; 4]);
    block[TRAILER_BLOCK_OFFSET..TRAILER_BLOCK_OFFSET + 8].copy_from_slice(&block_number.to_le_bytes());
    let crc = tandem_accel::crc32c(0, &block[..]);
    block[TRAILER_CRC_OFFSET..TRAILER_CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Checks the trailer of a block read from address `block_number`, expecting `kind`.
pub fn verify_block(block: &[u8; BLOCK_SIZE], kind: BlockKind, block_number: u64) -> Result<()> {
    let stored_crc = u32::from_le_bytes(block[TRAILER_CRC_OFFSET..TRAILER_CRC_OFFSET + 4].try_into().unwrap());
    let mut crc = tandem_accel::crc32c(0, &block[..TRAILER_CRC_OFFSET]);
    crc = tandem_accel::crc32c(crc, &[0; 4]);
    crc = tandem_accel::crc32c(crc, &block[TRAILER_BLOCK_OFFSET..]);
    if crc != stored_crc {
        return Err(Error::corruption(format!(
            "metadata block {block_number}: checksum {stored_crc:#010x} stored, {crc:#010x} computed"
        )));
    }
    let stored_kind = u32::from_le_bytes(block[TRAILER_KIND_OFFSET..TRAILER_KIND_OFFSET + 4].try_into().unwrap());
    if stored_kind != kind as u32 {
        let found = BlockKind::from_u32(stored_kind).map(|k| format!("{k:?}")).unwrap_or(format!("{stored_kind:#x}"));
        return Err(Error::corruption(format!(
            "metadata block {block_number}: expected a {kind:?} block, found {found}"
        )));
    }
    let stored_number = u64::from_le_bytes(block[TRAILER_BLOCK_OFFSET..TRAILER_BLOCK_OFFSET + 8].try_into().unwrap());
    if stored_number != block_number {
        return Err(Error::corruption(format!(
            "metadata block {block_number}: trailer names block {stored_number} (misdirected write)"
        )));
    }
    if block[TRAILER_RESERVED_OFFSET..].iter().any(|byte| *byte != 0) {
        return Err(Error::corruption(format!("metadata block {block_number}: reserved trailer bytes are not zero")));
    }
    Ok(())
}

/// What the generation table records for a block that holds file data (no checkpoint
/// generation ever reaches it): a metadata read of such a block fails its generation check,
/// and the allocator never hands it out.
pub const GENERATION_DATA: u64 = u64::MAX;

/// The generation stored in a block's trailer (not checked: see `verify_generation`).
pub fn block_generation(block: &[u8; BLOCK_SIZE]) -> u64 {
    u64::from_le_bytes(block[TRAILER_GENERATION_OFFSET..TRAILER_GENERATION_OFFSET + 8].try_into().unwrap())
}

/// Checks a block that passed `verify_block` against the generation whatever refers to it
/// expects: an older (or newer) valid block is what a lost or misplaced write leaves behind,
/// and is corruption, not the truth.
pub fn verify_generation(block: &[u8; BLOCK_SIZE], kind: BlockKind, block_number: u64, expected: u64) -> Result<()> {
    let stored = block_generation(block);
    if expected == GENERATION_DATA {
        return Err(Error::corruption(format!(
            "{kind:?} block {block_number}: the generation table records file data there, not metadata"
        )));
    }
    if stored != expected {
        return Err(Error::corruption(format!(
            "{kind:?} block {block_number}: generation {stored} stored, {expected} expected (a stale block: a write was lost)"
        )));
    }
    Ok(())
}

/// Metadata block access for the structures above the block layer. Implemented by the block
/// cache for a volume, and by simple maps in unit tests.
///
/// `read_meta` returns a shared block; a caller that changes it takes its own copy
/// (`Arc::make_mut`) and hands it to `write_meta`, which keeps it without copying. A write is
/// visible to the next read at once and reaches the device at the next checkpoint.
pub trait MetaStore {
    fn read_meta(&mut self, block_number: u64, kind: BlockKind) -> Result<SharedBlock>;
    fn write_meta(&mut self, block_number: u64, kind: BlockKind, block: SharedBlock) -> Result<()>;
    /// Allocates one block for metadata, preferably near `near` (0: no preference).
    fn allocate_meta(&mut self, near: u64) -> Result<u64>;
    /// Frees a metadata block. The block is not reused before the change is checkpointed.
    fn free_meta(&mut self, block_number: u64) -> Result<()>;
    /// A decoded form of `block` (what `read_meta` or `write_meta` of `block_number` saw) that
    /// this store keeps, if any (the extent tree's entries: a node read again unchanged is not
    /// decoded again). Only for the very same buffer (`Arc::ptr_eq`): a block that changed is
    /// a new buffer, so a decoded form can never describe other bytes. None by default.
    fn decoded(&mut self, _block_number: u64, _block: &SharedBlock) -> Option<Decoded> {
        None
    }
    /// Keeps `decoded` as the decoded form of `block` (see `decoded`); by default nothing.
    fn keep_decoded(&mut self, _block_number: u64, _block: &SharedBlock, _decoded: Decoded) {}
    /// Drops the decoded form kept for `block_number`, if any: the extent tree is about to
    /// change the node and takes the entries over instead of copying them. By default nothing
    /// (the tree then copies).
    fn forget_decoded(&mut self, _block_number: u64) {}
    /// The caller is about to change `block`, which `read_meta(block_number)` returned, and
    /// will give it back by `write_meta` or fail the store's whole work. A store that holds this
    /// very buffer (`Arc::ptr_eq`) only for itself may let go of it, so that the change copies
    /// nothing. By default nothing (the change copies).
    fn release_for_change(&mut self, _block_number: u64, _block: &SharedBlock) {}
}

/// A decoded metadata block as a store keeps it (`MetaStore::decoded`); its owner downcasts.
pub type Decoded = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// File data block access for `extent`. Data blocks carry no trailer: whole 4 KiB of payload.
pub trait DataStore {
    /// Reads `buffer.len()` bytes starting at byte `offset_in_block` of data block `block_number`;
    /// the range may run on into the following blocks.
    fn read_data(&mut self, block_number: u64, offset_in_block: usize, buffer: &mut [u8]) -> Result<()>;
    fn write_data(&mut self, block_number: u64, offset_in_block: usize, data: &[u8]) -> Result<()>;
    /// Writes `data` from the first byte of data block `block_number` on, and zeros after it to
    /// the end of its last block: for blocks the caller has just been handed by `allocate_data`,
    /// whose other bytes nothing maps, so that no old byte has to be read (a write of part of a
    /// block reads the rest for its checksum). By default a write of the bytes and the zeros.
    fn write_fresh(&mut self, block_number: u64, data: &[u8]) -> Result<()> {
        let tail = data.len().next_multiple_of(BLOCK_SIZE) - data.len();
        self.write_data(block_number, 0, data)?;
        if tail > 0 {
            let last = block_number + (data.len() / BLOCK_SIZE) as u64;
            self.write_data(last, data.len() % BLOCK_SIZE, &vec![0u8; tail])?;
        }
        Ok(())
    }
    /// Copies `length` bytes at `offset_in_block` of data block `from_block` to the same place
    /// in data block `to_block` (a cut inside a block moves part of it to a block of its own).
    /// A store that checks data may carry damage in the source over to the copy instead of
    /// failing (see `Volume`); by default a read and a write.
    fn copy_data(&mut self, from_block: u64, to_block: u64, offset_in_block: usize, length: usize) -> Result<()> {
        let mut bytes = vec![0u8; length];
        self.read_data(from_block, offset_in_block, &mut bytes)?;
        self.write_data(to_block, offset_in_block, &bytes)
    }
    /// Allocates up to `count` contiguous data blocks, preferably starting at `near`; returns
    /// (first block, blocks given), at least one block, or `Error::NoSpace`.
    fn allocate_data(&mut self, near: u64, count: u64) -> Result<(u64, u64)>;
    /// Frees `count` data blocks from `first`. Not reused before the change is checkpointed.
    fn free_data(&mut self, first: u64, count: u64) -> Result<()>;
    /// The references recorded for data block `block_number` (format version 8, docs/EXTENTS.md
    /// *Shared blocks*): 0 when the block is not marked shared (the one extent that touches it
    /// owns it alone), n ≥ 1 when it is marked shared and n extents of its file touch it.
    fn shared_references(&mut self, block_number: u64) -> Result<u64>;
    /// Records `references` for data block `block_number` (see `shared_references`); at most
    /// `MAX_SHARED_REFERENCES`.
    fn set_shared_references(&mut self, block_number: u64, references: u64) -> Result<()>;
    /// The free room of the block that file `file` packs small runs into: (block, bytes used).
    /// Kept in memory only: it is a place to put bytes, never needed to read them, and after a
    /// restart a new pack block is started. A store that keeps none makes nothing pack.
    fn pack_room(&mut self, _file: u64) -> Option<(u64, u64)> {
        None
    }
    /// Records (or with None forgets) file `file`'s pack room.
    fn set_pack_room(&mut self, _file: u64, _room: Option<(u64, u64)>) {}
    /// Forgets any pack room in blocks `first..first + count`, which are being freed.
    fn forget_pack_room(&mut self, _first: u64, _count: u64) {}
}

/// The pack rooms of the files (`DataStore::pack_room`), by file and by block.
#[derive(Default)]
pub struct PackRooms {
    by_file: std::collections::HashMap<u64, (u64, u64)>,
    by_block: std::collections::BTreeMap<u64, u64>,
}

impl PackRooms {
    pub fn get(&self, file: u64) -> Option<(u64, u64)> {
        self.by_file.get(&file).copied()
    }
    pub fn set(&mut self, file: u64, room: Option<(u64, u64)>) {
        if let Some((block, _)) = self.by_file.remove(&file) {
            self.by_block.remove(&block);
        }
        if let Some((block, used)) = room {
            assert!(used > 0 && used < BLOCK_SIZE_U64);
            // One file per pack block: another file's room there is stale.
            if let Some(other) = self.by_block.insert(block, file) {
                self.by_file.remove(&other);
            }
            self.by_file.insert(file, (block, used));
        }
    }
    pub fn forget(&mut self, first: u64, count: u64) {
        let stale: Vec<u64> =
            self.by_block.range(first..first.saturating_add(count)).map(|(block, _)| *block).collect();
        for block in stale {
            if let Some(file) = self.by_block.remove(&block) {
                self.by_file.remove(&file);
            }
        }
    }
    pub fn clear(&mut self) {
        self.by_file.clear();
        self.by_block.clear();
    }
}

/// Most extents that may share one data block: the generation table keeps the count in the
/// values just below `GENERATION_DATA` (format version 8), far above every metadata generation.
pub const MAX_SHARED_REFERENCES: u64 = 1 << 32;

/// The generation-table value that records `references` (1..=`MAX_SHARED_REFERENCES`) extents
/// sharing a data block; 0 references is `GENERATION_DATA`, a block one extent owns.
pub fn shared_generation(references: u64) -> u64 {
    assert!(references <= MAX_SHARED_REFERENCES);
    GENERATION_DATA - references
}

/// The references a generation-table value records: Some(n) for a data block (0 for
/// `GENERATION_DATA`), None for 0 and metadata generations.
pub fn references_of_generation(generation: u64) -> Option<u64> {
    (generation >= GENERATION_DATA - MAX_SHARED_REFERENCES).then(|| GENERATION_DATA - generation)
}

/// A `MetaStore` + `DataStore` in memory for unit tests of the structures: every block is kept,
/// trailers are sealed and verified as on a volume, and frees of unallocated blocks are caught.
/// With a crash model (`with_crash_model`), frees leave the bytes behind as a device does, and
/// `crash` puts the tree blocks and the allocation back to the last `checkpoint` while the data
/// blocks keep what was written since: replay tests run against that.
#[derive(Default)]
pub struct MemoryStore {
    pub meta: std::collections::HashMap<u64, BlockBuf>,
    pub data: std::collections::HashMap<u64, BlockBuf>,
    pub allocated: std::collections::BTreeSet<u64>,
    /// Shared-block references (`DataStore::shared_references`), absent for 0.
    pub shares: std::collections::HashMap<u64, u64>,
    pub pack_rooms: PackRooms,
    next_block: u64,
    crash_model: bool,
    checkpoint: Option<MemoryStoreCheckpoint>,
}

/// What `MemoryStore::crash` goes back to.
struct MemoryStoreCheckpoint {
    meta: std::collections::HashMap<u64, BlockBuf>,
    allocated: std::collections::BTreeSet<u64>,
    shares: std::collections::HashMap<u64, u64>,
    next_block: u64,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore { next_block: 1, ..Default::default() }
    }

    pub fn with_crash_model() -> MemoryStore {
        MemoryStore { crash_model: true, ..MemoryStore::new() }
    }

    /// Remembers the tree blocks and the allocation, as a checkpoint makes them durable.
    pub fn checkpoint(&mut self) {
        assert!(self.crash_model, "checkpoints need the crash model");
        let (meta, allocated, next_block) = (self.meta.clone(), self.allocated.clone(), self.next_block);
        let shares = self.shares.clone();
        // As a volume's checkpoint: later runs pack into blocks handed out after it.
        self.pack_rooms.clear();
        self.checkpoint = Some(MemoryStoreCheckpoint { meta, allocated, shares, next_block });
    }

    /// Back to the checkpoint's tree blocks and allocation. With `same_blocks` the allocator
    /// hands out the blocks it handed out after the checkpoint again (so replay lands on the
    /// blocks the first run wrote); otherwise it goes on with blocks never used.
    pub fn crash(&mut self, same_blocks: bool) {
        let checkpoint = self.checkpoint.as_ref().expect("a checkpoint was taken");
        self.meta = checkpoint.meta.clone();
        self.allocated = checkpoint.allocated.clone();
        self.shares = checkpoint.shares.clone();
        // Pack rooms live in memory: a restart starts new pack blocks.
        self.pack_rooms.clear();
        if same_blocks {
            self.next_block = checkpoint.next_block;
        }
    }
    fn allocate_one(&mut self) -> u64 {
        let block = self.next_block;
        self.next_block += 1;
        self.allocated.insert(block);
        block
    }
    /// Blocks allocated and not freed.
    pub fn allocated_count(&self) -> usize {
        self.allocated.len()
    }
}

impl MetaStore for MemoryStore {
    fn read_meta(&mut self, block_number: u64, kind: BlockKind) -> Result<SharedBlock> {
        let block = self
            .meta
            .get(&block_number)
            .ok_or_else(|| Error::corruption(format!("block {block_number} never written")))?;
        verify_block(block, kind, block_number)?;
        Ok(std::sync::Arc::new(block.clone()))
    }
    fn write_meta(&mut self, block_number: u64, kind: BlockKind, block: SharedBlock) -> Result<()> {
        assert!(self.allocated.contains(&block_number), "write to unallocated metadata block {block_number}");
        let mut copy: BlockBuf = (*block).clone();
        seal_block(&mut copy, kind, block_number);
        self.meta.insert(block_number, copy);
        Ok(())
    }
    fn allocate_meta(&mut self, _near: u64) -> Result<u64> {
        Ok(self.allocate_one())
    }
    fn free_meta(&mut self, block_number: u64) -> Result<()> {
        assert!(self.allocated.remove(&block_number), "double free of metadata block {block_number}");
        if !self.crash_model {
            self.meta.remove(&block_number);
        }
        Ok(())
    }
}

impl DataStore for MemoryStore {
    fn read_data(&mut self, block_number: u64, offset_in_block: usize, buffer: &mut [u8]) -> Result<()> {
        let mut done = 0;
        let mut block = block_number;
        let mut offset = offset_in_block;
        while done < buffer.len() {
            let take = (BLOCK_SIZE - offset).min(buffer.len() - done);
            assert!(self.allocated.contains(&block), "read of unallocated data block {block}");
            match self.data.get(&block) {
                Some(bytes) => buffer[done..done + take].copy_from_slice(&bytes[offset..offset + take]),
                None => buffer[done..done + take].fill(0),
            }
            done += take;
            block += 1;
            offset = 0;
        }
        Ok(())
    }
    fn write_data(&mut self, block_number: u64, offset_in_block: usize, data: &[u8]) -> Result<()> {
        let mut done = 0;
        let mut block = block_number;
        let mut offset = offset_in_block;
        while done < data.len() {
            let take = (BLOCK_SIZE - offset).min(data.len() - done);
            assert!(self.allocated.contains(&block), "write to unallocated data block {block}");
            let bytes = self.data.entry(block).or_insert_with(zeroed_block);
            bytes[offset..offset + take].copy_from_slice(&data[done..done + take]);
            done += take;
            block += 1;
            offset = 0;
        }
        Ok(())
    }
    fn allocate_data(&mut self, _near: u64, count: u64) -> Result<(u64, u64)> {
        assert!(count > 0);
        let first = self.next_block;
        for _ in 0..count {
            self.allocate_one();
        }
        Ok((first, count))
    }
    fn free_data(&mut self, first: u64, count: u64) -> Result<()> {
        for block in first..first + count {
            assert!(self.allocated.remove(&block), "double free of data block {block}");
            assert!(!self.shares.contains_key(&block), "free of data block {block} still marked shared");
            if !self.crash_model {
                self.data.remove(&block);
            }
        }
        Ok(())
    }
    fn shared_references(&mut self, block_number: u64) -> Result<u64> {
        assert!(self.allocated.contains(&block_number), "references of unallocated data block {block_number}");
        Ok(self.shares.get(&block_number).copied().unwrap_or(0))
    }
    fn set_shared_references(&mut self, block_number: u64, references: u64) -> Result<()> {
        assert!(self.allocated.contains(&block_number), "references of unallocated data block {block_number}");
        assert!(references <= MAX_SHARED_REFERENCES);
        if references == 0 {
            self.shares.remove(&block_number);
        } else {
            self.shares.insert(block_number, references);
        }
        Ok(())
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
}
