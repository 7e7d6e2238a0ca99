//! `tandem insert` and `tandem collapse`: byte-granular edits of a file on a mounted tandemfs,
//! through the FUSE adapter's ioctls. Ranges are checked here first so that a mistake reads as
//! "offset beyond the end of the file" rather than a bare EINVAL.
//!
//! Both are all-or-nothing. A collapse is one engine operation. An insert from a source goes in
//! chunks (a source may be larger than memory); if any step fails — no space, an I/O error, an
//! unreadable source, Ctrl-C — everything it added is collapsed out again, so the file is
//! exactly as it was, and the message says so. Inserting a file into itself copies the file as
//! it was when the insert began.

use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::fuse_api::ioctl;
use crate::interrupt;
use crate::size::{format_count, parse_nonzero_size, parse_size};
use clap::{ArgGroup, Args};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// `statfs` magic number of FUSE file systems.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Bytes read from `--from` and inserted per ioctl, to bound memory for large sources.
const INSERT_CHUNK_BYTES: usize = 1 << 20;
/// How often a wait for input on a pipe or terminal looks for a signal.
const INPUT_POLL_MS: i32 = 200;

#[derive(Args)]
#[command(group(ArgGroup::new("content").required(true).args(["from", "zeros"])))]
pub struct InsertArguments {
    /// File on a mounted tandemfs
    pub file: PathBuf,
    /// Byte offset to insert at (at most the file's size); units allowed, e.g. 4K
    #[arg(value_parser = parse_size)]
    pub offset: u64,
    /// Insert the contents of this file ('-' for standard input)
    #[arg(long, value_name = "SOURCE")]
    pub from: Option<PathBuf>,
    /// Insert this many zero bytes instead, e.g. 100 or 1M
    #[arg(long, value_name = "LENGTH", value_parser = parse_nonzero_size)]
    pub zeros: Option<u64>,
}

#[derive(Args)]
pub struct CollapseArguments {
    /// File on a mounted tandemfs
    pub file: PathBuf,
    /// Byte offset of the first byte to remove; units allowed, e.g. 4K
    #[arg(value_parser = parse_size)]
    pub offset: u64,
    /// Number of bytes to remove; offset + length must not pass the end of the file
    #[arg(value_parser = parse_nonzero_size)]
    pub length: u64,
}

#[derive(Args)]
pub struct DefragArguments {
    /// File on a mounted tandemfs
    pub file: PathBuf,
    /// Compact when the file holds more than this many times the bytes it maps
    #[arg(long, default_value_t = 1.2)]
    pub factor: f64,
    /// Only report the space the file holds against the bytes it maps
    #[arg(long)]
    pub check: bool,
}

/// Opens the file for writing and checks it lives on FUSE, returning it with its size.
fn open_target(path: &Path) -> CliResult<(File, u64)> {
    let file = OpenOptions::new().read(true).write(true).open(path).map_err(|error| {
        if error.kind() == std::io::ErrorKind::NotFound {
            CliError::new(format!("{}: no such file", path.display()))
        } else {
            CliError::new(format!("cannot open {} for writing: {error}", path.display()))
        }
    })?;
    let metadata =
        file.metadata().map_err(|error| CliError::new(format!("cannot stat {}: {error}", path.display())))?;
    if !metadata.is_file() {
        return Err(CliError::new(format!("{} is not a regular file", path.display())));
    }
    let mut statistics: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes into the struct we own and reads nothing else of ours.
    let result = unsafe { libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(&file), &mut statistics) };
    if result == 0 && statistics.f_type as i64 != FUSE_SUPER_MAGIC {
        return Err(CliError::new(format!(
            "{} is not on a mounted tandemfs (insert and collapse need one; see 'tandem mount')",
            path.display()
        )));
    }
    Ok((file, metadata.len()))
}

/// Puts an ioctl failure into words; ENOTTY means some other FUSE file system got the request.
fn describe_ioctl_error(path: &Path, what: &str, error: std::io::Error) -> CliError {
    match error.raw_os_error() {
        Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => CliError::new(format!(
            "{} is on a FUSE file system that does not support {what} (is it tandemfs?)",
            path.display()
        )),
        _ => CliError::new(format!("cannot {what} in {}: {error}", path.display())),
    }
}

