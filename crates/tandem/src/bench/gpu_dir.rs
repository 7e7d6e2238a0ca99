//! `tandem bench gpu-dir`: the batch API of issue 9 on a tree of D directories × F files:
//! batch creates into the directories and random path resolutions in one batch, beside the same
//! work as single library calls on T threads and as system calls (`open(O_CREAT)`, `stat`) on T
//! threads on ext4 on a loop device. The batch answers are checked against the single calls'.
//! The mount's batch API runs on its CPU twin on all cores. Where a GPU is present, the GPU
//! directory index is then measured on its own beside its twin (tandem-accel's dirindex
//! benchmark): batches, and the single-command round trips against issue 9's ≤ 10 µs.

use super::ext4::Ext4Volume;
use super::table::{format_rate, format_ratio, print_table};
use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::size::{format_bytes, format_count};
use clap::Args;
use std::sync::{Arc, Barrier};
use std::time::Instant;
use tandem_accel::dirindex::bench::DirectoryBenchRow;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::{CreateRequest, FileType, FormatOptions, MountOptions};
use tandemfs::FileSystem;

/// Threads of the single-call and ext4 columns at most.
const THREADS_MAX: usize = 1024;
/// Volume bytes per inode, as the engine's tests take: the inode (256 bytes), its share of the
/// directories' blocks and of the log (1/16 of the volume) with room. The 10M-file variant then
/// needs 40 GiB, which ext4's image in /dev/shm still finds on the 128 GiB host.
const VOLUME_BYTES_PER_INODE: u64 = 2048;
/// The smallest volume, so that small runs still get a log of a useful size.
const VOLUME_BYTES_MIN: u64 = 1 << 30;

#[derive(Args)]
pub struct GpuDirArguments {
    /// Files the batch creates, spread evenly over the directories; the single calls create as
    /// many in a second tree, and ext4 as many
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=20_000_000))]
    pub files: u64,
    /// Directories of the tree
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub directories: u64,
    /// Random path resolutions per round
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=100_000_000))]
    pub lookups: u64,
    /// Threads of the single-call and ext4 columns (default: one per core); the batch API uses
    /// every core
    #[arg(long)]
    pub threads: Option<usize>,
    /// Measured rounds of the resolutions after a warm-up; the median is reported
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=15))]
    pub rounds: u64,
    /// Skip ext4 (it needs root, loop devices and e2fsprogs)
    #[arg(long)]
    pub no_ext4: bool,
    /// Skip the GPU directory index's own rows (batches, round trips) where a GPU is present
    #[arg(long)]
    pub no_gpu_index: bool,
    /// Empty the front end's name and view caches before each resolution round, so that every
    /// name is looked up in its H-tree and every inode read from the inode table (what a tree
    /// past the caches' bounds does; `FileSystem::drop_idle_caches`)
    #[arg(long)]
    pub cold_caches: bool,
}

/// The shape of one run.
#[derive(Clone, Copy)]
struct Shape {
    files: u64,
    directories: u64,
    lookups: u64,
    threads: usize,
    rounds: usize,
    cold_caches: bool,
}

impl Shape {
    fn inodes(&self) -> u64 {
        2 * self.files + self.directories + 1024
    }
    fn volume_bytes(&self) -> u64 {
        (self.inodes() * VOLUME_BYTES_PER_INODE).max(VOLUME_BYTES_MIN)
    }
    /// "d17/f42": file `serial` of the tree whose directories are named `tree` and a number:
    /// "d" for the batch's creates (and ext4's), "e" for the single calls', so that both make
    /// files in fresh directories of the same shape.
    fn file_path(&self, tree: &str, serial: u64) -> String {
        format!("{tree}{}/f{}", serial % self.directories, serial / self.directories)
    }
    /// The same random paths for every column (a fixed xorshift sequence).
    fn random_paths(&self) -> Vec<String> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        (0..self.lookups)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                self.file_path("d", state % self.files)
            })
            .collect()
    }
}

/// Seconds of each measured operation of one column; `None` where the column does not have it.
#[derive(Default)]
struct Column {
    create: Option<f64>,
    resolve: Option<f64>,
}

