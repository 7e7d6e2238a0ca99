//! Errors of the accelerator runtime.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccelError {
    /// A caller passed arguments that do not fit the service (sizes, shapes, keys).
    InvalidArgument(String),
    /// More shards are missing than the code has parity shards.
    TooManyErasures { missing: usize, tolerated: usize },
    /// The CUDA engine failed (driver, NVRTC or kernel error); the message says which call.
    Device(String),
    /// The runtime is shutting down or its queue is closed.
    ShutDown,
}

impl fmt::Display for AccelError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AccelError::InvalidArgument(message) => {
                write!(formatter, "invalid argument: {message}")
            }
            AccelError::TooManyErasures { missing, tolerated } => {
                write!(formatter, "{missing} shards missing, the code tolerates {tolerated}")
            }
            AccelError::Device(message) => write!(formatter, "GPU engine: {message}"),
            AccelError::ShutDown => write!(formatter, "accelerator runtime is shut down"),
        }
    }
}

impl std::error::Error for AccelError {}

pub type Result<T> = std::result::Result<T, AccelError>;
