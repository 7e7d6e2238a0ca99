//! One directory operation's view of the store: blocks read once and kept, changes collected
//! and written together at the end. If the operation fails (corruption found half way, no
//! space), nothing it changed reaches the store and the blocks it allocated are given back, so
//! a failed operation leaves the directory as it was.

use crate::{FastHashMap, FastHashSet};

use super::format::*;
use crate::block::meta::{zeroed_block, BlockBuf, BlockKind, MetaStore, SharedBlock};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Sessions holding at most this many blocks find them by a scan, without a map.
const LINEAR_SEARCH_BLOCKS: usize = 16;

struct Cached {
    block_number: u64,
    /// Shared with the block cache until changed: the first change copies it.
    block: SharedBlock,
    kind: BlockKind,
    dirty: bool,
    /// The address of the buffer the store gave (0 for a block made here): the writers' cache
    /// (`members`) knows a block it read by that buffer, and keeps it alive, so an equal
    /// address is the very same bytes.
    loaded: usize,
}

pub struct Session<'a> {
    store: &'a mut dyn MetaStore,
    /// The blocks read or made, in load order; `where_is` maps a block number to its place
    /// once there are more than `LINEAR_SEARCH_BLOCKS` (most operations touch a handful of
    /// blocks, and a short scan beats building a map).
    blocks: Vec<Cached>,
    where_is: FastHashMap<u64, usize>,
    /// Place of the block used last: a walk along the list asks for the same leaf many times.
    last_used: usize,
    allocated: Vec<u64>,
    freed: FastHashSet<u64>,
    /// For read-only walks over big directories: clean blocks are dropped past this many.
    clean_limit: usize,
    /// The records this operation wrote or released (`members` keeps the regions whose
    /// records it did not change).
    changed: Vec<Changed>,
}

/// A record an operation wrote or released.
#[derive(Clone, Copy, Debug)]
pub struct Changed {
    pub position: u64,
    /// The record's key (the same before and after: keys never change in place).
    pub key: u64,
    /// Only a dummy's member count changed.
    pub count_only: bool,
}

