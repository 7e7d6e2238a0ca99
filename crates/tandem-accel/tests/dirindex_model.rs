//! Property test of the CPU twin (the definition the GPU engine is held to) against a second,
//! independent reading of docs/GPUDIR.md's rules: ordered maps, no sharing of code with
//! `cpu.rs` or `resolve_walk`, random updates and random questions. Seeded; `TANDEM_SEED=N`
//! repeats one seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use tandem_accel::dirindex::{
    CpuDirectoryIndex, CreateEntry, CreateResult, Credentials, DirectoryIndex, IndexAttributes, IndexKind, IndexUpdate,
    ListResult, LookupResult, ResolveResult, Settle, SettleResult, StatResult,
};

const ROOT: u64 = 1;
/// Small inode and name spaces, so that updates collide and questions hit.
const INODES: u64 = 40;
const NAMES: [&[u8]; 6] = [b"a", b"b", b"cc", b"d.d", b"..x", b"e"];

/// The rules, written out plainly.
#[derive(Default)]
struct Model {
    entries: BTreeMap<(u64, Vec<u8>), u64>,
    attributes: BTreeMap<u64, IndexAttributes>,
    complete: BTreeSet<u64>,
    /// Claims of tentative creates: (parent, name) → the inode claimed for.
    pending: BTreeMap<(u64, Vec<u8>), u64>,
}

