//! `sluice`: the appliance binary.
//!
//! Sub-commands: `forward` (a plain io-forwarder between two ports, the
//! speed baseline and a proof of the DPDK bindings).
#![forbid(unsafe_code)]

mod forward;
mod logging;

use clap::{Parser, Subcommand};

/// Sluice: a kernel-bypass L3/L4 load balancer on DPDK.
///
/// DPDK (EAL) arguments go after `--`, for example:
///   sluice forward -- --no-huge -m 1024 --no-pci -l 0,1 --vdev=net_null0 --vdev=net_null1
#[derive(Debug, Parser)]
#[command(name = "sluice", version = version_line(), propagate_version = true, verbatim_doc_comment)]
struct Cli {
    /// Log filter (error, warn, info, debug, trace, or a tracing filter such
    /// as `sluice=debug`). Overrides RUST_LOG.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Forward(forward::ForwardArgs),
}

fn version_line() -> &'static str {
    // Computed once; clap wants a 'static string.
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        format!(
            "{} (built against DPDK {}, running {})",
            env!("CARGO_PKG_VERSION"),
            sluice_ffi::BUILT_AGAINST_DPDK,
            sluice_ffi::dpdk_version()
        )
    })
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log.as_deref());
    let result = match cli.command {
        Command::Forward(args) => forward::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
