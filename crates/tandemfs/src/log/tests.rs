//! Tests of the operation log against a private in-memory device that models crashes: writes
//! after the last flush may be dropped, kept, or torn at random bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::format::{self, field, RecordHeader};
use super::*;
use crate::device::{check_range, Device};
use crate::error::Error;

/// RAM device. `current` is what reads see; `durable` what survives a crash; `unflushed` the
/// writes since the last flush, in order.
struct TestDevice {
    state: Mutex<TestState>,
    writes: AtomicU64,
    flushes: AtomicU64,
    fail: AtomicBool,
    /// What `decrypts` answers: the log pads its data writes to whole blocks when true.
    decrypts: AtomicBool,
    /// (offset, length) of every write, in order.
    write_ranges: Mutex<Vec<(u64, usize)>>,
    flush_sleep: Duration,
    /// A planned crash: after this many more writes or flushes the device "loses power".
    crash_plan: Mutex<Option<(u64, SmallRng)>>,
    /// The image the planned crash left, once it happened; every later request fails.
    crashed: Mutex<Option<Vec<u8>>>,
}

struct TestState {
    current: Vec<u8>,
    durable: Vec<u8>,
    unflushed: Vec<(u64, Vec<u8>)>,
}

impl TestDevice {
    fn new(size: usize) -> Arc<TestDevice> {
        Self::from_image(vec![0u8; size])
    }

    fn from_image(image: Vec<u8>) -> Arc<TestDevice> {
        Arc::new(TestDevice {
            state: Mutex::new(TestState { current: image.clone(), durable: image, unflushed: Vec::new() }),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            fail: AtomicBool::new(false),
            decrypts: AtomicBool::new(false),
            write_ranges: Mutex::new(Vec::new()),
            flush_sleep: Duration::ZERO,
            crash_plan: Mutex::new(None),
            crashed: Mutex::new(None),
        })
    }

    /// Crashes the device at its `requests`-th write or flush from now (1 = the next one):
    /// that write is torn like any unflushed write, that flush does not happen.
    fn plan_crash(&self, requests: u64, seed: u64) {
        *self.crash_plan.lock() = Some((requests, SmallRng::seed_from_u64(seed)));
    }

    /// Counts a write or flush against the planned crash. True when the device is dead.
    fn crash_due(&self) -> bool {
        if self.crashed.lock().is_some() {
            return true;
        }
        let mut plan = self.crash_plan.lock();
        let Some((remaining, rng)) = plan.as_mut() else {
            return false;
        };
        *remaining -= 1;
        if *remaining > 0 {
            return false;
        }
        let image = self.crash_image(rng);
        *self.crashed.lock() = Some(image);
        *plan = None;
        true
    }

    fn take_crashed_image(&self) -> Option<Vec<u8>> {
        self.crashed.lock().take()
    }

    fn dead() -> Error {
        Error::Io { operation: "crashed device", offset: 0, source: std::io::Error::other("power lost") }
    }

    /// What the device holds after a crash: the durable image plus, for each unflushed write in
    /// order, nothing, all of it, a random prefix, random whole chunks, or a random subset of its
    /// bytes.
    fn crash_image(&self, rng: &mut SmallRng) -> Vec<u8> {
        let state = self.state.lock();
        let mut image = state.durable.clone();
        for (offset, data) in &state.unflushed {
            let at = *offset as usize;
            match rng.gen_range(0..5) {
                0 => {}
                1 => image[at..at + data.len()].copy_from_slice(data),
                2 => {
                    let keep = rng.gen_range(0..=data.len());
                    image[at..at + keep].copy_from_slice(&data[..keep]);
                }
                3 => {
                    // Sector-like tearing: whole chunks kept or lost.
                    let chunk = [8usize, 64, 512][rng.gen_range(0..3)];
                    for (i, piece) in data.chunks(chunk).enumerate() {
                        if rng.gen_bool(0.5) {
                            image[at + i * chunk..at + i * chunk + piece.len()].copy_from_slice(piece);
                        }
                    }
                }
                _ => {
                    for (i, &byte) in data.iter().enumerate() {
                        if rng.gen_bool(0.5) {
                            image[at + i] = byte;
                        }
                    }
                }
            }
        }
        image
    }

    fn image(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }
}

