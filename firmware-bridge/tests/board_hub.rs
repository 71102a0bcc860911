//! A board and a hub-side link talking over an in-memory serial line that
//! can lose frames: the same code the firmware and the hub run, end to end.

use firmware_bridge::board::{Board, BoardConfig, KeyAction};
use firmware_bridge::frame::{FrameDecoder, to_frame};
use firmware_bridge::link::{HubLink, LinkConfig, LinkEvent};
use firmware_bridge::{DenyReason, Downlink, Uplink};

/// Minimal hub: decides "1234" at door 0 opens for 3 s, anything else is a
/// Deny. Records what it acted on and the link events.
struct Hub {
    link: HubLink,
    dec: FrameDecoder<Uplink>,
    decided: Vec<Uplink>,
    /// Door levels and tampers acted on.
    heard: Vec<Uplink>,
    events: Vec<LinkEvent<Downlink>>,
    board_hellos: u32,
}

impl Hub {
    fn new(now: u64) -> Self {
        let mut link = HubLink::new(LinkConfig::hub(), now);
        link.open_session(Downlink::Hello { session: 0xC0FFEE }, now);
        Self {
            link,
            dec: FrameDecoder::new(),
            decided: Vec::new(),
            heard: Vec::new(),
            events: Vec::new(),
            board_hellos: 0,
        }
    }

    fn on_bytes(&mut self, bytes: &[u8], now: u64) {
        let msgs: Vec<Uplink> = self.dec.feed(bytes).filter_map(Result::ok).collect();
        for m in msgs {
            let Some(m) = self.link.on_rx(m, now) else {
                continue;
            };
            match &m {
                Uplink::Hello { .. } => self.board_hellos += 1,
                Uplink::Keypad { door, pin, .. } => {
                    let reply = if *door == 0 && pin.as_digits() == Some("1234") {
                        Downlink::Unlock {
                            seq: 0,
                            door: *door,
                            ms: 3000,
                        }
                    } else {
                        Downlink::Deny {
                            seq: 0,
                            door: *door,
                            reason: DenyReason::DENIED,
                        }
                    };
                    self.link.send(reply, now).expect("hub send");
                    self.decided.push(m.clone());
                }
                Uplink::DoorSensor { .. } | Uplink::Tamper { .. } => self.heard.push(m.clone()),
                _ => {}
            }
        }
    }

    fn poll(&mut self, now: u64) -> Vec<Vec<u8>> {
        self.link.poll(now);
        while let Some(e) = self.link.pop_event() {
            self.events.push(e);
        }
        let mut out = Vec::new();
        while let Some(m) = self.link.pop_tx() {
            out.push(to_frame(&m).unwrap().to_vec());
        }
        out
    }
}

/// Decides, given a frame's index in its direction and the message, whether
/// the line loses it.
type LineRule<M> = Box<dyn Fn(usize, &M) -> bool>;

/// Runs both ends in 10 ms steps. `drop_up`/`drop_down` decide, per frame
/// index in that direction, whether the line loses it.
struct Sim {
    now: u64,
    board: Board,
    hub: Hub,
    up_count: usize,
    down_count: usize,
    drop_up: LineRule<Uplink>,
    drop_down: LineRule<Downlink>,
    board_saw: Vec<Downlink>,
}

impl Sim {
    fn new() -> Self {
        Self {
            now: 0,
            board: Board::new(BoardConfig::new(1, 2), 0),
            hub: Hub::new(0),
            up_count: 0,
            down_count: 0,
            drop_up: Box::new(|_, _| false),
            drop_down: Box::new(|_, _| false),
            board_saw: Vec::new(),
        }
    }

    fn step(&mut self) {
        let up: Vec<Vec<u8>> = self.board.poll(self.now).map(|f| f.to_vec()).collect();
        for f in up {
            let m: Uplink = firmware_bridge::decode_frame(&f).unwrap();
            let i = self.up_count;
            self.up_count += 1;
            if !(self.drop_up)(i, &m) {
                self.hub.on_bytes(&f, self.now);
            }
        }
        for f in self.hub.poll(self.now) {
            let m: Downlink = firmware_bridge::decode_frame(&f).unwrap();
            let i = self.down_count;
            self.down_count += 1;
            if !(self.drop_down)(i, &m) {
                self.board_saw.push(m);
                self.board.on_frame_bytes(&f, self.now);
            }
        }
        self.now += 10;
    }

    fn run_for(&mut self, ms: u64) {
        let end = self.now + ms;
        while self.now < end {
            self.step();
        }
    }

    fn type_keys(&mut self, door: u8, keys: &str) -> KeyAction {
        let mut last = KeyAction::Ignored;
        for k in keys.chars() {
            last = self.board.on_key(door, k, self.now);
        }
        last
    }
}

