//! The `tandem` command as a user meets it: exit codes, one-line errors, and the commands that
//! need no FUSE (mkfs, fsck, stat) on real image files. Mounting is covered by tests/mount.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A directory of its own per test, removed at the end.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let path = std::env::temp_dir().join(format!("tandem-cli-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch { path }
    }
    fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn tandem(arguments: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem")).args(arguments).output().expect("run tandem")
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A usage or operational error: exit 2, exactly one line on stderr, no panic.
fn assert_one_line_failure(output: &Output, expected_words: &str) {
    let message = stderr(output);
    assert_eq!(output.status.code(), Some(2), "stderr: {message}");
    assert_eq!(message.trim_end().lines().count(), 1, "more than one line: {message}");
    assert!(message.starts_with("tandem: "), "{message}");
    assert!(message.contains(expected_words), "expected '{expected_words}' in: {message}");
    assert!(!message.contains("panicked"), "{message}");
}

#[test]
fn usage_errors_are_one_line_with_exit_code_2() {
    assert_one_line_failure(&tandem(&["mkfs", "x.img", "--size", "12Q"]), "unknown unit");
    assert_one_line_failure(&tandem(&["mkfs", "x.img", "--bogus"]), "'--bogus'");
    assert_one_line_failure(&tandem(&["mkfs"]), "<IMAGE>");
    assert_one_line_failure(&tandem(&["mkfs", "x.img", "--inodes", "0"]), "larger than zero");
    assert_one_line_failure(&tandem(&["insert", "x", "0"]), "--from");
    assert_one_line_failure(&tandem(&["insert", "x", "0", "--zeros", "1", "--from", "y"]), "cannot be used");
    assert_one_line_failure(&tandem(&["bench", "meta", "--count", "5"]), "tandem bench meta --help");
    assert_one_line_failure(&tandem(&["nosuchcommand"]), "nosuchcommand");
}

#[test]
fn help_and_version_succeed() {
    let help = tandem(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("Exit codes"));
    for command in ["mkfs", "fsck", "stat", "mount", "umount", "insert", "collapse", "demo"] {
        let output = tandem(&[command, "--help"]);
        assert_eq!(output.status.code(), Some(0), "{command} --help");
        assert!(stdout(&output).contains("Usage: tandem"), "{command} --help");
    }
    assert_eq!(tandem(&["--version"]).status.code(), Some(0));
}

#[test]
fn mkfs_fsck_and_stat_on_a_new_image() {
    let scratch = Scratch::new("basic");
    let image = scratch.join("volume.img");
    let created = tandem(&["mkfs", text(&image), "--size", "64M", "--inodes", "5000"]);
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 << 20);
    assert!(stdout(&created).contains("created tandemfs"));

    let checked = tandem(&["fsck", text(&image)]);
    assert_eq!(checked.status.code(), Some(0), "{}{}", stdout(&checked), stderr(&checked));
    assert!(stdout(&checked).contains("clean"));
    assert!(tandem(&["fsck", "-q", text(&image)]).stdout.is_empty());

    let status = tandem(&["stat", text(&image)]);
    assert_eq!(status.status.code(), Some(0));
    let lines: Vec<String> = stdout(&status).lines().skip(1).map(str::to_string).collect();
    assert!(lines.len() >= 3, "{lines:?}");
    // Aligned: every value starts in the same column.
    let columns: Vec<usize> = lines
        .iter()
        .map(|line| {
            line.find(": ").unwrap() + 2 + line[line.find(": ").unwrap() + 2..].find(|c: char| c != ' ').unwrap()
        })
        .collect();
    assert!(columns.windows(2).all(|pair| pair[0] == pair[1]), "{lines:?}");
}

