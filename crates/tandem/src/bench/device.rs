//! `tandem bench device`: the library's device (`FileDevice`) against fio on the same file of
//! the same file system. Four workloads: large sequential writes and reads, random 4 KiB reads
//! and writes, each through the device's three transports (io_uring with O_DIRECT, io_uring
//! through the page cache, pread/pwrite; the line above the table says which one a volume on
//! this medium gets) and through fio (`--ioengine=io_uring --direct=1`,
//! or `--direct=0` where the medium refuses O_DIRECT). Writes end with a flush (fdatasync), and
//! fio's with `--end_fsync=1`; reads start with the file's page cache dropped (fio does the same
//! with its default `--invalidate=1`). docs/BENCHMARKS.md says how to read the table.

use super::table::print_table;
use super::ScratchFile;
use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::size::{format_bytes, format_count, parse_nonzero_size};
use clap::Args;
use rand::{Rng, SeedableRng};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tandemfs::device::{AsyncOptions, Device, FileDevice, FileDeviceOptions, TransportChoice};

/// Random transfers are 4 KiB at 4 KiB-aligned offsets.
const RANDOM_BYTES: usize = 4096;
/// Largest thread count for the random workloads.
const THREADS_MAX: usize = 64;

#[derive(Args)]
pub struct DeviceBenchArguments {
    /// Size of the file the workloads run on
    #[arg(long, value_parser = parse_nonzero_size, default_value = "256M")]
    pub size: u64,
    /// Request size of the sequential workloads
    #[arg(long, value_parser = parse_nonzero_size, default_value = "1M")]
    pub block_size: u64,
    /// Random 4 KiB requests per random workload (over all threads)
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..=100_000_000))]
    pub random_ops: u64,
    /// Threads issuing the random requests (fio: --numjobs); the sequential ones use one
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=THREADS_MAX as u64))]
    pub threads: u64,
    /// Directory for the file (default: the temporary directory; /dev/shm is RAM and takes
    /// the medium out of the comparison)
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Leave fio out
    #[arg(long)]
    pub no_fio: bool,
    /// Leave out the file through the library (sequential workloads: every write through the
    /// log, and writes of the default threshold or more straight home)
    #[arg(long)]
    pub no_library: bool,
    /// Also measure the library file with this direct-write threshold (repeatable)
    #[arg(long, value_name = "BYTES")]
    pub direct_write_min_bytes: Vec<u64>,
    /// Measured rounds per cell; the median is reported. Each round runs the engines in a
    /// rotated order, so that none always meets a colder (or warmer) host cache than the others
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=15))]
    pub rounds: u64,
}

/// One workload.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    SequentialWrite,
    SequentialRead,
    RandomRead,
    RandomWrite,
}

const WORKLOADS: [Workload; 4] =
    [Workload::SequentialWrite, Workload::SequentialRead, Workload::RandomRead, Workload::RandomWrite];

impl Workload {
    fn label(self, block_size: u64) -> String {
        match self {
            Workload::SequentialWrite => format!("sequential write {}", format_bytes(block_size)),
            Workload::SequentialRead => format!("sequential read {}", format_bytes(block_size)),
            Workload::RandomRead => "random read 4 KiB".into(),
            Workload::RandomWrite => "random write 4 KiB".into(),
        }
    }
    fn is_read(self) -> bool {
        matches!(self, Workload::SequentialRead | Workload::RandomRead)
    }
    fn fio_mode(self) -> &'static str {
        match self {
            Workload::SequentialWrite => "write",
            Workload::SequentialRead => "read",
            Workload::RandomRead => "randread",
            Workload::RandomWrite => "randwrite",
        }
    }
}

/// Bytes moved and requests made in some seconds.
#[derive(Clone, Copy)]
struct Measured {
    bytes: u64,
    requests: u64,
    seconds: f64,
}

