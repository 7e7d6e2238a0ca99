//! On-disk layout of directories: the root kept in the inode, leaf blocks, entries, dummy
//! entries, index blocks. Every offset and size is defined here once; `docs/DIRECTORIES.md`
//! has the same tables in words. All integers little-endian.

use crate::block::meta::{BlockBuf, META_PAYLOAD_BYTES};
use crate::error::{Error, Result};

// ---- DirRoot (64 bytes in the inode) ----
pub const DIR_ROOT_BYTES: usize = 64;
pub const ROOT_MAGIC: u32 = 0x5244_5444; // "DTDR"
pub const ROOT_VERSION: u16 = 1;
pub const ROOT_MAGIC_OFFSET: usize = 0;
pub const ROOT_VERSION_OFFSET: usize = 4;
pub const ROOT_INDEX_DEPTH_OFFSET: usize = 6;
pub const ROOT_FIRST_LEAF_OFFSET: usize = 8;
pub const ROOT_INDEX_ROOT_OFFSET: usize = 16;
pub const ROOT_ENTRY_COUNT_OFFSET: usize = 24;
pub const ROOT_REGION_COUNT_OFFSET: usize = 32;
pub const ROOT_LEAF_COUNT_OFFSET: usize = 40;
pub const ROOT_INDEX_BLOCK_COUNT_OFFSET: usize = 48;
pub const ROOT_RESERVED_OFFSET: usize = 56;
pub const ROOT_RESERVED_BYTES: usize = 8;

// ---- positions ----
/// A position in the list is `block_number << POSITION_SLOT_BITS | slot`; 0 is "none".
pub const POSITION_SLOT_BITS: u32 = 8;
pub const SLOT_BYTES: usize = 16;
/// 16-byte slots of a block's payload: 4064 / 16.
pub const SLOTS_PER_BLOCK: usize = META_PAYLOAD_BYTES / SLOT_BYTES;
/// Largest block number a position can carry.
pub const MAX_POSITION_BLOCK: u64 = u64::MAX >> POSITION_SLOT_BITS;

// ---- leaf block header ----
pub const LEAF_MAGIC: u32 = 0x3146_4C44; // "DLF1"
pub const LEAF_HEADER_BYTES: usize = 64;
pub const LEAF_MAGIC_OFFSET: usize = 0;
pub const LEAF_USED_SLOTS_OFFSET: usize = 4;
pub const LEAF_RESERVED_OFFSET: usize = 6;
pub const LEAF_NEXT_OFFSET: usize = 8;
pub const LEAF_PREVIOUS_OFFSET: usize = 16;
pub const LEAF_INDEX_ROOT_OFFSET: usize = 24;
pub const LEAF_BITMAP_OFFSET: usize = 32;
pub const LEAF_BITMAP_BYTES: usize = 32;
/// The first slot after the header; the head dummy of a directory sits here in its first leaf.
pub const FIRST_ENTRY_SLOT: usize = LEAF_HEADER_BYTES / SLOT_BYTES;
/// Slots entries may use.
pub const ENTRY_SLOTS_PER_LEAF: usize = SLOTS_PER_BLOCK - FIRST_ENTRY_SLOT;

// ---- entry and dummy entry ----
pub const ENTRY_KEY_OFFSET: usize = 0;
pub const ENTRY_NEXT_OFFSET: usize = 8;
/// Inode number for an entry, member count for a dummy.
pub const ENTRY_INODE_OFFSET: usize = 16;
pub const ENTRY_NAME_LENGTH_OFFSET: usize = 24;
pub const ENTRY_FILE_TYPE_OFFSET: usize = 25;
pub const ENTRY_KIND_OFFSET: usize = 26;
pub const ENTRY_NAME_OFFSET: usize = 27;
pub const ENTRY_KIND_NAME: u8 = 1;
pub const ENTRY_KIND_DUMMY: u8 = 2;
pub const MAX_NAME_BYTES: usize = 255;
/// A dummy is an entry header with no name, rounded up to whole slots.
pub const DUMMY_BYTES: usize = 32;

