//! Every metric family weir exports (docs/reference/metrics.md#metrics), in one place.
//!
//! Label values come only from the configuration (upstream names, `retry_on`
//! entries) and fixed sets (status codes 100–599, weir's error codes, attempt
//! results, stop reasons, breaker states) — never from a request — so a client
//! cannot create series. Per-upstream handles are resolved when an upstream's
//! live state is created and reused by every request after that: the hot path
//! increments a counter it already holds. Gauges that describe state (budget
//! balance, breaker state, requests in flight) are read when `/metrics` is
//! scraped.

pub mod cache;
pub mod concurrency;
pub mod endpoints;
mod follow;
pub mod grpc;
pub mod idempotency;
mod labels;
pub mod meter;
mod possible;
pub mod state;
pub mod trace;
mod upstream;
mod wire;

pub use possible::Possible;
pub use upstream::UpstreamMetrics;

pub use labels::{ATTEMPT_RESULTS, BODY_ERRORS, ERROR_CODES};

use crate::policy::{Cause, HedgeResult, StateKind, StopReason};
pub use endpoints::DnsMetrics;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

pub use crate::config::NO_UPSTREAM;

const STATES: [StateKind; 3] = [StateKind::Closed, StateKind::Open, StateKind::HalfOpen];

/// The metric families and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// gRPC calls' series, with their `grpc_code`.
    grpc: grpc::GrpcFamilies,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    attempts: IntCounterVec,
    attempt_duration: HistogramVec,
    retries: IntCounterVec,
    stops: IntCounterVec,
    hedges: IntCounterVec,
    budget_tokens: GaugeVec,
    breaker_state: IntGaugeVec,
    breaker_transitions: IntCounterVec,
    rate_limited: IntCounterVec,
    in_flight: IntGaugeVec,
    tunnels: IntGaugeVec,
    body_errors: IntCounterVec,
    reloads: IntCounterVec,
    last_reload: IntGauge,
    dns_resolutions: IntCounterVec,
    dns_addresses: IntGaugeVec,
    idempotency: idempotency::IdempotencyFamilies,
    cache: cache::CacheFamilies,
    concurrency: concurrency::ConcurrencyFamilies,
    endpoints: endpoints::EndpointFamilies,
    state: state::StateMetrics,
    trace: trace::TraceFamilies,
    wire: wire::WireFamilies,
    /// `weir_requests_total{upstream="none", code="no_route"}`.
    no_route: IntCounter,
    bad_request: IntCounter,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn histogram(r: &Registry, name: &str, help: &str) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()),
        &["upstream"],
    )
    .expect("static metric definition");
    r.register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        const REQUESTS_HELP: &str = "Client requests answered, by upstream, HTTP status, weir's error code when weir answered itself (empty for the upstream's answers), and for gRPC calls the gRPC code the client received.";
        const ATTEMPTS_HELP: &str = "Attempts sent to the upstream, by result (and, for gRPC calls answered with a status, its gRPC code).";
        let requests = counter(
            &r,
            "weir_requests_total",
            REQUESTS_HELP,
            &["upstream", "code", "error"],
        );
        let request_duration = histogram(
            &r,
            "weir_request_duration_seconds",
            "Time from a request's arrival to its response headers, retries and backoff included, over requests weir sent upstream (not its refusals: rate limited, circuit open, overloaded, bad requests).",
        );
        let attempts = counter(
            &r,
            "weir_upstream_attempts_total",
            ATTEMPTS_HELP,
            &["upstream", "result"],
        );
        let attempt_duration = histogram(
            &r,
            "weir_upstream_attempt_duration_seconds",
            "Time from sending one attempt to its response headers or failure.",
        );
        let retries = counter(
            &r,
            "weir_retries_total",
            "Retries made, by what was retried.",
            &["upstream", "cause"],
        );
        let stops = counter(
            &r,
            "weir_retry_stops_total",
            "Retryable outcomes not retried, by the first failing check.",
            &["upstream", "reason"],
        );
        let hedges = counter(
            &r,
            "weir_hedges_total",
            "Hedges due, by what became of them: won or lost when sent, skipped_* when not.",
            &["upstream", "result"],
        );
        let budget_tokens = GaugeVec::new(
            Opts::new(
                "weir_retry_budget_tokens",
                "Retries the budget would allow now.",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        r.register(Box::new(budget_tokens.clone()))
            .expect("metric registered once");
        let breaker_state = IntGaugeVec::new(
            Opts::new(
                "weir_breaker_state",
                "The breaker's current state: 1 for the current one, 0 for the others.",
            ),
            &["upstream", "state"],
        )
        .expect("static metric definition");
        r.register(Box::new(breaker_state.clone()))
            .expect("metric registered once");
        let breaker_transitions = counter(
            &r,
            "weir_breaker_transitions_total",
            "Breaker transitions, by the state entered.",
            &["upstream", "to"],
        );
        let rate_limited = counter(
            &r,
            "weir_rate_limited_total",
            "Requests refused with 429 by weir's rate limiter.",
            &["upstream"],
        );
        let in_flight = IntGaugeVec::new(
            Opts::new(
                "weir_in_flight_requests",
                "Requests holding a concurrency slot now.",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        r.register(Box::new(in_flight.clone()))
            .expect("metric registered once");
        let tunnels = IntGaugeVec::new(
            Opts::new(
                "weir_tunnels_open",
                "CONNECT tunnels open now (each also holds a concurrency slot).",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        r.register(Box::new(tunnels.clone()))
            .expect("metric registered once");
        let body_errors = counter(
            &r,
            "weir_upstream_body_errors_total",
            "Relayed responses whose upstream body broke off after their head was sent (counted under that status in weir_requests_total); the client's connection or stream was ended short.",
            &["upstream", "error"],
        );
        let reloads = counter(
            &r,
            "weir_config_reloads_total",
            "Config reload attempts, by result.",
            &["result"],
        );
        let last_reload = IntGauge::new(
            "weir_config_last_reload_success",
            "1 when the last config (re)load succeeded.",
        )
        .expect("static metric definition");
        r.register(Box::new(last_reload.clone()))
            .expect("metric registered once");
        // process_cpu_seconds_total, process_resident_memory_bytes,
        // process_open_fds, process_max_fds, process_virtual_memory_bytes,
        // process_start_time_seconds, process_threads: read from /proc when
        // scraped (Linux; elsewhere the collector reports nothing).
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("metric registered once");
        let build_info = IntGaugeVec::new(
            Opts::new(
                "weir_build_info",
                "Always 1; the labels say which weir is running.",
            ),
            &["version"],
        )
        .expect("static metric definition");
        r.register(Box::new(build_info.clone()))
            .expect("metric registered once");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let dns_resolutions = counter(
            &r,
            "weir_dns_resolutions_total",
            "Resolutions of upstream names (for the fast path), by result: ok or error (the last good addresses are kept).",
            &["upstream", "result"],
        );
        let dns_addresses = IntGaugeVec::new(
            Opts::new(
                "weir_dns_addresses",
                "Addresses an upstream's name resolves to now (new connections take them in turn).",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        r.register(Box::new(dns_addresses.clone()))
            .expect("metric registered once");
        let idempotency = idempotency::IdempotencyFamilies::register(&r);
        let cache = cache::CacheFamilies::register(&r);
        let concurrency = concurrency::ConcurrencyFamilies::register(&r);
        let endpoints = endpoints::EndpointFamilies::register(&r);
        let state = state::StateMetrics::register(&r);
        let trace = trace::TraceFamilies::register(&r);
        let wire = wire::WireFamilies::register(&r);
        reloads.with_label_values(&["ok"]);
        reloads.with_label_values(&["error"]);
        last_reload.set(1);
        let no_route = requests.with_label_values(&[NO_UPSTREAM, "404", "no_route"]);
        let bad_request = requests.with_label_values(&[NO_UPSTREAM, "400", "bad_request"]);
        Metrics {
            registry: r,
            grpc: grpc::GrpcFamilies::new(REQUESTS_HELP, ATTEMPTS_HELP),
            requests,
            request_duration,
            attempts,
            attempt_duration,
            retries,
            stops,
            hedges,
            budget_tokens,
            breaker_state,
            breaker_transitions,
            rate_limited,
            in_flight,
            tunnels,
            body_errors,
            reloads,
            last_reload,
            dns_resolutions,
            dns_addresses,
            idempotency,
            cache,
            concurrency,
            endpoints,
            state,
            trace,
            wire,
            no_route,
            bad_request,
        }
    }

    /// Handles for one upstream: the series every upstream has, at zero;
    /// the rest are made by [`UpstreamMetrics::fit`] for what its config
    /// can produce.
    pub fn upstream(&self, name: &str) -> UpstreamMetrics {
        let by = |v: &IntCounterVec, l: &str| v.with_label_values(&[name, l]);
        UpstreamMetrics {
            name: name.to_string(),
            requests: self.requests.clone(),
            statuses: (100..=599).map(|_| OnceLock::new()).collect(),
            errors: Default::default(),
            request_duration: self.request_duration.with_label_values(&[name]),
            attempts: Default::default(),
            attempts_vec: self.attempts.clone(),
            attempt_duration: self.attempt_duration.with_label_values(&[name]),
            retries_vec: self.retries.clone(),
            retries: Mutex::new(HashMap::new()),
            stops: Default::default(),
            stops_vec: self.stops.clone(),
            hedges: Default::default(),
            hedges_vec: self.hedges.clone(),
            budget: self.budget_tokens.with_label_values(&[name]),
            breaker: STATES.map(|s| self.breaker_state.with_label_values(&[name, s.as_str()])),
            transitions: STATES.map(|s| by(&self.breaker_transitions, s.as_str())),
            rate_limited: Default::default(),
            rate_limited_vec: self.rate_limited.clone(),
            in_flight: self.in_flight.with_label_values(&[name]),
            tunnels: Default::default(),
            tunnels_vec: self.tunnels.clone(),
            body_errors: BODY_ERRORS.map(|c| by(&self.body_errors, c)),
            idempotency: Default::default(),
            idempotency_families: self.idempotency.clone(),
            cache: Default::default(),
            cache_families: self.cache.clone(),
            concurrency: self.concurrency.upstream(name),
            wire: self.wire.upstream(name),
            grpc: self.grpc.upstream(name),
        }
    }

    /// Every family, the gRPC series folded in.
    fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families = self.registry.gather();
        grpc::merge(&mut families, self.grpc.gather());
        families
    }

    /// `weir_upstream_body_errors_total{upstream, error}` (see
    /// [`UpstreamMetrics::body_error`]), by the upstream's name.
    pub fn body_error(&self, upstream: &str, code: &str) {
        if BODY_ERRORS.contains(&code) {
            self.body_errors.with_label_values(&[upstream, code]).inc();
        }
    }

    /// The DNS series of an upstream whose URL names a host (created at
    /// zero when its resolver starts; an upstream with an IP literal has
    /// none).
    pub fn dns(&self, name: &str) -> DnsMetrics {
        DnsMetrics {
            ok: self.dns_resolutions.with_label_values(&[name, "ok"]),
            error: self.dns_resolutions.with_label_values(&[name, "error"]),
            addresses: self.dns_addresses.with_label_values(&[name]),
        }
    }

    /// Drops an upstream's DNS series (removed, or no longer named).
    pub fn forget_dns(&self, name: &str) {
        for r in ["ok", "error"] {
            self.dns_resolutions.remove_label_values(&[name, r]).ok();
        }
        self.dns_addresses.remove_label_values(&[name]).ok();
    }

    /// The per-endpoint families (`weir_endpoint*`).
    pub fn endpoints(&self) -> &endpoints::EndpointFamilies {
        &self.endpoints
    }

    /// The shared state's families (`weir_state_*`).
    pub fn state(&self) -> &state::StateMetrics {
        &self.state
    }

    /// The tracing exporter's families (`weir_trace_*`).
    pub fn trace(&self) -> &trace::TraceFamilies {
        &self.trace
    }

    /// One upstream's connection and byte counts (`metrics::meter`).
    pub fn wire(&self, name: &str) -> crate::metrics::meter::Meter {
        self.wire.upstream(name)
    }

    /// `weir_client_connections_open`.
    pub fn client_connections(&self) -> &IntGauge {
        self.wire.clients()
    }

    /// Drops every series of an upstream removed by a reload.
    pub fn forget(&self, name: &str) {
        self.wire.forget(name);
        self.forget_dns(name);
        self.endpoints.forget(name);
        self.state.forget(name);
        self.idempotency.forget(name);
        self.cache.forget(name);
        self.concurrency.forget(name);
        self.request_duration.remove_label_values(&[name]).ok();
        self.attempt_duration.remove_label_values(&[name]).ok();
        self.budget_tokens.remove_label_values(&[name]).ok();
        self.rate_limited.remove_label_values(&[name]).ok();
        self.in_flight.remove_label_values(&[name]).ok();
        self.tunnels.remove_label_values(&[name]).ok();
        for c in BODY_ERRORS {
            self.body_errors.remove_label_values(&[name, c]).ok();
        }
        for s in STATES {
            self.breaker_state
                .remove_label_values(&[name, s.as_str()])
                .ok();
            self.breaker_transitions
                .remove_label_values(&[name, s.as_str()])
                .ok();
        }
        for r in StopReason::ALL {
            self.stops.remove_label_values(&[name, r.as_str()]).ok();
        }
        for r in HedgeResult::ALL {
            self.hedges.remove_label_values(&[name, r.as_str()]).ok();
        }
        for r in ATTEMPT_RESULTS {
            self.attempts.remove_label_values(&[name, r]).ok();
        }
        for (c, status, _) in ERROR_CODES {
            self.requests.remove_label_values(&[name, status, c]).ok();
        }
        let causes = [
            Cause::ConnectFailure,
            Cause::RefusedStream,
            Cause::Reset,
            Cause::Timeout,
        ]
        .into_iter()
        .chain((100..=599).map(Cause::Status))
        .chain((0..32).map(Cause::Grpc));
        for c in causes {
            self.retries
                .remove_label_values(&[name, &c.to_string()])
                .ok();
        }
        for s in 100..=599u16 {
            self.requests
                .remove_label_values(&[name, &s.to_string(), ""])
                .ok();
        }
    }

    pub fn no_route(&self) {
        self.no_route.inc();
    }

    pub fn bad_request(&self) {
        self.bad_request.inc();
    }

    /// `weir_requests_total{upstream="none", code="431",
    /// error="header_too_large"}` (rare: not worth a cached handle).
    pub fn header_too_large(&self) {
        self.requests
            .with_label_values(&[NO_UPSTREAM, "431", "header_too_large"])
            .inc();
    }

    /// `weir_requests_total{upstream="none", code="405",
    /// error="connect_not_allowed"}`: a CONNECT that routes to no upstream.
    pub fn connect_not_allowed(&self) {
        self.requests
            .with_label_values(&[NO_UPSTREAM, "405", "connect_not_allowed"])
            .inc();
    }

    pub fn reload(&self, ok: bool) {
        self.reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
        self.last_reload.set(i64::from(ok));
    }

    /// The current values of one family's series for `upstream`, keyed by the
    /// value of `label` (for reports such as `weir chaos`).
    pub fn values(
        &self,
        family: &str,
        upstream: &str,
        label: &str,
    ) -> std::collections::BTreeMap<String, f64> {
        let mut out = std::collections::BTreeMap::new();
        for f in self.gather() {
            if f.name() != family {
                continue;
            }
            for m in f.get_metric() {
                let labels = m.get_label();
                let up = labels
                    .iter()
                    .find(|l| l.name() == "upstream")
                    .map(|l| l.value());
                if up != Some(upstream) {
                    continue;
                }
                let key = labels
                    .iter()
                    .find(|l| l.name() == label)
                    .map(|l| l.value().to_string())
                    .unwrap_or_default();
                let v = match f.get_field_type() {
                    prometheus::proto::MetricType::COUNTER => m.get_counter().get_value(),
                    _ => m.get_gauge().get_value(),
                };
                *out.entry(key).or_insert(0.0) += v;
            }
        }
        out
    }

    /// The Prometheus text format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.gather(), &mut buf) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Read access for the status page's sampler (docs/reference/admin.md#status-page).
impl Metrics {
    /// The current values of the four families the status page samples
    /// (requests, retries, retry stops, request duration), collected from
    /// those families alone, not the whole registry.
    pub fn status_families(&self) -> Vec<prometheus::proto::MetricFamily> {
        use prometheus::core::Collector;
        let families: [&dyn Collector; 4] = [
            &self.requests,
            &self.retries,
            &self.stops,
            &self.request_duration,
        ];
        let mut out: Vec<_> = families.iter().flat_map(|f| f.collect()).collect();
        grpc::merge(&mut out, self.grpc.requests());
        out
    }
}
