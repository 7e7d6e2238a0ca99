//! The GPU engine of the directory index: hash tables and a name arena in GPU memory, served
//! by one persistent kernel (`dirindex.cu`) that polls a command ring in pinned, mapped host
//! memory. The host writes a command into a ring slot and publishes its sequence number; the
//! kernel copies it, serves it with every block, and writes the completion back into the slot.
//!
//! A batch of at most 32 small queries takes the express path instead: its requests go into
//! the ring slot's own area and the kernel's polling warp answers them there (ring.rs,
//! docs/GPUDIR.md "The express path"). Creates (`create_entries`) run on the whole grid.
//!
//! Requests and answers of a command live in a staging buffer: small commands are read and
//! answered in mapped host memory directly (no copy, no launch), larger ones are copied to
//! device memory and back by DMA on the staging buffer's own stream. The kernel runs on its own
//! non-blocking stream for the life of the index; drop sends the stop command. Every wait on
//! the host is bounded: a command not answered in time latches the index failed, and every
//! later call gets that error. docs/GPUDIR.md describes the protocol.

use super::ring::{self, ExpressStamps, ProbeStamps, Ring, RingCommand, RingCompletion, RING_MEMORY_BYTES, RING_SLOTS};
use super::wire::{self, Layout, Segment};
use super::{
    check_creates, check_inode, check_inodes, check_lookups, check_updates, ApplyReport, CreateEntry, CreateResult,
    Credentials, DirectoryIndex, IndexUpdate, ListResult, LookupResult, ResolveResult, Settle, SettleResult,
    StatResult, ATTRIBUTES_BYTES,
};
use crate::cuda::{check, compile_cached, CudaDevice, CudaSystem};
use crate::error::{AccelError, Result};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The kernel source, compiled at run time by NVRTC and cached like services.cu.
pub const KERNEL_SOURCE: &str = include_str!("dirindex.cu");

/// Bytes of `struct Control` in dirindex.cu, rounded up.
const CONTROL_BYTES: usize = 512;
const THREADS_PER_BLOCK: u32 = 256;
/// Host threads one batch uses at most (each takes a staging buffer per chunk): encoding
/// requests and checking answers is host work that must keep up with the GPU.
const MAXIMUM_BATCH_WORKERS: usize = 16;
/// Staging buffers by default, so batch workers at most: the host's encoding and decoding bound
/// the batch rate, and on the 16-core H100 host (session 18, 25 November 2026, 13:24 UTC)
/// 1M resolves into a reused vector ran at 139.9 M/s with 16 against 117.2 M/s with 8 (lookups
/// 139.6 against 116.3, stats 156.8 against 113.7; 128 MiB of pinned staging instead of 64).
/// The benchmark's `staging_buffers` tries others.
const DEFAULT_STAGING_BUFFERS: usize = 16;
/// A batch is spread over workers only in chunks of at least this many requests (a thread
/// start costs tens of microseconds, a command a few).
const MINIMUM_REQUESTS_PER_WORKER: usize = 4096;
/// Commands one `list` may take (ranges split when a page overflows).
const MAXIMUM_LIST_COMMANDS: usize = 4096;
const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x01;
const CU_MEMHOSTALLOC_DEVICEMAP: u32 = 0x02;

/// Sizes of a GPU index.
#[derive(Clone, Debug)]
pub struct GpuIndexConfig {
    /// Directory entries the tables hold (slots: the next power of two ≥ 1.5 × this).
    pub entry_capacity: usize,
    /// Inodes (attribute records and completeness flags) the tables hold.
    pub inode_capacity: usize,
    /// Bytes of names (each padded to 8 bytes; removed names are not reclaimed).
    pub arena_bytes: usize,
    /// Blocks of the persistent kernel, 256 threads each (0 = one per multiprocessor).
    pub blocks: u32,
    /// Staging buffers (mapped host memory) and their size: commands in flight at once.
    pub staging_buffers: usize,
    pub staging_bytes: usize,
    /// Commands whose requests and answers exceed this many bytes are copied to device memory
    /// and back by DMA on a stream of their own; None (the default): every command is served
    /// in mapped host memory. Off by default because each copy stream is one more stream
    /// beside a kernel that never finishes, and the driver spreads streams over a few hardware
    /// queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default): a copy's completion queued behind
    /// the persistent kernel would never come (bounded here: the index fails, nothing hangs).
    pub copy_above_bytes: Option<usize>,
    /// How long one command may take before the index is declared failed.
    pub command_timeout: Duration,
    /// Which GPU.
    pub device: usize,
}

impl GpuIndexConfig {
    /// Room for `entries` entries and as many inodes, names of 32 bytes on average.
    pub fn for_entries(entries: usize) -> Self {
        let entries = entries.max(1024);
        GpuIndexConfig {
            entry_capacity: entries,
            inode_capacity: entries,
            arena_bytes: entries * 32,
            blocks: 0,
            staging_buffers: DEFAULT_STAGING_BUFFERS,
            staging_bytes: 8 << 20,
            copy_above_bytes: None,
            command_timeout: Duration::from_secs(10),
            device: 0,
        }
    }
}

/// `struct Tables` in dirindex.cu, passed by value as the kernel's one parameter.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct TablePointers {
    entry_state: u64,
    entry_hash: u64,
    entry_parent: u64,
    entry_child: u64,
    entry_name: u64,
    entry_mask: u64,
    inode_state: u64,
    inode_flags: u64,
    inode_key: u64,
    inode_attributes: u64,
    inode_mask: u64,
    arena: u64,
    arena_words: u64,
    ring: u64,
    ring_slots: u64,
    control: u64,
    root: u64,
}
const _: () = assert!(std::mem::size_of::<TablePointers>() == 17 * 8);

