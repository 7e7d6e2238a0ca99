//! AES-256-XTS (IEEE 1619) for whole data units (sectors) of a multiple of 16 bytes.
//!
//! The tweak of a data unit is its sector number as a little-endian 128-bit integer,
//! encrypted with the second key; block j of the unit uses that value multiplied by α^j in
//! GF(2^128) (polynomial x^128 + x^7 + x^2 + x + 1). No ciphertext stealing: the storage
//! services only ever encrypt whole 4 KiB sectors.
//!
//! Paths: VAES with AVX-512 (sixteen blocks in flight), AES-NI (eight blocks in flight) and a
//! portable table-driven fallback. All three share one key schedule.

// Index loops here mirror the round and matrix formulas they implement.
#![allow(clippy::needless_range_loop)]

use std::sync::OnceLock;

use zeroize::Zeroize;

/// The storage sector size the services use.
pub const SECTOR_SIZE_BYTES: usize = 4096;
pub const AES_BLOCK_BYTES: usize = 16;
pub const AES256_ROUNDS: usize = 14;

/// AES tables: forward and inverse S-box, and the four forward and inverse round tables
/// (each entry is a column packed little-endian, row r in bits 8r..8r+7).
pub struct AesTables {
    pub substitution: [u8; 256],
    pub inverse_substitution: [u8; 256],
    pub encrypt: [[u32; 256]; 4],
    pub decrypt: [[u32; 256]; 4],
}

/// Multiply in AES's field (polynomial 0x11B).
const fn aes_multiply(mut a: u8, mut b: u8) -> u8 {
    let mut product = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        let carry = a & 0x80;
        a <<= 1;
        if carry != 0 {
            a ^= 0x1B;
        }
        b >>= 1;
    }
    product
}

const fn build_tables() -> AesTables {
    let mut substitution = [0u8; 256];
    let mut inverse_substitution = [0u8; 256];
    let mut value = 0;
    while value < 256 {
        // Multiplicative inverse by search: a compile-time cost only.
        let mut inverse = 0u8;
        if value != 0 {
            let mut candidate = 1;
            while candidate < 256 {
                if aes_multiply(value as u8, candidate as u8) == 1 {
                    inverse = candidate as u8;
                    break;
                }
                candidate += 1;
            }
        }
        let affine = inverse
            ^ inverse.rotate_left(1)
            ^ inverse.rotate_left(2)
            ^ inverse.rotate_left(3)
            ^ inverse.rotate_left(4)
            ^ 0x63;
        substitution[value] = affine;
        inverse_substitution[affine as usize] = value as u8;
        value += 1;
    }
    let mut encrypt = [[0u32; 256]; 4];
    let mut decrypt = [[0u32; 256]; 4];
    let mut index = 0;
    while index < 256 {
        let s = substitution[index];
        let column =
            (aes_multiply(s, 2) as u32) | (s as u32) << 8 | (s as u32) << 16 | (aes_multiply(s, 3) as u32) << 24;
        let i = inverse_substitution[index];
        let inverse_column = (aes_multiply(i, 14) as u32)
            | (aes_multiply(i, 9) as u32) << 8
            | (aes_multiply(i, 13) as u32) << 16
            | (aes_multiply(i, 11) as u32) << 24;
        let mut table = 0;
        while table < 4 {
            encrypt[table][index] = column.rotate_left(8 * table as u32);
            decrypt[table][index] = inverse_column.rotate_left(8 * table as u32);
            table += 1;
        }
        index += 1;
    }
    AesTables { substitution, inverse_substitution, encrypt, decrypt }
}

pub static TABLES: AesTables = build_tables();

/// Round keys of one AES-256 key: 15 round keys of 16 bytes.
pub type RoundKeys = [[u8; 16]; AES256_ROUNDS + 1];

