//! The directory index (issue 9): a cache of directory entries and inode attributes that
//! answers batched lookups, path resolutions, stats and listings, and places creates whose
//! names it finds free (`create_entries`), on the CPU
//! ([`CpuDirectoryIndex`], the twin) or resident on a GPU ([`GpuDirectoryIndex`], a
//! persistent kernel serving a command ring). Both give identical answers; `docs/GPUDIR.md`
//! defines every answer exactly. This folder owns the index types, both engines, the wire
//! format between host and kernel (`wire.rs`), the kernel (`dirindex.cu`) and the benchmark.
//!
//! The index knows nothing of tandemfs: keys are (parent inode, name bytes), values are inode
//! numbers and fixed-size [`IndexAttributes`]. It may start empty and fill as its owner learns
//! directories; a negative answer is given only for a directory marked complete, otherwise the
//! answer is `Unknown` and the caller asks its own engine.

pub mod bench;
pub mod cpu;
pub mod gpu;
pub mod ring;
pub mod wire;

pub use cpu::CpuDirectoryIndex;
pub use gpu::{GpuDirectoryIndex, GpuIndexConfig};

use crate::error::{AccelError, Result};

/// Longest name of one entry, in bytes.
pub const MAXIMUM_NAME_BYTES: usize = 255;
/// Longest path `resolve` walks, in bytes; longer paths answer `NameTooLong`.
pub const MAXIMUM_PATH_BYTES: usize = 4096;
/// Inode numbers the index accepts: 1 ..= this (the GPU tables reserve the rest).
pub const MAXIMUM_INODE: u64 = u64::MAX - 2;

/// What an inode is.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexKind {
    File = 1,
    Directory = 2,
    Symlink = 3,
    Other = 4,
}

impl IndexKind {
    /// The kind for a code read from outside (the GPU), or None for a code that is none.
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(IndexKind::File),
            2 => Some(IndexKind::Directory),
            3 => Some(IndexKind::Symlink),
            4 => Some(IndexKind::Other),
            _ => None,
        }
    }
}

/// The attributes of one inode, laid out exactly as `struct IndexAttributes` in
/// `dirindex.cu` (104 bytes, little-endian, no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IndexAttributes {
    pub inode: u64,
    pub generation: u64,
    pub size_bytes: u64,
    pub blocks_512: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub btime_ns: i64,
    pub rdev: u64,
    /// The directory that holds this one (what `..` leads to); 0 when not a directory.
    pub parent: u64,
    pub kind: IndexKind,
    /// Mode bits 0o7777 (the kind is separate).
    pub permissions: u32,
    pub uid: u32,
    pub gid: u32,
    pub link_count: u32,
    /// Always zero (keeps the record a multiple of 8 bytes).
    pub reserved: u32,
}

/// Size of one [`IndexAttributes`] record, in bytes, here and in the kernel.
pub const ATTRIBUTES_BYTES: usize = 104;
const _: () = assert!(std::mem::size_of::<IndexAttributes>() == ATTRIBUTES_BYTES);
const _: () = assert!(std::mem::align_of::<IndexAttributes>() == 8);

impl IndexAttributes {
    /// A record with the given identity and kind, everything else zero (tests, benchmarks).
    pub fn new(inode: u64, kind: IndexKind, permissions: u32) -> Self {
        IndexAttributes {
            inode,
            generation: 0,
            size_bytes: 0,
            blocks_512: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            btime_ns: 0,
            rdev: 0,
            parent: 0,
            kind,
            permissions,
            uid: 0,
            gid: 0,
            link_count: 1,
            reserved: 0,
        }
    }

    pub fn is_directory(&self) -> bool {
        self.kind == IndexKind::Directory
    }
}

/// Who resolves a path: search permission is checked against these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
}

impl Credentials {
    pub const ROOT: Credentials = Credentials { uid: 0, gid: 0 };
}

