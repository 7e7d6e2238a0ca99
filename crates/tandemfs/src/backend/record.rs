//! Log record payloads. A record carries the structural change (a name added, bytes written,
//! a range collapsed) and the complete new attributes of every inode it touches, computed by
//! the front end. The back end applies the structure and copies the attributes, so the two can
//! never disagree about POSIX semantics, and replay needs no clock.

use crate::block::codec::{Decoder, Encoder};
use crate::block::inode::{self, Inode};
use crate::error::{Error, Result};
use crate::types::{FileType, NAME_MAX_BYTES, SYMLINK_MAX_BYTES, XATTR_NAME_MAX_BYTES};
use std::sync::Arc;

/// Record kinds (the log header's `kind` field).
pub const KIND_CREATE: u16 = 1;
pub const KIND_LINK: u16 = 2;
pub const KIND_UNLINK: u16 = 3;
pub const KIND_RENAME: u16 = 4;
pub const KIND_SET_ATTRIBUTES: u16 = 5;
pub const KIND_WRITE: u16 = 6;
pub const KIND_RANGE: u16 = 7;
pub const KIND_SET_XATTR: u16 = 8;
pub const KIND_REMOVE_XATTR: u16 = 9;
pub const KIND_RECLAIM: u16 = 10;
/// Many creates in one record (`Op::CreateBatch`, written by `FileSystem::create_batch`), since
/// format version 7: a build that predates it refuses a version-7 volume at mount, and would
/// refuse the record as an unknown kind (replay stops there with an error naming the lsn),
/// never skip it.
pub const KIND_CREATE_BATCH: u16 = 11;
/// A direct write (format version 8): a large write whose bytes went straight to newly claimed
/// blocks, made durable before this record was logged; the record maps them.
pub const KIND_DIRECT_WRITE: u16 = 12;
/// An insert of data (format version 10): `Op::Write` with `insert` set, the bytes put in at
/// the offset and every later byte shifted up, in one record. Before version 10 an insert of
/// data was a `Range` insert record (a hole) and a `Write` record of the bytes into it, which
/// older volumes' logs still hold and replay as they are.
pub const KIND_INSERT_DATA: u16 = 13;
/// Most bytes one direct-write record maps (4,096 blocks): its payload stays within 82 KiB.
pub const DIRECT_WRITE_RECORD_MAX_BYTES: u64 = 16 << 20;
/// Checkpoint records (written by the back end, see `backend::checkpoint`).
pub const KIND_CHECKPOINT_IMAGES: u16 = 100;
pub const KIND_CHECKPOINT_COMMIT: u16 = 101;

/// Most creates one `Op::CreateBatch` carries: bounds the record (about 150 bytes a create
/// plus the name) and the checkpoint images it pledges, as that many single creates would.
pub const CREATE_BATCH_RECORD_MAX: usize = 512;

/// Largest xattr value accepted.
pub const XATTR_VALUE_MAX_BYTES: usize = 4000;

/// The attributes of an inode that the front end owns. The back end owns the rest (the root
/// area, blocks owned, the xattr block and the orphan link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributeImage {
    pub inode_number: u64,
    pub generation: u64,
    pub mode: u32,
    pub link_count: u32,
    pub uid: u32,
    pub gid: u32,
    pub size_bytes: u64,
    pub access_time_ns: i64,
    pub modify_time_ns: i64,
    pub change_time_ns: i64,
    pub birth_time_ns: i64,
    pub rdev: u64,
    pub parent: u64,
    pub flags: u32,
}