/// Pinned host memory mapped into the GPU's address space.
struct MappedBuffer {
    host: *mut u8,
    device: u64,
    bytes: usize,
}

impl MappedBuffer {
    fn allocate(bytes: usize) -> Result<Self> {
        let mut host = std::ptr::null_mut();
        let flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: out-parameter; the context is current (the caller bound it).
        check(unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) }, "cuMemHostAlloc mapped")?;
        if host.is_null() {
            return Err(AccelError::Device("cuMemHostAlloc returned null".into()));
        }
        let buffer = MappedBuffer { host: host as *mut u8, device: 0, bytes };
        // SAFETY: fresh allocation of `bytes` bytes.
        unsafe { std::ptr::write_bytes(buffer.host, 0, bytes) };
        let mut device = 0;
        check(
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) },
            "cuMemHostGetDevicePointer (mapped pinned memory)",
        )?;
        Ok(MappedBuffer { device, ..buffer })
    }

    fn release(self) {
        // SAFETY: allocated by cuMemHostAlloc; nothing on the GPU uses it any more.
        unsafe { sys::cuMemFreeHost(self.host as *mut c_void) };
    }
}

struct DeviceBuffer {
    pointer: u64,
}

impl DeviceBuffer {
    fn allocate(bytes: usize) -> Result<Self> {
        let mut pointer = 0;
        check(unsafe { sys::cuMemAlloc_v2(&mut pointer, bytes.max(8)) }, "cuMemAlloc (directory index)")?;
        Ok(DeviceBuffer { pointer })
    }

    fn release(self) {
        // cuMemFree waits for the device: only called once the kernel has stopped.
        unsafe { sys::cuMemFree_v2(self.pointer) };
    }
}

/// A staging buffer: requests and answers of one command in mapped host memory and, when
/// copies are configured, a device buffer and the stream its copies run on.
struct Staging {
    host: MappedBuffer,
    copies: Option<(DeviceBuffer, sys::CUstream)>,
}

impl Staging {
    /// The host side as bytes. The caller holds the staging buffer exclusively.
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `bytes` valid bytes; exclusive through &mut self; the GPU touches them only
        // while a command of this staging buffer runs, and the caller waits for it.
        unsafe { std::slice::from_raw_parts_mut(self.host.host, self.host.bytes) }
    }
}

/// Everything the index owns on the device and in pinned memory.
struct Resources {
    kernel_stream: sys::CUstream,
    ring: MappedBuffer,
    device_buffers: Vec<DeviceBuffer>,
    staging: Vec<Staging>,
}

impl Resources {
    fn release(self) {
        for staging in self.staging {
            if let Some((device, stream)) = staging.copies {
                unsafe { sys::cuStreamDestroy_v2(stream) };
                device.release();
            }
            staging.host.release();
        }
        for buffer in self.device_buffers {
            buffer.release();
        }
        self.ring.release();
        unsafe { sys::cuStreamDestroy_v2(self.kernel_stream) };
    }
}

/// The GPU directory index. See the module documentation.
pub struct GpuDirectoryIndex {
    device: Arc<CudaDevice>,
    config: GpuIndexConfig,
    root: u64,
    blocks: u32,
    entry_slots: u64,
    /// The command ring, over the mapped ring memory in `resources`.
    ring: Ring,
    kernel_stream: sys::CUstream,
    staging_free: Mutex<Vec<Staging>>,
    staging_returned: Condvar,
    failed: AtomicBool,
    failure: Mutex<String>,
    commands: AtomicU64,
    /// Whether small batches take the express path (on; the benchmark turns it off to time
    /// the batch path's round trip beside it).
    express_enabled: AtomicBool,
    resources: Option<Resources>,
}

// SAFETY: the raw pointers are to pinned memory and driver handles owned by the index; the
// ring guards its own memory.
unsafe impl Send for GpuDirectoryIndex {}
unsafe impl Sync for GpuDirectoryIndex {}
unsafe impl Send for Staging {}

fn slots_for(capacity: usize) -> u64 {
    (capacity + capacity / 2).max(1024).next_power_of_two() as u64
}

