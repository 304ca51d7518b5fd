//! weir — a sidecar resilience proxy.
//!
//! # How a request flows
//!
//! ```text
//! client ──► proxy::server (worker, listener) ──► a connection:
//!              │
//!              ├─ cleartext HTTP/1.1 to an upstream spoken to in HTTP/1.1,
//!              │  body held:
//!              │  proxy::fast — one task per connection: head parsed,
//!              │  routed and rewritten buffer to buffer (fast::head), sent
//!              │  on a pooled upstream connection (fast::transport)
//!              │
//!              └─ anything else (h2c, TLS, chunked or large bodies, upgrades,
//!                 gRPC, CONNECT, errors to answer): handed over with the
//!                 bytes read so far to proxy::conn ─ proxy::guard ─ hyper ─
//!                 proxy::general (route, request hygiene, the body)
//!              │
//!              │  both read the request through proxy::request: route,
//!              │  client deadline, rate key, idempotency key, dropped fields
//!              │
//!              ▼  one pipeline for both (proxy::attempt):
//!            deadline (timeout, lowered by x-weir-timeout-ms / grpc-timeout)
//!            admit: rate limit → concurrency gate → (body) → breaker
//!            drive: loop { the path's Transport sends one attempt
//!                          → breaker verdict → policy::decide (budget,
//!                          breaker, limiter asked lazily) → backoff }
//!              ▼
//!            response hygiene, x-weir-attempts / x-weir-retry-stop (one
//!            writer), idle timeout ──► client   (metrics at each step)
//! ```
//!
//! HTTP/1 framing — `Content-Length`, `Transfer-Encoding`, the chunked
//! coding — is written once, in `proxy::h1`, with hyper's rules; the guard
//! and the fast path both use it. The behaviour reference is
//! `docs/reference/` (the book's Reference part, `docs/reference/index.md`);
//! comments cite its sections.
//!
//! # Who owns what
//!
//! - [`config`]: the TOML schema, defaults, validation into typed snapshots,
//!   errors with file:line:col and field path.
//! - [`policy`]: PURE state machines and the retry decision; time and
//!   randomness are arguments.
//! - [`proxy`]: the data plane; enforces what `policy` decides. `server`
//!   (listeners, workers), `conn` (the hyper connection driver), `fast`
//!   (the HTTP/1.1 fast path: `head`, `transport`, `pool`), `guard`
//!   (request-smuggling guard), `h1` (HTTP/1 framing), `general` (one
//!   request on the general path), `attempt` (`admit`, `drive`, `hyper`:
//!   the pipeline), `tunnel` (CONNECT), `replay` (bodies kept for a retry;
//!   `Expect: 100-continue`), `sticky` (a client connection's held upstream
//!   connections), `upgrade` (WebSocket pass-through), `error` (weir's own
//!   responses), `request` (the parsed request: the rules read off a
//!   request head, written once over either codec), `order` (the one order
//!   every request to an upstream is served in, over a codec each path
//!   supplies), `exchange` (hyper's codec for it), `cached` (the response
//!   cache's serve), `idempotent` (keyed writes), `access` (the access
//!   log), `headers` (response framing, gRPC deadlines), `route` (route
//!   tables and target mapping), `body`.
//! - [`upstream`]: the upstream side — endpoints (resolution, static
//!   lists; `resolve`), the balancer (`balance`: peak-EWMA, two choices),
//!   ejection (`eject`), the dial loop (`dial`), and `client`, each
//!   endpoint's general-path pool; both paths pick
//!   an endpoint there. It never imports the request side.
//! - [`state`]: live per-upstream state keyed by name, surviving reloads;
//!   `state::gate` (the concurrency gate), `state::link` (each upstream's
//!   link to the fleet's shared state). It never imports the request side.
//!   `tests/house.rs` holds these layers.
//! - [`fleet`]: the state a fleet of weirs shares on Redis (`[state]`):
//!   published breaker trips and the one half-open probe, leased
//!   rate-limit tokens, the idempotency store; every call bounded by
//!   `[state] timeout`, the caller deciding locally when it fails.
//! - [`tls`]: certificates, keys and TLS configurations; failures in words.
//! - [`metrics`]: every metric family, handles resolved once per upstream.
//! - [`trace`]: W3C/B3 trace context, a traced request's server span and
//!   attempt spans, and the OTLP exporter behind a bounded queue; the data
//!   plane calls it (`proxy::traced`, and one hook in the attempt driver),
//!   never the reverse.
//! - [`admin`]: the admin endpoints; [`status`]: the status page they
//!   serve at `/` and `/status.json`, its per-upstream sample ring and the
//!   task that fills it; [`runtime`]: a running weir — worker
//!   threads, SIGHUP and the file watch; [`reload`]: the reloader they and
//!   `POST /reload` call; [`shutdown`]: the stop signal (a leaf).
//! - [`chaos`]: the fault-injecting upstream, load driver and scenarios
//!   behind `weir chaos` (never used by the data plane).
//! - [`clock`]: the only module that reads clocks or seeds randomness.
//! - [`cli`]: the command line; `main.rs` only calls it. [`health`]: `weir
//!   health`, a running weir's admin listener asked from outside.
#![forbid(unsafe_code)]

pub mod admin;
pub mod chaos;
pub mod cli;
pub mod clock;
pub mod config;
pub mod fleet;
#[doc(hidden)]
pub mod fuzzing;
pub mod health;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod reload;
pub mod runtime;
pub mod shutdown;
pub mod state;
pub mod status;
pub mod tls;
pub mod trace;
pub mod upstream;
