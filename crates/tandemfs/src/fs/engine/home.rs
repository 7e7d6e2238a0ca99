//! Reads of home (applied H-trees, inode records) for lookups, stats and path resolution,
//! without the volume lock: from the volume's mirror (`block::mirror`), checked by the
//! sequence counters of the blocks read, and under the lock only for a block the mirror lacks
//! or when changes of those blocks keep overlapping the read. docs/ARCHITECTURE.md, *Readers of home without the volume lock*.

use super::*;
use crate::block::meta::{BlockKind, MetaStore, SharedBlock};
use crate::block::mirror::{is_mirrored_kind, HomeMirror};
use crate::block::superblock::INODES_PER_BLOCK;
use crate::block::volume::check_inode_contents_within;
use crate::dir::{HashSeed, RegionCache, VersionedStore};

/// Tries of a read from the mirror before it reads under the volume lock: each try that a
/// change overlapped is repeated, and a reader that keeps meeting changes (creates applied
/// in one stream) takes its turn at the lock rather than spin.
const MIRROR_READ_ATTEMPTS: usize = 8;
/// Spins of a reader that finds a change of a block it reads under way before it reads under
/// the lock instead: a change is a holder of the lock, so the lock waits for exactly its end
/// (as every reader did before the mirror), where spinning longer or yielding only adds to the
/// wait.
const CHANGE_SPINS_MAX: usize = 64;
/// Stripes a read notes without allocating: a lookup reads an inode-table block, the index
/// path and a region's leaves (a handful); a longer read (learning a whole directory) spills
/// to a vector.
const NOTED_INLINE: usize = 24;

/// Whether the environment asks for every read of home under the volume lock, as before the
/// mirror (`TANDEM_HOME_READS_LOCKED=1`): a switch for measuring the two side by side in one
/// build (docs/BENCHMARKS.md), read once per process.
fn home_reads_locked() -> bool {
    static LOCKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOCKED.get_or_init(|| std::env::var("TANDEM_HOME_READS_LOCKED").is_ok_and(|value| value == "1"))
}

/// What a reader of home reads through: the mirror, or the volume under its lock.
pub(super) trait HomeSource {
    /// The metadata blocks, for `dir::lookup`.
    fn meta(&mut self) -> &mut dyn MetaStore;
    /// The applied inode `number`; `None` when its number is free.
    fn inode(&mut self, number: u64) -> Result<Option<Inode>>;
    /// `name` in the directory of `root` (`dir::lookup`).
    fn lookup_name(&mut self, root: &DirRoot, seed: &HashSeed, name: &[u8]) -> Result<Option<(u64, u8)>> {
        dir::lookup(self.meta(), root, seed, name)
    }
}

impl HomeSource for Volume {
    fn meta(&mut self) -> &mut dyn MetaStore {
        self
    }

