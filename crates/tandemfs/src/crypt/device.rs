//! `EncryptedDevice`: a [`Device`] that keeps an encrypted volume's blocks in AES-256-XTS on the
//! device beneath and shows plaintext above. One XTS data unit is one 4096-byte block and its
//! tweak is the block number, so a block's ciphertext depends on its plaintext and its place
//! only. The superblocks, the MMP block and the key-slot region pass through as they are.
//!
//! Whole-block requests are encrypted and decrypted in place in the caller's buffers (a
//! borrowed write buffer must be copied once, since the caller keeps its plaintext). Requests
//! that cover part of a block read the block, change the bytes and write the whole block back;
//! the plaintext of the last few blocks written that way is kept ([`TailCache`]), so that the
//! next partial write to one of them (the log's tail blocks on every group commit) needs no
//! device read and no decryption, only the encryption of the block it writes.

use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;
use tandem_accel::{Accelerator, Direction, XtsKey};

use super::tail_cache::{TailCache, WriteToken};
use super::MasterKey;
use crate::block::meta::BLOCK_SIZE_U64;
use crate::block::superblock::Superblock;
use crate::device::{check_range, run_batch, Device, IoCompletion, IoRequest, IoTicket};
use crate::error::{Error, Result};

const BLOCK_BYTES: usize = BLOCK_SIZE_U64 as usize;
/// Locks that serialise read-modify-write cycles on the same block (by block number modulo
/// this): two writers of different bytes of one block must not both write back what they read.
const RMW_STRIPES: usize = 64;

/// What both the device and the completions of its batches need: the key, the runtime and
/// which blocks are plaintext.
struct Cipher {
    key: XtsKey,
    accelerator: Arc<Accelerator>,
    /// Block ranges kept in plaintext: the superblocks, and the MMP block with the key slots.
    plaintext: [Range<u64>; 2],
}

pub struct EncryptedDevice {
    inner: Arc<dyn Device>,
    cipher: Arc<Cipher>,
    stripes: Box<[Mutex<()>]>,
    /// The plaintext of the blocks written partially last (kept coherent with every write
    /// path; see `tail_cache`).
    cache: Arc<TailCache>,
}

impl std::fmt::Debug for EncryptedDevice {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("EncryptedDevice(..)")
    }
}

impl Cipher {
    fn is_plaintext(&self, block_number: u64) -> bool {
        self.plaintext.iter().any(|range| range.contains(&block_number))
    }

    /// The encrypted runs of the whole blocks in `data`, whose first block is `first_block`:
    /// (first block of the run, byte range in `data`). Bounded by the blocks in `data`.
    fn encrypted_runs(&self, first_block: u64, data_bytes: usize) -> Vec<(u64, Range<usize>)> {
        assert_eq!(data_bytes % BLOCK_BYTES, 0);
        let blocks = data_bytes / BLOCK_BYTES;
        let mut runs: Vec<(u64, Range<usize>)> = Vec::with_capacity(1);
        for index in 0..blocks {
            let block_number = first_block + index as u64;
            if self.is_plaintext(block_number) {
                continue;
            }
            let bytes = index * BLOCK_BYTES..(index + 1) * BLOCK_BYTES;
            match runs.last_mut() {
                Some((_, range)) if range.end == bytes.start => range.end = bytes.end,
                _ => runs.push((block_number, bytes)),
            }
        }
        runs
    }

    /// En- or decrypts, in place, the encrypted blocks of several block-aligned buffers
    /// (`(first block, bytes)`), in one runtime call.
    fn apply(&self, direction: Direction, buffers: &mut [(u64, &mut [u8])]) -> Result<()> {
        let mut pieces: Vec<(u64, &mut [u8])> = Vec::with_capacity(buffers.len());
        for (first_block, data) in buffers.iter_mut() {
            let runs = self.encrypted_runs(*first_block, data.len());
            let mut rest: &mut [u8] = data;
            let mut consumed = 0;
            for (run_block, range) in runs {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(range.start - consumed);
                let (piece, after) = tail.split_at_mut(range.len());
                pieces.push((run_block, piece));
                rest = after;
                consumed = range.end;
            }
        }
        if pieces.is_empty() {
            return Ok(());
        }
        self.accelerator.xts_scattered(&self.key, direction, &mut pieces).map_err(|error| Error::Io {
            operation: "AES-XTS",
            offset: 0,
            source: std::io::Error::other(error.to_string()),
        })
    }
}

