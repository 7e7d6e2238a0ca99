//! The member header (docs/RAID.md, *Member header*): two 4096-byte copies at the start of every
//! member, written to copy `event % 2` so that a torn write leaves the other copy whole.

use crate::device::Device;
use crate::error::{Error, Result};

/// Bytes of one header copy.
pub const HEADER_BYTES: usize = 4096;
/// Where the stripe units start on every member: the headers and the reserved area before it.
pub const DATA_START_BYTES: u64 = 1 << 20;
pub const MAGIC: &[u8; 8] = b"TNDMRAID";
/// Version 2 added the intent record in the reserved area (partial-parity log and write-intent
/// bitmap, docs/RAID.md *Rule 3*); version 1 kept it zero.
pub const VERSION: u32 = 2;
/// The oldest version this build reads: a version-1 array is read, and upgraded (its headers
/// say 2) at its first header write.
pub const VERSION_OLDEST_READ: u32 = 1;
/// Most members of one array: `missing_slots` is a 64-bit mask.
pub const MEMBER_COUNT_MAX: usize = 64;
/// Most parity shards (issue 10: m from 1 to 4).
pub const PARITY_COUNT_MAX: usize = 4;
pub const STRIPE_UNIT_BYTES_MIN: u64 = 4096;
pub const STRIPE_UNIT_BYTES_MAX: u64 = 1 << 20;

const OFFSET_VERSION: usize = 8;
const OFFSET_SLOT: usize = 12;
const OFFSET_ARRAY_UUID: usize = 16;
const OFFSET_MEMBER_UUID: usize = 32;
const OFFSET_MEMBER_COUNT: usize = 48;
const OFFSET_PARITY_COUNT: usize = 52;
const OFFSET_STRIPE_UNIT: usize = 56;
const OFFSET_STATE: usize = 60;
const OFFSET_DATA_START: usize = 64;
const OFFSET_STRIPE_COUNT: usize = 72;
const OFFSET_EVENT: usize = 80;
const OFFSET_MISSING: usize = 88;
const OFFSET_MEMBER_UUIDS: usize = 128;
const OFFSET_CRC: usize = HEADER_BYTES - 4;

/// Whether the array was closed after a final flush (rule 1 of the write hole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayState {
    Clean,
    Dirty,
}

/// One member's header, decoded and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberHeader {
    /// The version the header was read with; `encode` always writes `VERSION`.
    pub version: u32,
    pub slot: usize,
    pub array_uuid: [u8; 16],
    pub member_uuid: [u8; 16],
    pub member_count: usize,
    pub parity_count: usize,
    pub stripe_unit_bytes: u64,
    pub state: ArrayState,
    pub stripe_count: u64,
    pub event: u64,
    pub missing_slots: u64,
    /// The member uuid of every slot, in slot order.
    pub member_uuids: Vec<[u8; 16]>,
}

/// The array uuid as the messages print it: the first 8 hex digits.
pub fn short_uuid(uuid: &[u8; 16]) -> String {
    uuid[..4].iter().map(|byte| format!("{byte:02x}")).collect::<String>() + "…"
}

/// Checks the shape every header and every new array must have.
pub fn check_shape(member_count: usize, parity_count: usize, stripe_unit_bytes: u64) -> Result<()> {
    if !(1..=PARITY_COUNT_MAX).contains(&parity_count) {
        return Err(Error::invalid(format!(
            "parity {parity_count}: an array has 1 to {PARITY_COUNT_MAX} parity devices"
        )));
    }
    if member_count <= parity_count || member_count > MEMBER_COUNT_MAX {
        return Err(Error::invalid(format!(
            "{member_count} devices with parity {parity_count}: an array needs at least {} and at most {MEMBER_COUNT_MAX}",
            parity_count + 1
        )));
    }
    if !stripe_unit_bytes.is_power_of_two()
        || !(STRIPE_UNIT_BYTES_MIN..=STRIPE_UNIT_BYTES_MAX).contains(&stripe_unit_bytes)
    {
        return Err(Error::invalid(format!(
            "stripe unit {stripe_unit_bytes} bytes: it must be a power of two from {STRIPE_UNIT_BYTES_MIN} to {STRIPE_UNIT_BYTES_MAX}"
        )));
    }
    Ok(())
}

