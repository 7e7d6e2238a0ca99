//! Damage in the log and in checkpoint images must never be silent (issue 13): a damaged
//! record followed by intact ones, a header field changed behind a re-sealed CRC, a record
//! kind replay does not know, an impossible value behind a valid checksum, a checkpoint image
//! whose trailer names another block, a moved log tail. For each: fsck reports a problem, mount
//! refuses with an error naming what is wrong, and where a repair exists
//! (`backend::discard_damaged_log`) it keeps the records before the damage, lists what it
//! dropped, and every file reads back exactly as the kept records leave it.

mod common;

use common::*;
use std::sync::Arc;
use tandemfs::backend::{self, record};
use tandemfs::block::superblock::Superblock;
use tandemfs::device::{Device, MemoryDevice};
use tandemfs::fs::*;
use tandemfs::log::{Log, LogGeometry, LogPosition, Record, RecordHeader, HEADER_SIZE};

use tandemfs::{fsck, FileSystem};

/// Deterministic: no background flusher, no background back end.
fn options() -> MountOptions {
    MountOptions { flush_delay_us: u64::MAX, background_backend: false, ..MountOptions::default() }
}

fn contents(index: usize, length: usize) -> Vec<u8> {
    (0..length)
        .map(|at| (at as u8).wrapping_mul(7).wrapping_add((index as u8).wrapping_mul(31)) ^ (at >> 9) as u8)
        .collect()
}

/// A file a test created, and the lsns of the records that made it.
#[derive(Clone, Debug)]
struct Made {
    name: String,
    data: Vec<u8>,
    create_lsn: u64,
    write_lsn: u64,
}

/// Creates `name` with `data` in the root, each change synced on its own (its own group
/// commit), and returns the lsns of its two records.
fn make_file(fs: &FileSystem, name: &str, data: Vec<u8>) -> Made {
    let create_lsn = fs.log_statistics().next_lsn;
    let created = fs.create(ROOT_INODE, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.sync().unwrap();
    let write_lsn = fs.log_statistics().next_lsn;
    assert_eq!(write_lsn, create_lsn + 1, "one record per create");
    fs.write(created.inode, 0, &data).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.log_statistics().next_lsn, write_lsn + 1, "one record per write");
    Made { name: name.to_string(), data, create_lsn, write_lsn }
}

/// A volume that crashed with pending records: three files checkpointed, then eight files
/// whose records are only in the log, each record its own group commit.
fn crashed_volume() -> (Vec<u8>, Vec<Made>, Vec<Made>) {
    let (memory, device) = memory_volume(16 << 20, false);
    let (fs, _) = FileSystem::mount(device, &options()).unwrap();
    let base: Vec<Made> = (0..3).map(|i| make_file(&fs, &format!("base{i}"), contents(i, 5000))).collect();
    fs.checkpoint().unwrap();
    let pending: Vec<Made> = (0..8).map(|i| make_file(&fs, &format!("pending{i}"), contents(10 + i, 3000))).collect();
    drop(fs); // a crash: no unmount, no checkpoint
    (memory.to_bytes(), base, pending)
}

struct LogView {
    superblock: Superblock,
    geometry: LogGeometry,
    tail: LogPosition,
    records: Vec<Record>,
    end: LogPosition,
    /// The image log (format version 9): checkpoint images and commits.
    image_geometry: LogGeometry,
    image_records: Vec<Record>,
}

fn log_view(image: &[u8]) -> LogView {
    let device = MemoryDevice::from_bytes(image.to_vec());
    let superblock = Superblock::read_best(&device).unwrap();
    let geometry = superblock.log_geometry();
    let tail = LogPosition { lsn: superblock.log_tail_lsn, data_position: superblock.log_tail_data_position };
    let scan = Log::scan(&device, &geometry, tail).unwrap();
    assert!(scan.damage.is_none(), "the undamaged volume scans clean");
    let image_geometry = superblock.image_log_geometry().unwrap();
    let image_scan = Log::scan(&device, &image_geometry, superblock.image_log_tail()).unwrap();
    assert!(image_scan.damage.is_none(), "the undamaged image log scans clean");
    LogView {
        superblock,
        geometry,
        tail,
        records: scan.records,
        end: scan.end,
        image_geometry,
        image_records: image_scan.records,
    }
}

