//! `tandem`: the command-line front of tandemfs. It formats, checks, inspects and mounts volumes,
//! edits files in place with byte-granular insert and collapse, shows a demo and measures.
//!
//! Every failure becomes one line on stderr and an exit code from `error.rs`; nothing here may
//! panic on bad input, because scripts and the test suite read both.

mod array;
mod bench;
mod commands;
mod control;
mod error;
mod fuse_api;
mod image;
mod interrupt;
mod mountinfo;
mod secret;
mod size;

use clap::{Args, Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use error::{CliResult, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_SUCCESS};

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "tandemfs: a log-structured user-space file system with byte-granular insert and collapse",
    long_about = None,
    after_help = "Exit codes: 0 success; 1 fsck found (or repaired) problems; 2 bad usage or the command could not do its work;\n\
                  4 fsck --repair left problems it could not repair.\n\
                  Sizes take binary units: 4096, 512K, 512M, 2G, 1T."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a tandemfs volume on an image file (created if missing) or a block device
    Mkfs(commands::mkfs::MkfsArguments),
    /// Check a volume that is not mounted, or repair it (--repair); exit 0 when clean, 1 with one problem per line
    Fsck(commands::fsck::FsckArguments),
    /// Show a volume's geometry, usage and log state
    Stat(commands::stat::StatArguments),
    /// Show an erasure-coded array's shape and each member's health (exit 1 when degraded)
    Status(array::StatusArguments),
    /// Check every stripe's parity of an unmounted array against its data (--repair rewrites wrong blocks)
    Scrub(array::ScrubArguments),
    /// Rebuild a missing slot of an array onto a new device, mounted (through its mount) or not
    Rebuild(array::RebuildArguments),
    /// Add, remove or change a passphrase or key file of an encrypted volume (its key slots)
    Key(commands::key::KeyArguments),
    /// Mount a volume with FUSE (foreground, or in the background with -d)
    Mount(commands::mount::MountArguments),
    /// Unmount a tandemfs mount and wait until its volume is flushed and closed
    #[command(alias = "unmount")]
    Umount(commands::mount::UmountArguments),
    /// Insert bytes into a file on a mounted tandemfs, shifting later bytes up
    Insert(commands::edit::InsertArguments),
    /// Remove bytes from a file on a mounted tandemfs, shifting later bytes down
    Collapse(commands::edit::CollapseArguments),
    /// Compact a fragmented file on a mounted tandemfs into whole blocks, and report the space it
    /// holds against the bytes it maps
    Defrag(commands::edit::DefragArguments),
    /// Create ./tandem.img if missing, mount it and show what tandemfs does
    Demo(commands::demo::DemoArguments),
    /// Measure tandemfs against ext4 on the same medium
    Bench(BenchArguments),
}

#[derive(Args)]
struct BenchArguments {
    #[command(subcommand)]
    which: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Metadata and durable appends through the library (no FUSE), beside ext4 on a loop device
    Meta(bench::meta::MetaArguments),
    /// The same workload and large sequential I/O through a FUSE mount, beside ext4
    Mount(bench::mount::MountBenchArguments),
    /// Appends to the operation log from many threads, with and without fsync
    Log(bench::log::LogBenchArguments),
    /// Memory of the front end's caches as files and threads grow (bounded caches level off)
    Memory(bench::memory::MemoryBenchArguments),
    /// The accelerator's storage services (CRC32C, AES-XTS, Reed-Solomon), CPU and GPU engines;
    /// every argument, --help included, goes to the accelerator's benchmark
    #[command(disable_help_flag = true)]
    Services(bench::ServicesArguments),
    /// The batch API (path resolutions, creates) on a tree of directories × files, beside
    /// single calls on threads and ext4; the CPU twin where no GPU directory index is present
    GpuDir(bench::gpu_dir::GpuDirArguments),
    /// Inserts and collapses at any byte of a file, until applied, beside FlexSpace (when
    /// TANDEM_FLEXSPACE_LIB names its library) and ext4 (fallocate, read-and-rewrite)
    Flex(bench::flex::FlexBenchArguments),
    /// Large sequential and random 4 KiB I/O through the file device (io_uring with and
    /// without O_DIRECT, pread/pwrite), beside fio on the same file
    Device(bench::device::DeviceBenchArguments),
    /// tandemfs on a k+m erasure-coded array of images beside md RAID-6 + ext4 over loop devices:
    /// sequential, random 4 KiB, degraded reads and a rebuild, per stripe unit
    Raid(bench::raid::RaidBenchArguments),
}