impl MemberHeader {
    /// Bytes of the member the header's geometry needs.
    pub fn member_bytes_needed(&self) -> u64 {
        DATA_START_BYTES + self.stripe_count * self.stripe_unit_bytes
    }

    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(VERSION)
    }

    /// The header as `version` wrote it (`VERSION`, or an older one for the upgrade tests).
    pub fn encode_as(&self, version: u32) -> Vec<u8> {
        assert!(self.member_uuids.len() == self.member_count && self.member_count <= MEMBER_COUNT_MAX);
        let mut bytes = vec![0u8; HEADER_BYTES];
        bytes[..8].copy_from_slice(MAGIC);
        put_u32(&mut bytes, OFFSET_VERSION, version);
        put_u32(&mut bytes, OFFSET_SLOT, self.slot as u32);
        bytes[OFFSET_ARRAY_UUID..OFFSET_ARRAY_UUID + 16].copy_from_slice(&self.array_uuid);
        bytes[OFFSET_MEMBER_UUID..OFFSET_MEMBER_UUID + 16].copy_from_slice(&self.member_uuid);
        put_u32(&mut bytes, OFFSET_MEMBER_COUNT, self.member_count as u32);
        put_u32(&mut bytes, OFFSET_PARITY_COUNT, self.parity_count as u32);
        put_u32(&mut bytes, OFFSET_STRIPE_UNIT, self.stripe_unit_bytes as u32);
        put_u32(&mut bytes, OFFSET_STATE, if self.state == ArrayState::Dirty { 1 } else { 0 });
        put_u64(&mut bytes, OFFSET_DATA_START, DATA_START_BYTES);
        put_u64(&mut bytes, OFFSET_STRIPE_COUNT, self.stripe_count);
        put_u64(&mut bytes, OFFSET_EVENT, self.event);
        put_u64(&mut bytes, OFFSET_MISSING, self.missing_slots);
        for (slot, uuid) in self.member_uuids.iter().enumerate() {
            let at = OFFSET_MEMBER_UUIDS + 16 * slot;
            bytes[at..at + 16].copy_from_slice(uuid);
        }
        let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
        put_u32(&mut bytes, OFFSET_CRC, crc);
        bytes
    }

    /// Decodes one copy: `Ok(None)` when it is not a member header at all (other magic), an error
    /// naming the field when it is one but damaged or impossible.
    pub fn decode(bytes: &[u8]) -> Result<Option<MemberHeader>> {
        assert_eq!(bytes.len(), HEADER_BYTES);
        if &bytes[..8] != MAGIC {
            return Ok(None);
        }
        let bad = |what: String| Err(Error::corruption(format!("array member header: {what}")));
        if tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]) != get_u32(bytes, OFFSET_CRC) {
            return bad("checksum mismatch".into());
        }
        let version = get_u32(bytes, OFFSET_VERSION);
        if !(VERSION_OLDEST_READ..=VERSION).contains(&version) {
            return bad(format!("version {version}, this build reads {VERSION_OLDEST_READ} to {VERSION}"));
        }
        let member_count = get_u32(bytes, OFFSET_MEMBER_COUNT) as usize;
        let parity_count = get_u32(bytes, OFFSET_PARITY_COUNT) as usize;
        let stripe_unit_bytes = u64::from(get_u32(bytes, OFFSET_STRIPE_UNIT));
        if let Err(error) = check_shape(member_count, parity_count, stripe_unit_bytes) {
            return bad(error.to_string());
        }
        let slot = get_u32(bytes, OFFSET_SLOT) as usize;
        if slot >= member_count {
            return bad(format!("slot {slot} of {member_count} members"));
        }
        let state = match get_u32(bytes, OFFSET_STATE) {
            0 => ArrayState::Clean,
            1 => ArrayState::Dirty,
            other => return bad(format!("state {other}")),
        };
        if get_u64(bytes, OFFSET_DATA_START) != DATA_START_BYTES {
            return bad(format!("data start {}", get_u64(bytes, OFFSET_DATA_START)));
        }
        let stripe_count = get_u64(bytes, OFFSET_STRIPE_COUNT);
        // Bounded so that member_bytes_needed and the logical size cannot overflow.
        if stripe_count == 0 || stripe_count > (1u64 << 60) / stripe_unit_bytes / member_count as u64 {
            return bad(format!("stripe count {stripe_count}"));
        }
        let missing_slots = get_u64(bytes, OFFSET_MISSING);
        if member_count < 64 && missing_slots >> member_count != 0 {
            return bad(format!("missing slots {missing_slots:#x} past {member_count} members"));
        }
        let uuids_end = OFFSET_MEMBER_UUIDS + 16 * member_count;
        if bytes[OFFSET_MISSING + 8..OFFSET_MEMBER_UUIDS].iter().chain(&bytes[uuids_end..OFFSET_CRC]).any(|&b| b != 0) {
            return bad("reserved bytes are not zero".into());
        }
        let member_uuids: Vec<[u8; 16]> =
            (0..member_count).map(|at| uuid_at(bytes, OFFSET_MEMBER_UUIDS + 16 * at)).collect();
        let member_uuid = uuid_at(bytes, OFFSET_MEMBER_UUID);
        if member_uuids[slot] != member_uuid {
            return bad(format!("slot {slot}'s uuid in the member table is not the member's own"));
        }
        Ok(Some(MemberHeader {
            version,
            slot,
            array_uuid: uuid_at(bytes, OFFSET_ARRAY_UUID),
            member_uuid,
            member_count,
            parity_count,
            stripe_unit_bytes,
            state,
            stripe_count,
            event: get_u64(bytes, OFFSET_EVENT),
            missing_slots,
            member_uuids,
        }))
    }
}

