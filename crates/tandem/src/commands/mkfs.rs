//! `tandem mkfs`: writes an empty volume. It refuses to destroy anything it recognises (or any
//! non-zero data wherever it looks: both ends, a spread between, and every data extent of a
//! sparse file) unless `--force` is given, because a mistyped path must not cost a disk. It never
//! shortens a file: `--force` with a `--size` below the file's length formats the first SIZE
//! bytes and leaves the rest, and the length, as they were.

use crate::error::{describe, CliError, CliResult, EXIT_SUCCESS};
use crate::image::{self, Access};
use crate::size::{format_bytes, parse_nonzero_size};
use clap::Args;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tandemfs::device::Device;
use tandemfs::fs::FormatOptions;
use tandemfs::fsck::probe::{first_nonzero, normalize_ranges, probe, sample_ranges};
use tandemfs::FileSystem;

#[derive(Args)]
pub struct MkfsArguments {
    /// Image file (created when missing) or block device
    #[arg(required_unless_present = "devices")]
    pub image: Option<PathBuf>,
    /// Make the volume on an erasure-coded array of these devices instead (comma-separated
    /// image files, created when missing, or block devices; docs/RAID.md)
    #[arg(long, value_name = "A,B,...", conflicts_with_all = ["image"])]
    pub devices: Option<String>,
    /// With --devices: devices' worth of Reed-Solomon parity (1 to 4): any this many may be lost
    #[arg(long, value_name = "M", requires = "devices", value_parser = clap::value_parser!(u64).range(1..=4))]
    pub parity: Option<u64>,
    /// With --devices: the stripe unit, a power of two from 4K to 1M (default 64K)
    #[arg(long, value_name = "BYTES", requires = "devices", value_parser = parse_nonzero_size)]
    pub stripe_unit: Option<u64>,
    /// Volume size, e.g. 512M, 2G, 1T; required for a new image, grows a shorter existing file
    /// (never shortens one: with --force a smaller size formats only the file's first SIZE
    /// bytes); a block device always uses its whole size
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
    /// Overwrite an existing file system or data (mkfs otherwise refuses any non-zero bytes)
    #[arg(long, short = 'f')]
    pub force: bool,
    /// Encrypt the volume (AES-256-XTS; docs/ENCRYPTION.md): the passphrase is asked twice on
    /// the terminal, or --key-file gives the key
    #[arg(long)]
    pub encrypt: bool,
    /// With --encrypt: a key file of exactly 64 bytes (head -c 64 /dev/urandom > FILE) instead
    /// of a passphrase
    #[arg(long, value_name = "FILE", requires = "encrypt")]
    pub key_file: Option<PathBuf>,
    /// With --encrypt: how long unlocking should take on this machine; the Argon2id cost is
    /// calibrated to it (default 1000; at least 8 MiB of memory whatever the time)
    #[arg(long, value_name = "N", requires = "encrypt", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub kdf_time_ms: Option<u64>,
}

/// Unlocking an encrypted volume takes about this long unless `--kdf-time-ms` says otherwise.
const KDF_TIME_DEFAULT_MS: u64 = 1000;

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

/// Allocated bytes of a sparse file read in full before sampling takes over: a file with this
/// little real content is checked byte for byte.
const DATA_READ_IN_FULL_BYTES: u64 = 64 << 20;
/// Data extents of a sparse file looked at (each at its start and end); more are not listed.
const DATA_EXTENTS_MAX: usize = 4096;
/// Bytes looked at from each end of a data extent when the file has more data than the above.
const DATA_EXTENT_EDGE_BYTES: u64 = 64 * 1024;

