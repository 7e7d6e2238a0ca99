//! `fsck --repair`: brings a damaged volume back to a consistent state, saying in words what it
//! changes. It never trusts the bitmaps: it reads every inode record, walks every extent tree,
//! directory and xattr block, and rebuilds both bitmaps from what is actually used.
//!
//! Order of work:
//! 1. pending log records are replayed and checkpointed, as a mount would; records that cannot
//!    be replayed are discarded (`discard_unreplayable_log`, the one seam for the log);
//! 2. the home structures are scanned (inode table, extent trees, directories, xattr blocks);
//!    damaged pieces are decided about, nothing is allocated yet;
//! 3. the namespace is walked from the root: entries naming free or lost inodes are dropped,
//!    unreachable inodes go to `/lost+found`, link counts and parents are corrected;
//! 4. both bitmaps are rebuilt from the references; directories that changed are rebuilt from
//!    their entries into fresh H-trees;
//! 5. everything goes home through one checkpoint (backend::checkpoint): images into the log,
//!    flush, home, flush, superblock. A crash before the commit is durable leaves the volume as
//!    it was; after it, the next mount or repair completes the checkpoint.
//!
//! With `write` false the same work runs on a copy-on-write overlay: nothing reaches the device,
//! and the report says what a repair would change.

use super::{FsckReport, Progress};
use crate::backend::{self, Overlay};
use crate::block::bitmap::Bitmap;
use crate::block::inode::{Inode, INODE_BYTES};
use crate::block::meta::{verify_block, BlockKind, BLOCK_SIZE, BLOCK_SIZE_U64};
use crate::block::superblock::{Superblock, CHECKSUMS_PER_TABLE_BLOCK, INODES_PER_BLOCK, STATE_CLEAN};
use crate::block::volume::Volume;
use crate::device::Device;
use crate::dir::{self, DirRoot, HashSeed};
use crate::error::{Error, Result};
use crate::extent::{self, ExtentRoot};
use crate::fs::types::{FileType, ROOT_INODE};
use crate::log::{Log, LogOptions};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// Metadata blocks the repair keeps cached: dirty blocks stay until the checkpoint anyway.
const REPAIR_CACHE_BLOCKS: usize = 1 << 16;
/// Changes listed before the rest are only counted.
const CHANGES_LISTED_MAX: usize = 1000;
/// Progress is reported every this many items (and at the end of each phase).
const PROGRESS_STEP: u64 = 256;
const LOST_AND_FOUND: &[u8] = b"lost+found";
const LOST_AND_FOUND_MODE: u32 = 0o040700;

const LOG_OPTIONS: LogOptions = LogOptions { flush_delay_us: u64::MAX, reserve_fraction: 0.5 };

/// What a repair did (or, as a dry run, would do).
#[derive(Debug, Clone, Default)]
pub struct RepairReport {
    /// One line per change to the volume; empty when there was nothing to repair.
    pub changes: Vec<String>,
    /// Changes made beyond those listed.
    pub changes_not_listed: u64,
    /// Work that is not damage: pending log records replayed and checkpointed, as a mount would.
    pub notes: Vec<String>,
    /// The check run on the result: clean unless something could not be repaired.
    pub after: FsckReport,
}

impl RepairReport {
    fn change(&mut self, what: String) {
        if self.changes.len() < CHANGES_LISTED_MAX {
            self.changes.push(what);
        } else {
            self.changes_not_listed += 1;
        }
    }
    /// Changes in all, listed or not.
    pub fn change_count(&self) -> u64 {
        self.changes.len() as u64 + self.changes_not_listed
    }
}

