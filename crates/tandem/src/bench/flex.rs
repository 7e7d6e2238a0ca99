//! `tandem bench flex`: inserts and collapses at any byte of a file (issue 12), per operation
//! until applied, with an fsync every `FSYNC_EVERY` operations. tandemfs runs through the library
//! on a file device in /dev/shm; beside it FlexSpace's FlexFile (when `TANDEM_FLEXSPACE_LIB`
//! names a library built from its authors' code, see flexspace.rs), ext4's native
//! `fallocate(INSERT_RANGE / COLLAPSE_RANGE)` for the block-aligned rows, and ext4 moving the
//! tail with reads and writes (the only byte-granular insert ext4 has). Every system's file is
//! compared with a model at the end (flex_model.rs); a difference fails the benchmark.

use super::ext4::Ext4Volume;
use super::flex_model::{fill_pattern, verify, Checked, Model};
use super::flexspace::{FlexFile, FlexSpaceLibrary, LIBRARY_VARIABLE};
use super::table::{format_latency, print_table};
use super::ScratchFile;
use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use crate::size::{format_bytes, format_count, parse_nonzero_size};
use clap::Args;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
use tandemfs::fs::{FileType, FormatOptions, InodeNumber, MountOptions, ROOT_INODE};
use tandemfs::FileSystem;

/// Every system makes its file durable after this many operations (and at the end).
pub const FSYNC_EVERY: u64 = 1000;
const BLOCK_BYTES: u64 = 4096;
/// Longest byte-granular insert or collapse.
const BYTE_LENGTH_MAX: u64 = 4096;
/// ext4's read-and-rewrite column moves about this many bytes of tails by default, so that a
/// row takes seconds instead of the minutes the full count would (issue 12's table: 0.4 s per
/// operation at 1 GiB).
const REWRITE_BUDGET_BYTES: u64 = 16 << 30;
/// ...but never fewer operations than this.
const REWRITE_COUNT_MIN: u64 = 10;
/// Bytes ext4's read-and-rewrite moves per read and write.
const REWRITE_PIECE_BYTES: usize = 8 << 20;
/// Targets of issue 12.
const REWRITE_SPEEDUP_TARGET: f64 = 200.0;
const SPACE_FACTOR_TARGET: f64 = 1.2;
/// "Flat cost from 64 MiB to 8 GiB": met when the largest file costs at most this much more.
const FLAT_COST_TARGET: f64 = 1.25;
const GROWTH_SIZES: [u64; 3] = [64 << 20, 1 << 30, 8 << 30];

