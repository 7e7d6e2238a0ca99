//! Public types of the file system API: attributes, directory entries, options.

pub use crate::types::*;

/// Attributes of an inode, as `stat` reports them. Times are nanoseconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub inode: InodeNumber,
    pub generation: u64,
    pub file_type: FileType,
    /// Permission bits (`mode & 0o7777`).
    pub permissions: u32,
    pub link_count: u32,
    pub uid: u32,
    pub gid: u32,
    pub size_bytes: u64,
    /// Space used, in 512-byte units as `st_blocks` counts it.
    pub blocks_512: u64,
    pub access_time_ns: i64,
    pub modify_time_ns: i64,
    pub change_time_ns: i64,
    pub birth_time_ns: i64,
    pub rdev: u64,
}

impl Attributes {
    pub fn mode(&self) -> u32 {
        self.file_type.mode_bits() | self.permissions
    }
}

/// A time to set: the current time, or a given one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeToSet {
    Now,
    Nanoseconds(i64),
}

/// Fields of `setattr`; `None` leaves a field unchanged. A size change truncates or extends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttributes {
    pub permissions: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size_bytes: Option<u64>,
    pub access_time: Option<TimeToSet>,
    pub modify_time: Option<TimeToSet>,
}

/// One directory entry returned by `read_directory`. `cookie` resumes the listing after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryEntry {
    pub name: Vec<u8>,
    pub inode: InodeNumber,
    pub file_type: FileType,
    pub cookie: u64,
}

/// How `rename` treats an existing destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace a file, or an empty directory, at the destination (POSIX rename).
    Replace,
    /// Fail with `Exists` if the destination exists (RENAME_NOREPLACE).
    NoReplace,
    /// Swap source and destination, both must exist (RENAME_EXCHANGE).
    Exchange,
}

/// How `set_xattr` treats an existing attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrMode {
    CreateOrReplace,
    /// Fail with `Exists` if present (XATTR_CREATE).
    Create,
    /// Fail with `NoData` if absent (XATTR_REPLACE).
    Replace,
}

/// Volume-wide counts, as `statfs` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStatistics {
    pub block_size_bytes: u32,
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub inodes_total: u64,
    pub inodes_free: u64,
    pub name_max_bytes: u32,
}

/// How lookups and stats read home since mount (`FileSystem::home_read_statistics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HomeReadStatistics {
    /// Blocks read from the mirror without the volume lock.
    pub mirrored_blocks: u64,
    /// Blocks the mirror lacked, read under the volume lock (and mirrored).
    pub locked_blocks: u64,
    /// Reads refused because a change of a block they read overlapped them, and read again.
    pub retries: u64,
    /// Reads that went to the volume lock whole: a change of a block they needed was under
    /// way, changes overlapped every try, or the switch `TANDEM_HOME_READS_LOCKED=1` is set.
    pub fallbacks: u64,
    /// Lookups answered from a region's summary without walking its list (`dir::RegionCache`).
    pub summarised_lookups: u64,
}

/// What the front end's caches hold and what their tables take (`FileSystem::cache_statistics`,
/// `tandem bench memory`). Table bytes count the slots of the hash tables as allocated (a slot
/// per bucket plus one control byte), not what each entry may own besides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStatistics {
    /// Inode views cached, pending and clean.
    pub views: u64,
    /// Bytes of the view tables' slots.
    pub view_table_bytes: u64,
    /// Names cached: the overlay and the lookup cache.
    pub names: u64,
    /// Bytes of the name tables' slots.
    pub name_table_bytes: u64,
    /// Bytes of names too long to sit in their slot.
    pub name_heap_bytes: u64,
}

pub use crate::backend::driver::BackendStatistics;

/// Options of `FileSystem::format` (mkfs).
#[derive(Debug, Clone, Default)]
pub struct FormatOptions {
    /// Number of inodes; default one per 16 KiB of volume.
    pub inode_count: Option<u64>,
    /// Bytes of operation log (headers and data together); default 1/16 of the volume,
    /// between 4 MiB and 1 GiB.
    pub log_bytes: Option<u64>,
    /// Volume UUID; default random.
    pub uuid: Option<[u8; 16]>,
    /// Directory hash seed; default random.
    pub hash_seed: Option<[u32; 4]>,
    /// Owner (uid, gid) of the root directory; default 0:0. The `tandem` command passes the
    /// calling user, so that a user who formats an image can write to it once mounted.
    pub root_owner: Option<(u32, u32)>,
    /// Encrypt the volume (`crate::crypt`): the first key slot's secret and Argon2id cost.
    /// `None`: a plain volume.
    pub encryption: Option<crate::crypt::Encryption>,
}

/// When reading a file moves its access time: the mount options `relatime` (the default, as
/// on ext4), `strictatime` and `noatime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccessTimeUpdates {
    /// Only when the access time is not after the modification or change time, or is a day
    /// old: `ls -lu` and mail readers can still tell whether a file was read since it last
    /// changed, at the price of one attribute record per file per change or per day.
    #[default]
    Relative,
    /// On every read: one attribute record per read.
    Strict,
    /// Never.
    Never,
}

