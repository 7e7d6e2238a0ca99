//! Format, mount and unmount, volume statistics, durability (fsync, sync) and the open
//! counts that keep unlinked inodes alive.

use super::*;
use crate::block::mmp::{self, MmpLocation};

/// What `mount` settled before opening the volume.
struct MountSetup {
    medium: Arc<dyn Device>,
    gate: Arc<Gate>,
    read_only: bool,
    interval_ms: u32,
    medium_sequence: u64,
}

impl FileSystem {
    // ------------------------------------------------------------------ format and mount

    /// Writes an empty file system on `device` (mkfs).
    pub fn format(device: Arc<dyn Device>, options: &FormatOptions) -> Result<()> {
        let block_count = device.size_bytes() / BLOCK_SIZE_U64;
        let key_slot_blocks = if options.encryption.is_some() { crate::crypt::KEY_SLOT_COUNT as u64 } else { 0 };
        let mut superblock =
            Superblock::layout_with_key_slots(block_count, options.inode_count, options.log_bytes, key_slot_blocks)?;
        superblock.uuid = options.uuid.unwrap_or_else(random_bytes::<16>);
        superblock.hash_seed = options.hash_seed.unwrap_or_else(|| {
            let bytes = random_bytes::<16>();
            std::array::from_fn(|index| u32::from_le_bytes(bytes[index * 4..index * 4 + 4].try_into().unwrap()))
        });
        let now = now_ns();
        superblock.format_time_ns = now;
        // An encrypted volume: the key slots first (plaintext), then everything else through
        // the cipher. The superblocks, written last, pass through it as they are.
        let device: Arc<dyn Device> = match &options.encryption {
            Some(encryption) => {
                let master = crate::crypt::format_key_slots(device.as_ref(), &superblock, encryption)?;
                Arc::new(crate::crypt::EncryptedDevice::new(device, &superblock, &master))
            }
            None => device,
        };
        Log::format(device.as_ref(), &superblock.log_geometry())?;
        if let Some(images) = superblock.image_log_geometry() {
            Log::format(device.as_ref(), &images)?;
        }
        // The inode table is not zeroed: its initialized mark starts at 0, so old contents are
        // never read. Other regions are written here (bitmaps) or allocated before use.
        let mut volume = Volume::new_empty(device.clone(), superblock.clone(), 1024);
        volume.blocks.set_range(0, superblock.first_data_block);
        volume.blocks.mark_all_dirty();
        volume.inodes.mark_all_dirty();
        volume.current_lsn = 0;
        let root = dir::create(&mut volume)?;
        let mut root_inode = Inode::empty_directory(ROOT_INODE, 1, 0o755, ROOT_INODE, now);
        root_inode.uid = options.root_owner.map_or(0, |(uid, _)| uid);
        root_inode.gid = options.root_owner.map_or(0, |(_, gid)| gid);
        root_inode.root_area = root.encode();
        volume.create_inode(&root_inode)?;
        let images = volume.snapshot_images()?;
        let mut superblock = volume.superblock.clone();
        Volume::write_images_home(device.as_ref(), &mut superblock, &images)?;
        volume.images_home(&images);
        superblock.next_generation = 2;
        superblock.free_blocks = volume.blocks.free_count();
        superblock.free_inodes = volume.inodes.free_count();
        // The MMP block: clean, so that the first mount goes through without waiting.
        mmp::write_clean(&MmpLocation::of(device.clone(), &superblock), superblock.mmp_interval_ms)?;
        device.flush()?;
        // Both copies, so that neither holds an older file system's superblock.
        superblock.sequence = 1;
        superblock.write(device.as_ref())?;
        superblock.sequence = 2;
        superblock.write(device.as_ref())?;
        device.flush()
    }

