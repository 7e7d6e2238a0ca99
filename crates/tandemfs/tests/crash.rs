//! The crash test: random operations (inserts and collapses of data at byte offsets among them)
//! with random syncs, back-end passes and checkpoints, the device failing at a random write
//! (everything after it lost), then a crash that drops or tears every unflushed write, or
//! keeps them all as a killed mount does. The remounted volume must pass fsck and hold exactly
//! the state after some prefix of the operations that includes everything acknowledged by
//! `sync` (an `insert` of data may also stop after its hole, before its bytes).
//! `TANDEM_SEED=n cargo test --test crash` reproduces one seed.

mod common;

use common::ops::{Driver, Workload};
use common::*;
use rand::Rng;
use std::sync::Arc;
use tandemfs::device::{CrashMode, Device, Fault, FaultOperation, MemoryDevice};
use tandemfs::{fsck, FileSystem};

const ROUNDS_PER_SEED: u64 = 10;

fn crash_run(seed: u64) -> u64 {
    crash_run_with(seed, None, None).0
}

/// `crash_run` on a volume encrypted under `key` when one is given; with `direct_min`, writes
/// of at least that many bytes go straight home (direct-write records) and the workload's
/// writes reach twice as far, so that about one write in six goes direct; under even seeds
/// those compute their checksums on a second thread during the home write
/// (`direct_write_overlap_min_bytes`), under odd ones after it.
/// Returns the crash points checked and the direct-write records logged.
fn crash_run_with(seed: u64, key: Option<tandemfs::crypt::Secret>, direct_min: Option<u64>) -> (u64, u64) {
    let mut options = tandemfs::fs::MountOptions { key: key.clone(), ..inline_options() };
    let mut write_bytes_max = 20_000;
    if let Some(direct_min) = direct_min {
        options.direct_write_min_bytes = direct_min;
        options.direct_write_overlap_min_bytes = if seed.is_multiple_of(2) { direct_min } else { 0 };
        write_bytes_max = 40_000;
        // Records stay unflushed until a sync, a pass or a checkpoint flushes them (not within
        // the flusher's 2 ms), so crashes find direct writes whose records are not durable.
        options.flush_delay_us = 10_000_000;
    }
    let (mut memory, _) = memory_volume_with(16 << 20, true, key.as_ref());
    let mut rng = rng(seed);
    let workload =
        Workload { names_per_directory: 12, write_bytes_max, file_bytes_max: 120_000, create_weight: 6, flat: false };
    let mut driver = Driver::new(workload);
    let (mut crash_points, mut direct_records) = (0, 0);
    for round in 0..ROUNDS_PER_SEED {
        let device: Arc<dyn Device> = Arc::new(memory.clone());
        let (fs, _) = FileSystem::mount(device, &options)
            .unwrap_or_else(|error| panic!("seed {seed} round {round}: mount: {error}"));
        let fault_after = rng.gen_range(1..300);
        memory.inject(Fault {
            operation: FaultOperation::Write,
            after_operations: fault_after,
            repeat: true,
            range: None,
        });
        // States the volume may come back in: from the last acknowledged sync onwards.
        let mut candidates = vec![driver.model.clone()];
        let operations = rng.gen_range(5..50);
        for _ in 0..operations {
            let outcome = match rng.gen_range(0..12) {
                0 => fs.sync().map(|()| {
                    candidates = vec![driver.model.clone()];
                }),
                1 => fs.run_backend(),
                2 => fs.checkpoint(),
                _ => {
                    let outcome = driver.step(&fs, &mut rng);
                    candidates.append(&mut driver.passed_through);
                    outcome.map(|()| candidates.push(driver.model.clone()))
                }
            };
            if outcome.is_err() {
                break;
            }
        }
        direct_records += fs.direct_write_records();
        drop(fs);
        // Mostly power loss (unflushed writes torn or lost); sometimes a killed mount, whose
        // writes all reach the medium, so that replay runs over every data block the back end
        // changed after the checkpoint.
        let mode = if rng.gen_bool(0.25) { CrashMode::KeepAll } else { CrashMode::Random };
        memory = memory.crash(rng.gen(), mode);
        crash_points += 1;
        let report = check_with_key(Arc::new(memory.clone()), key.as_ref());
        assert!(report.is_clean(), "seed {seed} round {round}: fsck after crash: {:#?}", report.problems);
        let device: Arc<dyn Device> = Arc::new(memory.clone());
        let (fs, _) = FileSystem::mount(device, &options)
            .unwrap_or_else(|error| panic!("seed {seed} round {round}: mount after crash: {error}"));
        let back = read_back(&fs).unwrap_or_else(|error| panic!("seed {seed} round {round}: read back: {error}"));
        let Some(found) = candidates.iter().rposition(|candidate| same_tree(candidate, &back)) else {
            panic!(
                "seed {seed} round {round}: the volume matches none of {} acceptable states; against the acknowledged one: {}",
                candidates.len(),
                first_difference(&candidates[0], &back)
            );
        };
        driver.model = candidates[found].clone();
        drop(fs);
        // The mount above wrote and flushed its replay; carry on from this image.
        memory = memory.crash(rng.gen(), CrashMode::KeepAll);
    }
    (crash_points, direct_records)
}

