//! `tandem bench mount`: the `bench meta` workload and large sequential I/O through a tandemfs
//! FUSE mount, beside ext4 on a loop device on the same medium, both driven by system calls.

use super::cpu::CpuMeter;
use super::ext4::Ext4Volume;
use super::meta::{fresh_volume_with, inode_count, print_comparison, Column, Encryption, TargetRatio};
use super::passthrough::Passthrough;
use super::peers::{self, Outcome, Shape, DM_CRYPT, GOCRYPTFS};
use super::system::SystemTarget;
use super::table::print_table;
use super::workload::{measure, Operation, WorkloadSize};
use crate::commands::mount::require_fuse;
use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::fuse_api::{self, FuseTransport, MountConfig};
use crate::size::{format_bytes, format_count, parse_nonzero_size};
use clap::Args;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tandemfs::block::volume::DataChecksumStatistics;
use tandemfs::device::{FileDevice, FileDeviceOptions};

/// Column label of libfuse's passthrough example over ext4.
const PASSTHROUGH: &str = "passthrough_ll";

/// Size of every read and write of the sequential test.
const SEQUENTIAL_IO_BYTES: usize = 1 << 20;

#[derive(Args)]
pub struct MountBenchArguments {
    /// Files created, looked up and removed per round, in one directory and again in a tree
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    pub count: u64,
    /// Durable appends per round for each size (256 B and 4 KiB)
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub appends: u64,
    /// Bytes written and then read back sequentially in 1 MiB requests
    #[arg(long, value_parser = parse_nonzero_size, default_value = "2G")]
    pub sequential_size: u64,
    /// Skip ext4 (it needs root, loop devices and e2fsprogs); skips the passthrough too
    #[arg(long)]
    pub no_ext4: bool,
    /// Skip libfuse's passthrough_ll example over ext4 (built from libfuse3-dev's examples)
    #[arg(long)]
    pub no_passthrough: bool,
    /// Measured rounds after the warm-up; the median is reported
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=15))]
    pub rounds: u64,
    /// Also measure an encrypted tandemfs volume, beside ext4 on dm-crypt (LUKS2, AES-XTS) and
    /// gocryptfs over ext4; the passthrough_ll column is left out
    #[arg(long)]
    pub encrypt: bool,
    /// With --encrypt: skip ext4 on dm-crypt (it needs root, cryptsetup and the kernel's dm-crypt)
    #[arg(long)]
    pub no_dm_crypt: bool,
    /// With --encrypt: skip gocryptfs (it needs the gocryptfs package and what ext4 needs)
    #[arg(long)]
    pub no_gocryptfs: bool,
    /// FUSE worker threads serving the tandemfs mount (`tandem mount -o threads=N`)
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..=64))]
    pub fuse_threads: u64,
    /// Over /dev/fuse, one worker polls for this many microseconds after each request instead
    /// of sleeping (`tandem mount -o poll_us=N`; 0: none; unset: the mount's default, 50 on
    /// machines of 8 cores or more, else 0)
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub fuse_poll_us: Option<u64>,
    /// Read-ahead of the tandemfs mount in KiB (`tandem mount -o read_ahead_kb=N`; 0: the
    /// kernel's 128; unset: the mount's default)
    #[arg(long, value_name = "KIB", value_parser = clap::value_parser!(u32).range(0..=65_536))]
    pub fuse_read_ahead_kib: Option<u32>,
    /// Over io_uring, reads of at least this many bytes are served off the caller's
    /// CPU (`tandem mount -o uring_move_min_bytes=N`; 0: never; unset: the mount's default)
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(0..=1_048_576))]
    pub fuse_uring_move_min_bytes: Option<u64>,
    /// io_uring entries (each with its own thread) per CPU queue (at least 2; unset: the
    /// mount's default)
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=64))]
    pub fuse_uring_entries: Option<u64>,
    /// Transports to measure tandemfs over: both (a /dev/fuse column and, where the kernel
    /// allows it, an io_uring one), dev-fuse, uring or auto (`tandem mount -o transport=`)
    #[arg(long, default_value = "both")]
    pub fuse_transport: String,
    /// Writes of at least this many bytes go straight home, not through the log (`tandem mount
    /// -o direct_write_min_bytes=`; 0: every write through the log; default: the library's)
    #[arg(long, value_name = "BYTES")]
    pub direct_write_min_bytes: Option<u64>,
    /// Direct writes of at least this many bytes compute their checksums and pending copy on a
    /// second thread while their bytes go home (`tandem mount -o
    /// direct_write_overlap_min_bytes=`; 0: never, the library's default)
    #[arg(long, value_name = "BYTES")]
    pub direct_write_overlap_min_bytes: Option<u64>,
}

