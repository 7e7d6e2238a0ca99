//! One directory operation's view of the store: blocks read once and kept, changes collected
//! and written together at the end. If the operation fails (corruption found half way, no
//! space), nothing it changed reaches the store and the blocks it allocated are given back, so
//! a failed operation leaves the directory as it was.

use crate::{FastHashMap, FastHashSet};

use super::format::*;
use crate::block::meta::{zeroed_block, BlockBuf, BlockKind, MetaStore};
use crate::error::{Error, Result};

struct Cached {
    block: BlockBuf,
    kind: BlockKind,
    dirty: bool,
}

pub struct Session<'a> {
    store: &'a mut dyn MetaStore,
    blocks: FastHashMap<u64, Cached>,
    allocated: Vec<u64>,
    freed: FastHashSet<u64>,
    /// For read-only walks over big directories: clean blocks are dropped past this many.
    clean_limit: usize,
}

impl<'a> Session<'a> {
    pub fn new(store: &'a mut dyn MetaStore) -> Session<'a> {
        Session {
            store,
            blocks: FastHashMap::default(),
            allocated: Vec::new(),
            freed: FastHashSet::default(),
            clean_limit: usize::MAX,
        }
    }

    pub fn with_clean_limit(store: &'a mut dyn MetaStore, clean_limit: usize) -> Session<'a> {
        assert!(clean_limit > 0);
        let mut session = Session::new(store);
        session.clean_limit = clean_limit;
        session
    }

    fn load(&mut self, block_number: u64, kind: BlockKind) -> Result<&mut Cached> {
        if self.freed.contains(&block_number) {
            return Err(Error::corruption(format!(
                "directory block {block_number} is referenced after it became empty"
            )));
        }
        if !self.blocks.contains_key(&block_number) {
            if self.blocks.len() >= self.clean_limit {
                self.blocks.retain(|_, cached| cached.dirty);
            }
            let block = self.store.read_meta(block_number, kind)?;
            match kind {
                BlockKind::DirLeaf => validate_leaf(&block, block_number)?,
                BlockKind::DirIndex => {} // checked by decode_index, which needs the expected level
                _ => unreachable!("directories use only leaf and index blocks"),
            }
            self.blocks.insert(block_number, Cached { block, kind, dirty: false });
        }
        let cached = self.blocks.get_mut(&block_number).unwrap();
        if cached.kind != kind {
            return Err(Error::corruption(format!(
                "directory block {block_number} is used both as a {:?} and as a {kind:?} block",
                cached.kind
            )));
        }
        Ok(cached)
    }

    pub fn leaf(&mut self, block_number: u64) -> Result<&BlockBuf> {
        Ok(&self.load(block_number, BlockKind::DirLeaf)?.block)
    }

    pub fn leaf_mut(&mut self, block_number: u64) -> Result<&mut BlockBuf> {
        let cached = self.load(block_number, BlockKind::DirLeaf)?;
        cached.dirty = true;
        Ok(&mut cached.block)
    }

    pub fn index(&mut self, block_number: u64, level: u16) -> Result<IndexNode> {
        let cached = self.load(block_number, BlockKind::DirIndex)?;
        decode_index(&cached.block, block_number, level)
    }

    pub fn write_index(&mut self, block_number: u64, node: &IndexNode) -> Result<()> {
        let block = encode_index(node);
        let cached = self.load(block_number, BlockKind::DirIndex)?;
        cached.block = block;
        cached.dirty = true;
        Ok(())
    }

    /// A new block of `kind`, zeroed (a leaf gets its magic), kept in the cache.
    pub fn allocate(&mut self, kind: BlockKind, near: u64) -> Result<u64> {
        let block_number = self.store.allocate_meta(near)?;
        self.allocated.push(block_number);
        if block_number == 0 || block_number > MAX_POSITION_BLOCK || self.blocks.contains_key(&block_number) {
            return Err(Error::corruption(format!(
                "allocator returned block {block_number}, unusable for a directory"
            )));
        }
        let block = if kind == BlockKind::DirLeaf { new_leaf() } else { zeroed_block() };
        self.blocks.insert(block_number, Cached { block, kind, dirty: true });
        Ok(block_number)
    }

    pub fn free(&mut self, block_number: u64) {
        assert!(self.freed.insert(block_number), "directory block {block_number} freed twice in one operation");
        self.blocks.remove(&block_number);
    }

    pub fn record(&mut self, position: u64, what: &dyn Fn() -> String) -> Result<Record> {
        let (block_number, slot) = split_position(position, what)?;
        let block = self.leaf(block_number)?;
        decode_record(block, block_number, slot)
    }

    /// Rewrites the record at `position` (same size as before, or new slots already marked).
    pub fn put_record(&mut self, position: u64, record: &Record) -> Result<()> {
        let (block_number, slot) = split_position(position, &|| "record to write".into())?;
        let block = self.leaf_mut(block_number)?;
        encode_record(block, slot, record);
        Ok(())
    }

    /// Writes the changes and frees the blocks that became unused.
    pub fn commit(self) -> Result<()> {
        let Session { store, blocks, freed, .. } = self;
        let mut dirty: Vec<(u64, Cached)> = blocks.into_iter().filter(|(_, cached)| cached.dirty).collect();
        dirty.sort_by_key(|(block_number, _)| *block_number);
        for (block_number, cached) in dirty {
            store.write_meta(block_number, cached.kind, &cached.block)?;
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
