//! Sluice's own `bird`: started in the foreground with Sluice's
//! configuration file and control socket, its log forwarded to Sluice's,
//! restarted with exponential backoff when it dies (each death is counted
//! and reported with its exit status), stopped with BIRD's `down` command
//! (which closes the BGP sessions with a Cease) and killed only if that
//! does not end it.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tracing::{info, warn};

use super::client::Client;
use super::BirdError;
use crate::routing::router::BirdConfig;

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

/// The supervised process.
#[derive(Debug)]
pub struct Supervisor {
    cfg: BirdConfig,
    child: Option<Child>,
    started_at: Option<Instant>,
    backoff: Duration,
    not_before: Option<Instant>,
    /// Times started.
    pub starts: u64,
}

impl Supervisor {
    /// A supervisor for `cfg`; nothing runs yet.
    pub fn new(cfg: BirdConfig) -> Supervisor {
        Supervisor { cfg, child: None, started_at: None, backoff: BACKOFF_MIN, not_before: None, starts: 0 }
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// True while the process runs (as far as the last [`Supervisor::reap`] knows).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// If the process has ended: how, and when the next start may be.
    pub fn reap(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        let status = match child.try_wait() {
            Ok(None) => return None,
            Ok(Some(s)) => s.to_string(),
            Err(e) => format!("cannot be waited for: {e}"),
        };
        self.child = None;
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
    pub fn may_start(&self) -> bool {
        self.not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// Starts `bird` with the configuration file already written, and
    /// connects to its socket. A `bird` still answering on the socket (left
    /// by an earlier run) is asked to go down first.
    pub async fn start(&mut self) -> Result<Client, BirdError> {
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
        let mut cmd = Command::new(&self.cfg.binary);
        cmd.arg("-f").arg("-c").arg(&self.cfg.config_file).arg("-s").arg(&self.cfg.socket);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| BirdError::Spawn { binary: self.cfg.binary.display().to_string(), source: e })?;
        if let Some(err) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(err).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    info!(target: "bird", "{l}");
                }
            });
        }
        let pid = child.id();
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
    pub async fn stop(&mut self, client: Option<&mut Client>) {
        let Some(mut child) = self.child.take() else { return };
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

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.cfg.socket
    }
}
