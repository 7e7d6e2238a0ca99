//! `tandem bench raid`: tandemfs on a k + m array of image files (docs/RAID.md) beside Linux md
//! RAID-6 (`mdadm --level=6` over loop devices on the same medium, ext4 on top), same shape:
//! sequential write and read, random 4 KiB writes, reads with one and two members gone, and the
//! rebuild of one member; CPU seconds per GiB of the whole machine for each. tandemfs runs once
//! per stripe unit asked for, which is how the default stripe unit was chosen
//! (docs/BENCHMARKS.md). Where md cannot run it says "skipped: why" and tandemfs is measured.

use super::cpu::CpuMeter;
use super::ext4::{run_tool, tool_exists, unmount_and_remove};
use super::table::print_table;
use super::{scratch_directory, ScratchFile};
use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::image::{self, Access};
use crate::size::{format_bytes, parse_nonzero_size};
use clap::Args;
use rand::{Rng, SeedableRng};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tandemfs::device::array::{self, ArrayDevice, CreateOptions, Member};
use tandemfs::device::Device;
use tandemfs::fs::{FileType, FormatOptions, MountOptions, ROOT_INODE};
use tandemfs::FileSystem;

#[derive(Args)]
pub struct RaidBenchArguments {
    /// Members of the array (k + m)
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(3..=16))]
    pub devices: u64,
    /// Parity members (md is RAID-6: compared only with 2)
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=4))]
    pub parity: u64,
    /// Bytes of each member image
    #[arg(long, value_parser = parse_nonzero_size, default_value = "160M")]
    pub member_size: u64,
    /// Bytes of the file written and read sequentially
    #[arg(long, value_parser = parse_nonzero_size, default_value = "256M")]
    pub file_size: u64,
    /// Random 4 KiB writes into that file (one sync at the end)
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub random_writes: u64,
    /// Stripe units tandemfs is measured with, comma-separated (md uses the first as its chunk)
    #[arg(long, default_value = "16K,64K,256K")]
    pub stripe_units: String,
    /// Files created (each with 4 KiB written) after the sequential write, to see what a
    /// create-heavy workload costs the array's write path (0: none)
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    pub creates: u64,
    /// The back end's home writes as before session 16: every log flush writes them home
    /// (for comparing in one build; docs/RAID.md, *Held home writes*)
    #[arg(long)]
    pub no_held_writes: bool,
}

const IO_BYTES: usize = 1 << 20;
const BLOCK_BYTES: u64 = 4096;

/// One row of results: seconds of each phase (None: not measured).
#[derive(Default)]
struct Timings {
    write_seconds: f64,
    read_seconds: f64,
    random_seconds: f64,
    degraded_one_seconds: f64,
    degraded_two_seconds: f64,
    rebuild_seconds: f64,
    rebuild_bytes: u64,
    cpu_per_gib: Option<f64>,
    /// How the sequential write's epochs went home (tandemfs only), and the volume's writes
    /// that reached the array by region.
    write_path: Option<(array::EpochStatistics, RegionCounts)>,
    /// The same for the create-heavy phase, with its seconds.
    create_path: Option<(array::EpochStatistics, RegionCounts, f64)>,
}