    /// Opens the volume, replays the log if needed, reclaims orphans. A read-write mount first
    /// takes the multi-mount protection block (`block::mmp`): it waits out a mount that ended
    /// without unmounting, and refuses, naming host and pid, a mount that is alive. A read-only
    /// mount (asked for, or forced by a medium that refuses writes) writes nothing to the
    /// device: a log to replay is replayed in memory.
    pub fn mount(device: Arc<dyn Device>, options: &MountOptions) -> Result<(FileSystem, MountReport)> {
        if options.backend_workers > crate::backend::parallel::WORKERS_MAX {
            return Err(Error::invalid(format!(
                "{} back-end workers asked for; at most {} are supported",
                options.backend_workers,
                crate::backend::parallel::WORKERS_MAX
            )));
        }
        let interval = crate::fs::types::CHECKPOINT_INTERVAL_MS_MIN..=crate::fs::types::CHECKPOINT_INTERVAL_MS_MAX;
        if !interval.contains(&options.checkpoint_interval_ms) {
            return Err(Error::invalid(format!(
                "checkpoint interval {} ms is outside {}..={} ms",
                options.checkpoint_interval_ms,
                interval.start(),
                interval.end()
            )));
        }
        let factor = options.background_compact_factor;
        if !(factor == 0.0 || (factor >= 1.0 && factor.is_finite())) {
            return Err(Error::invalid(format!(
                "background compaction factor {factor} is neither 0 (off) nor a number of at least 1"
            )));
        }
        if !(1..=crate::fs::types::BACKLOG_IMAGE_LOGS_MAX).contains(&options.backlog_image_logs) {
            return Err(Error::invalid(format!(
                "a backlog of {} image logs is outside 1..={}",
                options.backlog_image_logs,
                crate::fs::types::BACKLOG_IMAGE_LOGS_MAX
            )));
        }
        let forced_read_only = (!options.read_only && device.is_read_only()).then(|| {
            "the medium refuses writes (no write permission, an immutable file or a read-only device)".to_string()
        });
        let read_only = options.read_only || forced_read_only.is_some();
        // Before anything is written: a wrong key or none fails here, having only read.
        let device = crate::crypt::unlock(device, options.key.as_ref())?;
        let on_medium = Superblock::read_best(device.as_ref())?;
        let interval_ms = options.mmp_interval_ms.unwrap_or(on_medium.mmp_interval_ms);
        if !(mmp::MIN_INTERVAL_MS..=mmp::MAX_INTERVAL_MS).contains(&interval_ms) {
            return Err(Error::invalid(format!(
                "MMP interval {interval_ms} ms is outside {}..={} ms",
                mmp::MIN_INTERVAL_MS,
                mmp::MAX_INTERVAL_MS
            )));
        }
        let location = MmpLocation::of(device.clone(), &on_medium);
        let gate = Arc::new(if read_only { Gate::in_memory(device.clone()) } else { Gate::new(device.clone(), true) });
        let latch = Arc::new(std::sync::OnceLock::new());
        let mut taken_over_from = None;
        let keeper = if read_only {
            // Reading a volume that another mount is changing would give torn answers.
            mmp::refuse_if_live(&location, interval_ms)?;
            None
        } else {
            let claimed = mmp::claim(&location, interval_ms)?;
            taken_over_from = claimed.taken_over_from;
            // Refreshing starts before the replay: a long replay must not look like a dead mount.
            Some(FileSystem::start_keeper(location, claimed.record, &gate, &latch)?)
        };
        let setup = MountSetup { medium: device, gate, read_only, interval_ms, medium_sequence: on_medium.sequence };
        match FileSystem::open(setup, options, keeper) {
            Ok((file_system, mut report)) => {
                let _ = latch.set(Arc::downgrade(&file_system.inner));
                report.read_only = read_only;
                report.replayed_in_memory = read_only
                    && (report.records_replayed > 0 || report.checkpoint_completed || report.orphans_reclaimed > 0);
                report.forced_read_only = forced_read_only;
                report.mmp_taken_over_from = taken_over_from;
                Ok((file_system, report))
            }
            Err((error, keeper)) => {
                if let Some(keeper) = keeper {
                    // Nothing more will be written by this attempt: let the next one in at once.
                    let _ = keeper.stop_clean();
                }
                Err(error)
            }
        }
    }