/// One change to the index. A batch is applied in order, entirely before any later command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexUpdate {
    /// Adds (or replaces the child of) the entry `name` in `parent`.
    InsertEntry {
        parent: u64,
        name: Vec<u8>,
        child: u64,
    },
    /// Removes the entry if present.
    RemoveEntry {
        parent: u64,
        name: Vec<u8>,
    },
    /// Sets (adds or replaces) the attributes of `attributes.inode`.
    SetAttributes(IndexAttributes),
    /// Forgets the attributes of an inode (its entries and completeness stay).
    RemoveInode(u64),
    /// Declares that the index holds every entry of this directory.
    MarkComplete(u64),
    MarkIncomplete(u64),
    /// Forgets every entry of this directory and marks it not complete.
    DropDirectory(u64),
}

/// One request of `DirectoryIndex::create_entries`: the entry `name` in `parent` for a new
/// inode, `attributes.inode`, with these attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateEntry<'a> {
    pub parent: u64,
    pub name: &'a [u8],
    pub attributes: IndexAttributes,
}

/// What a create found or did (docs/GPUDIR.md, "Creates").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateResult {
    /// The entry and the new inode's attributes are in the index now (a new directory is
    /// complete: it is empty).
    Created,
    /// The index holds an entry of that name already, naming this inode; nothing changed.
    Exists(u64),
    /// The parent is known and is not a directory; nothing changed.
    NotDirectory,
    /// The index cannot tell whether the name is free (the parent is not complete, or the
    /// index overflowed); nothing changed: the owner decides.
    Unknown,
}

/// How `DirectoryIndex::settle_claims` ends the pending claims of a tentative create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// The creates happened (their record is in the log): each claim becomes its entry, with
    /// the request's attributes for the new inode (a new directory complete: it is empty).
    Commit,
    /// The creates did not happen: each claim is forgotten.
    Abort,
}

/// What settling one claim did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleResult {
    /// The claim was pending and is committed or aborted now.
    Settled,
    /// No claim of this (parent, name) for this inode was pending: never claimed, settled
    /// already, or an `apply` of the same key (the back end applying the batch's record before
    /// it was settled) made it an entry or removed it. Nothing changed.
    NotPending,
}

