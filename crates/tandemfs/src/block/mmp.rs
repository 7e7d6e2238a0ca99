//! Multi-mount protection (MMP): one block, named by the superblock, that a read-write mount
//! stamps with a sequence number, its host name and process id, and refreshes while mounted.
//!
//! The `flock` on an image path only stops a second opener of that same path. A loop device, a
//! second host seeing the same disk, or a copy of the path in another mount namespace reach the
//! same bytes without it; only something written in the volume itself is seen by all of them.
//! ext4's MMP is the model: a mount that finds the block in use waits long enough for a live
//! owner to refresh it (twice its interval and a margin); if the block moved, the volume is in
//! use and the mount is refused with the owner's host and pid; if not, the owner died, and the
//! mount takes the block over, then reads it back after a short delay to catch a second mounter
//! that raced it. While mounted, a refresh thread checks before every refresh that the block
//! still holds what it wrote last; if not, someone else took the volume, and the mount is
//! fenced: it stops writing at once (see `device::Gate`). A clean unmount writes the clean
//! sequence, which lets the next mount through without waiting.
//!
//! The block is read and written with `Device::read_uncached` and `Device::write_through`, so
//! that a mount through a loop device and one through its image file see each other's stamps.

use super::codec::{get_i64, get_u32, get_u64, put_i64, put_u32, put_u64};
use super::meta::{BLOCK_SIZE, BLOCK_SIZE_U64};
use super::superblock::Superblock;
use crate::device::Device;
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::Duration;

/// How often a mount refreshes the block unless told otherwise.
pub const DEFAULT_INTERVAL_MS: u32 = 5_000;
/// Bounds on an interval, from the superblock, the block or the mount options.
pub const MIN_INTERVAL_MS: u32 = 10;
pub const MAX_INTERVAL_MS: u32 = 300_000;
/// Added to twice the owner's interval when waiting for a refresh: room for a refresh thread
/// that the scheduler or a slow disk held back.
pub const CHECK_MARGIN_MS: u64 = 1_000;

pub const MAGIC: [u8; 8] = *b"TANDMMP\0";
/// The sequence of a block nobody holds: never mounted, or cleanly unmounted.
pub const SEQUENCE_CLEAN: u64 = 0;
/// Live sequences lie in `1..=SEQUENCE_LIVE_MAX`; a refresh past the end wraps to 1.
pub const SEQUENCE_LIVE_MAX: u64 = 1 << 62;

pub const OFFSET_MAGIC: usize = 0;
pub const OFFSET_SEQUENCE: usize = 8;
pub const OFFSET_TIME: usize = 16;
pub const OFFSET_INTERVAL_MS: usize = 24;
pub const OFFSET_PID: usize = 28;
pub const OFFSET_HOST: usize = 32;
pub const HOST_BYTES: usize = 64;
/// Bytes from here to the checksum are zero.
pub const USED_BYTES: usize = OFFSET_HOST + HOST_BYTES;
pub const OFFSET_CRC: usize = 4092;

/// The contents of the MMP block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmpRecord {
    pub sequence: u64,
    /// When the owner last wrote it, nanoseconds since the Unix epoch (by the owner's clock).
    pub time_ns: i64,
    /// The owner's refresh interval: how long a checker must wait to see it move.
    pub interval_ms: u32,
    pub pid: u32,
    /// The owner's host name, at most 64 bytes.
    pub host: String,
}

impl MmpRecord {
    pub fn is_clean(&self) -> bool {
        self.sequence == SEQUENCE_CLEAN
    }

    pub fn encode(&self) -> Box<[u8; BLOCK_SIZE]> {
        assert!(self.host.len() <= HOST_BYTES);
        let mut block = Box::new([0u8; BLOCK_SIZE]);
        let bytes = &mut block[..];
        bytes[OFFSET_MAGIC..OFFSET_MAGIC + 8].copy_from_slice(&MAGIC);
        put_u64(bytes, OFFSET_SEQUENCE, self.sequence);
        put_i64(bytes, OFFSET_TIME, self.time_ns);
        put_u32(bytes, OFFSET_INTERVAL_MS, self.interval_ms);
        put_u32(bytes, OFFSET_PID, self.pid);
        bytes[OFFSET_HOST..OFFSET_HOST + self.host.len()].copy_from_slice(self.host.as_bytes());
        let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
        put_u32(bytes, OFFSET_CRC, crc);
        block
    }

