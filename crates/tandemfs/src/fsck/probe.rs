//! Recognises what a device already holds, so that mkfs can refuse to overwrite it.
//!
//! Two questions, both cheap to answer on a device of any size: does it carry the signature of a
//! known file system, volume manager or partition table ([`probe`]), and does any of a bounded
//! set of places hold a non-zero byte ([`first_nonzero`], with [`sample_ranges`] choosing the
//! places: the start, the end and a spread between)?

use crate::device::Device;
use crate::error::Result;

/// Bytes read at the start of the device for signatures: btrfs keeps its superblock at 64 KiB.
const HEAD_BYTES: u64 = 72 * 1024;
/// Bytes read at the end of the device for trailing signatures (GPT backup header, md 0.90).
const TAIL_BYTES: u64 = 128 * 1024;
/// Bytes sampled at the start and at the end of a device by `sample_ranges`.
const EDGE_SAMPLE_BYTES: u64 = 1 << 20;
/// Evenly spread samples between the edges, and the bytes of each.
const SPREAD_SAMPLES: u64 = 256;
const SPREAD_SAMPLE_BYTES: u64 = 64 * 1024;
/// Largest piece read at once by `first_nonzero`.
const READ_CHUNK_BYTES: u64 = 1 << 20;

/// Names the file system found on `device`, if any recognisable one ("tandemfs", "ext4", ...),
/// so that mkfs can refuse to overwrite it without --force.
pub fn probe(device: &dyn Device) -> Result<Option<String>> {
    let size_bytes = device.size_bytes();
    let mut head = vec![0u8; size_bytes.min(HEAD_BYTES) as usize];
    device.read_at(0, &mut head)?;
    if let Some(found) = probe_head(&head) {
        return Ok(Some(found.to_string()));
    }
    let tail_start = size_bytes.saturating_sub(TAIL_BYTES).max(head.len() as u64);
    let mut tail = vec![0u8; (size_bytes - tail_start) as usize];
    device.read_at(tail_start, &mut tail)?;
    Ok(probe_tail(&tail, size_bytes).map(str::to_string))
}

/// Signatures at fixed offsets from the start of the device.
fn probe_head(bytes: &[u8]) -> Option<&'static str> {
    let at = |offset: usize, magic: &[u8]| bytes.get(offset..offset + magic.len()) == Some(magic);
    // md RAID 1.1 and 1.2 superblocks (magic 0xa92b4efc, little-endian) at 0 and 4 KiB.
    let md_magic = 0xa92b_4efcu32.to_le_bytes();
    let found = if at(0, b"TANDEMFS") || at(4096, b"TANDEMFS") {
        "tandemfs"
    } else if at(1080, &[0x53, 0xEF]) {
        "ext2/ext3/ext4"
    } else if at(0, b"XFSB") {
        "XFS"
    } else if at(0x10040, b"_BHRfS_M") {
        "btrfs"
    } else if at(0, b"LUKS\xba\xbe") || at(0, b"SKUL\xba\xbe") {
        "LUKS encrypted volume"
    } else if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        "Linux swap"
    } else if at(512, b"LABELONE") || at(24 + 512, b"LVM2 001") {
        "LVM physical volume"
    } else if at(0, b"TNDMRAID") || at(4096, b"TNDMRAID") {
        "tandemfs array member"
    } else if at(0, &md_magic) || at(4096, &md_magic) {
        "Linux md RAID member"
    } else if at(512, b"EFI PART") {
        "GPT partition table"
    } else if at(54, b"FAT") || at(82, b"FAT32") {
        "FAT"
    } else if at(3, b"NTFS    ") {
        "NTFS"
    } else if at(0, b"hsqs") {
        "squashfs"
    } else if at(0x8001, b"CD001") {
        "ISO 9660"
    } else if at(510, &[0x55, 0xAA]) {
        "MBR partition table or boot sector"
    } else {
        return None;
    };
    Some(found)
}