    fn inode(&mut self, number: u64) -> Result<Option<Inode>> {
        match self.read_inode(number) {
            Ok(inode) => Ok(Some(inode)),
            Err(Error::NotFound) => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// The stripes a read of the mirror took blocks from, with the counter each had (even) when
/// it did: the read is kept only if none of them moved by its end (`HomeMirror::read_valid`).
struct NotedStripes {
    inline: [(usize, u64); NOTED_INLINE],
    inline_count: usize,
    spilled: Vec<(usize, u64)>,
}

impl NotedStripes {
    fn new() -> NotedStripes {
        NotedStripes { inline: [(0, 0); NOTED_INLINE], inline_count: 0, spilled: Vec::new() }
    }

    fn note(&mut self, noted: (usize, u64)) {
        if self.inline_count < NOTED_INLINE {
            self.inline[self.inline_count] = noted;
            self.inline_count += 1;
        } else {
            self.spilled.push(noted);
        }
    }

    fn iter(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.inline[..self.inline_count].iter().chain(self.spilled.iter()).copied()
    }

    fn len(&self) -> usize {
        self.inline_count + self.spilled.len()
    }
}

/// A reader of the mirror: hits take a shard's read lock, a miss reads the block under the
/// volume lock and mirrors it. Read-only: the structures it serves never change blocks. Notes
/// the counter of every block's stripe before it takes the block.
pub(super) struct MirrorReader<'a> {
    mirror: &'a HomeMirror,
    backend: &'a Backend,
    regions: &'a RegionCache,
    noted: NotedStripes,
    /// A block's change was under way past `CHANGE_SPINS_MAX` spins: the read must go to the
    /// lock, whatever the closure made of the error it got.
    gave_up: bool,
}

impl MirrorReader<'_> {
    fn block(&mut self, block_number: u64, kind: BlockKind) -> Result<SharedBlock> {
        let Some(noted) = wait_for_quiet(self.mirror, block_number) else {
            self.gave_up = true;
            return Err(Error::invalid(format!("block {block_number} is changing; reading under the lock")));
        };
        self.noted.note(noted);
        if let Some(block) = self.mirror.get(block_number, kind) {
            self.mirror.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(block);
        }
        self.mirror.misses.fetch_add(1, Ordering::Relaxed);
        let mut volume = self.backend.volume()?;
        if !is_mirrored_kind(kind) {
            return volume.read_meta(block_number, kind);
        }
        volume.read_for_mirror(block_number, kind)
    }
}

impl MetaStore for MirrorReader<'_> {
    fn read_meta(&mut self, block_number: u64, kind: BlockKind) -> Result<SharedBlock> {
        self.block(block_number, kind)
    }

    fn write_meta(&mut self, block_number: u64, _kind: BlockKind, _block: SharedBlock) -> Result<()> {
        Err(Error::invalid(format!("a reader of home wrote block {block_number}")))
    }

    fn allocate_meta(&mut self, _near: u64) -> Result<u64> {
        Err(Error::invalid("a reader of home allocated a block"))
    }

    fn free_meta(&mut self, block_number: u64) -> Result<()> {
        Err(Error::invalid(format!("a reader of home freed block {block_number}")))
    }
}

impl VersionedStore for MirrorReader<'_> {
    fn meta(&mut self) -> &mut dyn MetaStore {
        self
    }

    fn noted_count(&self) -> usize {
        self.noted.len()
    }

    fn noted_since(&self, start: usize) -> Vec<(usize, u64)> {
        self.noted.iter().skip(start).collect()
    }

    fn still_current(&mut self, versions: &[(usize, u64)]) -> bool {
        if !versions.iter().all(|(stripe, counter)| self.mirror.stripe_counter(*stripe) == *counter) {
            return false;
        }
        for version in versions {
            self.noted.note(*version);
        }
        true
    }
}

impl HomeSource for MirrorReader<'_> {
    fn meta(&mut self) -> &mut dyn MetaStore {
        self
    }

    /// Through the region summaries (`dir::lookup_summarised`), checked by the same counters.
    fn lookup_name(&mut self, root: &DirRoot, seed: &HashSeed, name: &[u8]) -> Result<Option<(u64, u8)>> {
        let regions = self.regions;
        dir::lookup_summarised(self, regions, root, seed, name)
    }

    /// The record as its inode-table block holds it. A free number's record is all zero
    /// (`Volume::delete_inode` clears it in the same change that frees the number); the
    /// inode bitmap's cross-check of that is left to reads under the lock (fsck's, and
    /// `Volume::read_inode`).
    fn inode(&mut self, number: u64) -> Result<Option<Inode>> {
        let geometry = self.mirror.geometry();
        if number == 0 || number > geometry.inode_count {
            return Err(Error::corruption(format!("inode number {number} is out of range")));
        }
        let index = number - 1;
        let block = self.block(geometry.inode_table_start + index / INODES_PER_BLOCK, BlockKind::InodeTable)?;
        let offset = (index % INODES_PER_BLOCK) as usize * crate::block::inode::INODE_BYTES;
        let record = &block[offset..offset + crate::block::inode::INODE_BYTES];
        let Some(inode) = Inode::decode(record, number, geometry.inode_count)? else {
            return Ok(None);
        };
        check_inode_contents_within(geometry.first_data_block, geometry.block_count, &inode)?;
        Ok(Some(inode))
    }
}

