//! The sub-commands other than `run` (which is [`crate::appliance`]).

pub mod capture;
pub mod check;
pub mod crds;
pub mod status;
pub mod tables;
pub mod forward;
pub mod gen;