pub fn run(arguments: GpuDirArguments) -> CliResult<i32> {
    let cores = std::thread::available_parallelism().map(|cores| cores.get()).unwrap_or(1);
    let threads = arguments.threads.unwrap_or(cores);
    if !(1..=THREADS_MAX).contains(&threads) {
        return Err(CliError::new(format!("--threads must be between 1 and {THREADS_MAX}")));
    }
    let shape = Shape {
        files: arguments.files,
        directories: arguments.directories.min(arguments.files),
        lookups: arguments.lookups,
        threads,
        rounds: arguments.rounds as usize,
        cold_caches: arguments.cold_caches,
    };
    println!(
        "tandem bench gpu-dir: {} directories × {} files, {} random path resolutions a round, {threads} threads beside the batch",
        format_count(shape.directories),
        format_count(shape.files / shape.directories),
        format_count(shape.lookups)
    );
    let gpu_present = match tandem_accel::cuda::probe() {
        Err(reason) => {
            println!("no GPU found ({reason}): the batch API runs on its CPU twin on {cores} cores");
            false
        }
        Ok(()) => {
            println!(
                "a GPU is present: the batch API of the mount below runs on its CPU twin on {cores} cores; the GPU directory index is measured on its own after it"
            );
            true
        }
    };
    println!(
        "tandemfs on a memory device of {}; warm-up then median of {} rounds{}",
        format_bytes(shape.volume_bytes()),
        shape.rounds,
        if shape.cold_caches { ", the front end's caches emptied before each" } else { "" }
    );

    let (batch, single) = super::contain_panic("the engine", || measure_tandemfs(shape)).map_err(CliError::new)?;
    let mut notes = Vec::new();
    let ext4 = if arguments.no_ext4 {
        notes.push("ext4 skipped (--no-ext4)".to_string());
        None
    } else if let Some(reason) = Ext4Volume::unavailable_reason() {
        notes.push(format!("ext4 skipped: {reason}"));
        None
    } else {
        match measure_ext4(shape) {
            Ok(column) => Some(column),
            Err(error) => {
                notes.push(format!("ext4 failed: {error}"));
                None
            }
        }
    };
    println!();
    print_report(shape, cores, &batch, &single, ext4.as_ref());
    for note in notes {
        println!("{note}");
    }
    if gpu_present && !arguments.no_gpu_index {
        println!();
        let rows = measure_directory_index(shape).map_err(CliError::new)?;
        print_index_against_ext4(&rows, ext4.as_ref(), shape.threads);
    }
    Ok(EXIT_SUCCESS)
}

/// The directory index on its own, GPU engine beside its CPU twin on all cores, on a tree of
/// the same shape: batch resolutions, lookups and stats, then the single-command round trips
/// (the bare doorbell, the batch protocol and the express path, each against issue 9's
/// ≤ 10 µs) and where an express resolve spends its time by the GPU's clock.
fn measure_directory_index(shape: Shape) -> Result<Vec<DirectoryBenchRow>, String> {
    let config = tandem_accel::dirindex::bench::DirectoryBenchConfig {
        directories: shape.directories as usize,
        files_per_directory: (shape.files / shape.directories) as usize,
        batch: shape.lookups as usize,
        ..Default::default()
    };
    println!(
        "the directory index on its own ({} directories × {} files, batches of {}; tandem-accel's dirindex benchmark):",
        format_count(shape.directories),
        format_count(shape.files / shape.directories),
        format_count(shape.lookups)
    );
    let (rows, notes) = super::contain_panic("the directory index", || {
        tandem_accel::dirindex::bench::run(&config).map_err(|error| error.to_string())
    })?;
    print!("{}", tandem_accel::dirindex::bench::render(&rows, &notes));
    Ok(rows)
}

/// The GPU index's batch resolutions and creates against ext4's (`stat` and `open(O_CREAT)`
/// on the same threads), with issue 9's targets.
fn print_index_against_ext4(rows: &[DirectoryBenchRow], ext4: Option<&Column>, threads: usize) {
    let gpu_rate = |prefix: &str, suffix: &str| {
        rows.iter()
            .find(|row| {
                row.engine.starts_with("gpu") && row.operation.starts_with(prefix) && row.operation.ends_with(suffix)
            })
            .and_then(|row| row.per_second)
    };
    let Some(ext4) = ext4 else {
        println!("GPU index against ext4: no ext4 column in this run");
        return;
    };
    let lines = [
        ("resolve", gpu_rate("resolve ", ", reused vector"), ext4.resolve, "stat", "≥ 75×"),
        (
            "create",
            gpu_rate("create ", " directories"),
            ext4.create,
            "open(O_CREAT)",
            "≥ 10× (the index's part of a create only)",
        ),
    ];
    for (what, gpu, ext4_seconds, call, target) in lines {
        match (gpu, ext4_seconds) {
            (Some(rate), Some(seconds)) => println!(
                "GPU index {what} against ext4 {call} on {threads} threads: {:.1}× ({} against {}); issue 9 target {target}",
                rate * seconds,
                format_rate(1.0 / rate),
                format_rate(seconds)
            ),
            _ => println!("GPU index {what} against ext4: a rate is missing (no GPU row or no ext4 row)"),
        }
    }
}