#[test]
fn crashes_lose_nothing_acknowledged() {
    let seeds = seeds(0..110);
    let mut crash_points = 0;
    for seed in seeds {
        crash_points += crash_run(seed);
    }
    println!("{crash_points} crash points checked");
}

#[test]
fn crashes_lose_nothing_acknowledged_encrypted() {
    // The same on an encrypted volume, fewer seeds: torn writes of whole encrypted blocks
    // (read-modify-write of the log's partial blocks) must lose nothing acknowledged either.
    let mut crash_points = 0;
    for seed in seeds(1000..1030) {
        crash_points += crash_run_with(seed, Some(test_secret()), None).0;
    }
    println!("{crash_points} crash points checked");
}

/// Large writes straight home mixed with small logged ones: a direct write's bytes go to fresh
/// blocks and are flushed before its record is logged, so a crash between the data write, its
/// flush and the record (the device failing at any of them, unflushed writes torn or dropped)
/// keeps a prefix of the records, each mapping durable bytes whose checksums match. Fails when
/// the record can outlive its data (no flush before the append: a torn crash keeps the record
/// and loses the blocks), and when replay hands a direct write's blocks to an earlier record.
#[test]
fn crashes_with_direct_writes_lose_nothing_acknowledged() {
    let (mut crash_points, mut direct_records) = (0, 0);
    for seed in seeds(2000..2030) {
        let (points, records) = crash_run_with(seed, None, Some(6000));
        (crash_points, direct_records) = (crash_points + points, direct_records + records);
    }
    assert!(direct_records > 0, "no write went straight home");
    println!("{crash_points} crash points checked, {direct_records} direct writes");
}

/// The same on an encrypted volume: the direct blocks go through the encrypting device.
#[test]
fn crashes_with_direct_writes_lose_nothing_acknowledged_encrypted() {
    let (mut crash_points, mut direct_records) = (0, 0);
    for seed in seeds(3000..3010) {
        let (points, records) = crash_run_with(seed, Some(test_secret()), Some(6000));
        (crash_points, direct_records) = (crash_points + points, direct_records + records);
    }
    assert!(direct_records > 0, "no write went straight home");
    println!("{crash_points} crash points checked, {direct_records} direct writes");
}

/// Finding 10 of issue 13: an insert of data inside a block, applied by the back end and then
/// replayed after a crash without a checkpoint, must give the same bytes as before the crash.
/// Replay applies the insert over data blocks that the first application already changed.
#[test]
fn applied_insert_of_data_replays_to_the_same_bytes() {
    let (memory, _) = memory_volume(16 << 20, true);
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
    let file = fs.create(tandemfs::fs::ROOT_INODE, b"f", tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).unwrap();
    let old: Vec<u8> = (0..16 * 1024).map(|index| (index % 251) as u8).collect();
    assert_eq!(fs.write(file.inode, 0, &old).unwrap(), old.len());
    fs.checkpoint().unwrap();
    fs.insert(file.inode, 5000, &[0xEE; 100]).unwrap();
    fs.fsync(file.inode, false).unwrap();
    fs.run_backend().unwrap();
    let mut expected = old.clone();
    expected.splice(5000..5000, [0xEE; 100]);
    // A killed mount: every write it issued reached the medium, but no checkpoint followed.
    let survivor = memory.crash(1, CrashMode::KeepAll);
    drop(fs);
    let device: Arc<dyn Device> = Arc::new(survivor.clone());
    let (fs, report) = FileSystem::mount(device, &inline_options()).unwrap();
    assert!(report.records_replayed > 0, "the insert must be replayed, not checkpointed");
    let mut back = vec![0u8; expected.len() + 10];
    assert_eq!(fs.read(file.inode, 0, &mut back).unwrap(), expected.len());
    back.truncate(expected.len());
    let wrong = back.iter().zip(&expected).filter(|(got, want)| got != want).count();
    assert_eq!(
        wrong,
        0,
        "{wrong} bytes differ after replay; first at {:?}",
        back.iter().zip(&expected).position(|(got, want)| got != want)
    );
    drop(fs);
    let report = fsck::check(Arc::new(survivor)).unwrap();
    assert!(report.is_clean(), "fsck after replay: {:#?}", report.problems);
}

