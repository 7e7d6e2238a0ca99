//! Recovery scan: reads records from the tail until the first invalid one, then scrubs the
//! header slots after the end so that stale headers of an earlier session can never be taken
//! for records of a later one.

use super::format::{self, LogGeometry, RecordHeader, HEADER_SIZE, KNOWN_FLAGS};
use super::{LogPosition, Record};
use crate::device::Device;
use crate::error::{Error, Result};

/// Header slots read per device read during the scan and the scrub (64 KiB).
const SLOTS_PER_READ: u64 = 1024;

/// What the scan found.
pub(crate) struct Scan {
    pub records: Vec<Record>,
    /// Data positions of the records, in lsn order.
    pub positions: Vec<u64>,
    /// Whether each record carries `FLAG_RESERVE`, in lsn order.
    pub reserve_flags: Vec<bool>,
    /// Where the next record goes.
    pub end: LogPosition,
    /// Set when the record at `end` is damaged rather than torn.
    pub damage: Option<LogDamage>,
}

/// A record that cannot be read although it was durable: a record written by a later group
/// commit follows it, or its CRC-valid header carries a value no writer produces. Recovery
/// refuses such a log (see `docs/LOG.md`, *Damage*); `discard_from` repairs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogDamage {
    /// The first record that cannot be read.
    pub lsn: u64,
    /// Its header slot.
    pub slot: u64,
    /// What is wrong with it.
    pub why: String,
    /// A later record written by a later group commit, when that is the evidence.
    pub later_lsn: Option<u64>,
}

impl LogDamage {
    /// The one-line error mount and fsck report.
    pub fn to_error(&self) -> Error {
        let evidence = match self.later_lsn {
            Some(later) => format!(" but record {later}, written by a later group commit, is intact"),
            None => String::new(),
        };
        Error::corruption(format!(
            "log record {} (header slot {}) is damaged: {}{evidence}; the records from {} on cannot be replayed \
             (`tandem fsck --repair` keeps the records before it and discards the rest)",
            self.lsn, self.slot, self.why, self.lsn
        ))
    }
}

/// Reads header slots in chunks of up to `SLOTS_PER_READ`, never across the ring wrap.
struct HeaderReader<'a> {
    device: &'a dyn Device,
    geometry: &'a LogGeometry,
    first_slot: u64,
    slots: u64,
    buffer: Vec<u8>,
}

impl<'a> HeaderReader<'a> {
    fn new(device: &'a dyn Device, geometry: &'a LogGeometry) -> Self {
        HeaderReader { device, geometry, first_slot: 0, slots: 0, buffer: Vec::new() }
    }

    fn slot(&mut self, slot: u64) -> Result<&[u8]> {
        if slot < self.first_slot || slot >= self.first_slot + self.slots {
            let count = SLOTS_PER_READ.min(self.geometry.header_slots - slot);
            self.buffer.resize(count as usize * HEADER_SIZE, 0);
            self.device.read_at(self.geometry.slot_offset(slot), &mut self.buffer)?;
            self.first_slot = slot;
            self.slots = count;
        }
        let at = ((slot - self.first_slot) as usize) * HEADER_SIZE;
        Ok(&self.buffer[at..at + HEADER_SIZE])
    }
}

/// Reads `buffer.len()` bytes of the data ring starting at ring position `position`, split at
/// the wrap. The caller checked that the length is at most `data_bytes`.
pub(crate) fn read_data(device: &dyn Device, geometry: &LogGeometry, position: u64, buffer: &mut [u8]) -> Result<()> {
    let offset = position % geometry.data_bytes;
    let first = (buffer.len() as u64).min(geometry.data_bytes - offset) as usize;
    let (a, b) = buffer.split_at_mut(first);
    if !a.is_empty() {
        device.read_at(geometry.data_start_byte + offset, a)?;
    }
    if !b.is_empty() {
        device.read_at(geometry.data_start_byte, b)?;
    }
    Ok(())
}

