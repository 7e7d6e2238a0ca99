//! Issue 8, "Trust in the cipher": our AES-256-XTS (every CPU path, the CPU engine, the
//! runtime, and the CUDA engine where a GPU is present) against an audited implementation,
//! RustCrypto's `aes` + `xts-mode`, over random keys, sector numbers and lengths, in both
//! directions. Seeded: each seed is printed; `TANDEM_SEED=N` runs that seed alone.
//!
//! What ours claims, and so what is checked: AES-256 only (64-byte keys); a data unit is any
//! whole number of 16-byte blocks for the core functions and whole 4 KiB sectors for the
//! engines; no ciphertext stealing (other lengths are refused, checked at the end); the tweak
//! of a unit is its 64-bit sector number, and consecutive sector numbers wrap at u64::MAX.
//! Comparisons are `assert!(a == b)` so that a failure names the case instead of printing
//! kilobytes of ciphertext.

use std::sync::Arc;

use aes::cipher::{generic_array::GenericArray, KeyInit};
use aes::Aes256;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tandem_accel::cuda::{CudaEngine, CudaSystem};
use tandem_accel::engine::{CpuEngine, Engine, Sectors};
use tandem_accel::runtime::{Accelerator, Mode, Request, Response, RuntimeConfig};
use tandem_accel::xts::{best_implementation, process_unit_with, XtsImplementation, AES_BLOCK_BYTES};
use tandem_accel::{Direction, HostBuffer, XtsKey, SECTOR_SIZE_BYTES};
use xts_mode::Xts128;

/// Random data units checked per seed and implementation.
const UNITS_PER_SEED: usize = 250;
/// Engine calls per seed (each up to `ENGINE_SECTORS_MAX` sectors).
const ENGINE_CALLS_PER_SEED: usize = 12;
/// Enough sectors that the CPU engine splits a call over threads (256 KiB a thread).
const ENGINE_SECTORS_MAX: usize = 160;

/// The seeds to run: `TANDEM_SEED` alone when set (to repeat a failure), else `default`.
fn seeds(default: impl IntoIterator<Item = u64>) -> Vec<u64> {
    match std::env::var("TANDEM_SEED") {
        Ok(seed) => vec![seed.parse().expect("TANDEM_SEED is a number")],
        Err(_) => default.into_iter().collect(),
    }
}

/// The audited reference: one data unit numbered `sector`, in place.
fn reference(key: &[u8; 64], direction: Direction, sector: u64, unit: &mut [u8]) {
    let data = Aes256::new(GenericArray::from_slice(&key[..32]));
    let tweak = Aes256::new(GenericArray::from_slice(&key[32..]));
    let xts = Xts128::new(data, tweak);
    let tweak_block = (sector as u128).to_le_bytes();
    match direction {
        Direction::Encrypt => xts.encrypt_sector(unit, tweak_block),
        Direction::Decrypt => xts.decrypt_sector(unit, tweak_block),
    }
}

/// Every CPU path this machine can run.
fn implementations() -> Vec<XtsImplementation> {
    let mut list = vec![XtsImplementation::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("aes") {
            list.push(XtsImplementation::AesNi);
        }
    }
    if best_implementation() == XtsImplementation::Vaes512 {
        list.push(XtsImplementation::Vaes512);
    }
    list
}

/// Random key; now and then a degenerate one (all zero, both halves equal), which XTS does
/// not forbid computing with.
fn random_key(rng: &mut StdRng) -> [u8; 64] {
    let mut key = [0u8; 64];
    match rng.gen_range(0..16) {
        0 => {}
        1 => {
            rng.fill(&mut key[..32]);
            key.copy_within(..32, 32);
        }
        _ => rng.fill(&mut key[..]),
    }
    key
}

/// Sector numbers from the whole u64 range, weighted to the edges: small ones, ones whose
/// low 32 bits are all set, and the last few before u64::MAX.
fn random_sector(rng: &mut StdRng) -> u64 {
    match rng.gen_range(0..5) {
        0 => rng.gen_range(0..1024),
        1 => u64::MAX - rng.gen_range(0..64),
        2 => (rng.gen::<u32>() as u64) << 32 | 0xFFFF_FFFF,
        _ => rng.gen(),
    }
}

/// A unit length in bytes, a whole number of blocks: one block, the lengths around the
/// 8- and 16-block steps of the AES-NI and VAES paths, 512-byte and 4 KiB units, or any.
fn random_unit_bytes(rng: &mut StdRng) -> usize {
    let blocks = match rng.gen_range(0..6) {
        0 => 1,
        1 => 8 + rng.gen_range(0..3) - 1,
        2 => 16 * rng.gen_range(1..4) + rng.gen_range(0..3) - 1,
        3 => 32,
        4 => 256,
        _ => rng.gen_range(1..=1024),
    };
    blocks * AES_BLOCK_BYTES
}

fn random_bytes(rng: &mut StdRng, bytes: usize) -> Vec<u8> {
    let mut data = vec![0u8; bytes];
    rng.fill(&mut data[..]);
    data
}

