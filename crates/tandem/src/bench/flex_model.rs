//! What a file must hold after `bench flex`'s inserts and collapses, without holding its bytes:
//! the file is a list of runs, each a stretch of one source (the zeros the file started with, or
//! the bytes of one insert, which `pattern_byte` makes again on demand). The runs sit in chunks
//! of at most `CHUNK_RUNS_MAX`, each with its byte count, so an edit costs a walk over the
//! chunks and a shift inside one chunk instead of a shift of the whole list: 100,000 inserts
//! stay at a few microseconds each, and an 8 GiB file costs a few bytes per run.
//!
//! `verify` compares a system's bytes with the model: all of them up to `FULL_CHECK_BYTES_MAX`,
//! beyond that a window around every run boundary (where a wrong shift or a lost record shows)
//! and random ranges between them.

use rand::{Rng, SeedableRng};

/// Source 0: the zeros the file was made of.
pub const ZEROS: u64 = 0;
/// Runs per chunk before it is split in two.
const CHUNK_RUNS_MAX: usize = 512;
/// Files up to this size are compared byte for byte.
pub const FULL_CHECK_BYTES_MAX: u64 = 256 << 20;
/// Bytes compared on each side of a run boundary in a sampled check.
const BOUNDARY_WINDOW_BYTES: u64 = 128;
/// Run boundaries a sampled check looks at, spread evenly over the file.
const BOUNDARIES_CHECKED_MAX: usize = 20_000;
/// Random ranges of `RANDOM_RANGE_BYTES` a sampled check compares besides the boundaries.
const RANDOM_RANGES: usize = 64;
const RANDOM_RANGE_BYTES: u64 = 64 << 10;
/// Bytes read from a system at a time.
const READ_PIECE_BYTES: u64 = 1 << 20;

/// The byte at `index` of the data inserted by operation number `operation` (sources count
/// from 1: source k holds operation k − 1's bytes). Cheap, and different for every operation
/// and position, so that a shifted or swapped run does not compare equal.
pub fn pattern_byte(operation: u64, index: u64) -> u8 {
    let mut mixed =
        operation.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
    mixed ^= mixed >> 31;
    mixed = mixed.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (mixed >> 56) as u8
}

