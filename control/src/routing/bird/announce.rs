//! Which VIPs are announced, and the driver that makes BIRD announce them.
//!
//! A VIP is announced while the workers forward, at least one service it
//! routes to has a ready endpoint, and (with `siblings.gate`) none of its
//! services is withdrawn for a table that differs from the siblings'
//! majority ([`decide`]); otherwise it is withdrawn and the reason is kept. The driver computes what can be served from the
//! reconciler's publications ([`Servable::of`]) and learns whether the
//! workers forward from the health sampler's channel. It renders BIRD's
//! configuration from the accepted GatewayRouters and the announced VIPs,
//! writes it atomically and applies it (`configure check`, then
//! `configure`) whenever it changes: on every publication, on settings
//! changes, when the workers stop or start forwarding, and on a 200 ms
//! tick, so a VIP is withdrawn well within a second of losing its last
//! ready endpoint. Before a graceful shutdown,
//! [`DriverHandle::withdraw_all`] withdraws everything and says when BIRD
//! has taken it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::client::{BfdSession, Client, Protocol};
use super::render::render;
use super::supervisor::Supervisor;
use super::{BirdError, BirdStatus, SessionStatus};
use crate::config::GatewayConfig;
use crate::ground::now_epoch;
use crate::reconcile::{Published, Settings};
use crate::config::router::{protocol_name, BirdConfig, BirdMode, RoutingConfig};

/// For each VIP, the services it routes to and whether each has a ready
/// endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Servable(pub BTreeMap<IpAddr, Vec<(String, bool)>>);

impl Servable {
    /// What the publication `p` can serve: its routes' VIPs, each with its
    /// services and whether `p`'s snapshot has a ready endpoint for each.
    pub(crate) fn of(p: &Published) -> Servable {
        let mut vips: BTreeMap<IpAddr, Vec<(String, bool)>> = BTreeMap::new();
        for r in p.summary.routes.iter() {
            let ready = p.ready(&r.service);
            for v in &r.vips {
                // Room for one service (a VIP's usual count), not the
                // four a first push makes: 1 MB more for 10,000 VIPs.
                let e = vips.entry(*v).or_insert_with(|| Vec::with_capacity(1));
                if !e.iter().any(|(n, _)| *n == r.service) {
                    e.push((r.service.clone(), ready));
                }
            }
        }
        Servable(vips)
    }
}

/// Why the workers do not forward (empty while they do), as the health
/// sampler last saw it.
pub(crate) type Forwarding = watch::Receiver<Vec<String>>;

/// A VIP, announced or not, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VipState {
    /// The VIP.
    pub(crate) vip: IpAddr,
    /// Exported to the gateways.
    pub(crate) announced: bool,
    /// Why (or why not).
    pub(crate) reason: String,
    /// Since when it has been so (seconds since the epoch; 0 from [`decide`]).
    pub(crate) since: u64,
}

/// Decides each VIP: `not_forwarding` lists why the workers do not forward
/// (empty when they do); `gated` holds the services whose table differs
/// from the siblings' majority, each with why; `withdrawing` is set for a
/// graceful shutdown.
pub fn decide(s: &Servable, not_forwarding: &[String], gated: &BTreeMap<String, String>, withdrawing: bool) -> Vec<VipState> {
    s.0.iter()
        .map(|(vip, services)| {
            let ready: Vec<&str> = services.iter().filter(|(_, r)| *r).map(|(n, _)| n.as_str()).collect();
            let (announced, reason) = if withdrawing {
                (false, "withdrawn: the appliance is shutting down".to_owned())
            } else if let Some(why) = not_forwarding.first() {
                (false, format!("withdrawn: the workers do not forward ({why})"))
            } else if let Some(why) = services.iter().find_map(|(n, _)| gated.get(n)) {
                (false, format!("withdrawn: {why} (siblings.gate)"))
            } else if ready.is_empty() {
                let names: Vec<&str> = services.iter().map(|(n, _)| n.as_str()).collect();
                (false, format!("withdrawn: no ready endpoint in service {}", names.join(", ")))
            } else {
                (true, format!("announced: service {} has a ready endpoint", ready.join(", ")))
            };
            VipState { vip: *vip, announced, reason, since: 0 }
        })
        .collect()
}

/// Waits for the gate's next change; never, without one.
async fn gated_changed(g: Option<&mut watch::Receiver<crate::sync::Gated>>) -> Result<(), watch::error::RecvError> {
    match g {
        Some(g) => g.changed().await,
        None => std::future::pending().await,
    }
}

