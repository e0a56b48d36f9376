//! What the subsystems report, as the admin API's types
//! ([`sluice_admin_api`]) that `/status` is written from.
//!
//! The subsystems keep their own status types (they hold what the API does
//! not show, such as the configuration's xDS mode and the GatewayRouter
//! custom resource, and they change on their own schedule); each conversion
//! here takes its value apart field by field, so a field added to or
//! renamed in a subsystem's status does not compile until its place in the
//! API is decided.

use std::borrow::Cow;

use sluice_admin_api as api;

use super::state::{PortEntry, PortLoss, PortMeta, ServiceMeta};
use crate::ground::lock;
use crate::compile::{EndpointState, EndpointStatus};
use crate::reconcile::{RouteMeta, SourceStatus};
use crate::routing::bird::{BfdSession, BirdStatus, SessionStatus, VipState};
use crate::sources::kube::crd::{BfdSpec, BgpSpec, GatewayRouterSpec};
use crate::sources::kube::{KubeStatus, RefusedObject, RouterEntry};
use crate::sources::xds::status::{ConnectionState, Latency, Nack, TypeStatus};
use crate::sources::xds::XdsStatus;

/// A source's outcome.
pub(super) fn source(s: &SourceStatus) -> api::Source {
    let SourceStatus { accepted, at, trigger, problems, rebuilt, rebuilt_count, accepted_total, rejected_total } = s;
    api::Source {
        accepted: *accepted,
        at: *at,
        trigger: trigger.clone(),
        problems: problems.clone(),
        rebuilt: rebuilt.clone(),
        rebuilt_count: *rebuilt_count,
        accepted_total: *accepted_total,
        rejected_total: *rejected_total,
    }
}

/// A port: its description, its counters and its tap's, and its loss
/// below DPDK.
pub(super) fn port(p: &PortEntry) -> api::Port {
    let PortEntry { meta, port, tap, loss, kernel_settings_restored: _, exception_dropped: _ } = p;
    let PortMeta { name, device, driver, kernel_interface, mac, mtu } = meta;
    let PortLoss { below_dpdk, source, exact } = lock(loss).clone();
    let s = port.stats().unwrap_or_default();
    let k = tap.as_ref().and_then(|t| t.stats()).unwrap_or_default();
    api::Port {
        name: name.clone(),
        device: device.clone(),
        driver: driver.clone(),
        kernel_interface: kernel_interface.clone(),
        mac: mac.clone(),
        mtu: *mtu,
        link_up: port.link_up(),
        rx_packets: s.ipackets,
        tx_packets: s.opackets,
        rx_missed: s.imissed,
        rx_nombuf: s.rx_nombuf,
        lost_below_dpdk: api::PortLoss { below_dpdk, source, exact },
        kernel_rx_packets: k.ipackets,
        kernel_tx_packets: k.opackets,
    }
}

/// A service with its counts, borrowing its names.
pub(super) fn service(m: &ServiceMeta, packets: u64, bytes: u64) -> api::Service<'_> {
    // The counter slot is the server's own.
    let ServiceMeta { name, slot: _, algorithm, flow_table, limit, table_size, ready, check } = m;
    api::Service {
        name: Cow::Borrowed(name),
        algorithm: Cow::Borrowed(algorithm),
        flow_table: *flow_table,
        limit: *limit,
        table_size: *table_size,
        ready: *ready,
        packets,
        bytes,
        check: check.as_deref().map(Cow::Borrowed),
    }
}

/// A route, borrowed.
pub(super) fn route(r: &RouteMeta) -> api::Route<'_> {
    let RouteMeta { name, service, priority, vips } = r;
    api::Route { name: Cow::Borrowed(name), service: Cow::Borrowed(service), priority: *priority, vips: Cow::Borrowed(vips) }
}

/// An endpoint with its counts, borrowing its names; `port` is its output
/// port's name.
pub(super) fn endpoint<'a>(e: &'a EndpointStatus, port: Option<&'a str>, packets: u64, bytes: u64) -> api::Endpoint<'a> {
    // The port index, counter slot and next hop are the server's own.
    let EndpointStatus { service, id, address, weight, mac, port: _, state, counter: _, hop: _ } = e;
    let (state, reason) = match state {
        EndpointState::Ready => (api::EndpointState::Ready, None),
        EndpointState::Draining => (api::EndpointState::Draining, None),
        EndpointState::Unresolved => (api::EndpointState::Unresolved, None),
        EndpointState::Unreachable(why) => (api::EndpointState::Unreachable, Some(Cow::Borrowed(why.as_str()))),
    };
    api::Endpoint {
        service: Cow::Borrowed(service.as_str()),
        id: *id,
        address: address.to_ip(),
        weight: *weight,
        mac: mac.map(api::Mac),
        port: port.map(Cow::Borrowed),
        state,
        reason,
        packets,
        bytes,
    }
}