/// The data extents `(offset, length)` of a regular file, from SEEK_DATA and SEEK_HOLE: a
/// sparse file's holes need no reading, and its data, wherever it is, gets looked at. At most
/// `DATA_EXTENTS_MAX`; an empty list where the file system cannot say (then sampling alone).
fn data_extents(file: &File, length_bytes: u64) -> Vec<(u64, u64)> {
    let descriptor = file.as_raw_fd();
    let mut extents = Vec::new();
    let mut position: u64 = 0;
    while position < length_bytes && extents.len() < DATA_EXTENTS_MAX {
        // SAFETY: lseek on a descriptor we own; it only moves the file offset.
        let data = unsafe { libc::lseek(descriptor, position as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: only a hole follows; EINVAL: the file system cannot say.
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(descriptor, data, libc::SEEK_HOLE) };
        let hole = if hole < 0 { length_bytes } else { (hole as u64).min(length_bytes) };
        let data = data as u64;
        if hole <= data {
            break;
        }
        extents.push((data, hole - data));
        position = hole;
    }
    extents
}

/// Where to look for existing data on `path` of `size_bytes`: spread samples, plus the real data
/// of a sparse regular file (all of it when it is small, else both ends of every extent).
fn ranges_to_examine(path: &Path, size_bytes: u64, is_regular_file: bool) -> CliResult<Vec<(u64, u64)>> {
    let mut ranges = sample_ranges(size_bytes);
    if is_regular_file {
        let file =
            File::open(path).map_err(|error| CliError::new(format!("cannot read {}: {error}", path.display())))?;
        let extents = data_extents(&file, size_bytes);
        let data_bytes: u64 = extents.iter().map(|extent| extent.1).sum();
        for (offset, length) in extents {
            if data_bytes <= DATA_READ_IN_FULL_BYTES {
                ranges.push((offset, length));
            } else {
                let edge = length.min(DATA_EXTENT_EDGE_BYTES);
                ranges.push((offset, edge));
                ranges.push((offset + length - edge, edge));
            }
        }
    }
    Ok(normalize_ranges(ranges))
}

/// Refuses to overwrite a recognised file system or other data without `--force`. A file or
/// device that reads as zeros wherever it is looked at (a fresh `truncate`d file, a wiped disk)
/// is fair game.
fn refuse_to_overwrite(path: &Path, is_regular_file: bool) -> CliResult<()> {
    // Probe through the engine with a shared, read-only open: it knows tandemfs and the common
    // others, and the exclusive lock a mount holds must not make this step fail confusingly.
    let device = image::open(path, Access::LOOK)?;
    let size_bytes = tandemfs::device::Device::size_bytes(&*device);
    let examine = |error: tandemfs::Error| CliError::new(format!("cannot examine {}: {error}", path.display()));
    if let Some(name) = probe(&*device).map_err(examine)? {
        return Err(CliError::new(format!(
            "{} already holds something tandem recognises ({name}); add --force to overwrite it",
            path.display()
        )));
    }
    let ranges = ranges_to_examine(path, size_bytes, is_regular_file)?;
    if let Some(offset) = first_nonzero(&*device, &ranges).map_err(examine)? {
        return Err(CliError::new(format!(
            "{} holds data (at byte {offset}) that is not a file system tandem recognises; add --force to overwrite it",
            path.display()
        )));
    }
    Ok(())
}

/// The first `size_bytes` of a device: `mkfs --force --size` smaller than an existing file
/// formats this prefix and leaves the rest of the file, and its length, alone.
struct Prefix {
    inner: Arc<dyn Device>,
    size_bytes: u64,
}

impl Device for Prefix {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> tandemfs::Result<()> {
        assert!(offset + buffer.len() as u64 <= self.size_bytes, "read past the formatted prefix");
        self.inner.read_at(offset, buffer)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tandemfs::Result<()> {
        assert!(offset + data.len() as u64 <= self.size_bytes, "write past the formatted prefix");
        self.inner.write_at(offset, data)
    }
    fn flush(&self) -> tandemfs::Result<()> {
        self.inner.flush()
    }
}

pub fn run(arguments: MkfsArguments) -> CliResult<i32> {
    if let Some(list) = &arguments.devices {
        return run_array(&arguments, list);
    }
    let Some(path) = arguments.image.as_deref() else {
        return Err(CliError::new("give an image (or --devices for an array)"));
    };
    let target = classify(path)?;
    // The secret comes first: a passphrase typed twice wrongly (or a bad key file) must not
    // leave a created or grown file behind.
    let encryption = match arguments.encrypt {
        true => Some(crate::secret::obtain(path, arguments.key_file.as_deref(), crate::secret::Ask::New)?),
        false => None,
    };
    let mut created = false;
    // The bytes to format, when less than the whole file (`--force --size` below its length).
    let mut format_bytes_only = None;
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
            if let Some(size) = arguments.size.filter(|&size| size < length_bytes) {
                // mkfs never shortens a file: what lies past the new size could be anything.
                if !arguments.force {
                    return Err(CliError::new(format!(
                        "--size {} would shorten {} ({} bytes); give no --size to use the whole file, \
                         or add --force to format its first {} and leave the rest",
                        format_bytes(size),
                        path.display(),
                        length_bytes,
                        format_bytes(size)
                    )));
                }
                format_bytes_only = Some(size);
            }
            if !arguments.force && length_bytes > 0 {
                refuse_to_overwrite(path, true)?;
            }
            if let Some(size) = arguments.size.filter(|&size| size > length_bytes) {
                // Grow under the exclusive lock so a mounted image is never changed under it.
                let device = image::open(path, Access::WRITE)?;
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|error| CliError::new(format!("cannot open {}: {error}", path.display())))?;
                let length_now = file
                    .metadata()
                    .map_err(|error| CliError::new(format!("cannot stat {}: {error}", path.display())))?
                    .len();
                // Checked again under the lock: set_len must only ever grow the file.
                if length_now < size {
                    file.set_len(size).map_err(|error| {
                        CliError::new(format!("cannot grow {} to {}: {error}", path.display(), format_bytes(size)))
                    })?;
                }
                drop(device);
            }
        }
        Target::BlockDevice => {
            if !arguments.force {
                refuse_to_overwrite(path, false)?;
            }
        }
    }

    let result = format(path, &arguments, matches!(target, Target::BlockDevice), format_bytes_only, encryption);
    if result.is_err() && created {
        // Leave nothing behind from a failed first attempt; a retry with other sizes starts clean.
        let _ = std::fs::remove_file(path);
    }
    result
}

