//! The permission rules that FUSE leaves to the server.
//!
//! With the `default_permissions` mount option (the default) the kernel checks mode bits,
//! sticky directories and ownership before a request reaches the adapter. What it cannot know
//! is stored nowhere but here: which attribute changes the server itself accepts. So
//! [`check_attribute_change`] always runs, and [`allows`] runs only when the mount was made
//! without `default_permissions`, where the adapter is the only line of defence.

use tandemfs::fs::{Attributes, FileType, SetAttributes, TimeToSet};

pub(crate) const READ: u32 = 4;
pub(crate) const WRITE: u32 = 2;
pub(crate) const EXECUTE: u32 = 1;

const SET_USER_ID: u32 = 0o4000;
const SET_GROUP_ID: u32 = 0o2000;

/// Who sent a request, as the kernel reported it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub thread_id: u32,
}

impl Caller {
    pub(crate) fn of(request: &fuser::Request) -> Caller {
        Caller { uid: request.uid(), gid: request.gid(), thread_id: request.pid() }
    }

    pub(crate) fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the caller belongs to `gid`. FUSE reports only the caller's file-system group,
    /// so the supplementary groups come from `/proc/<tid>/status`.
    pub(crate) fn is_member_of(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        supplementary_groups(self.thread_id).contains(&gid)
    }
}

