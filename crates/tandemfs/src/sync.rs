//! `sync`: the core count, asked once.

/// The cores this process may run on, asked once: `available_parallelism` reads the cgroup's
/// CPU quota from /proc and /sys on every call (36-50 us on the 2-core VM), as much as a whole
/// small batch of lookups costs.
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |cores| cores.get()))
}
