//! The C entry point from C: formats a fresh image with a known tree, compiles
//! tests/c/batch_test.c against include/tandem_batch.h and the cdylib with the `cc` crate's
//! compiler, runs it on the image, and compares each path it resolved in one C batch with the
//! single call `resolve_path` on the same image. The C program itself checks the argument
//! checks (null pointers, counts, lengths, overlapping arrays, stale handles) and known names.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tandemfs::device::{FileDevice, FileDeviceOptions};
use tandemfs::fs::{FileType, FormatOptions, MountOptions, ROOT_INODE};
use tandemfs::FileSystem;

const IMAGE_BYTES: u64 = 64 << 20;

/// Removes the scratch directory at the end, also after a failed assertion.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open_image(path: &Path, create: bool) -> Arc<FileDevice> {
    let options =
        FileDeviceOptions { create_size_bytes: create.then_some(IMAGE_BYTES), lock_exclusive: true, read_only: false };
    Arc::new(FileDevice::open(path, options).unwrap())
}

/// A tree with directories, files, symbolic links (relative, absolute, a loop) and long names;
/// returns the paths to resolve (one a line, so no newline in any name).
fn make_tree(path: &Path) -> Vec<String> {
    let device = open_image(path, true);
    FileSystem::format(device.clone(), &FormatOptions::default()).unwrap();
    let (fs, _) = FileSystem::mount(device, &MountOptions::default()).unwrap();
    let a = fs.make_directory(ROOT_INODE, b"a", 0o755, 0, 0).unwrap().inode;
    let b = fs.make_directory(a, b"b", 0o750, 0, 0).unwrap().inode;
    let mut paths = Vec::new();
    for file in 0..200 {
        fs.create(b, format!("f{file}").as_bytes(), FileType::Regular, 0o644, 0, 0, 0).unwrap();
        paths.push(format!("a/b/f{file}"));
        paths.push(format!("/a/./b//f{file}"));
        paths.push(format!("a/b/f{file}/x"));
        paths.push(format!("a/b/missing{file}"));
    }
    fs.create(ROOT_INODE, "l".repeat(255).as_bytes(), FileType::Regular, 0o600, 0, 0, 0).unwrap();
    fs.symlink(a, b"up", b"..", 0, 0).unwrap();
    fs.symlink(ROOT_INODE, b"abs", b"/a/b", 0, 0).unwrap();
    fs.symlink(ROOT_INODE, b"loop", b"loop", 0, 0).unwrap();
    paths.extend(
        [
            "",
            "/",
            "a",
            "a/b",
            "a/up/a/b/f7",
            "abs/f9",
            "abs",
            "loop",
            "loop/x",
            "a/b/../../a/b/f3",
            "..",
            &"l".repeat(255),
            &"l".repeat(256),
            &format!("a/{}", "x".repeat(5000)),
        ]
        .map(String::from),
    );
    fs.unmount().unwrap();
    paths
}

/// Compiles batch_test.c with the `cc` crate's C compiler, linked to the cdylib beside this
/// test's executable.
fn compile(output: &Path) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let include = manifest.join("../../include");
    let source = manifest.join("tests/c/batch_test.c");
    // The cdylib is built with the library, into the directory that holds this test.
    let library_directory = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    assert!(
        library_directory.join("libtandem_capi.so").is_file(),
        "no libtandem_capi.so in {}",
        library_directory.display()
    );
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let compiler = cc::Build::new().cargo_metadata(false).target(&target).host(&target).opt_level(1).get_compiler();
    let mut command = compiler.to_command();
    command
        .arg("-std=c11")
        .arg("-Wall")
        .arg("-Wextra")
        .arg("-Werror")
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .arg("-o")
        .arg(output)
        .arg("-L")
        .arg(&library_directory)
        .arg("-ltandem_capi")
        // RPATH (not RUNPATH) and no LD_LIBRARY_PATH when it runs: cargo's LD_LIBRARY_PATH
        // also names target/release, whose copy of the library only `cargo build` refreshes.
        .arg("-Wl,--disable-new-dtags")
        .arg(format!("-Wl,-rpath,{}", library_directory.display()));
    let status = command.status().unwrap();
    assert!(status.success(), "compiling {}: {status}", source.display());
}

#[test]
fn c_program_resolves_like_the_single_calls() {
    let scratch = Scratch(std::env::temp_dir().join(format!("tandem-capi-test-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).unwrap();
    let image = scratch.0.join("volume.img");
    let paths = make_tree(&image);
    let list = scratch.0.join("paths.txt");
    std::fs::write(&list, paths.join("\n") + "\n").unwrap();
    let program = scratch.0.join("batch_test");
    compile(&program);

    let output = Command::new(&program).env_remove("LD_LIBRARY_PATH").arg(&image).arg(&list).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "batch_test: {}\n{stderr}", output.status);
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), paths.len(), "one line per path");

    let (fs, _) = FileSystem::mount(open_image(&image, false), &MountOptions::default()).unwrap();
    let mut found = 0;
    for (path, line) in paths.iter().zip(&lines) {
        let expected = match fs.resolve_path(path.as_bytes()) {
            Ok(attributes) => {
                found += 1;
                format!("0 {} {:o}", attributes.inode, attributes.mode())
            }
            // The C edge refuses a path past TANDEM_PATH_MAX before reading it; the single
            // call answers it by its component that is too long.
            Err(error) => format!("{} 0 0", -tandem_fuse::errno_of(&error)),
        };
        assert_eq!(*line, expected, "path {path:?}");
    }
    assert!(found > 400, "only {found} paths found");
    fs.unmount().unwrap();
}
