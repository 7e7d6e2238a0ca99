//! `extent`: the FlexTree extent map of each file. (Interface placeholder until it lands.)
#![allow(unused_variables)]
use crate::block::meta::{DataStore, MetaStore};
use crate::error::Result;
pub const EXTENT_ROOT_BYTES: usize = 64;
pub const MAX_FILE_BYTES: u64 = 1 << 60;
#[derive(Clone, Debug)]
pub struct ExtentRoot;
impl ExtentRoot {
    pub fn empty() -> ExtentRoot {
        unimplemented!()
    }
    pub fn encode(&self) -> [u8; 64] {
        unimplemented!()
    }
    pub fn decode(bytes: &[u8; 64]) -> Result<ExtentRoot> {
        unimplemented!()
    }
    pub fn length_bytes(&self) -> u64 {
        unimplemented!()
    }
    pub fn blocks_owned(&self) -> u64 {
        unimplemented!()
    }
}
pub trait Store: MetaStore + DataStore {}
impl<T: MetaStore + DataStore + ?Sized> Store for T {}
pub fn read(store: &mut dyn Store, root: &ExtentRoot, offset: u64, buffer: &mut [u8]) -> Result<usize> {
    unimplemented!()
}
pub fn write(store: &mut dyn Store, root: &mut ExtentRoot, offset: u64, data: &[u8]) -> Result<()> {
    unimplemented!()
}
pub fn truncate(store: &mut dyn Store, root: &mut ExtentRoot, length_bytes: u64) -> Result<()> {
    unimplemented!()
}
pub fn insert_range(store: &mut dyn Store, root: &mut ExtentRoot, offset: u64, length_bytes: u64) -> Result<()> {
    unimplemented!()
}
pub fn collapse_range(store: &mut dyn Store, root: &mut ExtentRoot, offset: u64, length_bytes: u64) -> Result<()> {
    unimplemented!()
}
pub fn punch_hole(store: &mut dyn Store, root: &mut ExtentRoot, offset: u64, length_bytes: u64) -> Result<()> {
    unimplemented!()
}
pub fn zero_range(
    store: &mut dyn Store,
    root: &mut ExtentRoot,
    offset: u64,
    length_bytes: u64,
    keep_size: bool,
) -> Result<()> {
    unimplemented!()
}
pub fn allocate(
    store: &mut dyn Store,
    root: &mut ExtentRoot,
    offset: u64,
    length_bytes: u64,
    keep_size: bool,
) -> Result<()> {
    unimplemented!()
}
pub fn destroy(store: &mut dyn Store, root: ExtentRoot) -> Result<()> {
    unimplemented!()
}
pub struct ExtentCheck {
    pub data_blocks: Vec<(u64, u64)>,
    pub tree_blocks: Vec<u64>,
    pub problems: Vec<String>,
}
pub fn check(store: &mut dyn Store, root: &ExtentRoot) -> ExtentCheck {
    unimplemented!()
}