/// The same with cuts that copy (a file with room to spare, docs/EXTENTS.md *Shared blocks*):
/// inserts inside blocks copy the left part's bytes into new blocks, later records write over
/// those bytes and over the right parts in place, and a collapse cuts again; replay copies from
/// blocks the first application already changed, and must still give the same bytes.
#[test]
fn applied_copying_cuts_replay_to_the_same_bytes() {
    let (memory, _) = memory_volume(16 << 20, true);
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
    let file = fs.create(tandemfs::fs::ROOT_INODE, b"f", tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).unwrap();
    let mut expected: Vec<u8> = (0..256 * 1024).map(|index| (index % 251) as u8).collect();
    assert_eq!(fs.write(file.inode, 0, &expected).unwrap(), expected.len());
    fs.checkpoint().unwrap();
    let edits: [(u64, &[u8]); 3] = [(5000, &[0xEE; 100]), (70_001, &[0xDD; 3000]), (9000, &[0xCC; 10])];
    for (offset, bytes) in edits {
        fs.insert(file.inode, offset, bytes).unwrap();
        expected.splice(offset as usize..offset as usize, bytes.iter().copied());
    }
    // In place over copied left parts and over the right parts that kept their blocks.
    for (offset, fill) in [(4100u64, 0x11u8), (5050, 0x22), (69_990, 0x33), (73_050, 0x44)] {
        assert_eq!(fs.write(file.inode, offset, &[fill; 120]).unwrap(), 120);
        expected[offset as usize..offset as usize + 120].fill(fill);
    }
    fs.collapse_range(file.inode, 4500, 700).unwrap();
    expected.drain(4500..5200);
    // A killed mount: every write it issued reached the medium, but no checkpoint followed.
    let (fs, survivor) = crash_and_replay(fs, &memory, file.inode, &expected, 1, CrashMode::KeepAll);
    drop(fs);
    assert_clean_after_replay(survivor, 1);
}

/// One step of the byte-granular workloads below: a collapse of up to 300 bytes one time in
/// five, else an insert of 100 bytes, at a random byte of the file, mirrored in `model`.
fn insert_or_collapse(fs: &FileSystem, inode: u64, rng: &mut rand::rngs::SmallRng, model: &mut Vec<u8>) {
    let offset = rng.gen_range(0..=model.len());
    if rng.gen_range(0..5) == 0 && offset < model.len() {
        let length = rng.gen_range(1..=300).min(model.len() - offset);
        fs.collapse_range(inode, offset as u64, length as u64).unwrap();
        model.drain(offset..offset + length);
    } else {
        let bytes = pattern(rng, 100);
        fs.insert(inode, offset as u64, &bytes).unwrap();
        model.splice(offset..offset, bytes);
    }
}

/// Makes the file durable, applies everything, crashes the medium after the last flush (`mode`
/// says whether later writes reached it), mounts what survived and checks that replay gives the
/// file exactly `model`. Returns the remounted volume and the surviving medium.
fn crash_and_replay(
    fs: FileSystem,
    memory: &MemoryDevice,
    inode: u64,
    model: &[u8],
    seed: u64,
    mode: CrashMode,
) -> (FileSystem, MemoryDevice) {
    fs.fsync(inode, false).unwrap();
    fs.run_backend().unwrap();
    let survivor = memory.crash(seed, mode);
    drop(fs);
    let device: Arc<dyn Device> = Arc::new(survivor.clone());
    let (fs, report) = FileSystem::mount(device, &inline_options()).unwrap();
    assert!(report.records_replayed > 0, "seed {seed}: the crash must leave records to replay");
    let mut back = vec![0u8; model.len() + 1];
    assert_eq!(fs.read(inode, 0, &mut back).unwrap(), model.len(), "seed {seed}: length");
    let wrong = back.iter().zip(model).filter(|(got, want)| got != want).count();
    assert_eq!(wrong, 0, "seed {seed} {mode:?}: {wrong} bytes differ after replay");
    (fs, survivor)
}

/// A 64 MiB memory volume holding one file `name` of `file_bytes` seeded bytes, written in 1 MiB
/// pieces and checkpointed: where the at-scale crash tests start. Returns the medium, the mount,
/// the file's inode, the generator (to go on drawing from) and the file's bytes.
fn file_at_scale(
    seed: u64,
    name: &[u8],
    file_bytes: usize,
) -> (MemoryDevice, FileSystem, u64, rand::rngs::SmallRng, Vec<u8>) {
    let (memory, _) = memory_volume(64 << 20, true);
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
    let file = fs.create(tandemfs::fs::ROOT_INODE, name, tandemfs::fs::FileType::Regular, 0o644, 0, 0, 0).unwrap();
    let mut rng = rng(seed);
    let model = pattern(&mut rng, file_bytes);
    for (index, chunk) in model.chunks(1 << 20).enumerate() {
        assert_eq!(fs.write(file.inode, (index << 20) as u64, chunk).unwrap(), chunk.len());
    }
    fs.checkpoint().unwrap();
    (memory, fs, file.inode, rng, model)
}

