//! `tandem bench meta --threads 1,2,4,8,16`: how create, stat and unlink scale with threads,
//! through the tandemfs library on a file in /dev/shm and through system calls on ext4 over a
//! loop device on the same medium. Two layouts: every thread in its own directory, and all
//! threads in one shared directory. Each phase starts all threads at a barrier and ends when
//! the last one finishes; the rate is the operations of all threads over that wall time.

use super::ext4::Ext4Volume;
use super::table::print_table;
use crate::size::format_count;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Instant;
use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
use tandemfs::fs::{BackendStatistics, FileType, FormatOptions, MountOptions, ROOT_INODE};
use tandemfs::FileSystem;

/// Most threads a run may ask for: a bound on what the table and the volumes are sized for.
pub const THREADS_MAX: usize = 256;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layout {
    /// Each thread works in a directory of its own.
    Private,
    /// All threads work in one directory.
    Shared,
}

impl Layout {
    fn label(self) -> &'static str {
        match self {
            Layout::Private => "own directory per thread",
            Layout::Shared => "one shared directory",
        }
    }
}

/// Seconds each phase took, for one thread count, and the machine's busy CPU seconds during it
/// (/proc/stat, all CPUs: the back end's workers and, for ext4, the kernel's own threads count
/// too; 0 where /proc/stat cannot be read).
#[derive(Clone, Copy, Default)]
pub struct PhaseSeconds {
    create: f64,
    stat: f64,
    unlink: f64,
    create_cpu: f64,
    stat_cpu: f64,
    unlink_cpu: f64,
}

/// Each phase's (start, end), and the machine's busy CPU seconds at its start and end (read by
/// thread 0 only; zeros in the others).
type ThreadSpans = ([(Instant, Instant); 3], [(f64, f64); 3]);
/// Picks one phase's (wall seconds, CPU seconds) out of a row.
type PhasePick = fn(&PhaseSeconds) -> (f64, f64);

/// What a thread does to one file system: the three operations on names it is given.
trait Target: Send + Sync {
    /// Prepares the directory a thread works in; returns its handle for the other calls.
    fn directory(&self, name: &str) -> Result<u64, String>;
    fn create(&self, directory: u64, name: &str) -> Result<(), String>;
    fn stat(&self, directory: u64, name: &str) -> Result<(), String>;
    fn unlink(&self, directory: u64, name: &str) -> Result<(), String>;
}

struct Library {
    fs: FileSystem,
}

impl Target for Library {
    fn directory(&self, name: &str) -> Result<u64, String> {
        match self.fs.make_directory(ROOT_INODE, name.as_bytes(), 0o755, 0, 0) {
            Ok(attributes) => Ok(attributes.inode),
            Err(tandemfs::Error::Exists) => self.fs.lookup(ROOT_INODE, name.as_bytes()).map(|a| a.inode).map_err(text),
            Err(error) => Err(text(error)),
        }
    }
    fn create(&self, directory: u64, name: &str) -> Result<(), String> {
        self.fs.create(directory, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).map(drop).map_err(text)
    }
    fn stat(&self, directory: u64, name: &str) -> Result<(), String> {
        self.fs.lookup(directory, name.as_bytes()).map(drop).map_err(text)
    }
    fn unlink(&self, directory: u64, name: &str) -> Result<(), String> {
        self.fs.unlink(directory, name.as_bytes()).map_err(text)
    }
}

/// The most directory handles one ext4 volume hands out (one per thread and round, or one
/// shared per round).
const SYSTEM_DIRECTORIES_MAX: usize = 4096;

/// ext4 through system calls; directory handles index `directories`, which are set before the
/// phases and only read during them: no lock per operation (a mutex here put every thread's
/// every call behind one lock and held ext4 back at 16 threads).
struct System {
    root: PathBuf,
    directories: Vec<std::sync::OnceLock<PathBuf>>,
    directory_count: std::sync::atomic::AtomicUsize,
}

