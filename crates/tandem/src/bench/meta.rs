//! `tandem bench meta`: metadata operations and durable small appends through the tandemfs
//! library (no kernel in the path) on a memory device and on a file in /dev/shm, beside ext4 on a
//! loop device over a file in /dev/shm, through system calls.

use super::ext4::Ext4Volume;
use super::library::LibraryTarget;
use super::peers::{self, Outcome, Shape, DM_CRYPT, GOCRYPTFS};
use super::system::SystemTarget;
use super::table::{format_rate, format_ratio, print_table};
use super::workload::{measure, Operation, WorkloadSize};
use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::size::{format_bytes, format_count, parse_nonzero_size};
use clap::{Args, ValueEnum};
use std::sync::Arc;
use tandemfs::crypt::{self, KdfCost, Secret};
use tandemfs::device::{Device, FileDevice, FileDeviceOptions, MemoryDevice};
use tandemfs::fs::{FormatOptions, MountOptions};
use tandemfs::FileSystem;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    Memory,
    File,
    All,
}

#[derive(Args)]
pub struct MetaArguments {
    /// Files created, looked up and removed per round, in one directory and again in a tree
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    pub count: u64,
    /// Durable appends per round for each size (256 B and 4 KiB)
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub appends: u64,
    /// Which tandemfs devices to measure
    #[arg(long, value_enum, default_value_t = DeviceChoice::All)]
    pub device: DeviceChoice,
    /// Skip ext4 (it needs root, loop devices and e2fsprogs)
    #[arg(long)]
    pub no_ext4: bool,
    /// Measured rounds after the warm-up; the median is reported
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=15))]
    pub rounds: u64,
    /// Volume size for every file system; the default leaves the operation log (1/16 of the
    /// volume) room for 100,000 creates between checkpoints
    #[arg(long, value_parser = parse_nonzero_size, default_value = "4G")]
    pub size: u64,
    /// Thread scaling instead: create, stat and unlink with each of these thread counts
    /// (e.g. 1,2,4,8,16), each thread in its own directory and then all in one shared directory
    #[arg(long, value_parser = super::scaling::parse_threads)]
    pub threads: Option<Threads>,
    /// With --threads: files each thread creates, stats and unlinks per round
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub files_per_thread: u64,
    /// With --threads: how many times each thread stats each of its files (the stat rate is per
    /// pass; more passes make a phase of 20,000 files long enough to measure steadily)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub stat_passes: u64,
    /// With --threads: which layouts to measure (each thread in its own directory, all threads
    /// in one shared directory, or both)
    #[arg(long, value_enum, default_value_t = LayoutChoice::Both)]
    pub layout: LayoutChoice,
    /// With --threads: the back end's apply workers (0: half the cores, at least 2, as a mount takes)
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=64))]
    pub backend_workers: u64,
    /// With --threads: how many image logs' worth of changes may wait to be applied (the mount
    /// option backlog_image_logs; default 64)
    #[arg(long, default_value_t = tandemfs::log::BACKLOG_CHECKPOINTS, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub backlog_image_logs: u64,
    /// With --threads: also print every round's rates as it ends, the warm-up's included (the
    /// table shows medians, which hide a slowdown that grows with the back end's backlog)
    #[arg(long)]
    pub each_round: bool,
    /// With --threads: inodes of both file systems (default: every round's files and one round
    /// more); a smaller table measures creates in a nearly full one
    #[arg(long, value_parser = clap::value_parser!(u64).range(1024..=1_000_000_000))]
    pub inode_count: Option<u64>,
    /// Also measure encrypted tandemfs volumes, beside ext4 on dm-crypt (LUKS2, AES-XTS) and
    /// gocryptfs over ext4 through system calls
    #[arg(long, conflicts_with = "threads")]
    pub encrypt: bool,
    /// With --encrypt: skip ext4 on dm-crypt (it needs root, cryptsetup and the kernel's dm-crypt)
    #[arg(long)]
    pub no_dm_crypt: bool,
    /// With --encrypt: skip gocryptfs (it needs the gocryptfs package and what ext4 needs)
    #[arg(long)]
    pub no_gocryptfs: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LayoutChoice {
    Private,
    Shared,
    Both,
}

