//! `backend::deposits`: the records appended and waiting to be applied, by lsn.
//!
//! Appenders deposit their record after their own append returned, in any order, from many
//! threads at once; the back end takes the contiguous prefix. A deposit takes no lock: it
//! stores the record in the ring slot of its lsn. With 16 threads creating, the mutex that
//! guarded one deque here was a third of their sleeps (session 17's off-CPU profile): the back
//! end held it while it took batches of a thousand records.
//!
//! The ring covers the `slots` lsns after the consumed one. A record deposited further ahead
//! (the back end lags by more than the ring), and a record put back by the back end, goes to an
//! ordered overflow map behind a mutex instead. Why a slot never holds two records: a depositor
//! of lsn L uses the ring only if L - consumed < slots for the consumed lsn it read, so record
//! L - slots was consumed before, and its slot emptied by the consumer before it published
//! that; and a record put back, which lowers the consumed lsn, goes to the overflow.
//!
//! An lsn with no record is either a record still being deposited or one that never will be
//! (the back end's own checkpoint records, appended with `append_reserved`): the log tells
//! which ([`Log::appended_with_reserve`]), so a gap is never skipped while its record is on
//! the way.

use super::driver::Queued;
use crate::log::Log;
use crossbeam_utils::atomic::AtomicCell;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The most ring slots (8 MiB of pointers): a back end behind by more than this many records
/// deposits the rest through the overflow. Smaller logs get a ring as large as their header
/// ring, which bounds the records after the tail. (With 2^18 slots, 16 threads creating ran a
/// quarter of a million records ahead of the back end within a second, and their deposits
/// queued on the overflow's lock.)
pub const RING_SLOTS_MAX: u64 = 1 << 20;
/// The overflow's shards, by lsn: depositors beyond the ring's window spread over them.
const OVERFLOW_SHARDS: usize = 64;
/// Slots (of 8 bytes) in a cache line: the ring's stride between neighbouring lsns (`slot`).
const RING_SPREAD: u64 = 8;

/// The depositors' side: shared, no lock on the common path.
pub struct Deposits {
    ring: Box<[AtomicCell<Option<Box<Queued>>>]>,
    /// The consumer's consumed lsn as last published: every lsn at or below it was taken or
    /// is not a logical record. Depositors read it to choose the ring or the overflow.
    /// Read by every deposit, moved by the consumer: on a line of its own.
    consumed_lsn: crossbeam_utils::CachePadded<AtomicU64>,
    overflow: Box<[OverflowShard]>,
}

/// The records of the lsns `lsn % OVERFLOW_SHARDS == index` that went to the overflow.
#[repr(align(128))] // shards are taken by different depositors: keep them off each other's lines
struct OverflowShard {
    records: Mutex<BTreeMap<u64, Queued>>,
    /// How many, so that the consumer takes the lock only when the shard holds some.
    len: AtomicUsize,
}

impl OverflowShard {
    fn insert(&self, queued: Queued) {
        let mut records = self.records.lock();
        let lsn = queued.lsn;
        assert!(records.insert(lsn, queued).is_none(), "record {lsn} deposited twice");
        self.len.store(records.len(), Ordering::Release);
    }

    fn remove(&self, lsn: u64) -> Option<Queued> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut records = self.records.lock();
        let queued = records.remove(&lsn)?;
        self.len.store(records.len(), Ordering::Release);
        Some(queued)
    }
}

/// The back end's side, behind its queue mutex: the consumed lsn itself.
pub struct Consumer {
    consumed_lsn: u64,
}

