//! The fixture matrices' loader (`tests/*_fixtures.rs`): every `*.json` of a
//! folder under `tests/fixtures/`, by name, parsed.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::Path;

/// `(file name, document)` for every fixture in `tests/fixtures/<dir>`, in
/// name order; there must be at least `at_least` of them.
pub(crate) fn load(dir: &str, at_least: usize) -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(paths.len() >= at_least, "only {} fixtures", paths.len());
    paths
        .iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let doc = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, doc)
        })
        .collect()
}
