//! `extent`: the FlexTree extent map of each file (FlexFile: Chen, Zhong, Wu; Planinsek 2021),
//! with byte-granular insert and collapse.
//!
//! A file's bytes are a sequence of extents (written data, unwritten reservations, holes) kept in
//! a B+-tree whose entries store lengths instead of absolute offsets: a leaf entry's logical
//! start is the sum of the lengths before it, and an internal entry stores the length of its
//! child's subtree. Inserting or removing bytes therefore changes one leaf and one length per
//! level on the way up, O(log n) nodes, while every later offset shifts for free. See
//! `docs/EXTENTS.md` for the format and the rules.

mod format;
mod tree;

#[cfg(test)]
mod tests;

pub use format::{
    ExtentRoot, ENTRY_BYTES, EXTENT_ROOT_BYTES, MAX_DEPTH, MAX_FILE_BYTES, NODE_CAPACITY, NODE_HEADER_BYTES,
    NODE_MIN_ENTRIES, ROOT_CAPACITY,
};
pub use tree::{COPY_SLACK_DIVISOR, PACK_MAX_BYTES};

use std::collections::HashSet;

use crate::block::meta::{BlockKind, DataStore, MetaStore};
use crate::error::{Error, Result};
use format::{decode_node, Entry, MAX_BLOCK_NUMBER};
use tree::Tree;

/// What the extent code needs from the block layer: tree nodes and file data.
pub trait Store: MetaStore + DataStore {}
impl<T: MetaStore + DataStore + ?Sized> Store for T {}

/// Runs `operation` on a private copy of the tree; the root changes only if it succeeds.
fn change<T>(
    store: &mut dyn Store,
    root: &mut ExtentRoot,
    operation: impl FnOnce(&mut Tree) -> Result<T>,
) -> Result<T> {
    change_in_file(store, root, None, operation)
}

/// As `change`, packing small runs written inside the file into the pack block of `file` (a
/// key the store keeps its pack room under: the inode number) when one is given.
fn change_in_file<T>(
    store: &mut dyn Store,
    root: &mut ExtentRoot,
    file: Option<u64>,
    operation: impl FnOnce(&mut Tree) -> Result<T>,
) -> Result<T> {
    let mut tree = Tree::open(store, root);
    tree.pack_file = file;
    match operation(&mut tree) {
        Ok(value) => {
            *root = tree.commit()?;
            Ok(value)
        }
        Err(error) => {
            tree.abort();
            Err(error)
        }
    }
}

