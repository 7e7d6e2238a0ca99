//! The on-disk inode: a 256-byte record in the inode table (15 per metadata block).

use super::codec::*;
use crate::error::{Error, Result};
use crate::types::FileType;

pub const INODE_BYTES: usize = 256;
pub const ROOT_AREA_BYTES: usize = 64;

pub const OFFSET_INODE_NUMBER: usize = 0;
pub const OFFSET_GENERATION: usize = 8;
pub const OFFSET_MODE: usize = 16;
pub const OFFSET_LINK_COUNT: usize = 20;
pub const OFFSET_UID: usize = 24;
pub const OFFSET_GID: usize = 28;
pub const OFFSET_SIZE: usize = 32;
pub const OFFSET_BLOCKS: usize = 40;
pub const OFFSET_ACCESS_TIME: usize = 48;
pub const OFFSET_MODIFY_TIME: usize = 56;
pub const OFFSET_CHANGE_TIME: usize = 64;
pub const OFFSET_BIRTH_TIME: usize = 72;
pub const OFFSET_RDEV: usize = 80;
pub const OFFSET_PARENT: usize = 88;
pub const OFFSET_ORPHAN_NEXT: usize = 96;
pub const OFFSET_XATTR_BLOCK: usize = 104;
pub const OFFSET_FLAGS: usize = 112;
/// Bytes 116..120 are zero.
pub const OFFSET_RESERVED: usize = 116;
pub const RESERVED_BYTES: usize = 4;
pub const OFFSET_ROOT_AREA: usize = 120;
/// Bytes 184..256 are zero in format version 1.
pub const USED_BYTES: usize = OFFSET_ROOT_AREA + ROOT_AREA_BYTES;

/// Whether an inode may hold `mode`: a known file type and no bits besides the type and the
/// permission bits. The inode decoder and the log record decoder share this check, so that
/// replay never writes an inode that its next read would reject.
pub fn mode_is_valid(mode: u32) -> bool {
    FileType::from_mode(mode).is_some() && mode & !(FileType::MODE_MASK | 0o7777) == 0
}

/// Whether `parent` may be stored as an inode's parent on a volume of `inode_count` inodes
/// (0: none). Shared with the log record decoder for the same reason as [`mode_is_valid`].
pub fn parent_is_valid(parent: u64, inode_count: u64) -> bool {
    parent <= inode_count
}

/// An inode as stored. The root area is a `DirRoot` for directories and an `ExtentRoot` for
/// regular files and symlinks; zero otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub inode_number: u64,
    pub generation: u64,
    pub mode: u32,
    pub link_count: u32,
    pub uid: u32,
    pub gid: u32,
    pub size_bytes: u64,
    /// 4 KiB blocks owned: data, extent tree and xattr blocks.
    pub blocks_owned: u64,
    pub access_time_ns: i64,
    pub modify_time_ns: i64,
    pub change_time_ns: i64,
    pub birth_time_ns: i64,
    pub rdev: u64,
    /// For a directory, the parent directory (its ".."); 0 otherwise.
    pub parent: u64,
    /// Next inode on the orphan list (unlinked while open), 0 at the end.
    pub orphan_next: u64,
    /// Block holding the extended attributes, 0 when none.
    pub xattr_block: u64,
    pub flags: u32,
    pub root_area: [u8; ROOT_AREA_BYTES],
}

impl Inode {
    /// A directory record with no entries yet (`root_area` empty until its H-tree is made),
    /// owned by root, with every time set to `now_ns`: mkfs's root and fsck's /lost+found.
    pub fn empty_directory(inode_number: u64, generation: u64, permissions: u32, parent: u64, now_ns: i64) -> Inode {
        assert!(permissions & !0o7777 == 0, "permission bits only");
        Inode {
            inode_number,
            generation,
            mode: FileType::Directory.mode_bits() | permissions,
            link_count: 2,
            uid: 0,
            gid: 0,
            size_bytes: 0,
            blocks_owned: 0,
            access_time_ns: now_ns,
            modify_time_ns: now_ns,
            change_time_ns: now_ns,
            birth_time_ns: now_ns,
            rdev: 0,
            parent,
            orphan_next: 0,
            xattr_block: 0,
            flags: 0,
            root_area: [0; 64],
        }
    }

    pub fn file_type(&self) -> FileType {
        FileType::from_mode(self.mode).expect("validated on decode")
    }

    pub fn encode(&self, bytes: &mut [u8]) {
        assert_eq!(bytes.len(), INODE_BYTES);
        bytes.fill(0);
        put_u64(bytes, OFFSET_INODE_NUMBER, self.inode_number);
        put_u64(bytes, OFFSET_GENERATION, self.generation);
        put_u32(bytes, OFFSET_MODE, self.mode);
        put_u32(bytes, OFFSET_LINK_COUNT, self.link_count);
        put_u32(bytes, OFFSET_UID, self.uid);
        put_u32(bytes, OFFSET_GID, self.gid);
        put_u64(bytes, OFFSET_SIZE, self.size_bytes);
        put_u64(bytes, OFFSET_BLOCKS, self.blocks_owned);
        put_i64(bytes, OFFSET_ACCESS_TIME, self.access_time_ns);
        put_i64(bytes, OFFSET_MODIFY_TIME, self.modify_time_ns);
        put_i64(bytes, OFFSET_CHANGE_TIME, self.change_time_ns);
        put_i64(bytes, OFFSET_BIRTH_TIME, self.birth_time_ns);
        put_u64(bytes, OFFSET_RDEV, self.rdev);
        put_u64(bytes, OFFSET_PARENT, self.parent);
        put_u64(bytes, OFFSET_ORPHAN_NEXT, self.orphan_next);
        put_u64(bytes, OFFSET_XATTR_BLOCK, self.xattr_block);
        put_u32(bytes, OFFSET_FLAGS, self.flags);
        bytes[OFFSET_ROOT_AREA..OFFSET_ROOT_AREA + ROOT_AREA_BYTES].copy_from_slice(&self.root_area);
    }