fn measure_tandemfs(shape: Shape) -> Result<(Column, Column), String> {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(shape.volume_bytes()));
    let options = FormatOptions { inode_count: Some(shape.inodes()), ..Default::default() };
    FileSystem::format(device.clone(), &options).map_err(|error| format!("mkfs: {error}"))?;
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).map_err(|error| format!("mount: {error}"))?;
    let measured = measure_on(&fs, shape);
    let home = fs.home_read_statistics();
    println!(
        "blocks of home read by lookups and stats: {} from the mirror, {} under the volume lock",
        format_count(home.mirrored_blocks),
        format_count(home.locked_blocks)
    );
    println!(
        "reads of home read again after a change of their blocks: {}, read under the volume lock whole: {}; lookups through region summaries: {}",
        format_count(home.retries),
        format_count(home.fallbacks),
        format_count(home.summarised_lookups)
    );
    let closed = fs.unmount().map_err(|error| format!("unmount: {error}"));
    let measured = measured?;
    closed?;
    Ok(measured)
}

fn measure_on(fs: &FileSystem, shape: Shape) -> Result<(Column, Column), String> {
    let directories = make_directories(fs, shape, "d")?;
    let single_directories = make_directories(fs, shape, "e")?;
    settle(fs)?;
    let names: Vec<String> = (0..shape.files).map(|serial| format!("f{}", serial / shape.directories)).collect();
    let requests: Vec<CreateRequest> = names
        .iter()
        .enumerate()
        .map(|(serial, name)| CreateRequest {
            parent: directories[serial % directories.len()],
            name: name.as_bytes(),
            file_type: FileType::Regular,
            permissions: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        })
        .collect();
    let started = Instant::now();
    let created = fs.create_batch(&requests);
    let batch_create = started.elapsed().as_secs_f64();
    if let Some((serial, Err(error))) = created.iter().enumerate().find(|(_, made)| made.is_err()) {
        return Err(format!("batch create {}: {error}", shape.file_path("d", serial as u64)));
    }
    drop(created);
    drop(requests);
    drop(names);
    settle(fs)?;

    let single_create = on_threads(shape.threads, shape.files, |serial| {
        let name = format!("f{}", serial / shape.directories);
        let parent = single_directories[(serial % shape.directories) as usize];
        fs.create(parent, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0)
            .map(|_| ())
            .map_err(|error| format!("create {}: {error}", shape.file_path("e", serial)))
    })?;

    settle(fs)?;
    let paths = shape.random_paths();
    let expected = check_answers(fs, &paths, shape.threads)?;
    let cool = || {
        if shape.cold_caches {
            fs.drop_idle_caches();
        }
    };
    let batch_round = || {
        cool();
        let started = Instant::now();
        let answers = fs.resolve_paths(&paths);
        let seconds = started.elapsed().as_secs_f64();
        // Outside the timed span: every answer is the single call's.
        match answers
            .iter()
            .zip(&expected)
            .position(|(answer, inode)| answer.as_ref().map(|found| found.inode).ok() != Some(*inode))
        {
            Some(position) => Err(format!("{}: the batch answered {:?}", paths[position], answers[position])),
            None => Ok(seconds),
        }
    };
    let single_round = || {
        cool();
        on_threads(shape.threads, shape.lookups, |position| {
            let path = &paths[position as usize];
            fs.resolve_path(path.as_bytes()).map(|_| ()).map_err(|error| format!("{path}: {error}"))
        })
    };
    let [batch_resolve, single_resolve] = median_alternating(shape.rounds, [&batch_round, &single_round])?;
    let per = |seconds: f64, count: u64| Some(seconds / count as f64);
    Ok((
        Column { create: per(batch_create, shape.files), resolve: per(batch_resolve, shape.lookups) },
        Column { create: per(single_create, shape.files), resolve: per(single_resolve, shape.lookups) },
    ))
}