/// One change of a file that a `FileRun` can apply: the data records the back end applies
/// most (a write, an insert and a collapse of a range, a punch).
#[derive(Debug, Clone, Copy)]
pub enum FileChange<'a> {
    /// As `write_in_file`.
    Write { offset: u64, data: &'a [u8] },
    /// As `insert_range`.
    Insert { offset: u64, length_bytes: u64 },
    /// As `insert_data`.
    InsertData { offset: u64, data: &'a [u8] },
    /// As `collapse_range`.
    Collapse { offset: u64, length_bytes: u64 },
    /// As `punch_hole`.
    PunchHole { offset: u64, length_bytes: u64 },
}

/// Changes of one file applied one after the other on one open tree, committed once (issue 12:
/// opening, loading and committing a tree per record was about a third of a collapse's CPU
/// time, most of it encoding the changed nodes into block images). Each change is applied
/// exactly as `write_in_file`, `insert_range`, `collapse_range` or `punch_hole` would apply it
/// after the ones before had committed, with two differences that change no byte and no count:
/// the nodes, counts and pack room the changes leave are written to the store once, at
/// `commit`, and the blocks they release are freed then (a freed block is handed out again only
/// after a checkpoint covers its free, so no change of the run could have had it anyway).
///
/// All or nothing, for the run: an error in one change leaves the run `spoiled`; `abort` then
/// gives back what the run allocated and the stored tree is as before its first change.
/// Nothing else may read or change this file's tree, its shared blocks' counts or its pack room
/// on the store between `open` and `commit`: the back end ends a run before any other record
/// and before it lets go of the volume (`backend::Applier::apply_in_run`).
pub struct FileRun {
    state: Option<tree::Suspended>,
    changes: usize,
    spoiled: bool,
}

impl FileRun {
    /// A run on the tree `root` of file `file` (the key of its pack room, as in
    /// `write_in_file`).
    pub fn open(root: &ExtentRoot, file: u64) -> FileRun {
        FileRun { state: Some(tree::Suspended::new(root, Some(file))), changes: 0, spoiled: false }
    }

    /// Changes applied so far.
    pub fn changes(&self) -> usize {
        self.changes
    }

    /// Tree nodes the run holds in memory (read or changed).
    pub fn node_count(&self) -> usize {
        self.state.as_ref().map_or(0, |state| state.node_count())
    }

    /// Applies `change` after the run's earlier ones. On an error the run is spoiled: only
    /// `abort` remains.
    pub fn apply(&mut self, store: &mut dyn Store, change: FileChange<'_>) -> Result<()> {
        assert!(!self.spoiled, "a change applied to a spoiled run");
        let mut tree = Tree::resume(store, self.state.take().expect("a run holds its tree until it ends"));
        let result = match change {
            FileChange::Write { offset, data } => write_in(&mut tree, offset, data),
            FileChange::Insert { offset, length_bytes } => insert_range_in(&mut tree, offset, length_bytes),
            FileChange::InsertData { offset, data } => insert_data_in(&mut tree, offset, data),
            FileChange::Collapse { offset, length_bytes } => collapse_range_in(&mut tree, offset, length_bytes),
            FileChange::PunchHole { offset, length_bytes } => punch_hole_in(&mut tree, offset, length_bytes),
        };
        self.state = Some(tree.suspend());
        self.spoiled = result.is_err();
        self.changes += 1;
        result
    }

    /// Writes every node the run changed once, records the counts and the pack room, frees
    /// what the run released, and returns the new root.
    pub fn commit(mut self, store: &mut dyn Store) -> Result<ExtentRoot> {
        assert!(!self.spoiled, "a spoiled run is aborted, never committed");
        Tree::resume(store, self.state.take().expect("a run holds its tree until it ends")).commit()
    }

    /// Gives back what the run allocated; the stored tree was never touched.
    pub fn abort(mut self, store: &mut dyn Store) {
        if let Some(state) = self.state.take() {
            Tree::resume(store, state).abort();
        }
    }
}

fn end_of(offset: u64, length_bytes: u64) -> Result<u64> {
    offset.checked_add(length_bytes).filter(|end| *end <= MAX_FILE_BYTES).ok_or(Error::FileTooLarge)
}

/// Reads up to `buffer.len()` bytes at `offset`; returns the bytes read, short at the end of the
/// file. Holes and unwritten extents read as zeros.
pub fn read(store: &mut dyn Store, root: &ExtentRoot, offset: u64, buffer: &mut [u8]) -> Result<usize> {
    let length = root.length_bytes();
    if offset >= length || buffer.is_empty() {
        return Ok(0);
    }
    let count = (buffer.len() as u64).min(length - offset) as usize;
    let mut tree = Tree::open(store, root);
    tree.read(offset, &mut buffer[..count])?;
    Ok(count)
}

/// Writes `data` at `offset`, growing the file (past the old end leaves a hole). Bytes already
/// backed by written blocks are overwritten in place.
pub fn write(store: &mut dyn Store, root: &mut ExtentRoot, offset: u64, data: &[u8]) -> Result<()> {
    end_of(offset, data.len() as u64)?;
    if data.is_empty() {
        return Ok(());
    }
    change(store, root, |tree| tree.write(offset, data))
}

/// As `write`, packing runs shorter than `PACK_MAX_BYTES` that fill a hole inside the file into
/// shared blocks of `file` (docs/EXTENTS.md, *Packing*): an insert of 100 bytes then holds 100
/// bytes of a block, not a block.
pub fn write_in_file(store: &mut dyn Store, root: &mut ExtentRoot, file: u64, offset: u64, data: &[u8]) -> Result<()> {
    change_in_file(store, root, Some(file), |tree| write_in(tree, offset, data))
}

fn write_in(tree: &mut Tree, offset: u64, data: &[u8]) -> Result<()> {
    end_of(offset, data.len() as u64)?;
    if data.is_empty() {
        return Ok(());
    }
    tree.write(offset, data)
}

/// Sets the length: shrinking frees what lies past the new end, growing adds a hole.
pub fn truncate(store: &mut dyn Store, root: &mut ExtentRoot, length_bytes: u64) -> Result<()> {
    if length_bytes > MAX_FILE_BYTES {
        return Err(Error::FileTooLarge);
    }
    change(store, root, |tree| {
        let length = tree.length();
        if length_bytes < length {
            tree.remove_range(length_bytes, length)
        } else {
            tree.grow(length_bytes)
        }
    })
}

/// Inserts `length_bytes` of hole at `offset` (at most the file length), shifting later bytes up.
pub fn insert_range(store: &mut dyn Store, root: &mut ExtentRoot, offset: u64, length_bytes: u64) -> Result<()> {
    change(store, root, |tree| insert_range_in(tree, offset, length_bytes))
}

fn insert_range_in(tree: &mut Tree, offset: u64, length_bytes: u64) -> Result<()> {
    if offset > tree.length() {
        return Err(Error::invalid(format!("insert at {offset} past the end {}", tree.length())));
    }
    end_of(tree.length(), length_bytes)?;
    if length_bytes == 0 {
        return Ok(());
    }
    tree.insert_hole(offset, length_bytes)
}

/// Puts `data` in at `offset` (at most the file length), shifting later bytes up: the file
/// `insert_range` and then `write_in_file` of the bytes into the hole leave (the same bytes,
/// blocks and counts), in one change that finds the place once instead of twice
/// (`Tree::insert_data`). `file` keys the pack block, as in `write_in_file`.
pub fn insert_data(store: &mut dyn Store, root: &mut ExtentRoot, file: u64, offset: u64, data: &[u8]) -> Result<()> {
    change_in_file(store, root, Some(file), |tree| insert_data_in(tree, offset, data))
}

fn insert_data_in(tree: &mut Tree, offset: u64, data: &[u8]) -> Result<()> {
    if offset > tree.length() {
        return Err(Error::invalid(format!("insert at {offset} past the end {}", tree.length())));
    }
    end_of(tree.length(), data.len() as u64)?;
    if data.is_empty() {
        return Ok(());
    }
    tree.insert_data(offset, data)
}

/// Removes bytes `offset..offset + length_bytes` (inside the file), shifting later bytes down
/// and freeing the blocks that held them.
pub fn collapse_range(store: &mut dyn Store, root: &mut ExtentRoot, offset: u64, length_bytes: u64) -> Result<()> {
    change(store, root, |tree| collapse_range_in(tree, offset, length_bytes))
}

fn collapse_range_in(tree: &mut Tree, offset: u64, length_bytes: u64) -> Result<()> {
    let end = offset.checked_add(length_bytes).filter(|end| *end <= tree.length());
    let end =
        end.ok_or_else(|| Error::invalid(format!("collapse of {length_bytes} bytes at {offset} past the end")))?;
    if length_bytes == 0 {
        return Ok(());
    }
    tree.remove_range(offset, end)
}

/// Makes `offset..offset + length_bytes` (clipped to the file) read as zeros, keeping the length:
/// the whole blocks inside become a hole and are freed; bytes that share a block with bytes
/// outside the range are zeroed in place (no block is copied or allocated).
pub fn punch_hole(store: &mut dyn Store, root: &mut ExtentRoot, offset: u64, length_bytes: u64) -> Result<()> {
    change(store, root, |tree| punch_hole_in(tree, offset, length_bytes))
}

fn punch_hole_in(tree: &mut Tree, offset: u64, length_bytes: u64) -> Result<()> {
    let end = offset.saturating_add(length_bytes).min(tree.length());
    if offset >= end {
        return Ok(());
    }
    tree.clear(offset, end, true)
}

/// Makes `offset..offset + length_bytes` read as zeros. Written blocks in the range are kept and
/// marked unwritten, holes get unwritten blocks; without `keep_size` the file grows to cover the
/// range.
pub fn zero_range(
    store: &mut dyn Store,
    root: &mut ExtentRoot,
    offset: u64,
    length_bytes: u64,
    keep_size: bool,
) -> Result<()> {
    let end = end_of(offset, length_bytes)?;
    if length_bytes == 0 {
        return Ok(());
    }
    change(store, root, |tree| {
        let inside_end = end.min(tree.length());
        if offset < inside_end {
            tree.clear(offset, inside_end, false)?;
        }
        if !keep_size && end > tree.length() {
            tree.grow(end)?;
        }
        let allocate_end = end.min(tree.length());
        tree.allocate(offset, allocate_end)
    })
}

/// Reserves blocks for the holes in `offset..offset + length_bytes` as unwritten extents (read as
/// zeros). Without `keep_size` the file grows to cover the range; with it the range is clipped to
/// the file (no blocks are kept past the end).
pub fn allocate(
    store: &mut dyn Store,
    root: &mut ExtentRoot,
    offset: u64,
    length_bytes: u64,
    keep_size: bool,
) -> Result<()> {
    let end = end_of(offset, length_bytes)?;
    if length_bytes == 0 {
        return Ok(());
    }
    change(store, root, |tree| {
        if !keep_size && end > tree.length() {
            tree.grow(end)?;
        }
        let allocate_end = end.min(tree.length());
        tree.allocate(offset, allocate_end)
    })
}

/// Maps `offset..offset + length_bytes` to written extents over `runs`: the blocks a direct
/// write filled before its record was logged, which the caller has taken from the allocator
/// (the record carries them). Whatever the range held goes, its blocks freed as a collapse
/// frees them; the file grows to cover the range. One operation: on an error the tree is as
/// it was.
pub fn map_written(
    store: &mut dyn Store,
    root: &mut ExtentRoot,
    offset: u64,
    length_bytes: u64,
    runs: &[(u64, u64)],
) -> Result<()> {
    let end = end_of(offset, length_bytes)?;
    if length_bytes == 0 {
        return Err(Error::corruption("direct write of no bytes"));
    }
    change(store, root, |tree| {
        if end > tree.length() {
            tree.grow(end)?;
        }
        // Out and a hole back in: trimming keeps the bytes either side in their own blocks
        // (`remove_range` copies only where it must, as a collapse does).
        tree.remove_range(offset, end)?;
        tree.insert_hole(offset, length_bytes)?;
        tree.map_hole(offset, end, runs)
    })
}

/// Longest run of extents that one compaction rewrites in one piece: its bytes are held in
/// memory while the run is rewritten.
pub const COMPACT_RUN_MAX_BYTES: u64 = 4 << 20;

/// The space a file holds against the bytes it maps (`space_use`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SpaceUse {
    /// Bytes of written and unwritten extents (holes map nothing).
    pub mapped_bytes: u64,
    /// Data blocks the extents own.
    pub data_blocks: u64,
    /// Extent tree blocks (`blocks_owned` less the data blocks).
    pub tree_blocks: u64,
    /// Extents, holes included.
    pub extents: u64,
}

