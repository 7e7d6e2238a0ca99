//! The CUDA engine: kernels compiled at run time by NVRTC, cached on disk, driven through
//! `cudarc`'s driver bindings with dynamic loading.
//!
//! `cudarc` panics when it cannot load `libcuda`, so [`CudaSystem::open`] first looks for the
//! libraries with `dlopen` and only then touches `cudarc`. Every failure becomes an `Err`
//! with the reason; callers then run the CPU engine.

use crate::bench::{measure, BenchConfig, Measurement, Report};
use crate::crc;
use crate::engine::{check_blocks, check_sectors, check_shards, CpuEngine, Engine, EngineKind, Sectors};
use crate::error::{AccelError, Result};
use crate::reed_solomon::{self, ReedSolomon};
use crate::xts::{Direction, XtsKey, SECTOR_SIZE_BYTES};
use cudarc::driver::sys;
use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The kernels, compiled at run time.
pub const KERNEL_SOURCE: &str = include_str!("../kernels/services.cu");

/// Streams per device that the stream scheduler hands out to every service.
pub const STREAMS_PER_DEVICE: usize = 4;
/// Device staging memory per stream: one pipelined chunk in flight per stream.
pub const SLOT_BYTES: usize = 64 << 20;
/// Room after the chunk for sector lists and checksums.
const SLOT_EXTRA_BYTES: usize = 1 << 20;
/// Threads per CUDA block for every kernel (the kernels declare this launch bound).
const THREADS_PER_BLOCK: u32 = 256;
/// Rows the Reed-Solomon kernel produces per launch, and columns it accepts.
const RS_ROWS_PER_LAUNCH: usize = 4;
pub const RS_MAXIMUM_COLUMNS: usize = 32;

fn device_error(what: &str, error: impl std::fmt::Debug) -> AccelError {
    AccelError::Device(format!("{what}: {error:?}"))
}

pub(crate) fn check(result: sys::CUresult, what: &str) -> Result<()> {
    result.result().map_err(|error| device_error(what, error))
}

/// The result of a call that starts the driver (`cuInit`, `cuDeviceGetCount`): the codes that
/// say the machine has no GPU to use — no device, or a stub `libcuda` (a container or a build
/// machine without the real driver) — are `NoGpu`; every other failure is `Device`, a driver
/// that is there and failed. Every call after the driver started goes through [`check`], so
/// an error there (a kernel that does not load, memory, a launch) is always `Device`.
pub fn start_failure(result: sys::CUresult, what: &str) -> Result<()> {
    match result {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        sys::CUresult::CUDA_ERROR_NO_DEVICE | sys::CUresult::CUDA_ERROR_STUB_LIBRARY => {
            Err(AccelError::NoGpu(format!("{what}: {result:?}")))
        }
        _ => Err(device_error(what, result)),
    }
}

/// Whether a shared library can be loaded (it stays loaded; cudarc will load it again).
fn library_present(names: &[&CStr]) -> Option<String> {
    for name in names {
        // SAFETY: dlopen with a NUL-terminated name; the handle is intentionally kept.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            return Some(name.to_string_lossy().into_owned());
        }
    }
    None
}

/// Looks for libnvrtc alone (compiling kernels needs no GPU).
pub fn probe_nvrtc() -> std::result::Result<(), String> {
    library_present(&[c"libnvrtc.so", c"libnvrtc.so.13", c"libnvrtc.so.12"])
        .map(|_| ())
        .ok_or_else(|| "libnvrtc.so not found (add CUDA's lib64 to LD_LIBRARY_PATH)".to_string())
}

/// Looks for libcuda and libnvrtc without touching cudarc.
pub fn probe() -> std::result::Result<(), String> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            if library_present(&[c"libcuda.so.1", c"libcuda.so"]).is_none() {
                return Err("libcuda.so not found (no NVIDIA driver)".into());
            }
            if library_present(&[c"libnvrtc.so", c"libnvrtc.so.13", c"libnvrtc.so.12"]).is_none() {
                return Err("libnvrtc.so not found (add CUDA's lib64 to LD_LIBRARY_PATH)".into());
            }
            Ok(())
        })
        .clone()
}

/// AES tables for the kernels: forward round tables and S-box, then the inverse ones
/// (1280 words each), then the eight CRC32C slicing tables (2048 words).
fn device_tables() -> Vec<u32> {
    let aes = &crate::xts::TABLES;
    let mut words = Vec::with_capacity(2 * 1280 + 2048);
    for table in &aes.encrypt {
        words.extend_from_slice(table);
    }
    words.extend(aes.substitution.iter().map(|&b| b as u32));
    for table in &aes.decrypt {
        words.extend_from_slice(table);
    }
    words.extend(aes.inverse_substitution.iter().map(|&b| b as u32));
    // Slicing table j maps a byte to its CRC contribution j bytes further on.
    let mut slicing = vec![[0u32; 256]; 8];
    slicing[0] = *crc::table();
    for j in 1..8 {
        for index in 0..256 {
            let previous = slicing[j - 1][index];
            slicing[j][index] = (previous >> 8) ^ slicing[0][(previous & 0xFF) as usize];
        }
    }
    for table in &slicing {
        words.extend_from_slice(table);
    }
    words
}
const CRC_TABLES_OFFSET_WORDS: usize = 2560;

#[repr(C)]
#[derive(Clone, Copy)]
struct XtsKeyParameters {
    data: [u32; 60],
    tweak: [u32; 60],
}

fn key_words(round_keys: &crate::xts::RoundKeys) -> [u32; 60] {
    let mut words = [0u32; 60];
    for (round, key) in round_keys.iter().enumerate() {
        for column in 0..4 {
            words[4 * round + column] = u32::from_le_bytes(key[4 * column..4 * column + 4].try_into().unwrap());
        }
    }
    words
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash = 0xCBF2_9CE4_8422_2325u64;
    for part in parts {
        for &byte in *part {
            hash ^= byte as u64;
            hash = hash.wrapping_mul(0x0100_0000_01B3);
        }
        hash ^= 0xFF;
        hash = hash.wrapping_mul(0x0100_0000_01B3);
    }
    hash
}

/// Where compiled kernels are kept: $XDG_CACHE_HOME/tandemfs/ptx, else ~/.cache/tandemfs/ptx.
pub fn kernel_cache_directory() -> Option<PathBuf> {
    if let Some(directory) = std::env::var_os("TANDEM_KERNEL_CACHE") {
        return Some(PathBuf::from(directory));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("tandemfs").join("ptx"))
}

