//! Arrays of memory devices: the mapping, random I/O against a model with up to m members
//! killed while running, m + 1 killed, assembly and its refusals, crashes and resync, scrub.

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::header::{self, read_header, Found, DATA_START_BYTES};
use super::intent::INTENT_START_BYTES;
use super::*;
use crate::device::{CrashMode, Fault, FaultOperation, MemoryDevice};
use crate::error::Result;

const UNIT: u64 = 4096;
const STRIPES: u64 = 24;
const MEMBER_BYTES: u64 = DATA_START_BYTES + STRIPES * UNIT;

fn accelerator() -> Arc<Accelerator> {
    crate::block::volume::default_accelerator()
}

fn memory_members(count: usize, crash_model: bool) -> (Vec<MemoryDevice>, Vec<Member>) {
    let devices: Vec<MemoryDevice> =
        (0..count)
            .map(|_| {
                if crash_model {
                    MemoryDevice::with_crash_model(MEMBER_BYTES)
                } else {
                    MemoryDevice::new(MEMBER_BYTES)
                }
            })
            .collect();
    let members = as_members(&devices);
    (devices, members)
}

fn as_members(devices: &[MemoryDevice]) -> Vec<Member> {
    devices
        .iter()
        .enumerate()
        .map(|(slot, device)| Member { name: format!("m{slot}"), device: Arc::new(device.clone()) })
        .collect()
}

fn new_array(count: usize, parity: usize, crash_model: bool) -> (Vec<MemoryDevice>, ArrayDevice) {
    let (devices, members) = memory_members(count, crash_model);
    let options = CreateOptions { parity_count: parity, stripe_unit_bytes: UNIT, initialize_parity: false };
    (devices, create(members, &options, accelerator()).expect("create"))
}

fn random_bytes(rng: &mut SmallRng, length: usize) -> Vec<u8> {
    (0..length).map(|_| rng.gen()).collect()
}

/// A random range of the array: mostly small and unaligned, sometimes whole stripes.
fn random_range(rng: &mut SmallRng, size: u64, stripe_bytes: u64) -> (u64, usize) {
    let length = match rng.gen_range(0..4) {
        0 => rng.gen_range(1..64),
        1 => rng.gen_range(1..3 * UNIT as usize),
        2 => stripe_bytes as usize,
        _ => rng.gen_range(1..3 * stripe_bytes as usize),
    }
    .min(size as usize);
    let offset = if rng.gen_bool(0.3) {
        rng.gen_range(0..=(size - length as u64) / stripe_bytes) * stripe_bytes
    } else {
        rng.gen_range(0..=size - length as u64)
    };
    (offset.min(size - length as u64), length)
}

fn kill(device: &MemoryDevice) {
    device.inject(Fault::always(FaultOperation::Any));
}

#[test]
fn shards_land_where_the_geometry_says_with_rotating_parity() {
    let (devices, array) = new_array(5, 2, false);
    let geometry = array.geometry();
    assert_eq!(array.size_bytes(), STRIPES * 3 * UNIT);
    let mut rng = SmallRng::seed_from_u64(1);
    let data = random_bytes(&mut rng, array.size_bytes() as usize);
    array.write_at(0, &data).unwrap();
    array.flush().unwrap();
    let code = ReedSolomon::new(3, 2).unwrap();
    let member_bytes: Vec<Vec<u8>> = devices.iter().map(MemoryDevice::to_bytes).collect();
    for stripe in 0..STRIPES {
        let at = |slot: usize| {
            let start = (DATA_START_BYTES + stripe * UNIT) as usize;
            &member_bytes[slot][start..start + UNIT as usize]
        };
        let mut shards: Vec<&[u8]> = Vec::new();
        for shard in 0..3 {
            let logical = ((stripe * 3 + shard as u64) * UNIT) as usize;
            assert_eq!(geometry.slot(stripe, shard), (shard + stripe as usize) % 5);
            assert_eq!(at(geometry.slot(stripe, shard)), &data[logical..logical + UNIT as usize], "stripe {stripe}");
            shards.push(at(geometry.slot(stripe, shard)));
        }
        let mut parity = vec![vec![0u8; UNIT as usize]; 2];
        let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        accelerator().reed_solomon_encode(&code, &shards, &mut outputs).unwrap();
        for (index, bytes) in parity.iter().enumerate() {
            assert_eq!(at(geometry.slot(stripe, 3 + index)), bytes.as_slice(), "stripe {stripe} parity {index}");
        }
    }
    assert_eq!(array.scrub(false).unwrap().mismatches, vec![]);
}

