//! The kernel's FUSE-over-io_uring ABI (protocol 7.42, Linux 6.14 and later), as
//! `include/uapi/linux/fuse.h` and `Documentation/filesystems/fuse/fuse-io-uring.rst` define it:
//! the per-entry header buffer, the 80-byte command of an `IORING_OP_URING_CMD` entry, and how a
//! request laid out over header and payload maps back to the bytes a read of /dev/fuse returns.
//! Everything the kernel wrote is checked here before it is used.

/// `FUSE_IO_URING_CMD_REGISTER`: hand the kernel an entry (header and payload buffers); it
/// completes when a request has been written into them.
pub(crate) const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: the reply is in the entry's buffers; take it and
/// complete again with the next request.
pub(crate) const CMD_COMMIT_AND_FETCH: u32 = 2;

/// A REGISTER names two buffers (`FUSE_URING_IOV_SEGS`): the header, then the payload.
pub(crate) const REGISTER_IOVEC_COUNT: u32 = 2;

/// `struct fuse_in_header` (requests) and `struct fuse_out_header` (replies), in bytes.
pub(crate) const IN_HEADER_BYTES: usize = 40;
pub(crate) const OUT_HEADER_BYTES: usize = 16;

/// `struct fuse_uring_req_header`: `in_out` (the in / out header, 128 bytes), `op_in` (the
/// operation's fixed argument, `in_args[0]`, 128 bytes), then `struct fuse_uring_ent_in_out`
/// (flags u64, commit_id u64, payload_sz u32, padding u32, reserved u64).
pub(crate) const IN_OUT_AREA_BYTES: usize = 128;
pub(crate) const OP_IN_OFFSET: usize = IN_OUT_AREA_BYTES;
pub(crate) const OP_IN_BYTES: usize = 128;
pub(crate) const ENT_IN_OUT_OFFSET: usize = 256;
const ENT_COMMIT_ID_OFFSET: usize = ENT_IN_OUT_OFFSET + 8;
const ENT_PAYLOAD_SIZE_OFFSET: usize = ENT_IN_OUT_OFFSET + 16;
pub(crate) const REQUEST_HEADER_BYTES: usize = ENT_IN_OUT_OFFSET + 32;

/// The entry's header buffer, exactly `struct fuse_uring_req_header`, aligned as the kernel's
/// 64-bit fields want.
#[repr(C, align(64))]
pub(crate) struct RequestHeader(pub(crate) [u8; REQUEST_HEADER_BYTES]);

const _: () = assert!(std::mem::size_of::<RequestHeader>() >= REQUEST_HEADER_BYTES);

/// What the kernel put in an entry for one request, checked against the buffers' sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// The id to echo in the COMMIT_AND_FETCH (Linux 6.18 uses the request's `unique`).
    pub(crate) commit_id: u64,
    /// Bytes of `op_in` that hold the operation's fixed argument (0 for operations without one,
    /// such as LOOKUP, whose only argument is a name).
    pub(crate) op_in_bytes: usize,
    /// Bytes of the payload buffer that hold the remaining arguments (names, write data).
    pub(crate) payload_bytes: usize,
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_ne_bytes(bytes[offset..offset + 4].try_into().expect("four bytes"))
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from_ne_bytes(bytes[offset..offset + 8].try_into().expect("eight bytes"))
}

