//! The `sluice` appliance's control plane, as a library for the binary and
//! its tests.
#![forbid(unsafe_code)]

pub mod admin;
pub mod check;
pub mod compile;
pub mod config;
pub mod kernel;
pub mod model;
pub mod routing;
pub mod run;
pub mod sources;
pub mod status;
