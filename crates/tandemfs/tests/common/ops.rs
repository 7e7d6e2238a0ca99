//! The random operation driver: picks an operation, predicts its outcome from the model, runs
//! it on the file system and compares. Any disagreement panics with the operation described.

use super::*;
use rand::seq::SliceRandom;

/// Shapes of workload.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Names are drawn from this many per directory: few names make collisions common.
    pub names_per_directory: usize,
    /// Largest single write.
    pub write_bytes_max: usize,
    /// Largest file the workload grows.
    pub file_bytes_max: u64,
    /// Share of operations that create entries (large-directory runs raise it).
    pub create_weight: u32,
    /// Keep directories flat (one level) to grow them large.
    pub flat: bool,
}

impl Workload {
    pub fn mixed() -> Workload {
        Workload {
            names_per_directory: 24,
            write_bytes_max: 20_000,
            file_bytes_max: 200_000,
            create_weight: 6,
            flat: false,
        }
    }
    pub fn large_directory() -> Workload {
        Workload {
            names_per_directory: 30_000,
            write_bytes_max: 512,
            file_bytes_max: 4096,
            create_weight: 40,
            flat: true,
        }
    }
}

/// The outcome of one operation: whether it ran, or the file system failed (crash tests).
pub type Step = Result<(), Error>;

fn kind_of(error: &Error) -> String {
    match error {
        Error::InvalidArgument(_) => "InvalidArgument".into(),
        Error::Corruption { what } => panic!("corruption during the model test: {what}"),
        other => format!("{other:?}"),
    }
}

/// Compares an outcome with the expected error kind (None: success). I/O failures and shutdown
/// are passed up: the crash test injects them.
fn expect<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    expected: Option<&str>,
) -> Result<Option<T>, Error> {
    match result {
        // Includes an `insert` whose bytes failed to reach the log and whose undo failed too
        // (the volume shut down meanwhile): an I/O error naming both causes.
        Err(error @ (Error::Io { .. } | Error::Shutdown)) => Err(error),
        Ok(value) => {
            assert!(expected.is_none(), "{what}: succeeded, expected {expected:?}");
            Ok(Some(value))
        }
        Err(error) => {
            let kind = kind_of(&error);
            assert_eq!(Some(kind.as_str()), expected, "{what}: got {error}");
            Ok(None)
        }
    }
}

fn random_name(rng: &mut SmallRng, workload: &Workload) -> String {
    match rng.gen_range(0..100) {
        0 => "n".repeat(rng.gen_range(200..=255)),
        1 => format!("ünïcødé-{}-名前", rng.gen_range(0..workload.names_per_directory)),
        _ => format!("e{}", rng.gen_range(0..workload.names_per_directory)),
    }
}

fn pick<'a>(rng: &mut SmallRng, items: &'a [String]) -> Option<&'a String> {
    items.choose(rng)
}

pub struct Driver {
    pub model: Model,
    pub workload: Workload,
    pub operations: u64,
    /// States an operation of several log records passes through on its way (an `insert` of
    /// data: the hole before the bytes); the crash test also accepts these. The caller empties
    /// it.
    pub passed_through: Vec<Model>,
    /// The directory the model's root stands for ("" is the volume's root): threads of the
    /// multi-threaded tests each drive a private subtree.
    pub root: String,
}

impl Driver {
    pub fn new(workload: Workload) -> Driver {
        Driver::rooted(workload, "")
    }

    /// A driver whose model's root is the directory at `root` (which must exist and be empty).
    pub fn rooted(workload: Workload, root: &str) -> Driver {
        Driver { model: Model::new(), workload, operations: 0, passed_through: Vec::new(), root: root.to_string() }
    }

    /// Resolves a model path (relative to the driver's root) through the file system.
    fn resolve(&self, fs: &FileSystem, path: &str) -> Result<Attributes, Error> {
        resolve(fs, &join(&self.root, path))
    }

