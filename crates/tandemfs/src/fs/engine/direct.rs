//! Large writes straight home (ordered data, as ext4's data=ordered): the bytes go to newly
//! claimed blocks, then a record that only maps those blocks is logged, and the group commit
//! that writes the record flushes the device before it (`Log::note_ordered_data`), so the bytes
//! are durable before the record. Small writes keep the log (`data.rs`). See docs/ARCHITECTURE.md, *Large writes
//! straight home*.

use super::*;
use crate::backend::record::DIRECT_WRITE_RECORD_MAX_BYTES;
use crate::block::meta::BLOCK_SIZE;
use crate::block::volume::checksum_entry;
use tandem_accel::runtime::Accelerator;

/// Bytes of a direct-write record's payload besides its runs and checksums (attribute image,
/// offset, length, run count), rounded up.
const DIRECT_RECORD_FIXED_BYTES: usize = 128;
/// Payload bytes per block a direct-write record maps, at most: a run (16 bytes, when every
/// block is a run of its own) and a checksum entry (4 bytes).
const DIRECT_RECORD_BYTES_PER_BLOCK: usize = 20;

/// Stack of the thread that computes checksums and copies the data: it calls no deep code.
const OVERLAP_STACK_BYTES: usize = 256 * 1024;

/// Blocks claimed for a direct write: the runs, the device to write them through and the
/// accelerator that computes their checksums.
struct Claimed {
    runs: Vec<(u64, u64)>,
    device: Arc<dyn Device>,
    accelerator: Arc<Accelerator>,
}

/// What a direct write keeps besides its blocks: the checksum entry of each block as it will
/// hold the data, and the copy of the bytes its pending write serves reads from until the
/// record is applied.
struct Kept {
    checksums: Vec<u32>,
    shared: Arc<[u8]>,
}

impl FileSystem {
    /// Direct-write records logged since mount: writes (or pieces of writes) whose bytes went
    /// straight home instead of through the log.
    pub fn direct_write_records(&self) -> u64 {
        self.inner.direct_write_records.load(Ordering::Relaxed)
    }

    /// Whether a write of `length` bytes goes straight home (`MountOptions::direct_write_min_bytes`).
    pub(super) fn writes_direct(&self, length: usize) -> bool {
        let threshold = self.inner.options.direct_write_min_bytes;
        threshold > 0 && length as u64 >= threshold
    }

    /// Whether bytes `start..end` of regular file `inode` map nothing yet: past the end of the
    /// file, or one hole of the applied extent tree that no pending write covers, with no change
    /// of the file's shape pending. Only there does a direct write take no more blocks than a
    /// logged one. Over written or fallocated bytes a write stays on the log and goes in place,
    /// so that space `fallocate` promised, and data written earlier, are not asked for again
    /// (a full volume still takes those writes, as `posix_fallocate` promises).
    pub(super) fn range_is_fresh(&self, inode: InodeNumber, start: u64, end: u64) -> Result<bool> {
        assert!(start < end);
        let mut shard = self.lock_view(inode)?;
        let view = FileSystem::regular_view(shard.views.get_mut(&inode).expect("loaded by lock_view"))?;
        if start >= view.attributes.size_bytes {
            return Ok(true);
        }
        let pending_overlap = view
            .pending_writes
            .iter()
            .any(|write| write.offset < end && write.offset + write.data.len() as u64 > start);
        if view.structural_lsn > self.applied() || pending_overlap {
            return Ok(false);
        }
        let generation = view.attributes.generation;
        drop(shard);
        let holes = self.holes_in(inode, generation, start, end)?;
        // A hole inside the tree and the stretch past its mapped end come as two pieces.
        let mut position = start;
        for (hole_start, hole_end) in holes {
            if hole_start != position {
                return Ok(false);
            }
            position = hole_end;
        }
        Ok(position == end)
    }

    /// The most bytes one direct-write record maps: `DIRECT_WRITE_RECORD_MAX_BYTES`, within
    /// what one allocating record may hand out (`range_piece_bytes`, for the checkpoint images
    /// its blocks need) and with a payload no larger than a logged write's.
    pub(super) fn direct_record_bytes(&self) -> usize {
        let payload_blocks =
            self.inner.max_record_data_bytes.saturating_sub(DIRECT_RECORD_FIXED_BYTES) / DIRECT_RECORD_BYTES_PER_BLOCK;
        let bytes =
            (payload_blocks as u64 * BLOCK_SIZE_U64).min(DIRECT_WRITE_RECORD_MAX_BYTES).min(self.range_piece_bytes());
        bytes.max(BLOCK_SIZE_U64) as usize
    }

