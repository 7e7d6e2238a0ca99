//! Placeholder until the CUDA engine lands.
use crate::bench::{BenchConfig, Report};
use crate::reed_solomon::ReedSolomon;
use crate::xts::XtsKey;
pub struct CudaSystem;
impl CudaSystem {
    pub fn open() -> Result<Self, String> {
        Err("CUDA engine not built yet".into())
    }
}
pub fn bench_crc32c(_: &CudaSystem, _: &BenchConfig, _: &mut Report) {}
pub fn bench_xts(_: &CudaSystem, _: &BenchConfig, _: &XtsKey, _: &mut Report) {}
pub fn bench_reed_solomon(_: &CudaSystem, _: &BenchConfig, _: &ReedSolomon, _: &mut Report) {}