/// Repairs the volume on `device`, which must not be mounted. With `write` false nothing is
/// written and the report says what would change. `progress` hears about long phases. Only a
/// failing device, or a volume with no valid superblock, is an error.
pub fn repair(device: Arc<dyn Device>, write: bool, progress: &mut dyn FnMut(&Progress)) -> Result<RepairReport> {
    super::refuse_locked(device.as_ref())?;
    let device: Arc<dyn Device> = if write { device } else { Arc::new(Overlay::new(device, BTreeMap::new())) };
    let mut report = RepairReport::default();
    let copies = Superblock::read_both(device.as_ref()).map_err(|error| match error {
        Error::Corruption { what } => Error::corruption(format!("cannot repair: {what}")),
        other => other,
    })?;
    let mut must_write = false;
    if let Some(problem) = &copies.other_problem {
        report.change(format!("{problem}: rewritten from copy {}", copies.best_copy));
        must_write = true;
    }

    // 0. Damage in the log: keep the records before the first one replay cannot use and say
    // what each later one was. What is left replays below.
    match backend::discard_damaged_log(device.clone()) {
        Ok(lost) => {
            for record in &lost {
                report.change(format!("log: record {} ({}) follows damage in the log: lost", record.lsn, record.what));
            }
            must_write |= !lost.is_empty();
        }
        Err(error @ Error::Io { .. }) => return Err(error),
        Err(error) => report.notes.push(format!("log: the damage cannot be cut out alone ({error})")),
    }

    // 1. The log, as a mount would replay it.
    progress(&Progress { phase: "replaying the log", done: 0, total: 1 });
    let replay_error = match backend::open_volume(device.clone(), LOG_OPTIONS, REPAIR_CACHE_BLOCKS, true) {
        Ok((volume, log, _applier, mount)) => {
            if mount.records_replayed > 0 || mount.checkpoint_completed || mount.orphans_reclaimed > 0 {
                report.notes.push(format!(
                    "replayed {} log records and reclaimed {} orphan inodes, as a mount would",
                    mount.records_replayed, mount.orphans_reclaimed
                ));
                let covered_lsn = log.next_lsn() - 1;
                let volume = parking_lot::Mutex::new(volume);
                backend::checkpoint(&volume, &log, covered_lsn)?;
            }
            None
        }
        Err(error @ Error::Io { .. }) => return Err(error),
        Err(error) => Some(error),
    };
    let superblock = Superblock::read_best(device.as_ref())?;
    let (log, discarded) = discard_unreplayable_log(device.clone(), &superblock, replay_error.as_ref(), &mut report)?;
    must_write |= discarded;

    // 2..4. The home structures.
    let mut repairer = Repairer::new(device.clone(), superblock, &mut report);
    repairer.rebuild_generation_table()?;
    repairer.scan_inode_table(progress)?;
    repairer.scan_contents(progress)?;
    repairer.rebuild_checksum_table()?;
    repairer.walk_namespace()?;
    repairer.correct_counts();
    repairer.rebuild_bitmaps()?;
    repairer.write_back(progress)?;
    let changed = repairer.changed;
    let mut volume = repairer.volume;

    // 5. One checkpoint takes everything home.
    if changed || must_write {
        volume.superblock.state = STATE_CLEAN;
        let covered_lsn = log.next_lsn() - 1;
        let volume = parking_lot::Mutex::new(volume);
        backend::checkpoint(&volume, &log, covered_lsn)?;
    }
    drop(log);
    progress(&Progress { phase: "checking the result", done: 0, total: 1 });
    report.after = super::check_volume(device, &mut |_| {})?;
    Ok(report)
}

/// Where repair gives up log records that still cannot be applied after
/// `backend::discard_damaged_log` cut the damage out (step 0): it drops every record after the
/// checkpoint (the checkpoint that ends the repair moves the tail past them), or empties a log it
/// cannot read at all. Returns the log to append the repair's checkpoint to, and whether records
/// were dropped.
fn discard_unreplayable_log(
    device: Arc<dyn Device>,
    superblock: &Superblock,
    replay_error: Option<&Error>,
    report: &mut RepairReport,
) -> Result<(Arc<Log>, bool)> {
    match backend::recover_logs(&device, superblock, LOG_OPTIONS) {
        Ok((log, records)) => {
            let operations =
                records.iter().filter(|record| record.kind < backend::record::KIND_CHECKPOINT_IMAGES).count();
            match replay_error {
                Some(error) if operations > 0 => {
                    report.change(format!(
                        "log: {operations} operation records after the checkpoint cannot be replayed ({error}); discarded"
                    ));
                    Ok((log, true))
                }
                _ => Ok((log, false)),
            }
        }
        Err(error @ Error::Io { .. }) => Err(error),
        Err(error) => {
            report.change(format!("log: cannot be read ({error}); emptied at the checkpoint"));
            backend::format_logs(device.as_ref(), superblock)?;
            let (log, _) = backend::recover_logs(&device, superblock, LOG_OPTIONS)?;
            Ok((log, true))
        }
    }
}

/// One directory entry: name, inode, file type byte.
type Entry = (Vec<u8>, u64, u8);

struct Repairer<'a> {
    volume: Volume,
    seed: HashSeed,
    report: &'a mut RepairReport,
    /// Valid inode records, as they will be written.
    inodes: BTreeMap<u64, Inode>,
    /// Inodes whose record must be written back.
    dirty_inodes: BTreeSet<u64>,
    /// Inode-table blocks that failed their checks: replaced by free records.
    lost_table_blocks: Vec<u64>,
    /// Records to zero (invalid, or dropped).
    cleared_records: Vec<u64>,
    /// Entries of every directory, as they will be.
    entries: HashMap<u64, Vec<Entry>>,
    /// Directories to build afresh from `entries`.
    rebuild: BTreeSet<u64>,
    /// Blocks of each whole directory, claimed by it: freed if it is rebuilt all the same.
    directory_blocks: HashMap<u64, Vec<u64>>,
    /// Which inode uses each block of the data region.
    owner: HashMap<u64, u64>,
    orphans: BTreeSet<u64>,
    parent_of: HashMap<u64, u64>,
    names: HashMap<u64, u32>,
    subdirectories: HashMap<u64, u32>,
    lost_and_found: Option<u64>,
    /// Anything changed that a checkpoint must take home.
    changed: bool,
    /// The data blocks of the files kept, as claimed: the generation table records them.
    data_runs: Vec<(u64, u64)>,
}

