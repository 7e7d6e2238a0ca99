//! `tandem fsck`: offline check and repair. Exit 0 clean, 1 with one problem (or repair) per
//! line, 2 when the check could not run (usage, missing image, I/O error, image in use), 4 when
//! `--repair` left problems it could not fix. Long runs show progress: a bar on a terminal,
//! occasional plain lines otherwise (both on stderr, so stdout stays the report).

use crate::error::{CliError, CliResult, EXIT_PROBLEMS_FOUND, EXIT_PROBLEMS_REMAIN, EXIT_SUCCESS};
use crate::image::Access;
use crate::size::format_count;
use clap::Args;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tandemfs::fsck::Progress;

#[derive(Args)]
pub struct FsckArguments {
    /// Image file or block device holding a tandemfs volume (must not be mounted)
    pub image: PathBuf,
    /// Print only problems, not the summary of a clean volume
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Repair what is found, reporting each change on its own line
    #[arg(long, short = 'y', conflicts_with = "no")]
    pub repair: bool,
    /// Answer no to every repair: open read-only and list what --repair would change
    #[arg(short = 'n', long = "no")]
    pub no: bool,
    /// Key file of an encrypted volume (exactly 64 bytes); without it, its passphrase is asked
    /// on the terminal
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

/// Plain progress lines start after this long, so that short runs print none.
const PLAIN_PROGRESS_AFTER: Duration = Duration::from_secs(2);
/// Plain progress lines come at most this often.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Shows the engine's progress: an `indicatif` bar when stderr is a terminal, else a plain line
/// now and then for long runs.
struct ProgressDisplay {
    bar: Option<indicatif::ProgressBar>,
    phase: &'static str,
    started: Instant,
    last_line: Option<Instant>,
}

impl ProgressDisplay {
    fn new() -> ProgressDisplay {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(0);
            let style = indicatif::ProgressStyle::with_template("{msg:32} [{bar:40}] {pos}/{len} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            bar
        });
        ProgressDisplay { bar, phase: "", started: Instant::now(), last_line: None }
    }

