//! The bytes between the host and the directory kernel: command codes, request records,
//! answer records, and how a batch is cut into commands. `dirindex.cu` reads and writes the
//! same layouts (little-endian; every name starts 8-byte aligned and is zero-padded to a
//! multiple of 8 bytes, so the kernel moves names as 64-bit words).
//!
//! The decoders check everything that comes back from the GPU (status codes, kinds, record
//! bounds) before it becomes an answer.

use super::{
    ApplyReport, CreateEntry, CreateResult, IndexAttributes, IndexKind, IndexUpdate, ListResult, LookupResult,
    ResolveResult, Settle, SettleResult, StatResult, ATTRIBUTES_BYTES, MAXIMUM_NAME_BYTES,
};
use crate::error::{AccelError, Result};
use std::collections::HashSet;
use std::mem::MaybeUninit;

// Command codes (`struct Command.opcode`).
pub const COMMAND_STOP: u32 = 1;
pub const COMMAND_APPLY: u32 = 2;
pub const COMMAND_DROP: u32 = 3;
pub const COMMAND_LOOKUP: u32 = 4;
pub const COMMAND_RESOLVE: u32 = 5;
pub const COMMAND_STAT: u32 = 6;
pub const COMMAND_LIST: u32 = 7;
/// Answered by the kernel's polling warp with the completion alone (no fence, no table access):
/// the bare doorbell round trip of the ring, for the benchmark.
pub const COMMAND_NOP: u32 = 8;
/// Creates of entries whose names the index finds free (docs/GPUDIR.md, "Creates").
pub const COMMAND_CREATE: u32 = 9;
/// Sent the express way only: the polling warp times chains of dependent table loads and of
/// multiplies on both of the GPU's clocks (`ring::latency_probe`), for the benchmark.
pub const COMMAND_PROBE: u32 = 10;
/// Settles the pending claims of a tentative create (argument0: `SETTLE_COMMIT` or
/// `SETTLE_ABORT`); requests are create records (`encode_creates`), answers create answers
/// with `STATUS_SETTLED` or `STATUS_NOT_PENDING` (docs/GPUDIR.md, "Tentative creates").
pub const COMMAND_SETTLE: u32 = 11;
/// argument0 of a `COMMAND_CREATE`: 0 places entries, this claims them pending.
pub const CREATE_PENDING: u64 = 1;
pub const SETTLE_COMMIT: u64 = 1;
pub const SETTLE_ABORT: u64 = 2;

// Update codes inside an apply command.
pub const UPDATE_INSERT: u32 = 1;
pub const UPDATE_REMOVE: u32 = 2;
pub const UPDATE_SET_ATTRIBUTES: u32 = 3;
pub const UPDATE_REMOVE_INODE: u32 = 4;
pub const UPDATE_MARK_COMPLETE: u32 = 5;
pub const UPDATE_MARK_INCOMPLETE: u32 = 6;

// Answer status codes, one space for every query.
pub const STATUS_FOUND: u32 = 1;
pub const STATUS_NOT_FOUND: u32 = 2;
pub const STATUS_UNKNOWN: u32 = 3;
pub const STATUS_NOT_DIRECTORY: u32 = 4;
pub const STATUS_PERMISSION_DENIED: u32 = 5;
pub const STATUS_NAME_TOO_LONG: u32 = 6;
pub const STATUS_NEEDS_CPU: u32 = 7;
/// Create answers (with STATUS_NOT_DIRECTORY and STATUS_UNKNOWN).
pub const STATUS_CREATED: u32 = 8;
pub const STATUS_EXISTS: u32 = 9;
/// Settle answers.
pub const STATUS_SETTLED: u32 = 10;
pub const STATUS_NOT_PENDING: u32 = 11;

/// Lookup request: parent u64, name offset u32 (from the start of the requests), length u32.
pub const LOOKUP_RECORD_BYTES: usize = 16;
/// Resolve request: path offset u32, length u32.
pub const RESOLVE_RECORD_BYTES: usize = 8;
/// Stat request: inode u64.
pub const STAT_RECORD_BYTES: usize = 8;
/// Apply request: code u32, name length u32, key u64, value u64, offset u64 (of the name or
/// of the attribute record).
pub const APPLY_RECORD_BYTES: usize = 32;
/// Answer: status u32, zero u32, attributes (meaningful when the status is Found).
pub const ANSWER_BYTES: usize = 8 + ATTRIBUTES_BYTES;
/// List answer records: child u64, name length u32, zero u32, name padded to 8 bytes.
pub const LIST_RECORD_HEADER_BYTES: usize = 16;
/// A create record: parent u64, name offset u32, name length u32, attributes offset u64 (the
/// 104-byte record, 8-byte aligned, after the names).
pub const CREATE_RECORD_BYTES: usize = 24;
/// A create answer: status u32, zero u32, the existing child (EXISTS) or 0.
pub const CREATE_ANSWER_BYTES: usize = 16;
/// Answers start on this boundary after the requests.
const ANSWERS_ALIGNMENT_BYTES: usize = 128;

pub fn padded(length: usize) -> usize {
    length.div_ceil(8) * 8
}

fn bad(message: String) -> AccelError {
    AccelError::Device(format!("directory kernel answered nonsense: {message}"))
}

/// Where a command's parts lie in its staging buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub request_bytes: usize,
    pub answers_offset: usize,
    pub answers_bytes: usize,
}

impl Layout {
    fn new(request_bytes: usize, answers_bytes: usize) -> Self {
        let answers_offset = request_bytes.div_ceil(ANSWERS_ALIGNMENT_BYTES) * ANSWERS_ALIGNMENT_BYTES;
        Layout { request_bytes, answers_offset, answers_bytes }
    }

    pub fn total_bytes(&self) -> usize {
        self.answers_offset + self.answers_bytes
    }
}

/// How many items from the start fit one staging buffer of `capacity_bytes`, given each
/// item's (request bytes, answer bytes). At least one (a single item always fits the
/// buffers the engine allocates; asserted).
pub fn items_that_fit(sizes: impl Iterator<Item = (usize, usize)>, capacity_bytes: usize) -> usize {
    let (mut requests, mut answers, mut count) = (0usize, 0usize, 0usize);
    for (request, answer) in sizes {
        let layout = Layout::new(requests + request, answers + answer);
        if layout.total_bytes() > capacity_bytes {
            break;
        }
        requests += request;
        answers += answer;
        count += 1;
    }
    count
}

/// Items whose sizes `chunk_bounds` adds up exactly; of a larger batch it adds up this many,
/// evenly spaced, and scales. The estimate only sets how many chunks to aim for: every chunk's
/// fit is checked item by item all the same, so a wrong estimate costs balance, never a fit.
/// (Adding up all of 1M paths' sizes took 2 ms on the calling thread before any worker starts.)
const EXACT_TOTAL_ITEMS: usize = 4096;

fn estimated_total_bytes(count: usize, size_of: &impl Fn(usize) -> (usize, usize)) -> usize {
    let bytes = |index: usize| {
        let (request, answer) = size_of(index);
        request + answer
    };
    if count <= EXACT_TOTAL_ITEMS {
        return (0..count).map(bytes).sum();
    }
    let step = count / EXACT_TOTAL_ITEMS;
    let sampled: usize = (0..EXACT_TOTAL_ITEMS).map(|sample| bytes(sample * step)).sum();
    (sampled as u128 * count as u128 / EXACT_TOTAL_ITEMS as u128) as usize
}