/// The directories of the tree `tree` ("d0", "d1", ...), made in one `mkdir -p` batch.
fn make_directories(fs: &FileSystem, shape: Shape, tree: &str) -> Result<Vec<u64>, String> {
    let names: Vec<String> = (0..shape.directories).map(|directory| format!("{tree}{directory}")).collect();
    fs.make_directory_all_batch(&names, 0o755, 0, 0)
        .into_iter()
        .map(|made| made.map(|attributes| attributes.inode).map_err(|error| format!("mkdir: {error}")))
        .collect()
}

/// Waits until the back end has applied and checkpointed everything acknowledged, so that a
/// phase does not compete with the back end's work of the one before (a million creates take
/// the back end seconds after the front end answered them; measured first, resolutions ran at
/// half the rate they reach once it is done).
fn settle(fs: &FileSystem) -> Result<(), String> {
    fs.sync().map_err(|error| format!("sync: {error}"))?;
    fs.checkpoint().map_err(|error| format!("checkpoint: {error}"))
}

/// The inode of every path by the single call, on `threads` threads; every path must resolve.
fn check_answers(fs: &FileSystem, paths: &[String], threads: usize) -> Result<Vec<u64>, String> {
    let chunk = paths.len().div_ceil(threads.max(1));
    std::thread::scope(|scope| {
        let workers: Vec<_> = paths
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|path| {
                            fs.resolve_path(path.as_bytes())
                                .map(|found| found.inode)
                                .map_err(|error| format!("{path}: {error}"))
                        })
                        .collect::<Result<Vec<u64>, String>>()
                })
            })
            .collect();
        let mut inodes = Vec::with_capacity(paths.len());
        for worker in workers {
            inodes.extend(worker.join().map_err(|_| "a checking thread panicked".to_string())??);
        }
        Ok(inodes)
    })
}

/// Runs `operation(0..count)` split over `threads` threads in contiguous parts; the seconds
/// from the first thread's start to the last one's end (all start at a barrier).
fn on_threads(threads: usize, count: u64, operation: impl Fn(u64) -> Result<(), String> + Sync) -> Result<f64, String> {
    assert!((1..=THREADS_MAX).contains(&threads));
    let part = count.div_ceil(threads as u64);
    let barrier = Barrier::new(threads);
    let (barrier, operation) = (&barrier, &operation);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads as u64)
            .map(|thread| {
                scope.spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    let outcome = (thread * part..((thread + 1) * part).min(count)).try_for_each(operation);
                    (started, Instant::now(), outcome)
                })
            })
            .collect();
        let mut first_start: Option<Instant> = None;
        let mut last_end: Option<Instant> = None;
        for worker in workers {
            let (started, ended, outcome) = worker.join().map_err(|_| "a benchmark thread panicked".to_string())?;
            outcome?;
            first_start = Some(first_start.map_or(started, |first| first.min(started)));
            last_end = Some(last_end.map_or(ended, |last| last.max(ended)));
        }
        let (first, last) = (first_start.expect("one thread at least"), last_end.expect("one thread at least"));
        Ok(last.duration_since(first).as_secs_f64())
    })
}

/// The median of `rounds` runs of `run` after one warm-up run.
fn median(rounds: usize, mut run: impl FnMut() -> Result<f64, String>) -> Result<f64, String> {
    run()?;
    let mut samples = (0..rounds.max(1)).map(|_| run()).collect::<Result<Vec<f64>, String>>()?;
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// The median of each of `runs` over `rounds` rounds after one warm-up round, the runs taking
/// turns within each round: run in blocks, whichever came second found the caches the first
/// left and measured up to a quarter faster on a tree larger than the front end's caches.
fn median_alternating<const N: usize>(
    rounds: usize,
    runs: [&dyn Fn() -> Result<f64, String>; N],
) -> Result<[f64; N], String> {
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(rounds));
    for round in 0..=rounds.max(1) {
        for (run, kept) in runs.iter().zip(samples.iter_mut()) {
            let seconds = run()?;
            if round > 0 {
                kept.push(seconds);
            }
        }
    }
    Ok(samples.map(|mut kept| {
        kept.sort_by(f64::total_cmp);
        kept[kept.len() / 2]
    }))
}

