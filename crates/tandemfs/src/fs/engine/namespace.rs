//! Namespace operations: lookup, create, link, unlink, rename, symlinks, paths, readdir.

use super::*;

impl FileSystem {
    // ------------------------------------------------------------------ namespace

    pub fn lookup(&self, parent: InodeNumber, name: &[u8]) -> Result<Attributes> {
        if name.len() > NAME_MAX_BYTES {
            return Err(Error::NameTooLong);
        }
        let dots = name == b"." || name == b"..";
        if !dots {
            // Before the lock: the front end is held only for the probes.
            check_name(name)?;
            if let Some(answer) = FileSystem::lookup_if_known(&self.inner.front.read(), parent, name) {
                return answer;
            }
        }
        let mut front = self.inner.front.write();
        if name == b"." {
            return Ok(self.directory_view(&mut front, parent)?.to_attributes());
        }
        if name == b".." {
            let up = self.directory_view(&mut front, parent)?.attributes.parent;
            return Ok(self.view(&mut front, up)?.to_attributes());
        }
        let (number, entry_type) = self.find_name(&mut front, parent, name)?.ok_or(Error::NotFound)?;
        let view = self
            .view(&mut front, number)
            .map_err(|error| crate::block::inode::entry_target_error(parent, name, number, error))?;
        crate::block::inode::check_entry_type(parent, name, entry_type, view.file_type())?;
        Ok(view.to_attributes())
    }

    pub fn get_attributes(&self, inode: InodeNumber) -> Result<Attributes> {
        if let Some(attributes) = FileSystem::attributes_if_loaded(&self.inner.front.read(), inode) {
            return Ok(attributes);
        }
        let mut front = self.inner.front.write();
        Ok(self.view(&mut front, inode)?.to_attributes())
    }

    pub fn set_attributes(&self, inode: InodeNumber, changes: &SetAttributes) -> Result<Attributes> {
        if let Some(permissions) = changes.permissions {
            if permissions & !0o7777 != 0 {
                return Err(Error::invalid(format!("mode {permissions:#o} has bits beyond 0o7777")));
            }
        }
        self.with_space(|| {
            let mut front = self.inner.front.write();
            let view = self.view(&mut front, inode)?;
            let mut image = view.attributes.clone();
            let file_type = view.file_type();
            let now = now_ns();
            let mut truncate = false;
            if let Some(size) = changes.size_bytes {
                match file_type {
                    FileType::Regular => {}
                    FileType::Directory => return Err(Error::IsDirectory),
                    _ => return Err(Error::invalid("size of a special file cannot change")),
                }
                if size > MAX_FILE_BYTES {
                    return Err(Error::FileTooLarge);
                }
                truncate = true;
                // Linux updates mtime on every truncate, to the same size too (ext4 does, and
                // xfstests generic/313 checks it). The FUSE kernel leaves it to the server: it
                // sends no mtime with the size for truncate(2), ftruncate(2) and O_TRUNC.
                image.modify_time_ns = now;
                image.size_bytes = size;
            }
            if let Some(permissions) = changes.permissions {
                image.mode = file_type.mode_bits() | permissions;
            }
            let owner_changed =
                changes.uid.is_some_and(|uid| uid != image.uid) || changes.gid.is_some_and(|gid| gid != image.gid);
            if let Some(uid) = changes.uid {
                image.uid = uid;
            }
            if let Some(gid) = changes.gid {
                image.gid = gid;
            }
            // Linux drops set-user-ID, and set-group-ID on group-executable files, when the owner
            // of a non-directory changes.
            if owner_changed && changes.permissions.is_none() && file_type != FileType::Directory {
                image.mode &= !0o4000;
                if image.mode & 0o010 != 0 {
                    image.mode &= !0o2000;
                }
            }
            match changes.access_time {
                Some(TimeToSet::Now) => image.access_time_ns = now,
                Some(TimeToSet::Nanoseconds(time)) => image.access_time_ns = time,
                None => {}
            }
            match changes.modify_time {
                Some(TimeToSet::Now) => image.modify_time_ns = now,
                Some(TimeToSet::Nanoseconds(time)) => image.modify_time_ns = time,
                None => {}
            }
            image.change_time_ns = now;
            // A truncate takes no new data blocks, only perhaps a split of the extent tree: it
            // may use the tree pool, so shrinking a file on a full volume works.
            let tree_reserve = if truncate { DATA_RESERVE_BLOCKS } else { 0 };
            let op = Op::SetAttributes { inode: image.clone(), truncate };
            let Some(lsn) = self.append_reserving(&mut front, op, 0, tree_reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, image, lsn, truncate);
            let view = front.views.get_mut(&inode).unwrap();
            if truncate {
                // Writes before the truncate are applied before it: reads wait for it anyway.
                view.forget_writes_through(lsn);
            }
            Ok(Some(view.to_attributes()))
        })
    }

