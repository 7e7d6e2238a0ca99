//! The corruption test: bit flips in metadata blocks and superblocks of a cleanly unmounted
//! volume. Mount, fsck and reads must give a typed error or the right answer: never a panic,
//! never a wrong answer.

mod common;

use common::*;
use rand::Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use tandemfs::block::meta::{BlockKind, BLOCK_SIZE, TRAILER_BLOCK_OFFSET, TRAILER_KIND_OFFSET};
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::{fsck, FileSystem};

fn build_volume() -> (Vec<u8>, Model) {
    let (memory, device) = memory_volume(32 << 20, false);
    let (fs, _) = FileSystem::mount(device.clone(), &inline_options()).unwrap();
    let mut rng = rng(7);
    for directory in 0..4 {
        let made = fs.make_directory(ROOT_INODE, format!("d{directory}").as_bytes(), 0o755, 0, 0).unwrap();
        // Enough names to split hash regions and add index blocks.
        for file in 0..(150 * (directory + 1)) {
            let name = format!("file-with-a-longer-name-{file}");
            let created = fs.create(made.inode, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
            if file % 20 == 0 {
                // Fragmented files: writes with holes make many extents and tree blocks.
                for piece in 0..20u64 {
                    let data = pattern(&mut rng, 700);
                    fs.write(created.inode, piece * 3000, &data).unwrap();
                }
                fs.set_xattr(created.inode, b"user.tag", b"value", XattrMode::CreateOrReplace).unwrap();
            }
        }
        fs.symlink(made.inode, b"link", b"../d0", 0, 0).unwrap();
    }
    let model = read_back(&fs).unwrap();
    fs.unmount().unwrap();
    (memory.to_bytes(), model)
}

/// Blocks holding checksummed metadata: both superblocks and every block with a valid trailer.
fn metadata_blocks(image: &[u8]) -> Vec<u64> {
    let mut blocks = vec![0, 1];
    for (number, block) in image.chunks(BLOCK_SIZE).enumerate() {
        let block: &[u8; BLOCK_SIZE] = block.try_into().unwrap();
        let kind = u32::from_le_bytes(block[TRAILER_KIND_OFFSET..TRAILER_KIND_OFFSET + 4].try_into().unwrap());
        let address = u64::from_le_bytes(block[TRAILER_BLOCK_OFFSET..TRAILER_BLOCK_OFFSET + 8].try_into().unwrap());
        if let Some(kind) = BlockKind::from_u32(kind) {
            if address == number as u64 && tandemfs::block::meta::verify_block(block, kind, number as u64).is_ok() {
                blocks.push(number as u64);
            }
        }
    }
    blocks
}

#[test]
fn bit_flips_give_typed_errors_or_right_answers() {
    let (image, expected) = build_volume();
    let candidates = metadata_blocks(&image);
    assert!(candidates.len() > 40, "the volume has {} metadata blocks", candidates.len());
    let mut rng = rng(11);
    let (mut detected, mut right) = (0, 0);
    for trial in 0..400 {
        let block = candidates[rng.gen_range(0..candidates.len())];
        let mut damaged = image.clone();
        for _ in 0..rng.gen_range(1..=3) {
            let bit = rng.gen_range(0..BLOCK_SIZE * 8);
            damaged[block as usize * BLOCK_SIZE + bit / 8] ^= 1 << (bit % 8);
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(damaged.clone()));
            let report = fsck::check(device.clone());
            let mounted = FileSystem::mount(device, &inline_options());
            let back = mounted.and_then(|(fs, _)| read_back(&fs));
            (report, back)
        }));
        let (report, back) =
            outcome.unwrap_or_else(|_| panic!("trial {trial}: a flip in block {block} made the engine panic"));
        let report = report.unwrap_or_else(|error| panic!("trial {trial}: fsck failed outright: {error}"));
        match back {
            Ok(model) => {
                assert!(
                    same_tree(&model, &expected),
                    "trial {trial}: block {block}: wrong answer: {}",
                    first_difference(&model, &expected)
                );
                right += 1;
            }
            Err(error) => {
                assert!(error.is_corruption(), "trial {trial}: block {block}: untyped error {error:?}");
                assert!(!report.is_clean(), "trial {trial}: block {block}: reads fail ({error}) but fsck is clean");
                detected += 1;
            }
        }
    }
    println!("{detected} flips detected, {right} read back right (redundant or unread copies)");
    assert!(detected > 100);
}

#[test]
fn garbage_and_truncated_images_are_refused() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(32 << 20));
    assert!(FileSystem::mount(device.clone(), &inline_options()).unwrap_err().is_corruption());
    assert!(!fsck::check(device).unwrap().is_clean());
    let (image, _) = build_volume();
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::from_bytes(image[..16 << 20].to_vec()));
    assert!(FileSystem::mount(device, &inline_options()).unwrap_err().is_corruption());
}
