//! `FileSystem::defrag` and `space_use` at their edges: bad factors and file types are typed
//! errors that change nothing, an empty or whole file needs no record, and on a volume that has
//! no room for the new blocks a compaction is refused with `NoSpace` and the file stays as it
//! was (the old blocks are only free after the next checkpoint), fsck clean.

mod common;

use common::*;
use tandemfs::fs::*;
use tandemfs::{fsck, Error, FileSystem};

#[test]
fn bad_factors_and_file_types_are_typed_errors() {
    let (_, device) = memory_volume(64 << 20, false);
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    for factor in [0.5, f64::NAN, f64::INFINITY, -1.0] {
        assert!(matches!(fs.defrag(file, factor), Err(Error::InvalidArgument(_))), "factor {factor}");
    }
    assert!(matches!(fs.defrag(ROOT_INODE, 1.2), Err(Error::IsDirectory)));
    assert!(matches!(fs.space_use(ROOT_INODE), Err(Error::IsDirectory)));
    let empty = fs.defrag(file, 1.0).unwrap();
    assert_eq!((empty.records, empty.before.mapped_bytes, empty.before.amplification()), (0, 0, 1.0));
    fs.write(file, 0, &vec![7u8; 1 << 20]).unwrap();
    let whole = fs.defrag(file, 1.0).unwrap();
    assert_eq!(whole.records, 0, "one extent of whole blocks: {whole:?}");
    assert_eq!(whole.before.data_blocks, 256);
    fs.unmount().unwrap();
}

#[test]
fn a_full_volume_refuses_a_compaction_and_keeps_the_file() {
    let (memory, device) = memory_volume(32 << 20, false);
    // Background compaction off: it would compact the file before the volume fills.
    let options = MountOptions { background_compact_factor: 0.0, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount(device, &options).unwrap();
    let file = fs.create(ROOT_INODE, b"fragmented", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let mut rng = rng(7);
    let mut model = pattern(&mut rng, 200_000);
    fs.write(file, 0, &model).unwrap();
    // Collapses inside blocks keep the blocks for what is left of them (inserts, since format
    // version 8, pack and copy nothing): 40 blocks keep 1,096 bytes each. From the end, so that
    // each offset is still block `k` + 500.
    for k in (1..=40usize).rev() {
        let offset = k * 4096 + 500;
        fs.collapse_range(file, offset as u64, 3000).unwrap();
        model.drain(offset..offset + 3000);
    }
    for step in 0..300usize {
        let offset = (step * 619) % model.len();
        fs.insert(file, offset as u64, b"0123456789").unwrap();
        model.splice(offset..offset, b"0123456789".iter().copied());
    }
    let before = fs.space_use(file).unwrap();
    assert!(before.amplification() > 2.0, "{before:?}");
    // Fill the volume so that no compaction record can be promised its blocks.
    let filler = fs.create(ROOT_INODE, b"filler", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    let chunk = vec![1u8; 256 << 10];
    let mut offset = 0u64;
    for _ in 0..1_000 {
        match fs.write(filler, offset, &chunk) {
            Ok(written) if written > 0 => offset += written as u64,
            _ => break,
        }
    }
    fs.checkpoint().unwrap();
    let mut last = 0u64;
    for _ in 0..1_000 {
        match fs.write(filler, offset, &[1u8; 4096]) {
            Ok(written) if written > 0 => offset += written as u64,
            _ => break,
        }
        last += 1;
    }
    assert!(last < 1_000, "the volume never filled");
    match fs.defrag(file, 1.2) {
        Err(Error::NoSpace) => {}
        other => panic!("a compaction on a full volume: {other:?}"),
    }
    let mut back = vec![0u8; model.len() + 1];
    assert_eq!(fs.read(file, 0, &mut back).unwrap(), model.len());
    assert!(back[..model.len()] == model[..], "the file changed");
    assert_eq!(fs.space_use(file).unwrap().mapped_bytes, model.len() as u64);
    // With the filler gone (free after a checkpoint) the same compaction goes through.
    fs.unlink(ROOT_INODE, b"filler").unwrap();
    fs.checkpoint().unwrap();
    let report = fs.defrag(file, 1.2).unwrap();
    assert!(report.records > 0 && report.after.amplification() <= 1.2, "{report:?}");
    assert_eq!(fs.read(file, 0, &mut back).unwrap(), model.len());
    assert!(back[..model.len()] == model[..], "the file changed");
    fs.unmount().unwrap();
    drop(fs);
    let report = fsck::check(std::sync::Arc::new(memory)).unwrap();
    assert!(report.is_clean(), "fsck: {:#?}", report.problems);
}
