//! The hub's end of a sealed board link (`docs/protocol/serial.md`,
//! "Sealed link"), around [`firmware_bridge::HubSeal`]: when to ask for a
//! session, the sealed `Ping` that checks a plain `Hello` during a session,
//! and which drops are faults toward `board_link_fault`. A state machine
//! over `now_ms`, without I/O: the port loop feeds it payloads and time,
//! writes the frames it queues and records what it reports.
//!
//! What counts toward `board_link_fault` (three in a minute, or one in
//! every minute for five minutes): a sealed frame that fails (bad tag,
//! replayed counter, too short, not a message), a plain message where only
//! sealed ones count (an injected `Unlock` or `Keypad`), a handshake that
//! fails (a board with another key), and a plain `Hello` that a sealed
//! `Pong` showed was not the board's. Not counted as faults, only as drops:
//! a frame whose CRC or COBS fails (line noise, which a wire attacker
//! gains nothing by; the CRC is checked before any of the above), and a
//! sealed frame with no session to open it (a board still in the session
//! of the hub's previous run, until its next handshake).

use std::collections::VecDeque;

use firmware_bridge::frame::{FrameError, decode_payload};
use firmware_bridge::rng::RandomSource;
use firmware_bridge::seal::{DropCause, DropStats, HandshakeNonce, NONCE_LEN, SEAL_MARK, SealError};
use firmware_bridge::sealed::HubRx;
use firmware_bridge::{Downlink, HubSeal, LinkKey, SealedFrame, Uplink};

use crate::drivers::OsRandom;

/// The first `SealHello` resend, after this long without an answer.
pub(crate) const HELLO_RETRY_FIRST_MS: u64 = 500;
/// Resends back off, doubling, to this.
pub(crate) const HELLO_RETRY_MAX_MS: u64 = 5_000;
/// A plain `Hello` during a session: the sealed `Pong` must verify this soon.
pub(crate) const HELLO_CHECK_MS: u64 = 250;
/// The window of "three in a minute", and what a session must hold with
/// nothing counted before the alert ends.
pub(crate) const FAULT_WINDOW_MS: u64 = 60_000;
/// Faults within a window that raise the alert.
pub(crate) const FAULTS_TO_RAISE: usize = 3;
/// "One in every minute for five minutes".
pub(crate) const FAULT_MINUTES: u64 = 5;
/// Fault times kept (the last five minutes' worth, bounded).
const FAULTS_KEPT: usize = 64;
/// Frames queued for the port loop; it drains them after every call.
const OUT_MAX: usize = 16;

/// Why the sealed frames were dropped, for `lockhub status`: the
/// contract's causes and the plain `Hello`s that were not the board's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SealDrops {
    pub causes: DropStats,
    pub forged_hello: u32,
}

impl SealDrops {
    /// Both counts added (saturating).
    pub(crate) fn plus(self, other: SealDrops) -> SealDrops {
        let a = self.causes;
        let b = other.causes;
        SealDrops {
            causes: DropStats {
                frame: a.frame.saturating_add(b.frame),
                short: a.short.saturating_add(b.short),
                replay: a.replay.saturating_add(b.replay),
                bad_tag: a.bad_tag.saturating_add(b.bad_tag),
                not_a_message: a.not_a_message.saturating_add(b.not_a_message),
                plain: a.plain.saturating_add(b.plain),
                no_session: a.no_session.saturating_add(b.no_session),
                bad_handshake: a.bad_handshake.saturating_add(b.bad_handshake),
            },
            forged_hello: self.forged_hello.saturating_add(other.forged_hello),
        }
    }
}

/// What one received payload meant.
#[derive(Debug)]
pub(crate) enum SealRx {
    /// A sealed message that verified: supervision and the link take it.
    Message(Uplink),
    /// A new session is confirmed (its `SealConfirm` is queued): the link
    /// starts afresh, an Unlock the old session never saw acked is
    /// unconfirmed.
    SessionStarted { board_id: u8 },
    /// Nothing for the caller (a plain `Hello` being checked or answered).
    Quiet,
    /// Dropped and counted; `fault` when it counts toward the alert.
    Dropped { cause: DropCause, fault: bool },
}