/// Cuts `count` items (item i takes `size_of(i)` = (request bytes, answer bytes)) into
/// consecutive chunks for `workers` staging buffers of `capacity_bytes` each, one chunk at a
/// time, so that workers start on the first chunks while the rest are cut: every chunk fits a
/// buffer; a batch of fewer than 2 × `minimum_items` stays one chunk when it fits (no thread
/// start for a short batch); otherwise the chunks hold about equal bytes and there are at least
/// `workers` of them, their number rounded up to a multiple of `workers`, so that the workers
/// finish together instead of one worker serving a last odd chunk alone. The total that sets
/// the number of chunks is estimated from a sample; the last chunk aimed for takes whatever is
/// left that fits, so a low estimate leaves no small chunk over. Nothing per item is kept.
pub struct ChunkCutter<F> {
    size_of: F,
    count: usize,
    /// Room of a buffer less the alignment gap between requests and answers: bytes are
    /// counted as requests plus answers, and the gap before the answers is under
    /// ANSWERS_ALIGNMENT_BYTES, so a chunk of at most `usable` such bytes fits a buffer.
    usable: usize,
    target_bytes: usize,
    aimed: usize,
    next: usize,
    produced: usize,
}

impl<F: Fn(usize) -> (usize, usize)> ChunkCutter<F> {
    pub fn new(count: usize, size_of: F, capacity_bytes: usize, workers: usize, minimum_items: usize) -> Self {
        assert!(workers > 0 && minimum_items > 0 && capacity_bytes > ANSWERS_ALIGNMENT_BYTES);
        let total = estimated_total_bytes(count, &size_of);
        let usable = capacity_bytes - ANSWERS_ALIGNMENT_BYTES;
        let by_capacity = total.div_ceil(usable).max(1);
        let by_items = (count / minimum_items).max(1);
        let mut aimed = by_capacity.max(workers.min(by_items));
        if aimed > 1 {
            aimed = aimed.div_ceil(workers) * workers;
            aimed = aimed.min(by_items.max(by_capacity));
        }
        let target_bytes = total.div_ceil(aimed);
        ChunkCutter { size_of, count, usable, target_bytes, aimed, next: 0, produced: 0 }
    }

    /// Requests in the batch.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Chunks the cut aims for (more follow only when the estimate was low and the rest does
    /// not fit the last one).
    pub fn aimed(&self) -> usize {
        self.aimed
    }

    /// The next chunk (start, end), or None once the batch is cut.
    pub fn next_chunk(&mut self) -> Option<(usize, usize)> {
        if self.next >= self.count {
            return None;
        }
        let start = self.next;
        let last = self.produced + 1 >= self.aimed;
        let (mut index, mut used) = (start, 0usize);
        // Bounded by the batch; a chunk takes at least one request (asserted to fit).
        while index < self.count {
            let (request, answer) = (self.size_of)(index);
            let bytes = request + answer;
            assert!(bytes <= self.usable, "item {index} of {bytes} bytes fits no staging buffer");
            if used + bytes > self.usable {
                break;
            }
            used += bytes;
            index += 1;
            if !last && used >= self.target_bytes {
                break;
            }
        }
        self.next = index;
        self.produced += 1;
        Some((start, index))
    }
}

/// Every chunk of `ChunkCutter::new(...)` at once (tests, the benchmark).
pub fn chunk_bounds(
    count: usize,
    size_of: impl Fn(usize) -> (usize, usize),
    capacity_bytes: usize,
    workers: usize,
    minimum_items: usize,
) -> Vec<(usize, usize)> {
    let mut cutter = ChunkCutter::new(count, size_of, capacity_bytes, workers, minimum_items);
    std::iter::from_fn(|| cutter.next_chunk()).collect()
}

/// Fills `out` (cleared first) with the answers of the batch `cutter` cuts, chunk by chunk:
/// `run(start, end, piece)` must write every element of `piece` (the answers start..end) or
/// fail. A batch the cutter aims to keep whole runs on the calling thread (after `setup`);
/// otherwise up to `workers` scoped threads, each calling `setup` first (the GPU engine binds
/// its context there), take the chunks in order as the cutter cuts them. Each chunk's answers
/// go straight to their place in `out`, so nothing is gathered afterwards, and a fresh `out`
/// is first touched by all the workers. All or nothing: after any failure `out` is left empty.
pub fn fill_in_chunks<T: Copy + Send, F: Fn(usize) -> (usize, usize) + Send>(
    cutter: ChunkCutter<F>,
    workers: usize,
    out: &mut Vec<T>,
    setup: impl Fn() -> Result<()> + Sync,
    run: impl Fn(usize, usize, &mut [MaybeUninit<T>]) -> Result<()> + Sync,
) -> Result<()> {
    assert!(workers > 0);
    let count = cutter.count();
    let threads = workers.min(cutter.aimed());
    out.clear();
    out.reserve(count);
    let queue = std::sync::Mutex::new((cutter, &mut out.spare_capacity_mut()[..count]));
    // The next chunk and its part of `out`; None once the batch is cut.
    let take = || {
        let mut state = queue.lock().expect("chunk queue poisoned");
        let (cutter, rest) = &mut *state;
        let (start, end) = cutter.next_chunk()?;
        let (piece, tail) = std::mem::take(rest).split_at_mut(end - start);
        *rest = tail;
        Some((start, end, piece))
    };
    // Bounded by the number of chunks.
    let serve = || -> Result<()> {
        setup()?;
        while let Some((start, end, piece)) = take() {
            run(start, end, piece)?;
        }
        Ok(())
    };
    if threads <= 1 {
        serve()?;
    } else {
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads).map(|_| scope.spawn(serve)).collect();
            handles.into_iter().map(|handle| handle.join().expect("batch worker panicked")).collect()
        });
        results.into_iter().collect::<Result<()>>()?;
    }
    let (mut cutter, rest) = queue.into_inner().expect("chunk queue poisoned");
    assert!(cutter.next_chunk().is_none() && rest.is_empty(), "the chunks cover the batch");
    // SAFETY: a worker returns Ok only once the cutter is done, and every chunk it took was
    // run with Ok, which writes each element of its piece; the pieces were split off `out`'s
    // first `count` elements in order and, asserted above, cover them all.
    unsafe { out.set_len(count) };
    Ok(())
}