/// Scratch buffers kept per thread at most this large (a FUSE request is at most 1 MiB; each
/// thread that writes keeps one): a write of a borrowed buffer needs a
/// copy to encrypt, and a fresh allocation of a large one costs a page fault per page.
const SCRATCH_KEPT_BYTES_MAX: usize = 1 << 20;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `work` on a buffer of `length` bytes (contents unspecified) from this thread's scratch
/// buffer, or a fresh one when that is in use further up the stack or the length is above
/// what is kept.
fn with_scratch<R>(length: usize, work: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) if length <= SCRATCH_KEPT_BYTES_MAX => {
            if scratch.len() < length {
                scratch.resize(length, 0);
            }
            work(&mut scratch[..length])
        }
        _ => work(&mut vec![0u8; length]),
    })
}

/// The blocks a partial write offered to the tail cache: at most its first (where the write
/// starts inside it) and its last.
#[derive(Default)]
struct Offered {
    blocks: [u64; 2],
    count: usize,
}

impl Offered {
    fn push(&mut self, block_number: u64) {
        assert!(self.count < 2, "a write offers its first and last block at most");
        self.blocks[self.count] = block_number;
        self.count += 1;
    }
    fn as_slice(&self) -> &[u64] {
        &self.blocks[..self.count]
    }
    fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        let mut kept = Offered::default();
        for &block_number in self.as_slice() {
            if keep(block_number) {
                kept.push(block_number);
            }
        }
        *self = kept;
    }
}

/// The writes of a batch registered with the tail cache, ended when the batch is waited for.
/// Dropped unended (the batch failed, or its ticket was dropped unwaited), it cannot tell when
/// or whether its writes reached the device, so it disables the cache.
struct BatchWrites {
    cache: Arc<TailCache>,
    writes: Vec<(WriteToken, Range<u64>)>,
}

impl BatchWrites {
    fn end(mut self) {
        for (token, blocks) in std::mem::take(&mut self.writes) {
            self.cache.end_write(token, blocks, &[], true);
        }
    }
}

impl Drop for BatchWrites {
    fn drop(&mut self) {
        if !self.writes.is_empty() {
            self.cache.disable();
        }
    }
}

/// Whether `[offset, offset + length)` starts and ends on block boundaries.
fn is_aligned(offset: u64, length: usize) -> bool {
    offset.is_multiple_of(BLOCK_SIZE_U64) && length.is_multiple_of(BLOCK_BYTES)
}

/// The whole blocks that cover `[offset, offset + length)`, as a byte range of the device.
fn covering_blocks(offset: u64, length: usize) -> Range<u64> {
    let start = offset / BLOCK_SIZE_U64 * BLOCK_SIZE_U64;
    let end = (offset + length as u64).div_ceil(BLOCK_SIZE_U64) * BLOCK_SIZE_U64;
    start..end
}

impl EncryptedDevice {
    /// Wraps `inner`, which holds the encrypted volume `superblock` describes, under `master`.
    pub fn new(inner: Arc<dyn Device>, superblock: &Superblock, master: &MasterKey) -> EncryptedDevice {
        assert!(superblock.is_encrypted());
        let plaintext = [0..2, superblock.mmp_block..superblock.key_slot_start + superblock.key_slot_blocks];
        assert_eq!(plaintext[1].start + 1, superblock.key_slot_start, "the key slots follow the MMP block");
        let cipher =
            Cipher { key: master.xts_key(), accelerator: crate::block::volume::default_accelerator(), plaintext };
        EncryptedDevice {
            inner,
            cipher: Arc::new(cipher),
            stripes: (0..RMW_STRIPES).map(|_| Mutex::new(())).collect(),
            cache: Arc::new(TailCache::new()),
        }
    }

    /// Partial writes whose read-modify-write found the block's plaintext in the tail cache
    /// (no device read, no decryption).
    pub fn tail_cache_hits(&self) -> u64 {
        self.cache.hits()
    }

    /// Whether every block `[offset, offset + length)` touches is plaintext.
    fn all_plaintext(&self, offset: u64, length: usize) -> bool {
        let blocks = covering_blocks(offset, length);
        let (first, end) = (blocks.start / BLOCK_SIZE_U64, blocks.end / BLOCK_SIZE_U64);
        self.cipher.plaintext.iter().any(|range| range.start <= first && end <= range.end)
    }

