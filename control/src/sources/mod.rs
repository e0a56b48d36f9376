//! Sources of desired state. Each source is a task on the control runtime
//! that owns its objects and sends whole states for its name to the one
//! reconciler ([`crate::reconcile`]); it never touches the model, the
//! compiler or the data plane itself.
//!
//! - [`file`]: the configuration file and its manifests directory, read
//!   again on every change (inotify) and on SIGHUP. The file also carries
//!   the appliance settings (defaults, gateways), so its state is sent as
//!   one transaction: settings, inline definitions and manifests together.

pub mod file;
pub mod kube;
pub mod xds;

use std::path::Path;

use crate::problem::Problem;
use crate::config::{self, manifests, ApplianceConfig};
use crate::model::{Desired, Model, Resolved};

/// Source name of the configuration file's inline definitions.
pub(crate) const FILE_SOURCE: &str = "file";
/// Source name of the manifests directory.
pub(crate) const MANIFESTS_SOURCE: &str = "manifests";

/// What a source tells the reconciler.
#[derive(Debug)]
pub enum SourceMsg {
    /// The configuration file and its manifests, checked on their own.
    File {
        /// The file's settings and inline definitions.
        state: Box<FileState>,
        /// What made the source read it.
        trigger: String,
    },
    /// A source's whole desired state, replacing what it had.
    Desired {
        /// The source's name.
        source: String,
        /// Everything it wants.
        desired: Desired,
        /// What made it send.
        trigger: String,
        /// Told whether the state was applied, or why not (a source that
        /// must acknowledge what it received, such as xDS, waits for it).
        reply: Option<tokio::sync::oneshot::Sender<Applied>>,
    },
    /// A change to the endpoints of some of a source's services only (its
    /// services and routes stay as it last sent them): each service's
    /// endpoints from this source are now the ones given. Applied without
    /// going over the other services; the outcome is the same as sending
    /// the whole state.
    Endpoints {
        /// The source's name (it must have sent a whole state before).
        source: String,
        /// (service, all its endpoints from this source, as one run).
        changes: Vec<(String, std::sync::Arc<[crate::model::EndpointDef]>)>,
        /// What made it send.
        trigger: String,
        /// Told whether the change was applied, or why not.
        reply: Option<tokio::sync::oneshot::Sender<Applied>>,
    },
    /// A source could not produce a state: why (its last good state stays).
    Rejected {
        /// The source's name.
        source: String,
        /// Every problem.
        problems: Vec<Problem>,
        /// What made it try.
        trigger: String,
    },
    /// The endpoints health checking wants out of new flows (all of them,
    /// by service name and identifier), laid over what the sources say:
    /// each drains while it is named (see [`crate::health`]).
    Health {
        /// Service name to identifiers.
        ejected: std::collections::BTreeMap<String, std::collections::BTreeSet<u32>>,
        /// What made it send.
        trigger: String,
    },
}

/// Whether a source's state is being served: `Err` lists why it was refused
/// (the previous state keeps serving), each problem with the origin of the
/// object it is about, so a source can tell which of its objects failed.
pub(crate) type Applied = Result<(), Vec<Problem>>;

/// The configuration file's content and the manifests it points to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileState {
    /// The file.
    pub config: ApplianceConfig,
    /// The manifests, when the file names a directory.
    pub(crate) manifests: Option<Desired>,
}

/// Reads the file at `path` and its manifests, each checked on its own.
pub fn read(path: &Path) -> Result<FileState, Vec<Problem>> {
    let mut config = config::load(path)?;
    let manifests = match &config.manifests {
        Some(m) => Some(manifests::load(&m.directory, &m.gateway)?),
        None => None,
    };
    crate::config::router::add_manifest_routers(&mut config)?;
    Ok(FileState { config, manifests })
}

/// A configuration with its model, checked as a whole (for `sluice check`
/// and the first start).
#[derive(Debug)]
pub struct Loaded {
    /// The file and its manifests.
    pub(crate) file: FileState,
    /// Its sources.
    pub(crate) model: Model,
    /// The merged result.
    pub(crate) resolved: Resolved,
}

