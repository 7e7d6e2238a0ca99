//! The data checksum table (format version 4): a CRC32C for every volume block that holds file
//! data, kept in metadata blocks of kind `DataChecksum` in a fixed region after the generation
//! table, 1016 entries (u32) to a block. Entry `b % 1016` of table block `b / 1016` belongs to
//! volume block `b`. The table blocks are ordinary metadata: cached, changed in memory, written
//! home by checkpoints with the usual trailer and generation, and written lazily (a table block
//! no checkpoint wrote reads as zeros without a device read, like the generation table).
//!
//! An entry is the CRC32C (seed 0) of the block's 4096 bytes as they are on the device, or
//! `NO_CHECKSUM` (0) for a block that holds no written file data: free, freshly allocated, or
//! reserved by an unwritten extent (which reads as zeros without a device read). A block whose
//! CRC32C is 0 is stored as `ZERO_CRC_STORED`, which accepts both values. Every data read from
//! the device checks the whole blocks it touches; a data write computes the entries of the
//! blocks it changes (a partial-block write reads the block first). The checksums are computed
//! in batches through the accelerator runtime (`tandem_accel::runtime::Accelerator`).
//!
//! Everything here is a `Volume` method reached through `DataStore`, so that whatever applies
//! records (one thread or a locked wrapper over several) keeps data and checksums together.

use super::*;
use crate::block::superblock::CHECKSUMS_PER_TABLE_BLOCK;
use std::sync::OnceLock;
use tandem_accel::runtime::{Accelerator, RuntimeConfig};

/// The entry of a block without a checksum (free, fresh, unwritten).
pub const NO_CHECKSUM: u32 = 0;
/// What a block whose CRC32C is 0 stores instead (it then accepts 0 and this value).
pub const ZERO_CRC_STORED: u32 = u32::MAX;

/// The entry for a block whose CRC32C is `crc`.
pub fn checksum_entry(crc: u32) -> u32 {
    if crc == NO_CHECKSUM {
        ZERO_CRC_STORED
    } else {
        crc
    }
}

/// Whether entry `stored` accepts a block whose CRC32C is `computed`.
pub fn checksum_matches(stored: u32, computed: u32) -> bool {
    stored != NO_CHECKSUM && stored == checksum_entry(computed)
}

/// An entry that disagrees with the block `entry` describes, and is not `NO_CHECKSUM` (which a
/// partial write would replace by a fresh checksum): for a copy of damaged bytes.
fn poisoned(entry: u32) -> u32 {
    match entry ^ 1 {
        NO_CHECKSUM => entry ^ 2,
        other => other,
    }
}

/// The process's accelerator runtime, made once from `RuntimeConfig::default()`: the GPU runs
/// batches at least as large as its calibrated threshold when one is present, the CPU engine
/// everything else. The CPU engine runs a batch on the calling thread (`cpu_threads: 1`): a
/// batch here is one read or write (at most a few MiB), which one core checksums in tens of
/// microseconds, about what starting the engine's helper threads costs; the file system's own
/// threads are where the parallelism is. (With every core, 1 MiB batches ran at half the
/// speed of one thread on the 2-core development machine, and far worse while FUSE threads
/// competed for the cores.)
pub fn default_accelerator() -> Arc<Accelerator> {
    static SHARED: OnceLock<Arc<Accelerator>> = OnceLock::new();
    SHARED
        .get_or_init(|| Arc::new(Accelerator::new(RuntimeConfig { cpu_threads: 1, ..RuntimeConfig::default() })))
        .clone()
}

/// Data blocks the volume partially wrote last, remembered whole with the CRC32C it gave them:
/// small appends write the same block again and again, and a write to a remembered block whose
/// entry is still the one recorded (no free, no other write since) needs no device read, and
/// its new CRC follows from the old one and the bytes that change (`crc_after_change`). The
/// bytes are the ones the volume wrote, so a later change on the device (damage) still
/// disagrees with the entry computed from them.
#[derive(Default)]
pub(super) struct RecentBlocks {
    blocks: Vec<RecentBlock>,
    next_victim: usize,
}

struct RecentBlock {
    block_number: u64,
    bytes: BlockBuf,
    crc: u32,
}

/// Blocks `RecentBlocks` remembers: appends to a few files at once.
const RECENT_BLOCKS: usize = 8;

impl RecentBlocks {
    /// The new CRC32C of remembered block `block_number` once `data` replaces its bytes at
    /// `offset_in_block`, if it is remembered with entry `stored`; the remembered bytes and
    /// CRC move with it.
    fn merge(&mut self, block_number: u64, stored: u32, offset_in_block: usize, data: &[u8]) -> Option<u32> {
        let recent = self.blocks.iter_mut().find(|recent| recent.block_number == block_number)?;
        if stored == NO_CHECKSUM || checksum_entry(recent.crc) != stored {
            return None;
        }
        let old = &mut recent.bytes[offset_in_block..offset_in_block + data.len()];
        recent.crc = crc_after_change(recent.crc, offset_in_block, old, data);
        old.copy_from_slice(data);
        Some(recent.crc)
    }

    /// Forgets blocks `first..first + count` (handed to a direct write, whose bytes these are not).
    fn forget(&mut self, first: u64, count: u64) {
        self.blocks.retain(|recent| !(first..first + count).contains(&recent.block_number));
        self.next_victim = 0;
    }

    fn remember(&mut self, block_number: u64, bytes: BlockBuf, crc: u32) {
        let recent = RecentBlock { block_number, bytes, crc };
        if let Some(slot) = self.blocks.iter().position(|old| old.block_number == block_number) {
            self.blocks[slot] = recent;
        } else if self.blocks.len() < RECENT_BLOCKS {
            self.blocks.push(recent);
        } else {
            self.blocks[self.next_victim] = recent;
            self.next_victim = (self.next_victim + 1) % RECENT_BLOCKS;
        }
    }
}

