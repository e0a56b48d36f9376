//! `sluice-controller`'s command line: the Controller-Manager ([`crate`])
//! as a process, against an API server, or `--dry-run` on a directory.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio_util::sync::CancellationToken;
use tracing::info;

use sluice_core::config::kubernetes::DEFAULT_GATEWAY_CLASS;
use crate::client::{self, Options, Status};
use crate::gateway::Template;
use crate::lease::LeaseConfig;
use crate::{dryrun, Settings, DEFAULT_LIMIT};
use sluice_core::model::limits;

/// Run the controller-manager of the Gateways of a GatewayClass.
///
/// For each Gateway of the class it keeps:
///
/// - the EndpointSlices of the Gateway's Services (those labelled
///   service.kubernetes.io/service-proxy-name: <gateway>): the pods their
///   selector picks, at their address on the Gateway's networks
///   (meridio-experiment/networks, from the pods' Multus
///   k8s.v1.cni.cncf.io/network-status annotation) inside its subnets
///   (meridio-experiment/network-subnets); one slice per family; each
///   endpoint with an identifier in 0..limit (sluice.io/endpoint-limit on
///   the Service, else --default-endpoint-limit) kept in the
///   sluice.io/endpoint-ids annotation the appliance reads, unchanged while
///   the endpoint stays;
///
/// - the Gateway's SLLBR Deployment, from the Resource Template (--template)
///   and the Gateway's infrastructure (annotations, labels, parametersRef
///   ConfigMap with replicas and resources), owned by the Gateway.
///
/// Replicas elect a leader with a Lease (--lease-namespace/--lease-name):
/// only the leader writes. With --dry-run DIR nothing is contacted: the
/// EndpointSlices it would write for the manifests in DIR are printed as
/// YAML, with why pods were left out as comments.
#[derive(Debug, clap::Parser)]
#[command(name = "sluice-controller", version, verbatim_doc_comment)]
pub struct ControllerArgs {
    /// Log filter (error, warn, info, debug, trace, or a tracing filter such
    /// as `sluice_controller=debug`). Overrides RUST_LOG.
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// Print the EndpointSlices for the manifests of DIR, contact nothing.
    #[arg(long, value_name = "DIR")]
    pub(crate) dry_run: Option<PathBuf>,
    /// With --dry-run: print the SLLBR Deployments too.
    #[arg(long, requires = "dry_run")]
    pub(crate) deployments: bool,
    /// A kubeconfig (the in-cluster service account when unset).
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Watch only this namespace (every namespace when unset; with
    /// --dry-run, the namespace of objects that name none).
    #[arg(long, value_name = "NS")]
    pub(crate) namespace: Option<String>,
    /// The GatewayClass whose Gateways are handled.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_GATEWAY_CLASS)]
    pub(crate) gateway_class: String,
    /// Endpoint limit of a Service without sluice.io/endpoint-limit.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIMIT)]
    pub(crate) default_endpoint_limit: u32,
    /// The Resource Template of the SLLBR Deployment (a Deployment; strings
    /// may say ${GATEWAY} and ${NAMESPACE}); the built-in one when unset.
    #[arg(long, value_name = "FILE")]
    pub(crate) template: Option<PathBuf>,
    /// The Lease's namespace (default: $POD_NAMESPACE, else "default").
    #[arg(long, value_name = "NS")]
    pub(crate) lease_namespace: Option<String>,
    /// The Lease's name.
    #[arg(long, value_name = "NAME", default_value = "sluice-controller")]
    pub(crate) lease_name: String,
    /// This replica's identity (default: $POD_NAME or the host name, and the pid).
    #[arg(long, value_name = "ID")]
    pub(crate) identity: Option<String>,
    /// Seconds a Lease not renewed stays its holder's.
    #[arg(long, value_name = "SECONDS", default_value_t = 15.0)]
    pub(crate) lease_duration: f64,
    /// Seconds between reads and renewals of the Lease.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    pub(crate) lease_retry: f64,
}

fn seconds(v: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(v).map_err(|e| anyhow!("{what}: {v}: {e}")).and_then(|d| if d.is_zero() { Err(anyhow!("{what} must be more than 0")) } else { Ok(d) })
}

/// The settings the flags give.
pub(crate) fn settings(args: &ControllerArgs) -> Result<Settings> {
    let (lo, hi) = (limits::ENDPOINT_LIMIT_MIN, limits::ENDPOINT_LIMIT_MAX);
    if !(lo..=hi).contains(&args.default_endpoint_limit) {
        return Err(anyhow!("--default-endpoint-limit {} is out of range {lo}..={hi}", args.default_endpoint_limit));
    }
    let template = match &args.template {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading the template {}", path.display()))?;
            Template::parse(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?
        }
        None => Template::default_template().map_err(|e| anyhow!(e))?,
    };
    Ok(Settings { gateway_class: args.gateway_class.clone(), default_limit: args.default_endpoint_limit, template })
}

/// Runs the controller as the flags say.
pub fn run(args: &ControllerArgs) -> Result<ExitCode> {
    let settings = settings(args)?;
    if let Some(dir) = &args.dry_run {
        let store = dryrun::load(dir, args.namespace.as_deref().unwrap_or("default")).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
        print!("{}", dryrun::render(&store, &settings, args.deployments));
        return Ok(ExitCode::SUCCESS);
    }
    let duration = seconds(args.lease_duration, "--lease-duration")?;
    let retry = seconds(args.lease_retry, "--lease-retry")?;
    if retry >= duration {
        return Err(anyhow!("--lease-retry must be less than --lease-duration"));
    }
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("POD_NAME").ok().or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned())).unwrap_or_else(|| "sluice".into());
        format!("{host}-{}", std::process::id())
    });
    let lease_ns = args.lease_namespace.clone().or_else(|| std::env::var("POD_NAMESPACE").ok()).unwrap_or_else(|| "default".into());
    let mut lease = LeaseConfig::new(lease_ns, args.lease_name.clone(), identity);
    lease.duration = duration;
    lease.retry = retry;
    lease.renew_deadline = duration.mul_f64(2.0 / 3.0).max(retry);
    let opts = Options { kubeconfig: args.kubeconfig.clone(), namespace: args.namespace.clone(), settings, lease };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return,
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            info!("stopping");
            stop.cancel();
        });
        let status = Arc::new(Mutex::new(Status::default()));
        client::run(opts, status, cancel).await
    })?;
    Ok(ExitCode::SUCCESS)
}
