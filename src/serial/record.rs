//! What a serial port records without waiting: the audit rows, alerts
//! and link bookkeeping its tasks hand to the port's recorder
//! ([`crate::recorder`]: in order, never turning away an audit row or an
//! alert while there is room).

use crate::recorder::Recordable;
use crate::store::alerts::Change;
use crate::store::door::{
    DoorEvent, record_door_event, record_flood, record_sensor, record_storage_failure,
    record_unlock,
};
use crate::store::links::{self, LinkState};
use crate::watch::{DoorAlarm, DoorState};
use lockhub_proto::outputs::Condition;
use lockhub_proto::time::Timestamp;

/// Something to write, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// `door.unlocked` (the board acked) or `door.unlock_unconfirmed`.
    Unlock {
        door: String,
        key_id: String,
        confirmed: bool,
        at: Timestamp,
    },
    /// A door sensor report that changed the door's durable state, and
    /// what it means (see [`record_sensor`]).
    Sensor {
        door: String,
        state: DoorState,
        alarm: Option<DoorAlarm>,
        at: Timestamp,
    },
    /// `door.flood` with its count, and `keypad_flood`.
    Flood {
        door: String,
        count: u64,
        at: Timestamp,
    },
    /// A keypad entry answered `Deny` undecided because the door's queue
    /// was full (the store is not keeping up): `door.denied`
    /// `storage_failure` and its alert.
    Undecided { door: String, at: Timestamp },
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
}

impl Recordable for Record {
    fn apply(&self, conn: &rusqlite::Connection) -> Result<(), crate::store::StoreError> {
        match self {
            Record::Unlock {
                door,
                key_id,
                confirmed,
                at,
            } => record_unlock(conn, door, key_id, *confirmed, *at).map(drop),
            Record::Sensor {
                door,
                state,
                alarm,
                at,
            } => record_sensor(conn, door, state, *alarm, *at),
            Record::Flood { door, count, at } => record_flood(conn, door, *count, *at).map(drop),
            Record::Undecided { door, at } => record_storage_failure(conn, door, *at).map(drop),
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
        }
    }

    fn what(&self) -> String {
        match self {
            Record::Unlock {
                door, confirmed, ..
            } => format!(
                "{} at door {door}",
                if *confirmed {
                    "door.unlocked"
                } else {
                    "door.unlock_unconfirmed"
                }
            ),
            Record::Sensor { door, alarm, .. } => format!("door {door} sensor ({alarm:?})"),
            Record::Flood { door, count, .. } => format!("door.flood x{count} at {door}"),
            Record::Undecided { door, .. } => format!("undecided entry at {door}"),
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
        Record::Unlock {
            door: "101".into(),
            key_id: "k".into(),
            confirmed: true,
            at: Timestamp(0),
        }
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
