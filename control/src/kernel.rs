//! The kernel side of the exception path: each port has a kernel interface
//! (a DPDK tap device) that carries the appliance's own addresses and the
//! port's MAC, so the kernel answers ARP/ND, speaks BGP and ICMP, and
//! resolves next hops. Sluice asks the kernel to keep every next hop it
//! uses resolved ("managed" neighbour entries) and reads the MACs back.
//!
//! All of it goes through iproute2 (`ip`), outside the fast path.

use std::collections::{HashMap, HashSet};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use sluice_dataplane::addr::Addr;

use crate::config::IfAddr;

fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip").args(args).output().context("running ip (iproute2 is needed for the exception path)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Formats a MAC.
pub fn mac_str(m: &[u8; 6]) -> String {
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    for (b, p) in m.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    Some(m)
}

/// Gives the kernel interface `name` the port's MAC, MTU and addresses, and
/// brings it up.
pub fn configure_interface(name: &str, mac: &[u8; 6], mtu: u16, addresses: &[IfAddr]) -> Result<()> {
    ip(&["link", "set", "dev", name, "down"])?;
    ip(&["link", "set", "dev", name, "address", &mac_str(mac), "mtu", &mtu.to_string()])?;
    ip(&["link", "set", "dev", name, "up"])?;
    for a in addresses {
        let mut args = vec!["addr", "replace"];
        let s = a.to_string();
        args.push(&s);
        args.extend(["dev", name]);
        if !a.addr.is_v4() {
            args.push("nodad");
        }
        ip(&args)?;
    }
    Ok(())
}

#[derive(Deserialize)]
struct Neigh {
    dst: String,
    dev: String,
    lladdr: Option<String>,
    #[serde(default)]
    state: Vec<String>,
}

/// The neighbour entries Sluice relies on.
#[derive(Debug, Default)]
pub struct NeighborTable {
    /// Kernel interface of each port index (empty: none).
    ifaces: Vec<String>,
    managed: HashSet<(u8, Addr)>,
}

impl NeighborTable {
    /// For ports whose kernel interfaces are `ifaces` (by port index).
    pub fn new(ifaces: Vec<String>) -> NeighborTable {
        NeighborTable { ifaces, managed: HashSet::new() }
    }

    /// Makes the kernel keep exactly `wanted` next hops resolved.
    pub fn sync(&mut self, wanted: &[(u8, Addr)]) -> Vec<String> {
        let mut errors = Vec::new();
        let want: HashSet<(u8, Addr)> = wanted.iter().copied().collect();
        for &(port, addr) in want.difference(&self.managed.clone()) {
            let Some(dev) = self.ifaces.get(usize::from(port)).filter(|d| !d.is_empty()) else { continue };
            match ip(&["neigh", "replace", &addr.to_string(), "dev", dev, "managed"]) {
                Ok(_) => {
                    self.managed.insert((port, addr));
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        for &(port, addr) in self.managed.clone().difference(&want) {
            if let Some(dev) = self.ifaces.get(usize::from(port)) {
                // Already gone is fine.
                let _ = ip(&["neigh", "del", &addr.to_string(), "dev", dev]);
            }
            self.managed.remove(&(port, addr));
        }
        errors
    }

    /// Resolved MACs on the ports' kernel interfaces.
    pub fn read(&self) -> Result<HashMap<(u8, Addr), [u8; 6]>> {
        let text = ip(&["-j", "neigh", "show"])?;
        let list: Vec<Neigh> = serde_json::from_str(&text).context("reading `ip -j neigh show`")?;
        let mut out = HashMap::new();
        for n in list {
            let Some(port) = self.ifaces.iter().position(|d| !d.is_empty() && *d == n.dev) else { continue };
            if n.state.iter().any(|s| s == "FAILED" || s == "INCOMPLETE") {
                continue;
            }
            let (Some(mac), Ok(addr)) = (n.lladdr.as_deref().and_then(parse_mac), n.dst.parse::<Addr>()) else { continue };
            out.insert((u8::try_from(port).unwrap_or(u8::MAX), addr), mac);
        }
        Ok(out)
    }

    /// Removes every managed entry (at shutdown).
    pub fn clear(&mut self) {
        self.sync(&[]);
    }
}
