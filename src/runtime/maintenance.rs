//! The daemon's housekeeping: the periodic jobs that keep the mirror honest
//! while nothing else happens.
//!
//! | job | every | why |
//! |---|---|---|
//! | clock trust → `clock_untrusted` | 10 s | the expiry sweep must not make keys final by a wrong clock |
//! | save the time floor | 60 s | a power cut must not take the effective time back |
//! | expiry sweep | 30 s | keys past `valid_until` become `expired`, audited (only while trusted) |
//! | lockout alerts | 5 s | `keypad_lockout` clears when the lockout ends, even with nobody at the door |
//! | quiet alerts | 10 s | `bad_signature`, `malformed_event`, `event_id_conflict`, `keypad_flood` end after `policy.cloud_stale_s` without a new occurrence |
//! | retention prune | 1 h | dedupe, final keys, tombstones, sent outbox, acked audit |
//! | `signer_expiring` | 1 h | 30 days' warning before a trust-ring key stops verifying |
//! | alerts about what the config no longer has | at start, 10 s until done | a door, board or reader removed or renamed between runs: nothing watches it any more, so nothing else would end them |
//!
//! Every job is one short writer transaction (the sweeps work in batches),
//! so a door entry never waits behind housekeeping for long.

use crate::clock::{SharedClock, Trust};
use crate::config::{Config, Policy};
use crate::store::alerts;
use crate::store::{Priority, Store, door, error::StoreError, floor, sweep};
use lockhub_proto::outputs::Condition;
use lockhub_proto::verify;
use lockhub_proto::verify::Signer;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// Subject of the `clock_untrusted` alert: the hub itself.
pub const CLOCK_SUBJECT: &str = "hub";

const TRUST_EVERY: Duration = Duration::from_secs(10);
const FLOOR_EVERY: Duration = crate::clock::FLOOR_SAVE_INTERVAL;
const EXPIRE_EVERY: Duration = Duration::from_secs(30);
const LOCKOUT_EVERY: Duration = Duration::from_secs(5);
const QUIET_EVERY: Duration = Duration::from_secs(10);
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
const SIGNERS_EVERY: Duration = Duration::from_secs(3600);
const CONFIGURED_EVERY: Duration = Duration::from_secs(10);
/// One job never loops more than this many batches in a row.
const MAX_BATCHES: usize = 50;

/// What the housekeeping needs.
#[derive(Clone)]
pub struct Maintenance {
    pub store: Store,
    pub clock: SharedClock,
    pub policy: Policy,
    pub trust_ring: Vec<Signer>,
    /// Woken after a job queued outbox rows, so they go out at once.
    pub outbox_wake: Arc<Notify>,
    pub configured: Arc<Configured>,
}

/// What the config names, for each alert whose subject is a piece of it
/// (mqtt.md: every alert ends). An alert about a door, board or reader
/// that the config no longer has, or no longer has that way, can never end
/// by its cause: nothing watches it any more. So it ends at start:
/// - `door_forced`, `door_held_open`: doors (their last reported state is
///   forgotten too);
/// - `board_offline`: serial boards and readers; `board_mismatch`: doors
///   (a serial board's) and readers; `reader_replaced`: readers;
/// - `link_insecure`: readers without a key, readers with a door's strike
///   on an output (the probe before each handshake raises and ends it),
///   and `insecure_plaintext` serials (the others use their key, or are
///   gone); `reader_link_fault`: readers with a key (one still configured
///   so clears its own once its Secure Channel holds); `board_link_fault`:
///   serials with a key (one still configured clears its own once a
///   sealed session holds).
///
/// The daemon runs it once before it starts the doors (so it cannot race
/// a driver raising one of these for something still configured), and
/// housekeeping again every 10 s until it has been written once.
///
/// `tamper` is not among them: it is evidence, and ends by an operator's
/// `lockhub alert clear` whatever the config says.
#[derive(Debug, Clone, Default)]
pub struct Configured {
    doors: BTreeSet<String>,
    kept: Vec<(Condition, BTreeSet<String>)>,
}

