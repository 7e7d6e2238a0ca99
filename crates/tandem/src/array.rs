//! Erasure-coded arrays at the command line (docs/RAID.md): where a command takes an image, it
//! also takes an array's members as a comma-separated list, or any one member (the others are
//! found beside it, in the same directory). Assembly's refusals become one line each.

use crate::error::{describe, CliError, CliResult, EXIT_PROBLEMS_FOUND, EXIT_SUCCESS};
use crate::image::{self, Access};
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tandemfs::device::array::{self, header, ArrayDevice, Member};
use tandemfs::device::Device;

/// Directory entries looked at when the other members are searched beside one member.
const SIBLINGS_LOOKED_AT_MAX: usize = 4096;

/// The paths of a comma-separated list; a path without a comma is a list of one.
pub fn split_list(text: &Path) -> Vec<PathBuf> {
    text.to_string_lossy().split(',').filter(|part| !part.is_empty()).map(PathBuf::from).collect()
}

/// The array header of the file at `path`, read without the engine (for the sibling search and
/// the check of a single path): `None` when it is no member or cannot be read.
fn member_header_of(path: &Path) -> Option<header::MemberHeader> {
    // Only files and block devices are opened: opening a FIFO would wait for a writer.
    let metadata = std::fs::metadata(path).ok()?;
    if !metadata.is_file() && !std::os::unix::fs::FileTypeExt::is_block_device(&metadata.file_type()) {
        return None;
    }
    let mut bytes = vec![0u8; 2 * header::HEADER_BYTES];
    let mut file = std::fs::File::open(path).ok()?;
    file.read_exact(&mut bytes).ok()?;
    bytes
        .chunks_exact(header::HEADER_BYTES)
        .filter_map(|copy| header::MemberHeader::decode(copy).ok().flatten())
        .max_by_key(|header| header.event)
}

/// Whether `text` names an array: a list, or one path whose first bytes are a member header.
pub fn names_array(text: &Path) -> bool {
    text.to_string_lossy().contains(',') || member_header_of(text).is_some()
}

/// Checks every path of a list the way a single image path is checked.
pub fn check_paths(text: &Path) -> CliResult<()> {
    for path in split_list(text) {
        image::check_image_path(&path)?;
    }
    Ok(())
}

/// The regular files beside `path` whose header names the same array (at most
/// `SIBLINGS_LOOKED_AT_MAX` entries looked at), `path` first.
fn with_siblings(path: &Path) -> Vec<PathBuf> {
    let mut paths = vec![path.to_path_buf()];
    let Some(header) = member_header_of(path) else { return paths };
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(entries) = std::fs::read_dir(&directory) else { return paths };
    // Each file once, under whichever name is met first (a hard link is the same member).
    let mut seen: Vec<(u64, u64)> =
        std::fs::metadata(path).ok().map(|metadata| (metadata.dev(), metadata.ino())).into_iter().collect();
    for entry in entries.take(SIBLINGS_LOOKED_AT_MAX).flatten() {
        let candidate = entry.path();
        let Ok(metadata) = std::fs::metadata(&candidate) else { continue };
        let identity = (metadata.dev(), metadata.ino());
        if !metadata.is_file() || seen.contains(&identity) {
            continue;
        }
        if member_header_of(&candidate).is_some_and(|other| other.array_uuid == header.array_uuid) {
            seen.push(identity);
            paths.push(candidate);
        }
    }
    paths
}

/// Refuses a list that names one file or device twice (by device and inode, so two names of
/// one file are caught too).
pub fn refuse_duplicates(paths: &[PathBuf]) -> CliResult<()> {
    let mut seen: HashMap<(u64, u64), &Path> = HashMap::new();
    for path in paths {
        let Ok(metadata) = std::fs::metadata(path) else { continue };
        let identity =
            if metadata.file_type().is_file() { (metadata.dev(), metadata.ino()) } else { (u64::MAX, metadata.rdev()) };
        if let Some(other) = seen.insert(identity, path) {
            return Err(CliError::new(format!(
                "{} and {} are the same device: each member must be a device of its own",
                other.display(),
                path.display()
            )));
        }
    }
    Ok(())
}

