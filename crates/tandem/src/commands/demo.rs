//! `tandem demo`: the first command a new user runs. It makes ./tandem.img when missing, mounts
//! it in the background, does a short workload that shows what tandemfs is for (including a
//! byte-granular insert and collapse that no kernel file system offers), prints statistics,
//! unmounts and checks the volume. Every step reads its result back and compares, so the demo
//! fails loudly instead of printing something untrue.

use crate::bench::mount::drop_caches;
use crate::error::{CliError, CliResult, EXIT_PROBLEMS_FOUND, EXIT_SUCCESS};
use crate::fuse_api::{self, ioctl, BackgroundMount};
use crate::image::{self, Access};
use crate::size::{format_bytes, format_count, parse_nonzero_size};
use clap::Args;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tandemfs::FileSystem;

#[derive(Args)]
pub struct DemoArguments {
    /// Image to use; created with --image-size when missing
    #[arg(long, default_value = "tandem.img")]
    pub image: PathBuf,
    /// Size of a newly created image
    #[arg(long, value_parser = parse_nonzero_size, default_value = "1G")]
    pub image_size: u64,
    /// Size of the large file written and read back
    #[arg(long, value_parser = parse_nonzero_size, default_value = "256M")]
    pub large_file_size: u64,
}

/// The mount of the demo; unmounts and closes the volume when dropped, so an error in any step
/// still leaves the image clean and the mount point gone.
struct DemoMount {
    mount: Option<BackgroundMount>,
    fs: Option<FileSystem>,
    mountpoint: PathBuf,
}

impl DemoMount {
    fn finish(&mut self) -> CliResult<()> {
        if let Some(mut mount) = self.mount.take() {
            mount.unmount().map_err(|error| CliError::new(format!("cannot unmount the demo: {error}")))?;
        }
        if let Some(fs) = self.fs.take() {
            fs.unmount().map_err(|error| CliError::new(format!("cannot close the volume: {error}")))?;
        }
        let _ = std::fs::remove_dir(&self.mountpoint);
        Ok(())
    }
}

impl Drop for DemoMount {
    fn drop(&mut self) {
        if let Err(error) = self.finish() {
            eprintln!("tandem: {error}");
        }
    }
}

fn step(number: usize, title: &str) -> CliResult<()> {
    crate::interrupt::check().map_err(CliError::new)?;
    println!();
    println!("{number}. {title}");
    Ok(())
}

fn io_error(what: impl std::fmt::Display, error: std::io::Error) -> CliError {
    CliError::new(format!("demo step failed: {what}: {error}"))
}

fn expect(condition: bool, what: impl Into<String>) -> CliResult<()> {
    if condition {
        Ok(())
    } else {
        Err(CliError::new(format!("demo check failed: {}", what.into())))
    }
}

fn write_file(path: &Path, contents: &[u8]) -> CliResult<()> {
    std::fs::write(path, contents).map_err(|error| io_error(format!("write {}", path.display()), error))
}

fn read_file(path: &Path) -> CliResult<Vec<u8>> {
    std::fs::read(path).map_err(|error| io_error(format!("read {}", path.display()), error))
}

/// Prints a directory tree with sizes, sorted by name, and counts what it saw.
fn print_tree(path: &Path, prefix: &str, counts: &mut (usize, usize)) -> CliResult<()> {
    let mut entries: Vec<_> = std::fs::read_dir(path)
        .map_err(|error| io_error(format!("list {}", path.display()), error))?
        .collect::<Result<_, _>>()
        .map_err(|error| io_error(format!("list {}", path.display()), error))?;
    entries.sort_by_key(|entry| entry.file_name());
    for (index, entry) in entries.iter().enumerate() {
        let last = index + 1 == entries.len();
        let metadata = entry.metadata().map_err(|error| io_error(format!("stat {}", entry.path().display()), error))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let branch = if last { "└── " } else { "├── " };
        if metadata.is_dir() {
            counts.0 += 1;
            println!("   {prefix}{branch}{name}/");
            print_tree(&entry.path(), &format!("{prefix}{}", if last { "    " } else { "│   " }), counts)?;
        } else {
            counts.1 += 1;
            println!("   {prefix}{branch}{name}  ({} bytes)", metadata.len());
        }
    }
    Ok(())
}