fn header_offset(geometry: &LogGeometry, lsn: u64) -> usize {
    (geometry.header_start_byte + (lsn % geometry.header_slots) * HEADER_SIZE as u64) as usize
}

fn header(image: &[u8], geometry: &LogGeometry, lsn: u64) -> RecordHeader {
    let at = header_offset(geometry, lsn);
    let header = RecordHeader::decode(&image[at..at + HEADER_SIZE]).unwrap();
    assert_eq!(header.lsn, lsn);
    header
}

/// Changes header fields of record `lsn` and re-seals its CRC.
fn reseal_header(image: &mut [u8], geometry: &LogGeometry, lsn: u64, change: impl FnOnce(&mut RecordHeader)) {
    let mut changed = header(image, geometry, lsn);
    change(&mut changed);
    let at = header_offset(geometry, lsn);
    changed.encode(&mut image[at..at + HEADER_SIZE]);
}

/// Device offset of the payload of record `lsn` (the tests' payloads do not wrap the ring).
fn payload_offset(image: &[u8], geometry: &LogGeometry, lsn: u64) -> (usize, usize) {
    let header = header(image, geometry, lsn);
    let within = header.data_position % geometry.data_bytes;
    assert!(within + header.payload_length as u64 <= geometry.data_bytes, "payload wraps");
    ((geometry.data_start_byte + within) as usize, header.payload_length as usize)
}

/// Changes the payload of record `lsn` and seals it again: payload CRC and header CRC.
fn reseal_payload(image: &mut [u8], geometry: &LogGeometry, lsn: u64, change: impl FnOnce(&mut [u8])) {
    let (at, length) = payload_offset(image, geometry, lsn);
    change(&mut image[at..at + length]);
    let crc = tandem_accel::crc32c(0, &image[at..at + length]);
    reseal_header(image, geometry, lsn, |header| header.payload_crc = crc);
}

fn device_of(image: &[u8]) -> Arc<dyn Device> {
    Arc::new(MemoryDevice::from_bytes(image.to_vec()))
}

/// fsck reports a problem containing `expected`, and mount refuses with a corruption error
/// containing it.
fn assert_refused(image: &[u8], expected: &str) {
    let report = fsck::check(device_of(image)).unwrap();
    assert!(!report.is_clean(), "fsck called a damaged log clean");
    assert!(
        report.problems.iter().any(|problem| problem.contains(expected)),
        "fsck problems {:?} do not mention {expected:?}",
        report.problems
    );
    match FileSystem::mount(device_of(image), &options()) {
        Ok(_) => panic!("mount accepted a damaged log ({expected})"),
        Err(error) => {
            assert!(error.is_corruption(), "mount: {error}");
            let message = error.to_string();
            assert!(message.contains(expected), "mount error {message:?} does not mention {expected:?}");
            assert!(!message.contains('\n'), "one line: {message:?}");
        }
    }
}

/// Reads `name` from the root: None when it does not exist.
fn read_file(fs: &FileSystem, name: &str) -> Option<Vec<u8>> {
    let attributes = match fs.lookup(ROOT_INODE, name.as_bytes()) {
        Ok(attributes) => attributes,
        Err(tandemfs::Error::NotFound) => return None,
        Err(error) => panic!("lookup {name}: {error}"),
    };
    let mut buffer = vec![0u8; attributes.size_bytes as usize];
    let read = fs.read(attributes.inode, 0, &mut buffer).unwrap();
    assert_eq!(read, buffer.len(), "{name}: short read");
    Some(buffer)
}

