//! The configuration file as a source: read again when it or a manifest
//! changes (inotify on their directories, with a slow poll as a safety net
//! for filesystems without events) or on SIGHUP, and sent to the
//! reconciler as one transaction. A file that cannot be read or checked is
//! sent as a rejection with every problem; the last good state keeps
//! serving.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{read, FileState, SourceMsg, FILE_SOURCE};
use crate::config::manifests;

/// How long to wait for more events after the first one of a burst (an
/// editor's save is several events).
const DEBOUNCE: Duration = Duration::from_millis(30);
/// The safety-net poll.
const POLL: Duration = Duration::from_secs(2);

/// What the files looked like: (path, modified, length) of each.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Fingerprint(Vec<(PathBuf, Option<SystemTime>, u64)>);

/// The fingerprint of the configuration file and its manifests.
pub fn fingerprint(path: &Path, manifests_dir: Option<&Path>) -> Fingerprint {
    let mut files = vec![path.to_owned()];
    if let Some(d) = manifests_dir {
        files.push(d.to_owned());
        files.extend(manifests::files(d).unwrap_or_default());
    }
    Fingerprint(
        files
            .into_iter()
            .map(|f| {
                let md = std::fs::metadata(&f).ok();
                let mtime = md.as_ref().and_then(|m| m.modified().ok());
                let len = md.map_or(0, |m| m.len());
                (f, mtime, len)
            })
            .collect(),
    )
}

/// The directories to watch for `path` and its manifests.
fn watched_dirs(path: &Path, manifests_dir: Option<&Path>) -> Vec<PathBuf> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut v = vec![parent];
    if let Some(d) = manifests_dir {
        v.push(d.to_owned());
    }
    v
}

/// What the source last told the reconciler.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    State(Box<FileState>),
    Problems(Vec<String>),
}

/// Runs the file source until `cancel`. `initial` is the state the
/// appliance started with (already applied).
pub async fn run(
    path: PathBuf,
    initial: FileState,
    tx: mpsc::Sender<SourceMsg>,
    mut hup: mpsc::Receiver<()>,
    cancel: CancellationToken,
) {
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = match notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok_and(|e| !e.kind.is_access()) {
            let _ = ev_tx.send(());
        }
    }) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(error = %e, "cannot watch the configuration for changes; polling every {}s", POLL.as_secs());
            None
        }
    };
    let mut manifests_dir = initial.config.manifests.as_ref().map(|m| m.directory.clone());
    let mut watching: Vec<PathBuf> = Vec::new();
    let rewatch = |w: &mut Option<notify::RecommendedWatcher>, dirs: Vec<PathBuf>, watching: &mut Vec<PathBuf>| {
        let Some(w) = w.as_mut() else { return };
        for d in watching.drain(..) {
            let _ = w.unwatch(&d);
        }
        for d in dirs {
            match w.watch(&d, RecursiveMode::NonRecursive) {
                Ok(()) => watching.push(d),
                Err(e) => warn!(dir = %d.display(), error = %e, "cannot watch; changes there are seen by the slow poll only"),
            }
        }
    };
    rewatch(&mut watcher, watched_dirs(&path, manifests_dir.as_deref()), &mut watching);

    let mut fp = fingerprint(&path, manifests_dir.as_deref());
    let mut last = Sent::State(Box::new(initial));
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let trigger = tokio::select! {
            () = cancel.cancelled() => return,
            Some(()) = hup.recv() => "SIGHUP",
            Some(()) = ev_rx.recv() => {
                tokio::time::sleep(DEBOUNCE).await;
                while ev_rx.try_recv().is_ok() {}
                "file change"
            }
            _ = poll.tick() => {
                if fingerprint(&path, manifests_dir.as_deref()) == fp {
                    continue;
                }
                "file change (poll)"
            }
        };
        fp = fingerprint(&path, manifests_dir.as_deref());
        let p = path.clone();
        let outcome = match tokio::task::spawn_blocking(move || read(&p)).await {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "reading the configuration failed");
                continue;
            }
        };
        let (msg, now) = match outcome {
            Ok(state) => {
                let dir = state.config.manifests.as_ref().map(|m| m.directory.clone());
                if dir != manifests_dir {
                    manifests_dir = dir;
                    rewatch(&mut watcher, watched_dirs(&path, manifests_dir.as_deref()), &mut watching);
                    fp = fingerprint(&path, manifests_dir.as_deref());
                }
                let now = Sent::State(Box::new(state.clone()));
                (SourceMsg::File { state: Box::new(state), trigger: trigger.to_owned() }, now)
            }
            Err(problems) => {
                let now = Sent::Problems(problems.iter().map(ToString::to_string).collect());
                (SourceMsg::Rejected { source: FILE_SOURCE.to_owned(), problems, trigger: trigger.to_owned() }, now)
            }
        };
        if now == last && trigger != "SIGHUP" {
            debug!(trigger, "configuration unchanged");
            continue;
        }
        last = now;
        if tx.send(msg).await.is_err() {
            return; // the reconciler is gone: shutting down
        }
    }
}
