//! The sibling appliances of a Kubernetes Gateway: the other pods of its
//! Deployment (`siblings.kubernetesPods`), found by the label the
//! controller gives them ([`GATEWAY_LABEL`]) in the Gateway's namespace,
//! each at its pod IP and the siblings' listen port.
//!
//! Followed with kube-runtime's watcher (list, then watch; a relist on
//! 410 Gone; backoff after errors). The set is published only once a list
//! is complete, and an error never removes a sibling: losing the API keeps
//! the siblings last seen. This appliance's own pod is left out by its
//! name and by its IP ([`Own`]); pods without an IP of the listen
//! address's family, and pods that ended (`Succeeded`, `Failed`), are not
//! siblings. A pod being deleted still is one until it is gone: it serves
//! while it drains, and its pins are wanted until then.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::client::client;
use super::KubeConfig;
use crate::config::manifests::GATEWAY_LABEL;

/// How long to wait before making the client again when it could not be.
const RETRY: Duration = Duration::from_secs(5);

/// This appliance's own pod, left out of its siblings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Own {
    /// Its pod's name.
    pub(crate) name: Option<String>,
    /// Its pod's IP.
    pub(crate) ip: Option<IpAddr>,
}

impl Own {
    /// From the environment: `POD_NAME` (else the host name, which is the
    /// pod's name unless the pod sets another) and `POD_IP` (else `listen`'s
    /// address when it is not a wildcard). The Deployment gives both from
    /// the downward API.
    pub(crate) fn from_env(listen: SocketAddr) -> Own {
        let var = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let host = || std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()).filter(|h| !h.is_empty());
        let ip = var("POD_IP").and_then(|v| v.parse().ok()).or_else(|| (!listen.ip().is_unspecified()).then(|| listen.ip()));
        Own { name: var("POD_NAME").or_else(host), ip }
    }
}

/// The siblings among `pods`, sorted: each pod's IP of `listen`'s family
/// at `listen`'s port, leaving out `own` and the pods that ended.
pub(crate) fn siblings<'a>(pods: impl IntoIterator<Item = &'a Pod>, own: &Own, listen: SocketAddr) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = pods
        .into_iter()
        .filter(|p| p.metadata.name.is_none() || p.metadata.name != own.name)
        .filter_map(|p| {
            let st = p.status.as_ref()?;
            if matches!(st.phase.as_deref(), Some("Succeeded" | "Failed")) {
                return None;
            }
            let ips = st.pod_ips.iter().flatten().map(|i| i.ip.as_str()).chain(st.pod_ip.as_deref());
            let ip = ips.filter_map(|s| s.parse::<IpAddr>().ok()).find(|ip| ip.is_ipv4() == listen.is_ipv4())?;
            (Some(ip) != own.ip).then_some(SocketAddr::new(ip, listen.port()))
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Follows the pods of `cfg`'s Gateway until `stop` is cancelled,
/// publishing the siblings among them on `tx` (`None` until first listed).
pub(crate) async fn follow(cfg: KubeConfig, listen: SocketAddr, own: Own, tx: watch::Sender<Option<Vec<SocketAddr>>>, stop: CancellationToken) {
    let selector = format!("{GATEWAY_LABEL}={}", cfg.gateway);
    let client = loop {
        match client(&cfg).await {
            Ok(c) => break c,
            Err(e) => {
                warn!(error = %e, "siblings: cannot reach the Kubernetes API for the Gateway's pods; trying again");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    };
    info!(namespace = %cfg.namespace, selector = %selector, "siblings: following the pods of the Gateway's Deployment");
    let api: Api<Pod> = Api::namespaced(client, &cfg.namespace);
    let mut events = watcher::watcher(api, watcher::Config::default().labels(&selector)).default_backoff().boxed();
    let (mut pods, mut listing): (BTreeMap<String, Pod>, Option<BTreeMap<String, Pod>>) = (BTreeMap::new(), None);
    let (mut listed, mut failing) = (false, false);
    loop {
        let ev = tokio::select! {
            () = stop.cancelled() => return,
            ev = events.next() => match ev {
                Some(ev) => ev,
                None => return,
            },
        };
        let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        match ev {
            Err(e) => {
                if !failing {
                    warn!(error = %e, "siblings: watching the Gateway's pods failed; keeping the siblings known, retrying with backoff");
                }
                failing = true;
                continue;
            }
            Ok(Event::Init) => {
                listing = Some(BTreeMap::new());
                continue;
            }
            Ok(Event::InitApply(p)) => {
                listing.get_or_insert_with(BTreeMap::new).insert(name(&p), p);
                continue;
            }
            Ok(Event::InitDone) => {
                pods = listing.take().unwrap_or_default();
                listed = true;
            }
            Ok(Event::Apply(p)) => {
                pods.insert(name(&p), p);
            }
            Ok(Event::Delete(p)) => {
                pods.remove(&name(&p));
            }
        }
        if std::mem::take(&mut failing) {
            info!("siblings: watching the Gateway's pods again");
        }
        if !listed {
            continue;
        }
        let now = siblings(pods.values(), &own, listen);
        tx.send_if_modified(|was| {
            if was.as_ref() == Some(&now) {
                return false;
            }
            info!(siblings = ?now, "siblings: the Gateway's pods changed");
            *was = Some(now.clone());
            true
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pod(name: &str, ips: &[&str], phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {GATEWAY_LABEL: "g"}},
            "status": {"phase": phase, "podIP": ips.first(), "podIPs": ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>()},
        }))
        .unwrap()
    }

    #[test]
    fn siblings_are_the_other_pods_at_their_ip_of_the_listen_family() {
        let pods = [
            pod("lb-a", &["10.1.0.1", "fd00::1"], "Running"),
            pod("lb-b", &["10.1.0.2", "fd00::2"], "Running"),
            pod("lb-c", &["fd00::3", "10.1.0.3"], "Pending"),
            pod("lb-d", &[], "Pending"),
            pod("lb-e", &["10.1.0.5"], "Succeeded"),
            pod("lb-f", &["10.1.0.6"], "Failed"),
            pod("lb-g", &["fd00::7"], "Running"),
        ];
        let own = Own { name: Some("lb-a".into()), ip: None };
        let v4: SocketAddr = "0.0.0.0:7946".parse().unwrap();
        assert_eq!(siblings(&pods, &own, v4), ["10.1.0.2:7946".parse().unwrap(), "10.1.0.3:7946".parse().unwrap()]);
        let v6: SocketAddr = "[::]:7000".parse().unwrap();
        let want: Vec<SocketAddr> = ["[fd00::2]:7000", "[fd00::3]:7000", "[fd00::7]:7000"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(siblings(&pods, &own, v6), want);
        // Known by its IP alone (a pod whose host name is not its own).
        let own = Own { name: Some("somewhere-else".into()), ip: Some("10.1.0.2".parse().unwrap()) };
        assert_eq!(siblings(&pods, &own, v4), ["10.1.0.1:7946".parse().unwrap(), "10.1.0.3:7946".parse().unwrap()]);
    }

    #[test]
    fn its_own_ip_comes_from_pod_ip_or_a_listen_address_that_is_not_a_wildcard() {
        // POD_IP is not set where the unit tests run.
        assert_eq!(Own::from_env("10.9.0.1:7946".parse().unwrap()).ip, Some("10.9.0.1".parse().unwrap()));
        assert_eq!(Own::from_env("0.0.0.0:7946".parse().unwrap()).ip, None);
    }
}
