//! weir — a sidecar resilience proxy.
//!
//! # How a request flows
//!
//! ```text
//! client ──► proxy::server (worker, listener, connection)
//!              │
//!              ├─ cleartext HTTP/1.1 to an HTTP/1.1 upstream, body held:
//!              │  proxy::fast — one task per connection: head parsed, routed
//!              │  and rewritten buffer to buffer, proxy::attempt's Attempts
//!              │  core, a pooled upstream connection, the response relayed
//!              │
//!              └─ anything else (h2c, TLS, chunked or large bodies, upgrades,
//!                 gRPC, errors to answer): handed over with the bytes read
//!                 so far to ─ proxy::guard ─ hyper
//!              │ loads the current Snapshot (arc-swap)
//!              ▼
//!            proxy::forward ── route (Host + path) ──► Upstream { config, state }
//!              │ deadline from `timeout`, lowered by x-weir-timeout-ms / grpc-timeout
//!              │ request hygiene (hop-by-hop, x-weir-*, Host, base path)
//!              ▼
//!            proxy::attempt: admit (rate limit, concurrency gate, breaker)
//!              │ loop { send (sticky connection or shared pool, per-try timeout)
//!              │        → breaker verdict → policy::decide (budget, breaker,
//!              │        limiter asked lazily) → backoff sleep }
//!              ▼
//!            response hygiene, x-weir-attempts / x-weir-retry-stop, idle-timeout
//!            body ──► client                       (metrics written at each step)
//! ```
//!
//! # Who owns what
//!
//! - [`config`]: the TOML schema, defaults, validation into typed snapshots,
//!   errors with file:line:col and field path.
//! - [`policy`]: PURE state machines and the retry decision; time and
//!   randomness are arguments.
//! - [`proxy`]: the data plane; enforces what `policy` decides. `server`
//!   (listeners, workers, connections), `fast` (the HTTP/1.1 fast path and
//!   its upstream pool), `guard` (request-smuggling guard),
//!   `forward` (one request), `attempt` (admission and the attempt loop),
//!   `replay` (bodies kept for a retry), `sticky` and `client` (upstream
//!   connections), `gate` (concurrency), `upgrade` (WebSocket pass-through),
//!   `error` (weir's own responses), `headers`, `route`, `body`.
//! - [`state`]: live per-upstream state keyed by name, surviving reloads.
//! - [`tls`]: certificates, keys and TLS configurations; failures in words.
//! - [`metrics`]: every metric family, handles resolved once per upstream.
//! - [`admin`]: the admin endpoints; [`runtime`]: a running weir — worker
//!   threads, reload triggers (SIGHUP, file watch, POST /reload).
//! - [`chaos`]: the fault-injecting upstream, load driver and scenarios
//!   behind `weir chaos` (never used by the data plane).
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
pub mod reload;
pub mod runtime;
pub mod shutdown;
pub mod state;
pub mod tls;