/// Random writes and reads against a model while up to m members die at random moments.
fn random_io_with_kills(count: usize, parity: usize, kills: usize, seed: u64) {
    let (devices, array) = new_array(count, parity, false);
    let size = array.size_bytes();
    let stripe_bytes = array.geometry().stripe_data_bytes();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model = vec![0u8; size as usize];
    let mut victims: Vec<usize> = (0..count).collect();
    for index in (1..victims.len()).rev() {
        victims.swap(index, rng.gen_range(0..=index));
    }
    let kill_at: Vec<usize> = (0..kills).map(|_| rng.gen_range(0..120)).collect();
    for step in 0..120 {
        for (victim, _) in kill_at.iter().enumerate().filter(|(_, &at)| at == step) {
            kill(&devices[victims[victim]]);
        }
        let (offset, length) = random_range(&mut rng, size, stripe_bytes);
        if rng.gen_bool(0.6) {
            let data = random_bytes(&mut rng, length);
            array.write_at(offset, &data).unwrap_or_else(|error| panic!("{count}+{parity} step {step}: {error}"));
            model[offset as usize..offset as usize + length].copy_from_slice(&data);
        } else {
            let mut buffer = vec![0u8; length];
            array.read_at(offset, &mut buffer).unwrap();
            assert!(buffer == model[offset as usize..offset as usize + length], "{count}+{parity} step {step}");
        }
        if step % 17 == 0 {
            array.flush().unwrap();
        }
    }
    for victim in victims.iter().take(kills) {
        kill(&devices[*victim]);
    }
    let mut whole = vec![0u8; size as usize];
    array.read_at(0, &mut whole).unwrap();
    assert!(whole == model, "{count}+{parity} with {kills} killed: whole array differs");
    // The whole read touched every member, so every killed one is known missing by now.
    assert_eq!(array.missing_slots().len(), kills);
    let statistics = array.statistics();
    for victim in victims.iter().take(kills) {
        assert!(statistics.slots[*victim].missing, "slot {victim} killed but not missing");
    }
    if kills > 0 {
        assert!(statistics.reconstructed_bytes > 0);
    }
}

#[test]
fn random_io_reads_right_with_up_to_m_members_killed() {
    for (count, parity) in [(2, 1), (3, 1), (5, 2), (6, 3), (8, 4), (4, 2)] {
        for kills in 0..=parity {
            random_io_with_kills(count, parity, kills, (count * 100 + parity * 10 + kills) as u64);
        }
    }
}

#[test]
fn one_member_more_than_the_parity_stops_the_array_with_a_clear_error() {
    let (devices, array) = new_array(5, 2, false);
    array.write_at(0, &[7u8; 10_000]).unwrap();
    for device in &devices[..3] {
        kill(device);
    }
    // The write joins the epoch; its flush finds the members gone.
    let error = array.write_at(100, &[1u8; 100]).and_then(|()| array.flush()).unwrap_err().to_string();
    assert!(error.contains("missing, parity 2 covers at most 2"), "{error}");
    let mut buffer = vec![0u8; 10_000];
    let error = array.read_at(0, &mut buffer).unwrap_err().to_string();
    assert!(error.contains("covers at most 2"), "{error}");
    assert!(array.flush().is_err());
}

#[test]
fn a_closed_array_assembles_degraded_from_any_members_and_refuses_bad_sets() {
    let (devices, array) = new_array(6, 2, false);
    let mut rng = SmallRng::seed_from_u64(7);
    let data = random_bytes(&mut rng, array.size_bytes() as usize);
    array.write_at(0, &data).unwrap();
    array.close().unwrap();
    drop(array);
    let members = as_members(&devices);
    // Any order, two members absent: the right bytes.
    let some: Vec<Member> = [5, 0, 3, 2].iter().map(|&slot| members[slot].clone()).collect();
    let assembly = assemble(some, accelerator()).unwrap();
    assert_eq!(assembly.resynced_stripes, 0);
    assert_eq!(assembly.device.missing_slots(), vec![1, 4]);
    assert_eq!(assembly.notes.len(), 2);
    let mut whole = vec![0u8; data.len()];
    assembly.device.read_at(0, &mut whole).unwrap();
    assert!(whole == data);
    drop(assembly);
    // Three absent: refused.
    let error = assemble(members[..3].to_vec(), accelerator()).err().unwrap().to_string();
    assert!(error.contains("slots 3, 4, 5 missing, parity 2 covers at most 2"), "{error}");
    // The same member twice.
    let twice = vec![members[0].clone(), Member { name: "again".into(), device: members[0].device.clone() }];
    let error = assemble(twice, accelerator()).err().unwrap().to_string();
    assert!(error.contains("m0 and again both claim slot 0"), "{error}");
    // A device that is no member, and a member of another array.
    let stranger = Member { name: "blank".into(), device: Arc::new(MemoryDevice::new(MEMBER_BYTES)) };
    let error = assemble(vec![members[0].clone(), stranger], accelerator()).err().unwrap().to_string();
    assert!(error.contains("blank is not a member"), "{error}");
    let (other_devices, other) = new_array(3, 1, false);
    drop(other);
    let foreign = as_members(&other_devices)[0].clone();
    let error = assemble(vec![members[0].clone(), foreign], accelerator()).err().unwrap().to_string();
    assert!(error.contains("give the members of one array"), "{error}");
    // A member too small.
    let short = MemoryDevice::new(MEMBER_BYTES - UNIT);
    short.write_at(0, &devices[1].to_bytes()[..(MEMBER_BYTES - UNIT) as usize]).unwrap();
    let error =
        assemble(vec![members[0].clone(), Member { name: "short".into(), device: Arc::new(short) }], accelerator())
            .err()
            .unwrap()
            .to_string();
    assert!(error.contains("short is"), "{error}");
    // None of the refusals wrote anything.
    let whole = assemble(members.clone(), accelerator()).unwrap();
    assert!(whole.notes.is_empty());
}

#[test]
fn a_member_failed_while_running_is_stale_when_it_comes_back() {
    let (devices, array) = new_array(4, 1, false);
    array.write_at(0, &[1u8; 50_000]).unwrap();
    kill(&devices[2]);
    array.write_at(0, &[2u8; 50_000]).unwrap();
    array.close().unwrap();
    drop(array);
    devices[2].clear_faults();
    // Slot 2 missed the second write: the others' headers say so, and it is left out.
    let assembly = assemble(as_members(&devices), accelerator()).unwrap();
    assert_eq!(assembly.device.missing_slots(), vec![2]);
    assert!(assembly.notes[0].contains("stale"), "{:?}", assembly.notes);
    let mut buffer = vec![0u8; 50_000];
    assembly.device.read_at(0, &mut buffer).unwrap();
    assert!(buffer.iter().all(|&byte| byte == 2));
}

