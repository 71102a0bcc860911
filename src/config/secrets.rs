//! The secrets file: `[hub_key]`, `[[pin_key]]`, `[[reader_key]]`,
//! `[[board_key]]`. Nothing
//! in it is ever echoed in a message.

use super::*;

/// What the secrets file gave: the secrets when all of it is valid, and
/// the readers its `[[reader_key]]` tables name whenever those can be told
/// (so a reader with no key is reported beside the file's other problems).
pub(super) struct SecretsRead {
    pub secrets: Option<Secrets>,
    pub keyed_readers: Option<Vec<String>>,
    /// Likewise the serials its `[[board_key]]` tables name.
    pub keyed_boards: Option<Vec<String>>,
}

/// Reads the secrets file named at `span` in hub.toml. Its own problems are
/// reported with its own path; a file that cannot be opened at all is
/// reported at `span`. No message ever holds a secret value.
pub(super) fn read_secrets(
    hub: &mut Diag<'_>,
    errors: &mut Vec<ConfigError>,
    file: &Path,
    span: &Range<usize>,
    serial_names: &Option<Vec<String>>,
) -> SecretsRead {
    let unread = SecretsRead {
        secrets: None,
        keyed_readers: None,
        keyed_boards: None,
    };
    let Some(meta) = check_file(hub, "file", file, span) else {
        return unread;
    };
    let mode_before = hub.errors.len();
    check_private(hub, "file", "the secrets file", file, &meta, span);
    let mode_ok = hub.errors.len() == mode_before;
    let text = match read_text(file) {
        Ok(t) => t,
        Err(ReadError::Io(e)) => {
            hub.at(
                span.clone(),
                format!("secrets file {} {}", file.display(), io_message(&e)),
            );
            return unread;
        }
        Err(ReadError::Utf8 { line, column }) => {
            errors.push(ConfigError {
                file: file.to_path_buf(),
                line: Some(line),
                column: Some(column),
                message: "not valid UTF-8".to_owned(),
            });
            return unread;
        }
    };
    let mut d = Diag::new(file, &text, true);
    let mut read = parse_secrets(&mut d, &text, serial_names);
    errors.append(&mut d.errors);
    if !mode_ok {
        read.secrets = None;
    }
    read
}

/// `serial_names`: the `[[serial]]` names of hub.toml, when all of them
/// could be read (a `[[board_key]]` for another serial is refused).
pub(super) fn parse_secrets(
    d: &mut Diag<'_>,
    text: &str,
    serial_names: &Option<Vec<String>>,
) -> SecretsRead {
    let Some(doc) = parse_toml(d, text) else {
        return SecretsRead {
            secrets: None,
            keyed_readers: None,
            keyed_boards: None,
        };
    };
    let root = Table {
        what: "the secrets file".to_owned(),
        span: doc.span(),
        t: doc.get_ref(),
    };
    root.check_unknown(d, &["hub_key", "pin_key", "reader_key", "board_key"]);
    let hub_key = root
        .table(d, "hub_key", "[hub_key]", &["secret"], true)
        .and_then(|t| secret_32(d, &t))
        .map(|seed| SigningKey::from_bytes(&seed));
    let tables = root.tables(d, "pin_key", "[[pin_key]]", &["id", "secret"]);
    match root.get("pin_key") {
        None if tables.is_empty() => d.at(
            root.span.clone(),
            "missing [[pin_key]]: the hub needs at least one PIN key",
        ),
        // `pin_key = []` holds none either.
        Some(v) if matches!(v.get_ref(), DeValue::Array(a) if a.is_empty()) => d.at(
            v.span(),
            "no [[pin_key]]: the hub needs at least one PIN key",
        ),
        _ => {}
    }
    let mut ids = Vec::new();
    let mut pin_keys = Vec::new();
    for t in &tables {
        let id = t.name(d, "id");
        if let Some((id, span)) = &id {
            ids.push((*id, span.clone()));
        }
        let secret = secret_32(d, t);
        pin_keys.push((|| {
            Some(PinKey {
                id: id?.0.to_owned(),
                secret: secret?,
            })
        })());
    }
    check_unique(d, "pin key id", &ids);
    let mut readers = Vec::new();
    let mut reader_keys = Vec::new();
    // (reader, key, where) of every key read, for the shared-key check.
    let mut scbks: Vec<(String, [u8; 16], Range<usize>)> = Vec::new();
    let mut keyed_readers = Some(Vec::new());
    for t in &root.tables(d, "reader_key", "[[reader_key]]", &["reader", "scbk"]) {
        let reader = t.name(d, "reader");
        match &reader {
            Some((r, span)) => {
                readers.push((*r, span.clone()));
                if let Some(k) = &mut keyed_readers {
                    k.push((*r).to_owned());
                }
            }
            // Which reader it was for is unknown: say nothing of keys missing.
            None => keyed_readers = None,
        }
        let scbk = scbk_16(d, t).and_then(|(k, span)| {
            let name = reader.as_ref().map_or("?", |r| r.0).to_owned();
            weak_scbk(d, &name, &k, &span, &scbks)?;
            scbks.push((name, k, span));
            Some(k)
        });
        reader_keys.push((|| {
            Some(ReaderKey {
                reader: reader?.0.to_owned(),
                scbk: scbk?,
            })
        })());
    }
    check_unique(d, "reader_key reader", &readers);
    let reader_keys: Option<Vec<ReaderKey>> = reader_keys.into_iter().collect();
    let (board_keys, keyed_boards) = board_keys(d, &root, serial_names);
    let pin_keys: Option<Vec<PinKey>> = pin_keys.into_iter().collect();
    let secrets = (|| {
        Some(Secrets {
            hub_key: hub_key?,
            pin_keys: pin_keys.filter(|k| !k.is_empty())?,
            reader_keys: reader_keys?,
            board_keys: board_keys?,
        })
    })();
    SecretsRead {
        secrets,
        keyed_readers,
        keyed_boards,
    }
}

