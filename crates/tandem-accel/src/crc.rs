//! CRC32C (Castagnoli): reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF.
//!
//! The fast path uses the SSE4.2 `crc32` instruction on three independent streams at once
//! (the instruction has a latency of three cycles and a throughput of one per cycle, so three
//! streams keep the unit busy), then joins the three partial values with a carry-less multiply
//! by x^(8·n) mod P. The portable fallback is a slicing-by-8 table walk.

/// Reflected CRC32C polynomial.
pub const CRC32C_POLYNOMIAL_REFLECTED: u32 = 0x82F6_3B78;

/// Slicing-by-8 tables, built at compile time from the polynomial.
static TABLES: [[u32; 256]; 8] = build_tables();

const fn build_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut index = 0;
    while index < 256 {
        let mut value = index as u32;
        let mut bit = 0;
        while bit < 8 {
            value = if value & 1 != 0 { (value >> 1) ^ CRC32C_POLYNOMIAL_REFLECTED } else { value >> 1 };
            bit += 1;
        }
        tables[0][index] = value;
        index += 1;
    }
    let mut slice = 1;
    while slice < 8 {
        let mut index = 0;
        while index < 256 {
            let previous = tables[slice - 1][index];
            tables[slice][index] = (previous >> 8) ^ tables[0][(previous & 0xFF) as usize];
            index += 1;
        }
        slice += 1;
    }
    tables
}

/// Lookup tables exposed so that the CUDA kernel source can be checked against them.
pub fn table() -> &'static [u32; 256] {
    &TABLES[0]
}

/// Raw CRC update without the initial/final inversion (`state` is the register value).
pub fn raw_update_portable(mut state: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let low = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) ^ state;
        let high = u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
        state = TABLES[7][(low & 0xFF) as usize]
            ^ TABLES[6][((low >> 8) & 0xFF) as usize]
            ^ TABLES[5][((low >> 16) & 0xFF) as usize]
            ^ TABLES[4][(low >> 24) as usize]
            ^ TABLES[3][(high & 0xFF) as usize]
            ^ TABLES[2][((high >> 8) & 0xFF) as usize]
            ^ TABLES[1][((high >> 16) & 0xFF) as usize]
            ^ TABLES[0][(high >> 24) as usize];
    }
    for &byte in chunks.remainder() {
        state = (state >> 8) ^ TABLES[0][((state ^ byte as u32) & 0xFF) as usize];
    }
    state
}

/// Reflected-domain value of x^exponent mod P (bit 31 stands for x^0).
pub const fn x_power_mod(exponent: u64) -> u32 {
    // Square-and-multiply would be faster, but this runs at compile time or once per shape.
    let mut value: u32 = 0x8000_0000;
    let mut step = 0;
    while step < exponent {
        value = if value & 1 != 0 { (value >> 1) ^ CRC32C_POLYNOMIAL_REFLECTED } else { value >> 1 };
        step += 1;
    }
    value
}

/// Product of two reflected-domain polynomials mod P, bit by bit (portable, used to join
/// partial CRCs where no carry-less multiply exists).
pub const fn multiply_mod(a: u32, b: u32) -> u32 {
    let mut product = 0u32;
    let mut multiplier = a;
    let mut bit = 0;
    // Walk b from x^0 (bit 31) upwards; multiplier holds a·x^bit.
    while bit < 32 {
        if b & (0x8000_0000 >> bit) != 0 {
            product ^= multiplier;
        }
        multiplier =
            if multiplier & 1 != 0 { (multiplier >> 1) ^ CRC32C_POLYNOMIAL_REFLECTED } else { multiplier >> 1 };
        bit += 1;
    }
    product
}

/// Raw register value after feeding `length_bytes` zero bytes into register `state`:
/// state · x^(8·length) mod P. Joins a prefix CRC with the CRC of the following bytes.
pub fn shift_portable(state: u32, length_bytes: u64) -> u32 {
    // Square-and-multiply over the exponent bits keeps this O(log n).
    let mut result = state;
    let mut power = x_power_mod(8); // x^8
    let mut remaining = length_bytes;
    while remaining != 0 {
        if remaining & 1 != 0 {
            result = multiply_mod(result, power);
        }
        power = multiply_mod(power, power);
        remaining >>= 1;
    }
    result
}

/// Join CRC32C values: given `crc_a = crc32c(0, A)` and `crc_b = crc32c(0, B)`, returns
/// `crc32c(0, A ‖ B)` where `length_b` = |B|.
pub fn combine(crc_a: u32, crc_b: u32, length_b: u64) -> u32 {
    // With inversions: raw(A‖B) = raw(A)·x^(8|B|) ^ raw_from_zero(B); the inversion of the
    // initial value of B cancels against the final inversion of A shifted.
    shift_portable(crc_a ^ 0xFFFF_FFFF, length_b)
        ^ 0xFFFF_FFFF
        ^ crc_b
        ^ shift_portable(0xFFFF_FFFF, length_b)
        ^ 0xFFFF_FFFF
}

