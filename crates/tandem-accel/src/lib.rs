//! tandem-accel: the storage-service runtime (GPUstore's ideas) with a CPU engine and a CUDA engine.
//!
//! Services: CRC32C, AES-256-XTS over 4 KiB sectors and Reed–Solomon erasure coding over
//! GF(2^8). Every service gives the same bytes on every engine. The engine crate uses
//! [`crc32c`] for every metadata checksum. `docs/ACCEL.md` defines each service exactly.

pub mod bench;
pub mod crc;
pub mod cuda;
pub mod dirindex;
pub mod engine;
pub mod error;
pub mod galois;
pub mod isal;
pub mod pool;
pub mod reed_solomon;
pub mod runtime;
pub mod xts;

pub use engine::{CpuEngine, Engine, EngineKind, Sectors};
pub use error::{AccelError, Result};
pub use pool::{BufferPool, HostBuffer};
pub use reed_solomon::ReedSolomon;
pub use runtime::{Accelerator, Completion, Mode, Request, Response, RuntimeConfig, Service};
pub use xts::{Direction, XtsKey, SECTOR_SIZE_BYTES};

/// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`, continuing from `crc`
/// (pass 0 to start). `crc32c(0, b"123456789") == 0xE306_9283`. Uses the SSE4.2 `crc32`
/// instruction on three interleaved streams where the CPU has it.
pub fn crc32c(crc: u32, data: &[u8]) -> u32 {
    crc::crc32c(crc, data)
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32c_check_value() {
        assert_eq!(super::crc32c(0, b"123456789"), 0xE306_9283);
    }
}