/// Compiles the kernels for `sm_<major><minor>` into a CUBIN, or reads it from the cache.
/// Returns the image and whether it came from the cache.
pub fn compiled_kernels(major: i32, minor: i32) -> Result<(Vec<u8>, bool, PathBuf)> {
    compiled_kernels_in(&kernel_cache_directory().unwrap_or_else(std::env::temp_dir), major, minor)
}

/// `compiled_kernels` with the cache in `directory` (tests give their own, instead of changing
/// the process's environment under tests running beside them).
pub fn compiled_kernels_in(directory: &Path, major: i32, minor: i32) -> Result<(Vec<u8>, bool, PathBuf)> {
    // TANDEM_XTS_UNROLL picks how many XTS blocks a lane keeps in flight (default 1, the
    // fastest measured; see kernels/services.cu).
    let unroll = std::env::var("TANDEM_XTS_UNROLL").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(1).clamp(1, 8);
    let unroll_option = format!("-DXTS_BLOCK_UNROLL={unroll}");
    compile_cached_in(directory, "services", KERNEL_SOURCE, &[unroll_option.as_str()], major, minor)
}

/// Compiles `source` (named `<stem>.cu`) for `sm_<major><minor>` into a CUBIN, or reads it
/// from the cache as `<stem>-sm<XY>-<hash>.cubin`. Returns the image and whether it came from
/// the cache. Shared by every kernel source of the crate (services.cu, dirindex.cu).
pub fn compile_cached(
    stem: &str,
    source_text: &str,
    extra_options: &[&str],
    major: i32,
    minor: i32,
) -> Result<(Vec<u8>, bool, PathBuf)> {
    let directory = kernel_cache_directory().unwrap_or_else(std::env::temp_dir);
    compile_cached_in(&directory, stem, source_text, extra_options, major, minor)
}

/// `compile_cached` with the cache in `directory`.
pub fn compile_cached_in(
    directory: &Path,
    stem: &str,
    source_text: &str,
    extra_options: &[&str],
    major: i32,
    minor: i32,
) -> Result<(Vec<u8>, bool, PathBuf)> {
    let architecture = format!("--gpu-architecture=sm_{major}{minor}");
    let mut options = vec![architecture.as_str(), "--std=c++17", "-default-device"];
    options.extend_from_slice(extra_options);
    let mut nvrtc_major = 0;
    let mut nvrtc_minor = 0;
    // SAFETY: plain out-parameters.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut nvrtc_major, &mut nvrtc_minor) };
    let version = format!("nvrtc {nvrtc_major}.{nvrtc_minor}");
    let key = fnv1a(&[source_text.as_bytes(), options.join(" ").as_bytes(), version.as_bytes()]);
    let path = directory.join(format!("{stem}-sm{major}{minor}-{key:016x}.cubin"));
    if let Ok(image) = std::fs::read(&path) {
        if !image.is_empty() {
            return Ok((image, true, path));
        }
    }
    let source = CString::new(source_text).expect("kernel source has no NUL");
    let file_name = CString::new(format!("{stem}.cu")).expect("stem has no NUL");
    let program = cudarc::nvrtc::result::create_program(&source, Some(file_name.as_c_str()))
        .map_err(|error| device_error("nvrtcCreateProgram", error))?;
    // SAFETY: program was just created and is destroyed below on every path.
    let compiled = unsafe { cudarc::nvrtc::result::compile_program(program, &options) };
    let image = unsafe {
        if let Err(error) = compiled {
            let log = cudarc::nvrtc::result::get_program_log(program)
                .map(|log| CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned())
                .unwrap_or_default();
            let _ = cudarc::nvrtc::result::destroy_program(program);
            return Err(AccelError::Device(format!("NVRTC compile failed: {error:?}\n{log}")));
        }
        let mut size = 0usize;
        let status = cudarc::nvrtc::sys::nvrtcGetCUBINSize(program, &mut size);
        let mut image = vec![0u8; size];
        let status2 = cudarc::nvrtc::sys::nvrtcGetCUBIN(program, image.as_mut_ptr() as *mut _);
        let _ = cudarc::nvrtc::result::destroy_program(program);
        status.result().map_err(|error| device_error("nvrtcGetCUBINSize", error))?;
        status2.result().map_err(|error| device_error("nvrtcGetCUBIN", error))?;
        image
    };
    // A failed cache write only costs a recompile next time.
    if std::fs::create_dir_all(directory).is_ok() {
        let temporary = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&temporary, &image).is_ok() {
            let _ = std::fs::rename(&temporary, &path);
        }
    }
    Ok((image, false, path))
}

/// Chunk size for pipelining `total_bytes` over the streams: about eight chunks so copies in,
/// kernels and copies out of neighbouring chunks overlap, but at least 2 MiB (smaller copies
/// and launches cost more than they hide) and at most one staging slot; a multiple of `unit`.
fn pipeline_chunk_bytes(total_bytes: usize, unit: usize) -> usize {
    assert!(unit > 0 && unit <= SLOT_BYTES);
    let wanted = (total_bytes / 8).clamp(2 << 20, SLOT_BYTES);
    (wanted / unit).max(1) * unit
}

/// One stream of the scheduler with its staging memory on the device.
struct StreamSlot {
    stream: sys::CUstream,
    buffer: sys::CUdeviceptr,
}

/// One GPU with its context, module, tables and streams.
pub struct CudaDevice {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: u32,
    pub kernel_from_cache: bool,
    pub kernel_path: PathBuf,
    context: sys::CUcontext,
    crc_function: sys::CUfunction,
    xts_encrypt_function: sys::CUfunction,
    xts_decrypt_function: sys::CUfunction,
    reed_solomon_function: sys::CUfunction,
    tables: sys::CUdeviceptr,
    slots: Vec<Mutex<StreamSlot>>,
    next_slot: AtomicUsize,
}

// SAFETY: CUDA driver handles may be used from any thread once the context is made current
// (every entry point calls `bind`); slots are behind mutexes.
unsafe impl Send for CudaDevice {}
unsafe impl Sync for CudaDevice {}

fn attribute(device: sys::CUdevice, which: sys::CUdevice_attribute) -> Result<i32> {
    let mut value = 0;
    // SAFETY: out-parameter.
    check(unsafe { sys::cuDeviceGetAttribute(&mut value, which, device) }, "cuDeviceGetAttribute")?;
    Ok(value)
}

/// A request's completion marker on one stream.
struct Marker(sys::CUevent);

