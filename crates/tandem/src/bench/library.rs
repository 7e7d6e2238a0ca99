//! The workload through the tandemfs library: no kernel, no FUSE, direct engine calls.

use super::workload::MetadataTarget;
use std::ffi::CStr;
use tandemfs::fs::{FileType, InodeNumber, ROOT_INODE};
use tandemfs::FileSystem;

pub struct LibraryTarget {
    fs: FileSystem,
    /// Index 0 "flat", then the tree's directories; `tree` is kept apart for tear-down.
    directories: Vec<InodeNumber>,
    tree: Option<InodeNumber>,
    append: Option<(InodeNumber, u64)>,
}

impl LibraryTarget {
    pub fn new(fs: FileSystem) -> LibraryTarget {
        LibraryTarget { fs, directories: Vec::new(), tree: None, append: None }
    }
}

fn engine(what: &str, error: tandemfs::Error) -> String {
    format!("{what}: {error}")
}

impl MetadataTarget for LibraryTarget {
    fn set_up_directories(&mut self, tree_directory_count: usize) -> Result<(), String> {
        let flat =
            self.fs.make_directory(ROOT_INODE, b"flat", 0o755, 0, 0).map_err(|error| engine("mkdir flat", error))?;
        let tree =
            self.fs.make_directory(ROOT_INODE, b"tree", 0o755, 0, 0).map_err(|error| engine("mkdir tree", error))?;
        self.directories = vec![flat.inode];
        self.tree = Some(tree.inode);
        for index in 0..tree_directory_count {
            let name = format!("d{index:03}");
            let directory = self
                .fs
                .make_directory(tree.inode, name.as_bytes(), 0o755, 0, 0)
                .map_err(|error| engine(&format!("mkdir tree/{name}"), error))?;
            self.directories.push(directory.inode);
        }
        Ok(())
    }

    fn tear_down_directories(&mut self) -> Result<(), String> {
        if let Some(tree) = self.tree.take() {
            for index in 0..self.directories.len().saturating_sub(1) {
                let name = format!("d{index:03}");
                self.fs
                    .remove_directory(tree, name.as_bytes())
                    .map_err(|error| engine(&format!("rmdir tree/{name}"), error))?;
            }
            self.fs.remove_directory(ROOT_INODE, b"tree").map_err(|error| engine("rmdir tree", error))?;
        }
        self.fs.remove_directory(ROOT_INODE, b"flat").map_err(|error| engine("rmdir flat", error))?;
        self.directories.clear();
        Ok(())
    }

    fn create(&mut self, directory: usize, name: &CStr) -> Result<(), String> {
        self.fs
            .create(self.directories[directory], name.to_bytes(), FileType::Regular, 0o644, 0, 0, 0)
            .map(|_| ())
            .map_err(|error| engine("create", error))
    }

    fn stat(&mut self, directory: usize, name: &CStr) -> Result<(), String> {
        self.fs
            .lookup(self.directories[directory], name.to_bytes())
            .map(|_| ())
            .map_err(|error| engine("lookup", error))
    }

    fn unlink(&mut self, directory: usize, name: &CStr) -> Result<(), String> {
        self.fs.unlink(self.directories[directory], name.to_bytes()).map_err(|error| engine("unlink", error))
    }

    fn open_append(&mut self, name: &CStr) -> Result<(), String> {
        let file = self
            .fs
            .create(ROOT_INODE, name.to_bytes(), FileType::Regular, 0o644, 0, 0, 0)
            .map_err(|error| engine("create append file", error))?;
        self.append = Some((file.inode, 0));
        Ok(())
    }

    fn append_durably(&mut self, data: &[u8]) -> Result<(), String> {
        let (inode, offset) = self.append.as_mut().ok_or("append file not open")?;
        let written = self.fs.write(*inode, *offset, data).map_err(|error| engine("write", error))?;
        *offset += written as u64;
        self.fs.fsync(*inode, false).map_err(|error| engine("fsync", error))
    }

    fn close_append(&mut self, name: &CStr) -> Result<(), String> {
        self.append = None;
        self.fs.unlink(ROOT_INODE, name.to_bytes()).map_err(|error| engine("unlink append file", error))
    }
}