/// A line that loses only the first frame matching `pred`.
fn drop_first<M: 'static>(pred: impl Fn(&M) -> bool + 'static) -> LineRule<M> {
    let done = std::cell::Cell::new(false);
    Box::new(move |_, m| {
        if !done.get() && pred(m) {
            done.set(true);
            true
        } else {
            false
        }
    })
}

#[test]
fn hub_becomes_ready_after_the_board_answers_its_hello() {
    let mut s = Sim::new();
    assert!(!s.hub.link.ready());
    s.run_for(50);
    assert!(s.hub.link.ready());
    // Board's power-up Hello plus its answer to the hub's Hello.
    assert_eq!(s.hub.board_hellos, 2);
}

#[test]
fn correct_pin_opens_the_relay_and_the_hub_sees_the_unlock_acked() {
    let mut s = Sim::new();
    s.run_for(100);
    assert_eq!(s.type_keys(0, "1234#"), KeyAction::Submitted(1));
    s.run_for(50);
    assert!(s.board.relay_open(0, s.now));
    assert!(
        s.hub
            .events
            .iter()
            .any(|e| matches!(e, LinkEvent::Acked(Downlink::Unlock { door: 0, .. })))
    );
    s.run_for(3000);
    assert!(!s.board.relay_open(0, s.now));
}

#[test]
fn wrong_pin_shows_deny_at_the_board() {
    let mut s = Sim::new();
    s.run_for(100);
    s.type_keys(1, "9999#");
    s.run_for(50);
    assert_eq!(s.board.deny_feedback(1, s.now), Some(DenyReason::DENIED));
    assert!(!s.board.relay_open(1, s.now));
}

#[test]
fn lost_keypad_ack_means_a_resent_keypad_that_the_hub_decides_only_once() {
    let mut s = Sim::new();
    // Lose the hub's first Ack of the board's Keypad.
    s.drop_down = drop_first(|m| *m == Downlink::Ack { seq: 1 });
    s.run_for(100);
    s.type_keys(0, "1234#");
    s.run_for(2000);
    assert_eq!(
        s.hub.link.stats().duplicates,
        1,
        "the board resent the Keypad once"
    );
    assert_eq!(s.hub.decided.len(), 1, "decided once");
    assert_eq!(s.board.stats().uplinks_failed, 0);
}

#[test]
fn lost_unlock_is_resent_and_still_opens_the_door() {
    let mut s = Sim::new();
    s.drop_down = drop_first(|m| matches!(m, Downlink::Unlock { .. }));
    s.run_for(100);
    s.type_keys(0, "1234#");
    s.run_for(200);
    assert!(!s.board.relay_open(0, s.now), "first copy lost");
    s.run_for(100);
    assert!(s.board.relay_open(0, s.now), "resend after 250 ms arrived");
    assert!(
        s.hub
            .events
            .iter()
            .any(|e| matches!(e, LinkEvent::Acked(Downlink::Unlock { .. })))
    );
}

#[test]
fn unlock_that_never_gets_through_is_reported_as_unconfirmed() {
    let mut s = Sim::new();
    s.drop_down = Box::new(|_, m| matches!(m, Downlink::Unlock { .. }));
    s.run_for(100);
    s.type_keys(0, "1234#");
    s.run_for(1500);
    assert!(!s.board.relay_open(0, s.now));
    let unlocks = s
        .board_saw
        .iter()
        .filter(|m| matches!(m, Downlink::Unlock { .. }))
        .count();
    assert_eq!(unlocks, 0);
    assert!(
        s.hub
            .events
            .iter()
            .any(|e| matches!(e, LinkEvent::Failed(Downlink::Unlock { .. })))
    );
}

#[test]
fn pings_keep_the_link_up_and_a_dead_line_takes_both_sides_down() {
    let mut s = Sim::new();
    s.run_for(30_000);
    assert!(s.board.link_up(s.now));
    assert!(!s.hub.events.contains(&LinkEvent::Down));
    // Cut the line both ways.
    s.drop_down = Box::new(|_, _| true);
    s.drop_up = Box::new(|_, _| true);
    s.run_for(6_100);
    assert!(!s.board.link_up(s.now));
    assert!(s.hub.events.contains(&LinkEvent::Down));
}

