//! Typed errors of the engine. They become errno values only at the FUSE and C edges.

use std::fmt;

/// Every failure the engine reports. Corruption carries words that say what was wrong and
/// where, so that fsck and users see the same message.
#[derive(Debug)]
pub enum Error {
    /// The device failed an operation.
    Io {
        operation: &'static str,
        offset: u64,
        source: std::io::Error,
    },
    /// Something read from the device failed validation.
    Corruption {
        what: String,
    },
    NotFound,
    Exists,
    NotDirectory,
    IsDirectory,
    NotEmpty,
    NameTooLong,
    /// No space on the volume (blocks, inodes or log).
    NoSpace,
    InvalidArgument(String),
    TooManyLinks,
    FileTooLarge,
    /// Extended attribute not present.
    NoData,
    /// Extended attribute value or list does not fit the caller's limit.
    Range,
    /// Too many levels of symbolic links while resolving a path.
    Loop,
    ReadOnly,
    /// The operation is not permitted on this object (a hard link to a directory).
    NotPermitted,
    Busy,
    /// Another mount, in this or another process or host, holds the volume (multi-mount
    /// protection); the words name it.
    InUse(String),
    /// A key problem on an encrypted volume: no key given, a wrong passphrase or key file, a
    /// key file that cannot be used, a key-slot operation refused. The words say which.
    Key(String),
    /// The operation is not supported on this kind of inode.
    NotSupported,
    /// The volume was shut down after an I/O error and accepts no more changes.
    Shutdown,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn corruption(what: impl Into<String>) -> Error {
        Error::Corruption { what: what.into() }
    }
    pub fn invalid(what: impl Into<String>) -> Error {
        Error::InvalidArgument(what.into())
    }
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corruption { .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { operation, offset, source } => {
                write!(f, "I/O error during {operation} at byte {offset}: {source}")
            }
            Error::Corruption { what } => write!(f, "corruption: {what}"),
            Error::NotFound => write!(f, "no such file or directory"),
            Error::Exists => write!(f, "file exists"),
            Error::NotDirectory => write!(f, "not a directory"),
            Error::IsDirectory => write!(f, "is a directory"),
            Error::NotEmpty => write!(f, "directory not empty"),
            Error::NameTooLong => write!(f, "file name too long"),
            Error::NoSpace => write!(f, "no space left on volume"),
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::TooManyLinks => write!(f, "too many links"),
            Error::FileTooLarge => write!(f, "file too large"),
            Error::NoData => write!(f, "no such attribute"),
            Error::Range => write!(f, "result too large for the buffer"),
            Error::Loop => write!(f, "too many levels of symbolic links"),
            Error::ReadOnly => write!(f, "read-only volume"),
            Error::NotPermitted => write!(f, "operation not permitted"),
            Error::Busy => write!(f, "resource busy"),
            Error::InUse(what) | Error::Key(what) => write!(f, "{what}"),
            Error::NotSupported => write!(f, "operation not supported"),
            Error::Shutdown => write!(f, "volume shut down after an earlier I/O error"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