fn expand_key(key: &[u8; 32]) -> RoundKeys {
    let mut words = [0u32; 4 * (AES256_ROUNDS + 1)];
    for (index, word) in words.iter_mut().take(8).enumerate() {
        *word = u32::from_le_bytes(key[4 * index..4 * index + 4].try_into().unwrap());
    }
    let substitute = |word: u32| -> u32 {
        let bytes = word.to_le_bytes().map(|byte| TABLES.substitution[byte as usize]);
        u32::from_le_bytes(bytes)
    };
    let mut round_constant = 1u8;
    for index in 8..words.len() {
        let mut temporary = words[index - 1];
        if index % 8 == 0 {
            // RotWord moves byte 1 to byte 0: a right rotation of the little-endian word.
            temporary = substitute(temporary.rotate_right(8)) ^ round_constant as u32;
            round_constant = aes_multiply(round_constant, 2);
        } else if index % 8 == 4 {
            temporary = substitute(temporary);
        }
        words[index] = words[index - 8] ^ temporary;
    }
    let mut round_keys = [[0u8; 16]; AES256_ROUNDS + 1];
    for (round, round_key) in round_keys.iter_mut().enumerate() {
        for column in 0..4 {
            round_key[4 * column..4 * column + 4].copy_from_slice(&words[4 * round + column].to_le_bytes());
        }
    }
    // The schedule words are the key itself in another layout.
    words.zeroize();
    round_keys
}

fn inverse_mix_column(word: u32) -> u32 {
    let a = word.to_le_bytes();
    let mut b = [0u8; 4];
    for row in 0..4 {
        b[row] = aes_multiply(a[row], 14)
            ^ aes_multiply(a[(row + 1) % 4], 11)
            ^ aes_multiply(a[(row + 2) % 4], 13)
            ^ aes_multiply(a[(row + 3) % 4], 9);
    }
    u32::from_le_bytes(b)
}

/// Round keys for the equivalent inverse cipher (what AESDEC and the inverse tables expect).
fn decryption_keys(encryption: &RoundKeys) -> RoundKeys {
    let mut keys = [[0u8; 16]; AES256_ROUNDS + 1];
    keys[0] = encryption[AES256_ROUNDS];
    keys[AES256_ROUNDS] = encryption[0];
    for round in 1..AES256_ROUNDS {
        let source = &encryption[AES256_ROUNDS - round];
        for column in 0..4 {
            let word = u32::from_le_bytes(source[4 * column..4 * column + 4].try_into().unwrap());
            keys[round][4 * column..4 * column + 4].copy_from_slice(&inverse_mix_column(word).to_le_bytes());
        }
    }
    keys
}

/// An AES-256-XTS key: 64 bytes, the data key then the tweak key. The round keys are wiped
/// when it is dropped (copies that moves leave on the stack, and the round keys the CPU paths
/// and the GPU kernels load into registers and kernel parameters, are not).
#[derive(Clone)]
pub struct XtsKey {
    pub data_encrypt: RoundKeys,
    pub data_decrypt: RoundKeys,
    pub tweak_encrypt: RoundKeys,
}

impl std::fmt::Debug for XtsKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        formatter.write_str("XtsKey(..)")
    }
}

impl Drop for XtsKey {
    fn drop(&mut self) {
        self.data_encrypt.zeroize();
        self.data_decrypt.zeroize();
        self.tweak_encrypt.zeroize();
    }
}

impl XtsKey {
    pub fn new(key: &[u8; 64]) -> Self {
        let data_encrypt = expand_key(key[..32].try_into().unwrap());
        let tweak_encrypt = expand_key(key[32..].try_into().unwrap());
        Self { data_decrypt: decryption_keys(&data_encrypt), data_encrypt, tweak_encrypt }
    }
}

fn load_columns(block: &[u8]) -> [u32; 4] {
    core::array::from_fn(|column| u32::from_le_bytes(block[4 * column..4 * column + 4].try_into().unwrap()))
}

fn key_columns(round_key: &[u8; 16]) -> [u32; 4] {
    load_columns(round_key)
}

