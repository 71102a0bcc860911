//! `lockhub run`: the daemon's lifetime in one function.
//!
//! Open the store, start the sync layer and the serial tasks, wait for
//! shutdown, then stop in the reverse order: the doors first, then the
//! offline status is published and the connection closed cleanly, and the store's
//! writer finishes its queue and is joined, so the database is closed.

use crate::clock::LiveClock;
use crate::config::Config;
use crate::serial::{self, SerialSettings};
use crate::store::{Store, StoreError, floor};
use crate::sync::{self, SyncError, SyncSettings, decide};
use std::future::Future;
use std::sync::{Arc, Mutex};

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
    let store = Store::open(&config.database_path(), &config.policy)?;
    tracing::info!(
        hub_id = %config.hub.hub_id,
        site_id = %config.hub.site_id,
        db = %store.path().display(),
        "lockhub starting"
    );
    // The doors decide by the effective time (mqtt.md 'Time'), never the
    // raw system clock.
    let clock = Arc::new(Mutex::new(LiveClock::start(floor::load(&store.reader()?)?)));
    let now: serial::TimeSource = Arc::new(move || match clock.lock() {
        Ok(mut c) => c.now(),
        Err(poisoned) => poisoned.into_inner().now(),
    });
    let seq = decide::initial_seq(&store.reader()?)?;
    let decider = Arc::new(decide::HubDecider::new(&config, store.clone()));
    let sync = match sync::start(
        SyncSettings::from_config(&config),
        store.clone(),
        decider,
        seq,
    ) {
        Ok(s) => s,
        Err(e) => {
            store.close();
            return Err(e.into());
        }
    };

    let serial = serial::spawn(
        SerialSettings::from_config(&config),
        store.clone(),
        now,
        Some(sync.outbox_notify()),
    );

    shutdown.await;
    tracing::info!("lockhub stopping");
    // Doors first: no decision is taken while the cloud link closes.
    serial.shutdown().await;
    sync.shutdown().await;
    store.close();
    tracing::info!("lockhub stopped");
    Ok(())
}