impl System {
    fn new(root: PathBuf) -> System {
        System {
            root,
            directories: (0..SYSTEM_DIRECTORIES_MAX).map(|_| std::sync::OnceLock::new()).collect(),
            directory_count: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn path(&self, directory: u64, name: &str) -> PathBuf {
        self.directories[directory as usize].get().expect("directory handed out by `directory`").join(name)
    }
}

impl Target for System {
    fn directory(&self, name: &str) -> Result<u64, String> {
        let path = self.root.join(name);
        if !path.is_dir() {
            std::fs::create_dir(&path).map_err(|error| format!("mkdir {}: {error}", path.display()))?;
        }
        let index = self.directory_count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if index >= SYSTEM_DIRECTORIES_MAX {
            return Err(format!("more than {SYSTEM_DIRECTORIES_MAX} directories"));
        }
        self.directories[index].set(path).expect("each index is handed out once");
        Ok(index as u64)
    }
    fn create(&self, directory: u64, name: &str) -> Result<(), String> {
        std::fs::File::create(self.path(directory, name)).map(drop).map_err(text)
    }
    fn stat(&self, directory: u64, name: &str) -> Result<(), String> {
        std::fs::symlink_metadata(self.path(directory, name)).map(drop).map_err(text)
    }
    fn unlink(&self, directory: u64, name: &str) -> Result<(), String> {
        std::fs::remove_file(self.path(directory, name)).map_err(text)
    }
}

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// The size of one measurement: threads, files per thread, stat passes.
#[derive(Clone, Copy)]
struct Shape {
    threads: usize,
    files_per_thread: u64,
    stat_passes: u64,
    /// Print every round's rates as it ends (a median hides a collapse in later rounds).
    each_round: bool,
}

/// Runs the three phases with `threads` threads of `files_per_thread` files each; the stat
/// phase stats every file `stat_passes` times and reports the time of one pass.
fn run_phases(target: Arc<dyn Target>, shape: Shape, layout: Layout, round: usize) -> Result<PhaseSeconds, String> {
    let Shape { threads, files_per_thread, stat_passes, .. } = shape;
    assert!((1..=THREADS_MAX).contains(&threads));
    assert!(stat_passes >= 1);
    let shared = match layout {
        Layout::Shared => Some(target.directory(&format!("shared-{threads}-{round}"))?),
        Layout::Private => None,
    };
    let mut directories = Vec::with_capacity(threads);
    for thread in 0..threads {
        directories.push(match shared {
            Some(directory) => directory,
            None => target.directory(&format!("private-{threads}-{round}-{thread}"))?,
        });
    }
    // Two barriers per phase, start and end: every thread waits at each. Each thread takes its
    // own start and end times; a phase lasts from the first start to the last end. (A timer
    // thread taking the start after the barrier could be scheduled after the workers had
    // finished a short phase: it measured 6.6 billion stats a second on the 2-core VM.)
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let (target, barrier, directory) = (target.clone(), barrier.clone(), directories[thread]);
            std::thread::spawn(move || -> Result<ThreadSpans, String> {
                // The names are made before the phases: formatting one per operation cost as
                // much as a tandemfs lookup (about 10% of a 16-thread stat phase's samples on
                // the host), harness work that both systems paid inside their timed spans.
                let names: Vec<String> = (0..files_per_thread).map(|serial| format!("t{thread}-f{serial}")).collect();
                let name = |serial: u64| names[serial as usize].as_str();
                let phases: [&dyn Fn(u64) -> Result<(), String>; 3] = [
                    &|serial| target.create(directory, name(serial)),
                    &|serial| target.stat(directory, name(serial)),
                    &|serial| target.unlink(directory, name(serial)),
                ];
                let mut outcome = Ok(());
                let mut spans = [(Instant::now(), Instant::now()); 3];
                // Thread 0 reads the machine's CPU time as each phase starts and ends.
                let mut busy = [(0.0f64, 0.0f64); 3];
                let busy_now = || if thread == 0 { super::cpu::machine_busy_seconds().unwrap_or(0.0) } else { 0.0 };
                for (index, ((phase, span), busy)) in
                    phases.iter().zip(spans.iter_mut()).zip(busy.iter_mut()).enumerate()
                {
                    barrier.wait();
                    busy.0 = busy_now();
                    let started = Instant::now();
                    let passes = if index == 1 { stat_passes } else { 1 };
                    for _ in 0..passes {
                        if outcome.is_ok() {
                            outcome = (0..files_per_thread).try_for_each(phase);
                        }
                    }
                    *span = (started, Instant::now());
                    barrier.wait();
                    busy.1 = busy_now();
                }
                outcome.map(|()| (spans, busy))
            })
        })
        .collect();
    let mut spans: Vec<[(Instant, Instant); 3]> = Vec::with_capacity(threads);
    let mut busy = [(0.0f64, 0.0f64); 3];
    for (thread, worker) in workers.into_iter().enumerate() {
        let (thread_spans, thread_busy) = worker.join().map_err(|_| "a benchmark thread panicked".to_string())??;
        spans.push(thread_spans);
        if thread == 0 {
            busy = thread_busy;
        }
    }
    let cpu = |phase: usize| (busy[phase].1 - busy[phase].0).max(0.0);
    let seconds = |phase: usize| {
        let first_start = spans.iter().map(|span| span[phase].0).min().expect("at least one thread");
        let last_end = spans.iter().map(|span| span[phase].1).max().expect("at least one thread");
        last_end.duration_since(first_start).as_secs_f64()
    };
    Ok(PhaseSeconds {
        create: seconds(0),
        stat: seconds(1) / stat_passes as f64,
        unlink: seconds(2),
        create_cpu: cpu(0),
        stat_cpu: cpu(1) / stat_passes as f64,
        unlink_cpu: cpu(2),
    })
}

