//! Helpers of the `lockhub provision` command line: a secret read from a
//! file, a `--pin-key` argument, and the summary printed at the end (which
//! names files and keys, never a secret).

use super::*;

/// Reads a base64url secret from a file (`--hub-key-file`,
/// `--pin-key ID=@FILE`): the first non-empty, non-comment line.
pub fn read_secret_file(path: &Path) -> Result<String, ProvisionError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProvisionError::Read {
        path: path.to_owned(),
        source,
    })?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .ok_or_else(|| invalid(format!("{} holds no key", path.display())))
}

/// Parses `--pin-key ID` (generate) or `--pin-key ID=@FILE` (read it).
/// An inline secret (`ID=SECRET`) is refused: command lines are visible to
/// every user of the machine.
pub fn parse_pin_key_arg(arg: &str) -> Result<(String, PinKeySource), ProvisionError> {
    match arg.split_once('=') {
        None => Ok((arg.to_owned(), PinKeySource::Generate)),
        Some((id, rest)) => match rest.strip_prefix('@') {
            Some(file) => Ok((
                id.to_owned(),
                PinKeySource::Given(read_secret_file(Path::new(file))?),
            )),
            None => Err(invalid(format!(
                "--pin-key {id}=...: give the secret as @FILE, never on the command line"
            ))),
        },
    }
}

/// The human summary `provision` prints. Never a secret.
pub fn summary(p: &Provisioned) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "wrote {} (mode {:04o})\n",
        p.config.display(),
        CONFIG_MODE
    ));
    s.push_str(&format!(
        "wrote {} (mode {:04o})\n",
        p.secrets.display(),
        SECRETS_MODE
    ));
    s.push_str(&format!("hub {} of site {}\n", p.hub_id, p.site_id));
    s.push_str(&format!(
        "PIN keys: {}{}\n",
        p.pin_key_ids.join(", "),
        if p.pin_keys_generated.is_empty() {
            String::new()
        } else {
            format!(" (generated here: {})", p.pin_keys_generated.join(", "))
        }
    ));
    if !p.reader_keys_generated.is_empty() {
        s.push_str(&format!(
            "OSDP reader keys generated for: {}; with the daemon stopped, run \
             `lockhub osdp install --config {} --reader NAME` for each\n",
            p.reader_keys_generated.join(", "),
            p.config.display()
        ));
    }
    if !p.boards_to_pair.is_empty() {
        s.push_str(&format!(
            "Lock boards to pair (their link keys come from the boards): {}; with the daemon \
             stopped and each board in pairing mode, run `lockhub board pair --config {} \
             --serial NAME` for each (the daemon refuses a board with no key)\n",
            p.boards_to_pair.join(", "),
            p.config.display()
        ));
    }
    s.push_str("Register this hub public key with the cloud:\n");
    s.push_str(&format!("hub_public_key = {}\n", p.hub_public_key));
    s
}
