//! A device in RAM, for tests and benchmarks.
//!
//! Two modes. Plain (`new`, `from_bytes`): one image, every completed write counts as durable,
//! and an access is a striped lock plus a memcpy. Crash model (`with_crash_model`,
//! `from_bytes_with_crash_model`): besides the current image, the device keeps the durable
//! image (the state at the last completed flush) and the list of writes issued since, so that
//! `crash` can build what a disk with a volatile write cache might hold after power loss.
//! Both modes inject faults and count operations. See `docs/DEVICE.md` for the model.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{check_range, Device};
use crate::error::{Error, Result};

/// The unit a torn write is cut into when whole sectors survive or vanish independently.
pub const SECTOR_SIZE_BYTES: u64 = 512;

/// Bytes covered by one lock. Large enough that a 4 KiB block never straddles two stripes and
/// that the lock table stays small (64 bytes per stripe, 0.1 % of the image), small enough that
/// threads working on different blocks rarely meet on the same lock.
const STRIPE_SIZE_BYTES: usize = 64 * 1024;

/// Unflushed writes the crash model keeps before it calls the test broken. A test that writes
/// this much without a flush is not testing crash consistency and would eat memory.
const MAXIMUM_UNFLUSHED_WRITES: usize = 1 << 22;

/// What `crash` does with the writes issued since the last completed flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unflushed write reached the medium (the image equals the current one).
    KeepAll,
    /// No unflushed write reached the medium (the image equals the durable one).
    DropAll,
    /// Each unflushed write independently survives whole, vanishes, keeps a random prefix of
    /// its bytes, or keeps a random subset of its 512-byte sectors; chosen by the seed.
    Random,
}

/// Which operations a [`Fault`] applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOperation {
    Read,
    Write,
    Flush,
    Any,
}

/// An injected I/O error. The fault counts the operations it matches; once `after_operations`
/// of them went through, the next one fails, and with `repeat` every later one too. With a
/// `range` (start inclusive, end exclusive, in bytes) only reads and writes that overlap it
/// match, and flushes never do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub operation: FaultOperation,
    pub after_operations: u64,
    pub repeat: bool,
    pub range: Option<(u64, u64)>,
}

impl Fault {
    /// The matching operation after `after_operations` successful ones fails, once.
    pub fn once(operation: FaultOperation, after_operations: u64) -> Fault {
        Fault { operation, after_operations, repeat: false, range: None }
    }

    /// Every matching operation from the next one on fails.
    pub fn always(operation: FaultOperation) -> Fault {
        Fault { operation, after_operations: 0, repeat: true, range: None }
    }

    /// Restricts the fault to reads and writes overlapping `[start, end)`.
    pub fn in_range(self, start: u64, end: u64) -> Fault {
        assert!(start < end, "empty fault range {start}..{end}");
        Fault { range: Some((start, end)), ..self }
    }

    fn matches(&self, operation: FaultOperation, offset: u64, length: usize) -> bool {
        let operation_matches = self.operation == FaultOperation::Any || self.operation == operation;
        if !operation_matches {
            return false;
        }
        match self.range {
            None => true,
            Some(_) if operation == FaultOperation::Flush => false,
            Some((start, end)) => {
                // A zero-length access touches no byte but still asks for its position.
                let access_end = offset.saturating_add((length as u64).max(1));
                offset < end && start < access_end
            }
        }
    }
}

/// Successful operations since creation or the last `reset_counters`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryCounters {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// A RAM device. Cloning gives another handle to the same device, so a test can keep one
/// after handing a boxed copy to the file system.
#[derive(Clone)]
pub struct MemoryDevice {
    inner: Arc<MemoryInner>,
}

struct MemoryInner {
    image: StripedImage,
    /// `Some` in crash-model mode. Writes hold this lock for their whole duration, so the
    /// order of the unflushed list is the order the image saw.
    crash_state: Option<Mutex<CrashState>>,
    /// Set by `crash`: the power is gone and every later operation fails.
    dead: AtomicBool,
    /// Number of injected faults; lets the common case skip the fault lock entirely.
    fault_count: AtomicUsize,
    faults: Mutex<Vec<FaultState>>,
    flushes: AtomicU64,
}

struct CrashState {
    /// The image as of the last completed flush.
    durable: Vec<u8>,
    /// Writes completed since then, in issue order.
    unflushed: Vec<UnflushedWrite>,
}