/// Empties the kernel's page cache so reads come from the file system, not from memory the
/// write left behind. Needs root; returns false where it is not allowed.
pub fn drop_caches() -> bool {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .and_then(|mut file| file.write_all(b"3\n"))
        .is_ok()
}

/// What the sequential rounds measured: medians of the round times, and the machine's CPU time
/// per GiB moved over all rounds (see cpu.rs for why the whole machine).
#[derive(Debug, Clone, Copy)]
pub struct SequentialResult {
    pub write_seconds: f64,
    pub read_seconds: f64,
    /// Whether the page cache could be dropped before every read.
    pub dropped_every_time: bool,
    pub write_cpu_seconds_per_gib: Option<f64>,
    pub read_cpu_seconds_per_gib: Option<f64>,
}

/// Writes `bytes` (including the final fsync) and reads them back, `rounds` times.
fn sequential(root: &Path, bytes: u64, rounds: usize) -> Result<SequentialResult, String> {
    let path = root.join("sequential.dat");
    let mut buffer = vec![0u8; SEQUENTIAL_IO_BYTES];
    for (index, byte) in buffer.iter_mut().enumerate() {
        *byte = (index % 251) as u8;
    }
    let mut write_seconds = Vec::new();
    let mut read_seconds = Vec::new();
    let mut write_cpu = CpuMeter::default();
    let mut read_cpu = CpuMeter::default();
    let mut dropped_every_time = true;
    for _ in 0..rounds {
        write_cpu.start();
        let started = Instant::now();
        let mut file = std::fs::File::create(&path).map_err(|error| format!("create {}: {error}", path.display()))?;
        let mut written = 0u64;
        while written < bytes {
            crate::interrupt::check()?;
            let length = (bytes - written).min(SEQUENTIAL_IO_BYTES as u64) as usize;
            file.write_all(&buffer[..length]).map_err(|error| format!("write at {written}: {error}"))?;
            written += length as u64;
        }
        file.sync_all().map_err(|error| format!("fsync: {error}"))?;
        drop(file);
        write_seconds.push(started.elapsed().as_secs_f64());
        write_cpu.stop();
        dropped_every_time &= drop_caches();

        read_cpu.start();
        let started = Instant::now();
        let mut file = std::fs::File::open(&path).map_err(|error| format!("open {}: {error}", path.display()))?;
        let mut read = 0u64;
        loop {
            let count = file.read(&mut buffer).map_err(|error| format!("read at {read}: {error}"))?;
            if count == 0 {
                break;
            }
            read += count as u64;
        }
        read_seconds.push(started.elapsed().as_secs_f64());
        read_cpu.stop();
        if read != bytes {
            return Err(format!("read back {read} bytes of {bytes}"));
        }
        std::fs::remove_file(&path).map_err(|error| format!("remove {}: {error}", path.display()))?;
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[(values.len() - 1) / 2]
    };
    let moved_bytes = bytes * rounds as u64;
    Ok(SequentialResult {
        write_seconds: median(write_seconds),
        read_seconds: median(read_seconds),
        dropped_every_time,
        write_cpu_seconds_per_gib: write_cpu.seconds_per_gib(moved_bytes),
        read_cpu_seconds_per_gib: read_cpu.seconds_per_gib(moved_bytes),
    })
}

type Measured = (Vec<(Operation, f64)>, SequentialResult);

/// The data checksum statistics of the tandemfs volume under the mount, for the run that has
/// one.
type ChecksumProbe<'a> = &'a dyn Fn() -> DataChecksumStatistics;

