//! The back-end driver: its thread, batches, drains, `wait_applied` and the checkpoint policy.

use super::*;

impl FileSystem {
    // ------------------------------------------------------------------ back end driver

    pub(super) fn backend_thread(&self) {
        let inner = &self.inner;
        while !inner.stop.load(Ordering::Acquire) {
            match self.backend_pass() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(_) => return,
            }
            let durable = inner.log.durable_lsn();
            let waiting = inner.queue.lock().front().map(|queued| queued.lsn);
            match waiting {
                // Records are waiting to become durable: the log's flusher makes them so.
                Some(lsn) if lsn > durable => {
                    if inner.log.wait_for_durable_above(durable, Duration::from_millis(5)).is_err() {
                        return;
                    }
                }
                Some(_) => {}
                None => {
                    let mut queue = inner.queue.lock();
                    if queue.is_empty() && !inner.stop.load(Ordering::Acquire) {
                        inner.queue_signal.wait_for(&mut queue, Duration::from_millis(200));
                    }
                }
            }
        }
    }

    /// Applies durable queued records; returns whether it applied any. Also checkpoints when
    /// the log or the dirty set has grown, or time has passed.
    pub(super) fn backend_pass(&self) -> Result<bool> {
        let inner = &self.inner;
        let mut backend = inner.backend_lock.lock();
        if inner.state.load(Ordering::Acquire) == STATE_FAILED {
            return Err(Error::Shutdown);
        }
        let durable = inner.log.durable_lsn();
        let mut batch: Vec<Queued> = {
            let mut queue = inner.queue.lock();
            let mut batch = Vec::new();
            while batch.len() < BATCH_RECORDS_MAX && queue.front().is_some_and(|queued| queued.lsn <= durable) {
                batch.push(queue.pop_front().unwrap());
            }
            batch
        };
        if batch.is_empty() {
            self.maybe_checkpoint(&mut backend, false)?;
            return Ok(false);
        }
        let mut owned: Vec<(u64, u64)> = Vec::new();
        let free_blocks;
        let pending_free_blocks;
        let mut applied_count = 0;
        {
            let mut volume = inner.volume.lock();
            for queued in &batch {
                // Blocks the back end frees (leaves that compaction empties, for one) are
                // reusable only after a checkpoint records the free. When free blocks run low
                // while some are pending, stop the batch and checkpoint first, rather than fail
                // an allocation that the next checkpoint would have satisfied. At least one
                // record is applied per pass, so the back end always makes progress.
                if applied_count > 0
                    && volume.free_blocks() < BACKEND_LOW_WATER_BLOCKS
                    && volume.blocks.pending_free_count() > 0
                {
                    break;
                }
                match inner.applier.apply(&mut volume, queued.lsn, &queued.op) {
                    // Later records come later in the list, so the last count of an inode wins.
                    Ok(written) => owned.extend(written),
                    Err(error) => {
                        drop(volume);
                        self.fail(&error);
                        return Err(error);
                    }
                }
                applied_count += 1;
            }
            free_blocks = volume.free_blocks();
            pending_free_blocks = volume.blocks.pending_free_count();
        }
        let space_low = applied_count < batch.len();
        if space_low {
            // Back to the head of the queue, in lsn order: they precede everything queued since.
            let leftover = batch.split_off(applied_count);
            let mut queue = inner.queue.lock();
            for queued in leftover.into_iter().rev() {
                queue.push_front(queued);
            }
        }
        let last = batch.last().expect("at least one record is applied per pass").lsn;
        {
            let mut front = inner.front.lock();
            for queued in &batch {
                // Names need nothing: an entry of the name table whose record is applied is a
                // lookup-cache entry from now on (its lsn is at most the applied lsn).
                front.reserved_blocks -= queued.reserved_blocks;
                front.queued_image_blocks -= queued.image_blocks;
                // Every pending write has its own record, and applying it makes that write and
                // all earlier ones of the inode part of the home data. Other records need no
                // visit: structural ones drop earlier writes when they are made.
                if let Op::Write { inode, .. } = queued.op.as_ref() {
                    if let Some(view) = front.views.get_mut(&inode.inode_number) {
                        view.forget_writes_through(queued.lsn);
                    }
                }
            }
            for (number, blocks) in owned {
                if let Some(view) = front.views.get_mut(&number) {
                    view.blocks_owned = blocks;
                }
            }
            front.free_blocks = free_blocks;
            front.pending_free_blocks = pending_free_blocks;
            front.trim_views(last);
        }
        *inner.applied_lsn.lock() = last;
        inner.applied_signal.notify_all();
        backend.applied_since_checkpoint += batch.len() as u64;
        backend.applied_bytes_since_checkpoint +=
            batch.iter().map(|queued| (RECORD_OVERHEAD_BYTES + queued.op.tail().len()) as u64).sum::<u64>();
        self.maybe_checkpoint(&mut backend, space_low)?;
        Ok(true)
    }

    pub(super) fn maybe_checkpoint(&self, backend: &mut BackendState, force: bool) -> Result<()> {
        let inner = &self.inner;
        if backend.applied_since_checkpoint == 0 && !force {
            return Ok(());
        }
        let usage = inner.log.usage();
        let (dirty_bytes, free_blocks, pending_free_blocks) = {
            let volume = inner.volume.lock();
            (
                volume.cache_dirty_count() as u64 * BLOCK_SIZE_U64,
                volume.free_blocks(),
                volume.blocks.pending_free_count(),
            )
        };
        // A checkpoint frees the log only up to the last applied record, so it is due when what
        // was applied since the last one fills a good part of the log's normal share, not when
        // the log is full of records still waiting to be applied (checkpointing then would only
        // add images). Its images go to the reserve: take one while they fit in half of it.
        let reserve_bytes = usage.data_bytes_capacity - usage.data_bytes_normal;
        let due = force
            || backend.applied_bytes_since_checkpoint * 4 > usage.data_bytes_normal
            || backend.applied_since_checkpoint * 4 > usage.header_slots_normal
            || dirty_bytes * 2 > reserve_bytes
            // Freed blocks wait for a checkpoint before reuse: take one before they are a
            // large share of what the volume could hand out.
            || pending_free_blocks * 2 > free_blocks
            || backend.last_checkpoint.elapsed() > CHECKPOINT_INTERVAL;
        if !due {
            return Ok(());
        }
        let applied = *inner.applied_lsn.lock();
        // Appends and queueing happen together under the front-end lock: holding it gives a
        // consistent answer to "which appended record is the first not yet applied".
        let first_unapplied = || {
            let _front = inner.front.lock();
            inner.queue.lock().front().map(|queued| queued.lsn)
        };
        if let Err(error) = backend::checkpoint(&inner.volume, &inner.log, applied, &first_unapplied) {
            self.fail(&error);
            return Err(error);
        }
        let (free_blocks, pending_free_blocks) = {
            let volume = inner.volume.lock();
            (volume.free_blocks(), volume.blocks.pending_free_count())
        };
        let mut front = inner.front.lock();
        front.free_blocks = free_blocks;
        front.pending_free_blocks = pending_free_blocks;
        drop(front);
        backend.last_checkpoint = Instant::now();
        backend.applied_since_checkpoint = 0;
        backend.applied_bytes_since_checkpoint = 0;
        inner.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes every appended record durable, applies all of them and checkpoints: frees log
    /// space, returns reserved blocks and makes freed blocks reusable.
    pub(super) fn drain_and_checkpoint(&self) -> Result<()> {
        self.drain()?;
        let mut backend = self.inner.backend_lock.lock();
        self.maybe_checkpoint(&mut backend, true)
    }

    /// Makes every appended record durable and applies all of them; checkpoints only where the
    /// back end's own rules call for one.
    pub(super) fn drain(&self) -> Result<()> {
        // Checkpoint records never enter the queue: an empty queue after a flush means every
        // logical record is applied.
        let mut rounds = 0usize;
        loop {
            self.inner.log.flush()?;
            if self.inner.queue.lock().is_empty() {
                break;
            }
            rounds += 1;
            assert!(rounds < 1 << 20, "back end makes no progress");
            self.backend_pass()?;
        }
        Ok(())
    }

    /// Waits until the record `lsn` has been applied.
    pub(super) fn wait_applied(&self, lsn: u64) -> Result<()> {
        let inner = &self.inner;
        if *inner.applied_lsn.lock() >= lsn {
            return Ok(());
        }
        inner.log.flush()?;
        if !inner.options.background_backend {
            while *inner.applied_lsn.lock() < lsn {
                if !self.backend_pass()? {
                    inner.log.flush()?;
                }
            }
            return Ok(());
        }
        inner.queue_signal.notify_all();
        let mut applied = inner.applied_lsn.lock();
        while *applied < lsn {
            if inner.state.load(Ordering::Acquire) == STATE_FAILED {
                return Err(Error::Shutdown);
            }
            inner.applied_signal.wait_for(&mut applied, Duration::from_millis(50));
        }
        Ok(())
    }

    /// Runs the back end once in the caller's thread (tests without a back-end thread).
    pub fn run_backend(&self) -> Result<()> {
        self.inner.log.flush()?;
        while self.backend_pass()? {}
        Ok(())
    }

    /// Forces a checkpoint now (tests, `sync`-heavy tools).
    pub fn checkpoint(&self) -> Result<()> {
        self.check_running()?;
        if self.is_read_only() {
            // Nothing was changed, and a read-only mount writes nothing.
            return Ok(());
        }
        self.drain_and_checkpoint()
    }
}