/// Signatures kept at the end of the device; `bytes` are its last bytes.
fn probe_tail(bytes: &[u8], size_bytes: u64) -> Option<&'static str> {
    let at_end = |from_end: usize, magic: &[u8]| {
        bytes.len().checked_sub(from_end).and_then(|start| bytes.get(start..start + magic.len())) == Some(magic)
    };
    if at_end(512, b"EFI PART") {
        return Some("GPT partition table (backup header)");
    }
    // md 0.90 (and 1.0) superblocks sit 64 KiB-aligned in the last 64..128 KiB.
    let md_offset = (size_bytes & !(64 * 1024 - 1)).saturating_sub(64 * 1024);
    let md_from_end = (size_bytes - md_offset) as usize;
    if at_end(md_from_end, &0xa92b_4efcu32.to_le_bytes()) || at_end(md_from_end, &0xa92b_4efcu32.to_be_bytes()) {
        return Some("Linux md RAID member");
    }
    None
}

/// Byte ranges `(offset, length)` worth looking at on a device of `size_bytes`: the first and
/// the last MiB and `SPREAD_SAMPLES` evenly spread pieces between, about 18 MiB in all for any
/// size. Sorted, within the device, not overlapping.
pub fn sample_ranges(size_bytes: u64) -> Vec<(u64, u64)> {
    let mut ranges = vec![(0, size_bytes.min(EDGE_SAMPLE_BYTES))];
    for index in 1..SPREAD_SAMPLES {
        let offset = size_bytes / SPREAD_SAMPLES * index;
        ranges.push((offset, SPREAD_SAMPLE_BYTES.min(size_bytes - offset)));
    }
    let tail_start = size_bytes.saturating_sub(EDGE_SAMPLE_BYTES);
    ranges.push((tail_start, size_bytes - tail_start));
    normalize_ranges(ranges)
}

/// Sorts ranges and joins those that overlap or touch; empty ones are dropped.
pub fn normalize_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.retain(|&(_, length)| length > 0);
    ranges.sort_unstable();
    let mut joined: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (offset, length) in ranges {
        match joined.last_mut() {
            Some((last_offset, last_length)) if offset <= *last_offset + *last_length => {
                *last_length = (*last_length).max(offset + length - *last_offset);
            }
            _ => joined.push((offset, length)),
        }
    }
    joined
}

/// The offset of the first non-zero byte within `ranges` (clipped to the device), if any.
pub fn first_nonzero(device: &dyn Device, ranges: &[(u64, u64)]) -> Result<Option<u64>> {
    let size_bytes = device.size_bytes();
    let mut buffer = vec![0u8; READ_CHUNK_BYTES as usize];
    for &(offset, length) in ranges {
        let end = offset.saturating_add(length).min(size_bytes);
        let mut position = offset;
        // Bounded: each pass moves `position` forward by at least one byte towards `end`.
        while position < end {
            let count = (end - position).min(READ_CHUNK_BYTES) as usize;
            device.read_at(position, &mut buffer[..count])?;
            if let Some(index) = buffer[..count].iter().position(|&byte| byte != 0) {
                return Ok(Some(position + index as u64));
            }
            position += count as u64;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    #[test]
    fn samples_cover_both_edges_and_stay_inside() {
        for size_bytes in [4096u64, 1 << 20, 3 << 20, 200 << 20, 1 << 40] {
            let ranges = sample_ranges(size_bytes);
            assert_eq!(ranges[0].0, 0);
            let (last_offset, last_length) = *ranges.last().unwrap();
            assert_eq!(last_offset + last_length, size_bytes);
            assert!(ranges.windows(2).all(|pair| pair[0].0 + pair[0].1 < pair[1].0));
            let total: u64 = ranges.iter().map(|range| range.1).sum();
            assert!(total <= 2 * EDGE_SAMPLE_BYTES + SPREAD_SAMPLES * SPREAD_SAMPLE_BYTES);
        }
    }

    #[test]
    fn finds_data_and_signatures() {
        let device = MemoryDevice::new(8 << 20);
        assert_eq!(probe(&device).unwrap(), None);
        assert_eq!(first_nonzero(&device, &sample_ranges(8 << 20)).unwrap(), None);
        device.write_at((8 << 20) - 10, &[1]).unwrap();
        assert_eq!(first_nonzero(&device, &sample_ranges(8 << 20)).unwrap(), Some((8 << 20) - 10));
        device.write_at((8 << 20) - 512, b"EFI PART").unwrap();
        assert_eq!(probe(&device).unwrap().as_deref(), Some("GPT partition table (backup header)"));
        device.write_at(1080, &[0x53, 0xEF]).unwrap();
        assert_eq!(probe(&device).unwrap().as_deref(), Some("ext2/ext3/ext4"));
    }
}