/// A list of thread counts (its own type, so that clap takes the list as one value).
pub type Threads = Vec<usize>;

/// One measured column of the table.
pub struct Column {
    pub label: String,
    pub medians: Option<Vec<(Operation, f64)>>,
}

impl Column {
    pub fn seconds(&self, operation: Operation) -> Option<f64> {
        self.medians.as_ref()?.iter().find(|(measured, _)| *measured == operation).map(|(_, seconds)| *seconds)
    }
}

/// Inodes for a run: every file and directory of a round, twice over for slack.
pub fn inode_count(size: WorkloadSize) -> u64 {
    (size.files as u64 + size.tree_directories as u64 + 16) * 2 + 1024
}

/// Whether a benchmark's tandemfs volume is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encryption {
    Plain,
    /// AES-256-XTS under a fixed passphrase, its key slot at the cheapest Argon2id cost: the
    /// volume is unlocked once, before any timing, and unlocking is not what is measured.
    Encrypted,
}

/// Formats and mounts tandemfs on `device`.
pub fn fresh_volume(device: Arc<dyn Device>, inodes: u64, encryption: Encryption) -> Result<FileSystem, String> {
    fresh_volume_with(device, inodes, encryption, MountOptions::default())
}

/// `fresh_volume` mounted with `mount_options` (its key is the benchmark's own).
pub fn fresh_volume_with(
    device: Arc<dyn Device>,
    inodes: u64,
    encryption: Encryption,
    mount_options: MountOptions,
) -> Result<FileSystem, String> {
    let key = match encryption {
        Encryption::Plain => None,
        Encryption::Encrypted => Some(
            Secret::from_passphrase("tandem bench".into()).map_err(|error| format!("benchmark passphrase: {error}"))?,
        ),
    };
    let options = FormatOptions {
        inode_count: Some(inodes),
        encryption: key.clone().map(|secret| crypt::Encryption { secret, cost: KdfCost::for_tests() }),
        ..Default::default()
    };
    FileSystem::format(device.clone(), &options).map_err(|error| format!("mkfs: {error}"))?;
    let mount_options = MountOptions { key, ..mount_options };
    let (fs, _) = FileSystem::mount(device, &mount_options).map_err(|error| format!("mount: {error}"))?;
    Ok(fs)
}

fn measure_library(
    device: Arc<dyn Device>,
    size: WorkloadSize,
    rounds: usize,
    label: &str,
    encryption: Encryption,
) -> Result<Vec<(Operation, f64)>, String> {
    let fs = fresh_volume(device, inode_count(size), encryption)?;
    let mut target = LibraryTarget::new(fs.clone());
    let measured = measure(&mut target, size, rounds, label);
    let closed = fs.unmount().map_err(|error| format!("unmount: {error}"));
    let measured = measured?;
    closed?;
    Ok(measured)
}