/// The median of each phase over `rounds` (after one warm-up round).
fn measure(target: Arc<dyn Target>, shape: Shape, layout: Layout, rounds: usize) -> Result<PhaseSeconds, String> {
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..=rounds {
        let seconds = run_phases(target.clone(), shape, layout, round)?;
        if shape.each_round {
            let per_second = |seconds: f64| format_per_second(rate(shape.threads, shape.files_per_thread, seconds));
            println!(
                "  {} threads, round {round}{}: create {}/s, stat {}/s, unlink {}/s",
                shape.threads,
                if round == 0 { " (warm-up)" } else { "" },
                per_second(seconds.create),
                per_second(seconds.stat),
                per_second(seconds.unlink)
            );
        }
        if round > 0 {
            samples.push(seconds);
        }
    }
    let median = |pick: fn(&PhaseSeconds) -> f64| {
        let mut values: Vec<f64> = samples.iter().map(pick).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    Ok(PhaseSeconds {
        create: median(|s| s.create),
        stat: median(|s| s.stat),
        unlink: median(|s| s.unlink),
        create_cpu: median(|s| s.create_cpu),
        stat_cpu: median(|s| s.stat_cpu),
        unlink_cpu: median(|s| s.unlink_cpu),
    })
}

/// Rows of one layout: per thread count, tandemfs and ext4 rates and their ratios.
pub struct ScalingRun {
    pub threads: Vec<usize>,
    /// The layouts to measure, in order.
    pub layouts: Vec<Layout>,
    pub files_per_thread: u64,
    /// How many times each thread stats each of its files; the stat phase is reported per pass.
    pub stat_passes: u64,
    /// The back end's apply workers (0: the mount's default, half the cores, at least 2).
    pub backend_workers: usize,
    /// The mount option `backlog_image_logs`.
    pub backlog_image_logs: u64,
    pub rounds: usize,
    /// Print every round's rates, the warm-up's included.
    pub each_round: bool,
    /// Inodes of both file systems instead of the default (`inodes`).
    pub inode_count: Option<u64>,
    pub volume_bytes: u64,
    pub scratch: PathBuf,
    pub with_ext4: bool,
}

fn library_target(
    image: &Path,
    volume_bytes: u64,
    inodes: u64,
    backend_workers: usize,
    backlog_image_logs: u64,
) -> Result<(Arc<Library>, FileSystem), String> {
    let options = FileDeviceOptions { create_size_bytes: Some(volume_bytes), lock_exclusive: true, read_only: false };
    let device: Arc<dyn Device> = Arc::new(
        FileDevice::open(image, options).map_err(|error| format!("cannot create {}: {error}", image.display()))?,
    );
    let format = FormatOptions { inode_count: Some(inodes), ..Default::default() };
    FileSystem::format(device.clone(), &format).map_err(|error| format!("mkfs: {error}"))?;
    let options = MountOptions { backend_workers, backlog_image_logs, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device, &options).map_err(|error| format!("mount: {error}"))?;
    Ok((Arc::new(Library { fs: fs.clone() }), fs))
}

impl ScalingRun {
    /// Inodes for both file systems: every round's files once over, and a round more. A
    /// number freed by an unlink is reusable only once the back end has applied the unlink, so
    /// while it works through a backlog the rounds' files hold numbers side by side; with
    /// twice one round's files (as before) the table was full from the third round on, and 16
    /// threads then measured the search for free numbers (creates fell from 600k/s to 90k/s on
    /// the host) rather than creates.
    fn inodes(&self) -> u64 {
        if let Some(count) = self.inode_count {
            return count;
        }
        let most = *self.threads.iter().max().unwrap_or(&1) as u64;
        let rounds = self.rounds as u64 + 1;
        most * self.files_per_thread * (rounds + 1) + 64 * rounds * (most + 1) + 4096
    }

    /// Measures every thread count for one layout on a fresh tandemfs and a fresh ext4.
    fn measure_layout(&self, layout: Layout) -> Result<(Rows, BackendStatistics), String> {
        let image =
            super::ScratchFile { path: self.scratch.join(format!("tandem-scaling-{}.img", std::process::id())) };
        let (library, fs) = library_target(
            &image.path,
            self.volume_bytes,
            self.inodes(),
            self.backend_workers,
            self.backlog_image_logs,
        )?;
        let ext4 = if self.with_ext4 {
            let path = self.scratch.join(format!("tandem-scaling-ext4-{}.img", std::process::id()));
            let volume = Ext4Volume::create(&path, self.volume_bytes, self.inodes())?;
            let system = Arc::new(System::new(volume.mountpoint().to_path_buf()));
            Some((volume, system))
        } else {
            None
        };
        let mut rows = Vec::new();
        for &threads in &self.threads {
            let shape = Shape {
                threads,
                files_per_thread: self.files_per_thread,
                stat_passes: self.stat_passes,
                each_round: self.each_round,
            };
            let ours = measure(library.clone(), shape, layout, self.rounds)?;
            let theirs = match &ext4 {
                Some((_, system)) => Some(measure(system.clone(), shape, layout, self.rounds)?),
                None => None,
            };
            rows.push((threads, ours, theirs));
        }
        let statistics = fs.backend_statistics();
        fs.unmount().map_err(|error| format!("unmount: {error}"))?;
        drop(ext4);
        drop(image);
        Ok((rows, statistics))
    }

    pub fn run(&self) -> Result<(), String> {
        println!(
            "thread scaling: {} files per thread{}, threads {:?}, {} back-end workers, warm-up then median of {} round{}; medium {}",
            format_count(self.files_per_thread),
            match self.stat_passes {
                1 => String::new(),
                passes => format!(" (each stat'ed {passes} times; stat rates per pass)"),
            },
            self.threads,
            match self.backend_workers {
                0 => tandemfs::backend::parallel::default_workers(),
                count => count,
            },
            self.rounds,
            if self.rounds == 1 { "" } else { "s" },
            self.scratch.display()
        );
        for &layout in &self.layouts {
            let (rows, statistics) = self.measure_layout(layout)?;
            println!("\n{}:", layout.label());
            print_layout(&rows, self.files_per_thread);
            print_cpu(&rows, self.files_per_thread);
            print_backend(&statistics);
        }
        if !self.with_ext4 {
            println!("ext4 skipped");
        }
        Ok(())
    }
}

/// Rows of one layout: thread count, tandemfs's phases and ext4's.
type Rows = Vec<(usize, PhaseSeconds, Option<PhaseSeconds>)>;

/// How the back end applied the layout's records: side by side or with the volume held.
fn print_backend(statistics: &BackendStatistics) {
    let groups_per_batch = match statistics.parallel_batches {
        0 => 0.0,
        batches => statistics.parallel_groups as f64 / batches as f64,
    };
    println!(
        "back end: {} workers; {} records applied side by side in {} batches ({:.1} groups each, {:.1} workers busy; of their busy time {:.2} s waiting for the volume lock, {:.2} s holding it, {} takes), {} with the volume held; {} checkpoints ({} beside the passes; passes stopped {:.2} s for them); applying {:.2} s; {} drains waited {:.2} s, {} waits for room {:.2} s; front end took the volume lock {} times, waited {:.2} s, held it {:.2} s",
        statistics.workers,
        format_count(statistics.parallel_records),
        format_count(statistics.parallel_batches),
        groups_per_batch,
        statistics.worker_busy_ns as f64 / statistics.parallel_ns.max(1) as f64,
        statistics.worker_lock_wait_ns as f64 / 1e9,
        statistics.worker_lock_held_ns as f64 / 1e9,
        format_count(statistics.worker_lock_takes),
        format_count(statistics.held_records),
        statistics.checkpoints,
        statistics.checkpoints_beside,
        statistics.checkpoint_ns as f64 / 1e9,
        statistics.apply_ns as f64 / 1e9,
        format_count(statistics.drains),
        statistics.drain_ns as f64 / 1e9,
        format_count(statistics.room_waits),
        statistics.room_wait_ns as f64 / 1e9,
        format_count(statistics.front_lock_takes),
        statistics.front_lock_wait_ns as f64 / 1e9,
        statistics.front_lock_held_ns as f64 / 1e9
    );
    print_peak_resident();
}

/// The most memory this process has held resident so far (VmHWM in /proc/self/status): what
/// the pending changes of a backlog cost, beside the caches' bounds.
fn print_peak_resident() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let peak_kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    if let Some(peak_kib) = peak_kib {
        println!("peak resident memory of this process so far: {} MiB", peak_kib / 1024);
    }
}

