//! Reading every source of a configuration into a checked model, and
//! noticing when any of its files change.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::config::node::Problem;
use crate::config::{self, manifests, ApplianceConfig};
use crate::model::{Model, Resolved};

/// A configuration with its model, checked.
#[derive(Debug)]
pub struct Loaded {
    /// The file.
    pub config: ApplianceConfig,
    /// Its sources.
    pub model: Model,
    /// The merged result.
    pub resolved: Resolved,
}

/// Source name of the file's inline definitions.
pub const FILE_SOURCE: &str = "file";
/// Source name of the manifests directory.
pub const MANIFESTS_SOURCE: &str = "manifests";

/// Loads the file at `path`, its manifests, and checks the whole.
pub fn load(path: &Path) -> Result<Loaded, Vec<Problem>> {
    let config = config::load(path)?;
    let mut model = Model::default();
    model.set(FILE_SOURCE, config.inline.clone());
    if let Some(m) = &config.manifests {
        model.set(MANIFESTS_SOURCE, manifests::load(&m.directory, &m.gateway)?);
    }
    let resolved = model.resolve(&config.defaults)?;
    Ok(Loaded { config, model, resolved })
}

/// What the files looked like: (path, modified, length) of each.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Fingerprint(Vec<(PathBuf, Option<SystemTime>, u64)>);

/// The fingerprint of the configuration file and its manifests.
pub fn fingerprint(path: &Path, manifests_dir: Option<&Path>) -> Fingerprint {
    let mut files = vec![path.to_owned()];
    if let Some(d) = manifests_dir {
        files.push(d.to_owned());
        files.extend(manifests::files(d).unwrap_or_default());
    }
    Fingerprint(
        files
            .into_iter()
            .map(|f| {
                let md = std::fs::metadata(&f).ok();
                let mtime = md.as_ref().and_then(|m| m.modified().ok());
                let len = md.map_or(0, |m| m.len());
                (f, mtime, len)
            })
            .collect(),
    )
}