type WithdrawReply = oneshot::Sender<Result<bool, WithdrawError>>;

/// Why the VIPs were not withdrawn before stopping.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WithdrawError {
    /// The driver is no longer running.
    #[error("the BIRD driver has stopped")]
    Stopped,
    /// BIRD still runs the configuration that announces them.
    #[error("BIRD has not taken the withdrawal: {0}")]
    NotTaken(String),
}

/// Talks to a running driver.
#[derive(Clone, Debug)]
pub struct DriverHandle {
    tx: mpsc::Sender<WithdrawReply>,
}

impl DriverHandle {
    /// Withdraws every VIP and waits until BIRD has applied that. `Ok(true)`
    /// when something was being announced through a BGP session (so the
    /// caller should give the withdrawal time to propagate).
    pub(crate) async fn withdraw_all(&self) -> Result<bool, WithdrawError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(tx).await.map_err(|_| WithdrawError::Stopped)?;
        rx.await.map_err(|_| WithdrawError::Stopped)?
    }
}

/// The driver task's state.
#[derive(Debug)]
pub struct Driver {
    settings: watch::Receiver<Settings>,
    publications: watch::Receiver<Published>,
    /// What the last publication seen can serve, and its generation.
    served: (u64, Servable),
    forwarding: Forwarding,
    /// The services withdrawn for disagreeing with the siblings (none
    /// without sibling sync).
    gated: Option<watch::Receiver<crate::sync::Gated>>,
    cmds: mpsc::Receiver<WithdrawReply>,
    /// What BIRD did, as last seen; published on `published` after each pass.
    status: BirdStatus,
    /// The driver's status channel: `None` while no router is configured.
    published: watch::Sender<Option<BirdStatus>>,
    /// Per BGP protocol with an Established session, the VIPs BIRD exports
    /// on it (`show route export`), as last read.
    exported: BTreeMap<String, Vec<IpAddr>>,
    routing: Option<RoutingConfig>,
    supervisor: Option<Supervisor>,
    client: Option<Client>,
    /// The text BIRD runs with.
    applied: Option<String>,
    withdrawing: bool,
    last_refresh: Option<Instant>,
    learned: Option<watch::Sender<Vec<GatewayConfig>>>,
}

/// How often the driver looks at worker health.
const TICK: Duration = Duration::from_millis(200);
/// How often sessions and BFD are read from BIRD.
const REFRESH: Duration = Duration::from_secs(1);

impl Driver {
    /// A driver following `settings`, the reconciler's `publications` and
    /// whether the workers forward (`forwarding`); its status goes out on
    /// [`Driver::status`].
    pub(crate) fn new(settings: watch::Receiver<Settings>, publications: watch::Receiver<Published>, forwarding: Forwarding) -> (Driver, DriverHandle) {
        let (tx, cmds) = mpsc::channel(1);
        let d = Driver {
            settings,
            publications,
            served: (0, Servable::default()),
            forwarding,
            gated: None,
            cmds,
            status: BirdStatus::default(),
            published: watch::channel(None).0,
            exported: BTreeMap::new(),
            routing: None,
            supervisor: None,
            client: None,
            applied: None,
            withdrawing: false,
            last_refresh: None,
            learned: None,
        };
        (d, DriverHandle { tx })
    }

    /// The driver's status: what BIRD confirmed, after every pass; `None`
    /// while no gateway router is configured.
    pub(crate) fn status(&self) -> watch::Receiver<Option<BirdStatus>> {
        self.published.subscribe()
    }

    /// Withdraws the VIPs of the services `gated` names, as it changes.
    pub(crate) fn gate_with(&mut self, gated: watch::Receiver<crate::sync::Gated>) {
        self.gated = Some(gated);
    }

    /// Tells `learned` the gateways BIRD learned (each family's best
    /// default route) as they change.
    pub(crate) fn learn_gateways_to(&mut self, learned: watch::Sender<Vec<GatewayConfig>>) {
        self.learned = Some(learned);
    }