impl SpaceUse {
    /// Bytes of blocks held, data and tree.
    pub fn held_bytes(&self) -> u64 {
        (self.data_blocks + self.tree_blocks) * crate::block::meta::BLOCK_SIZE_U64
    }

    /// Space amplification: bytes held over bytes mapped (1.0 for a file that maps nothing).
    pub fn amplification(&self) -> f64 {
        if self.mapped_bytes == 0 {
            return 1.0;
        }
        self.held_bytes() as f64 / self.mapped_bytes as f64
    }
}

/// Walks the file's extents and counts what it maps and what it holds.
pub fn space_use(store: &mut dyn Store, root: &ExtentRoot) -> Result<SpaceUse> {
    let mut space = SpaceUse::default();
    // Shared blocks are counted once: only an extent's first and last block can be shared.
    let mut ends = HashSet::new();
    extents(store, root, &mut |_, length, physical, _| {
        space.extents += 1;
        if let Some(address) = physical {
            space.mapped_bytes += length;
            let block = crate::block::meta::BLOCK_SIZE_U64;
            let (first, last) = (address / block, (address + length - 1) / block);
            space.data_blocks += (last - first).saturating_sub(1);
            ends.insert(first);
            ends.insert(last);
        }
        true
    })?;
    space.data_blocks += ends.len() as u64;
    space.tree_blocks = root.blocks_owned().checked_sub(space.data_blocks).ok_or_else(|| {
        Error::corruption(format!(
            "extent root field blocks_owned: {} stored, fewer than the {} data blocks its extents own",
            root.blocks_owned(),
            space.data_blocks
        ))
    })?;
    Ok(space)
}

