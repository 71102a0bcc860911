//! Log setup: one place decides how every line looks, so the engineers who
//! log (sync, doors) only write `tracing` events with fields.
//!
//! - Lines go to **stderr**: under systemd that is the journal, and stdout
//!   stays free for command output (`status --json`, `provision --json`).
//! - `text` (default) is for people; `json` (one object per line, fields
//!   flattened) is for log collectors. Either way an event's structured fields
//!   are kept: log `event_id` and `key_id` as fields
//!   (`info!(event_id = %id, key_id = %k, "applied")`), never inside the
//!   message, so they can be searched.
//! - The filter is `--log-level` if given, else `RUST_LOG`, else `info`.
//! - Under systemd (`JOURNAL_STREAM` set) text lines carry no timestamp:
//!   the journal stamps every line already.
//! - Never log a PIN, a PIN tag, or a secret; this module cannot redact them.

use tracing_subscriber::EnvFilter;

/// The `--log-format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The logging boundary's errors.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("invalid log filter {filter:?}: {message}")]
    Filter { filter: String, message: String },
    #[error("logging is already set up")]
    AlreadySet,
}

/// The filter when neither `--log-level` nor `RUST_LOG` says otherwise.
pub const DEFAULT_FILTER: &str = "info";

/// Builds the filter from `--log-level`, else `RUST_LOG`, else `info`.
pub fn filter(level: Option<&str>) -> Result<EnvFilter, LoggingError> {
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty());
    let spec = level
        .map(str::to_owned)
        .or(from_env)
        .unwrap_or_else(|| DEFAULT_FILTER.to_owned());
    EnvFilter::builder()
        .parse(&spec)
        .map_err(|e| LoggingError::Filter {
            filter: spec,
            message: e.to_string(),
        })
}

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init(format: LogFormat, level: Option<&str>) -> Result<(), LoggingError> {
    use std::io::IsTerminal;
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let ansi = !journald && std::io::stderr().is_terminal();
    let subscriber = subscriber(format, filter(level)?, journald, ansi, std::io::stderr);
    tracing::subscriber::set_global_default(subscriber).map_err(|_| LoggingError::AlreadySet)
}

/// The subscriber `init` installs, writing to `writer` (tests capture it).
/// `journald`: omit timestamps; `ansi`: colours (only on a terminal).
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    journald: bool,
    ansi: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match (format, journald) {
        (LogFormat::Json, _) => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(false)
                .finish(),
        ),
        (LogFormat::Text, true) => Box::new(builder.without_time().with_ansi(false).finish()),
        (LogFormat::Text, false) => Box::new(builder.with_ansi(ansi).finish()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_level_wins_and_bad_filters_are_errors() {
        assert!(filter(Some("lockhub=debug,rumqttc=warn")).is_ok());
        assert!(matches!(
            filter(Some("lockhub=notalevel")),
            Err(LoggingError::Filter { .. })
        ));
    }

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    fn capture(format: LogFormat) -> String {
        let buf = Buf::default();
        let sub = subscriber(
            format,
            filter(Some("debug")).unwrap(),
            false,
            false,
            buf.clone(),
        );
        tracing::subscriber::with_default(sub, || {
            tracing::info!(
                event_id = "0b7e6c1e-1f1a-4c8e-9d55-3c1f0c9a2b11",
                key_id = "k-1",
                "event applied"
            );
            tracing::trace!("filtered out");
        });
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn json_lines_carry_event_and_key_ids_as_top_level_fields() {
        let out = capture(LogFormat::Json);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["event_id"], "0b7e6c1e-1f1a-4c8e-9d55-3c1f0c9a2b11");
        assert_eq!(v["key_id"], "k-1");
        assert_eq!(v["message"], "event applied");
        assert_eq!(v["level"], "INFO");
    }

    #[test]
    fn text_lines_keep_the_fields_too() {
        let out = capture(LogFormat::Text);
        assert!(
            out.contains(r#"event_id="0b7e6c1e-1f1a-4c8e-9d55-3c1f0c9a2b11""#),
            "{out}"
        );
        assert!(
            out.contains("key_id=\"k-1\"") || out.contains("key_id=k-1"),
            "{out}"
        );
        assert!(!out.contains("filtered out"));
    }
}
