//! Secrets of encrypted volumes on the command line: `--key-file FILE` (exactly 64 bytes), or a
//! passphrase asked on the terminal (twice where a new one is set). Without a terminal and
//! without a key file an encrypted volume is a one-line error. Every command that opens a
//! volume goes through [`unlock`], which leaves a plain volume's device as it is.

use crate::error::{describe, CliError, CliResult};
use std::io::{BufRead, IsTerminal};
use std::path::Path;
use std::sync::Arc;
use tandemfs::crypt::{self, Secret};
use tandemfs::device::Device;
use zeroize::Zeroizing;

/// Set by a background mount's parent for its child: the passphrase the parent asked for
/// arrives on the child's standard input (a pipe), one line, since the child has no terminal.
pub const PASSPHRASE_ON_STDIN_VARIABLE: &str = "TANDEM_PASSPHRASE_ON_STDIN";

/// What a passphrase is asked for: to open a volume (once) or to set a new one (twice).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    Open,
    New,
}

/// The secret from `key_file`, or else a passphrase from the terminal.
pub fn obtain(image: &Path, key_file: Option<&Path>, ask: Ask) -> CliResult<Secret> {
    if let Some(path) = key_file {
        return Secret::from_key_file(path).map_err(|error| CliError::new(describe(&error)));
    }
    if ask == Ask::Open && std::env::var_os(PASSPHRASE_ON_STDIN_VARIABLE).is_some() {
        let mut line = Zeroizing::new(String::new());
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(|error| CliError::new(format!("cannot read the passphrase from the mount's parent: {error}")))?;
        let passphrase = line.trim_end_matches(['\n', '\r']).to_string();
        return Secret::from_passphrase(passphrase).map_err(|error| CliError::new(describe(&error)));
    }
    if !std::io::stdin().is_terminal() {
        return Err(CliError::new(match ask {
            Ask::Open => format!("{} is encrypted: give --key-file FILE or its passphrase", image.display()),
            Ask::New => format!(
                "no terminal to ask for a passphrase for {}: give --key-file FILE (head -c 64 /dev/urandom > FILE)",
                image.display()
            ),
        }));
    }
    let mut first = prompt_once(image)?;
    if ask == Ask::New {
        let second = prompt("Repeat the passphrase: ")?;
        if first != second {
            return Err(CliError::new("the two passphrases differ; nothing was written"));
        }
    }
    Secret::from_passphrase(std::mem::take(&mut *first)).map_err(|error| CliError::new(describe(&error)))
}

/// Asks for the passphrase of `image` once on the terminal (a background mount's parent,
/// which hands it to its child).
pub fn prompt_once(image: &Path) -> CliResult<Zeroizing<String>> {
    prompt(&format!("Passphrase for {}: ", image.display()))
}

fn prompt(text: &str) -> CliResult<Zeroizing<String>> {
    rpassword::prompt_password(text)
        .map(Zeroizing::new)
        .map_err(|error| CliError::new(format!("cannot read a passphrase from the terminal: {error}")))
}

/// The device to use for the volume on `device`: itself when the volume is plain, else the
/// decrypting device the secret (from `key_file` or the terminal) opens. Warns on stderr about
/// damaged key slots. Only reads: a wrong key writes nothing.
pub fn unlock(image: &Path, device: Arc<dyn Device>, key_file: Option<&Path>) -> CliResult<Arc<dyn Device>> {
    // A volume without a valid superblock is the command's to report, in its own words (fsck
    // lists it as a problem): only a volume known to be encrypted needs a key.
    if !crypt::is_encrypted(device.as_ref()).unwrap_or(false) {
        return Ok(device);
    }
    let secret = obtain(image, key_file, Ask::Open)?;
    let unlocked = crypt::unlock_with_report(device, Some(&secret))
        .map_err(|error| CliError::new(format!("{}: {}", image.display(), describe(&error))))?;
    for (index, why) in &unlocked.damaged_slots {
        eprintln!(
            "{}: warning: key slot {index} is damaged ({why}); slot {} opened the volume",
            image.display(),
            unlocked.slot.unwrap_or(0)
        );
    }
    Ok(unlocked.device)
}
