//! The FUSE adapter's entry points, gathered in one place so the commands name them once.

pub use tandem_fuse::{
    ioctl, mount_background, mount_foreground, remount, unmount, uring_availability, BackgroundMount, FuseTransport,
    MountConfig, RequestCounts, POLL_MICROSECONDS_MAX, READ_AHEAD_KIB_MAX,
};
