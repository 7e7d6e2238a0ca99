//! ext4's half-MD4 directory name hash ("half_md4_unsigned", hash version 4), written from the
//! description of the algorithm: the name is cut into 32-byte pieces, each piece is packed
//! into eight 32-bit words (padded with a value made from the length) and stirred into a
//! four-word state with three reduced MD4 rounds. The state starts from the volume's seed.

use crate::error::{Error, Result};

/// A volume's hash seed, as ext4's `s_hash_seed`: four 32-bit words.
///
/// A seed written as a UUID string maps to these words the way e2fsprogs does it: the 16 bytes
/// of the UUID (in the order they are written) are read as four little-endian 32-bit words.
/// An all-zero seed means "no seed": the hash then starts from MD4's initial values.
pub type HashSeed = [u32; 4];

/// MD4's initial state, used when the seed is all zero.
const DEFAULT_STATE: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
/// Round constants of rounds 2 and 3 (MD4's square roots of 2 and 3, in octal in the kernel).
const ROUND_2_CONSTANT: u32 = 0x5a82_7999;
const ROUND_3_CONSTANT: u32 = 0x6ed9_eba1;
/// Bytes of name consumed by one transform.
const PIECE_BYTES: usize = 32;
/// Words of input per transform.
const PIECE_WORDS: usize = 8;
/// ext4 never hands out this major hash: it is its end-of-directory marker (0x7fffffff << 1).
const END_OF_DIRECTORY_HASH: u32 = 0xffff_fffe;

/// Parses a UUID string ("01234567-89ab-cdef-0123-456789abcdef") into a hash seed.
pub fn hash_seed_from_uuid(uuid: &str) -> Result<HashSeed> {
    let digits: Vec<u8> = uuid.bytes().filter(|byte| *byte != b'-').collect();
    if digits.len() != 32 || uuid.len() != 36 {
        return Err(Error::invalid(format!("{uuid:?} is not a UUID")));
    }
    let mut bytes = [0u8; 16];
    for (index, byte) in bytes.iter_mut().enumerate() {
        let text =
            std::str::from_utf8(&digits[index * 2..index * 2 + 2]).map_err(|_| Error::invalid("UUID is not ASCII"))?;
        *byte = u8::from_str_radix(text, 16).map_err(|_| Error::invalid(format!("{uuid:?} is not a UUID")))?;
    }
    let mut seed = [0u32; 4];
    for (index, word) in seed.iter_mut().enumerate() {
        *word = u32::from_le_bytes(bytes[index * 4..index * 4 + 4].try_into().unwrap());
    }
    Ok(seed)
}

/// Packs up to 32 bytes of `name` into eight words as ext4 does: big-endian-ish accumulation
/// of unsigned bytes, four to a word, the rest of the words filled with a length-derived pad.
/// `remaining_length` is the length of the name from this piece to its end (it feeds the pad).
fn pack_piece(piece: &[u8], remaining_length: usize) -> [u32; PIECE_WORDS] {
    assert!(piece.len() <= PIECE_BYTES);
    let length_byte = remaining_length as u32; // ext4 truncates to 32 bits too; names are <= 255
    let mut pad = length_byte | (length_byte << 8);
    pad |= pad << 16;
    let mut words = [pad; PIECE_WORDS];
    let mut value = pad;
    let mut word_index = 0;
    for (index, byte) in piece.iter().enumerate() {
        value = (*byte as u32).wrapping_add(value << 8);
        if index % 4 == 3 {
            words[word_index] = value;
            word_index += 1;
            value = pad;
        }
    }
    if word_index < PIECE_WORDS {
        // A partial word (or, for an empty tail, the pad itself) goes into the next slot.
        words[word_index] = value;
    }
    words
}

fn round_1(x: u32, y: u32, z: u32) -> u32 {
    z ^ (x & (y ^ z))
}
fn round_2(x: u32, y: u32, z: u32) -> u32 {
    (x & y).wrapping_add((x ^ y) & z)
}
fn round_3(x: u32, y: u32, z: u32) -> u32 {
    x ^ y ^ z
}

