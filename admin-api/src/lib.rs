//! The admin endpoint's `/status` document as types: the appliance builds
//! them to write it and `sluice status` reads it into them, so a field
//! renamed on one side fails to compile on the other instead of reading as
//! a default.
//!
//! The JSON is what scripts and tests read: a type here changes only with
//! the document. What the server may not know is an `Option` (`null` in
//! the JSON, and `None` when missing); any other field missing from a
//! document is an error for the reader, a field it does not know is
//! skipped. Strings the server lends from its state (names of services
//! and endpoints, of which there may be 100,000) are `Cow`s, so that it
//! writes them without copying; a reader gets them owned.
//!
//! - [`Status`]: the document, with its [`Port`]s, [`Worker`]s,
//!   [`Service`]s, [`Route`]s, [`Endpoint`]s and each source's [`Source`];
//! - [`xds`], [`bird`], [`kubernetes`], [`sync`], [`health`]: the parts of
//!   the subsystems that run (the xDS source, the BIRD driver, the
//!   Kubernetes source, sibling sync, passive health).
#![forbid(unsafe_code)]
#![deny(unreachable_pub, missing_docs)]

pub mod bird;
pub mod health;
pub mod kubernetes;
mod status;
pub mod sync;
pub mod xds;

pub use status::{Endpoint, EndpointState, LastMinute, Mac, MacError, Port, PortLoss, Route, Service, Source, Status, Worker};
