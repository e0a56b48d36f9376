//! Generates the DPDK bindings and compiles the C shim.
//!
//! DPDK is found with pkg-config (`libdpdk`, 22.11 or newer). When it is
//! missing the build stops with a message that says what to install.
#![allow(clippy::expect_used)] // OUT_DIR is always set by cargo for build scripts.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const MIN_DPDK: &str = "22.11";

fn fail(msg: &str) -> ! {
    eprintln!("\nerror: {msg}\n");
    std::process::exit(1);
}

fn pkg_config_cflags() -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(["--cflags", "libdpdk"])
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run pkg-config ({e}); install it with `apt-get install pkg-config` or run scripts/setup.sh")));
    if !out.status.success() {
        fail("pkg-config --cflags libdpdk failed");
    }
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-changed=csrc/shim.h");
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let lib = pkg_config::Config::new()
        .atleast_version(MIN_DPDK)
        .probe("libdpdk")
        .unwrap_or_else(|e| {
            fail(&format!(
                "DPDK >= {MIN_DPDK} was not found by pkg-config (libdpdk): {e}\n\
                 On Debian 12: run scripts/setup.sh (or `apt-get install dpdk-dev libdpdk-dev pkg-config libclang-dev`)."
            ))
        });
    // The ring PMD is a driver library, not part of libdpdk's link line; Sluice
    // uses its rte_eth_from_rings() to build in-memory ports for tests.
    println!("cargo:rustc-link-lib=dylib=rte_net_ring");
    println!("cargo:rustc-env=SLUICE_DPDK_VERSION={}", lib.version);

    let cflags = pkg_config_cflags();

    let mut cc = cc::Build::new();
    cc.file("csrc/shim.c").include("csrc").opt_level(3).warnings(true);
    for f in &cflags {
        cc.flag(f);
    }
    cc.compile("sluice_shim");

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bindings = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        .clang_args(cflags.iter().map(String::as_str))
        .clang_arg("-Icsrc")
        .allowlist_function("rte_.*|sluice_.*")
        .allowlist_type("rte_.*")
        .allowlist_var("RTE_.*")
        .opaque_type("rte_arp_hdr")
        .opaque_type("rte_arp_ipv4")
        .opaque_type("rte_gtp_psc_generic_hdr")
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .clang_macro_fallback()
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| {
            fail(&format!(
                "bindgen could not read the DPDK headers: {e}\nIs libclang-dev installed? (scripts/setup.sh)"
            ))
        });
    bindings
        .write_to_file(out.join("bindings.rs"))
        .unwrap_or_else(|e| fail(&format!("cannot write bindings: {e}")));
}