/// The CRC32C of a 4 KiB block whose CRC32C was `crc`, once bytes `old` at `offset` become
/// `new`. Without the standard inversions a CRC is linear, and blocks of one length share the
/// inversions' part, so crc(new block) = crc(old block) ^ raw(d), d the block that is zero but
/// for `old ^ new` at `offset`. Leading zeros add nothing to a raw CRC from 0, and trailing ones
/// multiply it by x^(8 × their count) mod P: raw(d) = raw(old ^ new) · x^(8 × tail). Costs the
/// changed bytes and one multiplication, not the block.
fn crc_after_change(crc: u32, offset: usize, old: &[u8], new: &[u8]) -> u32 {
    assert!(old.len() == new.len() && offset + new.len() <= BLOCK_SIZE);
    let mut difference = [0u8; BLOCK_SIZE];
    let difference = &mut difference[..new.len()];
    for ((byte, old), new) in difference.iter_mut().zip(old).zip(new) {
        *byte = old ^ new;
    }
    // crc32c(c, data) = !raw(!c, data), so a raw CRC from 0 is !crc32c(!0, data).
    let raw = !tandem_accel::crc32c(u32::MAX, difference);
    let tail_bytes = BLOCK_SIZE - offset - new.len();
    crc ^ tandem_accel::crc::multiply_mod(raw, zero_shift(tail_bytes))
}

/// x^(8 × bytes) mod P in the reflected domain, for 0..=4096 bytes (a table made once).
fn zero_shift(bytes: usize) -> u32 {
    static POWERS: OnceLock<Vec<u32>> = OnceLock::new();
    let powers = POWERS.get_or_init(|| {
        let x8 = tandem_accel::crc::x_power_mod(8);
        let mut powers = Vec::with_capacity(BLOCK_SIZE + 1);
        let mut power = tandem_accel::crc::x_power_mod(0);
        for _ in 0..=BLOCK_SIZE {
            powers.push(power);
            power = tandem_accel::crc::multiply_mod(power, x8);
        }
        powers
    });
    powers[bytes]
}

/// `Volume::block_checksums` on the fields it uses, so that a caller may hold another field.
fn checksum_blocks(
    accelerator: &mut Option<Arc<Accelerator>>,
    statistics: &mut DataChecksumStatistics,
    data: &[u8],
) -> Vec<u32> {
    assert!(data.len().is_multiple_of(BLOCK_SIZE));
    let started = std::time::Instant::now();
    let accelerator = accelerator.get_or_insert_with(default_accelerator);
    let checksums = match accelerator.crc32c_blocks(data) {
        Ok(checksums) if checksums.len() == data.len() / BLOCK_SIZE => checksums,
        _ => data.chunks_exact(BLOCK_SIZE).map(|block| tandem_accel::crc32c(0, block)).collect(),
    };
    statistics.bytes += data.len() as u64;
    statistics.batches += 1;
    statistics.nanoseconds += started.elapsed().as_nanos() as u64;
    checksums
}

/// Largest run of data blocks fsck reads and checks at once.
const CHECK_CHUNK_BLOCKS: u64 = 256;

/// Bytes checksummed, in how many batches, and the time the checksums took (for `tandem bench`:
/// the share of a run's time that data checksums cost, without a switch that turns them off).
/// Whole blocks only: the small updates of remembered blocks (`crc_after_change`) cost about
/// as much as copying the bytes written and are not counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataChecksumStatistics {
    pub bytes: u64,
    pub batches: u64,
    pub nanoseconds: u64,
    /// Blocks read back right by the device's redundancy after their checksum failed
    /// (`Device::read_checked`: an erasure-coded array rebuilt and rewrote them): file data
    /// here, and metadata blocks whose trailer or generation failed (`Volume::read_meta` and
    /// the table and inode-table reads).
    pub healed_blocks: u64,
}

/// A data block whose contents disagree with its checksum (fsck).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChecksumMismatch {
    pub block_number: u64,
    pub what: String,
}

impl Volume {
    /// Uses `accelerator` for data checksums from now on (the default is the shared runtime).
    pub fn set_accelerator(&mut self, accelerator: Arc<Accelerator>) {
        self.accelerator = Some(accelerator);
    }

    /// Set while the log is replayed at mount: a partial-block write then computes the block's
    /// checksum from what the device holds, without checking the old one first, and a read
    /// (a cut inside a block copies bytes) is not checked. The table on disk is the last
    /// checkpoint's, and the device may already hold data of records after it (they are being
    /// replayed), so a mismatch then is expected, not damage. Replay rewrites every byte those
    /// records wrote, so the blocks end with checksums of their final bytes; a block no replayed
    /// record writes holds the checkpoint's bytes, which its entry describes.
    pub fn set_replaying(&mut self, replaying: bool) {
        self.replaying = replaying;
    }

    /// CRC32C of each 4 KiB block of `data` (a whole number of blocks), in one batch through
    /// the accelerator; on the CPU directly if the runtime fails (a GPU error is no reason to
    /// fail a read).
    pub(super) fn block_checksums(&mut self, data: &[u8]) -> Vec<u32> {
        checksum_blocks(&mut self.accelerator, &mut self.checksum_statistics, data)
    }

    /// The runtime data checksums go through, for callers that checksum without the volume
    /// (a direct write computes its blocks' entries before it takes the volume lock).
    pub fn data_accelerator(&mut self) -> Arc<Accelerator> {
        self.accelerator.get_or_insert_with(default_accelerator).clone()
    }

    /// Claims `count` data blocks for a direct write, near `near` (`Bitmap::claim`): returned
    /// as runs, every one checked as `allocate_data` checks what it hands out. Nothing else
    /// changes: no checkpoint records a claim, so a crash before the record that takes the
    /// blocks leaves them free. All or nothing: on `NoSpace` or corruption nothing stays
    /// claimed.
    pub fn claim_data(&mut self, near: u64, count: u64) -> Result<Vec<(u64, u64)>> {
        assert!(count > 0);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let (mut left, mut hint) = (count, near);
        // Bounded by `count`: each pass claims at least one block.
        while left > 0 {
            let claimed = self.blocks.claim(hint, left, self.superblock.first_data_block).and_then(|(first, given)| {
                runs.push((first, given));
                self.check_allocated_unused(first, given).map(|()| (first, given))
            });
            match claimed {
                Ok((first, given)) => {
                    left -= given;
                    hint = first + given;
                }
                Err(error) => {
                    self.unclaim_data(&runs);
                    return Err(error);
                }
            }
        }
        Ok(runs)
    }