#[inline(always)]
fn byte(word: u32, row: usize) -> usize {
    ((word >> (8 * row)) & 0xFF) as usize
}

/// One AES-256 block through the round tables (portable path and GPU reference).
pub fn encrypt_block_portable(round_keys: &RoundKeys, block: &mut [u8; 16]) {
    let tables = &TABLES;
    let mut state = load_columns(block);
    let first = key_columns(&round_keys[0]);
    for column in 0..4 {
        state[column] ^= first[column];
    }
    for round in 1..=AES256_ROUNDS {
        let key = key_columns(&round_keys[round]);
        let mut next = [0u32; 4];
        for column in 0..4 {
            next[column] = if round < AES256_ROUNDS {
                tables.encrypt[0][byte(state[column], 0)]
                    ^ tables.encrypt[1][byte(state[(column + 1) % 4], 1)]
                    ^ tables.encrypt[2][byte(state[(column + 2) % 4], 2)]
                    ^ tables.encrypt[3][byte(state[(column + 3) % 4], 3)]
            } else {
                (tables.substitution[byte(state[column], 0)] as u32)
                    | (tables.substitution[byte(state[(column + 1) % 4], 1)] as u32) << 8
                    | (tables.substitution[byte(state[(column + 2) % 4], 2)] as u32) << 16
                    | (tables.substitution[byte(state[(column + 3) % 4], 3)] as u32) << 24
            } ^ key[column];
        }
        state = next;
    }
    for column in 0..4 {
        block[4 * column..4 * column + 4].copy_from_slice(&state[column].to_le_bytes());
    }
}

/// Inverse of [`encrypt_block_portable`] using the equivalent inverse cipher keys.
pub fn decrypt_block_portable(round_keys: &RoundKeys, block: &mut [u8; 16]) {
    let tables = &TABLES;
    let mut state = load_columns(block);
    let first = key_columns(&round_keys[0]);
    for column in 0..4 {
        state[column] ^= first[column];
    }
    for round in 1..=AES256_ROUNDS {
        let key = key_columns(&round_keys[round]);
        let mut next = [0u32; 4];
        for column in 0..4 {
            next[column] = if round < AES256_ROUNDS {
                tables.decrypt[0][byte(state[column], 0)]
                    ^ tables.decrypt[1][byte(state[(column + 3) % 4], 1)]
                    ^ tables.decrypt[2][byte(state[(column + 2) % 4], 2)]
                    ^ tables.decrypt[3][byte(state[(column + 1) % 4], 3)]
            } else {
                (tables.inverse_substitution[byte(state[column], 0)] as u32)
                    | (tables.inverse_substitution[byte(state[(column + 3) % 4], 1)] as u32) << 8
                    | (tables.inverse_substitution[byte(state[(column + 2) % 4], 2)] as u32) << 16
                    | (tables.inverse_substitution[byte(state[(column + 1) % 4], 3)] as u32) << 24
            } ^ key[column];
        }
        state = next;
    }
    for column in 0..4 {
        block[4 * column..4 * column + 4].copy_from_slice(&state[column].to_le_bytes());
    }
}

/// Multiply a tweak by α (x) in GF(2^128), little-endian as IEEE 1619 lays it out.
#[inline]
pub fn multiply_by_alpha(tweak: u128) -> u128 {
    (tweak << 1) ^ if tweak >> 127 != 0 { 0x87 } else { 0 }
}

/// Direction of an XTS operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Encrypt,
    Decrypt,
}

