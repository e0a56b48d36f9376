//! Where a single endpoint change spends its time with N services × E
//! endpoints, stage by stage, in this process (no DPDK, no network): the
//! xDS source's mapping of the changed cluster (`mapping::update`, next to
//! `mapping::build`, which looks at every cluster) and its desired state, the model's resolution, and the compiler, cold (a new compiler:
//! every table built) and warm (the same compiler after one endpoint of one
//! service changed: only that service is compiled again). The ratio warm /
//! cold is what the compiler's per-service cache saves; what remains of the
//! warm time is the pass over the unchanged services. Next to it, the path
//! of a change to endpoints only (`Model::set_endpoints`,
//! `Model::resolve_endpoints`, `Compiler::compile_changed`), checked to give
//! the same services as compiling everything.
//!
//!
//! It also reports the heap each layer of the initial load holds, all of
//! them kept alive as the appliance keeps them: the xDS resources as the
//! client decodes them, the mapping, the model (the source's desired
//! state), the resolved model, and the compiler (its per-service entries
//! and the snapshot, whose Maglev tables are counted apart). In bytes
//! (glibc's in-use count), so it does not depend on the host's speed.
//!
//! ```text
//! cargo run --release -p sluice-bench --example reconcile_scale -- \
//!     [--services 10000] [--endpoints 10] [--rounds 20] [--out bench/results/reconcile_scale.json]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation, clippy::cast_precision_loss)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use sluice::compile::{Compiler, Neighbors, TopoPort, Topology};
use sluice::config::IfAddr;
use sluice::model::{Defaults, Model};
use sluice::sources::xds::mapping::{build, update, Built, Cla, ClaState, EndpointsFrom, Health, L4Cluster, LbEndpoint};
use sluice_dataplane::addr::Addr;

fn arg(name: &str, default: usize) -> usize {
    let mut it = std::env::args();
    while let Some(a) = it.next() {
        if a == name {
            return it.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} needs a number"));
        }
    }
    default
}

fn out_path() -> Option<String> {
    let mut it = std::env::args();
    while let Some(a) = it.next() {
        if a == "--out" {
            return it.next();
        }
    }
    None
}

fn addr(i: usize) -> Addr {
    // 10.128.0.0/9: every endpoint on the port's subnet.
    Addr::from(std::net::Ipv4Addr::from(0x0a80_0000u32 + i as u32))
}

/// The neighbour table as the reconciler keeps it: numbered, so a
/// compilation under an unchanged number looks no MAC up again.
struct Macs(HashMap<(u8, Addr), [u8; 6]>);

impl Neighbors for Macs {
    fn mac(&self, port: u8, addr: Addr) -> Option<[u8; 6]> {
        self.0.get(&(port, addr)).copied()
    }

