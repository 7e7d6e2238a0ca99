//! GPUstore-style request management over the engines.
//!
//! * Asynchronous submission: [`Accelerator::submit`] returns a [`Completion`] that can be
//!   waited on, polled as a `Future`, or replaced by a callback ([`Accelerator::submit_with_callback`]).
//! * Merging: requests below `merge_below_bytes` for the same service (same block size, same
//!   key and direction, same code) are gathered into one batch until the batch reaches
//!   `batch_limit_bytes` or the first request has waited `batch_latency`.
//! * Hybrid dispatch: a batch smaller than the service's threshold runs on the CPU engine,
//!   a larger one on the CUDA engine (every GPU). Thresholds come from a short calibration at
//!   start-up unless the configuration or `TANDEM_ACCEL_GPU_THRESHOLD_BYTES` sets them.
//! * Large requests are split into chunks pipelined over the device streams by the engine.
//! * Blocking wrappers on borrowed memory skip the queue and pick the engine the same way.
//!
//! Queues are bounded: submitters block when `queue_depth` requests are waiting.

use crate::cuda::{CudaEngine, CudaSystem};
use crate::engine::{CpuEngine, Engine, Sectors};
use crate::error::{AccelError, Result};
use crate::pool::{BufferPool, HostBuffer};
use crate::reed_solomon::ReedSolomon;
use crate::xts::{Direction, XtsKey, SECTOR_SIZE_BYTES};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Which engines the runtime may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// CPU engine only.
    Cpu,
    /// Every request on the GPU (fails over to the CPU when there is none).
    Gpu,
    /// Below the per-service threshold on the CPU, above it on the GPU.
    Hybrid,
}

/// The services, for thresholds and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Service {
    Crc32c,
    Xts,
    ReedSolomon,
}

#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    pub mode: Mode,
    /// Threads of the CPU engine (0 = every core).
    pub cpu_threads: usize,
    /// Requests at least this large are never merged.
    pub merge_below_bytes: usize,
    /// A batch is dispatched once it holds this many bytes …
    pub batch_limit_bytes: usize,
    /// … or once its first request has waited this long.
    pub batch_latency: Duration,
    /// Requests waiting in the submission queue before submitters block.
    pub queue_depth: usize,
    /// Threads that execute batches (each blocks on its engine call).
    pub executor_threads: usize,
    /// Hybrid threshold for every service, overriding calibration.
    pub gpu_threshold_bytes: Option<usize>,
    /// Run the start-up calibration when a GPU is present and no threshold is set.
    pub calibrate: bool,
    /// Pinned bytes the buffer pool keeps for reuse.
    pub pool_cached_bytes: usize,
    /// Gather merged batches into one buffer even when they run on the CPU (the GPU path);
    /// normally the CPU runs members in place. For tests and comparisons.
    pub gather_on_cpu: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Hybrid,
            cpu_threads: 0,
            merge_below_bytes: 256 << 10,
            batch_limit_bytes: 4 << 20,
            batch_latency: Duration::from_micros(200),
            queue_depth: 1024,
            executor_threads: 4,
            gpu_threshold_bytes: std::env::var("TANDEM_ACCEL_GPU_THRESHOLD_BYTES").ok().and_then(|v| v.parse().ok()),
            calibrate: true,
            pool_cached_bytes: 1 << 30,
            gather_on_cpu: false,
        }
    }
}

/// A request with owned buffers (they come back in the [`Response`]).
pub enum Request {
    /// CRC32C (from 0) of each `block_bytes` block.
    Crc32cBlocks { data: HostBuffer, block_bytes: usize },
    /// AES-256-XTS of whole 4 KiB sectors numbered from `first_sector`, in place.
    Xts { key: Arc<XtsKey>, direction: Direction, first_sector: u64, data: HostBuffer },
    /// Parity of k data shards (all the same length).
    ReedSolomonEncode { code: Arc<ReedSolomon>, data: Vec<HostBuffer> },
    /// Rebuild the `None` shards (k + m entries; at most m missing).
    ReedSolomonReconstruct { code: Arc<ReedSolomon>, shards: Vec<Option<HostBuffer>> },
}

impl Request {
    fn bytes(&self) -> usize {
        match self {
            Request::Crc32cBlocks { data, .. } | Request::Xts { data, .. } => data.len(),
            Request::ReedSolomonEncode { data, .. } => data.iter().map(|s| s.len()).sum(),
            Request::ReedSolomonReconstruct { shards, .. } => shards.iter().flatten().map(|s| s.len()).sum(),
        }
    }

    fn service(&self) -> Service {
        match self {
            Request::Crc32cBlocks { .. } => Service::Crc32c,
            Request::Xts { .. } => Service::Xts,
            _ => Service::ReedSolomon,
        }
    }