impl Device for TestDevice {
    fn size_bytes(&self) -> u64 {
        self.state.lock().current.len() as u64
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> crate::Result<()> {
        let state = self.state.lock();
        check_range(state.current.len() as u64, offset, buffer.len(), "read")?;
        buffer.copy_from_slice(&state.current[offset as usize..offset as usize + buffer.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> crate::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::Io { operation: "write", offset, source: std::io::Error::other("injected") });
        }
        let mut state = self.state.lock();
        check_range(state.current.len() as u64, offset, data.len(), "write")?;
        state.current[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        state.unflushed.push((offset, data.to_vec()));
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.write_ranges.lock().push((offset, data.len()));
        drop(state);
        if self.crash_due() {
            return Err(Self::dead());
        }
        Ok(())
    }
    fn flush(&self) -> crate::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::Io { operation: "flush", offset: 0, source: std::io::Error::other("injected") });
        }
        if self.crash_due() {
            return Err(Self::dead());
        }
        if !self.flush_sleep.is_zero() {
            std::thread::sleep(self.flush_sleep);
        }
        let mut state = self.state.lock();
        let TestState { durable, unflushed, .. } = &mut *state;
        for (offset, data) in unflushed.drain(..) {
            durable[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        }
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn decrypts(&self) -> bool {
        self.decrypts.load(Ordering::SeqCst)
    }
}

/// A RAM device with no crash model, for timing.
struct RamDevice {
    bytes: Mutex<Vec<u8>>,
}

impl Device for RamDevice {
    fn size_bytes(&self) -> u64 {
        self.bytes.lock().len() as u64
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> crate::Result<()> {
        let bytes = self.bytes.lock();
        check_range(bytes.len() as u64, offset, buffer.len(), "read")?;
        buffer.copy_from_slice(&bytes[offset as usize..offset as usize + buffer.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> crate::Result<()> {
        let mut bytes = self.bytes.lock();
        check_range(bytes.len() as u64, offset, data.len(), "write")?;
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> crate::Result<()> {
        Ok(())
    }
}

/// Header ring at block 1, data ring right after it, one spare block at the end.
fn geometry(header_slots: u64, data_bytes: u64) -> (LogGeometry, usize) {
    let header_start_byte = 4096;
    let data_start_byte = header_start_byte + header_slots * 64;
    let size = data_start_byte + data_bytes + 4096;
    (LogGeometry { header_start_byte, header_slots, data_start_byte, data_bytes }, size as usize)
}

fn no_background(reserve_fraction: f64) -> LogOptions {
    LogOptions { flush_delay_us: u64::MAX, reserve_fraction }
}

fn open(device: &Arc<TestDevice>, g: LogGeometry, tail: LogPosition, options: LogOptions) -> (Arc<Log>, Vec<Record>) {
    Log::recover(device.clone(), g, tail, options).expect("recover")
}

fn payload(rng: &mut SmallRng, length: usize) -> Vec<u8> {
    (0..length).map(|_| rng.gen()).collect()
}

#[test]
fn header_layout_and_sizes() {
    assert_eq!(HEADER_SIZE, 64);
    assert_eq!(HEADERS_PER_BLOCK, 64);
    assert_eq!(field::HEADER_CRC + 4, HEADER_SIZE);
    assert_eq!(field::PAYLOAD_CRC + 4, field::BATCH_FIRST_LSN);
    assert_eq!(field::BATCH_FIRST_LSN + 8, field::RESERVED);
    let header = RecordHeader {
        kind: 0xABCD,
        flags: format::FLAG_RESERVE,
        lsn: 0x0102_0304_0506_0708,
        data_position: 0x1112_1314_1516_1718,
        payload_length: 0x2122_2324,
        payload_crc: 0x3132_3334,
        batch_first_lsn: 0x4142_4344_4546_4748,
    };
    let mut bytes = [0u8; 64];
    header.encode(&mut bytes);
    assert_eq!(&bytes[0..4], b"TLRH");
    assert_eq!(&bytes[4..6], &[0xCD, 0xAB]);
    assert_eq!(bytes[8], 0x08);
    assert_eq!(bytes[16], 0x18);
    assert_eq!(bytes[24], 0x24);
    assert_eq!(bytes[28], 0x34);
    assert_eq!(bytes[32], 0x48);
    assert!(bytes[40..60].iter().all(|&b| b == 0));
    assert_eq!(RecordHeader::decode(&bytes), Ok(header));
    for bit in 0..512 {
        let mut flipped = bytes;
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(RecordHeader::decode(&flipped).is_err(), "bit {bit}");
    }
}

#[test]
fn geometry_is_validated() {
    let (g, size) = geometry(64, 8192);
    assert!(g.validate(size as u64).is_ok());
    assert!(g.validate(size as u64 - 8192).is_err());
    assert!(LogGeometry { header_slots: 0, ..g }.validate(size as u64).is_err());
    assert!(LogGeometry { data_bytes: 0, ..g }.validate(size as u64).is_err());
    assert!(LogGeometry { header_start_byte: 4097, ..g }.validate(size as u64).is_err());
    assert!(LogGeometry { data_start_byte: 4096 + 64, ..g }.validate(size as u64).is_err());
    assert!(LogGeometry { header_slots: u64::MAX / 8, ..g }.validate(size as u64).is_err());
    assert!(LogGeometry { data_bytes: u64::MAX, ..g }.validate(u64::MAX).is_err());
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    assert!(Log::recover(device.clone(), g, LogPosition { lsn: 0, data_position: 0 }, no_background(0.1)).is_err());
    assert!(Log::recover(device.clone(), g, LogPosition::START, no_background(1.0)).is_err());
    assert!(Log::recover(device.clone(), g, LogPosition::START, no_background(f64::NAN)).is_err());
    assert!(Log::recover(device, g, LogPosition { lsn: u64::MAX - 10, data_position: 0 }, no_background(0.1)).is_err());
}

#[test]
fn round_trip() {
    let mut rng = SmallRng::seed_from_u64(7);
    let (g, size) = geometry(4096, 24 << 20);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, records) = open(&device, g, LogPosition::START, no_background(0.1));
    assert!(records.is_empty());
    let mut expected = Vec::new();
    for i in 0..2000 {
        let length = match i % 10 {
            0 => 0,
            1 => rng.gen_range(4096..65536),
            2 if i % 500 == 2 => 1 << 20,
            _ => rng.gen_range(1..300),
        };
        let bytes = payload(&mut rng, length);
        let kind = rng.gen();
        // Split the payload into up to three parts to exercise gathering.
        let a = rng.gen_range(0..=length);
        let b = rng.gen_range(a..=length);
        let lsn = log.append(kind, &[&bytes[..a], &bytes[a..b], &bytes[b..]]).unwrap().expect("room");
        assert_eq!(lsn, i + 1);
        expected.push(Record { lsn, kind, payload: bytes });
        if rng.gen_ratio(1, 50) {
            log.wait_durable(lsn).unwrap();
        }
    }
    assert_eq!(log.flush().unwrap(), 2000);
    assert_eq!(log.durable_lsn(), 2000);
    let end = log.position(log.next_lsn());
    drop(log);
    let (log, records) = open(&device, g, LogPosition::START, no_background(0.1));
    assert_eq!(records, expected);
    assert_eq!(log.next_lsn(), 2001);
    assert_eq!(log.position(2001), end);
    assert_eq!(log.durable_lsn(), 2000);
    // Recovering from a tail in the middle gives the suffix.
    let middle = log.position(1234);
    drop(log);
    let (_, records) = open(&device, g, middle, no_background(0.1));
    assert_eq!(records, expected[1233..]);
}

#[test]
fn oversized_records_are_rejected() {
    let (g, size) = geometry(64, 1000);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.1));
    assert_eq!(log.usage().data_bytes_normal, 900);
    assert!(matches!(log.append(1, &[&[0u8; 901]]), Err(Error::InvalidArgument(_))));
    assert!(matches!(log.append_reserved(1, &[&[0u8; 1001]]), Err(Error::InvalidArgument(_))));
    assert_eq!(log.append(1, &[&[0u8; 900]]).unwrap(), Some(1));
    assert_eq!(log.append(1, &[&[0u8; 1]]).unwrap(), None);
    assert_eq!(log.append_reserved(1, &[&[0u8; 100]]).unwrap(), Some(2));
    assert_eq!(log.append_reserved(1, &[&[0u8; 1]]).unwrap(), None);
    assert!(matches!(log.wait_durable(3), Err(Error::InvalidArgument(_))));
}

/// Fills the log, checkpoints with a reserved record, releases, many times around both rings.
#[test]
fn wrap_around_with_release_and_reserve() {
    wrap_around(10_000, false);
}

/// The same on a device that decrypts, where each group commit pads its data write with zeros
/// to the end of its block: the padding must never reach a record still live after the head
/// (the ring is often full here, its tail inside the block the head ends in).
#[test]
fn wrap_around_on_an_encrypted_device_pads_only_free_bytes() {
    let (g, device) = wrap_around(2 * 4096, true);
    let data_ring = g.data_start_byte..g.data_start_byte + g.data_bytes;
    let ends: Vec<u64> = device
        .write_ranges
        .lock()
        .iter()
        .filter(|(offset, _)| data_ring.contains(offset))
        .map(|(offset, length)| offset + *length as u64)
        .collect();
    let whole = ends.iter().filter(|end| *end % 4096 == 0).count();
    assert!(whole * 2 > ends.len(), "{whole} of {} data writes end on a block boundary", ends.len());
}

/// Data writes of a plain device are not padded.
#[test]
fn a_plain_device_gets_no_padding() {
    let (g, size) = geometry(64, 3 * 4096);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.2));
    device.write_ranges.lock().clear();
    log.wait_durable(log.append(3, &[&[7u8; 100]]).unwrap().unwrap()).unwrap();
    let writes = device.write_ranges.lock().clone();
    assert_eq!(writes, vec![(g.slot_offset(1), 64), (g.data_start_byte, 100)]);
    device.decrypts.store(true, Ordering::SeqCst);
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.2));
    device.write_ranges.lock().clear();
    log.wait_durable(log.append(3, &[&[8u8; 100]]).unwrap().unwrap()).unwrap();
    let writes = device.write_ranges.lock().clone();
    assert_eq!(writes, vec![(g.slot_offset(2), 64), (g.data_start_byte + 100, 4096 - 100)]);
}