/// After a repair that dropped the records from `first_lost` on, every file holds exactly what
/// the kept records give it: base files whole, pending files whole, empty or absent.
fn assert_prefix_kept(image: &[u8], base: &[Made], pending: &[Made], first_lost: u64) {
    let report = fsck::check(device_of(image)).unwrap();
    assert!(report.is_clean(), "fsck after repair: {:?}", report.problems);
    let (fs, _) = FileSystem::mount(device_of(image), &options()).unwrap();
    for made in base {
        assert_eq!(read_file(&fs, &made.name).as_deref(), Some(&made.data[..]), "{}", made.name);
    }
    for made in pending {
        let expected = if made.write_lsn < first_lost {
            Some(made.data.clone())
        } else if made.create_lsn < first_lost {
            Some(Vec::new())
        } else {
            None
        };
        assert_eq!(read_file(&fs, &made.name), expected, "{} after losing lsn {first_lost} on", made.name);
    }
    fs.unmount().unwrap();
}

/// Runs the repair and checks it names `first_lost` first and lists every record after it.
fn repair(image: &mut Vec<u8>, first_lost: u64, last_record: u64) -> Vec<backend::LostRecord> {
    let device = MemoryDevice::from_bytes(image.clone());
    let lost = backend::discard_damaged_log(Arc::new(device.clone())).unwrap();
    assert_eq!(lost.first().map(|record| record.lsn), Some(first_lost), "{lost:?}");
    assert_eq!(lost.last().map(|record| record.lsn), Some(last_record), "{lost:?}");
    assert_eq!(lost.len() as u64, last_record - first_lost + 1, "{lost:?}");
    *image = device.to_bytes();
    // A second repair finds nothing to do.
    assert!(backend::discard_damaged_log(device_of(image)).unwrap().is_empty());
    lost
}

#[test]
fn undamaged_crashed_volume_replays_everything() {
    let (image, base, pending) = crashed_volume();
    let view = log_view(&image);
    assert_eq!(view.records.len(), 16, "eight files, two records each, pending");
    assert!(backend::discard_damaged_log(device_of(&image)).unwrap().is_empty());
    assert_prefix_kept(&image, &base, &pending, u64::MAX);
}

#[test]
fn torn_last_record_is_a_normal_end_of_log() {
    let (mut image, base, pending) = crashed_volume();
    let view = log_view(&image);
    let last = view.end.lsn - 1;
    let (at, _) = payload_offset(&image, &view.geometry, last);
    image[at + 100] ^= 0x10; // the last group commit's payload, as a crash tears it
    assert!(fsck::check(device_of(&image)).unwrap().is_clean());
    assert_prefix_kept(&image, &base, &pending, last);
}

#[test]
fn damaged_payload_in_the_middle_is_reported_and_repaired() {
    let (mut image, base, pending) = crashed_volume();
    let view = log_view(&image);
    let damaged = pending[3].write_lsn;
    let (at, length) = payload_offset(&image, &view.geometry, damaged);
    for bit in [3, 700, 2900] {
        image[at + (bit % length)] ^= 0x04;
    }
    assert_refused(&image, &format!("log record {damaged} "));
    let lost = repair(&mut image, damaged, view.end.lsn - 1);
    assert!(lost[0].what.contains("damaged"), "{lost:?}");
    assert!(lost[1].what.contains("create \"pending4\""), "{lost:?}");
    assert_prefix_kept(&image, &base, &pending, damaged);
}

/// A change made to a header before it is sealed again; the second argument is the slot count.
type HeaderChange = fn(&mut RecordHeader, u64);

#[test]
fn header_field_changed_behind_a_resealed_crc_is_reported_and_repaired() {
    // Each field a damaged header can carry: the length, the payload CRC, the lsn (as an
    // earlier lap would), the batch.
    let changes: [(&str, HeaderChange); 4] = [
        ("payload length", |header, _| header.payload_length += 1),
        ("payload crc", |header, _| header.payload_crc ^= 0x100),
        ("lsn", |header, slots| header.lsn += slots),
        ("batch", |header, _| header.batch_first_lsn = header.lsn + 1),
    ];
    for (field, change) in changes {
        let (mut image, base, pending) = crashed_volume();
        let view = log_view(&image);
        let damaged = pending[2].create_lsn;
        let slots = view.geometry.header_slots;
        let at = header_offset(&view.geometry, damaged);
        let mut changed = header(&image, &view.geometry, damaged);
        change(&mut changed, slots);
        changed.encode(&mut image[at..at + HEADER_SIZE]);
        assert_refused(&image, &format!("log record {damaged} "));
        repair(&mut image, damaged, view.end.lsn - 1);
        assert_prefix_kept(&image, &base, &pending, damaged);
        println!("{field}: reported and repaired");
    }
}

