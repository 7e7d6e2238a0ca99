//! Log space pledged to checkpoint images (see `docs/ARCHITECTURE.md`, *When the log or the
//! volume is full*).
//!
//! A checkpoint writes an image of every block it covers into the log, and those images stay in
//! the log until every record before them is applied and checkpointed too. So an append is
//! admitted only while the log can still hold, besides everything in it, the images that the
//! records not yet checkpointed may need: the pledge. It has three parts, each an upper bound in
//! image blocks:
//!
//! - `unapplied`: per record appended and not yet applied, the bound the front end gives it
//!   (its new metadata blocks and the blocks it changes); released when the record is applied;
//! - `dirty`: the volume's own count of the images its next checkpoint would write now (dirty
//!   blocks, bitmap blocks and generation-table blocks; `Volume::publish_image_estimate`),
//!   stored with the volume held, so applied records are counted by what they really dirtied;
//! - `checkpoint`: the images of the checkpoint under way, from its snapshot until its commit
//!   record is durable, for the images a replay after a crash before then would write again
//!   (after it, a replay completes this checkpoint from the log and takes no more room: the
//!   images go home, and the records after it are pledged on their own); and once more until
//!   they are in the log, for the space they are about to take (once appended, the log's own
//!   count of bytes in use holds them). Writing them home, which takes as long again, holds no
//!   pledge.
//!
//! `Log::append_pledged` counts the record's bound in `unapplied` first, then checks the pledge
//! against the log's normal share, and takes the bound back if the append is refused: with no
//! lock around the check, adding first is what keeps two appenders from both taking the last
//! room.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Log bytes one checkpoint image takes: the block and its number in an image record.
pub const IMAGE_LOG_BYTES: u64 = 4096 + 8;
/// Images in one image record (one header slot), as the back end writes them.
pub const IMAGES_PER_SLOT: u64 = 64;
/// Log bytes and slots besides the images that one checkpoint takes (its commit record and the
/// fields of each image record), counted once per pledge check.
pub const CHECKPOINT_OVERHEAD_BYTES: u64 = 4096;
pub const CHECKPOINT_OVERHEAD_SLOTS: u64 = 2;

pub struct Pledges {
    unapplied_blocks: crossbeam_utils::CachePadded<AtomicU64>,
    /// Written by the volume (with it held) through `dirty_gauge`.
    dirty_blocks: Arc<AtomicU64>,
    checkpoint_blocks: crossbeam_utils::CachePadded<AtomicU64>,
    /// Counts releases, so that a waiter knows whether room came free since it looked. Read
    /// without the lock; moved on with `wake` held, so that no wake-up is lost.
    releases: crossbeam_utils::CachePadded<AtomicU64>,
    wake: Mutex<()>,
    released: Condvar,
}

impl Default for Pledges {
    fn default() -> Self {
        Pledges {
            unapplied_blocks: crossbeam_utils::CachePadded::new(AtomicU64::new(0)),
            dirty_blocks: Arc::new(AtomicU64::new(0)),
            checkpoint_blocks: crossbeam_utils::CachePadded::new(AtomicU64::new(0)),
            releases: crossbeam_utils::CachePadded::new(AtomicU64::new(0)),
            wake: Mutex::new(()),
            released: Condvar::new(),
        }
    }
}

impl Pledges {
    /// The whole pledge in image blocks. `dirty` is read before `unapplied`: a group of records
    /// stores its dirt before it releases its bounds, so this order can count a group twice,
    /// never miss it.
    pub fn total_blocks(&self) -> u64 {
        let dirty = self.dirty_blocks.load(Ordering::SeqCst);
        let checkpoint = self.checkpoint_blocks.load(Ordering::SeqCst);
        dirty + checkpoint + self.unapplied_blocks.load(Ordering::SeqCst)
    }

    pub fn unapplied_blocks(&self) -> u64 {
        self.unapplied_blocks.load(Ordering::SeqCst)
    }

    /// The volume's last estimate of its next checkpoint's images.
    pub fn dirty_blocks(&self) -> u64 {
        self.dirty_blocks.load(Ordering::SeqCst)
    }

    /// The counter the volume stores its estimate in.
    pub fn dirty_gauge(&self) -> Arc<AtomicU64> {
        self.dirty_blocks.clone()
    }

    /// Counts the bound of a record being appended, before its room is checked.
    pub(super) fn pledge_record(&self, image_blocks: u64) {
        self.unapplied_blocks.fetch_add(image_blocks, Ordering::SeqCst);
    }

    /// Takes back the bound of a record whose append was refused after `pledge_record`. Wakes
    /// the waiters only when nothing is pledged any more: a refusal may have seen this bound,
    /// and with no record left to apply no release would come for it.
    pub(super) fn unpledge_record(&self, image_blocks: u64) {
        let before = self.unapplied_blocks.fetch_sub(image_blocks, Ordering::SeqCst);
        assert!(before >= image_blocks, "log pledge taken back more often than made");
        if before == image_blocks {
            self.wake_waiters();
        }
    }

    /// Records with these bounds were applied (their dirt is in the volume's estimate already)
    /// or will never be; wakes every caller waiting for room.
    pub fn records_applied(&self, image_blocks: u64) {
        if image_blocks == 0 {
            return;
        }
        let before = self.unapplied_blocks.fetch_sub(image_blocks, Ordering::SeqCst);
        assert!(before >= image_blocks, "log pledge released more often than made");
        self.wake_waiters();
    }

