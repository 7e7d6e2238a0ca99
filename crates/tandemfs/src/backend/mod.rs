//! `backend`: applies durable log records to their home structures (NICFS's back end: fetch →
//! locate → merge → patch), takes checkpoints, and replays the log at mount.
//!
//! Checkpoint protocol (the log is the only journal):
//! 1. take sealed images of every changed metadata block, covering records up to lsn X;
//! 2. flush the device (the file data of records up to X, written home when they were
//!    applied, is durable before a commit naming X can exist on the medium); append the images
//!    to the log as image records, then a commit record naming X; flush the log;
//! 3. write the images home; flush the device;
//! 4. write the superblock with the log tail at the first unapplied record (or just past this
//!    checkpoint's own records) and the checkpoint one before it; flush;
//! 5. release the log before the tail and let frees up to X be reused.
//!
//! A crash before 2 completes leaves the old checkpoint and the log intact; after it, mount
//! finds the commit, writes its images home again and finishes step 4.

mod deposits;
pub mod driver;
pub mod parallel;
pub mod record;
pub mod store;

use crate::block::codec::Decoder;
use crate::block::inode::Inode;
use crate::block::meta::{verify_block, BlockBuf, BlockKind, BLOCK_SIZE, BLOCK_SIZE_U64, TRAILER_KIND_OFFSET};
use crate::block::superblock::{Superblock, STATE_MOUNTED};
use crate::block::volume::{Image, Volume};
use crate::device::Device;
use crate::dir::{self, DirRoot, HashSeed};
use crate::error::{Error, Result};
use crate::extent::{self, ExtentRoot};
use crate::fs::types::MountReport;
use crate::log::{Log, LogOptions, LogPosition, Record};
use crate::types::FileType;
use record::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use store::ApplyStore;

/// Images per checkpoint record: 64 blocks keeps a record at 260 KiB.
const IMAGES_PER_RECORD: usize = 64;
/// Longest orphan list walked before it is declared corrupt (it cannot exceed the inode count).
const ORPHAN_WALK_MAX: u64 = 1 << 32;

pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as i64)
        .unwrap_or(0)
}

/// The inodes one record touches, read once and written back together.
struct Touched {
    inodes: BTreeMap<u64, Inode>,
    deleted: Vec<u64>,
    /// (inode, blocks owned) of inodes the record created, which it writes itself: reported
    /// with the touched ones, so that the front end's view takes the volume's count.
    created: Vec<(u64, u64)>,
}

impl Touched {
    fn new() -> Touched {
        Touched { inodes: BTreeMap::new(), deleted: Vec::new(), created: Vec::new() }
    }
    fn get<'a>(&'a mut self, volume: &mut dyn ApplyStore, inode_number: u64) -> Result<&'a mut Inode> {
        match self.inodes.entry(inode_number) {
            std::collections::btree_map::Entry::Occupied(slot) => Ok(slot.into_mut()),
            std::collections::btree_map::Entry::Vacant(slot) => {
                let inode = volume.read_inode(inode_number).map_err(|error| match error {
                    Error::NotFound => {
                        Error::corruption(format!("log record names inode {inode_number}, which is free"))
                    }
                    other => other,
                })?;
                Ok(slot.insert(inode))
            }
        }
    }
    fn image(&mut self, volume: &mut dyn ApplyStore, image: &AttributeImage) -> Result<()> {
        let inode = self.get(volume, image.inode_number)?;
        check_attribute_image(inode, image)?;
        image.apply_to(inode);
        Ok(())
    }
    /// Writes the touched inodes back; returns (inode, blocks owned) of each one still in use.
    fn write_back(self, volume: &mut dyn ApplyStore) -> Result<Vec<(u64, u64)>> {
        let mut owned = Vec::with_capacity(self.inodes.len() + self.created.len());
        owned.extend_from_slice(&self.created);
        for (inode_number, inode) in &self.inodes {
            if !self.deleted.contains(inode_number) {
                volume.write_inode(inode)?;
                owned.push((*inode_number, inode.blocks_owned));
            }
        }
        Ok(owned)
    }
}

/// A record's image must name the inode as it is: the same generation and type.
fn check_attribute_image(inode: &Inode, image: &AttributeImage) -> Result<()> {
    if inode.generation != image.generation || FileType::from_mode(inode.mode) != FileType::from_mode(image.mode) {
        return Err(Error::corruption(format!(
            "log record for inode {} generation {} finds generation {} of type {:#o}",
            image.inode_number, image.generation, inode.generation, inode.mode
        )));
    }
    Ok(())
}

fn dir_root(inode: &Inode) -> Result<DirRoot> {
    if inode.file_type() != FileType::Directory {
        return Err(Error::corruption(format!("inode {} is used as a directory but is not one", inode.inode_number)));
    }
    DirRoot::decode(&inode.root_area)
}

fn extent_root(inode: &Inode) -> Result<ExtentRoot> {
    match inode.file_type() {
        FileType::Regular | FileType::Symlink => ExtentRoot::decode(&inode.root_area),
        _ => Err(Error::corruption(format!("inode {} has no data but a data operation names it", inode.inode_number))),
    }
}

fn set_extent_root(inode: &mut Inode, root: &ExtentRoot) {
    inode.root_area = root.encode();
    inode.blocks_owned = root.blocks_owned() + (inode.xattr_block != 0) as u64;
}

/// Most records one `DataRun` applies before it is committed: bounds what an error throws
/// away with it (the back end stops then anyway) and the nodes it holds.
pub const RUN_RECORDS_MAX: usize = 256;
/// Most tree nodes one `DataRun` holds in memory before it is committed (about 4 KiB each).
pub const RUN_NODES_MAX: usize = 1024;

/// Consecutive data records on one regular file (writes, inserts, collapses and punches of
/// ranges) applied through one open extent tree (`extent::FileRun`) and one read of the inode,
/// with the tree's changed nodes written and the inode written back once, when the run ends
/// (`Applier::end_run`). The caller holds it between records and ends it before anything else
/// reads the volume: see `Applier::apply_in_run`.
pub struct DataRun {
    inode: Inode,
    run: extent::FileRun,
}

/// The file and the change of a record that a `DataRun` can take.
fn run_change(op: &Op) -> Option<(&AttributeImage, extent::FileChange<'_>)> {
    match op {
        Op::Write { inode, offset, data, insert: false } => {
            Some((inode, extent::FileChange::Write { offset: *offset, data }))
        }
        Op::Write { inode, offset, data, insert: true } => {
            Some((inode, extent::FileChange::InsertData { offset: *offset, data }))
        }
        Op::Range { inode, kind, offset, length, .. } => {
            let (offset, length_bytes) = (*offset, *length);
            let change = match kind {
                RangeKind::Insert => extent::FileChange::Insert { offset, length_bytes },
                RangeKind::Collapse => extent::FileChange::Collapse { offset, length_bytes },
                RangeKind::PunchHole => extent::FileChange::PunchHole { offset, length_bytes },
                RangeKind::ZeroRange | RangeKind::Allocate | RangeKind::Compact => return None,
            };
            Some((inode, change))
        }
        _ => None,
    }
}

/// Everything the back end keeps besides the volume.
#[derive(Clone)]
pub struct Applier {
    pub hash_seed: HashSeed,
}

