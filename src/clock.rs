//! The hub's effective clock (mqtt.md 'Time'), as pure arithmetic.
//!
//! A Pi has no battery clock: after a power cut its system clock may read
//! 1970, or a stale time restored from disk, until NTP answers. Opening a
//! door by such a clock would revive keys that have run out. So the hub uses
//! the *effective time*: the latest of
//! - the system clock,
//! - the durable floors (loaded from SQLite at start, see
//!   [`crate::store::floor`]) advanced by the monotonic time since,
//! - every system reading taken since start, advanced the same way (so a
//!   clock stepped back while the hub runs does not take the hub back), and
//! - every verified `issued_at`, advanced the same way.
//!
//! Each source is kept as a *base*: the instant it implies at monotonic time
//! zero (`reading - elapsed`). Advancing by monotonic time is then a single
//! addition, and the effective time can never go back while the hub runs.
//!
//! [`Clock`] takes the system time and the monotonic elapsed time as
//! arguments, so tests drive it with plain numbers; [`LiveClock`] feeds it
//! the real clocks.
//!
//! ## Two floors
//! The durable floor is kept twice ([`Floors`]): the *effective* floor,
//! which every door decision and verified `issued_at` raises too (no audit
//! row is ever later than what a restart sees), and the *system* floor,
//! which only the hub's own readings of its system clock raise. Trust is
//! judged against the second: a cloud whose clock runs half a minute ahead
//! lifts the effective floor half a minute past the system clock, and a
//! restart must not read that as a clock gone back, or the expiry sweep
//! would wait for ever.
//!
//! ## Trust
//! The clock is *untrusted* while the system clock is behind the hub's own
//! floor (by more than [`FLOOR_TOLERANCE_S`]) or the effective time, which
//! carries every verified `issued_at`, is more than [`ISSUED_AT_AHEAD_S`]
//! ahead of it. Restarted or not, the hub judges by the same two rules.
//! Untrusted time still decides doors (it only ever errs toward denying past
//! `valid_until`), but the expiry sweep, which makes keys final for ever,
//! waits; trusted, the sweep's time is at most an hour past the system
//! clock.

use lockhub_proto::time::Timestamp;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How far a verified `issued_at` (and so the effective time) may run ahead
/// of the system clock before the clock is untrusted (mqtt.md: "more than
/// an hour").
pub const ISSUED_AT_AHEAD_S: i64 = 3600;

/// How far the system clock may sit behind the hub's own floor and still be
/// trusted.
///
/// Not zero: NTP slews the system clock against the monotonic one, and the
/// saved floor is a reading from up to a minute before a restart, advanced
/// by nothing while the hub was down. A reset clock is off by hours or
/// years, far beyond this.
pub const FLOOR_TOLERANCE_S: i64 = 5;

/// How often the runner saves its floors into SQLite.
pub const FLOOR_SAVE_INTERVAL: Duration = Duration::from_secs(60);

/// The durable floors as stored (module docs, 'Two floors').
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Floors {
    /// Never later than the effective time a restart starts from: raised by
    /// door decisions, verified `issued_at` values and the runner's saves.
    pub effective: Timestamp,
    /// The hub's own readings of its system clock, advanced by monotonic
    /// time: what a trusted system clock is never behind.
    pub system: Timestamp,
}

/// Whether the clock may be trusted to make keys final, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    Trusted,
    /// The system clock is this many microseconds behind the hub's own floor.
    SystemBehindFloor {
        by_us: i64,
    },
    /// The effective time (a verified `issued_at`, now or before a restart)
    /// is this many microseconds ahead of the system clock.
    AheadOfSystem {
        by_us: i64,
    },
}