    pub fn decode(bytes: &[u8; BLOCK_SIZE], block_number: u64) -> Result<MmpRecord> {
        let bytes = &bytes[..];
        let fail = |what: String| Err(Error::corruption(format!("MMP block {block_number}: {what}")));
        if bytes[OFFSET_MAGIC..OFFSET_MAGIC + 8] != MAGIC {
            return fail("no MMP magic number".into());
        }
        let crc = tandem_accel::crc32c(0, &bytes[..OFFSET_CRC]);
        if crc != get_u32(bytes, OFFSET_CRC) {
            return fail(format!("checksum {:#010x} stored, {crc:#010x} computed", get_u32(bytes, OFFSET_CRC)));
        }
        if bytes[USED_BYTES..OFFSET_CRC].iter().any(|byte| *byte != 0) {
            return fail("reserved bytes are not zero".into());
        }
        let sequence = get_u64(bytes, OFFSET_SEQUENCE);
        if sequence > SEQUENCE_LIVE_MAX {
            return fail(format!("sequence {sequence:#x} is out of range"));
        }
        let interval_ms = get_u32(bytes, OFFSET_INTERVAL_MS);
        if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&interval_ms) {
            return fail(format!("interval {interval_ms} ms is out of range"));
        }
        let host_field = &bytes[OFFSET_HOST..OFFSET_HOST + HOST_BYTES];
        let host_length = host_field.iter().position(|byte| *byte == 0).unwrap_or(HOST_BYTES);
        if host_field[host_length..].iter().any(|byte| *byte != 0) {
            return fail("host name is not zero-padded".into());
        }
        Ok(MmpRecord {
            sequence,
            time_ns: get_i64(bytes, OFFSET_TIME),
            interval_ms,
            pid: get_u32(bytes, OFFSET_PID),
            host: String::from_utf8_lossy(&host_field[..host_length]).into_owned(),
        })
    }

    /// The record a mount of this process writes.
    fn ours(sequence: u64, interval_ms: u32) -> MmpRecord {
        MmpRecord { sequence, time_ns: now_ns(), interval_ms, pid: std::process::id(), host: host_name() }
    }

    /// "pid N on host H", for messages.
    pub fn owner(&self) -> String {
        format!("pid {} on host {}", self.pid, if self.host.is_empty() { "(unknown)" } else { &self.host })
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as i64)
}

/// This machine's host name, cut to what the block holds (on a character boundary).
pub fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let status = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if status != 0 {
        return String::new();
    }
    let length = buffer.iter().position(|byte| *byte == 0).unwrap_or(buffer.len());
    let mut host = String::from_utf8_lossy(&buffer[..length]).into_owned();
    while host.len() > HOST_BYTES {
        host.pop();
    }
    host
}

fn random_sequence() -> u64 {
    let mut bytes = [0u8; 8];
    let from_kernel = std::fs::File::open("/dev/urandom")
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut bytes))
        .is_ok();
    let value = if from_kernel {
        u64::from_le_bytes(bytes)
    } else {
        // Only distinctness from another mounter's value matters.
        (now_ns() as u64) ^ ((std::process::id() as u64) << 40)
    };
    value % SEQUENCE_LIVE_MAX + 1
}

fn next_sequence(sequence: u64) -> u64 {
    if sequence >= SEQUENCE_LIVE_MAX {
        1
    } else {
        sequence + 1
    }
}

/// Where the block is and how to reach it.
#[derive(Clone)]
pub struct MmpLocation {
    pub device: Arc<dyn Device>,
    pub block_number: u64,
}

impl MmpLocation {
    pub fn of(device: Arc<dyn Device>, superblock: &Superblock) -> MmpLocation {
        MmpLocation { device, block_number: superblock.mmp_block }
    }

    /// Reads the block as it is on the medium now.
    pub fn read(&self) -> Result<MmpRecord> {
        let mut bytes = Box::new([0u8; BLOCK_SIZE]);
        self.device.read_uncached(self.block_number * BLOCK_SIZE_U64, &mut bytes[..])?;
        MmpRecord::decode(&bytes, self.block_number)
    }

    /// Writes the block through to the medium.
    pub fn write(&self, record: &MmpRecord) -> Result<()> {
        self.device.write_through(self.block_number * BLOCK_SIZE_U64, &self.record_bytes(record)[..])
    }

