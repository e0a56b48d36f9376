//! The `xds-control-plane` section of the configuration file: where the
//! management server is, how to reach it (plaintext, TLS, mutual TLS),
//! how this appliance names itself to it, and which protocol variant to
//! speak. Checked like every other field: each problem with its file,
//! line, column and path.
//!
//! ```yaml
//! xds-control-plane:
//!   enabled: true
//!   server-address: "xds.example.com:9000"      # host:port, [v6]:port
//!   ca-cert-path: /etc/sluice/xds-ca.crt          # TLS when set
//!   client-cert-path: /etc/sluice/xds-client.crt  # mutual TLS: both or neither
//!   client-key-path: /etc/sluice/xds-client.key
//!   node-id: lb-1                                 # default: the host name
//!   node-cluster: sluice                          # default: sluice
//!   mode: sotw                                    # sotw (default) or delta
//! ```
//!
//! The certificate files are read and checked here only when the section
//! is enabled (a disabled section may point to files that are not there
//! yet); the source reads them again at every connection, so renewed
//! certificates are picked up without a restart.

use std::path::{Path, PathBuf};

use crate::config::node::Node;
use crate::problem::Problems;

use super::tls;

/// Which variant of the aggregated discovery service to speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// State of the world: every response carries every resource of its type.
    #[default]
    Sotw,
    /// Incremental: responses carry what changed and what was removed.
    Delta,
}

/// Why a value of the section was not understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum XdsValueError {
    /// A mode other than `sotw` or `delta`.
    #[error("unknown mode {0:?} (expected sotw or delta)")]
    UnknownMode(String),
    /// A server address written as a URL.
    #[error("{0:?} has a scheme: write host:port (TLS is used when ca-cert-path is set)")]
    Scheme(String),
    /// A server address that opens a bracket but is not `[IPv6]:port`.
    #[error("{0:?} is not [IPv6 address]:port")]
    NotBracketed(String),
    /// The host in brackets, which is not an IPv6 address.
    #[error("{0:?} is not an IPv6 address")]
    NotIpv6(String),
    /// A server address without a port.
    #[error("{0:?} has no port: write host:port")]
    NoPort(String),
    /// A server address with an IPv6 host not in brackets: the address,
    /// the host and the port as split at the last colon.
    #[error("{0:?}: write an IPv6 address in brackets, [{1}]:{2}")]
    Unbracketed(String, String, String),
    /// A host that is neither a host name nor an IPv4 address.
    #[error("{0:?} is neither a host name nor an IP address")]
    BadHost(String),
    /// A port that is not a number in 1-65535.
    #[error("{0:?} is not a port (1-65535)")]
    BadPort(String),
}

impl std::str::FromStr for Mode {
    type Err = XdsValueError;
    fn from_str(s: &str) -> Result<Mode, XdsValueError> {
        match s {
            "sotw" => Ok(Mode::Sotw),
            "delta" => Ok(Mode::Delta),
            other => Err(XdsValueError::UnknownMode(other.to_owned())),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Sotw => "sotw",
            Mode::Delta => "delta",
        })
    }
}

/// The management server's address: a host name or an IP address, and a port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerAddress {
    /// Host name, IPv4 address, or IPv6 address (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl ServerAddress {
    /// The URI the gRPC channel connects to.
    pub fn uri(&self, tls: bool) -> String {
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://{self}")
    }
}

/// `host:port`, with an IPv6 host in brackets.
impl std::fmt::Display for ServerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl std::str::FromStr for ServerAddress {
    type Err = XdsValueError;
    fn from_str(s: &str) -> Result<ServerAddress, XdsValueError> {
        let s = s.trim();
        if s.contains("://") {
            return Err(XdsValueError::Scheme(s.to_owned()));
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (h, p) = rest.split_once("]:").ok_or_else(|| XdsValueError::NotBracketed(s.to_owned()))?;
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(XdsValueError::NotIpv6(h.to_owned()));
            }
            (h, p)
        } else {
            let (h, p) = s.rsplit_once(':').ok_or_else(|| XdsValueError::NoPort(s.to_owned()))?;
            if h.contains(':') {
                return Err(XdsValueError::Unbracketed(s.to_owned(), h.to_owned(), p.to_owned()));
            }
            if h.parse::<std::net::Ipv4Addr>().is_err() && !host_name(h) {
                return Err(XdsValueError::BadHost(h.to_owned()));
            }
            (h, p)
        };
        let port = match p_u16(port) {
            Some(p) if p > 0 => p,
            _ => return Err(XdsValueError::BadPort(port.to_owned())),
        };
        Ok(ServerAddress { host: host.to_owned(), port })
    }
}