#[derive(Args)]
pub struct FlexBenchArguments {
    /// Operations per workload (default: 1,000, and 100,000 for the 100-byte inserts)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub count: Option<u64>,
    /// Largest file: every workload's file is at most this big (default: 1 GiB, 64 MiB for the
    /// 100-byte inserts, and 64 MiB, 1 GiB and 8 GiB for the growth rows)
    #[arg(long, value_parser = parse_nonzero_size)]
    pub file_size: Option<u64>,
    /// Operations in ext4's read-and-rewrite column (default: as many as move about 16 GiB of
    /// tails, at least 10, at most the workload's count)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub rewrite_count: Option<u64>,
    /// Leave out the ext4 columns
    #[arg(long)]
    pub no_ext4: bool,
    /// Leave out the growth rows (64 MiB, 1 GiB, 8 GiB files)
    #[arg(long)]
    pub no_growth: bool,
    /// Seed of the offsets and lengths
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory for the images (default: /dev/shm when it exists, else the temporary directory)
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Insert,
    Collapse,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lengths {
    /// One block at a block-aligned offset: what ext4's fallocate can do.
    Aligned,
    /// 1–4096 bytes at any byte.
    Bytes,
    /// This many bytes at any byte.
    Fixed(u64),
}

impl Lengths {
    fn longest(self) -> u64 {
        match self {
            Lengths::Aligned => BLOCK_BYTES,
            Lengths::Bytes => BYTE_LENGTH_MAX,
            Lengths::Fixed(bytes) => bytes,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub kind: Kind,
    pub lengths: Lengths,
    pub file_bytes: u64,
    pub count: u64,
    pub growth: bool,
}

impl Workload {
    pub fn label(&self) -> String {
        let what = match (self.kind, self.lengths) {
            (Kind::Insert, Lengths::Aligned) => "4 KiB aligned inserts".to_string(),
            (Kind::Collapse, Lengths::Aligned) => "4 KiB aligned collapses".to_string(),
            (Kind::Insert, Lengths::Bytes) => "1–4096 B inserts at any byte".to_string(),
            (Kind::Collapse, Lengths::Bytes) => "1–4096 B collapses at any byte".to_string(),
            (Kind::Insert, Lengths::Fixed(bytes)) => format!("{bytes} B inserts"),
            (Kind::Collapse, Lengths::Fixed(bytes)) => format!("{bytes} B collapses"),
        };
        let prefix = if self.growth { "growth: " } else { "" };
        format!("{prefix}{} × {what}, {}", format_count(self.count), format_bytes(self.file_bytes))
    }
}

/// The workloads of issue 12, shrunk by `--count` and `--file-size`.
pub fn workloads(count: Option<u64>, file_size: Option<u64>, growth: bool) -> Vec<Workload> {
    let cap = |bytes: u64| file_size.map_or(bytes, |largest| bytes.min(largest));
    let count_or = |default: u64| count.unwrap_or(default);
    let one_gib = cap(1 << 30);
    let mut list = vec![
        Workload {
            kind: Kind::Insert,
            lengths: Lengths::Aligned,
            file_bytes: one_gib,
            count: count_or(1000),
            growth: false,
        },
        Workload {
            kind: Kind::Collapse,
            lengths: Lengths::Aligned,
            file_bytes: one_gib,
            count: count_or(1000),
            growth: false,
        },
        Workload {
            kind: Kind::Insert,
            lengths: Lengths::Bytes,
            file_bytes: one_gib,
            count: count_or(1000),
            growth: false,
        },
        Workload {
            kind: Kind::Collapse,
            lengths: Lengths::Bytes,
            file_bytes: one_gib,
            count: count_or(1000),
            growth: false,
        },
        Workload {
            kind: Kind::Insert,
            lengths: Lengths::Fixed(100),
            file_bytes: cap(64 << 20),
            count: count_or(100_000),
            growth: false,
        },
    ];
    if growth {
        for kind in [Kind::Insert, Kind::Collapse] {
            let mut sizes: Vec<u64> = GROWTH_SIZES.iter().map(|&bytes| cap(bytes)).collect();
            sizes.dedup();
            for file_bytes in sizes {
                list.push(Workload { kind, lengths: Lengths::Bytes, file_bytes, count: count_or(1000), growth: true });
            }
        }
    }
    list
}

/// One operation: where, and how many bytes (an insert's bytes are operation `index`'s
/// pattern).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operation {
    pub offset: u64,
    pub length: u64,
}

/// The operations of a workload, the same for every system. Aligned inserts land strictly
/// inside the file and aligned collapses end before its end, as ext4's fallocate demands.
pub fn plan(workload: &Workload, seed: u64) -> Result<Vec<Operation>, String> {
    let longest = workload.lengths.longest();
    if workload.kind == Kind::Collapse && workload.file_bytes < workload.count * longest + 2 * BLOCK_BYTES {
        return Err(format!(
            "{}: a file of {} cannot take {} collapses of up to {longest} bytes (raise --file-size or lower --count)",
            workload.label(),
            format_bytes(workload.file_bytes),
            workload.count
        ));
    }
    if workload.lengths == Lengths::Aligned && workload.file_bytes < 2 * BLOCK_BYTES {
        return Err(format!("{}: the file must hold at least two blocks", workload.label()));
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ workload.file_bytes.rotate_left(17) ^ workload.count);
    let mut size = workload.file_bytes;
    let mut operations = Vec::with_capacity(workload.count as usize);
    for _ in 0..workload.count {
        let length = match workload.lengths {
            Lengths::Aligned => BLOCK_BYTES,
            Lengths::Bytes => rng.gen_range(1..=BYTE_LENGTH_MAX),
            Lengths::Fixed(bytes) => bytes,
        };
        let offset = match (workload.kind, workload.lengths) {
            (Kind::Insert, Lengths::Aligned) => rng.gen_range(0..size / BLOCK_BYTES) * BLOCK_BYTES,
            (Kind::Collapse, Lengths::Aligned) => rng.gen_range(0..size / BLOCK_BYTES - 1) * BLOCK_BYTES,
            (Kind::Insert, _) => rng.gen_range(0..=size),
            (Kind::Collapse, _) => rng.gen_range(0..=size - length),
        };
        match workload.kind {
            Kind::Insert => size += length,
            Kind::Collapse => size -= length,
        }
        operations.push(Operation { offset, length });
    }
    Ok(operations)
}

/// The inserted bytes of every operation, made before the clock starts: operation i's bytes
/// are `data[starts[i]..starts[i + 1]]`.
pub struct InsertData {
    bytes: Vec<u8>,
    starts: Vec<usize>,
}

impl InsertData {
    pub fn new(kind: Kind, operations: &[Operation]) -> InsertData {
        let mut starts = vec![0usize];
        let total: u64 =
            if kind == Kind::Insert { operations.iter().map(|operation| operation.length).sum() } else { 0 };
        let mut bytes = vec![0u8; total as usize];
        if kind == Kind::Insert {
            for (index, operation) in operations.iter().enumerate() {
                let start = *starts.last().expect("starts with 0");
                let end = start + operation.length as usize;
                fill_pattern(index as u64, 0, &mut bytes[start..end]);
                starts.push(end);
            }
        }
        InsertData { bytes, starts }
    }

