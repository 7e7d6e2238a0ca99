//! Opening volume images (regular files or block devices) with the checks and messages every
//! command shares: a missing image, a directory given by mistake, an image locked by a mount.

use crate::error::{CliError, CliResult};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Arc;
use tandemfs::device::{FileDevice, FileDeviceOptions};

/// How a command wants the image opened.
#[derive(Debug, Clone, Copy)]
pub struct Access {
    pub read_only: bool,
    /// Take the exclusive lock that a mount holds, so two writers never share a volume.
    pub lock_exclusive: bool,
}

impl Access {
    /// Exclusive and writable: mkfs and mount.
    pub const WRITE: Access = Access { read_only: false, lock_exclusive: true };
    /// Exclusive but read-only: fsck must not race a mount, yet changes nothing.
    pub const CHECK: Access = Access { read_only: true, lock_exclusive: true };
    /// Neither: stat may look at a mounted volume (its numbers are then a snapshot).
    pub const LOOK: Access = Access { read_only: true, lock_exclusive: false };
}

/// Says what is wrong with `path` as an image before the engine tries it, so the user reads
/// "no such file" rather than an I/O error at byte 0.
pub fn check_image_path(path: &Path) -> CliResult<()> {
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => {
            Err(CliError::new(format!("{} is a directory, not a volume image", path.display())))
        }
        // Opening a FIFO blocks until a writer comes, and reading a socket or character device
        // never ends: refuse them before any open.
        Ok(metadata) if !metadata.is_file() && !metadata.file_type().is_block_device() => Err(CliError::new(format!(
            "{} is a {}, not a volume image (give an image file or a block device)",
            path.display(),
            special_file_kind(&metadata.file_type())
        ))),
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(CliError::new(format!(
            "{}: no such image (create one with 'tandem mkfs {} --size 1G')",
            path.display(),
            path.display()
        ))),
        Err(error) => Err(CliError::new(format!("cannot read {}: {error}", path.display()))),
    }
}

/// Names a file type that cannot hold a volume, for the refusal above.
fn special_file_kind(file_type: &std::fs::FileType) -> &'static str {
    if file_type.is_fifo() {
        "FIFO"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_char_device() {
        "character device"
    } else {
        "special file"
    }
}

/// Whether an engine error means "someone else holds the lock".
fn is_lock_conflict(error: &tandemfs::Error) -> bool {
    match error {
        tandemfs::Error::Busy => true,
        tandemfs::Error::Io { source, .. } => {
            source.kind() == std::io::ErrorKind::WouldBlock || source.raw_os_error() == Some(libc::EWOULDBLOCK)
        }
        _ => false,
    }
}

/// Opens an existing image.
pub fn open(path: &Path, access: Access) -> CliResult<Arc<FileDevice>> {
    check_image_path(path)?;
    let options = FileDeviceOptions {
        create_size_bytes: None,
        lock_exclusive: access.lock_exclusive,
        read_only: access.read_only,
    };
    FileDevice::open(path, options).map(Arc::new).map_err(|error| {
        if is_lock_conflict(&error) {
            CliError::new(format!(
                "{} is in use by another tandem process (mounted? see /proc/mounts, or 'tandem umount' it first)",
                path.display()
            ))
        } else {
            CliError::new(format!("cannot open {}: {error}", path.display()))
        }
    })
}
