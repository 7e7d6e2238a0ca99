//! The command's one error type: a message for the user and the exit code it maps to.
//!
//! Exit codes are part of the interface (docs/CLI.md): scripts branch on them, so every failure
//! goes through here rather than through ad-hoc `process::exit` calls.

use std::fmt;

/// Exit code: the command did what was asked.
pub const EXIT_SUCCESS: i32 = 0;
/// Exit code of `tandem fsck` when the volume has problems (the report lists them).
pub const EXIT_PROBLEMS_FOUND: i32 = 1;
/// Exit code of `tandem fsck --repair` when problems remain that it could not repair.
pub const EXIT_PROBLEMS_REMAIN: i32 = 4;
/// Exit code for bad usage or when the command could not do its work (missing image, I/O error,
/// refusal to overwrite, mount failure).
pub const EXIT_FAILURE: i32 = 2;

/// Exit code after SIGINT or SIGTERM stopped the demo or a benchmark (128 + SIGINT, as shells do).
pub const EXIT_INTERRUPTED: i32 = 130;

/// A failure to report on one line, with its exit code.
#[derive(Debug)]
pub struct CliError {
    pub message: String,
    pub exit_code: i32,
}

impl CliError {
    pub fn new(message: impl Into<String>) -> CliError {
        CliError { message: message.into(), exit_code: EXIT_FAILURE }
    }
    pub fn with_code(message: impl Into<String>, exit_code: i32) -> CliError {
        CliError { message: message.into(), exit_code }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.message)
    }
}

pub type CliResult<T> = Result<T, CliError>;

/// An engine error in the user's words: "invalid argument: " adds nothing when the text after it
/// already says what was wrong.
pub fn describe(error: &tandemfs::Error) -> String {
    match error {
        tandemfs::Error::InvalidArgument(what) => what.clone(),
        other => other.to_string(),
    }
}
