//! Generates the DPDK bindings, compiles the C shim and links DPDK.
//!
//! DPDK is found with pkg-config (`libdpdk`, 22.11 or newer). When it is
//! missing the build stops with a message that says what to install.
//!
//! DPDK is linked statically by default, with the drivers in [`DRIVERS`]
//! (override with `SLUICE_DPDK_DRIVERS=net_null,net_ring,...`). Linked
//! against Debian's shared libraries (`SLUICE_DPDK_LINK=shared`), DPDK's EAL
//! loads every one of the ~150 driver plugins in its plugin directory at
//! start: a C program that only initializes two `net_null` ports is 25.8 MB
//! resident linked shared, 11.3 MB linked static with these drivers.
#![allow(clippy::expect_used)] // OUT_DIR is always set by cargo for build scripts.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const MIN_DPDK: &str = "22.11";

fn fail(msg: &str) -> ! {
    eprintln!("\nerror: {msg}\n");
    std::process::exit(1);
}

/// The drivers linked by default: the virtual devices Sluice's tests, demo
/// and benches use, and the NICs (and their SR-IOV virtual functions) of
/// the servers and clouds it runs on. Buses and the ring mempool first.
const DRIVERS: &[&str] = &[
    "bus_vdev", "bus_pci", "bus_auxiliary", "mempool_ring",
    // virtual devices
    "net_null", "net_ring", "net_af_packet", "net_af_xdp", "net_tap", "net_memif", "net_pcap", "net_vhost",
    // Intel (iavf is the VF of i40e and ice), Mellanox/NVIDIA, Broadcom
    "common_iavf", "net_iavf", "net_i40e", "net_ice", "net_ixgbe", "net_e1000", "net_igc",
    "common_mlx5", "net_mlx5", "net_bnxt",
    // virtual machines and clouds
    "net_virtio", "net_vmxnet3", "net_ena", "net_gve",
];

/// Runs `pkg-config ARGS libdpdk` and splits what it prints.
fn pkg_config(args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("libdpdk")
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run pkg-config ({e}); run scripts/setup.sh")));
    if !out.status.success() {
        fail(&format!("pkg-config {} libdpdk failed", args.join(" ")));
    }
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_owned).collect()
}

/// Links Debian's shared DPDK libraries; the EAL then loads every driver
/// plugin it finds at start.
fn link_shared(lib: &pkg_config::Library) {
    for dir in &lib.link_paths {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    for l in &lib.libs {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    // The ring PMD is a driver library, not part of libdpdk's link line; Sluice
    // uses its rte_eth_from_rings() to build in-memory ports for tests.
    println!("cargo:rustc-link-lib=dylib=rte_net_ring");
}

/// Links DPDK's static archives: the drivers whole (they register
/// themselves from constructors nothing else references), then the
/// libraries in pkg-config's order (each before those it uses), then the
/// system libraries they need (unused ones are dropped: rustc links with
/// `--as-needed`).
fn link_static() {
    let libdir = pkg_config(&["--variable=libdir"]).into_iter().next().unwrap_or_else(|| fail("pkg-config gave no libdir for libdpdk"));
    let libdir = PathBuf::from(libdir);
    let mut drivers: Vec<String> = match env::var("SLUICE_DPDK_DRIVERS") {
        Ok(list) if !list.trim().is_empty() => list.split(',').map(|d| d.trim().to_owned()).filter(|d| !d.is_empty()).collect(),
        _ => DRIVERS.iter().map(|d| (*d).to_owned()).collect(),
    };
    // Always linked, whatever the set: the ring mempool (mbuf pools use
    // it) and the ring PMD (Sluice calls its rte_eth_from_rings()).
    for needed in ["mempool_ring", "net_ring"] {
        if !drivers.iter().any(|d| d == needed) {
            drivers.push(needed.to_owned());
        }
    }
    for d in &drivers {
        let archive = libdir.join(format!("librte_{d}.a"));
        if !archive.is_file() {
            fail(&format!(
                "DPDK driver {d:?} has no static library {}: name drivers as DPDK does (net_null, bus_pci, ...) in SLUICE_DPDK_DRIVERS, or build with SLUICE_DPDK_LINK=shared",
                archive.display()
            ));
        }
    }
    println!("cargo:rustc-link-search=native={}", libdir.display());
    for d in &drivers {
        println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=rte_{d}");
    }
    let flags = pkg_config(&["--static", "--libs"]);
    let mut seen = std::collections::HashSet::new();
    for f in &flags {
        let Some(name) = f.strip_prefix("-l") else { continue };
        if name.starts_with(':') || !seen.insert(name.to_owned()) {
            continue;
        }
        if name.starts_with("rte_") {
            if libdir.join(format!("lib{name}.a")).is_file() {
                println!("cargo:rustc-link-lib=static:-bundle={name}");
            }
        } else if has_shared_lib(&libdir, name) {
            println!("cargo:rustc-link-lib=dylib={name}");
        }
    }
}

/// Whether the linker would find library `name` (its development link
/// `lib{name}.so` is installed, or a `lib{name}.a`). Libraries only the
/// drivers left out need (libsystemd for one, without its -dev package)
/// are skipped.
fn has_shared_lib(libdir: &std::path::Path, name: &str) -> bool {
    ["/lib/x86_64-linux-gnu", "/usr/lib", "/lib"]
        .iter()
        .map(PathBuf::from)
        .chain([libdir.to_owned()])
        .any(|d| d.join(format!("lib{name}.so")).exists() || d.join(format!("lib{name}.a")).exists())
}

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-changed=csrc/shim.h");
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    println!("cargo:rerun-if-env-changed=SLUICE_DPDK_LINK");
    println!("cargo:rerun-if-env-changed=SLUICE_DPDK_DRIVERS");

    let shared = match env::var("SLUICE_DPDK_LINK").as_deref() {
        Err(_) | Ok("" | "static") => false,
        Ok("shared") => true,
        Ok(other) => fail(&format!("SLUICE_DPDK_LINK is {other:?}: it takes `static` (the default) or `shared`")),
    };
    let lib = pkg_config::Config::new()
        .atleast_version(MIN_DPDK)
        // The link line is written below; this only checks the version.
        .cargo_metadata(false)
        .probe("libdpdk")
        .unwrap_or_else(|e| {
            fail(&format!(
                "DPDK >= {MIN_DPDK} was not found by pkg-config (libdpdk): {e}\n\
                 On Debian 12: run scripts/setup.sh (or `apt-get install dpdk-dev libdpdk-dev pkg-config libclang-dev`)."
            ))
        });
    println!("cargo:rustc-env=SLUICE_DPDK_VERSION={}", lib.version);

    let cflags = pkg_config(&["--cflags"]);

    // The shim first: its references to DPDK come before the libraries
    // that define them on the link line.
    let mut cc = cc::Build::new();
    cc.file("csrc/shim.c").include("csrc").opt_level(3).warnings(true);
    for f in &cflags {
        cc.flag(f);
    }
    cc.compile("sluice_shim");

    if shared {
        link_shared(&lib);
    } else {
        link_static();
    }

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