impl Deposits {
    /// Deposits for a back end that has applied up to `applied_lsn`, with a ring of a power of
    /// two slots covering `header_slots` (the log's, which bounds the records after its tail)
    /// up to `RING_SLOTS_MAX`.
    pub fn new(applied_lsn: u64, header_slots: u64) -> (Deposits, Consumer) {
        let slots = header_slots.max(2).next_power_of_two().min(RING_SLOTS_MAX);
        let deposits = Deposits {
            ring: (0..slots).map(|_| AtomicCell::new(None)).collect(),
            consumed_lsn: crossbeam_utils::CachePadded::new(AtomicU64::new(applied_lsn)),
            overflow: (0..OVERFLOW_SHARDS)
                .map(|_| OverflowShard { records: Mutex::new(BTreeMap::new()), len: AtomicUsize::new(0) })
                .collect(),
        };
        (deposits, Consumer { consumed_lsn: applied_lsn })
    }

    /// Record `lsn`'s slot. Neighbouring lsns go to slots `RING_SPREAD`ths of the ring apart,
    /// not side by side: appenders on different cores deposit neighbouring lsns at the same
    /// moment, and eight slots share a cache line.
    fn slot(&self, lsn: u64) -> &AtomicCell<Option<Box<Queued>>> {
        let slots = self.ring.len() as u64;
        let index = lsn % slots;
        let spread = if slots >= RING_SPREAD * RING_SPREAD {
            (index % RING_SPREAD) * (slots / RING_SPREAD) + index / RING_SPREAD
        } else {
            index
        };
        &self.ring[spread as usize]
    }

    fn overflow_shard(&self, lsn: u64) -> &OverflowShard {
        &self.overflow[(lsn % OVERFLOW_SHARDS as u64) as usize]
    }

    /// Deposits `queued` at its lsn, from any thread.
    pub fn deposit(&self, queued: Queued) {
        let lsn = queued.lsn;
        let consumed = self.consumed_lsn.load(Ordering::Acquire);
        assert!(lsn > consumed, "record {lsn} deposited after it was consumed");
        if lsn - consumed <= self.ring.len() as u64 {
            let earlier = self.slot(lsn).swap(Some(Box::new(queued)));
            assert!(earlier.is_none(), "record {lsn} deposited into a slot still in use");
        } else {
            self.overflow_shard(lsn).insert(queued);
        }
    }

    /// The record of `lsn` if it was deposited, from the overflow or the ring.
    fn take(&self, lsn: u64) -> Option<Queued> {
        if let Some(queued) = self.overflow_shard(lsn).remove(lsn) {
            return Some(queued);
        }
        let queued = *self.slot(lsn).take()?;
        assert_eq!(queued.lsn, lsn, "the ring slot of lsn {lsn} held another record");
        Some(queued)
    }

    /// Puts a taken record back where `take` finds it first.
    fn put_back(&self, queued: Queued) {
        self.overflow_shard(queued.lsn).insert(queued);
    }

    /// Records in the overflow, all shards.
    #[cfg(test)]
    fn overflow_len(&self) -> usize {
        self.overflow.iter().map(|shard| shard.len.load(Ordering::Acquire)).sum()
    }
}

/// Whether an lsn with no record deposited can be passed over: no logical record has it, or it
/// lies before the log's tail (a checkpoint moved the tail past it, so it was not an unapplied
/// logical record).
pub fn log_passes_over(log: &Log, lsn: u64) -> bool {
    log.appended_with_reserve(lsn) != Some(false)
}

impl Consumer {
    /// Takes up to `max` durable records in lsn order whose image bounds sum to at most
    /// `image_blocks_max` (the first record is taken whatever its bound), stopping at a record
    /// still being deposited. An lsn with no record is passed over where `passes_over` says so
    /// (`log_passes_over`), and waited for otherwise.
    pub fn take_prefix(
        &mut self,
        deposits: &Deposits,
        durable_lsn: u64,
        max: usize,
        image_blocks_max: u64,
        passes_over: &dyn Fn(u64) -> bool,
    ) -> Vec<Queued> {
        let mut batch = Vec::new();
        let mut image_blocks = 0u64;
        while batch.len() < max && self.consumed_lsn < durable_lsn {
            let next = self.consumed_lsn + 1;
            match deposits.take(next) {
                Some(queued) => {
                    if !batch.is_empty() && image_blocks + queued.image_blocks > image_blocks_max {
                        deposits.put_back(queued);
                        break;
                    }
                    image_blocks += queued.image_blocks;
                    batch.push(queued);
                }
                None if passes_over(next) => {}
                None => break,
            }
            self.consumed_lsn = next;
        }
        deposits.consumed_lsn.store(self.consumed_lsn, Ordering::Release);
        batch
    }

