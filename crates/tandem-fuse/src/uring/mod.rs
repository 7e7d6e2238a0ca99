//! FUSE over io_uring (Linux 6.14 and later, protocol 7.42): the transport that replaces the
//! read and write system calls on /dev/fuse with ring entries, one queue per CPU, requests
//! arriving as completions and replies sent with commit-and-fetch (docs/FUSE.md, "Transports").
//!
//! This module owns the choice of transport ([`FuseTransport`], with why it was made), the
//! kernel ABI ([`abi`]) and the queue threads ([`queue`]). It decodes nothing itself: each
//! request's bytes go to fuser's dispatcher (the fork in `vendor/fuser`), which calls
//! the same adapter method a request read from /dev/fuse reaches.

pub(crate) mod abi;
pub(crate) mod queue;

use std::fmt;
use std::str::FromStr;

/// The kernel's switch for FUSE over io_uring (off by default). The mount reads it and never
/// sets it: it is the administrator's decision for the whole machine.
pub(crate) const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// The kernel's count of possible CPUs: it makes one FUSE queue for each and uses the rings
/// only once every queue has an entry.
const POSSIBLE_CPUS: &str = "/sys/devices/system/cpu/possible";

/// Largest CPU count believed from sysfs (the kernel's own limit is 8192).
const POSSIBLE_CPUS_MAX: usize = 8192;

/// How requests travel between the kernel and the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FuseTransport {
    /// io_uring when the kernel and its settings allow it, else /dev/fuse.
    #[default]
    Auto,
    /// io_uring, or the mount fails saying why.
    Uring,
    /// read and write on /dev/fuse.
    DevFuse,
}

impl FromStr for FuseTransport {
    type Err = String;
    fn from_str(text: &str) -> Result<FuseTransport, String> {
        match text {
            "auto" => Ok(FuseTransport::Auto),
            "uring" | "io_uring" => Ok(FuseTransport::Uring),
            "dev-fuse" | "dev_fuse" | "devfuse" => Ok(FuseTransport::DevFuse),
            other => Err(format!("unknown FUSE transport {other:?} (auto, uring or dev-fuse)")),
        }
    }
}

impl fmt::Display for FuseTransport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            FuseTransport::Auto => "auto",
            FuseTransport::Uring => "io_uring",
            FuseTransport::DevFuse => "/dev/fuse",
        })
    }
}

/// The transport a mount runs on, and why (what the mount log said).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportReport {
    /// [`FuseTransport::Uring`] or [`FuseTransport::DevFuse`].
    pub transport: FuseTransport,
    pub reason: String,
}

impl fmt::Display for TransportReport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}: {}", self.transport, self.reason)
    }
}

/// Whether this kernel's settings let a mount use io_uring; the reason in words when not.
pub fn availability() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_PARAMETER) {
        Ok(value) if value.trim() == "Y" || value.trim() == "1" => Ok(()),
        Ok(value) => Err(format!(
            "FUSE over io_uring is off on this machine ({ENABLE_PARAMETER} is {}; root may write Y to it)",
            value.trim()
        )),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("this kernel has no FUSE over io_uring (no {ENABLE_PARAMETER}; it needs Linux 6.14 or later)"))
        }
        Err(error) => Err(format!("cannot read {ENABLE_PARAMETER}: {error}")),
    }
}

/// The kernel's number of FUSE queues: possible CPUs (highest id + 1), from sysfs, else the
/// CPUs this process may use.
pub(crate) fn queue_count() -> usize {
    std::fs::read_to_string(POSSIBLE_CPUS)
        .ok()
        .and_then(|text| highest_cpu(&text))
        .map(|highest| highest + 1)
        .filter(|count| *count <= POSSIBLE_CPUS_MAX)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |count| count.get()))
}

/// The highest CPU in a sysfs CPU list such as "0-3,8,10-11".
fn highest_cpu(list: &str) -> Option<usize> {
    list.trim()
        .split(',')
        .map(|range| range.rsplit('-').next().unwrap_or(range).trim().parse::<usize>().ok())
        .try_fold(0usize, |highest, cpu| cpu.map(|cpu| highest.max(cpu)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_read() {
        assert_eq!(highest_cpu("0-1\n"), Some(1));
        assert_eq!(highest_cpu("0"), Some(0));
        assert_eq!(highest_cpu("0-3,8,10-11"), Some(11));
        assert_eq!(highest_cpu("x"), None);
    }

    #[test]
    fn transports_parse_and_print() {
        assert_eq!("auto".parse::<FuseTransport>(), Ok(FuseTransport::Auto));
        assert_eq!("uring".parse::<FuseTransport>(), Ok(FuseTransport::Uring));
        assert_eq!("dev-fuse".parse::<FuseTransport>(), Ok(FuseTransport::DevFuse));
        assert!("pigeon".parse::<FuseTransport>().is_err());
        assert_eq!(FuseTransport::Uring.to_string(), "io_uring");
    }
}