/// The xDS source's status.
pub(super) fn xds(s: XdsStatus) -> api::xds::Xds {
    let XdsStatus {
        server,
        mode,
        transport,
        node_id,
        state,
        connected_since,
        last_error,
        last_error_at,
        reconnects,
        types,
        nacks,
        last_nack,
        last_update,
        services,
        endpoints,
        warming,
        refused,
        ignored_clusters,
        to_live,
    } = s;
    let Latency { count, p50_us, p99_us, max_us } = to_live;
    api::xds::Xds {
        server,
        mode: match mode {
            crate::config::xds::Mode::Sotw => api::xds::Mode::Sotw,
            crate::config::xds::Mode::Delta => api::xds::Mode::Delta,
        },
        transport,
        node_id,
        state: match state {
            ConnectionState::Idle => api::xds::Connection::Idle,
            ConnectionState::Connecting => api::xds::Connection::Connecting,
            ConnectionState::Connected => api::xds::Connection::Connected,
            ConnectionState::Backoff => api::xds::Connection::Backoff,
            ConnectionState::Stopped => api::xds::Connection::Stopped,
        },
        connected_since,
        last_error,
        last_error_at,
        reconnects,
        types: types
            .into_iter()
            .map(|(url, t)| {
                let TypeStatus { version, nonce, resources, acks, nacks, repeated_nacks } = t;
                (url, api::xds::TypeStatus { version, nonce, resources, acks, nacks, repeated_nacks })
            })
            .collect(),
        nacks,
        last_nack: last_nack.map(|n| {
            let Nack { type_url, version, nonce, error, at } = n;
            api::xds::Nack { type_url, version, nonce, error, at }
        }),
        last_update,
        services,
        endpoints,
        warming,
        refused,
        ignored_clusters,
        to_live: api::xds::Latency { count, p50_us, p99_us, max_us },
    }
}

/// The BIRD driver's status.
pub(super) fn bird(s: BirdStatus) -> api::bird::Bird {
    let BirdStatus {
        mode,
        socket,
        config_file,
        connected,
        pid,
        version,
        starts,
        restarts,
        last_exit,
        error,
        configured,
        configure_failures,
        refused,
        refused_commands,
        configured_at,
        withdrawn_for_shutdown,
        sessions,
        bfd,
        vips,
        learned_gateways,
    } = s;
    let session = |s: SessionStatus| {
        let SessionStatus { router, protocol, neighbor, interface, state, bgp_state, info, since, bfd, bfd_state } = s;
        api::bird::Session { router, protocol, neighbor, interface, state, bgp_state, info, since, bfd, bfd_state }
    };
    let bfd_session = |s: BfdSession| {
        let BfdSession { address, interface, state, since } = s;
        api::bird::BfdSession { address, interface, state, since }
    };
    let vip = |v: VipState| {
        let VipState { vip, announced, reason, since } = v;
        api::bird::Vip { vip, announced, reason, since }
    };
    api::bird::Bird {
        mode,
        socket,
        config_file,
        connected,
        pid,
        version,
        starts,
        restarts,
        last_exit,
        error,
        configured,
        configure_failures,
        refused,
        refused_commands,
        configured_at,
        withdrawn_for_shutdown,
        sessions: sessions.into_iter().map(session).collect(),
        bfd: bfd.into_iter().map(bfd_session).collect(),
        vips: vips.into_iter().map(vip).collect(),
        learned_gateways,
    }
}

/// The Kubernetes source's status.
pub(super) fn kubernetes(s: KubeStatus) -> api::kubernetes::Kubernetes {
    let KubeStatus {
        gateway,
        namespace,
        connected,
        server_version,
        synced,
        waiting_for,
        watched,
        last_error,
        last_error_at,
        last_sync_at,
        last_applied_at,
        serving,
        not_served,
        refused,
        routers,
        status_writes,
        status_write_errors,
    } = s;
    let refused_object = |r: RefusedObject| {
        let RefusedObject { object, reason, message } = r;
        api::kubernetes::Refused { object, reason, message }
    };
    api::kubernetes::Kubernetes {
        gateway,
        namespace,
        connected,
        server_version,
        synced,
        waiting_for,
        watched,
        last_error,
        last_error_at,
        last_sync_at,
        last_applied_at,
        serving,
        not_served,
        refused: refused.into_iter().map(refused_object).collect(),
        routers: routers.into_iter().map(router).collect(),
        status_writes,
        status_write_errors,
    }
}

/// A GatewayRouter, with its spec as the custom resource has it.
fn router(r: RouterEntry) -> api::kubernetes::Router {
    let RouterEntry { name, spec: GatewayRouterSpec { address, interface, bgp } } = r;
    let bgp = bgp.map(|b| {
        let BgpSpec { local_asn, remote_asn, hold_time, local_port, remote_port, bfd } = b;
        let bfd = bfd.map(|b| {
            let BfdSpec { switch, min_tx, min_rx, multiplier } = b;
            api::kubernetes::Bfd { switch, min_tx: min_tx.map(|d| d.0), min_rx: min_rx.map(|d| d.0), multiplier }
        });
        api::kubernetes::Bgp { local_asn, remote_asn, hold_time: hold_time.map(|d| d.0), local_port, remote_port, bfd }
    });
    api::kubernetes::Router { name, spec: api::kubernetes::RouterSpec { address: address.0, interface, bgp } }
}

