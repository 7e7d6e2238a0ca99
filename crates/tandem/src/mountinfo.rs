//! Reading /proc/self/mountinfo, to tell when a background mount has become visible and whether a
//! path is a mount point. Parsing is lenient: a line we cannot read is skipped, never fatal.

use std::path::{Path, PathBuf};

/// One mount, as far as this command needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub file_system_type: String,
    pub source: String,
}

impl MountEntry {
    pub fn is_fuse(&self) -> bool {
        self.file_system_type == "fuse" || self.file_system_type.starts_with("fuse.")
    }
}

/// Undoes the kernel's octal escapes (`\040` for a space and so on) in mountinfo fields.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\' && index + 4 <= bytes.len() {
            let octal = &bytes[index + 1..index + 4];
            if octal.iter().all(|digit| (b'0'..=b'7').contains(digit)) {
                let value = octal.iter().fold(0u32, |total, digit| total * 8 + u32::from(digit - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    decoded.push(byte);
                    index += 4;
                    continue;
                }
            }
        }
        decoded.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// Parses the text of a mountinfo file.
pub fn parse(text: &str) -> Vec<MountEntry> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let Some((before, after)) = line.split_once(" - ") else { continue };
        let fields: Vec<&str> = before.split(' ').collect();
        let tail: Vec<&str> = after.split(' ').collect();
        if fields.len() < 5 || tail.len() < 2 {
            continue;
        }
        entries.push(MountEntry {
            mount_point: PathBuf::from(unescape(fields[4])),
            file_system_type: tail[0].to_string(),
            source: unescape(tail[1]),
        });
    }
    entries
}

/// The mounts of this process's namespace; empty if /proc is unavailable.
pub fn current() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|text| parse(&text)).unwrap_or_default()
}

/// How many FUSE mounts sit on `mount_point` (a canonical path). Mounts can stack, so callers
/// compare counts before and after rather than asking "is there one".
pub fn fuse_mounts_at(mount_point: &Path) -> usize {
    current().iter().filter(|entry| entry.is_fuse() && entry.mount_point == mount_point).count()
}

/// The topmost mount on `mount_point`, if any.
pub fn mount_at(mount_point: &Path) -> Option<MountEntry> {
    current().into_iter().rev().find(|entry| entry.mount_point == mount_point)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_with_optional_fields_and_escapes() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    40 22 0:45 / /tmp/t rw,nosuid,nodev,relatime shared:1 - fuse.tandemfs tandem.img rw,user_id=0\n\
                    garbage line\n";
        let entries = parse(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(entries[0].file_system_type, "ext3");
        assert!(!entries[0].is_fuse());
        assert!(entries[1].is_fuse());
        assert_eq!(entries[1].source, "tandem.img");
    }

    #[test]
    fn unescape_leaves_short_or_bad_escapes() {
        assert_eq!(unescape("a\\04"), "a\\04");
        assert_eq!(unescape("a\\999b"), "a\\999b");
        assert_eq!(unescape("x\\134y"), "x\\y");
    }
}
