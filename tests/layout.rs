//! House rules that a test can check: the keyword that allows raw-pointer
//! code appears only in `ffi/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

#[test]
fn unsafe_lives_only_in_ffi() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for top in ["dataplane", "control", "bench", "tests", "fuzz"] {
        let d = root.join(top);
        if d.is_dir() {
            rust_files(&d, &mut files);
        }
    }
    assert!(files.len() > 3, "found the sources");
    let word = ["un", "safe"].concat();
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines().any(|l| {
                let code = l.split("//").next().unwrap_or("");
                code.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == word)
            })
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "`{word}` outside ffi/: {offenders:?}");
}
