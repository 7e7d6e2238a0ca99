//! Cost of the runtime's queue for small requests: 4 KiB XTS requests submitted one by one,
//! against the same sectors encrypted directly. `cargo run --release -p tandem-accel --example runtime_queue`
use std::sync::Arc;
use tandem_accel::bench::{measure, random_bytes};
use tandem_accel::runtime::{Accelerator, Mode, Request, RuntimeConfig};
use tandem_accel::{Direction, XtsKey, SECTOR_SIZE_BYTES};

fn main() {
    let accelerator = Accelerator::new(RuntimeConfig { mode: Mode::Cpu, ..RuntimeConfig::default() });
    let key = Arc::new(XtsKey::new(&random_bytes(64, 1).try_into().unwrap()));
    let count = 4096;
    let queued = measure(count * SECTOR_SIZE_BYTES, 2.0, || {
        let completions: Vec<_> = (0..count)
            .map(|index| {
                accelerator.submit(Request::Xts {
                    key: Arc::clone(&key),
                    direction: Direction::Encrypt,
                    first_sector: index as u64,
                    data: accelerator.buffer(SECTOR_SIZE_BYTES),
                })
            })
            .collect();
        for completion in completions {
            completion.wait().unwrap();
        }
    });
    let mut data = vec![0u8; count * SECTOR_SIZE_BYTES];
    let direct = measure(count * SECTOR_SIZE_BYTES, 2.0, || {
        for (index, sector) in data.chunks_mut(SECTOR_SIZE_BYTES).enumerate() {
            accelerator.xts_encrypt(&key, index as u64, sector).unwrap();
        }
    });
    let (batches, requests) = accelerator.statistics();
    println!(
        "queued: {:.2} GB/s, {:.3} CPU s/GB ({requests} requests in {batches} batches)",
        queued.gigabytes_per_second, queued.cpu_seconds_per_gigabyte
    );
    println!("direct: {:.2} GB/s, {:.3} CPU s/GB", direct.gigabytes_per_second, direct.cpu_seconds_per_gigabyte);
}
