//! `log`: the front-end operation log (NICFS): record headers kept apart from record data.
//!
//! Every change is a record appended here. A record is durable once its header and payload
//! bytes are flushed; the back end applies records later, a checkpoint moves the tail forward
//! ([`Log::release`]) and mount replays the records after the tail ([`Log::recover`]). The
//! payload is opaque: a `kind` and bytes. The format, group commit and space accounting are
//! described in `docs/LOG.md`.
//!
//! Group commit is leader/follower: `append` copies the record into an in-memory buffer (headers
//! and payload bytes apart, as on disk) under a short lock. The first caller of `wait_durable`
//! that finds no flush in progress becomes the leader: it takes the whole buffer, writes the
//! header bytes and the payload bytes (one `write_at` each, two where a ring wraps) and flushes
//! the device once. Callers that arrive while a flush is in progress sleep and then either find
//! their record durable or lead the next flush, which carries everything appended meanwhile.
//! A background thread plays leader for records nobody waits for, `flush_delay_us` after the
//! oldest of them was appended.

pub mod format;
pub mod pledge;
mod recover;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex, MutexGuard};
use portable_atomic::AtomicU128;

use crate::device::Device;
use crate::error::{Error, Result};

pub use format::{LogGeometry, RecordHeader, HEADERS_PER_BLOCK, HEADER_SIZE, MAX_PAYLOAD_BYTES};
pub use pledge::Pledges;
pub use recover::LogDamage;

/// What `Log::append_pledged` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Appended {
    /// The record's lsn.
    At(u64),
    /// The normal share of the log holds no room for the record's bytes.
    LogFull,
    /// The record fits, but not with the images pledged to the records before it
    /// (`pledge.rs`; with an image log, not under the backlog's bound): applying some of them
    /// makes room.
    Pledged,
}

/// Why a reservation was refused.
enum Refused {
    Full,
    Pledged,
}

/// With an image log attached, the records not yet applied may stand for this many image logs'
/// worth of checkpoint images (by their bounds) before appends wait for the back end: enough
/// that a burst of 320,000 creates by 16 threads on a 16 GiB volume never waits (8 made them
/// wait for the back end, at a third of the rate; BENCHMARKS.md, *Checkpoint images in a log of
/// their own*), few enough to bound a replay and the pending views (a create's bound is 7 blocks:
/// about a million creates, some 800 MB of pending state, on a 16 GiB volume's 1 GiB log; a
/// quarter of that on the default 4 GiB volume).
pub const BACKLOG_CHECKPOINTS: u64 = 64;

/// Bytes of a device block: the unit an encrypted device reads and writes whole.
const BLOCK_BYTES: u64 = crate::block::meta::BLOCK_SIZE_U64;
/// Appended-but-unflushed payload bytes above which `append` first flushes what is pending.
pub const MAX_PENDING_DATA_BYTES: usize = 8 << 20;
/// Appended-but-unflushed records above which `append` first flushes what is pending. Also the
/// number of stage slots: record `lsn` is staged in slot `lsn % MAX_PENDING_RECORDS`.
pub const MAX_PENDING_RECORDS: usize = 16 << 10;
const STAGE_SLOTS: u64 = MAX_PENDING_RECORDS as u64;
/// A stage slot keeps its payload buffer for the next record up to this capacity; larger
/// payloads get a fresh buffer each time, so the stage holds at most
/// `MAX_PENDING_RECORDS * SLOT_KEEP_BYTES` (16 MiB) between flushes besides what is pending.
const SLOT_KEEP_BYTES: usize = 1024;
/// How long a flusher sleeps between looks at the state while it waits (a lost wake-up costs
/// this much, never a hang).
const WAIT_SLICE: Duration = Duration::from_millis(10);
/// Rounds of "stage full, flush, try again" before an append gives up: each round flushes
/// everything reserved, so only appenders refilling the whole stage in between can repeat it.
const RESERVE_ATTEMPTS_MAX: usize = 1 << 16;
/// Lost compare-and-swaps on the head before one append gives up: each loss is another
/// appender's success, so reaching it means a bug, not load.
const HEAD_RACES_MAX: u64 = 1 << 32;
/// How long a reader of a reservation waits for its appender to store it (a few instructions
/// after it moved the head; longer only while that thread is descheduled).
const RESERVATION_WAIT_MAX: Duration = Duration::from_secs(10);

/// Where a record starts: its lsn and the data position of its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPosition {
    pub lsn: u64,
    pub data_position: u64,
}

impl LogPosition {
    /// The tail of a freshly formatted log.
    pub const START: LogPosition = LogPosition { lsn: 1, data_position: 0 };
}

/// One record as recovered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub lsn: u64,
    pub kind: u16,
    pub payload: Vec<u8>,
}

/// What a read-only scan of the log found ([`Log::scan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogScan {
    /// The valid records from the tail, in lsn order.
    pub records: Vec<Record>,
    /// Where the next record would go: just after the last valid record.
    pub end: LogPosition,
    /// Set when the log does not end at `end` but is damaged there (valid records follow, or
    /// the header there carries an impossible value). `recover` refuses such a log.
    pub damage: Option<LogDamage>,
}

/// A record removed from the log by [`Log::discard_from`]: what could still be read of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscardedRecord {
    pub lsn: u64,
    /// The header, when it was intact.
    pub header: Option<RecordHeader>,
    /// The payload, when the header was intact and the payload matched its CRC.
    pub payload: Option<Vec<u8>>,
}

/// Tunables of a running log.
#[derive(Clone, Copy, Debug)]
pub struct LogOptions {
    /// Records nobody waits for are made durable by a background flush at most this long after
    /// they were appended. `u64::MAX` disables the background flush.
    pub flush_delay_us: u64,
    /// Share of each ring (header slots and data bytes) that only `append_reserved` may use,
    /// in `[0, 1)`.
    pub reserve_fraction: f64,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions { flush_delay_us: 1000, reserve_fraction: 0.05 }
    }
}

/// Space accounting of the log, from the tail to the next record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogUsage {
    /// Header slots held by records after the tail (equals `records_since_tail`).
    pub header_slots_used: u64,
    pub header_slots_capacity: u64,
    /// Slots `append` may use; the rest is the reserve.
    pub header_slots_normal: u64,
    pub data_bytes_used: u64,
    pub data_bytes_capacity: u64,
    /// Data bytes `append` may use; the rest is the reserve.
    pub data_bytes_normal: u64,
    pub records_since_tail: u64,
    /// Records appended but not yet durable.
    pub records_not_durable: u64,
}

/// Counters, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Group-commit rounds (each is one device flush).
    pub flushes: u64,
    /// `write_at` calls issued by flushes.
    pub device_writes: u64,
    /// Flushes started by the background flusher.
    pub background_flushes: u64,
}

/// The head: the lsn and data position the next reservation gets, one 128-bit word so that one
/// compare-and-swap takes both (the lsn in the high half). Appenders reserve without a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Head {
    lsn: u64,
    position: u64,
}

