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
    assert_one_line_failure(&tandem(&["bench", "gpu-dir", "--files", "5"]), "--files");
    assert_one_line_failure(&tandem(&["nosuchcommand"]), "nosuchcommand");
}

/// `bench flex` on the library alone, small: it completes, says FlexSpace was not given and
/// that the bytes verified; a FlexSpace path that is no library and a file too small for the
/// collapses are one-line failures.
#[test]
fn bench_flex_runs_short_on_the_library_and_verifies() {
    let scratch = Scratch::new("bench-flex");
    let flex = |arguments: &[&str], library: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tandem"));
        command.args(["bench", "flex", "--no-ext4", "--dir", text(&scratch.path)]).args(arguments);
        match library {
            Some(path) => command.env("TANDEM_FLEXSPACE_LIB", path),
            None => command.env_remove("TANDEM_FLEXSPACE_LIB"),
        };
        command.output().expect("run tandem")
    };
    let output = flex(&["--count", "40", "--file-size", "2M"], None);
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    let printed = stdout(&output);
    assert!(printed.contains("FlexSpace: not given"), "{printed}");
    assert!(printed.contains("ext4: skipped (--no-ext4)"), "{printed}");
    assert!(printed.contains("verified: every system's final bytes equal the model's"), "{printed}");
    assert!(printed.contains("40 × 100 B inserts, 2.0 MiB"), "{printed}");
    assert!(printed.contains("growth: 40 × 1–4096 B collapses at any byte"), "{printed}");
    let missing = scratch.join("no-such-library.so");
    assert_one_line_failure(&flex(&["--count", "5", "--file-size", "1M"], Some(text(&missing))), "no such file");
    let not_a_library = scratch.join("not-a-library.so");
    std::fs::write(&not_a_library, b"not an ELF file").unwrap();
    assert_one_line_failure(&flex(&["--count", "5", "--file-size", "1M"], Some(text(&not_a_library))), "cannot load");
    assert_one_line_failure(&flex(&["--count", "1000", "--file-size", "64K"], None), "raise --file-size");
    let left: Vec<_> = std::fs::read_dir(&scratch.path).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(left.len(), 1, "only the fake library is left: {left:?}");
}

#[test]
fn help_and_version_succeed() {
    let help = tandem(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("Exit codes"));
    for command in ["mkfs", "fsck", "stat", "key", "mount", "umount", "insert", "collapse", "demo"] {
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
    // A log whose checkpoints cannot hold the volume's whole block bitmap: deleting a file of
    // most of the volume would need that much.
    assert_one_line_failure(
        &tandem(&["mkfs", text(&image), "--size", "64G", "--log-size", "4M"]),
        "too small for a volume of 65536 MiB: at least 17 MiB",
    );
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
    // Another test's child, forked while `holder` was open, holds a copy of it (and so the
    // lock) until its exec closes it: wait until the lock is free, a few seconds at most.
    let free = (0..500).any(|_| {
        let probe = std::fs::File::open(&image).unwrap();
        // SAFETY: flock on a descriptor we own; closing it releases the lock.
        let taken = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&probe), libc::LOCK_EX | libc::LOCK_NB) };
        if taken != 0 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        taken == 0
    });
    assert!(free, "the image stayed locked after its holder closed it");
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