    /// Runs until `cancel`; then stops a supervised `bird`.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut settings_open, mut published_open, mut forwarding_open) = (true, true, true);
        let mut gated_open = self.gated.is_some();
        loop {
            self.step().await;
            tokio::select! {
                () = cancel.cancelled() => break,
                r = self.settings.changed(), if settings_open => settings_open = r.is_ok(),
                r = self.publications.changed(), if published_open => published_open = r.is_ok(),
                r = self.forwarding.changed(), if forwarding_open => forwarding_open = r.is_ok(),
                r = gated_changed(self.gated.as_mut()), if gated_open => gated_open = r.is_ok(),
                Some(reply) = self.cmds.recv() => {
                    let had = self.applied.as_deref().is_some_and(|t| t.contains(" blackhole;"));
                    self.withdrawing = true;
                    self.step().await;
                    let done = self.applied.as_deref().is_some_and(|t| !t.contains(" blackhole;"));
                    let answer = {
                        let st = &mut self.status;
                        st.withdrawn_for_shutdown = done;
                        let sessions_up = st.sessions.iter().any(|s| s.bgp_state == "Established");
                        if done || !had {
                            Ok(had && sessions_up)
                        } else {
                            Err(WithdrawError::NotTaken(st.error.clone().unwrap_or_else(|| "no error was reported".into())))
                        }
                    };
                    self.publish();
                    let _ = reply.send(answer);
                }
                _ = tick.tick() => {}
            }
        }
        self.shutdown().await;
    }

    async fn shutdown(&mut self) {
        if let Some(mut s) = self.supervisor.take() {
            s.stop(self.client.as_mut()).await;
        }
        self.client = None;
        self.exported.clear();
        self.published.send_replace(None);
    }

    /// Sends the status to its readers when it changed.
    fn publish(&self) {
        self.published.send_if_modified(|old| {
            let changed = old.as_ref() != Some(&self.status);
            if changed {
                *old = Some(self.status.clone());
            }
            changed
        });
    }

    /// One pass: follow the settings, decide, apply, refresh the status.
    async fn step(&mut self) {
        let routing = self.settings.borrow().routing.clone();
        if routing.routers.is_empty() {
            if self.routing.take().is_some() {
                info!("no gateway routers configured: BIRD is no longer driven");
                self.shutdown().await;
                self.applied = None;
            }
            return;
        }
        if self.routing.as_ref().map(|r| &r.bird) != Some(&routing.bird) {
            if self.routing.is_some() {
                info!("the bird settings changed: starting over with them");
            }
            self.shutdown().await;
            self.applied = None;
            self.status = BirdStatus {
                mode: match routing.bird.mode {
                    BirdMode::Supervised => "supervised".into(),
                    BirdMode::External => "external".into(),
                },
                socket: routing.bird.socket.display().to_string(),
                config_file: routing.bird.config_file.display().to_string(),
                ..BirdStatus::default()
            };
            if routing.bird.mode == BirdMode::Supervised {
                self.supervisor = Some(Supervisor::new(routing.bird.clone()));
            }
        }
        self.routing = Some(routing.clone());

        let not_forwarding = self.forwarding.borrow_and_update().clone();
        {
            let p = self.publications.borrow_and_update();
            if p.generation != self.served.0 {
                self.served = (p.generation, Servable::of(&p));
            }
        }
        let gated = self.gated.as_mut().map(|g| Arc::clone(&g.borrow_and_update())).unwrap_or_default();
        let vips = decide(&self.served.1, &not_forwarding, &gated, self.withdrawing);
        let announced: Vec<IpAddr> = vips.iter().filter(|v| v.announced).map(|v| v.vip).collect();
        let Some(router_id) = routing.router_id else {
            self.publish();
            return;
        };
        let text = render(router_id, &routing.routers, &announced);

        let result = self.apply(&routing.bird, &text).await;
        let changed = matches!(result, Ok(true));
        self.record(result, &text);
        // After a new configuration, what BIRD exports is read at once.
        if changed || self.last_refresh.is_none_or(|t| t.elapsed() >= REFRESH) {
            self.refresh(&routing).await;
        }
        self.vip_states(vips, &text);
        self.publish();
    }

    /// Records the outcome of applying `text`.
    fn record(&mut self, result: Result<bool, BirdError>, text: &str) {
        let st = &mut self.status;
        match result {
            Ok(changed) => {
                st.error = None;
                if st.refused.take().is_some() {
                    info!("BIRD took the configuration");
                }
                if changed {
                    st.configured += 1;
                    st.configured_at = Some(now_epoch());
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if st.error.as_deref() != Some(msg.as_str()) {
                    error!(error = %msg, "BIRD");
                }
                if matches!(e, BirdError::Refused { .. }) {
                    st.refused = Some(msg.clone());
                }
                st.error = Some(msg);
                st.configure_failures += u64::from(self.applied.as_deref() != Some(text));
            }
        }
        st.pid = self.supervisor.as_ref().and_then(Supervisor::pid);
        st.starts = self.supervisor.as_ref().map_or(0, |s| s.starts);
        st.restarts = st.starts.saturating_sub(1);
        st.connected = self.client.is_some();
        if let Some(c) = &self.client {
            st.version.clone_from(&c.hello);
        }
    }

    /// Each VIP as BIRD has it: announced when the configuration BIRD runs
    /// with holds it (the last `configure` with it succeeded) and BIRD
    /// exports it on an Established session; otherwise what it is.
    fn vip_states(&mut self, mut vips: Vec<VipState>, wanted_text: &str) {
        let running = self.applied.as_deref();
        let taken = running == Some(wanted_text);
        let st = &mut self.status;
        let now = now_epoch();
        for v in &mut vips {
            let route = format!(" {}/{} blackhole;", v.vip, if v.vip.is_ipv4() { 32 } else { 128 });
            let in_bird = running.is_some_and(|t| t.contains(&route));
            let on: Vec<&str> = self.exported.iter().filter(|(_, x)| x.contains(&v.vip)).map(|(p, _)| p.as_str()).collect();
            let why_not_taken = || st.error.clone().unwrap_or_else(|| "BIRD is not running".into());
            (v.announced, v.reason) = match (v.announced, in_bird, on.is_empty()) {
                (true, true, false) => (true, v.reason.clone()),
                (false, true, false) => (true, format!(
                    "still announced: BIRD runs an older configuration ({}); should be {}",
                    if taken { "not yet read again".to_owned() } else { why_not_taken() },
                    v.reason
                )),
                (_, true, true) if st.sessions.iter().any(|s| s.bgp_state == "Established") => {
                    (false, "not announced: in BIRD's configuration, but exported on no Established session".into())
                }
                (_, true, true) => (false, "not announced: in BIRD's configuration, but no BGP session is Established".into()),
                (true, false, _) => (false, format!("not yet announced: BIRD has not taken the configuration ({})", why_not_taken())),
                (false, false, _) => (false, v.reason.clone()),
            };
            v.since = st.vips.iter().find(|o| o.vip == v.vip && o.announced == v.announced).map_or(now, |o| o.since);
            if !st.vips.iter().any(|o| o.vip == v.vip && o.announced == v.announced && o.reason == v.reason) {
                info!(vip = %v.vip, announced = v.announced, reason = %v.reason, "VIP");
            }
        }
        st.vips = vips;
    }

    /// Makes BIRD run with `text`; `Ok(true)` when it was applied now.
    async fn apply(&mut self, bird: &BirdConfig, text: &str) -> Result<bool, BirdError> {
        if let Some(s) = self.supervisor.as_mut() {
            if let Some(status) = s.reap() {
                self.client = None;
                self.applied = None;
                self.status.last_exit = Some(status);
            }
            if !s.running() {
                if !s.may_start() {
                    return Err(BirdError::Protocol("bird is not running; waiting to restart it".into()));
                }
                write_atomic(&bird.config_file, text)?;
                let c = s.start().await?;
                self.client = Some(c);
                self.applied = Some(text.to_owned());
                return Ok(true);
            }
        }
        if self.client.is_none() {
            self.client = Some(Client::connect(&bird.socket).await?);
            // An external BIRD (or one we reconnect to) may run anything.
            self.applied = None;
        }
        if self.applied.as_deref() == Some(text) {
            return Ok(false);
        }
        write_atomic(&bird.config_file, text)?;
        let Some(c) = self.client.as_mut() else { return Ok(false) };
        match c.configure(&bird.config_file).await {
            Ok(_) => {
                self.applied = Some(text.to_owned());
                Ok(true)
            }
            Err(e) => {
                if !matches!(e, BirdError::Refused { .. }) {
                    self.client = None;
                }
                Err(e)
            }
        }
    }

    /// Reads sessions and BFD from BIRD into the status.
    async fn refresh(&mut self, routing: &RoutingConfig) {
        self.last_refresh = Some(Instant::now());
        let read = match self.client.as_mut() {
            Some(c) => read_sessions(c, routing).await,
            None => SessionsRead { gateways: None, exported: BTreeMap::new(), sessions: Ok((Vec::new(), Vec::new())) },
        };
        let gateways = read.gateways;
        let (protocols, bfd) = match read.sessions {
            Ok(pb) => pb,
            Err(e) => {
                if matches!(e, BirdError::Refused { .. }) {
                    self.status.refused_commands += 1;
                    error!(error = %e, "BIRD refused a command");
                } else {
                    warn!(error = %e, "cannot read BIRD's sessions");
                }
                self.client = None;
                (Vec::new(), Vec::new())
            }
        };
        self.exported = read.exported;
        let sessions = session_statuses(routing, &protocols, &bfd);
        let st = &mut self.status;
        for s in &sessions {
            if let Some(old) = st.sessions.iter().find(|o| o.router == s.router) {
                if old.bgp_state != s.bgp_state || old.bfd_state != s.bfd_state {
                    info!(router = %s.router, bgp = %s.bgp_state, bfd = ?s.bfd_state, info = %s.info, "BGP session");
                }
            }
        }
        st.sessions = sessions;
        st.bfd = bfd;
        st.connected = self.client.is_some();
        // Kept while BIRD does not answer: the data plane keeps its last return path.
        if let Some(g) = gateways {
            st.learned_gateways = g.iter().map(|g| format!("{} on port {}", g.address, g.port)).collect();
            if let Some(tx) = &self.learned {
                tx.send_if_modified(|old| {
                    let changed = *old != g;
                    if changed {
                        info!(gateways = ?st.learned_gateways, "return-path gateways learned over BGP");
                    }
                    *old = g;
                    changed
                });
            }
        }
    }
}

