//! The writes of an epoch (docs/RAID.md, *Rule 3*): everything written to the array since the
//! last flush, held in memory by stripe chunk (reads see it) until the flush writes it home
//! after its intent records. Bounded: a write that would pass a bound is refused with
//! `Full`, and the array flushes the epoch of its own accord before taking it.

use std::collections::BTreeMap;
use std::ops::Range;

use super::intent::{ENTRY_HEADER_BYTES, INTENT_BYTES_MAX, RANGE_BYTES, RECORD_FIXED_BYTES};
use super::Geometry;

/// Most bytes of data one epoch holds.
pub const EPOCH_BYTES_MAX: u64 = 64 << 20;
/// Most stripe chunks one epoch holds.
pub const EPOCH_CHUNKS_MAX: usize = 4096;
/// Rows of a stripe one pending chunk covers at most: so that a chunk's partial parity fits a
/// member's intent record several times over, whatever the stripe unit.
pub const CHUNK_ROWS_MAX: u64 = 128 << 10;
/// Most written ranges one chunk keeps (each costs `RANGE_BYTES` in the intent record).
pub const CHUNK_RANGES_MAX: usize = 64;

/// The written rows of one chunk of one stripe.
pub struct Pending {
    /// First row of the chunk within the stripe's units.
    pub chunk_start: u64,
    pub chunk_rows: u64,
    /// k · chunk_rows bytes: data shard d's row r at `d · chunk_rows + (r − chunk_start)`.
    pub data: Vec<u8>,
    /// Per data shard, the rows written: sorted, disjoint, not touching.
    pub written: Vec<Vec<Range<u64>>>,
    /// The intent-record bytes this chunk's partial parity takes on each of its parity members
    /// as it stands (`partial_parity_bytes`), counted in the epoch's `charges`.
    charge: u64,
    /// Every write in it was held (`Device::write_held`): a log flush may leave it in the
    /// epoch while it is partial (docs/RAID.md, *Held home writes*).
    pub held: bool,
}

/// The rows any shard of `written` writes, starting at `chunk_start` when none does.
fn rows_of(written: &[Vec<Range<u64>>], chunk_start: u64) -> Range<u64> {
    let start = written.iter().filter_map(|ranges| ranges.first()).map(|range| range.start).min();
    let end = written.iter().filter_map(|ranges| ranges.last()).map(|range| range.end).max();
    match (start, end) {
        (Some(start), Some(end)) => start..end,
        _ => chunk_start..chunk_start,
    }
}

/// Whether every shard of `written` covers all of its rows.
fn is_full_of(written: &[Vec<Range<u64>>], chunk_start: u64) -> bool {
    let rows = rows_of(written, chunk_start);
    written.iter().all(|ranges| ranges.len() == 1 && ranges[0] == rows)
}

/// The bytes of the partial-parity entry a chunk written as `written` puts in the intent
/// record of each of its parity members (`intent::PartialParity::encoded_bytes`): none when it
/// is full, which needs no partial parity.
fn partial_parity_bytes(written: &[Vec<Range<u64>>], chunk_start: u64) -> u64 {
    if is_full_of(written, chunk_start) {
        return 0;
    }
    let rows = rows_of(written, chunk_start);
    let ranges: usize = written.iter().map(Vec::len).sum();
    (ENTRY_HEADER_BYTES + RANGE_BYTES * ranges) as u64 + (rows.end - rows.start)
}

impl Pending {
    /// The rows any shard writes: what the parity rows of this chunk must be rewritten over.
    pub fn rows(&self) -> Range<u64> {
        rows_of(&self.written, self.chunk_start)
    }

    pub fn range_count(&self) -> usize {
        self.written.iter().map(Vec::len).sum()
    }

    /// Whether every data shard is written over all of `rows()`: no byte of those rows keeps
    /// durable data, so the chunk needs no partial parity and no read.
    pub fn is_full(&self) -> bool {
        is_full_of(&self.written, self.chunk_start)
    }

    /// Bytes of shard `shard`'s row `row` as held.
    pub fn bytes(&self, shard: usize, rows: Range<u64>) -> &[u8] {
        let at = shard as u64 * self.chunk_rows + rows.start - self.chunk_start;
        &self.data[at as usize..(at + rows.end - rows.start) as usize]
    }
}

/// Adds `range` to sorted, disjoint, non-touching `ranges`, merging what it meets.
fn merge(ranges: &mut Vec<Range<u64>>, range: Range<u64>) {
    let mut merged = range;
    ranges.retain(|other| {
        if other.end < merged.start || other.start > merged.end {
            return true;
        }
        merged = merged.start.min(other.start)..merged.end.max(other.end);
        false
    });
    let at = ranges.partition_point(|other| other.start < merged.start);
    ranges.insert(at, merged);
}

