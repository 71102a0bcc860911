//! Time as lockhub sees it.
//!
//! Every instant is a [`Timestamp`]: microseconds since the Unix epoch, UTC.
//! Microseconds keep ordering exact for the RFC 3339 strings the cloud sends
//! (up to nine fraction digits are accepted; anything finer than a
//! microsecond is truncated toward the past) while still fitting SQLite's
//! 64-bit integers for any year a grant can name.
//!
//! The hub's *effective* time (mqtt.md 'Time') is the later of the system
//! clock and a durable floor; the rules for it live beside this type.

use std::fmt;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// An instant: microseconds since 1970-01-01T00:00:00Z.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

/// Why a time string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("not an RFC 3339 date-time")]
    NotRfc3339,
    #[error("date-time out of range")]
    OutOfRange,
}

impl Timestamp {
    pub const MICROS_PER_SEC: i64 = 1_000_000;
    pub const MICROS_PER_DAY: i64 = 86_400 * Self::MICROS_PER_SEC;

    /// Parses RFC 3339 with `Z` or a numeric offset and 0 to 9 fraction digits.
    pub fn parse_rfc3339(s: &str) -> Result<Self, TimeError> {
        // The `time` parser accepts some forms RFC 3339 does not (lowercase
        // `t`/`z`, leap second 60); reject what the contract does not name.
        let b = s.as_bytes();
        if b.len() < 20
            || b[10] != b'T'
            || !(s.ends_with('Z') || s.contains('+') || s[10..].contains('-'))
        {
            return Err(TimeError::NotRfc3339);
        }
        if let Some(dot) = s.find('.') {
            let frac = s[dot + 1..].bytes().take_while(u8::is_ascii_digit).count();
            if !(1..=9).contains(&frac) {
                return Err(TimeError::NotRfc3339);
            }
        }
        // Seconds field "60" (a leap second) names no instant the hub can
        // order consistently; the contract's producers never send one.
        if b.get(17..19) == Some(b"60") {
            return Err(TimeError::NotRfc3339);
        }
        let dt = OffsetDateTime::parse(s, &Rfc3339).map_err(|_| TimeError::NotRfc3339)?;
        let nanos = dt.unix_timestamp_nanos();
        let micros = nanos.div_euclid(1000);
        i64::try_from(micros)
            .map(Timestamp)
            .map_err(|_| TimeError::OutOfRange)
    }

    /// Formats as RFC 3339 in UTC with microseconds (`2026-11-29T12:00:00.000000Z`).
    pub fn to_rfc3339(self) -> String {
        match OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0) * 1000) {
            Ok(dt) => {
                let (y, mo, d) = (dt.year(), dt.month() as u8, dt.day());
                format!(
                    "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
                    dt.hour(),
                    dt.minute(),
                    dt.second(),
                    dt.microsecond()
                )
            }
            Err(_) => "invalid".to_owned(),
        }
    }

    /// The system clock now.
    pub fn now_system() -> Self {
        let nanos = OffsetDateTime::now_utc().unix_timestamp_nanos();
        Timestamp(i64::try_from(nanos / 1000).unwrap_or(i64::MAX))
    }

    pub fn from_secs(s: i64) -> Self {
        Timestamp(s.saturating_mul(Self::MICROS_PER_SEC))
    }

    pub fn saturating_add_micros(self, us: i64) -> Self {
        Timestamp(self.0.saturating_add(us))
    }

    pub fn saturating_add_secs(self, s: i64) -> Self {
        self.saturating_add_micros(s.saturating_mul(Self::MICROS_PER_SEC))
    }

    pub fn saturating_add_days(self, d: i64) -> Self {
        self.saturating_add_micros(d.saturating_mul(Self::MICROS_PER_DAY))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.to_rfc3339())
    }
}

/// On the wire an instant is its RFC 3339 text: written as
/// [`Timestamp::to_rfc3339`] (UTC, microseconds), read by
/// [`Timestamp::parse_rfc3339`].
impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Timestamp::parse_rfc3339(&s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_z_and_offsets_as_the_same_instant() {
        let a = Timestamp::parse_rfc3339("2026-11-29T12:00:00Z").unwrap();
        let b = Timestamp::parse_rfc3339("2026-11-29T13:30:00+01:30").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.0, 1_795_953_600 * 1_000_000);
    }

    #[test]
    fn accepts_zero_to_nine_fraction_digits_and_truncates_below_a_microsecond() {
        let t = Timestamp::parse_rfc3339("2026-11-29T12:00:00.123456789Z").unwrap();
        assert_eq!(t.0 % 1_000_000, 123_456);
        assert!(Timestamp::parse_rfc3339("2026-11-29T12:00:00.1234567891Z").is_err());
        assert!(Timestamp::parse_rfc3339("2026-11-29T12:00:00.Z").is_err());
    }

    #[test]
    fn refuses_dates_without_offset_or_in_other_shapes() {
        for s in [
            "2026-11-29T12:00:00",
            "2026-11-29 12:00:00Z",
            "yesterday",
            "",
            "2026-11-29t12:00:00z",
        ] {
            assert!(Timestamp::parse_rfc3339(s).is_err(), "{s}");
        }
    }

    #[test]
    fn serde_writes_and_reads_the_rfc3339_text() {
        let t = Timestamp::parse_rfc3339("2099-01-31T00:00:00.5Z").unwrap();
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, r#""2099-01-31T00:00:00.500000Z""#);
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t);
        assert!(serde_json::from_str::<Timestamp>(r#""2099-01-31""#).is_err());
        assert!(serde_json::from_str::<Timestamp>("4070908800").is_err());
    }

    #[test]
    fn formats_round_trip() {
        let t = Timestamp::parse_rfc3339("2099-01-31T00:00:00.5Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2099-01-31T00:00:00.500000Z");
        assert_eq!(Timestamp::parse_rfc3339(&t.to_rfc3339()).unwrap(), t);
    }
}
