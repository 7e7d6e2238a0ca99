//! `tandem key add|remove|change IMAGE`: the key slots of an encrypted volume.
//!
//! Every input is read and checked before the volume is touched, and the library writes a new
//! slot (and flushes it) before it clears an old one, so a refused or failed command leaves the
//! volume as it was and some slot always opens it. A mounted volume's keys can be changed (as
//! LUKS allows on an open volume); `hold` says what keeps two writers of the slots apart.

use crate::error::{describe, CliError, CliResult, EXIT_SUCCESS};
use crate::image;
use crate::secret::{self, Ask};
use clap::{Args, Subcommand};
use std::io::IsTerminal;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tandemfs::block::mmp::Activity;
use tandemfs::crypt::{self, KdfCost, Secret};
use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
use zeroize::Zeroizing;

#[derive(Args)]
pub struct KeyArguments {
    #[command(subcommand)]
    pub action: KeyAction,
}

#[derive(Subcommand)]
pub enum KeyAction {
    /// Add a key slot for a new passphrase or key file, given one that opens the volume
    Add(NewKeyArguments),
    /// Clear the key slot that a passphrase or key file opens (never the last slot in use)
    Remove(RemoveKeyArguments),
    /// Replace a passphrase or key file by a new one: the new slot is written before the old
    /// one is cleared
    Change(NewKeyArguments),
}

#[derive(Args)]
pub struct NewKeyArguments {
    /// Image file or block device holding an encrypted tandemfs volume (mounted or not)
    pub image: PathBuf,
    /// Key file that opens the volume (exactly 64 bytes); without it, its passphrase is asked
    /// for on the terminal
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Key file for the new slot (exactly 64 bytes: head -c 64 /dev/urandom > FILE); without
    /// it, a new passphrase is asked for twice on the terminal
    #[arg(long, value_name = "FILE")]
    pub new_key_file: Option<PathBuf>,
    /// Argon2id cost of the new slot, calibrated to take about this many milliseconds here
    /// (default: the cost of the volume's first slot in use, which mkfs calibrated)
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub kdf_time_ms: Option<u64>,
}