struct UnflushedWrite {
    offset: u64,
    data: Box<[u8]>,
}

struct FaultState {
    fault: Fault,
    matched_operations: u64,
}

/// One allocation holding the image, guarded by one reader-writer lock per stripe. The single
/// allocation keeps a large device lazily zeroed by the kernel (pages appear on first touch),
/// which per-stripe boxes would not.
struct StripedImage {
    bytes: Box<[UnsafeCell<u8>]>,
    stripes: Box<[Stripe]>,
}

// Every access to `bytes` happens while holding the locks of the stripes it covers: shared for
// reading, exclusive for writing. That is the whole synchronization argument for sharing the
// cells between threads.
unsafe impl Sync for StripedImage {}

/// A lock and the counters of operations that start in its stripe. Keeping the counters next
/// to the lock means an access touches one contended cache line, not two.
#[repr(align(64))]
#[derive(Default)]
struct Stripe {
    lock: RwLock<()>,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

/// The locks one access holds; they are only ever dropped, never read. A single stripe, the
/// common case, needs no allocation.
enum Guards<G> {
    None,
    One(#[allow(dead_code)] G),
    Many(#[allow(dead_code)] Vec<G>),
}

impl StripedImage {
    fn new(bytes: Vec<u8>) -> StripedImage {
        let length = bytes.len();
        let stripe_count = length.div_ceil(STRIPE_SIZE_BYTES);
        // `Vec<u8>` and `Box<[UnsafeCell<u8>]>` have the same layout (UnsafeCell is
        // repr(transparent)); going through the boxed slice keeps the kernel-zeroed pages of a
        // large `vec![0; n]` untouched instead of copying them.
        let boxed: Box<[u8]> = bytes.into_boxed_slice();
        let raw = Box::into_raw(boxed) as *mut [UnsafeCell<u8>];
        let bytes = unsafe { Box::from_raw(raw) };
        let stripes = (0..stripe_count).map(|_| Stripe::default()).collect();
        StripedImage { bytes, stripes }
    }

    fn length(&self) -> usize {
        self.bytes.len()
    }

    fn stripe_span(&self, offset: usize, length: usize) -> std::ops::Range<usize> {
        debug_assert!(length > 0 && offset + length <= self.length());
        offset / STRIPE_SIZE_BYTES..(offset + length - 1) / STRIPE_SIZE_BYTES + 1
    }

    fn lock_shared(&self, offset: usize, length: usize) -> Guards<RwLockReadGuard<'_, ()>> {
        if length == 0 {
            return Guards::None;
        }
        let span = self.stripe_span(offset, length);
        // Ascending order everywhere is what rules out deadlock between multi-stripe accesses.
        if span.len() == 1 {
            Guards::One(self.stripes[span.start].lock.read())
        } else {
            Guards::Many(span.map(|index| self.stripes[index].lock.read()).collect())
        }
    }

    fn lock_exclusive(&self, offset: usize, length: usize) -> Guards<RwLockWriteGuard<'_, ()>> {
        if length == 0 {
            return Guards::None;
        }
        let span = self.stripe_span(offset, length);
        if span.len() == 1 {
            Guards::One(self.stripes[span.start].lock.write())
        } else {
            Guards::Many(span.map(|index| self.stripes[index].lock.write()).collect())
        }
    }

    /// Caller holds at least shared locks on the stripes covering the range.
    fn copy_out(&self, offset: usize, buffer: &mut [u8]) {
        assert!(offset + buffer.len() <= self.length());
        let source = UnsafeCell::raw_get(self.bytes[offset..].as_ptr()) as *const u8;
        // The locks held by the caller exclude writers of this range; `buffer` is the caller's
        // own memory and cannot overlap the image.
        unsafe { std::ptr::copy_nonoverlapping(source, buffer.as_mut_ptr(), buffer.len()) };
    }

    /// Caller holds exclusive locks on the stripes covering the range.
    fn copy_in(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.length());
        let destination = UnsafeCell::raw_get(self.bytes[offset..].as_ptr());
        // The exclusive locks held by the caller exclude every other access to this range.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), destination, data.len()) };
    }