// ---- index block ----
pub const INDEX_MAGIC: u32 = 0x3158_4944; // "DIX1"
pub const INDEX_HEADER_BYTES: usize = 16;
pub const INDEX_MAGIC_OFFSET: usize = 0;
pub const INDEX_LEVEL_OFFSET: usize = 4;
pub const INDEX_COUNT_OFFSET: usize = 6;
pub const INDEX_RESERVED_OFFSET: usize = 8;
pub const INDEX_ENTRY_BYTES: usize = 16;
pub const INDEX_ENTRY_HASH_OFFSET: usize = 0;
pub const INDEX_ENTRY_RESERVED_OFFSET: usize = 4;
pub const INDEX_ENTRY_TARGET_OFFSET: usize = 8;
pub const INDEX_CAPACITY: usize = (META_PAYLOAD_BYTES - INDEX_HEADER_BYTES) / INDEX_ENTRY_BYTES;

// ---- behaviour ----
/// A region with this many members splits: 256, as GPU4FS has it and the engine issue asks.
/// Every insert, remove and lookup walks its region from the dummy to the name's place, about
/// half the region (~95 records here). Measured in November 2026, regions of 64 would halve the
/// back end's instructions per create (`examples/backend_cost`); the limits are behaviour, not
/// format, so a volume stays valid under either.
pub const REGION_SPLIT_ENTRIES: u64 = 256;
/// Two neighbouring regions with at most this many members together merge (half the split
/// size, so a merged region takes 128 inserts before it splits again).
pub const REGION_MERGE_ENTRIES: u64 = 128;
/// Index blocks other than the root are rebalanced with a sibling below this many entries.
pub const INDEX_MIN_ENTRIES: usize = INDEX_CAPACITY / 4;
/// Deepest index accepted on read. The code has no depth limit; this bound follows from the
/// format: at most 2^31 regions (one per 31-bit hash), and every index block but the root
/// holds at least INDEX_MIN_ENTRIES (63) entries, so ceil(31 / log2(63)) + 1 = 7 levels suffice.
/// Twice that leaves a margin; anything deeper can only be corruption.
pub const MAX_INDEX_DEPTH: u16 = 14;
/// Cookies 0, 1 and 2 stand for "start", "." and ".."; entries of hash 0 take tiebreaks from 3.
pub const FIRST_FREE_COOKIE: u64 = 3;

/// Slots an entry with a name of `name_length` bytes takes.
pub fn entry_slots(name_length: usize) -> usize {
    (ENTRY_NAME_OFFSET + name_length).div_ceil(SLOT_BYTES)
}

/// The 64-bit ordering key of an entry, also its readdir cookie: the 31 significant bits of the
/// major hash (its lowest bit is always clear), then a 32-bit tiebreak. Below 2^63 so that the
/// cookie is a positive `off_t`.
pub fn make_key(order_hash: u32, tiebreak: u32) -> u64 {
    assert!(order_hash < 1 << 31);
    ((order_hash as u64) << 32) | tiebreak as u64
}
pub fn key_hash(key: u64) -> u32 {
    (key >> 32) as u32
}
/// The hash entries are ordered by: the major half-MD4 hash without its always-zero low bit.
pub fn order_hash(major: u32) -> u32 {
    major >> 1
}

pub fn make_position(block_number: u64, slot: usize) -> u64 {
    assert!(block_number != 0 && block_number <= MAX_POSITION_BLOCK);
    assert!((FIRST_ENTRY_SLOT..SLOTS_PER_BLOCK).contains(&slot));
    (block_number << POSITION_SLOT_BITS) | slot as u64
}
/// Whether a position read from disk names a block and an entry slot.
#[inline]
pub fn position_is_valid(position: u64) -> bool {
    let slot = (position & ((1 << POSITION_SLOT_BITS) - 1)) as usize;
    position >> POSITION_SLOT_BITS != 0 && (FIRST_ENTRY_SLOT..SLOTS_PER_BLOCK).contains(&slot)
}

/// Splits a position read from disk; `what` names where it came from for the error.
#[inline]
pub fn split_position(position: u64, what: &dyn Fn() -> String) -> Result<(u64, usize)> {
    let block_number = position >> POSITION_SLOT_BITS;
    let slot = (position & ((1 << POSITION_SLOT_BITS) - 1)) as usize;
    if block_number == 0 || !(FIRST_ENTRY_SLOT..SLOTS_PER_BLOCK).contains(&slot) {
        return Err(Error::corruption(format!("{}: position {position:#x} is not a valid entry position", what())));
    }
    Ok((block_number, slot))
}

