//! Volumes on erasure-coded arrays of memory devices (docs/RAID.md).
//!
//! The crash test on an array: random operations with random syncs, back-end passes and
//! checkpoints, and a power loss at a random member write (often in the middle of the array's
//! flush: an intent record or a home write in flight) that every member takes in its own mode
//! (one member's unflushed writes torn at random while another's all completed, and so on).
//! Up to m members are then gone as well: the dirty degraded array must recover (rule 3, the
//! partial-parity log), pass fsck, take the gone members back by a rebuild, and hold a state
//! after a prefix of the operations that includes everything acknowledged; the same state must
//! read back with m other members gone. Seed 19 fails without the partial parity.
//! Then members killed while the volume runs: up to m lose nothing; m + 1 stop it with a clear
//! error. `TANDEM_SEED=n cargo test --test raid` reproduces one seed.

mod common;

use common::ops::{Driver, Workload};
use common::*;
use rand::Rng;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tandemfs::device::array::{self, ArrayDevice, CreateOptions, Member};
use tandemfs::device::{CrashMode, Device, Fault, FaultOperation, MemoryDevice};
use tandemfs::fs::{FormatOptions, MountOptions};
use tandemfs::FileSystem;

const MEMBER_COUNT: usize = 4;
const PARITY_COUNT: usize = 2;
const STRIPE_UNIT_BYTES: u64 = 16 << 10;
/// Each member: 1 MiB of headers and 8 MiB of units, so the volume has 16 MiB (2 data units
/// per stripe).
const MEMBER_BYTES: u64 = array::DATA_START_BYTES + (8 << 20);
const ROUNDS_PER_SEED: u64 = 5;

fn members_of(devices: &[MemoryDevice]) -> Vec<Member> {
    devices
        .iter()
        .enumerate()
        .map(|(slot, device)| Member { name: format!("member {slot}"), device: Arc::new(device.clone()) })
        .collect()
}

fn accelerator() -> Arc<tandem_accel::Accelerator> {
    tandemfs::block::volume::default_accelerator()
}