impl FileSystem {
    /// Runs `read` on home as of one moment: from the mirror while no change of a block it
    /// read overlaps it (the counters of the blocks' stripes are the same before and after;
    /// its outcome, error or not, is kept), else again; under the volume lock after
    /// `MIRROR_READ_ATTEMPTS` tries, or at once when a change of a block it needs is under way
    /// (its holder has the lock). What it reads includes every change whose lock hold ended
    /// before it began: so every record made applied before the call. Changes of blocks it
    /// does not read (other directories) do not disturb it.
    pub(super) fn read_home<T>(&self, read: impl Fn(&mut dyn HomeSource) -> Result<T>) -> Result<T> {
        let backend = &*self.inner.backend;
        let mirror = backend.home_mirror();
        let attempts = if home_reads_locked() || mirror.is_poisoned() { 0 } else { MIRROR_READ_ATTEMPTS };
        for attempt in 0..attempts {
            let mut reader = MirrorReader {
                mirror,
                backend,
                regions: &self.inner.regions,
                noted: NotedStripes::new(),
                gave_up: false,
            };
            let outcome = read(&mut reader);
            if reader.gave_up {
                break;
            }
            if mirror.read_valid(reader.noted.iter()) {
                return outcome;
            }
            if attempt + 1 < attempts {
                mirror.retries.fetch_add(1, Ordering::Relaxed);
            }
        }
        mirror.fallbacks.fetch_add(1, Ordering::Relaxed);
        let mut volume = backend.volume()?;
        read(&mut *volume)
    }

    /// The applied inode `number` if it is the same inode as the view (same generation); `None`
    /// while its creation is not applied yet, or while the number still holds a freed
    /// predecessor.
    pub(super) fn home_inode_in(home: &mut dyn HomeSource, number: u64, generation: u64) -> Result<Option<Inode>> {
        Ok(home.inode(number)?.filter(|inode| inode.generation == generation))
    }
}