    /// Gives back claims that no record will take.
    pub fn unclaim_data(&mut self, runs: &[(u64, u64)]) {
        for &(first, count) in runs {
            self.blocks.unclaim(first, count);
        }
    }

    /// Replay: claims the blocks of a direct-write record after the checkpoint before any
    /// record is replayed, so that the records before it, which allocate anew, never take them.
    pub fn claim_data_exact(&mut self, first: u64, count: u64) -> Result<()> {
        if first < self.superblock.first_data_block {
            return Err(Error::corruption(format!("direct write maps block {first}, inside the fixed regions")));
        }
        self.blocks.claim_exact(first, count)?;
        if let Err(error) = self.check_allocated_unused(first, count) {
            self.blocks.unclaim(first, count);
            return Err(error);
        }
        Ok(())
    }

    /// The record of a direct write is applied: its claimed blocks become the file's, with the
    /// checksum entries it carries (computed from the bytes written before the record was
    /// logged), and the generation table records them as data, as for any block handed out.
    pub fn take_claimed_data(&mut self, first: u64, count: u64, entries: &[u32]) -> Result<()> {
        assert_eq!(entries.len() as u64, count, "one checksum entry per block taken");
        if first < self.superblock.first_data_block {
            return Err(Error::corruption(format!("direct write maps block {first}, inside the fixed regions")));
        }
        self.blocks.take_claimed(first, count)?;
        self.note_data_handed_out(first, count);
        self.recent_blocks.forget(first, count);
        self.set_data_checksums(first, entries)
    }

    /// What data checksums have cost since the volume was opened.
    pub fn checksum_statistics(&self) -> DataChecksumStatistics {
        self.checksum_statistics.clone()
    }

    /// Checksum-table block `index`, checked against the generation table. A block expected
    /// at generation 0 was never written: all entries `NO_CHECKSUM`, not read.
    fn checksum_table_block(&mut self, index: u64) -> Result<(u64, SharedBlock)> {
        if index >= self.superblock.checksum_table_blocks {
            return Err(Error::corruption(format!("data checksum table has no block {index}")));
        }
        let number = self.superblock.checksum_table_start + index;
        if let Some(block) = self.cache.get(number, BlockKind::DataChecksum) {
            return Ok((number, block));
        }
        let expected = self.expected_generation(0, number)?;
        let block = self.load_lazy_table_block(number, BlockKind::DataChecksum, expected)?;
        Ok((number, block))
    }

    /// The checksum entry of block `block_number`.
    pub fn data_checksum(&mut self, block_number: u64) -> Result<u32> {
        let index = block_number / CHECKSUMS_PER_TABLE_BLOCK;
        let (_, table) = self.checksum_table_block(index)?;
        Ok(get_u32(&table[..], (block_number % CHECKSUMS_PER_TABLE_BLOCK) as usize * 4))
    }

    /// The checksum entries of blocks `first..first + count`, one table block at a time.
    pub fn data_checksums(&mut self, first: u64, count: u64) -> Result<Vec<u32>> {
        let mut entries = Vec::with_capacity(count as usize);
        let end = first + count;
        let mut block = first;
        // Bounded by `count`: each pass moves past one table block's worth of blocks.
        while block < end {
            let index = block / CHECKSUMS_PER_TABLE_BLOCK;
            let base = index * CHECKSUMS_PER_TABLE_BLOCK;
            let stop = end.min(base + CHECKSUMS_PER_TABLE_BLOCK);
            let (_, table) = self.checksum_table_block(index)?;
            entries.extend((block..stop).map(|entry| get_u32(&table[..], (entry - base) as usize * 4)));
            block = stop;
        }
        Ok(entries)
    }

    /// Records `entries` for blocks `first..first + entries.len()`, one table block at a time;
    /// a table block is dirtied only when an entry changes.
    pub(super) fn set_data_checksums(&mut self, first: u64, entries: &[u32]) -> Result<()> {
        let end = first + entries.len() as u64;
        let mut block = first;
        // Bounded by the entries: each pass moves past one table block's worth of blocks.
        while block < end {
            let index = block / CHECKSUMS_PER_TABLE_BLOCK;
            let base = index * CHECKSUMS_PER_TABLE_BLOCK;
            let stop = end.min(base + CHECKSUMS_PER_TABLE_BLOCK);
            let (number, table) = self.checksum_table_block(index)?;
            let wanted = &entries[(block - first) as usize..(stop - first) as usize];
            let differs = (block..stop)
                .zip(wanted)
                .any(|(entry, value)| get_u32(&table[..], (entry - base) as usize * 4) != *value);
            drop(table);
            if differs {
                let table =
                    self.cache.modify(number, BlockKind::DataChecksum).expect("table block cached by the read above");
                for (entry, value) in (block..stop).zip(wanted) {
                    put_u32(&mut table[..], (entry - base) as usize * 4, *value);
                }
            }
            block = stop;
        }
        Ok(())
    }

    /// Records `NO_CHECKSUM` for blocks `first..first + count` (freed or freshly allocated).
    pub(super) fn clear_data_checksums(&mut self, first: u64, count: u64) -> Result<()> {
        let mut block = first;
        let end = first + count;
        // Bounded by `count`: each pass clears at most one table block's worth.
        while block < end {
            let stop = end.min((block / CHECKSUMS_PER_TABLE_BLOCK + 1) * CHECKSUMS_PER_TABLE_BLOCK);
            self.set_data_checksums(block, &vec![NO_CHECKSUM; (stop - block) as usize])?;
            block = stop;
        }
        Ok(())
    }