fn wrap_around(data_bytes: u64, decrypts: bool) -> (LogGeometry, Arc<TestDevice>) {
    let mut rng = SmallRng::seed_from_u64(11);
    let (g, size) = geometry(64, data_bytes);
    let device = TestDevice::new(size);
    device.decrypts.store(decrypts, Ordering::SeqCst);
    Log::format(device.as_ref(), &g).unwrap();
    let mut tail = LogPosition::START;
    let (mut log, _) = open(&device, g, tail, no_background(0.2));
    let mut live: Vec<Record> = Vec::new();
    let mut checkpoints = 0;
    let mut full_by_slots = 0;
    let mut full_by_data = 0;
    while log.next_lsn() < 20 * g.header_slots || log.position(log.next_lsn()).data_position < 20 * g.data_bytes {
        let length = if rng.gen_bool(0.3) { rng.gen_range(0..800) } else { rng.gen_range(0..40) };
        let bytes = payload(&mut rng, length);
        match log.append(3, &[&bytes]).unwrap() {
            Some(lsn) => live.push(Record { lsn, kind: 3, payload: bytes }),
            None => {
                let usage = log.usage();
                assert!(
                    usage.header_slots_used + 1 > usage.header_slots_normal
                        || usage.data_bytes_used + length as u64 > usage.data_bytes_normal
                );
                if usage.header_slots_used + 1 > usage.header_slots_normal {
                    full_by_slots += 1;
                } else {
                    full_by_data += 1;
                }
                // The checkpoint record goes into the reserve.
                let marker = payload(&mut rng, 100);
                let lsn = log.append_reserved(9, &[&marker]).unwrap().expect("reserve has room");
                live.push(Record { lsn, kind: 9, payload: marker });
                log.wait_durable(lsn).unwrap();
                // Every now and then, crash-free reopen to check what is live.
                if checkpoints % 7 == 0 {
                    drop(log);
                    let (reopened, records) = open(&device, g, tail, no_background(0.2));
                    assert_eq!(records, live);
                    log = reopened;
                }
                // Checkpoint: keep the last few records, release the rest.
                let keep = rng.gen_range(0..4).min(live.len());
                let new_tail = log.position(live[live.len() - keep..].first().map_or(log.next_lsn(), |r| r.lsn));
                tail = new_tail; // "superblock written and flushed"
                log.release(new_tail);
                live.drain(..live.len() - keep);
                checkpoints += 1;
            }
        }
    }
    assert!(full_by_slots > 0 && full_by_data > 0, "slots {full_by_slots} data {full_by_data}");
    log.flush().unwrap();
    drop(log);
    let (_, records) = open(&device, g, tail, no_background(0.2));
    assert_eq!(records, live);
    assert!(checkpoints > 20);
    (g, device)
}

/// What the test knows about one session: every record appended (by lsn) and the highest
/// acknowledged lsn.
struct Model {
    appended: HashMap<u64, (u16, Vec<u8>)>,
    acknowledged: u64,
}

fn run_crash_seed(seed: u64) -> CrashCounts {
    let mut rng = SmallRng::seed_from_u64(seed);
    let slots = rng.gen_range(8..80);
    let data = rng.gen_range(512..6000);
    let (g, size) = geometry(slots, data);
    let mut device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let mut tail = LogPosition::START; // as the superblock would keep it
    let mut model = Model { appended: HashMap::new(), acknowledged: 0 };
    let mut counts = CrashCounts::default();
    for crash in 0..6 {
        // Most sessions die at a random write or flush (inside a group commit, or inside the
        // recovery scrub); the rest die between operations.
        if rng.gen_ratio(4, 5) {
            device.plan_crash(rng.gen_range(1..40), rng.gen());
        }
        let (log, records) = match Log::recover(device.clone(), g, tail, no_background(0.25)) {
            Ok(opened) => opened,
            Err(Error::Io { .. }) => {
                let image = device
                    .take_crashed_image()
                    .unwrap_or_else(|| panic!("seed {seed}: recover failed without a crash"));
                device = TestDevice::from_image(image);
                counts.during_recovery += 1;
                continue;
            }
            Err(e) => panic!("seed {seed} crash {crash}: recover failed: {e}"),
        };
        // Gap-free from the tail, nothing invented, nothing acknowledged lost.
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.lsn, tail.lsn + i as u64, "seed {seed} crash {crash}: gap");
            let (kind, bytes) = model
                .appended
                .get(&record.lsn)
                .unwrap_or_else(|| panic!("seed {seed} crash {crash}: record {} invented", record.lsn));
            assert!(
                record.kind == *kind && record.payload == *bytes,
                "seed {seed} crash {crash}: record {} differs",
                record.lsn
            );
        }
        let end = tail.lsn + records.len() as u64;
        assert!(
            end > model.acknowledged,
            "seed {seed} crash {crash}: acknowledged {} lost, recovered up to {}",
            model.acknowledged,
            end - 1
        );
        if end > model.acknowledged + 1 {
            counts.unacknowledged_survived += 1;
        }
        if model.appended.keys().any(|&lsn| lsn >= end) {
            counts.unacknowledged_lost += 1;
        }
        // Records past the end are gone for good; later sessions reuse their lsns.
        model.appended.retain(|&lsn, _| lsn < end);
        model.acknowledged = end - 1;
        let mut live: Vec<Record> = records;

        let operations = rng.gen_range(1..60);
        for _ in 0..operations {
            let outcome = match rng.gen_range(0..10) {
                0..=5 => {
                    let length = match rng.gen_range(0..10) {
                        0..=1 => rng.gen_range(0..data as usize / 4),
                        2..=4 => 0,
                        _ => rng.gen_range(0..24),
                    };
                    let bytes = payload(&mut rng, length);
                    let kind = rng.gen();
                    let appended = match log.append(kind, &[&bytes]) {
                        Ok(None) => log.append_reserved(kind, &[&bytes]),
                        other => other,
                    };
                    appended.map(|lsn| {
                        if let Some(lsn) = lsn {
                            model.appended.insert(lsn, (kind, bytes.clone()));
                            live.push(Record { lsn, kind, payload: bytes });
                        }
                    })
                }
                6 | 7 => match live.last() {
                    Some(last) => {
                        let lsn = rng.gen_range(live[0].lsn..=last.lsn);
                        log.wait_durable(lsn).map(|()| model.acknowledged = model.acknowledged.max(lsn))
                    }
                    None => Ok(()),
                },
                8 => log.flush().map(|durable| model.acknowledged = durable),
                _ => {
                    // Checkpoint up to a random durable record.
                    let durable = log.durable_lsn();
                    if durable >= tail.lsn {
                        let new_lsn = rng.gen_range(tail.lsn..=durable + 1);
                        tail = log.position(new_lsn);
                        log.release(tail);
                        live.retain(|r| r.lsn >= new_lsn);
                    }
                    Ok(())
                }
            };
            if let Err(e) = outcome {
                assert!(matches!(e, Error::Io { .. } | Error::Shutdown), "seed {seed}: unexpected {e}");
                assert!(device.crashed.lock().is_some(), "seed {seed}: error {e} without a crash");
                counts.during_flush += 1;
                break;
            }
        }
        let image = device.take_crashed_image().unwrap_or_else(|| device.crash_image(&mut rng));
        drop(log);
        device = TestDevice::from_image(image);
    }
    counts
}

