//! Background compaction (`fs::engine::compactor`): a file that random cuts leave holding more
//! than the mount's factor times its bytes is compacted below it by the mount's own thread,
//! every byte kept; with the factor 0 nothing is; a read-only mount never compacts, and the
//! same volume remounted read-write does. The crash test is in crash.rs
//! (`background_compaction_replays_to_the_same_bytes`).

mod common;

use common::*;
use rand::Rng;
use std::time::{Duration, Instant};
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

/// How long a test waits for the compactor thread (it paces itself; a pass takes milliseconds).
const WAIT_MAX: Duration = Duration::from_secs(60);

/// A 1 MiB file of seeded bytes cut at random bytes: collapses inside blocks (each keeps a
/// block for what is left of it), inserts of up to 200 bytes, punches of a few bytes. Returns
/// the file's bytes. Holds well over 1.25 times its bytes.
fn fragment(fs: &FileSystem, file: u64, seed: u64) -> Vec<u8> {
    let mut rng = rng(seed);
    let mut model = pattern(&mut rng, 1 << 20);
    assert_eq!(fs.write(file, 0, &model).unwrap(), model.len());
    // From the end, so that each offset still lies in block `k`.
    for k in (1..=200usize).rev() {
        let offset = k * 4096 + rng.gen_range(100..600);
        fs.collapse_range(file, offset as u64, 3000).unwrap();
        model.drain(offset..offset + 3000);
    }
    for _ in 0..600 {
        let offset = rng.gen_range(0..model.len());
        match rng.gen_range(0..3) {
            0 => {
                let length = rng.gen_range(1..=200);
                let bytes = pattern(&mut rng, length);
                fs.insert(file, offset as u64, &bytes).unwrap();
                model.splice(offset..offset, bytes);
            }
            1 => {
                let length = rng.gen_range(1..=300).min(model.len() - offset);
                fs.collapse_range(file, offset as u64, length as u64).unwrap();
                model.drain(offset..offset + length);
            }
            _ => {
                let length = rng.gen_range(1..=50).min(model.len() - offset);
                fs.punch_hole(file, offset as u64, length as u64).unwrap();
                model[offset..offset + length].fill(0);
            }
        }
    }
    fs.fsync(file, false).unwrap();
    model
}

fn assert_bytes(fs: &FileSystem, file: u64, model: &[u8], what: &str) {
    let mut back = vec![0u8; model.len() + 1];
    assert_eq!(fs.read(file, 0, &mut back).unwrap(), model.len(), "{what}: length");
    let wrong = back[..model.len()].iter().zip(model).filter(|(got, want)| got != want).count();
    assert_eq!(wrong, 0, "{what}: {wrong} bytes differ");
}

