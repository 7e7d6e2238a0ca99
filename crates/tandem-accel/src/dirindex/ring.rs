//! The host half of the command ring the directory kernel serves (`struct RingSlot` in
//! `dirindex.cu`): 64 slots of 256 bytes, the command written by the host with its sequence
//! number last, the completion written by the kernel with `done` last. The GPU engine runs it
//! over pinned, mapped memory; the host build of the kernel (tests) over plain memory.
//!
//! Every wait is bounded by the ring's timeout; the caller decides what a timeout means (the
//! GPU engine latches itself failed).

use crate::error::{AccelError, Result};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub const RING_SLOTS: usize = 64;
pub const RING_SLOT_BYTES: usize = 256;
/// Bytes of ring memory.
pub const RING_BYTES: usize = RING_SLOTS * RING_SLOT_BYTES;
/// The completion half of a slot starts here.
const COMPLETION_OFFSET: usize = 128;
/// How long the waiter polls `done` in a busy loop: a round trip is a few microseconds and a
/// command of tens of thousands of requests well under a millisecond, so most answers come
/// within this. (Counted in time, not polls: a spin-loop hint takes 10 to 140 cycles
/// depending on the processor.)
const SPIN_WAIT: Duration = Duration::from_micros(200);
/// After the busy loop, how long the waiter polls between `yield_now`s before it sleeps
/// between polls. A sleep, however short, costs tens of microseconds of timer slack, which
/// is the whole budget of a command; yielding leaves the core to other runnable threads.
const YIELD_WAIT: Duration = Duration::from_millis(5);
/// Polls after the busy loop between two liveness checks.
const POLLS_PER_LIVENESS_CHECK: u64 = 256;

/// A command as the host writes it (`struct Command` in dirindex.cu, less its sequence).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingCommand {
    pub opcode: u32,
    pub count: u32,
    pub requests: u64,
    pub request_bytes: u64,
    pub answers: u64,
    pub answer_bytes: u64,
    pub arguments: [u64; 3],
}

/// What the kernel wrote back (`struct Completion`): status 0 is success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingCompletion {
    pub status: u32,
    pub result0: u64,
    pub result1: u64,
}

/// The host's side of the ring.
pub struct Ring {
    memory: *mut u8,
    /// Next sequence number to publish; held while publishing so commands reach the kernel in
    /// sequence order.
    next: Mutex<u64>,
    /// A slot is busy from its command's publication until its waiter has read the completion.
    busy: Vec<AtomicBool>,
    timeout: Duration,
}