/// fsck of the medium that survived a crash and its replay must find it clean.
fn assert_clean_after_replay(survivor: MemoryDevice, seed: u64) {
    let report = fsck::check(Arc::new(survivor)).unwrap();
    assert!(report.is_clean(), "seed {seed}: fsck after replay: {:#?}", report.problems);
}

/// Issue 13's check at scale, made small: thousands of inserts of bytes (and some collapses)
/// at byte offsets of a file of a few MiB, the back end applying and checkpointing as it goes,
/// then a crash right after the last fsync. Every byte must come back. `mode` chooses whether
/// the writes the dead mount issued after its last flush reached the medium.
fn inserts_at_scale(seed: u64, mode: CrashMode) {
    const FILE_BYTES: usize = 3 << 20;
    const OPERATIONS: usize = 3000;
    let (memory, fs, inode, mut rng, mut model) = file_at_scale(seed, b"big", FILE_BYTES);
    for operation in 0..OPERATIONS {
        insert_or_collapse(&fs, inode, &mut rng, &mut model);
        // The back end applies in batches and checkpoints now and then, as a mount does.
        if operation % 64 == 63 {
            fs.run_backend().unwrap();
        }
        if operation % 1000 == 500 {
            fs.checkpoint().unwrap();
        }
    }
    let (fs, survivor) = crash_and_replay(fs, &memory, inode, &model, seed, mode);
    drop(fs);
    assert_clean_after_replay(survivor, seed);
}

#[test]
fn thousands_of_inserts_replay_to_the_same_bytes() {
    inserts_at_scale(1, CrashMode::KeepAll);
    inserts_at_scale(2, CrashMode::Random);
}

/// File data goes home when a record is applied, not through the log, so a checkpoint must
/// make it durable before its commit record can reach the medium: a crash may keep an
/// unflushed commit record (the writes before a flush reach the medium in any order) and drop
/// the data, and the mount that finds the commit replays nothing it covers. Here the flushes
/// fail from the checkpoint's first one on, or from its second, and the crash keeps, drops or
/// tears each unflushed write by its seed: the symbolic link's target (a data block written
/// by its create, synced before) must read back, and fsck must be clean. `crash_threads` met
/// it about once in 4,000 seeds as "data block N: checksum ... stored, 0x98f94189 computed"
/// (a zero block); without the flush before the commit this test fails at seed 26.
#[test]
fn a_checkpoint_commit_never_outlives_the_data_it_covers() {
    use tandemfs::fs::{FileType, ROOT_INODE};
    let mut commits_kept = 0;
    // No checkpoint may come between the apply and the fault: on the 16-core GPU host, with
    // other tests beside it, the first iteration found nothing unflushed after the apply, as a
    // pass past the default interval (5 s from the mount) would, which checkpoints and flushes.
    let options = tandemfs::fs::MountOptions {
        checkpoint_interval_ms: tandemfs::fs::types::CHECKPOINT_INTERVAL_MS_MAX,
        ..inline_options()
    };
    for seed in seeds(0..40) {
        for flushes_before_fault in [0, 1] {
            let what = format!("seed {seed}, {flushes_before_fault} flushes before the fault");
            let (memory, device) = memory_volume(64 << 20, true);
            let (fs, _) = FileSystem::mount(device, &options).unwrap();
            let link = fs.symlink(ROOT_INODE, b"link", b"the-target", 0, 0).unwrap().inode;
            fs.sync().unwrap();
            fs.run_backend().unwrap();
            assert!(memory.unflushed_write_count() > 0, "{what}: the create's data is not at risk");
            memory.inject(Fault {
                operation: FaultOperation::Flush,
                after_operations: flushes_before_fault,
                repeat: true,
                range: None,
            });
            assert!(fs.checkpoint().is_err(), "{what}: a checkpoint whose flushes fail");
            let survivor = memory.crash(seed, CrashMode::Random);
            let _ = fs.unmount();
            let report = fsck::check(Arc::new(survivor.clone())).unwrap();
            assert!(report.is_clean(), "{what}: fsck after the crash: {:#?}", report.problems);
            let (fs, mounted) = FileSystem::mount(Arc::new(survivor), &inline_options()).unwrap();
            commits_kept += u64::from(mounted.checkpoint_completed);
            let found = fs.lookup(ROOT_INODE, b"link").unwrap();
            assert_eq!((found.inode, found.file_type), (link, FileType::Symlink), "{what}");
            assert_eq!(fs.read_link(link).unwrap(), b"the-target", "{what}");
            fs.unmount().unwrap();
        }
    }
    assert!(commits_kept > 0, "no crash kept a checkpoint's commit: the completion at mount went untested");
}

