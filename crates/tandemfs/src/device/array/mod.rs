//! `device::array`: an erasure-coded array of k + m member devices shown as one [`Device`]
//! (docs/RAID.md). It owns the geometry (stripe units, rotating parity, logical byte → member
//! and offset), the member headers, assembly, Reed–Solomon parity through tandem-accel's
//! runtime, degraded reads and writes, marking failing members missing, resync and scrub.
//! Nothing here knows about the volume on top: its format is FORMAT.md's, on the array's bytes.

mod assemble;
mod epoch;
pub mod header;
pub mod intent;
mod rebuild;
#[cfg(test)]
mod tests;

pub use assemble::{assemble, create, Assembly, CreateOptions, Member, STRIPE_UNIT_BYTES_DEFAULT};
pub use header::{read_header, short_uuid, ArrayState, Found, MemberHeader, DATA_START_BYTES};

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tandem_accel::{Accelerator, ReedSolomon};

use crate::device::{check_range, Device};
use crate::error::{Error, Result};
use epoch::{Epoch, CHUNK_ROWS_MAX};
use intent::{IntentRecord, PartialParity, RecordShape, INTENT_START_BYTES};

/// Stripes share this many locks (a stripe's lock is `stripe % STRIPE_LOCK_COUNT`).
const STRIPE_LOCK_COUNT: usize = 256;
/// Bytes of the row blocks scrub checks one at a time (one volume block).
const SCRUB_ROW_BYTES: u64 = 4096;

/// The shape of an array: n members, m of parity per stripe, stripe units of U bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub member_count: usize,
    pub parity_count: usize,
    pub stripe_unit_bytes: u64,
    pub stripe_count: u64,
}

impl Geometry {
    /// k: the data units of a stripe.
    pub fn data_count(&self) -> usize {
        self.member_count - self.parity_count
    }
    /// Logical bytes of one stripe: k units.
    pub fn stripe_data_bytes(&self) -> u64 {
        self.data_count() as u64 * self.stripe_unit_bytes
    }
    pub fn logical_bytes(&self) -> u64 {
        self.stripe_count * self.stripe_data_bytes()
    }
    /// The member slot that holds shard `shard` of `stripe`: roles rotate one slot per stripe.
    pub fn slot(&self, stripe: u64, shard: usize) -> usize {
        debug_assert!(shard < self.member_count);
        ((shard as u64 + stripe) % self.member_count as u64) as usize
    }
    /// The member byte of row `row` of `stripe`'s unit.
    pub fn member_offset(&self, stripe: u64, row: u64) -> u64 {
        debug_assert!(stripe < self.stripe_count && row <= self.stripe_unit_bytes);
        DATA_START_BYTES + stripe * self.stripe_unit_bytes + row
    }
}

/// Counters of one member slot since assembly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotStatistics {
    pub slot: usize,
    pub name: String,
    pub missing: bool,
    /// Why it is missing: absent at assembly, stale, or the error that failed it.
    pub missing_reason: Option<String>,
    pub reads: u64,
    pub writes: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub flush_errors: u64,
    /// Bytes found wrong on this member and rewritten from the others (self-healing reads and
    /// scrub repairs).
    pub repaired_bytes: u64,
}

/// Counters of the whole array since assembly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArrayStatistics {
    pub slots: Vec<SlotStatistics>,
    /// Bytes of missing shards rebuilt from the others (reads and read-modify-writes).
    pub reconstructed_bytes: u64,
    /// Bytes a checked read found wrong on a member, rebuilt from the others and rewrote.
    pub healed_bytes: u64,
    pub epochs: EpochStatistics,
    /// The rebuild running now, if any (`tandem status` of a mounted array shows it).
    pub rebuild: Option<RebuildProgress>,
}

/// How far the running rebuild has come (docs/RAID.md, *Rebuild*).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebuildProgress {
    pub slot: usize,
    /// The new member's name (its path).
    pub name: String,
    /// Bytes of the slot's units rebuilt onto the new member (the stripes the cursor passed).
    pub done_bytes: u64,
    /// Bytes of the slot's units in all.
    pub total_bytes: u64,
    /// Since the rebuild was started.
    pub elapsed_ms: u64,
}

/// How the epochs went home since assembly (docs/RAID.md, *Rule 3*): what the write path cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpochStatistics {
    /// Epochs written home (flushes with writes in them).
    pub epochs: u64,
    /// Of those, epochs the array flushed of its own accord because a bound was reached.
    pub epochs_full: u64,
    /// Stripe chunks written home with every data row written (encoded without reading).
    pub full_chunks: u64,
    /// Chunks written home in part: their other rows read, partial parity encoded.
    pub partial_chunks: u64,
    /// Bytes of data rows read from the members to encode partial chunks.
    pub parity_read_bytes: u64,
    /// Intent records written (one round on every present member, then a flush).
    pub intent_records: u64,
    /// Held partial chunks left in memory by log flushes (`Device::flush_unheld`), counted at
    /// each such flush: the gathering of home writes at work.
    pub held_chunks: u64,
}

#[derive(Default)]
struct EpochCounters {
    epochs: AtomicU64,
    epochs_full: AtomicU64,
    full_chunks: AtomicU64,
    partial_chunks: AtomicU64,
    parity_read_bytes: AtomicU64,
    intent_records: AtomicU64,
    held_chunks: AtomicU64,
}

/// What `scrub` found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub stripes_checked: u64,
    /// Stripes not checked because a member is missing (their parity has nothing to agree with).
    pub stripes_skipped: u64,
    pub mismatches: Vec<Mismatch>,
}

/// A 4 KiB row block of a stripe whose parity did not match its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub stripe: u64,
    pub row: u64,
    /// The slot whose bytes were wrong, when exactly one replacement made the rows agree
    /// (needs m ≥ 2).
    pub bad_slot: Option<usize>,
    pub repaired: bool,
}

/// The header fields every member shares, kept while the array runs.
struct HeaderState {
    array_uuid: [u8; 16],
    member_uuids: Vec<[u8; 16]>,
    event: u64,
    state: ArrayState,
    missing_slots: u64,
}

/// What the array knows of its intent records (docs/RAID.md, *Rule 3*).
#[derive(Default)]
struct IntentState {
    /// The newest epoch number written to (or found on) the members.
    epoch: u64,
    /// The bitmap of the newest record on every present member; `None` when not known (after
    /// assembly), so that the first epoch with home writes writes one.
    durable_bitmap: Option<Vec<u8>>,
    /// The newest record holds partial parity: the next epoch with home writes must write a
    /// record (even one without entries) to retire it first.
    retire_pending: bool,
}

