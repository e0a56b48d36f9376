//! `sluice-controller`: the Controller-Manager of the Gateways of a
//! GatewayClass (see `--help` and [`sluice_controller`]).
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
// No function over 80 lines (clippy.toml's threshold), tests aside.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use clap::Parser;
use sluice_controller::cli::{self, ControllerArgs};

fn main() -> std::process::ExitCode {
    let args = ControllerArgs::parse();
    sluice_core::logging::init(args.log.as_deref());
    match cli::run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice-controller: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