/// The effective clock's state: three bases, each an instant at monotonic zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// The durable effective floor at start.
    floor_base: i64,
    /// The durable system floor at start and every system reading since.
    local_base: i64,
    /// Every verified `issued_at` (i64::MIN when none yet).
    cloud_base: i64,
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl Clock {
    /// A clock whose monotonic zero is now, starting from the durable floors.
    pub fn start(floors: Floors) -> Clock {
        Clock {
            floor_base: floors.effective.0,
            local_base: floors.system.0,
            cloud_base: i64::MIN,
        }
    }

    /// The hub's own floor (durable system floor and system readings) at `mono`.
    pub fn local_floor(&self, mono: Duration) -> Timestamp {
        Timestamp(self.local_base.saturating_add(micros(mono)))
    }

    /// The latest verified `issued_at` advanced to `mono`, if any.
    #[cfg(any(test, feature = "testing"))]
    pub fn cloud_floor(&self, mono: Duration) -> Option<Timestamp> {
        (self.cloud_base != i64::MIN)
            .then(|| Timestamp(self.cloud_base.saturating_add(micros(mono))))
    }

    /// The effective time for a system reading taken at monotonic `mono`,
    /// without remembering the reading.
    pub fn peek(&self, system: Timestamp, mono: Duration) -> Timestamp {
        let base = self.floor_base.max(self.local_base).max(self.cloud_base);
        system.max(Timestamp(base.saturating_add(micros(mono))))
    }

    /// The effective time, remembering the system reading so that a clock
    /// stepped back later cannot take the effective time back with it.
    pub fn effective(&mut self, system: Timestamp, mono: Duration) -> Timestamp {
        self.local_base = self.local_base.max(system.0.saturating_sub(micros(mono)));
        self.peek(system, mono)
    }

    /// What to save into the durable floors for a reading at `mono`.
    pub fn floors(&mut self, system: Timestamp, mono: Duration) -> Floors {
        let effective = self.effective(system, mono);
        Floors {
            effective,
            system: self.local_floor(mono),
        }
    }

    /// Folds in a verified `issued_at` (after its event's signature held).
    /// The event applier also raises the durable effective floor with it.
    pub fn observe_issued_at(&mut self, issued_at: Timestamp, mono: Duration) {
        self.cloud_base = self
            .cloud_base
            .max(issued_at.0.saturating_sub(micros(mono)));
    }

    /// Whether the system clock can be trusted now (module docs).
    pub fn trust(&self, system: Timestamp, mono: Duration) -> Trust {
        let tolerance = FLOOR_TOLERANCE_S * Timestamp::MICROS_PER_SEC;
        let behind = self.local_floor(mono).0.saturating_sub(system.0);
        if behind > tolerance {
            return Trust::SystemBehindFloor { by_us: behind };
        }
        let ahead_limit = ISSUED_AT_AHEAD_S * Timestamp::MICROS_PER_SEC;
        let ahead = self.peek(system, mono).0.saturating_sub(system.0);
        if ahead > ahead_limit {
            return Trust::AheadOfSystem { by_us: ahead };
        }
        Trust::Trusted
    }

    pub fn trusted(&self, system: Timestamp, mono: Duration) -> bool {
        self.trust(system, mono) == Trust::Trusted
    }
}

/// A [`Clock`] fed by the real system and monotonic clocks.
#[derive(Debug, Clone)]
pub struct LiveClock {
    clock: Clock,
    started: Instant,
}

impl LiveClock {
    /// Starts from the durable floors ([`crate::store::floor::load`]).
    pub fn start(floors: Floors) -> LiveClock {
        LiveClock {
            clock: Clock::start(floors),
            started: Instant::now(),
        }
    }

    fn mono(&self) -> Duration {
        self.started.elapsed()
    }

    /// The effective time now.
    pub fn now(&mut self) -> Timestamp {
        let mono = self.mono();
        self.clock.effective(Timestamp::now_system(), mono)
    }

    /// The floors to save now, every [`FLOOR_SAVE_INTERVAL`]
    /// (`floor::raise`).
    pub fn floors(&mut self) -> Floors {
        let mono = self.mono();
        self.clock.floors(Timestamp::now_system(), mono)
    }

    pub fn observe_issued_at(&mut self, issued_at: Timestamp) {
        let mono = self.mono();
        self.clock.observe_issued_at(issued_at, mono);
    }

