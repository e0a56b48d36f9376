//! The configuration file as a source: read again when it or a manifest
//! changes (inotify on their directories, with a slow poll as a safety net
//! for filesystems without events) or on SIGHUP, and sent to the
//! reconciler as one transaction. A file that cannot be read or checked is
//! sent as a rejection with every problem; the last good state keeps
//! serving.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{read, FileState, SourceMsg, FILE_SOURCE};
use crate::config::manifests;
use crate::problem::Problem;

/// How long to wait for more events after the first one of a burst (an
/// editor's save is several events).
const DEBOUNCE: Duration = Duration::from_millis(30);
/// The safety-net poll.
const POLL: Duration = Duration::from_secs(2);
/// The trigger of the source's first read, as it starts.
const START: &str = "start";
/// The trigger of the read after the manifests directory moved.
const MANIFESTS_MOVED: &str = "manifests directory moved";

/// What the files hold: a digest of the configuration file and of every
/// manifest (names and contents), so that an edit is seen even when it
/// keeps the length and lands within the filesystem's timestamp tick, and
/// the trailing events of one save do not read it twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Fingerprint(u64);

/// The fingerprint of the configuration file and its manifests.
pub(crate) fn fingerprint(path: &Path, manifests_dir: Option<&Path>) -> Fingerprint {
    use std::hash::{Hash, Hasher};
    let mut files = vec![path.to_owned()];
    if let Some(d) = manifests_dir {
        files.extend(manifests::files(d).unwrap_or_default());
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in files {
        f.hash(&mut h);
        // Bounded like the loaders: a huge file is hashed by its first bytes
        // and its length (the loader refuses it anyway); anything but a
        // regular file (a FIFO would block here) by why it is refused.
        match crate::config::yaml::open_regular(&f) {
            Ok(file) => {
                use std::io::Read;
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                let mut buf = Vec::new();
                let _ = file.take(MAX_HASHED).read_to_end(&mut buf);
                buf.hash(&mut h);
                len.hash(&mut h);
            }
            Err(e) => e.to_string().hash(&mut h),
        }
    }
    Fingerprint(h.finish())
}

/// Bytes of each file that go into its fingerprint.
const MAX_HASHED: u64 = 32 << 20;

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

/// Whether a change of `changed` (in a watched directory) can change the
/// configuration: the configuration file itself, a manifest (`.yaml`,
/// `.yml`) of the manifests directory, a watched directory itself, or
/// `..data`, which a ConfigMap volume renames into place to swap every
/// file it holds at once (its files are symlinks through it).
fn wakes_for(changed: &Path, config: &Path, manifests_dir: Option<&Path>) -> bool {
    let dirs = watched_dirs(config, manifests_dir);
    if dirs.iter().any(|d| d == changed) {
        return true;
    }
    let Some(name) = changed.file_name() else { return true };
    if name == "..data" {
        return true;
    }
    let parent = changed.parent();
    if parent == Some(dirs[0].as_path()) && Some(name) == config.file_name() {
        return true;
    }
    manifests_dir.is_some_and(|m| parent == Some(m)) && changed.extension().is_some_and(|x| x == "yaml" || x == "yml")
}

/// What the source last told the reconciler.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    State(Box<FileState>),
    Problems(Vec<String>),
}

/// Runs the file source until `cancel`. `initial` is the state the
/// appliance started with (already applied).
pub async fn run(path: PathBuf, initial: FileState, tx: mpsc::Sender<SourceMsg>, hup: mpsc::Receiver<()>, cancel: CancellationToken) {
    run_counting(path, initial, tx, hup, cancel, &std::sync::atomic::AtomicU64::new(0)).await;
}

/// The directory watches of the file source: the watcher (none when the
/// platform gave none; the slow poll then sees every change) and the
/// directories it watches now, so that they can be moved when the manifests
/// directory changes.
struct Watches {
    /// The watcher, sending the paths of each event.
    watcher: Option<notify::RecommendedWatcher>,
    /// The directories being watched.
    watching: Vec<PathBuf>,
}

