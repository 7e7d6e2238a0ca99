//! Recognises what a device already holds, so that mkfs can refuse to overwrite it.

use crate::device::Device;
use crate::error::Result;

/// Names the file system found on `device`, if any recognisable one ("tandemfs", "ext4", ...),
/// so that mkfs can refuse to overwrite it without --force.
pub fn probe(device: &dyn Device) -> Result<Option<String>> {
    let length = device.size_bytes().min(72 * 1024) as usize;
    let mut bytes = vec![0u8; length];
    device.read_at(0, &mut bytes)?;
    let at = |offset: usize, magic: &[u8]| bytes.get(offset..offset + magic.len()) == Some(magic);
    let found = if at(0, b"TANDEMFS") || at(4096, b"TANDEMFS") {
        "tandemfs"
    } else if at(1080, &[0x53, 0xEF]) {
        "ext2/ext3/ext4"
    } else if at(0, b"XFSB") {
        "XFS"
    } else if at(0x10040, b"_BHRfS_M") {
        "btrfs"
    } else if at(0, b"LUKS\xba\xbe") {
        "LUKS encrypted volume"
    } else if at(4086, b"SWAPSPACE2") {
        "Linux swap"
    } else if at(512, b"EFI PART") {
        "GPT partition table"
    } else if at(54, b"FAT") || at(82, b"FAT32") {
        "FAT"
    } else if at(0, b"hsqs") {
        "squashfs"
    } else if at(510, &[0x55, 0xAA]) {
        "MBR partition table or boot sector"
    } else {
        return Ok(None);
    };
    Ok(Some(found.to_string()))
}