fn p_u16(s: &str) -> Option<u16> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A DNS host name: dot-separated labels of letters, digits and hyphens,
/// not starting or ending with a hyphen, at most 253 characters.
fn host_name(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.trim_end_matches('.').split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// The files of a TLS connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TlsPaths {
    /// The CA that signs the server's certificate (`ca-cert-path`).
    pub ca: PathBuf,
    /// This appliance's certificate chain and key, for mutual TLS
    /// (`client-cert-path`, `client-key-path`).
    pub client: Option<(PathBuf, PathBuf)>,
}

/// The `xds-control-plane` section, when enabled.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct XdsConfig {
    /// The management server.
    pub server: ServerAddress,
    /// TLS, when `ca-cert-path` is set; plaintext otherwise.
    pub tls: Option<TlsPaths>,
    /// Envoy `Node.id` (`node-id`): how the server tells appliances apart.
    pub node_id: String,
    /// Envoy `Node.cluster` (`node-cluster`).
    pub node_cluster: String,
    /// Protocol variant.
    pub mode: Mode,
}

/// Default `node-cluster`.
pub(crate) const DEFAULT_NODE_CLUSTER: &str = "sluice";

/// Longest `node-id` or `node-cluster`.
pub(crate) const NODE_NAME_MAX: usize = 253;

/// This machine's host name, the default `node-id` (`sluice` when it
/// cannot be read).
pub(crate) fn default_node_id() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned()).filter(|s| node_name(s)))
        .unwrap_or_else(|| "sluice".to_owned())
}

/// Printable ASCII without spaces, 1 to [`NODE_NAME_MAX`] long.
fn node_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= NODE_NAME_MAX && s.bytes().all(|b| b.is_ascii_graphic())
}

/// The `node-id` or `node-cluster` (`what`) at `c`, when it is a usable
/// Envoy node name.
fn node_field(c: Node<'_>, p: &mut Problems, what: &str) -> Option<String> {
    let s = c.string(p)?;
    if !node_name(&s) {
        c.bad(p, format!("{s:?} is not a {what} (printable ASCII without spaces, 1 to {NODE_NAME_MAX} characters)"));
        return None;
    }
    Some(s)
}

