//! Diagnostics: problems positioned in a file, reading files, parsing TOML,
//! and the checks shared by every section (unique names, private files).

use super::*;

/// Problems found in one TOML file, positioned in its text.
pub(super) struct Diag<'t> {
    pub(super) file: PathBuf,
    pub(super) text: &'t str,
    /// The secrets file: never echo anything from it that could be a secret.
    pub(super) secret: bool,
    pub(super) errors: Vec<ConfigError>,
    /// Not problems: what an installer should know now (a serial device
    /// absent now may be plugged in later). check-config prints them.
    pub(super) warnings: Vec<ConfigError>,
}

impl<'t> Diag<'t> {
    pub(super) fn new(file: &Path, text: &'t str, secret: bool) -> Self {
        Diag {
            file: file.to_path_buf(),
            text,
            secret,
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }

    pub(super) fn warn_at(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, column) = line_col(self.text, span.start);
        self.warnings.push(ConfigError {
            file: self.file.clone(),
            line: Some(line),
            column: Some(column),
            message: message.into(),
        });
    }

    pub(super) fn at(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, column) = line_col(self.text, span.start);
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line: Some(line),
            column: Some(column),
            message: message.into(),
        });
    }

    pub(super) fn line_of(&self, span: &Range<usize>) -> usize {
        line_col(self.text, span.start).0
    }

    /// A key name fit to print: in the secrets file a long name might be a
    /// secret pasted in the wrong place, so it is not shown. Every name the
    /// file knows is at most 10 characters, and the shortest secret it
    /// holds (a reader's 16-byte SCBK) is 22 in base64url.
    pub(super) fn key_name(&self, key: &str) -> String {
        if self.secret && key.chars().count() > 12 {
            "(name not shown)".to_owned()
        } else {
            format!("`{}`", key.escape_debug())
        }
    }
}

pub(super) enum ReadError {
    Io(std::io::Error),
    /// Not UTF-8: the position of the first bad byte.
    Utf8 {
        line: usize,
        column: usize,
    },
}

pub(super) fn read_text(path: &Path) -> Result<String, ReadError> {
    let bytes = std::fs::read(path).map_err(ReadError::Io)?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let prefix = std::str::from_utf8(&e.as_bytes()[..valid]).unwrap_or("");
        let (line, column) = line_col(prefix, valid);
        ReadError::Utf8 { line, column }
    })
}

pub(super) fn io_message(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "does not exist".to_owned(),
        std::io::ErrorKind::PermissionDenied => "cannot be read: permission denied".to_owned(),
        _ => format!("cannot be read: {e}"),
    }
}

/// Parses TOML, reporting every syntax error; `None` when there was any
/// (rules are not checked on a document the parser had to guess at).
pub(super) fn parse_toml<'i>(d: &mut Diag<'_>, text: &'i str) -> Option<Spanned<DeTable<'i>>> {
    let (doc, errors) = DeTable::parse_recoverable(text);
    if errors.is_empty() {
        return Some(doc);
    }
    // The parser often reports a cascade after the first mistake on a line;
    // one message per line is the useful part.
    let mut errors: Vec<_> = errors
        .into_iter()
        .map(|e| (e.span().unwrap_or(0..0), e))
        .collect();
    errors.sort_by_key(|(span, _)| span.start);
    let mut last_line = 0;
    for (span, e) in errors {
        let line = d.line_of(&span);
        if line == last_line {
            continue;
        }
        last_line = line;
        let mut message = e.message().to_owned();
        if message == "duplicate key" {
            // The span is the key itself: name it (key names are not secrets,
            // but the secrets file still hides long ones).
            let key = text.get(span.clone()).unwrap_or("");
            if !key.is_empty() && !key.contains('\n') {
                message = format!("duplicate key {}", d.key_name(key.trim_matches('"')));
            }
        }
        d.at(span, format!("TOML syntax error: {message}"));
    }
    None
}

/// Reports every second and later use of a name.
pub(super) fn check_unique(d: &mut Diag<'_>, what: &str, items: &[(&str, Range<usize>)]) {
    let mut seen: HashMap<&str, Range<usize>> = HashMap::new();
    for (name, span) in items {
        if let Some(first) = seen.get(name) {
            let line = d.line_of(first);
            d.at(
                span.clone(),
                format!("duplicate {what} `{name}` (first on line {line})"),
            );
        } else {
            seen.insert(name, span.clone());
        }
    }
}

/// Group and others get no access at all (config.md: not readable by them;
/// writable or executable would be as wrong for a secret).
#[cfg(unix)]
pub(super) fn loose_mode(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o7777;
    (mode & 0o077 != 0).then_some(mode)
}

#[cfg(not(unix))]
pub(super) fn loose_mode(_meta: &std::fs::Metadata) -> Option<u32> {
    None
}

/// Checks that a file named by `key` exists and is a regular file;
/// reports at the value in hub.toml otherwise.
pub(super) fn check_file(
    d: &mut Diag<'_>,
    key: &str,
    path: &Path,
    span: &Range<usize>,
) -> Option<std::fs::Metadata> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Some(m),
        Ok(_) => {
            d.at(
                span.clone(),
                format!("`{key}` {} is not a regular file", path.display()),
            );
            None
        }
        Err(e) => {
            d.at(
                span.clone(),
                format!("`{key}` {} {}", path.display(), io_message(&e)),
            );
            None
        }
    }
}

/// A file that holds a secret, named by `key` at `span` in hub.toml: group
/// and others must have no access. Reported at the key that names it, so
/// the problem has a line and column like every other (config.md).
pub(super) fn check_private(
    d: &mut Diag<'_>,
    key: &str,
    what: &str,
    path: &Path,
    meta: &std::fs::Metadata,
    span: &Range<usize>,
) {
    if let Some(mode) = loose_mode(meta) {
        d.at(
            span.clone(),
            format!(
                "`{key}` {}: {what} is accessible by group or others (mode {mode:04o}); it must be 0600 or stricter (chmod 600)",
                path.display()
            ),
        );
    }
}
