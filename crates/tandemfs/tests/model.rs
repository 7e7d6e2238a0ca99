//! The seeded model test: random sequences of every operation against a reference model,
//! comparing every read, listing and error; the volume is remounted and checked by fsck along
//! the way, every other time after a simulated kill of the mount, so that the log is replayed
//! over data the back end already applied. A failing seed reproduces exactly: `TANDEM_SEED=n cargo test --test model`.

mod common;

use common::ops::{Driver, Workload};
use common::*;
use tandemfs::FileSystem;

fn run(seed: u64, operations: u64, workload: Workload, remount_every: u64) {
    run_with(seed, operations, workload, remount_every, None)
}

/// `run` on a volume encrypted under `key` when one is given.
fn run_with(seed: u64, operations: u64, workload: Workload, remount_every: u64, key: Option<tandemfs::crypt::Secret>) {
    let (mut memory, mut device) = memory_volume_with(256 << 20, false, key.as_ref());
    let mut rng = rng(seed);
    let mut driver = Driver::new(workload);
    let options = tandemfs::fs::MountOptions { key, ..tandemfs::fs::MountOptions::default() };
    let (mut fs, _) = FileSystem::mount(device.clone(), &options).unwrap();
    for index in 0..operations {
        driver.step(&fs, &mut rng).unwrap_or_else(|error| panic!("seed {seed}, operation {index}: {error}"));
        // Only a crash can leave a state an operation passed through; none happens here.
        driver.passed_through.clear();
        if (index + 1) % remount_every == 0 {
            let killed = !((index + 1) / remount_every).is_multiple_of(2);
            let what = format!("seed {seed}, after {index} operations");
            (fs, device) = remount(fs, &mut memory, device, killed, seed, &options, &what);
            let back = read_back(&fs).unwrap();
            assert!(
                same_tree(&back, &driver.model),
                "seed {seed}: after remount: {}",
                first_difference(&back, &driver.model)
            );
        }
    }
    fs.unmount().unwrap();
    let report = check_with_key(device.clone(), options.key.as_ref());
    assert!(report.is_clean(), "seed {seed}: fsck: {:#?}", report.problems);
}

#[test]
fn mixed_workload() {
    // 8 seeds × 100,000 operations.
    for seed in seeds(0..8) {
        run(seed, 100_000, Workload::mixed(), 25_000);
    }
}

#[test]
fn mixed_workload_encrypted() {
    // The same on an encrypted volume (every block through AES-XTS, partial blocks through
    // read-modify-write): 2 seeds × 20,000 operations, remounted every 5,000.
    for seed in seeds(0..2) {
        run_with(seed, 20_000, Workload::mixed(), 5_000, Some(test_secret()));
    }
}

#[test]
fn large_directories() {
    // 4 seeds × 60,000 operations, most of them creating entries in one directory.
    for seed in seeds(100..104) {
        run(seed, 60_000, Workload::large_directory(), 30_000);
    }
}