    /// A checkpoint is about to seal at most `image_blocks` images: counts them twice (see the
    /// module comment). Called before the snapshot, whose sealing lowers the volume's estimate.
    pub fn checkpoint_begins(&self, image_blocks: u64) {
        self.checkpoint_blocks.fetch_add(2 * image_blocks, Ordering::SeqCst);
    }

    /// The snapshot sealed `sealed_blocks` of the `bound_blocks` given to `checkpoint_begins`
    /// (the volume's estimate is an upper bound: more is a bug there).
    pub fn checkpoint_sealed(&self, bound_blocks: u64, sealed_blocks: u64) {
        assert!(
            sealed_blocks <= bound_blocks,
            "checkpoint sealed {sealed_blocks} images, above its bound {bound_blocks}"
        );
        // Neither copy of the images sealed beyond need is wanted.
        self.release_checkpoint(2 * (bound_blocks - sealed_blocks));
    }

    /// The `sealed_blocks` images of the checkpoint under way are in the log: their space is
    /// counted there now.
    pub fn checkpoint_images_logged(&self, sealed_blocks: u64) {
        self.release_checkpoint(sealed_blocks);
    }

    /// The commit record of the checkpoint of `sealed_blocks` images is durable (after
    /// `checkpoint_images_logged`): a replay would finish it from the log.
    pub fn checkpoint_committed(&self, sealed_blocks: u64) {
        self.release_checkpoint(sealed_blocks);
    }

    fn release_checkpoint(&self, image_blocks: u64) {
        if image_blocks == 0 {
            return;
        }
        let before = self.checkpoint_blocks.fetch_sub(image_blocks, Ordering::SeqCst);
        assert!(before >= image_blocks, "checkpoint pledge released more often than made");
        self.wake_waiters();
    }

    fn wake_waiters(&self) {
        let _wake = self.wake.lock();
        self.releases.fetch_add(1, Ordering::AcqRel);
        self.released.notify_all();
    }

    /// The release count, to pass to `wait_released`: read it before the append that may be
    /// refused, so that a release between the refusal and the wait is not waited for again.
    pub fn releases(&self) -> u64 {
        self.releases.load(Ordering::Acquire)
    }

    /// Waits until something is released after the count `seen` was read, for at most
    /// `timeout` (in slices of `slice`, checking `give_up` between them); true when room came.
    pub fn wait_released(&self, seen: u64, timeout: Duration, slice: Duration, give_up: &dyn Fn() -> bool) -> bool {
        let started = Instant::now();
        let mut wake = self.wake.lock();
        while self.releases.load(Ordering::Acquire) == seen {
            if started.elapsed() >= timeout || give_up() {
                return false;
            }
            self.released.wait_for(&mut wake, slice);
        }
        true
    }
}

/// Log bytes that `image_blocks` images take, with one checkpoint's overhead.
pub fn image_log_bytes(image_blocks: u64) -> u64 {
    image_blocks.saturating_mul(IMAGE_LOG_BYTES).saturating_add(CHECKPOINT_OVERHEAD_BYTES)
}

/// Header slots that `image_blocks` images take, with one checkpoint's overhead.
pub fn image_log_slots(image_blocks: u64) -> u64 {
    image_blocks.div_ceil(IMAGES_PER_SLOT) + CHECKPOINT_OVERHEAD_SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_counts_every_part_and_releases_take_them_back() {
        let pledges = Pledges::default();
        pledges.pledge_record(7);
        pledges.pledge_record(5);
        pledges.dirty_gauge().store(3, Ordering::SeqCst);
        assert_eq!(pledges.total_blocks(), 15);
        pledges.checkpoint_begins(4);
        assert_eq!(pledges.total_blocks(), 23);
        pledges.checkpoint_sealed(4, 3);
        pledges.dirty_gauge().store(0, Ordering::SeqCst);
        assert_eq!(pledges.total_blocks(), 18);
        pledges.records_applied(12);
        pledges.checkpoint_images_logged(3);
        assert_eq!(pledges.total_blocks(), 3);
        pledges.checkpoint_committed(3);
        assert_eq!(pledges.total_blocks(), 0);
    }

    #[test]
    fn a_release_wakes_a_waiter_and_a_timeout_without_one_says_so() {
        let pledges = Arc::new(Pledges::default());
        pledges.pledge_record(10);
        let seen = pledges.releases();
        assert!(!pledges.wait_released(seen, Duration::from_millis(20), Duration::from_millis(5), &|| false));
        let releaser = {
            let pledges = pledges.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                pledges.records_applied(10);
            })
        };
        assert!(pledges.wait_released(seen, Duration::from_secs(10), Duration::from_millis(5), &|| false));
        releaser.join().unwrap();
        assert_eq!(pledges.unapplied_blocks(), 0);
    }

    #[test]
    #[should_panic(expected = "released more often than made")]
    fn releasing_more_than_pledged_is_a_bug() {
        let pledges = Pledges::default();
        pledges.pledge_record(3);
        pledges.records_applied(4);
    }

    #[test]
    #[should_panic(expected = "above its bound")]
    fn a_checkpoint_sealing_more_than_its_bound_is_a_bug() {
        let pledges = Pledges::default();
        pledges.checkpoint_begins(2);
        pledges.checkpoint_sealed(2, 3);
    }
}