/// Makes the image if missing; refuses an existing file that is not tandemfs.
fn prepare_image(arguments: &DemoArguments) -> CliResult<()> {
    let path = &arguments.image;
    if !path.exists() {
        println!("creating {} ({})", path.display(), format_bytes(arguments.image_size));
        let mkfs = crate::commands::mkfs::MkfsArguments {
            image: Some(path.clone()),
            devices: None,
            parity: None,
            stripe_unit: None,
            size: Some(arguments.image_size),
            inodes: None,
            log_size: None,
            root_owner: None,
            force: false,
            encrypt: false,
            key_file: None,
            kdf_time_ms: None,
        };
        crate::commands::mkfs::run(mkfs)?;
        return Ok(());
    }
    let device = image::open(path, Access::LOOK)?;
    let found = tandemfs::fsck::probe(&*device)
        .map_err(|error| CliError::new(format!("cannot examine {}: {error}", path.display())))?;
    if found.as_deref() != Some("tandemfs") {
        return Err(CliError::new(format!(
            "{} exists but holds {}; move it away or pass --image OTHER",
            path.display(),
            found.map(|name| format!("a {name} file system")).unwrap_or_else(|| "no tandemfs volume".into())
        )));
    }
    println!("using the existing volume {}", path.display());
    Ok(())
}

pub fn run(arguments: DemoArguments) -> CliResult<i32> {
    crate::commands::mount::require_fuse()?;
    prepare_image(&arguments)?;

    let mountpoint = std::env::temp_dir().join(format!("tandem-demo-{}", std::process::id()));
    std::fs::create_dir_all(&mountpoint)
        .map_err(|error| io_error(format!("create {}", mountpoint.display()), error))?;
    let (fs, report) = crate::commands::mount::open_volume(&arguments.image)?;
    crate::commands::mount::describe_report(&report);
    let options = crate::commands::mount::ParsedOptions::default();
    let config = crate::commands::mount::mount_config(&options, &arguments.image);
    let mut demo = DemoMount { mount: None, fs: Some(fs.clone()), mountpoint: mountpoint.clone() };
    demo.mount = Some(
        fuse_api::mount_background(fs.clone(), &mountpoint, &config)
            .map_err(|error| CliError::new(format!("cannot mount on {}: {error}", mountpoint.display())))?,
    );
    println!("mounted {} on {} (FUSE, background threads)", arguments.image.display(), mountpoint.display());

    workload(&mountpoint, &arguments)?;
    statistics(&mountpoint, &fs)?;

    step(7, "unmount and check")?;
    demo.finish()?;
    // The image's lock goes with the last handle on the volume; fsck needs it.
    drop(demo);
    drop(fs);
    println!("   unmounted; the volume is flushed and marked clean");
    let verdict = crate::commands::fsck::check(&arguments.image, None)?;
    for line in &verdict.lines {
        println!("   fsck: {line}");
    }
    println!();
    if verdict.clean {
        println!("demo finished: every step read back what it wrote, and fsck found the volume clean.");
        println!(
            "mount it yourself: mkdir -p /mnt/tandem && tandem mount -d {} /mnt/tandem",
            arguments.image.display()
        );
        Ok(EXIT_SUCCESS)
    } else {
        println!("demo finished, but fsck reported problems (above)");
        Ok(EXIT_PROBLEMS_FOUND)
    }
}

