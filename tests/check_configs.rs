//! `sluice check` rejects each broken configuration of `tests/bad-configs`
//! with the message its first line expects (`# expect: ...`), exits 1, and
//! accepts every example in `configs/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use sluice_tests::sluice_bin;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

#[test]
fn broken_configurations_are_rejected_with_their_reason() {
    let dir = root().join("tests/bad-configs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 15, "the fixtures are there");
    let mut failures = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let want = text.lines().next().and_then(|l| l.strip_prefix("# expect: ")).expect("first line: # expect: ...");
        let out = Command::new(sluice_bin()).args(["check", "--config"]).arg(f).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(1) || !stderr.contains(want) {
            failures.push(format!("{}: exit {:?}, wanted {want:?} in:\n{stderr}", f.display(), out.status.code()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_example_configurations_are_valid() {
    for name in ["configs/demo.yaml", "configs/manifests.yaml"] {
        let out = Command::new(sluice_bin()).args(["check", "--config"]).arg(root().join(name)).output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains(": ok: "));
    }
}
