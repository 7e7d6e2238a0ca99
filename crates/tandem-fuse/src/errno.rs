//! The single place where engine errors become errno values.

use tandemfs::error::Error;

/// The errno value the kernel should see for an engine error. Corruption is logged here
/// because the caller only sees EIO and the words saying what was damaged would otherwise be
/// lost.
pub fn errno_of(error: &Error) -> i32 {
    match error {
        Error::Corruption { what } => {
            log::error!("tandemfs: corruption detected, answering EIO: {what}");
            libc::EIO
        }
        Error::Io { .. } => {
            log::error!("tandemfs: {error}");
            libc::EIO
        }
        Error::NotFound => libc::ENOENT,
        Error::Exists => libc::EEXIST,
        Error::NotDirectory => libc::ENOTDIR,
        Error::IsDirectory => libc::EISDIR,
        Error::NotEmpty => libc::ENOTEMPTY,
        Error::NameTooLong => libc::ENAMETOOLONG,
        Error::NoSpace => libc::ENOSPC,
        Error::InvalidArgument(_) => libc::EINVAL,
        Error::TooManyLinks => libc::EMLINK,
        Error::FileTooLarge => libc::EFBIG,
        Error::NoData => libc::ENODATA,
        Error::Range => libc::ERANGE,
        Error::Loop => libc::ELOOP,
        Error::ReadOnly => libc::EROFS,
        Error::NotPermitted => libc::EPERM,
        Error::Busy | Error::InUse(_) => libc::EBUSY,
        Error::Key(_) => libc::EACCES,
        Error::NotSupported => libc::EOPNOTSUPP,
        Error::Shutdown => libc::EIO,
    }
}

/// The same mapping as a `fuser` error value.
pub(crate) fn fuse_errno(error: &Error) -> fuser::Errno {
    fuser::Errno::from_i32(errno_of(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_errno() {
        let cases: Vec<(Error, i32)> = vec![
            (Error::corruption("bad leaf"), libc::EIO),
            (Error::Io { operation: "read", offset: 0, source: std::io::Error::other("x") }, libc::EIO),
            (Error::NotFound, libc::ENOENT),
            (Error::Exists, libc::EEXIST),
            (Error::NotDirectory, libc::ENOTDIR),
            (Error::IsDirectory, libc::EISDIR),
            (Error::NotEmpty, libc::ENOTEMPTY),
            (Error::NameTooLong, libc::ENAMETOOLONG),
            (Error::NoSpace, libc::ENOSPC),
            (Error::invalid("x"), libc::EINVAL),
            (Error::TooManyLinks, libc::EMLINK),
            (Error::FileTooLarge, libc::EFBIG),
            (Error::NoData, libc::ENODATA),
            (Error::Range, libc::ERANGE),
            (Error::Loop, libc::ELOOP),
            (Error::ReadOnly, libc::EROFS),
            (Error::NotPermitted, libc::EPERM),
            (Error::Busy, libc::EBUSY),
            (Error::InUse("volume is in use by pid 1 on host h".into()), libc::EBUSY),
            (Error::Key("wrong passphrase or key file".into()), libc::EACCES),
            (Error::NotSupported, libc::EOPNOTSUPP),
            (Error::Shutdown, libc::EIO),
        ];
        for (error, expected) in cases {
            assert_eq!(errno_of(&error), expected, "{error:?}");
        }
    }
}