/// Whether `ranges` would count more than `CHUNK_RANGES_MAX` with `range` merged in.
fn merged_count(ranges: &[Range<u64>], range: &Range<u64>) -> usize {
    let met = ranges.iter().filter(|other| !(other.end < range.start || other.start > range.end)).count();
    ranges.len() + 1 - met
}

/// A write the epoch cannot take until it is flushed.
pub struct Full;

#[derive(Default)]
pub struct Epoch {
    /// By (stripe, chunk index).
    pub pending: BTreeMap<(u64, u64), Pending>,
    held_bytes: u64,
    /// Per member slot, the most intent-record bytes the epoch's partial parity can take there.
    charges: Vec<u64>,
}

impl Epoch {
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    fn chunk_rows(geometry: &Geometry) -> u64 {
        geometry.stripe_unit_bytes.min(CHUNK_ROWS_MAX)
    }

    /// Holds `data` for rows `row..` of data shard `shard` of `stripe` (within one unit).
    pub fn insert(
        &mut self,
        geometry: &Geometry,
        stripe: u64,
        shard: usize,
        row: u64,
        data: &[u8],
        held: bool,
    ) -> Result<(), Full> {
        let chunk_rows = Self::chunk_rows(geometry);
        let end = row + data.len() as u64;
        assert!(shard < geometry.data_count() && end <= geometry.stripe_unit_bytes);
        // Check every chunk the write meets before changing any, so a refusal changes nothing.
        // The intent-record bytes are counted as the chunks will stand after the write: a chunk
        // the write fills takes none, so streams of small writes that complete their stripes
        // within the epoch are not cut by a bound meant for partial parity.
        let mut new_chunks = 0u64;
        let (mut charge_before, mut charge_after) = (0u64, 0u64);
        let mut charges_after = Vec::new();
        for chunk in row / chunk_rows..end.div_ceil(chunk_rows) {
            let rows = row.max(chunk * chunk_rows)..end.min((chunk + 1) * chunk_rows);
            let mut written = match self.pending.get(&(stripe, chunk)) {
                Some(pending) => {
                    if merged_count(&pending.written[shard], &rows) + pending.range_count()
                        - pending.written[shard].len()
                        > CHUNK_RANGES_MAX
                    {
                        return Err(Full);
                    }
                    charge_before += pending.charge;
                    pending.written.clone()
                }
                None => {
                    new_chunks += 1;
                    vec![Vec::new(); geometry.data_count()]
                }
            };
            merge(&mut written[shard], rows);
            let charge = partial_parity_bytes(&written, chunk * chunk_rows);
            charge_after += charge;
            charges_after.push(charge);
        }
        if !self.room_for(geometry, stripe, new_chunks, chunk_rows, charge_before, charge_after) {
            return Err(Full);
        }
        for (chunk, charge) in (row / chunk_rows..end.div_ceil(chunk_rows)).zip(charges_after) {
            let rows = row.max(chunk * chunk_rows)..end.min((chunk + 1) * chunk_rows);
            if !self.pending.contains_key(&(stripe, chunk)) {
                self.open_chunk(geometry, stripe, chunk, chunk_rows);
            }
            let pending = self.pending.get_mut(&(stripe, chunk)).expect("opened above");
            let at = (shard as u64 * chunk_rows + rows.start - pending.chunk_start) as usize;
            let from = (rows.start - row) as usize;
            let length = (rows.end - rows.start) as usize;
            pending.data[at..at + length].copy_from_slice(&data[from..from + length]);
            merge(&mut pending.written[shard], rows);
            debug_assert_eq!(charge, partial_parity_bytes(&pending.written, pending.chunk_start));
            pending.charge = charge;
            pending.held &= held;
        }
        for parity in 0..geometry.parity_count {
            let slot = geometry.slot(stripe, geometry.data_count() + parity);
            self.charges[slot] = self.charges[slot] - charge_before + charge_after;
        }
        Ok(())
    }

    /// Whether `new_chunks` more chunks of `stripe` fit, and its parity members' intent records
    /// the change of its chunks' partial parity from `charge_before` to `charge_after` bytes.
    fn room_for(
        &self,
        geometry: &Geometry,
        stripe: u64,
        new_chunks: u64,
        chunk_rows: u64,
        charge_before: u64,
        charge_after: u64,
    ) -> bool {
        let k = geometry.data_count() as u64;
        if self.held_bytes + new_chunks * k * chunk_rows > EPOCH_BYTES_MAX
            || self.pending.len() + new_chunks as usize > EPOCH_CHUNKS_MAX
        {
            return false;
        }
        (0..geometry.parity_count).all(|parity| {
            let slot = geometry.slot(stripe, geometry.data_count() + parity);
            let held = self.charges.get(slot).copied().unwrap_or(0);
            debug_assert!(held >= charge_before);
            held - charge_before + charge_after + RECORD_FIXED_BYTES as u64 <= INTENT_BYTES_MAX
        })
    }

