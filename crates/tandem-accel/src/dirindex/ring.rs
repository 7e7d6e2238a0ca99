//! The host half of the command ring the directory kernel serves (`struct RingSlot` in
//! `dirindex.cu`): 64 slots of 256 bytes, the command written by the host with its sequence
//! number last, the completion written by the kernel with `done` last. The GPU engine runs it
//! over pinned, mapped memory; the host build of the kernel (tests) over plain memory.
//!
//! Every wait is bounded by the ring's timeout; the caller decides what a timeout means (the
//! GPU engine latches itself failed).
//!
//! Behind the slots lies one express area per slot (`EXPRESS_SLOT_BYTES`): an express command
//! (`EXPRESS_FLAG` on a lookup, resolve or stat of at most `EXPRESS_MAXIMUM_REQUESTS` requests)
//! carries its requests there and is answered there by one warp of the kernel, which loads the
//! area together with the command (docs/GPUDIR.md, "The express path"). The slot's busy flag
//! owns its area: no staging buffer, no chunking, no worker thread.

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
/// Flag on a query opcode: the requests are in the slot's express area and are answered there
/// (`COMMAND_EXPRESS` in dirindex.cu).
pub const EXPRESS_FLAG: u32 = 0x100;
/// Bytes of one slot's express area: requests, then answers, then the kernel's time stamps.
pub const EXPRESS_SLOT_BYTES: usize = 8192;
/// Request bytes of an express command at most (records and names, as `wire` encodes them).
pub const EXPRESS_REQUEST_BYTES: usize = 4096;
/// Requests of an express command at most: one warp, one request a lane.
pub const EXPRESS_MAXIMUM_REQUESTS: usize = 32;
/// Where the answers start in an express area (`wire::ANSWER_BYTES` each).
pub const EXPRESS_ANSWERS_OFFSET: usize = EXPRESS_REQUEST_BYTES;
/// Where the kernel writes its time stamps (`KernelStamps`, `EXPRESS_STAMP_WORDS` words).
pub const EXPRESS_STAMPS_OFFSET: usize = EXPRESS_ANSWERS_OFFSET + EXPRESS_MAXIMUM_REQUESTS * super::wire::ANSWER_BYTES;
/// Words of the kernel's stamps (`EXPRESS_STAMP_WORDS` in dirindex.cu).
pub const EXPRESS_STAMP_WORDS: usize = 8;
const _: () = assert!(EXPRESS_STAMPS_OFFSET + 8 * EXPRESS_STAMP_WORDS <= EXPRESS_SLOT_BYTES);
/// Bytes of ring memory with the express areas behind the slots: what `Ring::new` takes.
pub const RING_MEMORY_BYTES: usize = RING_BYTES + RING_SLOTS * EXPRESS_SLOT_BYTES;
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

/// When the kernel's warp saw an express command, had it and its requests in shared memory,
/// had decided its answers (the walk over), and had stored them (before the fence and the
/// completion), in ns of the GPU's global timer (its resolution is the GPU's: 32 ns to 1 µs);
/// for a resolve also when the walk's first and second directories had passed their checks
/// (their records' loads arrived: the walk's dependent rounds 1 and 2; 0 when the walk did
/// not get there); and the SM's cycle counter at staged and at answered, whose ratio to the
/// ns span is the SM clock during the walk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStamps {
    pub seen_ns: u64,
    pub staged_ns: u64,
    pub answered_ns: u64,
    pub walked_ns: u64,
    pub step_ns: [u64; 2],
    pub staged_cycles: u64,
    pub answered_cycles: u64,
}

impl KernelStamps {
    /// The SM clock in MHz over staged → answered (cycles per µs), or None when the span is
    /// shorter than the GPU timer can tell (under 2 µs) or a stamp is missing.
    pub fn sm_clock_mhz(&self) -> Option<f64> {
        let span_ns = self.answered_ns.checked_sub(self.staged_ns)?;
        let cycles = self.answered_cycles.checked_sub(self.staged_cycles)?;
        (span_ns >= 2_000).then(|| cycles as f64 * 1e3 / span_ns as f64)
    }
}

/// When the host side of one express command reached each step, on the host's monotonic
/// clock: called, requests encoded into the area, doorbell rung (the command published), `done`
/// seen by the waiter, answers decoded. Beside the kernel's `KernelStamps` they say whether a
/// round trip's time is the host's or the GPU's: the kernel's span (seen → answered) lies
/// inside published → done seen, and what is left of that span is the doorbell's way in, the
/// fence and the completion's way out. Five clock reads a command (about 25 ns each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostStamps {
    pub called: Instant,
    pub encoded: Instant,
    pub published: Instant,
    pub done_seen: Instant,
    pub decoded: Instant,
}

