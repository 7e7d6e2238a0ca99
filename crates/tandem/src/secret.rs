//! Where a command's secrets come from: a key file (exactly 64 bytes) when one is given, else a
//! passphrase typed on the terminal (asked once to open a volume, twice for a new one), else a
//! one-line error saying which option to give. Nothing is asked for when no terminal is there
//! to answer: a script gets the error at once instead of a hang.

use crate::error::{describe, CliError, CliResult};
use std::io::IsTerminal;
use std::path::Path;
use tandemfs::crypt::Secret;
use zeroize::Zeroizing;

/// Whether a person can be asked: standard input is a terminal (the prompt itself reads the
/// controlling terminal, so piped input is never taken for a passphrase).
fn can_prompt() -> bool {
    std::io::stdin().is_terminal()
}

/// The contents of a key file, which must hold exactly 64 bytes.
pub fn key_file(path: &Path) -> CliResult<Secret> {
    Secret::from_key_file(path).map_err(|error| CliError::new(describe(&error)))
}

fn prompt(question: &str) -> CliResult<String> {
    rpassword::prompt_password(question).map_err(|error| CliError::new(format!("cannot read the passphrase: {error}")))
}

fn passphrase(text: String) -> CliResult<Secret> {
    Secret::from_passphrase(text).map_err(|error| CliError::new(describe(&error)))
}

/// The secret that opens the volume on `image`: `key_file`, or its passphrase asked once.
pub fn opening(image: &Path, key_file_path: Option<&Path>) -> CliResult<Secret> {
    if let Some(path) = key_file_path {
        return key_file(path);
    }
    if !can_prompt() {
        return Err(CliError::new(format!(
            "{} is encrypted: give --key-file FILE or its passphrase (no terminal to ask for it)",
            image.display()
        )));
    }
    passphrase(prompt(&format!("Passphrase for {}: ", image.display()))?)
}

/// A new secret: `key_file`, or a new passphrase asked twice (the two must match).
/// `option` names the key file option in the error for a run without a terminal.
pub fn new(key_file_path: Option<&Path>, option: &str) -> CliResult<Secret> {
    if let Some(path) = key_file_path {
        return key_file(path);
    }
    if !can_prompt() {
        return Err(CliError::new(format!(
            "give {option} FILE for the new key (no terminal to ask for a new passphrase)"
        )));
    }
    // Both answers are wiped when they go; the Secret keeps (and wipes) its own copy.
    let first = Zeroizing::new(prompt("New passphrase: ")?);
    let second = Zeroizing::new(prompt("Repeat the new passphrase: ")?);
    if *first != *second {
        return Err(CliError::new("the two passphrases differ; nothing was changed"));
    }
    passphrase(String::clone(&first))
}
