//! Optional comparison with Intel's ISA-L, loaded at run time (never needed to build).

use crate::bench::{measure, Measurement};
use std::ffi::{c_int, c_uint, c_void, CStr};

type Crc32Iscsi = unsafe extern "C" fn(*const u8, c_int, c_uint) -> c_uint;
type GenerateCauchy = unsafe extern "C" fn(*mut u8, c_int, c_int);
type InitTables = unsafe extern "C" fn(c_int, c_int, *const u8, *mut u8);
type EncodeData = unsafe extern "C" fn(c_int, c_int, c_int, *const u8, *const *const u8, *const *mut u8);

pub struct Isal {
    crc32_iscsi: Crc32Iscsi,
    generate_cauchy: GenerateCauchy,
    init_tables: InitTables,
    encode_data: EncodeData,
    /// Whether crc32_iscsi wants and returns the register inverted (found by a check value).
    inverted_convention: bool,
}

// SAFETY: the library's functions are reentrant; the handle stays loaded for the process.
unsafe impl Send for Isal {}
unsafe impl Sync for Isal {}

unsafe fn symbol(handle: *mut c_void, name: &CStr) -> Result<*mut c_void, String> {
    let pointer = libc::dlsym(handle, name.as_ptr());
    if pointer.is_null() {
        Err(format!("libisal.so.2 lacks {}", name.to_string_lossy()))
    } else {
        Ok(pointer)
    }
}

impl Isal {
    pub fn load() -> Result<Self, String> {
        // SAFETY: dlopen/dlsym with NUL-terminated names; the symbols have the C signatures
        // ISA-L documents in its headers.
        unsafe {
            let mut handle = libc::dlopen(c"libisal.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            if handle.is_null() {
                handle = libc::dlopen(c"libisal.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            }
            if handle.is_null() {
                return Err("libisal.so.2 not installed (apt-get install libisal-dev to compare)".into());
            }
            let mut isal = Isal {
                crc32_iscsi: std::mem::transmute::<*mut c_void, Crc32Iscsi>(symbol(handle, c"crc32_iscsi")?),
                generate_cauchy: std::mem::transmute::<*mut c_void, GenerateCauchy>(symbol(
                    handle,
                    c"gf_gen_cauchy1_matrix",
                )?),
                init_tables: std::mem::transmute::<*mut c_void, InitTables>(symbol(handle, c"ec_init_tables")?),
                encode_data: std::mem::transmute::<*mut c_void, EncodeData>(symbol(handle, c"ec_encode_data")?),
                inverted_convention: false,
            };
            let check = b"123456789";
            if (isal.crc32_iscsi)(check.as_ptr(), 9, 0xFFFF_FFFF) ^ 0xFFFF_FFFF == 0xE306_9283 {
                isal.inverted_convention = true;
            } else if (isal.crc32_iscsi)(check.as_ptr(), 9, 0) != 0xE306_9283 {
                return Err("ISA-L crc32_iscsi gives an unexpected check value".into());
            }
            Ok(isal)
        }
    }

    /// CRC32C with the same meaning as [`crate::crc32c`].
    pub fn crc32c(&self, crc: u32, data: &[u8]) -> u32 {
        assert!(data.len() <= c_int::MAX as usize);
        // SAFETY: pointer and length describe `data`.
        unsafe {
            if self.inverted_convention {
                (self.crc32_iscsi)(data.as_ptr(), data.len() as c_int, !crc) ^ 0xFFFF_FFFF
            } else {
                (self.crc32_iscsi)(data.as_ptr(), data.len() as c_int, crc)
            }
        }
    }

    /// Times ISA-L applying `matrix` (rows × k, row-major) on one thread — its decode is this
    /// same call with a decode matrix; returns whether its outputs equal `expected`.
    pub fn apply_benchmark(
        &self,
        matrix: &[u8],
        rows: usize,
        inputs: &[&[u8]],
        expected: &[&[u8]],
        seconds: f64,
    ) -> (bool, Measurement) {
        let k = inputs.len();
        let tables = self.tables_for(matrix, k, rows);
        let mut outputs = vec![vec![0u8; inputs[0].len()]; rows];
        let measurement =
            measure(inputs[0].len() * k, seconds, || self.encode_with_tables(&tables, inputs, &mut outputs));
        let agrees = outputs.iter().zip(expected).all(|(ours, theirs)| ours.as_slice() == *theirs);
        (agrees, measurement)
    }

    /// ISA-L's expanded tables for `matrix` (rows × k, row-major).
    fn tables_for(&self, matrix: &[u8], k: usize, rows: usize) -> Vec<u8> {
        assert_eq!(matrix.len(), rows * k);
        let mut tables = vec![0u8; 32 * k * rows];
        // SAFETY: tables sized 32·k·rows as ISA-L's header documents.
        unsafe { (self.init_tables)(k as c_int, rows as c_int, matrix.as_ptr(), tables.as_mut_ptr()) };
        tables
    }

    /// ISA-L's expanded tables for its Cauchy code with k data and m parity shards.
    pub fn cauchy_tables(&self, k: usize, m: usize) -> Vec<u8> {
        assert!(k >= 1 && m >= 1 && k + m <= 256);
        let mut matrix = vec![0u8; (k + m) * k];
        // SAFETY: a (k+m)×k matrix, as ISA-L's header documents.
        unsafe { (self.generate_cauchy)(matrix.as_mut_ptr(), (k + m) as c_int, k as c_int) };
        self.tables_for(&matrix[k * k..], k, m)
    }

    /// One ISA-L encode of `data` into `parity` with expanded tables for that many inputs and
    /// outputs ([`Isal::cauchy_tables`], or a decode matrix's).
    pub fn encode_with_tables(&self, tables: &[u8], data: &[&[u8]], parity: &mut [Vec<u8>]) {
        let (k, m) = (data.len(), parity.len());
        assert_eq!(tables.len(), 32 * k * m);
        let shard_bytes = data[0].len();
        assert!(shard_bytes <= c_int::MAX as usize);
        assert!(data.iter().all(|shard| shard.len() == shard_bytes));
        assert!(parity.iter().all(|shard| shard.len() == shard_bytes));
        let inputs: Vec<*const u8> = data.iter().map(|shard| shard.as_ptr()).collect();
        let outputs: Vec<*mut u8> = parity.iter_mut().map(|shard| shard.as_mut_ptr()).collect();
        // SAFETY: k inputs and m outputs of shard_bytes each, tables of 32·k·m bytes.
        unsafe {
            (self.encode_data)(
                shard_bytes as c_int,
                k as c_int,
                m as c_int,
                tables.as_ptr(),
                inputs.as_ptr(),
                outputs.as_ptr(),
            );
        }
    }

    /// Times ISA-L's Cauchy encode on one thread; returns whether its parity equals ours.
    pub fn encode_benchmark(
        &self,
        k: usize,
        m: usize,
        data: &[&[u8]],
        our_parity: &[Vec<u8>],
        seconds: f64,
    ) -> (bool, Measurement) {
        let tables = self.cauchy_tables(k, m);
        let mut parity = vec![vec![0u8; data[0].len()]; m];
        let measurement = measure(data[0].len() * k, seconds, || self.encode_with_tables(&tables, data, &mut parity));
        (parity.as_slice() == our_parity, measurement)
    }
}
