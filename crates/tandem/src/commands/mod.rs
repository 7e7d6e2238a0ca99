//! One module per subcommand; each has its clap arguments and a `run` returning an exit code.

pub mod demo;
pub mod edit;
pub mod fsck;
pub mod key;
pub mod mkfs;
pub mod mount;
pub mod stat;
