//! Encrypted volumes (format version 5, `tandemfs::crypt`): a round trip through the library,
//! no plaintext in the image, tampered ciphertext detected, wrong and missing keys refused
//! without a write, damaged key slots skipped, and the key-slot operations.

mod common;

use common::*;
use std::sync::Arc;
use tandemfs::block::meta::{BLOCK_SIZE, BLOCK_SIZE_U64};
use tandemfs::block::superblock::Superblock;
use tandemfs::crypt::{self, Encryption, KdfCost, Secret};
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::fsck::{self, FsckOptions};
use tandemfs::{Error, FileSystem};

const VOLUME_BYTES: u64 = 16 << 20;
const NAME: &[u8] = b"quarterly-report-of-the-zebra-herd.txt";
const DIRECTORY: &[u8] = b"secret-directory-named-aardvark";

fn passphrase(words: &str) -> Secret {
    Secret::from_passphrase(words.to_string()).unwrap()
}

/// A formatted encrypted memory volume whose first slot opens with `secret`.
fn encrypted_volume(secret: &Secret) -> MemoryDevice {
    let memory = MemoryDevice::new(VOLUME_BYTES);
    let options = FormatOptions {
        uuid: Some([5; 16]),
        encryption: Some(Encryption { secret: secret.clone(), cost: KdfCost::for_tests() }),
        ..FormatOptions::default()
    };
    FileSystem::format(Arc::new(memory.clone()), &options).unwrap();
    memory
}

fn keyed(secret: &Secret) -> MountOptions {
    MountOptions { key: Some(secret.clone()), ..inline_options() }
}

fn mount(memory: &MemoryDevice, secret: &Secret) -> FileSystem {
    FileSystem::mount(Arc::new(memory.clone()), &keyed(secret)).unwrap().0
}

/// Contents that are easy to find in an image and not made by chance.
fn contents() -> Vec<u8> {
    b"The zebras of the northern plain number four hundred and twelve. ".repeat(200)
}

