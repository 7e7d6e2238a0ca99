//! The CPU twin of the directory index: hash maps behind one reader-writer lock, batches
//! answered by scoped threads over chunks. It defines the answers the GPU engine must give.
//!
//! `apply` holds the lock for writing, so every batch of queries sees the index between two
//! whole applies (the GPU engine gives the same guarantee per command).

use super::{
    check_creates, check_inodes, check_lookups, check_updates, resolve_walk, ApplyReport, CreateEntry, CreateResult,
    Credentials, DirectoryIndex, IndexAttributes, IndexKind, IndexUpdate, ListResult, LookupResult, ResolveResult,
    Settle, SettleResult, StatResult, WalkSource,
};
use crate::error::Result;
use std::collections::HashMap;
use std::sync::RwLock;

/// Requests one thread takes at least (a thread start costs tens of microseconds).
const MINIMUM_REQUESTS_PER_THREAD: usize = 4096;

#[derive(Default)]
struct Directory {
    complete: bool,
    entries: HashMap<Box<[u8]>, u64>,
}

#[derive(Default)]
struct State {
    directories: HashMap<u64, Directory>,
    inodes: HashMap<u64, IndexAttributes>,
    /// Pending claims of tentative creates: parent → name → the inode claimed for. Apart from
    /// `directories`, so that dropping a directory keeps them, as the GPU's pending slots stay
    /// when a drop turns the directory's full slots into tombstones.
    pending: HashMap<u64, HashMap<Box<[u8]>, u64>>,
}

impl WalkSource for State {
    fn attributes(&self, inode: u64) -> Option<IndexAttributes> {
        self.inodes.get(&inode).copied()
    }

    fn lookup_one(&self, parent: u64, name: &[u8]) -> LookupResult {
        let directory = self.directories.get(&parent);
        if let Some(&child) = directory.and_then(|directory| directory.entries.get(name)) {
            return match self.inodes.get(&child) {
                Some(attributes) => LookupResult::Found(*attributes),
                None => LookupResult::Unknown,
            };
        }
        if let Some(attributes) = self.inodes.get(&parent) {
            if attributes.kind != IndexKind::Directory {
                return LookupResult::NotDirectory;
            }
        }
        if directory.is_some_and(|directory| directory.complete) {
            LookupResult::NotFound
        } else {
            LookupResult::Unknown
        }
    }
}

impl State {
    fn apply_one(&mut self, update: &IndexUpdate) {
        match update {
            IndexUpdate::InsertEntry { parent, name, child } => {
                // An insert of a claimed key makes the claim that entry (the kernel fills the
                // pending slot and makes it full).
                self.forget_claim(*parent, name);
                self.directories.entry(*parent).or_default().entries.insert(name.clone().into_boxed_slice(), *child);
            }
            IndexUpdate::RemoveEntry { parent, name } => {
                self.forget_claim(*parent, name);
                if let Some(directory) = self.directories.get_mut(parent) {
                    directory.entries.remove(&name[..]);
                    self.forget_if_empty(*parent);
                }
            }
            IndexUpdate::SetAttributes(attributes) => {
                self.inodes.insert(attributes.inode, *attributes);
            }
            IndexUpdate::RemoveInode(inode) => {
                self.inodes.remove(inode);
            }
            IndexUpdate::MarkComplete(directory) => self.directories.entry(*directory).or_default().complete = true,
            IndexUpdate::MarkIncomplete(directory) => {
                if let Some(state) = self.directories.get_mut(directory) {
                    state.complete = false;
                    self.forget_if_empty(*directory);
                }
            }
            IndexUpdate::DropDirectory(directory) => {
                self.directories.remove(directory);
            }
        }
    }

    /// The claimed inode of (parent, name), if a claim is pending.
    fn claim_of(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.pending.get(&parent).and_then(|names| names.get(name)).copied()
    }

    fn forget_claim(&mut self, parent: u64, name: &[u8]) -> Option<u64> {
        let names = self.pending.get_mut(&parent)?;
        let child = names.remove(name);
        if names.is_empty() {
            self.pending.remove(&parent);
        }
        child
    }

