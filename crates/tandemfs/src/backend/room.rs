//! The backlog's image budget: how many checkpoint image blocks the records appended but not
//! yet applied may stand for (see `docs/ARCHITECTURE.md`, *When the log or the volume is full*).
//!
//! The front end admits a record's bound before it appends it; the back end releases the
//! bound as soon as the record is applied: for a parallel batch, when the group holding it is
//! committed, not when the whole batch is done, so that appenders refill the backlog while the
//! batch's largest groups finish. A released record is applied, so its blocks are in the dirty
//! set that the back end's own checkpoint policy bounds; the budget covers only the rest.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct BacklogRoom {
    /// Sum of the image-block bounds of the records admitted and not yet applied.
    queued_image_blocks: AtomicU64,
    budget_blocks: u64,
    /// Counts releases, so that a waiter knows whether room came free since it looked. Read
    /// without the lock; moved on with `wake` held, so that no wake-up is lost.
    releases: AtomicU64,
    wake: Mutex<()>,
    released: Condvar,
}

impl BacklogRoom {
    pub fn new(budget_blocks: u64) -> BacklogRoom {
        assert!(budget_blocks > 0, "an image budget of zero admits nothing");
        BacklogRoom {
            queued_image_blocks: AtomicU64::new(0),
            budget_blocks,
            releases: AtomicU64::new(0),
            wake: Mutex::new(()),
            released: Condvar::new(),
        }
    }

    pub fn queued_image_blocks(&self) -> u64 {
        self.queued_image_blocks.load(Ordering::Acquire)
    }

    /// Counts `image_blocks` into the budget; false when they do not fit. An empty backlog
    /// always takes one record, so that a record larger than the budget is not refused for ever.
    pub fn admit(&self, image_blocks: u64) -> bool {
        let budget = self.budget_blocks;
        let admitted = self.queued_image_blocks.fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
            (queued == 0 || queued + image_blocks <= budget).then_some(queued + image_blocks)
        });
        admitted.is_ok()
    }

    /// Gives back the bounds of records that were applied (or never appended), and wakes every
    /// caller waiting for room.
    pub fn release(&self, image_blocks: u64) {
        if image_blocks == 0 {
            return;
        }
        let before = self.queued_image_blocks.fetch_sub(image_blocks, Ordering::AcqRel);
        assert!(before >= image_blocks, "image budget released more often than admitted");
        let _wake = self.wake.lock();
        self.releases.fetch_add(1, Ordering::AcqRel);
        self.released.notify_all();
    }

    /// The release count, to pass to `wait_released`: read it before the `admit` that may be
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_within_the_budget_and_one_record_past_an_empty_backlog() {
        let room = BacklogRoom::new(10);
        assert!(room.admit(20), "an empty backlog takes one record of any size");
        assert!(!room.admit(1));
        room.release(20);
        assert!(room.admit(6));
        assert!(room.admit(4));
        assert!(!room.admit(1));
        assert_eq!(room.queued_image_blocks(), 10);
    }

    #[test]
    fn a_release_wakes_a_waiter_and_a_timeout_without_one_says_so() {
        let room = std::sync::Arc::new(BacklogRoom::new(10));
        assert!(room.admit(10));
        let seen = room.releases();
        assert!(!room.wait_released(seen, Duration::from_millis(20), Duration::from_millis(5), &|| false));
        let releaser = {
            let room = room.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                room.release(10);
            })
        };
        assert!(room.wait_released(seen, Duration::from_secs(10), Duration::from_millis(5), &|| false));
        releaser.join().unwrap();
        assert_eq!(room.queued_image_blocks(), 0);
    }

    #[test]
    #[should_panic(expected = "released more often than admitted")]
    fn releasing_more_than_admitted_is_a_bug() {
        let room = BacklogRoom::new(10);
        assert!(room.admit(3));
        room.release(4);
    }
}
