//! File data: read, write, truncate, insert, collapse, punch, zero and allocate.

use super::*;

impl FileSystem {
    // ------------------------------------------------------------------ data

    /// Reads up to `buffer.len()` bytes at `offset`; returns bytes read (short at end of file).
    /// Moves the access time as the mount's `access_time` policy says (relatime by default).
    pub fn read(&self, inode: InodeNumber, offset: u64, buffer: &mut [u8]) -> Result<usize> {
        let count = self.read_data(inode, offset, buffer, false)?;
        if !buffer.is_empty() {
            self.note_access(inode);
        }
        Ok(count)
    }

    /// Moves the access time of `inode` to now after a read, when the policy asks for it. The
    /// check costs one probe of the view; a record is appended only when the time moves (under
    /// relatime, once per change of the file or per day), like any other attribute change,
    /// so it survives a remount. The read has succeeded already: a failure to record the
    /// access (a full log that cannot drain, a failed or read-only volume) does not fail it.
    fn note_access(&self, inode: InodeNumber) {
        let policy = self.inner.options.access_time;
        if policy == AccessTimeUpdates::Never {
            return;
        }
        let _ = self.with_space(|| {
            let mut shard = self.lock_view(inode)?;
            let view = shard.views.get_mut(&inode).expect("loaded by lock_view");
            let now = now_ns();
            let image = &view.attributes;
            if !policy.read_moves(image.access_time_ns, image.modify_time_ns, image.change_time_ns, now) {
                return Ok(Some(()));
            }
            let mut image = image.clone();
            image.access_time_ns = now;
            let op = Op::SetAttributes { inode: image.clone(), truncate: false };
            let Some(lsn) = self.append(op, 0)? else {
                return Ok(None);
            };
            FileSystem::commit_view(view, image, lsn, false);
            Ok(Some(()))
        });
    }

    pub(super) fn read_data(
        &self,
        inode: InodeNumber,
        offset: u64,
        buffer: &mut [u8],
        allow_symlink: bool,
    ) -> Result<usize> {
        // Attempts that lost a race with a change, and waits for a structural change to be
        // applied. A wait does not use up an attempt: the attempt that holds the view shard
        // (the last) must still come, and a wait cannot hold it (the back end's bookkeeping
        // after a batch takes the shard's write lock).
        let (mut raced, mut structural_waits) = (0, 0);
        for _ in 0..=READ_ATTEMPTS_MAX + READ_STRUCTURAL_WAITS_MAX {
            // The last attempt holds the inode's view shard (shared) so that no change can race
            // it.
            let hold = raced == READ_ATTEMPTS_MAX;
            let shard = self.read_view(inode)?;
            let view = shard.views.get(&inode).expect("loaded by read_view");
            match view.file_type() {
                FileType::Regular => {}
                FileType::Symlink if allow_symlink => {}
                FileType::Directory => return Err(Error::IsDirectory),
                _ => return Err(Error::invalid("not a regular file")),
            }
            let size = view.attributes.size_bytes;
            let structural = view.structural_lsn;
            let counter = view.change_counter;
            let evictions = shard.evictions;
            if structural > self.applied() {
                drop(shard);
                structural_waits += 1;
                if structural_waits > READ_STRUCTURAL_WAITS_MAX {
                    return Err(Error::Busy);
                }
                self.wait_applied(structural)?;
                continue;
            }
            if offset >= size || buffer.is_empty() {
                return Ok(0);
            }
            let length = (buffer.len() as u64).min(size - offset) as usize;
            let pending: Vec<(u64, Arc<[u8]>)> = view
                .pending_writes
                .iter()
                .filter(|write| write.lsn > structural)
                .filter(|write| {
                    write.offset < offset + length as u64 && write.offset + write.data.len() as u64 > offset
                })
                .map(|write| (write.offset, write.data.clone()))
                .collect();
            let guard = if hold {
                Some(shard)
            } else {
                drop(shard);
                None
            };
            let target = &mut buffer[..length];
            {
                let mut volume = self.inner.backend.volume()?;
                let home = volume.read_inode(inode)?;
                let root = ExtentRoot::decode(&home.root_area)?;
                // Corruption names the inode too: the mount logs it with the EIO it answers.
                let read = extent::read(&mut *volume, &root, offset, target).map_err(|error| match error {
                    Error::Corruption { what } => Error::corruption(format!("inode {inode}: {what}")),
                    other => other,
                })?;
                target[read..].fill(0);
            }
            for (write_offset, data) in pending {
                let start = write_offset.max(offset);
                let end = (write_offset + data.len() as u64).min(offset + length as u64);
                target[(start - offset) as usize..(end - offset) as usize]
                    .copy_from_slice(&data[(start - write_offset) as usize..(end - write_offset) as usize]);
            }
            if hold {
                drop(guard);
                return Ok(length);
            }
            // A view dropped and loaded again starts its counter afresh: count evictions too.
            let shard = self.inner.front.read_views(inode);
            if shard.evictions == evictions
                && shard.views.get(&inode).is_some_and(|view| view.change_counter == counter)
            {
                return Ok(length);
            }
            raced += 1;
        }
        unreachable!("every pass either waits (at most READ_STRUCTURAL_WAITS_MAX times), races (at most READ_ATTEMPTS_MAX times) or returns")
    }