/// `count` distinct slots of `member_count`, chosen by `rng`.
fn distinct_slots(rng: &mut SmallRng, member_count: usize, count: usize) -> Vec<usize> {
    let mut slots: Vec<usize> = (0..member_count).collect();
    for index in (1..slots.len()).rev() {
        slots.swap(index, rng.gen_range(0..=index));
    }
    slots.truncate(count);
    slots
}

/// Rule 3: writes with flushes between them, a crash that every member takes at its own point
/// (torn unflushed writes on one, all kept on another, all lost on a third), then up to m
/// members gone at once: the dirty degraded array assembles, and every byte the last flush
/// covered and the writes after it did not touch reads back as flushed, then with m members
/// gone in all. Fails without the partial parity (`apply_partial_parity`).
#[test]
fn a_crash_with_members_gone_keeps_every_flushed_byte() {
    for seed in 0..16u64 {
        for (count, parity) in [(5, 2), (4, 1), (7, 3)] {
            crash_with_members_gone(count, parity, seed);
        }
    }
}

/// Power lost at the `countdown`-th member write from arming: every member is crashed at once,
/// each with its own mode, while the write that reached zero is the last one issued. Writes in
/// flight in the array's flush (intent records, home writes) are torn, kept or lost per member.
struct CrashPoint {
    countdown: std::sync::atomic::AtomicI64,
    members: Vec<MemoryDevice>,
    modes: Vec<CrashMode>,
    seed: u64,
    crashed: parking_lot::Mutex<Option<Vec<MemoryDevice>>>,
}

impl CrashPoint {
    fn crash_now(&self) {
        let mut crashed = self.crashed.lock();
        if crashed.is_none() {
            *crashed = Some(
                self.members
                    .iter()
                    .enumerate()
                    .map(|(slot, member)| member.crash(self.seed * 10 + slot as u64, self.modes[slot]))
                    .collect(),
            );
        }
    }
    fn has_crashed(&self) -> bool {
        self.crashed.lock().is_some()
    }
}

struct CrashingMember {
    inner: MemoryDevice,
    point: Arc<CrashPoint>,
}

impl Device for CrashingMember {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buffer)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.write_at(offset, data)?;
        if self.point.countdown.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            self.point.crash_now();
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}

fn crash_with_members_gone(count: usize, parity: usize, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed * 1000 + count as u64);
    let modes = [CrashMode::Random, CrashMode::KeepAll, CrashMode::DropAll];
    let devices: Vec<MemoryDevice> = (0..count).map(|_| MemoryDevice::with_crash_model(MEMBER_BYTES)).collect();
    let point = Arc::new(CrashPoint {
        countdown: std::sync::atomic::AtomicI64::new(i64::MAX),
        members: devices.clone(),
        modes: (0..count).map(|_| modes[rng.gen_range(0..3)]).collect(),
        seed,
        crashed: parking_lot::Mutex::new(None),
    });
    let members: Vec<Member> = devices
        .iter()
        .enumerate()
        .map(|(slot, device)| Member {
            name: format!("m{slot}"),
            device: Arc::new(CrashingMember { inner: device.clone(), point: point.clone() }),
        })
        .collect();
    let options = CreateOptions { parity_count: parity, stripe_unit_bytes: UNIT, initialize_parity: false };
    let array = create(members, &options, accelerator()).unwrap();
    let size = array.size_bytes() as usize;
    let stripe_bytes = array.geometry().stripe_data_bytes();
    let mut durable = random_bytes(&mut rng, size);
    array.write_at(0, &durable).unwrap();
    array.flush().unwrap();
    let mut model = durable.clone();
    let mut touched = vec![false; size];
    point.countdown.store(rng.gen_range(1..160), std::sync::atomic::Ordering::Release);
    for step in 0..60 {
        let (offset, length) = random_range(&mut rng, size as u64, stripe_bytes);
        let length = length.min(3 * UNIT as usize);
        let bytes = random_bytes(&mut rng, length);
        if array.write_at(offset, &bytes).is_err() {
            break;
        }
        model[offset as usize..offset as usize + length].copy_from_slice(&bytes);
        touched[offset as usize..offset as usize + length].fill(true);
        if step % 7 == 6 {
            let flushed = array.flush();
            if point.has_crashed() {
                break;
            }
            flushed.unwrap();
            durable.clone_from(&model);
            touched.fill(false);
        }
    }
    point.crash_now();
    drop(array);
    let crashed = point.crashed.lock().take().expect("crashed");
    assert!(matches!(read_header(&crashed[0]).unwrap(), Found::Member(header) if header.state == ArrayState::Dirty));
    let gone_count = rng.gen_range(1..=parity);
    let gone = distinct_slots(&mut rng, count, gone_count);
    let present: Vec<Member> =
        as_members(&crashed).into_iter().enumerate().filter(|(slot, _)| !gone.contains(slot)).map(|(_, m)| m).collect();
    let assembly =
        assemble(present, accelerator()).unwrap_or_else(|error| panic!("{count}+{parity} seed {seed}: {error}"));
    assert!(assembly.resynced_stripes <= STRIPES);
    let array = assembly.device;
    assert_eq!(array.state(), ArrayState::Clean);
    let check = |array: &ArrayDevice, what: &str| {
        let mut whole = vec![0u8; size];
        array.read_at(0, &mut whole).unwrap();
        for index in 0..size {
            assert!(
                touched[index] || whole[index] == durable[index],
                "{count}+{parity} seed {seed}, slots {gone:?} gone{what}: flushed byte {index} changed"
            );
        }
    };
    check(&array, "");
    // The parity now agrees with the data: the members left may go too, up to m in all.
    for &slot in
        distinct_slots(&mut rng, count, count).iter().filter(|slot| !gone.contains(slot)).take(parity - gone.len())
    {
        kill(&crashed[slot]);
    }
    check(&array, " and more killed");
    // The members gone are stale when they come back: left out, and the bytes are the same.
    drop(array);
    for device in &crashed {
        device.clear_faults();
    }
    let assembly = assemble(as_members(&crashed), accelerator()).unwrap();
    assert!(assembly.device.missing_slots().len() >= gone.len(), "{:?}", assembly.notes);
    check(&assembly.device, " after the others came back");
}

