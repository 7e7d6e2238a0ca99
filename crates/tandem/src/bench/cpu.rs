//! CPU time of the whole machine, from /proc/stat, for "CPU seconds per GiB" in the benchmarks.
//!
//! The whole machine and not this process, because the peers do their cipher work elsewhere:
//! dm-crypt in the kernel's kcryptd workers, gocryptfs in its own daemon, ext4's writeback in
//! kernel flusher threads. getrusage of the process and its children would see none of that
//! (gocryptfs is waited for only after the measurement). The price: anything else running on
//! the machine counts too, so measure on a quiet machine.

/// Busy time counted in /proc/stat's first line: user, nice, system, irq and softirq (guest time
/// is already inside user and nice). Idle, iowait and steal are not work done here.
const BUSY_FIELDS: [usize; 5] = [0, 1, 2, 5, 6];

/// The machine's busy CPU seconds since boot, summed over all CPUs; None where /proc/stat cannot
/// be read or parsed.
pub fn machine_busy_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks_per_second <= 0 {
        return None;
    }
    busy_ticks(&text).map(|ticks| ticks as f64 / ticks_per_second as f64)
}

/// Parses the aggregate "cpu" line and sums the busy fields, in clock ticks.
fn busy_ticks(proc_stat: &str) -> Option<u64> {
    let line = proc_stat.lines().find(|line| line.split_whitespace().next() == Some("cpu"))?;
    let fields: Vec<u64> =
        line.split_whitespace().skip(1).map(|field| field.parse::<u64>().ok()).collect::<Option<_>>()?;
    BUSY_FIELDS.iter().map(|&index| fields.get(index).copied()).sum()
}

/// How busy the machine is with other work: the share of all CPUs' time that was busy over
/// `window`, in percent, while this process sleeps. None where /proc/stat cannot be read.
pub fn background_busy_percent(window: std::time::Duration) -> Option<f64> {
    let cpus = std::thread::available_parallelism().map(|count| count.get()).unwrap_or(1) as f64;
    let before = machine_busy_seconds()?;
    std::thread::sleep(window);
    let after = machine_busy_seconds()?;
    Some(100.0 * (after - before).max(0.0) / (window.as_secs_f64() * cpus))
}

/// One line about other work on the machine when there is enough to skew CPU s/GiB.
pub fn background_note() -> Option<String> {
    /// Below this share of all CPUs busy beforehand, the counts are left unremarked.
    const NOTICEABLE_PERCENT: f64 = 10.0;
    let percent = background_busy_percent(std::time::Duration::from_millis(500))?;
    (percent >= NOTICEABLE_PERCENT).then(|| {
        format!(
            "note: the machine was {percent:.0}% busy with other work just before the run; CPU s/GiB counts that too"
        )
    })
}

/// Accumulates busy CPU seconds over timed phases: `start` before a phase, `stop` after it.
#[derive(Debug, Default)]
pub struct CpuMeter {
    started: Option<f64>,
    total_seconds: f64,
    /// False once any reading failed: the total is then not reported.
    unreadable: bool,
}

impl CpuMeter {
    pub fn start(&mut self) {
        assert!(self.started.is_none(), "a phase is already being measured");
        self.started = machine_busy_seconds();
        self.unreadable |= self.started.is_none();
    }

    pub fn stop(&mut self) {
        let Some(started) = self.started.take() else { return };
        match machine_busy_seconds() {
            Some(now) => self.total_seconds += (now - started).max(0.0),
            None => self.unreadable = true,
        }
    }

    /// CPU seconds per GiB over `bytes` moved during the measured phases.
    pub fn seconds_per_gib(&self, bytes: u64) -> Option<f64> {
        if self.unreadable || bytes == 0 {
            return None;
        }
        Some(self.total_seconds / (bytes as f64 / (1u64 << 30) as f64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_busy_fields_of_the_aggregate_line() {
        let text = "cpu  100 5 30 9000 40 2 3 7 0 0\ncpu0 50 2 15 4500 20 1 1 3 0 0\nintr 1\n";
        assert_eq!(busy_ticks(text), Some(100 + 5 + 30 + 2 + 3));
        assert_eq!(busy_ticks("cpu  1 2\n"), None, "too few fields");
        assert_eq!(busy_ticks("intr 1\n"), None, "no aggregate line");
    }

    #[test]
    fn seconds_per_gib_divides_by_the_bytes_moved() {
        let meter = CpuMeter { started: None, total_seconds: 3.0, unreadable: false };
        assert_eq!(meter.seconds_per_gib(2 << 30), Some(1.5));
        assert_eq!(meter.seconds_per_gib(0), None);
        let unreadable = CpuMeter { unreadable: true, ..meter };
        assert_eq!(unreadable.seconds_per_gib(1 << 30), None);
    }
}
