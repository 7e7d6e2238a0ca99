//! The device the operation logs write through: every call goes to the device beneath, except
//! that `flush` is that device's `flush_unheld`. A group commit needs its own records durable;
//! the back end's home writes made with `Device::write_held` between two commits are redone by
//! replay if lost, so a device that gathers them (an erasure-coded array, docs/RAID.md, *Held
//! home writes*) may keep them past the commit. Everything else the logs' callers rely on is
//! unheld: a direct write's data (`Log::note_ordered_data`'s flush before the record) is
//! written with `write_at`, so that flush still makes it durable.

use super::{Device, IoRequest, IoTicket};
use crate::error::Result;
use std::sync::Arc;

pub struct LogDevice {
    inner: Arc<dyn Device>,
}

impl LogDevice {
    pub fn new(inner: Arc<dyn Device>) -> LogDevice {
        LogDevice { inner }
    }
}

impl Device for LogDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buffer)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.write_at(offset, data)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush_unheld()
    }
    fn write_held(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.write_held(offset, data)
    }
    fn flush_unheld(&self) -> Result<()> {
        self.inner.flush_unheld()
    }
    fn reachable_by_other_processes(&self) -> bool {
        self.inner.reachable_by_other_processes()
    }
    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
    fn read_uncached(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.inner.read_uncached(offset, buffer)
    }
    fn write_through(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.write_through(offset, data)
    }
    fn decrypts(&self) -> bool {
        self.inner.decrypts()
    }
    fn stripe_bytes(&self) -> Option<u64> {
        self.inner.stripe_bytes()
    }
    fn read_checked(&self, offset: u64, buffer: &mut [u8], check: &dyn Fn(&[u8]) -> bool) -> Result<bool> {
        self.inner.read_checked(offset, buffer, check)
    }
    /// A batch's `Flush` must be this device's flush, so a batch with one runs here.
    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        if batch.iter().any(|request| matches!(request, IoRequest::Flush)) {
            return IoTicket::ready(super::run_batch(self, batch));
        }
        self.inner.submit(batch)
    }
}
