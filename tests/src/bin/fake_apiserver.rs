//! `sluice-fake-apiserver`: the fake Kubernetes API server of
//! `sluice_tests::fake_apiserver`, serving the objects of a directory of
//! manifests and following its edits (read again every 300 ms), so that an
//! end-to-end test can run it (in a network namespace, say) and move the
//! appliance by editing files. Only what came from the directory is
//! deleted when its file goes: what clients wrote stays. The Namespaces
//! `default` and `--namespace` exist from the start (others come from
//! Namespace manifests of the directory); an object of the directory in a
//! namespace that does not exist is refused, as the API server refuses it.
//!
//! ```text
//! sluice-fake-apiserver --dir DIR [--namespace NS] [--listen 127.0.0.1:0] [--kubeconfig-out FILE]
//! ```
//! Prints `listening on http://ADDR` once serving; writes a kubeconfig
//! that reaches it when asked. Stops on SIGINT or SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sluice_tests::fake_apiserver::{read_manifests, sync_objects, FakeApi, Synced};

fn usage() -> ! {
    eprintln!("usage: sluice-fake-apiserver --dir DIR [--namespace NS] [--listen ADDR] [--kubeconfig-out FILE]");
    std::process::exit(2);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (mut dir, mut ns, mut listen, mut kubeconfig) = (None, "default".to_owned(), "127.0.0.1:0".to_owned(), None);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--dir" => dir = Some(PathBuf::from(value())),
            "--namespace" => ns = value(),
            "--listen" => listen = value(),
            "--kubeconfig-out" => kubeconfig = Some(PathBuf::from(value())),
            _ => usage(),
        }
    }
    let Some(dir) = dir else { usage() };
    let addr: SocketAddr = listen.parse().unwrap_or_else(|e| panic!("--listen {listen}: {e}"));
    let api = FakeApi::start_on(addr).await;
    for name in ["default", ns.as_str()] {
        api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}));
    }
    let mut synced = Synced::new();
    let mut last_error = String::new();
    let mut sync = |synced: &mut Synced| {
        let e = match read_manifests(&dir, &ns) {
            Ok(objs) => sync_objects(&api, &objs, synced).join("\n"),
            Err(e) => e,
        };
        if e != last_error && !e.is_empty() {
            eprintln!("{e}");
        }
        last_error = e;
    };
    sync(&mut synced);
    if let Some(path) = kubeconfig {
        std::fs::write(&path, api.kubeconfig(&ns)).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
    println!("listening on {}", api.url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let mut tick = tokio::time::interval(Duration::from_millis(300));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = tick.tick() => sync(&mut synced),
        }
    }
}