fn rate(threads: usize, files_per_thread: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    threads as f64 * files_per_thread as f64 / seconds
}

fn format_per_second(per_second: f64) -> String {
    if per_second <= 0.0 {
        return "-".into();
    }
    if per_second >= 1e6 {
        format!("{:.2}M", per_second / 1e6)
    } else {
        format!("{:.0}k", per_second / 1e3)
    }
}

fn ratio(ours: f64, theirs: f64) -> String {
    if ours <= 0.0 || theirs <= 0.0 {
        return "-".into();
    }
    format!("{:.2}×", ours / theirs)
}

fn print_layout(rows: &[(usize, PhaseSeconds, Option<PhaseSeconds>)], files_per_thread: u64) {
    let headers = [
        "threads",
        "create/s",
        "ext4",
        "ratio",
        "vs 1 thread",
        "stat/s",
        "ext4",
        "ratio",
        "vs 1 thread",
        "unlink/s",
        "ext4",
        "ratio",
        "vs 1 thread",
    ];
    let single = rows.iter().find(|(threads, _, _)| *threads == 1).map(|(_, ours, _)| *ours);
    let mut table = Vec::new();
    for (threads, ours, theirs) in rows {
        let mut row = vec![threads.to_string()];
        let phases: [fn(&PhaseSeconds) -> f64; 3] = [|s| s.create, |s| s.stat, |s| s.unlink];
        for pick in phases {
            let ours_rate = rate(*threads, files_per_thread, pick(ours));
            let theirs_rate = theirs.as_ref().map_or(0.0, |theirs| rate(*threads, files_per_thread, pick(theirs)));
            let single_rate = single.as_ref().map_or(0.0, |single| rate(1, files_per_thread, pick(single)));
            row.push(format_per_second(ours_rate));
            row.push(format_per_second(theirs_rate));
            row.push(ratio(ours_rate, theirs_rate));
            row.push(ratio(ours_rate, single_rate));
        }
        table.push(row);
    }
    print_table(&headers, &table);
}