#[derive(Default, Debug)]
struct CrashCounts {
    during_recovery: u64,
    during_flush: u64,
    unacknowledged_survived: u64,
    unacknowledged_lost: u64,
}

#[test]
fn crash_recovery_keeps_every_acknowledged_record() {
    let mut total = CrashCounts::default();
    for seed in 0..1500 {
        match std::panic::catch_unwind(|| run_crash_seed(seed)) {
            Ok(counts) => {
                total.during_recovery += counts.during_recovery;
                total.during_flush += counts.during_flush;
                total.unacknowledged_survived += counts.unacknowledged_survived;
                total.unacknowledged_lost += counts.unacknowledged_lost;
            }
            Err(_) => {
                panic!("crash test failed for seed {seed} (rerun with run_crash_seed({seed}))")
            }
        }
    }
    println!("crash points: {total:?}");
    // The model must really exercise torn group commits, not only clean stops.
    assert!(total.during_flush > 1000 && total.during_recovery > 10, "{total:?}");
    assert!(total.unacknowledged_survived > 100 && total.unacknowledged_lost > 100, "{total:?}");
}

#[test]
fn corruption_gives_a_prefix_or_a_typed_error() {
    let mut prefixes = 0;
    let mut errors = 0;
    for seed in 0..1000u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (g, size) = geometry(32, 4096);
        let device = TestDevice::new(size);
        Log::format(device.as_ref(), &g).unwrap();
        let (log, _) = open(&device, g, LogPosition::START, no_background(0.0));
        let mut expected = Vec::new();
        while let Some(lsn) = {
            let length = rng.gen_range(0..200);
            let bytes = payload(&mut rng, length);
            let kind = rng.gen();
            let lsn = log.append(kind, &[&bytes]).unwrap();
            if let Some(lsn) = lsn {
                expected.push(Record { lsn, kind, payload: bytes });
            }
            lsn
        } {
            let _ = lsn;
        }
        log.flush().unwrap();
        drop(log);
        let mut image = device.image();
        let flips = rng.gen_range(1..20);
        for _ in 0..flips {
            let (start, length) = if rng.gen_bool(0.5) {
                (g.header_start_byte, g.header_slots * 64)
            } else {
                (g.data_start_byte, g.data_bytes)
            };
            let byte = (start + rng.gen_range(0..length)) as usize;
            image[byte] ^= 1 << rng.gen_range(0..8);
        }
        // Also try a header that is CRC-valid but carries impossible values.
        if seed % 4 == 0 {
            let slot = rng.gen_range(0..expected.len().max(1)) as u64 % g.header_slots;
            let at = (g.slot_offset(slot)) as usize;
            let mut header = RecordHeader::decode(&image[at..at + 64]).ok().unwrap_or(RecordHeader {
                kind: 0,
                flags: 0,
                lsn: slot + 1,
                data_position: 0,
                payload_length: 0,
                payload_crc: 0,
                batch_first_lsn: 1,
            });
            match rng.gen_range(0..4) {
                0 => header.payload_length = rng.gen(),
                1 => header.data_position = rng.gen(),
                2 => header.flags = rng.gen(),
                _ => header.lsn = rng.gen(),
            }
            header.encode(&mut image[at..at + 64]);
        }
        let device = TestDevice::from_image(image);
        match Log::recover(device, g, LogPosition::START, no_background(0.0)) {
            Ok((_, records)) => {
                assert!(records.len() <= expected.len(), "seed {seed}: invented records");
                assert_eq!(records[..], expected[..records.len()], "seed {seed}: not a prefix");
                prefixes += 1;
            }
            Err(Error::Corruption { .. }) => errors += 1,
            Err(other) => panic!("seed {seed}: unexpected error {other}"),
        }
    }
    println!("corruption: {prefixes} recoveries gave a prefix, {errors} gave Error::Corruption");
    assert!(prefixes > 0 && errors > 0, "prefixes {prefixes} errors {errors}");
}

/// After recovery stops at a torn record, headers of that session beyond the end must not be
/// taken for records of the next session: the scrub zeroes them.
#[test]
fn stale_headers_of_a_crashed_session_do_not_resurface() {
    let (g, size) = geometry(16, 4096);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.0));
    for _ in 0..4 {
        log.append(1, &[b"same"]).unwrap();
    }
    log.flush().unwrap();
    drop(log);
    // Tear record 2's payload only: 3 and 4 stay intact on the device.
    let mut image = device.image();
    let position = g.data_start_byte as usize + 4;
    image[position] ^= 0xFF;
    let device = TestDevice::from_image(image);
    let (log, records) = open(&device, g, LogPosition::START, no_background(0.0));
    assert_eq!(records.len(), 1);
    // The next session writes the same record 2 again; 3 and 4 from before must stay gone.
    assert_eq!(log.append(1, &[b"same"]).unwrap(), Some(2));
    log.flush().unwrap();
    drop(log);
    let (_, records) = open(&device, g, LogPosition::START, no_background(0.0));
    assert_eq!(records.len(), 2);
}

