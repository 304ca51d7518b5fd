//! The raw serde model of `weir.toml` (stage one of two).
//!
//! Every table uses `deny_unknown_fields`, so a typo is an error rather than a
//! silently ignored field. Every policy field is an `Option` so that
//! `[upstreams.NAME]` can merge over `[defaults]` field by field, and
//! `[defaults]` over the built-in defaults in [`RawPolicy::builtin`] — the one
//! place each default is written down.

use super::duration::Dur;
use crate::policy::Scope;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Generates `merge(self, base)`: each field set here wins, each unset field
/// comes from `base`; nested tables merge recursively.
macro_rules! mergeable {
    ($ty:ident { $($field:ident),* $(,)? } nested { $($nested:ident),* $(,)? }) => {
        impl $ty {
            pub fn merge(self, base: Self) -> Self {
                $ty {
                    $($field: self.$field.or(base.$field),)*
                    $($nested: match (self.$nested, base.$nested) {
                        (Some(a), Some(b)) => Some(a.merge(b)),
                        (a, b) => a.or(b),
                    },)*
                }
            }
        }
    };
}

// After `mergeable!`, which it uses.
mod cache;
mod concurrency;
mod ejection;
mod hedge;
mod state;
mod throttle;
mod tracing;
mod upstream;
pub use cache::RawCache;
pub use concurrency::RawConcurrency;
pub use ejection::RawEjection;
pub use hedge::RawHedge;
pub use state::RawState;
pub use throttle::RawThrottle;
pub use tracing::RawTracing;
pub use upstream::{RawGrpc, RawUpstream, DEFAULT_BALANCE, DEFAULT_MAX_ENDPOINTS};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    /// Where the state a fleet shares is kept (docs/reference/fleet.md#fleet-state).
    #[serde(default)]
    pub state: RawState,
    /// Spans over OTLP (docs/reference/tracing.md#tracing).
    #[serde(default)]
    pub tracing: RawTracing,
    #[serde(default)]
    pub defaults: RawPolicy,
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Shared listener, routed by Host / authority. Default `127.0.0.1:15001`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Admin listener (/metrics, /healthz, /readyz, /config, /reload). Default `127.0.0.1:15000`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    /// Client connections held at once across all listeners. Default 10000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// Time a client has to send a complete request head (slowloris guard). Default 10s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_read_timeout: Option<Dur>,
    /// A client connection with no request in flight is closed after this
    /// long (HTTP/2 with a GOAWAY; HTTP/1.1 keep-alive too). Default 60s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_idle_timeout: Option<Dur>,
    /// A response the client takes none of for this long is abandoned: its
    /// connection is closed and its slot freed (slow-reader guard). Default 30s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_write_timeout: Option<Dur>,
    /// HTTP/2 streams one client connection may have open at once. Default 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_streams_per_connection: Option<u32>,
    /// Requests a client connection may abandon (reset, or cancel by going
    /// away) per second before the connection is closed. Default 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_resets_per_second: Option<u32>,
    /// Request heads larger than this get 431. Default 65536.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_header_bytes: Option<u32>,
    /// How long in-flight requests may take to finish on shutdown. Default 30s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_timeout: Option<Dur>,
    /// Optional inbound TLS on the shared listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<RawListenerTls>,
    /// One log line per request: `off`, `errors` (default) or `all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_log: Option<super::AccessLog>,
    /// The permissions, in octal, of every `unix:` socket weir listens on.
    /// Default "0660".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_mode: Option<String>,
}

impl RawServer {
    pub fn builtin() -> Self {
        RawServer {
            listen: Some("127.0.0.1:15001".into()),
            admin: Some("127.0.0.1:15000".into()),
            max_connections: Some(10_000),
            header_read_timeout: Some(Dur(std::time::Duration::from_secs(10))),
            client_idle_timeout: Some(Dur(std::time::Duration::from_secs(60))),
            client_write_timeout: Some(Dur(std::time::Duration::from_secs(30))),
            max_streams_per_connection: Some(100),
            max_resets_per_second: Some(100),
            max_header_bytes: Some(65_536),
            shutdown_timeout: Some(Dur(std::time::Duration::from_secs(30))),
            tls: None,
            access_log: Some(super::AccessLog::Errors),
            socket_mode: Some("0660".into()),
        }
    }
}
mergeable!(RawServer { listen, admin, max_connections, header_read_timeout, client_idle_timeout, client_write_timeout, max_streams_per_connection, max_resets_per_second, max_header_bytes, shutdown_timeout, tls, access_log, socket_mode } nested {});

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTls {
    pub cert: String,
    pub key: String,
}