impl Configured {
    pub fn of(config: &Config) -> Self {
        let doors: BTreeSet<String> = config
            .doors
            .iter()
            .map(|d| d.name.clone())
            .chain(config.reader_doors.iter().map(|d| d.name.clone()))
            .collect();
        // A reader with a key always uses it (`osdp::bus`), whatever
        // `insecure_plaintext` says; one without a key talks plain text.
        let readers = |keyed: Option<bool>| -> BTreeSet<String> {
            config
                .readers
                .iter()
                .filter(|r| keyed.is_none_or(|k| config.reader_key(&r.name).is_some() == k))
                .map(|r| r.name.clone())
                .collect()
        };
        let all_readers = readers(None);
        let boards: BTreeSet<String> = config.serials.iter().map(|s| s.name.clone()).collect();
        let serials = |insecure: bool| -> BTreeSet<String> {
            config
                .serials
                .iter()
                .filter(|s| s.insecure_plaintext == insecure)
                .map(|s| s.name.clone())
                .collect()
        };
        let kept = vec![
            (Condition::DoorForced, doors.clone()),
            (Condition::DoorHeldOpen, doors.clone()),
            (Condition::BoardOffline, &boards | &all_readers),
            (Condition::BoardMismatch, &doors | &all_readers),
            (Condition::ReaderReplaced, all_readers.clone()),
            (
                Condition::LinkInsecure,
                readers(Some(false))
                    .into_iter()
                    .chain(config.reader_doors.iter().map(|d| d.reader.clone()))
                    .chain(serials(true))
                    .collect(),
            ),
            (Condition::ReaderLinkFault, readers(Some(true))),
            (Condition::BoardLinkFault, serials(false)),
        ];
        Configured { doors, kept }
    }
}

impl Maintenance {
    /// Checks the clock and raises or clears `clock_untrusted`. Returns whether it is trusted.
    pub async fn check_clock(&self) -> Result<bool, StoreError> {
        let trust = self.clock.trust();
        let now = self.clock.now();
        let changed = self
            .store
            .write(Priority::Bulk, move |c| match trust {
                Trust::Trusted => alerts::clear(c, Condition::ClockUntrusted, CLOCK_SUBJECT, now),
                _ => alerts::hold(c, Condition::ClockUntrusted, CLOCK_SUBJECT, now),
            })
            .await?;
        if changed {
            tracing::warn!(?trust, "clock trust changed");
            self.outbox_wake.notify_one();
        }
        Ok(trust == Trust::Trusted)
    }

    /// Saves the effective time and the hub's own floor into the durable floors.
    pub async fn save_floor(&self) -> Result<(), StoreError> {
        let floors = self.clock.floors();
        self.store
            .write(Priority::Bulk, move |c| floor::save(c, floors).map(|_| ()))
            .await
    }

    /// Expires live keys past `valid_until`, in batches, only while the clock is trusted.
    pub async fn expire(&self) -> Result<usize, StoreError> {
        let trusted = self.clock.trust() == Trust::Trusted;
        let mut total = 0;
        for _ in 0..MAX_BATCHES {
            let now = self.clock.now();
            let n = self
                .store
                .write(Priority::Bulk, move |c| sweep::expire_due(c, now, trusted))
                .await?;
            total += n;
            if n < sweep::EXPIRE_BATCH {
                break;
            }
        }
        if total > 0 {
            tracing::info!(keys = total, "expired keys past valid_until");
            self.outbox_wake.notify_one();
        }
        Ok(total)
    }

    /// Clears `keypad_lockout` for lockouts that have ended.
    pub async fn clear_lockouts(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let n = self
            .store
            .write(Priority::Bulk, move |c| {
                door::clear_expired_lockouts(c, now)
            })
            .await?;
        if n > 0 {
            self.outbox_wake.notify_one();
        }
        Ok(n)
    }

