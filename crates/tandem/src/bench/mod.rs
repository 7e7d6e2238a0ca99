//! Benchmarks: `meta` (library path), `mount` (through FUSE), `log` (parallel log appends),
//! `memory` (the front end's caches), `services` (the accelerator), `gpu-dir` (the batch API) and
//! `flex` (inserts and collapses at any byte, beside FlexSpace), `device` (the file device's
//! transports beside fio), `raid` (erasure-coded arrays beside md RAID-6).
//! Each compares tandemfs with ext4 on the same medium; docs/BENCHMARKS.md says how to read them.

pub mod cpu;
pub mod device;
pub mod dmcrypt;
pub mod ext4;
pub mod flex;
pub mod flex_model;
pub mod flexspace;
pub mod gocryptfs;
pub mod gpu_dir;
pub mod library;
pub mod log;
pub mod memory;
pub mod meta;
pub mod mount;
pub mod passthrough;
pub mod peers;
pub mod raid;
pub mod requests;
pub mod scaling;
pub mod system;
pub mod table;
pub mod workload;

use crate::error::{CliError, CliResult, EXIT_SUCCESS};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct ServicesArguments {
    /// Arguments passed on to the accelerator's benchmark (try 'tandem bench services --help')
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub arguments: Vec<String>,
}

pub fn run_services(arguments: ServicesArguments) -> CliResult<i32> {
    // The accelerator's error carries its whole help text; keep the promise of one line.
    let report = tandem_accel::bench::run_services(&arguments.arguments).map_err(|error| {
        let first = error.lines().find(|line| !line.trim().is_empty()).unwrap_or("failed").trim();
        CliError::new(format!("bench services: {first} (see 'tandem bench services --help')"))
    })?;
    print!("{report}");
    if !report.ends_with('\n') {
        println!();
    }
    Ok(EXIT_SUCCESS)
}

/// Where benchmark images go: /dev/shm keeps the medium the same (RAM) for tandemfs and ext4 and
/// takes the disk out of the comparison; elsewhere the temporary directory.
pub fn scratch_directory() -> PathBuf {
    let shared_memory = PathBuf::from("/dev/shm");
    if shared_memory.is_dir() {
        shared_memory
    } else {
        std::env::temp_dir()
    }
}

/// Free bytes on the file system holding `path`, if statvfs can tell.
/// Refuses to start when `scratch` cannot hold a volume of `needed` bytes (images are made one at
/// a time, so one volume's worth is enough); `remedy` says which option lowers the need.
pub fn require_free_space(scratch: &std::path::Path, needed: u64, remedy: &str) -> CliResult<()> {
    match free_bytes(scratch) {
        Some(free) if free < needed => Err(CliError::new(format!(
            "{} has {} free; a volume of {} is needed ({remedy})",
            scratch.display(),
            crate::size::format_bytes(free),
            crate::size::format_bytes(needed)
        ))),
        _ => Ok(()),
    }
}

fn free_bytes(path: &std::path::Path) -> Option<u64> {
    let text = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let mut statistics: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes only into the struct we own.
    if unsafe { libc::statvfs(text.as_ptr(), &mut statistics) } != 0 {
        return None;
    }
    Some(statistics.f_bavail as u64 * statistics.f_frsize as u64)
}

/// A scratch file removed when this goes out of scope, also on an error or a panic.
pub struct ScratchFile {
    pub path: PathBuf,
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs one column's measurement, turning a panic inside the engine into that column's error so
/// the other columns and the clean-up still happen. The panic's own message has already been
/// printed by then.
pub fn contain_panic<T>(label: &str, body: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|text| text.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(format!("{label} panicked: {message}"))
        }
    }
}