impl Head {
    fn pack(self) -> u128 {
        (u128::from(self.lsn) << 64) | u128::from(self.position)
    }

    fn unpack(word: u128) -> Head {
        Head { lsn: (word >> 64) as u64, position: word as u64 }
    }
}

/// The group-commit state, behind the state lock. Appenders do not take it: they move the head
/// with a compare-and-swap and read the tail and the durable point from their mirrors in
/// `Inner` (see `Inner::reserve`).
struct State {
    tail: LogPosition,
    durable_lsn: u64,
    /// Data position just after the last durable record.
    durable_position: u64,
    /// Data positions of the durable records `tail.lsn ..= durable_lsn` (a record not yet
    /// durable keeps its position in its stage slot until a leader moves it here).
    positions: VecDeque<u64>,
    /// Whether each of those records was appended with `append_reserved`.
    reserve_flags: VecDeque<bool>,
    /// Empty batch buffers with capacity, reused by each leader.
    spare_headers: Vec<u8>,
    spare_data: Vec<u8>,
    spare_marks: Vec<(u64, bool)>,
    /// A leader is writing a batch.
    flushing: bool,
    stop_flusher: bool,
    /// `shutdown` ran: no more appends.
    closed: bool,
    /// A flush failed: no more appends, no more acknowledgements.
    failed: bool,
    stats: LogStats,
}

/// Test hook run by `append` between the reservation of an lsn and the copy of its record.
#[cfg(test)]
type CopyHook = Arc<dyn Fn(u64) + Send + Sync>;

/// One record between its reservation and the group commit that writes it.
#[repr(align(128))] // one appender per slot at a time: keep neighbours off its cache lines
struct Slot {
    /// The lsn whose header and payload the slot holds complete: the record is published.
    /// Older lsns of the slot (`lsn - k * STAGE_SLOTS`) mean "not yet".
    filled_lsn: AtomicU64,
    /// The lsn whose reservation `position` and `reserve` describe: stored by its appender right
    /// after it moved the head, before the copy, and kept until the slot's next reservation.
    reserved_lsn: AtomicU64,
    /// The data position of record `reserved_lsn`.
    position: AtomicU64,
    /// Whether record `reserved_lsn` was appended with `append_reserved`.
    reserve: AtomicBool,
    /// Written by the appender that reserved the lsn, then read by the leader once published:
    /// never contended, the lock only makes the hand-over safe Rust.
    bytes: Mutex<SlotBytes>,
}

struct SlotBytes {
    /// The encoded header, its CRC and batch field left for the leader.
    header: [u8; HEADER_SIZE],
    payload: Vec<u8>,
}

struct Inner {
    device: Arc<dyn Device>,
    geometry: LogGeometry,
    /// Whether a group commit pads its data write with zeros to the end of its last block
    /// where the bytes after it are free (`padding_bytes`): on an encrypted device a write that
    /// ends inside a block costs a read and a decryption of that block, a few zero bytes less.
    pads_data_blocks: bool,
    flush_delay: Option<Duration>,
    normal_slots: u64,
    normal_data: u64,
    /// Images promised to the records not yet checkpointed; checked by `append_pledged`.
    pledges: Arc<Pledges>,
    /// Set by `Log::attach_images`: checkpoint images go elsewhere, so no append pledges room
    /// in this log; the backlog is only kept under `backlog_limit_blocks`.
    images_elsewhere: CachePadded<AtomicBool>,
    /// With images elsewhere: the most image blocks the records not yet applied may stand for
    /// (`BACKLOG_CHECKPOINTS` image logs' worth), which bounds what replay after a crash must
    /// redo and what the front end holds pending.
    backlog_limit_blocks: CachePadded<AtomicU64>,
    state: CachePadded<Mutex<State>>,
    /// The next reservation's lsn and data position (`Head`), moved only by compare-and-swap.
    head: CachePadded<AtomicU128>,
    /// Mirrors of the state's tail and durable point, stored with the state lock held and read
    /// by reservations without it. Each only moves forward, so a reservation that reads an
    /// older value sees less room and more pending records than there are: it refuses or
    /// flushes early, never overwrites a live record or a stage slot in use.
    tail_lsn: CachePadded<AtomicU64>,
    tail_position: CachePadded<AtomicU64>,
    durable_lsn: CachePadded<AtomicU64>,
    durable_position: CachePadded<AtomicU64>,
    /// The state's `closed || failed`, for reservations.
    stopped: CachePadded<AtomicBool>,
    /// When the oldest record not yet taken by a leader was reserved (about): nanoseconds since
    /// `epoch` plus one, 0 for none. Set by the appender that finds it 0, cleared by leaders.
    pending_since_ns: CachePadded<AtomicU64>,
    /// The background flusher sleeps until woken (nothing pending when it looked).
    flusher_idle: CachePadded<AtomicBool>,
    epoch: Instant,
    /// The stage: `STAGE_SLOTS` slots, record `lsn` in slot `lsn % STAGE_SLOTS`. A reservation
    /// is refused (flush first) while `STAGE_SLOTS` records are not durable, so a slot is
    /// reused only after its previous record was written.
    slots: Box<[CachePadded<Slot>]>,
    /// The highest published lsn: `flush` makes everything up to it durable (every append
    /// that returned before `flush` was called is at or below it).
    published_max: CachePadded<AtomicU64>,
    /// Flushers waiting for the record after the durable lsn to be published.
    stall_waiters: CachePadded<AtomicU32>,
    /// Signalled when `durable_lsn` advances, a flush ends, a record a flusher waits for is
    /// published, or the log stops.
    durable_changed: Condvar,
    /// Wakes the background flusher.
    flusher_wake: Condvar,
    /// Bytes were written to the device outside the log for a record appended after them (a
    /// direct write's data, `Log::note_ordered_data`): the next group commit flushes the device
    /// before it writes its batch, so that no record reaches the medium before what it maps.
    ordered_data: CachePadded<AtomicBool>,
    /// Test hook: runs in `append` after the reservation, before the copy.
    #[cfg(test)]
    copy_hook: Mutex<Option<CopyHook>>,
}

/// The operation log. `Send + Sync`; share it through the `Arc` that `recover` returns.
pub struct Log {
    inner: Arc<Inner>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    /// The log that takes this one's checkpoint images (format version 9 on, `attach_images`);
    /// unset, they go into this log's reserve and appends pledge room for them (`pledge.rs`).
    images: std::sync::OnceLock<Arc<Log>>,
}

impl Log {
    /// Makes an empty log: zeroes the header ring (so no stale bytes can parse as a header) and
    /// flushes. The data ring is left as it is. The new log's tail is [`LogPosition::START`].
    pub fn format(device: &dyn Device, geometry: &LogGeometry) -> Result<()> {
        geometry.validate(device.size_bytes())?;
        let total = geometry.header_ring_bytes().expect("validated");
        let chunk_len = total.min(1 << 20) as usize;
        let zeros = vec![0u8; chunk_len];
        let mut done = 0u64;
        while done < total {
            let len = (total - done).min(chunk_len as u64) as usize;
            device.write_at(geometry.header_start_byte + done, &zeros[..len])?;
            done += len as u64;
        }
        device.flush()
    }

