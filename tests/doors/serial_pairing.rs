//! `lockhub board pair` and `lockhub board rekey` (lockhub::ops::board)
//! against a simulated board over a real pseudo-terminal: the code typed
//! on the board, the key written only after a session under it verifies,
//! a wrong code, a device in the middle, and a rekey.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firmware_bridge::frame::{decode_payload, to_frame};
use firmware_bridge::pair::{BoardPairPhase, BoardPairing, HubPairStep, HubPairing, PairError};
use firmware_bridge::{BoardConfig, Downlink, Uplink};
use lockhub::drivers::OsRandom;
use lockhub::ops::board::BoardError;
use lockhub::sim::board::SimBoard;
use testkit::board::pty::{self, Master, Pty};
use testkit::board::relay::{Dir, Relay, payload_of};
use testkit::board::{Sim, WAIT};
use testkit::files::{Fixture, HubToml, board_key_for, board_key_toml, read_secrets_vector};
use tokio::task::JoinHandle;

/// A config whose `board-a` is at `port`; secrets without a board key
/// (to pair) or with `key` (to rekey).
fn config(port: &Path, key: Option<[u8; 32]>) -> Fixture {
    let fx = Fixture::new();
    fx.write_hub(
        &HubToml {
            serial: vec![("board-a".into(), port.display().to_string())],
            ..HubToml::vectors()
        }
        .render(),
    );
    let extra = key.map_or(String::new(), |k| board_key_toml("board-a", &k));
    fx.write_secrets(&(read_secrets_vector() + &extra));
    fx
}

type Pairing = JoinHandle<Result<lockhub::ops::board::Keyed, BoardError>>;

/// `lockhub board pair` as a task; the code it shows arrives on the channel.
fn start_pair(hub: PathBuf) -> (Pairing, std::sync::mpsc::Receiver<String>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let task = tokio::spawn(async move {
        let mut show = move |code: &str| {
            let _ = tx.send(code.to_owned());
        };
        lockhub::ops::board::pair(&hub, "board-a", &mut show).await
    });
    (task, rx)
}

/// Steps the board until the command shows its code and the board has
/// taken the reveal that came before it: an installer reads the code, then
/// types it. (Keys typed before the reveal is read are not a code; a
/// test that pressed them at once would wait for a pairing that cannot end.)
async fn code_of(sim: &mut Sim, rx: &std::sync::mpsc::Receiver<String>) -> String {
    let end = tokio::time::Instant::now() + WAIT;
    let mut code = None;
    loop {
        if code.is_none() {
            code = rx.try_recv().ok();
        }
        if let Some(code) = &code
            && sim.board().pairing_phase() == Some(BoardPairPhase::AwaitCode)
        {
            return code.clone();
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no code shown, or the board never took the reveal"
        );
        sim.step().await.unwrap();
    }
}

/// Steps the board until the command ends; its result.
async fn finish<T>(sim: &mut Sim, task: JoinHandle<T>) -> T {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while !task.is_finished() {
        assert!(tokio::time::Instant::now() < end, "the command hangs");
        sim.step().await.unwrap();
    }
    task.await.unwrap()
}

fn pairing_board(master: Master) -> Sim {
    SimBoard::new_pairing(master, BoardConfig::new(1, 1))
}

