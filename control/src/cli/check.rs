//! `sluice check`: validates a configuration without starting anything.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use sluice_dataplane::addr::Addr;

use crate::compile::{Compiler, EndpointState, Neighbors, TopoPort, Topology};
use crate::problem::Problem;
use crate::sources;

/// Check a configuration and its manifests.
///
/// Prints every problem as `file:line:column: path: reason` and exits 1 when there is
/// any; prints a summary and exits 0 otherwise. Nothing is started.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The appliance configuration (YAML).
    #[arg(long, short, value_name = "FILE")]
    pub(crate) config: PathBuf,
    /// The configuration the running appliance was started with: also
    /// report the settings that only a restart applies and that differ (a
    /// reload refuses them, at the same positions).
    #[arg(long, value_name = "FILE")]
    pub(crate) started_with: Option<PathBuf>,
}

/// Every next hop "resolves": check looks at placement, not at the network.
struct AllResolved;

impl Neighbors for AllResolved {
    fn mac(&self, _port: u8, _addr: Addr) -> Option<[u8; 6]> {
        Some([0; 6])
    }
}

/// The ports and gateways of `cfg` as the compiler sees them, with no MAC
/// learnt yet: check looks at placement, not at the network.
fn placement_topology(cfg: &crate::config::ApplianceConfig) -> Topology {
    Topology {
        ports: cfg
            .ports
            .iter()
            .map(|p| TopoPort { name: p.name.clone(), mac: [0; 6], mtu: p.mtu, vlan: p.vlan, addresses: p.addresses.clone() })
            .collect(),
        gateways: cfg.gateways.clone(),
    }
}

/// Everything wrong with the configuration at `path`; with `started_with`,
/// as a reload of an appliance started with that configuration.
pub(crate) fn problems(path: &std::path::Path, started_with: Option<&std::path::Path>) -> Result<sources::Loaded, Vec<Problem>> {
    let loaded = sources::load(path)?;
    let cfg = &loaded.file.config;
    if let Some(running) = started_with {
        let restart = cfg.start_only_changes(&crate::config::load(running)?);
        if !restart.is_empty() {
            return Err(restart);
        }
    }
    let topo = placement_topology(cfg);
    let mut out = Vec::new();
    let origins: HashMap<(&str, u32), &crate::model::Origin> = loaded
        .resolved
        .services
        .values()
        .flat_map(|s| s.endpoints.iter().map(|e| ((e.service.as_str(), e.id), &*e.origin)))
        .collect();
    match Compiler::new(cfg.max_services, cfg.max_endpoints).compile(&loaded.resolved, &topo, &AllResolved) {
        Err(e) => out.push(cfg.compile_problem(e.to_string(), e.capacity_key())),
        Ok(c) => {
            for e in c.endpoint_statuses() {
                if let EndpointState::Unreachable(why) = &e.state {
                    let message = format!("endpoint {} of service {:?} cannot be reached: {why}", e.address, e.service);
                    out.push(match origins.get(&(&*e.service, e.id)) {
                        Some(o) => o.problem(message),
                        None => Problem::new(cfg.path.display().to_string(), "", message),
                    });
                }
            }
        }
    }
    out.extend(bird_problems(&loaded));
    if out.is_empty() {
        Ok(loaded)
    } else {
        Err(out)
    }
}

/// Has BIRD parse the configuration Sluice would give it (every VIP
/// announced), when gateway routers are configured and Sluice runs `bird`.
fn bird_problems(l: &sources::Loaded) -> Vec<Problem> {
    use crate::config::router::BirdMode;
    let r = &l.file.config.routing;
    let file = l.file.config.path.display().to_string();
    let (Some(id), false) = (r.router_id, r.routers.is_empty()) else { return Vec::new() };
    if r.bird.mode == BirdMode::External {
        return Vec::new();
    }
    if !r.bird.binary.is_file() {
        return vec![Problem::new(file, "bird.binary", format!("{} does not exist: install bird2 or set bird.binary", r.bird.binary.display()))];
    }
    let vips: Vec<std::net::IpAddr> = l.resolved.routes.iter().flat_map(|x| x.matches.vips.iter().map(|v| v.to_ip())).collect();
    let text = crate::routing::bird::render::render(id, &r.routers, &vips);
    let tmp = std::env::temp_dir().join(format!("sluice-check-{}.conf", std::process::id()));
    if let Err(e) = std::fs::write(&tmp, &text) {
        return vec![Problem::new(file, "gatewayRouters", format!("cannot write {} to have BIRD check it: {e}", tmp.display()))];
    }
    let out = std::process::Command::new(&r.bird.binary).arg("-p").arg("-c").arg(&tmp).output();
    let _ = std::fs::remove_file(&tmp);
    match out {
        Ok(o) if o.status.success() => Vec::new(),
        Ok(o) => vec![Problem::new(file, "gatewayRouters", format!("BIRD refuses the configuration Sluice generates: {}", String::from_utf8_lossy(&o.stderr).trim()))],
        Err(e) => vec![Problem::new(file, "bird.binary", format!("cannot run {}: {e}", r.bird.binary.display()))],
    }
}

