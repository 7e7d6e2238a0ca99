//! Memory device (to be implemented).
pub struct MemoryDevice;
pub enum CrashMode {}