#[test]
fn io_error_stops_the_log() {
    let (g, size) = geometry(64, 8192);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.1));
    let first = log.append(1, &[b"one"]).unwrap().unwrap();
    log.wait_durable(first).unwrap();
    let second = log.append(1, &[b"two"]).unwrap().unwrap();
    device.fail.store(true, Ordering::SeqCst);
    assert!(matches!(log.wait_durable(second), Err(Error::Io { .. })));
    device.fail.store(false, Ordering::SeqCst);
    assert!(matches!(log.wait_durable(second), Err(Error::Shutdown)));
    assert!(matches!(log.append(1, &[b"three"]), Err(Error::Shutdown)));
    assert!(log.wait_durable(first).is_ok());
    assert_eq!(log.durable_lsn(), first);
    assert!(matches!(log.wait_for_durable_above(first, Duration::from_secs(5)), Err(Error::Shutdown)));
}

#[test]
fn group_commit_shares_flushes() {
    let (g, size) = geometry(1 << 14, 16 << 20);
    let device = Arc::new(TestDevice {
        flush_sleep: Duration::from_micros(200),
        ..Arc::into_inner(TestDevice::new(size)).unwrap()
    });
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = Log::recover(device.clone(), g, LogPosition::START, LogOptions::default()).unwrap();
    let flushes_before = device.flushes.load(Ordering::SeqCst);
    let threads = 8;
    let per_thread = 200;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let log = &log;
            scope.spawn(move || {
                for i in 0..per_thread {
                    let bytes = [t as u8; 100];
                    let lsn = log.append(t as u16, &[&bytes, &(i as u32).to_le_bytes()]).unwrap().unwrap();
                    log.wait_durable(lsn).unwrap();
                    assert!(log.durable_lsn() >= lsn);
                }
            });
        }
    });
    let waits = threads * per_thread;
    let flushes = device.flushes.load(Ordering::SeqCst) - flushes_before;
    let stats = log.stats();
    println!("group commit: {waits} waits, {flushes} device flushes, {} device writes", stats.device_writes);
    assert!(flushes < waits as u64 / 2, "{flushes} flushes for {waits} waits");
    assert_eq!(stats.flushes, flushes);
    log.shutdown().unwrap();
    let (_, records) = Log::recover(device.clone(), g, LogPosition::START, LogOptions::default()).unwrap();
    assert_eq!(records.len(), waits);
}

#[test]
fn background_flush_makes_records_durable_without_waiters() {
    let (g, size) = geometry(256, 1 << 16);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let options = LogOptions { flush_delay_us: 2000, reserve_fraction: 0.1 };
    let (log, _) = open(&device, g, LogPosition::START, options);
    for round in 0..3 {
        let started = Instant::now();
        let lsn = log.append(1, &[b"nobody waits"]).unwrap().unwrap();
        let durable = log.wait_for_durable_above(lsn - 1, Duration::from_secs(10)).unwrap();
        assert!(durable >= lsn);
        let elapsed = started.elapsed();
        println!("background flush round {round}: durable after {elapsed:?}");
        assert!(elapsed < Duration::from_secs(2));
        // Let the flusher go idle between rounds.
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(log.stats().background_flushes >= 3);
    let subscriber = {
        let log = log.clone();
        std::thread::spawn(move || log.wait_for_durable_above(u64::MAX - 1, Duration::from_secs(30)))
    };
    std::thread::sleep(Duration::from_millis(20));
    log.shutdown().unwrap();
    assert!(matches!(subscriber.join().unwrap(), Err(Error::Shutdown)));
    assert!(matches!(log.append(1, &[b"late"]), Err(Error::Shutdown)));
}

#[test]
fn pending_buffer_is_bounded() {
    let (g, size) = geometry(1 << 16, 64 << 20);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.0));
    let chunk = vec![5u8; 1 << 20];
    for _ in 0..20 {
        log.append(1, &[&chunk]).unwrap().unwrap();
        assert!(log.usage().records_not_durable as usize * chunk.len() <= MAX_PENDING_DATA_BYTES);
    }
    for _ in 0..MAX_PENDING_RECORDS + 10 {
        log.append(1, &[]).unwrap().unwrap();
        assert!(log.usage().records_not_durable as usize <= MAX_PENDING_RECORDS);
    }
    assert!(log.stats().flushes >= 2);
}

/// CPU time of the whole process (all threads, the background flusher included).
fn process_cpu_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Timing of a durable 256-byte append on a RAM device, one thread. Prints ns/op.
#[test]
fn durable_append_cost() {
    let (g, size) = geometry(1 << 12, 8 << 20);
    let device = Arc::new(RamDevice { bytes: Mutex::new(vec![0u8; size]) });
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = Log::recover(device.clone(), g, LogPosition::START, LogOptions::default()).unwrap();
    let bytes = [0x5Au8; 256];
    let operations = 50_000u64;
    let mut appended = 0;
    let cpu_started = process_cpu_ns();
    let started = Instant::now();
    for _ in 0..operations {
        let lsn = match log.append(1, &[&bytes]).unwrap() {
            Some(lsn) => lsn,
            None => {
                let next = log.next_lsn();
                log.release(log.position(next));
                log.append(1, &[&bytes]).unwrap().unwrap()
            }
        };
        log.wait_durable(lsn).unwrap();
        appended += 1;
    }
    let per_op = started.elapsed().as_nanos() as u64 / appended;
    let cpu_per_op = (process_cpu_ns() - cpu_started) / appended;
    let stats = log.stats();
    let crc_started = Instant::now();
    let mut crc = 0;
    for _ in 0..operations {
        crc = tandem_accel::crc32c(crc, &bytes);
    }
    let crc_per_op = crc_started.elapsed().as_nanos() as u64 / operations;
    println!(
        "durable 256 B append: {per_op} ns/op wall, {cpu_per_op} ns/op CPU of the process ({} device writes and {} flushes per op); crc32c of 256 B alone: {crc_per_op} ns",
        stats.device_writes as f64 / appended as f64,
        stats.flushes as f64 / appended as f64
    );
    assert_eq!(stats.flushes, appended);
    assert!(stats.device_writes <= appended * 2 + stats.flushes / 10 + 8);
}

