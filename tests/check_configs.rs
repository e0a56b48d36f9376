//! `sluice check` rejects each broken configuration of `tests/bad-configs`
//! with exactly the one problem its first line expects (`# expect: ...`,
//! the line as printed, files relative to `tests/bad-configs`), exits 1,
//! refuses hostile input too large to keep as a fixture (made here, in a
//! temporary directory), and accepts every example in `configs/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::sluice_bin;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// Longest a check may run before the test calls it hung (a guard against
/// hangs, not a performance claim).
const HUNG: Duration = Duration::from_secs(120);

/// Runs `sluice check --config <config>` in `dir`: exit code, the problems
/// (the `error: ` lines, without the prefix), all of stderr.
fn check(dir: &Path, config: &str) -> (Option<i32>, Vec<String>, String) {
    let mut child = Command::new(sluice_bin())
        .current_dir(dir)
        .args(["check", "--config", config])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).unwrap();
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > HUNG {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("sluice check --config {config} (in {}) still running after {HUNG:?}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = reader.join().unwrap();
    let problems = stderr.lines().filter_map(|l| l.strip_prefix("error: ")).map(str::to_owned).collect();
    (status.code(), problems, stderr)
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
    assert!(files.len() >= 29, "the fixtures are there");
    let mut failures = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let want = text.lines().next().and_then(|l| l.strip_prefix("# expect: ")).expect("first line: # expect: ...");
        let name = f.file_name().unwrap().to_str().unwrap();
        let (code, problems, stderr) = check(&dir, name);
        if code != Some(1) || problems != [want] {
            failures.push(format!("{name}: exit {code:?}, wanted exactly\n  {want}\nin:\n{stderr}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A temporary directory, removed on drop (also when the test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("sluice-check-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MACHINE: &str = "dpdk: {lcores: \"0,1\"}\nports:\n  - {name: front, device: net_null0}\n";

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: Gateway\nmetadata: {name: g}\n";

fn write(dir: &Path, name: &str, text: &str) {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn expect_one(dir: &Path, config: &str, want: &str) {
    let (code, problems, stderr) = check(dir, config);
    assert_eq!(code, Some(1), "{config}: {stderr}");
    assert_eq!(problems, [want], "{config}: {stderr}");
}

#[test]
fn hostile_input_is_refused() {
    let t = TempDir::new("hostile");
    let d = t.0.as_path();

    // A configuration file beyond 16 MiB (valid YAML: a long comment).
    let big = format!("{MACHINE}# {}\n", "x".repeat(16 << 20));
    write(d, "too-large.yaml", &big);
    expect_one(d, "too-large.yaml", "too-large.yaml: larger than 16 MiB: refused");

    // A manifest file beyond 16 MiB.
    write(d, "big/gateway.yaml", GATEWAY);
    write(d, "big/padding.yaml", &big);
    write(d, "big.yaml", &format!("{MACHINE}manifests: {{directory: big, gateway: g}}\n"));
    expect_one(d, "big.yaml", "big/padding.yaml: larger than 16 MiB: refused");

    // More than 1000 manifest files.
    for i in 0..1001 {
        write(d, &format!("files/m{i:04}.yaml"), "{}\n");
    }
    write(d, "files.yaml", &format!("{MACHINE}manifests: {{directory: files, gateway: g}}\n"));
    expect_one(d, "files.yaml", "files: more than 1000 manifest files: refused");

    // More than 10000 documents, across files.
    write(d, "docs/a.yaml", &format!("{GATEWAY}{}", "---\n{}\n".repeat(5000)));
    write(d, "docs/b.yaml", &"---\n{}\n".repeat(5001));
    write(d, "docs.yaml", &format!("{MACHINE}manifests: {{directory: docs, gateway: g}}\n"));
    expect_one(d, "docs.yaml", "docs/b.yaml:9999:1: [doc 4999]: more than 10000 YAML documents: refused");

    // More than 2^20 values: 14 come before the list's elements (the root,
    // 11 in MACHINE, the key x and the list), so element 2^20 - 14, at
    // column 5 + 2 x (2^20 - 14), is one too many.
    write(d, "values.yaml", &format!("{MACHINE}x: [{}]\n", "0,".repeat(1 << 20)));
    expect_one(d, "values.yaml", &format!("values.yaml:4:{}: more than 1048576 values: refused", 5 + 2 * ((1 << 20) - 14)));
}

#[test]
fn the_example_configurations_are_valid() {
    for name in ["configs/demo.yaml", "configs/manifests.yaml", "configs/xds.yaml"] {
        let out = Command::new(sluice_bin()).args(["check", "--config"]).arg(root().join(name)).output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains(": ok: "));
    }
}
