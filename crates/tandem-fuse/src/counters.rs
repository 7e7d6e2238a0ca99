//! Requests served, per kind: how `tandem bench mount` counts the kernel round trips that one
//! create, stat or unlink costs (docs/FUSE.md, "Requests per operation"). One relaxed atomic
//! add per request, each kind on its own cache line so that workers serving different kinds do
//! not contend; next to a request's 10 µs or more of kernel crossing it does not show.

use std::sync::atomic::{AtomicU64, Ordering};

/// The kinds of FUSE request the adapter serves, named as the protocol names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    Lookup,
    /// One per inode the kernel forgets (FORGET, or one entry of a BATCH_FORGET).
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Create,
    Ioctl,
    Fallocate,
    Lseek,
}

impl RequestKind {
    pub const ALL: [RequestKind; 33] = [
        RequestKind::Lookup,
        RequestKind::Forget,
        RequestKind::Getattr,
        RequestKind::Setattr,
        RequestKind::Readlink,
        RequestKind::Mknod,
        RequestKind::Mkdir,
        RequestKind::Unlink,
        RequestKind::Rmdir,
        RequestKind::Symlink,
        RequestKind::Rename,
        RequestKind::Link,
        RequestKind::Open,
        RequestKind::Read,
        RequestKind::Write,
        RequestKind::Flush,
        RequestKind::Release,
        RequestKind::Fsync,
        RequestKind::Opendir,
        RequestKind::Readdir,
        RequestKind::Readdirplus,
        RequestKind::Releasedir,
        RequestKind::Fsyncdir,
        RequestKind::Statfs,
        RequestKind::Setxattr,
        RequestKind::Getxattr,
        RequestKind::Listxattr,
        RequestKind::Removexattr,
        RequestKind::Access,
        RequestKind::Create,
        RequestKind::Ioctl,
        RequestKind::Fallocate,
        RequestKind::Lseek,
    ];

    /// The protocol's name (FUSE_LOOKUP is "LOOKUP").
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Lookup => "LOOKUP",
            RequestKind::Forget => "FORGET",
            RequestKind::Getattr => "GETATTR",
            RequestKind::Setattr => "SETATTR",
            RequestKind::Readlink => "READLINK",
            RequestKind::Mknod => "MKNOD",
            RequestKind::Mkdir => "MKDIR",
            RequestKind::Unlink => "UNLINK",
            RequestKind::Rmdir => "RMDIR",
            RequestKind::Symlink => "SYMLINK",
            RequestKind::Rename => "RENAME",
            RequestKind::Link => "LINK",
            RequestKind::Open => "OPEN",
            RequestKind::Read => "READ",
            RequestKind::Write => "WRITE",
            RequestKind::Flush => "FLUSH",
            RequestKind::Release => "RELEASE",
            RequestKind::Fsync => "FSYNC",
            RequestKind::Opendir => "OPENDIR",
            RequestKind::Readdir => "READDIR",
            RequestKind::Readdirplus => "READDIRPLUS",
            RequestKind::Releasedir => "RELEASEDIR",
            RequestKind::Fsyncdir => "FSYNCDIR",
            RequestKind::Statfs => "STATFS",
            RequestKind::Setxattr => "SETXATTR",
            RequestKind::Getxattr => "GETXATTR",
            RequestKind::Listxattr => "LISTXATTR",
            RequestKind::Removexattr => "REMOVEXATTR",
            RequestKind::Access => "ACCESS",
            RequestKind::Create => "CREATE",
            RequestKind::Ioctl => "IOCTL",
            RequestKind::Fallocate => "FALLOCATE",
            RequestKind::Lseek => "LSEEK",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One counter alone on a cache line.
#[repr(align(64))]
#[derive(Default)]
struct PaddedCounter(AtomicU64);

/// The live counters of one mount, shared by its worker threads.
pub(crate) struct RequestCounters {
    counters: [PaddedCounter; RequestKind::ALL.len()],
    /// READs whose bytes the engine is reading now, and the most ever at once: whether one
    /// sequential reader's read-ahead keeps several workers copying (docs/FUSE.md, "Sequential
    /// write and read"). Two atomic operations more per READ, next to its copy of up to 1 MiB.
    reads_in_service: PaddedCounter,
    reads_at_once_most: PaddedCounter,
}

impl Default for RequestCounters {
    fn default() -> RequestCounters {
        RequestCounters {
            counters: std::array::from_fn(|_| PaddedCounter::default()),
            reads_in_service: PaddedCounter::default(),
            reads_at_once_most: PaddedCounter::default(),
        }
    }
}

/// A READ being served; dropping it ends its service.
pub(crate) struct ReadInService<'a>(&'a RequestCounters);