    /// Starts the MMP refresh thread. When it finds the volume taken, it fences the gate (no
    /// write of this mount reaches the device from then on) and fails the volume.
    fn start_keeper(
        location: MmpLocation,
        claimed: mmp::MmpRecord,
        gate: &Arc<Gate>,
        latch: &Arc<std::sync::OnceLock<std::sync::Weak<Inner>>>,
    ) -> Result<MmpKeeper> {
        let gate = gate.clone();
        let latch = latch.clone();
        MmpKeeper::start(
            location,
            claimed,
            Box::new(move |error: Error| {
                gate.fence(error.to_string());
                if let Some(inner) = latch.get().and_then(std::sync::Weak::upgrade) {
                    inner.backend.fail(&error);
                }
            }),
        )
    }

    /// The rest of `mount`, once the MMP block is taken (or checked). On failure it hands the
    /// keeper back so that `mount` can release the block.
    fn open(
        setup: MountSetup,
        options: &MountOptions,
        keeper: Option<MmpKeeper>,
    ) -> std::result::Result<(FileSystem, MountReport), (Error, Option<MmpKeeper>)> {
        let log_options = LogOptions {
            flush_delay_us: if options.background_backend { options.flush_delay_us } else { u64::MAX / 4 },
            // The reserve takes one checkpoint's images (the back end keeps them under it); the
            // normal share, records and the images they pledge (see `log::pledge`). A quarter
            // made checkpoints 2.7 times as frequent and 16-thread creates slower; half keeps
            // them as they were.
            reserve_fraction: 0.5,
        };
        let cache_blocks = (options.cache_bytes / BLOCK_SIZE_U64).max(64) as usize;
        let device: Arc<dyn Device> = setup.gate.clone();
        let opened = (|| {
            let (volume, log, applier, report) = backend::open_volume(device.clone(), log_options, cache_blocks, true)?;
            volume.check_bitmaps_trusted()?;
            if log.image_log().is_some() {
                log.set_backlog_image_logs(options.backlog_image_logs);
            }
            let last_lsn = log.next_lsn() - 1;
            let volume = Mutex::new(volume);
            if report.records_replayed > 0 || report.orphans_reclaimed > 0 {
                // Read-only: into the gate's memory, like the replay itself.
                backend::checkpoint(&volume, &log, last_lsn)?;
            }
            let mut volume = volume.into_inner();
            // What the replay changed is whole: readers of the home mirror may trust it.
            volume.end_change();
            if setup.read_only {
                // From here on nothing may change, not even in memory.
                setup.gate.set_writable(false)?;
            } else {
                let superblock = &mut volume.superblock;
                superblock.state = STATE_MOUNTED;
                superblock.mount_count += 1;
                superblock.mount_time_ns = now_ns();
                superblock.sequence += 1;
                superblock.write(device.as_ref())?;
                device.flush()?;
            }
            Ok((volume, log, applier, report, last_lsn))
        })();
        let (volume, log, applier, report, last_lsn) = match opened {
            Ok(parts) => parts,
            Err(error) => return Err((error, keeper)),
        };

        let inode_count = volume.superblock.inode_count;
        let inode_numbers = InodeGroups::new(inode_count, |number| volume.inodes.is_set(number - 1));
        let space = Space::new(volume.free_blocks(), tree_pool_blocks(volume.superblock.block_count));
        let front = Front::new(inode_numbers, volume.superblock.next_generation, space);
        let usage = log.usage();
        // A record must fit the log many times over; a write larger than this is split.
        let max_record_data_bytes = ((usage.data_bytes_normal / 16) as usize).clamp(4096, 1 << 20);
        let workers = match options.backend_workers {
            0 => crate::backend::parallel::default_workers(),
            count => count,
        };
        let backend = match Backend::new(volume, log.clone(), applier, last_lsn, options.background_backend, workers) {
            Ok(backend) => backend,
            Err(error) => return Err((error, keeper)),
        };
        backend.set_checkpoint_interval(std::time::Duration::from_millis(options.checkpoint_interval_ms));
        let inner = Arc::new(Inner {
            device,
            gate: setup.gate,
            medium: setup.medium,
            read_only: AtomicBool::new(setup.read_only),
            mmp: Mutex::new(keeper),
            mmp_interval_ms: setup.interval_ms,
            medium_sequence: AtomicU64::new(setup.medium_sequence),
            log,
            backend,
            front,
            options: options.clone(),
            inode_count,
            max_record_data_bytes,
            direct_write_records: AtomicU64::new(0),
            batch: Default::default(),
            compactor: super::compactor::Compactor::new(options.background_compact_factor),
            // A summary takes at most about a leaf's bytes: a quarter of the block cache's
            // bound in summaries keeps them below a quarter of its memory.
            regions: dir::RegionCache::new(region_summaries_max(options.cache_bytes)),
        });
        let file_system = FileSystem { inner };
        if options.background_backend {
            if let Err(error) = file_system.inner.backend.start(Arc::new(file_system.clone())) {
                let keeper = file_system.inner.mmp.lock().take();
                return Err((error, keeper));
            }
            // Its passes do nothing while the mount is read-only (`compaction_pass`).
            if let Err(error) = file_system.inner.compactor.start(Arc::downgrade(&file_system.inner)) {
                file_system.inner.backend.stop();
                let keeper = file_system.inner.mmp.lock().take();
                return Err((error, keeper));
            }
        }
        Ok((file_system, report))
    }

