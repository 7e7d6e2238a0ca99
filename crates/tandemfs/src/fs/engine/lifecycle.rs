//! Format, mount and unmount, volume statistics, durability (fsync, sync) and the open
//! counts that keep unlinked inodes alive.

use super::*;

impl FileSystem {
    // ------------------------------------------------------------------ format and mount

    /// Writes an empty file system on `device` (mkfs).
    pub fn format(device: Arc<dyn Device>, options: &FormatOptions) -> Result<()> {
        let block_count = device.size_bytes() / BLOCK_SIZE_U64;
        let mut superblock = Superblock::layout(block_count, options.inode_count, options.log_bytes)?;
        superblock.uuid = options.uuid.unwrap_or_else(random_bytes::<16>);
        superblock.hash_seed = options.hash_seed.unwrap_or_else(|| {
            let bytes = random_bytes::<16>();
            std::array::from_fn(|index| u32::from_le_bytes(bytes[index * 4..index * 4 + 4].try_into().unwrap()))
        });
        let now = now_ns();
        superblock.format_time_ns = now;
        Log::format(device.as_ref(), &superblock.log_geometry())?;
        // Old contents of the inode table would not parse: zero it. Other regions are either
        // written here (bitmaps) or allocated before use.
        let zeros = vec![0u8; 1 << 20];
        let table_start = superblock.inode_table_start * BLOCK_SIZE_U64;
        let table_end = table_start + superblock.inode_table_blocks * BLOCK_SIZE_U64;
        let mut position = table_start;
        while position < table_end {
            let length = (table_end - position).min(zeros.len() as u64) as usize;
            device.write_at(position, &zeros[..length])?;
            position += length as u64;
        }
        let mut volume = Volume::new_empty(device.clone(), superblock.clone(), 1024);
        volume.blocks.set_range(0, superblock.first_data_block);
        volume.blocks.mark_all_dirty();
        volume.inodes.mark_all_dirty();
        volume.current_lsn = 0;
        let root = dir::create(&mut volume)?;
        let root_inode = Inode {
            inode_number: ROOT_INODE,
            generation: 1,
            mode: FileType::Directory.mode_bits() | 0o755,
            link_count: 2,
            uid: options.root_owner.map_or(0, |(uid, _)| uid),
            gid: options.root_owner.map_or(0, |(_, gid)| gid),
            size_bytes: 0,
            blocks_owned: 0,
            access_time_ns: now,
            modify_time_ns: now,
            change_time_ns: now,
            birth_time_ns: now,
            rdev: 0,
            parent: ROOT_INODE,
            orphan_next: 0,
            xattr_block: 0,
            flags: 0,
            root_area: root.encode(),
        };
        volume.create_inode(&root_inode)?;
        let images = volume.snapshot_images();
        Volume::write_images_home(device.as_ref(), &images)?;
        volume.images_home(&images);
        let mut superblock = volume.superblock.clone();
        superblock.next_generation = 2;
        superblock.free_blocks = volume.blocks.free_count();
        superblock.free_inodes = volume.inodes.free_count();
        device.flush()?;
        // Both copies, so that neither holds an older file system's superblock.
        superblock.sequence = 1;
        superblock.write(device.as_ref())?;
        superblock.sequence = 2;
        superblock.write(device.as_ref())?;
        device.flush()
    }

