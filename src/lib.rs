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
//!                 bytes read so far to the general path, proxy::general:
//!                 conn ─ guard ─ hyper's server ─ one request (route,
//!                 hygiene, the cache's serve, tunnels, the exchange)
//!              │
//!              │  both read the request through proxy::request: route,
//!              │  client deadline, rate key, idempotency key, dropped fields
//!              │
//!              ▼  one serve order for every codec (proxy::order), one
//!                 attempt driver (proxy::attempt):
//!            deadline (timeout, lowered by x-weir-timeout-ms / grpc-timeout)
//!            admit: client-side throttle → rate limit → concurrency gate
//!                   → (body) → breaker
//!            drive: loop { the codec's Transport sends one attempt
//!                          → breaker verdict → policy::decide (budget,
//!                          breaker, limiter asked lazily) → backoff }
//!              ▼
//!            response hygiene, x-weir-attempts / x-weir-retry-stop (one
//!            writer), idle timeout ──► client   (metrics at each step)
//! ```
//!
//! HTTP/1 framing — `Content-Length`, `Transfer-Encoding`, the chunked
//! coding — is written once, in `h1`, with hyper's rules; the guard,
//! the fast path and the upstream side's own HTTP/1.1 client use it. The behaviour reference is
//! `docs/reference/` (the book's Reference part, `docs/reference/index.md`);
//! comments cite its sections.
//!
//! # Who owns what, bottom up
//!
//! Each module imports only those listed before it (`tests/house.rs`;
//! docs/reference/life-of-a-request.md#the-house).
//!
//! - [`clock`]: the only module that reads clocks or seeds randomness;
//!   [`shutdown`]: the stop signal; [`h1`]: HTTP/1 framing
//!   (`Content-Length`, `Transfer-Encoding`, the chunked coding, where a
//!   response ends); [`address`]: where a socket is, TCP or Unix-domain.
//!   Leaves.
//! - [`policy`]: PURE state machines and the retry decision — backoff,
//!   budget, breaker, limiters, the adaptive limit, the balancer's choice
//!   (`balance`: peak-EWMA, two choices), ejection (`eject`), the cache's
//!   and idempotency's rules; time and randomness are arguments.
//! - [`config`]: the TOML schema, defaults, validation into typed snapshots,
//!   errors with file:line:col and field path.
//! - [`metrics`]: every metric family, handles resolved once per upstream,
//!   the wire meter (`metrics::meter`), and which series an upstream's
//!   config can move (`metrics::possible`: only those exist).
//! - [`tls`]: certificates, keys and TLS configurations; failures in words.
//!   [`trace`]: W3C/B3 trace context, a traced request's spans, and the
//!   OTLP exporter behind a bounded queue; the data plane calls it.
//! - [`state`]: live per-upstream policy state keyed by name, surviving
//!   reloads (breaker, budget, limiters, `state::gate` the concurrency
//!   gate, the cache and idempotency stores, `state::ring` the status
//!   page's samples); `state::link` (each upstream's link to the fleet) and
//!   `state::fleet` (what a fleet of weirs shares on Redis: published
//!   breaker trips and the one half-open probe, leased rate-limit tokens,
//!   the idempotency store; every call bounded by `[state] timeout`). It
//!   knows nothing of endpoints or connections.
//! - [`upstream`]: the upstream side — `reach` (each upstream's endpoints,
//!   their resolver and client, keyed by name, surviving reloads),
//!   endpoints (resolution, static lists; `resolve`; `seen`, what the
//!   status page and `/metrics` show of them), the dial loop
//!   (`dial`), `checkout` (the general path's one checkout: the endpoint
//!   picked, and the lease or HTTP/2 pool it is reached over), `pool` (every connection weir keeps to an upstream: `h1` the
//!   worker's idle HTTP/1.1 connections, `lease` hyper's client over one,
//!   `held` a client connection's leases, `h2` the HTTP/2 pool, `open` the
//!   one dialler), `http1` (weir's own HTTP/1.1 client over those pooled
//!   connections, for HTTP/2 clients' requests), `body` (the one response
//!   body type, whichever client read it) and `client` (how an endpoint is reached: its TLS, its
//!   HTTP/2 pool, what an `auto` endpoint chose by ALPN); both paths pick
//!   an endpoint there. It never imports the request side.
//! - [`proxy`]: the data plane. `server` (listeners, workers), `order` (the
//!   one order every request to an upstream is served in, over a `Codec`,
//!   with the response cache's steps in it: `order::cache`), `cached`
//!   (what the cache does with a request, a key's fill, answers from an
//!   entry),
//!   `attempt` (`admit`, `drive`, `hedge`: the pipeline), `request` (the
//!   rules read off a request head, once for every codec), and a folder per
//!   codec: `fast` (the HTTP/1.1 fast path: `head`, `transport`)
//!   and `general` (the general path on hyper: `conn`, `guard` the
//!   request-smuggling guard, `exchange` its codec, `transport` its
//!   attempts, `exchange::refresh` a stale entry's background refresh,
//!   `tunnel` CONNECT,
//!   `upgrade` WebSocket pass-through). Beside them: `replay` (bodies kept for a retry),
//!   `upload` (the request body's upload, which `timeout` and
//!   `per_try_timeout` set aside), `idempotent` (keyed writes),
//!   `error` (weir's own responses), `access` (the access log), `headers`,
//!   `route`, `body`, `traced`.
//! - [`admin`]: the admin endpoints; `admin::status`, the status page they
//!   serve at `/` and `/status.json` and the task that samples it;
//!   `admin::reload`, the reloader they, SIGHUP and the file watch call.
//! - [`runtime`]: a running weir — worker threads, SIGHUP, the file watch.
//! - [`cli`]: the command line (`main.rs` only calls it) and what only it
//!   uses: `cli::chaos` (the fault-injecting upstream, load driver and
//!   scenarios behind `weir chaos`), `cli::health` (`weir health`), and
//!   the fuzzing hooks.
#![forbid(unsafe_code)]

pub mod address;
pub mod admin;
pub mod cli;
pub mod clock;
pub mod config;
pub mod h1;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod runtime;
pub mod shutdown;
pub mod state;
pub mod tls;
pub mod trace;
pub mod upstream;
