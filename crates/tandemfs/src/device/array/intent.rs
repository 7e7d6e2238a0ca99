//! The intent record (docs/RAID.md, *Rule 3* and *Write-intent bitmap*): one record per member,
//! in the member's reserved area, written to every present member and flushed before an epoch's
//! home writes. It carries the epoch's number, the write-intent bitmap (which ranges of stripes
//! the epoch writes home, so a resync after a crash recomputes only those) and the partial
//! parity of every partial stripe of the epoch whose parity shard this member holds (so a
//! missing member's untouched units can be solved after a crash).

use std::ops::Range;

use super::header::{DATA_START_BYTES, HEADER_BYTES};
use crate::device::Device;
use crate::error::{Error, Result};

/// Where the record starts on every member: after both header copies.
pub const INTENT_START_BYTES: u64 = 2 * HEADER_BYTES as u64;
/// The most bytes one record may take: the rest of the reserved area.
pub const INTENT_BYTES_MAX: u64 = DATA_START_BYTES - INTENT_START_BYTES;
pub const INTENT_MAGIC: &[u8; 8] = b"TNDMINTN";
/// Bits of the write-intent bitmap: each covers `chunk_stripes(stripe_count)` stripes.
pub const BITMAP_BITS: u64 = 8192;
const BITMAP_BYTES: usize = (BITMAP_BITS / 8) as usize;
/// Bytes of the record header before the bitmap.
const RECORD_HEADER_BYTES: usize = 64;
/// Bytes of a partial-parity entry before its ranges.
pub const ENTRY_HEADER_BYTES: usize = 24;
/// Bytes of one written range of an entry.
pub const RANGE_BYTES: usize = 12;
/// Bytes of the record before its entries.
pub const RECORD_FIXED_BYTES: usize = RECORD_HEADER_BYTES + BITMAP_BYTES;

const OFFSET_EPOCH: usize = 8;
const OFFSET_ENTRY_COUNT: usize = 16;
const OFFSET_SLOT: usize = 20;
const OFFSET_RECORD_BYTES: usize = 24;
const OFFSET_ARRAY_UUID: usize = 32;
const OFFSET_CHUNK_STRIPES: usize = 48;
const OFFSET_CRC: usize = 60;

/// Stripes each bitmap bit covers: the whole array in at most `BITMAP_BITS` bits.
pub fn chunk_stripes(stripe_count: u64) -> u64 {
    stripe_count.div_ceil(BITMAP_BITS).max(1)
}

/// The partial parity of one parity row range of one stripe: parity shard `parity_index`
/// computed over the stripe's data rows `rows` with every byte the epoch writes taken as zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialParity {
    pub stripe: u64,
    pub parity_index: usize,
    pub rows: Range<u64>,
    /// (data shard, rows) the epoch writes, within `rows`.
    pub written: Vec<(usize, Range<u64>)>,
    pub bytes: Vec<u8>,
}

impl PartialParity {
    pub fn encoded_bytes(&self) -> usize {
        ENTRY_HEADER_BYTES + RANGE_BYTES * self.written.len() + self.bytes.len()
    }
}

/// One member's intent record, decoded and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntentRecord {
    pub epoch: u64,
    /// Bit b: stripes `b·chunk .. (b+1)·chunk` may be written home in this epoch.
    pub bitmap: Vec<u8>,
    pub entries: Vec<PartialParity>,
}

impl IntentRecord {
    pub fn new(epoch: u64) -> IntentRecord {
        IntentRecord { epoch, bitmap: vec![0u8; BITMAP_BYTES], entries: Vec::new() }
    }

    pub fn mark(&mut self, stripe: u64, stripe_count: u64) {
        let bit = stripe / chunk_stripes(stripe_count);
        assert!(bit < BITMAP_BITS);
        self.bitmap[(bit / 8) as usize] |= 1 << (bit % 8);
    }

    pub fn is_marked(&self, stripe: u64, stripe_count: u64) -> bool {
        let bit = stripe / chunk_stripes(stripe_count);
        bit < BITMAP_BITS && self.bitmap[(bit / 8) as usize] & (1 << (bit % 8)) != 0
    }