    /// The error for data block `block_number` whose bytes disagree with its entry.
    fn mismatch(block_number: u64, stored: u32, computed: u32) -> Error {
        if stored == NO_CHECKSUM {
            return Error::corruption(format!(
                "data block {block_number}: read as file data but the checksum table records none for it"
            ));
        }
        Error::corruption(format!(
            "data block {block_number}: checksum {stored:#010x} stored, {computed:#010x} computed (damaged file data)"
        ))
    }

    /// Reads `buffer.len()` bytes at byte `offset_in_block` of data block `block_number` (the
    /// range may run on into the following blocks) and checks every block it touches whole:
    /// the whole blocks inside the range are read straight into `buffer` and checked in one
    /// batch; a partial block at either end is read whole into a scratch block. A mismatch is
    /// a corruption error naming the block, and `buffer` is zeroed: no damaged byte reaches a
    /// caller that looks at it despite the error.
    pub(super) fn read_data_checked(
        &mut self,
        block_number: u64,
        offset_in_block: usize,
        buffer: &mut [u8],
    ) -> Result<()> {
        let read = self.read_data_unzeroed(block_number, offset_in_block, buffer);
        if matches!(read, Err(Error::Corruption { .. })) {
            buffer.fill(0);
        }
        read
    }

    fn read_data_unzeroed(&mut self, block_number: u64, offset_in_block: usize, buffer: &mut [u8]) -> Result<()> {
        assert!(offset_in_block < BLOCK_SIZE && !buffer.is_empty());
        let end_bytes = offset_in_block + buffer.len();
        let block_span = end_bytes.div_ceil(BLOCK_SIZE) as u64;
        if self.replaying {
            let start = block_number * BLOCK_SIZE_U64 + offset_in_block as u64;
            return self.device.read_at(start, buffer);
        }
        let stored = self.data_checksums(block_number, block_span)?;
        // Bytes of `buffer` before the first whole block, and where the whole blocks end.
        let head_bytes = if offset_in_block == 0 { 0 } else { (BLOCK_SIZE - offset_in_block).min(buffer.len()) };
        let whole_blocks = (buffer.len() - head_bytes) / BLOCK_SIZE;
        let whole_end = head_bytes + whole_blocks * BLOCK_SIZE;
        if head_bytes > 0 || (whole_blocks == 0 && !buffer.is_empty()) {
            // The range starts inside the first block, or lies inside it.
            let take = if head_bytes > 0 { head_bytes } else { buffer.len() };
            let block = self.read_block_checked(block_number, stored[0])?;
            buffer[..take].copy_from_slice(&block[offset_in_block..offset_in_block + take]);
            if take == buffer.len() {
                return Ok(());
            }
        }
        let first_whole = block_number + u64::from(head_bytes > 0);
        if whole_blocks > 0 {
            let target = &mut buffer[head_bytes..whole_end];
            self.device.read_at(first_whole * BLOCK_SIZE_U64, target)?;
            let computed = self.block_checksums(target);
            let base = (first_whole - block_number) as usize;
            for (index, crc) in computed.into_iter().enumerate() {
                if !checksum_matches(stored[base + index], crc) {
                    let block = self.heal_block(first_whole + index as u64, stored[base + index], crc)?;
                    target[index * BLOCK_SIZE..(index + 1) * BLOCK_SIZE].copy_from_slice(&block[..]);
                }
            }
        }
        if whole_end < buffer.len() {
            let tail_block = first_whole + whole_blocks as u64;
            let block = self.read_block_checked(tail_block, stored[(tail_block - block_number) as usize])?;
            let take = buffer.len() - whole_end;
            buffer[whole_end..].copy_from_slice(&block[..take]);
        }
        Ok(())
    }

    /// Data block `block_number` read whole and checked against entry `stored`.
    fn read_block_checked(&mut self, block_number: u64, stored: u32) -> Result<BlockBuf> {
        let mut block = zeroed_block();
        self.device.read_at(block_number * BLOCK_SIZE_U64, &mut block[..])?;
        let crc = self.block_checksums(&block[..])[0];
        if !checksum_matches(stored, crc) {
            return self.heal_block(block_number, stored, crc);
        }
        Ok(block)
    }

    /// Data block `block_number`, whose bytes read as `computed` against entry `stored`, read
    /// again through `Device::read_checked`: a device with redundancy (an erasure-coded array)
    /// rebuilds it from its other copies, returns the version the entry accepts and rewrites
    /// the copy that was wrong (self-healing, docs/RAID.md). A device without, or with no
    /// version that passes, leaves the mismatch, which is the error.
    fn heal_block(&mut self, block_number: u64, stored: u32, computed: u32) -> Result<BlockBuf> {
        if stored == NO_CHECKSUM {
            return Err(Volume::mismatch(block_number, stored, computed));
        }
        let mut block = zeroed_block();
        let check = |bytes: &[u8]| checksum_matches(stored, tandem_accel::crc32c(0, bytes));
        if self.device.read_checked(block_number * BLOCK_SIZE_U64, &mut block[..], &check)? {
            self.checksum_statistics.healed_blocks += 1;
            return Ok(block);
        }
        Err(Volume::mismatch(block_number, stored, computed))
    }