    /// Requests with equal keys can share a batch.
    fn merge_key(&self) -> Option<MergeKey> {
        match self {
            Request::Crc32cBlocks { block_bytes, .. } => Some(MergeKey::Crc32c(*block_bytes)),
            Request::Xts { key, direction, .. } => Some(MergeKey::Xts(Arc::as_ptr(key) as usize, *direction)),
            Request::ReedSolomonEncode { code, .. } => Some(MergeKey::Encode(Arc::as_ptr(code) as usize)),
            Request::ReedSolomonReconstruct { .. } => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum MergeKey {
    Crc32c(usize),
    Xts(usize, Direction),
    Encode(usize),
}

/// What a request gives back.
#[derive(Debug)]
pub enum Response {
    Checksums {
        data: HostBuffer,
        checksums: Vec<u32>,
    },
    Data(HostBuffer),
    /// All k + m shards, data first.
    Shards(Vec<HostBuffer>),
}

type Callback = Box<dyn FnOnce(Result<Response>) + Send>;

enum CompletionSlot {
    Waiting { waker: Option<Waker>, callback: Option<Callback> },
    Done(Option<Result<Response>>),
}

struct CompletionState {
    slot: Mutex<CompletionSlot>,
    ready: Condvar,
    /// Set under the lock by a thread about to block in `wait`: only then does completion
    /// pay for a wake-up system call.
    waiter: std::sync::atomic::AtomicBool,
}

impl CompletionState {
    fn new(callback: Option<Callback>) -> Arc<Self> {
        Arc::new(Self {
            slot: Mutex::new(CompletionSlot::Waiting { waker: None, callback }),
            ready: Condvar::new(),
            waiter: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn complete(&self, result: Result<Response>) {
        let mut slot = self.slot.lock().expect("completion poisoned");
        let previous = std::mem::replace(&mut *slot, CompletionSlot::Done(None));
        match previous {
            CompletionSlot::Waiting { callback: Some(callback), .. } => {
                drop(slot);
                callback(result);
            }
            CompletionSlot::Waiting { waker, callback: None } => {
                *slot = CompletionSlot::Done(Some(result));
                drop(slot);
                if self.waiter.load(std::sync::atomic::Ordering::Acquire) {
                    self.ready.notify_all();
                }
                if let Some(waker) = waker {
                    waker.wake();
                }
            }
            CompletionSlot::Done(_) => unreachable!("request completed twice"),
        }
    }
}

/// The handle of a submitted request: `wait()` blocks, `.await` suspends.
pub struct Completion {
    state: Arc<CompletionState>,
}

impl Completion {
    pub fn wait(self) -> Result<Response> {
        let mut slot = self.state.slot.lock().expect("completion poisoned");
        loop {
            if let CompletionSlot::Done(result) = &mut *slot {
                return result.take().expect("result taken twice");
            }
            self.state.waiter.store(true, std::sync::atomic::Ordering::Release);
            slot = self.state.ready.wait(slot).expect("completion poisoned");
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(*self.state.slot.lock().expect("completion poisoned"), CompletionSlot::Done(_))
    }
}

impl Future for Completion {
    type Output = Result<Response>;
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.state.slot.lock().expect("completion poisoned");
        match &mut *slot {
            CompletionSlot::Done(result) => Poll::Ready(result.take().expect("polled after completion")),
            CompletionSlot::Waiting { waker, .. } => {
                *waker = Some(context.waker().clone());
                Poll::Pending
            }
        }
    }
}

struct Pending {
    request: Request,
    state: Arc<CompletionState>,
}

/// Per-service size from which the GPU runs a request in hybrid mode.
#[derive(Clone, Debug)]
pub struct Thresholds {
    pub bytes: HashMap<Service, usize>,
    pub source: String,
}

struct Shared {
    cpu: Arc<CpuEngine>,
    gpu: Option<Arc<CudaEngine>>,
    gpu_unavailable_reason: Option<String>,
    mode: Mode,
    thresholds: Thresholds,
    batches_executed: std::sync::atomic::AtomicUsize,
    requests_executed: std::sync::atomic::AtomicUsize,
    /// Merged GPU batches are gathered into pinned buffers from here.
    pool: BufferPool,
    gather_on_cpu: bool,
    /// Bytes each service ran on the CPU engine ([0]) and the GPU engine ([1]), by
    /// `Service::index`: which engine the calibration sent the work to, for reports.
    engine_bytes: [[std::sync::atomic::AtomicU64; 2]; 3],
}

impl Service {
    fn index(self) -> usize {
        match self {
            Service::Crc32c => 0,
            Service::Xts => 1,
            Service::ReedSolomon => 2,
        }
    }
}

impl Shared {
    /// The engine that runs `bytes` of `service` now, counted in `engine_bytes`.
    fn engine_to_run(&self, service: Service, bytes: usize) -> &dyn Engine {
        let engine = self.engine_for(service, bytes);
        let on_gpu = usize::from(engine.kind() != crate::engine::EngineKind::Cpu);
        self.engine_bytes[service.index()][on_gpu].fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
        engine
    }

    /// The engine `bytes` of `service` would run on (not counted: for decisions).
    fn engine_for(&self, service: Service, bytes: usize) -> &dyn Engine {
        match (&self.gpu, self.mode) {
            (Some(gpu), Mode::Gpu) => gpu.as_ref(),
            (Some(gpu), Mode::Hybrid) if bytes >= *self.thresholds.bytes.get(&service).unwrap_or(&usize::MAX) => {
                gpu.as_ref()
            }
            _ => self.cpu.as_ref(),
        }
    }
}

/// `Accelerator::xts_scattered`'s GPU path, on any engine: the pieces gathered into `gathered`
/// (a pool buffer, pinned where a GPU is present, so the engine copies it to the device
/// without another host copy) with a sector list, one call, the result scattered back.
fn xts_gathered(
    engine: &dyn Engine,
    key: &XtsKey,
    direction: Direction,
    pieces: &mut [(u64, &mut [u8])],
    gathered: &mut [u8],
) -> Result<()> {
    let total_bytes: usize = pieces.iter().map(|(_, data)| data.len()).sum();
    assert_eq!(gathered.len(), total_bytes, "the gather buffer holds every piece");
    let mut sector_numbers = Vec::with_capacity(total_bytes / SECTOR_SIZE_BYTES);
    let mut position = 0;
    for (first_sector, data) in pieces.iter() {
        gathered[position..position + data.len()].copy_from_slice(data);
        position += data.len();
        let sectors = (data.len() / SECTOR_SIZE_BYTES) as u64;
        sector_numbers.extend((0..sectors).map(|index| first_sector.wrapping_add(index)));
    }
    engine.xts(key, direction, Sectors::List(&sector_numbers), gathered)?;
    let mut position = 0;
    for (_, data) in pieces.iter_mut() {
        data.copy_from_slice(&gathered[position..position + data.len()]);
        position += data.len();
    }
    Ok(())
}

/// The accelerator runtime: engines, queues and the buffer pool.
pub struct Accelerator {
    shared: Arc<Shared>,
    submissions: Option<SyncSender<Pending>>,
    dispatcher: Option<std::thread::JoinHandle<()>>,
    pool: BufferPool,
}

impl Accelerator {
    /// Opens every GPU (if any, and unless the mode is CPU), calibrates, starts the queues.
    pub fn new(config: RuntimeConfig) -> Self {
        assert!(config.queue_depth > 0 && config.executor_threads > 0 && config.batch_limit_bytes > 0);
        let cpu = Arc::new(CpuEngine::new(config.cpu_threads));
        let (system, gpu_unavailable_reason) = if config.mode == Mode::Cpu {
            (None, Some("CPU mode requested".to_string()))
        } else {
            match CudaSystem::open() {
                Ok(system) => (Some(Arc::new(system)), None),
                Err(reason) => (None, Some(reason.to_string())),
            }
        };
        let gpu = system.as_ref().map(|system| Arc::new(CudaEngine::new(system)));
        let pool = BufferPool::new(system.clone(), config.pool_cached_bytes);
        let thresholds = match (&gpu, config.gpu_threshold_bytes) {
            (_, Some(bytes)) => Thresholds {
                bytes: [Service::Crc32c, Service::Xts, Service::ReedSolomon].into_iter().map(|s| (s, bytes)).collect(),
                source: "configured".into(),
            },
            (Some(gpu), None) if config.calibrate && config.mode == Mode::Hybrid => calibrate(&cpu, gpu, &pool),
            _ => Thresholds { bytes: HashMap::new(), source: "no GPU: everything on the CPU".into() },
        };
        let shared = Arc::new(Shared {
            cpu,
            gpu,
            gpu_unavailable_reason,
            mode: config.mode,
            thresholds,
            batches_executed: Default::default(),
            requests_executed: Default::default(),
            pool: pool.clone(),
            gather_on_cpu: config.gather_on_cpu,
            engine_bytes: Default::default(),
        });
        let (submissions, receiver) = mpsc::sync_channel::<Pending>(config.queue_depth);
        let dispatcher_shared = Arc::clone(&shared);
        let dispatcher_config = config.clone();
        let dispatcher = std::thread::Builder::new()
            .name("accel-dispatch".into())
            .spawn(move || dispatch_loop(dispatcher_shared, dispatcher_config, receiver))
            .expect("cannot start the dispatcher thread");
        Self { shared, submissions: Some(submissions), dispatcher: Some(dispatcher), pool }
    }

    /// One line per engine; says plainly when there is no GPU and why.
    pub fn describe(&self) -> String {
        let mut text = format!("CPU engine: {}\n", self.shared.cpu.name());
        match (&self.shared.gpu, &self.shared.gpu_unavailable_reason) {
            (Some(gpu), _) => {
                text += &format!("GPU engine: {}\n", gpu.name());
                let mut entries: Vec<String> = self
                    .shared
                    .thresholds
                    .bytes
                    .iter()
                    .map(|(service, &bytes)| {
                        if bytes == usize::MAX {
                            format!("{service:?}: CPU at every size (it was faster up to 16 MiB, the largest tried)")
                        } else {
                            format!("{service:?}: GPU from {bytes} B")
                        }
                    })
                    .collect();
                entries.sort();
                text += &format!("hybrid thresholds ({}): {}\n", self.shared.thresholds.source, entries.join(", "));
            }
            (None, reason) => {
                text += &format!(
                    "GPU engine: none ({}); running on the CPU engine\n",
                    reason.as_deref().unwrap_or("unknown")
                )
            }
        }
        text
    }

    /// (batches executed, requests executed) since start: their ratio shows how much merging
    /// happened.
    pub fn statistics(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        (self.shared.batches_executed.load(Ordering::Relaxed), self.shared.requests_executed.load(Ordering::Relaxed))
    }

    /// Bytes of `service` run on the CPU engine and on the GPU engine since start.
    pub fn engine_bytes(&self, service: Service) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        let counts = &self.shared.engine_bytes[service.index()];
        (counts[0].load(Ordering::Relaxed), counts[1].load(Ordering::Relaxed))
    }

    pub fn has_gpu(&self) -> bool {
        self.shared.gpu.is_some()
    }

    pub fn thresholds(&self) -> &Thresholds {
        &self.shared.thresholds
    }

    /// A host buffer from the pool: pinned when a GPU is present, so the engine copies it to
    /// the device without an extra host copy.
    pub fn buffer(&self, bytes: usize) -> HostBuffer {
        self.pool.get(bytes)
    }

    /// Queues a request; the completion resolves when it ran.
    pub fn submit(&self, request: Request) -> Completion {
        let state = CompletionState::new(None);
        self.enqueue(request, Arc::clone(&state));
        Completion { state }
    }

    /// Queues a request; `callback` runs on a runtime thread with the result.
    pub fn submit_with_callback(&self, request: Request, callback: impl FnOnce(Result<Response>) + Send + 'static) {
        let state = CompletionState::new(Some(Box::new(callback)));
        self.enqueue(request, state);
    }

    fn enqueue(&self, request: Request, state: Arc<CompletionState>) {
        let pending = Pending { request, state };
        match &self.submissions {
            Some(sender) => {
                if let Err(mpsc::SendError(pending)) = sender.send(pending) {
                    pending.state.complete(Err(AccelError::ShutDown));
                }
            }
            None => pending.state.complete(Err(AccelError::ShutDown)),
        }
    }

    // ---- blocking wrappers on borrowed memory (no queue, no copy)

    pub fn crc32c(&self, crc: u32, data: &[u8]) -> Result<u32> {
        self.shared.engine_to_run(Service::Crc32c, data.len()).crc32c(crc, data)
    }

    /// CRC32C of each 4 KiB block.
    pub fn crc32c_blocks(&self, data: &[u8]) -> Result<Vec<u32>> {
        let mut checksums = vec![0u32; data.len() / SECTOR_SIZE_BYTES];
        self.shared.engine_to_run(Service::Crc32c, data.len()).crc32c_blocks(
            data,
            SECTOR_SIZE_BYTES,
            &mut checksums,
        )?;
        Ok(checksums)
    }

    pub fn xts_encrypt(&self, key: &XtsKey, first_sector: u64, data: &mut [u8]) -> Result<()> {
        self.shared.engine_to_run(Service::Xts, data.len()).xts(
            key,
            Direction::Encrypt,
            Sectors::Consecutive(first_sector),
            data,
        )
    }

    pub fn xts_decrypt(&self, key: &XtsKey, first_sector: u64, data: &mut [u8]) -> Result<()> {
        self.shared.engine_to_run(Service::Xts, data.len()).xts(
            key,
            Direction::Decrypt,
            Sectors::Consecutive(first_sector),
            data,
        )
    }

    /// AES-256-XTS of several buffers of whole 4 KiB sectors in place, as one request: piece
    /// `(first_sector, data)` holds sectors `first_sector ..`. The engine is chosen for the
    /// pieces' total size. The CPU engine runs the pieces where they lie (no copy); the GPU
    /// gathers them into one pinned buffer from the pool with a sector list and scatters the
    /// result back, which costs two host copies but one launch and one round trip for the whole
    /// batch, and the engine copies the pinned buffer to the device directly.
    pub fn xts_scattered(&self, key: &XtsKey, direction: Direction, pieces: &mut [(u64, &mut [u8])]) -> Result<()> {
        let total_bytes: usize = pieces.iter().map(|(_, data)| data.len()).sum();
        let engine = self.shared.engine_to_run(Service::Xts, total_bytes);
        if engine.kind() == crate::EngineKind::Cpu || pieces.len() == 1 {
            for (first_sector, data) in pieces.iter_mut() {
                engine.xts(key, direction, Sectors::Consecutive(*first_sector), data)?;
            }
            return Ok(());
        }
        let mut gathered = self.pool.get(total_bytes);
        xts_gathered(engine, key, direction, pieces, &mut gathered)
    }

    pub fn reed_solomon_encode(&self, code: &ReedSolomon, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<()> {
        let bytes = data.iter().map(|s| s.len()).sum();
        self.shared.engine_to_run(Service::ReedSolomon, bytes).reed_solomon_encode(code, data, parity)
    }

    pub fn reed_solomon_reconstruct(
        &self,
        code: &ReedSolomon,
        shards: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<()> {
        let bytes = shards.iter().map(|s| s.len()).sum();
        self.shared.engine_to_run(Service::ReedSolomon, bytes).reed_solomon_reconstruct(code, shards, present)
    }
}

impl Drop for Accelerator {
    fn drop(&mut self) {
        // Closing the queue lets the dispatcher flush open batches and stop.
        self.submissions.take();
        if let Some(dispatcher) = self.dispatcher.take() {
            let _ = dispatcher.join();
        }
    }
}

/// Times CPU against GPU at growing sizes; the threshold is the smallest size from which the
/// GPU wins at that size and every larger one tried.
fn calibrate(cpu: &CpuEngine, gpu: &CudaEngine, pool: &BufferPool) -> Thresholds {
    let sizes: Vec<usize> = (0..9).map(|step| (64 << 10) << step).collect(); // 64 KiB .. 16 MiB
    let key = XtsKey::new(&[0x3C; 64]);
    let code = ReedSolomon::new(8, 2).expect("8+2 is valid");
    let time = |run: &mut dyn FnMut() -> Result<()>| -> f64 {
        let _ = run();
        (0..3)
            .map(|_| {
                let start = Instant::now();
                let _ = run();
                start.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    };
    let mut bytes = HashMap::new();
    let started = Instant::now();
    for service in [Service::Crc32c, Service::Xts, Service::ReedSolomon] {
        let mut threshold = usize::MAX;
        for &size in sizes.iter().rev() {
            let mut buffer = pool.get(size);
            let (cpu_seconds, gpu_seconds) = match service {
                Service::Crc32c => {
                    let mut sums = vec![0u32; size / SECTOR_SIZE_BYTES];
                    let c = time(&mut || cpu.crc32c_blocks(&buffer, SECTOR_SIZE_BYTES, &mut sums));
                    let g = time(&mut || gpu.crc32c_blocks(&buffer, SECTOR_SIZE_BYTES, &mut sums));
                    (c, g)
                }
                Service::Xts => {
                    let c = time(&mut || cpu.xts(&key, Direction::Encrypt, Sectors::Consecutive(0), &mut buffer));
                    let g = time(&mut || gpu.xts(&key, Direction::Encrypt, Sectors::Consecutive(0), &mut buffer));
                    (c, g)
                }
                Service::ReedSolomon => {
                    let shard = size / 8;
                    let mut parity = pool.get(2 * shard);
                    let inputs: Vec<&[u8]> = buffer.chunks(shard).collect();
                    let (first, second) = parity.split_at_mut(shard);
                    let mut outputs: Vec<&mut [u8]> = vec![first, second];
                    let c = time(&mut || cpu.reed_solomon_encode(&code, &inputs, &mut outputs));
                    let g = time(&mut || gpu.reed_solomon_encode(&code, &inputs, &mut outputs));
                    (c, g)
                }
            };
            if gpu_seconds < cpu_seconds {
                threshold = size;
            } else {
                break;
            }
        }
        bytes.insert(service, threshold);
    }
    Thresholds { bytes, source: format!("calibrated in {:.0} ms", started.elapsed().as_secs_f64() * 1e3) }
}

struct Batch {
    deadline: Instant,
    bytes: usize,
    members: Vec<Pending>,
}

fn dispatch_loop(shared: Arc<Shared>, config: RuntimeConfig, receiver: Receiver<Pending>) {
    // Executors: a bounded queue of batches so a slow engine pushes back on the dispatcher.
    let (jobs, job_receiver) = mpsc::sync_channel::<Vec<Pending>>(config.executor_threads * 2);
    let job_receiver = Arc::new(Mutex::new(job_receiver));
    let executors: Vec<_> = (0..config.executor_threads)
        .map(|index| {
            let receiver = Arc::clone(&job_receiver);
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("accel-exec-{index}"))
                .spawn(move || loop {
                    let job = receiver.lock().expect("job queue poisoned").recv();
                    match job {
                        Ok(members) => execute(&shared, members),
                        Err(_) => break,
                    }
                })
                .expect("cannot start an executor thread")
        })
        .collect();
    let mut open: HashMap<MergeKey, Batch> = HashMap::new();
    loop {
        let now = Instant::now();
        let next_deadline = open.values().map(|batch| batch.deadline).min();
        let received = match next_deadline {
            Some(deadline) => receiver.recv_timeout(deadline.saturating_duration_since(now)),
            None => receiver.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let disconnected = match received {
            Ok(pending) => {
                let bytes = pending.request.bytes();
                match pending.request.merge_key() {
                    Some(key) if bytes < config.merge_below_bytes => {
                        let batch = open.entry(key).or_insert_with(|| Batch {
                            deadline: Instant::now() + config.batch_latency,
                            bytes: 0,
                            members: Vec::new(),
                        });
                        batch.bytes += bytes;
                        batch.members.push(pending);
                        if batch.bytes >= config.batch_limit_bytes {
                            let batch = open.remove(&key).expect("batch just used");
                            let _ = jobs.send(batch.members);
                        }
                    }
                    _ => {
                        let _ = jobs.send(vec![pending]);
                    }
                }
                false
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        let now = Instant::now();
        let due: Vec<MergeKey> =
            open.iter().filter(|(_, batch)| disconnected || batch.deadline <= now).map(|(key, _)| *key).collect();
        for key in due {
            let batch = open.remove(&key).expect("due batch exists");
            let _ = jobs.send(batch.members);
        }
        if disconnected {
            break;
        }
    }
    drop(jobs);
    for executor in executors {
        let _ = executor.join();
    }
}

/// Runs one batch (one or more compatible requests) and completes every member.
fn execute(shared: &Shared, mut members: Vec<Pending>) {
    assert!(!members.is_empty());
    shared.batches_executed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    shared.requests_executed.fetch_add(members.len(), std::sync::atomic::Ordering::Relaxed);
    if members.len() == 1 {
        let pending = members.pop().expect("one member");
        let result = execute_single(shared, pending.request);
        pending.state.complete(result);
        return;
    }
    let batch_bytes: usize = members.iter().map(|member| member.request.bytes()).sum();
    if !shared.gather_on_cpu
        && shared.engine_for(members[0].request.service(), batch_bytes).kind() == crate::engine::EngineKind::Cpu
    {
        // The CPU needs no contiguous copy: run the members where they lie, spread over the
        // engine's threads (each member is small, so each runs single-threaded).
        let threads = (batch_bytes / (256 << 10)).clamp(1, shared.cpu.threads());
        let per_thread = members.len().div_ceil(threads);
        std::thread::scope(|scope| {
            for group in members.chunks_mut(per_thread) {
                scope.spawn(move || {
                    for member in group.iter_mut() {
                        let request = std::mem::replace(
                            &mut member.request,
                            Request::Crc32cBlocks { data: HostBuffer::from_vec(Vec::new()), block_bytes: 1 },
                        );
                        let result = execute_single(shared, request);
                        member.state.complete(result);
                    }
                });
            }
        });
        return;
    }
    let bytes: usize = members.iter().map(|member| member.request.bytes()).sum();
    let engine = shared.engine_to_run(members[0].request.service(), bytes);
    let results: Vec<Result<Response>> = match &members[0].request {
        Request::Crc32cBlocks { block_bytes, .. } => {
            let block_bytes = *block_bytes;
            // Gathered into a pooled (pinned when a GPU exists) buffer: the one host copy that
            // merging costs, after which the GPU copies by DMA.
            let mut merged = shared.pool.get(bytes);
            let mut filled = 0;
            for member in &members {
                if let Request::Crc32cBlocks { data, .. } = &member.request {
                    merged[filled..filled + data.len()].copy_from_slice(data);
                    filled += data.len();
                }
            }
            let mut checksums = vec![0u32; merged.len() / block_bytes.max(1)];
            let outcome = engine.crc32c_blocks(&merged, block_bytes, &mut checksums);
            let mut offset = 0;
            members
                .iter_mut()
                .map(|member| {
                    let Request::Crc32cBlocks { data, .. } = &mut member.request else { unreachable!() };
                    let count = data.len() / block_bytes;
                    let mine = checksums[offset..offset + count].to_vec();
                    offset += count;
                    outcome.clone().map(|_| Response::Checksums {
                        data: std::mem::replace(data, HostBuffer::from_vec(Vec::new())),
                        checksums: mine,
                    })
                })
                .collect()
        }
        Request::Xts { key, direction, .. } => {
            let (key, direction) = (Arc::clone(key), *direction);
            let mut merged = shared.pool.get(bytes);
            let mut filled = 0;
            let mut sectors = Vec::with_capacity(bytes / SECTOR_SIZE_BYTES);
            for member in &members {
                if let Request::Xts { first_sector, data, .. } = &member.request {
                    merged[filled..filled + data.len()].copy_from_slice(data);
                    filled += data.len();
                    sectors.extend((0..(data.len() / SECTOR_SIZE_BYTES) as u64).map(|i| first_sector.wrapping_add(i)));
                }
            }
            let outcome = if merged.len() == sectors.len() * SECTOR_SIZE_BYTES {
                engine.xts(&key, direction, Sectors::List(&sectors), &mut merged)
            } else {
                Err(AccelError::InvalidArgument("XTS data is not whole 4 KiB sectors".into()))
            };
            let mut offset = 0;
            members
                .iter_mut()
                .map(|member| {
                    let Request::Xts { data, .. } = &mut member.request else { unreachable!() };
                    let length = data.len();
                    if outcome.is_ok() {
                        data.copy_from_slice(&merged[offset..offset + length]);
                    }
                    offset += length;
                    outcome.clone().map(|_| Response::Data(std::mem::replace(data, HostBuffer::from_vec(Vec::new()))))
                })
                .collect()
        }
        Request::ReedSolomonEncode { code, .. } => {
            let code = Arc::clone(code);
            let (k, m) = (code.data_shards(), code.parity_shards());
            // Shard i of the batch is shard i of every member, one after another.
            let mut lengths = Vec::new();
            let mut merged: Vec<Vec<u8>> = vec![Vec::new(); k];
            let mut shapes_valid = true;
            for member in &members {
                if let Request::ReedSolomonEncode { data, .. } = &member.request {
                    shapes_valid &= data.len() == k && data.iter().all(|s| s.len() == data[0].len());
                    lengths.push(data.first().map(|s| s.len()).unwrap_or(0));
                    for (column, shard) in data.iter().enumerate().take(k) {
                        merged[column].extend_from_slice(shard);
                    }
                }
            }
            let total: usize = lengths.iter().sum();
            let mut parity = vec![vec![0u8; total]; m];
            let outcome = if shapes_valid {
                let inputs: Vec<&[u8]> = merged.iter().map(|s| s.as_slice()).collect();
                let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(|s| s.as_mut_slice()).collect();
                engine.reed_solomon_encode(&code, &inputs, &mut outputs)
            } else {
                Err(AccelError::InvalidArgument("shards do not match the code".into()))
            };
            let mut offset = 0;
            members
                .iter_mut()
                .zip(lengths)
                .map(|(member, length)| {
                    let Request::ReedSolomonEncode { data, .. } = &mut member.request else { unreachable!() };
                    let mut shards: Vec<HostBuffer> = std::mem::take(data);
                    for row in &parity {
                        shards.push(HostBuffer::from_vec(row[offset..offset + length].to_vec()));
                    }
                    offset += length;
                    outcome.clone().map(|_| Response::Shards(shards))
                })
                .collect()
        }
        Request::ReedSolomonReconstruct { .. } => {
            unreachable!("reconstruction requests are never merged")
        }
    };
    for (member, result) in members.into_iter().zip(results) {
        member.state.complete(result);
    }
}

fn execute_single(shared: &Shared, request: Request) -> Result<Response> {
    let engine = shared.engine_to_run(request.service(), request.bytes());
    match request {
        Request::Crc32cBlocks { data, block_bytes } => {
            if block_bytes == 0 {
                return Err(AccelError::InvalidArgument("block size 0".into()));
            }
            let mut checksums = vec![0u32; data.len() / block_bytes];
            engine.crc32c_blocks(&data, block_bytes, &mut checksums)?;
            Ok(Response::Checksums { data, checksums })
        }
        Request::Xts { key, direction, first_sector, mut data } => {
            engine.xts(&key, direction, Sectors::Consecutive(first_sector), &mut data)?;
            Ok(Response::Data(data))
        }
        Request::ReedSolomonEncode { code, data } => {
            let shard_bytes = data.first().map(|s| s.len()).unwrap_or(0);
            let mut parity: Vec<HostBuffer> =
                (0..code.parity_shards()).map(|_| HostBuffer::from_vec(vec![0u8; shard_bytes])).collect();
            {
                let inputs: Vec<&[u8]> = data.iter().map(|s| &s[..]).collect();
                let mut outputs: Vec<&mut [u8]> = parity.iter_mut().map(|s| &mut s[..]).collect();
                engine.reed_solomon_encode(&code, &inputs, &mut outputs)?;
            }
            let mut shards = data;
            shards.extend(parity);
            Ok(Response::Shards(shards))
        }
        Request::ReedSolomonReconstruct { code, shards } => {
            let shard_bytes = shards.iter().flatten().map(|s| s.len()).next().unwrap_or(0);
            let present: Vec<bool> = shards.iter().map(|s| s.is_some()).collect();
            let mut shards: Vec<HostBuffer> =
                shards.into_iter().map(|s| s.unwrap_or_else(|| HostBuffer::from_vec(vec![0u8; shard_bytes]))).collect();
            {
                let mut views: Vec<&mut [u8]> = shards.iter_mut().map(|s| &mut s[..]).collect();
                engine.reed_solomon_reconstruct(&code, &mut views, &present)?;
            }
            Ok(Response::Shards(shards))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn runtime() -> Accelerator {
        runtime_with(false)
    }

    fn runtime_with(gather_on_cpu: bool) -> Accelerator {
        Accelerator::new(RuntimeConfig {
            batch_latency: Duration::from_millis(5),
            gather_on_cpu,
            ..RuntimeConfig::default()
        })
    }

    /// A batch's buffers in one call give the bytes each buffer gives alone, on the path the
    /// CPU takes (in place) and on the GPU's (gathered with a sector list), here run on the CPU.
    #[test]
    fn scattered_xts_matches_one_call_per_buffer() {
        let key = XtsKey::new(&std::array::from_fn(|index| (index as u8).wrapping_mul(7)));
        let lengths_sectors = [(17u64, 1usize), (3, 4), (1000, 2)];
        let original: Vec<Vec<u8>> = lengths_sectors
            .iter()
            .enumerate()
            .map(|(seed, (_, sectors))| (0..sectors * SECTOR_SIZE_BYTES).map(|i| (i * 31 + seed) as u8).collect())
            .collect();
        let mut expected = original.clone();
        let cpu = CpuEngine::new(1);
        for ((first, _), data) in lengths_sectors.iter().zip(expected.iter_mut()) {
            cpu.xts(&key, Direction::Encrypt, Sectors::Consecutive(*first), data).unwrap();
        }
        let accelerator = runtime();
        for gathered in [false, true] {
            let mut buffers = original.clone();
            let mut pieces: Vec<(u64, &mut [u8])> = lengths_sectors
                .iter()
                .zip(buffers.iter_mut())
                .map(|((first, _), data)| (*first, &mut data[..]))
                .collect();
            if gathered {
                let mut gathered = vec![0u8; 7 * SECTOR_SIZE_BYTES];
                xts_gathered(&cpu, &key, Direction::Encrypt, &mut pieces, &mut gathered).unwrap();
            } else {
                accelerator.xts_scattered(&key, Direction::Encrypt, &mut pieces).unwrap();
            }
            assert_eq!(buffers, expected, "gathered: {gathered}");
        }
    }

    /// The bytes each engine ran are counted once per call, by service.
    #[test]
    fn counts_the_bytes_each_engine_runs() {
        let accelerator = Accelerator::new(RuntimeConfig { mode: Mode::Cpu, ..RuntimeConfig::default() });
        let key = XtsKey::new(&[5u8; 64]);
        let mut data = vec![7u8; 3 * SECTOR_SIZE_BYTES];
        accelerator.xts_encrypt(&key, 9, &mut data).unwrap();
        let mut pieces: Vec<(u64, &mut [u8])> = data.chunks_mut(SECTOR_SIZE_BYTES).map(|piece| (1, piece)).collect();
        accelerator.xts_scattered(&key, Direction::Decrypt, &mut pieces).unwrap();
        accelerator.crc32c_blocks(&data).unwrap();
        assert_eq!(accelerator.engine_bytes(Service::Xts), (6 * SECTOR_SIZE_BYTES as u64, 0));
        assert_eq!(accelerator.engine_bytes(Service::Crc32c), (3 * SECTOR_SIZE_BYTES as u64, 0));
        assert_eq!(accelerator.engine_bytes(Service::ReedSolomon), (0, 0));
    }

    #[test]
    fn says_which_engines_run() {
        let accelerator = runtime();
        let text = accelerator.describe();
        assert!(text.contains("CPU engine"));
        if !accelerator.has_gpu() {
            assert!(text.contains("GPU engine: none"), "{text}");
        }
    }

    #[test]
    fn merged_small_requests_match_direct_results() {
        merged_requests_check(runtime_with(false));
        // The gather path is what GPU batches take.
        merged_requests_check(runtime_with(true));
    }

    fn merged_requests_check(accelerator: Accelerator) {
        let key = Arc::new(XtsKey::new(&[7u8; 64]));
        let mut completions = Vec::new();
        let mut expected = Vec::new();
        for index in 0..20u64 {
            let plain = crate::bench::random_bytes(SECTOR_SIZE_BYTES * (1 + index as usize % 3), index);
            let mut reference = plain.clone();
            crate::xts::process_units(&key, Direction::Encrypt, 100 * index, SECTOR_SIZE_BYTES, &mut reference);
            expected.push((reference, plain.clone()));
            completions.push(accelerator.submit(Request::Xts {
                key: Arc::clone(&key),
                direction: Direction::Encrypt,
                first_sector: 100 * index,
                data: HostBuffer::from_vec(plain),
            }));
            let checksum_data = HostBuffer::from_vec(expected.last().unwrap().1.clone());
            completions.push(
                accelerator.submit(Request::Crc32cBlocks { data: checksum_data, block_bytes: SECTOR_SIZE_BYTES }),
            );
        }
        let submitted = completions.len();
        for (index, completion) in completions.into_iter().enumerate() {
            let (reference, plain) = &expected[index / 2];
            match completion.wait().unwrap() {
                Response::Data(data) => assert_eq!(&data[..], &reference[..]),
                Response::Checksums { checksums, .. } => {
                    let direct: Vec<u32> = plain.chunks(SECTOR_SIZE_BYTES).map(|b| crate::crc32c(0, b)).collect();
                    assert_eq!(checksums, direct);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let (batches, requests) = accelerator.statistics();
        assert_eq!(requests, submitted);
        assert!(batches < requests, "small requests were merged: {batches} batches for {requests} requests");
    }

    #[test]
    fn callbacks_futures_and_reed_solomon() {
        callbacks_check(runtime_with(false));
        callbacks_check(runtime_with(true));
    }

    fn callbacks_check(accelerator: Accelerator) {
        let code = Arc::new(ReedSolomon::new(4, 2).unwrap());
        let data: Vec<Vec<u8>> = (0..4).map(|i| crate::bench::random_bytes(1000, i)).collect();
        let called = Arc::new(AtomicUsize::new(0));
        let (sender, receiver) = mpsc::channel();
        for _ in 0..3 {
            let counter = Arc::clone(&called);
            let sender = sender.clone();
            accelerator.submit_with_callback(
                Request::ReedSolomonEncode {
                    code: Arc::clone(&code),
                    data: data.iter().cloned().map(HostBuffer::from_vec).collect(),
                },
                move |result| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    sender.send(result).unwrap();
                },
            );
        }
        let results: Vec<_> = (0..3).map(|_| receiver.recv().unwrap().unwrap()).collect();
        assert_eq!(called.load(Ordering::SeqCst), 3);
        let Response::Shards(shards) = &results[0] else { panic!() };
        assert_eq!(shards.len(), 6);
        // Lose one data and one parity shard and rebuild them through a polled future.
        let mut partial: Vec<Option<HostBuffer>> =
            shards.iter().map(|s| Some(HostBuffer::from_vec(s.to_vec()))).collect();
        partial[1] = None;
        partial[5] = None;
        let completion =
            accelerator.submit(Request::ReedSolomonReconstruct { code: Arc::clone(&code), shards: partial });
        let rebuilt = block_on(completion).unwrap();
        let Response::Shards(rebuilt) = rebuilt else { panic!() };
        for index in 0..6 {
            assert_eq!(&rebuilt[index][..], &shards[index][..]);
        }
    }

    /// Minimal executor for the test: parks the thread until woken.
    fn block_on<F: Future>(future: F) -> F::Output {
        struct ThreadWaker(std::thread::Thread);
        impl std::task::Wake for ThreadWaker {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut context = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
                return output;
            }
            std::thread::park_timeout(Duration::from_millis(10));
        }
    }

    #[test]
    fn bad_requests_fail_cleanly() {
        let accelerator = runtime();
        let key = Arc::new(XtsKey::new(&[1u8; 64]));
        let result = accelerator
            .submit(Request::Xts {
                key,
                direction: Direction::Decrypt,
                first_sector: 0,
                data: HostBuffer::from_vec(vec![0u8; 300_000]),
            })
            .wait();
        assert!(result.is_err());
        let code = Arc::new(ReedSolomon::new(3, 1).unwrap());
        let shards = vec![None, None, Some(HostBuffer::from_vec(vec![0; 8])), Some(HostBuffer::from_vec(vec![0; 8]))];
        assert!(accelerator.submit(Request::ReedSolomonReconstruct { code, shards }).wait().is_err());
    }
}
