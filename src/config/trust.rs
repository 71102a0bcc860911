//! `[[trust.signer]]`: the cloud keys the hub trusts.

use super::*;

pub(super) fn read_trust(d: &mut Diag<'_>, root: &Table<'_, '_>) -> Option<Vec<Signer>> {
    let t = root.table(d, "trust", "[trust]", &["signer"], true)?;
    let tables = t.tables(
        d,
        "signer",
        "[[trust.signer]]",
        &["id", "public_key", "not_after"],
    );
    // `signer = []` trusts nobody either.
    let empty_list = t
        .get("signer")
        .is_none_or(|v| matches!(v.get_ref(), DeValue::Array(a) if a.is_empty()));
    if tables.is_empty() && empty_list {
        d.at(t.span.clone(), "no signer: add a [[trust.signer]]");
        return None;
    }
    let mut ids = Vec::new();
    let mut signers = Vec::new();
    for s in &tables {
        let id = s.name(d, "id");
        if let Some((id, span)) = &id {
            ids.push((*id, span.clone()));
        }
        let key =
            s.str(d, "public_key", true)
                .and_then(|(k, span)| match crypto::parse_public_key(k) {
                    Ok(key) => Some(key),
                    Err(e) => {
                        d.at(span, format!("`public_key` is {e}"));
                        None
                    }
                });
        let not_after = match s.get("not_after") {
            None => Some(None),
            Some(v) => {
                let text = match v.get_ref() {
                    DeValue::String(s) => Some(s.to_string()),
                    // A bare TOML date-time is the same instant when it has an offset.
                    DeValue::Datetime(dt) => Some(dt.to_string()),
                    _ => None,
                };
                match text.as_deref().map(Timestamp::parse_rfc3339) {
                    Some(Ok(ts)) => Some(Some(ts)),
                    Some(Err(_)) => {
                        d.at(
                            v.span(),
                            "`not_after` must be an RFC 3339 date-time with Z or an offset, like 2027-06-01T00:00:00Z",
                        );
                        None
                    }
                    None => {
                        Table::wrong_type(d, "not_after", v, "an RFC 3339 date-time string");
                        None
                    }
                }
            }
        };
        signers.push((|| {
            Some(Signer {
                id: id?.0.to_owned(),
                public_key: key?,
                not_after: not_after?,
            })
        })());
    }
    check_unique(d, "signer id", &ids);
    if tables.is_empty() {
        if let Some(v) = t.get("signer")
            && matches!(v.get_ref(), DeValue::Array(a) if a.is_empty())
        {
            d.at(v.span(), "no signer: add a [[trust.signer]]");
        }
        return None;
    }
    signers.into_iter().collect()
}
