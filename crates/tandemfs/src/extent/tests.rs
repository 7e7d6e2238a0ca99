//! Tests of the FlexTree against a plain `Vec<u8>` model, plus format, cost, space and
//! corruption tests. Every randomized test prints its seed so that a failure can be replayed.

use super::format::*;
use super::*;
use crate::block::meta::{seal_block, BlockKind, MemoryStore, SharedBlock, BLOCK_SIZE, BLOCK_SIZE_U64};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn extent_count(store: &mut dyn Store, root: &ExtentRoot) -> usize {
    let mut count = 0;
    extents(store, root, &mut |_, _, _, _| {
        count += 1;
        true
    })
    .unwrap();
    count
}

fn read_all(store: &mut dyn Store, root: &ExtentRoot) -> Vec<u8> {
    let mut bytes = vec![0u8; root.length_bytes() as usize];
    let count = read(store, root, 0, &mut bytes).unwrap();
    assert_eq!(count, bytes.len());
    bytes
}

/// Full consistency: the tree checks clean, the store holds exactly the blocks the tree
/// accounts for, and the contents equal the model.
fn verify(store: &mut MemoryStore, root: &ExtentRoot, model: &[u8], context: &str) {
    let report = check(store, root);
    assert!(report.problems.is_empty(), "{context}: check found {:?}", report.problems);
    assert_eq!(store.allocated_count() as u64, root.blocks_owned(), "{context}: store and tree disagree on blocks");
    let owned: u64 = report.data_blocks.iter().map(|run| run.1).sum::<u64>() + report.tree_blocks.len() as u64;
    assert_eq!(owned, root.blocks_owned(), "{context}: blocks_owned");
    assert_eq!(root.length_bytes(), model.len() as u64, "{context}: length");
    let contents = read_all(store, root);
    if let Some(first) = contents.iter().zip(model).position(|(a, b)| a != b) {
        panic!("{context}: contents differ first at byte {first}");
    }
    assert_eq!(ExtentRoot::decode(&root.encode()).unwrap(), *root, "{context}: root round trip");
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Typical operation size in bytes.
    small_bytes: u64,
    /// Largest operation size in bytes.
    large_bytes: u64,
    /// The model file is pushed back below this length.
    soft_limit_bytes: u64,
    /// Truncate only trims the tail (instead of cutting anywhere), so the file and its tree grow.
    grow: bool,
}

/// Applies one random operation to both the tree and the model; returns its name.
fn random_operation(
    random: &mut SmallRng,
    store: &mut dyn Store,
    root: &mut ExtentRoot,
    model: &mut Vec<u8>,
    shape: Shape,
    check_reads: bool,
) -> &'static str {
    let length = model.len() as u64;
    let size = |random: &mut SmallRng| -> u64 {
        match random.gen_range(0..10) {
            0 => random.gen_range(1..=shape.large_bytes),
            1 if !shape.grow => BLOCK_SIZE_U64 * random.gen_range(1..=4),
            _ => random.gen_range(1..=shape.small_bytes),
        }
    };
    let position = |random: &mut SmallRng, limit: u64| -> u64 {
        if random.gen_bool(0.2) {
            random.gen_range(0..=limit / BLOCK_SIZE_U64) * BLOCK_SIZE_U64
        } else {
            random.gen_range(0..=limit)
        }
    };
    let too_long = length > shape.soft_limit_bytes;
    let choice = if too_long { random.gen_range(0..3) * 3 } else { random.gen_range(0..12) };
    match choice {
        0 => {
            let offset = position(random, length);
            let count = size(random).min(length - offset);
            collapse_range(store, root, offset, count).unwrap();
            model.drain(offset as usize..(offset + count) as usize);
            "collapse_range"
        }
        1 | 2 => {
            let offset = position(random, length + shape.small_bytes);
            let count = size(random);
            let data: Vec<u8> = (0..count).map(|_| random.gen_range(1..=255)).collect();
            if random.gen_bool(0.5) {
                write(store, root, offset, &data).unwrap();
            } else {
                write_in_file(store, root, MODEL_FILE, offset, &data).unwrap();
            }
            let end = (offset + count) as usize;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[offset as usize..end].copy_from_slice(&data);
            "write"
        }
        3 => {
            let new_length = if too_long {
                random.gen_range(0..=length)
            } else if shape.grow {
                random.gen_range(length.saturating_sub(shape.small_bytes)..=length + shape.small_bytes)
            } else {
                random.gen_range(0..=length + shape.small_bytes)
            };
            truncate(store, root, new_length).unwrap();
            model.resize(new_length as usize, 0);
            "truncate"
        }
        4 => {
            let offset = position(random, length);
            let count = size(random);
            insert_range(store, root, offset, count).unwrap();
            model.splice(offset as usize..offset as usize, vec![0u8; count as usize]);
            "insert_range"
        }
        5 => {
            // An insert of bytes as the file system logs it: a hole, then a write into it.
            let offset = position(random, length);
            let count = size(random);
            let data: Vec<u8> = (0..count).map(|_| random.gen_range(1..=255)).collect();
            insert_range(store, root, offset, count).unwrap();
            // As the back end writes it: small runs pack into shared blocks.
            write_in_file(store, root, MODEL_FILE, offset, &data).unwrap();
            model.splice(offset as usize..offset as usize, data);
            "insert"
        }
        6 => {
            let offset = position(random, length + 100);
            let count = size(random);
            punch_hole(store, root, offset, count).unwrap();
            let end = (offset + count).min(length);
            if offset < end {
                model[offset as usize..end as usize].fill(0);
            }
            "punch_hole"
        }
        7 => {
            let offset = position(random, length + 100);
            let count = size(random);
            let keep_size = random.gen_bool(0.5);
            zero_range(store, root, offset, count, keep_size).unwrap();
            let end = offset + count;
            if !keep_size && end > length {
                model.resize(end as usize, 0);
            }
            let clipped = end.min(model.len() as u64);
            if offset < clipped {
                model[offset as usize..clipped as usize].fill(0);
            }
            "zero_range"
        }
        8 => {
            let offset = position(random, length + 100);
            let count = size(random);
            let keep_size = random.gen_bool(0.5);
            allocate(store, root, offset, count, keep_size).unwrap();
            if !keep_size && offset + count > length {
                model.resize((offset + count) as usize, 0);
            }
            "allocate"
        }
        11 if !shape.grow => {
            // Compaction of a random range, or of the whole file: every byte stays. (Not in
            // the growing shapes, whose tests want a large tree.)
            let (offset, count) =
                if random.gen_bool(0.3) { (0, length.max(1)) } else { (position(random, length), size(random)) };
            compact(store, root, offset, count).unwrap();
            "compact"
        }
        _ => {
            let offset = random.gen_range(0..=length + 10);
            let mut buffer = vec![0u8; size(random) as usize];
            let count = read(store, root, offset, &mut buffer).unwrap();
            let expected = model.len().saturating_sub(offset as usize).min(buffer.len());
            assert_eq!(count, expected);
            if count > 0 && check_reads {
                assert!(buffer[..count] == model[offset as usize..offset as usize + count], "read at {offset} differs");
            }
            "read"
        }
    }
}

fn run_model(seed: u64, operations: usize, check_every: usize, shape: Shape) -> (usize, usize) {
    println!("extent model test: seed {seed}");
    let mut random = SmallRng::seed_from_u64(seed);
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    let mut model = Vec::new();
    let mut most_extents = 0;
    let mut deepest = 0;
    for step in 0..operations {
        let name = random_operation(&mut random, &mut store, &mut root, &mut model, shape, true);
        if step % check_every == check_every - 1 || step + 1 == operations {
            verify(&mut store, &root, &model, &format!("seed {seed} step {step} after {name}"));
            most_extents = most_extents.max(extent_count(&mut store, &root));
            deepest = deepest.max(root.depth());
        }
    }
    destroy(&mut store, root).unwrap();
    assert_eq!(store.allocated_count(), 0, "seed {seed}: blocks left after destroy");
    (most_extents, deepest)
}

#[test]
fn on_disk_sizes() {
    assert_eq!(EXTENT_ROOT_BYTES, 64);
    assert_eq!(ROOT_SHAPE_OFFSET + 1, ROOT_BLOCKS_OFFSET);
    assert_eq!(ROOT_BLOCKS_OFFSET + ROOT_BLOCKS_BYTES, ROOT_ENTRIES_OFFSET);
    assert_eq!(ROOT_ENTRIES_OFFSET + ROOT_CAPACITY * ENTRY_BYTES, ROOT_LENGTH_OFFSET);
    assert_eq!(ROOT_LENGTH_OFFSET + 8, EXTENT_ROOT_BYTES);
    assert_eq!(ROOT_CAPACITY, 3);
    assert_eq!(NODE_HEADER_BYTES, NODE_LENGTH_OFFSET + 8);
    assert_eq!(ENTRY_BYTES, ENTRY_LENGTH_OFFSET + 8);
    assert_eq!(NODE_CAPACITY, 253);
    assert_eq!(ExtentRoot::empty().encode(), [0u8; EXTENT_ROOT_BYTES]);
    assert_eq!(ExtentRoot::decode(&[0u8; EXTENT_ROOT_BYTES]).unwrap(), ExtentRoot::empty());
}