/// The write-intent bitmap: after a crash only the stripes the last intent record marks are
/// recomputed. A parity unit damaged behind the array's back in a stripe the epoch never
/// wrote stays as it was (scrub still finds it), so the resync did not read or write it; the
/// marked stripes agree and every flushed byte is kept.
#[test]
fn a_crash_resyncs_only_the_stripes_the_bitmap_marks() {
    let (devices, array) = new_array(5, 2, true);
    let mut rng = SmallRng::seed_from_u64(5);
    let size = array.size_bytes() as usize;
    let stripe_bytes = array.geometry().stripe_data_bytes();
    let mut durable = random_bytes(&mut rng, size);
    array.write_at(0, &durable).unwrap();
    array.flush().unwrap();
    // A partial write in stripes 3 and 10, flushed: that epoch's record marks those two.
    for stripe in [3u64, 10] {
        let at = (stripe * stripe_bytes + 100) as usize;
        let bytes = random_bytes(&mut rng, 500);
        array.write_at(at as u64, &bytes).unwrap();
        durable[at..at + 500].copy_from_slice(&bytes);
    }
    array.flush().unwrap();
    // Unflushed writes into the same stripes, torn at the crash.
    let mut touched = vec![false; size];
    for stripe in [3u64, 10] {
        let at = (stripe * stripe_bytes + 2000) as usize;
        array.write_at(at as u64, &random_bytes(&mut rng, 3000)).unwrap();
        touched[at..at + 3000].fill(true);
    }
    array.flush().unwrap();
    array.write_at(3 * stripe_bytes + 50, &[9u8; 10]).unwrap();
    touched[(3 * stripe_bytes + 50) as usize..(3 * stripe_bytes + 60) as usize].fill(true);
    // Stripe 20's parity damaged where the array cannot see it.
    let geometry = array.geometry();
    let parity_slot = geometry.slot(20, 3);
    devices[parity_slot].write_at(geometry.member_offset(20, 8), &[0x5A; 8]).unwrap();
    devices[parity_slot].flush().unwrap();
    let crashed: Vec<MemoryDevice> =
        devices.iter().enumerate().map(|(slot, device)| device.crash(slot as u64, CrashMode::Random)).collect();
    drop(array);
    let assembly = assemble(as_members(&crashed), accelerator()).unwrap();
    assert_eq!(assembly.resynced_stripes, 2, "only stripes 3 and 10 are marked");
    let report = assembly.device.scrub(false).unwrap();
    assert_eq!(report.mismatches.iter().map(|mismatch| mismatch.stripe).collect::<Vec<_>>(), vec![20]);
    let mut whole = vec![0u8; size];
    assembly.device.read_at(0, &mut whole).unwrap();
    assert!((0..size).all(|index| touched[index] || whole[index] == durable[index]));
}

/// A version-1 array (no intent records): read and upgraded to version 2 at its first header
/// write; dirty with every member it is resynced whole; dirty with a member gone it is refused
/// as before (rule 2), since it kept no partial parity.
#[test]
fn a_version_one_array_is_read_upgraded_and_refused_dirty_degraded() {
    let (devices, array) = new_array(4, 2, false);
    let mut rng = SmallRng::seed_from_u64(8);
    let data = random_bytes(&mut rng, array.size_bytes() as usize);
    array.write_at(0, &data).unwrap();
    array.close().unwrap();
    drop(array);
    let as_version_one = |state: ArrayState| {
        for device in &devices {
            let Found::Member(mut header) = read_header(device).unwrap() else { panic!("no header") };
            header.state = state;
            let bytes = header.encode_as(1);
            device.write_at(0, &bytes).unwrap();
            device.write_at(header::HEADER_BYTES as u64, &bytes).unwrap();
            device.write_at(INTENT_START_BYTES, &vec![0u8; 8192]).unwrap();
        }
    };
    as_version_one(ArrayState::Dirty);
    let error = assemble(as_members(&devices)[1..].to_vec(), accelerator()).err().unwrap().to_string();
    assert!(error.contains("version-1") && error.contains("bring the member back"), "{error}");
    let assembly = assemble(as_members(&devices), accelerator()).unwrap();
    assert_eq!(assembly.resynced_stripes, STRIPES);
    drop(assembly);
    let version = |device: &MemoryDevice| match read_header(device).unwrap() {
        Found::Member(header) => header.version,
        _ => panic!("no header"),
    };
    assert!(devices.iter().all(|device| version(device) == header::VERSION));
    as_version_one(ArrayState::Clean);
    let assembly = assemble(as_members(&devices)[1..].to_vec(), accelerator()).unwrap();
    let mut whole = vec![0u8; data.len()];
    assembly.device.read_at(0, &mut whole).unwrap();
    assert!(whole == data);
    assert!(devices.iter().all(|device| version(device) == 1), "reading writes nothing");
    assembly.device.write_at(5, &[1, 2, 3]).unwrap();
    drop(assembly);
    assert!(devices[1..].iter().all(|device| version(device) == header::VERSION));
}

