//! The engine trait and the CPU engine.
//!
//! An engine runs one service call synchronously on borrowed memory. The runtime
//! ([`crate::runtime`]) adds queues, merging, hybrid dispatch and completions on top.

use crate::crc;
use crate::error::{AccelError, Result};
use crate::reed_solomon::{self, ReedSolomon};
use crate::xts::{self, Direction, XtsKey, SECTOR_SIZE_BYTES};

/// Which kind of engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Cpu,
    Cuda,
}

/// The sector numbers (XTS tweaks) of the sectors in a buffer.
#[derive(Clone, Copy, Debug)]
pub enum Sectors<'a> {
    /// Sector i of the buffer has number `first + i`.
    Consecutive(u64),
    /// Sector i of the buffer has number `list[i]` (merged batches of unrelated requests).
    List(&'a [u64]),
}

impl Sectors<'_> {
    pub fn number(&self, index: usize) -> u64 {
        match self {
            Sectors::Consecutive(first) => first.wrapping_add(index as u64),
            Sectors::List(list) => list[index],
        }
    }
}

/// A compute engine. Every method gives the same bytes on every engine.
pub trait Engine: Send + Sync {
    fn name(&self) -> String;
    fn kind(&self) -> EngineKind;
    /// CRC32C (from 0) of each `block_bytes` block of `data` into `checksums`.
    fn crc32c_blocks(&self, data: &[u8], block_bytes: usize, checksums: &mut [u32]) -> Result<()>;
    /// CRC32C of a whole buffer continuing from `crc`.
    fn crc32c(&self, crc: u32, data: &[u8]) -> Result<u32>;
    /// AES-256-XTS of whole 4 KiB sectors in place.
    fn xts(&self, key: &XtsKey, direction: Direction, sectors: Sectors<'_>, data: &mut [u8]) -> Result<()>;
    /// Parity shards from data shards; all shards the same length.
    fn reed_solomon_encode(&self, code: &ReedSolomon, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<()>;
    /// Rebuild the shards whose `present` entry is false, in place, from the others.
    fn reed_solomon_reconstruct(&self, code: &ReedSolomon, shards: &mut [&mut [u8]], present: &[bool]) -> Result<()>;
}

pub(crate) fn check_blocks(data_bytes: usize, block_bytes: usize, checksums: usize) -> Result<()> {
    if block_bytes == 0 || !data_bytes.is_multiple_of(block_bytes) || data_bytes / block_bytes != checksums {
        return Err(AccelError::InvalidArgument(format!(
            "{data_bytes} bytes are not {checksums} blocks of {block_bytes} bytes"
        )));
    }
    Ok(())
}

pub(crate) fn check_sectors(sectors: &Sectors<'_>, data_bytes: usize) -> Result<()> {
    if !data_bytes.is_multiple_of(SECTOR_SIZE_BYTES) {
        return Err(AccelError::InvalidArgument(format!("{data_bytes} bytes is not a whole number of 4 KiB sectors")));
    }
    if let Sectors::List(list) = sectors {
        if list.len() != data_bytes / SECTOR_SIZE_BYTES {
            return Err(AccelError::InvalidArgument(format!(
                "{} sector numbers for {} sectors",
                list.len(),
                data_bytes / SECTOR_SIZE_BYTES
            )));
        }
    }
    Ok(())
}

pub(crate) fn check_shards(
    code: &ReedSolomon,
    data: usize,
    parity: usize,
    lengths: impl Iterator<Item = usize>,
) -> Result<usize> {
    if data != code.data_shards() || parity != code.parity_shards() {
        return Err(AccelError::InvalidArgument(format!(
            "{data}+{parity} shards given for a {}+{} code",
            code.data_shards(),
            code.parity_shards()
        )));
    }
    let mut shard_bytes = None;
    for length in lengths {
        if *shard_bytes.get_or_insert(length) != length {
            return Err(AccelError::InvalidArgument("shards differ in length".into()));
        }
    }
    Ok(shard_bytes.unwrap_or(0))
}

/// The CPU engine: SIMD kernels on up to `threads` cores.
pub struct CpuEngine {
    threads: usize,
}

/// Work below this size per thread is not split further: spawning a thread costs tens of
/// microseconds, which only pays off on a few hundred kilobytes.
const MINIMUM_BYTES_PER_THREAD: usize = 256 * 1024;

impl CpuEngine {
    /// `threads` = 0 means every core.
    pub fn new(threads: usize) -> Self {
        let threads =
            if threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { threads };
        Self { threads }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    fn thread_count(&self, bytes: usize) -> usize {
        (bytes / MINIMUM_BYTES_PER_THREAD).clamp(1, self.threads)
    }
}

/// Split `items` units into `parts` nearly equal contiguous ranges.
fn ranges(items: usize, parts: usize) -> Vec<(usize, usize)> {
    let parts = parts.max(1).min(items.max(1));
    (0..parts).map(|part| (items * part / parts, items * (part + 1) / parts)).collect()
}

/// Split every output shard at the same byte offsets so threads own disjoint pieces.
fn split_shards<'a>(shards: &'a mut [&mut [u8]], cuts: &[(usize, usize)]) -> Vec<Vec<&'a mut [u8]>> {
    let mut per_part: Vec<Vec<&'a mut [u8]>> = cuts.iter().map(|_| Vec::with_capacity(shards.len())).collect();
    for shard in shards.iter_mut() {
        let mut rest: &'a mut [u8] = unsafe {
            // SAFETY: re-borrow for 'a; `shards` is borrowed mutably for 'a by this function.
            std::slice::from_raw_parts_mut(shard.as_mut_ptr(), shard.len())
        };
        let mut consumed = 0;
        for (part, &(start, end)) in cuts.iter().enumerate() {
            let (_, tail) = rest.split_at_mut(start - consumed);
            let (piece, after) = tail.split_at_mut(end - start);
            per_part[part].push(piece);
            rest = after;
            consumed = end;
        }
    }
    per_part
}

