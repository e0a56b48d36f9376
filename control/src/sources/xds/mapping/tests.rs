use std::collections::{BTreeSet, HashMap};

use envoy_types::pb::envoy::config::cluster::v3::cluster::{EdsClusterConfig, MaglevLbConfig};
use envoy_types::pb::envoy::config::cluster::v3::load_balancing_policy::Policy;
use envoy_types::pb::envoy::config::cluster::v3::LoadBalancingPolicy;
use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress, TypedExtensionConfig};
use envoy_types::pb::envoy::config::endpoint::v3::{Endpoint, LbEndpoint as PbLbEndpoint, LocalityLbEndpoints};
use envoy_types::pb::google::protobuf::{UInt32Value, UInt64Value};

use super::*;

fn num(n: f64) -> Value {
    Value { kind: Some(Kind::NumberValue(n)) }
}

fn s(v: &str) -> Value {
    Value { kind: Some(Kind::StringValue(v.into())) }
}

fn md(fields: &[(&str, Value)]) -> Option<Metadata> {
    let st = Struct { fields: fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect() };
    Some(Metadata { filter_metadata: HashMap::from([(METADATA_KEY.to_owned(), st)]), ..Metadata::default() })
}

fn cluster(name: &str, vip: &str, port: f64, proto: &str) -> Cluster {
    Cluster {
        name: name.into(),
        metadata: md(&[("vip", s(vip)), ("port", num(port)), ("protocol", s(proto))]),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig { service_name: name.into(), ..EdsClusterConfig::default() }),
        ..Cluster::default()
    }
}

/// (address, port, health, priority, weight)
pub(crate) type Ep<'a> = (&'a str, u32, HealthStatus, u32, Option<u32>);

pub(crate) fn cla(name: &str, eps: &[Ep<'_>]) -> ClusterLoadAssignment {
    let mut by_prio: BTreeMap<u32, Vec<PbLbEndpoint>> = BTreeMap::new();
    for (a, port, h, prio, w) in eps {
        by_prio.entry(*prio).or_default().push(PbLbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: (*a).into(),
                        port_specifier: Some(PortSpecifier::PortValue(*port)),
                        ..SocketAddress::default()
                    })),
                }),
                ..Endpoint::default()
            })),
            health_status: *h as i32,
            load_balancing_weight: w.map(|value| UInt32Value { value }),
            ..PbLbEndpoint::default()
        });
    }
    ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints: by_prio
            .into_iter()
            .map(|(priority, lb_endpoints)| LocalityLbEndpoints { priority, lb_endpoints, ..LocalityLbEndpoints::default() })
            .collect(),
        ..ClusterLoadAssignment::default()
    }
}

pub(crate) fn healthy(a: &str) -> Ep<'_> {
    (a, 3306, HealthStatus::Healthy, 0, None)
}

fn l4(c: &Cluster) -> L4Cluster {
    decode_cluster(c).unwrap().unwrap()
}

fn errs(c: &Cluster) -> String {
    decode_cluster(c).err().map(|e| e.join("\n")).unwrap_or_default()
}

fn one(c: &Cluster, a: &ClusterLoadAssignment) -> MappedService {
    map_service(&l4(c), &decode_cla(a).unwrap(), &Defaults::default()).unwrap()
}

#[test]
fn the_seed_example_maps_to_a_service_a_route_and_endpoints() {
    let c = cluster("my-database-service", "10.1.2.3", 3306.0, "TCP");
    let a = cla("my-database-service", &[healthy("192.168.1.10"), healthy("192.168.1.11")]);
    let m = one(&c, &a);
    assert_eq!(m.service.name, "my-database-service");
    assert_eq!(m.service.limit, Some(Defaults::default().limit));
    assert_eq!(m.service.algorithm, None, "no lb_policy: the appliance default");
    assert_eq!(m.route.name, "my-database-service");
    assert_eq!(m.route.matches.vips, vec!["10.1.2.3".parse::<Addr>().unwrap()]);
    assert_eq!(m.route.matches.dst_ports, vec![PortRange::single(3306)]);
    assert_eq!(m.route.matches.protocols, vec![proto::TCP]);
    let addrs: BTreeSet<String> = m.endpoints.iter().map(|e| e.address.to_string()).collect();
    assert_eq!(addrs, BTreeSet::from(["192.168.1.10".to_owned(), "192.168.1.11".to_owned()]));
    assert!(m.endpoints.iter().all(|e| e.weight == 1 && !e.draining && &*e.service == "my-database-service"));
    assert_eq!(m.service.origin.to_string(), "xds: Cluster \"my-database-service\"");
}

