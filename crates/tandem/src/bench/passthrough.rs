//! libfuse's `passthrough_ll` example over the ext4 volume: a FUSE file system that does nothing
//! but forward to ext4. Beside tandemfs's FUSE numbers it separates what FUSE itself costs from
//! what tandemfs costs. Debian ships the example's source in `libfuse3-dev`, not a binary, so it
//! is built here with the C compiler when the package and `gcc` are installed.

use crate::mountinfo;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const EXAMPLE_SOURCE: &str = "/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c";

pub struct Passthrough {
    child: Option<Child>,
    mountpoint: PathBuf,
    build_directory: PathBuf,
    mounted: bool,
}

/// Descriptors passthrough_ll needs beside one per file: its own, the directories, slack.
const DESCRIPTORS_BESIDE_FILES: u64 = 1024;

/// How many files per round passthrough_ll can be measured with, from the open-file limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileAllowance {
    /// Files per round: the requested count, or less where the limit does not allow it.
    pub files: u64,
    /// Why `files` is below the requested count, when it is.
    pub reduced_because: Option<String>,
}

impl Passthrough {
    /// Why the passthrough cannot be measured here, if it cannot.
    pub fn unavailable_reason() -> Option<String> {
        if !Path::new(EXAMPLE_SOURCE).is_file() {
            return Some(format!("{EXAMPLE_SOURCE} is missing (apt-get install libfuse3-dev)"));
        }
        let compiler = Command::new("gcc").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if !compiler.is_ok_and(|status| status.success()) {
            return Some("gcc is not installed (apt-get install gcc)".into());
        }
        let flags = Command::new("pkg-config").args(["--exists", "fuse3"]).status();
        if !flags.is_ok_and(|status| status.success()) {
            return Some("pkg-config cannot find fuse3 (apt-get install pkg-config libfuse3-dev)".into());
        }
        None
    }

    /// passthrough_ll keeps a descriptor open for every file the kernel knows, so a round of
    /// `files` files needs an open-file limit above that. Raises the limit as far as this
    /// process may and returns how many files per round fit under it (a multiple of 100, so
    /// the tree of 100 directories stays even), or an error when not even 100 fit.
    pub fn file_allowance(files: u64) -> Result<FileAllowance, String> {
        let (limit, hard_refused) = raise_open_file_limit(files + DESCRIPTORS_BESIDE_FILES);
        if limit >= files + DESCRIPTORS_BESIDE_FILES {
            return Ok(FileAllowance { files, reduced_because: None });
        }
        let fitting = limit.saturating_sub(DESCRIPTORS_BESIDE_FILES) / 100 * 100;
        let why = format!(
            "it keeps a descriptor open per file, and the open-file limit here is {limit}{}",
            if hard_refused {
                " (a hard limit that only CAP_SYS_RESOURCE may raise, which this process lacks)"
            } else {
                ""
            }
        );
        if fitting < 100 {
            return Err(why);
        }
        Ok(FileAllowance { files: fitting, reduced_because: Some(why) })
    }

    /// Builds the example and mounts it on a fresh directory, forwarding to `source_directory`.
    pub fn start(source_directory: &Path) -> Result<Passthrough, String> {
        let process_id = std::process::id();
        let build_directory = std::env::temp_dir().join(format!("tandem-bench-passthrough-build-{process_id}"));
        let mountpoint = std::env::temp_dir().join(format!("tandem-bench-passthrough-{process_id}"));
        std::fs::create_dir_all(&build_directory)
            .map_err(|error| format!("cannot create {}: {error}", build_directory.display()))?;
        let mut passthrough =
            Passthrough { child: None, mountpoint: mountpoint.clone(), build_directory, mounted: false };
        let binary = passthrough.build_directory.join("passthrough_ll");
        let flags = Command::new("pkg-config")
            .args(["--cflags", "--libs", "fuse3"])
            .output()
            .map_err(|error| format!("cannot run pkg-config: {error}"))?;
        let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
        let built = Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&binary)
            .arg(EXAMPLE_SOURCE)
            .args(flags.split_whitespace())
            .output()
            .map_err(|error| format!("cannot run gcc: {error}"))?;
        if !built.status.success() {
            let message = String::from_utf8_lossy(&built.stderr);
            return Err(format!("building passthrough_ll failed: {}", message.lines().next().unwrap_or("")));
        }
        std::fs::create_dir_all(&mountpoint)
            .map_err(|error| format!("cannot create {}: {error}", mountpoint.display()))?;
        let mounts_before = mountinfo::fuse_mounts_at(&mountpoint);
        let child = Command::new(&binary)
            .arg("-f")
            .arg("-o")
            .arg(format!("source={}", source_directory.display()))
            .arg(&mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| format!("cannot start passthrough_ll: {error}"))?;
        passthrough.child = Some(child);
        let started = Instant::now();
        loop {
            if mountinfo::fuse_mounts_at(&mountpoint) > mounts_before {
                passthrough.mounted = true;
                return Ok(passthrough);
            }
            if let Some(child) = passthrough.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut message = String::new();
                    if let Some(mut stderr) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut stderr, &mut message);
                    }
                    return Err(format!("passthrough_ll exited ({status}): {}", message.lines().next().unwrap_or("")));
                }
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err("passthrough_ll did not mount within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
}

impl Drop for Passthrough {
    fn drop(&mut self) {
        if self.mounted {
            let path = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes()).expect("no zero byte");
            // SAFETY: umount2 reads the NUL-terminated path only. Lazily, so an open file in a
            // failed workload cannot leave the mount behind.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
        if let Some(mut child) = self.child.take() {
            let started = Instant::now();
            while !matches!(child.try_wait(), Ok(Some(_))) {
                if started.elapsed() > Duration::from_secs(5) {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir(&self.mountpoint);
        let _ = std::fs::remove_dir_all(&self.build_directory);
    }
}

/// The most descriptors the kernel lets any process have (`fs.nr_open`), 1 Mi where unreadable.
fn open_file_ceiling() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20)
}

/// Raises this process's open-file limit (inherited by passthrough_ll) to at least `wanted`
/// where it may: the hard limit too when the process holds CAP_SYS_RESOURCE (up to
/// `fs.nr_open`), otherwise the soft limit up to the hard one. Returns the soft limit now in
/// force and whether raising the hard limit was refused.
fn raise_open_file_limit(wanted: u64) -> (u64, bool) {
    let wanted = wanted.min(open_file_ceiling());
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    let mut hard_refused = false;
    // SAFETY: getrlimit and setrlimit read and write only the structs we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return (0, false);
        }
        // rlim_t is u64 on the targets we build for, but not by definition.
        #[allow(clippy::unnecessary_cast)]
        let wanted = wanted as libc::rlim_t;
        if limit.rlim_cur < wanted {
            let raised = libc::rlimit { rlim_cur: wanted, rlim_max: limit.rlim_max.max(wanted) };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                hard_refused = raised.rlim_max > limit.rlim_max;
                let soft_to_hard = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
                libc::setrlimit(libc::RLIMIT_NOFILE, &soft_to_hard);
            }
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        }
    }
    #[allow(clippy::unnecessary_cast)]
    let current = limit.rlim_cur as u64;
    (current, hard_refused)
}

/// Words to add to a passthrough failure that ran out of descriptors: the limit and why.
pub fn limit_hint(error: &str) -> String {
    if !error.contains("Too many open files") {
        return String::new();
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only the struct we own.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    format!(
        " (passthrough_ll keeps a descriptor open per file it has seen; the open-file limit here is {})",
        limit.rlim_cur
    )
}