/// Assembles the array named by `text` (a list, or one member and its siblings), each member
/// opened with `access`. Prints what assembly found missing or resynced.
pub fn open(text: &Path, access: Access) -> CliResult<Arc<ArrayDevice>> {
    let listed = split_list(text);
    let paths = if listed.len() == 1 { with_siblings(&listed[0]) } else { listed };
    refuse_duplicates(&paths)?;
    let mut members = Vec::with_capacity(paths.len());
    for path in &paths {
        let device: Arc<dyn Device> = image::open(path, access)?;
        members.push(Member { name: path.display().to_string(), device });
    }
    let assembly = array::assemble(members, tandemfs::block::volume::default_accelerator())
        .map_err(|error| CliError::new(format!("cannot assemble the array: {}", words(&error))))?;
    for note in &assembly.notes {
        eprintln!("array: {note}");
    }
    if assembly.resynced_stripes > 0 {
        eprintln!("array: not closed cleanly; recomputed the parity of {} stripes", assembly.resynced_stripes);
    }
    Ok(Arc::new(assembly.device))
}

/// An engine error in the words of a one-line message (assembly's refusals are
/// `InvalidArgument`, whose display would add "invalid argument:").
pub fn words(error: &tandemfs::Error) -> String {
    match error {
        tandemfs::Error::InvalidArgument(words) => words.clone(),
        other => describe(other),
    }
}

/// Opens what a command was given as its volume: an array when `text` names one, else the image.
pub fn open_volume_device(text: &Path, access: Access) -> CliResult<Arc<dyn Device>> {
    if names_array(text) {
        check_paths(text)?;
        return Ok(open(text, access)?);
    }
    Ok(image::open(text, access)?)
}

#[derive(clap::Args)]
pub struct StatusArguments {
    /// The array: its members as a comma-separated list, or any one member (the others are
    /// looked for in its directory)
    pub members: PathBuf,
}