#[test]
fn model_random_operations() {
    let shape = Shape { small_bytes: 3000, large_bytes: 70_000, soft_limit_bytes: 400_000, grow: false };
    for seed in [1u64, 2, 3, 4] {
        let (extents, depth) = run_model(seed, 40_000, 400, shape);
        println!("seed {seed}: at most {extents} extents, depth {depth}");
    }
}

/// Small operations on a file of a few hundred KiB: tens of thousands of extents, depth >= 2.
fn many_small_extents(seed: u64) {
    let shape = Shape { small_bytes: 24, large_bytes: 200, soft_limit_bytes: 600_000, grow: true };
    let (extents, depth) = run_model(seed, 150_000, 5000, shape);
    println!("seed {seed}: at most {extents} extents, depth {depth}");
    assert!(extents >= 20_000 && depth >= 2, "the test never built a large tree ({extents} extents)");
}

#[test]
fn model_many_small_extents_seed_11() {
    many_small_extents(11);
}

#[test]
fn model_many_small_extents_seed_12() {
    many_small_extents(12);
}

/// `encode_node` writes every byte of the block: the header's fields at their offsets, the
/// entries, and zeros after them to the end of the block (the trailer's bytes included, which
/// the store seals); the node decodes as encoded. Its buffer is not zeroed first, so a byte
/// it failed to write would hold whatever the allocator last left there: each block is
/// checked against the fields written one by one into a zeroed block, after blocks of ones
/// were made and dropped (the allocator hands their memory out again).
#[test]
fn encoded_nodes_write_every_block_byte() {
    for count in [0usize, 1, 2, 100, NODE_CAPACITY] {
        for level in [0usize, 1] {
            let stale: Vec<Box<[u8; BLOCK_SIZE]>> = (0..8).map(|_| Box::new([0xffu8; BLOCK_SIZE])).collect();
            drop(stale);
            let entries: Vec<Entry> = (0..count as u64)
                .map(|index| Entry::data((index + 1) * BLOCK_SIZE_U64, 100 + index, level == 0 && index % 3 == 0))
                .collect();
            let (block, length) = encode_node(level, &entries);
            assert_eq!(Some(length), sum_lengths(&entries));
            let mut expected = vec![0u8; BLOCK_SIZE];
            expected[NODE_COUNT_OFFSET..NODE_COUNT_OFFSET + 2].copy_from_slice(&(count as u16).to_le_bytes());
            expected[NODE_LEVEL_OFFSET..NODE_LEVEL_OFFSET + 2].copy_from_slice(&(level as u16).to_le_bytes());
            expected[NODE_LENGTH_OFFSET..NODE_LENGTH_OFFSET + 8].copy_from_slice(&length.to_le_bytes());
            for (index, entry) in entries.iter().enumerate() {
                let start = NODE_HEADER_BYTES + index * ENTRY_BYTES;
                entry.encode(level == 0, &mut expected[start..start + ENTRY_BYTES]);
            }
            assert!(block[..] == expected[..], "{count} entries at level {level}: the block differs");
            if count > 0 {
                assert_eq!(decode_node(&block[..], 9, level, length).unwrap(), entries);
            }
        }
    }
}

#[test]
fn small_file_stays_inline() {
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    write(&mut store, &mut root, 0, b"hello").unwrap();
    write(&mut store, &mut root, 100, b"world").unwrap();
    assert_eq!(root.depth(), 0);
    assert_eq!(store.meta.len(), 0, "no tree block for a small file");
    assert_eq!(root.blocks_owned(), 2);
    let mut buffer = [0u8; 105];
    assert_eq!(read(&mut store, &root, 0, &mut buffer).unwrap(), 105);
    assert_eq!(&buffer[..5], b"hello");
    assert!(buffer[5..100].iter().all(|byte| *byte == 0));
    assert_eq!(&buffer[100..], b"world");
    destroy(&mut store, root).unwrap();
    assert_eq!(store.allocated_count(), 0);
}

#[test]
fn sequential_append_is_one_extent_and_overwrite_is_in_place() {
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    let chunk: Vec<u8> = (0..BLOCK_SIZE).map(|index| index as u8).collect();
    for index in 0..256u64 {
        write(&mut store, &mut root, index * BLOCK_SIZE_U64, &chunk).unwrap();
    }
    assert_eq!(root.length_bytes(), 1 << 20);
    assert_eq!(extent_count(&mut store, &root), 1);
    assert_eq!(root.blocks_owned(), 256);
    // Unaligned appends fill the last block first, then continue contiguously.
    for _ in 0..100 {
        let end = root.length_bytes();
        write(&mut store, &mut root, end, &chunk[..1000]).unwrap();
    }
    assert_eq!(extent_count(&mut store, &root), 1);
    let allocated = store.allocated_count();
    let blocks = root.blocks_owned();
    let mut random = SmallRng::seed_from_u64(7);
    for _ in 0..200 {
        let offset = random.gen_range(0..root.length_bytes() - 5000);
        write(&mut store, &mut root, offset, &chunk[..random.gen_range(1..BLOCK_SIZE)]).unwrap();
    }
    assert_eq!(store.allocated_count(), allocated, "overwrite allocated blocks");
    assert_eq!(root.blocks_owned(), blocks);
    assert_eq!(extent_count(&mut store, &root), 1);
    // A punch inside one block zeroes in place; a larger one frees exactly its whole blocks.
    punch_hole(&mut store, &mut root, 5000, 100).unwrap();
    assert_eq!(store.allocated_count(), allocated);
    punch_hole(&mut store, &mut root, 8000, 3 * BLOCK_SIZE_U64 + 500).unwrap();
    assert_eq!(store.allocated_count(), allocated - 3);
    assert_eq!(root.blocks_owned(), blocks - 3);
    let mut buffer = vec![1u8; 4 * BLOCK_SIZE];
    read(&mut store, &root, 8000, &mut buffer).unwrap();
    assert!(buffer[..3 * BLOCK_SIZE + 500].iter().all(|byte| *byte == 0));
    zero_range(&mut store, &mut root, 40_000, 2 * BLOCK_SIZE_U64 + 10, true).unwrap();
    // The range now has five extents, more than the root holds: one tree block, no data block.
    let report = check(&mut store, &root);
    let data_blocks: u64 = report.data_blocks.iter().map(|run| run.1).sum();
    assert_eq!(data_blocks, blocks - 3, "zero_range keeps blocks");
    assert_eq!(report.tree_blocks.len(), 1);
    assert_eq!(store.allocated_count(), allocated - 2);
    // fallocate then sequential writes: one written extent grows, the unwritten rest shrinks.
    let mut preallocated = ExtentRoot::empty();
    allocate(&mut store, &mut preallocated, 0, 1 << 20, false).unwrap();
    for index in 0..128u64 {
        write(&mut store, &mut preallocated, index * BLOCK_SIZE_U64, &chunk).unwrap();
    }
    assert_eq!(extent_count(&mut store, &preallocated), 2);
    destroy(&mut store, root).unwrap();
    destroy(&mut store, preallocated).unwrap();
    assert_eq!(store.allocated_count(), 0);
}

/// Counts metadata block accesses.
struct CountingStore {
    inner: MemoryStore,
    reads: u64,
    writes: u64,
    /// Data writes into blocks just handed out (`write_fresh`).
    fresh_writes: u64,
}

impl MetaStore for CountingStore {
    fn read_meta(&mut self, block_number: u64, kind: BlockKind) -> crate::Result<SharedBlock> {
        self.reads += 1;
        self.inner.read_meta(block_number, kind)
    }
    fn write_meta(&mut self, block_number: u64, kind: BlockKind, block: SharedBlock) -> crate::Result<()> {
        self.writes += 1;
        self.inner.write_meta(block_number, kind, block)
    }
    fn allocate_meta(&mut self, near: u64) -> crate::Result<u64> {
        self.inner.allocate_meta(near)
    }
    fn free_meta(&mut self, block_number: u64) -> crate::Result<()> {
        self.inner.free_meta(block_number)
    }
}

impl DataStore for CountingStore {
    fn read_data(&mut self, block_number: u64, offset_in_block: usize, buffer: &mut [u8]) -> crate::Result<()> {
        self.inner.read_data(block_number, offset_in_block, buffer)
    }
    fn write_fresh(&mut self, block_number: u64, data: &[u8]) -> crate::Result<()> {
        self.fresh_writes += 1;
        self.inner.write_fresh(block_number, data)
    }
    fn pack_room(&mut self, file: u64) -> Option<(u64, u64)> {
        self.inner.pack_room(file)
    }
    fn set_pack_room(&mut self, file: u64, room: Option<(u64, u64)>) {
        self.inner.set_pack_room(file, room)
    }
    fn forget_pack_room(&mut self, first: u64, count: u64) {
        self.inner.forget_pack_room(first, count)
    }
    fn write_data(&mut self, block_number: u64, offset_in_block: usize, data: &[u8]) -> crate::Result<()> {
        self.inner.write_data(block_number, offset_in_block, data)
    }
    fn allocate_data(&mut self, near: u64, count: u64) -> crate::Result<(u64, u64)> {
        self.inner.allocate_data(near, count)
    }
    fn free_data(&mut self, first: u64, count: u64) -> crate::Result<()> {
        self.inner.free_data(first, count)
    }
    fn shared_references(&mut self, block_number: u64) -> crate::Result<u64> {
        self.inner.shared_references(block_number)
    }
    fn set_shared_references(&mut self, block_number: u64, references: u64) -> crate::Result<()> {
        self.inner.set_shared_references(block_number, references)
    }
}