/// What one read of BIRD's sessions gave ([`read_sessions`]).
struct SessionsRead {
    /// The return-path gateways BIRD learned; none when they could not be read.
    gateways: Option<Vec<GatewayConfig>>,
    /// Per BGP protocol with an Established session, the VIPs BIRD exports
    /// on it, as far as they were read before a command failed.
    exported: BTreeMap<String, Vec<IpAddr>>,
    /// The protocols and BFD sessions, or the first error of the protocols,
    /// BFD and export commands, in that order.
    sessions: Result<(Vec<Protocol>, Vec<BfdSession>), BirdError>,
}

/// Asks BIRD through `c` for the learned gateways, then the protocols, then
/// (when the protocols were read) the BFD sessions and what each Established
/// BGP session exports, up to the first export that fails. Failing to learn
/// the gateways does not fail the read: they are kept as they were.
async fn read_sessions(c: &mut Client, routing: &RoutingConfig) -> SessionsRead {
    let gateways = learned_gateways(c, routing).await.ok();
    let mut exported = BTreeMap::new();
    let p = c.protocols().await;
    let b = match &p {
        Ok(_) => c.bfd_sessions().await,
        Err(_) => Ok(Vec::new()),
    };
    let mut x = Ok(());
    if let Ok(p) = &p {
        for p in p.iter().filter(|p| p.proto == "BGP" && p.bgp_state() == "Established") {
            match c.exported(&p.name).await {
                Ok(v) => {
                    exported.insert(p.name.clone(), v);
                }
                Err(e) => {
                    x = Err(e);
                    break;
                }
            }
        }
    }
    let sessions = match (p, b, x) {
        (Ok(p), Ok(b), Ok(())) => Ok((p, b)),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(e),
    };
    SessionsRead { gateways, exported, sessions }
}