/// Scans from `tail`. Stops at the first slot that does not hold the expected record (bad
/// magic or header CRC, another lsn, payload CRC mismatch), then looks at the slots after it:
/// a header written by a later group commit means the bad record had been flushed, so it is
/// damage, not a torn tail. A header that passes its CRC and carries the expected lsn but an
/// impossible value is damage by itself. Writes nothing.
pub(crate) fn scan(device: &dyn Device, geometry: &LogGeometry, tail: LogPosition) -> Result<Scan> {
    let mut reader = HeaderReader::new(device, geometry);
    let mut records = Vec::new();
    let mut positions = Vec::new();
    let mut reserve_flags = Vec::new();
    let mut expected = tail;
    let mut used_bytes: u64 = 0;
    let mut previous_batch: Option<u64> = None;
    for index in 0..geometry.header_slots {
        let lsn = tail.lsn + index; // cannot overflow: recover() checked tail.lsn + header_slots
        let slot = lsn % geometry.header_slots;
        let bytes = reader.slot(slot)?;
        let header = match RecordHeader::decode(bytes) {
            Ok(header) if header.lsn == lsn => header,
            // A slot never written, a stale header of an earlier lap, or a torn header.
            Ok(_) => {
                return finish_at(
                    &mut reader,
                    tail,
                    expected,
                    records,
                    (positions, reserve_flags),
                    "another lsn in its slot",
                )
            }
            Err(_) => {
                return finish_at(&mut reader, tail, expected, records, (positions, reserve_flags), "no valid header")
            }
        };
        if let Some(why) = impossible_value(bytes, &header, expected, previous_batch, geometry.data_bytes - used_bytes)
        {
            let damage = LogDamage { lsn, slot, why, later_lsn: None };
            return Ok(Scan { records, positions, reserve_flags, end: expected, damage: Some(damage) });
        }
        let length = header.payload_length as u64;
        let next_position = expected.data_position + length; // checked by impossible_value
        let mut payload = vec![0u8; length as usize];
        read_data(device, geometry, header.data_position, &mut payload)?;
        if tandem_accel::crc32c(0, &payload) != header.payload_crc {
            // Torn or lost payload (never acknowledged), unless a later batch follows.
            let found = (positions, reserve_flags);
            return finish_at(&mut reader, tail, expected, records, found, "payload checksum mismatch");
        }
        records.push(Record { lsn, kind: header.kind, payload });
        positions.push(header.data_position);
        reserve_flags.push(header.flags & format::FLAG_RESERVE != 0);
        used_bytes += length;
        previous_batch = Some(header.batch_first_lsn);
        expected = LogPosition { lsn: lsn + 1, data_position: next_position };
    }
    Ok(Scan { records, positions, reserve_flags, end: expected, damage: None })
}

/// What is impossible about a CRC-valid header with the expected lsn, if anything: no writer
/// produces these, so they are damage wherever they occur.
fn impossible_value(
    bytes: &[u8],
    header: &RecordHeader,
    expected: LogPosition,
    previous_batch: Option<u64>,
    room_bytes: u64,
) -> Option<String> {
    if header.data_position != expected.data_position {
        return Some(format!(
            "payload at data position {} but the previous record ends at {}",
            header.data_position, expected.data_position
        ));
    }
    if header.flags & !KNOWN_FLAGS != 0 {
        return Some(format!("unknown flags {:#06x}", header.flags));
    }
    if !format::reserved_is_zero(bytes) {
        return Some("reserved header bytes are not zero".into());
    }
    let length = header.payload_length as u64;
    if length > room_bytes {
        return Some(format!(
            "payload of {length} bytes does not fit the {room_bytes} bytes left in the data ring after the tail"
        ));
    }
    if expected.data_position.checked_add(length).is_none() {
        return Some("data position overflows".into());
    }
    // Batches are consecutive lsn ranges: a record starts a batch or continues the previous one.
    let batch = header.batch_first_lsn;
    let continues = previous_batch == Some(batch);
    let starts = batch == header.lsn;
    let first_after_tail = previous_batch.is_none() && batch <= header.lsn;
    if !(continues || starts || first_after_tail) {
        return Some(format!("group commit starting at lsn {batch} does not fit the records before it"));
    }
    None
}