    /// The entries the blocks touched by writing `data` at byte `offset_in_block` of block
    /// `block_number` get. Whole blocks are checksummed from `data` in one batch. A partial
    /// block is read first and merged with its new bytes. Its old bytes are checked against
    /// its entry: when they pass (or it has none) the entry is the new block's CRC; when they
    /// do not, the block was damaged outside what this write replaces, and the entry moves by
    /// the change (CRC32C is affine: crc(a) ^ crc(b) ^ crc(c) = crc(a ^ b ^ c) for blocks of
    /// one length), so that it still disagrees with the damaged bytes instead of blessing
    /// them. During replay (`set_replaying`) the old entry is not trusted (see there).
    pub(super) fn checksums_after_write(
        &mut self,
        block_number: u64,
        offset_in_block: usize,
        data: &[u8],
    ) -> Result<Vec<u32>> {
        assert!(offset_in_block < BLOCK_SIZE && !data.is_empty());
        let end_bytes = offset_in_block + data.len();
        let block_span = end_bytes.div_ceil(BLOCK_SIZE);
        let head_bytes = if offset_in_block == 0 { 0 } else { (BLOCK_SIZE - offset_in_block).min(data.len()) };
        let whole_blocks = (data.len() - head_bytes) / BLOCK_SIZE;
        let whole_end = head_bytes + whole_blocks * BLOCK_SIZE;
        let mut entries = Vec::with_capacity(block_span);
        if head_bytes > 0 || whole_blocks == 0 {
            let take = if head_bytes > 0 { head_bytes } else { data.len() };
            entries.push(self.partial_block_entry(block_number, offset_in_block, &data[..take])?);
            if take == data.len() {
                return Ok(entries);
            }
        }
        entries.extend(self.block_checksums(&data[head_bytes..whole_end]).into_iter().map(checksum_entry));
        if whole_end < data.len() {
            let tail_block = block_number + entries.len() as u64;
            entries.push(self.partial_block_entry(tail_block, 0, &data[whole_end..])?);
        }
        assert_eq!(entries.len(), block_span);
        Ok(entries)
    }

    /// The entry of block `block_number` once `data` replaces its bytes at `offset_in_block`.
    fn partial_block_entry(&mut self, block_number: u64, offset_in_block: usize, data: &[u8]) -> Result<u32> {
        assert!(offset_in_block + data.len() <= BLOCK_SIZE);
        let stored = self.data_checksum(block_number)?;
        if let Some(crc) = self.recent_blocks.merge(block_number, stored, offset_in_block, data) {
            return Ok(checksum_entry(crc));
        }
        let mut block = zeroed_block();
        self.device.read_at(block_number * BLOCK_SIZE_U64, &mut block[..])?;
        let old_crc =
            if self.replaying || stored == NO_CHECKSUM { None } else { Some(self.block_checksums(&block[..])[0]) };
        block[offset_in_block..offset_in_block + data.len()].copy_from_slice(data);
        let new_crc = self.block_checksums(&block[..])[0];
        let entry = match old_crc {
            Some(old_crc) if !checksum_matches(stored, old_crc) => checksum_entry(stored ^ old_crc ^ new_crc),
            _ => checksum_entry(new_crc),
        };
        // Only a block whose bytes agree with its entry is worth remembering.
        if entry == checksum_entry(new_crc) && !self.replaying {
            self.recent_blocks.remember(block_number, block, new_crc);
        }
        Ok(entry)
    }

    /// Writes `data` from the start of block `block_number` with zeros after it to the end of
    /// its last block (`DataStore::write_fresh`), and records every block's entry from the bytes
    /// written: nothing is read. The last block, when partly data, is remembered like a partial
    /// write's (`RecentBlocks`), so the next run written into its room merges without a read.
    pub(super) fn write_fresh_checked(&mut self, block_number: u64, data: &[u8]) -> Result<()> {
        assert!(!data.is_empty());
        let whole_bytes = data.len() / BLOCK_SIZE * BLOCK_SIZE;
        let mut entries: Vec<u32> = Vec::with_capacity(data.len().div_ceil(BLOCK_SIZE));
        if whole_bytes > 0 {
            entries.extend(self.block_checksums(&data[..whole_bytes]).into_iter().map(checksum_entry));
            // Held, as `write_data`'s: the record is durable in the log and replay redoes it.
            self.device.write_held(block_number * BLOCK_SIZE_U64, &data[..whole_bytes])?;
        }
        if whole_bytes < data.len() {
            let tail_block = block_number + (whole_bytes / BLOCK_SIZE) as u64;
            let mut block = zeroed_block();
            block[..data.len() - whole_bytes].copy_from_slice(&data[whole_bytes..]);
            let crc = self.block_checksums(&block[..])[0];
            self.device.write_held(tail_block * BLOCK_SIZE_U64, &block[..])?;
            entries.push(checksum_entry(crc));
            if !self.replaying {
                self.recent_blocks.remember(tail_block, block, crc);
            }
        }
        self.set_data_checksums(block_number, &entries)
    }

    /// Copies bytes of `from_block` into `to_block` at the same offset (a cut inside a block,
    /// applied by the back end). The source block is read whole and checked; when it fails, the
    /// copy is made all the same and the copy's entry is made to disagree with it (`poisoned`),
    /// so that the damage travels with the bytes and reads of either block fail, while the
    /// back end's apply, which must not stop the volume over one damaged data block, goes on.
    /// During replay the source is not checked (see `set_replaying`).
    pub(super) fn copy_data_checked(
        &mut self,
        from_block: u64,
        to_block: u64,
        offset_in_block: usize,
        length: usize,
    ) -> Result<()> {
        assert!(offset_in_block + length <= BLOCK_SIZE && length > 0);
        let stored = self.data_checksum(from_block)?;
        let mut source = zeroed_block();
        self.device.read_at(from_block * BLOCK_SIZE_U64, &mut source[..])?;
        let damaged = !self.replaying && !checksum_matches(stored, self.block_checksums(&source[..])[0]);
        let bytes = &source[offset_in_block..offset_in_block + length];
        let entries = self.checksums_after_write(to_block, offset_in_block, bytes)?;
        self.device.write_at(to_block * BLOCK_SIZE_U64 + offset_in_block as u64, bytes)?;
        let entry = if damaged { poisoned(entries[0]) } else { entries[0] };
        self.set_data_checksums(to_block, &[entry])
    }