/// The policy fields shared by `[defaults]` and every `[upstreams.NAME]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotate: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_header: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<RawRetry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<RawBreaker>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<RawConcurrency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RawRateLimit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<RawIdempotency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<RawCache>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hedge: Option<RawHedge>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle: Option<RawThrottle>,
}
mergeable!(RawPolicy { timeout, per_try_timeout, connect_timeout, idle_timeout, annotate, idempotency_header } nested { retry, breaker, concurrency, rate_limit, idempotency, cache, hedge, throttle });

impl RawPolicy {
    /// The built-in defaults: the schema of docs/reference/configuration.md#policy-defaults, written down once.
    pub fn builtin() -> Self {
        use std::time::Duration as D;
        RawPolicy {
            timeout: Some(Dur(D::from_secs(15))),
            per_try_timeout: None,
            connect_timeout: Some(Dur(D::from_secs(2))),
            idle_timeout: Some(Dur(D::from_secs(60))),
            annotate: Some(true),
            idempotency_header: Some("Idempotency-Key".into()),
            retry: Some(RawRetry {
                max_attempts: Some(3),
                retry_on: Some(
                    ["connect-failure", "reset", "timeout", "502", "503", "504"]
                        .map(String::from)
                        .to_vec(),
                ),
                max_retry_after: Some(Dur(D::from_secs(60))),
                max_replay_body_bytes: Some(65_536),
                min_attempt_time: Some(Dur(D::from_millis(10))),
                backoff: Some(RawBackoff {
                    // 25 ms / 1 s: a retry usually goes to another
                    // replica, and the budget, not the backoff, bounds the
                    // load retries add (docs/reference/retries.md#backoff).
                    base: Some(Dur(D::from_millis(25))),
                    max: Some(Dur(D::from_secs(1))),
                    multiplier: Some(2.0),
                    growth: Some("exponential".into()),
                    jitter: Some(RawJitter::Name("full".into())),
                    allow_jitter_above_cap: Some(false),
                }),
                budget: Some(RawBudget {
                    ratio: Some(0.1),
                    min_per_sec: Some(10),
                    ttl: Some(Dur(D::from_secs(10))),
                    timeout_cost: Some(2),
                }),
            }),
            breaker: Some(RawBreaker {
                enabled: Some(true),
                consecutive_failures: Some(20),
                // With `failing_for` 1 s, the breaker opens only on an
                // upstream that is down: docs/reference/breaker.md#trip-rules.
                failing_for: Some(Dur(D::from_secs(1))),
                window: Some(100),
                min_samples: Some(50),
                failure_rate: Some(1.0),
                // A gRPC answer's outcome is its `grpc-status`: the codes a
                // server that cannot serve gives count as 5xx do.
                failure_statuses: Some(
                    [500, 502, 503, 504]
                        .map(FailureStatus::Http)
                        .into_iter()
                        .chain(
                            ["unavailable", "internal", "deadline-exceeded"]
                                .map(|c| FailureStatus::Grpc(c.into())),
                        )
                        .collect(),
                ),
                // 320 ms, not doubling: after ± 20 % jitter (capped at
                // `max_open`) every interval is 256–320 ms, so a dead
                // upstream sees at most 4 probes a second and a returned one
                // is found within 0.32 s: docs/reference/breaker.md#open.
                open: Some(Dur(D::from_millis(320))),
                max_open: Some(Dur(D::from_millis(320))),
                open_jitter: Some(0.2),
                half_open_probes: Some(1),
                scope: Some(Scope::Fleet),
            }),
            concurrency: Some(RawConcurrency {
                max_in_flight: Some(1024),
                max_queue: Some(0),
                // Off; the adaptive limit's defaults and why:
                // docs/reference/admission.md#adaptive-limit.
                limit: Some("fixed".into()),
                min_limit: Some(3),
                initial_limit: Some(crate::policy::adaptive::DEFAULT_INITIAL),
                latency_tolerance: Some(0.25),
                window: Some(Dur(D::from_millis(100))),
                recheck: Some(Dur(D::from_secs(30))),
            }),
            // Absent = unlimited. The fields' own defaults apply once a table is set.
            rate_limit: None,
            idempotency: Some(RawIdempotency {
                enabled: Some(true),
                ttl: Some(Dur(D::from_secs(24 * 3600))),
                max_bytes: Some(16 << 20),
                max_response_bytes: Some(1 << 20),
                // Every method that is not idempotent by itself.
                methods: Some(["POST", "PATCH"].map(String::from).to_vec()),
                // A key is one caller's (docs/reference/idempotency.md#idempotency-keys).
                scope: Some(
                    crate::policy::idempotency::DEFAULT_SCOPE
                        .map(String::from)
                        .to_vec(),
                ),
            }),
            // Off: a cache changes what the application sees.
            cache: Some(RawCache {
                enabled: Some(false),
                max_bytes: Some(32 << 20),
                max_object_bytes: Some(1 << 20),
                default_ttl: Some(Dur(D::ZERO)),
                stale_while_revalidate: Some(Dur(D::ZERO)),
                stale_if_error: Some(Dur(D::ZERO)),
                store_set_cookie: Some(false),
            }),
            // Off: a table turns it on; its fields' defaults then apply.
            hedge: None,
            // Off; the defaults and why: docs/reference/admission.md#client-side-throttling.
            throttle: Some(RawThrottle {
                enabled: Some(false),
                multiplier: Some(2.0),
                window: Some(Dur(D::from_secs(30))),
                max_reject: Some(0.9),
                min_requests: Some(20),
            }),
        }
    }

