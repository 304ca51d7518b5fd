//! The test crate: one binary for every suite in `tests/` but the few that
//! must be alone in their process (see `[[test]]` in Cargo.toml): one link
//! of the library instead of one per file. Each file stays a module of its
//! own name, so `cargo test --test it grpc::` runs what `tests/grpc.rs` holds.
//! Tests that load the machine take [`common::one_heavy_at_a_time`].

mod common;

mod admission;
mod ambiguous_heads;
mod breaker_defaults;
mod cache;
mod cache_fixtures;
mod chaos;
mod cli;
mod client_timeouts;
mod config_errors;
mod deadlines;
mod deploy;
mod deploy_component;
mod dns;
mod docs;
mod drain;
mod fast_path;
mod fast_path_props;
mod fleet;
mod fleet_cluster;
mod fleet_failover;
mod fleet_garbage;
mod fleet_state;
mod forwarding;
mod framing_kept;
mod framing_props;
mod framing_reference;
mod grpc;
mod h2_pool;
mod h2_server;
mod h2c_to_http1;
mod hedging;
mod house;
mod hygiene;
mod idempotency;
mod idempotency_fixtures;
mod idempotency_scope;
mod interop;
mod interop_matrix;
mod logs;
mod operations;
mod policy_fixtures;
mod policy_props;
mod port_conflict;
mod pushback;
mod reload_server;
mod replicas;
mod retries;
mod routing;
mod shutdown;
mod slow_readers;
mod slow_tail;
mod smuggling;
mod status_page;
mod third_party_smoke;
mod tls;
mod truncated;
mod tunnel;
mod unix_sockets;
mod uploads;
mod upstream_pool;
mod wire;