    /// Scans the log from `tail` (kept by the superblock) and returns the valid records in lsn
    /// order; the log continues after them. Header slots past the last valid record are zeroed
    /// and flushed before this returns (see `docs/LOG.md`, *Recovery*).
    pub fn recover(
        device: Arc<dyn Device>,
        geometry: LogGeometry,
        tail: LogPosition,
        options: LogOptions,
    ) -> Result<(Arc<Log>, Vec<Record>)> {
        check_tail(device.as_ref(), &geometry, tail)?;
        if !(0.0..1.0).contains(&options.reserve_fraction) {
            return Err(Error::invalid(format!("log reserve fraction {} is not in [0, 1)", options.reserve_fraction)));
        }
        let scan = recover::scan(device.as_ref(), &geometry, tail)?;
        if let Some(damage) = &scan.damage {
            return Err(damage.to_error());
        }
        recover::scrub(device.as_ref(), &geometry, tail, scan.end.lsn)?;

        let share = 1.0 - options.reserve_fraction;
        let normal_slots = ((geometry.header_slots as f64 * share) as u64).min(geometry.header_slots);
        let normal_data = ((geometry.data_bytes as f64 * share) as u64).min(geometry.data_bytes);
        let state = State {
            tail,
            durable_lsn: scan.end.lsn - 1,
            durable_position: scan.end.data_position,
            reserve_flags: scan.reserve_flags.into(),
            positions: scan.positions.into(),
            spare_headers: Vec::new(),
            spare_data: Vec::new(),
            spare_marks: Vec::new(),
            flushing: false,
            stop_flusher: false,
            closed: false,
            failed: false,
            stats: LogStats::default(),
        };
        let pads_data_blocks = device.decrypts()
            && geometry.data_start_byte.is_multiple_of(BLOCK_BYTES)
            && geometry.data_bytes.is_multiple_of(BLOCK_BYTES);
        let inner = Arc::new(Inner {
            device,
            geometry,
            pads_data_blocks,
            flush_delay: (options.flush_delay_us != u64::MAX).then(|| Duration::from_micros(options.flush_delay_us)),
            normal_slots,
            normal_data,
            pledges: Arc::new(Pledges::default()),
            images_elsewhere: CachePadded::new(AtomicBool::new(false)),
            backlog_limit_blocks: CachePadded::new(AtomicU64::new(u64::MAX)),
            state: CachePadded::new(Mutex::new(state)),
            head: CachePadded::new(AtomicU128::new(
                Head { lsn: scan.end.lsn, position: scan.end.data_position }.pack(),
            )),
            tail_lsn: CachePadded::new(AtomicU64::new(tail.lsn)),
            tail_position: CachePadded::new(AtomicU64::new(tail.data_position)),
            durable_lsn: CachePadded::new(AtomicU64::new(scan.end.lsn - 1)),
            durable_position: CachePadded::new(AtomicU64::new(scan.end.data_position)),
            stopped: CachePadded::new(AtomicBool::new(false)),
            pending_since_ns: CachePadded::new(AtomicU64::new(0)),
            flusher_idle: CachePadded::new(AtomicBool::new(false)),
            epoch: Instant::now(),
            slots: (0..STAGE_SLOTS)
                .map(|_| {
                    CachePadded::new(Slot {
                        filled_lsn: AtomicU64::new(0),
                        reserved_lsn: AtomicU64::new(0),
                        position: AtomicU64::new(0),
                        reserve: AtomicBool::new(false),
                        bytes: Mutex::new(SlotBytes { header: [0; HEADER_SIZE], payload: Vec::new() }),
                    })
                })
                .collect(),
            published_max: CachePadded::new(AtomicU64::new(scan.end.lsn - 1)),
            stall_waiters: CachePadded::new(AtomicU32::new(0)),
            durable_changed: Condvar::new(),
            flusher_wake: Condvar::new(),
            ordered_data: CachePadded::new(AtomicBool::new(false)),
            #[cfg(test)]
            copy_hook: Mutex::new(None),
        });
        let flusher = match inner.flush_delay {
            Some(delay) => {
                let for_thread = Arc::clone(&inner);
                let handle = std::thread::Builder::new()
                    .name("tandemfs-log-flush".into())
                    .spawn(move || for_thread.background_flusher(delay))
                    .map_err(|e| Error::Io { operation: "start log flusher thread", offset: 0, source: e })?;
                Some(handle)
            }
            None => None,
        };
        Ok((Arc::new(Log { inner, flusher: Mutex::new(flusher), images: std::sync::OnceLock::new() }), scan.records))
    }

    /// Reads the log from `tail` as `recover` would, without writing anything and without
    /// refusing damage: the valid records, where they end and whether the log is damaged there.
    /// For fsck and repair.
    pub fn scan(device: &dyn Device, geometry: &LogGeometry, tail: LogPosition) -> Result<LogScan> {
        check_tail(device, geometry, tail)?;
        let scan = recover::scan(device, geometry, tail)?;
        Ok(LogScan { records: scan.records, end: scan.end, damage: scan.damage })
    }

    /// Repair: removes record `first_lsn` and every record after it from the log, so that the
    /// log ends just before it and `recover` accepts it. Returns what could be read of each
    /// removed record: every lsn from `first_lsn` up to the last header still intact after it.
    /// The header slots are zeroed and the device flushed before this returns. `first_lsn` must
    /// lie in `[tail.lsn, tail.lsn + header_slots]`; the records before it must be the valid
    /// records of a scan (the caller found the damage with [`Log::scan`]).
    pub fn discard_from(
        device: &dyn Device,
        geometry: &LogGeometry,
        tail: LogPosition,
        first_lsn: u64,
    ) -> Result<Vec<DiscardedRecord>> {
        check_tail(device, geometry, tail)?;
        if first_lsn < tail.lsn || first_lsn - tail.lsn > geometry.header_slots {
            return Err(Error::invalid(format!(
                "discard log records from lsn {first_lsn}: outside the log window from the tail {}",
                tail.lsn
            )));
        }
        let mut discarded = Vec::new();
        let mut last_intact = first_lsn;
        for lsn in first_lsn..tail.lsn + geometry.header_slots {
            let header = recover::read_header(device, geometry, lsn)?;
            let payload = match &header {
                Some(header) => recover::read_payload(device, geometry, header)?,
                None => None,
            };
            if header.is_some() {
                last_intact = lsn;
            }
            discarded.push(DiscardedRecord { lsn, header, payload });
        }
        discarded.truncate((last_intact - first_lsn + 1) as usize);
        if first_lsn < tail.lsn + geometry.header_slots {
            recover::scrub(device, geometry, tail, first_lsn)?;
        }
        Ok(discarded)
    }