impl Measured {
    fn mebibytes_per_second(&self) -> f64 {
        self.bytes as f64 / (1 << 20) as f64 / self.seconds
    }
    fn requests_per_second(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

pub fn run(arguments: DeviceBenchArguments) -> CliResult<i32> {
    let fail = |message: String| CliError::new(format!("bench device: {message}"));
    let directory = arguments.dir.clone().unwrap_or_else(std::env::temp_dir);
    if !directory.is_dir() {
        return Err(fail(format!("{} is not a directory", directory.display())));
    }
    if arguments.block_size > arguments.size || !arguments.size.is_multiple_of(arguments.block_size) {
        return Err(fail("--size must be a multiple of --block-size".into()));
    }
    if !arguments.block_size.is_multiple_of(RANDOM_BYTES as u64) || arguments.size < (RANDOM_BYTES as u64) * 16 {
        return Err(fail("--block-size must be a multiple of 4 KiB and --size at least 64 KiB".into()));
    }
    super::require_free_space(&directory, arguments.size, "lower --size")?;
    let scratch = ScratchFile { path: directory.join(format!("tandem-bench-device-{}.img", std::process::id())) };
    lay_out(&scratch.path, arguments.size).map_err(fail)?;
    let direct_allowed = medium_takes_direct(&scratch.path);
    println!(
        "tandem bench device: {} file on {} ({}), {} requests for the sequential workloads, {} random 4 KiB requests on {} thread(s), {} cores",
        format_bytes(arguments.size),
        directory.display(),
        file_system_name(&directory),
        format_bytes(arguments.block_size),
        format_count(arguments.random_ops),
        arguments.threads,
        std::thread::available_parallelism().map_or(1, |cores| cores.get())
    );

    let automatic = FileDevice::open(&scratch.path, FileDeviceOptions::default())
        .map_err(|error| fail(format!("open: {error}")))?
        .transport();
    println!("a volume on this medium runs on: {automatic}");
    let mut engines: Vec<Engine> = Vec::new();
    for transport in [TransportChoice::IoUringDirect, TransportChoice::IoUringBuffered, TransportChoice::Syscalls] {
        let opened = FileDevice::open_with_async_options(
            &scratch.path,
            FileDeviceOptions::default(),
            AsyncOptions { transport, ..AsyncOptions::default() },
        )
        .map_err(|error| fail(format!("open {transport:?}: {error}")))?;
        engines.push(Engine::Device(opened));
    }
    if !arguments.no_library {
        let default = tandemfs::fs::types::DIRECT_WRITE_MIN_BYTES_DEFAULT;
        let mut thresholds = vec![0, default];
        thresholds.extend(arguments.direct_write_min_bytes.iter().copied().filter(|bytes| *bytes != default));
        for threshold in thresholds {
            engines.push(Engine::Library(LibraryFile::open(&directory, arguments.size, threshold).map_err(fail)?));
        }
    }
    let fio = if arguments.no_fio { Err("left out (--no-fio)".to_string()) } else { fio_version() };
    match &fio {
        Ok(version) => {
            // fio through the page cache too, so that the page-cache rows have their peer.
            engines.push(Engine::Fio { version: version.clone(), direct: false });
            if direct_allowed {
                engines.push(Engine::Fio { version: version.clone(), direct: true });
            }
        }
        Err(reason) => println!("fio skipped: {reason}"),
    }
    // Labels are taken after the runs: a device that lost O_DIRECT on the way says so.
    let mut measured: Vec<Vec<Result<Measured, String>>> = vec![Vec::new(); engines.len()];
    for &workload in &WORKLOADS {
        let mut rounds: Vec<Vec<Result<Measured, String>>> = vec![Vec::new(); engines.len()];
        for round in 0..arguments.rounds as usize {
            for step in 0..engines.len() {
                let index = (round + step) % engines.len();
                rounds[index].push(engines[index].run(&arguments, &scratch.path, workload));
            }
        }
        for (index, results) in rounds.into_iter().enumerate() {
            measured[index].push(median(results));
        }
    }
    let results: Vec<Column> = engines
        .iter()
        .zip(measured)
        .map(|(engine, measured)| Column {
            label: engine.label(),
            direct: engine.is_direct(),
            is_fio: matches!(engine, Engine::Fio { .. }),
            sequential_only: matches!(engine, Engine::Library(_)),
            measured,
        })
        .collect();
    if !direct_allowed {
        println!("the medium refuses O_DIRECT: every engine goes through the page cache");
    }
    print_results(&arguments, &results);
    Ok(EXIT_SUCCESS)
}

/// Writes the whole file once, so that every measured write overwrites allocated blocks, as
/// fio does when it finds the file laid out.
fn lay_out(path: &Path, size_bytes: u64) -> Result<(), String> {
    use std::io::Write;
    let mut file = std::fs::File::create(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    while written < size_bytes {
        let bytes = (size_bytes - written).min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..bytes]).map_err(|error| format!("lay out {}: {error}", path.display()))?;
        written += bytes as u64;
    }
    file.sync_all().map_err(|error| format!("sync {}: {error}", path.display()))
}

/// Whether the file system takes an O_DIRECT open and one aligned direct read.
fn medium_takes_direct(path: &Path) -> bool {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let Ok(file) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) else {
        return false;
    };
    let layout = std::alloc::Layout::from_size_align(RANDOM_BYTES, RANDOM_BYTES).expect("valid layout");
    // SAFETY: non-zero size; freed below with the same layout.
    let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
    if pointer.is_null() {
        return false;
    }
    // SAFETY: `pointer` owns RANDOM_BYTES initialised bytes until the dealloc below.
    let buffer = unsafe { std::slice::from_raw_parts_mut(pointer, RANDOM_BYTES) };
    let worked = matches!(file.read_at(buffer, 0), Ok(count) if count == RANDOM_BYTES);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(pointer, layout) };
    worked
}

