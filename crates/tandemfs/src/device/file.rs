//! Regular file or block device (to be implemented).
pub struct FileDevice;