impl CpuEngine {
    /// Apply a coefficient matrix to shards across threads (encode and reconstruct both).
    pub fn apply_matrix(&self, matrix: &[u8], inputs: &[&[u8]], outputs: &mut [&mut [u8]], shard_bytes: usize) {
        let total = shard_bytes * (inputs.len() + outputs.len());
        let threads = self.thread_count(total);
        if threads == 1 {
            reed_solomon::apply_matrix(matrix, inputs, outputs, 0, shard_bytes);
            return;
        }
        // Cut on 64-byte boundaries so every thread but the last runs whole vectors.
        let vectors = shard_bytes.div_ceil(64);
        let cuts: Vec<(usize, usize)> = ranges(vectors, threads)
            .into_iter()
            .map(|(start, end)| ((start * 64).min(shard_bytes), (end * 64).min(shard_bytes)))
            .collect();
        let parts = split_shards(outputs, &cuts);
        std::thread::scope(|scope| {
            for (mut part_outputs, &(start, end)) in parts.into_iter().zip(&cuts) {
                let part_inputs: Vec<&[u8]> = inputs.iter().map(|shard| &shard[start..end]).collect();
                scope.spawn(move || {
                    reed_solomon::apply_matrix(matrix, &part_inputs, &mut part_outputs, 0, end - start);
                });
            }
        });
    }
}

impl Engine for CpuEngine {
    fn name(&self) -> String {
        format!(
            "cpu ({} threads; crc32c {}, xts {:?}, reed-solomon {})",
            self.threads,
            if crc::folding_available() {
                "vpclmulqdq-avx512"
            } else if crc::hardware_available() {
                "sse4.2+pclmul"
            } else {
                "portable"
            },
            xts::best_implementation(),
            if reed_solomon::gfni_available() { "gfni-avx512" } else { "portable" }
        )
    }

    fn kind(&self) -> EngineKind {
        EngineKind::Cpu
    }

