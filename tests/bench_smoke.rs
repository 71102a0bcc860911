//! The benchmark harness in smoke mode: tiny sizes, a few seconds, against
//! the same real broker, binary and ptys. It checks that every figure of
//! every scenario is produced and has a value, and nothing about speed
//! (speed is measured by `cargo bench --bench lockhub`, never asserted).
//! `harness` is the same library `benches/lockhub.rs` runs.

#[test]
fn the_smoke_run_produces_every_figure_of_every_scenario() {
    let opts = harness::Options::parse(["--smoke".to_owned()]).expect("options");
    assert!(
        opts.write.is_none(),
        "a smoke run never touches BENCHMARKS.md"
    );
    let figures = harness::run(&opts);
    for scenario in harness::SCENARIOS {
        for id in harness::expected_ids(scenario) {
            let f = figures
                .iter()
                .find(|f| f.id == *id)
                .unwrap_or_else(|| panic!("{scenario} did not produce {id}"));
            assert!(
                !f.value.is_empty() && !f.value.contains("NaN") && !f.value.contains("inf"),
                "{id} has no value: {:?}",
                f.value
            );
        }
    }
    let mut ids: Vec<&str> = figures.iter().map(|f| f.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), figures.len(), "figure ids are unique");
}

#[test]
fn the_figures_table_keeps_rows_it_did_not_measure() {
    use harness::report::{Figure, update_file};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("BENCHMARKS.md");
    let a = Figure::new("a.x", "ingest", "first", "1/s".into());
    let b = Figure::new("b.y", "resync", "second", "2 s".into()).target("< 30 s", true);
    update_file(&path, &[a, b], "stamp-1", harness::SKELETON).unwrap();
    let a2 = Figure::new("a.x", "ingest", "first", "3/s".into());
    update_file(&path, &[a2], "stamp-2", harness::SKELETON).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("| `a.x` | first | 3/s |"), "{text}");
    assert!(!text.contains("| 1/s |"), "{text}");
    assert!(
        text.contains("| `b.y` | second | 2 s | < 30 s | yes |"),
        "{text}"
    );
    assert!(text.contains("--only resync"), "{text}");
    assert!(text.starts_with("# lockhub benchmarks"), "{text}");
}