pub fn read_u16(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes(bytes[offset..offset + 2].try_into().unwrap())
}
pub fn read_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}
pub fn read_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}
pub fn write_u16(bytes: &mut [u8], offset: usize, value: u16) {
    bytes[offset..offset + 2].copy_from_slice(&value.to_le_bytes());
}
pub fn write_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}
pub fn write_u64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

/// The directory's root, kept in its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirRoot {
    /// First leaf block; holds the head dummy (region of hash 0) at `FIRST_ENTRY_SLOT`.
    pub first_leaf: u64,
    /// Root index block, 0 while the directory is one region.
    pub index_root: u64,
    /// Levels of index blocks (0: no index).
    pub index_depth: u16,
    pub entry_count: u64,
    /// Regions, i.e. dummy entries, the head dummy included.
    pub region_count: u64,
    pub leaf_count: u64,
    pub index_block_count: u64,
}

impl DirRoot {
    pub fn encode(&self) -> [u8; DIR_ROOT_BYTES] {
        let mut bytes = [0u8; DIR_ROOT_BYTES];
        write_u32(&mut bytes, ROOT_MAGIC_OFFSET, ROOT_MAGIC);
        write_u16(&mut bytes, ROOT_VERSION_OFFSET, ROOT_VERSION);
        write_u16(&mut bytes, ROOT_INDEX_DEPTH_OFFSET, self.index_depth);
        write_u64(&mut bytes, ROOT_FIRST_LEAF_OFFSET, self.first_leaf);
        write_u64(&mut bytes, ROOT_INDEX_ROOT_OFFSET, self.index_root);
        write_u64(&mut bytes, ROOT_ENTRY_COUNT_OFFSET, self.entry_count);
        write_u64(&mut bytes, ROOT_REGION_COUNT_OFFSET, self.region_count);
        write_u64(&mut bytes, ROOT_LEAF_COUNT_OFFSET, self.leaf_count);
        write_u64(&mut bytes, ROOT_INDEX_BLOCK_COUNT_OFFSET, self.index_block_count);
        bytes
    }

    pub fn decode(bytes: &[u8; DIR_ROOT_BYTES]) -> Result<DirRoot> {
        let magic = read_u32(bytes, ROOT_MAGIC_OFFSET);
        if magic != ROOT_MAGIC {
            return Err(Error::corruption(format!("directory root: magic {magic:#010x}, expected {ROOT_MAGIC:#010x}")));
        }
        let version = read_u16(bytes, ROOT_VERSION_OFFSET);
        if version != ROOT_VERSION {
            return Err(Error::corruption(format!("directory root: version {version}, expected {ROOT_VERSION}")));
        }
        if bytes[ROOT_RESERVED_OFFSET..ROOT_RESERVED_OFFSET + ROOT_RESERVED_BYTES].iter().any(|byte| *byte != 0) {
            return Err(Error::corruption("directory root: reserved bytes are not zero"));
        }
        let root = DirRoot {
            first_leaf: read_u64(bytes, ROOT_FIRST_LEAF_OFFSET),
            index_root: read_u64(bytes, ROOT_INDEX_ROOT_OFFSET),
            index_depth: read_u16(bytes, ROOT_INDEX_DEPTH_OFFSET),
            entry_count: read_u64(bytes, ROOT_ENTRY_COUNT_OFFSET),
            region_count: read_u64(bytes, ROOT_REGION_COUNT_OFFSET),
            leaf_count: read_u64(bytes, ROOT_LEAF_COUNT_OFFSET),
            index_block_count: read_u64(bytes, ROOT_INDEX_BLOCK_COUNT_OFFSET),
        };
        root.validate()?;
        Ok(root)
    }

