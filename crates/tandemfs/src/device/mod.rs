//! `device`: where bytes live. A [`Device`] reads and writes at byte offsets, flushes, and accepts
//! batches of asynchronous requests. Implementations: [`FileDevice`] (regular file or block
//! device, io_uring with O_DIRECT where allowed, else pread/pwrite/fdatasync), [`MemoryDevice`] (RAM, models crashes and injects errors)
//! and [`array::ArrayDevice`] (k + m members with Reed–Solomon parity, docs/RAID.md).
//! Nothing here knows about blocks, files or directories.

pub mod array;
mod file;
mod gate;
mod log_device;
mod memory;
mod uring;
mod worker;

pub use file::{AsyncOptions, FileDevice, FileDeviceOptions, TransportChoice, TransportStatistics};
pub use gate::Gate;
pub use log_device::LogDevice;
pub use memory::{CrashMode, Fault, FaultOperation, MemoryCounters, MemoryDevice, SECTOR_SIZE_BYTES};

use crate::error::Result;

/// One request of an asynchronous batch.
#[derive(Debug)]
pub enum IoRequest {
    Read { offset: u64, buffer: Vec<u8> },
    Write { offset: u64, data: Vec<u8> },
    Flush,
}

/// The outcome of one request, in the order submitted. A read gives its filled buffer back; a
/// write gives its data buffer back so callers can reuse allocations.
#[derive(Debug)]
pub enum IoCompletion {
    Read(Vec<u8>),
    Write(Vec<u8>),
    Flush,
}

/// A batch in flight. `wait` blocks until every request of the batch completed and returns the
/// results in submission order, or the first error.
pub struct IoTicket {
    inner: TicketInner,
}

/// Work to do on a batch's completions when it is waited for (a wrapping device's decryption).
type CompletionMap = Box<dyn FnOnce(Vec<IoCompletion>) -> Result<Vec<IoCompletion>> + Send>;

enum TicketInner {
    Ready(Result<Vec<IoCompletion>>),
    Pending(std::sync::mpsc::Receiver<Result<Vec<IoCompletion>>>),
    Then(Box<IoTicket>, CompletionMap),
}

impl IoTicket {
    pub fn ready(result: Result<Vec<IoCompletion>>) -> IoTicket {
        IoTicket { inner: TicketInner::Ready(result) }
    }
    pub fn pending(receiver: std::sync::mpsc::Receiver<Result<Vec<IoCompletion>>>) -> IoTicket {
        IoTicket { inner: TicketInner::Pending(receiver) }
    }
    /// A ticket whose completions pass through `map` on the waiting thread: a device that
    /// wraps another transforms what the inner device read, in place, without a thread of its
    /// own.
    pub fn then(self, map: CompletionMap) -> IoTicket {
        IoTicket { inner: TicketInner::Then(Box::new(self), map) }
    }
    pub fn wait(self) -> Result<Vec<IoCompletion>> {
        match self.inner {
            TicketInner::Ready(result) => result,
            TicketInner::Then(inner, map) => map(inner.wait()?),
            TicketInner::Pending(receiver) => receiver.recv().unwrap_or_else(|_| {
                Err(crate::error::Error::Io {
                    operation: "asynchronous batch",
                    offset: 0,
                    source: std::io::Error::other("device worker ended before completing the batch"),
                })
            }),
        }
    }
}