/// Rewrites the fragmented written data of `offset..offset + length_bytes` (clipped to the
/// file) into whole new blocks, keeping every byte and the length; returns the data blocks
/// saved (at least: a run may also fill the free room of the extent before it). Only extents
/// that lie wholly inside the range are touched: consecutive extents with blocks (written or
/// unwritten) form runs of up to `COMPACT_RUN_MAX_BYTES`, and a run that holds more blocks than
/// its bytes need is read, removed (its blocks freed as a collapse frees them) and written
/// again into a hole of its length (new blocks, or the free room at the end of the extent
/// before it); a run of unwritten extents alone is given new unwritten blocks instead, and
/// nothing is written. In a mixed run the unwritten bytes become written zeros. Holes stay.
///
/// Replay gives the same bytes (docs/EXTENTS.md, *Compaction*): the only bytes read are those
/// of extents that the same operation removes whole, and their blocks are never written again
/// until a checkpoint covers the free. All or nothing, like every change.
pub fn compact(store: &mut dyn Store, root: &mut ExtentRoot, offset: u64, length_bytes: u64) -> Result<u64> {
    let end = offset.saturating_add(length_bytes).min(root.length_bytes());
    if offset >= end {
        return Ok(0);
    }
    change(store, root, |tree| {
        let runs = compaction_runs(tree, offset, end)?;
        let mut saved = 0;
        let mut buffer = Vec::new();
        for run in runs {
            let run_bytes = run.end - run.start;
            if run.unwritten_only {
                tree.remove_range(run.start, run.end)?;
                tree.insert_hole(run.start, run_bytes)?;
                tree.allocate(run.start, run.end)?;
            } else {
                buffer.resize(run_bytes as usize, 0);
                tree.read(run.start, &mut buffer)?;
                tree.remove_range(run.start, run.end)?;
                tree.insert_hole(run.start, run_bytes)?;
                tree.write(run.start, &buffer)?;
            }
            saved += run.held_blocks - run_bytes.div_ceil(crate::block::meta::BLOCK_SIZE_U64);
        }
        Ok(saved)
    })
}