#[test]
fn scrub_finds_and_repairs_a_silently_corrupted_block() {
    let (devices, array) = new_array(6, 2, false);
    let mut rng = SmallRng::seed_from_u64(3);
    let data = random_bytes(&mut rng, array.size_bytes() as usize);
    array.write_at(0, &data).unwrap();
    array.flush().unwrap();
    let stripe = 5u64;
    let slot = array.geometry().slot(stripe, 1);
    let at = DATA_START_BYTES + stripe * UNIT + 100;
    devices[slot].write_at(at, &[0xEE; 16]).unwrap();
    let report = array.scrub(true).unwrap();
    assert_eq!(report.mismatches, vec![Mismatch { stripe, row: 0, bad_slot: Some(slot), repaired: true }]);
    assert_eq!(array.statistics().slots[slot].repaired_bytes, 4096);
    assert_eq!(array.scrub(false).unwrap().mismatches, vec![]);
    let mut whole = vec![0u8; data.len()];
    array.read_at(0, &mut whole).unwrap();
    assert!(whole == data);
    // With one parity a mismatch is found but cannot be placed.
    let (devices, array) = new_array(4, 1, false);
    array.write_at(0, &data[..array.size_bytes() as usize]).unwrap();
    array.flush().unwrap();
    devices[0].write_at(DATA_START_BYTES + 10, &[0x11; 4]).unwrap();
    let report = array.scrub(true).unwrap();
    assert_eq!(report.mismatches, vec![Mismatch { stripe: 0, row: 0, bad_slot: None, repaired: false }]);
}

#[test]
fn bad_shapes_and_sizes_are_refused_before_anything_is_written() {
    let (devices, members) = memory_members(3, false);
    for (parity, unit, words) in
        [(3, UNIT, "at least 4"), (0, UNIT, "1 to 4"), (5, UNIT, "1 to 4"), (1, 6000, "power of two")]
    {
        let options = CreateOptions { parity_count: parity, stripe_unit_bytes: unit, initialize_parity: false };
        let error = create(members.clone(), &options, accelerator()).err().unwrap().to_string();
        assert!(error.contains(words), "{error}");
    }
    let mut mixed = members.clone();
    mixed[1] = Member { name: "big".into(), device: Arc::new(MemoryDevice::new(MEMBER_BYTES + UNIT)) };
    let options = CreateOptions { parity_count: 1, stripe_unit_bytes: UNIT, initialize_parity: false };
    let error = create(mixed, &options, accelerator()).err().unwrap().to_string();
    assert!(error.contains("must be the same size"), "{error}");
    assert!(devices.iter().all(|device| device.to_bytes().iter().all(|&byte| byte == 0)));
}

/// The GPU twin: the same writes through an accelerator that runs every Reed–Solomon request on
/// the GPU and through the CPU engine leave identical member bytes, and degraded reads agree.
/// Skipped, saying so, where no GPU is found.
#[test]
fn gpu_and_cpu_engines_leave_identical_members() {
    use tandem_accel::{Mode, RuntimeConfig};
    let gpu =
        Arc::new(Accelerator::new(RuntimeConfig { mode: Mode::Gpu, calibrate: false, ..RuntimeConfig::default() }));
    if !gpu.has_gpu() {
        println!("skipped: no GPU ({})", gpu.describe().trim());
        return;
    }
    let cpu = Arc::new(Accelerator::new(RuntimeConfig { mode: Mode::Cpu, ..RuntimeConfig::default() }));
    let mut seed_source = SmallRng::from_entropy();
    let seed: u64 = seed_source.gen();
    let mut arrays = Vec::new();
    for accelerator in [gpu, cpu] {
        let (devices, members) = memory_members(6, false);
        let options = CreateOptions { parity_count: 3, stripe_unit_bytes: UNIT, initialize_parity: false };
        let array = create(members, &options, accelerator).unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        let stripe_bytes = array.geometry().stripe_data_bytes();
        for _ in 0..200 {
            let (offset, length) = random_range(&mut rng, array.size_bytes(), stripe_bytes);
            array.write_at(offset, &random_bytes(&mut rng, length)).unwrap();
        }
        // The epoch goes home: the members' bytes are what the engines are compared on.
        array.flush().unwrap();
        arrays.push((devices, array));
    }
    for slot in 0..6 {
        let gpu_bytes = arrays[0].0[slot].to_bytes();
        let cpu_bytes = arrays[1].0[slot].to_bytes();
        assert!(
            gpu_bytes[DATA_START_BYTES as usize..] == cpu_bytes[DATA_START_BYTES as usize..],
            "seed {seed}: slot {slot}"
        );
    }
    let mut reads = Vec::new();
    for (devices, array) in &arrays {
        for slot in [0, 2, 5] {
            kill(&devices[slot]);
        }
        let mut whole = vec![0u8; array.size_bytes() as usize];
        array.read_at(0, &mut whole).unwrap();
        reads.push(whole);
    }
    assert!(reads[0] == reads[1], "seed {seed}: degraded reads differ");
}

