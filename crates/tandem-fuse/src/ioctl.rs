//! Byte-granular insert and collapse on an open file of a mounted tandemfs, through ioctl(2).
//!
//! `fallocate(2)` cannot carry these operations: the kernel's FUSE client refuses
//! `FALLOC_FL_INSERT_RANGE` and `FALLOC_FL_COLLAPSE_RANGE` before they reach the server, and
//! block-aligned ranges would not be byte-granular anyway. So tandemfs defines two ioctl
//! commands, mirrored in `include/tandem.h`:
//!
//! * [`INSERT`]: insert `length` bytes at `offset`, shifting later bytes up. With `data == 0`
//!   the new bytes are a hole that reads as zeros. With `data` pointing at `length` bytes in
//!   the caller's memory, the server copies them from the calling process and inserts them in
//!   one engine operation.
//! * [`COLLAPSE`]: remove `length` bytes at `offset`, shifting later bytes down; `data` must
//!   be 0.
//! * [`DEFRAG`]: compaction (`FileSystem::defrag`): takes a [`DefragRequest`] with the factor
//!   and answers it with the space the file held before and holds after.
//!
//! The kernel hands a FUSE server only the fixed-size argument of an ioctl (the 24-byte
//! [`RangeRequest`]; FUSE's unrestricted ioctl protocol exists only for CUSE devices), so the
//! server cannot follow `data` through the kernel. It reads the bytes with
//! `process_vm_readv(2)` from the calling thread instead, which works when the server may
//! trace the caller (the usual case: the server runs as root, or as the same user as the
//! caller). When it may not, the server answers `EOPNOTSUPP` and [`insert_data`] falls back
//! to an `INSERT` of a hole followed by `pwrite(2)` of the data: the final contents are the
//! same, but a concurrent reader may briefly see zeros where the data goes.
//!
//! The file must be open for writing (`EBADF` otherwise). After the change the server
//! invalidates the kernel's cached pages from `offset` on and the cached attributes, so the
//! page cache and `mmap` never show the old layout.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

/// The ioctl "magic" type byte shared by the tandemfs commands.
pub const MAGIC: u8 = 0xD4;
/// Number of the insert command within [`MAGIC`].
pub const INSERT_NUMBER: u8 = 1;
/// Number of the collapse command within [`MAGIC`].
pub const COLLAPSE_NUMBER: u8 = 2;

/// The argument of both commands, as laid out in C (`struct tandem_range` in `tandem.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeRequest {
    /// Byte offset in the file.
    pub offset: u64,
    /// Number of bytes to insert or remove.
    pub length: u64,
    /// For INSERT: address of `length` bytes in the caller's memory, or 0 for a hole.
    /// For COLLAPSE: must be 0.
    pub data: u64,
}

/// Size of [`RangeRequest`] in bytes, as encoded in the command numbers.
pub const RANGE_REQUEST_BYTES: usize = 24;
const _: () = assert!(std::mem::size_of::<RangeRequest>() == RANGE_REQUEST_BYTES);

/// Largest insert whose data the server copies out of the caller in one piece. Larger inserts
/// go through the hole-then-pwrite path, which streams through the page cache instead of
/// holding the whole buffer in the server.
pub const INLINE_INSERT_MAX_BYTES: u64 = 64 << 20;

/// Number of the defrag command within [`MAGIC`].
pub const DEFRAG_NUMBER: u8 = 3;

/// The argument and answer of [`DEFRAG`] (`struct tandem_defrag` in `tandem.h`): the caller
/// fills `factor_millis`, the server answers with every field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefragRequest {
    /// Compact when the file holds more than this many thousandths of the bytes it maps
    /// (1,200: 1.2×); at least 1,000. `u64::MAX` only reports.
    pub factor_millis: u64,
    /// Bytes the file maps (its written and unwritten extents).
    pub mapped_bytes: u64,
    /// Bytes of blocks the file held before.
    pub held_bytes_before: u64,
    /// Bytes of blocks the file holds after (the old blocks are free at the next checkpoint).
    pub held_bytes_after: u64,
    /// Compaction records logged; 0 when the file held at most the factor.
    pub records: u64,
}

/// Size of [`DefragRequest`] in bytes, as encoded in the command number.
pub const DEFRAG_REQUEST_BYTES: usize = 40;
const _: () = assert!(std::mem::size_of::<DefragRequest>() == DEFRAG_REQUEST_BYTES);

