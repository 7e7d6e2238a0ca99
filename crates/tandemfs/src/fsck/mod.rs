//! `fsck`: offline consistency check of a volume. It replays pending log records into a
//! copy-on-write overlay (nothing reaches the device), then checks allocation against
//! references, link counts, directory structure and hash order, extent trees, sizes and
//! checksums. Every problem is reported in words; a corrupt image never makes it panic.
//! `repair` (repair.rs) fixes what `check` finds. Neither knows about terminals: long phases
//! report through a `Progress` callback, which the command line turns into a bar or lines.

mod repair;
pub use repair::{repair, RepairReport};

use crate::backend::{self, Overlay};
use crate::block::meta::BLOCK_SIZE_U64;
use crate::block::superblock::{Superblock, STATE_CLEAN};
use crate::block::volume::Volume;
use crate::device::Device;
use crate::dir::{self, DirRoot};
use crate::error::{Error, Result};
use crate::extent::{self, ExtentRoot};
use crate::log::LogOptions;
use crate::types::{FileType, ROOT_INODE};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

pub mod probe;
pub use probe::probe;

/// Problems listed before the rest are only counted: a badly damaged volume would otherwise
/// print millions of lines.
const PROBLEMS_LISTED_MAX: usize = 1000;

/// Where a long check or repair stands: `done` of `total` items of `phase`.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub phase: &'static str,
    pub done: u64,
    pub total: u64,
}

/// Progress is reported every this many items.
const PROGRESS_STEP: u64 = 256;

/// What fsck found.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    /// One line per problem; empty when the volume is consistent.
    pub problems: Vec<String>,
    /// What a crash left that the next mount sets right by itself (not problems): one line each.
    pub notes: Vec<String>,
    /// Problems found beyond those listed.
    pub problems_not_listed: u64,
    pub inodes_checked: u64,
    pub directories_checked: u64,
    pub blocks_in_use: u64,
    /// Log records after the checkpoint: mount replays them (fsck checks the result).
    pub log_records_pending: u64,
    /// File data blocks whose bytes disagree with their checksum: no repair brings them back.
    pub damaged_data_blocks: u64,
    /// Blocks (file data and metadata) whose checksum or trailer failed and that the device's
    /// redundancy rebuilt and rewrote while they were checked: only on an array opened
    /// writable (`tandem scrub`), never through `tandem fsck`'s read-only open.
    pub healed_blocks: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
    fn problem(&mut self, what: String) {
        if self.problems.len() < PROBLEMS_LISTED_MAX {
            self.problems.push(what);
        } else {
            self.problems_not_listed += 1;
        }
    }
}

/// Options of fsck.
#[derive(Debug, Clone, Default)]
pub struct FsckOptions {
    /// The passphrase or key file of an encrypted volume (`crate::crypt::unlock`).
    pub key: Option<crate::crypt::Secret>,
}