#[test]
fn mkfs_refuses_to_overwrite_without_force() {
    let scratch = Scratch::new("refuse");
    let image = scratch.join("volume.img");
    assert_eq!(tandem(&["mkfs", text(&image), "--size", "32M"]).status.code(), Some(0));
    assert_one_line_failure(&tandem(&["mkfs", text(&image)]), "tandemfs");
    assert_eq!(tandem(&["mkfs", text(&image), "--force"]).status.code(), Some(0));

    let data = scratch.join("data.bin");
    let mut bytes = vec![0u8; 32 << 20];
    bytes[100] = 1;
    std::fs::write(&data, &bytes).unwrap();
    assert_one_line_failure(&tandem(&["mkfs", text(&data)]), "--force");
    assert_eq!(std::fs::read(&data).unwrap(), bytes, "refused mkfs must not touch the file");

    // A zero-filled file is fair game.
    let zeros = scratch.join("zeros.img");
    std::fs::File::create(&zeros).unwrap().set_len(32 << 20).unwrap();
    assert_eq!(tandem(&["mkfs", text(&zeros)]).status.code(), Some(0));
}

#[test]
fn mkfs_rejects_bad_targets_and_sizes() {
    let scratch = Scratch::new("bad");
    let image = scratch.join("small.img");
    assert_one_line_failure(&tandem(&["mkfs", text(&image), "--size", "64K"]), "at least");
    assert!(!image.exists(), "a failed mkfs leaves no new file behind");
    assert_one_line_failure(&tandem(&["mkfs", text(&image)]), "--size");
    assert_one_line_failure(&tandem(&["mkfs", text(&scratch.path), "--size", "1G"]), "directory");
    assert_one_line_failure(&tandem(&["mkfs", "/dev/null"]), "neither a regular file nor a block device");
    assert_one_line_failure(&tandem(&["mkfs", text(&image), "--size", "32M", "--log-size", "32M"]), "does not fit");
    assert!(!image.exists());
    let long_name = scratch.join(&format!("{}.img", "n".repeat(300)));
    assert_one_line_failure(&tandem(&["mkfs", text(&long_name), "--size", "32M"]), "too long");
}

