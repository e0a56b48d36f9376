//! The `siblings:` section: the other appliances serving the same VIPs,
//! with which this one shares the flow pins a table change makes necessary
//! ([`crate::sync`]). Absent: nothing is shared and nothing waits.
//!
//! ```yaml
//! siblings:
//!   listen: 192.0.2.1:7946         # where siblings connect to take our pins
//!   peers: [192.0.2.2:7946]        # the siblings' listen addresses
//!   kubernetesPods: false          # also the other pods of the Gateway's Deployment
//!   keyFile: /etc/sluice/sync.key  # the shared key: at least 32 bytes
//!   startupWaitMs: 5000            # optional: longest wait for their pins at start
//!   maxRecordsPerSecond: 200000    # optional: per sibling, both ways
//!   gate: false                    # optional: withdraw the VIPs of a service whose
//!                                  # table differs from the siblings' majority
//! ```
//!
//! `peers`, `kubernetesPods` or both: with `kubernetesPods: true` (and a
//! `kubernetes:` section) the siblings are also the pods labelled
//! `sluice.io/gateway=<kubernetes.gateway>` in `kubernetes.namespace` (the
//! pods of the Gateway's Deployment), each at its pod IP and `listen`'s
//! port, followed as pods come and go; the appliance's own pod is left out
//! by its name (`POD_NAME`, else the host name) and its IP (`POD_IP`, else
//! `listen`'s address when it is not a wildcard).
//!
//! The key file is read here, so that `sluice check` reports a missing or
//! short key at its place in the file.

// Integers are range-checked by `Node::int` before any narrowing cast.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::fields;
use super::node::Node;
use crate::problem::Problems;

/// Fewest bytes of a shared key (HMAC-SHA256's block of security).
pub(crate) const MIN_KEY_BYTES: usize = 32;
/// Most bytes of a key file read.
pub(crate) const MAX_KEY_BYTES: u64 = 4096;
/// Bounds of `startupWaitMs`: a start is never held longer than a minute.
pub(crate) const STARTUP_WAIT_MS: (i64, i64) = (0, 60_000);
/// Bounds of `maxRecordsPerSecond`.
pub(crate) const RECORDS_PER_SECOND: (i64, i64) = (100, 10_000_000);
/// Most peers.
pub(crate) const MAX_PEERS: usize = 64;

/// The shared key; its bytes are never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedKey(pub Vec<u8>);

impl fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedKey({} bytes)", self.0.len())
    }
}

/// The `siblings:` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiblingsConfig {
    /// Where siblings connect to take this appliance's pins.
    pub listen: SocketAddr,
    /// The siblings' listen addresses.
    pub peers: Vec<SocketAddr>,
    /// Whether the other pods of the Kubernetes Gateway's Deployment are
    /// siblings too (`kubernetesPods`).
    pub kubernetes_pods: bool,
    /// The key file (relative paths are from the configuration file).
    pub key_file: PathBuf,
    /// Its content.
    pub key: SharedKey,
    /// Longest wait at start for every reachable sibling's pins before the
    /// VIPs are announced anyway.
    pub startup_wait_ms: u32,
    /// Records per second taken from (and sent to) each sibling; more are
    /// dropped and counted.
    pub max_records_per_second: u32,
    /// A service whose table differs from the majority of the reachable
    /// siblings' has its VIPs withdrawn until it agrees.
    pub gate: bool,
}

/// Checks an `address:port`.
fn address(n: Node<'_>, p: &mut Problems) -> Option<SocketAddr> {
    let s = n.string(p)?;
    let host = s.trim().strip_prefix('[').and_then(|h| h.split_once(']')).map_or("", |(h, _)| h);
    if let Some(why) = fields::mapped_v4(host) {
        n.bad(p, why);
        return None;
    }
    n.parse::<SocketAddr>(p, "an address:port (192.0.2.2:7946, [2001:db8::2]:7946)")
}

/// Why the key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    /// It cannot be opened or read.
    #[error("cannot read the key file {path}: {source}")]
    Read {
        /// The key file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It is larger than [`MAX_KEY_BYTES`].
    #[error("the key file {path} is larger than {MAX_KEY_BYTES} bytes")]
    TooLarge {
        /// The key file.
        path: PathBuf,
    },
    /// The key is shorter than [`MIN_KEY_BYTES`].
    #[error("the key in {path} is {len} bytes: a shared key has at least {MIN_KEY_BYTES} (e.g. `head -c 32 /dev/urandom | base64 > {path}`)")]
    TooShort {
        /// The key file.
        path: PathBuf,
        /// Bytes of the key, without its trailing newline.
        len: usize,
    },
}

/// Reads the key file, checked: readable, at most [`MAX_KEY_BYTES`], at
/// least [`MIN_KEY_BYTES`] once a trailing newline is taken off.
pub(crate) fn read_key(path: &Path) -> Result<SharedKey, KeyError> {
    use std::io::Read;
    let unreadable = |source| KeyError::Read { path: path.to_owned(), source };
    let f = std::fs::File::open(path).map_err(unreadable)?;
    let mut buf = Vec::new();
    f.take(MAX_KEY_BYTES + 1).read_to_end(&mut buf).map_err(unreadable)?;
    if buf.len() as u64 > MAX_KEY_BYTES {
        return Err(KeyError::TooLarge { path: path.to_owned() });
    }
    while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        buf.pop();
    }
    if buf.len() < MIN_KEY_BYTES {
        return Err(KeyError::TooShort { path: path.to_owned(), len: buf.len() });
    }
    Ok(SharedKey(buf))
}