impl Marker {
    fn record(stream: sys::CUstream) -> Result<Self> {
        let mut event = std::ptr::null_mut();
        // Blocking sync: the host thread sleeps instead of spinning while it waits.
        let flags =
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32 | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        check(unsafe { sys::cuEventCreate(&mut event, flags) }, "cuEventCreate")?;
        let marker = Marker(event);
        check(unsafe { sys::cuEventRecord(event, stream) }, "cuEventRecord")?;
        Ok(marker)
    }
    fn wait(&self) -> Result<()> {
        check(unsafe { sys::cuEventSynchronize(self.0) }, "cuEventSynchronize")
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

impl CudaDevice {
    fn open(ordinal: usize) -> Result<Self> {
        unsafe {
            let mut device = 0;
            check(sys::cuDeviceGet(&mut device, ordinal as i32), "cuDeviceGet")?;
            // Sleep in waits rather than spin: host CPU time per GB is one of the targets.
            let _ = sys::cuDevicePrimaryCtxSetFlags_v2(device, sys::CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32);
            let mut context = std::ptr::null_mut();
            check(sys::cuDevicePrimaryCtxRetain(&mut context, device), "cuDevicePrimaryCtxRetain")?;
            check(sys::cuCtxSetCurrent(context), "cuCtxSetCurrent")?;
            let mut name_bytes = [0 as std::ffi::c_char; 128];
            check(sys::cuDeviceGetName(name_bytes.as_mut_ptr(), 128, device), "cuDeviceGetName")?;
            let name = CStr::from_ptr(name_bytes.as_ptr()).to_string_lossy().into_owned();
            let major = attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            let multiprocessors =
                attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
            let (image, kernel_from_cache, kernel_path) = compiled_kernels(major, minor)?;
            let mut module = std::ptr::null_mut();
            check(sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void), "cuModuleLoadData")?;
            let function = |name: &CStr| -> Result<sys::CUfunction> {
                let mut function = std::ptr::null_mut();
                check(sys::cuModuleGetFunction(&mut function, module, name.as_ptr()), "cuModuleGetFunction")?;
                Ok(function)
            };
            let crc_function = function(c"crc32c_blocks_kernel")?;
            let xts_encrypt_function = function(c"xts_encrypt_kernel")?;
            let xts_decrypt_function = function(c"xts_decrypt_kernel")?;
            let reed_solomon_function = function(c"reed_solomon_kernel")?;
            let words = device_tables();
            let mut tables = 0;
            check(sys::cuMemAlloc_v2(&mut tables, words.len() * 4), "cuMemAlloc tables")?;
            check(sys::cuMemcpyHtoD_v2(tables, words.as_ptr() as *const c_void, words.len() * 4), "upload tables")?;
            let mut slots = Vec::with_capacity(STREAMS_PER_DEVICE);
            for _ in 0..STREAMS_PER_DEVICE {
                let mut stream = std::ptr::null_mut();
                check(
                    sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
                    "cuStreamCreate",
                )?;
                let mut buffer = 0;
                check(sys::cuMemAlloc_v2(&mut buffer, SLOT_BYTES + SLOT_EXTRA_BYTES), "cuMemAlloc staging")?;
                slots.push(Mutex::new(StreamSlot { stream, buffer }));
            }
            Ok(CudaDevice {
                ordinal,
                name,
                compute_capability: (major, minor),
                multiprocessors,
                kernel_from_cache,
                kernel_path,
                context,
                crc_function,
                xts_encrypt_function,
                xts_decrypt_function,
                reed_solomon_function,
                tables,
                slots,
                next_slot: AtomicUsize::new(0),
            })
        }
    }

    fn bind(&self) -> Result<()> {
        check(unsafe { sys::cuCtxSetCurrent(self.context) }, "cuCtxSetCurrent")
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind_context(&self) -> Result<()> {
        self.bind()
    }

    /// The stream scheduler: round robin over the device's streams, shared by all services.
    /// Work on one stream runs in order, so a slot's staging memory is reused only after the
    /// previous chunk's copies finished, without the host waiting.
    fn slot(&self) -> std::sync::MutexGuard<'_, StreamSlot> {
        let index = self.next_slot.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        self.slots[index].lock().expect("stream slot poisoned")
    }

    /// Grid-stride kernels get exactly one wave: as many blocks as can be resident at once
    /// (a second, partial wave left up to a third of the device idle in the first H200 runs).
    fn grid(&self, function: sys::CUfunction, work_blocks: u64) -> u32 {
        let mut per_multiprocessor = 0;
        // SAFETY: out-parameter; the function handle belongs to the loaded module.
        let status = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_multiprocessor,
                function,
                THREADS_PER_BLOCK as i32,
                0,
            )
        };
        let per_multiprocessor = if status == sys::CUresult::CUDA_SUCCESS { per_multiprocessor.max(1) } else { 4 };
        work_blocks.clamp(1, self.multiprocessors as u64 * per_multiprocessor as u64) as u32
    }

    unsafe fn launch(
        &self,
        function: sys::CUfunction,
        grid: u32,
        stream: sys::CUstream,
        parameters: &mut [*mut c_void],
    ) -> Result<()> {
        check(
            sys::cuLaunchKernel(
                function,
                grid,
                1,
                1,
                THREADS_PER_BLOCK,
                1,
                1,
                0,
                stream,
                parameters.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            "cuLaunchKernel",
        )
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn enqueue_xts(
        &self,
        keys: &XtsKeyParameters,
        decrypt: bool,
        first_sector: u64,
        sector_list: sys::CUdeviceptr,
        data: sys::CUdeviceptr,
        sector_count: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let mut tables = self.tables;
        let mut keys = *keys;
        let mut first_sector = first_sector;
        let mut sector_list = sector_list;
        let mut data = data;
        let mut count = sector_count;
        let mut parameters: [*mut c_void; 6] = [
            &mut tables as *mut _ as *mut c_void,
            &mut keys as *mut _ as *mut c_void,
            &mut first_sector as *mut _ as *mut c_void,
            &mut sector_list as *mut _ as *mut c_void,
            &mut data as *mut _ as *mut c_void,
            &mut count as *mut _ as *mut c_void,
        ];
        let warps = sector_count.div_ceil(4);
        let function = if decrypt { self.xts_decrypt_function } else { self.xts_encrypt_function };
        self.launch(function, self.grid(function, warps.div_ceil(8)), stream, &mut parameters)
    }

    unsafe fn enqueue_crc(
        &self,
        data: sys::CUdeviceptr,
        checksums: sys::CUdeviceptr,
        blocks: u64,
        block_bytes: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let mut tables = self.tables + (CRC_TABLES_OFFSET_WORDS * 4) as u64;
        let mut data = data;
        let mut checksums = checksums;
        let mut blocks_value = blocks;
        let mut block_bytes = block_bytes;
        let mut parameters: [*mut c_void; 5] = [
            &mut tables as *mut _ as *mut c_void,
            &mut data as *mut _ as *mut c_void,
            &mut checksums as *mut _ as *mut c_void,
            &mut blocks_value as *mut _ as *mut c_void,
            &mut block_bytes as *mut _ as *mut c_void,
        ];
        self.launch(self.crc_function, self.grid(self.crc_function, blocks.div_ceil(8)), stream, &mut parameters)
    }

    /// Launches the matrix kernel for every group of up to four rows. `matrix` lives on the
    /// device (rows × columns bytes).
    #[allow(clippy::too_many_arguments)]
    unsafe fn enqueue_reed_solomon(
        &self,
        matrix: sys::CUdeviceptr,
        rows: usize,
        columns: usize,
        inputs: sys::CUdeviceptr,
        input_stride_bytes: u64,
        outputs: sys::CUdeviceptr,
        output_stride_bytes: u64,
        shard_bytes: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        assert!(
            shard_bytes.is_multiple_of(16)
                && input_stride_bytes.is_multiple_of(16)
                && output_stride_bytes.is_multiple_of(16)
        );
        assert!(columns <= RS_MAXIMUM_COLUMNS);
        let mut row = 0;
        while row < rows {
            let group = (rows - row).min(RS_ROWS_PER_LAUNCH);
            let mut matrix_pointer = matrix + (row * columns) as u64;
            let mut group_rows = group as i32;
            let mut columns_value = columns as i32;
            let mut inputs = inputs;
            let mut input_stride = input_stride_bytes / 16;
            let mut outputs_pointer = outputs + row as u64 * output_stride_bytes;
            let mut output_stride = output_stride_bytes / 16;
            let mut vectors = shard_bytes / 16;
            let mut parameters: [*mut c_void; 8] = [
                &mut matrix_pointer as *mut _ as *mut c_void,
                &mut group_rows as *mut _ as *mut c_void,
                &mut columns_value as *mut _ as *mut c_void,
                &mut inputs as *mut _ as *mut c_void,
                &mut input_stride as *mut _ as *mut c_void,
                &mut outputs_pointer as *mut _ as *mut c_void,
                &mut output_stride as *mut _ as *mut c_void,
                &mut vectors as *mut _ as *mut c_void,
            ];
            self.launch(
                self.reed_solomon_function,
                self.grid(self.reed_solomon_function, (shard_bytes / 16).div_ceil(THREADS_PER_BLOCK as u64)),
                stream,
                &mut parameters,
            )?;
            row += group;
        }
        Ok(())
    }

    /// XTS with host memory in and out, pipelined in chunks over the streams.
    pub fn xts_host(&self, key: &XtsKey, direction: Direction, sectors: Sectors<'_>, data: &mut [u8]) -> Result<()> {
        check_sectors(&sectors, data.len())?;
        self.bind()?;
        let keys = XtsKeyParameters {
            data: key_words(match direction {
                Direction::Encrypt => &key.data_encrypt,
                Direction::Decrypt => &key.data_decrypt,
            }),
            tweak: key_words(&key.tweak_encrypt),
        };
        let mut markers = Vec::new();
        let chunk_bytes = pipeline_chunk_bytes(data.len(), SECTOR_SIZE_BYTES);
        for (index, chunk) in data.chunks_mut(chunk_bytes).enumerate() {
            let first_index = index * (chunk_bytes / SECTOR_SIZE_BYTES);
            let count = chunk.len() / SECTOR_SIZE_BYTES;
            let slot = self.slot();
            unsafe {
                check(
                    sys::cuMemcpyHtoDAsync_v2(slot.buffer, chunk.as_ptr() as *const c_void, chunk.len(), slot.stream),
                    "copy in",
                )?;
                let (first, list) = match sectors {
                    Sectors::Consecutive(first) => (first.wrapping_add(first_index as u64), 0),
                    Sectors::List(list) => {
                        let part = &list[first_index..first_index + count];
                        let list_pointer = slot.buffer + SLOT_BYTES as u64;
                        check(
                            sys::cuMemcpyHtoDAsync_v2(
                                list_pointer,
                                part.as_ptr() as *const c_void,
                                part.len() * 8,
                                slot.stream,
                            ),
                            "copy sectors",
                        )?;
                        (0, list_pointer)
                    }
                };
                self.enqueue_xts(
                    &keys,
                    direction == Direction::Decrypt,
                    first,
                    list,
                    slot.buffer,
                    count as u64,
                    slot.stream,
                )?;
                check(
                    sys::cuMemcpyDtoHAsync_v2(chunk.as_mut_ptr() as *mut c_void, slot.buffer, chunk.len(), slot.stream),
                    "copy out",
                )?;
                markers.push(Marker::record(slot.stream)?);
            }
        }
        markers.iter().try_for_each(Marker::wait)
    }

    pub fn crc32c_blocks_host(&self, data: &[u8], block_bytes: usize, checksums: &mut [u32]) -> Result<()> {
        check_blocks(data.len(), block_bytes, checksums.len())?;
        assert!(block_bytes.is_multiple_of(512) && block_bytes <= SLOT_BYTES);
        self.bind()?;
        let chunk_bytes = pipeline_chunk_bytes(data.len(), block_bytes);
        let mut markers = Vec::new();
        for (chunk, sums) in data.chunks(chunk_bytes).zip(checksums.chunks_mut(chunk_bytes / block_bytes)) {
            let slot = self.slot();
            unsafe {
                check(
                    sys::cuMemcpyHtoDAsync_v2(slot.buffer, chunk.as_ptr() as *const c_void, chunk.len(), slot.stream),
                    "copy in",
                )?;
                let out = slot.buffer + SLOT_BYTES as u64;
                self.enqueue_crc(slot.buffer, out, sums.len() as u64, block_bytes as u64, slot.stream)?;
                check(
                    sys::cuMemcpyDtoHAsync_v2(sums.as_mut_ptr() as *mut c_void, out, sums.len() * 4, slot.stream),
                    "copy out",
                )?;
                markers.push(Marker::record(slot.stream)?);
            }
        }
        markers.iter().try_for_each(Marker::wait)
    }

    /// outputs = matrix × inputs with host shards, pipelined over byte ranges of the shards.
    /// Only the first multiple of 16 bytes runs here; the caller does any tail.
    pub fn apply_matrix_host(
        &self,
        matrix: &[u8],
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
        shard_bytes: usize,
    ) -> Result<()> {
        let rows = outputs.len();
        let columns = inputs.len();
        assert!(columns <= RS_MAXIMUM_COLUMNS && shard_bytes.is_multiple_of(16));
        self.bind()?;
        // Staging layout in a slot: the matrix, then columns input pieces, then rows outputs.
        let largest_piece = ((SLOT_BYTES - 4096) / (rows + columns)) / 4096 * 4096;
        let piece_bytes =
            pipeline_chunk_bytes(shard_bytes * (rows + columns), 4096 * (rows + columns)) / (rows + columns);
        let piece_bytes = piece_bytes.clamp(4096, largest_piece);
        let mut markers = Vec::new();
        let mut start = 0;
        while start < shard_bytes {
            let length = piece_bytes.min(shard_bytes - start);
            let slot = self.slot();
            unsafe {
                let matrix_pointer = slot.buffer;
                let input_base = slot.buffer + 4096;
                let output_base = input_base + (columns * piece_bytes) as u64;
                check(
                    sys::cuMemcpyHtoDAsync_v2(
                        matrix_pointer,
                        matrix.as_ptr() as *const c_void,
                        matrix.len(),
                        slot.stream,
                    ),
                    "copy matrix",
                )?;
                for (column, input) in inputs.iter().enumerate() {
                    check(
                        sys::cuMemcpyHtoDAsync_v2(
                            input_base + (column * piece_bytes) as u64,
                            input[start..].as_ptr() as *const c_void,
                            length,
                            slot.stream,
                        ),
                        "copy in",
                    )?;
                }
                self.enqueue_reed_solomon(
                    matrix_pointer,
                    rows,
                    columns,
                    input_base,
                    piece_bytes as u64,
                    output_base,
                    piece_bytes as u64,
                    length as u64,
                    slot.stream,
                )?;
                for (row, output) in outputs.iter_mut().enumerate() {
                    check(
                        sys::cuMemcpyDtoHAsync_v2(
                            output[start..].as_mut_ptr() as *mut c_void,
                            output_base + (row * piece_bytes) as u64,
                            length,
                            slot.stream,
                        ),
                        "copy out",
                    )?;
                }
                markers.push(Marker::record(slot.stream)?);
            }
            start += length;
        }
        // The matrix sits in host memory that must outlive the asynchronous copies: wait here.
        markers.iter().try_for_each(Marker::wait)
    }

    /// Allocates device memory (for data that stays on the GPU).
    pub fn allocate(self: &Arc<Self>, bytes: usize) -> Result<DeviceMemory> {
        self.bind()?;
        let mut pointer = 0;
        check(unsafe { sys::cuMemAlloc_v2(&mut pointer, bytes.max(1)) }, "cuMemAlloc")?;
        Ok(DeviceMemory { device: Arc::clone(self), pointer, bytes })
    }

    pub fn upload(&self, memory: &DeviceMemory, offset: usize, data: &[u8]) -> Result<()> {
        assert!(offset + data.len() <= memory.bytes);
        self.bind()?;
        check(
            unsafe { sys::cuMemcpyHtoD_v2(memory.pointer + offset as u64, data.as_ptr() as *const c_void, data.len()) },
            "upload",
        )
    }

    pub fn download(&self, memory: &DeviceMemory, offset: usize, data: &mut [u8]) -> Result<()> {
        assert!(offset + data.len() <= memory.bytes);
        self.bind()?;
        check(
            unsafe {
                sys::cuMemcpyDtoH_v2(data.as_mut_ptr() as *mut c_void, memory.pointer + offset as u64, data.len())
            },
            "download",
        )
    }

    /// XTS of sectors already on the device, in place; waits for completion.
    pub fn xts_resident(
        &self,
        key: &XtsKey,
        direction: Direction,
        first_sector: u64,
        memory: &DeviceMemory,
        bytes: usize,
    ) -> Result<()> {
        assert!(bytes <= memory.bytes && bytes.is_multiple_of(SECTOR_SIZE_BYTES));
        self.bind()?;
        let keys = XtsKeyParameters {
            data: key_words(match direction {
                Direction::Encrypt => &key.data_encrypt,
                Direction::Decrypt => &key.data_decrypt,
            }),
            tweak: key_words(&key.tweak_encrypt),
        };
        let slot = self.slot();
        unsafe {
            self.enqueue_xts(
                &keys,
                direction == Direction::Decrypt,
                first_sector,
                0,
                memory.pointer,
                (bytes / SECTOR_SIZE_BYTES) as u64,
                slot.stream,
            )?;
            Marker::record(slot.stream)?.wait()
        }
    }

    /// CRC32C of 4 KiB blocks already on the device into `checksums` (device, 4 bytes each).
    pub fn crc32c_blocks_resident(
        &self,
        data: &DeviceMemory,
        bytes: usize,
        block_bytes: usize,
        checksums: &DeviceMemory,
    ) -> Result<()> {
        assert!(bytes <= data.bytes && bytes.is_multiple_of(block_bytes) && block_bytes.is_multiple_of(512));
        assert!(checksums.bytes >= bytes / block_bytes * 4);
        self.bind()?;
        let slot = self.slot();
        unsafe {
            self.enqueue_crc(
                data.pointer,
                checksums.pointer,
                (bytes / block_bytes) as u64,
                block_bytes as u64,
                slot.stream,
            )?;
            Marker::record(slot.stream)?.wait()
        }
    }

    /// Matrix application on shards already on the device: `columns` input shards and `rows`
    /// output shards, each laid out `shard_bytes` apart from the next.
    pub fn apply_matrix_resident(
        &self,
        matrix: &[u8],
        rows: usize,
        columns: usize,
        inputs: &DeviceMemory,
        outputs: &DeviceMemory,
        shard_bytes: usize,
    ) -> Result<()> {
        assert!(matrix.len() == rows * columns && columns <= RS_MAXIMUM_COLUMNS && shard_bytes.is_multiple_of(16));
        assert!(inputs.bytes >= columns * shard_bytes && outputs.bytes >= rows * shard_bytes);
        self.bind()?;
        let slot = self.slot();
        unsafe {
            check(
                sys::cuMemcpyHtoDAsync_v2(slot.buffer, matrix.as_ptr() as *const c_void, matrix.len(), slot.stream),
                "copy matrix",
            )?;
            self.enqueue_reed_solomon(
                slot.buffer,
                rows,
                columns,
                inputs.pointer,
                shard_bytes as u64,
                outputs.pointer,
                shard_bytes as u64,
                shard_bytes as u64,
                slot.stream,
            )?;
            Marker::record(slot.stream)?.wait()
        }
    }
}

/// Device memory owned by the caller; freed on drop.
pub struct DeviceMemory {
    device: Arc<CudaDevice>,
    pointer: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceMemory {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            unsafe { sys::cuMemFree_v2(self.pointer) };
        }
    }
}