/// Appenders with random sizes, waiters, the background flusher and a checkpointer that
/// releases the tail, all at once over small rings that wrap many times.
#[test]
fn concurrent_appends_checkpoints_and_recovery() {
    let (g, size) = geometry(128, 16 << 10);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let options = LogOptions { flush_delay_us: 200, reserve_fraction: 0.1 };
    let (log, _) = open(&device, g, LogPosition::START, options);
    let appended: Mutex<HashMap<u64, (u16, Vec<u8>)>> = Mutex::new(HashMap::new());
    let superblock_tail = Mutex::new(LogPosition::START);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let mut appenders = Vec::new();
        for t in 0..4u64 {
            let (log, appended) = (&log, &appended);
            appenders.push(scope.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(100 + t);
                let mut count = 0;
                while count < 3000 {
                    let length = rng.gen_range(0..300);
                    let bytes = payload(&mut rng, length);
                    match log.append(t as u16, &[&bytes]).unwrap() {
                        Some(lsn) => {
                            appended.lock().insert(lsn, (t as u16, bytes));
                            if rng.gen_ratio(1, 3) {
                                log.wait_durable(lsn).unwrap();
                                assert!(log.durable_lsn() >= lsn);
                            }
                            count += 1;
                        }
                        None => std::thread::yield_now(),
                    }
                }
            }));
        }
        let (log, superblock_tail, done) = (&log, &superblock_tail, &done);
        scope.spawn(move || {
            let mut rng = SmallRng::seed_from_u64(99);
            while !done.load(Ordering::SeqCst) {
                let usage = log.usage();
                if usage.header_slots_used * 2 > usage.header_slots_normal
                    || usage.data_bytes_used * 2 > usage.data_bytes_normal
                {
                    if let Some(lsn) = log.append_reserved(7, &[b"checkpoint"]).unwrap() {
                        log.wait_durable(lsn).unwrap();
                    }
                    let tail = log.tail().lsn;
                    let durable = log.durable_lsn();
                    let new_tail = log.position(rng.gen_range(tail..=durable + 1));
                    *superblock_tail.lock() = new_tail; // "written and flushed"
                    log.release(new_tail);
                }
                std::thread::yield_now();
            }
        });
        for appender in appenders {
            appender.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
    });
    log.shutdown().unwrap();
    let next = log.next_lsn();
    assert!(next > 4 * g.header_slots, "the rings wrapped");
    let tail = *superblock_tail.lock();
    assert_recovered_exactly(&device, g, tail, next, &appended.lock(), Some(7));
}

/// Recovery from `tail` returns every record from it to `next` - 1, in lsn order, each with
/// the kind and payload `appended` holds for its lsn (records of `unlisted_kind` are not in
/// `appended`: checkpoint records the test appended itself).
fn assert_recovered_exactly(
    device: &Arc<TestDevice>,
    g: LogGeometry,
    tail: LogPosition,
    next: u64,
    appended: &HashMap<u64, (u16, Vec<u8>)>,
    unlisted_kind: Option<u16>,
) {
    let (_, records) = open(device, g, tail, no_background(0.1));
    assert_eq!(records.len() as u64, next - tail.lsn);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.lsn, tail.lsn + i as u64);
        if Some(record.kind) != unlisted_kind {
            let (kind, bytes) = &appended[&record.lsn];
            assert!(record.kind == *kind && record.payload == *bytes, "record {} differs", record.lsn);
        }
    }
}

#[test]
fn geometry_from_blocks() {
    let g = LogGeometry::from_blocks(2, 4, 6, 100).unwrap();
    assert_eq!(
        g,
        LogGeometry { header_start_byte: 8192, header_slots: 256, data_start_byte: 6 * 4096, data_bytes: 409_600 }
    );
    assert!(g.validate(106 * 4096).is_ok());
    assert!(LogGeometry::from_blocks(u64::MAX, 1, 1, 1).is_none());
}

/// A bad record of an earlier group commit, followed by records of a later one, was flushed:
/// recovery refuses it (a torn tail cannot look like that), `scan` reports it, and
/// `discard_from` repairs the log to the records before it.
#[test]
fn damage_before_a_later_group_commit_is_refused_and_can_be_discarded() {
    let (g, size) = geometry(16, 4096);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.0));
    for batch in 0..3u8 {
        log.append(1, &[&[batch; 10]]).unwrap();
        log.append(2, &[&[batch; 20]]).unwrap();
        log.flush().unwrap();
    }
    drop(log);
    // Record 3 (first of the second batch) loses its payload; records 5 and 6 follow.
    let mut image = device.image();
    image[g.data_start_byte as usize + 30] ^= 0x01;
    let device = TestDevice::from_image(image.clone());
    let error = Log::recover(device.clone(), g, LogPosition::START, no_background(0.0)).err().unwrap();
    let message = error.to_string();
    assert!(error.is_corruption() && message.contains("log record 3 "), "{message}");
    let scan = Log::scan(device.as_ref(), &g, LogPosition::START).unwrap();
    assert_eq!(scan.records.len(), 2);
    let damage = scan.damage.unwrap();
    assert_eq!((damage.lsn, damage.later_lsn), (3, Some(5)));
    let discarded = Log::discard_from(device.as_ref(), &g, LogPosition::START, 3).unwrap();
    let lsns: Vec<u64> = discarded.iter().map(|record| record.lsn).collect();
    assert_eq!(lsns, [3, 4, 5, 6]);
    assert!(discarded[0].payload.is_none() && discarded[1].payload.as_deref() == Some(&[1u8; 20][..]));
    let (log, records) = open(&device, g, LogPosition::START, no_background(0.0));
    assert_eq!(records.len(), 2);
    assert_eq!(log.append(1, &[b"after"]).unwrap(), Some(3));
    log.flush().unwrap();
    drop(log);
    let (_, records) = open(&device, g, LogPosition::START, no_background(0.0));
    assert_eq!(records.len(), 3);

    // The same bad payload in the last group commit is a torn tail: a normal end.
    image[g.data_start_byte as usize + 30] ^= 0x01;
    image[g.data_start_byte as usize + 60 + 5] ^= 0x01; // record 5, in the last batch
    let (_, records) = open(&TestDevice::from_image(image), g, LogPosition::START, no_background(0.0));
    assert_eq!(records.len(), 4);
}