    /// Checks the fields against each other; called on decode and before every operation.
    pub fn validate(&self) -> Result<()> {
        let fail = |what: String| Err(Error::corruption(format!("directory root: {what}")));
        if self.first_leaf == 0 || self.first_leaf > MAX_POSITION_BLOCK {
            return fail(format!("first leaf {} out of range", self.first_leaf));
        }
        if self.index_depth > MAX_INDEX_DEPTH {
            return fail(format!("index depth {} above the limit {MAX_INDEX_DEPTH}", self.index_depth));
        }
        if (self.index_depth == 0) != (self.index_root == 0) {
            return fail(format!("index depth {} with index root {}", self.index_depth, self.index_root));
        }
        if self.index_block_count < self.index_depth as u64 {
            return fail(format!("{} index blocks cannot make {} levels", self.index_block_count, self.index_depth));
        }
        if self.index_root > MAX_POSITION_BLOCK {
            return fail(format!("index root {} out of range", self.index_root));
        }
        if self.region_count == 0 || self.leaf_count == 0 {
            return fail(format!("{} regions in {} leaves", self.region_count, self.leaf_count));
        }
        // Each leaf holds at most ENTRY_SLOTS_PER_LEAF / 2 records (an entry or dummy is >= 2 slots).
        let capacity = self.leaf_count.saturating_mul((ENTRY_SLOTS_PER_LEAF / 2) as u64);
        if self.entry_count.saturating_add(self.region_count) > capacity {
            return fail(format!(
                "{} entries and {} regions cannot fit {} leaves",
                self.entry_count, self.region_count, self.leaf_count
            ));
        }
        Ok(())
    }

    pub fn entry_count(&self) -> u64 {
        self.entry_count
    }

    /// Upper bound on the steps of any walk along the list: every entry and dummy once.
    pub fn list_length_bound(&self) -> u64 {
        self.entry_count.saturating_add(self.region_count).saturating_add(1)
    }

    pub fn head_position(&self) -> u64 {
        make_position(self.first_leaf, FIRST_ENTRY_SLOT)
    }
}

/// One record of the list as read from a leaf, already validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: u64,
    pub next: u64,
    /// Inode for an entry, member count for a dummy.
    pub inode_or_count: u64,
    pub file_type: u8,
    pub is_dummy: bool,
    pub name: Vec<u8>,
}

impl Record {
    pub fn slots(&self) -> usize {
        if self.is_dummy {
            DUMMY_BYTES / SLOT_BYTES
        } else {
            entry_slots(self.name.len())
        }
    }
    /// The hash that opens the region, for a dummy.
    pub fn region_hash(&self) -> u32 {
        key_hash(self.key)
    }
}

pub fn leaf_bit(block: &BlockBuf, slot: usize) -> bool {
    block[LEAF_BITMAP_OFFSET + slot / 8] & (1 << (slot % 8)) != 0
}
pub fn set_leaf_bits(block: &mut BlockBuf, first_slot: usize, slots: usize, value: bool) {
    assert!(first_slot + slots <= SLOTS_PER_BLOCK);
    for slot in first_slot..first_slot + slots {
        if value {
            block[LEAF_BITMAP_OFFSET + slot / 8] |= 1 << (slot % 8);
        } else {
            block[LEAF_BITMAP_OFFSET + slot / 8] &= !(1 << (slot % 8));
        }
    }
}

/// Checks a leaf's header: magic, bitmap consistent with the used-slot count. Cheap (a few
/// dozen instructions: the bitmap is counted a word at a time), because every directory
/// operation checks each leaf it loads, cache hits included.
pub fn validate_leaf(block: &BlockBuf, block_number: u64) -> Result<()> {
    let magic = read_u32(&block[..], LEAF_MAGIC_OFFSET);
    if magic != LEAF_MAGIC {
        return Err(Error::corruption(format!("directory leaf {block_number}: magic {magic:#010x}")));
    }
    let words = bitmap_words(block);
    const HEADER_MASK: u64 = (1 << FIRST_ENTRY_SLOT) - 1;
    if words[0] & HEADER_MASK != 0 {
        let slot = (words[0] & HEADER_MASK).trailing_zeros();
        return Err(Error::corruption(format!("directory leaf {block_number}: bitmap marks header slot {slot}")));
    }
    // Bits at and above SLOTS_PER_BLOCK would be slots in the trailer.
    let trailer_bits = words[3] >> (SLOTS_PER_BLOCK - 192);
    if trailer_bits != 0 {
        let slot = SLOTS_PER_BLOCK + trailer_bits.trailing_zeros() as usize;
        return Err(Error::corruption(format!(
            "directory leaf {block_number}: bitmap marks slot {slot} in the trailer"
        )));
    }
    if read_u16(&block[..], LEAF_RESERVED_OFFSET) != 0 {
        return Err(Error::corruption(format!("directory leaf {block_number}: reserved header field is not zero")));
    }
    let used = read_u16(&block[..], LEAF_USED_SLOTS_OFFSET) as usize;
    let counted: usize = words.iter().map(|word| word.count_ones() as usize).sum();
    if used != counted {
        return Err(Error::corruption(format!(
            "directory leaf {block_number}: used-slot count {used} but bitmap marks {counted}"
        )));
    }
    for (name, offset) in [("next leaf", LEAF_NEXT_OFFSET), ("previous leaf", LEAF_PREVIOUS_OFFSET)] {
        let value = read_u64(&block[..], offset);
        if value > MAX_POSITION_BLOCK {
            return Err(Error::corruption(format!("directory leaf {block_number}: {name} {value} out of range")));
        }
    }
    Ok(())
}