/// What `apply` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub applied: usize,
    /// Inserts or attribute records the index had no room for. After the first, the index
    /// gives no negative answer any more (they become `Unknown`), so it stays a correct cache.
    pub overflowed: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupResult {
    Found(IndexAttributes),
    NotFound,
    /// The index cannot tell: ask the engine.
    Unknown,
    /// The parent is known and is not a directory.
    NotDirectory,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolveResult {
    Found(IndexAttributes),
    NotFound,
    NotDirectory,
    PermissionDenied,
    NameTooLong,
    /// A symlink was met, or some step was `Unknown`: finish this path on the CPU.
    NeedsCpu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatResult {
    Found(IndexAttributes),
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListResult {
    /// Every entry, sorted by name bytes.
    Listed(Vec<(Vec<u8>, u64)>),
    Unknown,
}

/// The directory index, on either engine. Every method is safe to call from many threads.
pub trait DirectoryIndex: Send + Sync {
    fn name(&self) -> String;
    /// The inode paths are resolved from.
    fn root(&self) -> u64;
    fn apply(&self, updates: &[IndexUpdate]) -> Result<ApplyReport>;
    fn lookup(&self, requests: &[(u64, &[u8])]) -> Result<Vec<LookupResult>>;
    fn resolve(&self, paths: &[&[u8]], credentials: Credentials) -> Result<Vec<ResolveResult>>;
    fn stat(&self, inodes: &[u64]) -> Result<Vec<StatResult>>;
    fn list(&self, directory: u64) -> Result<ListResult>;

    /// Creates entries where the index can tell that their names are free: for each request
    /// in order, as if alone, `Exists` when the index holds the name, else `NotDirectory` when
    /// the parent is known not to be a directory, else `Created` (entry and attributes
    /// inserted) when the parent is complete, else `Unknown`. A later request of the batch sees
    /// what earlier ones created. Every `attributes.inode` is new to the batch (refused
    /// otherwise). The GPU engine serves a batch from all its SMs at once.
    fn create_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>>;

    /// A tentative `create_entries` (docs/GPUDIR.md, "Tentative creates"): the same rule and
    /// answers, but where that places an entry (`Created`) it places a *pending claim* of the
    /// name for `attributes.inode` instead, which no query sees (lookups, resolves, lists and
    /// stats answer as if it were not there) and the new inode's attributes are not stored. A
    /// create or claim of the same (parent, name) — a later request of the batch included —
    /// answers `Exists(inode of the claim)`; other keys pass over it. An `apply` that inserts
    /// the key turns the claim into that entry, one that removes it forgets the claim.
    /// `settle_claims` ends claims. The default answers `Unknown` to every request (an index
    /// that cannot claim leaves the decision to its owner); both engines implement it.
    fn claim_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
        check_creates(requests)?;
        Ok(vec![CreateResult::Unknown; requests.len()])
    }

    /// Ends the pending claims of `requests` (the requests of a `claim_entries` call that were
    /// answered `Created`, or any part of them), in request order as if alone: a claim of
    /// (parent, name) for `attributes.inode` is committed (`Settle::Commit`: the entry and
    /// the inode's attributes, from this request, become visible together; a new directory is
    /// complete) or forgotten (`Settle::Abort`) → `Settled`; otherwise `NotPending` and
    /// nothing changes. The default finds nothing pending, as an index whose claims are never
    /// made.
    fn settle_claims(&self, requests: &[CreateEntry<'_>], settle: Settle) -> Result<Vec<SettleResult>> {
        let _ = settle;
        check_creates(requests)?;
        Ok(vec![SettleResult::NotPending; requests.len()])
    }

    /// `lookup` into `answers` (cleared first, one answer per request on `Ok`). An engine may
    /// write the answers in place and reuse the vector's allocation: for a batch of a million
    /// answers (104 MB) allocating and first touching the vector costs more than the lookups.
    fn lookup_into(&self, requests: &[(u64, &[u8])], answers: &mut Vec<LookupResult>) -> Result<()> {
        answers.clear();
        *answers = self.lookup(requests)?;
        Ok(())
    }

    /// `resolve` into `answers`, as `lookup_into`.
    fn resolve_into(&self, paths: &[&[u8]], credentials: Credentials, answers: &mut Vec<ResolveResult>) -> Result<()> {
        answers.clear();
        *answers = self.resolve(paths, credentials)?;
        Ok(())
    }

    /// `stat` into `answers`, as `lookup_into`.
    fn stat_into(&self, inodes: &[u64], answers: &mut Vec<StatResult>) -> Result<()> {
        answers.clear();
        *answers = self.stat(inodes)?;
        Ok(())
    }
}

fn invalid(message: String) -> AccelError {
    AccelError::InvalidArgument(message)
}

pub(crate) fn check_inode(inode: u64) -> Result<()> {
    if inode == 0 || inode > MAXIMUM_INODE {
        return Err(invalid(format!("inode {inode} is outside 1..={MAXIMUM_INODE}")));
    }
    Ok(())
}

/// A name that may be stored: 1..=255 bytes, no '/', not "." or "..".
pub(crate) fn check_entry_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > MAXIMUM_NAME_BYTES {
        return Err(invalid(format!("entry name of {} bytes (want 1..={MAXIMUM_NAME_BYTES})", name.len())));
    }
    if name.contains(&b'/') || name == b"." || name == b".." {
        return Err(invalid(format!("entry name {:?} is not storable", String::from_utf8_lossy(name))));
    }
    Ok(())
}

/// A name that may be looked up: 1..=255 bytes without '/' ("." and ".." are merely absent).
pub(crate) fn check_lookup_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > MAXIMUM_NAME_BYTES || name.contains(&b'/') {
        return Err(invalid(format!("lookup name of {} bytes is not a name", name.len())));
    }
    Ok(())
}

pub(crate) fn check_attributes(attributes: &IndexAttributes) -> Result<()> {
    check_inode(attributes.inode)?;
    if attributes.reserved != 0 || attributes.permissions > 0o7777 {
        return Err(invalid(format!("attributes of inode {} have stray bits", attributes.inode)));
    }
    Ok(())
}

/// Checks every update before any is applied, so a bad batch changes nothing.
pub(crate) fn check_updates(updates: &[IndexUpdate]) -> Result<()> {
    for update in updates {
        match update {
            IndexUpdate::InsertEntry { parent, name, child } => {
                check_inode(*parent)?;
                check_inode(*child)?;
                check_entry_name(name)?;
            }
            IndexUpdate::RemoveEntry { parent, name } => {
                check_inode(*parent)?;
                check_entry_name(name)?;
            }
            IndexUpdate::SetAttributes(attributes) => check_attributes(attributes)?,
            IndexUpdate::RemoveInode(inode)
            | IndexUpdate::MarkComplete(inode)
            | IndexUpdate::MarkIncomplete(inode)
            | IndexUpdate::DropDirectory(inode) => check_inode(*inode)?,
        }
    }
    Ok(())
}

/// Checks a create batch before anything is done: parents, names and attributes as for
/// `apply`, and every new inode once in the batch and not its own parent.
pub(crate) fn check_creates(requests: &[CreateEntry<'_>]) -> Result<()> {
    let mut children: rustc_hash::FxHashSet<u64> = rustc_hash::FxHashSet::default();
    children.reserve(requests.len());
    for request in requests {
        check_inode(request.parent)?;
        check_entry_name(request.name)?;
        check_attributes(&request.attributes)?;
        let child = request.attributes.inode;
        if child == request.parent || !children.insert(child) {
            return Err(invalid(format!("inode {child} is created twice or in itself")));
        }
    }
    Ok(())
}

/// Requests one thread checks at least when a batch's checks are spread over threads.
const CHECKS_PER_THREAD: usize = 1 << 16;
/// Threads a batch's checks use at most.
const MAXIMUM_CHECK_THREADS: usize = 16;

/// Threads that check a batch of `items`: one below two threads' worth of checks, where
/// `cores` is not asked at all (a single request's checks must cost nanoseconds, and asking
/// the core count is a few system calls: see `core_count`).
fn check_threads(items: usize, cores: impl FnOnce() -> usize) -> usize {
    if items < 2 * CHECKS_PER_THREAD {
        return 1;
    }
    (items / CHECKS_PER_THREAD).min(cores()).clamp(1, MAXIMUM_CHECK_THREADS)
}

/// The cores this process may use, asked once. `std::thread::available_parallelism` reads the
/// cgroup's CPU quota from /proc and /sys on every call on Linux (36–50 µs a call on the
/// 2-core VM): asked by the argument check of every batch, it was most of the gap between an
/// empty express command (4.5 µs on the H100 host) and one stat (20.9 µs).
pub(crate) fn core_count() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |cores| cores.get()))
}

