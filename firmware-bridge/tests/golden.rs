//! Golden byte tests against the project's vectors, `spec/vectors/serial.txt`.
//!
//! Each line is `name | payload hex | wire hex`, where `name` is the message
//! written as `[Downlink::]Variant{field:value,...}`. The message is built
//! from that text (not from a table in this file), so a vector added to the
//! spec is tested without touching this file. For every line: postcard
//! payload, frame and decode must match byte for byte. The comment line
//! `# must be dropped (CRC fails): <hex>` is a frame that must be dropped.

use firmware_bridge::frame::{FrameDecoder, FrameError, crc32, encode_frame, to_frame};
use firmware_bridge::{DenyReason, Downlink, MAX_FRAME, Pin, Uplink};

fn vectors_text() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../spec/vectors/serial.txt");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn hex(s: &str) -> Vec<u8> {
    let s = s.trim();
    assert!(s.len().is_multiple_of(2), "odd hex {s:?}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|_| panic!("hex {s:?}")))
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
enum Msg {
    Up(Uplink),
    Down(Downlink),
}

/// Parse `[Downlink::]Variant{k:v,...}`; values are integers, bools or
/// double-quoted strings without commas.
fn parse_message(name: &str) -> Msg {
    let name = name.trim();
    let (downlink, rest) = match name.strip_prefix("Downlink::") {
        Some(r) => (true, r),
        None => (false, name.strip_prefix("Uplink::").unwrap_or(name)),
    };
    let open = rest.find('{').expect("{");
    let variant = &rest[..open];
    let body = rest[open + 1..].strip_suffix('}').expect("}");
    let fields: Vec<(&str, &str)> = body
        .split(',')
        .filter(|f| !f.is_empty())
        .map(|f| f.split_once(':').expect("field:value"))
        .collect();
    let get = |k: &str| -> &str {
        fields
            .iter()
            .find(|(n, _)| *n == k)
            .unwrap_or_else(|| panic!("{name}: no field {k}"))
            .1
    };
    let num = |k: &str| -> u64 { get(k).parse().unwrap_or_else(|_| panic!("{name}: {k}")) };
    let u8_ = |k: &str| u8::try_from(num(k)).unwrap();
    let u16_ = |k: &str| u16::try_from(num(k)).unwrap();
    let u32_ = |k: &str| u32::try_from(num(k)).unwrap();
    let boolean = |k: &str| match get(k) {
        "true" => true,
        "false" => false,
        v => panic!("{name}: bool {v}"),
    };
    let string = |k: &str| {
        get(k)
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .unwrap_or_else(|| panic!("{name}: string {k}"))
            .to_string()
    };
    if downlink {
        Msg::Down(match variant {
            "Unlock" => Downlink::Unlock {
                seq: u16_("seq"),
                door: u8_("door"),
                ms: u16_("ms"),
            },
            "Deny" => Downlink::Deny {
                seq: u16_("seq"),
                door: u8_("door"),
                reason: DenyReason(u8_("reason")),
            },
            "Ack" => Downlink::Ack { seq: u16_("seq") },
            "Ping" => Downlink::Ping {
                nonce: u32_("nonce"),
            },
            "Hello" => Downlink::Hello {
                session: u32_("session"),
            },
            v => panic!("unknown downlink variant {v}"),
        })
    } else {
        Msg::Up(match variant {
            "Hello" => Uplink::Hello {
                board_id: u8_("board_id"),
                fw_major: u8_("fw_major"),
                fw_minor: u8_("fw_minor"),
                door_count: u8_("door_count"),
            },
            "Keypad" => Uplink::Keypad {
                seq: u16_("seq"),
                door: u8_("door"),
                pin: Pin::from_wire_bytes(string("pin").as_bytes()).expect("pin fits"),
            },
            "DoorSensor" => Uplink::DoorSensor {
                seq: u16_("seq"),
                door: u8_("door"),
                open: boolean("open"),
            },
            "Ack" => Uplink::Ack { seq: u16_("seq") },
            "Heartbeat" => Uplink::Heartbeat {
                uptime_s: u32_("uptime_s"),
            },
            "Tamper" => Uplink::Tamper { seq: u16_("seq") },
            "Pong" => Uplink::Pong {
                nonce: u32_("nonce"),
            },
            v => panic!("unknown uplink variant {v}"),
        })
    }
}

struct Vector {
    name: String,
    msg: Msg,
    payload: Vec<u8>,
    wire: Vec<u8>,
}

fn vectors() -> (Vec<Vector>, Vec<Vec<u8>>) {
    let mut good = Vec::new();
    let mut must_drop = Vec::new();
    for line in vectors_text().lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            if c.contains("must be dropped") {
                let (_, h) = c.rsplit_once(':').expect("hex after ':'");
                must_drop.push(hex(h));
            }
            continue;
        }
        let parts: Vec<&str> = line.split('|').collect();
        assert_eq!(parts.len(), 3, "bad vector line {line:?}");
        good.push(Vector {
            name: parts[0].trim().to_string(),
            msg: parse_message(parts[0]),
            payload: hex(parts[1]),
            wire: hex(parts[2]),
        });
    }
    (good, must_drop)
}