#[test]
fn clusters_without_the_metadata_are_ignored_and_envoy_names_accepted() {
    let mut c = cluster("outbound|80||web.default", "2001:db8::10", 80.0, "udp");
    assert_eq!(l4(&c).protocol, proto::UDP);
    assert!(!l4(&c).vip.is_v4());
    c.metadata = None;
    assert_eq!(decode_cluster(&c).unwrap(), None);
    let mut other = cluster("x", "10.0.0.1", 1.0, "TCP");
    other.metadata.as_mut().unwrap().filter_metadata.insert("envoy.lb".into(), Struct::default());
    other.metadata.as_mut().unwrap().filter_metadata.remove(METADATA_KEY);
    assert_eq!(decode_cluster(&other).unwrap(), None);
    let mut sp = cluster("web tier", "10.0.0.1", 80.0, "TCP");
    assert!(errs(&sp).contains("\"web tier\" is not a usable service name"));
    sp.name = "a".repeat(254);
    assert!(errs(&sp).contains("is not a usable service name"));
}

#[test]
fn bad_metadata_is_refused_with_its_reason() {
    let bad = |vip: Value, port: Value, proto: Value| {
        let mut c = cluster("c", "10.0.0.1", 1.0, "TCP");
        c.metadata = md(&[("vip", vip), ("port", port), ("protocol", proto)]);
        errs(&c)
    };
    assert!(bad(s("10.0.0.300"), num(80.0), s("TCP")).contains("io.cilium.l4lb.vip: \"10.0.0.300\" is not an IP address"));
    assert!(bad(s("10.0.0.0/24"), num(80.0), s("TCP")).contains("is not a single address"));
    assert!(bad(s("2001:db8::/64"), num(80.0), s("TCP")).contains("is not a single address"));
    assert!(bad(s("::ffff:10.0.0.1"), num(80.0), s("TCP")).contains("IPv4-mapped"));
    let list = Value { kind: Some(Kind::ListValue(envoy_types::pb::google::protobuf::ListValue { values: vec![s("10.0.0.1")] })) };
    assert!(bad(list, num(80.0), s("TCP")).contains("vip: expected a string, found a list"));
    assert!(bad(s("10.0.0.1"), num(0.0), s("TCP")).contains("io.cilium.l4lb.port: 0 is out of range 1..=65535"));
    assert!(bad(s("10.0.0.1"), num(65536.0), s("TCP")).contains("port: 65536 is out of range"));
    assert!(bad(s("10.0.0.1"), num(80.5), s("TCP")).contains("port: 80.5 is not a whole number"));
    assert!(bad(s("10.0.0.1"), s("http"), s("TCP")).contains("port: \"http\" is not a whole number"));
    assert!(bad(s("10.0.0.1"), num(80.0), s("ICMP")).contains("unknown protocol \"ICMP\" (expected TCP, UDP or SCTP)"));
    assert_eq!(l4(&cluster("c", "10.0.0.1/32", 80.0, "sctp")).protocol, proto::SCTP);
    assert_eq!(bad(s("10.0.0.1"), s("80"), s("tcp")), "", "numbers may be strings, protocols any case");

    let mut typo = cluster("c", "10.0.0.1", 80.0, "TCP");
    let f = &mut typo.metadata.as_mut().unwrap().filter_metadata.get_mut(METADATA_KEY).unwrap().fields;
    f.insert("endpointlimit".into(), num(8.0));
    f.remove("protocol");
    let e = errs(&typo);
    assert!(e.contains("unknown key \"endpointlimit\" (did you mean \"endpointLimit\"?)"), "{e}");
    assert!(e.contains("missing key \"protocol\""), "{e}");
}

