//! The crash test with several front-end threads: each thread works in its own private
//! subtree (against its own model) and on its own names in a shared directory, all on one
//! mount whose back end runs in its own thread, with random syncs and checkpoints; the device
//! fails at a random write (everything after it lost), then a crash drops or tears every
//! unflushed write, or keeps them all as a killed mount does. The remounted volume must pass
//! fsck, and each thread's part of it must be its state after some prefix of its operations
//! that includes every operation it had seen acknowledged by `sync`: the log replays a prefix,
//! and a prefix of the log holds a prefix of each thread's records.
//! `TANDEM_SEED=n cargo test --release --test crash_threads` reproduces one seed's choices
//! (the interleaving of the threads is not reproducible).

mod common;

use common::ops::Workload;
use common::threads::*;
use common::*;
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tandemfs::device::{CrashMode, Device, Fault, FaultOperation, MemoryDevice};
use tandemfs::fs::MountOptions;
use tandemfs::{fsck, FileSystem};

const THREADS: u64 = 4;
const ROUNDS_PER_SEED: u64 = 8;
const SEEDS: u64 = 60;
/// Operations per thread and round, at most; a round also ends at the first failure.
const OPERATIONS_PER_ROUND_MAX: u64 = 60;
/// A crash at a random instant comes within this many microseconds of the round's start.
const CRASH_DELAY_US_MAX: u64 = 6_000;
/// The device fails from a write drawn below this on.
const FAULT_AFTER_WRITES_MAX: u64 = 200;

fn workload() -> Workload {
    Workload { names_per_directory: 10, write_bytes_max: 12_000, file_bytes_max: 60_000, create_weight: 6, flat: false }
}

/// A state a thread's part of the volume may come back in.
type Candidate = (Model, SharedFiles);

/// What the runs did, to show that crashes met work in flight.
#[derive(Debug, Default)]
struct Tally {
    crash_points: u64,
    /// Rounds in which some thread saw the device fail (or the power go).
    rounds_failed: u64,
    /// Threads whose part came back past their last acknowledged state.
    found_past_acknowledged: u64,
    writes: u64,
    /// Checkpoints that went to the log and home in their own thread while passes applied.
    checkpoints_beside: u64,
}

/// Runs one thread's share of a round; returns the states its part of the volume may be in
/// after a crash now (from the last acknowledged sync on), and whether an operation failed.
fn thread_round(fs: &FileSystem, state: &mut ThreadState, shared: u64) -> (Vec<Candidate>, bool) {
    let mut candidates = vec![(state.driver.model.clone(), state.shared.clone())];
    let operations = state.rng.gen_range(1..=OPERATIONS_PER_ROUND_MAX);
    for _ in 0..operations {
        let outcome = match state.rng.gen_range(0..16) {
            // Everything this thread did before the call is durable once sync returns.
            0 | 1 => fs.sync().map(|()| candidates = vec![(state.driver.model.clone(), state.shared.clone())]),
            2 => fs.checkpoint(),
            _ => {
                let outcome = state.step(fs, shared);
                for passed in state.driver.passed_through.drain(..) {
                    candidates.push((passed, state.shared.clone()));
                }
                outcome.map(|()| candidates.push((state.driver.model.clone(), state.shared.clone())))
            }
        };
        if outcome.is_err() {
            return (candidates, true);
        }
    }
    (candidates, false)
}

fn mount(device: &MemoryDevice, options: &MountOptions, what: &str) -> FileSystem {
    let device: Arc<dyn Device> = Arc::new(device.clone());
    FileSystem::mount(device, options).unwrap_or_else(|error| panic!("{what}: mount: {error}")).0
}

/// Writes the image to the temp directory for a post-mortem (`tandem fsck` on it replays the
/// log alone); returns where, or why not.
fn keep_image(memory: &MemoryDevice, seed: u64, backend_workers: usize, round: u64) -> String {
    let path = std::env::temp_dir().join(format!("crash-threads-{seed}-{backend_workers}-{round}.img"));
    match std::fs::write(&path, memory.to_bytes()) {
        Ok(()) => path.display().to_string(),
        Err(error) => format!("nowhere: {error}"),
    }
}