/// The index of the first item for which `ok` is false, or None. A batch of a million is
/// scanned by several threads (on one, checking 1M lookup names took 3.5 ms and scanning 1M
/// path lengths 1 ms on the VM, serial work on the calling thread before any answer); the
/// answer is the same as a scan in order.
pub(crate) fn first_failure<R: Sync>(items: &[R], ok: impl Fn(&R) -> bool + Sync) -> Option<usize> {
    let threads = check_threads(items.len(), core_count);
    if threads <= 1 {
        return items.iter().position(|item| !ok(item));
    }
    let chunk = items.len().div_ceil(threads);
    let ok = &ok;
    let firsts: Vec<Option<usize>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .enumerate()
            .map(|(part, items)| {
                scope.spawn(move || items.iter().position(|item| !ok(item)).map(|at| part * chunk + at))
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("check thread panicked")).collect()
    });
    firsts.into_iter().flatten().next()
}

pub(crate) fn check_lookups(requests: &[(u64, &[u8])]) -> Result<()> {
    let check = |(parent, name): &(u64, &[u8])| check_inode(*parent).and_then(|()| check_lookup_name(name));
    match first_failure(requests, |request| check(request).is_ok()) {
        Some(index) => check(&requests[index]),
        None => Ok(()),
    }
}