    /// Puts back the tail of a batch that was not applied: it precedes everything deposited
    /// since. The lsns between them that were passed over are looked at again.
    pub fn put_back(&mut self, deposits: &Deposits, leftover: Vec<Queued>) {
        let Some(first) = leftover.first() else { return };
        let new_consumed = first.lsn - 1;
        assert!(new_consumed < self.consumed_lsn, "put back records that were not taken");
        for queued in leftover {
            assert!(queued.lsn <= self.consumed_lsn, "put back record {} that was not taken", queued.lsn);
            deposits.put_back(queued);
        }
        // After the records are in the overflow: a depositor that reads the lower lsn goes
        // there too, and one that read the higher lsn stays in the ring clear of them.
        self.consumed_lsn = new_consumed;
        deposits.consumed_lsn.store(new_consumed, Ordering::Release);
    }

    /// The next lsn to take, if anything was deposited after the consumed lsn (or is being
    /// deposited: `last_queued_lsn` is moved after each deposit).
    pub fn first_waiting(&self, last_queued_lsn: u64) -> Option<u64> {
        (last_queued_lsn > self.consumed_lsn).then_some(self.consumed_lsn + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spreading neighbouring lsns over the ring still gives every lsn of a window a slot of
    /// its own, for every ring size a volume can have.
    #[test]
    fn spread_slots_are_a_permutation_of_the_ring() {
        for header_slots in [1u64, 7, 63, 64, 65, 1000, 4096, 1 << 16] {
            let (deposits, _) = Deposits::new(0, header_slots);
            let slots = deposits.ring.len();
            let base = deposits.ring.as_ptr() as usize;
            let slot_bytes = std::mem::size_of::<AtomicCell<Option<Box<Queued>>>>();
            let mut taken = vec![false; slots];
            for lsn in 1000..1000 + slots as u64 {
                let place = (deposits.slot(lsn) as *const _ as usize - base) / slot_bytes;
                assert!(!std::mem::replace(&mut taken[place], true), "slot {place} given twice");
            }
            if slots >= 64 {
                let first = deposits.slot(1000) as *const _ as usize;
                let next = deposits.slot(1001) as *const _ as usize;
                assert!(first.abs_diff(next) >= 64, "neighbouring lsns share a cache line");
            }
        }
    }
    use crate::backend::record::Op;
    use crate::backend::AttributeImage;
    use crate::block::inode::Inode;
    use std::sync::Arc;

    fn queued(lsn: u64, image_blocks: u64) -> Queued {
        let inode = Inode::empty_directory(2, 1, 0o755, 1, 0);
        let op = Op::SetAttributes { inode: AttributeImage::from_inode(&inode), truncate: false };
        Queued { lsn, op: Arc::new(op), reserved_blocks: 0, image_blocks }
    }

    /// Every record deposited takes the ring or the overflow and comes back once, in lsn order,
    /// whether it was deposited ahead of the ring's window, behind it, or put back.
    #[test]
    fn records_come_back_in_lsn_order_through_ring_overflow_and_put_back() {
        let (deposits, mut consumer) = Deposits::new(10, 8);
        assert_eq!(deposits.ring.len(), 8);
        let lsns: Vec<u64> = (11..=40).rev().collect();
        for &lsn in &lsns {
            deposits.deposit(queued(lsn, 1));
        }
        assert_eq!(deposits.overflow_len(), 30 - 8, "beyond the window: overflow");
        let mut taken = Vec::new();
        while consumer.consumed_lsn < 40 {
            let mut batch = consumer.take_prefix(&deposits, 40, 7, u64::MAX, &never_passes_over);
            if batch.len() > 3 {
                let leftover = batch.split_off(3);
                consumer.put_back(&deposits, leftover);
            }
            taken.extend(batch.iter().map(|queued| queued.lsn));
        }
        assert_eq!(taken, (11..=40).collect::<Vec<u64>>());
        assert_eq!(deposits.overflow_len(), 0);
        assert!(deposits.ring.iter().all(|slot| slot.take().is_none()));
    }

    /// The image bound of a batch stops it before the record that would pass it; that record
    /// is the first of the next batch.
    #[test]
    fn a_batch_stops_before_the_record_past_its_image_bound() {
        let (deposits, mut consumer) = Deposits::new(0, 64);
        for lsn in 1..=6 {
            deposits.deposit(queued(lsn, 4));
        }
        let first = consumer.take_prefix(&deposits, 6, 16, 10, &never_passes_over);
        assert_eq!(first.iter().map(|queued| queued.lsn).collect::<Vec<_>>(), vec![1, 2]);
        let second = consumer.take_prefix(&deposits, 6, 16, 10, &never_passes_over);
        assert_eq!(second.iter().map(|queued| queued.lsn).collect::<Vec<_>>(), vec![3, 4]);
    }

    /// A missing lsn is passed over only where the log says no logical record has it;
    /// otherwise the batch stops before it and takes it once it comes.
    #[test]
    fn a_missing_lsn_stops_the_batch_unless_it_is_passed_over() {
        let (deposits, mut consumer) = Deposits::new(0, 64);
        for lsn in [1, 2, 4, 6] {
            deposits.deposit(queued(lsn, 0));
        }
        let batch = consumer.take_prefix(&deposits, 6, 16, u64::MAX, &never_passes_over);
        assert_eq!(batch.iter().map(|queued| queued.lsn).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(consumer.first_waiting(6), Some(3));
        let batch = consumer.take_prefix(&deposits, 6, 16, u64::MAX, &|lsn| lsn == 3);
        assert_eq!(batch.iter().map(|queued| queued.lsn).collect::<Vec<_>>(), vec![4]);
        deposits.deposit(queued(5, 0));
        let batch = consumer.take_prefix(&deposits, 6, 16, u64::MAX, &never_passes_over);
        assert_eq!(batch.iter().map(|queued| queued.lsn).collect::<Vec<_>>(), vec![5, 6]);
        assert_eq!(consumer.first_waiting(6), None);
    }

    /// Many threads deposit while the consumer takes: every lsn comes back once, in order.
    #[test]
    fn concurrent_deposits_come_back_once_in_order() {
        let (deposits, mut consumer) = Deposits::new(0, 256);
        let next = AtomicU64::new(1);
        const TOTAL: u64 = 200_000;
        let mut taken = Vec::with_capacity(TOTAL as usize);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let (deposits, next) = (&deposits, &next);
                scope.spawn(move || loop {
                    let lsn = next.fetch_add(1, Ordering::SeqCst);
                    if lsn > TOTAL {
                        return;
                    }
                    deposits.deposit(queued(lsn, 0));
                });
            }
            let started = std::time::Instant::now();
            while consumer.consumed_lsn < TOTAL {
                assert!(started.elapsed() < std::time::Duration::from_secs(120), "the consumer stalled");
                let batch = consumer.take_prefix(&deposits, TOTAL, 1024, u64::MAX, &never_passes_over);
                if batch.is_empty() {
                    std::thread::yield_now();
                }
                taken.extend(batch.iter().map(|queued| queued.lsn));
            }
        });
        assert!(taken.iter().copied().eq(1..=TOTAL), "taken out of order or twice");
    }

    /// Every lsn is a logical record here: a missing one is waited for.
    fn never_passes_over(_lsn: u64) -> bool {
        false
    }
}
