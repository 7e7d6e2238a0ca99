//! `tandem bench log --threads 1,2,4,8,16`: how appends to the operation log scale with
//! threads. T threads append records of one size to a log on a file device (a file in
//! /dev/shm by default), with no fsync (the background group commit makes them durable) and
//! with an fsync (a wait for the thread's own record) every N appends. A releaser thread plays
//! the checkpoint: it frees the log up to the durable records whenever half of it is used, so
//! the rings wrap and appends meet a full log now and then, as they do under a file system.
//! Beside each number: the same run with every append under one global lock, as appends ran
//! before issue 7 (the copy into the log's buffer happened under its one lock).

use super::scaling::{parse_threads, THREADS_MAX};
use super::table::print_table;
use super::ScratchFile;
use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::size::{format_bytes, format_count, parse_nonzero_size};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
use tandemfs::log::{Log, LogGeometry, LogOptions, LogPosition, HEADERS_PER_BLOCK};

/// Header ring: 4 Ki blocks, 256 Ki slots (16 MiB), so that small records are not limited
/// by slots before the data ring fills.
const HEADER_BLOCKS: u64 = 4096;
/// Appends a thread retries while the log is full before the run is declared stuck: the
/// releaser frees the log within milliseconds.
const FULL_RETRIES_MAX: u64 = 10_000_000;
/// Largest record payload a run may ask for.
const RECORD_BYTES_MAX: usize = 1 << 20;

/// A list of payload sizes (its own type, so that clap takes the list as one value).
pub type Sizes = Vec<usize>;

#[derive(Args)]
pub struct LogBenchArguments {
    /// Thread counts to measure, comma separated
    #[arg(long, value_parser = parse_threads, default_value = "1,2,4,8,16")]
    pub threads: super::meta::Threads,
    /// Record payload sizes in bytes, comma separated
    #[arg(long, value_parser = parse_sizes, default_value = "64,4096")]
    pub sizes: Sizes,
    /// Appends each thread makes per measurement
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    pub appends: u64,
    /// In the fsync runs, each thread waits for its record to be durable every this many appends
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub fsync_every: u64,
    /// Size of the log's data ring
    #[arg(long, value_parser = parse_nonzero_size, default_value = "256M")]
    pub log_size: u64,
    /// Measured rounds per cell; the median is reported
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=15))]
    pub rounds: u64,
    /// Directory for the device file (default: /dev/shm when it exists, else the temporary
    /// directory)
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Skip the runs with every append under one global lock
    #[arg(long)]
    pub no_single_lock: bool,
}

/// One measured configuration.
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    pub threads: usize,
    pub record_bytes: usize,
    /// `None`: no fsync; `Some(n)`: each thread waits for its record every n appends.
    pub fsync_every: Option<u64>,
    /// Every append under one global lock.
    pub single_lock: bool,
    pub appends_per_thread: u64,
}

/// What one run of a cell measured.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    pub seconds: f64,
    pub appends: u64,
    /// Group commits (device flushes) the log made.
    pub flushes: u64,
    /// Appends that found the log full and were retried.
    pub full_retries: u64,
}

impl Measured {
    fn appends_per_second(&self) -> f64 {
        self.appends as f64 / self.seconds
    }
}

pub fn parse_sizes(text: &str) -> Result<Sizes, String> {
    let mut sizes = Vec::new();
    for part in text.split(',') {
        let size = parse_nonzero_size(part.trim())?;
        if size > RECORD_BYTES_MAX as u64 {
            return Err(format!("record size {size} is over {RECORD_BYTES_MAX}"));
        }
        sizes.push(size as usize);
    }
    Ok(sizes)
}