    /// A consistent copy of the whole image: every stripe is locked at once.
    fn snapshot(&self) -> Vec<u8> {
        let _guards = self.lock_shared(0, self.length());
        let mut copy = vec![0u8; self.length()];
        self.copy_out(0, &mut copy);
        copy
    }
}

fn power_lost_error(operation: &'static str, offset: u64) -> Error {
    Error::Io { operation, offset, source: std::io::Error::other("memory device lost power in a simulated crash") }
}

fn injected_error(operation: &'static str, offset: u64) -> Error {
    Error::Io { operation, offset, source: std::io::Error::other("injected fault") }
}

impl MemoryDevice {
    /// A zero-filled plain device: no crash tracking, every completed write counts as durable.
    pub fn new(size_bytes: u64) -> MemoryDevice {
        MemoryDevice::build(vec![0u8; checked_length(size_bytes)], false)
    }

    /// A zero-filled device that tracks unflushed writes so that `crash` can lose or tear them.
    pub fn with_crash_model(size_bytes: u64) -> MemoryDevice {
        MemoryDevice::build(vec![0u8; checked_length(size_bytes)], true)
    }

    /// A plain device holding `bytes`.
    pub fn from_bytes(bytes: Vec<u8>) -> MemoryDevice {
        MemoryDevice::build(bytes, false)
    }

    /// A crash-model device whose durable and current images are both `bytes`.
    pub fn from_bytes_with_crash_model(bytes: Vec<u8>) -> MemoryDevice {
        MemoryDevice::build(bytes, true)
    }

    fn build(bytes: Vec<u8>, crash_model: bool) -> MemoryDevice {
        let crash_state = crash_model.then(|| Mutex::new(CrashState { durable: bytes.clone(), unflushed: Vec::new() }));
        MemoryDevice {
            inner: Arc::new(MemoryInner {
                image: StripedImage::new(bytes),
                crash_state,
                dead: AtomicBool::new(false),
                fault_count: AtomicUsize::new(0),
                faults: Mutex::new(Vec::new()),
                flushes: AtomicU64::new(0),
            }),
        }
    }

    pub fn has_crash_model(&self) -> bool {
        self.inner.crash_state.is_some()
    }

    /// Whether `crash` was called on this device (or a clone of its handle).
    pub fn is_dead(&self) -> bool {
        self.inner.dead.load(Ordering::Acquire)
    }

    /// Simulates power loss. Returns a new device holding the durable image plus the unflushed
    /// writes treated per `mode` (the same seed and history give the same bytes). From now on
    /// every operation on this device fails. The new device has the same mode, no faults,
    /// zero counters, and its whole content is durable. On a plain device nothing is
    /// unflushed, so every mode gives the current image.
    pub fn crash(&self, seed: u64, mode: CrashMode) -> MemoryDevice {
        let crash_model = self.inner.crash_state.is_some();
        let survivor = match &self.inner.crash_state {
            Some(crash_state) => {
                // Writes hold this lock for their whole duration, so after it no write can
                // start or be half done.
                let state = crash_state.lock();
                self.inner.dead.store(true, Ordering::Release);
                let mut survivor = state.durable.clone();
                apply_unflushed(&mut survivor, &state.unflushed, seed, mode);
                survivor
            }
            None => {
                self.inner.dead.store(true, Ordering::Release);
                // Every access re-checks `dead` under its stripe locks; taking all of them waits
                // for the accesses already past that check, and later ones fail.
                self.inner.image.snapshot()
            }
        };
        MemoryDevice::build(survivor, crash_model)
    }

    /// What `crash` would leave, without stopping this device: a power loss at this moment
    /// whose survivor a test keeps while the device goes on (a crash point in the middle of a
    /// longer operation of the layer above, which must be allowed to finish).
    pub fn crash_image(&self, seed: u64, mode: CrashMode) -> MemoryDevice {
        let crash_model = self.inner.crash_state.is_some();
        let survivor = match &self.inner.crash_state {
            Some(crash_state) => {
                let state = crash_state.lock();
                let mut survivor = state.durable.clone();
                apply_unflushed(&mut survivor, &state.unflushed, seed, mode);
                survivor
            }
            None => self.inner.image.snapshot(),
        };
        MemoryDevice::build(survivor, crash_model)
    }