    /// fsck: reads data blocks `first..first + count` and checks each against its entry, in
    /// batches of at most `CHECK_CHUNK_BLOCKS` that do not cross a table block. Returns the
    /// blocks that fail, with why, and how many blocks were not checked because the table block
    /// holding their checksums fails its own checks (reported once, as that block).
    pub fn check_data_blocks(&mut self, first: u64, count: u64) -> Result<(Vec<ChecksumMismatch>, u64)> {
        let mut mismatches = Vec::new();
        let mut unchecked = 0;
        let mut block = first;
        let end = first + count;
        let mut buffer = vec![0u8; (CHECK_CHUNK_BLOCKS * BLOCK_SIZE_U64) as usize];
        // Bounded by `count`: each pass moves past at least one block.
        while block < end {
            let table_end = (block / CHECKSUMS_PER_TABLE_BLOCK + 1) * CHECKSUMS_PER_TABLE_BLOCK;
            let blocks = (end - block).min(CHECK_CHUNK_BLOCKS).min(table_end - block);
            let stored = match self.data_checksums(block, blocks) {
                Ok(stored) => stored,
                Err(Error::Corruption { .. }) => {
                    unchecked += blocks;
                    block += blocks;
                    continue;
                }
                Err(other) => return Err(other),
            };
            let bytes = &mut buffer[..(blocks * BLOCK_SIZE_U64) as usize];
            self.check_data_range(block, 0, bytes.len())?;
            self.device.read_at(block * BLOCK_SIZE_U64, bytes)?;
            let computed = self.block_checksums(bytes);
            for (index, (stored, crc)) in stored.into_iter().zip(computed).enumerate() {
                if !checksum_matches(stored, crc) {
                    let number = block + index as u64;
                    // A device with redundancy that lets writes through rebuilds the block from
                    // its other copies and rewrites it (`tandem scrub`, an array opened
                    // writable); any other reads it once more and it stays a mismatch.
                    match self.heal_block(number, stored, crc) {
                        Ok(_) => {}
                        Err(Error::Corruption { what }) => {
                            mismatches.push(ChecksumMismatch { block_number: number, what })
                        }
                        Err(other) => return Err(other),
                    }
                }
            }
            block += blocks;
        }
        Ok((mismatches, unchecked))
    }
}

impl Volume {
    /// fsck: every checksum-table block that fails its checks (damaged, stale), as (index in
    /// the table, why). A block never written (generation 0) is not read.
    pub fn damaged_checksum_table_blocks(&mut self) -> Result<Vec<(u64, String)>> {
        let mut damaged = Vec::new();
        for index in 0..self.superblock.checksum_table_blocks {
            match self.checksum_table_block(index) {
                Ok(_) => {}
                Err(Error::Corruption { what }) => damaged.push((index, what)),
                Err(other) => return Err(other),
            }
        }
        Ok(damaged)
    }

