//! What a serial port records without waiting: the audit rows, alerts
//! and link bookkeeping its tasks hand to the port's recorder
//! ([`crate::door::recorder`]: in order, never turning away an audit row or an
//! alert while there is room).

use crate::door::recorder::{DoorRecord, Recordable};
use crate::store::alerts::Change;
use crate::store::door::{DoorEvent, record_door_event};
use crate::store::links::{self, LinkState};
use lockhub_proto::outputs::Condition;
use lockhub_proto::time::Timestamp;

/// Something to write, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// An unlock, an entry denied undecided, a door's sensor state or a
    /// flood row, recorded alike by both drivers ([`DoorRecord`]).
    Door(DoorRecord),
    /// `board.tamper` with its alert.
    DoorEvent {
        kind: DoorEvent,
        door: String,
        at: Timestamp,
    },
    Alert {
        change: Change,
        condition: Condition,
        subject: String,
        at: Timestamp,
    },
    /// The port's link state for `lockhub status` (`links` table), with the
    /// `board_offline` change it brings in the same transaction: the row
    /// and the alert never disagree in the database.
    Link {
        serial: String,
        state: LinkState,
        board_offline: Option<Change>,
        at: Timestamp,
    },
    /// The board's Hello: who it is; the link is up.
    Hello {
        serial: String,
        board_id: u8,
        fw: (u8, u8),
        at: Timestamp,
    },
    /// A valid frame arrived (sent at most every `FRAME_SEEN_EVERY_S`).
    FrameSeen { serial: String, at: Timestamp },
    /// Bad frames dropped since the daemon started (sent at most every
    /// `COUNTERS_EVERY_S` while they change).
    BadFrames {
        serial: String,
        count: u64,
        at: Timestamp,
    },
    /// The link's sealing: sealed or plain, since when the current sealed
    /// session holds, the drops by cause since the daemon started (sent on
    /// a session change, else like `BadFrames`).
    Seal {
        serial: String,
        sealed: bool,
        session_since: Option<Timestamp>,
        drops: super::port::sealing::SealDrops,
        at: Timestamp,
    },
}

impl From<DoorRecord> for Record {
    fn from(rec: DoorRecord) -> Self {
        Record::Door(rec)
    }
}

impl Recordable for Record {
    fn apply(&self, conn: &rusqlite::Connection) -> Result<(), crate::store::error::StoreError> {
        match self {
            Record::Door(rec) => rec.apply(conn),
            Record::DoorEvent { kind, door, at } => {
                record_door_event(conn, *kind, door, *at).map(drop)
            }
            Record::Alert {
                change,
                condition,
                subject,
                at,
            } => change.write(conn, *condition, subject, *at),
            Record::Link {
                serial,
                state,
                board_offline,
                at,
            } => {
                if let Some(change) = board_offline {
                    change.write(conn, Condition::BoardOffline, serial, *at)?;
                }
                links::set_state(conn, serial, *state, *at)
            }
            Record::Hello {
                serial,
                board_id,
                fw,
                at,
            } => links::hello(conn, serial, *board_id, fw.0, fw.1, *at),
            Record::FrameSeen { serial, at } => links::frame_seen(conn, serial, *at),
            Record::BadFrames { serial, count, at } => {
                links::set_bad_frames(conn, serial, *count, *at)
            }
            Record::Seal {
                serial,
                sealed,
                session_since,
                drops,
                at,
            } => {
                let c = drops.causes;
                let seal = links::SealRow {
                    serial: serial.clone(),
                    sealed: *sealed,
                    session_since: *session_since,
                    bad_tag: c.bad_tag,
                    replayed: c.replay,
                    plain: c.plain,
                    bad_handshake: c.bad_handshake,
                    forged_hello: drops.forged_hello,
                    other: c
                        .short
                        .saturating_add(c.not_a_message)
                        .saturating_add(c.no_session),
                };
                links::set_seal(conn, &seal, *at)
            }
        }
    }

    fn what(&self) -> String {
        match self {
            Record::Door(rec) => rec.what(),
            Record::DoorEvent { kind, door, .. } => format!("{kind:?} at {door}"),
            Record::Alert {
                change,
                condition,
                subject,
                ..
            } => format!("{} {} for {subject}", change.as_str(), condition.as_str()),
            Record::Link {
                serial,
                state,
                board_offline,
                ..
            } => match board_offline {
                Some(change) => format!(
                    "link {serial} {} ({} board_offline)",
                    state.as_str(),
                    change.as_str()
                ),
                None => format!("link {serial} {}", state.as_str()),
            },
            Record::Hello { serial, .. } => format!("board hello on {serial}"),
            Record::FrameSeen { serial, .. } => format!("frame seen on {serial}"),
            Record::BadFrames { serial, count, .. } => format!("{count} bad frames on {serial}"),
            Record::Seal { serial, .. } => format!("link sealing of {serial}"),
        }
    }

    /// Link bookkeeping; a link row that carries an alert is kept for the
    /// alert's sake.
    fn droppable(&self) -> bool {
        matches!(
            self,
            Record::Link {
                board_offline: None,
                ..
            } | Record::Hello { .. }
                | Record::FrameSeen { .. }
                | Record::BadFrames { .. }
                | Record::Seal { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Priority, Store};

    fn frame_seen() -> Record {
        Record::FrameSeen {
            serial: "a".into(),
            at: Timestamp(0),
        }
    }

    fn unlock() -> Record {
        Record::Door(DoorRecord::Unlock {
            door: "101".into(),
            key_id: "k".into(),
            confirmed: true,
            at: Timestamp(0),
        })
    }

    fn link(state: LinkState, board_offline: Option<Change>) -> Record {
        Record::Link {
            serial: "a".into(),
            state,
            board_offline,
            at: Timestamp(0),
        }
    }

    #[test]
    fn link_bookkeeping_may_be_dropped_but_not_an_audit_row_or_a_link_row_that_carries_an_alert() {
        assert!(frame_seen().droppable());
        assert!(link(LinkState::Down, None).droppable());
        assert!(!unlock().droppable());
        assert!(!link(LinkState::Down, Some(Change::Raise)).droppable());
        assert!(!link(LinkState::Up, Some(Change::Clear)).droppable());
    }

    #[test]
    fn a_link_row_and_the_board_offline_change_it_carries_land_in_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            &dir.path().join("lockhub.db"),
            &crate::config::Policy::default(),
        )
        .unwrap();
        let seen = |store: &Store| {
            let conn = store.reader().unwrap();
            let state = links::all(&conn).unwrap().first().map(|r| r.state);
            let offline =
                crate::store::alerts::raised_subjects(&conn, Condition::BoardOffline).unwrap();
            (state, offline)
        };
        let write = |rec: Record| {
            store
                .write_blocking(Priority::Bulk, move |c| rec.apply(c))
                .unwrap()
        };
        write(link(LinkState::Down, Some(Change::Raise)));
        assert_eq!(seen(&store), (Some(LinkState::Down), vec!["a".to_owned()]));
        write(link(LinkState::Up, Some(Change::Clear)));
        assert_eq!(seen(&store), (Some(LinkState::Up), vec![]));
        // Link bookkeeping alone leaves the alert as it is.
        write(link(LinkState::Down, None));
        assert_eq!(seen(&store), (Some(LinkState::Down), vec![]));
        store.close();
    }
}