/// What the start of a device holds.
#[derive(Debug)]
pub enum Found {
    /// Neither copy has the member magic: not a member.
    NotMember,
    /// The newest valid copy.
    Member(MemberHeader),
    /// The magic is there but no copy is valid; the words say why.
    Damaged(String),
}

/// Reads both copies of a device's header and keeps the valid one with the higher event. A
/// device too small to hold the headers is not a member.
pub fn read_header(device: &dyn Device) -> Result<Found> {
    if device.size_bytes() < DATA_START_BYTES {
        return Ok(Found::NotMember);
    }
    let mut bytes = vec![0u8; 2 * HEADER_BYTES];
    device.read_at(0, &mut bytes)?;
    let mut best: Option<MemberHeader> = None;
    let mut problem = None;
    let mut magic_seen = false;
    for copy in bytes.chunks_exact(HEADER_BYTES) {
        magic_seen |= &copy[..8] == MAGIC;
        match MemberHeader::decode(copy) {
            Ok(Some(header)) => {
                if !matches!(&best, Some(kept) if kept.event >= header.event) {
                    best = Some(header);
                }
            }
            Ok(None) => {}
            Err(error) => problem = Some(error.to_string()),
        }
    }
    Ok(match (best, magic_seen) {
        (Some(header), _) => Found::Member(header),
        (None, false) => Found::NotMember,
        (None, true) => Found::Damaged(problem.unwrap_or_else(|| "no valid copy".into())),
    })
}

/// Writes `header` to its copy `event % 2` (not flushed: the caller flushes every member).
pub fn write_header(device: &dyn Device, header: &MemberHeader) -> Result<()> {
    let copy = header.event % 2;
    device.write_at(copy * HEADER_BYTES as u64, &header.encode())
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}
fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}
fn get_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}
fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}
fn uuid_at(bytes: &[u8], at: usize) -> [u8; 16] {
    bytes[at..at + 16].try_into().unwrap()
}