/// Compaction (`FileSystem::defrag`) under replay: inserts of 100 bytes and collapses at byte
/// offsets fragment a file, a defrag rewrites it into whole blocks in the middle of the run
/// (later inserts and collapses then cut the compacted extents) and another at the end, and
/// the crash comes after the last fsync with everything since the checkpoint to replay. Every
/// byte must come back, the compactions must have brought the space held within 1.2× of the
/// bytes, and fsck must be clean. Fails if a compaction read bytes that a later record changed,
/// or freed blocks it still maps.
fn compaction_at_scale(seed: u64, mode: CrashMode) {
    const FILE_BYTES: usize = 1 << 20;
    const OPERATIONS: usize = 2000;
    let (memory, fs, inode, mut rng, mut model) = file_at_scale(seed, b"big", FILE_BYTES);
    let mut compactions = 0;
    for operation in 0..OPERATIONS {
        insert_or_collapse(&fs, inode, &mut rng, &mut model);
        if operation % 64 == 63 {
            fs.run_backend().unwrap();
        }
        if operation == 300 {
            fs.checkpoint().unwrap();
        }
        if operation == 1200 || operation + 1 == OPERATIONS {
            // Inserts pack and cuts copy nothing (format version 8), so the file stays within
            // about 1.1x; factor 1.0 compacts every run that holds more blocks than it needs.
            let report = fs.defrag(inode, 1.0).unwrap();
            assert!(report.before.amplification() > 1.0, "seed {seed}: fragmented: {report:?}");
            assert!(report.records > 0 && report.after.amplification() <= 1.2, "seed {seed}: {report:?}");
            assert_eq!(report.after.mapped_bytes, model.len() as u64, "seed {seed}");
            compactions += 1;
        }
    }
    assert_eq!(compactions, 2);
    let (fs, survivor) = crash_and_replay(fs, &memory, inode, &model, seed, mode);
    assert!(fs.space_use(inode).unwrap().amplification() <= 1.2, "seed {seed}: replayed compaction");
    fs.unmount().unwrap();
    drop(fs);
    assert_clean_after_replay(survivor, seed);
}

#[test]
fn background_compaction_replays_to_the_same_bytes() {
    background_compaction_at_scale(5, CrashMode::KeepAll);
    background_compaction_at_scale(6, CrashMode::Random);
}

/// Background compaction (`FileSystem::compaction_pass`, which the compactor thread runs) under
/// replay: a 1 MiB file fragmented by collapses inside blocks and split by punched holes into
/// pieces that take several passes, inserts and collapses between the passes, and a crash after
/// the first or second pass that logged records, so that records of the sweep are applied and
/// others never logged, all after the last checkpoint. Replay must give every byte, and fsck
/// must be clean.
fn background_compaction_at_scale(seed: u64, mode: CrashMode) {
    const FILE_BYTES: usize = 1 << 20;
    let (memory, fs, inode, mut rng, mut model) = file_at_scale(seed, b"background", FILE_BYTES);
    for k in (1..=200usize).rev() {
        let offset = k * 4096 + rng.gen_range(100..600);
        fs.collapse_range(inode, offset as u64, 3000).unwrap();
        model.drain(offset..offset + 3000);
        if k == 100 {
            fs.run_backend().unwrap();
            fs.checkpoint().unwrap();
        }
    }
    // Holes end compaction runs: a piece each between them.
    for hole in 1..12usize {
        let offset = hole * 40_000;
        fs.punch_hole(inode, offset as u64, 5000).unwrap();
        model[offset..offset + 5000].fill(0);
    }
    fs.run_backend().unwrap();
    let crash_after = 1 + seed % 2;
    let mut logged_passes = 0;
    // Bounded: each pass walks at most a few thousand extents of a file of a few hundred.
    for _ in 0..1000 {
        match fs.compaction_pass().unwrap() {
            tandemfs::fs::CompactionPass::Idle => break,
            tandemfs::fs::CompactionPass::Deferred => {}
            tandemfs::fs::CompactionPass::Worked { records } => {
                if records > 0 {
                    logged_passes += 1;
                    insert_or_collapse(&fs, inode, &mut rng, &mut model);
                }
            }
        }
        fs.run_backend().unwrap();
        if logged_passes == crash_after {
            break;
        }
    }
    let statistics = fs.compaction_statistics();
    assert_eq!(logged_passes, crash_after, "seed {seed}: {statistics:?}");
    assert!(statistics.records > crash_after, "seed {seed}: several records a pass: {statistics:?}");
    let (fs, survivor) = crash_and_replay(fs, &memory, inode, &model, seed, mode);
    fs.unmount().unwrap();
    drop(fs);
    assert_clean_after_replay(survivor, seed);
}

