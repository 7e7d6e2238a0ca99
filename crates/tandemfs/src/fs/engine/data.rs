//! File data: read, write, truncate, insert, collapse, punch, zero and allocate.

use super::*;

impl FileSystem {
    // ------------------------------------------------------------------ data

    /// Reads up to `buffer.len()` bytes at `offset`; returns bytes read (short at end of file).
    pub fn read(&self, inode: InodeNumber, offset: u64, buffer: &mut [u8]) -> Result<usize> {
        self.read_data(inode, offset, buffer, false)
    }

    pub(super) fn read_data(
        &self,
        inode: InodeNumber,
        offset: u64,
        buffer: &mut [u8],
        allow_symlink: bool,
    ) -> Result<usize> {
        for attempt in 0..=READ_ATTEMPTS_MAX {
            // The last attempt holds the front end still so that no change can race it.
            let hold = attempt == READ_ATTEMPTS_MAX;
            let mut front = self.inner.front.lock();
            let view = self.view(&mut front, inode)?;
            match view.file_type() {
                FileType::Regular => {}
                FileType::Symlink if allow_symlink => {}
                FileType::Directory => return Err(Error::IsDirectory),
                _ => return Err(Error::invalid("not a regular file")),
            }
            let size = view.attributes.size_bytes;
            let structural = view.structural_lsn;
            let counter = view.change_counter;
            if structural > self.applied() {
                drop(front);
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
                Some(front)
            } else {
                drop(front);
                None
            };
            let target = &mut buffer[..length];
            {
                let mut volume = self.inner.volume.lock();
                let home = volume.read_inode(inode)?;
                let root = ExtentRoot::decode(&home.root_area)?;
                let read = extent::read(&mut *volume, &root, offset, target)?;
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
            let front = self.inner.front.lock();
            if front.views.get(&inode).is_some_and(|view| view.change_counter == counter) {
                return Ok(length);
            }
        }
        unreachable!("the last attempt always returns")
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
        for chunk in data.chunks(self.inner.max_record_data_bytes) {
            self.write_record(inode, offset + *done as u64, chunk)?;
            *done += chunk.len();
        }
        Ok(())
    }

    pub(super) fn write_record(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<()> {
        let shared: Arc<[u8]> = Arc::from(data);
        self.with_space(|| {
            let mut front = self.inner.front.lock();
            let view = self.regular_view(&mut front, inode)?;
            let mut image = view.attributes.clone();
            let now = now_ns();
            image.size_bytes = image.size_bytes.max(offset + data.len() as u64);
            image.modify_time_ns = now;
            image.change_time_ns = now;
            let reserve = (data.len() as u64).div_ceil(BLOCK_SIZE_U64) + DATA_RESERVE_BLOCKS;
            let op = Op::Write { inode: image.clone(), offset, data: shared.clone() };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, false);
            front.views.get_mut(&inode).unwrap().pending_writes.push_back(PendingWrite {
                lsn,
                offset,
                data: shared.clone(),
            });
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
            let mut front = self.inner.front.lock();
            let view = self.regular_view(&mut front, inode)?;
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
                RangeKind::PunchHole => size,
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
            if kind == RangeKind::PunchHole && offset >= size {
                return Ok(Some(()));
            }
            let now = now_ns();
            image.size_bytes = new_size;
            image.modify_time_ns = now;
            image.change_time_ns = now;
            let reserve = match kind {
                RangeKind::Allocate => length.div_ceil(BLOCK_SIZE_U64) + DATA_RESERVE_BLOCKS,
                _ => DATA_RESERVE_BLOCKS,
            };
            let op = Op::Range { inode: image.clone(), kind, offset, length, keep_size };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, true);
            front.views.get_mut(&inode).unwrap().forget_writes_through(lsn);
            Ok(Some(()))
        })
    }

    /// Inserts `length` bytes of hole at `offset` (≤ size), shifting later bytes up.
    pub fn insert_range(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        self.range_operation(inode, RangeKind::Insert, offset, length, false)
    }

    /// Inserts `data` at `offset` (≤ size), shifting later bytes up.
    pub fn insert(&self, inode: InodeNumber, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.insert_range(inode, offset, data.len() as u64)?;
        // Not `write`: a short write would leave zeros in the inserted range and report success.
        self.write_records(inode, offset, data, &mut 0)
    }

    /// Removes `length` bytes at `offset` (offset + length ≤ size), shifting later bytes down.
    pub fn collapse_range(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        self.range_operation(inode, RangeKind::Collapse, offset, length, false)
    }

    pub fn punch_hole(&self, inode: InodeNumber, offset: u64, length: u64) -> Result<()> {
        self.range_operation(inode, RangeKind::PunchHole, offset, length, true)
    }

    pub fn zero_range(&self, inode: InodeNumber, offset: u64, length: u64, keep_size: bool) -> Result<()> {
        self.range_operation(inode, RangeKind::ZeroRange, offset, length, keep_size)
    }

    /// fallocate mode 0 / KEEP_SIZE: reserves space that reads as zeros.
    pub fn allocate(&self, inode: InodeNumber, offset: u64, length: u64, keep_size: bool) -> Result<()> {
        self.range_operation(inode, RangeKind::Allocate, offset, length, keep_size)
    }
}