impl Applier {
    /// Applies one durable record and returns (inode, blocks owned) of every inode it wrote. An
    /// error here means the volume and the log disagree (corruption) or the device failed; the
    /// caller stops accepting changes.
    pub fn apply(&self, volume: &mut dyn ApplyStore, lsn: u64, op: &Op) -> Result<Vec<(u64, u64)>> {
        volume.begin_record(lsn);
        let seed = self.hash_seed;
        let mut touched = Touched::new();
        match op {
            Op::Create { parent, name, inode: image, symlink_target } => {
                self.create_inode(volume, &mut touched, image, symlink_target)?;
                let parent_inode = touched.get(volume, parent.inode_number)?;
                let mut root = dir_root(parent_inode)?;
                dir::insert(volume, &mut root, &seed, name, image.inode_number, image.file_type().dirent_type())?;
                touched.get(volume, parent.inode_number)?.root_area = root.encode();
                touched.image(volume, parent)?;
            }
            Op::CreateBatch { parents, creates } => {
                // As that many creates in record order, but each parent's H-tree root is read
                // once, every name of the record inserted into it, and written back once.
                let mut roots = Vec::with_capacity(parents.len());
                for parent in parents {
                    roots.push(dir_root(touched.get(volume, parent.inode_number)?)?);
                }
                for create in creates {
                    self.create_inode(volume, &mut touched, &create.inode, &[])?;
                    let root = &mut roots[create.parent as usize];
                    let dirent_type = create.inode.file_type().dirent_type();
                    dir::insert(volume, root, &seed, &create.name, create.inode.inode_number, dirent_type)?;
                }
                for (parent, root) in parents.iter().zip(&roots) {
                    touched.get(volume, parent.inode_number)?.root_area = root.encode();
                    touched.image(volume, parent)?;
                }
            }
            Op::Link { parent, name, inode } => {
                let parent_inode = touched.get(volume, parent.inode_number)?;
                let mut root = dir_root(parent_inode)?;
                dir::insert(volume, &mut root, &seed, name, inode.inode_number, inode.file_type().dirent_type())?;
                touched.get(volume, parent.inode_number)?.root_area = root.encode();
                touched.image(volume, parent)?;
                touched.image(volume, inode)?;
            }
            Op::Unlink { parent, name, inode, disposition } => {
                let parent_inode = touched.get(volume, parent.inode_number)?;
                let mut root = dir_root(parent_inode)?;
                let (removed, _) = dir::remove(volume, &mut root, &seed, name)?;
                if removed != inode.inode_number {
                    return Err(Error::corruption(format!(
                        "unlink record names inode {} but the entry points to {removed}",
                        inode.inode_number
                    )));
                }
                touched.get(volume, parent.inode_number)?.root_area = root.encode();
                touched.image(volume, parent)?;
                touched.image(volume, inode)?;
                self.dispose(volume, &mut touched, inode.inode_number, *disposition)?;
            }
            Op::Rename { parent, name, new_parent, new_name, kind, replaced, images } => {
                let source_root = dir_root(touched.get(volume, *parent)?)?;
                let (moved, moved_type) = dir::lookup(volume, &source_root, &seed, name)?
                    .ok_or_else(|| Error::corruption("rename record names a source entry that does not exist"))?;
                match kind {
                    RenameKind::Move => {
                        let mut target_root = dir_root(touched.get(volume, *new_parent)?)?;
                        match replaced {
                            Some((replaced_number, _)) => {
                                let (old, _) =
                                    dir::replace(volume, &mut target_root, &seed, new_name, moved, moved_type)?;
                                if old != *replaced_number {
                                    return Err(Error::corruption("rename record names the wrong replaced inode"));
                                }
                            }
                            None => dir::insert(volume, &mut target_root, &seed, new_name, moved, moved_type)?,
                        }
                        touched.get(volume, *new_parent)?.root_area = target_root.encode();
                        // Re-read: when both names share a directory the root just changed.
                        let mut source_root = dir_root(touched.get(volume, *parent)?)?;
                        dir::remove(volume, &mut source_root, &seed, name)?;
                        touched.get(volume, *parent)?.root_area = source_root.encode();
                    }
                    RenameKind::Exchange => {
                        let target_root = dir_root(touched.get(volume, *new_parent)?)?;
                        let (other, other_type) = dir::lookup(volume, &target_root, &seed, new_name)?
                            .ok_or_else(|| Error::corruption("exchange record names a missing target"))?;
                        let mut source_root = dir_root(touched.get(volume, *parent)?)?;
                        dir::replace(volume, &mut source_root, &seed, name, other, other_type)?;
                        touched.get(volume, *parent)?.root_area = source_root.encode();
                        let mut target_root = dir_root(touched.get(volume, *new_parent)?)?;
                        dir::replace(volume, &mut target_root, &seed, new_name, moved, moved_type)?;
                        touched.get(volume, *new_parent)?.root_area = target_root.encode();
                    }
                }
                for image in images {
                    touched.image(volume, image)?;
                }
                if let Some((replaced_number, disposition)) = replaced {
                    self.dispose(volume, &mut touched, *replaced_number, *disposition)?;
                }
            }
            Op::SetAttributes { inode: image, truncate } => {
                let inode = touched.get(volume, image.inode_number)?;
                if *truncate && inode.file_type() == FileType::Regular {
                    let mut root = extent_root(inode)?;
                    extent::truncate(volume, &mut root, image.size_bytes)?;
                    set_extent_root(touched.get(volume, image.inode_number)?, &root);
                }
                touched.image(volume, image)?;
            }
            Op::Write { inode: image, offset, data, insert } => {
                let mut root = extent_root(touched.get(volume, image.inode_number)?)?;
                if *insert {
                    extent::insert_data(volume, &mut root, image.inode_number, *offset, data)?;
                } else {
                    extent::write_in_file(volume, &mut root, image.inode_number, *offset, data)?;
                }
                set_extent_root(touched.get(volume, image.inode_number)?, &root);
                touched.image(volume, image)?;
            }
            Op::DirectWrite { inode: image, offset, length, runs, checksums } => {
                // The blocks were claimed for this record (by the front end, or by replay
                // before the first record): they become the file's with the checksums of the
                // bytes written there before the record was logged.
                let mut taken = 0usize;
                for &(first, count) in runs {
                    let entries = checksums
                        .get(taken..taken + count as usize)
                        .ok_or_else(|| Error::corruption("direct write record: fewer checksums than blocks"))?;
                    volume.take_claimed_data(first, count, entries)?;
                    taken += count as usize;
                }
                let mut root = extent_root(touched.get(volume, image.inode_number)?)?;
                extent::map_written(volume, &mut root, *offset, *length, runs)?;
                set_extent_root(touched.get(volume, image.inode_number)?, &root);
                touched.image(volume, image)?;
            }
            Op::Range { inode: image, kind, offset, length, keep_size } => {
                let mut root = extent_root(touched.get(volume, image.inode_number)?)?;
                match kind {
                    RangeKind::Insert => extent::insert_range(volume, &mut root, *offset, *length)?,
                    RangeKind::Collapse => extent::collapse_range(volume, &mut root, *offset, *length)?,
                    RangeKind::PunchHole => extent::punch_hole(volume, &mut root, *offset, *length)?,
                    RangeKind::ZeroRange => extent::zero_range(volume, &mut root, *offset, *length, *keep_size)?,
                    RangeKind::Allocate => extent::allocate(volume, &mut root, *offset, *length, *keep_size)?,
                    RangeKind::Compact => {
                        extent::compact(volume, &mut root, *offset, *length)?;
                    }
                }
                set_extent_root(touched.get(volume, image.inode_number)?, &root);
                touched.image(volume, image)?;
            }
            Op::SetXattr { inode: image, name, value } => {
                let mut inode = touched.get(volume, image.inode_number)?.clone();
                let mut attributes = volume.read_xattrs(inode.xattr_block)?;
                attributes.insert(name.clone(), value.clone());
                if Volume::xattr_encoded_bytes(&attributes) > crate::block::volume::XATTR_BLOCK_PAYLOAD_BYTES {
                    return Err(Error::corruption("xattr record overflows the attribute block"));
                }
                volume.write_xattrs(&mut inode, &attributes)?;
                *touched.get(volume, image.inode_number)? = inode;
                touched.image(volume, image)?;
            }
            Op::RemoveXattr { inode: image, name } => {
                let mut inode = touched.get(volume, image.inode_number)?.clone();
                let mut attributes = volume.read_xattrs(inode.xattr_block)?;
                attributes.remove(name);
                volume.write_xattrs(&mut inode, &attributes)?;
                *touched.get(volume, image.inode_number)? = inode;
                touched.image(volume, image)?;
            }
            Op::Reclaim { inode_number } => {
                self.remove_orphan(volume, &mut touched, *inode_number)?;
                self.free_inode(volume, &mut touched, *inode_number)?;
            }
        }
        touched.write_back(volume)
    }

    /// Applies one durable record as `apply` does, but keeps consecutive data records on one
    /// regular file in `run` (a `DataRun`: one tree open, one commit), and ends the run first
    /// when the record is of another kind or another file, or the run is full. Returns (inode,
    /// blocks owned) of the inodes written meanwhile; a run's own inode is reported when it
    /// ends.
    ///
    /// The caller must `end_run` before the volume is read or changed by anything but this
    /// function (before it lets go of the volume lock, ends a change, takes a checkpoint or
    /// looks at its free blocks), and `abort_run` after an error, which stops the back end as
    /// `apply`'s errors do. A run's frees are recorded when it ends, under the lsn of its last
    /// record (a later one than the record that freed them: they wait for a checkpoint covering
    /// that record), so a caller that stops a batch when free blocks run low must end the run
    /// before it looks.
    pub fn apply_in_run(
        &self,
        volume: &mut dyn ApplyStore,
        lsn: u64,
        op: &Op,
        run: &mut Option<DataRun>,
    ) -> Result<Vec<(u64, u64)>> {
        let Some((image, change)) = run_change(op) else {
            let mut owned = self.end_run(volume, run)?;
            owned.extend(self.apply(volume, lsn, op)?);
            return Ok(owned);
        };
        let full = |open: &DataRun| {
            open.inode.inode_number != image.inode_number
                || open.run.changes() >= RUN_RECORDS_MAX
                || open.run.node_count() >= RUN_NODES_MAX
        };
        let mut owned = if run.as_ref().is_some_and(full) { self.end_run(volume, run)? } else { Vec::new() };
        if run.is_none() {
            let mut touched = Touched::new();
            let inode = touched.get(volume, image.inode_number)?;
            if inode.file_type() != FileType::Regular {
                owned.extend(self.apply(volume, lsn, op)?);
                return Ok(owned);
            }
            let root = extent_root(inode)?;
            *run = Some(DataRun { run: extent::FileRun::open(&root, inode.inode_number), inode: inode.clone() });
        }
        volume.begin_record(lsn);
        let open = run.as_mut().expect("opened above");
        check_attribute_image(&open.inode, image)?;
        open.run.apply(volume, change)?;
        image.apply_to(&mut open.inode);
        Ok(owned)
    }

    /// Ends `run` if one is open: writes its tree's changed nodes and its inode, frees what it
    /// released. Returns (inode, blocks owned) of its inode.
    pub fn end_run(&self, volume: &mut dyn ApplyStore, run: &mut Option<DataRun>) -> Result<Vec<(u64, u64)>> {
        let Some(DataRun { mut inode, run: file_run }) = run.take() else {
            return Ok(Vec::new());
        };
        let root = file_run.commit(volume)?;
        set_extent_root(&mut inode, &root);
        volume.write_inode(&inode)?;
        Ok(vec![(inode.inode_number, inode.blocks_owned)])
    }