/// A store that keeps metadata blocks as shared buffers and the decoded forms of extent nodes
/// beside them, as a volume does (`MetaStore::decoded`), over a `MemoryStore`; with `forgets`,
/// it drops a kept form when asked (`forget_decoded`), as a volume does.
struct KeepingStore {
    inner: MemoryStore,
    blocks: std::collections::HashMap<u64, SharedBlock>,
    kept: std::collections::HashMap<u64, (SharedBlock, crate::block::meta::Decoded)>,
    forgets: bool,
}

impl MetaStore for KeepingStore {
    fn read_meta(&mut self, block_number: u64, kind: BlockKind) -> crate::Result<SharedBlock> {
        match self.blocks.get(&block_number) {
            Some(block) => Ok(block.clone()),
            None => self.inner.read_meta(block_number, kind),
        }
    }
    fn write_meta(&mut self, block_number: u64, kind: BlockKind, block: SharedBlock) -> crate::Result<()> {
        self.blocks.insert(block_number, block.clone());
        self.inner.write_meta(block_number, kind, block)
    }
    fn allocate_meta(&mut self, near: u64) -> crate::Result<u64> {
        self.inner.allocate_meta(near)
    }
    fn free_meta(&mut self, block_number: u64) -> crate::Result<()> {
        self.blocks.remove(&block_number);
        self.kept.remove(&block_number);
        self.inner.free_meta(block_number)
    }
    fn decoded(&mut self, block_number: u64, block: &SharedBlock) -> Option<crate::block::meta::Decoded> {
        let (held, decoded) = self.kept.get(&block_number)?;
        std::sync::Arc::ptr_eq(held, block).then(|| decoded.clone())
    }
    fn keep_decoded(&mut self, block_number: u64, block: &SharedBlock, decoded: crate::block::meta::Decoded) {
        self.kept.insert(block_number, (block.clone(), decoded));
    }
    fn forget_decoded(&mut self, block_number: u64) {
        if self.forgets {
            self.kept.remove(&block_number);
        }
    }
}

impl DataStore for KeepingStore {
    fn read_data(&mut self, block_number: u64, offset_in_block: usize, buffer: &mut [u8]) -> crate::Result<()> {
        self.inner.read_data(block_number, offset_in_block, buffer)
    }
    fn write_data(&mut self, block_number: u64, offset_in_block: usize, data: &[u8]) -> crate::Result<()> {
        self.inner.write_data(block_number, offset_in_block, data)
    }
    fn allocate_data(&mut self, near: u64, count: u64) -> crate::Result<(u64, u64)> {
        self.inner.allocate_data(near, count)
    }
    fn free_data(&mut self, first: u64, count: u64) -> crate::Result<()> {
        self.inner.free_data(first, count)
    }
    fn shared_references(&mut self, block_number: u64) -> crate::Result<u64> {
        self.inner.shared_references(block_number)
    }
    fn set_shared_references(&mut self, block_number: u64, references: u64) -> crate::Result<()> {
        self.inner.set_shared_references(block_number, references)
    }
}

/// Where the entries the store keeps for node `id` live (None: nothing kept).
fn kept_address(store: &mut KeepingStore, id: u64) -> Option<*const Vec<Entry>> {
    let (block, _) = store.kept.get(&id).cloned()?;
    let decoded = store.decoded(id, &block).expect("kept for its own buffer");
    Some(std::sync::Arc::as_ptr(&tree::kept_entries(&decoded).expect("an extent node")))
}

/// A node an operation only reads shares the entries the store keeps (no copy); the first
/// change takes them over from a store that forgets its kept form, or copies them once, with
/// room to grow, from one that does not (never changing what that store keeps); commit hands
/// the changed entries to the store (no copy), and the next operations find them there.
#[test]
fn nodes_share_their_entries_with_the_store_until_changed() {
    for forgets in [true, false] {
        let mut store = KeepingStore {
            inner: MemoryStore::new(),
            blocks: std::collections::HashMap::new(),
            kept: std::collections::HashMap::new(),
            forgets,
        };
        let mut root = striped_file(&mut store, 2_000);
        assert!(root.depth() >= 1, "a tree with blocks");
        // Read only: every node on the path shares the store's entries.
        let mut tree = tree::Tree::open(&mut store, &root);
        let location = tree.locate(3 * BLOCK_SIZE_U64).unwrap();
        let path: Vec<u64> = location.path.iter().map(|(id, _)| *id).filter(|id| *id != u64::MAX).collect();
        assert!(!path.is_empty());
        let held: Vec<*const Vec<Entry>> =
            path.iter().map(|id| std::sync::Arc::as_ptr(tree.node_entries(*id).expect("loaded"))).collect();
        tree.abort();
        for (id, address) in path.iter().zip(&held) {
            assert_eq!(kept_address(&mut store, *id), Some(*address), "node {id} was copied by a read");
        }
        // A change takes the entries over, or copies them with room; commit hands them over.
        let leaf = *path.last().expect("a leaf");
        let kept_before = store.kept[&leaf].1.clone();
        let entries_before = tree::kept_entries(&kept_before).expect("an extent node").to_vec();
        drop(kept_before);
        let mut tree = tree::Tree::open(&mut store, &root);
        tree.locate(3 * BLOCK_SIZE_U64).unwrap();
        tree.touch_node(leaf);
        let changed = tree.node_entries(leaf).expect("loaded");
        assert!(changed.capacity() >= NODE_CAPACITY + NODE_GROWTH_ROOM, "room: {}", changed.capacity());
        let changed_address = std::sync::Arc::as_ptr(changed);
        assert_eq!(changed_address == held[held.len() - 1], forgets, "taken over only from a store that forgets");
        tree::Tree::commit(tree).map(|new_root| root = new_root).unwrap();
        assert_eq!(kept_address(&mut store, leaf), Some(changed_address), "commit copied the entries");
        let (_, kept_after) = store.kept[&leaf].clone();
        assert_eq!(tree::kept_entries(&kept_after).expect("an extent node").to_vec(), entries_before);
        // The tree is whole and goes on working from the kept forms.
        let report = check(&mut store, &root);
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        insert_range(&mut store, &mut root, 3 * BLOCK_SIZE_U64 + 7, 5).unwrap();
        collapse_range(&mut store, &mut root, 5 * BLOCK_SIZE_U64 + 9, 3).unwrap();
        let report = check(&mut store, &root);
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        destroy(&mut store, root).unwrap();
        assert_eq!(store.inner.allocated_count(), 0);
    }
}

/// Bytes that fill a hole from blocks just handed out (a run of its own, or the first run of a
/// new pack block) are written as fresh blocks, so a volume reads nothing for their checksums;
/// bytes into a pack block's room, or over written bytes, are not.
#[test]
fn holes_filled_from_new_blocks_are_written_fresh() {
    let mut store = CountingStore { inner: MemoryStore::new(), reads: 0, writes: 0, fresh_writes: 0 };
    let mut root = ExtentRoot::empty();
    let mut model = vec![7u8; 1 << 20];
    write(&mut store, &mut root, 0, &model).unwrap();
    let fresh_after_setup = store.fresh_writes;
    let mut insert = |store: &mut CountingStore, root: &mut ExtentRoot, offset: usize, bytes: Vec<u8>| {
        insert_range(store, root, offset as u64, bytes.len() as u64).unwrap();
        write_in_file(store, root, 1, offset as u64, &bytes).unwrap();
        model.splice(offset..offset, bytes);
    };
    // At block boundaries of the written file (old offsets 8,192, 69,632 and 90,112, shifted by
    // the inserts before them), so no extent before the hole has room in its last block.
    insert(&mut store, &mut root, 8_192, vec![1; 3_000]);
    assert_eq!(store.fresh_writes, fresh_after_setup + 1, "a run of its own");
    insert(&mut store, &mut root, 69_632 + 3_000, vec![2; 100]);
    assert_eq!(store.fresh_writes, fresh_after_setup + 2, "the first run of a new pack block");
    insert(&mut store, &mut root, 90_112 + 3_100, vec![3; 100]);
    assert_eq!(store.fresh_writes, fresh_after_setup + 2, "a run into the pack block's room");
    // Inside a block: the cut copies the left part into a new block, whose room takes the bytes.
    insert(&mut store, &mut root, 200_001, vec![5; 500]);
    assert_eq!(store.fresh_writes, fresh_after_setup + 2, "a run into an extent's own room");
    write(&mut store, &mut root, 5_100, &[4; 10]).unwrap();
    model[5_100..5_110].fill(4);
    assert_eq!(store.fresh_writes, fresh_after_setup + 2, "a write in place");
    let mut buffer = vec![0u8; model.len()];
    assert_eq!(read(&mut store, &root, 0, &mut buffer).unwrap(), model.len());
    assert!(buffer == model, "bytes differ from the model");
    let report = check(&mut store, &root);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    destroy(&mut store, root).unwrap();
}

/// Builds a file of `blocks` unwritten blocks separated by one-byte holes: 2 * blocks extents,
/// without storing any data.
fn striped_file(store: &mut dyn Store, blocks: u64) -> ExtentRoot {
    let mut root = ExtentRoot::empty();
    allocate(store, &mut root, 0, blocks * BLOCK_SIZE_U64, false).unwrap();
    for index in (1..=blocks).rev() {
        insert_range(store, &mut root, index * BLOCK_SIZE_U64, 1).unwrap();
    }
    root
}