fn format(
    path: &Path,
    arguments: &MkfsArguments,
    is_block_device: bool,
    format_bytes_only: Option<u64>,
    secret: Option<tandemfs::crypt::Secret>,
) -> CliResult<i32> {
    let file_device = image::open(path, Access::WRITE)?;
    let device: Arc<dyn Device> = match format_bytes_only {
        Some(size_bytes) => Arc::new(Prefix { inner: file_device.clone(), size_bytes }),
        None => file_device.clone(),
    };
    let device_size = device.size_bytes();
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
    let encryption = match &secret {
        Some(secret) => {
            let target_ms = arguments.kdf_time_ms.unwrap_or(KDF_TIME_DEFAULT_MS);
            let cost = tandemfs::crypt::KdfCost::calibrate(target_ms)
                .map_err(|error| CliError::new(format!("cannot calibrate the key derivation: {}", describe(&error))))?;
            Some(tandemfs::crypt::Encryption { secret: secret.clone(), cost })
        }
        None => None,
    };
    let options = FormatOptions {
        inode_count: arguments.inodes,
        log_bytes: arguments.log_size,
        root_owner: Some(arguments.root_owner.unwrap_or(caller)),
        encryption,
        ..Default::default()
    };
    FileSystem::format(device.clone(), &options).map_err(|error| {
        CliError::new(format!("cannot create tandemfs on {}: {}", path.display(), describe(&error)))
    })?;
    println!(
        "created {}tandemfs on {} ({})",
        if secret.is_some() { "encrypted " } else { "" },
        path.display(),
        format_bytes(device_size)
    );
    if format_bytes_only.is_some() {
        println!(
            "  the file keeps its length; bytes past the first {} are left as they were",
            format_bytes(device_size)
        );
    }
    drop(device);
    drop(file_device);
    // Show the geometry the engine chose, so the user sees inode and log sizes without a second
    // command; a failure here is not a failure of mkfs.
    if let Ok(device) = image::open(path, Access::LOOK) {
        let volume = tandemfs::crypt::unlock(device.clone(), secret.as_ref());
        if let Ok(report) = volume.and_then(tandemfs::fsck::inspect) {
            crate::commands::stat::print_aligned(&report.lines, "  ");
        }
    }
    Ok(EXIT_SUCCESS)
}

