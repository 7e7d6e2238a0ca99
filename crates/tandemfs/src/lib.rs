//! tandemfs engine: a log-structured front end over a back end that keeps H-tree directories
//! and FlexTree files. No FUSE and no command line here: see `docs/ARCHITECTURE.md`.
//!
//! Layers, top to bottom: `fs` (namespace and POSIX semantics, the front end) → `log` (the
//! operation log) → `backend` (applies the log) → `dir`, `extent` (structures built from
//! blocks) → `block` (superblock, allocator, inode table, block cache) → `device` (bytes).

pub mod backend;
pub mod block;
pub mod crypt;
pub mod device;
pub mod dir;
pub mod error;
pub mod extent;
pub mod log;
pub mod sync;
pub mod types;

pub use error::{Error, Result};

/// Hash maps keyed by block and inode numbers and names on hot paths: SipHash's resistance to
/// crafted keys costs more than it protects here, where keys come from the volume itself.
pub(crate) type FastHashMap<K, V> = std::collections::HashMap<K, V, rustc_hash::FxBuildHasher>;
pub(crate) type FastHashSet<K> = std::collections::HashSet<K, rustc_hash::FxBuildHasher>;
pub mod fs;
pub mod fsck;

pub use fs::FileSystem;