    /// Clears the alerts of occurrences ([`Condition::ends_when_quiet`])
    /// that have not happened again for `policy.cloud_stale_s`, and sends
    /// the counts that bumps held back ([`alerts::publish_bumps`]).
    /// Returns how many it cleared.
    pub async fn clear_quiet_alerts(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let quiet_s = self.policy.cloud_stale_s;
        let (n, bumped) = self
            .store
            .write(Priority::Bulk, move |c| {
                Ok((
                    alerts::clear_quiet(c, quiet_s, now)?,
                    alerts::publish_bumps(c, now)?,
                ))
            })
            .await?;
        if n > 0 {
            tracing::info!(alerts = n, "alerts ended after a quiet period");
        }
        if n + bumped > 0 {
            self.outbox_wake.notify_one();
        }
        Ok(n)
    }

    /// Deletes what retention allows, in batches.
    pub async fn prune(&self) -> Result<(), StoreError> {
        let policy = self.policy;
        for _ in 0..MAX_BATCHES {
            let now = self.clock.now();
            let pruned = self
                .store
                .write(Priority::Bulk, move |c| sweep::prune(c, now, &policy))
                .await?;
            if !pruned.more() {
                break;
            }
        }
        Ok(())
    }

    /// Raises `signer_expiring` for each signer within 30 days of its
    /// `not_after`, and clears it for the others, also for a signer no
    /// longer in the trust ring (its alert would otherwise never end).
    pub async fn check_signers(&self) -> Result<(), StoreError> {
        let now = self.clock.now();
        let expiring: Vec<String> = verify::signer_expiring(&self.trust_ring, now)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let all: Vec<String> = self.trust_ring.iter().map(|s| s.id.clone()).collect();
        let changed = self
            .store
            .write(Priority::Bulk, move |c| {
                let mut changed = false;
                for id in &all {
                    changed |= if expiring.contains(id) {
                        alerts::hold(c, Condition::SignerExpiring, id, now)?
                    } else {
                        alerts::clear(c, Condition::SignerExpiring, id, now)?
                    };
                }
                for gone in alerts::raised_subjects(c, Condition::SignerExpiring)? {
                    if !all.contains(&gone) {
                        changed |= alerts::clear(c, Condition::SignerExpiring, &gone, now)?;
                    }
                }
                Ok(changed)
            })
            .await?;
        if changed {
            self.outbox_wake.notify_one();
        }
        Ok(())
    }

    /// Ends the alerts about what the config no longer has ([`Configured`]),
    /// and forgets the doors it no longer has. Returns how many alerts it ended.
    pub async fn end_unconfigured(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let configured = self.configured.clone();
        let (ended, doors) = self
            .store
            .write(Priority::Bulk, move |c| {
                let mut ended = 0;
                for (condition, keep) in &configured.kept {
                    ended += alerts::clear_unless(c, *condition, keep, now)?;
                }
                Ok((ended, door::forget_doors_except(c, &configured.doors)?))
            })
            .await?;
        if ended + doors > 0 {
            tracing::info!(
                alerts = ended,
                doors,
                "alerts and door states of what the config no longer has ended"
            );
        }
        if ended > 0 {
            self.outbox_wake.notify_one();
        }
        Ok(ended)
    }