/// A stretch of whole extents with blocks that compaction rewrites.
struct CompactionRun {
    start: u64,
    end: u64,
    held_blocks: u64,
    /// The first and last blocks of the run's extents, so that a shared one counts once.
    ends: HashSet<u64>,
    /// Every extent of the run is unwritten: it gets new unwritten blocks, nothing is written.
    unwritten_only: bool,
}

/// The runs of `start..end` worth rewriting: consecutive extents with blocks wholly inside the
/// range, cut at `COMPACT_RUN_MAX_BYTES`, that hold more blocks than their bytes need.
fn compaction_runs(tree: &mut Tree, start: u64, end: u64) -> Result<Vec<CompactionRun>> {
    let block = crate::block::meta::BLOCK_SIZE_U64;
    let mut runs = Vec::new();
    let mut current: Option<CompactionRun> = None;
    let close = |run: Option<CompactionRun>, runs: &mut Vec<CompactionRun>| {
        if let Some(run) = run {
            if run.held_blocks > (run.end - run.start).div_ceil(block) {
                runs.push(run);
            }
        }
    };
    tree.visit(start, &mut |logical, entry| {
        if logical >= end {
            return false;
        }
        let inside = logical >= start && logical + entry.length <= end;
        if !inside || entry.is_hole() || entry.length > COMPACT_RUN_MAX_BYTES {
            close(current.take(), &mut runs);
            return true;
        }
        let (first, count) = entry.blocks().expect("not a hole");
        let extends = matches!(current.as_ref(),
            Some(run) if run.end == logical && run.end - run.start + entry.length <= COMPACT_RUN_MAX_BYTES);
        if !extends {
            close(current.take(), &mut runs);
            current = Some(CompactionRun {
                start: logical,
                end: logical,
                held_blocks: 0,
                ends: HashSet::new(),
                unwritten_only: true,
            });
        }
        let run = current.as_mut().expect("a run is open");
        run.end += entry.length;
        run.unwritten_only &= entry.unwritten;
        run.held_blocks += count.saturating_sub(2);
        run.held_blocks += u64::from(run.ends.insert(first));
        if count > 1 {
            run.held_blocks += u64::from(run.ends.insert(first + count - 1));
        }
        true
    })?;
    close(current.take(), &mut runs);
    Ok(runs)
}

