//! `[[serial]]` and `[[door]]`: lock boards and the doors on boards or readers.

use super::*;

/// A serial's name, its span and `insecure_plaintext`, for the key check.
pub(super) type NamedSerial = (String, Range<usize>, bool);

pub(super) fn read_serials(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    base: &Path,
    ports: &mut Vec<(PathBuf, Range<usize>)>,
) -> (
    Option<Vec<SerialConfig>>,
    Option<Vec<String>>,
    Vec<NamedSerial>,
) {
    let tables = root.tables(
        d,
        "serial",
        "[[serial]]",
        &["name", "port", "baud", "insecure_plaintext"],
    );
    let mut names = Vec::new();
    let mut spans = Vec::new();
    let mut serials = Vec::new();
    for s in &tables {
        let name = s.name(d, "name");
        if let Some((n, span)) = &name {
            names.push((*n, span.clone()));
        }
        let port = s.path(d, "port", true, base);
        if let Some((p, span)) = &port {
            warn_if_absent(d, "[[serial]]", p, span.clone());
        }
        // Optional: the wire contract names the default. An invalid value
        // is reported and fails the load whatever is kept here.
        let baud = read_baud(d, s, DEFAULT_SERIAL_BAUD);
        let insecure = s.bool(d, "insecure_plaintext");
        if let (Some((n, span)), Some(i)) = (&name, insecure) {
            spans.push(((*n).to_owned(), span.clone(), i));
        }
        serials.push((|| {
            Some(SerialConfig {
                name: name?.0.to_owned(),
                port: port.clone()?.0,
                baud: baud?,
                insecure_plaintext: insecure?,
            })
        })());
        if let Some((p, span)) = port {
            ports.push((p, span));
        }
    }
    check_unique(d, "serial name", &names);
    // Ports are checked for reuse with the OSDP buses' (`check_ports`).
    // Doors are checked against these names only when every [[serial]] was
    // readable with a name: otherwise "not configured" would be a cascade.
    let readable = match root.get("serial") {
        None => true,
        Some(v) => matches!(v.get_ref(), DeValue::Array(a) if a.len() == tables.len()),
    };
    let all_names = (readable && names.len() == tables.len())
        .then(|| names.iter().map(|(n, _)| (*n).to_owned()).collect());
    (serials.into_iter().collect(), all_names, spans)
}

/// serial.md, "Keys": every `[[serial]]` has a `[[board_key]]` unless it is
/// `insecure_plaintext = true`, and then it has none (the hub never falls
/// back to plain on a keyed serial, so a key beside the flag is a mistake
/// one way or the other). `keyed`: the serials the secrets file keys.
/// `missing_ok`: a serial whose missing key is no problem now (see
/// [`super::Unkeyed`]).
pub(super) fn check_board_keys(
    d: &mut Diag<'_>,
    serials: &[NamedSerial],
    keyed: &[String],
    missing_ok: &dyn Fn(&str) -> bool,
) {
    for (name, span, insecure) in serials {
        let has_key = keyed.contains(name);
        if !insecure && !has_key && !missing_ok(name) {
            d.at(
                span.clone(),
                format!(
                    "serial `{}` has no [[board_key]] in the secrets file (pair the board with `lockhub board pair`, or type the key from its label; a board without a link key needs `insecure_plaintext = true`)",
                    name.escape_debug()
                ),
            );
        } else if *insecure && has_key {
            d.at(
                span.clone(),
                format!(
                    "serial `{}` has `insecure_plaintext = true` and a [[board_key]] in the secrets file: remove one (a keyed board is always sealed)",
                    name.escape_debug()
                ),
            );
        }
    }
}

/// One device is driven by one driver: two `[[serial]]`, two `[[osdp]]`, or
/// one of each on the same port would leave the second open failing for
/// ever (ports are opened exclusively), its doors dark.
pub(super) fn check_ports(d: &mut Diag<'_>, ports: &[(PathBuf, Range<usize>)]) {
    let names: Vec<(String, Range<usize>)> = ports
        .iter()
        .map(|(p, span)| (p.display().to_string(), span.clone()))
        .collect();
    let refs: Vec<(&str, Range<usize>)> = names
        .iter()
        .map(|(p, span)| (p.as_str(), span.clone()))
        .collect();
    check_unique(d, "port (one [[serial]] or [[osdp]] per device)", &refs);
}

