//! Namespace operations: lookup, create, link, unlink, rename, symlinks, paths, readdir.
//!
//! A change to a directory takes the directory's name shard (write) first, resolves the names
//! it needs there, then takes the view shards of every inode it changes in index order,
//! validates again against the locked views, appends and commits (see `fs::front`).

use super::*;

/// What `create_node` makes.
struct NewNode<'a> {
    name: &'a [u8],
    file_type: FileType,
    permissions: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    symlink_target: &'a [u8],
}

/// The two names of a rename.
#[derive(Clone, Copy)]
struct RenameNames<'a> {
    parent: u64,
    name: &'a [u8],
    new_parent: u64,
    new_name: &'a [u8],
}

impl FileSystem {
    // ------------------------------------------------------------------ namespace

    pub fn lookup(&self, parent: InodeNumber, name: &[u8]) -> Result<Attributes> {
        if name.len() > NAME_MAX_BYTES {
            return Err(Error::NameTooLong);
        }
        if name == b"." {
            return self.with_view(parent, |view| {
                if view.file_type() != FileType::Directory {
                    return Err(Error::NotDirectory);
                }
                Ok(view.to_attributes())
            })?;
        }
        if name == b".." {
            let up = self.directory_info(parent)?.parent;
            return self.with_view(up, |view| view.to_attributes());
        }
        // Before any lock: the shards are held only for the probes.
        check_name(name)?;
        if let Some(answer) = self.lookup_if_known(parent, name) {
            return answer;
        }
        // The directory's name shard stays read-locked until the target is read: every change
        // of its names takes the write lock, so the name cannot move meanwhile, and readers of
        // the shard walk their H-trees side by side (the walk takes no volume lock either:
        // `find_applied_name`).
        let front = &self.inner.front;
        let names = front.read_names(parent);
        let info = self.directory_info(parent)?;
        let mut walked = None;
        let found = match names.table.get(parent, name) {
            Some(entry) => entry.target,
            None if info.complete_epoch != 0 && info.complete_epoch == front.name_epoch(parent) => None,
            None => {
                let found = self.find_applied_name(parent, info.generation, name)?;
                walked = Some((found, names.table.changes()));
                found
            }
        };
        let answer = match found {
            None => Err(Error::NotFound),
            Some((number, entry_type)) => self
                .with_view(number, |view| (view.file_type(), view.to_attributes()))
                .map_err(|error| crate::block::inode::entry_target_error(parent, name, number, error))
                .and_then(|(file_type, attributes)| {
                    crate::block::inode::check_entry_type(parent, name, entry_type, file_type)?;
                    Ok(attributes)
                }),
        };
        drop(names);
        if let Some((found, changes)) = walked {
            self.cache_walked_name(parent, name, found, changes);
        }
        answer
    }

    /// Keeps an answer that `lookup` found in the H-tree under the name shard's read lock,
    /// if the shard is free now and no name change or drop happened in it since (`changes`
    /// unmoved): then the H-tree still says the same, and nothing newer is in the table.
    /// Skipped when another thread holds the shard: the next lookup walks again.
    fn cache_walked_name(&self, parent: InodeNumber, name: &[u8], found: Option<(u64, FileType)>, changes: u64) {
        let front = &self.inner.front;
        let Some(mut names) = front.try_write_names(parent) else { return };
        if names.table.changes() != changes || names.table.get(parent, name).is_some() {
            return;
        }
        front.make_room_for_name(parent, &mut names, self.applied());
        if names.table.get(parent, name).is_none() {
            names.table.cache_applied(parent, name, found);
        }
    }

    pub fn get_attributes(&self, inode: InodeNumber) -> Result<Attributes> {
        self.with_view(inode, |view| view.to_attributes())
    }