    fn read(&self, offset: u64, buffer: &mut [u8], uncached: bool) -> Result<()> {
        check_range(self.size_bytes(), offset, buffer.len(), "read")?;
        let read_inner = |offset: u64, buffer: &mut [u8]| {
            if uncached {
                self.inner.read_uncached(offset, buffer)
            } else {
                self.inner.read_at(offset, buffer)
            }
        };
        if buffer.is_empty() || self.all_plaintext(offset, buffer.len()) {
            return read_inner(offset, buffer);
        }
        if is_aligned(offset, buffer.len()) {
            let block_number = offset / BLOCK_SIZE_U64;
            // One whole block, as a file system reads it to check its checksum before it
            // writes part of it: its plaintext is kept for that write's read-modify-write.
            let ticket =
                (buffer.len() == BLOCK_BYTES && !uncached).then(|| self.cache.read_ticket(block_number)).flatten();
            read_inner(offset, buffer)?;
            self.cipher.apply(Direction::Decrypt, &mut [(block_number, &mut *buffer)])?;
            if let Some(ticket) = ticket {
                self.cache.note_read(ticket, block_number, buffer);
            }
            return Ok(());
        }
        // Part of a block: decrypt the whole blocks that hold the range, hand out the range.
        let blocks = covering_blocks(offset, buffer.len());
        with_scratch((blocks.end - blocks.start) as usize, |whole| {
            read_inner(blocks.start, whole)?;
            self.cipher.apply(Direction::Decrypt, &mut [(blocks.start / BLOCK_SIZE_U64, &mut *whole)])?;
            let start = (offset - blocks.start) as usize;
            buffer.copy_from_slice(&whole[start..start + buffer.len()]);
            Ok(())
        })
    }

    /// Writes `data` at `offset`. A write that covers part of a block takes that block's
    /// plaintext from the tail cache or reads and decrypts it, changes the bytes and writes the
    /// whole block encrypted again (the cache changes where the old bytes come from, never
    /// what is written, so what follows holds either way).
    ///
    /// A torn write cannot damage the bytes such a write leaves unchanged: XTS is
    /// deterministic per position (each 16-byte AES block is encrypted under a tweak made of
    /// the block number and its place in the block, with no chaining between AES blocks), so
    /// the unchanged bytes encrypt to exactly the ciphertext already on the medium, and a
    /// crash that keeps any mix of old and new sectors still decrypts them to what they were.
    /// The only AES blocks that change are those holding changed bytes; a 16-byte AES block
    /// never straddles a 512-byte sector, so on media that write whole sectors atomically
    /// (every disk) the unchanged bytes that share an AES block with changed ones are safe too.
    /// A medium that tore a write inside a sector would garble that whole 16-byte AES block,
    /// up to 15 unchanged bytes beside the first or last changed byte (docs/ENCRYPTION.md).
    fn write(&self, offset: u64, data: &[u8], kind: WriteKind) -> Result<()> {
        check_range(self.size_bytes(), offset, data.len(), "write")?;
        let through = kind == WriteKind::Through;
        let write_inner = |offset: u64, data: &[u8]| match kind {
            WriteKind::Through => self.inner.write_through(offset, data),
            WriteKind::Held => self.inner.write_held(offset, data),
            WriteKind::Normal => self.inner.write_at(offset, data),
        };
        if data.is_empty() || self.all_plaintext(offset, data.len()) {
            return write_inner(offset, data);
        }
        let blocks = covering_blocks(offset, data.len());
        let block_numbers = blocks.start / BLOCK_SIZE_U64..blocks.end / BLOCK_SIZE_U64;
        with_scratch((blocks.end - blocks.start) as usize, |whole| {
            if is_aligned(offset, data.len()) {
                whole.copy_from_slice(data);
                self.cipher.apply(Direction::Encrypt, &mut [(block_numbers.start, &mut *whole)])?;
                let token = self.cache.begin_write(block_numbers.clone());
                let result = write_inner(offset, whole);
                self.cache.end_write(token, block_numbers, &[], result.is_ok());
                return result;
            }
            // Held from the read (or the cache lookup) to the write back of the first and last
            // block, and from the cache's offer to the write's end.
            let _locks = self.lock_blocks(block_numbers.start, block_numbers.end - 1);
            let token = self.cache.begin_write(block_numbers.clone());
            let result = self
                .write_partial(offset, data, whole, through, &token)
                .and_then(|offered| write_inner(blocks.start, whole).map(|()| offered));
            match result {
                Ok(offered) => {
                    self.cache.end_write(token, block_numbers, offered.as_slice(), true);
                    Ok(())
                }
                Err(error) => {
                    self.cache.end_write(token, block_numbers, &[], false);
                    Err(error)
                }
            }
        })
    }