pub(super) fn read_doors(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    serial_names: &Option<Vec<String>>,
    reader_names: &Option<Vec<String>>,
) -> Option<(Vec<DoorConfig>, Vec<ReaderDoorConfig>)> {
    let tables = root.tables(
        d,
        "door",
        "[[door]]",
        &[
            "name",
            "serial",
            "index",
            "unlock_ms",
            "reader",
            "output",
            "contact_input",
            "contact_inverted",
        ],
    );
    let mut names = Vec::new();
    let mut places: HashMap<(String, u8), (String, Range<usize>)> = HashMap::new();
    // A reader's keypad says nothing of which door it is for, so a reader
    // serves one door (its keypad, output and contact are that door's).
    let mut on_readers: HashMap<String, (String, Range<usize>)> = HashMap::new();
    let mut doors = Vec::new();
    let mut reader_doors = Vec::new();
    let mut ok = true;
    for t in &tables {
        let name = t.name(d, "name");
        if let Some((n, span)) = &name {
            names.push((*n, span.clone()));
        }
        let this = name.as_ref().map_or("?", |n| n.0).to_owned();
        let on_board = t.get("serial").is_some() || t.get("index").is_some();
        let on_reader = t.get("reader").is_some();
        if !on_board && !on_reader {
            d.at(
                t.span.clone(),
                format!(
                    "door `{}` must name `serial` and `index` (a lock board), `reader` and `output` (an OSDP reader), or `reader` with `serial` and `index` (PIN on the reader, strike on the board)",
                    this.escape_debug(),
                ),
            );
            ok = false;
            continue;
        }
        // PIN on a reader, strike and contact on a board (recommended): the
        // reader's outputs and inputs are not this door's.
        let mixed = on_board && on_reader;
        let unlock_ms = t.int_in::<u16>(d, "unlock_ms", true, 1, u16::MAX.into());
        let reader = if on_reader {
            t.str(d, "reader", true)
                .and_then(|(s, span)| match reader_names {
                    Some(names) if !names.iter().any(|n| n == s) => {
                        d.at(
                            span,
                            format!(
                                "door reader `{}` is not configured in a [[reader]]",
                                s.escape_debug()
                            ),
                        );
                        None
                    }
                    _ => Some(s.to_owned()),
                })
        } else {
            None
        };
        if let (Some(r), Some(span)) = (&reader, t.get("reader").map(|v| v.span())) {
            match on_readers.get(r) {
                Some((other, first)) => {
                    let line = d.line_of(first);
                    d.at(
                        span,
                        format!(
                            "door `{this}` is on reader `{r}`, which already serves door `{other}` (line {line}): a reader opens one door"
                        ),
                    );
                }
                None => {
                    on_readers.insert(r.clone(), (this.clone(), span));
                }
            }
        }
        if on_reader && !mixed {
            let output = t.int_in::<u8>(d, "output", true, 0, u8::MAX.into());
            let contact_input = t.int_in::<u8>(d, "contact_input", false, 0, u8::MAX.into());
            let contact_inverted = t.bool(d, "contact_inverted");
            if let (None, Some(v)) = (t.get("contact_input"), t.get("contact_inverted")) {
                // Inverting no contact is a typo for one that is missing.
                d.at(
                    v.span(),
                    "`contact_inverted` needs `contact_input`: it says how that input reads",
                );
            }
            reader_doors.push((|| {
                Some(ReaderDoorConfig {
                    name: name?.0.to_owned(),
                    reader: reader?,
                    output: output?.0,
                    contact_input: contact_input.map(|c| c.0),
                    contact_inverted: contact_inverted?,
                    unlock_ms: unlock_ms?.0,
                })
            })());
            continue;
        }
        for key in ["output", "contact_input", "contact_inverted"] {
            if let Some(v) = t.get(key) {
                let message = if mixed {
                    format!(
                        "door `{}` has its strike and contact on its board (`serial`, `index`): `{key}` is a reader's and does not go with them",
                        this.escape_debug()
                    )
                } else {
                    format!("`{key}` is for a door on an OSDP reader, not on a lock board")
                };
                d.at(v.span(), message);
            }
        }
        let serial = t
            .str(d, "serial", true)
            .and_then(|(s, span)| match serial_names {
                Some(names) if !names.iter().any(|n| n == s) => {
                    d.at(
                        span,
                        format!(
                            "door serial `{}` is not configured in a [[serial]]",
                            s.escape_debug()
                        ),
                    );
                    None
                }
                _ => Some(s.to_owned()),
            });
        let index = t.int_in::<u8>(d, "index", true, 0, MAX_DOOR_INDEX.into());
        if let (Some(s), Some((i, span))) = (&serial, &index) {
            match places.get(&(s.clone(), *i)) {
                Some((other, first)) => {
                    let line = d.line_of(first);
                    d.at(
                        span.clone(),
                        format!(
                            "door `{this}` has index {i} on serial `{s}`, already used by door `{other}` (line {line})"
                        ),
                    );
                }
                None => {
                    places.insert((s.clone(), *i), (this, span.clone()));
                }
            }
        }
        doors.push((|| {
            Some(DoorConfig {
                name: name?.0.to_owned(),
                serial: serial?,
                index: index?.0,
                unlock_ms: unlock_ms?.0,
                reader: if mixed { Some(reader.clone()?) } else { None },
            })
        })());
    }
    check_unique(d, "door name", &names);
    let doors: Option<Vec<DoorConfig>> = doors.into_iter().collect();
    let reader_doors: Option<Vec<ReaderDoorConfig>> = reader_doors.into_iter().collect();
    if !ok {
        return None;
    }
    Some((doors?, reader_doors?))
}
