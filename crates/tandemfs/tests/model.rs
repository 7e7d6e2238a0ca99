//! The seeded model test: random sequences of every operation against a reference model,
//! comparing every read, listing and error; the volume is remounted and checked by fsck along
//! the way, every other time after a simulated kill of the mount, so that the log is replayed
//! over data the back end already applied. A failing seed reproduces exactly: `TANDEM_SEED=n cargo test --test model`.

mod common;

use common::ops::{Driver, Workload};
use common::*;
use std::sync::Arc;
use tandemfs::device::CrashMode;
use tandemfs::fsck;
use tandemfs::FileSystem;

fn run(seed: u64, operations: u64, workload: Workload, remount_every: u64) {
    let (mut memory, mut device) = memory_volume(256 << 20, false);
    let mut rng = rng(seed);
    let mut driver = Driver::new(workload);
    let (mut fs, _) = FileSystem::mount(device.clone(), &tandemfs::fs::MountOptions::default()).unwrap();
    for index in 0..operations {
        driver.step(&fs, &mut rng).unwrap_or_else(|error| panic!("seed {seed}, operation {index}: {error}"));
        // Only a crash can leave a state an operation passed through; none happens here.
        driver.passed_through.clear();
        if (index + 1) % remount_every == 0 {
            if ((index + 1) / remount_every).is_multiple_of(2) {
                fs.unmount().unwrap();
            } else {
                // A killed mount: everything acknowledged is durable and every write issued so
                // far is kept, wherever the back end was (applying, half way through a
                // checkpoint). The next mount replays over data blocks those writes changed.
                fs.sync().unwrap();
                memory = memory.crash(seed, CrashMode::KeepAll);
                device = Arc::new(memory.clone());
                // Stops the back-end thread; the old device is dead, so this fails.
                let _ = fs.unmount();
            }
            let report = fsck::check(device.clone()).unwrap();
            assert!(report.is_clean(), "seed {seed}, after {index} operations: fsck: {:#?}", report.problems);
            fs = FileSystem::mount(device.clone(), &tandemfs::fs::MountOptions::default()).unwrap().0;
            let back = read_back(&fs).unwrap();
            assert!(
                same_tree(&back, &driver.model),
                "seed {seed}: after remount: {}",
                first_difference(&back, &driver.model)
            );
        }
    }
    fs.unmount().unwrap();
    let report = fsck::check(device.clone()).unwrap();
    assert!(report.is_clean(), "seed {seed}: fsck: {:#?}", report.problems);
}

fn seeds(default: std::ops::Range<u64>) -> Vec<u64> {
    match std::env::var("TANDEM_SEED") {
        Ok(seed) => vec![seed.parse().expect("TANDEM_SEED is a number")],
        Err(_) => default.collect(),
    }
}

#[test]
fn mixed_workload() {
    // 8 seeds × 100,000 operations.
    for seed in seeds(0..8) {
        run(seed, 100_000, Workload::mixed(), 25_000);
    }
}

#[test]
fn large_directories() {
    // 4 seeds × 60,000 operations, most of them creating entries in one directory.
    for seed in seeds(100..104) {
        run(seed, 60_000, Workload::large_directory(), 30_000);
    }
}