/// Block `block_number`'s stripe and its counter once no change of the stripe is under way,
/// after a short spin; `None` if one is still under way then.
fn wait_for_quiet(mirror: &HomeMirror, block_number: u64) -> Option<(usize, u64)> {
    for _ in 0..CHANGE_SPINS_MAX {
        if let Some(noted) = mirror.read_begin(block_number) {
            return Some(noted);
        }
        std::hint::spin_loop();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;
    use crate::fs::types::{FormatOptions, MountOptions, RenameMode, SetAttributes, ROOT_INODE};
    use std::sync::atomic::AtomicUsize;

    /// A volume whose back end runs only when the test calls it, with directory `d` of 50
    /// files, all applied.
    fn volume_with_directory() -> (FileSystem, InodeNumber) {
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
        FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
        let options = MountOptions { background_backend: false, ..MountOptions::default() };
        let (fs, _) = FileSystem::mount(device, &options).unwrap();
        let directory = fs.make_directory(ROOT_INODE, b"d", 0o755, 0, 0).unwrap().inode;
        for serial in 0..50 {
            fs.create(directory, format!("f{serial}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
        }
        fs.run_backend().unwrap();
        (fs, directory)
    }

    /// The half-applied read this module exists to prevent: a reader takes the directory's
    /// root (50 entries), a create of "late" reaches home (root and leaf in one lock hold), the
    /// reader then walks its old root to the new leaf and finds "late": 50 entries and "late"
    /// together, a state the directory never was in. The sequence check must refuse that read
    /// and read again. (Without `read_valid` this answers (50, true).)
    #[test]
    fn a_read_that_a_change_overlaps_is_refused_and_read_again() {
        let (fs, directory) = volume_with_directory();
        let seed = fs.inner.backend.applier().hash_seed;
        let attempts = AtomicUsize::new(0);
        let answer = fs
            .read_home(|home| {
                let attempt = attempts.fetch_add(1, Ordering::SeqCst);
                let root = DirRoot::decode(&home.inode(directory)?.expect("applied").root_area)?;
                if attempt == 0 {
                    // Another caller's create, applied between the reader's two reads.
                    fs.create(directory, b"late", FileType::Regular, 0o644, 0, 0, 0)?;
                    fs.run_backend()?;
                }
                let found = dir::lookup(home.meta(), &root, &seed, b"late")?.is_some();
                Ok((root.entry_count(), found))
            })
            .unwrap();
        assert_eq!(answer, (51, true), "a reader answered from two moments");
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        fs.unmount().unwrap();
    }

    /// A change that failed half way keeps the mirror's sequence odd: a reader of blocks the
    /// change did not touch (still mirrored, whole) must still not answer from the volume.
    #[test]
    fn a_half_changed_volume_is_never_read_from_the_mirror() {
        let (fs, directory) = volume_with_directory();
        let geometry = fs.inner.backend.home_mirror().geometry();
        let table_block = |number: u64| geometry.inode_table_start + (number - 1) / INODES_PER_BLOCK;
        assert_ne!(table_block(ROOT_INODE), table_block(directory), "the test needs two table blocks");
        // Both blocks mirrored.
        fs.read_home(|home| Ok((home.inode(ROOT_INODE)?, home.inode(directory)?))).unwrap();
        {
            let mut volume = fs.inner.backend.volume().unwrap();
            let mut inode = volume.read_inode(directory).unwrap();
            inode.link_count += 7;
            volume.write_inode(&inode).unwrap();
            volume.mark_half_changed(&Error::corruption("a device failed half way"));
        }
        let root = fs.read_home(|home| home.inode(ROOT_INODE));
        assert!(matches!(root, Err(Error::Shutdown)), "read {root:?} from a half-changed volume");
    }

    /// The stripe of `number`'s inode-table block.
    fn table_block(fs: &FileSystem, number: InodeNumber) -> u64 {
        let geometry = fs.inner.backend.home_mirror().geometry();
        geometry.inode_table_start + (number - 1) / INODES_PER_BLOCK
    }

    /// A create in another directory, applied while a reader of `d` is between its reads,
    /// touches no block the reader read: the read is kept at the first try. (With one counter
    /// for the whole volume, as before, this read was refused and read again.)
    #[test]
    fn a_change_in_another_directory_does_not_refuse_a_read() {
        let (fs, directory) = volume_with_directory();
        let other = fs.make_directory(ROOT_INODE, b"e", 0o755, 0, 0).unwrap().inode;
        fs.run_backend().unwrap();
        let seed = fs.inner.backend.applier().hash_seed;
        let attempts = AtomicUsize::new(0);
        let late = std::sync::Mutex::new(None);
        let found = fs
            .read_home(|home| {
                let attempt = attempts.fetch_add(1, Ordering::SeqCst);
                let root = DirRoot::decode(&home.inode(directory)?.expect("applied").root_area)?;
                if attempt == 0 {
                    let created = fs.create(other, b"late", FileType::Regular, 0o644, 0, 0, 0)?;
                    fs.run_backend()?;
                    *late.lock().unwrap() = Some(created.inode);
                }
                dir::lookup(home.meta(), &root, &seed, b"f7")
            })
            .unwrap();
        let late = late.into_inner().unwrap().expect("created");
        assert_ne!(table_block(&fs, late), table_block(&fs, directory), "the test needs two table blocks");
        assert!(found.is_some());
        assert_eq!(attempts.load(Ordering::SeqCst), 1, "a change elsewhere refused the read");
        assert_eq!(fs.home_read_statistics().retries, 0);
        fs.unmount().unwrap();
    }

    /// The stale read the per-block counters must still catch: a reader takes a file's record,
    /// the file's mode changes (its inode-table block only), and the reader's check must refuse
    /// the old record. (Without the check of the stripes it noted, this answers 0o644.)
    #[test]
    fn a_change_of_a_block_read_refuses_the_read() {
        let (fs, directory) = volume_with_directory();
        let file = fs.lookup(directory, b"f3").unwrap().inode;
        let attempts = AtomicUsize::new(0);
        let mode = fs
            .read_home(|home| {
                let attempt = attempts.fetch_add(1, Ordering::SeqCst);
                let inode = home.inode(file)?.expect("applied");
                if attempt == 0 {
                    let changes = SetAttributes { permissions: Some(0o600), ..SetAttributes::default() };
                    fs.set_attributes(file, &changes)?;
                    fs.run_backend()?;
                }
                Ok(inode.mode & 0o7777)
            })
            .unwrap();
        assert_eq!(mode, 0o600, "a reader kept a record older than an applied change");
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        assert_eq!(fs.home_read_statistics().retries, 1);
        fs.unmount().unwrap();
    }

    /// Readers of directory `a` (walks of its H-tree and reads of its files' records, without
    /// the lock) while the back end applies a stream of creates and renames in `b`: with a
    /// counter per stripe of blocks, the readers neither read again nor fall back to the lock,
    /// because nothing they read changes. Counted, not timed. (With one counter for the volume
    /// the readers met a change at most reads here, and most fell back.)
    #[test]
    fn readers_of_a_quiet_directory_ignore_changes_applied_elsewhere() {
        const A_FILES: usize = 200;
        const B_FILES: usize = 300;
        const B_RENAMES: usize = 2_000;
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
        FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
        let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
        let a = fs.make_directory(ROOT_INODE, b"a", 0o755, 0, 0).unwrap().inode;
        let b = fs.make_directory(ROOT_INODE, b"b", 0o755, 0, 0).unwrap().inode;
        let a_files: Vec<InodeNumber> = (0..A_FILES)
            .map(|serial| {
                fs.create(a, format!("a{serial}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap().inode
            })
            .collect();
        fs.checkpoint().unwrap();
        let generation = fs.read_home(|home| Ok(home.inode(a)?.expect("applied").generation)).unwrap();
        let before = fs.home_read_statistics();
        let writer_done = std::sync::atomic::AtomicBool::new(false);
        let reads = AtomicUsize::new(0);
        let b_files = std::thread::scope(|scope| {
            let writer = scope.spawn(|| {
                let created: Vec<InodeNumber> = (0..B_FILES)
                    .map(|serial| {
                        let name = format!("b{serial}");
                        fs.create(b, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap().inode
                    })
                    .collect();
                for round in 0..B_RENAMES {
                    let serial = round % B_FILES;
                    let (from, to) = if (round / B_FILES).is_multiple_of(2) {
                        (format!("b{serial}"), format!("c{serial}"))
                    } else {
                        (format!("c{serial}"), format!("b{serial}"))
                    };
                    fs.rename(b, from.as_bytes(), b, to.as_bytes(), RenameMode::NoReplace).unwrap();
                    // Applied at once: the back end applies nearly every rename in a hold of its
                    // own while the readers run, so they meet thousands of changes.
                    if round % 4 == 0 {
                        fs.checkpoint().unwrap();
                    }
                }
                fs.checkpoint().unwrap();
                writer_done.store(true, Ordering::SeqCst);
                created
            });
            for _ in 0..2 {
                scope.spawn(|| {
                    // Bounded: the writer's 2,300 records are applied long before this many.
                    for round in 0..2_000_000usize {
                        if writer_done.load(Ordering::SeqCst) {
                            break;
                        }
                        let serial = round % A_FILES;
                        let name = format!("a{serial}");
                        let found = fs.find_applied_name(a, generation, name.as_bytes()).unwrap();
                        assert_eq!(found.map(|(number, _)| number), Some(a_files[serial]));
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            writer.join().unwrap()
        });
        fs.checkpoint().unwrap();
        let applied = fs.backend_statistics();
        let after = fs.home_read_statistics();
        // The readers read only a's blocks: b's records must have touched none of them.
        let a_blocks: std::collections::BTreeSet<u64> =
            a_files.iter().chain([&a]).map(|number| table_block(&fs, *number)).collect();
        assert!(
            b_files.iter().all(|number| !a_blocks.contains(&table_block(&fs, *number))),
            "the test needs b's inodes in other table blocks than a's"
        );
        let reads = reads.into_inner();
        assert!(reads >= 1_000, "only {reads} reads of a ran beside the writer");
        let (retries, fallbacks) = (after.retries - before.retries, after.fallbacks - before.fallbacks);
        assert!(
            retries + fallbacks <= 2,
            "{reads} reads of a quiet directory read again {retries} times and fell back to the lock {fallbacks} \
             times while {applied:?} applied in another"
        );
        fs.unmount().unwrap();
    }

    /// Lookups through region summaries answer as the walk does, and a summary read before a
    /// change of its region's blocks is never used after it: names created into summarised
    /// regions are found, unlinked ones are not, and none of it needs the lock. (With
    /// `still_current` answering yes without looking, the stale summaries' versions fail the
    /// reader's own check, every lookup falls back to the lock, and the count below fails.)
    #[test]
    fn summarised_lookups_follow_changes_of_their_regions() {
        const FILES: usize = 3_000;
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
        FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
        let options = MountOptions { background_backend: false, ..MountOptions::default() };
        let (fs, _) = FileSystem::mount(device, &options).unwrap();
        let directory = fs.make_directory(ROOT_INODE, b"d", 0o755, 0, 0).unwrap().inode;
        let mut expected = std::collections::BTreeMap::new();
        for serial in 0..FILES {
            let name = format!("file-{serial}");
            let created = fs.create(directory, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
            expected.insert(name, created.inode);
        }
        fs.run_backend().unwrap();
        let generation = fs.read_home(|home| Ok(home.inode(directory)?.expect("applied").generation)).unwrap();
        let check = |expected: &std::collections::BTreeMap<String, InodeNumber>, missing: &[String]| {
            for (name, number) in expected {
                let found = fs.find_applied_name(directory, generation, name.as_bytes()).unwrap();
                assert_eq!(found.map(|(found, _)| found), Some(*number), "{name}");
            }
            for name in missing {
                assert_eq!(fs.find_applied_name(directory, generation, name.as_bytes()).unwrap(), None, "{name}");
            }
        };
        let never = ["never-made".to_string(), "file-".to_string(), "file-3000x".to_string()];
        check(&expected, &never);
        check(&expected, &never);
        let summarised = fs.home_read_statistics().summarised_lookups;
        assert!(summarised >= 2 * FILES as u64, "only {summarised} lookups went through summaries");
        // Every region changes: a third of the names go, new ones come.
        let mut gone = never.to_vec();
        for serial in (0..FILES).step_by(3) {
            let name = format!("file-{serial}");
            fs.unlink(directory, name.as_bytes()).unwrap();
            expected.remove(&name);
            gone.push(name);
        }
        for serial in 0..FILES / 2 {
            let name = format!("late-{serial}");
            let created = fs.create(directory, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
            expected.insert(name, created.inode);
        }
        fs.run_backend().unwrap();
        let before = fs.home_read_statistics();
        check(&expected, &gone);
        let after = fs.home_read_statistics();
        assert_eq!((after.retries, after.fallbacks), (before.retries, before.fallbacks), "lookups fell back");
        assert!(fs.inner.regions.built.load(Ordering::Relaxed) > 0);
        fs.unmount().unwrap();
    }
}
