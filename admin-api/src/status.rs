//! The `/status` document and its tables.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `/status`: what the appliance does.
///
/// `Services`, `Routes` and `Endpoints` are its lists of [`Service`]s,
/// [`Route`]s and [`Endpoint`]s: vectors for a reader; for the server,
/// whatever writes those items as a sequence (it writes services and
/// endpoints as it reads them from its state rather than make a vector of
/// 100,000 first).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status<Services = Vec<Service<'static>>, Routes = Vec<Route<'static>>, Endpoints = Vec<Endpoint<'static>>> {
    /// The appliance's version.
    pub version: String,
    /// The DPDK version it runs on.
    pub dpdk: String,
    /// Its configuration file.
    pub config: String,
    /// Seconds since it started.
    pub uptime_seconds: f64,
    /// `not_healthy` is empty.
    pub healthy: bool,
    /// `not_ready` is empty.
    pub ready: bool,
    /// Why it is not healthy (empty when it is).
    pub not_healthy: Vec<String>,
    /// Why it is not ready (empty when it is).
    pub not_ready: Vec<String>,
    /// The snapshot generation published last (0: none yet).
    pub generation: u64,
    /// Seconds the last compilation and publication took.
    pub publish_seconds: f64,
    /// Snapshots replaced but not yet freed.
    pub snapshots_pending: usize,
    /// Next hops the kernel has not resolved yet.
    pub next_hops_unresolved: usize,
    /// What became of each source's last state, by source name.
    pub sources: BTreeMap<String, Source>,
    /// The xDS source, when it runs.
    pub xds: Option<crate::xds::Xds>,
    /// The BIRD driver, when gateway routers are configured.
    pub bird: Option<crate::bird::Bird>,
    /// The Kubernetes source, when it runs.
    pub kubernetes: Option<crate::kubernetes::Kubernetes>,
    /// Sibling sync, with a `siblings:` section.
    pub sync: Option<crate::sync::Sync>,
    /// Passive health (the endpoints' TCP handshakes), while it runs.
    pub health: Option<crate::health::Health>,
    /// Packet buffers in use.
    pub mbufs_in_use: u32,
    /// Packet buffers in the pool.
    pub mbufs: u32,
    /// The ports.
    pub ports: Vec<Port>,
    /// The workers.
    pub workers: Vec<Worker>,
    /// Packets dropped, by reason (the reasons that dropped any), summed
    /// over the workers.
    pub drops: Vec<(String, u64)>,
    /// What was received, balanced, dropped and lost over the last minute
    /// (absent from an appliance older than this field).
    #[serde(default)]
    pub last_minute: Option<LastMinute>,
    /// The services (or the one asked for).
    pub services: Services,
    /// The routes (or those of the service asked for).
    pub routes: Routes,
    /// The endpoints listed (all, or up to the number asked for).
    pub endpoints: Endpoints,
    /// Endpoints there are (of the service asked for, or in all).
    pub endpoints_total: usize,
    /// Endpoints left out of the list.
    pub endpoints_omitted: usize,
}

/// Totals over the last minute (or since the start, when it is younger),
/// from counters the appliance samples once a second: `sluice status`
/// prints them, and a dashboard's rates over a minute agree with them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LastMinute {
    /// Seconds the totals cover: 60, or less just after the start.
    pub seconds: f64,
    /// Packets the workers received from the ports.
    pub rx_packets: u64,
    /// Packets load-balanced to an endpoint.
    pub balanced: u64,
    /// Packets the workers dropped.
    pub drops: u64,
    /// Those drops by reason (the reasons that dropped any).
    pub drops_by_reason: Vec<(String, u64)>,
    /// Frames the ports lost before DPDK received them.
    pub lost_below_dpdk: u64,
    /// Frames the devices dropped for want of receive descriptors (DPDK `imissed`).
    pub rx_missed: u64,
    /// Receive failures for want of an mbuf.
    pub rx_nombuf: u64,
}