    /// Runs every job on its schedule until `stop` turns true.
    /// `configured_done`: [`Maintenance::end_unconfigured`] has been written
    /// in this run already.
    pub async fn run(self, mut stop: watch::Receiver<bool>, configured_done: bool) {
        let mut trust = tokio::time::interval(TRUST_EVERY);
        let mut floor = tokio::time::interval(FLOOR_EVERY);
        let mut expire = tokio::time::interval(EXPIRE_EVERY);
        let mut lockouts = tokio::time::interval(LOCKOUT_EVERY);
        let mut quiet = tokio::time::interval(QUIET_EVERY);
        let mut prune = tokio::time::interval(PRUNE_EVERY);
        let mut signers = tokio::time::interval(SIGNERS_EVERY);
        let mut configured = tokio::time::interval(CONFIGURED_EVERY);
        // The config does not change while the daemon runs: once done, done.
        let mut configured_done = configured_done;
        for i in [
            &mut configured,
            &mut trust,
            &mut floor,
            &mut expire,
            &mut lockouts,
            &mut quiet,
            &mut prune,
            &mut signers,
        ] {
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            let result = tokio::select! {
                _ = stop.changed() => break,
                _ = trust.tick() => self.check_clock().await.map(|_| ()),
                _ = floor.tick() => self.save_floor().await,
                _ = expire.tick() => self.expire().await.map(|_| ()),
                _ = lockouts.tick() => self.clear_lockouts().await.map(|_| ()),
                _ = quiet.tick() => self.clear_quiet_alerts().await.map(|_| ()),
                _ = prune.tick() => self.prune().await,
                _ = signers.tick() => self.check_signers().await,
                _ = configured.tick(), if !configured_done => {
                    let done = self.end_unconfigured().await.map(|_| ());
                    configured_done = done.is_ok();
                    done
                }
            };
            if let Err(e) = result {
                if matches!(e, StoreError::Closed) {
                    break;
                }
                tracing::warn!(error = %e, "housekeeping job failed; it runs again on its next tick");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Floors;
    use lockhub_proto::time::Timestamp;

    fn setup(floor_at: Timestamp) -> (tempfile::TempDir, Maintenance) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("lockhub.db"), &Policy::default()).unwrap();
        let m = Maintenance {
            store,
            clock: SharedClock::start(Floors {
                effective: floor_at,
                system: floor_at,
            }),
            policy: Policy::default(),
            trust_ring: Vec::new(),
            outbox_wake: Arc::new(Notify::new()),
            configured: Arc::new(Configured::default()),
        };
        (dir, m)
    }

    async fn insert_key(m: &Maintenance, id: &str, from: Timestamp, until: Timestamp) {
        let id = id.to_owned();
        m.store
            .write(Priority::Bulk, move |c| {
                c.execute(
                    "INSERT INTO keys (key_id, version, state, check_in_id, valid_from, valid_until,
                                       pin_tag, pin_key_id, updated_at)
                     VALUES (?1, 1, 'active', ?1, ?2, ?3, ?4, 'k1', ?2)",
                    rusqlite::params![id, from.0, until.0, vec![7u8; 32]],
                )?;
                Ok(())
            })
            .await
            .unwrap();
    }

    fn state(m: &Maintenance, id: &str) -> String {
        m.store
            .reader()
            .unwrap()
            .query_row("SELECT state FROM keys WHERE key_id = ?1", [id], |r| {
                r.get(0)
            })
            .unwrap()
    }

    #[tokio::test]
    async fn a_key_past_its_window_expires_when_the_clock_is_trusted() {
        let now = Timestamp::now_system();
        let (_dir, m) = setup(Timestamp(0));
        insert_key(
            &m,
            "k-old",
            now.saturating_add_days(-2),
            now.saturating_add_days(-1),
        )
        .await;
        insert_key(
            &m,
            "k-live",
            now.saturating_add_days(-1),
            now.saturating_add_days(1),
        )
        .await;
        assert!(m.check_clock().await.unwrap());
        assert_eq!(m.expire().await.unwrap(), 1);
        assert_eq!(state(&m, "k-old"), "expired");
        assert_eq!(state(&m, "k-live"), "active");
    }

    #[tokio::test]
    async fn a_floor_ahead_of_the_system_clock_raises_clock_untrusted_and_holds_the_sweep() {
        let now = Timestamp::now_system();
        // The floor says it is a week later than the system clock claims.
        let (_dir, m) = setup(now.saturating_add_days(7));
        insert_key(
            &m,
            "k-1",
            now.saturating_add_days(-1),
            now.saturating_add_days(1),
        )
        .await;
        assert!(!m.check_clock().await.unwrap());
        // By the effective time the key has run out, but a wrong clock must
        // not make it final.
        assert_eq!(m.expire().await.unwrap(), 0);
        assert_eq!(state(&m, "k-1"), "active");
        let open = alerts::open_alerts(&m.store.reader().unwrap()).unwrap();
        assert!(
            open.iter()
                .any(|a| a.condition == "clock_untrusted" && a.subject == CLOCK_SUBJECT)
        );
    }