    /// Decodes the record of inode `inode_number`; `None` if the slot is unused (all zero).
    pub fn decode(bytes: &[u8], inode_number: u64, inode_count: u64) -> Result<Option<Inode>> {
        assert_eq!(bytes.len(), INODE_BYTES);
        if bytes.iter().all(|byte| *byte == 0) {
            return Ok(None);
        }
        let fail = |what: String| Err(Error::corruption(format!("inode {inode_number}: {what}")));
        let stored_number = get_u64(bytes, OFFSET_INODE_NUMBER);
        if stored_number != inode_number {
            return fail(format!("record names inode {stored_number}"));
        }
        let mode = get_u32(bytes, OFFSET_MODE);
        if !mode_is_valid(mode) {
            return fail(format!("mode {mode:#o} is not valid"));
        }
        let parent = get_u64(bytes, OFFSET_PARENT);
        let orphan_next = get_u64(bytes, OFFSET_ORPHAN_NEXT);
        if !parent_is_valid(parent, inode_count) || orphan_next > inode_count {
            return fail(format!("parent {parent} or orphan link {orphan_next} is not an inode"));
        }
        let flags = get_u32(bytes, OFFSET_FLAGS);
        if flags != 0 {
            return fail(format!("flags {flags:#x}: none are defined"));
        }
        if bytes[OFFSET_RESERVED..OFFSET_RESERVED + RESERVED_BYTES].iter().any(|byte| *byte != 0)
            || bytes[USED_BYTES..].iter().any(|byte| *byte != 0)
        {
            return fail("reserved bytes are not zero".into());
        }
        Ok(Some(Inode {
            inode_number,
            generation: get_u64(bytes, OFFSET_GENERATION),
            mode,
            link_count: get_u32(bytes, OFFSET_LINK_COUNT),
            uid: get_u32(bytes, OFFSET_UID),
            gid: get_u32(bytes, OFFSET_GID),
            size_bytes: get_u64(bytes, OFFSET_SIZE),
            blocks_owned: get_u64(bytes, OFFSET_BLOCKS),
            access_time_ns: get_i64(bytes, OFFSET_ACCESS_TIME),
            modify_time_ns: get_i64(bytes, OFFSET_MODIFY_TIME),
            change_time_ns: get_i64(bytes, OFFSET_CHANGE_TIME),
            birth_time_ns: get_i64(bytes, OFFSET_BIRTH_TIME),
            rdev: get_u64(bytes, OFFSET_RDEV),
            parent,
            orphan_next,
            xattr_block: get_u64(bytes, OFFSET_XATTR_BLOCK),
            flags,
            root_area: bytes[OFFSET_ROOT_AREA..OFFSET_ROOT_AREA + ROOT_AREA_BYTES].try_into().unwrap(),
        }))
    }
}

/// What a lookup answers when the inode a directory entry names cannot be loaded: the entry is
/// in the directory, so a free or out-of-range inode behind it is a dangling entry, which is
/// corruption (EIO, as ext4 answers), not a missing name (ENOENT).
pub fn entry_target_error(directory: u64, name: &[u8], inode_number: u64, error: Error) -> Error {
    match error {
        Error::NotFound => Error::corruption(format!(
            "directory {directory}: entry {:?} names inode {inode_number}, which is free or out of range",
            String::from_utf8_lossy(name)
        )),
        other => other,
    }
}

/// The file type a directory entry stores must be the type of the inode it names.
pub fn check_entry_type(directory: u64, name: &[u8], entry_type: FileType, inode_type: FileType) -> Result<()> {
    if entry_type != inode_type {
        return Err(Error::corruption(format!(
            "directory {directory}: entry {:?} says {entry_type:?}, its inode is a {inode_type:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(USED_BYTES, 184);
        const { assert!(USED_BYTES <= INODE_BYTES) };
        assert_eq!(crate::dir::DIR_ROOT_BYTES, ROOT_AREA_BYTES);
        assert_eq!(crate::extent::EXTENT_ROOT_BYTES, ROOT_AREA_BYTES);
    }

    #[test]
    fn round_trip() {
        let inode = Inode {
            inode_number: 42,
            generation: 7,
            mode: 0o100644,
            link_count: 1,
            uid: 1000,
            gid: 100,
            size_bytes: 12345,
            blocks_owned: 4,
            access_time_ns: 1,
            modify_time_ns: -2,
            change_time_ns: 3,
            birth_time_ns: 4,
            rdev: 0,
            parent: 0,
            orphan_next: 0,
            xattr_block: 99,
            flags: 0,
            root_area: [5; ROOT_AREA_BYTES],
        };
        let mut bytes = [0u8; INODE_BYTES];
        inode.encode(&mut bytes);
        assert_eq!(Inode::decode(&bytes, 42, 100).unwrap(), Some(inode));
        assert!(Inode::decode(&bytes, 43, 100).unwrap_err().is_corruption());
        assert_eq!(Inode::decode(&[0; INODE_BYTES], 1, 100).unwrap(), None);
    }
}
