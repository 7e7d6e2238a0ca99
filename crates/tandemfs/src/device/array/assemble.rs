//! Making a new array on members (`create`, for mkfs) and assembling one from the members found
//! (`assemble`, for mount and fsck): docs/RAID.md, *Finding the members*. Every check runs
//! before anything is written, so bad input leaves every device as it was.

use std::sync::Arc;

use tandem_accel::Accelerator;

use super::header::{self, check_shape, short_uuid, ArrayState, Found, MemberHeader, DATA_START_BYTES, HEADER_BYTES};
use super::{ArrayDevice, Geometry, HeaderState};
use crate::device::Device;
use crate::error::{Error, Result};

/// A member device and the name messages call it by (its path).
#[derive(Clone)]
pub struct Member {
    pub name: String,
    pub device: Arc<dyn Device>,
}

/// The shape of a new array.
#[derive(Clone, Copy, Debug)]
pub struct CreateOptions {
    pub parity_count: usize,
    pub stripe_unit_bytes: u64,
    /// Compute every stripe's parity from the members' current bytes. Members known to read as
    /// zeros (new image files) need not: the parity of zeros is zeros.
    pub initialize_parity: bool,
}

/// Kept after `tandem bench raid` on the development VM (BENCHMARKS.md, *Erasure-coded arrays*):
/// no unit won across its columns; smaller units take random 4 KiB writes faster, larger ones
/// rebuild a little faster.
pub const STRIPE_UNIT_BYTES_DEFAULT: u64 = 64 << 10;

/// An assembled array and what assembly found.
pub struct Assembly {
    pub device: ArrayDevice,
    /// Stripes whose parity was recomputed because the array was not closed cleanly (rule 1).
    pub resynced_stripes: u64,
    /// One line per missing slot: which, and why.
    pub notes: Vec<String>,
}

pub(super) fn random_uuid() -> Result<[u8; 16]> {
    let mut uuid = [0u8; 16];
    getrandom::getrandom(&mut uuid).map_err(|error| Error::invalid(format!("no random bytes: {error}")))?;
    Ok(uuid)
}

/// Makes a new array over `members` in slot order: checks, then (optionally) parity, the
/// reserved areas zeroed and both header copies on every member, flushed.
pub fn create(members: Vec<Member>, options: &CreateOptions, accelerator: Arc<Accelerator>) -> Result<ArrayDevice> {
    let count = members.len();
    check_shape(count, options.parity_count, options.stripe_unit_bytes)?;
    let first = &members[0];
    for member in &members {
        if member.device.size_bytes() != first.device.size_bytes() {
            return Err(Error::invalid(format!(
                "{} is {} bytes and {} is {}: the members of an array must be the same size",
                member.name,
                member.device.size_bytes(),
                first.name,
                first.device.size_bytes()
            )));
        }
        if member.device.is_read_only() {
            return Err(Error::invalid(format!("{} is read-only", member.name)));
        }
    }
    let member_bytes = first.device.size_bytes();
    let needed = DATA_START_BYTES + options.stripe_unit_bytes;
    if member_bytes < needed {
        return Err(Error::invalid(format!(
            "{} is {member_bytes} bytes: a member needs at least {needed} (1 MiB of headers and one stripe unit)",
            first.name
        )));
    }
    let geometry = Geometry {
        member_count: count,
        parity_count: options.parity_count,
        stripe_unit_bytes: options.stripe_unit_bytes,
        stripe_count: (member_bytes - DATA_START_BYTES) / options.stripe_unit_bytes,
    };
    let header_state = HeaderState {
        array_uuid: random_uuid()?,
        member_uuids: (0..count).map(|_| random_uuid()).collect::<Result<_>>()?,
        event: 0,
        state: ArrayState::Clean,
        missing_slots: 0,
    };
    let names = members.iter().map(|member| member.name.clone()).collect();
    let devices = members.into_iter().map(|member| Some(member.device)).collect();
    let array = ArrayDevice::new(geometry, header_state, devices, names, vec![None; count], accelerator)?;
    if options.initialize_parity {
        array.resync()?;
    }
    let zeros = vec![0u8; (DATA_START_BYTES - 2 * HEADER_BYTES as u64) as usize];
    for member in array.member_devices() {
        member.write_at(2 * HEADER_BYTES as u64, &zeros)?;
    }
    // Two header writes: one to each copy, so that no older header survives in either.
    let mut header = array.header.lock();
    array.write_headers(&mut header)?;
    array.write_headers(&mut header)?;
    drop(header);
    Ok(array)
}