pub fn run(arguments: LogBenchArguments) -> CliResult<i32> {
    let directory = arguments.dir.clone().unwrap_or_else(super::scratch_directory);
    if !directory.is_dir() {
        return Err(CliError::new(format!("bench log: {} is not a directory", directory.display())));
    }
    let device_bytes = device_bytes(arguments.log_size);
    super::require_free_space(&directory, device_bytes, "lower --log-size")?;
    let largest = arguments.sizes.iter().copied().max().unwrap_or(0) as u64;
    if largest * 4 > arguments.log_size {
        return Err(CliError::new(format!(
            "bench log: --log-size {} is too small for records of {}",
            format_bytes(arguments.log_size),
            format_bytes(largest)
        )));
    }
    let image = directory.join(format!("tandem-bench-log-{}.img", std::process::id()));
    let bench = BenchDevice::create(&image, arguments.log_size)
        .map_err(|error| CliError::new(format!("bench log: {error}")))?;
    println!(
        "tandem bench log: {} appends per thread, log of {} on {}, median of {} rounds, {} cores",
        format_count(arguments.appends),
        format_bytes(arguments.log_size),
        directory.display(),
        arguments.rounds,
        std::thread::available_parallelism().map_or(1, |cores| cores.get())
    );
    for &record_bytes in &arguments.sizes {
        for fsync_every in [None, Some(arguments.fsync_every)] {
            let mut rows = Vec::new();
            let mut one_thread: Option<f64> = None;
            for &threads in &arguments.threads {
                let cell = Cell {
                    threads,
                    record_bytes,
                    fsync_every,
                    single_lock: false,
                    appends_per_thread: arguments.appends,
                };
                let parallel = median_run(&bench, cell, arguments.rounds)?;
                let locked = if arguments.no_single_lock {
                    None
                } else {
                    let cell = Cell { single_lock: true, ..cell };
                    Some(median_run(&bench, cell, arguments.rounds)?)
                };
                let rate = parallel.appends_per_second();
                let base = *one_thread.get_or_insert(rate);
                let mut row = vec![
                    threads.to_string(),
                    format!("{}/s", format_count(rate.round() as u64)),
                    format!("{:.0} MB/s", rate * record_bytes as f64 / 1e6),
                    format!("{:.2}×", rate / base),
                    format!("{:.1}", parallel.appends as f64 / parallel.flushes.max(1) as f64),
                    format_count(parallel.full_retries),
                ];
                if let Some(locked) = locked {
                    let locked_rate = locked.appends_per_second();
                    row.push(format!("{}/s", format_count(locked_rate.round() as u64)));
                    row.push(format!("{:.2}×", rate / locked_rate));
                }
                rows.push(row);
            }
            let mode = match fsync_every {
                None => "no fsync (background group commit)".to_string(),
                Some(1) => "fsync after every append".to_string(),
                Some(n) => format!("fsync every {n} appends"),
            };
            println!();
            println!("{} records, {mode}", format_bytes(record_bytes as u64));
            let mut headers = vec!["threads", "appends/s", "MB/s", "vs 1 thread", "appends/flush", "log-full retries"];
            if !arguments.no_single_lock {
                headers.extend(["one lock (old)", "vs one lock"]);
            }
            print_table(&headers, &rows);
        }
    }
    Ok(EXIT_SUCCESS)
}

fn device_bytes(log_bytes: u64) -> u64 {
    HEADER_BLOCKS * 4096 + log_bytes.div_ceil(4096) * 4096
}

fn median_run(bench: &BenchDevice, cell: Cell, rounds: u64) -> CliResult<Measured> {
    let mut runs = Vec::new();
    for _ in 0..rounds {
        let measured = super::contain_panic("bench log", || run_cell(bench, cell))
            .map_err(|error| CliError::new(format!("bench log ({cell:?}): {error}")))?;
        runs.push(measured);
    }
    runs.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    Ok(runs[runs.len() / 2])
}

/// The device file every cell of a run uses, written through once so that no cell pays for
/// the file system allocating its pages.
pub struct BenchDevice {
    device: Arc<dyn Device>,
    geometry: LogGeometry,
    _file: ScratchFile,
}

impl BenchDevice {
    pub fn create(image: &Path, log_bytes: u64) -> Result<BenchDevice, String> {
        let file = ScratchFile { path: image.to_path_buf() };
        let size = device_bytes(log_bytes);
        let options = FileDeviceOptions { create_size_bytes: Some(size), lock_exclusive: true, read_only: false };
        let device: Arc<dyn Device> = Arc::new(
            FileDevice::open(image, options).map_err(|error| format!("cannot create {}: {error}", image.display()))?,
        );
        let chunk = vec![0u8; 1 << 20];
        let mut offset = 0;
        while offset < size {
            let length = (size - offset).min(chunk.len() as u64) as usize;
            device.write_at(offset, &chunk[..length]).map_err(|error| format!("fill {}: {error}", image.display()))?;
            offset += length as u64;
        }
        device.flush().map_err(|error| format!("flush {}: {error}", image.display()))?;
        let geometry = LogGeometry {
            header_start_byte: 0,
            header_slots: HEADER_BLOCKS * HEADERS_PER_BLOCK,
            data_start_byte: HEADER_BLOCKS * 4096,
            data_bytes: size - HEADER_BLOCKS * 4096,
        };
        Ok(BenchDevice { device, geometry, _file: file })
    }
}

/// Formats a fresh log on the device and runs one cell on it.
pub fn run_cell(bench: &BenchDevice, cell: Cell) -> Result<Measured, String> {
    assert!((1..=THREADS_MAX).contains(&cell.threads));
    Log::format(bench.device.as_ref(), &bench.geometry).map_err(|error| format!("format the log: {error}"))?;
    let (log, _) = Log::recover(bench.device.clone(), bench.geometry, LogPosition::START, LogOptions::default())
        .map_err(|error| format!("open the log: {error}"))?;
    let result = drive(&log, cell);
    let stopped = log.shutdown().map_err(|error| format!("shut the log down: {error}"));
    let measured = result?;
    stopped?;
    Ok(measured)
}

