//! The `tandem bench meta` metadata workload through the library with the background back end,
//! phase by phase, with the log's state after each: where a phase's time goes.
//! `cargo run --release --example phases -- IMAGE [count] [drain]`; `drain` applies and
//! checkpoints everything between phases, so each phase is timed without the one before's backlog.
use std::sync::Arc;
use std::time::Instant;
use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
use tandemfs::fs::*;
use tandemfs::FileSystem;

fn main() {
    let path = std::env::args().nth(1).expect("image path");
    let count: usize = std::env::args().nth(2).map(|argument| argument.parse().unwrap()).unwrap_or(100_000);
    let drain = std::env::args().nth(3).is_some_and(|argument| argument == "drain");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(4 << 30).unwrap();
    drop(file);
    let device: Arc<dyn Device> = Arc::new(FileDevice::open(&path, FileDeviceOptions::default()).unwrap());
    let inode_count = Some((count as u64 + 116) * 2 + 1024);
    FileSystem::format(device.clone(), &FormatOptions { inode_count, ..Default::default() }).unwrap();
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let flat = fs.make_directory(ROOT_INODE, b"flat", 0o755, 0, 0).unwrap().inode;
    let tree = fs.make_directory(ROOT_INODE, b"tree", 0o755, 0, 0).unwrap().inode;
    let directories: Vec<u64> = (0..100)
        .map(|index| fs.make_directory(tree, format!("d{index:03}").as_bytes(), 0o755, 0, 0).unwrap().inode)
        .collect();
    let names: Vec<Vec<u8>> = (0..count).map(|index| format!("f{index:07}").into_bytes()).collect();
    let per_directory = count / 100;
    let phase = |label: &str, body: &mut dyn FnMut()| {
        let started = Instant::now();
        body();
        let seconds = started.elapsed().as_secs_f64();
        let log = fs.log_statistics();
        println!(
            "{label:>12}: {:6.2} us per operation; after: {} records / {} MiB since checkpoint, {} unapplied, {} checkpoints",
            seconds * 1e6 / count as f64,
            log.records_since_checkpoint,
            log.data_bytes_since_checkpoint >> 20,
            log.next_lsn.saturating_sub(log.applied_lsn + 1),
            log.checkpoints
        );
        if drain {
            let started = Instant::now();
            fs.checkpoint().unwrap();
            println!("{:>12}: {:6.2} us per operation", "drain", started.elapsed().as_secs_f64() * 1e6 / count as f64);
        }
    };
    phase("create flat", &mut || {
        names.iter().for_each(|name| {
            fs.create(flat, name, FileType::Regular, 0o644, 0, 0, 0).unwrap();
        })
    });
    phase("stat flat", &mut || {
        names.iter().for_each(|name| {
            fs.lookup(flat, name).unwrap();
        })
    });
    phase("unlink flat", &mut || names.iter().for_each(|name| fs.unlink(flat, name).unwrap()));
    phase("create tree", &mut || {
        for directory in &directories {
            for name in &names[..per_directory] {
                fs.create(*directory, name, FileType::Regular, 0o644, 0, 0, 0).unwrap();
            }
        }
    });
    phase("stat tree", &mut || {
        for directory in &directories {
            for name in &names[..per_directory] {
                fs.lookup(*directory, name).unwrap();
            }
        }
    });
    phase("unlink tree", &mut || {
        for directory in &directories {
            for name in &names[..per_directory] {
                fs.unlink(*directory, name).unwrap();
            }
        }
    });
    fs.unmount().unwrap();
    std::fs::remove_file(&path).unwrap();
}
