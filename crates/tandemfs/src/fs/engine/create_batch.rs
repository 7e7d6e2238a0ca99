//! `FileSystem::create_batch`: many creates, logged as a few `Op::CreateBatch` records instead
//! of one `Op::Create` each (docs/BATCH.md, "Creates").
//!
//! The batch is dealt to workers by parent directory (all requests in one directory go to one
//! worker, in request order); a worker cuts its requests into groups of at most
//! `CREATE_BATCH_RECORD_MAX` and makes each group as one change: the name shards of every
//! parent of the group held (in shard order, as `lock_names` takes them), existence decided for
//! the whole group, inode numbers taken, the view shards of the parents and new inodes locked,
//! ONE record appended, then the views and names committed. Each create's answer is the one the
//! single `create` would have given at that moment; the record replays as that many creates.

use super::batch::{BatchIndex, ClaimAnswer, IndexCreate};
use super::*;
use crate::backend::record::{BatchCreate, CREATE_BATCH_RECORD_MAX};
use crate::block::inode::INODE_BYTES;
use crate::types::LINK_MAX;
use std::hash::BuildHasher;

/// Inode records in one inode-table block.
const INODES_PER_TABLE_BLOCK: u64 = BLOCK_SIZE_U64 / INODE_BYTES as u64;
/// Bytes of names a directory leaf holds at the least (a leaf splits at about half full), for
/// the bound on the leaves a group's names may dirty or add.
const LEAF_NAME_BYTES_MIN: u64 = BLOCK_SIZE_U64 / 2;
/// New directories one create batch record makes at most (see `group_end`).
const DIRECTORIES_PER_RECORD_MAX: usize = 32;
/// Bytes a name takes in a leaf besides its own (the entry header and padding, at most).
const ENTRY_OVERHEAD_BYTES: u64 = 16;

/// What the directory index said of a group's names (`BatchIndex::claim_creates`): per place
/// in the group, the inode number taken for the request and the index's answer.
struct GroupClaims {
    numbers: Vec<Option<InodeNumber>>,
    answers: Vec<Option<ClaimAnswer>>,
}

impl GroupClaims {
    /// Whether `inode` is one this group took (the index names it for a later request of a
    /// name an earlier request claimed: the group's own rules decide that request).
    fn is_own(&self, inode: InodeNumber) -> bool {
        self.numbers.contains(&Some(inode))
    }
}

/// One request of a group, planned: where it is in the batch, its new inode number and its
/// parent's place in the group's parents.
struct Planned {
    position: usize,
    number: InodeNumber,
    parent_place: usize,
}

