//! The `sluice` appliance's control plane, as a library for the binary and
//! its tests.
//!
//! A configuration change walks one way: a source task ([`sources`]) sends
//! a desired state to the reconciler ([`reconcile`]), which merges it into
//! the model ([`model`]), compiles a snapshot ([`compile`]) and publishes
//! it to the workers; nothing calls back up that chain.
#![forbid(unsafe_code)]

pub mod admin;
pub mod appliance;
pub mod cli;
pub mod compile;
pub mod config;
pub mod controller;
pub mod ground;
pub mod model;
pub mod problem;
pub mod reconcile;
pub mod routing;
pub mod sources;
pub mod sync;
