//! The `sluice` appliance's control plane, as a library for the binary and
//! its tests.
#![forbid(unsafe_code)]

pub mod config;
pub mod model;