    /// Fills `whole` (the blocks a partial write covers) with their new ciphertext: the first
    /// and last block taken from the tail cache or read and decrypted where the write covers
    /// part of them, `data` copied in, the first (where partial) and the last block's new
    /// plaintext offered to the cache, all encrypted. The caller holds their
    /// read-modify-write locks and began the write `token`. Returns the blocks offered.
    fn write_partial(
        &self,
        offset: u64,
        data: &[u8],
        whole: &mut [u8],
        through: bool,
        token: &WriteToken,
    ) -> Result<Offered> {
        let blocks = covering_blocks(offset, data.len());
        let first_block = blocks.start / BLOCK_SIZE_U64;
        let last_block = blocks.end / BLOCK_SIZE_U64 - 1;
        assert_eq!(whole.len() as u64, blocks.end - blocks.start);
        let head_partial = offset != blocks.start;
        let tail_partial = offset + data.len() as u64 != blocks.end;
        let tail = whole.len() - BLOCK_BYTES;
        let mut offered = Offered::default();
        if head_partial {
            self.old_plaintext(first_block, &mut whole[..BLOCK_BYTES], through)?;
            offered.push(first_block);
        }
        if tail_partial && (last_block != first_block || !head_partial) {
            self.old_plaintext(last_block, &mut whole[tail..], through)?;
        }
        // The last block is kept even where the write ends on its boundary: the next write
        // after a padded one (the log pads its data ring writes to the block end) starts there.
        if last_block != first_block || !head_partial {
            offered.push(last_block);
        }
        let start = (offset - blocks.start) as usize;
        whole[start..start + data.len()].copy_from_slice(data);
        if through {
            // A write-through's block is read past every cache; it is not kept either.
            offered = Offered::default();
        }
        // A plaintext block (a write that straddles the superblocks or the MMP block) is not
        // kept: writes that lie wholly in plaintext blocks pass by the cache.
        offered.retain(|block_number| !self.cipher.is_plaintext(block_number));
        for &block_number in offered.as_slice() {
            let index = ((block_number - first_block) as usize) * BLOCK_BYTES;
            self.cache.offer(token, block_number, &whole[index..index + BLOCK_BYTES]);
        }
        self.cipher.apply(Direction::Encrypt, &mut [(first_block, whole)])?;
        Ok(offered)
    }

    /// The plaintext of block `block_number` before a partial write: from the tail cache where
    /// it is there, else read and decrypted (`uncached`: past every cache, for write-through).
    fn old_plaintext(&self, block_number: u64, buffer: &mut [u8], uncached: bool) -> Result<()> {
        if !uncached && self.cache.lookup(block_number, buffer) {
            return Ok(());
        }
        self.read_block_into(block_number, buffer, uncached)
    }

    /// Reads one block's plaintext into `buffer` (one block long).
    fn read_block_into(&self, block_number: u64, buffer: &mut [u8], uncached: bool) -> Result<()> {
        assert_eq!(buffer.len(), BLOCK_BYTES);
        self.read(block_number * BLOCK_SIZE_U64, buffer, uncached)
    }

    /// Takes the read-modify-write locks of the first and last block of a write (in stripe
    /// order, so two writers never wait on each other crosswise).
    fn lock_blocks(&self, first_block: u64, last_block: u64) -> Vec<parking_lot::MutexGuard<'_, ()>> {
        let mut stripes = [(first_block % RMW_STRIPES as u64) as usize, (last_block % RMW_STRIPES as u64) as usize];
        stripes.sort_unstable();
        let mut guards = Vec::with_capacity(2);
        guards.push(self.stripes[stripes[0]].lock());
        if stripes[1] != stripes[0] {
            guards.push(self.stripes[stripes[1]].lock());
        }
        guards
    }
}

/// How a write reaches the device beneath: as `write_at`, `write_through` or `write_held`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    Normal,
    Through,
    Held,
}

