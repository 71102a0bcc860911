//! What earlier runs left: each reader's recorded identity, its raised
//! alerts, and the door states restored at start.

use super::*;

/// What earlier runs left about the readers, read once at start through
/// one connection (a read that fails leaves a reader `Unread`, so
/// quarantined until it can be read).
pub(super) struct Earlier {
    /// A reader missing here could not be read ([`Recorded::Unread`]).
    pub(super) known: HashMap<String, Recorded>,
    /// Readers whose `reader_link_fault` is still raised: a healthy
    /// channel ends it.
    pub(super) faulty: Vec<String>,
    /// Readers whose `reader_replaced` is still raised: quarantined until
    /// `lockhub osdp install`, whichever reader answers (osdp.md).
    pub(super) replaced: Vec<String>,
}

impl Earlier {
    pub(super) fn read<'a>(store: &Store, readers: impl Iterator<Item = &'a str>) -> Earlier {
        let mut earlier = Earlier {
            known: HashMap::new(),
            faulty: Vec::new(),
            replaced: Vec::new(),
        };
        let conn = match store.reader() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot read what earlier runs recorded about the readers");
                return earlier;
            }
        };
        for r in readers {
            match Recorded::read(&conn, r) {
                Ok(id) => {
                    earlier.known.insert(r.to_owned(), id);
                }
                Err(e) => {
                    tracing::error!(reader = %r, error = %e, "cannot read the reader's recorded identity");
                }
            }
        }
        let raised = |condition: Condition| {
            alerts::raised_subjects(&conn, condition).unwrap_or_else(|e| {
                tracing::error!(error = %e, ?condition, "cannot read the raised alerts");
                Vec::new()
            })
        };
        earlier.faulty = raised(Condition::ReaderLinkFault);
        earlier.replaced = raised(Condition::ReaderReplaced);
        earlier
    }
}

/// What the database holds as a reader's identity, the reference its PDID
/// is compared with (osdp.md, `reader_replaced`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Recorded {
    Identity(ReaderIdentity),
    /// Keyed by hand, never installed: its first authenticated identity
    /// becomes the reference.
    Nothing,
    /// The read failed. Until a read succeeds the reader is quarantined:
    /// it may be a stranger, and its identity must not become the
    /// reference.
    Unread,
}

impl Recorded {
    pub(super) fn read(conn: &rusqlite::Connection, reader: &str) -> Result<Recorded, StoreError> {
        Ok(db::identity(conn, reader)?.map_or(Recorded::Nothing, Recorded::Identity))
    }
}

impl BusTask {
    /// Each door's last reported state, as the previous run left it (read
    /// on a reader connection, so a stalled writer does not hold the bus).
    pub(super) async fn restore_doors(&mut self) {
        let names: Vec<String> = self
            .slots
            .iter()
            .filter_map(|s| s.door.as_ref().map(|d| d.name.clone()))
            .collect();
        let store = self.ctx.store.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let conn = store.reader()?;
            door_states(&conn, &names)
        })
        .await;
        match loaded {
            Ok(Ok(states)) => {
                let (now_ms, now) = (self.ms(), (self.now)());
                for (name, state) in states {
                    if let Some(s) = self
                        .slots
                        .iter_mut()
                        .find(|s| s.door.as_ref().is_some_and(|d| d.name == name))
                    {
                        s.watch = DoorWatch::restore(state, now_ms, now);
                    }
                }
            }
            Ok(Err(e)) => {
                tracing::error!(bus = %self.name, error = %e, "cannot read the doors' last states")
            }
            Err(e) => {
                tracing::error!(bus = %self.name, error = %e, "cannot read the doors' last states")
            }
        }
    }
}
