//! Little-endian field access for on-disk structures. Reads from disk go through `Decoder`,
//! which turns a short buffer into a corruption error instead of a panic.

use crate::error::{Error, Result};

pub fn get_u16(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes(bytes[offset..offset + 2].try_into().unwrap())
}
pub fn get_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}
pub fn get_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}
pub fn get_i64(bytes: &[u8], offset: usize) -> i64 {
    i64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}
pub fn put_u16(bytes: &mut [u8], offset: usize, value: u16) {
    bytes[offset..offset + 2].copy_from_slice(&value.to_le_bytes());
}
pub fn put_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}
pub fn put_u64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}
pub fn put_i64(bytes: &mut [u8], offset: usize, value: i64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

/// Appends fields to a growing buffer (log record payloads).
#[derive(Default)]
pub struct Encoder {
    pub bytes: Vec<u8>,
}

impl Encoder {
    pub fn with_capacity(capacity: usize) -> Encoder {
        Encoder { bytes: Vec::with_capacity(capacity) }
    }
    pub fn u8(&mut self, value: u8) -> &mut Self {
        self.bytes.push(value);
        self
    }
    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }
    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }
    pub fn i64(&mut self, value: i64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }
    /// A length-prefixed byte string (u32 length).
    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        assert!(value.len() <= u32::MAX as usize);
        self.u32(value.len() as u32);
        self.bytes.extend_from_slice(value);
        self
    }
}

/// Reads fields from a buffer that came from the device; every read is bounds-checked.
pub struct Decoder<'a> {
    bytes: &'a [u8],
    position: usize,
    what: &'static str,
}

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8], what: &'static str) -> Decoder<'a> {
        Decoder { bytes, position: 0, what }
    }
    fn take(&mut self, length: usize) -> Result<&'a [u8]> {
        let end = self.position.checked_add(length).filter(|end| *end <= self.bytes.len());
        match end {
            Some(end) => {
                let slice = &self.bytes[self.position..end];
                self.position = end;
                Ok(slice)
            }
            None => Err(Error::corruption(format!(
                "{}: needs {length} bytes at offset {} of a {}-byte record",
                self.what,
                self.position,
                self.bytes.len()
            ))),
        }
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn bytes(&mut self, limit: usize) -> Result<&'a [u8]> {
        let length = self.u32()? as usize;
        if length > limit {
            return Err(Error::corruption(format!(
                "{}: field of {length} bytes exceeds the limit of {limit}",
                self.what
            )));
        }
        self.take(length)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = &self.bytes[self.position..];
        self.position = self.bytes.len();
        rest
    }
    pub fn finish(&self) -> Result<()> {
        if self.position != self.bytes.len() {
            return Err(Error::corruption(format!(
                "{}: {} trailing bytes after the last field",
                self.what,
                self.bytes.len() - self.position
            )));
        }
        Ok(())
    }
}
