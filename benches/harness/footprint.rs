//! Footprint: the daemon's binary size (and, with the daemon, its memory and
//! its time to come online).

use super::broker::{BrokerSettings, Mosquitto};
use super::daemon::Daemon;
use super::report::Figure;
use super::stats::{median, mib, thousands};
use super::{Sizes, fixture, mqtt};
use std::path::Path;
use std::time::Duration;
use testkit::lockhub_bin;

pub const IDS: &[&str] = &[
    "footprint.binary",
    "footprint.binary_stripped",
    "footprint.start_to_online",
    "footprint.rss_idle",
];

/// How long the daemon idles before its RSS is read: past start-up work.
const SETTLE: Duration = Duration::from_secs(3);

const S: &str = "footprint";

pub async fn run(sizes: &Sizes) -> Vec<Figure> {
    let bin = lockhub_bin();
    let size = std::fs::metadata(bin).map(|m| m.len()).unwrap_or(0) as f64;
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("lockhub");
    std::fs::copy(bin, &copy).expect("copy the binary");
    let stripped = std::process::Command::new("strip")
        .arg(&copy)
        .status()
        .ok()
        .filter(|s| s.success())
        .and_then(|_| std::fs::metadata(&copy).ok())
        .map_or(f64::NAN, |m| m.len() as f64);
    let (online_ms, idle_rss) = online_and_idle(sizes).await;
    vec![
        Figure::new(
            "footprint.start_to_online",
            S,
            &format!(
                "`lockhub run` spawned → retained `online` status received, {} keys in the mirror",
                thousands(sizes.door_keys as f64)
            ),
            format!("{online_ms:.0} ms"),
        ),
        Figure::new(
            "footprint.rss_idle",
            S,
            &format!(
                "`lockhub run` RSS (VmRSS) idle, {} s after online, {} keys in the mirror",
                SETTLE.as_secs(),
                thousands(sizes.door_keys as f64)
            ),
            mib(idle_rss),
        )
        .target("< 30 MiB", idle_rss < 30.0 * 1024.0 * 1024.0),
        Figure::new(
            "footprint.binary",
            S,
            "`lockhub` binary as built (`[profile.release]`: thin LTO, `strip = \"debuginfo\"`)",
            mib(size),
        ),
        Figure::new(
            "footprint.binary_stripped",
            S,
            "`lockhub` binary after `strip` (what an image would ship)",
            mib(stripped),
        ),
    ]
}

/// Start → online and idle RSS, median of `runs` fresh starts against a
/// mirror pre-filled with `door_keys` keys.
async fn online_and_idle(sizes: &Sizes) -> (f64, f64) {
    let (mut online, mut rss) = (vec![], vec![]);
    for _ in 0..sizes.runs {
        let broker = Mosquitto::start_with(BrokerSettings::default_window(1000));
        let mut daemon = Daemon::start(
            &broker.url(),
            Path::new("/dev/null"),
            fixture::NO_LOCKOUT_POLICY,
            sizes.door_keys,
        )
        .await;
        let at = mqtt::wait_online(broker.port, Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("the daemon never came online: {}", daemon.log()));
        online.push((at - daemon.started).as_secs_f64() * 1000.0);
        tokio::time::sleep(SETTLE).await;
        rss.push(daemon.memory().map_or(f64::NAN, |(rss, _)| rss as f64));
        daemon.stop();
    }
    (median(&online), median(&rss))
}
