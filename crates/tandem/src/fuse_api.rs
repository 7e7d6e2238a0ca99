//! The FUSE adapter's entry points, gathered in one place: the commands name `fuse_api`, so the
//! adapter's API is visible at a glance and stubbing it for a build without FUSE is one file.

pub use tandem_fuse::{ioctl, mount_background, mount_foreground, unmount, BackgroundMount, MountConfig};