    fn paths(&self, filter: impl Fn(&Node) -> bool) -> Vec<String> {
        self.model.nodes.iter().filter(|(_, node)| filter(node)).map(|(path, _)| path.clone()).collect()
    }
    /// One random path whose node passes `filter`: seeks to a random key and walks forward
    /// (wrapping) to the first match, so a pick costs O(log n) on large models.
    fn pick_path(&self, rng: &mut SmallRng, filter: impl Fn(&str, &Node) -> bool) -> Option<String> {
        let start = format!("e{}", rng.gen_range(0..self.workload.names_per_directory));
        let after = self.model.nodes.range(start.clone()..);
        let before = self.model.nodes.range(..start);
        after.chain(before).find(|(path, node)| filter(path, node)).map(|(path, _)| path.clone())
    }

    fn pick_directory(&self, rng: &mut SmallRng) -> String {
        if self.workload.flat {
            let directories = self.directories();
            return pick(rng, &directories).unwrap().clone();
        }
        self.pick_path(rng, |_, node| matches!(node, Node::Directory { .. })).unwrap()
    }
    fn directories(&self) -> Vec<String> {
        if self.workload.flat {
            // Flat workloads create no directories: the root is the only one.
            return vec![String::new()];
        }
        self.paths(|node| matches!(node, Node::Directory { .. }))
    }

    /// Runs one random operation.
    pub fn step(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        self.operations += 1;
        let create = self.workload.create_weight;
        let choice = rng.gen_range(0..(create * 3 + 60));
        if choice < create {
            return self.create(fs, rng, FileType::Regular);
        }
        if choice < create * 2 {
            return self.create(fs, rng, if self.workload.flat { FileType::Regular } else { FileType::Directory });
        }
        if choice < create * 3 {
            return self.create(fs, rng, FileType::Symlink);
        }
        match choice - create * 3 {
            0..=11 => self.write(fs, rng),
            12..=19 => self.read(fs, rng),
            20..=22 => self.truncate(fs, rng),
            23..=26 => self.insert(fs, rng),
            27..=30 => self.collapse(fs, rng),
            31..=32 => self.punch(fs, rng),
            33..=36 => self.remove(fs, rng),
            37..=42 => self.rename(fs, rng),
            43..=44 => self.link(fs, rng),
            45..=48 => self.xattr(fs, rng),
            49..=52 => self.list(fs, rng),
            _ => self.stat(fs, rng),
        }
    }