impl Watches {
    /// Starts a watcher that sends on `ev_tx` the paths of each event that
    /// is not a mere access, and an empty list when events were lost (so
    /// that the source looks again whatever changed). It watches nothing yet.
    fn start(ev_tx: mpsc::UnboundedSender<Vec<PathBuf>>) -> Self {
        let watcher = match notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(e) if !e.kind.is_access() => {
                let _ = ev_tx.send(e.paths);
            }
            Ok(_) => {}
            Err(e) => {
                // Lost events (queue overflow) and the like: look again.
                warn!(error = %e, "watching the configuration failed; reading it again");
                let _ = ev_tx.send(Vec::new());
            }
        }) {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(error = %e, "cannot watch the configuration for changes; polling every {}s", POLL.as_secs());
                None
            }
        };
        Self { watcher, watching: Vec::new() }
    }

    /// Watches `dirs` instead of what was watched so far; a directory that
    /// cannot be watched is left to the slow poll.
    fn rewatch(&mut self, dirs: Vec<PathBuf>) {
        let Some(w) = self.watcher.as_mut() else { return };
        for d in self.watching.drain(..) {
            let _ = w.unwatch(&d);
        }
        for d in dirs {
            match w.watch(&d, RecursiveMode::NonRecursive) {
                Ok(()) => self.watching.push(d),
                Err(e) => warn!(dir = %d.display(), error = %e, "cannot watch; changes there are seen by the slow poll only"),
            }
        }
    }
}

/// Reads the configuration and its manifests on a blocking thread (it is
/// disk work); none when that thread failed, which is logged.
async fn read_blocking(path: &Path) -> Option<Result<FileState, Vec<Problem>>> {
    let p = path.to_owned();
    match tokio::task::spawn_blocking(move || read(&p)).await {
        Ok(o) => Some(o),
        Err(e) => {
            warn!(error = %e, "reading the configuration failed");
            None
        }
    }
}

/// The message that tells the reconciler what a read of the files gave,
/// and what it says, to notice a read that says the same as the last one.
fn message(outcome: Result<FileState, Vec<Problem>>, trigger: &str) -> (SourceMsg, Sent) {
    match outcome {
        Ok(state) => {
            let now = Sent::State(Box::new(state.clone()));
            (SourceMsg::File { state: Box::new(state), trigger: trigger.to_owned() }, now)
        }
        Err(problems) => {
            let now = Sent::Problems(problems.iter().map(ToString::to_string).collect());
            (SourceMsg::Rejected { source: FILE_SOURCE.to_owned(), problems, trigger: trigger.to_owned() }, now)
        }
    }
}