impl FileState {
    /// Puts the file's definitions into `model` under their source names.
    pub(crate) fn set_into(&self, model: &mut Model) {
        model.set(FILE_SOURCE, self.config.inline.clone());
        match &self.manifests {
            Some(d) => {
                model.set(MANIFESTS_SOURCE, d.clone());
            }
            None => model.remove(MANIFESTS_SOURCE),
        }
    }
}

impl Loaded {
    /// The model of a file's state, checked as a whole.
    pub fn of(file: FileState) -> Result<Loaded, Vec<Problem>> {
        let mut model = Model::default();
        file.set_into(&mut model);
        let resolved = model.resolve(&file.config.defaults)?;
        Ok(Loaded { file, model, resolved })
    }
}

/// Loads the file at `path`, its manifests, and checks the whole.
pub(crate) fn load(path: &Path) -> Result<Loaded, Vec<Problem>> {
    Loaded::of(read(path)?)
}

#[cfg(test)]
mod tests {
    /// A manifests directory's `GatewayRouter`s of the configured Gateway
    /// join the file's, read through the same path as `run`.
    #[test]
    fn manifests_add_their_gateway_routers() {
        let dir = std::env::temp_dir().join(format!("sluice-routers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("m")).unwrap();
        let config = dir.join("c.yaml");
        std::fs::write(&config, "ports:\n  - {name: front, device: net_null0, addresses: [169.254.100.1/24], kernelInterface: vlan-100}\nmanifests: {directory: m, gateway: sllb-a}\ngatewayRouters:\n  - {name: from-file, address: 169.254.100.151, interface: front, bgp: {localASN: 1, remoteASN: 2}}\n").unwrap();
        let manifests = |bad: &str| {
            format!(
                r"apiVersion: gateway.networking.k8s.io/v1beta1
kind: Gateway
metadata: {{name: sllb-a}}
spec: {{gatewayClassName: x}}
---
apiVersion: meridio.experiment.gateway.api.poc/v1alpha1
kind: GatewayRouter
metadata:
  name: gateway-a-v4
  labels:
    service.kubernetes.io/service-proxy-name: sllb-a
spec:
  address: 169.254.100.150
  interface: vlan-100
  bgp:
    localASN: 8103
    remoteASN: 4248829953
    holdTime: 24s
    localPort: 10179
    remotePort: 10179
    bfd:
      switch: true
      minTx: 300ms
      minRx: 300ms
      multiplier: 5
---
apiVersion: meridio.experiment.gateway.api.poc/v1alpha1
kind: GatewayRouter
metadata: {{name: another-gateways, labels: {{service.kubernetes.io/service-proxy-name: sllb-b}}}}
spec: {{address: 10.9.9.9, interface: nowhere}}
---
apiVersion: meridio.experiment.gateway.api.poc/v1alpha1
kind: GatewayRouter
metadata: {{name: second, labels: {{service.kubernetes.io/service-proxy-name: sllb-a}}}}
spec: {{address: 169.254.100.152, interface: vlan-100{bad}}}
"
            )
        };
        std::fs::write(dir.join("m/gw.yaml"), manifests("")).unwrap();
        let got: Vec<String> = super::read(&config).unwrap_err().iter().map(ToString::to_string).collect();
        let file = dir.join("m/gw.yaml").display().to_string();
        assert_eq!(got, [format!("{file}:35:7: [doc 3] GatewayRouter/second.spec: missing field \"bgp\"")]);
        std::fs::write(dir.join("m/gw.yaml"), manifests(", bgp: {localASN: 1, remoteASN: 2}")).unwrap();
        let st = super::read(&config).unwrap();
        let names: Vec<&str> = st.config.routing.routers.iter().map(|r| r.router.name.as_str()).collect();
        assert_eq!(names, ["from-file", "gateway-a-v4", "second"], "the other Gateway's router is not ours");
        assert_eq!(st.config.routing.routers[1].router.bgp.local_port, 10179);
        assert_eq!(&*st.config.routing.routers[1].origin.path, "[doc 1] GatewayRouter/gateway-a-v4");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
