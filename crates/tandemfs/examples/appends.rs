//! Durable small appends through the library: the latency the engine adds per write + fsync.
use std::sync::Arc;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::FileSystem;
fn main() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(1 << 30));
    FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let file = fs.create(ROOT_INODE, b"append", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    for size in [256usize, 4096] {
        let data = vec![7u8; size];
        let count = 50_000u64;
        let start = std::time::Instant::now();
        for i in 0..count {
            fs.write(file, i * size as u64, &data).unwrap();
            fs.fsync(file, false).unwrap();
        }
        println!("append {size} B + fsync: {:.2} us", start.elapsed().as_secs_f64() * 1e6 / count as f64);
    }
    fs.unmount().unwrap();
}