/// Shared blocks under replay (format version 8): inserts of 1 to 200 bytes cut extents inside
/// blocks without copying (both parts reference the block) and pack into shared blocks;
/// collapses of up to 400 bytes, punches and overwrites at byte offsets then drop references
/// one by one, and at the end the file is collapsed down to a few hundred bytes, so nearly every
/// shared block goes with its last reference, all after the last checkpoint. The replayed file
/// must hold exactly the model, hold few blocks (a block kept past its last reference would
/// show), and fsck must be clean (it counts every block's references against the generation
/// table's). Fails if a block is freed at its first reference (replay reads freed bytes, or
/// fsck finds the block owned and free) or kept past its last (fsck: a leak).
fn shared_blocks_at_scale(seed: u64, mode: CrashMode) {
    const FILE_BYTES: usize = 256 << 10;
    const OPERATIONS: usize = 2000;
    let (memory, fs, inode, mut rng, mut model) = file_at_scale(seed, b"shared", FILE_BYTES);
    for operation in 0..OPERATIONS {
        let offset = rng.gen_range(0..=model.len());
        match rng.gen_range(0..10) {
            0..=5 => {
                let length = rng.gen_range(1..=200);
                let bytes = pattern(&mut rng, length);
                fs.insert(inode, offset as u64, &bytes).unwrap();
                model.splice(offset..offset, bytes);
            }
            6 | 7 if offset < model.len() => {
                let length = rng.gen_range(1..=400).min(model.len() - offset);
                fs.collapse_range(inode, offset as u64, length as u64).unwrap();
                model.drain(offset..offset + length);
            }
            8 if offset < model.len() => {
                let length = rng.gen_range(1..=5000).min(model.len() - offset);
                fs.punch_hole(inode, offset as u64, length as u64).unwrap();
                model[offset..offset + length].fill(0);
            }
            _ if offset < model.len() => {
                let length = rng.gen_range(1..=300).min(model.len() - offset);
                let bytes = pattern(&mut rng, length);
                assert_eq!(fs.write(inode, offset as u64, &bytes).unwrap(), bytes.len());
                model[offset..offset + bytes.len()].copy_from_slice(&bytes);
            }
            _ => {}
        }
        if operation % 64 == 63 {
            fs.run_backend().unwrap();
        }
        if operation == 700 {
            fs.checkpoint().unwrap();
        }
    }
    fs.run_backend().unwrap();
    let shared = fs.space_use(inode).unwrap();
    // About 1,200 inserts: a block each (as before version 8) would hold far more.
    assert!(shared.data_blocks < 300, "seed {seed}: cuts and packs share blocks: {shared:?}");
    // Collapse the file down to a few hundred bytes, a piece at a time.
    while model.len() > 500 {
        let offset = rng.gen_range(0..model.len() - 400);
        let length = rng.gen_range(1..=20_000).min(model.len() - 400 - offset).max(1);
        fs.collapse_range(inode, offset as u64, length as u64).unwrap();
        model.drain(offset..offset + length);
    }
    let (fs, survivor) = crash_and_replay(fs, &memory, inode, &model, seed, mode);
    let left = fs.space_use(inode).unwrap();
    assert!(left.data_blocks <= 4, "seed {seed}: blocks kept past their last reference: {left:?}");
    fs.unmount().unwrap();
    drop(fs);
    assert_clean_after_replay(survivor, seed);
}

#[test]
fn shared_blocks_replay_and_go_with_their_last_reference() {
    shared_blocks_at_scale(5, CrashMode::KeepAll);
    shared_blocks_at_scale(6, CrashMode::Random);
}