/// Where the CPU went: for each phase, how many cores were busy on average (the whole machine's
/// busy time over the phase's wall time) and the machine's CPU microseconds per operation. A
/// phase that keeps every core busy is bound by its CPU cost per operation; one that leaves
/// cores idle is bound by waiting.
fn print_cpu(rows: &[(usize, PhaseSeconds, Option<PhaseSeconds>)], files_per_thread: u64) {
    let headers = [
        "threads",
        "create cores",
        "µs CPU",
        "ext4 cores",
        "µs CPU",
        "stat cores",
        "µs CPU",
        "ext4 cores",
        "µs CPU",
        "unlink cores",
        "µs CPU",
        "ext4 cores",
        "µs CPU",
    ];
    let cell = |seconds: f64, cpu: f64, operations: f64| -> [String; 2] {
        // /proc/stat counts in ticks of 10 ms: a shorter phase gives no useful number.
        if seconds < 0.1 || cpu <= 0.0 {
            return ["-".into(), "-".into()];
        }
        [format!("{:.1}", cpu / seconds), format!("{:.1}", cpu * 1e6 / operations)]
    };
    let mut table = Vec::new();
    for (threads, ours, theirs) in rows {
        let operations = *threads as f64 * files_per_thread as f64;
        let mut row = vec![threads.to_string()];
        let phases: [PhasePick; 3] =
            [|s| (s.create, s.create_cpu), |s| (s.stat, s.stat_cpu), |s| (s.unlink, s.unlink_cpu)];
        for pick in phases {
            let (seconds, cpu) = pick(ours);
            row.extend(cell(seconds, cpu, operations));
            let (seconds, cpu) = theirs.as_ref().map_or((0.0, 0.0), pick);
            row.extend(cell(seconds, cpu, operations));
        }
        table.push(row);
    }
    println!("CPU (whole machine, /proc/stat):");
    print_table(&headers, &table);
}

