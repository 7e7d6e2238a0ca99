//! Systematic Reed–Solomon erasure code over GF(2^8) (polynomial 0x11D).
//!
//! Shards 0..k are the data unchanged; shards k..k+m are parity. Parity row `p`, column `d`
//! holds the Cauchy entry 1 / (x_p + y_d) with x_p = k + p and y_d = d (field addition is
//! XOR). Every square submatrix of a Cauchy matrix is invertible, so the generator
//! [identity; Cauchy] has every k×k submatrix invertible, and any k surviving shards
//! determine the rest. This is the same construction ISA-L's `gf_gen_cauchy1_matrix` uses,
//! so parity computed here and by ISA-L agree byte for byte.

// Index loops here mirror the round and matrix formulas they implement.
#![allow(clippy::needless_range_loop)]

use crate::error::AccelError;
use crate::galois;

/// Most shards in one stripe: the Cauchy construction needs k + m distinct field elements.
pub const MAXIMUM_SHARDS: usize = 256;

/// A code shape with its parity matrix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReedSolomon {
    data_shards: usize,
    parity_shards: usize,
    /// m×k, row-major.
    parity_matrix: Vec<u8>,
}

impl ReedSolomon {
    pub fn new(data_shards: usize, parity_shards: usize) -> Result<Self, AccelError> {
        if data_shards == 0 || parity_shards == 0 || data_shards + parity_shards > MAXIMUM_SHARDS {
            return Err(AccelError::InvalidArgument(format!(
                "Reed-Solomon shape {data_shards}+{parity_shards}: need k ≥ 1, m ≥ 1, k + m ≤ {MAXIMUM_SHARDS}"
            )));
        }
        let mut parity_matrix = vec![0u8; parity_shards * data_shards];
        for parity in 0..parity_shards {
            for data in 0..data_shards {
                let sum = ((data_shards + parity) as u8) ^ (data as u8);
                parity_matrix[parity * data_shards + data] = galois::inverse(sum);
            }
        }
        Ok(Self { data_shards, parity_shards, parity_matrix })
    }

    pub fn data_shards(&self) -> usize {
        self.data_shards
    }
    pub fn parity_shards(&self) -> usize {
        self.parity_shards
    }
    pub fn total_shards(&self) -> usize {
        self.data_shards + self.parity_shards
    }
    /// m×k coefficient matrix, row-major.
    pub fn parity_matrix(&self) -> &[u8] {
        &self.parity_matrix
    }

    /// Row `shard` of the (k+m)×k generator.
    fn generator_row(&self, shard: usize) -> Vec<u8> {
        let k = self.data_shards;
        if shard < k {
            let mut row = vec![0u8; k];
            row[shard] = 1;
            row
        } else {
            self.parity_matrix[(shard - k) * k..(shard - k + 1) * k].to_vec()
        }
    }

    /// Plan for rebuilding the shards marked absent in `present` (length k+m): the source
    /// shards to read (k of them) and a (missing × k) matrix producing the missing shards
    /// in ascending index order.
    pub fn reconstruction_plan(&self, present: &[bool]) -> Result<ReconstructionPlan, AccelError> {
        let k = self.data_shards;
        if present.len() != self.total_shards() {
            return Err(AccelError::InvalidArgument(format!(
                "presence map has {} entries, code has {} shards",
                present.len(),
                self.total_shards()
            )));
        }
        let sources: Vec<usize> = (0..present.len()).filter(|&index| present[index]).take(k).collect();
        if sources.len() < k {
            return Err(AccelError::TooManyErasures {
                missing: present.iter().filter(|p| !**p).count(),
                tolerated: self.parity_shards,
            });
        }
        let missing: Vec<usize> = (0..present.len()).filter(|&index| !present[index]).collect();
        let mut submatrix = Vec::with_capacity(k * k);
        for &source in &sources {
            submatrix.extend_from_slice(&self.generator_row(source));
        }
        let decode = galois::invert_matrix(&submatrix, k).expect("Cauchy generator submatrices are invertible");
        let mut matrix = Vec::with_capacity(missing.len() * k);
        for &target in &missing {
            // target row of generator × decode gives the target from the sources.
            let row = self.generator_row(target);
            for column in 0..k {
                let mut value = 0u8;
                for (inner, &coefficient) in row.iter().enumerate() {
                    value ^= galois::multiply(coefficient, decode[inner * k + column]);
                }
                matrix.push(value);
            }
        }
        Ok(ReconstructionPlan { sources, missing, matrix })
    }
}

