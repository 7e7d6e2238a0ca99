//! Front-end and back-end cost of creates: how fast calls return, and how long the back end
//! then takes to apply them.
use std::sync::Arc;
use std::time::Instant;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::FileSystem;
fn main() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(1 << 30));
    FileSystem::format(device.clone(), &FormatOptions { inode_count: Some(210_000), ..Default::default() }).unwrap();
    let options = MountOptions::default();
    let (fs, _) = FileSystem::mount(device, &options).unwrap();
    let count: usize = std::env::args().nth(1).map(|a| a.parse().unwrap()).unwrap_or(20_000);
    let start = Instant::now();
    for i in 0..count {
        if let Err(error) = fs.create(ROOT_INODE, format!("file-{i}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0) {
            panic!("create {i}: {error}; {:?}; {:?}", fs.statistics(), fs.log_statistics());
        }
    }
    let front = start.elapsed();
    let start = Instant::now();
    fs.run_backend().unwrap();
    let back = start.elapsed();
    let start = Instant::now();
    fs.checkpoint().unwrap();
    let checkpoint = start.elapsed();
    println!(
        "create: front end {:.2} us, back end {:.2} us per file; checkpoint {:.1} ms",
        front.as_secs_f64() * 1e6 / count as f64,
        back.as_secs_f64() * 1e6 / count as f64,
        checkpoint.as_secs_f64() * 1e3
    );
    let start = Instant::now();
    for i in 0..count {
        fs.lookup(ROOT_INODE, format!("file-{i}").as_bytes()).unwrap();
    }
    println!("stat: {:.2} us", start.elapsed().as_secs_f64() * 1e6 / count as f64);
    fs.unmount().unwrap();
}