/// Checks the section; `path` is the configuration file's.
pub(crate) fn parse(n: Node<'_>, p: &mut Problems, path: &Path) -> Option<SiblingsConfig> {
    n.section(p);
    let listen = n.required(p, "listen", address).flatten();
    let kubernetes_pods = n.field("kubernetesPods", |n| n.boolean(p)).flatten().unwrap_or(false);
    let mut peers = Vec::new();
    let peers_ok = n
        .field("peers", |n| {
            let before = p.0.len();
            n.each(p, |n, p| {
                if let Some(a) = address(n, p) {
                    if peers.contains(&a) {
                        n.bad(p, format!("{a} is listed twice"));
                    } else if Some(a) == listen {
                        n.bad(p, format!("{a} is this appliance's own listen address"));
                    } else {
                        peers.push(a);
                    }
                }
            });
            if peers.len() > MAX_PEERS {
                n.bad(p, format!("{} peers: at most {MAX_PEERS}", peers.len()));
            }
            p.0.len() == before
        })
        .unwrap_or(true);
    if peers.is_empty() && !kubernetes_pods && peers_ok {
        n.bad(p, "no siblings: list them in `peers`, or set `kubernetesPods: true` to follow the pods of the Kubernetes Gateway's Deployment");
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let key = n
        .required(p, "keyFile", |n, p| {
            let file = base.join(n.string(p)?);
            match read_key(&file) {
                Ok(k) => Some((file, k)),
                Err(why) => {
                    n.bad(p, why.to_string());
                    None
                }
            }
        })
        .flatten();
    let startup_wait_ms = n.field("startupWaitMs", |n| n.bounded(p)).flatten().map_or(5000, |v| v as u32);
    let max_records_per_second = n.field("maxRecordsPerSecond", |n| n.bounded(p)).flatten().map_or(200_000, |v| v as u32);
    let gate = n.field("gate", |n| n.boolean(p)).flatten().unwrap_or(false);
    let (key_file, key) = key?;
    if !peers_ok || (peers.is_empty() && !kubernetes_pods) {
        return None;
    }
    Some(SiblingsConfig { listen: listen?, peers, kubernetes_pods, key_file, key, startup_wait_ms, max_records_per_second, gate })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str, dir: &Path) -> Result<SiblingsConfig, Vec<String>> {
        let v = crate::config::yaml::document(text, &mut crate::config::yaml::Budget::default()).unwrap();
        let mut p = Problems::default();
        let c = parse(Node::root(&v, "c.yaml").with_schema(&crate::config::schema::FILE, "siblings"), &mut p, &dir.join("c.yaml"));
        if p.is_empty() {
            Ok(c.unwrap())
        } else {
            Err(p.0.iter().map(ToString::to_string).collect())
        }
    }

    #[test]
    fn defaults_key_and_errors() {
        let dir = std::env::temp_dir().join(format!("sluice-siblings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("good.key"), format!("{}\n", "k".repeat(32))).unwrap();
        std::fs::write(dir.join("short.key"), "0123456789\n").unwrap();
        let c = one("{listen: 10.0.0.1:7946, peers: [10.0.0.2:7946, '[2001:db8::2]:7946'], keyFile: good.key}", &dir).unwrap();
        assert_eq!(c.listen, "10.0.0.1:7946".parse().unwrap());
        assert_eq!(c.peers.len(), 2);
        assert_eq!((c.startup_wait_ms, c.max_records_per_second, c.gate), (5000, 200_000, false));
        assert_eq!(c.key, SharedKey(b"k".repeat(32)), "the trailing newline is not part of the key");
        assert_eq!(format!("{:?}", c.key), "SharedKey(32 bytes)", "never printed");
        let c = one("{listen: 10.0.0.1:1, peers: 10.0.0.2:1, keyFile: good.key, startupWaitMs: 0, maxRecordsPerSecond: 1000, gate: true}", &dir).unwrap();
        assert_eq!((c.peers.len(), c.startup_wait_ms, c.max_records_per_second, c.gate), (1, 0, 1000, true));
        let errs = one("{listen: 10.0.0.1:7946, peers: [10.0.0.2:7946, 10.0.0.2:7946, 10.0.0.1:7946, nowhere], keyFile: short.key, startupWaitMs: 70000, peer: x}", &dir).unwrap_err();
        let has = |errs: &[String], needle: &str| assert!(errs.iter().any(|e| e.contains(needle)), "{needle}: {errs:#?}");
        assert_eq!(errs.len(), 6, "{errs:#?}");
        has(&errs, "peer: unknown field");
        has(&errs, "c.yaml:1:48: peers[1]: 10.0.0.2:7946 is listed twice");
        has(&errs, "peers[2]: 10.0.0.1:7946 is this appliance's own listen address");
        has(&errs, "peers[3]: \"nowhere\" is not an address:port");
        has(&errs, "short.key is 10 bytes: a shared key has at least 32");
        has(&errs, "startupWaitMs: 70000 is out of range 0..=60000");
        let errs = one("{peers: [], keyFile: missing.key}", &dir).unwrap_err();
        has(&errs, "listen");
        has(&errs, "keyFile: cannot read the key file");
        has(&errs, "no siblings: list them in `peers`, or set `kubernetesPods: true`");
        let c = one("{listen: '0.0.0.0:7946', kubernetesPods: true, keyFile: good.key}", &dir).unwrap();
        assert!(c.kubernetes_pods && c.peers.is_empty(), "{c:?}");
        let errs = one("{listen: 10.0.0.1:7946, keyFile: good.key, kubernetesPods: false}", &dir).unwrap_err();
        has(&errs, "no siblings");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