// SAFETY: the memory is written only through atomics, by the holder of `next` (commands) or of
// a slot's `busy` flag (reading completions).
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    /// # Safety
    /// `memory` points to RING_BYTES zeroed bytes, 8-byte aligned, that outlive the ring and
    /// that only this ring and one serving kernel touch.
    pub unsafe fn new(memory: *mut u8, timeout: Duration) -> Self {
        assert!(!memory.is_null() && (memory as usize).is_multiple_of(8));
        Ring { memory, next: Mutex::new(1), busy: (0..RING_SLOTS).map(|_| AtomicBool::new(false)).collect(), timeout }
    }

    /// The publication lock; hold it across several `submit`s so that nothing runs between them.
    pub fn lock(&self) -> MutexGuard<'_, u64> {
        self.next.lock().expect("ring lock poisoned")
    }

    fn word(&self, slot: usize, offset: usize) -> &AtomicU64 {
        assert!(slot < RING_SLOTS && offset.is_multiple_of(8) && offset < RING_SLOT_BYTES);
        // SAFETY: inside the ring, 8-byte aligned; accessed only atomically on the host.
        unsafe { &*(self.memory.add(slot * RING_SLOT_BYTES + offset) as *const AtomicU64) }
    }

    /// Writes `command` into the next slot and publishes it; returns (slot, sequence). Waits
    /// (bounded) for the slot's previous command to be collected.
    pub fn submit(&self, next: &mut MutexGuard<'_, u64>, command: &RingCommand) -> Result<(usize, u64)> {
        let sequence = **next;
        let slot = ((sequence - 1) % RING_SLOTS as u64) as usize;
        let deadline = Instant::now() + self.timeout;
        while self.busy[slot].swap(true, Ordering::AcqRel) {
            if Instant::now() > deadline {
                return Err(AccelError::Device(format!("ring slot {slot} not released within {:?}", self.timeout)));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        let words = [
            command.opcode as u64 | (command.count as u64) << 32,
            command.requests,
            command.request_bytes,
            command.answers,
            command.answer_bytes,
            command.arguments[0],
            command.arguments[1],
            command.arguments[2],
        ];
        for (index, value) in words.iter().enumerate() {
            self.word(slot, 8 * (index + 1)).store(*value, Ordering::Relaxed);
        }
        fence(Ordering::Release);
        // The doorbell: the kernel polls this word for the sequence it expects next.
        self.word(slot, 0).store(sequence, Ordering::Release);
        **next += 1;
        Ok((slot, sequence))
    }

    /// Waits (bounded) for the kernel to complete `sequence` in `slot`, then frees the slot.
    /// `alive` is asked now and then whether the kernel still runs; its error ends the wait.
    pub fn wait(&self, slot: usize, sequence: u64, alive: &mut dyn FnMut() -> Result<()>) -> Result<RingCompletion> {
        let start = Instant::now();
        let mut polls = 0u64;
        loop {
            if self.word(slot, COMPLETION_OFFSET).load(Ordering::Acquire) == sequence {
                let completion = RingCompletion {
                    status: self.word(slot, COMPLETION_OFFSET + 8).load(Ordering::Acquire) as u32,
                    result0: self.word(slot, COMPLETION_OFFSET + 16).load(Ordering::Acquire),
                    result1: self.word(slot, COMPLETION_OFFSET + 24).load(Ordering::Acquire),
                };
                self.busy[slot].store(false, Ordering::Release);
                return Ok(completion);
            }
            // Reading the clock costs tens of nanoseconds: only every 64th poll looks at it.
            polls += 1;
            if !polls.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let waited = start.elapsed();
            if waited < SPIN_WAIT {
                continue;
            }
            if (polls / 64).is_multiple_of(POLLS_PER_LIVENESS_CHECK) {
                alive()?;
            }
            if waited > self.timeout {
                return Err(AccelError::Device(format!("command {sequence} not answered within {:?}", self.timeout)));
            }
            if waited < YIELD_WAIT {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's bytes land where dirindex.cu's struct Command reads them, and a completion
    /// written where the kernel writes it is read back.
    #[test]
    fn slots_have_the_kernels_layout() {
        let mut memory = vec![0u64; RING_BYTES / 8];
        let base = memory.as_mut_ptr();
        let ring = unsafe { Ring::new(base as *mut u8, Duration::from_millis(50)) };
        let command = RingCommand {
            opcode: 4,
            count: 7,
            requests: 0x1000,
            request_bytes: 64,
            answers: 0x2000,
            answer_bytes: 784,
            arguments: [1, 2, 3],
        };
        let (slot, sequence) = ring.submit(&mut ring.lock(), &command).unwrap();
        assert_eq!((slot, sequence), (0, 1));
        // SAFETY: inside `memory`; nothing else touches it while this runs.
        let words: Vec<u64> = (0..9).map(|index| unsafe { *base.add(index) }).collect();
        assert_eq!(words, [1, 4 | 7 << 32, 0x1000, 64, 0x2000, 784, 1, 2, 3]);
        // No completion yet: the bounded wait ends with an error, and a liveness error ends it.
        assert!(ring.wait(slot, sequence, &mut || Ok(())).is_err());
        let dead = ring.wait(slot, sequence, &mut || Err(AccelError::Device("gone".into())));
        assert!(dead.unwrap_err().to_string().contains("gone"));
        // SAFETY: as above; the completion half of slot 0, `done` last as the kernel writes it.
        unsafe {
            *base.add(COMPLETION_OFFSET / 8 + 1) = 5;
            *base.add(COMPLETION_OFFSET / 8 + 2) = 11;
            *base.add(COMPLETION_OFFSET / 8 + 3) = 12;
            *base.add(COMPLETION_OFFSET / 8) = 1;
        }
        let completion = ring.wait(slot, sequence, &mut || Ok(())).unwrap();
        assert_eq!(completion, RingCompletion { status: 5, result0: 11, result1: 12 });
        // The next command goes to the next slot with the next sequence.
        assert_eq!(ring.submit(&mut ring.lock(), &command).unwrap(), (1, 2));
        drop(memory);
    }
}
