//! The encrypted peers of `bench meta --encrypt` and `bench mount --encrypt`, set up the same way
//! for both: each runs a body on its mounted directory, or says in one line why it was skipped.
//! Set-up and tear-down live in dmcrypt.rs and gocryptfs.rs; tear-down happens when the body
//! returns, fails, panics or is interrupted.

use super::dmcrypt::{DmCryptVolume, SetupError};
use super::gocryptfs::Gocryptfs;
use std::path::Path;

/// Column labels.
pub const DM_CRYPT: &str = "ext4 on dm-crypt";
pub const GOCRYPTFS: &str = "gocryptfs";

/// What became of a peer: skipped (the line says why) or run (its measurement or its failure).
pub enum Outcome<T> {
    Skipped(String),
    Ran(Result<T, String>),
}

/// The volumes' shape, the same for every column of a run.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    pub scratch: &'a Path,
    pub volume_bytes: u64,
    pub inode_count: u64,
}

/// Runs `body` on ext4 inside LUKS2 on a loop device over an image in the scratch directory,
/// unless `skip` (the option that skipped it is named in the line) or the machine cannot.
pub fn on_dm_crypt<T>(shape: Shape<'_>, skip: bool, body: impl FnOnce(&Path) -> Result<T, String>) -> Outcome<T> {
    if skip {
        return Outcome::Skipped(format!("{DM_CRYPT} skipped (--no-dm-crypt)"));
    }
    if let Some(reason) = DmCryptVolume::unavailable_reason() {
        return Outcome::Skipped(format!("{DM_CRYPT} skipped: {reason}"));
    }
    // Nothing new is set up once Ctrl-C asked the run to end.
    if let Err(error) = crate::interrupt::check() {
        return Outcome::Ran(Err(error));
    }
    let path = shape.scratch.join(format!("tandem-bench-dmcrypt-{}.img", std::process::id()));
    match DmCryptVolume::create(&path, shape.volume_bytes, shape.inode_count) {
        Ok(volume) => {
            let result = body(volume.mountpoint());
            drop(volume);
            Outcome::Ran(result)
        }
        Err(SetupError::Unavailable(reason)) => Outcome::Skipped(format!("{DM_CRYPT} skipped: {reason}")),
        Err(SetupError::Failed(error)) => Outcome::Ran(Err(error)),
    }
}

/// Runs `body` on gocryptfs over an ext4 loop volume over an image in the scratch directory,
/// unless `skip` or the machine cannot.
pub fn on_gocryptfs<T>(shape: Shape<'_>, skip: bool, body: impl FnOnce(&Path) -> Result<T, String>) -> Outcome<T> {
    if skip {
        return Outcome::Skipped(format!("{GOCRYPTFS} skipped (--no-gocryptfs)"));
    }
    if let Some(reason) = Gocryptfs::unavailable_reason() {
        return Outcome::Skipped(format!("{GOCRYPTFS} skipped: {reason}"));
    }
    if let Err(error) = crate::interrupt::check() {
        return Outcome::Ran(Err(error));
    }
    let path = shape.scratch.join(format!("tandem-bench-gocryptfs-{}.img", std::process::id()));
    Outcome::Ran(Gocryptfs::create(&path, shape.volume_bytes, shape.inode_count).and_then(|gocryptfs| {
        let result = body(gocryptfs.mountpoint());
        drop(gocryptfs);
        result
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(scratch: &Path) -> Shape<'_> {
        Shape { scratch, volume_bytes: 256 << 20, inode_count: 4096 }
    }

    #[test]
    fn a_skipped_peer_runs_nothing_and_says_which_option() {
        let scratch = std::env::temp_dir();
        let outcome = on_dm_crypt(shape(&scratch), true, |_| -> Result<(), String> { panic!("ran") });
        assert!(matches!(outcome, Outcome::Skipped(line) if line.contains("--no-dm-crypt")));
        let outcome = on_gocryptfs(shape(&scratch), true, |_| -> Result<(), String> { panic!("ran") });
        assert!(matches!(outcome, Outcome::Skipped(line) if line.contains("--no-gocryptfs")));
    }

    /// Whether anything is mounted at a path containing `needle`, by /proc/self/mountinfo.
    fn mounted_anywhere(needle: &str) -> bool {
        std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|text| text.contains(needle))
    }

    /// Needs root, loop devices, e2fsprogs, FUSE and gocryptfs; says so and passes without them.
    #[test]
    fn gocryptfs_is_taken_down_after_a_failing_and_a_panicking_body() {
        if let Some(reason) = Gocryptfs::unavailable_reason() {
            eprintln!("skipped: {reason}");
            return;
        }
        let scratch = std::env::temp_dir().join(format!("tandem-peers-test-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).unwrap();
        let needle = format!("tandem-bench-gocryptfs-{}", std::process::id());
        let outcome = on_gocryptfs(shape(&scratch), false, |root| -> Result<(), String> {
            std::fs::write(root.join("file"), b"contents").map_err(|error| error.to_string())?;
            assert!(mounted_anywhere(&needle));
            Err("the workload failed".into())
        });
        assert!(matches!(outcome, Outcome::Ran(Err(error)) if error == "the workload failed"));
        assert!(!mounted_anywhere(&needle), "gocryptfs still mounted after a failure");
        let panicked = std::panic::catch_unwind(|| {
            on_gocryptfs(shape(&scratch), false, |_| -> Result<(), String> { panic!("the workload panicked") })
        });
        assert!(panicked.is_err());
        assert!(!mounted_anywhere(&needle), "gocryptfs still mounted after a panic");
        let ext4 = format!("tandem-bench-ext4-{}", std::process::id());
        assert!(!mounted_anywhere(&ext4), "the ext4 volume below is still mounted");
        let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().collect();
        assert!(left.is_empty(), "images left behind: {left:?}");
        std::fs::remove_dir(&scratch).unwrap();
    }
}
