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
    let filter = filter(level)?;
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match (format, journald) {
        (LogFormat::Json, _) => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        (LogFormat::Text, true) => builder.without_time().with_ansi(false).try_init(),
        (LogFormat::Text, false) => builder.try_init(),
    };
    result.map_err(|_| LoggingError::AlreadySet)
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
}