    fn update(&mut self, progress: &Progress) {
        let phase_changed = progress.phase != self.phase;
        self.phase = progress.phase;
        if let Some(bar) = &self.bar {
            if phase_changed {
                bar.set_message(progress.phase);
                bar.set_position(0);
            }
            bar.set_length(progress.total.max(progress.done));
            bar.set_position(progress.done);
            return;
        }
        let now = Instant::now();
        let due = self.last_line.is_none_or(|last| now - last >= PLAIN_PROGRESS_EVERY || phase_changed);
        if now - self.started >= PLAIN_PROGRESS_AFTER && due {
            self.last_line = Some(now);
            if progress.total > 0 {
                eprintln!("tandem fsck: {}: {} of {}", progress.phase, progress.done, progress.total);
            } else {
                eprintln!("tandem fsck: {}: {}", progress.phase, progress.done);
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The outcome of a check, for `tandem fsck` and `tandem demo`.
pub struct Verdict {
    pub clean: bool,
    pub lines: Vec<String>,
}

/// Another file system is not a damaged tandemfs: say what it is instead of listing problems.
fn refuse_foreign(path: &Path, device: &dyn tandemfs::device::Device) -> CliResult<()> {
    if let Ok(Some(found)) = tandemfs::fsck::probe(device) {
        if found != "tandemfs" {
            return Err(CliError::new(format!("{} holds {found}, not tandemfs", path.display())));
        }
    }
    Ok(())
}

/// Runs the engine's check on `path` and puts its findings into words.
pub fn check(path: &Path, key_file: Option<&Path>) -> CliResult<Verdict> {
    let device = crate::array::open_volume_device(path, Access::CHECK)?;
    refuse_foreign(path, &*device)?;
    let volume = crate::secret::unlock(path, device.clone(), key_file)?;
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
    let mut display = ProgressDisplay::new();
    let checked = tandemfs::fsck::check_with_progress(volume, &mut |progress| display.update(progress));
    display.finish();
    match checked {
        Ok(report) => {
            let summary = format!(
                "{} inodes, {} directories, {} blocks in use, {} log records pending replay",
                format_count(report.inodes_checked),
                format_count(report.directories_checked),
                format_count(report.blocks_in_use),
                format_count(report.log_records_pending)
            );
            // What a crash left that the next mount sets right: said either way, never a problem.
            let mut lines: Vec<String> =
                report.notes.iter().map(|note| format!("{}: note: {note}", path.display())).collect();
            if report.is_clean() {
                lines.push(format!("{}: clean ({summary})", path.display()));
                Ok(Verdict { clean: true, lines })
            } else {
                lines.extend(report.problems.iter().cloned());
                // Damaged file data is found, not fixed: say so rather than promise a repair.
                let remedy = match report.damaged_data_blocks {
                    0 => format!("'tandem fsck --repair {}' repairs the volume", path.display()),
                    blocks => format!(
                        "'tandem fsck --repair {}' repairs the rest, but {} data block{} stay{} damaged \
                         (reads of them fail with EIO): restore those files from a copy",
                        path.display(),
                        format_count(blocks),
                        if blocks == 1 { "" } else { "s" },
                        if blocks == 1 { "s" } else { "" }
                    ),
                };
                lines.push(format!(
                    "{}: {} problem{} found ({summary}); {remedy}",
                    path.display(),
                    report.problems.len(),
                    if report.problems.len() == 1 { "" } else { "s" },
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
    if arguments.repair || arguments.no {
        return repair(&arguments.image, arguments.repair, arguments.quiet, arguments.key_file.as_deref());
    }
    let verdict = check(&arguments.image, arguments.key_file.as_deref())?;
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

/// `--repair` (write) or `-n` (a dry run on a read-only image): one line per change, then a
/// summary; exit 0 when there was nothing to do, 1 when problems were found (and, with
/// `--repair`, fixed), 4 when problems remain after the repair.
fn repair(path: &Path, write: bool, quiet: bool, key_file: Option<&Path>) -> CliResult<i32> {
    let device = crate::array::open_volume_device(path, if write { Access::WRITE } else { Access::CHECK })?;
    refuse_foreign(path, &*device)?;
    let volume = crate::secret::unlock(path, device.clone(), key_file)?;
    // The lock covers one path; the MMP block covers every path to the same bytes. A repair
    // under a live mount would fight it for every block it writes.
    if let Ok(tandemfs::block::mmp::Activity::Recent { record, .. }) =
        tandemfs::block::mmp::look_at_volume(device.clone())
    {
        if write {
            return Err(CliError::new(format!(
                "cannot repair {}: volume is in use by {}; unmount it first",
                path.display(),
                record.owner()
            )));
        }
    }
    let mut display = ProgressDisplay::new();
    let repaired = tandemfs::fsck::repair(volume, write, &mut |progress| display.update(progress));
    display.finish();
    let verb = if write { "cannot repair" } else { "cannot check" };
    let report = repaired.map_err(|error| CliError::new(format!("{verb} {}: {error}", path.display())))?;
    let prefix = if write { "" } else { "would repair: " };
    for note in &report.notes {
        println!("{prefix}{note}");
    }
    for change in &report.changes {
        println!("{prefix}{change}");
    }
    if report.changes_not_listed > 0 {
        println!("{prefix}... and {} more changes", format_count(report.changes_not_listed));
    }
    for problem in &report.after.problems {
        println!("not repaired: {problem}");
    }
    let changes = report.change_count();
    let plural = if changes == 1 { "" } else { "s" };
    if !report.after.is_clean() {
        println!("{}: {} problems remain after the repair", path.display(), report.after.problems.len());
        return Ok(EXIT_PROBLEMS_REMAIN);
    }
    if changes == 0 {
        if !quiet {
            println!("{}: clean, nothing to repair", path.display());
        }
        return Ok(EXIT_SUCCESS);
    }
    if write {
        println!("{}: {changes} change{plural} made; the volume is consistent", path.display());
    } else {
        println!("{}: {changes} change{plural} needed; nothing was written (run with --repair)", path.display());
    }
    Ok(EXIT_PROBLEMS_FOUND)
}