/// Many appenders at once over rings small enough that appends find the log full and the
/// tail is released as they go (the rings wrap): recovery returns exactly the appended records,
/// in lsn order, each with its payload, and no lsn was handed out twice.
#[test]
fn parallel_appends_with_log_full_recover_exactly() {
    let (g, size) = geometry(256, 32 << 10);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let options = LogOptions { flush_delay_us: 100, reserve_fraction: 0.1 };
    let (log, _) = open(&device, g, LogPosition::START, options);
    let appended: Mutex<HashMap<u64, (u16, Vec<u8>)>> = Mutex::new(HashMap::new());
    let superblock_tail = Mutex::new(LogPosition::START);
    let log_full = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let threads = 8u64;
    std::thread::scope(|scope| {
        let mut appenders = Vec::new();
        for t in 0..threads {
            let (log, appended, log_full) = (&log, &appended, &log_full);
            appenders.push(scope.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(500 + t);
                let mut count = 0;
                for _ in 0..1_000_000 {
                    if count == 1500 {
                        break;
                    }
                    let length = if rng.gen_ratio(1, 8) { 4096 } else { rng.gen_range(0..200) };
                    let bytes = payload(&mut rng, length);
                    match log.append(t as u16, &[&bytes[..length / 2], &bytes[length / 2..]]).unwrap() {
                        Some(lsn) => {
                            assert!(appended.lock().insert(lsn, (t as u16, bytes)).is_none(), "lsn {lsn} twice");
                            if rng.gen_ratio(1, 4) {
                                log.wait_durable(lsn).unwrap();
                                assert!(log.durable_lsn() >= lsn);
                            }
                            count += 1;
                        }
                        None => {
                            log_full.fetch_add(1, Ordering::Relaxed);
                            std::thread::yield_now();
                        }
                    }
                }
                assert_eq!(count, 1500, "appender {t} starved");
            }));
        }
        let (log, superblock_tail, done) = (&log, &superblock_tail, &done);
        scope.spawn(move || {
            // Releases only once the normal share is nearly full, so appenders meet a full log.
            while !done.load(Ordering::SeqCst) {
                let usage = log.usage();
                if usage.header_slots_used * 10 > usage.header_slots_normal * 9
                    || usage.data_bytes_used * 10 > usage.data_bytes_normal * 9
                {
                    let durable = log.flush().unwrap();
                    let new_tail = log.position(durable + 1);
                    *superblock_tail.lock() = new_tail; // "written and flushed"
                    log.release(new_tail);
                }
                std::thread::yield_now();
            }
        });
        for appender in appenders {
            appender.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
    });
    log.shutdown().unwrap();
    assert!(log_full.load(Ordering::Relaxed) > 0, "no append found the log full");
    let next = log.next_lsn();
    assert!(next > 4 * g.header_slots, "the rings wrapped");
    let tail = *superblock_tail.lock();
    let appended = appended.lock();
    assert_eq!(appended.len() as u64, next - 1, "every lsn handed out belongs to one append");
    assert_recovered_exactly(&device, g, tail, next, &appended, None);
}

/// Makes the appender of lsn `slow` stop after its reservation, before it copies its record,
/// until `proceed` is passed; `reached` is passed once it stopped there.
fn stall_copier_of(log: &Log, slow: u64, reached: Arc<std::sync::Barrier>, proceed: Arc<std::sync::Barrier>) {
    let hook: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(move |lsn| {
        if lsn == slow {
            reached.wait();
            proceed.wait();
        }
    });
    *log.inner.copy_hook.lock() = Some(hook);
}

/// A thread that reserved a record and is slow to copy it holds up neither a flush of the
/// records before it nor appends after it; only records after it wait for it to be durable.
#[test]
fn a_flush_does_not_wait_for_a_slow_copier_after_its_records() {
    let (g, size) = geometry(64, 8192);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.1));
    let first = log.append(1, &[b"first"]).unwrap().unwrap();
    let reached = Arc::new(std::sync::Barrier::new(2));
    let proceed = Arc::new(std::sync::Barrier::new(2));
    stall_copier_of(&log, first + 1, reached.clone(), proceed.clone());
    let slow = {
        let log = log.clone();
        std::thread::spawn(move || log.append(2, &[b"slow"]).unwrap().unwrap())
    };
    reached.wait();
    // The slow record is reserved, not copied: everything before it flushes without it.
    assert_eq!(log.flush().unwrap(), first);
    log.wait_durable(first).unwrap();
    let third = log.append(3, &[b"third"]).unwrap().unwrap();
    assert_eq!(third, first + 2);
    // The third returned, so `flush` now owes it, and durability covers prefixes: it would
    // wait for the slow one. Nothing after `first` is durable yet.
    assert_eq!(log.durable_lsn(), first);
    assert_eq!(log.usage().records_not_durable, 2);
    // A waiter for the third record leads once the slow one is published.
    let waiter = {
        let log = log.clone();
        std::thread::spawn(move || log.wait_durable(third))
    };
    proceed.wait();
    assert_eq!(slow.join().unwrap(), first + 1);
    waiter.join().unwrap().unwrap();
    assert_eq!(log.durable_lsn(), third);
    log.shutdown().unwrap();
    let (_, records) = open(&device, g, LogPosition::START, no_background(0.1));
    let kinds: Vec<(u64, u16, &[u8])> = records.iter().map(|r| (r.lsn, r.kind, &r.payload[..])).collect();
    assert_eq!(kinds, vec![(first, 1, &b"first"[..]), (first + 1, 2, &b"slow"[..]), (third, 3, &b"third"[..])]);
}

/// An appender that dies between its reservation and its copy latches the log failed, so that
/// nobody waits for its record: flushes past it, waits and appends return `Shutdown`.
#[test]
fn an_appender_dying_before_it_publishes_fails_the_log() {
    let (g, size) = geometry(64, 8192);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, LogOptions { flush_delay_us: 200, reserve_fraction: 0.1 });
    let first = log.append(1, &[b"first"]).unwrap().unwrap();
    log.wait_durable(first).unwrap();
    let hook: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(move |lsn| {
        if lsn == first + 1 {
            panic!("injected: appender dies before copying");
        }
    });
    *log.inner.copy_hook.lock() = Some(hook);
    let dying = {
        let log = log.clone();
        std::thread::spawn(move || log.append(2, &[b"never"]))
    };
    assert!(dying.join().is_err());
    log.wait_durable(first).unwrap();
    assert!(matches!(log.wait_durable(first + 1), Err(Error::Shutdown)));
    assert!(matches!(log.append(3, &[b"late"]), Err(Error::Shutdown)));
    assert!(matches!(log.wait_for_durable_above(first, Duration::from_secs(5)), Err(Error::Shutdown)));
}