/// A change of `board_link_fault` for the caller to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultAlert {
    Raise,
    Clear,
}

/// The hub's end of one opening of a sealed port. See the module docs.
pub(crate) struct SealEnd<R = OsRandom> {
    seal: HubSeal,
    rng: R,
    /// The `SealHello` awaiting an answer: its nonce, when it last went
    /// out, and the delay before the next resend.
    asking: Option<(HandshakeNonce, u64, u64)>,
    /// The board nonce of the last confirmed handshake: a second copy of
    /// that answer (to a resent `SealHello`) is no fault.
    confirmed_board_nonce: Option<HandshakeNonce>,
    /// A plain `Hello` during a session: the check `Ping`'s nonce and the
    /// moment its `Pong` is due by.
    check: Option<(u32, u64)>,
    session_since_ms: Option<u64>,
    faults: VecDeque<u64>,
    raised: bool,
    /// The current session already cleared the alert (it is cleared once
    /// per session that holds a minute clean, also one left over from an
    /// earlier run).
    cleared_this_session: bool,
    forged_hello: u32,
    out: VecDeque<SealedFrame>,
}

impl SealEnd<OsRandom> {
    /// A port opened at `now_ms` under `key`; its first `SealHello` is queued.
    pub(crate) fn new(key: LinkKey, now_ms: u64) -> Self {
        Self::with_rng(key, OsRandom, now_ms)
    }
}

impl<R: RandomSource> SealEnd<R> {
    pub(crate) fn with_rng(key: LinkKey, rng: R, now_ms: u64) -> Self {
        let mut end = SealEnd {
            seal: HubSeal::new(key),
            rng,
            asking: None,
            confirmed_board_nonce: None,
            check: None,
            session_since_ms: None,
            faults: VecDeque::new(),
            raised: false,
            cleared_this_session: false,
            forged_hello: 0,
            out: VecDeque::new(),
        };
        end.ask(now_ms);
        end
    }

    /// True while a confirmed session holds: only then do messages go out.
    pub(crate) fn has_session(&self) -> bool {
        self.seal.has_session()
    }

    pub(crate) fn drops(&self) -> SealDrops {
        SealDrops {
            causes: self.seal.drops(),
            forged_hello: self.forged_hello,
        }
    }

    /// Whether this opening raised `board_link_fault` and has not cleared it.
    #[cfg(test)]
    pub(crate) fn alert_raised(&self) -> bool {
        self.raised
    }

    /// The next frame to write, oldest first.
    pub(crate) fn pop_out(&mut self) -> Option<SealedFrame> {
        self.out.pop_front()
    }

    /// A frame the decoder dropped (CRC, COBS, length): counted, no fault.
    pub(crate) fn frame_error(&mut self, e: FrameError) {
        self.seal.count_frame_error(e);
    }

    /// Seals one message of the link; `None` without a session (nothing
    /// goes out plain). A session whose counter ran out asks for a new one.
    pub(crate) fn seal(&mut self, msg: &Downlink, now_ms: u64) -> Option<SealedFrame> {
        match self.seal.seal(msg) {
            Ok(f) => Some(f),
            Err(SealError::CounterExhausted) => {
                self.ask(now_ms);
                None
            }
            Err(SealError::NoSession | SealError::Encode) => None,
        }
    }