    /// Opens the volume, replays the log if needed, reclaims orphans.
    pub fn mount(device: Arc<dyn Device>, options: &MountOptions) -> Result<(FileSystem, MountReport)> {
        let log_options = LogOptions {
            flush_delay_us: if options.background_backend { options.flush_delay_us } else { u64::MAX / 4 },
            reserve_fraction: 0.5,
        };
        let cache_blocks = (options.cache_bytes / BLOCK_SIZE_U64).max(64) as usize;
        let (volume, log, applier, report) = backend::open_volume(device.clone(), log_options, cache_blocks, true)?;
        let last_lsn = log.next_lsn() - 1;
        let volume = Mutex::new(volume);
        if report.records_replayed > 0 || report.orphans_reclaimed > 0 {
            backend::checkpoint(&volume, &log, last_lsn, &|| None)?;
        }
        let mut volume = volume.into_inner();
        let superblock = &mut volume.superblock;
        superblock.state = STATE_MOUNTED;
        superblock.mount_count += 1;
        superblock.mount_time_ns = now_ns();
        superblock.sequence += 1;
        superblock.write(device.as_ref())?;
        device.flush()?;

        let inode_count = volume.superblock.inode_count;
        let mut inode_numbers = Bitmap::new(inode_count, BlockKind::InodeBitmap);
        for bit in 0..inode_count {
            if volume.inodes.is_set(bit) {
                inode_numbers.set_range(bit, 1);
            }
        }
        let front = Front {
            views: Default::default(),
            names: Default::default(),
            inode_numbers,
            next_generation: volume.superblock.next_generation,
            reserved_blocks: 0,
            free_blocks: volume.free_blocks(),
            pending_free_blocks: 0,
            queued_image_blocks: 0,
            image_budget_blocks: image_budget_blocks(&log.usage()),
            refused_for_backlog: false,
            use_clock: 0,
        };
        let usage = log.usage();
        // A record must fit the log many times over; a write larger than this is split.
        let max_record_data_bytes = ((usage.data_bytes_normal / 16) as usize).clamp(4096, 1 << 20);
        let inner = Arc::new(Inner {
            device,
            log,
            volume: Mutex::new(volume),
            applier,
            front: Mutex::new(front),
            queue: Mutex::new(VecDeque::new()),
            queue_signal: Condvar::new(),
            applied_lsn: Mutex::new(last_lsn),
            applied_signal: Condvar::new(),
            backend_lock: Mutex::new(BackendState {
                last_checkpoint: Instant::now(),
                applied_since_checkpoint: 0,
                applied_bytes_since_checkpoint: 0,
            }),
            state: std::sync::atomic::AtomicU8::new(STATE_RUNNING),
            failure: Mutex::new(None),
            stop: AtomicBool::new(false),
            options: options.clone(),
            inode_count,
            max_record_data_bytes,
            checkpoints: AtomicU64::new(0),
            thread: Mutex::new(None),
        });
        let file_system = FileSystem { inner };
        if options.background_backend {
            let worker = file_system.clone();
            let handle = std::thread::Builder::new()
                .name("tandem-backend".into())
                .spawn(move || worker.backend_thread())
                .map_err(|error| Error::Io { operation: "start back-end thread", offset: 0, source: error })?;
            *file_system.inner.thread.lock() = Some(handle);
        }
        Ok((file_system, report))
    }

    /// Applies and checkpoints everything, marks the volume clean. Later calls fail with `Shutdown`.
    pub fn unmount(&self) -> Result<()> {
        let inner = &self.inner;
        if inner.state.load(Ordering::Acquire) == STATE_UNMOUNTED {
            return Ok(());
        }
        let result = (|| {
            self.check_running()?;
            inner.log.flush()?;
            self.drain_and_checkpoint()?;
            Ok(())
        })();
        inner.stop.store(true, Ordering::Release);
        inner.queue_signal.notify_all();
        if let Some(handle) = inner.thread.lock().take() {
            let _ = handle.join();
        }
        result?;
        let _backend = inner.backend_lock.lock();
        let mut volume = inner.volume.lock();
        let superblock = &mut volume.superblock;
        superblock.state = STATE_CLEAN;
        superblock.sequence += 1;
        superblock.write(inner.device.as_ref())?;
        inner.device.flush()?;
        inner.log.shutdown()?;
        inner.state.store(STATE_UNMOUNTED, Ordering::Release);
        Ok(())
    }

