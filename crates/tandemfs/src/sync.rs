//! `sync`: taking a mutex that many threads hold for a few instructions each, and the core
//! count asked once.

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a waiter spins before it parks. A hand-over between spinning threads costs a cache
/// line's trip; a parked waiter costs a futex wake and a trip through the scheduler, tens of
/// times the hold of a lock like the log's reservation (about 100 ns).
const SPIN_LIMIT: Duration = Duration::from_micros(4);

/// Pauses between looks at the lock while spinning.
const SPIN_PAUSES: u32 = 8;

/// Takes `mutex`, spinning up to `SPIN_LIMIT` before parking. For locks that many threads take
/// for every operation and hold for a few instructions: parking_lot parks a waiter after a few
/// short spins, and with 16 threads appending, the off-CPU profile had the appenders asleep in
/// the log's reservation mutex and the back end's deposit mutex for three quarters of their
/// sleeps. The spin reads the lock before trying it, so spinners share its line until it frees.
pub fn lock_briefly<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    if let Some(guard) = mutex.try_lock() {
        return guard;
    }
    let start = Instant::now();
    // Bounded by `SPIN_LIMIT`, then the ordinary (parking) take.
    while start.elapsed() < SPIN_LIMIT {
        for _ in 0..SPIN_PAUSES {
            std::hint::spin_loop();
        }
        if !mutex.is_locked() {
            if let Some(guard) = mutex.try_lock() {
                return guard;
            }
        }
    }
    mutex.lock()
}

/// The cores this process may run on, asked once: `available_parallelism` reads the cgroup's
/// CPU quota from /proc and /sys on every call (36-50 us on the 2-core VM), as much as a whole
/// small batch of lookups costs.
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |cores| cores.get()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_take_gets_the_lock_alone() {
        let counter = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let mut guard = lock_briefly(&counter);
                        let seen = *guard;
                        std::hint::spin_loop();
                        *guard = seen + 1;
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(*counter.lock(), 40_000);
    }
}