    fn open_chunk(&mut self, geometry: &Geometry, stripe: u64, chunk: u64, chunk_rows: u64) {
        let k = geometry.data_count();
        let pending = Pending {
            chunk_start: chunk * chunk_rows,
            chunk_rows,
            data: vec![0u8; k * chunk_rows as usize],
            written: vec![Vec::new(); k],
            charge: 0,
            held: true,
        };
        if self.charges.len() < geometry.member_count {
            self.charges.resize(geometry.member_count, 0);
        }
        self.held_bytes += pending.data.len() as u64;
        self.pending.insert((stripe, chunk), pending);
    }

    /// Takes out of the epoch what a log flush (`Device::flush_unheld`) writes home: every
    /// chunk with an unheld write, and every full chunk (it costs no read and no partial
    /// parity, so holding it gains nothing). Held partial chunks stay, waiting for the rest
    /// of their rows. Returns the chunks taken, as an epoch of their own, and how many stayed.
    pub fn take_unheld(&mut self, geometry: &Geometry) -> (Epoch, usize) {
        let pending = std::mem::take(&mut self.pending);
        let mut taken = Epoch::default();
        for (key, chunk) in pending {
            if chunk.held && !chunk.is_full() {
                self.pending.insert(key, chunk);
            } else {
                taken.pending.insert(key, chunk);
            }
        }
        self.recount(geometry);
        taken.recount(geometry);
        (taken, self.pending.len())
    }

    /// Sets `held_bytes` and `charges` from the chunks held.
    fn recount(&mut self, geometry: &Geometry) {
        self.held_bytes = self.pending.values().map(|pending| pending.data.len() as u64).sum();
        self.charges = vec![0; geometry.member_count];
        for (&(stripe, _), pending) in &self.pending {
            for parity in 0..geometry.parity_count {
                self.charges[geometry.slot(stripe, geometry.data_count() + parity)] += pending.charge;
            }
        }
    }