    pub(super) fn check_running(&self) -> Result<()> {
        match self.inner.state.load(Ordering::Acquire) {
            STATE_RUNNING => Ok(()),
            _ => Err(Error::Shutdown),
        }
    }

    pub(super) fn fail(&self, error: &Error) {
        let mut failure = self.inner.failure.lock();
        if failure.is_none() {
            *failure = Some(error.to_string());
        }
        self.inner.state.store(STATE_FAILED, Ordering::Release);
        self.inner.applied_signal.notify_all();
    }

    /// Why the volume stopped accepting changes, if it did.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.lock().clone()
    }

    // ------------------------------------------------------------------ volume

    pub fn statistics(&self) -> Result<VolumeStatistics> {
        let front = self.inner.front.lock();
        let volume = self.inner.volume.lock();
        Ok(VolumeStatistics {
            block_size_bytes: BLOCK_SIZE_U64 as u32,
            blocks_total: volume.superblock.block_count,
            // Freed blocks wait for a checkpoint before reuse, but they are free: `df` after `rm`
            // should say so at once.
            blocks_free: (front.free_blocks + front.pending_free_blocks).saturating_sub(front.reserved_blocks),
            inodes_total: self.inner.inode_count,
            inodes_free: front.inode_numbers.free_count(),
            name_max_bytes: NAME_MAX_BYTES as u32,
        })
    }

    pub fn log_statistics(&self) -> LogStatistics {
        let usage = self.inner.log.usage();
        let checkpoint_lsn = self.inner.volume.lock().superblock.checkpoint_lsn;
        LogStatistics {
            header_slots: usage.header_slots_capacity,
            data_bytes: usage.data_bytes_capacity,
            records_since_checkpoint: usage.header_slots_used,
            data_bytes_since_checkpoint: usage.data_bytes_used,
            next_lsn: self.inner.log.next_lsn(),
            durable_lsn: self.inner.log.durable_lsn(),
            applied_lsn: self.applied(),
            checkpoint_lsn,
            checkpoints: self.inner.checkpoints.load(Ordering::Relaxed),
        }
    }

    // ------------------------------------------------------------------ durability and lifetime

    /// Returns once every change to `inode` made before the call is durable.
    pub fn fsync(&self, inode: InodeNumber, _data_only: bool) -> Result<()> {
        self.check_running()?;
        let lsn = {
            let mut front = self.inner.front.lock();
            self.view(&mut front, inode)?.last_change_lsn
        };
        if lsn > 0 {
            self.inner.log.wait_durable(lsn)?;
        }
        Ok(())
    }

    /// Returns once every change made before the call is durable.
    pub fn sync(&self) -> Result<()> {
        self.check_running()?;
        self.inner.log.flush()?;
        Ok(())
    }

    /// Keeps an inode alive while open even if its last name is unlinked.
    pub fn open_inode(&self, inode: InodeNumber) -> Result<()> {
        let mut front = self.inner.front.lock();
        let view = self.view(&mut front, inode)?;
        view.open_count = view.open_count.checked_add(1).ok_or(Error::Busy)?;
        Ok(())
    }

    /// Ends one `open_inode`; an unlinked inode is reclaimed after its last release.
    pub fn release_inode(&self, inode: InodeNumber) -> Result<()> {
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            let view = self.view(&mut front, inode)?;
            if view.open_count == 0 {
                return Err(Error::invalid(format!("inode {inode} released more often than opened")));
            }
            if view.open_count > 1 || !view.orphaned {
                view.open_count -= 1;
                return Ok(Some(()));
            }
            let Some(lsn) = self.append(&mut front, Op::Reclaim { inode_number: inode }, 0)? else {
                return Ok(None);
            };
            let view = front.views.get_mut(&inode).unwrap();
            view.open_count = 0;
            view.orphaned = false;
            view.last_change_lsn = lsn;
            FileSystem::settle(&mut front, inode, Disposition::Reclaim);
            Ok(Some(()))
        })
    }
}