/// The reduced ("half") MD4 transform: 3 rounds of 8 steps over 8 input words.
fn transform(state: &mut [u32; 4], input: &[u32; PIECE_WORDS]) {
    let [mut a, mut b, mut c, mut d] = *state;
    // (function, constant, word order, shifts) of each round.
    type Mix = fn(u32, u32, u32) -> u32;
    let rounds: [(Mix, u32, [usize; 8], [u32; 4]); 3] = [
        (round_1, 0, [0, 1, 2, 3, 4, 5, 6, 7], [3, 7, 11, 19]),
        (round_2, ROUND_2_CONSTANT, [1, 3, 5, 7, 0, 2, 4, 6], [3, 5, 9, 13]),
        (round_3, ROUND_3_CONSTANT, [3, 7, 2, 6, 1, 5, 0, 4], [3, 9, 11, 15]),
    ];
    for (mix, constant, order, shifts) in rounds.iter() {
        for step in 0..8 {
            let word = input[order[step]].wrapping_add(*constant);
            // The four state words take turns: a, d, c, b.
            match step % 4 {
                0 => a = a.wrapping_add(mix(b, c, d)).wrapping_add(word).rotate_left(shifts[0]),
                1 => d = d.wrapping_add(mix(a, b, c)).wrapping_add(word).rotate_left(shifts[1]),
                2 => c = c.wrapping_add(mix(d, a, b)).wrapping_add(word).rotate_left(shifts[2]),
                _ => b = b.wrapping_add(mix(c, d, a)).wrapping_add(word).rotate_left(shifts[3]),
            }
        }
    }
    state[0] = state[0].wrapping_add(a);
    state[1] = state[1].wrapping_add(b);
    state[2] = state[2].wrapping_add(c);
    state[3] = state[3].wrapping_add(d);
}

/// ext4's half-MD4 hash of `name` with unsigned chars (`dx_hash -h 4` in debugfs).
/// Returns (major, minor); the major hash has its lowest bit clear, as in ext4.
pub fn half_md4(seed: &HashSeed, name: &[u8]) -> (u32, u32) {
    let mut state = if seed.iter().any(|word| *word != 0) { *seed } else { DEFAULT_STATE };
    // An empty name still runs no transform, as in ext4; callers never hash one.
    let mut offset = 0;
    while offset < name.len() {
        let end = (offset + PIECE_BYTES).min(name.len());
        let words = pack_piece(&name[offset..end], name.len() - offset);
        transform(&mut state, &words);
        offset = end;
    }
    let mut major = state[1] & !1;
    if major == END_OF_DIRECTORY_HASH {
        major = END_OF_DIRECTORY_HASH - 2;
    }
    (major, state[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_hex(text: &str) -> Vec<u8> {
        assert_eq!(text.len() & 1, 0, "odd number of hex digits");
        (0..text.len() / 2).map(|index| u8::from_str_radix(&text[index * 2..index * 2 + 2], 16).unwrap()).collect()
    }

    /// Every vector from `scripts/gen-half-md4-vectors.sh` (debugfs `dx_hash -h 4 -s SEED`).
    #[test]
    fn half_md4_matches_debugfs_vectors() {
        let text = include_str!("testdata/half_md4_vectors.tsv");
        let mut checked = 0;
        let mut utf8_names = 0;
        for (line_number, line) in text.lines().enumerate() {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 4, "line {}", line_number + 1);
            let seed = hash_seed_from_uuid(fields[0]).unwrap();
            let major = u32::from_str_radix(fields[1], 16).unwrap();
            let minor = u32::from_str_radix(fields[2], 16).unwrap();
            let name = decode_hex(fields[3]);
            assert!((1..=255).contains(&name.len()));
            if name.iter().any(|byte| *byte >= 0x80) {
                utf8_names += 1;
            }
            assert_eq!(
                half_md4(&seed, &name),
                (major, minor),
                "line {}: {:?}",
                line_number + 1,
                String::from_utf8_lossy(&name)
            );
            checked += 1;
        }
        assert!(checked >= 1000, "only {checked} vectors");
        assert!(utf8_names >= 100, "only {utf8_names} UTF-8 names");
    }

    #[test]
    fn uuid_maps_to_little_endian_words() {
        let seed = hash_seed_from_uuid("01234567-89ab-cdef-0123-456789abcdef").unwrap();
        assert_eq!(seed, [0x6745_2301, 0xefcd_ab89, 0x6745_2301, 0xefcd_ab89]);
        assert!(hash_seed_from_uuid("not-a-uuid").is_err());
        assert!(hash_seed_from_uuid("01234567-89ab-cdef-0123-456789abcdeg").is_err());
    }
}
