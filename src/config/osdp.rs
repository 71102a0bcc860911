//! `[[osdp]]` and `[[reader]]`: OSDP buses and their readers (osdp.md).

use super::*;

/// OSDP's default install-mode key SCBK-D (`30 31 .. 3F`), public in the
/// standard: a reader key equal to it is no secret (check-config refuses
/// it), `lockhub run` never uses it, and only `lockhub osdp install` does.
pub const SCBK_D: [u8; 16] = [
    0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3A, 0x3B, 0x3C, 0x3D, 0x3E, 0x3F,
];

/// `[[osdp]]`: the buses, and their names when every one was readable.
pub(super) fn read_osdp_buses(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    base: &Path,
    ports: &mut Vec<(PathBuf, Range<usize>)>,
) -> (Option<Vec<OsdpBusConfig>>, Option<Vec<String>>) {
    let tables = root.tables(d, "osdp", "[[osdp]]", &["name", "port", "baud"]);
    let mut names = Vec::new();
    let mut buses = Vec::new();
    for t in &tables {
        let name = t.name(d, "name");
        if let Some((n, span)) = &name {
            names.push((*n, span.clone()));
        }
        let port = t.path(d, "port", true, base);
        if let Some((p, span)) = &port {
            warn_if_absent(d, "[[osdp]]", p, span.clone());
        }
        // Optional, as for a board (osdp.md names the default).
        let baud = read_baud(d, t, DEFAULT_OSDP_BAUD);
        buses.push((|| {
            Some(OsdpBusConfig {
                name: name?.0.to_owned(),
                port: port.clone()?.0,
                baud: baud?,
            })
        })());
        if let Some((p, span)) = port {
            ports.push((p, span));
        }
    }
    check_unique(d, "osdp bus name", &names);
    let readable = match root.get("osdp") {
        None => true,
        Some(v) => matches!(v.get_ref(), DeValue::Array(a) if a.len() == tables.len()),
    };
    let all_names = (readable && names.len() == tables.len())
        .then(|| names.iter().map(|(n, _)| (*n).to_owned()).collect());
    (buses.into_iter().collect(), all_names)
}

/// A reader's name, its span and `insecure_plaintext`, for the key check.
pub(super) type NamedReader = (String, Range<usize>, bool);

/// `[[reader]]`: the readers and the span of each one's name.
pub(super) fn read_readers(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    bus_names: &Option<Vec<String>>,
) -> (Option<Vec<ReaderConfig>>, Vec<NamedReader>) {
    let tables = root.tables(
        d,
        "reader",
        "[[reader]]",
        &["name", "bus", "address", "insecure_plaintext"],
    );
    let mut names = Vec::new();
    let mut spans = Vec::new();
    let mut places: HashMap<(String, u8), (String, Range<usize>)> = HashMap::new();
    let mut readers = Vec::new();
    for t in &tables {
        let name = t.name(d, "name");
        if let Some((n, span)) = &name {
            names.push((*n, span.clone()));
        }
        let this = name.as_ref().map_or("?", |n| n.0).to_owned();
        let bus = t.str(d, "bus", true).and_then(|(s, span)| match bus_names {
            Some(names) if !names.iter().any(|n| n == s) => {
                d.at(
                    span,
                    format!(
                        "reader bus `{}` is not configured in an [[osdp]]",
                        s.escape_debug()
                    ),
                );
                None
            }
            _ => Some(s.to_owned()),
        });
        let address = t.int_in::<u8>(d, "address", true, 0, MAX_READER_ADDRESS.into());
        if let (Some(b), Some((a, span))) = (&bus, &address) {
            match places.get(&(b.clone(), *a)) {
                Some((other, first)) => {
                    let line = d.line_of(first);
                    d.at(
                        span.clone(),
                        format!(
                            "reader `{this}` has address {a} on bus `{b}`, already used by reader `{other}` (line {line})"
                        ),
                    );
                }
                None => {
                    places.insert((b.clone(), *a), (this, span.clone()));
                }
            }
        }
        let insecure = t.bool(d, "insecure_plaintext");
        if let (Some((n, span)), Some(i)) = (&name, insecure) {
            spans.push(((*n).to_owned(), span.clone(), i));
        }
        readers.push((|| {
            Some(ReaderConfig {
                name: name?.0.to_owned(),
                bus: bus?,
                address: address?.0,
                insecure_plaintext: insecure?,
            })
        })());
    }
    check_unique(d, "reader name", &names);
    (readers.into_iter().collect(), spans)
}