#[test]
fn fsck_exit_codes() {
    let scratch = Scratch::new("fsck");
    assert_one_line_failure(&tandem(&["fsck", text(&scratch.join("missing.img"))]), "no such image");

    let garbage = scratch.join("garbage.img");
    let bytes: Vec<u8> = (0..(32u32 << 20)).map(|index| (index.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    std::fs::write(&garbage, bytes).unwrap();
    let checked = tandem(&["fsck", text(&garbage)]);
    assert_eq!(checked.status.code(), Some(1), "{}{}", stdout(&checked), stderr(&checked));
    assert!(!stdout(&checked).is_empty());

    let image = scratch.join("volume.img");
    assert_eq!(tandem(&["mkfs", text(&image), "--size", "32M"]).status.code(), Some(0));
    // Damage the first superblock copy: the volume must still check (the second copy wins) or
    // report the damage, but never crash.
    let mut bytes = std::fs::read(&image).unwrap();
    bytes[64..128].fill(0xff);
    std::fs::write(&image, &bytes).unwrap();
    let checked = tandem(&["fsck", text(&image)]);
    assert!(matches!(checked.status.code(), Some(0) | Some(1)), "{}", stderr(&checked));
    assert!(!stderr(&checked).contains("panicked"));
}

#[test]
fn fsck_names_a_foreign_file_system() {
    if Command::new("mkfs.ext4").arg("-V").output().is_err() {
        eprintln!("skipped: mkfs.ext4 is not installed");
        return;
    }
    let scratch = Scratch::new("ext4");
    let image = scratch.join("ext4.img");
    std::fs::File::create(&image).unwrap().set_len(32 << 20).unwrap();
    let formatted = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image).output().unwrap();
    assert!(formatted.status.success());
    assert_one_line_failure(&tandem(&["fsck", text(&image)]), "ext2/ext3/ext4");
    assert_one_line_failure(&tandem(&["mkfs", text(&image)]), "ext2/ext3/ext4");
}

#[test]
fn commands_on_files_outside_tandemfs_are_refused() {
    let scratch = Scratch::new("outside");
    let file = scratch.join("plain.txt");
    std::fs::write(&file, b"hello").unwrap();
    assert_one_line_failure(&tandem(&["insert", text(&file), "0", "--zeros", "3"]), "not on a mounted tandemfs");
    assert_one_line_failure(&tandem(&["collapse", text(&file), "0", "1"]), "not on a mounted tandemfs");
    assert_one_line_failure(&tandem(&["insert", text(&scratch.join("none")), "0", "--zeros", "3"]), "no such file");
    assert_eq!(std::fs::read(&file).unwrap(), b"hello");
    assert_one_line_failure(&tandem(&["umount", text(&scratch.path)]), "not a mount point");
    assert_one_line_failure(&tandem(&["mount", "missing.img", text(&scratch.path)]), "no such image");
    assert_one_line_failure(&tandem(&["mount", "x.img", text(&scratch.path), "-o", "nosuch"]), "unknown mount option");
    assert_one_line_failure(&tandem(&["mount", "x.img", text(&scratch.join("nodir"))]), "does not exist");
}

#[test]
fn image_in_use_is_refused() {
    let scratch = Scratch::new("locked");
    let image = scratch.join("volume.img");
    assert_eq!(tandem(&["mkfs", text(&image), "--size", "32M"]).status.code(), Some(0));
    // Hold the same kind of lock a mount holds.
    let holder = std::fs::File::open(&image).unwrap();
    // SAFETY: flock on a descriptor we own.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&holder), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0);
    assert_one_line_failure(&tandem(&["fsck", text(&image)]), "in use");
    assert_one_line_failure(&tandem(&["mkfs", text(&image), "--force"]), "in use");
    // stat takes no lock and still works.
    assert_eq!(tandem(&["stat", text(&image)]).status.code(), Some(0));
    drop(holder);
    assert_eq!(tandem(&["fsck", text(&image)]).status.code(), Some(0));
}

#[test]
fn mkfs_gives_the_root_directory_to_the_caller_or_to_root_owner() {
    use std::sync::Arc;
    use tandemfs::device::{FileDevice, FileDeviceOptions};
    use tandemfs::fs::{MountOptions, ROOT_INODE};
    let root_owner = |image: &Path| {
        let device = FileDevice::open(image, FileDeviceOptions::default()).unwrap();
        let options = MountOptions { background_backend: false, ..MountOptions::default() };
        let (fs, _) = tandemfs::FileSystem::mount(Arc::new(device), &options).unwrap();
        let attributes = fs.get_attributes(ROOT_INODE).unwrap();
        fs.unmount().unwrap();
        (attributes.uid, attributes.gid)
    };
    let scratch = Scratch::new("root-owner");
    let image = scratch.join("owned.img");
    let created = tandem(&["mkfs", text(&image), "--size", "32M", "--root-owner", "1234:5678"]);
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    assert_eq!(root_owner(&image), (1234, 5678));

    let default_image = scratch.join("caller.img");
    assert_eq!(tandem(&["mkfs", text(&default_image), "--size", "32M"]).status.code(), Some(0));
    // SAFETY: geteuid and getegid have no preconditions.
    let caller = unsafe { (libc::geteuid(), libc::getegid()) };
    assert_eq!(root_owner(&default_image), caller);

    for bad in ["1234", "a:b", "1:-1", "4294967295:0", ":"] {
        assert_one_line_failure(
            &tandem(&["mkfs", text(&scratch.join("bad.img")), "--size", "32M", "--root-owner", bad]),
            "UID:GID",
        );
    }
    assert!(!scratch.join("bad.img").exists());
}

/// Runs tandem with a bound on its run time: a command that would block forever is killed and
/// the test fails instead of hanging.
fn tandem_within(arguments: &[&str], limit: std::time::Duration) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(arguments)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tandem");
    let process_id = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(limit) {
        Ok(output) => output.expect("wait for tandem"),
        Err(_) => {
            // Kill only the child this test started, by its id.
            let _ = Command::new("kill").arg("-9").arg(process_id.to_string()).status();
            panic!("tandem {arguments:?} did not finish within {limit:?}");
        }
    }
}

