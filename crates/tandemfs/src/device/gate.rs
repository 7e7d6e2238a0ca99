//! A device wrapper that a mount writes through, so that whether writes may reach the medium
//! is decided in one place: read-write, read-only (every write is refused with
//! `Error::ReadOnly`), or fenced (multi-mount protection found the volume taken by another
//! mount: every write is refused with the reason, for good). Reads always pass.
//!
//! A read-only mount opens the volume with the gate in memory mode: what opening writes (the
//! replay of a crashed volume's log, the checkpoint after it, the log's scrub of stale header
//! slots) lands in blocks kept in memory and laid over the medium's on every read, the same
//! copy-on-write idea as fsck's `backend::Overlay`. It lives here rather than in a second
//! wrapper so that a later remount read-write can write those blocks home
//! (`write_memory_home`) and let writes through from then on.

use super::{check_range, run_batch, Device, IoRequest, IoTicket};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

const MODE_READ_WRITE: u8 = 0;
const MODE_READ_ONLY: u8 = 1;
const MODE_FENCED: u8 = 2;
const MODE_MEMORY: u8 = 3;
const BLOCK_BYTES: u64 = 4096;

pub struct Gate {
    inner: Arc<dyn Device>,
    mode: AtomicU8,
    fence_reason: Mutex<Option<String>>,
    /// Blocks written in memory mode, by block number.
    memory: Mutex<BTreeMap<u64, Box<[u8; BLOCK_BYTES as usize]>>>,
    /// Whether `memory` holds anything: reads skip the map (and its lock) while it is empty.
    has_memory: AtomicBool,
}

impl Gate {
    /// A gate over `inner`, open for writes or not.
    pub fn new(inner: Arc<dyn Device>, writable: bool) -> Gate {
        let mode = if writable { MODE_READ_WRITE } else { MODE_READ_ONLY };
        Gate {
            inner,
            mode: AtomicU8::new(mode),
            fence_reason: Mutex::new(None),
            memory: Mutex::new(BTreeMap::new()),
            has_memory: AtomicBool::new(false),
        }
    }

    /// A gate whose writes land in memory until `set_writable` says otherwise.
    pub fn in_memory(inner: Arc<dyn Device>) -> Gate {
        let gate = Gate::new(inner, false);
        gate.mode.store(MODE_MEMORY, Ordering::Release);
        gate
    }

    /// Blocks held in memory.
    pub fn memory_blocks(&self) -> usize {
        self.memory.lock().len()
    }

    /// Writes the blocks held in memory to the medium, flushes, and forgets them. Only for a
    /// gate that is writable now.
    pub fn write_memory_home(&self) -> Result<()> {
        assert!(self.is_writable(), "memory goes home only through an open gate");
        let mut memory = self.memory.lock();
        for (number, block) in memory.iter() {
            self.inner.write_at(number * BLOCK_BYTES, &block[..])?;
        }
        self.inner.flush()?;
        memory.clear();
        self.has_memory.store(false, Ordering::Release);
        Ok(())
    }

    fn write_memory(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_range(self.size_bytes(), offset, data.len(), "write")?;
        let mut memory = self.memory.lock();
        let mut position = 0usize;
        // Each pass fills one block's share, so the loop runs once per block touched.
        while position < data.len() {
            let byte = offset + position as u64;
            let number = byte / BLOCK_BYTES;
            let within = (byte % BLOCK_BYTES) as usize;
            let take = (BLOCK_BYTES as usize - within).min(data.len() - position);
            let block = match memory.entry(number) {
                std::collections::btree_map::Entry::Occupied(slot) => slot.into_mut(),
                std::collections::btree_map::Entry::Vacant(slot) => {
                    let mut block = Box::new([0u8; BLOCK_BYTES as usize]);
                    let length = BLOCK_BYTES.min(self.size_bytes() - number * BLOCK_BYTES) as usize;
                    self.inner.read_at(number * BLOCK_BYTES, &mut block[..length])?;
                    slot.insert(block)
                }
            };
            block[within..within + take].copy_from_slice(&data[position..position + take]);
            position += take;
        }
        self.has_memory.store(true, Ordering::Release);
        Ok(())
    }