/// `[[board_key]]`: one per lock board (serial.md, "Keys"): a serial of
/// hub.toml, once, and a key of 32 bytes that is not all zero and is no
/// other board's (a key shared by two boards lets one's wire speak for
/// the other). Returns the keys when all are valid, and the serials named
/// whenever those can be told.
fn board_keys(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    serial_names: &Option<Vec<String>>,
) -> (Option<Vec<BoardKey>>, Option<Vec<String>>) {
    let mut serials = Vec::new();
    let mut keys: Vec<Option<BoardKey>> = Vec::new();
    let mut keyed = Some(Vec::new());
    let mut seen: Vec<([u8; 32], String, Range<usize>)> = Vec::new();
    for t in &root.tables(d, "board_key", "[[board_key]]", &["serial", "key"]) {
        let serial = t.name(d, "serial");
        match &serial {
            Some((s, span)) => {
                serials.push((*s, span.clone()));
                if let Some(k) = &mut keyed {
                    k.push((*s).to_owned());
                }
                if let Some(names) = serial_names
                    && !names.iter().any(|n| n == s)
                {
                    d.at(
                        span.clone(),
                        format!(
                            "board_key serial `{}` is not configured in a [[serial]] of the config",
                            s.escape_debug()
                        ),
                    );
                }
            }
            None => keyed = None,
        }
        let key = link_key_32(d, t);
        if let (Some(k), Some(span)) = (&key, t.get("key").map(|v| v.span())) {
            let this = serial.as_ref().map_or("?", |s| s.0).to_owned();
            match seen.iter().find(|(other, _, _)| other == k) {
                Some((_, other, first)) => {
                    let line = d.line_of(first);
                    d.at(
                        span,
                        format!(
                            "the board_key of serial `{}` is the same as serial `{}`'s (line {line}): each board needs its own key",
                            this.escape_debug(),
                            other.escape_debug()
                        ),
                    );
                }
                None => seen.push((*k, this, span)),
            }
        }
        keys.push((|| {
            Some(BoardKey {
                serial: serial?.0.to_owned(),
                key: key?,
            })
        })());
    }
    check_unique(d, "board_key serial", &serials);
    (keys.into_iter().collect(), keyed)
}

/// `key` of a `[[board_key]]`: base64url of 32 bytes, not all zero; never
/// shown.
fn link_key_32(d: &mut Diag<'_>, t: &Table<'_, '_>) -> Option<[u8; 32]> {
    let (s, span) = t.str(d, "key", true)?;
    let message = match crypto::b64u_decode(s) {
        Some(b) => match <[u8; 32]>::try_from(b.as_slice()) {
            Ok(k) if k.iter().all(|b| *b == 0) => {
                "`key` is all zero: a board's link key must be random (pair the board, or type the key from its label)".to_owned()
            }
            Ok(k) => return Some(k),
            Err(_) => format!(
                "`key` must be 32 bytes (base64url, 43 characters); it decodes to {} bytes",
                b.len()
            ),
        },
        None => "`key` is not base64url; it must be 32 bytes (43 characters)".to_owned(),
    };
    d.at(span, message);
    None
}

/// `secret`: base64url of exactly 32 bytes. Messages say what is wrong with
/// it without showing it.
pub(super) fn secret_32(d: &mut Diag<'_>, t: &Table<'_, '_>) -> Option<[u8; 32]> {
    let (s, span) = t.str(d, "secret", true)?;
    if let Some(bytes) = crypto::b64u_decode_32(s) {
        return Some(bytes);
    }
    let message = match crypto::b64u_decode(s) {
        Some(b) => format!(
            "`secret` must be 32 bytes (base64url, 43 characters); it decodes to {} bytes",
            b.len()
        ),
        None => "`secret` is not base64url; it must be 32 bytes (43 characters)".to_owned(),
    };
    d.at(span, message);
    None
}

