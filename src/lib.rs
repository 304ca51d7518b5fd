//! weir — a sidecar resilience proxy.
#![forbid(unsafe_code)]

pub mod policy;