    fn of(&self, index: usize) -> &[u8] {
        &self.bytes[self.starts[index]..self.starts[index + 1]]
    }
}

/// The model after the first `count` operations.
pub fn model_after(workload: &Workload, operations: &[Operation], count: usize) -> Model {
    let mut model = Model::zeros(workload.file_bytes);
    for (index, operation) in operations.iter().take(count).enumerate() {
        match workload.kind {
            Kind::Insert => model.insert(operation.offset, index as u64, operation.length),
            Kind::Collapse => model.collapse(operation.offset, operation.length),
        }
    }
    model
}

/// A file under test on one system.
pub trait FlexTarget {
    fn name(&self) -> &'static str;
    fn insert(&mut self, offset: u64, data: &[u8]) -> Result<(), String>;
    fn collapse(&mut self, offset: u64, length: u64) -> Result<(), String>;
    /// The fsync every `FSYNC_EVERY` operations.
    fn sync(&mut self) -> Result<(), String>;
    /// The end of the timed span: durable and, for tandemfs, applied by the back end.
    fn finish(&mut self) -> Result<(), String>;
    fn size(&mut self) -> Result<u64, String>;
    fn read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), String>;
    /// Bytes of space the file holds, where the system can tell.
    fn held_bytes(&mut self) -> Option<u64>;
    /// Compaction after the run, where the system has one (tandemfs's `defrag`): whether it
    /// rewrote anything. Untimed per operation; its own time is reported.
    fn compact(&mut self) -> Result<bool, String> {
        Ok(false)
    }
}

/// The space-amplification factor at which the benchmark compacts (issue 12's target).
pub const COMPACT_FACTOR: f64 = SPACE_FACTOR_TARGET;

/// A compaction after the run: its time, and the space held after it (bytes verified again).
#[derive(Clone, Copy, Debug)]
pub struct Compaction {
    pub seconds: f64,
    pub held_bytes: Option<u64>,
    /// Bytes compared with the model after the compaction.
    pub checked_bytes: u64,
}

/// What one system measured on one workload.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    pub seconds_per_operation: f64,
    pub operations: u64,
    pub held_bytes: Option<u64>,
    pub mapped_bytes: u64,
    pub checked: Checked,
    /// Present when the system compacted the file after the run.
    pub compaction: Option<Compaction>,
}

impl Outcome {
    fn space_factor(&self) -> Option<f64> {
        self.held_bytes.filter(|_| self.mapped_bytes > 0).map(|held| held as f64 / self.mapped_bytes as f64)
    }
    fn compacted_space_factor(&self) -> Option<f64> {
        let held = self.compaction?.held_bytes?;
        (self.mapped_bytes > 0).then(|| held as f64 / self.mapped_bytes as f64)
    }
}

/// Runs the first `count` operations on `target`, timed until applied, then checks its bytes
/// against the model.
pub fn measure(
    target: &mut dyn FlexTarget,
    workload: &Workload,
    operations: &[Operation],
    data: &InsertData,
    count: usize,
) -> Result<Outcome, String> {
    assert!(count >= 1 && count <= operations.len());
    let started = Instant::now();
    for (index, operation) in operations.iter().take(count).enumerate() {
        match workload.kind {
            Kind::Insert => target.insert(operation.offset, data.of(index)),
            Kind::Collapse => target.collapse(operation.offset, operation.length),
        }
        .map_err(|error| format!("{} operation {index}: {error}", target.name()))?;
        if (index as u64 + 1).is_multiple_of(FSYNC_EVERY) {
            target.sync().map_err(|error| format!("{} fsync: {error}", target.name()))?;
            crate::interrupt::check()?;
        }
    }
    target.finish().map_err(|error| format!("{} final sync: {error}", target.name()))?;
    let seconds = started.elapsed().as_secs_f64();
    let model = model_after(workload, operations, count);
    let size = target.size()?;
    let name = target.name();
    let checked = verify(name, &model, size, &mut |offset, buffer| target.read(offset, buffer))?;
    let held_bytes = target.held_bytes();
    // Compaction keeps every byte: the file is compared with the model again after it.
    let compaction_started = Instant::now();
    let compaction = if target.compact().map_err(|error| format!("{name} compaction: {error}"))? {
        let seconds = compaction_started.elapsed().as_secs_f64();
        let again = verify(name, &model, size, &mut |offset, buffer| target.read(offset, buffer))
            .map_err(|error| format!("after compaction: {error}"))?;
        Some(Compaction { seconds, held_bytes: target.held_bytes(), checked_bytes: again.bytes })
    } else {
        None
    };
    Ok(Outcome {
        seconds_per_operation: seconds / count as f64,
        operations: count as u64,
        held_bytes,
        mapped_bytes: size,
        checked,
        compaction,
    })
}

// ---------------------------------------------------------------------------------- tandemfs

/// A tandemfs volume on a file device with one file of `file_bytes` reserved with `allocate`
/// (reads as zeros; every block taken, none written, so the image stays sparse).
pub struct TandemTarget {
    fs: Option<FileSystem>,
    file: InodeNumber,
    _image: ScratchFile,
}

impl TandemTarget {
    pub fn create(image: &Path, file_bytes: u64, count: u64) -> Result<TandemTarget, String> {
        let image_file = ScratchFile { path: image.to_path_buf() };
        // Room for the file, the log and the metadata, and every operation taking a few blocks
        // (a cut copies the rest of its block today). The image is sparse.
        let volume_bytes = file_bytes + file_bytes / 8 + (1 << 30) + count * 3 * BLOCK_BYTES;
        let options =
            FileDeviceOptions { create_size_bytes: Some(volume_bytes), lock_exclusive: true, read_only: false };
        let device: Arc<dyn Device> = Arc::new(
            FileDevice::open(image, options).map_err(|error| format!("cannot create {}: {error}", image.display()))?,
        );
        FileSystem::format(device.clone(), &FormatOptions::default()).map_err(|error| format!("mkfs: {error}"))?;
        let (fs, _) = FileSystem::mount(device, &MountOptions::default()).map_err(|error| format!("mount: {error}"))?;
        let mut target = TandemTarget { fs: Some(fs), file: 0, _image: image_file };
        let fs = target.fs();
        let file = fs
            .create(ROOT_INODE, b"flex", FileType::Regular, 0o644, 0, 0, 0)
            .map_err(|error| format!("create: {error}"))?
            .inode;
        fs.allocate(file, 0, file_bytes, false).map_err(|error| format!("allocate {file_bytes} bytes: {error}"))?;
        fs.checkpoint().map_err(|error| format!("checkpoint: {error}"))?;
        target.file = file;
        Ok(target)
    }