    /// Gives back what an open `run` allocated, after an error (the back end stops; replay
    /// applies the run's records again from the log).
    pub fn abort_run(&self, volume: &mut dyn ApplyStore, run: &mut Option<DataRun>) {
        if let Some(open) = run.take() {
            open.run.abort(volume);
        }
    }

    /// Writes the new inode `image` describes (a directory with its empty H-tree, a file or
    /// symbolic link with its extent tree) as a create record makes it.
    fn create_inode(
        &self,
        volume: &mut dyn ApplyStore,
        touched: &mut Touched,
        image: &AttributeImage,
        symlink_target: &[u8],
    ) -> Result<()> {
        let mut inode = image.to_new_inode();
        match image.file_type() {
            FileType::Directory => inode.root_area = dir::create(volume)?.encode(),
            FileType::Regular | FileType::Symlink => {
                let mut root = ExtentRoot::empty();
                if !symlink_target.is_empty() {
                    extent::write(volume, &mut root, 0, symlink_target)?;
                }
                set_extent_root(&mut inode, &root);
            }
            _ => {}
        }
        volume.create_inode(&inode)?;
        touched.created.push((inode.inode_number, inode.blocks_owned));
        volume.raise_next_generation(image.generation + 1);
        Ok(())
    }

    fn dispose(
        &self,
        volume: &mut dyn ApplyStore,
        touched: &mut Touched,
        inode_number: u64,
        disposition: Disposition,
    ) -> Result<()> {
        match disposition {
            Disposition::Keep => Ok(()),
            Disposition::Orphan => {
                let head = volume.orphan_head();
                touched.get(volume, inode_number)?.orphan_next = head;
                volume.set_orphan_head(inode_number);
                Ok(())
            }
            Disposition::Reclaim => self.free_inode(volume, touched, inode_number),
        }
    }

    /// Frees everything an inode owns and the inode itself.
    fn free_inode(&self, volume: &mut dyn ApplyStore, touched: &mut Touched, inode_number: u64) -> Result<()> {
        let inode = touched.get(volume, inode_number)?.clone();
        match inode.file_type() {
            FileType::Directory => dir::destroy(volume, dir_root(&inode)?)?,
            FileType::Regular | FileType::Symlink => extent::destroy(volume, extent_root(&inode)?)?,
            _ => {}
        }
        if inode.xattr_block != 0 {
            volume.free_meta(inode.xattr_block)?;
        }
        volume.delete_inode(inode_number)?;
        touched.deleted.push(inode_number);
        Ok(())
    }

    fn remove_orphan(&self, volume: &mut dyn ApplyStore, touched: &mut Touched, inode_number: u64) -> Result<()> {
        let mut previous: Option<u64> = None;
        let mut current = volume.orphan_head();
        let mut steps = 0u64;
        while current != 0 {
            steps += 1;
            if steps > ORPHAN_WALK_MAX.min(volume.inode_count() + 1) {
                return Err(Error::corruption("orphan list has a cycle"));
            }
            let next = touched.get(volume, current)?.orphan_next;
            if current == inode_number {
                match previous {
                    None => volume.set_orphan_head(next),
                    Some(previous) => touched.get(volume, previous)?.orphan_next = next,
                }
                touched.get(volume, current)?.orphan_next = 0;
                return Ok(());
            }
            previous = Some(current);
            current = next;
        }
        Err(Error::corruption(format!("reclaim record names inode {inode_number}, which is not an orphan")))
    }

    /// Frees every inode on the orphan list (mount after a crash: nothing is open).
    pub fn reclaim_orphans(&self, volume: &mut Volume) -> Result<u64> {
        let mut reclaimed = 0;
        while volume.superblock.orphan_head != 0 {
            if reclaimed > volume.superblock.inode_count {
                return Err(Error::corruption("orphan list has a cycle"));
            }
            let head = volume.superblock.orphan_head;
            let mut touched = Touched::new();
            // Only an inode without names is an orphan: a damaged list must not free a live file.
            if touched.get(volume, head)?.link_count != 0 {
                return Err(Error::corruption(format!("orphan list names inode {head}, which still has names")));
            }
            self.remove_orphan(volume, &mut touched, head)?;
            self.free_inode(volume, &mut touched, head)?;
            touched.write_back(volume)?;
            reclaimed += 1;
        }
        Ok(reclaimed)
    }
}

/// Commit record payload: covered lsn, image count, orphan head, next generation.
fn encode_commit(covered_lsn: u64, image_count: u64, superblock: &Superblock) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(32);
    for value in [covered_lsn, image_count, superblock.orphan_head, superblock.next_generation] {
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    bytes
}

/// Writes a checkpoint covering every record up to `covered_lsn`, which must all be applied to
/// the volume, and nothing after them until the snapshot is taken (the caller is the only
/// applier): `checkpoint_snapshot`, then `checkpoint_finish`.
pub fn checkpoint(volume: &parking_lot::Mutex<Volume>, log: &Log, covered_lsn: u64) -> Result<()> {
    let snapshot = checkpoint_snapshot(volume, covered_lsn, None)?;
    checkpoint_finish(volume, log, snapshot)
}

/// A checkpoint's step 1, taken with the volume held: the images and the superblock they
/// belong to.
pub struct CheckpointSnapshot {
    covered_lsn: u64,
    images: Vec<Image>,
    /// The log's pledge, told when the images are in the log (`checkpoint_finish`).
    pledges: Option<Arc<crate::log::Pledges>>,
    superblock: Superblock,
    device: Arc<dyn Device>,
}

/// Step 1: seals the images of every changed metadata block, with the volume held only for
/// that. Every record up to `covered_lsn` must be applied and none after it. With `pledges`,
/// the sealed images are pledged twice until `checkpoint_finish` has their commit durable
/// (`Pledges::checkpoint_committed`), counted before the sealing lowers the volume's estimate.
pub fn checkpoint_snapshot(
    volume: &parking_lot::Mutex<Volume>,
    covered_lsn: u64,
    pledges: Option<&Arc<crate::log::Pledges>>,
) -> Result<CheckpointSnapshot> {
    let mut volume = volume.lock();
    // A record that failed half way must never reach home: the log still holds it whole.
    volume.check_whole()?;
    let bound_blocks = volume.snapshot_bound_blocks();
    if let Some(pledges) = pledges {
        pledges.checkpoint_begins(bound_blocks);
    }
    let images = volume.snapshot_images()?;
    if let Some(pledges) = pledges {
        pledges.checkpoint_sealed(bound_blocks, images.len() as u64);
    }
    let mut superblock = volume.superblock.clone();
    // The counts the images' bitmaps hold: frees awaiting this checkpoint are free in them.
    superblock.free_blocks = volume.blocks.free_count() + volume.blocks.pending_free_count();
    superblock.free_inodes = volume.inodes.free_count();
    Ok(CheckpointSnapshot { covered_lsn, images, pledges: pledges.cloned(), superblock, device: volume.device.clone() })
}

/// Steps 2 to 5, with the volume lock taken only at the end. Records after the snapshot's may
/// be applied meanwhile (the back end goes on while this runs in its own thread): the images
/// are sealed copies (a change after the seal copies the block), a block freed by a record
/// after the snapshot stays pending until a later checkpoint, the log tail stops at the first
/// record the images do not cover, and only the cache entries still holding the sealed copy
/// become clean.
pub fn checkpoint_finish(volume: &parking_lot::Mutex<Volume>, log: &Log, snapshot: CheckpointSnapshot) -> Result<()> {
    let CheckpointSnapshot { covered_lsn, images, pledges, mut superblock, device } = snapshot;
    // File data goes home when its record is applied, not through the log, and a mount that
    // finds this checkpoint's commit replays nothing the commit covers. So that data must be
    // durable before the commit can reach the medium: writes before a flush reach it in any
    // order, and a crash may keep the unflushed commit and lose the data (a zero block under a
    // checksum that records the data, `tests/crash.rs`).
    device.flush()?;
    // Version 9: the images go to the image log, which holds nothing older (the checkpoint
    // before this one released it), and the record log holds only operation records.
    let image_log: &Log = log.image_log().map(|images| images.as_ref()).unwrap_or(log);
    let covered_bytes = covered_lsn.to_le_bytes();
    let mut image_count = 0u64;
    for chunk in images.chunks(IMAGES_PER_RECORD) {
        let mut numbers = Vec::with_capacity(chunk.len());
        for image in chunk {
            numbers.push(image.block_number.to_le_bytes());
        }
        let count_bytes = (chunk.len() as u32).to_le_bytes();
        let mut parts: Vec<&[u8]> = vec![&covered_bytes, &count_bytes];
        for (number, image) in numbers.iter().zip(chunk) {
            parts.push(number);
            parts.push(&image.block[..]);
        }
        image_log.append_reserved(KIND_CHECKPOINT_IMAGES, &parts)?.ok_or(Error::NoSpace)?;
        image_count += chunk.len() as u64;
    }
    if let Some(pledges) = &pledges {
        pledges.checkpoint_images_logged(image_count);
    }
    let commit = encode_commit(covered_lsn, image_count, &superblock);
    let commit_lsn = image_log.append_reserved(KIND_CHECKPOINT_COMMIT, &[&commit])?.ok_or(Error::NoSpace)?;
    image_log.wait_durable(commit_lsn)?;
    // From here a replay completes this checkpoint from the log: writing the images home takes
    // no more room, and the appenders waiting for room need not wait for it.
    if let Some(pledges) = &pledges {
        pledges.checkpoint_committed(image_count);
    }
    Volume::write_images_home(device.as_ref(), &mut superblock, &images)?;
    device.flush()?;
    // Every record before the tail is reflected at home: logical records up to `covered_lsn`
    // are in the images, and the records after it up to the first logical one are checkpoint
    // records (this checkpoint's own, or an earlier one's, whose images this one repeats).
    // With an image log, the record log's tail is simply the first record not covered (a
    // forced checkpoint may cover no more than the one before it, whose tail stays), and the
    // image log's passes this commit: its images are home, and the next checkpoint repeats
    // whatever a later change dirties again.
    let tail_lsn = if std::ptr::eq(image_log, log) {
        first_logical_after(log, covered_lsn, commit_lsn).unwrap_or(commit_lsn + 1)
    } else {
        (covered_lsn + 1).max(log.tail().lsn)
    };
    assert!(tail_lsn > covered_lsn, "a record at or before the checkpoint is still uncovered");
    let tail = log.position(tail_lsn);
    let image_tail = (!std::ptr::eq(image_log, log)).then(|| image_log.position(commit_lsn + 1));
    superblock.sequence += 1;
    superblock.checkpoint_lsn = tail_lsn - 1;
    superblock.log_tail_lsn = tail.lsn;
    superblock.log_tail_data_position = tail.data_position;
    if let Some(image_tail) = image_tail {
        superblock.image_log_tail_lsn = image_tail.lsn;
        superblock.image_log_tail_data_position = image_tail.data_position;
    }
    superblock.checkpoint_count += 1;
    superblock.checkpoint_time_ns = now_ns();
    superblock.write(device.as_ref())?;
    device.flush()?;
    log.release(tail);
    if let Some(image_tail) = image_tail {
        image_log.release(image_tail);
    }
    let mut volume = volume.lock();
    let current = &mut volume.superblock;
    current.sequence = superblock.sequence;
    current.image_log_tail_lsn = superblock.image_log_tail_lsn;
    current.image_log_tail_data_position = superblock.image_log_tail_data_position;
    current.checkpoint_lsn = superblock.checkpoint_lsn;
    current.log_tail_lsn = superblock.log_tail_lsn;
    current.log_tail_data_position = superblock.log_tail_data_position;
    current.checkpoint_count = superblock.checkpoint_count;
    current.checkpoint_time_ns = superblock.checkpoint_time_ns;
    current.free_blocks = superblock.free_blocks;
    current.free_inodes = superblock.free_inodes;
    current.inode_table_initialized_blocks = superblock.inode_table_initialized_blocks;
    volume.images_home(&images);
    volume.checkpoint_done(covered_lsn);
    Ok(())
}