/// The slot bitmap of a leaf as four words: bit `slot % 64` of word `slot / 64`.
pub fn bitmap_words(block: &BlockBuf) -> [u64; 4] {
    const _: () = assert!(LEAF_BITMAP_BYTES == 32);
    std::array::from_fn(|index| read_u64(&block[..], LEAF_BITMAP_OFFSET + 8 * index))
}

/// First run of `slots` free slots in a leaf (the lowest one), if any.
pub fn free_run(block: &BlockBuf, slots: usize) -> Option<usize> {
    assert!(slots > 0);
    let words = bitmap_words(block);
    let mut run_start = FIRST_ENTRY_SLOT;
    let mut run_length = 0;
    let mut slot = FIRST_ENTRY_SLOT;
    while slot < SLOTS_PER_BLOCK {
        let word = words[slot / 64] >> (slot % 64);
        // Whole stretches of used or free slots at once: the count of equal bits from `slot`.
        let stretch = if word & 1 == 0 { word.trailing_zeros() } else { word.trailing_ones() } as usize;
        let stretch = stretch.min(64 - slot % 64).min(SLOTS_PER_BLOCK - slot);
        if word & 1 == 0 {
            run_length += stretch;
            if run_length >= slots {
                return Some(run_start);
            }
        } else {
            run_length = 0;
            run_start = slot + stretch;
        }
        slot += stretch;
    }
    None
}

pub fn new_leaf() -> BlockBuf {
    let mut block = crate::block::meta::zeroed_block();
    write_u32(&mut block[..], LEAF_MAGIC_OFFSET, LEAF_MAGIC);
    block
}

/// The fixed part of a record, read in place: all a walk along the list needs, without
/// copying the name. Checked as fully as `decode_record` checks a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub key: u64,
    pub next: u64,
    /// Inode for an entry, member count for a dummy.
    pub inode_or_count: u64,
    pub file_type: u8,
    pub is_dummy: bool,
    pub name_length: usize,
}

impl RecordHeader {
    pub fn slots(&self) -> usize {
        if self.is_dummy {
            DUMMY_BYTES / SLOT_BYTES
        } else {
            entry_slots(self.name_length)
        }
    }
    /// The hash that opens the region, for a dummy.
    pub fn region_hash(&self) -> u32 {
        key_hash(self.key)
    }
}