fn put_u32(buffer: &mut [u8], at: usize, value: u32) {
    buffer[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(buffer: &mut [u8], at: usize, value: u64) {
    buffer[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(buffer: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buffer[at..at + 4].try_into().unwrap())
}

fn get_u64(buffer: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buffer[at..at + 8].try_into().unwrap())
}

/// Writes a name at `at` zero-padded to 8 bytes; returns the offset after it.
fn put_name(buffer: &mut [u8], at: usize, name: &[u8]) -> usize {
    let end = at + padded(name.len());
    buffer[at..at + name.len()].copy_from_slice(name);
    buffer[at + name.len()..end].fill(0);
    end
}

pub fn put_attributes(buffer: &mut [u8], at: usize, attributes: &IndexAttributes) {
    let words = [
        attributes.inode,
        attributes.generation,
        attributes.size_bytes,
        attributes.blocks_512,
        attributes.atime_ns as u64,
        attributes.mtime_ns as u64,
        attributes.ctime_ns as u64,
        attributes.btime_ns as u64,
        attributes.rdev,
        attributes.parent,
    ];
    for (index, word) in words.iter().enumerate() {
        put_u64(buffer, at + 8 * index, *word);
    }
    let tail = [
        attributes.kind as u32,
        attributes.permissions,
        attributes.uid,
        attributes.gid,
        attributes.link_count,
        attributes.reserved,
    ];
    for (index, word) in tail.iter().enumerate() {
        put_u32(buffer, at + 80 + 4 * index, *word);
    }
}

/// Reads a record back, refusing one no host could have written. Runs once per answer,
/// millions of times a second: one bounds check, the kind checked before the record becomes
/// an `IndexAttributes` (the only field with invalid bit patterns), then the value checks.
pub fn get_attributes(buffer: &[u8], at: usize) -> Result<IndexAttributes> {
    let record: &[u8; ATTRIBUTES_BYTES] = buffer
        .get(at..at + ATTRIBUTES_BYTES)
        .and_then(|slice| slice.try_into().ok())
        .ok_or_else(|| bad(format!("attribute record at {at} past {} bytes", buffer.len())))?;
    record_attributes(record)
}

/// `get_attributes` of a record already cut to size (no bounds to check). Inlined into the
/// decoders: called out of line it moved each record through the stack three times.
#[inline(always)]
fn record_attributes(record: &[u8; ATTRIBUTES_BYTES]) -> Result<IndexAttributes> {
    let kind = u32::from_le_bytes(record[80..84].try_into().unwrap());
    if IndexKind::from_code(kind).is_none() {
        return Err(bad(format!("kind code {kind}")));
    }
    let attributes = attributes_from_record(record);
    if attributes.reserved != 0 || attributes.permissions > 0o7777 || super::check_inode(attributes.inode).is_err() {
        return Err(bad(format!("attributes of inode {} have stray bits", attributes.inode)));
    }
    Ok(attributes)
}

/// The record as a value: on a little-endian host its bytes are the `#[repr(C)]` layout itself.
#[cfg(target_endian = "little")]
#[inline(always)]
fn attributes_from_record(record: &[u8; ATTRIBUTES_BYTES]) -> IndexAttributes {
    // The caller checked the kind code (bytes 80..84), so every field holds a valid value.
    assert!(IndexKind::from_code(u32::from_le_bytes(record[80..84].try_into().unwrap())).is_some());
    // SAFETY: IndexAttributes is repr(C), 104 bytes without padding (asserted in mod.rs); every
    // field but `kind` is a plain integer, and `kind` holds a valid discriminant (asserted).
    unsafe { std::ptr::read_unaligned(record.as_ptr() as *const IndexAttributes) }
}

#[cfg(not(target_endian = "little"))]
fn attributes_from_record(record: &[u8; ATTRIBUTES_BYTES]) -> IndexAttributes {
    let word = |index: usize| u64::from_le_bytes(record[8 * index..8 * index + 8].try_into().unwrap());
    let small = |index: usize| u32::from_le_bytes(record[80 + 4 * index..84 + 4 * index].try_into().unwrap());
    IndexAttributes {
        inode: word(0),
        generation: word(1),
        size_bytes: word(2),
        blocks_512: word(3),
        atime_ns: word(4) as i64,
        mtime_ns: word(5) as i64,
        ctime_ns: word(6) as i64,
        btime_ns: word(7) as i64,
        rdev: word(8),
        parent: word(9),
        kind: IndexKind::from_code(small(0)).expect("checked by the caller"),
        permissions: small(1),
        uid: small(2),
        gid: small(3),
        link_count: small(4),
        reserved: small(5),
    }
}

// ---------------------------------------------------------------- requests

pub fn lookup_sizes<'a>(requests: &'a [(u64, &'a [u8])]) -> impl Iterator<Item = (usize, usize)> + 'a {
    requests.iter().map(|(_, name)| (LOOKUP_RECORD_BYTES + padded(name.len()), ANSWER_BYTES))
}

pub fn resolve_sizes<'a>(paths: &'a [&'a [u8]]) -> impl Iterator<Item = (usize, usize)> + 'a {
    paths.iter().map(|path| (RESOLVE_RECORD_BYTES + padded(path.len()), ANSWER_BYTES))
}

pub fn stat_sizes(inodes: &[u64]) -> impl Iterator<Item = (usize, usize)> + '_ {
    inodes.iter().map(|_| (STAT_RECORD_BYTES, ANSWER_BYTES))
}

pub fn apply_sizes(updates: &[IndexUpdate]) -> impl Iterator<Item = (usize, usize)> + '_ {
    updates.iter().map(|update| {
        let extra = match update {
            IndexUpdate::InsertEntry { name, .. } | IndexUpdate::RemoveEntry { name, .. } => padded(name.len()),
            IndexUpdate::SetAttributes(_) => ATTRIBUTES_BYTES,
            _ => 0,
        };
        (APPLY_RECORD_BYTES + extra, 0)
    })
}

fn offset_u32(offset: usize) -> u32 {
    u32::try_from(offset).expect("staging buffers are under 4 GiB")
}

pub fn encode_lookups(requests: &[(u64, &[u8])], buffer: &mut [u8]) -> Layout {
    let mut bytes_at = requests.len() * LOOKUP_RECORD_BYTES;
    for (index, (parent, name)) in requests.iter().enumerate() {
        let record = index * LOOKUP_RECORD_BYTES;
        put_u64(buffer, record, *parent);
        put_u32(buffer, record + 8, offset_u32(bytes_at));
        put_u32(buffer, record + 12, name.len() as u32);
        bytes_at = put_name(buffer, bytes_at, name);
    }
    Layout::new(bytes_at, requests.len() * ANSWER_BYTES)
}

pub fn encode_resolves(paths: &[&[u8]], buffer: &mut [u8]) -> Layout {
    let mut bytes_at = paths.len() * RESOLVE_RECORD_BYTES;
    for (index, path) in paths.iter().enumerate() {
        let record = index * RESOLVE_RECORD_BYTES;
        put_u32(buffer, record, offset_u32(bytes_at));
        put_u32(buffer, record + 4, path.len() as u32);
        bytes_at = put_name(buffer, bytes_at, path);
    }
    Layout::new(bytes_at, paths.len() * ANSWER_BYTES)
}

pub fn encode_stats(inodes: &[u64], buffer: &mut [u8]) -> Layout {
    for (index, inode) in inodes.iter().enumerate() {
        put_u64(buffer, index * STAT_RECORD_BYTES, *inode);
    }
    Layout::new(inodes.len() * STAT_RECORD_BYTES, inodes.len() * ANSWER_BYTES)
}

/// Encodes updates that contain no `DropDirectory` (those are commands of their own).
pub fn encode_updates(updates: &[IndexUpdate], buffer: &mut [u8]) -> Layout {
    let mut bytes_at = updates.len() * APPLY_RECORD_BYTES;
    for (index, update) in updates.iter().enumerate() {
        let record = index * APPLY_RECORD_BYTES;
        let (code, key, value, name): (u32, u64, u64, Option<&[u8]>) = match update {
            IndexUpdate::InsertEntry { parent, name, child } => (UPDATE_INSERT, *parent, *child, Some(name)),
            IndexUpdate::RemoveEntry { parent, name } => (UPDATE_REMOVE, *parent, 0, Some(name)),
            IndexUpdate::SetAttributes(attributes) => (UPDATE_SET_ATTRIBUTES, attributes.inode, 0, None),
            IndexUpdate::RemoveInode(inode) => (UPDATE_REMOVE_INODE, *inode, 0, None),
            IndexUpdate::MarkComplete(inode) => (UPDATE_MARK_COMPLETE, *inode, 0, None),
            IndexUpdate::MarkIncomplete(inode) => (UPDATE_MARK_INCOMPLETE, *inode, 0, None),
            IndexUpdate::DropDirectory(_) => panic!("DropDirectory is a command of its own"),
        };
        put_u32(buffer, record, code);
        put_u32(buffer, record + 4, name.map_or(0, |name| name.len() as u32));
        put_u64(buffer, record + 8, key);
        put_u64(buffer, record + 16, value);
        put_u64(buffer, record + 24, bytes_at as u64);
        if let Some(name) = name {
            bytes_at = put_name(buffer, bytes_at, name);
        } else if let IndexUpdate::SetAttributes(attributes) = update {
            put_attributes(buffer, bytes_at, attributes);
            bytes_at += ATTRIBUTES_BYTES;
        }
    }
    Layout::new(bytes_at, 0)
}

/// One command's worth of an apply batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Updates `start..end` of the batch: no two touch the same key, so the kernel may apply
    /// them all at once.
    Updates {
        start: usize,
        end: usize,
    },
    Drop(u64),
}

/// Cuts a batch into commands that keep its order: a segment ends before an update whose key
/// (entry (parent, name), or inode for attributes and completeness) the segment already
/// touches, before it grows past `capacity_bytes` of staging, and around every drop.
pub fn segments(updates: &[IndexUpdate], capacity_bytes: usize) -> Vec<Segment> {
    let mut result = Vec::new();
    let mut entries: HashSet<(u64, &[u8])> = HashSet::new();
    let mut inodes: HashSet<u64> = HashSet::new();
    let mut start = 0;
    let mut used = Layout::new(0, 0);
    let close = |result: &mut Vec<Segment>, start: usize, end: usize| {
        if end > start {
            result.push(Segment::Updates { start, end });
        }
    };
    for (index, update) in updates.iter().enumerate() {
        if let IndexUpdate::DropDirectory(directory) = update {
            close(&mut result, start, index);
            result.push(Segment::Drop(*directory));
            (start, used) = (index + 1, Layout::new(0, 0));
            entries.clear();
            inodes.clear();
            continue;
        }
        let (request, _) = apply_sizes(std::slice::from_ref(update)).next().unwrap();
        let grown = Layout::new(used.request_bytes + request, 0);
        let conflict = match update {
            IndexUpdate::InsertEntry { parent, name, .. } | IndexUpdate::RemoveEntry { parent, name } => {
                entries.contains(&(*parent, &name[..]))
            }
            IndexUpdate::SetAttributes(attributes) => inodes.contains(&attributes.inode),
            IndexUpdate::RemoveInode(inode) | IndexUpdate::MarkComplete(inode) | IndexUpdate::MarkIncomplete(inode) => {
                inodes.contains(inode)
            }
            IndexUpdate::DropDirectory(_) => unreachable!(),
        };
        if conflict || grown.total_bytes() > capacity_bytes {
            close(&mut result, start, index);
            (start, used) = (index, Layout::new(0, 0));
            entries.clear();
            inodes.clear();
        }
        used = Layout::new(used.request_bytes + request, 0);
        match update {
            IndexUpdate::InsertEntry { parent, name, .. } | IndexUpdate::RemoveEntry { parent, name } => {
                entries.insert((*parent, &name[..]));
            }
            IndexUpdate::SetAttributes(attributes) => {
                inodes.insert(attributes.inode);
            }
            IndexUpdate::RemoveInode(inode) | IndexUpdate::MarkComplete(inode) | IndexUpdate::MarkIncomplete(inode) => {
                inodes.insert(*inode);
            }
            IndexUpdate::DropDirectory(_) => unreachable!(),
        }
    }
    close(&mut result, start, updates.len());
    result
}

/// (request bytes, answer bytes) of each create.
pub fn create_sizes<'a>(requests: &'a [CreateEntry<'a>]) -> impl Iterator<Item = (usize, usize)> + 'a {
    requests
        .iter()
        .map(|request| (CREATE_RECORD_BYTES + padded(request.name.len()) + ATTRIBUTES_BYTES, CREATE_ANSWER_BYTES))
}

pub fn encode_creates(requests: &[CreateEntry<'_>], buffer: &mut [u8]) -> Layout {
    let mut bytes_at = requests.len() * CREATE_RECORD_BYTES;
    for (index, request) in requests.iter().enumerate() {
        let record = index * CREATE_RECORD_BYTES;
        put_u64(buffer, record, request.parent);
        put_u32(buffer, record + 8, offset_u32(bytes_at));
        put_u32(buffer, record + 12, request.name.len() as u32);
        bytes_at = put_name(buffer, bytes_at, request.name);
        put_u64(buffer, record + 16, bytes_at as u64);
        put_attributes(buffer, bytes_at, &request.attributes);
        bytes_at += ATTRIBUTES_BYTES;
    }
    Layout::new(bytes_at, requests.len() * CREATE_ANSWER_BYTES)
}

/// Create answers; an `Exists` must name an inode (the kernel read it from its own table).
pub fn decode_creates_into(answers: &[u8], out: &mut [MaybeUninit<CreateResult>]) -> Result<()> {
    if answers.len() < out.len() * CREATE_ANSWER_BYTES {
        return Err(bad(format!("{} create answer bytes for {} answers", answers.len(), out.len())));
    }
    for (answer, slot) in answers.chunks_exact(CREATE_ANSWER_BYTES).zip(out.iter_mut()) {
        let (status, zero, child) = (get_u32(answer, 0), get_u32(answer, 4), get_u64(answer, 8));
        let result = match (status, zero) {
            (STATUS_CREATED, 0) if child == 0 => CreateResult::Created,
            (STATUS_EXISTS, 0) if (1..=super::MAXIMUM_INODE).contains(&child) => CreateResult::Exists(child),
            (STATUS_NOT_DIRECTORY, 0) if child == 0 => CreateResult::NotDirectory,
            (STATUS_UNKNOWN, 0) if child == 0 => CreateResult::Unknown,
            _ => return Err(bad(format!("create answer status {status}, word {zero}, child {child}"))),
        };
        slot.write(result);
    }
    Ok(())
}

/// argument0 of a settle command.
pub fn settle_argument(settle: Settle) -> u64 {
    match settle {
        Settle::Commit => SETTLE_COMMIT,
        Settle::Abort => SETTLE_ABORT,
    }
}

/// Settle answers (create answers' layout: status u32, zero u32, zero u64).
pub fn decode_settles_into(answers: &[u8], out: &mut [MaybeUninit<SettleResult>]) -> Result<()> {
    if answers.len() < out.len() * CREATE_ANSWER_BYTES {
        return Err(bad(format!("{} settle answer bytes for {} answers", answers.len(), out.len())));
    }
    for (answer, slot) in answers.chunks_exact(CREATE_ANSWER_BYTES).zip(out.iter_mut()) {
        let (status, zero, word) = (get_u32(answer, 0), get_u32(answer, 4), get_u64(answer, 8));
        let result = match (status, zero, word) {
            (STATUS_SETTLED, 0, 0) => SettleResult::Settled,
            (STATUS_NOT_PENDING, 0, 0) => SettleResult::NotPending,
            _ => return Err(bad(format!("settle answer status {status}, word {zero}, {word}"))),
        };
        slot.write(result);
    }
    Ok(())
}

/// Cuts a create batch into commands that keep its order (the twin's answers): a command ends
/// before a request whose entry (parent, name) it already holds, whose parent it creates, or
/// whose new inode it already names as a parent or a child, and before it outgrows
/// `capacity_bytes`. Within a command, then, no request depends on another: every one can run
/// at once, and two that race for a slot are different keys (the kernel is safe for equal keys
/// too, but which of them would win is not the twin's request order).
pub fn create_segments(requests: &[CreateEntry<'_>], capacity_bytes: usize) -> Vec<(usize, usize)> {
    let mut result = Vec::new();
    // A command holds some tens of thousands of creates: sized for that, a fast hash.
    let room = requests.len().min(1 << 16);
    let mut entries: rustc_hash::FxHashSet<(u64, &[u8])> = rustc_hash::FxHashSet::default();
    let mut parents: rustc_hash::FxHashSet<u64> = rustc_hash::FxHashSet::default();
    let mut children: rustc_hash::FxHashSet<u64> = rustc_hash::FxHashSet::default();
    entries.reserve(room);
    children.reserve(room);
    let (mut start, mut request_bytes, mut answer_bytes) = (0, 0, 0);
    for (index, (request, (request_size, answer_size))) in requests.iter().zip(create_sizes(requests)).enumerate() {
        let child = request.attributes.inode;
        let conflict = entries.contains(&(request.parent, request.name))
            || children.contains(&request.parent)
            || children.contains(&child)
            || parents.contains(&child);
        let grown = Layout::new(request_bytes + request_size, answer_bytes + answer_size);
        if index > start && (conflict || grown.total_bytes() > capacity_bytes) {
            result.push((start, index));
            (start, request_bytes, answer_bytes) = (index, 0, 0);
            entries.clear();
            parents.clear();
            children.clear();
        }
        assert!(Layout::new(request_size, answer_size).total_bytes() <= capacity_bytes, "a create fits a command");
        request_bytes += request_size;
        answer_bytes += answer_size;
        entries.insert((request.parent, request.name));
        parents.insert(request.parent);
        children.insert(child);
    }
    if requests.len() > start {
        result.push((start, requests.len()));
    }
    result
}

// ---------------------------------------------------------------- answers

/// Decodes one answer per element of `out` (memory the caller owns, maybe uninitialised) with
/// `one(status, attributes record, index)`. On `Ok` every element is written; on `Err` the
/// caller must treat `out` as uninitialised. Nothing is allocated, and the answers are walked
/// as fixed-size records, so the only bounds check is the one on the whole buffer.
fn decode_into<T: Copy>(
    answers: &[u8],
    out: &mut [MaybeUninit<T>],
    one: impl Fn(u32, &[u8; ATTRIBUTES_BYTES], usize) -> Result<T>,
) -> Result<()> {
    if answers.len() < out.len() * ANSWER_BYTES {
        return Err(bad(format!("{} answer bytes for {} answers", answers.len(), out.len())));
    }
    for (index, (answer, slot)) in answers.chunks_exact(ANSWER_BYTES).zip(out.iter_mut()).enumerate() {
        let answer: &[u8; ANSWER_BYTES] = answer.try_into().expect("chunks_exact");
        let status = u32::from_le_bytes(answer[..4].try_into().unwrap());
        let record: &[u8; ATTRIBUTES_BYTES] = answer[8..].try_into().expect("104 bytes after the status");
        slot.write(one(status, record, index)?);
    }
    Ok(())
}

/// A vector of `count` answers filled by `fill` (which writes all of them or fails).
pub fn decoded<T: Copy>(count: usize, fill: impl FnOnce(&mut [MaybeUninit<T>]) -> Result<()>) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(count);
    fill(&mut out.spare_capacity_mut()[..count])?;
    // SAFETY: `fill` returned Ok, so it wrote each of the first `count` elements.
    unsafe { out.set_len(count) };
    Ok(out)
}

pub fn decode_lookups_into(answers: &[u8], out: &mut [MaybeUninit<LookupResult>]) -> Result<()> {
    decode_into(answers, out, |status, record, _| {
        Ok(match status {
            STATUS_FOUND => LookupResult::Found(record_attributes(record)?),
            STATUS_NOT_FOUND => LookupResult::NotFound,
            STATUS_UNKNOWN => LookupResult::Unknown,
            STATUS_NOT_DIRECTORY => LookupResult::NotDirectory,
            other => return Err(bad(format!("lookup status {other}"))),
        })
    })
}

pub fn decode_resolves_into(answers: &[u8], out: &mut [MaybeUninit<ResolveResult>]) -> Result<()> {
    decode_into(answers, out, |status, record, _| {
        Ok(match status {
            STATUS_FOUND => ResolveResult::Found(record_attributes(record)?),
            STATUS_NOT_FOUND => ResolveResult::NotFound,
            STATUS_NOT_DIRECTORY => ResolveResult::NotDirectory,
            STATUS_PERMISSION_DENIED => ResolveResult::PermissionDenied,
            STATUS_NAME_TOO_LONG => ResolveResult::NameTooLong,
            STATUS_NEEDS_CPU => ResolveResult::NeedsCpu,
            other => return Err(bad(format!("resolve status {other}"))),
        })
    })
}

/// Stat answers; a found record must be the inode asked for (`inodes[i]` for `out[i]`).
pub fn decode_stats_into(answers: &[u8], inodes: &[u64], out: &mut [MaybeUninit<StatResult>]) -> Result<()> {
    assert_eq!(inodes.len(), out.len());
    decode_into(answers, out, |status, record, index| {
        let inode = inodes[index];
        Ok(match status {
            STATUS_FOUND => {
                let attributes = record_attributes(record)?;
                if attributes.inode != inode {
                    return Err(bad(format!("stat of {inode} answered inode {}", attributes.inode)));
                }
                StatResult::Found(attributes)
            }
            STATUS_UNKNOWN => StatResult::Unknown,
            other => return Err(bad(format!("stat status {other}"))),
        })
    })
}

pub fn decode_lookups(answers: &[u8], count: usize) -> Result<Vec<LookupResult>> {
    decoded(count, |out| decode_lookups_into(answers, out))
}

pub fn decode_resolves(answers: &[u8], count: usize) -> Result<Vec<ResolveResult>> {
    decoded(count, |out| decode_resolves_into(answers, out))
}

pub fn decode_stats(answers: &[u8], inodes: &[u64]) -> Result<Vec<StatResult>> {
    decoded(inodes.len(), |out| decode_stats_into(answers, inodes, out))
}

/// Parses `total_bytes` of list records into (name, child) pairs, sorted by name.
pub fn decode_list(records: &[u8], total_bytes: usize) -> Result<Vec<(Vec<u8>, u64)>> {
    if total_bytes > records.len() {
        return Err(bad(format!("list of {total_bytes} bytes in a buffer of {}", records.len())));
    }
    let mut entries = Vec::new();
    let mut at = 0;
    // Every record takes at least LIST_RECORD_HEADER_BYTES + 8, which bounds the loop.
    while at < total_bytes {
        if at + LIST_RECORD_HEADER_BYTES > total_bytes {
            return Err(bad(format!("list record header at {at} crosses the end {total_bytes}")));
        }
        let child = get_u64(records, at);
        let length = get_u32(records, at + 8) as usize;
        let end = at + LIST_RECORD_HEADER_BYTES + padded(length);
        if length == 0 || length > MAXIMUM_NAME_BYTES || end > total_bytes || super::check_inode(child).is_err() {
            return Err(bad(format!("list record at {at}: child {child}, name of {length} bytes")));
        }
        let name = records[at + LIST_RECORD_HEADER_BYTES..at + LIST_RECORD_HEADER_BYTES + length].to_vec();
        entries.push((name, child));
        at = end;
    }
    entries.sort_unstable();
    Ok(entries)
}

/// The list record for one entry (what the kernel writes; used by the tests here).
pub fn encode_list_record(name: &[u8], child: u64, buffer: &mut Vec<u8>) {
    let at = buffer.len();
    buffer.resize(at + LIST_RECORD_HEADER_BYTES + padded(name.len()), 0);
    put_u64(buffer, at, child);
    put_u32(buffer, at + 8, name.len() as u32);
    buffer[at + LIST_RECORD_HEADER_BYTES..at + LIST_RECORD_HEADER_BYTES + name.len()].copy_from_slice(name);
}

// ---------------------------------------------------------------- the kernel's side, in Rust
// What the kernel reads and writes, so the tests can check the host's bytes round trip
// through a model of the kernel without a GPU.

pub fn decode_lookup_requests(buffer: &[u8], count: usize) -> Vec<(u64, Vec<u8>)> {
    (0..count)
        .map(|index| {
            let record = index * LOOKUP_RECORD_BYTES;
            let offset = get_u32(buffer, record + 8) as usize;
            let length = get_u32(buffer, record + 12) as usize;
            assert!(offset.is_multiple_of(8));
            (get_u64(buffer, record), buffer[offset..offset + length].to_vec())
        })
        .collect()
}

pub fn decode_resolve_requests(buffer: &[u8], count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|index| {
            let offset = get_u32(buffer, index * RESOLVE_RECORD_BYTES) as usize;
            let length = get_u32(buffer, index * RESOLVE_RECORD_BYTES + 4) as usize;
            assert!(offset.is_multiple_of(8));
            buffer[offset..offset + length].to_vec()
        })
        .collect()
}

pub fn decode_update_requests(buffer: &[u8], count: usize) -> Result<Vec<IndexUpdate>> {
    (0..count)
        .map(|index| {
            let record = index * APPLY_RECORD_BYTES;
            let (code, length) = (get_u32(buffer, record), get_u32(buffer, record + 4) as usize);
            let (key, value) = (get_u64(buffer, record + 8), get_u64(buffer, record + 16));
            let offset = get_u64(buffer, record + 24) as usize;
            let name = || buffer[offset..offset + length].to_vec();
            Ok(match code {
                UPDATE_INSERT => IndexUpdate::InsertEntry { parent: key, name: name(), child: value },
                UPDATE_REMOVE => IndexUpdate::RemoveEntry { parent: key, name: name() },
                UPDATE_SET_ATTRIBUTES => IndexUpdate::SetAttributes(get_attributes(buffer, offset)?),
                UPDATE_REMOVE_INODE => IndexUpdate::RemoveInode(key),
                UPDATE_MARK_COMPLETE => IndexUpdate::MarkComplete(key),
                UPDATE_MARK_INCOMPLETE => IndexUpdate::MarkIncomplete(key),
                other => return Err(bad(format!("update code {other}"))),
            })
        })
        .collect()
}

fn put_answer(buffer: &mut [u8], index: usize, status: u32, attributes: Option<&IndexAttributes>) {
    let at = index * ANSWER_BYTES;
    put_u32(buffer, at, status);
    put_u32(buffer, at + 4, 0);
    match attributes {
        Some(attributes) => put_attributes(buffer, at + 8, attributes),
        None => buffer[at + 8..at + ANSWER_BYTES].fill(0),
    }
}

pub fn encode_lookup_answers(results: &[LookupResult], buffer: &mut [u8]) {
    for (index, result) in results.iter().enumerate() {
        match result {
            LookupResult::Found(attributes) => put_answer(buffer, index, STATUS_FOUND, Some(attributes)),
            LookupResult::NotFound => put_answer(buffer, index, STATUS_NOT_FOUND, None),
            LookupResult::Unknown => put_answer(buffer, index, STATUS_UNKNOWN, None),
            LookupResult::NotDirectory => put_answer(buffer, index, STATUS_NOT_DIRECTORY, None),
        }
    }
}

pub fn encode_resolve_answers(results: &[ResolveResult], buffer: &mut [u8]) {
    for (index, result) in results.iter().enumerate() {
        match result {
            ResolveResult::Found(attributes) => put_answer(buffer, index, STATUS_FOUND, Some(attributes)),
            ResolveResult::NotFound => put_answer(buffer, index, STATUS_NOT_FOUND, None),
            ResolveResult::NotDirectory => put_answer(buffer, index, STATUS_NOT_DIRECTORY, None),
            ResolveResult::PermissionDenied => put_answer(buffer, index, STATUS_PERMISSION_DENIED, None),
            ResolveResult::NameTooLong => put_answer(buffer, index, STATUS_NAME_TOO_LONG, None),
            ResolveResult::NeedsCpu => put_answer(buffer, index, STATUS_NEEDS_CPU, None),
        }
    }
}

/// Adds two apply reports (one per command of a batch).
pub fn add_reports(total: &mut ApplyReport, applied: usize, overflowed: u64) {
    total.applied += applied;
    total.overflowed += overflowed as usize;
}

/// The list answer of a command: Listed when the kernel says the directory is complete.
pub fn list_result(complete: bool, entries: Vec<(Vec<u8>, u64)>) -> ListResult {
    if complete {
        ListResult::Listed(entries)
    } else {
        ListResult::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A create command never holds two requests of one key, a request and the parent it
    /// creates, or one new inode twice; the cuts keep the order and cover the batch.
    #[test]
    fn create_segments_cut_before_every_dependency() {
        let file = |inode: u64| IndexAttributes::new(inode, IndexKind::File, 0o644);
        let directory = |inode: u64| IndexAttributes::new(inode, IndexKind::Directory, 0o755);
        let requests = [
            CreateEntry { parent: 2, name: b"a", attributes: file(10) },
            CreateEntry { parent: 2, name: b"b", attributes: directory(11) },
            CreateEntry { parent: 3, name: b"a", attributes: file(12) },
            CreateEntry { parent: 2, name: b"a", attributes: file(13) },
            CreateEntry { parent: 11, name: b"c", attributes: file(14) },
            CreateEntry { parent: 14, name: b"d", attributes: file(15) },
            CreateEntry { parent: 15, name: b"e", attributes: file(16) },
        ];
        assert_eq!(create_segments(&requests, 1 << 20), [(0, 3), (3, 5), (5, 6), (6, 7)]);
        let mut buffer = vec![0u8; 4096];
        let layout = encode_creates(&requests[..2], &mut buffer);
        assert_eq!(layout.request_bytes, 2 * (CREATE_RECORD_BYTES + 8 + ATTRIBUTES_BYTES));
        assert_eq!(
            get_u64(&buffer, CREATE_RECORD_BYTES + 16) as usize,
            2 * CREATE_RECORD_BYTES + 8 + ATTRIBUTES_BYTES + 8
        );
        // Small buffers cut by size as well, and every cut fits.
        let many: Vec<CreateEntry<'_>> =
            (0..100).map(|i| CreateEntry { parent: 2, name: b"same-length", attributes: file(100 + i) }).collect();
        let names: Vec<Vec<u8>> = (0..100).map(|i| format!("n{i:03}").into_bytes()).collect();
        let many: Vec<CreateEntry<'_>> =
            many.iter().zip(&names).map(|(request, name)| CreateEntry { name, ..*request }).collect();
        let cuts = create_segments(&many, 2048);
        assert!(cuts.len() > 1 && cuts.windows(2).all(|pair| pair[0].1 == pair[1].0) && cuts.last().unwrap().1 == 100);
        for (start, end) in cuts {
            assert!(
                Layout::new(create_sizes(&many[start..end]).map(|(r, _)| r).sum(), (end - start) * CREATE_ANSWER_BYTES)
                    .total_bytes()
                    <= 2048
            );
        }
        let mut answers = vec![0u8; 2 * CREATE_ANSWER_BYTES];
        answers[..4].copy_from_slice(&STATUS_EXISTS.to_le_bytes());
        answers[8..16].copy_from_slice(&12u64.to_le_bytes());
        answers[16..20].copy_from_slice(&STATUS_CREATED.to_le_bytes());
        let decoded = decoded(2, |out| decode_creates_into(&answers, out)).unwrap();
        assert_eq!(decoded, [CreateResult::Exists(12), CreateResult::Created]);
        answers[16..20].copy_from_slice(&STATUS_NEEDS_CPU.to_le_bytes());
        assert!(decoded_creates_fail(&answers));
    }

    fn decoded_creates_fail(answers: &[u8]) -> bool {
        decoded::<CreateResult>(2, |out| decode_creates_into(answers, out)).is_err()
    }
    use crate::dirindex::{CpuDirectoryIndex, Credentials, DirectoryIndex};

    fn attributes(inode: u64) -> IndexAttributes {
        IndexAttributes {
            inode,
            generation: 7,
            size_bytes: u64::MAX - 3,
            blocks_512: 9,
            atime_ns: -5,
            mtime_ns: i64::MAX,
            ctime_ns: i64::MIN,
            btime_ns: 1,
            rdev: 0x0102_0304,
            parent: 2,
            kind: IndexKind::Symlink,
            permissions: 0o4755,
            uid: 1,
            gid: u32::MAX,
            link_count: 3,
            reserved: 0,
        }
    }

    #[test]
    fn attributes_round_trip_in_the_kernel_layout() {
        let mut buffer = vec![0u8; ATTRIBUTES_BYTES + 8];
        put_attributes(&mut buffer, 8, &attributes(42));
        assert_eq!(get_attributes(&buffer, 8).unwrap(), attributes(42));
        // The layout is the in-memory one of the #[repr(C)] struct (the kernel's view).
        let record = attributes(42);
        // SAFETY: IndexAttributes is repr(C), 104 bytes, no padding (asserted in mod.rs).
        let raw =
            unsafe { std::slice::from_raw_parts(&record as *const IndexAttributes as *const u8, ATTRIBUTES_BYTES) };
        assert_eq!(&buffer[8..], raw);
        buffer[8 + 80] = 9;
        assert!(get_attributes(&buffer, 8).is_err(), "bad kind");
        buffer[8 + 80] = 1;
        buffer[8 + 100] = 1;
        assert!(get_attributes(&buffer, 8).is_err(), "reserved not zero");
    }

    #[test]
    fn requests_round_trip_and_names_are_aligned() {
        let names: Vec<Vec<u8>> =
            (0..=MAXIMUM_NAME_BYTES).step_by(7).map(|n| vec![b'a' + (n % 26) as u8; n.max(1)]).collect();
        let requests: Vec<(u64, &[u8])> = names.iter().enumerate().map(|(i, n)| (i as u64 + 1, &n[..])).collect();
        let mut buffer = vec![0xEEu8; 1 << 16];
        let layout = encode_lookups(&requests, &mut buffer);
        assert!(layout.answers_offset >= layout.request_bytes && layout.answers_offset.is_multiple_of(128));
        let decoded = decode_lookup_requests(&buffer, requests.len());
        for ((parent, name), (decoded_parent, decoded_name)) in requests.iter().zip(&decoded) {
            assert_eq!((*parent, name.to_vec()), (*decoded_parent, decoded_name.clone()));
        }
        // Padding is zero: the kernel compares whole words.
        let offset = get_u32(&buffer, 12 + 8) as usize;
        let length = get_u32(&buffer, 12 + 12) as usize;
        assert!(buffer[offset + length..offset + padded(length)].iter().all(|&b| b == 0));
        let paths: Vec<&[u8]> = vec![b"/", b"a/b/c", b"", b"//x//"];
        let layout = encode_resolves(&paths, &mut buffer);
        assert_eq!(layout.answers_bytes, 4 * ANSWER_BYTES);
        assert_eq!(decode_resolve_requests(&buffer, 4), paths.iter().map(|p| p.to_vec()).collect::<Vec<_>>());
    }

    #[test]
    fn updates_round_trip() {
        let updates = vec![
            IndexUpdate::InsertEntry { parent: 3, name: b"hello".to_vec(), child: 9 },
            IndexUpdate::SetAttributes(attributes(9)),
            IndexUpdate::RemoveEntry { parent: 3, name: vec![b'z'; 255] },
            IndexUpdate::RemoveInode(4),
            IndexUpdate::MarkComplete(3),
            IndexUpdate::MarkIncomplete(5),
        ];
        let mut buffer = vec![0u8; 4096];
        let layout = encode_updates(&updates, &mut buffer);
        assert_eq!(layout.request_bytes, apply_sizes(&updates).map(|(r, _)| r).sum::<usize>());
        assert_eq!(decode_update_requests(&buffer, updates.len()).unwrap(), updates);
    }

    #[test]
    fn segments_keep_order_and_split_on_conflicts_drops_and_size() {
        let insert = |parent: u64, name: &str| IndexUpdate::InsertEntry { parent, name: name.into(), child: 5 };
        let updates = vec![
            insert(1, "a"),
            insert(1, "b"),
            IndexUpdate::MarkComplete(1),
            insert(2, "a"),
            IndexUpdate::RemoveEntry { parent: 1, name: b"a".to_vec() },
            IndexUpdate::SetAttributes(attributes(1)),
            IndexUpdate::MarkComplete(1),
            IndexUpdate::DropDirectory(2),
            IndexUpdate::DropDirectory(2),
            insert(2, "a"),
        ];
        assert_eq!(
            segments(&updates, 1 << 20),
            vec![
                Segment::Updates { start: 0, end: 4 },
                Segment::Updates { start: 4, end: 6 },
                Segment::Updates { start: 6, end: 7 },
                Segment::Drop(2),
                Segment::Drop(2),
                Segment::Updates { start: 9, end: 10 },
            ]
        );
        let many: Vec<IndexUpdate> = (0..100).map(|i| insert(1, &format!("n{i}"))).collect();
        let small = segments(&many, 1024);
        assert!(small.len() > 3);
        let mut next = 0;
        for segment in small {
            let Segment::Updates { start, end } = segment else { panic!() };
            assert_eq!(start, next);
            let mut buffer = vec![0u8; 1 << 16];
            assert!(encode_updates(&many[start..end], &mut buffer).total_bytes() <= 1024);
            next = end;
        }
        assert_eq!(next, 100);
    }

    #[test]
    fn chunk_bounds_cover_the_batch_fit_the_buffers_and_balance_the_workers() {
        let check = |count: usize, size: (usize, usize), capacity: usize, workers: usize, minimum: usize| {
            let bounds = chunk_bounds(count, |_| size, capacity, workers, minimum);
            let mut next = 0;
            for &(start, end) in &bounds {
                assert!(start == next && end > start, "{bounds:?}");
                assert!(Layout::new((end - start) * size.0, (end - start) * size.1).total_bytes() <= capacity);
                next = end;
            }
            assert_eq!(next, count);
            bounds
        };
        assert!(check(0, (24, 112), 1 << 20, 8, 4096).is_empty());
        assert_eq!(check(5000, (24, 112), 8 << 20, 8, 4096).len(), 1, "short batch: one chunk");
        // 1M resolves of 24 request bytes in 8 MiB buffers: a multiple of 8 chunks, equal sizes.
        let bounds = check(1_000_000, (24, 112), 8 << 20, 8, 4096);
        assert!(bounds.len() >= 8 && bounds.len().is_multiple_of(8), "{}", bounds.len());
        let sizes: Vec<usize> = bounds.iter().map(|(start, end)| end - start).collect();
        assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= sizes[0] / 100, "{sizes:?}");
        // Capacity bounds a chunk even when the workers would want fewer, larger ones.
        assert!(check(100_000, (1000, 112), 1 << 20, 2, 16).len() >= 100_000 * 1112 / (1 << 20));
        // Items of different sizes still fit.
        let bounds = chunk_bounds(10_000, |i| (8 + 8 * (i % 500), 112), 1 << 20, 4, 100);
        let mut next = 0;
        for &(start, end) in &bounds {
            let requests: usize = (start..end).map(|i| 8 + 8 * (i % 500)).sum();
            assert!(start == next && Layout::new(requests, (end - start) * 112).total_bytes() <= 1 << 20);
            next = end;
        }
        assert_eq!(next, 10_000);
    }

    #[test]
    fn chunks_fill_their_place_in_the_answers_or_nothing() {
        let cutter = || ChunkCutter::new(100_000, |_| (8, ANSWER_BYTES), 1 << 20, 4, 1000);
        assert!(cutter().aimed() >= 4);
        let mut out = vec![7u64; 3];
        let setups = std::sync::atomic::AtomicUsize::new(0);
        let setup = || {
            setups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        };
        let square = |start: usize, _end: usize, piece: &mut [MaybeUninit<u64>]| {
            for (offset, slot) in piece.iter_mut().enumerate() {
                slot.write(((start + offset) as u64).pow(2));
            }
            Ok(())
        };
        fill_in_chunks(cutter(), 4, &mut out, setup, square).unwrap();
        assert!(out.iter().enumerate().all(|(index, &value)| value == (index as u64).pow(2)));
        assert_eq!(setups.load(std::sync::atomic::Ordering::Relaxed), 4, "one setup per worker");
        // One failing chunk fails the whole batch and leaves nothing behind.
        let failing = |start: usize, end: usize, piece: &mut [MaybeUninit<u64>]| match start {
            0 => Err(bad("refused".into())),
            _ => square(start, end, piece),
        };
        assert!(fill_in_chunks(cutter(), 4, &mut out, || Ok(()), failing).is_err());
        assert!(out.is_empty());
        // One chunk runs on the calling thread; none for an empty batch.
        let short = ChunkCutter::new(5, |_| (8, ANSWER_BYTES), 1 << 20, 4, 4096);
        assert_eq!(short.aimed(), 1);
        let caller = std::thread::current().id();
        let on_the_caller = |start: usize, end: usize, piece: &mut [MaybeUninit<u64>]| {
            assert_eq!(std::thread::current().id(), caller);
            square(start, end, piece)
        };
        fill_in_chunks(short, 4, &mut out, || Ok(()), on_the_caller).unwrap();
        assert_eq!(out, vec![0, 1, 4, 9, 16]);
        fill_in_chunks(ChunkCutter::new(0, |_| (8, ANSWER_BYTES), 1 << 20, 4, 1), 4, &mut out, || Ok(()), square)
            .unwrap();
        assert!(out.is_empty());
        // A batch whose size the sample underestimates (every sampled request is small, the
        // others large) is still cut into chunks that fit, covering it.
        let skewed = |index: usize| (if index.is_multiple_of(24) { 8 } else { 4096 }, ANSWER_BYTES);
        let bounds = chunk_bounds(100_000, skewed, 8 << 20, 8, 1000);
        let mut next = 0;
        for &(start, end) in &bounds {
            let bytes: usize = (start..end).map(|index| skewed(index).0 + ANSWER_BYTES).sum();
            assert!(start == next && end > start && bytes + ANSWERS_ALIGNMENT_BYTES <= 8 << 20);
            next = end;
        }
        assert_eq!(next, 100_000);
        fill_in_chunks(ChunkCutter::new(100_000, skewed, 8 << 20, 8, 1000), 8, &mut out, || Ok(()), square).unwrap();
        assert!(out.iter().enumerate().all(|(index, &value)| value == (index as u64).pow(2)));
    }

    #[test]
    fn items_that_fit_respects_the_capacity() {
        let sizes = vec![(100usize, 112usize); 50];
        let count = items_that_fit(sizes.iter().copied(), 4096);
        assert!(Layout::new(count * 100, count * 112).total_bytes() <= 4096);
        assert!(Layout::new((count + 1) * 100, (count + 1) * 112).total_bytes() > 4096);
    }

    /// The host's encoders and decoders around a model kernel (the twin) give the twin's answers.
    #[test]
    fn answers_round_trip_through_a_model_kernel() {
        let index = CpuDirectoryIndex::new(1, 1).unwrap();
        let mut root = IndexAttributes::new(1, IndexKind::Directory, 0o755);
        root.parent = 1;
        let updates = vec![
            IndexUpdate::SetAttributes(root),
            IndexUpdate::SetAttributes(attributes(3)),
            IndexUpdate::InsertEntry { parent: 1, name: b"x".to_vec(), child: 3 },
            IndexUpdate::MarkComplete(1),
        ];
        let mut buffer = vec![0u8; 1 << 16];
        encode_updates(&updates, &mut buffer);
        index.apply(&decode_update_requests(&buffer, updates.len()).unwrap()).unwrap();
        let requests: Vec<(u64, &[u8])> = vec![(1, b"x"), (1, b"y"), (3, b"z"), (8, b"q")];
        let layout = encode_lookups(&requests, &mut buffer);
        let decoded = decode_lookup_requests(&buffer, requests.len());
        let borrowed: Vec<(u64, &[u8])> = decoded.iter().map(|(p, n)| (*p, &n[..])).collect();
        let expected = index.lookup(&borrowed).unwrap();
        encode_lookup_answers(&expected, &mut buffer[layout.answers_offset..]);
        assert_eq!(decode_lookups(&buffer[layout.answers_offset..], requests.len()).unwrap(), expected);
        let paths: Vec<&[u8]> = vec![b"/x", b"/y", b"/x/", b"/q/r"];
        let layout = encode_resolves(&paths, &mut buffer);
        let expected = index.resolve(&paths, Credentials::ROOT).unwrap();
        encode_resolve_answers(&expected, &mut buffer[layout.answers_offset..]);
        assert_eq!(decode_resolves(&buffer[layout.answers_offset..], paths.len()).unwrap(), expected);
        // A status no kernel writes is refused.
        put_u32(&mut buffer, layout.answers_offset, 99);
        assert!(decode_resolves(&buffer[layout.answers_offset..], 1).is_err());
    }

    #[test]
    fn stats_and_lists_are_checked() {
        let mut buffer = vec![0u8; 2 * ANSWER_BYTES];
        put_answer(&mut buffer, 0, STATUS_FOUND, Some(&attributes(5)));
        put_answer(&mut buffer, 1, STATUS_UNKNOWN, None);
        assert_eq!(
            decode_stats(&buffer, &[5, 6]).unwrap(),
            vec![StatResult::Found(attributes(5)), StatResult::Unknown]
        );
        assert!(decode_stats(&buffer, &[4, 6]).is_err(), "wrong inode");
        let mut records = Vec::new();
        encode_list_record(b"zeta", 4, &mut records);
        encode_list_record(&[b'q'; 255], 9, &mut records);
        encode_list_record(b"alpha", 3, &mut records);
        let total = records.len();
        let listed = decode_list(&records, total).unwrap();
        assert_eq!(listed, vec![(b"alpha".to_vec(), 3), (vec![b'q'; 255], 9), (b"zeta".to_vec(), 4)]);
        assert!(decode_list(&records, total - 8).is_err(), "cut record");
        assert!(decode_list(&records, total + 8).is_err(), "past the buffer");
        records[8] = 0;
        assert!(decode_list(&records, total).is_err(), "empty name");
    }
}