/// How old an access time may get before a read under `relatime` moves it anyway.
pub const RELATIME_INTERVAL_NS: i64 = 24 * 3600 * 1_000_000_000;

impl AccessTimeUpdates {
    /// Whether a read at `now_ns` moves an access time of `access_ns`, given the file's
    /// modification and change times.
    pub fn read_moves(self, access_ns: i64, modify_ns: i64, change_ns: i64, now_ns: i64) -> bool {
        match self {
            AccessTimeUpdates::Never => false,
            AccessTimeUpdates::Strict => access_ns != now_ns,
            AccessTimeUpdates::Relative => {
                access_ns <= modify_ns
                    || access_ns <= change_ns
                    || now_ns.saturating_sub(access_ns) >= RELATIME_INTERVAL_NS
            }
        }
    }
}

/// Options of `FileSystem::mount`.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Records appended but not yet flushed are flushed after at most this long.
    pub flush_delay_us: u64,
    /// Upper bound on cached clean metadata blocks, in bytes.
    pub cache_bytes: u64,
    /// Run the back end as a background thread (true) or only when called (tests).
    pub background_backend: bool,
    /// When reads move access times.
    pub access_time: AccessTimeUpdates,
    /// Mount read-only: nothing is written to the device, not even the superblock or the MMP
    /// block; a log to replay is replayed in memory. A device that refuses writes
    /// (`Device::is_read_only`) is mounted read-only whatever this says.
    pub read_only: bool,
    /// How often a read-write mount refreshes its multi-mount protection block; `None` takes
    /// the interval mkfs recorded in the superblock (5 s). Another mounter waits about twice
    /// this long before it takes over a volume whose mount ended without unmounting.
    pub mmp_interval_ms: Option<u32>,
    /// Back-end apply workers (records on disjoint inodes apply side by side); 0 takes half the
    /// cores, at least 2 (`backend::parallel::default_workers`), at most `backend::parallel::WORKERS_MAX`.
    pub backend_workers: usize,
    /// A checkpoint is taken at least this often while records are applied (sooner when the
    /// log fills): the longest stretch of log a mount after a crash replays, in time. From
    /// `CHECKPOINT_INTERVAL_MS_MIN` to `CHECKPOINT_INTERVAL_MS_MAX`.
    pub checkpoint_interval_ms: u64,
    /// The passphrase or key file that opens an encrypted volume (`crate::crypt::unlock`);
    /// ignored on a plain volume.
    pub key: Option<crate::crypt::Secret>,
    /// A write of at least this many bytes into bytes that map nothing yet (an append, a hole)
    /// goes straight home (`FileSystem::write`, ordered as ext4's data=ordered): its bytes are
    /// written to newly claimed blocks, then a record that only maps them is logged, and the
    /// group commit that writes the record flushes them first. Smaller writes, and writes over
    /// written or fallocated bytes, carry their bytes in the log. 0 sends every write through
    /// the log. Default `DIRECT_WRITE_MIN_BYTES_DEFAULT`.
    pub direct_write_min_bytes: u64,
    /// A direct write of at least this many bytes computes its checksums and the copy its
    /// pending write keeps on a second thread while the calling thread writes its blocks home
    /// (`engine/direct.rs`, `write_home_keeping`): less time per write where a core is idle,
    /// slightly more CPU. 0: never. Default `DIRECT_WRITE_OVERLAP_MIN_BYTES_DEFAULT` (off).
    pub direct_write_overlap_min_bytes: u64,
    /// How many image logs' worth of checkpoint images the records not yet applied may stand
    /// for (by their bounds) before a change waits for the back end to apply some (format
    /// version 9, docs/LOG.md *The image log*): more absorbs longer bursts, at the cost of the
    /// pending changes held in memory and of a longer replay after a crash. From 1 to
    /// `BACKLOG_IMAGE_LOGS_MAX`; default `log::BACKLOG_CHECKPOINTS` (64).
    pub backlog_image_logs: u64,
    /// Background compaction (docs/EXTENTS.md, *Background compaction*): a regular file whose
    /// inserts, collapses, punches or zero ranges leave it holding more than this many times
    /// the bytes it maps (and at least 16 blocks more than they need) is compacted by a thread
    /// of the mount, through the same records as `FileSystem::defrag`, at about a tenth of the
    /// back end's time. 0 turns it off; otherwise at least 1. Default
    /// `BACKGROUND_COMPACT_FACTOR_DEFAULT` (1.25). Only with a back-end thread (without one,
    /// the caller runs `FileSystem::compaction_pass`); never on a read-only mount.
    pub background_compact_factor: f64,
}