    /// The header in the slot of `lsn`, if that slot holds a CRC-valid header of that lsn.
    /// Mount reads the records just before the tail with it, to check the tail.
    pub fn read_header(device: &dyn Device, geometry: &LogGeometry, lsn: u64) -> Result<Option<RecordHeader>> {
        geometry.validate(device.size_bytes())?;
        recover::read_header(device, geometry, lsn)
    }

    /// The payload `header` describes, if it matches the header's payload CRC.
    pub fn read_payload(device: &dyn Device, geometry: &LogGeometry, header: &RecordHeader) -> Result<Option<Vec<u8>>> {
        geometry.validate(device.size_bytes())?;
        recover::read_payload(device, geometry, header)
    }

    /// Appends a record whose payload is the concatenation of `payload_parts`. Returns its lsn,
    /// or `None` when the normal share of the log is full (checkpoint, `release`, retry).
    /// `InvalidArgument` if the payload could never fit the normal share. The record is not
    /// durable until `wait_durable` or `flush` returns for it (or the background flush ran).
    pub fn append(&self, kind: u16, payload_parts: &[&[u8]]) -> Result<Option<u64>> {
        match self.inner.append(kind, payload_parts, Share::Normal)? {
            Appended::At(lsn) => Ok(Some(lsn)),
            Appended::LogFull | Appended::Pledged => Ok(None),
        }
    }

    /// Like `append`, for a record whose application may need up to `image_blocks` checkpoint
    /// images: refused with `Pledged` while the normal share cannot hold the record together
    /// with the images pledged to every record not yet checkpointed and its own (unless no
    /// record waits to be applied, so that one record is always admitted); counts its images
    /// in the pledge once appended. The back end releases them (`Pledges::records_applied`).
    pub fn append_pledged(&self, kind: u16, payload_parts: &[&[u8]], image_blocks: u64) -> Result<Appended> {
        self.inner.append(kind, payload_parts, Share::Pledged(image_blocks))
    }

    /// Says that bytes were written to the device outside the log (and those writes have
    /// returned) for a record about to be appended: the next group commit flushes the device
    /// before it writes its batch (ext4's ordered data), so that the record is never on the
    /// medium without them. One flush covers every such write before it, so a stream of direct
    /// writes costs one extra flush per group commit, not one per write. Call it after the
    /// writes and before the append.
    pub fn note_ordered_data(&self) {
        self.inner.ordered_data.store(true, Ordering::SeqCst);
    }

    /// Like `append`, but may use the reserve share (for checkpoint records). `None` only when
    /// the log is truly full.
    pub fn append_reserved(&self, kind: u16, payload_parts: &[&[u8]]) -> Result<Option<u64>> {
        match self.inner.append(kind, payload_parts, Share::Reserve)? {
            Appended::At(lsn) => Ok(Some(lsn)),
            Appended::LogFull | Appended::Pledged => Ok(None),
        }
    }

    /// The images pledged to the records not yet checkpointed (see `pledge.rs`).
    pub fn pledges(&self) -> &Arc<Pledges> {
        &self.inner.pledges
    }

    /// Gives this log's checkpoint images a log of their own (format version 9): appends then
    /// pledge nothing, since no image lands behind them, and `reserve_image_blocks` is what the
    /// image log holds. Once, before the first append.
    pub fn attach_images(&self, images: Arc<Log>) {
        assert!(!Arc::ptr_eq(&self.inner, &images.inner), "a log cannot take its own images");
        assert!(self.inner.pledges.unapplied_blocks() == 0, "images attached after appends pledged");
        let limit = images.image_capacity_blocks().saturating_mul(BACKLOG_CHECKPOINTS);
        self.inner.backlog_limit_blocks.store(limit, Ordering::SeqCst);
        self.inner.images_elsewhere.store(true, Ordering::SeqCst);
        assert!(self.images.set(images).is_ok(), "an image log is attached already");
    }

    /// How many image logs' worth of checkpoint images (by their bounds) the records not yet
    /// applied may stand for before appends wait for the back end (`BACKLOG_CHECKPOINTS` unless
    /// set; the mount option `backlog_image_logs`). Only with an image log attached.
    pub fn set_backlog_image_logs(&self, image_logs: u64) {
        assert!(image_logs >= 1, "a backlog of {image_logs} image logs");
        let images = self.images.get().expect("the backlog bound is for a log with an image log");
        let limit = images.image_capacity_blocks().saturating_mul(image_logs);
        self.inner.backlog_limit_blocks.store(limit, Ordering::SeqCst);
    }

    /// The log that takes this one's checkpoint images, if not this one.
    pub fn image_log(&self) -> Option<&Arc<Log>> {
        self.images.get()
    }

    /// Image blocks one checkpoint may write: the reserve of this log (the records counted twice
    /// while it runs included, see `pledge.rs`), or the whole image log once one is attached
    /// (each checkpoint releases it before the next one is written).
    pub fn reserve_image_blocks(&self) -> u64 {
        if let Some(images) = self.images.get() {
            return images.image_capacity_blocks();
        }
        let g = &self.inner.geometry;
        let bytes = (g.data_bytes - self.inner.normal_data).saturating_sub(pledge::CHECKPOINT_OVERHEAD_BYTES);
        let slots = (g.header_slots - self.inner.normal_slots).saturating_sub(pledge::CHECKPOINT_OVERHEAD_SLOTS);
        (bytes / pledge::IMAGE_LOG_BYTES).min(slots.saturating_mul(pledge::IMAGES_PER_SLOT))
    }

    /// Image blocks this log holds as an image log: all of it, less one checkpoint's fixed
    /// records.
    fn image_capacity_blocks(&self) -> u64 {
        let g = &self.inner.geometry;
        let bytes = g.data_bytes.saturating_sub(pledge::CHECKPOINT_OVERHEAD_BYTES);
        let slots = g.header_slots.saturating_sub(pledge::CHECKPOINT_OVERHEAD_SLOTS);
        (bytes / pledge::IMAGE_LOG_BYTES).min(slots.saturating_mul(pledge::IMAGES_PER_SLOT))
    }

    /// Returns once record `lsn` (and every record before it) is durable. Concurrent callers
    /// share one device write and flush. `Error::Shutdown` or the I/O error if the log failed
    /// before the record was durable; `InvalidArgument` for an lsn never appended.
    pub fn wait_durable(&self, lsn: u64) -> Result<()> {
        self.inner.flush_to(lsn).map(|_| ())
    }

    /// Makes every append that returned before this call durable; returns the durable lsn.
    /// An append still copying its record and every one after it need not be included.
    pub fn flush(&self) -> Result<u64> {
        let target = self.inner.published_max.load(Ordering::Acquire);
        self.inner.flush_to(target)
    }

