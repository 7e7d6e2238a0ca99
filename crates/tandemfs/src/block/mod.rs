//! `block`: superblock, free-space bitmaps, inode table, metadata block cache and checksums.
//! Nothing here knows about files or directories: `Volume` hands out blocks and inodes and
//! keeps their images until a checkpoint writes them home.

pub mod bitmap;
pub mod cache;
pub mod codec;
pub mod inode;
pub mod meta;
pub mod mirror;
pub mod mmp;
pub mod superblock;
pub mod volume;
