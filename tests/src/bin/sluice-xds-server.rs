//! `sluice-xds-server`: the test xDS management server as a program, to
//! drive appliances by hand or from scripts (inside a network namespace,
//! say). It serves the resources of one YAML or JSON file over ADS, state
//! of the world and delta on the same port, and reads the file again when
//! it changes (a new version for the nodes whose snapshot changed).
//!
//! ```text
//! sluice-xds-server --listen 127.0.0.1:18000 --file resources.yaml \
//!     [--tls-cert server.crt --tls-key server.key [--client-ca ca.crt]] \
//!     [--push-order clusters-first|assignments-first] [--resend-nacked] \
//!     [--events events.jsonl]
//! ```
//!
//! `--push-order` is the order in which the types go out after a change
//! (clusters first by default); `--resend-nacked` answers a state-of-the-world
//! NACK with the refused version again at once, as go-control-plane v0.11 does.
//! `--events` writes each request received and response sent to a file, a
//! JSON object a line, as it happens (`{"event": "request"|"response",
//! "stream", "delta", "node", "type_url", "version", "nonce", "kind":
//! "initial"|"ack"|"nack"|"other", "stale", "initial_versions"}`): what a
//! test waits for when the server answers a request with nothing.
//!
//! The file: `{version, clusters: [...], assignments: [...], nodes: {<node
//! id>: {version, clusters, assignments}}}`, resources in Envoy's JSON
//! field names (see `sluice_tests::xds_server::cluster` and `assignment`).
//! As with go-control-plane, state-of-the-world clients are sent a change
//! only when `version` changes: bump it with every edit (delta clients
//! get changed resources whatever the version says).
//! It prints `listening on <address>` once ready; SIGINT or SIGTERM stop it.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;
use sluice_tests::xds_server::{document, Event, RequestKind, ServerTls, Snapshot, XdsServer, CLA_TYPE, CLUSTER_TYPE};

const USAGE: &str = "usage: sluice-xds-server --listen ADDR:PORT --file RESOURCES.yaml [--tls-cert CRT --tls-key KEY [--client-ca CA]] [--push-order clusters-first|assignments-first] [--resend-nacked] [--events FILE]";

struct Args {
    listen: SocketAddr,
    file: PathBuf,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    assignments_first: bool,
    resend_nacked: bool,
    events: Option<PathBuf>,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut listen, mut file, mut cert, mut key, mut client_ca, mut events) = (None, None, None, None, None, None);
    let (mut assignments_first, mut resend_nacked) = (false, false);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--listen" => listen = Some(val()?.parse::<SocketAddr>().map_err(|e| format!("--listen: {e}"))?),
            "--file" => file = Some(PathBuf::from(val()?)),
            "--tls-cert" => cert = Some(PathBuf::from(val()?)),
            "--tls-key" => key = Some(PathBuf::from(val()?)),
            "--client-ca" => client_ca = Some(PathBuf::from(val()?)),
            "--push-order" => {
                assignments_first = match val()?.as_str() {
                    "clusters-first" => false,
                    "assignments-first" => true,
                    other => return Err(format!("--push-order: {other:?} is not clusters-first or assignments-first")),
                }
            }
            "--resend-nacked" => resend_nacked = true,
            "--events" => events = Some(PathBuf::from(val()?)),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or_else(|| format!("--listen is required\n{USAGE}"))?,
        file: file.ok_or_else(|| format!("--file is required\n{USAGE}"))?,
        cert,
        key,
        client_ca,
        assignments_first,
        resend_nacked,
        events,
    })
}

/// One line of the `--events` file.
fn event_line(e: &Event) -> serde_json::Value {
    match e {
        Event::Request(r) => {
            let kind = match r.kind {
                RequestKind::Initial => "initial",
                RequestKind::Ack => "ack",
                RequestKind::Nack(_) => "nack",
                RequestKind::Other => "other",
            };
            json!({
                "event": "request", "stream": r.stream, "delta": r.delta, "node": r.node, "type_url": r.type_url,
                "version": r.version_info, "nonce": r.nonce, "kind": kind, "stale": r.stale,
                "initial_versions": r.initial_versions.len(),
            })
        }
        Event::Response(s) => json!({
            "event": "response", "stream": s.stream, "type_url": s.type_url, "version": s.version, "nonce": s.nonce,
            "resources": s.names.len(), "removed": s.removed.len(),
        }),
    }
}

/// The file as JSON (compared to see changes) and its snapshots.
fn load(path: &PathBuf) -> Result<(serde_json::Value, std::collections::BTreeMap<String, Snapshot>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc = document(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let snaps = Snapshot::from_document(&doc).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((doc, snaps))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let tls = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => {
            let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
            match (read(c), read(k), a.client_ca.as_ref().map(read).transpose()) {
                (Ok(cert_pem), Ok(key_pem), Ok(client_ca_pem)) => Some(ServerTls { cert_pem, key_pem, client_ca_pem }),
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            }
        }
        (None, None) if a.client_ca.is_none() => None,
        _ => {
            eprintln!("--tls-cert and --tls-key go together (and --client-ca needs them)");
            return ExitCode::from(2);
        }
    };
    let server = XdsServer::new();
    if a.assignments_first {
        server.set_push_order(&[CLA_TYPE, CLUSTER_TYPE]);
    }
    server.set_resend_nacked(a.resend_nacked);
    // Watched before anything is served, so that no event is missed.
    let (mut events_file, mut events) = match &a.events {
        Some(p) => match std::fs::File::create(p) {
            Ok(f) => (Some(f), Some(server.events())),
            Err(e) => {
                eprintln!("{}: {e}", p.display());
                return ExitCode::from(2);
            }
        },
        None => (None, None),
    };
    let mut last = match load(&a.file) {
        Ok((doc, snaps)) => {
            server.set_all(snaps);
            doc
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let running = match server.serve(a.listen, tls).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", a.listen);
            return ExitCode::from(1);
        }
    };
    println!("listening on {}", running.addr);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    let mut poll = tokio::time::interval(Duration::from_millis(300));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            Some(e) = async { events.as_mut()?.recv().await } => {
                if let Some(f) = events_file.as_mut() {
                    if let Err(err) = f.write_all(format!("{}\n", event_line(&e)).as_bytes()) {
                        eprintln!("--events: {err}");
                        return ExitCode::from(1);
                    }
                }
            }
            _ = poll.tick() => match load(&a.file) {
                Ok((doc, snaps)) if doc != last => {
                    eprintln!("{}: changed, serving it", a.file.display());
                    server.set_all(snaps);
                    last = doc;
                }
                Ok(_) => {}
                Err(e) => eprintln!("{e} (still serving the previous content)"),
            },
        }
    }
    running.stop().await;
    ExitCode::SUCCESS
}
