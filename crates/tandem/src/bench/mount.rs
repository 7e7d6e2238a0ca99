//! `tandem bench mount`: the `bench meta` workload and large sequential I/O through a tandemfs
//! FUSE mount, beside ext4 on a loop device on the same medium, both driven by system calls.

use super::ext4::Ext4Volume;
use super::meta::{fresh_volume, inode_count, print_comparison, Column};
use super::passthrough::Passthrough;
use super::system::SystemTarget;
use super::table::print_table;
use super::workload::{measure, Operation, WorkloadSize};
use crate::commands::mount::require_fuse;
use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::fuse_api::{self, MountConfig};
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

/// Seconds to write `bytes` (including the final fsync) and to read them back, medians over
/// `rounds`, and whether the page cache could be dropped between.
fn sequential(root: &Path, bytes: u64, rounds: usize) -> Result<(f64, f64, bool), String> {
    let path = root.join("sequential.dat");
    let mut buffer = vec![0u8; SEQUENTIAL_IO_BYTES];
    for (index, byte) in buffer.iter_mut().enumerate() {
        *byte = (index % 251) as u8;
    }
    let mut write_seconds = Vec::new();
    let mut read_seconds = Vec::new();
    let mut dropped_every_time = true;
    for _ in 0..rounds {
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
        dropped_every_time &= drop_caches();

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
        if read != bytes {
            return Err(format!("read back {read} bytes of {bytes}"));
        }
        std::fs::remove_file(&path).map_err(|error| format!("remove {}: {error}", path.display()))?;
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[(values.len() - 1) / 2]
    };
    Ok((median(write_seconds), median(read_seconds), dropped_every_time))
}