    /// Defaults for the fields of a `rate_limit` table that is present.
    pub fn builtin_rate_limit() -> RawRateLimit {
        RawRateLimit {
            rps: None,
            burst: None,
            window: None,
            key: None,
            max_keys: Some(10_000),
            max_wait: Some(Dur(std::time::Duration::ZERO)),
            scope: Some(Scope::Instance),
            expected_instances: None,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_retry_after: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_replay_body_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_attempt_time: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff: Option<RawBackoff>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<RawBudget>,
}
mergeable!(RawRetry { max_attempts, retry_on, max_retry_after, max_replay_body_bytes, min_attempt_time } nested { backoff, budget });

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackoff {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter: Option<RawJitter>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_jitter_above_cap: Option<bool>,
}
mergeable!(RawBackoff { base, max, multiplier, growth, jitter, allow_jitter_above_cap } nested {});

/// `jitter = "full"` or `jitter = { proportional = 0.2 }`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawJitter {
    Name(String),
    Proportional(RawProportional),
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawProportional {
    pub proportional: f64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_per_sec: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_cost: Option<u32>,
}
mergeable!(RawBudget { ratio, min_per_sec, ttl, timeout_cost } nested {});

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBreaker {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// A trip waits until no attempt has succeeded for this long. Default 1s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failing_for: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_samples: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_statuses: Option<Vec<FailureStatus>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_open: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_jitter: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub half_open_probes: Option<u32>,
    /// `fleet` (default) or `instance`: whether trips and the half-open
    /// probe are shared through `[state]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}
/// An entry of `failure_statuses`: an HTTP status, or a gRPC code's name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum FailureStatus {
    Http(u16),
    Grpc(String),
}

mergeable!(RawBreaker { enabled, consecutive_failures, failing_for, window, min_samples, failure_rate, failure_statuses, open, max_open, open_jitter, half_open_probes, scope } nested {});

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<RawWindow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_keys: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<Dur>,
    /// `instance` (default) or `fleet`: whether the token bucket is shared
    /// through `[state]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// How many instances share a fleet bucket: each takes its share
    /// locally while the shared state is away.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_instances: Option<u32>,
}
mergeable!(RawRateLimit { rps, burst, window, key, max_keys, max_wait, scope, expected_instances } nested {});

/// `[….idempotency]`: the idempotency-key store (docs/reference/idempotency.md#idempotency-keys).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdempotency {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<Vec<String>>,
}
mergeable!(RawIdempotency { enabled, ttl, max_bytes, max_response_bytes, methods, scope } nested {});

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawWindow {
    pub limit: u32,
    pub period: Dur,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_key: Option<String>,
}
