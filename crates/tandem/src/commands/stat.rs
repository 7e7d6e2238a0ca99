//! `tandem stat`: geometry, usage and log state of a volume, read without changing it.

use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::image::Access;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct StatArguments {
    /// Image file or block device holding a tandemfs volume (may be mounted: then a snapshot)
    pub image: PathBuf,
    /// Key file of an encrypted volume (exactly 64 bytes); without it, its passphrase is asked
    /// on the terminal
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

/// Prints `name: value` pairs with the values in one column.
pub fn print_aligned(lines: &[(String, String)], indent: &str) {
    let width = lines.iter().map(|(name, _)| name.chars().count()).max().unwrap_or(0);
    for (name, value) in lines {
        println!("{indent}{:<width$}  {value}", format!("{name}:"), width = width + 1);
    }
}

pub fn run(arguments: StatArguments) -> CliResult<i32> {
    let device = crate::array::open_volume_device(&arguments.image, Access::LOOK)?;
    let unlocked = crate::secret::unlock(&arguments.image, device.clone(), arguments.key_file.as_deref())?;
    let report = tandemfs::fsck::inspect(unlocked)
        .map_err(|error| CliError::new(format!("cannot read the volume on {}: {error}", arguments.image.display())))?;
    println!("{}", arguments.image.display());
    let mut lines = report.lines;
    // Through any path (a loop device, a hard link), the MMP block says whether a mount holds it.
    if let Ok(activity) = tandemfs::block::mmp::look_at_volume(device) {
        lines.push(("multi-mount protection".into(), activity.describe()));
    }
    print_aligned(&lines, "  ");
    Ok(EXIT_SUCCESS)
}
