//! `[policy]`.

use super::*;

pub(super) fn read_policy(d: &mut Diag<'_>, root: &Table<'_, '_>) -> Option<Policy> {
    const KEYS: [&str; 8] = [
        "lockout_threshold",
        "lockout_window_s",
        "lockout_base_s",
        "held_open_s",
        "max_grant_days",
        "dedupe_retention_days",
        "audit_retention_days",
        "cloud_stale_s",
    ];
    let mut p = Policy::default();
    let Some(t) = root.table(d, "policy", "[policy]", &KEYS, false) else {
        // Absent is all defaults; present but not a table was reported.
        return (root.get("policy").is_none()).then_some(p);
    };
    let mut ok = true;
    for key in KEYS {
        if t.get(key).is_none() {
            continue;
        }
        let Some((n, span)) = t.int(d, key, false) else {
            ok = false;
            continue;
        };
        let Some(v) = u32::try_from(n).ok().filter(|v| *v > 0) else {
            d.at(
                span,
                format!(
                    "`{key}` must be a positive integer (1..={}), found {n}",
                    u32::MAX
                ),
            );
            ok = false;
            continue;
        };
        match key {
            "lockout_threshold" => p.lockout_threshold = v,
            "lockout_window_s" => p.lockout_window_s = v,
            "lockout_base_s" => p.lockout_base_s = v,
            "held_open_s" => p.held_open_s = v,
            "max_grant_days" => p.max_grant_days = v,
            "dedupe_retention_days" => p.dedupe_retention_days = v,
            "audit_retention_days" => p.audit_retention_days = v,
            _ => p.cloud_stale_s = v,
        }
    }
    ok.then_some(p)
}