/// Every GPU of the machine.
pub struct CudaSystem {
    pub devices: Vec<Arc<CudaDevice>>,
}

impl CudaSystem {
    /// Opens every GPU, or says why there is none. Never panics for a missing driver.
    /// `Err(AccelError::NoGpu)` when the machine has no GPU to use (no driver, no device, no
    /// NVRTC: [`start_failure`]); `Err(AccelError::Device)` when GPUs are there and opening
    /// them failed (the services' kernels did not compile or load, an allocation failed).
    pub fn open() -> Result<Self> {
        static SYSTEM: OnceLock<Result<Vec<Arc<CudaDevice>>>> = OnceLock::new();
        let devices = SYSTEM.get_or_init(|| {
            probe().map_err(AccelError::NoGpu)?;
            let opened = std::panic::catch_unwind(|| -> Result<Vec<Arc<CudaDevice>>> {
                start_failure(unsafe { sys::cuInit(0) }, "cuInit")?;
                let mut count = 0;
                start_failure(unsafe { sys::cuDeviceGetCount(&mut count) }, "cuDeviceGetCount")?;
                if count == 0 {
                    return Err(AccelError::NoGpu("no CUDA device".into()));
                }
                (0..count as usize).map(|ordinal| CudaDevice::open(ordinal).map(Arc::new)).collect()
            });
            match opened {
                Ok(result) => result,
                // libcuda was found, so a panic here is a driver that is there and unusable.
                Err(_) => Err(AccelError::Device("the CUDA bindings panicked while loading the driver".into())),
            }
        });
        devices.clone().map(|devices| CudaSystem { devices })
    }