impl AttributeImage {
    pub fn from_inode(inode: &Inode) -> AttributeImage {
        AttributeImage {
            inode_number: inode.inode_number,
            generation: inode.generation,
            mode: inode.mode,
            link_count: inode.link_count,
            uid: inode.uid,
            gid: inode.gid,
            size_bytes: inode.size_bytes,
            access_time_ns: inode.access_time_ns,
            modify_time_ns: inode.modify_time_ns,
            change_time_ns: inode.change_time_ns,
            birth_time_ns: inode.birth_time_ns,
            rdev: inode.rdev,
            parent: inode.parent,
            flags: inode.flags,
        }
    }
    /// A new inode with these attributes and nothing of the back end's yet: no blocks, no
    /// xattr block, an empty root area.
    pub fn to_new_inode(&self) -> Inode {
        let mut inode = Inode {
            inode_number: self.inode_number,
            generation: self.generation,
            mode: self.mode,
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
        self.apply_to(&mut inode);
        inode
    }

    /// Copies these attributes into `inode`, leaving the back end's fields alone.
    pub fn apply_to(&self, inode: &mut Inode) {
        assert_eq!(self.inode_number, inode.inode_number);
        inode.generation = self.generation;
        inode.mode = self.mode;
        inode.link_count = self.link_count;
        inode.uid = self.uid;
        inode.gid = self.gid;
        inode.size_bytes = self.size_bytes;
        inode.access_time_ns = self.access_time_ns;
        inode.modify_time_ns = self.modify_time_ns;
        inode.change_time_ns = self.change_time_ns;
        inode.birth_time_ns = self.birth_time_ns;
        inode.rdev = self.rdev;
        inode.parent = self.parent;
        inode.flags = self.flags;
    }
    pub fn file_type(&self) -> FileType {
        FileType::from_mode(self.mode).expect("validated")
    }
    fn encode(&self, encoder: &mut Encoder) {
        encoder
            .u64(self.inode_number)
            .u64(self.generation)
            .u32(self.mode)
            .u32(self.link_count)
            .u32(self.uid)
            .u32(self.gid)
            .u64(self.size_bytes)
            .i64(self.access_time_ns)
            .i64(self.modify_time_ns)
            .i64(self.change_time_ns)
            .i64(self.birth_time_ns)
            .u64(self.rdev)
            .u64(self.parent)
            .u32(self.flags);
    }
    fn decode(decoder: &mut Decoder) -> Result<AttributeImage> {
        let image = AttributeImage {
            inode_number: decoder.u64()?,
            generation: decoder.u64()?,
            mode: decoder.u32()?,
            link_count: decoder.u32()?,
            uid: decoder.u32()?,
            gid: decoder.u32()?,
            size_bytes: decoder.u64()?,
            access_time_ns: decoder.i64()?,
            modify_time_ns: decoder.i64()?,
            change_time_ns: decoder.i64()?,
            birth_time_ns: decoder.i64()?,
            rdev: decoder.u64()?,
            parent: decoder.u64()?,
            flags: decoder.u32()?,
        };
        // The same rules as `Inode::decode` and `Volume::check_inode_contents`: replay must not
        // write an inode that its next read refuses.
        let file_type = FileType::from_mode(image.mode);
        let is_device = matches!(file_type, Some(FileType::CharDevice | FileType::BlockDevice));
        if image.flags != 0 || (!is_device && image.rdev != 0) {
            return Err(Error::corruption(format!(
                "log record: attribute image of inode {} with flags {:#x}, device {:#x}",
                image.inode_number, image.flags, image.rdev
            )));
        }
        if image.inode_number == 0 || !inode::mode_is_valid(image.mode) {
            return Err(Error::corruption(format!(
                "log record: attribute image of inode {} with mode {:#o}",
                image.inode_number, image.mode
            )));
        }
        if image.size_bytes > crate::extent::MAX_FILE_BYTES {
            return Err(Error::corruption(format!(
                "log record: size {} of inode {}",
                image.size_bytes, image.inode_number
            )));
        }
        Ok(image)
    }

    /// The checks that need the volume: the inode numbers exist, as the inode decoder demands
    /// of the inode this image will be written into.
    fn check(&self, inode_count: u64) -> Result<()> {
        if self.inode_number > inode_count || !inode::parent_is_valid(self.parent, inode_count) {
            return Err(Error::corruption(format!(
                "log record: attribute image of inode {} with parent {} on a volume of {inode_count} inodes",
                self.inode_number, self.parent
            )));
        }
        Ok(())
    }
}

/// What happens to an inode that lost a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Still linked elsewhere.
    Keep = 0,
    /// No names left but still open: goes on the orphan list until a `Reclaim`.
    Orphan = 1,
    /// No names left and not open: freed now.
    Reclaim = 2,
}

