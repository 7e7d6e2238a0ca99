//! `tandem fsck`: offline check. Exit 0 clean, 1 with one problem per line, 2 when the check
//! could not run (usage, missing image, I/O error, image in use).

use crate::error::{CliError, CliResult, EXIT_PROBLEMS_FOUND, EXIT_SUCCESS};
use crate::image::{self, Access};
use crate::size::format_count;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct FsckArguments {
    /// Image file or block device holding a tandemfs volume (must not be mounted)
    pub image: PathBuf,
    /// Print only problems, not the summary of a clean volume
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// The outcome of a check, for `tandem fsck` and `tandem demo`.
pub struct Verdict {
    pub clean: bool,
    pub lines: Vec<String>,
}

/// Runs the engine's check on `path` and puts its findings into words.
pub fn check(path: &Path) -> CliResult<Verdict> {
    let device = image::open(path, Access::CHECK)?;
    // Another file system is not a damaged tandemfs: say what it is instead of listing problems.
    if let Ok(Some(found)) = tandemfs::fsck::probe(&*device) {
        if found != "tandemfs" {
            return Err(CliError::new(format!("{} holds {found}, not tandemfs", path.display())));
        }
    }
    // The lock covers one path; the MMP block covers all. A read-only check of a volume that a
    // live mount is writing goes on, but its findings may be changes in flight.
    if let Ok(tandemfs::block::mmp::Activity::Recent { record, .. }) =
        tandemfs::block::mmp::look_at_volume(device.clone())
    {
        eprintln!(
            "{}: warning: volume is in use by {}; checking it read-only, but what a live mount is writing may show as problems",
            path.display(),
            record.owner()
        );
    }
    match tandemfs::fsck::check(device.clone()) {
        Ok(report) => {
            let summary = format!(
                "{} inodes, {} directories, {} blocks in use, {} log records pending replay",
                format_count(report.inodes_checked),
                format_count(report.directories_checked),
                format_count(report.blocks_in_use),
                format_count(report.log_records_pending)
            );
            if report.is_clean() {
                Ok(Verdict { clean: true, lines: vec![format!("{}: clean ({summary})", path.display())] })
            } else {
                let mut lines = report.problems.clone();
                lines.push(format!(
                    "{}: {} problem{} found ({summary})",
                    path.display(),
                    report.problems.len(),
                    if report.problems.len() == 1 { "" } else { "s" }
                ));
                Ok(Verdict { clean: false, lines })
            }
        }
        // Damage bad enough to stop the check (a torn superblock) is still a finding about the
        // volume, not a failure of the tool: report it as a problem.
        Err(error) if error.is_corruption() => Ok(Verdict {
            clean: false,
            lines: vec![error.to_string(), format!("{}: the check stopped at this problem", path.display())],
        }),
        Err(error) => Err(CliError::new(format!("cannot check {}: {error}", path.display()))),
    }
}

pub fn run(arguments: FsckArguments) -> CliResult<i32> {
    let verdict = check(&arguments.image)?;
    if verdict.clean {
        if !arguments.quiet {
            for line in &verdict.lines {
                println!("{line}");
            }
        }
        Ok(EXIT_SUCCESS)
    } else {
        for line in &verdict.lines {
            println!("{line}");
        }
        Ok(EXIT_PROBLEMS_FOUND)
    }
}
