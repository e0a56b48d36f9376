//! Marks the end-to-end tests that need root as ignored where they cannot
//! run: `cfg(sluice_unprivileged)` is set when this crate is built by a
//! user other than root, or with `SLUICE_SKIP_PRIVILEGED=1` in the
//! environment. The runner then counts those tests as ignored, with the
//! reason, instead of as passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(sluice_unprivileged)");
    println!("cargo::rerun-if-env-changed=SLUICE_SKIP_PRIVILEGED");
    println!("cargo::rerun-if-changed=build.rs");
    let skip = std::env::var("SLUICE_SKIP_PRIVILEGED").is_ok_and(|v| v == "1");
    if skip || !root() {
        println!("cargo::rustc-cfg=sluice_unprivileged");
    }
}

/// True when the effective user is root (the second field of `Uid:` in
/// /proc/self/status).
fn root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|u| u.split_whitespace().nth(1)).map(|e| e == "0"))
        .unwrap_or(false)
}