    fn crc32c_blocks(&self, data: &[u8], block_bytes: usize, checksums: &mut [u32]) -> Result<()> {
        check_blocks(data.len(), block_bytes, checksums.len())?;
        let blocks = checksums.len();
        let threads = self.thread_count(data.len());
        if threads == 1 {
            for (checksum, block) in checksums.iter_mut().zip(data.chunks_exact(block_bytes)) {
                *checksum = crc::crc32c(0, block);
            }
            return Ok(());
        }
        let cuts = ranges(blocks, threads);
        std::thread::scope(|scope| {
            let mut rest = &mut checksums[..];
            for &(start, end) in &cuts {
                let (mine, after) = rest.split_at_mut(end - start);
                rest = after;
                let blocks_data = &data[start * block_bytes..end * block_bytes];
                scope.spawn(move || {
                    for (checksum, block) in mine.iter_mut().zip(blocks_data.chunks_exact(block_bytes)) {
                        *checksum = crc::crc32c(0, block);
                    }
                });
            }
        });
        Ok(())
    }

    fn crc32c(&self, crc_value: u32, data: &[u8]) -> Result<u32> {
        let threads = self.thread_count(data.len());
        if threads == 1 {
            return Ok(crc::crc32c(crc_value, data));
        }
        let cuts = ranges(data.len(), threads);
        let parts: Vec<u32> = std::thread::scope(|scope| {
            let handles: Vec<_> =
                cuts.iter().map(|&(start, end)| scope.spawn(move || crc::crc32c(0, &data[start..end]))).collect();
            handles.into_iter().map(|handle| handle.join().expect("CRC worker panicked")).collect()
        });
        // Join the pieces left to right, starting from the caller's value.
        let mut value = crc_value;
        for (part, &(start, end)) in parts.iter().zip(&cuts) {
            value = crc::combine(value, *part, (end - start) as u64);
        }
        Ok(value)
    }

    fn xts(&self, key: &XtsKey, direction: Direction, sectors: Sectors<'_>, data: &mut [u8]) -> Result<()> {
        check_sectors(&sectors, data.len())?;
        let count = data.len() / SECTOR_SIZE_BYTES;
        let implementation = xts::best_implementation();
        let threads = self.thread_count(data.len());
        let cuts = ranges(count, threads);
        let run = |first: usize, piece: &mut [u8]| {
            for (index, unit) in piece.chunks_exact_mut(SECTOR_SIZE_BYTES).enumerate() {
                xts::process_unit_with(implementation, key, direction, sectors.number(first + index), unit);
            }
        };
        if cuts.len() <= 1 {
            run(0, data);
            return Ok(());
        }
        std::thread::scope(|scope| {
            let mut rest = &mut data[..];
            for &(start, end) in &cuts {
                let (mine, after) = rest.split_at_mut((end - start) * SECTOR_SIZE_BYTES);
                rest = after;
                let run = &run;
                scope.spawn(move || run(start, mine));
            }
        });
        Ok(())
    }

    fn reed_solomon_encode(&self, code: &ReedSolomon, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<()> {
        let shard_bytes = check_shards(
            code,
            data.len(),
            parity.len(),
            data.iter().map(|s| s.len()).chain(parity.iter().map(|s| s.len())),
        )?;
        self.apply_matrix(code.parity_matrix(), data, parity, shard_bytes);
        Ok(())
    }

    fn reed_solomon_reconstruct(&self, code: &ReedSolomon, shards: &mut [&mut [u8]], present: &[bool]) -> Result<()> {
        let k = code.data_shards();
        let shard_bytes = check_shards(code, k, shards.len().saturating_sub(k), shards.iter().map(|s| s.len()))?;
        let plan = code.reconstruction_plan(present)?;
        if plan.missing.is_empty() {
            return Ok(());
        }
        let mut inputs: Vec<&[u8]> = Vec::with_capacity(k);
        let mut outputs: Vec<&mut [u8]> = Vec::with_capacity(plan.missing.len());
        for (index, shard) in shards.iter_mut().enumerate() {
            if plan.sources.contains(&index) {
                inputs.push(&shard[..]);
            } else if plan.missing.contains(&index) {
                outputs.push(&mut shard[..]);
            }
        }
        self.apply_matrix(&plan.matrix, &inputs, &mut outputs, shard_bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(length: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..length)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u8
            })
            .collect()
    }

