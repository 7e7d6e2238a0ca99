//! FUSE adapter for tandemfs.
//!
//! The adapter is deliberately thin: it decodes kernel requests, calls the engine
//! ([`tandemfs::FileSystem`]), and maps engine errors to errno values. The only logic of its
//! own is what FUSE leaves to the server: the permission rules the kernel does not apply
//! (chown and chmod ownership rules, see [`permissions`]), and the byte-granular insert and
//! collapse ioctls (see [`ioctl`]). `docs/FUSE.md` describes the whole mapping.

mod adapter;
mod counters;
mod errno;
pub mod ioctl;
mod mount;
mod permissions;
mod uring;

pub use counters::{RequestCounts, RequestKind};
pub use errno::errno_of;
pub use mount::{
    default_poll_microseconds, mount_background, mount_foreground, remount, unmount, BackgroundMount, MountConfig,
    UringReads, POLL_CORES_MIN, POLL_MICROSECONDS_MAX, READ_AHEAD_KIB_DEFAULT, READ_AHEAD_KIB_MAX,
    URING_MOVE_MIN_BYTES_DEFAULT,
};
pub use uring::{availability as uring_availability, FuseTransport, TransportReport};