    fn record_bytes(&self, record: &MmpRecord) -> Box<[u8; BLOCK_SIZE]> {
        record.encode()
    }
}

/// How long a checker waits to see an owner with `interval_ms` refresh the block.
pub fn check_wait(interval_ms: u32) -> Duration {
    let interval_ms = interval_ms.clamp(MIN_INTERVAL_MS, MAX_INTERVAL_MS);
    Duration::from_millis(2 * u64::from(interval_ms) + CHECK_MARGIN_MS)
}

/// How long a new owner waits before reading its stamp back: a mounter that read the block
/// just before our write writes its own within this time, since it does not wait in between.
/// Kept short because every mount pays it; a racer slower than this is caught by the first
/// refresh instead, which fences the mount that lost (see `MmpKeeper`).
pub fn race_wait(interval_ms: u32) -> Duration {
    Duration::from_millis((u64::from(interval_ms) / 50).clamp(10, 200))
}

/// What a look at the block (no waiting) says, for `tandem stat` and fsck.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activity {
    /// Never mounted, or cleanly unmounted.
    Clean,
    /// Stamped by a mount that refreshed it recently by the clock in the block: probably live.
    Recent { record: MmpRecord, age_ms: u64 },
    /// Stamped, but not refreshed for longer than its owner's check wait: a mount that ended
    /// without unmounting (a crash); the next mount takes it over after waiting.
    Stale { record: MmpRecord, age_ms: u64 },
    /// The block does not decode; the next mount waits and then rewrites it.
    Damaged(String),
}

impl Activity {
    /// One line for `tandem stat`.
    pub fn describe(&self) -> String {
        match self {
            Activity::Clean => "not in use (never mounted, or cleanly unmounted)".into(),
            Activity::Recent { record, age_ms } => {
                format!("in use by {} (refreshed {:.1} s ago)", record.owner(), *age_ms as f64 / 1000.0)
            }
            Activity::Stale { record, age_ms } => format!(
                "stamped by {}, not refreshed for {:.0} s: a mount that ended without unmounting; the next mount takes it over after waiting",
                record.owner(),
                *age_ms as f64 / 1000.0
            ),
            Activity::Damaged(what) => format!("{what}; the next mount waits, then rewrites it"),
        }
    }
}

/// Looks at the block of the volume on `device` once (reads the superblock for its place).
pub fn look_at_volume(device: Arc<dyn Device>) -> Result<Activity> {
    let superblock = Superblock::read_best(device.as_ref())?;
    look(&MmpLocation::of(device, &superblock))
}

/// Looks at the block once.
pub fn look(location: &MmpLocation) -> Result<Activity> {
    let record = match location.read() {
        Ok(record) => record,
        Err(error) if error.is_corruption() => return Ok(Activity::Damaged(error.to_string())),
        Err(error) => return Err(error),
    };
    if record.is_clean() {
        return Ok(Activity::Clean);
    }
    let age_ms = u64::try_from((now_ns() - record.time_ns) / 1_000_000).unwrap_or(0);
    if Duration::from_millis(age_ms) <= check_wait(record.interval_ms) {
        Ok(Activity::Recent { record, age_ms })
    } else {
        Ok(Activity::Stale { record, age_ms })
    }
}

/// The one-line refusal for a volume whose block moved while we watched.
fn in_use(record: &MmpRecord) -> Error {
    Error::InUse(format!(
        "volume is in use by {} (multi-mount protection: its MMP block was refreshed while this mount waited)",
        record.owner()
    ))
}

/// Keepers alive in this process. A stamp naming this process (pid and host) is either held by
/// one of them or left by a mount of this process that ended without unmounting (a dropped
/// `FileSystem`, a test's simulated crash): no need to wait to tell which.
static LIVE_KEEPERS: Mutex<Vec<std::sync::Weak<KeeperShared>>> = Mutex::new(Vec::new());

/// Held by `claim` from its first read to its stamp.
static CLAIM_LOCK: Mutex<()> = Mutex::new(());

/// For a stamp made by this process: `Some(true)` when a live keeper of this process holds it,
/// `Some(false)` when none does; `None` for another process's stamp.
fn held_by_this_process(record: &MmpRecord) -> Option<bool> {
    if record.pid != std::process::id() || record.host != host_name() {
        return None;
    }
    let mut live = LIVE_KEEPERS.lock();
    live.retain(|keeper| keeper.strong_count() > 0);
    let held = live.iter().filter_map(std::sync::Weak::upgrade).any(|keeper| {
        let last = keeper.last.lock();
        !*keeper.lost.lock() && last.sequence == record.sequence
    });
    Some(held)
}