/// Assembles the array whose members are among `members` (any order; members not given are
/// missing). Refuses, writing nothing: a device that is no member, members of two arrays, two
/// members of one slot, a member too small, more than m missing, and a dirty array with a
/// member missing (rule 2). A dirty array with every member is resynced (rule 1).
pub fn assemble(members: Vec<Member>, accelerator: Arc<Accelerator>) -> Result<Assembly> {
    let mut found: Vec<(Member, MemberHeader)> = Vec::with_capacity(members.len());
    for member in members {
        let header = match header::read_header(member.device.as_ref()) {
            Err(error) => {
                return Err(Error::invalid(format!("{}: cannot read its member header: {error}", member.name)))
            }
            Ok(Found::NotMember) => {
                return Err(Error::invalid(format!("{} is not a member of a tandemfs array", member.name)))
            }
            Ok(Found::Damaged(why)) => {
                return Err(Error::invalid(format!("{}: damaged member header ({why})", member.name)))
            }
            Ok(Found::Member(header)) => header,
        };
        found.push((member, header));
    }
    let Some((first, first_header)) = found.first() else {
        return Err(Error::invalid("no array members given".to_string()));
    };
    for (member, header) in &found {
        if header.array_uuid != first_header.array_uuid {
            return Err(Error::invalid(format!(
                "{} belongs to array {}, {} to array {}: give the members of one array",
                first.name,
                short_uuid(&first_header.array_uuid),
                member.name,
                short_uuid(&header.array_uuid)
            )));
        }
    }
    let newest_index = (0..found.len()).max_by_key(|&index| found[index].1.event).expect("not empty");
    let newest = found[newest_index].1.clone();
    let geometry = Geometry {
        member_count: newest.member_count,
        parity_count: newest.parity_count,
        stripe_unit_bytes: newest.stripe_unit_bytes,
        stripe_count: newest.stripe_count,
    };
    let count = geometry.member_count;
    let mut slots: Vec<Option<Member>> = vec![None; count];
    let mut reasons: Vec<Option<String>> = vec![Some("not found".to_string()); count];
    for (member, header) in found {
        let same_shape = header.member_count == count
            && header.parity_count == geometry.parity_count
            && header.stripe_unit_bytes == geometry.stripe_unit_bytes
            && header.stripe_count == geometry.stripe_count;
        if !same_shape {
            return Err(Error::invalid(format!(
                "{}: its header's geometry differs from the newest member header's",
                member.name
            )));
        }
        let slot = header.slot;
        // A member replaced by a rebuild may still lie beside its successor: it claims nothing.
        if header.member_uuid != newest.member_uuids[slot] {
            if slots[slot].is_none() {
                reasons[slot] =
                    Some(format!("{} was replaced in slot {slot} (its uuid is not the array's)", member.name));
            }
            continue;
        }
        if let Some(other) = &slots[slot] {
            return Err(Error::invalid(format!("{} and {} both claim slot {slot}", other.name, member.name)));
        }
        let needed = header.member_bytes_needed();
        if member.device.size_bytes() < needed {
            return Err(Error::invalid(format!(
                "{} is {} bytes, the array needs {needed} per member",
                member.name,
                member.device.size_bytes()
            )));
        }
        if newest.missing_slots & (1u64 << slot) != 0 {
            reasons[slot] = Some(format!("{} is stale: it was missing when the array was last written", member.name));
        } else {
            reasons[slot] = None;
            slots[slot] = Some(member);
        }
    }
    let missing: Vec<usize> = (0..count).filter(|&slot| slots[slot].is_none()).collect();
    let mut notes: Vec<String> = missing
        .iter()
        .map(|&slot| format!("slot {slot} missing: {}", reasons[slot].as_deref().unwrap_or("missing")))
        .collect();
    let uuid = short_uuid(&newest.array_uuid);
    let listed: Vec<String> = missing.iter().map(usize::to_string).collect();
    if missing.len() > geometry.parity_count {
        return Err(Error::invalid(format!(
            "array {uuid}: slots {} missing, parity {} covers at most {} ({})",
            listed.join(", "),
            geometry.parity_count,
            geometry.parity_count,
            notes.join("; ")
        )));
    }
    let read_only = slots.iter().flatten().any(|member| member.device.is_read_only());
    if newest.state == ArrayState::Dirty && !missing.is_empty() && newest.version < 2 {
        return Err(Error::invalid(format!(
            "array {uuid}: slot {} missing and the array was not closed cleanly by a version-{} build, which kept \
             no partial-parity log: a stripe written at the crash could rebuild it wrongly (the write hole, \
             docs/RAID.md rule 2); bring the member back ({})",
            listed.join(", "),
            newest.version,
            notes.join("; ")
        )));
    }
    if newest.state == ArrayState::Dirty && !missing.is_empty() && read_only {
        return Err(Error::invalid(format!(
            "array {uuid}: slot {} missing and the array was not closed cleanly: its recovery from the \
             partial-parity log writes parity, so it needs a writable open ({})",
            listed.join(", "),
            notes.join("; ")
        )));
    }
    let names = (0..count)
        .map(|slot| slots[slot].as_ref().map_or_else(|| format!("slot {slot} (missing)"), |member| member.name.clone()))
        .collect();
    let devices = slots.into_iter().map(|member| member.map(|member| member.device)).collect();
    let header_state = HeaderState {
        array_uuid: newest.array_uuid,
        member_uuids: newest.member_uuids.clone(),
        event: newest.event,
        state: newest.state,
        missing_slots: newest.missing_slots,
    };
    let missing_reasons =
        (0..count).map(|slot| if missing.contains(&slot) { reasons[slot].clone() } else { None }).collect();
    let device = ArrayDevice::new(geometry, header_state, devices, names, missing_reasons, accelerator)?;
    let mut resynced_stripes = 0;
    if newest.state == ArrayState::Dirty && read_only {
        // Reads need no parity while every member is present; the resync waits for a writer.
        notes.push("not closed cleanly: its parity is recomputed at the next writable open".to_string());
    } else if newest.state == ArrayState::Dirty && newest.version < 2 {
        // A version-1 array kept no write-intent bitmap: every stripe is recomputed.
        resynced_stripes = device.resync()?;
        device.close()?;
    } else if newest.state == ArrayState::Dirty {
        resynced_stripes = device.recover()?;
        device.close()?;
    } else {
        device.load_epoch()?;
    }
    Ok(Assembly { device, resynced_stripes, notes })
}