#[test]
fn vector_file_has_every_message_of_both_directions() {
    let (good, must_drop) = vectors();
    assert_eq!(good.len(), 13);
    assert_eq!(must_drop.len(), 1);
    let ups = good.iter().filter(|v| matches!(v.msg, Msg::Up(_))).count();
    assert_eq!(ups, 8);
}

#[test]
fn every_message_encodes_to_its_golden_payload_and_wire() {
    for v in vectors().0 {
        let mut pbuf = [0u8; 64];
        let mut wbuf = [0u8; MAX_FRAME];
        let (payload, wire) = match &v.msg {
            Msg::Up(m) => (
                postcard::to_slice(m, &mut pbuf).unwrap().to_vec(),
                encode_frame(m, &mut wbuf).unwrap().to_vec(),
            ),
            Msg::Down(m) => (
                postcard::to_slice(m, &mut pbuf).unwrap().to_vec(),
                encode_frame(m, &mut wbuf).unwrap().to_vec(),
            ),
        };
        assert_eq!(payload, v.payload, "payload of {}", v.name);
        assert_eq!(wire, v.wire, "wire of {}", v.name);
    }
}

#[test]
fn every_golden_wire_decodes_to_its_message() {
    for v in vectors().0 {
        let decoded = match &v.msg {
            Msg::Up(_) => {
                let mut d = FrameDecoder::<Uplink>::new();
                let r: Vec<_> = d.feed(&v.wire).collect();
                assert_eq!(r.len(), 1, "{}: {r:?}", v.name);
                Msg::Up(r[0].clone().unwrap_or_else(|e| panic!("{}: {e}", v.name)))
            }
            Msg::Down(_) => {
                let mut d = FrameDecoder::<Downlink>::new();
                let r: Vec<_> = d.feed(&v.wire).collect();
                assert_eq!(r.len(), 1, "{}: {r:?}", v.name);
                Msg::Down(r[0].clone().unwrap_or_else(|e| panic!("{}: {e}", v.name)))
            }
        };
        assert_eq!(decoded, v.msg, "{}", v.name);
    }
}

/// Textbook COBS, written out here so the check does not trust the crate
/// the implementation uses.
fn reference_cobs(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    let mut code_at = 0;
    let mut code = 1u8;
    for &b in data {
        if b == 0 {
            out[code_at] = code;
            code_at = out.len();
            out.push(0);
            code = 1;
        } else {
            out.push(b);
            code += 1;
            if code == 0xff {
                out[code_at] = code;
                code_at = out.len();
                out.push(0);
                code = 1;
            }
        }
    }
    out[code_at] = code;
    out
}

#[test]
fn golden_wire_is_cobs_of_payload_and_crc32_le_with_a_zero_delimiter() {
    // Independent of encode_frame: recompute the frame from the payload.
    for v in vectors().0 {
        let mut body = v.payload.clone();
        body.extend_from_slice(&crc32(&v.payload).to_le_bytes());
        let mut expect = reference_cobs(&body);
        expect.push(0);
        assert_eq!(expect, v.wire, "{}", v.name);
        assert!(v.payload.len() <= 64);
        assert_eq!(v.wire.iter().filter(|&&b| b == 0).count(), 1);
    }
}

#[test]
fn vector_with_a_bad_crc_is_dropped_in_both_directions() {
    for wire in vectors().1 {
        let mut up = FrameDecoder::<Uplink>::new();
        let r: Vec<_> = up.feed(&wire).collect();
        assert_eq!(r, vec![Err(FrameError::BadCrc)]);
        assert_eq!(up.stats().bad_crc, 1);
        let mut down = FrameDecoder::<Downlink>::new();
        let r: Vec<_> = down.feed(&wire).collect();
        assert_eq!(r, vec![Err(FrameError::BadCrc)]);
    }
}

