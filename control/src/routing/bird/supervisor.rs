//! Sluice's own `bird`: started in the foreground with Sluice's
//! configuration file and control socket, its log forwarded to Sluice's,
//! restarted with exponential backoff when it dies (each death is counted
//! and reported with its exit status), stopped with BIRD's `down` command
//! (which closes the BGP sessions with a Cease) and killed only if that
//! does not end it.
//!
//! The child inherits no descriptor of the appliance but its standard
//! streams (DPDK's files stay DPDK's), runs in its own process group and is
//! killed when the appliance dies ([`sluice_ffi::process::confine`]); it is
//! spawned from a thread that lives as long as the process, since the
//! parent-death signal follows the spawning thread. Its pid is kept in a
//! pidfile next to the control socket, so that a `bird` left running by an
//! earlier run (one that outlived its appliance in any way) is found at
//! the next start, checked against its
//! `/proc/PID/cmdline`, and stopped ([`stop_leftover`]).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tracing::{debug, info, warn};

use super::client::Client;
use super::BirdError;
use crate::config::router::BirdConfig;

/// First delay before a restart.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Longest delay before a restart.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A `bird` that ran this long resets the backoff.
const STABLE: Duration = Duration::from_secs(30);
/// How long a started `bird` has to open its control socket.
const SOCKET_WAIT: Duration = Duration::from_secs(5);
/// How long `down` has to end it before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(3);

/// How long a leftover `bird` has to end after SIGTERM, and again after SIGKILL.
const LEFTOVER_WAIT: Duration = Duration::from_secs(3);

/// The command line Sluice starts `bird` with.
fn argv(cfg: &BirdConfig) -> Vec<OsString> {
    vec![
        cfg.binary.clone().into_os_string(),
        "-f".into(),
        "-c".into(),
        cfg.config_file.clone().into_os_string(),
        "-s".into(),
        cfg.socket.clone().into_os_string(),
    ]
}

/// Where the supervised `bird`'s pid is kept: next to its control socket
/// (`bird.ctl` → `bird.pid`), in the appliance's runtime directory.
pub(crate) fn pidfile(cfg: &BirdConfig) -> PathBuf {
    cfg.socket.with_extension("pid")
}

/// The command line of process `pid`, if it runs (a zombie has none).
fn cmdline(pid: u32) -> Option<Vec<OsString>> {
    use std::os::unix::ffi::OsStrExt;
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<OsString> = raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| std::ffi::OsStr::from_bytes(a).to_os_string()).collect();
    (!args.is_empty()).then_some(args)
}

/// Stops a `bird` that an earlier run of this appliance left running: the
/// process named by the pidfile, if its command line is exactly the one
/// Sluice starts `bird` with for `cfg` (a pid reused by anything else is
/// left alone). SIGTERM, then SIGKILL if it is still there after a while.
/// Returns its pid if there was one. Blocking (at most a few seconds);
/// called before DPDK starts, since such a process may hold DPDK's files.
pub(crate) fn stop_leftover(cfg: &BirdConfig) -> Option<u32> {
    let file = pidfile(cfg);
    let text = std::fs::read_to_string(&file).ok()?;
    let pid = text.trim().parse::<u32>().ok().filter(|p| *p > 1);
    let ours = argv(cfg);
    let Some(pid) = pid.filter(|p| cmdline(*p).as_ref() == Some(&ours)) else {
        debug!(pidfile = %file.display(), "the pidfile names no bird of this appliance: removed");
        let _ = std::fs::remove_file(&file);
        return None;
    };
    warn!(pid, pidfile = %file.display(), "a bird left by an earlier run of this appliance is still running: stopping it");
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        if let Err(e) = sluice_ffi::process::signal(pid, sig) {
            debug!(pid, error = %e, "signal not delivered");
        }
        let deadline = Instant::now() + LEFTOVER_WAIT;
        while Instant::now() < deadline {
            if cmdline(pid).as_ref() != Some(&ours) {
                info!(pid, "the leftover bird is gone");
                let _ = std::fs::remove_file(&file);
                return Some(pid);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    warn!(pid, "the leftover bird is still there after SIGKILL");
    Some(pid)
}

/// Work for the spawning thread.
type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the one thread that spawns children. It lives as long as
/// the process: a child's parent-death signal is sent when the thread that
/// forked it ends, and a runtime thread may end before the appliance does
/// (an idle blocking-pool thread, one that went through `block_in_place`).
fn on_spawning_thread(job: Job) -> std::io::Result<()> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let tx = match SPAWNER.get() {
        Some(tx) => tx,
        None => {
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new().name("sluice-spawn".into()).spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })?;
            SPAWNER.get_or_init(|| Mutex::new(tx))
        }
    };
    tx.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send(job)
        .map_err(|_| std::io::Error::other("the spawning thread is gone"))
}