/// A change descends from the root once and finds its later places from where the last search
/// left off (`Tree::locate`'s hint): an insert of data (its cut, hole, fill and merge) and a
/// collapse of up to 100 bytes (its removal and merge), at random bytes of a file of 4,000
/// extents (depth 2), where they descended four and two times each. Debug builds check every
/// hinted search against a descent, and the file is checked against the model at the end.
#[test]
fn a_change_descends_from_the_root_about_once() {
    let mut store = MemoryStore::new();
    let mut root = striped_file(&mut store, 2_000);
    assert!(root.depth() >= 2, "depth {}", root.depth());
    let mut model = vec![0u8; root.length_bytes() as usize];
    let mut random = SmallRng::seed_from_u64(11);
    let rounds = 400;
    let mut descents = 0;
    for round in 0..rounds {
        let length = root.length_bytes();
        let position = random.gen_range(0..length);
        let mut tree = tree::Tree::open(&mut store, &root);
        if round % 2 == 0 {
            let data = vec![(round % 251) as u8 + 1; random.gen_range(1..=3_000)];
            tree.insert_data(position, &data).unwrap();
            model.splice(position as usize..position as usize, data);
        } else {
            let end = (position + random.gen_range(1..=100)).min(length);
            tree.remove_range(position, end).unwrap();
            model.drain(position as usize..end as usize);
        }
        descents += tree.descents();
        root = tree.commit().unwrap();
    }
    // A change whose leaf splits or merges, or whose range crosses into the next leaf, descends
    // again; without the hint every change descended 2-4 times (1,200 here).
    assert!(descents <= rounds + rounds / 8, "{descents} descents for {rounds} changes");
    let report = check(&mut store, &root);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let mut read_back = vec![0u8; model.len()];
    assert_eq!(read(&mut store, &root, 0, &mut read_back).unwrap(), model.len());
    assert!(read_back == model, "the file's bytes differ from the model's");
}

#[test]
fn insert_and_collapse_touch_logarithmic_nodes() {
    let mut store = CountingStore { inner: MemoryStore::new(), reads: 0, writes: 0, fresh_writes: 0 };
    let mut root = striped_file(&mut store, 50_000);
    let extent_total = extent_count(&mut store, &root);
    assert!(extent_total >= 100_000, "{extent_total} extents");
    let depth = root.depth() as u64;
    println!("{extent_total} extents, depth {depth}");
    let mut worst = 0;
    for (name, offset) in
        [("insert_range", 100u64), ("collapse_range", 100), ("insert_range", 8192), ("collapse_range", 8192)]
    {
        store.reads = 0;
        store.writes = 0;
        if name == "insert_range" {
            insert_range(&mut store, &mut root, offset, 10).unwrap();
        } else {
            collapse_range(&mut store, &mut root, offset, 10).unwrap();
        }
        println!("{name} at {offset}: {} node reads, {} node writes", store.reads, store.writes);
        worst = worst.max(store.reads + store.writes);
    }
    assert!(worst <= 4 * (depth + 1), "{worst} node accesses at depth {depth}");
    let report = check(&mut store, &root);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(store.inner.allocated_count() as u64, root.blocks_owned());
    destroy(&mut store, root).unwrap();
    assert_eq!(store.inner.allocated_count(), 0);
}

/// A store that reports bad block numbers and failed allocations as errors instead of the
/// assertions `MemoryStore` makes, as a volume's block layer would.
struct GuardedStore {
    inner: MemoryStore,
    /// Allocations left before `NoSpace`.
    allocations_left: u64,
}

impl GuardedStore {
    fn owned(&self, first: u64, count: u64) -> crate::Result<()> {
        if count > 1 << 20 || (first..first + count).any(|block| !self.inner.allocated.contains(&block)) {
            return Err(crate::Error::corruption(format!("blocks {first}+{count} not allocated")));
        }
        Ok(())
    }
    fn span(offset_in_block: usize, bytes: usize) -> u64 {
        (offset_in_block + bytes).div_ceil(BLOCK_SIZE) as u64
    }
}

impl MetaStore for GuardedStore {
    fn read_meta(&mut self, block_number: u64, kind: BlockKind) -> crate::Result<SharedBlock> {
        self.inner.read_meta(block_number, kind)
    }
    fn write_meta(&mut self, block_number: u64, kind: BlockKind, block: SharedBlock) -> crate::Result<()> {
        self.owned(block_number, 1)?;
        self.inner.write_meta(block_number, kind, block)
    }
    fn allocate_meta(&mut self, near: u64) -> crate::Result<u64> {
        if self.allocations_left == 0 {
            return Err(crate::Error::NoSpace);
        }
        self.allocations_left -= 1;
        self.inner.allocate_meta(near)
    }
    fn free_meta(&mut self, block_number: u64) -> crate::Result<()> {
        self.owned(block_number, 1)?;
        self.inner.free_meta(block_number)
    }
}

impl DataStore for GuardedStore {
    fn read_data(&mut self, block_number: u64, offset_in_block: usize, buffer: &mut [u8]) -> crate::Result<()> {
        self.owned(block_number, Self::span(offset_in_block, buffer.len()))?;
        self.inner.read_data(block_number, offset_in_block, buffer)
    }
    fn write_data(&mut self, block_number: u64, offset_in_block: usize, data: &[u8]) -> crate::Result<()> {
        self.owned(block_number, Self::span(offset_in_block, data.len()))?;
        self.inner.write_data(block_number, offset_in_block, data)
    }
    fn allocate_data(&mut self, near: u64, count: u64) -> crate::Result<(u64, u64)> {
        if self.allocations_left == 0 {
            return Err(crate::Error::NoSpace);
        }
        self.allocations_left -= 1;
        self.inner.allocate_data(near, count.min(3))
    }
    fn free_data(&mut self, first: u64, count: u64) -> crate::Result<()> {
        self.owned(first, count)?;
        if let Some(block) = (first..first + count).find(|block| self.inner.shares.contains_key(block)) {
            return Err(crate::Error::corruption(format!("free of data block {block} still marked shared")));
        }
        self.inner.free_data(first, count)
    }
    fn shared_references(&mut self, block_number: u64) -> crate::Result<u64> {
        self.owned(block_number, 1)?;
        self.inner.shared_references(block_number)
    }
    fn set_shared_references(&mut self, block_number: u64, references: u64) -> crate::Result<()> {
        self.owned(block_number, 1)?;
        self.inner.set_shared_references(block_number, references)
    }
}

/// Runs a few operations of every kind on a possibly corrupt tree; each must return. Returns
/// how many reported an error.
fn exercise(store: &mut GuardedStore, root: &mut ExtentRoot, random: &mut SmallRng) -> usize {
    let length = root.length_bytes().min(1 << 24);
    let mut errors = usize::from(!check(store, root).problems.is_empty());
    errors += usize::from(extents(store, root, &mut |_, _, _, _| true).is_err());
    let mut buffer = vec![0u8; 20_000];
    errors += usize::from(read(store, root, random.gen_range(0..=length), &mut buffer).is_err());
    errors += usize::from(read(store, root, 0, &mut buffer).is_err());
    errors +=
        usize::from(write(store, root, random.gen_range(0..=length), &buffer[..random.gen_range(1..9000)]).is_err());
    errors += usize::from(insert_range(store, root, random.gen_range(0..=length), random.gen_range(1..9000)).is_err());
    let length = root.length_bytes().min(1 << 24);
    let offset = random.gen_range(0..=length);
    errors +=
        usize::from(collapse_range(store, root, offset, random.gen_range(0..=(length - offset).min(9000))).is_err());
    errors += usize::from(punch_hole(store, root, random.gen_range(0..=length), random.gen_range(1..9000)).is_err());
    errors += usize::from(
        zero_range(store, root, random.gen_range(0..=length), random.gen_range(1..9000), random.gen()).is_err(),
    );
    errors += usize::from(
        allocate(store, root, random.gen_range(0..=length), random.gen_range(1..9000), random.gen()).is_err(),
    );
    errors += usize::from(truncate(store, root, random.gen_range(0..=length)).is_err());
    let _ = root.encode();
    errors += usize::from(destroy(store, *root).is_err());
    errors
}

fn corruptible_file(seed: u64) -> (GuardedStore, ExtentRoot) {
    let mut store = GuardedStore { inner: MemoryStore::new(), allocations_left: u64::MAX };
    let mut root = striped_file(&mut store, 400);
    let mut random = SmallRng::seed_from_u64(seed);
    for _ in 0..40 {
        let offset = random.gen_range(0..root.length_bytes());
        write(&mut store, &mut root, offset, &[0x5a; 300]).unwrap();
    }
    (store, root)
}

/// Seeds for the corruption tests; `EXTENT_CORRUPTION_SEEDS=N` runs more for a longer soak.
fn corruption_seeds(default: u64) -> std::ops::Range<u64> {
    let count = std::env::var("EXTENT_CORRUPTION_SEEDS").ok().and_then(|text| text.parse().ok());
    0..count.unwrap_or(default)
}

