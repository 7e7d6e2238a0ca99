//! Extended attributes.

use super::*;

impl FileSystem {
    // ------------------------------------------------------------------ extended attributes

    /// The write lock on the view shard of `inode`, its view's extended attributes loaded.
    pub(super) fn lock_xattrs(&self, inode: InodeNumber) -> Result<RwLockWriteGuard<'_, ViewShard>> {
        let mut shard = self.lock_view(inode)?;
        let view = shard.views.get_mut(&inode).expect("loaded by lock_view");
        let generation = view.attributes.generation;
        if view.xattrs.is_none() {
            let mut volume = self.inner.backend.volume()?;
            // A new inode whose creation is not applied has no attributes yet.
            let attributes = match FileSystem::home_inode(&mut volume, inode, generation)? {
                Some(home) => volume.read_xattrs(home.xattr_block)?,
                None => Default::default(),
            };
            drop(volume);
            view.xattrs = Some(attributes);
        }
        Ok(shard)
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
            let mut shard = self.lock_xattrs(inode)?;
            let view = shard.views.get_mut(&inode).expect("loaded by lock_xattrs");
            let attributes = view.xattrs.as_ref().expect("loaded by lock_xattrs");
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
            let Some(lsn) = self.append(op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(view, image, lsn, false);
            view.xattrs = Some(updated);
            Ok(Some(()))
        })
    }

    pub fn get_xattr(&self, inode: InodeNumber, name: &[u8]) -> Result<Vec<u8>> {
        FileSystem::check_xattr_name(name)?;
        let shard = self.lock_xattrs(inode)?;
        shard.views[&inode].xattrs.as_ref().expect("loaded").get(name).cloned().ok_or(Error::NoData)
    }

    pub fn list_xattr(&self, inode: InodeNumber) -> Result<Vec<Vec<u8>>> {
        let shard = self.lock_xattrs(inode)?;
        Ok(shard.views[&inode].xattrs.as_ref().expect("loaded").keys().cloned().collect())
    }

    pub fn remove_xattr(&self, inode: InodeNumber, name: &[u8]) -> Result<()> {
        FileSystem::check_xattr_name(name)?;
        self.with_space(|| {
            let mut shard = self.lock_xattrs(inode)?;
            let view = shard.views.get_mut(&inode).expect("loaded by lock_xattrs");
            if !view.xattrs.as_ref().expect("loaded").contains_key(name) {
                return Err(Error::NoData);
            }
            let mut image = view.attributes.clone();
            image.change_time_ns = now_ns();
            let op = Op::RemoveXattr { inode: image.clone(), name: name.to_vec() };
            let Some(lsn) = self.append(op, 0)? else {
                return Ok(None);
            };
            FileSystem::commit_view(view, image, lsn, false);
            view.xattrs.as_mut().expect("loaded").remove(name);
            Ok(Some(()))
        })
    }
}