/// What the reconciler last did with a source's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    /// The source's last state is the one being served.
    pub accepted: bool,
    /// When it was last heard from (seconds since the epoch).
    pub at: u64,
    /// What made it send (file change, SIGHUP, start, ...).
    pub trigger: String,
    /// Why its last state was refused (empty when accepted).
    pub problems: Vec<String>,
    /// Services whose tables its last accepted change rebuilt (the first
    /// of them, in name order).
    pub rebuilt: Vec<String>,
    /// How many services that change rebuilt.
    pub rebuilt_count: usize,
    /// States accepted.
    pub accepted_total: u64,
    /// States refused.
    pub rejected_total: u64,
}

/// A port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    /// Its name in the configuration.
    pub name: String,
    /// The DPDK device.
    pub device: String,
    /// Its driver.
    pub driver: String,
    /// Its exception path's kernel interface ("" for none).
    pub kernel_interface: String,
    /// Its MAC address.
    pub mac: String,
    /// The IP MTU applied to the device.
    pub mtu: u16,
    /// The link is up; `None` when the device does not tell.
    pub link_up: Option<bool>,
    /// Frames received.
    pub rx_packets: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Frames the device dropped for want of receive descriptors.
    pub rx_missed: u64,
    /// Receive failures for want of packet buffers.
    pub rx_nombuf: u64,
    /// Frames lost before DPDK saw them.
    pub lost_below_dpdk: PortLoss,
    /// Frames its kernel interface received.
    pub kernel_rx_packets: u64,
    /// Frames its kernel interface sent.
    pub kernel_tx_packets: u64,
}

/// What a port lost before DPDK saw it, and where that figure comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortLoss {
    /// Frames lost below DPDK since start.
    pub below_dpdk: u64,
    /// Where the figure comes from: `imissed` (DPDK), a driver xstat name,
    /// `kernel:<iface>`, or `none` when nothing can tell.
    pub source: String,
    /// `below_dpdk` counts every frame lost up to the last sample; when
    /// false it is a lower bound.
    pub exact: bool,
}

/// A worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Worker {
    /// Its lcore.
    pub lcore: u32,
    /// Packets received.
    pub rx_packets: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Packets sent to an endpoint.
    pub balanced: u64,
    /// Packets returned towards a client.
    pub returned: u64,
    /// Packets handed to the kernel.
    pub exception: u64,
    /// Packets dropped.
    pub drops: u64,
    /// Polls that found packets.
    pub busy_polls: u64,
    /// Polls that found none.
    pub idle_polls: u64,
    /// Seconds spent in busy polls.
    pub busy_seconds: f64,
    /// Seconds spent in idle polls.
    pub idle_seconds: f64,
    /// Share of the recent time spent busy, in percent.
    pub busy_percent_recent: f64,
    /// Packets per busy poll.
    pub packets_per_busy_poll: f64,
    /// ICMP "too big" messages sent.
    pub icmp_too_big: u64,
    /// Packets fragmented.
    pub fragmented: u64,
    /// Fragments received.
    pub fragments: u64,
    /// Packets handed to another worker.
    pub steered_out: u64,
    /// Packets handed over by another worker.
    pub steered_in: u64,
    /// The snapshot generation it runs.
    pub generation: u64,
}

/// A service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service<'a> {
    /// Its name.
    pub name: Cow<'a, str>,
    /// Its balancing algorithm.
    pub algorithm: Cow<'a, str>,
    /// It keeps a flow table.
    pub flow_table: bool,
    /// Its endpoint limit.
    pub limit: u32,
    /// Its table's size.
    pub table_size: u32,
    /// At least one of its endpoints takes new flows.
    pub ready: bool,
    /// Packets it received.
    pub packets: u64,
    /// Bytes it received.
    pub bytes: u64,
    /// Its endpoints' active check, when it has one
    /// (`http/8080 GET /healthz every 500ms, timeout 300ms, rise 2, fall 3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Cow<'a, str>>,
}

/// A route.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route<'a> {
    /// Its name.
    pub name: Cow<'a, str>,
    /// The service it leads to.
    pub service: Cow<'a, str>,
    /// Its priority.
    pub priority: i32,
    /// Its VIPs.
    pub vips: Cow<'a, [IpAddr]>,
}