/// A formatted volume on a new array of crash-model memory members, closed clean.
/// An array volume (no crash model) holding one file `f` of four random blocks from `seed`,
/// unmounted: its members, the file's bytes and its attributes.
fn array_with_one_file(seed: u64) -> (Vec<MemoryDevice>, Vec<u8>, tandemfs::fs::Attributes) {
    let devices = array_volume(false);
    let mut rng = rng(seed);
    let data: Vec<u8> = (0..4 * 4096).map(|_| rng.gen()).collect();
    let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let file = fs.create(tandemfs::fs::ROOT_INODE, b"f", tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.write(file.inode, 0, &data).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    (devices, data, file)
}

fn array_volume(crash_model: bool) -> Vec<MemoryDevice> {
    array_volume_with(crash_model, None)
}

/// `array_volume`, encrypted when `encryption` says so.
fn array_volume_with(crash_model: bool, encryption: Option<tandemfs::crypt::Encryption>) -> Vec<MemoryDevice> {
    let devices: Vec<MemoryDevice> =
        (0..MEMBER_COUNT)
            .map(|_| {
                if crash_model {
                    MemoryDevice::with_crash_model(MEMBER_BYTES)
                } else {
                    MemoryDevice::new(MEMBER_BYTES)
                }
            })
            .collect();
    let options =
        CreateOptions { parity_count: PARITY_COUNT, stripe_unit_bytes: STRIPE_UNIT_BYTES, initialize_parity: false };
    let array = Arc::new(array::create(members_of(&devices), &options, accelerator()).expect("create"));
    let format = FormatOptions {
        hash_seed: Some([1, 2, 3, 4]),
        uuid: Some([9; 16]),
        inode_count: Some(array.size_bytes() / 2048),
        encryption,
        ..FormatOptions::default()
    };
    FileSystem::format(array.clone(), &format).expect("format");
    array.close().expect("close");
    devices
}

/// The array on `devices` without the slots in `leave_out`.
fn assemble(devices: &[MemoryDevice], leave_out: &[usize]) -> array::Assembly {
    let members = members_of(devices)
        .into_iter()
        .enumerate()
        .filter(|(slot, _)| !leave_out.contains(slot))
        .map(|(_, member)| member)
        .collect();
    array::assemble(members, accelerator()).unwrap_or_else(|error| panic!("assemble: {error}"))
}

fn two_distinct_slots(rng: &mut rand::rngs::SmallRng) -> Vec<usize> {
    let first = rng.gen_range(0..MEMBER_COUNT);
    let second = (first + rng.gen_range(1..MEMBER_COUNT)) % MEMBER_COUNT;
    vec![first, second]
}

/// Power lost at the `countdown`-th member write: every member's crash image is taken at once,
/// each with its own mode, while the write that reached zero is the last one issued. The
/// members go on (the file system finishes its operation); the test goes on from the images.
struct CrashPoint {
    countdown: AtomicI64,
    members: Vec<MemoryDevice>,
    modes: Vec<CrashMode>,
    seed: u64,
    images: parking_lot::Mutex<Option<Vec<MemoryDevice>>>,
}

impl CrashPoint {
    fn crash_now(&self) {
        let mut images = self.images.lock();
        if images.is_none() {
            let taken = self.members.iter().enumerate();
            *images = Some(
                taken.map(|(slot, member)| member.crash_image(self.seed + slot as u64, self.modes[slot])).collect(),
            );
        }
    }
    fn has_crashed(&self) -> bool {
        self.images.lock().is_some()
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
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> tandemfs::Result<()> {
        self.inner.read_at(offset, buffer)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> tandemfs::Result<()> {
        self.inner.write_at(offset, data)?;
        if self.point.countdown.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.point.crash_now();
        }
        Ok(())
    }
    fn flush(&self) -> tandemfs::Result<()> {
        self.inner.flush()
    }
    fn reachable_by_other_processes(&self) -> bool {
        false
    }
}

/// One or two distinct slots.
fn some_distinct_slots(rng: &mut rand::rngs::SmallRng) -> Vec<usize> {
    let mut slots = two_distinct_slots(rng);
    slots.truncate(rng.gen_range(1..=PARITY_COUNT));
    slots
}

/// The random operations both array tests run on the volume.
const ARRAY_WORKLOAD: Workload = Workload {
    names_per_directory: 12,
    write_bytes_max: 40_000,
    file_bytes_max: 200_000,
    create_weight: 6,
    flat: false,
};

fn crash_run(seed: u64) -> u64 {
    let options = inline_options();
    let mut devices = array_volume(true);
    let mut rng = rng(seed);
    let mut driver = Driver::new(ARRAY_WORKLOAD);
    let mut crash_points = 0;
    for round in 0..ROUNDS_PER_SEED {
        // Power goes at a member write chosen at random (in the middle of a flush of the
        // array: an intent record or a home write in flight), every member at once, each
        // with its own mode: torn, lost or kept unflushed writes, member by member.
        let point = Arc::new(CrashPoint {
            countdown: AtomicI64::new(rng.gen_range(1..150)),
            members: devices.clone(),
            modes: (0..MEMBER_COUNT)
                .map(|_| [CrashMode::KeepAll, CrashMode::DropAll, CrashMode::Random][rng.gen_range(0..3)])
                .collect(),
            seed: rng.gen(),
            images: parking_lot::Mutex::new(None),
        });
        let crashing = devices
            .iter()
            .enumerate()
            .map(|(slot, device)| Member {
                name: format!("member {slot}"),
                device: Arc::new(CrashingMember { inner: device.clone(), point: point.clone() }),
            })
            .collect();
        let assembly = array::assemble(crashing, accelerator()).unwrap_or_else(|error| panic!("assemble: {error}"));
        let device: Arc<dyn Device> = Arc::new(assembly.device);
        let (fs, _) = FileSystem::mount(device, &options)
            .unwrap_or_else(|error| panic!("seed {seed} round {round}: mount: {error}"));
        let mut candidates = vec![driver.model.clone()];
        // The acceptable states as of the operation the power went in.
        let mut at_crash = point.has_crashed().then(|| candidates.clone());
        let crashed_in_mount = at_crash.is_some();
        for _ in 0..rng.gen_range(5..50) {
            let mut synced = false;
            let outcome = match rng.gen_range(0..12) {
                0 => fs.sync().map(|()| synced = true),
                1 => fs.run_backend(),
                2 => fs.checkpoint(),
                _ => {
                    let outcome = driver.step(&fs, &mut rng);
                    candidates.append(&mut driver.passed_through);
                    outcome.map(|()| candidates.push(driver.model.clone()))
                }
            };
            outcome.unwrap_or_else(|error| panic!("seed {seed} round {round}: {error}"));
            if at_crash.is_none() && point.has_crashed() {
                // A sync the power went in did not finish: what it would drop may be there.
                at_crash = Some(candidates.clone());
            }
            if synced {
                candidates = vec![driver.model.clone()];
            }
        }
        point.crash_now();
        let candidates = at_crash.unwrap_or(candidates);
        devices = point.images.lock().take().expect("crashed");
        drop(fs);
        crash_points += 1;
        // Up to m members gone at the crash (rule 3): the dirty degraded array recomputes the
        // parity the intent records mark, solving the missing units' untouched bytes from the
        // partial parity, and fsck finds the volume whole. Then the gone members are rebuilt
        // onto fresh devices, so that the next round has them all.
        // (A crash at the very first header write of the round leaves it clean: nothing to do.)
        let gone_at_crash = if rng.gen_bool(0.2) { Vec::new() } else { some_distinct_slots(&mut rng) };
        let recovered: Arc<ArrayDevice> = Arc::new(assemble(&devices, &gone_at_crash).device);
        let report = check_with_key(recovered.clone(), None);
        // Power lost in the mount's own first superblock write leaves that copy torn while the
        // other still says unmounted: fsck reports it (the next mount rewrites it), as on one
        // device; nothing of the array's.
        let problems: Vec<&String> = report
            .problems
            .iter()
            .filter(|problem| {
                !(crashed_in_mount && problem.starts_with("superblock copy") && problem.contains("checksum"))
            })
            .collect();
        assert!(
            problems.is_empty() && report.problems_not_listed == 0,
            "seed {seed} round {round}: fsck after crash with slots {gone_at_crash:?} gone: {problems:#?}"
        );
        let mut recovered = Arc::try_unwrap(recovered).ok().expect("fsck let the array go");
        for &slot in &gone_at_crash {
            let fresh = MemoryDevice::with_crash_model(MEMBER_BYTES);
            let member = Member { name: format!("fresh {slot}"), device: Arc::new(fresh.clone()) };
            recovered = recovered
                .rebuild_onto(slot, member, &mut |_, _| {})
                .unwrap_or_else(|error| panic!("seed {seed} round {round}: rebuild slot {slot}: {error}"));
            devices[slot] = fresh;
        }
        assert_eq!(recovered.scrub(false).unwrap().mismatches, vec![], "seed {seed} round {round}");
        recovered.close().unwrap();
        drop(recovered);
        // Read-only with m members gone (nothing reaches the members): the same bytes.
        let gone = two_distinct_slots(&mut rng);
        let degraded: Arc<dyn Device> = Arc::new(assemble(&devices, &gone).device);
        let read_only = MountOptions { read_only: true, ..inline_options() };
        let (fs, _) = FileSystem::mount(degraded, &read_only)
            .unwrap_or_else(|error| panic!("seed {seed} round {round}: degraded mount: {error}"));
        let degraded_back = read_back(&fs).unwrap_or_else(|error| panic!("seed {seed} round {round}: {error}"));
        drop(fs);
        let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
        let (fs, _) = FileSystem::mount(device, &options)
            .unwrap_or_else(|error| panic!("seed {seed} round {round}: mount after crash: {error}"));
        let back = read_back(&fs).unwrap_or_else(|error| panic!("seed {seed} round {round}: read back: {error}"));
        assert!(same_tree(&back, &degraded_back), "seed {seed} round {round}: slots {gone:?} gone read differently");
        let Some(found) = candidates.iter().rposition(|candidate| same_tree(candidate, &back)) else {
            panic!(
                "seed {seed} round {round}: the volume matches none of {} acceptable states; against the acknowledged one: {}",
                candidates.len(),
                first_difference(&candidates[0], &back)
            );
        };
        driver.model = candidates[found].clone();
        fs.unmount().unwrap_or_else(|error| panic!("seed {seed} round {round}: unmount: {error}"));
    }
    crash_points
}

#[test]
fn crashes_on_an_array_lose_nothing_acknowledged() {
    let mut crash_points = 0;
    for seed in seeds(0..20) {
        crash_points += crash_run(seed);
    }
    println!("{crash_points} crash points checked");
}

/// Members killed at random moments while the volume runs (background back end): with up to m
/// gone every operation goes on and the tree is the model's, through a remount that leaves the
/// dead members out as stale; one more stops the volume with an error that names the array.
#[test]
fn members_killed_while_running_lose_nothing_up_to_the_parity() {
    for seed in seeds(100..106) {
        let devices = array_volume(false);
        let mut rng = rng(seed);
        let mut driver = Driver::new(ARRAY_WORKLOAD);
        let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
        let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
        let victims = two_distinct_slots(&mut rng);
        let kill_at = [rng.gen_range(0..150), rng.gen_range(0..150)];
        for step in 0..150 {
            for (victim, _) in kill_at.iter().enumerate().filter(|(_, &at)| at == step) {
                devices[victims[victim]].inject(Fault::always(FaultOperation::Any));
            }
            driver.step(&fs, &mut rng).unwrap_or_else(|error| panic!("seed {seed} step {step}: {error}"));
            if step % 20 == 0 {
                fs.sync().unwrap();
            }
        }
        fs.sync().unwrap();
        let back = read_back(&fs).unwrap();
        assert!(same_tree(&back, &driver.model), "seed {seed}: {}", first_difference(&driver.model, &back));
        fs.unmount().unwrap_or_else(|error| panic!("seed {seed}: unmount: {error}"));
        // The array closes (clean, the killed slots marked) when its last holder goes: before
        // the members are assembled again.
        drop(fs);
        for device in &devices {
            device.clear_faults();
        }
        // The killed members are stale now: left out, and the volume reads the same.
        let assembly = assemble(&devices, &[]);
        let mut missing = assembly.device.missing_slots();
        missing.sort_unstable();
        let mut expected = victims.clone();
        expected.sort_unstable();
        assert_eq!(missing, expected, "seed {seed}: {:?}", assembly.notes);
        let device: Arc<dyn Device> = Arc::new(assembly.device);
        let report = check_with_key(device.clone(), None);
        assert!(report.is_clean(), "seed {seed}: fsck: {:#?}", report.problems);
        let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
        let back = read_back(&fs).unwrap();
        assert!(
            same_tree(&back, &driver.model),
            "seed {seed} after remount: {}",
            first_difference(&driver.model, &back)
        );
        // One member more than the parity: the volume stops, and says why.
        let third = (0..MEMBER_COUNT).find(|slot| !victims.contains(slot)).unwrap();
        devices[third].inject(Fault::always(FaultOperation::Any));
        let mut stopped = None;
        for step in 0..200 {
            let outcome = driver.step(&fs, &mut rng).and_then(|()| fs.sync());
            if let Err(error) = outcome {
                stopped = Some(error);
                break;
            }
            assert!(step < 199, "seed {seed}: the volume kept going with 3 of 4 members gone");
        }
        let failure = fs.failure().map(|reason| reason.to_string()).unwrap_or_default();
        let stopped = stopped.unwrap().to_string();
        assert!(
            failure.contains("covers at most 2") || stopped.contains("covers at most 2"),
            "seed {seed}: stopped with {stopped:?}, failure {failure:?}"
        );
        let _ = fs.unmount();
    }
}

/// Offsets in `bytes` where `pattern` starts, at 4 KiB boundaries (data units are aligned).
fn block_occurrences(bytes: &[u8], pattern: &[u8]) -> Vec<usize> {
    (0..bytes.len().saturating_sub(pattern.len()))
        .step_by(4096)
        .filter(|offset| &bytes[*offset..*offset + pattern.len()] == pattern)
        .collect()
}

/// A file's data block damaged on one member (its checksum fails) is read back right through
/// the file system: the volume asks the array to rebuild it from the other members, checks the
/// result against the block's checksum, and the array rewrites the damaged copy. Without the
/// array's redundancy the same damage is EIO (`tests/data_checksums.rs`).
#[test]
fn a_damaged_data_block_reads_back_right_and_is_rewritten() {
    let (devices, data, file) = array_with_one_file(0x5e1f);

    // Every copy of the file's second block (its home, and any left in the log's data ring)
    // gets one byte flipped; each lies in its own stripe, on one member.
    let block = &data[4096..2 * 4096];
    let damaged = damage_copies(&devices, block);
    assert!(damaged >= 1, "the file's block was found on a member");

    // A read-only mount writes nothing, so it does not heal: the read is the checksum's error.
    let before: Vec<Vec<u8>> = devices.iter().map(MemoryDevice::to_bytes).collect();
    let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device, &read_only).unwrap();
    let mut back = vec![0u8; data.len()];
    assert!(fs.read(file.inode, 0, &mut back).unwrap_err().is_corruption());
    fs.unmount().unwrap();
    drop(fs);
    assert!(devices.iter().zip(&before).all(|(member, bytes)| member.to_bytes() == *bytes));

    let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(fs.read(file.inode, 0, &mut back).unwrap(), data.len());
    assert!(back == data, "the damaged block read back wrong");
    assert!(fs.data_checksum_statistics().healed_blocks >= 1);
    fs.unmount().unwrap();
    drop(fs);
    // The home copy is whole again on its member (a copy left in the log's ring is not read).
    let whole = devices.iter().any(|member| !block_occurrences(&member.to_bytes(), block).is_empty());
    assert!(whole, "the damaged copy was rewritten on its member");
}

/// Flips a byte of every 4 KiB-aligned copy of `block` on every member; returns how many.
fn damage_copies(devices: &[MemoryDevice], block: &[u8]) -> usize {
    let mut damaged = 0;
    for member in devices {
        for offset in block_occurrences(&member.to_bytes(), block) {
            member.write_at(offset as u64 + 2000, &[block[2000] ^ 0x01]).unwrap();
            damaged += 1;
        }
    }
    damaged
}

/// A metadata block damaged on one member (its trailer's checksum fails): the block holding
/// the root's inode record. The volume reads it through `Device::read_checked` with its
/// trailer and generation checks as the judge, so the array rebuilds it and the mount and the
/// lookups work; the damaged copy is rewritten.
#[test]
fn a_damaged_metadata_block_is_rebuilt_from_the_other_members() {
    let devices = array_volume(false);
    let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    fs.create(tandemfs::fs::ROOT_INODE, b"kept", tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let array = assemble(&devices, &[]).device;
    let superblock = tandemfs::block::superblock::Superblock::read_both(&array).unwrap().best;
    let mut block = vec![0u8; 4096];
    array.read_at(superblock.inode_table_start * 4096, &mut block).unwrap();
    drop(array);
    assert!(damage_copies(&devices, &block) >= 1, "the inode-table block was found on a member");

    let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    assert_eq!(fs.lookup(tandemfs::fs::ROOT_INODE, b"kept").unwrap().file_type, tandemfs::fs::FileType::Regular);
    assert!(fs.data_checksum_statistics().healed_blocks >= 1);
    fs.unmount().unwrap();
    drop(fs);
    let whole = devices.iter().any(|member| !block_occurrences(&member.to_bytes(), &block).is_empty());
    assert!(whole, "the damaged copy was rewritten on its member");
}

/// Where logical byte `offset` of the array lies: (member slot, member byte).
fn member_place(geometry: &array::Geometry, offset: u64) -> (usize, u64) {
    let stripe = offset / geometry.stripe_data_bytes();
    let within = offset % geometry.stripe_data_bytes();
    let shard = (within / geometry.stripe_unit_bytes) as usize;
    (geometry.slot(stripe, shard), geometry.member_offset(stripe, within % geometry.stripe_unit_bytes))
}

/// Silent corruption on one member of an encrypted array. The volume's checksums are over
/// plaintext and the array holds ciphertext, so the encrypted device must let the array try
/// its versions with a judge that decrypts each one (docs/RAID.md, *Self-healing reads*): the
/// file reads back right, the damaged ciphertext is rewritten on its member and the slot's
/// counters (what `tandem status` shows) count it. Then scrub, which compares ciphertext with
/// parity, finds and repairs new damage on the same member, and a read needs no healing after.
#[test]
fn a_damaged_block_of_an_encrypted_array_reads_back_right_and_scrub_repairs_it() {
    let secret = tandemfs::crypt::Secret::from_passphrase("members of a secret array".to_string()).unwrap();
    let encryption =
        tandemfs::crypt::Encryption { secret: secret.clone(), cost: tandemfs::crypt::KdfCost::for_tests() };
    let devices = array_volume_with(false, Some(encryption));
    let keyed = MountOptions { key: Some(secret.clone()), ..MountOptions::default() };
    let mut rng = rng(0xc1f3);
    let data: Vec<u8> = (0..32 * 4096).map(|_| rng.gen()).collect();
    let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
    let (fs, _) = FileSystem::mount(device, &keyed).unwrap();
    let file = fs.create(tandemfs::fs::ROOT_INODE, b"f", tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.write(file.inode, 0, &data).unwrap();
    fs.unmount().unwrap();
    drop(fs);

    // The plaintext is on no member; the decrypted view of the array says where each of the
    // file's blocks lies, and so which member holds its ciphertext.
    let array: Arc<ArrayDevice> = Arc::new(assemble(&devices, &[]).device);
    let geometry = array.geometry();
    let plain = tandemfs::crypt::unlock(array.clone(), Some(&secret)).unwrap();
    let mut image = vec![0u8; plain.size_bytes() as usize];
    plain.read_at(0, &mut image).unwrap();
    assert!(
        devices.iter().all(|member| block_occurrences(&member.to_bytes(), &data[..4096]).is_empty()),
        "the file is not stored in the clear"
    );
    drop((plain, array));
    let mut places: Vec<(usize, u64)> = Vec::new();
    for block in data.chunks(4096) {
        for offset in block_occurrences(&image, block) {
            places.push(member_place(&geometry, offset as u64));
        }
    }
    assert!(places.len() >= 32, "every block of the file was found");
    let slot = (0..MEMBER_COUNT).max_by_key(|slot| places.iter().filter(|place| place.0 == *slot).count()).unwrap();
    let damage_some = |rng: &mut rand::rngs::SmallRng| -> Vec<(u64, Vec<u8>)> {
        let mut damaged = Vec::new();
        for &(_, member_offset) in places.iter().filter(|place| place.0 == slot) {
            if rng.gen_bool(0.5) && damaged.len() < 8 {
                let mut good = vec![0u8; 4096];
                devices[slot].read_at(member_offset, &mut good).unwrap();
                let at = rng.gen_range(0..4096u64);
                devices[slot].write_at(member_offset + at, &[good[at as usize] ^ 0x5a]).unwrap();
                damaged.push((member_offset, good));
            }
        }
        damaged
    };
    let restored = |damaged: &[(u64, Vec<u8>)]| {
        damaged
            .iter()
            .filter(|(member_offset, good)| {
                let mut now = vec![0u8; 4096];
                devices[slot].read_at(*member_offset, &mut now).unwrap();
                now == *good
            })
            .count()
    };
    let damaged = damage_some(&mut rng);
    assert!(!damaged.is_empty() && restored(&damaged) == 0);

    let array: Arc<ArrayDevice> = Arc::new(assemble(&devices, &[]).device);
    let (fs, _) = FileSystem::mount(array.clone(), &keyed).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(fs.read(file.inode, 0, &mut back).unwrap(), data.len());
    assert!(back == data, "the damaged blocks read back wrong");
    let healed = fs.data_checksum_statistics().healed_blocks;
    assert!(healed >= 1, "nothing was healed");
    let statistics = array.statistics();
    assert_eq!(statistics.slots[slot].repaired_bytes, healed * 4096, "slot {slot}: {statistics:?}");
    assert_eq!(statistics.healed_bytes, healed * 4096);
    fs.unmount().unwrap();
    drop(fs);
    array.close().unwrap();
    drop(array);
    // Each block the read healed (its home copy; a copy in the log's ring is not read) is the
    // ciphertext it was on its member again.
    assert_eq!(restored(&damaged) as u64, healed, "the healed copies were rewritten");

    // Scrub compares ciphertext with parity: it places new damage on the member and repairs it.
    let damaged = damage_some(&mut rng);
    assert!(!damaged.is_empty() && restored(&damaged) == 0);
    let array = assemble(&devices, &[]).device;
    let report = array.scrub(true).unwrap();
    assert_eq!(report.mismatches.len(), damaged.len(), "{report:?}");
    assert!(report.mismatches.iter().all(|mismatch| mismatch.bad_slot == Some(slot) && mismatch.repaired));
    assert_eq!(array.statistics().slots[slot].repaired_bytes, damaged.len() as u64 * 4096);
    array.close().unwrap();
    drop(array);
    assert_eq!(restored(&damaged), damaged.len(), "scrub rewrote every damaged block");
    let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
    let (fs, _) = FileSystem::mount(device, &keyed).unwrap();
    assert_eq!(fs.read(file.inode, 0, &mut back).unwrap(), data.len());
    assert!(back == data);
    assert_eq!(fs.data_checksum_statistics().healed_blocks, 0, "scrub left nothing to heal");
    fs.unmount().unwrap();
}

/// The metadata counterpart on an encrypted array: the inode-table block holding the root's
/// record damaged on its member. The volume's trailer and generation checks judge the
/// decrypted versions, the mount and the lookup work, and the member holds the block's
/// ciphertext again.
#[test]
fn a_damaged_metadata_block_of_an_encrypted_array_is_rebuilt() {
    let secret = tandemfs::crypt::Secret::from_passphrase("metadata of a secret array".to_string()).unwrap();
    let encryption =
        tandemfs::crypt::Encryption { secret: secret.clone(), cost: tandemfs::crypt::KdfCost::for_tests() };
    let devices = array_volume_with(false, Some(encryption));
    let keyed = MountOptions { key: Some(secret), ..MountOptions::default() };
    let device: Arc<dyn Device> = Arc::new(assemble(&devices, &[]).device);
    let (fs, _) = FileSystem::mount(device, &keyed).unwrap();
    fs.create(tandemfs::fs::ROOT_INODE, b"kept", tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let array = assemble(&devices, &[]).device;
    let geometry = array.geometry();
    // The superblocks are plaintext: they say where the inode table lies.
    let superblock = tandemfs::block::superblock::Superblock::read_both(&array).unwrap().best;
    drop(array);
    let (slot, member_offset) = member_place(&geometry, superblock.inode_table_start * 4096);
    let mut good = vec![0u8; 4096];
    devices[slot].read_at(member_offset, &mut good).unwrap();
    assert!(good.iter().any(|&byte| byte != 0), "the root's inode block was written");
    devices[slot].write_at(member_offset + 3000, &[good[3000] ^ 0x10]).unwrap();

    let array: Arc<ArrayDevice> = Arc::new(assemble(&devices, &[]).device);
    let (fs, _) = FileSystem::mount(array.clone(), &keyed).unwrap();
    assert_eq!(fs.lookup(tandemfs::fs::ROOT_INODE, b"kept").unwrap().file_type, tandemfs::fs::FileType::Regular);
    assert!(fs.data_checksum_statistics().healed_blocks >= 1);
    assert!(array.statistics().slots[slot].repaired_bytes >= 4096);
    fs.unmount().unwrap();
    drop(fs);
    array.close().unwrap();
    drop(array);
    let mut now = vec![0u8; 4096];
    devices[slot].read_at(member_offset, &mut now).unwrap();
    assert!(now == good, "the damaged copy was rewritten on its member");
}

/// The back end's home writes of file data (`Device::write_held`) stay in the array's epoch
/// over the log's group commits while they leave stripes partial (docs/RAID.md, *Held home
/// writes*), and the write order that makes safe is: records durable first, their home bytes
/// whenever the array likes, all of them before a checkpoint's commit. Power lost while some
/// are held (every member dropping what was not flushed) loses nothing acknowledged: the mount
/// replays the records, and every file reads back. Fails without the holding (no chunk held).
#[test]
fn home_writes_held_over_log_flushes_are_replayed_after_a_crash() {
    let devices = array_volume(true);
    let array = Arc::new(assemble(&devices, &[]).device);
    let device: Arc<dyn Device> = array.clone();
    let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
    let mut rng = rng(0x4e1d);
    let mut files = Vec::new();
    for round in 0..6 {
        // A few 4 KiB files each round: too few blocks to fill a stripe (2 units of 16 KiB).
        for index in 0..3 {
            let name = format!("f{round}-{index}");
            let made = fs
                .create(tandemfs::fs::ROOT_INODE, name.as_bytes(), tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0)
                .unwrap();
            let data: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
            fs.write(made.inode, 0, &data).unwrap();
            files.push((name, data));
        }
        // The records durable (a group commit), then applied: their blocks go home, held.
        fs.sync().unwrap();
        fs.run_backend().unwrap();
    }
    // One more group commit with held home writes in the epoch.
    fs.create(tandemfs::fs::ROOT_INODE, b"last", tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.sync().unwrap();
    let held = array.statistics().epochs.held_chunks;
    assert!(held > 0, "no partial chunk was held over a log flush");
    let images: Vec<MemoryDevice> =
        devices.iter().enumerate().map(|(slot, member)| member.crash_image(slot as u64, CrashMode::DropAll)).collect();
    drop(fs);
    drop(array);
    let recovered: Arc<dyn Device> = Arc::new(assemble(&images, &[]).device);
    let (fs, report) = FileSystem::mount(recovered, &inline_options()).unwrap();
    assert!(report.records_replayed > 0, "the crash left nothing to replay");
    for (name, data) in &files {
        let found = fs.lookup(tandemfs::fs::ROOT_INODE, name.as_bytes()).unwrap();
        let mut back = vec![0u8; data.len()];
        assert_eq!(fs.read(found.inode, 0, &mut back).unwrap(), data.len(), "{name}");
        assert!(back == *data, "{name} read back wrong after the crash");
    }
    fs.lookup(tandemfs::fs::ROOT_INODE, b"last").unwrap();
    fs.unmount().unwrap();
}

/// The volume's checks run over an array opened writable (what `tandem scrub --repair` does)
/// rebuild what fails them from the other members and rewrite it: a file data block whose
/// CRC32C fails and a metadata block whose trailer fails, each damaged on one member. Opened
/// read-only (`tandem fsck`, scrub without --repair) the same check reports them and writes
/// nothing. Fails without the fsck overlay passing `read_checked` on and the data check
/// asking for it.
#[test]
fn the_volume_check_over_a_writable_array_heals_what_its_checksums_reject() {
    let (devices, data, file) = array_with_one_file(0x5c2b);
    let array = assemble(&devices, &[]).device;
    let superblock = tandemfs::block::superblock::Superblock::read_both(&array).unwrap().best;
    let mut table_block = vec![0u8; 4096];
    array.read_at(superblock.inode_table_start * 4096, &mut table_block).unwrap();
    drop(array);
    for (what, block) in [("file data", &data[4096..8192]), ("inode table", &table_block[..])] {
        assert!(damage_copies(&devices, block) >= 1, "the {what} block was found on a member");
        // Read-only: reported, nothing written.
        let before: Vec<Vec<u8>> = devices.iter().map(MemoryDevice::to_bytes).collect();
        let read_only: Vec<Member> = members_of(&devices)
            .into_iter()
            .map(|member| Member { name: member.name, device: Arc::new(ReadOnly(member.device)) })
            .collect();
        let array = Arc::new(array::assemble(read_only, accelerator()).unwrap().device);
        let report = check_with_key(array.clone(), None);
        assert!(!report.problems.is_empty() && report.healed_blocks == 0, "{what}: {report:#?}");
        if what == "file data" {
            assert_eq!(report.damaged_data_blocks, 1, "{report:#?}");
            let place = format!("inode {}: file offset 4096: data block", file.inode);
            assert!(report.problems.iter().any(|problem| problem.contains(&place)), "{report:#?}");
        }
        drop(array);
        assert!(devices.iter().zip(&before).all(|(member, bytes)| member.to_bytes() == *bytes));

        // Writable: rebuilt and rewritten, the check clean.
        let array = Arc::new(assemble(&devices, &[]).device);
        let report = check_with_key(array.clone(), None);
        assert!(report.problems.is_empty(), "{what}: {report:#?}");
        assert!(report.healed_blocks >= 1, "{what}: {report:#?}");
        assert!(array.statistics().healed_bytes >= 4096);
        array.close().unwrap();
        drop(array);
        let whole = devices.iter().any(|member| !block_occurrences(&member.to_bytes(), block).is_empty());
        assert!(whole, "the damaged {what} copy was not rewritten on its member");
    }
}

/// A member opened without write permission, as `tandem fsck` opens them.
struct ReadOnly(Arc<dyn Device>);

impl Device for ReadOnly {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> tandemfs::Result<()> {
        self.0.read_at(offset, buffer)
    }
    fn write_at(&self, offset: u64, _data: &[u8]) -> tandemfs::Result<()> {
        Err(tandemfs::Error::invalid(format!("write at {offset} to a read-only member")))
    }
    fn flush(&self) -> tandemfs::Result<()> {
        Ok(())
    }
    fn is_read_only(&self) -> bool {
        true
    }
    fn reachable_by_other_processes(&self) -> bool {
        false
    }
}