/// `MountOptions::background_compact_factor` when none is given: a file is compacted in the
/// background once it holds more than 1.25 times the bytes it maps.
pub const BACKGROUND_COMPACT_FACTOR_DEFAULT: f64 = 1.25;

/// The most image logs' worth of backlog `MountOptions::backlog_image_logs` may ask for.
pub const BACKLOG_IMAGE_LOGS_MAX: u64 = 1024;

/// `MountOptions::checkpoint_interval_ms` when none is given: 5 s.
pub const CHECKPOINT_INTERVAL_MS_DEFAULT: u64 = 5_000;
/// Shortest checkpoint interval accepted (tests take a checkpoint at nearly every pass).
pub const CHECKPOINT_INTERVAL_MS_MIN: u64 = 1;
/// `MountOptions::direct_write_min_bytes` when none is given (docs/BENCHMARKS.md, *Large writes
/// straight home*).
pub const DIRECT_WRITE_MIN_BYTES_DEFAULT: u64 = 64 << 10;
/// `MountOptions::direct_write_overlap_min_bytes` when none is given: off. On the 2-core VM
/// (load average about 4) a 1 MiB WRITE through the mount took a median 1.2–3.4 ms with the
/// overlap at 256 KiB against 0.85–1.0 ms without, and even its fastest tenth was slower
/// (0.92 against 0.77 ms): starting the thread and running the copy on another core cost more
/// than the overlap saved. Whether a machine with idle cores gains is for its own run to say
/// (docs/FUSE.md, "Sequential write and read"; `bench mount --direct-write-overlap-min-bytes`).
pub const DIRECT_WRITE_OVERLAP_MIN_BYTES_DEFAULT: u64 = 0;
/// Longest checkpoint interval accepted: an hour.
pub const CHECKPOINT_INTERVAL_MS_MAX: u64 = 3_600_000;

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            flush_delay_us: 2_000,
            cache_bytes: 256 << 20,
            background_backend: true,
            access_time: AccessTimeUpdates::default(),
            read_only: false,
            mmp_interval_ms: None,
            backend_workers: 0,
            checkpoint_interval_ms: CHECKPOINT_INTERVAL_MS_DEFAULT,
            key: None,
            direct_write_min_bytes: DIRECT_WRITE_MIN_BYTES_DEFAULT,
            direct_write_overlap_min_bytes: DIRECT_WRITE_OVERLAP_MIN_BYTES_DEFAULT,
            backlog_image_logs: crate::log::BACKLOG_CHECKPOINTS,
            background_compact_factor: BACKGROUND_COMPACT_FACTOR_DEFAULT,
        }
    }
}

pub use crate::extent::SpaceUse;

/// What `FileSystem::defrag` found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefragReport {
    /// The file's space before, every earlier change applied.
    pub before: SpaceUse,
    /// After every compaction record was applied (`before` when nothing was logged).
    pub after: SpaceUse,
    /// Compaction records logged (0: the file held at most the factor times its bytes).
    pub records: u64,
}

/// What mount found and did.
#[derive(Debug, Clone, Default)]
pub struct MountReport {
    /// Log records after the checkpoint that were replayed.
    pub records_replayed: u64,
    /// Checkpoints the replay took on its way (format version 9: each time its images would
    /// fill half the image log).
    pub replay_checkpoints: u64,
    /// A checkpoint found complete in the log but not yet recorded in the superblock.
    pub checkpoint_completed: bool,
    /// Orphan inodes (unlinked while open at the crash) reclaimed.
    pub orphans_reclaimed: u64,
    /// The volume was not unmounted cleanly.
    pub was_dirty: bool,
    /// One superblock copy is invalid, stale or foreign and the other was used: why, in words
    /// (`tandem fsck --repair` rewrites it). `None` when both copies are healthy.
    pub superblock_warning: Option<String>,
    /// The mount is read-only.
    pub read_only: bool,
    /// Why a mount asked for read-write is read-only (the medium refuses writes), if it is.
    pub forced_read_only: Option<String>,
    /// A read-only mount replayed the log (or completed a checkpoint) in memory only: the
    /// medium still needs the replay, which the next read-write mount does.
    pub replayed_in_memory: bool,
    /// A read-write mount took over the multi-mount protection block of a mount that ended
    /// without unmounting: the owner it names.
    pub mmp_taken_over_from: Option<String>,
    /// The volume was of this older format version and now records the current one
    /// (`block::superblock::OLDEST_READABLE_VERSION`); in memory only on a read-only mount.
    pub format_upgraded_from: Option<u32>,
}

/// The state of the operation log, for `tandem stat`.
#[derive(Debug, Clone, Default)]
pub struct LogStatistics {
    pub header_slots: u64,
    pub data_bytes: u64,
    pub records_since_checkpoint: u64,
    pub data_bytes_since_checkpoint: u64,
    pub next_lsn: u64,
    pub durable_lsn: u64,
    pub applied_lsn: u64,
    pub checkpoint_lsn: u64,
    pub checkpoints: u64,
}
