//! `backend`: applies durable log records to their home structures (NICFS's back end: fetch →
//! locate → merge → patch), takes checkpoints, and replays the log at mount.
//!
//! Checkpoint protocol (the log is the only journal):
//! 1. take sealed images of every changed metadata block, covering records up to lsn X;
//! 2. append them to the log as image records, then a commit record naming X; flush the log;
//! 3. write the images home; flush the device;
//! 4. write the superblock with the log tail at the first unapplied record (or just past this
//!    checkpoint's own records) and the checkpoint one before it; flush;
//! 5. release the log before the tail and let frees up to X be reused.
//!
//! A crash before 2 completes leaves the old checkpoint and the log intact; after it, mount
//! finds the commit, writes its images home again and finishes step 4.

pub mod record;

use crate::block::codec::Decoder;
use crate::block::inode::Inode;
use crate::block::meta::{BlockBuf, BLOCK_SIZE, BLOCK_SIZE_U64};
use crate::block::superblock::{Superblock, STATE_MOUNTED};
use crate::block::volume::{Image, Volume};
use crate::dir::{self, DirRoot, HashSeed};
use crate::error::{Error, Result};
use crate::extent::{self, ExtentRoot};
use crate::fs::types::{FileType, MountReport};
use crate::log::{Log, LogOptions, LogPosition, Record};
use record::*;
use std::collections::BTreeMap;
use std::sync::Arc;

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
}

impl Touched {
    fn new() -> Touched {
        Touched { inodes: BTreeMap::new(), deleted: Vec::new() }
    }
    fn get<'a>(&'a mut self, volume: &mut Volume, inode_number: u64) -> Result<&'a mut Inode> {
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
    fn image(&mut self, volume: &mut Volume, image: &AttributeImage) -> Result<()> {
        let inode = self.get(volume, image.inode_number)?;
        if inode.generation != image.generation || FileType::from_mode(inode.mode) != FileType::from_mode(image.mode) {
            return Err(Error::corruption(format!(
                "log record for inode {} generation {} finds generation {} of type {:#o}",
                image.inode_number, image.generation, inode.generation, inode.mode
            )));
        }
        image.apply_to(inode);
        Ok(())
    }
    /// Writes the touched inodes back; returns (inode, blocks owned) of each one still in use.
    fn write_back(self, volume: &mut Volume) -> Result<Vec<(u64, u64)>> {
        let mut owned = Vec::with_capacity(self.inodes.len());
        for (inode_number, inode) in &self.inodes {
            if !self.deleted.contains(inode_number) {
                volume.write_inode(inode)?;
                owned.push((*inode_number, inode.blocks_owned));
            }
        }
        Ok(owned)
    }
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

/// Everything the back end keeps besides the volume.
pub struct Applier {
    pub hash_seed: HashSeed,
}