impl GpuDirectoryIndex {
    /// Opens an empty index rooted at `root` on GPU `config.device` and starts its kernel.
    /// Err says why when there is no GPU (or no driver, or NVRTC fails).
    pub fn open(root: u64, config: GpuIndexConfig) -> Result<Self> {
        check_inode(root)?;
        if config.staging_buffers == 0 || config.staging_bytes < (64 << 10) || config.arena_bytes < 8 {
            return Err(AccelError::InvalidArgument(format!("unusable GPU index configuration {config:?}")));
        }
        // No driver, no device or no NVRTC: NoGpu. Everything after this point failing on a
        // GPU that is there is Device (tests fail on it rather than skip).
        let system = CudaSystem::open()?;
        let device = system.devices.get(config.device).cloned().ok_or_else(|| {
            AccelError::InvalidArgument(format!("no GPU {} ({} found)", config.device, system.devices.len()))
        })?;
        device.bind_context()?;
        let (major, minor) = device.compute_capability;
        if major < 7 {
            // The hardware's, not the code's: no device this kernel can run on.
            return Err(AccelError::NoGpu(format!("sm_{major}{minor}: the directory kernel needs sm_70 or later")));
        }
        let (function, blocks) = Self::kernel_function(&device, config.blocks)?;
        let mut kernel_stream = std::ptr::null_mut();
        let created =
            unsafe { sys::cuStreamCreate(&mut kernel_stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
        check(created, "cuStreamCreate")?;
        let ring = match MappedBuffer::allocate(RING_MEMORY_BYTES) {
            Ok(ring) => ring,
            Err(error) => {
                unsafe { sys::cuStreamDestroy_v2(kernel_stream) };
                return Err(error);
            }
        };
        let mut resources = Resources { kernel_stream, ring, device_buffers: Vec::new(), staging: Vec::new() };
        debug_assert!(resources.ring.bytes >= RING_MEMORY_BYTES);
        let prepared = Self::populate(&mut resources, &config, root).map(|tables| (function, blocks, tables));
        match prepared {
            Ok((function, blocks, tables)) => Self::launch(device, config, root, function, blocks, resources, tables),
            Err(error) => {
                // Nothing runs yet, so freeing cannot wait on the kernel.
                resources.release();
                Err(error)
            }
        }
    }

    /// The serving kernel, compiled (or read from the cache), loaded once per device and
    /// process and never unloaded: with lazy loading (the default since CUDA 12.2) a kernel is
    /// loaded by cuModuleGetFunction, and a load may wait for the device, which never comes to
    /// rest while an index's kernel runs; so nothing is loaded after the first index starts.
    fn serving_function(device: &CudaDevice) -> Result<sys::CUfunction> {
        static LOADED: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
        let mut loaded = LOADED.get_or_init(|| Mutex::new(HashMap::new())).lock().expect("module lock poisoned");
        if let Some(&function) = loaded.get(&device.ordinal) {
            return Ok(function as sys::CUfunction);
        }
        let (major, minor) = device.compute_capability;
        let (image, _, _) = compile_cached("dirindex", KERNEL_SOURCE, &[], major, minor)?;
        let mut module = std::ptr::null_mut();
        check(unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) }, "cuModuleLoadData")?;
        let mut function = std::ptr::null_mut();
        let found = unsafe { sys::cuModuleGetFunction(&mut function, module, c"dirindex_serve_kernel".as_ptr()) };
        if let Err(error) = check(found, "cuModuleGetFunction dirindex_serve_kernel") {
            unsafe { sys::cuModuleUnload(module) };
            return Err(error);
        }
        loaded.insert(device.ordinal, function as usize);
        Ok(function)
    }

    /// The serving kernel and its grid: one block per multiprocessor by default, so every SM
    /// serves and the rest of each SM stays free for the other services' kernels (the
    /// persistent grid never leaves).
    fn kernel_function(device: &CudaDevice, wanted_blocks: u32) -> Result<(sys::CUfunction, u32)> {
        let function = Self::serving_function(device)?;
        let mut per_multiprocessor = 0;
        check(
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut per_multiprocessor,
                    function,
                    THREADS_PER_BLOCK as i32,
                    0,
                )
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        if per_multiprocessor < 1 {
            return Err(AccelError::Device("the directory kernel does not fit a multiprocessor".into()));
        }
        let blocks = if wanted_blocks == 0 { device.multiprocessors } else { wanted_blocks };
        Ok((function, blocks.clamp(1, device.multiprocessors * per_multiprocessor as u32)))
    }