/// The status of the BGP session to each gateway router, from the
/// protocols and BFD sessions BIRD reported (unknown when it reported none).
fn session_statuses(routing: &RoutingConfig, protocols: &[Protocol], bfd: &[BfdSession]) -> Vec<SessionStatus> {
    routing
        .routers
        .iter()
        .map(|r| {
            let name = protocol_name(&r.router.name);
            let p = protocols.iter().find(|p| p.name == name);
            let bfd_state = bfd
                .iter()
                .find(|b| b.address == r.router.address && r.router.bgp.bfd.switch)
                .map(|b| b.state.clone());
            SessionStatus {
                router: r.router.name.clone(),
                protocol: name,
                neighbor: r.router.address.to_string(),
                interface: r.kernel_interface.clone(),
                state: p.map(|p| p.state.clone()).unwrap_or_default(),
                bgp_state: p.map_or_else(|| "Unknown".to_owned(), |p| p.bgp_state().to_owned()),
                info: p.map(|p| p.info.clone()).unwrap_or_default(),
                since: p.map(|p| p.since.clone()).unwrap_or_default(),
                bfd: r.router.bgp.bfd.switch,
                bfd_state,
            }
        })
        .collect()
}

/// Each family's best default route, as a gateway on the port its
/// interface belongs to (families without a gateway router are not asked).
async fn learned_gateways(c: &mut Client, routing: &RoutingConfig) -> Result<Vec<GatewayConfig>, BirdError> {
    let mut out = Vec::new();
    for (v4, net) in [(true, "0.0.0.0/0"), (false, "::/0")] {
        if !routing.routers.iter().any(|r| r.is_v4() == v4) {
            continue;
        }
        if let Some((hop, iface)) = c.best_next_hop(net).await? {
            if let Some(r) = routing.routers.iter().find(|r| r.kernel_interface == iface && hop.is_ipv4() == v4) {
                out.push(GatewayConfig { address: hop.into(), port: r.port.clone(), mac: None });
            }
        }
    }
    Ok(out)
}

