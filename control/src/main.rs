//! `sluice`: the appliance binary.
//!
//! Sub-commands: `run` (the load balancer), `check` (validate a
//! configuration), `status` (what a running appliance does), `forward` (a
//! plain io-forwarder between two ports, the speed baseline and a proof of
//! the DPDK bindings), `gen` (a traffic generator that accounts for what
//! comes back), `capture` (a port's frames to a pcap file), `crds` (the
//! CRDs of L34Route and GatewayRouter). The controller-manager is a binary
//! of its own, `sluice-controller`, that does not link DPDK.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
// No function over 80 lines (clippy.toml's threshold), tests aside.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use clap::{Parser, Subcommand};
use sluice::appliance as run;
use sluice::cli::{capture, check, crds, forward, gen, status, tables};

/// Sluice: a kernel-bypass L3/L4 load balancer on DPDK.
///
/// Start with a configuration (see configs/demo.yaml):
///   sluice check --config configs/demo.yaml
///   sluice run --config configs/demo.yaml
///   sluice status
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
    Run(run::RunArgs),
    Check(check::CheckArgs),
    Status(status::StatusArgs),
    Tables(tables::TablesArgs),
    Explain(tables::ExplainArgs),
    Forward(forward::ForwardArgs),
    Gen(Box<gen::GenArgs>),
    Capture(Box<capture::CaptureArgs>),
    Crds(crds::CrdsArgs),
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
    // Before any thread starts (DPDK's, tokio's): one heap for all of them.
    sluice_ffi::heap::one_arena();
    let cli = Cli::parse();
    sluice_core::logging::init(cli.log.as_deref());
    let result = match cli.command {
        Command::Run(args) => run::run(&args),
        Command::Check(args) => Ok(check::run(&args)),
        Command::Status(args) => status::run(&args),
        Command::Tables(args) => tables::tables(&args),
        Command::Explain(args) => tables::explain(&args),
        Command::Forward(args) => forward::run(&args),
        Command::Gen(args) => gen::run(&args),
        Command::Capture(args) => capture::run(&args),
        Command::Crds(args) => crds::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
