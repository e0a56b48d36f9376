//! `sluice crds`: writes the CRDs of `L34Route` and `GatewayRouter`,
//! generated from the appliance's own types, for `kubectl apply -f`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::sources::kube::crd;

/// Write the CRDs of L34Route and GatewayRouter.
///
/// Generated from the types the appliance uses, with the schema validation
/// the Meridio 2.x design asks for. Prints them to standard output, or
/// writes one file per CRD into a directory (`--out configs/k8s/crds`).
/// With `--check`, writes nothing and exits 1 when the files there differ.
#[derive(Debug, clap::Args)]
pub struct CrdsArgs {
    /// Directory to write `l34routes.yaml` and `gatewayrouters.yaml` into.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Compare with the files in `--out` instead of writing them.
    #[arg(long, requires = "out")]
    pub(crate) check: bool,
}

/// Runs `sluice crds`.
pub fn run(args: &CrdsArgs) -> Result<ExitCode> {
    let files = crd::render()?;
    match (&args.out, args.check) {
        (None, _) => {
            for (_, text) in files {
                println!("---\n{}", text.trim_end());
            }
        }
        (Some(dir), false) => {
            for path in crd::write(dir)? {
                println!("wrote {path}");
            }
        }
        (Some(dir), true) => {
            let mut stale = 0;
            for (file, text) in files {
                let path = dir.join(file);
                if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                    eprintln!("{} is not current", path.display());
                    stale += 1;
                }
            }
            if stale > 0 {
                eprintln!("run `sluice crds --out {}` to write them", dir.display());
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
