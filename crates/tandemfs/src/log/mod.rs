//! `log`: the front-end operation log. (Interface placeholder until it lands.)
#![allow(unused_variables)]
use crate::device::Device;
use crate::error::Result;
use std::sync::Arc;
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogGeometry {
    pub header_start_byte: u64,
    pub header_slots: u64,
    pub data_start_byte: u64,
    pub data_bytes: u64,
}
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPosition {
    pub lsn: u64,
    pub data_position: u64,
}
pub struct Record {
    pub lsn: u64,
    pub kind: u16,
    pub payload: Vec<u8>,
}
pub struct LogOptions {
    pub flush_delay_us: u64,
    pub reserve_fraction: f64,
}
pub struct LogUsage {
    pub header_slots_used: u64,
    pub data_bytes_used: u64,
    pub header_slots: u64,
    pub data_bytes: u64,
}
pub struct Log;
impl Log {
    pub fn format(device: &dyn Device, geometry: &LogGeometry) -> Result<()> {
        unimplemented!()
    }
    pub fn recover(
        device: Arc<dyn Device>,
        geometry: LogGeometry,
        tail: LogPosition,
        options: LogOptions,
    ) -> Result<(Arc<Log>, Vec<Record>)> {
        unimplemented!()
    }
    pub fn append(&self, kind: u16, payload_parts: &[&[u8]]) -> Result<Option<u64>> {
        unimplemented!()
    }
    pub fn append_reserved(&self, kind: u16, payload_parts: &[&[u8]]) -> Result<Option<u64>> {
        unimplemented!()
    }
    pub fn wait_durable(&self, lsn: u64) -> Result<()> {
        unimplemented!()
    }
    pub fn flush(&self) -> Result<u64> {
        unimplemented!()
    }
    pub fn durable_lsn(&self) -> u64 {
        unimplemented!()
    }
    pub fn next_lsn(&self) -> u64 {
        unimplemented!()
    }
    pub fn position(&self, lsn: u64) -> LogPosition {
        unimplemented!()
    }
    pub fn release(&self, new_tail: LogPosition) {
        unimplemented!()
    }
    pub fn usage(&self) -> LogUsage {
        unimplemented!()
    }
    pub fn wait_for_durable_above(&self, lsn: u64, timeout: std::time::Duration) -> u64 {
        unimplemented!()
    }
    pub fn shutdown(&self) -> Result<()> {
        unimplemented!()
    }
}
