//! C entry point of the tandemfs batch API, declared in `include/tandem_batch.h`: open an image
//! in the calling process, answer batches of lookups and path resolutions (one answer per
//! request, negative errno for a failed one), close. docs/BATCH.md describes the calls.
//!
//! Everything the C caller hands in is checked before use: handles are tokens looked up in a
//! table (never dereferenced, so a stale or invented handle answers -EBADF), arrays must be
//! non-null and aligned with a bounded count, and every name and path length is bounded before
//! a slice is made of it. No panic crosses into C: each call catches one and answers -EIO.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tandemfs::device::{FileDevice, FileDeviceOptions};
use tandemfs::fs::{Attributes, MountOptions, NAME_MAX_BYTES};
use tandemfs::{Error, FileSystem};

/// The most requests in one call (`TANDEM_BATCH_MAX`).
pub const BATCH_MAX: usize = 1 << 24;
/// The longest path a resolve reads, in bytes (`TANDEM_PATH_MAX`).
pub const PATH_MAX_BYTES: usize = 4096;
/// `TANDEM_OPEN_READ_ONLY`.
pub const OPEN_READ_ONLY: u32 = 1;

/// `struct tandem_fs`: opaque to C. Its pointers are tokens, never dereferenced.
pub enum TandemFs {}

/// `struct tandem_attributes`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TandemAttributes {
    pub inode: u64,
    pub generation: u64,
    pub mode: u32,
    pub link_count: u32,
    pub uid: u32,
    pub gid: u32,
    pub size_bytes: u64,
    pub blocks_512: u64,
    pub access_time_ns: i64,
    pub modify_time_ns: i64,
    pub change_time_ns: i64,
    pub birth_time_ns: i64,
    pub rdev: u64,
}

// The header's layout: 2×8 + 4×4 + 7×8 bytes, no padding.
const _: () = assert!(std::mem::size_of::<TandemAttributes>() == 88);

/// `struct tandem_lookup`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TandemLookup {
    pub parent: u64,
    pub name: *const u8,
    pub name_length: usize,
}

/// `struct tandem_path`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TandemPath {
    pub bytes: *const u8,
    pub length: usize,
}

impl From<&Attributes> for TandemAttributes {
    fn from(attributes: &Attributes) -> TandemAttributes {
        TandemAttributes {
            inode: attributes.inode,
            generation: attributes.generation,
            mode: attributes.mode(),
            link_count: attributes.link_count,
            uid: attributes.uid,
            gid: attributes.gid,
            size_bytes: attributes.size_bytes,
            blocks_512: attributes.blocks_512,
            access_time_ns: attributes.access_time_ns,
            modify_time_ns: attributes.modify_time_ns,
            change_time_ns: attributes.change_time_ns,
            birth_time_ns: attributes.birth_time_ns,
            rdev: attributes.rdev,
        }
    }
}

/// The open volumes by token. A token is never reused, so a closed handle stays invalid.
static OPEN: Mutex<BTreeMap<usize, Arc<FileSystem>>> = Mutex::new(BTreeMap::new());
/// The next token's number; tokens are multiples of 16 so that they look like pointers.
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(1);

fn open_volumes() -> std::sync::MutexGuard<'static, BTreeMap<usize, Arc<FileSystem>>> {
    // A panic while the table was held cannot leave it half changed (one insert or remove).
    OPEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn volume_of(handle: *mut TandemFs) -> Result<Arc<FileSystem>, c_int> {
    open_volumes().get(&(handle as usize)).cloned().ok_or(-libc::EBADF)
}

/// Runs a call, turning a panic into -EIO.
fn guarded(call: impl FnOnce() -> Result<(), c_int>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(Ok(())) => 0,
        Ok(Err(errno)) => errno,
        Err(_) => -libc::EIO,
    }
}

/// The negative errno of an engine error.
fn negative_errno(error: &Error) -> c_int {
    -tandem_fuse::errno_of(error)
}