    /// One payload from the decoder (CRC already checked).
    pub(crate) fn on_payload(
        &mut self,
        payload: &[u8],
        now_ms: u64,
    ) -> (SealRx, Option<FaultAlert>) {
        // A plain SealHello's board nonce: the same answer twice (the hub
        // resent its SealHello while the first answer was on its way) is
        // no fault, only the second copy of a handshake already done.
        let answer_nonce = match payload.first() {
            Some(&SEAL_MARK) | None => None,
            Some(_) => match decode_payload::<Uplink>(payload) {
                Ok(Uplink::SealHello { board_nonce, .. }) => Some(board_nonce),
                _ => None,
            },
        };
        if answer_nonce.is_some() && answer_nonce == self.confirmed_board_nonce {
            return (SealRx::Quiet, None);
        }
        let rx = match self.seal.on_payload(payload) {
            HubRx::Message(Uplink::Pong { nonce })
                if self.check.is_some_and(|(n, _)| n == nonce) =>
            {
                // The board is still in this session: the plain Hello was
                // someone else's.
                self.check = None;
                self.forged_hello = self.forged_hello.saturating_add(1);
                let alert = self.fault(now_ms);
                return (SealRx::Message(Uplink::Pong { nonce }), alert);
            }
            HubRx::Message(msg) => SealRx::Message(msg),
            HubRx::PlainHello => {
                self.on_plain_hello(now_ms);
                SealRx::Quiet
            }
            HubRx::SessionStarted { board_id, confirm } => {
                self.push_out(confirm);
                self.asking = None;
                self.check = None;
                self.confirmed_board_nonce = answer_nonce;
                self.session_since_ms = Some(now_ms);
                self.cleared_this_session = false;
                SealRx::SessionStarted { board_id }
            }
            HubRx::Dropped(cause) => {
                let fault = counts_as_fault(cause);
                let alert = if fault { self.fault(now_ms) } else { None };
                return (SealRx::Dropped { cause, fault }, alert);
            }
        };
        (rx, None)
    }

    /// Timers: `SealHello` resends, the plain-Hello check, the alert's end.
    pub(crate) fn poll(&mut self, now_ms: u64) -> Option<FaultAlert> {
        if let Some((nonce, sent, delay)) = self.asking
            && now_ms.saturating_sub(sent) >= delay
        {
            // The same nonce again: the board answers a repeat with the
            // same offer, so a late answer to the first still verifies.
            self.asking = Some((nonce, now_ms, (delay * 2).min(HELLO_RETRY_MAX_MS)));
            if let Ok(f) = self.seal.start(nonce) {
                self.push_out(f);
            }
        }
        if let Some((_, due)) = self.check
            && now_ms >= due
        {
            // No sealed Pong: the board restarted (or lost its session);
            // a new session, as it asked.
            self.check = None;
            self.ask(now_ms);
        }
        let clean_since = self.faults.back().map_or(0, |t| t.saturating_add(1));
        let held = self
            .session_since_ms
            .filter(|_| self.has_session() && !self.cleared_this_session)
            .is_some_and(|since| {
                now_ms.saturating_sub(since.max(clean_since)) >= FAULT_WINDOW_MS
            });
        if held {
            self.cleared_this_session = true;
            self.raised = false;
            return Some(FaultAlert::Clear);
        }
        None
    }

    /// A plain `Hello`: during a session, check it with a sealed `Ping`;
    /// without one, ask for a session now (once per check period: a flood
    /// of Hellos does not turn into a flood of handshakes).
    fn on_plain_hello(&mut self, now_ms: u64) {
        if self.has_session() {
            if self.check.is_some() {
                return;
            }
            let mut n = [0u8; 4];
            self.rng.fill_bytes(&mut n);
            let nonce = u32::from_le_bytes(n);
            match self.seal.seal(&Downlink::Ping { nonce }) {
                Ok(f) => {
                    self.push_out(f);
                    self.check = Some((nonce, now_ms.saturating_add(HELLO_CHECK_MS)));
                }
                Err(_) => self.ask(now_ms),
            }
            return;
        }
        let recent = self
            .asking
            .is_some_and(|(_, sent, _)| now_ms.saturating_sub(sent) < HELLO_CHECK_MS);
        if !recent {
            self.ask(now_ms);
        }
    }

    /// Sends a fresh `SealHello` and resends it with backoff until answered.
    fn ask(&mut self, now_ms: u64) {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill_bytes(&mut nonce);
        if let Ok(f) = self.seal.start(nonce) {
            self.push_out(f);
        }
        self.asking = Some((nonce, now_ms, HELLO_RETRY_FIRST_MS));
    }