#[derive(Args)]
pub struct RemoveKeyArguments {
    /// Image file or block device holding an encrypted tandemfs volume (mounted or not)
    pub image: PathBuf,
    /// Key file whose slot is cleared (exactly 64 bytes); without it, the passphrase whose slot
    /// is cleared is asked for on the terminal
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

pub fn run(arguments: KeyArguments) -> CliResult<i32> {
    match arguments.action {
        KeyAction::Add(arguments) => run_add_or_change(arguments, Operation::Add),
        KeyAction::Change(arguments) => run_add_or_change(arguments, Operation::Change),
        KeyAction::Remove(arguments) => run_remove(arguments),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Operation {
    Add,
    Change,
}

/// The image while a key operation runs: the device, and the descriptor whose locks keep other
/// writers of the key slots away until it closes.
struct Held {
    device: Arc<FileDevice>,
    _locks: std::fs::File,
}

/// Opens `image` for a key operation and keeps every other writer of its key slots away.
///
/// Key operations exclude one another with an open file description lock on the image's first
/// byte, a lock no other command takes. An unmounted volume is moreover held with the exclusive
/// lock that mkfs, mount and fsck take, for the whole operation. A mounted volume (its lock
/// held and its multi-mount protection block refreshed by the mount) is changed beside the
/// mount: nothing but a key operation writes the key-slot region, which lies apart from the
/// superblocks that checkpoints rewrite, and a mount reads it only when it unlocks. A lock held
/// by anything else (fsck, mkfs) is refused.
fn hold(image: &Path) -> CliResult<Held> {
    image::check_image_path(image)?;
    let locks = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|error| CliError::new(format!("cannot open {}: {error}", image.display())))?;
    let locked = lock_first_byte(&locks)
        .map_err(|error| CliError::new(format!("cannot lock {} for a key change: {error}", image.display())))?;
    if !locked {
        return Err(CliError::new(format!(
            "another 'tandem key' is changing the key slots of {}; try again when it has finished",
            image.display()
        )));
    }
    // SAFETY: flock on a descriptor we own; the lock goes when it closes.
    let exclusive = unsafe { libc::flock(locks.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    let options = FileDeviceOptions { create_size_bytes: None, lock_exclusive: false, read_only: false };
    let device = FileDevice::open(image, options)
        .map(Arc::new)
        .map_err(|error| CliError::new(format!("cannot open {}: {}", image.display(), describe(&error))))?;
    if !exclusive && !mounted(&device) {
        return Err(CliError::new(format!(
            "{} is in use by another tandem process that is not a mount (fsck or mkfs?); try again when it has finished",
            image.display()
        )));
    }
    Ok(Held { device, _locks: locks })
}

/// Takes a write lock on byte 0 of the image for this open file description, without waiting:
/// false when another description holds it.
fn lock_first_byte(file: &std::fs::File) -> std::io::Result<bool> {
    // SAFETY: an all-zero flock is a valid value; the fields that matter are set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = 0;
    lock.l_len = 1;
    // SAFETY: fcntl reads the flock we own; l_pid stays 0 as open file description locks need.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) } == 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(error),
    }
}

/// Whether a live mount holds the volume: its multi-mount protection block was refreshed
/// within the mount's check interval.
fn mounted(device: &Arc<FileDevice>) -> bool {
    let device: Arc<dyn Device> = device.clone();
    matches!(tandemfs::block::mmp::look_at_volume(device), Ok(Activity::Recent { .. }))
}

/// Holds `image` (see `hold`) and makes sure it is an encrypted tandemfs volume.
fn open_encrypted(image: &Path) -> CliResult<Held> {
    let held = hold(image)?;
    let encrypted = crypt::is_encrypted(held.device.as_ref()).map_err(|error| {
        CliError::new(format!("cannot read the volume on {}: {}", image.display(), describe(&error)))
    })?;
    if !encrypted {
        return Err(CliError::new(format!(
            "{} is not encrypted: it has no key slots (tandem mkfs --encrypt makes an encrypted volume)",
            image.display()
        )));
    }
    Ok(held)
}

fn key_file(path: &Path) -> CliResult<Secret> {
    Secret::from_key_file(path).map_err(|error| CliError::new(describe(&error)))
}

/// The key files are read first: a missing or wrong-sized file is reported before anything
/// else is looked at or asked for.
fn read_key_files(existing: Option<&Path>, new: Option<&Path>) -> CliResult<(Option<Secret>, Option<Secret>)> {
    Ok((existing.map(key_file).transpose()?, new.map(key_file).transpose()?))
}

/// A new passphrase for `image`, asked twice on the terminal; the two must match. Its own
/// prompts, so that the user can tell it from the passphrase that opens the volume.
fn new_passphrase(image: &Path) -> CliResult<Secret> {
    if !std::io::stdin().is_terminal() {
        return Err(CliError::new(
            "give --new-key-file FILE for the new key (no terminal to ask for a new passphrase)",
        ));
    }
    let ask = |text: &str| {
        rpassword::prompt_password(text)
            .map(Zeroizing::new)
            .map_err(|error| CliError::new(format!("cannot read a passphrase from the terminal: {error}")))
    };
    let first = ask(&format!("New passphrase for {}: ", image.display()))?;
    let second = ask("Repeat the new passphrase: ")?;
    if *first != *second {
        return Err(CliError::new("the two passphrases differ; nothing was changed"));
    }
    // The Secret keeps (and wipes) its own copy; both answers are wiped when they go.
    Secret::from_passphrase(String::clone(&first)).map_err(|error| CliError::new(describe(&error)))
}

/// The cost for a new slot: calibrated when asked, otherwise that of the first slot in use.
fn new_slot_cost(device: &dyn Device, image: &Path, kdf_time_ms: Option<u64>) -> CliResult<KdfCost> {
    if let Some(target_ms) = kdf_time_ms {
        return KdfCost::calibrate(target_ms)
            .map_err(|error| CliError::new(format!("cannot calibrate Argon2id: {}", describe(&error))));
    }
    let slots = crypt::key_slots(device).map_err(|error| volume_error(image, &error))?;
    slots.iter().find_map(|slot| slot.cost).ok_or_else(|| {
        CliError::new(format!("{}: no key slot in use records a cost to copy; give --kdf-time-ms MS", image.display()))
    })
}

fn volume_error(image: &Path, error: &tandemfs::Error) -> CliError {
    CliError::new(format!("{}: {}", image.display(), describe(error)))
}

fn run_add_or_change(arguments: NewKeyArguments, operation: Operation) -> CliResult<i32> {
    let (existing, new) = read_key_files(arguments.key_file.as_deref(), arguments.new_key_file.as_deref())?;
    let held = open_encrypted(&arguments.image)?;
    let device = held.device.clone();
    let cost = new_slot_cost(device.as_ref(), &arguments.image, arguments.kdf_time_ms)?;
    let existing = match existing {
        Some(existing) => existing,
        None => secret::obtain(&arguments.image, None, Ask::Open)?,
    };
    let new = match new {
        Some(new) => new,
        None => new_passphrase(&arguments.image)?,
    };
    let image = arguments.image.display();
    match operation {
        Operation::Add => {
            let index = crypt::add_key(device.as_ref(), &existing, &new, cost)
                .map_err(|error| volume_error(&arguments.image, &error))?;
            println!("{image}: added key slot {index}");
        }
        Operation::Change => {
            let index = crypt::change_key(device.as_ref(), &existing, &new, cost)
                .map_err(|error| volume_error(&arguments.image, &error))?;
            println!("{image}: the new key is in slot {index}; the old key's slot was cleared");
        }
    }
    Ok(EXIT_SUCCESS)
}

fn run_remove(arguments: RemoveKeyArguments) -> CliResult<i32> {
    let (existing, _) = read_key_files(arguments.key_file.as_deref(), None)?;
    let held = open_encrypted(&arguments.image)?;
    let device = held.device.clone();
    let existing = match existing {
        Some(existing) => existing,
        None => secret::obtain(&arguments.image, None, Ask::Open)?,
    };
    let index =
        crypt::remove_key(device.as_ref(), &existing).map_err(|error| volume_error(&arguments.image, &error))?;
    println!("{}: cleared key slot {index}", arguments.image.display());
    Ok(EXIT_SUCCESS)
}
