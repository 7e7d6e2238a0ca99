//! Byte-granular inserts into a large file, until applied: the cost the allocator adds as the
//! volume fills (issue 12's growth table). A file of `gib` GiB is reserved with `allocate`
//! (unwritten extents: every block taken, nothing written), then `count` inserts of 1–4096
//! bytes land at random byte offsets; each insert allocates near its offset, so the search
//! starts deep inside the file's used stretch. The volume lives in a sparse file.
//!
//! `cargo run --release --example flex_growth -- [gib] [count] [path]` (defaults: 8, 1000,
//! /dev/shm/tandem-flex-growth.img).
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Instant;
use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
use tandemfs::fs::*;
use tandemfs::FileSystem;

fn main() {
    let mut arguments = std::env::args().skip(1);
    let gib: u64 = arguments.next().map(|argument| argument.parse().unwrap()).unwrap_or(8);
    let count: usize = arguments.next().map(|argument| argument.parse().unwrap()).unwrap_or(1000);
    let path = arguments.next().unwrap_or_else(|| "/dev/shm/tandem-flex-growth.img".into());
    let file_bytes = gib << 30;
    // Room for the file, the log and the metadata, and the inserts.
    let volume_bytes = file_bytes + file_bytes / 8 + (512 << 20);
    let _ = std::fs::remove_file(&path);
    let options = FileDeviceOptions { create_size_bytes: Some(volume_bytes), ..FileDeviceOptions::default() };
    let device: Arc<dyn Device> = Arc::new(FileDevice::open(&path, options).unwrap());
    let format = FormatOptions { uuid: Some([7; 16]), hash_seed: Some([1, 2, 3, 4]), ..FormatOptions::default() };
    FileSystem::format(device.clone(), &format).unwrap();
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let file = fs.create(ROOT_INODE, b"big", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let started = Instant::now();
    fs.allocate(file, 0, file_bytes, false).unwrap();
    fs.checkpoint().unwrap();
    println!("reserved {gib} GiB in {:.2} s", started.elapsed().as_secs_f64());
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let mut size = file_bytes;
    let started = Instant::now();
    for _ in 0..count {
        let length = rng.gen_range(1..=4096usize);
        let offset = rng.gen_range(0..size);
        fs.insert(file, offset, &vec![0x5a; length]).unwrap();
        size += length as u64;
    }
    fs.checkpoint().unwrap();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{count} inserts of 1-4096 bytes into {gib} GiB, until applied: {:.1} us each ({:.2} s)",
        seconds * 1e6 / count as f64,
        seconds
    );
    fs.unmount().unwrap();
    let _ = std::fs::remove_file(&path);
}