impl HostStamps {
    /// Every step at `now` (filled in as the command goes).
    fn at(now: Instant) -> Self {
        HostStamps { called: now, encoded: now, published: now, done_seen: now, decoded: now }
    }
}

/// Dependent loads of a latency probe at most (`PROBE_MAXIMUM_LOADS` in dirindex.cu).
pub const PROBE_MAXIMUM_LOADS: u32 = 256;
/// Dependent multiplies a latency probe times (`PROBE_MULTIPLIES` in dirindex.cu).
pub const PROBE_MULTIPLIES: u32 = 1024;
const PROBE_STAMP_WORDS: usize = 10;
const _: () = assert!(EXPRESS_STAMPS_OFFSET + 8 * PROBE_STAMP_WORDS <= EXPRESS_SLOT_BYTES);

/// What the kernel's latency probe measured (`serve_probe` in dirindex.cu), from the polling
/// warp of the live kernel: `loads` dependent loads of table memory, then the same chain again
/// (its lines in L2 now), then `PROBE_MULTIPLIES` dependent multiplies; `ns` (global timer)
/// and `cycles` (the SM's clock64) at the start and after each of the three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeStamps {
    pub loads: u32,
    pub ns: [u64; 4],
    pub cycles: [u64; 4],
}

impl ProbeStamps {
    fn per(total: u64, count: u32) -> f64 {
        total as f64 / count.max(1) as f64
    }
    /// ns a load of the first chain (cold: where the lines were, L2 or memory).
    pub fn first_load_ns(&self) -> f64 {
        Self::per(self.ns[1].saturating_sub(self.ns[0]), self.loads)
    }
    /// ns a load of the second chain (the same lines again: L2).
    pub fn second_load_ns(&self) -> f64 {
        Self::per(self.ns[2].saturating_sub(self.ns[1]), self.loads)
    }
    /// SM cycles a load of the second chain.
    pub fn second_load_cycles(&self) -> f64 {
        Self::per(self.cycles[2].saturating_sub(self.cycles[1]), self.loads)
    }
    /// SM cycles a dependent multiply (about 4 at any clock: the instruction's latency).
    pub fn multiply_cycles(&self) -> f64 {
        Self::per(self.cycles[3].saturating_sub(self.cycles[2]), PROBE_MULTIPLIES)
    }
    /// The SM clock in MHz over the whole probe (cycles per µs), or None when the probe was
    /// shorter than the GPU timer can tell (under 2 µs).
    pub fn sm_clock_mhz(&self) -> Option<f64> {
        let span_ns = self.ns[3].checked_sub(self.ns[0])?;
        let cycles = self.cycles[3].checked_sub(self.cycles[0])?;
        (span_ns >= 2_000).then(|| cycles as f64 * 1e3 / span_ns as f64)
    }
}

/// One latency probe of `loads` dependent loads (at most PROBE_MAXIMUM_LOADS) from `seed`, sent
/// the express way (the kernel changes nothing). Errors as `express_query`'s.
pub fn latency_probe(
    ring: &Ring,
    loads: u32,
    seed: u64,
    alive: &mut dyn FnMut() -> Result<()>,
    ring_failure: &dyn Fn(String) -> AccelError,
) -> Result<ProbeStamps> {
    assert!(loads <= PROBE_MAXIMUM_LOADS, "a probe of {loads} loads");
    let answer = ring
        .express(super::wire::COMMAND_PROBE, 0, [loads as u64, seed, 0], |_| 0, alive)
        .map_err(|error| ring_failure(error.to_string()))?;
    if answer.completion.status != 0 {
        return Err(ring_failure(format!("latency probe refused by the kernel (error {})", answer.completion.status)));
    }
    let words = answer.stamp_words::<PROBE_STAMP_WORDS>();
    Ok(ProbeStamps {
        loads,
        ns: [words[0], words[1], words[2], words[3]],
        cycles: [words[4], words[5], words[6], words[7]],
    })
}

/// Both sides' stamps of one express command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpressStamps {
    pub host: HostStamps,
    pub kernel: KernelStamps,
}

/// An express command's completion, its answers and its stamps, read in place; the slot (and
/// so its area) stays held until this is dropped.
pub struct ExpressAnswer<'a> {
    ring: &'a Ring,
    slot: usize,
    pub completion: RingCompletion,
    /// The host's stamps up to `done_seen` (`decoded` is the caller's to set).
    pub host: HostStamps,
}