impl DefragRequest {
    /// Decodes native-endian bytes (the kernel's copy of the caller's struct).
    pub fn from_bytes(bytes: &[u8]) -> Option<DefragRequest> {
        if bytes.len() < DEFRAG_REQUEST_BYTES {
            return None;
        }
        let word = |index: usize| u64::from_ne_bytes(bytes[index * 8..index * 8 + 8].try_into().expect("8 bytes"));
        Some(DefragRequest {
            factor_millis: word(0),
            mapped_bytes: word(1),
            held_bytes_before: word(2),
            held_bytes_after: word(3),
            records: word(4),
        })
    }

    /// Native-endian bytes, for the server's answer.
    pub fn to_bytes(&self) -> [u8; DEFRAG_REQUEST_BYTES] {
        let mut bytes = [0u8; DEFRAG_REQUEST_BYTES];
        let words =
            [self.factor_millis, self.mapped_bytes, self.held_bytes_before, self.held_bytes_after, self.records];
        for (index, word) in words.iter().enumerate() {
            bytes[index * 8..index * 8 + 8].copy_from_slice(&word.to_ne_bytes());
        }
        bytes
    }
}

/// `_IOWR(type, number, size)`: read and write directions (bits 30 and 31 both set).
const fn read_write_command(kind: u8, number: u8, size: usize) -> u32 {
    const IOC_READ_WRITE: u32 = 3;
    (IOC_READ_WRITE << 30) | ((size as u32) << 16) | ((kind as u32) << 8) | number as u32
}

/// `TANDEM_IOC_DEFRAG` = `_IOWR(0xD4, 3, struct tandem_defrag)`.
pub const DEFRAG: u32 = read_write_command(MAGIC, DEFRAG_NUMBER, DEFRAG_REQUEST_BYTES);

/// Compacts `file` when it holds more than `factor_millis` / 1000 times the bytes it maps (see
/// `FileSystem::defrag`); returns the server's answer.
pub fn defrag(file: &File, factor_millis: u64) -> io::Result<DefragRequest> {
    let mut request = DefragRequest { factor_millis, ..DefragRequest::default() };
    // SAFETY: the command's encoded size matches `DefragRequest`, which lives for the call; the
    // kernel reads it and writes the answer back into it.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), DEFRAG as _, &mut request as *mut DefragRequest) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(request)
}

/// `_IOW(type, number, size)` with the generic Linux layout (x86, ARM, RISC-V): direction in
/// bits 30-31, size in bits 16-29, type in bits 8-15, number in bits 0-7.
const fn write_command(kind: u8, number: u8, size: usize) -> u32 {
    const IOC_WRITE: u32 = 1;
    (IOC_WRITE << 30) | ((size as u32) << 16) | ((kind as u32) << 8) | number as u32
}

/// `TANDEM_IOC_INSERT` = `_IOW(0xD4, 1, struct tandem_range)`.
pub const INSERT: u32 = write_command(MAGIC, INSERT_NUMBER, RANGE_REQUEST_BYTES);
/// `TANDEM_IOC_COLLAPSE` = `_IOW(0xD4, 2, struct tandem_range)`.
pub const COLLAPSE: u32 = write_command(MAGIC, COLLAPSE_NUMBER, RANGE_REQUEST_BYTES);

impl RangeRequest {
    /// Decodes the argument bytes the kernel delivered with the request.
    pub fn from_bytes(bytes: &[u8]) -> Option<RangeRequest> {
        if bytes.len() < RANGE_REQUEST_BYTES {
            return None;
        }
        let word = |index: usize| u64::from_ne_bytes(bytes[index * 8..index * 8 + 8].try_into().expect("8 bytes"));
        Some(RangeRequest { offset: word(0), length: word(1), data: word(2) })
    }
}

fn issue(file: &File, command: u32, request: &RangeRequest) -> io::Result<()> {
    // SAFETY: the command's encoded size matches `RangeRequest`, which lives for the call;
    // the kernel only reads it.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), command as _, request as *const RangeRequest) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    // The server invalidated the kernel's attributes; asking for them now makes the kernel
    // refresh its idea of the file size before the caller's next write, which matters for
    // O_APPEND writers that rely on the cached size.
    file.metadata()?;
    Ok(())
}