#[test]
fn all_golden_frames_back_to_back_decode_in_order() {
    // One byte stream holding every uplink vector, with the bad frame in
    // the middle: the decoder must not lose sync across frame boundaries.
    let (good, bad) = vectors();
    let ups: Vec<&Vector> = good
        .iter()
        .filter(|v| matches!(v.msg, Msg::Up(_)))
        .collect();
    let mut stream = Vec::new();
    for (i, v) in ups.iter().enumerate() {
        stream.extend_from_slice(&v.wire);
        if i == 3 {
            stream.extend_from_slice(&bad[0]);
        }
    }
    let mut d = FrameDecoder::<Uplink>::new();
    let got: Vec<_> = d.feed(&stream).collect();
    assert_eq!(got.len(), ups.len() + 1);
    assert_eq!(got.iter().filter(|r| r.is_err()).count(), 1);
    let msgs: Vec<Msg> = got.into_iter().flatten().map(Msg::Up).collect();
    let expect: Vec<Msg> = ups.iter().map(|v| v.msg.clone()).collect();
    assert_eq!(msgs, expect);
    // And to_frame agrees with encode_frame.
    if let Msg::Up(m) = &ups[0].msg {
        assert_eq!(to_frame(m).unwrap().as_slice(), ups[0].wire.as_slice());
    }
}

/// The sealed link's messages (`serial.md`, the `Uplink` and `Downlink`
/// tables, indexes 7..=10 and 5..=9): the variant index, then each field in
/// order, a `[u8; N]` as N raw bytes with no length. Built by hand from the
/// tables, so a reordered variant or field fails here.
#[test]
fn sealed_link_messages_encode_as_the_tables_say_and_decode_back() {
    fn bytes(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }
    let n16 = [0x11u8; 16];
    let t16 = [0x22u8; 16];
    let k32: [u8; 32] = std::array::from_fn(|i| i as u8 + 1);
    let ups = [
        (
            Uplink::SealHello {
                board_id: 3,
                board_nonce: n16,
                tag: t16,
            },
            bytes(&[&[7, 3], &n16, &t16]),
        ),
        (Uplink::PairReply { board_pub: k32 }, bytes(&[&[8], &k32])),
        (Uplink::PairDone { ok: true }, vec![9, 1]),
        (Uplink::PairDone { ok: false }, vec![9, 0]),
        (Uplink::RekeyReply { board_pub: k32 }, bytes(&[&[10], &k32])),
    ];
    for (msg, want) in ups {
        let mut buf = [0u8; 64];
        assert_eq!(postcard::to_slice(&msg, &mut buf).unwrap(), want, "{msg:?}");
        assert_eq!(postcard::from_bytes::<Uplink>(&want).unwrap(), msg);
        let wire = to_frame(&msg).unwrap();
        assert_eq!(firmware_bridge::decode_frame::<Uplink>(&wire), Ok(msg));
    }
    let downs = [
        (Downlink::SealHello { hub_nonce: n16 }, bytes(&[&[5], &n16])),
        (Downlink::SealConfirm { tag: t16 }, bytes(&[&[6], &t16])),
        (Downlink::PairStart { commit: k32 }, bytes(&[&[7], &k32])),
        (Downlink::PairReveal { hub_pub: k32 }, bytes(&[&[8], &k32])),
        (Downlink::RekeyStart { hub_pub: k32 }, bytes(&[&[9], &k32])),
    ];
    for (msg, want) in downs {
        let mut buf = [0u8; 64];
        assert_eq!(postcard::to_slice(&msg, &mut buf).unwrap(), want, "{msg:?}");
        assert_eq!(postcard::from_bytes::<Downlink>(&want).unwrap(), msg);
        let wire = to_frame(&msg).unwrap();
        assert_eq!(firmware_bridge::decode_frame::<Downlink>(&wire), Ok(msg));
    }
}

#[test]
fn a_sealed_payload_never_decodes_as_a_plain_message() {
    // 0xA5 starts every sealed payload; as a varint it continues, and names
    // a variant far past the last one in either direction.
    let mut payload = vec![0xa5, 0x01, 0x00, 0x00, 0x00];
    payload.extend_from_slice(&[0x42; 21]);
    assert!(postcard::from_bytes::<Uplink>(&payload).is_err());
    assert!(postcard::from_bytes::<Downlink>(&payload).is_err());
}