    /// The create rule (docs/GPUDIR.md, "Creates"), one request; `tentative` places a pending
    /// claim instead of the entry and its attributes ("Tentative creates").
    fn create_one(&mut self, request: &CreateEntry<'_>, tentative: bool) -> CreateResult {
        let directory = self.directories.get(&request.parent);
        if let Some(&child) = directory.and_then(|directory| directory.entries.get(request.name)) {
            return CreateResult::Exists(child);
        }
        if let Some(child) = self.claim_of(request.parent, request.name) {
            return CreateResult::Exists(child);
        }
        if self.inodes.get(&request.parent).is_some_and(|parent| parent.kind != IndexKind::Directory) {
            return CreateResult::NotDirectory;
        }
        if !directory.is_some_and(|directory| directory.complete) {
            return CreateResult::Unknown;
        }
        let child = request.attributes.inode;
        if tentative {
            let names = self.pending.entry(request.parent).or_default();
            names.insert(request.name.to_vec().into_boxed_slice(), child);
            return CreateResult::Created;
        }
        let entries = &mut self.directories.get_mut(&request.parent).expect("complete, so present").entries;
        entries.insert(request.name.to_vec().into_boxed_slice(), child);
        self.inodes.insert(child, request.attributes);
        if request.attributes.kind == IndexKind::Directory {
            self.directories.entry(child).or_default().complete = true;
        }
        CreateResult::Created
    }

    /// The settle rule ("Tentative creates"), one request: the claim of (parent, name) for the
    /// request's inode is committed (entry, attributes, a new directory complete) or forgotten.
    fn settle_one(&mut self, request: &CreateEntry<'_>, settle: Settle) -> SettleResult {
        let child = request.attributes.inode;
        if self.claim_of(request.parent, request.name) != Some(child) {
            return SettleResult::NotPending;
        }
        self.forget_claim(request.parent, request.name);
        if settle == Settle::Commit {
            let directory = self.directories.entry(request.parent).or_default();
            directory.entries.insert(request.name.to_vec().into_boxed_slice(), child);
            self.inodes.insert(child, request.attributes);
            if request.attributes.kind == IndexKind::Directory {
                self.directories.entry(child).or_default().complete = true;
            }
        }
        SettleResult::Settled
    }

    /// An incomplete directory without entries says nothing; keep the map small.
    fn forget_if_empty(&mut self, directory: u64) {
        if self.directories.get(&directory).is_some_and(|state| !state.complete && state.entries.is_empty()) {
            self.directories.remove(&directory);
        }
    }

    fn list(&self, directory: u64) -> ListResult {
        match self.directories.get(&directory) {
            Some(state) if state.complete => {
                let mut entries: Vec<(Vec<u8>, u64)> =
                    state.entries.iter().map(|(name, &child)| (name.to_vec(), child)).collect();
                entries.sort_unstable();
                ListResult::Listed(entries)
            }
            _ => ListResult::Unknown,
        }
    }
}

/// The CPU directory index.
pub struct CpuDirectoryIndex {
    root: u64,
    threads: usize,
    state: RwLock<State>,
}

impl CpuDirectoryIndex {
    /// An empty index rooted at `root`, answering batches on `threads` threads (0 = every core).
    pub fn new(root: u64, threads: usize) -> Result<Self> {
        super::check_inode(root)?;
        let threads =
            if threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { threads };
        Ok(Self { root, threads, state: RwLock::new(State::default()) })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Entries and attribute records held (for sizing the GPU engine to the same tree).
    pub fn counts(&self) -> (usize, usize) {
        let state = self.state.read().expect("index lock poisoned");
        (state.directories.values().map(|directory| directory.entries.len()).sum(), state.inodes.len())
    }

    /// Runs `answer` over `requests` on up to `self.threads` threads into `out` (cleared
    /// first), results in request order. Each thread writes its answers in place: no vector
    /// per thread and no gathering copy, which for a million answers (104 MB) cost more than
    /// the answers themselves.
    fn parallel_into<R: Sync, T: Copy + Send>(
        &self,
        requests: &[R],
        answer: impl Fn(&State, &R) -> T + Sync,
        out: &mut Vec<T>,
    ) {
        out.clear();
        let state = self.state.read().expect("index lock poisoned");
        let threads = self.threads.min(requests.len() / MINIMUM_REQUESTS_PER_THREAD).max(1);
        if threads == 1 {
            out.extend(requests.iter().map(|request| answer(&state, request)));
            return;
        }
        out.reserve(requests.len());
        let chunk = requests.len().div_ceil(threads);
        let state: &State = &state;
        let answer = &answer;
        let targets = out.spare_capacity_mut()[..requests.len()].chunks_mut(chunk);
        std::thread::scope(|scope| {
            for (part, target) in requests.chunks(chunk).zip(targets) {
                scope.spawn(move || {
                    for (request, slot) in part.iter().zip(target.iter_mut()) {
                        slot.write(answer(state, request));
                    }
                });
            }
        });
        // SAFETY: the scope joined every thread (a panic in one propagates before this line);
        // the chunks of `requests` and of the target zip one to one, and each thread wrote
        // every slot of its target chunk.
        unsafe { out.set_len(requests.len()) };
    }

    fn parallel<R: Sync, T: Copy + Send>(&self, requests: &[R], answer: impl Fn(&State, &R) -> T + Sync) -> Vec<T> {
        let mut out = Vec::new();
        self.parallel_into(requests, answer, &mut out);
        out
    }
}

impl DirectoryIndex for CpuDirectoryIndex {
    fn name(&self) -> String {
        format!("cpu twin ({} threads)", self.threads)
    }

