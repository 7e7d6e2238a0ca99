//! `tandem bench mount`'s count of the FUSE requests behind one create, stat and unlink: the
//! kernel round trips are what a metadata operation through the mount costs beyond the engine
//! (docs/FUSE.md, "Where a create's time goes"), so the run says how many it paid.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::fuse_api::{BackgroundMount, RequestCounts};

/// Files created, looked up and removed by the probe: enough that one stray request (the
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

/// An open directory, closed when dropped.
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

/// Creates (`openat(O_CREAT|O_EXCL)` + `close`), stats (`fstatat`) and unlinks (`unlinkat`)
/// `PROBE_FILES` files in a fresh directory under `root`, the same system calls as the
/// workload's, and returns the requests each phase cost.
pub fn probe(root: &Path, mount: &BackgroundMount) -> Result<RequestsPerOperation, String> {
    let directory = root.join("requests-probe");
    std::fs::create_dir(&directory).map_err(|error| format!("cannot create {}: {error}", directory.display()))?;
    let path = CString::new(directory.as_os_str().as_bytes()).map_err(|_| "path contains NUL".to_string())?;
    // SAFETY: a NUL-terminated path; the result is checked.
    let descriptor = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if descriptor < 0 {
        return Err(last_error("open the probe directory"));
    }
    let descriptor = DirectoryDescriptor(descriptor);
    let names = super::workload::file_names(PROBE_FILES);
    let mut phases = Vec::new();

    let before = settled_counts(mount);
    for name in &names {
        // SAFETY: a directory descriptor and a NUL-terminated name; results are checked.
        let file = unsafe {
            libc::openat(
                descriptor.0,
                name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        if file < 0 {
            return Err(last_error("probe create"));
        }
        // SAFETY: closes the descriptor just opened.
        unsafe { libc::close(file) };
    }
    let after = settled_counts(mount);
    phases.push(("create", after.since(&before)));

    let before = after;
    for name in &names {
        // SAFETY: as above; `status` is written by the call.
        let mut status = unsafe { std::mem::zeroed::<libc::stat>() };
        if unsafe { libc::fstatat(descriptor.0, name.as_ptr(), &mut status, 0) } != 0 {
            return Err(last_error("probe stat"));
        }
    }
    let after = settled_counts(mount);
    phases.push(("stat", after.since(&before)));

    let before = after;
    for name in &names {
        // SAFETY: as above.
        if unsafe { libc::unlinkat(descriptor.0, name.as_ptr(), 0) } != 0 {
            return Err(last_error("probe unlink"));
        }
    }
    let after = settled_counts(mount);
    phases.push(("unlink", after.since(&before)));

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