impl FileSystem {
    /// Makes every request of `requests` (answers in request order), in groups logged as one
    /// record each. Requests in one directory run in request order (the first of a name makes
    /// it, later ones answer `Exists`); requests in different directories run concurrently.
    pub(super) fn create_batch_logged(&self, requests: &[batch::CreateRequest<'_>]) -> Vec<Result<Attributes>> {
        let mut answers: Vec<Option<Result<Attributes>>> = requests.iter().map(check_request).collect();
        let workers = crate::sync::cores();
        let workers = workers.min(requests.len().div_ceil(CREATE_BATCH_RECORD_MAX)).clamp(1, 256);
        let keyed = (0..requests.len())
            .filter(|position| answers[*position].is_none())
            .map(|position| (position, rustc_hash::FxBuildHasher.hash_one(requests[position].parent)));
        let made = batch::map_buckets(requests.len(), keyed, workers, |bucket, answered| {
            self.create_bucket(requests, bucket, answered)
        });
        for (position, answer) in made.into_iter().enumerate() {
            if let Some(answer) = answer {
                debug_assert!(answers[position].is_none(), "request {position} answered twice");
                answers[position] = Some(answer);
            }
        }
        answers.into_iter().map(|answer| answer.expect("every request is answered")).collect()
    }

    /// Makes the requests at `positions` (all of a few directories, in request order) in
    /// groups of at most `CREATE_BATCH_RECORD_MAX`. (A request names its parent by number, so it
    /// cannot name a directory the same batch makes: no group depends on another's result.)
    fn create_bucket(
        &self,
        requests: &[batch::CreateRequest<'_>],
        positions: &[usize],
        answered: &mut Vec<(usize, Result<Attributes>)>,
    ) {
        let mut start = 0;
        // Bounded: every turn takes at least one position.
        while start < positions.len() {
            let end = group_end(requests, positions, start);
            let group = &positions[start..end];
            start = end;
            let mut group_answers: Vec<Option<Result<Attributes>>> = group.iter().map(|_| None).collect();
            let made = self.with_space(|| self.create_group(requests, group, &mut group_answers));
            if let Err(error) = made {
                for answer in group_answers.iter_mut().filter(|answer| answer.is_none()) {
                    *answer = Some(Err(copy_error(&error)));
                }
            }
            for (position, answer) in group.iter().zip(group_answers) {
                answered.push((*position, answer.expect("every request of a group is answered")));
            }
        }
    }

    /// One attempt at a group: answers every request of `group` still unanswered in `answers`
    /// and returns `Some`, or `None` when the log or volume had no room (nothing was changed,
    /// every number taken is given back; `with_space` makes room and tries again).
    fn create_group(
        &self,
        requests: &[batch::CreateRequest<'_>],
        group: &[usize],
        answers: &mut [Option<Result<Attributes>>],
    ) -> Result<Option<()>> {
        let front = &self.inner.front;
        let mut parents: Vec<InodeNumber> = group.iter().map(|position| requests[*position].parent).collect();
        parents.sort_unstable();
        parents.dedup();
        let mut names = front.lock_names(&parents);
        let infos: Vec<Result<DirectoryInfo>> = parents
            .iter()
            .map(|parent| {
                let info = self.directory_info(*parent)?;
                if info.link_count == 0 {
                    return Err(Error::NotFound);
                }
                Ok(info)
            })
            .collect();
        let mut link_counts: Vec<u32> =
            infos.iter().map(|info| info.as_ref().map_or(0, |info| info.link_count)).collect();
        let mut made_names: crate::FastHashSet<(InodeNumber, &[u8])> = Default::default();
        let mut planned: Vec<Planned> = Vec::with_capacity(group.len());
        let give_back = |planned: &[Planned]| planned.iter().for_each(|plan| front.inode_numbers.free_now(plan.number));
        // The directory index decides the group's names when it is installed, the batch is as
        // long as it serves, and it reflects every change acknowledged before these shards were
        // taken (docs/BATCH.md, "Creates through the index").
        let index = self.batch_index().filter(|index| requests.len() >= index.min_batch().max(1));
        let mut claims = match &index {
            Some(index) => self.claim_group(index.as_ref(), requests, group, &parents, &infos, answers),
            None => None,
        };
        for (place_in_group, &position) in group.iter().enumerate() {
            if answers[place_in_group].is_some() {
                continue;
            }
            let request = &requests[position];
            let parent_place = parents.binary_search(&request.parent).expect("every parent is listed");
            let claim = claims.as_ref().and_then(|claims| claims.answers[place_in_group]);
            let decided = match (&infos[parent_place], claim) {
                (Err(error), _) => Some(Err(copy_error(error))),
                (Ok(_), Some(ClaimAnswer::Taken(child))) if !claims.as_ref().is_some_and(|c| c.is_own(child)) => {
                    Some(Err(Error::Exists))
                }
                (Ok(_), Some(ClaimAnswer::Claimed)) => {
                    too_many_links(request, link_counts[parent_place]).then_some(Err(Error::TooManyLinks))
                }
                (Ok(info), _) => self.decide_create(&mut names, info, request, &made_names, link_counts[parent_place]),
            };
            let claimed_number = claims.as_mut().and_then(|claims| claims.numbers[place_in_group]);
            if let Some(answer) = decided {
                answers[place_in_group] = Some(answer);
                // Its number goes back now; a claim of it is aborted by the settle below.
                if let Some(number) = claimed_number {
                    front.inode_numbers.free_now(number);
                }
                continue;
            }
            let directory = request.file_type == FileType::Directory;
            let number = match claimed_number {
                Some(number) => Ok(number),
                None => self.allocate_inode(request.parent, directory),
            };
            match number {
                Ok(number) => {
                    made_names.insert((request.parent, request.name));
                    link_counts[parent_place] += directory as u32;
                    planned.push(Planned { position: place_in_group, number, parent_place });
                }
                Err(error) => answers[place_in_group] = Some(Err(error)),
            }
        }
        let mut record_lsn = None;
        let made = match planned.is_empty() {
            true => Ok(Some(())),
            false => self.create_planned(
                requests,
                group,
                (&parents, &infos),
                &mut planned,
                &mut names,
                answers,
                &mut record_lsn,
            ),
        };
        if !matches!(made, Ok(Some(()))) {
            give_back(&planned);
        }
        if let (Some(index), Some(claims)) = (&index, &claims) {
            // Still under the name shards: the made creates' claims become their entries
            // (their record is in the log), every other claim goes. A failed settle has failed
            // the index's feed (it answers nothing any more); the creates stand either way.
            let logged = matches!(made, Ok(Some(()))).then_some(record_lsn).flatten();
            let every_create_claimed =
                planned.iter().all(|plan| claims.answers[plan.position] == Some(ClaimAnswer::Claimed));
            let record = logged.filter(|_| every_create_claimed);
            let _ = self.settle_group(index.as_ref(), requests, group, claims, answers, (logged.is_some(), record));
        }
        made
    }

    /// Takes inode numbers for the group's undecided requests in good parents and asks the
    /// index to claim their names. `None` (every number given back) when the index takes no
    /// part or fails (counted as an index failure; the front end decides then).
    fn claim_group(
        &self,
        index: &dyn BatchIndex,
        requests: &[batch::CreateRequest<'_>],
        group: &[usize],
        parents: &[InodeNumber],
        infos: &[Result<DirectoryInfo>],
        answers: &mut [Option<Result<Attributes>>],
    ) -> Option<GroupClaims> {
        let front = &self.inner.front;
        if !index.may_claim() {
            // The index is behind (the adapter counts the group declined): numbers are taken
            // only for claims that may happen.
            return None;
        }
        let mut numbers: Vec<Option<InodeNumber>> = vec![None; group.len()];
        let mut asked: Vec<IndexCreate<'_>> = Vec::with_capacity(group.len());
        let mut places: Vec<usize> = Vec::with_capacity(group.len());
        for (place_in_group, &position) in group.iter().enumerate() {
            let request = &requests[position];
            let parent_place = parents.binary_search(&request.parent).expect("every parent is listed");
            if answers[place_in_group].is_some() || infos[parent_place].is_err() {
                continue;
            }
            match self.allocate_inode(request.parent, request.file_type == FileType::Directory) {
                Ok(number) => {
                    numbers[place_in_group] = Some(number);
                    places.push(place_in_group);
                    asked.push(IndexCreate {
                        parent: request.parent,
                        name: request.name,
                        inode: number,
                        file_type: request.file_type,
                    });
                }
                Err(error) => answers[place_in_group] = Some(Err(error)),
            }
        }
        let give_back =
            |numbers: &[Option<InodeNumber>]| numbers.iter().flatten().for_each(|n| front.inode_numbers.free_now(*n));
        if asked.is_empty() {
            return None;
        }
        let said = match index.claim_creates(&asked) {
            Ok(Some(said)) if said.len() == asked.len() => said,
            Ok(None) => {
                give_back(&numbers);
                return None;
            }
            Ok(Some(_)) | Err(_) => {
                self.inner.batch.index_failures.fetch_add(1, Ordering::Relaxed);
                give_back(&numbers);
                return None;
            }
        };
        let mut claim_answers = vec![None; group.len()];
        for (place_in_group, answer) in places.into_iter().zip(said) {
            claim_answers[place_in_group] = Some(answer);
        }
        Some(GroupClaims { numbers, answers: claim_answers })
    }

    /// Commits the group's claims of creates it made (`logged`: their record is in the log;
    /// the answer holds the inode the claim is for) and aborts the others.
    fn settle_group(
        &self,
        index: &dyn BatchIndex,
        requests: &[batch::CreateRequest<'_>],
        group: &[usize],
        claims: &GroupClaims,
        answers: &[Option<Result<Attributes>>],
        (logged, record): (bool, Option<u64>),
    ) -> Result<()> {
        let mut settled: Vec<IndexCreate<'_>> = Vec::new();
        let mut made: Vec<Option<Attributes>> = Vec::new();
        for (place_in_group, &position) in group.iter().enumerate() {
            let (Some(ClaimAnswer::Claimed), Some(number)) =
                (claims.answers[place_in_group], claims.numbers[place_in_group])
            else {
                continue;
            };
            let request = &requests[position];
            settled.push(IndexCreate {
                parent: request.parent,
                name: request.name,
                inode: number,
                file_type: request.file_type,
            });
            made.push(match &answers[place_in_group] {
                Some(Ok(attributes)) if logged && attributes.inode == number => Some(attributes.clone()),
                _ => None,
            });
        }
        match settled.is_empty() {
            true => Ok(()),
            false => index.settle_creates(&settled, &made, record),
        }
    }

    /// Whether `request` is answered before anything is made: `Some(Err(Exists))` when its name
    /// is taken (on the volume, in the front end or by an earlier request of the group),
    /// `TooManyLinks` for a directory in a full parent, a lookup's own error; `None` to make it.
    fn decide_create(
        &self,
        names: &mut crate::fs::front::NameLocks<'_>,
        info: &DirectoryInfo,
        request: &batch::CreateRequest<'_>,
        made_names: &crate::FastHashSet<(InodeNumber, &[u8])>,
        link_count: u32,
    ) -> Option<Result<Attributes>> {
        if made_names.contains(&(request.parent, request.name)) {
            return Some(Err(Error::Exists));
        }
        match self.find_name(names.shard(request.parent), request.parent, info, request.name) {
            Ok(Some(_)) => return Some(Err(Error::Exists)),
            Ok(None) => {}
            Err(error) => return Some(Err(error)),
        }
        too_many_links(request, link_count).then_some(Err(Error::TooManyLinks))
    }

    /// Logs the planned creates of a group as one record and commits them to the front end,
    /// with the name shards of `parents` held; answers each planned request.
    #[allow(clippy::too_many_arguments)]
    fn create_planned(
        &self,
        requests: &[batch::CreateRequest<'_>],
        group: &[usize],
        (parents, infos): (&[InodeNumber], &[Result<DirectoryInfo>]),
        planned: &mut Vec<Planned>,
        names: &mut crate::fs::front::NameLocks<'_>,
        answers: &mut [Option<Result<Attributes>>],
        record_lsn: &mut Option<u64>,
    ) -> Result<Option<()>> {
        let front = &self.inner.front;
        let mut used_parents: Vec<InodeNumber> = planned.iter().map(|plan| parents[plan.parent_place]).collect();
        used_parents.sort_unstable();
        used_parents.dedup();
        let mut lock: Vec<InodeNumber> = used_parents.clone();
        lock.extend(planned.iter().map(|plan| plan.number));
        // Locked without `lock_views`' loading: a parent whose view cannot be loaded any more
        // (removed, and its view trimmed) fails its own requests below, not the group.
        let mut views = front.lock_views(&lock);
        // Each parent's image after all of the group's creates in it, and its place in the
        // record. A parent removed since it was checked (an rmdir needs only its own parent's
        // name shard) fails its own requests, as each single create in it would, and no other.
        let mut parent_images: Vec<AttributeImage> = Vec::with_capacity(used_parents.len());
        let mut gone: Vec<(InodeNumber, Error)> = Vec::new();
        for parent in &used_parents {
            let place = parents.binary_search(parent).expect("a used parent is a parent");
            let info = infos[place].as_ref().expect("creates are planned only in good parents");
            let loaded = self.load_view(views.shard(*parent), *parent).map(drop);
            match loaded.and_then(|()| FileSystem::locked_directory(&mut views, *parent, info)) {
                Ok(view) => parent_images.push(view.attributes.clone()),
                Err(error) => gone.push((*parent, error)),
            }
        }
        if !gone.is_empty() {
            planned.retain(|plan| {
                let parent = parents[plan.parent_place];
                let Some((_, error)) = gone.iter().find(|(gone_parent, _)| *gone_parent == parent) else {
                    return true;
                };
                answers[plan.position] = Some(Err(copy_error(error)));
                front.inode_numbers.free_now(plan.number);
                false
            });
            used_parents.retain(|parent| gone.iter().all(|(gone_parent, _)| gone_parent != parent));
            if planned.is_empty() {
                return Ok(Some(()));
            }
        }
        let now = now_ns();
        let mut creates: Vec<BatchCreate> = Vec::with_capacity(planned.len());
        for plan in planned.iter() {
            let request = &requests[group[plan.position]];
            let record_parent = used_parents.binary_search(&request.parent).expect("a used parent");
            let parent_image = &mut parent_images[record_parent];
            let directory = request.file_type == FileType::Directory;
            if directory && parent_image.link_count >= LINK_MAX {
                // Counted under the name shard already; the view can only agree.
                return Err(Error::TooManyLinks);
            }
            let image = new_inode_image(
                request,
                plan.number,
                parent_image,
                front.next_generation.fetch_add(1, Ordering::AcqRel),
                now,
            );
            parent_image.modify_time_ns = now;
            parent_image.change_time_ns = now;
            parent_image.link_count += directory as u32;
            creates.push(BatchCreate { parent: record_parent as u32, name: request.name.to_vec(), inode: image });
        }
        let (new_blocks, image_blocks) = create_batch_bounds(&parent_images, &creates);
        let op = Op::CreateBatch { parents: parent_images, creates };
        let Some(lsn) = self.append_pledging(op.clone(), new_blocks, image_blocks)? else {
            return Ok(None);
        };
        *record_lsn = Some(lsn);
        let Op::CreateBatch { parents: parent_images, creates } = op else { unreachable!("built above") };
        for (parent, image) in used_parents.iter().zip(parent_images) {
            let made_here = creates.iter().filter(|create| used_parents[create.parent as usize] == *parent).count();
            let view = views.get(*parent);
            FileSystem::commit_view(view, image, lsn, true);
            view.entry_count += made_here as u64;
        }
        for (plan, create) in planned.iter().zip(creates) {
            let file_type = create.inode.file_type();
            let number = plan.number;
            let mut view = InodeView::new(create.inode, 0, 0);
            view.last_change_lsn = lsn;
            view.structural_lsn = lsn;
            view.last_use.store(front.tick(), Ordering::Relaxed);
            if file_type == FileType::Directory {
                // Made empty now: every name it will have goes through its name shard.
                view.complete_epoch = front.name_epoch(number);
            }
            answers[plan.position] = Some(Ok(view.to_attributes()));
            views.shard(number).views.insert(number, view);
            let parent = used_parents[create.parent as usize];
            self.overlay_name(names.shard(parent), parent, &create.name, Some((number, file_type)), lsn);
        }
        // Every shard that gained or changed a view is trimmed once, as a single create trims
        // its parent's and its new inode's. The views this group committed are newer than the
        // applied lsn, so no trim takes them; the parents are kept as a single create keeps
        // its own (a short list: `trim` looks each candidate up in it).
        let applied = self.applied();
        let mut shards: Vec<(usize, InodeNumber)> =
            lock.iter().map(|number| (crate::fs::front::Front::view_shard_index(*number), *number)).collect();
        shards.sort_unstable();
        shards.dedup_by_key(|(shard, _)| *shard);
        for (_, number) in shards {
            views.shard(number).trim(applied, &used_parents);
        }
        Ok(Some(()))
    }
}

/// Whether `request` makes a directory in a parent of `link_count` links that has room for
/// no more.
fn too_many_links(request: &batch::CreateRequest<'_>, link_count: u32) -> bool {
    request.file_type == FileType::Directory && link_count >= LINK_MAX
}

impl FileSystem {
    /// `make_directory_all` of every path, level by level: the paths' next components are
    /// looked up on all cores, the missing directories of the level (each (parent, name) once)
    /// made by one `create_batch_logged`, and a name another caller made first is looked up
    /// again, as `make_directory_all` does. Bounded by the longest path's component count.
    pub(super) fn make_directory_all_logged(
        &self,
        paths: &[&[u8]],
        permissions: u32,
        uid: u32,
        gid: u32,
    ) -> Vec<Result<Attributes>> {
        let components: Vec<Vec<&[u8]>> = paths
            .iter()
            .map(|path| path.split(|byte| *byte == b'/').filter(|part| !part.is_empty() && *part != b".").collect())
            .collect();
        let root = self.get_attributes(ROOT_INODE);
        let mut current: Vec<Result<Attributes>> = paths
            .iter()
            .map(|_| match &root {
                Ok(root) => Ok(root.clone()),
                Err(error) => Err(copy_error(error)),
            })
            .collect();
        let depth_max = components.iter().map(Vec::len).max().unwrap_or(0);
        for depth in 0..depth_max {
            let live: Vec<usize> = (0..paths.len())
                .filter(|position| current[*position].is_ok() && depth < components[*position].len())
                .collect();
            let parent_of = |position: usize| current[position].as_ref().expect("a live path").inode;
            let found =
                batch::map_parallel(&live, |position| self.lookup(parent_of(*position), components[*position][depth]));
            let mut missing: Vec<usize> = Vec::new();
            let mut next: Vec<(usize, Result<Attributes>)> = Vec::with_capacity(live.len());
            for (position, answer) in live.iter().copied().zip(found) {
                match answer {
                    Ok(attributes) if attributes.file_type == FileType::Directory => {
                        next.push((position, Ok(attributes)))
                    }
                    Ok(_) => next.push((position, Err(Error::NotDirectory))),
                    Err(Error::NotFound) => missing.push(position),
                    Err(error) => next.push((position, Err(error))),
                }
            }
            let mut keys: crate::FastHashMap<(InodeNumber, &[u8]), usize> = Default::default();
            let mut requests: Vec<batch::CreateRequest<'_>> = Vec::new();
            for &position in &missing {
                let (parent, name) = (parent_of(position), components[position][depth]);
                keys.entry((parent, name)).or_insert_with(|| {
                    requests.push(batch::CreateRequest {
                        parent,
                        name,
                        file_type: FileType::Directory,
                        permissions,
                        uid,
                        gid,
                        rdev: 0,
                    });
                    requests.len() - 1
                });
            }
            let made = self.create_batch_logged(&requests);
            for &position in &missing {
                let (parent, name) = (parent_of(position), components[position][depth]);
                let answer = match &made[keys[&(parent, name)]] {
                    Ok(attributes) => Ok(attributes.clone()),
                    // Another caller made it first.
                    Err(Error::Exists) => self.lookup(parent, name),
                    Err(error) => Err(copy_error(error)),
                };
                next.push((position, answer));
            }
            for (position, answer) in next {
                current[position] = answer;
            }
        }
        current
    }
}

/// Where the group starting at `positions[start]` ends: after `CREATE_BATCH_RECORD_MAX`
/// requests, or `DIRECTORIES_PER_RECORD_MAX` directories. A new directory costs its record a
/// first leaf and, since new directories are spread over the allocation groups, an inode-table
/// and a generation-table block of its own: 512 of them would pledge about 1,500 checkpoint
/// images, more than the smallest log (4 MiB) admits for one record, which then waited for room
/// that never came and answered `NoSpace` (`create_batches_fit_the_smallest_log`).
fn group_end(requests: &[batch::CreateRequest<'_>], positions: &[usize], start: usize) -> usize {
    let mut directories = 0;
    let mut end = start;
    while end < positions.len() && end - start < CREATE_BATCH_RECORD_MAX {
        let directory = requests[positions[end]].file_type == FileType::Directory;
        if directory && directories == DIRECTORIES_PER_RECORD_MAX {
            break;
        }
        directories += directory as usize;
        end += 1;
    }
    end
}

/// The answer of a request that needs no lock: the single `create`'s argument checks.
fn check_request(request: &batch::CreateRequest<'_>) -> Option<Result<Attributes>> {
    // In `create`'s order: the type, then (`create_node`) the name, then the mode.
    if request.file_type == FileType::Symlink {
        return Some(Err(Error::invalid("use symlink to create a symbolic link")));
    }
    if let Err(error) = check_name(request.name) {
        return Some(Err(error));
    }
    if request.permissions & !0o7777 != 0 {
        return Some(Err(Error::invalid(format!("mode {:#o} has bits beyond 0o7777", request.permissions))));
    }
    None
}

/// The new inode's image, as `create_locked` makes it: a set-group-ID parent passes its group
/// on, and its set-group-ID bit to subdirectories; only devices keep a device number.
fn new_inode_image(
    request: &batch::CreateRequest<'_>,
    number: InodeNumber,
    parent_image: &AttributeImage,
    generation: u64,
    now: i64,
) -> AttributeImage {
    let file_type = request.file_type;
    let directory = file_type == FileType::Directory;
    let mut mode = file_type.mode_bits() | request.permissions;
    let mut gid = request.gid;
    if parent_image.mode & 0o2000 != 0 {
        gid = parent_image.gid;
        if directory {
            mode |= 0o2000;
        }
    }
    let rdev = if matches!(file_type, FileType::CharDevice | FileType::BlockDevice) { request.rdev } else { 0 };
    AttributeImage {
        inode_number: number,
        generation,
        mode,
        link_count: if directory { 2 } else { 1 },
        uid: request.uid,
        gid,
        size_bytes: 0,
        access_time_ns: now,
        modify_time_ns: now,
        change_time_ns: now,
        birth_time_ns: now,
        rdev,
        parent: if directory { parent_image.inode_number } else { 0 },
        flags: 0,
    }
}

/// (new blocks, checkpoint image blocks) a create batch record may need: per parent, leaves for
/// its new names (a leaf holds at least half a block of names), an index block and a spare; a
/// first leaf per new directory; the distinct inode-table blocks of the new inodes, their
/// generation-table blocks, and bitmap blocks (inodes and blocks). Counted from the record
/// itself, so a group of 512 creates in one directory pledges tens of images, not the
/// 3,584 that 512 single creates would.
fn create_batch_bounds(parents: &[AttributeImage], creates: &[BatchCreate]) -> (u64, u64) {
    let mut name_bytes = vec![0u64; parents.len()];
    let mut directories = 0u64;
    for create in creates {
        name_bytes[create.parent as usize] += create.name.len() as u64 + ENTRY_OVERHEAD_BYTES;
        directories += (create.inode.file_type() == FileType::Directory) as u64;
    }
    let tree_blocks: u64 = name_bytes.iter().map(|bytes| bytes.div_ceil(LEAF_NAME_BYTES_MIN) + 2).sum();
    let new_blocks = tree_blocks + directories;
    let mut table_blocks: Vec<u64> =
        creates.iter().map(|create| create.inode.inode_number / INODES_PER_TABLE_BLOCK).collect();
    table_blocks.sort_unstable();
    table_blocks.dedup();
    let mut generation_blocks: Vec<u64> =
        creates.iter().map(|create| create.inode.inode_number / GENERATIONS_PER_TABLE_BLOCK).collect();
    generation_blocks.sort_unstable();
    generation_blocks.dedup();
    let bitmap_blocks = 2 * (creates.len() as u64).div_ceil(BITS_PER_BITMAP_BLOCK) + 2;
    let image_blocks = new_blocks
        + parents.len() as u64
        + table_blocks.len() as u64
        + generation_blocks.len() as u64
        + bitmap_blocks
        + IMAGE_BLOCKS_PER_RECORD;
    (new_blocks, image_blocks)
}

/// The same error again, for each request of a group that failed whole (errors are not `Clone`:
/// an I/O error's source is re-made from its kind and words).
fn copy_error(error: &Error) -> Error {
    match error {
        Error::Io { operation, offset, source } => {
            Error::Io { operation, offset: *offset, source: std::io::Error::new(source.kind(), source.to_string()) }
        }
        Error::Corruption { what } => Error::corruption(what.clone()),
        Error::NotFound => Error::NotFound,
        Error::Exists => Error::Exists,
        Error::NotDirectory => Error::NotDirectory,
        Error::IsDirectory => Error::IsDirectory,
        Error::NotEmpty => Error::NotEmpty,
        Error::NameTooLong => Error::NameTooLong,
        Error::NoSpace => Error::NoSpace,
        Error::InvalidArgument(what) => Error::InvalidArgument(what.clone()),
        Error::TooManyLinks => Error::TooManyLinks,
        Error::FileTooLarge => Error::FileTooLarge,
        Error::NoData => Error::NoData,
        Error::Range => Error::Range,
        Error::Loop => Error::Loop,
        Error::ReadOnly => Error::ReadOnly,
        Error::NotPermitted => Error::NotPermitted,
        Error::Busy => Error::Busy,
        Error::InUse(what) => Error::InUse(what.clone()),
        Error::Key(what) => Error::Key(what.clone()),
        Error::NotSupported => Error::NotSupported,
        Error::Shutdown => Error::Shutdown,
    }
}