    #[test]
    fn threaded_results_equal_single_threaded() {
        let single = CpuEngine::new(1);
        let many = CpuEngine::new(4);
        let data = random(4096 * 700, 5);
        let mut checksums_single = vec![0u32; 700];
        let mut checksums_many = vec![0u32; 700];
        single.crc32c_blocks(&data, 4096, &mut checksums_single).unwrap();
        many.crc32c_blocks(&data, 4096, &mut checksums_many).unwrap();
        assert_eq!(checksums_single, checksums_many);
        assert_eq!(many.crc32c(7, &data[..2_000_001]).unwrap(), crc::crc32c(7, &data[..2_000_001]));

        let key = XtsKey::new(&[9u8; 64].map(|v| v ^ 0x5C));
        let mut a = data.clone();
        let mut b = data.clone();
        single.xts(&key, Direction::Encrypt, Sectors::Consecutive(40), &mut a).unwrap();
        many.xts(&key, Direction::Encrypt, Sectors::Consecutive(40), &mut b).unwrap();
        assert_eq!(a, b);
        let list: Vec<u64> = (0..700).map(|i| 40 + i).collect();
        many.xts(&key, Direction::Decrypt, Sectors::List(&list), &mut b).unwrap();
        assert_eq!(b, data);

        let code = ReedSolomon::new(8, 3).unwrap();
        let shard_bytes = 300_001;
        let shards: Vec<Vec<u8>> = (0..8).map(|i| random(shard_bytes, 100 + i)).collect();
        let inputs: Vec<&[u8]> = shards.iter().map(|s| s.as_slice()).collect();
        let mut parity_one = vec![vec![0u8; shard_bytes]; 3];
        let mut parity_many = vec![vec![0u8; shard_bytes]; 3];
        single
            .reed_solomon_encode(
                &code,
                &inputs,
                &mut parity_one.iter_mut().map(|s| s.as_mut_slice()).collect::<Vec<_>>(),
            )
            .unwrap();
        many.reed_solomon_encode(
            &code,
            &inputs,
            &mut parity_many.iter_mut().map(|s| s.as_mut_slice()).collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(parity_one, parity_many);

        let mut all: Vec<Vec<u8>> = shards.iter().chain(parity_one.iter()).cloned().collect();
        let mut present = vec![true; 11];
        for lost in [0usize, 5, 9] {
            all[lost].fill(0);
            present[lost] = false;
        }
        let mut views: Vec<&mut [u8]> = all.iter_mut().map(|s| s.as_mut_slice()).collect();
        many.reed_solomon_reconstruct(&code, &mut views, &present).unwrap();
        assert_eq!(all[0], shards[0]);
        assert_eq!(all[5], shards[5]);
        assert_eq!(all[9], parity_one[1]);
    }

    #[test]
    fn bad_arguments_are_errors() {
        let engine = CpuEngine::new(2);
        let key = XtsKey::new(&[1u8; 64]);
        assert!(engine.xts(&key, Direction::Encrypt, Sectors::Consecutive(0), &mut [0u8; 100]).is_err());
        assert!(engine.xts(&key, Direction::Encrypt, Sectors::List(&[1, 2]), &mut [0u8; 4096]).is_err());
        assert!(engine.crc32c_blocks(&[0u8; 4096], 4096, &mut [0u32; 2]).is_err());
        let code = ReedSolomon::new(2, 2).unwrap();
        let a = [0u8; 10];
        let b = [0u8; 11];
        let mut p = [0u8; 10];
        let mut q = [0u8; 10];
        assert!(engine.reed_solomon_encode(&code, &[&a, &b], &mut [&mut p, &mut q]).is_err());
    }
}