pub fn run(arguments: MetaArguments) -> CliResult<i32> {
    if let Some(threads) = arguments.threads.clone() {
        return run_scaling(&arguments, threads);
    }
    let size = WorkloadSize::new(arguments.count as usize, arguments.appends as usize);
    let rounds = arguments.rounds as usize;
    let scratch = super::scratch_directory();
    let volume_bytes = arguments.size;
    super::require_free_space(&scratch, volume_bytes, "lower --size")?;
    println!(
        "tandem bench meta: {} files ({} in one directory, then {} directories of {}), {} durable appends of each size",
        format_count(size.files as u64),
        format_count(size.files as u64),
        size.tree_directories,
        format_count((size.files / size.tree_directories) as u64),
        format_count(size.appends as u64)
    );
    println!(
        "volumes of {}; medium {}; warm-up then median of {rounds} round{}",
        format_bytes(volume_bytes),
        scratch.display(),
        if rounds == 1 { "" } else { "s" }
    );

    let mut columns = Vec::new();
    let mut failures = Vec::new();
    let mut record =
        |label: &str, result: Result<Vec<(Operation, f64)>, String>, columns: &mut Vec<Column>| match result {
            Ok(medians) => columns.push(Column { label: label.to_string(), medians: Some(medians) }),
            Err(error) => {
                failures.push(format!("{label}: {error}"));
                columns.push(Column { label: label.to_string(), medians: None });
            }
        };

    let encryptions: &[Encryption] =
        if arguments.encrypt { &[Encryption::Plain, Encryption::Encrypted] } else { &[Encryption::Plain] };
    for &encryption in encryptions {
        if matches!(arguments.device, DeviceChoice::Memory | DeviceChoice::All) {
            let label = library_label("memory", encryption);
            let result = super::contain_panic("the engine", || {
                let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(volume_bytes));
                measure_library(device, size, rounds, &label, encryption)
            });
            record(&label, result, &mut columns);
        }
        if matches!(arguments.device, DeviceChoice::File | DeviceChoice::All) {
            let label = library_label("file", encryption);
            let image =
                super::ScratchFile { path: scratch.join(format!("tandem-bench-meta-{}.img", std::process::id())) };
            let options =
                FileDeviceOptions { create_size_bytes: Some(volume_bytes), lock_exclusive: true, read_only: false };
            let result = super::contain_panic("the engine", || {
                let device = FileDevice::open(&image.path, options)
                    .map_err(|error| format!("cannot create {}: {error}", image.path.display()))?;
                measure_library(Arc::new(device), size, rounds, &label, encryption)
            });
            drop(image);
            record(&label, result, &mut columns);
        }
    }
    let mut notes = Vec::new();
    if arguments.no_ext4 {
        notes.push("ext4 skipped (--no-ext4)".to_string());
    } else if let Some(reason) = Ext4Volume::unavailable_reason() {
        notes.push(format!("ext4 skipped: {reason}"));
    } else {
        let path = scratch.join(format!("tandem-bench-ext4-{}.img", std::process::id()));
        let result = Ext4Volume::create(&path, volume_bytes, inode_count(size))
            .and_then(|volume| measure_system(volume.mountpoint(), size, rounds, "ext4"));
        record("ext4", result, &mut columns);
    }
    if arguments.encrypt {
        let shape = Shape { scratch: &scratch, volume_bytes, inode_count: inode_count(size) };
        for (label, outcome) in [
            (
                DM_CRYPT,
                peers::on_dm_crypt(shape, arguments.no_dm_crypt, |root| measure_system(root, size, rounds, DM_CRYPT)),
            ),
            (
                GOCRYPTFS,
                peers::on_gocryptfs(shape, arguments.no_gocryptfs, |root| {
                    measure_system(root, size, rounds, GOCRYPTFS)
                }),
            ),
        ] {
            match outcome {
                Outcome::Skipped(line) => notes.push(line),
                Outcome::Ran(result) => record(label, result, &mut columns),
            }
        }
    }

    println!();
    if arguments.encrypt {
        // The target for encrypted volumes: at least 3× gocryptfs on every row.
        let base = if arguments.device == DeviceChoice::Memory { "memory" } else { "file" };
        let (encrypted, plain) = (library_label(base, Encryption::Encrypted), library_label(base, Encryption::Plain));
        print_comparison(
            &columns,
            &[
                (&encrypted, GOCRYPTFS, "vs gocryptfs"),
                (&encrypted, DM_CRYPT, "vs dm-crypt"),
                (&encrypted, &plain, "vs plain"),
                (DM_CRYPT, "ext4", "dm-crypt vs ext4"),
            ],
            Some(|_| Some(3.0)),
        );
        println!("(\"vs\" columns: {encrypted} against the others; the key slot's Argon2id at its cheapest, unlocking untimed)");
    } else {
        print_comparison(
            &columns,
            &[("tandemfs file", "ext4", "file vs ext4"), ("tandemfs memory", "ext4", "memory vs ext4")],
            Some(Operation::target_ratio),
        );
    }
    for note in notes {
        println!("{note}");
    }
    if failures.is_empty() {
        Ok(EXIT_SUCCESS)
    } else {
        for failure in &failures {
            eprintln!("tandem: {failure}");
        }
        Err(CliError::new(format!("{} of the measurements failed (see above)", failures.len())))
    }
}

/// "tandemfs file", "tandemfs encrypted file".
fn library_label(device: &str, encryption: Encryption) -> String {
    match encryption {
        Encryption::Plain => format!("tandemfs {device}"),
        Encryption::Encrypted => format!("tandemfs encrypted {device}"),
    }
}