    /// Allocates and zeroes the tables (on the kernel's stream, so before the launch) and the
    /// staging buffers. Everything allocated is recorded in `resources`, also on failure.
    fn populate(resources: &mut Resources, config: &GpuIndexConfig, root: u64) -> Result<TablePointers> {
        let kernel_stream = resources.kernel_stream;
        let ring_device = resources.ring.device;
        let entry_slots = slots_for(config.entry_capacity);
        let inode_slots = slots_for(config.inode_capacity);
        let arena_words = config.arena_bytes.div_ceil(8) as u64;
        let mut allocate = |bytes: u64| -> Result<u64> {
            let buffer = DeviceBuffer::allocate(bytes as usize)?;
            let pointer = buffer.pointer;
            resources.device_buffers.push(buffer);
            check(
                unsafe { sys::cuMemsetD8Async(pointer, 0, bytes.max(8) as usize, kernel_stream) },
                "cuMemsetD8Async",
            )?;
            Ok(pointer)
        };
        let tables = TablePointers {
            entry_state: allocate(entry_slots * 4)?,
            entry_hash: allocate(entry_slots * 4)?,
            entry_parent: allocate(entry_slots * 8)?,
            entry_child: allocate(entry_slots * 8)?,
            entry_name: allocate(entry_slots * 8)?,
            entry_mask: entry_slots - 1,
            inode_state: allocate(inode_slots * 4)?,
            inode_flags: allocate(inode_slots * 4)?,
            inode_key: allocate(inode_slots * 8)?,
            inode_attributes: allocate(inode_slots * ATTRIBUTES_BYTES as u64)?,
            inode_mask: inode_slots - 1,
            arena: allocate(arena_words * 8)?,
            arena_words,
            ring: ring_device,
            ring_slots: RING_SLOTS as u64,
            control: allocate(CONTROL_BYTES as u64)?,
            root,
        };
        for _ in 0..config.staging_buffers {
            resources.staging.push(Staging { host: MappedBuffer::allocate(config.staging_bytes)?, copies: None });
            if config.copy_above_bytes.is_some() {
                let staging = resources.staging.last_mut().expect("just pushed");
                let device = DeviceBuffer::allocate(config.staging_bytes)?;
                let mut stream = std::ptr::null_mut();
                let created =
                    unsafe { sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
                if let Err(error) = check(created, "cuStreamCreate") {
                    device.release();
                    return Err(error);
                }
                staging.copies = Some((device, stream));
            }
        }
        Ok(tables)
    }

    /// Launches the persistent kernel and checks that it serves.
    fn launch(
        device: Arc<CudaDevice>,
        config: GpuIndexConfig,
        root: u64,
        function: sys::CUfunction,
        blocks: u32,
        mut resources: Resources,
        tables: TablePointers,
    ) -> Result<Self> {
        let kernel_stream = resources.kernel_stream;
        let mut parameter = tables;
        let mut parameters: [*mut c_void; 1] = [&mut parameter as *mut TablePointers as *mut c_void];
        // The memsets run first on the same stream; the launch returns at once and the kernel
        // serves until the stop command.
        let launched = unsafe {
            sys::cuLaunchKernel(
                function,
                blocks,
                1,
                1,
                THREADS_PER_BLOCK,
                1,
                1,
                0,
                kernel_stream,
                parameters.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if let Err(error) = check(launched, "cuLaunchKernel dirindex_serve_kernel") {
            resources.release();
            return Err(error);
        }
        let staging = std::mem::take(&mut resources.staging);
        let index = GpuDirectoryIndex {
            device,
            root,
            blocks,
            entry_slots: tables.entry_mask + 1,
            // SAFETY: RING_MEMORY_BYTES of zeroed pinned memory, page aligned, freed only after the
            // kernel has stopped (or never), shared only with that kernel.
            ring: unsafe { Ring::new(resources.ring.host, config.command_timeout) },
            kernel_stream,
            staging_free: Mutex::new(staging),
            staging_returned: Condvar::new(),
            failed: AtomicBool::new(false),
            failure: Mutex::new(String::new()),
            commands: AtomicU64::new(0),
            express_enabled: AtomicBool::new(true),
            resources: Some(resources),
            config,
        };
        // A command of nothing proves the kernel is serving before anyone relies on it (on
        // failure, drop stops it or leaks what it holds).
        index.ping()?;
        Ok(index)
    }

    /// Blocks and threads of the persistent kernel, and commands served so far.
    pub fn describe(&self) -> String {
        format!(
            "GPU {} ({}): persistent kernel of {} blocks × {} threads; {} entry slots; {} staging buffers of {} KiB; {} commands",
            self.device.ordinal,
            self.device.name,
            self.blocks,
            THREADS_PER_BLOCK,
            self.entry_slots,
            self.config.staging_buffers,
            self.config.staging_bytes >> 10,
            self.commands.load(Ordering::Relaxed)
        )
    }

    /// One empty command served by block 0 (the way of a small batch, not the express path):
    /// the round trip of the batch protocol.
    pub fn ping(&self) -> Result<()> {
        self.check_failed()?;
        let fields = RingCommand { opcode: wire::COMMAND_STAT, ..RingCommand::default() };
        let (slot, sequence) = self.submit(&mut self.ring.lock(), &fields)?;
        self.wait(slot, sequence).map(|_| ())
    }

    /// One empty express command (no request): doorbell, the command and its area loaded,
    /// the warp's fence and the completion. The floor of a single request's round trip.
    pub fn ping_express(&self) -> Result<ExpressStamps> {
        let mut answers: Vec<StatResult> = Vec::new();
        self.express(&[], (wire::COMMAND_STAT, [0; 3]), wire::encode_stats, wire::decode_stats_into, &mut answers)
    }

    /// One NOP: the polling warp writes the completion as soon as it has read the command, with
    /// no fence and no table access. The bare doorbell round trip of this ring (issue 9 measured
    /// 2.3 µs for a doorbell on the H100 host).
    pub fn ping_doorbell(&self) -> Result<()> {
        self.check_failed()?;
        let fields = RingCommand { opcode: wire::COMMAND_NOP, ..RingCommand::default() };
        let (slot, sequence) = self.submit(&mut self.ring.lock(), &fields)?;
        self.wait(slot, sequence).map(|_| ())
    }

    /// One latency probe (benchmark): `loads` dependent table loads from the polling warp,
    /// twice, and dependent multiplies, on both of the GPU's clocks (`ring::latency_probe`).
    pub fn probe_latency(&self, loads: u32, seed: u64) -> Result<ProbeStamps> {
        self.check_failed()?;
        self.commands.fetch_add(1, Ordering::Relaxed);
        ring::latency_probe(&self.ring, loads, seed, &mut || self.check_kernel_alive(), &|reason| self.fail(reason))
    }

    /// Whether batches of up to 32 small requests take the express path (the default) or the
    /// batch path (a staging buffer, block 0 or the grid): the benchmark times both.
    pub fn set_express(&self, enabled: bool) {
        self.express_enabled.store(enabled, Ordering::Relaxed);
    }

    /// One path resolved by the express path, with both sides' time stamps (benchmark).
    pub fn resolve_express_timed(
        &self,
        path: &[u8],
        credentials: Credentials,
    ) -> Result<(ResolveResult, ExpressStamps)> {
        let paths = [path];
        if !ring::fits_express(&paths, |path| wire::RESOLVE_RECORD_BYTES + wire::padded(path.len())) {
            return Err(AccelError::InvalidArgument(format!(
                "a path of {} bytes does not fit an express command",
                path.len()
            )));
        }
        let mut answers = Vec::new();
        let stamps = self.express(
            &paths,
            (wire::COMMAND_RESOLVE, [credentials.uid as u64, credentials.gid as u64, 0]),
            wire::encode_resolves,
            |bytes, _, out| wire::decode_resolves_into(bytes, out),
            &mut answers,
        )?;
        Ok((answers[0], stamps))
    }

    /// A batch that fits one express command, answered by the kernel's polling warp in the
    /// ring slot's own area: no staging buffer, no chunks, no worker, one system fence.
    fn express<R, T: Copy>(
        &self,
        requests: &[R],
        (opcode, arguments): (u32, [u64; 3]),
        encode: impl FnOnce(&[R], &mut [u8]) -> Layout,
        decode: impl FnOnce(&[u8], &[R], &mut [MaybeUninit<T>]) -> Result<()>,
        out: &mut Vec<T>,
    ) -> Result<ExpressStamps> {
        self.check_failed()?;
        self.commands.fetch_add(1, Ordering::Relaxed);
        ring::express_query(
            &self.ring,
            requests,
            (opcode, arguments),
            encode,
            decode,
            &mut || self.check_kernel_alive(),
            &|reason| self.fail(reason),
            out,
        )
    }

    fn check_failed(&self) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(AccelError::Device(format!(
                "GPU directory index failed earlier: {}",
                self.failure.lock().expect("failure lock poisoned")
            )));
        }
        Ok(())
    }

    /// Creates, claims or settles: `requests` cut by `wire::create_segments`, each command's
    /// create records served by the grid (or block 0 for a small one), holding the ring for all
    /// of them so that no query runs between them, as `apply` does.
    fn create_commands<T>(
        &self,
        requests: &[CreateEntry<'_>],
        (opcode, argument0): (u32, u64),
        decode: fn(&[u8], &mut [MaybeUninit<T>]) -> Result<()>,
    ) -> Result<Vec<T>> {
        check_creates(requests)?;
        self.check_failed()?;
        self.device.bind_context()?;
        let mut answers: Vec<T> = Vec::with_capacity(requests.len());
        let mut staging = self.take_staging()?;
        let result = (|| -> Result<()> {
            let mut next = self.ring.lock();
            for (start, end) in wire::create_segments(requests, self.config.staging_bytes) {
                let part = &requests[start..end];
                let layout = wire::encode_creates(part, staging.bytes());
                let base = self.stage_in(&mut staging, &layout)?;
                let fields = Self::fields(opcode, part.len(), base, &layout, [argument0, 0, 0]);
                let (slot, sequence) = self.submit(&mut next, &fields)?;
                self.wait(slot, sequence)?;
                self.stage_out(&mut staging, base, layout.answers_offset, layout.answers_bytes)?;
                let bytes = &staging.bytes()[layout.answers_offset..layout.answers_offset + layout.answers_bytes];
                let spare = &mut answers.spare_capacity_mut()[..part.len()];
                decode(bytes, spare)?;
                // SAFETY: the decoder returned Ok, so it wrote each of these part.len() elements.
                unsafe { answers.set_len(answers.len() + part.len()) };
            }
            Ok(())
        })();
        self.return_staging(staging);
        result.map(|()| answers)
    }

    /// Latches the index failed; every later call returns this reason.
    fn fail(&self, reason: String) -> AccelError {
        let mut failure = self.failure.lock().expect("failure lock poisoned");
        if !self.failed.swap(true, Ordering::AcqRel) {
            *failure = reason.clone();
        }
        AccelError::Device(format!("GPU directory index failed: {reason}"))
    }

    /// Publishes one command; the caller holds the ring lock. A failed index publishes nothing.
    fn submit(&self, next: &mut std::sync::MutexGuard<'_, u64>, fields: &RingCommand) -> Result<(usize, u64)> {
        self.check_failed()?;
        let published = self.ring.submit(next, fields).map_err(|error| self.fail(error.to_string()))?;
        self.commands.fetch_add(1, Ordering::Relaxed);
        Ok(published)
    }

    /// Waits (bounded) for a command; a timeout, a dead kernel or a kernel error fails the index.
    fn wait(&self, slot: usize, sequence: u64) -> Result<RingCompletion> {
        let completion = self
            .ring
            .wait(slot, sequence, &mut || self.check_kernel_alive())
            .map_err(|error| self.fail(error.to_string()))?;
        if completion.status != 0 {
            return Err(self.fail(format!("command {sequence} refused by the kernel (error {})", completion.status)));
        }
        Ok(completion)
    }

    /// The kernel must still be running: a finished or failed stream means it died.
    fn check_kernel_alive(&self) -> Result<()> {
        self.device.bind_context()?;
        match unsafe { sys::cuStreamQuery(self.kernel_stream) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(()),
            sys::CUresult::CUDA_SUCCESS => Err(self.fail("the persistent kernel exited unexpectedly".into())),
            error => Err(self.fail(format!("the persistent kernel failed: {error:?}"))),
        }
    }

    /// Waits (bounded) for the copies on a staging stream.
    fn wait_stream(&self, stream: sys::CUstream) -> Result<()> {
        let start = Instant::now();
        loop {
            match unsafe { sys::cuStreamQuery(stream) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                error => return Err(self.fail(format!("staging copy failed: {error:?}"))),
            }
            if start.elapsed() > self.config.command_timeout {
                return Err(self.fail("staging copy not finished within the timeout".into()));
            }
            std::thread::sleep(Duration::from_micros(5));
        }
    }

    fn take_staging(&self) -> Result<Staging> {
        let deadline = Instant::now() + self.config.command_timeout;
        let mut free = self.staging_free.lock().expect("staging lock poisoned");
        loop {
            if let Some(staging) = free.pop() {
                return Ok(staging);
            }
            let now = Instant::now();
            if now >= deadline {
                // Busy, not broken: other batches hold every buffer. The index stays usable.
                return Err(AccelError::Device("every staging buffer stayed busy for the command timeout".into()));
            }
            free = self.staging_returned.wait_timeout(free, deadline - now).expect("staging lock poisoned").0;
        }
    }

    fn return_staging(&self, staging: Staging) {
        self.staging_free.lock().expect("staging lock poisoned").push(staging);
        self.staging_returned.notify_one();
    }

    /// Where the kernel reads and writes a command of `total_bytes`: mapped host memory, or
    /// device memory when copies are configured and the command is larger than their bound.
    fn command_base(&self, staging: &Staging, total_bytes: usize) -> u64 {
        match (&staging.copies, self.config.copy_above_bytes) {
            (Some((device, _)), Some(bound)) if total_bytes > bound => device.pointer,
            _ => staging.host.device,
        }
    }

    /// Places a command laid out as `layout` and returns its base address for the kernel,
    /// copying the requests to device memory when that is where it runs.
    fn stage_in(&self, staging: &mut Staging, layout: &Layout) -> Result<u64> {
        assert!(layout.total_bytes() <= staging.host.bytes);
        let base = self.command_base(staging, layout.total_bytes());
        if let Some((device, stream)) = &staging.copies {
            if base == device.pointer && layout.request_bytes > 0 {
                check(
                    unsafe {
                        sys::cuMemcpyHtoDAsync_v2(
                            device.pointer,
                            staging.host.host as *const c_void,
                            layout.request_bytes,
                            *stream,
                        )
                    },
                    "copy requests in",
                )?;
                self.wait_stream(*stream)?;
            }
        }
        Ok(base)
    }

    /// Brings `bytes` of answers at `offset` back into the host staging when they were
    /// written to device memory.
    fn stage_out(&self, staging: &mut Staging, base: u64, offset: usize, bytes: usize) -> Result<()> {
        let Some((device, stream)) = &staging.copies else {
            return Ok(());
        };
        if base != device.pointer || bytes == 0 {
            return Ok(());
        }
        assert!(offset + bytes <= staging.host.bytes);
        check(
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    staging.host.host.add(offset) as *mut c_void,
                    device.pointer + offset as u64,
                    bytes,
                    *stream,
                )
            },
            "copy answers out",
        )?;
        self.wait_stream(*stream)
    }

