//! The container image the Kubernetes manifests name (`sluice:<version>`),
//! built from the repository by `scripts/image.sh` with Debian's buildah:
//! the Debian package on a Debian 12 root with bird2, both tags the name
//! resolves to, the appliance as entry point running the packaged
//! configuration. The script itself runs the binaries in the image's root
//! (`sluice --version`, `sluice check` of the packaged configuration,
//! `sluice-controller --help`, `bird --version`) before it commits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use serde_json::Value;
use sluice_tests::topology::root;
use sluice_tests::{privileged, sluice_bin};

fn inspect(name: &str) -> Value {
    let out = Command::new("buildah").args(["inspect", "--type", "image", name]).output().unwrap();
    assert!(out.status.success(), "buildah inspect {name}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: buildah and chroot")]
fn the_image_the_manifests_name_is_built_from_the_package() {
    privileged();
    let version = env!("CARGO_PKG_VERSION");
    let bin_dir = sluice_bin().parent().unwrap().to_owned();
    let out = Command::new(root().join("scripts/image.sh")).env("BIN_DIR", &bin_dir).output().expect("scripts/image.sh");
    assert!(out.status.success(), "scripts/image.sh:\n{}", String::from_utf8_lossy(&out.stderr));
    let local = format!("localhost/sluice:{version}");
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), local);
    let image = inspect(&local);
    let config = &image["OCIv1"]["config"];
    assert_eq!(config["Entrypoint"], serde_json::json!(["/usr/bin/sluice"]), "{config}");
    assert_eq!(config["Cmd"], serde_json::json!(["run", "--config", "/etc/sluice/sluice.yaml"]), "{config}");
    let hub = inspect(&format!("docker.io/library/sluice:{version}"));
    assert_eq!(hub["FromImageID"], image["FromImageID"], "both names are the same image");
    for name in [local, format!("docker.io/library/sluice:{version}")] {
        let _ = Command::new("buildah").args(["rmi", &name]).output();
    }
}