/// Byte-addressed storage. Writes are volatile until a `flush` returns: a crash may lose or tear
/// any write not covered by a completed flush. Offsets and lengths are checked against
/// `size_bytes`; an out-of-range request is an `InvalidArgument` error, never a panic.
pub trait Device: Send + Sync {
    fn size_bytes(&self) -> u64;
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()>;
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> Result<()>;
    /// A write its caller can redo after a crash, so it need not be durable before the next
    /// `flush`: the back end's home writes of file data for records already durable in the log
    /// (replay writes them again; a checkpoint's `flush` makes them durable before its commit).
    /// A device may keep it volatile across `flush_unheld`; an erasure-coded array does, so that
    /// the small home writes of many group commits gather into full stripes (docs/RAID.md,
    /// *Held home writes*). The default is `write_at`.
    fn write_held(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_at(offset, data)
    }
    /// Makes every completed write durable except those made with `write_held`, which may
    /// wait for the next `flush` (they may also become durable now). The logs flush this way
    /// (`LogDevice`): a group commit needs its records durable, not the home writes between.
    /// The default is `flush`.
    fn flush_unheld(&self) -> Result<()> {
        self.flush()
    }
    /// Bytes of one full stripe where this device is an erasure-coded array (k units), for
    /// layouts that care: the volume then allocates metadata blocks apart from file data, so
    /// that a checkpoint's images fill stripes (docs/RAID.md, *Metadata apart from file data*).
    /// `None` (the default) for every other device.
    fn stripe_bytes(&self) -> Option<u64> {
        None
    }
    /// Whether another process could reach these bytes (a file, a block device). Multi-mount
    /// protection skips its wait for racing mounters where none can (memory): the mounts of
    /// this process it knows without waiting.
    fn reachable_by_other_processes(&self) -> bool {
        true
    }
    /// Whether the medium refuses writes (opened without write permission).
    fn is_read_only(&self) -> bool {
        false
    }
    /// Reads bytes as they are on the medium now, past any cache of this path that another path
    /// to the same bytes could leave stale (a block device's page cache, which a write through
    /// the image file behind a loop device does not update). Multi-mount protection reads its
    /// block this way. The default is `read_at`: right for devices with one path to their bytes.
    fn read_uncached(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.read_at(offset, buffer)
    }
    /// Writes bytes so that every other path to them sees them at once and a crash keeps them:
    /// the counterpart of `read_uncached`. The default is `write_at` and `flush`.
    fn write_through(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_at(offset, data)?;
        self.flush()
    }
    /// Whether this device decrypts an encrypted volume beneath it (`crypt::EncryptedDevice`):
    /// what it reads and writes past the volume's header is plaintext.
    fn decrypts(&self) -> bool {
        false
    }
    /// Reads like `read_at`, then asks `check` (the volume's checksum of what was read) whether
    /// the bytes are right. A device with redundancy (`array::ArrayDevice`) that is told no
    /// rebuilds the range from its other copies, one member left out at a time, returns the
    /// first version `check` accepts and rewrites the member that was wrong (self-healing,
    /// docs/RAID.md). `Ok(true)`: `buffer` holds bytes `check` accepted; `Ok(false)`: none were,
    /// and `buffer` holds what was read. The default reads once.
    fn read_checked(&self, offset: u64, buffer: &mut [u8], check: &dyn Fn(&[u8]) -> bool) -> Result<bool> {
        self.read_at(offset, buffer)?;
        Ok(check(buffer))
    }
    /// Submits a batch; requests run in order. The default runs them synchronously.
    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        IoTicket::ready(run_batch(self, batch))
    }
}

/// Runs a batch synchronously on `device`; implementations use it for their default path.
pub fn run_batch<D: Device + ?Sized>(device: &D, batch: Vec<IoRequest>) -> Result<Vec<IoCompletion>> {
    let mut completions = Vec::with_capacity(batch.len());
    for request in batch {
        completions.push(match request {
            IoRequest::Read { offset, mut buffer } => {
                device.read_at(offset, &mut buffer)?;
                IoCompletion::Read(buffer)
            }
            IoRequest::Write { offset, data } => {
                device.write_at(offset, &data)?;
                IoCompletion::Write(data)
            }
            IoRequest::Flush => {
                device.flush()?;
                IoCompletion::Flush
            }
        });
    }
    Ok(completions)
}

/// Checks that `[offset, offset + length)` lies inside a device of `size_bytes`.
pub fn check_range(size_bytes: u64, offset: u64, length: usize, operation: &str) -> Result<()> {
    let end = offset.checked_add(length as u64);
    match end {
        Some(end) if end <= size_bytes => Ok(()),
        _ => Err(crate::error::Error::invalid(format!(
            "{operation} of {length} bytes at offset {offset} lies outside the {size_bytes}-byte device"
        ))),
    }
}