/// The first record in `covered_lsn + 1 .. before_lsn` that is not a checkpoint record (all of
/// them were appended: `before_lsn` is at most the log's next lsn). Records before the log's
/// tail were released by an earlier checkpoint (a forced checkpoint may cover no more than the
/// one before it): they are home, so the search starts at the tail at the earliest.
fn first_logical_after(log: &Log, covered_lsn: u64, before_lsn: u64) -> Option<u64> {
    let first = (covered_lsn + 1).max(log.tail().lsn);
    (first..before_lsn).find(|lsn| log.appended_with_reserve(*lsn) != Some(true))
}

/// The images of one checkpoint found in the log.
struct FoundCheckpoint {
    covered_lsn: u64,
    orphan_head: u64,
    next_generation: u64,
    images: Vec<Image>,
}

/// A record after the tail, decoded and checked before replay writes anything.
enum Decoded {
    Images { covered_lsn: u64, images: Vec<Image> },
    Commit { covered_lsn: u64, image_count: u64, orphan_head: u64, next_generation: u64 },
    Operation(Box<Op>),
}

/// What replay will do, worked out from the records alone.
#[derive(Default)]
struct ReplayPlan {
    /// Checkpoints committed in the log but not recorded in the superblock, in lsn order.
    found: Vec<FoundCheckpoint>,
    /// The highest lsn any commit record after the tail covers.
    max_covered_lsn: Option<u64>,
}

/// The kind a checkpoint image of `block_number` must carry, or the kinds one in the data area
/// may carry; `None` outside the areas that hold metadata blocks.
fn image_kinds(superblock: &Superblock, block_number: u64) -> Option<&'static [BlockKind]> {
    let within = |start: u64, blocks: u64| block_number >= start && block_number - start < blocks;
    if within(superblock.block_bitmap_start, superblock.block_bitmap_blocks) {
        Some(&[BlockKind::BlockBitmap])
    } else if within(superblock.inode_bitmap_start, superblock.inode_bitmap_blocks) {
        Some(&[BlockKind::InodeBitmap])
    } else if within(superblock.inode_table_start, superblock.inode_table_blocks) {
        Some(&[BlockKind::InodeTable])
    } else if within(superblock.generation_table_start, superblock.generation_table_blocks) {
        Some(&[BlockKind::GenerationTable])
    } else if within(superblock.checksum_table_start, superblock.checksum_table_blocks) {
        Some(&[BlockKind::DataChecksum])
    } else if block_number >= superblock.first_data_block && block_number < superblock.block_count {
        Some(&[
            BlockKind::DirLeaf,
            BlockKind::DirIndex,
            BlockKind::ExtentLeaf,
            BlockKind::ExtentInternal,
            BlockKind::Xattr,
        ])
    } else {
        None
    }
}

/// A checkpoint image must be the block it claims to be before it goes home: a sealed block of
/// a kind that may live there, whose trailer names that block.
fn check_image(superblock: &Superblock, block_number: u64, block: &[u8; BLOCK_SIZE]) -> Result<()> {
    let Some(kinds) = image_kinds(superblock, block_number) else {
        return Err(Error::corruption(format!(
            "checkpoint image for block {block_number}, outside the metadata areas"
        )));
    };
    let stored = u32::from_le_bytes(block[TRAILER_KIND_OFFSET..TRAILER_KIND_OFFSET + 4].try_into().expect("4 bytes"));
    let kind = kinds.iter().copied().find(|kind| *kind as u32 == stored).unwrap_or(kinds[0]);
    verify_block(block, kind, block_number).map_err(|error| match error {
        Error::Corruption { what } => Error::corruption(format!("checkpoint image: {what}")),
        other => other,
    })
}

/// The covered lsn and the images of an image record, their contents not yet checked.
fn parse_images(record: &Record) -> Result<(u64, Vec<Image>)> {
    let mut decoder = Decoder::new(&record.payload, "checkpoint image record");
    let covered_lsn = decoder.u64()?;
    let count = decoder.u32()? as usize;
    if count > IMAGES_PER_RECORD {
        return Err(Error::corruption(format!("checkpoint image record with {count} images")));
    }
    let mut images = Vec::with_capacity(count);
    for _ in 0..count {
        let block_number = decoder.u64()?;
        let mut block: BlockBuf = Box::new([0; BLOCK_SIZE]);
        for byte in block.iter_mut() {
            *byte = decoder.u8()?;
        }
        images.push(Image { block_number, block: Arc::new(block) });
    }
    decoder.finish()?;
    Ok((covered_lsn, images))
}

fn decode_images(record: &Record, superblock: &Superblock) -> Result<Decoded> {
    let (covered_lsn, images) = parse_images(record)?;
    for image in &images {
        check_image(superblock, image.block_number, &image.block)?;
    }
    Ok(Decoded::Images { covered_lsn, images })
}

fn decode_commit(record: &Record, superblock: &Superblock) -> Result<Decoded> {
    let decoded = decode_commit_fields(record, superblock)?;
    if let Decoded::Commit { covered_lsn, .. } = decoded {
        if covered_lsn >= record.lsn {
            return Err(Error::corruption(format!("checkpoint commit covers lsn {covered_lsn}, after itself")));
        }
    }
    Ok(decoded)
}

/// A commit's fields, checked on their own (in the image log a commit's lsn is of another log
/// than the lsn it covers).
fn decode_commit_fields(record: &Record, superblock: &Superblock) -> Result<Decoded> {
    let mut decoder = Decoder::new(&record.payload, "checkpoint commit record");
    let covered_lsn = decoder.u64()?;
    let image_count = decoder.u64()?;
    let orphan_head = decoder.u64()?;
    let next_generation = decoder.u64()?;
    decoder.finish()?;
    if orphan_head > superblock.inode_count {
        return Err(Error::corruption(format!("checkpoint commit names orphan {orphan_head}, not an inode")));
    }
    Ok(Decoded::Commit { covered_lsn, image_count, orphan_head, next_generation })
}

/// Decodes one record and checks every value in it. Unknown kinds are corruption: a record
/// replay does not understand must stop it, not be skipped.
fn decode_record(record: &Record, superblock: &Superblock) -> Result<Decoded> {
    match record.kind {
        KIND_CHECKPOINT_IMAGES => decode_images(record, superblock),
        KIND_CHECKPOINT_COMMIT => decode_commit(record, superblock),
        kind => {
            let op = Op::decode(kind, &record.payload)?;
            op.check(superblock.inode_count)?;
            if let Op::DirectWrite { runs, .. } = &op {
                let data = superblock.first_data_block..superblock.block_count;
                if let Some((first, count)) =
                    runs.iter().find(|(first, count)| !data.contains(first) || first + count > data.end)
                {
                    return Err(Error::corruption(format!(
                        "log record: direct write maps {count} blocks at {first}, outside the data region"
                    )));
                }
            }
            Ok(Decoded::Operation(Box::new(op)))
        }
    }
}

/// The error for a record replay cannot use: names the lsn and what repair does.
fn record_error(lsn: u64, error: Error) -> Error {
    match error {
        Error::Corruption { what } => Error::corruption(format!(
            "log record {lsn} cannot be replayed: {what}; the records from {lsn} on are not applied \
             (`tandem fsck --repair` keeps the records before it and discards the rest)"
        )),
        other => other,
    }
}