    pub fn write(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > MAX_FILE_BYTES) {
            return Err(Error::FileTooLarge);
        }
        let mut done = 0usize;
        match self.write_records(inode, offset, data, &mut done) {
            Ok(()) => Ok(done),
            // Earlier records are committed: report a short write, as write(2) does, so the
            // caller knows those bytes are in the file; its next write gets the error.
            Err(_) if done > 0 => Ok(done),
            Err(error) => Err(error),
        }
    }

    /// Writes `data` as one or more log records, counting in `done` the bytes committed
    /// before an error.
    pub(super) fn write_records(&self, inode: InodeNumber, offset: u64, data: &[u8], done: &mut usize) -> Result<()> {
        let direct = self.writes_direct(data.len());
        let piece_bytes = if direct { self.direct_record_bytes() } else { data.len().max(1) };
        for piece in data.chunks(piece_bytes) {
            let at = offset + *done as u64;
            // Large and into bytes that map nothing yet: straight home (`direct.rs`).
            if direct && self.range_is_fresh(inode, at, at + piece.len() as u64)? {
                self.write_direct(inode, at, piece)?;
                *done += piece.len();
                continue;
            }
            for chunk in piece.chunks(self.inner.max_record_data_bytes) {
                self.write_record(inode, offset + *done as u64, chunk)?;
                *done += chunk.len();
            }
        }
        Ok(())
    }

    pub(super) fn write_record(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<()> {
        let shared: Arc<[u8]> = Arc::from(data);
        self.with_space(|| {
            let mut shard = self.lock_view(inode)?;
            let size = FileSystem::regular_view(shard.views.get_mut(&inode).expect("loaded"))?.attributes.size_bytes;
            let end = offset + data.len() as u64;
            let all_blocks = (data.len() as u64).div_ceil(BLOCK_SIZE_U64);
            // Past the end of the file nothing is mapped (allocate keeps no blocks there), so
            // an append takes all its blocks and needs no look at the extent tree. Over the
            // file, blocks already written or fallocated, or filled by pending writes, are
            // overwritten in place and must not be asked for again: a full volume still takes
            // writes into space it promised. The tree is walked with the view shard unlocked,
            // so the view is read again afterwards.
            let new_blocks = if offset >= size {
                all_blocks
            } else {
                self.blocks_to_fill(&mut shard, inode, offset, end, true)?.unwrap_or(all_blocks)
            };
            // Loaded again if it was dropped while the shard was unlocked.
            let view = FileSystem::regular_view(self.load_view(&mut shard, inode)?)?;
            let mut image = view.attributes.clone();
            let now = now_ns();
            image.size_bytes = image.size_bytes.max(end);
            image.modify_time_ns = now;
            image.change_time_ns = now;
            let op = Op::Write { inode: image.clone(), offset, data: shared.clone(), insert: false };
            let Some(lsn) = self.append_reserving(op, new_blocks, DATA_RESERVE_BLOCKS, 0)? else {
                return Ok(None);
            };
            FileSystem::commit_view(view, image, lsn, false);
            view.pending_writes.push_back(PendingWrite { lsn, offset, data: shared.clone() });
            view.add_pending_blocks(lsn, new_blocks);
            Ok(Some(()))
        })
    }

    pub(super) fn range_operation(
        &self,
        inode: InodeNumber,
        kind: RangeKind,
        offset: u64,
        length: u64,
        keep_size: bool,
    ) -> Result<()> {
        if length == 0 {
            return Err(Error::invalid("range length must not be zero"));
        }
        let end = offset.checked_add(length).ok_or(Error::FileTooLarge)?;
        self.with_space(|| {
            let mut shard = self.lock_view(inode)?;
            let view = FileSystem::regular_view(shard.views.get_mut(&inode).expect("loaded by lock_view"))?;
            let mut image = view.attributes.clone();
            let size = image.size_bytes;
            let new_size = match kind {
                RangeKind::Insert => {
                    if offset > size {
                        return Err(Error::invalid(format!(
                            "insert at {offset} lies beyond the end of the file ({size})"
                        )));
                    }
                    size.checked_add(length).filter(|size| *size <= MAX_FILE_BYTES).ok_or(Error::FileTooLarge)?
                }
                RangeKind::Collapse => {
                    if end > size {
                        return Err(Error::invalid(format!(
                            "collapse of {length} bytes at {offset} runs past the end of the file ({size})"
                        )));
                    }
                    size - length
                }
                RangeKind::PunchHole | RangeKind::Compact => size,
                RangeKind::ZeroRange | RangeKind::Allocate => {
                    if end > MAX_FILE_BYTES {
                        return Err(Error::FileTooLarge);
                    }
                    if keep_size {
                        size
                    } else {
                        size.max(end)
                    }
                }
            };
            if matches!(kind, RangeKind::PunchHole | RangeKind::Compact) && offset >= size {
                return Ok(Some(()));
            }
            image.size_bytes = new_size;
            // A compaction moves bytes without changing them: the times stay.
            if kind != RangeKind::Compact {
                let now = now_ns();
                image.modify_time_ns = now;
                image.change_time_ns = now;
            }
            // Allocate and zero range give the holes of the range (clipped to the new size)
            // unwritten blocks; the other kinds take no data blocks.
            let new_blocks = match kind {
                RangeKind::Allocate | RangeKind::ZeroRange => {
                    let fill_end = end.min(new_size);
                    if offset >= fill_end {
                        0
                    } else {
                        let all_blocks = (fill_end - offset).div_ceil(BLOCK_SIZE_U64);
                        self.blocks_to_fill(&mut shard, inode, offset, fill_end, false)?.unwrap_or(all_blocks)
                    }
                }
                // New whole blocks for the bytes of the range inside the file, at most.
                RangeKind::Compact => (end.min(size) - offset).div_ceil(BLOCK_SIZE_U64),
                _ => 0,
            };
            // Punch, collapse, zero range and compaction free what the range held: at most the
            // file's blocks.
            let freed_blocks = match kind {
                RangeKind::Allocate | RangeKind::Insert => 0,
                RangeKind::Collapse | RangeKind::PunchHole | RangeKind::ZeroRange | RangeKind::Compact => {
                    shard.views.get(&inode).expect("held under the lock").blocks_with_pending()
                }
            };
            let op = Op::Range { inode: image.clone(), kind, offset, length, keep_size };
            let Some(lsn) = self.append_reserving(op, new_blocks, DATA_RESERVE_BLOCKS, freed_blocks)? else {
                return Ok(None);
            };
            let view = shard.views.get_mut(&inode).expect("held under the lock");
            FileSystem::commit_view(view, image, lsn, true);
            view.forget_writes_through(lsn);
            view.add_pending_blocks(lsn, new_blocks);
            Ok(Some(()))
        })
    }

    /// How many new blocks filling bytes `start..end` of regular file `inode` takes once every
    /// record before it is applied, at most: the holes of the applied extent tree in the range,
    /// less the bytes that pending writes will have filled, each piece rounded up to whole
    /// blocks (a hole is filled from fresh blocks, or from the unused end of the block before
    /// it, never more). `None` while a change of the file's shape (truncate, insert, collapse,
    /// punch, zero, allocate) is not applied, since the applied tree does not yet show the
    /// file as it will be, or when too many pending writes overlap the range to subtract.
    ///
    /// With `unlock`, the inode's view shard is unlocked while the tree is walked (a write over
    /// the file then does not hold up the shard's other callers while the back end holds the
    /// volume), and the answer is `None` when the file changed meanwhile; the caller must read
    /// its view again.
    /// Records the back end applies meanwhile do not matter: a pending write it applies is in
    /// the tree instead of the list, and a change of shape appended meanwhile changes the view.
    fn blocks_to_fill(
        &self,
        shard: &mut RwLockWriteGuard<'_, ViewShard>,
        inode: InodeNumber,
        start: u64,
        end: u64,
        unlock: bool,
    ) -> Result<Option<u64>> {
        assert!(start < end, "an empty range takes no blocks");
        let applied = self.applied();
        let view = FileSystem::regular_view(shard.views.get_mut(&inode).expect("caller holds the view"))?;
        if view.structural_lsn > applied {
            return Ok(None);
        }
        // Every pending write came after the last change of shape (those drop earlier writes).
        let mut filled: Vec<(u64, u64)> = Vec::new();
        for write in &view.pending_writes {
            let write_end = write.offset + write.data.len() as u64;
            if write.offset < end && write_end > start {
                if filled.len() == PENDING_OVERLAPS_MAX {
                    return Ok(None);
                }
                filled.push((write.offset.max(start), write_end.min(end)));
            }
        }
        let generation = view.attributes.generation;
        let change_counter = view.change_counter;
        let view_evictions = shard.evictions;
        let holes = if unlock {
            RwLockWriteGuard::unlocked(shard, || self.holes_in(inode, generation, start, end))?
        } else {
            self.holes_in(inode, generation, start, end)?
        };
        if unlock {
            // A view dropped and loaded again starts its counter afresh: count evictions too.
            let unchanged = shard.evictions == view_evictions
                && shard.views.get(&inode).is_some_and(|view| view.change_counter == change_counter);
            if !unchanged {
                return Ok(None);
            }
        }
        filled.sort_unstable();
        let mut blocks = 0;
        for (hole_start, hole_end) in holes {
            let mut position = hole_start;
            for &(filled_start, filled_end) in &filled {
                if position >= hole_end {
                    break;
                }
                if filled_end <= position || filled_start >= hole_end {
                    continue;
                }
                if filled_start > position {
                    blocks += (filled_start - position).div_ceil(BLOCK_SIZE_U64);
                }
                position = filled_end;
            }
            if position < hole_end {
                blocks += (hole_end - position).div_ceil(BLOCK_SIZE_U64);
            }
        }
        Ok(Some(blocks))
    }

    /// The holes in bytes `start..end` of the applied extent tree of `inode` (all of it while
    /// the file's creation is not applied), past its end included.
    pub(super) fn holes_in(
        &self,
        inode: InodeNumber,
        generation: u64,
        start: u64,
        end: u64,
    ) -> Result<Vec<(u64, u64)>> {
        let mut holes: Vec<(u64, u64)> = Vec::new();
        {
            let mut volume = self.inner.backend.volume()?;
            let mut mapped_end = 0;
            // Absent while the file's creation is not applied: then all of it is a hole.
            if let Some(home) = FileSystem::home_inode(&mut volume, inode, generation)? {
                let root = ExtentRoot::decode(&home.root_area)?;
                mapped_end = root.length_bytes().min(end);
                extent::extents_from(&mut *volume, &root, start.min(mapped_end), &mut |logical, length, at, _| {
                    if logical >= mapped_end {
                        return false;
                    }
                    if at.is_none() {
                        holes.push((logical.max(start), (logical + length).min(mapped_end)));
                    }
                    true
                })?;
            }
            if end > mapped_end {
                holes.push((start.max(mapped_end), end));
            }
        }
        Ok(holes)
    }

    /// Inserts `length` bytes of hole at `offset` (≤ size), shifting later bytes up.
    pub fn insert_range(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        self.range_operation(inode, RangeKind::Insert, offset, length, false)
    }

    /// Inserts `data` at `offset` (≤ size), shifting later bytes up. All or nothing while the
    /// volume runs: bytes that fit one record go in one insert-of-data record (format version
    /// 10), refused whole; more are a hole and writes into it, and when those bytes cannot be
    /// written (no space, an I/O error), the range made for them is collapsed out again and the
    /// file is as it was.
    pub fn insert(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if data.len() <= self.inner.max_record_data_bytes && !self.writes_direct(data.len()) {
            return self.insert_record(inode, offset, data);
        }
        let length = data.len() as u64;
        self.insert_range(inode, offset, length)?;
        // Not `write`: a short write would leave zeros in the inserted range and report success.
        let written = self.write_records(inode, offset, data, &mut 0);
        if let Err(error) = written {
            // A collapse needs no new blocks beyond the tree reserve, which the insert's own
            // reserve returned; if even that fails the volume has failed and says why.
            return match self.collapse_range(inode, offset, length) {
                Ok(()) => Err(error),
                // The file was removed meanwhile (by another thread): nothing is left to undo.
                Err(Error::NotFound) => Err(error),
                // Otherwise the undo fails only when the volume itself failed: an I/O error
                // (EIO), not a bad argument, whatever the first error was.
                Err(undo) => Err(Error::Io {
                    operation: "insert",
                    offset,
                    source: std::io::Error::other(format!(
                        "insert of {length} bytes at {offset} failed ({error}) and could not be undone ({undo}): the range holds zeros"
                    )),
                }),
            };
        }
        Ok(())
    }

    /// One record that inserts `data` at `offset` (issue 12: the hole's record and the bytes'
    /// record were two encodes, appends, deposits and applies, and two searches of the tree for
    /// the same place). A change of the file's shape, like an insert of a range: reads wait
    /// until it is applied, and the writes pending before it are applied before it is. It takes
    /// as many new blocks as its bytes at most (a hole's fill never takes more).
    fn insert_record(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<()> {
        assert!(!data.is_empty() && data.len() <= self.inner.max_record_data_bytes);
        let shared: Arc<[u8]> = Arc::from(data);
        let length = data.len() as u64;
        self.with_space(|| {
            let mut shard = self.lock_view(inode)?;
            let view = FileSystem::regular_view(shard.views.get_mut(&inode).expect("loaded by lock_view"))?;
            let mut image = view.attributes.clone();
            let size = image.size_bytes;
            if offset > size {
                return Err(Error::invalid(format!("insert at {offset} lies beyond the end of the file ({size})")));
            }
            image.size_bytes =
                size.checked_add(length).filter(|size| *size <= MAX_FILE_BYTES).ok_or(Error::FileTooLarge)?;
            let now = now_ns();
            image.modify_time_ns = now;
            image.change_time_ns = now;
            let new_blocks = length.div_ceil(BLOCK_SIZE_U64);
            let op = Op::Write { inode: image.clone(), offset, data: shared.clone(), insert: true };
            let Some(lsn) = self.append_reserving(op, new_blocks, DATA_RESERVE_BLOCKS, 0)? else {
                return Ok(None);
            };
            FileSystem::commit_view(view, image, lsn, true);
            view.forget_writes_through(lsn);
            view.add_pending_blocks(lsn, new_blocks);
            Ok(Some(()))
        })
    }

    /// Removes `length` bytes at `offset` (offset + length ≤ size), shifting later bytes down.
    pub fn collapse_range(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        self.range_operation(inode, RangeKind::Collapse, offset, length, false)
    }

    pub fn punch_hole(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        self.range_operation(inode, RangeKind::PunchHole, offset, length, true)
    }

    pub fn zero_range(&self, inode: InodeNumber, offset: u64, length: u64, keep_size: bool) -> Result<()> {
        self.range_in_pieces(inode, RangeKind::ZeroRange, offset, length, keep_size)
    }

    /// fallocate mode 0 / KEEP_SIZE: reserves space that reads as zeros.
    pub fn allocate(&self, inode: InodeNumber, offset: u64, length: u64, keep_size: bool) -> Result<()> {
        self.range_in_pieces(inode, RangeKind::Allocate, offset, length, keep_size)
    }

    /// The space regular file `inode` holds against the bytes it maps, once every change made
    /// before the call is applied (`SpaceUse::amplification`: held over mapped).
    pub fn space_use(&self, inode: InodeNumber) -> Result<SpaceUse> {
        self.check_running()?;
        let (generation, last_change_lsn) = self.with_view(inode, |view| match view.file_type() {
            FileType::Regular => Ok((view.attributes.generation, view.last_change_lsn)),
            FileType::Directory => Err(Error::IsDirectory),
            _ => Err(Error::invalid("not a regular file")),
        })??;
        // The file's own last record, not the log's: the log's last lsn may be a checkpoint's
        // record, which the back end writes and never applies.
        if last_change_lsn > 0 {
            self.wait_applied(last_change_lsn)?;
        }
        let mut volume = self.inner.backend.volume()?;
        let home = FileSystem::home_inode(&mut volume, inode, generation)?.ok_or(Error::NotFound)?;
        let root = ExtentRoot::decode(&home.root_area)?;
        extent::space_use(&mut *volume, &root)
    }

    /// Compaction (`tandem defrag`): when regular file `inode` holds more than `factor` times
    /// the bytes it maps, rewrites its fragmented runs of extents into whole blocks, through
    /// compaction records of at most `extent::COMPACT_RUN_MAX_BYTES` each (a crash keeps the
    /// records that were logged, each whole); the old blocks return to the free space at the
    /// next checkpoint. Every byte, the length and the times stay. Returns the space before and
    /// after, with every record applied.
    pub fn defrag(&self, inode: InodeNumber, factor: f64) -> Result<DefragReport> {
        if !(factor >= 1.0 && factor.is_finite()) {
            return Err(Error::invalid(format!("defrag factor {factor} is not a number of at least 1")));
        }
        let before = self.space_use(inode)?;
        if before.amplification() <= factor {
            return Ok(DefragReport { before, after: before, records: 0 });
        }
        let mut records = 0;
        for (offset, length) in self.compaction_pieces(inode)? {
            self.range_operation(inode, RangeKind::Compact, offset, length, false)?;
            records += 1;
        }
        let after = self.space_use(inode)?;
        Ok(DefragReport { before, after, records })
    }

    /// The ranges one compaction record each covers: consecutive extents with blocks (written or
    /// unwritten) of the applied tree, up to `COMPACT_RUN_MAX_BYTES` (and the log's budget per record), that hold
    /// more blocks than their bytes need. Cut only at extent boundaries, as the back end
    /// compacts only whole extents. The caller has waited for every record to be applied.
    fn compaction_pieces(&self, inode: InodeNumber) -> Result<Vec<(u64, u64)>> {
        let piece_max = extent::COMPACT_RUN_MAX_BYTES.min(self.range_piece_bytes());
        let generation = self.with_view(inode, |view| view.attributes.generation)?;
        let mut volume = self.inner.backend.volume()?;
        let home = FileSystem::home_inode(&mut volume, inode, generation)?.ok_or(Error::NotFound)?;
        let root = ExtentRoot::decode(&home.root_area)?;
        let mut pieces = Vec::new();
        // (start, end, blocks held) of the piece being gathered.
        let mut current: Option<(u64, u64, u64)> = None;
        let close = |piece: Option<(u64, u64, u64)>, pieces: &mut Vec<(u64, u64)>| {
            if let Some((start, end, held)) = piece {
                if held > (end - start).div_ceil(BLOCK_SIZE_U64) {
                    pieces.push((start, end - start));
                }
            }
        };
        extent::extents(&mut *volume, &root, &mut |logical, length, physical, _| {
            let Some(address) = physical.filter(|_| length <= piece_max) else {
                close(current.take(), &mut pieces);
                return true;
            };
            let blocks = (address + length - 1) / BLOCK_SIZE_U64 - address / BLOCK_SIZE_U64 + 1;
            match current.as_mut() {
                Some(piece) if piece.1 == logical && piece.1 - piece.0 + length <= piece_max => {
                    piece.1 += length;
                    piece.2 += blocks;
                }
                _ => {
                    close(current.take(), &mut pieces);
                    current = Some((logical, logical + length, blocks));
                }
            }
            true
        })?;
        close(current.take(), &mut pieces);
        Ok(pieces)
    }

    /// A range operation that hands out data blocks, as records of at most
    /// `range_piece_bytes` each, in order: every block handed out needs its generation-table
    /// entry in the next checkpoint's images, and one record must never need more images than
    /// the log's reserve holds (a 32 GiB fallocate on a 4 MiB log made a volume that could not
    /// checkpoint, nor mount again). Like ext4's, a fallocate that fails half way (no space)
    /// keeps the pieces it made.
    fn range_in_pieces(
        &self,
        inode: InodeNumber,
        kind: RangeKind,
        offset: u64,
        length: u64,
        keep_size: bool,
    ) -> Result<()> {
        let piece_bytes = self.range_piece_bytes();
        let mut done_bytes = 0u64;
        // Bounded: each pass covers `piece_bytes` (> 0) more of `length`.
        loop {
            let piece = (length - done_bytes).min(piece_bytes);
            self.range_operation(inode, kind, offset + done_bytes, piece, keep_size)?;
            done_bytes += piece;
            if done_bytes >= length {
                return Ok(());
            }
        }
    }

    /// The largest range one allocating record covers: its images (`data_run_image_blocks`)
    /// within a quarter of the log's reserve, in whole table blocks' worth of data.
    pub(super) fn range_piece_bytes(&self) -> u64 {
        let budget = (self.inner.log.reserve_image_blocks() / 4).saturating_sub(8);
        // data_run_image_blocks(n) <= n/G + 2 + 2n/C + 4 + 2n/B + 4 = n * (1/G + 2/C + 2/B) + 10
        // with G generation entries, C checksum entries and B bitmap bits per block; C = 2 G
        // and B = 64 G, so that is n * 65 / (32 G) + 10.
        const _: () = assert!(CHECKSUMS_PER_TABLE_BLOCK == 2 * GENERATIONS_PER_TABLE_BLOCK);
        const _: () = assert!(BITS_PER_BITMAP_BLOCK == 64 * GENERATIONS_PER_TABLE_BLOCK);
        let blocks = budget.saturating_sub(10) * 32 * GENERATIONS_PER_TABLE_BLOCK / 65;
        let blocks =
            blocks.max(GENERATIONS_PER_TABLE_BLOCK) / GENERATIONS_PER_TABLE_BLOCK * GENERATIONS_PER_TABLE_BLOCK;
        assert!(data_run_image_blocks(blocks) <= budget.max(data_run_image_blocks(GENERATIONS_PER_TABLE_BLOCK)));
        blocks * BLOCK_SIZE_U64
    }
}
