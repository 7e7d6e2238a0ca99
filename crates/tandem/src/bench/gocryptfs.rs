//! gocryptfs over ext4, the user-space peer of an encrypted tandemfs volume: a FUSE file system
//! that encrypts every file's contents (AES-256-GCM) and name into a file of a directory below,
//! here on an ext4 loop volume on the benchmark's medium. gocryptfs runs in the foreground as a
//! child of the benchmark, in its own process group, so that Ctrl-C reaches only the benchmark,
//! which then unmounts it and waits for it to exit; dropping the value does that, also after an
//! error or a panic.

use super::ext4::{tool_exists, Ext4Volume};
use crate::mountinfo;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long gocryptfs may take to mount, or to exit once unmounted, before we give up on it.
const MOUNT_WAIT: Duration = Duration::from_secs(20);
const EXIT_WAIT: Duration = Duration::from_secs(5);
/// Between polls of the mount table and of the child.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

pub struct Gocryptfs {
    child: Option<Child>,
    mountpoint: PathBuf,
    /// The ext4 volume holding the encrypted files; dropped after gocryptfs is gone.
    _lower: Ext4Volume,
}

impl Gocryptfs {
    /// Why gocryptfs over ext4 cannot be measured here, if it cannot.
    pub fn unavailable_reason() -> Option<String> {
        if !tool_exists("gocryptfs") {
            return Some("gocryptfs is not installed (apt-get install gocryptfs)".into());
        }
        if !Path::new("/dev/fuse").exists() {
            return Some("/dev/fuse is missing (no FUSE in this kernel or container)".into());
        }
        Ext4Volume::unavailable_reason().map(|reason| format!("the ext4 volume below it cannot be made: {reason}"))
    }

    /// Makes an ext4 volume on `image` (`size_bytes`, `inode_count` inodes), initialises a
    /// gocryptfs directory on it with a random password and the cheapest scrypt cost (unlocking
    /// is not what is measured) and mounts it on a fresh directory.
    pub fn create(image: &Path, size_bytes: u64, inode_count: u64) -> Result<Gocryptfs, String> {
        let lower = Ext4Volume::create(image, size_bytes, inode_count)?;
        let cipher_directory = lower.mountpoint().join("cipher");
        let password_file = lower.mountpoint().join("password");
        std::fs::create_dir(&cipher_directory)
            .map_err(|error| format!("cannot create {}: {error}", cipher_directory.display()))?;
        std::fs::write(&password_file, format!("tandem-bench-{}\n", std::process::id()))
            .map_err(|error| format!("cannot write {}: {error}", password_file.display()))?;
        let initialised = Command::new("gocryptfs")
            .args(["-init", "-q", "-scryptn", "10", "-passfile"])
            .arg(&password_file)
            .arg(&cipher_directory)
            .stdin(Stdio::null())
            .output()
            .map_err(|error| format!("cannot run gocryptfs: {error}"))?;
        if !initialised.status.success() {
            let message = String::from_utf8_lossy(&initialised.stderr);
            return Err(format!("gocryptfs -init failed ({}): {}", initialised.status, first_line(&message)));
        }
        let mountpoint = std::env::temp_dir().join(format!("tandem-bench-gocryptfs-{}", std::process::id()));
        std::fs::create_dir_all(&mountpoint)
            .map_err(|error| format!("cannot create {}: {error}", mountpoint.display()))?;
        let mut gocryptfs = Gocryptfs { child: None, mountpoint: mountpoint.clone(), _lower: lower };
        let mounts_before = mountinfo::fuse_mounts_at(&mountpoint);
        let child = Command::new("gocryptfs")
            .args(["-fg", "-q", "-nosyslog", "-passfile"])
            .arg(&password_file)
            .arg(&cipher_directory)
            .arg(&mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|error| format!("cannot start gocryptfs: {error}"))?;
        gocryptfs.child = Some(child);
        gocryptfs.wait_for_mount(mounts_before)?;
        Ok(gocryptfs)
    }

    fn wait_for_mount(&mut self, mounts_before: usize) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if mountinfo::fuse_mounts_at(&self.mountpoint) > mounts_before {
                return Ok(());
            }
            crate::interrupt::check()?;
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut message = String::new();
                    if let Some(mut stderr) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut stderr, &mut message);
                    }
                    return Err(format!("gocryptfs exited ({status}): {}", first_line(&message)));
                }
            }
            if started.elapsed() > MOUNT_WAIT {
                return Err(format!("gocryptfs did not mount within {} s", MOUNT_WAIT.as_secs()));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
}

fn first_line(message: &str) -> &str {
    message.lines().find(|line| !line.trim().is_empty()).unwrap_or("no message").trim()
}

impl Drop for Gocryptfs {
    fn drop(&mut self) {
        // A child may have mounted after we stopped looking (an interrupt, a timeout): unmount
        // whenever one was started; umount2 of a directory that is no mount only fails.
        if self.child.is_some() {
            let path = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes()).expect("no zero byte");
            // SAFETY: umount2 reads the NUL-terminated path only. Lazily, so a file left open by
            // a failed workload cannot keep the mount; gocryptfs exits when the kernel lets go.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
        if let Some(mut child) = self.child.take() {
            let started = Instant::now();
            while !matches!(child.try_wait(), Ok(Some(_))) {
                if started.elapsed() > EXIT_WAIT {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(POLL_INTERVAL);
            }
        }
        let _ = std::fs::remove_dir(&self.mountpoint);
        // `_lower` drops after this body: ext4 unmounted, loop device detached, image removed.
    }
}