/// Writes `text` to `path` through a temporary file and a rename, so BIRD
/// never reads half a file.
pub(crate) fn write_atomic(path: &Path, text: &str) -> Result<(), BirdError> {
    let err = |e| BirdError::Write { path: path.display().to_string(), source: e };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use sluice_dataplane::rcu::Publisher;
    use sluice_dataplane::snapshot::Snapshot;

    use super::*;
    use crate::compile::{TopoPort, Topology};
    use crate::config::IfAddr;
    use crate::reconcile::Reconciler;
    use crate::sources::{FileState, SourceMsg};

    /// The state of the file `r.yaml` in `dir`, written to say: service web
    /// on 20.0.0.1, with a ready endpoint or with none.
    fn file_state(dir: &Path, ready: bool) -> FileState {
        let eps = if ready { r#"[{id: 0, address: 10.0.0.5, mac: "02:00:00:00:00:01"}]"# } else { "[]" };
        let path = dir.join("r.yaml");
        let text = format!(
            "ports: [{{name: p, device: net_null0, addresses: [10.0.0.1/24]}}]\nroutes: [{{name: r, service: web, vips: [20.0.0.1]}}]\nservices: [{{name: web, endpoints: {eps}}}]\n"
        );
        std::fs::write(&path, text).unwrap();
        crate::sources::read(&path).unwrap()
    }

    /// A reconciler started with [`file_state`] (web ready): its
    /// publications are what the driver follows.
    fn reconciler(dir: &Path) -> Reconciler {
        let state = file_state(dir, true);
        let topo = Topology {
            ports: vec![TopoPort {
                name: "p".into(),
                mac: [2, 0, 0, 0, 0, 9],
                mtu: 1500,
                vlan: 0,
                addresses: vec![IfAddr { addr: "10.0.0.1".parse().unwrap(), prefix: 24 }],
            }],
            gateways: vec![],
        };
        let (settings, _) = watch::channel(Settings::of(&state.config));
        let mut r = Reconciler::new(crate::sources::Loaded::of(state).unwrap(), topo, Publisher::new(Snapshot::default()), Vec::new(), settings);
        r.start().unwrap();
        r
    }

    /// Makes `r` publish web with a ready endpoint or with none.
    fn serve(r: &mut Reconciler, dir: &Path, ready: bool) {
        r.apply(SourceMsg::File { state: Box::new(file_state(dir, ready)), trigger: "test".into() });
        assert_eq!(r.publications().borrow().ready("web"), ready);
    }

    /// BIRD's routes ("" while it does not answer yet, or refuses because
    /// it is reconfiguring: 8004 "Stopped due to reconfiguration"; callers
    /// poll).
    async fn routes(sock: &Path) -> String {
        let Ok(mut c) = Client::connect(sock).await else { return String::new() };
        let Ok(r) = c.command("show route").await else { return String::new() };
        r.lines.iter().map(|l| l.text.clone()).collect::<Vec<_>>().join("\n")
    }

    /// Kills the external bird when the test ends, also when it fails.
    struct Bird(std::process::Child);
    impl Drop for Bird {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
        for _ in 0..100 {
            if f().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("not within 5 s: {what}");
    }

    /// A `bird` started by someone else (mode external): the driver writes
    /// the configuration, reconfigures it over the socket as VIPs become
    /// servable or not, withdraws everything when asked, and leaves it
    /// running when it stops.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drives_an_external_bird() {
        let dir = std::env::temp_dir().join(format!("sluice-ext-bird-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (sock, conf) = (dir.join("bird.ctl"), dir.join("bird.conf"));
        std::fs::write(&conf, "router id 10.0.0.1;\nprotocol device {}\n").unwrap();
        let bird = std::process::Command::new("/usr/sbin/bird")
            .arg("-f")
            .arg("-c")
            .arg(&conf)
            .arg("-s")
            .arg(&sock)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("bird2 is installed (scripts/setup.sh)");
        let _bird = Bird(bird);
        let text = format!(
            "ports: [{{name: p, device: net_null0, addresses: [10.0.0.1/24]}}]\nbird: {{mode: external, socket: {}, configFile: {}}}\ngatewayRouters: [{{name: gw, address: 10.0.0.2, interface: p, bgp: {{localASN: 1, remoteASN: 2}}}}]\n",
            sock.display(),
            conf.display()
        );
        let cfg = crate::config::parse_str(&text, &dir.join("c.yaml")).unwrap();
        let (_settings_tx, settings) = watch::channel(Settings::of(&cfg));
        let mut r = reconciler(&dir);
        // The workers forward.
        let (_forwarding_tx, forwarding) = watch::channel(Vec::new());
        let cancel = CancellationToken::new();
        let (driver, handle) = Driver::new(settings, r.publications(), forwarding);
        let rx = driver.status();
        let task = tokio::spawn(driver.run(cancel.clone()));

        let status = || rx.borrow().clone().unwrap_or_default();
        eventually("the VIP is in BIRD", async || routes(&sock).await.contains("20.0.0.1/32")).await;
        eventually("the status says so", async || !status().vips.is_empty() && status().configured > 0).await;
        let st = status();
        assert_eq!((st.mode.as_str(), st.connected, st.pid), ("external", true, None));
        // In BIRD's configuration, but announced to no one: no session is up.
        assert!(!st.vips[0].announced, "{:?}", st.vips);
        assert_eq!(st.vips[0].reason, "not announced: in BIRD's configuration, but no BGP session is Established");
        assert_eq!(st.sessions[0].protocol, "gw_gw");
        assert!(std::fs::read_to_string(&conf).unwrap().contains("protocol bgp gw_gw"));

        serve(&mut r, &dir, false);
        eventually("the VIP is withdrawn", async || !routes(&sock).await.contains("20.0.0.1/32")).await;
        eventually("the status says so", async || status().vips[0].reason.starts_with("withdrawn")).await;
        assert_eq!(status().vips[0].reason, "withdrawn: no ready endpoint in service web");

        serve(&mut r, &dir, true);
        eventually("the VIP is back", async || routes(&sock).await.contains("20.0.0.1/32")).await;
        // No session is up, so there is nothing to wait for after withdrawing.
        assert_eq!(handle.withdraw_all().await, Ok(false));
        assert!(!routes(&sock).await.contains("20.0.0.1/32"));
        assert!(status().withdrawn_for_shutdown);

        cancel.cancel();
        task.await.unwrap();
        assert!(Client::connect(&sock).await.is_ok(), "an external bird is left running");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An external `bird` that refuses the configuration Sluice writes (it
    /// runs as nobody and cannot read the file): the refusal shows in the
    /// status (which `/readyz` and the metrics read: see the admin
    /// endpoint's tests) and in the VIPs' states, which say what BIRD runs
    /// rather than what Sluice wanted; once BIRD can read it, that clears.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_configuration_is_reported_as_such() {
        use std::os::unix::fs::PermissionsExt;
        if !nix_root() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("sluice-refused-bird-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("private")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (sock, own, conf) = (dir.join("bird.ctl"), dir.join("own.conf"), dir.join("private/bird.conf"));
        std::fs::write(&own, "router id 10.0.0.1;\nprotocol device {}\n").unwrap();
        let bird = std::process::Command::new("/usr/sbin/bird")
            .args(["-f", "-u", "nobody", "-g", "nogroup", "-c"])
            .arg(&own)
            .arg("-s")
            .arg(&sock)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("bird2 is installed (scripts/setup.sh)");
        let _bird = Bird(bird);
        let text = format!(
            "ports: [{{name: p, device: net_null0, addresses: [10.0.0.1/24]}}]\nbird: {{mode: external, socket: {}, configFile: {}}}\ngatewayRouters: [{{name: gw, address: 10.0.0.2, interface: p, bgp: {{localASN: 1, remoteASN: 2}}}}]\n",
            sock.display(),
            conf.display()
        );
        let cfg = crate::config::parse_str(&text, &dir.join("c.yaml")).unwrap();
        let (_settings_tx, settings) = watch::channel(Settings::of(&cfg));
        let mut r = reconciler(&dir);
        let (_forwarding_tx, forwarding) = watch::channel(Vec::new());
        let cancel = CancellationToken::new();
        let (driver, _handle) = Driver::new(settings, r.publications(), forwarding);
        let rx = driver.status();
        let task = tokio::spawn(driver.run(cancel.clone()));
        let status = || rx.borrow().clone().unwrap_or_default();

        // First BIRD can read the file: the VIP is in its configuration.
        eventually("BIRD runs the configuration", async || routes(&sock).await.contains("20.0.0.1/32") && status().configured > 0).await;
        assert_eq!(status().refused, None);

        // Then it cannot, and the VIP is withdrawn: BIRD keeps announcing it.
        std::fs::set_permissions(dir.join("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
        serve(&mut r, &dir, false);
        eventually("the refusal is in the status", async || status().refused.is_some()).await;
        let st = status();
        assert!(st.refused.as_deref().unwrap().contains("Permission denied"), "{:?}", st.refused);
        assert!(routes(&sock).await.contains("20.0.0.1/32"), "BIRD still runs the configuration with the VIP");
        assert!(
            !st.vips[0].reason.starts_with("withdrawn"),
            "the status must not say withdrawn while BIRD still has the VIP: {:?}",
            st.vips[0]
        );
        assert_eq!(st.vips[0].reason, "not announced: in BIRD's configuration, but no BGP session is Established");
        assert!(st.configure_failures > 0);

        // BIRD can read it again: it withdraws, and every report clears.
        std::fs::set_permissions(dir.join("private"), std::fs::Permissions::from_mode(0o755)).unwrap();
        eventually("BIRD takes the configuration", async || !routes(&sock).await.contains("20.0.0.1/32") && status().refused.is_none()).await;
        assert_eq!(status().vips[0].reason, "withdrawn: no ready endpoint in service web");
        assert_eq!(status().error, None);

        cancel.cancel();
        task.await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Whether the test runs as root (BIRD can only drop to nobody then).
    fn nix_root() -> bool {
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
    }

    fn served(v: &[(&str, &[(&str, bool)])]) -> Servable {
        Servable(v.iter().map(|(a, s)| (a.parse().unwrap(), s.iter().map(|(n, r)| ((*n).to_owned(), *r)).collect())).collect())
    }

    #[test]
    fn only_what_can_be_served_is_announced() {
        let s = served(&[("20.0.0.1", &[("web", true)]), ("20.0.0.2", &[("db", false)]), ("2001:db8::1", &[("a", false), ("b", true)])]);
        let none = BTreeMap::new();
        let d = decide(&s, &[], &none, false);
        let got: Vec<(String, bool, &str)> = d.iter().map(|v| (v.vip.to_string(), v.announced, v.reason.as_str())).collect();
        assert_eq!(got, [
            ("20.0.0.1".to_owned(), true, "announced: service web has a ready endpoint"),
            ("20.0.0.2".to_owned(), false, "withdrawn: no ready endpoint in service db"),
            ("2001:db8::1".to_owned(), true, "announced: service b has a ready endpoint"),
        ]);
        let stalled = decide(&s, &["worker on lcore 1 has not polled for 1.2 s".into()], &none, false);
        assert!(stalled.iter().all(|v| !v.announced && v.reason.contains("do not forward (worker on lcore 1")));
        let stopping = decide(&s, &[], &none, true);
        assert!(stopping.iter().all(|v| !v.announced && v.reason.contains("shutting down")));
        // A service that disagrees with the siblings withdraws every VIP
        // routing to it, even beside a service that agrees.
        let gated = BTreeMap::from([("b".to_owned(), "service b's table differs".to_owned())]);
        let d = decide(&s, &[], &gated, false);
        let got: Vec<(bool, &str)> = d.iter().map(|v| (v.announced, v.reason.as_str())).collect();
        assert_eq!(got, [
            (true, "announced: service web has a ready endpoint"),
            (false, "withdrawn: no ready endpoint in service db"),
            (false, "withdrawn: service b's table differs (siblings.gate)"),
        ]);
    }
}