#[cfg(test)]
mod tests {
    //! Each conversion writes the JSON the subsystem's own type writes.

    use std::collections::BTreeMap;

    use super::*;
    use crate::sources::kube::crd::{GoDuration, IpAddress};

    fn same_json<A: serde::Serialize, B: serde::Serialize>(ours: &A, api: &B) {
        assert_eq!(serde_json::to_value(api).unwrap(), serde_json::to_value(ours).unwrap());
    }

    #[test]
    fn the_xds_status_is_written_as_the_source_writes_it() {
        let s = XdsStatus {
            server: "127.0.0.1:18000".into(),
            mode: crate::config::xds::Mode::Delta,
            transport: "mutual TLS".into(),
            node_id: "lb-1".into(),
            state: ConnectionState::Backoff,
            connected_since: Some(1_700_000_000),
            last_error: Some("connection refused".into()),
            last_error_at: Some(1_700_000_005),
            reconnects: 3,
            types: BTreeMap::from([(
                "type.googleapis.com/envoy.config.cluster.v3.Cluster".to_owned(),
                TypeStatus { version: "v7".into(), nonce: "n9".into(), resources: 12, acks: 7, nacks: 2, repeated_nacks: 1 },
            )]),
            nacks: 2,
            last_nack: Some(Nack { type_url: "t".into(), version: "v8".into(), nonce: "n8".into(), error: "bad".into(), at: 1_700_000_004 }),
            last_update: Some(1_700_000_003),
            services: 4,
            endpoints: 40,
            warming: vec!["w".into()],
            refused: vec!["r".into()],
            ignored_clusters: 1,
            to_live: Latency { count: 5, p50_us: 10, p99_us: 20, max_us: 30 },
        };
        same_json(&s, &xds(s.clone()));
        let back: api::xds::Xds = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(back, xds(s));
    }

    #[test]
    fn the_bird_status_is_written_as_the_driver_writes_it() {
        let s = BirdStatus {
            mode: "supervised".into(),
            socket: "/run/bird.ctl".into(),
            config_file: "/run/bird.conf".into(),
            connected: true,
            pid: Some(42),
            version: "BIRD 2.0.12".into(),
            starts: 2,
            restarts: 1,
            last_exit: Some("signal 9".into()),
            error: Some("e".into()),
            configured: 5,
            configure_failures: 1,
            refused: Some("syntax error".into()),
            refused_commands: 1,
            configured_at: Some(1_700_000_000),
            withdrawn_for_shutdown: true,
            sessions: vec![SessionStatus {
                router: "gw".into(),
                protocol: "gw_0".into(),
                neighbor: "10.0.0.1".into(),
                interface: "eth0".into(),
                state: "up".into(),
                bgp_state: "Established".into(),
                info: "".into(),
                since: "12:00:00".into(),
                bfd: true,
                bfd_state: Some("Up".into()),
            }],
            bfd: vec![BfdSession { address: "10.0.0.1".parse().unwrap(), interface: "eth0".into(), state: "Up".into(), since: "12:00:01".into() }],
            vips: vec![VipState { vip: "2001:db8::1".parse().unwrap(), announced: true, reason: "announced".into(), since: 1_700_000_001 }],
            learned_gateways: vec!["10.0.0.1".into()],
        };
        same_json(&s, &bird(s.clone()));
    }

    #[test]
    fn the_kubernetes_status_is_written_as_the_source_writes_it() {
        let spec = |bgp| GatewayRouterSpec { address: IpAddress("10.0.0.1".into()), interface: "eth0".into(), bgp };
        let bgp = BgpSpec {
            local_asn: Some(65001),
            remote_asn: Some(65002),
            hold_time: Some(GoDuration("24s".into())),
            local_port: Some(10179),
            remote_port: None,
            bfd: Some(BfdSpec { switch: Some(true), min_tx: Some(GoDuration("300ms".into())), min_rx: None, multiplier: Some(3) }),
        };
        let s = KubeStatus {
            gateway: "sllb-a".into(),
            namespace: "tenant-a".into(),
            connected: true,
            server_version: Some("v1.32.0".into()),
            synced: true,
            waiting_for: vec!["L34Route".into()],
            watched: BTreeMap::from([("Gateway".to_owned(), 1)]),
            last_error: Some("e".into()),
            last_error_at: Some(1),
            last_sync_at: Some(2),
            last_applied_at: Some(3),
            serving: "2 services".into(),
            not_served: vec!["GatewayRouter".into()],
            refused: vec![RefusedObject { object: "kubernetes: L34Route/tenant-a/r".into(), reason: "Conflicted".into(), message: "why".into() }],
            routers: vec![
                RouterEntry { name: "gw-a".into(), spec: spec(Some(bgp)) },
                RouterEntry { name: "gw-b".into(), spec: spec(Some(BgpSpec::default())) },
                RouterEntry { name: "gw-c".into(), spec: spec(None) },
            ],
            status_writes: 9,
            status_write_errors: 1,
        };
        same_json(&s, &kubernetes(s.clone()));
    }
}
