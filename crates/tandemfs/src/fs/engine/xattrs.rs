//! Extended attributes.

use super::*;

impl FileSystem {
    // ------------------------------------------------------------------ extended attributes

    pub(super) fn load_xattrs(&self, front: &mut Front, inode: InodeNumber) -> Result<()> {
        let view = self.view(front, inode)?;
        let generation = view.attributes.generation;
        if view.xattrs.is_none() {
            let mut volume = self.inner.backend.volume();
            // A new inode whose creation is not applied has no attributes yet.
            let attributes = match FileSystem::home_inode(&mut volume, inode, generation)? {
                Some(home) => volume.read_xattrs(home.xattr_block)?,
                None => Default::default(),
            };
            drop(volume);
            front.views.get_mut(&inode).unwrap().xattrs = Some(attributes);
        }
        Ok(())
    }

    pub(super) fn check_xattr_name(name: &[u8]) -> Result<()> {
        if name.is_empty() || name.contains(&0) {
            return Err(Error::invalid("extended attribute names are non-empty and without NUL"));
        }
        if name.len() > XATTR_NAME_MAX_BYTES {
            return Err(Error::Range);
        }
        // The namespaces Linux file systems store, as ext4 does: another prefix, or a name
        // without one, is EOPNOTSUPP, and a namespace without a name is EINVAL. (`system.`
        // holds POSIX ACLs, which tandemfs does not implement.) The kernel's FUSE client passes
        // every name through, so the check has to be here.
        let Some(suffix) = XATTR_NAMESPACES.iter().find_map(|prefix| name.strip_prefix(*prefix)) else {
            return Err(Error::NotSupported);
        };
        if suffix.is_empty() {
            return Err(Error::invalid("an extended attribute name needs a name after its namespace"));
        }
        Ok(())
    }

    pub fn set_xattr(&self, inode: InodeNumber, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        FileSystem::check_xattr_name(name)?;
        if value.len() > XATTR_VALUE_MAX_BYTES {
            return Err(Error::NoSpace);
        }
        self.with_space(|| {
            let mut front = self.inner.front.write();
            self.load_xattrs(&mut front, inode)?;
            let view = front.views.get_mut(&inode).unwrap();
            let attributes = view.xattrs.as_ref().unwrap();
            match (mode, attributes.contains_key(name)) {
                (XattrMode::Create, true) => return Err(Error::Exists),
                (XattrMode::Replace, false) => return Err(Error::NoData),
                _ => {}
            }
            let mut updated = attributes.clone();
            updated.insert(name.to_vec(), value.to_vec());
            if Volume::xattr_encoded_bytes(&updated) > XATTR_BLOCK_PAYLOAD_BYTES {
                return Err(Error::NoSpace);
            }
            let mut image = view.attributes.clone();
            image.change_time_ns = now_ns();
            let reserve = 1;
            let op = Op::SetXattr { inode: image.clone(), name: name.to_vec(), value: value.to_vec() };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, false);
            front.views.get_mut(&inode).unwrap().xattrs = Some(updated);
            Ok(Some(()))
        })
    }

    pub fn get_xattr(&self, inode: InodeNumber, name: &[u8]) -> Result<Vec<u8>> {
        FileSystem::check_xattr_name(name)?;
        let mut front = self.inner.front.write();
        self.load_xattrs(&mut front, inode)?;
        front.views[&inode].xattrs.as_ref().unwrap().get(name).cloned().ok_or(Error::NoData)
    }

    pub fn list_xattr(&self, inode: InodeNumber) -> Result<Vec<Vec<u8>>> {
        let mut front = self.inner.front.write();
        self.load_xattrs(&mut front, inode)?;
        Ok(front.views[&inode].xattrs.as_ref().unwrap().keys().cloned().collect())
    }

    pub fn remove_xattr(&self, inode: InodeNumber, name: &[u8]) -> Result<()> {
        FileSystem::check_xattr_name(name)?;
        self.with_space(|| {
            let mut front = self.inner.front.write();
            self.load_xattrs(&mut front, inode)?;
            let view = front.views.get_mut(&inode).unwrap();
            if !view.xattrs.as_ref().unwrap().contains_key(name) {
                return Err(Error::NoData);
            }
            let mut image = view.attributes.clone();
            image.change_time_ns = now_ns();
            let op = Op::RemoveXattr { inode: image.clone(), name: name.to_vec() };
            let Some(lsn) = self.append(&mut front, op, 0)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, false);
            front.views.get_mut(&inode).unwrap().xattrs.as_mut().unwrap().remove(name);
            Ok(Some(()))
        })
    }
}