    /// The record as written: padded to whole 4 KiB blocks (zeros past the checksummed bytes).
    pub fn encode(&self, array_uuid: &[u8; 16], slot: usize, stripe_count: u64) -> Vec<u8> {
        let record_bytes = RECORD_FIXED_BYTES + self.entries.iter().map(PartialParity::encoded_bytes).sum::<usize>();
        assert!(record_bytes as u64 <= INTENT_BYTES_MAX, "intent record of {record_bytes} bytes");
        let mut bytes = Vec::with_capacity(record_bytes.next_multiple_of(HEADER_BYTES));
        bytes.extend_from_slice(INTENT_MAGIC);
        bytes.extend_from_slice(&self.epoch.to_le_bytes());
        bytes.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&(slot as u32).to_le_bytes());
        bytes.extend_from_slice(&(record_bytes as u64).to_le_bytes());
        bytes.extend_from_slice(array_uuid);
        bytes.extend_from_slice(&chunk_stripes(stripe_count).to_le_bytes());
        bytes.extend_from_slice(&[0u8; 8]);
        debug_assert_eq!(bytes.len(), RECORD_HEADER_BYTES);
        bytes.extend_from_slice(&self.bitmap);
        for entry in &self.entries {
            bytes.extend_from_slice(&entry.stripe.to_le_bytes());
            bytes.extend_from_slice(&(entry.parity_index as u32).to_le_bytes());
            bytes.extend_from_slice(&(entry.rows.start as u32).to_le_bytes());
            bytes.extend_from_slice(&(entry.rows.end as u32).to_le_bytes());
            bytes.extend_from_slice(&(entry.written.len() as u32).to_le_bytes());
            for (shard, rows) in &entry.written {
                bytes.extend_from_slice(&(*shard as u32).to_le_bytes());
                bytes.extend_from_slice(&(rows.start as u32).to_le_bytes());
                bytes.extend_from_slice(&(rows.end as u32).to_le_bytes());
            }
            bytes.extend_from_slice(&entry.bytes);
        }
        assert_eq!(bytes.len(), record_bytes);
        let crc = crc_of(&bytes);
        bytes[OFFSET_CRC..OFFSET_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        bytes.resize(record_bytes.next_multiple_of(HEADER_BYTES), 0);
        bytes
    }
}

/// CRC32C of a record with its checksum field taken as zero.
fn crc_of(bytes: &[u8]) -> u32 {
    let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
    let crc = tandem_accel::crc32c(crc, &[0u8; 4]);
    tandem_accel::crc32c(crc, &bytes[OFFSET_CRC + 4..])
}

/// The shape a record must fit: the array's, as the member header says.
#[derive(Clone, Copy, Debug)]
pub struct RecordShape {
    pub array_uuid: [u8; 16],
    pub slot: usize,
    pub data_count: usize,
    pub parity_count: usize,
    pub stripe_unit_bytes: u64,
    pub stripe_count: u64,
}

/// Reads the member's intent record. `Ok(None)`: none there, or one torn or left by another
/// array (a torn record belongs to an epoch whose home writes never started, so it is not
/// needed). A record whose checksum holds but whose contents are impossible is corruption.
pub fn read_record(device: &dyn Device, shape: &RecordShape) -> Result<Option<IntentRecord>> {
    let mut head = vec![0u8; RECORD_FIXED_BYTES];
    device.read_at(INTENT_START_BYTES, &mut head)?;
    if &head[..8] != INTENT_MAGIC {
        return Ok(None);
    }
    let record_bytes = u64_at(&head, OFFSET_RECORD_BYTES);
    if !(RECORD_FIXED_BYTES as u64..=INTENT_BYTES_MAX).contains(&record_bytes) {
        return Ok(None);
    }
    let mut bytes = vec![0u8; record_bytes as usize];
    device.read_at(INTENT_START_BYTES, &mut bytes)?;
    if crc_of(&bytes) != u32_at(&bytes, OFFSET_CRC)
        || bytes[OFFSET_ARRAY_UUID..OFFSET_ARRAY_UUID + 16] != shape.array_uuid
    {
        return Ok(None);
    }
    decode_checked(&bytes, shape).map(Some)
}

