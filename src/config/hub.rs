//! `[hub]`.

use super::*;

pub(super) fn read_hub(d: &mut Diag<'_>, root: &Table<'_, '_>, base: &Path) -> Option<HubConfig> {
    let t = root.table(
        d,
        "hub",
        "[hub]",
        &["site_id", "hub_id", "data_dir", "timezone"],
        true,
    )?;
    let site_id = t.str(d, "site_id", true).and_then(|(s, span)| {
        // The hyphenated form only: it is what topics and the cloud use.
        match lockhub_proto::event::parse_uuid_strict(s) {
            Some(u) => Some(u),
            None => {
                d.at(
                    span,
                    "`site_id` must be a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                );
                None
            }
        }
    });
    let hub_id = t.str(d, "hub_id", true).and_then(|(s, span)| {
        if lockhub_proto::event::is_key_id(s) {
            Some(s.to_owned())
        } else {
            d.at(
                span,
                "`hub_id` must be 1..=64 characters of A-Z a-z 0-9 . _ -",
            );
            None
        }
    });
    let data_dir = t.path(d, "data_dir", true, base).and_then(|(p, span)| {
        // It need not exist yet (the daemon creates it), but if it does it
        // must be a directory.
        match std::fs::metadata(&p) {
            Ok(m) if !m.is_dir() => {
                d.at(
                    span,
                    format!("`data_dir` {} exists and is not a directory", p.display()),
                );
                None
            }
            _ => Some(p),
        }
    });
    let timezone = match t.str(d, "timezone", false) {
        None if t.get("timezone").is_none() => Some(jiff::tz::TimeZone::UTC),
        None => None,
        Some((name, span)) => match time_zone(name) {
            Some(tz) => Some(tz),
            None => {
                d.at(
                    span,
                    format!(
                        "`timezone` {name:?} is not a zone the hub's time zone database knows: \
                         write an IANA name such as \"Europe/Berlin\" or \"UTC\""
                    ),
                );
                None
            }
        },
    };
    Some(HubConfig {
        site_id: site_id?,
        hub_id: hub_id?,
        data_dir: data_dir?,
        timezone: timezone?,
    })
}

/// The zone named `name` in the IANA database: the system's zoneinfo
/// (`TZDIR` or `/usr/share/zoneinfo`), which the OS keeps current; where it
/// is missing, or lacks the name (an image without tzdata, an old tzdata),
/// the copy built into the binary (jiff's `tzdb-bundle-always`). Only
/// names: a POSIX TZ string or a file path is not a zone an installer can
/// check against the database.
pub fn time_zone(name: &str) -> Option<jiff::tz::TimeZone> {
    if name.is_empty() || name.starts_with('/') || name.contains("..") {
        return None;
    }
    jiff::tz::db()
        .get(name)
        .or_else(|_| jiff::tz::TimeZoneDatabase::bundled().get(name))
        .ok()
}