/// An endpoint of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint<'a> {
    /// Its service.
    pub service: Cow<'a, str>,
    /// Its id in the service.
    pub id: u32,
    /// Its address.
    pub address: IpAddr,
    /// Its weight.
    pub weight: u32,
    /// Its next hop's MAC address, once resolved.
    pub mac: Option<Mac>,
    /// The port it is reached through, once resolved.
    pub port: Option<Cow<'a, str>>,
    /// Whether it takes flows.
    pub state: EndpointState,
    /// Why it is unreachable (for [`EndpointState::Unreachable`]).
    pub reason: Option<Cow<'a, str>>,
    /// Packets sent to it.
    pub packets: u64,
    /// Bytes sent to it.
    pub bytes: u64,
}

/// Whether an endpoint takes flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndpointState {
    /// It takes new flows.
    Ready,
    /// It keeps its flows and takes no new one.
    Draining,
    /// Its next hop's MAC address is not known yet.
    Unresolved,
    /// No route leads to it.
    Unreachable,
}

impl EndpointState {
    /// Its name in the document.
    pub fn name(self) -> &'static str {
        match self {
            EndpointState::Ready => "ready",
            EndpointState::Draining => "draining",
            EndpointState::Unresolved => "unresolved",
            EndpointState::Unreachable => "unreachable",
        }
    }
}

impl fmt::Display for EndpointState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A MAC address, written `02:00:00:00:00:0a`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Mac(
    /// Its bytes, in the order they are written.
    pub [u8; 6],
);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

/// Text that is not six hexadecimal bytes separated by colons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MacError(
    /// The text.
    pub String,
);

impl fmt::Display for MacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a MAC address (six hexadecimal bytes separated by colons): {:?}", self.0)
    }
}

impl std::error::Error for MacError {}

impl std::str::FromStr for Mac {
    type Err = MacError;
    fn from_str(s: &str) -> Result<Mac, MacError> {
        let mut b = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut b {
            let p = parts.next().filter(|p| p.len() == 2 && p.bytes().all(|c| c.is_ascii_hexdigit())).ok_or_else(|| MacError(s.to_owned()))?;
            *byte = u8::from_str_radix(p, 16).map_err(|_| MacError(s.to_owned()))?;
        }
        match parts.next() {
            None => Ok(Mac(b)),
            Some(_) => Err(MacError(s.to_owned())),
        }
    }
}

impl Serialize for Mac {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Mac, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_is_written_and_read_as_text() {
        let m = Mac([2, 0, 0, 0xab, 0, 0x0a]);
        assert_eq!(serde_json::to_string(&m).unwrap(), "\"02:00:00:ab:00:0a\"");
        assert_eq!(serde_json::from_str::<Mac>("\"02:00:00:AB:00:0a\"").unwrap(), m);
        for bad in ["02:00:00:ab:00", "02:00:00:ab:00:0a:01", "02:00:00:ab:00:0g", "2:00:00:ab:00:0a", "+2:00:00:ab:00:0a", ""] {
            assert_eq!(bad.parse::<Mac>(), Err(MacError(bad.to_owned())), "{bad}");
        }
    }

    #[test]
    fn a_document_without_a_field_is_refused_and_one_with_more_is_read() {
        let st: Status = Status::default();
        let mut v = serde_json::to_value(&st).unwrap();
        v["added_later"] = serde_json::json!(1);
        assert_eq!(serde_json::from_value::<Status>(v.clone()).unwrap(), st);
        v.as_object_mut().unwrap().remove("generation");
        let e = serde_json::from_value::<Status>(v).unwrap_err().to_string();
        assert!(e.contains("missing field `generation`"), "{e}");
    }

    #[test]
    fn an_absent_value_is_null_and_reads_back_as_none() {
        let e = Endpoint {
            service: "web".into(),
            id: 1,
            address: "2001:db8::6".parse().unwrap(),
            weight: 2,
            mac: None,
            port: None,
            state: EndpointState::Unreachable,
            reason: Some("no route".into()),
            packets: 0,
            bytes: 0,
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!((&v["mac"], &v["port"], &v["state"], &v["address"]), (&serde_json::Value::Null, &serde_json::Value::Null, &serde_json::json!("unreachable"), &serde_json::json!("2001:db8::6")));
        assert_eq!(serde_json::from_value::<Endpoint>(v).unwrap(), e);
    }
}