/// Frees every data and tree block of the file. A tree that fails `check` is left alone and
/// reported, since freeing blocks a corrupt tree names could free someone else's.
pub fn destroy(store: &mut dyn Store, root: ExtentRoot) -> Result<()> {
    let report = check(store, &root);
    if let Some(problem) = report.problems.first() {
        return Err(Error::corruption(format!("cannot free extent tree: {problem}")));
    }
    // A shared block (only the ends of extents, single runs here) is recorded unshared before
    // it is freed with the rest.
    for (first, count) in report.data_blocks {
        if store.shared_references(first)? != 0 {
            store.set_shared_references(first, 0)?;
        }
        store.forget_pack_room(first, count);
        store.free_data(first, count)?;
    }
    for block in report.tree_blocks {
        store.free_meta(block)?;
    }
    Ok(())
}

/// Calls `visit(logical, length, physical byte address or None for a hole, unwritten)` for each
/// extent in order, until it returns false.
pub fn extents(
    store: &mut dyn Store,
    root: &ExtentRoot,
    visit: &mut dyn FnMut(u64, u64, Option<u64>, bool) -> bool,
) -> Result<()> {
    extents_from(store, root, 0, visit)
}

/// As `extents`, starting at the extent that holds byte `offset` (its own start is reported):
/// SEEK_DATA, SEEK_HOLE and FIEMAP of a range cost one descent, not a walk from the start.
pub fn extents_from(
    store: &mut dyn Store,
    root: &ExtentRoot,
    offset: u64,
    visit: &mut dyn FnMut(u64, u64, Option<u64>, bool) -> bool,
) -> Result<()> {
    let mut tree = Tree::open(store, root);
    tree.visit(offset, &mut |logical, entry| {
        let physical = (!entry.is_hole()).then_some(entry.address);
        visit(logical, entry.length, physical, entry.unwritten)
    })
}

/// What `check` found: every block the file owns and every inconsistency.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExtentCheck {
    /// Data block runs referenced by extents, each block once: (first, count).
    pub data_blocks: Vec<(u64, u64)>,
    /// Data blocks that several extents reference: (block, references).
    pub shared_blocks: Vec<(u64, u64)>,
    /// Blocks whose recorded references differ from the extents found: (block, references
    /// found, references recorded). Each is in `problems` too; when they are all the problems,
    /// the tree is whole and recording the references found repairs it.
    pub share_mismatches: Vec<(u64, u64, u64)>,
    pub tree_blocks: Vec<u64>,
    pub problems: Vec<String>,
}