fn workload(mountpoint: &Path, arguments: &DemoArguments) -> CliResult<()> {
    let root = mountpoint.join("demo");
    if root.exists() {
        println!("removing the demo directory of an earlier run");
        std::fs::remove_dir_all(&root).map_err(|error| io_error("remove the earlier demo directory", error))?;
    }

    step(1, "a tree of files and directories")?;
    for directory in ["src/engine", "src/fuse", "docs", "data/2026/11"] {
        std::fs::create_dir_all(root.join(directory))
            .map_err(|error| io_error(format!("mkdir -p demo/{directory}"), error))?;
    }
    let files: [(&str, &[u8]); 6] = [
        ("README.txt", b"tandemfs demo volume\n"),
        ("src/engine/log.rs", b"// every change is a log record first\n"),
        ("src/engine/tree.rs", b"// byte-granular extents\n"),
        ("src/fuse/adapter.rs", b"// thin: decode, call, map errno\n"),
        ("docs/notes.txt", b"Hello world!\n"),
        ("data/2026/11/readings.csv", b"time,value\n1,42\n2,43\n"),
    ];
    for (name, contents) in files {
        write_file(&root.join(name), contents)?;
        expect(read_file(&root.join(name))? == contents, format!("demo/{name} reads back as written"))?;
    }
    println!("   demo/");
    let mut counts = (0, 0);
    print_tree(&root, "", &mut counts)?;
    println!("   {} directories and {} files, each read back and compared", counts.0, counts.1);

    step(2, "byte-granular insert and collapse (no copying of the rest of the file)")?;
    let notes = root.join("docs/notes.txt");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&notes)
        .map_err(|error| io_error("open demo/docs/notes.txt", error))?;
    println!("   before:             {:?}", String::from_utf8_lossy(&read_file(&notes)?));
    ioctl::insert_data(&file, 6, b"tandem ").map_err(|error| io_error("insert 7 bytes at offset 6", error))?;
    let inserted = read_file(&notes)?;
    println!("   insert at byte 6:   {:?}", String::from_utf8_lossy(&inserted));
    expect(inserted == b"Hello tandem world!\n", "the insert shifted the rest of the file up")?;
    ioctl::insert_zeros(&file, 0, 3).map_err(|error| io_error("insert 3 zero bytes at offset 0", error))?;
    let zeros = read_file(&notes)?;
    println!("   3 zeros at byte 0:  {:?}", String::from_utf8_lossy(&zeros));
    expect(zeros.starts_with(&[0, 0, 0]) && &zeros[3..] == b"Hello tandem world!\n", "zeros were inserted")?;
    ioctl::collapse(&file, 0, 3).map_err(|error| io_error("collapse 3 bytes at offset 0", error))?;
    ioctl::collapse(&file, 6, 7).map_err(|error| io_error("collapse 7 bytes at offset 6", error))?;
    drop(file);
    let collapsed = read_file(&notes)?;
    println!("   collapse both:      {:?}", String::from_utf8_lossy(&collapsed));
    expect(collapsed == b"Hello world!\n", "the collapses restored the original bytes")?;

    step(3, "rename")?;
    let renamed = root.join("src/notes.txt");
    std::fs::rename(&notes, &renamed).map_err(|error| io_error("rename docs/notes.txt to src/notes.txt", error))?;
    expect(!notes.exists() && read_file(&renamed)? == b"Hello world!\n", "the file moved with its contents")?;
    println!("   demo/docs/notes.txt -> demo/src/notes.txt (old name gone, contents intact)");

    step(4, &format!("a {} file, written and read back", format_bytes(arguments.large_file_size)))?;
    large_file(&root.join("data/large.bin"), arguments.large_file_size)?;
    Ok(())
}

/// The byte at `offset` of the large file: varies with position so misplaced blocks show up.
fn pattern_byte(offset: u64) -> u8 {
    (offset.wrapping_mul(2_654_435_761) >> 13) as u8
}