fn supplementary_groups(thread_id: u32) -> Vec<u32> {
    if thread_id == 0 {
        return Vec::new();
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{thread_id}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .map(|groups| groups.split_whitespace().filter_map(|group| group.parse().ok()).collect())
        .unwrap_or_default()
}

/// Whether the mode bits of `attributes` grant `caller` every access in `mask` (a sum of
/// READ, WRITE, EXECUTE), following the owner / group / other classes like the kernel does.
/// Root may do anything except execute a non-directory that has no execute bit at all.
pub(crate) fn allows(caller: &Caller, attributes: &Attributes, mask: u32) -> bool {
    let permissions = attributes.permissions;
    if caller.is_root() {
        let executable = attributes.file_type == FileType::Directory || permissions & 0o111 != 0;
        return mask & EXECUTE == 0 || executable;
    }
    let class_bits = if caller.uid == attributes.uid {
        (permissions >> 6) & 7
    } else if caller.is_member_of(attributes.gid) {
        (permissions >> 3) & 7
    } else {
        permissions & 7
    };
    class_bits & mask == mask
}

/// Whether `caller` may remove or rename `victim` out of `directory` once it has write and
/// search access to the directory: in a sticky directory only the owner of the entry, the
/// owner of the directory, or root may.
pub(crate) fn sticky_allows(caller: &Caller, directory: &Attributes, victim: &Attributes) -> bool {
    directory.permissions & 0o1000 == 0 || caller.is_root() || caller.uid == victim.uid || caller.uid == directory.uid
}

/// Checks a `setattr` against the rules Linux applies in the VFS, and adjusts it where Linux
/// adjusts silently. `holds_writable_handle` is true when the change came through a file
/// handle opened for writing (ftruncate). `check_access_bits` is false when the kernel has
/// already checked mode bits (`default_permissions`).
///
/// Returns the errno to answer, or Ok with the (possibly adjusted) changes.
pub(crate) fn check_attribute_change(
    caller: &Caller,
    current: &Attributes,
    mut changes: SetAttributes,
    holds_writable_handle: bool,
    check_access_bits: bool,
) -> Result<SetAttributes, i32> {
    let is_owner = caller.uid == current.uid;
    let privileged = caller.is_root();

    // chown: only root gives a file away; the owner may move it to a group it belongs to.
    if let Some(uid) = changes.uid {
        if uid != current.uid && !privileged {
            return Err(libc::EPERM);
        }
    }
    if let Some(gid) = changes.gid {
        if gid != current.gid && !privileged && !(is_owner && caller.is_member_of(gid)) {
            return Err(libc::EPERM);
        }
    }

    if let Some(permissions) = changes.permissions {
        let permissions = permissions & 0o7777;
        // The kernel clears set-user-ID / set-group-ID itself when somebody other than the
        // owner writes to or truncates a file (we do not negotiate FUSE_HANDLE_KILLPRIV), and
        // sends that as a mode change in the writer's name. Such a change only removes those
        // two bits, so it is allowed whoever asks.
        let only_drops_privilege_bits = permissions & !current.permissions == 0
            && (permissions ^ current.permissions) & !(SET_USER_ID | SET_GROUP_ID) == 0;
        if !privileged && !is_owner && !only_drops_privilege_bits {
            return Err(libc::EPERM);
        }
        let group_after = changes.gid.unwrap_or(current.gid);
        let adjusted = if !privileged && permissions & SET_GROUP_ID != 0 && !caller.is_member_of(group_after) {
            permissions & !SET_GROUP_ID
        } else {
            permissions
        };
        changes.permissions = Some(adjusted);
    }

    if check_access_bits {
        if changes.size_bytes.is_some() && !holds_writable_handle && !allows(caller, current, WRITE) {
            return Err(libc::EACCES);
        }
        for time in [changes.access_time, changes.modify_time].into_iter().flatten() {
            match time {
                TimeToSet::Nanoseconds(_) if !privileged && !is_owner => return Err(libc::EPERM),
                TimeToSet::Now
                    if !privileged && !is_owner && !holds_writable_handle && !allows(caller, current, WRITE) =>
                {
                    return Err(libc::EACCES)
                }
                _ => {}
            }
        }
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(uid: u32, gid: u32, permissions: u32) -> Attributes {
        Attributes {
            inode: 5,
            generation: 1,
            file_type: FileType::Regular,
            permissions,
            link_count: 1,
            uid,
            gid,
            size_bytes: 0,
            blocks_512: 0,
            access_time_ns: 0,
            modify_time_ns: 0,
            change_time_ns: 0,
            birth_time_ns: 0,
            rdev: 0,
        }
    }

    fn caller(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, thread_id: 0 }
    }

    #[test]
    fn chown_to_another_user_needs_root() {
        let current = file(1000, 1000, 0o644);
        let change = SetAttributes { uid: Some(0), ..Default::default() };
        assert_eq!(
            check_attribute_change(&caller(1000, 1000), &current, change.clone(), false, false),
            Err(libc::EPERM)
        );
        assert!(check_attribute_change(&caller(0, 0), &current, change, false, false).is_ok());
    }

    #[test]
    fn owner_may_change_group_to_own_group_only() {
        let current = file(1000, 1000, 0o644);
        let own = SetAttributes { gid: Some(1000), ..Default::default() };
        let foreign = SetAttributes { gid: Some(5), ..Default::default() };
        assert!(check_attribute_change(&caller(1000, 1000), &current, own, false, false).is_ok());
        assert_eq!(check_attribute_change(&caller(1000, 1000), &current, foreign, false, false), Err(libc::EPERM));
    }

    #[test]
    fn chmod_needs_owner_but_privilege_drop_is_allowed() {
        let current = file(1000, 1000, 0o6755);
        let chmod = SetAttributes { permissions: Some(0o777), ..Default::default() };
        assert_eq!(check_attribute_change(&caller(2000, 2000), &current, chmod, false, false), Err(libc::EPERM));
        let drop = SetAttributes { permissions: Some(0o755), ..Default::default() };
        assert!(check_attribute_change(&caller(2000, 2000), &current, drop, false, false).is_ok());
    }

    #[test]
    fn set_group_id_is_cleared_for_non_members() {
        let current = file(1000, 50, 0o755);
        let change = SetAttributes { permissions: Some(0o2755), ..Default::default() };
        let adjusted = check_attribute_change(&caller(1000, 1000), &current, change, false, false).unwrap();
        assert_eq!(adjusted.permissions, Some(0o755));
    }

    #[test]
    fn mode_bits_follow_owner_group_other_classes() {
        let attributes = file(1000, 50, 0o640);
        assert!(allows(&caller(1000, 1), &attributes, READ | WRITE));
        assert!(allows(&caller(7, 50), &attributes, READ));
        assert!(!allows(&caller(7, 50), &attributes, WRITE));
        assert!(!allows(&caller(7, 8), &attributes, READ));
        assert!(allows(&caller(0, 0), &attributes, READ | WRITE));
        assert!(!allows(&caller(0, 0), &attributes, EXECUTE));
    }
}
