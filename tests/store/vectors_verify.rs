//! The MQTT vectors (spec/vectors/mqtt), steps 1 and 4 only: every
//! case whose expected reason is a step-1 code must get exactly that code
//! from `verify_envelope`; every other case must verify, and must then parse
//! (or fail step 4 with the expected code and item).

use lockhub_proto::event::{EventKind, Reason, SchemaContext, SchemaError, parse_body};
use lockhub_proto::time::Timestamp;
use lockhub_proto::verify::Signer;
use lockhub_proto::verify::{VerifyContext, verify_envelope};
use uuid::Uuid;

const DIR: &str = testkit::files::VECTORS_DIR;
const SITE: &str = "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10";
const HUB: &str = "hub-lobby-1";

fn ring() -> Vec<Signer> {
    testkit::files::vectors_trust_ring()
}

fn is_step4(r: Reason) -> bool {
    matches!(
        r,
        Reason::UnsupportedType
            | Reason::InvalidGrant
            | Reason::UnknownDoor
            | Reason::UnknownPinKey
    )
}

#[test]
fn every_vector_gets_its_step_one_and_step_four_answer() {
    let ring = ring();
    let ctx = VerifyContext {
        ring: &ring,
        site_id: Uuid::parse_str(SITE).unwrap(),
        hub_id: HUB,
        now: Timestamp::parse_rfc3339("2026-11-29T12:00:00Z").unwrap(),
    };
    let schema = SchemaContext::new(["101"], ["k1"]);
    let cases = std::fs::read_to_string(format!("{DIR}/cases.jsonl")).expect("cases.jsonl");
    let (mut step1, mut step4, mut ok) = (0, 0, 0);
    for line in cases.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let n = &case["n"];
        let expected = case["reason"]
            .as_str()
            .map(|r| Reason::parse(r).expect("known code"));
        let raw = case["envelope"].as_str().unwrap().as_bytes();
        let got = verify_envelope(raw, &ctx);
        match expected {
            Some(r) if r.is_step1() => {
                let rej = got.expect_err(&format!("case {n} must be rejected"));
                assert_eq!(rej.reason, r, "case {n}");
                step1 += 1;
            }
            _ => {
                let ev = got.unwrap_or_else(|e| panic!("case {n} must verify, got {e}"));
                let parsed = parse_body(&ev.body, &schema);
                match expected {
                    Some(r) if is_step4(r) => {
                        let item = case
                            .get("item")
                            .and_then(|i| i.as_u64())
                            .map(|i| i as usize);
                        assert_eq!(parsed, Err(SchemaError { reason: r, item }), "case {n}");
                        step4 += 1;
                    }
                    _ => {
                        let kind = parsed.unwrap_or_else(|e| panic!("case {n} must parse: {e:?}"));
                        if let Some(items) = case.get("items").and_then(|i| i.as_array()) {
                            match kind {
                                EventKind::Batch(b) => assert_eq!(b.len(), items.len(), "case {n}"),
                                other => panic!("case {n}: expected a batch, got {other:?}"),
                            }
                        }
                        ok += 1;
                    }
                }
            }
        }
    }
    // The vectors README: cases 4 to 7 are the step-1 rejections; case 17 is
    // the one step-4 rejection.
    assert_eq!((step1, step4, ok), (4, 1, 15));
}