/// Decodes the fixed part of the record at `slot` of a validated leaf, checking everything
/// about it (the name's bytes are not read). The walk along a directory's list calls this for
/// every record it passes, so the fixed header is taken as one array (one range check; the
/// fields then sit at constant offsets), the error text is built only on failure, and the
/// function is inlined into the walk (a call and its returned `Result` cost as much as the
/// checks).
#[inline(always)]
pub fn decode_header(block: &BlockBuf, block_number: u64, slot: usize) -> Result<RecordHeader> {
    const _: () = assert!(ENTRY_NAME_OFFSET <= DUMMY_BYTES && ENTRY_KIND_OFFSET < DUMMY_BYTES);
    let fail = |what: String| Err(Error::corruption(format!("directory leaf {block_number} slot {slot}: {what}")));
    if !(FIRST_ENTRY_SLOT..SLOTS_PER_BLOCK).contains(&slot) {
        return fail("slot out of range".into());
    }
    let base = slot * SLOT_BYTES;
    // The fixed header of a record fits in two slots; check room before reading it.
    let Some(fixed) = block[..META_PAYLOAD_BYTES].get(base..base + DUMMY_BYTES) else {
        return fail("record header runs past the payload".into());
    };
    let fixed: &[u8; DUMMY_BYTES] = fixed.try_into().expect("a range of DUMMY_BYTES");
    let field_u64 = |offset: usize| u64::from_le_bytes(fixed[offset..offset + 8].try_into().expect("8 bytes"));
    let kind = fixed[ENTRY_KIND_OFFSET];
    let name_length = fixed[ENTRY_NAME_LENGTH_OFFSET] as usize;
    let is_dummy = match kind {
        ENTRY_KIND_NAME => false,
        ENTRY_KIND_DUMMY => true,
        other => return fail(format!("kind {other}")),
    };
    if is_dummy && name_length != 0 {
        return fail(format!("dummy with name length {name_length}"));
    }
    if !is_dummy && name_length == 0 {
        return fail("entry with empty name".into());
    }
    let slots = if is_dummy { DUMMY_BYTES / SLOT_BYTES } else { entry_slots(name_length) };
    if slot + slots > SLOTS_PER_BLOCK {
        return fail(format!("record of {slots} slots runs past the payload"));
    }
    // The record's bits in one 32-bit window of the bitmap: at most 7 + 18 bits from the byte of
    // `slot` (the window may run past the bitmap into the header's next bytes; they are masked).
    let window = read_u32(&block[..], LEAF_BITMAP_OFFSET + slot / 8);
    let mask = ((1u32 << slots) - 1) << (slot % 8);
    if window & mask != mask {
        let free = slot + ((!window & mask) >> (slot % 8)).trailing_zeros() as usize;
        return fail(format!("record covers slot {free}, free in the bitmap"));
    }
    let key = field_u64(ENTRY_KEY_OFFSET);
    if key >= 1 << 63 || (is_dummy && key as u32 != 0) {
        return fail(format!("key {key:#x} malformed"));
    }
    let next = field_u64(ENTRY_NEXT_OFFSET);
    if next != 0 && !position_is_valid(next) {
        return fail(format!("next position {next:#x} is not a valid entry position"));
    }
    Ok(RecordHeader {
        key,
        next,
        inode_or_count: field_u64(ENTRY_INODE_OFFSET),
        file_type: fixed[ENTRY_FILE_TYPE_OFFSET],
        is_dummy,
        name_length,
    })
}

/// The name bytes of the record at `slot` whose header `decode_header` returned.
pub fn record_name<'a>(block: &'a BlockBuf, slot: usize, header: &RecordHeader) -> &'a [u8] {
    let start = slot * SLOT_BYTES + ENTRY_NAME_OFFSET;
    &block[start..start + header.name_length]
}

/// Decodes the record at `slot` of a validated leaf, checking everything about it.
pub fn decode_record(block: &BlockBuf, block_number: u64, slot: usize) -> Result<Record> {
    let header = decode_header(block, block_number, slot)?;
    Ok(Record {
        key: header.key,
        next: header.next,
        inode_or_count: header.inode_or_count,
        file_type: header.file_type,
        is_dummy: header.is_dummy,
        name: record_name(block, slot, &header).to_vec(),
    })
}

/// Writes `record` at `slot` (the slots must already be marked in the bitmap).
pub fn encode_record(block: &mut BlockBuf, slot: usize, record: &Record) {
    let slots = record.slots();
    assert!(slot >= FIRST_ENTRY_SLOT && slot + slots <= SLOTS_PER_BLOCK);
    assert!(record.name.len() <= MAX_NAME_BYTES);
    let base = slot * SLOT_BYTES;
    block[base..base + slots * SLOT_BYTES].fill(0);
    write_u64(&mut block[..], base + ENTRY_KEY_OFFSET, record.key);
    write_u64(&mut block[..], base + ENTRY_NEXT_OFFSET, record.next);
    write_u64(&mut block[..], base + ENTRY_INODE_OFFSET, record.inode_or_count);
    block[base + ENTRY_NAME_LENGTH_OFFSET] = record.name.len() as u8;
    block[base + ENTRY_FILE_TYPE_OFFSET] = record.file_type;
    block[base + ENTRY_KIND_OFFSET] = if record.is_dummy { ENTRY_KIND_DUMMY } else { ENTRY_KIND_NAME };
    block[base + ENTRY_NAME_OFFSET..base + ENTRY_NAME_OFFSET + record.name.len()].copy_from_slice(&record.name);
}

/// An index block in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexNode {
    /// 0: entries point at dummies; above: at index blocks of level - 1.
    pub level: u16,
    /// (lowest hash, target), hashes strictly ascending.
    pub entries: Vec<(u32, u64)>,
}

