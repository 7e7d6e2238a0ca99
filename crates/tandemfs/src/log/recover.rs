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
    /// Where the next record goes.
    pub end: LogPosition,
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
/// magic or header CRC, another lsn, payload CRC mismatch). A header that passes its CRC and
/// carries the expected lsn but an impossible value is corruption.
pub(crate) fn scan(device: &dyn Device, geometry: &LogGeometry, tail: LogPosition) -> Result<Scan> {
    let mut reader = HeaderReader::new(device, geometry);
    let mut records = Vec::new();
    let mut positions = Vec::new();
    let mut expected = tail;
    let mut used_bytes: u64 = 0;
    for index in 0..geometry.header_slots {
        let lsn = tail.lsn + index; // cannot overflow: recover() checked tail.lsn + header_slots
        let bytes = reader.slot(lsn % geometry.header_slots)?;
        let Ok(header) = RecordHeader::decode(bytes) else {
            break;
        };
        if header.lsn != lsn {
            break; // a stale header of an earlier lap, or a slot never written
        }
        let what = |why: String| {
            Error::corruption(format!("log record {lsn} (header slot {}): {why}", lsn % geometry.header_slots))
        };
        if header.data_position != expected.data_position {
            return Err(what(format!(
                "payload at data position {} but the previous record ends at {}",
                header.data_position, expected.data_position
            )));
        }
        if header.flags & !KNOWN_FLAGS != 0 {
            return Err(what(format!("unknown flags {:#06x}", header.flags)));
        }
        if !format::reserved_is_zero(bytes) {
            return Err(what("reserved header bytes are not zero".into()));
        }
        let length = header.payload_length as u64;
        let room = geometry.data_bytes - used_bytes;
        if length > room {
            return Err(what(format!(
                "payload of {length} bytes does not fit the {room} bytes left in the data ring after the tail"
            )));
        }
        let Some(next_position) = expected.data_position.checked_add(length) else {
            return Err(what("data position overflows".into()));
        };
        let mut payload = vec![0u8; length as usize];
        read_data(device, geometry, header.data_position, &mut payload)?;
        if tandem_accel::crc32c(0, &payload) != header.payload_crc {
            break; // torn or lost payload: the record was never acknowledged
        }
        records.push(Record { lsn, kind: header.kind, payload });
        positions.push(header.data_position);
        used_bytes += length;
        expected = LogPosition { lsn: lsn + 1, data_position: next_position };
    }
    Ok(Scan { records, positions, end: expected })
}

/// Zeroes every header slot that does not hold a record of the scan (slots for lsns
/// `end.lsn .. tail.lsn + header_slots`), then flushes. Without this,
/// a header written but not acknowledged before a crash could line up with the records a later
/// session appends at the same lsns and be replayed after a second crash.
pub(crate) fn scrub(device: &dyn Device, geometry: &LogGeometry, tail: LogPosition, end: LogPosition) -> Result<bool> {
    let mut remaining = geometry.header_slots - (end.lsn - tail.lsn);
    let mut slot = end.lsn % geometry.header_slots;
    let mut buffer = Vec::new();
    let mut wrote = false;
    while remaining > 0 {
        let count = remaining.min(SLOTS_PER_READ).min(geometry.header_slots - slot);
        buffer.resize(count as usize * HEADER_SIZE, 0);
        device.read_at(geometry.slot_offset(slot), &mut buffer)?;
        if buffer.iter().any(|&b| b != 0) {
            buffer.fill(0);
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