#[test]
fn corrupt_tree_blocks_give_errors_not_panics() {
    let mut errors = 0;
    for seed in corruption_seeds(150) {
        println!("corruption seed {seed}");
        let (mut store, mut root) = corruptible_file(seed);
        assert!(root.depth() >= 2);
        let mut random = SmallRng::seed_from_u64(seed);
        let mut blocks: Vec<u64> = store.inner.meta.keys().copied().collect();
        blocks.sort_unstable();
        for _ in 0..random.gen_range(1..4) {
            let block = blocks[random.gen_range(0..blocks.len())];
            let kind = BlockKind::from_u32(u32::from_le_bytes(
                store.inner.meta[&block]
                    [crate::block::meta::TRAILER_KIND_OFFSET..crate::block::meta::TRAILER_KIND_OFFSET + 4]
                    .try_into()
                    .unwrap(),
            ))
            .unwrap();
            let bytes = store.inner.meta.get_mut(&block).unwrap();
            for _ in 0..random.gen_range(1..4) {
                // Mostly the header and the first entries, where one flip matters most.
                let limit = if random.gen_bool(0.7) { 256 } else { crate::block::meta::META_PAYLOAD_BYTES };
                let at = random.gen_range(0..limit);
                bytes[at] ^= 1 << random.gen_range(0..8);
            }
            seal_block(bytes, kind, block);
        }
        errors += exercise(&mut store, &mut root, &mut random);
    }
    println!("{errors} operations reported errors");
    assert!(errors > 100, "corruption was hardly ever noticed ({errors} errors)");
}

#[test]
fn corrupt_root_gives_errors_not_panics() {
    let mut errors = 0;
    for seed in corruption_seeds(200) {
        println!("corruption seed {seed}");
        let (mut store, root) = corruptible_file(seed % 8);
        let mut random = SmallRng::seed_from_u64(seed);
        let mut small = ExtentRoot::empty();
        write(&mut store, &mut small, 10, &[1; 5000]).unwrap();
        let chosen = if seed % 2 == 0 { root } else { small };
        let mut bytes = chosen.encode();
        for _ in 0..random.gen_range(1..3) {
            let at = random.gen_range(0..EXTENT_ROOT_BYTES);
            bytes[at] ^= 1 << random.gen_range(0..8);
        }
        if let Ok(mut decoded) = ExtentRoot::decode(&bytes) {
            errors += exercise(&mut store, &mut decoded, &mut random);
        } else {
            errors += 1;
        }
    }
    println!("{errors} decodes or operations reported errors");
    assert!(errors > 100, "corruption was hardly ever noticed ({errors} errors)");
}

#[test]
fn no_space_leaves_the_tree_unchanged() {
    let seed = 99u64;
    println!("no-space seed {seed}");
    let mut random = SmallRng::seed_from_u64(seed);
    let mut store = GuardedStore { inner: MemoryStore::new(), allocations_left: u64::MAX };
    let mut root = ExtentRoot::empty();
    let mut model: Vec<u8> = Vec::new();
    let mut failures = 0;
    for step in 0..3000 {
        store.allocations_left = random.gen_range(0..6);
        let before = root;
        let length = model.len() as u64;
        let offset = random.gen_range(0..=length);
        let count = random.gen_range(1..20_000u64);
        let result = match random.gen_range(0..5) {
            0 | 1 => {
                let data: Vec<u8> = (0..count).map(|_| random.gen()).collect();
                let result = write(&mut store, &mut root, offset, &data);
                if result.is_ok() {
                    let end = (offset + count) as usize;
                    model.resize(model.len().max(end), 0);
                    model[offset as usize..end].copy_from_slice(&data);
                }
                result
            }
            2 => {
                let result = insert_range(&mut store, &mut root, offset, count);
                if result.is_ok() {
                    model.splice(offset as usize..offset as usize, vec![0u8; count as usize]);
                }
                result
            }
            3 => {
                let count = count.min(length - offset);
                let result = collapse_range(&mut store, &mut root, offset, count);
                if result.is_ok() {
                    model.drain(offset as usize..(offset + count) as usize);
                }
                result
            }
            _ => {
                let result = punch_hole(&mut store, &mut root, offset, count);
                if result.is_ok() {
                    let end = (offset + count).min(length);
                    model[offset as usize..end as usize].fill(0);
                }
                result
            }
        };
        store.allocations_left = u64::MAX;
        match result {
            Ok(()) => {}
            Err(crate::Error::NoSpace) => {
                failures += 1;
                assert_eq!(root, before, "step {step}: a failed operation changed the root");
                // A failed write may have overwritten bytes in place before it ran out of space;
                // everything else must be as before.
                let contents = read_all(&mut store, &root);
                model.copy_from_slice(&contents);
            }
            Err(error) => panic!("step {step}: unexpected {error}"),
        }
        if step % 100 == 99 {
            let report = check(&mut store, &root);
            assert!(report.problems.is_empty(), "step {step}: {:?}", report.problems);
            assert_eq!(store.inner.allocated_count() as u64, root.blocks_owned(), "step {step}");
            assert_eq!(read_all(&mut store, &root), model, "step {step}");
        }
    }
    assert!(failures > 100, "only {failures} operations ran out of space");
    destroy(&mut store, root).unwrap();
    assert_eq!(store.inner.allocated_count(), 0);
}

#[test]
fn collapse_and_truncate_trim_without_copying() {
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    let data: Vec<u8> = (0..64 * BLOCK_SIZE).map(|index| (index % 251) as u8).collect();
    write(&mut store, &mut root, 0, &data).unwrap();
    let mut model = data.clone();
    // Across block boundaries: the cut extents are trimmed, whole blocks in between are freed.
    collapse_range(&mut store, &mut root, 1000, 3 * BLOCK_SIZE_U64).unwrap();
    model.drain(1000..1000 + 3 * BLOCK_SIZE);
    assert_eq!(store.allocated_count(), 62, "two whole blocks freed, the partial ones kept");
    truncate(&mut store, &mut root, 20 * BLOCK_SIZE_U64 + 7).unwrap();
    model.truncate(20 * BLOCK_SIZE + 7);
    assert_eq!(store.allocated_count() as u64, root.blocks_owned());
    let report = check(&mut store, &root);
    let data_blocks: u64 = report.data_blocks.iter().map(|run| run.1).sum();
    assert_eq!(data_blocks, 22, "blocks of the trimmed extents");
    // Inside one block with data on both sides: nothing is copied, both ends share the block.
    collapse_range(&mut store, &mut root, 10, 20).unwrap();
    model.drain(10..30);
    let report = check(&mut store, &root);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.data_blocks.iter().map(|run| run.1).sum::<u64>(), 22);
    let first_block = report.data_blocks[0].0;
    assert_eq!(report.shared_blocks, vec![(first_block, 2)]);
    assert_eq!(store.allocated_count() as u64, root.blocks_owned());
    verify(&mut store, &root, &model, "after trims");
    destroy(&mut store, root).unwrap();
    assert_eq!(store.allocated_count(), 0);
}

#[test]
fn model_large_ranges_over_many_extents() {
    // Fragment a file into thousands of extents, then cut, punch, zero and fill ranges that span
    // many leaves, so that removals, merges and redistributions between nodes are exercised.
    let seed = 21u64;
    println!("extent model test: seed {seed}");
    let mut random = SmallRng::seed_from_u64(seed);
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    let mut model = Vec::new();
    let fragment = Shape { small_bytes: 24, large_bytes: 200, soft_limit_bytes: 300_000, grow: true };
    let sweep = Shape { small_bytes: 24, large_bytes: 150_000, soft_limit_bytes: 300_000, grow: true };
    let mut most_extents = 0;
    for round in 0..6 {
        for step in 0..12_000 {
            random_operation(&mut random, &mut store, &mut root, &mut model, fragment, true);
            if step % 4000 == 3999 {
                verify(&mut store, &root, &model, &format!("seed {seed} round {round} fragment {step}"));
            }
        }
        most_extents = most_extents.max(extent_count(&mut store, &root));
        for step in 0..300 {
            let name = random_operation(&mut random, &mut store, &mut root, &mut model, sweep, true);
            if step % 20 == 19 {
                verify(&mut store, &root, &model, &format!("seed {seed} round {round} sweep {step} after {name}"));
            }
        }
    }
    println!("at most {most_extents} extents");
    assert!(most_extents >= 3000, "{most_extents} extents");
    destroy(&mut store, root).unwrap();
    assert_eq!(store.allocated_count(), 0);
}

/// A longer randomized run over many seeds: `cargo test -p tandemfs --lib extent_soak --
/// --ignored`, seeds from `EXTENT_SOAK_SEEDS` (default 20).
#[test]
#[ignore]
fn extent_soak() {
    let count = std::env::var("EXTENT_SOAK_SEEDS").ok().and_then(|text| text.parse().ok()).unwrap_or(20u64);
    for seed in 1000..1000 + count {
        let shape = if seed % 2 == 0 {
            Shape { small_bytes: 3000, large_bytes: 70_000, soft_limit_bytes: 400_000, grow: false }
        } else {
            Shape { small_bytes: 24, large_bytes: 2000, soft_limit_bytes: 200_000, grow: true }
        };
        run_model(seed, 20_000, 100, shape);
    }
}