impl ExpressAnswer<'_> {
    /// The first `bytes` of the answers.
    pub fn answers(&self, bytes: usize) -> &[u8] {
        assert!(bytes <= EXPRESS_MAXIMUM_REQUESTS * super::wire::ANSWER_BYTES);
        // SAFETY: inside the slot's area, which this answer holds (busy flag) until dropped; the
        // kernel wrote it before the completion, which was read with acquire.
        unsafe { std::slice::from_raw_parts(self.ring.express_area(self.slot).add(EXPRESS_ANSWERS_OFFSET), bytes) }
    }

    pub fn stamps(&self) -> KernelStamps {
        let word = self.stamp_words::<EXPRESS_STAMP_WORDS>();
        KernelStamps {
            seen_ns: word[0],
            staged_ns: word[1],
            answered_ns: word[2],
            walked_ns: word[3],
            step_ns: [word[4], word[5]],
            staged_cycles: word[6],
            answered_cycles: word[7],
        }
    }

    /// The first `WORDS` words the kernel stored at EXPRESS_STAMPS_OFFSET.
    fn stamp_words<const WORDS: usize>(&self) -> [u64; WORDS] {
        assert!(EXPRESS_STAMPS_OFFSET + 8 * WORDS <= EXPRESS_SLOT_BYTES);
        std::array::from_fn(|index| {
            // SAFETY: as `answers`, inside the area (asserted); 8-byte aligned (the area and
            // the offset are).
            unsafe {
                (self.ring.express_area(self.slot).add(EXPRESS_STAMPS_OFFSET + 8 * index) as *const u64).read_volatile()
            }
        })
    }
}