    fn fs(&self) -> &FileSystem {
        self.fs.as_ref().expect("mounted until dropped")
    }
}

impl FlexTarget for TandemTarget {
    fn name(&self) -> &'static str {
        "tandemfs"
    }
    fn insert(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        self.fs().insert(self.file, offset, data).map_err(|error| error.to_string())
    }
    fn collapse(&mut self, offset: u64, length: u64) -> Result<(), String> {
        self.fs().collapse_range(self.file, offset, length).map_err(|error| error.to_string())
    }
    fn sync(&mut self) -> Result<(), String> {
        self.fs().fsync(self.file, false).map_err(|error| error.to_string())
    }
    fn finish(&mut self) -> Result<(), String> {
        self.sync()?;
        self.fs().checkpoint().map_err(|error| format!("checkpoint: {error}"))
    }
    fn size(&mut self) -> Result<u64, String> {
        self.fs().get_attributes(self.file).map(|attributes| attributes.size_bytes).map_err(|error| error.to_string())
    }
    fn read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), String> {
        let mut done = 0;
        // A read returns at least one byte inside the file; the bound is one pass per byte.
        for _ in 0..=buffer.len() {
            if done == buffer.len() {
                return Ok(());
            }
            let read = self
                .fs()
                .read(self.file, offset + done as u64, &mut buffer[done..])
                .map_err(|error| error.to_string())?;
            if read == 0 {
                return Err(format!("read at {} returned nothing", offset + done as u64));
            }
            done += read;
        }
        Err("the read did not finish".into())
    }
    fn held_bytes(&mut self) -> Option<u64> {
        self.fs().get_attributes(self.file).ok().map(|attributes| attributes.blocks_512 * 512)
    }
    /// `defrag` when the file holds more than `COMPACT_FACTOR` times its bytes, then a
    /// checkpoint, so that the old blocks are free again and `blocks_512` is the applied count.
    fn compact(&mut self) -> Result<bool, String> {
        let report = self.fs().defrag(self.file, COMPACT_FACTOR).map_err(|error| error.to_string())?;
        if report.records == 0 {
            return Ok(false);
        }
        self.fs().checkpoint().map_err(|error| format!("checkpoint: {error}"))?;
        Ok(true)
    }
}

