//! Weekly schedules (mqtt.md 'Grant', `schedule`): the hours a key opens,
//! read in the hub's wall-clock time.
//!
//! A schedule is 1..=[`MAX_INTERVALS`] intervals, each a set of weekdays and
//! a `[from, until)` span of the day in whole minutes (`until` may be
//! `24:00`). An instant is inside when its local wall time, in the time zone
//! the caller passes, falls in one interval on one of that interval's days.
//! Converting the instant to local time is the whole of the daylight-saving
//! rule: a wall time that a spring-forward skips is never the local time of
//! any instant, so it never matches, and one that a fall-back repeats is the
//! local time of two instants, so it matches both times.
//!
//! Pure: the zone is given (the hub loads it once from `[hub] timezone`);
//! this module reads no file and no clock.
//!
//! Three spellings of one schedule, each with one home here:
//! - the wire's JSON ([`Schedule::from_json`], [`Schedule::to_json`]), which
//!   the hub also stores, so the stored text is the canonical one;
//! - a short text for people, one interval at a time (`mon-fri 09:00-17:30`,
//!   [`Interval::parse_text`] and `Display`), which the cloud's command line
//!   reads and `lockhub keys` prints.

use crate::time::Timestamp;
use serde_json::{Value, json};
use std::fmt;

/// The most intervals one schedule may hold.
pub const MAX_INTERVALS: usize = 28;
/// Minutes in a day: the largest `until` (`24:00`).
const DAY_MINUTES: u16 = 24 * 60;
/// The wire's day names, Monday first: bit `i` of [`Days`] is `DAY_NAMES[i]`.
pub const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// A non-empty set of weekdays: bit 0 is Monday, bit 6 Sunday.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Days(u8);

impl Days {
    /// The set of these day indexes (0 = Monday), or `None` when it is empty
    /// or an index is past Sunday.
    pub fn from_indexes(days: impl IntoIterator<Item = u8>) -> Option<Days> {
        let mut bits = 0u8;
        for d in days {
            if d > 6 {
                return None;
            }
            bits |= 1 << d;
        }
        (bits != 0).then_some(Days(bits))
    }

    /// Whether the day `monday_zero` (0 = Monday .. 6 = Sunday) is in it.
    pub fn contains(self, monday_zero: u8) -> bool {
        monday_zero < 7 && self.0 & (1 << monday_zero) != 0
    }

    /// The day indexes in it, Monday first.
    pub fn iter(self) -> impl Iterator<Item = u8> {
        (0..7).filter(move |d| self.contains(*d))
    }
}

/// One weekly interval: on each of `days`, local wall time in `[from, until)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interval {
    days: Days,
    /// Minutes after local midnight, 0..=1439.
    from: u16,
    /// Minutes after local midnight, `from + 1..=1440`.
    until: u16,
}

/// Why an interval written for people was refused: each says what to write
/// instead (the cloud's command line prints it and exits 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleTextError {
    #[error("write a schedule as DAYS FROM-UNTIL, for example 'mon-fri 09:00-17:30'")]
    Shape,
    #[error(
        "'{0}' is not a day: use mon tue wed thu fri sat sun, a range such as mon-fri, or a list such as sat,sun"
    )]
    Day(String),
    #[error("the day range '{0}' runs backwards: ranges run from mon to sun (write fri-sun,mon)")]
    BackwardRange(String),
    #[error("a day is named twice in '{0}'")]
    RepeatedDay(String),
    #[error("'{0}' is not a time: write HH:MM from 00:00 to 23:59 (24:00 only as the end)")]
    Time(String),
    #[error("the interval must end after it starts: '{0}'")]
    Empty(String),
}

/// `HH:MM`, two digits each, `00:00..=23:59`, and `24:00` when `end`.
fn parse_hhmm(s: &str, end: bool) -> Option<u16> {
    let b = s.as_bytes();
    if b.len() != 5 || b[2] != b':' || ![b[0], b[1], b[3], b[4]].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let h = u16::from(b[0] - b'0') * 10 + u16::from(b[1] - b'0');
    let m = u16::from(b[3] - b'0') * 10 + u16::from(b[4] - b'0');
    match (h, m) {
        (0..=23, 0..=59) => Some(h * 60 + m),
        (24, 0) if end => Some(DAY_MINUTES),
        _ => None,
    }
}

fn day_index(name: &str) -> Option<u8> {
    DAY_NAMES.iter().position(|d| *d == name).map(|i| i as u8)
}

