//! `lockhub run`: the daemon's lifetime in one function.
//!
//! Open the store, start the sync layer, the serial tasks and the OSDP buses, wait for
//! shutdown, then stop in the reverse order: the doors first, then the
//! offline status is published and the connection closed cleanly, and the store's
//! writer finishes its queue and is joined, so the database is closed.

use crate::clock::SharedClock;
use crate::config::Config;
use crate::drivers::osdp::{self, bus::settings::OsdpSettings};
use crate::drivers::serial::{self, SerialSettings};
use crate::runtime::maintenance::Maintenance;
use crate::runtime::notify;
use crate::store::{Priority, Store, error::StoreError, floor};
use crate::sync::{self, SyncError, SyncSettings, decide};
use std::future::Future;
use std::sync::Arc;

/// How long systemd should wait for a start that migrates the database.
const MIGRATION_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The daemon boundary's errors: all of them stop it at start-up.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Sync(#[from] SyncError),
}

/// Runs the hub until `shutdown` resolves, then stops cleanly.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
    // Migrations run before any door is served, and a step that rebuilds a
    // table copies it whole (seconds for 100,000 keys, far longer for a
    // million on an SD card): systemd is asked to wait past the unit's
    // `TimeoutStartSec` rather than kill the daemon halfway (which would
    // roll the step back and start it over at every restart).
    let migrating = crate::store::migration_pending(&config.database_path());
    if migrating {
        let _ = notify::extend_timeout(MIGRATION_START_TIMEOUT);
        let _ = notify::status("migrating the database; doors are served once it is done");
    }
    let store = Store::open(&config.database_path(), &config.policy)?;
    tracing::info!(
        hub_id = %config.hub.hub_id,
        site_id = %config.hub.site_id,
        db = %store.path().display(),
        "lockhub starting"
    );
    let reader = store.reader()?;
    let seq = decide::initial_seq(&reader)?;
    // A crash between a guest erasure and its WAL scrub left its result held.
    let erasure_unscrubbed = crate::store::outbox::held(&reader)? > 0;
    // The effective clock starts from the durable floor: a hub that boots
    // with its clock at 1970 still knows roughly when it is.
    let clock = SharedClock::start(floor::load(&reader)?);
    drop(reader);
    let decider = Arc::new(decide::HubDecider::new(
        &config,
        store.clone(),
        clock.clone(),
    ));
    if erasure_unscrubbed {
        tokio::spawn(decide::scrub_until_done(store.clone()));
    }
    let sync = match sync::start(
        SyncSettings::from_config(&config),
        store.clone(),
        decider,
        seq,
        clock.clone(),
    ) {
        Ok(s) => s,
        Err(e) => {
            store.close();
            return Err(e.into());
        }
    };

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let maintenance = Maintenance {
        store: store.clone(),
        clock: clock.clone(),
        policy: config.policy,
        trust_ring: config.trust.clone(),
        outbox_wake: sync.outbox_notify(),
        configured: Arc::new(crate::runtime::maintenance::Configured::of(&config)),
    };
    // Before the doors start: what an earlier config left raised ends
    // first, so no driver's alert of this run can be taken for it.
    let configured_done = match maintenance.end_unconfigured().await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot end the alerts of an earlier config yet; housekeeping tries again");
            false
        }
    };
    let housekeeping = tokio::spawn(maintenance.run(stop_rx, configured_done));
    // A crash between a grant's commit and the board's answer left the
    // grant with no outcome: settled before any door is served.
    let at = clock.now();
    match store
        .write(Priority::Bulk, move |c| {
            crate::store::door::settle_open_grants(c, at)
        })
        .await
    {
        Ok(0) => {}
        Ok(n) => {
            tracing::warn!(
                grants = n,
                "grants left without an outcome by the last run recorded unconfirmed"
            );
            sync.outbox_notify().notify_one();
        }
        Err(e) => tracing::error!(error = %e, "cannot settle the grants the last run left open"),
    }
    // The doors decide by the same effective clock (mqtt.md 'Time').
    let now: serial::TimeSource = {
        let clock = clock.clone();
        Arc::new(move || clock.now())
    };
    // A door whose PIN a reader takes and whose strike is on a board: the
    // OSDP driver hands its grants to the serial driver's port.
    let (serial, board_unlocks) = serial::spawn_with_unlocks(
        SerialSettings::from_config(&config),
        store.clone(),
        now.clone(),
        Some(sync.outbox_notify()),
    );
    let readers = osdp::bus::spawn(
        OsdpSettings::from_config(&config),
        store.clone(),
        now,
        Some(sync.outbox_notify()),
        &board_unlocks,
    );

    // Serving doors now: systemd may consider the hub started.
    if let Err(e) = notify::ready() {
        tracing::warn!(error = %e, "cannot notify systemd that the hub is ready");
    }
    if migrating {
        let _ = notify::status("serving doors");
    }
    let watchdog =
        notify::watchdog_interval().map(|every| tokio::spawn(watchdog(store.clone(), every)));

    shutdown.await;
    tracing::info!("lockhub stopping");
    let _ = notify::stopping();
    if let Some(w) = watchdog {
        w.abort();
    }
    // Doors first: no decision is taken while the cloud link closes.
    readers.shutdown().await;
    serial.shutdown().await;
    let _ = stop_tx.send(true);
    let _ = housekeeping.await;
    sync.shutdown().await;
    store.close();
    tracing::info!("lockhub stopped");
    Ok(())
}

/// Pets systemd's watchdog only while the writer thread answers: a wedged
/// writer (no door can be audited, so none can open) becomes a restart
/// rather than a silent hub. A writer that answers with an error (a full
/// disk, another process holding the write lock) is not wedged: a restart
/// would not mend the storage, and would lose the denials kept in memory
/// until they can be written (`store::door::StorageFailures`).
async fn watchdog(store: Store, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let alive =
            tokio::time::timeout(every, store.write(crate::store::Priority::Bulk, |_| Ok(())))
                .await;
        match alive {
            Ok(Ok(())) => {
                let _ = notify::watchdog();
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the store's writer answers, with an error");
                let _ = notify::watchdog();
            }
            Err(_) => tracing::error!(
                "the store's writer did not answer in time; withholding the watchdog"
            ),
        }
    }
}
