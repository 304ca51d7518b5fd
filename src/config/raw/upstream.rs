//! `[upstreams.NAME]`, its raw form: where the upstream is, how it is
//! reached, and its policy overrides (merged over `[defaults]`).

use super::*;

/// `[upstreams.NAME]`: where it is, how it is reached, and its policy
/// overrides. serde cannot combine `flatten` with `deny_unknown_fields`, so the
/// policy fields are repeated here and converted with [`RawUpstream::policy`].
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strip_prefix: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preserve_host: Option<bool>,
    /// With a `unix:` url: the `Host` / `:authority` sent upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// `CONNECT` to this upstream opens a TCP tunnel to its address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Inbound TLS on the dedicated listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen_tls: Option<RawListenerTls>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// How often a host name in `url` (or in `endpoints`) is resolved again. Default 5s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolve_every: Option<Dur>,
    /// The upstream's replicas as `host:port` entries; absent: every
    /// address the `url`'s host resolves to (docs/reference/endpoints.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<String>>,
    /// How an endpoint is picked: `peak_ewma` (default) or `round_robin`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<String>,
    /// Endpoints used at most (and so per-endpoint series). Default 64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_endpoints: Option<u32>,
    /// Passive outlier ejection of endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ejection: Option<RawEjection>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<RawUpstreamTls>,
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
    /// gRPC's own policy: the methods safe to retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc: Option<RawGrpc>,
}

/// `[upstreams.NAME.grpc]` (docs/guide/tls-and-grpc.md#grpc-policies).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGrpc {
    /// Methods safe to retry and hedge without a key: `/pkg.Svc/Method`
    /// or `/pkg.Svc/*`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotent_methods: Option<Vec<String>>,
}

/// `balance`'s default.
pub const DEFAULT_BALANCE: &str = "peak_ewma";
/// `max_endpoints`' default.
pub const DEFAULT_MAX_ENDPOINTS: u32 = 64;

impl RawUpstream {
    /// This upstream's policy fields, to merge over `[defaults]`.
    pub fn policy(&self) -> RawPolicy {
        RawPolicy {
            timeout: self.timeout,
            per_try_timeout: self.per_try_timeout,
            connect_timeout: self.connect_timeout,
            idle_timeout: self.idle_timeout,
            annotate: self.annotate,
            idempotency_header: self.idempotency_header.clone(),
            retry: self.retry.clone(),
            breaker: self.breaker.clone(),
            concurrency: self.concurrency.clone(),
            rate_limit: self.rate_limit.clone(),
            idempotency: self.idempotency.clone(),
            cache: self.cache.clone(),
            hedge: self.hedge.clone(),
            throttle: self.throttle.clone(),
        }
    }

    /// Writes a merged policy back, for printing the effective config.
    pub fn with_policy(mut self, p: RawPolicy) -> Self {
        self.timeout = p.timeout;
        self.per_try_timeout = p.per_try_timeout;
        self.connect_timeout = p.connect_timeout;
        self.idle_timeout = p.idle_timeout;
        self.annotate = p.annotate;
        self.idempotency_header = p.idempotency_header;
        self.retry = p.retry;
        self.breaker = p.breaker;
        self.concurrency = p.concurrency;
        self.rate_limit = p.rate_limit;
        self.idempotency = p.idempotency;
        self.cache = p.cache;
        self.hedge = p.hedge;
        self.throttle = p.throttle;
        self
    }
}