/// Self-healing: a block silently wrong on one member, read with the volume's checksum as the
/// check, comes back right, and the member is rewritten; bytes no copy can make right are
/// reported as such.
#[test]
fn a_checked_read_rebuilds_and_rewrites_a_silently_wrong_block() {
    for (count, parity) in [(3, 1), (6, 2)] {
        let (devices, array) = new_array(count, parity, false);
        let mut rng = SmallRng::seed_from_u64(11);
        let data = random_bytes(&mut rng, array.size_bytes() as usize);
        array.write_at(0, &data).unwrap();
        array.flush().unwrap();
        let originals: Vec<Vec<u8>> = devices.iter().map(MemoryDevice::to_bytes).collect();
        for block in [0u64, 7, 13] {
            let offset = block * 4096;
            let piece = &array.pieces(offset, 4096)[0];
            let slot = array.geometry().slot(piece.stripe, piece.shard);
            let member_offset = array.geometry().member_offset(piece.stripe, piece.row);
            devices[slot].write_at(member_offset + 17, &[0xA5; 40]).unwrap();
            let expected = tandem_accel::crc32c(0, &data[offset as usize..offset as usize + 4096]);
            let check = |bytes: &[u8]| tandem_accel::crc32c(0, bytes) == expected;
            let mut buffer = vec![0u8; 4096];
            array.read_at(offset, &mut buffer).unwrap();
            assert!(!check(&buffer), "the corruption is visible to a plain read");
            assert!(array.read_checked(offset, &mut buffer, &check).unwrap(), "{count}+{parity} block {block}");
            assert!(buffer == data[offset as usize..offset as usize + 4096]);
            assert!(
                devices[slot].to_bytes() == originals[slot],
                "{count}+{parity} block {block}: member not rewritten"
            );
        }
        assert_eq!(array.statistics().healed_bytes, 3 * 4096);
        let repaired: u64 = array.statistics().slots.iter().map(|slot| slot.repaired_bytes).sum();
        assert_eq!(repaired, 3 * 4096);
        let mut buffer = vec![0u8; 100];
        assert!(!array.read_checked(50, &mut buffer, &|_| false).unwrap());
        assert!(buffer == data[50..150]);
        assert_eq!(array.scrub(false).unwrap().mismatches, vec![]);
    }
}

/// A rebuild onto a fresh device gives a member identical to the lost one, and the array whole.
#[test]
fn a_rebuild_onto_a_fresh_device_gives_the_lost_member_back() {
    let (devices, array) = new_array(5, 2, false);
    let mut rng = SmallRng::seed_from_u64(21);
    let data = random_bytes(&mut rng, array.size_bytes() as usize);
    array.write_at(0, &data).unwrap();
    array.close().unwrap();
    drop(array);
    let lost = devices[3].to_bytes();
    let assembly =
        assemble(as_members(&devices).into_iter().filter(|member| member.name != "m3").collect(), accelerator())
            .unwrap();
    let fresh = MemoryDevice::new(MEMBER_BYTES);
    let mut calls = 0;
    let replacement = Member { name: "fresh".into(), device: Arc::new(fresh.clone()) };
    let rebuilt = assembly.device.rebuild_onto(3, replacement, &mut |done, total| {
        calls += 1;
        assert!(done <= total);
    });
    let rebuilt = rebuilt.unwrap();
    assert_eq!(calls, STRIPES);
    assert!(rebuilt.missing_slots().is_empty());
    assert!(fresh.to_bytes()[DATA_START_BYTES as usize..] == lost[DATA_START_BYTES as usize..]);
    drop(rebuilt);
    // The old member is now a stranger in slot 3 (another uuid); the fresh one assembles.
    let mut members = as_members(&devices);
    members[3] = Member { name: "fresh".into(), device: Arc::new(fresh.clone()) };
    let assembly = assemble(members, accelerator()).unwrap();
    assert!(assembly.notes.is_empty(), "{:?}", assembly.notes);
    let mut whole = vec![0u8; data.len()];
    assembly.device.read_at(0, &mut whole).unwrap();
    assert!(whole == data);
    assert_eq!(assembly.device.scrub(false).unwrap().mismatches, vec![]);
    let stale = assemble(as_members(&devices), accelerator()).unwrap();
    assert!(stale.notes[0].contains("replaced"), "{:?}", stale.notes);
    // The replaced member lying beside its successor, before it or after: the successor wins.
    let mut beside = as_members(&devices);
    beside.push(Member { name: "fresh".into(), device: Arc::new(fresh.clone()) });
    assert!(assemble(beside.clone(), accelerator()).unwrap().notes.is_empty());
    beside.reverse();
    assert!(assemble(beside, accelerator()).unwrap().notes.is_empty());
    // A slot that is not missing is refused.
    let replacement = Member { name: "other".into(), device: Arc::new(MemoryDevice::new(MEMBER_BYTES)) };
    let error = stale.device.rebuild_onto(0, replacement, &mut |_, _| {}).err().unwrap().to_string();
    assert!(error.contains("not a missing slot"), "{error}");
}