#[test]
fn bad_arguments_are_typed_errors() {
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    write(&mut store, &mut root, 0, &[7; 100]).unwrap();
    let invalid = |result: crate::Result<()>| matches!(result, Err(crate::Error::InvalidArgument(_)));
    let too_large = |result: crate::Result<()>| matches!(result, Err(crate::Error::FileTooLarge));
    assert!(invalid(insert_range(&mut store, &mut root, 101, 10)));
    assert!(invalid(collapse_range(&mut store, &mut root, 50, 51)));
    assert!(invalid(collapse_range(&mut store, &mut root, u64::MAX, 2)));
    assert!(too_large(write(&mut store, &mut root, MAX_FILE_BYTES, &[1])));
    assert!(too_large(write(&mut store, &mut root, u64::MAX, &[1])));
    assert!(too_large(truncate(&mut store, &mut root, MAX_FILE_BYTES + 1)));
    assert!(too_large(insert_range(&mut store, &mut root, 0, MAX_FILE_BYTES)));
    assert!(too_large(allocate(&mut store, &mut root, u64::MAX - 5, 10, false)));
    assert!(too_large(zero_range(&mut store, &mut root, MAX_FILE_BYTES, 1, false)));
    // The largest file is fine as long as it is a hole; nothing was changed by the failures.
    truncate(&mut store, &mut root, MAX_FILE_BYTES).unwrap();
    write(&mut store, &mut root, MAX_FILE_BYTES - 3, &[1, 2, 3]).unwrap();
    let mut buffer = [0u8; 8];
    assert_eq!(read(&mut store, &root, MAX_FILE_BYTES - 5, &mut buffer).unwrap(), 5);
    assert_eq!(buffer[..5], [0, 0, 1, 2, 3]);
    assert_eq!(read(&mut store, &root, 0, &mut buffer).unwrap(), 8);
    assert_eq!(buffer, [7; 8]);
    punch_hole(&mut store, &mut root, u64::MAX - 1, 10).unwrap();
    assert_eq!(root.blocks_owned(), 2);
    destroy(&mut store, root).unwrap();
    assert_eq!(store.allocated_count(), 0);
}

#[test]
fn extents_from_starts_at_the_extent_holding_the_offset() {
    let mut store = CountingStore { inner: MemoryStore::new(), reads: 0, writes: 0, fresh_writes: 0 };
    let root = striped_file(&mut store, 5000);
    let mut seen = Vec::new();
    store.reads = 0;
    let offset = 3000 * (BLOCK_SIZE_U64 + 1) + 10;
    extents_from(&mut store, &root, offset, &mut |logical, length, physical, unwritten| {
        seen.push((logical, length, physical.is_some(), unwritten));
        seen.len() < 3
    })
    .unwrap();
    assert_eq!(seen[0], (3000 * (BLOCK_SIZE_U64 + 1), BLOCK_SIZE_U64, true, true));
    assert_eq!(seen[1], (3000 * (BLOCK_SIZE_U64 + 1) + BLOCK_SIZE_U64, 1, false, false));
    assert_eq!(seen.len(), 3);
    assert!(store.reads <= 2 * root.depth() as u64, "{} node reads", store.reads);
    let mut none = true;
    extents_from(&mut store, &root, root.length_bytes(), &mut |_, _, _, _| {
        none = false;
        true
    })
    .unwrap();
    assert!(none);
}

/// Replay after a crash: random operations after a checkpoint, the tree put back to the
/// checkpoint with the data blocks as the operations left them, the same operations applied
/// again. The contents must then equal the model: no operation may read bytes that a later
/// one changed in place (issue 13, finding 10).
fn replay_run(seed: u64, same_blocks: bool) {
    println!("extent replay test: seed {seed}");
    let shape = Shape { small_bytes: 3000, large_bytes: 40_000, soft_limit_bytes: 300_000, grow: false };
    let mut random = SmallRng::seed_from_u64(seed);
    let mut store = MemoryStore::with_crash_model();
    let mut root = ExtentRoot::empty();
    let mut model = Vec::new();
    for round in 0..20 {
        for _ in 0..30 {
            random_operation(&mut random, &mut store, &mut root, &mut model, shape, true);
        }
        store.checkpoint();
        let (checkpoint_root, checkpoint_model, checkpoint_random) = (root, model.clone(), random.clone());
        for _ in 0..60 {
            random_operation(&mut random, &mut store, &mut root, &mut model, shape, true);
        }
        let context = format!("seed {seed} round {round} (same blocks: {same_blocks})");
        store.crash(same_blocks);
        let (mut replayed_root, mut replayed_model, mut replayed_random) =
            (checkpoint_root, checkpoint_model, checkpoint_random);
        // Reads on the way would see bytes of later operations, as nothing reads during a
        // replay; only the end state must be right.
        for _ in 0..60 {
            random_operation(&mut replayed_random, &mut store, &mut replayed_root, &mut replayed_model, shape, false);
        }
        assert_eq!(replayed_model, model, "{context}: the model replays to itself");
        let report = check(&mut store, &replayed_root);
        assert!(report.problems.is_empty(), "{context}: check found {:?}", report.problems);
        let contents = read_all(&mut store, &replayed_root);
        if let Some(first) = contents.iter().zip(&model).position(|(a, b)| a != b) {
            panic!("{context}: contents differ after replay first at byte {first}");
        }
        root = replayed_root;
    }
}

#[test]
fn replay_after_a_crash_gives_the_same_bytes() {
    for seed in 0..12 {
        replay_run(seed, seed % 2 == 0);
    }
}

/// Writes a 256 KiB file, then inserts 2,000 runs of 100 bytes at random bytes of it, written
/// as a file's writes are (`packed`: through `write_in_file`, which packs small runs into
/// shared blocks) or without packing; returns the file's bytes.
fn insert_small_runs(store: &mut MemoryStore, root: &mut ExtentRoot, random: &mut SmallRng, packed: bool) -> Vec<u8> {
    let mut model: Vec<u8> = (0..256 * 1024).map(|index| (index % 251) as u8).collect();
    write(store, root, 0, &model).unwrap();
    for step in 0..2_000u32 {
        let offset = random.gen_range(0..=model.len() as u64);
        let data: Vec<u8> = (0..100u32).map(|index| (step.wrapping_mul(7) + index) as u8 | 1).collect();
        insert_range(store, root, offset, 100).unwrap();
        if packed {
            write_in_file(store, root, MODEL_FILE, offset, &data).unwrap();
        } else {
            write(store, root, offset, &data).unwrap();
        }
        model.splice(offset as usize..offset as usize, data);
    }
    model
}

/// 2,000 inserts of 100 bytes at random bytes of a 256 KiB file hold a block each (the bytes
/// of each insert get a block of their own); compaction of the whole file brings the space held
/// within 1.2× of the bytes mapped, keeps every byte, and a second pass finds nothing to do.
/// A range that holds no whole extent is left alone.
#[test]
fn compaction_packs_small_inserts_into_whole_blocks() {
    let mut random = SmallRng::seed_from_u64(5);
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    let model = insert_small_runs(&mut store, &mut root, &mut random, false);
    let before = space_use(&mut store, &root).unwrap();
    assert_eq!(before.mapped_bytes, model.len() as u64);
    assert!(before.amplification() > 5.0, "fragmented: {before:?}");
    // A range inside one extent holds no whole extent: nothing moves.
    let (inside_start, inside_length) = {
        let mut found = None;
        extents(&mut store, &root, &mut |logical, length, _, _| {
            if length > 10 {
                found = Some((logical + 1, length - 2));
            }
            found.is_none()
        })
        .unwrap();
        found.unwrap()
    };
    assert_eq!(compact(&mut store, &mut root, inside_start, inside_length).unwrap(), 0);
    assert_eq!(space_use(&mut store, &root).unwrap(), before);
    let saved = compact(&mut store, &mut root, 0, model.len() as u64).unwrap();
    verify(&mut store, &root, &model, "after compaction");
    let after = space_use(&mut store, &root).unwrap();
    assert_eq!(saved, before.data_blocks - after.data_blocks, "{before:?} -> {after:?}");
    assert!(after.amplification() <= 1.2, "compacted: {after:?}");
    assert!(after.extents < before.extents / 10, "compacted: {after:?}");
    assert_eq!(compact(&mut store, &mut root, 0, model.len() as u64).unwrap(), 0, "nothing left to gain");
    destroy(&mut store, root).unwrap();
    assert_eq!(store.allocated_count(), 0);
}

/// Collapses at random bytes of a reserved (unwritten) file cut its extents inside blocks, and
/// the blocks they cut keep what remains of them; compaction gives the runs new unwritten blocks, writes
/// nothing, and the file stays unwritten zeros within 1.2× of its bytes.
#[test]
fn compaction_of_unwritten_runs_writes_nothing() {
    let mut random = SmallRng::seed_from_u64(9);
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    allocate(&mut store, &mut root, 0, 2 << 20, false).unwrap();
    for _ in 0..500 {
        let length = root.length_bytes();
        let offset = random.gen_range(0..length - 3000);
        collapse_range(&mut store, &mut root, offset, random.gen_range(1..3000)).unwrap();
    }
    let before = space_use(&mut store, &root).unwrap();
    assert!(before.amplification() > 1.3, "fragmented: {before:?}");
    let length = root.length_bytes();
    assert!(compact(&mut store, &mut root, 0, length).unwrap() > 0);
    let model = vec![0u8; root.length_bytes() as usize];
    verify(&mut store, &root, &model, "after compaction");
    let after = space_use(&mut store, &root).unwrap();
    assert!(after.amplification() <= 1.2, "compacted: {after:?}");
    extents(&mut store, &root, &mut |_, _, physical, unwritten| {
        assert!(physical.is_some() && unwritten, "every extent stays unwritten");
        true
    })
    .unwrap();
}