    fn fields(opcode: u32, count: usize, base: u64, layout: &Layout, arguments: [u64; 3]) -> RingCommand {
        RingCommand {
            opcode,
            count: u32::try_from(count).expect("a staging buffer holds fewer than 2^32 requests"),
            requests: base,
            request_bytes: layout.request_bytes as u64,
            answers: base + layout.answers_offset as u64,
            answer_bytes: layout.answers_bytes as u64,
            arguments,
        }
    }

    /// Runs a query batch into `out` (cleared, then one answer per request in request order).
    /// The batch is cut into chunks (`wire::chunk_bounds`) spread over up to
    /// MAXIMUM_BATCH_WORKERS host threads; each decodes its chunk's answers straight into its
    /// own part of `out`: no vector per chunk, no gathering copy, and the first touch of a
    /// fresh `out` is spread over the workers too.
    fn batched_into<R: Sync, T: Copy + Send>(
        &self,
        requests: &[R],
        request_bytes: impl Fn(&R) -> usize + Sync,
        encode: impl Fn(&[R], &mut [u8]) -> Layout + Sync,
        (opcode, arguments): (u32, [u64; 3]),
        decode: impl Fn(&[u8], &[R], &mut [MaybeUninit<T>]) -> Result<()> + Sync,
        out: &mut Vec<T>,
    ) -> Result<()> {
        out.clear();
        self.check_failed()?;
        if requests.is_empty() {
            return Ok(());
        }
        if self.express_enabled.load(Ordering::Relaxed) && ring::fits_express(requests, &request_bytes) {
            return self.express(requests, (opcode, arguments), &encode, decode, out).map(|_| ());
        }
        let workers = self.config.staging_buffers.clamp(1, MAXIMUM_BATCH_WORKERS);
        let cutter = wire::ChunkCutter::new(
            requests.len(),
            |index| (request_bytes(&requests[index]), wire::ANSWER_BYTES),
            self.config.staging_bytes,
            workers,
            MINIMUM_REQUESTS_PER_WORKER,
        );
        let run_chunk = |start: usize, end: usize, piece: &mut [MaybeUninit<T>]| -> Result<()> {
            let mut staging = self.take_staging()?;
            let answered =
                self.run_chunk_into(&mut staging, &requests[start..end], &encode, (opcode, arguments), &decode, piece);
            self.return_staging(staging);
            answered
        };
        // Every worker thread binds the context; a staging buffer is held per chunk only, so
        // concurrent batches share them fairly.
        wire::fill_in_chunks(cutter, workers, out, || self.device.bind_context(), run_chunk)
    }