impl Device for EncryptedDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.read(offset, buffer, false)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data, WriteKind::Normal)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
    fn write_held(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data, WriteKind::Held)
    }
    fn flush_unheld(&self) -> Result<()> {
        self.inner.flush_unheld()
    }
    /// Blocks keep their places under encryption, so the array's stripes are this device's.
    fn stripe_bytes(&self) -> Option<u64> {
        self.inner.stripe_bytes()
    }
    fn decrypts(&self) -> bool {
        true
    }
    fn reachable_by_other_processes(&self) -> bool {
        self.inner.reachable_by_other_processes()
    }
    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
    fn read_uncached(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.read(offset, buffer, true)
    }
    fn write_through(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data, WriteKind::Through)
    }
    /// The volume's checksums are over plaintext, the redundancy beneath (an erasure-coded
    /// array) holds ciphertext: the device beneath is asked for the whole blocks that hold the
    /// range, with a judge that decrypts each version it offers and asks `check` about the
    /// plaintext. So the array picks the version whose plaintext is right and rewrites the bad
    /// member with that version's ciphertext, which is what was written there (XTS is
    /// deterministic per block), as on a plain array (docs/RAID.md, *Self-healing reads*).
    fn read_checked(&self, offset: u64, buffer: &mut [u8], check: &dyn Fn(&[u8]) -> bool) -> Result<bool> {
        check_range(self.size_bytes(), offset, buffer.len(), "read")?;
        if buffer.is_empty() || self.all_plaintext(offset, buffer.len()) {
            return self.inner.read_checked(offset, buffer, check);
        }
        let blocks = covering_blocks(offset, buffer.len());
        let first_block = blocks.start / BLOCK_SIZE_U64;
        let start = (offset - blocks.start) as usize;
        let length = buffer.len();
        let judge = |ciphertext: &[u8]| {
            let mut plaintext = ciphertext.to_vec();
            // A version that cannot be decrypted is not accepted; the decryption of the
            // answer below reports the error.
            self.cipher.apply(Direction::Decrypt, &mut [(first_block, &mut plaintext[..])]).is_ok()
                && check(&plaintext[start..start + length])
        };
        let mut whole = vec![0u8; (blocks.end - blocks.start) as usize];
        let accepted = self.inner.read_checked(blocks.start, &mut whole, &judge)?;
        self.cipher.apply(Direction::Decrypt, &mut [(first_block, &mut whole[..])])?;
        buffer.copy_from_slice(&whole[start..start + length]);
        Ok(accepted)
    }

    /// A batch of whole-block requests goes to the device beneath as one batch: its writes are
    /// encrypted in their own buffers in one runtime call before it is submitted, its reads
    /// decrypted in theirs in one call when it is waited for. (Write completions hand back
    /// ciphertext: a completed write's buffer is for reuse, not for reading.) A batch with a
    /// request that covers part of a block runs here, one request after another, since its
    /// read-modify-write must see the writes before it.
    fn submit(&self, mut batch: Vec<IoRequest>) -> IoTicket {
        let aligned = batch.iter().all(|request| match request {
            IoRequest::Read { offset, buffer } => is_aligned(*offset, buffer.len()),
            IoRequest::Write { offset, data } => is_aligned(*offset, data.len()),
            IoRequest::Flush => true,
        });
        let size_bytes = self.size_bytes();
        let in_range = batch.iter().all(|request| match request {
            IoRequest::Read { offset, buffer } => check_range(size_bytes, *offset, buffer.len(), "read").is_ok(),
            IoRequest::Write { offset, data } => check_range(size_bytes, *offset, data.len(), "write").is_ok(),
            IoRequest::Flush => true,
        });
        if !aligned || !in_range {
            return IoTicket::ready(run_batch(self, batch));
        }
        let mut writes: Vec<(u64, &mut [u8])> = batch
            .iter_mut()
            .filter_map(|request| match request {
                IoRequest::Write { offset, data } => Some((*offset / BLOCK_SIZE_U64, &mut data[..])),
                _ => None,
            })
            .collect();
        if let Err(error) = self.cipher.apply(Direction::Encrypt, &mut writes) {
            return IoTicket::ready(Err(error));
        }
        let read_blocks: Vec<u64> = batch
            .iter()
            .filter_map(|request| match request {
                IoRequest::Read { offset, .. } => Some(offset / BLOCK_SIZE_U64),
                _ => None,
            })
            .collect();
        let writes = self.begin_batch_writes(&batch);
        let ticket = self.inner.submit(batch);
        if read_blocks.is_empty() && writes.is_none() {
            return ticket;
        }
        let cipher = self.cipher.clone();
        ticket.then(Box::new(move |mut completions: Vec<IoCompletion>| {
            if let Some(writes) = writes {
                writes.end();
            }
            let mut reads: Vec<(u64, &mut [u8])> = completions
                .iter_mut()
                .filter_map(|completion| match completion {
                    IoCompletion::Read(buffer) => Some(&mut buffer[..]),
                    _ => None,
                })
                .zip(read_blocks.iter())
                .map(|(buffer, first_block)| (*first_block, buffer))
                .collect();
            if !reads.is_empty() {
                cipher.apply(Direction::Decrypt, &mut reads)?;
            }
            Ok(completions)
        }))
    }
}