    /// Raise `clock_untrusted` when this is not [`Trust::Trusted`], clear it when it is.
    pub fn trust(&self) -> Trust {
        self.clock.trust(Timestamp::now_system(), self.mono())
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn trusted(&self) -> bool {
        self.trust() == Trust::Trusted
    }
}

/// One [`LiveClock`] shared by every task of the daemon (sync, doors,
/// maintenance), so they all see the same effective time and every
/// `issued_at` raises it for all of them.
#[derive(Debug, Clone)]
pub struct SharedClock(Arc<Mutex<LiveClock>>);

impl SharedClock {
    /// Starts from the durable floors ([`crate::store::floor::load`]).
    pub fn start(floors: Floors) -> SharedClock {
        SharedClock(Arc::new(Mutex::new(LiveClock::start(floors))))
    }

    fn with<T>(&self, f: impl FnOnce(&mut LiveClock) -> T) -> T {
        // A panic while holding the lock cannot leave the clock's
        // integers half-written; keep using it.
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// The effective time now.
    pub fn now(&self) -> Timestamp {
        self.with(LiveClock::now)
    }

    /// The floors to save now.
    pub fn floors(&self) -> Floors {
        self.with(LiveClock::floors)
    }

    /// A verified `issued_at` raises the effective time.
    pub fn observe_issued_at(&self, issued_at: Timestamp) {
        self.with(|c| c.observe_issued_at(issued_at))
    }

    pub fn trust(&self) -> Trust {
        self.with(|c| c.trust())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_secs(T0 + s)
    }

    fn m(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Both durable floors at `t(s)`, as a hub that saved them there.
    fn floors(s: i64) -> Floors {
        Floors {
            effective: t(s),
            system: t(s),
        }
    }

    /// What the hub saved at `mono`, and a restart from it.
    fn restart(c: &mut Clock, system: Timestamp, mono: Duration) -> Clock {
        Clock::start(c.floors(system, mono))
    }

    #[test]
    fn a_correct_system_clock_is_the_effective_time_and_trusted() {
        let mut c = Clock::start(floors(0));
        assert_eq!(c.effective(t(100), m(0)), t(100));
        assert!(c.trusted(t(100), m(0)));
    }

    #[test]
    fn a_system_clock_behind_the_floor_gives_way_to_the_floor_plus_monotonic_time() {
        let mut c = Clock::start(floors(0));
        let epoch = Timestamp::from_secs(0);
        assert_eq!(c.effective(epoch, m(0)), t(0));
        assert_eq!(c.effective(epoch, m(30)), t(30));
        assert_eq!(
            c.trust(epoch, m(30)),
            Trust::SystemBehindFloor {
                by_us: t(30).0 - epoch.0
            }
        );
    }

    #[test]
    fn a_clock_stepped_back_while_running_does_not_take_the_effective_time_back() {
        let mut c = Clock::start(floors(0));
        assert_eq!(c.effective(t(1000), m(10)), t(1000));
        assert_eq!(c.effective(t(500), m(20)), t(1010));
        assert!(!c.trusted(t(500), m(20)));
        // Once the system clock is back in step it is trusted again.
        assert!(c.trusted(t(1010), m(20)));
    }

    #[test]
    fn the_effective_time_never_falls_whatever_the_system_clock_does() {
        let mut c = Clock::start(floors(0));
        let mut last = Timestamp(i64::MIN);
        let readings = [5, -3000, 40, 39, 1_000_000, 2, 0, 1_000_001, -1];
        for (i, s) in readings.into_iter().enumerate() {
            let now = c.effective(t(s), m(i as u64));
            assert!(now >= last, "step {i}");
            last = now;
        }
    }

    #[test]
    fn within_the_tolerance_a_system_clock_just_behind_the_floor_is_still_trusted() {
        let c = Clock::start(floors(0));
        assert!(c.trusted(t(-FLOOR_TOLERANCE_S), m(0)));
        assert!(!c.trusted(t(-FLOOR_TOLERANCE_S - 1), m(0)));
    }

    #[test]
    fn a_verified_issued_at_raises_the_effective_time() {
        let mut c = Clock::start(floors(0));
        c.observe_issued_at(t(600), m(10));
        assert_eq!(c.effective(t(10), m(10)), t(600));
        assert_eq!(c.effective(t(20), m(20)), t(610));
        assert!(
            c.trusted(t(20), m(20)),
            "ten minutes ahead is within the hour"
        );
    }

    #[test]
    fn an_issued_at_more_than_an_hour_ahead_makes_the_clock_untrusted() {
        let mut c = Clock::start(floors(0));
        c.observe_issued_at(t(ISSUED_AT_AHEAD_S), m(0));
        assert!(
            c.trusted(t(0), m(0)),
            "exactly an hour is not more than an hour"
        );
        c.observe_issued_at(t(ISSUED_AT_AHEAD_S + 1), m(0));
        assert_eq!(
            c.trust(t(0), m(0)),
            Trust::AheadOfSystem {
                by_us: (ISSUED_AT_AHEAD_S + 1) * 1_000_000
            }
        );
        // When the system clock is set forward (NTP), trust returns.
        assert!(c.trusted(t(1000), m(5)));
    }

    #[test]
    fn an_older_issued_at_never_lowers_anything() {
        let mut c = Clock::start(floors(0));
        c.observe_issued_at(t(50), m(0));
        c.observe_issued_at(t(-5000), m(1));
        assert_eq!(c.cloud_floor(m(1)), Some(t(51)));
    }

    #[test]
    fn peek_does_not_remember_the_reading() {
        let c = Clock::start(floors(0));
        assert_eq!(c.peek(t(100), m(0)), t(100));
        assert_eq!(c.peek(t(-100), m(1)), t(1));
    }

    #[test]
    fn a_cloud_half_a_minute_ahead_is_trusted_before_and_after_a_restart() {
        let mut c = Clock::start(floors(0));
        c.observe_issued_at(t(130), m(100));
        assert_eq!(c.effective(t(100), m(100)), t(130));
        assert!(c.trusted(t(100), m(100)));
        let saved = c.floors(t(100), m(100));
        assert_eq!(
            saved.effective,
            t(130),
            "the effective floor keeps the lead"
        );
        assert_eq!(saved.system, t(100), "the system floor does not");
        // Back ten seconds later: the system clock is behind the effective
        // floor, by the cloud's lead, but not behind its own readings.
        let after = Clock::start(saved);
        assert_eq!(after.peek(t(110), m(0)), t(130));
        assert_eq!(after.trust(t(110), m(0)), Trust::Trusted);
        assert!(after.trusted(t(140), m(30)));
    }

    #[test]
    fn an_issued_at_over_an_hour_ahead_is_still_untrusted_after_a_restart() {
        let mut c = Clock::start(floors(0));
        c.observe_issued_at(t(ISSUED_AT_AHEAD_S + 60), m(0));
        assert!(!c.trusted(t(0), m(0)));
        let after = restart(&mut c, t(0), m(0));
        assert_eq!(
            after.trust(t(10), m(0)),
            Trust::AheadOfSystem {
                by_us: (ISSUED_AT_AHEAD_S + 50) * 1_000_000
            }
        );
        // Once the system clock has caught up, trust returns.
        assert!(after.trusted(t(100), m(0)));
    }

    #[test]
    fn a_system_clock_stepped_back_is_still_untrusted_after_a_restart() {
        let mut c = Clock::start(floors(0));
        assert_eq!(c.effective(t(1000), m(10)), t(1000));
        assert!(!c.trusted(t(500), m(20)));
        let after = restart(&mut c, t(500), m(20));
        assert_eq!(
            after.trust(t(505), m(5)),
            Trust::SystemBehindFloor {
                by_us: 510 * 1_000_000
            }
        );
    }

    #[test]
    fn a_clock_reset_to_1970_after_a_power_cut_is_untrusted_and_gives_way_to_the_floors() {
        let mut c = Clock::start(floors(0));
        let after = restart(&mut c, t(600), m(600));
        let epoch = Timestamp::from_secs(0);
        assert_eq!(after.peek(epoch, m(1)), t(601));
        assert!(matches!(
            after.trust(epoch, m(1)),
            Trust::SystemBehindFloor { .. }
        ));
    }
}