    /// Creates a regular file, FIFO, socket or device node. `Exists` if the name is taken.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: InodeNumber,
        name: &[u8],
        file_type: FileType,
        permissions: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
    ) -> Result<Attributes> {
        match file_type {
            FileType::Directory => return self.make_directory(parent, name, permissions, uid, gid),
            FileType::Symlink => return Err(Error::invalid("use symlink to create a symbolic link")),
            _ => {}
        }
        self.create_node(parent, name, file_type, permissions, uid, gid, rdev, &[])
    }

    pub fn make_directory(
        &self,
        parent: InodeNumber,
        name: &[u8],
        permissions: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attributes> {
        self.create_node(parent, name, FileType::Directory, permissions, uid, gid, 0, &[])
    }

    pub fn symlink(&self, parent: InodeNumber, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attributes> {
        if target.is_empty() || target.contains(&0) {
            return Err(Error::invalid("a symbolic link target must be non-empty and without NUL bytes"));
        }
        if target.len() > SYMLINK_MAX_BYTES {
            return Err(Error::NameTooLong);
        }
        self.create_node(parent, name, FileType::Symlink, 0o777, uid, gid, 0, target)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_node(
        &self,
        parent: InodeNumber,
        name: &[u8],
        file_type: FileType,
        permissions: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
        symlink_target: &[u8],
    ) -> Result<Attributes> {
        check_name(name)?;
        if permissions & !0o7777 != 0 {
            return Err(Error::invalid(format!("mode {permissions:#o} has bits beyond 0o7777")));
        }
        self.with_space(|| {
            let mut front = self.inner.front.write();
            let parent_view = self.directory_view(&mut front, parent)?;
            if parent_view.attributes.link_count == 0 {
                return Err(Error::NotFound);
            }
            let mut parent_image = parent_view.attributes.clone();
            if self.find_name(&mut front, parent, name)?.is_some() {
                return Err(Error::Exists);
            }
            if file_type == FileType::Directory && parent_image.link_count >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            let reserve = NAMESPACE_RESERVE_BLOCKS;
            // No preferred number: the allocator goes on from where it last stopped.
            let number = front.inode_numbers.allocate(u64::MAX, 1, 0)?.0 + 1;
            self.inner.backend.volume().check_inode_free(number)?;
            // Only devices keep a device number (as ext4); the decoders refuse one elsewhere.
            let rdev = if matches!(file_type, FileType::CharDevice | FileType::BlockDevice) { rdev } else { 0 };
            let generation = front.next_generation;
            let now = now_ns();
            let mut mode = file_type.mode_bits() | permissions;
            let mut gid = gid;
            // A set-group-ID directory passes its group on, and its set-group-ID bit to
            // subdirectories.
            if parent_image.mode & 0o2000 != 0 {
                gid = parent_image.gid;
                if file_type == FileType::Directory {
                    mode |= 0o2000;
                }
            }
            let image = AttributeImage {
                inode_number: number,
                generation,
                mode,
                link_count: if file_type == FileType::Directory { 2 } else { 1 },
                uid,
                gid,
                size_bytes: symlink_target.len() as u64,
                access_time_ns: now,
                modify_time_ns: now,
                change_time_ns: now,
                birth_time_ns: now,
                rdev,
                parent: if file_type == FileType::Directory { parent } else { 0 },
                flags: 0,
            };
            parent_image.modify_time_ns = now;
            parent_image.change_time_ns = now;
            if file_type == FileType::Directory {
                parent_image.link_count += 1;
            }
            let op = Op::Create {
                parent: parent_image.clone(),
                name: name.to_vec(),
                inode: image.clone(),
                symlink_target: symlink_target.to_vec(),
            };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                front.inode_numbers.free_now(number - 1, 1);
                return Ok(None);
            };
            front.next_generation += 1;
            FileSystem::commit_view(&mut front, parent_image, lsn, true);
            front.views.get_mut(&parent).unwrap().entry_count += 1;
            let mut view = InodeView::new(image, 0, 0);
            view.last_change_lsn = lsn;
            view.structural_lsn = lsn;
            view.complete = file_type == FileType::Directory;
            let attributes = view.to_attributes();
            front.views.insert(number, view);
            self.overlay_name(&mut front, parent, name, Some((number, file_type)), lsn);
            Ok(Some(attributes))
        })
    }

    /// `mkdir -p` in one call: `path` is relative to the root, components separated by '/'.
    pub fn make_directory_all(&self, path: &[u8], permissions: u32, uid: u32, gid: u32) -> Result<Attributes> {
        let mut current = self.get_attributes(ROOT_INODE)?;
        for component in path.split(|byte| *byte == b'/').filter(|part| !part.is_empty() && *part != b".") {
            current = match self.lookup(current.inode, component) {
                Ok(found) if found.file_type == FileType::Directory => found,
                Ok(_) => return Err(Error::NotDirectory),
                Err(Error::NotFound) => match self.make_directory(current.inode, component, permissions, uid, gid) {
                    Ok(made) => made,
                    // Another caller made it first.
                    Err(Error::Exists) => self.lookup(current.inode, component)?,
                    Err(error) => return Err(error),
                },
                Err(error) => return Err(error),
            };
        }
        Ok(current)
    }

    pub fn read_link(&self, inode: InodeNumber) -> Result<Vec<u8>> {
        let size = {
            let mut front = self.inner.front.write();
            let view = self.view(&mut front, inode)?;
            if view.file_type() != FileType::Symlink {
                return Err(Error::invalid("not a symbolic link"));
            }
            view.attributes.size_bytes as usize
        };
        if size > SYMLINK_MAX_BYTES {
            return Err(Error::corruption(format!("symbolic link {inode} is {size} bytes long")));
        }
        let mut target = vec![0u8; size];
        let read = self.read_data(inode, 0, &mut target, true)?;
        target.truncate(read);
        Ok(target)
    }

    pub fn link(&self, inode: InodeNumber, new_parent: InodeNumber, new_name: &[u8]) -> Result<Attributes> {
        check_name(new_name)?;
        self.with_space(|| {
            let mut front = self.inner.front.write();
            let view = self.view(&mut front, inode)?;
            if view.file_type() == FileType::Directory {
                return Err(Error::NotPermitted);
            }
            if view.attributes.link_count == 0 {
                return Err(Error::NotFound);
            }
            if view.attributes.link_count >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            let mut image = view.attributes.clone();
            let parent_view = self.directory_view(&mut front, new_parent)?;
            if parent_view.attributes.link_count == 0 {
                return Err(Error::NotFound);
            }
            let mut parent_image = parent_view.attributes.clone();
            if self.find_name(&mut front, new_parent, new_name)?.is_some() {
                return Err(Error::Exists);
            }
            let reserve = NAMESPACE_RESERVE_BLOCKS;
            let now = now_ns();
            image.link_count += 1;
            image.change_time_ns = now;
            parent_image.modify_time_ns = now;
            parent_image.change_time_ns = now;
            let file_type = image.file_type();
            let op = Op::Link { parent: parent_image.clone(), name: new_name.to_vec(), inode: image.clone() };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, parent_image, lsn, true);
            front.views.get_mut(&new_parent).unwrap().entry_count += 1;
            FileSystem::commit_view(&mut front, image, lsn, false);
            self.overlay_name(&mut front, new_parent, new_name, Some((inode, file_type)), lsn);
            Ok(Some(front.views[&inode].to_attributes()))
        })
    }

    pub fn unlink(&self, parent: InodeNumber, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, false)
    }

    pub fn remove_directory(&self, parent: InodeNumber, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, true)
    }

    /// What becomes of an inode whose link count dropped to `link_count`.
    pub(super) fn disposition(view: &InodeView, link_count: u32) -> Disposition {
        match (link_count, view.open_count) {
            (0, 0) => Disposition::Reclaim,
            (0, _) => Disposition::Orphan,
            _ => Disposition::Keep,
        }
    }

    /// Records the fate of an inode that lost its last name.
    pub(super) fn settle(front: &mut Front, number: u64, disposition: Disposition) {
        let view = front.views.get_mut(&number).unwrap();
        match disposition {
            Disposition::Keep => {}
            Disposition::Orphan => view.orphaned = true,
            Disposition::Reclaim => {
                view.reclaimed = true;
                // Records apply in log order, so a later create may reuse the number at once.
                front.inode_numbers.free_now(number - 1, 1);
            }
        }
    }

    pub(super) fn remove_name(&self, parent: InodeNumber, name: &[u8], directory: bool) -> Result<()> {
        if name == b"." {
            return Err(Error::invalid("cannot remove \".\""));
        }
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        check_name(name)?;
        self.with_space(|| {
            let mut front = self.inner.front.write();
            let mut parent_image = self.directory_view(&mut front, parent)?.attributes.clone();
            let (number, file_type) = self.find_name(&mut front, parent, name)?.ok_or(Error::NotFound)?;
            let view = self.view(&mut front, number)?;
            match (directory, file_type == FileType::Directory) {
                (false, true) => return Err(Error::IsDirectory),
                (true, false) => return Err(Error::NotDirectory),
                (true, true) if view.entry_count > 0 => return Err(Error::NotEmpty),
                _ => {}
            }
            let mut image = view.attributes.clone();
            let now = now_ns();
            image.link_count = if directory { 0 } else { image.link_count.saturating_sub(1) };
            image.change_time_ns = now;
            let disposition = FileSystem::disposition(view, image.link_count);
            parent_image.modify_time_ns = now;
            parent_image.change_time_ns = now;
            if directory {
                parent_image.link_count -= 1;
            }
            let op =
                Op::Unlink { parent: parent_image.clone(), name: name.to_vec(), inode: image.clone(), disposition };
            let Some(lsn) = self.append(&mut front, op, 0)? else {
                return Ok(None);
            };
            FileSystem::commit_view(&mut front, parent_image, lsn, true);
            front.views.get_mut(&parent).unwrap().entry_count -= 1;
            FileSystem::commit_view(&mut front, image, lsn, false);
            FileSystem::settle(&mut front, number, disposition);
            self.overlay_name(&mut front, parent, name, None, lsn);
            Ok(Some(()))
        })
    }

    /// True when `ancestor` is `directory` or one of its ancestors.
    pub(super) fn is_ancestor(&self, front: &mut Front, ancestor: u64, directory: u64) -> Result<bool> {
        let mut current = directory;
        for _ in 0..DEPTH_WALK_MAX {
            if current == ancestor {
                return Ok(true);
            }
            if current == ROOT_INODE {
                return Ok(false);
            }
            current = self.view(front, current)?.attributes.parent;
        }
        Err(Error::corruption("directory parent chain does not reach the root"))
    }

    pub fn rename(
        &self,
        parent: InodeNumber,
        name: &[u8],
        new_parent: InodeNumber,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        check_name(name)?;
        check_name(new_name)?;
        self.with_space(|| {
            let mut front = self.inner.front.write();
            self.directory_view(&mut front, parent)?;
            if self.directory_view(&mut front, new_parent)?.attributes.link_count == 0 {
                return Err(Error::NotFound);
            }
            let (source, source_type) = self.find_name(&mut front, parent, name)?.ok_or(Error::NotFound)?;
            let target = self.find_name(&mut front, new_parent, new_name)?;
            if parent == new_parent && name == new_name {
                return if mode == RenameMode::Exchange || mode == RenameMode::Replace {
                    Ok(Some(()))
                } else {
                    Err(Error::Exists)
                };
            }
            match (mode, target) {
                (RenameMode::Exchange, None) => return Err(Error::NotFound),
                (RenameMode::NoReplace, Some(_)) => return Err(Error::Exists),
                _ => {}
            }
            if let Some((target_number, _)) = target {
                if target_number == source && mode == RenameMode::Replace {
                    // Two names of one inode: POSIX says rename does nothing.
                    return Ok(Some(()));
                }
            }
            let source_is_dir = source_type == FileType::Directory;
            if source_is_dir && parent != new_parent && self.is_ancestor(&mut front, source, new_parent)? {
                return Err(Error::invalid("cannot move a directory into itself"));
            }
            let now = now_ns();
            // Working copies of every inode involved; several may be the same inode.
            let mut images: Vec<AttributeImage> = Vec::new();
            let image_of = |front: &mut Front, number: u64, images: &mut Vec<AttributeImage>| -> Result<usize> {
                if let Some(index) = images.iter().position(|image| image.inode_number == number) {
                    return Ok(index);
                }
                images.push(self.view(front, number)?.attributes.clone());
                Ok(images.len() - 1)
            };
            let parent_index = image_of(&mut front, parent, &mut images)?;
            let new_parent_index = image_of(&mut front, new_parent, &mut images)?;
            let source_index = image_of(&mut front, source, &mut images)?;
            for index in [parent_index, new_parent_index] {
                images[index].modify_time_ns = now;
                images[index].change_time_ns = now;
            }
            images[source_index].change_time_ns = now;
            let mut replaced = None;
            let kind;
            let mut entry_delta_parent: i64 = 0;
            let mut entry_delta_new_parent: i64 = 0;
            match (mode, target) {
                (RenameMode::Exchange, Some((other, other_type))) => {
                    kind = RenameKind::Exchange;
                    let other_is_dir = other_type == FileType::Directory;
                    if other_is_dir && parent != new_parent && self.is_ancestor(&mut front, other, parent)? {
                        return Err(Error::invalid("cannot move a directory into itself"));
                    }
                    let other_index = image_of(&mut front, other, &mut images)?;
                    images[other_index].change_time_ns = now;
                    if parent != new_parent {
                        if source_is_dir {
                            images[source_index].parent = new_parent;
                            images[parent_index].link_count -= 1;
                            images[new_parent_index].link_count += 1;
                        }
                        if other_is_dir {
                            images[other_index].parent = parent;
                            images[new_parent_index].link_count -= 1;
                            images[parent_index].link_count += 1;
                        }
                    }
                }
                (_, target) => {
                    kind = RenameKind::Move;
                    entry_delta_parent -= 1;
                    entry_delta_new_parent += 1;
                    if let Some((other, other_type)) = target {
                        let other_is_dir = other_type == FileType::Directory;
                        let other_view = self.view(&mut front, other)?;
                        match (source_is_dir, other_is_dir) {
                            (true, false) => return Err(Error::NotDirectory),
                            (false, true) => return Err(Error::IsDirectory),
                            (true, true) if other_view.entry_count > 0 => return Err(Error::NotEmpty),
                            _ => {}
                        }
                        let other_index = image_of(&mut front, other, &mut images)?;
                        let link_count = if other_is_dir { 0 } else { images[other_index].link_count - 1 };
                        images[other_index].link_count = link_count;
                        images[other_index].change_time_ns = now;
                        if other_is_dir {
                            images[new_parent_index].link_count -= 1;
                        }
                        let disposition = FileSystem::disposition(&front.views[&other], link_count);
                        replaced = Some((other, disposition));
                        entry_delta_new_parent -= 1;
                    }
                    if source_is_dir && parent != new_parent {
                        images[source_index].parent = new_parent;
                        images[parent_index].link_count -= 1;
                        images[new_parent_index].link_count += 1;
                    }
                }
            }
            // A directory moved in adds a link to its new parent: refused at the limit, as
            // make_directory is (EMLINK).
            if parent != new_parent && images[new_parent_index].link_count > LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            let reserve = NAMESPACE_RESERVE_BLOCKS;
            let op = Op::Rename {
                parent,
                name: name.to_vec(),
                new_parent,
                new_name: new_name.to_vec(),
                kind,
                replaced,
                images: images.clone(),
            };
            let Some(lsn) = self.append(&mut front, op, reserve)? else {
                return Ok(None);
            };
            for image in images {
                let number = image.inode_number;
                let structural = number == parent || number == new_parent;
                FileSystem::commit_view(&mut front, image, lsn, structural);
            }
            let adjust = |view: &mut InodeView, delta: i64| view.entry_count = (view.entry_count as i64 + delta) as u64;
            adjust(front.views.get_mut(&parent).unwrap(), entry_delta_parent);
            adjust(front.views.get_mut(&new_parent).unwrap(), entry_delta_new_parent);
            if let Some((other, disposition)) = replaced {
                FileSystem::settle(&mut front, other, disposition);
            }
            match (kind, target) {
                (RenameKind::Exchange, Some(other)) => self.overlay_name(&mut front, parent, name, Some(other), lsn),
                _ => self.overlay_name(&mut front, parent, name, None, lsn),
            }
            self.overlay_name(&mut front, new_parent, new_name, Some((source, source_type)), lsn);
            Ok(Some(()))
        })
    }

    /// Resolves a '/'-separated path from the root, following symbolic links in all but the
    /// last component.
    pub fn resolve_path(&self, path: &[u8]) -> Result<Attributes> {
        let mut pending: Vec<Vec<u8>> =
            path.split(|byte| *byte == b'/').filter(|part| !part.is_empty()).map(|part| part.to_vec()).rev().collect();
        let mut current = self.get_attributes(ROOT_INODE)?;
        let mut followed = 0usize;
        while let Some(component) = pending.pop() {
            if current.file_type != FileType::Directory {
                return Err(Error::NotDirectory);
            }
            let next = self.lookup(current.inode, &component)?;
            if next.file_type == FileType::Symlink && !pending.is_empty() {
                followed += 1;
                if followed > SYMLINK_FOLLOW_MAX {
                    return Err(Error::Loop);
                }
                let target = self.read_link(next.inode)?;
                if target.first() == Some(&b'/') {
                    current = self.get_attributes(ROOT_INODE)?;
                }
                pending.extend(
                    target.split(|byte| *byte == b'/').filter(|part| !part.is_empty()).map(|part| part.to_vec()).rev(),
                );
                continue;
            }
            current = next;
        }
        Ok(current)
    }

    // ------------------------------------------------------------------ directories

    /// Lists entries after `after_cookie` (0 starts; "." has cookie 1, ".." cookie 2) until
    /// `visit` returns false.
    pub fn read_directory(
        &self,
        inode: InodeNumber,
        after_cookie: u64,
        visit: &mut dyn FnMut(&DirectoryEntry) -> bool,
    ) -> Result<()> {
        let (structural, parent) = {
            let mut front = self.inner.front.write();
            let view = self.directory_view(&mut front, inode)?;
            (view.structural_lsn, view.attributes.parent)
        };
        self.wait_applied(structural)?;
        if after_cookie < 1
            && !visit(&DirectoryEntry { name: b".".to_vec(), inode, file_type: FileType::Directory, cookie: 1 })
        {
            return Ok(());
        }
        if after_cookie < 2
            && !visit(&DirectoryEntry {
                name: b"..".to_vec(),
                inode: parent,
                file_type: FileType::Directory,
                cookie: 2,
            })
        {
            return Ok(());
        }
        let mut volume = self.inner.backend.volume();
        let home = volume.read_inode(inode)?;
        let root = DirRoot::decode(&home.root_area)?;
        let mut failure = None;
        let seed = self.inner.backend.applier().hash_seed;
        dir::readdir(&mut *volume, &root, &seed, after_cookie.max(2), &mut |entry| {
            let Some(file_type) = FileType::from_dirent_type(entry.file_type) else {
                failure =
                    Some(Error::corruption(format!("directory {inode}: entry type {} is unknown", entry.file_type)));
                return false;
            };
            visit(&DirectoryEntry { name: entry.name.clone(), inode: entry.inode, file_type, cookie: entry.cookie })
        })?;
        failure.map_or(Ok(()), Err)
    }
}