/// Parses "1,2,4,8,16".
pub fn parse_threads(text: &str) -> Result<Vec<usize>, String> {
    let mut threads = Vec::new();
    for part in text.split(',') {
        let count: usize = part.trim().parse().map_err(|_| format!("{part:?} is not a thread count"))?;
        if !(1..=THREADS_MAX).contains(&count) {
            return Err(format!("thread count {count} is outside 1..={THREADS_MAX}"));
        }
        threads.push(count);
    }
    if threads.is_empty() {
        return Err("no thread counts".into());
    }
    Ok(threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_lists_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_threads("1,2, 16").unwrap(), vec![1, 2, 16]);
        assert!(parse_threads("0").is_err());
        assert!(parse_threads("1,x").is_err());
        assert!(parse_threads("1000").is_err());
    }

    #[test]
    fn both_layouts_run_on_the_library() {
        let directory = std::env::temp_dir().join(format!("tandem-scaling-test-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let image = directory.join("v.img");
        let (library, fs) = library_target(&image, 64 << 20, 8192, 2, tandemfs::log::BACKLOG_CHECKPOINTS).unwrap();
        for layout in [Layout::Private, Layout::Shared] {
            let shape = Shape { threads: 3, files_per_thread: 200, stat_passes: 2, each_round: true };
            let seconds = measure(library.clone(), shape, layout, 1).unwrap();
            assert!(seconds.create > 0.0 && seconds.stat > 0.0 && seconds.unlink > 0.0);
        }
        // Every file made was removed again: only the directories are left.
        let mut names = 0;
        fs.read_directory(ROOT_INODE, 0, &mut |_| {
            names += 1;
            true
        })
        .unwrap();
        assert!(names <= 2 * (3 + 1) + 2, "{names} entries left in the root");
        fs.unmount().unwrap();
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