pub fn run(arguments: RaidBenchArguments) -> CliResult<i32> {
    let units: Vec<u64> = arguments
        .stripe_units
        .split(',')
        .map(|text| parse_nonzero_size(text.trim()).map_err(|error| CliError::new(format!("--stripe-units: {error}"))))
        .collect::<CliResult<_>>()?;
    let (count, parity) = (arguments.devices as usize, arguments.parity as usize);
    let data_bytes = (count - parity) as u64 * (arguments.member_size.saturating_sub(array::DATA_START_BYTES));
    if arguments.file_size * 10 / 8 > data_bytes {
        return Err(CliError::new(format!(
            "a file of {} needs members of more than {} ({} data members): raise --member-size",
            format_bytes(arguments.file_size),
            format_bytes(arguments.member_size),
            count - parity
        )));
    }
    let scratch = scratch_directory();
    super::require_free_space(&scratch, (count as u64 + 1) * arguments.member_size, "lower --member-size")?;
    println!(
        "raid: {count} members ({} data + {parity} parity) of {} in {}, file {}, {} random 4 KiB writes",
        count - parity,
        format_bytes(arguments.member_size),
        scratch.display(),
        format_bytes(arguments.file_size),
        arguments.random_writes
    );
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for &unit in &units {
        let label = format!("tandemfs {}+{parity}, unit {}", count - parity, format_bytes(unit));
        match super::contain_panic(&label, || measure_tandemfs(&arguments, &scratch, unit)) {
            Ok(timings) => {
                if let Some((path, regions)) = &timings.write_path {
                    let what = format!("seq write of {}", format_bytes(arguments.file_size));
                    notes.push(write_path_note(&label, &what, path));
                    notes.extend(regions.lines(&label, &what));
                }
                if let Some((path, regions, seconds)) = &timings.create_path {
                    let what = format!(
                        "{} creates of 4 KiB files ({:.0}/s)",
                        arguments.creates,
                        arguments.creates as f64 / seconds.max(1e-9)
                    );
                    notes.push(write_path_note(&label, &what, path));
                    notes.extend(regions.lines(&label, &what));
                }
                rows.push(row(&label, &timings, arguments.file_size))
            }
            Err(error) => println!("{label}: failed: {error}"),
        }
    }
    let md_label = format!("md RAID-6 {}+2 + ext4, chunk {}", count.saturating_sub(2), format_bytes(units[0]));
    match md_unavailable_reason(parity) {
        Some(why) => println!("{md_label}: skipped: {why}"),
        None => match super::contain_panic(&md_label, || measure_md(&arguments, &scratch, units[0])) {
            Ok(timings) => rows.push(row(&md_label, &timings, arguments.file_size)),
            Err(error) => println!("{md_label}: failed: {error}"),
        },
    }
    print_table(
        &["", "seq write", "seq read", "rand 4K write", "read 1 gone", "read 2 gone", "rebuild", "CPU s/GiB"],
        &rows,
    );
    for note in notes {
        println!("{note}");
    }
    Ok(EXIT_SUCCESS)
}

/// What the sequential write cost the array: its epochs, and the chunks written whole or in
/// part (read for parity).
fn write_path_note(label: &str, what: &str, path: &array::EpochStatistics) -> String {
    format!(
        "{label}, {what}: {} epochs ({} flushed full), {} full and {} partial stripe chunks, {} read for parity, {} intent records, {} partial chunks held over log flushes",
        path.epochs,
        path.epochs_full,
        path.full_chunks,
        path.partial_chunks,
        format_bytes(path.parity_read_bytes),
        path.intent_records,
        path.held_chunks,
    )
}

fn rate(bytes: u64, seconds: f64) -> String {
    if seconds <= 0.0 {
        return "-".into();
    }
    format!("{:.0} MB/s", bytes as f64 / seconds / 1e6)
}

fn row(label: &str, timings: &Timings, file_bytes: u64) -> Vec<String> {
    vec![
        label.to_string(),
        rate(file_bytes, timings.write_seconds),
        rate(file_bytes, timings.read_seconds),
        if timings.random_seconds > 0.0 { format!("{:.0}/s", 1.0 / timings.random_seconds) } else { "-".into() },
        rate(file_bytes, timings.degraded_one_seconds),
        rate(file_bytes, timings.degraded_two_seconds),
        rate(timings.rebuild_bytes, timings.rebuild_seconds),
        timings.cpu_per_gib.map_or("-".into(), |seconds| format!("{seconds:.2}")),
    ]
}