/// Portable CRC32C with the standard inversions.
pub fn crc32c_portable(crc: u32, data: &[u8]) -> u32 {
    !raw_update_portable(!crc, data)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    /// Stream lengths for the three-way split, largest first, with the constant that shifts
    /// a register across two streams and across one: x^(8·2L−33) and x^(8·L−33) (the 33
    /// accounts for the carry-less product landing one bit low and the crc32 instruction's
    /// own multiplication by x^32).
    const TIERS: [(usize, u32, u32); 3] = [
        (8192, super::x_power_mod(8 * 2 * 8192 - 33), super::x_power_mod(8 * 8192 - 33)),
        (1360, super::x_power_mod(8 * 2 * 1360 - 33), super::x_power_mod(8 * 1360 - 33)),
        (256, super::x_power_mod(8 * 2 * 256 - 33), super::x_power_mod(8 * 256 - 33)),
    ];

    #[target_feature(enable = "sse4.2,pclmulqdq")]
    unsafe fn shift(state: u32, constant: u32) -> u32 {
        let product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(state as i32), _mm_cvtsi32_si128(constant as i32), 0x00);
        _mm_crc32_u64(0, _mm_cvtsi128_si64(product) as u64) as u32
    }

    #[target_feature(enable = "sse4.2")]
    unsafe fn serial(mut state: u32, data: &[u8]) -> u32 {
        let mut words = data.chunks_exact(8);
        let mut state64 = state as u64;
        for word in &mut words {
            state64 = _mm_crc32_u64(state64, u64::from_le_bytes(word.try_into().unwrap()));
        }
        state = state64 as u32;
        for &byte in words.remainder() {
            state = _mm_crc32_u8(state, byte);
        }
        state
    }

    /// Folding constant pair for a 128-bit lane moved `distance_bits` forward: the low
    /// qword of a lane holds the first 64 message bits (degrees 127..64 of the lane), the
    /// high qword the next 64. A reflected carry-less product lands one degree low, so the
    /// constants are x^(D+63) and x^(D−1) mod P, placed in the top half of each qword.
    const fn fold_pair(distance_bits: u64) -> (i64, i64) {
        (
            ((super::x_power_mod(distance_bits + 63) as u64) << 32) as i64,
            ((super::x_power_mod(distance_bits - 1) as u64) << 32) as i64,
        )
    }

    const FOLD_2048: (i64, i64) = fold_pair(2048);
    const FOLD_512: (i64, i64) = fold_pair(512);
    const FOLD_384: (i64, i64) = fold_pair(384);
    const FOLD_256: (i64, i64) = fold_pair(256);
    const FOLD_128: (i64, i64) = fold_pair(128);

    #[inline(always)]
    unsafe fn fold(value: __m512i, constants: __m512i, next: __m512i) -> __m512i {
        let low = _mm512_clmulepi64_epi128::<0x00>(value, constants);
        let high = _mm512_clmulepi64_epi128::<0x11>(value, constants);
        _mm512_ternarylogic_epi64::<0x96>(low, high, next)
    }

    /// Raw register update for at least 256 bytes: sixteen 128-bit lanes fold 256 bytes per
    /// step with VPCLMULQDQ, then collapse to one lane whose CRC the crc32 instruction takes.
    #[target_feature(enable = "avx512f,avx512bw,vpclmulqdq,sse4.2,pclmulqdq")]
    pub unsafe fn raw_update_folding(state: u32, data: &[u8]) -> u32 {
        assert!(data.len() >= 256);
        let pointer = data.as_ptr();
        let mut lanes: [__m512i; 4] =
            core::array::from_fn(|index| _mm512_loadu_si512(pointer.add(64 * index) as *const _));
        // The register XORs into the first four message bytes.
        lanes[0] = _mm512_xor_si512(lanes[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(state as i32)));
        let step = _mm512_set_epi64(
            FOLD_2048.1,
            FOLD_2048.0,
            FOLD_2048.1,
            FOLD_2048.0,
            FOLD_2048.1,
            FOLD_2048.0,
            FOLD_2048.1,
            FOLD_2048.0,
        );
        let mut offset = 256;
        while offset + 256 <= data.len() {
            for (index, lane) in lanes.iter_mut().enumerate() {
                let next = _mm512_loadu_si512(pointer.add(offset + 64 * index) as *const _);
                *lane = fold(*lane, step, next);
            }
            offset += 256;
        }
        let across = _mm512_set_epi64(
            FOLD_512.1, FOLD_512.0, FOLD_512.1, FOLD_512.0, FOLD_512.1, FOLD_512.0, FOLD_512.1, FOLD_512.0,
        );
        let mut value = lanes[0];
        for lane in &lanes[1..] {
            value = fold(value, across, *lane);
        }
        let last = _mm512_set_epi64(0, 0, FOLD_128.1, FOLD_128.0, FOLD_256.1, FOLD_256.0, FOLD_384.1, FOLD_384.0);
        let folded = fold(value, last, _mm512_setzero_si512());
        let single = _mm_xor_si128(
            _mm_xor_si128(_mm512_extracti32x4_epi32::<0>(folded), _mm512_extracti32x4_epi32::<1>(folded)),
            _mm_xor_si128(_mm512_extracti32x4_epi32::<2>(folded), _mm512_extracti32x4_epi32::<3>(value)),
        );
        let low = _mm_cvtsi128_si64(single) as u64;
        let high = _mm_extract_epi64::<1>(single) as u64;
        let register = _mm_crc32_u64(_mm_crc32_u64(0, low), high) as u32;
        raw_update(register, &data[offset..])
    }

    /// Raw register update (no inversions) using three interleaved streams.
    #[target_feature(enable = "sse4.2,pclmulqdq")]
    pub unsafe fn raw_update(mut state: u32, mut data: &[u8]) -> u32 {
        for &(lane_bytes, shift_two, shift_one) in TIERS.iter() {
            while data.len() >= 3 * lane_bytes {
                let pointer = data.as_ptr();
                let mut state_a = state as u64;
                let mut state_b = 0u64;
                let mut state_c = 0u64;
                let mut offset = 0;
                while offset < lane_bytes {
                    // Unaligned reads: callers pass arbitrary slices.
                    let word_a = (pointer.add(offset) as *const u64).read_unaligned();
                    let word_b = (pointer.add(lane_bytes + offset) as *const u64).read_unaligned();
                    let word_c = (pointer.add(2 * lane_bytes + offset) as *const u64).read_unaligned();
                    state_a = _mm_crc32_u64(state_a, word_a);
                    state_b = _mm_crc32_u64(state_b, word_b);
                    state_c = _mm_crc32_u64(state_c, word_c);
                    offset += 8;
                }
                state = shift(state_a as u32, shift_two) ^ shift(state_b as u32, shift_one) ^ state_c as u32;
                data = &data[3 * lane_bytes..];
            }
        }
        serial(state, data)
    }
}