    /// One command of a query batch in one staging buffer; its answers decoded into `out`.
    fn run_chunk_into<R, T>(
        &self,
        staging: &mut Staging,
        part: &[R],
        encode: &impl Fn(&[R], &mut [u8]) -> Layout,
        (opcode, arguments): (u32, [u64; 3]),
        decode: &impl Fn(&[u8], &[R], &mut [MaybeUninit<T>]) -> Result<()>,
        out: &mut [MaybeUninit<T>],
    ) -> Result<()> {
        assert_eq!(part.len(), out.len());
        let layout = encode(part, staging.bytes());
        let base = self.stage_in(staging, &layout)?;
        let fields = Self::fields(opcode, part.len(), base, &layout, arguments);
        let (slot, sequence) = self.submit(&mut self.ring.lock(), &fields)?;
        self.wait(slot, sequence)?;
        self.stage_out(staging, base, layout.answers_offset, layout.answers_bytes)?;
        decode(&staging.bytes()[layout.answers_offset..layout.answers_offset + layout.answers_bytes], part, out)
    }

    /// Stops the kernel (bounded) and frees everything; leaks instead when it will not stop,
    /// because freeing memory a running kernel holds would wait for it forever.
    fn shut_down(&mut self) {
        let Some(resources) = self.resources.take() else {
            return;
        };
        if self.device.bind_context().is_err() {
            std::mem::forget(resources);
            return;
        }
        let stopped = (|| -> Result<()> {
            let fields = RingCommand { opcode: wire::COMMAND_STOP, ..RingCommand::default() };
            // A failed index may still serve; try the stop command regardless of the latch.
            let mut next = self.ring.lock();
            self.failed.store(false, Ordering::Release);
            let (slot, sequence) = self.submit(&mut next, &fields)?;
            self.wait(slot, sequence)?;
            let start = Instant::now();
            loop {
                match unsafe { sys::cuStreamQuery(self.kernel_stream) } {
                    sys::CUresult::CUDA_SUCCESS => return Ok(()),
                    sys::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < self.config.command_timeout => {
                        std::thread::sleep(Duration::from_micros(20))
                    }
                    error => return Err(AccelError::Device(format!("kernel did not stop: {error:?}"))),
                }
            }
        })();
        match stopped {
            Ok(()) => {
                let mut resources = resources;
                resources.staging = std::mem::take(&mut *self.staging_free.lock().expect("staging lock poisoned"));
                resources.release();
            }
            Err(error) => {
                eprintln!("tandem-accel: GPU directory index: {error}; its GPU memory is leaked, not freed");
                std::mem::forget(resources);
            }
        }
    }
}

