//! Errors of the accelerator runtime.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccelError {
    /// A caller passed arguments that do not fit the service (sizes, shapes, keys).
    InvalidArgument(String),
    /// More shards are missing than the code has parity shards.
    TooManyErasures { missing: usize, tolerated: usize },
    /// The CUDA engine failed (driver, NVRTC or kernel error); the message says which call.
    /// Where a GPU is present and this is what opening an engine answers, the engine is broken
    /// (a kernel NVRTC or ptxas refuses, an allocation or a launch that fails): tests fail on
    /// it rather than skip.
    Device(String),
    /// There is no GPU to use, for a reason of the machine's and not of the code's: no CUDA
    /// driver (`libcuda` missing or a stub), no CUDA device, no `libnvrtc`, or no device of a
    /// compute capability the kernels need. Only this is a reason for a GPU test to skip.
    NoGpu(String),
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
            AccelError::NoGpu(message) => write!(formatter, "no GPU: {message}"),
            AccelError::ShutDown => write!(formatter, "accelerator runtime is shut down"),
        }
    }
}

impl std::error::Error for AccelError {}

impl AccelError {
    /// Whether this says that the machine has no GPU to use (see [`AccelError::NoGpu`]), as
    /// opposed to a GPU that is there and failed.
    pub fn is_no_gpu(&self) -> bool {
        matches!(self, AccelError::NoGpu(_))
    }
}

pub type Result<T> = std::result::Result<T, AccelError>;