/// Each reserved record carries the way it was appended, from its reservation on and after a
/// recovery: the back end tells its checkpoint records from logical ones with it.
#[test]
fn reserve_flags_are_known_per_lsn() {
    let (g, size) = geometry(64, 8192);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.1));
    let normal = log.append(1, &[b"normal"]).unwrap().unwrap();
    let reserved = log.append_reserved(2, &[b"reserved"]).unwrap().unwrap();
    assert_eq!(log.appended_with_reserve(normal), Some(false));
    assert_eq!(log.appended_with_reserve(reserved), Some(true));
    assert_eq!(log.appended_with_reserve(reserved + 1), None);
    assert_eq!(log.appended_with_reserve(normal - 1), None);
    log.shutdown().unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.1));
    assert_eq!(log.appended_with_reserve(normal), Some(false));
    assert_eq!(log.appended_with_reserve(reserved), Some(true));
}

/// Appenders reserve without the state lock: a thread holding it (as a flush leader does while
/// it takes a batch, or the back end while it reads the durable point) stops no append.
#[test]
fn appends_reserve_without_the_state_lock() {
    let (g, size) = geometry(4096, 1 << 20);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.1));
    let held = log.inner.state.lock();
    let (sender, receiver) = std::sync::mpsc::channel();
    let appender = {
        let log = log.clone();
        std::thread::spawn(move || {
            let lsns: Vec<u64> = (0..1000u32).map(|i| log.append(1, &[&i.to_le_bytes()]).unwrap().unwrap()).collect();
            sender.send(()).unwrap();
            lsns
        })
    };
    let finished = receiver.recv_timeout(Duration::from_secs(20)).is_ok();
    drop(held);
    let lsns = appender.join().unwrap();
    assert!(finished, "appends waited for the state lock");
    assert_eq!(lsns, (1..=1000).collect::<Vec<u64>>());
    assert_eq!(log.durable_lsn(), 0);
    log.shutdown().unwrap();
    let (_, records) = open(&device, g, LogPosition::START, no_background(0.1));
    assert_eq!(records.len(), 1000);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.payload, (i as u32).to_le_bytes());
    }
}

/// While appenders race for the head, the position and the reserve flag of every reserved
/// record, read before it is durable (from its stage slot) or after (from the state), are the
/// ones its place in lsn order gives it.
#[test]
fn reservations_read_while_appenders_race_match_lsn_order() {
    let (g, size) = geometry(1 << 15, 8 << 20);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let options = LogOptions { flush_delay_us: 100, reserve_fraction: 0.1 };
    let (log, _) = open(&device, g, LogPosition::START, options);
    let lengths: Mutex<HashMap<u64, (u64, bool)>> = Mutex::new(HashMap::new());
    let seen: Mutex<Vec<(u64, u64, bool)>> = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let appenders: Vec<_> = (0..4u64)
            .map(|t| {
                let (log, lengths) = (&log, &lengths);
                scope.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(300 + t);
                    for _ in 0..3000 {
                        let length = rng.gen_range(0..200);
                        let bytes = payload(&mut rng, length);
                        let reserve = rng.gen_ratio(1, 5);
                        let lsn = if reserve { log.append_reserved(2, &[&bytes]) } else { log.append(1, &[&bytes]) };
                        lengths.lock().insert(lsn.unwrap().unwrap(), (bytes.len() as u64, reserve));
                    }
                })
            })
            .collect();
        let (log, seen, done) = (&log, &seen, &done);
        scope.spawn(move || {
            let mut rng = SmallRng::seed_from_u64(299);
            while !done.load(Ordering::SeqCst) {
                let next = log.next_lsn();
                if next == 1 {
                    continue;
                }
                // Mostly the newest records: those still in their stage slots.
                let lsn = if rng.gen_ratio(3, 4) {
                    next - 1 - rng.gen_range(0..(next - 1).min(8))
                } else {
                    rng.gen_range(1..next)
                };
                let position = log.position(lsn).data_position;
                let reserve = log.appended_with_reserve(lsn).expect("a reserved lsn has a flag");
                seen.lock().push((lsn, position, reserve));
            }
        });
        for appender in appenders {
            appender.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
    });
    log.shutdown().unwrap();
    let lengths = lengths.lock();
    let mut expected = HashMap::new();
    let mut position = 0;
    for lsn in 1..=lengths.len() as u64 {
        let (length, reserve) = lengths[&lsn];
        expected.insert(lsn, (position, reserve));
        position += length;
    }
    let seen = seen.lock();
    assert!(seen.len() > 100, "the reader read {} reservations", seen.len());
    for &(lsn, position, reserve) in seen.iter() {
        assert_eq!(expected[&lsn], (position, reserve), "record {lsn}");
    }
    for lsn in 1..=lengths.len() as u64 {
        assert_eq!(log.position(lsn).data_position, expected[&lsn].0);
    }
}

/// Racing pledged appends never admit more than the backlog bound, and a refused append gives
/// its bound back: what stays pledged is exactly what was admitted.
#[test]
fn racing_pledged_appends_stay_within_the_backlog_bound() {
    let (g, size) = geometry(1 << 12, 1 << 20);
    let device = TestDevice::new(size);
    Log::format(device.as_ref(), &g).unwrap();
    let (log, _) = open(&device, g, LogPosition::START, no_background(0.1));
    let (image_g, image_size) = geometry(64, pledge::CHECKPOINT_OVERHEAD_BYTES + 100 * pledge::IMAGE_LOG_BYTES);
    let image_device = TestDevice::new(image_size);
    Log::format(image_device.as_ref(), &image_g).unwrap();
    let (image_log, _) = open(&image_device, image_g, LogPosition::START, no_background(0.0));
    log.attach_images(image_log);
    log.set_backlog_image_logs(1);
    const BOUND_BLOCKS: u64 = 7;
    let admitted = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            let (log, admitted) = (&log, &admitted);
            scope.spawn(move || {
                let mut refusals_in_a_row = 0;
                while refusals_in_a_row < 200 {
                    match log.append_pledged(1, &[b"create"], BOUND_BLOCKS).unwrap() {
                        Appended::At(_) => {
                            admitted.fetch_add(1, Ordering::SeqCst);
                            refusals_in_a_row = 0;
                        }
                        Appended::Pledged => refusals_in_a_row += 1,
                        Appended::LogFull => panic!("the log filled before the backlog bound"),
                    }
                }
            });
        }
    });
    let pledged = log.pledges().unapplied_blocks();
    assert_eq!(pledged, admitted.load(Ordering::SeqCst) * BOUND_BLOCKS, "refusals gave their bounds back");
    assert!(pledged <= 100, "{pledged} image blocks pledged, above the bound of 100");
    assert!(pledged >= 50, "only {pledged} image blocks pledged");
}