pub fn run_insert(arguments: InsertArguments) -> CliResult<i32> {
    let path = arguments.file.as_path();
    let (file, size_bytes) = open_target(path)?;
    if arguments.offset > size_bytes {
        return Err(CliError::new(format!(
            "offset {} lies beyond the end of {} ({} bytes); insert at most at the end",
            arguments.offset,
            path.display(),
            size_bytes
        )));
    }
    let edit = Edit { file: &file, path, offset: arguments.offset, size_before_bytes: size_bytes };
    // A signal now waits for the file to be put back; a second one no longer leaves it half done.
    interrupt::defer_second_signal(true);
    let inserted = match arguments.zeros {
        Some(length) => edit.all_or_nothing(|| {
            interrupt::check().map_err(std::io::Error::other)?;
            ioctl::insert_zeros(&file, arguments.offset, length).map(|()| length)
        }),
        None => {
            let source_path = arguments.from.as_deref().unwrap_or(Path::new("-"));
            let mut source = Source::open(source_path, &file)?;
            edit.all_or_nothing(|| source.insert_into(&edit))
        }
    };
    interrupt::defer_second_signal(false);
    let inserted = inserted?;
    let new_size = file.metadata().map(|metadata| metadata.len()).unwrap_or(size_bytes + inserted);
    println!(
        "inserted {} bytes at offset {} in {} (size now {} bytes)",
        format_count(inserted),
        format_count(arguments.offset),
        path.display(),
        format_count(new_size)
    );
    Ok(EXIT_SUCCESS)
}

/// An insert in progress: whatever it has put into the file lies at `offset`, and the file was
/// `size_before_bytes` long, so undoing it is one collapse of the growth at `offset`.
struct Edit<'a> {
    file: &'a File,
    path: &'a Path,
    offset: u64,
    size_before_bytes: u64,
}

impl Edit<'_> {
    /// Runs `insert` (which returns the bytes it inserted) and, when it fails for any reason —
    /// no space, an I/O error, a signal, a source that cannot be read — removes every byte it
    /// added, so the file is exactly as it was. The message says which happened.
    fn all_or_nothing(&self, insert: impl FnOnce() -> std::io::Result<u64>) -> CliResult<u64> {
        // fsync is part of the insert: bytes that went through the page cache (the fallback
        // path) may only meet "no space" when written back.
        let error = match insert().and_then(|inserted| self.file.sync_all().map(|()| inserted)) {
            Ok(inserted) => return Ok(inserted),
            Err(error) => error,
        };
        let what = if interrupt::interrupted() {
            "interrupted".to_string()
        } else if matches!(error.raw_os_error(), Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)) {
            "its FUSE file system does not support insert (is it tandemfs?)".to_string()
        } else {
            error.to_string()
        };
        match self.undo() {
            Ok(()) => Err(CliError::new(format!(
                "cannot insert into {}: {what}; nothing was inserted, the file is as it was",
                self.path.display()
            ))),
            Err(undo_error) => Err(CliError::new(format!(
                "cannot insert into {}: {what}; removing the partly inserted bytes failed too ({undo_error}): \
                 {}",
                self.path.display(),
                self.damage()
            ))),
        }
    }

    /// Removes the bytes the insert added: the file's growth, all of it at `offset`.
    fn undo(&self) -> std::io::Result<()> {
        let size_now = self.file.metadata()?.len();
        if size_now > self.size_before_bytes {
            ioctl::collapse(self.file, self.offset, size_now - self.size_before_bytes)?;
            let size_after = self.file.metadata()?.len();
            if size_after != self.size_before_bytes {
                return Err(std::io::Error::other(format!("the size is {size_after} bytes after the undo")));
            }
        }
        self.file.sync_all()
    }

    /// Says what is left in the file after an insert that could not be undone.
    fn damage(&self) -> String {
        match self.file.metadata().map(|metadata| metadata.len()) {
            Ok(size) if size > self.size_before_bytes => format!(
                "{} extra bytes remain at offset {}; remove them with 'tandem collapse {} {} {}'",
                size - self.size_before_bytes,
                self.offset,
                self.path.display(),
                self.offset,
                size - self.size_before_bytes
            ),
            Ok(_) => "the file's size is unchanged; check its contents".to_string(),
            Err(error) => format!("its size cannot be read ({error})"),
        }
    }
}

