//! The ground floor: inode numbers, file types and the name limits, which every layer from
//! `block` up shares. Nothing here depends on any other module of the crate.

/// Inode number. 64 bits; `ROOT_INODE` is the root directory; 0 is never an inode.
pub type InodeNumber = u64;
pub const ROOT_INODE: InodeNumber = 1;
/// Longest name of a directory entry, in bytes.
pub const NAME_MAX_BYTES: usize = 255;
/// Longest symbolic link target, in bytes.
pub const SYMLINK_MAX_BYTES: usize = 4095;
/// Longest extended attribute name, in bytes.
pub const XATTR_NAME_MAX_BYTES: usize = 255;
/// Most hard links to one inode.
pub const LINK_MAX: u32 = 65_000;

/// The type of an inode, as stored in the `S_IFMT` bits of its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl FileType {
    pub const MODE_MASK: u32 = 0o170000;
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & FileType::MODE_MASK {
            0o100000 => FileType::Regular,
            0o040000 => FileType::Directory,
            0o120000 => FileType::Symlink,
            0o020000 => FileType::CharDevice,
            0o060000 => FileType::BlockDevice,
            0o010000 => FileType::Fifo,
            0o140000 => FileType::Socket,
            _ => return None,
        })
    }
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => 0o100000,
            FileType::Directory => 0o040000,
            FileType::Symlink => 0o120000,
            FileType::CharDevice => 0o020000,
            FileType::BlockDevice => 0o060000,
            FileType::Fifo => 0o010000,
            FileType::Socket => 0o140000,
        }
    }
    /// The `d_type` value (`DT_REG` and so on) stored in directory entries.
    pub fn dirent_type(self) -> u8 {
        match self {
            FileType::Fifo => 1,
            FileType::CharDevice => 2,
            FileType::Directory => 4,
            FileType::BlockDevice => 6,
            FileType::Regular => 8,
            FileType::Symlink => 10,
            FileType::Socket => 12,
        }
    }
    pub fn from_dirent_type(value: u8) -> Option<FileType> {
        Some(match value {
            1 => FileType::Fifo,
            2 => FileType::CharDevice,
            4 => FileType::Directory,
            6 => FileType::BlockDevice,
            8 => FileType::Regular,
            10 => FileType::Symlink,
            12 => FileType::Socket,
            _ => return None,
        })
    }
}
