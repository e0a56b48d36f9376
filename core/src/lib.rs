//! What the Sluice appliance (`sluice`) and its controller
//! (`sluice-controller`) share, with no DPDK beneath it: the ground floor
//! ([`ground`], [`problem`], [`logging`]), the model every source fills
//! ([`model`]), the configuration's schema and parsing ([`config`]) and the
//! custom resources of the Meridio 2.x design ([`crd`]).
//!
//! The layers point down: ground, model, config; [`crd`] uses the config's
//! readers in its tests only.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
// No function over 80 lines (clippy.toml's threshold), tests aside.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod config;
pub mod crd;
pub mod ground;
pub mod logging;
pub mod model;
pub mod problem;