    /// Whether record `lsn` was appended with `append_reserved` (true) or `append` (false),
    /// known from its reservation on, before its appender returns; `None` for an lsn outside
    /// `[tail.lsn, next_lsn)`. The back end tells its own checkpoint records from logical
    /// records still being appended with it.
    pub fn appended_with_reserve(&self, lsn: u64) -> Option<bool> {
        let state = self.inner.state.lock();
        if lsn < state.tail.lsn {
            return None;
        }
        if lsn <= state.durable_lsn {
            return Some(state.reserve_flags[(lsn - state.tail.lsn) as usize]);
        }
        if lsn >= self.inner.head().lsn {
            return None;
        }
        // Not durable, and it cannot become durable while the state lock is held: its slot
        // still holds its reservation.
        Some(self.inner.reservation_of(lsn).1)
    }

    /// The highest lsn known durable (the tail's lsn - 1 when nothing is).
    pub fn durable_lsn(&self) -> u64 {
        self.inner.durable_lsn.load(Ordering::Acquire)
    }

    /// The lsn the next record will get.
    pub fn next_lsn(&self) -> u64 {
        self.inner.head().lsn
    }

    /// The current tail (as last given to `release`, or to `recover`).
    pub fn tail(&self) -> LogPosition {
        self.inner.state.lock().tail
    }

    pub fn geometry(&self) -> LogGeometry {
        self.inner.geometry
    }

    /// Where record `lsn` starts, for `lsn` in `[tail.lsn, next_lsn]` (`next_lsn` gives where the
    /// next record will start). Panics for an lsn outside that range (a caller bug).
    pub fn position(&self, lsn: u64) -> LogPosition {
        let state = self.inner.state.lock();
        let head = self.inner.head();
        assert!(
            lsn >= state.tail.lsn && lsn <= head.lsn,
            "log position of lsn {lsn} asked, outside [tail {}, next {}]",
            state.tail.lsn,
            head.lsn
        );
        let data_position = if lsn <= state.durable_lsn {
            state.positions[(lsn - state.tail.lsn) as usize]
        } else if lsn == state.durable_lsn + 1 {
            state.durable_position
        } else if lsn == head.lsn {
            head.position
        } else {
            // Reserved, not durable, and it cannot become durable while the state lock is
            // held: its slot still holds its reservation.
            self.inner.reservation_of(lsn).0
        };
        LogPosition { lsn, data_position }
    }

    /// A checkpoint made every record before `new_tail` unnecessary: their space may be reused.
    /// The caller must have made `new_tail` durable (superblock written and flushed) first,
    /// because recovery starts from the tail the superblock keeps. A tail older than the current
    /// one is ignored. Panics if `new_tail` is not the start of a durable record or the
    /// position after the last durable record (a caller bug).
    pub fn release(&self, new_tail: LogPosition) {
        let mut state = self.inner.state.lock();
        if new_tail.lsn <= state.tail.lsn {
            return;
        }
        assert!(
            new_tail.lsn <= state.durable_lsn + 1,
            "log release to lsn {} past the durable lsn {}",
            new_tail.lsn,
            state.durable_lsn
        );
        let expected = if new_tail.lsn == state.durable_lsn + 1 {
            state.durable_position
        } else {
            state.positions[(new_tail.lsn - state.tail.lsn) as usize]
        };
        assert_eq!(
            new_tail.data_position, expected,
            "log release to {new_tail:?}: that lsn starts at data position {expected}"
        );
        let drop_count = (new_tail.lsn - state.tail.lsn) as usize;
        state.positions.drain(..drop_count);
        state.reserve_flags.drain(..drop_count);
        state.tail = new_tail;
        self.inner.tail_lsn.store(new_tail.lsn, Ordering::Release);
        self.inner.tail_position.store(new_tail.data_position, Ordering::Release);
    }

    /// Header slots and data bytes in use and their capacity.
    pub fn usage(&self) -> LogUsage {
        let state = self.inner.state.lock();
        let head = self.inner.head();
        let g = &self.inner.geometry;
        let records = head.lsn - state.tail.lsn;
        LogUsage {
            header_slots_used: records,
            header_slots_capacity: g.header_slots,
            header_slots_normal: self.inner.normal_slots,
            data_bytes_used: head.position - state.tail.data_position,
            data_bytes_capacity: g.data_bytes,
            data_bytes_normal: self.inner.normal_data,
            records_since_tail: records,
            records_not_durable: head.lsn - 1 - state.durable_lsn,
        }
    }

    pub fn stats(&self) -> LogStats {
        self.inner.state.lock().stats
    }

    /// Sleeps until the durable lsn exceeds `lsn` or `timeout` passes; returns the durable lsn
    /// (which may still be `<= lsn` after a timeout). `Error::Shutdown` once the log has stopped
    /// or failed and the durable lsn will not pass `lsn` any more. For back-end threads.
    pub fn wait_for_durable_above(&self, lsn: u64, timeout: Duration) -> Result<u64> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.inner.state.lock();
        loop {
            if state.durable_lsn > lsn {
                return Ok(state.durable_lsn);
            }
            if state.failed || state.closed {
                return Err(Error::Shutdown);
            }
            match deadline {
                Some(deadline) => {
                    if self.inner.durable_changed.wait_until(&mut state, deadline).timed_out() {
                        return Ok(state.durable_lsn);
                    }
                }
                None => self.inner.durable_changed.wait(&mut state),
            }
        }
    }

    /// Flushes everything appended, refuses further appends and stops the background flusher.
    pub fn shutdown(&self) -> Result<()> {
        let flushed = self.flush();
        {
            let mut state = self.inner.state.lock();
            state.closed = true;
            state.stop_flusher = true;
            self.inner.stopped.store(true, Ordering::Release);
        }
        self.inner.flusher_wake.notify_all();
        self.inner.durable_changed.notify_all();
        if let Some(handle) = self.flusher.lock().take() {
            let _ = handle.join();
        }
        flushed.map(|_| ())
    }
}

/// Checks the geometry and a tail read from the superblock before anything is read.
fn check_tail(device: &dyn Device, geometry: &LogGeometry, tail: LogPosition) -> Result<()> {
    geometry.validate(device.size_bytes())?;
    if tail.lsn == 0 {
        return Err(Error::invalid("log tail lsn 0: lsns start at 1"));
    }
    if tail.lsn.checked_add(geometry.header_slots).is_none()
        || tail.data_position.checked_add(geometry.data_bytes).is_none()
    {
        return Err(Error::corruption(format!(
            "log tail {tail:?} is too close to the end of the lsn or position space"
        )));
    }
    Ok(())
}

impl Drop for Log {
    /// Stops the background flusher without flushing: records not yet durable are treated as
    /// after a crash (never acknowledged). Call `shutdown` for a clean stop.
    fn drop(&mut self) {
        self.inner.state.lock().stop_flusher = true;
        self.inner.flusher_wake.notify_all();
        if let Some(handle) = self.flusher.get_mut().take() {
            let _ = handle.join();
        }
    }
}

/// Which share of the log an append may use.
#[derive(Clone, Copy)]
enum Share {
    Normal,
    /// The normal share, with this many images pledged (`append_pledged`).
    Pledged(u64),
    Reserve,
}

/// A record's image bound counted in the pledge before its reservation is checked: given back
/// when the reservation is refused or fails, kept once it succeeds.
struct HeldPledge<'a> {
    pledges: &'a Pledges,
    blocks: u64,
}