fn decode_checked(bytes: &[u8], shape: &RecordShape) -> Result<IntentRecord> {
    let bad = |what: String| Error::corruption(format!("array intent record: {what}"));
    if u32_at(bytes, OFFSET_SLOT) as usize != shape.slot {
        return Err(bad(format!("written for slot {}, found on slot {}", u32_at(bytes, OFFSET_SLOT), shape.slot)));
    }
    if u64_at(bytes, OFFSET_CHUNK_STRIPES) != chunk_stripes(shape.stripe_count) {
        return Err(bad(format!("{} stripes per bitmap bit", u64_at(bytes, OFFSET_CHUNK_STRIPES))));
    }
    let entry_count = u32_at(bytes, OFFSET_ENTRY_COUNT) as usize;
    let mut record = IntentRecord {
        epoch: u64_at(bytes, OFFSET_EPOCH),
        bitmap: bytes[RECORD_HEADER_BYTES..RECORD_FIXED_BYTES].to_vec(),
        entries: Vec::with_capacity(entry_count.min(1024)),
    };
    let mut at = RECORD_FIXED_BYTES;
    let unit = shape.stripe_unit_bytes;
    // Every entry takes at least its header, so the count is bounded by the record's length.
    for index in 0..entry_count {
        if at + ENTRY_HEADER_BYTES > bytes.len() {
            return Err(bad(format!("entry {index} runs past the record")));
        }
        let stripe = u64_at(bytes, at);
        let parity_index = u32_at(bytes, at + 8) as usize;
        let rows = u64::from(u32_at(bytes, at + 12))..u64::from(u32_at(bytes, at + 16));
        let range_count = u32_at(bytes, at + 20) as usize;
        if stripe >= shape.stripe_count
            || parity_index >= shape.parity_count
            || rows.start >= rows.end
            || rows.end > unit
        {
            return Err(bad(format!("entry {index}: stripe {stripe} parity {parity_index} rows {rows:?}")));
        }
        at += ENTRY_HEADER_BYTES;
        let payload = (rows.end - rows.start) as usize;
        if range_count > bytes.len() || at + range_count * RANGE_BYTES + payload > bytes.len() {
            return Err(bad(format!("entry {index} runs past the record")));
        }
        let mut written = Vec::with_capacity(range_count);
        for _ in 0..range_count {
            let shard = u32_at(bytes, at) as usize;
            let range = u64::from(u32_at(bytes, at + 4))..u64::from(u32_at(bytes, at + 8));
            if shard >= shape.data_count || range.start >= range.end || range.start < rows.start || range.end > rows.end
            {
                return Err(bad(format!("entry {index}: written range {shard} {range:?} outside rows {rows:?}")));
            }
            written.push((shard, range));
            at += RANGE_BYTES;
        }
        let entry_bytes = bytes[at..at + payload].to_vec();
        at += payload;
        record.entries.push(PartialParity { stripe, parity_index, rows, written, bytes: entry_bytes });
    }
    if at != bytes.len() {
        return Err(bad(format!("{} bytes past the last entry", bytes.len() - at)));
    }
    Ok(record)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    fn shape() -> RecordShape {
        RecordShape {
            array_uuid: [7; 16],
            slot: 2,
            data_count: 3,
            parity_count: 2,
            stripe_unit_bytes: 4096,
            stripe_count: 100,
        }
    }

    #[test]
    fn a_record_reads_back_and_a_torn_or_foreign_one_is_none() {
        let device = MemoryDevice::new(DATA_START_BYTES);
        let mut record = IntentRecord::new(9);
        record.mark(17, 100);
        record.entries.push(PartialParity {
            stripe: 17,
            parity_index: 1,
            rows: 100..300,
            written: vec![(0, 100..200), (2, 250..300)],
            bytes: (0..200).map(|byte| byte as u8).collect(),
        });
        let bytes = record.encode(&[7; 16], 2, 100);
        device.write_at(INTENT_START_BYTES, &bytes).unwrap();
        let back = read_record(&device, &shape()).unwrap().unwrap();
        assert_eq!(back, record);
        assert!(back.is_marked(17, 100) && !back.is_marked(18, 100));
        // Another array's record is not this one's.
        assert!(read_record(&device, &RecordShape { array_uuid: [8; 16], ..shape() }).unwrap().is_none());
        // Torn: the checksum fails and the record is not there.
        device.write_at(INTENT_START_BYTES + 1200, &[0xFF; 3]).unwrap();
        assert!(read_record(&device, &shape()).unwrap().is_none());
        // Whole but impossible (a stripe past the array): corruption.
        record.entries[0].stripe = 100;
        device.write_at(INTENT_START_BYTES, &record.encode(&[7; 16], 2, 100)).unwrap();
        assert!(read_record(&device, &shape()).unwrap_err().is_corruption());
    }
}