    /// Adds a fault; faults accumulate until `clear_faults`.
    pub fn inject(&self, fault: Fault) {
        if let Some((start, end)) = fault.range {
            assert!(start < end, "empty fault range {start}..{end}");
        }
        let mut faults = self.inner.faults.lock();
        faults.push(FaultState { fault, matched_operations: 0 });
        self.inner.fault_count.store(faults.len(), Ordering::Release);
    }

    pub fn clear_faults(&self) {
        let mut faults = self.inner.faults.lock();
        faults.clear();
        self.inner.fault_count.store(0, Ordering::Release);
    }

    pub fn counters(&self) -> MemoryCounters {
        let mut counters = MemoryCounters { flushes: self.inner.flushes.load(Ordering::Relaxed), ..Default::default() };
        for stripe in self.inner.image.stripes.iter() {
            counters.reads += stripe.reads.load(Ordering::Relaxed);
            counters.writes += stripe.writes.load(Ordering::Relaxed);
            counters.bytes_read += stripe.bytes_read.load(Ordering::Relaxed);
            counters.bytes_written += stripe.bytes_written.load(Ordering::Relaxed);
        }
        counters
    }

    pub fn reset_counters(&self) {
        self.inner.flushes.store(0, Ordering::Relaxed);
        for stripe in self.inner.image.stripes.iter() {
            stripe.reads.store(0, Ordering::Relaxed);
            stripe.writes.store(0, Ordering::Relaxed);
            stripe.bytes_read.store(0, Ordering::Relaxed);
            stripe.bytes_written.store(0, Ordering::Relaxed);
        }
    }

    /// Writes completed since the last completed flush; always 0 on a plain device.
    pub fn unflushed_write_count(&self) -> usize {
        self.inner.crash_state.as_ref().map_or(0, |state| state.lock().unflushed.len())
    }

    /// The current image (what reads return). Works on a dead device too, for post-mortems.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.inner.image.snapshot()
    }

    /// The image as of the last completed flush; on a plain device, the current image.
    pub fn durable_bytes(&self) -> Vec<u8> {
        match &self.inner.crash_state {
            Some(state) => state.lock().durable.clone(),
            None => self.to_bytes(),
        }
    }

    /// Counts the access against every fault and reports whether one of them fires.
    fn fault_fires(&self, operation: FaultOperation, offset: u64, length: usize) -> bool {
        if self.inner.fault_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut fires = false;
        for state in self.inner.faults.lock().iter_mut() {
            if !state.fault.matches(operation, offset, length) {
                continue;
            }
            state.matched_operations = state.matched_operations.saturating_add(1);
            let first_failure = state.fault.after_operations.saturating_add(1);
            if state.matched_operations == first_failure
                || (state.fault.repeat && state.matched_operations > first_failure)
            {
                fires = true;
            }
        }
        fires
    }

    fn check_alive(&self, operation: &'static str, offset: u64) -> Result<()> {
        if self.inner.dead.load(Ordering::Acquire) {
            return Err(power_lost_error(operation, offset));
        }
        Ok(())
    }

    fn first_stripe(&self, offset: usize) -> Option<&Stripe> {
        self.inner.image.stripes.get(offset / STRIPE_SIZE_BYTES)
    }

    /// Copies `data` into the image and counts it; the caller checked range and faults.
    fn store(&self, offset: u64, data: &[u8]) -> Result<()> {
        let position = offset as usize;
        let _guards = self.inner.image.lock_exclusive(position, data.len());
        self.check_alive("write", offset)?;
        self.inner.image.copy_in(position, data);
        if let Some(stripe) = self.first_stripe(position) {
            stripe.writes.fetch_add(1, Ordering::Relaxed);
            stripe.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Lays the unflushed writes over `image` (the durable image) in issue order, each treated
/// per `mode`. A later surviving write covers an earlier one, as on a real medium.
fn apply_unflushed(image: &mut [u8], writes: &[UnflushedWrite], seed: u64, mode: CrashMode) {
    let mut random = SplitMix64::new(seed);
    for write in writes {
        let start = write.offset as usize;
        let length = write.data.len();
        assert!(start + length <= image.len(), "unflushed write outside the image");
        let keep_whole = match mode {
            CrashMode::KeepAll => true,
            CrashMode::DropAll => false,
            CrashMode::Random => match random.below(4) {
                0 => true,
                1 => false,
                2 => {
                    // Torn at any byte: the medium took a prefix, anywhere from nothing to all.
                    let kept_bytes = random.below(length as u64 + 1) as usize;
                    image[start..start + kept_bytes].copy_from_slice(&write.data[..kept_bytes]);
                    false
                }
                _ => {
                    // Sectors written out of order: each piece between sector boundaries (of
                    // the device, not of the write) survives on its own.
                    let mut piece_start = start;
                    let end = start + length;
                    while piece_start < end {
                        let sector = SECTOR_SIZE_BYTES as usize;
                        let piece_end = end.min((piece_start / sector + 1) * sector);
                        if random.below(2) == 1 {
                            image[piece_start..piece_end]
                                .copy_from_slice(&write.data[piece_start - start..piece_end - start]);
                        }
                        piece_start = piece_end;
                    }
                    false
                }
            },
        };
        if keep_whole {
            image[start..start + length].copy_from_slice(&write.data);
        }
    }
}

fn checked_length(size_bytes: u64) -> usize {
    assert!(size_bytes <= isize::MAX as u64, "memory device of {size_bytes} bytes cannot be addressed");
    size_bytes as usize
}

/// A tiny deterministic generator (SplitMix64): crash outcomes must depend on the seed alone,
/// on every platform and version, which rules out a library generator whose stream may change.
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        mixed ^ (mixed >> 31)
    }

    /// A value in `0..bound`; the slight modulo bias is irrelevant for crash shapes.
    fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0);
        self.next() % bound
    }
}