impl Applier {
    /// Applies one durable record and returns (inode, blocks owned) of every inode it wrote. An
    /// error here means the volume and the log disagree (corruption) or the device failed; the
    /// caller stops accepting changes.
    pub fn apply(&self, volume: &mut Volume, lsn: u64, op: &Op) -> Result<Vec<(u64, u64)>> {
        volume.current_lsn = lsn;
        let seed = self.hash_seed;
        let mut touched = Touched::new();
        match op {
            Op::Create { parent, name, inode: image, symlink_target } => {
                let file_type = image.file_type();
                let mut inode = Inode {
                    inode_number: image.inode_number,
                    generation: image.generation,
                    mode: image.mode,
                    link_count: 0,
                    uid: 0,
                    gid: 0,
                    size_bytes: 0,
                    blocks_owned: 0,
                    access_time_ns: 0,
                    modify_time_ns: 0,
                    change_time_ns: 0,
                    birth_time_ns: 0,
                    rdev: 0,
                    parent: 0,
                    orphan_next: 0,
                    xattr_block: 0,
                    flags: 0,
                    root_area: [0; 64],
                };
                image.apply_to(&mut inode);
                match file_type {
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
                let superblock = &mut volume.superblock;
                superblock.next_generation = superblock.next_generation.max(image.generation + 1);
                let parent_inode = touched.get(volume, parent.inode_number)?;
                let mut root = dir_root(parent_inode)?;
                dir::insert(volume, &mut root, &seed, name, image.inode_number, file_type.dirent_type())?;
                touched.get(volume, parent.inode_number)?.root_area = root.encode();
                touched.image(volume, parent)?;
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
            Op::Write { inode: image, offset, data } => {
                let mut root = extent_root(touched.get(volume, image.inode_number)?)?;
                extent::write(volume, &mut root, *offset, data)?;
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

    fn dispose(
        &self,
        volume: &mut Volume,
        touched: &mut Touched,
        inode_number: u64,
        disposition: Disposition,
    ) -> Result<()> {
        match disposition {
            Disposition::Keep => Ok(()),
            Disposition::Orphan => {
                let head = volume.superblock.orphan_head;
                touched.get(volume, inode_number)?.orphan_next = head;
                volume.superblock.orphan_head = inode_number;
                Ok(())
            }
            Disposition::Reclaim => self.free_inode(volume, touched, inode_number),
        }
    }

    /// Frees everything an inode owns and the inode itself.
    fn free_inode(&self, volume: &mut Volume, touched: &mut Touched, inode_number: u64) -> Result<()> {
        let inode = touched.get(volume, inode_number)?.clone();
        match inode.file_type() {
            FileType::Directory => dir::destroy(volume, dir_root(&inode)?)?,
            FileType::Regular | FileType::Symlink => extent::destroy(volume, extent_root(&inode)?)?,
            _ => {}
        }
        if inode.xattr_block != 0 {
            use crate::block::meta::MetaStore;
            volume.free_meta(inode.xattr_block)?;
        }
        volume.delete_inode(inode_number)?;
        touched.deleted.push(inode_number);
        Ok(())
    }

    fn remove_orphan(&self, volume: &mut Volume, touched: &mut Touched, inode_number: u64) -> Result<()> {
        let mut previous: Option<u64> = None;
        let mut current = volume.superblock.orphan_head;
        let mut steps = 0u64;
        while current != 0 {
            steps += 1;
            if steps > ORPHAN_WALK_MAX.min(volume.superblock.inode_count + 1) {
                return Err(Error::corruption("orphan list has a cycle"));
            }
            let next = touched.get(volume, current)?.orphan_next;
            if current == inode_number {
                match previous {
                    None => volume.superblock.orphan_head = next,
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
/// the volume, and nothing after them until this returns (the caller is the only applier). The
/// volume lock is held only to take the images and to record the result, so readers go on while
/// the images travel through the log and home. See the module comment for the protocol.
///
/// `first_unapplied` names the first logical record appended but not applied, if any; it is
/// asked after the commit is durable. The new tail skips this checkpoint's own records, up to
/// that record, so that large image sets do not stay in the log until the next checkpoint.
pub fn checkpoint(
    volume: &parking_lot::Mutex<Volume>,
    log: &Log,
    covered_lsn: u64,
    first_unapplied: &dyn Fn() -> Option<u64>,
) -> Result<()> {
    let (images, mut superblock, device) = {
        let mut volume = volume.lock();
        (volume.snapshot_images(), volume.superblock.clone(), volume.device.clone())
    };
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
        log.append_reserved(KIND_CHECKPOINT_IMAGES, &parts)?.ok_or(Error::NoSpace)?;
        image_count += chunk.len() as u64;
    }
    let commit = encode_commit(covered_lsn, image_count, &superblock);
    let commit_lsn = log.append_reserved(KIND_CHECKPOINT_COMMIT, &[&commit])?.ok_or(Error::NoSpace)?;
    log.wait_durable(commit_lsn)?;
    Volume::write_images_home(device.as_ref(), &images)?;
    device.flush()?;
    // Every record before the tail is reflected at home: logical records up to `covered_lsn`
    // are applied, and the records after it are this checkpoint's own, unless a logical record
    // was appended in between.
    let tail_lsn = first_unapplied().map_or(commit_lsn + 1, |lsn| lsn.min(commit_lsn + 1));
    assert!(tail_lsn > covered_lsn, "a record at or before the checkpoint is still unapplied");
    let tail = log.position(tail_lsn);
    superblock.sequence += 1;
    superblock.checkpoint_lsn = tail_lsn - 1;
    superblock.log_tail_lsn = tail.lsn;
    superblock.log_tail_data_position = tail.data_position;
    superblock.checkpoint_count += 1;
    superblock.checkpoint_time_ns = now_ns();
    {
        let volume = volume.lock();
        superblock.free_blocks = volume.blocks.free_count() + volume.blocks.pending_free_count();
        superblock.free_inodes = volume.inodes.free_count();
    }
    superblock.write(device.as_ref())?;
    device.flush()?;
    log.release(tail);
    let mut volume = volume.lock();
    volume.images_home(&images);
    let current = &mut volume.superblock;
    current.sequence = superblock.sequence;
    current.checkpoint_lsn = superblock.checkpoint_lsn;
    current.log_tail_lsn = superblock.log_tail_lsn;
    current.log_tail_data_position = superblock.log_tail_data_position;
    current.checkpoint_count = superblock.checkpoint_count;
    current.checkpoint_time_ns = superblock.checkpoint_time_ns;
    current.free_blocks = superblock.free_blocks;
    current.free_inodes = superblock.free_inodes;
    volume.checkpoint_done(covered_lsn);
    Ok(())
}

/// The images of one checkpoint found in the log.
struct FoundCheckpoint {
    covered_lsn: u64,
    orphan_head: u64,
    next_generation: u64,
    images: Vec<Image>,
}

fn decode_images(record: &Record, superblock: &Superblock, into: &mut BTreeMap<u64, Vec<Image>>) -> Result<()> {
    let mut decoder = Decoder::new(&record.payload, "checkpoint image record");
    let covered = decoder.u64()?;
    let count = decoder.u32()? as usize;
    if count > IMAGES_PER_RECORD {
        return Err(Error::corruption(format!("checkpoint image record with {count} images")));
    }
    let list = into.entry(covered).or_default();
    for _ in 0..count {
        let block_number = decoder.u64()?;
        if block_number < superblock.block_bitmap_start || block_number >= superblock.block_count {
            return Err(Error::corruption(format!(
                "checkpoint image for block {block_number}, outside the metadata area"
            )));
        }
        let mut block: BlockBuf = Box::new([0; BLOCK_SIZE]);
        for byte in block.iter_mut() {
            *byte = decoder.u8()?;
        }
        list.push(Image { block_number, block: Arc::new(block) });
    }
    decoder.finish()
}

/// Opens a volume: reads the superblock, recovers the log, completes a checkpoint that was
/// committed but not recorded, replays the records after the checkpoint and reclaims orphans.
/// With `write` false nothing is written (fsck); the result is the state mount would produce.
pub fn open_volume(
    device: Arc<dyn crate::device::Device>,
    log_options: LogOptions,
    cache_blocks: usize,
    write: bool,
) -> Result<(Volume, Arc<Log>, Applier, MountReport)> {
    // A check must not change the device: everything it writes lands in an overlay.
    let device: Arc<dyn crate::device::Device> =
        if write { device } else { Arc::new(Overlay::new(device, BTreeMap::new())) };
    let mut superblock = Superblock::read_best(device.as_ref())?;
    let mut report = MountReport { was_dirty: superblock.state == STATE_MOUNTED, ..MountReport::default() };
    let tail = LogPosition { lsn: superblock.log_tail_lsn, data_position: superblock.log_tail_data_position };
    let (log, records) = Log::recover(device.clone(), superblock.log_geometry(), tail, log_options)?;

    // Checkpoints committed in the log but not yet in the superblock.
    let mut images_by_covered: BTreeMap<u64, Vec<Image>> = BTreeMap::new();
    let mut found: Vec<FoundCheckpoint> = Vec::new();
    for record in &records {
        match record.kind {
            KIND_CHECKPOINT_IMAGES => decode_images(record, &superblock, &mut images_by_covered)?,
            KIND_CHECKPOINT_COMMIT => {
                let mut decoder = Decoder::new(&record.payload, "checkpoint commit record");
                let covered_lsn = decoder.u64()?;
                let image_count = decoder.u64()?;
                let orphan_head = decoder.u64()?;
                let next_generation = decoder.u64()?;
                decoder.finish()?;
                let images = images_by_covered.remove(&covered_lsn).unwrap_or_default();
                if covered_lsn >= record.lsn {
                    return Err(Error::corruption(format!(
                        "checkpoint commit at lsn {} covers {covered_lsn}, after itself",
                        record.lsn
                    )));
                }
                // A checkpoint the superblock already records may lie partly before the tail
                // (the tail skips its own records): ignore it.
                if covered_lsn > superblock.checkpoint_lsn {
                    if images.len() as u64 != image_count {
                        return Err(Error::corruption(format!(
                            "checkpoint commit at lsn {} names {image_count} images covering {covered_lsn}; {} found",
                            record.lsn,
                            images.len()
                        )));
                    }
                    found.push(FoundCheckpoint { covered_lsn, orphan_head, next_generation, images });
                }
            }
            _ => {}
        }
    }
    let mut base_lsn = superblock.checkpoint_lsn;
    if let Some(last) = found.last() {
        report.checkpoint_completed = true;
        base_lsn = last.covered_lsn;
        superblock.orphan_head = last.orphan_head;
        superblock.next_generation = last.next_generation;
        for checkpoint in &found {
            Volume::write_images_home(device.as_ref(), &checkpoint.images)?;
        }
        device.flush()?;
        // The superblock records the free counts of the bitmaps now home: mount compares them.
        let home = Volume::load(device.clone(), superblock.clone(), 64)?;
        superblock.free_blocks = home.blocks.free_count();
        superblock.free_inodes = home.inodes.free_count();
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
    for record in &records {
        if record.lsn <= base_lsn || record.kind >= KIND_CHECKPOINT_IMAGES {
            continue;
        }
        let op = Op::decode(record.kind, &record.payload)?;
        applier.apply(&mut volume, record.lsn, &op)?;
        report.records_replayed += 1;
    }
    report.orphans_reclaimed = applier.reclaim_orphans(&mut volume)?;
    Ok((volume, log, applier, report))
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
}