/// Waits until `file` holds at most `factor` times its bytes and the compactor has finished a
/// sweep; panics after `WAIT_MAX`.
fn wait_compacted(fs: &FileSystem, file: u64, factor: f64, what: &str) -> SpaceUse {
    let started = Instant::now();
    loop {
        let space = fs.space_use(file).unwrap();
        if space.amplification() <= factor && fs.compaction_statistics().files_compacted > 0 {
            return space;
        }
        assert!(
            started.elapsed() < WAIT_MAX,
            "{what}: not compacted in {WAIT_MAX:?}: {space:?}, {:?}",
            fs.compaction_statistics()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn random_cuts_are_compacted_below_the_factor_by_the_mount_itself() {
    for (seed, factor) in [(1, 1.25), (2, 1.1)] {
        let what = format!("seed {seed}, factor {factor}");
        let (memory, device) = memory_volume(64 << 20, false);
        let options = MountOptions { background_compact_factor: factor, ..MountOptions::default() };
        let (fs, _) = FileSystem::mount(device, &options).unwrap();
        let file = fs.create(ROOT_INODE, b"cut", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
        let model = fragment(&fs, file, seed);
        let space = wait_compacted(&fs, file, factor, &what);
        let statistics = fs.compaction_statistics();
        println!("{what}: {space:?}, {statistics:?}");
        assert!(statistics.records > 0 && statistics.files_measured > 0, "{what}: {statistics:?}");
        assert_eq!(fs.get_attributes(file).unwrap().size_bytes, model.len() as u64, "{what}");
        assert_bytes(&fs, file, &model, &what);
        fs.unmount().unwrap();
        drop(fs);
        let report = fsck::check(std::sync::Arc::new(memory)).unwrap();
        assert!(report.is_clean(), "{what}: fsck: {:#?}", report.problems);
    }
}

#[test]
fn factor_zero_turns_background_compaction_off() {
    let (_, device) = memory_volume(64 << 20, false);
    let options = MountOptions { background_compact_factor: 0.0, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device, &options).unwrap();
    let file = fs.create(ROOT_INODE, b"cut", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let model = fragment(&fs, file, 3);
    fs.queue_for_compaction(file);
    std::thread::sleep(Duration::from_millis(1500));
    let space = fs.space_use(file).unwrap();
    assert!(space.amplification() > 1.25, "the workload must fragment the file: {space:?}");
    assert_eq!(fs.compaction_statistics(), CompactionStatistics::default());
    assert_eq!(fs.compaction_pass().unwrap(), CompactionPass::Idle);
    assert_bytes(&fs, file, &model, "off");
    fs.unmount().unwrap();
    for wrong in [0.5, -1.0, f64::NAN, f64::INFINITY] {
        let (_, device) = memory_volume(16 << 20, false);
        let options = MountOptions { background_compact_factor: wrong, ..MountOptions::default() };
        assert!(
            matches!(FileSystem::mount(device, &options), Err(tandemfs::Error::InvalidArgument(_))),
            "factor {wrong}"
        );
    }
}

#[test]
fn a_read_only_mount_never_compacts_and_a_remount_read_write_does() {
    let (memory, device) = memory_volume(64 << 20, false);
    let off = MountOptions { background_compact_factor: 0.0, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device.clone(), &off).unwrap();
    let file = fs.create(ROOT_INODE, b"cut", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let model = fragment(&fs, file, 4);
    let before = fs.space_use(file).unwrap();
    assert!(before.amplification() > 1.25, "{before:?}");
    fs.unmount().unwrap();
    drop(fs);
    let read_only = MountOptions { read_only: true, background_compact_factor: 1.0, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device, &read_only).unwrap();
    fs.queue_for_compaction(file);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fs.compaction_pass().unwrap(), CompactionPass::Idle);
    assert_eq!(fs.compaction_statistics(), CompactionStatistics::default(), "a pass ran on a read-only mount");
    assert_eq!(fs.space_use(file).unwrap(), before);
    fs.set_read_only(false).unwrap();
    fs.queue_for_compaction(file);
    let after = wait_compacted(&fs, file, 1.0 + 1.0 / 16.0, "after the remount read-write");
    assert!(after.held_bytes() < before.held_bytes(), "{before:?} -> {after:?}");
    assert_bytes(&fs, file, &model, "remounted read-write");
    fs.unmount().unwrap();
    drop(fs);
    let report = fsck::check(std::sync::Arc::new(memory)).unwrap();
    assert!(report.is_clean(), "fsck: {:#?}", report.problems);
}

/// Runs compaction passes (and the back end) until the queue is empty.
fn passes_until_idle(fs: &FileSystem) {
    // Bounded: a small file takes a pass or two.
    for _ in 0..100 {
        fs.run_backend().unwrap();
        if fs.compaction_pass().unwrap() == CompactionPass::Idle {
            return;
        }
    }
    panic!("the compactor never went idle: {:?}", fs.compaction_statistics());
}

/// A file measured below the factor is not walked again at every change: it rests for 64
/// changes (more in a file of many extents), then is measured again.
#[test]
fn a_file_below_the_factor_rests_until_it_changed_enough() {
    let (_, device) = memory_volume(64 << 20, false);
    let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
    let file = fs.create(ROOT_INODE, b"calm", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let mut rng = rng(9);
    fs.write(file, 0, &pattern(&mut rng, 256 << 10)).unwrap();
    let mut insert = |count: usize| {
        for _ in 0..count {
            let offset = rng.gen_range(0..(256u64 << 10));
            fs.insert(file, offset, b"0123456789").unwrap();
        }
    };
    insert(1);
    passes_until_idle(&fs);
    assert_eq!(fs.compaction_statistics().files_measured, 1);
    insert(10);
    passes_until_idle(&fs);
    assert_eq!(fs.compaction_statistics().files_measured, 1, "measured again after 10 changes");
    insert(60);
    passes_until_idle(&fs);
    let statistics = fs.compaction_statistics();
    assert_eq!((statistics.files_measured, statistics.records), (2, 0), "{statistics:?}");
    fs.unmount().unwrap();
}