#[test]
fn cpu_paths_match_reference() {
    let implementations = implementations();
    println!("implementations {implementations:?}");
    for seed in seeds(0..8) {
        println!("seed {seed} (TANDEM_SEED={seed} repeats it)");
        let mut rng = StdRng::seed_from_u64(seed);
        for iteration in 0..UNITS_PER_SEED {
            let key_bytes = random_key(&mut rng);
            let key = XtsKey::new(&key_bytes);
            let sector = random_sector(&mut rng);
            let unit_bytes = random_unit_bytes(&mut rng);
            let plain = random_bytes(&mut rng, unit_bytes);
            // Decryption is checked on bytes that no encryption produced, too.
            let other = random_bytes(&mut rng, unit_bytes);
            let mut expected_cipher = plain.clone();
            reference(&key_bytes, Direction::Encrypt, sector, &mut expected_cipher);
            let mut expected_plain = other.clone();
            reference(&key_bytes, Direction::Decrypt, sector, &mut expected_plain);
            for &implementation in &implementations {
                let what = format!(
                    "seed {seed} iteration {iteration}: {implementation:?}, sector {sector:#x}, {unit_bytes} bytes"
                );
                let mut buffer = plain.clone();
                process_unit_with(implementation, &key, Direction::Encrypt, sector, &mut buffer);
                assert!(buffer == expected_cipher, "{what}: encryption differs from the reference");
                process_unit_with(implementation, &key, Direction::Decrypt, sector, &mut buffer);
                assert!(buffer == plain, "{what}: round trip lost the plaintext");
                let mut buffer = other.clone();
                process_unit_with(implementation, &key, Direction::Decrypt, sector, &mut buffer);
                assert!(buffer == expected_plain, "{what}: decryption differs from the reference");
            }
        }
    }
}

/// One engine call over `sectors` against the reference, sector by sector, both directions.
fn check_engine_call(engine: &dyn Engine, rng: &mut StdRng, what: &str) {
    let key_bytes = random_key(rng);
    let key = XtsKey::new(&key_bytes);
    let count = rng.gen_range(1..=ENGINE_SECTORS_MAX);
    let first = random_sector(rng);
    let list: Vec<u64> = (0..count).map(|_| random_sector(rng)).collect();
    let consecutive = rng.gen_bool(0.5);
    let sectors = if consecutive { Sectors::Consecutive(first) } else { Sectors::List(&list) };
    let plain = random_bytes(rng, count * SECTOR_SIZE_BYTES);
    let mut expected = plain.clone();
    for (index, unit) in expected.chunks_exact_mut(SECTOR_SIZE_BYTES).enumerate() {
        reference(&key_bytes, Direction::Encrypt, sectors.number(index), unit);
    }
    let what = format!("{what}: {} on {count} sectors ({sectors:?})", engine.name());
    let mut buffer = plain.clone();
    engine.xts(&key, Direction::Encrypt, sectors, &mut buffer).unwrap();
    assert!(buffer == expected, "{what}: encryption differs from the reference");
    // Decrypt what the reference encrypted: each direction checked on its own.
    engine.xts(&key, Direction::Decrypt, sectors, &mut expected).unwrap();
    assert!(expected == plain, "{what}: decryption of the reference ciphertext differs");
}

#[test]
fn engines_match_reference() {
    let mut engines: Vec<Box<dyn Engine>> = vec![Box::new(CpuEngine::new(1)), Box::new(CpuEngine::new(0))];
    match CudaSystem::open() {
        Ok(system) => engines.push(Box::new(CudaEngine::new(&system))),
        Err(reason) if reason.is_no_gpu() => println!("no GPU engine to check ({reason})"),
        Err(error) => panic!("a GPU is present but the GPU engine did not open: {error}"),
    }
    for seed in seeds(0..4) {
        println!("seed {seed} (TANDEM_SEED={seed} repeats it)");
        let mut rng = StdRng::seed_from_u64(seed);
        for call in 0..ENGINE_CALLS_PER_SEED {
            for engine in &engines {
                check_engine_call(engine.as_ref(), &mut rng, &format!("seed {seed} call {call}"));
            }
        }
    }
}

