//! On-disk encoding of the FlexTree: the 64-byte root kept in the inode, the node header and
//! the two kinds of 16-byte entries. Every offset and size is defined here once; `docs/EXTENTS.md`
//! carries the same tables.

use crate::block::meta::{BlockBuf, BLOCK_SIZE, BLOCK_SIZE_U64, META_PAYLOAD_BYTES};
use crate::error::{Error, Result};

/// Bytes of the root area in the inode.
pub const EXTENT_ROOT_BYTES: usize = 64;
/// Largest logical file length. Leaves room below 2^63 so that every sum of lengths and every
/// `offset + length` a caller may pass stays far from overflow.
pub const MAX_FILE_BYTES: u64 = 1 << 60;
/// Physical byte addresses stay below this, so that `address + length` never overflows and a
/// block number always fits the allocator's range.
pub const MAX_PHYSICAL_BYTE_ADDRESS: u64 = 1 << 62;
/// Tree block numbers stay below this (the block of the largest physical byte address).
pub const MAX_BLOCK_NUMBER: u64 = MAX_PHYSICAL_BYTE_ADDRESS / BLOCK_SIZE_U64;
/// Levels below the root. With at least 63 entries per non-root node, 8 levels address far more
/// extents than a file of `MAX_FILE_BYTES` can hold; the bound exists so that a corrupt depth
/// cannot make a walk run long.
pub const MAX_DEPTH: usize = 8;

// Root area (in the inode).
/// Low 4 bits: depth (levels of tree blocks below the root, at most `MAX_DEPTH`); high 4 bits:
/// entries in use (at most `ROOT_CAPACITY`).
pub const ROOT_SHAPE_OFFSET: usize = 0;
/// Blocks owned (data + tree), 56 bits: enough for `MAX_BLOCK_NUMBER`.
pub const ROOT_BLOCKS_OFFSET: usize = 1;
pub const ROOT_BLOCKS_BYTES: usize = 7;
pub const ROOT_ENTRIES_OFFSET: usize = 8;
/// Entries the root area holds: extents when the depth is 0, child pointers otherwise. Three
/// inline extents cover the common small sparse file (data, hole, data) without a tree block.
pub const ROOT_CAPACITY: usize = 3;
pub const ROOT_LENGTH_OFFSET: usize = ROOT_ENTRIES_OFFSET + ROOT_CAPACITY * ENTRY_BYTES;

// Node header (start of every tree block).
pub const NODE_COUNT_OFFSET: usize = 0;
pub const NODE_LEVEL_OFFSET: usize = 2;
pub const NODE_RESERVED_OFFSET: usize = 4;
pub const NODE_LENGTH_OFFSET: usize = 8;
pub const NODE_HEADER_BYTES: usize = 16;

// Entries (leaf and internal have the same size and the same field positions).
pub const ENTRY_BYTES: usize = 16;
/// Leaf: physical byte address of the extent's first byte (0: hole). Internal: child block.
pub const ENTRY_ADDRESS_OFFSET: usize = 0;
/// Leaf: length in bytes plus flags. Internal: length in bytes of the child's subtree.
pub const ENTRY_LENGTH_OFFSET: usize = 8;
/// Leaf flag: blocks are reserved but read as zeros.
pub const ENTRY_UNWRITTEN_FLAG: u64 = 1 << 63;
/// Bits that hold the length; the bits between it and the flag are reserved and must be zero.
pub const ENTRY_LENGTH_MASK: u64 = (1 << 61) - 1;

/// Entries per tree block: (4064 - 16) / 16 = 253.
pub const NODE_CAPACITY: usize = (META_PAYLOAD_BYTES - NODE_HEADER_BYTES) / ENTRY_BYTES;
/// Entries a node may gain over `NODE_CAPACITY` in one change before it is split (a cut of one
/// extent into three pieces, plus a neighbour): room a node's entries are allocated with, so
/// that a change does not reallocate them. Only a capacity hint, never a bound.
pub const NODE_GROWTH_ROOM: usize = 4;
/// A non-root node below this many entries is merged with or refilled from a sibling.
pub const NODE_MIN_ENTRIES: usize = NODE_CAPACITY / 4;

// The layout fits its space; checked when the crate is built.
const _: () = assert!(NODE_HEADER_BYTES + NODE_CAPACITY * ENTRY_BYTES <= META_PAYLOAD_BYTES);
const _: () = assert!(ROOT_LENGTH_OFFSET + 8 == EXTENT_ROOT_BYTES);
const _: () = assert!(MAX_FILE_BYTES <= ENTRY_LENGTH_MASK);
const _: () = assert!(MAX_BLOCK_NUMBER <= 1 << (8 * ROOT_BLOCKS_BYTES));
const _: () = assert!(BLOCK_SIZE_U64.is_power_of_two());