/// The scan stopped at `end`: a torn tail, unless a later slot of the ring holds a header that
/// a later group commit wrote (its batch starts after `end`), which proves the record at `end`
/// was flushed before.
fn finish_at(
    reader: &mut HeaderReader,
    tail: LogPosition,
    end: LogPosition,
    records: Vec<Record>,
    (positions, reserve_flags): (Vec<u64>, Vec<bool>),
    why: &str,
) -> Result<Scan> {
    let slots = reader.geometry.header_slots;
    let mut damage = None;
    for lsn in end.lsn + 1..tail.lsn + slots {
        let Ok(header) = RecordHeader::decode(reader.slot(lsn % slots)?) else {
            continue;
        };
        if header.lsn == lsn && header.batch_first_lsn > end.lsn {
            let slot = end.lsn % slots;
            damage = Some(LogDamage { lsn: end.lsn, slot, why: why.to_string(), later_lsn: Some(lsn) });
            break;
        }
    }
    Ok(Scan { records, positions, reserve_flags, end, damage })
}

/// Zeroes every header slot that holds a CRC-valid header of lsn `end_lsn` or later, then
/// flushes. Without this, a header written but not acknowledged before a crash could line up
/// with the records a later session appends at the same lsns and be replayed after a second
/// crash. Headers of records before the tail stay: no scan can take them for a later record
/// (their lsn is too small), and mount reads the one before the tail to check the tail.
pub(crate) fn scrub(device: &dyn Device, geometry: &LogGeometry, tail: LogPosition, end_lsn: u64) -> Result<bool> {
    let mut remaining = geometry.header_slots - (end_lsn - tail.lsn);
    let mut slot = end_lsn % geometry.header_slots;
    let mut buffer = Vec::new();
    let mut wrote = false;
    while remaining > 0 {
        let count = remaining.min(SLOTS_PER_READ).min(geometry.header_slots - slot);
        buffer.resize(count as usize * HEADER_SIZE, 0);
        device.read_at(geometry.slot_offset(slot), &mut buffer)?;
        let mut changed = false;
        for header in buffer.chunks_exact_mut(HEADER_SIZE) {
            if RecordHeader::decode(header).is_ok_and(|decoded| decoded.lsn >= end_lsn) {
                header.fill(0);
                changed = true;
            }
        }
        if changed {
            device.write_at(geometry.slot_offset(slot), &buffer)?;
            wrote = true;
        }
        remaining -= count;
        slot = (slot + count) % geometry.header_slots;
    }
    // Flush even when nothing was written: the records just read may have been read back from
    // a volatile cache (after a process crash rather than a power loss), and `recover` reports
    // them as durable.
    device.flush()?;
    Ok(wrote)
}

/// The header in the slot of `lsn`, if that slot holds a CRC-valid header of that lsn.
pub(crate) fn read_header(device: &dyn Device, geometry: &LogGeometry, lsn: u64) -> Result<Option<RecordHeader>> {
    let mut bytes = [0u8; HEADER_SIZE];
    device.read_at(geometry.slot_offset(lsn % geometry.header_slots), &mut bytes)?;
    Ok(RecordHeader::decode(&bytes).ok().filter(|header| header.lsn == lsn))
}

/// The payload `header` describes, if it fits the data ring and matches its CRC.
pub(crate) fn read_payload(
    device: &dyn Device,
    geometry: &LogGeometry,
    header: &RecordHeader,
) -> Result<Option<Vec<u8>>> {
    if header.payload_length as u64 > geometry.data_bytes {
        return Ok(None);
    }
    let mut payload = vec![0u8; header.payload_length as usize];
    read_data(device, geometry, header.data_position, &mut payload)?;
    Ok((tandem_accel::crc32c(0, &payload) == header.payload_crc).then_some(payload))
}
