//! `fs`: the file system API and the front end. Every change is validated against the front
//! end's view (inode cache, name overlay, per-file update lists), appended to the operation log
//! and answered; the back end applies it later. Reads overlay what is not yet applied.

pub mod types;

pub use types::*;

use crate::device::Device;
use crate::error::Result;
use std::sync::Arc;

/// A mounted tandemfs volume. Cheap to clone; all methods take `&self` and are thread-safe.
#[derive(Clone)]
pub struct FileSystem {
    _private: (),
}

#[allow(unused_variables)]
impl FileSystem {
    /// Writes an empty file system on `device` (mkfs).
    pub fn format(device: Arc<dyn Device>, options: &FormatOptions) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Opens the volume, replays the log if needed, reclaims orphans.
    pub fn mount(device: Arc<dyn Device>, options: &MountOptions) -> Result<(FileSystem, MountReport)> {
        unimplemented!("engine in progress")
    }
    /// Applies and checkpoints everything, marks the volume clean. Later calls fail with `Shutdown`.
    pub fn unmount(&self) -> Result<()> {
        unimplemented!("engine in progress")
    }
    pub fn lookup(&self, parent: InodeNumber, name: &[u8]) -> Result<Attributes> {
        unimplemented!("engine in progress")
    }
    pub fn get_attributes(&self, inode: InodeNumber) -> Result<Attributes> {
        unimplemented!("engine in progress")
    }
    pub fn set_attributes(&self, inode: InodeNumber, changes: &SetAttributes) -> Result<Attributes> {
        unimplemented!("engine in progress")
    }
    /// Creates a regular file, FIFO, socket or device node. `Exists` if the name is taken.
    pub fn create(
        &self,
        parent: InodeNumber,
        name: &[u8],
        file_type: FileType,
        permissions: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
    ) -> Result<Attributes> {
        unimplemented!("engine in progress")
    }
    pub fn make_directory(
        &self,
        parent: InodeNumber,
        name: &[u8],
        permissions: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attributes> {
        unimplemented!("engine in progress")
    }
    /// `mkdir -p` in one call: `path` is relative to the root, components separated by '/'.
    pub fn make_directory_all(&self, path: &[u8], permissions: u32, uid: u32, gid: u32) -> Result<Attributes> {
        unimplemented!("engine in progress")
    }
    pub fn symlink(&self, parent: InodeNumber, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attributes> {
        unimplemented!("engine in progress")
    }
    pub fn read_link(&self, inode: InodeNumber) -> Result<Vec<u8>> {
        unimplemented!("engine in progress")
    }
    pub fn link(&self, inode: InodeNumber, new_parent: InodeNumber, new_name: &[u8]) -> Result<Attributes> {
        unimplemented!("engine in progress")
    }
    pub fn unlink(&self, parent: InodeNumber, name: &[u8]) -> Result<()> {
        unimplemented!("engine in progress")
    }
    pub fn remove_directory(&self, parent: InodeNumber, name: &[u8]) -> Result<()> {
        unimplemented!("engine in progress")
    }
    pub fn rename(
        &self,
        parent: InodeNumber,
        name: &[u8],
        new_parent: InodeNumber,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Reads up to `buffer.len()` bytes at `offset`; returns bytes read (short at end of file).
    pub fn read(&self, inode: InodeNumber, offset: u64, buffer: &mut [u8]) -> Result<usize> {
        unimplemented!("engine in progress")
    }
    pub fn write(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<usize> {
        unimplemented!("engine in progress")
    }
    /// Inserts `length` bytes of hole at `offset` (≤ size), shifting later bytes up.
    pub fn insert_range(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Inserts `data` at `offset` (≤ size), shifting later bytes up.
    pub fn insert(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Removes `length` bytes at `offset` (offset + length ≤ size), shifting later bytes down.
    pub fn collapse_range(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        unimplemented!("engine in progress")
    }
    pub fn punch_hole(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        unimplemented!("engine in progress")
    }
    pub fn zero_range(&self, inode: InodeNumber, offset: u64, length: u64, keep_size: bool) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// fallocate mode 0 / KEEP_SIZE: reserves space that reads as zeros.
    pub fn allocate(&self, inode: InodeNumber, offset: u64, length: u64, keep_size: bool) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Lists entries after `after_cookie` (0 starts; "." has cookie 1, ".." cookie 2) until
    /// `visit` returns false.
    pub fn read_directory(
        &self,
        inode: InodeNumber,
        after_cookie: u64,
        visit: &mut dyn FnMut(&DirectoryEntry) -> bool,
    ) -> Result<()> {
        unimplemented!("engine in progress")
    }
    pub fn statistics(&self) -> Result<VolumeStatistics> {
        unimplemented!("engine in progress")
    }
    pub fn set_xattr(&self, inode: InodeNumber, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        unimplemented!("engine in progress")
    }
    pub fn get_xattr(&self, inode: InodeNumber, name: &[u8]) -> Result<Vec<u8>> {
        unimplemented!("engine in progress")
    }
    pub fn list_xattr(&self, inode: InodeNumber) -> Result<Vec<Vec<u8>>> {
        unimplemented!("engine in progress")
    }
    pub fn remove_xattr(&self, inode: InodeNumber, name: &[u8]) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Returns once every change to `inode` made before the call is durable.
    pub fn fsync(&self, inode: InodeNumber, data_only: bool) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Returns once every change made before the call is durable.
    pub fn sync(&self) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Keeps an inode alive while open even if its last name is unlinked (FUSE open/opendir/create).
    pub fn open_inode(&self, inode: InodeNumber) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Ends one `open_inode`; an unlinked inode is reclaimed after its last release.
    pub fn release_inode(&self, inode: InodeNumber) -> Result<()> {
        unimplemented!("engine in progress")
    }
    /// Resolves a '/'-separated path from the root, following symbolic links in all but the
    /// last component.
    pub fn resolve_path(&self, path: &[u8]) -> Result<Attributes> {
        unimplemented!("engine in progress")
    }
    pub fn log_statistics(&self) -> LogStatistics {
        unimplemented!("engine in progress")
    }
}