pub(crate) fn check_inodes(inodes: &[u64]) -> Result<()> {
    match first_failure(inodes, |&inode| check_inode(inode).is_ok()) {
        Some(index) => check_inode(inodes[index]),
        None => Ok(()),
    }
}

/// Whether `credentials` may search (x) the directory with these attributes: uid 0 always;
/// else the owner's, group's or others' x bit, the first class that matches.
pub fn may_search(attributes: &IndexAttributes, credentials: Credentials) -> bool {
    if credentials.uid == 0 {
        return true;
    }
    let bit = if credentials.uid == attributes.uid {
        0o100
    } else if credentials.gid == attributes.gid {
        0o010
    } else {
        0o001
    };
    attributes.permissions & bit != 0
}

/// What the walk of `resolve` needs from an index: the answers of its two questions.
pub(crate) trait WalkSource {
    fn attributes(&self, inode: u64) -> Option<IndexAttributes>;
    fn lookup_one(&self, parent: u64, name: &[u8]) -> LookupResult;
}

/// Answers `paths` as an engine's `resolve`: the paths longer than the walk accepts are
/// `NameTooLong` here, and only the others go to `resolve_short`, in order, so that a kernel
/// never stages a path past `MAXIMUM_PATH_BYTES`. `resolve_short` must answer each path it is
/// given; an engine that answers another count is a device error.
pub fn resolve_within_limit(
    paths: &[&[u8]],
    resolve_short: impl FnOnce(&[&[u8]]) -> Result<Vec<ResolveResult>>,
) -> Result<Vec<ResolveResult>> {
    let mut answers = Vec::new();
    resolve_within_limit_into(paths, &mut answers, |short, answers| {
        *answers = resolve_short(short)?;
        Ok(())
    })?;
    Ok(answers)
}

/// `resolve_within_limit` into `answers` (cleared first). When no path is too long (the
/// common case) the paths go to `resolve_short` as they are and it answers into `answers`
/// directly: nothing is copied or allocated here.
pub fn resolve_within_limit_into(
    paths: &[&[u8]],
    answers: &mut Vec<ResolveResult>,
    resolve_short: impl FnOnce(&[&[u8]], &mut Vec<ResolveResult>) -> Result<()>,
) -> Result<()> {
    answers.clear();
    let counted = |answers: &Vec<ResolveResult>, asked: usize| match answers.len() == asked {
        true => Ok(()),
        false => Err(AccelError::Device(format!("{} answers for {asked} paths", answers.len()))),
    };
    if first_failure(paths, |path| path.len() <= MAXIMUM_PATH_BYTES).is_none() {
        resolve_short(paths, answers)?;
        return counted(answers, paths.len());
    }
    let short: Vec<&[u8]> = paths.iter().copied().filter(|path| path.len() <= MAXIMUM_PATH_BYTES).collect();
    let mut resolved = Vec::new();
    resolve_short(&short, &mut resolved)?;
    counted(&resolved, short.len())?;
    let mut resolved = resolved.into_iter();
    answers.extend(paths.iter().map(|path| match path.len() > MAXIMUM_PATH_BYTES {
        true => ResolveResult::NameTooLong,
        false => resolved.next().expect("counted above"),
    }));
    Ok(())
}