impl Drop for ExpressAnswer<'_> {
    fn drop(&mut self) {
        self.ring.release(self.slot);
    }
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
    /// `memory` points to RING_MEMORY_BYTES zeroed bytes, 8-byte aligned, that outlive the
    /// ring and that only this ring and one serving kernel touch.
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
        let (slot, sequence) = self.reserve(next)?;
        self.publish(next, slot, sequence, command);
        Ok((slot, sequence))
    }

    /// Takes the next slot (waiting, bounded, until its previous command was collected) without
    /// publishing anything: the caller may fill the slot's express area, then `publish`.
    pub fn reserve(&self, next: &mut MutexGuard<'_, u64>) -> Result<(usize, u64)> {
        let sequence = **next;
        let slot = ((sequence - 1) % RING_SLOTS as u64) as usize;
        let deadline = Instant::now() + self.timeout;
        while self.busy[slot].swap(true, Ordering::AcqRel) {
            if Instant::now() > deadline {
                return Err(AccelError::Device(format!("ring slot {slot} not released within {:?}", self.timeout)));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok((slot, sequence))
    }

    /// Writes `command` into `slot` (reserved with `sequence` under the same `next`) and rings
    /// the doorbell.
    pub fn publish(&self, next: &mut MutexGuard<'_, u64>, slot: usize, sequence: u64, command: &RingCommand) {
        assert_eq!(**next, sequence, "publish the slot reserved last");
        assert_eq!(slot, ((sequence - 1) % RING_SLOTS as u64) as usize);
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
    }

    /// The express area of `slot`.
    fn express_area(&self, slot: usize) -> *mut u8 {
        assert!(slot < RING_SLOTS);
        // SAFETY: inside the RING_MEMORY_BYTES the ring was given.
        unsafe { self.memory.add(RING_BYTES + slot * EXPRESS_SLOT_BYTES) }
    }

    /// Runs an express command: `opcode` (a lookup, resolve or stat code, `EXPRESS_FLAG` added
    /// here) on `count` requests that `encode` writes into the slot's area (it returns the
    /// request bytes written, at most EXPRESS_REQUEST_BYTES). Publishes, lets other
    /// submitters in, and waits (bounded) for the completion; the answers are read in place
    /// from what this returns, which holds the slot until dropped.
    pub fn express(
        &self,
        opcode: u32,
        count: usize,
        arguments: [u64; 3],
        encode: impl FnOnce(&mut [u8]) -> usize,
        alive: &mut dyn FnMut() -> Result<()>,
    ) -> Result<ExpressAnswer<'_>> {
        assert!(count <= EXPRESS_MAXIMUM_REQUESTS && opcode & EXPRESS_FLAG == 0);
        let mut host = HostStamps::at(Instant::now());
        let (slot, sequence) = {
            let mut next = self.lock();
            let (slot, sequence) = self.reserve(&mut next)?;
            // SAFETY: the slot is reserved (busy) and its previous command collected, so
            // neither the kernel nor another host thread touches its area until publication.
            let area = unsafe { std::slice::from_raw_parts_mut(self.express_area(slot), EXPRESS_REQUEST_BYTES) };
            let request_bytes = encode(area);
            assert!(request_bytes <= EXPRESS_REQUEST_BYTES);
            host.encoded = Instant::now();
            let command = RingCommand {
                opcode: opcode | EXPRESS_FLAG,
                count: count as u32,
                request_bytes: request_bytes as u64,
                answer_bytes: (count * super::wire::ANSWER_BYTES) as u64,
                arguments,
                // The kernel finds the area from the slot; the addresses are not read.
                ..RingCommand::default()
            };
            self.publish(&mut next, slot, sequence, &command);
            host.published = Instant::now();
            (slot, sequence)
        };
        let completion = self.wait_held(slot, sequence, alive)?;
        host.done_seen = Instant::now();
        host.decoded = host.done_seen;
        Ok(ExpressAnswer { ring: self, slot, completion, host })
    }

    /// Waits (bounded) for the kernel to complete `sequence` in `slot`, then frees the slot.
    /// `alive` is asked now and then whether the kernel still runs; its error ends the wait.
    pub fn wait(&self, slot: usize, sequence: u64, alive: &mut dyn FnMut() -> Result<()>) -> Result<RingCompletion> {
        let completion = self.wait_held(slot, sequence, alive)?;
        self.release(slot);
        Ok(completion)
    }

    /// Frees a slot whose completion (and express answers) its waiter has read.
    pub fn release(&self, slot: usize) {
        assert!(self.busy[slot].swap(false, Ordering::AcqRel), "slot {slot} released twice");
    }

    /// `wait` without freeing the slot (the caller reads what the kernel wrote, then
    /// `release`s it). A failed wait keeps the slot busy: the kernel may still write it.
    pub fn wait_held(
        &self,
        slot: usize,
        sequence: u64,
        alive: &mut dyn FnMut() -> Result<()>,
    ) -> Result<RingCompletion> {
        let start = Instant::now();
        let mut polls = 0u64;
        loop {
            if self.word(slot, COMPLETION_OFFSET).load(Ordering::Acquire) == sequence {
                let completion = RingCompletion {
                    status: self.word(slot, COMPLETION_OFFSET + 8).load(Ordering::Acquire) as u32,
                    result0: self.word(slot, COMPLETION_OFFSET + 16).load(Ordering::Acquire),
                    result1: self.word(slot, COMPLETION_OFFSET + 24).load(Ordering::Acquire),
                };
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

/// Whether a query batch goes the express way: at most EXPRESS_MAXIMUM_REQUESTS requests whose
/// encoding (`request_bytes` each, as `wire` lays them out) fits an express area.
pub fn fits_express<R>(requests: &[R], request_bytes: impl Fn(&R) -> usize) -> bool {
    requests.len() <= EXPRESS_MAXIMUM_REQUESTS
        && requests.iter().map(request_bytes).sum::<usize>() <= EXPRESS_REQUEST_BYTES
}

/// A query batch that `fits_express`, as one express command: encoded into the slot's area
/// with `encode` (the batch path's encoder), answered in place and decoded into `out` (cleared
/// first) with `decode` (the batch path's decoder). A ring error or a command the kernel
/// refused is passed through `ring_failure` (the GPU engine latches itself failed there); a
/// decoding error is returned as it is. Returns both sides' stamps.
#[allow(clippy::too_many_arguments)]
pub fn express_query<R, T: Copy>(
    ring: &Ring,
    requests: &[R],
    (opcode, arguments): (u32, [u64; 3]),
    encode: impl FnOnce(&[R], &mut [u8]) -> super::wire::Layout,
    decode: impl FnOnce(&[u8], &[R], &mut [std::mem::MaybeUninit<T>]) -> Result<()>,
    alive: &mut dyn FnMut() -> Result<()>,
    ring_failure: &dyn Fn(String) -> AccelError,
    out: &mut Vec<T>,
) -> Result<ExpressStamps> {
    out.clear();
    let count = requests.len();
    let encoded = |area: &mut [u8]| encode(requests, area).request_bytes;
    let answer =
        ring.express(opcode, count, arguments, encoded, alive).map_err(|error| ring_failure(error.to_string()))?;
    if answer.completion.status != 0 {
        return Err(ring_failure(format!(
            "express command refused by the kernel (error {})",
            answer.completion.status
        )));
    }
    out.reserve(count);
    decode(answer.answers(count * super::wire::ANSWER_BYTES), requests, &mut out.spare_capacity_mut()[..count])?;
    // SAFETY: `decode` returned Ok, so it wrote each of the first `count` elements.
    unsafe { out.set_len(count) };
    let host = HostStamps { decoded: Instant::now(), ..answer.host };
    Ok(ExpressStamps { host, kernel: answer.stamps() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's bytes land where dirindex.cu's struct Command reads them, and a completion
    /// written where the kernel writes it is read back.
    #[test]
    fn slots_have_the_kernels_layout() {
        let mut memory = vec![0u64; RING_MEMORY_BYTES / 8];
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