impl std::fmt::Debug for MemoryDevice {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MemoryDevice")
            .field("size_bytes", &self.inner.image.length())
            .field("crash_model", &self.has_crash_model())
            .field("dead", &self.is_dead())
            .finish()
    }
}

impl Device for MemoryDevice {
    fn reachable_by_other_processes(&self) -> bool {
        false
    }
    fn size_bytes(&self) -> u64 {
        self.inner.image.length() as u64
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.check_alive("read", offset)?;
        check_range(self.size_bytes(), offset, buffer.len(), "read")?;
        if self.fault_fires(FaultOperation::Read, offset, buffer.len()) {
            return Err(injected_error("read", offset));
        }
        let position = offset as usize;
        let _guards = self.inner.image.lock_shared(position, buffer.len());
        // Checked again under the locks: `crash` of a plain device relies on it.
        self.check_alive("read", offset)?;
        self.inner.image.copy_out(position, buffer);
        if let Some(stripe) = self.first_stripe(position) {
            stripe.reads.fetch_add(1, Ordering::Relaxed);
            stripe.bytes_read.fetch_add(buffer.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_alive("write", offset)?;
        check_range(self.size_bytes(), offset, data.len(), "write")?;
        match &self.inner.crash_state {
            None => {
                if self.fault_fires(FaultOperation::Write, offset, data.len()) {
                    return Err(injected_error("write", offset));
                }
                self.store(offset, data)
            }
            Some(crash_state) => {
                // Held across the image update and the log append so the two agree on order
                // and `crash` never sees a write half done.
                let mut state = crash_state.lock();
                self.check_alive("write", offset)?;
                if self.fault_fires(FaultOperation::Write, offset, data.len()) {
                    return Err(injected_error("write", offset));
                }
                assert!(
                    state.unflushed.len() < MAXIMUM_UNFLUSHED_WRITES,
                    "crash-model device holds {MAXIMUM_UNFLUSHED_WRITES} unflushed writes; the test never flushes"
                );
                self.store(offset, data)?;
                if !data.is_empty() {
                    state.unflushed.push(UnflushedWrite { offset, data: data.into() });
                }
                Ok(())
            }
        }
    }

    fn flush(&self) -> Result<()> {
        self.check_alive("flush", 0)?;
        match &self.inner.crash_state {
            None => {
                if self.fault_fires(FaultOperation::Flush, 0, 0) {
                    return Err(injected_error("flush", 0));
                }
            }
            Some(crash_state) => {
                let mut state = crash_state.lock();
                self.check_alive("flush", 0)?;
                // A failed flush makes nothing durable: the unflushed writes stay at risk.
                if self.fault_fires(FaultOperation::Flush, 0, 0) {
                    return Err(injected_error("flush", 0));
                }
                let CrashState { durable, unflushed } = &mut *state;
                for write in unflushed.drain(..) {
                    let start = write.offset as usize;
                    durable[start..start + write.data.len()].copy_from_slice(&write.data);
                }
            }
        }
        self.inner.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{IoCompletion, IoRequest};

    fn filled(length: usize, value: u8) -> Vec<u8> {
        vec![value; length]
    }

    /// A crash-model device with a flushed base and a few unflushed writes, some overlapping
    /// and some crossing sector boundaries.
    fn device_with_history() -> MemoryDevice {
        let device = MemoryDevice::with_crash_model(64 * 1024);
        device.write_at(0, &filled(64 * 1024, 0x11)).unwrap();
        device.flush().unwrap();
        device.write_at(100, &filled(3000, 0x22)).unwrap();
        device.write_at(8192, &filled(4096, 0x33)).unwrap();
        device.write_at(9000, &filled(700, 0x44)).unwrap();
        device.write_at(60_000, &filled(5536, 0x55)).unwrap();
        device
    }

    #[test]
    fn memory_round_trip_and_counters() {
        let device = MemoryDevice::new(1 << 20);
        // Crosses a stripe boundary on purpose.
        let data: Vec<u8> = (0..10_000u32).map(|index| index as u8).collect();
        let offset = STRIPE_SIZE_BYTES as u64 - 123;
        device.write_at(offset, &data).unwrap();
        let mut buffer = vec![0u8; data.len()];
        device.read_at(offset, &mut buffer).unwrap();
        assert_eq!(buffer, data);
        device.flush().unwrap();
        let counters = device.counters();
        assert_eq!(
            counters,
            MemoryCounters { reads: 1, writes: 1, flushes: 1, bytes_read: 10_000, bytes_written: 10_000 }
        );
        assert_eq!(device.unflushed_write_count(), 0);
        device.reset_counters();
        assert_eq!(device.counters(), MemoryCounters::default());
        assert_eq!(&device.to_bytes()[offset as usize..offset as usize + data.len()], &data[..]);
    }

    #[test]
    fn memory_out_of_range_is_invalid_argument() {
        let device = MemoryDevice::with_crash_model(4096);
        let mut buffer = [0u8; 8];
        assert!(matches!(device.read_at(4090, &mut buffer), Err(Error::InvalidArgument(_))));
        assert!(matches!(device.write_at(u64::MAX, &[1]), Err(Error::InvalidArgument(_))));
        device.read_at(4096, &mut []).unwrap();
        assert_eq!(device.unflushed_write_count(), 0);
    }

    #[test]
    fn memory_clone_shares_the_device() {
        let device = MemoryDevice::new(4096);
        let boxed: Box<dyn Device> = Box::new(device.clone());
        boxed.write_at(10, &[9, 9]).unwrap();
        assert_eq!(&device.to_bytes()[10..12], &[9, 9]);
    }

    #[test]
    fn memory_crash_keep_all_equals_current() {
        let device = device_with_history();
        let current = device.to_bytes();
        assert_eq!(device.unflushed_write_count(), 4);
        let survivor = device.crash(1, CrashMode::KeepAll);
        assert_eq!(survivor.to_bytes(), current);
        assert_eq!(survivor.durable_bytes(), current, "everything on the medium after a crash is durable");
        assert_eq!(survivor.unflushed_write_count(), 0);
    }

    #[test]
    fn memory_crash_drop_all_equals_durable() {
        let device = device_with_history();
        let durable = device.durable_bytes();
        assert!(durable.iter().all(|&byte| byte == 0x11));
        let survivor = device.crash(1, CrashMode::DropAll);
        assert_eq!(survivor.to_bytes(), durable);
    }

    #[test]
    fn memory_crash_random_is_deterministic_and_only_old_or_new() {
        // Non-overlapping writes: each position must hold its durable byte or its new byte.
        let build = || {
            let device = MemoryDevice::with_crash_model(256 * 1024);
            device.write_at(0, &filled(256 * 1024, 0xaa)).unwrap();
            device.flush().unwrap();
            for index in 0..200u64 {
                // Odd lengths and offsets so tears fall inside sectors as well as on them.
                device.write_at(index * 1200 + 7, &filled(1100 + (index % 90) as usize, index as u8)).unwrap();
            }
            device
        };
        let mut distinct_outcomes = std::collections::HashSet::new();
        for seed in 0..20u64 {
            let first = build();
            let second = build();
            let old = first.durable_bytes();
            let new = first.to_bytes();
            let survivor = first.crash(seed, CrashMode::Random).to_bytes();
            assert_eq!(survivor, second.crash(seed, CrashMode::Random).to_bytes(), "seed {seed} not deterministic");
            for (position, byte) in survivor.iter().enumerate() {
                assert!(
                    *byte == old[position] || *byte == new[position],
                    "seed {seed}: byte {position} is {byte:#x}, neither old nor new"
                );
            }
            // Random must actually mix: neither all kept nor all dropped.
            assert_ne!(survivor, old);
            assert_ne!(survivor, new);
            distinct_outcomes.insert(survivor);
        }
        assert!(distinct_outcomes.len() > 15, "different seeds should give different images");
    }

    #[test]
    fn memory_crash_random_overlapping_writes_give_some_written_value() {
        let device = device_with_history();
        let durable = device.durable_bytes();
        let history = [(100usize, 3000usize, 0x22u8), (8192, 4096, 0x33), (9000, 700, 0x44), (60_000, 5536, 0x55)];
        for seed in 0..50u64 {
            let image = device_with_history().crash(seed, CrashMode::Random).to_bytes();
            for (position, byte) in image.iter().enumerate() {
                let allowed = *byte == durable[position]
                    || history
                        .iter()
                        .any(|&(start, length, value)| (start..start + length).contains(&position) && *byte == value);
                assert!(allowed, "seed {seed}: byte {position} = {byte:#x} was never written there");
            }
        }
        drop(device);
    }

    #[test]
    fn memory_crash_random_tears_within_writes() {
        // One large unflushed write; over many seeds some outcome must be partial.
        let mut partial = false;
        for seed in 0..64u64 {
            let device = MemoryDevice::with_crash_model(8192);
            device.write_at(1, &filled(8000, 0xee)).unwrap();
            let image = device.crash(seed, CrashMode::Random).to_bytes();
            let kept = image[1..8001].iter().filter(|&&byte| byte == 0xee).count();
            if kept > 0 && kept < 8000 {
                partial = true;
            }
        }
        assert!(partial, "no seed tore the write");
    }

    #[test]
    fn memory_flush_makes_writes_durable() {
        let device = MemoryDevice::with_crash_model(4096);
        device.write_at(0, &[1, 2, 3]).unwrap();
        assert_eq!(device.unflushed_write_count(), 1);
        device.flush().unwrap();
        assert_eq!(device.unflushed_write_count(), 0);
        device.write_at(1, &[9]).unwrap();
        let survivor = device.crash(5, CrashMode::DropAll);
        assert_eq!(&survivor.to_bytes()[..3], &[1, 2, 3]);
    }

    #[test]
    fn memory_dead_after_crash() {
        let device = device_with_history();
        let other_handle = device.clone();
        let survivor = device.crash(0, CrashMode::KeepAll);
        assert!(other_handle.is_dead());
        let mut buffer = [0u8; 4];
        assert!(matches!(other_handle.read_at(0, &mut buffer), Err(Error::Io { operation: "read", .. })));
        assert!(matches!(other_handle.write_at(0, &[1]), Err(Error::Io { operation: "write", .. })));
        assert!(matches!(other_handle.flush(), Err(Error::Io { operation: "flush", .. })));
        assert!(other_handle.submit(vec![IoRequest::Flush]).wait().is_err());
        // The survivor is alive and unaffected by attempts on the old device.
        assert!(!survivor.is_dead());
        survivor.write_at(0, &[7]).unwrap();
        assert_eq!(survivor.to_bytes()[0], 7);

        // A plain device dies the same way.
        let plain = MemoryDevice::new(4096);
        plain.write_at(0, &[4]).unwrap();
        let plain_survivor = plain.crash(0, CrashMode::DropAll);
        assert_eq!(plain_survivor.to_bytes()[0], 4, "plain devices have nothing unflushed");
        assert!(plain.write_at(0, &[1]).is_err());
    }

    #[test]
    fn memory_nth_write_fails_and_changes_nothing() {
        let device = MemoryDevice::with_crash_model(4096);
        device.inject(Fault::once(FaultOperation::Write, 2));
        device.write_at(0, &[1]).unwrap();
        device.write_at(1, &[2]).unwrap();
        let before = device.to_bytes();
        let failure = device.write_at(2, &[3]).expect_err("third write must fail");
        assert!(matches!(failure, Error::Io { operation: "write", offset: 2, .. }));
        assert_eq!(device.to_bytes(), before, "a failed write changes nothing");
        assert_eq!(device.unflushed_write_count(), 2, "a failed write is not in the unflushed list");
        // Once, not repeated: the next write goes through.
        device.write_at(2, &[3]).unwrap();
        assert_eq!(device.counters().writes, 3);
    }

    #[test]
    fn memory_repeating_and_ranged_faults() {
        let device = MemoryDevice::new(16384);
        device.inject(Fault {
            operation: FaultOperation::Any,
            after_operations: 1,
            repeat: true,
            range: Some((4096, 8192)),
        });
        let mut buffer = [0u8; 16];
        // Outside the range: never counted, never failing.
        device.write_at(0, &[1; 16]).unwrap();
        device.read_at(8192, &mut buffer).unwrap();
        device.flush().unwrap();
        // Inside: the first goes through, every later one fails.
        device.write_at(4090, &[5; 16]).unwrap();
        assert!(device.read_at(8000, &mut buffer).is_err());
        assert!(device.write_at(5000, &[6; 16]).is_err());
        assert_eq!(&device.to_bytes()[5000..5016], &[0; 16]);
        device.clear_faults();
        device.write_at(5000, &[6; 16]).unwrap();

        device.inject(Fault::always(FaultOperation::Flush));
        assert!(matches!(device.flush(), Err(Error::Io { operation: "flush", .. })));
        device.read_at(0, &mut buffer).unwrap();
    }

    #[test]
    fn memory_failed_flush_keeps_writes_unflushed() {
        let device = MemoryDevice::with_crash_model(4096);
        device.write_at(0, &[8; 4]).unwrap();
        device.inject(Fault::once(FaultOperation::Flush, 0));
        assert!(device.flush().is_err());
        assert_eq!(device.unflushed_write_count(), 1);
        assert_eq!(&device.durable_bytes()[..4], &[0; 4]);
        device.flush().unwrap();
        assert_eq!(&device.durable_bytes()[..4], &[8; 4]);
    }

    #[test]
    fn memory_submit_runs_in_order() {
        let device = MemoryDevice::new(8192);
        let completions = device
            .submit(vec![
                IoRequest::Write { offset: 0, data: vec![3; 8] },
                IoRequest::Read { offset: 0, buffer: vec![0; 8] },
            ])
            .wait()
            .unwrap();
        assert!(matches!(&completions[1], IoCompletion::Read(data) if data == &vec![3; 8]));
    }

    #[test]
    fn memory_concurrent_access_is_atomic_per_request() {
        for crash_model in [false, true] {
            let device = if crash_model { MemoryDevice::with_crash_model(1 << 20) } else { MemoryDevice::new(1 << 20) };
            // Each write fills a span crossing a stripe boundary with one value; a reader must
            // never see two values in one span.
            let span_offset = STRIPE_SIZE_BYTES as u64 - 2048;
            let threads: Vec<_> = (0..4u8)
                .map(|thread_index| {
                    let device = device.clone();
                    std::thread::spawn(move || {
                        let mut buffer = vec![0u8; 4096];
                        for round in 0..300u32 {
                            if (round + u32::from(thread_index)) & 1 == 0 {
                                device.write_at(span_offset, &vec![thread_index + 1; 4096]).unwrap();
                            } else {
                                device.read_at(span_offset, &mut buffer).unwrap();
                                assert!(buffer.iter().all(|&byte| byte == buffer[0]), "torn read");
                            }
                            // Private region per thread: must always read back what it wrote.
                            let private_offset = (thread_index as u64 + 2) * 131_072 + (round as u64 % 8) * 4096;
                            let value = (round % 250) as u8 + 1;
                            device.write_at(private_offset, &[value; 4096]).unwrap();
                            device.read_at(private_offset, &mut buffer).unwrap();
                            assert!(buffer.iter().all(|&byte| byte == value));
                            if crash_model && round % 50 == 0 {
                                device.flush().unwrap();
                            }
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            assert_eq!(device.counters().writes, 4 * 300 + 4 * 150);
        }
    }
}
