//! tandem-accel: the storage-service runtime (GPUstore's ideas) with a CPU engine and a CUDA engine.
//!
//! This crate owns CRC32C, AES-256-XTS and Reed-Solomon erasure coding. The engine crate uses
//! [`crc32c`] for every metadata checksum.

/// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`, continuing from `crc`
/// (pass 0 to start). `crc32c(0, b"123456789") == 0xE306_9283`.
pub fn crc32c(crc: u32, data: &[u8]) -> u32 {
    let mut value = !crc;
    for &byte in data {
        value ^= byte as u32;
        for _ in 0..8 {
            value = if value & 1 != 0 { (value >> 1) ^ 0x82F6_3B78 } else { value >> 1 };
        }
    }
    !value
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32c_check_value() {
        assert_eq!(super::crc32c(0, b"123456789"), 0xE306_9283);
    }
}