/// Spawns `cmd` confined ([`sluice_ffi::process::confine`]) from the
/// spawning thread, inside the current tokio runtime.
async fn spawn_confined(mut cmd: std::process::Command, setup: impl FnOnce(&mut Command) + Send + 'static) -> std::io::Result<Child> {
    sluice_ffi::process::confine(&mut cmd);
    let mut cmd = Command::from(cmd);
    setup(&mut cmd);
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    on_spawning_thread(Box::new(move || {
        let _rt = handle.enter();
        let _ = tx.send(cmd.spawn());
    }))?;
    rx.await.map_err(|_| std::io::Error::other("the spawning thread dropped the request"))?
}

/// The supervised process.
#[derive(Debug)]
pub(crate) struct Supervisor {
    cfg: BirdConfig,
    child: Option<Child>,
    started_at: Option<Instant>,
    backoff: Duration,
    not_before: Option<Instant>,
    /// Times started.
    pub(crate) starts: u64,
}

impl Supervisor {
    /// A supervisor for `cfg`; nothing runs yet.
    pub(crate) fn new(cfg: BirdConfig) -> Supervisor {
        Supervisor { cfg, child: None, started_at: None, backoff: BACKOFF_MIN, not_before: None, starts: 0 }
    }

    /// The running process's id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// True while the process runs (as far as the last [`Supervisor::reap`] knows).
    pub(crate) fn running(&self) -> bool {
        self.child.is_some()
    }

    /// If the process has ended: how, and when the next start may be.
    pub(crate) fn reap(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        let status = match child.try_wait() {
            Ok(None) => return None,
            Ok(Some(s)) => s.to_string(),
            Err(e) => format!("cannot be waited for: {e}"),
        };
        self.child = None;
        let _ = std::fs::remove_file(pidfile(&self.cfg));
        let ran = self.started_at.map_or(Duration::ZERO, |t| t.elapsed());
        if ran >= STABLE {
            self.backoff = BACKOFF_MIN;
        }
        self.not_before = Some(Instant::now() + self.backoff);
        warn!(%status, ran_s = ran.as_secs_f64(), restart_in_ms = u64::try_from(self.backoff.as_millis()).unwrap_or(u64::MAX), "bird ended; restarting it");
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        Some(status)
    }

    /// Whether the backoff allows a start now.
    pub(crate) fn may_start(&self) -> bool {
        self.not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// Starts `bird` with the configuration file already written, and
    /// connects to its socket. A `bird` still answering on the socket (left
    /// by an earlier run) is asked to go down first.
    pub(crate) async fn start(&mut self) -> Result<Client, BirdError> {
        if let Ok(mut old) = Client::connect(&self.cfg.socket).await {
            warn!(socket = %self.cfg.socket.display(), hello = %old.hello, "a bird is already answering on the socket; asking it to go down");
            let _ = old.down().await;
            let deadline = Instant::now() + STOP_WAIT;
            while Instant::now() < deadline && Client::connect(&self.cfg.socket).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if let Some(dir) = self.cfg.socket.parent() {
            std::fs::create_dir_all(dir).map_err(|e| BirdError::Write { path: dir.display().to_string(), source: e })?;
        }
        let argv = argv(&self.cfg);
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = spawn_confined(cmd, |c| {
            c.kill_on_drop(true);
        })
        .await
        .map_err(|e| BirdError::Spawn { binary: self.cfg.binary.display().to_string(), source: e })?;
        if let Some(err) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(err).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    info!(target: "bird", "{l}");
                }
            });
        }
        let pid = child.id();
        if let Some(pid) = pid {
            let file = pidfile(&self.cfg);
            if let Err(e) = std::fs::write(&file, format!("{pid}\n")) {
                warn!(pidfile = %file.display(), error = %e, "cannot write the pidfile: a bird left by a crash would not be found at the next start");
            }
        }
        self.child = Some(child);
        self.started_at = Some(Instant::now());
        self.starts += 1;
        info!(pid, binary = %self.cfg.binary.display(), config = %self.cfg.config_file.display(), socket = %self.cfg.socket.display(), "bird started");
        let deadline = Instant::now() + SOCKET_WAIT;
        loop {
            match Client::connect(&self.cfg.socket).await {
                Ok(c) => return Ok(c),
                Err(e) => {
                    if let Some(status) = self.reap() {
                        return Err(BirdError::Protocol(format!("bird ended right after starting ({status}); see its log above")));
                    }
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the process: `down` over `client` (or a new connection), then
    /// a kill if it is still there after a while.
    pub(crate) async fn stop(&mut self, client: Option<&mut Client>) {
        let Some(mut child) = self.child.take() else { return };
        self.stop_child(&mut child, client).await;
        let _ = std::fs::remove_file(pidfile(&self.cfg));
    }

    async fn stop_child(&self, child: &mut Child, client: Option<&mut Client>) {
        let asked = match client {
            Some(c) => c.down().await.is_ok(),
            None => match Client::connect(&self.cfg.socket).await {
                Ok(mut c) => c.down().await.is_ok(),
                Err(_) => false,
            },
        };
        if asked {
            if let Ok(Ok(status)) = tokio::time::timeout(STOP_WAIT, child.wait()).await {
                info!(%status, "bird stopped");
                return;
            }
        }
        warn!("bird did not go down when asked; killing it");
        let _ = child.kill().await;
    }
}