/// The workload through system calls on a mounted kernel or FUSE file system at `root`.
fn measure_system(
    root: &std::path::Path,
    size: WorkloadSize,
    rounds: usize,
    label: &str,
) -> Result<Vec<(Operation, f64)>, String> {
    let mut target = SystemTarget::new(root)?;
    measure(&mut target, size, rounds, label)
}

fn run_scaling(arguments: &MetaArguments, threads: Threads) -> CliResult<i32> {
    let scratch = super::scratch_directory();
    super::require_free_space(&scratch, arguments.size * 2, "lower --size")?;
    let with_ext4 = if arguments.no_ext4 {
        false
    } else if let Some(reason) = Ext4Volume::unavailable_reason() {
        println!("ext4 skipped: {reason}");
        false
    } else {
        true
    };
    let run = super::scaling::ScalingRun {
        threads,
        layouts: match arguments.layout {
            LayoutChoice::Private => vec![super::scaling::Layout::Private],
            LayoutChoice::Shared => vec![super::scaling::Layout::Shared],
            LayoutChoice::Both => vec![super::scaling::Layout::Private, super::scaling::Layout::Shared],
        },
        files_per_thread: arguments.files_per_thread,
        stat_passes: arguments.stat_passes,
        backend_workers: arguments.backend_workers as usize,
        backlog_image_logs: arguments.backlog_image_logs,
        rounds: arguments.rounds as usize,
        each_round: arguments.each_round,
        inode_count: arguments.inode_count,
        volume_bytes: arguments.size,
        scratch,
        with_ext4,
    };
    super::contain_panic("the engine", || run.run()).map_err(CliError::new)?;
    Ok(EXIT_SUCCESS)
}

/// The speed-up over a peer that the project aims for per operation, where it set one.
pub type TargetRatio = fn(Operation) -> Option<f64>;

/// Prints every column, then each (ours, theirs, header) pair as a speed-up of ours over theirs;
/// with `targets`, the first pair also gets the project's target beside it.
pub fn print_comparison(columns: &[Column], comparisons: &[(&str, &str, &str)], targets: Option<TargetRatio>) {
    let measured = |label: &str| columns.iter().find(|column| column.label == label && column.medians.is_some());
    let pairs: Vec<(&Column, &Column, &str)> = comparisons
        .iter()
        .filter_map(|(ours, theirs, header)| Some((measured(ours)?, measured(theirs)?, *header)))
        .collect();
    // Targets belong to the first comparison only; without it measured there are none to show.
    let with_target = targets.is_some()
        && comparisons.first().is_some_and(|(ours, theirs, _)| {
            pairs
                .first()
                .is_some_and(|(first_ours, first_theirs, _)| first_ours.label == *ours && first_theirs.label == *theirs)
        });
    let mut headers: Vec<String> = vec!["operation".into()];
    headers.extend(columns.iter().map(|column| column.label.clone()));
    for (index, (_, _, header)) in pairs.iter().enumerate() {
        headers.push(header.to_string());
        if index == 0 && with_target {
            headers.push("target".into());
        }
    }
    let mut rows = Vec::new();
    for operation in Operation::ALL {
        let mut row = vec![operation.label().to_string()];
        for column in columns {
            row.push(match (&column.medians, column.seconds(operation)) {
                (None, _) => "failed".into(),
                (Some(_), Some(seconds)) => format_rate(seconds),
                (Some(_), None) => "-".into(),
            });
        }
        for (index, (ours, theirs, _)) in pairs.iter().enumerate() {
            let (ours_seconds, theirs_seconds) =
                (ours.seconds(operation).unwrap_or(0.0), theirs.seconds(operation).unwrap_or(0.0));
            row.push(format_ratio(ours_seconds, theirs_seconds));
            if index == 0 && with_target {
                row.push(match targets.and_then(|target_ratio| target_ratio(operation)) {
                    Some(target) if ours_seconds > 0.0 && theirs_seconds > 0.0 => {
                        let met = theirs_seconds / ours_seconds >= target;
                        format!("≥{target}× {}", if met { "met" } else { "missed" })
                    }
                    Some(target) => format!("≥{target}×"),
                    None => String::new(),
                });
            }
        }
        rows.push(row);
    }
    let header_references: Vec<&str> = headers.iter().map(String::as_str).collect();
    print_table(&header_references, &rows);
}
