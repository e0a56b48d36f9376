//! The admin endpoint: `/metrics` (Prometheus), `/status` (JSON),
//! `/healthz` (liveness) and `/readyz` (serving the current configuration).
//!
//! It runs on the control runtime (hyper + axum) and is built to survive
//! whoever can reach it: request headers are bounded in size and must
//! arrive within a timeout, bodies are never buffered, every request has a
//! deadline, every connection a maximum lifetime, and the number of open
//! connections is capped (connections over the cap are closed at once and
//! counted). It listens on loopback unless configured otherwise.

mod api;
pub mod health;
mod latency;
mod metrics;
pub mod state;
mod tables;
mod views;
mod window;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use state::Shared;

/// Bounds on what one client can make the endpoint hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Open connections at most; more are closed at once.
    pub(crate) max_connections: usize,
    /// Bytes of request line and headers at most (a larger request gets 431).
    pub(crate) max_header_bytes: usize,
    /// The headers must arrive within this time.
    pub(crate) header_timeout: Duration,
    /// A request must be answered within this time.
    pub(crate) request_timeout: Duration,
    /// A connection is closed after this long, whatever it does.
    pub(crate) connection_lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            max_header_bytes: 16 * 1024,
            header_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            connection_lifetime: Duration::from_secs(60),
        }
    }
}

/// Counts of what the endpoint refused.
#[derive(Debug, Default)]
pub(crate) struct AdminCounters {
    /// Connections closed because the cap was reached.
    pub(crate) over_cap: AtomicU64,
    /// Connections that ended in a protocol error or a timeout.
    pub(crate) failed: AtomicU64,
    /// Requests served.
    pub(crate) requests: AtomicU64,
}

#[derive(Clone)]
struct App {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    counters: Arc<AdminCounters>,
    digests: Arc<tables::Digests>,
    limits: Limits,
}

/// The routes.
fn router(app: App, limits: Limits) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/status", get(status_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/tables", get(tables_handler))
        .route("/tables/{service}", get(table_handler))
        .route("/explain", get(explain_handler))
        .route("/latency", get(latency_handler))
        .fallback(fallback)
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, limits.request_timeout))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(4096))
        .with_state(app)
}

async fn fallback(method: Method, uri: Uri) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "GET")], "only GET\n").into_response();
    }
    (
        StatusCode::NOT_FOUND,
        format!("no {}: try /metrics, /status[?service=NAME][&endpoints=N|all], /healthz, /readyz, /tables, /tables/SERVICE[?runs=false], /explain or /latency\n", uri.path()),
    )
        .into_response()
}

async fn metrics_handler(State(app): State<App>) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    let reg = Arc::clone(&app.registry);
    match tokio::task::spawn_blocking(move || metrics::render(&reg)).await {
        Ok(body) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("metrics failed: {e}\n")).into_response(),
    }
}

/// `/status[?service=NAME][&endpoints=N|all]`
async fn status_handler(State(app): State<App>, Query(q): Query<Vec<(String, String)>>) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    let query = match views::StatusQuery::from_params(q.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
        Ok(query) => query,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let sh = Arc::clone(&app.shared);
    match tokio::task::spawn_blocking(move || views::status(&sh, &query)).await {
        Ok(Ok(body)) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Ok(Err(views::NoService(name))) => (StatusCode::NOT_FOUND, format!("no service {name:?}\n")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("status failed: {e}\n")).into_response(),
    }
}

async fn latency_handler(State(app): State<App>) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    let sh = Arc::clone(&app.shared);
    match tokio::task::spawn_blocking(move || latency::view(&sh)).await {
        Ok(Some(v)) => json(&v),
        Ok(None) => (StatusCode::NOT_FOUND, "the workers record no latency: set dpdk.latencyHistogram: true\n").into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("latency failed: {e}\n")).into_response(),
    }
}

fn snapshot(app: &App) -> Option<Arc<sluice_dataplane::snapshot::Snapshot>> {
    app.shared.snapshot()
}