impl Model {
    fn apply(&mut self, update: &IndexUpdate) {
        match update {
            IndexUpdate::InsertEntry { parent, name, child } => {
                // An insert of a claimed key takes the claim over.
                self.pending.remove(&(*parent, name.clone()));
                self.entries.insert((*parent, name.clone()), *child);
            }
            IndexUpdate::RemoveEntry { parent, name } => {
                self.pending.remove(&(*parent, name.clone()));
                self.entries.remove(&(*parent, name.clone()));
            }
            IndexUpdate::SetAttributes(attributes) => {
                self.attributes.insert(attributes.inode, *attributes);
            }
            IndexUpdate::RemoveInode(inode) => {
                self.attributes.remove(inode);
            }
            IndexUpdate::MarkComplete(directory) => {
                self.complete.insert(*directory);
            }
            IndexUpdate::MarkIncomplete(directory) => {
                self.complete.remove(directory);
            }
            IndexUpdate::DropDirectory(directory) => {
                self.entries.retain(|(parent, _), _| parent != directory);
                self.complete.remove(directory);
            }
        }
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> LookupResult {
        if let Some(child) = self.entries.get(&(parent, name.to_vec())) {
            return self.attributes.get(child).map_or(LookupResult::Unknown, |a| LookupResult::Found(*a));
        }
        match self.attributes.get(&parent) {
            Some(a) if a.kind != IndexKind::Directory => LookupResult::NotDirectory,
            _ if self.complete.contains(&parent) => LookupResult::NotFound,
            _ => LookupResult::Unknown,
        }
    }

    fn searchable(a: &IndexAttributes, who: Credentials) -> bool {
        let class_shift = if who.uid == 0 {
            return true;
        } else if who.uid == a.uid {
            6
        } else if who.gid == a.gid {
            3
        } else {
            0
        };
        (a.permissions >> class_shift) & 1 == 1
    }

    fn resolve(&self, path: &[u8], who: Credentials) -> ResolveResult {
        if path.len() > 4096 {
            return ResolveResult::NameTooLong;
        }
        if path.is_empty() {
            return ResolveResult::NotFound;
        }
        let mut components: Vec<Vec<u8>> = vec![Vec::new()];
        for &byte in path {
            if byte == b'/' {
                components.push(Vec::new());
            } else {
                components.last_mut().unwrap().push(byte);
            }
        }
        let mut at = ROOT;
        for component in components.into_iter().filter(|c| !c.is_empty()) {
            let Some(here) = self.attributes.get(&at) else { return ResolveResult::NeedsCpu };
            if here.kind != IndexKind::Directory {
                return ResolveResult::NotDirectory;
            }
            if !Self::searchable(here, who) {
                return ResolveResult::PermissionDenied;
            }
            if component.len() > 255 {
                return ResolveResult::NameTooLong;
            }
            match &component[..] {
                b"." => {}
                b".." => at = if at == ROOT { ROOT } else { here.parent },
                name => match self.lookup(at, name) {
                    LookupResult::Found(child) if child.kind == IndexKind::Symlink => return ResolveResult::NeedsCpu,
                    LookupResult::Found(child) => at = child.inode,
                    LookupResult::NotFound => return ResolveResult::NotFound,
                    _ => return ResolveResult::NeedsCpu,
                },
            }
        }
        match self.attributes.get(&at) {
            None => ResolveResult::NeedsCpu,
            Some(end) if path[path.len() - 1] == b'/' && end.kind != IndexKind::Directory => {
                ResolveResult::NotDirectory
            }
            Some(end) => ResolveResult::Found(*end),
        }
    }

    /// The create rule; `tentative` claims instead of placing (docs/GPUDIR.md, "Creates",
    /// "Tentative creates").
    fn create(&mut self, parent: u64, name: &[u8], attributes: &IndexAttributes, tentative: bool) -> CreateResult {
        let key = (parent, name.to_vec());
        if let Some(child) = self.entries.get(&key).or(self.pending.get(&key)) {
            return CreateResult::Exists(*child);
        }
        if self.attributes.get(&parent).is_some_and(|a| a.kind != IndexKind::Directory) {
            return CreateResult::NotDirectory;
        }
        if !self.complete.contains(&parent) {
            return CreateResult::Unknown;
        }
        if tentative {
            self.pending.insert(key, attributes.inode);
        } else {
            self.place(key, attributes);
        }
        CreateResult::Created
    }

    fn place(&mut self, key: (u64, Vec<u8>), attributes: &IndexAttributes) {
        self.entries.insert(key, attributes.inode);
        self.attributes.insert(attributes.inode, *attributes);
        if attributes.kind == IndexKind::Directory {
            self.complete.insert(attributes.inode);
        }
    }

    fn settle(&mut self, parent: u64, name: &[u8], attributes: &IndexAttributes, settle: Settle) -> SettleResult {
        let key = (parent, name.to_vec());
        if self.pending.get(&key) != Some(&attributes.inode) {
            return SettleResult::NotPending;
        }
        self.pending.remove(&key);
        if settle == Settle::Commit {
            self.place(key, attributes);
        }
        SettleResult::Settled
    }

    fn list(&self, directory: u64) -> ListResult {
        if !self.complete.contains(&directory) {
            return ListResult::Unknown;
        }
        // BTreeMap order is (parent, name), so names come sorted.
        ListResult::Listed(
            self.entries
                .iter()
                .filter(|((parent, _), _)| *parent == directory)
                .map(|((_, name), child)| (name.clone(), *child))
                .collect(),
        )
    }
}

fn random_inode(rng: &mut StdRng) -> u64 {
    rng.gen_range(ROOT..=INODES)
}

fn random_name(rng: &mut StdRng) -> Vec<u8> {
    if rng.gen_range(0..8) == 0 {
        vec![b'n'; rng.gen_range(1..=255)]
    } else {
        NAMES[rng.gen_range(0..NAMES.len())].to_vec()
    }
}

fn random_update(rng: &mut StdRng) -> IndexUpdate {
    match rng.gen_range(0..20) {
        0..=6 => {
            IndexUpdate::InsertEntry { parent: random_inode(rng), name: random_name(rng), child: random_inode(rng) }
        }
        7..=8 => IndexUpdate::RemoveEntry { parent: random_inode(rng), name: random_name(rng) },
        9..=13 => {
            let inode = random_inode(rng);
            let kind = match rng.gen_range(0..6) {
                0..=2 => IndexKind::Directory,
                3 => IndexKind::Symlink,
                4 => IndexKind::Other,
                _ => IndexKind::File,
            };
            let mut attributes = IndexAttributes::new(inode, kind, rng.gen_range(0..=0o7777));
            attributes.parent = random_inode(rng);
            attributes.uid = rng.gen_range(0..3);
            attributes.gid = rng.gen_range(0..3);
            attributes.size_bytes = rng.gen();
            IndexUpdate::SetAttributes(attributes)
        }
        14 => IndexUpdate::RemoveInode(random_inode(rng)),
        15..=17 => IndexUpdate::MarkComplete(random_inode(rng)),
        18 => IndexUpdate::MarkIncomplete(random_inode(rng)),
        _ => IndexUpdate::DropDirectory(random_inode(rng)),
    }
}

fn random_path(rng: &mut StdRng) -> Vec<u8> {
    let mut path = Vec::new();
    for _ in 0..rng.gen_range(0..6) {
        match rng.gen_range(0..10) {
            0 => path.extend_from_slice(b"/"),
            1 => path.extend_from_slice(b"./"),
            2 => path.extend_from_slice(b"../"),
            _ => {
                path.extend_from_slice(&random_name(rng));
                path.push(b'/');
            }
        }
    }
    if rng.gen_bool(0.6) {
        path.pop();
    }
    if rng.gen_range(0..50) == 0 {
        path = vec![b'/'; 4097];
    }
    path
}

/// A create batch of up to 6 requests: new inodes distinct within the batch and from their
/// parents, a fifth of them directories.
fn random_creates(rng: &mut StdRng) -> Vec<(u64, Vec<u8>, IndexAttributes)> {
    let mut used = BTreeSet::new();
    let mut creates = Vec::new();
    for _ in 0..rng.gen_range(1..=6) {
        let parent = random_inode(rng);
        let child = rng.gen_range(ROOT..=INODES + 20);
        if child == parent || !used.insert(child) {
            continue;
        }
        let kind = if rng.gen_range(0..5) == 0 { IndexKind::Directory } else { IndexKind::File };
        let mut attributes = IndexAttributes::new(child, kind, rng.gen_range(0..=0o7777));
        attributes.parent = parent;
        attributes.size_bytes = rng.gen();
        creates.push((parent, random_name(rng), attributes));
    }
    creates
}

fn entries_of(creates: &[(u64, Vec<u8>, IndexAttributes)]) -> Vec<CreateEntry<'_>> {
    creates
        .iter()
        .map(|(parent, name, attributes)| CreateEntry { parent: *parent, name, attributes: *attributes })
        .collect()
}

