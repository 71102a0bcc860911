//! `[hub]`.

use super::*;

pub(super) fn read_hub(d: &mut Diag<'_>, root: &Table<'_, '_>, base: &Path) -> Option<HubConfig> {
    let t = root.table(d, "hub", "[hub]", &["site_id", "hub_id", "data_dir"], true)?;
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
    Some(HubConfig {
        site_id: site_id?,
        hub_id: hub_id?,
        data_dir: data_dir?,
    })
}
