//! The FUSE adapter's entry points, gathered in one place so the commands do not care whether
//! the adapter crate is already merged.
//!
//! TEMPORARY: until `tandem-fuse` lands on main, this module carries stand-ins with exactly the
//! adapter's signatures that fail with a clear message. Once it lands, the body of this file
//! becomes the re-exports below and nothing else changes:
//!
//! ```ignore
//! pub use tandem_fuse::{ioctl, mount_background, mount_foreground, unmount, BackgroundMount, MountConfig};
//! ```

use std::io;
use std::path::Path;

fn not_built() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "this build of tandem has no FUSE adapter")
}

/// Options of a FUSE mount (the adapter's `MountConfig`).
#[allow(dead_code)] // read by the real adapter only
#[derive(Debug, Clone, Default)]
pub struct MountConfig {
    pub allow_other: bool,
    pub default_permissions: bool,
    pub threads: usize,
    pub read_only: bool,
    pub volume_name: String,
}

/// A mount served by background threads (the adapter's `BackgroundMount`).
pub struct BackgroundMount;

impl BackgroundMount {
    pub fn unmount(self) -> io::Result<()> {
        Err(not_built())
    }
}

pub fn mount_foreground(_fs: tandemfs::FileSystem, _mountpoint: &Path, _config: &MountConfig) -> io::Result<()> {
    Err(not_built())
}

pub fn mount_background(
    _fs: tandemfs::FileSystem,
    _mountpoint: &Path,
    _config: &MountConfig,
) -> io::Result<BackgroundMount> {
    Err(not_built())
}

pub fn unmount(_mountpoint: &Path) -> io::Result<()> {
    Err(not_built())
}

pub mod ioctl {
    use super::not_built;
    use std::fs::File;
    use std::io;

    pub fn insert_zeros(_file: &File, _offset: u64, _length: u64) -> io::Result<()> {
        Err(not_built())
    }
    pub fn insert_data(_file: &File, _offset: u64, _data: &[u8]) -> io::Result<()> {
        Err(not_built())
    }
    pub fn collapse(_file: &File, _offset: u64, _length: u64) -> io::Result<()> {
        Err(not_built())
    }
}