/// Creates, claims and settles of the twin against the model, interleaved with the updates of
/// a step (claims outstanding across steps, so that applies and drops meet them).
fn creates_follow_the_model(
    rng: &mut StdRng,
    twin: &CpuDirectoryIndex,
    model: &mut Model,
    outstanding: &mut Vec<(u64, Vec<u8>, IndexAttributes)>,
    context: &str,
) {
    let creates = random_creates(rng);
    let tentative = rng.gen_bool(0.5);
    let answers = match tentative {
        true => twin.claim_entries(&entries_of(&creates)).unwrap(),
        false => twin.create_entries(&entries_of(&creates)).unwrap(),
    };
    for ((parent, name, attributes), answer) in creates.iter().zip(answers) {
        let expected = model.create(*parent, name, attributes, tentative);
        assert_eq!(answer, expected, "{context}: create {parent} {name:?} tentative {tentative}");
        if tentative && answer == CreateResult::Created {
            outstanding.push((*parent, name.clone(), *attributes));
        }
    }
    if outstanding.is_empty() || rng.gen_bool(0.5) {
        return;
    }
    // Settle some outstanding claims (some of them taken over or settled already), with
    // attributes that may differ from the claim's, committed or aborted.
    let count = rng.gen_range(1..=outstanding.len());
    let mut settles: Vec<(u64, Vec<u8>, IndexAttributes)> = outstanding.drain(..count).collect();
    // A settle batch names each inode once (claims of different batches may share one; the
    // others stay pending on both sides).
    let mut inodes = BTreeSet::new();
    settles.retain(|(_, _, attributes)| inodes.insert(attributes.inode));
    for (_, _, attributes) in settles.iter_mut() {
        attributes.size_bytes = rng.gen();
    }
    let settle = if rng.gen_bool(0.6) { Settle::Commit } else { Settle::Abort };
    let answers = twin.settle_claims(&entries_of(&settles), settle).unwrap();
    for ((parent, name, attributes), answer) in settles.iter().zip(answers) {
        assert_eq!(answer, model.settle(*parent, name, attributes, settle), "{context}: settle {parent} {name:?}");
    }
}

#[test]
fn the_twin_follows_the_written_rules() {
    let seeds: Vec<u64> = match std::env::var("TANDEM_SEED") {
        Ok(seed) => vec![seed.parse().expect("TANDEM_SEED is a number")],
        Err(_) => (0..40).collect(),
    };
    for seed in seeds {
        let mut rng = StdRng::seed_from_u64(seed);
        let twin = CpuDirectoryIndex::new(ROOT, 2).unwrap();
        let mut model = Model::default();
        let mut outstanding = Vec::new();
        for step in 0..60 {
            let updates: Vec<IndexUpdate> = (0..rng.gen_range(1..30)).map(|_| random_update(&mut rng)).collect();
            twin.apply(&updates).unwrap();
            updates.iter().for_each(|update| model.apply(update));
            let context = format!("seed {seed} step {step}");
            creates_follow_the_model(&mut rng, &twin, &mut model, &mut outstanding, &context);
            let who = Credentials { uid: rng.gen_range(0..3), gid: rng.gen_range(0..3) };
            let lookups: Vec<(u64, Vec<u8>)> =
                (0..40).map(|_| (random_inode(&mut rng), random_name(&mut rng))).collect();
            let borrowed: Vec<(u64, &[u8])> = lookups.iter().map(|(p, n)| (*p, &n[..])).collect();
            let answers = twin.lookup(&borrowed).unwrap();
            for ((parent, name), answer) in borrowed.iter().zip(answers) {
                assert_eq!(answer, model.lookup(*parent, name), "seed {seed} step {step} lookup {parent} {name:?}");
            }
            let paths: Vec<Vec<u8>> = (0..40).map(|_| random_path(&mut rng)).collect();
            let borrowed: Vec<&[u8]> = paths.iter().map(|p| &p[..]).collect();
            for (path, answer) in borrowed.iter().zip(twin.resolve(&borrowed, who).unwrap()) {
                let expected = model.resolve(path, who);
                assert_eq!(
                    answer,
                    expected,
                    "seed {seed} step {step} resolve {:?} as {who:?}",
                    String::from_utf8_lossy(path)
                );
            }
            let inodes: Vec<u64> = (ROOT..=INODES).collect();
            for (inode, answer) in inodes.iter().zip(twin.stat(&inodes).unwrap()) {
                let expected = model.attributes.get(inode).map_or(StatResult::Unknown, |a| StatResult::Found(*a));
                assert_eq!(answer, expected, "seed {seed} step {step} stat {inode}");
                assert_eq!(twin.list(*inode).unwrap(), model.list(*inode), "seed {seed} step {step} list {inode}");
            }
        }
    }
}