impl Drop for TandemTarget {
    fn drop(&mut self) {
        if let Some(fs) = self.fs.take() {
            if let Err(error) = fs.unmount() {
                eprintln!("tandem: warning: unmount the bench flex volume: {error}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------- FlexSpace

pub struct FlexSpaceTarget<'library> {
    file: FlexFile<'library>,
}

impl FlexTarget for FlexSpaceTarget<'_> {
    fn name(&self) -> &'static str {
        "FlexSpace"
    }
    fn insert(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        self.file.insert(offset, data)
    }
    fn collapse(&mut self, offset: u64, length: u64) -> Result<(), String> {
        self.file.collapse(offset, length)
    }
    fn sync(&mut self) -> Result<(), String> {
        self.file.sync();
        Ok(())
    }
    fn finish(&mut self) -> Result<(), String> {
        self.sync()
    }
    fn size(&mut self) -> Result<u64, String> {
        Ok(self.file.size())
    }
    fn read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), String> {
        self.file.read(offset, buffer)
    }
    fn held_bytes(&mut self) -> Option<u64> {
        self.file.held_bytes()
    }
}

// ---------------------------------------------------------------------------------- ext4

/// A file on ext4, reserved with fallocate (unwritten extents, reads as zeros). `native`: inserts
/// and collapses with fallocate's INSERT_RANGE and COLLAPSE_RANGE (block-aligned only; an
/// insert's bytes are then written into the hole); otherwise the tail is moved with reads and
/// writes.
pub struct Ext4Target {
    file: std::fs::File,
    native: bool,
    size: u64,
    piece: Vec<u8>,
    _volume: Ext4Volume,
}

impl Ext4Target {
    pub fn create(image: &Path, file_bytes: u64, native: bool) -> Result<Ext4Target, String> {
        let volume_bytes = file_bytes + file_bytes / 4 + (512 << 20);
        let volume = Ext4Volume::create(image, volume_bytes, 1024)?;
        let path = volume.mountpoint().join("flex");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|error| format!("create {}: {error}", path.display()))?;
        // SAFETY: fallocate on a descriptor we own.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, file_bytes as libc::off_t) } != 0 {
            return Err(format!("fallocate {file_bytes} bytes: {}", std::io::Error::last_os_error()));
        }
        file.sync_all().map_err(|error| format!("fsync: {error}"))?;
        Ok(Ext4Target { file, native, size: file_bytes, piece: vec![0u8; REWRITE_PIECE_BYTES], _volume: volume })
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, length: u64) -> Result<(), String> {
        // SAFETY: fallocate on a descriptor we own.
        let result =
            unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as libc::off_t, length as libc::off_t) };
        if result != 0 {
            return Err(format!("fallocate({mode:#x}, {offset}, {length}): {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Moves the bytes from `from` to the end of the file by `shift` bytes (up when positive),
    /// a piece at a time, from the end when moving up so nothing is overwritten before it is read.
    fn move_tail(&mut self, from: u64, up: bool, shift: u64) -> Result<(), String> {
        let tail_bytes = self.size - from;
        let pieces = tail_bytes.div_ceil(REWRITE_PIECE_BYTES as u64);
        for piece_index in 0..pieces {
            let piece_index = if up { pieces - 1 - piece_index } else { piece_index };
            let start = from + piece_index * REWRITE_PIECE_BYTES as u64;
            let length = (self.size - start).min(REWRITE_PIECE_BYTES as u64) as usize;
            let buffer = &mut self.piece[..length];
            self.file.read_exact_at(buffer, start).map_err(|error| format!("read at {start}: {error}"))?;
            let target = if up { start + shift } else { start - shift };
            self.file.write_all_at(buffer, target).map_err(|error| format!("write at {target}: {error}"))?;
        }
        Ok(())
    }
}

impl FlexTarget for Ext4Target {
    fn name(&self) -> &'static str {
        if self.native {
            "ext4 fallocate"
        } else {
            "ext4 read-and-rewrite"
        }
    }
    fn insert(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        let length = data.len() as u64;
        if self.native {
            self.fallocate(libc::FALLOC_FL_INSERT_RANGE, offset, length)?;
        } else {
            self.move_tail(offset, true, length)?;
        }
        self.file.write_all_at(data, offset).map_err(|error| format!("write at {offset}: {error}"))?;
        self.size += length;
        Ok(())
    }
    fn collapse(&mut self, offset: u64, length: u64) -> Result<(), String> {
        if self.native {
            self.fallocate(libc::FALLOC_FL_COLLAPSE_RANGE, offset, length)?;
        } else {
            self.move_tail(offset + length, false, length)?;
            self.file.set_len(self.size - length).map_err(|error| format!("truncate: {error}"))?;
        }
        self.size -= length;
        Ok(())
    }
    fn sync(&mut self) -> Result<(), String> {
        self.file.sync_all().map_err(|error| error.to_string())
    }
    fn finish(&mut self) -> Result<(), String> {
        self.sync()
    }
    fn size(&mut self) -> Result<u64, String> {
        self.file.metadata().map(|metadata| metadata.len()).map_err(|error| error.to_string())
    }
    fn read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), String> {
        self.file.read_exact_at(buffer, offset).map_err(|error| error.to_string())
    }
    fn held_bytes(&mut self) -> Option<u64> {
        self.file.metadata().ok().map(|metadata| metadata.blocks() * 512)
    }
}

// ---------------------------------------------------------------------------------- the run

/// A workload's results; a peer that was not run is None.
pub struct Row {
    pub workload: Workload,
    pub tandem: Outcome,
    pub flexspace: Option<Outcome>,
    pub ext4_native: Option<Outcome>,
    pub ext4_rewrite: Option<Outcome>,
}

/// Which peers run.
pub struct Peers<'a> {
    pub flexspace: Option<&'a FlexSpaceLibrary>,
    pub ext4: bool,
    pub rewrite_count: Option<u64>,
}

fn rewrite_count(workload: &Workload, chosen: Option<u64>) -> u64 {
    let default = (REWRITE_BUDGET_BYTES / (workload.file_bytes / 2).max(1)).max(REWRITE_COUNT_MIN);
    chosen.unwrap_or(default).min(workload.count)
}

/// Measures one workload on every system; the images live in `scratch`.
pub fn run_workload(workload: &Workload, peers: &Peers, scratch: &Path, seed: u64) -> Result<Row, String> {
    let operations = plan(workload, seed)?;
    let data = InsertData::new(workload.kind, &operations);
    let count = operations.len();
    let label = workload.label();
    let image = |what: &str| scratch.join(format!("tandem-bench-flex-{what}-{}.img", std::process::id()));
    eprintln!("{label}: tandemfs");
    let tandem = super::contain_panic("tandemfs", || {
        let mut target = TandemTarget::create(&image("tandemfs"), workload.file_bytes, workload.count)?;
        measure(&mut target, workload, &operations, &data, count)
    })
    .map_err(|error| format!("{label}: {error}"))?;
    let flexspace = match peers.flexspace {
        Some(library) => {
            eprintln!("{label}: FlexSpace");
            let directory = scratch.join(format!("tandem-bench-flex-flexspace-{}", std::process::id()));
            let file = FlexFile::create(library, &directory, workload.file_bytes)
                .map_err(|error| format!("{label}: {error}"))?;
            let mut target = FlexSpaceTarget { file };
            Some(
                measure(&mut target, workload, &operations, &data, count)
                    .map_err(|error| format!("{label}: {error}"))?,
            )
        }
        None => None,
    };
    let ext4_native = if peers.ext4 && workload.lengths == Lengths::Aligned {
        eprintln!("{label}: ext4 fallocate");
        let mut target = Ext4Target::create(&image("ext4"), workload.file_bytes, true)?;
        Some(measure(&mut target, workload, &operations, &data, count).map_err(|error| format!("{label}: {error}"))?)
    } else {
        None
    };
    let ext4_rewrite = if peers.ext4 && !workload.growth {
        let rewrites = rewrite_count(workload, peers.rewrite_count) as usize;
        eprintln!("{label}: ext4 read-and-rewrite ({rewrites} operations)");
        let mut target = Ext4Target::create(&image("ext4"), workload.file_bytes, false)?;
        Some(
            measure(&mut target, workload, &operations, &data, rewrites)
                .map_err(|error| format!("{label}: {error}"))?,
        )
    } else {
        None
    };
    Ok(Row { workload: workload.clone(), tandem, flexspace, ext4_native, ext4_rewrite })
}