fn unit_portable(key: &XtsKey, direction: Direction, sector: u64, unit: &mut [u8]) {
    let mut tweak_block = (sector as u128).to_le_bytes();
    encrypt_block_portable(&key.tweak_encrypt, &mut tweak_block);
    let mut tweak = u128::from_le_bytes(tweak_block);
    for block in unit.chunks_exact_mut(AES_BLOCK_BYTES) {
        let block: &mut [u8; 16] = block.try_into().unwrap();
        let mask = tweak.to_le_bytes();
        for index in 0..16 {
            block[index] ^= mask[index];
        }
        match direction {
            Direction::Encrypt => encrypt_block_portable(&key.data_encrypt, block),
            Direction::Decrypt => decrypt_block_portable(&key.data_decrypt, block),
        }
        for index in 0..16 {
            block[index] ^= mask[index];
        }
        tweak = multiply_by_alpha(tweak);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Direction, XtsKey, AES256_ROUNDS};
    use core::arch::x86_64::*;

    #[inline(always)]
    unsafe fn load_key(round_key: &[u8; 16]) -> __m128i {
        _mm_loadu_si128(round_key.as_ptr() as *const __m128i)
    }

    #[target_feature(enable = "aes,sse2")]
    unsafe fn encrypt_tweak(key: &XtsKey, sector: u64) -> u128 {
        let mut value = _mm_loadu_si128((sector as u128).to_le_bytes().as_ptr() as *const __m128i);
        value = _mm_xor_si128(value, load_key(&key.tweak_encrypt[0]));
        for round in 1..AES256_ROUNDS {
            value = _mm_aesenc_si128(value, load_key(&key.tweak_encrypt[round]));
        }
        value = _mm_aesenclast_si128(value, load_key(&key.tweak_encrypt[AES256_ROUNDS]));
        let mut bytes = [0u8; 16];
        _mm_storeu_si128(bytes.as_mut_ptr() as *mut __m128i, value);
        u128::from_le_bytes(bytes)
    }

    /// Each 128-bit lane times x^16 in GF(2^128): a 16-bit shift with the bits that leave the
    /// top folded back through the reduction polynomial 0x87.
    #[inline(always)]
    unsafe fn advance_sixteen(tweaks: __m512i, polynomial: __m512i) -> __m512i {
        let shifted = _mm512_slli_epi64::<16>(tweaks);
        let carries = _mm512_srli_epi64::<48>(tweaks);
        let low_to_high = _mm512_bslli_epi128::<8>(carries);
        let reduced = _mm512_clmulepi64_epi128::<0x01>(carries, polynomial);
        _mm512_xor_si512(_mm512_xor_si512(shifted, low_to_high), reduced)
    }

    #[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq,aes")]
    pub unsafe fn unit_vaes(key: &XtsKey, direction: Direction, sector: u64, unit: &mut [u8]) {
        let mut tweak = encrypt_tweak(key, sector);
        let round_keys = match direction {
            Direction::Encrypt => &key.data_encrypt,
            Direction::Decrypt => &key.data_decrypt,
        };
        let keys: [__m512i; AES256_ROUNDS + 1] =
            core::array::from_fn(|round| _mm512_broadcast_i32x4(load_key(&round_keys[round])));
        let mut first_sixteen = [0u8; 256];
        for index in 0..16 {
            first_sixteen[16 * index..16 * index + 16].copy_from_slice(&tweak.to_le_bytes());
            tweak = super::multiply_by_alpha(tweak);
        }
        let mut tweaks: [__m512i; 4] =
            core::array::from_fn(|group| _mm512_loadu_si512(first_sixteen.as_ptr().add(64 * group) as *const _));
        let polynomial = _mm512_set_epi64(0, 0x87, 0, 0x87, 0, 0x87, 0, 0x87);
        let blocks = unit.len() / 16;
        let pointer = unit.as_mut_ptr();
        let mut block = 0;
        while block + 16 <= blocks {
            let base = pointer.add(16 * block);
            let mut state: [__m512i; 4] = core::array::from_fn(|group| {
                _mm512_xor_si512(
                    _mm512_xor_si512(_mm512_loadu_si512(base.add(64 * group) as *const _), tweaks[group]),
                    keys[0],
                )
            });
            match direction {
                Direction::Encrypt => {
                    for round_key in &keys[1..AES256_ROUNDS] {
                        for lane in state.iter_mut() {
                            *lane = _mm512_aesenc_epi128(*lane, *round_key);
                        }
                    }
                    for lane in state.iter_mut() {
                        *lane = _mm512_aesenclast_epi128(*lane, keys[AES256_ROUNDS]);
                    }
                }
                Direction::Decrypt => {
                    for round_key in &keys[1..AES256_ROUNDS] {
                        for lane in state.iter_mut() {
                            *lane = _mm512_aesdec_epi128(*lane, *round_key);
                        }
                    }
                    for lane in state.iter_mut() {
                        *lane = _mm512_aesdeclast_epi128(*lane, keys[AES256_ROUNDS]);
                    }
                }
            }
            for group in 0..4 {
                _mm512_storeu_si512(base.add(64 * group) as *mut _, _mm512_xor_si512(state[group], tweaks[group]));
                tweaks[group] = advance_sixteen(tweaks[group], polynomial);
            }
            block += 16;
        }
        // Fewer than sixteen blocks left: one 128-bit lane at a time, tweaks read back out of
        // the vector registers so the sequence continues unbroken.
        if block < blocks {
            let mut pending = [0u8; 256];
            for group in 0..4 {
                _mm512_storeu_si512(pending.as_mut_ptr().add(64 * group) as *mut _, tweaks[group]);
            }
            let mut slot = 0;
            while block < blocks {
                let lane_tweak = _mm_loadu_si128(pending.as_ptr().add(16 * slot) as *const __m128i);
                let base = pointer.add(16 * block) as *mut __m128i;
                let mut value = _mm_xor_si128(_mm_loadu_si128(base), lane_tweak);
                value = _mm_xor_si128(value, load_key(&round_keys[0]));
                for round_key in &round_keys[1..AES256_ROUNDS] {
                    value = match direction {
                        Direction::Encrypt => _mm_aesenc_si128(value, load_key(round_key)),
                        Direction::Decrypt => _mm_aesdec_si128(value, load_key(round_key)),
                    };
                }
                value = match direction {
                    Direction::Encrypt => _mm_aesenclast_si128(value, load_key(&round_keys[AES256_ROUNDS])),
                    Direction::Decrypt => _mm_aesdeclast_si128(value, load_key(&round_keys[AES256_ROUNDS])),
                };
                _mm_storeu_si128(base, _mm_xor_si128(value, lane_tweak));
                block += 1;
                slot += 1;
            }
        }
    }

    #[target_feature(enable = "aes,sse2")]
    pub unsafe fn unit_aesni(key: &XtsKey, direction: Direction, sector: u64, unit: &mut [u8]) {
        let mut tweak = encrypt_tweak(key, sector);
        let round_keys = match direction {
            Direction::Encrypt => &key.data_encrypt,
            Direction::Decrypt => &key.data_decrypt,
        };
        let keys: [__m128i; AES256_ROUNDS + 1] = core::array::from_fn(|round| load_key(&round_keys[round]));
        for group in unit.chunks_mut(128) {
            let lanes = group.len() / 16;
            let mut masks = [_mm_setzero_si128(); 8];
            let mut state = [_mm_setzero_si128(); 8];
            for lane in 0..lanes {
                masks[lane] = _mm_loadu_si128(tweak.to_le_bytes().as_ptr() as *const __m128i);
                tweak = super::multiply_by_alpha(tweak);
                state[lane] = _mm_xor_si128(
                    _mm_xor_si128(_mm_loadu_si128(group.as_ptr().add(16 * lane) as *const __m128i), masks[lane]),
                    keys[0],
                );
            }
            for round_key in &keys[1..AES256_ROUNDS] {
                for lane in state.iter_mut().take(lanes) {
                    *lane = match direction {
                        Direction::Encrypt => _mm_aesenc_si128(*lane, *round_key),
                        Direction::Decrypt => _mm_aesdec_si128(*lane, *round_key),
                    };
                }
            }
            for lane in 0..lanes {
                let value = match direction {
                    Direction::Encrypt => _mm_aesenclast_si128(state[lane], keys[AES256_ROUNDS]),
                    Direction::Decrypt => _mm_aesdeclast_si128(state[lane], keys[AES256_ROUNDS]),
                };
                _mm_storeu_si128(group.as_mut_ptr().add(16 * lane) as *mut __m128i, _mm_xor_si128(value, masks[lane]));
            }
        }
    }
}