impl Drop for GpuDirectoryIndex {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl DirectoryIndex for GpuDirectoryIndex {
    fn name(&self) -> String {
        format!("gpu: {}", self.describe())
    }

    fn root(&self) -> u64 {
        self.root
    }

    /// Applies the batch in order as a series of commands, holding the ring so no other
    /// command runs between them.
    fn apply(&self, updates: &[IndexUpdate]) -> Result<ApplyReport> {
        check_updates(updates)?;
        self.check_failed()?;
        self.device.bind_context()?;
        let mut report = ApplyReport::default();
        let mut staging = self.take_staging()?;
        let result = (|| -> Result<()> {
            let mut next = self.ring.lock();
            for segment in wire::segments(updates, self.config.staging_bytes) {
                let (fields, applied) = match segment {
                    Segment::Updates { start, end } => {
                        let layout = wire::encode_updates(&updates[start..end], staging.bytes());
                        let base = self.stage_in(&mut staging, &layout)?;
                        (Self::fields(wire::COMMAND_APPLY, end - start, base, &layout, [0; 3]), end - start)
                    }
                    Segment::Drop(directory) => {
                        let layout = Layout { request_bytes: 0, answers_offset: 0, answers_bytes: 0 };
                        (Self::fields(wire::COMMAND_DROP, 0, 0, &layout, [directory, 0, 0]), 1)
                    }
                };
                let (slot, sequence) = self.submit(&mut next, &fields)?;
                let completion = self.wait(slot, sequence)?;
                wire::add_reports(&mut report, applied, completion.result0);
            }
            Ok(())
        })();
        self.return_staging(staging);
        result.map(|()| report)
    }

    /// Cut into commands by `wire::create_segments` (no request of a command depends on
    /// another, so each command's creates run on every thread of the grid at once), holding the
    /// ring so that no query runs between them, as `apply` does.
    fn create_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
        self.create_commands(requests, (wire::COMMAND_CREATE, 0), wire::decode_creates_into)
    }