/// The pack-room key of the file in the model tests.
const MODEL_FILE: u64 = 1;

/// Inserts of 100 bytes at random bytes of a file, written as the back end writes them, cut
/// their extents without copying and pack into shared blocks: the file holds little more than
/// its bytes with no compaction. Collapsing the file away piece by piece then frees every block
/// at its last reference, and none before (a block freed at its first reference would be read
/// unallocated or found by `check`).
#[test]
fn small_inserts_pack_into_shared_blocks_and_free_at_the_last_reference() {
    let mut random = SmallRng::seed_from_u64(17);
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    let mut model = insert_small_runs(&mut store, &mut root, &mut random, true);
    verify(&mut store, &root, &model, "after inserts");
    let report = check(&mut store, &root);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // The 64 blocks of the file, each cut many times, and about 50 pack blocks.
    assert!(report.shared_blocks.len() > 100, "{} shared blocks", report.shared_blocks.len());
    let packed = space_use(&mut store, &root).unwrap();
    assert_eq!(packed.mapped_bytes, model.len() as u64);
    // Data blocks within 5% of the bytes (the tree of 4,000 extents adds about 20% here).
    assert!(packed.data_blocks * BLOCK_SIZE_U64 <= packed.mapped_bytes * 21 / 20, "packed: {packed:?}");
    assert!(packed.amplification() <= 1.3, "packed without compaction: {packed:?}");
    assert_eq!(store.allocated_count() as u64, root.blocks_owned());
    // Collapse it all away at random bytes: each block goes with its last reference.
    let mut step = 0;
    while !model.is_empty() {
        let offset = random.gen_range(0..model.len());
        let length = random.gen_range(1..=3000).min(model.len() - offset);
        collapse_range(&mut store, &mut root, offset as u64, length as u64).unwrap();
        model.drain(offset..offset + length);
        step += 1;
        if step % 50 == 0 {
            let report = check(&mut store, &root);
            assert!(report.problems.is_empty(), "step {step}: {:?}", report.problems);
            assert_eq!(store.allocated_count() as u64, root.blocks_owned(), "step {step}");
            verify(&mut store, &root, &model, "while collapsing");
        }
    }
    assert_eq!(root.blocks_owned(), 0);
    assert_eq!(store.allocated_count(), 0, "a shared block outlived its last reference");
    assert!(store.shares.is_empty(), "references recorded for freed blocks: {:?}", store.shares);
}

/// `check` holds every shared block's recorded references against the extents that reference
/// it: fewer recorded is corruption (the block would be freed while mapped), more is a leak;
/// both are listed for the repair, which records the count found.
#[test]
fn check_counts_the_references_of_shared_blocks() {
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    write(&mut store, &mut root, 0, &[9u8; 3 * BLOCK_SIZE]).unwrap();
    // Two inserts inside block 1 of the file: three extents reference it.
    insert_range(&mut store, &mut root, BLOCK_SIZE_U64 + 100, 10).unwrap();
    insert_range(&mut store, &mut root, BLOCK_SIZE_U64 + 2000, 10).unwrap();
    let report = check(&mut store, &root);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let [(shared, 3)] = report.shared_blocks[..] else { panic!("{:?}", report.shared_blocks) };
    for (recorded, what) in [(2, "references recorded"), (0, "references recorded"), (4, "a leak")] {
        store.shares.insert(shared, recorded);
        if recorded == 0 {
            store.shares.remove(&shared);
        }
        let report = check(&mut store, &root);
        assert!(report.problems.iter().any(|problem| problem.contains(what)), "{recorded}: {:?}", report.problems);
        assert_eq!(report.share_mismatches, vec![(shared, 3, recorded)]);
    }
    store.shares.insert(shared, 3);
    // One extent and a count of 2 on its block: a leak too.
    // Collapse from the block's start through the second extent into the third: only the third
    // still references the block.
    collapse_range(&mut store, &mut root, BLOCK_SIZE_U64, 2150).unwrap();
    let report = check(&mut store, &root);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(store.shares.get(&shared), Some(&1), "one reference left, still marked shared");
    store.shares.insert(shared, 2);
    assert_eq!(check(&mut store, &root).share_mismatches, vec![(shared, 1, 2)]);
    store.shares.insert(shared, 1);
    destroy(&mut store, root).unwrap();
    assert_eq!(store.allocated_count(), 0);
    assert!(store.shares.is_empty());
}

/// Cuts inside blocks of a file with room to spare copy the left part's bytes into a new block
/// and leave no count behind (a count is a generation-table entry of the cut block, so cuts at
/// random places of a large file would each dirty a table block of their own for the next
/// checkpoint); once the file holds `1 + 1 / COPY_SLACK_DIVISOR` times its bytes, cuts share
/// blocks instead, so space stays near that bound with no compaction. Collapsing the file away
/// then frees every block, copies and shared ones alike.
#[test]
fn cuts_copy_while_the_file_has_room_and_share_beyond_it() {
    let mut random = SmallRng::seed_from_u64(23);
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    let mut model: Vec<u8> = (0..1 << 20).map(|index| (index % 251) as u8).collect();
    write(&mut store, &mut root, 0, &model).unwrap();
    let mut insert = |store: &mut MemoryStore, root: &mut ExtentRoot, model: &mut Vec<u8>, step: u32| {
        let offset = random.gen_range(0..=model.len() as u64);
        let data: Vec<u8> = (0..100u32).map(|index| (step.wrapping_mul(7) + index) as u8 | 1).collect();
        insert_range(store, root, offset, 100).unwrap();
        write_in_file(store, root, MODEL_FILE, offset, &data).unwrap();
        model.splice(offset as usize..offset as usize, data);
    };
    // 1 MiB with 1/16 to spare: the first few cuts are copies, and no block is shared.
    for step in 0..12 {
        insert(&mut store, &mut root, &mut model, step);
    }
    let report = check(&mut store, &root);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.shared_blocks.is_empty(), "cuts with room shared blocks: {:?}", report.shared_blocks);
    assert!(store.shares.is_empty(), "counts recorded: {:?}", store.shares);
    verify(&mut store, &root, &model, "after copying cuts");
    // Far past the room: cuts share, and the file's data blocks stay within the bound (its tree
    // of about 6,000 extents adds about 10% here).
    for step in 12..3_000 {
        insert(&mut store, &mut root, &mut model, step);
    }
    let report = check(&mut store, &root);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.shared_blocks.len() > 100, "{} shared blocks", report.shared_blocks.len());
    let space = space_use(&mut store, &root).unwrap();
    assert_eq!(space.mapped_bytes, model.len() as u64);
    let bound = space.mapped_bytes + space.mapped_bytes / COPY_SLACK_DIVISOR;
    assert!(space.data_blocks * BLOCK_SIZE_U64 <= bound + 2 * BLOCK_SIZE_U64, "beyond the copy bound: {space:?}");
    assert!(space.amplification() <= 1.2, "{space:?}");
    verify(&mut store, &root, &model, "after sharing cuts");
    while !model.is_empty() {
        let offset = random.gen_range(0..model.len());
        let length = random.gen_range(1..=5000).min(model.len() - offset);
        collapse_range(&mut store, &mut root, offset as u64, length as u64).unwrap();
        model.drain(offset..offset + length);
    }
    assert_eq!(root.blocks_owned(), 0);
    assert_eq!(store.allocated_count(), 0, "a block outlived its last reference");
    assert!(store.shares.is_empty(), "references recorded for freed blocks: {:?}", store.shares);
}

/// One random change of a `FileRun`'s kinds, with what it does to the model: inserts of data
/// (a hole, then its bytes, as the back end logs them), collapses and punches at any byte.
fn random_run_changes(random: &mut SmallRng, model: &mut Vec<u8>, step: u32) -> Vec<(u8, u64, u64, Vec<u8>)> {
    let size = model.len() as u64;
    match random.gen_range(0..10) {
        0..=4 => {
            let offset = random.gen_range(0..=size);
            let length = if random.gen_bool(0.5) { random.gen_range(1..=300) } else { random.gen_range(1..=6000) };
            let data: Vec<u8> = (0..length as u32).map(|index| (step.wrapping_mul(31) ^ index) as u8 | 1).collect();
            model.splice(offset as usize..offset as usize, data.iter().copied());
            // As two records (before format version 10) or one.
            if random.gen_bool(0.5) {
                vec![(0, offset, length, Vec::new()), (1, offset, length, data)]
            } else {
                vec![(4, offset, length, data)]
            }
        }
        5..=7 if size > 1 => {
            let offset = random.gen_range(0..size);
            let length = random.gen_range(1..=5000).min(size - offset);
            model.drain(offset as usize..(offset + length) as usize);
            vec![(2, offset, length, Vec::new())]
        }
        _ if size > 1 => {
            let offset = random.gen_range(0..size);
            let length = random.gen_range(1..=9000).min(size - offset);
            model[offset as usize..(offset + length) as usize].fill(0);
            vec![(3, offset, length, Vec::new())]
        }
        _ => Vec::new(),
    }
}