/// Which CPU implementation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XtsImplementation {
    Vaes512,
    AesNi,
    Portable,
}

pub fn best_implementation() -> XtsImplementation {
    static CHOICE: OnceLock<XtsImplementation> = OnceLock::new();
    *CHOICE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("vaes")
                && is_x86_feature_detected!("vpclmulqdq")
                && is_x86_feature_detected!("aes")
            {
                return XtsImplementation::Vaes512;
            }
            if is_x86_feature_detected!("aes") {
                return XtsImplementation::AesNi;
            }
        }
        XtsImplementation::Portable
    })
}

/// Encrypt or decrypt one data unit in place with the given implementation.
pub fn process_unit_with(
    implementation: XtsImplementation,
    key: &XtsKey,
    direction: Direction,
    sector: u64,
    unit: &mut [u8],
) {
    assert!(!unit.is_empty() && unit.len().is_multiple_of(AES_BLOCK_BYTES), "XTS data units are whole 16-byte blocks");
    match implementation {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only after the features were detected (see best_implementation).
        XtsImplementation::Vaes512 => unsafe { x86::unit_vaes(key, direction, sector, unit) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        XtsImplementation::AesNi => unsafe { x86::unit_aesni(key, direction, sector, unit) },
        _ => unit_portable(key, direction, sector, unit),
    }
}

/// Encrypt or decrypt consecutive units of `unit_bytes`, the first being `first_sector`.
pub fn process_units(key: &XtsKey, direction: Direction, first_sector: u64, unit_bytes: usize, data: &mut [u8]) {
    assert!(unit_bytes > 0 && data.len().is_multiple_of(unit_bytes), "buffer is not a whole number of data units");
    let implementation = best_implementation();
    for (index, unit) in data.chunks_exact_mut(unit_bytes).enumerate() {
        process_unit_with(implementation, key, direction, first_sector + index as u64, unit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        let clean: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        (0..clean.len()).step_by(2).map(|index| u8::from_str_radix(&clean[index..index + 2], 16).unwrap()).collect()
    }

    fn implementations() -> Vec<XtsImplementation> {
        let mut list = vec![XtsImplementation::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("aes") {
                list.push(XtsImplementation::AesNi);
            }
            if best_implementation() == XtsImplementation::Vaes512 {
                list.push(XtsImplementation::Vaes512);
            }
        }
        list
    }

    #[test]
    fn substitution_box_known_entries() {
        assert_eq!(TABLES.substitution[0x00], 0x63);
        assert_eq!(TABLES.substitution[0x01], 0x7C);
        assert_eq!(TABLES.substitution[0x53], 0xED);
        assert_eq!(TABLES.inverse_substitution[0x63], 0x00);
    }

    /// FIPS-197 appendix C.3: AES-256 of 00112233..ff under key 000102..1f.
    #[test]
    fn aes256_block_known_answer() {
        let key: [u8; 32] = core::array::from_fn(|index| index as u8);
        let round_keys = expand_key(&key);
        let mut block: [u8; 16] = hex("00112233445566778899aabbccddeeff").try_into().unwrap();
        encrypt_block_portable(&round_keys, &mut block);
        assert_eq!(block.to_vec(), hex("8ea2b7ca516745bfeafc49904b496089"));
        decrypt_block_portable(&decryption_keys(&round_keys), &mut block);
        assert_eq!(block.to_vec(), hex("00112233445566778899aabbccddeeff"));
    }

    /// IEEE 1619-2007 XTS-AES-256 vector 10: 512-byte data unit, sequence number 0xff.
    #[test]
    fn ieee_1619_vector_10() {
        let key: [u8; 64] = hex("2718281828459045235360287471352662497757247093699959574966967627\
             3141592653589793238462643383279502884197169399375105820974944592")
        .try_into()
        .unwrap();
        let key = XtsKey::new(&key);
        let plain: Vec<u8> = (0..512).map(|index| index as u8).collect();
        let expected = hex(include_str!("../tests/ieee1619_vector10_ciphertext.hex"));
        assert_eq!(expected.len(), 512);
        for implementation in implementations() {
            let mut buffer = plain.clone();
            process_unit_with(implementation, &key, Direction::Encrypt, 0xff, &mut buffer);
            assert_eq!(buffer, expected, "{implementation:?} encrypt");
            process_unit_with(implementation, &key, Direction::Decrypt, 0xff, &mut buffer);
            assert_eq!(buffer, plain, "{implementation:?} decrypt");
        }
    }

    /// All implementations agree on 4 KiB sectors and odd unit sizes with large sector numbers.
    #[test]
    fn implementations_agree() {
        let key_bytes: [u8; 64] = core::array::from_fn(|index| (index as u8).wrapping_mul(37).wrapping_add(11));
        let key = XtsKey::new(&key_bytes);
        for (unit_bytes, sector) in
            [(4096usize, 0u64), (4096, 1 << 40), (16, 5), (48, u64::MAX), (272, 77), (4096 + 48, 3)]
        {
            let plain: Vec<u8> = (0..unit_bytes).map(|index| (index * 7 + 3) as u8).collect();
            let mut reference = plain.clone();
            process_unit_with(XtsImplementation::Portable, &key, Direction::Encrypt, sector, &mut reference);
            for implementation in implementations() {
                let mut buffer = plain.clone();
                process_unit_with(implementation, &key, Direction::Encrypt, sector, &mut buffer);
                assert_eq!(buffer, reference, "{implementation:?} unit {unit_bytes}");
                process_unit_with(implementation, &key, Direction::Decrypt, sector, &mut buffer);
                assert_eq!(buffer, plain);
            }
        }
    }

    /// Dropping a key wipes its round keys (issue 8: keys are zeroed when dropped).
    #[test]
    fn dropped_key_is_zeroed() {
        let mut key = std::mem::ManuallyDrop::new(XtsKey::new(&[0xA5; 64]));
        assert!(key.data_encrypt.iter().flatten().any(|&byte| byte != 0));
        // SAFETY: the key is dropped once and never used as a key again; its storage stays
        // allocated inside the ManuallyDrop, so reading the plain byte arrays back is sound.
        unsafe { std::mem::ManuallyDrop::drop(&mut key) };
        for round_keys in [&key.data_encrypt, &key.data_decrypt, &key.tweak_encrypt] {
            assert!(round_keys.iter().flatten().all(|&byte| byte == 0), "round keys survive the drop");
        }
    }

    /// 4 KiB sectors checked against OpenSSL's XTS (through Python's `cryptography`), recorded
    /// as the CRC32C of each ciphertext.
    #[test]
    fn matches_openssl_on_4k_sectors() {
        let key_bytes: [u8; 64] = core::array::from_fn(|index| (index as u8).wrapping_mul(37).wrapping_add(11));
        let key = XtsKey::new(&key_bytes);
        let plain: Vec<u8> = (0..4096).map(|index| (index * 7 + 3) as u8).collect();
        for (sector, expected) in [(0u64, 0xDB41_06B8u32), (1 << 40, 0x2DC7_F3D5), (u64::MAX, 0x3A95_54DB)] {
            let mut buffer = plain.clone();
            process_units(&key, Direction::Encrypt, sector, SECTOR_SIZE_BYTES, &mut buffer);
            assert_eq!(crate::crc::crc32c(0, &buffer), expected, "sector {sector:#x}");
        }
    }
}