/// [`run`], counting in `wakes` the times a change of the files woke it.
async fn run_counting(
    path: PathBuf,
    initial: FileState,
    tx: mpsc::Sender<SourceMsg>,
    mut hup: mpsc::Receiver<()>,
    cancel: CancellationToken,
    wakes: &std::sync::atomic::AtomicU64,
) {
    // The paths an event is about; none: look again whatever changed.
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<Vec<PathBuf>>();
    let mut watches = Watches::start(ev_tx);
    let mut manifests_dir = initial.config.manifests.as_ref().map(|m| m.directory.clone());
    watches.rewatch(watched_dirs(&path, manifests_dir.as_deref()));

    // Nothing read by this source yet: its first pass reads the files again,
    // now that they are watched, since the appliance read them before it
    // started its ports and workers and they may have changed since. Such a
    // second look (also after the manifests directory moved, once the new
    // one is watched) sends only what differs from what was last sent.
    let mut fp = Fingerprint::default();
    let mut again = Some(START);
    let mut last = Sent::State(Box::new(initial));
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let second_look = again.take();
        let trigger = if let Some(t) = second_look {
            t
        } else {
            tokio::select! {
                () = cancel.cancelled() => return,
                Some(()) = hup.recv() => "SIGHUP",
                Some(paths) = ev_rx.recv() => {
                    if !paths.is_empty() && !paths.iter().any(|p| wakes_for(p, &path, manifests_dir.as_deref())) {
                        continue; // another file of a watched directory (a log, an editor's swap file)
                    }
                    wakes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
            }
        };
        debug!(trigger, "woken");
        let now_fp = fingerprint(&path, manifests_dir.as_deref());
        if now_fp == fp && trigger != "SIGHUP" {
            debug!(trigger, "configuration files unchanged since they were last read");
            continue;
        }
        fp = now_fp;
        let Some(outcome) = read_blocking(&path).await else { continue };
        if let Ok(state) = &outcome {
            let dir = state.config.manifests.as_ref().map(|m| m.directory.clone());
            if dir != manifests_dir {
                manifests_dir = dir;
                watches.rewatch(watched_dirs(&path, manifests_dir.as_deref()));
                // What was read came from the old watches: look again.
                fp = Fingerprint::default();
                again = Some(MANIFESTS_MOVED);
            }
        }
        let (msg, now) = message(outcome, trigger);
        if second_look.is_some() && now == last {
            debug!(trigger, "the configuration reads as it was last sent");
            continue;
        }
        // Every change is sent, even when it reads the same as before: only
        // the reconciler knows whether that state was accepted (it skips an
        // unchanged accepted state and refuses a refused one again, so each
        // save of a broken file says why).
        if now == last {
            debug!(trigger, "configuration reads as before");
        }
        last = now;
        debug!(trigger, "sending");
        if tx.send(msg).await.is_err() {
            return; // the reconciler is gone: shutting down
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "ports: [{name: p, device: net_null0, addresses: [10.0.0.1/24]}]\nservices: [{name: s%N}]\n";

    fn write(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    /// As a ConfigMap volume lays it out: `c.yaml -> ..data/c.yaml`,
    /// `..data -> ..<version>`, swapped by renaming `..data_tmp` over `..data`.
    fn configmap_version(dir: &Path, version: &str, text: &str) {
        let v = dir.join(version);
        std::fs::create_dir_all(&v).unwrap();
        std::fs::write(v.join("c.yaml"), text).unwrap();
        let tmp = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(version, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
    }

    #[tokio::test]
    async fn only_the_config_its_manifests_and_a_configmap_swap_wake_the_watcher() {
        let dir = std::env::temp_dir().join(format!("sluice-filesrc-wake-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        configmap_version(&dir, "..v1", &GOOD.replace("%N", "1"));
        std::os::unix::fs::symlink("..data/c.yaml", dir.join("c.yaml")).unwrap();
        let path = dir.join("c.yaml");
        let initial = read(&path).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let (_hup_tx, hup_rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let cancel2 = cancel.clone();
        let wakes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let w = std::sync::Arc::clone(&wakes);
        let task = tokio::spawn(async move { run_counting(path, initial, tx, hup_rx, cancel2, &w).await });
        // Its own log (or anything else) written beside the config: no wake.
        for i in 0..20 {
            std::fs::write(dir.join("sluice.log"), format!("line {i}\n")).unwrap();
            std::fs::write(dir.join("notes.txt"), format!("{i}")).unwrap();
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        // The ConfigMap's new version: one wake, the new state sent.
        configmap_version(&dir, "..v2", &GOOD.replace("%N", "2"));
        let msg = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("the swap is seen").unwrap();
        match msg {
            SourceMsg::File { state, .. } => assert_eq!(state.config.inline.services[0].name, "s2"),
            m => panic!("unexpected {m:?}"),
        }
        assert_eq!(wakes.load(std::sync::atomic::Ordering::Relaxed), 1, "woken by files that are not the configuration");
        cancel.cancel();
        task.await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_edit_is_seen_even_when_they_come_fast() {
        let dir = std::env::temp_dir().join(format!("sluice-filesrc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.yaml");
        write(&path, &GOOD.replace("%N", "0"));
        let initial = read(&path).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let (hup_tx, hup_rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(path.clone(), initial, tx, hup_rx, cancel.clone()));
        // The source watches before it takes its first wake-up: once it
        // has answered a SIGHUP, edits are seen.
        hup_tx.send(()).await.unwrap();
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("SIGHUP answered").unwrap() {
            SourceMsg::File { state, trigger } => assert_eq!((state.config.inline.services[0].name.as_str(), trigger.as_str()), ("s0", "SIGHUP")),
            m => panic!("SIGHUP: unexpected {m:?}"),
        }
        for n in 1..=60u32 {
            // Alternate good and broken files of the same length.
            let text = if n % 2 == 0 { GOOD.replace("%N", &format!("{:02}", n)) } else { format!("{}routes: [{{x{:02}", GOOD.replace("%N", "00"), n) };
            write(&path, &text);
            let msg = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("edit seen").unwrap();
            match (n % 2, msg) {
                (0, SourceMsg::File { state, .. }) => assert_eq!(state.config.inline.services[0].name, format!("s{n:02}")),
                (1, SourceMsg::Rejected { problems, .. }) => assert!(!problems.is_empty()),
                (_, m) => panic!("edit {n}: unexpected {m:?}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.cancel();
        task.await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The file changes after the appliance read it and before its source
    /// watches it (the appliance starts its ports and workers between the
    /// two): the source reads it again when it starts, and sends the change.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_before_the_source_watches_is_sent() {
        let dir = std::env::temp_dir().join(format!("sluice-filesrc-early-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.yaml");
        write(&path, &GOOD.replace("%N", "0"));
        let initial = read(&path).unwrap();
        write(&path, &GOOD.replace("%N", "1"));
        let (tx, mut rx) = mpsc::channel(16);
        let (_hup_tx, hup_rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(path.clone(), initial, tx, hup_rx, cancel.clone()));
        match tokio::time::timeout(Duration::from_secs(6), rx.recv()).await {
            Ok(Some(SourceMsg::File { state, trigger })) => assert_eq!((state.config.inline.services[0].name.as_str(), trigger.as_str()), ("s1", "start")),
            other => panic!("the change made before the source watched was not sent: {other:?}"),
        }
        cancel.cancel();
        task.await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A FIFO in place of the file is refused at once (nothing waits for a
    /// writer), the file put back is applied, and the source stops when told.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fifo_in_place_of_the_file_is_refused_and_blocks_nothing() {
        let dir = std::env::temp_dir().join(format!("sluice-filesrc-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.yaml");
        write(&path, &GOOD.replace("%N", "0"));
        let initial = read(&path).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let (hup_tx, hup_rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(path.clone(), initial, tx, hup_rx, cancel.clone()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let fifo = dir.join("c.fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        std::fs::rename(&fifo, &path).unwrap();
        for how in ["file change", "SIGHUP"] {
            if how == "SIGHUP" {
                hup_tx.send(()).await.unwrap();
            }
            match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
                Ok(Some(SourceMsg::Rejected { problems, .. })) => {
                    assert!(problems[0].to_string().contains("not a regular file (a FIFO): refused"), "{how}: {problems:?}");
                }
                other => {
                    // Let a reader stuck in open() go, so the runtime can stop.
                    use std::os::unix::fs::OpenOptionsExt;
                    let _w = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&path);
                    panic!("{how}: a FIFO in place of the configuration was not refused within 5 s: {other:?}");
                }
            }
        }
        write(&path, &GOOD.replace("%N", "1"));
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(SourceMsg::File { state, .. })) => assert_eq!(state.config.inline.services[0].name, "s1"),
            other => panic!("the file put back was not read: {other:?}"),
        }
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("the source stops when told").unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