fn make_images(scratch: &Path, tag: &str, count: usize, size_bytes: u64) -> Result<Vec<ScratchFile>, String> {
    let mut images = Vec::with_capacity(count);
    for slot in 0..count {
        let path = scratch.join(format!("tandem-bench-raid-{}-{tag}-{slot}.img", std::process::id()));
        let file = std::fs::File::create(&path).map_err(|error| format!("{}: {error}", path.display()))?;
        images.push(ScratchFile { path: path.clone() });
        file.set_len(size_bytes).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    Ok(images)
}

fn members(images: &[ScratchFile], leave_out: &[usize]) -> Result<Vec<Member>, String> {
    let mut members = Vec::new();
    for (slot, image) in images.iter().enumerate().filter(|(slot, _)| !leave_out.contains(slot)) {
        let device: Arc<dyn Device> = image::open(&image.path, Access::WRITE).map_err(|error| error.to_string())?;
        members.push(Member { name: format!("member {slot}"), device });
    }
    Ok(members)
}

fn assemble(images: &[ScratchFile], leave_out: &[usize]) -> Result<ArrayDevice, String> {
    let accelerator = tandemfs::block::volume::default_accelerator();
    array::assemble(members(images, leave_out)?, accelerator).map(|assembly| assembly.device).map_err(|e| e.to_string())
}

fn mount(device: Arc<dyn Device>) -> Result<FileSystem, String> {
    FileSystem::mount(device, &MountOptions::default()).map(|(fs, _)| fs).map_err(|error| format!("mount: {error}"))
}

/// Reads the whole file in 1 MiB requests; seconds.
fn timed_read(fs: &FileSystem, inode: tandemfs::fs::InodeNumber, file_bytes: u64) -> Result<f64, String> {
    let mut buffer = vec![0u8; IO_BYTES];
    let started = Instant::now();
    let mut offset = 0;
    while offset < file_bytes {
        let read = fs.read(inode, offset, &mut buffer).map_err(|error| format!("read: {error}"))?;
        if read == 0 {
            return Err(format!("the file ends at {offset}"));
        }
        offset += read as u64;
    }
    Ok(started.elapsed().as_secs_f64())
}

fn measure_tandemfs(arguments: &RaidBenchArguments, scratch: &Path, unit: u64) -> Result<Timings, String> {
    let (count, parity) = (arguments.devices as usize, arguments.parity as usize);
    let images = make_images(scratch, "t", count, arguments.member_size)?;
    let accelerator = tandemfs::block::volume::default_accelerator();
    let options = CreateOptions { parity_count: parity, stripe_unit_bytes: unit, initialize_parity: false };
    let created = Arc::new(array::create(members(&images, &[])?, &options, accelerator).map_err(|e| e.to_string())?);
    FileSystem::format(created.clone(), &FormatOptions::default()).map_err(|error| format!("mkfs: {error}"))?;
    created.close().map_err(|error| error.to_string())?;
    drop(created);
    let mut timings = Timings::default();
    let mut cpu = CpuMeter::default();
    let file_bytes = arguments.file_size;
    let assembled = Arc::new(assemble(&images, &[])?);
    let superblock =
        tandemfs::block::superblock::Superblock::read_best(assembled.as_ref()).map_err(|e| e.to_string())?;
    let counting = Arc::new(CountingDevice::new(assembled.clone(), &superblock, !arguments.no_held_writes));
    let device: Arc<dyn Device> = counting.clone();
    let fs = mount(device)?;
    let file = fs.create(ROOT_INODE, b"bench", FileType::Regular, 0o644, 0, 0, 0).map_err(|e| e.to_string())?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let chunk: Vec<u8> = (0..IO_BYTES).map(|_| rng.gen()).collect();
    cpu.start();
    let started = Instant::now();
    let mut offset = 0;
    while offset < file_bytes {
        let length = (file_bytes - offset).min(IO_BYTES as u64) as usize;
        fs.write(file.inode, offset, &chunk[..length]).map_err(|error| format!("write: {error}"))?;
        offset += length as u64;
    }
    fs.sync().map_err(|error| format!("sync: {error}"))?;
    timings.write_seconds = started.elapsed().as_secs_f64();
    cpu.stop();
    timings.write_path = Some((assembled.statistics().epochs, counting.take()));
    if arguments.creates > 0 {
        let before = assembled.statistics().epochs;
        let started = Instant::now();
        let directory = fs.make_directory(ROOT_INODE, b"creates", 0o755, 0, 0).map_err(|e| e.to_string())?;
        for index in 0..arguments.creates {
            let name = format!("f{index}");
            let made = fs
                .create(directory.inode, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0)
                .map_err(|error| format!("create: {error}"))?;
            fs.write(made.inode, 0, &chunk[..BLOCK_BYTES as usize]).map_err(|error| format!("write: {error}"))?;
        }
        fs.sync().map_err(|error| format!("sync: {error}"))?;
        let seconds = started.elapsed().as_secs_f64();
        let after = assembled.statistics().epochs;
        timings.create_path = Some((epochs_between(&before, &after), counting.take(), seconds));
    }
    drop(assembled);
    let started = Instant::now();
    let blocks = file_bytes / BLOCK_BYTES;
    for _ in 0..arguments.random_writes {
        let block = rng.gen_range(0..blocks);
        fs.write(file.inode, block * BLOCK_BYTES, &chunk[..BLOCK_BYTES as usize]).map_err(|e| e.to_string())?;
    }
    fs.sync().map_err(|error| format!("sync: {error}"))?;
    timings.random_seconds = started.elapsed().as_secs_f64() / arguments.random_writes as f64;
    fs.unmount().map_err(|error| format!("unmount: {error}"))?;
    drop(fs);
    // The counting wrapper holds the array too: it must be gone before the members are reopened.
    drop(counting);
    // Cold reads: a new mount, whole and then with one and two members gone.
    for (gone, seconds) in [
        (&[][..], &mut timings.read_seconds),
        (&[0][..], &mut timings.degraded_one_seconds),
        (&[0, 1][..], &mut timings.degraded_two_seconds),
    ] {
        if gone.len() > parity {
            continue;
        }
        let device: Arc<dyn Device> = Arc::new(assemble(&images, gone)?);
        let fs = FileSystem::mount(device, &MountOptions { read_only: true, ..MountOptions::default() })
            .map(|(fs, _)| fs)
            .map_err(|error| format!("mount: {error}"))?;
        cpu.start();
        *seconds = timed_read(&fs, file.inode, file_bytes)?;
        cpu.stop();
        fs.unmount().map_err(|error| format!("unmount: {error}"))?;
    }
    // The rebuild of slot 0 onto a fresh image.
    let degraded = assemble(&images, &[0])?;
    let fresh = make_images(scratch, "fresh", 1, arguments.member_size)?;
    let device: Arc<dyn Device> = image::open(&fresh[0].path, Access::WRITE).map_err(|error| error.to_string())?;
    cpu.start();
    let started = Instant::now();
    let rebuilt = degraded
        .rebuild_onto(0, Member { name: "fresh".into(), device }, &mut |_, _| {})
        .map_err(|error| format!("rebuild: {error}"))?;
    timings.rebuild_seconds = started.elapsed().as_secs_f64();
    cpu.stop();
    let geometry = rebuilt.geometry();
    timings.rebuild_bytes = geometry.stripe_count * geometry.stripe_unit_bytes;
    let moved = file_bytes * 4 + timings.rebuild_bytes;
    timings.cpu_per_gib = cpu.seconds_per_gib(moved);
    Ok(timings)
}

/// Why md RAID-6 cannot be measured here, if it cannot.
fn md_unavailable_reason(parity: usize) -> Option<String> {
    if parity != 2 {
        return Some(format!("md RAID-6 has 2 parity devices, this array {parity} (run with --parity 2)"));
    }
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (loop devices, mdadm and mount need it)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing (no loop device support)".into());
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if !tool_exists(tool) {
            return Some(format!("{tool} is not installed (apt-get install util-linux e2fsprogs mount)"));
        }
    }
    if !tool_exists("mdadm") {
        return Some("mdadm is not installed (apt-get install mdadm, or put a static mdadm on PATH)".into());
    }
    if !Path::new("/proc/mdstat").exists() && tool_exists("modprobe") {
        let _ = run_tool("modprobe", &["raid456"]);
    }
    if !Path::new("/proc/mdstat").exists() {
        return Some("this kernel has no md driver (/proc/mdstat is missing, raid456 not loadable)".into());
    }
    None
}