/// What mkfs will do to one member of a new array, decided before anything is written.
struct PlannedMember {
    path: PathBuf,
    target: Target,
    size_bytes: u64,
}

/// Decides, for one member, whether it is created or grown and its size; refuses what a single
/// image would be refused for (existing data without --force, shortening).
fn plan_member(path: &Path, arguments: &MkfsArguments) -> CliResult<PlannedMember> {
    let target = classify(path)?;
    let size_bytes = match target {
        Target::Missing => arguments.size.ok_or_else(|| {
            CliError::new(format!("{} does not exist; give --size (each member's size) to create it", path.display()))
        })?,
        Target::RegularFile { length_bytes } => {
            if let Some(size) = arguments.size.filter(|&size| size < length_bytes) {
                return Err(CliError::new(format!(
                    "--size {} would shorten {} ({length_bytes} bytes); members are never shortened",
                    format_bytes(size),
                    path.display()
                )));
            }
            if !arguments.force && length_bytes > 0 {
                refuse_to_overwrite(path, true)?;
            }
            arguments.size.unwrap_or(length_bytes)
        }
        Target::BlockDevice => {
            if !arguments.force {
                refuse_to_overwrite(path, false)?;
            }
            image::open(path, Access::LOOK)?.size_bytes()
        }
    };
    Ok(PlannedMember { path: path.to_path_buf(), target, size_bytes })
}

/// `tandem mkfs --devices A,B,... --parity M`: every member checked and sized first, so that
/// bad input writes nothing; then members created or grown, the array made, the volume
/// formatted on it and the array closed.
fn run_array(arguments: &MkfsArguments, list: &str) -> CliResult<i32> {
    let paths = crate::array::split_list(Path::new(list));
    let Some(parity) = arguments.parity else {
        return Err(CliError::new("--devices needs --parity M (1 to 4): how many devices may be lost"));
    };
    let stripe_unit = arguments.stripe_unit.unwrap_or(tandemfs::device::array::STRIPE_UNIT_BYTES_DEFAULT);
    tandemfs::device::array::header::check_shape(paths.len(), parity as usize, stripe_unit)
        .map_err(|error| CliError::new(crate::array::words(&error)))?;
    for (index, path) in paths.iter().enumerate() {
        if paths[..index].contains(path) {
            return Err(CliError::new(format!("{} is named twice in --devices", path.display())));
        }
    }
    crate::array::refuse_duplicates(&paths)?;
    let planned: Vec<PlannedMember> =
        paths.iter().map(|path| plan_member(path, arguments)).collect::<CliResult<_>>()?;
    if let Some(other) = planned.iter().find(|member| member.size_bytes != planned[0].size_bytes) {
        return Err(CliError::new(format!(
            "{} would be {} bytes and {} {}: the members of an array must be the same size (give --size)",
            planned[0].path.display(),
            planned[0].size_bytes,
            other.path.display(),
            other.size_bytes
        )));
    }
    // The secret and the key derivation's cost before anything is created: a passphrase
    // typed twice wrongly (or a bad key file) leaves no member behind.
    let encryption = match arguments.encrypt {
        true => {
            let secret = crate::secret::obtain(&paths[0], arguments.key_file.as_deref(), crate::secret::Ask::New)?;
            let target_ms = arguments.kdf_time_ms.unwrap_or(KDF_TIME_DEFAULT_MS);
            let cost = tandemfs::crypt::KdfCost::calibrate(target_ms)
                .map_err(|error| CliError::new(format!("cannot calibrate the key derivation: {}", describe(&error))))?;
            Some(tandemfs::crypt::Encryption { secret, cost })
        }
        false => None,
    };
    let mut created = Vec::new();
    let result = make_array(arguments, &planned, parity as usize, stripe_unit, encryption, &mut created);
    if result.is_err() {
        for path in created {
            let _ = std::fs::remove_file(path);
        }
    }
    result
}