/// Waits for a block that is not clean to show whether its owner is alive. Returns the record
/// when it moved (live owner), `None` when it did not (the owner is gone). `fallback_interval_ms`
/// sets the wait when the block does not decode.
pub fn wait_for_owner(location: &MmpLocation, fallback_interval_ms: u32) -> Result<Option<MmpRecord>> {
    let before = location.read();
    let interval_ms = match &before {
        Ok(record) if record.is_clean() => return Ok(None),
        Ok(record) => match held_by_this_process(record) {
            Some(true) => return Ok(Some(record.clone())),
            Some(false) => return Ok(None),
            None => record.interval_ms,
        },
        Err(error) if error.is_corruption() => fallback_interval_ms,
        Err(_) => return before.map(Some),
    };
    std::thread::sleep(check_wait(interval_ms));
    let after = location.read();
    match (before, after) {
        (Ok(before), Ok(after)) if before == after => Ok(None),
        // Cleanly unmounted while we waited: nobody holds it now.
        (_, Ok(after)) if after.is_clean() => Ok(None),
        (_, Ok(after)) => Ok(Some(after)),
        // Damaged before and after: nobody refreshes it.
        (Err(_), Err(error)) if error.is_corruption() => Ok(None),
        (_, Err(error)) => Err(error),
    }
}

/// Refuses with the owner's name when a live mount holds the block (a read-only mount's
/// check: it writes nothing, but must not read a volume that another mount is changing).
pub fn refuse_if_live(location: &MmpLocation, fallback_interval_ms: u32) -> Result<()> {
    match wait_for_owner(location, fallback_interval_ms)? {
        Some(record) => Err(in_use(&record)),
        None => Ok(()),
    }
}

/// What `claim` took.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The stamp written, for `MmpKeeper::start`.
    pub record: MmpRecord,
    /// The owner of a stamp left by a mount that ended without unmounting, if one was taken
    /// over ("pid N on host H").
    pub taken_over_from: Option<String>,
}

/// Takes the block for a read-write mount refreshing every `interval_ms`: waits out a live
/// owner (refused) or a dead one (taken over), stamps it, and reads the stamp back after a
/// short delay to catch a racing mounter.
pub fn claim(location: &MmpLocation, interval_ms: u32) -> Result<Claimed> {
    assert!((MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&interval_ms));
    // Mounts of this process check and stamp blocks one at a time, so they never race each
    // other; only another process can, and only where it can reach the device. (Two crashed
    // volumes mounted at once by one process are therefore waited out one after the other.)
    let _one_claim_at_a_time = CLAIM_LOCK.lock();
    let taken_over_from = match location.read() {
        Ok(record) if record.is_clean() => None,
        Ok(record) => Some(record.owner()),
        Err(error) if error.is_corruption() => Some("an unreadable MMP block".to_string()),
        Err(error) => return Err(error),
    };
    refuse_if_live(location, interval_ms)?;
    let ours = MmpRecord::ours(random_sequence(), interval_ms);
    location.write(&ours)?;
    if location.device.reachable_by_other_processes() {
        std::thread::sleep(race_wait(interval_ms));
    }
    match location.read() {
        Ok(now) if now == ours => Ok(Claimed { record: ours, taken_over_from }),
        Ok(now) => Err(Error::InUse(format!(
            "volume is in use by {} (multi-mount protection: it took the volume while this mount did)",
            now.owner()
        ))),
        Err(error) if error.is_corruption() => Err(Error::InUse(format!(
            "volume is being mounted elsewhere (multi-mount protection: the MMP block changed under this mount: {error})"
        ))),
        Err(error) => Err(error),
    }
}

/// Called once, from the refresh thread, when the block no longer holds our stamp (or cannot be
/// refreshed): the mount must stop writing.
pub type LostHandler = Box<dyn Fn(Error) + Send + 'static>;

struct KeeperShared {
    location: MmpLocation,
    /// What we wrote last; the block must still hold it.
    last: Mutex<MmpRecord>,
    stop: Mutex<bool>,
    stop_signal: Condvar,
    lost: Mutex<bool>,
}

