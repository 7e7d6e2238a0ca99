//! Reads of home (applied H-trees, inode records) for lookups, stats and path resolution,
//! without the volume lock: from the volume's mirror (`block::mirror`), checked by its
//! sequence, and under the lock only for a block the mirror lacks or when changes keep
//! overlapping the read. docs/ARCHITECTURE.md, *Readers of home without the volume lock*.

use super::*;
use crate::block::meta::{BlockKind, MetaStore, SharedBlock};
use crate::block::mirror::{is_mirrored_kind, HomeMirror};
use crate::block::superblock::INODES_PER_BLOCK;
use crate::block::volume::check_inode_contents_within;

/// Tries of a read from the mirror before it reads under the volume lock: each try that a
/// change overlapped is repeated, and a reader that keeps meeting changes (creates applied
/// in one stream) takes its turn at the lock rather than spin.
const MIRROR_READ_ATTEMPTS: usize = 8;
/// Spins of a reader that finds a change under way before it reads under the lock instead: a
/// change is a holder of the lock, so the lock waits for exactly its end (as every reader did
/// before the mirror), where spinning longer or yielding only adds to the wait.
const CHANGE_SPINS_MAX: usize = 64;

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

/// A reader of the mirror: hits take a shard's read lock, a miss reads the block under the
/// volume lock and mirrors it. Read-only: the structures it serves never change blocks.
pub(super) struct MirrorReader<'a> {
    mirror: &'a HomeMirror,
    backend: &'a Backend,
}

impl MirrorReader<'_> {
    fn block(&mut self, block_number: u64, kind: BlockKind) -> Result<SharedBlock> {
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

impl HomeSource for MirrorReader<'_> {
    fn meta(&mut self) -> &mut dyn MetaStore {
        self
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
    /// Runs `read` on home as of one moment: from the mirror while no change of a mirrored
    /// block overlaps it (the mirror's sequence is the same before and after, its outcome,
    /// error or not, is kept), else again; under the volume lock after `MIRROR_READ_ATTEMPTS`
    /// tries, or at once when a change is under way (its holder has the lock). What it reads includes every change whose lock hold ended before it
    /// began: so every record made applied before the call.
    pub(super) fn read_home<T>(&self, read: impl Fn(&mut dyn HomeSource) -> Result<T>) -> Result<T> {
        let backend = &*self.inner.backend;
        let mirror = backend.home_mirror();
        let attempts = if home_reads_locked() { 0 } else { MIRROR_READ_ATTEMPTS };
        for _ in 0..attempts {
            let Some(started) = wait_for_quiet(mirror) else { break };
            let outcome = read(&mut MirrorReader { mirror, backend });
            if mirror.read_valid(started) {
                return outcome;
            }
        }
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

/// The mirror's sequence once no change is under way, after a short spin; `None` if a change
/// is still under way then.
fn wait_for_quiet(mirror: &HomeMirror) -> Option<u64> {
    for _ in 0..CHANGE_SPINS_MAX {
        if let Some(started) = mirror.read_begin() {
            return Some(started);
        }
        std::hint::spin_loop();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;
    use crate::fs::types::{FormatOptions, MountOptions, ROOT_INODE};
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
}