/// Loop devices, the md array, the mount: torn down in reverse order when dropped.
struct MdArray {
    loops: Vec<String>,
    md: Option<String>,
    mountpoint: Option<PathBuf>,
}

impl Drop for MdArray {
    fn drop(&mut self) {
        if let Some(mountpoint) = self.mountpoint.take() {
            unmount_and_remove(&mountpoint);
        }
        if let Some(md) = self.md.take() {
            if let Err(error) = run_tool("mdadm", &["--stop", &md]) {
                eprintln!("tandem: warning: {error}");
            }
        }
        for loop_device in self.loops.drain(..) {
            if let Err(error) = run_tool("losetup", &["--detach", &loop_device]) {
                eprintln!("tandem: warning: {error}");
            }
        }
    }
}

impl MdArray {
    fn mount(&mut self) -> Result<PathBuf, String> {
        let md = self.md.clone().expect("made");
        let mountpoint = std::env::temp_dir().join(format!("tandem-bench-raid-md-{}", std::process::id()));
        std::fs::create_dir_all(&mountpoint).map_err(|error| error.to_string())?;
        run_tool("mount", &[&md, &mountpoint.to_string_lossy()])?;
        self.mountpoint = Some(mountpoint.clone());
        Ok(mountpoint)
    }
    fn unmount(&mut self) {
        if let Some(mountpoint) = self.mountpoint.take() {
            unmount_and_remove(&mountpoint);
        }
    }
}