/// One extent (in a leaf) or one child pointer (in an internal node), decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Bytes of file the entry covers.
    pub length: u64,
    /// Leaf: physical byte address, 0 for a hole. Internal: child block number.
    pub address: u64,
    /// Leaf only: blocks reserved, contents read as zeros.
    pub unwritten: bool,
}

impl Entry {
    pub fn hole(length: u64) -> Entry {
        assert!(length > 0 && length <= MAX_FILE_BYTES);
        Entry { length, address: 0, unwritten: false }
    }
    pub fn data(address: u64, length: u64, unwritten: bool) -> Entry {
        assert!(address >= BLOCK_SIZE_U64 && length > 0 && address + length <= MAX_PHYSICAL_BYTE_ADDRESS);
        Entry { length, address, unwritten }
    }
    pub fn child(block: u64, length: u64) -> Entry {
        assert!(block != 0 && block < MAX_BLOCK_NUMBER);
        Entry { length, address: block, unwritten: false }
    }
    pub fn is_hole(&self) -> bool {
        self.address == 0
    }
    /// The data blocks an extent owns: (first, count); None for a hole.
    pub fn blocks(&self) -> Option<(u64, u64)> {
        if self.is_hole() {
            return None;
        }
        let first = self.address / BLOCK_SIZE_U64;
        let last = (self.address + self.length - 1) / BLOCK_SIZE_U64;
        Some((first, last - first + 1))
    }

    pub fn encode(&self, leaf: bool, bytes: &mut [u8]) {
        assert_eq!(bytes.len(), ENTRY_BYTES);
        assert!(self.length <= ENTRY_LENGTH_MASK);
        let mut length_field = self.length;
        if leaf && self.unwritten {
            length_field |= ENTRY_UNWRITTEN_FLAG;
        }
        bytes[ENTRY_ADDRESS_OFFSET..ENTRY_ADDRESS_OFFSET + 8].copy_from_slice(&self.address.to_le_bytes());
        bytes[ENTRY_LENGTH_OFFSET..ENTRY_LENGTH_OFFSET + 8].copy_from_slice(&length_field.to_le_bytes());
    }

    /// Decodes and validates one entry; `place` names where it came from for the error.
    pub fn decode(bytes: &[u8], leaf: bool, place: &dyn Fn() -> String) -> Result<Entry> {
        assert_eq!(bytes.len(), ENTRY_BYTES);
        let address = read_u64(bytes, ENTRY_ADDRESS_OFFSET);
        let length_field = read_u64(bytes, ENTRY_LENGTH_OFFSET);
        let unwritten = leaf && length_field & ENTRY_UNWRITTEN_FLAG != 0;
        let flags_allowed = if leaf { ENTRY_UNWRITTEN_FLAG } else { 0 };
        if length_field & !ENTRY_LENGTH_MASK & !flags_allowed != 0 {
            return Err(Error::corruption(format!("{}: reserved length bits set ({length_field:#x})", place())));
        }
        let length = length_field & ENTRY_LENGTH_MASK;
        if length == 0 || length > MAX_FILE_BYTES {
            return Err(Error::corruption(format!("{}: length {length} out of range", place())));
        }
        if leaf {
            if address == 0 && unwritten {
                return Err(Error::corruption(format!("{}: hole marked unwritten", place())));
            }
            if address != 0
                && (address < BLOCK_SIZE_U64
                    || !matches!(address.checked_add(length), Some(end) if end <= MAX_PHYSICAL_BYTE_ADDRESS))
            {
                return Err(Error::corruption(format!(
                    "{}: physical address {address} length {length} out of range",
                    place()
                )));
            }
        } else if address == 0 || address >= MAX_BLOCK_NUMBER {
            return Err(Error::corruption(format!("{}: child block {address} out of range", place())));
        }
        Ok(Entry { length, address, unwritten })
    }
}

pub fn read_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}
pub fn read_u16(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes(bytes[offset..offset + 2].try_into().expect("2 bytes"))
}

/// Sums entry lengths; None on overflow (only possible for corrupt input).
pub fn sum_lengths(entries: &[Entry]) -> Option<u64> {
    entries.iter().try_fold(0u64, |sum, entry| sum.checked_add(entry.length))
}