/// Inserts `length` zero bytes (a hole) at `offset` of `file`, shifting later bytes up.
pub fn insert_zeros(file: &File, offset: u64, length: u64) -> io::Result<()> {
    if length == 0 {
        return Ok(());
    }
    issue(file, INSERT, &RangeRequest { offset, length, data: 0 })
}

/// Inserts `data` at `offset` of `file`, shifting later bytes up. One engine operation when the
/// server can read the caller's memory and the data is at most [`INLINE_INSERT_MAX_BYTES`];
/// otherwise a hole insert followed by a positioned write, whose failure collapses the hole out
/// again. Either may fail part-way inside the server (no space after the hole went in): a
/// caller that needs all-or-nothing compares the file size before and after and collapses the
/// growth at `offset`, as `tandem insert` does.
pub fn insert_data(file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let length = data.len() as u64;
    if length <= INLINE_INSERT_MAX_BYTES {
        let request = RangeRequest { offset, length, data: data.as_ptr() as u64 };
        match issue(file, INSERT, &request) {
            Err(error) if error.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
            other => return other,
        }
    }
    insert_zeros(file, offset, length)?;
    if let Err(error) = file.write_all_at(data, offset) {
        // All or nothing: take the hole out again, so the file is as it was.
        collapse(file, offset, length)?;
        return Err(error);
    }
    Ok(())
}

/// Removes `length` bytes at `offset` of `file`, shifting later bytes down.
pub fn collapse(file: &File, offset: u64, length: u64) -> io::Result<()> {
    if length == 0 {
        return Ok(());
    }
    issue(file, COLLAPSE, &RangeRequest { offset, length, data: 0 })
}

/// Copies `length` bytes at `address` out of the thread `thread_id` (the caller of the ioctl,
/// blocked in the system call while the server runs). Used by the server side of INSERT.
pub(crate) fn read_caller_memory(thread_id: u32, address: u64, length: u64) -> io::Result<Vec<u8>> {
    if thread_id == 0 {
        // The caller lives in a PID namespace the server cannot see.
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    let mut buffer = vec![0u8; length as usize];
    let mut copied = 0usize;
    while copied < buffer.len() {
        let local = libc::iovec { iov_base: buffer[copied..].as_mut_ptr().cast(), iov_len: buffer.len() - copied };
        let remote =
            libc::iovec { iov_base: (address as usize + copied) as *mut libc::c_void, iov_len: buffer.len() - copied };
        // SAFETY: `local` points into `buffer`, which is large enough; the kernel checks
        // `remote` against the other process's address space.
        let result = unsafe { libc::process_vm_readv(thread_id as libc::pid_t, &local, 1, &remote, 1, 0) };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        if result == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        copied += result as usize;
    }
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_numbers_match_the_c_header_encoding() {
        // _IOW(0xD4, 1, 24 bytes) and _IOW(0xD4, 2, 24 bytes), computed by hand.
        assert_eq!(INSERT, 0x4018_D401);
        assert_eq!(COLLAPSE, 0x4018_D402);
        // _IOWR(0xD4, 3, 40 bytes).
        assert_eq!(DEFRAG, 0xC028_D403);
    }

    #[test]
    fn defrag_request_round_trips() {
        let request = DefragRequest {
            factor_millis: 1200,
            mapped_bytes: 7,
            held_bytes_before: 1 << 40,
            held_bytes_after: 9,
            records: 3,
        };
        assert_eq!(DefragRequest::from_bytes(&request.to_bytes()), Some(request));
        assert_eq!(DefragRequest::from_bytes(&request.to_bytes()[..39]), None);
    }

    #[test]
    fn request_decodes_from_native_bytes() {
        let request = RangeRequest { offset: 7, length: 1 << 40, data: 0xdead_beef };
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&request.offset.to_ne_bytes());
        bytes.extend_from_slice(&request.length.to_ne_bytes());
        bytes.extend_from_slice(&request.data.to_ne_bytes());
        assert_eq!(RangeRequest::from_bytes(&bytes), Some(request));
        assert_eq!(RangeRequest::from_bytes(&bytes[..23]), None);
    }

    #[test]
    fn caller_memory_reads_back_from_this_process() {
        let data = b"bytes the server copies out of the caller".to_vec();
        let thread_id = unsafe { libc::gettid() } as u32;
        let copied =
            read_caller_memory(thread_id, data.as_ptr() as u64, data.len() as u64).expect("reading our own memory");
        assert_eq!(copied, data);
    }
}