/// `check_with_progress` on the volume `options.key` unlocks (`crate::crypt::unlock`): the
/// entry for a device that may hold an encrypted volume. A wrong key or none is an error
/// before anything else is read.
pub fn check_with_options(
    device: Arc<dyn Device>,
    options: &FsckOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<FsckReport> {
    check_with_progress(crate::crypt::unlock(device, options.key.as_ref())?, progress)
}

/// `repair` on the volume `options.key` unlocks; a wrong key or none writes nothing.
pub fn repair_with_options(
    device: Arc<dyn Device>,
    write: bool,
    options: &FsckOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<RepairReport> {
    repair(crate::crypt::unlock(device, options.key.as_ref())?, write, progress)
}

/// An encrypted volume given without its key (`device` does not decrypt): checking its
/// ciphertext would report every block as damaged.
fn refuse_locked(device: &dyn Device) -> Result<()> {
    match Superblock::read_best(device) {
        Ok(superblock) if superblock.is_encrypted() && !device.decrypts() => {
            Err(Error::Key("volume is encrypted: give --key-file FILE or its passphrase".into()))
        }
        _ => Ok(()),
    }
}

/// Checks the volume on `device`. The volume must not be mounted. Pending log records are
/// replayed in memory first (nothing is written), so a crashed volume checks as it will mount.
/// Corruption is reported in the result; only a failing device is an error.
pub fn check(device: Arc<dyn Device>) -> Result<FsckReport> {
    check_with_progress(device, &mut |_| {})
}

/// `check`, telling `progress` where it stands.
pub fn check_with_progress(device: Arc<dyn Device>, progress: &mut dyn FnMut(&Progress)) -> Result<FsckReport> {
    refuse_locked(device.as_ref())?;
    check_volume(device, progress)
}

/// The check itself, on a device that shows the volume's plaintext (repair's overlay over an
/// unlocked device does, though it does not say so).
fn check_volume(device: Arc<dyn Device>, progress: &mut dyn FnMut(&Progress)) -> Result<FsckReport> {
    let mut report = FsckReport::default();
    // A damaged or stale copy is not used while the other is good, but the next mount that
    // loses the good one would fall back to it: a problem worth repairing now. Except for the
    // mark of a crash: superblock writes alternate between the copies, so power lost during
    // one leaves the copy it was writing torn (its magic number, a wrong checksum) while the
    // volume is still marked mounted, and the next mount's first superblock write goes there.
    // The same on a volume marked clean, when the torn copy's sequence is the next one: the
    // crash cut the mount's own first superblock write short.
    match Superblock::read_both(device.as_ref()) {
        Ok(copies) => {
            if let Some(problem) = copies.other_problem {
                let used = copies.best_copy;
                let next_write_torn = copies.other_torn_sequence == copies.best.sequence.checked_add(1);
                if copies.other_torn && copies.best.state == crate::block::superblock::STATE_MOUNTED {
                    report.notes.push(format!(
                        "{problem}: a superblock write torn by a crash (the volume was left mounted); copy {used} is used and the next mount rewrites the other"
                    ));
                } else if copies.other_torn && next_write_torn {
                    report.notes.push(format!(
                        "{problem}: a mount's first superblock write torn by a crash; copy {used} is used and the next mount rewrites the other"
                    ));
                } else {
                    report.problem(format!("{problem} (copy {used} is used)"));
                }
            }
        }
        Err(error @ Error::Io { .. }) => return Err(error),
        Err(_) => {} // open_volume below says it in its own words
    }
    progress(&Progress { phase: "replaying the log", done: 0, total: 1 });
    let options = LogOptions { flush_delay_us: u64::MAX, reserve_fraction: 0.5 };
    let (mut volume, _log, applier, mount) = match backend::open_volume(device, options, 1 << 16, false) {
        Ok(opened) => opened,
        Err(error @ Error::Io { .. }) => return Err(error),
        Err(error) => {
            report.problem(format!("the volume cannot be opened: {error}"));
            return Ok(report);
        }
    };
    report.log_records_pending = mount.records_replayed;
    if let Some(disagreement) = &volume.bitmap_disagreement {
        report.problem(disagreement.clone());
    }
    // A damaged checksum-table block loses the checksums of the data under it (reads of that
    // data fail), and an allocation under it would fail too.
    for (index, why) in volume.damaged_checksum_table_blocks()? {
        report.problem(format!(
            "data checksum table block {}: {why} (the checksums of the data under it are lost)",
            volume.superblock.checksum_table_start + index
        ));
    }
    let seed = applier.hash_seed;
    let superblock = volume.superblock.clone();
    let block_count = superblock.block_count;
    // Who references each block: 0 nobody, otherwise the owning inode (u64::MAX: fixed regions).
    let mut owner: HashMap<u64, u64> = HashMap::new();
    let mut claim = |report: &mut FsckReport, block: u64, inode: u64, what: &str| {
        if block >= block_count {
            report.problem(format!("inode {inode}: {what} block {block} lies beyond the volume"));
            return;
        }
        if let Some(previous) = owner.insert(block, inode) {
            report.problem(format!("block {block} is used by inode {inode} ({what}) and by inode {previous}"));
        }
    };
    for block in 0..superblock.first_data_block {
        claim(&mut report, block, u64::MAX, "fixed region");
    }

    // Walk the tree from the root: entries, types, parents and link counts.
    let mut references: HashMap<u64, u32> = HashMap::new();
    let mut subdirectories: HashMap<u64, u32> = HashMap::new();
    let mut parent_of: HashMap<u64, u64> = HashMap::new();
    let mut queue = VecDeque::from([ROOT_INODE]);
    parent_of.insert(ROOT_INODE, ROOT_INODE);
    while let Some(directory) = queue.pop_front() {
        if report.directories_checked.is_multiple_of(PROGRESS_STEP) {
            progress(&Progress { phase: "checking directories", done: report.directories_checked, total: 0 });
        }
        let inode = match volume.read_inode(directory) {
            Ok(inode) => inode,
            Err(error) => {
                report.problem(format!("directory {directory}: {error}"));
                continue;
            }
        };
        if inode.file_type() != FileType::Directory {
            report.problem(format!("inode {directory} is reached as a directory but has mode {:#o}", inode.mode));
            continue;
        }
        report.directories_checked += 1;
        let root = match DirRoot::decode(&inode.root_area) {
            Ok(root) => root,
            Err(error) => {
                report.problem(format!("directory {directory}: {error}"));
                continue;
            }
        };
        let checked = dir::check(&mut volume, &root, &seed);
        for problem in checked.problems {
            report.problem(format!("directory {directory}: {problem}"));
        }
        for block in checked.blocks {
            claim(&mut report, block, directory, "directory");
        }
        if checked.entries.len() as u64 != root.entry_count() {
            report.problem(format!(
                "directory {directory}: root counts {} entries, {} found",
                root.entry_count(),
                checked.entries.len()
            ));
        }
        for (name, child, dirent_type) in checked.entries {
            let shown = String::from_utf8_lossy(&name).into_owned();
            let child_inode = match volume.read_inode(child) {
                Ok(child_inode) => child_inode,
                Err(Error::NotFound) => {
                    report.problem(format!("directory {directory}: entry {shown:?} points to free inode {child}"));
                    continue;
                }
                Err(error) => {
                    report.problem(format!("directory {directory}: entry {shown:?}: {error}"));
                    continue;
                }
            };
            if child_inode.file_type().dirent_type() != dirent_type {
                report.problem(format!(
                    "directory {directory}: entry {shown:?} has type {dirent_type}, inode {child} disagrees"
                ));
            }
            if child_inode.file_type() == FileType::Directory {
                if parent_of.insert(child, directory).is_some() {
                    report.problem(format!(
                        "directory {child} has more than one name (second: {shown:?} in {directory})"
                    ));
                    continue;
                }
                *subdirectories.entry(directory).or_default() += 1;
                if child_inode.parent != directory {
                    report.problem(format!(
                        "directory {child} names parent {} but is in {directory}",
                        child_inode.parent
                    ));
                }
                queue.push_back(child);
            } else {
                *references.entry(child).or_default() += 1;
            }
        }
    }

    // Orphans: allocated, unnamed, waiting for reclaim at the next mount (mount reclaimed them in
    // the overlay already, so any left are a problem only if the list is broken).
    let mut orphans: BTreeMap<u64, ()> = BTreeMap::new();
    let mut orphan = superblock.orphan_head;
    while orphan != 0 && (orphans.len() as u64) <= superblock.inode_count {
        if orphans.insert(orphan, ()).is_some() {
            report.problem("the orphan list has a cycle".into());
            break;
        }
        orphan = match volume.read_inode(orphan) {
            Ok(inode) => inode.orphan_next,
            Err(error) => {
                report.problem(format!("orphan {orphan}: {error}"));
                break;
            }
        };
    }

    // Every allocated inode: reachable, link count, contents.
    let allocated: Vec<u64> = volume.inodes.iter_set().map(|bit| bit + 1).collect();
    let total = allocated.len() as u64;
    for (done, number) in allocated.into_iter().enumerate() {
        if (done as u64).is_multiple_of(PROGRESS_STEP) {
            progress(&Progress { phase: "checking inodes", done: done as u64, total });
        }
        report.inodes_checked += 1;
        // The record alone: a size that disagrees with the tree is reported below, and the
        // tree's blocks are still claimed.
        let inode = match volume.read_inode_record(number) {
            Ok(inode) => inode,
            Err(error) => {
                report.problem(format!("inode {number}: {error}"));
                continue;
            }
        };
        let file_type = inode.file_type();
        let reachable = parent_of.contains_key(&number) || references.contains_key(&number);
        if !reachable && !orphans.contains_key(&number) {
            report.problem(format!("inode {number} is allocated but has no name"));
        }
        let expected_links = match file_type {
            FileType::Directory => 2 + subdirectories.get(&number).copied().unwrap_or(0),
            _ => references.get(&number).copied().unwrap_or(0),
        };
        if reachable && inode.link_count != expected_links {
            report.problem(format!("inode {number}: link count {} but {expected_links} names", inode.link_count));
        }
        let mut owned = 0u64;
        match file_type {
            FileType::Regular | FileType::Symlink => match ExtentRoot::decode(&inode.root_area) {
                Ok(root) => {
                    if root.length_bytes() != inode.size_bytes {
                        report.problem(format!(
                            "inode {number}: size {} but its extent tree maps {} bytes",
                            inode.size_bytes,
                            root.length_bytes()
                        ));
                    }
                    let checked = extent::check(&mut volume, &root);
                    if checked.problems.is_empty() {
                        check_file_data(&mut volume, &root, number, &mut report)?;
                    }
                    for problem in checked.problems {
                        report.problem(format!("inode {number}: {problem}"));
                    }
                    for block in checked.tree_blocks {
                        claim(&mut report, block, number, "extent tree");
                        owned += 1;
                    }
                    for (first, count) in checked.data_blocks {
                        for block in first..first.saturating_add(count).min(block_count + 1) {
                            claim(&mut report, block, number, "data");
                        }
                        owned += count;
                    }
                }
                Err(error) => report.problem(format!("inode {number}: {error}")),
            },
            _ => {}
        }
        if inode.xattr_block != 0 {
            owned += 1;
            claim(&mut report, inode.xattr_block, number, "xattr");
            if let Err(error) = volume.read_xattrs(inode.xattr_block) {
                report.problem(format!("inode {number}: {error}"));
            }
        }
        if file_type != FileType::Directory && inode.blocks_owned != owned {
            report.problem(format!("inode {number}: counts {} blocks owned, {owned} found", inode.blocks_owned));
        }
    }

    // Allocation against references.
    let mut in_use = 0u64;
    for block in 0..block_count {
        let referenced = owner.contains_key(&block);
        let allocated = volume.blocks.is_set(block);
        if allocated {
            in_use += 1;
        }
        match (allocated, referenced) {
            (true, false) => report.problem(format!("block {block} is allocated but nothing uses it (leaked)")),
            (false, true) => {
                report.problem(format!("block {block} is used by inode {} but marked free", owner[&block]))
            }
            _ => {}
        }
    }
    report.blocks_in_use = in_use;
    report.healed_blocks = volume.checksum_statistics().healed_blocks;
    Ok(report)
}

/// Checks every block of the file's written extents against its data checksum (holes and
/// unwritten extents read as zeros and are not checked) and reports each mismatch with the
/// inode, the file offset and the block. Only a failing device is an error.
fn check_file_data(volume: &mut Volume, root: &ExtentRoot, inode: u64, report: &mut FsckReport) -> Result<()> {
    let mut written: Vec<(u64, u64, u64)> = Vec::new();
    let walked = extent::extents(volume, root, &mut |logical, length, physical, unwritten| {
        if let (Some(address), false) = (physical, unwritten) {
            written.push((logical, address, length));
        }
        true
    });
    if let Err(error) = walked {
        report.problem(format!("inode {inode}: {error}"));
        return Ok(());
    }
    let mut unchecked = 0;
    for (logical, address, length) in written {
        let first = address / BLOCK_SIZE_U64;
        let count = (address + length - 1) / BLOCK_SIZE_U64 - first + 1;
        match volume.check_data_blocks(first, count) {
            Ok((mismatches, lost)) => {
                unchecked += lost;
                report.damaged_data_blocks += mismatches.len() as u64;
                for mismatch in mismatches {
                    // The file offset of the block's first byte (of the extent's, for its first block).
                    let offset = logical + (mismatch.block_number * BLOCK_SIZE_U64).saturating_sub(address);
                    report.problem(format!("inode {inode}: file offset {offset}: {}", mismatch.what));
                }
            }
            Err(error @ Error::Io { .. }) => return Err(error),
            Err(error) => report.problem(format!("inode {inode}: data at file offset {logical}: {error}")),
        }
    }
    if unchecked > 0 {
        report.problem(format!(
            "inode {inode}: {unchecked} data blocks cannot be checked or read: the checksum table block that holds their checksums is damaged"
        ));
    }
    Ok(())
}

/// Geometry, usage and log state of an unmounted volume, for `tandem stat`.
#[derive(Debug, Clone, Default)]
pub struct VolumeReport {
    pub lines: Vec<(String, String)>,
}

/// `inspect` on the volume `options.key` unlocks.
pub fn inspect_with_options(device: Arc<dyn Device>, options: &FsckOptions) -> Result<VolumeReport> {
    inspect(crate::crypt::unlock(device, options.key.as_ref())?)
}

/// The encryption line of `inspect`: none, or the cipher and every key slot.
/// The volume's format version, and what a read-write mount makes of an older one.
fn format_version_line(version: u32) -> String {
    use crate::block::superblock::FORMAT_VERSION;
    if version == FORMAT_VERSION {
        version.to_string()
    } else {
        format!("{version} (the next read-write mount records {FORMAT_VERSION})")
    }
}

fn encryption_line(device: &dyn Device, superblock: &Superblock) -> Result<String> {
    if !superblock.is_encrypted() {
        return Ok("none".into());
    }
    let slots = crate::crypt::key_slots(device)?;
    let described: Vec<String> = slots
        .iter()
        .filter(|slot| slot.in_use || slot.damage.is_some())
        .map(|slot| match (&slot.cost, &slot.damage) {
            (Some(cost), _) => format!(
                "slot {} Argon2id {} KiB, {} passes, {} lanes",
                slot.index, cost.memory_kib, cost.iterations, cost.lanes
            ),
            (None, damage) => format!("slot {} damaged ({})", slot.index, damage.as_deref().unwrap_or("unknown")),
        })
        .collect();
    Ok(format!(
        "AES-256-XTS; key slots {}+{}: {} of {} in use: {}",
        superblock.key_slot_start,
        superblock.key_slot_blocks,
        slots.iter().filter(|slot| slot.in_use).count(),
        slots.len(),
        described.join("; ")
    ))
}

/// Reads the superblock and scans the log without changing anything.
pub fn inspect(device: Arc<dyn Device>) -> Result<VolumeReport> {
    refuse_locked(device.as_ref())?;
    let encryption = encryption_line(device.as_ref(), &Superblock::read_best(device.as_ref())?)?;
    let overlay: Arc<dyn Device> = Arc::new(Overlay::new(device, BTreeMap::new()));
    let superblock = Superblock::read_best(overlay.as_ref())?;
    let options = LogOptions { flush_delay_us: u64::MAX, reserve_fraction: 0.5 };
    let (log, records) = backend::recover_logs(&overlay, &superblock, options)?;
    let volume = Volume::load(overlay, superblock.clone(), 64)?;
    let usage = log.usage();
    let mebibytes = |blocks: u64| format!("{:.1} MiB", (blocks * BLOCK_SIZE_U64) as f64 / (1 << 20) as f64);
    let uuid = superblock.uuid.iter().map(|byte| format!("{byte:02x}")).collect::<String>();
    let used_blocks = superblock.block_count - volume.blocks.free_count();
    let lines = vec![
        ("uuid", uuid),
        ("format version", format_version_line(superblock.format_version)),
        ("state", if superblock.state == STATE_CLEAN { "clean".into() } else { "not cleanly unmounted (replay at mount)".into() }),
        ("size", format!("{} blocks of 4096 bytes ({})", superblock.block_count, mebibytes(superblock.block_count))),
        ("blocks used", format!("{used_blocks} ({:.1}%)", 100.0 * used_blocks as f64 / superblock.block_count as f64)),
        ("blocks free", format!("{} ({})", volume.blocks.free_count(), mebibytes(volume.blocks.free_count()))),
        ("inodes", format!("{} total, {} used", superblock.inode_count, superblock.inode_count - volume.inodes.free_count())),
        ("log", format!("{} header slots, {} data", usage.header_slots_capacity, mebibytes(usage.data_bytes_capacity / BLOCK_SIZE_U64))),
        ("log records pending", format!("{} ({} bytes)", records.len(), usage.data_bytes_used)),
        ("image log", match superblock.image_log_geometry() {
            Some(images) => format!(
                "{} header slots, {} data (checkpoint images)",
                images.header_slots,
                mebibytes(images.data_bytes / BLOCK_SIZE_U64)
            ),
            None => "none: checkpoint images in the log (format version 8 or older)".into(),
        }),
        ("checkpoint", format!(
            "lsn {}, {} checkpoints, metadata generation {}",
            superblock.checkpoint_lsn, superblock.checkpoint_count, superblock.metadata_generation
        )),
        ("mounts", superblock.mount_count.to_string()),
        ("encryption", encryption),
        ("regions", format!(
            "log headers {}+{}, log data {}+{}, image log {}+{}, block bitmap {}+{}, inode bitmap {}+{}, inode table {}+{}, MMP {}, generation table {}+{}, data checksum table {}+{}, data from {}",
            superblock.log_header_start, superblock.log_header_blocks, superblock.log_data_start, superblock.log_data_blocks,
            superblock.image_log_header_start, superblock.image_log_header_blocks + superblock.image_log_data_blocks,
            superblock.block_bitmap_start, superblock.block_bitmap_blocks, superblock.inode_bitmap_start,
            superblock.inode_bitmap_blocks, superblock.inode_table_start, superblock.inode_table_blocks,
            superblock.mmp_block, superblock.generation_table_start, superblock.generation_table_blocks,
            superblock.checksum_table_start, superblock.checksum_table_blocks, superblock.first_data_block
        )),
    ];
    Ok(VolumeReport { lines: lines.into_iter().map(|(name, value)| (name.to_string(), value)).collect() })
}