/// Runs `sluice check`.
pub fn run(args: &CheckArgs) -> ExitCode {
    match problems(&args.config, args.started_with.as_deref()) {
        Ok(l) => {
            println!(
                "{}: ok: {} route(s), {} service(s), {} endpoint(s), {} port(s){}",
                args.config.display(),
                l.resolved.routes.len(),
                l.resolved.services.len(),
                l.resolved.endpoint_count(),
                l.file.config.ports.len(),
                if l.file.config.manifests.is_some() { ", manifests included" } else { "" }
            );
            if let Some(x) = &l.file.config.xds {
                println!(
                    "{}: xDS: services also from {} ({}, {}, node {:?}), not contacted by check",
                    args.config.display(),
                    x.server,
                    x.mode,
                    match &x.tls {
                        None => "plaintext",
                        Some(t) if t.client.is_some() => "mutual TLS",
                        Some(_) => "TLS",
                    },
                    x.node_id
                );
            }
            let r = &l.file.config.routing;
            if !r.routers.is_empty() {
                let names: Vec<String> = r.routers.iter().map(|x| format!("{} ({} via {}{})", x.router.name, x.router.address, x.kernel_interface, if x.router.bgp.bfd.switch { ", BFD" } else { "" })).collect();
                println!(
                    "{}: BGP: {} gateway router(s): {}; router ID {}; bird {:?} ({}), its configuration parses",
                    args.config.display(),
                    r.routers.len(),
                    names.join(", "),
                    r.router_id.map_or_else(|| "-".to_owned(), |i| i.to_string()),
                    r.bird.mode,
                    r.bird.socket.display()
                );
            }
            if let Some(k) = &l.file.config.kubernetes {
                println!(
                    "{}: Kubernetes: services also from Gateway {}/{} (class {}, {}), not contacted by check",
                    args.config.display(),
                    k.namespace,
                    k.gateway,
                    k.gateway_class,
                    k.kubeconfig.as_ref().map_or_else(|| "in-cluster".to_owned(), |p| format!("kubeconfig {}", p.display()))
                );
            }
            if let Some(s) = &l.file.config.siblings {
                let mut from: Vec<String> = s.peers.iter().map(ToString::to_string).collect();
                if s.kubernetes_pods {
                    from.push("the other pods of the Gateway's Deployment".to_owned());
                }
                println!("{}: siblings: listening on {}, sharing pins with {}", args.config.display(), s.listen, from.join(", "));
            }
            ExitCode::SUCCESS
        }
        Err(ps) => {
            for p in &ps {
                eprintln!("error: {p}");
            }
            eprintln!("{}: {} problem(s)", args.config.display(), ps.len());
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_refuses_what_a_reload_refuses_at_the_same_place() {
        let dir = std::env::temp_dir().join(format!("sluice-check-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = "ports: [{name: p, device: net_null0, addresses: [10.0.0.1/24]}]\nroutes: [{name: r, service: web, vips: [20.0.0.1]}]\nservices:\n  - name: web\n    endpoints:\n";
        let eps = |n: u32| -> String { (0..n).map(|i| format!("      - {{id: {i}, address: 10.0.0.{}}}\n", i + 10)).collect() };
        let (old, new) = (dir.join("old.yaml"), dir.join("new.yaml"));
        std::fs::write(&old, format!("capacity: {{endpoints: 2}}\n{base}{}", eps(2))).unwrap();
        std::fs::write(&new, format!("capacity: {{endpoints: 4}}\n{base}{}", eps(3))).unwrap();
        let text = |ps: Vec<Problem>| ps.iter().map(ToString::to_string).collect::<Vec<_>>();
        let n = new.display();
        assert!(problems(&new, None).is_ok(), "on its own, the new file starts");
        assert_eq!(text(problems(&new, Some(&old)).unwrap_err()), [format!(
            "{n}:1:23: capacity.endpoints: 2 -> 4 takes effect at restart: the running appliance keeps 2 (restart it, or put back 2 to reload the rest)"
        )]);
        std::fs::write(&new, format!("capacity: {{endpoints: 2}}\n{base}{}", eps(3))).unwrap();
        assert_eq!(text(problems(&new, Some(&old)).unwrap_err()), [format!(
            "{n}:1:23: capacity.endpoints: more than 2 endpoints: raise capacity.endpoints (it takes effect at restart)"
        )]);
        std::fs::write(&new, format!("capacity: {{endpoints: 2}}\n{base}{}", eps(1))).unwrap();
        assert!(problems(&new, Some(&old)).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