impl Interval {
    /// An interval from its parts, under the wire's rules: a day set, and
    /// `from < until` in minutes after midnight with `until <= 24:00`.
    pub fn new(days: Days, from: u16, until: u16) -> Option<Interval> {
        (from < until && until <= DAY_MINUTES).then_some(Interval { days, from, until })
    }

    pub fn days(&self) -> Days {
        self.days
    }

    /// Minutes after local midnight the interval starts (inclusive).
    pub fn from_minute(&self) -> u16 {
        self.from
    }

    /// Minutes after local midnight the interval ends (exclusive; 1440 is
    /// `24:00`).
    pub fn until_minute(&self) -> u16 {
        self.until
    }

    /// Whether local day `monday_zero` at `minute` after midnight is inside.
    pub fn contains_local(&self, monday_zero: u8, minute: u16) -> bool {
        self.days.contains(monday_zero) && self.from <= minute && minute < self.until
    }

    /// One wire interval, `{"days": [...], "from": "HH:MM", "until": "HH:MM"}`
    /// (unknown fields ignored, as everywhere in a grant); `None` when it
    /// breaks any rule of mqtt.md 'Grant'.
    pub fn from_json(v: &Value) -> Option<Interval> {
        let o = v.as_object()?;
        let days_v = o.get("days")?.as_array()?;
        if days_v.is_empty() || days_v.len() > 7 {
            return None;
        }
        let mut bits = 0u8;
        for d in days_v {
            let i = day_index(d.as_str()?)?;
            if bits & (1 << i) != 0 {
                return None;
            }
            bits |= 1 << i;
        }
        let from = parse_hhmm(o.get("from")?.as_str()?, false)?;
        let until = parse_hhmm(o.get("until")?.as_str()?, true)?;
        Interval::new(Days(bits), from, until)
    }

    /// The wire form, days Monday first.
    pub fn to_json(&self) -> Value {
        let days: Vec<&str> = self.days.iter().map(|d| DAY_NAMES[d as usize]).collect();
        json!({"days": days, "from": hhmm(self.from), "until": hhmm(self.until)})
    }

    /// The form for people: `DAYS FROM-UNTIL`, where DAYS is a comma list of
    /// days and forward ranges (`mon-fri`, `sat,sun`, `mon-wed,fri`).
    pub fn parse_text(s: &str) -> Result<Interval, ScheduleTextError> {
        let mut parts = s.split_whitespace();
        let (Some(days_s), Some(span), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(ScheduleTextError::Shape);
        };
        let mut bits = 0u8;
        for item in days_s.split(',') {
            let (a, b) = match item.split_once('-') {
                Some((a, b)) => (a, b),
                None => (item, item),
            };
            let a_i = day_index(a).ok_or_else(|| ScheduleTextError::Day(a.to_owned()))?;
            let b_i = day_index(b).ok_or_else(|| ScheduleTextError::Day(b.to_owned()))?;
            if a_i > b_i {
                return Err(ScheduleTextError::BackwardRange(item.to_owned()));
            }
            for d in a_i..=b_i {
                if bits & (1 << d) != 0 {
                    return Err(ScheduleTextError::RepeatedDay(days_s.to_owned()));
                }
                bits |= 1 << d;
            }
        }
        let (from_s, until_s) = span.split_once('-').ok_or(ScheduleTextError::Shape)?;
        let from =
            parse_hhmm(from_s, false).ok_or_else(|| ScheduleTextError::Time(from_s.to_owned()))?;
        let until =
            parse_hhmm(until_s, true).ok_or_else(|| ScheduleTextError::Time(until_s.to_owned()))?;
        Interval::new(Days(bits), from, until)
            .ok_or_else(|| ScheduleTextError::Empty(span.to_owned()))
    }
}

