//! `tandem mkfs`: writes an empty volume. It refuses to destroy anything it recognises (or any
//! non-empty data) unless `--force` is given, because a mistyped path must not cost a disk.

use crate::error::{describe, CliError, CliResult, EXIT_SUCCESS};
use crate::image::{self, Access};
use crate::size::{format_bytes, parse_nonzero_size};
use clap::Args;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use tandemfs::fs::FormatOptions;
use tandemfs::FileSystem;

#[derive(Args)]
pub struct MkfsArguments {
    /// Image file (created when missing) or block device
    pub image: PathBuf,
    /// Volume size, e.g. 512M, 2G, 1T; required for a new image, resizes an existing image file;
    /// a block device always uses its whole size
    #[arg(long, short = 's', value_parser = parse_nonzero_size)]
    pub size: Option<u64>,
    /// Number of inodes (default: one per 16 KiB of volume)
    #[arg(long, short = 'N', value_parser = parse_inode_count)]
    pub inodes: Option<u64>,
    /// Bytes of operation log, e.g. 64M (default: 1/16 of the volume, between 4 MiB and 1 GiB)
    #[arg(long, value_parser = parse_nonzero_size)]
    pub log_size: Option<u64>,
    /// Owner of the root directory as UID:GID (numbers); default: the user running mkfs, so
    /// that whoever formats an image can write to it when mounting it as themselves
    #[arg(long, value_name = "UID:GID", value_parser = parse_owner)]
    pub root_owner: Option<(u32, u32)>,
    /// Overwrite an existing file system or data
    #[arg(long, short = 'f')]
    pub force: bool,
}

fn parse_inode_count(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("the inode count must be larger than zero".into()),
        Ok(count) => Ok(count),
        Err(_) => Err(format!("'{text}' is not a whole number of inodes")),
    }
}

fn parse_owner(text: &str) -> Result<(u32, u32), String> {
    let message = || format!("'{text}' is not UID:GID (two numbers, e.g. 1000:1000)");
    let (uid, gid) = text.trim().split_once(':').ok_or_else(message)?;
    // u32::MAX is (uid_t)-1, which chown and the kernel read as "no change": not an owner.
    match (uid.parse::<u32>(), gid.parse::<u32>()) {
        (Ok(uid), Ok(gid)) if uid != u32::MAX && gid != u32::MAX => Ok((uid, gid)),
        _ => Err(message()),
    }
}

/// What is at the image path before mkfs touches it.
enum Target {
    Missing,
    RegularFile { length_bytes: u64 },
    BlockDevice,
}

fn classify(path: &Path) -> CliResult<Target> {
    match std::fs::metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Target::Missing),
        Err(error) => Err(CliError::new(format!("cannot read {}: {error}", path.display()))),
        Ok(metadata) if metadata.is_file() => Ok(Target::RegularFile { length_bytes: metadata.len() }),
        Ok(metadata) if metadata.file_type().is_block_device() => Ok(Target::BlockDevice),
        Ok(metadata) if metadata.is_dir() => {
            Err(CliError::new(format!("{} is a directory; give an image file or a block device", path.display())))
        }
        Ok(_) => Err(CliError::new(format!(
            "{} is neither a regular file nor a block device; tandemfs needs one of those",
            path.display()
        ))),
    }
}

/// True when the first MiB is all zeros: a fresh `truncate`d file or a wiped disk, safe to use.
fn starts_with_zeros(path: &Path) -> CliResult<bool> {
    let mut file =
        File::open(path).map_err(|error| CliError::new(format!("cannot read {}: {error}", path.display())))?;
    let mut buffer = vec![0u8; 1 << 20];
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(count) => filled += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(CliError::new(format!("cannot read {}: {error}", path.display()))),
        }
    }
    Ok(buffer[..filled].iter().all(|&byte| byte == 0))
}

