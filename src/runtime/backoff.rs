//! Retry delays, as plain arithmetic: one capped doubling [`Backoff`] for
//! every retry loop (serial reopens, MQTT reconnects, refused subscriptions,
//! repeated sync requests), and [`Jitter`], the small generator the planners
//! draw their spreads from.
//!
//! Each caller keeps its own parameters; only the rule lives here. Callers
//! that wait on something one peer alone sees (a serial port) take the step
//! itself ([`Backoff::next_step`]); callers that a whole fleet runs at once
//! against one broker take a "full jitter" draw in `[0, step]`
//! ([`Backoff::next_delay`]), so hubs dropped together do not come back
//! together.

use std::time::Duration;

/// Delays from `start`, doubling up to `max`, until [`Backoff::reset`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    start: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    pub fn new(start: Duration, max: Duration) -> Self {
        Backoff {
            start,
            max,
            step: start,
        }
    }

    /// The current step; the one after is twice as long (at most `max`).
    pub fn next_step(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        step
    }

    /// A delay uniform in `[0, step]` ("full jitter"), then the step
    /// doubles; `random` is any uniformly random u64.
    pub fn next_delay(&mut self, random: u64) -> Duration {
        uniform_up_to(self.next_step(), random)
    }

    /// The longest the next delay can be (for log lines).
    pub fn peek(&self) -> Duration {
        self.step
    }

    /// It worked: the next failure starts from `start` again.
    pub fn reset(&mut self) {
        self.step = self.start;
    }
}

/// A duration uniform in `[0, max]` from one random u64.
pub fn uniform_up_to(max: Duration, random: u64) -> Duration {
    let span = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if span == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(random % span.saturating_add(1))
}

/// A small deterministic generator (SplitMix64) for the planners' jitter:
/// seeded once from the OS by the caller, reproducible in tests.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    pub fn new(seed: u64) -> Self {
        Jitter(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, max]`.
    pub fn within(&mut self, max: Duration) -> Duration {
        if max.is_zero() {
            return Duration::ZERO;
        }
        let r = self.next_u64();
        uniform_up_to(max, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_start_small_and_double_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let got: Vec<u64> = (0..9).map(|_| b.next_step().as_millis() as u64).collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }

    #[test]
    fn a_reset_starts_the_steps_over() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        b.next_step();
        b.next_step();
        assert_eq!(b.peek(), Duration::from_millis(400));
        b.reset();
        assert_eq!(b.next_step(), Duration::from_millis(100));
    }

    #[test]
    fn a_jittered_delay_never_exceeds_its_step_and_can_be_zero() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
        assert_eq!(b.next_delay(0), Duration::ZERO);
        for step in [2, 4, 4] {
            let d = b.next_delay(u64::MAX);
            assert!(d <= Duration::from_secs(step), "{d:?} over {step} s");
        }
        let mut rng = Jitter::new(7);
        let draws: Vec<Duration> = (0..100)
            .map(|_| rng.within(Duration::from_secs(1)))
            .collect();
        assert!(draws.iter().all(|d| *d <= Duration::from_secs(1)));
        assert!(draws.iter().any(|d| *d != draws[0]), "the draws vary");
    }
}