/// Decodes every record after the tail and pairs checkpoint commits with their images. On
/// failure returns the lsn of the first record replay cannot use, with the reason.
fn plan_replay(records: &[Record], superblock: &Superblock) -> std::result::Result<ReplayPlan, (u64, Error)> {
    let mut pairing = Pairing::default();
    for record in records {
        let decoded = decode_record(record, superblock).map_err(|error| (record.lsn, error))?;
        pairing.take(record.lsn, decoded, superblock)?;
    }
    Ok(pairing.plan)
}

/// Pairs checkpoint commits with the image records before them, in the record log (version 8
/// and older) or the image log (version 9).
#[derive(Default)]
struct Pairing {
    images_by_covered: BTreeMap<u64, Vec<Image>>,
    plan: ReplayPlan,
}

impl Pairing {
    /// Takes one decoded record (at `lsn` of its log): images wait for their commit; a commit
    /// above the superblock's checkpoint must find exactly the images it names.
    fn take(&mut self, lsn: u64, decoded: Decoded, superblock: &Superblock) -> std::result::Result<(), (u64, Error)> {
        match decoded {
            Decoded::Images { covered_lsn, images } => {
                self.images_by_covered.entry(covered_lsn).or_default().extend(images)
            }
            Decoded::Commit { covered_lsn, image_count, orphan_head, next_generation } => {
                let images = self.images_by_covered.remove(&covered_lsn).unwrap_or_default();
                self.plan.max_covered_lsn = self.plan.max_covered_lsn.max(Some(covered_lsn));
                // A checkpoint the superblock already records may lie partly before the tail
                // (the tail skips its own records): ignore it.
                if covered_lsn <= superblock.checkpoint_lsn {
                    return Ok(());
                }
                if images.len() as u64 != image_count {
                    let what = format!(
                        "checkpoint commit names {image_count} images covering {covered_lsn}; {} found",
                        images.len()
                    );
                    return Err((lsn, Error::corruption(what)));
                }
                self.plan.found.push(FoundCheckpoint { covered_lsn, orphan_head, next_generation, images });
            }
            // Decoded again when applied: holding every write's data twice could double the
            // memory replay needs for a large log.
            Decoded::Operation(_) => {}
        }
        Ok(())
    }
}

/// Decodes the image log of a version-9 volume (records after its tail: image records and
/// commits only) and pairs each commit with its images. A commit covers record-log lsns, so it
/// must cover one before `record_end` (the record log's next lsn: a checkpoint covers only
/// applied, hence durable, records). Images after the last commit belong to a checkpoint that
/// never committed: a crash cut it, and they are ignored. On failure returns the image-log lsn
/// of the first record that cannot be used, with the reason.
fn plan_image_log(
    records: &[Record],
    superblock: &Superblock,
    record_end: u64,
) -> std::result::Result<ReplayPlan, (u64, Error)> {
    let mut pairing = Pairing::default();
    for record in records {
        let decoded = match record.kind {
            KIND_CHECKPOINT_IMAGES => decode_images(record, superblock),
            KIND_CHECKPOINT_COMMIT => decode_commit_fields(record, superblock),
            kind => Err(Error::corruption(format!("record of kind {kind} in the image log"))),
        }
        .map_err(|error| (record.lsn, error))?;
        if let Decoded::Commit { covered_lsn, .. } = decoded {
            if covered_lsn >= record_end {
                let what =
                    format!("checkpoint commit covers lsn {covered_lsn}, past the record log's end {record_end}");
                return Err((record.lsn, Error::corruption(what)));
            }
        }
        pairing.take(record.lsn, decoded, superblock)?;
    }
    Ok(pairing.plan)
}

/// Every record of a version-9 record log must be an operation that decodes and checks.
fn check_operation_records(records: &[Record], superblock: &Superblock) -> std::result::Result<(), (u64, Error)> {
    for record in records {
        if record.kind == KIND_CHECKPOINT_IMAGES || record.kind == KIND_CHECKPOINT_COMMIT {
            let what =
                format!("checkpoint record (kind {}) in the record log of a volume with an image log", record.kind);
            return Err((record.lsn, Error::corruption(what)));
        }
        decode_record(record, superblock).map_err(|error| (record.lsn, error))?;
    }
    Ok(())
}

/// The error for an image-log record mount cannot use.
fn image_error(lsn: u64, error: Error) -> Error {
    match error {
        Error::Corruption { what } => Error::corruption(format!(
            "image log record {lsn} cannot be used: {what} (`tandem fsck --repair` discards the checkpoint it belongs to \
             while none of its images is home)"
        )),
        other => other,
    }
}

