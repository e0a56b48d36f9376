//! The admin endpoint: `/metrics` (Prometheus), `/status` (JSON),
//! `/healthz` (liveness) and `/readyz` (serving the current configuration).
//!
//! It runs on the control runtime (hyper + axum) and is built to survive
//! whoever can reach it: request headers are bounded in size and must
//! arrive within a timeout, bodies are never buffered, every request has a
//! deadline, every connection a maximum lifetime, and the number of open
//! connections is capped (connections over the cap are closed at once and
//! counted). It listens on loopback unless configured otherwise.

pub mod health;
pub mod latency;
pub mod metrics;
pub mod state;
pub mod tables;
pub mod views;

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
pub struct Limits {
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// Bytes of request line and headers at most (a larger request gets 431).
    pub max_header_bytes: usize,
    /// The headers must arrive within this time.
    pub header_timeout: Duration,
    /// A request must be answered within this time.
    pub request_timeout: Duration,
    /// A connection is closed after this long, whatever it does.
    pub connection_lifetime: Duration,
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
pub struct AdminCounters {
    /// Connections closed because the cap was reached.
    pub over_cap: AtomicU64,
    /// Connections that ended in a protocol error or a timeout.
    pub failed: AtomicU64,
    /// Requests served.
    pub requests: AtomicU64,
}

#[derive(Clone)]
struct App {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    counters: Arc<AdminCounters>,
    digests: Arc<tables::Digests>,
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
    state::lock(&app.shared.state).snapshot.clone()
}

fn json<T: serde::Serialize>(v: &T) -> Response {
    match serde_json::to_string_pretty(v) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

async fn tables_handler(State(app): State<App>) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    let Some(snap) = snapshot(&app) else { return (StatusCode::SERVICE_UNAVAILABLE, "nothing published yet\n").into_response() };
    match tokio::task::spawn_blocking(move || tables::summaries(&snap)).await {
        Ok(v) => json(&v),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
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
    match tokio::task::spawn_blocking(move || tables::dump(&snap, &service).ok_or(service)).await {
        Ok(Ok(d)) => json(&d),
        Ok(Err(name)) => (StatusCode::NOT_FOUND, format!("no service {name:?}\n")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
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
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
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

/// Serves until `cancel` fires, then stops accepting and gives the open
/// connections up to a second to finish.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, limits: Limits, counters: Arc<AdminCounters>, cancel: CancellationToken) {
    let registry = Arc::new(metrics::registry(Arc::clone(&shared), Arc::clone(&counters)));
    let app = App { shared, registry, counters: Arc::clone(&counters), digests: Arc::default() };
    let service = router(app, limits);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
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
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            counters.over_cap.fetch_add(1, Ordering::Relaxed);
            debug!(%peer, "admin endpoint: connection cap reached, closing");
            drop(stream);
            continue;
        };
        let svc = TowerToHyperService::new(service.clone());
        let counters = Arc::clone(&counters);
        conns.spawn(async move {
            let _permit = permit;
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(limits.max_header_bytes.max(8192))
                .keep_alive(true);
            let conn = b.serve_connection(TokioIo::new(stream), svc);
            match tokio::time::timeout(limits.connection_lifetime, conn).await {
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
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
}