impl HeldPledge<'_> {
    /// Counts `blocks` in the pledge, once.
    fn hold(&mut self, blocks: u64) {
        if self.blocks == 0 && blocks > 0 {
            self.pledges.pledge_record(blocks);
            self.blocks = blocks;
        }
    }

    fn keep(mut self) {
        self.blocks = 0;
    }
}

impl Drop for HeldPledge<'_> {
    fn drop(&mut self) {
        if self.blocks > 0 {
            self.pledges.unpledge_record(self.blocks);
        }
    }
}

/// Unpublished reservation: if the appender unwinds between reserving its lsn and publishing
/// the record, the log latches failed, so that no flush waits for a record that never comes.
struct PublishGuard<'a> {
    inner: &'a Inner,
    published: bool,
}

impl Drop for PublishGuard<'_> {
    fn drop(&mut self) {
        if !self.published {
            self.inner.state.lock().failed = true;
            self.inner.stopped.store(true, Ordering::Release);
            self.inner.durable_changed.notify_all();
        }
    }
}

impl Inner {
    fn slot(&self, lsn: u64) -> &Slot {
        &self.slots[(lsn % STAGE_SLOTS) as usize]
    }

    fn is_published(&self, lsn: u64) -> bool {
        self.slot(lsn).filled_lsn.load(Ordering::SeqCst) == lsn
    }

    fn append(&self, kind: u16, parts: &[&[u8]], share: Share) -> Result<Appended> {
        let reserved = matches!(share, Share::Reserve);
        let mut length: u64 = 0;
        for part in parts {
            length += part.len() as u64;
        }
        let limit = if reserved { self.geometry.data_bytes } else { self.normal_data };
        if length > limit.min(MAX_PAYLOAD_BYTES) || (!reserved && self.normal_slots == 0) {
            return Err(Error::invalid(format!(
                "log record of {length} bytes can never fit the {} share of the log ({limit} data bytes)",
                if reserved { "whole" } else { "normal" }
            )));
        }
        let mut payload_crc = 0;
        for part in parts {
            payload_crc = tandem_accel::crc32c(payload_crc, part);
        }
        let (lsn, position) = match self.reserve(length, share)? {
            Ok(reservation) => reservation,
            Err(Refused::Full) => return Ok(Appended::LogFull),
            Err(Refused::Pledged) => return Ok(Appended::Pledged),
        };
        // From here on the record is published or the log latches failed (the guard).
        let mut guard = PublishGuard { inner: self, published: false };
        #[cfg(test)]
        self.run_copy_hook(lsn);
        let header = RecordHeader {
            kind,
            flags: if reserved { format::FLAG_RESERVE } else { 0 },
            lsn,
            data_position: position,
            payload_length: length as u32,
            payload_crc,
            batch_first_lsn: 0, // set by the flush leader, which knows the batch
        };
        let slot = self.slot(lsn);
        {
            // Nobody else touches this slot: the leader reads it only once it is published,
            // and the reservation bound keeps lsn + STAGE_SLOTS from being reserved before
            // this record is durable.
            let mut bytes = slot.bytes.lock();
            assert!(slot.filled_lsn.load(Ordering::Acquire) < lsn, "log stage slot of lsn {lsn} still in use");
            header.encode_unsealed(&mut bytes.header);
            bytes.payload.clear();
            for part in parts {
                bytes.payload.extend_from_slice(part);
            }
        }
        // SeqCst: pairs with the stall waiter's SeqCst count-then-check in `flush_to`.
        slot.filled_lsn.store(lsn, Ordering::SeqCst);
        guard.published = true;
        self.published_max.fetch_max(lsn, Ordering::AcqRel);
        if self.stall_waiters.load(Ordering::SeqCst) > 0 {
            // A flusher waits for this very record; take the lock so the wake-up cannot fall
            // between its check and its wait.
            drop(self.state.lock());
            self.durable_changed.notify_all();
        }
        Ok(Appended::At(lsn))
    }

    /// The head as it is now.
    fn head(&self) -> Head {
        Head::unpack(self.head.load(Ordering::Acquire))
    }