#[test]
fn optional_keys_and_native_lb_settings() {
    let mut c = cluster("c", "10.0.0.1", 80.0, "TCP");
    let f = &mut c.metadata.as_mut().unwrap().filter_metadata.get_mut(METADATA_KEY).unwrap().fields;
    f.insert("endpointLimit".into(), num(64.0));
    f.insert("flowTable".into(), Value { kind: Some(Kind::BoolValue(true)) });
    f.insert("delivery".into(), s("ipip"));
    c.lb_policy = LbPolicy::Maglev as i32;
    c.lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig { table_size: Some(UInt64Value { value: 65537 }) }));
    let m = l4(&c);
    assert_eq!((m.limit, m.flow_table, m.delivery), (Some(64), Some(true), Some(DeliveryMode::IpIp)));
    assert_eq!((m.algorithm, m.table_size), (Some(Algorithm::Maglev), Some(65537)));

    c.lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig { table_size: Some(UInt64Value { value: 65536 }) }));
    assert!(errs(&c).contains("Maglev table size 65536 is not a prime (the next prime is 65537)"));
    c.lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig { table_size: Some(UInt64Value { value: 1 << 40 }) }));
    assert!(errs(&c).contains("is above the largest, 16777213"));
    c.lb_config = None;
    c.lb_policy = LbPolicy::Random as i32;
    assert_eq!(l4(&c).algorithm, Some(Algorithm::Random));
    c.lb_policy = LbPolicy::LeastRequest as i32;
    assert_eq!(l4(&c).algorithm, None, "other policies take the default");

    // The typed-extension form of the same policies.
    let maglev = Maglev { table_size: Some(UInt64Value { value: 251 }), ..Maglev::default() };
    c.lb_policy = LbPolicy::LoadBalancingPolicyConfig as i32;
    c.load_balancing_policy = Some(LoadBalancingPolicy {
        policies: vec![Policy {
            typed_extension_config: Some(TypedExtensionConfig {
                name: "maglev".into(),
                typed_config: Some(envoy_types::pb::google::protobuf::Any {
                    type_url: Maglev::type_url(),
                    value: maglev.encode_to_vec(),
                }),
            }),
        }],
    });
    assert_eq!((l4(&c).algorithm, l4(&c).table_size), (Some(Algorithm::Maglev), Some(251)));

    let mut dns = cluster("c", "10.0.0.1", 80.0, "TCP");
    dns.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::StrictDns as i32));
    assert!(errs(&dns).contains("cluster type STRICT_DNS is not supported for an L4 service: use EDS or STATIC"));
    let mut st = cluster("s", "10.0.0.1", 80.0, "TCP");
    st.cluster_discovery_type = None;
    st.load_assignment = Some(cla("s", &[("10.0.0.9", 80, HealthStatus::Unknown, 0, Some(3))]));
    let m = l4(&st);
    assert_eq!(m.eds_name(), None);
    let EndpointsFrom::Inline(inline) = &m.endpoints else { panic!("inline") };
    assert_eq!(inline.endpoints[0].weight, 3);
}

#[test]
fn health_and_priority_choose_who_takes_new_flows() {
    use HealthStatus::*;
    let c = cluster("c", "10.0.0.1", 3306.0, "TCP");
    let get = |eps: &[Ep<'_>]| -> Vec<(String, bool)> {
        let m = one(&c, &cla("c", eps));
        let mut v: Vec<(String, bool)> = m.endpoints.iter().map(|e| (e.address.to_string(), e.draining)).collect();
        v.sort();
        v
    };
    let e = |a: &str, d: bool| (a.to_owned(), d);
    // Priority 0 serves; priority 1 waits; unhealthy and timed-out are out.
    assert_eq!(
        get(&[("10.0.0.2", 0, Healthy, 0, None), ("10.0.0.3", 0, Unknown, 0, None), ("10.0.0.4", 0, Unhealthy, 0, None), ("10.0.0.5", 0, Healthy, 1, None), ("10.0.0.6", 0, Timeout, 0, None)]),
        [e("10.0.0.2", false), e("10.0.0.3", false)]
    );
    // Priority 0 has no serving endpoint: priority 1 takes over.
    assert_eq!(get(&[("10.0.0.4", 0, Unhealthy, 0, None), ("10.0.0.5", 0, Healthy, 1, None), ("10.0.0.7", 0, Healthy, 2, None)]), [e("10.0.0.5", false)]);
    // Draining endpoints stay as draining, at any priority.
    assert_eq!(get(&[("10.0.0.2", 0, Healthy, 0, None), ("10.0.0.8", 0, Draining, 0, None), ("10.0.0.9", 0, Draining, 1, None)]), [
        e("10.0.0.2", false),
        e("10.0.0.8", true),
        e("10.0.0.9", true)
    ]);
    // Degraded: only when nothing serves anywhere, lowest priority first.
    assert_eq!(get(&[("10.0.0.2", 0, Degraded, 0, None), ("10.0.0.5", 0, Healthy, 1, None)]), [e("10.0.0.5", false)]);
    assert_eq!(get(&[("10.0.0.2", 0, Degraded, 1, None), ("10.0.0.3", 0, Degraded, 2, None), ("10.0.0.4", 0, Unhealthy, 0, None)]), [e("10.0.0.2", false)]);
    assert_eq!(get(&[("10.0.0.4", 0, Unhealthy, 0, None)]), []);
}