/// Refuses to overwrite a recognised file system or other data without `--force`.
fn refuse_to_overwrite(path: &Path) -> CliResult<()> {
    // Probe through the engine with a shared, read-only open: it knows tandemfs and the common
    // others, and the exclusive lock a mount holds must not make this step fail confusingly.
    let device = image::open(path, Access::LOOK)?;
    let found = tandemfs::fsck::probe(&*device)
        .map_err(|error| CliError::new(format!("cannot examine {}: {error}", path.display())))?;
    drop(device);
    if let Some(name) = found {
        return Err(CliError::new(format!(
            "{} already holds something tandem recognises ({name}); add --force to overwrite it",
            path.display()
        )));
    }
    if !starts_with_zeros(path)? {
        return Err(CliError::new(format!(
            "{} holds data that is not a file system tandem recognises; add --force to overwrite it",
            path.display()
        )));
    }
    Ok(())
}

pub fn run(arguments: MkfsArguments) -> CliResult<i32> {
    let path = arguments.image.as_path();
    let target = classify(path)?;
    let mut created = false;
    match target {
        Target::Missing => {
            let Some(size) = arguments.size else {
                return Err(CliError::new(format!(
                    "{} does not exist; give --size (e.g. --size 1G) to create it",
                    path.display()
                )));
            };
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|error| CliError::new(format!("cannot create {}: {error}", path.display())))?;
            created = true;
            if let Err(error) = file.set_len(size) {
                let _ = std::fs::remove_file(path);
                return Err(CliError::new(format!(
                    "cannot make {} {} long: {error}",
                    path.display(),
                    format_bytes(size)
                )));
            }
        }
        Target::RegularFile { length_bytes } => {
            if length_bytes == 0 && arguments.size.is_none() {
                return Err(CliError::new(format!(
                    "{} is empty; give --size (e.g. --size 1G) to set the volume size",
                    path.display()
                )));
            }
            if !arguments.force && length_bytes > 0 {
                refuse_to_overwrite(path)?;
            }
            if let Some(size) = arguments.size.filter(|&size| size != length_bytes) {
                // Resize under the exclusive lock so a mounted image is never truncated.
                let device = image::open(path, Access::WRITE)?;
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|error| CliError::new(format!("cannot open {}: {error}", path.display())))?;
                file.set_len(size).map_err(|error| {
                    CliError::new(format!("cannot resize {} to {}: {error}", path.display(), format_bytes(size)))
                })?;
                drop(device);
            }
        }
        Target::BlockDevice => {
            if !arguments.force {
                refuse_to_overwrite(path)?;
            }
        }
    }

    let result = format(path, &arguments, matches!(target, Target::BlockDevice));
    if result.is_err() && created {
        // Leave nothing behind from a failed first attempt; a retry with other sizes starts clean.
        let _ = std::fs::remove_file(path);
    }
    result
}

fn format(path: &Path, arguments: &MkfsArguments, is_block_device: bool) -> CliResult<i32> {
    let device = image::open(path, Access::WRITE)?;
    let device_size = tandemfs::device::Device::size_bytes(&*device);
    if is_block_device {
        if let Some(size) = arguments.size.filter(|&size| size != device_size) {
            return Err(CliError::new(format!(
                "--size {} does not match block device {} of {}; leave --size out to use the whole device",
                format_bytes(size),
                path.display(),
                format_bytes(device_size)
            )));
        }
    }
    if let Some(log_size) = arguments.log_size {
        if log_size >= device_size {
            return Err(CliError::new(format!(
                "--log-size {} does not fit in a volume of {}",
                format_bytes(log_size),
                format_bytes(device_size)
            )));
        }
    }
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let caller = unsafe { (libc::geteuid(), libc::getegid()) };
    let options = FormatOptions {
        inode_count: arguments.inodes,
        log_bytes: arguments.log_size,
        root_owner: Some(arguments.root_owner.unwrap_or(caller)),
        ..Default::default()
    };
    FileSystem::format(device.clone(), &options).map_err(|error| {
        CliError::new(format!("cannot create tandemfs on {}: {}", path.display(), describe(&error)))
    })?;
    println!("created tandemfs on {} ({})", path.display(), format_bytes(device_size));
    drop(device);
    // Show the geometry the engine chose, so the user sees inode and log sizes without a second
    // command; a failure here is not a failure of mkfs.
    if let Ok(device) = image::open(path, Access::LOOK) {
        if let Ok(report) = tandemfs::fsck::inspect(device.clone()) {
            crate::commands::stat::print_aligned(&report.lines, "  ");
        }
    }
    Ok(EXIT_SUCCESS)
}
