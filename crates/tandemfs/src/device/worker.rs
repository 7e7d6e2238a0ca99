//! A small pool of I/O worker threads behind `Device::submit`.
//!
//! Each worker owns one bounded queue of batches. A submitting thread is bound to one queue for
//! its whole life, so the batches one thread submits run in submission order (the per-thread
//! queue shape testFS uses and io_uring will keep), while batches of different threads run in
//! parallel on different workers. Within a batch, requests run in order and stop at the first
//! error. A full queue blocks the submitter: that is the back-pressure that keeps memory bounded.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{run_batch, Device, IoCompletion, IoRequest, IoTicket};
use crate::error::{Error, Result};

/// Largest pool a device may ask for; more threads than this only add context switches for
/// blocking pread/pwrite.
pub const MAXIMUM_WORKER_COUNT: usize = 64;
/// Largest per-worker queue; the queue holds whole batches, each owning its buffers.
pub const MAXIMUM_QUEUE_DEPTH_BATCHES: usize = 4096;

struct Job {
    batch: Vec<IoRequest>,
    reply: SyncSender<Result<Vec<IoCompletion>>>,
}

/// Worker threads that run batches against `target`. Dropping the pool closes the queues, lets
/// the workers finish the batches already queued, and joins them.
pub(crate) struct WorkerPool {
    queues: Vec<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

/// Source of queue slots: each thread takes the next slot the first time it submits, which
/// spreads threads evenly over the workers of any pool.
static NEXT_QUEUE_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static QUEUE_SLOT: usize = NEXT_QUEUE_SLOT.fetch_add(1, Ordering::Relaxed);
}

impl WorkerPool {
    /// Starts `worker_count` threads, each with a queue of `queue_depth_batches` batches.
    pub(crate) fn start(
        target: Arc<dyn Device>,
        worker_count: usize,
        queue_depth_batches: usize,
        thread_name: &str,
    ) -> std::io::Result<WorkerPool> {
        assert!(
            (1..=MAXIMUM_WORKER_COUNT).contains(&worker_count),
            "worker count {worker_count} outside 1..={MAXIMUM_WORKER_COUNT}"
        );
        assert!(
            (1..=MAXIMUM_QUEUE_DEPTH_BATCHES).contains(&queue_depth_batches),
            "queue depth {queue_depth_batches} outside 1..={MAXIMUM_QUEUE_DEPTH_BATCHES}"
        );
        let mut pool =
            WorkerPool { queues: Vec::with_capacity(worker_count), threads: Vec::with_capacity(worker_count) };
        for worker_index in 0..worker_count {
            let (sender, receiver) = mpsc::sync_channel::<Job>(queue_depth_batches);
            let target = Arc::clone(&target);
            // On a spawn failure `pool` is dropped here, which stops the workers already started.
            let thread = std::thread::Builder::new()
                .name(format!("{thread_name}-{worker_index}"))
                .spawn(move || worker_loop(target.as_ref(), receiver))?;
            pool.queues.push(sender);
            pool.threads.push(thread);
        }
        Ok(pool)
    }

    /// Enqueues `batch` on the calling thread's queue; blocks while that queue is full.
    pub(crate) fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        assert!(!self.queues.is_empty(), "submit on a stopped worker pool");
        let queue_index = QUEUE_SLOT.with(|slot| *slot) % self.queues.len();
        // One slot is enough: the worker sends exactly one result and must never block on it.
        let (reply, receiver) = mpsc::sync_channel(1);
        match self.queues[queue_index].send(Job { batch, reply }) {
            Ok(()) => IoTicket::pending(receiver),
            // The worker is gone only if it panicked; report it instead of hanging the caller.
            Err(_) => IoTicket::ready(Err(Error::Io {
                operation: "asynchronous submit",
                offset: 0,
                source: std::io::Error::other("device I/O worker has stopped"),
            })),
        }
    }
}

fn worker_loop(target: &dyn Device, receiver: Receiver<Job>) {
    // Ends when every sender is dropped and the queue is drained, i.e. when the pool is dropped.
    while let Ok(job) = receiver.recv() {
        let result = run_batch(target, job.batch);
        // The caller may have dropped its ticket without waiting; the result then has no reader.
        let _ = job.reply.send(result);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        // Closing the queues is what tells the workers to stop once they drained them.
        self.queues.clear();
        for thread in self.threads.drain(..) {
            // A worker that panicked already reported through its dropped reply channels.
            let _ = thread.join();
        }
    }
}