impl Disposition {
    fn from_u8(value: u8) -> Result<Disposition> {
        Ok(match value {
            0 => Disposition::Keep,
            1 => Disposition::Orphan,
            2 => Disposition::Reclaim,
            _ => return Err(Error::corruption(format!("log record: disposition {value}"))),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeKind {
    Insert = 0,
    Collapse = 1,
    PunchHole = 2,
    ZeroRange = 3,
    Allocate = 4,
    /// Rewrites fragmented data of the range into whole blocks, keeping every byte (format
    /// version 7, `extent::compact`).
    Compact = 5,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameKind {
    Move = 0,
    Exchange = 1,
}

/// One create of an `Op::CreateBatch`: `name` in the batch's parent `parent` (a place in its
/// `parents`), naming the new inode `inode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchCreate {
    pub parent: u32,
    pub name: Vec<u8>,
    pub inode: AttributeImage,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A new inode named `name` in `parent`; `symlink_target` is empty unless a symlink.
    Create {
        parent: AttributeImage,
        name: Vec<u8>,
        inode: AttributeImage,
        symlink_target: Vec<u8>,
    },
    Link {
        parent: AttributeImage,
        name: Vec<u8>,
        inode: AttributeImage,
    },
    Unlink {
        parent: AttributeImage,
        name: Vec<u8>,
        inode: AttributeImage,
        disposition: Disposition,
    },
    /// Moves `name` in `parent` to `new_name` in `new_parent`, replacing what was there
    /// (`replaced`), or exchanges the two. `images` holds every inode whose attributes change.
    Rename {
        parent: u64,
        name: Vec<u8>,
        new_parent: u64,
        new_name: Vec<u8>,
        kind: RenameKind,
        replaced: Option<(u64, Disposition)>,
        images: Vec<AttributeImage>,
    },
    /// Attribute change; `truncate` set when the size changed.
    SetAttributes {
        inode: AttributeImage,
        truncate: bool,
    },
    /// `data` written at `offset`, over what the file holds there; or, with `insert`
    /// (`KIND_INSERT_DATA`, format version 10), put in at `offset` (at most the size before
    /// the record), every later byte shifted up by its length, as an insert of a hole and a
    /// write of the bytes into it would leave the file.
    Write {
        inode: AttributeImage,
        offset: u64,
        data: Arc<[u8]>,
        insert: bool,
    },
    Range {
        inode: AttributeImage,
        kind: RangeKind,
        offset: u64,
        length: u64,
        keep_size: bool,
    },
    SetXattr {
        inode: AttributeImage,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveXattr {
        inode: AttributeImage,
        name: Vec<u8>,
    },
    /// The last open handle of an orphan closed: free it.
    Reclaim {
        inode_number: u64,
    },
    /// A write whose `length` bytes the front end wrote to the blocks of `runs` (claimed from
    /// the allocator, in order, the range starting at the first run's first block) and made
    /// durable before the record was logged; `checksums` holds each block's data checksum
    /// entry. Applying it takes the claimed blocks and maps the range to them (whatever the
    /// range held is freed). The record carries no data.
    DirectWrite {
        inode: AttributeImage,
        offset: u64,
        length: u64,
        runs: Vec<(u64, u64)>,
        checksums: Vec<u32>,
    },
    /// Many creates at once, replayed as that many `Create`s in record order (no symbolic
    /// links): `parents` holds each parent directory's image after all of the record's creates
    /// in it, `creates` the names and new inodes. Every parent has at least one create, no two
    /// parents or new inodes are the same and no (parent, name) repeats; a new directory is
    /// never a parent in the same record.
    CreateBatch {
        parents: Vec<AttributeImage>,
        creates: Vec<BatchCreate>,
    },
}

impl Op {
    pub fn kind(&self) -> u16 {
        match self {
            Op::Create { .. } => KIND_CREATE,
            Op::Link { .. } => KIND_LINK,
            Op::Unlink { .. } => KIND_UNLINK,
            Op::Rename { .. } => KIND_RENAME,
            Op::SetAttributes { .. } => KIND_SET_ATTRIBUTES,
            Op::Write { insert: false, .. } => KIND_WRITE,
            Op::Write { insert: true, .. } => KIND_INSERT_DATA,
            Op::Range { .. } => KIND_RANGE,
            Op::SetXattr { .. } => KIND_SET_XATTR,
            Op::RemoveXattr { .. } => KIND_REMOVE_XATTR,
            Op::Reclaim { .. } => KIND_RECLAIM,
            Op::CreateBatch { .. } => KIND_CREATE_BATCH,
            Op::DirectWrite { .. } => KIND_DIRECT_WRITE,
        }
    }

    /// Encodes everything but a write's data, which the log takes as a second part without a
    /// copy. Returns the fixed part.
    pub fn encode_head(&self) -> Vec<u8> {
        let mut encoder = Encoder::with_capacity(256);
        match self {
            Op::Create { parent, name, inode, symlink_target } => {
                parent.encode(&mut encoder);
                encoder.bytes(name);
                inode.encode(&mut encoder);
                encoder.bytes(symlink_target);
            }
            Op::Link { parent, name, inode } => {
                parent.encode(&mut encoder);
                encoder.bytes(name);
                inode.encode(&mut encoder);
            }
            Op::Unlink { parent, name, inode, disposition } => {
                parent.encode(&mut encoder);
                encoder.bytes(name);
                inode.encode(&mut encoder);
                encoder.u8(*disposition as u8);
            }
            Op::Rename { parent, name, new_parent, new_name, kind, replaced, images } => {
                encoder.u64(*parent).bytes(name).u64(*new_parent).bytes(new_name).u8(*kind as u8);
                match replaced {
                    Some((inode_number, disposition)) => encoder.u8(1).u64(*inode_number).u8(*disposition as u8),
                    None => encoder.u8(0),
                };
                encoder.u32(images.len() as u32);
                for image in images {
                    image.encode(&mut encoder);
                }
            }
            Op::SetAttributes { inode, truncate } => {
                inode.encode(&mut encoder);
                encoder.u8(*truncate as u8);
            }
            Op::Write { inode, offset, data, .. } => {
                inode.encode(&mut encoder);
                encoder.u64(*offset).u32(data.len() as u32);
            }
            Op::Range { inode, kind, offset, length, keep_size } => {
                inode.encode(&mut encoder);
                encoder.u8(*kind as u8).u64(*offset).u64(*length).u8(*keep_size as u8);
            }
            Op::DirectWrite { inode, offset, length, runs, checksums } => {
                inode.encode(&mut encoder);
                encoder.u64(*offset).u64(*length).u32(runs.len() as u32);
                for (first, count) in runs {
                    encoder.u64(*first).u64(*count);
                }
                for checksum in checksums {
                    encoder.u32(*checksum);
                }
            }
            Op::SetXattr { inode, name, value } => {
                inode.encode(&mut encoder);
                encoder.bytes(name).bytes(value);
            }
            Op::RemoveXattr { inode, name } => {
                inode.encode(&mut encoder);
                encoder.bytes(name);
            }
            Op::Reclaim { inode_number } => {
                encoder.u64(*inode_number);
            }
            Op::CreateBatch { parents, creates } => {
                encoder.u32(parents.len() as u32);
                for parent in parents {
                    parent.encode(&mut encoder);
                }
                encoder.u32(creates.len() as u32);
                for create in creates {
                    encoder.u32(create.parent).bytes(&create.name);
                    create.inode.encode(&mut encoder);
                }
            }
        }
        encoder.bytes
    }

    /// The bytes that follow the head in the record (a write's data).
    pub fn tail(&self) -> &[u8] {
        match self {
            Op::Write { data, .. } => data,
            _ => &[],
        }
    }

    pub fn decode(kind: u16, payload: &[u8]) -> Result<Op> {
        let mut decoder = Decoder::new(payload, "log record");
        let name = |decoder: &mut Decoder| -> Result<Vec<u8>> {
            let name = decoder.bytes(NAME_MAX_BYTES)?;
            if name.is_empty() || name.contains(&b'/') || name.contains(&0) || name == b"." || name == b".." {
                return Err(Error::corruption("log record: invalid entry name"));
            }
            Ok(name.to_vec())
        };
        let disposition = |decoder: &mut Decoder| Disposition::from_u8(decoder.u8()?);
        let xattr_name = |decoder: &mut Decoder| -> Result<Vec<u8>> {
            let name = decoder.bytes(XATTR_NAME_MAX_BYTES)?;
            if name.is_empty() || name.contains(&0) {
                return Err(Error::corruption("log record: invalid attribute name"));
            }
            Ok(name.to_vec())
        };
        let flag = |decoder: &mut Decoder| match decoder.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(Error::corruption(format!("log record: flag byte {other}"))),
        };
        let op = match kind {
            KIND_CREATE => Op::Create {
                parent: AttributeImage::decode(&mut decoder)?,
                name: name(&mut decoder)?,
                inode: AttributeImage::decode(&mut decoder)?,
                symlink_target: decoder.bytes(SYMLINK_MAX_BYTES)?.to_vec(),
            },
            KIND_LINK => Op::Link {
                parent: AttributeImage::decode(&mut decoder)?,
                name: name(&mut decoder)?,
                inode: AttributeImage::decode(&mut decoder)?,
            },
            KIND_UNLINK => Op::Unlink {
                parent: AttributeImage::decode(&mut decoder)?,
                name: name(&mut decoder)?,
                inode: AttributeImage::decode(&mut decoder)?,
                disposition: disposition(&mut decoder)?,
            },
            KIND_RENAME => {
                let parent = decoder.u64()?;
                let old_name = name(&mut decoder)?;
                let new_parent = decoder.u64()?;
                let new_name = name(&mut decoder)?;
                let kind = match decoder.u8()? {
                    0 => RenameKind::Move,
                    1 => RenameKind::Exchange,
                    other => return Err(Error::corruption(format!("log record: rename kind {other}"))),
                };
                let replaced = match decoder.u8()? {
                    0 => None,
                    1 => Some((decoder.u64()?, disposition(&mut decoder)?)),
                    other => return Err(Error::corruption(format!("log record: replaced flag {other}"))),
                };
                let count = decoder.u32()?;
                if count > 6 {
                    return Err(Error::corruption(format!("log record: rename with {count} images")));
                }
                let mut images = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    images.push(AttributeImage::decode(&mut decoder)?);
                }
                Op::Rename { parent, name: old_name, new_parent, new_name, kind, replaced, images }
            }
            KIND_SET_ATTRIBUTES => {
                Op::SetAttributes { inode: AttributeImage::decode(&mut decoder)?, truncate: flag(&mut decoder)? }
            }
            KIND_WRITE | KIND_INSERT_DATA => {
                let insert = kind == KIND_INSERT_DATA;
                let inode = AttributeImage::decode(&mut decoder)?;
                let offset = decoder.u64()?;
                let length = decoder.u32()? as usize;
                let data = decoder.rest();
                if data.len() != length
                    || offset.checked_add(length as u64).is_none_or(|end| end > crate::extent::MAX_FILE_BYTES)
                {
                    return Err(Error::corruption(format!(
                        "log record: write of {length} bytes at {offset} carries {} bytes",
                        data.len()
                    )));
                }
                // An insert of nothing is never logged (the front end returns before).
                if insert && length == 0 {
                    return Err(Error::corruption(format!("log record: insert of no bytes at {offset}")));
                }
                Op::Write { inode, offset, data: Arc::from(data), insert }
            }
            KIND_RANGE => {
                let inode = AttributeImage::decode(&mut decoder)?;
                let kind = match decoder.u8()? {
                    0 => RangeKind::Insert,
                    1 => RangeKind::Collapse,
                    2 => RangeKind::PunchHole,
                    3 => RangeKind::ZeroRange,
                    4 => RangeKind::Allocate,
                    5 => RangeKind::Compact,
                    other => return Err(Error::corruption(format!("log record: range kind {other}"))),
                };
                let (offset, length) = (decoder.u64()?, decoder.u64()?);
                let end = offset.checked_add(length);
                let end_limit = if kind == RangeKind::PunchHole { u64::MAX } else { crate::extent::MAX_FILE_BYTES };
                if length == 0 || offset > crate::extent::MAX_FILE_BYTES || end.is_none_or(|end| end > end_limit) {
                    return Err(Error::corruption(format!("log record: range of {length} bytes at {offset}")));
                }
                Op::Range { inode, kind, offset, length, keep_size: flag(&mut decoder)? }
            }
            KIND_SET_XATTR => Op::SetXattr {
                inode: AttributeImage::decode(&mut decoder)?,
                name: xattr_name(&mut decoder)?,
                value: decoder.bytes(XATTR_VALUE_MAX_BYTES)?.to_vec(),
            },
            KIND_REMOVE_XATTR => {
                Op::RemoveXattr { inode: AttributeImage::decode(&mut decoder)?, name: xattr_name(&mut decoder)? }
            }
            KIND_RECLAIM => Op::Reclaim { inode_number: decoder.u64()? },
            KIND_CREATE_BATCH => decode_create_batch(&mut decoder, name)?,
            KIND_DIRECT_WRITE => decode_direct_write(&mut decoder)?,
            other => return Err(Error::corruption(format!("log record kind {other} is unknown"))),
        };
        decoder.finish()?;
        Ok(op)
    }

    /// The checks of a decoded record that need the volume: every inode number it names lies
    /// on a volume of `inode_count` inodes. Replay runs this before it applies anything.
    pub fn check(&self, inode_count: u64) -> Result<()> {
        let number = |inode_number: u64, what: &str| {
            if inode_number == 0 || inode_number > inode_count {
                return Err(Error::corruption(format!(
                    "log record: {what} inode {inode_number} on a volume of {inode_count} inodes"
                )));
            }
            Ok(())
        };
        match self {
            Op::Create { parent, inode, .. } | Op::Link { parent, inode, .. } | Op::Unlink { parent, inode, .. } => {
                parent.check(inode_count)?;
                inode.check(inode_count)
            }
            Op::Rename { parent, new_parent, replaced, images, .. } => {
                number(*parent, "rename source directory")?;
                number(*new_parent, "rename target directory")?;
                if let Some((replaced, _)) = replaced {
                    number(*replaced, "replaced")?;
                }
                images.iter().try_for_each(|image| image.check(inode_count))
            }
            Op::SetAttributes { inode, .. }
            | Op::Write { inode, .. }
            | Op::DirectWrite { inode, .. }
            | Op::Range { inode, .. }
            | Op::SetXattr { inode, .. }
            | Op::RemoveXattr { inode, .. } => inode.check(inode_count),
            Op::Reclaim { inode_number } => number(*inode_number, "reclaimed"),
            Op::CreateBatch { parents, creates } => {
                parents.iter().try_for_each(|image| image.check(inode_count))?;
                creates.iter().try_for_each(|create| create.inode.check(inode_count))
            }
        }
    }
}

/// The payload of a `KIND_DIRECT_WRITE` record: a length of 1..=`DIRECT_WRITE_RECORD_MAX_BYTES`
/// inside the largest file, 1 to one-per-block runs of blocks that hold exactly the blocks the
/// length needs, and a checksum entry per block, none of them `NO_CHECKSUM` (written data
/// always has one). Whether the runs lie in the data region and are free is the volume's check.
fn decode_direct_write(decoder: &mut Decoder) -> Result<Op> {
    let inode = AttributeImage::decode(decoder)?;
    let (offset, length) = (decoder.u64()?, decoder.u64()?);
    if length == 0
        || length > DIRECT_WRITE_RECORD_MAX_BYTES
        || offset.checked_add(length).is_none_or(|end| end > crate::extent::MAX_FILE_BYTES)
    {
        return Err(Error::corruption(format!("log record: direct write of {length} bytes at {offset}")));
    }
    let blocks = length.div_ceil(crate::block::meta::BLOCK_SIZE_U64);
    let run_count = decoder.u32()? as u64;
    if run_count == 0 || run_count > blocks {
        return Err(Error::corruption(format!("log record: direct write of {blocks} blocks in {run_count} runs")));
    }
    let mut runs = Vec::with_capacity(run_count as usize);
    let mut total = 0u64;
    for _ in 0..run_count {
        let (first, count) = (decoder.u64()?, decoder.u64()?);
        total = total.saturating_add(count);
        if count == 0 || first.checked_add(count).is_none() || total > blocks {
            return Err(Error::corruption(format!("log record: direct write run of {count} blocks at {first}")));
        }
        runs.push((first, count));
    }
    if total != blocks {
        return Err(Error::corruption(format!("log record: direct write of {blocks} blocks maps {total}")));
    }
    let mut checksums = Vec::with_capacity(blocks as usize);
    for _ in 0..blocks {
        let checksum = decoder.u32()?;
        if checksum == crate::block::volume::NO_CHECKSUM {
            return Err(Error::corruption("log record: direct write block without a checksum"));
        }
        checksums.push(checksum);
    }
    Ok(Op::DirectWrite { inode, offset, length, runs, checksums })
}

/// The payload of a `KIND_CREATE_BATCH` record, with every rule of `Op::CreateBatch` checked:
/// replay applies it as that many creates, so nothing in it may contradict itself.
fn decode_create_batch(decoder: &mut Decoder, name: impl Fn(&mut Decoder) -> Result<Vec<u8>>) -> Result<Op> {
    let parent_count = decoder.u32()? as usize;
    if parent_count == 0 || parent_count > CREATE_BATCH_RECORD_MAX {
        return Err(Error::corruption(format!("log record: create batch with {parent_count} parents")));
    }
    let mut parents = Vec::with_capacity(parent_count);
    for _ in 0..parent_count {
        let parent = AttributeImage::decode(decoder)?;
        if parent.file_type() != FileType::Directory {
            return Err(Error::corruption(format!(
                "log record: create batch parent {} is not a directory",
                parent.inode_number
            )));
        }
        parents.push(parent);
    }
    let create_count = decoder.u32()? as usize;
    if create_count < parent_count || create_count > CREATE_BATCH_RECORD_MAX {
        return Err(Error::corruption(format!(
            "log record: create batch of {create_count} creates in {parent_count} parents"
        )));
    }
    let mut creates = Vec::with_capacity(create_count);
    for _ in 0..create_count {
        let parent = decoder.u32()?;
        if parent as usize >= parent_count {
            return Err(Error::corruption(format!("log record: create batch parent place {parent}")));
        }
        let name = name(decoder)?;
        let inode = AttributeImage::decode(decoder)?;
        if inode.file_type() == FileType::Symlink {
            return Err(Error::corruption("log record: create batch makes a symbolic link"));
        }
        creates.push(BatchCreate { parent, name, inode });
    }
    let mut numbers = std::collections::HashSet::with_capacity(parent_count + create_count);
    if !parents.iter().all(|parent| numbers.insert(parent.inode_number))
        || !creates.iter().all(|create| numbers.insert(create.inode.inode_number))
    {
        return Err(Error::corruption("log record: create batch names an inode twice"));
    }
    let mut used = vec![false; parent_count];
    let mut keys = std::collections::HashSet::with_capacity(create_count);
    for create in &creates {
        used[create.parent as usize] = true;
        if !keys.insert((create.parent, create.name.as_slice())) {
            return Err(Error::corruption("log record: create batch makes one name twice"));
        }
    }
    if used.contains(&false) {
        return Err(Error::corruption("log record: create batch parent without a create"));
    }
    Ok(Op::CreateBatch { parents, creates })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(number: u64) -> AttributeImage {
        AttributeImage {
            inode_number: number,
            generation: 3,
            mode: 0o100644,
            link_count: 1,
            uid: 1,
            gid: 2,
            size_bytes: 10,
            access_time_ns: 4,
            modify_time_ns: 5,
            change_time_ns: 6,
            birth_time_ns: 7,
            rdev: 0,
            parent: 0,
            flags: 0,
        }
    }

    fn directory(number: u64) -> AttributeImage {
        AttributeImage { mode: 0o040755, link_count: 2, ..image(number) }
    }

    /// A create batch that contradicts itself is corruption, each rule on its own.
    #[test]
    fn create_batches_that_contradict_themselves_are_corruption() {
        let create =
            |parent: u32, name: &[u8], inode: AttributeImage| BatchCreate { parent, name: name.to_vec(), inode };
        let good = Op::CreateBatch {
            parents: vec![directory(1), directory(3)],
            creates: vec![create(0, b"a", image(2)), create(1, b"a", image(4))],
        };
        assert!(Op::decode(good.kind(), &good.encode_head()).is_ok());
        let bad = [
            Op::CreateBatch { parents: vec![], creates: vec![] },
            Op::CreateBatch { parents: vec![image(1)], creates: vec![create(0, b"a", image(2))] },
            Op::CreateBatch { parents: vec![directory(1)], creates: vec![create(1, b"a", image(2))] },
            Op::CreateBatch {
                parents: vec![directory(1)],
                creates: vec![create(0, b"a", image(2)), create(0, b"a", image(4))],
            },
            Op::CreateBatch {
                parents: vec![directory(1)],
                creates: vec![create(0, b"a", image(2)), create(0, b"b", image(2))],
            },
            Op::CreateBatch { parents: vec![directory(1)], creates: vec![create(0, b"a", directory(1))] },
            Op::CreateBatch { parents: vec![directory(1), directory(3)], creates: vec![create(0, b"a", image(2))] },
            Op::CreateBatch {
                parents: vec![directory(1)],
                creates: vec![create(0, b"a", AttributeImage { mode: 0o120777, ..image(2) })],
            },
            Op::CreateBatch { parents: vec![directory(1)], creates: vec![create(0, b"..", image(2))] },
        ];
        for (place, op) in bad.iter().enumerate() {
            let error = Op::decode(op.kind(), &op.encode_head()).unwrap_err();
            assert!(error.is_corruption(), "case {place}: {error}");
        }
        let beyond = Op::CreateBatch { parents: vec![directory(1)], creates: vec![create(0, b"a", image(101))] };
        assert!(beyond.check(100).unwrap_err().is_corruption());
    }

    /// A direct write's runs hold exactly the blocks of its length, each block has a checksum,
    /// and the length is within one record's: anything else is corruption.
    #[test]
    fn a_direct_write_that_contradicts_itself_is_corruption() {
        let direct = |length: u64, runs: Vec<(u64, u64)>, checksums: Vec<u32>| Op::DirectWrite {
            inode: image(2),
            offset: 0,
            length,
            runs,
            checksums,
        };
        let bad = [
            direct(0, vec![(100, 1)], vec![1]),
            direct(4097, vec![(100, 1)], vec![1, 2]),
            direct(4096, vec![(100, 2)], vec![1, 2]),
            direct(4096, vec![(100, 0), (101, 1)], vec![1]),
            direct(4096, vec![(100, 1)], vec![0]),
            direct(4096, vec![], vec![1]),
            direct(DIRECT_WRITE_RECORD_MAX_BYTES + 1, vec![(100, 4097)], vec![1; 4097]),
            direct(4096, vec![(u64::MAX, 1)], vec![1]),
        ];
        for (place, op) in bad.iter().enumerate() {
            let error = Op::decode(op.kind(), &op.encode_head()).unwrap_err();
            assert!(error.is_corruption(), "case {place}: {error}");
        }
        let good = direct(8192, vec![(100, 1), (300, 1)], vec![1, 2]);
        assert_eq!(Op::decode(good.kind(), &good.encode_head()).unwrap(), good);
    }

    /// The record decoder is as strict as the inode decoder: a mode the inode decoder rejects,
    /// a flag byte other than 0 or 1, an inode number beyond the volume are corruption.
    #[test]
    fn impossible_values_are_corruption() {
        for mode in [0o100644 | 0o200000, 0o100644 | 0x8000_0000, 0o000644] {
            let op = Op::SetAttributes { inode: AttributeImage { mode, ..image(2) }, truncate: false };
            assert!(Op::decode(op.kind(), &op.encode_head()).unwrap_err().is_corruption(), "mode {mode:#o}");
            let mut bytes = [0u8; crate::block::inode::INODE_BYTES];
            let mut inode_image = image(2);
            inode_image.mode = mode;
            let inode = inode_image.to_new_inode();
            inode.encode(&mut bytes);
            assert!(Inode::decode(&bytes, 2, 100).is_err(), "the inode decoder agrees about {mode:#o}");
        }
        let mut payload = Op::SetAttributes { inode: image(2), truncate: true }.encode_head();
        *payload.last_mut().unwrap() = 2;
        assert!(Op::decode(KIND_SET_ATTRIBUTES, &payload).unwrap_err().is_corruption());
        let op = Op::Write { inode: image(200), offset: 0, data: Arc::from(&b"x"[..]), insert: false };
        assert!(op.check(100).unwrap_err().is_corruption());
        assert!(Op::Write { inode: image(2), offset: 0, data: Arc::from(&b"x"[..]), insert: false }.check(100).is_ok());
        // An insert of no bytes is never logged; a write of none decodes (as it always did).
        let empty = Op::Write { inode: image(2), offset: 3, data: Arc::from(&b""[..]), insert: true };
        assert!(Op::decode(KIND_INSERT_DATA, &empty.encode_head()).unwrap_err().is_corruption());
        assert!(Op::decode(KIND_WRITE, &empty.encode_head()).is_ok());
        assert!(Op::Reclaim { inode_number: 101 }.check(100).unwrap_err().is_corruption());
        let parent_beyond = AttributeImage { parent: 101, ..image(2) };
        assert!(Op::SetAttributes { inode: parent_beyond, truncate: false }.check(100).is_err());
        assert!(Op::decode(55, &[]).unwrap_err().is_corruption());
    }

    #[test]
    fn images_an_inode_read_would_refuse_are_corruption() {
        let mut bad_mode = image(2);
        bad_mode.mode = 0o100644 | 0o200000; // a bit beyond the type and permissions
        let mut bad_flags = image(2);
        bad_flags.flags = 1;
        let mut bad_rdev = image(2);
        bad_rdev.rdev = 5; // a device number on a regular file
        for bad in [bad_mode, bad_flags, bad_rdev] {
            let op = Op::SetAttributes { inode: bad, truncate: false };
            let mut payload = op.encode_head();
            payload.extend_from_slice(op.tail());
            assert!(Op::decode(op.kind(), &payload).unwrap_err().is_corruption());
        }
    }

    #[test]
    fn every_kind_round_trips_and_truncation_is_corruption() {
        let ops = vec![
            Op::Create { parent: image(1), name: b"a".to_vec(), inode: image(2), symlink_target: vec![] },
            Op::Link { parent: image(1), name: b"b".to_vec(), inode: image(2) },
            Op::Unlink { parent: image(1), name: b"b".to_vec(), inode: image(2), disposition: Disposition::Orphan },
            Op::Rename {
                parent: 1,
                name: b"a".to_vec(),
                new_parent: 3,
                new_name: b"c".to_vec(),
                kind: RenameKind::Move,
                replaced: Some((9, Disposition::Reclaim)),
                images: vec![image(1), image(3)],
            },
            Op::SetAttributes { inode: image(2), truncate: true },
            Op::Write { inode: image(2), offset: 77, data: Arc::from(&b"hello"[..]), insert: false },
            Op::Write { inode: image(2), offset: 78, data: Arc::from(&b"inserted"[..]), insert: true },
            Op::Range { inode: image(2), kind: RangeKind::Collapse, offset: 1, length: 2, keep_size: false },
            Op::Range { inode: image(2), kind: RangeKind::Compact, offset: 3, length: 4096, keep_size: false },
            Op::SetXattr { inode: image(2), name: b"user.x".to_vec(), value: b"v".to_vec() },
            Op::RemoveXattr { inode: image(2), name: b"user.x".to_vec() },
            Op::Reclaim { inode_number: 2 },
            Op::DirectWrite {
                inode: image(2),
                offset: 5,
                length: 3 * 4096 + 1,
                runs: vec![(100, 3), (200, 1)],
                checksums: vec![1, 2, 3, u32::MAX],
            },
            Op::CreateBatch {
                parents: vec![directory(1), directory(3)],
                creates: vec![
                    BatchCreate { parent: 0, name: b"a".to_vec(), inode: image(2) },
                    BatchCreate { parent: 1, name: b"a".to_vec(), inode: image(4) },
                    BatchCreate { parent: 0, name: b"b".to_vec(), inode: directory(5) },
                ],
            },
        ];
        let mut kinds = std::collections::HashSet::new();
        for op in ops {
            kinds.insert(op.kind());
            let mut payload = op.encode_head();
            payload.extend_from_slice(op.tail());
            assert_eq!(Op::decode(op.kind(), &payload).unwrap(), op);
            for cut in 0..payload.len() {
                assert!(Op::decode(op.kind(), &payload[..cut]).is_err());
            }
        }
        assert!(kinds.contains(&KIND_INSERT_DATA) && kinds.contains(&KIND_WRITE), "{kinds:?}");
    }
}
