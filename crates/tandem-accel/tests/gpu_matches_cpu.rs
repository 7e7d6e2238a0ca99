//! On a machine with a GPU: GPU output equals CPU output byte for byte, on fresh random inputs,
//! for every service, sizes from one 4 KiB sector to 1 GiB and Reed-Solomon shapes 2+2 to
//! 16+4. Without a GPU it says so and passes (CI proves the CPU path elsewhere).
//! `TANDEM_GPU_TEST_MAXIMUM_BYTES` lowers the largest size.

use std::time::{SystemTime, UNIX_EPOCH};
use tandem_accel::cuda::{CudaEngine, CudaSystem};
use tandem_accel::engine::{CpuEngine, Engine, Sectors};
use tandem_accel::pool::HostBuffer;
use tandem_accel::{Direction, ReedSolomon, XtsKey, SECTOR_SIZE_BYTES};

fn fill_random(buffer: &mut [u8], seed: &mut u64) {
    for chunk in buffer.chunks_mut(8) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let bytes = seed.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn gpu_output_equals_cpu_output() {
    let system = match CudaSystem::open() {
        Ok(system) => system,
        Err(reason) if reason.is_no_gpu() => {
            println!("skipped: no GPU engine ({reason})");
            return;
        }
        Err(error) => panic!("a GPU is present but the GPU engine did not open: {error}"),
    };
    println!("{}", system.describe());
    let gpu = CudaEngine::new(&system);
    let cpu = CpuEngine::new(0);
    let maximum: usize =
        std::env::var("TANDEM_GPU_TEST_MAXIMUM_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(1 << 30);
    let mut seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    println!("random seed {seed:#x}");
    let mut sizes: Vec<usize> =
        vec![4096, 8192, 12288, 65536, 1 << 20, (3 << 20) + 4096, 64 << 20, (64 << 20) + 8192, 256 << 20, 1 << 30];
    sizes.retain(|&size| size <= maximum);
    let mut checks = 0;

    for &size in &sizes {
        let mut data = HostBuffer::allocate(Some(&system), size);
        fill_random(&mut data, &mut seed);
        // CRC32C over 4 KiB blocks and over the whole buffer.
        let blocks = size / SECTOR_SIZE_BYTES;
        let mut gpu_sums = vec![0u32; blocks];
        let mut cpu_sums = vec![0u32; blocks];
        gpu.crc32c_blocks(&data, SECTOR_SIZE_BYTES, &mut gpu_sums).unwrap();
        cpu.crc32c_blocks(&data, SECTOR_SIZE_BYTES, &mut cpu_sums).unwrap();
        assert_eq!(gpu_sums, cpu_sums, "crc32c blocks, {size} bytes");
        let start = seed as u32;
        assert_eq!(
            gpu.crc32c(start, &data[..size - 5]).unwrap(),
            cpu.crc32c(start, &data[..size - 5]).unwrap(),
            "crc32c buffer {size}"
        );
        println!("ok crc32c: {blocks} blocks of 4 KiB and the {} byte buffer", size - 5);
        checks += 2;

        // AES-256-XTS both directions, consecutive and listed sector numbers.
        let mut key_bytes = [0u8; 64];
        fill_random(&mut key_bytes, &mut seed);
        let key = XtsKey::new(&key_bytes);
        let first = seed >> 8;
        let original = data.to_vec();
        let mut on_cpu = original.clone();
        cpu.xts(&key, Direction::Encrypt, Sectors::Consecutive(first), &mut on_cpu).unwrap();
        gpu.xts(&key, Direction::Encrypt, Sectors::Consecutive(first), &mut data).unwrap();
        if let Some(at) = first_difference(&data, &on_cpu) {
            panic!("xts encrypt differs at byte {at} of {size} (sector {})", at / SECTOR_SIZE_BYTES);
        }
        gpu.xts(&key, Direction::Decrypt, Sectors::Consecutive(first), &mut data).unwrap();
        assert!(first_difference(&data, &original).is_none(), "xts decrypt on GPU does not invert, {size}");
        let list: Vec<u64> = (0..blocks as u64).map(|i| (seed.rotate_left(i as u32 % 64)) ^ (i * 7919)).collect();
        let mut on_cpu = original.clone();
        cpu.xts(&key, Direction::Decrypt, Sectors::List(&list), &mut on_cpu).unwrap();
        gpu.xts(&key, Direction::Decrypt, Sectors::List(&list), &mut data).unwrap();
        assert!(first_difference(&data, &on_cpu).is_none(), "xts decrypt with sector list differs, {size}");
        println!("ok aes-256-xts: {blocks} sectors, encrypt+decrypt, consecutive from {first:#x} and listed");
        checks += 3;
    }

    let shapes = [(2usize, 2usize), (3, 2), (4, 2), (6, 3), (8, 2), (8, 3), (10, 4), (12, 4), (16, 4)];
    for &(k, m) in &shapes {
        let code = ReedSolomon::new(k, m).unwrap();
        for &stripe in &sizes {
            // Shards of odd length too, so the CPU tail path joins the GPU body.
            let shard_bytes = (stripe / k).max(16) + if stripe < (1 << 20) { 5 } else { 0 };
            let data: Vec<HostBuffer> = (0..k)
                .map(|_| {
                    let mut shard = HostBuffer::allocate(Some(&system), shard_bytes);
                    fill_random(&mut shard, &mut seed);
                    shard
                })
                .collect();
            let inputs: Vec<&[u8]> = data.iter().map(|s| &s[..]).collect();
            let mut gpu_parity = vec![vec![0xEEu8; shard_bytes]; m];
            let mut cpu_parity = vec![vec![0u8; shard_bytes]; m];
            gpu.reed_solomon_encode(
                &code,
                &inputs,
                &mut gpu_parity.iter_mut().map(|s| s.as_mut_slice()).collect::<Vec<_>>(),
            )
            .unwrap();
            cpu.reed_solomon_encode(
                &code,
                &inputs,
                &mut cpu_parity.iter_mut().map(|s| s.as_mut_slice()).collect::<Vec<_>>(),
            )
            .unwrap();
            assert_eq!(gpu_parity, cpu_parity, "rs {k}+{m} encode, shard {shard_bytes}");
            // Lose m shards: a pattern that mixes data and parity, changing with the seed.
            let mut all: Vec<Vec<u8>> = data.iter().map(|s| s.to_vec()).chain(cpu_parity.iter().cloned()).collect();
            let mut present = vec![true; k + m];
            let mut lost = 0;
            let mut cursor = (seed as usize) % (k + m);
            while lost < m {
                if present[cursor] {
                    present[cursor] = false;
                    all[cursor].fill(0xAA);
                    lost += 1;
                }
                cursor = (cursor + k / 2 + 1) % (k + m);
            }
            let mut views: Vec<&mut [u8]> = all.iter_mut().map(|s| s.as_mut_slice()).collect();
            gpu.reed_solomon_reconstruct(&code, &mut views, &present).unwrap();
            for index in 0..k + m {
                let expected: &[u8] = if index < k { &data[index] } else { &cpu_parity[index - k] };
                assert!(all[index] == expected, "rs {k}+{m} reconstruct shard {index}, shard {shard_bytes}");
            }
            let missing: Vec<usize> = (0..k + m).filter(|&i| !present[i]).collect();
            println!("ok rs {k}+{m}: shards of {shard_bytes} bytes, encode and rebuild of {missing:?}");
            checks += 2;
            if stripe >= 256 << 20 && k != 8 {
                break; // the largest stripes only for RAID-6 8+2, to keep the run short
            }
        }
    }
    println!("gpu_output_equals_cpu_output: {checks} comparisons, all byte-identical");
}