/// Small requests through the runtime's queue are merged into batches with a sector number
/// per sector: each still matches the reference under its own sector numbers.
#[test]
fn runtime_requests_match_reference() {
    let accelerator = Accelerator::new(RuntimeConfig {
        batch_latency: std::time::Duration::from_millis(5),
        ..RuntimeConfig::default()
    });
    for seed in seeds(0..2) {
        println!("seed {seed} (TANDEM_SEED={seed} repeats it)");
        let mut rng = StdRng::seed_from_u64(seed);
        let key_bytes = random_key(&mut rng);
        let key = Arc::new(XtsKey::new(&key_bytes));
        let mut pending = Vec::new();
        for _ in 0..32 {
            let direction = if rng.gen_bool(0.5) { Direction::Encrypt } else { Direction::Decrypt };
            let first_sector = random_sector(&mut rng);
            let sectors = rng.gen_range(1..=4);
            let input = random_bytes(&mut rng, sectors * SECTOR_SIZE_BYTES);
            let mut expected = input.clone();
            for (index, unit) in expected.chunks_exact_mut(SECTOR_SIZE_BYTES).enumerate() {
                reference(&key_bytes, direction, first_sector.wrapping_add(index as u64), unit);
            }
            let completion = accelerator.submit(Request::Xts {
                key: Arc::clone(&key),
                direction,
                first_sector,
                data: HostBuffer::from_vec(input),
            });
            pending.push((completion, expected, direction, first_sector));
        }
        for (completion, expected, direction, first_sector) in pending {
            let Response::Data(data) = completion.wait().unwrap() else { panic!("XTS answers with data") };
            assert!(data[..] == expected[..], "seed {seed}: {direction:?} from sector {first_sector:#x} differs");
        }
        let mut buffer = random_bytes(&mut rng, 3 * SECTOR_SIZE_BYTES);
        let plain = buffer.clone();
        let first_sector = random_sector(&mut rng);
        accelerator.xts_encrypt(&key, first_sector, &mut buffer).unwrap();
        accelerator.xts_decrypt(&key, first_sector, &mut buffer).unwrap();
        assert!(buffer == plain, "seed {seed}: blocking round trip from sector {first_sector:#x}");
    }
}

/// `xts_scattered`, as an encrypted volume's batches use it: several buffers of whole sectors,
/// each from its own first sector, in one request. On the GPU (`Mode::Gpu` where one is found)
/// the pieces are gathered into one transfer with a sector list and scattered back; every piece
/// must still match the reference under its own sector numbers, both directions.
#[test]
fn scattered_requests_match_reference() {
    let mode = match CudaSystem::open() {
        Ok(_) => Mode::Gpu,
        Err(reason) if reason.is_no_gpu() => Mode::Cpu,
        Err(error) => panic!("a GPU is present but the GPU engine did not open: {error}"),
    };
    let accelerator = Accelerator::new(RuntimeConfig { mode, ..RuntimeConfig::default() });
    println!("scattered requests on {}", accelerator.describe());
    for seed in seeds(0..4) {
        println!("seed {seed} (TANDEM_SEED={seed} repeats it)");
        let mut rng = StdRng::seed_from_u64(seed);
        for call in 0..ENGINE_CALLS_PER_SEED {
            let key_bytes = random_key(&mut rng);
            let key = XtsKey::new(&key_bytes);
            let direction = if rng.gen_bool(0.5) { Direction::Encrypt } else { Direction::Decrypt };
            let pieces_count = rng.gen_range(1..=8);
            let mut buffers: Vec<(u64, Vec<u8>)> = (0..pieces_count)
                .map(|_| {
                    let sectors = rng.gen_range(1..=ENGINE_SECTORS_MAX / 8);
                    (random_sector(&mut rng), random_bytes(&mut rng, sectors * SECTOR_SIZE_BYTES))
                })
                .collect();
            let expected: Vec<Vec<u8>> = buffers
                .iter()
                .map(|(first, data)| {
                    let mut expected = data.clone();
                    for (index, unit) in expected.chunks_exact_mut(SECTOR_SIZE_BYTES).enumerate() {
                        reference(&key_bytes, direction, first.wrapping_add(index as u64), unit);
                    }
                    expected
                })
                .collect();
            let mut pieces: Vec<(u64, &mut [u8])> =
                buffers.iter_mut().map(|(first, data)| (*first, &mut data[..])).collect();
            accelerator.xts_scattered(&key, direction, &mut pieces).unwrap();
            for (index, ((first, data), expected)) in buffers.iter().zip(&expected).enumerate() {
                assert!(
                    data == expected,
                    "seed {seed} call {call}: piece {index} of {pieces_count} from sector {first:#x} differs ({direction:?})"
                );
            }
        }
    }
}

/// No ciphertext stealing: lengths that are not whole blocks (core) or whole sectors
/// (engines) are refused, never processed into something the reference would not give.
#[test]
fn unsupported_lengths_are_refused() {
    let key = XtsKey::new(&[3u8; 64]);
    let engine = CpuEngine::new(1);
    for bytes in [AES_BLOCK_BYTES, SECTOR_SIZE_BYTES - AES_BLOCK_BYTES, SECTOR_SIZE_BYTES + AES_BLOCK_BYTES] {
        let mut data = vec![0u8; bytes];
        assert!(engine.xts(&key, Direction::Encrypt, Sectors::Consecutive(0), &mut data).is_err(), "{bytes} bytes");
    }
    for bytes in [0, 1, 15, 17, 31, 4095] {
        let outcome = std::panic::catch_unwind(|| {
            let mut data = vec![0u8; bytes];
            process_unit_with(XtsImplementation::Portable, &key, Direction::Encrypt, 0, &mut data);
        });
        assert!(outcome.is_err(), "a {bytes}-byte unit was accepted");
    }
}
