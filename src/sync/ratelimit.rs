//! A token bucket for the results of step-1 rejections (mqtt.md 'Results').
//!
//! Why: an unauthenticated message costs an attacker nothing, and each
//! result costs the hub a commit and an uplink message. A burst of
//! [`BURST`] results, then one a second, keeps honest debugging possible
//! while a flood only bumps the `bad_signature` / `malformed_event` alert.
//!
//! Pure: the caller passes monotonic time, so tests need no clock.

use std::time::Duration;

/// Results allowed back to back.
pub const BURST: u32 = 10;
/// One more result allowed per this much time.
pub const REFILL_EVERY: Duration = Duration::from_secs(1);

/// A token bucket over monotonic time (any origin, as long as it only rises).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: u32,
    every: Duration,
    tokens: u32,
    /// When the last whole token was credited.
    last_refill: Duration,
}

impl TokenBucket {
    /// A full bucket: `capacity` immediately, then one per `every`.
    pub fn new(capacity: u32, every: Duration, now: Duration) -> Self {
        TokenBucket {
            capacity,
            every,
            tokens: capacity,
            last_refill: now,
        }
    }

    /// The step-1 result limiter of the contract.
    pub fn step1_results(now: Duration) -> Self {
        Self::new(BURST, REFILL_EVERY, now)
    }

    fn refill(&mut self, now: Duration) {
        if self.every.is_zero() {
            self.tokens = self.capacity;
            return;
        }
        let elapsed = now.saturating_sub(self.last_refill);
        let whole = elapsed.as_nanos() / self.every.as_nanos();
        if whole == 0 {
            return;
        }
        let add = u32::try_from(whole).unwrap_or(u32::MAX);
        self.tokens = self.tokens.saturating_add(add).min(self.capacity);
        if self.tokens == self.capacity {
            self.last_refill = now;
        } else {
            // Keep the fractional part so the long-run rate is exact.
            self.last_refill += self.every * add;
        }
    }

    /// Takes a token if one is available.
    pub fn try_take(&mut self, now: Duration) -> bool {
        self.refill(now);
        if self.tokens > 0 {
            self.tokens -= 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn a_burst_of_ten_passes_and_the_eleventh_is_refused() {
        let mut b = TokenBucket::step1_results(s(0.0));
        for _ in 0..10 {
            assert!(b.try_take(s(0.0)));
        }
        assert!(!b.try_take(s(0.0)));
        assert!(!b.try_take(s(0.9)));
    }

    #[test]
    fn after_the_burst_one_result_a_second_passes() {
        let mut b = TokenBucket::step1_results(s(0.0));
        (0..10).for_each(|_| assert!(b.try_take(s(0.0))));
        assert!(b.try_take(s(1.0)));
        assert!(!b.try_take(s(1.5)));
        assert!(b.try_take(s(2.0)));
        assert!(!b.try_take(s(2.99)));
    }

    #[test]
    fn a_quiet_period_refills_the_burst_but_never_beyond_it() {
        let mut b = TokenBucket::step1_results(s(0.0));
        (0..10).for_each(|_| assert!(b.try_take(s(0.0))));
        let mut n = 0;
        while b.try_take(s(3600.0)) {
            n += 1;
        }
        assert_eq!(n, 10);
    }

    #[test]
    fn a_flood_gets_about_one_result_per_second_in_the_long_run() {
        let mut b = TokenBucket::step1_results(s(0.0));
        let passed = (0..100_000)
            .filter(|i| b.try_take(s(f64::from(*i) * 0.001)))
            .count();
        // 100 s of a message every millisecond: the burst plus ~100.
        assert!((105..=111).contains(&passed), "{passed}");
    }
}
