//! Footprint: the daemon's binary size (and, with the daemon, its memory and
//! its time to come online).

use super::Sizes;
use super::report::Figure;
use super::stats::mib;
use std::path::Path;

pub const IDS: &[&str] = &["footprint.binary", "footprint.binary_stripped"];

const S: &str = "footprint";

/// The `lockhub` binary Cargo built alongside this harness (release under
/// `cargo bench`, debug under `cargo test`).
pub fn lockhub_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lockhub"))
}

pub async fn run(_sizes: &Sizes) -> Vec<Figure> {
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
    vec![
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
