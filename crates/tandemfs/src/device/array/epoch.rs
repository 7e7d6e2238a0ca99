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
}

impl Pending {
    /// The rows any shard writes: what the parity rows of this chunk must be rewritten over.
    pub fn rows(&self) -> Range<u64> {
        let start = self.written.iter().filter_map(|ranges| ranges.first()).map(|range| range.start).min();
        let end = self.written.iter().filter_map(|ranges| ranges.last()).map(|range| range.end).max();
        match (start, end) {
            (Some(start), Some(end)) => start..end,
            _ => self.chunk_start..self.chunk_start,
        }
    }

    pub fn range_count(&self) -> usize {
        self.written.iter().map(Vec::len).sum()
    }

    /// Whether every data shard is written over all of `rows()`: no byte of those rows keeps
    /// durable data, so the chunk needs no partial parity and no read.
    pub fn is_full(&self) -> bool {
        let rows = self.rows();
        self.written.iter().all(|ranges| ranges.len() == 1 && ranges[0] == rows)
    }

    /// Bytes of shard `shard`'s row `row` as held.
    pub fn bytes(&self, shard: usize, rows: Range<u64>) -> &[u8] {
        let at = shard as u64 * self.chunk_rows + rows.start - self.chunk_start;
        &self.data[at as usize..(at + rows.end - rows.start) as usize]
    }

    /// The intent-record bytes this chunk's partial parity can take on each parity member.
    fn charge_max(&self) -> u64 {
        (ENTRY_HEADER_BYTES + RANGE_BYTES * CHUNK_RANGES_MAX) as u64 + self.chunk_rows
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
    ) -> Result<(), Full> {
        let chunk_rows = Self::chunk_rows(geometry);
        let end = row + data.len() as u64;
        assert!(shard < geometry.data_count() && end <= geometry.stripe_unit_bytes);
        // Check every chunk the write meets before changing any, so a refusal changes nothing.
        let mut new_chunks = 0u64;
        for chunk in row / chunk_rows..end.div_ceil(chunk_rows) {
            let rows = row.max(chunk * chunk_rows)..end.min((chunk + 1) * chunk_rows);
            match self.pending.get(&(stripe, chunk)) {
                Some(pending)
                    if merged_count(&pending.written[shard], &rows) + pending.range_count()
                        - pending.written[shard].len()
                        > CHUNK_RANGES_MAX =>
                {
                    return Err(Full)
                }
                Some(_) => {}
                None => new_chunks += 1,
            }
        }
        if new_chunks > 0 && !self.room_for(geometry, stripe, new_chunks, chunk_rows) {
            return Err(Full);
        }
        for chunk in row / chunk_rows..end.div_ceil(chunk_rows) {
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
        }
        Ok(())
    }

    fn room_for(&self, geometry: &Geometry, stripe: u64, new_chunks: u64, chunk_rows: u64) -> bool {
        let k = geometry.data_count() as u64;
        if self.held_bytes + new_chunks * k * chunk_rows > EPOCH_BYTES_MAX
            || self.pending.len() + new_chunks as usize > EPOCH_CHUNKS_MAX
        {
            return false;
        }
        let charge = new_chunks * ((ENTRY_HEADER_BYTES + RANGE_BYTES * CHUNK_RANGES_MAX) as u64 + chunk_rows);
        (0..geometry.parity_count).all(|parity| {
            let slot = geometry.slot(stripe, geometry.data_count() + parity);
            self.charges.get(slot).copied().unwrap_or(0) + charge + RECORD_FIXED_BYTES as u64 <= INTENT_BYTES_MAX
        })
    }

    fn open_chunk(&mut self, geometry: &Geometry, stripe: u64, chunk: u64, chunk_rows: u64) {
        let k = geometry.data_count();
        let pending = Pending {
            chunk_start: chunk * chunk_rows,
            chunk_rows,
            data: vec![0u8; k * chunk_rows as usize],
            written: vec![Vec::new(); k],
        };
        if self.charges.len() < geometry.member_count {
            self.charges.resize(geometry.member_count, 0);
        }
        for parity in 0..geometry.parity_count {
            self.charges[geometry.slot(stripe, k + parity)] += pending.charge_max();
        }
        self.held_bytes += pending.data.len() as u64;
        self.pending.insert((stripe, chunk), pending);
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
}
