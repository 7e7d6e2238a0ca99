//! The workload through system calls on a mounted file system (ext4 on a loop device, or a
//! tandemfs FUSE mount). Names are resolved relative to open directory descriptors (openat,
//! fstatat, unlinkat), which is what the library's lookup-in-parent calls correspond to.

use super::workload::MetadataTarget;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

pub struct SystemTarget {
    root: OwnedFd,
    /// Index 0 "flat", then the tree's directories.
    directories: Vec<OwnedFd>,
    tree: Option<OwnedFd>,
    append: Option<OwnedFd>,
}

fn last_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn open_directory(parent: &OwnedFd, name: &CStr) -> Result<OwnedFd, String> {
    // SAFETY: plain system calls on a descriptor we own and a NUL-terminated name.
    unsafe {
        if libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o755) != 0 {
            return Err(last_error(&format!("mkdir {}", name.to_string_lossy())));
        }
        let descriptor =
            libc::openat(parent.as_raw_fd(), name.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC);
        if descriptor < 0 {
            return Err(last_error(&format!("open directory {}", name.to_string_lossy())));
        }
        Ok(OwnedFd::from_raw_fd(descriptor))
    }
}

fn remove_directory(parent: &OwnedFd, name: &CStr) -> Result<(), String> {
    // SAFETY: as above.
    if unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
        return Err(last_error(&format!("rmdir {}", name.to_string_lossy())));
    }
    Ok(())
}

fn c_name(text: &str) -> CString {
    CString::new(text).expect("no interior zero byte")
}

impl SystemTarget {
    pub fn new(root: &Path) -> Result<SystemTarget, String> {
        let path =
            CString::new(root.as_os_str().as_encoded_bytes()).map_err(|_| "path holds a zero byte".to_string())?;
        // SAFETY: as above.
        let descriptor = unsafe { libc::open(path.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC) };
        if descriptor < 0 {
            return Err(last_error(&format!("open {}", root.display())));
        }
        // SAFETY: the descriptor was just opened and nothing else owns it.
        let root = unsafe { OwnedFd::from_raw_fd(descriptor) };
        Ok(SystemTarget { root, directories: Vec::new(), tree: None, append: None })
    }
}

impl MetadataTarget for SystemTarget {
    fn set_up_directories(&mut self, tree_directory_count: usize) -> Result<(), String> {
        let flat = open_directory(&self.root, &c_name("flat"))?;
        let tree = open_directory(&self.root, &c_name("tree"))?;
        self.directories = vec![flat];
        for index in 0..tree_directory_count {
            self.directories.push(open_directory(&tree, &c_name(&format!("d{index:03}")))?);
        }
        self.tree = Some(tree);
        Ok(())
    }

    fn tear_down_directories(&mut self) -> Result<(), String> {
        let count = self.directories.len();
        self.directories.clear();
        if let Some(tree) = self.tree.take() {
            for index in 0..count.saturating_sub(1) {
                remove_directory(&tree, &c_name(&format!("d{index:03}")))?;
            }
            remove_directory(&self.root, &c_name("tree"))?;
        }
        remove_directory(&self.root, &c_name("flat"))
    }

    fn create(&mut self, directory: usize, name: &CStr) -> Result<(), String> {
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC;
        // SAFETY: as above; the descriptor is closed right away.
        unsafe {
            let descriptor = libc::openat(self.directories[directory].as_raw_fd(), name.as_ptr(), flags, 0o644);
            if descriptor < 0 {
                return Err(last_error("create"));
            }
            libc::close(descriptor);
        }
        Ok(())
    }

    fn stat(&mut self, directory: usize, name: &CStr) -> Result<(), String> {
        let mut status: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; fstatat writes only into `status`.
        if unsafe { libc::fstatat(self.directories[directory].as_raw_fd(), name.as_ptr(), &mut status, 0) } != 0 {
            return Err(last_error("stat"));
        }
        Ok(())
    }

    fn unlink(&mut self, directory: usize, name: &CStr) -> Result<(), String> {
        // SAFETY: as above.
        if unsafe { libc::unlinkat(self.directories[directory].as_raw_fd(), name.as_ptr(), 0) } != 0 {
            return Err(last_error("unlink"));
        }
        Ok(())
    }

    fn open_append(&mut self, name: &CStr) -> Result<(), String> {
        let flags = libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC;
        // SAFETY: as above.
        let descriptor = unsafe { libc::openat(self.root.as_raw_fd(), name.as_ptr(), flags, 0o644) };
        if descriptor < 0 {
            return Err(last_error("create append file"));
        }
        // SAFETY: freshly opened, owned by nobody else.
        self.append = Some(unsafe { OwnedFd::from_raw_fd(descriptor) });
        Ok(())
    }

    fn append_durably(&mut self, data: &[u8]) -> Result<(), String> {
        let descriptor = self.append.as_ref().ok_or("append file not open")?.as_raw_fd();
        // SAFETY: writes from a live slice; fsync takes only the descriptor.
        let written = unsafe { libc::write(descriptor, data.as_ptr().cast(), data.len()) };
        if written != data.len() as isize {
            return Err(last_error("write"));
        }
        if unsafe { libc::fsync(descriptor) } != 0 {
            return Err(last_error("fsync"));
        }
        Ok(())
    }

    fn close_append(&mut self, name: &CStr) -> Result<(), String> {
        self.append = None;
        // SAFETY: as above.
        if unsafe { libc::unlinkat(self.root.as_raw_fd(), name.as_ptr(), 0) } != 0 {
            return Err(last_error("unlink append file"));
        }
        Ok(())
    }
}