#[test]
fn fsck_and_stat_refuse_a_fifo_at_once() {
    let scratch = Scratch::new("fifo");
    let fifo = scratch.join("pipe");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo");
    assert!(made.success());
    let limit_s = 10;
    assert_one_line_failure(&tandem_within(&["fsck", text(&fifo)], None, limit_s), "is a FIFO");
    assert_one_line_failure(&tandem_within(&["fsck", "--repair", text(&fifo)], None, limit_s), "is a FIFO");
    assert_one_line_failure(&tandem_within(&["stat", text(&fifo)], None, limit_s), "is a FIFO");
    assert_one_line_failure(&tandem_within(&["fsck", "/dev/null"], None, limit_s), "is a character device");
    let socket_path = scratch.join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    assert_one_line_failure(&tandem_within(&["fsck", text(&socket_path)], None, limit_s), "is a socket");
    assert_one_line_failure(&tandem_within(&["stat", text(&socket_path)], None, limit_s), "is a socket");
    assert_one_line_failure(&tandem_within(&["stat", "/dev/null"], None, limit_s), "is a character device");
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

/// Finding 3 of issue 13: a 200 MiB file whose first MiB is zeros and which holds data further on
/// was formatted (and shortened by --size) without --force.
#[test]
fn mkfs_never_destroys_data_past_the_first_mebibyte() {
    use std::os::unix::fs::FileExt;
    let scratch = Scratch::new("data-later");
    let image = scratch.join("data.img");
    let length_bytes = 200u64 << 20;
    let file = std::fs::File::create(&image).unwrap();
    file.set_len(length_bytes).unwrap();
    let payload: Vec<u8> = (0..5000u32).map(|index| (index % 251) as u8 + 1).collect();
    let payload_offset = (150u64 << 20) + 12_345;
    file.write_all_at(&payload, payload_offset).unwrap();
    drop(file);
    let unchanged = || {
        let bytes = std::fs::read(&image).unwrap();
        assert_eq!(bytes.len() as u64, length_bytes, "the file kept its length");
        assert_eq!(&bytes[payload_offset as usize..payload_offset as usize + payload.len()], &payload[..]);
        assert!(bytes[..payload_offset as usize].iter().all(|&byte| byte == 0));
    };

    assert_one_line_failure(&tandem(&["mkfs", text(&image)]), "holds data (at byte 157298745)");
    unchanged();
    assert_one_line_failure(&tandem(&["mkfs", text(&image), "--size", "64M"]), "would shorten");
    unchanged();

    // --force with a smaller size formats the first 64 MiB and leaves the rest and the length.
    let output = tandem(&["mkfs", text(&image), "--size", "64M", "--force"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let bytes = std::fs::read(&image).unwrap();
    assert_eq!(bytes.len() as u64, length_bytes);
    assert_eq!(&bytes[payload_offset as usize..payload_offset as usize + payload.len()], &payload[..]);
    let check = tandem(&["fsck", text(&image)]);
    assert_eq!(check.status.code(), Some(0), "{}{}", stdout(&check), stderr(&check));
    // Now it holds tandemfs: refused again, by name.
    assert_one_line_failure(&tandem(&["mkfs", text(&image)]), "tandemfs");

    // Data at the very end of a fully written (not sparse) file is seen too.
    let tail = scratch.join("tail.img");
    let mut bytes = vec![0u8; 48 << 20];
    *bytes.last_mut().unwrap() = 7;
    std::fs::write(&tail, &bytes).unwrap();
    assert_one_line_failure(&tandem(&["mkfs", text(&tail)]), "--force");
    assert_eq!(std::fs::read(&tail).unwrap(), bytes);
    // Growing a file is no loss: a zero file becomes larger and is formatted.
    let zeros = scratch.join("zeros.img");
    std::fs::File::create(&zeros).unwrap().set_len(32 << 20).unwrap();
    assert_eq!(tandem(&["mkfs", text(&zeros), "--size", "48M"]).status.code(), Some(0));
    assert_eq!(std::fs::metadata(&zeros).unwrap().len(), 48 << 20);
}

/// Finding 11 of issue 13: mkfs wrote the whole inode table (17 GiB of zeros for 1 TiB). A 1 TiB
/// sparse image must come out of mkfs with little allocated, then mount and work.
#[test]
fn mkfs_of_a_terabyte_writes_megabytes_and_the_volume_works() {
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;
    use tandemfs::device::{FileDevice, FileDeviceOptions};
    use tandemfs::fs::{FileType, MountOptions, ROOT_INODE};
    let scratch = Scratch::new("terabyte");
    let image = scratch.join("big.img");
    let output = tandem(&["mkfs", text(&image), "--size", "1T"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let metadata = std::fs::metadata(&image).unwrap();
    assert_eq!(metadata.len(), 1 << 40);
    let allocated_bytes = metadata.blocks() * 512;
    // The bitmaps alone are 40 MiB; the log's header ring up to 128 MiB; the inode table was
    // 17 GiB before it became lazy.
    assert!(allocated_bytes < 256 << 20, "mkfs allocated {} MiB", allocated_bytes >> 20);

    let device = FileDevice::open(&image, FileDeviceOptions::default()).unwrap();
    let options = MountOptions { background_backend: false, ..MountOptions::default() };
    let (fs, _) = tandemfs::FileSystem::mount(Arc::new(device), &options).unwrap();
    let mut inodes = Vec::new();
    for index in 0..40u32 {
        let name = format!("file-{index}");
        let inode = fs.create(ROOT_INODE, name.as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap().inode;
        fs.write(inode, 0, name.as_bytes()).unwrap();
        inodes.push((inode, name));
    }
    fs.unmount().unwrap();
    // (Not fsck: its walk over every block of a 1 TiB volume takes minutes.)
    let device = FileDevice::open(&image, FileDeviceOptions::default()).unwrap();
    let (fs, _) = tandemfs::FileSystem::mount(Arc::new(device), &options).unwrap();
    for (inode, name) in inodes {
        let mut buffer = vec![0u8; name.len()];
        assert_eq!(fs.read(inode, 0, &mut buffer).unwrap(), name.len());
        assert_eq!(buffer, name.as_bytes());
    }
    fs.unmount().unwrap();
}

/// A volume mounted through FUSE for the length of a test (root and /dev/fuse needed, as for
/// tests/mount; without them the test says so and passes, as the mount suite is skipped too).
struct Mounted {
    point: PathBuf,
}

impl Mounted {
    fn new(scratch: &Scratch, size: &str) -> Option<Mounted> {
        Mounted::with_options(scratch, size, &[])
    }
    /// As `new`, with `-o` options.
    fn with_options(scratch: &Scratch, size: &str, options: &[&str]) -> Option<Mounted> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
            eprintln!("skipped: needs root and /dev/fuse");
            return None;
        }
        let image = scratch.join("volume.img");
        let point = scratch.join("mnt");
        std::fs::create_dir_all(&point).unwrap();
        let made = tandem(&["mkfs", text(&image), "--size", size]);
        assert_eq!(made.status.code(), Some(0), "{}", stderr(&made));
        let log = scratch.join("mount.log");
        let mut arguments = vec!["mount", text(&image), text(&point), "-d", "--log-file", text(&log)];
        for option in options {
            arguments.extend(["-o", option]);
        }
        let mounted = tandem(&arguments);
        assert_eq!(mounted.status.code(), Some(0), "{}", stderr(&mounted));
        Some(Mounted { point })
    }
    fn join(&self, name: &str) -> PathBuf {
        self.point.join(name)
    }
    /// Unmounts and checks the volume.
    fn finish(self, scratch: &Scratch) {
        let unmounted = tandem(&["umount", text(&self.point)]);
        assert_eq!(unmounted.status.code(), Some(0), "{}", stderr(&unmounted));
        std::mem::forget(self);
        let check = tandem(&["fsck", text(&scratch.join("volume.img"))]);
        assert_eq!(check.status.code(), Some(0), "{}{}", stdout(&check), stderr(&check));
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = tandem(&["umount", text(&self.point)]);
    }
}

/// Runs tandem with a time limit; a run past it is killed and fails the test.
fn tandem_within(arguments: &[&str], stdin: Option<&Path>, limit_s: u64) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tandem"));
    command.args(arguments).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    if let Some(path) = stdin {
        command.stdin(std::fs::File::open(path).unwrap());
    }
    let mut child = command.spawn().expect("run tandem");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(limit_s);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tandem {arguments:?} ran past {limit_s} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn pattern_bytes(length: usize, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}

/// Finding 4 of issue 13: an insert on a nearly full volume failed part-way and left the file
/// grown, part source bytes and part zeros, with a wrong byte count in the message.
#[test]
fn insert_that_runs_out_of_space_leaves_the_file_as_it_was() {
    use std::io::Write;
    let scratch = Scratch::new("insert-full");
    let Some(mounted) = Mounted::new(&scratch, "64M") else { return };
    let target = mounted.join("target");
    let original = pattern_bytes(100_000, 1);
    std::fs::write(&target, &original).unwrap();
    // Fill the volume until it refuses, then give back a little: the insert gets part-way.
    let mut fill = std::fs::File::create(mounted.join("fill")).unwrap();
    let chunk = vec![0x5Au8; 1 << 20];
    for _ in 0..200 {
        if fill.write_all(&chunk).is_err() || fill.sync_all().is_err() {
            break;
        }
    }
    drop(fill);
    let fill_length = std::fs::metadata(mounted.join("fill")).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(mounted.join("fill"))
        .unwrap()
        .set_len(fill_length - (3 << 20))
        .unwrap();
    let source = scratch.join("source.bin");
    std::fs::write(&source, pattern_bytes(24 << 20, 2)).unwrap();

    let output = tandem_within(&["insert", text(&target), "1000", "--from", text(&source)], None, 120);
    assert_one_line_failure(&output, "nothing was inserted, the file is as it was");
    assert!(stderr(&output).contains("No space left"), "{}", stderr(&output));
    let after = std::fs::read(&target).unwrap();
    assert_eq!(after.len(), original.len(), "the file changed size");
    assert!(after == original, "the file's bytes changed");

    // The space the failed insert took is back: a small insert works.
    let small = scratch.join("small.bin");
    std::fs::write(&small, b"hello").unwrap();
    let output = tandem(&["insert", text(&target), "10", "--from", text(&small)]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).contains("inserted 5 bytes"), "{}", stdout(&output));
    let mut expected = original[..10].to_vec();
    expected.extend_from_slice(b"hello");
    expected.extend_from_slice(&original[10..]);
    assert!(std::fs::read(&target).unwrap() == expected);
    mounted.finish(&scratch);
}

/// Finding 5 of issue 13: `tandem insert FILE 0 --from FILE` grew the file until the volume was
/// full. Through the same path, a hard link or standard input, it copies the file as it was.
#[test]
fn insert_of_a_file_into_itself_copies_it_once() {
    let scratch = Scratch::new("insert-self");
    let Some(mounted) = Mounted::new(&scratch, "128M") else { return };
    let target = mounted.join("self");
    // Larger than one chunk, with the insert offset inside a chunk, so that a read of the
    // snapshot straddles the offset.
    let original = pattern_bytes((2 << 20) + 12_345, 3);
    std::fs::write(&target, &original).unwrap();
    let offset = 1_500_000usize;
    let output = tandem_within(&["insert", text(&target), "1500000", "--from", text(&target)], None, 60);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).contains(&format!("size now {}", format_count(2 * original.len()))), "{}", stdout(&output));
    let mut expected = original[..offset].to_vec();
    expected.extend_from_slice(&original);
    expected.extend_from_slice(&original[offset..]);
    assert!(std::fs::read(&target).unwrap() == expected, "self-insert at {offset}");

    let small = mounted.join("small");
    std::fs::write(&small, b"abcdef").unwrap();
    let link = mounted.join("link");
    std::fs::hard_link(&small, &link).unwrap();
    let output = tandem_within(&["insert", text(&small), "0", "--from", text(&link)], None, 60);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(std::fs::read(&small).unwrap(), b"abcdefabcdef");
    let output = tandem_within(&["insert", text(&small), "3", "--from", "-"], Some(&small), 60);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(std::fs::read(&small).unwrap(), b"abcabcdefabcdefdefabcdef");
    mounted.finish(&scratch);
}

/// `tandem defrag`: small inserts at byte offsets leave a file holding about 3× its bytes; a
/// `--check` reports it and changes nothing, a defrag brings it within 1.2× with every byte
/// kept, a second finds nothing to do, a factor below 1 is a one-line error, and fsck is clean.
#[test]
fn defrag_compacts_a_fragmented_file_and_keeps_its_bytes() {
    let scratch = Scratch::new("defrag");
    // Background compaction off: it would compact the file before `tandem defrag` looks.
    let Some(mounted) = Mounted::with_options(&scratch, "128M", &["compact_factor=0"]) else { return };
    let target = mounted.join("fragmented");
    let mut expected = pattern_bytes(300_000, 5);
    std::fs::write(&target, &expected).unwrap();
    // Collapses inside blocks free no block (format version 8: nothing is copied, the block
    // keeps what is left of it), so 60 of them leave 60 blocks holding 1,096 bytes each; from
    // the end, so that each offset is still block `k` + 500.
    for k in (1..=60usize).rev() {
        let offset = k * 4096 + 500;
        let output = tandem_within(&["collapse", text(&target), &offset.to_string(), "3000"], None, 60);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        expected.drain(offset..offset + 3000);
    }
    let source = scratch.join("ten-bytes");
    std::fs::write(&source, b"0123456789").unwrap();
    for step in 0..150usize {
        let offset = (step * 1777) % expected.len();
        let output = tandem_within(&["insert", text(&target), &offset.to_string(), "--from", text(&source)], None, 60);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        expected.splice(offset..offset, b"0123456789".iter().copied());
    }
    let check = tandem_within(&["defrag", text(&target), "--check"], None, 60);
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    assert!(stdout(&check).contains(&format!("{} bytes mapped", format_count(expected.len()))), "{}", stdout(&check));
    assert!(!stdout(&check).contains("compacted"), "{}", stdout(&check));
    let output = tandem_within(&["defrag", text(&target)], None, 60);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report = stdout(&output);
    let factors: Vec<f64> = report
        .split('(')
        .skip(1)
        .filter_map(|part| part.split('×').next().and_then(|number| number.parse().ok()))
        .collect();
    assert!(factors.len() == 2 && factors[0] > 2.0 && factors[1] <= 1.2, "{report}");
    assert!(std::fs::read(&target).unwrap() == expected, "defrag changed bytes");
    let again = tandem_within(&["defrag", text(&target)], None, 60);
    assert!(stdout(&again).contains("nothing to do"), "{}", stdout(&again));
    let bad = tandem_within(&["defrag", text(&target), "--factor", "0.5"], None, 60);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert_eq!(stderr(&bad).trim().lines().count(), 1, "{}", stderr(&bad));
    mounted.finish(&scratch);
}

/// Digits grouped by thousands, as tandem prints counts.
fn format_count(value: usize) -> String {
    let digits = value.to_string();
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// Ctrl-C during `tandem insert --from -` (a pipe that has delivered some bytes and then waits):
/// the bytes already inserted are taken out again and the file is as it was.
#[test]
fn insert_interrupted_by_a_signal_leaves_the_file_as_it_was() {
    use std::io::Write;
    let scratch = Scratch::new("insert-signal");
    let Some(mounted) = Mounted::new(&scratch, "64M") else { return };
    let target = mounted.join("target");
    let original = pattern_bytes(50_000, 4);
    std::fs::write(&target, &original).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["insert", text(&target), "777", "--from", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(&pattern_bytes(3 << 20, 5)).unwrap();
    // Wait (bounded) until part of the input is in the file, then interrupt with the pipe open.
    let mut grown = false;
    for _ in 0..600 {
        if std::fs::metadata(&target).unwrap().len() > original.len() as u64 {
            grown = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(grown, "the insert never started");
    // SAFETY: kill sends a signal to the child we started.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "the interrupted insert did not end");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    assert!(stderr(&output).contains("nothing was inserted, the file is as it was"), "{}", stderr(&output));
    assert!(std::fs::read(&target).unwrap() == original, "the file changed");
    mounted.finish(&scratch);
}

/// A key file of `length` random-looking bytes (a fixed pattern per seed, so runs repeat).
fn write_key_file(path: &Path, length: usize, seed: u32) {
    std::fs::write(path, pattern_bytes(length, seed)).unwrap();
}

/// An encrypted 32 MiB volume whose only slot opens with `key_file`, Argon2id at the cheapest
/// cost so that every key operation of a test takes milliseconds. Made through the library, so
/// these tests stand apart from mkfs's options.
fn encrypted_image(image: &Path, key_file: &Path) {
    use std::sync::Arc;
    use tandemfs::crypt::{Encryption, KdfCost, Secret};
    use tandemfs::device::{FileDevice, FileDeviceOptions};
    let options = FileDeviceOptions { create_size_bytes: Some(32 << 20), lock_exclusive: true, read_only: false };
    let device = FileDevice::open(image, options).unwrap();
    let secret = Secret::from_key_file(key_file).unwrap();
    let format = tandemfs::fs::FormatOptions {
        encryption: Some(Encryption { secret, cost: KdfCost::for_tests() }),
        ..Default::default()
    };
    tandemfs::FileSystem::format(Arc::new(device), &format).unwrap();
}

/// Mounts the volume on `image` with `key_file` through the library, writes a file, unmounts.
fn mount_and_write(image: &Path, key_file: &Path) {
    use std::sync::Arc;
    use tandemfs::device::{FileDevice, FileDeviceOptions};
    use tandemfs::fs::{MountOptions, ROOT_INODE};
    use tandemfs::types::FileType;
    let device = FileDevice::open(image, FileDeviceOptions::default()).unwrap();
    let key = Some(tandemfs::crypt::Secret::from_key_file(key_file).unwrap());
    let options = MountOptions { background_backend: false, key, ..MountOptions::default() };
    let (fs, _) = tandemfs::FileSystem::mount(Arc::new(device), &options).unwrap();
    let created = fs.create(ROOT_INODE, b"after-key-change", FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.write(created.inode, 0, b"still readable").unwrap();
    fs.unmount().unwrap();
}

/// Whether `key_file` opens the encrypted volume on `image` (through the library, so the
/// test does not depend on another command's output).
fn opens(image: &Path, key_file: &Path) -> bool {
    use std::sync::Arc;
    use tandemfs::device::{FileDevice, FileDeviceOptions};
    let device =
        FileDevice::open(image, FileDeviceOptions { read_only: true, ..FileDeviceOptions::default() }).unwrap();
    let secret = tandemfs::crypt::Secret::from_key_file(key_file).unwrap();
    tandemfs::crypt::unlock(Arc::new(device), Some(&secret)).is_ok()
}

/// The slots in use, by index, as the library reads them.
fn slots_in_use(image: &Path) -> Vec<usize> {
    use tandemfs::device::{FileDevice, FileDeviceOptions};
    let device =
        FileDevice::open(image, FileDeviceOptions { read_only: true, ..FileDeviceOptions::default() }).unwrap();
    tandemfs::crypt::key_slots(&device).unwrap().iter().filter(|slot| slot.in_use).map(|slot| slot.index).collect()
}

#[test]
fn key_add_change_and_remove_with_key_files() {
    let scratch = Scratch::new("key-slots");
    let image = scratch.join("secret.img");
    let [first, second, third] = ["first.key", "second.key", "third.key"].map(|name| scratch.join(name));
    for (seed, path) in [&first, &second, &third].into_iter().enumerate() {
        write_key_file(path, 64, seed as u32 + 1);
    }
    encrypted_image(&image, &first);
    assert_eq!(slots_in_use(&image), vec![0]);

    let added = tandem(&["key", "add", text(&image), "--key-file", text(&first), "--new-key-file", text(&second)]);
    assert_eq!(added.status.code(), Some(0), "{}", stderr(&added));
    assert!(stdout(&added).contains("added key slot 1"), "{}", stdout(&added));
    assert_eq!(slots_in_use(&image), vec![0, 1]);
    assert!(opens(&image, &first) && opens(&image, &second));
    // Without --kdf-time-ms the new slot copies the first slot's (cheap) Argon2id cost.
    let costs: Vec<_> = {
        let device = tandemfs::device::FileDevice::open(&image, Default::default()).unwrap();
        tandemfs::crypt::key_slots(&device).unwrap().iter().filter_map(|slot| slot.cost).collect()
    };
    assert_eq!(costs, vec![tandemfs::crypt::KdfCost::for_tests(); 2]);

    // The new key replaces the first: it opens, the first no longer does, the second still does.
    let changed = tandem(&["key", "change", text(&image), "--key-file", text(&first), "--new-key-file", text(&third)]);
    assert_eq!(changed.status.code(), Some(0), "{}", stderr(&changed));
    assert!(opens(&image, &third) && opens(&image, &second));
    assert!(!opens(&image, &first), "the changed key must no longer open the volume");
    assert_eq!(slots_in_use(&image).len(), 2);

    let removed = tandem(&["key", "remove", text(&image), "--key-file", text(&second)]);
    assert_eq!(removed.status.code(), Some(0), "{}", stderr(&removed));
    assert!(stdout(&removed).contains("cleared key slot 1"), "{}", stdout(&removed));
    assert!(!opens(&image, &second));
    assert!(opens(&image, &third));

    // The volume still mounts with the key that is left, checks clean, and stat lists the
    // slot that is left.
    mount_and_write(&image, &third);
    let checked = tandem(&["fsck", text(&image), "--key-file", text(&third)]);
    assert_eq!(checked.status.code(), Some(0), "{}{}", stdout(&checked), stderr(&checked));
    let status = tandem(&["stat", text(&image), "--key-file", text(&third)]);
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    assert!(stdout(&status).contains("1 of 8 in use"), "{}", stdout(&status));
}

#[test]
fn key_commands_refuse_bad_input_and_write_nothing() {
    let scratch = Scratch::new("key-refusals");
    let image = scratch.join("secret.img");
    let key = scratch.join("right.key");
    let other = scratch.join("other.key");
    let wrong = scratch.join("wrong.key");
    let short = scratch.join("short.key");
    let long = scratch.join("long.key");
    let missing = scratch.join("missing.key");
    let no_image = scratch.join("none.img");
    write_key_file(&key, 64, 1);
    write_key_file(&other, 64, 2);
    write_key_file(&wrong, 64, 3);
    write_key_file(&short, 63, 4);
    write_key_file(&long, 65, 5);
    encrypted_image(&image, &key);
    let before = std::fs::read(&image).unwrap();
    let unchanged = |what: &str| assert!(std::fs::read(&image).unwrap() == before, "{what} changed the image");
    let image_text = text(&image);

    let refusals: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["key", "add", image_text, "--key-file", text(&wrong), "--new-key-file", text(&other)],
            "wrong passphrase or key file",
        ),
        (
            vec!["key", "change", image_text, "--key-file", text(&wrong), "--new-key-file", text(&other)],
            "wrong passphrase or key file",
        ),
        (vec!["key", "remove", image_text, "--key-file", text(&wrong)], "wrong passphrase or key file"),
        (vec!["key", "add", image_text, "--key-file", text(&missing), "--new-key-file", text(&other)], "missing.key"),
        (vec!["key", "add", image_text, "--key-file", text(&key), "--new-key-file", text(&missing)], "missing.key"),
        (vec!["key", "add", image_text, "--key-file", text(&short), "--new-key-file", text(&other)], "63 bytes"),
        (vec!["key", "add", image_text, "--key-file", text(&key), "--new-key-file", text(&long)], "exactly 64"),
        (vec!["key", "remove", image_text, "--key-file", text(&key)], "only slot in use"),
        // No terminal here: neither passphrase can be asked for.
        (vec!["key", "add", image_text, "--new-key-file", text(&other)], "--key-file"),
        (vec!["key", "add", image_text, "--key-file", text(&key)], "--new-key-file"),
        (vec!["key", "remove", image_text], "--key-file"),
        (
            vec![
                "key",
                "add",
                image_text,
                "--key-file",
                text(&key),
                "--new-key-file",
                text(&other),
                "--kdf-time-ms",
                "0",
            ],
            "0",
        ),
        (
            vec!["key", "add", text(&no_image), "--key-file", text(&key), "--new-key-file", text(&other)],
            "no such image",
        ),
    ];
    for (arguments, expected) in &refusals {
        assert_one_line_failure(&tandem(arguments), expected);
        unchanged(&arguments.join(" "));
    }
    assert!(opens(&image, &key) && !opens(&image, &other));

    // A plain volume has no key slots.
    let plain = scratch.join("plain.img");
    assert_eq!(tandem(&["mkfs", text(&plain), "--size", "32M"]).status.code(), Some(0));
    let plain_before = std::fs::read(&plain).unwrap();
    for arguments in [
        vec!["key", "add", text(&plain), "--key-file", text(&key), "--new-key-file", text(&other)],
        vec!["key", "change", text(&plain), "--key-file", text(&key), "--new-key-file", text(&other)],
        vec!["key", "remove", text(&plain), "--key-file", text(&key)],
    ] {
        assert_one_line_failure(&tandem(&arguments), "not encrypted");
    }
    assert!(std::fs::read(&plain).unwrap() == plain_before, "a refused key command changed the plain volume");

    // The exclusive lock held by something that is not a mount (fsck, mkfs) is refused.
    let holder = std::fs::File::open(&image).unwrap();
    // SAFETY: flock on a descriptor we own.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&holder), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0);
    assert_one_line_failure(
        &tandem(&["key", "add", image_text, "--key-file", text(&key), "--new-key-file", text(&other)]),
        "in use by another tandem process that is not a mount",
    );
    drop(holder);
    // Another key command at work (its lock on the image's first byte) is refused.
    let other_key_command = std::fs::OpenOptions::new().read(true).write(true).open(&image).unwrap();
    // SAFETY: an all-zero flock is valid; fcntl reads it.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_len = 1;
    let locked = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&other_key_command), libc::F_OFD_SETLK, &lock) };
    assert_eq!(locked, 0);
    assert_one_line_failure(
        &tandem(&["key", "remove", image_text, "--key-file", text(&key)]),
        "another 'tandem key' is changing the key slots",
    );
    drop(other_key_command);
    unchanged("the refusals");

    // Eight slots: the seven free ones take seven keys, the eighth add is refused.
    let added = scratch.join("added.key");
    for seed in 10..17 {
        write_key_file(&added, 64, seed);
        let output = tandem(&["key", "add", image_text, "--key-file", text(&key), "--new-key-file", text(&added)]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    assert_eq!(slots_in_use(&image), (0..8).collect::<Vec<_>>());
    let full = std::fs::read(&image).unwrap();
    for action in ["add", "change"] {
        assert_one_line_failure(
            &tandem(&["key", action, image_text, "--key-file", text(&key), "--new-key-file", text(&other)]),
            "all 8 key slots are in use",
        );
    }
    assert!(std::fs::read(&image).unwrap() == full, "a refused add or change on a full volume wrote");
}

/// Encrypted volumes at the command line: mkfs --encrypt with a key file, fsck and stat with
/// it; without it (and without a terminal), with a wrong one, one of the wrong length or a
/// missing one: one line, exit 2, the image unchanged; a damaged key slot is a warning while
/// another slot opens the volume.
#[test]
fn encrypted_volumes_and_their_keys() {
    let scratch = Scratch::new("encrypted");
    let image = scratch.join("secret.img");
    let key = scratch.join("key");
    std::fs::write(&key, (0..64u8).map(|byte| byte.wrapping_mul(37)).collect::<Vec<u8>>()).unwrap();
    let (image_text, key_text) = (text(&image), text(&key));

    // No terminal and no key file: refused before the image exists.
    assert_one_line_failure(&tandem(&["mkfs", "--encrypt", "--size", "32M", image_text]), "give --key-file");
    assert!(!image.exists());
    assert_one_line_failure(&tandem(&["mkfs", "--key-file", key_text, "--size", "32M", image_text]), "--encrypt");
    let made =
        tandem(&["mkfs", "--encrypt", "--key-file", key_text, "--kdf-time-ms", "1", "--size", "32M", image_text]);
    assert_eq!(made.status.code(), Some(0), "{}", stderr(&made));
    assert!(stdout(&made).contains("created encrypted tandemfs"), "{}", stdout(&made));
    assert!(stdout(&made).contains("AES-256-XTS"), "{}", stdout(&made));

    let checked = tandem(&["fsck", "--key-file", key_text, image_text]);
    assert_eq!(checked.status.code(), Some(0), "{}{}", stdout(&checked), stderr(&checked));
    let stat = tandem(&["stat", "--key-file", key_text, image_text]);
    assert_eq!(stat.status.code(), Some(0), "{}", stderr(&stat));
    assert!(stdout(&stat).contains("1 of 8 in use"), "{}", stdout(&stat));

    let before = std::fs::read(&image).unwrap();
    let wrong = scratch.join("wrong");
    std::fs::write(&wrong, [9u8; 64]).unwrap();
    let short = scratch.join("short");
    std::fs::write(&short, [9u8; 63]).unwrap();
    for command in [["fsck"].as_slice(), &["fsck", "--repair"], &["stat"]] {
        let with = |extra: &[&'static str]| -> Vec<String> {
            command.iter().chain(extra).map(|word| word.to_string()).chain([image_text.to_string()]).collect()
        };
        let run = |arguments: Vec<String>, key_file: Option<&Path>| {
            let mut arguments = arguments;
            if let Some(path) = key_file {
                arguments.insert(1, "--key-file".into());
                arguments.insert(2, text(path).into());
            }
            Command::new(env!("CARGO_BIN_EXE_tandem")).args(&arguments).output().expect("run tandem")
        };
        assert_one_line_failure(&run(with(&[]), None), "is encrypted: give --key-file FILE or its passphrase");
        assert_one_line_failure(&run(with(&[]), Some(&wrong)), "wrong passphrase or key file");
        assert_one_line_failure(&run(with(&[]), Some(&short)), "holds 63 bytes");
        assert_one_line_failure(&run(with(&[]), Some(&scratch.join("missing"))), "No such file");
    }
    assert!(std::fs::read(&image).unwrap() == before, "a refused key changed the image");

    // Damage slot 0 (the only one): nothing opens the volume, and the line says why.
    let superblock = {
        let device = tandemfs::device::MemoryDevice::from_bytes(before.clone());
        tandemfs::block::superblock::Superblock::read_best(&device).unwrap()
    };
    let mut damaged = before.clone();
    damaged[(superblock.key_slot_start * 4096 + 100) as usize] ^= 1;
    std::fs::write(&image, &damaged).unwrap();
    assert_one_line_failure(&tandem(&["fsck", "--key-file", key_text, image_text]), "damaged: slot 0");
    // A second slot (copied from slot 0 at position 1, rewrapped through the library) opens
    // it; the damaged slot is a warning.
    std::fs::write(&image, &before).unwrap();
    {
        let device = tandemfs::device::FileDevice::open(&image, Default::default()).unwrap();
        let secret = tandemfs::crypt::Secret::from_key_file(&key).unwrap();
        let cost = tandemfs::crypt::KdfCost::for_tests();
        assert_eq!(tandemfs::crypt::add_key(&device, &secret, &secret, cost).unwrap(), 1);
    }
    let mut damaged = std::fs::read(&image).unwrap();
    damaged[(superblock.key_slot_start * 4096 + 100) as usize] ^= 1;
    std::fs::write(&image, &damaged).unwrap();
    let warned = tandem(&["fsck", "--key-file", key_text, image_text]);
    assert_eq!(warned.status.code(), Some(0), "{}", stderr(&warned));
    assert!(stderr(&warned).contains("warning: key slot 0 is damaged"), "{}", stderr(&warned));
    assert!(stderr(&warned).contains("slot 1 opened the volume"), "{}", stderr(&warned));
}

/// A mounted volume's keys change beside the mount (the key slots are apart from everything a
/// mount writes); the new key opens the volume once it is unmounted, the mount's data intact.
#[test]
fn key_add_and_change_on_a_mounted_volume() {
    use std::sync::Arc;
    use tandemfs::device::{FileDevice, FileDeviceOptions};
    use tandemfs::fs::{MountOptions, ROOT_INODE};
    use tandemfs::types::FileType;
    let scratch = Scratch::new("key-mounted");
    let image = scratch.join("secret.img");
    let [first, second, third] = ["first.key", "second.key", "third.key"].map(|name| scratch.join(name));
    for (seed, path) in [&first, &second, &third].into_iter().enumerate() {
        write_key_file(path, 64, seed as u32 + 20);
    }
    encrypted_image(&image, &first);

    let options = FileDeviceOptions { lock_exclusive: true, ..FileDeviceOptions::default() };
    let device = FileDevice::open(&image, options).unwrap();
    let key = Some(tandemfs::crypt::Secret::from_key_file(&first).unwrap());
    let (fs, _) =
        tandemfs::FileSystem::mount(Arc::new(device), &MountOptions { key, ..MountOptions::default() }).unwrap();
    let file = fs.create(ROOT_INODE, b"written-while-keys-change", FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.write(file.inode, 0, b"before").unwrap();
    let added = tandem(&["key", "add", text(&image), "--key-file", text(&first), "--new-key-file", text(&second)]);
    assert_eq!(added.status.code(), Some(0), "{}", stderr(&added));
    fs.write(file.inode, 6, b" and after").unwrap();
    let changed = tandem(&["key", "change", text(&image), "--key-file", text(&first), "--new-key-file", text(&third)]);
    assert_eq!(changed.status.code(), Some(0), "{}", stderr(&changed));
    fs.fsync(file.inode, false).unwrap();
    fs.unmount().unwrap();
    drop(fs);

    assert!(!opens(&image, &first) && opens(&image, &second) && opens(&image, &third));
    let checked = tandem(&["fsck", text(&image), "--key-file", text(&third)]);
    assert_eq!(checked.status.code(), Some(0), "{}{}", stdout(&checked), stderr(&checked));
    let device = FileDevice::open(&image, FileDeviceOptions::default()).unwrap();
    let key = Some(tandemfs::crypt::Secret::from_key_file(&second).unwrap());
    let options = MountOptions { background_backend: false, key, ..MountOptions::default() };
    let (fs, _) = tandemfs::FileSystem::mount(Arc::new(device), &options).unwrap();
    let found = fs.lookup(ROOT_INODE, b"written-while-keys-change").unwrap();
    let mut buffer = vec![0u8; 64];
    let length = fs.read(found.inode, 0, &mut buffer).unwrap();
    assert_eq!(&buffer[..length], b"before and after");
    fs.unmount().unwrap();
}

/// Passphrases on a terminal (util-linux `script` gives the command one; skipped without it):
/// mkfs asks twice and refuses two that differ before creating the image; fsck asks once and
/// refuses a wrong one.
#[test]
fn passphrases_are_asked_on_a_terminal() {
    if Command::new("script").arg("--version").output().map_or(true, |output| !output.status.success()) {
        eprintln!("skipped: no util-linux script(1) to provide a terminal");
        return;
    }
    let scratch = Scratch::new("passphrase");
    let image = scratch.join("typed.img");
    // Types `lines` into `arguments` run on a terminal, each after a pause that lets the
    // command switch the terminal to no-echo and ask.
    let typed = |lines: &[&str], arguments: &str| -> String {
        let typing: String = lines.iter().map(|line| format!("sleep 0.5; printf '%s\\n' '{line}'; ")).collect();
        let command = format!("{} {arguments}", env!("CARGO_BIN_EXE_tandem"));
        let shell = format!("({typing} sleep 0.5) | script -qec \"{command}\" /dev/null");
        let output = Command::new("sh").arg("-c").arg(&shell).output().expect("run script");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let differ =
        typed(&["first words", "other words"], &format!("mkfs --encrypt --kdf-time-ms 1 --size 32M {}", text(&image)));
    assert!(differ.contains("the two passphrases differ"), "{differ}");
    assert!(!image.exists());
    let made =
        typed(&["same words", "same words"], &format!("mkfs --encrypt --kdf-time-ms 1 --size 32M {}", text(&image)));
    assert!(made.contains("Repeat the passphrase") && made.contains("created encrypted tandemfs"), "{made}");
    let checked = typed(&["same words"], &format!("fsck {}", text(&image)));
    assert!(checked.contains(": clean ("), "{checked}");
    let wrong = typed(&["other words"], &format!("fsck {}", text(&image)));
    assert!(wrong.contains("wrong passphrase or key file"), "{wrong}");
}

/// Arrays (docs/RAID.md): mkfs over six members, fsck and status from any one member, degraded
/// with two gone, refused with three; and every bad input one line with nothing written.
#[test]
fn arrays_from_mkfs_to_a_degraded_fsck_and_every_refusal() {
    let scratch = Scratch::new("array");
    let names = ["a", "b", "c", "d", "e", "f"].map(|name| scratch.join(&format!("{name}.img")));
    let list = names.iter().map(|path| text(path)).collect::<Vec<_>>().join(",");
    let created = tandem(&["mkfs", "--devices", &list, "--parity", "2", "--size", "24M", "--stripe-unit", "16K"]);
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    assert!(stdout(&created).contains("4 data + 2 parity"), "{}", stdout(&created));
    let checked = tandem(&["fsck", text(&names[3])]);
    assert_eq!(checked.status.code(), Some(0), "{}{}", stdout(&checked), stderr(&checked));
    let status = tandem(&["status", text(&names[0])]);
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    assert_eq!(stdout(&status).matches(": ok").count(), 6, "{}", stdout(&status));
    assert_eq!(tandem(&["scrub", text(&names[0])]).status.code(), Some(0));
    // Two members away: degraded but whole. Three: refused, naming the slots.
    let away = scratch.join("away");
    std::fs::create_dir(&away).unwrap();
    for index in [1, 4] {
        std::fs::rename(&names[index], away.join(names[index].file_name().unwrap())).unwrap();
    }
    let degraded = tandem(&["fsck", text(&names[0])]);
    assert_eq!(degraded.status.code(), Some(0), "{}{}", stdout(&degraded), stderr(&degraded));
    assert!(stderr(&degraded).contains("slot 1 missing"), "{}", stderr(&degraded));
    assert_eq!(tandem(&["status", text(&names[0])]).status.code(), Some(1));
    std::fs::rename(&names[2], away.join("c.img")).unwrap();
    assert_one_line_failure(&tandem(&["fsck", text(&names[0])]), "parity 2 covers at most 2");
    for name in ["b.img", "c.img", "e.img"] {
        std::fs::rename(away.join(name), scratch.join(name)).unwrap();
    }
    let before: Vec<Vec<u8>> = names.iter().map(|path| std::fs::read(path).unwrap()).collect();
    let new = |name: &str| scratch.join(name);
    let (x, y, z) = (new("x.img"), new("y.img"), new("z.img"));
    let refusals = [
        (format!("{},{}", text(&x), text(&y)), "2", "at least 3"),
        (format!("{},{},{}", text(&x), text(&y), text(&x)), "1", "named twice"),
        (format!("{},{},{}", text(&x), text(&y), text(&names[0])), "1", "already holds"),
        (format!("{},{},{}", text(&x), text(&y), text(&z)), "5", "1..=4"),
    ];
    for (devices, parity, words) in refusals {
        assert_one_line_failure(&tandem(&["mkfs", "--devices", &devices, "--parity", parity, "--size", "24M"]), words);
    }
    std::fs::File::create(&x).unwrap().set_len(24 << 20).unwrap();
    std::fs::File::create(&y).unwrap().set_len(20 << 20).unwrap();
    let sizes = format!("{},{}", text(&x), text(&y));
    assert_one_line_failure(&tandem(&["mkfs", "--devices", &sizes, "--parity", "1"]), "the same size");
    std::fs::hard_link(&names[0], new("link.img")).unwrap();
    let twice = format!("{},{},{}", text(&names[0]), text(&new("link.img")), text(&x));
    assert_one_line_failure(&tandem(&["mkfs", "--devices", &twice, "--parity", "1", "--force"]), "the same device");
    assert!(!z.exists(), "a refused mkfs left a member behind");
    let after: Vec<Vec<u8>> = names.iter().map(|path| std::fs::read(path).unwrap()).collect();
    assert!(before == after, "a refusal wrote to the array");
    // A member of another array mixed in at mount time.
    let other = ["p", "q", "r"].map(|name| scratch.join(&format!("{name}.img")));
    let other_list = other.iter().map(|path| text(path)).collect::<Vec<_>>().join(",");
    let made = tandem(&["mkfs", "--devices", &other_list, "--parity", "1", "--size", "24M"]);
    assert_eq!(made.status.code(), Some(0), "{}", stderr(&made));
    let mixed = format!("{},{}", text(&names[0]), text(&other[0]));
    assert_one_line_failure(&tandem(&["fsck", &mixed]), "give the members of one array");
    // A member lost for good, rebuilt onto a new image: the array is whole again.
    std::fs::remove_file(&names[4]).unwrap();
    let replacement = scratch.join("e2.img");
    let rebuilt = tandem(&["rebuild", text(&names[0]), "--slot", "4", "--device", text(&replacement)]);
    assert_eq!(rebuilt.status.code(), Some(0), "{}", stderr(&rebuilt));
    assert!(stdout(&rebuilt).contains("0 slots still missing"), "{}", stdout(&rebuilt));
    assert_one_line_failure(
        &tandem(&["rebuild", text(&names[0]), "--slot", "4", "--device", text(&scratch.join("e3.img"))]),
        "not missing",
    );
    assert_eq!(tandem(&["status", text(&names[0])]).status.code(), Some(0));
    let checked = tandem(&["fsck", text(&replacement)]);
    assert_eq!(checked.status.code(), Some(0), "{}{}", stdout(&checked), stderr(&checked));
}

/// An encrypted volume on an array: mkfs takes --encrypt with --devices, a bad key file leaves
/// no member behind, and fsck, stat and scrub work from one member (fsck and stat with the key;
/// scrub, which compares ciphertext with parity, without it).
#[test]
fn an_encrypted_array_is_made_and_checked_from_one_member() {
    let scratch = Scratch::new("encrypted-array");
    let names = ["a", "b", "c", "d"].map(|name| scratch.join(&format!("{name}.img")));
    let list = names.iter().map(|path| text(path)).collect::<Vec<_>>().join(",");
    let key = scratch.join("key");
    std::fs::write(&key, (0..64u8).map(|byte| byte.wrapping_mul(29)).collect::<Vec<u8>>()).unwrap();
    let short = scratch.join("short-key");
    std::fs::write(&short, [1u8; 10]).unwrap();
    let base = ["mkfs", "--devices", &list, "--parity", "2", "--size", "24M", "--encrypt", "--kdf-time-ms", "1"];
    let refused = tandem(&[&base[..], &["--key-file", text(&short)]].concat());
    assert_one_line_failure(&refused, "exactly 64");
    assert!(names.iter().all(|path| !path.exists()), "a refused mkfs left a member behind");
    let made = tandem(&[&base[..], &["--key-file", text(&key)]].concat());
    assert_eq!(made.status.code(), Some(0), "{}", stderr(&made));
    assert!(stdout(&made).contains("created encrypted tandemfs on an array of 4 devices"), "{}", stdout(&made));
    assert!(stdout(&made).contains("AES-256-XTS"), "{}", stdout(&made));
    assert_one_line_failure(&tandem(&["fsck", text(&names[2])]), "is encrypted: give --key-file");
    let checked = tandem(&["fsck", "--key-file", text(&key), text(&names[2])]);
    assert_eq!(checked.status.code(), Some(0), "{}{}", stdout(&checked), stderr(&checked));
    let stat = tandem(&["stat", "--key-file", text(&key), text(&names[1])]);
    assert_eq!(stat.status.code(), Some(0), "{}", stderr(&stat));
    let scrubbed = tandem(&["scrub", text(&names[0])]);
    assert_eq!(scrubbed.status.code(), Some(0), "{}{}", stdout(&scrubbed), stderr(&scrubbed));
}

/// `tandem scrub` checks the volume's checksums as well as parity. A file's block overwritten
/// through the array (data and parity agree on the wrong bytes, so parity finds nothing) is
/// reported with its inode, file offset and block, and --repair cannot bring it back (exit 4).
/// Another block flipped on one member only is rebuilt from the others and rewritten by the
/// checksum pass before parity is looked at.
#[test]
fn scrub_checks_the_volumes_checksums_and_names_what_it_cannot_repair() {
    use std::sync::Arc;
    use tandemfs::device::array::{self, Member};
    use tandemfs::device::{Device, FileDevice, FileDeviceOptions};
    use tandemfs::fs::{FileType, MountOptions, ROOT_INODE};
    let scratch = Scratch::new("scrub-checksums");
    let names = ["a", "b", "c", "d"].map(|name| scratch.join(&format!("{name}.img")));
    let list = names.iter().map(|path| text(path)).collect::<Vec<_>>().join(",");
    let created = tandem(&["mkfs", "--devices", &list, "--parity", "2", "--size", "24M", "--stripe-unit", "16K"]);
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    let open_array = || {
        let members = names
            .iter()
            .map(|path| Member {
                name: text(path).to_string(),
                device: Arc::new(FileDevice::open(path, FileDeviceOptions::default()).unwrap()) as Arc<dyn Device>,
            })
            .collect();
        Arc::new(array::assemble(members, tandemfs::block::volume::default_accelerator()).unwrap().device)
    };
    let data: Vec<u8> = (0..4 * 4096u32).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let array = open_array();
    let options = MountOptions { background_backend: false, ..MountOptions::default() };
    let (fs, _) = tandemfs::FileSystem::mount(array.clone(), &options).unwrap();
    let file = fs.create(ROOT_INODE, b"f", FileType::Regular, 0o644, 0, 0, 0).unwrap();
    fs.write(file.inode, 0, &data).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    // The home copy of the file's second block, found in the array's logical bytes.
    let mut logical = vec![0u8; array.size_bytes() as usize];
    array.read_at(0, &mut logical).unwrap();
    let homes: Vec<usize> =
        (0..logical.len() - 4096).step_by(4096).filter(|at| logical[*at..*at + 4096] == data[4096..8192]).collect();
    assert!(!homes.is_empty(), "the file's block was not found");
    for &at in &homes {
        array.write_at(at as u64 + 100, &[!data[4096 + 100]]).unwrap();
    }
    array.close().unwrap();
    drop(array);
    let scrubbed = tandem(&["scrub", text(&names[0])]);
    let said = stdout(&scrubbed);
    assert_eq!(scrubbed.status.code(), Some(1), "{said}{}", stderr(&scrubbed));
    let place = format!("volume: inode {}: file offset 4096: data block {}", file.inode, homes.last().unwrap() / 4096);
    assert!(said.contains(&place), "{said}");
    assert!(said.contains("0 blocks wrong"), "parity agrees with the wrong bytes: {said}");
    let repaired = tandem(&["scrub", "--repair", text(&names[0])]);
    assert_eq!(repaired.status.code(), Some(4), "{}{}", stdout(&repaired), stderr(&repaired));
    assert!(stdout(&repaired).contains(&place), "{}", stdout(&repaired));

    // The third block flipped on its member only: rebuilt by the checksum pass.
    let third = &data[8192..12288];
    let mut flipped = 0;
    for path in &names {
        let mut bytes = std::fs::read(path).unwrap();
        let found: Vec<usize> =
            (0..bytes.len() - 4096).step_by(4096).filter(|at| bytes[*at..*at + 4096] == *third).collect();
        for at in &found {
            bytes[at + 7] ^= 0x40;
            flipped += 1;
        }
        std::fs::write(path, &bytes).unwrap();
    }
    assert!(flipped >= 1, "the third block was not found on a member");
    let healed = tandem(&["scrub", "--repair", text(&names[0])]);
    let said = stdout(&healed);
    assert!(said.contains("1 blocks rebuilt from the other members"), "{said}{}", stderr(&healed));
    assert!(said.contains("0 blocks wrong"), "the checksum pass repaired it before parity: {said}");
}

/// `tandem rebuild` of a mounted array: the mount rebuilds the slot while it serves (through
/// its control socket), named by the mount point or by a member; bad requests are one line
/// each with nothing written; afterwards the new member carries the volume with two others gone.
#[test]
fn rebuild_of_a_mounted_array_goes_through_the_mount() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let scratch = Scratch::new("mounted-rebuild");
    let names: Vec<PathBuf> =
        ["a", "b", "c", "d", "e"].iter().map(|name| scratch.join(&format!("{name}.img"))).collect();
    let list = names.iter().map(|path| text(path)).collect::<Vec<_>>().join(",");
    let made = tandem(&["mkfs", "--devices", &list, "--parity", "2", "--size", "24M"]);
    assert_eq!(made.status.code(), Some(0), "{}", stderr(&made));
    let away = scratch.join("away");
    std::fs::create_dir_all(&away).unwrap();
    std::fs::rename(&names[4], away.join("e.img")).unwrap();
    let point = scratch.join("mnt");
    std::fs::create_dir_all(&point).unwrap();
    let log = scratch.join("mount.log");
    let mounted = tandem(&["mount", text(&names[0]), text(&point), "-d", "--log-file", text(&log)]);
    assert_eq!(mounted.status.code(), Some(0), "{}", stderr(&mounted));
    let mount = Mounted { point: point.clone() };
    let bytes = pattern_bytes(3 << 20, 7);
    std::fs::write(mount.join("data"), &bytes).unwrap();
    let new = scratch.join("new.img");
    let small = scratch.join("small.img");
    std::fs::File::create(&small).unwrap().set_len(2 << 20).unwrap();
    let refusals = [
        (text(&point), "0", text(&new), None, "slot 0 is not missing"),
        (text(&point), "9", text(&new), None, "slot 9 is not missing"),
        (text(&names[0]), "4", text(&names[1]), Some("--force"), "the same device"),
        (text(&point), "4", text(&small), Some("--force"), "cannot take slot 4"),
        (text(&point), "4", text(&small), None, "exists"),
        (text(&scratch.path), "4", text(&new), None, "not the mount point of a mounted tandemfs array"),
    ];
    // (The members themselves change under the mount; the library test checks that a refused
    // rebuild leaves them alone.)
    for (array, slot, device, force, words) in refusals {
        let mut arguments = vec!["rebuild", array, "--slot", slot, "--device", device];
        arguments.extend(force);
        assert_one_line_failure(&tandem(&arguments), words);
    }
    assert!(!new.exists(), "a refused rebuild left the new member behind");
    assert!(std::fs::read(&small).unwrap().iter().all(|&byte| byte == 0), "a refused rebuild wrote");
    let rebuilt = tandem_within(&["rebuild", text(&point), "--slot", "4", "--device", text(&new)], None, 120);
    assert_eq!(rebuilt.status.code(), Some(0), "{}", stderr(&rebuilt));
    assert!(stdout(&rebuilt).contains("0 slots still missing"), "{}", stdout(&rebuilt));
    assert!(stderr(&rebuilt).contains("rebuild: 100%"), "{}", stderr(&rebuilt));
    // Named by a member now: nothing is missing.
    assert_one_line_failure(
        &tandem(&["rebuild", text(&names[0]), "--slot", "4", "--device", text(&scratch.join("e3.img"))]),
        "slot 4 is not missing",
    );
    assert!(std::fs::read(mount.join("data")).unwrap() == bytes);
    std::fs::write(mount.join("after"), &bytes[..100_000]).unwrap();
    let unmounted = tandem(&["umount", text(&point)]);
    assert_eq!(unmounted.status.code(), Some(0), "{}", stderr(&unmounted));
    std::mem::forget(mount);
    // Closed by the mount before umount returned: clean at once.
    let status = tandem(&["status", text(&names[0])]);
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    assert!(stdout(&status).lines().next().unwrap().ends_with(", clean"), "{}", stdout(&status));
    // The new member with two others gone carries the volume.
    for name in [&names[0], &names[2]] {
        std::fs::rename(name, away.join(name.file_name().unwrap())).unwrap();
    }
    let checked = tandem(&["fsck", text(&new)]);
    assert_eq!(checked.status.code(), Some(0), "{}{}", stdout(&checked), stderr(&checked));
}
