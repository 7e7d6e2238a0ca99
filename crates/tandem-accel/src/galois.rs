//! Arithmetic in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11D), generator 2.

/// Field polynomial including the x^8 term.
pub const FIELD_POLYNOMIAL: u16 = 0x11D;

pub struct Tables {
    pub exponent: [u8; 512],
    pub logarithm: [u8; 256],
}

pub static TABLES: Tables = build();

const fn build() -> Tables {
    let mut exponent = [0u8; 512];
    let mut logarithm = [0u8; 256];
    let mut value: u16 = 1;
    let mut power = 0;
    while power < 255 {
        exponent[power] = value as u8;
        exponent[power + 255] = value as u8;
        logarithm[value as usize] = power as u8;
        value <<= 1;
        if value & 0x100 != 0 {
            value ^= FIELD_POLYNOMIAL;
        }
        power += 1;
    }
    // Entries 510 and 511 are never read by multiply (log sums are at most 508).
    Tables { exponent, logarithm }
}

#[inline]
pub fn multiply(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    TABLES.exponent[TABLES.logarithm[a as usize] as usize + TABLES.logarithm[b as usize] as usize]
}

#[inline]
pub fn inverse(a: u8) -> u8 {
    assert!(a != 0, "zero has no inverse in GF(2^8)");
    TABLES.exponent[255 - TABLES.logarithm[a as usize] as usize]
}

/// The 256 products c·x for every x: one row of the full multiplication table.
pub fn multiplication_row(constant: u8) -> [u8; 256] {
    let mut row = [0u8; 256];
    for (value, product) in row.iter_mut().enumerate() {
        *product = multiply(constant, value as u8);
    }
    row
}

/// The 8×8 bit matrix, packed as GF2P8AFFINEQB wants it, that multiplies a byte by `constant`.
/// Byte 7−i of the result holds the input bits that contribute to output bit i.
pub fn affine_matrix(constant: u8) -> u64 {
    let mut matrix = 0u64;
    for output_bit in 0..8 {
        let mut row = 0u8;
        for input_bit in 0..8 {
            if multiply(constant, 1 << input_bit) & (1 << output_bit) != 0 {
                row |= 1 << input_bit;
            }
        }
        matrix |= (row as u64) << (8 * (7 - output_bit));
    }
    matrix
}

/// Inverts a square matrix (row-major, `size`×`size`) by Gauss–Jordan elimination.
/// Returns None when the matrix is singular.
pub fn invert_matrix(matrix: &[u8], size: usize) -> Option<Vec<u8>> {
    assert_eq!(matrix.len(), size * size);
    let mut work = matrix.to_vec();
    let mut result = vec![0u8; size * size];
    for index in 0..size {
        result[index * size + index] = 1;
    }
    for column in 0..size {
        let pivot_row = (column..size).find(|&row| work[row * size + column] != 0)?;
        if pivot_row != column {
            for entry in 0..size {
                work.swap(pivot_row * size + entry, column * size + entry);
                result.swap(pivot_row * size + entry, column * size + entry);
            }
        }
        let scale = inverse(work[column * size + column]);
        for entry in 0..size {
            work[column * size + entry] = multiply(work[column * size + entry], scale);
            result[column * size + entry] = multiply(result[column * size + entry], scale);
        }
        for row in 0..size {
            let factor = work[row * size + column];
            if row == column || factor == 0 {
                continue;
            }
            for entry in 0..size {
                work[row * size + entry] ^= multiply(factor, work[column * size + entry]);
                result[row * size + entry] ^= multiply(factor, result[column * size + entry]);
            }
        }
    }
    Some(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_axioms_hold() {
        for a in 1..=255u8 {
            assert_eq!(multiply(a, inverse(a)), 1);
            assert_eq!(multiply(a, 1), a);
        }
        // The generator 2 has order 255 (0x11D is primitive).
        let distinct: std::collections::HashSet<u8> = (0..255).map(|power| TABLES.exponent[power]).collect();
        assert_eq!(distinct.len(), 255);
    }

    #[test]
    fn affine_matrix_multiplies() {
        for constant in [0u8, 1, 2, 3, 0x1D, 0x80, 0xFF] {
            let matrix = affine_matrix(constant);
            for value in 0..=255u8 {
                let mut product = 0u8;
                for output_bit in 0..8 {
                    let row = (matrix >> (8 * (7 - output_bit))) as u8;
                    if (row & value).count_ones() % 2 == 1 {
                        product |= 1 << output_bit;
                    }
                }
                assert_eq!(product, multiply(constant, value));
            }
        }
    }
}