/// The negative errno of a failed open: the device's I/O errors by their kind (a missing
/// image, one in use), the engine's errors as everywhere else.
fn open_errno(error: &Error) -> c_int {
    match error {
        Error::Io { source, .. } => match source.kind() {
            std::io::ErrorKind::NotFound => -libc::ENOENT,
            std::io::ErrorKind::PermissionDenied => -libc::EACCES,
            std::io::ErrorKind::WouldBlock => -libc::EBUSY,
            _ => negative_errno(error),
        },
        _ => negative_errno(error),
    }
}

/// `count` items at `pointer`, checked: non-null and aligned unless empty, count bounded.
///
/// # Safety
/// When the checks pass, `pointer` must point at `count` readable items (the C caller's word).
unsafe fn input_slice<'a, T>(pointer: *const T, count: usize) -> Result<&'a [T], c_int> {
    if count > BATCH_MAX {
        return Err(-libc::EINVAL);
    }
    if count == 0 {
        return Ok(&[]);
    }
    if pointer.is_null() || !pointer.is_aligned() {
        return Err(-libc::EINVAL);
    }
    Ok(std::slice::from_raw_parts(pointer, count))
}

/// `count` writable items at `pointer`, checked like `input_slice`.
///
/// # Safety
/// When the checks pass, `pointer` must point at `count` writable items.
unsafe fn output_slice<'a, T>(pointer: *mut T, count: usize) -> Result<&'a mut [T], c_int> {
    if count > BATCH_MAX {
        return Err(-libc::EINVAL);
    }
    if count == 0 {
        return Ok(&mut []);
    }
    if pointer.is_null() || !pointer.is_aligned() {
        return Err(-libc::EINVAL);
    }
    Ok(std::slice::from_raw_parts_mut(pointer, count))
}

/// `length` bytes at `bytes` when `length` is at most `limit`; `too_long` past it (the bytes
/// are not read then); -EFAULT for a null pointer with a length.
///
/// # Safety
/// When the checks pass, `bytes` must point at `length` readable bytes.
unsafe fn request_bytes<'a>(bytes: *const u8, length: usize, limit: usize, too_long: c_int) -> Result<&'a [u8], c_int> {
    if length > limit {
        return Err(too_long);
    }
    if length == 0 {
        return Ok(&[]);
    }
    if bytes.is_null() {
        return Err(-libc::EFAULT);
    }
    Ok(std::slice::from_raw_parts(bytes, length))
}

/// Whether the `count`-item arrays at `first` and `second` share no byte: the outputs must not
/// overlap each other or the requests (they become separate Rust slices).
fn disjoint<A, B>(first: *const A, second: *const B, count: usize) -> bool {
    let (start_a, start_b) = (first as usize, second as usize);
    let end_a = start_a.saturating_add(count.saturating_mul(std::mem::size_of::<A>()));
    let end_b = start_b.saturating_add(count.saturating_mul(std::mem::size_of::<B>()));
    count == 0 || end_a <= start_b || end_b <= start_a
}

/// A batch call's requests, attributes and results, as slices.
type BatchArrays<'a, R> = (&'a [R], &'a mut [TandemAttributes], &'a mut [i32]);

/// The three arrays of a batch call, checked (bounds, nulls, alignment, no overlap).
///
/// # Safety
/// As `input_slice` and `output_slice`.
unsafe fn batch_arrays<'a, R>(
    requests: *const R,
    count: usize,
    attributes: *mut TandemAttributes,
    results: *mut i32,
) -> Result<BatchArrays<'a, R>, c_int> {
    if !disjoint(attributes, results, count)
        || !disjoint(requests, attributes, count)
        || !disjoint(requests, results, count)
    {
        return Err(-libc::EINVAL);
    }
    Ok((input_slice(requests, count)?, output_slice(attributes, count)?, output_slice(results, count)?))
}

