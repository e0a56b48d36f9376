//! Loss below DPDK: frames a port's device received but DPDK never saw.
//!
//! For NICs this is DPDK's `imissed` (no free receive descriptor). Virtual
//! devices that sit on a kernel interface (`net_af_packet`, `net_af_xdp`)
//! lose frames in the kernel's receive ring, which their drivers do not
//! count; there the kernel interface's own receive counter is compared
//! with what DPDK received from it. The kernel counter is read first and
//! DPDK's a moment later, so frames still in flight in the ring are not
//! counted as lost; the figure only grows (it is a counter) and is exact
//! once the port is quiet.

use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use crate::admin::state::{lock, PortLoss, Shared};
use crate::config::PortConfig;
use crate::routing::link_counters;

/// How long after reading the kernel's counter DPDK's is read.
const SETTLE: Duration = Duration::from_millis(20);

/// The kernel interface a virtual device reads from (`iface=` argument of
/// net_af_packet and net_af_xdp).
pub fn kernel_iface(p: &PortConfig) -> Option<String> {
    let name = p.device_name();
    if !(name.starts_with("net_af_packet") || name.starts_with("net_af_xdp")) {
        return None;
    }
    p.device.split(',').skip(1).find_map(|kv| kv.strip_prefix("iface=")).map(str::to_owned)
}

#[derive(Debug)]
struct Tracked {
    iface: Option<String>,
    /// (kernel rx, DPDK rx) at the first sample.
    base: Option<(u64, u64)>,
}

/// Refreshes every port's [`PortLoss`] in the shared state.
#[derive(Debug)]
pub struct LossSampler {
    shared: Arc<Shared>,
    ports: Vec<Tracked>,
    netlink: rtnetlink::Handle,
}

impl LossSampler {
    /// A sampler for `ports` (in the order of `shared.ports`).
    pub fn new(shared: Arc<Shared>, ports: &[PortConfig], netlink: rtnetlink::Handle) -> LossSampler {
        let ports = ports.iter().map(|p| Tracked { iface: kernel_iface(p), base: None }).collect();
        LossSampler { shared, ports, netlink }
    }

    /// Takes one sample of every port.
    pub async fn sample(&mut self) {
        let mut kernel = Vec::with_capacity(self.ports.len());
        for t in &self.ports {
            let k = match &t.iface {
                // Frames the interface took in, delivered or dropped before
                // reaching the af_packet/af_xdp socket.
                Some(i) => link_counters(&self.netlink, i).await.ok().map(|c| c.rx_packets + c.rx_dropped),
                None => None,
            };
            kernel.push(k);
        }
        tokio::time::sleep(SETTLE).await;
        for ((t, entry), k) in self.ports.iter_mut().zip(&self.shared.ports).zip(kernel) {
            let Some(d) = entry.port.stats() else { continue };
            let next = match (&t.iface, k) {
                (Some(iface), Some(krx)) => {
                    let (k0, d0) = *t.base.get_or_insert((krx, d.ipackets));
                    let lost = krx.saturating_sub(k0).saturating_sub(d.ipackets.saturating_sub(d0));
                    PortLoss { below_dpdk: lost + d.imissed, source: format!("kernel:{iface}") }
                }
                (Some(iface), None) => {
                    debug!(%iface, "kernel counters unavailable; falling back to imissed");
                    PortLoss { below_dpdk: d.imissed, source: "imissed".into() }
                }
                (None, _) => PortLoss { below_dpdk: d.imissed, source: "imissed".into() },
            };
            let mut cur = lock(&entry.loss);
            if next.below_dpdk >= cur.below_dpdk || next.source != cur.source {
                *cur = next;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str) -> PortConfig {
        PortConfig { name: "p".into(), device: device.into(), addresses: vec![], mtu: 1500, kernel_interface: String::new() }
    }

    #[test]
    fn kernel_interfaces_of_virtual_devices() {
        assert_eq!(kernel_iface(&port("net_af_packet0,iface=lbf,qpairs=2")).as_deref(), Some("lbf"));
        assert_eq!(kernel_iface(&port("net_af_xdp1,iface=eth3")).as_deref(), Some("eth3"));
        assert_eq!(kernel_iface(&port("net_null0")), None);
        assert_eq!(kernel_iface(&port("0000:3b:00.0")), None);
    }
}
