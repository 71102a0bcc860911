//! The store boundary's one error enum.

use std::path::PathBuf;

/// The store boundary's errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open database {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("database {path} is damaged: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "database {path} has schema version {found}, newer than this lockhub knows ({known}); \
         run a newer lockhub or restore a backup"
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("database {path}: cannot enable {what}")]
    Pragma { path: PathBuf, what: &'static str },
    #[error("migration {name} failed: {source}")]
    Migration {
        name: &'static str,
        source: rusqlite::Error,
    },
    #[error("cannot create data folder {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the store is closed")]
    Closed,
    /// A door job that could not commit before its deadline; nothing of it
    /// was (or will be) committed.
    #[error("the write could not commit before the door's deadline")]
    Deadline,
    #[error("no database at {0} (has the daemon run with this config?)")]
    NoDatabase(PathBuf),
    #[error(
        "database {path} has schema version {found}; start the daemon once to upgrade it to {known}"
    )]
    NotUpgraded {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    /// `PRAGMA foreign_key_check` after the migrations found rows pointing
    /// nowhere; nothing of the migration was committed.
    #[error("the migrations leave {rows} rows with a broken foreign key")]
    BrokenForeignKeys { rows: i64 },
    /// A stored value this lockhub cannot read back (a damaged database, or
    /// one written by a newer version); `what` names the row, never its data.
    #[error("unreadable stored value: {what}")]
    Unreadable { what: String },
    #[error("cannot encode {what} as JSON: {source}")]
    Encode {
        what: &'static str,
        source: serde_json::Error,
    },
    /// The job's own work succeeded but its transaction did not commit.
    /// Every job of the group shares the one failure, so it is carried as
    /// its message.
    #[error("commit failed: {0}")]
    Commit(String),
    /// A TRUNCATE checkpoint found a reader in the way; retry later.
    #[error("WAL checkpoint blocked by a reader; retry")]
    CheckpointBlocked,
    #[error("cannot start the {name} thread: {source}")]
    Thread {
        name: &'static str,
        source: std::io::Error,
    },
    /// Writing a command's output (stdout, a pipe) failed.
    #[error("cannot write {what}: {source}")]
    Output {
        what: &'static str,
        source: std::io::Error,
    },
}

impl StoreError {
    /// The message of a `RAISE(ABORT, ...)` or constraint that refused a write.
    pub fn constraint_message(&self) -> Option<&str> {
        match self {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, msg))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Some(msg.as_deref().unwrap_or(""))
            }
            _ => None,
        }
    }
}
