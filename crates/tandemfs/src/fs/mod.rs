//! `fs`: the file system API and the front end. Every change is validated against the front
//! end's view (inode cache, name overlay, per-file update lists), appended to the operation log
//! and answered; the back end applies it later. Reads overlay what is not yet applied.

mod engine;
pub mod front;
pub mod types;

pub use engine::batch::{BatchAnswer, BatchIndex, BatchStatistics, ClaimAnswer, CreateRequest, IndexCreate};
pub use engine::compactor::{CompactionPass, CompactionStatistics};
pub use engine::dirindex_feed::{
    DirectoryIndexOptions, DirectoryIndexStatistics, IndexEngine, CATCH_UP_WAIT_MS_DEFAULT, MIN_BATCH_CPU_DEFAULT,
    MIN_BATCH_GPU_DEFAULT,
};
pub use engine::FileSystem;
pub use types::*;