impl Drop for ReadInService<'_> {
    fn drop(&mut self) {
        let before = self.0.reads_in_service.0.fetch_sub(1, Ordering::Relaxed);
        assert!(before > 0, "a READ ends only after it began");
    }
}

impl RequestCounters {
    pub(crate) fn count(&self, kind: RequestKind) {
        self.counters[kind.index()].0.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a READ and marks it in service until the returned value is dropped.
    pub(crate) fn read_begins(&self) -> ReadInService<'_> {
        self.count(RequestKind::Read);
        let now = self.reads_in_service.0.fetch_add(1, Ordering::Relaxed) + 1;
        self.reads_at_once_most.0.fetch_max(now, Ordering::Relaxed);
        ReadInService(self)
    }

    /// The most READs served at the same time since the mount began.
    pub(crate) fn reads_at_once_most(&self) -> u64 {
        self.reads_at_once_most.0.load(Ordering::Relaxed)
    }

    pub(crate) fn snapshot(&self) -> RequestCounts {
        let mut counts = [0u64; RequestKind::ALL.len()];
        for (count, counter) in counts.iter_mut().zip(&self.counters) {
            *count = counter.0.load(Ordering::Relaxed);
        }
        RequestCounts { counts }
    }
}

/// Requests served so far, per kind (a snapshot; subtract two with [`RequestCounts::since`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RequestCounts {
    counts: [u64; RequestKind::ALL.len()],
}

impl RequestCounts {
    pub fn get(&self, kind: RequestKind) -> u64 {
        self.counts[kind.index()]
    }

    /// The requests served between `earlier` and this snapshot.
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        let mut counts = [0u64; RequestKind::ALL.len()];
        for ((difference, now), before) in counts.iter_mut().zip(&self.counts).zip(&earlier.counts) {
            assert!(now >= before, "request counters only grow");
            *difference = now - before;
        }
        RequestCounts { counts }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The kinds with at least one request, in protocol order.
    pub fn nonzero(&self) -> impl Iterator<Item = (RequestKind, u64)> + '_ {
        RequestKind::ALL.into_iter().map(|kind| (kind, self.get(kind))).filter(|(_, count)| *count > 0)
    }
}

impl std::fmt::Debug for RequestCounts {
    /// The kinds with requests, by name: `{LOOKUP: 3, CREATE: 3}`.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_map().entries(self.nonzero().map(|(kind, count)| (kind.name(), count))).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_listed_in_index_order_and_named_once() {
        for (position, kind) in RequestKind::ALL.iter().enumerate() {
            assert_eq!(kind.index(), position, "{kind:?}");
        }
        let mut names: Vec<&str> = RequestKind::ALL.iter().map(|kind| kind.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RequestKind::ALL.len());
    }

    #[test]
    fn reads_at_once_keeps_the_most_in_service() {
        let counters = RequestCounters::default();
        assert_eq!(counters.reads_at_once_most(), 0);
        let first = counters.read_begins();
        let second = counters.read_begins();
        drop(first);
        let third = counters.read_begins();
        assert_eq!(counters.reads_at_once_most(), 2);
        drop((second, third));
        let fourth = counters.read_begins();
        assert_eq!(counters.reads_at_once_most(), 2, "one alone after two at once");
        drop(fourth);
        assert_eq!(counters.snapshot().get(RequestKind::Read), 4);
    }

    #[test]
    fn differences_count_only_the_requests_between_snapshots() {
        let counters = RequestCounters::default();
        counters.count(RequestKind::Lookup);
        let before = counters.snapshot();
        counters.count(RequestKind::Create);
        counters.count(RequestKind::Release);
        counters.count(RequestKind::Create);
        let between = counters.snapshot().since(&before);
        assert_eq!(between.get(RequestKind::Lookup), 0);
        assert_eq!(between.get(RequestKind::Create), 2);
        assert_eq!(between.total(), 3);
        let listed: Vec<(RequestKind, u64)> = between.nonzero().collect();
        assert_eq!(listed, vec![(RequestKind::Release, 1), (RequestKind::Create, 2)]);
        assert_eq!(format!("{between:?}"), "{\"RELEASE\": 1, \"CREATE\": 2}");
    }
}