    /// Writes `data` at `offset` of regular file `inode` as one direct-write record. All or
    /// nothing: on an error no record is logged, the claimed blocks and the reservation are
    /// given back, and the file is as it was.
    pub(super) fn write_direct(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<()> {
        assert!(!data.is_empty() && data.len() <= self.direct_record_bytes());
        if self.inner.read_only.load(Ordering::SeqCst) {
            return Err(Error::ReadOnly);
        }
        // What the record would be refused for is refused before any block is claimed.
        self.with_view(inode, |view| match view.file_type() {
            FileType::Regular => Ok(()),
            FileType::Directory => Err(Error::IsDirectory),
            _ => Err(Error::invalid("not a regular file")),
        })??;
        let blocks = (data.len() as u64).div_ceil(BLOCK_SIZE_U64);
        let Claimed { runs, device, accelerator } = self.claim_direct_blocks(blocks)?;
        let space = &self.inner.front.space;
        let overlap_min_bytes = self.inner.options.direct_write_overlap_min_bytes;
        let (home, kept) = write_home_keeping(device.as_ref(), &runs, data, &accelerator, overlap_min_bytes);
        let written = home.and_then(|()| {
            // The log flushes the device before the group commit that writes the record.
            self.inner.log.note_ordered_data();
            self.append_direct(inode, offset, data.len() as u64, &runs, kept)
        });
        if written.is_err() {
            // Nothing maps the blocks: they go back to the allocator, the blocks to the pool. A
            // failed volume answers `Shutdown` and its claims vanish with it.
            if let Ok(mut volume) = self.inner.backend.volume() {
                volume.unclaim_data(&runs);
            }
            space.unreserve(blocks + DATA_RESERVE_BLOCKS);
        }
        written
    }

    /// Reserves `blocks` new blocks and the tree reserve, then claims the blocks (waiting for
    /// space as any write does). Returns the runs, the device to write them through and the
    /// accelerator for their checksums.
    fn claim_direct_blocks(&self, blocks: u64) -> Result<Claimed> {
        let space = &self.inner.front.space;
        let (runs, device, accelerator) = self.with_space(|| {
            if !space.reserve(blocks, DATA_RESERVE_BLOCKS) {
                return Ok(None);
            }
            let claimed = self.inner.backend.volume().and_then(|mut volume| {
                let runs = volume.claim_data(0, blocks)?;
                Ok((runs, volume.device.clone(), volume.data_accelerator()))
            });
            match claimed {
                Ok(claimed) => Ok(Some(claimed)),
                Err(error) => {
                    space.unreserve(blocks + DATA_RESERVE_BLOCKS);
                    // The reservation promised the blocks; frees waiting for a checkpoint may
                    // still hold them: wait for space as a refused reservation does.
                    match error {
                        Error::NoSpace => Ok(None),
                        other => Err(other),
                    }
                }
            }
        })?;
        Ok(Claimed { runs, device, accelerator })
    }

    /// Logs the record that maps the written (and durable) `runs` at `offset`, and lays the
    /// bytes into the view's pending writes, from which reads serve them until it is applied.
    fn append_direct(
        &self,
        inode: InodeNumber,
        offset: u64,
        length: u64,
        runs: &[(u64, u64)],
        kept: Kept,
    ) -> Result<()> {
        let Kept { checksums, shared } = kept;
        assert_eq!(shared.len() as u64, length, "the pending write holds the whole write");
        let blocks = checksums.len() as u64;
        self.with_space(|| {
            let mut shard = self.lock_view(inode)?;
            let view = FileSystem::regular_view(shard.views.get_mut(&inode).expect("loaded by lock_view"))?;
            let end = offset + length;
            let mut image = view.attributes.clone();
            let now = now_ns();
            image.size_bytes = image.size_bytes.max(end);
            image.modify_time_ns = now;
            image.change_time_ns = now;
            // The range's old blocks are freed when the record is applied: at most the file's.
            let freed_blocks = view.blocks_with_pending();
            let op = Op::DirectWrite {
                inode: image.clone(),
                offset,
                length,
                runs: runs.to_vec(),
                checksums: checksums.clone(),
            };
            let Some(lsn) = self.append_reserved_blocks(op, blocks, DATA_RESERVE_BLOCKS, freed_blocks)? else {
                return Ok(None);
            };
            FileSystem::commit_view(view, image, lsn, false);
            view.pending_writes.push_back(PendingWrite { lsn, offset, data: shared.clone() });
            view.add_pending_blocks(lsn, blocks);
            self.inner.direct_write_records.fetch_add(1, Ordering::Relaxed);
            Ok(Some(()))
        })
    }
}

/// Writes `data` home to the blocks of `runs` and computes what the write keeps (checksums,
/// the pending copy). Both read `data` only, so a write of `overlap_min_bytes` or more (not 0)
/// overlaps them: the checksums and the copy on a second thread while this one writes home (on
/// the 2-core VM the home write was about half of a 1 MiB WRITE request's server time, the
/// checksums and the copy a quarter; docs/FUSE.md, "Sequential write and read"). Smaller
/// writes, and any where no thread can be started, do both in turn on this thread.
fn write_home_keeping(
    device: &dyn Device,
    runs: &[(u64, u64)],
    data: &[u8],
    accelerator: &Accelerator,
    overlap_min_bytes: u64,
) -> (Result<()>, Kept) {
    let keep = || Kept { checksums: checksum_entries(accelerator, data), shared: Arc::from(data) };
    if overlap_min_bytes == 0 || (data.len() as u64) < overlap_min_bytes {
        return (write_claimed_blocks(device, runs, data), keep());
    }
    std::thread::scope(|scope| {
        let keeper = std::thread::Builder::new().stack_size(OVERLAP_STACK_BYTES).spawn_scoped(scope, keep);
        let home = write_claimed_blocks(device, runs, data);
        let kept = match keeper {
            // `keep` does not panic on any input; if it did, the write fails loudly.
            Ok(keeper) => keeper.join().expect("the checksum thread does not panic"),
            Err(_) => keep(),
        };
        (home, kept)
    })
}

/// The checksum entry of each block of `data` as the blocks will hold it: whole blocks, the
/// last one padded with the zeros written there.
fn checksum_entries(accelerator: &Accelerator, data: &[u8]) -> Vec<u32> {
    let whole = data.len() / BLOCK_SIZE * BLOCK_SIZE;
    let mut crcs = match accelerator.crc32c_blocks(&data[..whole]) {
        Ok(crcs) if crcs.len() == whole / BLOCK_SIZE => crcs,
        _ => data[..whole].chunks_exact(BLOCK_SIZE).map(|block| tandem_accel::crc32c(0, block)).collect(),
    };
    if whole < data.len() {
        crcs.push(tandem_accel::crc32c(0, &last_block_padded(data)));
    }
    crcs.into_iter().map(checksum_entry).collect()
}

/// The last, partial block of `data`, padded with zeros to a whole block.
fn last_block_padded(data: &[u8]) -> Vec<u8> {
    let whole = data.len() / BLOCK_SIZE * BLOCK_SIZE;
    let mut block = vec![0u8; BLOCK_SIZE];
    block[..data.len() - whole].copy_from_slice(&data[whole..]);
    block
}

/// Writes `data` to the blocks of `runs` in order (the last block padded with zeros, so that
/// the block holds what its checksum describes) through the volume's device stack (encryption,
/// arrays). Not flushed here: the record that maps the blocks is noted as ordered data
/// (`Log::note_ordered_data`), and the group commit that writes it flushes the device first,
/// so the blocks are durable before the record can be, and one flush serves a whole batch.
fn write_claimed_blocks(device: &dyn Device, runs: &[(u64, u64)], data: &[u8]) -> Result<()> {
    let whole = data.len() / BLOCK_SIZE * BLOCK_SIZE;
    let mut position = 0usize;
    for &(first, count) in runs {
        let run_end = (position + count as usize * BLOCK_SIZE).min(data.len());
        let full_end = run_end.min(whole);
        if full_end > position {
            device.write_at(first * BLOCK_SIZE_U64, &data[position..full_end])?;
        }
        if run_end > full_end {
            let last = first + ((full_end - position) / BLOCK_SIZE) as u64;
            device.write_at(last * BLOCK_SIZE_U64, &last_block_padded(data))?;
        }
        position = run_end;
    }
    assert_eq!(position, data.len(), "the runs hold exactly the blocks of the data");
    Ok(())
}