#[test]
fn a_keypad_unacked_when_the_hub_says_hello_is_dropped_and_never_decided_after_it() {
    let mut s = Sim::new();
    s.run_for(100);
    // The line loses the entry, so it waits for an Ack...
    s.drop_up = Box::new(|_, m| matches!(m, Uplink::Keypad { .. }));
    assert_eq!(s.type_keys(0, "1234#"), KeyAction::Submitted(1));
    s.run_for(100);
    // ...when the hub restarts: a fresh link, its Hello on the wire.
    s.hub = Hub::new(s.now);
    let hellos_before = s
        .board_saw
        .iter()
        .filter(|m| matches!(m, Downlink::Hello { .. }))
        .count();
    while s
        .board_saw
        .iter()
        .filter(|m| matches!(m, Downlink::Hello { .. }))
        .count()
        == hellos_before
    {
        s.step();
    }
    // From the hub's Hello on, the line loses nothing.
    s.drop_up = Box::new(|_, _| false);
    s.run_for(2_000);
    assert!(s.hub.link.ready());
    assert!(
        s.hub.decided.is_empty(),
        "the entry from before the Hello was decided after it: {:?}",
        s.hub.decided
    );
    assert!(!s.board.relay_open(0, s.now));
    // The guest types again, and that entry is decided.
    s.type_keys(0, "1234#");
    s.run_for(100);
    assert_eq!(s.hub.decided.len(), 1);
    assert!(s.board.relay_open(0, s.now));
}

#[test]
fn a_hello_after_a_frame_cut_short_by_a_reset_still_reaches_the_hub() {
    // A Keypad frame cut off halfway (the board reset mid-write)...
    let keypad = to_frame(&Uplink::Keypad {
        seq: 9,
        door: 0,
        pin: firmware_bridge::Pin::from_digits("123456").unwrap(),
    })
    .unwrap();
    let mut wire = keypad[..keypad.len() / 2].to_vec();
    // ...then what the restarted board writes first.
    let mut board = Board::new(BoardConfig::new(4, 2), 0);
    for f in board.poll(0) {
        wire.extend_from_slice(&f);
    }
    let mut dec: FrameDecoder<Uplink> = FrameDecoder::new();
    let got: Vec<Uplink> = dec.feed(&wire).filter_map(Result::ok).collect();
    assert_eq!(
        got,
        [Uplink::Hello {
            board_id: 4,
            fw_major: 1,
            fw_minor: 0,
            door_count: 2
        }]
    );
}

#[test]
fn after_the_hubs_hello_the_board_reports_every_door() {
    let mut s = Sim::new();
    s.board.on_door_sensor(0, true, 0);
    s.board.on_door_sensor(1, false, 0);
    s.run_for(100);
    s.hub = Hub::new(s.now);
    // A hub that remembers door sensor reports after its Hello.
    let mut seen = Vec::new();
    for _ in 0..20 {
        let up: Vec<Vec<u8>> = s.board.poll(s.now).map(|f| f.to_vec()).collect();
        for f in up {
            let msgs: Vec<Uplink> = s.hub.dec.feed(&f).filter_map(Result::ok).collect();
            for m in msgs {
                if let Some(m) = s.hub.link.on_rx(m, s.now) {
                    seen.push(m);
                }
            }
        }
        for f in s.hub.poll(s.now) {
            s.board.on_frame_bytes(&f, s.now);
        }
        s.now += 10;
    }
    let hello = seen
        .iter()
        .position(|m| matches!(m, Uplink::Hello { .. }))
        .expect("the board answers the hub's Hello");
    let sensors: Vec<(u8, bool)> = seen[hello..]
        .iter()
        .filter_map(|m| match m {
            Uplink::DoorSensor { door, open, .. } => Some((*door, *open)),
            _ => None,
        })
        .collect();
    assert_eq!(sensors, [(0, true), (1, false)]);
}

#[test]
fn a_door_forced_and_a_tamper_during_a_line_glitch_reach_the_hub_once_it_is_back() {
    let mut s = Sim::new();
    s.board.on_door_sensor(0, false, s.now);
    s.run_for(500);
    s.hub.heard.clear();
    // The line loses everything for 1.5 s, long enough for every send of
    // what the board says meanwhile to fail, too short for a reopen.
    let cut = s.now;
    s.drop_down = Box::new(|_, _| true);
    s.drop_up = Box::new(|_, _| true);
    s.run_for(200);
    s.board.on_door_sensor(0, true, s.now);
    s.board.on_tamper(s.now).unwrap();
    s.run_for(1_300);
    assert!(s.board.stats().uplinks_failed >= 2);
    assert!(s.hub.heard.is_empty());
    s.drop_down = Box::new(|_, _| false);
    s.drop_up = Box::new(|_, _| false);
    s.run_for(2_000);
    assert!(
        s.hub.heard.iter().any(|m| matches!(
            m,
            Uplink::DoorSensor {
                door: 0,
                open: true,
                ..
            }
        )),
        "{:?} since {cut}",
        s.hub.heard
    );
    assert_eq!(
        s.hub
            .heard
            .iter()
            .filter(|m| matches!(m, Uplink::Tamper { .. }))
            .count(),
        1,
        "{:?}",
        s.hub.heard
    );
}