fn json<T: serde::Serialize>(v: &T) -> Response {
    match serde_json::to_string_pretty(v) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// Bytes a streamed response sends at a time.
const CHUNK: usize = 64 * 1024;

/// Chunks of a streamed response written and not yet sent, at most: with
/// the one being filled, what a streamed response holds is bounded by
/// about `(CHUNKS_QUEUED + 1) * CHUNK`, whatever its length.
const CHUNKS_QUEUED: usize = 4;

/// A writer that sends what it is given, in chunks, to a response body;
/// it fails once the body is dropped (the client went away, or the
/// connection was closed at the request's deadline) or at `deadline`, which
/// stops whatever writes into it.
struct ChunkWriter {
    buf: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<axum::body::Bytes>,
    deadline: Instant,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if Instant::now() >= self.deadline {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the request's time is up"));
        }
        let chunk = axum::body::Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(chunk).map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the response was dropped"))
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// A JSON response that `write` produces on a blocking thread while the
/// client reads it. The body ends in an error (the connection is closed
/// without a complete response) when `write` fails or `timeout` has passed;
/// `write` stops at its next chunk once the body is gone.
fn streamed_json(timeout: Duration, write: impl FnOnce(&mut ChunkWriter) -> std::io::Result<()> + Send + 'static) -> Response {
    let deadline = Instant::now() + timeout;
    let (tx, rx) = tokio::sync::mpsc::channel::<axum::body::Bytes>(CHUNKS_QUEUED);
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<std::io::Error>();
    tokio::task::spawn_blocking(move || {
        let mut w = ChunkWriter { buf: Vec::with_capacity(CHUNK), tx, deadline };
        if let Err(e) = write(&mut w).and_then(|()| std::io::Write::flush(&mut w)) {
            debug!(error = %e, "streamed admin response stopped");
            let _ = failed_tx.send(e);
        }
    });
    /// The body's state: chunks until the writer ends, then its outcome.
    struct Body {
        rx: tokio::sync::mpsc::Receiver<axum::body::Bytes>,
        failed: Option<tokio::sync::oneshot::Receiver<std::io::Error>>,
        deadline: tokio::time::Instant,
    }
    let body = Body { rx, failed: Some(failed_rx), deadline: tokio::time::Instant::from_std(deadline) };
    let stream = futures_util::stream::unfold(body, |mut b| async move {
        let failed = b.failed.take()?;
        match tokio::time::timeout_at(b.deadline, b.rx.recv()).await {
            Ok(Some(chunk)) => {
                b.failed = Some(failed);
                Some((Ok(chunk), b))
            }
            // The writer is done: complete, or failed.
            Ok(None) => failed.await.ok().map(|e| (Err(e), b)),
            Err(_) => Some((Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the request's time is up")), b)),
        }
    });
    ([(header::CONTENT_TYPE, "application/json")], axum::body::Body::from_stream(stream)).into_response()
}

async fn tables_handler(State(app): State<App>) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    let Some(snap) = snapshot(&app) else { return (StatusCode::SERVICE_UNAVAILABLE, "nothing published yet\n").into_response() };
    let digests = Arc::clone(&app.digests);
    streamed_json(app.limits.request_timeout, move |w| tables::write_summaries(&snap, &digests, w))
}

async fn table_handler(
    State(app): State<App>,
    Path(service): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    let Some(snap) = snapshot(&app) else { return (StatusCode::SERVICE_UNAVAILABLE, "nothing published yet\n").into_response() };
    let runs = match q.get("runs").map(String::as_str) {
        None | Some("true") => true,
        Some("false") => false,
        Some(other) => return (StatusCode::BAD_REQUEST, format!("runs is true or false, not {other:?}\n")).into_response(),
    };
    if !runs {
        return match tables::summary_for(&snap, &service, &app.digests) {
            Some(s) => json(&s),
            None => (StatusCode::NOT_FOUND, format!("no service {service:?}\n")).into_response(),
        };
    }
    let Some(svc) = tables::find(&snap, &service) else { return (StatusCode::NOT_FOUND, format!("no service {service:?}\n")).into_response() };
    drop(snap);
    let digests = Arc::clone(&app.digests);
    streamed_json(app.limits.request_timeout, move |w| tables::write_dump(&svc, &digests, w))
}

/// `/explain?proto=tcp&src=10.0.0.1:40000&dst=20.0.0.1:80`
async fn explain_handler(State(app): State<App>, Query(q): Query<std::collections::HashMap<String, String>>) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    let field = |k: &str| q.get(k).map(String::as_str).unwrap_or("");
    let Some(p) = tables::protocol(field("proto")) else {
        return (StatusCode::BAD_REQUEST, "proto must be tcp, udp or sctp\n").into_response();
    };
    let (Ok(src), Ok(dst)) = (field("src").parse::<SocketAddr>(), field("dst").parse::<SocketAddr>()) else {
        return (StatusCode::BAD_REQUEST, "src and dst are ADDRESS:PORT ([v6]:port for IPv6)\n").into_response();
    };
    let Some(snap) = snapshot(&app) else { return (StatusCode::SERVICE_UNAVAILABLE, "nothing published yet\n").into_response() };
    match tables::explain(&snap, p, src, dst) {
        Ok(x) => json(&x),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

fn verdict(why: Vec<String>) -> Response {
    if why.is_empty() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{}\n", why.join("\n"))).into_response()
    }
}

async fn healthz(State(app): State<App>) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    verdict(health::unhealthy(&app.shared, Instant::now()))
}

async fn readyz(State(app): State<App>) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    verdict(health::unready(&app.shared, Instant::now()))
}

/// Binds the admin address, saying so in the log (and warning when it is
/// reachable from outside the machine).
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(addr).await?;
    if addr.ip().is_loopback() {
        info!(listen = %addr, "admin endpoint: /metrics /status /healthz /readyz");
    } else {
        warn!(
            listen = %addr,
            "admin endpoint listens beyond loopback: anyone who reaches this address reads the appliance's status (set admin.listen to 127.0.0.1:PORT to keep it local)"
        );
    }
    Ok(l)
}