fn run_workload(
    root: &Path,
    size: WorkloadSize,
    arguments: &MountBenchArguments,
    label: &str,
    checksums: ChecksumProbe<'_>,
) -> Result<Measured, String> {
    let rounds = arguments.rounds as usize;
    let xts_before = xts_engine_bytes();
    let mut target = SystemTarget::new(root)?;
    let metadata = measure(&mut target, size, rounds, label)?;
    drop(target);
    eprintln!("  {label}: sequential {} in 1 MiB requests", format_bytes(arguments.sequential_size));
    let before = checksums();
    let sequential = sequential(root, arguments.sequential_size, rounds)?;
    let after = checksums();
    if after.bytes > before.bytes {
        report_checksum_share(label, &before, &after, rounds, sequential.write_seconds + sequential.read_seconds);
    }
    report_xts_engines(label, xts_before, xts_engine_bytes());
    Ok((metadata, sequential))
}

/// AES-XTS bytes the volumes' shared accelerator runtime ran on its CPU and its GPU engine.
fn xts_engine_bytes() -> (u64, u64) {
    tandemfs::block::volume::default_accelerator().engine_bytes(tandem_accel::runtime::Service::Xts)
}

/// Says where an encrypted volume's cipher work ran (the runtime's calibration decides), so
/// that a GPU host's numbers say whether the GPU did it.
fn report_xts_engines(label: &str, before: (u64, u64), after: (u64, u64)) {
    let (cpu_bytes, gpu_bytes) = (after.0 - before.0, after.1 - before.1);
    if cpu_bytes + gpu_bytes > 0 {
        eprintln!(
            "  {label}: AES-XTS {} on the CPU engine, {} on the GPU engine",
            format_bytes(cpu_bytes),
            format_bytes(gpu_bytes)
        );
    }
}

/// Every data block written to or read from the device through tandemfs is checksummed
/// (CRC32C through the accelerator runtime, in line on the back end's writes and on reads):
/// says how long that took during the sequential rounds against their time (rounds × the
/// median round), which bounds what checksums cost the throughput. No switch turns them off.
fn report_checksum_share(
    label: &str,
    before: &DataChecksumStatistics,
    after: &DataChecksumStatistics,
    rounds: usize,
    median_round_seconds: f64,
) {
    let seconds = (after.nanoseconds - before.nanoseconds) as f64 / 1e9;
    let total_seconds = median_round_seconds * rounds as f64;
    eprintln!(
        "  {label}: data checksums {} in {} batches took {seconds:.3} s, about {:.1}% of the sequential rounds' {total_seconds:.2} s",
        format_bytes(after.bytes - before.bytes),
        after.batches - before.batches,
        if total_seconds > 0.0 { 100.0 * seconds / total_seconds } else { 0.0 }
    );
}

