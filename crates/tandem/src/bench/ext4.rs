//! An ext4 volume on a loop device over an image file, the peer every benchmark compares with.
//! Whatever was set up is torn down when the value is dropped, also after an error or a panic in
//! the workload, so a benchmark never leaves a mount or a loop device behind.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Ext4Volume {
    image: PathBuf,
    loop_device: Option<String>,
    mountpoint: Option<PathBuf>,
}

/// Runs a tool and returns its standard output, or one line saying what failed.
pub fn run_tool(program: &str, arguments: &[&str]) -> Result<String, String> {
    run_tool_with_environment(program, arguments, &[])
}

/// `run_tool` with variables added to the tool's environment.
pub fn run_tool_with_environment(
    program: &str,
    arguments: &[&str],
    environment: &[(&str, &str)],
) -> Result<String, String> {
    let output = Command::new(program)
        .args(arguments)
        .envs(environment.iter().copied())
        .output()
        .map_err(|error| format!("cannot run {program}: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        let message = String::from_utf8_lossy(&output.stderr);
        let first = message.lines().next().unwrap_or("no message");
        Err(format!("{program} {} failed ({}): {first}", arguments.join(" "), output.status))
    }
}

pub fn tool_exists(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|directory| directory.join(program).is_file()))
        .unwrap_or(false)
}

impl Ext4Volume {
    /// Why ext4 cannot be measured here, if it cannot: it needs root, loop devices and e2fsprogs.
    pub fn unavailable_reason() -> Option<String> {
        if unsafe { libc::geteuid() } != 0 {
            return Some("not running as root (loop devices and mount need it)".into());
        }
        if !Path::new("/dev/loop-control").exists() {
            return Some("/dev/loop-control is missing (no loop device support)".into());
        }
        for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
            if !tool_exists(tool) {
                return Some(format!("{tool} is not installed (apt-get install util-linux e2fsprogs mount)"));
            }
        }
        None
    }

    /// Creates `image` of `size_bytes`, attaches it, formats ext4 with `inode_count` inodes and
    /// mounts it on a fresh directory.
    pub fn create(image: &Path, size_bytes: u64, inode_count: u64) -> Result<Ext4Volume, String> {
        let _ = std::fs::remove_file(image);
        let file =
            std::fs::File::create(image).map_err(|error| format!("cannot create {}: {error}", image.display()))?;
        let mut volume = Ext4Volume { image: image.to_path_buf(), loop_device: None, mountpoint: None };
        file.set_len(size_bytes).map_err(|error| format!("cannot size {}: {error}", image.display()))?;
        drop(file);
        let image_text = image.to_string_lossy().into_owned();
        let loop_device = run_tool("losetup", &["--find", "--show", &image_text])?;
        volume.loop_device = Some(loop_device.clone());
        run_tool("mkfs.ext4", &["-q", "-F", "-N", &inode_count.to_string(), &loop_device])?;
        let mountpoint = std::env::temp_dir().join(format!("tandem-bench-ext4-{}", std::process::id()));
        std::fs::create_dir_all(&mountpoint)
            .map_err(|error| format!("cannot create {}: {error}", mountpoint.display()))?;
        let mountpoint_text = mountpoint.to_string_lossy().into_owned();
        run_tool("mount", &["-t", "ext4", &loop_device, &mountpoint_text]).inspect_err(|_| {
            let _ = std::fs::remove_dir(&mountpoint);
        })?;
        volume.mountpoint = Some(mountpoint);
        Ok(volume)
    }

    pub fn mountpoint(&self) -> &Path {
        self.mountpoint.as_deref().expect("mounted while the volume exists")
    }
}

/// Unmounts `mountpoint` and removes the directory. A file still open in the workload can make
/// the first try fail; retries briefly, then detaches lazily so the machine is never left with a
/// busy mount.
pub fn unmount_and_remove(mountpoint: &Path) {
    let text = mountpoint.to_string_lossy().into_owned();
    let mut unmounted = false;
    for _ in 0..10 {
        if run_tool("umount", &[&text]).is_ok() {
            unmounted = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    if !unmounted {
        if let Err(error) = run_tool("umount", &["--lazy", &text]) {
            eprintln!("tandem: warning: {error}");
        }
    }
    let _ = std::fs::remove_dir(mountpoint);
}

impl Drop for Ext4Volume {
    fn drop(&mut self) {
        if let Some(mountpoint) = self.mountpoint.take() {
            unmount_and_remove(&mountpoint);
        }
        if let Some(loop_device) = self.loop_device.take() {
            if let Err(error) = run_tool("losetup", &["--detach", &loop_device]) {
                eprintln!("tandem: warning: {error}");
            }
        }
        let _ = std::fs::remove_file(&self.image);
    }
}