/// The file system's name, from statfs's magic number, for the header line.
fn file_system_name(directory: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(directory.as_os_str().as_bytes()) else {
        return "unknown file system".into();
    };
    // SAFETY: statfs writes one struct through the pointer, which outlives the call.
    let mut status: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut status) } != 0 {
        return "unknown file system".into();
    }
    match status.f_type as i64 {
        0xef53 => "ext4".into(),
        0x0102_1994 => "tmpfs".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683e => "btrfs".into(),
        0x6573_7546 => "fuse".into(),
        0x794c_7630 => "overlayfs".into(),
        magic => format!("file system 0x{magic:x}"),
    }
}

/// Drops the file's clean pages from the page cache, so that a read workload reads the medium.
fn drop_page_cache(path: &Path) {
    if let Ok(file) = std::fs::File::open(path) {
        // SAFETY: plain advice on an open descriptor.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// What one engine measured, for the table.
struct Column {
    label: String,
    direct: bool,
    is_fio: bool,
    /// Measures the sequential workloads only (the file through the library).
    sequential_only: bool,
    measured: Vec<Result<Measured, String>>,
}

/// One engine of the table: the library's device on one transport, a file through the
/// library (`FileSystem::write` and `read` on a volume of its own, sequential workloads only),
/// or fio.
enum Engine {
    Device(FileDevice),
    Library(LibraryFile),
    Fio { version: String, direct: bool },
}

/// A file on a fresh tandemfs volume in an image beside the scratch file, mounted with a given
/// direct-write threshold (`MountOptions::direct_write_min_bytes`).
struct LibraryFile {
    fs: tandemfs::FileSystem,
    /// The file's inode: each write round makes it anew, as `bench mount` does (a rewrite of
    /// written bytes stays on the log and goes in place).
    file: std::sync::atomic::AtomicU64,
    threshold_bytes: u64,
    image: ScratchFile,
}

impl LibraryFile {
    fn open(directory: &Path, size_bytes: u64, threshold_bytes: u64) -> Result<LibraryFile, String> {
        use tandemfs::fs::{FileType, MountOptions, ROOT_INODE};
        let image = ScratchFile {
            path: directory.join(format!("tandem-bench-library-{}-{threshold_bytes}.img", std::process::id())),
        };
        // Room for the file twice over (a direct overwrite takes new blocks before the old
        // ones are freed at the next checkpoint), the log and the tables.
        let volume_bytes = size_bytes * 2 + (512 << 20);
        super::require_free_space(directory, volume_bytes, "lower --size").map_err(|error| error.to_string())?;
        let options =
            FileDeviceOptions { create_size_bytes: Some(volume_bytes), lock_exclusive: true, read_only: false };
        let device = FileDevice::open(&image.path, options).map_err(|error| format!("library volume: {error}"))?;
        let mount_options = MountOptions { direct_write_min_bytes: threshold_bytes, ..MountOptions::default() };
        let fs = super::meta::fresh_volume_with(
            std::sync::Arc::new(device),
            1024,
            super::meta::Encryption::Plain,
            mount_options,
        )?;
        let file = fs
            .create(ROOT_INODE, b"sequential", FileType::Regular, 0o644, 0, 0, 0)
            .map_err(|error| format!("library create: {error}"))?
            .inode;
        Ok(LibraryFile { fs, file: std::sync::atomic::AtomicU64::new(file), threshold_bytes, image })
    }

    /// Writes the file in `block_size` requests and fsyncs it, or reads it back.
    fn run(&self, arguments: &DeviceBenchArguments, workload: Workload) -> Result<Measured, String> {
        if !matches!(workload, Workload::SequentialWrite | Workload::SequentialRead) {
            // Not shown: the table leaves the library out of the random rows.
            return Err("sequential workloads only".into());
        }
        use std::sync::atomic::Ordering;
        if workload == Workload::SequentialWrite {
            use tandemfs::fs::{FileType, ROOT_INODE};
            self.fs.unlink(ROOT_INODE, b"sequential").map_err(|error| format!("library unlink: {error}"))?;
            let made = self
                .fs
                .create(ROOT_INODE, b"sequential", FileType::Regular, 0o644, 0, 0, 0)
                .map_err(|error| format!("library create: {error}"))?;
            self.file.store(made.inode, Ordering::Relaxed);
        }
        let file = self.file.load(Ordering::Relaxed);
        drop_page_cache(&self.image.path);
        let start = Instant::now();
        let block_bytes = arguments.block_size as usize;
        let mut buffer = vec![0xa5u8; block_bytes];
        let requests = arguments.size / arguments.block_size;
        for index in 0..requests {
            let offset = index * arguments.block_size;
            if workload == Workload::SequentialWrite {
                let written = self.fs.write(file, offset, &buffer).map_err(|error| error.to_string())?;
                if written != block_bytes {
                    return Err(format!("short write of {written} bytes at {offset}"));
                }
            } else {
                let read = self.fs.read(file, offset, &mut buffer).map_err(|error| error.to_string())?;
                if read != block_bytes {
                    return Err(format!("short read of {read} bytes at {offset}"));
                }
            }
        }
        if workload == Workload::SequentialWrite {
            self.fs.fsync(file, false).map_err(|error| error.to_string())?;
        }
        Ok(Measured { bytes: arguments.size, requests, seconds: start.elapsed().as_secs_f64() })
    }
}

impl Drop for LibraryFile {
    fn drop(&mut self) {
        let _ = self.fs.unmount();
    }
}

impl Engine {
    /// Whether the engine's transfers go around the page cache.
    fn is_direct(&self) -> bool {
        match self {
            Engine::Device(device) => device.transport().direct,
            Engine::Library(_) => false,
            Engine::Fio { direct, .. } => *direct,
        }
    }

    fn label(&self) -> String {
        match self {
            Engine::Device(device) => {
                // Short: the line above the table carries the notes.
                let statistics = device.transport();
                let shape = match (statistics.name, statistics.direct) {
                    ("io_uring", true) => " + O_DIRECT",
                    ("io_uring", false) => " (page cache)",
                    _ => "",
                };
                format!("tandemfs {}{shape}", statistics.name)
            }
            Engine::Library(library) => match library.threshold_bytes {
                0 => "tandemfs library, every write logged".into(),
                bytes => format!("tandemfs library, writes ≥ {} direct", format_bytes(bytes)),
            },
            Engine::Fio { version, direct } => format!("{version} io_uring --direct={}", u8::from(*direct)),
        }
    }

    /// One measurement, from a page cache without this file's pages (every engine starts alike).
    fn run(&self, arguments: &DeviceBenchArguments, path: &Path, workload: Workload) -> Result<Measured, String> {
        drop_page_cache(path);
        match self {
            Engine::Device(device) => super::contain_panic("the device", || run_workload(arguments, device, workload)),
            Engine::Library(library) => super::contain_panic("the library", || library.run(arguments, workload)),
            Engine::Fio { direct, .. } => run_fio(arguments, path, workload, *direct),
        }
    }
}

/// The median by throughput of the rounds that worked, or the first failure.
fn median(results: Vec<Result<Measured, String>>) -> Result<Measured, String> {
    let mut measured = results.into_iter().collect::<Result<Vec<Measured>, String>>()?;
    assert!(!measured.is_empty(), "at least one round");
    measured.sort_by(|left, right| left.mebibytes_per_second().total_cmp(&right.mebibytes_per_second()));
    Ok(measured[measured.len() / 2])
}

fn run_workload(arguments: &DeviceBenchArguments, device: &FileDevice, workload: Workload) -> Result<Measured, String> {
    let start = Instant::now();
    let (bytes, requests) = match workload {
        Workload::SequentialWrite | Workload::SequentialRead => sequential(arguments, device, workload)?,
        Workload::RandomRead | Workload::RandomWrite => random(arguments, device, workload)?,
    };
    if !workload.is_read() {
        // Durable, as fio's --end_fsync=1.
        device.flush().map_err(|error| error.to_string())?;
    }
    Ok(Measured { bytes, requests, seconds: start.elapsed().as_secs_f64() })
}

fn sequential(arguments: &DeviceBenchArguments, device: &FileDevice, workload: Workload) -> Result<(u64, u64), String> {
    let block_bytes = arguments.block_size as usize;
    let mut buffer = vec![0xa5u8; block_bytes];
    let requests = arguments.size / arguments.block_size;
    for index in 0..requests {
        let offset = index * arguments.block_size;
        let done = if workload == Workload::SequentialWrite {
            device.write_at(offset, &buffer)
        } else {
            device.read_at(offset, &mut buffer)
        };
        done.map_err(|error| error.to_string())?;
    }
    Ok((arguments.size, requests))
}

fn random(arguments: &DeviceBenchArguments, device: &FileDevice, workload: Workload) -> Result<(u64, u64), String> {
    let threads = arguments.threads as usize;
    let blocks = arguments.size / RANDOM_BYTES as u64;
    let per_thread = arguments.random_ops / threads as u64;
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread_index| {
                scope.spawn(move || {
                    let mut random = rand::rngs::SmallRng::seed_from_u64(0xde71_ce00 ^ thread_index as u64);
                    let mut buffer = vec![0x3cu8; RANDOM_BYTES];
                    for _ in 0..per_thread {
                        let offset = random.gen_range(0..blocks) * RANDOM_BYTES as u64;
                        let done = if workload == Workload::RandomWrite {
                            device.write_at(offset, &buffer)
                        } else {
                            device.read_at(offset, &mut buffer)
                        };
                        done.map_err(|error| error.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
    });
    outcomes.into_iter().collect::<Result<Vec<()>, String>>()?;
    let requests = per_thread * threads as u64;
    Ok((requests * RANDOM_BYTES as u64, requests))
}

/// fio's version, or why fio cannot run.
fn fio_version() -> Result<String, String> {
    match std::process::Command::new("fio").arg("--version").output() {
        Ok(output) if output.status.success() => Ok(String::from_utf8_lossy(&output.stdout).trim().to_string()),
        Ok(output) => Err(format!("fio --version failed: {}", String::from_utf8_lossy(&output.stderr).trim())),
        Err(error) => Err(format!("fio is not installed ({error}); apt-get install fio")),
    }
}

/// One fio job with the workload's shape on the same file; its own bandwidth and IOPS (terse
/// format version 3: read KiB/s and IOPS are fields 7 and 8, write ones 48 and 49).
fn run_fio(
    arguments: &DeviceBenchArguments,
    path: &Path,
    workload: Workload,
    direct: bool,
) -> Result<Measured, String> {
    let random = matches!(workload, Workload::RandomRead | Workload::RandomWrite);
    let block_bytes = if random { RANDOM_BYTES as u64 } else { arguments.block_size };
    let threads = if random { arguments.threads } else { 1 };
    let total_bytes =
        if random { (arguments.random_ops / threads) * threads * RANDOM_BYTES as u64 } else { arguments.size };
    let mut command = std::process::Command::new("fio");
    command.args([
        "--name=device",
        &format!("--filename={}", path.display()),
        &format!("--size={}", arguments.size),
        &format!("--io_size={}", total_bytes / threads),
        &format!("--bs={block_bytes}"),
        &format!("--rw={}", workload.fio_mode()),
        "--ioengine=io_uring",
        "--iodepth=1",
        &format!("--direct={}", u8::from(direct)),
        &format!("--numjobs={threads}"),
        "--group_reporting",
        "--randrepeat=1",
        "--output-format=terse",
        "--terse-version=3",
    ]);
    if !workload.is_read() {
        command.arg("--end_fsync=1");
    }
    let output = command.output().map_err(|error| format!("fio: {error}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("fio failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    let line = text.lines().find(|line| line.starts_with("3;")).ok_or("fio printed no terse line")?;
    let fields: Vec<&str> = line.split(';').collect();
    let (bandwidth_field, iops_field) = if workload.is_read() { (6, 7) } else { (47, 48) };
    let parse = |index: usize| -> Result<f64, String> {
        fields
            .get(index)
            .and_then(|field| field.parse::<f64>().ok())
            .ok_or(format!("fio field {} unreadable", index + 1))
    };
    let kibibytes_per_second = parse(bandwidth_field)?;
    let iops = parse(iops_field)?;
    if kibibytes_per_second <= 0.0 || iops <= 0.0 {
        return Err("fio reported no throughput".into());
    }
    // Expressed as the same bytes over the seconds that give fio's bandwidth.
    let seconds = total_bytes as f64 / 1024.0 / kibibytes_per_second;
    Ok(Measured { bytes: total_bytes, requests: (iops * seconds).round() as u64, seconds })
}

/// One row per workload and engine; "vs fio" compares with fio of the same kind (direct rows
/// with `--direct=1`, page-cache rows with `--direct=0`).
fn print_results(arguments: &DeviceBenchArguments, columns: &[Column]) {
    let mut rows = Vec::new();
    for (index, &workload) in WORKLOADS.iter().enumerate() {
        let random = matches!(workload, Workload::RandomRead | Workload::RandomWrite);
        for column in columns.iter().filter(|column| !(random && column.sequential_only)) {
            let mut row = vec![workload.label(arguments.block_size), column.label.clone()];
            match &column.measured[index] {
                Ok(measured) => {
                    row.push(format!("{:.0}", measured.mebibytes_per_second()));
                    row.push(format_count(measured.requests_per_second().round() as u64));
                    let peer = columns.iter().find(|peer| peer.is_fio && peer.direct == column.direct);
                    let ratio = match peer.map(|peer| &peer.measured[index]) {
                        Some(Ok(fio)) => {
                            format!("{:.2}×", measured.mebibytes_per_second() / fio.mebibytes_per_second())
                        }
                        _ => "-".into(),
                    };
                    row.push(ratio);
                }
                Err(error) => row.push(format!("failed: {error}")),
            }
            rows.push(row);
        }
    }
    print_table(&["workload", "engine", "MiB/s", "IOPS", "vs fio"], &rows);
}