#[test]
fn unknown_record_kind_stops_replay() {
    let (mut image, base, pending) = crashed_volume();
    let view = log_view(&image);
    let damaged = pending[5].create_lsn;
    reseal_header(&mut image, &view.geometry, damaged, |header| header.kind = 55);
    assert_refused(&image, &format!("log record {damaged} cannot be replayed"));
    // Kinds above the checkpoint kinds were skipped without a word before.
    reseal_header(&mut image, &view.geometry, damaged, |header| header.kind = 300);
    assert_refused(&image, &format!("log record {damaged} cannot be replayed"));
    let lost = repair(&mut image, damaged, view.end.lsn - 1);
    assert!(lost[0].what.contains("kind 300"), "{lost:?}");
    assert_prefix_kept(&image, &base, &pending, damaged);
}

#[test]
fn invalid_mode_behind_a_valid_checksum_stops_replay() {
    let (mut image, base, pending) = crashed_volume();
    let view = log_view(&image);
    let damaged = pending[4].write_lsn;
    // The attribute image starts the payload: inode u64, generation u64, mode u32. A mode bit
    // above the type bits decodes as a regular file but the inode decoder rejects it.
    reseal_payload(&mut image, &view.geometry, damaged, |payload| payload[18] |= 0x04);
    assert_refused(&image, &format!("log record {damaged} cannot be replayed"));
    repair(&mut image, damaged, view.end.lsn - 1);
    assert_prefix_kept(&image, &base, &pending, damaged);
}

#[test]
fn moved_tail_is_reported() {
    let (image, _, pending) = crashed_volume();
    let view = log_view(&image);
    // To the end (every pending record dropped) and to a record boundary in the middle.
    let middle = pending[4].create_lsn;
    let middle_position = header(&image, &view.geometry, middle).data_position;
    for (lsn, data_position) in [(view.end.lsn, view.end.data_position), (middle, middle_position)] {
        let memory = MemoryDevice::from_bytes(image.clone());
        let mut superblock = view.superblock.clone();
        superblock.sequence += 1;
        superblock.log_tail_lsn = lsn;
        superblock.log_tail_data_position = data_position;
        superblock.checkpoint_lsn = lsn - 1;
        superblock.write(&memory).unwrap();
        let moved = memory.to_bytes();
        assert_refused(&moved, "log tail");
        // Discarding records cannot bring back what the tail skipped: the repair says so.
        let error = backend::discard_damaged_log(device_of(&moved)).unwrap_err();
        assert!(error.is_corruption(), "{error}");
    }
    assert!(view.tail.lsn > 1);
}