impl EncryptedDevice {
    /// Registers a batch's writes with the tail cache before the batch is submitted.
    fn begin_batch_writes(&self, batch: &[IoRequest]) -> Option<BatchWrites> {
        let writes: Vec<(WriteToken, Range<u64>)> = batch
            .iter()
            .filter_map(|request| match request {
                IoRequest::Write { offset, data } if !data.is_empty() => {
                    let blocks = covering_blocks(*offset, data.len());
                    let numbers = blocks.start / BLOCK_SIZE_U64..blocks.end / BLOCK_SIZE_U64;
                    Some((self.cache.begin_write(numbers.clone()), numbers))
                }
                _ => None,
            })
            .collect();
        (!writes.is_empty()).then(|| BatchWrites { cache: self.cache.clone(), writes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    fn setup() -> (Arc<MemoryDevice>, EncryptedDevice) {
        let blocks = (16u64 << 20) / BLOCK_SIZE_U64;
        let superblock =
            Superblock::layout_with_key_slots(blocks, None, None, super::super::KEY_SLOT_COUNT as u64).unwrap();
        let memory = Arc::new(MemoryDevice::new(blocks * BLOCK_SIZE_U64));
        let device = EncryptedDevice::new(memory.clone(), &superblock, &MasterKey::random().unwrap());
        (memory, device)
    }

    fn pattern(length: usize, seed: u8) -> Vec<u8> {
        (0..length).map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn round_trips_at_any_offset_and_hides_the_bytes() {
        let (memory, device) = setup();
        let cases = [
            (100 * BLOCK_SIZE_U64, 3 * BLOCK_BYTES),
            (200 * BLOCK_SIZE_U64 + 17, 5000),
            (300 * BLOCK_SIZE_U64 + 4000, 100),
        ];
        for (seed, (offset, length)) in cases.into_iter().enumerate() {
            let data = pattern(length, seed as u8);
            device.write_at(offset, &data).unwrap();
            let mut back = vec![0u8; length];
            device.read_at(offset, &mut back).unwrap();
            assert_eq!(back, data);
            let mut raw = vec![0u8; length];
            memory.read_at(offset, &mut raw).unwrap();
            assert_ne!(raw, data, "ciphertext on the medium");
        }
        // A partial write leaves its neighbours' plaintext alone.
        let mut back = vec![0u8; 5000];
        device.write_at(200 * BLOCK_SIZE_U64 + 20, &[0xEE; 10]).unwrap();
        device.read_at(200 * BLOCK_SIZE_U64 + 17, &mut back).unwrap();
        let mut expected = pattern(5000, 1);
        expected[3..13].fill(0xEE);
        assert_eq!(back, expected);
    }

    /// Writers of different bytes of one block each read, change and write the whole block:
    /// without the read-modify-write locks one would write back what it read before the
    /// other's write and undo it.
    #[test]
    fn concurrent_partial_writes_to_one_block_keep_every_byte() {
        let (_, device) = setup();
        let device = Arc::new(device);
        let offset = 700 * BLOCK_SIZE_U64;
        let writers: Vec<_> = (0..4u8)
            .map(|writer| {
                let device = device.clone();
                std::thread::spawn(move || {
                    for round in 0..1000u32 {
                        let value = writer.wrapping_mul(50).wrapping_add(round as u8);
                        device.write_at(offset + u64::from(writer) * 100, &[value; 100]).unwrap();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        let mut back = vec![0u8; 400];
        device.read_at(offset, &mut back).unwrap();
        for writer in 0..4u8 {
            let last = writer.wrapping_mul(50).wrapping_add((999u32 % 256) as u8);
            assert!(back[writer as usize * 100..][..100].iter().all(|byte| *byte == last), "writer {writer}");
        }
    }

    #[test]
    fn plaintext_blocks_pass_through() {
        let (memory, device) = setup();
        let data = pattern(BLOCK_BYTES * 2, 7);
        device.write_at(0, &data).unwrap();
        let mut raw = vec![0u8; data.len()];
        memory.read_at(0, &mut raw).unwrap();
        assert_eq!(raw, data);
    }

    #[test]
    fn batches_match_single_requests() {
        let (memory, device) = setup();
        let first = pattern(2 * BLOCK_BYTES, 3);
        let second = pattern(BLOCK_BYTES, 4);
        let batch = vec![
            IoRequest::Write { offset: 500 * BLOCK_SIZE_U64, data: first.clone() },
            IoRequest::Write { offset: 900 * BLOCK_SIZE_U64, data: second.clone() },
            IoRequest::Flush,
        ];
        device.submit(batch).wait().unwrap();
        let mut back = vec![0u8; first.len()];
        device.read_at(500 * BLOCK_SIZE_U64, &mut back).unwrap();
        assert_eq!(back, first);
        let reads = vec![
            IoRequest::Read { offset: 900 * BLOCK_SIZE_U64, buffer: vec![0; BLOCK_BYTES] },
            IoRequest::Read { offset: 500 * BLOCK_SIZE_U64, buffer: vec![0; 2 * BLOCK_BYTES] },
        ];
        let completions = device.submit(reads).wait().unwrap();
        assert!(matches!(&completions[0], IoCompletion::Read(buffer) if *buffer == second));
        assert!(matches!(&completions[1], IoCompletion::Read(buffer) if *buffer == first));
        let mut raw = vec![0u8; BLOCK_BYTES];
        memory.read_at(900 * BLOCK_SIZE_U64, &mut raw).unwrap();
        assert_ne!(raw, second);
    }

    /// The log's pattern: 64-byte headers one after another in a block, then payloads that
    /// cross into the next block. Only the first write to each block reads it from the device.
    #[test]
    fn a_partial_write_to_a_block_just_written_reads_nothing() {
        let (memory, device) = setup();
        let header_block = 100 * BLOCK_SIZE_U64;
        device.write_at(header_block, &[1; 64]).unwrap();
        let reads = memory.counters().reads;
        for slot in 1..64u64 {
            device.write_at(header_block + slot * 64, &[slot as u8; 64]).unwrap();
        }
        assert_eq!(memory.counters().reads, reads, "headers after the first read nothing");
        // A payload that ends on a block boundary, then the next one from there: the block it
        // ended in is kept, the one after it is new and read once.
        let data_block = 200 * BLOCK_SIZE_U64;
        device.write_at(data_block + 96, &pattern(BLOCK_BYTES - 96, 1)).unwrap();
        let reads = memory.counters().reads;
        device.write_at(data_block + BLOCK_SIZE_U64 - 50, &pattern(100, 2)).unwrap();
        assert_eq!(memory.counters().reads, reads + 1, "only the block the write enters is read");
        device.write_at(data_block + BLOCK_SIZE_U64 + 50, &pattern(300, 3)).unwrap();
        assert_eq!(memory.counters().reads, reads + 1);
        assert_eq!(device.tail_cache_hits(), 63 + 1 + 1);
        let mut back = vec![0u8; 64];
        device.read_at(header_block + 63 * 64, &mut back).unwrap();
        assert_eq!(back, vec![63u8; 64]);
        let mut back = vec![0u8; 400];
        device.read_at(data_block + BLOCK_SIZE_U64 - 50, &mut back).unwrap();
        assert_eq!(&back[..100], &pattern(100, 2)[..]);
        assert_eq!(&back[100..], &pattern(300, 3)[..]);
    }

    /// A file system reads a data block whole (to check its checksum) and then writes part of
    /// it: the write needs no second read.
    #[test]
    fn a_partial_write_after_a_whole_block_read_reads_nothing_more() {
        let (memory, device) = setup();
        let offset = 250 * BLOCK_SIZE_U64;
        device.write_at(offset, &pattern(BLOCK_BYTES, 5)).unwrap();
        device.write_at(offset + BLOCK_SIZE_U64, &[0; 10]).unwrap(); // another block, read
        let mut block = vec![0u8; BLOCK_BYTES];
        device.read_at(offset, &mut block).unwrap();
        let reads = memory.counters().reads;
        device.write_at(offset + 1000, &[9; 300]).unwrap();
        assert_eq!(memory.counters().reads, reads, "the block read just before was kept");
        device.read_at(offset, &mut block).unwrap();
        let mut expected = pattern(BLOCK_BYTES, 5);
        expected[1000..1300].fill(9);
        assert!(block == expected);
    }

    /// A plaintext block that a write straddling into the encrypted blocks covers in part is not
    /// kept: the writes that lie wholly in it pass by the cache and would leave it stale.
    #[test]
    fn a_plaintext_block_beside_an_encrypted_one_is_never_stale() {
        let (_, device) = setup();
        let straddle = BLOCK_SIZE_U64 + 4000; // block 1 (a superblock) into block 2
        device.write_at(straddle, &[1; 200]).unwrap();
        device.write_at(BLOCK_SIZE_U64 + 10, &[2; 50]).unwrap();
        device.write_at(straddle + 50, &[3; 100]).unwrap();
        let mut back = vec![0u8; 50];
        device.read_at(BLOCK_SIZE_U64 + 10, &mut back).unwrap();
        assert_eq!(back, vec![2u8; 50]);
    }

    /// A write that failed may have left any mix of sectors: its block is read again.
    #[test]
    fn a_failed_write_leaves_nothing_cached() {
        use crate::device::{Fault, FaultOperation};
        let (memory, device) = setup();
        let offset = 300 * BLOCK_SIZE_U64;
        device.write_at(offset, &[1; 100]).unwrap();
        let mut untouched = vec![0u8; 100];
        device.read_at(offset + 100, &mut untouched).unwrap();
        memory.inject(Fault::once(FaultOperation::Write, 0));
        assert!(device.write_at(offset + 100, &[2; 100]).is_err());
        let reads = memory.counters().reads;
        device.write_at(offset + 200, &[3; 100]).unwrap();
        assert_eq!(memory.counters().reads, reads + 1);
        let mut back = vec![0u8; 300];
        device.read_at(offset, &mut back).unwrap();
        assert_eq!(&back[..100], &[1; 100]);
        assert_eq!(&back[100..200], &untouched[..], "the failed write never reached the device");
        assert_eq!(&back[200..], &[3; 100]);
    }

    /// Partial, aligned, batched and write-through writes over more blocks than the tail cache
    /// holds, in a random order: every read equals a plain copy kept beside.
    #[test]
    fn interleaved_writes_read_back_as_on_a_plain_device() {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        let (_, device) = setup();
        let first_block = 400u64;
        let blocks = super::super::tail_cache::CACHED_BLOCKS_MAX as u64 + 8;
        let base = first_block * BLOCK_SIZE_U64;
        let span = (blocks * BLOCK_SIZE_U64) as usize;
        let mut reference = vec![0u8; span];
        device.write_at(base, &reference).unwrap();
        let mut rng = SmallRng::seed_from_u64(8);
        for step in 0..4000u32 {
            let seed = step as u8;
            match rng.gen_range(0..10) {
                0..=4 => {
                    let length =
                        if rng.gen_bool(0.8) { rng.gen_range(1..400) } else { rng.gen_range(1..3 * BLOCK_BYTES) };
                    let at = rng.gen_range(0..span - length);
                    let data = pattern(length, seed);
                    device.write_at(base + at as u64, &data).unwrap();
                    reference[at..at + length].copy_from_slice(&data);
                }
                5 => {
                    let length = rng.gen_range(1..200);
                    let at = rng.gen_range(0..span - length);
                    let data = pattern(length, seed);
                    device.write_through(base + at as u64, &data).unwrap();
                    reference[at..at + length].copy_from_slice(&data);
                }
                6 | 7 => {
                    let count = rng.gen_range(1..3usize);
                    let block = rng.gen_range(0..blocks - count as u64) as usize;
                    let data = pattern(count * BLOCK_BYTES, seed);
                    device.write_at(base + (block * BLOCK_BYTES) as u64, &data).unwrap();
                    reference[block * BLOCK_BYTES..][..data.len()].copy_from_slice(&data);
                }
                8 => {
                    let mut batch = Vec::new();
                    for index in 0..rng.gen_range(1..4u8) {
                        let block = rng.gen_range(0..blocks) as usize;
                        let data = pattern(BLOCK_BYTES, seed.wrapping_add(index));
                        reference[block * BLOCK_BYTES..][..BLOCK_BYTES].copy_from_slice(&data);
                        batch.push(IoRequest::Write { offset: base + (block * BLOCK_BYTES) as u64, data });
                    }
                    batch.push(IoRequest::Flush);
                    device.submit(batch).wait().unwrap();
                }
                9 if rng.gen_bool(0.5) => {
                    let block = rng.gen_range(0..blocks) as usize;
                    let mut back = vec![0u8; BLOCK_BYTES];
                    device.read_at(base + (block * BLOCK_BYTES) as u64, &mut back).unwrap();
                    assert!(back == reference[block * BLOCK_BYTES..][..BLOCK_BYTES], "step {step}: block {block}");
                }
                _ => {
                    let length = rng.gen_range(1..2 * BLOCK_BYTES);
                    let at = rng.gen_range(0..span - length);
                    let mut back = vec![0u8; length];
                    device.read_at(base + at as u64, &mut back).unwrap();
                    assert!(back == reference[at..at + length], "step {step}: {at} + {length}");
                }
            }
        }
        assert!(device.tail_cache_hits() > 100, "the cache was used: {}", device.tail_cache_hits());
        let mut back = vec![0u8; span];
        device.read_at(base, &mut back).unwrap();
        assert!(back == reference);
    }

    /// Aligned and partial writers of the same blocks at once: whichever lands last wins, but
    /// once they are done what the cache keeps must be what the device holds. A partial write
    /// after them changes one byte; a stale entry would bring back other bytes with it.
    #[test]
    fn racing_aligned_and_partial_writes_leave_the_cache_coherent() {
        let (_, device) = setup();
        let device = Arc::new(device);
        let offset = 800 * BLOCK_SIZE_U64;
        for round in 0..20u8 {
            let writers: Vec<_> = (0..3u8)
                .map(|writer| {
                    let device = device.clone();
                    std::thread::spawn(move || {
                        for step in 0..200u32 {
                            let value = round.wrapping_mul(7).wrapping_add(writer).wrapping_add(step as u8);
                            if writer == 0 {
                                device.write_at(offset, &vec![value; 2 * BLOCK_BYTES]).unwrap();
                            } else if writer == 1 {
                                let batch = vec![IoRequest::Write { offset, data: vec![value; BLOCK_BYTES] }];
                                device.submit(batch).wait().unwrap();
                            } else {
                                let at = offset + (u64::from(step) * 97) % (2 * BLOCK_SIZE_U64 - 300);
                                device.write_at(at, &[value; 300]).unwrap();
                            }
                        }
                    })
                })
                .collect();
            for writer in writers {
                writer.join().unwrap();
            }
            for block in 0..2u64 {
                let mut before = vec![0u8; BLOCK_BYTES];
                device.read_at(offset + block * BLOCK_SIZE_U64, &mut before).unwrap();
                device.write_at(offset + block * BLOCK_SIZE_U64 + 1, &[0xA5]).unwrap();
                let mut after = vec![0u8; BLOCK_BYTES];
                device.read_at(offset + block * BLOCK_SIZE_U64, &mut after).unwrap();
                before[1] = 0xA5;
                assert!(after == before, "round {round} block {block}: a stale cache entry came back");
            }
        }
    }
}
