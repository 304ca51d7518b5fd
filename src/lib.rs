//! weir — a sidecar resilience proxy.
//!
//! # How a request flows
//!
//! ```text
//! client ──► proxy::server (listener, connection, hyper)
//!              │ loads the current Snapshot (arc-swap)
//!              ▼
//!            proxy::forward ── route (Host + path) ──► Upstream { config, state }
//!              │ deadline from `timeout`, lowered by x-weir-timeout-ms / grpc-timeout
//!              │ request hygiene (hop-by-hop, x-weir-*, Host, base path)
//!              ▼
//!            attempt ── state.client (pooled hyper connections) ──► upstream
//!              │ per-try timeout; errors classified by type (proxy::error)
//!              ▼
//!            response hygiene, x-weir-attempts, idle-timeout body ──► client
//! ```
//!
//! # Who owns what
//!
//! - [`config`]: the TOML schema, defaults, validation into typed snapshots,
//!   errors with file:line:col and field path.
//! - [`policy`]: PURE state machines and the retry decision; time and
//!   randomness are arguments.
//! - [`proxy`]: the data plane; enforces what `policy` decides.
//! - [`state`]: live per-upstream state keyed by name, surviving reloads.
//! - [`clock`]: the only module that reads clocks or seeds randomness.
//! - [`cli`]: the command line; `main.rs` only calls it.
#![forbid(unsafe_code)]

pub mod admin;
pub mod chaos;
pub mod cli;
pub mod clock;
pub mod config;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod runtime;
pub mod state;
pub mod tls;