fn hhmm(minutes: u16) -> String {
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

impl fmt::Display for Interval {
    /// `mon-fri 09:00-17:30`: runs of three or more days as a range.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut d = 0u8;
        while d < 7 {
            if !self.days.contains(d) {
                d += 1;
                continue;
            }
            let mut end = d;
            while end + 1 < 7 && self.days.contains(end + 1) {
                end += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            match end - d {
                0 => f.write_str(DAY_NAMES[d as usize])?,
                1 => write!(f, "{},{}", DAY_NAMES[d as usize], DAY_NAMES[end as usize])?,
                _ => write!(f, "{}-{}", DAY_NAMES[d as usize], DAY_NAMES[end as usize])?,
            }
            d = end + 1;
        }
        write!(f, " {}-{}", hhmm(self.from), hhmm(self.until))
    }
}

/// A key's weekly schedule: 1..=[`MAX_INTERVALS`] intervals.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schedule(Vec<Interval>);

impl Schedule {
    /// A schedule of these intervals, or `None` when there are none or more
    /// than [`MAX_INTERVALS`].
    pub fn new(intervals: Vec<Interval>) -> Option<Schedule> {
        (1..=MAX_INTERVALS)
            .contains(&intervals.len())
            .then_some(Schedule(intervals))
    }

    pub fn intervals(&self) -> &[Interval] {
        &self.0
    }

    /// The wire form: an array of 1..=28 intervals; `None` when it breaks any
    /// rule of mqtt.md 'Grant' (the grant is then `invalid_grant`).
    pub fn from_json(v: &Value) -> Option<Schedule> {
        let a = v.as_array()?;
        if a.len() > MAX_INTERVALS {
            return None;
        }
        Schedule::new(a.iter().map(Interval::from_json).collect::<Option<_>>()?)
    }

    pub fn to_json(&self) -> Value {
        Value::Array(self.0.iter().map(Interval::to_json).collect())
    }

    /// The wire form as compact text (what the hub stores).
    pub fn to_json_string(&self) -> String {
        self.to_json().to_string()
    }

    /// [`Schedule::from_json`] of JSON text.
    pub fn from_json_str(s: &str) -> Option<Schedule> {
        serde_json::from_str::<Value>(s)
            .ok()
            .and_then(|v| Schedule::from_json(&v))
    }

    /// Whether the local wall time of `at` in `tz` is inside one interval on
    /// one of its days (`from` inclusive, `until` exclusive). An instant
    /// outside the range the time zone database can name is never inside.
    pub fn contains(&self, at: Timestamp, tz: &jiff::tz::TimeZone) -> bool {
        let Ok(ts) = jiff::Timestamp::from_microsecond(at.0) else {
            return false;
        };
        let local = tz.to_datetime(ts);
        let day = local.weekday().to_monday_zero_offset() as u8;
        let minute = local.hour() as u16 * 60 + local.minute() as u16;
        self.0.iter().any(|i| i.contains_local(day, minute))
    }
}

impl fmt::Display for Schedule {
    /// The intervals for people, `; ` between them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, i) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{i}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::tz::TimeZone;

    fn at(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).unwrap()
    }

    fn sched(v: Value) -> Option<Schedule> {
        Schedule::from_json(&v)
    }

    fn one(days: Value, from: &str, until: &str) -> Option<Schedule> {
        sched(json!([{"days": days, "from": from, "until": until}]))
    }

    /// The owners' vectors: every case must give the page's answer.
    #[test]
    fn every_case_of_the_schedule_vectors_opens_as_the_vectors_say() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../spec/vectors/mqtt/schedule.json"
        ))
        .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let schedules: std::collections::BTreeMap<&str, Schedule> = v["schedules"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, s)| (name.as_str(), Schedule::from_json(s).expect(name)))
            .collect();
        let cases = v["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 676);
        let mut zones = std::collections::BTreeMap::new();
        let mut wrong = Vec::new();
        let mut opens = 0;
        for c in cases {
            let tz_name = c["tz"].as_str().unwrap();
            let tz = zones
                .entry(tz_name)
                .or_insert_with(|| TimeZone::get(tz_name).unwrap());
            let s = &schedules[c["schedule"].as_str().unwrap()];
            let instant = at(c["at"].as_str().unwrap());
            let want = c["opens"].as_bool().unwrap();
            opens += usize::from(want);
            if s.contains(instant, tz) != want {
                wrong.push(c.to_string());
            }
        }
        assert!(
            wrong.is_empty(),
            "{} wrong:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
        // Both answers are exercised, so a schedule that always (or never)
        // opens cannot pass.
        assert!(opens > 0 && opens < cases.len());
    }

    #[test]
    fn from_is_inclusive_and_until_is_exclusive_to_the_microsecond() {
        let s = one(json!(["fri"]), "09:00", "17:30").unwrap();
        let utc = TimeZone::UTC;
        // 2026-12-04 is a Friday.
        assert!(!s.contains(at("2026-12-04T08:59:59.999999Z"), &utc));
        assert!(s.contains(at("2026-12-04T09:00:00Z"), &utc));
        assert!(s.contains(at("2026-12-04T17:29:59.999999Z"), &utc));
        assert!(!s.contains(at("2026-12-04T17:30:00Z"), &utc));
        assert!(!s.contains(at("2026-12-05T10:00:00Z"), &utc), "a Saturday");
    }

    #[test]
    fn until_24_00_runs_to_the_end_of_the_day_and_a_night_shift_is_two_intervals() {
        let s = sched(json!([
            {"days": ["fri"], "from": "22:00", "until": "24:00"},
            {"days": ["sat"], "from": "00:00", "until": "06:00"}
        ]))
        .unwrap();
        let utc = TimeZone::UTC;
        assert!(s.contains(at("2026-12-04T23:59:59Z"), &utc));
        assert!(s.contains(at("2026-12-05T00:00:00Z"), &utc));
        assert!(!s.contains(at("2026-12-05T06:00:00Z"), &utc));
        assert!(
            !s.contains(at("2026-12-04T00:30:00Z"), &utc),
            "friday morning"
        );
    }

    #[test]
    fn the_same_instant_is_inside_in_one_zone_and_outside_in_another() {
        let s = one(json!(["fri"]), "09:00", "10:00").unwrap();
        let i = at("2026-12-04T08:30:00Z");
        assert!(s.contains(i, &TimeZone::get("Europe/Berlin").unwrap()));
        assert!(!s.contains(i, &TimeZone::UTC));
    }

    #[test]
    fn a_schedule_that_breaks_a_rule_of_the_page_is_refused() {
        let long: Vec<Value> = (0..29)
            .map(|_| json!({"days": ["mon"], "from": "09:00", "until": "10:00"}))
            .collect();
        let bad = [
            json!([]),
            json!({}),
            json!(null),
            Value::Array(long),
            json!([{"days": [], "from": "09:00", "until": "10:00"}]),
            json!([{"days": ["mon", "mon"], "from": "09:00", "until": "10:00"}]),
            json!([{"days": ["Mon"], "from": "09:00", "until": "10:00"}]),
            json!([{"days": ["monday"], "from": "09:00", "until": "10:00"}]),
            json!([{"days": "mon", "from": "09:00", "until": "10:00"}]),
            json!([{"days": ["mon"], "from": "9:00", "until": "10:00"}]),
            json!([{"days": ["mon"], "from": "09:0", "until": "10:00"}]),
            json!([{"days": ["mon"], "from": "24:00", "until": "24:00"}]),
            json!([{"days": ["mon"], "from": "09:00", "until": "24:01"}]),
            json!([{"days": ["mon"], "from": "09:00", "until": "25:00"}]),
            json!([{"days": ["mon"], "from": "09:60", "until": "10:00"}]),
            json!([{"days": ["mon"], "from": "10:00", "until": "10:00"}]),
            json!([{"days": ["mon"], "from": "10:00", "until": "09:00"}]),
            json!([{"days": ["mon"], "from": "+9:00", "until": "10:00"}]),
            json!([{"days": ["mon"], "from": "０9:00", "until": "10:00"}]),
            json!([{"days": ["mon"], "from": "09:00"}]),
            json!([{"days": ["mon"], "until": "10:00"}]),
            json!([{"from": "09:00", "until": "10:00"}]),
            json!([{"days": ["mon"], "from": 900, "until": "10:00"}]),
            json!(["mon 09:00-10:00"]),
        ];
        for b in bad {
            assert_eq!(sched(b.clone()), None, "{b}");
        }
        let edges = [
            json!([{"days": ["mon"], "from": "00:00", "until": "24:00"}]),
            json!([{"days": ["mon"], "from": "23:59", "until": "24:00"}]),
            json!([{"days": ["sun", "mon"], "from": "00:00", "until": "00:01", "note": "x"}]),
            json!([{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "from": "00:00", "until": "23:59"}]),
        ];
        for g in edges {
            assert!(sched(g.clone()).is_some(), "{g}");
        }
        let max: Vec<Value> = (0..28)
            .map(|_| json!({"days": ["mon"], "from": "09:00", "until": "10:00"}))
            .collect();
        assert!(sched(Value::Array(max)).is_some());
    }

    #[test]
    fn the_wire_form_comes_back_as_it_was_read_with_days_monday_first() {
        let s = sched(json!([
            {"days": ["sun", "sat"], "from": "07:05", "until": "24:00"},
            {"days": ["mon"], "from": "00:00", "until": "06:00"}
        ]))
        .unwrap();
        assert_eq!(
            s.to_json_string(),
            r#"[{"days":["sat","sun"],"from":"07:05","until":"24:00"},{"days":["mon"],"from":"00:00","until":"06:00"}]"#
        );
        assert_eq!(Schedule::from_json_str(&s.to_json_string()), Some(s));
    }

    #[test]
    fn the_text_for_people_reads_ranges_and_lists_and_prints_them_back() {
        for (text, shown) in [
            ("mon-fri 09:00-17:30", "mon-fri 09:00-17:30"),
            ("sat,sun 10:00-24:00", "sat,sun 10:00-24:00"),
            ("mon,tue,wed,fri 08:00-09:00", "mon-wed,fri 08:00-09:00"),
            ("sun  00:00-06:00", "sun 00:00-06:00"),
            ("mon-sun 00:00-24:00", "mon-sun 00:00-24:00"),
        ] {
            let i = Interval::parse_text(text).unwrap();
            assert_eq!(i.to_string(), shown, "{text}");
            assert_eq!(Interval::parse_text(shown), Ok(i));
        }
        let s = Schedule::new(vec![
            Interval::parse_text("fri 22:00-24:00").unwrap(),
            Interval::parse_text("sat 00:00-06:00").unwrap(),
        ])
        .unwrap();
        assert_eq!(s.to_string(), "fri 22:00-24:00; sat 00:00-06:00");
    }

    #[test]
    fn a_bad_text_interval_says_what_is_wrong() {
        use ScheduleTextError::*;
        for (text, want) in [
            ("", Shape),
            ("mon-fri", Shape),
            ("mon-fri 09:00-17:30 extra", Shape),
            ("mon-fri 09:00", Shape),
            ("monday 09:00-10:00", Day("monday".into())),
            ("mon-xyz 09:00-10:00", Day("xyz".into())),
            ("fri-mon 09:00-10:00", BackwardRange("fri-mon".into())),
            ("mon-fri,wed 09:00-10:00", RepeatedDay("mon-fri,wed".into())),
            ("mon 9:00-10:00", Time("9:00".into())),
            ("mon 09:00-24:30", Time("24:30".into())),
            ("mon 24:00-24:00", Time("24:00".into())),
            ("mon 10:00-09:00", Empty("10:00-09:00".into())),
        ] {
            assert_eq!(Interval::parse_text(text), Err(want), "{text:?}");
        }
    }

    /// Real minutes inside `text` over the 26 hours from `from` (UTC),
    /// read in Berlin: the examples of docs/protocol/mqtt.md '`schedule`'.
    fn open_minutes(text: &str, from: &str) -> i64 {
        let s = Schedule::new(vec![Interval::parse_text(text).unwrap()]).unwrap();
        let tz = TimeZone::get("Europe/Berlin").unwrap();
        let start = at(from).0;
        (0..26 * 60)
            .filter(|m| s.contains(Timestamp(start + m * 60_000_000), &tz))
            .count() as i64
    }

    #[test]
    fn the_daylight_saving_examples_of_the_docs_hold_in_berlin() {
        // Spring forward: Sunday 2027-03-28; fall back: Sunday 2026-10-25;
        // an ordinary Sunday: 2026-11-01. Each window starts Saturday 22:00Z.
        let spring = "2027-03-27T22:00:00Z";
        let autumn = "2026-10-24T22:00:00Z";
        let plain = "2026-10-31T22:00:00Z";
        assert_eq!(open_minutes("sun 02:00-03:00", spring), 0);
        assert_eq!(open_minutes("sun 02:00-03:00", autumn), 120);
        assert_eq!(open_minutes("sun 02:00-03:00", plain), 60);
        assert_eq!(open_minutes("sun 01:30-02:30", spring), 30);
        assert_eq!(open_minutes("sun 01:30-02:30", autumn), 90);
        assert_eq!(open_minutes("sun 02:30-05:00", spring), 120);
        assert_eq!(open_minutes("sun 02:30-05:00", plain), 150);
    }

    #[test]
    fn an_instant_past_what_the_zone_database_can_name_is_never_inside() {
        let s = one(
            json!(["mon", "tue", "wed", "thu", "fri", "sat", "sun"]),
            "00:00",
            "24:00",
        )
        .unwrap();
        assert!(!s.contains(Timestamp(i64::MAX), &TimeZone::UTC));
        assert!(s.contains(at("2026-12-04T12:00:00Z"), &TimeZone::UTC));
    }
}