/// Walks the whole tree and validates it: node headers and entries, lengths against parents,
/// no block owned twice except the shared ends of extents, whose bytes must not overlap and
/// whose references must be what the store records, the root's block count. Never panics;
/// reports instead.
pub fn check(store: &mut dyn Store, root: &ExtentRoot) -> ExtentCheck {
    let mut report = ExtentCheck::default();
    let depth = root.depth();
    // (node block, level, expected length); the root's own entries are checked by `decode`.
    let mut pending: Vec<(u64, usize, u64)> = Vec::new();
    let mut leaf_entries: Vec<(String, Entry)> = Vec::new();
    if depth == 0 {
        for (index, entry) in root.root_entries().iter().enumerate() {
            leaf_entries.push((format!("extent root entry {index}"), *entry));
        }
    } else {
        for entry in root.root_entries().iter().rev() {
            pending.push((entry.address, depth - 1, entry.length));
        }
    }
    let mut visited = HashSet::new();
    // Each block is visited once (repeats are reported and skipped), so the walk is bounded by
    // the blocks the tree names; the level strictly falls, so a cycle cannot form.
    while let Some((block, level, expected_length)) = pending.pop() {
        if block == 0 || block >= MAX_BLOCK_NUMBER {
            report.problems.push(format!("extent tree names block {block}, out of range"));
            continue;
        }
        if !visited.insert(block) {
            report.problems.push(format!("extent node {block} is referenced from two places"));
            continue;
        }
        let kind = if level == 0 { BlockKind::ExtentLeaf } else { BlockKind::ExtentInternal };
        let entries =
            match store.read_meta(block, kind).and_then(|bytes| decode_node(&bytes[..], block, level, expected_length))
            {
                Ok(entries) => entries,
                Err(error) => {
                    report.problems.push(error.to_string());
                    continue;
                }
            };
        report.tree_blocks.push(block);
        if level == 0 {
            for (index, entry) in entries.into_iter().enumerate() {
                leaf_entries.push((format!("extent node {block} entry {index}"), entry));
            }
        } else {
            for entry in entries.iter().rev() {
                pending.push((entry.address, level - 1, entry.length));
            }
        }
    }
    // Every block between an extent's first and last block is the extent's alone; the first
    // and last may be shared with other extents, whose bytes in that block must not overlap,
    // and their number must be what the store counts (docs/EXTENTS.md, *Shared blocks*).
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut ends: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = std::collections::BTreeMap::new();
    for (_, entry) in &leaf_entries {
        let Some((first, count)) = entry.blocks() else { continue };
        let block = crate::block::meta::BLOCK_SIZE_U64;
        let last = first + count - 1;
        ends.entry(first).or_default().push((entry.address, (entry.address + entry.length).min((first + 1) * block)));
        if last > first {
            ends.entry(last).or_default().push((last * block, entry.address + entry.length));
        }
        if count > 2 {
            runs.push((first + 1, count - 2));
        }
    }
    for (block, pieces) in &mut ends {
        runs.push((*block, 1));
        pieces.sort_unstable();
        if pieces.windows(2).any(|pair| pair[0].1 > pair[1].0) {
            report.problems.push(format!("data block {block}: two extents map the same bytes"));
        }
        let references = pieces.len() as u64;
        match store.shared_references(*block) {
            // Fewer recorded than there are would free the block while extents still map it.
            Ok(recorded) if references > 1 && recorded < references => {
                report.problems.push(format!(
                    "data block {block}: {references} extents reference it, {recorded} references recorded"
                ));
                report.share_mismatches.push((*block, references, recorded));
            }
            // More recorded than there are: the block would never be freed.
            Ok(recorded) if recorded > references.max(1) => {
                report.problems.push(format!(
                    "data block {block}: {references} extents reference it, {recorded} references recorded (a leak)"
                ));
                report.share_mismatches.push((*block, references, recorded));
            }
            Ok(_) => {}
            Err(error) => report.problems.push(error.to_string()),
        }
        if references > 1 {
            report.shared_blocks.push((*block, references));
        }
    }
    runs.sort_unstable();
    report.data_blocks = runs.clone();
    // No block may belong to two extents (past the shared ends above), or to an extent and a node.
    runs.extend(report.tree_blocks.iter().map(|block| (*block, 1)));
    runs.sort_unstable();
    for pair in runs.windows(2) {
        if pair[0].0 + pair[0].1 > pair[1].0 {
            report.problems.push(format!(
                "blocks {}..{} and {}.. are owned twice",
                pair[0].0,
                pair[0].0 + pair[0].1,
                pair[1].0
            ));
        }
    }
    let owned = runs.iter().fold(0u64, |sum, run| sum.saturating_add(run.1));
    if report.problems.is_empty() && owned != root.blocks_owned() {
        report.problems.push(format!("extent root field blocks_owned: {} stored, {owned} found", root.blocks_owned()));
    }
    report
}