/// The back end applies the data records of one file in a row through one open tree and
/// commits them once (`Applier::apply_in_run`); replay applies them one by one. Two files of
/// 256 KiB get streaks of inserts of data, collapses, punches and overwrites at byte offsets
/// (the runs end where the file changes, and at a zero range, which is not applied in runs),
/// with the back end applying every 64 operations and a checkpoint in the middle (so that it
/// holds what runs left); a crash after the last fsync replays everything since. Both files
/// must come back byte for byte, and fsck must be clean. Fails if the back end applied no runs
/// of several records (`data_runs`).
fn data_runs_at_scale(seed: u64, mode: CrashMode) {
    use tandemfs::fs::{FileType, ROOT_INODE};
    // One apply worker: every batch applies with the volume held, where runs are made (the
    // parallel workers apply records one by one), whichever files it holds.
    let (memory, _) = memory_volume(64 << 20, true);
    let options = tandemfs::fs::MountOptions { backend_workers: 1, ..inline_options() };
    let (fs, _) = FileSystem::mount(Arc::new(memory.clone()), &options).unwrap();
    let mut rng = rng(seed);
    let mut file = |name: &[u8]| {
        let inode = fs.create(ROOT_INODE, name, FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
        let model = pattern(&mut rng, 256 << 10);
        assert_eq!(fs.write(inode, 0, &model).unwrap(), model.len());
        (inode, model)
    };
    let mut files = [file(b"first"), file(b"second")];
    fs.checkpoint().unwrap();
    let runs_before = fs.backend_statistics().data_runs;
    let mut data_records = 0u64;
    for operation in 0..1500 {
        let (inode, model) = &mut files[(operation / 7) % 2];
        let offset = rng.gen_range(0..=model.len());
        match rng.gen_range(0..12) {
            0..=5 => {
                let length = rng.gen_range(1..=3000);
                let bytes = pattern(&mut rng, length);
                fs.insert(*inode, offset as u64, &bytes).unwrap();
                model.splice(offset..offset, bytes);
                // One insert-of-data record (format version 10).
                data_records += 1;
            }
            6 | 7 if offset < model.len() => {
                let length = rng.gen_range(1..=3000).min(model.len() - offset);
                fs.collapse_range(*inode, offset as u64, length as u64).unwrap();
                model.drain(offset..offset + length);
                data_records += 1;
            }
            8 if offset < model.len() => {
                let length = rng.gen_range(1..=6000).min(model.len() - offset);
                fs.punch_hole(*inode, offset as u64, length as u64).unwrap();
                model[offset..offset + length].fill(0);
                data_records += 1;
            }
            9 if offset < model.len() => {
                let length = rng.gen_range(1..=6000).min(model.len() - offset);
                fs.zero_range(*inode, offset as u64, length as u64, true).unwrap();
                model[offset..offset + length].fill(0);
            }
            _ if offset < model.len() => {
                let length = rng.gen_range(1..=500);
                let bytes = pattern(&mut rng, length);
                assert_eq!(fs.write(*inode, offset as u64, &bytes).unwrap(), bytes.len());
                let end = (offset + bytes.len()).min(model.len());
                model[offset..end].copy_from_slice(&bytes[..end - offset]);
                model.extend_from_slice(&bytes[end - offset..]);
                data_records += 1;
            }
            _ => {}
        }
        if operation % 64 == 63 {
            fs.run_backend().unwrap();
        }
        if operation == 700 {
            fs.checkpoint().unwrap();
        }
    }
    fs.fsync(files[0].0, false).unwrap();
    fs.run_backend().unwrap();
    let runs = fs.backend_statistics().data_runs - runs_before;
    println!("seed {seed}: {runs} data runs for {data_records} data records");
    // Streaks of 7 operations, about 9 data records each, cut at every 32 records of a batch
    // and at zero ranges: runs hold several records each.
    assert!(runs > 0 && runs * 3 < data_records, "seed {seed}: {runs} runs for {data_records} data records");
    let [(first, first_model), (second, second_model)] = files;
    let (fs, survivor) = crash_and_replay(fs, &memory, first, &first_model, seed, mode);
    let mut back = vec![0u8; second_model.len() + 1];
    assert_eq!(fs.read(second, 0, &mut back).unwrap(), second_model.len(), "seed {seed}: second length");
    assert!(back[..second_model.len()] == second_model[..], "seed {seed} {mode:?}: the second file differs");
    fs.unmount().unwrap();
    drop(fs);
    assert_clean_after_replay(survivor, seed);
}

#[test]
fn data_runs_replay_to_the_same_bytes() {
    data_runs_at_scale(7, CrashMode::KeepAll);
    data_runs_at_scale(8, CrashMode::Random);
}

/// Inserts of data as one record each (format version 10) and as a hole and a write into it
/// (how a version-9 build logged them, which replay of an older volume's log meets), mixed with
/// collapses and overwrites at byte offsets of a 256 KiB file, some applied and some not, a
/// checkpoint in the middle; crash after the last fsync: replay gives every byte back and fsck
/// is clean. Each `insert` must be one record (the lsn moves by one). Fails when an insert
/// record is replayed as a write over the file's bytes, or when it applies its bytes anywhere
/// but at its offset.
#[test]
fn inserts_of_data_in_one_record_replay_to_the_same_bytes() {
    for (seed, mode) in [(5, CrashMode::KeepAll), (6, CrashMode::Random)] {
        inserts_of_data_at_scale(seed, mode);
    }
}

fn inserts_of_data_at_scale(seed: u64, mode: CrashMode) {
    let (memory, fs, inode, mut rng, mut model) = file_at_scale(seed, b"inserted", 256 << 10);
    let (mut one_record, mut two_records) = (0, 0);
    for operation in 0..1200 {
        let offset = rng.gen_range(0..=model.len());
        match rng.gen_range(0..10) {
            0..=3 => {
                let length = rng.gen_range(1..=3000);
                let bytes = pattern(&mut rng, length);
                let before = fs.log_statistics().next_lsn;
                fs.insert(inode, offset as u64, &bytes).unwrap();
                assert_eq!(fs.log_statistics().next_lsn, before + 1, "seed {seed}: an insert is one record");
                model.splice(offset..offset, bytes);
                one_record += 1;
            }
            4..=6 => {
                let length = rng.gen_range(1..=3000);
                let bytes = pattern(&mut rng, length);
                fs.insert_range(inode, offset as u64, bytes.len() as u64).unwrap();
                assert_eq!(fs.write(inode, offset as u64, &bytes).unwrap(), bytes.len());
                model.splice(offset..offset, bytes);
                two_records += 1;
            }
            7 | 8 if offset < model.len() => {
                let length = rng.gen_range(1..=3000).min(model.len() - offset);
                fs.collapse_range(inode, offset as u64, length as u64).unwrap();
                model.drain(offset..offset + length);
            }
            _ if offset < model.len() => {
                let length = rng.gen_range(1..=300).min(model.len() - offset);
                let bytes = pattern(&mut rng, length);
                assert_eq!(fs.write(inode, offset as u64, &bytes).unwrap(), bytes.len());
                model[offset..offset + bytes.len()].copy_from_slice(&bytes);
            }
            _ => {}
        }
        if operation % 50 == 49 {
            fs.run_backend().unwrap();
        }
        if operation == 500 {
            fs.checkpoint().unwrap();
        }
    }
    println!("seed {seed}: {one_record} inserts in one record, {two_records} in two");
    let (fs, survivor) = crash_and_replay(fs, &memory, inode, &model, seed, mode);
    fs.unmount().unwrap();
    drop(fs);
    assert_clean_after_replay(survivor, seed);
}

#[test]
fn compaction_replays_to_the_same_bytes() {
    compaction_at_scale(3, CrashMode::KeepAll);
    compaction_at_scale(4, CrashMode::Random);
}

/// One direct write after a synced logged one, the device failing at its k-th write or flush
/// (the data write, its flush, the record's write or its flush), then power loss that tears or
/// drops every unflushed write. The file must come back as it was before the direct write or
/// with all of it, its blocks passing their checksums, and fsck must be clean (no block leaked
/// by a claim that never got its record). Fails if the record is logged before the data is
/// durable: a crash then keeps the record and tears the blocks it maps.
#[test]
fn a_direct_write_is_whole_or_absent_after_a_crash_anywhere() {
    use tandemfs::fs::{FileType, MountOptions, ROOT_INODE};
    let options = MountOptions { direct_write_min_bytes: 16 << 10, flush_delay_us: 10_000_000, ..inline_options() };
    let (mut kept_new, mut kept_old) = (0, 0);
    for seed in seeds(0..48) {
        for operation in [FaultOperation::Write, FaultOperation::Flush] {
            let what = format!("seed {seed}, fault at {operation:?} {}", seed % 4);
            let (memory, device) = memory_volume(32 << 20, true);
            let (fs, _) = FileSystem::mount(device, &options).unwrap();
            let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
            let old: Vec<u8> = (0..3000u32).map(|index| (index % 13) as u8).collect();
            fs.write(file, 0, &old).unwrap();
            fs.sync().unwrap();
            memory.inject(Fault { operation, after_operations: seed % 4, repeat: true, range: None });
            let new: Vec<u8> = (0..70_000u32).map(|index| (index % 251) as u8 ^ seed as u8).collect();
            // An append: a direct write takes only bytes that map nothing yet.
            let written = fs.write(file, old.len() as u64, &new);
            let expected_new = {
                let mut bytes = old.clone();
                bytes.extend_from_slice(&new);
                bytes
            };
            if written.is_ok() {
                assert!(fs.direct_write_records() > 0, "{what}: the write did not go straight home");
            }
            let _ = fs.sync();
            let survivor = memory.crash(seed, CrashMode::Random);
            drop(fs);
            let report = fsck::check(Arc::new(survivor.clone())).unwrap();
            assert!(report.is_clean(), "{what}: fsck after the crash: {:#?}", report.problems);
            let (fs, _) = FileSystem::mount(Arc::new(survivor), &options).unwrap();
            let size = fs.get_attributes(file).unwrap().size_bytes as usize;
            let mut back = vec![0u8; size];
            fs.read(file, 0, &mut back).unwrap_or_else(|error| panic!("{what}: read after the crash: {error}"));
            if back == expected_new {
                kept_new += 1;
            } else {
                assert!(
                    back == old,
                    "{what}: neither the old {} bytes nor the new {}: {size}",
                    old.len(),
                    expected_new.len()
                );
                kept_old += 1;
            }
            fs.unmount().unwrap();
        }
    }
    println!("{kept_new} crashes kept the direct write, {kept_old} lost it");
    assert!(kept_new > 0 && kept_old > 0, "{kept_new} kept, {kept_old} lost: both outcomes must be reached");
}