/// A reader key nobody else may know (osdp.md, Secure Channel): not SCBK-D,
/// which the standard publishes, not all zero, and not another reader's
/// (whoever pulls that reader off the wall would hold this one's too).
/// Reports at `span` and returns `None` when it is weak; never shows it.
fn weak_scbk(
    d: &mut Diag<'_>,
    reader: &str,
    key: &[u8; 16],
    span: &Range<usize>,
    earlier: &[(String, [u8; 16], Range<usize>)],
) -> Option<()> {
    let message = if key == &SCBK_D {
        "`scbk` is OSDP's default install key SCBK-D, which every reader and the standard know: give each reader its own random key".to_owned()
    } else if key.iter().all(|&b| b == 0) {
        "`scbk` is all zero: give each reader its own random key".to_owned()
    } else if let Some((other, _, first)) = earlier.iter().find(|(_, k, _)| k == key) {
        let line = d.line_of(first);
        format!(
            "reader `{}` has the same `scbk` as reader `{}` (line {line}): each reader needs its own key",
            reader.escape_debug(),
            other.escape_debug()
        )
    } else {
        return Some(());
    };
    d.at(span.clone(), message);
    None
}

/// `scbk`: base64url of exactly 16 bytes, never shown; with where it is.
pub(super) fn scbk_16(d: &mut Diag<'_>, t: &Table<'_, '_>) -> Option<([u8; 16], Range<usize>)> {
    let (s, span) = t.str(d, "scbk", true)?;
    let message = match crypto::b64u_decode(s) {
        Some(b) => match <[u8; 16]>::try_from(b.as_slice()) {
            Ok(k) => return Some((k, span)),
            Err(_) => format!(
                "`scbk` must be 16 bytes (base64url, 22 characters); it decodes to {} bytes",
                b.len()
            ),
        },
        None => "`scbk` is not base64url; it must be 16 bytes (22 characters)".to_owned(),
    };
    d.at(span, message);
    None
}

/// The secrets file's `text` with `reader`'s `[[reader_key]] scbk` set to
/// `scbk`, and nothing else changed (comments, order, the other secrets):
/// what `lockhub osdp rekey` writes once the new key is proven. `None` when
/// the text does not parse cleanly or has no `scbk` for that reader.
pub fn with_reader_key(text: &str, reader: &str, scbk: &[u8; 16]) -> Option<String> {
    let mut d = Diag::new(Path::new("secrets"), text, true);
    let doc = parse_toml(&mut d, text)?;
    let root = Table {
        what: "the secrets file".to_owned(),
        span: doc.span(),
        t: doc.get_ref(),
    };
    let mut at = None;
    for t in &root.tables(&mut d, "reader_key", "[[reader_key]]", &["reader", "scbk"]) {
        if t.str(&mut d, "reader", true)
            .is_some_and(|(r, _)| r == reader)
        {
            at = t.str(&mut d, "scbk", true).map(|(_, span)| span);
        }
    }
    let span = at.filter(|_| d.errors.is_empty())?;
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..span.start]);
    out.push('"');
    out.push_str(&crypto::b64u_encode(scbk));
    out.push('"');
    out.push_str(&text[span.end..]);
    Some(out)
}

/// `text` (a secrets file) with `serial`'s `[[board_key]]` set to `key`:
/// that table's `key` value replaced where it stands, or a table appended;
/// every other line as it was (`lockhub board pair` and `rekey` write the
/// file this way). The text must parse.
pub fn with_board_key(text: &str, serial: &str, key: &[u8; 32]) -> Result<String, String> {
    let (doc, errors) = DeTable::parse_recoverable(text);
    if !errors.is_empty() {
        return Err("the secrets file does not parse as TOML".to_owned());
    }
    let value = crypto::b64u_encode(key);
    if let Some(DeValue::Array(items)) = doc.get_ref().get("board_key").map(|v| v.get_ref()) {
        for item in items {
            let DeValue::Table(t) = item.get_ref() else {
                continue;
            };
            let named = matches!(
                t.get("serial").map(|v| v.get_ref()),
                Some(DeValue::String(s)) if s.as_ref() == serial
            );
            if !named {
                continue;
            }
            let Some(old) = t.get("key") else {
                return Err(format!("the [[board_key]] of `{serial}` has no `key`"));
            };
            let span = old.span();
            let (before, after) = (text.get(..span.start), text.get(span.end..));
            let (Some(before), Some(after)) = (before, after) else {
                return Err("the secrets file does not parse as TOML".to_owned());
            };
            return Ok(format!("{before}\"{value}\"{after}"));
        }
    }
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "\n[[board_key]]\nserial = \"{serial}\"\nkey = \"{value}\"\n"
    ));
    Ok(out)
}