    pub fn describe(&self) -> String {
        self.devices
            .iter()
            .map(|device| {
                format!(
                    "GPU {}: {} (sm_{}{}, {} SMs; kernels {} {})",
                    device.ordinal,
                    device.name,
                    device.compute_capability.0,
                    device.compute_capability.1,
                    device.multiprocessors,
                    if device.kernel_from_cache { "loaded from cache" } else { "compiled by NVRTC into" },
                    device.kernel_path.display()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The CUDA engine: every GPU, large requests split evenly across them. Pieces the kernels
/// do not take (shard tails that are not whole 16-byte vectors, blocks not a multiple of
/// 512 bytes) run on the CPU engine, so the results are always complete.
pub struct CudaEngine {
    devices: Vec<Arc<CudaDevice>>,
    cpu: CpuEngine,
}

impl CudaEngine {
    pub fn new(system: &CudaSystem) -> Self {
        Self { devices: system.devices.clone(), cpu: CpuEngine::new(0) }
    }

    pub fn devices(&self) -> &[Arc<CudaDevice>] {
        &self.devices
    }

    /// Splits `units` work units over the devices (contiguous, nearly equal).
    fn shares(&self, units: usize) -> Vec<(usize, usize)> {
        let parts = self.devices.len().min(units.max(1));
        (0..parts).map(|part| (units * part / parts, units * (part + 1) / parts)).collect()
    }
}

impl Engine for CudaEngine {
    fn name(&self) -> String {
        let names: Vec<String> = self.devices.iter().map(|d| format!("{} #{}", d.name, d.ordinal)).collect();
        format!("cuda ({})", names.join(", "))
    }

    fn kind(&self) -> EngineKind {
        EngineKind::Cuda
    }

    fn crc32c_blocks(&self, data: &[u8], block_bytes: usize, checksums: &mut [u32]) -> Result<()> {
        check_blocks(data.len(), block_bytes, checksums.len())?;
        if !block_bytes.is_multiple_of(512) || block_bytes > SLOT_BYTES {
            return self.cpu.crc32c_blocks(data, block_bytes, checksums);
        }
        let shares = self.shares(checksums.len());
        std::thread::scope(|scope| {
            let mut rest = &mut checksums[..];
            let mut handles = Vec::new();
            for (device, &(start, end)) in self.devices.iter().zip(&shares) {
                let (mine, after) = rest.split_at_mut(end - start);
                rest = after;
                let piece = &data[start * block_bytes..end * block_bytes];
                handles.push(scope.spawn(move || device.crc32c_blocks_host(piece, block_bytes, mine)));
            }
            handles.into_iter().try_for_each(|handle| handle.join().expect("GPU worker panicked"))
        })
    }

    fn crc32c(&self, crc_value: u32, data: &[u8]) -> Result<u32> {
        // Per-block CRCs on the GPU, joined on the host: raw(A‖B) = raw(A)·x^(8|B|) ⊕ raw0(B).
        const BLOCK: usize = SECTOR_SIZE_BYTES;
        let whole = data.len() / BLOCK * BLOCK;
        if whole == 0 {
            return self.cpu.crc32c(crc_value, data);
        }
        let mut checksums = vec![0u32; whole / BLOCK];
        self.crc32c_blocks(&data[..whole], BLOCK, &mut checksums)?;
        let ones_shifted = crc::shift_portable(0xFFFF_FFFF, BLOCK as u64);
        let block_shift = crc::x_power_mod(8 * BLOCK as u64);
        let mut register = !crc_value;
        for checksum in checksums {
            // A block's CRC from zero with inversions: checksum = ¬(ones·x^n ⊕ raw0(block)).
            let raw_from_zero = !checksum ^ ones_shifted;
            register = crc::multiply_mod(register, block_shift) ^ raw_from_zero;
        }
        Ok(!crc::raw_update(register, &data[whole..]))
    }

    fn xts(&self, key: &XtsKey, direction: Direction, sectors: Sectors<'_>, data: &mut [u8]) -> Result<()> {
        check_sectors(&sectors, data.len())?;
        let shares = self.shares(data.len() / SECTOR_SIZE_BYTES);
        std::thread::scope(|scope| {
            let mut rest = &mut data[..];
            let mut handles = Vec::new();
            for (device, &(start, end)) in self.devices.iter().zip(&shares) {
                let (mine, after) = rest.split_at_mut((end - start) * SECTOR_SIZE_BYTES);
                rest = after;
                let piece_sectors = match sectors {
                    Sectors::Consecutive(first) => Sectors::Consecutive(first.wrapping_add(start as u64)),
                    Sectors::List(list) => Sectors::List(&list[start..end]),
                };
                handles.push(scope.spawn(move || device.xts_host(key, direction, piece_sectors, mine)));
            }
            handles.into_iter().try_for_each(|handle| handle.join().expect("GPU worker panicked"))
        })
    }

    fn reed_solomon_encode(&self, code: &ReedSolomon, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<()> {
        let shard_bytes = check_shards(
            code,
            data.len(),
            parity.len(),
            data.iter().map(|s| s.len()).chain(parity.iter().map(|s| s.len())),
        )?;
        self.apply_matrix(code.parity_matrix(), data, parity, shard_bytes)
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
        self.apply_matrix(&plan.matrix, &inputs, &mut outputs, shard_bytes)
    }
}

impl CudaEngine {
    fn apply_matrix(
        &self,
        matrix: &[u8],
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
        shard_bytes: usize,
    ) -> Result<()> {
        if inputs.len() > RS_MAXIMUM_COLUMNS {
            self.cpu.apply_matrix(matrix, inputs, outputs, shard_bytes);
            return Ok(());
        }
        let vector_bytes = shard_bytes / 16 * 16;
        if vector_bytes < shard_bytes {
            reed_solomon::apply_matrix(matrix, inputs, outputs, vector_bytes, shard_bytes);
        }
        // Split the shard byte range over the devices (16-byte aligned).
        let shares: Vec<(usize, usize)> =
            self.shares(vector_bytes / 16).into_iter().map(|(start, end)| (start * 16, end * 16)).collect();
        std::thread::scope(|scope| {
            let mut per_device: Vec<Vec<&mut [u8]>> = shares.iter().map(|_| Vec::new()).collect();
            for output in outputs.iter_mut() {
                let mut rest: &mut [u8] = &mut output[..vector_bytes];
                for (part, &(start, end)) in shares.iter().enumerate() {
                    let (mine, after) = rest.split_at_mut(end - start);
                    per_device[part].push(mine);
                    rest = after;
                }
            }
            let mut handles = Vec::new();
            for ((device, &(start, end)), mut mine) in self.devices.iter().zip(&shares).zip(per_device) {
                let piece_inputs: Vec<&[u8]> = inputs.iter().map(|input| &input[start..end]).collect();
                handles
                    .push(scope.spawn(move || device.apply_matrix_host(matrix, &piece_inputs, &mut mine, end - start)));
            }
            handles.into_iter().try_for_each(|handle| handle.join().expect("GPU worker panicked"))
        })
    }
}

// ---------------------------------------------------------------- benchmark rows

fn pinned_or_heap(system: &CudaSystem, bytes: usize, seed: u64) -> crate::pool::HostBuffer {
    let mut buffer = crate::pool::HostBuffer::allocate(Some(system), bytes);
    let random = crate::bench::random_bytes(bytes.min(64 << 20), seed);
    for chunk in buffer.chunks_mut(random.len()) {
        chunk.copy_from_slice(&random[..chunk.len()]);
    }
    buffer
}

fn resident_note(system: &CudaSystem) -> String {
    format!("GPU 0 of {}, kernel only", system.devices.len())
}

pub fn bench_crc32c(system: &CudaSystem, config: &BenchConfig, report: &mut Report) {
    report.note(system.describe());
    let engine = CudaEngine::new(system);
    let bytes = config.gpu_bytes;
    let data = pinned_or_heap(system, bytes, 21);
    let mut checksums = vec![0u32; bytes / SECTOR_SIZE_BYTES];
    let result = (|| -> Result<(Measurement, Measurement)> {
        engine.crc32c_blocks(&data, SECTOR_SIZE_BYTES, &mut checksums)?;
        let end_to_end = measure(bytes, config.minimum_seconds, || {
            engine.crc32c_blocks(&data, SECTOR_SIZE_BYTES, &mut checksums).unwrap()
        });
        let device = &system.devices[0];
        let memory = device.allocate(bytes)?;
        let sums = device.allocate(bytes / SECTOR_SIZE_BYTES * 4)?;
        device.upload(&memory, 0, &data)?;
        let resident = measure(bytes, config.minimum_seconds, || {
            device.crc32c_blocks_resident(&memory, bytes, SECTOR_SIZE_BYTES, &sums).unwrap()
        });
        Ok((end_to_end, resident))
    })();
    match result {
        Ok((end_to_end, resident)) => {
            report.row(
                "crc32c 4K blocks",
                "gpu host in/out (pinned)",
                Some(end_to_end),
                format!("{} GB per call", bytes as f64 / 1e9),
            );
            report.row("crc32c 4K blocks", "gpu resident", Some(resident), resident_note(system));
        }
        Err(error) => report.row("crc32c 4K blocks", "gpu", None, error.to_string()),
    }
}

pub fn bench_xts(system: &CudaSystem, config: &BenchConfig, key: &XtsKey, report: &mut Report) {
    let engine = CudaEngine::new(system);
    let bytes = config.gpu_bytes;
    let mut data = pinned_or_heap(system, bytes, 22);
    for direction in [Direction::Encrypt, Direction::Decrypt] {
        let service = format!("aes-256-xts {direction:?}").to_lowercase();
        let result = (|| -> Result<(Measurement, Measurement)> {
            let end_to_end = measure(bytes, config.minimum_seconds, || {
                engine.xts(key, direction, Sectors::Consecutive(7), &mut data).unwrap()
            });
            let device = &system.devices[0];
            let memory = device.allocate(bytes)?;
            device.upload(&memory, 0, &data)?;
            let resident = measure(bytes, config.minimum_seconds, || {
                device.xts_resident(key, direction, 7, &memory, bytes).unwrap()
            });
            Ok((end_to_end, resident))
        })();
        match result {
            Ok((end_to_end, resident)) => {
                report.row(
                    &service,
                    "gpu host in/out (pinned)",
                    Some(end_to_end),
                    "target ≥ 40 GB/s at ≤ 0.25 core (CPU s/GB ≤ 0.00625)",
                );
                report.row(
                    &service,
                    "gpu resident",
                    Some(resident),
                    format!("{}; target ≥ 300 GB/s", resident_note(system)),
                );
            }
            Err(error) => report.row(&service, "gpu", None, error.to_string()),
        }
    }
}

pub fn bench_reed_solomon(system: &CudaSystem, config: &BenchConfig, code: &ReedSolomon, report: &mut Report) {
    let engine = CudaEngine::new(system);
    let (k, m) = (code.data_shards(), code.parity_shards());
    let shard_bytes = config.gpu_bytes / k / 4096 * 4096;
    let stripe_bytes = shard_bytes * k;
    let data: Vec<crate::pool::HostBuffer> =
        (0..k).map(|i| pinned_or_heap(system, shard_bytes, 30 + i as u64)).collect();
    let mut parity: Vec<crate::pool::HostBuffer> =
        (0..m).map(|i| pinned_or_heap(system, shard_bytes, 60 + i as u64)).collect();
    let result = (|| -> Result<Vec<(String, String, Measurement, String)>> {
        let mut rows = Vec::new();
        let inputs: Vec<&[u8]> = data.iter().map(|s| &s[..]).collect();
        let encode = measure(stripe_bytes, config.minimum_seconds, || {
            let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(|s| &mut s[..]).collect();
            engine.reed_solomon_encode(code, &inputs, &mut outputs).unwrap()
        });
        rows.push((
            format!("rs {k}+{m} encode"),
            "gpu host in/out (pinned)".to_string(),
            encode,
            "target ≥ 40 GB/s at ≤ 0.25 core".to_string(),
        ));
        // Decode: rebuild the first m data shards from the rest.
        let lost = m.min(k);
        let present: Vec<bool> = (0..k + m).map(|index| index >= lost).collect();
        let plan = code.reconstruction_plan(&present)?;
        let mut rebuilt: Vec<crate::pool::HostBuffer> =
            (0..lost).map(|i| pinned_or_heap(system, shard_bytes, 90 + i as u64)).collect();
        let sources: Vec<&[u8]> = plan
            .sources
            .iter()
            .map(|&index| if index < k { &data[index][..] } else { &parity[index - k][..] })
            .collect();
        let decode = measure(stripe_bytes, config.minimum_seconds, || {
            let mut outputs: Vec<&mut [u8]> = rebuilt.iter_mut().map(|s| &mut s[..]).collect();
            engine.apply_matrix(&plan.matrix, &sources, &mut outputs, shard_bytes).unwrap()
        });
        assert!(rebuilt.iter().zip(&data).all(|(a, b)| a[..] == b[..]), "GPU reconstruction differs");
        rows.push((
            format!("rs {k}+{m} decode ({lost} lost)"),
            "gpu host in/out (pinned)".to_string(),
            decode,
            "target ≥ 40 GB/s".to_string(),
        ));
        let device = &system.devices[0];
        let inputs_memory = device.allocate(stripe_bytes)?;
        let outputs_memory = device.allocate(m * shard_bytes)?;
        for (index, shard) in data.iter().enumerate() {
            device.upload(&inputs_memory, index * shard_bytes, shard)?;
        }
        let resident = measure(stripe_bytes, config.minimum_seconds, || {
            device
                .apply_matrix_resident(code.parity_matrix(), m, k, &inputs_memory, &outputs_memory, shard_bytes)
                .unwrap()
        });
        rows.push((
            format!("rs {k}+{m} encode"),
            "gpu resident".to_string(),
            resident,
            format!("{}; target ≥ 500 GB/s", resident_note(system)),
        ));
        let resident_decode = measure(stripe_bytes, config.minimum_seconds, || {
            device.apply_matrix_resident(&plan.matrix, lost, k, &inputs_memory, &outputs_memory, shard_bytes).unwrap()
        });
        rows.push((
            format!("rs {k}+{m} decode ({lost} lost)"),
            "gpu resident".to_string(),
            resident_decode,
            resident_note(system),
        ));
        Ok(rows)
    })();
    match result {
        Ok(rows) => {
            for (service, engine_name, measurement, note) in rows {
                report.row(&service, &engine_name, Some(measurement), note);
            }
        }
        Err(error) => report.row(&format!("rs {k}+{m}"), "gpu", None, error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where NVRTC is installed (no GPU needed), the kernels must compile for Hopper.
    #[test]
    fn kernels_compile_with_nvrtc_when_present() {
        if library_present(&[c"libnvrtc.so", c"libnvrtc.so.13", c"libnvrtc.so.12"]).is_none() {
            eprintln!("skipped: libnvrtc not found");
            return;
        }
        let directory = std::env::temp_dir().join(format!("tandem-kernel-cache-test-{}", std::process::id()));
        let (image, from_cache, path) = compiled_kernels_in(&directory, 9, 0).expect("kernels compile");
        assert!(!image.is_empty() && !from_cache);
        let (again, from_cache, _) = compiled_kernels_in(&directory, 9, 0).unwrap();
        assert!(from_cache && again == image, "second call reads the cache file {}", path.display());
        let _ = std::fs::remove_dir_all(directory);
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        // On machines without libcuda this must say why; with a GPU it must open.
        match CudaSystem::open() {
            Ok(system) => assert!(!system.devices.is_empty()),
            Err(reason) => assert!(!reason.to_string().is_empty()),
        }
    }

    /// Which failures of starting the GPU mean "no GPU here" (a test skips) and which mean a
    /// GPU that is there and failed (a test fails): only no driver, no device and no NVRTC.
    #[test]
    fn only_an_absent_driver_device_or_nvrtc_reads_as_no_gpu() {
        use sys::CUresult::*;
        for absent in [CUDA_ERROR_NO_DEVICE, CUDA_ERROR_STUB_LIBRARY] {
            let error = start_failure(absent, "cuInit").unwrap_err();
            assert!(error.is_no_gpu(), "{absent:?} reads as {error}");
        }
        let present_and_failing = [
            CUDA_ERROR_INVALID_PTX,
            CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
            CUDA_ERROR_INVALID_IMAGE,
            CUDA_ERROR_NO_BINARY_FOR_GPU,
            CUDA_ERROR_OUT_OF_MEMORY,
            CUDA_ERROR_LAUNCH_FAILED,
            CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            CUDA_ERROR_ILLEGAL_ADDRESS,
            CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
            CUDA_ERROR_NOT_INITIALIZED,
            CUDA_ERROR_UNKNOWN,
        ];
        for failing in present_and_failing {
            let error = start_failure(failing, "cuInit").unwrap_err();
            assert!(matches!(error, AccelError::Device(_)), "{failing:?} reads as {error}");
        }
        assert!(start_failure(CUDA_SUCCESS, "cuInit").is_ok());
        // After the driver started, every call goes through `check`, whose errors are Device
        // (it is not called here: its message asks the driver, which this VM lacks); so is a
        // kernel NVRTC refuses, whatever the compiler says.
        assert!(matches!(device_error("cuModuleLoadData", CUDA_ERROR_NO_DEVICE), AccelError::Device(_)));
        if probe_nvrtc().is_ok() {
            let refused = compile_cached_in(&std::env::temp_dir(), "refused", "not C++ at all", &[], 9, 0);
            assert!(matches!(refused, Err(AccelError::Device(_))), "{refused:?}");
        }
        // The probe's reasons (no libcuda, no libnvrtc) are NoGpu through `CudaSystem::open`.
        if let Err(reason) = probe() {
            assert_eq!(CudaSystem::open().err(), Some(AccelError::NoGpu(reason)));
        }
    }
}