/// Where inserted bytes come from.
enum Source {
    /// Another file, a pipe or a terminal, read to its end.
    Stream { reader: File, name: String, regular: bool },
    /// The target file itself (the same inode, by any path, or on standard input): a snapshot
    /// of its bytes `[start, start + length)` as they were before the insert began. The insert
    /// moves the bytes at and after the insert offset; reads follow them there, so the copy
    /// is the file as it was and the insert ends.
    Target { start: u64, length: u64 },
}

impl Source {
    fn open(source_path: &Path, target: &File) -> CliResult<Source> {
        let (reader, name) = if source_path == Path::new("-") {
            let descriptor = std::io::stdin()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|error| CliError::new(format!("cannot read standard input: {error}")))?;
            (File::from(descriptor), "standard input".to_string())
        } else {
            let reader = File::open(source_path)
                .map_err(|error| CliError::new(format!("cannot read --from {}: {error}", source_path.display())))?;
            (reader, source_path.display().to_string())
        };
        let metadata = reader.metadata().map_err(|error| CliError::new(format!("cannot stat {name}: {error}")))?;
        let target_metadata =
            target.metadata().map_err(|error| CliError::new(format!("cannot stat the file: {error}")))?;
        if metadata.dev() == target_metadata.dev() && metadata.ino() == target_metadata.ino() {
            // From its current position (standard input may have been read from already).
            let start = (&reader)
                .stream_position()
                .map_err(|error| CliError::new(format!("cannot read {name}: {error}")))?
                .min(target_metadata.len());
            if start == target_metadata.len() {
                return Err(CliError::new(format!("--from {name} is empty; nothing to insert")));
            }
            return Ok(Source::Target { start, length: target_metadata.len() - start });
        }
        if metadata.is_dir() {
            return Err(CliError::new(format!("--from {name} is a directory")));
        }
        if metadata.is_file() && metadata.len() == 0 {
            return Err(CliError::new(format!("--from {name} is empty; nothing to insert")));
        }
        Ok(Source::Stream { reader, name, regular: metadata.is_file() })
    }

    /// Inserts the whole source at `edit.offset`, chunk after chunk, checking for a signal
    /// between chunks; returns the bytes inserted. Stops at the first error (the caller undoes).
    fn insert_into(&mut self, edit: &Edit) -> std::io::Result<u64> {
        let mut buffer = vec![0u8; INSERT_CHUNK_BYTES];
        let mut inserted: u64 = 0;
        loop {
            interrupt::check().map_err(std::io::Error::other)?;
            let count = match self {
                Source::Target { start, length } => {
                    let count = (*length - inserted).min(INSERT_CHUNK_BYTES as u64) as usize;
                    read_snapshot(edit, *start + inserted, inserted, &mut buffer[..count])?;
                    count
                }
                Source::Stream { reader, name, regular } => read_some(reader, *regular, &mut buffer)
                    .map_err(|error| std::io::Error::new(error.kind(), format!("cannot read {name}: {error}")))?,
            };
            if count == 0 {
                break;
            }
            ioctl::insert_data(edit.file, edit.offset + inserted, &buffer[..count])?;
            inserted += count as u64;
        }
        if inserted == 0 {
            return Err(std::io::Error::other("the source is empty; nothing to insert"));
        }
        Ok(inserted)
    }
}

/// Reads the target's original bytes at `original` into `buffer`, `inserted` bytes into the
/// insert: those before the insert offset have not moved, those at or after it moved up by
/// `inserted`.
fn read_snapshot(edit: &Edit, original: u64, inserted: u64, buffer: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0usize;
    // At most two passes: one before the insert offset, one after.
    while done < buffer.len() {
        let position = original + done as u64;
        let (actual, limit) = if position < edit.offset {
            (position, (edit.offset - position) as usize)
        } else {
            (position + inserted, usize::MAX)
        };
        let count = (buffer.len() - done).min(limit);
        edit.file.read_exact_at(&mut buffer[done..done + count], actual)?;
        done += count;
    }
    Ok(())
}