    fn read_memory(&self, offset: u64, buffer: &mut [u8]) {
        if buffer.is_empty() || !self.has_memory.load(Ordering::Acquire) {
            return;
        }
        let end = offset + buffer.len() as u64;
        let memory = self.memory.lock();
        for (number, block) in memory.range(offset / BLOCK_BYTES..=(end - 1) / BLOCK_BYTES) {
            let block_start = number * BLOCK_BYTES;
            let copy_start = block_start.max(offset);
            let copy_end = (block_start + BLOCK_BYTES).min(end);
            buffer[(copy_start - offset) as usize..(copy_end - offset) as usize]
                .copy_from_slice(&block[(copy_start - block_start) as usize..(copy_end - block_start) as usize]);
        }
    }

    /// Opens or closes the gate for writes. A fenced gate stays fenced.
    pub fn set_writable(&self, writable: bool) -> Result<()> {
        let wanted = if writable { MODE_READ_WRITE } else { MODE_READ_ONLY };
        let current = self.mode.load(Ordering::Acquire);
        if current == MODE_FENCED {
            return Err(self.fenced_error());
        }
        match self.mode.compare_exchange(current, wanted, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(()),
            Err(_) => Err(self.fenced_error()),
        }
    }

    /// Refuses every later write with `reason`, for good.
    pub fn fence(&self, reason: String) {
        let mut stored = self.fence_reason.lock();
        if stored.is_none() {
            *stored = Some(reason);
        }
        self.mode.store(MODE_FENCED, Ordering::Release);
    }

    pub fn is_writable(&self) -> bool {
        self.mode.load(Ordering::Acquire) == MODE_READ_WRITE
    }

    pub fn is_fenced(&self) -> bool {
        self.mode.load(Ordering::Acquire) == MODE_FENCED
    }

    fn fenced_error(&self) -> Error {
        Error::InUse(self.fence_reason.lock().clone().unwrap_or_else(|| "the volume was fenced".into()))
    }

    fn check_write(&self) -> Result<()> {
        match self.mode.load(Ordering::Acquire) {
            MODE_READ_WRITE => Ok(()),
            MODE_READ_ONLY | MODE_MEMORY => Err(Error::ReadOnly),
            _ => Err(self.fenced_error()),
        }
    }

    fn is_memory(&self) -> bool {
        self.mode.load(Ordering::Acquire) == MODE_MEMORY
    }
}