/// Version 9's tail check: the record log's tail must lie just after a record (where the
/// record before it ends, if that header is still there), and a checkpoint must cover every
/// record before it. The evidence is the image log: the commits still in its header ring before
/// its tail (the last one always is: only a later checkpoint's records overwrite its slot) and
/// those after it (`max_covered_lsn`). A tail moved forward by damage would otherwise drop the
/// records it skipped without a word.
fn check_record_tail(
    device: &dyn crate::device::Device,
    superblock: &Superblock,
    max_covered_lsn: Option<u64>,
) -> Result<()> {
    let geometry = superblock.log_geometry();
    let tail = LogPosition { lsn: superblock.log_tail_lsn, data_position: superblock.log_tail_data_position };
    let moved = |what: String| {
        Error::corruption(format!(
            "the log tail in the superblock (lsn {}, data position {}) {what}",
            tail.lsn, tail.data_position
        ))
    };
    if tail.lsn > 1 {
        if let Some(header) = Log::read_header(device, &geometry, tail.lsn - 1)? {
            if header.data_position.checked_add(header.payload_length as u64) != Some(tail.data_position) {
                return Err(moved(format!(
                    "is not where record {} ends (data position {} + {} bytes)",
                    tail.lsn - 1,
                    header.data_position,
                    header.payload_length
                )));
            }
        }
    }
    let image_geometry = superblock.image_log_geometry().expect("version 9 has an image log");
    let image_tail = superblock.image_log_tail();
    let mut covered = max_covered_lsn;
    for lsn in (image_tail.lsn.saturating_sub(image_geometry.header_slots).max(1)..image_tail.lsn).rev() {
        if covered.is_some_and(|covered| covered + 1 >= tail.lsn) {
            return Ok(());
        }
        let Some(header) = Log::read_header(device, &image_geometry, lsn)? else {
            break;
        };
        if header.kind == KIND_CHECKPOINT_COMMIT {
            match Log::read_payload(device, &image_geometry, &header)? {
                Some(payload) if payload.len() >= 8 => {
                    covered = covered.max(Some(u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"))));
                }
                _ => break,
            }
        }
    }
    if tail.lsn == 1 || covered.is_some_and(|covered| covered + 1 >= tail.lsn) {
        return Ok(());
    }
    Err(moved(format!(
        "skips operation records up to {}, which no checkpoint in the image log covers: the records it skipped would be lost",
        tail.lsn - 1
    )))
}

/// Checks that the superblock's log tail lies where a checkpoint put it: just after a record
/// (its data position is where the record before it ends), and past no operation record that
/// no checkpoint covers. A tail moved forward by damage would otherwise drop every record it
/// skipped without a word. Records before the tail stay in the header ring until the ring
/// wraps, so the check walks back from the tail over the records still intact there: each
/// operation record must be covered by a commit after it (`max_covered_lsn`: the commits after
/// the tail). Where a header is no longer there (overwritten or damaged), nothing can be judged.
fn check_log_tail(
    device: &dyn crate::device::Device,
    superblock: &Superblock,
    max_covered_lsn: Option<u64>,
) -> Result<()> {
    let geometry = superblock.log_geometry();
    let tail = LogPosition { lsn: superblock.log_tail_lsn, data_position: superblock.log_tail_data_position };
    let moved = |what: String| {
        Error::corruption(format!(
            "the log tail in the superblock (lsn {}, data position {}) {what}",
            tail.lsn, tail.data_position
        ))
    };
    let mut covered = max_covered_lsn;
    let mut expected_end = tail.data_position;
    for lsn in (tail.lsn.saturating_sub(geometry.header_slots).max(1)..tail.lsn).rev() {
        if covered.is_some_and(|covered| covered >= lsn) {
            return Ok(());
        }
        let Some(header) = Log::read_header(device, &geometry, lsn)? else {
            return Ok(());
        };
        if header.data_position.checked_add(header.payload_length as u64) != Some(expected_end) {
            if lsn + 1 == tail.lsn {
                return Err(moved(format!(
                    "is not where record {lsn} ends (data position {} + {} bytes)",
                    header.data_position, header.payload_length
                )));
            }
            return Ok(()); // an older record of another lap
        }
        expected_end = header.data_position;
        match header.kind {
            KIND_CHECKPOINT_IMAGES => {}
            KIND_CHECKPOINT_COMMIT => match Log::read_payload(device, &geometry, &header)? {
                Some(payload) if payload.len() >= 8 => {
                    let covered_lsn = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
                    covered = covered.max(Some(covered_lsn));
                }
                _ => return Ok(()),
            },
            kind => {
                return Err(moved(format!(
                    "skips operation record {lsn} (kind {kind}), which no checkpoint covers: \
                     the records it skipped would be lost"
                )))
            }
        }
    }
    Ok(())
}

/// Opens a volume: reads the superblock, recovers the log, checks every record and the tail,
/// completes a checkpoint that was committed but not recorded, replays the records after the
/// checkpoint and reclaims orphans. With `write` false nothing is written (fsck); the result is
/// the state mount would produce. Damage in the log (a bad record followed by good ones, a
/// record replay does not understand, a checkpoint image that is not the block it names, a
/// moved tail) is `Error::Corruption` naming the record; nothing is written home then. A volume
/// of a version before 9 is replayed as it was written and, with `write`, taken to version 9
/// (`upgrade_to_image_log`).
pub fn open_volume(
    device: Arc<dyn crate::device::Device>,
    log_options: LogOptions,
    cache_blocks: usize,
    write: bool,
) -> Result<(Volume, Arc<Log>, Applier, MountReport)> {
    // A check must not change the device: everything it writes lands in an overlay.
    let device: Arc<dyn crate::device::Device> =
        if write { device } else { Arc::new(Overlay::new(device, BTreeMap::new())) };
    let copies = Superblock::read_both(device.as_ref())?;
    let mut superblock = copies.best;
    let mut report = MountReport {
        was_dirty: superblock.state == STATE_MOUNTED,
        superblock_warning: copies
            .other_problem
            .map(|problem| format!("{problem}; used copy {} (run tandem fsck --repair)", copies.best_copy)),
        ..MountReport::default()
    };
    if superblock.has_image_log() {
        if write && superblock.format_version < crate::block::superblock::FORMAT_VERSION {
            // Version 9: valid as version 10, which only adds a record kind (an insert of
            // data). Recorded before anything else, so that once this build may have logged
            // such a record a version-9 build refuses the volume instead of the record.
            report.format_upgraded_from = Some(superblock.format_version);
            superblock.format_version = crate::block::superblock::FORMAT_VERSION;
            superblock.sequence += 1;
            superblock.write(device.as_ref())?;
            device.flush()?;
        }
        return open_with_image_log(device, superblock, report, log_options, cache_blocks, write);
    }
    if write {
        report.format_upgraded_from = Some(superblock.format_version);
    }
    if write && superblock.format_version < LAST_VERSION_WITHOUT_IMAGE_LOG {
        // Before anything this build writes reaches home: from here on the volume may hold what
        // only version 8 allows (a free leaves its generation-table and checksum entries, a
        // block may be shared), so an older build must refuse it.
        superblock.format_version = LAST_VERSION_WITHOUT_IMAGE_LOG;
        superblock.sequence += 1;
        superblock.write(device.as_ref())?;
        device.flush()?;
    }
    let (volume, log, applier, report) =
        open_without_image_log(device.clone(), superblock, report, log_options, cache_blocks)?;
    if !write {
        return Ok((volume, log, applier, report));
    }
    upgrade_to_image_log(device, volume, log, applier, report, log_options)
}

/// The last format version whose checkpoint images live in the record log.
const LAST_VERSION_WITHOUT_IMAGE_LOG: u32 = crate::block::superblock::IMAGE_LOG_VERSION - 1;

/// Options of an image log: it is written only by checkpoints, which wait for their commit, so
/// it needs no background flush, and every append may use all of it.
fn image_log_options() -> LogOptions {
    LogOptions { flush_delay_us: u64::MAX, reserve_fraction: 0.0 }
}

/// Options of a version-9 record log: no reserve, since no checkpoint record goes there.
fn record_log_options(log_options: LogOptions) -> LogOptions {
    LogOptions { reserve_fraction: 0.0, ..log_options }
}

/// The device a log writes through: its group commits make only what is not held durable
/// (`device::LogDevice`), so the back end's home writes between them may gather on an array.
fn log_device(device: &Arc<dyn Device>) -> Arc<dyn Device> {
    Arc::new(crate::device::LogDevice::new(device.clone()))
}

/// Recovers the image log of a version-9 volume; `None` before version 9.
fn recover_image_log(device: &Arc<dyn Device>, superblock: &Superblock) -> Result<Option<(Arc<Log>, Vec<Record>)>> {
    let Some(geometry) = superblock.image_log_geometry() else {
        return Ok(None);
    };
    Log::recover(log_device(device), geometry, superblock.image_log_tail(), image_log_options()).map(Some)
}

/// Recovers the record log at the superblock's tail and, from version 9 on, the image log,
/// attached to it so that checkpoints go there (for fsck's repair and inspection, which append
/// to the log or read its usage without replaying it).
pub fn recover_logs(
    device: &Arc<dyn Device>,
    superblock: &Superblock,
    log_options: LogOptions,
) -> Result<(Arc<Log>, Vec<Record>)> {
    let tail = LogPosition { lsn: superblock.log_tail_lsn, data_position: superblock.log_tail_data_position };
    let options = if superblock.has_image_log() { record_log_options(log_options) } else { log_options };
    let (log, records) = Log::recover(log_device(device), superblock.log_geometry(), tail, options)?;
    if let Some((image_log, _)) = recover_image_log(device, superblock)? {
        log.attach_images(image_log);
    }
    Ok((log, records))
}

/// Empties both logs of a volume at its tails (fsck's repair of a log it cannot read).
pub fn format_logs(device: &dyn Device, superblock: &Superblock) -> Result<()> {
    Log::format(device, &superblock.log_geometry())?;
    if let Some(images) = superblock.image_log_geometry() {
        Log::format(device, &images)?;
    }
    Ok(())
}

/// A version-9 volume: checkpoints from the image log, operations from the record log. The
/// replay checkpoints whenever its images would fill half the image log, as the running back
/// end does, since the records after the tail may have dirtied more than one checkpoint holds.
fn open_with_image_log(
    device: Arc<dyn Device>,
    mut superblock: Superblock,
    mut report: MountReport,
    log_options: LogOptions,
    cache_blocks: usize,
    write: bool,
) -> Result<(Volume, Arc<Log>, Applier, MountReport)> {
    let record_options = record_log_options(log_options);
    let tail = LogPosition { lsn: superblock.log_tail_lsn, data_position: superblock.log_tail_data_position };
    let (log, records) = Log::recover(log_device(&device), superblock.log_geometry(), tail, record_options)?;
    let (image_log, image_records) = recover_image_log(&device, &superblock)?.expect("version 9 has an image log");
    let record_end = log.next_lsn();
    let plan =
        plan_image_log(&image_records, &superblock, record_end).map_err(|(lsn, error)| image_error(lsn, error))?;
    check_operation_records(&records, &superblock).map_err(|(lsn, error)| record_error(lsn, error))?;
    check_record_tail(device.as_ref(), &superblock, plan.max_covered_lsn)?;

    let mut base_lsn = superblock.checkpoint_lsn;
    if let Some(covered_lsn) = complete_found_checkpoints(&device, &mut superblock, &plan, &mut report)? {
        base_lsn = covered_lsn;
        let tail = log.position((base_lsn + 1).max(log.tail().lsn));
        let image_tail = image_log.position(image_log.next_lsn());
        superblock.sequence += 1;
        superblock.checkpoint_lsn = tail.lsn - 1;
        superblock.log_tail_lsn = tail.lsn;
        superblock.log_tail_data_position = tail.data_position;
        superblock.image_log_tail_lsn = image_tail.lsn;
        superblock.image_log_tail_data_position = image_tail.data_position;
        superblock.write(device.as_ref())?;
        device.flush()?;
        log.release(tail);
        image_log.release(image_tail);
    }
    log.attach_images(image_log);
    let mut volume = Volume::load(device.clone(), superblock.clone(), cache_blocks)?;
    let applier = Applier { hash_seed: superblock.hash_seed };
    claim_direct_writes(&mut volume, &records, base_lsn)?;
    let volume = parking_lot::Mutex::new(volume);
    let half_image_blocks = log.reserve_image_blocks() / 2;
    // The data checksums on disk are the checkpoint's; replayed writes recompute them (also
    // after a checkpoint taken here: a later crash replays from it with the same rule).
    volume.lock().set_replaying(true);
    for record in records.iter().filter(|record| record.lsn > base_lsn) {
        let op = Op::decode(record.kind, &record.payload).map_err(|error| record_error(record.lsn, error))?;
        let mut held = volume.lock();
        applier.apply(&mut *held, record.lsn, &op)?;
        report.records_replayed += 1;
        let due = write && held.image_estimate_blocks() > half_image_blocks;
        drop(held);
        if due {
            checkpoint(&volume, &log, record.lsn)?;
            report.replay_checkpoints += 1;
        }
    }
    let mut volume = volume.into_inner();
    volume.set_replaying(false);
    report.orphans_reclaimed = applier.reclaim_orphans(&mut volume)?;
    Ok((volume, log, applier, report))
}

/// Completes the checkpoints a mount found committed in the log but not recorded in the
/// superblock: writes their images home, flushes, and takes the newest one's orphan head and
/// next generation, and the free counts of the bitmaps now home (mount compares them), into
/// `superblock`. Returns the lsn the newest covers; `None` when none was found.
fn complete_found_checkpoints(
    device: &Arc<dyn Device>,
    superblock: &mut Superblock,
    plan: &ReplayPlan,
    report: &mut MountReport,
) -> Result<Option<u64>> {
    let Some(last) = plan.found.last() else {
        return Ok(None);
    };
    report.checkpoint_completed = true;
    superblock.orphan_head = last.orphan_head;
    superblock.next_generation = last.next_generation;
    for checkpoint in &plan.found {
        Volume::write_images_home(device.as_ref(), superblock, &checkpoint.images)?;
    }
    device.flush()?;
    let home = Volume::load(device.clone(), superblock.clone(), 64)?;
    superblock.free_blocks = home.blocks.free_count();
    superblock.free_inodes = home.inodes.free_count();
    Ok(Some(last.covered_lsn))
}

/// Takes a volume replayed as version 8 (or earlier) to version 9: checkpoints what the replay
/// changed into the record log as version 8 did (its pledge kept room for exactly that), which
/// leaves nothing after the tail, then gives the second half of the record log's data ring to
/// an image log (`Superblock::split_log_for_images`). The image log starts with one commit
/// that covers the record log's tail, the evidence `check_record_tail` asks of a tail. A crash
/// before the superblock write leaves a checkpointed version-8 volume, which the next mount
/// takes forward the same way.
fn upgrade_to_image_log(
    device: Arc<dyn Device>,
    volume: Volume,
    log: Arc<Log>,
    applier: Applier,
    report: MountReport,
    log_options: LogOptions,
) -> Result<(Volume, Arc<Log>, Applier, MountReport)> {
    let last_lsn = log.next_lsn() - 1;
    let volume = parking_lot::Mutex::new(volume);
    checkpoint(&volume, &log, last_lsn)?;
    let mut volume = volume.into_inner();
    let tail = log.tail();
    assert_eq!(tail.lsn, log.next_lsn(), "a checkpoint of every record leaves the log empty");
    log.shutdown()?;
    drop(log);
    let mut superblock = volume.superblock.clone();
    superblock.split_log_for_images();
    let image_geometry = superblock.image_log_geometry().expect("split");
    Log::format(device.as_ref(), &image_geometry)?;
    let (image_log, _) = Log::recover(log_device(&device), image_geometry, LogPosition::START, image_log_options())?;
    let commit = encode_commit(tail.lsn - 1, 0, &superblock);
    let commit_lsn = image_log.append_reserved(KIND_CHECKPOINT_COMMIT, &[&commit])?.ok_or(Error::NoSpace)?;
    image_log.wait_durable(commit_lsn)?;
    let image_tail = image_log.position(commit_lsn + 1);
    superblock.image_log_tail_lsn = image_tail.lsn;
    superblock.image_log_tail_data_position = image_tail.data_position;
    superblock.sequence += 1;
    superblock.write(device.as_ref())?;
    device.flush()?;
    image_log.release(image_tail);
    let record_options = record_log_options(log_options);
    let (log, records) = Log::recover(log_device(&device), superblock.log_geometry(), tail, record_options)?;
    assert!(records.is_empty(), "the record log was empty before the split");
    log.attach_images(image_log);
    volume.superblock = superblock;
    Ok((volume, log, applier, report))
}

/// Opens a volume whose checkpoint images are in the record log (versions 5 to 8).
fn open_without_image_log(
    device: Arc<dyn Device>,
    mut superblock: Superblock,
    mut report: MountReport,
    log_options: LogOptions,
    cache_blocks: usize,
) -> Result<(Volume, Arc<Log>, Applier, MountReport)> {
    let tail = LogPosition { lsn: superblock.log_tail_lsn, data_position: superblock.log_tail_data_position };
    let (log, records) = Log::recover(log_device(&device), superblock.log_geometry(), tail, log_options)?;
    let plan = plan_replay(&records, &superblock).map_err(|(lsn, error)| record_error(lsn, error))?;
    check_log_tail(device.as_ref(), &superblock, plan.max_covered_lsn)?;

    let mut base_lsn = superblock.checkpoint_lsn;
    if let Some(covered_lsn) = complete_found_checkpoints(&device, &mut superblock, &plan, &mut report)? {
        base_lsn = covered_lsn;
        let tail = log.position(base_lsn + 1);
        superblock.sequence += 1;
        superblock.checkpoint_lsn = base_lsn;
        superblock.log_tail_lsn = tail.lsn;
        superblock.log_tail_data_position = tail.data_position;
        superblock.write(device.as_ref())?;
        device.flush()?;
        log.release(tail);
    }
    let mut volume = Volume::load(device.clone(), superblock.clone(), cache_blocks)?;
    let applier = Applier { hash_seed: superblock.hash_seed };
    claim_direct_writes(&mut volume, &records, base_lsn)?;
    // The data checksums on disk are the checkpoint's; replayed writes recompute them.
    volume.set_replaying(true);
    for record in &records {
        if record.lsn <= base_lsn || record.kind == KIND_CHECKPOINT_IMAGES || record.kind == KIND_CHECKPOINT_COMMIT {
            continue;
        }
        let op = Op::decode(record.kind, &record.payload).map_err(|error| record_error(record.lsn, error))?;
        applier.apply(&mut volume, record.lsn, &op)?;
        report.records_replayed += 1;
    }
    volume.set_replaying(false);
    report.orphans_reclaimed = applier.reclaim_orphans(&mut volume)?;
    Ok((volume, log, applier, report))
}

/// Claims the blocks of every direct write after the checkpoint (`base_lsn`) before any record
/// is replayed. Their bytes went home before their records were logged, into blocks the
/// checkpoint holds free; the records before them allocate anew as they are replayed and must
/// not be handed those blocks (in the first run they were claimed already).
fn claim_direct_writes(volume: &mut Volume, records: &[Record], base_lsn: u64) -> Result<()> {
    for record in records.iter().filter(|record| record.lsn > base_lsn && record.kind == KIND_DIRECT_WRITE) {
        let op = Op::decode(record.kind, &record.payload).map_err(|error| record_error(record.lsn, error))?;
        if let Op::DirectWrite { runs, .. } = op {
            for (first, count) in runs {
                volume.claim_data_exact(first, count).map_err(|error| record_error(record.lsn, error))?;
            }
        }
    }
    Ok(())
}

/// A log record that [`discard_damaged_log`] removed, for the repair report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostRecord {
    pub lsn: u64,
    /// What the record was, as far as it could be read ("write of 4096 bytes at 0 to inode 12",
    /// "damaged record: header unreadable").
    pub what: String,
}

/// Repair for `tandem fsck --repair`: when the log cannot be replayed past some record (a
/// damaged record followed by good ones, a record replay does not understand, an impossible
/// value, a checkpoint image that is not the block it names), removes that record and every
/// later one, so that the volume mounts and replays the records before it. Returns one entry
/// per removed record in lsn order, saying what it was; empty when the log needs no repair, and
/// then nothing is written. A moved tail cannot be repaired here (the records it skipped are
/// not in the log's future): that stays an error. The volume must not be mounted.
pub fn discard_damaged_log(device: Arc<dyn crate::device::Device>) -> Result<Vec<LostRecord>> {
    let superblock = Superblock::read_best(device.as_ref())?;
    if superblock.has_image_log() {
        return discard_damaged_logs(device.as_ref(), &superblock);
    }
    let geometry = superblock.log_geometry();
    let tail = LogPosition { lsn: superblock.log_tail_lsn, data_position: superblock.log_tail_data_position };
    let scan = Log::scan(device.as_ref(), &geometry, tail)?;
    // The first record replay cannot use: one that does not decode or check, or the damage
    // where the scan stopped.
    let first_bad = match plan_replay(&scan.records, &superblock) {
        Ok(_) => scan.damage.as_ref().map(|damage| damage.lsn),
        Err((lsn, _)) => Some(lsn),
    };
    // A wrong tail is not repaired by discarding records after it: that stays an error.
    check_log_tail(device.as_ref(), &superblock, scan_max_covered(&scan.records, &superblock))?;
    let Some(first_bad) = first_bad else {
        return Ok(Vec::new());
    };
    let kept = &scan.records[..(first_bad - tail.lsn) as usize];
    if let Some(lsn) = dropped_images_home(device.as_ref(), &scan.records, kept, &superblock)? {
        return Err(Error::corruption(format!(
            "log record {first_bad} is damaged inside a checkpoint whose images (record {lsn}) are already \
             home: replaying the records before it over them is not repeatable, so the log is not repaired"
        )));
    }
    let needs_commit = check_log_tail(device.as_ref(), &superblock, scan_max_covered(kept, &superblock)).is_err();
    let discarded = Log::discard_from(device.as_ref(), &geometry, tail, first_bad)?;
    if needs_commit {
        // The commit that justified the tail was among the discarded records: log a commit
        // covering up to the tail (what the superblock already records) so the next mount
        // accepts the tail.
        let options = LogOptions { flush_delay_us: u64::MAX, reserve_fraction: 0.0 };
        let (log, _) = Log::recover(device.clone(), geometry, tail, options)?;
        let commit = encode_commit(tail.lsn - 1, 0, &superblock);
        log.append_reserved(KIND_CHECKPOINT_COMMIT, &[&commit])?.ok_or(Error::NoSpace)?;
        log.shutdown()?;
    }
    Ok(discarded
        .iter()
        .map(|record| LostRecord { lsn: record.lsn, what: describe_discarded(record, &superblock) })
        .collect())
}

/// `discard_damaged_log` for a version-9 volume: each log is cut at its first record mount
/// cannot use. In the image log that drops the checkpoint the record belongs to (images after
/// the last commit are ignored), which is safe only while none of its images is home; in the
/// record log it drops the operations from that record on.
fn discard_damaged_logs(device: &dyn crate::device::Device, superblock: &Superblock) -> Result<Vec<LostRecord>> {
    let geometry = superblock.log_geometry();
    let tail = LogPosition { lsn: superblock.log_tail_lsn, data_position: superblock.log_tail_data_position };
    let image_geometry = superblock.image_log_geometry().expect("version 9 has an image log");
    let image_tail = superblock.image_log_tail();
    let scan = Log::scan(device, &geometry, tail)?;
    let image_scan = Log::scan(device, &image_geometry, image_tail)?;
    let (first_bad_image, max_covered) = match plan_image_log(&image_scan.records, superblock, scan.end.lsn) {
        Ok(plan) => (image_scan.damage.as_ref().map(|damage| damage.lsn), plan.max_covered_lsn),
        Err((lsn, _)) => (Some(lsn), scan_max_covered(&image_scan.records, superblock)),
    };
    let first_bad = match check_operation_records(&scan.records, superblock) {
        Ok(()) => scan.damage.as_ref().map(|damage| damage.lsn),
        Err((lsn, _)) => Some(lsn),
    };
    // A wrong tail is not repaired by discarding records after it: that stays an error.
    check_record_tail(device, superblock, max_covered)?;
    let mut lost = Vec::new();
    if let Some(first_bad_image) = first_bad_image {
        let kept = &image_scan.records[..(first_bad_image - image_tail.lsn) as usize];
        if let Some(lsn) = dropped_images_home(device, &image_scan.records, kept, superblock)? {
            return Err(Error::corruption(format!(
                "image log record {first_bad_image} is damaged inside a checkpoint whose images (image log record \
                 {lsn}) are already home: replaying the records before it over them is not repeatable, so the log \
                 is not repaired"
            )));
        }
        for record in Log::discard_from(device, &image_geometry, image_tail, first_bad_image)? {
            let what = format!("image log: {}", describe_discarded(&record, superblock));
            lost.push(LostRecord { lsn: record.lsn, what });
        }
    }
    if let Some(first_bad) = first_bad {
        for record in Log::discard_from(device, &geometry, tail, first_bad)? {
            lost.push(LostRecord { lsn: record.lsn, what: describe_discarded(&record, superblock) });
        }
    }
    Ok(lost)
}

/// Images go home only once their commit is durable, and a checkpoint the superblock does not
/// record is completed at mount. Discarding its commit (or records of it) is safe only while
/// none of its images reached home: mount then replays the records it covers over the old home
/// blocks. Returns an image record of a checkpoint the repair would drop whose image equals the
/// home block already.
fn dropped_images_home(
    device: &dyn crate::device::Device,
    records: &[Record],
    kept: &[Record],
    superblock: &Superblock,
) -> Result<Option<u64>> {
    let kept_covered: Vec<u64> = kept
        .iter()
        .filter(|record| record.kind == KIND_CHECKPOINT_COMMIT)
        .filter_map(|record| {
            record.payload.get(..8).map(|bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
        })
        .collect();
    let mut home: BlockBuf = Box::new([0; BLOCK_SIZE]);
    for record in records.iter().filter(|record| record.kind == KIND_CHECKPOINT_IMAGES) {
        let Ok((covered_lsn, images)) = parse_images(record) else {
            continue;
        };
        if covered_lsn <= superblock.checkpoint_lsn || kept_covered.contains(&covered_lsn) {
            continue;
        }
        for image in images {
            if check_image(superblock, image.block_number, &image.block).is_err() {
                continue;
            }
            device.read_at(image.block_number * BLOCK_SIZE_U64, &mut home[..])?;
            if home[..] == image.block[..] {
                return Ok(Some(record.lsn));
            }
        }
    }
    Ok(None)
}

/// The highest lsn covered by a commit among `records` whose payload decodes, for the tail check.
fn scan_max_covered(records: &[Record], superblock: &Superblock) -> Option<u64> {
    records
        .iter()
        .filter(|record| record.kind == KIND_CHECKPOINT_COMMIT)
        .filter_map(|record| match decode_commit(record, superblock) {
            Ok(Decoded::Commit { covered_lsn, .. }) => Some(covered_lsn),
            _ => None,
        })
        .max()
}

/// Words for a discarded record: what it would have changed, or why it could not be read.
fn describe_discarded(record: &crate::log::DiscardedRecord, superblock: &Superblock) -> String {
    let Some(header) = &record.header else {
        return "damaged record: header unreadable".into();
    };
    let Some(payload) = &record.payload else {
        return format!(
            "damaged record of kind {}: payload of {} bytes unreadable",
            header.kind, header.payload_length
        );
    };
    let as_record = Record { lsn: record.lsn, kind: header.kind, payload: payload.clone() };
    match decode_record(&as_record, superblock) {
        Ok(Decoded::Images { images, .. }) => format!("checkpoint images of {} metadata blocks", images.len()),
        Ok(Decoded::Commit { covered_lsn, .. }) => format!("checkpoint commit covering lsn {covered_lsn}"),
        Ok(Decoded::Operation(op)) => describe_op(&op),
        Err(error) => format!("record of kind {} that cannot be replayed: {error}", header.kind),
    }
}

fn describe_op(op: &Op) -> String {
    let name = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    match op {
        Op::Create { parent, name: entry, inode, .. } => {
            format!("create {:?} (inode {}) in directory {}", name(entry), inode.inode_number, parent.inode_number)
        }
        Op::Link { parent, name: entry, inode } => {
            format!("link {:?} to inode {} in directory {}", name(entry), inode.inode_number, parent.inode_number)
        }
        Op::Unlink { parent, name: entry, inode, .. } => {
            format!("remove {:?} (inode {}) from directory {}", name(entry), inode.inode_number, parent.inode_number)
        }
        Op::Rename { parent, name: entry, new_parent, new_name, .. } => {
            format!("rename {:?} in directory {parent} to {:?} in directory {new_parent}", name(entry), name(new_name))
        }
        Op::SetAttributes { inode, .. } => format!("attribute change of inode {}", inode.inode_number),
        Op::Write { inode, offset, data, insert: false } => {
            format!("write of {} bytes at offset {offset} to inode {}", data.len(), inode.inode_number)
        }
        Op::Write { inode, offset, data, insert: true } => {
            format!("insert of {} bytes at offset {offset} in inode {}", data.len(), inode.inode_number)
        }
        Op::Range { inode, kind, offset, length, .. } => {
            format!("{kind:?} of {length} bytes at offset {offset} in inode {}", inode.inode_number)
        }
        Op::DirectWrite { inode, offset, length, .. } => {
            format!("direct write of {length} bytes at offset {offset} to inode {}", inode.inode_number)
        }
        Op::SetXattr { inode, name: attribute, .. } => {
            format!("set attribute {:?} of inode {}", name(attribute), inode.inode_number)
        }
        Op::RemoveXattr { inode, name: attribute } => {
            format!("remove attribute {:?} of inode {}", name(attribute), inode.inode_number)
        }
        Op::Reclaim { inode_number } => format!("free orphan inode {inode_number}"),
        Op::CreateBatch { parents, creates } => {
            format!("create batch of {} names in {} directories", creates.len(), parents.len())
        }
    }
}

/// A copy-on-write view of a device: reads see `images` laid over the device, writes land in
/// `images` and never reach the device. fsck replays the log through it, so checking a crashed
/// volume changes nothing.
pub struct Overlay {
    inner: Arc<dyn crate::device::Device>,
    images: parking_lot::Mutex<BTreeMap<u64, BlockBuf>>,
}

impl Overlay {
    pub fn new(inner: Arc<dyn crate::device::Device>, images: BTreeMap<u64, BlockBuf>) -> Overlay {
        Overlay { inner, images: parking_lot::Mutex::new(images) }
    }
}

impl crate::device::Device for Overlay {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buffer)?;
        if buffer.is_empty() {
            return Ok(());
        }
        let end = offset + buffer.len() as u64;
        let first_block = offset / BLOCK_SIZE_U64;
        let last_block = (end - 1) / BLOCK_SIZE_U64;
        for (number, block) in self.images.lock().range(first_block..=last_block) {
            let block_start = number * BLOCK_SIZE_U64;
            let copy_start = block_start.max(offset);
            let copy_end = (block_start + BLOCK_SIZE_U64).min(end);
            buffer[(copy_start - offset) as usize..(copy_end - offset) as usize]
                .copy_from_slice(&block[(copy_start - block_start) as usize..(copy_end - block_start) as usize]);
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        crate::device::check_range(self.size_bytes(), offset, data.len(), "overlay write")?;
        let mut position = 0usize;
        while position < data.len() {
            let byte = offset + position as u64;
            let number = byte / BLOCK_SIZE_U64;
            let within = (byte % BLOCK_SIZE_U64) as usize;
            let take = (BLOCK_SIZE - within).min(data.len() - position);
            let mut images = self.images.lock();
            let block = match images.entry(number) {
                std::collections::btree_map::Entry::Occupied(slot) => slot.into_mut(),
                std::collections::btree_map::Entry::Vacant(slot) => {
                    let mut block: BlockBuf = Box::new([0; BLOCK_SIZE]);
                    self.inner.read_at(number * BLOCK_SIZE_U64, &mut block[..])?;
                    slot.insert(block)
                }
            };
            block[within..within + take].copy_from_slice(&data[position..position + take]);
            position += take;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    /// A range the overlay holds nothing of is the device's own: the device beneath may heal
    /// it (an array opened writable rewrites the member that was wrong, which is how `tandem
    /// scrub` repairs what the volume's checksums find). A range it holds is judged as read.
    fn read_checked(&self, offset: u64, buffer: &mut [u8], check: &dyn Fn(&[u8]) -> bool) -> Result<bool> {
        let held = !buffer.is_empty() && {
            let end = offset + buffer.len() as u64;
            self.images.lock().range(offset / BLOCK_SIZE_U64..=(end - 1) / BLOCK_SIZE_U64).next().is_some()
        };
        if held {
            self.read_at(offset, buffer)?;
            return Ok(check(buffer));
        }
        self.inner.read_checked(offset, buffer, check)
    }
}