type Measured = (Vec<(Operation, f64)>, (f64, f64, bool));

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
    let mut target = SystemTarget::new(root)?;
    let metadata = measure(&mut target, size, rounds, label)?;
    drop(target);
    eprintln!("  {label}: sequential {} in 1 MiB requests", format_bytes(arguments.sequential_size));
    let before = checksums();
    let sequential = sequential(root, arguments.sequential_size, rounds)?;
    let after = checksums();
    if after.bytes > before.bytes {
        report_checksum_share(label, &before, &after, rounds, sequential.0 + sequential.1);
    }
    Ok((metadata, sequential))
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
) -> Result<Measured, String> {
    let options = FileDeviceOptions { create_size_bytes: Some(volume_bytes), lock_exclusive: true, read_only: false };
    let device =
        FileDevice::open(image, options).map_err(|error| format!("cannot create {}: {error}", image.display()))?;
    let fs = fresh_volume(Arc::new(device), inode_count(size))?;
    let mountpoint = std::env::temp_dir().join(format!("tandem-bench-fuse-{}", std::process::id()));
    std::fs::create_dir_all(&mountpoint).map_err(|error| format!("cannot create {}: {error}", mountpoint.display()))?;
    let config = MountConfig { volume_name: "tandem-bench".into(), threads: 4, ..Default::default() };
    let result = match fuse_api::mount_background(fs.clone(), &mountpoint, &config) {
        Ok(mut mount) => {
            let measured =
                run_workload(&mountpoint, size, arguments, "tandemfs FUSE", &|| fs.data_checksum_statistics());
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

pub fn run(arguments: MountBenchArguments) -> CliResult<i32> {
    require_fuse()?;
    let size = WorkloadSize::new(arguments.count as usize, arguments.appends as usize);
    let scratch = super::scratch_directory();
    // Room for the sequential file and, as in `bench meta`, at least 4 GiB so the operation log
    // (1/16 of the volume) holds a round of metadata work.
    let volume_bytes = (arguments.sequential_size + (2u64 << 30)).max(4 << 30).next_multiple_of(1 << 20);
    super::require_free_space(&scratch, volume_bytes, "lower --sequential-size")?;
    println!(
        "tandem bench mount: {} files, {} durable appends of each size, sequential {} in 1 MiB requests",
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

    let mut failures = Vec::new();
    let mut columns = Vec::new();
    let mut sequential_results = Vec::new();
    let image = super::ScratchFile { path: scratch.join(format!("tandem-bench-mount-{}.img", std::process::id())) };
    let result = super::contain_panic("the engine", || measure_tandemfs(&image.path, volume_bytes, size, &arguments));
    drop(image);
    match result {
        Ok((metadata, sequential)) => {
            columns.push(Column { label: "tandemfs FUSE".into(), medians: Some(metadata) });
            sequential_results.push(("tandemfs FUSE", sequential));
        }
        Err(error) => {
            failures.push(format!("tandemfs FUSE: {error}"));
            columns.push(Column { label: "tandemfs FUSE".into(), medians: None });
        }
    }
    let mut ext4_note = None;
    let mut passthrough_note = None;
    if arguments.no_ext4 {
        ext4_note = Some("ext4 skipped (--no-ext4)".to_string());
    } else if let Some(reason) = Ext4Volume::unavailable_reason() {
        ext4_note = Some(format!("ext4 skipped: {reason}"));
    } else {
        let path = scratch.join(format!("tandem-bench-ext4-{}.img", std::process::id()));
        match Ext4Volume::create(&path, volume_bytes, inode_count(size)) {
            Ok(volume) => {
                match run_workload(volume.mountpoint(), size, &arguments, "ext4", &DataChecksumStatistics::default) {
                    Ok((metadata, sequential)) => {
                        columns.push(Column { label: "ext4".into(), medians: Some(metadata) });
                        sequential_results.push(("ext4", sequential));
                    }
                    Err(error) => {
                        failures.push(format!("ext4: {error}"));
                        columns.push(Column { label: "ext4".into(), medians: None });
                    }
                }
                if arguments.no_passthrough {
                    passthrough_note = Some("passthrough_ll skipped (--no-passthrough)".to_string());
                } else if let Some(reason) = Passthrough::unavailable_reason() {
                    passthrough_note = Some(format!("passthrough_ll skipped: {reason}"));
                } else {
                    let allowance = Passthrough::file_allowance(arguments.count);
                    // Where the open-file limit holds fewer files than --count, the column runs
                    // the largest round that fits; per-operation times stay comparable, and a
                    // smaller directory only flatters passthrough_ll.
                    let passthrough_size = match &allowance {
                        Ok(allowance) => {
                            if let Some(why) = &allowance.reduced_because {
                                passthrough_note = Some(format!(
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
                            std::fs::create_dir(&source)
                                .map_err(|error| format!("cannot create {}: {error}", source.display()))
                        })
                        .and_then(|_| Passthrough::start(&source))
                        .and_then(|passthrough| {
                            run_workload(
                                passthrough.mountpoint(),
                                passthrough_size,
                                &arguments,
                                PASSTHROUGH,
                                &DataChecksumStatistics::default,
                            )
                        });
                    match result {
                        Ok((metadata, sequential)) => {
                            columns.push(Column { label: PASSTHROUGH.into(), medians: Some(metadata) });
                            sequential_results.push((PASSTHROUGH, sequential));
                        }
                        Err(error) => {
                            failures.push(format!("{PASSTHROUGH}: {error}{}", super::passthrough::limit_hint(&error)));
                            columns.push(Column { label: PASSTHROUGH.into(), medians: None });
                        }
                    }
                }
            }
            Err(error) => {
                failures.push(format!("ext4: {error}"));
                columns.push(Column { label: "ext4".into(), medians: None });
            }
        }
    }

    println!();
    print_comparison(
        &columns,
        &[("tandemfs FUSE", "ext4", "vs ext4"), ("tandemfs FUSE", PASSTHROUGH, "vs passthrough_ll")],
        false,
    );
    if columns.iter().any(|column| column.label == PASSTHROUGH) {
        println!("(passthrough_ll: libfuse's example file system forwarding to a directory of the same ext4 volume)");
    }
    // Right under the table it qualifies (a reduced round) or explains (a skipped column).
    if let Some(note) = passthrough_note {
        println!("{note}");
    }
    println!();
    let bytes = arguments.sequential_size;
    let mut rows = Vec::new();
    for (label, (write_seconds, read_seconds, dropped)) in &sequential_results {
        rows.push(vec![
            label.to_string(),
            throughput(bytes, *write_seconds),
            throughput(bytes, *read_seconds),
            if *dropped { "dropped".into() } else { "not dropped (not allowed)".into() },
        ]);
    }
    if let Some((_, ours)) = sequential_results.iter().find(|(label, _)| *label == "tandemfs FUSE") {
        for (label, theirs) in sequential_results.iter().filter(|(label, _)| *label != "tandemfs FUSE") {
            rows.push(vec![
                format!("tandemfs vs {label}"),
                format!("{:.2}×", theirs.0 / ours.0),
                format!("{:.2}×", theirs.1 / ours.1),
                String::new(),
            ]);
        }
    }
    print_table(&["sequential", "write + fsync", "read", "page cache before read"], &rows);
    if let Some(note) = ext4_note {
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