/// Answers the requests that passed their checks with `batch` and writes every answer.
fn answer<'a>(
    checked: Vec<Result<&'a [u8], c_int>>,
    batch: impl FnOnce(&[usize], &[&'a [u8]]) -> Vec<tandemfs::Result<Attributes>>,
    attributes: &mut [TandemAttributes],
    results: &mut [i32],
) {
    let mut positions = Vec::with_capacity(checked.len());
    let mut accepted = Vec::with_capacity(checked.len());
    for (position, request) in checked.into_iter().enumerate() {
        attributes[position] = TandemAttributes::default();
        match request {
            Ok(bytes) => {
                positions.push(position);
                accepted.push(bytes);
            }
            Err(errno) => results[position] = errno,
        }
    }
    let answers = batch(&positions, &accepted);
    assert_eq!(answers.len(), positions.len(), "one answer per request");
    for (position, found) in positions.into_iter().zip(answers) {
        match found {
            Ok(found) => {
                attributes[position] = TandemAttributes::from(&found);
                results[position] = 0;
            }
            Err(error) => results[position] = negative_errno(&error),
        }
    }
}

/// # Safety
/// `image_path` must be null or a NUL-terminated string; `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn tandem_open(image_path: *const c_char, flags: u32, out: *mut *mut TandemFs) -> c_int {
    guarded(|| {
        if image_path.is_null() || out.is_null() || !out.is_aligned() || flags & !OPEN_READ_ONLY != 0 {
            return Err(-libc::EINVAL);
        }
        let path = CStr::from_ptr(image_path);
        let path = std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()));
        let read_only = flags & OPEN_READ_ONLY != 0;
        let options = FileDeviceOptions { create_size_bytes: None, lock_exclusive: true, read_only };
        let device = FileDevice::open(path, options).map_err(|error| open_errno(&error))?;
        let mount_options = MountOptions { read_only, ..MountOptions::default() };
        let (fs, _) = FileSystem::mount(Arc::new(device), &mount_options).map_err(|error| open_errno(&error))?;
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) << 4;
        open_volumes().insert(token, Arc::new(fs));
        *out = token as *mut TandemFs;
        Ok(())
    })
}

/// # Safety
/// None beyond C's: `fs` is only compared with the open handles.
#[no_mangle]
pub unsafe extern "C" fn tandem_close(fs: *mut TandemFs) -> c_int {
    guarded(|| {
        let volume = open_volumes().remove(&(fs as usize)).ok_or(-libc::EBADF)?;
        // A batch still running on another thread holds the volume; it ends with answers
        // from an unmounted volume (errors), never with freed memory.
        volume.unmount().map_err(|error| negative_errno(&error))
    })
}

/// # Safety
/// `requests` must point at `count` lookups (their names at `name_length` bytes each),
/// `attributes` and `results` at `count` writable items, when non-null.
#[no_mangle]
pub unsafe extern "C" fn tandem_lookup_batch(
    fs: *mut TandemFs,
    requests: *const TandemLookup,
    count: usize,
    attributes: *mut TandemAttributes,
    results: *mut i32,
) -> c_int {
    guarded(|| {
        let volume = volume_of(fs)?;
        let (requests, attributes, results) = batch_arrays(requests, count, attributes, results)?;
        let checked = requests
            .iter()
            .map(|request| request_bytes(request.name, request.name_length, NAME_MAX_BYTES, -libc::ENAMETOOLONG))
            .collect();
        let batch = |positions: &[usize], names: &[&[u8]]| {
            let lookups: Vec<(u64, &[u8])> =
                positions.iter().zip(names).map(|(position, name)| (requests[*position].parent, *name)).collect();
            volume.lookup_batch(&lookups)
        };
        answer(checked, batch, attributes, results);
        Ok(())
    })
}

/// # Safety
/// `paths` must point at `count` paths (their bytes at `length` bytes each), `attributes` and
/// `results` at `count` writable items, when non-null.
#[no_mangle]
pub unsafe extern "C" fn tandem_resolve_paths(
    fs: *mut TandemFs,
    paths: *const TandemPath,
    count: usize,
    attributes: *mut TandemAttributes,
    results: *mut i32,
) -> c_int {
    guarded(|| {
        let volume = volume_of(fs)?;
        let (paths, attributes, results) = batch_arrays(paths, count, attributes, results)?;
        let checked = paths
            .iter()
            .map(|path| request_bytes(path.bytes, path.length, PATH_MAX_BYTES, -libc::ENAMETOOLONG))
            .collect();
        answer(checked, |_, accepted| volume.resolve_paths(accepted), attributes, results);
        Ok(())
    })
}