/// `open(O_CREAT)` of the files and `stat` of the same random paths on ext4, on the threads.
fn measure_ext4(shape: Shape) -> Result<Column, String> {
    let scratch = super::scratch_directory();
    super::require_free_space(&scratch, shape.volume_bytes(), "lower --files").map_err(|error| error.to_string())?;
    let image = scratch.join(format!("tandem-bench-gpu-dir-ext4-{}.img", std::process::id()));
    let volume = Ext4Volume::create(&image, shape.volume_bytes(), shape.inodes())?;
    let root = volume.mountpoint().to_path_buf();
    for directory in 0..shape.directories {
        let path = root.join(format!("d{directory}"));
        std::fs::create_dir(&path).map_err(|error| format!("mkdir {}: {error}", path.display()))?;
    }
    let create = on_threads(shape.threads, shape.files, |serial| {
        let path = root.join(shape.file_path("d", serial));
        std::fs::File::create(&path).map(drop).map_err(|error| format!("create {}: {error}", path.display()))
    })?;
    // As for tandemfs: the stats do not compete with the creates' writeback and journal.
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let paths: Vec<std::path::PathBuf> = shape.random_paths().iter().map(|path| root.join(path)).collect();
    let resolve = median(shape.rounds, || {
        on_threads(shape.threads, shape.lookups, |position| {
            let path = &paths[position as usize];
            std::fs::symlink_metadata(path).map(drop).map_err(|error| format!("stat {}: {error}", path.display()))
        })
    })?;
    drop(volume);
    Ok(Column { create: Some(create / shape.files as f64), resolve: Some(resolve / shape.lookups as f64) })
}

fn print_report(shape: Shape, cores: usize, batch: &Column, single: &Column, ext4: Option<&Column>) {
    let batch_label = format!("batch API (CPU twin, {cores} cores)");
    let single_label = format!("single calls ({} threads)", shape.threads);
    let ext4_label = format!("ext4 ({} threads)", shape.threads);
    let headers = [
        "operation",
        batch_label.as_str(),
        single_label.as_str(),
        ext4_label.as_str(),
        "batch vs single",
        "batch vs ext4",
        "issue 9 target (GPU)",
    ];
    let cell = |seconds: Option<f64>| seconds.map_or_else(|| "-".to_string(), format_rate);
    let ratio = |ours: Option<f64>, theirs: Option<f64>| match (ours, theirs) {
        (Some(ours), Some(theirs)) => format_ratio(ours, theirs),
        _ => "-".to_string(),
    };
    let ext4_of = |pick: fn(&Column) -> Option<f64>| ext4.and_then(pick);
    let rows = vec![
        vec![
            format!("resolve path ({} random)", format_count(shape.lookups)),
            cell(batch.resolve),
            cell(single.resolve),
            cell(ext4_of(|column| column.resolve)),
            ratio(batch.resolve, single.resolve),
            ratio(batch.resolve, ext4_of(|column| column.resolve)),
            "≥100 M/s, ≥75× ext4".to_string(),
        ],
        vec![
            format!("create ({} into {} dirs)", format_count(shape.files), format_count(shape.directories)),
            cell(batch.create),
            cell(single.create),
            cell(ext4_of(|column| column.create)),
            ratio(batch.create, single.create),
            ratio(batch.create, ext4_of(|column| column.create)),
            "≥10× ext4".to_string(),
        ],
    ];
    print_table(&headers, &rows);
    println!("(every batch answer equals the single call's; the single-command round trips are the GPU index's rows, where a GPU is present)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_measures_both_tandemfs_columns_and_checks_the_answers() {
        let shape = Shape { files: 2_000, directories: 7, lookups: 3_000, threads: 3, rounds: 1, cold_caches: true };
        let (batch, single) = measure_tandemfs(shape).unwrap();
        for seconds in [batch.create, batch.resolve, single.create, single.resolve] {
            assert!(seconds.is_some_and(|seconds| seconds > 0.0 && seconds.is_finite()));
        }
    }

    #[test]
    fn paths_name_files_the_batch_made() {
        let shape = Shape { files: 1_000, directories: 7, lookups: 10_000, threads: 1, rounds: 1, cold_caches: false };
        let made: std::collections::HashSet<String> =
            (0..shape.files).map(|serial| shape.file_path("d", serial)).collect();
        assert_eq!(made.len(), 1_000);
        let paths = shape.random_paths();
        assert!(paths.iter().all(|path| made.contains(path)));
        assert!(paths.iter().collect::<std::collections::HashSet<_>>().len() > 900, "the picks cover the tree");
    }
}