impl<'a> Session<'a> {
    pub fn new(store: &'a mut dyn MetaStore) -> Session<'a> {
        Session {
            store,
            blocks: Vec::new(),
            where_is: FastHashMap::default(),
            last_used: 0,
            allocated: Vec::new(),
            freed: FastHashSet::default(),
            clean_limit: usize::MAX,
            changed: Vec::new(),
        }
    }

    pub fn with_clean_limit(store: &'a mut dyn MetaStore, clean_limit: usize) -> Session<'a> {
        assert!(clean_limit > 0);
        let mut session = Session::new(store);
        session.clean_limit = clean_limit;
        session
    }

    /// The place of a block in `blocks`, if the session holds it.
    #[inline]
    fn place_of(&self, block_number: u64) -> Option<usize> {
        match self.blocks.get(self.last_used) {
            Some(cached) if cached.block_number == block_number => Some(self.last_used),
            _ if self.blocks.len() <= LINEAR_SEARCH_BLOCKS => {
                self.blocks.iter().position(|cached| cached.block_number == block_number)
            }
            _ => self.where_is.get(&block_number).copied(),
        }
    }

    /// Rebuilds `where_is` after places changed, or clears it while a scan suffices.
    fn index_places(&mut self) {
        self.where_is.clear();
        if self.blocks.len() > LINEAR_SEARCH_BLOCKS {
            self.where_is.extend(self.blocks.iter().enumerate().map(|(place, cached)| (cached.block_number, place)));
        }
        self.last_used = 0;
    }

    /// Drops clean blocks (read-only walks over big directories keep memory bounded).
    fn drop_clean_blocks(&mut self) {
        self.blocks.retain(|cached| cached.dirty);
        self.index_places();
    }

    fn load(&mut self, block_number: u64, kind: BlockKind) -> Result<&mut Cached> {
        let place = match self.place_of(block_number) {
            Some(place) => place,
            None => {
                // Freed blocks are never in `blocks`, so only a miss needs a look at `freed`.
                if self.freed.contains(&block_number) {
                    return Err(Error::corruption(format!(
                        "directory block {block_number} is referenced after it became empty"
                    )));
                }
                if self.blocks.len() >= self.clean_limit {
                    self.drop_clean_blocks();
                }
                let block = self.store.read_meta(block_number, kind)?;
                match kind {
                    BlockKind::DirLeaf => validate_leaf(&block, block_number)?,
                    BlockKind::DirIndex => {} // checked by decode_index, which needs the expected level
                    _ => unreachable!("directories use only leaf and index blocks"),
                }
                let loaded = Arc::as_ptr(&block) as usize;
                self.push(Cached { block_number, block, kind, dirty: false, loaded })
            }
        };
        self.last_used = place;
        let cached = &mut self.blocks[place];
        if cached.kind != kind {
            return Err(Error::corruption(format!(
                "directory block {block_number} is used both as a {:?} and as a {kind:?} block",
                cached.kind
            )));
        }
        Ok(cached)
    }

    fn push(&mut self, cached: Cached) -> usize {
        assert!(self.place_of(cached.block_number).is_none(), "directory block {} held twice", cached.block_number);
        let place = self.blocks.len();
        self.blocks.push(cached);
        if self.blocks.len() == LINEAR_SEARCH_BLOCKS + 1 {
            self.index_places();
        } else if self.blocks.len() > LINEAR_SEARCH_BLOCKS {
            self.where_is.insert(self.blocks[place].block_number, place);
        }
        place
    }

    pub fn leaf(&mut self, block_number: u64) -> Result<&BlockBuf> {
        Ok(&self.load(block_number, BlockKind::DirLeaf)?.block)
    }

    /// The leaf as a shared copy, for a walk that reads record after record of it without
    /// changing anything (the session keeps its own copy; a later change copies first).
    pub fn leaf_shared(&mut self, block_number: u64) -> Result<SharedBlock> {
        Ok(self.load(block_number, BlockKind::DirLeaf)?.block.clone())
    }

    pub fn leaf_mut(&mut self, block_number: u64) -> Result<&mut BlockBuf> {
        self.load(block_number, BlockKind::DirLeaf)?;
        let cached = &mut self.blocks[self.last_used];
        if !cached.dirty {
            // A store holding the buffer only for itself (the last operation's change, not yet
            // handed on) lets go of it, and the change below copies nothing.
            self.store.release_for_change(block_number, &cached.block);
        }
        cached.dirty = true;
        Ok(Arc::make_mut(&mut cached.block))
    }

    pub fn index(&mut self, block_number: u64, level: u16) -> Result<IndexNode> {
        let cached = self.load(block_number, BlockKind::DirIndex)?;
        decode_index(&cached.block, block_number, level)
    }

    /// Searches an index block in place (see `index::find_region`).
    pub fn search_index(
        &mut self,
        block_number: u64,
        level: u16,
        hash: u32,
        expected_lowest: u32,
    ) -> Result<IndexChoice> {
        let cached = self.load(block_number, BlockKind::DirIndex)?;
        search_index_block(&cached.block, block_number, level, hash, expected_lowest)
    }

    pub fn write_index(&mut self, block_number: u64, node: &IndexNode) -> Result<()> {
        let block = encode_index(node);
        let cached = self.load(block_number, BlockKind::DirIndex)?;
        cached.block = Arc::new(block);
        cached.dirty = true;
        Ok(())
    }

    /// A new block of `kind`, zeroed (a leaf gets its magic), kept in the cache.
    pub fn allocate(&mut self, kind: BlockKind, near: u64) -> Result<u64> {
        let block_number = self.store.allocate_meta(near)?;
        self.allocated.push(block_number);
        if block_number == 0 || block_number > MAX_POSITION_BLOCK || self.place_of(block_number).is_some() {
            return Err(Error::corruption(format!(
                "allocator returned block {block_number}, unusable for a directory"
            )));
        }
        let block = if kind == BlockKind::DirLeaf { new_leaf() } else { zeroed_block() };
        self.push(Cached { block_number, block: Arc::new(block), kind, dirty: true, loaded: 0 });
        Ok(block_number)
    }

    pub fn free(&mut self, block_number: u64) {
        assert!(self.freed.insert(block_number), "directory block {block_number} freed twice in one operation");
        if let Some(place) = self.place_of(block_number) {
            self.blocks.swap_remove(place);
            self.index_places();
        }
    }

    pub fn record(&mut self, position: u64, what: &dyn Fn() -> String) -> Result<Record> {
        let (block_number, slot) = split_position(position, what)?;
        let block = self.leaf(block_number)?;
        decode_record(block, block_number, slot)
    }

    /// The fixed part of the record at `position`, checked, without copying its name.
    pub fn header(&mut self, position: u64, what: &dyn Fn() -> String) -> Result<RecordHeader> {
        let (block_number, slot) = split_position(position, what)?;
        let block = self.leaf(block_number)?;
        decode_header(block, block_number, slot)
    }

    /// Whether the record at `position`, whose header is `header`, carries `name`.
    pub fn name_is(&mut self, position: u64, header: &RecordHeader, name: &[u8]) -> Result<bool> {
        if header.name_length != name.len() {
            return Ok(false);
        }
        let (block_number, slot) = split_position(position, &|| "record name".into())?;
        let block = self.leaf(block_number)?;
        Ok(record_name(block, slot, header) == name)
    }

    /// Rewrites the record at `position` (same size as before, or new slots already marked).
    pub fn put_record(&mut self, position: u64, record: &Record) -> Result<()> {
        let (block_number, slot) = split_position(position, &|| "record to write".into())?;
        let block = self.leaf_mut(block_number)?;
        encode_record(block, slot, record);
        self.changed.push(Changed { position, key: record.key, count_only: false });
        Ok(())
    }

    /// Rewrites one 8-byte field of the checked record at `position` in place.
    fn put_field(&mut self, position: u64, offset: usize, value: u64, key: u64, count_only: bool) -> Result<()> {
        let (block_number, slot) = split_position(position, &|| "record to change".into())?;
        let block = self.leaf_mut(block_number)?;
        write_u64(&mut block[..], slot * SLOT_BYTES + offset, value);
        self.changed.push(Changed { position, key, count_only });
        Ok(())
    }

    /// Points the record at `position` at `next` (the record is checked first).
    pub fn set_next(&mut self, position: u64, next: u64) -> Result<()> {
        let key = self.header(position, &|| "record to relink".into())?.key;
        self.put_field(position, ENTRY_NEXT_OFFSET, next, key, false)
    }

    /// Sets the member count of the dummy at `position`, whose checked header is `header`.
    pub fn set_count(&mut self, position: u64, header: &RecordHeader, count: u64) -> Result<()> {
        assert!(header.is_dummy);
        self.put_field(position, ENTRY_INODE_OFFSET, count, header.key, true)
    }

    /// Notes that the record of `key` at `position` was released (its slots are free now).
    pub fn note_released(&mut self, position: u64, key: u64) {
        self.changed.push(Changed { position, key, count_only: false });
    }

    /// The records written or released so far.
    pub fn changed_records(&self) -> &[Changed] {
        &self.changed
    }

    /// The leaf `block_number` as this session holds it now, without reading the store.
    pub fn held_leaf(&self, block_number: u64) -> Option<SharedBlock> {
        let place = self.place_of(block_number)?;
        let cached = &self.blocks[place];
        (cached.kind == BlockKind::DirLeaf).then(|| cached.block.clone())
    }

    /// The leaves this operation changed: (block, address of the buffer it read or 0 for a
    /// new one, the buffer it will write).
    pub fn changed_leaves(&self) -> Vec<(u64, usize, SharedBlock)> {
        let changed = |cached: &&Cached| cached.dirty && cached.kind == BlockKind::DirLeaf;
        self.blocks
            .iter()
            .filter(changed)
            .map(|cached| (cached.block_number, cached.loaded, cached.block.clone()))
            .collect()
    }

    /// Whether this operation changed nothing: no block written, made or freed.
    pub fn is_unchanged(&self) -> bool {
        self.allocated.is_empty() && self.freed.is_empty() && self.blocks.iter().all(|cached| !cached.dirty)
    }

    /// The blocks this operation freed.
    pub fn freed_blocks(&self) -> Vec<u64> {
        self.freed.iter().copied().collect()
    }

    /// Writes the changes and frees the blocks that became unused.
    pub fn commit(self) -> Result<()> {
        let Session { store, blocks, freed, .. } = self;
        let mut dirty: Vec<Cached> = blocks.into_iter().filter(|cached| cached.dirty).collect();
        dirty.sort_by_key(|cached| cached.block_number);
        for cached in dirty {
            store.write_meta(cached.block_number, cached.kind, cached.block)?;
        }
        let mut freed: Vec<u64> = freed.into_iter().collect();
        freed.sort_unstable();
        for block_number in freed {
            store.free_meta(block_number)?;
        }
        Ok(())
    }

    /// Drops the changes; gives back the blocks this operation allocated.
    pub fn abandon(self) {
        for block_number in self.allocated {
            // Best effort: the operation already failed with the error that matters.
            let _ = self.store.free_meta(block_number);
        }
    }
}