    /// Reserves an lsn and a data position for a record of `length` bytes without a lock: checks
    /// space and the stage against the head it read and moves the head past the record with one
    /// compare-and-swap, so the checks held for exactly the head it replaced. Flushes first
    /// when too much is pending. The reservation is stored in the record's stage slot before
    /// this returns.
    fn reserve(&self, length: u64, share: Share) -> Result<std::result::Result<(u64, u64), Refused>> {
        let reserved = matches!(share, Share::Reserve);
        let (slot_limit, data_limit) = if reserved {
            (self.geometry.header_slots, self.geometry.data_bytes)
        } else {
            (self.normal_slots, self.normal_data)
        };
        // Counted before the checks (add, then check), so that two appenders cannot both take
        // the last room; given back unless the reservation succeeds.
        let mut pledge = HeldPledge { pledges: &self.pledges, blocks: 0 };
        let mut flushes = 0usize;
        let mut races = 0u64;
        let backoff = crossbeam_utils::Backoff::new();
        let mut head = self.head();
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return Err(Error::Shutdown);
            }
            // The tail and the durable point are read after `head` and only move forward, so
            // if the compare-and-swap below succeeds they are at most what they were when it
            // did: the room and the pending count computed here are conservative.
            let used_slots = head.lsn.saturating_sub(self.tail_lsn.load(Ordering::Acquire));
            let used_bytes = head.position.saturating_sub(self.tail_position.load(Ordering::Acquire));
            if used_slots >= slot_limit || used_bytes + length > data_limit {
                return Ok(Err(Refused::Full));
            }
            if let Share::Pledged(image_blocks) = share {
                pledge.hold(image_blocks);
                if !self.pledge_fits(used_slots, used_bytes + length, image_blocks) {
                    return Ok(Err(Refused::Pledged));
                }
            }
            let pending_records = (head.lsn - 1).saturating_sub(self.durable_lsn.load(Ordering::Acquire));
            let pending_bytes = head.position.saturating_sub(self.durable_position.load(Ordering::Acquire));
            if pending_records > 0
                && (pending_records >= MAX_PENDING_RECORDS as u64
                    || pending_bytes + length > MAX_PENDING_DATA_BYTES as u64)
            {
                // The stage is full: a flush frees it (its slots are reused by lsn).
                flushes += 1;
                if flushes > RESERVE_ATTEMPTS_MAX {
                    return Err(Error::invalid(
                        "log append found the stage full after every flush: other appenders keep refilling it",
                    ));
                }
                self.flush_to(head.lsn - 1)?;
                head = self.head();
                continue;
            }
            let Some(next_position) = head.position.checked_add(length) else {
                return Err(Error::NoSpace);
            };
            let next = Head { lsn: head.lsn + 1, position: next_position };
            match self.head.compare_exchange_weak(head.pack(), next.pack(), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(_) => {
                    // Another appender moved the head: it made progress, so this loop is bounded
                    // by how fast the others append; the bound is for a bug. Back off before
                    // the next try: 16 appenders retrying at once keep the head's line moving
                    // between cores, and each failed compare-and-swap costs a trip.
                    races += 1;
                    assert!(races < HEAD_RACES_MAX, "log reservation lost {races} races for the head");
                    backoff.spin();
                    head = self.head();
                }
            }
        }
        pledge.keep();
        // The reservation `lsn - STAGE_SLOTS` of this slot is durable (the pending bound).
        let slot = self.slot(head.lsn);
        assert!(
            slot.reserved_lsn.load(Ordering::Relaxed) < head.lsn,
            "log stage slot of lsn {} reserved twice",
            head.lsn
        );
        slot.position.store(head.position, Ordering::Relaxed);
        slot.reserve.store(reserved, Ordering::Relaxed);
        slot.reserved_lsn.store(head.lsn, Ordering::Release);
        self.note_pending();
        Ok(Ok((head.lsn, head.position)))
    }

    /// The data position and reserve flag of record `lsn`, reserved and not durable: waits for
    /// its appender to store them (it does so right after it moved the head, without a lock).
    /// The caller holds the state lock, so `lsn` cannot become durable and its slot cannot be
    /// reserved again meanwhile.
    fn reservation_of(&self, lsn: u64) -> (u64, bool) {
        let slot = self.slot(lsn);
        let started = Instant::now();
        while slot.reserved_lsn.load(Ordering::Acquire) != lsn {
            assert!(
                started.elapsed() < RESERVATION_WAIT_MAX,
                "log record {lsn} was reserved but its slot never said so"
            );
            std::thread::yield_now();
        }
        (slot.position.load(Ordering::Relaxed), slot.reserve.load(Ordering::Relaxed))
    }

    /// Marks records pending for the background flusher when none were, and wakes it if it
    /// sleeps until woken. Without a lock in the common case: only the appender that finds
    /// nothing pending while the flusher is idle takes the state lock.
    fn note_pending(&self) {
        if self.flush_delay.is_none() || self.pending_since_ns.load(Ordering::Relaxed) != 0 {
            return;
        }
        // SeqCst: pairs with the flusher's store of `flusher_idle` and its second look at
        // `pending_since_ns` (`background_flusher`): either it sees this mark or this sees it idle.
        if self.mark_pending_now() && self.flusher_idle.load(Ordering::SeqCst) {
            // Under the lock, so that the wake-up cannot fall between its look and its wait.
            drop(self.state.lock());
            self.flusher_wake.notify_one();
        }
    }

    /// Marks records pending from now, if nothing else did (a leader clears the mark when it
    /// takes a batch); true when this call set the mark.
    fn mark_pending_now(&self) -> bool {
        let now_ns = self.epoch.elapsed().as_nanos() as u64 + 1;
        self.pending_since_ns.compare_exchange(0, now_ns, Ordering::SeqCst, Ordering::Relaxed).is_ok()
    }

    /// Whether the normal share holds `used_slots + 1` records and `used_bytes` (the record
    /// included) together with the images of the pledge, which counts the record's own
    /// `own_blocks` already. Always true while no other record waits to be applied: the pledge
    /// is then the volume's own dirt and checkpoint, which the back end bounds, and refusing
    /// would wait for nothing.
    fn pledge_fits(&self, used_slots: u64, used_bytes: u64, own_blocks: u64) -> bool {
        let unapplied = self.pledges.unapplied_blocks();
        if unapplied <= own_blocks {
            return true;
        }
        if self.images_elsewhere.load(Ordering::Relaxed) {
            return unapplied <= self.backlog_limit_blocks.load(Ordering::Relaxed);
        }
        let pledged = self.pledges.total_blocks();
        used_bytes.saturating_add(pledge::image_log_bytes(pledged)) <= self.normal_data
            && used_slots + 1 + pledge::image_log_slots(pledged) <= self.normal_slots
    }

    /// Makes every record up to `target` durable, leading a flush or following one. Waits for
    /// an appender still copying a record at or below `target` (durability covers prefixes),
    /// never for one above it.
    fn flush_to(&self, target: u64) -> Result<u64> {
        let mut state = self.state.lock();
        loop {
            if state.durable_lsn >= target {
                return Ok(state.durable_lsn);
            }
            if state.failed {
                return Err(Error::Shutdown);
            }
            let next_lsn = self.head().lsn;
            if target >= next_lsn {
                return Err(Error::invalid(format!(
                    "wait for log record {target}, but the next record will be {next_lsn}"
                )));
            }
            if state.flushing {
                self.durable_changed.wait_for(&mut state, WAIT_SLICE);
                continue;
            }
            let first_lsn = state.durable_lsn + 1;
            if !self.is_published(first_lsn) {
                // Its appender is still copying it. Count ourselves first, then look again:
                // either the appender sees the count and wakes us under the lock, or we see
                // the record published.
                self.stall_waiters.fetch_add(1, Ordering::SeqCst);
                if !self.is_published(first_lsn) {
                    self.durable_changed.wait_for(&mut state, WAIT_SLICE);
                }
                self.stall_waiters.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            let (relocked, result) = self.lead(state);
            state = relocked;
            result?;
        }
    }

    /// One group commit: takes the published prefix after the durable lsn, writes it, flushes
    /// once and publishes the new durable lsn (or latches the failure and returns the error to
    /// the leader). The first record after the durable lsn must be published.
    fn lead<'a>(&'a self, mut state: MutexGuard<'a, State>) -> (MutexGuard<'a, State>, Result<()>) {
        debug_assert!(!state.flushing);
        let first_lsn = state.durable_lsn + 1;
        let first_position = state.durable_position;
        let reserved_end = self.head().lsn;
        // Data positions below this one hold no durable record the ring may not overwrite
        // (the tail only moves forward while the batch is written).
        let free_end = state.tail.data_position + self.geometry.data_bytes;
        let mut headers = std::mem::take(&mut state.spare_headers);
        let mut data = std::mem::take(&mut state.spare_data);
        let mut marks = std::mem::take(&mut state.spare_marks);
        self.pending_since_ns.store(0, Ordering::SeqCst);
        state.flushing = true;
        drop(state);

        let last_lsn = self.gather_published(first_lsn, reserved_end, &mut headers, &mut data, &mut marks);
        // After the gather: a record in this batch published after its writer noted its data,
        // so the note is seen here (and one a later writer makes stays for the next batch).
        let ordered_data = self.ordered_data.swap(false, Ordering::SeqCst);
        let batch_bytes = data.len() as u64;
        let padding = self.padding_bytes(first_position, first_position + batch_bytes, free_end);
        data.resize(data.len() + padding as usize, 0);
        let mut writes = 0;
        let result = if ordered_data { self.device.flush() } else { Ok(()) }
            .and_then(|()| self.write_batch(first_lsn, first_position, &mut headers, &data, &mut writes));
        headers.clear();
        data.clear();

        let mut state = self.state.lock();
        state.flushing = false;
        state.spare_headers = headers;
        state.spare_data = data;
        state.stats.flushes += 1;
        state.stats.device_writes += writes;
        match &result {
            Ok(()) => {
                for &(position, reserve) in &marks {
                    state.positions.push_back(position);
                    state.reserve_flags.push_back(reserve);
                }
                state.durable_lsn = last_lsn;
                state.durable_position = first_position + batch_bytes;
                self.durable_position.store(state.durable_position, Ordering::Release);
                self.durable_lsn.store(last_lsn, Ordering::Release);
                if self.head().lsn - 1 > last_lsn && self.flush_delay.is_some() {
                    // Records reserved before this batch but not yet published when it was
                    // taken: the background flush still owes them.
                    let _ = self.mark_pending_now();
                }
            }
            Err(_) => {
                state.failed = true;
                self.stopped.store(true, Ordering::Release);
                self.pending_since_ns.store(0, Ordering::SeqCst);
            }
        }
        marks.clear();
        state.spare_marks = marks;
        self.durable_changed.notify_all();
        (state, result)
    }

    /// Zero bytes to write after a batch of data positions `start..end`, up to the end of its
    /// ring block, where `pads_data_blocks` and every byte of them is free (below `free_end`:
    /// not part of a durable record; records reserved after the batch are written by later
    /// group commits, after this one). Zero where the batch ends on a block boundary. The ring
    /// is block-aligned, so the padding never wraps.
    fn padding_bytes(&self, start: u64, end: u64, free_end: u64) -> u64 {
        if !self.pads_data_blocks || end == start {
            return 0;
        }
        let in_block = (self.geometry.data_start_byte + end % self.geometry.data_bytes) % BLOCK_BYTES;
        let padding = if in_block == 0 { 0 } else { BLOCK_BYTES - in_block };
        if end + padding > free_end {
            return 0;
        }
        assert!(end % self.geometry.data_bytes + padding <= self.geometry.data_bytes);
        padding
    }

    /// Copies the published records `first_lsn ..` (up to the first one not yet published, at
    /// most to `reserved_end`) out of the stage into the batch buffers; returns the last lsn.
    /// Each record's data position and reserve flag go to `marks`, for the state once durable.
    fn gather_published(
        &self,
        first_lsn: u64,
        reserved_end: u64,
        headers: &mut Vec<u8>,
        data: &mut Vec<u8>,
        marks: &mut Vec<(u64, bool)>,
    ) -> u64 {
        let mut lsn = first_lsn;
        while lsn < reserved_end && self.is_published(lsn) {
            let slot = self.slot(lsn);
            // Published, so its reservation was stored before (same appender, earlier).
            debug_assert_eq!(slot.reserved_lsn.load(Ordering::Relaxed), lsn);
            marks.push((slot.position.load(Ordering::Relaxed), slot.reserve.load(Ordering::Relaxed)));
            let mut bytes = slot.bytes.lock();
            headers.extend_from_slice(&bytes.header);
            data.extend_from_slice(&bytes.payload);
            if bytes.payload.capacity() > SLOT_KEEP_BYTES {
                // A large payload: do not keep its buffer for the slot's next record.
                bytes.payload = Vec::new();
            }
            lsn += 1;
        }
        assert!(lsn > first_lsn, "a group commit leads only with the next record published");
        lsn - 1
    }

    /// Seals the headers, writes both buffers (split only at a ring wrap) and flushes once.
    fn write_batch(
        &self,
        first_lsn: u64,
        first_position: u64,
        headers: &mut [u8],
        data: &[u8],
        writes: &mut u64,
    ) -> Result<()> {
        let g = &self.geometry;
        for header in headers.chunks_exact_mut(HEADER_SIZE) {
            format::set_batch_first_lsn(header, first_lsn);
            format::seal(header);
        }
        let slot = first_lsn % g.header_slots;
        let count = (headers.len() / HEADER_SIZE) as u64;
        let first = count.min(g.header_slots - slot) as usize * HEADER_SIZE;
        self.device.write_at(g.slot_offset(slot), &headers[..first])?;
        *writes += 1;
        if first < headers.len() {
            self.device.write_at(g.header_start_byte, &headers[first..])?;
            *writes += 1;
        }
        if !data.is_empty() {
            let offset = first_position % g.data_bytes;
            let first = (data.len() as u64).min(g.data_bytes - offset) as usize;
            self.device.write_at(g.data_start_byte + offset, &data[..first])?;
            *writes += 1;
            if first < data.len() {
                self.device.write_at(g.data_start_byte, &data[first..])?;
                *writes += 1;
            }
        }
        self.device.flush()
    }

    /// The background flusher: flushes pending records `delay` after the oldest was reserved.
    /// While records are pending it sleeps until their deadline (appends need not wake it);
    /// with none pending it sleeps until the appender that marks some wakes it.
    fn background_flusher(&self, delay: Duration) {
        let mut state = self.state.lock();
        loop {
            if state.stop_flusher {
                return;
            }
            let since_ns = self.pending_since_ns.load(Ordering::SeqCst);
            if state.failed || state.closed || since_ns == 0 {
                self.sleep_until_woken(&mut state);
                continue;
            }
            let deadline =
                self.epoch.checked_add(Duration::from_nanos(since_ns - 1)).and_then(|since| since.checked_add(delay));
            match deadline {
                None => {
                    // The delay is too long to express as an instant: never flush early.
                    self.sleep_until_woken(&mut state);
                }
                Some(deadline) if Instant::now() < deadline => {
                    self.flusher_wake.wait_until(&mut state, deadline);
                }
                Some(_) => {
                    // Only what is published: a record still being copied is its appender's
                    // to finish, and waiting for it here would stall the flusher. Look again
                    // after `delay` if nothing is published yet.
                    let target = self.published_max.load(Ordering::Acquire);
                    if target <= state.durable_lsn {
                        self.flusher_wake.wait_for(&mut state, delay);
                        continue;
                    }
                    state.stats.background_flushes += 1;
                    drop(state);
                    let _ = self.flush_to(target); // a failure is recorded in the state
                    state = self.state.lock();
                }
            }
        }
    }

    /// The flusher's sleep with nothing to do: says it is idle, then looks at the pending mark
    /// once more (SeqCst, against `note_pending`'s), so that an appender that marked records
    /// pending before it said so is seen here and one after it sees it idle and wakes it.
    fn sleep_until_woken(&self, state: &mut MutexGuard<'_, State>) {
        self.flusher_idle.store(true, Ordering::SeqCst);
        let nothing_pending = self.pending_since_ns.load(Ordering::SeqCst) == 0;
        if (nothing_pending || state.failed || state.closed) && !state.stop_flusher {
            self.flusher_wake.wait(state);
        }
        self.flusher_idle.store(false, Ordering::SeqCst);
    }

    #[cfg(test)]
    fn run_copy_hook(&self, lsn: u64) {
        let hook = self.copy_hook.lock().clone();
        if let Some(hook) = hook {
            hook(lsn);
        }
    }
}