/// How to rebuild missing shards from k sources.
#[derive(Clone, Debug)]
pub struct ReconstructionPlan {
    pub sources: Vec<usize>,
    pub missing: Vec<usize>,
    /// missing.len() × k, row-major.
    pub matrix: Vec<u8>,
}

/// outputs[r] = Σ_c matrix[r][c] · inputs[c] over GF(2^8), byte by byte; the range
/// `start..end` of every shard. Single-threaded; the engine splits ranges over cores.
pub fn apply_matrix(matrix: &[u8], inputs: &[&[u8]], outputs: &mut [&mut [u8]], start: usize, end: usize) {
    let rows = outputs.len();
    let columns = inputs.len();
    assert_eq!(matrix.len(), rows * columns, "matrix shape does not match the shards");
    assert!(start <= end);
    assert!(inputs.iter().all(|shard| shard.len() >= end) && outputs.iter().all(|shard| shard.len() >= end));
    #[cfg(target_arch = "x86_64")]
    {
        if gfni_available() {
            // SAFETY: features detected at run time; lengths asserted above.
            let vector_end = start + (end - start) / 64 * 64;
            unsafe { x86::apply_matrix_gfni(matrix, inputs, outputs, start, vector_end) };
            apply_matrix_portable(matrix, inputs, outputs, vector_end, end);
            return;
        }
        if avx2_available() {
            // SAFETY: as above.
            let vector_end = start + (end - start) / 32 * 32;
            unsafe { x86::apply_matrix_avx2(matrix, inputs, outputs, start, vector_end) };
            apply_matrix_portable(matrix, inputs, outputs, vector_end, end);
            return;
        }
    }
    apply_matrix_portable(matrix, inputs, outputs, start, end);
}

/// AVX2 without GFNI (most x86 servers before Ice Lake, and AMD before Zen 4): products by
/// table lookups of the two nibbles (PSHUFB), 32 bytes at a time.
pub fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

