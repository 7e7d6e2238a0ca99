//! `tandem bench memory`: what the front end's caches cost as files and threads grow. T threads
//! create files, each in a directory of its own, on a volume in a file (in /dev/shm when it
//! exists), in steps; after each step the back end is drained and checkpointed, and the table
//! shows the process's resident memory, the views and names cached and the bytes of their
//! tables. The caches are bounded, so resident memory must level off once they are full,
//! however many files and threads there are. The last lines give the bytes per cached view and
//! per cached name, from the tables and from the growth of resident memory.

use super::scaling::THREADS_MAX;
use super::table::print_table;
use super::ScratchFile;
use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::size::{format_bytes, format_count, parse_nonzero_size};
use clap::Args;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
use tandemfs::fs::{CacheStatistics, FileType, FormatOptions, MountOptions, ROOT_INODE};
use tandemfs::FileSystem;

/// Most steps a run may ask for (rows of the table).
const STEPS_MAX: u64 = 64;

#[derive(Args)]
pub struct MemoryBenchArguments {
    /// Files created in all, over every thread
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    pub files: u64,
    /// Threads creating them, each in its own directory
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=THREADS_MAX as u64))]
    pub threads: u64,
    /// Steps after which memory is measured
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=STEPS_MAX))]
    pub steps: u64,
    /// Size of the volume
    #[arg(long, value_parser = parse_nonzero_size, default_value = "8G")]
    pub size: u64,
    /// Directory for the volume's file (default: /dev/shm when it exists, else the temporary
    /// directory)
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Resident memory of this process, from /proc/self/statm (pages × page size).
fn resident_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the running system.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * page_bytes.max(1) as u64)
}

struct Sample {
    files: u64,
    resident_bytes: u64,
    caches: CacheStatistics,
}