/// A partial-parity entry found at recovery, with the rows of every parity shard found.
struct RecoveredEntry {
    rows: Range<u64>,
    written: Vec<(usize, Range<u64>)>,
    parity: Vec<Option<Vec<u8>>>,
}

/// One stripe chunk of an epoch, read and encoded, waiting for its home writes.
struct Prepared<'a> {
    stripe: u64,
    rows: Range<u64>,
    /// The k data shards' new rows; `None` for a full chunk, whose new rows are the epoch's
    /// own bytes (encoded and written from there, not copied).
    data: Option<Vec<Vec<u8>>>,
    pending: &'a epoch::Pending,
    parity: Vec<Vec<u8>>,
}

impl Prepared<'_> {
    /// The new bytes of `range` (within the chunk's rows) of data shard `shard`.
    fn bytes(&self, shard: usize, range: Range<u64>) -> &[u8] {
        match &self.data {
            Some(data) => {
                &data[shard][(range.start - self.rows.start) as usize..(range.end - self.rows.start) as usize]
            }
            None => self.pending.bytes(shard, range),
        }
    }
}

#[derive(Default)]
struct SlotCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    read_errors: AtomicU64,
    write_errors: AtomicU64,
    flush_errors: AtomicU64,
    repaired_bytes: AtomicU64,
}

/// An array of member devices, assembled (`assemble`) or new (`create`).
pub struct ArrayDevice {
    geometry: Geometry,
    /// Kept apart from `header` so that errors raised with its lock held can name the array.
    array_uuid: [u8; 16],
    code: ReedSolomon,
    accelerator: Arc<Accelerator>,
    /// `None` for a slot missing at assembly; a rebuild fills its slot in when it completes.
    members: Vec<RwLock<Option<Arc<dyn Device>>>>,
    names: RwLock<Vec<String>>,
    /// The rebuild running, if any: writes to its slot's stripes it has passed reach it too.
    rebuilding: RwLock<Option<Arc<rebuild::Target>>>,
    missing: Vec<AtomicBool>,
    missing_reasons: Mutex<Vec<Option<String>>>,
    missing_count: AtomicUsize,
    /// Whether the headers say dirty (rule 1): set before the first write.
    dirty: AtomicBool,
    header: Mutex<HeaderState>,
    stripe_locks: Vec<Mutex<()>>,
    counters: Vec<SlotCounters>,
    reconstructed_bytes: AtomicU64,
    healed_bytes: AtomicU64,
    epoch_counters: EpochCounters,
    /// The writes since the last flush (rule 3: they go home only after their intent records).
    epoch: Mutex<Epoch>,
    /// Held shared by reads, exclusively by a flush: a read never sees members half-written by
    /// a flush with the flushed epoch already gone from memory.
    home: RwLock<()>,
    intent: Mutex<IntentState>,
}

/// One piece of a logical request: a byte range of one unit.
struct Piece {
    stripe: u64,
    shard: usize,
    row: u64,
    length: usize,
    buffer_offset: usize,
}

fn accel_error(error: tandem_accel::AccelError) -> Error {
    Error::Io { operation: "parity", offset: 0, source: std::io::Error::other(error.to_string()) }
}