/// Keeps a claimed block fresh from a thread. `stop_clean` ends it and marks the block clean;
/// dropping it ends the thread and leaves the block stamped, as a crash would.
pub struct MmpKeeper {
    shared: Arc<KeeperShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MmpKeeper {
    /// Starts refreshing `claimed` (as `claim` returned it) every `claimed.interval_ms`.
    pub fn start(location: MmpLocation, claimed: MmpRecord, on_lost: LostHandler) -> Result<MmpKeeper> {
        let shared = Arc::new(KeeperShared {
            location,
            last: Mutex::new(claimed),
            stop: Mutex::new(false),
            stop_signal: Condvar::new(),
            lost: Mutex::new(false),
        });
        LIVE_KEEPERS.lock().push(Arc::downgrade(&shared));
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tandem-mmp".into())
            .spawn(move || refresh_loop(&worker, on_lost))
            .map_err(|error| Error::Io { operation: "start the MMP refresh thread", offset: 0, source: error })?;
        Ok(MmpKeeper { shared, thread: Some(thread) })
    }

    /// Whether the refresh found the block taken (or failed to write it).
    pub fn is_lost(&self) -> bool {
        *self.shared.lost.lock()
    }

    fn stop_thread(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.stop_signal.notify_all();
        if let Some(thread) = self.thread.take() {
            // The refresh thread itself may drop the last handle of the mount (its lost
            // handler), and with it this keeper: it must not wait for itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }

    /// Stops refreshing and marks the block clean, if it still holds our stamp. Call after every
    /// other write of the mount is durable.
    pub fn stop_clean(mut self) -> Result<()> {
        self.stop_thread();
        if self.is_lost() {
            return Err(Error::InUse(
                "multi-mount protection: another mount took the volume; not marking it clean".into(),
            ));
        }
        let last = self.shared.last.lock().clone();
        let now = self.shared.location.read()?;
        if now != last {
            return Err(Error::InUse(format!(
                "multi-mount protection: the MMP block now names {}; not marking it clean",
                now.owner()
            )));
        }
        let clean = MmpRecord { sequence: SEQUENCE_CLEAN, time_ns: now_ns(), ..last };
        self.shared.location.write(&clean)
    }
}

impl Drop for MmpKeeper {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

fn refresh_loop(shared: &KeeperShared, on_lost: LostHandler) {
    let interval = Duration::from_millis(u64::from(shared.last.lock().interval_ms));
    loop {
        {
            let mut stop = shared.stop.lock();
            if !*stop {
                shared.stop_signal.wait_for(&mut stop, interval);
            }
            if *stop {
                return;
            }
        }
        if let Err(error) = refresh_once(shared) {
            *shared.lost.lock() = true;
            on_lost(error);
            return;
        }
    }
}

/// Checks that the block still holds our last stamp, then writes the next one.
fn refresh_once(shared: &KeeperShared) -> Result<()> {
    let mut last = shared.last.lock();
    let now = match shared.location.read() {
        Ok(now) => now,
        Err(error) if error.is_corruption() => {
            return Err(Error::InUse(format!(
                "multi-mount protection: the MMP block was overwritten ({error}); this mount stops writing"
            )))
        }
        Err(error) => {
            return Err(Error::InUse(format!(
                "multi-mount protection: cannot read the MMP block ({error}); this mount stops writing"
            )))
        }
    };
    if now != *last {
        return Err(Error::InUse(format!(
            "multi-mount protection: the volume was taken over by {}; this mount stops writing",
            now.owner()
        )));
    }
    let next = MmpRecord { sequence: next_sequence(last.sequence), time_ns: now_ns(), ..last.clone() };
    shared.location.write(&next).map_err(|error| {
        Error::InUse(format!(
            "multi-mount protection: cannot refresh the MMP block ({error}); this mount stops writing"
        ))
    })?;
    *last = next;
    Ok(())
}

/// Writes the clean stamp (mkfs, and fsck --repair when it is done).
pub fn write_clean(location: &MmpLocation, interval_ms: u32) -> Result<()> {
    location.write(&MmpRecord::ours(SEQUENCE_CLEAN, interval_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    fn location() -> MmpLocation {
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(8 * BLOCK_SIZE_U64));
        MmpLocation { device, block_number: 3 }
    }

    #[test]
    fn record_round_trip_and_damage() {
        let record = MmpRecord { sequence: 77, time_ns: 5, interval_ms: 100, pid: 9, host: "h".repeat(HOST_BYTES) };
        let bytes = record.encode();
        assert_eq!(MmpRecord::decode(&bytes, 3).unwrap(), record);
        for bit in 0..(USED_BYTES * 8) {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(MmpRecord::decode(&damaged, 3).unwrap_err().is_corruption());
        }
        assert!(MmpRecord::decode(&Box::new([0u8; BLOCK_SIZE]), 3).unwrap_err().is_corruption());
        const { assert!(USED_BYTES <= OFFSET_CRC) };
    }

    #[test]
    fn clean_block_is_claimed_and_released() {
        let location = location();
        write_clean(&location, MIN_INTERVAL_MS).unwrap();
        assert_eq!(look(&location).unwrap(), Activity::Clean);
        let claimed = claim(&location, MIN_INTERVAL_MS).unwrap().record;
        assert!(matches!(look(&location).unwrap(), Activity::Recent { .. }));
        let keeper = MmpKeeper::start(location.clone(), claimed, Box::new(|_| {})).unwrap();
        keeper.stop_clean().unwrap();
        assert_eq!(look(&location).unwrap(), Activity::Clean);
    }

    #[test]
    fn live_owner_refuses_and_dead_owner_is_taken_over() {
        let location = location();
        write_clean(&location, MIN_INTERVAL_MS).unwrap();
        let claimed = claim(&location, MIN_INTERVAL_MS).unwrap().record;
        let keeper = MmpKeeper::start(location.clone(), claimed, Box::new(|_| {})).unwrap();
        let refused = claim(&location, MIN_INTERVAL_MS).unwrap_err();
        let message = refused.to_string();
        assert!(message.contains(&format!("pid {}", std::process::id())), "{message}");
        assert!(message.contains(&host_name()), "{message}");
        // Dropping the keeper is a crash: the stamp stays, nobody refreshes it.
        drop(keeper);
        assert!(!look(&location).unwrap().eq(&Activity::Clean));
        let taken = claim(&location, MIN_INTERVAL_MS).unwrap();
        assert_eq!(taken.taken_over_from, Some(format!("pid {} on host {}", std::process::id(), host_name())));
    }

    #[test]
    fn keeper_latches_when_the_block_is_taken() {
        let location = location();
        write_clean(&location, MIN_INTERVAL_MS).unwrap();
        let claimed = claim(&location, MIN_INTERVAL_MS).unwrap().record;
        let (sender, receiver) = std::sync::mpsc::channel();
        let sender = Mutex::new(sender);
        let keeper = MmpKeeper::start(
            location.clone(),
            claimed,
            Box::new(move |error| {
                let _ = sender.lock().send(error.to_string());
            }),
        )
        .unwrap();
        let intruder = MmpRecord { sequence: 5, time_ns: 0, interval_ms: 50, pid: 4242, host: "elsewhere".into() };
        location.write(&intruder).unwrap();
        let message = receiver.recv_timeout(Duration::from_secs(60)).expect("the keeper notices");
        assert!(message.contains("pid 4242 on host elsewhere"), "{message}");
        assert!(keeper.is_lost());
        assert!(keeper.stop_clean().is_err());
        assert_eq!(location.read().unwrap(), intruder);
    }

    #[test]
    fn live_foreign_owner_is_waited_for_and_refused() {
        let location = location();
        let foreign = MmpRecord { sequence: 1, time_ns: 0, interval_ms: 50, pid: 4242, host: "elsewhere".into() };
        location.write(&foreign).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (location, stop) = (location.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut record = foreign;
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    record.sequence += 1;
                    location.write(&record).unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let message = claim(&location, MIN_INTERVAL_MS).unwrap_err().to_string();
        assert!(message.contains("volume is in use by pid 4242 on host elsewhere"), "{message}");
        stop.store(true, std::sync::atomic::Ordering::Release);
        writer.join().unwrap();
        // Now nobody refreshes it: after the wait, it is taken over.
        let taken = claim(&location, MIN_INTERVAL_MS).unwrap();
        assert_eq!(taken.taken_over_from.as_deref(), Some("pid 4242 on host elsewhere"));
    }

    #[test]
    fn damaged_block_is_waited_out_and_rewritten() {
        let location = location();
        location.device.write_at(3 * BLOCK_SIZE_U64, &[0xAB; BLOCK_SIZE]).unwrap();
        assert!(matches!(look(&location).unwrap(), Activity::Damaged(_)));
        claim(&location, MIN_INTERVAL_MS).unwrap();
    }
}