/// The board-a key the secrets file holds now, if any (the file must load).
fn written_key(fx: &Fixture) -> Option<[u8; 32]> {
    let c = lockhub::config::load(&fx.hub()).ok()?;
    c.board_key("board-a").map(|k| k.key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_writes_the_key_the_board_took_only_after_a_session_under_it() {
    let pty = Pty::open();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("board-a");
    pty::point(&link, &pty.path);
    let fx = config(&link, None);
    assert!(lockhub::config::load(&fx.hub()).is_err(), "no key yet");
    let (master, _slave, _) = pty.into_parts();
    let mut sim = pairing_board(master);
    let (task, codes) = start_pair(fx.hub());
    let code = code_of(&mut sim, &codes).await;
    assert_eq!(code.len(), 6);
    assert_eq!(written_key(&fx), None, "nothing written before the code");
    sim.press(0, &format!("{code}#"));
    let keyed = finish(&mut sim, task).await.expect("paired");
    assert_eq!(keyed.secrets, fx.secrets());
    let key = written_key(&fx).expect("the config loads with the key");
    assert_eq!(Some(key), sim.take_new_key(), "the board's key");
    let mode = std::fs::metadata(fx.secrets())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    // The rest of the file is as it was.
    assert!(
        std::fs::read_to_string(fx.secrets())
            .unwrap()
            .starts_with(&read_secrets_vector())
    );
    assert!(sim.board().has_session(), "the proof was a real session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_code_on_the_board_writes_nothing_and_says_why() {
    let pty = Pty::open();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("board-a");
    pty::point(&link, &pty.path);
    let fx = config(&link, None);
    let before = std::fs::read(fx.secrets()).unwrap();
    let (master, _slave, _) = pty.into_parts();
    let mut sim = pairing_board(master);
    let (task, codes) = start_pair(fx.hub());
    let code = code_of(&mut sim, &codes).await;
    let wrong: String = code
        .chars()
        .map(|c| char::from(b'0' + (c as u8 - b'0' + 1) % 10))
        .collect();
    sim.press(0, &format!("{wrong}#"));
    let err = finish(&mut sim, task).await.unwrap_err();
    assert!(
        matches!(err, BoardError::Pairing(PairError::Refused)),
        "{err}"
    );
    assert_eq!(err.exit_code(), 1);
    assert!(err.to_string().contains("unchanged"), "{err}");
    assert_eq!(std::fs::read(fx.secrets()).unwrap(), before);
    assert_eq!(sim.take_new_key(), None);
}

/// A device in the middle that answers the hub's commit with keys of its
/// own and pairs with the board under other keys: two codes.
struct Mitm {
    as_board: BoardPairing,
    as_hub: HubPairing,
    board_code: Arc<Mutex<Option<String>>>,
}

impl Mitm {
    fn rule(mut self) -> impl FnMut(Dir, &[u8]) -> Vec<(Dir, Vec<u8>)> + Send {
        move |dir, frame| {
            let Some(msg) = payload_of(frame) else {
                return vec![];
            };
            let frame_to = |d: Dir, bytes: Vec<u8>| vec![(d, bytes)];
            match dir {
                Dir::HubToBoard => match decode_payload::<Downlink>(&msg) {
                    Ok(m @ Downlink::PairStart { .. }) => {
                        // Its own key toward the hub, its own commit toward
                        // the board.
                        let mut out = vec![];
                        if let Some(reply) = self.as_board.on_msg(&m, &mut OsRandom) {
                            out.extend(frame_to(
                                Dir::BoardToHub,
                                to_frame(&reply).unwrap().to_vec(),
                            ));
                        }
                        out.extend(frame_to(
                            Dir::HubToBoard,
                            to_frame(&self.as_hub.start_msg()).unwrap().to_vec(),
                        ));
                        out
                    }
                    Ok(m @ Downlink::PairReveal { .. }) => {
                        self.as_board.on_msg(&m, &mut OsRandom);
                        vec![]
                    }
                    _ => vec![],
                },
                Dir::BoardToHub => match decode_payload::<Uplink>(&msg) {
                    Ok(m @ Uplink::PairReply { .. }) => match self.as_hub.on_msg(&m, 0) {
                        Ok(HubPairStep::Reveal(reveal, code)) => {
                            let digits = code.digits().iter().map(|d| char::from(*d)).collect();
                            *self.board_code.lock().unwrap() = Some(digits);
                            frame_to(Dir::HubToBoard, to_frame(&reveal).unwrap().to_vec())
                        }
                        _ => vec![],
                    },
                    // The board's verdict goes to the hub as it is.
                    Ok(Uplink::PairDone { .. }) => vec![(dir, frame.to_vec())],
                    _ => vec![],
                },
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_in_the_middle_gets_another_code_the_board_refuses_and_no_key_is_written() {
    let (relay, master, _keep) = Relay::start();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("board-a");
    pty::point(&link, &relay.hub_path);
    let fx = config(&link, None);
    let before = std::fs::read(fx.secrets()).unwrap();
    let board_code = Arc::new(Mutex::new(None));
    relay.tamper(
        Mitm {
            as_board: BoardPairing::new(),
            as_hub: HubPairing::new(&mut OsRandom, 0),
            board_code: board_code.clone(),
        }
        .rule(),
    );
    let mut sim = pairing_board(master);
    let (task, codes) = start_pair(fx.hub());
    // The board has paired with the relay: it waits for a code.
    let hub_code = code_of(&mut sim, &codes).await;
    let relay_code = board_code
        .lock()
        .unwrap()
        .clone()
        .expect("the board's code");
    assert_ne!(hub_code, relay_code, "the commit kept the codes apart");
    sim.press(0, &format!("{hub_code}#"));
    let err = finish(&mut sim, task).await.unwrap_err();
    assert!(
        matches!(err, BoardError::Pairing(PairError::Refused)),
        "{err}"
    );
    assert_eq!(
        sim.board().pairing_phase(),
        Some(BoardPairPhase::Failed(PairError::CodeMismatch))
    );
    assert_eq!(sim.take_new_key(), None, "the board took no key");
    assert_eq!(std::fs::read(fx.secrets()).unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_agrees_a_new_key_in_a_session_and_writes_it_once_a_session_under_it_verifies() {
    let pty = Pty::open();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("board-a");
    pty::point(&link, &pty.path);
    let old = board_key_for("board-a");
    let fx = config(&link, Some(old));
    let (master, _slave, _) = pty.into_parts();
    let mut sim = SimBoard::new_sealed(master, BoardConfig::new(1, 1), old);
    let hub = fx.hub();
    let task = tokio::spawn(async move { lockhub::ops::board::rekey(&hub, "board-a").await });
    finish(&mut sim, task).await.expect("rekeyed");
    let new = written_key(&fx).expect("the config loads with the new key");
    assert_ne!(new, old);
    assert_eq!(sim.take_new_key(), Some(new), "the board took the same key");
    assert!(sim.board().has_session());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_that_holds_another_key_is_not_rekeyed_and_nothing_is_written() {
    let pty = Pty::open();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("board-a");
    pty::point(&link, &pty.path);
    let fx = config(&link, Some(board_key_for("board-a")));
    let before = std::fs::read(fx.secrets()).unwrap();
    let (master, _slave, _) = pty.into_parts();
    let mut sim = SimBoard::new_sealed(master, BoardConfig::new(1, 1), board_key_for("board-z"));
    let hub = fx.hub();
    let task = tokio::spawn(async move { lockhub::ops::board::rekey(&hub, "board-a").await });
    let err = finish(&mut sim, task).await.unwrap_err();
    assert!(matches!(err, BoardError::Timeout(_)), "{err}");
    assert!(err.to_string().contains("does not hold it"), "{err}");
    assert_eq!(std::fs::read(fx.secrets()).unwrap(), before);
}

/// A sealed `RekeyReply` (21 bytes of seal around `10 || board_pub`): the
/// one board frame of that length.
const SEALED_REKEY_REPLY: usize = 21 + 1 + 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rekey_whose_link_drops_after_the_reply_writes_nothing_and_the_next_rekey_succeeds() {
    let (relay, master, _keep) = Relay::start();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("board-a");
    pty::point(&link, &relay.hub_path);
    let old = board_key_for("board-a");
    let fx = config(&link, Some(old));
    let before = std::fs::read(fx.secrets()).unwrap();
    // The line goes dead right after the board's RekeyReply.
    let mut dead = false;
    relay.tamper(move |dir, frame| {
        if dead {
            return vec![];
        }
        dead = dir == Dir::BoardToHub
            && payload_of(frame).is_some_and(|p| p.len() == SEALED_REKEY_REPLY);
        vec![(dir, frame.to_vec())]
    });
    let mut sim = SimBoard::new_sealed(master, BoardConfig::new(1, 1), old);
    let hub = fx.hub();
    let task = tokio::spawn(async move { lockhub::ops::board::rekey(&hub, "board-a").await });
    let err = finish(&mut sim, task).await.unwrap_err();
    assert!(matches!(err, BoardError::Timeout(_)), "{err}");
    assert_eq!(
        std::fs::read(fx.secrets()).unwrap(),
        before,
        "nothing written"
    );
    assert_eq!(
        sim.take_new_key(),
        None,
        "the board still holds the old key"
    );

    // The line is back: the board, holding the old key and the pending
    // one, answers under each in turn; the old key's session drops the
    // pending key, and a new rekey goes through.
    relay.pass();
    let hub = fx.hub();
    let task = tokio::spawn(async move { lockhub::ops::board::rekey(&hub, "board-a").await });
    finish(&mut sim, task).await.expect("the second rekey");
    let new = written_key(&fx).expect("the config loads with the new key");
    assert_ne!(new, old);
    assert_eq!(sim.take_new_key(), Some(new));
}
