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
    let options = tandemfs::fs::MountOptions { key, ..tandemfs::fs::MountOptions::default() };
    run_with_options(seed, operations, workload, remount_every, &options);
}

/// `run` mounted with `options`; returns the direct-write records logged.
fn run_with_options(
    seed: u64,
    operations: u64,
    workload: Workload,
    remount_every: u64,
    options: &tandemfs::fs::MountOptions,
) -> u64 {
    let (mut memory, mut device) = memory_volume_with(256 << 20, false, options.key.as_ref());
    let mut rng = rng(seed);
    let mut driver = Driver::new(workload);
    let (mut fs, _) = FileSystem::mount(device.clone(), options).unwrap();
    let mut direct_records = 0;
    for index in 0..operations {
        driver.step(&fs, &mut rng).unwrap_or_else(|error| panic!("seed {seed}, operation {index}: {error}"));
        // Only a crash can leave a state an operation passed through; none happens here.
        driver.passed_through.clear();
        if (index + 1) % remount_every == 0 {
            let killed = !((index + 1) / remount_every).is_multiple_of(2);
            let what = format!("seed {seed}, after {index} operations");
            direct_records += fs.direct_write_records();
            (fs, device) = remount(fs, &mut memory, device, killed, seed, options, &what);
            let back = read_back(&fs).unwrap();
            assert!(
                same_tree(&back, &driver.model),
                "seed {seed}: after remount: {}",
                first_difference(&back, &driver.model)
            );
        }
    }
    direct_records += fs.direct_write_records();
    fs.unmount().unwrap();
    let report = check_with_key(device.clone(), options.key.as_ref());
    assert!(report.is_clean(), "seed {seed}: fsck: {:#?}", report.problems);
    direct_records
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

/// fsx with large writes: every operation of the mixed workload (writes, reads, truncates,
/// inserts, collapses, punches, zero ranges, renames, unlinks) with writes up to 300 KB into
/// files up to 2 MB, writes of 16 KiB or more into unmapped bytes (appends, holes) going
/// straight home (direct-write records), the others in place through the log, every
/// read compared with the model (reads of direct writes not yet applied come from the front
/// end), remounted and killed along the way (replay of direct writes over applied state).
#[test]
fn large_writes_straight_home() {
    let workload = Workload { write_bytes_max: 300_000, file_bytes_max: 2 << 20, ..Workload::mixed() };
    let options =
        tandemfs::fs::MountOptions { direct_write_min_bytes: 16 << 10, ..tandemfs::fs::MountOptions::default() };
    let mut direct_records = 0;
    for seed in seeds(200..203) {
        direct_records += run_with_options(seed, 20_000, workload, 5_000, &options);
    }
    println!("{direct_records} direct writes");
    assert!(direct_records > 0, "no write went straight home");
}

#[test]
fn large_directories() {
    // 4 seeds × 60,000 operations, most of them creating entries in one directory.
    for seed in seeds(100..104) {
        run(seed, 60_000, Workload::large_directory(), 30_000);
    }
}