/// Checks an index block's header; returns its entry count (1..=INDEX_CAPACITY).
fn check_index_header(block: &BlockBuf, block_number: u64, expected_level: u16) -> Result<usize> {
    let fail = |what: String| Err(Error::corruption(format!("directory index block {block_number}: {what}")));
    let magic = read_u32(&block[..], INDEX_MAGIC_OFFSET);
    if magic != INDEX_MAGIC {
        return fail(format!("magic {magic:#010x}"));
    }
    let level = read_u16(&block[..], INDEX_LEVEL_OFFSET);
    if level != expected_level {
        return fail(format!("level {level}, expected {expected_level}"));
    }
    let count = read_u16(&block[..], INDEX_COUNT_OFFSET) as usize;
    if count == 0 || count > INDEX_CAPACITY {
        return fail(format!("entry count {count} outside 1..={INDEX_CAPACITY}"));
    }
    if read_u64(&block[..], INDEX_RESERVED_OFFSET) != 0 {
        return fail("reserved header field is not zero".into());
    }
    Ok(count)
}

/// Checks an index entry's target: a dummy's position at level 0, a block number above.
fn check_index_target(level: u16, block_number: u64, index: usize, target: u64) -> Result<()> {
    if level == 0 {
        split_position(target, &|| format!("directory index block {block_number} entry {index}"))?;
    } else if target == 0 || target > MAX_POSITION_BLOCK {
        return Err(Error::corruption(format!(
            "directory index block {block_number}: entry {index} child block {target} out of range"
        )));
    }
    Ok(())
}

pub fn decode_index(block: &BlockBuf, block_number: u64, expected_level: u16) -> Result<IndexNode> {
    let fail = |what: String| Err(Error::corruption(format!("directory index block {block_number}: {what}")));
    let count = check_index_header(block, block_number, expected_level)?;
    let level = expected_level;
    let mut entries = Vec::with_capacity(count);
    for index in 0..count {
        let base = INDEX_HEADER_BYTES + index * INDEX_ENTRY_BYTES;
        let hash = read_u32(&block[..], base + INDEX_ENTRY_HASH_OFFSET);
        let target = read_u64(&block[..], base + INDEX_ENTRY_TARGET_OFFSET);
        if read_u32(&block[..], base + INDEX_ENTRY_RESERVED_OFFSET) != 0 {
            return fail(format!("entry {index} reserved field is not zero"));
        }
        if hash >= 1 << 31 {
            return fail(format!("entry {index} hash {hash:#x} above 31 bits"));
        }
        if let Some((previous, _)) = entries.last() {
            if hash <= *previous {
                return fail(format!("entry {index} hash {hash:#x} not above {previous:#x}"));
            }
        }
        check_index_target(level, block_number, index, target)?;
        entries.push((hash, target));
    }
    Ok(IndexNode { level, entries })
}

/// What `search_index_block` found: the chosen entry, and the target of the entry after it
/// when the block has one (checked like the chosen one).
pub struct IndexChoice {
    pub hash: u32,
    pub target: u64,
    pub next_target: Option<u64>,
}