pub fn run(arguments: FlexBenchArguments) -> CliResult<i32> {
    let scratch = arguments.dir.clone().unwrap_or_else(super::scratch_directory);
    if !scratch.is_dir() {
        return Err(CliError::new(format!("bench flex: {} is not a directory", scratch.display())));
    }
    let library =
        FlexSpaceLibrary::from_environment().map_err(|error| CliError::new(format!("bench flex: {error}")))?;
    let list = workloads(arguments.count, arguments.file_size, !arguments.no_growth);
    // A file too small for its collapses is a usage error: say so before anything runs.
    for workload in &list {
        plan(workload, arguments.seed).map_err(|error| CliError::new(format!("bench flex: {error}")))?;
    }
    let largest = list.iter().map(|workload| workload.file_bytes).max().unwrap_or(0);
    // FlexFile has no holes: its file is written in full. The other images stay sparse.
    if library.is_some() {
        super::require_free_space(&scratch, largest + (1 << 30), "lower --file-size or --no-growth")?;
    }
    let ext4_reason = if arguments.no_ext4 { Some("--no-ext4".to_string()) } else { Ext4Volume::unavailable_reason() };
    let peers =
        Peers { flexspace: library.as_ref(), ext4: ext4_reason.is_none(), rewrite_count: arguments.rewrite_count };
    println!(
        "tandem bench flex: per operation until applied, fsync every {} operations, images on {}, {} cores",
        format_count(FSYNC_EVERY),
        scratch.display(),
        std::thread::available_parallelism().map_or(1, |cores| cores.get())
    );
    match &library {
        Some(library) => println!("FlexSpace: {}", library.path.display()),
        None => println!(
            "FlexSpace: not given ({LIBRARY_VARIABLE} names no library; docs/BENCHMARKS.md says how to build one)"
        ),
    }
    if let Some(reason) = &ext4_reason {
        println!("ext4: skipped ({reason})");
    }
    // The process's accelerator runtime is made by the first data checksum: on a host with a
    // GPU that opens the GPU and calibrates it against the CPU, most of a second, which landed
    // inside the first row's timed span (the aligned inserts: 750-800 µs per operation on the
    // 16-core GPU host against 25-80 on a 2-core VM without one). Made here, before any row.
    let started = Instant::now();
    let accelerator = tandemfs::block::volume::default_accelerator();
    println!(
        "accelerator runtime made in {:.3} s, before the timed spans ({})",
        started.elapsed().as_secs_f64(),
        accelerator.describe().lines().find(|line| line.starts_with("GPU")).unwrap_or("no GPU line").trim()
    );
    let mut rows: Vec<Row> = Vec::new();
    for workload in &list {
        let row = run_workload(workload, &peers, &scratch, arguments.seed)
            .map_err(|error| CliError::new(format!("bench flex: {error}")))?;
        rows.push(row);
    }
    println!();
    print_report(&rows);
    Ok(EXIT_SUCCESS)
}

fn latency_cell(outcome: Option<&Outcome>, absent: &str) -> String {
    outcome.map_or(absent.to_string(), |outcome| format_latency(outcome.seconds_per_operation))
}

fn space_cell(outcome: Option<&Outcome>) -> String {
    match outcome.and_then(|outcome| outcome.space_factor()) {
        Some(factor) => format!("{factor:.2}×"),
        None => "-".into(),
    }
}

fn compaction_cell(outcome: &Outcome) -> String {
    match (outcome.compaction, outcome.compacted_space_factor()) {
        (Some(compaction), Some(factor)) => {
            let verdict = if factor <= SPACE_FACTOR_TARGET { "met" } else { "missed" };
            format!("{factor:.2}× {verdict} ({:.2} s)", compaction.seconds)
        }
        _ => "-".into(),
    }
}