    fn create(&mut self, fs: &FileSystem, rng: &mut SmallRng, file_type: FileType) -> Step {
        let parent = self.pick_directory(rng);
        let name = random_name(rng, &self.workload);
        let path = join(&parent, &name);
        let parent_inode = self.resolve(fs, &parent)?.inode;
        let expected = if self.model.nodes.contains_key(&path) { Some("Exists") } else { None };
        let what = format!("create {file_type:?} {path:?}");
        let result = match file_type {
            FileType::Directory => fs.make_directory(parent_inode, name.as_bytes(), 0o755, 0, 0),
            FileType::Symlink => {
                let target = format!("target-{}", rng.gen_range(0..1000));
                let result = fs.symlink(parent_inode, name.as_bytes(), target.as_bytes(), 0, 0);
                if result.is_ok() {
                    self.model.nodes.insert(path.clone(), Node::Symlink { target: target.into_bytes() });
                }
                result
            }
            _ => fs.create(parent_inode, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0),
        };
        if let Some(attributes) = expect(&what, result, expected)? {
            assert_eq!(attributes.file_type, file_type);
            match file_type {
                FileType::Directory => {
                    self.model.nodes.insert(path, Node::Directory { xattrs: BTreeMap::new() });
                }
                FileType::Regular => {
                    self.model.nodes.insert(path, Node::File { data: Vec::new(), xattrs: BTreeMap::new() });
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn pick_file(&self, rng: &mut SmallRng) -> Option<(String, u64)> {
        let path = self.pick_path(rng, |_, node| matches!(node, Node::File { .. }))?;
        let size = self.data(&path).len() as u64;
        Some((path, size))
    }

    fn data(&self, path: &str) -> &Vec<u8> {
        match &self.model.nodes[path] {
            Node::File { data, .. } => data,
            _ => unreachable!(),
        }
    }

    /// Changes the contents of a file and of every hard link to it, in place.
    fn modify_data(&mut self, path: &str, change: impl Fn(&mut Vec<u8>)) {
        for link in self.model.links(path) {
            if let Some(Node::File { data, .. }) = self.model.nodes.get_mut(&link) {
                change(data);
            }
        }
    }

    fn write(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let Some((path, size)) = self.pick_file(rng) else { return Ok(()) };
        let offset = if rng.gen_bool(0.3) { size } else { rng.gen_range(0..=size + 8192) };
        let length =
            if rng.gen_bool(0.8) { rng.gen_range(1..=4096) } else { rng.gen_range(1..=self.workload.write_bytes_max) };
        if offset + length as u64 > self.workload.file_bytes_max {
            return Ok(());
        }
        let bytes = pattern(rng, length);
        let inode = self.resolve(fs, &path)?.inode;
        if expect(&format!("write {path:?}"), fs.write(inode, offset, &bytes), None)?.is_some() {
            let end = offset as usize + length;
            self.modify_data(&path, |data| {
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[offset as usize..end].copy_from_slice(&bytes);
            });
        }
        Ok(())
    }

    fn read(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let Some((path, size)) = self.pick_file(rng) else { return Ok(()) };
        let size = size as usize;
        let offset = rng.gen_range(0..=size + 10);
        let length = rng.gen_range(0..=20_000);
        let inode = self.resolve(fs, &path)?.inode;
        let mut buffer = vec![0xAAu8; length];
        if let Some(read) = expect(&format!("read {path:?}"), fs.read(inode, offset as u64, &mut buffer), None)? {
            let data = self.data(&path);
            let expected = if offset >= size { &[][..] } else { &data[offset..size.min(offset + length)] };
            assert_eq!(read, expected.len(), "read {path:?} at {offset}: length");
            assert!(buffer[..read] == *expected, "read {path:?} at {offset}+{length}: contents differ");
        }
        Ok(())
    }

    fn truncate(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let Some((path, old_size)) = self.pick_file(rng) else { return Ok(()) };
        let size = rng.gen_range(0..=(old_size + 10_000).min(self.workload.file_bytes_max));
        let inode = self.resolve(fs, &path)?.inode;
        let changes = SetAttributes { size_bytes: Some(size), ..SetAttributes::default() };
        if let Some(attributes) = expect(&format!("truncate {path:?}"), fs.set_attributes(inode, &changes), None)? {
            assert_eq!(attributes.size_bytes, size);
            self.modify_data(&path, |data| data.resize(size as usize, 0));
        }
        Ok(())
    }

    /// Inserts a hole (`insert_range`) or bytes (`insert`) at a byte offset, mostly inside a
    /// block, so that replay meets cuts inside blocks that later records fill.
    fn insert(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let Some((path, size)) = self.pick_file(rng) else { return Ok(()) };
        let offset = rng.gen_range(0..=size + 2);
        let length = if rng.gen_bool(0.5) { rng.gen_range(1..=300u64) } else { rng.gen_range(1..=6000u64) };
        if size + length > self.workload.file_bytes_max {
            return Ok(());
        }
        let inode = self.resolve(fs, &path)?.inode;
        let expected = if offset > size { Some("InvalidArgument") } else { None };
        let with_data = rng.gen_bool(0.5);
        let bytes = if with_data { pattern(rng, length as usize) } else { vec![0u8; length as usize] };
        let result = if with_data {
            // `insert` logs the hole and then the bytes: a crash between the two records
            // leaves the hole, which the crash test accepts for an unacknowledged insert.
            if expected.is_none() {
                let mut hole = self.model.clone();
                hole.update_file(&path, |node| {
                    if let Node::File { data, .. } = node {
                        data.splice(offset as usize..offset as usize, std::iter::repeat_n(0u8, length as usize));
                    }
                });
                self.passed_through.push(hole);
            }
            fs.insert(inode, offset, &bytes)
        } else {
            fs.insert_range(inode, offset, length)
        };
        if expect(&format!("insert {path:?} {offset}+{length} (data: {with_data})"), result, expected)?.is_some() {
            self.modify_data(&path, |data| {
                data.splice(offset as usize..offset as usize, bytes.iter().copied());
            });
        }
        Ok(())
    }

    fn collapse(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let Some((path, size)) = self.pick_file(rng) else { return Ok(()) };
        let offset = rng.gen_range(0..=size);
        let length = rng.gen_range(1..=8000u64);
        let inode = self.resolve(fs, &path)?.inode;
        let expected = if offset + length > size { Some("InvalidArgument") } else { None };
        if expect(&format!("collapse {path:?} {offset}+{length}"), fs.collapse_range(inode, offset, length), expected)?
            .is_some()
        {
            self.modify_data(&path, |data| {
                data.drain(offset as usize..(offset + length) as usize);
            });
        }
        Ok(())
    }

    fn punch(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let Some((path, size)) = self.pick_file(rng) else { return Ok(()) };
        let offset = rng.gen_range(0..=size + 100);
        let length = rng.gen_range(1..=12_000u64);
        let inode = self.resolve(fs, &path)?.inode;
        let zero = rng.gen_bool(0.5);
        let keep_size = rng.gen_bool(0.5);
        if zero && !keep_size && offset + length > self.workload.file_bytes_max {
            return Ok(());
        }
        let result =
            if zero { fs.zero_range(inode, offset, length, keep_size) } else { fs.punch_hole(inode, offset, length) };
        if expect(&format!("punch/zero {path:?} {offset}+{length}"), result, None)?.is_some() {
            let end = if zero && !keep_size { (offset + length).max(size) } else { size };
            let clear_end = (offset + length).min(end);
            self.modify_data(&path, |data| {
                data.resize(end as usize, 0);
                if offset < clear_end {
                    data[offset as usize..clear_end as usize].fill(0);
                }
            });
        }
        Ok(())
    }

    fn remove(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let Some(path) = self.pick_path(rng, |path, _| !path.is_empty()) else { return Ok(()) };
        let parent_inode = self.resolve(fs, parent_of(&path))?.inode;
        let name = name_of(&path);
        let is_dir = self.model.is_dir(&path);
        let as_directory = if rng.gen_bool(0.9) { is_dir } else { !is_dir };
        let expected = match (as_directory, is_dir) {
            (true, true) if !self.model.children(&path).is_empty() => Some("NotEmpty"),
            (true, false) => Some("NotDirectory"),
            (false, true) => Some("IsDirectory"),
            _ => None,
        };
        let result = if as_directory {
            fs.remove_directory(parent_inode, name.as_bytes())
        } else {
            fs.unlink(parent_inode, name.as_bytes())
        };
        if expect(&format!("remove {path:?} (as directory: {as_directory})"), result, expected)?.is_some() {
            self.model.remove_subtree(&path);
        }
        Ok(())
    }

    fn rename(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let Some(source) = self.pick_path(rng, |path, _| !path.is_empty()) else { return Ok(()) };
        let target_parent = self.pick_directory(rng);
        let target = if rng.gen_bool(0.5) {
            // Aim at an existing name half the time.
            let siblings = self.model.children(&target_parent);
            match pick(rng, &siblings) {
                Some(sibling) => sibling.clone(),
                None => join(&target_parent, &random_name(rng, &self.workload)),
            }
        } else {
            join(&target_parent, &random_name(rng, &self.workload))
        };
        let mode = match rng.gen_range(0..10) {
            0 => RenameMode::NoReplace,
            1 => RenameMode::Exchange,
            _ => RenameMode::Replace,
        };
        let model = &self.model;
        let source_is_dir = model.is_dir(&source);
        let target_exists = model.nodes.contains_key(&target);
        let same_inode = target_exists
            && source != target
            && model.link_group.contains_key(&source)
            && model.link_group.get(&source) == model.link_group.get(&target);
        let inside = |outer: &str, path: &str| path == outer || path.starts_with(&format!("{outer}/"));
        let source_parent = parent_of(&source).to_string();
        let expected: Option<&str> = if source == target {
            if mode == RenameMode::NoReplace {
                Some("Exists")
            } else {
                None
            }
        } else if mode == RenameMode::Exchange && !target_exists {
            Some("NotFound")
        } else if mode == RenameMode::NoReplace && target_exists {
            Some("Exists")
        } else if same_inode && mode == RenameMode::Replace {
            None
        } else if source_is_dir && source_parent != target_parent && inside(&source, &target_parent) {
            Some("InvalidArgument")
        } else if mode == RenameMode::Exchange {
            if model.is_dir(&target) && source_parent != target_parent && inside(&target, &source_parent) {
                Some("InvalidArgument")
            } else {
                None
            }
        } else if target_exists {
            match (source_is_dir, model.is_dir(&target)) {
                (true, false) => Some("NotDirectory"),
                (false, true) => Some("IsDirectory"),
                (true, true) if !model.children(&target).is_empty() => Some("NotEmpty"),
                _ => None,
            }
        } else {
            None
        };
        let parent_inode = self.resolve(fs, &source_parent)?.inode;
        let target_parent_inode = self.resolve(fs, &target_parent)?.inode;
        let what = format!("rename {source:?} -> {target:?} {mode:?}");
        let result = fs.rename(
            parent_inode,
            name_of(&source).as_bytes(),
            target_parent_inode,
            name_of(&target).as_bytes(),
            mode,
        );
        if expect(&what, result, expected)?.is_none() || source == target || (same_inode && mode == RenameMode::Replace)
        {
            return Ok(());
        }
        if mode == RenameMode::Exchange {
            let swap = "\u{1}swap";
            self.model.move_subtree(&source, swap);
            self.model.move_subtree(&target, &source);
            self.model.move_subtree(swap, &target);
        } else {
            if target_exists {
                self.model.remove_subtree(&target);
            }
            self.model.move_subtree(&source, &target);
        }
        Ok(())
    }

    fn link(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let Some(source) = self.pick_path(rng, |_, node| matches!(node, Node::File { .. })) else { return Ok(()) };
        let parent = self.pick_directory(rng);
        let target = join(&parent, &random_name(rng, &self.workload));
        let expected = if self.model.nodes.contains_key(&target) { Some("Exists") } else { None };
        let inode = self.resolve(fs, &source)?.inode;
        let parent_inode = self.resolve(fs, &parent)?.inode;
        if expect(
            &format!("link {source:?} -> {target:?}"),
            fs.link(inode, parent_inode, name_of(&target).as_bytes()),
            expected,
        )?
        .is_some()
        {
            let group = match self.model.link_group.get(&source) {
                Some(group) => *group,
                None => {
                    let group = self.model.next_group;
                    self.model.next_group += 1;
                    self.model.link_group.insert(source.clone(), group);
                    group
                }
            };
            self.model.link_group.insert(target.clone(), group);
            let node = self.model.nodes[&source].clone();
            self.model.nodes.insert(target, node);
        }
        Ok(())
    }

    fn xattr(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let path = self.pick_path(rng, |_, node| !matches!(node, Node::Symlink { .. })).unwrap();
        let inode = self.resolve(fs, &path)?.inode;
        let name = format!("user.a{}", rng.gen_range(0..6)).into_bytes();
        let current = match &self.model.nodes[&path] {
            Node::File { xattrs, .. } | Node::Directory { xattrs } => xattrs.clone(),
            Node::Symlink { .. } => unreachable!(),
        };
        let update = |model: &mut Model, xattrs: BTreeMap<Vec<u8>, Vec<u8>>| {
            let apply = |node: &mut Node| match node {
                Node::File { xattrs: old, .. } | Node::Directory { xattrs: old } => *old = xattrs.clone(),
                Node::Symlink { .. } => {}
            };
            if model.is_dir(&path) {
                apply(model.nodes.get_mut(&path).unwrap());
            } else {
                model.update_file(&path, apply);
            }
        };
        match rng.gen_range(0..4) {
            0 | 1 => {
                let value_length = rng.gen_range(0..300);
                let value = pattern(rng, value_length);
                let mode = [XattrMode::CreateOrReplace, XattrMode::Create, XattrMode::Replace][rng.gen_range(0..3)];
                let expected = match (mode, current.contains_key(&name)) {
                    (XattrMode::Create, true) => Some("Exists"),
                    (XattrMode::Replace, false) => Some("NoData"),
                    _ => None,
                };
                if expect(&format!("setxattr {path:?}"), fs.set_xattr(inode, &name, &value, mode), expected)?.is_some()
                {
                    let mut xattrs = current;
                    xattrs.insert(name, value);
                    update(&mut self.model, xattrs);
                }
            }
            2 => {
                let expected = if current.contains_key(&name) { None } else { Some("NoData") };
                if expect(&format!("removexattr {path:?}"), fs.remove_xattr(inode, &name), expected)?.is_some() {
                    let mut xattrs = current;
                    xattrs.remove(&name);
                    update(&mut self.model, xattrs);
                }
            }
            _ => {
                let expected = if current.contains_key(&name) { None } else { Some("NoData") };
                if let Some(value) = expect(&format!("getxattr {path:?}"), fs.get_xattr(inode, &name), expected)? {
                    assert_eq!(Some(&value), current.get(&name), "getxattr {path:?}");
                }
                let mut listed = fs.list_xattr(inode)?;
                listed.sort();
                assert_eq!(listed, current.keys().cloned().collect::<Vec<_>>(), "listxattr {path:?}");
            }
        }
        Ok(())
    }

    fn list(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let path = self.pick_directory(rng);
        let inode = self.resolve(fs, &path)?.inode;
        // Page through the listing with small pages, as readdir with a small buffer does.
        let page = if self.workload.flat { rng.gen_range(500..3000) } else { rng.gen_range(1..50) };
        let mut cookie = 0;
        let mut names = Vec::new();
        loop {
            let mut got = 0;
            fs.read_directory(inode, cookie, &mut |entry| {
                if got == page {
                    return false;
                }
                got += 1;
                cookie = entry.cookie;
                names.push(String::from_utf8(entry.name.clone()).unwrap());
                true
            })?;
            if got < page {
                break;
            }
        }
        assert_eq!(&names[..2], &[".".to_string(), "..".to_string()], "listing of {path:?}");
        let mut listed: Vec<String> = names[2..].iter().map(|name| join(&path, name)).collect();
        listed.sort();
        assert_eq!(listed, self.model.children(&path), "listing of {path:?}");
        Ok(())
    }

    fn stat(&mut self, fs: &FileSystem, rng: &mut SmallRng) -> Step {
        let path = self.pick_path(rng, |_, _| true).unwrap();
        let attributes = self.resolve(fs, &path)?;
        match &self.model.nodes[&path] {
            Node::File { data, .. } => {
                assert_eq!(attributes.file_type, FileType::Regular, "{path:?}");
                assert_eq!(attributes.size_bytes, data.len() as u64, "size of {path:?}");
                assert_eq!(attributes.link_count as usize, self.model.links(&path).len(), "links of {path:?}");
            }
            Node::Directory { .. } => {
                assert_eq!(attributes.file_type, FileType::Directory, "{path:?}");
                let subdirectories = self.model.children(&path).iter().filter(|child| self.model.is_dir(child)).count();
                assert_eq!(attributes.link_count as usize, 2 + subdirectories, "links of {path:?}");
            }
            Node::Symlink { target } => {
                assert_eq!(attributes.file_type, FileType::Symlink);
                assert_eq!(&fs.read_link(attributes.inode)?, target, "target of {path:?}");
            }
        }
        Ok(())
    }
}