/// Reads what is available (0 at the end). A pipe or terminal is polled, so that a signal
/// stops a wait for input that may never come.
fn read_some(reader: &mut File, regular: bool, buffer: &mut [u8]) -> std::io::Result<usize> {
    loop {
        if !regular {
            let mut poll = libc::pollfd { fd: reader.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: poll reads and writes the one pollfd we own.
            let ready = unsafe { libc::poll(&mut poll, 1, INPUT_POLL_MS) };
            if ready == 0 || (ready < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted) {
                interrupt::check().map_err(std::io::Error::other)?;
                continue;
            }
        }
        match reader.read(buffer) {
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

pub fn run_collapse(arguments: CollapseArguments) -> CliResult<i32> {
    let path = arguments.file.as_path();
    let (file, size_bytes) = open_target(path)?;
    let end = arguments.offset.checked_add(arguments.length);
    if end.is_none_or(|end| end > size_bytes) {
        return Err(CliError::new(format!(
            "range of {} bytes at offset {} passes the end of {} ({} bytes)",
            arguments.length,
            arguments.offset,
            path.display(),
            size_bytes
        )));
    }
    // One engine operation: it happens whole or not at all, and a signal waits for it.
    if let Err(error) = ioctl::collapse(&file, arguments.offset, arguments.length) {
        let error = describe_ioctl_error(path, "collapse", error);
        let size_now = file.metadata().map(|metadata| metadata.len()).unwrap_or(size_bytes);
        if size_now != size_bytes {
            return Err(CliError::new(format!("{}; the size changed to {size_now} bytes nonetheless", error.message)));
        }
        return Err(CliError::new(format!("{}; nothing was removed", error.message)));
    }
    let new_size = file.metadata().map(|metadata| metadata.len()).unwrap_or(size_bytes - arguments.length);
    println!(
        "removed {} bytes at offset {} from {} (size now {} bytes)",
        format_count(arguments.length),
        format_count(arguments.offset),
        path.display(),
        format_count(new_size)
    );
    Ok(EXIT_SUCCESS)
}

/// Space amplification as the report prints it: held over mapped.
fn amplification(held_bytes: u64, mapped_bytes: u64) -> String {
    if mapped_bytes == 0 {
        return "no bytes mapped".into();
    }
    format!("{:.2}×", held_bytes as f64 / mapped_bytes as f64)
}

/// `tandem defrag FILE [--factor F] [--check]`: compaction of one file on a mounted tandemfs
/// through the DEFRAG ioctl, with the space it held and holds.
pub fn run_defrag(arguments: DefragArguments) -> CliResult<i32> {
    let path = arguments.file.as_path();
    if !(arguments.factor >= 1.0 && arguments.factor <= 1_000_000.0) {
        return Err(CliError::new(format!("--factor {} must lie between 1 and 1000000", arguments.factor)));
    }
    let factor_millis = if arguments.check { u64::MAX } else { (arguments.factor * 1000.0).round() as u64 };
    let (file, _) = open_target(path)?;
    let answer = ioctl::defrag(&file, factor_millis).map_err(|error| describe_ioctl_error(path, "defrag", error))?;
    println!(
        "{}: {} bytes mapped, {} bytes held ({})",
        path.display(),
        format_count(answer.mapped_bytes),
        format_count(answer.held_bytes_before),
        amplification(answer.held_bytes_before, answer.mapped_bytes)
    );
    if answer.records == 0 {
        if !arguments.check {
            println!("nothing to do: at most {}× the bytes mapped", arguments.factor);
        }
    } else {
        println!(
            "compacted by {} compaction record(s): {} bytes held ({}); the old blocks are free at the next checkpoint",
            format_count(answer.records),
            format_count(answer.held_bytes_after),
            amplification(answer.held_bytes_after, answer.mapped_bytes)
        );
    }
    Ok(EXIT_SUCCESS)
}
