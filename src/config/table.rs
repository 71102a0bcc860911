//! A TOML table read with diagnostics: typed getters that report what is
//! wrong where. The name rule itself is the wire's (`lockhub_proto::event::is_name`).

use super::*;
use lockhub_proto::event::is_name;

pub(super) type Value<'i> = Spanned<DeValue<'i>>;

/// A table being read. Unknown keys are reported when it is opened.
pub(super) struct Table<'a, 'i> {
    /// How messages name it: `[hub]`, `[[door]]`, `the config`.
    pub(super) what: String,
    pub(super) span: Range<usize>,
    pub(super) t: &'a DeTable<'i>,
}

impl<'a, 'i> Table<'a, 'i> {
    pub(super) fn open(
        d: &mut Diag<'_>,
        v: &'a Value<'i>,
        what: &str,
        allowed: &[&str],
    ) -> Option<Table<'a, 'i>> {
        match v.get_ref() {
            DeValue::Table(t) => {
                let table = Table {
                    what: what.to_owned(),
                    span: v.span(),
                    t,
                };
                table.check_unknown(d, allowed);
                Some(table)
            }
            other => {
                d.at(
                    v.span(),
                    format!("{what} must be a table, found {}", other.type_str()),
                );
                None
            }
        }
    }

    pub(super) fn check_unknown(&self, d: &mut Diag<'_>, allowed: &[&str]) {
        for (k, _) in self.t.iter() {
            let key: &str = k.get_ref();
            if !allowed.contains(&key) {
                let name = d.key_name(key);
                let hint = allowed
                    .iter()
                    .find(|a| edit_distance(a, key) <= 2)
                    .map(|a| format!(" (did you mean `{a}`?)"))
                    .unwrap_or_default();
                d.at(
                    k.span(),
                    format!("unknown key {name} in {}{hint}", self.what),
                );
            }
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value<'i>> {
        self.t.get(key)
    }

    pub(super) fn missing(&self, d: &mut Diag<'_>, key: &str) {
        d.at(
            self.span.clone(),
            format!("missing key `{key}` in {}", self.what),
        );
    }

    pub(super) fn wrong_type(d: &mut Diag<'_>, key: &str, v: &Value<'_>, expected: &str) {
        d.at(
            v.span(),
            format!(
                "`{key}` must be {expected}, found {}",
                v.get_ref().type_str()
            ),
        );
    }

    /// A required or optional sub-table.
    pub(super) fn table(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        what: &str,
        allowed: &[&str],
        required: bool,
    ) -> Option<Table<'a, 'i>> {
        match self.get(key) {
            None => {
                if required {
                    d.at(self.span.clone(), format!("missing table {what}"));
                }
                None
            }
            Some(v) => Table::open(d, v, what, allowed),
        }
    }

    /// An array of tables (`[[key]]`); absent is empty.
    pub(super) fn tables(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        what: &str,
        allowed: &[&str],
    ) -> Vec<Table<'a, 'i>> {
        let Some(v) = self.get(key) else {
            return Vec::new();
        };
        match v.get_ref() {
            DeValue::Array(items) => items
                .iter()
                .filter_map(|item| Table::open(d, item, what, allowed))
                .collect(),
            DeValue::Table(_) => {
                d.at(
                    v.span(),
                    format!("`{key}` must be an array of tables: write {what}"),
                );
                Vec::new()
            }
            _ => {
                Self::wrong_type(d, key, v, &format!("an array of tables ({what})"));
                Vec::new()
            }
        }
    }

    pub(super) fn str(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        required: bool,
    ) -> Option<(&'a str, Range<usize>)> {
        match self.get(key) {
            None => {
                if required {
                    self.missing(d, key);
                }
                None
            }
            Some(v) => match v.get_ref() {
                DeValue::String(s) => Some((s.as_ref(), v.span())),
                _ => {
                    Self::wrong_type(d, key, v, "a string");
                    None
                }
            },
        }
    }

    /// A non-empty string.
    pub(super) fn text(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        required: bool,
    ) -> Option<(&'a str, Range<usize>)> {
        let (s, span) = self.str(d, key, required)?;
        if s.trim().is_empty() {
            d.at(span, format!("`{key}` must not be empty"));
            return None;
        }
        Some((s, span))
    }

    /// A name or id ([`is_name`], the wire's rule).
    pub(super) fn name(&self, d: &mut Diag<'_>, key: &str) -> Option<(&'a str, Range<usize>)> {
        let (s, span) = self.str(d, key, true)?;
        if !is_name(s) {
            d.at(
                span,
                format!("`{key}` must be 1..=64 characters without control characters or surrounding spaces"),
            );
            return None;
        }
        Some((s, span))
    }

    /// A path; relative ones resolve against `base` (the config's folder).
    pub(super) fn path(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        required: bool,
        base: &Path,
    ) -> Option<(PathBuf, Range<usize>)> {
        let (s, span) = self.text(d, key, required)?;
        if s.contains('\0') {
            d.at(span, format!("`{key}` must not contain a NUL character"));
            return None;
        }
        Some((base.join(s), span))
    }

    pub(super) fn int(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        required: bool,
    ) -> Option<(i128, Range<usize>)> {
        let v = match self.get(key) {
            None => {
                if required {
                    self.missing(d, key);
                }
                return None;
            }
            Some(v) => v,
        };
        match v.get_ref() {
            DeValue::Integer(i) => match i128::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) => Some((n, v.span())),
                Err(_) => {
                    d.at(v.span(), format!("`{key}` is out of range"));
                    None
                }
            },
            _ => {
                Self::wrong_type(d, key, v, "an integer");
                None
            }
        }
    }

    /// An optional boolean, false when absent.
    pub(super) fn bool(&self, d: &mut Diag<'_>, key: &str) -> Option<bool> {
        match self.get(key) {
            None => Some(false),
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => Some(*b),
                _ => {
                    Self::wrong_type(d, key, v, "a boolean");
                    None
                }
            },
        }
    }

    /// An integer in `lo..=hi`, converted.
    pub(super) fn int_in<T: TryFrom<i128>>(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        required: bool,
        lo: i128,
        hi: i128,
    ) -> Option<(T, Range<usize>)> {
        let (n, span) = self.int(d, key, required)?;
        match T::try_from(n) {
            Ok(v) if (lo..=hi).contains(&n) => Some((v, span)),
            _ => {
                d.at(span, format!("`{key}` must be in {lo}..={hi}, found {n}"));
                None
            }
        }
    }
}

/// Levenshtein distance, for "did you mean" on unknown keys.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}
