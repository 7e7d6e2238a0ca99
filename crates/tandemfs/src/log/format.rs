//! On-disk format of the operation log: geometry of the two rings and the 64-byte record
//! header. See `docs/LOG.md` for the byte tables; every constant is defined here once.

use crate::error::{Error, Result};

/// Size of one record header in the header ring.
pub const HEADER_SIZE: usize = 64;
/// Record headers per 4 KiB block of the header ring.
pub const HEADERS_PER_BLOCK: u64 = 4096 / HEADER_SIZE as u64;
/// `b"TLRH"` read as a little-endian u32: marks a record header.
pub const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"TLRH");
/// Flag bit: the record was appended with `append_reserved` (may use the reserve share).
pub const FLAG_RESERVE: u16 = 0x0001;
/// Every flag bit the format defines; any other bit set in a CRC-valid header is corruption.
pub const KNOWN_FLAGS: u16 = FLAG_RESERVE;
/// Largest payload a header can describe (the length field is 32 bits).
pub const MAX_PAYLOAD_BYTES: u64 = u32::MAX as u64;

/// Byte offsets of the header fields.
pub mod field {
    pub const MAGIC: usize = 0;
    pub const KIND: usize = 4;
    pub const FLAGS: usize = 6;
    pub const LSN: usize = 8;
    pub const DATA_POSITION: usize = 16;
    pub const PAYLOAD_LENGTH: usize = 24;
    pub const PAYLOAD_CRC: usize = 28;
    pub const BATCH_FIRST_LSN: usize = 32;
    pub const RESERVED: usize = 40;
    pub const HEADER_CRC: usize = 60;
}

/// Where the two rings of the log lie on the device. Kept in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogGeometry {
    /// First byte of the header ring (a multiple of 64; mkfs uses a block boundary).
    pub header_start_byte: u64,
    /// Number of 64-byte header slots (the header ring is `header_slots * 64` bytes).
    pub header_slots: u64,
    /// First byte of the data ring.
    pub data_start_byte: u64,
    /// Size of the data ring in bytes.
    pub data_bytes: u64,
}

impl LogGeometry {
    /// The geometry of rings given in 4 KiB blocks, as the superblock keeps them: the header
    /// ring holds `HEADERS_PER_BLOCK` headers per block.
    pub fn from_blocks(
        header_block: u64,
        header_blocks: u64,
        data_block: u64,
        data_blocks: u64,
    ) -> Option<LogGeometry> {
        Some(LogGeometry {
            header_start_byte: header_block.checked_mul(4096)?,
            header_slots: header_blocks.checked_mul(HEADERS_PER_BLOCK)?,
            data_start_byte: data_block.checked_mul(4096)?,
            data_bytes: data_blocks.checked_mul(4096)?,
        })
    }

    /// Bytes taken by the header ring, or `None` if that overflows.
    pub fn header_ring_bytes(&self) -> Option<u64> {
        self.header_slots.checked_mul(HEADER_SIZE as u64)
    }

    /// Checks the geometry against a device of `device_size` bytes: both rings non-empty,
    /// inside the device, not overlapping, the header ring 64-byte aligned.
    pub fn validate(&self, device_size: u64) -> Result<()> {
        let bad = |why: &str| Err(Error::invalid(format!("log geometry {self:?}: {why}")));
        if self.header_slots == 0 {
            return bad("the header ring has no slots");
        }
        if self.data_bytes == 0 {
            return bad("the data ring is empty");
        }
        if self.header_start_byte & (HEADER_SIZE as u64 - 1) != 0 {
            return bad("the header ring is not 64-byte aligned");
        }
        let Some(header_end) = self.header_ring_bytes().and_then(|b| b.checked_add(self.header_start_byte)) else {
            return bad("the header ring overflows");
        };
        let Some(data_end) = self.data_start_byte.checked_add(self.data_bytes) else {
            return bad("the data ring overflows");
        };
        if header_end > device_size || data_end > device_size {
            return bad(&format!("a ring extends past the end of the {device_size}-byte device"));
        }
        if self.header_start_byte < data_end && self.data_start_byte < header_end {
            return bad("the header ring and the data ring overlap");
        }
        Ok(())
    }

