//! Back-end cost per operation, apart from the front end: the back end runs only when called, so
//! each phase first appends its records (front end) and then applies and checkpoints them
//! (back end), timed separately. The log's pledge of checkpoint images (`log::pledge`) makes
//! the front end apply what it appended whenever the backlog fills, so the front end's time
//! includes most of the applying; the instruction count of the whole run under
//! callgrind is the repeatable measure (`valgrind --tool=callgrind` without the toggle).
//!
//! `cargo run --release --example backend_cost -- [count] [phase]`; phase is `create` (one
//! directory), `tree` (100 directories), `unlink` or `all` (default). For repeatable instruction
//! counts run it under `valgrind --tool=callgrind --toggle-collect='*measured_backend*'`: only
//! the back end of the chosen phase is counted.
use std::sync::Arc;
use std::time::Instant;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::FileSystem;

const TREE_DIRECTORIES: usize = 100;

/// The back end of the phase being measured: apply everything, then checkpoint.
#[inline(never)]
fn measured_backend(fs: &FileSystem) -> (f64, f64) {
    let start = Instant::now();
    fs.run_backend().unwrap();
    let apply = start.elapsed().as_secs_f64();
    let start = Instant::now();
    fs.checkpoint().unwrap();
    (apply, start.elapsed().as_secs_f64())
}

/// The back end of a phase that only prepares the one measured.
#[inline(never)]
fn setup_backend(fs: &FileSystem) {
    fs.run_backend().unwrap();
    fs.checkpoint().unwrap();
}

fn report(name: &str, count: usize, front_s: f64, (apply_s, checkpoint_s): (f64, f64)) {
    let per = |seconds: f64| seconds * 1e6 / count as f64;
    println!(
        "{name:>7}: front end {:.2} us, back end apply {:.2} us + checkpoint {:.2} us = {:.2} us per operation",
        per(front_s),
        per(apply_s),
        per(checkpoint_s),
        per(apply_s + checkpoint_s)
    );
}

fn main() {
    let count: usize = std::env::args().nth(1).map(|argument| argument.parse().unwrap()).unwrap_or(20_000);
    let phase = std::env::args().nth(2).unwrap_or_else(|| "all".into());
    assert!(["create", "tree", "unlink", "all"].contains(&phase.as_str()), "phase: create, tree, unlink or all");
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(1 << 30));
    let inode_count = Some(3 * count as u64 + 1000);
    // A fixed seed and uuid: the same names land in the same places on every run.
    let format_options =
        FormatOptions { inode_count, uuid: Some([7; 16]), hash_seed: Some([1, 2, 3, 4]), ..Default::default() };
    FileSystem::format(device.clone(), &format_options).unwrap();
    let options = MountOptions { background_backend: false, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device, &options).unwrap();
    let measure = |name: &str| phase == name || phase == "all";

    let start = Instant::now();
    for index in 0..count {
        fs.create(ROOT_INODE, format!("file-{index}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
    }
    let front = start.elapsed().as_secs_f64();
    if measure("create") {
        report("create", count, front, measured_backend(&fs));
    } else {
        setup_backend(&fs);
    }

    if measure("tree") {
        let start = Instant::now();
        let mut directories = Vec::with_capacity(TREE_DIRECTORIES);
        for index in 0..TREE_DIRECTORIES {
            directories.push(fs.make_directory(ROOT_INODE, format!("dir-{index}").as_bytes(), 0o755, 0, 0).unwrap());
        }
        for index in 0..count {
            let parent = directories[index % TREE_DIRECTORIES].inode;
            fs.create(parent, format!("file-{index}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
        }
        let front = start.elapsed().as_secs_f64();
        report("tree", count, front, measured_backend(&fs));
    }

    if measure("unlink") {
        let start = Instant::now();
        for index in 0..count {
            fs.unlink(ROOT_INODE, format!("file-{index}").as_bytes()).unwrap();
        }
        let front = start.elapsed().as_secs_f64();
        report("unlink", count, front, measured_backend(&fs));
    }
    fs.unmount().unwrap();
}