/// Connections accepted beyond the cap to answer `/healthz` and `/readyz`
/// (one request each; anything else gets 503): a liveness probe is
/// answered whatever the other clients hold.
pub(crate) const PROBE_SLOTS: usize = 4;

/// How long a connection that arrives at the cap waits for the slot of a
/// connection closed for it.
const SLOT_WAIT: Duration = Duration::from_millis(500);

/// A connection that has sent no complete request for this long after it
/// was accepted is closed, when the cap is reached, to make room for a new
/// one (a client sends its request as soon as it is connected; one that
/// dribbles its headers would hold a slot for the whole header timeout).
const SILENT_GRACE: Duration = Duration::from_millis(250);

/// What the accept loop knows of one open connection.
#[derive(Debug)]
struct Conn {
    /// Asks the connection to close: at once when idle between requests
    /// or when it has not sent a request yet, after its response otherwise.
    close: CancellationToken,
    /// Requests being answered (until their body is sent).
    in_flight: std::sync::atomic::AtomicU32,
    /// Requests answered.
    answered: AtomicU64,
    /// When it was accepted.
    accepted: Instant,
    /// When a request last began or ended.
    last: std::sync::Mutex<Instant>,
}

impl Conn {
    fn new() -> Conn {
        let now = Instant::now();
        Conn { close: CancellationToken::new(), in_flight: 0.into(), answered: 0.into(), accepted: now, last: std::sync::Mutex::new(now) }
    }

    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        *crate::ground::lock(&self.last) = Instant::now();
    }

    fn end(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.answered.fetch_add(1, Ordering::Relaxed);
        *crate::ground::lock(&self.last) = Instant::now();
    }

    /// Has not begun a request yet.
    fn silent(&self) -> bool {
        self.answered.load(Ordering::Relaxed) == 0 && self.in_flight.load(Ordering::Relaxed) == 0
    }
}

/// Ends a request of a connection when dropped (with its response's body).
struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Open connections in one kind of slot.
type Open = Arc<std::sync::Mutex<Vec<Arc<Conn>>>>;

/// Asks one connection of `open` to close to make room for a new one: the
/// one kept alive idle the longest between requests, else the oldest that
/// has sent nothing for [`SILENT_GRACE`]. False when there is none (every
/// connection is answering a request, or just arrived).
fn make_room(open: &Open) -> bool {
    let now = Instant::now();
    let open = crate::ground::lock(open);
    let live = || open.iter().filter(|c| !c.close.is_cancelled());
    let idle = live()
        .filter(|c| c.in_flight.load(Ordering::Relaxed) == 0 && c.answered.load(Ordering::Relaxed) > 0)
        .min_by_key(|c| *crate::ground::lock(&c.last));
    let silent = || live().filter(|c| c.silent() && now.saturating_duration_since(c.accepted) >= SILENT_GRACE).min_by_key(|c| c.accepted);
    match idle.or_else(silent) {
        Some(c) => {
            c.close.cancel();
            true
        }
        None => false,
    }
}

/// A slot of `slots`, at once, or after [`make_room`] found a connection
/// of `open` to close.
async fn slot(slots: &Arc<Semaphore>, open: &Open) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(p) = Arc::clone(slots).try_acquire_owned() {
        return Some(p);
    }
    if !make_room(open) {
        return None;
    }
    tokio::time::timeout(SLOT_WAIT, Arc::clone(slots).acquire_owned()).await.ok().and_then(Result::ok)
}

/// The routes served to a connection beyond the cap.
fn probe_router(app: App, limits: Limits) -> Router {
    let busy = format!(
        "the admin endpoint serves {} connections at once and all are in use: only /healthz and /readyz are answered now\n",
        limits.max_connections
    );
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(move || async move { (StatusCode::SERVICE_UNAVAILABLE, busy).into_response() })
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, limits.request_timeout))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(4096))
        .with_state(app)
}