impl<'a> Repairer<'a> {
    fn new(device: Arc<dyn Device>, superblock: Superblock, report: &'a mut RepairReport) -> Repairer<'a> {
        let seed = superblock.hash_seed;
        let block_count = superblock.block_count;
        let mut volume = Volume::new_empty(device, superblock, REPAIR_CACHE_BLOCKS);
        // Every block readable while scanning: the bitmap is what is being rebuilt.
        volume.blocks.set_range(0, block_count);
        Repairer {
            volume,
            seed,
            report,
            inodes: BTreeMap::new(),
            dirty_inodes: BTreeSet::new(),
            lost_table_blocks: Vec::new(),
            cleared_records: Vec::new(),
            entries: HashMap::new(),
            rebuild: BTreeSet::new(),
            directory_blocks: HashMap::new(),
            owner: HashMap::new(),
            orphans: BTreeSet::new(),
            parent_of: HashMap::new(),
            names: HashMap::new(),
            subdirectories: HashMap::new(),
            lost_and_found: None,
            changed: false,
            data_runs: Vec::new(),
        }
    }

    fn change(&mut self, what: String) {
        self.changed = true;
        self.report.change(what);
    }

    /// A damaged generation-table block would make every block it covers fail its check and
    /// be lost with it: rebuild it from their trailers first (see
    /// `Volume::rebuild_damaged_generation_table`).
    fn rebuild_generation_table(&mut self) -> Result<()> {
        for line in self.volume.rebuild_damaged_generation_table()? {
            self.change(format!("{line} (a stale block under it can no longer be told from a current one)"));
        }
        Ok(())
    }

    /// A damaged or stale checksum-table block fails every read of the data under it, and an
    /// allocation under it: it is rebuilt from the current contents of the written data of the
    /// files kept (`Volume::rebuild_checksum_table_block`), and the repair says that those
    /// checksums were lost. Damaged data elsewhere cannot be repaired: the check after the
    /// repair reports it.
    fn rebuild_checksum_table(&mut self) -> Result<()> {
        let damaged = self.volume.damaged_checksum_table_blocks()?;
        if damaged.is_empty() {
            return Ok(());
        }
        let indexes: BTreeSet<u64> = damaged.iter().map(|(index, _)| *index).collect();
        let roots: Vec<ExtentRoot> = self
            .inodes
            .values()
            .filter(|inode| matches!(inode.file_type(), FileType::Regular | FileType::Symlink))
            .filter_map(|inode| ExtentRoot::decode(&inode.root_area).ok())
            .collect();
        let mut written: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for root in roots {
            let mut extents: Vec<(u64, u64)> = Vec::new();
            extent::extents(&mut self.volume, &root, &mut |_, length, physical, unwritten| {
                if let (Some(address), false) = (physical, unwritten) {
                    extents.push((address, length));
                }
                true
            })?;
            for (address, length) in extents {
                for block in address / BLOCK_SIZE_U64..=(address + length - 1) / BLOCK_SIZE_U64 {
                    if indexes.contains(&(block / CHECKSUMS_PER_TABLE_BLOCK)) {
                        written.entry(block / CHECKSUMS_PER_TABLE_BLOCK).or_default().push(block);
                    }
                }
            }
        }
        for (index, why) in damaged {
            let blocks = written.remove(&index).unwrap_or_default();
            self.volume.rebuild_checksum_table_block(index, &blocks)?;
            self.change(format!(
                "data checksum table block {}: {why}; rebuilt: the checksums of the {} data blocks under it were lost and are recomputed from their current contents (damage they took before now can no longer be detected)",
                self.volume.superblock.checksum_table_start + index,
                blocks.len()
            ));
        }
        Ok(())
    }

    /// Reads every inode record; a table block that fails its checks loses its inodes.
    fn scan_inode_table(&mut self, progress: &mut dyn FnMut(&Progress)) -> Result<()> {
        let superblock = self.volume.superblock.clone();
        let total = superblock.inode_table_blocks;
        for index in 0..total {
            if index.is_multiple_of(PROGRESS_STEP) {
                progress(&Progress { phase: "reading the inode table", done: index, total });
            }
            let block_number = superblock.inode_table_start + index;
            let block = match self.volume.read_inode_table_block(block_number) {
                Ok(block) => block,
                Err(error @ Error::Io { .. }) => return Err(error),
                Err(error) => {
                    let first = index * INODES_PER_BLOCK + 1;
                    self.change(format!(
                        "inode table block {block_number}: {error}; inodes {first}..={} are lost",
                        first + INODES_PER_BLOCK - 1
                    ));
                    self.lost_table_blocks.push(block_number);
                    continue;
                }
            };
            for slot in 0..INODES_PER_BLOCK {
                let number = index * INODES_PER_BLOCK + slot + 1;
                let offset = slot as usize * INODE_BYTES;
                match Inode::decode(&block[offset..offset + INODE_BYTES], number, superblock.inode_count) {
                    Ok(Some(inode)) => {
                        self.inodes.insert(number, inode);
                    }
                    Ok(None) => {}
                    Err(error) => {
                        self.change(format!("{error}; record cleared"));
                        self.cleared_records.push(number);
                    }
                }
            }
        }
        progress(&Progress { phase: "reading the inode table", done: total, total });
        Ok(())
    }

    /// Claims `runs` of blocks for `inode`, all or none. Says why not when a block lies outside
    /// the data region or is already used.
    fn claim(&mut self, inode: u64, runs: &[(u64, u64)]) -> std::result::Result<(), String> {
        let superblock = &self.volume.superblock;
        let mut wanted = BTreeSet::new();
        for (first, count) in runs {
            let end = first.checked_add(*count).filter(|end| *end <= superblock.block_count);
            let Some(end) = end.filter(|_| *first >= superblock.first_data_block) else {
                return Err(format!("blocks {first}+{count} lie outside the data region"));
            };
            for block in *first..end {
                if let Some(other) = self.owner.get(&block) {
                    return Err(format!("block {block} is also used by inode {other}"));
                }
                if !wanted.insert(block) {
                    return Err(format!("block {block} is used twice"));
                }
            }
        }
        for block in wanted {
            self.owner.insert(block, inode);
        }
        Ok(())
    }

    /// Checks what every inode owns: extent trees, directories, xattr blocks.
    fn scan_contents(&mut self, progress: &mut dyn FnMut(&Progress)) -> Result<()> {
        let numbers: Vec<u64> = self.inodes.keys().copied().collect();
        let total = numbers.len() as u64;
        for (done, number) in numbers.into_iter().enumerate() {
            if (done as u64).is_multiple_of(PROGRESS_STEP) {
                progress(&Progress { phase: "checking files and directories", done: done as u64, total });
            }
            let mut inode = self.inodes[&number].clone();
            let keep = match inode.file_type() {
                FileType::Regular | FileType::Symlink => self.scan_file(&mut inode)?,
                FileType::Directory => self.scan_directory(&mut inode)?,
                _ => true,
            };
            if !keep {
                self.inodes.remove(&number);
                self.cleared_records.push(number);
                continue;
            }
            self.scan_xattrs(&mut inode)?;
            if inode.file_type() != FileType::Directory {
                let tree_blocks = ExtentRoot::decode(&inode.root_area).map(|root| root.blocks_owned()).unwrap_or(0);
                let owned = tree_blocks + (inode.xattr_block != 0) as u64;
                if inode.blocks_owned != owned {
                    self.change(format!(
                        "inode {number}: counts {} blocks owned, {owned} found; corrected",
                        inode.blocks_owned
                    ));
                    inode.blocks_owned = owned;
                }
            }
            if inode != self.inodes[&number] {
                self.dirty_inodes.insert(number);
                self.inodes.insert(number, inode);
            }
        }
        progress(&Progress { phase: "checking files and directories", done: total, total });
        Ok(())
    }

    /// A file's extent tree: kept when whole and its blocks are its own; otherwise the file is
    /// emptied (a symlink, which cannot be empty, is removed). Returns whether to keep the inode.
    fn scan_file(&mut self, inode: &mut Inode) -> Result<bool> {
        let number = inode.inode_number;
        let damage = match ExtentRoot::decode(&inode.root_area) {
            Err(error) => Some(error.to_string()),
            Ok(root) => {
                let mut checked = extent::check(&mut self.volume, &root);
                if !checked.problems.is_empty() && checked.problems.len() == checked.share_mismatches.len() {
                    // The tree is whole; only the references recorded for shared blocks are off.
                    self.record_references(number, &checked.share_mismatches)?;
                    checked.problems.clear();
                }
                if let Some(problem) = checked.problems.first() {
                    Some(problem.clone())
                } else {
                    let mut runs = checked.data_blocks.clone();
                    runs.extend(checked.tree_blocks.iter().map(|block| (*block, 1)));
                    match self.claim(number, &runs) {
                        Err(why) => Some(why),
                        Ok(()) => {
                            self.data_runs.extend(checked.data_blocks.iter().copied());
                            if inode.size_bytes != root.length_bytes() {
                                self.change(format!(
                                    "inode {number}: size {} but its extent tree maps {} bytes; size corrected",
                                    inode.size_bytes,
                                    root.length_bytes()
                                ));
                                inode.size_bytes = root.length_bytes();
                            }
                            None
                        }
                    }
                }
            }
        };
        let Some(why) = damage else { return Ok(true) };
        if inode.file_type() == FileType::Symlink {
            self.change(format!("inode {number} (symbolic link): {why}; removed"));
            return Ok(false);
        }
        self.change(format!("inode {number}: extent tree damaged ({why}); file emptied"));
        inode.root_area = ExtentRoot::empty().encode();
        inode.size_bytes = 0;
        Ok(true)
    }

    /// Records the references found for shared data blocks whose recorded count is wrong: too
    /// few would free a block extents still map, too many would leak it (format version 8).
    fn record_references(&mut self, number: u64, mismatches: &[(u64, u64, u64)]) -> Result<()> {
        use crate::block::meta::DataStore;
        for &(block, references, recorded) in mismatches {
            // One reference left: the block stays marked shared (its free room stays unused).
            self.volume.set_shared_references(block, references)?;
            self.change(format!(
                "inode {number}: data block {block}: {references} extents reference it, {recorded} references were recorded; recorded {references}"
            ));
        }
        Ok(())
    }

    /// A directory: its entries as the check reads them when it is whole, else as much as its
    /// leaves still hold (then it is rebuilt).
    fn scan_directory(&mut self, inode: &mut Inode) -> Result<bool> {
        let number = inode.inode_number;
        let root = match DirRoot::decode(&inode.root_area) {
            Ok(root) => root,
            Err(error) => {
                self.change(format!("directory {number}: {error}; rebuilt empty"));
                self.entries.insert(number, Vec::new());
                self.rebuild.insert(number);
                return Ok(true);
            }
        };
        let checked = dir::check(&mut self.volume, &root, &self.seed);
        let mut damage = checked.problems.first().cloned();
        if damage.is_none() && checked.entries.len() as u64 != root.entry_count() {
            damage = Some(format!("root counts {} entries, {} found", root.entry_count(), checked.entries.len()));
        }
        if damage.is_none() {
            let runs: Vec<(u64, u64)> = checked.blocks.iter().map(|block| (*block, 1)).collect();
            damage = self.claim(number, &runs).err();
        }
        match damage {
            None => {
                self.entries.insert(number, checked.entries);
                self.directory_blocks.insert(number, checked.blocks);
            }
            Some(why) => {
                let owner = &self.owner;
                let salvaged = dir::salvage(&mut self.volume, &root, &|block| owner.contains_key(&block));
                self.change(format!(
                    "directory {number}: {why}; rebuilt from its leaves ({} entries recovered)",
                    salvaged.len()
                ));
                self.entries.insert(number, salvaged);
                self.rebuild.insert(number);
            }
        }
        Ok(true)
    }

    fn scan_xattrs(&mut self, inode: &mut Inode) -> Result<()> {
        if inode.xattr_block == 0 {
            return Ok(());
        }
        let number = inode.inode_number;
        let damage = match self.volume.read_xattrs(inode.xattr_block) {
            Err(error @ Error::Io { .. }) => return Err(error),
            Err(error) => Some(error.to_string()),
            Ok(_) => self.claim(number, &[(inode.xattr_block, 1)]).err(),
        };
        if let Some(why) = damage {
            self.change(format!("inode {number}: extended attributes lost ({why})"));
            inode.xattr_block = 0;
        }
        Ok(())
    }

    /// Walks the tree from the root, then gives every unreachable inode a name in /lost+found.
    fn walk_namespace(&mut self) -> Result<()> {
        if self.inodes.get(&ROOT_INODE).is_none_or(|root| root.file_type() != FileType::Directory) {
            if self.inodes.remove(&ROOT_INODE).is_some() {
                self.cleared_records.push(ROOT_INODE);
            }
            self.change("the root directory is lost; created an empty one".into());
            self.new_directory(ROOT_INODE, ROOT_INODE);
        }
        self.collect_orphans();
        self.parent_of.insert(ROOT_INODE, ROOT_INODE);
        let mut queue = VecDeque::from([ROOT_INODE]);
        self.walk(&mut queue);
        // Directories first, so that what they hold is reached through them; a directory that
        // another unreachable directory names waits for it (unless they form a cycle).
        let inode_count = self.volume.superblock.inode_count;
        for _ in 0..=inode_count {
            let lost: Vec<u64> = self
                .inodes
                .iter()
                .filter(|(number, inode)| inode.file_type() == FileType::Directory && self.unreachable(**number))
                .map(|(number, _)| *number)
                .collect();
            if lost.is_empty() {
                break;
            }
            let named: BTreeSet<u64> =
                lost.iter().flat_map(|directory| self.entries[directory].iter().map(|entry| entry.1)).collect();
            let mut tops: Vec<u64> = lost.iter().copied().filter(|directory| !named.contains(directory)).collect();
            if tops.is_empty() {
                tops.push(lost[0]);
            }
            for directory in tops {
                self.attach_to_lost_and_found(directory)?;
                queue.push_back(directory);
            }
            self.walk(&mut queue);
        }
        self.unlist_named_orphans();
        let lost_files: Vec<u64> = self.inodes.keys().copied().filter(|number| self.unreachable(*number)).collect();
        for number in lost_files {
            self.attach_to_lost_and_found(number)?;
        }
        Ok(())
    }

    fn unreachable(&self, number: u64) -> bool {
        !self.parent_of.contains_key(&number) && !self.names.contains_key(&number) && !self.orphans.contains(&number)
    }

    /// The orphan list, if every inode on it is valid; otherwise it is dropped and its inodes
    /// go to /lost+found like any unreachable inode.
    fn collect_orphans(&mut self) {
        let superblock = &self.volume.superblock;
        let mut orphan = superblock.orphan_head;
        let mut found = BTreeSet::new();
        let mut broken = None;
        while orphan != 0 {
            if found.len() as u64 > superblock.inode_count || !found.insert(orphan) {
                broken = Some("has a cycle".to_string());
                break;
            }
            match self.inodes.get(&orphan) {
                Some(inode) => orphan = inode.orphan_next,
                None => {
                    broken = Some(format!("names inode {orphan}, which is free or lost"));
                    break;
                }
            }
        }
        match broken {
            None => self.orphans = found,
            Some(why) => {
                self.change(format!("the orphan list {why}; dropped"));
                self.volume.superblock.orphan_head = 0;
                for number in found {
                    if let Some(inode) = self.inodes.get_mut(&number) {
                        inode.orphan_next = 0;
                        self.dirty_inodes.insert(number);
                    }
                }
            }
        }
    }

    /// An orphan is reclaimed at the next mount: one that still has a name must leave the list,
    /// or the mount would free a named file. The list is relinked without it.
    fn unlist_named_orphans(&mut self) {
        let named: Vec<u64> = self
            .orphans
            .iter()
            .copied()
            .filter(|number| self.names.contains_key(number) || self.parent_of.contains_key(number))
            .collect();
        if named.is_empty() {
            return;
        }
        for number in &named {
            self.change(format!("inode {number} is on the orphan list but has a name; taken off the list"));
            self.orphans.remove(number);
        }
        // Relink in the list's own order.
        let mut order = Vec::new();
        let mut orphan = self.volume.superblock.orphan_head;
        while orphan != 0 && order.len() <= self.orphans.len() + named.len() {
            order.push(orphan);
            orphan = self.inodes.get(&orphan).map_or(0, |inode| inode.orphan_next);
        }
        let kept: Vec<u64> = order.into_iter().filter(|number| self.orphans.contains(number)).collect();
        self.volume.superblock.orphan_head = kept.first().copied().unwrap_or(0);
        for number in named.iter().chain(kept.iter()) {
            let next = kept.iter().skip_while(|each| *each != number).nth(1).copied().unwrap_or(0);
            let inode = self.inodes.get_mut(number).expect("orphans are valid inodes");
            if inode.orphan_next != next {
                inode.orphan_next = next;
                self.dirty_inodes.insert(*number);
            }
        }
    }

    /// Breadth-first walk of the directories in `queue`: drops entries that name free or lost
    /// inodes and second names of directories, corrects entry types, counts names.
    fn walk(&mut self, queue: &mut VecDeque<u64>) {
        while let Some(directory) = queue.pop_front() {
            let entries = self.entries.remove(&directory).unwrap_or_default();
            let mut kept = Vec::with_capacity(entries.len());
            for (name, child, file_type) in entries {
                let shown = String::from_utf8_lossy(&name).into_owned();
                let Some(actual) = self.inodes.get(&child).map(|inode| inode.file_type()) else {
                    self.change(format!(
                        "directory {directory}: entry {shown:?} names inode {child}, which is free or lost; entry dropped"
                    ));
                    self.rebuild.insert(directory);
                    continue;
                };
                if actual == FileType::Directory
                    && (child == ROOT_INODE || self.parent_of.contains_key(&child) || self.orphans.contains(&child))
                {
                    self.change(format!(
                        "directory {directory}: entry {shown:?} is a second name of directory {child}; entry dropped"
                    ));
                    self.rebuild.insert(directory);
                    continue;
                }
                let mut file_type = file_type;
                if actual.dirent_type() != file_type {
                    self.change(format!(
                        "directory {directory}: entry {shown:?} has type {file_type}, inode {child} is a {actual:?}; type corrected"
                    ));
                    file_type = actual.dirent_type();
                    self.rebuild.insert(directory);
                }
                if actual == FileType::Directory {
                    self.parent_of.insert(child, directory);
                    *self.subdirectories.entry(directory).or_default() += 1;
                    queue.push_back(child);
                    if directory == ROOT_INODE && name == LOST_AND_FOUND {
                        self.lost_and_found = Some(child);
                    }
                } else {
                    *self.names.entry(child).or_default() += 1;
                }
                kept.push((name, child, file_type));
            }
            self.entries.insert(directory, kept);
        }
    }

    /// An empty directory record for `number` under `parent`; built at write-back.
    fn new_directory(&mut self, number: u64, parent: u64) {
        let now = backend::now_ns();
        let superblock = &mut self.volume.superblock;
        let generation = superblock.next_generation;
        superblock.next_generation += 1;
        let permissions = if number == ROOT_INODE { 0o755 } else { LOST_AND_FOUND_MODE & 0o7777 };
        let inode = Inode::empty_directory(number, generation, permissions, parent, now);
        self.inodes.insert(number, inode);
        self.dirty_inodes.insert(number);
        self.entries.insert(number, Vec::new());
        self.rebuild.insert(number);
        self.changed = true;
    }

    /// /lost+found, created in the root when missing.
    fn lost_and_found(&mut self) -> Result<u64> {
        if let Some(number) = self.lost_and_found {
            return Ok(number);
        }
        let inode_count = self.volume.superblock.inode_count;
        let number = (2..=inode_count)
            .find(|number| !self.inodes.contains_key(number))
            .ok_or_else(|| Error::corruption("no free inode left for /lost+found"))?;
        self.new_directory(number, ROOT_INODE);
        let taken: BTreeSet<&[u8]> = self.entries[&ROOT_INODE].iter().map(|entry| entry.0.as_slice()).collect();
        let name = if taken.contains(LOST_AND_FOUND) {
            format!("lost+found.{number}").into_bytes()
        } else {
            LOST_AND_FOUND.to_vec()
        };
        self.change(format!("created /{} (inode {number})", String::from_utf8_lossy(&name)));
        self.entries.get_mut(&ROOT_INODE).expect("root walked").push((name, number, FileType::Directory.dirent_type()));
        self.rebuild.insert(ROOT_INODE);
        self.parent_of.insert(number, ROOT_INODE);
        *self.subdirectories.entry(ROOT_INODE).or_default() += 1;
        self.lost_and_found = Some(number);
        Ok(number)
    }

    /// Names an unreachable inode `#N` in /lost+found, as e2fsck does.
    fn attach_to_lost_and_found(&mut self, number: u64) -> Result<()> {
        let directory = self.lost_and_found()?;
        let file_type = self.inodes[&number].file_type();
        let name = format!("#{number}");
        self.change(format!("inode {number} ({file_type:?}) had no name; moved to /lost+found/{name}"));
        self.entries.get_mut(&directory).expect("lost+found walked").push((
            name.into_bytes(),
            number,
            file_type.dirent_type(),
        ));
        self.rebuild.insert(directory);
        if file_type == FileType::Directory {
            self.parent_of.insert(number, directory);
            *self.subdirectories.entry(directory).or_default() += 1;
        } else {
            *self.names.entry(number).or_default() += 1;
        }
        Ok(())
    }

    /// Link counts from the names found, parents from the walk.
    fn correct_counts(&mut self) {
        let numbers: Vec<u64> = self.inodes.keys().copied().collect();
        for number in numbers {
            if self.orphans.contains(&number) {
                continue;
            }
            let inode = &self.inodes[&number];
            let is_directory = inode.file_type() == FileType::Directory;
            let expected = if is_directory {
                2 + self.subdirectories.get(&number).copied().unwrap_or(0)
            } else {
                self.names.get(&number).copied().unwrap_or(0)
            };
            let (old_links, old_parent) = (inode.link_count, inode.parent);
            if old_links != expected {
                self.change(format!("inode {number}: link count {old_links} but {expected} names; corrected"));
            }
            let parent = if is_directory { self.parent_of[&number] } else { old_parent };
            if parent != old_parent {
                self.change(format!("directory {number}: names parent {old_parent} but is in {parent}; corrected"));
            }
            if old_links != expected || parent != old_parent {
                let inode = self.inodes.get_mut(&number).expect("listed above");
                inode.link_count = expected;
                inode.parent = parent;
                self.dirty_inodes.insert(number);
            }
        }
    }

    /// Both bitmaps from what is used; each disagreement with the bitmap on disk is reported.
    fn rebuild_bitmaps(&mut self) -> Result<()> {
        let superblock = self.volume.superblock.clone();
        let mut blocks = Bitmap::new(superblock.block_count, BlockKind::BlockBitmap);
        blocks.set_metadata_zone(self.volume.device.stripe_bytes().is_some());
        blocks.set_range(0, superblock.first_data_block);
        let mut used: Vec<u64> = self.owner.keys().copied().collect();
        used.sort_unstable();
        for block in used {
            blocks.set_range(block, 1);
        }
        let mut inodes = Bitmap::new(superblock.inode_count, BlockKind::InodeBitmap);
        for number in self.inodes.keys() {
            inodes.set_range(number - 1, 1);
        }
        self.compare_bitmap(&blocks, superblock.block_bitmap_start, "block")?;
        self.compare_bitmap(&inodes, superblock.inode_bitmap_start, "inode")?;
        self.volume.blocks = blocks;
        self.volume.inodes = inodes;
        // Blocks read while scanning that nothing references are free now; cached, they would
        // look in use to the allocator's check when the repair allocates.
        self.volume.forget_cached_free_blocks();
        // So would their entries in the generation table; and the file data kept must be
        // recorded there, so that the allocator never hands it out again.
        let cleared = self.volume.forget_generations_of_free_blocks()?;
        if cleared > 0 {
            self.change(format!("generation table: {cleared} free blocks were recorded as in use; cleared"));
        }
        let recorded = self.volume.record_data_blocks(&std::mem::take(&mut self.data_runs))?;
        if recorded > 0 {
            self.change(format!("generation table: {recorded} blocks of file data were not recorded; recorded"));
        }
        Ok(())
    }

    /// Reads the bitmap on disk block by block and marks `rebuilt` dirty wherever they differ.
    fn compare_bitmap(&mut self, rebuilt: &Bitmap, start: u64, what: &str) -> Result<()> {
        let bit_count = rebuilt.bit_count();
        let mut on_disk = Bitmap::new(bit_count, rebuilt.kind);
        let (mut damaged, mut marked_free, mut marked_used) = (0u64, 0u64, 0u64);
        for index in 0..rebuilt.bitmap_blocks() {
            let mut block = Box::new([0u8; BLOCK_SIZE]);
            self.volume.device.read_at((start + index) * BLOCK_SIZE_U64, &mut block[..])?;
            let readable = verify_block(&block, rebuilt.kind, start + index)
                .and_then(|()| self.volume.check_generation(&block, rebuilt.kind, start + index))
                .and_then(|()| on_disk.decode_block(index, &block));
            if let Err(error) = readable {
                self.change(format!("{what} bitmap block {}: {error}; rebuilt", start + index));
                damaged += 1;
            }
        }
        let first_differs = (0..bit_count).find(|bit| on_disk.is_set(*bit) != rebuilt.is_set(*bit));
        if first_differs.is_none() && damaged == 0 {
            return Ok(());
        }
        for bit in 0..bit_count {
            match (on_disk.is_set(bit), rebuilt.is_set(bit)) {
                (false, true) => marked_free += 1,
                (true, false) => marked_used += 1,
                _ => {}
            }
        }
        if marked_free + marked_used > 0 {
            self.change(format!(
                "{what} bitmap: {marked_free} {what}s in use were marked free, {marked_used} unused were marked in use; rebuilt from the references"
            ));
        }
        self.changed = true;
        Ok(())
    }

    /// Writes the decisions into the volume's cache: lost table blocks, cleared records,
    /// rebuilt directories, corrected inodes. The checkpoint takes them home.
    fn write_back(&mut self, progress: &mut dyn FnMut(&Progress)) -> Result<()> {
        if self.changed {
            self.volume.blocks.mark_all_dirty();
            self.volume.inodes.mark_all_dirty();
        }
        for block_number in std::mem::take(&mut self.lost_table_blocks) {
            self.volume.clear_inode_table_block(block_number)?;
        }
        for number in std::mem::take(&mut self.cleared_records) {
            self.volume.clear_inode_record(number)?;
        }
        let rebuild: Vec<u64> = self.rebuild.iter().copied().collect();
        let total = rebuild.len() as u64;
        for (done, directory) in rebuild.into_iter().enumerate() {
            progress(&Progress { phase: "rebuilding directories", done: done as u64, total });
            self.rebuild_directory(directory)?;
        }
        for number in std::mem::take(&mut self.dirty_inodes) {
            if let Some(inode) = self.inodes.get(&number) {
                self.volume.write_inode(inode)?;
                self.changed = true;
            }
        }
        Ok(())
    }

    /// A fresh H-tree holding the directory's entries; its old blocks were not claimed, so the
    /// rebuilt bitmap already counts them free.
    fn rebuild_directory(&mut self, directory: u64) -> Result<()> {
        use crate::block::meta::MetaStore;
        // A whole directory rebuilt for a changed entry list claimed its blocks: give them back.
        for block in self.directory_blocks.remove(&directory).unwrap_or_default() {
            self.volume.free_meta(block)?;
        }
        let entries = self.entries.get(&directory).cloned().unwrap_or_default();
        let mut root = dir::create(&mut self.volume)?;
        for (name, child, file_type) in &entries {
            match dir::insert(&mut self.volume, &mut root, &self.seed, name, *child, *file_type) {
                Ok(()) => {}
                Err(error @ Error::Io { .. }) => return Err(error),
                Err(error) => {
                    self.change(format!(
                        "directory {directory}: entry {:?} cannot be kept ({error}); dropped",
                        String::from_utf8_lossy(name)
                    ));
                    self.unname(*child);
                }
            }
        }
        let inode = self.inodes.get_mut(&directory).expect("a directory to rebuild has a record");
        inode.root_area = root.encode();
        self.dirty_inodes.insert(directory);
        self.changed = true;
        Ok(())
    }

    /// An entry was dropped after the counts were made: one name fewer.
    fn unname(&mut self, child: u64) {
        if let Some(inode) = self.inodes.get_mut(&child) {
            inode.link_count = inode.link_count.saturating_sub(1);
            self.dirty_inodes.insert(child);
        }
    }
}