/// Encodes a tree node into a new metadata block; returns the block and the node's length (the
/// sum of its entries' lengths, which the header holds). The header and the entries are
/// appended to an empty buffer and only the bytes after them are zeroed: a node is encoded at
/// every commit that changes it, and a zeroed 4 KiB buffer written again from its start was a
/// quarter of a collapse's commit (perf, `flex_probe` under the bench's allocator). The trailer's
/// bytes are zero too; the store writes them when it seals the block.
pub fn encode_node(level: usize, entries: &[Entry]) -> (BlockBuf, u64) {
    assert!(entries.len() <= NODE_CAPACITY && level <= MAX_DEPTH);
    // The header's fields are appended in the order of their offsets.
    const _: () = assert!(
        NODE_COUNT_OFFSET == 0 && NODE_LEVEL_OFFSET == 2 && NODE_RESERVED_OFFSET == 4 && NODE_LENGTH_OFFSET == 8
    );
    let length = sum_lengths(entries).expect("node length fits");
    let mut bytes = Vec::with_capacity(BLOCK_SIZE);
    bytes.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&(level as u16).to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&length.to_le_bytes());
    debug_assert_eq!(bytes.len(), NODE_HEADER_BYTES);
    let mut entry_bytes = [0u8; ENTRY_BYTES];
    for entry in entries {
        entry.encode(level == 0, &mut entry_bytes);
        bytes.extend_from_slice(&entry_bytes);
    }
    bytes.resize(BLOCK_SIZE, 0);
    let block: BlockBuf = bytes.into_boxed_slice().try_into().expect("a buffer of BLOCK_SIZE bytes");
    (block, length)
}

/// Decodes and validates a tree node read from block `block_number`, which its parent says is at
/// `level` and covers `expected_length` bytes.
pub fn decode_node(block: &[u8], block_number: u64, level: usize, expected_length: u64) -> Result<Vec<Entry>> {
    let count = read_u16(block, NODE_COUNT_OFFSET) as usize;
    let stored_level = read_u16(block, NODE_LEVEL_OFFSET) as usize;
    let reserved =
        u32::from_le_bytes(block[NODE_RESERVED_OFFSET..NODE_RESERVED_OFFSET + 4].try_into().expect("4 bytes"));
    let stored_length = read_u64(block, NODE_LENGTH_OFFSET);
    let name = |field: &str| format!("extent node {block_number} field {field}");
    if count == 0 || count > NODE_CAPACITY {
        return Err(Error::corruption(format!(
            "{}: {count} entries, 1..={NODE_CAPACITY} allowed",
            name("entry_count")
        )));
    }
    if stored_level != level {
        return Err(Error::corruption(format!("{}: level {stored_level}, parent expects {level}", name("level"))));
    }
    if reserved != 0 {
        return Err(Error::corruption(format!("{}: {reserved:#x}, must be zero", name("reserved"))));
    }
    if stored_length != expected_length {
        return Err(Error::corruption(format!(
            "{}: {stored_length} bytes, parent entry says {expected_length}",
            name("subtree_length_bytes")
        )));
    }
    // With room for a change (`NODE_GROWTH_ROOM`): the extent tree changes these entries in
    // place when it takes them over from the store.
    let mut entries = Vec::with_capacity(NODE_CAPACITY + NODE_GROWTH_ROOM);
    for index in 0..count {
        let start = NODE_HEADER_BYTES + index * ENTRY_BYTES;
        let place = || format!("extent node {block_number} entry {index}");
        entries.push(Entry::decode(&block[start..start + ENTRY_BYTES], level == 0, &place)?);
    }
    if sum_lengths(&entries) != Some(stored_length) {
        return Err(Error::corruption(format!("{}: entry lengths do not add up to {stored_length}", name("entries"))));
    }
    Ok(entries)
}

/// The extent map's root, stored in 64 bytes of the file's inode. With depth 0 it holds up to
/// two extents itself, so small files cost no tree block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentRoot {
    pub(crate) depth: u8,
    pub(crate) count: u8,
    pub(crate) entries: [Entry; ROOT_CAPACITY],
    pub(crate) length_bytes: u64,
    pub(crate) blocks_owned: u64,
}

impl Default for ExtentRoot {
    fn default() -> ExtentRoot {
        ExtentRoot::empty()
    }
}