/// Parses the section at `n`; `base` is the configuration file's
/// directory (relative paths are from there). `None` when the section is
/// disabled or has problems (which are in `p`).
pub(crate) fn parse(n: Node<'_>, p: &mut Problems, base: &Path) -> Option<XdsConfig> {
    if !n.section(p) {
        return None;
    }
    let before = p.0.len();
    let enabled = n.required(p, "enabled", |n, p| n.boolean(p)).flatten().unwrap_or(false);
    let server = if enabled {
        n.required(p, "server-address", |n, p| n.parse::<ServerAddress>(p, "a server address")).flatten()
    } else {
        n.field("server-address", |n| n.parse::<ServerAddress>(p, "a server address")).flatten()
    };
    let mut path = |key: &str| n.field(key, |c| c.string(p).map(|s| base.join(s))).flatten();
    let (ca, cert, key) = (path("ca-cert-path"), path("client-cert-path"), path("client-key-path"));
    match (&cert, &key) {
        (Some(_), None) => n.field("client-cert-path", |c| c.bad(p, "client-cert-path is set without client-key-path: mutual TLS needs both")).unwrap_or(()),
        (None, Some(_)) => n.field("client-key-path", |c| c.bad(p, "client-key-path is set without client-cert-path: mutual TLS needs both")).unwrap_or(()),
        _ => {}
    }
    if ca.is_none() && (cert.is_some() || key.is_some()) {
        let k = if cert.is_some() { "client-cert-path" } else { "client-key-path" };
        n.field(k, |c| c.bad(p, "a client certificate needs ca-cert-path: TLS to the server is verified with that CA")).unwrap_or(());
    }
    let node_id = n.field("node-id", |c| node_field(c, p, "node id")).flatten();
    let node_cluster = n.field("node-cluster", |c| node_field(c, p, "node cluster")).flatten();
    let mode = n.field("mode", |c| c.parse::<Mode>(p, "a mode")).flatten().unwrap_or_default();

    let tls_paths = ca.map(|ca| TlsPaths { ca, client: cert.zip(key) });
    if enabled {
        if let Some(t) = &tls_paths {
            // Each file is reported at its own key.
            if let Err(e) = tls::read_ca(&t.ca) {
                n.field("ca-cert-path", |c| c.bad(p, e.to_string()));
            }
            if let Some((c, k)) = &t.client {
                match tls::read_identity(c, k) {
                    Ok(_) => {}
                    Err(e) => {
                        let key = if e.is_about_key() { "client-key-path" } else { "client-cert-path" };
                        n.field(key, |c| c.bad(p, e.to_string()));
                    }
                }
            }
        }
    }
    if !enabled || p.0.len() > before {
        return None;
    }
    Some(XdsConfig {
        server: server?,
        tls: tls_paths,
        node_id: node_id.unwrap_or_else(default_node_id),
        node_cluster: node_cluster.unwrap_or_else(|| DEFAULT_NODE_CLUSTER.to_owned()),
        mode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses() {
        let ok = |s: &str| s.parse::<ServerAddress>().map(|a| a.to_string());
        assert_eq!(ok("xds.example.com:9000").unwrap(), "xds.example.com:9000");
        assert_eq!(ok("127.0.0.1:18000").unwrap(), "127.0.0.1:18000");
        assert_eq!(ok("[::1]:18000").unwrap(), "[::1]:18000");
        assert_eq!("[2001:db8::1]:9".parse::<ServerAddress>().unwrap().uri(true), "https://[2001:db8::1]:9");
        assert!(ok("xds.example.com").unwrap_err().to_string().contains("no port"));
        assert!(ok("http://x:1").unwrap_err().to_string().contains("scheme"));
        assert!(ok("::1:9000").unwrap_err().to_string().contains("brackets"));
        assert!(ok("x:0").unwrap_err().to_string().contains("not a port"));
        assert!(ok("x:65536").unwrap_err().to_string().contains("not a port"));
        assert!(ok("bad_host:1").unwrap_err().to_string().contains("neither a host name"));
        assert!(ok("[nope]:1").unwrap_err().to_string().contains("not an IPv6 address"));
    }
}

#[cfg(test)]
mod file_tests {
    use std::path::Path;

    use crate::config::parse_str;

    const MACHINE: &str = "ports: [{name: p, device: net_null0, addresses: [10.0.0.1/24]}]\n";

    fn problems(text: &str) -> Vec<String> {
        parse_str(&format!("{MACHINE}{text}"), Path::new("c.yaml")).unwrap_err().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_section_is_parsed_with_defaults() {
        let c = parse_str(&format!("{MACHINE}xds-control-plane: {{enabled: true, server-address: \"127.0.0.1:18000\"}}\n"), Path::new("c.yaml")).unwrap();
        let x = c.xds.unwrap();
        assert_eq!(x.server.to_string(), "127.0.0.1:18000");
        assert_eq!((x.mode, x.tls.is_none(), x.node_cluster.as_str()), (super::Mode::Sotw, true, "sluice"));
        assert_eq!(x.node_id, super::default_node_id());
        let off = parse_str(&format!("{MACHINE}xds-control-plane: {{enabled: false, ca-cert-path: /nonexistent}}\n"), Path::new("c.yaml")).unwrap();
        assert!(off.xds.is_none(), "disabled: no source, files not read");
        let delta = format!("{MACHINE}xds-control-plane:\n  enabled: true\n  server-address: \"[::1]:9\"\n  node-id: lb-7\n  node-cluster: edge\n  mode: delta\n");
        let x = parse_str(&delta, Path::new("c.yaml")).unwrap().xds.unwrap();
        assert_eq!((x.node_id.as_str(), x.node_cluster.as_str(), x.mode), ("lb-7", "edge", super::Mode::Delta));
    }

    #[test]
    fn every_problem_is_reported_where_it_is_written() {
        let got = problems(
            "xds-control-plane:\n  enabled: true\n  server-address: \"xds.example.com\"\n  client-cert-path: /nonexistent/c.crt\n  mode: fast\n  node-id: \"a b\"\n  tls: on\n",
        );
        assert_eq!(got, [
            "c.yaml:8:3: xds-control-plane.tls: unknown field (known: enabled, server-address, ca-cert-path, client-cert-path, client-key-path, node-id, node-cluster, mode)",
            "c.yaml:4:19: xds-control-plane.server-address: \"xds.example.com\" is not a server address: \"xds.example.com\" has no port: write host:port",
            "c.yaml:5:21: xds-control-plane.client-cert-path: client-cert-path is set without client-key-path: mutual TLS needs both",
            "c.yaml:5:21: xds-control-plane.client-cert-path: a client certificate needs ca-cert-path: TLS to the server is verified with that CA",
            "c.yaml:7:12: xds-control-plane.node-id: \"a b\" is not a node id (printable ASCII without spaces, 1 to 253 characters)",
            "c.yaml:6:9: xds-control-plane.mode: \"fast\" is not a mode: unknown mode \"fast\" (expected sotw or delta)",
        ]);
        assert_eq!(problems("xds-control-plane: {enabled: true}\n"), ["c.yaml:2:20: xds-control-plane: missing field \"server-address\""]);
        let missing = problems("xds-control-plane: {enabled: true, server-address: \"x:1\", ca-cert-path: /nonexistent/ca.crt}\n");
        assert_eq!(missing.len(), 1);
        assert!(
            missing[0].starts_with("c.yaml:2:73: xds-control-plane.ca-cert-path: cannot read the CA certificate /nonexistent/ca.crt: No such file"),
            "{missing:?}"
        );
    }
}