fn make_array(
    arguments: &MkfsArguments,
    planned: &[PlannedMember],
    parity: usize,
    stripe_unit: u64,
    encryption: Option<tandemfs::crypt::Encryption>,
    created: &mut Vec<PathBuf>,
) -> CliResult<i32> {
    let mut initialize_parity = false;
    let mut members = Vec::with_capacity(planned.len());
    for member in planned {
        let path = member.path.as_path();
        match member.target {
            Target::Missing => {
                let file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(|error| CliError::new(format!("cannot create {}: {error}", path.display())))?;
                created.push(path.to_path_buf());
                file.set_len(member.size_bytes).map_err(|error| {
                    CliError::new(format!(
                        "cannot make {} {} long: {error}",
                        path.display(),
                        format_bytes(member.size_bytes)
                    ))
                })?;
            }
            Target::RegularFile { length_bytes } => {
                initialize_parity |= length_bytes > 0;
                if member.size_bytes > length_bytes {
                    let file = OpenOptions::new()
                        .write(true)
                        .open(path)
                        .map_err(|error| CliError::new(format!("cannot open {}: {error}", path.display())))?;
                    file.set_len(member.size_bytes)
                        .map_err(|error| CliError::new(format!("cannot grow {}: {error}", path.display())))?;
                }
            }
            Target::BlockDevice => initialize_parity = true,
        }
        let device: Arc<dyn Device> = image::open(path, Access::WRITE)?;
        members.push(tandemfs::device::array::Member { name: path.display().to_string(), device });
    }
    let options = tandemfs::device::array::CreateOptions {
        parity_count: parity,
        stripe_unit_bytes: stripe_unit,
        initialize_parity,
    };
    let array = tandemfs::device::array::create(members, &options, tandemfs::block::volume::default_accelerator())
        .map_err(|error| CliError::new(format!("cannot make the array: {}", crate::array::words(&error))))?;
    let array = Arc::new(array);
    let device: Arc<dyn Device> = array.clone();
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let caller = unsafe { (libc::geteuid(), libc::getegid()) };
    let format_options = FormatOptions {
        inode_count: arguments.inodes,
        log_bytes: arguments.log_size,
        root_owner: Some(arguments.root_owner.unwrap_or(caller)),
        encryption: encryption.clone(),
        ..Default::default()
    };
    FileSystem::format(device.clone(), &format_options)
        .map_err(|error| CliError::new(format!("cannot create tandemfs on the array: {}", describe(&error))))?;
    array.close().map_err(|error| CliError::new(format!("cannot close the array: {}", describe(&error))))?;
    let geometry = array.geometry();
    println!(
        "created {}tandemfs on an array of {} devices ({} data + {} parity, stripe unit {}): {}",
        if encryption.is_some() { "encrypted " } else { "" },
        geometry.member_count,
        geometry.data_count(),
        geometry.parity_count,
        format_bytes(geometry.stripe_unit_bytes),
        format_bytes(device.size_bytes())
    );
    let secret = encryption.as_ref().map(|encryption| &encryption.secret);
    if let Ok(report) = tandemfs::crypt::unlock(device, secret).and_then(tandemfs::fsck::inspect) {
        crate::commands::stat::print_aligned(&report.lines, "  ");
    }
    Ok(EXIT_SUCCESS)
}