#[test]
fn identifiers_do_not_move_with_health_or_order() {
    use HealthStatus::*;
    let c = cluster("c", "10.0.0.1", 3306.0, "TCP");
    let eps: Vec<Ep<'_>> = (2..12).map(|i| (["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7", "10.0.0.8", "10.0.0.9", "10.0.0.10", "10.0.0.11"][i - 2], 0, Healthy, 0, None)).collect();
    let ids = |eps: &[Ep<'_>]| -> BTreeMap<String, u32> { one(&c, &cla("c", eps)).endpoints.iter().map(|e| (e.address.to_string(), e.id)).collect() };
    let all = ids(&eps);
    let mut rev = eps.clone();
    rev.reverse();
    assert_eq!(ids(&rev), all, "order does not matter");
    let mut sick = eps.clone();
    sick[3].2 = Unhealthy;
    sick[5].3 = 1;
    let some = ids(&sick);
    assert_eq!(some.len(), 8);
    assert!(some.iter().all(|(a, id)| all[a] == *id), "an unhealthy or standby endpoint moves no one");
}

#[test]
fn endpoints_are_checked() {
    let c = cluster("c", "10.0.0.1", 3306.0, "TCP");
    let fail = |eps: &[Ep<'_>]| match decode_cla(&cla("c", eps)) {
        Err(e) => e.join("\n"),
        Ok(cla) => map_service(&l4(&c), &cla, &Defaults::default()).unwrap_err().join("\n"),
    };
    assert!(fail(&[("db.example", 3306, HealthStatus::Healthy, 0, None)]).contains("\"db.example\" is not an IP address (host names are not resolved)"));
    assert!(fail(&[("10.0.0.2", 8080, HealthStatus::Healthy, 0, None)]).contains("port 8080 is not the service's port 3306"));
    assert!(fail(&[("10.0.0.2", 70000, HealthStatus::Healthy, 0, None)]).contains("port 70000 is out of range"));
    assert!(fail(&[("10.0.0.2", 3306, HealthStatus::Healthy, 0, Some(limits::WEIGHT_MAX + 1))]).contains("load_balancing_weight 1048577 is above the largest"));
    assert!(fail(&[("10.0.0.2", 3306, HealthStatus::Healthy, 0, None), ("10.0.0.2", 0, HealthStatus::Healthy, 1, None)])
        .contains("address 10.0.0.2 is also at endpoints[0].lb_endpoints[0]"));
    let many: Vec<String> = (0..33).map(|i| format!("10.0.1.{i}")).collect();
    let eps: Vec<Ep<'_>> = many.iter().map(|a| (a.as_str(), 0, HealthStatus::Unhealthy, 0, None)).collect();
    let e = fail(&eps);
    assert!(e.contains("33 endpoints are more than the service's endpoint limit of 32"), "unhealthy ones count too: {e}");
    let ok = one(&c, &cla("c", &[("2001:db8::2", 0, HealthStatus::Healthy, 0, Some(0)), ("10.0.0.2", 3306, HealthStatus::Healthy, 0, Some(7))]));
    let w: BTreeMap<String, u32> = ok.endpoints.iter().map(|e| (e.address.to_string(), e.weight)).collect();
    assert_eq!(w["10.0.0.2"], 7);
    assert_eq!(w.len(), 2, "IPv6 endpoints of an IPv4 VIP are the dataplane's business");

    // An identifier given in the endpoint's metadata.
    let mut a = cla("c", &[healthy("10.0.0.2"), healthy("10.0.0.3")]);
    a.endpoints[0].lb_endpoints[1].metadata = md(&[("id", num(17.0))]);
    let m = one(&c, &a);
    assert_eq!(m.endpoints.iter().find(|e| e.address.to_string() == "10.0.0.3").unwrap().id, 17);
    a.endpoints[0].lb_endpoints[1].metadata = md(&[("id", num(32.0))]);
    assert!(map_service(&l4(&c), &decode_cla(&a).unwrap(), &Defaults::default()).unwrap_err()[0].contains("identifier 32 is beyond the limit 32"));
    a.endpoints[0].lb_endpoints[1].metadata = md(&[("ident", num(3.0))]);
    assert!(decode_cla(&a).unwrap_err()[0].contains("unknown key \"ident\""));
}

/// The decoded assignment is kept for as long as it is served: it holds
/// room for its endpoints only (pushed one by one, 10 endpoints would take
/// room for 16).
#[test]
fn a_decoded_assignment_holds_room_for_its_endpoints_only() {
    let addrs: Vec<String> = (0..10).map(|i| format!("10.0.1.{i}")).collect();
    let mut eps: Vec<Ep<'_>> = addrs.iter().map(|a| healthy(a)).collect();
    eps[7].3 = 1; // two localities
    let d = decode_cla(&cla("c", &eps)).unwrap();
    assert_eq!(d.endpoints.len(), 10);
    assert_eq!(d.endpoints.capacity(), 10);
}

#[test]
fn build_warms_clusters_and_refuses_shared_vips() {
    let d = Defaults::default();
    let mut clusters = BTreeMap::new();
    clusters.insert("a".to_owned(), Arc::new(l4(&cluster("a", "10.0.0.1", 80.0, "TCP"))));
    let mut clas = OrdMap::new();
    let b = build(&clusters, &clas, &Built::default(), &d).unwrap();
    assert!(b.services.is_empty(), "a new cluster waits for its endpoints");
    assert_eq!(b.warming, OrdSet::unit("a".to_owned()));
    clas.insert("a".to_owned(), ClaState::Known(Arc::new(decode_cla(&cla("a", &[("10.0.0.5", 80, HealthStatus::Healthy, 0, None)])).unwrap())));
    let served = build(&clusters, &clas, &Built::default(), &d).unwrap();
    assert_eq!(served.services["a"].endpoints.len(), 1);
    assert!(served.warming.is_empty());

    // The cluster now names another assignment: the old definition stays
    // until the new one arrives.
    let mut moved = cluster("a", "10.0.0.1", 81.0, "TCP");
    moved.eds_cluster_config.as_mut().unwrap().service_name = "a2".into();
    clusters.insert("a".to_owned(), Arc::new(l4(&moved)));
    let kept = build(&clusters, &clas, &served, &d).unwrap();
    assert_eq!(kept.services["a"], served.services["a"]);
    assert_eq!(kept.warming, OrdSet::unit("a".to_owned()));
    // The server says it does not exist: the cluster goes in without endpoints.
    clas.insert("a2".to_owned(), ClaState::Absent);
    let empty = build(&clusters, &clas, &served, &d).unwrap();
    assert!(empty.services["a"].endpoints.is_empty());
    assert_eq!(empty.services["a"].key.1, 81);

    // Two clusters on one VIP, port and protocol: the first by name is
    // served, the other refused (no error: the rest is served).
    clusters.insert("b".to_owned(), Arc::new(l4(&cluster("b", "10.0.0.1", 81.0, "TCP"))));
    clas.insert("b".to_owned(), ClaState::Absent);
    let both = build(&clusters, &clas, &served, &d).unwrap();
    assert_eq!(both.services.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(both.refused.keys().collect::<Vec<_>>(), ["b"]);
    assert_eq!(both.refused["b"].by, "a");
    assert!(both.refused["b"].message.starts_with("Cluster \"b\": 10.0.0.1:81/TCP is already claimed by cluster \"a\""), "{:?}", both.refused);
    assert!(both.warming.is_empty(), "a refused cluster is not warming");
    clusters.insert("b".to_owned(), Arc::new(l4(&cluster("b", "10.0.0.1", 81.0, "UDP"))));
    let apart = build(&clusters, &clas, &both, &d).unwrap();
    assert_eq!(apart.services.len(), 2, "another protocol is another service");
    assert!(apart.refused.is_empty());
}

/// Of clusters that claim one VIP, port and protocol, the first by name is
/// served whatever came first, warm or not; the others are served again
/// as soon as they are the first of their claim.
#[test]
fn the_first_by_name_of_clusters_on_one_vip_is_served_whatever_came_first() {
    let d = Defaults::default();
    let known = |addr: &str| ClaState::Known(Arc::new(decode_cla(&cla("x", &[(addr, 80, HealthStatus::Healthy, 0, None)])).unwrap()));
    let mut clas = OrdMap::new();
    clas.insert("a".to_owned(), known("10.1.0.1"));
    clas.insert("b".to_owned(), known("10.1.0.2"));
    let a = Arc::new(l4(&cluster("a", "10.0.0.1", 80.0, "TCP")));
    let b = Arc::new(l4(&cluster("b", "10.0.0.1", 80.0, "TCP")));
    let names = ["a".to_owned(), "b".to_owned()];
    let only_b: BTreeMap<String, Arc<L4Cluster>> = [("b".to_owned(), b.clone())].into();
    let both: BTreeMap<String, Arc<L4Cluster>> = [("a".to_owned(), a.clone()), ("b".to_owned(), b.clone())].into();
    let only_a: BTreeMap<String, Arc<L4Cluster>> = [("a".to_owned(), a.clone())].into();
    // b first, then a: a takes the claim and b goes.
    let b_first = update(&Built::default(), &names[1..], |n| only_b.get(n), &clas, &d).unwrap();
    assert_eq!(b_first.services.keys().collect::<Vec<_>>(), ["b"]);
    let then_a = update(&b_first, &names[..1], |n| both.get(n), &clas, &d).unwrap();
    // a first, then b: b is refused.
    let a_first = update(&Built::default(), &names[..1], |n| only_a.get(n), &clas, &d).unwrap();
    let then_b = update(&a_first, &names[1..], |n| both.get(n), &clas, &d).unwrap();
    for (what, s) in [("b then a", &then_a), ("a then b", &then_b)] {
        assert_eq!(s.services.keys().collect::<Vec<_>>(), ["a"], "{what}");
        assert_eq!(s.refused.keys().collect::<Vec<_>>(), ["b"], "{what}");
        assert_eq!(s.endpoints(), 1, "{what}");
    }
    assert_eq!(then_a.services, then_b.services);
    // a warming (no assignment yet) still holds the claim.
    let mut no_a = clas.clone();
    no_a.remove("a");
    let warming = update(&b_first, &names[..1], |n| both.get(n), &no_a, &d).unwrap();
    assert!(warming.services.is_empty() && warming.warming.contains("a") && warming.refused.contains_key("b"), "{warming:?}");
    // a goes: b is served again.
    let gone = update(&then_b, &names[..1], |n| only_b.get(n), &clas, &d).unwrap();
    assert_eq!(gone.services.keys().collect::<Vec<_>>(), ["b"]);
    assert!(gone.refused.is_empty());
    assert_eq!(gone.services["b"].endpoints[0].address, "10.1.0.2".parse::<std::net::IpAddr>().unwrap().into());
}

#[test]
fn build_maps_again_only_what_changed() {
    let d = Defaults::default();
    let mut clusters = BTreeMap::new();
    let mut clas = OrdMap::new();
    for (n, vip) in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")] {
        clusters.insert(n.to_owned(), Arc::new(l4(&cluster(n, vip, 80.0, "TCP"))));
        let ep = cla(n, &[("10.1.0.5", 80, HealthStatus::Healthy, 0, None)]);
        clas.insert(n.to_owned(), ClaState::Known(Arc::new(decode_cla(&ep).unwrap())));
    }
    let first = build(&clusters, &clas, &Built::default(), &d).unwrap();
    assert_eq!(first.mapped, 3);

    // Nothing changed: every service is the same allocation.
    let again = build(&clusters, &clas, &first, &d).unwrap();
    assert_eq!(again.mapped, 0);
    assert!(again.services.iter().all(|(n, s)| Arc::ptr_eq(&s.mapped, &first.services[n].mapped)));

    // One assignment changes: that service only is mapped again.
    let ep = cla("b", &[("10.1.0.6", 80, HealthStatus::Healthy, 0, None)]);
    clas.insert("b".to_owned(), ClaState::Known(Arc::new(decode_cla(&ep).unwrap())));
    let one = build(&clusters, &clas, &again, &d).unwrap();
    assert_eq!(one.mapped, 1);
    assert_eq!(one.services["b"].endpoints[0].address, "10.1.0.6".parse::<std::net::IpAddr>().unwrap().into());
    assert!(Arc::ptr_eq(&one.services["a"].mapped, &first.services["a"].mapped));
    assert_ne!(one.services, again.services);

    // An equal assignment received again is another allocation: mapped
    // again, and equal to what was served (so nothing is sent on).
    let same = decode_cla(&ep).unwrap();
    clas.insert("b".to_owned(), ClaState::Known(Arc::new(same)));
    let resent = build(&clusters, &clas, &one, &d).unwrap();
    assert_eq!(resent.mapped, 1);
    assert_eq!(resent.services, one.services);

    // Other defaults: everything is mapped again (the endpoint limit may differ).
    let other = Defaults { limit: 64, ..d };
    let all = build(&clusters, &clas, &resent, &other).unwrap();
    assert_eq!(all.mapped, 3);
    assert_eq!(all.services["a"].service.limit, Some(64));
}

/// What the xDS client does with each response: only the clusters that
/// changed, or whose assignment changed, are looked at. Random edits
/// (clusters added, moved onto taken VIPs, removed; assignments received,
/// said absent, withdrawn) give the same state, the same changes and the
/// same refusals as building from every cluster.
#[test]
fn updating_the_changed_clusters_gives_what_building_everything_gives() {
    let d = Defaults::default();
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut clusters: BTreeMap<String, Arc<L4Cluster>> = BTreeMap::new();
    let mut clas: OrdMap<String, ClaState> = OrdMap::new();
    let mut prev = Built::default();
    let (mut accepted, mut refused, mut changes, mut conflicts) = (0, 0, 0, 0);
    for step in 0..600 {
        let (clusters_before, clas_before) = (clusters.clone(), clas.clone());
        let mut edited = BTreeSet::new();
        for _ in 0..1 + next() % 3 {
            // One edit per name, as a response names a resource once.
            let n = format!("c{}", next() % 12);
            if !edited.insert(n.clone()) {
                continue;
            }
            match next() % 6 {
                0 => {
                    clusters.remove(&n);
                }
                1 | 2 => {
                    // Few VIPs and ports: clusters collide now and then.
                    let vip = format!("10.0.0.{}", next() % 5);
                    let port = 80.0 + (next() % 3) as f64;
                    // An equal cluster is kept as it is held (as the client does).
                    let c = l4(&cluster(&n, &vip, port, "TCP"));
                    if clusters.get(&n).is_none_or(|held| **held != c) {
                        clusters.insert(n.clone(), Arc::new(c));
                    }
                }
                3 => {
                    clas.insert(n, ClaState::Absent);
                }
                4 => {
                    clas.remove(&n);
                }
                _ => {
                    let addrs: Vec<String> = (0..1 + next() % 3).map(|_| format!("10.1.0.{}", next() % 8)).collect();
                    let mut seen = BTreeSet::new();
                    let eps: Vec<Ep<'_>> =
                        addrs.iter().filter(|a| seen.insert(a.as_str())).map(|a| (a.as_str(), 0, HealthStatus::Healthy, 0, None)).collect();
                    let state = ClaState::Known(Arc::new(decode_cla(&cla(&n, &eps)).unwrap()));
                    if clas.get(&n) != Some(&state) {
                        clas.insert(n.clone(), state);
                    }
                }
            }
        }
        // What the client works out from the two states (each cluster
        // names the assignment of its own name here).
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for n in clusters_before.keys().chain(clusters.keys()) {
            if clusters_before.get(n) != clusters.get(n) {
                touched.insert(n.clone());
            }
        }
        for (n, _) in clas_before.diff(&clas).map(|d| match d {
            imbl::ordmap::DiffItem::Add(k, v) | imbl::ordmap::DiffItem::Remove(k, v) => (k, v),
            imbl::ordmap::DiffItem::Update { new, .. } => new,
        }) {
            touched.insert(n.clone());
        }
        let full = build(&clusters, &clas, &prev, &d);
        let changed = update(&prev, &touched, |n| clusters.get(n), &clas, &d);
        match (full, changed) {
            (Ok(f), Ok(c)) => {
                assert_eq!(f, c, "step {step}");
                // At most one service per VIP, port and protocol, the first
                // by name of the clusters claiming it.
                let mut keys = BTreeSet::new();
                for (n, svc) in &c.services {
                    assert!(keys.insert(svc.key), "step {step}: {n} shares {:?}", svc.key);
                    let first = clusters.iter().find(|(_, cl)| (cl.vip, cl.port, cl.protocol) == svc.key).map(|(n, _)| n);
                    assert!(first == Some(n) || c.warming.contains(n), "step {step}: {n} is served, {first:?} claims first");
                }
                conflicts += usize::from(!c.refused.is_empty());
                assert_eq!(c.endpoints(), c.services.values().map(|s| s.endpoints.len()).sum::<usize>(), "step {step}");
                accepted += 1;
                changes += c.changed.len();
                prev = c;
            }
            (Err(f), Err(c)) => {
                assert_eq!(f, c, "step {step}");
                refused += 1;
                (clusters, clas) = (clusters_before, clas_before);
            }
            (f, c) => panic!("step {step}: building everything gave {f:?}, updating {c:?}"),
        }
    }
    assert!(accepted > 200 && changes > 200 && conflicts > 20, "the walk covers every outcome: {accepted} accepted, {refused} refused, {changes} changes, {conflicts} with conflicts");
}

#[test]
fn health_checks_map_to_the_services_check_as_envoy_means_them() {
    use envoy_types::pb::envoy::config::core::v3::health_check::{payload, HealthChecker, HttpHealthCheck, Payload, TcpHealthCheck};
    use envoy_types::pb::envoy::config::core::v3::HealthCheck;
    use envoy_types::pb::envoy::r#type::v3::Int64Range;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;
    let with = |mut c: Cluster, checker: HealthChecker| {
        c.health_checks = vec![HealthCheck {
            interval: Some(PbDuration { seconds: 1, nanos: 0 }),
            timeout: Some(PbDuration { seconds: 5, nanos: 0 }),
            health_checker: Some(checker),
            ..HealthCheck::default()
        }];
        c
    };
    // Envoy's half-open status ranges; a timeout past the interval is cut.
    let http = HttpHealthCheck { path: "/ready".into(), expected_statuses: vec![Int64Range { start: 200, end: 204 }], ..HttpHealthCheck::default() };
    let c = l4(&with(cluster("web", "20.0.0.1", 80.0, "TCP"), HealthChecker::HttpHealthCheck(http.clone()))).check.unwrap();
    assert_eq!(c.probe, Probe::Http { path: "/ready".into(), host: None, statuses: vec![(200, 203)], tls: false });
    assert_eq!((c.port, c.interval_ms, c.timeout_ms, c.rise, c.fall), (80, 1000, 1000, 2, 3));
    // A range that ends at i64::MIN is refused, not an overflow.
    let bad = HttpHealthCheck { expected_statuses: vec![Int64Range { start: 200, end: i64::MIN }], ..http.clone() };
    assert!(errs(&with(cluster("web", "20.0.0.1", 80.0, "TCP"), HealthChecker::HttpHealthCheck(bad))).contains("is empty or out of range"));
    // On a UDP service: a TCP check's payloads are a datagram and its answer (text is hex).
    let hex = |t: &str| Some(Payload { payload: Some(payload::Payload::Text(t.into())) });
    let udp = TcpHealthCheck { send: hex("70696e67"), receive: vec![hex("706f6e67").unwrap()], ..TcpHealthCheck::default() };
    let c = l4(&with(cluster("dns", "20.0.0.1", 53.0, "UDP"), HealthChecker::TcpHealthCheck(udp.clone()))).check.unwrap();
    assert_eq!(c.probe, Probe::Udp { send: b"ping".to_vec(), expect: b"pong".to_vec() });
    // Refused: payloads on TCP, HTTP on UDP, text that is not hex.
    assert!(errs(&with(cluster("web", "20.0.0.1", 80.0, "TCP"), HealthChecker::TcpHealthCheck(udp.clone()))).contains("with payloads is not supported"));
    assert!(errs(&with(cluster("dns", "20.0.0.1", 53.0, "UDP"), HealthChecker::HttpHealthCheck(http))).contains("an HTTP check of a UDP service"));
    let not_hex = TcpHealthCheck { send: hex("ping"), ..udp };
    assert!(errs(&with(cluster("dns", "20.0.0.1", 53.0, "UDP"), HealthChecker::TcpHealthCheck(not_hex))).contains("is not hex"));
}

#[test]
fn an_http_check_runs_over_tls_where_the_clusters_transport_socket_is_tls() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch;
    use envoy_types::pb::envoy::config::core::v3::health_check::{HealthChecker, HttpHealthCheck};
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::config::core::v3::{HealthCheck, TransportSocket};
    use envoy_types::pb::google::protobuf::Any;
    let tls_of = |c: &Cluster| match l4(c).check.unwrap().probe {
        Probe::Http { tls, .. } => tls,
        p => panic!("{p:?}"),
    };
    let mut c = cluster("web", "20.0.0.1", 443.0, "TCP");
    let check = HealthCheck { health_checker: Some(HealthChecker::HttpHealthCheck(HttpHealthCheck::default())), ..HealthCheck::default() };
    c.health_checks = vec![check.clone()];
    assert!(!tls_of(&c), "no transport socket: plain text");
    let tls = TransportSocket { name: "envoy.transport_sockets.tls".into(), config_type: None };
    c.transport_socket = Some(tls.clone());
    assert!(tls_of(&c), "the cluster's TLS socket");
    let by_type = TransportSocket {
        name: "tls".into(),
        config_type: Some(ConfigType::TypedConfig(Any { type_url: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext".into(), value: vec![] })),
    };
    c.transport_socket = Some(by_type);
    assert!(tls_of(&c), "a socket whose config is an UpstreamTlsContext");
    // Criteria pick a socket among the matches: plain text for the check
    // of a TLS cluster; none matching, the cluster's.
    let raw = TransportSocket { name: "envoy.transport_sockets.raw_buffer".into(), config_type: None };
    c.transport_socket_matches = vec![TransportSocketMatch { name: "plain".into(), r#match: Some(Struct { fields: [("hc".to_owned(), s("plain"))].into() }), transport_socket: Some(raw) }];
    c.health_checks = vec![HealthCheck { transport_socket_match_criteria: Some(Struct { fields: [("hc".to_owned(), s("plain"))].into() }), ..check.clone() }];
    assert!(!tls_of(&c));
    c.health_checks = vec![HealthCheck { transport_socket_match_criteria: Some(Struct { fields: [("hc".to_owned(), s("other"))].into() }), ..check }];
    assert!(tls_of(&c));
}

#[test]
fn a_custom_dns_checker_is_a_dns_query() {
    use envoy_types::pb::envoy::config::core::v3::health_check::custom_health_check::ConfigType;
    use envoy_types::pb::envoy::config::core::v3::health_check::{CustomHealthCheck, HealthChecker};
    use envoy_types::pb::envoy::config::core::v3::HealthCheck;
    use envoy_types::pb::google::protobuf::{Any, StringValue};
    let with = |name: &str, config_type: Option<ConfigType>| {
        let mut c = cluster("dns", "20.0.0.1", 53.0, "UDP");
        let custom = CustomHealthCheck { name: name.into(), config_type };
        c.health_checks = vec![HealthCheck { health_checker: Some(HealthChecker::CustomHealthCheck(custom)), ..HealthCheck::default() }];
        c
    };
    assert_eq!(l4(&with(DNS_CHECKER, None)).check.unwrap().probe, Probe::Dns { name: ".".into() });
    let name = |v: &str| Some(ConfigType::TypedConfig(Any { type_url: StringValue::type_url(), value: StringValue { value: v.into() }.encode_to_vec() }));
    assert_eq!(l4(&with(DNS_CHECKER, name("health.example"))).check.unwrap().probe, Probe::Dns { name: "health.example".into() });
    assert!(errs(&with(DNS_CHECKER, name("not a name"))).contains("is not a DNS name"));
    let other = Some(ConfigType::TypedConfig(Any { type_url: "type.googleapis.com/google.protobuf.Struct".into(), value: vec![] }));
    assert!(errs(&with(DNS_CHECKER, other)).contains("where a google.protobuf.StringValue"));
    assert!(errs(&with("envoy.health_checkers.redis", None)).contains("custom check \"envoy.health_checkers.redis\" is not supported"));
}