/// Whether the 512-bit folding path is usable (checked once).
pub fn folding_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            hardware_available()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("vpclmulqdq")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the hardware path is usable on this CPU (checked once).
pub fn hardware_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| is_x86_feature_detected!("sse4.2") && is_x86_feature_detected!("pclmulqdq"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Raw register update (no inversions), fastest available path.
pub fn raw_update(state: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if data.len() >= 256 && folding_available() {
            // SAFETY: the features the function needs were detected at run time.
            return unsafe { x86::raw_update_folding(state, data) };
        }
        if hardware_available() {
            // SAFETY: the features the function needs were detected at run time.
            return unsafe { x86::raw_update(state, data) };
        }
    }
    raw_update_portable(state, data)
}

/// CRC32C of `data` continuing from `crc` (0 to start).
pub fn crc32c(crc: u32, data: &[u8]) -> u32 {
    !raw_update(!crc, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitwise(crc: u32, data: &[u8]) -> u32 {
        let mut value = !crc;
        for &byte in data {
            value ^= byte as u32;
            for _ in 0..8 {
                value = if value & 1 != 0 { (value >> 1) ^ CRC32C_POLYNOMIAL_REFLECTED } else { value >> 1 };
            }
        }
        !value
    }

    #[test]
    fn check_values() {
        assert_eq!(crc32c(0, b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_portable(0, b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(0, b""), 0);
        // RFC 3720 (iSCSI) B.4: 32 bytes of zeros and 32 bytes of 0xFF.
        assert_eq!(crc32c(0, &[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(0, &[0xFFu8; 32]), 0x62A8_AB43);
    }

    #[test]
    fn fast_paths_match_bitwise_at_every_length_and_offset() {
        let mut data = vec![0u8; 3 * 8192 * 2 + 4096 + 77];
        let mut seed = 0x1234_5678_9ABC_DEF0u64;
        for byte in data.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *byte = seed as u8;
        }
        let lengths =
            [0usize, 1, 7, 8, 9, 255, 768, 769, 4080, 4096, 4097, 3 * 1360, 3 * 8192, 3 * 8192 + 3, data.len() - 5];
        for &length in &lengths {
            for offset in [0usize, 1, 3] {
                let slice = &data[offset..offset + length];
                let expected = bitwise(0x5A5A_0000, slice);
                assert_eq!(crc32c(0x5A5A_0000, slice), expected, "length {length} offset {offset}");
                assert_eq!(crc32c_portable(0x5A5A_0000, slice), expected, "portable length {length}");
            }
        }
    }

    #[test]
    fn incremental_and_combine_agree() {
        let data: Vec<u8> = (0..10_000u32).map(|value| (value * 31 + 7) as u8).collect();
        let whole = crc32c(0, &data);
        let (first, second) = data.split_at(4321);
        assert_eq!(crc32c(crc32c(0, first), second), whole);
        assert_eq!(combine(crc32c(0, first), crc32c(0, second), second.len() as u64), whole);
    }
}