/// Fills `buffer` with operation `operation`'s bytes from `start` on.
pub fn fill_pattern(operation: u64, start: u64, buffer: &mut [u8]) {
    for (index, byte) in buffer.iter_mut().enumerate() {
        *byte = pattern_byte(operation, start + index as u64);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    /// `ZEROS`, or operation number + 1.
    source: u64,
    /// Where in the source the run starts.
    start: u64,
    length: u64,
}

#[derive(Debug, Default)]
struct Chunk {
    runs: Vec<Run>,
    bytes: u64,
}

#[derive(Debug)]
pub struct Model {
    chunks: Vec<Chunk>,
    size: u64,
}

impl Model {
    /// A file of `bytes` zeros.
    pub fn zeros(bytes: u64) -> Model {
        let runs = if bytes == 0 { Vec::new() } else { vec![Run { source: ZEROS, start: 0, length: bytes }] };
        Model { chunks: vec![Chunk { runs, bytes }], size: bytes }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Runs in the model (the file's fragments as the model sees them).
    pub fn run_count(&self) -> usize {
        self.chunks.iter().map(|chunk| chunk.runs.len()).sum()
    }

    /// Inserts operation `operation`'s `length` bytes at `offset` (≤ size).
    pub fn insert(&mut self, offset: u64, operation: u64, length: u64) {
        assert!(offset <= self.size, "insert at {offset} past the end {}", self.size);
        if length == 0 {
            return;
        }
        let (chunk_index, run_index) = self.split_at(offset);
        let chunk = &mut self.chunks[chunk_index];
        chunk.runs.insert(run_index, Run { source: operation + 1, start: 0, length });
        chunk.bytes += length;
        self.size += length;
        if chunk.runs.len() > CHUNK_RUNS_MAX {
            let upper = chunk.runs.split_off(chunk.runs.len() / 2);
            let upper_bytes = upper.iter().map(|run| run.length).sum::<u64>();
            chunk.bytes -= upper_bytes;
            self.chunks.insert(chunk_index + 1, Chunk { runs: upper, bytes: upper_bytes });
        }
    }

    /// Removes `length` bytes at `offset` (offset + length ≤ size).
    pub fn collapse(&mut self, offset: u64, length: u64) {
        let end = offset.checked_add(length).expect("collapse range overflows");
        assert!(end <= self.size, "collapse of {offset}+{length} past the end {}", self.size);
        let mut remaining = length;
        // Each pass removes or shortens one run; the range covers at most every run there is.
        let passes_max = self.run_count() + 2;
        for _ in 0..passes_max {
            if remaining == 0 {
                break;
            }
            let (chunk_index, run_index) = self.split_at(offset);
            let chunk = &mut self.chunks[chunk_index];
            let run = &mut chunk.runs[run_index];
            let taken = run.length.min(remaining);
            if taken == run.length {
                chunk.runs.remove(run_index);
            } else {
                run.start += taken;
                run.length -= taken;
            }
            chunk.bytes -= taken;
            remaining -= taken;
            self.size -= taken;
            if chunk.runs.is_empty() && self.chunks.len() > 1 {
                self.chunks.remove(chunk_index);
            }
        }
        assert_eq!(remaining, 0, "the collapse did not end within the runs there are");
    }

    /// Splits the run holding `offset` so that a run starts there, and returns where: the
    /// chunk, and the index of that run in it (the chunk's length when `offset` is its end,
    /// which happens only at the end of the file).
    fn split_at(&mut self, offset: u64) -> (usize, usize) {
        assert!(offset <= self.size);
        let mut chunk_start = 0;
        let last = self.chunks.len() - 1;
        for chunk_index in 0..self.chunks.len() {
            let chunk_bytes = self.chunks[chunk_index].bytes;
            if offset < chunk_start + chunk_bytes || chunk_index == last {
                let chunk = &mut self.chunks[chunk_index];
                let mut run_start = chunk_start;
                for run_index in 0..chunk.runs.len() {
                    let run = chunk.runs[run_index];
                    if offset == run_start {
                        return (chunk_index, run_index);
                    }
                    if offset < run_start + run.length {
                        let head = offset - run_start;
                        chunk.runs[run_index].length = head;
                        let tail = Run { source: run.source, start: run.start + head, length: run.length - head };
                        chunk.runs.insert(run_index + 1, tail);
                        return (chunk_index, run_index + 1);
                    }
                    run_start += run.length;
                }
                return (chunk_index, chunk.runs.len());
            }
            chunk_start += chunk_bytes;
        }
        unreachable!("the last chunk takes every offset up to the end")
    }

    /// The model's bytes at `offset..offset + buffer.len()` (inside the file).
    pub fn read(&self, offset: u64, buffer: &mut [u8]) {
        let end = offset + buffer.len() as u64;
        assert!(end <= self.size, "read of {offset}..{end} past the end {}", self.size);
        // Skip whole chunks first: a sampled check reads thousands of windows.
        let mut run_start = 0u64;
        let mut first_chunk = 0;
        while first_chunk + 1 < self.chunks.len() && run_start + self.chunks[first_chunk].bytes <= offset {
            run_start += self.chunks[first_chunk].bytes;
            first_chunk += 1;
        }
        for run in self.chunks[first_chunk..].iter().flat_map(|chunk| chunk.runs.iter()) {
            let run_end = run_start + run.length;
            if run_end > offset && run_start < end {
                let from = offset.max(run_start);
                let to = end.min(run_end);
                let target = &mut buffer[(from - offset) as usize..(to - offset) as usize];
                if run.source == ZEROS {
                    target.fill(0);
                } else {
                    fill_pattern(run.source - 1, run.start + (from - run_start), target);
                }
            }
            if run_end >= end {
                break;
            }
            run_start = run_end;
        }
    }

    /// Logical offsets where a run starts, after the first.
    fn boundaries(&self) -> Vec<u64> {
        let mut offsets = Vec::with_capacity(self.run_count());
        let mut position = 0;
        for run in self.chunks.iter().flat_map(|chunk| chunk.runs.iter()) {
            if position > 0 {
                offsets.push(position);
            }
            position += run.length;
        }
        offsets
    }

    /// The ranges a check compares: the whole file when small, else windows around the run
    /// boundaries, random ranges and the last range of the file; sorted, not overlapping.
    pub fn ranges_to_check(&self, seed: u64) -> Vec<(u64, u64)> {
        if self.size <= FULL_CHECK_BYTES_MAX {
            return (0..self.size.div_ceil(READ_PIECE_BYTES))
                .map(|piece| {
                    let start = piece * READ_PIECE_BYTES;
                    (start, (start + READ_PIECE_BYTES).min(self.size))
                })
                .collect();
        }
        let mut ranges = Vec::new();
        let boundaries = self.boundaries();
        let step = boundaries.len().div_ceil(BOUNDARIES_CHECKED_MAX).max(1);
        for boundary in boundaries.iter().step_by(step) {
            ranges.push((
                boundary.saturating_sub(BOUNDARY_WINDOW_BYTES),
                (boundary + BOUNDARY_WINDOW_BYTES).min(self.size),
            ));
        }
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        for _ in 0..RANDOM_RANGES {
            let start = rng.gen_range(0..self.size - RANDOM_RANGE_BYTES);
            ranges.push((start, start + RANDOM_RANGE_BYTES));
        }
        ranges.push((self.size - RANDOM_RANGE_BYTES, self.size));
        merge_ranges(ranges)
    }
}

/// Sorts ranges and merges those that touch or overlap.
fn merge_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Reads a system's bytes at an offset, filling the whole buffer or failing.
pub type ReadAt<'a> = dyn FnMut(u64, &mut [u8]) -> Result<(), String> + 'a;

/// How much of a file a check compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked {
    pub bytes: u64,
    pub whole_file: bool,
}

/// Compares a system's file with the model: its size, then the ranges `ranges_to_check`
/// chooses, read through `read` (which fills the whole buffer or fails). The error names the
/// system, the first byte that differs and both values.
pub fn verify(system: &str, model: &Model, size: u64, read: &mut ReadAt) -> Result<Checked, String> {
    if size != model.size() {
        return Err(format!("{system}: the file holds {size} bytes, the model says {}", model.size()));
    }
    let ranges = model.ranges_to_check(size);
    let mut theirs = vec![0u8; READ_PIECE_BYTES as usize];
    let mut ours = vec![0u8; READ_PIECE_BYTES as usize];
    let mut bytes = 0;
    for (start, end) in ranges {
        let mut position = start;
        while position < end {
            let length = (end - position).min(READ_PIECE_BYTES) as usize;
            read(position, &mut theirs[..length]).map_err(|error| format!("{system}: read at {position}: {error}"))?;
            model.read(position, &mut ours[..length]);
            if let Some(index) = (0..length).find(|&index| theirs[index] != ours[index]) {
                return Err(format!(
                    "{system}: byte {} of the file is {:#04x}, the model says {:#04x} (the file's bytes are wrong)",
                    position + index as u64,
                    theirs[index],
                    ours[index]
                ));
            }
            bytes += length as u64;
            position += length as u64;
        }
    }
    Ok(Checked { bytes, whole_file: size <= FULL_CHECK_BYTES_MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model against a plain vector under random inserts and collapses, enough of them to
    /// split chunks and empty some.
    #[test]
    fn agrees_with_a_plain_vector() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut model = Model::zeros(5000);
        let mut plain = vec![0u8; 5000];
        for operation in 0..4000u64 {
            if rng.gen_bool(0.6) || plain.len() < 100 {
                let offset = rng.gen_range(0..=plain.len());
                let length = rng.gen_range(1..=40);
                let mut data = vec![0u8; length];
                fill_pattern(operation, 0, &mut data);
                plain.splice(offset..offset, data);
                model.insert(offset as u64, operation, length as u64);
            } else {
                let length = rng.gen_range(1..=60).min(plain.len());
                let offset = rng.gen_range(0..=plain.len() - length);
                plain.drain(offset..offset + length);
                model.collapse(offset as u64, length as u64);
            }
            assert_eq!(model.size(), plain.len() as u64);
        }
        assert!(model.chunks.len() > 1, "the test splits chunks");
        let mut bytes = vec![0u8; plain.len()];
        model.read(0, &mut bytes);
        assert_eq!(bytes, plain);
        let mut middle = vec![0u8; 333];
        model.read(1234, &mut middle);
        assert_eq!(middle, plain[1234..1567]);
        let mut reader = |offset: u64, buffer: &mut [u8]| {
            buffer.copy_from_slice(&plain[offset as usize..offset as usize + buffer.len()]);
            Ok(())
        };
        let checked = verify("plain", &model, plain.len() as u64, &mut reader).unwrap();
        assert_eq!(checked, Checked { bytes: plain.len() as u64, whole_file: true });
    }

    #[test]
    fn a_wrong_byte_or_size_fails_the_check() {
        let mut model = Model::zeros(10_000);
        model.insert(500, 0, 300);
        model.collapse(9000, 100);
        let mut bytes = vec![0u8; model.size() as usize];
        model.read(0, &mut bytes);
        bytes[700] ^= 0x40;
        let mut reader = |offset: u64, buffer: &mut [u8]| {
            buffer.copy_from_slice(&bytes[offset as usize..offset as usize + buffer.len()]);
            Ok(())
        };
        let error = verify("corrupt", &model, model.size(), &mut reader).unwrap_err();
        assert!(error.contains("corrupt: byte 700"), "{error}");
        let error = verify("short", &model, model.size() - 1, &mut reader).unwrap_err();
        assert!(error.contains("holds 10199 bytes"), "{error}");
        let mut failing = |_: u64, _: &mut [u8]| Err("device gone".to_string());
        let error = verify("failing", &model, model.size(), &mut failing).unwrap_err();
        assert!(error.contains("device gone"), "{error}");
    }

    /// A large file is sampled, and the samples still see a shifted run: the model of a
    /// 1 GiB file with inserts checked against a reader one byte off after one insert.
    #[test]
    fn a_sampled_check_sees_a_shift() {
        let mut model = Model::zeros(1 << 30);
        for operation in 0..50u64 {
            model.insert(operation * 7_777_777, operation, 100);
        }
        let ranges = model.ranges_to_check(1);
        let checked_bytes: u64 = ranges.iter().map(|(start, end)| end - start).sum();
        assert!(checked_bytes < 16 << 20, "sampled, not whole: {checked_bytes}");
        // The system dropped the first byte of operation 10's insert (everything after shifts).
        let lost_at = 10 * 7_777_777 + 10 * 100;
        let model_ref = &model;
        let mut reader = |offset: u64, buffer: &mut [u8]| {
            if offset + buffer.len() as u64 <= lost_at {
                model_ref.read(offset, buffer);
            } else {
                let mut shifted = vec![0u8; buffer.len() + 1];
                let end = (offset + shifted.len() as u64).min(model_ref.size());
                let length = (end - offset) as usize;
                model_ref.read(offset, &mut shifted[..length]);
                for (index, byte) in buffer.iter_mut().enumerate() {
                    let position = offset + index as u64;
                    *byte = if position < lost_at { shifted[index] } else { shifted[index + 1] };
                }
            }
            Ok(())
        };
        let error = verify("shifted", &model, model.size(), &mut reader).unwrap_err();
        assert!(error.contains("the model says"), "{error}");
    }
}