impl ExtentRoot {
    /// The root of an empty file: all 64 bytes zero.
    pub fn empty() -> ExtentRoot {
        ExtentRoot { depth: 0, count: 0, entries: [Entry::default(); ROOT_CAPACITY], length_bytes: 0, blocks_owned: 0 }
    }
    /// Logical file length in bytes.
    pub fn length_bytes(&self) -> u64 {
        self.length_bytes
    }
    /// Data blocks plus tree blocks this file owns (for st_blocks and statfs).
    pub fn blocks_owned(&self) -> u64 {
        self.blocks_owned
    }
    /// Tree levels below the root (0: the extents are inline).
    pub fn depth(&self) -> usize {
        self.depth as usize
    }
    pub(crate) fn root_entries(&self) -> &[Entry] {
        &self.entries[..self.count as usize]
    }
    pub(crate) fn from_parts(depth: usize, entries: &[Entry], length_bytes: u64, blocks_owned: u64) -> ExtentRoot {
        assert!(depth <= MAX_DEPTH && entries.len() <= ROOT_CAPACITY);
        assert!(depth == 0 || !entries.is_empty());
        assert_eq!(sum_lengths(entries), Some(length_bytes));
        let mut root = ExtentRoot::empty();
        root.depth = depth as u8;
        root.count = entries.len() as u8;
        root.entries[..entries.len()].copy_from_slice(entries);
        root.length_bytes = length_bytes;
        root.blocks_owned = blocks_owned;
        root
    }

    pub fn encode(&self) -> [u8; EXTENT_ROOT_BYTES] {
        let mut bytes = [0u8; EXTENT_ROOT_BYTES];
        assert!(self.blocks_owned < MAX_BLOCK_NUMBER);
        bytes[ROOT_SHAPE_OFFSET] = self.depth | (self.count << 4);
        bytes[ROOT_BLOCKS_OFFSET..ROOT_BLOCKS_OFFSET + ROOT_BLOCKS_BYTES]
            .copy_from_slice(&self.blocks_owned.to_le_bytes()[..ROOT_BLOCKS_BYTES]);
        bytes[ROOT_LENGTH_OFFSET..ROOT_LENGTH_OFFSET + 8].copy_from_slice(&self.length_bytes.to_le_bytes());
        for (index, entry) in self.root_entries().iter().enumerate() {
            let start = ROOT_ENTRIES_OFFSET + index * ENTRY_BYTES;
            entry.encode(self.depth == 0, &mut bytes[start..start + ENTRY_BYTES]);
        }
        bytes
    }

    /// Decodes and validates a root read from an inode.
    pub fn decode(bytes: &[u8; EXTENT_ROOT_BYTES]) -> Result<ExtentRoot> {
        let depth = (bytes[ROOT_SHAPE_OFFSET] & 0x0f) as usize;
        let count = (bytes[ROOT_SHAPE_OFFSET] >> 4) as usize;
        if depth > MAX_DEPTH {
            return Err(Error::corruption(format!("extent root field depth: {depth}, at most {MAX_DEPTH}")));
        }
        if count > ROOT_CAPACITY || (depth > 0 && count == 0) {
            return Err(Error::corruption(format!("extent root field entry_count: {count} at depth {depth}")));
        }
        let length_bytes = read_u64(bytes, ROOT_LENGTH_OFFSET);
        let mut blocks_field = [0u8; 8];
        blocks_field[..ROOT_BLOCKS_BYTES]
            .copy_from_slice(&bytes[ROOT_BLOCKS_OFFSET..ROOT_BLOCKS_OFFSET + ROOT_BLOCKS_BYTES]);
        let blocks_owned = u64::from_le_bytes(blocks_field);
        if length_bytes > MAX_FILE_BYTES {
            return Err(Error::corruption(format!("extent root field length_bytes: {length_bytes} over the limit")));
        }
        if blocks_owned >= MAX_BLOCK_NUMBER {
            return Err(Error::corruption(format!("extent root field blocks_owned: {blocks_owned} out of range")));
        }
        let mut entries = [Entry::default(); ROOT_CAPACITY];
        for (index, slot) in entries.iter_mut().enumerate() {
            let start = ROOT_ENTRIES_OFFSET + index * ENTRY_BYTES;
            let raw = &bytes[start..start + ENTRY_BYTES];
            if index >= count {
                if raw.iter().any(|byte| *byte != 0) {
                    return Err(Error::corruption(format!("extent root entry {index}: unused slot not zero")));
                }
                continue;
            }
            let place = || format!("extent root entry {index}");
            *slot = Entry::decode(raw, depth == 0, &place)?;
        }
        if sum_lengths(&entries[..count]) != Some(length_bytes) {
            return Err(Error::corruption(format!(
                "extent root field length_bytes: {length_bytes} differs from the sum of its entries"
            )));
        }
        Ok(ExtentRoot { depth: depth as u8, count: count as u8, entries, length_bytes, blocks_owned })
    }
}