fn create_step(fs: &FileSystem, directories: &[u64], first: u64, count_per_thread: u64) -> CliResult<()> {
    let barrier = Arc::new(Barrier::new(directories.len()));
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = directories
            .iter()
            .map(|&directory| {
                let barrier = barrier.clone();
                scope.spawn(move || {
                    barrier.wait();
                    for serial in first..first + count_per_thread {
                        let name = format!("file-{serial:09}");
                        fs.create(directory, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0)
                            .map_err(|error| format!("create {name}: {error}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
    });
    results.into_iter().collect::<Result<(), String>>().map_err(CliError::new)
}

fn sample(fs: &FileSystem, files: u64) -> CliResult<Sample> {
    // Drained and checkpointed: what remains is the caches, not the backlog.
    fs.checkpoint().map_err(|error| CliError::new(format!("checkpoint: {error}")))?;
    let resident_bytes = resident_bytes().ok_or_else(|| CliError::new("cannot read /proc/self/statm"))?;
    Ok(Sample { files, resident_bytes, caches: fs.cache_statistics() })
}

pub fn run(arguments: MemoryBenchArguments) -> CliResult<i32> {
    let scratch = arguments.dir.clone().unwrap_or_else(super::scratch_directory);
    super::require_free_space(&scratch, arguments.size, "use --size or --dir")?;
    let per_step_per_thread = (arguments.files / arguments.steps / arguments.threads).max(1);
    let image = ScratchFile { path: scratch.join(format!("tandem-memory-{}.img", std::process::id())) };
    let options = FileDeviceOptions { create_size_bytes: Some(arguments.size), lock_exclusive: true, read_only: false };
    let device: Arc<dyn Device> = Arc::new(
        FileDevice::open(&image.path, options)
            .map_err(|error| CliError::new(format!("cannot create {}: {error}", image.path.display())))?,
    );
    let inodes = per_step_per_thread * arguments.steps * arguments.threads + arguments.threads + 4096;
    let format = FormatOptions { inode_count: Some(inodes), ..Default::default() };
    FileSystem::format(device.clone(), &format).map_err(|error| CliError::new(format!("mkfs: {error}")))?;
    let before_mount = resident_bytes().unwrap_or(0);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default())
        .map_err(|error| CliError::new(format!("mount: {error}")))?;
    let directories: Vec<u64> = (0..arguments.threads)
        .map(|thread| fs.make_directory(ROOT_INODE, format!("thread-{thread}").as_bytes(), 0o755, 0, 0))
        .map(|made| made.map(|attributes| attributes.inode))
        .collect::<Result<_, _>>()
        .map_err(|error| CliError::new(format!("mkdir: {error}")))?;
    println!(
        "tandem bench memory: {} threads create {} files in {} steps, each in its own directory; volume of {} in {}",
        arguments.threads,
        format_count(per_step_per_thread * arguments.steps * arguments.threads),
        arguments.steps,
        format_bytes(arguments.size),
        scratch.display()
    );
    let mut samples = vec![sample(&fs, 0)?];
    for step in 0..arguments.steps {
        create_step(&fs, &directories, step * per_step_per_thread, per_step_per_thread)?;
        samples.push(sample(&fs, (step + 1) * per_step_per_thread * arguments.threads)?);
    }
    fs.unmount().map_err(|error| CliError::new(format!("unmount: {error}")))?;
    print_samples(&samples, before_mount);
    Ok(EXIT_SUCCESS)
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

fn print_samples(samples: &[Sample], before_mount: u64) {
    let header = ["files", "resident MiB", "views", "view tables MiB", "names", "name tables MiB"];
    let rows: Vec<Vec<String>> = samples
        .iter()
        .map(|sample| {
            vec![
                format_count(sample.files),
                mib(sample.resident_bytes),
                format_count(sample.caches.views),
                mib(sample.caches.view_table_bytes),
                format_count(sample.caches.names),
                mib(sample.caches.name_table_bytes + sample.caches.name_heap_bytes),
            ]
        })
        .collect();
    print_table(&header, &rows);
    let last = samples.last().expect("at least the sample before the first step");
    let per = |bytes: u64, count: u64| bytes.checked_div(count).unwrap_or(0);
    println!(
        "\nper cached view: {} bytes of table slot; per cached name: {} bytes of table slot (+{} on the heap on average)",
        per(last.caches.view_table_bytes, last.caches.views),
        per(last.caches.name_table_bytes, last.caches.names),
        per(last.caches.name_heap_bytes, last.caches.names),
    );
    // Resident growth over the steps in which both caches only grew: per file (a view and a
    // name each), including what the tables' spare capacity and the volume's cache add.
    let first = &samples[0];
    let growing = samples
        .iter()
        .rev()
        .find(|sample| sample.caches.views >= sample.files && sample.caches.names >= sample.files && sample.files > 0);
    if let Some(sample) = growing {
        println!(
            "resident growth while every file was cached: {} bytes per file (view + name + their share of the block cache), over {} files",
            sample.resident_bytes.saturating_sub(first.resident_bytes) / sample.files,
            format_count(sample.files)
        );
    }
    println!("resident before mount {} MiB; at the end {} MiB", mib(before_mount), mib(last.resident_bytes));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_counts_every_file_in_the_caches() {
        let dir = std::env::temp_dir();
        let image = ScratchFile { path: dir.join(format!("tandem-memory-test-{}.img", std::process::id())) };
        let options = FileDeviceOptions { create_size_bytes: Some(256 << 20), lock_exclusive: true, read_only: false };
        let device: Arc<dyn Device> = Arc::new(FileDevice::open(&image.path, options).unwrap());
        FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
        let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
        let directories: Vec<u64> = (0..3)
            .map(|thread| fs.make_directory(ROOT_INODE, format!("t{thread}").as_bytes(), 0o755, 0, 0).unwrap().inode)
            .collect();
        create_step(&fs, &directories, 0, 500).unwrap();
        let measured = sample(&fs, 1500).unwrap();
        // Every file and directory made in this mount is cached (far below the bounds), and the
        // tables hold at least a slot per entry.
        assert!(measured.caches.views >= 1500, "{:?}", measured.caches);
        assert!(measured.caches.names >= 1500, "{:?}", measured.caches);
        assert!(measured.caches.view_table_bytes >= measured.caches.views * 64);
        assert!(measured.resident_bytes > 0);
        fs.unmount().unwrap();
    }
}