fn measure_tandemfs(
    image: &Path,
    volume_bytes: u64,
    size: WorkloadSize,
    arguments: &MountBenchArguments,
    (label, encryption, transport): (&'static str, Encryption, FuseTransport),
) -> Result<Measured, String> {
    let options = FileDeviceOptions { create_size_bytes: Some(volume_bytes), lock_exclusive: true, read_only: false };
    let device =
        FileDevice::open(image, options).map_err(|error| format!("cannot create {}: {error}", image.display()))?;
    let mut mount_options = tandemfs::fs::MountOptions::default();
    if let Some(threshold) = arguments.direct_write_min_bytes {
        mount_options.direct_write_min_bytes = threshold;
    }
    if let Some(threshold) = arguments.direct_write_overlap_min_bytes {
        mount_options.direct_write_overlap_min_bytes = threshold;
    }
    eprintln!(
        "  {label}: direct writes of {} bytes or more overlap their checksums with the home write (0: none)",
        mount_options.direct_write_overlap_min_bytes
    );
    eprintln!("  {label}: writes of {} bytes or more go straight home (0: none)", mount_options.direct_write_min_bytes);
    let fs = fresh_volume_with(Arc::new(device), inode_count(size), encryption, mount_options)?;
    let mountpoint = std::env::temp_dir().join(format!("tandem-bench-fuse-{}", std::process::id()));
    std::fs::create_dir_all(&mountpoint).map_err(|error| format!("cannot create {}: {error}", mountpoint.display()))?;
    let defaults = MountConfig::default();
    let config = MountConfig {
        volume_name: "tandem-bench".into(),
        threads: arguments.fuse_threads as usize,
        transport,
        poll_microseconds: arguments.fuse_poll_us.unwrap_or(defaults.poll_microseconds),
        read_ahead_kib: arguments.fuse_read_ahead_kib.unwrap_or(defaults.read_ahead_kib),
        uring_move_min_bytes: arguments
            .fuse_uring_move_min_bytes
            .map_or(defaults.uring_move_min_bytes, |bytes| bytes as usize),
        uring_entries_per_queue: arguments
            .fuse_uring_entries
            .map_or(defaults.uring_entries_per_queue, |entries| entries as usize),
        ..defaults
    };
    eprintln!("  {label}: read-ahead {} KiB (0: the kernel's 128)", config.read_ahead_kib);
    let result = match fuse_api::mount_background(fs.clone(), &mountpoint, &config) {
        Ok(mut mount) => {
            eprintln!("  {label}: FUSE transport {}", mount.transport());
            let measured = run_workload(&mountpoint, size, arguments, label, &|| fs.data_checksum_statistics())
                .and_then(|measured| {
                    eprintln!("  {label}: at most {} READs served at once", mount.reads_at_once_most());
                    if let Some(reads) = mount.uring_reads() {
                        eprintln!(
                            "  {label}: io_uring READs {}, {} with the thread free to leave the caller's CPU, {} served off it",
                            reads.reads, reads.moved, reads.served_elsewhere
                        );
                    }
                    let requests = super::requests::probe(&mountpoint, &mount)?;
                    for line in super::requests::describe(&requests) {
                        eprintln!("  {label}: FUSE requests per {line}");
                    }
                    Ok(measured)
                });
            let unmounted = mount.unmount().map_err(|error| format!("unmount: {error}"));
            measured.and_then(|measured| unmounted.map(|_| measured))
        }
        Err(error) => Err(format!("cannot mount with FUSE: {error}")),
    };
    let closed = fs.unmount().map_err(|error| format!("close volume: {error}"));
    let _ = std::fs::remove_dir(&mountpoint);
    let measured = result?;
    closed?;
    Ok(measured)
}

fn throughput(bytes: u64, seconds: f64) -> String {
    if seconds <= 0.0 {
        return "-".into();
    }
    format!("{} MiB/s", format_count((bytes as f64 / seconds / (1u64 << 20) as f64).round() as u64))
}

/// Column labels.
const TANDEMFS: &str = "tandemfs FUSE";
const URING: &str = "tandemfs FUSE io_uring";
const ENCRYPTED: &str = "tandemfs FUSE encrypted";
const EXT4: &str = "ext4";

/// Every column measured or failed, in the order they ran, and the lines to print under the
/// tables about columns that were skipped or cut down.
#[derive(Default)]
struct Results {
    columns: Vec<Column>,
    sequential: Vec<(&'static str, SequentialResult)>,
    failures: Vec<String>,
    notes: Vec<String>,
}

impl Results {
    fn record(&mut self, label: &'static str, result: Result<Measured, String>) {
        match result {
            Ok((metadata, sequential)) => {
                self.columns.push(Column { label: label.into(), medians: Some(metadata) });
                self.sequential.push((label, sequential));
            }
            Err(error) => {
                self.failures.push(format!("{label}: {error}"));
                self.columns.push(Column { label: label.into(), medians: None });
            }
        }
    }

    fn sequential_of(&self, label: &str) -> Option<&SequentialResult> {
        self.sequential.iter().find(|(measured, _)| *measured == label).map(|(_, result)| result)
    }
}

pub fn run(arguments: MountBenchArguments) -> CliResult<i32> {
    require_fuse()?;
    let size = WorkloadSize::new(arguments.count as usize, arguments.appends as usize);
    let scratch = super::scratch_directory();
    // Room for the sequential file and, as in `bench meta`, at least 4 GiB so the operation log
    // (1/16 of the volume) holds a round of metadata work.
    let volume_bytes = (arguments.sequential_size + (2u64 << 30)).max(4 << 30).next_multiple_of(1 << 20);
    super::require_free_space(&scratch, volume_bytes, "lower --sequential-size")?;
    println!(
        "tandem bench mount{}: {} files, {} durable appends of each size, sequential {} in 1 MiB requests",
        if arguments.encrypt { " --encrypt" } else { "" },
        format_count(size.files as u64),
        format_count(size.appends as u64),
        format_bytes(arguments.sequential_size)
    );
    println!(
        "volumes of {} on {}; warm-up then median of {} round{}",
        format_bytes(volume_bytes),
        scratch.display(),
        arguments.rounds,
        if arguments.rounds == 1 { "" } else { "s" }
    );

    let mut results = Results::default();
    if let Some(note) = super::cpu::background_note() {
        results.notes.push(note);
    }
    for column in tandemfs_columns(&arguments, &mut results)? {
        let image = super::ScratchFile { path: scratch.join(format!("tandem-bench-mount-{}.img", std::process::id())) };
        let label = column.0;
        let result = super::contain_panic("the engine", || {
            measure_tandemfs(&image.path, volume_bytes, size, &arguments, column)
        });
        drop(image);
        results.record(label, result);
    }
    measure_ext4_and_passthrough(&mut results, &scratch, volume_bytes, size, &arguments);
    if arguments.encrypt {
        let shape = Shape { scratch: &scratch, volume_bytes, inode_count: inode_count(size) };
        measure_encrypted_peers(&mut results, shape, size, &arguments);
    }
    print_results(&results, &arguments);
    if results.failures.is_empty() {
        Ok(EXIT_SUCCESS)
    } else {
        for failure in &results.failures {
            eprintln!("tandem: {failure}");
        }
        Err(CliError::new(format!("{} of the measurements failed (see above)", results.failures.len())))
    }
}

/// The tandemfs columns to measure: label, encryption and transport. `--fuse-transport both`
/// gives a /dev/fuse column and an io_uring one, or a note saying why io_uring is skipped.
fn tandemfs_columns(
    arguments: &MountBenchArguments,
    results: &mut Results,
) -> CliResult<Vec<(&'static str, Encryption, FuseTransport)>> {
    let (plain_transport, uring_too) = match arguments.fuse_transport.as_str() {
        "both" => (FuseTransport::DevFuse, true),
        other => {
            (other.parse::<FuseTransport>().map_err(|why| CliError::new(format!("--fuse-transport: {why}")))?, false)
        }
    };
    let mut columns = vec![(TANDEMFS, Encryption::Plain, plain_transport)];
    if uring_too {
        match fuse_api::uring_availability() {
            Ok(()) => columns.push((URING, Encryption::Plain, FuseTransport::Uring)),
            Err(why) => results.notes.push(format!("{URING}: skipped: {why}")),
        }
    }
    if arguments.encrypt {
        columns.push((ENCRYPTED, Encryption::Encrypted, plain_transport));
    }
    Ok(columns)
}

/// ext4 on a loop device and, on a directory of that same volume, libfuse's passthrough_ll.
fn measure_ext4_and_passthrough(
    results: &mut Results,
    scratch: &Path,
    volume_bytes: u64,
    size: WorkloadSize,
    arguments: &MountBenchArguments,
) {
    if arguments.no_ext4 {
        results.notes.push("ext4 skipped (--no-ext4)".to_string());
        return;
    }
    if let Some(reason) = Ext4Volume::unavailable_reason() {
        results.notes.push(format!("ext4 skipped: {reason}"));
        return;
    }
    // Nothing new is set up once Ctrl-C asked the run to end.
    if let Err(error) = crate::interrupt::check() {
        results.record(EXT4, Err(error));
        return;
    }
    let path = scratch.join(format!("tandem-bench-ext4-{}.img", std::process::id()));
    let volume = match Ext4Volume::create(&path, volume_bytes, inode_count(size)) {
        Ok(volume) => volume,
        Err(error) => {
            results.record(EXT4, Err(error));
            return;
        }
    };
    let result = run_workload(volume.mountpoint(), size, arguments, EXT4, &DataChecksumStatistics::default);
    results.record(EXT4, result);
    if arguments.no_passthrough {
        results.notes.push("passthrough_ll skipped (--no-passthrough)".to_string());
        return;
    }
    if arguments.encrypt {
        // It measures what FUSE alone costs, a question of the plain run; leaving it out keeps
        // the encrypted tables readable.
        results.notes.push("passthrough_ll not run with --encrypt (run without it for that column)".to_string());
        return;
    }
    if let Some(reason) = Passthrough::unavailable_reason() {
        results.notes.push(format!("passthrough_ll skipped: {reason}"));
        return;
    }
    let allowance = Passthrough::file_allowance(arguments.count);
    // Where the open-file limit holds fewer files than --count, the column runs the largest
    // round that fits; per-operation times stay comparable, and a smaller directory only
    // flatters passthrough_ll.
    let passthrough_size = match &allowance {
        Ok(allowance) => {
            if let Some(why) = &allowance.reduced_because {
                results.notes.push(format!(
                    "passthrough_ll ran {} files per round instead of {}: {why}",
                    format_count(allowance.files),
                    format_count(arguments.count)
                ));
            }
            WorkloadSize::new(allowance.files as usize, size.appends)
        }
        Err(_) => size,
    };
    let source = volume.mountpoint().join("passthrough-source");
    let result = allowance
        .map_err(|why| format!("cannot run with {} files: {why}", format_count(arguments.count)))
        .and_then(|_| {
            std::fs::create_dir(&source).map_err(|error| format!("cannot create {}: {error}", source.display()))
        })
        .and_then(|_| Passthrough::start(&source))
        .and_then(|passthrough| {
            run_workload(
                passthrough.mountpoint(),
                passthrough_size,
                arguments,
                PASSTHROUGH,
                &DataChecksumStatistics::default,
            )
        })
        .map_err(|error| format!("{error}{}", super::passthrough::limit_hint(&error)));
    results.record(PASSTHROUGH, result);
}

/// ext4 on dm-crypt and gocryptfs over ext4, each on its own image on the same medium.
fn measure_encrypted_peers(
    results: &mut Results,
    shape: Shape<'_>,
    size: WorkloadSize,
    arguments: &MountBenchArguments,
) {
    let run = |label: &str, root: &Path| run_workload(root, size, arguments, label, &DataChecksumStatistics::default);
    for (label, outcome) in [
        (DM_CRYPT, peers::on_dm_crypt(shape, arguments.no_dm_crypt, |root| run(DM_CRYPT, root))),
        (GOCRYPTFS, peers::on_gocryptfs(shape, arguments.no_gocryptfs, |root| run(GOCRYPTFS, root))),
    ] {
        match outcome {
            Outcome::Skipped(line) => results.notes.push(line),
            Outcome::Ran(result) => results.record(label, result),
        }
    }
}

/// Metadata comparisons, ours against theirs, and the sequential pairs with their targets.
struct Comparisons {
    metadata: Vec<(&'static str, &'static str, &'static str)>,
    metadata_target: Option<TargetRatio>,
    sequential: Vec<SequentialPair>,
}

/// Two sequential columns to compare, the row's label, and the throughput ratio the project
/// aims for, if any.
struct SequentialPair {
    ours: &'static str,
    theirs: &'static str,
    label: &'static str,
    target: Option<(f64, &'static str)>,
}

fn pair(
    ours: &'static str,
    theirs: &'static str,
    label: &'static str,
    target: Option<(f64, &'static str)>,
) -> SequentialPair {
    SequentialPair { ours, theirs, label, target }
}

fn comparisons(encrypt: bool) -> Comparisons {
    if encrypt {
        // The targets: at least 3× gocryptfs on every row; at least dm-crypt's sequential
        // throughput; no more than 10% below the plain volume (with the GPU engine).
        Comparisons {
            metadata: vec![
                (ENCRYPTED, GOCRYPTFS, "vs gocryptfs"),
                (ENCRYPTED, DM_CRYPT, "vs dm-crypt"),
                (ENCRYPTED, TANDEMFS, "vs plain"),
            ],
            metadata_target: Some(|_| Some(3.0)),
            sequential: vec![
                pair(ENCRYPTED, DM_CRYPT, "encrypted vs dm-crypt", Some((1.0, ""))),
                pair(ENCRYPTED, GOCRYPTFS, "encrypted vs gocryptfs", Some((3.0, ""))),
                pair(ENCRYPTED, TANDEMFS, "encrypted vs plain", Some((0.9, " (GPU host)"))),
                pair(DM_CRYPT, EXT4, "dm-crypt vs ext4", None),
                pair(TANDEMFS, EXT4, "tandemfs vs ext4", None),
            ],
        }
    } else {
        Comparisons {
            metadata: vec![
                (TANDEMFS, EXT4, "vs ext4"),
                (TANDEMFS, PASSTHROUGH, "vs passthrough_ll"),
                (URING, EXT4, "io_uring vs ext4"),
                (URING, TANDEMFS, "io_uring vs /dev/fuse"),
            ],
            metadata_target: None,
            sequential: vec![
                pair(TANDEMFS, EXT4, "tandemfs vs ext4", None),
                pair(TANDEMFS, PASSTHROUGH, "tandemfs vs passthrough_ll", None),
                pair(URING, EXT4, "io_uring vs ext4", None),
                pair(URING, TANDEMFS, "io_uring vs /dev/fuse", None),
            ],
        }
    }
}

/// "≥3× met": whether both the write and the read ratio reach the target.
fn target_text(target: Option<(f64, &str)>, ours: &SequentialResult, theirs: &SequentialResult) -> String {
    let Some((ratio, qualifier)) = target else { return String::new() };
    let write = theirs.write_seconds / ours.write_seconds;
    let read = theirs.read_seconds / ours.read_seconds;
    let met = write >= ratio && read >= ratio;
    format!("≥{ratio}×{qualifier} {}", if met { "met" } else { "missed" })
}

fn cpu_text(seconds_per_gib: Option<f64>) -> String {
    seconds_per_gib.map(|seconds| format!("{seconds:.2}")).unwrap_or_else(|| "-".into())
}

/// "2.10×": how many times better ours is than theirs, from a quantity where less is better.
fn times_better(ours: Option<f64>, theirs: Option<f64>) -> String {
    match (ours, theirs) {
        (Some(ours), Some(theirs)) if ours > 0.0 && theirs > 0.0 => format!("{:.2}×", theirs / ours),
        _ => "-".into(),
    }
}

fn print_results(results: &Results, arguments: &MountBenchArguments) {
    let comparisons = comparisons(arguments.encrypt);
    println!();
    print_comparison(&results.columns, &comparisons.metadata, comparisons.metadata_target);
    if results.columns.iter().any(|column| column.label == PASSTHROUGH) {
        println!("(passthrough_ll: libfuse's example file system forwarding to a directory of the same ext4 volume)");
    }
    println!();
    let bytes = arguments.sequential_size;
    let mut rows = Vec::new();
    for (label, result) in &results.sequential {
        rows.push(vec![
            label.to_string(),
            throughput(bytes, result.write_seconds),
            throughput(bytes, result.read_seconds),
            cpu_text(result.write_cpu_seconds_per_gib),
            cpu_text(result.read_cpu_seconds_per_gib),
            if result.dropped_every_time { "dropped".into() } else { "not dropped (not allowed)".into() },
            String::new(),
        ]);
    }
    for SequentialPair { ours, theirs, label, target } in &comparisons.sequential {
        let (Some(our), Some(their)) = (results.sequential_of(ours), results.sequential_of(theirs)) else { continue };
        rows.push(vec![
            label.to_string(),
            times_better(Some(our.write_seconds), Some(their.write_seconds)),
            times_better(Some(our.read_seconds), Some(their.read_seconds)),
            times_better(our.write_cpu_seconds_per_gib, their.write_cpu_seconds_per_gib),
            times_better(our.read_cpu_seconds_per_gib, their.read_cpu_seconds_per_gib),
            String::new(),
            target_text(*target, our, their),
        ]);
    }
    let with_targets = rows.iter().any(|row| !row[6].is_empty());
    let mut headers =
        vec!["sequential", "write + fsync", "read", "CPU s/GiB write", "CPU s/GiB read", "page cache before read"];
    if with_targets {
        headers.push("target");
    }
    print_table(&headers, &rows);
    println!(
        "(CPU s/GiB: busy CPU time of the whole machine from /proc/stat, user + system + interrupts, over the \
         sequential phases, per GiB written or read; it includes kernel threads and daemons, and anything \
         else running; \"vs\" rows: above 1× means the first is faster or uses less CPU)"
    );
    for note in &results.notes {
        println!("{note}");
    }
}
