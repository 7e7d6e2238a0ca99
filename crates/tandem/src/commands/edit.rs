//! `tandem insert` and `tandem collapse`: byte-granular edits of a file on a mounted tandemfs,
//! through the FUSE adapter's ioctls. Ranges are checked here first so that a mistake reads as
//! "offset beyond the end of the file" rather than a bare EINVAL.

use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::fuse_api::ioctl;
use crate::size::{format_count, parse_nonzero_size, parse_size};
use clap::{ArgGroup, Args};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};

/// `statfs` magic number of FUSE file systems.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Bytes read from `--from` and inserted per ioctl, to bound memory for large sources.
const INSERT_CHUNK_BYTES: usize = 1 << 20;

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
    let inserted = if let Some(length) = arguments.zeros {
        ioctl::insert_zeros(&file, arguments.offset, length)
            .map_err(|error| describe_ioctl_error(path, "insert", error))?;
        length
    } else {
        let source_path = arguments.from.as_deref().unwrap_or(Path::new("-"));
        insert_from(&file, path, arguments.offset, source_path)?
    };
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

/// Streams `source_path` into the file in chunks, each inserted right after the previous one, so
/// the result equals one insert of the whole source.
fn insert_from(file: &File, path: &Path, offset: u64, source_path: &Path) -> CliResult<u64> {
    let mut source: Box<dyn Read> = if source_path == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(
            File::open(source_path)
                .map_err(|error| CliError::new(format!("cannot read --from {}: {error}", source_path.display())))?,
        )
    };
    let mut buffer = vec![0u8; INSERT_CHUNK_BYTES];
    let mut inserted: u64 = 0;
    loop {
        let count = match source.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => {
                return Err(CliError::new(format!(
                    "cannot read --from {} after {inserted} bytes were inserted: {error}",
                    source_path.display()
                )))
            }
        };
        ioctl::insert_data(file, offset + inserted, &buffer[..count]).map_err(|error| {
            if inserted == 0 {
                describe_ioctl_error(path, "insert", error)
            } else {
                CliError::new(format!(
                    "insert into {} failed after {inserted} of the source's bytes were inserted: {error}",
                    path.display()
                ))
            }
        })?;
        inserted += count as u64;
    }
    if inserted == 0 {
        return Err(CliError::new(format!("--from {} is empty; nothing to insert", source_path.display())));
    }
    Ok(inserted)
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
    ioctl::collapse(&file, arguments.offset, arguments.length)
        .map_err(|error| describe_ioctl_error(path, "collapse", error))?;
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
