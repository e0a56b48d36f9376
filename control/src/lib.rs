//! The `sluice` appliance's control plane, as a library for the binary and
//! its tests.
//!
//! A configuration change walks one way: a source task ([`sources`]) sends
//! a desired state to the reconciler ([`reconcile`]), which merges it into
//! the model ([`model`]), compiles a snapshot ([`compile`]) and publishes
//! it to the workers; nothing calls back up that chain.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
// No function over 80 lines (clippy.toml's threshold), tests aside.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

/// The layers shared with the controller, from `sluice-core`: the ground
/// floor, the model and the configuration.
pub use sluice_core::{config, ground, model, problem};

pub mod admin;
pub mod appliance;
pub mod cli;
pub mod compile;
#[cfg(test)]
mod fixture;
mod health;
#[doc(hidden)]
pub use health::active::{cost as active_checks_cost, thread_cpu};
pub mod reconcile;
pub mod routing;
pub mod sources;
mod sync;