/// Reads and checks an arrived request's sizes. The kernel copies `in_args[0]` to `op_in` and
/// the other arguments one after another to the payload (`fuse_uring_args_to_ring`), and its
/// `fuse_in_header.len` counts them all, as on /dev/fuse; so the fixed argument's size is what
/// the header's length leaves after the in-header and the payload.
pub(crate) fn arrival(header: &RequestHeader, payload_capacity_bytes: usize) -> Result<Arrival, String> {
    let bytes = &header.0;
    let length = u32_at(bytes, 0) as usize;
    let commit_id = u64_at(bytes, ENT_COMMIT_ID_OFFSET);
    let payload_bytes = u32_at(bytes, ENT_PAYLOAD_SIZE_OFFSET) as usize;
    if payload_bytes > payload_capacity_bytes {
        return Err(format!("payload of {payload_bytes} bytes in a buffer of {payload_capacity_bytes}"));
    }
    let Some(op_in_bytes) = length.checked_sub(IN_HEADER_BYTES + payload_bytes) else {
        return Err(format!("request length {length} shorter than its header and {payload_bytes} payload bytes"));
    };
    if op_in_bytes > OP_IN_BYTES {
        return Err(format!("request length {length} leaves {op_in_bytes} bytes for op_in (at most {OP_IN_BYTES})"));
    }
    Ok(Arrival { commit_id, op_in_bytes, payload_bytes })
}

/// `FUSE_READ` in the in-header's `opcode` (offset 4).
const OPCODE_READ: u32 = 15;
/// `size` (u32) in `struct fuse_read_in` (fh u64, offset u64, size u32, ...).
const READ_IN_SIZE_OFFSET: usize = 16;

/// The bytes an arrived READ asks for; 0 for every other request.
pub(crate) fn read_bytes(header: &RequestHeader, arrival: &Arrival) -> usize {
    let opcode = u32_at(&header.0, 4);
    if opcode == OPCODE_READ && arrival.op_in_bytes >= READ_IN_SIZE_OFFSET + 4 {
        u32_at(&header.0, OP_IN_OFFSET + READ_IN_SIZE_OFFSET) as usize
    } else {
        0
    }
}

/// Writes the reply's out-header into `in_out` and the payload size into the entry's
/// `fuse_uring_ent_in_out`, as `fuse_uring_commit` reads them back.
pub(crate) fn set_reply(header: &mut RequestHeader, out_header: &[u8; OUT_HEADER_BYTES], payload_bytes: usize) {
    assert!(payload_bytes <= u32::MAX as usize, "reply payload of {payload_bytes} bytes");
    header.0[..OUT_HEADER_BYTES].copy_from_slice(out_header);
    header.0[ENT_PAYLOAD_SIZE_OFFSET..ENT_PAYLOAD_SIZE_OFFSET + 4]
        .copy_from_slice(&(payload_bytes as u32).to_ne_bytes());
}

