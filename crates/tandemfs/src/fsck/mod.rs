//! `fsck`: offline consistency check of a volume. Reports every problem in words; never panics.

use crate::device::Device;
use crate::error::Result;

/// What fsck found.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    /// One line per problem; empty when the volume is consistent.
    pub problems: Vec<String>,
    pub inodes_checked: u64,
    pub directories_checked: u64,
    pub blocks_in_use: u64,
    /// Log records after the checkpoint: they are replayed (not checked as problems) by mount.
    pub log_records_pending: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the volume on `device`. The volume must not be mounted. Pending log records are
/// replayed in memory first (nothing is written), so a crashed volume checks as it will mount.
#[allow(unused_variables)]
pub fn check(device: &dyn Device) -> Result<FsckReport> {
    unimplemented!("engine in progress")
}

/// Geometry, usage and log state of an unmounted volume, for `tandem stat`.
#[derive(Debug, Clone, Default)]
pub struct VolumeReport {
    pub lines: Vec<(String, String)>,
}

/// Reads the superblock and scans the log without changing anything.
#[allow(unused_variables)]
pub fn inspect(device: &dyn Device) -> Result<VolumeReport> {
    unimplemented!("engine in progress")
}

/// Names the file system found on `device`, if any recognisable one ("tandemfs", "ext4", ...),
/// so that mkfs can refuse to overwrite it without --force.
#[allow(unused_variables)]
pub fn probe(device: &dyn Device) -> Result<Option<String>> {
    unimplemented!("engine in progress")
}