    fn root(&self) -> u64 {
        self.root
    }

    fn apply(&self, updates: &[IndexUpdate]) -> Result<ApplyReport> {
        check_updates(updates)?;
        let mut state = self.state.write().expect("index lock poisoned");
        for update in updates {
            state.apply_one(update);
        }
        Ok(ApplyReport { applied: updates.len(), overflowed: 0 })
    }

    /// In request order under the write lock: the twin defines the answers, the GPU engine
    /// gives the same ones from many SMs at once.
    fn create_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
        check_creates(requests)?;
        let mut state = self.state.write().expect("index lock poisoned");
        Ok(requests.iter().map(|request| state.create_one(request, false)).collect())
    }

    fn claim_entries(&self, requests: &[CreateEntry<'_>]) -> Result<Vec<CreateResult>> {
        check_creates(requests)?;
        let mut state = self.state.write().expect("index lock poisoned");
        Ok(requests.iter().map(|request| state.create_one(request, true)).collect())
    }

    fn settle_claims(&self, requests: &[CreateEntry<'_>], settle: Settle) -> Result<Vec<SettleResult>> {
        check_creates(requests)?;
        let mut state = self.state.write().expect("index lock poisoned");
        Ok(requests.iter().map(|request| state.settle_one(request, settle)).collect())
    }

    fn lookup(&self, requests: &[(u64, &[u8])]) -> Result<Vec<LookupResult>> {
        check_lookups(requests)?;
        Ok(self.parallel(requests, |state, (parent, name)| state.lookup_one(*parent, name)))
    }

    fn resolve(&self, paths: &[&[u8]], credentials: Credentials) -> Result<Vec<ResolveResult>> {
        let root = self.root;
        Ok(self.parallel(paths, |state, path| resolve_walk(state, root, path, credentials)))
    }

    fn stat(&self, inodes: &[u64]) -> Result<Vec<StatResult>> {
        check_inodes(inodes)?;
        Ok(self.parallel(inodes, stat_one))
    }

    fn list(&self, directory: u64) -> Result<ListResult> {
        super::check_inode(directory)?;
        Ok(self.state.read().expect("index lock poisoned").list(directory))
    }

    fn lookup_into(&self, requests: &[(u64, &[u8])], answers: &mut Vec<LookupResult>) -> Result<()> {
        answers.clear();
        check_lookups(requests)?;
        self.parallel_into(requests, |state, (parent, name)| state.lookup_one(*parent, name), answers);
        Ok(())
    }

    fn resolve_into(&self, paths: &[&[u8]], credentials: Credentials, answers: &mut Vec<ResolveResult>) -> Result<()> {
        let root = self.root;
        self.parallel_into(paths, |state, path| resolve_walk(state, root, path, credentials), answers);
        Ok(())
    }

    fn stat_into(&self, inodes: &[u64], answers: &mut Vec<StatResult>) -> Result<()> {
        answers.clear();
        check_inodes(inodes)?;
        self.parallel_into(inodes, stat_one, answers);
        Ok(())
    }
}

fn stat_one(state: &State, inode: &u64) -> StatResult {
    match state.inodes.get(inode) {
        Some(attributes) => StatResult::Found(*attributes),
        None => StatResult::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dirindex::{MAXIMUM_NAME_BYTES, MAXIMUM_PATH_BYTES};

    const ROOT: u64 = 1;

    fn directory(inode: u64, parent: u64, permissions: u32) -> IndexAttributes {
        let mut attributes = IndexAttributes::new(inode, IndexKind::Directory, permissions);
        attributes.parent = parent;
        attributes.uid = 1000;
        attributes.gid = 100;
        attributes
    }

    fn file(inode: u64) -> IndexAttributes {
        let mut attributes = IndexAttributes::new(inode, IndexKind::File, 0o644);
        attributes.size_bytes = inode * 10;
        attributes
    }

    fn insert(parent: u64, name: &str, child: u64) -> IndexUpdate {
        IndexUpdate::InsertEntry { parent, name: name.as_bytes().to_vec(), child }
    }

    /// /a (dir 2, complete) holding f (file 3), l (symlink 4), s (dir 5, mode 0o700, complete,
    /// holding g = file 6); /u (dir 7, incomplete, nothing known inside).
    fn sample() -> CpuDirectoryIndex {
        let index = CpuDirectoryIndex::new(ROOT, 2).unwrap();
        let updates = vec![
            IndexUpdate::SetAttributes(directory(ROOT, ROOT, 0o755)),
            IndexUpdate::SetAttributes(directory(2, ROOT, 0o755)),
            IndexUpdate::SetAttributes(file(3)),
            IndexUpdate::SetAttributes(IndexAttributes::new(4, IndexKind::Symlink, 0o777)),
            IndexUpdate::SetAttributes(directory(5, 2, 0o700)),
            IndexUpdate::SetAttributes(file(6)),
            IndexUpdate::SetAttributes(directory(7, ROOT, 0o755)),
            insert(ROOT, "a", 2),
            insert(ROOT, "u", 7),
            insert(2, "f", 3),
            insert(2, "l", 4),
            insert(2, "s", 5),
            insert(5, "g", 6),
            IndexUpdate::MarkComplete(ROOT),
            IndexUpdate::MarkComplete(2),
            IndexUpdate::MarkComplete(5),
        ];
        assert_eq!(index.apply(&updates).unwrap(), ApplyReport { applied: updates.len(), overflowed: 0 });
        index
    }

    fn resolve_one(index: &CpuDirectoryIndex, path: &str, credentials: Credentials) -> ResolveResult {
        index.resolve(&[path.as_bytes()], credentials).unwrap()[0]
    }

    #[test]
    fn lookups_answer_found_missing_unknown_and_not_directory() {
        let index = sample();
        let answers = index
            .lookup(&[(2, b"f"), (2, b"nope"), (7, b"x"), (3, b"x"), (99, b"x"), (2, b"."), (ROOT, b"a")])
            .unwrap();
        assert_eq!(answers[0], LookupResult::Found(file(3)));
        assert_eq!(answers[1], LookupResult::NotFound, "complete directory");
        assert_eq!(answers[2], LookupResult::Unknown, "incomplete directory");
        assert_eq!(answers[3], LookupResult::NotDirectory, "parent is a file");
        assert_eq!(answers[4], LookupResult::Unknown, "parent never seen");
        assert_eq!(answers[5], LookupResult::NotFound, "'.' is never an entry");
        assert_eq!(answers[6], LookupResult::Found(directory(2, ROOT, 0o755)));
    }

    #[test]
    fn a_known_entry_without_attributes_is_unknown() {
        let index = sample();
        index.apply(&[insert(2, "new", 50)]).unwrap();
        assert_eq!(index.lookup(&[(2, b"new")]).unwrap()[0], LookupResult::Unknown);
        index.apply(&[IndexUpdate::SetAttributes(file(50))]).unwrap();
        assert_eq!(index.lookup(&[(2, b"new")]).unwrap()[0], LookupResult::Found(file(50)));
        index.apply(&[IndexUpdate::RemoveInode(50)]).unwrap();
        assert_eq!(index.lookup(&[(2, b"new")]).unwrap()[0], LookupResult::Unknown);
        assert_eq!(index.stat(&[50, 3]).unwrap(), vec![StatResult::Unknown, StatResult::Found(file(3))]);
    }

    #[test]
    fn updates_apply_in_order() {
        let index = sample();
        let updates = vec![
            insert(2, "x", 3),
            IndexUpdate::RemoveEntry { parent: 2, name: b"x".to_vec() },
            insert(2, "x", 6),
            insert(2, "x", 5),
            IndexUpdate::MarkIncomplete(2),
            IndexUpdate::MarkComplete(2),
        ];
        index.apply(&updates).unwrap();
        assert_eq!(index.lookup(&[(2, b"x")]).unwrap()[0], LookupResult::Found(directory(5, 2, 0o700)));
        index.apply(&[IndexUpdate::RemoveEntry { parent: 2, name: b"x".to_vec() }]).unwrap();
        assert_eq!(index.lookup(&[(2, b"x")]).unwrap()[0], LookupResult::NotFound);
        index.apply(&[IndexUpdate::MarkIncomplete(2)]).unwrap();
        assert_eq!(index.lookup(&[(2, b"x")]).unwrap()[0], LookupResult::Unknown);
        assert_eq!(index.lookup(&[(2, b"f")]).unwrap()[0], LookupResult::Found(file(3)), "entries stay");
    }

    #[test]
    fn dropping_a_directory_forgets_its_entries_only() {
        let index = sample();
        index.apply(&[IndexUpdate::DropDirectory(2)]).unwrap();
        assert_eq!(index.lookup(&[(2, b"f")]).unwrap()[0], LookupResult::Unknown);
        assert_eq!(index.list(2).unwrap(), ListResult::Unknown);
        assert_eq!(index.stat(&[2, 3]).unwrap()[1], StatResult::Found(file(3)), "attributes stay");
        assert_eq!(index.lookup(&[(5, b"g")]).unwrap()[0], LookupResult::Found(file(6)), "other directories stay");
    }

    #[test]
    fn lists_are_sorted_and_only_for_complete_directories() {
        let index = sample();
        let expected = vec![(b"f".to_vec(), 3), (b"l".to_vec(), 4), (b"s".to_vec(), 5)];
        assert_eq!(index.list(2).unwrap(), ListResult::Listed(expected));
        assert_eq!(index.list(7).unwrap(), ListResult::Unknown);
        assert_eq!(index.list(3).unwrap(), ListResult::Unknown, "a file is never complete");
        index.apply(&[IndexUpdate::MarkComplete(7)]).unwrap();
        assert_eq!(index.list(7).unwrap(), ListResult::Listed(Vec::new()));
    }

    #[test]
    fn resolve_walks_dot_dotdot_and_empty_components() {
        let index = sample();
        let me = Credentials { uid: 1000, gid: 100 };
        assert_eq!(resolve_one(&index, "/a/f", me), ResolveResult::Found(file(3)));
        assert_eq!(resolve_one(&index, "a//./f", me), ResolveResult::Found(file(3)));
        assert_eq!(resolve_one(&index, "/a/s/../f", me), ResolveResult::Found(file(3)));
        assert_eq!(resolve_one(&index, "/../../a/./f", me), ResolveResult::Found(file(3)), ".. at the root stays");
        assert_eq!(resolve_one(&index, "/", me), ResolveResult::Found(directory(ROOT, ROOT, 0o755)));
        assert_eq!(resolve_one(&index, "", me), ResolveResult::NotFound);
        assert_eq!(resolve_one(&index, "/a/missing", me), ResolveResult::NotFound);
        assert_eq!(resolve_one(&index, "/a/missing/deeper", me), ResolveResult::NotFound);
        assert_eq!(resolve_one(&index, "/a/f/x", me), ResolveResult::NotDirectory);
        assert_eq!(resolve_one(&index, "/a/f/.", me), ResolveResult::NotDirectory);
        assert_eq!(resolve_one(&index, "/a/f/", me), ResolveResult::NotDirectory, "trailing slash wants a dir");
        assert_eq!(resolve_one(&index, "/a/s/", me), ResolveResult::Found(directory(5, 2, 0o700)));
        assert_eq!(resolve_one(&index, "/a/l", me), ResolveResult::NeedsCpu, "symlink last");
        assert_eq!(resolve_one(&index, "/a/l/x", me), ResolveResult::NeedsCpu, "symlink inside");
        assert_eq!(resolve_one(&index, "/u/x", me), ResolveResult::NeedsCpu, "incomplete directory");
        assert_eq!(resolve_one(&index, "/u", me), ResolveResult::Found(directory(7, ROOT, 0o755)));
    }

    #[test]
    fn resolve_checks_search_permission_on_every_directory_walked() {
        let index = sample();
        let owner = Credentials { uid: 1000, gid: 100 };
        let group = Credentials { uid: 2000, gid: 100 };
        let other = Credentials { uid: 2000, gid: 200 };
        // /a/s is 0o700 owned by 1000:100.
        assert_eq!(resolve_one(&index, "/a/s/g", owner), ResolveResult::Found(file(6)));
        assert_eq!(resolve_one(&index, "/a/s/g", group), ResolveResult::PermissionDenied);
        assert_eq!(resolve_one(&index, "/a/s/g", other), ResolveResult::PermissionDenied);
        assert_eq!(resolve_one(&index, "/a/s/g", Credentials::ROOT), ResolveResult::Found(file(6)));
        // Naming the directory itself needs no search in it; "." inside it does.
        assert_eq!(resolve_one(&index, "/a/s", other), ResolveResult::Found(directory(5, 2, 0o700)));
        assert_eq!(resolve_one(&index, "/a/s/.", other), ResolveResult::PermissionDenied);
        assert_eq!(resolve_one(&index, "/a/s/missing", other), ResolveResult::PermissionDenied);
        // Group class only when the uid differs: an owner without x is refused even if the group has it.
        index.apply(&[IndexUpdate::SetAttributes(directory(5, 2, 0o070))]).unwrap();
        assert_eq!(resolve_one(&index, "/a/s/g", owner), ResolveResult::PermissionDenied);
        assert_eq!(resolve_one(&index, "/a/s/g", group), ResolveResult::Found(file(6)));
    }

    #[test]
    fn resolve_limits_names_and_paths() {
        let index = sample();
        let longest = "n".repeat(MAXIMUM_NAME_BYTES);
        let too_long = "n".repeat(MAXIMUM_NAME_BYTES + 1);
        index.apply(&[IndexUpdate::SetAttributes(file(70)), insert(2, &longest, 70)]).unwrap();
        assert_eq!(resolve_one(&index, &format!("/a/{longest}"), Credentials::ROOT), ResolveResult::Found(file(70)));
        assert_eq!(resolve_one(&index, &format!("/a/{too_long}"), Credentials::ROOT), ResolveResult::NameTooLong);
        assert_eq!(resolve_one(&index, &format!("/a/f/{too_long}"), Credentials::ROOT), ResolveResult::NotDirectory);
        let deep = "./".repeat(MAXIMUM_PATH_BYTES / 2 - 2) + "a/f";
        assert!(deep.len() <= MAXIMUM_PATH_BYTES);
        assert_eq!(resolve_one(&index, &deep, Credentials::ROOT), ResolveResult::Found(file(3)));
        let deeper = "/".repeat(MAXIMUM_PATH_BYTES) + "a";
        assert_eq!(resolve_one(&index, &deeper, Credentials::ROOT), ResolveResult::NameTooLong);
    }

    #[test]
    fn bad_arguments_are_refused_before_anything_changes() {
        let index = sample();
        let bad = vec![insert(2, "ok", 3), IndexUpdate::InsertEntry { parent: 2, name: b"a/b".to_vec(), child: 3 }];
        assert!(index.apply(&bad).is_err());
        assert_eq!(index.lookup(&[(2, b"ok")]).unwrap()[0], LookupResult::NotFound, "nothing applied");
        for update in [
            insert(0, "x", 3),
            insert(2, "x", u64::MAX),
            insert(2, "", 3),
            insert(2, ".", 3),
            insert(2, "..", 3),
            IndexUpdate::InsertEntry { parent: 2, name: vec![b'n'; MAXIMUM_NAME_BYTES + 1], child: 3 },
            IndexUpdate::SetAttributes(IndexAttributes { reserved: 1, ..file(3) }),
            IndexUpdate::SetAttributes(IndexAttributes::new(3, IndexKind::File, 0o10000)),
            IndexUpdate::MarkComplete(0),
        ] {
            assert!(index.apply(std::slice::from_ref(&update)).is_err(), "{update:?} accepted");
        }
        assert!(index.lookup(&[(2, b"")]).is_err());
        assert!(index.lookup(&[(2, b"a/b")]).is_err());
        assert!(index.stat(&[0]).is_err());
        assert!(index.list(u64::MAX).is_err());
        assert!(CpuDirectoryIndex::new(0, 1).is_err());
    }

    /// Threads split big batches; the answers must not depend on how.
    #[test]
    fn creates_follow_the_rule_in_request_order() {
        let index = sample();
        let made =
            |inode: u64, kind: IndexKind| IndexAttributes { parent: 2, ..IndexAttributes::new(inode, kind, 0o755) };
        let requests = [
            CreateEntry { parent: 2, name: b"fresh", attributes: made(100, IndexKind::Directory) },
            CreateEntry { parent: 2, name: b"fresh", attributes: made(101, IndexKind::File) },
            CreateEntry { parent: 100, name: b"inside", attributes: made(102, IndexKind::File) },
            CreateEntry { parent: 777, name: b"x", attributes: made(103, IndexKind::File) },
        ];
        let answers = index.create_entries(&requests).unwrap();
        assert_eq!(
            answers[..4],
            [CreateResult::Created, CreateResult::Exists(100), CreateResult::Created, CreateResult::Unknown]
        );
        assert_eq!(index.lookup(&[(2, b"fresh"), (100, b"inside"), (100, b"no")]).unwrap()[2], LookupResult::NotFound);
        assert!(
            matches!(index.lookup(&[(100, b"inside")]).unwrap()[0], LookupResult::Found(found) if found.inode == 102)
        );
        // A file is not a directory; a refused batch changes nothing.
        let under_file = [CreateEntry { parent: 102, name: b"y", attributes: made(104, IndexKind::File) }];
        assert_eq!(index.create_entries(&under_file).unwrap(), [CreateResult::NotDirectory]);
        let twice = [
            CreateEntry { parent: 2, name: b"a", attributes: made(105, IndexKind::File) },
            CreateEntry { parent: 2, name: b"b", attributes: made(105, IndexKind::File) },
        ];
        assert!(index.create_entries(&twice).is_err());
        assert_eq!(index.lookup(&[(2, b"a")]).unwrap()[0], LookupResult::NotFound);
    }

    /// Tentative creates: a claim answers as a create does but shows nothing until it is
    /// committed; a claim of the same name answers Exists of it; an abort forgets it; an apply
    /// of the key takes it over; a drop of the directory keeps it.
    #[test]
    fn claims_are_invisible_until_settled_and_an_apply_takes_them_over() {
        let index = sample();
        let made =
            |inode: u64, kind: IndexKind| IndexAttributes { parent: 2, ..IndexAttributes::new(inode, kind, 0o755) };
        let claims = [
            CreateEntry { parent: 2, name: b"new-dir", attributes: made(100, IndexKind::Directory) },
            CreateEntry { parent: 2, name: b"new-dir", attributes: made(101, IndexKind::File) },
            CreateEntry { parent: 100, name: b"inside", attributes: made(102, IndexKind::File) },
            CreateEntry { parent: 2, name: b"f", attributes: made(103, IndexKind::File) },
            CreateEntry { parent: 2, name: b"gone", attributes: made(104, IndexKind::File) },
            CreateEntry { parent: 2, name: b"taken", attributes: made(105, IndexKind::File) },
            CreateEntry { parent: 5, name: b"kept", attributes: made(106, IndexKind::File) },
        ];
        let answers = index.claim_entries(&claims).unwrap();
        // The directory claimed first is not complete yet, so a name in it is Unknown.
        assert_eq!(
            answers,
            [
                CreateResult::Created,
                CreateResult::Exists(100),
                CreateResult::Unknown,
                CreateResult::Exists(3),
                CreateResult::Created,
                CreateResult::Created,
                CreateResult::Created
            ]
        );
        let lookups: [(u64, &[u8]); 4] = [(2, b"new-dir"), (2, b"gone"), (2, b"taken"), (5, b"kept")];
        assert_eq!(index.lookup(&lookups).unwrap(), [LookupResult::NotFound; 4]);
        assert_eq!(index.stat(&[100, 104]).unwrap(), [StatResult::Unknown; 2]);
        assert!(matches!(index.list(2).unwrap(), ListResult::Listed(entries) if entries.len() == 3));
        // A plain create of a claimed name answers the claim too.
        let again = [CreateEntry { parent: 2, name: b"gone", attributes: made(107, IndexKind::File) }];
        assert_eq!(index.create_entries(&again).unwrap(), [CreateResult::Exists(104)]);
        // The feed gets to "taken" first (another child); the directory of "kept" is dropped.
        let updates = [insert(2, "taken", 108), IndexUpdate::SetAttributes(file(108)), IndexUpdate::DropDirectory(5)];
        index.apply(&updates).unwrap();
        let commit = [claims[0], claims[5], claims[6]];
        assert_eq!(
            index.settle_claims(&commit, Settle::Commit).unwrap(),
            [SettleResult::Settled, SettleResult::NotPending, SettleResult::Settled]
        );
        assert_eq!(index.settle_claims(&[claims[4]], Settle::Abort).unwrap(), [SettleResult::Settled]);
        // A claim is settled once; one of another inode is not this claim.
        assert_eq!(index.settle_claims(&[claims[4]], Settle::Commit).unwrap(), [SettleResult::NotPending]);
        assert_eq!(index.settle_claims(&[claims[1]], Settle::Commit).unwrap(), [SettleResult::NotPending]);
        let found = index.lookup(&lookups).unwrap();
        assert!(matches!(found[0], LookupResult::Found(attributes) if attributes.inode == 100));
        assert_eq!(found[1], LookupResult::NotFound);
        assert!(matches!(found[2], LookupResult::Found(attributes) if attributes.inode == 108));
        // Committed into a dropped (incomplete) directory: there, and the directory unknown.
        assert!(matches!(found[3], LookupResult::Found(attributes) if attributes.inode == 106));
        assert_eq!(index.list(5).unwrap(), ListResult::Unknown);
        // The committed directory is complete (empty): a create in it is placed now.
        assert_eq!(index.list(100).unwrap(), ListResult::Listed(Vec::new()));
        assert_eq!(index.create_entries(&[claims[2]]).unwrap(), [CreateResult::Created]);
    }

    #[test]
    fn parallel_batches_equal_one_by_one_answers() {
        let index = CpuDirectoryIndex::new(ROOT, 4).unwrap();
        let mut updates =
            vec![IndexUpdate::SetAttributes(directory(ROOT, ROOT, 0o755)), IndexUpdate::MarkComplete(ROOT)];
        for child in 2..20_000u64 {
            updates.push(insert(ROOT, &format!("f{child}"), child));
            if child % 3 != 0 {
                updates.push(IndexUpdate::SetAttributes(file(child)));
            }
        }
        index.apply(&updates).unwrap();
        let names: Vec<String> = (0..25_000u64).map(|i| format!("f{i}")).collect();
        let requests: Vec<(u64, &[u8])> = names.iter().map(|name| (ROOT, name.as_bytes())).collect();
        let batch = index.lookup(&requests).unwrap();
        for (request, answer) in requests.iter().zip(&batch) {
            assert_eq!(*answer, index.lookup(std::slice::from_ref(request)).unwrap()[0]);
        }
        assert!(batch.iter().any(|answer| matches!(answer, LookupResult::Found(_))));
        assert!(batch.contains(&LookupResult::Unknown));
        assert!(batch.contains(&LookupResult::NotFound));
        let paths: Vec<Vec<u8>> = names.iter().map(|name| format!("/{name}").into_bytes()).collect();
        let path_slices: Vec<&[u8]> = paths.iter().map(|path| &path[..]).collect();
        let resolved = index.resolve(&path_slices, Credentials::ROOT).unwrap();
        for (lookup, resolve) in batch.iter().zip(&resolved) {
            let expected = match lookup {
                LookupResult::Found(attributes) => ResolveResult::Found(*attributes),
                LookupResult::NotFound => ResolveResult::NotFound,
                _ => ResolveResult::NeedsCpu,
            };
            assert_eq!(*resolve, expected);
        }
        assert_eq!(index.counts(), (19_998, 1 + 13_332));
    }
}