/// `rebuild` while writers run on the array (as under a mounted volume): the writes that reach
/// stripes the cursor has passed go to the new member too, the others are rebuilt from the
/// members. Afterwards every byte reads back, with the new member in and two others gone, the
/// parity agrees everywhere, and the new member equals what an offline rebuild gives.
#[test]
fn a_rebuild_while_writers_run_keeps_every_byte_and_matches_an_offline_one() {
    const WRITERS: usize = 3;
    let (devices, array) = new_array(6, 2, false);
    let mut rng = SmallRng::seed_from_u64(33);
    let size = array.size_bytes() as usize;
    let start = random_bytes(&mut rng, size);
    array.write_at(0, &start).unwrap();
    array.close().unwrap();
    drop(array);
    let without: Vec<Member> = as_members(&devices).into_iter().filter(|member| member.name != "m2").collect();
    let array = Arc::new(assemble(without, accelerator()).unwrap().device);
    let fresh = MemoryDevice::new(MEMBER_BYTES);
    let watched = Arc::new(HeaderAfterData { inner: fresh.clone(), unflushed_data: AtomicBool::new(false) });
    let done = Arc::new(AtomicBool::new(false));
    let region = size / WRITERS;
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (array, done) = (array.clone(), done.clone());
            let mut model = start[writer * region..(writer + 1) * region].to_vec();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(100 + writer as u64);
                let mut rounds = 0;
                // Bounded: the rebuild below ends in well under this many rounds of each writer.
                while !done.load(Ordering::Acquire) || rounds < 20 {
                    assert!(rounds < 1_000_000, "the rebuild never ended");
                    let length = rng.gen_range(1..2 * UNIT as usize).min(region);
                    let at = rng.gen_range(0..=region - length);
                    let bytes = random_bytes(&mut rng, length);
                    array.write_at((writer * region + at) as u64, &bytes).unwrap();
                    model[at..at + length].copy_from_slice(&bytes);
                    if rounds % 3 == 0 {
                        array.flush().unwrap();
                    }
                    rounds += 1;
                }
                model
            })
        })
        .collect();
    let replacement = Member { name: "fresh".into(), device: watched };
    array
        .rebuild(2, replacement, &mut |_, _| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            true
        })
        .unwrap();
    done.store(true, Ordering::Release);
    let mut model = start.clone();
    for (writer, thread) in writers.into_iter().enumerate() {
        model[writer * region..(writer + 1) * region].copy_from_slice(&thread.join().unwrap());
    }
    assert!(array.missing_slots().is_empty());
    assert_eq!(array.scrub(false).unwrap().mismatches, vec![]);
    let array = Arc::into_inner(array).expect("the writers are done");
    array.close().unwrap();
    drop(array);
    // The new member in, two others gone: the bytes come from it.
    let mut members = as_members(&devices);
    members[2] = Member { name: "fresh".into(), device: Arc::new(fresh.clone()) };
    let partial: Vec<Member> =
        members.into_iter().enumerate().filter(|(slot, _)| ![0, 4].contains(slot)).map(|(_, m)| m).collect();
    let assembly = assemble(partial, accelerator()).unwrap();
    let mut whole = vec![0u8; size];
    assembly.device.read_at(0, &mut whole).unwrap();
    assert!(whole == model, "a byte written during the rebuild was lost");
    drop(assembly);
    // Offline, from the others, onto another device: the same member.
    let others: Vec<Member> = as_members(&devices).into_iter().filter(|member| member.name != "m2").collect();
    let offline = MemoryDevice::new(MEMBER_BYTES);
    let replacement = Member { name: "offline".into(), device: Arc::new(offline.clone()) };
    assemble(others, accelerator()).unwrap().device.rebuild_onto(2, replacement, &mut |_, _| {}).unwrap();
    assert!(offline.to_bytes()[DATA_START_BYTES as usize..] == fresh.to_bytes()[DATA_START_BYTES as usize..]);
}

/// A new member that checks the rebuild's promise: no header bytes while written stripe units
/// are not yet flushed (a crash could keep the header and lose the units).
struct HeaderAfterData {
    inner: MemoryDevice,
    unflushed_data: AtomicBool,
}

impl Device for HeaderAfterData {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buffer)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        if offset >= DATA_START_BYTES {
            self.unflushed_data.store(true, Ordering::Release);
        } else if offset < 2 * header::HEADER_BYTES as u64 && data.iter().any(|&byte| byte != 0) {
            assert!(!self.unflushed_data.load(Ordering::Acquire), "a header written before the units were flushed");
        }
        self.inner.write_at(offset, data)
    }
    fn flush(&self) -> Result<()> {
        self.unflushed_data.store(false, Ordering::Release);
        self.inner.flush()
    }
}

/// A power loss at any member write of a rebuild, the header switch included: the array
/// assembles either as before (the new member has no header) or with the new member in, every
/// flushed byte the same.
#[test]
fn a_crash_during_a_rebuild_leaves_the_array_as_before_or_whole() {
    let count = 6;
    let dry = rebuild_crashing_at(count, i64::MAX, 0);
    assert!(dry > 30, "{dry} writes");
    // Three seeds a point: each member's crash mode (keep, drop, tear) is drawn per seed.
    for point in 1..=dry {
        for seed in 0..3 {
            rebuild_crashing_at(count, point, point as u64 * 3 + seed);
        }
    }
}