    /// fsck --repair: replaces checksum-table block `index` by one that holds, for each block
    /// of `written` (the blocks under it that hold written data of the files kept), the CRC32C
    /// of what the device holds now, and no checksum for the rest. The old checksums are lost:
    /// damage those blocks took before now can no longer be detected, which the repair says.
    /// The block is dirty in the cache; the repair's checkpoint takes it home.
    pub fn rebuild_checksum_table_block(&mut self, index: u64, written: &[u64]) -> Result<()> {
        assert!(index < self.superblock.checksum_table_blocks);
        let base = index * CHECKSUMS_PER_TABLE_BLOCK;
        let mut table = zeroed_block();
        let mut bytes = zeroed_block();
        for block in written {
            assert!((base..base + CHECKSUMS_PER_TABLE_BLOCK).contains(block), "block {block} is not under {index}");
            self.check_data_range(*block, 0, BLOCK_SIZE)?;
            self.device.read_at(block * BLOCK_SIZE_U64, &mut bytes[..])?;
            let crc = self.block_checksums(&bytes[..])[0];
            put_u32(&mut table[..], (block - base) as usize * 4, checksum_entry(crc));
        }
        let number = self.superblock.checksum_table_start + index;
        self.cache.remove(number);
        self.cache.insert_clean(number, BlockKind::DataChecksum, Arc::new(zeroed_block()));
        let cached = self.cache.modify(number, BlockKind::DataChecksum).expect("table block cached just above");
        cached[..META_PAYLOAD_BYTES].copy_from_slice(&table[..META_PAYLOAD_BYTES]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    fn volume() -> (Arc<MemoryDevice>, Volume, u64) {
        let device = Arc::new(MemoryDevice::from_bytes(vec![0; 16 << 20]));
        let superblock = Superblock::layout((16 << 20) / BLOCK_SIZE_U64, None, None).unwrap();
        let mut volume = Volume::new_empty(device.clone(), superblock.clone(), 64);
        volume.blocks.set_range(0, superblock.first_data_block);
        let (first, given) = volume.allocate_data(0, 8).unwrap();
        assert_eq!(given, 8);
        (device, volume, first)
    }

    fn pattern(length: usize, seed: u8) -> Vec<u8> {
        (0..length).map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn every_write_shape_reads_back_and_a_flipped_bit_fails() {
        let (device, mut volume, first) = volume();
        // Whole blocks, then a partial head, whole blocks, partial tail, and a write inside one
        // block.
        volume.write_data(first, 0, &pattern(8 * BLOCK_SIZE, 0)).unwrap();
        volume.write_data(first, 100, &pattern(3 * BLOCK_SIZE, 1)).unwrap();
        volume.write_data(first + 5, 0, &pattern(2 * BLOCK_SIZE, 2)).unwrap();
        volume.write_data(first + 1, 7, &pattern(50, 3)).unwrap();
        let mut expected = vec![0u8; 8 * BLOCK_SIZE];
        device.read_at(first * BLOCK_SIZE_U64, &mut expected).unwrap();
        for (offset, length) in [(0, 8 * BLOCK_SIZE), (100, 3 * BLOCK_SIZE), (4095, 2), (7, 50), (5 * BLOCK_SIZE, 10)] {
            let mut buffer = vec![0u8; length];
            let block = first + (offset / BLOCK_SIZE) as u64;
            volume.read_data(block, offset % BLOCK_SIZE, &mut buffer).unwrap();
            assert_eq!(buffer, expected[offset..offset + length], "read of {length} at {offset}");
        }
        // A flipped bit in block first + 2: every read that touches it fails, others pass.
        let byte = (first + 2) * BLOCK_SIZE_U64 + 4000;
        let mut one = [0u8; 1];
        device.read_at(byte, &mut one).unwrap();
        device.write_at(byte, &[one[0] ^ 0x10]).unwrap();
        let mut buffer = vec![0u8; 10];
        let error = volume.read_data(first + 2, 0, &mut buffer).unwrap_err();
        assert!(error.is_corruption() && error.to_string().contains(&format!("data block {}", first + 2)), "{error}");
        let mut buffer = vec![0u8; 8 * BLOCK_SIZE];
        assert!(volume.read_data(first, 0, &mut buffer).unwrap_err().is_corruption());
        assert!(buffer.iter().all(|byte| *byte == 0), "a failed read leaves bytes in the buffer");
        let mut buffer = vec![0u8; BLOCK_SIZE];
        volume.read_data(first + 3, 0, &mut buffer).unwrap();
        let (mismatches, unchecked) = volume.check_data_blocks(first, 8).unwrap();
        assert_eq!(mismatches.iter().map(|m| m.block_number).collect::<Vec<_>>(), vec![first + 2]);
        assert_eq!(unchecked, 0);
    }

    #[test]
    fn a_partial_write_over_damage_elsewhere_in_the_block_keeps_it_detected() {
        let (device, mut volume, first) = volume();
        volume.write_data(first, 0, &pattern(BLOCK_SIZE, 9)).unwrap();
        device.write_at(first * BLOCK_SIZE_U64 + 3000, &[0xAB]).unwrap();
        // Overwrite bytes 0..100, away from the damage: the block still fails.
        volume.write_data(first, 0, &pattern(100, 4)).unwrap();
        let mut buffer = vec![0u8; 100];
        assert!(volume.read_data(first, 0, &mut buffer).unwrap_err().is_corruption());
        // Putting the damaged byte back makes the block whole again: the entry tracked the write.
        let mut original = pattern(BLOCK_SIZE, 9);
        original[..100].copy_from_slice(&pattern(100, 4));
        device.write_at(first * BLOCK_SIZE_U64 + 3000, &original[3000..3001]).unwrap();
        let mut buffer = vec![0u8; BLOCK_SIZE];
        volume.read_data(first, 0, &mut buffer).unwrap();
        assert_eq!(buffer, original);
    }

    #[test]
    fn replay_recomputes_from_what_the_device_holds() {
        let (device, mut volume, first) = volume();
        volume.write_data(first, 0, &pattern(BLOCK_SIZE, 5)).unwrap();
        // Bytes of a record after the checkpoint reached the device before a crash.
        device.write_at(first * BLOCK_SIZE_U64 + 200, &pattern(300, 6)).unwrap();
        device.write_at(first * BLOCK_SIZE_U64 + 1000, &pattern(10, 7)).unwrap();
        volume.set_replaying(true);
        volume.write_data(first, 200, &pattern(300, 6)).unwrap();
        volume.write_data(first, 1000, &pattern(10, 7)).unwrap();
        volume.set_replaying(false);
        let mut buffer = vec![0u8; BLOCK_SIZE];
        volume.read_data(first, 0, &mut buffer).unwrap();
    }

    #[test]
    fn a_copy_out_of_a_damaged_block_carries_the_damage() {
        let (device, mut volume, first) = volume();
        volume.write_data(first, 0, &pattern(BLOCK_SIZE, 3)).unwrap();
        // A clean copy reads back.
        volume.copy_data(first, first + 1, 100, 50).unwrap();
        let mut buffer = vec![0u8; 50];
        volume.read_data(first + 1, 100, &mut buffer).unwrap();
        assert_eq!(buffer, pattern(BLOCK_SIZE, 3)[100..150]);
        // Damage in the source: the copy succeeds (the back end goes on), and both blocks fail.
        device.write_at(first * BLOCK_SIZE_U64 + 120, &[0xEE]).unwrap();
        volume.copy_data(first, first + 2, 100, 50).unwrap();
        assert!(volume.read_data(first + 2, 100, &mut buffer).unwrap_err().is_corruption());
        assert!(volume.read_data(first, 100, &mut buffer).unwrap_err().is_corruption());
        // A later partial write into the copy keeps it failing.
        volume.write_data(first + 2, 0, &[1, 2, 3]).unwrap();
        assert!(volume.read_data(first + 2, 0, &mut buffer).unwrap_err().is_corruption());
    }

    /// Fresh blocks (`write_fresh`): over old bytes on the device, nothing is read, the bytes
    /// after the data read as zeros and every block's entry agrees; the next run written into
    /// the room of the last block uses the remembered bytes (no read either).
    #[test]
    fn fresh_blocks_are_written_whole_without_a_read() {
        for length in [1usize, 100, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 7, 3 * BLOCK_SIZE + 2048] {
            let (device, mut volume, first) = volume();
            device.write_at(first * BLOCK_SIZE_U64, &vec![0xa5; 8 * BLOCK_SIZE]).unwrap();
            let bytes = pattern(length, 11);
            let reads = device.counters().reads;
            volume.write_fresh(first, &bytes).unwrap();
            assert_eq!(device.counters().reads, reads, "{length} bytes: the fresh write read the device");
            let span = length.next_multiple_of(BLOCK_SIZE);
            let mut expected = bytes.clone();
            expected.resize(span, 0);
            let mut buffer = vec![0u8; span];
            volume.read_data(first, 0, &mut buffer).unwrap();
            assert_eq!(buffer, expected, "{length} bytes");
            if length % BLOCK_SIZE != 0 {
                let last = first + (length / BLOCK_SIZE) as u64;
                let at = length % BLOCK_SIZE;
                let more = pattern((BLOCK_SIZE - at).min(50), 12);
                let reads = device.counters().reads;
                volume.write_data(last, at, &more).unwrap();
                assert_eq!(device.counters().reads, reads, "{length} bytes: the room's fill read the device");
                expected[length..length + more.len()].copy_from_slice(&more);
                volume.read_data(first, 0, &mut buffer).unwrap();
                assert_eq!(buffer, expected, "{length} bytes, room filled");
            }
        }
    }

    #[test]
    fn small_writes_to_a_remembered_block_read_back_and_keep_damage_detected() {
        let (device, mut volume, first) = volume();
        let mut expected = vec![0u8; BLOCK_SIZE];
        device.read_at(first * BLOCK_SIZE_U64, &mut expected).unwrap();
        // Appends of 100 bytes: the first reads the block, the rest use the remembered bytes.
        for index in 0..10usize {
            let bytes = pattern(100, index as u8);
            volume.write_data(first, index * 100, &bytes).unwrap();
            expected[index * 100..index * 100 + 100].copy_from_slice(&bytes);
            let mut buffer = vec![0u8; BLOCK_SIZE];
            volume.read_data(first, 0, &mut buffer).unwrap();
            assert_eq!(buffer, expected, "after append {index}");
        }
        // A whole-block write changes the entry: the remembered bytes are not used after it.
        let whole = pattern(BLOCK_SIZE, 77);
        volume.write_data(first, 0, &whole).unwrap();
        volume.write_data(first, 5, &[1, 2, 3]).unwrap();
        let mut expected = whole;
        expected[5..8].copy_from_slice(&[1, 2, 3]);
        let mut buffer = vec![0u8; BLOCK_SIZE];
        volume.read_data(first, 0, &mut buffer).unwrap();
        assert_eq!(buffer, expected);
        // Damage on the device under a remembered block: the next small write does not read
        // it, and its entry, computed from the bytes written, disagrees with the device.
        device.write_at(first * BLOCK_SIZE_U64 + 3000, &[expected[3000] ^ 0x40]).unwrap();
        volume.write_data(first, 8, &[4, 5]).unwrap();
        assert!(volume.read_data(first, 0, &mut buffer).unwrap_err().is_corruption());
    }

    #[test]
    fn a_free_leaves_the_checksums_and_handing_out_clears_them() {
        let (_device, mut volume, first) = volume();
        volume.write_data(first, 0, &pattern(2 * BLOCK_SIZE, 1)).unwrap();
        let written = volume.data_checksums(first, 2).unwrap();
        assert!(written.iter().all(|entry| *entry != NO_CHECKSUM));
        let dirty = volume.cache_dirty_count();
        // Format version 6: a free changes the bitmap alone.
        volume.free_data(first, 2).unwrap();
        assert_eq!(volume.data_checksums(first, 2).unwrap(), written);
        assert_eq!(volume.cache_dirty_count(), dirty);
        // Handed out again (once a checkpoint covers the free), the blocks hold nothing
        // written: the old entries would describe the bytes of the file that had them.
        volume.blocks.release_checkpointed(volume.current_lsn);
        let (again, given) = volume.allocate_data(first, 2).unwrap();
        assert_eq!((again, given), (first, 2));
        assert_eq!(volume.data_checksums(first, 2).unwrap(), vec![NO_CHECKSUM; 2]);
        // A read of a block without a checksum is refused, never served unchecked.
        let mut buffer = vec![0u8; 10];
        let error = volume.read_data(first + 3, 0, &mut buffer).unwrap_err();
        assert!(error.to_string().contains("records none"), "{error}");
    }

    #[test]
    fn checksums_go_through_the_given_runtime_in_one_batch_per_request() {
        use tandem_accel::runtime::Mode;
        let (_device, mut volume, first) = volume();
        // GPU mode on a machine without one runs on the CPU engine: same checksums.
        let accelerator = Accelerator::new(RuntimeConfig { mode: Mode::Gpu, ..RuntimeConfig::default() });
        volume.set_accelerator(Arc::new(accelerator));
        let data = pattern(8 * BLOCK_SIZE, 7);
        volume.write_data(first, 0, &data).unwrap();
        let expected: Vec<u32> = data.chunks_exact(BLOCK_SIZE).map(|block| tandem_accel::crc32c(0, block)).collect();
        assert_eq!(
            volume.data_checksums(first, 8).unwrap(),
            expected.iter().map(|crc| checksum_entry(*crc)).collect::<Vec<_>>()
        );
        let before = volume.checksum_statistics();
        let mut buffer = vec![0u8; 8 * BLOCK_SIZE];
        volume.read_data(first, 0, &mut buffer).unwrap();
        let after = volume.checksum_statistics();
        assert_eq!((after.bytes - before.bytes, after.batches - before.batches), (8 * BLOCK_SIZE_U64, 1));
    }

    #[test]
    fn the_crc_after_a_change_equals_the_crc_of_the_changed_block() {
        let mut block = pattern(BLOCK_SIZE, 1);
        let mut crc = tandem_accel::crc32c(0, &block);
        // Changes at the start, the end, one byte, the whole block, and odd places between.
        let mut shapes = vec![(0, 1), (0, BLOCK_SIZE), (BLOCK_SIZE - 1, 1), (4000, 96), (0, 256), (17, 3001)];
        shapes.extend((0..200).map(|step: usize| ((step * 97) % 4000, 1 + (step * 31) % 96)));
        for (index, (offset, length)) in shapes.into_iter().enumerate() {
            let new = pattern(length, index as u8 ^ 0x5A);
            crc = crc_after_change(crc, offset, &block[offset..offset + length], &new);
            block[offset..offset + length].copy_from_slice(&new);
            assert_eq!(crc, tandem_accel::crc32c(0, &block), "change {index}: {length} bytes at {offset}");
        }
    }

    #[test]
    fn the_zero_crc_has_an_entry() {
        assert_eq!(checksum_entry(0), ZERO_CRC_STORED);
        assert!(checksum_matches(ZERO_CRC_STORED, 0));
        assert!(!checksum_matches(NO_CHECKSUM, 0));
        assert!(checksum_matches(0x1234, 0x1234) && !checksum_matches(0x1234, 0x1235));
    }
}