fn write_known_files(fs: &FileSystem) -> (u64, u64) {
    let directory = fs.make_directory(ROOT_INODE, DIRECTORY, 0o755, 0, 0).unwrap().inode;
    let file = fs.create(directory, NAME, FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, &contents()).unwrap();
    let small = fs.create(ROOT_INODE, b"tiny", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(small, 0, b"aardvark appendix").unwrap();
    (directory, file)
}

fn read_file(fs: &FileSystem, inode: u64, length: usize) -> tandemfs::Result<Vec<u8>> {
    let mut buffer = vec![0u8; length];
    let count = fs.read(inode, 0, &mut buffer)?;
    buffer.truncate(count);
    Ok(buffer)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

#[test]
fn round_trip_through_the_library() {
    let secret = passphrase("correct horse battery staple");
    let memory = encrypted_volume(&secret);
    let fs = mount(&memory, &secret);
    let (directory, file) = write_known_files(&fs);
    assert_eq!(read_file(&fs, file, 1 << 20).unwrap(), contents());
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&memory, &secret);
    assert_eq!(fs.lookup(directory, NAME).unwrap().inode, file);
    assert_eq!(read_file(&fs, file, 1 << 20).unwrap(), contents());
    fs.unmount().unwrap();
    drop(fs);
    let report =
        fsck::check_with_options(Arc::new(memory.clone()), &FsckOptions { key: Some(secret) }, &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
}

#[test]
fn the_image_holds_no_plaintext() {
    let secret = passphrase("correct horse battery staple");
    let memory = encrypted_volume(&secret);
    let fs = mount(&memory, &secret);
    write_known_files(&fs);
    // Unmount checkpoints: the names and contents are in the log and in their home blocks.
    fs.unmount().unwrap();
    drop(fs);
    let image = memory.to_bytes();
    for needle in [NAME, DIRECTORY, b"aardvark appendix".as_slice(), &contents()[..64], b"zebras of the northern"] {
        assert!(!contains(&image, needle), "{:?} is in the image", String::from_utf8_lossy(needle));
    }
    // The same files on a plain volume are found by the same search: the search can fail.
    let (plain, device) = memory_volume(VOLUME_BYTES, false);
    let (fs, _) = FileSystem::mount(device, &inline_options()).unwrap();
    write_known_files(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let image = plain.to_bytes();
    assert!(contains(&image, NAME) && contains(&image, b"zebras of the northern"));
}

#[test]
fn a_wrong_key_or_none_is_one_line_and_writes_nothing() {
    let secret = passphrase("correct horse battery staple");
    let memory = encrypted_volume(&secret);
    let before = memory.to_bytes();
    memory.reset_counters();
    let device: Arc<dyn Device> = Arc::new(memory.clone());
    let wrong = FileSystem::mount(device.clone(), &keyed(&passphrase("incorrect horse"))).err().unwrap();
    assert!(matches!(wrong, Error::Key(_)), "{wrong:?}");
    assert!(wrong.to_string().starts_with("wrong passphrase or key file"), "{wrong}");
    let none = FileSystem::mount(device.clone(), &inline_options()).err().unwrap();
    assert_eq!(none.to_string(), "volume is encrypted: give --key-file FILE or its passphrase");
    let fsck_none = fsck::check(device.clone()).unwrap_err();
    assert!(matches!(fsck_none, Error::Key(_)), "{fsck_none:?}");
    let fsck_wrong =
        fsck::check_with_options(device.clone(), &FsckOptions { key: Some(passphrase("nope")) }, &mut |_| {})
            .unwrap_err();
    assert!(matches!(fsck_wrong, Error::Key(_)), "{fsck_wrong:?}");
    assert!(fsck::repair(device.clone(), true, &mut |_| {}).is_err());
    assert!(fsck::inspect(device.clone()).is_err());
    assert_eq!(memory.counters().writes, 0, "a refused key wrote to the device");
    assert_eq!(memory.counters().flushes, 0);
    assert!(memory.to_bytes() == before);
}

#[test]
fn key_files_must_hold_64_bytes() {
    let directory = std::env::temp_dir().join(format!("tandem-keyfile-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let good = directory.join("good");
    std::fs::write(&good, [7u8; 64]).unwrap();
    assert!(Secret::from_key_file(&good).is_ok());
    for length in [0usize, 63, 65, 4096] {
        let path = directory.join(format!("len{length}"));
        std::fs::write(&path, vec![1u8; length]).unwrap();
        let error = Secret::from_key_file(&path).unwrap_err().to_string();
        assert!(error.contains("holds") && error.contains("exactly 64"), "{error}");
        assert!(!error.contains('\n'));
    }
    let missing = Secret::from_key_file(&directory.join("missing")).unwrap_err().to_string();
    assert!(missing.starts_with("key file ") && missing.contains("No such file"), "{missing}");
    assert!(Secret::from_passphrase(String::new()).is_err());
    std::fs::remove_dir_all(&directory).unwrap();
}

#[test]
fn key_slot_operations() {
    let first = passphrase("first passphrase");
    let memory = encrypted_volume(&first);
    let device: &dyn Device = &memory;
    assert!(crypt::is_encrypted(device).unwrap());
    let key_file_path = std::env::temp_dir().join(format!("tandem-slots-{}", std::process::id()));
    std::fs::write(&key_file_path, [42u8; 64]).unwrap();
    let key_file = Secret::from_key_file(&key_file_path).unwrap();
    std::fs::remove_file(&key_file_path).unwrap();

    // Adding needs a key that opens the volume.
    assert!(matches!(crypt::add_key(device, &passphrase("nope"), &key_file, KdfCost::for_tests()), Err(Error::Key(_))));
    assert_eq!(crypt::add_key(device, &first, &key_file, KdfCost::for_tests()).unwrap(), 1);
    let slots = crypt::key_slots(device).unwrap();
    assert_eq!(slots.len(), crypt::KEY_SLOT_COUNT);
    assert_eq!(slots.iter().filter(|slot| slot.in_use).count(), 2);
    assert_eq!(slots[1].cost, Some(KdfCost::for_tests()));
    // Both open it, and the data written under one reads under the other.
    let fs = mount(&memory, &first);
    let (_, file) = write_known_files(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&memory, &key_file);
    assert_eq!(read_file(&fs, file, 1 << 20).unwrap(), contents());
    fs.unmount().unwrap();
    drop(fs);

    // Change: the new secret opens it, the old one no longer does.
    let second = passphrase("second passphrase");
    // The new slot goes to the first empty one; the old slot is wiped after it is written.
    assert_eq!(crypt::change_key(device, &first, &second, KdfCost::for_tests()).unwrap(), 2);
    assert!(!crypt::key_slots(device).unwrap()[0].in_use);
    assert!(matches!(crypt::unlock(Arc::new(memory.clone()), Some(&first)), Err(Error::Key(_))));
    assert!(crypt::unlock(Arc::new(memory.clone()), Some(&second)).is_ok());

    // Remove: refused for the last slot, done for the others.
    assert_eq!(crypt::remove_key(device, &key_file).unwrap(), 1);
    assert!(matches!(crypt::unlock(Arc::new(memory.clone()), Some(&key_file)), Err(Error::Key(_))));
    let last = crypt::remove_key(device, &second).unwrap_err().to_string();
    assert!(last.contains("only slot in use"), "{last}");
    let fs = mount(&memory, &second);
    assert_eq!(read_file(&fs, file, 1 << 20).unwrap(), contents());
    fs.unmount().unwrap();

    // All slots full: a change is refused before it writes.
    for (extra, index) in [0, 1, 3, 4, 5, 6, 7].into_iter().enumerate() {
        let extra = passphrase(&format!("extra {extra}"));
        assert_eq!(crypt::add_key(device, &second, &extra, KdfCost::for_tests()).unwrap(), index);
    }
    let full = crypt::change_key(device, &second, &first, KdfCost::for_tests()).unwrap_err().to_string();
    assert!(full.contains("all 8 key slots are in use"), "{full}");
    assert!(crypt::unlock(Arc::new(memory.clone()), Some(&second)).is_ok());
}

#[test]
fn a_damaged_slot_is_skipped_while_another_opens() {
    let first = passphrase("first passphrase");
    let memory = encrypted_volume(&first);
    let second = passphrase("second passphrase");
    crypt::add_key(&memory, &first, &second, KdfCost::for_tests()).unwrap();
    let superblock = Superblock::read_best(&memory).unwrap();
    // Flip a bit inside slot 0's wrapped key.
    let byte = superblock.key_slot_start * BLOCK_SIZE_U64 + crypt::slot::OFFSET_WRAPPED_KEY as u64 + 5;
    let mut one = [0u8; 1];
    memory.read_at(byte, &mut one).unwrap();
    memory.write_at(byte, &[one[0] ^ 0x10]).unwrap();

    let unlocked = crypt::unlock_with_report(Arc::new(memory.clone()), Some(&second)).unwrap();
    assert_eq!(unlocked.slot, Some(1));
    assert_eq!(unlocked.damaged_slots.len(), 1);
    assert_eq!(unlocked.damaged_slots[0].0, 0);
    assert!(unlocked.damaged_slots[0].1.contains("checksum"), "{:?}", unlocked.damaged_slots);
    let fs = mount(&memory, &second);
    fs.unmount().unwrap();
    // The secret of the damaged slot opens nothing; the message names the damage.
    let error = crypt::unlock(Arc::new(memory.clone()), Some(&first)).err().unwrap().to_string();
    assert!(error.contains("damaged: slot 0"), "{error}");
    assert!(!error.contains('\n'));
    let info = crypt::key_slots(&memory).unwrap();
    assert!(info[0].damage.is_some() && !info[0].in_use && info[1].in_use);
}

#[test]
fn a_plain_volume_unlocks_to_itself_and_has_no_slots() {
    let (memory, device) = memory_volume(VOLUME_BYTES, false);
    assert!(!crypt::is_encrypted(&memory).unwrap());
    let unlocked = crypt::unlock(device.clone(), Some(&passphrase("ignored"))).unwrap();
    assert!(Arc::ptr_eq(&unlocked, &device));
    assert!(crypt::key_slots(&memory).is_err());
    let _ = BLOCK_SIZE;
}

/// The volume block whose plaintext holds `needle`, searched through the decrypting device
/// from the first data block on.
fn block_holding(memory: &MemoryDevice, secret: &Secret, needle: &[u8]) -> u64 {
    let unlocked = crypt::unlock(Arc::new(memory.clone()), Some(secret)).unwrap();
    let superblock = Superblock::read_best(memory).unwrap();
    let mut block = vec![0u8; BLOCK_SIZE];
    (superblock.first_data_block..superblock.block_count)
        .find(|number| {
            unlocked.read_at(number * BLOCK_SIZE_U64, &mut block).unwrap();
            contains(&block, needle)
        })
        .expect("the plaintext is on the volume")
}

/// Flips one bit of the ciphertext on the medium, as a forger without the key could.
fn flip_ciphertext_bit(memory: &MemoryDevice, block: u64, byte: u64) {
    let mut one = [0u8; 1];
    memory.read_at(block * BLOCK_SIZE_U64 + byte, &mut one).unwrap();
    memory.write_at(block * BLOCK_SIZE_U64 + byte, &[one[0] ^ 0x04]).unwrap();
}

#[test]
fn changed_ciphertext_in_a_data_block_is_an_error_and_fsck_reports_it() {
    let secret = passphrase("correct horse battery staple");
    let memory = encrypted_volume(&secret);
    let fs = mount(&memory, &secret);
    let data = pattern(&mut rng(7), 3 * BLOCK_SIZE);
    let file = fs.create(ROOT_INODE, b"patterned", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(file, 0, &data).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    // Block 1 of the file.
    let data_block = block_holding(&memory, &secret, &data[BLOCK_SIZE..BLOCK_SIZE + 200]);
    flip_ciphertext_bit(&memory, data_block, 3000);

    let report = check_with_key(Arc::new(memory.clone()), Some(&secret));
    assert_eq!(report.damaged_data_blocks, 1, "{:#?}", report.problems);
    assert!(report.problems.iter().any(|problem| problem.contains(&format!("data block {data_block}"))));
    let fs = mount(&memory, &secret);
    let error = read_file(&fs, file, 1 << 20).unwrap_err();
    assert!(error.is_corruption(), "{error:?}");
    // The blocks beside it still read.
    let mut first = vec![0u8; BLOCK_SIZE];
    assert_eq!(fs.read(file, 0, &mut first).unwrap(), BLOCK_SIZE);
    assert_eq!(first, data[..BLOCK_SIZE]);
    fs.unmount().unwrap();
}

#[test]
fn changed_ciphertext_in_a_metadata_block_is_an_error_and_fsck_reports_it() {
    let secret = passphrase("correct horse battery staple");
    let memory = encrypted_volume(&secret);
    let fs = mount(&memory, &secret);
    let (directory, _) = write_known_files(&fs);
    fs.unmount().unwrap();
    drop(fs);
    // The directory block that holds the file's name.
    let directory_block = block_holding(&memory, &secret, NAME);
    flip_ciphertext_bit(&memory, directory_block, 100);

    let report = check_with_key(Arc::new(memory.clone()), Some(&secret));
    assert!(!report.is_clean());
    assert!(
        report.problems.iter().any(|problem| problem.contains(&directory_block.to_string())),
        "fsck does not name block {directory_block}: {:#?}",
        report.problems
    );
    let fs = mount(&memory, &secret);
    let error = fs.lookup(directory, NAME).unwrap_err();
    assert!(error.is_corruption(), "{error:?}");
    fs.unmount().unwrap();
}

/// Replay: an inode-table block's older ciphertext, copied back to its place, decrypts
/// cleanly to the older plaintext; the (encrypted) generation table tells it is stale.
#[test]
fn an_older_ciphertext_block_put_back_is_found_stale() {
    let secret = passphrase("correct horse battery staple");
    let memory = encrypted_volume(&secret);
    let fs = mount(&memory, &secret);
    write_known_files(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let superblock = Superblock::read_best(&memory).unwrap();
    let table_block = superblock.inode_table_start * BLOCK_SIZE_U64;
    let mut older = vec![0u8; BLOCK_SIZE];
    memory.read_at(table_block, &mut older).unwrap();
    let fs = mount(&memory, &secret);
    let later = fs.create(ROOT_INODE, b"later", FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
    fs.write(later, 0, b"written after the copy was taken").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let mut newer = vec![0u8; BLOCK_SIZE];
    memory.read_at(table_block, &mut newer).unwrap();
    assert_ne!(older, newer, "the inode-table block was rewritten in place");
    memory.write_at(table_block, &older).unwrap();

    let report = check_with_key(Arc::new(memory.clone()), Some(&secret));
    assert!(
        report.problems.iter().any(|problem| problem.contains("stale")),
        "fsck does not see the stale block: {:#?}",
        report.problems
    );
    match FileSystem::mount(Arc::new(memory.clone()), &keyed(&secret)) {
        Err(error) => assert!(error.is_corruption(), "{error:?}"),
        Ok((fs, _)) => {
            let error = fs.lookup(ROOT_INODE, b"later").and_then(|_| fs.get_attributes(later)).unwrap_err();
            assert!(error.is_corruption(), "{error:?}");
        }
    }
}