    /// Counts one fault; says whether the alert is (again) raised.
    fn fault(&mut self, now_ms: u64) -> Option<FaultAlert> {
        if self.faults.len() >= FAULTS_KEPT {
            self.faults.pop_front();
        }
        self.faults.push_back(now_ms);
        let horizon = now_ms.saturating_sub(FAULT_WINDOW_MS * FAULT_MINUTES);
        while self.faults.front().is_some_and(|t| *t < horizon) {
            self.faults.pop_front();
        }
        // A fault in the session restarts its clean minute.
        self.cleared_this_session = false;
        if fault_alert_due(&self.faults, now_ms) {
            self.raised = true;
            Some(FaultAlert::Raise)
        } else {
            None
        }
    }

    fn push_out(&mut self, f: SealedFrame) {
        if self.out.len() >= OUT_MAX {
            self.out.pop_front();
        }
        self.out.push_back(f);
    }
}

/// Whether a drop counts toward `board_link_fault` (see the module docs).
pub(crate) fn counts_as_fault(cause: DropCause) -> bool {
    !matches!(cause, DropCause::Frame(_) | DropCause::NoSession)
}

/// serial.md, "Faults": three in a minute, or one in every minute for five
/// minutes. `faults` are the fault times, oldest first, the last at `now_ms`.
pub(crate) fn fault_alert_due(faults: &VecDeque<u64>, now_ms: u64) -> bool {
    // Minute i before now: faults with (now - t) / 60 s == i.
    let mut minutes = [0usize; FAULT_MINUTES as usize];
    for t in faults {
        let i = now_ms.saturating_sub(*t) / FAULT_WINDOW_MS;
        if let Some(m) = usize::try_from(i).ok().and_then(|i| minutes.get_mut(i)) {
            *m += 1;
        }
    }
    minutes.first().is_some_and(|n| *n >= FAULTS_TO_RAISE) || minutes.iter().all(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use firmware_bridge::frame::to_frame;
    use firmware_bridge::sealed::{BoardRx, BoardSeal};

    /// Deterministic bytes, so runs repeat.
    struct Counter(u8);
    impl RandomSource for Counter {
        fn fill_bytes(&mut self, out: &mut [u8]) {
            for b in out {
                self.0 = self.0.wrapping_add(1);
                *b = self.0;
            }
        }
    }

    fn payload_of(frame: &[u8]) -> Vec<u8> {
        let mut d = firmware_bridge::PayloadDecoder::new();
        frame
            .iter()
            .find_map(|b| d.push(*b).map(|r| r.unwrap().to_vec()))
            .unwrap()
    }

    fn key(b: u8) -> LinkKey {
        LinkKey::from_bytes([b; 32])
    }

    /// Hub and board through a handshake; returns both.
    fn linked(now: u64) -> (SealEnd<Counter>, BoardSeal, Counter) {
        let mut hub = SealEnd::with_rng(key(7), Counter(0), now);
        let mut board = BoardSeal::new(1, key(7));
        let mut rng = Counter(100);
        let hello = hub.pop_out().unwrap();
        let BoardRx::Send(answer) = board.on_payload(&payload_of(&hello), &mut rng) else {
            panic!()
        };
        let (rx, _) = hub.on_payload(&payload_of(&answer), now);
        assert!(matches!(rx, SealRx::SessionStarted { board_id: 1 }));
        let confirm = hub.pop_out().unwrap();
        assert!(matches!(
            board.on_payload(&payload_of(&confirm), &mut rng),
            BoardRx::SessionStarted { .. }
        ));
        (hub, board, rng)
    }

    #[test]
    fn no_message_goes_out_before_a_session_and_a_sealhello_is_resent_with_backoff() {
        let mut hub = SealEnd::with_rng(key(7), Counter(0), 0);
        assert!(hub.pop_out().is_some(), "the first SealHello");
        assert!(
            hub.seal(
                &Downlink::Unlock {
                    seq: 1,
                    door: 0,
                    ms: 1
                },
                0
            )
            .is_none()
        );
        let mut sent = vec![];
        for t in (0..=8_000).step_by(10) {
            hub.poll(t);
            while hub.pop_out().is_some() {
                sent.push(t);
            }
        }
        assert_eq!(sent, vec![500, 1500, 3500, 7500]);
    }

    #[test]
    fn a_plain_hello_answered_by_a_sealed_pong_is_counted_and_the_session_kept() {
        let (mut hub, mut board, mut rng) = linked(0);
        let hello = to_frame(&Uplink::Hello {
            board_id: 1,
            fw_major: 1,
            fw_minor: 0,
            door_count: 1,
        })
        .unwrap();
        let (rx, _) = hub.on_payload(&payload_of(&hello), 10);
        assert!(matches!(rx, SealRx::Quiet));
        let ping = hub.pop_out().expect("a sealed Ping");
        let BoardRx::Message(Downlink::Ping { nonce }) =
            board.on_payload(&payload_of(&ping), &mut rng)
        else {
            panic!()
        };
        let pong = board.seal(&Uplink::Pong { nonce }).unwrap();
        let (rx, _) = hub.on_payload(&payload_of(&pong), 20);
        assert!(matches!(rx, SealRx::Message(Uplink::Pong { .. })));
        assert_eq!(hub.drops().forged_hello, 1);
        hub.poll(1_000);
        assert!(hub.pop_out().is_none(), "no new handshake");
        assert!(hub.has_session());
    }

    #[test]
    fn a_plain_hello_without_a_pong_in_250_ms_starts_a_new_session() {
        let (mut hub, _board, _) = linked(0);
        let hello = to_frame(&Uplink::Hello {
            board_id: 1,
            fw_major: 1,
            fw_minor: 0,
            door_count: 1,
        })
        .unwrap();
        hub.on_payload(&payload_of(&hello), 10);
        assert!(hub.pop_out().is_some(), "the check Ping");
        hub.poll(200);
        assert!(hub.pop_out().is_none());
        hub.poll(260);
        let f = hub.pop_out().expect("a new SealHello");
        assert!(matches!(
            decode_payload::<Downlink>(&payload_of(&f)),
            Ok(Downlink::SealHello { .. })
        ));
        assert_eq!(hub.drops().forged_hello, 0);
    }

    #[test]
    fn a_board_with_another_key_never_gets_a_session_and_raises_the_alert_on_the_third_try() {
        let mut hub = SealEnd::with_rng(key(7), Counter(0), 0);
        let mut board = BoardSeal::new(1, key(8));
        let mut rng = Counter(100);
        let mut alerts = vec![];
        for t in (0..=4_000).step_by(10) {
            hub.poll(t);
            while let Some(f) = hub.pop_out() {
                if let BoardRx::Send(a) = board.on_payload(&payload_of(&f), &mut rng) {
                    let (rx, alert) = hub.on_payload(&payload_of(&a), t);
                    assert!(matches!(
                        rx,
                        SealRx::Dropped {
                            cause: DropCause::BadHandshake,
                            fault: true
                        }
                    ));
                    alerts.push((t, alert));
                }
            }
        }
        assert!(!hub.has_session());
        assert_eq!(
            alerts,
            vec![
                (0, None),
                (500, None),
                (1500, Some(FaultAlert::Raise)),
                (3500, Some(FaultAlert::Raise))
            ]
        );
    }

    #[test]
    fn the_alert_ends_once_a_session_holds_a_minute_with_nothing_counted() {
        let (mut hub, _board, _) = linked(0);
        let junk = [SEAL_MARK, 9, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17];
        for t in [1_000, 2_000, 3_000] {
            hub.on_payload(&junk, t);
        }
        assert!(hub.alert_raised());
        assert_eq!(hub.poll(60_500), None, "a fault at 3 s: not clean yet");
        assert_eq!(hub.poll(63_001), Some(FaultAlert::Clear));
        assert_eq!(hub.poll(70_000), None, "once");
        assert_eq!(hub.drops().causes.bad_tag, 3);
    }

    #[test]
    fn one_fault_in_each_of_five_minutes_raises_the_alert() {
        let f = |ts: &[u64]| ts.iter().copied().collect::<VecDeque<u64>>();
        let m = FAULT_WINDOW_MS;
        assert!(fault_alert_due(&f(&[1, 2, 3]), 3));
        assert!(!fault_alert_due(&f(&[1, 2, m + 3]), m + 3));
        let each = [m / 2, m + m / 2, 2 * m + m / 2, 3 * m + m / 2, 4 * m + m / 2];
        assert!(fault_alert_due(&f(&each), 4 * m + m / 2));
        let gap = [m / 2, m + m / 2, 3 * m + m / 2, 4 * m + m / 2];
        assert!(!fault_alert_due(&f(&gap), 4 * m + m / 2));
    }

    #[test]
    fn a_second_copy_of_a_handshake_answer_is_no_fault() {
        let mut hub = SealEnd::with_rng(key(7), Counter(0), 0);
        let mut board = BoardSeal::new(1, key(7));
        let mut rng = Counter(100);
        let hello = hub.pop_out().unwrap();
        let BoardRx::Send(a1) = board.on_payload(&payload_of(&hello), &mut rng) else {
            panic!()
        };
        let BoardRx::Send(a2) = board.on_payload(&payload_of(&hello), &mut rng) else {
            panic!()
        };
        assert_eq!(a1, a2);
        hub.on_payload(&payload_of(&a1), 600);
        let (rx, alert) = hub.on_payload(&payload_of(&a2), 601);
        assert!(matches!(rx, SealRx::Quiet) && alert.is_none());
        assert_eq!(hub.drops().causes.total(), 0);
    }

    // -----------------------------------------------------------------
    // The hub's reading of spec/vectors/serial-sealed.json: the hub's own
    // end (this module, as the port loop drives it: wire bytes through a
    // PayloadDecoder) makes and reads the vector's bytes exactly.
    // -----------------------------------------------------------------

    fn vectors() -> serde_json::Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/spec/vectors/serial-sealed.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn hex(v: &serde_json::Value) -> Vec<u8> {
        let s = v.as_str().unwrap();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Hands out exactly the given bytes (the vector's hub nonce).
    struct Scripted(VecDeque<u8>);
    impl RandomSource for Scripted {
        fn fill_bytes(&mut self, out: &mut [u8]) {
            for b in out {
                *b = self.0.pop_front().expect("scripted enough bytes");
            }
        }
    }

    /// Every payload in `wire`, as the port's decoder cuts them.
    fn payloads(wire: &[u8]) -> Vec<Vec<u8>> {
        let mut d = firmware_bridge::PayloadDecoder::new();
        wire.iter()
            .filter_map(|b| d.push(*b).map(|r| r.unwrap().to_vec()))
            .collect()
    }

    /// The hub after the vector's handshake, checked byte for byte.
    fn hub_after_handshake(v: &serde_json::Value) -> SealEnd<Scripted> {
        let h = &v["handshake"];
        let lk: [u8; 32] = hex(&h["lk_hex"]).try_into().unwrap();
        let msgs = h["messages"].as_array().unwrap();
        let nonce = hex(&h["hub_nonce_hex"]);
        // The vector's nonce first; then bytes for check Ping nonces.
        let mut bytes: VecDeque<u8> = nonce.into_iter().collect();
        bytes.extend([0x5a; 64]);
        let mut hub = SealEnd::with_rng(LinkKey::from_bytes(lk), Scripted(bytes), 0);
        let hello = hub.pop_out().unwrap();
        assert_eq!(hello.to_vec(), hex(&msgs[0]["wire_hex"]), "SealHello");
        let answer = payloads(&hex(&msgs[1]["wire_hex"]));
        assert_eq!(answer, [hex(&msgs[1]["payload_hex"])]);
        let (rx, alert) = hub.on_payload(&answer[0], 5);
        assert!(matches!(rx, SealRx::SessionStarted { board_id: 1 }), "{rx:?}");
        assert_eq!(alert, None);
        let confirm = hub.pop_out().unwrap();
        assert_eq!(confirm.to_vec(), hex(&msgs[2]["wire_hex"]), "SealConfirm");
        assert!(hub.has_session());
        hub
    }

    #[test]
    fn the_hub_makes_and_reads_the_vectors_handshake_and_frames_byte_for_byte() {
        let v = vectors();
        let mut hub = hub_after_handshake(&v);
        for f in v["frames"].as_array().unwrap() {
            let msg_hex = hex(&f["message_hex"]);
            match f["dir"].as_str().unwrap() {
                "board->hub" => {
                    let got = payloads(&hex(&f["wire_hex"]));
                    assert_eq!(got, [hex(&f["payload_hex"])]);
                    let (rx, _) = hub.on_payload(&got[0], 10);
                    let SealRx::Message(m) = rx else {
                        panic!("{}: {rx:?}", f["message"])
                    };
                    assert_eq!(postcard::to_allocvec(&m).unwrap(), msg_hex, "{}", f["message"]);
                }
                "hub->board" => {
                    let msg: Downlink = postcard::from_bytes(&msg_hex).unwrap();
                    let sealed = hub.seal(&msg, 10).expect("in session");
                    assert_eq!(sealed.to_vec(), hex(&f["wire_hex"]), "{}", f["message"]);
                }
                other => panic!("direction {other}"),
            }
        }
        assert_eq!(hub.drops().causes.total(), 0);
    }

    #[test]
    fn the_hub_drops_and_counts_what_the_vectors_say_must_be_dropped() {
        let v = vectors();
        let mut hub = hub_after_handshake(&v);
        let frames = v["frames"].as_array().unwrap();
        for f in frames.iter().filter(|f| f["dir"] == "board->hub") {
            let p = payloads(&hex(&f["wire_hex"]));
            assert!(matches!(hub.on_payload(&p[0], 10).0, SealRx::Message(_)));
        }
        let last_up = frames
            .iter()
            .rev()
            .find(|f| f["dir"] == "board->hub")
            .unwrap();
        let p = hex(&last_up["payload_hex"]);
        let cause = |hub: &mut SealEnd<Scripted>, p: &[u8]| match hub.on_payload(p, 20).0 {
            SealRx::Dropped { cause, fault } => {
                assert!(fault, "{cause:?} counts toward board_link_fault");
                cause
            }
            other => panic!("{other:?} was not dropped"),
        };
        // The board's last frame again: a replay.
        assert_eq!(cause(&mut hub, &p), DropCause::Replay);
        // One bit flipped in its ciphertext: the tag fails.
        let mut flipped = p.clone();
        flipped[7] ^= 0x01;
        assert_eq!(cause(&mut hub, &flipped), DropCause::BadTag);
        // Every sealed frame the vectors make the board drop (the hub's own
        // direction reflected back, another key) the hub drops too. Their
        // plain Unlock reads, to a hub, as a plain Hello: answered with a
        // sealed Ping, never taken.
        for f in v["must_drop_after_frames"].as_array().unwrap() {
            let p = payloads(&hex(&f["wire_hex"]));
            let (rx, _) = hub.on_payload(&p[0], 20);
            if p[0][0] == SEAL_MARK {
                assert!(matches!(rx, SealRx::Dropped { .. }), "{}: {rx:?}", f["why"]);
            } else {
                assert!(matches!(rx, SealRx::Quiet), "{}: {rx:?}", f["why"]);
                let ping = hub.pop_out().expect("a check Ping");
                assert_eq!(payloads(&ping)[0][0], SEAL_MARK, "sealed");
            }
        }
        // A plain Keypad is never taken on a sealed link.
        let keypad = firmware_bridge::to_frame(&Uplink::Keypad {
            seq: 9,
            door: 0,
            pin: firmware_bridge::Pin::from_digits("123456").unwrap(),
        })
        .unwrap();
        assert_eq!(cause(&mut hub, &payloads(&keypad)[0]), DropCause::Plain);
        let d = hub.drops().causes;
        assert_eq!((d.replay, d.bad_tag, d.plain), (1, 5, 1), "{d:?}");
        assert!(hub.has_session(), "drops never end the session");
    }

}
