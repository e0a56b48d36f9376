//! The Kubernetes API as a source (Meridio 2.x: Sluice as the stateless
//! load balancer of a Gateway).
pub mod crd;