pub fn gfni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("gfni")
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Table-driven path for any CPU and for the tails the vector path leaves.
pub fn apply_matrix_portable(matrix: &[u8], inputs: &[&[u8]], outputs: &mut [&mut [u8]], start: usize, end: usize) {
    let columns = inputs.len();
    for (row, output) in outputs.iter_mut().enumerate() {
        let destination = &mut output[start..end];
        destination.fill(0);
        for (column, input) in inputs.iter().enumerate() {
            let coefficient = matrix[row * columns + column];
            if coefficient == 0 {
                continue;
            }
            let products = galois::multiplication_row(coefficient);
            for (out, &value) in destination.iter_mut().zip(&input[start..end]) {
                *out ^= products[value as usize];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    /// Rows of the AVX2 path per pass: each row's accumulator and the input's two nibble
    /// vectors stay in the 16 registers, with the tables read from L1.
    const ROWS_PER_PASS_AVX2: usize = 4;

    /// The two 16-entry product tables of `constant` (c·i and c·(i << 4)), each repeated in both
    /// 128-bit lanes for VPSHUFB. c·x = c·(x & 15) ⊕ c·(x & 240): multiplication distributes
    /// over addition, which is XOR.
    unsafe fn nibble_tables(constant: u8) -> (__m256i, __m256i) {
        let mut low = [0u8; 32];
        let mut high = [0u8; 32];
        for nibble in 0..16u8 {
            let (lane_low, lane_high) =
                (crate::galois::multiply(constant, nibble), crate::galois::multiply(constant, nibble << 4));
            low[nibble as usize] = lane_low;
            low[nibble as usize + 16] = lane_low;
            high[nibble as usize] = lane_high;
            high[nibble as usize + 16] = lane_high;
        }
        (_mm256_loadu_si256(low.as_ptr() as *const _), _mm256_loadu_si256(high.as_ptr() as *const _))
    }

    /// `apply_matrix` on `start..end` (a multiple of 32 bytes long) with AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn apply_matrix_avx2(
        matrix: &[u8],
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
        start: usize,
        end: usize,
    ) {
        debug_assert!((end - start).is_multiple_of(32));
        let columns = inputs.len();
        let rows = outputs.len();
        let tables: Vec<(__m256i, __m256i)> = matrix.iter().map(|&constant| nibble_tables(constant)).collect();
        let mask = _mm256_set1_epi8(0x0f);
        let mut row_base = 0;
        while row_base < rows {
            let pass_rows = (rows - row_base).min(ROWS_PER_PASS_AVX2);
            let mut position = start;
            while position < end {
                let mut accumulators = [_mm256_setzero_si256(); ROWS_PER_PASS_AVX2];
                for column in 0..columns {
                    let value = _mm256_loadu_si256(inputs[column].as_ptr().add(position) as *const _);
                    let low = _mm256_and_si256(value, mask);
                    let high = _mm256_and_si256(_mm256_srli_epi16::<4>(value), mask);
                    for (row, accumulator) in accumulators.iter_mut().enumerate().take(pass_rows) {
                        let (table_low, table_high) = *tables.get_unchecked((row_base + row) * columns + column);
                        let product = _mm256_xor_si256(
                            _mm256_shuffle_epi8(table_low, low),
                            _mm256_shuffle_epi8(table_high, high),
                        );
                        *accumulator = _mm256_xor_si256(*accumulator, product);
                    }
                }
                for (row, accumulator) in accumulators.iter().enumerate().take(pass_rows) {
                    _mm256_storeu_si256(outputs[row_base + row].as_mut_ptr().add(position) as *mut _, *accumulator);
                }
                position += 32;
            }
            row_base += pass_rows;
        }
    }

    /// Rows handled per pass: enough accumulators to reuse each input load several times,
    /// few enough to stay in the 32 vector registers.
    const ROWS_PER_PASS: usize = 8;

    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    pub unsafe fn apply_matrix_gfni(
        matrix: &[u8],
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
        start: usize,
        end: usize,
    ) {
        let columns = inputs.len();
        let rows = outputs.len();
        let affine: Vec<__m512i> =
            matrix.iter().map(|&constant| _mm512_set1_epi64(crate::galois::affine_matrix(constant) as i64)).collect();
        let mut row_base = 0;
        while row_base < rows {
            let pass_rows = (rows - row_base).min(ROWS_PER_PASS);
            let mut position = start;
            while position < end {
                let mut accumulators = [_mm512_setzero_si512(); ROWS_PER_PASS];
                for column in 0..columns {
                    let value = _mm512_loadu_si512(inputs[column].as_ptr().add(position) as *const _);
                    for row in 0..pass_rows {
                        let product = _mm512_gf2p8affine_epi64_epi8::<0>(
                            value,
                            *affine.get_unchecked((row_base + row) * columns + column),
                        );
                        accumulators[row] = _mm512_xor_si512(accumulators[row], product);
                    }
                }
                for row in 0..pass_rows {
                    _mm512_storeu_si512(
                        outputs[row_base + row].as_mut_ptr().add(position) as *mut _,
                        accumulators[row],
                    );
                }
                position += 64;
            }
            row_base += pass_rows;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_bytes(seed: &mut u64, length: usize) -> Vec<u8> {
        (0..length)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed >> 24) as u8
            })
            .collect()
    }

    fn encode(code: &ReedSolomon, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let length = data[0].len();
        let mut parity = vec![vec![0u8; length]; code.parity_shards()];
        let inputs: Vec<&[u8]> = data.iter().map(|shard| shard.as_slice()).collect();
        let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(|shard| shard.as_mut_slice()).collect();
        apply_matrix(code.parity_matrix(), &inputs, &mut outputs, 0, length);
        parity
    }

    #[test]
    fn vector_and_portable_paths_agree() {
        let mut seed = 99;
        let code = ReedSolomon::new(10, 4).unwrap();
        let length = 64 * 9 + 13;
        let data: Vec<Vec<u8>> = (0..10).map(|_| random_bytes(&mut seed, length)).collect();
        let fast = encode(&code, &data);
        let mut slow = vec![vec![0u8; length]; 4];
        let inputs: Vec<&[u8]> = data.iter().map(|shard| shard.as_slice()).collect();
        let mut outputs: Vec<&mut [u8]> = slow.iter_mut().map(|shard| shard.as_mut_slice()).collect();
        apply_matrix_portable(code.parity_matrix(), &inputs, &mut outputs, 0, length);
        assert_eq!(fast, slow);
    }

    /// The AVX2 path on its own (a GFNI machine takes the other vector path in `apply_matrix`),
    /// for shapes whose parity rows span one pass, several, and a part of one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_and_portable_paths_agree() {
        if !avx2_available() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let mut seed = 7;
        for (k, m) in [(1, 1), (4, 2), (10, 4), (8, 6), (3, 9)] {
            let code = ReedSolomon::new(k, m).unwrap();
            let length = 32 * 11;
            let data: Vec<Vec<u8>> = (0..k).map(|_| random_bytes(&mut seed, length + 5)).collect();
            let inputs: Vec<&[u8]> = data.iter().map(|shard| shard.as_slice()).collect();
            let mut fast = vec![vec![0xA5u8; length + 5]; m];
            let mut slow = fast.clone();
            let mut outputs: Vec<&mut [u8]> = fast.iter_mut().map(|shard| shard.as_mut_slice()).collect();
            // SAFETY: AVX2 checked above; every shard holds more than the range.
            unsafe { x86::apply_matrix_avx2(code.parity_matrix(), &inputs, &mut outputs, 32, length) };
            let mut outputs: Vec<&mut [u8]> = slow.iter_mut().map(|shard| shard.as_mut_slice()).collect();
            apply_matrix_portable(code.parity_matrix(), &inputs, &mut outputs, 32, length);
            assert_eq!(fast, slow, "{k}+{m}");
        }
    }

    /// Every erasure pattern of up to m shards, for every shape up to 6+3 and RAID-6 up to 8+2.
    #[test]
    fn every_erasure_pattern_of_small_shapes_reconstructs() {
        let mut seed = 7;
        let mut shapes: Vec<(usize, usize)> = Vec::new();
        for k in 1..=6 {
            for m in 1..=3 {
                shapes.push((k, m));
            }
        }
        shapes.extend([(8, 2), (10, 4), (4, 4)]);
        let mut patterns_checked = 0;
        for (k, m) in shapes {
            let code = ReedSolomon::new(k, m).unwrap();
            let length = 64 + 5;
            let data: Vec<Vec<u8>> = (0..k).map(|_| random_bytes(&mut seed, length)).collect();
            let parity = encode(&code, &data);
            let all: Vec<Vec<u8>> = data.iter().chain(parity.iter()).cloned().collect();
            let n = k + m;
            for mask in 0u32..(1 << n) {
                let missing_count = mask.count_ones() as usize;
                if missing_count == 0 || missing_count > m {
                    continue;
                }
                let present: Vec<bool> = (0..n).map(|index| mask & (1 << index) == 0).collect();
                let plan = code.reconstruction_plan(&present).unwrap();
                let inputs: Vec<&[u8]> = plan.sources.iter().map(|&source| all[source].as_slice()).collect();
                let mut rebuilt = vec![vec![0xAAu8; length]; plan.missing.len()];
                let mut outputs: Vec<&mut [u8]> = rebuilt.iter_mut().map(|shard| shard.as_mut_slice()).collect();
                apply_matrix(&plan.matrix, &inputs, &mut outputs, 0, length);
                for (slot, &target) in plan.missing.iter().enumerate() {
                    assert_eq!(rebuilt[slot], all[target], "shape {k}+{m} mask {mask:b} shard {target}");
                }
                patterns_checked += 1;
            }
        }
        assert!(patterns_checked > 1000);
    }

    #[test]
    fn too_many_erasures_is_an_error() {
        let code = ReedSolomon::new(4, 2).unwrap();
        assert!(code.reconstruction_plan(&[false, false, false, true, true, true]).is_err());
        assert!(ReedSolomon::new(0, 2).is_err());
        assert!(ReedSolomon::new(250, 7).is_err());
    }
}
