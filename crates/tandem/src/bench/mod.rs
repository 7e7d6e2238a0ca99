//! Benchmarks: `meta` (library path), `mount` (through FUSE) and `services` (the accelerator).
//! Each compares tandemfs with ext4 on the same medium; docs/BENCHMARKS.md says how to read them.

pub mod ext4;
pub mod library;
pub mod meta;
pub mod mount;
pub mod passthrough;
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
    let report = accel_bench::run_services(&arguments.arguments).map_err(CliError::new)?;
    print!("{report}");
    if !report.ends_with('\n') {
        println!();
    }
    Ok(EXIT_SUCCESS)
}

/// TEMPORARY stand-in for `tandem_accel::bench` until it lands on main; then this module becomes
/// `use tandem_accel::bench as accel_bench;` with the same call.
mod accel_bench {
    pub fn run_services(_arguments: &[String]) -> Result<String, String> {
        Err("this build of tandem has no accelerator benchmark (tandem_accel::bench is missing)".into())
    }
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
pub fn free_bytes(path: &std::path::Path) -> Option<u64> {
    let text = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let mut statistics: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes only into the struct we own.
    if unsafe { libc::statvfs(text.as_ptr(), &mut statistics) } != 0 {
        return None;
    }
    Some(statistics.f_bavail as u64 * statistics.f_frsize as u64)
}
