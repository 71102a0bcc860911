//! The project's copy of the test vectors (`spec/vectors/`) against the
//! owners' folder beside a checkout (`../shared/spec/vectors/`).
//!
//! Every other test reads the in-tree copy, so a clone with nothing beside
//! it passes on its own. This is the one place that looks at the owners'
//! folder: where it exists (CI has it), the two trees must hold the same
//! files with the same bytes, so a vector the owners change or add cannot
//! go unnoticed. Where it is absent, the test says so on stderr, outside
//! the test harness's capture, and passes.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

const IN_TREE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/spec/vectors");
const OWNERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/spec/vectors");

/// Every regular file under `root`, by its path relative to `root`.
fn files(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.insert(path.strip_prefix(root).unwrap().to_path_buf(), bytes);
            }
        }
    }
    out
}

/// The names of the files that are missing from one side, extra on it, or
/// differ, as lines a person can act on.
fn differences(
    ours: &BTreeMap<PathBuf, Vec<u8>>,
    owners: &BTreeMap<PathBuf, Vec<u8>>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (path, bytes) in owners {
        match ours.get(path) {
            None => out.push(format!("missing in spec/vectors: {}", path.display())),
            Some(b) if b != bytes => {
                out.push(format!("differs from the owners': {}", path.display()))
            }
            Some(_) => {}
        }
    }
    for path in ours.keys().filter(|p| !owners.contains_key(*p)) {
        out.push(format!("not in the owners' folder: {}", path.display()));
    }
    out
}

#[test]
fn in_tree_vectors_equal_the_owners_byte_for_byte() {
    let owners_dir = Path::new(OWNERS);
    if !owners_dir.is_dir() {
        let _ = writeln!(
            std::io::stderr(),
            "vectors cross-check skipped: no owners' folder at {OWNERS}"
        );
        return;
    }
    let ours = files(Path::new(IN_TREE));
    let owners = files(owners_dir);
    assert!(!owners.is_empty(), "the owners' folder {OWNERS} is empty");
    let diff = differences(&ours, &owners);
    assert!(
        diff.is_empty(),
        "spec/vectors is not a copy of the owners' vectors; copy them again:\n  {}",
        diff.join("\n  ")
    );
}

#[test]
fn a_changed_missing_or_extra_file_is_named() {
    let a = BTreeMap::from([
        (PathBuf::from("same"), b"x".to_vec()),
        (PathBuf::from("changed"), b"1".to_vec()),
        (PathBuf::from("only-ours"), b"o".to_vec()),
    ]);
    let b = BTreeMap::from([
        (PathBuf::from("same"), b"x".to_vec()),
        (PathBuf::from("changed"), b"2".to_vec()),
        (PathBuf::from("only-theirs"), b"t".to_vec()),
    ]);
    assert_eq!(
        differences(&a, &b),
        vec![
            "differs from the owners': changed".to_owned(),
            "missing in spec/vectors: only-theirs".to_owned(),
            "not in the owners' folder: only-ours".to_owned(),
        ]
    );
    assert!(differences(&a, &a).is_empty());
}