/// A checkpoint committed in the log but not recorded in the superblock (a crash between the
/// two): mount writes its images home. One image's block number is changed to a data block of a
/// file, behind re-sealed checksums.
#[test]
fn checkpoint_image_naming_another_block_is_refused() {
    let (memory, device) = memory_volume(16 << 20, false);
    let (fs, _) = FileSystem::mount(device, &options()).unwrap();
    let first = make_file(&fs, "first", contents(1, 8192));
    fs.checkpoint().unwrap();
    let second = make_file(&fs, "second", contents(2, 8192));
    fs.run_backend().unwrap();
    let superblocks_before = memory.to_bytes()[..2 * 4096].to_vec();
    fs.checkpoint().unwrap();
    drop(fs);
    let mut image = memory.to_bytes();
    image[..2 * 4096].copy_from_slice(&superblocks_before);
    // Untouched, this mounts by completing the checkpoint.
    {
        let (fs, report) = FileSystem::mount(device_of(&image), &options()).unwrap();
        assert!(report.checkpoint_completed);
        assert_eq!(read_file(&fs, "first"), Some(first.data.clone()));
        assert_eq!(read_file(&fs, "second"), Some(second.data.clone()));
    }
    let view = log_view(&image);
    let images = view.image_records.iter().find(|record| record.kind == record::KIND_CHECKPOINT_IMAGES).unwrap().lsn;
    // The home block holding the first 4 KiB of "first".
    let data_block = image.chunks(4096).position(|block| block == &first.data[..4096]).unwrap() as u64;
    reseal_payload(&mut image, &view.image_geometry, images, |payload| {
        payload[12..20].copy_from_slice(&data_block.to_le_bytes());
    });
    assert_refused(&image, &format!("image log record {images} cannot be used"));
    let report = fsck::check(device_of(&image)).unwrap();
    assert!(report.problems[0].contains("checkpoint image"), "{:?}", report.problems);
}

/// Repairing the image damage above. While none of the checkpoint's images reached home (the
/// crash came between the commit and the home writes), discarding from the damaged image
/// record is safe: mount replays the records the checkpoint covered over the old home blocks,
/// and every file reads back whole. Once images are home, replaying over them is not
/// repeatable: the repair refuses and changes nothing.
#[test]
fn repair_of_a_bad_checkpoint_image_is_safe_or_refused() {
    let (memory, device) = memory_volume(16 << 20, false);
    let (fs, _) = FileSystem::mount(device, &options()).unwrap();
    let first = make_file(&fs, "first", contents(1, 8192));
    fs.checkpoint().unwrap();
    let second = make_file(&fs, "second", contents(2, 8192));
    fs.run_backend().unwrap();
    let before = memory.to_bytes();
    fs.checkpoint().unwrap();
    drop(fs);
    let after = memory.to_bytes();
    let view = log_view(&before);
    // Both logs: the record log's rings and the image log's right after them.
    let logs = view.geometry.header_start_byte as usize
        ..(view.image_geometry.data_start_byte + view.image_geometry.data_bytes) as usize;
    // Images home, superblock not written / commit durable, nothing home yet.
    let mut images_home = after.clone();
    images_home[..2 * 4096].copy_from_slice(&before[..2 * 4096]);
    let mut nothing_home = before.clone();
    nothing_home[logs.clone()].copy_from_slice(&after[logs]);
    for (mut image, home) in [(images_home, true), (nothing_home, false)] {
        let view = log_view(&image);
        let images =
            view.image_records.iter().find(|record| record.kind == record::KIND_CHECKPOINT_IMAGES).unwrap().lsn;
        let data_block = image.chunks(4096).position(|block| block == &first.data[..4096]).unwrap() as u64;
        reseal_payload(&mut image, &view.image_geometry, images, |payload| {
            payload[12..20].copy_from_slice(&data_block.to_le_bytes());
        });
        assert_refused(&image, &format!("image log record {images} cannot be used"));
        let device = MemoryDevice::from_bytes(image.clone());
        let repaired = backend::discard_damaged_log(Arc::new(device.clone()));
        if home {
            let error = repaired.unwrap_err();
            assert!(error.is_corruption() && error.to_string().contains("already home"), "{error}");
            assert!(device.to_bytes() == image, "a refused repair writes nothing");
            continue;
        }
        let lost = repaired.unwrap();
        assert_eq!(lost.first().map(|record| record.lsn), Some(images), "{lost:?}");
        assert!(lost.last().unwrap().what.contains("checkpoint commit"), "{lost:?}");
        let image = device.to_bytes();
        assert!(fsck::check(device_of(&image)).unwrap().is_clean());
        let (fs, _) = FileSystem::mount(device_of(&image), &options()).unwrap();
        assert_eq!(read_file(&fs, "first"), Some(first.data.clone()));
        assert_eq!(read_file(&fs, "second"), Some(second.data.clone()));
    }
}