fn crash_run(seed: u64, backend_workers: usize, tally: &mut Tally) {
    // A checkpoint due at nearly every pass, so that the crashes meet checkpoints running in
    // their own thread beside the passes (the log alone would make one due every few rounds).
    let options = MountOptions { checkpoint_interval_ms: 1, ..worker_options(backend_workers) };
    let (mut memory, _) = memory_volume(16 << 20, true);
    let fs = mount(&memory, &options, "first");
    let shared = make_directories(&fs, THREADS);
    fs.unmount().unwrap();
    let mut rng = rng(seed);
    let mut states: Vec<ThreadState> = (0..THREADS).map(|thread| ThreadState::new(seed, thread, workload())).collect();
    for round in 0..ROUNDS_PER_SEED {
        let what = format!("seed {seed} round {round} ({backend_workers} back-end workers)");
        let fs = mount(&memory, &options, &what);
        // Mostly power loss (unflushed writes torn or lost); sometimes a killed mount, whose
        // writes all reach the medium, so that replay runs over data the back end applied.
        let mode = match rng.gen_range(0..8) {
            0 | 1 => CrashMode::KeepAll,
            2 => CrashMode::DropAll,
            _ => CrashMode::Random,
        };
        let crash_seed: u64 = rng.gen();
        // The crash point: half the time a device that fails from a random write on (the
        // threads stop at their first error, then the power goes), half the time the power
        // goes at a random instant while the threads run. A sync that returned success must
        // be in the image either way: after the crash the device fails every flush.
        let crash_after = rng.gen_bool(0.5).then(|| Duration::from_micros(rng.gen_range(0..CRASH_DELAY_US_MAX)));
        if crash_after.is_none() {
            memory.inject(Fault {
                operation: FaultOperation::Write,
                after_operations: rng.gen_range(1..FAULT_AFTER_WRITES_MAX),
                repeat: true,
                range: None,
            });
        }
        let handles: Vec<_> = states
            .into_iter()
            .map(|mut state| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    let (candidates, failed) = thread_round(&fs, &mut state, shared);
                    (state, candidates, failed)
                })
            })
            .collect();
        let survivor = crash_after.map(|delay| {
            std::thread::sleep(delay);
            memory.crash(crash_seed, mode)
        });
        let finished: Vec<(ThreadState, Vec<Candidate>, bool)> = handles
            .into_iter()
            .map(|handle| {
                handle.join().unwrap_or_else(|_| {
                    let path = keep_image(&memory, seed, backend_workers, round);
                    panic!("{what}: a thread failed (image kept in {path})")
                })
            })
            .collect();
        tally.rounds_failed += u64::from(finished.iter().any(|(_, _, failed)| *failed));
        tally.writes += memory.counters().writes;
        tally.checkpoints_beside += fs.backend_statistics().checkpoints_beside;
        memory = survivor.unwrap_or_else(|| memory.crash(crash_seed, mode));
        // Stops the back-end thread and the multi-mount keeper; the old device is dead, so
        // nothing this does reaches the image, and it may fail.
        let _ = fs.unmount();
        tally.crash_points += 1;
        let report = fsck::check(Arc::new(memory.clone())).unwrap();
        if !report.is_clean() {
            let path = keep_image(&memory, seed, backend_workers, round);
            panic!("{what}: fsck after a crash ({mode:?}; image kept in {path}): {:#?}", report.problems);
        }
        let fs = mount(&memory, &options, &format!("{what}, after a crash ({mode:?})"));
        states = Vec::new();
        for (mut state, candidates, _) in finished {
            let thread = state.thread;
            let (model, files) =
                state.read_back(&fs, shared).unwrap_or_else(|error| panic!("{what}: thread {thread}: {error}"));
            let Some(found) = candidates
                .iter()
                .rposition(|(candidate, candidate_files)| same_tree(candidate, &model) && *candidate_files == files)
            else {
                panic!(
                    "{what}: crash {mode:?}: thread {thread}'s part matches none of its {} acceptable states; against the acknowledged one: private: {}; shared: {}",
                    candidates.len(),
                    first_difference(&candidates[0].0, &model),
                    candidates[0].1.difference(&files),
                );
            };
            tally.found_past_acknowledged += u64::from(found > 0);
            (state.driver.model, state.shared) = candidates[found].clone();
            states.push(state);
        }
        fs.unmount().unwrap_or_else(|error| panic!("{what}: unmount after the crash: {error}"));
    }
}

#[test]
fn threads_lose_nothing_acknowledged_in_a_crash() {
    let seeds = seeds(0..SEEDS);
    let mut tally = Tally::default();
    for &backend_workers in BACKEND_WORKER_COUNTS {
        for &seed in &seeds {
            crash_run(seed, backend_workers, &mut tally);
        }
    }
    println!("{tally:?}");
    assert!(tally.rounds_failed > 0, "the device never failed during a round: the fault bound is too high");
    // One seed (TANDEM_SEED, as a soak or a replay of a failure runs it) is only 16 crash
    // points: too few to promise a checkpoint beside the passes at one of them on a loaded
    // machine (4 of 96 single seeds run 12 at a time on the 16-core host had none, and passed
    // when run again). The whole run, 60 seeds, meets many.
    if seeds.len() > 1 {
        assert!(tally.checkpoints_beside > 0, "no checkpoint ran beside the passes: the crashes never met one");
    }
}