/// The path walk, shared by the CPU twin and mirrored line by line in `dirindex.cu`
/// (`resolve_one`). docs/GPUDIR.md states the rules.
pub(crate) fn resolve_walk(
    source: &impl WalkSource,
    root: u64,
    path: &[u8],
    credentials: Credentials,
) -> ResolveResult {
    if path.len() > MAXIMUM_PATH_BYTES {
        return ResolveResult::NameTooLong;
    }
    if path.is_empty() {
        return ResolveResult::NotFound;
    }
    let mut current = root;
    // Each component is at least one byte, so the walk takes at most path.len() steps.
    for component in path.split(|&byte| byte == b'/').filter(|component| !component.is_empty()) {
        let Some(here) = source.attributes(current) else {
            return ResolveResult::NeedsCpu;
        };
        if here.kind != IndexKind::Directory {
            return ResolveResult::NotDirectory;
        }
        if !may_search(&here, credentials) {
            return ResolveResult::PermissionDenied;
        }
        if component.len() > MAXIMUM_NAME_BYTES {
            return ResolveResult::NameTooLong;
        }
        if component == b"." {
            continue;
        }
        if component == b".." {
            if current != root {
                current = here.parent;
            }
            continue;
        }
        match source.lookup_one(current, component) {
            LookupResult::Found(child) => {
                if child.kind == IndexKind::Symlink {
                    return ResolveResult::NeedsCpu;
                }
                current = child.inode;
            }
            LookupResult::NotFound => return ResolveResult::NotFound,
            LookupResult::Unknown | LookupResult::NotDirectory => return ResolveResult::NeedsCpu,
        }
    }
    let Some(last) = source.attributes(current) else {
        return ResolveResult::NeedsCpu;
    };
    if path.ends_with(b"/") && last.kind != IndexKind::Directory {
        return ResolveResult::NotDirectory;
    }
    ResolveResult::Found(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_batch_checks_on_the_calling_thread_without_asking_the_core_count() {
        let never = || -> usize { panic!("the core count was asked for a small batch") };
        for items in [0, 1, 32, 2 * CHECKS_PER_THREAD - 1] {
            assert_eq!(check_threads(items, never), 1, "{items} items");
        }
        assert_eq!(check_threads(2 * CHECKS_PER_THREAD, || 16), 2);
        assert_eq!(check_threads(1 << 30, || 4), 4);
        assert_eq!(check_threads(1 << 30, || 64), MAXIMUM_CHECK_THREADS);
        assert_eq!(check_threads(1 << 30, || 0), 1);
        assert_eq!(core_count(), core_count());
        assert!(core_count() >= 1);
    }

    #[test]
    fn first_failure_is_the_first_in_request_order() {
        let mut items = vec![1u32; 300_000];
        assert_eq!(first_failure(&items, |&item| item == 1), None);
        for bad in [299_999, 150_000, 70_000, 0] {
            items[bad] = 0;
            assert_eq!(first_failure(&items, |&item| item == 1), Some(bad), "after marking {bad}");
        }
        assert_eq!(first_failure(&items[1..10], |&item| item == 1), None);
        assert_eq!(first_failure(&[] as &[u32], |_| false), None);
        // The refused argument of a whole call is the first bad request's, as a scan in order.
        let names: Vec<Vec<u8>> = (0..200_000).map(|i| format!("n{i}").into_bytes()).collect();
        let mut requests: Vec<(u64, &[u8])> = names.iter().map(|name| (5, &name[..])).collect();
        assert!(check_lookups(&requests).is_ok());
        requests[190_000].1 = b"a/b";
        requests[150_001].0 = 0;
        let error = check_lookups(&requests).unwrap_err().to_string();
        assert!(error.contains("inode 0"), "{error}");
        let mut inodes = vec![3u64; 200_000];
        inodes[199_999] = 0;
        assert!(check_inodes(&inodes).is_err());
    }
}