    /// `create_entries` with argument0 `CREATE_PENDING`: the kernel claims free names pending.
    fn claim_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
        self.create_commands(requests, (wire::COMMAND_CREATE, wire::CREATE_PENDING), wire::decode_creates_into)
    }

    /// Settle commands, cut as creates are (no two requests of one command share a key or an
    /// inode, so the grid settles a command's claims at once in the twin's request order).
    fn settle_claims(&self, requests: &[CreateEntry<'_>], settle: Settle) -> Result<Vec<SettleResult>> {
        let command = (wire::COMMAND_SETTLE, wire::settle_argument(settle));
        self.create_commands(requests, command, wire::decode_settles_into)
    }

    fn lookup(&self, requests: &[(u64, &[u8])]) -> Result<Vec<LookupResult>> {
        let mut answers = Vec::new();
        self.lookup_into(requests, &mut answers)?;
        Ok(answers)
    }

    fn resolve(&self, paths: &[&[u8]], credentials: Credentials) -> Result<Vec<ResolveResult>> {
        let mut answers = Vec::new();
        self.resolve_into(paths, credentials, &mut answers)?;
        Ok(answers)
    }

    fn stat(&self, inodes: &[u64]) -> Result<Vec<StatResult>> {
        let mut answers = Vec::new();
        self.stat_into(inodes, &mut answers)?;
        Ok(answers)
    }

    fn lookup_into(&self, requests: &[(u64, &[u8])], answers: &mut Vec<LookupResult>) -> Result<()> {
        answers.clear();
        check_lookups(requests)?;
        self.batched_into(
            requests,
            |(_, name)| wire::LOOKUP_RECORD_BYTES + wire::padded(name.len()),
            wire::encode_lookups,
            (wire::COMMAND_LOOKUP, [0; 3]),
            |bytes, _, out| wire::decode_lookups_into(bytes, out),
            answers,
        )
    }

    fn resolve_into(&self, paths: &[&[u8]], credentials: Credentials, answers: &mut Vec<ResolveResult>) -> Result<()> {
        // Paths longer than the walk accepts are answered without the GPU, so every request
        // fits a staging buffer; the answer is the twin's.
        super::resolve_within_limit_into(paths, answers, |short, answers| {
            self.batched_into(
                short,
                |path| wire::RESOLVE_RECORD_BYTES + wire::padded(path.len()),
                wire::encode_resolves,
                (wire::COMMAND_RESOLVE, [credentials.uid as u64, credentials.gid as u64, 0]),
                |bytes, _, out| wire::decode_resolves_into(bytes, out),
                answers,
            )
        })
    }

    fn stat_into(&self, inodes: &[u64], answers: &mut Vec<StatResult>) -> Result<()> {
        answers.clear();
        check_inodes(inodes)?;
        self.batched_into(
            inodes,
            |_| wire::STAT_RECORD_BYTES,
            wire::encode_stats,
            (wire::COMMAND_STAT, [0; 3]),
            wire::decode_stats_into,
            answers,
        )
    }

    /// Scans the entry table in slot ranges whose records fit a staging buffer; a range that
    /// overflows is split and served again. Holds the ring so the listing is one moment's.
    fn list(&self, directory: u64) -> Result<ListResult> {
        check_inode(directory)?;
        self.check_failed()?;
        self.device.bind_context()?;
        let mut staging = self.take_staging()?;
        let result = (|| -> Result<ListResult> {
            let mut next = self.ring.lock();
            let capacity = staging.host.bytes;
            let mut ranges = vec![(0u64, self.entry_slots)];
            let mut entries = Vec::new();
            let mut commands = 0;
            while let Some((start, end)) = ranges.pop() {
                commands += 1;
                if commands > MAXIMUM_LIST_COMMANDS {
                    return Err(AccelError::Device(format!("listing {directory} took over {commands} commands")));
                }
                // The range fixes nothing about how many entries match, so the kernel reports
                // the bytes it needed and writes only what fits.
                let layout = Layout { request_bytes: 0, answers_offset: 0, answers_bytes: capacity };
                let base = self.command_base(&staging, capacity);
                let fields = Self::fields(wire::COMMAND_LIST, 0, base, &layout, [directory, start, end]);
                let (slot, sequence) = self.submit(&mut next, &fields)?;
                let completion = self.wait(slot, sequence)?;
                if completion.result1 == 0 {
                    return Ok(ListResult::Unknown);
                }
                let needed = completion.result0 as usize;
                if needed > capacity {
                    let pieces = (needed.div_ceil(capacity) as u64 + 1).min(end - start);
                    if pieces < 2 {
                        return Err(AccelError::Device(format!("list range {start}..{end} cannot be split")));
                    }
                    let step = (end - start).div_ceil(pieces);
                    let mut piece_start = start;
                    while piece_start < end {
                        ranges.push((piece_start, (piece_start + step).min(end)));
                        piece_start += step;
                    }
                    continue;
                }
                self.stage_out(&mut staging, base, 0, needed)?;
                entries.extend(wire::decode_list(&staging.bytes()[..needed], needed)?);
            }
            entries.sort_unstable();
            Ok(ListResult::Listed(entries))
        })();
        self.return_staging(staging);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_open_says_why() {
        match GpuDirectoryIndex::open(1, GpuIndexConfig::for_entries(1024)) {
            Ok(index) => assert!(index.describe().contains("persistent kernel")),
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }

    #[test]
    fn table_slots_are_powers_of_two_with_room() {
        for capacity in [0usize, 1, 1000, 1024, 10_000_000] {
            let slots = slots_for(capacity);
            assert!(slots.is_power_of_two() && slots as usize >= capacity + capacity / 2 && slots >= 1024);
        }
    }

    /// Where NVRTC is installed (no GPU needed), the directory kernel must compile for Hopper.
    #[test]
    fn kernel_compiles_with_nvrtc_when_present() {
        if crate::cuda::probe_nvrtc().is_err() {
            eprintln!("skipped: libnvrtc not found");
            return;
        }
        let directory = std::env::temp_dir().join(format!("tandem-dirindex-cache-test-{}", std::process::id()));
        let (image, from_cache, _) =
            crate::cuda::compile_cached_in(&directory, "dirindex", KERNEL_SOURCE, &[], 9, 0).expect("kernel compiles");
        assert!(!image.is_empty() && !from_cache);
        let _ = std::fs::remove_dir_all(directory);
    }
}
