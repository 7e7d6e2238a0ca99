//! The model test with several front-end threads: each thread drives its own private subtree
//! against its own reference model (every read, listing and error compared as it goes) and a
//! few thread-unique names in one shared directory, all at once on one mount whose back end
//! runs in its own thread. Between phases the threads stop, every thread's part of the volume
//! is compared with its model, and the volume is remounted (a clean unmount, or a killed mount
//! whose log is replayed over what the back end applied) and checked by fsck.
//! `TANDEM_SEED=n cargo test --release --test model_threads` runs one seed.

mod common;

use common::ops::Workload;
use common::threads::*;
use common::*;
use tandemfs::{fsck, FileSystem};

const THREADS: u64 = 6;
const PHASES: u64 = 4;
const OPERATIONS_PER_THREAD_PER_PHASE: u64 = 5_000;

fn workload() -> Workload {
    Workload {
        names_per_directory: 16,
        write_bytes_max: 12_000,
        file_bytes_max: 100_000,
        create_weight: 6,
        flat: false,
    }
}

fn run(seed: u64, backend_workers: usize) {
    println!("model with threads: seed {seed}, {backend_workers} back-end workers");
    // Odd seeds: a checkpoint due at nearly every pass (each then runs in its own thread beside
    // the passes) and a small metadata cache, so that blocks a checkpoint left dirty or marked
    // clean are evicted and read back while the threads work: a block marked clean with a
    // change its image lacks would come back without it.
    let options = match seed % 2 {
        1 => tandemfs::fs::MountOptions {
            checkpoint_interval_ms: 1,
            cache_bytes: 1 << 20,
            ..worker_options(backend_workers)
        },
        _ => worker_options(backend_workers),
    };
    let (mut memory, mut device) = memory_volume(256 << 20, false);
    let (mut fs, _) = FileSystem::mount(device.clone(), &options).unwrap();
    let shared = make_directories(&fs, THREADS);
    let mut states: Vec<ThreadState> = (0..THREADS).map(|thread| ThreadState::new(seed, thread, workload())).collect();
    // Records the workers applied side by side, over every mount of the run.
    let mut parallel_records = 0;
    for phase in 0..PHASES {
        let handles: Vec<_> = states
            .into_iter()
            .map(|mut state| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    for index in 0..OPERATIONS_PER_THREAD_PER_PHASE {
                        state.step(&fs, shared).unwrap_or_else(|error| {
                            panic!("seed {seed} phase {phase} thread {} operation {index}: {error}", state.thread)
                        });
                        state.driver.passed_through.clear();
                    }
                    state
                })
            })
            .collect();
        states = handles.into_iter().map(|handle| handle.join().expect("a model thread failed")).collect();
        let what = format!("seed {seed} phase {phase}");
        assert_eq!(fs.failure(), None, "{what}");
        for state in &states {
            state.check(&fs, shared, &format!("{what}, live"));
        }
        let subdirectories: usize = states.iter().map(|state| state.shared.directories.len()).sum();
        check_shared_link_count(&fs, shared, subdirectories, &format!("{what}, live"));
        parallel_records += fs.backend_statistics().parallel_records;
        (fs, device) = remount(fs, &mut memory, device, !phase.is_multiple_of(2), seed, &options, &what);
        for state in &states {
            state.check(&fs, shared, &format!("{what}, remounted"));
        }
        check_shared_link_count(&fs, shared, subdirectories, &format!("{what}, remounted"));
    }
    parallel_records += fs.backend_statistics().parallel_records;
    fs.unmount().unwrap();
    let report = fsck::check(device).unwrap();
    assert!(report.is_clean(), "seed {seed}: fsck at the end: {:#?}", report.problems);
    // The run must have exercised what it claims: several workers applied records side by
    // side, one worker never did.
    if backend_workers == 1 {
        assert_eq!(parallel_records, 0, "seed {seed}: one worker applied records side by side");
    } else {
        assert!(parallel_records > 0, "seed {seed}: {backend_workers} workers never applied records side by side");
    }
}

#[test]
fn threads_each_follow_their_model() {
    let seeds = seeds([0, 1, 2]);
    for &backend_workers in BACKEND_WORKER_COUNTS {
        for &seed in &seeds {
            run(seed, backend_workers);
        }
    }
}

/// A worker count past the bound is a clear error before anything is written, and the volume
/// then mounts with a count inside it.
#[test]
fn a_worker_count_past_the_bound_is_refused_and_writes_nothing() {
    let (memory, device) = memory_volume(64 << 20, false);
    let before = memory.to_bytes();
    let most = tandemfs::backend::parallel::WORKERS_MAX;
    let error = FileSystem::mount(device.clone(), &worker_options(most + 1)).map(|_| ()).unwrap_err();
    assert!(error.to_string().contains(&format!("at most {most} are supported")), "{error}");
    assert!(memory.to_bytes() == before, "a refused mount wrote to the volume");
    let (fs, _) = FileSystem::mount(device, &worker_options(most)).unwrap();
    assert_eq!(fs.backend_statistics().workers, most as u64);
    fs.unmount().unwrap();
}