fn run(cli: Cli) -> CliResult<i32> {
    match cli.command {
        Command::Mkfs(arguments) => commands::mkfs::run(arguments),
        Command::Fsck(arguments) => commands::fsck::run(arguments),
        Command::Stat(arguments) => commands::stat::run(arguments),
        Command::Status(arguments) => array::run_status(arguments),
        Command::Scrub(arguments) => array::run_scrub(arguments),
        Command::Rebuild(arguments) => array::run_rebuild(arguments),
        Command::Key(arguments) => commands::key::run(arguments),
        Command::Mount(arguments) => commands::mount::run_mount(arguments),
        Command::Umount(arguments) => commands::mount::run_umount(arguments),
        Command::Insert(arguments) => commands::edit::run_insert(arguments),
        Command::Collapse(arguments) => commands::edit::run_collapse(arguments),
        Command::Defrag(arguments) => commands::edit::run_defrag(arguments),
        Command::Demo(arguments) => commands::demo::run(arguments),
        Command::Bench(bench) => match bench.which {
            BenchCommand::Meta(arguments) => bench::meta::run(arguments),
            BenchCommand::Mount(arguments) => bench::mount::run(arguments),
            BenchCommand::Log(arguments) => bench::log::run(arguments),
            BenchCommand::Memory(arguments) => bench::memory::run(arguments),
            BenchCommand::Services(arguments) => bench::run_services(arguments),
            BenchCommand::GpuDir(arguments) => bench::gpu_dir::run(arguments),
            BenchCommand::Flex(arguments) => bench::flex::run(arguments),
            BenchCommand::Device(arguments) => bench::device::run(arguments),
            BenchCommand::Raid(arguments) => bench::raid::run(arguments),
        },
    }
}

/// Turns clap's multi-line usage errors into the one line this command promises, keeping help
/// and version output (which are not errors) as clap prints them.
fn parse_arguments() -> Cli {
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = error.print();
                std::process::exit(EXIT_SUCCESS);
            }
            if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = error.print();
                std::process::exit(EXIT_FAILURE);
            }
            // clap puts the message in the first paragraph, sometimes over several lines (the
            // list of missing arguments); join that paragraph and drop usage and tips.
            let rendered = error.to_string();
            let paragraph: Vec<&str> = rendered
                .lines()
                .map(str::trim)
                .skip_while(|line| line.is_empty())
                .take_while(|line| !line.is_empty())
                .collect();
            let joined = paragraph.join(" ");
            let message = joined.trim_start_matches("error: ");
            let words: Vec<String> = std::env::args().skip(1).take(2).collect();
            let help = match words.first().map(String::as_str) {
                Some("bench")
                    if words.len() == 2 && ["meta", "mount", "services", "flex"].contains(&words[1].as_str()) =>
                {
                    format!("tandem bench {} --help", words[1])
                }
                Some("key") if words.len() == 2 && ["add", "remove", "change"].contains(&words[1].as_str()) => {
                    format!("tandem key {} --help", words[1])
                }
                Some(word) if Cli::command_names().contains(&word) => format!("tandem {word} --help"),
                _ => "tandem --help".to_string(),
            };
            eprintln!("tandem: {message} (see '{help}')");
            std::process::exit(EXIT_FAILURE);
        }
    }
}

impl Cli {
    fn command_names() -> Vec<&'static str> {
        vec![
            "mkfs", "fsck", "stat", "status", "scrub", "rebuild", "key", "mount", "umount", "unmount", "insert",
            "collapse", "demo", "bench",
        ]
    }
}

fn main() {
    // Rust ignores SIGPIPE, which turns `tandem stat x | head` into a panic on the next print.
    // Command-line tools should end quietly instead, as the default action does.
    // SAFETY: setting a signal disposition before any other thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // Installed (linked) as mount.fuse.tandemfs, this is mount(8)'s helper.
    let invoked_as = std::env::args().next().unwrap_or_default();
    let file_name = std::path::Path::new(&invoked_as).file_name().and_then(|name| name.to_str()).unwrap_or("");
    if commands::mount::HELPER_NAMES.contains(&file_name) {
        let arguments: Vec<String> = std::env::args().skip(1).collect();
        let exit_code = commands::mount::run_helper(&arguments).unwrap_or_else(|error| {
            eprintln!("{file_name}: {error}");
            error.exit_code
        });
        std::process::exit(exit_code);
    }
    let cli = parse_arguments();
    // The demo and the benchmarks mount and set up things they must take down again; a signal
    // makes them stop after the current step and clean up (see interrupt.rs).
    match &cli.command {
        Command::Demo(_) | Command::Bench(_) | Command::Insert(_) | Command::Collapse(_) => interrupt::install(),
        // A foreground mount's engine threads start before the adapter watches for signals; with
        // the signals blocked first, only the adapter's watcher receives them (see interrupt.rs).
        Command::Mount(arguments) if !arguments.daemon => {
            interrupt::block_termination_signals();
        }
        _ => {}
    }
    let exit_code = match run(cli) {
        Ok(code) => code,
        Err(error) if interrupt::interrupted() => {
            eprintln!("tandem: interrupted ({error})");
            EXIT_INTERRUPTED
        }
        Err(error) => {
            eprintln!("tandem: {error}");
            error.exit_code
        }
    };
    std::process::exit(exit_code);
}
