//! `block`: superblock, free-space allocator, inode table, metadata block cache and checksums.
//! Nothing here knows about files or directories.

pub mod meta;
