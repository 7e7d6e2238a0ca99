//! `dir`: GPU4FS H-tree directories (Kittner 2023) over a split-ordered list of entries.
//! (Interface placeholder until the directory work lands.)
#![allow(unused_variables)]
use crate::block::meta::MetaStore;
use crate::error::Result;
pub const DIR_ROOT_BYTES: usize = 64;
pub type HashSeed = [u32; 4];
#[derive(Clone, Debug)]
pub struct DirRoot;
impl DirRoot {
    pub fn encode(&self) -> [u8; 64] {
        unimplemented!()
    }
    pub fn decode(bytes: &[u8; 64]) -> Result<DirRoot> {
        unimplemented!()
    }
    pub fn entry_count(&self) -> u64 {
        unimplemented!()
    }
}
pub struct DirEntry {
    pub name: Vec<u8>,
    pub inode: u64,
    pub file_type: u8,
    pub cookie: u64,
}
pub fn create(store: &mut dyn MetaStore) -> Result<DirRoot> {
    unimplemented!()
}
pub fn lookup(store: &mut dyn MetaStore, root: &DirRoot, seed: &HashSeed, name: &[u8]) -> Result<Option<(u64, u8)>> {
    unimplemented!()
}
pub fn insert(
    store: &mut dyn MetaStore,
    root: &mut DirRoot,
    seed: &HashSeed,
    name: &[u8],
    inode: u64,
    file_type: u8,
) -> Result<()> {
    unimplemented!()
}
pub fn remove(store: &mut dyn MetaStore, root: &mut DirRoot, seed: &HashSeed, name: &[u8]) -> Result<(u64, u8)> {
    unimplemented!()
}
pub fn replace(
    store: &mut dyn MetaStore,
    root: &mut DirRoot,
    seed: &HashSeed,
    name: &[u8],
    inode: u64,
    file_type: u8,
) -> Result<(u64, u8)> {
    unimplemented!()
}
pub fn readdir(
    store: &mut dyn MetaStore,
    root: &DirRoot,
    after_cookie: u64,
    visit: &mut dyn FnMut(&DirEntry) -> bool,
) -> Result<()> {
    unimplemented!()
}
pub fn destroy(store: &mut dyn MetaStore, root: DirRoot) -> Result<()> {
    unimplemented!()
}
pub struct DirCheck {
    pub blocks: Vec<u64>,
    pub entries: Vec<(Vec<u8>, u64, u8)>,
    pub problems: Vec<String>,
}
pub fn check(store: &mut dyn MetaStore, root: &DirRoot, seed: &HashSeed) -> DirCheck {
    unimplemented!()
}