impl Device for Gate {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buffer)?;
        self.read_memory(offset, buffer);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        if self.is_memory() {
            return self.write_memory(offset, data);
        }
        self.check_write()?;
        self.inner.write_at(offset, data)
    }
    fn flush(&self) -> Result<()> {
        // A closed gate has let nothing through since it closed, and what it let through before
        // was flushed when it closed (remount) or belongs to a mount that may no longer touch
        // the medium (fenced): nothing to do either way.
        if self.check_write().is_err() {
            return Ok(());
        }
        self.inner.flush()
    }
    fn write_held(&self, offset: u64, data: &[u8]) -> Result<()> {
        if self.is_memory() {
            return self.write_memory(offset, data);
        }
        self.check_write()?;
        self.inner.write_held(offset, data)
    }
    fn stripe_bytes(&self) -> Option<u64> {
        self.inner.stripe_bytes()
    }
    fn flush_unheld(&self) -> Result<()> {
        if self.check_write().is_err() {
            return Ok(());
        }
        self.inner.flush_unheld()
    }
    fn read_uncached(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.inner.read_uncached(offset, buffer)
    }
    /// Lets the device behind heal what `check` rejects (an array rewrites the member that was
    /// wrong) only while the gate lets writes through; a read-only or fenced gate, or one that
    /// holds writes in memory, reads once and reports.
    fn read_checked(&self, offset: u64, buffer: &mut [u8], check: &dyn Fn(&[u8]) -> bool) -> Result<bool> {
        if self.is_memory() || self.has_memory.load(Ordering::Acquire) || self.check_write().is_err() {
            self.read_at(offset, buffer)?;
            return Ok(check(buffer));
        }
        self.inner.read_checked(offset, buffer, check)
    }
    fn write_through(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_write()?;
        self.inner.write_through(offset, data)
    }
    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
    fn reachable_by_other_processes(&self) -> bool {
        self.inner.reachable_by_other_processes()
    }
    /// What the device behind the gate is: the log pads its writes on an encrypted one.
    fn decrypts(&self) -> bool {
        self.inner.decrypts()
    }
    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        if self.is_memory() || self.has_memory.load(Ordering::Acquire) {
            return IoTicket::ready(run_batch(self, batch));
        }
        let writes = batch.iter().any(|request| matches!(request, IoRequest::Write { .. } | IoRequest::Flush));
        if writes {
            if let Err(error) = self.check_write() {
                return IoTicket::ready(Err(error));
            }
        }
        self.inner.submit(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    /// The log pads its data writes on a device that decrypts; the gate in front of an
    /// encrypted volume must say so.
    #[test]
    fn a_gate_tells_whether_its_device_decrypts() {
        struct Decrypting(MemoryDevice);
        impl Device for Decrypting {
            fn size_bytes(&self) -> u64 {
                self.0.size_bytes()
            }
            fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
                self.0.read_at(offset, buffer)
            }
            fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
                self.0.write_at(offset, data)
            }
            fn flush(&self) -> Result<()> {
                self.0.flush()
            }
            fn decrypts(&self) -> bool {
                true
            }
        }
        assert!(Gate::new(Arc::new(Decrypting(MemoryDevice::new(4096))), true).decrypts());
        assert!(!Gate::new(Arc::new(MemoryDevice::new(4096)), true).decrypts());
    }

    #[test]
    fn modes_pass_or_refuse_writes() {
        let memory = Arc::new(MemoryDevice::new(1 << 16));
        let gate = Gate::new(memory.clone(), false);
        assert!(matches!(gate.write_at(0, &[1]), Err(Error::ReadOnly)));
        assert!(matches!(
            gate.submit(vec![IoRequest::Write { offset: 0, data: vec![1] }]).wait(),
            Err(Error::ReadOnly)
        ));
        gate.set_writable(true).unwrap();
        gate.write_at(0, &[7]).unwrap();
        let mut byte = [0u8];
        gate.read_at(0, &mut byte).unwrap();
        assert_eq!(byte, [7]);
        gate.fence("taken by pid 1 on host h".into());
        let error = gate.write_at(0, &[1]).unwrap_err();
        assert!(error.to_string().contains("pid 1 on host h"), "{error}");
        assert!(gate.set_writable(true).is_err());
        gate.read_at(0, &mut byte).unwrap();
        assert_eq!(byte, [7]);
    }

    #[test]
    fn memory_mode_keeps_writes_off_the_medium_until_sent_home() {
        let memory = Arc::new(MemoryDevice::new(1 << 16));
        memory.write_at(5000, &[1, 2, 3]).unwrap();
        let gate = Gate::in_memory(memory.clone());
        gate.write_at(4095, &[9, 9]).unwrap();
        let mut bytes = [0u8; 4];
        gate.read_at(4094, &mut bytes).unwrap();
        assert_eq!(bytes, [0, 9, 9, 0]);
        memory.read_at(4094, &mut bytes).unwrap();
        assert_eq!(bytes, [0; 4]);
        assert_eq!(gate.memory_blocks(), 2);
        gate.set_writable(false).unwrap();
        assert!(matches!(gate.write_at(0, &[1]), Err(Error::ReadOnly)));
        gate.read_at(4094, &mut bytes).unwrap();
        assert_eq!(bytes, [0, 9, 9, 0]);
        gate.set_writable(true).unwrap();
        gate.write_memory_home().unwrap();
        memory.read_at(4094, &mut bytes).unwrap();
        assert_eq!(bytes, [0, 9, 9, 0]);
        let mut kept = [0u8; 3];
        memory.read_at(5000, &mut kept).unwrap();
        assert_eq!(kept, [1, 2, 3]);
        assert_eq!(gate.memory_blocks(), 0);
    }
}