/// An out-header carrying only an errno (negative, as the protocol wants) for request `unique`.
pub(crate) fn error_out_header(unique: u64, errno: i32) -> [u8; OUT_HEADER_BYTES] {
    assert!(errno > 0, "errno {errno}");
    let mut out = [0u8; OUT_HEADER_BYTES];
    out[..4].copy_from_slice(&(OUT_HEADER_BYTES as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    out[8..].copy_from_slice(&unique.to_ne_bytes());
    out
}

/// The commit id the kernel wrote into the entry trailer.
pub(crate) fn commit_id_of(header: &RequestHeader) -> u64 {
    u64_at(&header.0, ENT_COMMIT_ID_OFFSET)
}

/// The request's `unique`, from the in-header the kernel wrote.
pub(crate) fn unique_of(header: &RequestHeader) -> u64 {
    u64_at(&header.0, 8)
}

/// `struct fuse_uring_cmd_req` in the 80-byte command area: flags (0), commit_id, qid.
pub(crate) fn command(commit_id: u64, queue: u16) -> [u8; 80] {
    let mut area = [0u8; 80];
    area[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    area[16..18].copy_from_slice(&queue.to_ne_bytes());
    area
}

/// Offset of `len` (u32) in `struct io_uring_sqe`: after opcode, flags, ioprio, fd, off, addr.
/// The io-uring crate's `UringCmd80` sets `addr` but not `len`, which REGISTER needs (the
/// number of iovecs).
pub(crate) const SQE_LEN_OFFSET: usize = 24;

#[cfg(test)]
mod tests {
    use super::*;

    fn header_with(length: u32, unique: u64, commit_id: u64, payload: u32) -> RequestHeader {
        let mut header = RequestHeader([0; REQUEST_HEADER_BYTES]);
        header.0[..4].copy_from_slice(&length.to_ne_bytes());
        header.0[8..16].copy_from_slice(&unique.to_ne_bytes());
        header.0[ENT_COMMIT_ID_OFFSET..ENT_COMMIT_ID_OFFSET + 8].copy_from_slice(&commit_id.to_ne_bytes());
        header.0[ENT_PAYLOAD_SIZE_OFFSET..ENT_PAYLOAD_SIZE_OFFSET + 4].copy_from_slice(&payload.to_ne_bytes());
        header
    }

    #[test]
    fn a_lookup_has_no_fixed_argument_and_a_write_has_one() {
        // LOOKUP of "name\0": 40 + 5 bytes, all of the name in the payload.
        let lookup = arrival(&header_with(45, 7, 7, 5), 1 << 20).unwrap();
        assert_eq!(lookup, Arrival { commit_id: 7, op_in_bytes: 0, payload_bytes: 5 });
        // WRITE of 4096 bytes: fuse_write_in (40 bytes) in op_in, the data in the payload.
        let write = arrival(&header_with(40 + 40 + 4096, 9, 9, 4096), 1 << 20).unwrap();
        assert_eq!(write.op_in_bytes, 40);
    }

    #[test]
    fn reads_say_how_much_they_ask_for() {
        // READ of 1 MiB: fuse_read_in (40 bytes) in op_in, nothing in the payload.
        let mut read = header_with(40 + 40, 3, 3, 0);
        read.0[4..8].copy_from_slice(&OPCODE_READ.to_ne_bytes());
        read.0[OP_IN_OFFSET + READ_IN_SIZE_OFFSET..OP_IN_OFFSET + READ_IN_SIZE_OFFSET + 4]
            .copy_from_slice(&(1u32 << 20).to_ne_bytes());
        assert_eq!(read_bytes(&read, &arrival(&read, 1 << 20).unwrap()), 1 << 20);
        // WRITE (16) of 4096 bytes and LOOKUP (1): not reads.
        let mut write = header_with(40 + 40 + 4096, 9, 9, 4096);
        write.0[4..8].copy_from_slice(&16u32.to_ne_bytes());
        assert_eq!(read_bytes(&write, &arrival(&write, 1 << 20).unwrap()), 0);
        let mut lookup = header_with(45, 7, 7, 5);
        lookup.0[4..8].copy_from_slice(&1u32.to_ne_bytes());
        assert_eq!(read_bytes(&lookup, &arrival(&lookup, 1 << 20).unwrap()), 0);
    }

    #[test]
    fn inconsistent_sizes_are_refused() {
        assert!(arrival(&header_with(45, 7, 7, 5), 4).is_err(), "payload larger than the buffer");
        assert!(arrival(&header_with(30, 7, 7, 0), 1 << 20).is_err(), "shorter than the in-header");
        assert!(arrival(&header_with(40 + 200, 7, 7, 0), 1 << 20).is_err(), "op_in overflow");
    }

    #[test]
    fn reply_and_command_layouts() {
        let mut header = header_with(45, 7, 7, 5);
        set_reply(&mut header, &error_out_header(7, 2), 0);
        assert_eq!(u32_at(&header.0, 0), 16);
        assert_eq!(i32::from_ne_bytes(header.0[4..8].try_into().unwrap()), -2);
        assert_eq!(u64_at(&header.0, 8), 7);
        assert_eq!(u32_at(&header.0, ENT_PAYLOAD_SIZE_OFFSET), 0);
        let area = command(0x1122, 3);
        assert_eq!(u64_at(&area, 8), 0x1122);
        assert_eq!(u16::from_ne_bytes([area[16], area[17]]), 3);
    }
}