/// Runs the appenders and the releaser; the time runs from the start barrier until every
/// record is durable.
fn drive(log: &Arc<Log>, cell: Cell) -> Result<Measured, String> {
    let barrier = Barrier::new(cell.threads + 1);
    let single_lock = Mutex::new(());
    let full_retries = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let flushes_before = log.stats().flushes;
    let (seconds, outcome) = std::thread::scope(|scope| {
        let releaser = scope.spawn(|| release_while_running(log, &done));
        let appenders: Vec<_> = (0..cell.threads)
            .map(|thread| {
                let (barrier, single_lock, full_retries) = (&barrier, &single_lock, &full_retries);
                scope.spawn(move || append_loop(log, cell, thread, barrier, single_lock, full_retries))
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let mut outcome: Result<(), String> = Ok(());
        for appender in appenders {
            let joined = appender.join().unwrap_or_else(|_| Err("an appender panicked".into()));
            if outcome.is_ok() {
                outcome = joined;
            }
        }
        if outcome.is_ok() {
            outcome = log.flush().map(drop).map_err(|error| format!("final flush: {error}"));
        }
        let seconds = started.elapsed().as_secs_f64();
        done.store(true, Ordering::Release);
        let released = releaser.join().unwrap_or_else(|_| Err("the releaser panicked".into()));
        (seconds, outcome.and(released))
    });
    outcome?;
    Ok(Measured {
        seconds,
        appends: cell.threads as u64 * cell.appends_per_thread,
        flushes: log.stats().flushes - flushes_before,
        full_retries: full_retries.into_inner(),
    })
}

fn append_loop(
    log: &Log,
    cell: Cell,
    thread: usize,
    barrier: &Barrier,
    single_lock: &Mutex<()>,
    full_retries: &AtomicU64,
) -> Result<(), String> {
    let payload: Vec<u8> = (0..cell.record_bytes).map(|i| (i + thread) as u8).collect();
    let kind = thread as u16;
    barrier.wait();
    let mut retries = 0u64;
    for index in 0..cell.appends_per_thread {
        let lsn = loop {
            let appended = if cell.single_lock {
                let _global = single_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                log.append(kind, &[&payload])
            } else {
                log.append(kind, &[&payload])
            };
            match appended.map_err(|error| format!("append: {error}"))? {
                Some(lsn) => break lsn,
                None => {
                    retries += 1;
                    if retries > FULL_RETRIES_MAX {
                        return Err("the log stayed full: the releaser fell behind".into());
                    }
                    std::thread::yield_now();
                }
            }
        };
        if cell.fsync_every.is_some_and(|every| (index + 1) % every == 0) {
            log.wait_durable(lsn).map_err(|error| format!("wait for durable: {error}"))?;
        }
    }
    full_retries.fetch_add(retries, Ordering::Relaxed);
    Ok(())
}

/// The checkpoint's part: whenever half of the log's normal share is used, frees it up to
/// the durable records.
fn release_while_running(log: &Log, done: &AtomicBool) -> Result<(), String> {
    while !done.load(Ordering::Acquire) {
        let usage = log.usage();
        if usage.header_slots_used * 2 > usage.header_slots_normal
            || usage.data_bytes_used * 2 > usage.data_bytes_normal
        {
            let durable = log.durable_lsn();
            log.release(log.position(durable + 1));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_sizes("64,4K").unwrap(), vec![64, 4096]);
        assert!(parse_sizes("0").is_err());
        assert!(parse_sizes("2M").is_err());
    }

    #[test]
    fn every_mode_runs_and_counts_its_appends() {
        let directory = std::env::temp_dir();
        let image = directory.join(format!("tandem-bench-log-test-{}.img", std::process::id()));
        {
            // A 1 MiB log: 1200 appends of 4 KiB wrap it several times and meet it full.
            let bench = BenchDevice::create(&image, 1 << 20).unwrap();
            for (fsync_every, single_lock) in [(None, false), (Some(3), false), (Some(1), true)] {
                let cell = Cell { threads: 3, record_bytes: 4096, fsync_every, single_lock, appends_per_thread: 400 };
                let measured = run_cell(&bench, cell).unwrap();
                assert_eq!(measured.appends, 1200);
                assert!(measured.flushes >= 1 && measured.seconds > 0.0);
            }
        }
        assert!(!image.exists(), "the device file is removed");
    }
}
