//! The crash test: random operations with random syncs, back-end passes and checkpoints, the
//! device failing at a random write (everything after it lost), then a crash that drops or
//! tears every unflushed write. The remounted volume must pass fsck and hold exactly the state
//! after some prefix of the operations that includes everything acknowledged by `sync`.
//! `TANDEM_SEED=n cargo test --test crash` reproduces one seed.

mod common;

use common::ops::{Driver, Workload};
use common::*;
use rand::Rng;
use std::sync::Arc;
use tandemfs::device::{CrashMode, Device, Fault, FaultOperation};
use tandemfs::{fsck, FileSystem};

const ROUNDS_PER_SEED: u64 = 10;

fn crash_run(seed: u64) -> u64 {
    let (mut memory, _) = memory_volume(16 << 20, true);
    let mut rng = rng(seed);
    let workload = Workload {
        names_per_directory: 12,
        write_bytes_max: 20_000,
        file_bytes_max: 120_000,
        create_weight: 6,
        flat: false,
    };
    let mut driver = Driver::new(workload);
    let mut crash_points = 0;
    for round in 0..ROUNDS_PER_SEED {
        let device: Arc<dyn Device> = Arc::new(memory.clone());
        let (fs, _) = FileSystem::mount(device, &inline_options())
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
                _ => driver.step(&fs, &mut rng).map(|()| candidates.push(driver.model.clone())),
            };
            if outcome.is_err() {
                break;
            }
        }
        drop(fs);
        memory = memory.crash(rng.gen(), CrashMode::Random);
        crash_points += 1;
        let report = fsck::check(Arc::new(memory.clone())).unwrap();
        assert!(report.is_clean(), "seed {seed} round {round}: fsck after crash: {:#?}", report.problems);
        let device: Arc<dyn Device> = Arc::new(memory.clone());
        let (fs, _) = FileSystem::mount(device, &inline_options())
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
    crash_points
}

#[test]
fn crashes_lose_nothing_acknowledged() {
    let seeds: Vec<u64> = match std::env::var("TANDEM_SEED") {
        Ok(seed) => vec![seed.parse().unwrap()],
        Err(_) => (0..110).collect(),
    };
    let mut crash_points = 0;
    for seed in seeds {
        crash_points += crash_run(seed);
    }
    println!("{crash_points} crash points checked");
}