fn large_file(path: &Path, size_bytes: u64) -> CliResult<()> {
    const CHUNK_BYTES: u64 = 1 << 20;
    let mut buffer = vec![0u8; CHUNK_BYTES as usize];
    let started = Instant::now();
    let mut file = std::fs::File::create(path).map_err(|error| io_error("create demo/data/large.bin", error))?;
    let mut offset = 0u64;
    while offset < size_bytes {
        crate::interrupt::check().map_err(CliError::new)?;
        let length = (size_bytes - offset).min(CHUNK_BYTES) as usize;
        for (index, byte) in buffer[..length].iter_mut().enumerate() {
            *byte = pattern_byte(offset + index as u64);
        }
        file.write_all(&buffer[..length]).map_err(|error| io_error(format!("write at byte {offset}"), error))?;
        offset += length as u64;
    }
    file.sync_all().map_err(|error| io_error("fsync demo/data/large.bin", error))?;
    drop(file);
    let write_seconds = started.elapsed().as_secs_f64();
    let rate = |seconds: f64| format!("{:.0} MiB/s", size_bytes as f64 / seconds.max(1e-9) / (1u64 << 20) as f64);
    println!(
        "   wrote  {} in 1 MiB writes + fsync: {:.2} s, {}",
        format_bytes(size_bytes),
        write_seconds,
        rate(write_seconds)
    );

    let cache_note = if drop_caches() { "page cache dropped first" } else { "page cache not dropped (needs root)" };
    let started = Instant::now();
    let mut file = std::fs::File::open(path).map_err(|error| io_error("open demo/data/large.bin", error))?;
    let mut offset = 0u64;
    loop {
        let count = file.read(&mut buffer).map_err(|error| io_error(format!("read at byte {offset}"), error))?;
        if count == 0 {
            break;
        }
        if let Some(index) = (0..count).find(|&index| buffer[index] != pattern_byte(offset + index as u64)) {
            return Err(CliError::new(format!(
                "demo check failed: byte {} of the large file differs",
                offset + index as u64
            )));
        }
        offset += count as u64;
    }
    let read_seconds = started.elapsed().as_secs_f64();
    expect(offset == size_bytes, format!("read back {offset} of {size_bytes} bytes"))?;
    println!(
        "   read   {} and compared every byte:  {:.2} s, {} ({cache_note})",
        format_bytes(size_bytes),
        read_seconds,
        rate(read_seconds)
    );
    Ok(())
}

fn statistics(mountpoint: &Path, fs: &FileSystem) -> CliResult<()> {
    step(5, "volume statistics (statfs through the mount)")?;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| CliError::new("mount point path holds a zero byte"))?;
    let mut volume: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes only into the struct we own.
    if unsafe { libc::statvfs(path.as_ptr(), &mut volume) } != 0 {
        return Err(io_error("statfs", std::io::Error::last_os_error()));
    }
    let block = volume.f_frsize as u64;
    let total = volume.f_blocks as u64 * block;
    let free = volume.f_bfree as u64 * block;
    let lines = vec![
        ("block size".to_string(), format!("{block} bytes")),
        ("size".to_string(), format_bytes(total)),
        (
            "used".to_string(),
            format!("{} ({:.1}%)", format_bytes(total - free), (total - free) as f64 * 100.0 / total.max(1) as f64),
        ),
        ("free".to_string(), format_bytes(free)),
        (
            "inodes".to_string(),
            format!(
                "{} used of {}",
                format_count(volume.f_files as u64 - volume.f_ffree as u64),
                format_count(volume.f_files as u64)
            ),
        ),
        ("longest name".to_string(), format!("{} bytes", volume.f_namemax)),
    ];
    crate::commands::stat::print_aligned(&lines, "   ");

    step(6, "operation log (every change is a log record first; the back end applies them)")?;
    let log = fs.log_statistics();
    let lines = vec![
        ("header slots".to_string(), format_count(log.header_slots)),
        ("data ring".to_string(), format_bytes(log.data_bytes)),
        ("records since checkpoint".to_string(), format_count(log.records_since_checkpoint)),
        ("data since checkpoint".to_string(), format_bytes(log.data_bytes_since_checkpoint)),
        ("next sequence number".to_string(), format_count(log.next_lsn)),
        ("durable up to".to_string(), format_count(log.durable_lsn)),
        ("applied up to".to_string(), format_count(log.applied_lsn)),
        ("last checkpoint at".to_string(), format_count(log.checkpoint_lsn)),
        ("checkpoints".to_string(), format_count(log.checkpoints)),
    ];
    crate::commands::stat::print_aligned(&lines, "   ");
    Ok(())
}