    fn epoch(&self) -> Option<u64> {
        Some(1)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Heap in use now, in bytes.
fn heap() -> i64 {
    i64::try_from(sluice_ffi::heap::in_use()).unwrap()
}

fn main() {
    let h_start = heap();
    let services = arg("--services", 10_000);
    let per = arg("--endpoints", 10);
    let rounds = arg("--rounds", 20).max(1);
    let defaults = Defaults::default();
    let mut clusters = BTreeMap::new();
    let mut clas = imbl::OrdMap::new();
    for s in 0..services {
        let name = format!("svc-{s:05}");
        clusters.insert(
            name.clone(),
            Arc::new(L4Cluster {
                name: name.clone(),
                endpoints: EndpointsFrom::Eds(name.clone()),
                vip: Addr::from(std::net::Ipv4Addr::from(0x1400_0000u32 + s as u32)),
                port: 80,
                protocol: 6,
                algorithm: None,
                table_size: None,
                limit: None,
                flow_table: None,
                delivery: None,
                check: None,
            }),
        );
        let endpoints = (0..per)
            .map(|e| LbEndpoint {
                address: addr(s * per + e),
                port: 80,
                weight: 1,
                health: Health::Serving,
                priority: 0,
                id: None,
                at: (0, e as u32),
            })
            .collect();
        clas.insert(name, ClaState::Known(Arc::new(Cla { endpoints })));
    }
    let h_resources = heap();
    let topo = Topology {
        ports: vec![TopoPort {
            name: "back".into(),
            mac: [2, 0, 0, 0, 0, 1],
            mtu: 1500,
            vlan: 0,
            addresses: vec![IfAddr { addr: "10.128.0.1".parse().unwrap(), prefix: 9 }],
        }],
        gateways: vec![],
    };
    // Every endpoint's MAC is known (as after ARP on a quiet segment).
    let macs = Macs((0..services * per).map(|i| ((0u8, addr(i)), [2, 1, 0, 0, 0, 1])).collect());

    let h_macs = heap();
    let t = Instant::now();
    let mut built = build(&clusters, &clas, &Built::default(), &defaults).unwrap();
    let h_mapping = heap();
    let mut model = Model::default();
    model.set("xds", built.desired());
    let h_model = heap();
    let resolved = model.resolve(&defaults).unwrap();
    let h_resolved = heap();
    let mut compiler = Compiler::new(services as u32 + 16, (services * per) as u32 + 16);
    let first = compiler.compile(&resolved, &topo, &macs).unwrap();
    let h_compiled = heap();
    let initial_s = t.elapsed().as_secs_f64();
    assert_eq!(first.rebuilt.len(), services);
    let tables: usize = first.snapshot.services.iter().filter_map(|s| s.table.as_ref()).map(|t| t.heap_bytes()).sum();
    let tables = i64::try_from(tables).unwrap();
    let mib = |b: i64| (b as f64 / f64::from(1u32 << 20) * 10.0).round() / 10.0;
    let per_endpoint = |b: i64| b / i64::try_from(services * per).unwrap();
    let layers = [
        ("xds_resources", h_resources - h_start),
        ("xds_mapping", h_mapping - h_macs),
        ("model", h_model - h_mapping),
        ("resolved", h_resolved - h_model),
        ("compiled_without_tables", h_compiled - h_resolved - tables),
        ("maglev_tables", tables),
    ];
    let total: i64 = layers.iter().map(|l| l.1).sum();
    let heap_mib: serde_json::Map<String, serde_json::Value> = layers.iter().map(|(k, v)| ((*k).to_owned(), json!(mib(*v)))).chain([("total".to_owned(), json!(mib(total)))]).collect();
    let heap_bytes_per_endpoint: serde_json::Map<String, serde_json::Value> =
        layers.iter().map(|(k, v)| ((*k).to_owned(), json!(per_endpoint(*v)))).chain([("total".to_owned(), json!(per_endpoint(total)))]).collect();
    // The path a change to endpoints only takes (the reconciler's
    // Endpoints message): the same start, kept apart.
    let mut model2 = model.clone();
    let mut resolved2 = resolved.clone();
    let mut compiler2 = Compiler::new(services as u32 + 16, (services * per) as u32 + 16);
    compiler2.compile(&resolved2, &topo, &macs).unwrap();
    let (mut t_eresolve, mut t_echange) = (vec![], vec![]);

    let (mut t_build, mut t_desired, mut t_resolve, mut t_warm, mut t_cold) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut t_build_all, mut t_build_reused) = (vec![], vec![]);
    for round in 0..rounds {
        // One endpoint of one service changes its weight.
        let victim = format!("svc-{:05}", (round * 7919) % services);
        if let Some(ClaState::Known(c)) = clas.get_mut(&victim) {
            // A new assignment, as a response brings (the old one is shared
            // with what is served).
            Arc::make_mut(c).endpoints[0].weight = 2 + round as u32;
        }
        // What the xDS client does with a response that changes one
        // assignment: the cluster that names it is looked at, no other.
        let t = Instant::now();
        let next = update(&built, [&victim], |n| clusters.get(n), &clas, &defaults).unwrap();
        t_build.push(t.elapsed().as_secs_f64());
        assert_eq!(next.mapped, 1, "only the changed cluster is mapped again");
        assert_eq!(next.changed, vec![victim.clone()]);
        if round < 3 {
            // The baselines: every cluster looked at, the others reused,
            // and every cluster mapped.
            let t = Instant::now();
            let reused = build(&clusters, &clas, &built, &defaults).unwrap();
            t_build_reused.push(t.elapsed().as_secs_f64());
            assert!(reused == next, "looking at every cluster gives the same state");
            let t = Instant::now();
            let all = build(&clusters, &clas, &Built::default(), &defaults).unwrap();
            t_build_all.push(t.elapsed().as_secs_f64());
            assert!(all.services == next.services, "reused services equal mapped ones");
        }
        built = next;
        let t = Instant::now();
        let desired = built.desired();
        t_desired.push(t.elapsed().as_secs_f64());
        model.set("xds", desired);
        let t = Instant::now();
        let resolved = model.resolve(&defaults).unwrap();
        t_resolve.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let warm = compiler.compile(&resolved, &topo, &macs).unwrap();
        t_warm.push(t.elapsed().as_secs_f64());
        assert_eq!(warm.rebuilt, vec![victim.clone()], "only the changed service is rebuilt");

        let t = Instant::now();
        model2.set_endpoints("xds", &victim, built.services[&victim].endpoints.clone()).unwrap();
        let eps = model2.resolve_endpoints(&resolved2.services[&victim]).unwrap();
        t_eresolve.push(t.elapsed().as_secs_f64());
        resolved2.services.get_mut(&victim).unwrap().endpoints = eps;
        let t = Instant::now();
        let changed = compiler2.compile_changed(&resolved2, std::slice::from_ref(&victim), &topo, &macs).unwrap();
        t_echange.push(t.elapsed().as_secs_f64());
        assert_eq!(changed.rebuilt, warm.rebuilt);
        assert!(changed.endpoints == warm.endpoints, "the same endpoints, counters and states as compiling everything");
        assert_eq!(format!("{:?}", changed.snapshot.services), format!("{:?}", warm.snapshot.services));
        if round < 3 {
            let t = Instant::now();
            let cold = Compiler::new(services as u32 + 16, (services * per) as u32 + 16).compile(&resolved, &topo, &macs).unwrap();
            t_cold.push(t.elapsed().as_secs_f64());
            assert_eq!(cold.rebuilt.len(), services);
        }
    }
    let ms = |v: &mut Vec<f64>| median(v) * 1e3;
    let (b, d, r, w, c) = (ms(&mut t_build), ms(&mut t_desired), ms(&mut t_resolve), ms(&mut t_warm), ms(&mut t_cold));
    let ba = ms(&mut t_build_all);
    let br = ms(&mut t_build_reused);
    let (er, ec) = (ms(&mut t_eresolve), ms(&mut t_echange));
    let result = json!({
        "bench": "reconcile_scale",
        "services": services,
        "endpoints_per_service": per,
        "rounds": rounds,
        "load_average": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        "initial_load_s": initial_s,
        "heap_mib_initial_load": heap_mib,
        "heap_bytes_per_endpoint_initial_load": heap_bytes_per_endpoint,
        "median_ms": {
            "xds_mapping_build": b,
            "xds_mapping_build_every_cluster_reused": br,
            "xds_mapping_build_every_cluster": ba,
            "xds_desired": d,
            "model_resolve": r,
            "compile_warm_one_change": w,
            "compile_cold_all_services": c,
            "endpoints_only_set_and_resolve": er,
            "endpoints_only_compile_changed": ec,
        },
        "single_change_total_ms": b + d + r + w,
        "single_change_endpoints_only_ms": b + er + ec,
        "ratio_endpoints_only_over_whole_state": (b + er + ec) / (b + d + r + w),
        "ratio_compile_warm_over_cold": w / c,
        "ratio_mapping_reused_over_every_cluster": br / ba,
        "ratio_mapping_changed_over_every_cluster_reused": b / br,
    });
    let text = serde_json::to_string_pretty(&result).unwrap();
    println!("{text}");
    if let Some(p) = out_path() {
        std::fs::write(p, text + "\n").unwrap();
    }
}