    pub fn set_attributes(&self, inode: InodeNumber, changes: &SetAttributes) -> Result<Attributes> {
        if let Some(permissions) = changes.permissions {
            if permissions & !0o7777 != 0 {
                return Err(Error::invalid(format!("mode {permissions:#o} has bits beyond 0o7777")));
            }
        }
        self.with_space(|| {
            let mut shard = self.lock_view(inode)?;
            let view = shard.views.get_mut(&inode).expect("loaded by lock_view");
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
            let freed_blocks = if truncate { view.blocks_with_pending() } else { 0 };
            let op = Op::SetAttributes { inode: image.clone(), truncate };
            let Some(lsn) = self.append_reserving(op, 0, tree_reserve, freed_blocks)? else {
                return Ok(None);
            };
            FileSystem::commit_view(view, image, lsn, truncate);
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
        let node = NewNode { name, file_type, permissions, uid, gid, rdev, symlink_target };
        self.with_space(|| {
            let front = &self.inner.front;
            let mut names = front.lock_names(&[parent]);
            let info = self.directory_info(parent)?;
            if info.link_count == 0 {
                return Err(Error::NotFound);
            }
            if self.find_name(names.shard(parent), parent, &info, name)?.is_some() {
                return Err(Error::Exists);
            }
            if file_type == FileType::Directory && info.link_count >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            let number = self.allocate_inode(parent, file_type == FileType::Directory)?;
            let made = self.create_locked(names.shard(parent), parent, &info, number, &node);
            if !matches!(made, Ok(Some(_))) {
                front.inode_numbers.free_now(number);
            }
            made
        })
    }

    /// The rest of `create_node` once the parent's name shard is held and `number` taken.
    fn create_locked(
        &self,
        names: &mut NameShard,
        parent: InodeNumber,
        info: &DirectoryInfo,
        number: InodeNumber,
        node: &NewNode<'_>,
    ) -> Result<Option<Attributes>> {
        let front = &self.inner.front;
        let file_type = node.file_type;
        let mut views = self.lock_views(&[parent, number], &[parent])?;
        let parent_view = FileSystem::locked_directory(&mut views, parent, info)?;
        let mut parent_image = parent_view.attributes.clone();
        if file_type == FileType::Directory && parent_image.link_count >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        // Only devices keep a device number (as ext4); the decoders refuse one elsewhere.
        let rdev = if matches!(file_type, FileType::CharDevice | FileType::BlockDevice) { node.rdev } else { 0 };
        // Generations only have to grow: one taken by a create that then fails is skipped.
        let generation = front.next_generation.fetch_add(1, Ordering::AcqRel);
        let now = now_ns();
        let mut mode = file_type.mode_bits() | node.permissions;
        let mut gid = node.gid;
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
            uid: node.uid,
            gid,
            size_bytes: node.symlink_target.len() as u64,
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
            name: node.name.to_vec(),
            inode: image.clone(),
            symlink_target: node.symlink_target.to_vec(),
        };
        let Some(lsn) = self.append(op, NAMESPACE_RESERVE_BLOCKS)? else {
            return Ok(None);
        };
        let parent_view = views.get(parent);
        FileSystem::commit_view(parent_view, parent_image, lsn, true);
        parent_view.entry_count += 1;
        // A symbolic link's target takes data blocks as a file's bytes do (the create writes it
        // through the extent tree): counted now, as the volume will count them once applied and
        // after a remount, so that `st_blocks` never changes under a link that did not.
        let blocks_owned = node.symlink_target.len().div_ceil(BLOCK_SIZE_U64 as usize) as u64;
        let mut view = InodeView::new(image, blocks_owned, 0);
        view.last_change_lsn = lsn;
        view.structural_lsn = lsn;
        view.last_use.store(front.tick(), Ordering::Relaxed);
        if file_type == FileType::Directory {
            // Made empty now: every name it will have goes through its name shard.
            view.complete_epoch = front.name_epoch(number);
        }
        let attributes = view.to_attributes();
        let shard = views.shard(number);
        shard.views.insert(number, view);
        shard.trim(self.applied(), &[parent, number]);
        self.overlay_name(names, parent, node.name, Some((number, file_type)), lsn);
        Ok(Some(attributes))
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
        let size = self.with_view(inode, |view| {
            if view.file_type() != FileType::Symlink {
                return Err(Error::invalid("not a symbolic link"));
            }
            Ok(view.attributes.size_bytes as usize)
        })??;
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
            let mut names = self.inner.front.lock_names(&[new_parent]);
            let info = self.directory_info(new_parent)?;
            if info.link_count == 0 {
                return Err(Error::NotFound);
            }
            let names = names.shard(new_parent);
            if self.find_name(names, new_parent, &info, new_name)?.is_some() {
                return Err(Error::Exists);
            }
            let mut views = self.lock_views(&[inode, new_parent], &[inode, new_parent])?;
            let view = views.get(inode);
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
            let mut parent_image = FileSystem::locked_directory(&mut views, new_parent, &info)?.attributes.clone();
            let now = now_ns();
            image.link_count += 1;
            image.change_time_ns = now;
            parent_image.modify_time_ns = now;
            parent_image.change_time_ns = now;
            let file_type = image.file_type();
            let op = Op::Link { parent: parent_image.clone(), name: new_name.to_vec(), inode: image.clone() };
            let Some(lsn) = self.append(op, NAMESPACE_RESERVE_BLOCKS)? else {
                return Ok(None);
            };
            let parent_view = views.get(new_parent);
            FileSystem::commit_view(parent_view, parent_image, lsn, true);
            parent_view.entry_count += 1;
            let view = views.get(inode);
            FileSystem::commit_view(view, image, lsn, false);
            let attributes = view.to_attributes();
            self.overlay_name(names, new_parent, new_name, Some((inode, file_type)), lsn);
            Ok(Some(attributes))
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

    /// Records the fate of an inode that lost its last name (the caller holds its view).
    pub(super) fn settle(&self, view: &mut InodeView, disposition: Disposition) {
        match disposition {
            Disposition::Keep => {}
            Disposition::Orphan => view.orphaned = true,
            Disposition::Reclaim => {
                view.reclaimed = true;
                // The reclaim's lsn is assigned already, so a create that takes the number now
                // gets a later one: records apply in lsn order, and the number may be reused
                // at once.
                self.inner.front.inode_numbers.free_now(view.attributes.inode_number);
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
            let mut names = self.inner.front.lock_names(&[parent]);
            let info = self.directory_info(parent)?;
            let names = names.shard(parent);
            let (number, file_type) = self.find_name(names, parent, &info, name)?.ok_or(Error::NotFound)?;
            let mut views = self.lock_views(&[parent, number], &[parent, number])?;
            let view = views.get(number);
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
            let parent_view = views.get(parent);
            if parent_view.reclaimed || parent_view.attributes.generation != info.generation {
                return Err(Error::NotFound);
            }
            let mut parent_image = parent_view.attributes.clone();
            parent_image.modify_time_ns = now;
            parent_image.change_time_ns = now;
            if directory {
                parent_image.link_count -= 1;
            }
            // The last name of a file nobody has open: the record frees its blocks.
            let freed_blocks =
                if disposition == Disposition::Reclaim { views.get(number).blocks_with_pending() } else { 0 };
            let op =
                Op::Unlink { parent: parent_image.clone(), name: name.to_vec(), inode: image.clone(), disposition };
            let Some(lsn) = self.append_reserving(op, 0, 0, freed_blocks)? else {
                return Ok(None);
            };
            let parent_view = views.get(parent);
            FileSystem::commit_view(parent_view, parent_image, lsn, true);
            parent_view.entry_count -= 1;
            let view = views.get(number);
            FileSystem::commit_view(view, image, lsn, false);
            self.settle(view, disposition);
            self.overlay_name(names, parent, name, None, lsn);
            Ok(Some(()))
        })
    }

    /// True when `ancestor` is `directory` or one of its ancestors.
    /// The caller holds the rename lock, so no directory's parent changes meanwhile.
    pub(super) fn is_ancestor(&self, ancestor: u64, directory: u64) -> Result<bool> {
        let mut current = directory;
        for _ in 0..DEPTH_WALK_MAX {
            if current == ancestor {
                return Ok(true);
            }
            if current == ROOT_INODE {
                return Ok(false);
            }
            current = self.with_view(current, |view| view.attributes.parent)?;
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
            // A move between directories takes the rename lock first: the check that a
            // directory is not moved into its own subtree walks parents that only such moves
            // change.
            let _moves = (parent != new_parent).then(|| self.inner.front.rename_lock.lock());
            let mut names = self.inner.front.lock_names(&[parent, new_parent]);
            let info = self.directory_info(parent)?;
            let new_info = self.directory_info(new_parent)?;
            if new_info.link_count == 0 {
                return Err(Error::NotFound);
            }
            let (source, source_type) =
                self.find_name(names.shard(parent), parent, &info, name)?.ok_or(Error::NotFound)?;
            let target = self.find_name(names.shard(new_parent), new_parent, &new_info, new_name)?;
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
            if source_is_dir && parent != new_parent && self.is_ancestor(source, new_parent)? {
                return Err(Error::invalid("cannot move a directory into itself"));
            }
            if let (RenameMode::Exchange, Some((other, FileType::Directory))) = (mode, target) {
                if parent != new_parent && self.is_ancestor(other, parent)? {
                    return Err(Error::invalid("cannot move a directory into itself"));
                }
            }
            let mut involved = vec![parent, new_parent, source];
            involved.extend(target.map(|(other, _)| other));
            let mut views = self.lock_views(&involved, &involved)?;
            FileSystem::locked_directory(&mut views, parent, &info)?;
            FileSystem::locked_directory(&mut views, new_parent, &new_info)?;
            let names_of = RenameNames { parent, name, new_parent, new_name };
            self.rename_locked(&mut views, &names_of, (source, source_type), target, mode).map(|appended| {
                appended.map(|(lsn, kind)| {
                    match (kind, target) {
                        (RenameKind::Exchange, Some(other)) => {
                            self.overlay_name(names.shard(parent), parent, name, Some(other), lsn)
                        }
                        _ => self.overlay_name(names.shard(parent), parent, name, None, lsn),
                    }
                    self.overlay_name(names.shard(new_parent), new_parent, new_name, Some((source, source_type)), lsn);
                })
            })
        })
    }

    /// The rest of `rename` once every shard it changes is locked and the views are loaded:
    /// computes the new images, appends and commits them; returns the record's lsn and kind
    /// (`None` when there was no room).
    fn rename_locked(
        &self,
        views: &mut ViewLocks<'_>,
        names: &RenameNames<'_>,
        (source, source_type): (u64, FileType),
        target: Option<(u64, FileType)>,
        mode: RenameMode,
    ) -> Result<Option<(u64, RenameKind)>> {
        let RenameNames { parent, name, new_parent, new_name } = *names;
        let source_is_dir = source_type == FileType::Directory;
        let now = now_ns();
        // Working copies of every inode involved; several may be the same inode.
        let mut images: Vec<AttributeImage> = Vec::new();
        let mut image_of = |views: &mut ViewLocks<'_>, number: u64| -> usize {
            if let Some(index) = images.iter().position(|image| image.inode_number == number) {
                return index;
            }
            images.push(views.get(number).attributes.clone());
            images.len() - 1
        };
        let parent_index = image_of(views, parent);
        let new_parent_index = image_of(views, new_parent);
        let source_index = image_of(views, source);
        let other_index = target.map(|(other, _)| image_of(views, other));
        for index in [parent_index, new_parent_index] {
            images[index].modify_time_ns = now;
            images[index].change_time_ns = now;
        }
        images[source_index].change_time_ns = now;
        let mut replaced = None;
        let kind;
        let mut entry_delta_parent: i64 = 0;
        let mut entry_delta_new_parent: i64 = 0;
        match (mode, target, other_index) {
            (RenameMode::Exchange, Some((_, other_type)), Some(other_index)) => {
                kind = RenameKind::Exchange;
                let other_is_dir = other_type == FileType::Directory;
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
            _ => {
                kind = RenameKind::Move;
                entry_delta_parent -= 1;
                entry_delta_new_parent += 1;
                if let (Some((other, other_type)), Some(other_index)) = (target, other_index) {
                    let other_is_dir = other_type == FileType::Directory;
                    let other_view = views.get(other);
                    match (source_is_dir, other_is_dir) {
                        (true, false) => return Err(Error::NotDirectory),
                        (false, true) => return Err(Error::IsDirectory),
                        (true, true) if other_view.entry_count > 0 => return Err(Error::NotEmpty),
                        _ => {}
                    }
                    let link_count = if other_is_dir { 0 } else { images[other_index].link_count - 1 };
                    images[other_index].link_count = link_count;
                    images[other_index].change_time_ns = now;
                    if other_is_dir {
                        images[new_parent_index].link_count -= 1;
                    }
                    let disposition = FileSystem::disposition(other_view, link_count);
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
        // A replaced file that loses its last name and is not open is freed by the record.
        let freed_blocks = match replaced {
            Some((other, Disposition::Reclaim)) => views.get(other).blocks_with_pending(),
            _ => 0,
        };
        let op = Op::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            kind,
            replaced,
            images: images.clone(),
        };
        let Some(lsn) = self.append_reserving(op, NAMESPACE_RESERVE_BLOCKS, 0, freed_blocks)? else {
            return Ok(None);
        };
        for image in images {
            let number = image.inode_number;
            let structural = number == parent || number == new_parent;
            FileSystem::commit_view(views.get(number), image, lsn, structural);
        }
        let adjust = |view: &mut InodeView, delta: i64| view.entry_count = (view.entry_count as i64 + delta) as u64;
        adjust(views.get(parent), entry_delta_parent);
        adjust(views.get(new_parent), entry_delta_new_parent);
        if let Some((other, disposition)) = replaced {
            self.settle(views.get(other), disposition);
        }
        Ok(Some((lsn, kind)))
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
        let (structural, parent) = self.with_view(inode, |view| {
            if view.file_type() != FileType::Directory {
                return Err(Error::NotDirectory);
            }
            Ok((view.structural_lsn, view.attributes.parent))
        })??;
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
        let mut volume = self.inner.backend.volume()?;
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