/// The table, the verification line and the growth and space verdicts.
pub fn print_report(rows: &[Row]) {
    let headers = [
        "workload",
        "tandemfs",
        "FlexSpace",
        "ext4 fallocate",
        "ext4 read-and-rewrite",
        "vs FlexSpace (≤ 1×)",
        "vs ext4 rewrite (≥ 200×)",
        "space tandemfs",
        "space FlexSpace",
        "space ext4",
        "tandemfs after defrag",
    ];
    let mut table = Vec::new();
    for row in rows {
        let tandem = row.tandem.seconds_per_operation;
        let versus_flexspace = match &row.flexspace {
            Some(peer) => {
                let ratio = tandem / peer.seconds_per_operation;
                format!("{ratio:.1}× {}", if ratio <= 1.0 { "met" } else { "missed" })
            }
            None => "-".into(),
        };
        let versus_rewrite = match (&row.ext4_rewrite, row.workload.lengths) {
            (Some(peer), Lengths::Bytes | Lengths::Fixed(_)) => {
                let speedup = peer.seconds_per_operation / tandem;
                format!("{speedup:.0}× {}", if speedup >= REWRITE_SPEEDUP_TARGET { "met" } else { "missed" })
            }
            (Some(peer), Lengths::Aligned) => format!("{:.0}× (aligned)", peer.seconds_per_operation / tandem),
            (None, _) => "-".into(),
        };
        let rewrite = match &row.ext4_rewrite {
            Some(peer) if peer.operations < row.workload.count => {
                format!("{} ({} ops)", format_latency(peer.seconds_per_operation), format_count(peer.operations))
            }
            other => latency_cell(other.as_ref(), "-"),
        };
        let native_absent = if row.workload.lengths == Lengths::Aligned { "-" } else { "impossible" };
        table.push(vec![
            row.workload.label(),
            format_latency(tandem),
            latency_cell(row.flexspace.as_ref(), "not given"),
            latency_cell(row.ext4_native.as_ref(), native_absent),
            rewrite,
            versus_flexspace,
            versus_rewrite,
            space_cell(Some(&row.tandem)),
            space_cell(row.flexspace.as_ref()),
            space_cell(row.ext4_native.as_ref().or(row.ext4_rewrite.as_ref())),
            compaction_cell(&row.tandem),
        ]);
    }
    print_table(&headers, &table);
    println!();
    println!("µs per operation until applied (tandemfs: fsync and a checkpoint inside the timed span).");
    println!(
        "space: blocks the file holds ÷ its size after the run; tandemfs after defrag: after `FileSystem::defrag` at \
         {COMPACT_FACTOR}× and a checkpoint, with its time (target ≤ {SPACE_FACTOR_TARGET}× after compaction; '-': \
         at most {COMPACT_FACTOR}× already). ext4 read-and-rewrite runs fewer operations where shown."
    );
    let checked: u64 = rows
        .iter()
        .flat_map(|row| {
            [Some(&row.tandem), row.flexspace.as_ref(), row.ext4_native.as_ref(), row.ext4_rewrite.as_ref()]
        })
        .flatten()
        .map(|outcome| outcome.checked.bytes + outcome.compaction.map_or(0, |compaction| compaction.checked_bytes))
        .sum();
    println!(
        "verified: every system's final bytes equal the model's ({} compared; files over 256 MiB sampled around every edit)",
        format_bytes(checked)
    );
    print_flat_cost(rows);
}

