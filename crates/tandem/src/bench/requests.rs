//! `tandem bench mount`'s count of the FUSE requests behind one create, stat, rename, unlink,
//! mkdir, rmdir and durable small append: the
//! kernel round trips are what a metadata operation through the mount costs beyond the engine
//! (docs/FUSE.md, "Where a create's time goes"), so the run says how many it paid.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::fuse_api::{BackgroundMount, RequestCounts};

/// Operations of each kind the probe runs: enough that one stray request (the
/// directory's own) shows as 0.00x per operation.
const PROBE_FILES: usize = 1000;

/// RELEASE and FORGET reach the server after the system call that caused them returned: the
/// counters are read once they have not moved for this long...
const SETTLE_QUIET: Duration = Duration::from_millis(50);
/// ...or after this long at most.
const SETTLE_LIMIT: Duration = Duration::from_secs(2);

/// The requests per operation of each probe phase, in the order they ran.
pub struct RequestsPerOperation {
    pub phases: Vec<(&'static str, RequestCounts)>,
    pub files: usize,
}

/// An open descriptor, closed when dropped.
struct DirectoryDescriptor(libc::c_int);

impl Drop for DirectoryDescriptor {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

fn last_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Reads the counters once no request arrived for `SETTLE_QUIET`.
fn settled_counts(mount: &BackgroundMount) -> RequestCounts {
    let started = Instant::now();
    let mut last = mount.request_counts();
    while started.elapsed() < SETTLE_LIMIT {
        std::thread::sleep(SETTLE_QUIET);
        let now = mount.request_counts();
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// Turns a failed system call's result into the error text.
fn checked(result: libc::c_int, what: &str) -> Result<libc::c_int, String> {
    if result < 0 {
        Err(last_error(what))
    } else {
        Ok(result)
    }
}

/// Bytes of each probe append: the workload's small durable append.
const PROBE_APPEND_BYTES: usize = 256;

/// Runs `operation` on every name and returns the requests the loop cost, read once the
/// counters settled.
fn phase(
    mount: &BackgroundMount,
    names: &[CString],
    mut operation: impl FnMut(&CString) -> Result<(), String>,
) -> Result<RequestCounts, String> {
    let before = settled_counts(mount);
    names.iter().try_for_each(&mut operation)?;
    Ok(settled_counts(mount).since(&before))
}

/// Creates (`openat(O_CREAT|O_EXCL)` + `close`), stats (`fstatat`), renames (`renameat` within
/// the directory), unlinks (`unlinkat`), makes and removes directories (`mkdirat`,
/// `unlinkat(AT_REMOVEDIR)`) and appends 256 bytes durably (`write` + `fsync` on an open
/// `O_APPEND` descriptor) `PROBE_FILES` times in a fresh directory under `root`, the same
/// system calls as the workload's, and returns the requests each phase cost.
pub fn probe(root: &Path, mount: &BackgroundMount) -> Result<RequestsPerOperation, String> {
    let directory = root.join("requests-probe");
    std::fs::create_dir(&directory).map_err(|error| format!("cannot create {}: {error}", directory.display()))?;
    let path = CString::new(directory.as_os_str().as_bytes()).map_err(|_| "path contains NUL".to_string())?;
    // SAFETY: a NUL-terminated path; the result is checked.
    let descriptor = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    let descriptor = DirectoryDescriptor(checked(descriptor, "open the probe directory")?);
    let at = descriptor.0;
    let names = super::workload::file_names(PROBE_FILES);
    let renamed: Vec<CString> =
        names.iter().map(|name| CString::new(format!("r{}", name.to_string_lossy())).expect("no NUL")).collect();
    let mut phases = Vec::new();

    // SAFETY (every call below): a directory descriptor and NUL-terminated names that live
    // across the call; results are checked.
    phases.push((
        "create",
        phase(mount, &names, |name| {
            let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC;
            let file = checked(unsafe { libc::openat(at, name.as_ptr(), flags, 0o644) }, "probe create")?;
            unsafe { libc::close(file) };
            Ok(())
        })?,
    ));
    phases.push((
        "stat",
        phase(mount, &names, |name| {
            let mut status = unsafe { std::mem::zeroed::<libc::stat>() };
            checked(unsafe { libc::fstatat(at, name.as_ptr(), &mut status, 0) }, "probe stat").map(drop)
        })?,
    ));
    let mut pairs = names.iter().zip(&renamed);
    phases.push((
        "rename",
        phase(mount, &names, |_| {
            let (from, to) = pairs.next().expect("one pair per name");
            checked(unsafe { libc::renameat(at, from.as_ptr(), at, to.as_ptr()) }, "probe rename").map(drop)
        })?,
    ));
    phases.push((
        "unlink",
        phase(mount, &renamed, |name| {
            checked(unsafe { libc::unlinkat(at, name.as_ptr(), 0) }, "probe unlink").map(drop)
        })?,
    ));
    phases.push((
        "mkdir",
        phase(mount, &names, |name| {
            checked(unsafe { libc::mkdirat(at, name.as_ptr(), 0o755) }, "probe mkdir").map(drop)
        })?,
    ));
    phases.push((
        "rmdir",
        phase(mount, &names, |name| {
            checked(unsafe { libc::unlinkat(at, name.as_ptr(), libc::AT_REMOVEDIR) }, "probe rmdir").map(drop)
        })?,
    ));
    let append_name = c"append";
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC;
    let file = DirectoryDescriptor(checked(
        unsafe { libc::openat(at, append_name.as_ptr(), flags, 0o644) },
        "probe append file",
    )?);
    let data = [0x5au8; PROBE_APPEND_BYTES];
    phases.push((
        "append 256 B + fsync",
        phase(mount, &names, |_| {
            let written = unsafe { libc::write(file.0, data.as_ptr().cast(), data.len()) };
            if written != data.len() as isize {
                return Err(last_error("probe append"));
            }
            checked(unsafe { libc::fsync(file.0) }, "probe fsync").map(drop)
        })?,
    ));
    drop(file);
    checked(unsafe { libc::unlinkat(at, append_name.as_ptr(), 0) }, "remove the probe append file")?;

    drop(descriptor);
    std::fs::remove_dir(&directory).map_err(|error| format!("cannot remove {}: {error}", directory.display()))?;
    Ok(RequestsPerOperation { phases, files: PROBE_FILES })
}

/// One line per phase: "create: 4.00 (LOOKUP 1.00, GETATTR 1.00, ...)".
pub fn describe(requests: &RequestsPerOperation) -> Vec<String> {
    let files = requests.files as f64;
    requests
        .phases
        .iter()
        .map(|(phase, counts)| {
            let kinds: Vec<String> =
                counts.nonzero().map(|(kind, count)| format!("{} {:.2}", kind.name(), count as f64 / files)).collect();
            format!(
                "{phase}: {:.2}{}",
                counts.total() as f64 / files,
                if kinds.is_empty() { String::new() } else { format!(" ({})", kinds.join(", ")) }
            )
        })
        .collect()
}
