//! `lockhub alert clear CONDITION SUBJECT --config FILE --reason TEXT`: an
//! operator ends a raised alert by hand (config.md). It is how `tamper`
//! ends (mqtt.md 'Every alert ends'); any raised alert may be cleared.
//!
//! ## Why it is shaped like this
//! - **Beside the running daemon.** It writes through SQLite from its own
//!   process, in one short `BEGIN IMMEDIATE` transaction that waits for the
//!   daemon's writer with the usual busy timeout (the daemon's door jobs
//!   wait at most until their own deadline for it, see `store::Patience`).
//!   The cleared message and the `alert.cleared` audit row go into the
//!   outbox in that transaction; the daemon's publisher reads every unsent
//!   row above the last one it queued on each tick, so it publishes them
//!   within about a second, signed with the hub's key, which this command
//!   never needs to read.
//! - **No secrets.** Like `lockhub status`, it reads only `[hub]` from
//!   `hub.toml` ([`crate::status::Target`]).
//! - **The hub's time.** Times are the hub's effective time: the system
//!   clock, or the durable floor if that is later (mqtt.md 'Time').

use crate::clock::Clock;
use crate::status::{StatusError, Target};
use crate::store::alerts;
use crate::store::{self, StoreError, floor};
use lockhub_proto::outputs::Condition;
use lockhub_proto::time::Timestamp;
use std::path::Path;
use std::time::Duration;

/// Longest `--reason` accepted (it is published in the audit record).
pub const REASON_MAX: usize = 500;

/// The `alert clear` boundary's errors.
#[derive(Debug, thiserror::Error)]
pub enum ClearError {
    #[error(transparent)]
    Config(#[from] StatusError),
    #[error("unknown condition {0:?}; the conditions are: {list}", list = condition_list())]
    UnknownCondition(String),
    #[error("no raised {condition} alert for {subject:?}")]
    NotRaised { condition: String, subject: String },
    #[error("--reason must be 1..={REASON_MAX} characters without control characters")]
    BadReason,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ClearError {
    /// The process exit code: 2 for what the operator asked (an unknown
    /// condition, an alert that is not raised, a bad reason or config), 1
    /// for the database failing.
    pub fn exit_code(&self) -> u8 {
        match self {
            ClearError::Store(_) => 1,
            ClearError::Config(e) if !e.is_config_problem() => 1,
            _ => 2,
        }
    }
}

fn condition_list() -> String {
    Condition::ALL
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What was cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleared {
    pub condition: Condition,
    pub subject: String,
    pub at: Timestamp,
}

/// Clears the raised alert (`condition`, `subject`) of the hub configured
/// in `config`, with the operator's `reason`, and audits it.
pub fn clear(
    config: &Path,
    condition: &str,
    subject: &str,
    reason: &str,
) -> Result<Cleared, ClearError> {
    let parsed = Condition::parse(condition)
        .ok_or_else(|| ClearError::UnknownCondition(condition.to_owned()))?;
    let reason = reason.trim();
    if reason.is_empty()
        || reason.chars().count() > REASON_MAX
        || reason.chars().any(char::is_control)
    {
        return Err(ClearError::BadReason);
    }
    let target = Target::from_config(config)?;
    let mut conn = store::open_operator(&target.database)?;
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(StoreError::from)?;
    let now = Clock::start(floor::load(&tx)?).effective(Timestamp::now_system(), Duration::ZERO);
    if !alerts::clear_by_hand(&tx, parsed, subject, reason, now)? {
        return Err(ClearError::NotRaised {
            condition: condition.to_owned(),
            subject: subject.to_owned(),
        });
    }
    tx.commit().map_err(StoreError::from)?;
    Ok(Cleared {
        condition: parsed,
        subject: subject.to_owned(),
        at: now,
    })
}