    /// Whether the mount refuses changes (mounted or remounted read-only).
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only.load(Ordering::Acquire)
    }

    /// Switches a mounted volume between read-write and read-only (`mount -o remount,ro|rw`).
    /// Read-only makes every change durable, checkpoints, marks the volume clean and lets go of
    /// the MMP block; read-write needs a medium that takes writes, takes the MMP block again
    /// (waiting as a mount does) and writes home what a read-only mount replayed in memory,
    /// after checking that nobody changed the volume in between.
    pub fn set_read_only(&self, read_only: bool) -> Result<()> {
        self.check_running()?;
        let mut keeper = self.inner.mmp.lock();
        if read_only == self.is_read_only() {
            return Ok(());
        }
        if read_only {
            self.remount_read_only(&mut keeper)
        } else {
            self.remount_read_write(&mut keeper)
        }
    }

    fn remount_read_only(&self, keeper: &mut Option<MmpKeeper>) -> Result<()> {
        let inner = &self.inner;
        // Every change checks the flag with a view shard locked: once each shard has been taken
        // after the store, every change that missed the flag has appended its record, and the
        // drain below applies it.
        inner.read_only.store(true, Ordering::SeqCst);
        inner.front.wait_for_changes_in_flight();
        let flushed = (|| {
            inner.log.flush()?;
            self.drain_and_checkpoint()?;
            inner.backend.with_volume_quiet(|volume| {
                let superblock = &mut volume.superblock;
                superblock.state = STATE_CLEAN;
                superblock.sequence += 1;
                superblock.write(inner.device.as_ref())?;
                inner.device.flush()?;
                inner.medium_sequence.store(superblock.sequence, Ordering::Release);
                Ok(())
            })
        })();
        if let Err(error) = flushed {
            inner.read_only.store(false, Ordering::SeqCst);
            return Err(error);
        }
        inner.gate.set_writable(false)?;
        match keeper.take() {
            Some(keeper) => keeper.stop_clean(),
            None => Ok(()),
        }
    }

    fn remount_read_write(&self, keeper: &mut Option<MmpKeeper>) -> Result<()> {
        let inner = &self.inner;
        if inner.medium.is_read_only() {
            return Err(Error::invalid(
                "the medium was opened read-only (no write permission, an immutable file or a read-only device); it cannot be remounted read-write",
            ));
        }
        let unchanged = || -> Result<()> {
            let on_medium = Superblock::read_best(inner.medium.as_ref())?;
            if on_medium.sequence != inner.medium_sequence.load(Ordering::Acquire) {
                return Err(Error::InUse(
                    "the volume was changed by another mount since this one became read-only; unmount and mount it again"
                        .into(),
                ));
            }
            Ok(())
        };
        unchanged()?;
        let superblock = inner.backend.volume_for_statistics().superblock.clone();
        let location = MmpLocation::of(inner.medium.clone(), &superblock);
        let claimed = mmp::claim(&location, inner.mmp_interval_ms)?;
        let latch = Arc::new(std::sync::OnceLock::new());
        let _ = latch.set(Arc::downgrade(inner));
        let new_keeper = FileSystem::start_keeper(location, claimed.record, &inner.gate, &latch)?;
        let opened = (|| {
            // Checked again now that the block is ours: a mount that came and went while we
            // waited changed the superblock.
            unchanged()?;
            inner.gate.set_writable(true)?;
            inner.gate.write_memory_home()?;
            inner.backend.with_volume_quiet(|volume| {
                let superblock = &mut volume.superblock;
                superblock.state = STATE_MOUNTED;
                superblock.mount_time_ns = now_ns();
                superblock.sequence += 1;
                superblock.write(inner.device.as_ref())?;
                inner.device.flush()
            })
        })();
        if let Err(error) = opened {
            let _ = inner.gate.set_writable(false);
            let _ = new_keeper.stop_clean();
            return Err(error);
        }
        *keeper = Some(new_keeper);
        inner.read_only.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Applies and checkpoints everything, marks the volume clean and lets go of the MMP block.
    /// A read-only mount just stops. Later calls fail with `Shutdown`. A failed volume is left
    /// as the failure found it (the next mount replays), but unmount still stops the back end,
    /// releases the MMP block and returns the failure.
    pub fn unmount(&self) -> Result<()> {
        let inner = &self.inner;
        let backend = &inner.backend;
        if backend.is_stopped() {
            return Ok(());
        }
        let read_only = self.is_read_only();
        // No compaction record after the drain below.
        inner.compactor.stop();
        // An index serves a mounted volume only, and one that holds a handle of this volume
        // would otherwise keep it alive after the unmount.
        self.set_batch_index(None);
        let result = (|| {
            self.check_running()?;
            if !read_only {
                inner.log.flush()?;
                self.drain_and_checkpoint()?;
            }
            Ok(())
        })();
        backend.stop();
        let closed = match result {
            Err(error) => {
                let _ = inner.log.shutdown();
                Err(match backend.failure() {
                    Some(reason) => Error::invalid(format!("volume failed earlier: {reason}")),
                    None => error,
                })
            }
            Ok(()) => (|| {
                if !read_only {
                    backend.with_volume_quiet(|volume| {
                        let superblock = &mut volume.superblock;
                        superblock.state = STATE_CLEAN;
                        superblock.sequence += 1;
                        superblock.write(inner.device.as_ref())?;
                        inner.device.flush()
                    })?;
                }
                inner.log.shutdown()
            })(),
        };
        // Whatever happened, this mount writes nothing more: close the gate, then let the next
        // mount in at once (unless another mount took the block, which `stop_clean` checks).
        let _ = inner.gate.set_writable(false);
        let released = match inner.mmp.lock().take() {
            Some(keeper) => keeper.stop_clean(),
            None => Ok(()),
        };
        closed?;
        released?;
        backend.mark_stopped();
        Ok(())
    }

    // ------------------------------------------------------------------ volume

    /// What the front end's caches hold now (views, names and the bytes of their tables).
    pub fn cache_statistics(&self) -> CacheStatistics {
        self.inner.front.cache_statistics()
    }

    /// Drops what the front end's caches hold that it may drop now (the entries and views of
    /// applied records), so that the next lookups and stats read the home structures, as they
    /// do once a tree outgrows the caches. For tests and measurements; nothing is lost.
    pub fn drop_idle_caches(&self) {
        self.inner.front.drop_idle_caches(self.applied());
    }

    /// The blocks lookups read from the volume's mirror without the volume lock, and those it
    /// had to read under the lock (`block::mirror`): (hits, misses) since mount.
    pub fn home_read_counts(&self) -> (u64, u64) {
        let mirror = self.inner.backend.home_mirror();
        (mirror.hits.load(Ordering::Relaxed), mirror.misses.load(Ordering::Relaxed))
    }

    /// How lookups and stats read home since mount: blocks from the mirror and under the lock,
    /// reads done again and reads that fell back to the lock (`block::mirror`).
    pub fn home_read_statistics(&self) -> HomeReadStatistics {
        let mirror = self.inner.backend.home_mirror();
        HomeReadStatistics {
            mirrored_blocks: mirror.hits.load(Ordering::Relaxed),
            locked_blocks: mirror.misses.load(Ordering::Relaxed),
            retries: mirror.retries.load(Ordering::Relaxed),
            fallbacks: mirror.fallbacks.load(Ordering::Relaxed),
            summarised_lookups: self.inner.regions.summarised.load(Ordering::Relaxed),
        }
    }

    /// How the back end has applied records since mount (see `BackendStatistics`).
    pub fn backend_statistics(&self) -> BackendStatistics {
        self.inner.backend.statistics()
    }

    /// What the data checksums have cost since mount: bytes, batches and time (the data path
    /// always checksums; this is how a benchmark sees the share).
    pub fn data_checksum_statistics(&self) -> crate::block::volume::DataChecksumStatistics {
        self.inner.backend.volume_for_statistics().checksum_statistics()
    }

    pub fn statistics(&self) -> Result<VolumeStatistics> {
        let front = &self.inner.front;
        let blocks_total = self.inner.backend.volume_for_statistics().superblock.block_count;
        Ok(VolumeStatistics {
            block_size_bytes: BLOCK_SIZE_U64 as u32,
            blocks_total,
            blocks_free: front.space.statfs_free_blocks(),
            inodes_total: self.inner.inode_count,
            inodes_free: front.inode_numbers.free_count(),
            name_max_bytes: NAME_MAX_BYTES as u32,
        })
    }

    pub fn log_statistics(&self) -> LogStatistics {
        let usage = self.inner.log.usage();
        let checkpoint_lsn = self.inner.backend.volume_for_statistics().superblock.checkpoint_lsn;
        LogStatistics {
            header_slots: usage.header_slots_capacity,
            data_bytes: usage.data_bytes_capacity,
            records_since_checkpoint: usage.header_slots_used,
            data_bytes_since_checkpoint: usage.data_bytes_used,
            next_lsn: self.inner.log.next_lsn(),
            durable_lsn: self.inner.log.durable_lsn(),
            applied_lsn: self.applied(),
            checkpoint_lsn,
            checkpoints: self.inner.backend.checkpoints(),
        }
    }

    // ------------------------------------------------------------------ durability and lifetime

    /// Returns once every change to `inode` made before the call is durable.
    pub fn fsync(&self, inode: InodeNumber, _data_only: bool) -> Result<()> {
        self.check_running()?;
        let lsn = self.with_view(inode, |view| view.last_change_lsn)?;
        if lsn > 0 {
            self.inner.log.wait_durable(lsn)?;
        }
        Ok(())
    }

    /// Returns once every change made before the call is durable.
    pub fn sync(&self) -> Result<()> {
        self.check_running()?;
        if self.is_read_only() {
            return Ok(());
        }
        self.inner.log.flush()?;
        Ok(())
    }

    /// Keeps an inode alive while open even if its last name is unlinked.
    pub fn open_inode(&self, inode: InodeNumber) -> Result<()> {
        let mut shard = self.lock_view(inode)?;
        let view = shard.views.get_mut(&inode).expect("loaded by lock_view");
        view.open_count = view.open_count.checked_add(1).ok_or(Error::Busy)?;
        Ok(())
    }

    /// Ends one `open_inode`; an unlinked inode is reclaimed after its last release.
    pub fn release_inode(&self, inode: InodeNumber) -> Result<()> {
        self.with_space(|| {
            let mut shard = self.lock_view(inode)?;
            let view = shard.views.get_mut(&inode).expect("loaded by lock_view");
            if view.open_count == 0 {
                return Err(Error::invalid(format!("inode {inode} released more often than opened")));
            }
            if view.open_count > 1 || !view.orphaned {
                view.open_count -= 1;
                return Ok(Some(()));
            }
            let freed_blocks = view.blocks_with_pending();
            let Some(lsn) = self.append_reserving(Op::Reclaim { inode_number: inode }, 0, 0, freed_blocks)? else {
                return Ok(None);
            };
            view.open_count = 0;
            view.orphaned = false;
            view.last_change_lsn = lsn;
            self.settle(view, Disposition::Reclaim);
            Ok(Some(()))
        })
    }
}

/// The region summaries a mount keeps at most (`dir::RegionCache`): a quarter of the blocks the
/// metadata cache may hold, each summary being at most about a leaf's bytes.
fn region_summaries_max(cache_bytes: u64) -> usize {
    ((cache_bytes / BLOCK_SIZE_U64) / 4).max(64) as usize
}