    #[tokio::test]
    async fn the_floors_are_saved_and_only_rise() {
        let now = Timestamp::now_system();
        let (_dir, m) = setup(Timestamp(0));
        m.save_floor().await.unwrap();
        let saved = floor::load(&m.store.reader().unwrap()).unwrap();
        assert!(
            saved.effective >= now,
            "the saved floor is the effective time"
        );
        assert!(saved.system >= now, "and the hub's own reading");
        let later = saved.effective.saturating_add_days(1);
        m.store
            .write(Priority::Bulk, move |c| {
                floor::raise_to(c, later).map(|_| ())
            })
            .await
            .unwrap();
        m.save_floor().await.unwrap();
        let again = floor::load(&m.store.reader().unwrap()).unwrap();
        assert_eq!(
            again.effective, later,
            "a save never lowers the effective floor"
        );
        assert!(again.system >= saved.system && again.system < later);
    }

    #[tokio::test]
    async fn an_occurrence_alert_ends_after_cloud_stale_s_without_a_new_one_and_a_state_alert_does_not()
     {
        let now = Timestamp::now_system();
        let (_dir, m) = setup(Timestamp(0));
        let quiet = i64::from(m.policy.cloud_stale_s);
        let old = now.saturating_add_secs(-quiet - 5);
        let recent = now.saturating_add_secs(-quiet + 60);
        m.store
            .write(Priority::Bulk, move |c| {
                alerts::raise(c, Condition::BadSignature, "cloud", 1, old)?;
                alerts::raise(c, Condition::MalformedEvent, "cloud", 1, old)?;
                alerts::raise(c, Condition::KeypadFlood, "101", 1, old)?;
                // A new occurrence keeps this one raised.
                alerts::raise(c, Condition::EventIdConflict, "e-1", 1, old)?;
                alerts::raise(c, Condition::EventIdConflict, "e-1", 1, recent)?;
                // Not an occurrence: it ends when the door closes.
                alerts::raise(c, Condition::DoorForced, "101", 1, old)?;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(m.clear_quiet_alerts().await.unwrap(), 3);
        let mut open: Vec<String> = alerts::open_alerts(&m.store.reader().unwrap())
            .unwrap()
            .into_iter()
            .map(|a| a.condition)
            .collect();
        open.sort();
        assert_eq!(open, ["door_forced", "event_id_conflict"]);
        let cleared: i64 = m
            .store
            .reader()
            .unwrap()
            .query_row(
                "SELECT count(*) FROM outbox WHERE topic = 'alerts'
                  AND CAST(body AS TEXT) LIKE '%\"state\":\"cleared\"%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(cleared, 3, "each end is published");
        assert_eq!(m.clear_quiet_alerts().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_signer_near_its_not_after_raises_signer_expiring_and_a_far_one_clears_it() {
        let (_dir, mut m) = setup(Timestamp(0));
        let key =
            lockhub_proto::crypto::parse_public_key("vpDAfBqmiMog0GAAR6GMchsmx2iCa19aGlMs764g2M0")
                .unwrap();
        let soon = Timestamp::now_system().saturating_add_days(10);
        m.trust_ring = vec![Signer {
            id: "cloud-a".into(),
            public_key: key,
            not_after: Some(soon),
        }];
        m.check_signers().await.unwrap();
        let open = alerts::open_alerts(&m.store.reader().unwrap()).unwrap();
        assert!(
            open.iter()
                .any(|a| a.condition == "signer_expiring" && a.subject == "cloud-a")
        );
        m.trust_ring[0].not_after = Some(Timestamp::now_system().saturating_add_days(300));
        m.check_signers().await.unwrap();
        assert!(
            alerts::open_alerts(&m.store.reader().unwrap())
                .unwrap()
                .is_empty()
        );
        // A signer taken out of the ring while its alert is raised: it ends.
        m.trust_ring[0].not_after = Some(soon);
        m.check_signers().await.unwrap();
        m.trust_ring.clear();
        m.check_signers().await.unwrap();
        assert!(
            alerts::open_alerts(&m.store.reader().unwrap())
                .unwrap()
                .is_empty(),
            "the alert of a removed signer ends"
        );
    }
}