    /// Lays the epoch's bytes of rows `row..` of data shard `shard` of `stripe` over `buffer`.
    pub fn overlay(&self, geometry: &Geometry, stripe: u64, shard: usize, row: u64, buffer: &mut [u8]) {
        let chunk_rows = Self::chunk_rows(geometry);
        let end = row + buffer.len() as u64;
        for chunk in row / chunk_rows..end.div_ceil(chunk_rows) {
            let Some(pending) = self.pending.get(&(stripe, chunk)) else { continue };
            for range in &pending.written[shard] {
                let (from, to) = (range.start.max(row), range.end.min(end));
                if from < to {
                    buffer[(from - row) as usize..(to - row) as usize].copy_from_slice(pending.bytes(shard, from..to));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the intent records of `epoch`'s pending chunks should charge member `slot`: the
    /// partial parity of every pending chunk whose stripe keeps a parity unit there.
    fn charge_of_pending(epoch: &Epoch, geometry: &Geometry, slot: usize) -> u64 {
        epoch
            .pending
            .iter()
            .filter(|((stripe, _), _)| {
                (0..geometry.parity_count).any(|parity| geometry.slot(*stripe, geometry.data_count() + parity) == slot)
            })
            .map(|(_, pending)| partial_parity_bytes(&pending.written, pending.chunk_start))
            .sum()
    }

    #[test]
    fn ranges_merge_and_touching_ones_join() {
        let mut ranges = Vec::new();
        merge(&mut ranges, 10..20);
        merge(&mut ranges, 30..40);
        merge(&mut ranges, 0..5);
        assert_eq!(ranges, vec![0..5, 10..20, 30..40]);
        merge(&mut ranges, 20..30);
        assert_eq!(ranges, vec![0..5, 10..40]);
        merge(&mut ranges, 3..12);
        assert_eq!(ranges, vec![0..40]);
        assert_eq!(merged_count(&ranges, &(50..60)), 2);
        assert_eq!(merged_count(&ranges, &(40..60)), 1);
    }

    /// Small writes that fill their stripes within the epoch take no room in the intent
    /// records (they need no partial parity), so a back end writing 4 KiB blocks home in order
    /// is not cut into epochs by that bound: 100 stripes of a 4+2 array with 64 KiB units fit,
    /// where charging each chunk its most partial parity when opened took 16 of them per
    /// parity member (~1 MiB / 65.8 KiB). Partial chunks still fill the records, and the
    /// epoch's count is then exactly what their entries take.
    #[test]
    fn full_chunks_take_no_intent_room_and_partial_ones_exactly_theirs() {
        let geometry = Geometry { member_count: 6, parity_count: 2, stripe_unit_bytes: 64 << 10, stripe_count: 10_000 };
        let block = vec![7u8; 4096];
        let mut epoch = Epoch::default();
        for stripe in 0..100 {
            for shard in 0..geometry.data_count() {
                for row in (0..geometry.stripe_unit_bytes).step_by(4096) {
                    assert!(epoch.insert(&geometry, stripe, shard, row, &block, true).is_ok(), "stripe {stripe}");
                }
            }
        }
        assert!(epoch.pending.values().all(Pending::is_full));
        assert!(epoch.charges.iter().all(|&charge| charge == 0));
        // 60 KiB at the start of each further stripe: partial, 24 + 12 + 61,440 bytes of record
        // on each of its two parity members, so the records fill before the epoch's memory.
        let piece = vec![9u8; 60 << 10];
        let mut stripe = 100;
        while epoch.insert(&geometry, stripe, 0, 0, &piece, true).is_ok() {
            stripe += 1;
            assert!(stripe < 1000, "the intent records never filled");
        }
        for slot in 0..geometry.member_count {
            let entries = charge_of_pending(&epoch, &geometry, slot);
            assert_eq!(epoch.charges[slot], entries, "slot {slot}");
            assert!(entries + RECORD_FIXED_BYTES as u64 <= INTENT_BYTES_MAX);
        }
        // The stripe refused would have passed a record's room on one of its parity members.
        let refused = (0..geometry.parity_count).map(|parity| geometry.slot(stripe, geometry.data_count() + parity));
        assert!(refused
            .into_iter()
            .any(|slot| epoch.charges[slot] + 61_476 + RECORD_FIXED_BYTES as u64 > INTENT_BYTES_MAX));
        // Filling a partial chunk gives its room back.
        let before = epoch.charges.clone();
        for shard in 0..geometry.data_count() {
            for row in (0..geometry.stripe_unit_bytes).step_by(4096) {
                assert!(epoch.insert(&geometry, 100, shard, row, &block, true).is_ok());
            }
        }
        let freed: u64 = before.iter().zip(&epoch.charges).map(|(before, after)| before - after).sum();
        assert_eq!(freed, 2 * 61_476);
    }

    /// A log flush takes the chunks with an unheld write and the full ones, and leaves the
    /// held partial ones with exactly their room: the bytes held and the intent-record charges
    /// are those of what stayed, so the bounds still hold the epoch as it is.
    #[test]
    fn a_log_flush_takes_unheld_and_full_chunks_and_keeps_held_partial_ones() {
        let geometry = Geometry { member_count: 6, parity_count: 2, stripe_unit_bytes: 64 << 10, stripe_count: 100 };
        let block = vec![3u8; 4096];
        let mut epoch = Epoch::default();
        // Stripe 0: held and full. Stripe 1: held, one block. Stripe 2: one held block and one
        // unheld. Stripe 3: held, two blocks.
        for shard in 0..geometry.data_count() {
            for row in (0..geometry.stripe_unit_bytes).step_by(4096) {
                assert!(epoch.insert(&geometry, 0, shard, row, &block, true).is_ok());
            }
        }
        assert!(epoch.insert(&geometry, 1, 0, 0, &block, true).is_ok());
        assert!(epoch.insert(&geometry, 2, 1, 0, &block, true).is_ok());
        assert!(epoch.insert(&geometry, 2, 2, 8192, &block, false).is_ok());
        assert!(epoch.insert(&geometry, 3, 0, 0, &block, true).is_ok());
        assert!(epoch.insert(&geometry, 3, 3, 4096, &block, true).is_ok());
        let (taken, kept) = epoch.take_unheld(&geometry);
        let stripes = |epoch: &Epoch| epoch.pending.keys().map(|(stripe, _)| *stripe).collect::<Vec<_>>();
        assert_eq!((stripes(&taken), stripes(&epoch), kept), (vec![0, 2], vec![1, 3], 2));
        for part in [&taken, &epoch] {
            let bytes: u64 = part.pending.values().map(|pending| pending.data.len() as u64).sum();
            assert_eq!(part.held_bytes, bytes);
            for slot in 0..geometry.member_count {
                assert_eq!(part.charges[slot], charge_of_pending(part, &geometry, slot), "slot {slot}");
            }
        }
        // What stayed is still read, and an unheld write to it makes it go at the next one.
        let mut back = vec![0u8; 4096];
        epoch.overlay(&geometry, 3, 3, 4096, &mut back);
        assert_eq!(back, block);
        assert!(epoch.insert(&geometry, 1, 1, 0, &block, false).is_ok());
        let (taken, kept) = epoch.take_unheld(&geometry);
        assert_eq!((stripes(&taken), stripes(&epoch), kept), (vec![1], vec![3], 1));
    }
}