/// Rebuilds slot 1 of a 4+2 array with the power lost at member write `point`; returns the
/// member writes the rebuild made.
fn rebuild_crashing_at(count: usize, point: i64, seed: u64) -> i64 {
    let mut rng = SmallRng::seed_from_u64(seed);
    let modes = [CrashMode::Random, CrashMode::KeepAll, CrashMode::DropAll];
    let devices: Vec<MemoryDevice> = (0..=count).map(|_| MemoryDevice::with_crash_model(MEMBER_BYTES)).collect();
    let crash = Arc::new(CrashPoint {
        countdown: std::sync::atomic::AtomicI64::new(i64::MAX),
        members: devices.clone(),
        // The new member's mode cycles with the seed, so each point tears it once.
        modes: (0..=count)
            .map(|slot| modes[if slot == count { seed as usize % 3 } else { rng.gen_range(0..3) }])
            .collect(),
        seed,
        crashed: parking_lot::Mutex::new(None),
    });
    let wrapped: Vec<Member> = devices
        .iter()
        .enumerate()
        .map(|(slot, device)| Member {
            name: format!("m{slot}"),
            device: Arc::new(CrashingMember { inner: device.clone(), point: crash.clone() }),
        })
        .collect();
    let options = CreateOptions { parity_count: 2, stripe_unit_bytes: UNIT, initialize_parity: false };
    let array = create(wrapped[..count].to_vec(), &options, accelerator()).unwrap();
    let size = array.size_bytes() as usize;
    let durable = random_bytes(&mut rng, size);
    array.write_at(0, &durable).unwrap();
    array.close().unwrap();
    drop(array);
    let present: Vec<Member> = wrapped[..count].iter().filter(|member| member.name != "m1").cloned().collect();
    let array = assemble(present, accelerator()).unwrap().device;
    crash.countdown.store(point, std::sync::atomic::Ordering::Release);
    let result = array.rebuild(1, wrapped[count].clone(), &mut |_, _| true);
    let writes = i64::MAX - crash.countdown.load(std::sync::atomic::Ordering::Acquire);
    if point == i64::MAX {
        result.unwrap();
        assert!(array.missing_slots().is_empty());
    }
    crash.crash_now();
    drop(array);
    let crashed = crash.crashed.lock().take().expect("crashed");
    let target = &crashed[count];
    let mut members: Vec<Member> =
        as_members(&crashed[..count]).into_iter().filter(|member| member.name != "m1").collect();
    let joined = matches!(read_header(target).unwrap(), Found::Member(_));
    if joined {
        members.push(Member { name: "new".into(), device: Arc::new(target.clone()) });
    }
    let assembly = assemble(members, accelerator()).unwrap_or_else(|error| panic!("point {point}: {error}"));
    let array = assembly.device;
    let expect_missing: Vec<usize> = if joined { vec![] } else { vec![1] };
    assert_eq!(array.missing_slots(), expect_missing, "point {point}: {:?}", assembly.notes);
    let mut whole = vec![0u8; size];
    array.read_at(0, &mut whole).unwrap();
    assert!(whole == durable, "point {point}: a flushed byte changed");
    if joined {
        // The new member's bytes are the lost one's: with two others gone they still read.
        assert_eq!(array.scrub(false).unwrap().mismatches, vec![], "point {point}");
        drop(array);
        let mut members = as_members(&crashed[..count]);
        members[1] = Member { name: "new".into(), device: Arc::new(target.clone()) };
        let partial: Vec<Member> =
            members.into_iter().enumerate().filter(|(slot, _)| ![0, 3].contains(slot)).map(|(_, m)| m).collect();
        let array = assemble(partial, accelerator()).unwrap().device;
        array.read_at(0, &mut whole).unwrap();
        assert!(whole == durable, "point {point}: the new member holds wrong bytes");
    }
    writes
}

/// Bad requests are refused with nothing written: a slot out of range or present, a device too
/// small, a member of the array itself.
#[test]
fn a_bad_rebuild_request_is_refused_and_writes_nothing() {
    let (devices, array) = new_array(5, 2, false);
    array.write_at(0, &[9u8; 50_000]).unwrap();
    array.close().unwrap();
    drop(array);
    let members: Vec<Member> = as_members(&devices).into_iter().filter(|member| member.name != "m3").collect();
    let kept = members[0].clone();
    let array = assemble(members, accelerator()).unwrap().device;
    let before: Vec<Vec<u8>> = devices.iter().map(MemoryDevice::to_bytes).collect();
    let fresh = MemoryDevice::new(MEMBER_BYTES);
    let small = MemoryDevice::new(MEMBER_BYTES - UNIT);
    let cases: [(usize, Member, &str); 4] = [
        (7, Member { name: "fresh".into(), device: Arc::new(fresh.clone()) }, "not a missing slot"),
        (1, Member { name: "fresh".into(), device: Arc::new(fresh.clone()) }, "not a missing slot"),
        (3, Member { name: "small".into(), device: Arc::new(small.clone()) }, "cannot take slot 3"),
        (3, kept, "already a member"),
    ];
    for (slot, member, words) in cases {
        let error = array.rebuild(slot, member, &mut |_, _| true).unwrap_err().to_string();
        assert!(error.contains(words), "{error}");
    }
    assert!(fresh.to_bytes().iter().all(|&byte| byte == 0) && small.to_bytes().iter().all(|&byte| byte == 0));
    assert!(devices.iter().map(MemoryDevice::to_bytes).collect::<Vec<_>>() == before);
    // A rebuild stopped part-way leaves the new device without a header and the array degraded.
    let error =
        array.rebuild(3, Member { name: "fresh".into(), device: Arc::new(fresh.clone()) }, &mut |done, _| done < 5);
    assert!(error.unwrap_err().to_string().contains("stopped"));
    assert!(matches!(read_header(&fresh).unwrap(), Found::NotMember));
    assert_eq!(array.missing_slots(), vec![3]);
}