/// `tandem status`: the array's shape and each slot's health, read without writing anything
/// (no lock either, so a mounted array may be looked at). Exit 0 when every member is present,
/// 1 when some are missing or stale.
pub fn run_status(arguments: StatusArguments) -> CliResult<i32> {
    let array = match open(&arguments.members, Access::LOOK) {
        Ok(array) => array,
        Err(error) => {
            // A mounted array that is dirty and degraded cannot be assembled to be looked at
            // (its recovery writes); the mount's own counters still say how it is.
            print_live_of_member(&arguments.members);
            return Err(error);
        }
    };
    let geometry = array.geometry();
    println!(
        "array {}: {} devices, {} data + {} parity, stripe unit {} bytes, {} stripes, {}",
        hex(&array.array_uuid()),
        geometry.member_count,
        geometry.data_count(),
        geometry.parity_count,
        geometry.stripe_unit_bytes,
        geometry.stripe_count,
        match array.state() {
            array::ArrayState::Clean => "clean",
            array::ArrayState::Dirty => "dirty (in use, or not closed cleanly)",
        }
    );
    let statistics = array.statistics();
    for slot in &statistics.slots {
        match (&slot.missing, &slot.missing_reason) {
            (false, _) => println!("  slot {}: {}: ok", slot.slot, slot.name),
            (true, Some(reason)) => println!("  slot {}: missing: {reason}", slot.slot),
            (true, None) => println!("  slot {}: missing", slot.slot),
        }
    }
    print_live(&array.array_uuid());
    let missing = statistics.slots.iter().filter(|slot| slot.missing).count();
    if missing == 0 {
        Ok(EXIT_SUCCESS)
    } else {
        println!(
            "  degraded: {missing} of {} members missing; {} more may be lost",
            geometry.member_count,
            geometry.parity_count.saturating_sub(missing)
        );
        Ok(EXIT_PROBLEMS_FOUND)
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[derive(clap::Args)]
pub struct ScrubArguments {
    /// The array: its members as a comma-separated list, or any one member
    pub members: PathBuf,
    /// Rewrite each block found wrong from the others (needs parity 2 or more to tell which
    /// member's block is the wrong one)
    #[arg(long)]
    pub repair: bool,
    /// The 64-byte key file of an encrypted volume, for checking its checksums (asked on the
    /// terminal when not given; without either, only parity is checked)
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

/// `tandem scrub`: on an unmounted array, first every block the volume keeps a checksum for
/// (file data: its CRC32C in the data checksum table; metadata: its trailer) is read and
/// checked, as fsck checks them; one that fails is rebuilt from the other members with
/// --repair (each member left out in turn, the version whose checksum matches written back),
/// else reported with its inode, file offset and block. Then every stripe's parity is checked
/// against its data, one line per 4 KiB block that disagrees (and, with --repair, whether it
/// was rewritten). Exit 0 when all agree, 1 when some did not, 4 when --repair left some
/// unrepaired.
pub fn run_scrub(arguments: ScrubArguments) -> CliResult<i32> {
    let access = if arguments.repair { Access::WRITE } else { Access::CHECK };
    let array = open(&arguments.members, access)?;
    let volume_problems = scrub_volume(&array, &arguments)?;
    let report =
        array.scrub(arguments.repair).map_err(|error| CliError::new(format!("scrub stopped: {}", describe(&error))))?;
    let geometry = array.geometry();
    for mismatch in &report.mismatches {
        let row_end = (mismatch.row + 4096).min(geometry.stripe_unit_bytes);
        let place = format!("stripe {}, unit bytes {}..{}", mismatch.stripe, mismatch.row, row_end);
        let which = match mismatch.bad_slot {
            Some(slot) => format!("slot {slot} holds the wrong bytes"),
            None => "the wrong member cannot be told with parity 1".to_string(),
        };
        let done = if mismatch.repaired { ", rewritten" } else { "" };
        println!("{place}: parity disagrees with the data; {which}{done}");
    }
    println!(
        "checked {} of {} stripes ({} skipped with a member missing): {} blocks wrong, {} repaired",
        report.stripes_checked,
        geometry.stripe_count,
        report.stripes_skipped,
        report.mismatches.len(),
        report.mismatches.iter().filter(|mismatch| mismatch.repaired).count()
    );
    if report.mismatches.is_empty() && volume_problems == 0 {
        Ok(EXIT_SUCCESS)
    } else if arguments.repair && (volume_problems > 0 || report.mismatches.iter().any(|mismatch| !mismatch.repaired)) {
        Ok(crate::error::EXIT_PROBLEMS_REMAIN)
    } else {
        Ok(EXIT_PROBLEMS_FOUND)
    }
}

/// The volume's own checks over the array (`fsck::check`): every checksummed block read, and
/// with --repair (the array writable) a block that fails rebuilt from the other members and
/// rewritten where some version passes. Prints one line per problem left (a block no member
/// combination gives right: its inode, file offset and block) and one summary line; returns
/// how many problems are left. An encrypted volume with no key to be had is skipped, said so.
fn scrub_volume(array: &Arc<ArrayDevice>, arguments: &ScrubArguments) -> CliResult<u64> {
    let device: Arc<dyn Device> = array.clone();
    let encrypted = tandemfs::crypt::is_encrypted(device.as_ref()).unwrap_or(false);
    if encrypted && arguments.key_file.is_none() && !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        println!("volume checksums: not checked: the volume is encrypted (give --key-file FILE)");
        return Ok(0);
    }
    let volume = crate::secret::unlock(&arguments.members, device, arguments.key_file.as_deref())?;
    let before = array.statistics().healed_bytes;
    let report = tandemfs::fsck::check(volume)
        .map_err(|error| CliError::new(format!("volume check stopped: {}", describe(&error))))?;
    for problem in &report.problems {
        println!("volume: {problem}");
    }
    let left = report.problems.len() as u64 + report.problems_not_listed;
    let healed_bytes = array.statistics().healed_bytes - before;
    println!(
        "volume checksums: {} inodes checked, {} blocks rebuilt from the other members and rewritten ({}), {} damaged file data blocks left, {} problems in all",
        report.inodes_checked,
        report.healed_blocks,
        crate::size::format_bytes(healed_bytes),
        report.damaged_data_blocks,
        left
    );
    Ok(left)
}

#[derive(clap::Args)]
pub struct RebuildArguments {
    /// The array: its members as a comma-separated list, or any one member, or the mount point
    /// of the mounted array
    pub members: PathBuf,
    /// The missing slot to rebuild (`tandem status` lists them)
    #[arg(long)]
    pub slot: usize,
    /// The new member: an image file to create (its size is the array's member size), or with
    /// --force an existing file or block device at least that large
    #[arg(long, value_name = "NEW")]
    pub device: PathBuf,
    /// Use an existing file or block device as the new member, overwriting it
    #[arg(long, short = 'f')]
    pub force: bool,
}

/// `tandem rebuild`: a missing or stale slot rebuilt onto a new device, with progress and
/// throughput on stderr; the new member joins the array only once all of it is written and
/// flushed. A mounted array (named by its mount point, or by members a mount serves) is
/// rebuilt by the serving process through its control socket, while it goes on serving.
pub fn run_rebuild(arguments: RebuildArguments) -> CliResult<i32> {
    let new_path = std::path::absolute(&arguments.device)
        .map_err(|error| CliError::new(format!("cannot use {}: {error}", arguments.device.display())))?;
    let started = std::time::Instant::now();
    let mut shown_tenths = 0;
    let (mut total_stripes, mut unit_bytes) = (0, 0);
    let mut progress = |done: u64, total: u64, unit: u64| {
        (total_stripes, unit_bytes) = (total, unit);
        let tenths = done * 10 / total.max(1);
        if tenths > shown_tenths {
            shown_tenths = tenths;
            let seconds = started.elapsed().as_secs_f64().max(1e-6);
            eprintln!(
                "rebuild: {}% ({done} of {total} stripes, {:.1} MiB/s)",
                tenths * 10,
                (done * unit) as f64 / seconds / (1 << 20) as f64
            );
        }
    };
    let missing = if arguments.members.is_dir() {
        // A mount point: only its serving process can rebuild it.
        let mountpoint = std::fs::canonicalize(&arguments.members)
            .map_err(|error| CliError::new(format!("cannot use {}: {error}", arguments.members.display())))?;
        let stream = crate::control::connect_mountpoint(&mountpoint).ok_or_else(|| {
            CliError::new(format!("{} is not the mount point of a mounted tandemfs array", mountpoint.display()))
        })?;
        crate::control::request_rebuild(stream, arguments.slot, &new_path, arguments.force, &mut progress)?.missing
    } else {
        check_paths(&arguments.members)?;
        let found = split_list(&arguments.members).first().and_then(|first| member_header_of(first));
        let Some(header) = found else {
            return Err(CliError::new(format!(
                "{} is not a member of a tandemfs array",
                split_list(&arguments.members).first().map_or(String::new(), |path| path.display().to_string())
            )));
        };
        // Two names of one file among the members and the new device, refused before anything.
        let listed = split_list(&arguments.members);
        let mut every = if listed.len() == 1 { with_siblings(&listed[0]) } else { listed };
        every.push(new_path.clone());
        refuse_duplicates(&every)?;
        if let Some(stream) = crate::control::connect(&header.array_uuid) {
            crate::control::request_rebuild(stream, arguments.slot, &new_path, arguments.force, &mut progress)?.missing
        } else {
            let array = open(&arguments.members, Access::WRITE)?;
            let unit = array.geometry().stripe_unit_bytes;
            let mut progress_on = |done: u64, total: u64| {
                progress(done, total, unit);
                true
            };
            rebuild_to_path(&array, arguments.slot, &new_path, arguments.force, &mut progress_on)?;
            array.missing_slots().len()
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let bytes = total_stripes * unit_bytes;
    println!(
        "rebuilt slot {} onto {}: {} in {:.1} s ({:.1} MiB/s); {missing} slots still missing",
        arguments.slot,
        new_path.display(),
        crate::size::format_bytes(bytes),
        seconds,
        bytes as f64 / seconds.max(1e-6) / (1 << 20) as f64,
    );
    Ok(EXIT_SUCCESS)
}

/// Rebuilds missing `slot` of `array` onto the device at `new_path` (absolute): created at the
/// member size when it does not exist, an existing one used only with `force`. Refused with
/// nothing written: a slot that is not missing, an existing path without `force`, a member of
/// the array, a device too small. A file created here is removed again when the rebuild fails.
pub fn rebuild_to_path(
    array: &ArrayDevice,
    slot: usize,
    new_path: &Path,
    force: bool,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> CliResult<()> {
    let geometry = array.geometry();
    if !array.missing_slots().contains(&slot) {
        let missing: Vec<String> = array.missing_slots().iter().map(usize::to_string).collect();
        return Err(CliError::new(format!(
            "slot {slot} is not missing (missing: {}); nothing to rebuild",
            if missing.is_empty() { "none".to_string() } else { missing.join(", ") }
        )));
    }
    let exists = new_path.exists();
    if exists && !force {
        return Err(CliError::new(format!(
            "{} exists; give a new path, or --force to overwrite it",
            new_path.display()
        )));
    }
    let mut every: Vec<PathBuf> = array.statistics().slots.iter().map(|slot| PathBuf::from(&slot.name)).collect();
    every.push(new_path.to_path_buf());
    refuse_duplicates(&every)?;
    let member_bytes = header::DATA_START_BYTES + geometry.stripe_count * geometry.stripe_unit_bytes;
    if !exists {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(new_path)
            .map_err(|error| CliError::new(format!("cannot create {}: {error}", new_path.display())))?;
        if let Err(error) = file.set_len(member_bytes) {
            let _ = std::fs::remove_file(new_path);
            return Err(CliError::new(format!("cannot size {}: {error}", new_path.display())));
        }
    }
    let opened = image::open(new_path, Access::WRITE);
    let result = opened.and_then(|device| {
        let device: Arc<dyn Device> = device;
        let replacement = Member { name: new_path.display().to_string(), device };
        array
            .rebuild(slot, replacement, progress)
            .map_err(|error| CliError::new(format!("cannot rebuild slot {slot}: {}", words(&error))))
    });
    if result.is_err() && !exists {
        let _ = std::fs::remove_file(new_path);
    }
    result
}

/// Seconds between two writes of a mounted array's live counters.
const LIVE_PERIOD_MILLISECONDS: u64 = 1000;
/// Steps of a period, so that a stop is seen within one step.
const LIVE_STEPS: u64 = 20;

/// The file a mounted array's counters are written to: in the runtime directory, by array uuid.
pub fn live_path(uuid: &[u8; 16]) -> PathBuf {
    crate::commands::mount::runtime_directory().join(format!("array-{}.live", hex(uuid)))
}

/// The thread that writes a mounted array's counters once a second (`tandem status` reads them).
struct LiveCounters {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

static LIVE: std::sync::Mutex<Option<LiveCounters>> = std::sync::Mutex::new(None);

/// The array this process mounts, so that the end of the mount closes it (clean headers)
/// before the process exits, whatever thread still holds a reference then.
static MOUNTED: std::sync::Mutex<Option<std::sync::Weak<ArrayDevice>>> = std::sync::Mutex::new(None);

/// Flushes the mounted array and writes its headers clean, after the volume on it has been
/// unmounted. The last reference's drop would do the same, but the process may exit before an
/// engine thread lets go of its reference, leaving the headers dirty (`tandem status` right
/// after `tandem umount` said so) and the next assembly recomputing parity for nothing.
pub fn close_mounted() -> tandemfs::Result<()> {
    let mounted = MOUNTED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    match mounted.and_then(|weak| weak.upgrade()) {
        // Only an array this mount wrote to (dirty): a read-only mount writes nothing.
        Some(array) if array.state() == array::ArrayState::Dirty && !array.is_read_only() => array.close(),
        _ => Ok(()),
    }
}

/// Starts writing `array`'s counters to its live file while it is in use. The thread holds only
/// a weak reference, so it never keeps the array open (its last holder closes it); it removes
/// the file when stopped (`stop_live`) or when the array is gone.
pub fn publish_live(array: &Arc<ArrayDevice>) {
    let weak = Arc::downgrade(array);
    *MOUNTED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(weak.clone());
    let path = live_path(&array.array_uuid());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::spawn(move || {
        let temporary = path.with_extension("live.new");
        while !stopping.load(std::sync::atomic::Ordering::Acquire) {
            let Some(array) = weak.upgrade() else { break };
            let text = render_live(&array);
            drop(array);
            if std::fs::write(&temporary, text).is_ok() {
                let _ = std::fs::rename(&temporary, &path);
            }
            for _ in 0..LIVE_STEPS {
                if stopping.load(std::sync::atomic::Ordering::Acquire) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(LIVE_PERIOD_MILLISECONDS / LIVE_STEPS));
            }
        }
        let _ = std::fs::remove_file(&path);
    });
    let previous = LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).replace(LiveCounters { stop, thread });
    if let Some(previous) = previous {
        previous.stop.store(true, std::sync::atomic::Ordering::Release);
        let _ = previous.thread.join();
    }
}

/// Stops the live counters (the mount is ending) and waits until their file is removed.
pub fn stop_live() {
    let live = LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    if let Some(live) = live {
        live.stop.store(true, std::sync::atomic::Ordering::Release);
        let _ = live.thread.join();
    }
}

/// The live file: "pid P time T" and then one line per slot, as `tandem status` prints them.
fn render_live(array: &ArrayDevice) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let statistics = array.statistics();
    let mut text = format!("pid {} time {now}\n", std::process::id());
    for slot in &statistics.slots {
        let state = match (&slot.missing, &slot.missing_reason) {
            (false, _) => "ok".to_string(),
            (true, Some(reason)) => format!("missing ({reason})"),
            (true, None) => "missing".to_string(),
        };
        text.push_str(&format!(
            "  slot {}: {} reads, {} writes, {} errors (read {}, write {}, flush {}), {} bytes repaired: {state}\n",
            slot.slot,
            slot.reads,
            slot.writes,
            slot.read_errors + slot.write_errors + slot.flush_errors,
            slot.read_errors,
            slot.write_errors,
            slot.flush_errors,
            slot.repaired_bytes
        ));
    }
    text.push_str(&format!(
        "  rebuilt on the fly: {} bytes; healed: {} bytes\n",
        statistics.reconstructed_bytes, statistics.healed_bytes
    ));
    if let Some(rebuild) = &statistics.rebuild {
        text.push_str(&rebuild_line(rebuild));
    }
    text
}

/// The line of a running rebuild: slot, new member, bytes done of all, and the rate so far.
fn rebuild_line(rebuild: &array::RebuildProgress) -> String {
    let seconds = rebuild.elapsed_ms as f64 / 1000.0;
    format!(
        "  rebuilding slot {} onto {}: {} of {} ({}%), {:.1} MiB/s, {:.0} s so far\n",
        rebuild.slot,
        rebuild.name,
        crate::size::format_bytes(rebuild.done_bytes),
        crate::size::format_bytes(rebuild.total_bytes),
        rebuild.done_bytes * 100 / rebuild.total_bytes.max(1),
        rebuild.done_bytes as f64 / seconds.max(1e-3) / (1 << 20) as f64,
        seconds
    )
}

/// Prints the live counters of the array that the first member named belongs to, if any.
fn print_live_of_member(members: &Path) {
    let Some(first) = split_list(members).into_iter().next() else { return };
    let Ok(device) = image::open(&first, Access::LOOK) else { return };
    if let Ok(header::Found::Member(found)) = header::read_header(device.as_ref()) {
        print_live(&found.array_uuid);
    }
}

/// Prints a mounted array's live counters, when a live process writes them.
fn print_live(uuid: &[u8; 16]) {
    for line in live_lines(uuid).unwrap_or_default() {
        println!("{line}");
    }
}

/// The lines `tandem status` prints for a mounted array: `None` when no live process writes its
/// counters (no file, a damaged one, or one left by a process that is gone).
fn live_lines(uuid: &[u8; 16]) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(live_path(uuid)).ok()?;
    let mut lines = text.lines();
    let fields: Vec<&str> = lines.next()?.split_whitespace().collect();
    let pid = fields.get(1).and_then(|pid| pid.parse::<i32>().ok())?;
    let time = fields.get(3).and_then(|time| time.parse::<u64>().ok())?;
    // SAFETY: kill with signal 0 only asks whether the process exists.
    if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
        return None;
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let mut out = vec![format!("mounted (process {pid}); its counters {}s ago:", now.saturating_sub(time))];
    out.extend(lines.map(str::to_string));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandemfs::device::MemoryDevice;

    /// The live counters of an array in use reach its file, and go with it.
    #[test]
    fn live_counters_are_written_while_the_array_is_in_use_and_removed_after() {
        let members: Vec<Member> = (0..4)
            .map(|slot| Member {
                name: format!("m{slot}"),
                device: Arc::new(MemoryDevice::new(array::DATA_START_BYTES + (1 << 20))),
            })
            .collect();
        let options = array::CreateOptions { parity_count: 2, stripe_unit_bytes: 4096, initialize_parity: false };
        let array = Arc::new(array::create(members, &options, tandemfs::block::volume::default_accelerator()).unwrap());
        array.write_at(0, &[7u8; 100_000]).unwrap();
        array.flush().unwrap();
        publish_live(&array);
        let uuid = array.array_uuid();
        let mut lines = None;
        for _ in 0..100 {
            lines = live_lines(&uuid);
            if lines.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let lines = lines.expect("the live file was written");
        assert!(lines[0].starts_with(&format!("mounted (process {})", std::process::id())), "{lines:?}");
        assert!(lines.iter().any(|line| line.starts_with("  slot 3:") && line.ends_with(": ok")), "{lines:?}");
        assert!(!lines[1].contains(" 0 writes"), "{lines:?}");
        stop_live();
        assert!(!live_path(&uuid).exists());
    }

    /// While a rebuild runs, the live counters (what `tandem status` prints of a mounted array)
    /// say which slot, onto what, how far and how fast; once it has ended they say nothing of it.
    #[test]
    fn the_live_counters_show_a_running_rebuild() {
        let devices: Vec<MemoryDevice> =
            (0..4).map(|_| MemoryDevice::new(array::DATA_START_BYTES + (1 << 20))).collect();
        let members = |devices: &[MemoryDevice]| -> Vec<Member> {
            devices
                .iter()
                .enumerate()
                .map(|(slot, device)| Member { name: format!("m{slot}"), device: Arc::new(device.clone()) })
                .collect()
        };
        let options = array::CreateOptions { parity_count: 2, stripe_unit_bytes: 4096, initialize_parity: false };
        let accelerator = tandemfs::block::volume::default_accelerator();
        let array = array::create(members(&devices), &options, accelerator.clone()).unwrap();
        array.write_at(0, &[7u8; 100_000]).unwrap();
        array.close().unwrap();
        drop(array);
        let mut present = members(&devices);
        present.remove(1);
        let array = Arc::new(array::assemble(present, accelerator).unwrap().device);
        assert!(!render_live(&array).contains("rebuilding"));
        let stripes = array.geometry().stripe_count;
        let (reached, release) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let (reached_sender, release_receiver) = (reached.0, release.1);
        let rebuilding = array.clone();
        let rebuild = std::thread::spawn(move || {
            let replacement = Member {
                name: "new.img".to_string(),
                device: Arc::new(MemoryDevice::new(array::DATA_START_BYTES + (1 << 20))),
            };
            rebuilding.rebuild(1, replacement, &mut |done, total| {
                if done == total / 2 {
                    reached_sender.send(()).unwrap();
                    // Bounded: the test answers at once, or has failed and hung up.
                    let _ = release_receiver.recv_timeout(std::time::Duration::from_secs(60));
                }
                true
            })
        });
        reached.1.recv_timeout(std::time::Duration::from_secs(60)).expect("the rebuild reached half-way");
        let text = render_live(&array);
        let half = crate::size::format_bytes(stripes / 2 * 4096);
        let all = crate::size::format_bytes(stripes * 4096);
        assert!(text.contains(&format!("  rebuilding slot 1 onto new.img: {half} of {all} (50%), ")), "{text}");
        assert!(text.contains(" MiB/s, "), "{text}");
        release.0.send(()).unwrap();
        rebuild.join().unwrap().unwrap();
        assert!(array.missing_slots().is_empty());
        assert!(!render_live(&array).contains("rebuilding"), "the rebuild ended");
    }
}