/// Searches index block `block_number` (of `level`) in place for the last entry whose hash is
/// not above `hash`. Checks the header, that the block's lowest hash is `expected_lowest` (what
/// its parent says), and the chosen entry with its neighbours.
pub fn search_index_block(
    block: &BlockBuf,
    block_number: u64,
    expected_level: u16,
    hash: u32,
    expected_lowest: u32,
) -> Result<IndexChoice> {
    let fail = |what: String| Err(Error::corruption(format!("directory index block {block_number}: {what}")));
    let count = check_index_header(block, block_number, expected_level)?;
    let level = expected_level;
    let entry_hash = |index: usize| read_u32(&block[..], INDEX_HEADER_BYTES + index * INDEX_ENTRY_BYTES);
    let lowest = entry_hash(0);
    if lowest != expected_lowest {
        return fail(format!("lowest hash {lowest:#x}, its parent says {expected_lowest:#x}"));
    }
    if lowest > hash {
        return fail(format!("lowest hash {lowest:#x} above {hash:#x} reached through its parent"));
    }
    // Entries 0..low have hashes <= `hash`, high..count above it (for a sorted block).
    let (mut low, mut high) = (1usize, count);
    let mut rounds = 0;
    while low < high {
        rounds += 1;
        assert!(rounds <= 16, "binary search over at most 254 entries");
        let middle = low + (high - low) / 2;
        if entry_hash(middle) <= hash {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    let chosen = low - 1;
    let base = INDEX_HEADER_BYTES + chosen * INDEX_ENTRY_BYTES;
    let chosen_hash = entry_hash(chosen);
    let target = read_u64(&block[..], base + INDEX_ENTRY_TARGET_OFFSET);
    if read_u32(&block[..], base + INDEX_ENTRY_RESERVED_OFFSET) != 0 {
        return fail(format!("entry {chosen} reserved field is not zero"));
    }
    if chosen_hash >= 1 << 31 {
        return fail(format!("entry {chosen} hash {chosen_hash:#x} above 31 bits"));
    }
    if chosen > 0 && entry_hash(chosen - 1) >= chosen_hash {
        return fail(format!("entry {chosen} hash {chosen_hash:#x} not above its predecessor"));
    }
    if chosen + 1 < count && entry_hash(chosen + 1) <= chosen_hash {
        return fail(format!("entry {} hash not above {chosen_hash:#x}", chosen + 1));
    }
    check_index_target(level, block_number, chosen, target)?;
    let next_target = if chosen + 1 < count {
        let next_target =
            read_u64(&block[..], INDEX_HEADER_BYTES + (chosen + 1) * INDEX_ENTRY_BYTES + INDEX_ENTRY_TARGET_OFFSET);
        check_index_target(level, block_number, chosen + 1, next_target)?;
        Some(next_target)
    } else {
        None
    };
    Ok(IndexChoice { hash: chosen_hash, target, next_target })
}

pub fn encode_index(node: &IndexNode) -> BlockBuf {
    assert!(!node.entries.is_empty() && node.entries.len() <= INDEX_CAPACITY);
    let mut block = crate::block::meta::zeroed_block();
    write_u32(&mut block[..], INDEX_MAGIC_OFFSET, INDEX_MAGIC);
    write_u16(&mut block[..], INDEX_LEVEL_OFFSET, node.level);
    write_u16(&mut block[..], INDEX_COUNT_OFFSET, node.entries.len() as u16);
    for (index, (hash, target)) in node.entries.iter().enumerate() {
        let base = INDEX_HEADER_BYTES + index * INDEX_ENTRY_BYTES;
        write_u32(&mut block[..], base + INDEX_ENTRY_HASH_OFFSET, *hash);
        write_u64(&mut block[..], base + INDEX_ENTRY_TARGET_OFFSET, *target);
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structure_sizes() {
        assert_eq!(ROOT_RESERVED_OFFSET + ROOT_RESERVED_BYTES, DIR_ROOT_BYTES);
        assert_eq!(LEAF_BITMAP_OFFSET + LEAF_BITMAP_BYTES, LEAF_HEADER_BYTES);
        const _: () = assert!(LEAF_BITMAP_BYTES * 8 >= SLOTS_PER_BLOCK);
        assert_eq!(SLOTS_PER_BLOCK, 254);
        assert_eq!(FIRST_ENTRY_SLOT, 4);
        assert_eq!(entry_slots(0) * SLOT_BYTES, DUMMY_BYTES);
        assert_eq!(entry_slots(MAX_NAME_BYTES), 18);
        assert_eq!(entry_slots(5), 2);
        assert_eq!(entry_slots(6), 3);
        assert_eq!(INDEX_CAPACITY, 253);
        assert_eq!(INDEX_HEADER_BYTES + INDEX_CAPACITY * INDEX_ENTRY_BYTES, META_PAYLOAD_BYTES);
        assert_eq!(INDEX_ENTRY_TARGET_OFFSET + 8, INDEX_ENTRY_BYTES);
        assert_eq!(ENTRY_NAME_OFFSET, ENTRY_KIND_OFFSET + 1);
    }

    #[test]
    fn root_round_trip_and_rejects() {
        let root = DirRoot {
            first_leaf: 7,
            index_root: 9,
            index_depth: 2,
            entry_count: 1000,
            region_count: 6,
            leaf_count: 20,
            index_block_count: 3,
        };
        assert_eq!(DirRoot::decode(&root.encode()).unwrap(), root);
        let mut bad = root.encode();
        bad[ROOT_INDEX_DEPTH_OFFSET] = 200;
        assert!(DirRoot::decode(&bad).unwrap_err().is_corruption());
        let mut bad = root.encode();
        bad[0] ^= 1;
        assert!(DirRoot::decode(&bad).is_err());
    }
}
