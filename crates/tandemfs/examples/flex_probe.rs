//! Where a byte-granular collapse's (or insert's) time goes as the file grows (issue 12's flat
//! cost): a file of `mib` MiB reserved with `allocate` on a sparse image in /dev/shm, as `tandem
//! bench flex` makes it, then `count` collapses (or inserts, with `insert`) of 1–4096 bytes at
//! random bytes, or inserts of 4 KiB at random block boundaries (`aligned`, the bench's first
//! row). Prints, per operation, the loop (appends), the fsync,
//! and the checkpoint that applies the backlog and writes it home, with the back end's apply
//! and checkpoint times. With `PERF_CTL` and `PERF_ACK` naming perf's control and ack fifos,
//! perf records only the timed span:
//!
//! `perf record --control fifo:ctl,ack -D -1 target/release/examples/flex_probe 8192 1000`
//! (`cargo build --release -p tandemfs --example flex_probe`; arguments `[mib] [count]
//! [collapse|insert|aligned]`, defaults 64, 1000, collapse).
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Instant;
use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
use tandemfs::fs::*;
use tandemfs::FileSystem;

// The allocator of `tandem bench flex` (crates/tandem/src/main.rs): under glibc malloc a fifth
// of an insert's CPU samples were in the allocator, which the bench does not pay.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut arguments = std::env::args().skip(1);
    let mib: u64 = arguments.next().map(|a| a.parse().unwrap()).unwrap_or(64);
    let count: usize = arguments.next().map(|a| a.parse().unwrap()).unwrap_or(1000);
    let mode = arguments.next().unwrap_or_else(|| "collapse".into());
    assert!(["collapse", "insert", "aligned"].contains(&mode.as_str()), "mode: collapse, insert or aligned");
    let (insert, aligned) = (mode != "collapse", mode == "aligned");
    let path = "/dev/shm/tandem-compact-probe.img";
    let file_bytes = mib << 20;
    let volume_bytes = file_bytes + file_bytes / 8 + (1 << 30) + count as u64 * 3 * 4096;
    let _ = std::fs::remove_file(path);
    let options = FileDeviceOptions { create_size_bytes: Some(volume_bytes), lock_exclusive: true, read_only: false };
    let device: Arc<dyn Device> = Arc::new(FileDevice::open(path, options).unwrap());
    FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let file = fs.create(ROOT_INODE, b"flex", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.allocate(file, 0, file_bytes, false).unwrap();
    fs.checkpoint().unwrap();
    // The accelerator runtime (on a GPU host: the GPU opened and calibrated) is made here,
    // outside the timed span, as `bench flex` makes it; `COLD_ACCELERATOR=1` leaves it to the
    // first data checksum, inside the span, as the bench did before session 15.
    if std::env::var("COLD_ACCELERATOR").is_err() {
        let started = Instant::now();
        let _ = tandemfs::block::volume::default_accelerator();
        println!("accelerator runtime made in {:.3} s", started.elapsed().as_secs_f64());
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1 ^ file_bytes.rotate_left(17) ^ count as u64);
    let mut size = file_bytes;
    let b0 = fs.backend_statistics();
    let l0 = fs.log_statistics();
    let control =
        std::env::var("PERF_CTL").ok().map(|path| std::fs::OpenOptions::new().write(true).open(path).unwrap());
    let ack = std::env::var("PERF_ACK").ok();
    let tell = |word: &str| {
        if let Some(mut fifo) = control.as_ref() {
            use std::io::{Read, Write};
            fifo.write_all(word.as_bytes()).unwrap();
            let mut answer = [0u8; 5];
            std::fs::File::open(ack.as_ref().unwrap()).unwrap().read_exact(&mut answer).unwrap();
        }
    };
    tell("enable\n");
    let started = Instant::now();
    for _ in 0..count {
        let length = if aligned { 4096 } else { rng.gen_range(1..=4096u64) };
        if insert {
            let offset = if aligned { rng.gen_range(0..size / 4096) * 4096 } else { rng.gen_range(0..=size) };
            fs.insert(file, offset, &vec![0x5a; length as usize]).unwrap();
            size += length;
        } else {
            let offset = rng.gen_range(0..=size - length);
            fs.collapse_range(file, offset, length).unwrap();
            size -= length;
        }
    }
    let looped = started.elapsed();
    fs.fsync(file, false).unwrap();
    let synced = started.elapsed();
    let b1 = fs.backend_statistics();
    fs.checkpoint().unwrap();
    let done = started.elapsed();
    tell("disable\n");
    let b2 = fs.backend_statistics();
    let l2 = fs.log_statistics();
    println!(
        "{mib} MiB {}: loop {:.1} us/op, fsync+apply {:.1}, checkpoint {:.1}, total {:.1} us/op; apply_ns/op {:.1} (to fsync) {:.1} (all); checkpoint_ns {:.2} ms, checkpoints {} -> {}; lsn {} -> {}",
        mode,
        looped.as_secs_f64() * 1e6 / count as f64,
        (synced - looped).as_secs_f64() * 1e6 / count as f64,
        (done - synced).as_secs_f64() * 1e6 / count as f64,
        done.as_secs_f64() * 1e6 / count as f64,
        (b1.apply_ns - b0.apply_ns) as f64 / 1e3 / count as f64,
        (b2.apply_ns - b0.apply_ns) as f64 / 1e3 / count as f64,
        (b2.checkpoint_ns - b0.checkpoint_ns) as f64 / 1e6,
        b0.checkpoints, b2.checkpoints, l0.next_lsn, l2.next_lsn,
    );
    fs.unmount().unwrap();
    let _ = std::fs::remove_file(path);
}
