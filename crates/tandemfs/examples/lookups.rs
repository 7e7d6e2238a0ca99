//! Per-lookup cost of `FileSystem::lookup` (attributes returned) in three states of a volume:
//! right after the names were created (the back end still applying them), once everything is
//! applied, and after a remount (a first pass walks the H-tree, the later ones hit the cache).
//!
//! Usage: `cargo run --release --example lookups [COUNT] [PASSES] [PHASE] [inline]`, PHASE one of
//! `fresh`, `applied`, `remounted` or `all`. Only the chosen phase's passes run in `measured_pass`,
//! so `valgrind --tool=callgrind --toggle-collect=lookups::measured_pass` counts the
//! instructions of exactly COUNT × PASSES lookups. `inline` runs the back end only when the
//! example calls it (no back-end thread), which makes the counts repeatable: every name of the
//! fresh phase is then still in the overlay.
use std::sync::Arc;
use std::time::Instant;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::FileSystem;

#[inline(never)]
fn measured_pass(fs: &FileSystem, directory: InodeNumber, names: &[Vec<u8>]) -> f64 {
    let start = Instant::now();
    for name in names {
        fs.lookup(directory, name).unwrap();
    }
    start.elapsed().as_secs_f64() * 1e9 / names.len() as f64
}

#[inline(never)]
fn other_pass(fs: &FileSystem, directory: InodeNumber, names: &[Vec<u8>]) -> f64 {
    let start = Instant::now();
    for name in names {
        fs.lookup(directory, name).unwrap();
    }
    start.elapsed().as_secs_f64() * 1e9 / names.len() as f64
}

fn main() {
    let arguments: Vec<String> = std::env::args().collect();
    let count: usize = arguments.get(1).map(|a| a.parse().unwrap()).unwrap_or(100_000);
    let passes: usize = arguments.get(2).map(|a| a.parse().unwrap()).unwrap_or(3);
    let phase = arguments.get(3).cloned().unwrap_or_else(|| "all".into());
    let options =
        MountOptions { background_backend: arguments.get(4).is_none_or(|a| a != "inline"), ..Default::default() };
    let run = |name: &str, fs: &FileSystem, directory: InodeNumber, names: &[Vec<u8>]| -> Vec<f64> {
        (0..passes)
            .map(|_| {
                if phase == "all" || phase == name {
                    measured_pass(fs, directory, names)
                } else {
                    other_pass(fs, directory, names)
                }
            })
            .collect()
    };
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(4 << 30));
    let inodes = (count as u64 * 2 + 1024).max(4096);
    FileSystem::format(device.clone(), &FormatOptions { inode_count: Some(inodes), ..Default::default() }).unwrap();
    let (fs, _) = FileSystem::mount(device.clone(), &options).unwrap();
    let directory = fs.make_directory(ROOT_INODE, b"flat", 0o755, 0, 0).unwrap().inode;
    let names: Vec<Vec<u8>> = (0..count).map(|index| format!("f{index:07}").into_bytes()).collect();
    for name in &names {
        fs.create(directory, name, FileType::Regular, 0o644, 0, 0, 0).unwrap();
    }
    let behind = fs.log_statistics();
    let fresh = run("fresh", &fs, directory, &names);
    println!(
        "right after {count} creates ({} records not applied): {:.0?} ns per lookup",
        behind.next_lsn - 1 - behind.applied_lsn,
        fresh
    );
    fs.checkpoint().unwrap();
    let applied = run("applied", &fs, directory, &names);
    println!("everything applied: {applied:.0?} ns per lookup");
    fs.unmount().unwrap();
    let (fs, _) = FileSystem::mount(device, &options).unwrap();
    let directory = fs.lookup(ROOT_INODE, b"flat").unwrap().inode;
    let first = other_pass(&fs, directory, &names);
    let remounted = run("remounted", &fs, directory, &names);
    println!("after remount: first pass (H-tree walks) {first:.0} ns, then {remounted:.0?} ns per lookup");
    fs.unmount().unwrap();
}