impl ArrayDevice {
    fn new(
        geometry: Geometry,
        header: HeaderState,
        members: Vec<Option<Arc<dyn Device>>>,
        names: Vec<String>,
        missing_reasons: Vec<Option<String>>,
        accelerator: Arc<Accelerator>,
    ) -> Result<ArrayDevice> {
        assert!(members.len() == geometry.member_count && names.len() == geometry.member_count);
        let code = ReedSolomon::new(geometry.data_count(), geometry.parity_count).map_err(accel_error)?;
        let missing: Vec<AtomicBool> = members.iter().map(|member| AtomicBool::new(member.is_none())).collect();
        let missing_count = members.iter().filter(|member| member.is_none()).count();
        Ok(ArrayDevice {
            geometry,
            array_uuid: header.array_uuid,
            code,
            accelerator,
            dirty: AtomicBool::new(header.state == ArrayState::Dirty),
            header: Mutex::new(header),
            counters: (0..geometry.member_count).map(|_| SlotCounters::default()).collect(),
            members: members.into_iter().map(RwLock::new).collect(),
            names: RwLock::new(names),
            rebuilding: RwLock::new(None),
            missing,
            missing_reasons: Mutex::new(missing_reasons),
            missing_count: AtomicUsize::new(missing_count),
            stripe_locks: (0..STRIPE_LOCK_COUNT).map(|_| Mutex::new(())).collect(),
            reconstructed_bytes: AtomicU64::new(0),
            healed_bytes: AtomicU64::new(0),
            epoch_counters: EpochCounters::default(),
            epoch: Mutex::new(Epoch::default()),
            home: RwLock::new(()),
            intent: Mutex::new(IntentState::default()),
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn array_uuid(&self) -> [u8; 16] {
        self.array_uuid
    }

    /// Whether the headers say the array is in use or was not closed cleanly (dirty).
    pub fn state(&self) -> ArrayState {
        self.header.lock().state
    }

    /// Slots missing now (absent, stale, or failed while running), ascending.
    pub fn missing_slots(&self) -> Vec<usize> {
        (0..self.geometry.member_count).filter(|&slot| self.missing[slot].load(Ordering::Acquire)).collect()
    }

    pub fn statistics(&self) -> ArrayStatistics {
        let reasons = self.missing_reasons.lock().clone();
        ArrayStatistics {
            slots: (0..self.geometry.member_count)
                .map(|slot| {
                    let counters = &self.counters[slot];
                    SlotStatistics {
                        slot,
                        name: self.name(slot),
                        missing: self.missing[slot].load(Ordering::Acquire),
                        missing_reason: reasons[slot].clone(),
                        reads: counters.reads.load(Ordering::Relaxed),
                        writes: counters.writes.load(Ordering::Relaxed),
                        read_errors: counters.read_errors.load(Ordering::Relaxed),
                        write_errors: counters.write_errors.load(Ordering::Relaxed),
                        flush_errors: counters.flush_errors.load(Ordering::Relaxed),
                        repaired_bytes: counters.repaired_bytes.load(Ordering::Relaxed),
                    }
                })
                .collect(),
            reconstructed_bytes: self.reconstructed_bytes.load(Ordering::Relaxed),
            healed_bytes: self.healed_bytes.load(Ordering::Relaxed),
            epochs: {
                let counters = &self.epoch_counters;
                EpochStatistics {
                    epochs: counters.epochs.load(Ordering::Relaxed),
                    epochs_full: counters.epochs_full.load(Ordering::Relaxed),
                    full_chunks: counters.full_chunks.load(Ordering::Relaxed),
                    partial_chunks: counters.partial_chunks.load(Ordering::Relaxed),
                    parity_read_bytes: counters.parity_read_bytes.load(Ordering::Relaxed),
                    intent_records: counters.intent_records.load(Ordering::Relaxed),
                    held_chunks: counters.held_chunks.load(Ordering::Relaxed),
                }
            },
            rebuild: self.rebuild_progress(),
        }
    }

    /// The member of `slot` if it is present.
    fn present(&self, slot: usize) -> Option<Arc<dyn Device>> {
        if self.missing[slot].load(Ordering::Acquire) {
            return None;
        }
        self.members[slot].read().clone()
    }

    /// The name messages call the member of `slot` by.
    fn name(&self, slot: usize) -> String {
        self.names.read()[slot].clone()
    }

    /// Every member device the array holds, present or not (a failed one is still open).
    fn member_devices(&self) -> Vec<Arc<dyn Device>> {
        self.members.iter().filter_map(|member| member.read().clone()).collect()
    }

    /// The error every operation gets once more than m members are missing.
    fn lost_error(&self) -> Error {
        let slots: Vec<String> = self.missing_slots().iter().map(usize::to_string).collect();
        Error::Io {
            operation: "array",
            offset: 0,
            source: std::io::Error::other(format!(
                "array {}: slots {} missing, parity {} covers at most {}",
                short_uuid(&self.array_uuid),
                slots.join(", "),
                self.geometry.parity_count,
                self.geometry.parity_count
            )),
        }
    }

    fn check_enough(&self) -> Result<()> {
        if self.missing_count.load(Ordering::Acquire) > self.geometry.parity_count {
            return Err(self.lost_error());
        }
        Ok(())
    }

    /// Marks `slot` missing after `cause`, records it in every other member's header (flushed)
    /// before the caller goes on degraded, and fails if more than m are now missing.
    fn mark_missing(&self, slot: usize, cause: &Error) -> Result<()> {
        if !self.missing[slot].swap(true, Ordering::AcqRel) {
            self.missing_count.fetch_add(1, Ordering::AcqRel);
            self.missing_reasons.lock()[slot] = Some(cause.to_string());
        }
        self.check_enough()?;
        let mut header = self.header.lock();
        if header.missing_slots & (1u64 << slot) == 0 {
            self.write_headers(&mut header)?;
        }
        Ok(())
    }

    /// Writes the shared header state, one event on, to every present member and flushes them.
    /// A member that fails it is marked missing and the round is redone (at most n rounds: each
    /// failed round loses one more member).
    fn write_headers(&self, header: &mut HeaderState) -> Result<()> {
        for _round in 0..=self.geometry.member_count {
            self.check_enough()?;
            header.event += 1;
            header.missing_slots = self.missing_mask();
            let mut failed = false;
            for slot in 0..self.geometry.member_count {
                let Some(device) = self.present(slot) else { continue };
                let written = header::write_header(device.as_ref(), &self.member_header(header, slot))
                    .and_then(|()| device.flush());
                if let Err(error) = written {
                    self.counters[slot].write_errors.fetch_add(1, Ordering::Relaxed);
                    if !self.missing[slot].swap(true, Ordering::AcqRel) {
                        self.missing_count.fetch_add(1, Ordering::AcqRel);
                        self.missing_reasons.lock()[slot] = Some(error.to_string());
                    }
                    failed = true;
                }
            }
            if !failed {
                return Ok(());
            }
        }
        self.check_enough()?;
        Err(self.lost_error())
    }

    fn missing_mask(&self) -> u64 {
        self.missing_slots().iter().fold(0u64, |mask, &slot| mask | (1u64 << slot))
    }

    fn member_header(&self, header: &HeaderState, slot: usize) -> MemberHeader {
        MemberHeader {
            version: header::VERSION,
            slot,
            array_uuid: header.array_uuid,
            member_uuid: header.member_uuids[slot],
            member_count: self.geometry.member_count,
            parity_count: self.geometry.parity_count,
            stripe_unit_bytes: self.geometry.stripe_unit_bytes,
            state: header.state,
            stripe_count: self.geometry.stripe_count,
            event: header.event,
            missing_slots: header.missing_slots,
            member_uuids: header.member_uuids.clone(),
        }
    }

    /// Rule 1: the headers say dirty, durably, before the first write after a clean state.
    fn ensure_dirty(&self) -> Result<()> {
        if self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut header = self.header.lock();
        if header.state != ArrayState::Dirty {
            header.state = ArrayState::Dirty;
            self.write_headers(&mut header)?;
        }
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// Flushes every member and marks the array clean: a later assembly needs no resync. The
    /// array may be written again afterwards (it turns dirty first).
    pub fn close(&self) -> Result<()> {
        self.flush()?;
        let mut header = self.header.lock();
        header.state = ArrayState::Clean;
        self.write_headers(&mut header)?;
        self.dirty.store(false, Ordering::Release);
        Ok(())
    }

    /// Flushes every present member; one that fails is marked missing.
    fn flush_members(&self) -> Result<()> {
        self.check_enough()?;
        for slot in 0..self.geometry.member_count {
            let Some(device) = self.present(slot) else { continue };
            if let Err(error) = device.flush() {
                self.counters[slot].flush_errors.fetch_add(1, Ordering::Relaxed);
                self.mark_missing(slot, &error)?;
            }
        }
        self.check_enough()
    }

    fn read_member(&self, slot: usize, offset: u64, buffer: &mut [u8], uncached: bool) -> Result<bool> {
        let Some(device) = self.present(slot) else { return Ok(false) };
        let result = if uncached { device.read_uncached(offset, buffer) } else { device.read_at(offset, buffer) };
        match result {
            Ok(()) => {
                self.counters[slot].reads.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(error) => {
                self.counters[slot].read_errors.fetch_add(1, Ordering::Relaxed);
                self.mark_missing(slot, &error)?;
                Ok(false)
            }
        }
    }

    /// Writes to a present member; a missing one is passed over (its unit is rebuilt from the
    /// others) unless a rebuild of its slot has passed the stripe, a failing one is marked
    /// missing. A write of stripe units holds the stripe's lock.
    fn write_member(&self, slot: usize, offset: u64, data: &[u8]) -> Result<()> {
        let Some(device) = self.present(slot) else {
            self.write_rebuilt(slot, offset, data);
            return Ok(());
        };
        match device.write_at(offset, data) {
            Ok(()) => {
                self.counters[slot].writes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                self.counters[slot].write_errors.fetch_add(1, Ordering::Relaxed);
                self.mark_missing(slot, &error)
            }
        }
    }

    /// Cuts a logical range into pieces of single units.
    fn pieces(&self, offset: u64, length: usize) -> Vec<Piece> {
        let unit = self.geometry.stripe_unit_bytes;
        let mut pieces = Vec::with_capacity(length / unit as usize + 2);
        let mut done = 0usize;
        while done < length {
            let at = offset + done as u64;
            let unit_index = at / unit;
            let row = at % unit;
            let take = (length - done).min((unit - row) as usize);
            let stripe = unit_index / self.geometry.data_count() as u64;
            let shard = (unit_index % self.geometry.data_count() as u64) as usize;
            pieces.push(Piece { stripe, shard, row, length: take, buffer_offset: done });
            done += take;
        }
        pieces
    }

    /// Rows `rows` of the shards `wanted` of `stripe`, rebuilding those on missing members from
    /// k present shards. `Ok(None)`: a member failed while read (it is now missing): try again.
    /// The caller holds the stripe's lock.
    fn read_shard_rows(&self, stripe: u64, rows: Range<u64>, wanted: &[usize]) -> Result<Option<Vec<Vec<u8>>>> {
        let geometry = &self.geometry;
        let length = (rows.end - rows.start) as usize;
        let offset = geometry.member_offset(stripe, rows.start);
        if wanted.iter().all(|&shard| self.present(geometry.slot(stripe, shard)).is_some()) {
            let mut out = Vec::with_capacity(wanted.len());
            for &shard in wanted {
                let mut buffer = vec![0u8; length];
                if !self.read_member(geometry.slot(stripe, shard), offset, &mut buffer, false)? {
                    return Ok(None);
                }
                out.push(buffer);
            }
            return Ok(Some(out));
        }
        // Data shards first: where the wanted shards' neighbours are present, no parity is read.
        let sources: Vec<usize> = (0..geometry.member_count)
            .filter(|&shard| self.present(geometry.slot(stripe, shard)).is_some())
            .take(geometry.data_count())
            .collect();
        if sources.len() < geometry.data_count() {
            return Err(self.lost_error());
        }
        let mut shards = vec![vec![0u8; length]; geometry.member_count];
        let mut present = vec![false; geometry.member_count];
        for &shard in &sources {
            if !self.read_member(geometry.slot(stripe, shard), offset, &mut shards[shard], false)? {
                return Ok(None);
            }
            present[shard] = true;
        }
        let mut views: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
        self.accelerator.reed_solomon_reconstruct(&self.code, &mut views, &present).map_err(accel_error)?;
        let rebuilt = wanted.iter().filter(|&&shard| !present[shard]).count();
        self.reconstructed_bytes.fetch_add((rebuilt * length) as u64, Ordering::Relaxed);
        Ok(Some(wanted.iter().map(|&shard| std::mem::take(&mut shards[shard])).collect()))
    }

    /// Reads the members, then lays the epoch's writes over what they hold.
    fn read_logical(&self, offset: u64, buffer: &mut [u8], uncached: bool) -> Result<()> {
        check_range(self.size_bytes(), offset, buffer.len(), "read")?;
        let _home = self.home.read();
        let pieces = self.pieces(offset, buffer.len());
        for piece in &pieces {
            let target = &mut buffer[piece.buffer_offset..piece.buffer_offset + piece.length];
            let slot = self.geometry.slot(piece.stripe, piece.shard);
            let member_offset = self.geometry.member_offset(piece.stripe, piece.row);
            if !self.read_member(slot, member_offset, target, uncached)? {
                self.read_degraded(piece, target)?;
            }
        }
        let epoch = self.epoch.lock();
        if !epoch.is_empty() {
            for piece in &pieces {
                let target = &mut buffer[piece.buffer_offset..piece.buffer_offset + piece.length];
                epoch.overlay(&self.geometry, piece.stripe, piece.shard, piece.row, target);
            }
        }
        Ok(())
    }

    fn read_degraded(&self, piece: &Piece, target: &mut [u8]) -> Result<()> {
        let _stripe = self.stripe_locks[(piece.stripe % STRIPE_LOCK_COUNT as u64) as usize].lock();
        let rows = piece.row..piece.row + piece.length as u64;
        // Each failed try marks one more member missing, so n + 1 tries always end.
        for _try in 0..=self.geometry.member_count {
            if let Some(mut shards) = self.read_shard_rows(piece.stripe, rows.clone(), &[piece.shard])? {
                target.copy_from_slice(&shards.pop().expect("one shard asked"));
                return Ok(());
            }
        }
        Err(self.lost_error())
    }

    /// Rows `rows` of `shard` of `stripe` rebuilt from k present shards other than the one on
    /// `excluded_slot`: what that member's bytes should be, were they wrong. `Ok(None)` when k
    /// such shards are not there, or one failed while read. The caller holds the stripe's lock.
    fn rebuild_without(
        &self,
        stripe: u64,
        rows: Range<u64>,
        shard: usize,
        excluded_slot: usize,
    ) -> Result<Option<Vec<u8>>> {
        let geometry = &self.geometry;
        let length = (rows.end - rows.start) as usize;
        let sources: Vec<usize> = (0..geometry.member_count)
            .filter(|&source| {
                let slot = geometry.slot(stripe, source);
                slot != excluded_slot && self.present(slot).is_some()
            })
            .take(geometry.data_count())
            .collect();
        if sources.len() < geometry.data_count() {
            return Ok(None);
        }
        let mut shards = vec![vec![0u8; length]; geometry.member_count];
        let mut present = vec![false; geometry.member_count];
        for &source in &sources {
            let offset = geometry.member_offset(stripe, rows.start);
            if !self.read_member(geometry.slot(stripe, source), offset, &mut shards[source], false)? {
                return Ok(None);
            }
            present[source] = true;
        }
        let mut views: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
        self.accelerator.reed_solomon_reconstruct(&self.code, &mut views, &present).map_err(accel_error)?;
        Ok(Some(std::mem::take(&mut shards[shard])))
    }

    /// The self-healing read (`Device::read_checked`): when `check` rejects what the members
    /// hold, each member holding part of the range is left out in turn and its part rebuilt from
    /// the others; the first version `check` accepts is returned and written to that member.
    fn read_healing(&self, offset: u64, buffer: &mut [u8], check: &dyn Fn(&[u8]) -> bool) -> Result<bool> {
        self.read_logical(offset, buffer, false)?;
        if check(buffer) {
            return Ok(true);
        }
        // The members are what gets rebuilt: the epoch goes home first, and is read again.
        self.flush()?;
        self.read_logical(offset, buffer, false)?;
        if check(buffer) {
            return Ok(true);
        }
        let pieces = self.pieces(offset, buffer.len());
        let mut suspects: Vec<usize> =
            pieces.iter().map(|piece| self.geometry.slot(piece.stripe, piece.shard)).collect();
        suspects.sort_unstable();
        suspects.dedup();
        let as_read = buffer.to_vec();
        for suspect in suspects {
            let mut candidate = as_read.clone();
            let mut rebuilt_all = true;
            for piece in pieces.iter().filter(|piece| self.geometry.slot(piece.stripe, piece.shard) == suspect) {
                let _stripe = self.stripe_locks[(piece.stripe % STRIPE_LOCK_COUNT as u64) as usize].lock();
                let rows = piece.row..piece.row + piece.length as u64;
                match self.rebuild_without(piece.stripe, rows, piece.shard, suspect)? {
                    Some(bytes) => {
                        candidate[piece.buffer_offset..piece.buffer_offset + piece.length].copy_from_slice(&bytes)
                    }
                    None => rebuilt_all = false,
                }
            }
            if !rebuilt_all || !check(&candidate) {
                continue;
            }
            for piece in pieces.iter().filter(|piece| self.geometry.slot(piece.stripe, piece.shard) == suspect) {
                let _stripe = self.stripe_locks[(piece.stripe % STRIPE_LOCK_COUNT as u64) as usize].lock();
                let bytes = &candidate[piece.buffer_offset..piece.buffer_offset + piece.length];
                self.ensure_dirty()?;
                self.write_member(suspect, self.geometry.member_offset(piece.stripe, piece.row), bytes)?;
                self.healed_bytes.fetch_add(piece.length as u64, Ordering::Relaxed);
                self.counters[suspect].repaired_bytes.fetch_add(piece.length as u64, Ordering::Relaxed);
            }
            buffer.copy_from_slice(&candidate);
            return Ok(true);
        }
        Ok(false)
    }

    /// A write joins the epoch (rule 3): nothing reaches the members before the next flush,
    /// which the array also runs of its own accord when the epoch is full.
    fn write_logical(&self, offset: u64, data: &[u8], held: bool) -> Result<()> {
        check_range(self.size_bytes(), offset, data.len(), "write")?;
        if data.is_empty() {
            return Ok(());
        }
        self.check_enough()?;
        self.ensure_dirty()?;
        for piece in self.pieces(offset, data.len()) {
            // Cut at chunk boundaries, so that an empty epoch always takes each part.
            let mut row = piece.row;
            while row < piece.row + piece.length as u64 {
                let end = (row / CHUNK_ROWS_MAX + 1) * CHUNK_ROWS_MAX;
                let end = end.min(piece.row + piece.length as u64);
                let from = piece.buffer_offset + (row - piece.row) as usize;
                let bytes = &data[from..from + (end - row) as usize];
                if self.epoch.lock().insert(&self.geometry, piece.stripe, piece.shard, row, bytes, held).is_err() {
                    self.epoch_counters.epochs_full.fetch_add(1, Ordering::Relaxed);
                    self.flush()?;
                    if self.epoch.lock().insert(&self.geometry, piece.stripe, piece.shard, row, bytes, held).is_err() {
                        // Another thread's writes filled the new epoch at once: flush again.
                        self.flush()?;
                        self.epoch
                            .lock()
                            .insert(&self.geometry, piece.stripe, piece.shard, row, bytes, held)
                            .map_err(|_| Error::invalid("the array's epoch takes no write".to_string()))?;
                    }
                }
                row = end;
            }
        }
        Ok(())
    }

    /// Rows `rows` of `wanted` shards, tried again while members fail (each failure loses one).
    fn read_rows_retrying(&self, stripe: u64, rows: Range<u64>, wanted: &[usize]) -> Result<Vec<Vec<u8>>> {
        for _try in 0..=self.geometry.member_count {
            if let Some(shards) = self.read_shard_rows(stripe, rows.clone(), wanted)? {
                return Ok(shards);
            }
        }
        Err(self.lost_error())
    }

    fn encode_parity(&self, data: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        let inputs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        self.encode_slices(&inputs)
    }

    fn encode_slices(&self, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let length = inputs.first().map_or(0, |input| input.len());
        let mut parity = vec![vec![0u8; length]; self.geometry.parity_count];
        let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        self.accelerator.reed_solomon_encode(&self.code, inputs, &mut outputs).map_err(accel_error)?;
        Ok(parity)
    }

    /// Reads and encodes one chunk of the epoch: its new data rows and parity, and for a partial
    /// chunk the partial parity of the bytes it leaves untouched (pushed to `entries`). Like a
    /// reconstruct-write, never parity by difference: the rows written home are consistent
    /// whatever parity was on the members.
    fn prepare<'a>(
        &self,
        stripe: u64,
        pending: &'a epoch::Pending,
        entries: &mut Vec<PartialParity>,
    ) -> Result<Prepared<'a>> {
        let k = self.geometry.data_count();
        let rows = pending.rows();
        let length = (rows.end - rows.start) as usize;
        if pending.is_full() {
            // Nothing read: the parity comes from the epoch's bytes as they lie.
            self.epoch_counters.full_chunks.fetch_add(1, Ordering::Relaxed);
            let inputs: Vec<&[u8]> = (0..k).map(|shard| pending.bytes(shard, rows.clone())).collect();
            let parity = self.encode_slices(&inputs)?;
            return Ok(Prepared { stripe, rows, data: None, pending, parity });
        }
        let _stripe = self.stripe_locks[(stripe % STRIPE_LOCK_COUNT as u64) as usize].lock();
        let mut data = {
            self.epoch_counters.partial_chunks.fetch_add(1, Ordering::Relaxed);
            self.epoch_counters.parity_read_bytes.fetch_add((k * length) as u64, Ordering::Relaxed);
            let all_data: Vec<usize> = (0..k).collect();
            let mut untouched = self.read_rows_retrying(stripe, rows.clone(), &all_data)?;
            let old = untouched.clone();
            for (shard, ranges) in pending.written.iter().enumerate() {
                for range in ranges {
                    untouched[shard][(range.start - rows.start) as usize..(range.end - rows.start) as usize].fill(0);
                }
            }
            let written: Vec<(usize, Range<u64>)> = pending
                .written
                .iter()
                .enumerate()
                .flat_map(|(shard, ranges)| ranges.iter().map(move |range| (shard, range.clone())))
                .collect();
            for (parity_index, bytes) in self.encode_parity(&untouched)?.into_iter().enumerate() {
                entries.push(PartialParity {
                    stripe,
                    parity_index,
                    rows: rows.clone(),
                    written: written.clone(),
                    bytes,
                });
            }
            old
        };
        for (shard, ranges) in pending.written.iter().enumerate() {
            for range in ranges {
                data[shard][(range.start - rows.start) as usize..(range.end - rows.start) as usize]
                    .copy_from_slice(pending.bytes(shard, range.clone()));
            }
        }
        let parity = self.encode_parity(&data)?;
        Ok(Prepared { stripe, rows, data: Some(data), pending, parity })
    }

    /// Writes an epoch home (rule 3): each chunk read and encoded; the intent records (bitmap
    /// and partial parity) written to every present member and flushed where the epoch needs
    /// them; then the written data rows and the parity rows. The caller flushes after.
    fn write_epoch(&self, epoch: Epoch) -> Result<()> {
        let geometry = self.geometry;
        let mut entries = Vec::new();
        let mut bitmap = IntentRecord::new(0);
        let mut prepared = Vec::with_capacity(epoch.pending.len());
        self.epoch_counters.epochs.fetch_add(1, Ordering::Relaxed);
        for (&(stripe, _chunk), pending) in &epoch.pending {
            if pending.rows().is_empty() {
                continue;
            }
            bitmap.mark(stripe, geometry.stripe_count);
            prepared.push(self.prepare(stripe, pending, &mut entries)?);
        }
        self.write_intent(bitmap.bitmap, entries)?;
        let k = geometry.data_count();
        for chunk in prepared {
            let _stripe = self.stripe_locks[(chunk.stripe % STRIPE_LOCK_COUNT as u64) as usize].lock();
            for (shard, ranges) in chunk.pending.written.iter().enumerate() {
                for range in ranges {
                    let bytes = chunk.bytes(shard, range.clone());
                    self.write_member(
                        geometry.slot(chunk.stripe, shard),
                        geometry.member_offset(chunk.stripe, range.start),
                        bytes,
                    )?;
                }
            }
            for (parity, bytes) in chunk.parity.iter().enumerate() {
                self.write_member(
                    geometry.slot(chunk.stripe, k + parity),
                    geometry.member_offset(chunk.stripe, chunk.rows.start),
                    bytes,
                )?;
            }
        }
        Ok(())
    }

    /// Writes the intent records of a new epoch to every present member and flushes them, unless
    /// the epoch needs none: no partial parity, no bit the members' records lack, and no older
    /// partial parity to retire.
    fn write_intent(&self, bitmap: Vec<u8>, entries: Vec<PartialParity>) -> Result<()> {
        let mut intent = self.intent.lock();
        let covered = intent
            .durable_bitmap
            .as_ref()
            .is_some_and(|durable| bitmap.iter().zip(durable).all(|(wanted, kept)| wanted & !kept == 0));
        if entries.is_empty() && covered && !intent.retire_pending {
            return Ok(());
        }
        intent.epoch += 1;
        self.epoch_counters.intent_records.fetch_add(1, Ordering::Relaxed);
        let k = self.geometry.data_count();
        for slot in 0..self.geometry.member_count {
            if self.present(slot).is_none() {
                continue;
            }
            let record = IntentRecord {
                epoch: intent.epoch,
                bitmap: bitmap.clone(),
                entries: entries
                    .iter()
                    .filter(|entry| self.geometry.slot(entry.stripe, k + entry.parity_index) == slot)
                    .cloned()
                    .collect(),
            };
            let bytes = record.encode(&self.array_uuid, slot, self.geometry.stripe_count);
            self.write_member(slot, INTENT_START_BYTES, &bytes)?;
        }
        self.flush_members()?;
        intent.retire_pending = !entries.is_empty();
        intent.durable_bitmap = Some(bitmap);
        Ok(())
    }

    fn record_shape(&self, slot: usize) -> RecordShape {
        RecordShape {
            array_uuid: self.array_uuid,
            slot,
            data_count: self.geometry.data_count(),
            parity_count: self.geometry.parity_count,
            stripe_unit_bytes: self.geometry.stripe_unit_bytes,
            stripe_count: self.geometry.stripe_count,
        }
    }

    /// The intent records of the present members. A member that cannot be read is marked
    /// missing.
    fn read_records(&self) -> Result<Vec<(usize, IntentRecord)>> {
        let mut records = Vec::new();
        for slot in 0..self.geometry.member_count {
            let Some(device) = self.present(slot) else { continue };
            match intent::read_record(device.as_ref(), &self.record_shape(slot)) {
                Ok(Some(record)) => records.push((slot, record)),
                Ok(None) => {}
                Err(error) if error.is_corruption() => {
                    return Err(Error::corruption(format!("{}: {error}", self.name(slot))))
                }
                Err(error) => self.mark_missing(slot, &error)?,
            }
        }
        Ok(records)
    }

    /// At assembly of an array closed cleanly: goes on from the members' newest epoch number.
    pub(super) fn load_epoch(&self) -> Result<()> {
        let newest = self.read_records()?.iter().map(|(_, record)| record.epoch).max().unwrap_or(0);
        let mut intent = self.intent.lock();
        intent.epoch = newest;
        intent.retire_pending = true;
        Ok(())
    }

    /// Rule 3's recovery of an array not closed cleanly, with up to m members missing: the
    /// stripes the newest intent records mark have their parity recomputed from their data;
    /// where a data unit is missing, the bytes its stripe's epoch did not write are solved first
    /// from the partial parity. Returns the stripes recomputed.
    pub(super) fn recover(&self) -> Result<u64> {
        // The absent slots are marked in every present header before anything is written, so
        // that they come back stale.
        {
            let mut header = self.header.lock();
            self.write_headers(&mut header)?;
        }
        let records = self.read_records()?;
        let Some(newest) = records.iter().map(|(_, record)| record.epoch).max() else {
            // No record: no epoch went home since the array was made or upgraded.
            return Ok(0);
        };
        let geometry = self.geometry;
        let k = geometry.data_count();
        let mut found: std::collections::BTreeMap<(u64, u64, u64), RecoveredEntry> = Default::default();
        let mut bitmap = IntentRecord::new(newest);
        for (slot, record) in records.into_iter().filter(|(_, record)| record.epoch == newest) {
            bitmap.bitmap = record.bitmap.clone();
            for entry in record.entries {
                if geometry.slot(entry.stripe, k + entry.parity_index) != slot
                    || !bitmap.is_marked(entry.stripe, geometry.stripe_count)
                {
                    return Err(Error::corruption(format!(
                        "{}: intent record entry for stripe {} parity {} does not belong there",
                        self.name(slot),
                        entry.stripe,
                        entry.parity_index
                    )));
                }
                let key = (entry.stripe, entry.rows.start, entry.rows.end);
                let recovered = found.entry(key).or_insert_with(|| RecoveredEntry {
                    rows: entry.rows.clone(),
                    written: entry.written.clone(),
                    parity: vec![None; geometry.parity_count],
                });
                recovered.parity[entry.parity_index] = Some(entry.bytes);
            }
        }
        let chunk = intent::chunk_stripes(geometry.stripe_count);
        let mut recomputed = 0;
        for bit in 0..intent::BITMAP_BITS {
            if bitmap.bitmap[(bit / 8) as usize] & (1 << (bit % 8)) == 0 {
                continue;
            }
            for stripe in bit * chunk..((bit + 1) * chunk).min(geometry.stripe_count) {
                let entries: Vec<&RecoveredEntry> =
                    found.range((stripe, 0, 0)..(stripe + 1, 0, 0)).map(|(_, entry)| entry).collect();
                self.resync_stripe(stripe, &entries)?;
                recomputed += 1;
            }
        }
        self.flush_members()?;
        let mut intent = self.intent.lock();
        intent.epoch = newest;
        intent.retire_pending = true;
        Ok(recomputed)
    }

    /// Recomputes one stripe's parity from its data units (missing ones rebuilt from the others,
    /// then their untouched bytes solved from `entries`' partial parity) and writes it.
    fn resync_stripe(&self, stripe: u64, entries: &[&RecoveredEntry]) -> Result<()> {
        let geometry = self.geometry;
        let _stripe = self.stripe_locks[(stripe % STRIPE_LOCK_COUNT as u64) as usize].lock();
        let all_data: Vec<usize> = (0..geometry.data_count()).collect();
        let mut data = self.read_rows_retrying(stripe, 0..geometry.stripe_unit_bytes, &all_data)?;
        for entry in entries {
            self.apply_partial_parity(stripe, entry, &mut data)?;
        }
        for (index, bytes) in self.encode_parity(&data)?.iter().enumerate() {
            let slot = geometry.slot(stripe, geometry.data_count() + index);
            self.write_member(slot, geometry.member_offset(stripe, 0), bytes)?;
        }
        self.check_enough()
    }

    /// Solves the bytes of `entry`'s rows that its epoch did not write on the missing data units
    /// of `stripe`: with the written bytes taken as zero, the present data units and the partial
    /// parity rows found form a codeword with at most m unknown shards (a missing parity member
    /// loses its row but is no unknown of it). With fewer rows than that, the record of that
    /// epoch was torn on a member, so its home writes never started and `data` is right as read.
    fn apply_partial_parity(&self, stripe: u64, entry: &RecoveredEntry, data: &mut [Vec<u8>]) -> Result<()> {
        let geometry = self.geometry;
        let k = geometry.data_count();
        let missing: Vec<usize> =
            (0..k).filter(|&shard| self.present(geometry.slot(stripe, shard)).is_none()).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let rows = entry.rows.clone();
        let length = (rows.end - rows.start) as usize;
        let local = |range: &Range<u64>| (range.start - rows.start) as usize..(range.end - rows.start) as usize;
        let mut shards = vec![vec![0u8; length]; geometry.member_count];
        let mut present = vec![false; geometry.member_count];
        for shard in (0..k).filter(|shard| !missing.contains(shard)) {
            shards[shard].copy_from_slice(&data[shard][rows.start as usize..rows.end as usize]);
            present[shard] = true;
        }
        for (shard, range) in &entry.written {
            shards[*shard][local(range)].fill(0);
        }
        for (index, bytes) in entry.parity.iter().enumerate() {
            if let Some(bytes) = bytes {
                shards[k + index].copy_from_slice(bytes);
                present[k + index] = true;
            }
        }
        if present.iter().filter(|&&here| here).count() < k {
            return Ok(());
        }
        let mut views: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
        self.accelerator.reed_solomon_reconstruct(&self.code, &mut views, &present).map_err(accel_error)?;
        for &shard in &missing {
            let mut untouched = vec![true; length];
            for (_, range) in entry.written.iter().filter(|(written, _)| *written == shard) {
                untouched[local(range)].fill(false);
            }
            for (at, keep) in untouched.iter().enumerate() {
                if *keep {
                    data[shard][rows.start as usize + at] = shards[shard][at];
                }
            }
        }
        Ok(())
    }

    /// Rule 1's whole resync: every stripe's parity recomputed from its data units. Needs every
    /// member (a version-1 array, which has no intent records, and parity made at creation).
    pub fn resync(&self) -> Result<u64> {
        if self.missing_count.load(Ordering::Acquire) > 0 {
            return Err(Error::invalid("a resync needs every member present".to_string()));
        }
        self.flush()?;
        for stripe in 0..self.geometry.stripe_count {
            self.resync_stripe(stripe, &[])?;
        }
        self.flush()?;
        Ok(self.geometry.stripe_count)
    }

    /// Checks every stripe's parity against its data, 4 KiB of rows at a time; with m ≥ 2 names
    /// the one slot whose bytes are wrong, and with `repair` rewrites them from the others.
    pub fn scrub(&self, repair: bool) -> Result<ScrubReport> {
        let geometry = self.geometry;
        if repair {
            // Repairs are writes like any other: a crash among them must leave the array dirty.
            self.ensure_dirty()?;
        }
        // The members are what scrub checks: the epoch goes home first.
        self.flush()?;
        let mut report = ScrubReport::default();
        for stripe in 0..geometry.stripe_count {
            let _stripe = self.stripe_locks[(stripe % STRIPE_LOCK_COUNT as u64) as usize].lock();
            if self.missing_count.load(Ordering::Acquire) > 0 {
                report.stripes_skipped += 1;
                continue;
            }
            let all: Vec<usize> = (0..geometry.member_count).collect();
            let Some(shards) = self.read_shard_rows(stripe, 0..geometry.stripe_unit_bytes, &all)? else {
                report.stripes_skipped += 1;
                continue;
            };
            report.stripes_checked += 1;
            for row in (0..geometry.stripe_unit_bytes).step_by(SCRUB_ROW_BYTES as usize) {
                let end = (row + SCRUB_ROW_BYTES).min(geometry.stripe_unit_bytes);
                let block: Vec<&[u8]> = shards.iter().map(|shard| &shard[row as usize..end as usize]).collect();
                if self.consistent(&block)? {
                    continue;
                }
                let bad_slot = self.locate(&block)?.map(|(shard, bytes)| (geometry.slot(stripe, shard), bytes));
                let mut repaired = false;
                if let (true, Some((slot, bytes))) = (repair, &bad_slot) {
                    self.write_member(*slot, geometry.member_offset(stripe, row), bytes)?;
                    repaired = self.present(*slot).is_some();
                    if repaired {
                        self.counters[*slot].repaired_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    }
                }
                report.mismatches.push(Mismatch { stripe, row, bad_slot: bad_slot.map(|(slot, _)| slot), repaired });
            }
        }
        if repair {
            self.flush()?;
        }
        Ok(report)
    }

    /// Whether the parity shards of `shards` (all n, one row block) match its data shards.
    fn consistent(&self, shards: &[&[u8]]) -> Result<bool> {
        let k = self.geometry.data_count();
        let mut parity = vec![vec![0u8; shards[0].len()]; self.geometry.parity_count];
        let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        self.accelerator.reed_solomon_encode(&self.code, &shards[..k], &mut outputs).map_err(accel_error)?;
        Ok(parity.iter().zip(&shards[k..]).all(|(computed, stored)| computed.as_slice() == *stored))
    }

    /// The one shard whose rebuilt bytes make an inconsistent row block consistent, with those
    /// bytes; `None` when none or several do (m = 1 cannot tell which shard is wrong).
    fn locate(&self, shards: &[&[u8]]) -> Result<Option<(usize, Vec<u8>)>> {
        let count = self.geometry.member_count;
        let mut found = None;
        for suspect in 0..count {
            let mut copy: Vec<Vec<u8>> = shards.iter().map(|shard| shard.to_vec()).collect();
            let mut present = vec![true; count];
            present[suspect] = false;
            let mut views: Vec<&mut [u8]> = copy.iter_mut().map(Vec::as_mut_slice).collect();
            self.accelerator.reed_solomon_reconstruct(&self.code, &mut views, &present).map_err(accel_error)?;
            let rebuilt = copy[suspect].clone();
            let mut candidate: Vec<&[u8]> = shards.to_vec();
            candidate[suspect] = &rebuilt;
            if self.consistent(&candidate)? {
                if found.is_some() {
                    return Ok(None);
                }
                found = Some((suspect, rebuilt));
            }
        }
        Ok(found)
    }
}

impl Device for ArrayDevice {
    fn size_bytes(&self) -> u64 {
        self.geometry.logical_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.read_logical(offset, buffer, false)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_logical(offset, data, false)
    }
    /// Writes the epoch home (rule 3), then flushes every member.
    fn flush(&self) -> Result<()> {
        let _home = self.home.write();
        let epoch = std::mem::take(&mut *self.epoch.lock());
        self.check_enough()?;
        if !epoch.is_empty() {
            self.write_epoch(epoch)?;
        }
        self.flush_members()
    }
    /// A held write joins the epoch like any other, marked held (docs/RAID.md, *Held home
    /// writes*).
    fn write_held(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_logical(offset, data, true)
    }
    fn stripe_bytes(&self) -> Option<u64> {
        Some(self.geometry.stripe_data_bytes())
    }
    /// Writes home, as an epoch of their own, the chunks with an unheld write and the full
    /// ones; held partial chunks stay in memory (reads still see them) until more writes
    /// complete them or a `flush` takes everything. What stays was never on a member, so a
    /// crash leaves its stripes as they were, and the volume's replay writes it again.
    fn flush_unheld(&self) -> Result<()> {
        let _home = self.home.write();
        let (epoch, kept) = self.epoch.lock().take_unheld(&self.geometry);
        self.epoch_counters.held_chunks.fetch_add(kept as u64, Ordering::Relaxed);
        self.check_enough()?;
        if !epoch.is_empty() {
            self.write_epoch(epoch)?;
        }
        self.flush_members()
    }
    fn reachable_by_other_processes(&self) -> bool {
        self.member_devices().iter().any(|member| member.reachable_by_other_processes())
    }
    fn is_read_only(&self) -> bool {
        self.member_devices().iter().any(|member| member.is_read_only())
    }
    fn read_uncached(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.read_logical(offset, buffer, true)
    }
    fn read_checked(&self, offset: u64, buffer: &mut [u8], check: &dyn Fn(&[u8]) -> bool) -> Result<bool> {
        if self.is_read_only() {
            self.read_logical(offset, buffer, false)?;
            return Ok(check(buffer));
        }
        self.read_healing(offset, buffer, check)
    }
}

impl Drop for ArrayDevice {
    /// A closing array is marked clean when everything before reached its members; a failing
    /// one stays dirty, and the next assembly resyncs it.
    fn drop(&mut self) {
        if self.dirty.load(Ordering::Acquire) && !self.is_read_only() {
            let _ = self.close();
        }
    }
}