    /// Device offset of header slot `slot` (< header_slots).
    pub(crate) fn slot_offset(&self, slot: u64) -> u64 {
        self.header_start_byte + slot * HEADER_SIZE as u64
    }
}

/// The decoded fields of a record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: u16,
    pub flags: u16,
    pub lsn: u64,
    pub data_position: u64,
    pub payload_length: u32,
    pub payload_crc: u32,
    /// The lsn of the first record of the group commit that wrote this header (format version
    /// 2). A header written by a later group commit proves that every record of the earlier
    /// ones was flushed, so a bad record before it is damage, not a torn tail.
    pub batch_first_lsn: u64,
}

/// Why 64 bytes did not decode as a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderFault {
    /// Wrong magic or header CRC: never written, stale, or torn.
    NotAHeader,
}

impl RecordHeader {
    /// Writes every field with the header CRC left zero; [`seal`] fills it in later (the
    /// flush leader does that outside the append lock).
    pub fn encode_unsealed(&self, out: &mut [u8]) {
        let out = &mut out[..HEADER_SIZE];
        out.fill(0);
        out[field::MAGIC..field::MAGIC + 4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        out[field::KIND..field::KIND + 2].copy_from_slice(&self.kind.to_le_bytes());
        out[field::FLAGS..field::FLAGS + 2].copy_from_slice(&self.flags.to_le_bytes());
        out[field::LSN..field::LSN + 8].copy_from_slice(&self.lsn.to_le_bytes());
        out[field::DATA_POSITION..field::DATA_POSITION + 8].copy_from_slice(&self.data_position.to_le_bytes());
        out[field::PAYLOAD_LENGTH..field::PAYLOAD_LENGTH + 4].copy_from_slice(&self.payload_length.to_le_bytes());
        out[field::PAYLOAD_CRC..field::PAYLOAD_CRC + 4].copy_from_slice(&self.payload_crc.to_le_bytes());
        set_batch_first_lsn(out, self.batch_first_lsn);
    }

    /// Encodes a complete header, CRC included.
    pub fn encode(&self, out: &mut [u8]) {
        self.encode_unsealed(out);
        seal(out);
    }

    /// Decodes and checks magic and header CRC. Field values are not judged here.
    pub fn decode(bytes: &[u8]) -> std::result::Result<RecordHeader, HeaderFault> {
        let bytes = &bytes[..HEADER_SIZE];
        if read_u32(bytes, field::MAGIC) != HEADER_MAGIC || read_u32(bytes, field::HEADER_CRC) != header_crc(bytes) {
            return Err(HeaderFault::NotAHeader);
        }
        Ok(RecordHeader {
            kind: read_u16(bytes, field::KIND),
            flags: read_u16(bytes, field::FLAGS),
            lsn: read_u64(bytes, field::LSN),
            data_position: read_u64(bytes, field::DATA_POSITION),
            payload_length: read_u32(bytes, field::PAYLOAD_LENGTH),
            payload_crc: read_u32(bytes, field::PAYLOAD_CRC),
            batch_first_lsn: read_u64(bytes, field::BATCH_FIRST_LSN),
        })
    }
}

/// Sets the batch field of an encoded, unsealed header: the flush leader knows the batch only
/// when it takes the pending headers, after `append` encoded them.
pub fn set_batch_first_lsn(bytes: &mut [u8], batch_first_lsn: u64) {
    bytes[field::BATCH_FIRST_LSN..field::BATCH_FIRST_LSN + 8].copy_from_slice(&batch_first_lsn.to_le_bytes());
}

/// Whether the reserved bytes 40..60 of a header are zero (format version 2 requires it).
pub fn reserved_is_zero(bytes: &[u8]) -> bool {
    bytes[field::RESERVED..field::HEADER_CRC].iter().all(|&b| b == 0)
}

/// CRC32C of the 64 header bytes with the CRC field taken as zero.
pub fn header_crc(bytes: &[u8]) -> u32 {
    let crc = tandem_accel::crc32c(0, &bytes[..field::HEADER_CRC]);
    tandem_accel::crc32c(crc, &[0u8; 4])
}

/// Fills in the header CRC of an encoded header.
pub fn seal(bytes: &mut [u8]) {
    let crc = header_crc(bytes);
    bytes[field::HEADER_CRC..field::HEADER_CRC + 4].copy_from_slice(&crc.to_le_bytes());
}

fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