/// Growth of the per-operation cost from the smallest to the largest growth file.
fn print_flat_cost(rows: &[Row]) {
    for kind in [Kind::Insert, Kind::Collapse] {
        let growth: Vec<&Row> = rows.iter().filter(|row| row.workload.growth && row.workload.kind == kind).collect();
        let (Some(first), Some(last)) = (growth.first(), growth.last()) else { continue };
        if growth.len() < 2 {
            continue;
        }
        let factor = last.tandem.seconds_per_operation / first.tandem.seconds_per_operation;
        let peer = match (&first.flexspace, &last.flexspace) {
            (Some(small), Some(large)) => {
                format!(", FlexSpace {:.2}×", large.seconds_per_operation / small.seconds_per_operation)
            }
            _ => String::new(),
        };
        println!(
            "flat cost, {} {} → {}: tandemfs {factor:.2}× ({}, target ≤ {FLAT_COST_TARGET}×){peer}",
            if kind == Kind::Insert { "inserts" } else { "collapses" },
            format_bytes(first.workload.file_bytes),
            format_bytes(last.workload.file_bytes),
            if factor <= FLAT_COST_TARGET { "met" } else { "missed" }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_workloads_are_issue_12s() {
        let list = workloads(None, None, true);
        assert_eq!(list.len(), 11);
        assert_eq!((list[0].file_bytes, list[0].count), (1 << 30, 1000));
        assert_eq!((list[4].file_bytes, list[4].count, list[4].lengths), (64 << 20, 100_000, Lengths::Fixed(100)));
        assert_eq!(
            list.iter().filter(|workload| workload.growth).map(|workload| workload.file_bytes).max(),
            Some(8 << 30)
        );
        let shrunk = workloads(Some(7), Some(1 << 20), true);
        assert_eq!(shrunk.len(), 7, "the growth sizes collapse into one");
        assert!(shrunk.iter().all(|workload| workload.count == 7 && workload.file_bytes == 1 << 20));
    }

    #[test]
    fn plans_stay_inside_the_file_and_refuse_too_small_files() {
        for workload in workloads(Some(300), Some(4 << 20), false) {
            let operations = plan(&workload, 9).unwrap();
            let mut size = workload.file_bytes;
            for operation in operations {
                match workload.kind {
                    Kind::Insert => {
                        assert!(operation.offset <= size);
                        if workload.lengths == Lengths::Aligned {
                            assert!(operation.offset < size && operation.offset % BLOCK_BYTES == 0);
                        }
                        size += operation.length;
                    }
                    Kind::Collapse => {
                        assert!(operation.offset + operation.length <= size);
                        if workload.lengths == Lengths::Aligned {
                            assert!(operation.offset + operation.length < size && operation.offset % BLOCK_BYTES == 0);
                        }
                        size -= operation.length;
                    }
                }
            }
        }
        let too_small =
            Workload { kind: Kind::Collapse, lengths: Lengths::Bytes, file_bytes: 8192, count: 100, growth: false };
        assert!(plan(&too_small, 1).unwrap_err().contains("raise --file-size"));
    }

    /// The CI run of the benchmark on the library alone: small files, every workload kind,
    /// tandemfs's bytes verified against the model, before and after its compaction.
    #[test]
    fn a_short_run_on_the_library_completes_and_verifies() {
        let scratch = std::env::temp_dir();
        let peers = Peers { flexspace: None, ext4: false, rewrite_count: None };
        let mut rows = Vec::new();
        let mut compacted = 0;
        for workload in workloads(Some(1500), Some(16 << 20), true) {
            let row = run_workload(&workload, &peers, &scratch, 5).unwrap();
            assert_eq!(row.tandem.operations, 1500);
            assert!(row.tandem.checked.whole_file && row.tandem.checked.bytes == row.tandem.mapped_bytes);
            assert!(row.tandem.held_bytes.unwrap() >= row.tandem.mapped_bytes / 2);
            // A file that holds more than the factor is compacted to within it, bytes checked.
            if row.tandem.space_factor().unwrap() > COMPACT_FACTOR {
                let compaction = row.tandem.compaction.expect("a fragmented file is compacted");
                assert_eq!(compaction.checked_bytes, row.tandem.mapped_bytes);
                assert!(row.tandem.compacted_space_factor().unwrap() <= SPACE_FACTOR_TARGET, "{}", workload.label());
                compacted += 1;
            }
            rows.push(row);
        }
        assert!(compacted > 0, "no row fragmented its file: the compaction went untested");
        print_report(&rows);
    }

    /// FlexSpace through its library, when `TANDEM_FLEXSPACE_LIB` names one (skipped with the
    /// reason otherwise): a short run of every workload kind verifies against the model, as
    /// tandemfs's does.
    #[test]
    fn flexspace_through_its_library_verifies_when_given() {
        let library = match FlexSpaceLibrary::from_environment() {
            Ok(Some(library)) => library,
            Ok(None) => {
                eprintln!("skipped: {LIBRARY_VARIABLE} names no FlexSpace library (docs/BENCHMARKS.md)");
                return;
            }
            Err(error) => panic!("{error}"),
        };
        let scratch = std::env::temp_dir();
        let peers = Peers { flexspace: Some(&library), ext4: false, rewrite_count: None };
        for workload in workloads(Some(1200), Some(8 << 20), false) {
            let row = run_workload(&workload, &peers, &scratch, 11).unwrap();
            let flexspace = row.flexspace.expect("FlexSpace ran");
            assert_eq!(flexspace.operations, 1200);
            assert!(flexspace.checked.whole_file && flexspace.checked.bytes == flexspace.mapped_bytes);
            assert_eq!(flexspace.mapped_bytes, row.tandem.mapped_bytes, "both files end the same size");
        }
    }

    /// A target that gets one byte of the later inserts wrong (the size stays right): the run
    /// must fail with the model's message naming the system and the byte.
    #[test]
    fn a_system_with_wrong_bytes_fails_the_run() {
        struct Lossy(Vec<u8>);
        impl FlexTarget for Lossy {
            fn name(&self) -> &'static str {
                "lossy"
            }
            fn insert(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
                let mut kept = data.to_vec();
                if self.0.len() > 3000 {
                    kept[0] ^= 0x01;
                }
                self.0.splice(offset as usize..offset as usize, kept);
                Ok(())
            }
            fn collapse(&mut self, offset: u64, length: u64) -> Result<(), String> {
                self.0.drain(offset as usize..(offset + length) as usize);
                Ok(())
            }
            fn sync(&mut self) -> Result<(), String> {
                Ok(())
            }
            fn finish(&mut self) -> Result<(), String> {
                Ok(())
            }
            fn size(&mut self) -> Result<u64, String> {
                Ok(self.0.len() as u64)
            }
            fn read(&mut self, offset: u64, buffer: &mut [u8]) -> Result<(), String> {
                buffer.copy_from_slice(&self.0[offset as usize..offset as usize + buffer.len()]);
                Ok(())
            }
            fn held_bytes(&mut self) -> Option<u64> {
                None
            }
        }
        let workload =
            Workload { kind: Kind::Insert, lengths: Lengths::Fixed(100), file_bytes: 2000, count: 40, growth: false };
        let operations = plan(&workload, 2).unwrap();
        let data = InsertData::new(workload.kind, &operations);
        let mut exact = Lossy(Vec::new());
        exact.0.resize(2000, 0);
        // The same target keeps every byte while the file is small: no loss, the run passes.
        let passing = Workload { count: 5, ..workload.clone() };
        let outcome = measure(&mut exact, &passing, &operations[..5], &data, 5).unwrap();
        assert_eq!(outcome.mapped_bytes, 2500);
        let mut lossy = Lossy(vec![0; 2000]);
        let error = measure(&mut lossy, &workload, &operations, &data, 40).unwrap_err();
        assert!(error.contains("lossy: byte ") && error.contains("the model says"), "{error}");
    }
}