#[test]
fn fsck_and_stat_refuse_a_fifo_at_once() {
    let scratch = Scratch::new("fifo");
    let fifo = scratch.join("pipe");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo");
    assert!(made.success());
    let limit = std::time::Duration::from_secs(10);
    assert_one_line_failure(&tandem_within(&["fsck", text(&fifo)], limit), "is a FIFO");
    assert_one_line_failure(&tandem_within(&["fsck", "--repair", text(&fifo)], limit), "is a FIFO");
    assert_one_line_failure(&tandem_within(&["stat", text(&fifo)], limit), "is a FIFO");
    assert_one_line_failure(&tandem_within(&["fsck", "/dev/null"], limit), "is a character device");
    let socket_path = scratch.join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    assert_one_line_failure(&tandem_within(&["fsck", text(&socket_path)], limit), "is a socket");
    assert_one_line_failure(&tandem_within(&["stat", text(&socket_path)], limit), "is a socket");
    assert_one_line_failure(&tandem_within(&["stat", "/dev/null"], limit), "is a character device");
}

/// The first block of the block bitmap, as `tandem stat` reports the regions.
fn block_bitmap_start(image: &Path) -> u64 {
    let output = stdout(&tandem(&["stat", text(image)]));
    let regions = output.lines().find(|line| line.contains("regions:")).expect("stat lists the regions");
    let after = regions.split("block bitmap ").nth(1).expect("the block bitmap region");
    after.split('+').next().unwrap().trim().parse().expect("a block number")
}

#[test]
fn fsck_repair_and_dry_run() {
    let scratch = Scratch::new("repair");
    let image = scratch.join("volume.img");
    assert_eq!(tandem(&["mkfs", text(&image), "--size", "32M"]).status.code(), Some(0));
    let clean = tandem(&["fsck", "--repair", text(&image)]);
    assert_eq!(clean.status.code(), Some(0), "{}", stdout(&clean));
    assert!(stdout(&clean).contains("nothing to repair"));

    // A zeroed superblock copy and a zeroed block-bitmap block.
    let bitmap = block_bitmap_start(&image) as usize;
    let mut bytes = std::fs::read(&image).unwrap();
    bytes[..4096].fill(0);
    bytes[bitmap * 4096..(bitmap + 1) * 4096].fill(0);
    std::fs::write(&image, &bytes).unwrap();
    let checked = tandem(&["fsck", text(&image)]);
    assert_eq!(checked.status.code(), Some(1), "{}", stdout(&checked));
    assert!(stdout(&checked).contains("superblock copy 0"), "{}", stdout(&checked));

    // -n lists what it would change and writes nothing.
    let dry = tandem(&["fsck", "-n", text(&image)]);
    assert_eq!(dry.status.code(), Some(1), "{}{}", stdout(&dry), stderr(&dry));
    assert!(stdout(&dry).contains("would repair: "), "{}", stdout(&dry));
    assert!(stdout(&dry).contains("nothing was written"), "{}", stdout(&dry));
    assert!(std::fs::read(&image).unwrap() == bytes, "fsck -n changed the image");

    // --repair says what it changed; a second run finds nothing.
    let repaired = tandem(&["fsck", "--repair", text(&image)]);
    let said = stdout(&repaired);
    assert_eq!(repaired.status.code(), Some(1), "{said}{}", stderr(&repaired));
    assert!(said.contains("superblock copy 0") && said.contains("rewritten from copy 1"), "{said}");
    assert!(said.contains(&format!("block bitmap block {bitmap}")), "{said}");
    assert!(said.contains("the volume is consistent"), "{said}");
    let again = tandem(&["fsck", "--repair", text(&image)]);
    assert_eq!(again.status.code(), Some(0), "{}", stdout(&again));
    assert_eq!(tandem(&["fsck", text(&image)]).status.code(), Some(0));

    assert_one_line_failure(&tandem(&["fsck", "-n", "--repair", text(&image)]), "cannot be used");
}