fn run_change_of(change: &(u8, u64, u64, Vec<u8>)) -> FileChange<'_> {
    let (kind, offset, length_bytes, data) = change;
    let (offset, length_bytes) = (*offset, *length_bytes);
    match kind {
        0 => FileChange::Insert { offset, length_bytes },
        1 => FileChange::Write { offset, data },
        2 => FileChange::Collapse { offset, length_bytes },
        3 => FileChange::PunchHole { offset, length_bytes },
        _ => FileChange::InsertData { offset, data },
    }
}

/// Changes applied in runs (`FileRun`, one tree open and one commit per run, as the back end
/// applies the data records of one file in a row) leave the bytes, the counts of shared blocks
/// and the blocks owned that the same changes leave applied one by one: seeds 0–3, 1,500 rounds
/// of inserts of data, collapses and punches at any byte of a 256 KiB file, in runs of 1–40
/// changes, checked against the model (and `check`, which counts every block's references)
/// after every run; the same changes one by one on a second store must give the same bytes.
/// A run writes each node it changed once: fewer node writes than one by one.
#[test]
fn runs_of_changes_leave_what_the_changes_one_by_one_leave() {
    for seed in 0..4u64 {
        println!("extent run test: seed {seed}");
        let mut random = SmallRng::seed_from_u64(seed);
        let initial: Vec<u8> = (0..256 * 1024).map(|index| (index % 251) as u8 | 1).collect();
        let mut batched = CountingStore { inner: MemoryStore::new(), reads: 0, writes: 0, fresh_writes: 0 };
        let mut single = CountingStore { inner: MemoryStore::new(), reads: 0, writes: 0, fresh_writes: 0 };
        let (mut batched_root, mut single_root) = (ExtentRoot::empty(), ExtentRoot::empty());
        write(&mut batched, &mut batched_root, 0, &initial).unwrap();
        write(&mut single, &mut single_root, 0, &initial).unwrap();
        let (batched_writes, single_writes) = (batched.writes, single.writes);
        let mut model = initial;
        let mut step = 0u32;
        while step < 1_500 {
            let length = random.gen_range(1..=40);
            let mut run = FileRun::open(&batched_root, MODEL_FILE);
            for _ in 0..length {
                step += 1;
                for change in random_run_changes(&mut random, &mut model, step) {
                    run.apply(&mut batched, run_change_of(&change)).unwrap();
                    match run_change_of(&change) {
                        FileChange::Insert { offset, length_bytes } => {
                            insert_range(&mut single, &mut single_root, offset, length_bytes)
                        }
                        FileChange::Write { offset, data } => {
                            write_in_file(&mut single, &mut single_root, MODEL_FILE, offset, data)
                        }
                        FileChange::Collapse { offset, length_bytes } => {
                            collapse_range(&mut single, &mut single_root, offset, length_bytes)
                        }
                        FileChange::PunchHole { offset, length_bytes } => {
                            punch_hole(&mut single, &mut single_root, offset, length_bytes)
                        }
                        FileChange::InsertData { offset, data } => {
                            insert_data(&mut single, &mut single_root, MODEL_FILE, offset, data)
                        }
                    }
                    .unwrap();
                }
            }
            batched_root = run.commit(&mut batched).unwrap();
            verify(&mut batched.inner, &batched_root, &model, &format!("seed {seed} step {step}, in runs"));
        }
        verify(&mut single.inner, &single_root, &model, &format!("seed {seed}, one by one"));
        let (batched_writes, single_writes) = (batched.writes - batched_writes, single.writes - single_writes);
        println!("node writes: {batched_writes} in runs, {single_writes} one by one");
        assert!(
            batched_writes * 3 < single_writes * 2,
            "{batched_writes} node writes in runs, {single_writes} one by one"
        );
        destroy(&mut batched, batched_root).unwrap();
        assert_eq!(batched.inner.allocated_count(), 0, "seed {seed}: blocks left after destroy");
        assert!(batched.inner.shares.is_empty(), "seed {seed}: counts left after destroy");
    }
}

/// A run that collapses away the last run of its pack block and then packs another small run
/// must not offer the freed block's room (one change at a time, commit makes the store forget
/// it; a run commits later): the second run goes to a new pack block.
#[test]
fn a_run_forgets_the_room_of_a_pack_block_it_freed() {
    let mut store = MemoryStore::new();
    let mut root = ExtentRoot::empty();
    let mut model: Vec<u8> = (0..64 * 1024).map(|index| (index % 249) as u8 | 1).collect();
    write(&mut store, &mut root, 0, &model).unwrap();
    let (first, second) = ([7u8; 100], [9u8; 100]);
    let mut run = FileRun::open(&root, MODEL_FILE);
    // At a block boundary: no cut, and the extent before is full, so the bytes are packed.
    run.apply(&mut store, FileChange::Insert { offset: 8192, length_bytes: 100 }).unwrap();
    run.apply(&mut store, FileChange::Write { offset: 8192, data: &first }).unwrap();
    run.apply(&mut store, FileChange::Collapse { offset: 8192, length_bytes: 100 }).unwrap();
    run.apply(&mut store, FileChange::Insert { offset: 16384, length_bytes: 100 }).unwrap();
    run.apply(&mut store, FileChange::Write { offset: 16384, data: &second }).unwrap();
    root = run.commit(&mut store).unwrap();
    model.splice(16384..16384, second);
    verify(&mut store, &root, &model, "after the run");
    destroy(&mut store, root).unwrap();
    assert_eq!(store.allocated_count(), 0);
}

/// An insert of data in one change (`insert_data`, the record of format version 10) leaves
/// what an insert of a hole and a write of the bytes into it (two records before) leave: the
/// same bytes, blocks and counts, with the same cut (copied while the file has room, shared
/// beyond), fill (an extent's room, the pack block or new blocks) and merges, in seeds 0-3 of
/// 800 inserts of 1-6000 bytes at any byte of a 256 KiB file and collapses between them; and
/// it reads fewer tree nodes (one search of the tree instead of two changes).
#[test]
fn an_insert_of_data_leaves_what_a_hole_and_its_write_leave() {
    for seed in 0..4u64 {
        let mut random = SmallRng::seed_from_u64(seed);
        let initial: Vec<u8> = (0..256 * 1024).map(|index| (index % 247) as u8 | 1).collect();
        let mut one = CountingStore { inner: MemoryStore::new(), reads: 0, writes: 0, fresh_writes: 0 };
        let mut two = CountingStore { inner: MemoryStore::new(), reads: 0, writes: 0, fresh_writes: 0 };
        let (mut one_root, mut two_root) = (ExtentRoot::empty(), ExtentRoot::empty());
        write(&mut one, &mut one_root, 0, &initial).unwrap();
        write(&mut two, &mut two_root, 0, &initial).unwrap();
        let (one_reads, two_reads) = (one.reads, two.reads);
        let mut model = initial;
        for step in 0..800u32 {
            let size = model.len() as u64;
            if step % 4 == 3 && size > 1 {
                let offset = random.gen_range(0..size);
                let length = random.gen_range(1..=4000).min(size - offset);
                model.drain(offset as usize..(offset + length) as usize);
                collapse_range(&mut one, &mut one_root, offset, length).unwrap();
                collapse_range(&mut two, &mut two_root, offset, length).unwrap();
                continue;
            }
            let offset = random.gen_range(0..=size);
            let length = if random.gen_bool(0.5) { random.gen_range(1..=300) } else { random.gen_range(1..=6000) };
            let data: Vec<u8> = (0..length as u32).map(|index| (step.wrapping_mul(37) ^ index) as u8 | 1).collect();
            model.splice(offset as usize..offset as usize, data.iter().copied());
            insert_data(&mut one, &mut one_root, MODEL_FILE, offset, &data).unwrap();
            insert_range(&mut two, &mut two_root, offset, length).unwrap();
            write_in_file(&mut two, &mut two_root, MODEL_FILE, offset, &data).unwrap();
            let context = format!("seed {seed} step {step}");
            assert_eq!(one_root.blocks_owned(), two_root.blocks_owned(), "{context}: blocks owned");
            assert_eq!(one.inner.allocated_count(), two.inner.allocated_count(), "{context}: blocks allocated");
            assert_eq!(one.inner.shares, two.inner.shares, "{context}: counts of shared blocks");
            assert_eq!(one.fresh_writes, two.fresh_writes, "{context}: writes into fresh blocks");
            if step % 50 == 0 {
                verify(&mut one.inner, &one_root, &model, &format!("{context}, one change"));
                verify(&mut two.inner, &two_root, &model, &format!("{context}, two changes"));
            }
        }
        verify(&mut one.inner, &one_root, &model, &format!("seed {seed}, one change"));
        let (one_reads, two_reads) = (one.reads - one_reads, two.reads - two_reads);
        println!("seed {seed}: node reads {one_reads} in one change, {two_reads} in two");
        assert!(one_reads < two_reads, "seed {seed}: {one_reads} node reads in one change, {two_reads} in two");
        // Past the end: an error that changes nothing, as insert_range's.
        let before = one_root;
        assert!(insert_data(&mut one, &mut one_root, MODEL_FILE, model.len() as u64 + 1, b"x").is_err());
        assert!(one_root == before);
        destroy(&mut one, one_root).unwrap();
        assert_eq!(one.inner.allocated_count(), 0, "seed {seed}: blocks left after destroy");
        assert!(one.inner.shares.is_empty(), "seed {seed}: counts left after destroy");
    }
}