fn drop_caches() -> Result<(), String> {
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|error| format!("drop caches: {error}"))
}

fn timed_file_read(path: &Path, file_bytes: u64) -> Result<f64, String> {
    drop_caches()?;
    let mut file = std::fs::File::open(path).map_err(|error| error.to_string())?;
    let mut buffer = vec![0u8; IO_BYTES];
    let started = Instant::now();
    let mut total = 0u64;
    while total < file_bytes {
        let read = file.read(&mut buffer).map_err(|error| error.to_string())?;
        if read == 0 {
            return Err(format!("the file ends at {total}"));
        }
        total += read as u64;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Waits (at most an hour) until /proc/mdstat shows no recovery running.
fn wait_for_recovery() -> Result<(), String> {
    for _ in 0..36_000 {
        let text = std::fs::read_to_string("/proc/mdstat").map_err(|error| error.to_string())?;
        if !text.contains("recovery") && !text.contains("resync") {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Err("md recovery did not finish within an hour".into())
}

fn measure_md(arguments: &RaidBenchArguments, scratch: &Path, unit: u64) -> Result<Timings, String> {
    let count = arguments.devices as usize;
    let images = make_images(scratch, "md", count + 1, arguments.member_size)?;
    let mut md = MdArray { loops: Vec::new(), md: None, mountpoint: None };
    for image in &images {
        md.loops.push(run_tool("losetup", &["--find", "--show", &image.path.to_string_lossy()])?);
    }
    let name = format!("/dev/md/tandem-bench-{}", std::process::id());
    let raid_devices = count.to_string();
    let chunk = format!("{}", unit / 1024);
    let mut create = vec![
        "--create",
        &name,
        "--run",
        "--quiet",
        "--level=6",
        "--raid-devices",
        &raid_devices,
        "--chunk",
        &chunk,
        "--assume-clean",
        "--metadata=1.2",
    ];
    create.extend(md.loops[..count].iter().map(String::as_str));
    run_tool("mdadm", &create)?;
    md.md = Some(name.clone());
    run_tool("mkfs.ext4", &["-q", "-F", &name])?;
    let mut timings = Timings::default();
    let mut cpu = CpuMeter::default();
    let file_bytes = arguments.file_size;
    let path = md.mount()?.join("bench");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let chunk_bytes: Vec<u8> = (0..IO_BYTES).map(|_| rng.gen()).collect();
    cpu.start();
    let started = Instant::now();
    let mut file = std::fs::File::create(&path).map_err(|error| error.to_string())?;
    let mut written = 0u64;
    while written < file_bytes {
        let length = (file_bytes - written).min(IO_BYTES as u64) as usize;
        file.write_all(&chunk_bytes[..length]).map_err(|error| error.to_string())?;
        written += length as u64;
    }
    file.sync_all().map_err(|error| error.to_string())?;
    timings.write_seconds = started.elapsed().as_secs_f64();
    cpu.stop();
    let started = Instant::now();
    let blocks = file_bytes / BLOCK_BYTES;
    for _ in 0..arguments.random_writes {
        let block = rng.gen_range(0..blocks);
        file.write_all_at(&chunk_bytes[..BLOCK_BYTES as usize], block * BLOCK_BYTES).map_err(|e| e.to_string())?;
    }
    file.sync_all().map_err(|error| error.to_string())?;
    timings.random_seconds = started.elapsed().as_secs_f64() / arguments.random_writes as f64;
    drop(file);
    cpu.start();
    timings.read_seconds = timed_file_read(&path, file_bytes)?;
    run_tool("mdadm", &[&name, "--fail", &md.loops[0]])?;
    timings.degraded_one_seconds = timed_file_read(&path, file_bytes)?;
    run_tool("mdadm", &[&name, "--fail", &md.loops[1]])?;
    timings.degraded_two_seconds = timed_file_read(&path, file_bytes)?;
    cpu.stop();
    md.unmount();
    run_tool("mdadm", &[&name, "--remove", &md.loops[0], &md.loops[1]])?;
    cpu.start();
    let started = Instant::now();
    run_tool("mdadm", &[&name, "--add", &md.loops[count]])?;
    std::thread::sleep(std::time::Duration::from_millis(200));
    wait_for_recovery()?;
    timings.rebuild_seconds = started.elapsed().as_secs_f64();
    cpu.stop();
    timings.rebuild_bytes = arguments.member_size.saturating_sub(array::DATA_START_BYTES);
    timings.cpu_per_gib = cpu.seconds_per_gib(file_bytes * 4 + timings.rebuild_bytes);
    Ok(timings)
}

/// What the array did between two readings of its epoch counters.
fn epochs_between(before: &array::EpochStatistics, after: &array::EpochStatistics) -> array::EpochStatistics {
    array::EpochStatistics {
        epochs: after.epochs - before.epochs,
        epochs_full: after.epochs_full - before.epochs_full,
        full_chunks: after.full_chunks - before.full_chunks,
        partial_chunks: after.partial_chunks - before.partial_chunks,
        parity_read_bytes: after.parity_read_bytes - before.parity_read_bytes,
        intent_records: after.intent_records - before.intent_records,
        held_chunks: after.held_chunks - before.held_chunks,
    }
}

/// The regions of the volume a write to the array is counted under, by its first block.
/// The back end's home writes of file data (`Device::write_held`) are counted apart from the
/// other writes to allocated blocks (checkpoint images of directory and extent blocks, direct
/// writes), wherever they land.
const REGIONS: [&str; 6] = [
    "record log headers",
    "record log data",
    "image log",
    "fixed metadata",
    "allocated blocks (metadata images, direct writes)",
    "file data home (held writes)",
];

/// Writes of one region: how many, their bytes, and the stripes they covered only in part
/// (each such stripe costs the array a read of its other rows and partial parity, unless
/// another write of the same epoch fills it).
#[derive(Clone, Copy, Default)]
struct RegionCount {
    writes: u64,
    bytes: u64,
    partial_stripes: u64,
}

#[derive(Clone, Default)]
struct RegionCounts([RegionCount; 6]);

impl RegionCounts {
    fn lines(&self, label: &str, what: &str) -> Vec<String> {
        let mut lines = vec![format!("{label}, {what}, the volume's writes to the array by region:")];
        for (name, count) in REGIONS.iter().zip(self.0.iter()).filter(|(_, count)| count.writes > 0) {
            lines.push(format!(
                "    {name}: {} writes, {}, {} stripes covered in part",
                count.writes,
                format_bytes(count.bytes),
                count.partial_stripes
            ));
        }
        lines
    }
}

/// The array with the volume's writes counted by region (`REGIONS`), to say where the
/// partial-stripe writes come from; everything else passes through.
struct CountingDevice {
    inner: Arc<ArrayDevice>,
    /// Block ranges of the regions before "allocated blocks" (the first data block on).
    bounds: [std::ops::Range<u64>; 3],
    first_data_block: u64,
    stripe_bytes: u64,
    counts: std::sync::Mutex<RegionCounts>,
    /// Whether held writes and log flushes reach the array as such (else as plain writes and
    /// flushes, the behaviour before held home writes).
    hold: bool,
}

impl CountingDevice {
    fn new(
        inner: Arc<ArrayDevice>,
        superblock: &tandemfs::block::superblock::Superblock,
        hold: bool,
    ) -> CountingDevice {
        let geometry = inner.geometry();
        let image_start = superblock.image_log_header_start.min(superblock.image_log_data_start);
        let image_end = (superblock.image_log_header_start + superblock.image_log_header_blocks)
            .max(superblock.image_log_data_start + superblock.image_log_data_blocks);
        CountingDevice {
            bounds: [
                superblock.log_header_start..superblock.log_header_start + superblock.log_header_blocks,
                superblock.log_data_start..superblock.log_data_start + superblock.log_data_blocks,
                image_start..image_end,
            ],
            first_data_block: superblock.first_data_block,
            stripe_bytes: geometry.stripe_data_bytes(),
            inner,
            counts: std::sync::Mutex::new(RegionCounts::default()),
            hold,
        }
    }

    /// The counts so far, and zero from here on.
    fn take(&self) -> RegionCounts {
        std::mem::take(&mut *self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    fn count(&self, offset: u64, length: usize, held: bool) {
        if length == 0 {
            return;
        }
        let block = offset / BLOCK_BYTES;
        let region = self
            .bounds
            .iter()
            .position(|range| range.contains(&block))
            .unwrap_or(if block < self.first_data_block { 3 } else { 4 });
        let region = if held { 5 } else { region };
        let end = offset + length as u64;
        let (first_stripe, last_stripe) = (offset / self.stripe_bytes, (end - 1) / self.stripe_bytes);
        let head_partial = !offset.is_multiple_of(self.stripe_bytes) || end < (first_stripe + 1) * self.stripe_bytes;
        let tail_partial = last_stripe != first_stripe && !end.is_multiple_of(self.stripe_bytes);
        let mut counts = self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = &mut counts.0[region];
        count.writes += 1;
        count.bytes += length as u64;
        count.partial_stripes += u64::from(head_partial) + u64::from(tail_partial);
    }
}

impl Device for CountingDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> tandemfs::Result<()> {
        self.inner.read_at(offset, buffer)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tandemfs::Result<()> {
        self.count(offset, data.len(), false);
        self.inner.write_at(offset, data)
    }
    fn flush(&self) -> tandemfs::Result<()> {
        self.inner.flush()
    }
    fn write_held(&self, offset: u64, data: &[u8]) -> tandemfs::Result<()> {
        self.count(offset, data.len(), true);
        if self.hold {
            self.inner.write_held(offset, data)
        } else {
            self.inner.write_at(offset, data)
        }
    }
    fn stripe_bytes(&self) -> Option<u64> {
        self.inner.stripe_bytes()
    }
    fn flush_unheld(&self) -> tandemfs::Result<()> {
        if self.hold {
            self.inner.flush_unheld()
        } else {
            self.inner.flush()
        }
    }
    fn read_uncached(&self, offset: u64, buffer: &mut [u8]) -> tandemfs::Result<()> {
        self.inner.read_uncached(offset, buffer)
    }
    fn write_through(&self, offset: u64, data: &[u8]) -> tandemfs::Result<()> {
        self.count(offset, data.len(), false);
        self.inner.write_through(offset, data)
    }
    fn reachable_by_other_processes(&self) -> bool {
        self.inner.reachable_by_other_processes()
    }
    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
    fn read_checked(&self, offset: u64, buffer: &mut [u8], check: &dyn Fn(&[u8]) -> bool) -> tandemfs::Result<bool> {
        self.inner.read_checked(offset, buffer, check)
    }
}