/// Serves one connection with `router` until it ends, its lifetime is up,
/// or (gracefully) `conn.close` fires.
async fn serve_connection(stream: tokio::net::TcpStream, peer: SocketAddr, router: Router, conn: Arc<Conn>, keep_alive: bool, limits: Limits, counters: Arc<AdminCounters>) {
    use hyper::service::Service as _;
    let inner = TowerToHyperService::new(router);
    let tracked = Arc::clone(&conn);
    let svc = hyper::service::service_fn(move |req| {
        tracked.begin();
        let guard = InFlight(Arc::clone(&tracked));
        let answer = inner.call(req);
        async move {
            let resp = answer.await?;
            // A body of unknown length is streamed: the request is in
            // flight until it is sent (or dropped).
            if axum::body::HttpBody::size_hint(resp.body()).exact().is_some() {
                drop(guard);
                return Ok::<_, std::convert::Infallible>(resp);
            }
            Ok(resp.map(|b| {
                axum::body::Body::from_stream(futures_util::StreamExt::map(b.into_data_stream(), move |chunk| {
                    let _in_flight = &guard;
                    chunk
                }))
            }))
        }
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(keep_alive);
    let c = b.serve_connection(TokioIo::new(stream), svc);
    let served = async {
        tokio::pin!(c);
        tokio::select! {
            r = c.as_mut() => r,
            () = conn.close.cancelled() => {
                if conn.silent() {
                    return Ok(());
                }
                c.as_mut().graceful_shutdown();
                c.await
            }
        }
    };
    match tokio::time::timeout(limits.connection_lifetime, served).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            debug!(%peer, error = %e, "admin connection ended with an error");
        }
        Err(_) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            debug!(%peer, "admin connection closed at its maximum lifetime");
        }
    }
}

/// Serves until `cancel` fires, then stops accepting and gives the open
/// connections up to a second to finish.
///
/// At most `limits.max_connections` connections are served at once. One
/// that arrives at the cap has a connection closed for it ([`make_room`])
/// and takes its slot; when none can be closed, it is served in one of
/// [`PROBE_SLOTS`] for `/healthz` and `/readyz` only (where room is made
/// the same way); failing that, it is closed at once and counted.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, limits: Limits, counters: Arc<AdminCounters>, cancel: CancellationToken) {
    let registry = Arc::new(metrics::registry(Arc::clone(&shared), Arc::clone(&counters)));
    let app = App { shared, registry, counters: Arc::clone(&counters), digests: Arc::default(), limits };
    let service = router(app.clone(), limits);
    let probes = probe_router(app, limits);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let probe_slots = Arc::new(Semaphore::new(PROBE_SLOTS));
    // Connections accepted and not yet in a slot, at most (each waits
    // [`SLOT_WAIT`] at most for a slot of each kind).
    let pending = Arc::new(Semaphore::new(4 * (limits.max_connections + PROBE_SLOTS)));
    let (open, probes_open): (Open, Open) = Default::default();
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            a = listener.accept() => a,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off a little.
                warn!(error = %e, "admin endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(pending) = Arc::clone(&pending).try_acquire_owned() else {
            counters.over_cap.fetch_add(1, Ordering::Relaxed);
            debug!(%peer, "admin endpoint: connection cap reached, closing");
            drop(stream);
            continue;
        };
        let (slots, probe_slots, open, probes_open, counters) =
            (Arc::clone(&slots), Arc::clone(&probe_slots), Arc::clone(&open), Arc::clone(&probes_open), Arc::clone(&counters));
        let (service, probes) = (service.clone(), probes.clone());
        conns.spawn(async move {
            let (router, list, keep_alive, permit) = match slot(&slots, &open).await {
                Some(p) => (service, open, true, p),
                None => match slot(&probe_slots, &probes_open).await {
                    Some(p) => (probes, probes_open, false, p),
                    None => {
                        counters.over_cap.fetch_add(1, Ordering::Relaxed);
                        debug!(%peer, "admin endpoint: connection cap reached, closing");
                        return;
                    }
                },
            };
            drop(pending);
            let _permit = permit;
            let conn = Arc::new(Conn::new());
            crate::ground::lock(&list).push(Arc::clone(&conn));
            serve_connection(stream, peer, router, Arc::clone(&conn), keep_alive, limits, counters).await;
            crate::ground::lock(&list).retain(|c| !Arc::ptr_eq(c, &conn));
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
}
