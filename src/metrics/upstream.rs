//! One upstream's metric handles (docs/reference/metrics.md#metrics), resolved
//! once when its live state is created ([`super::Metrics::upstream`]): the
//! hot path increments a counter it already holds.

use super::{cache, idempotency};
use super::{ATTEMPT_RESULTS, BODY_ERRORS, ERROR_CODES, STATES};
use crate::policy::{Cause, HedgeResult, Outcome, StateKind, StopReason};
use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// One upstream's handles, resolved once.
#[derive(Debug)]
pub struct UpstreamMetrics {
    pub(super) name: String,
    pub(super) requests: IntCounterVec,
    pub(super) statuses: Box<[OnceLock<IntCounter>]>,
    /// `weir_requests_total{error}` by [`ERROR_CODES`]: created at zero by
    /// [`UpstreamMetrics::precreate_errors`] for the codes the upstream's
    /// config can produce, else at the first count.
    pub(super) errors: [OnceLock<IntCounter>; ERROR_CODES.len()],
    pub(super) request_duration: Histogram,
    pub(super) attempts: [IntCounter; ATTEMPT_RESULTS.len()],
    pub(super) attempt_duration: Histogram,
    pub(super) retries_vec: IntCounterVec,
    pub(super) retries: Mutex<HashMap<Cause, IntCounter>>,
    /// Created at start for the reasons the upstream's config can give
    /// (see [`UpstreamMetrics::precreate_features`]), else at the first.
    pub(super) stops: [OnceLock<IntCounter>; StopReason::ALL.len()],
    pub(super) stops_vec: IntCounterVec,
    /// Created by [`UpstreamMetrics::precreate_hedges`] when the upstream
    /// hedges, else at the first count.
    pub(super) hedges: [OnceLock<IntCounter>; HedgeResult::ALL.len()],
    pub(super) hedges_vec: IntCounterVec,
    pub(super) budget: Gauge,
    pub(super) breaker: [IntGauge; 3],
    pub(super) transitions: [IntCounter; 3],
    /// With a `[rate_limit]` ([`UpstreamMetrics::precreate_features`]),
    /// else at the first count.
    pub(super) rate_limited: OnceLock<IntCounter>,
    pub(super) rate_limited_vec: IntCounterVec,
    pub(super) in_flight: IntGauge,
    /// With `tunnel = true` ([`UpstreamMetrics::precreate_features`]),
    /// else at the first tunnel.
    pub(super) tunnels: OnceLock<IntGauge>,
    pub(super) tunnels_vec: prometheus::IntGaugeVec,
    /// `weir_upstream_body_errors_total`, by [`BODY_ERRORS`].
    pub(super) body_errors: [IntCounter; 2],
    /// `weir_idempotency_*`, brought up to the store's counts on a scrape.
    pub idempotency: idempotency::IdempotencySeries,
    /// `weir_cache_*`, brought up to the cache's counts on a scrape:
    /// created at the first scrape with a cache (an upstream without one
    /// has none of these series).
    pub(super) cache: OnceLock<cache::CacheSeries>,
    pub(super) cache_families: cache::CacheFamilies,
    /// `weir_concurrency_*`, brought up to the gate's on a scrape.
    pub concurrency: super::concurrency::ConcurrencySeries,
    /// `weir_upstream_connections_open`, `weir_upstream_bytes_total`.
    pub wire: crate::metrics::meter::Meter,
    /// gRPC calls' series, with their `grpc_code`.
    pub grpc: super::grpc::GrpcSeries,
}

impl UpstreamMetrics {
    /// A relayed response whose upstream body broke off after its head
    /// was sent: `upstream_reset` (ended early, reset, malformed framing)
    /// or `upstream_timeout` (idle past `idle_timeout`).
    pub fn body_error(&self, code: &str) {
        if let Some(i) = BODY_ERRORS.iter().position(|c| *c == code) {
            self.body_errors[i].inc();
        }
    }

    /// A request answered with an upstream status.
    pub fn status(&self, status: u16, took: Duration) {
        if let Some(slot) = status
            .checked_sub(100)
            .and_then(|i| self.statuses.get(usize::from(i)))
        {
            slot.get_or_init(|| {
                self.requests
                    .with_label_values(&[self.name.as_str(), &status.to_string(), ""])
            })
            .inc();
        }
        self.request_duration.observe(took.as_secs_f64());
    }

    /// A gRPC call answered: HTTP `status` with gRPC `code`, from the
    /// upstream, or from weir (`error`).
    pub fn grpc_call(&self, status: u16, error: Option<&str>, code: u8, took: Duration) {
        self.grpc.request(status, error.unwrap_or_default(), code);
        let refusal = error.is_some_and(|e| ERROR_CODES.iter().any(|(c, _, r)| *c == e && *r));
        if error == Some("rate_limited") {
            self.rate_limited().inc();
        }
        if !refusal {
            self.request_duration.observe(took.as_secs_f64());
        }
    }

    /// A request answered with one of weir's errors. A refusal (weir did
    /// not ask the upstream) takes no place in the latency histogram.
    pub fn error(&self, code: &str, took: Duration) {
        let found = ERROR_CODES.iter().position(|(c, _, _)| *c == code);
        if let Some(i) = found {
            self.error_series(i).inc();
        }
        if code == "rate_limited" {
            self.rate_limited().inc();
        }
        if !found.is_some_and(|i| ERROR_CODES[i].2) {
            self.request_duration.observe(took.as_secs_f64());
        }
    }

    pub fn attempt(&self, outcome: &Outcome, took: Duration) {
        if let Outcome::Response {
            grpc_status: Some(code),
            ..
        } = outcome
        {
            self.grpc.attempt(outcome, *code);
            self.attempt_duration.observe(took.as_secs_f64());
            return;
        }
        let label = outcome.result_label();
        if let Some(i) = ATTEMPT_RESULTS.iter().position(|r| *r == label) {
            self.attempts[i].inc();
        }
        self.attempt_duration.observe(took.as_secs_f64());
    }

    /// Creates the `weir_retries_total` series of these causes at zero, so a
    /// rate over them reads 0 before the first retry, not nothing.
    fn error_series(&self, i: usize) -> &IntCounter {
        self.errors[i].get_or_init(|| {
            let (code, status, _) = ERROR_CODES[i];
            self.requests
                .with_label_values(&[self.name.as_str(), status, code])
        })
    }

    /// `weir_requests_total{error}` at zero for each of `codes`: those the
    /// upstream can answer with, so that a rate reads 0 before the first
    /// (docs/reference/metrics.md#label-values). An unknown code is ignored.
    pub fn precreate_errors<'a>(&self, codes: impl IntoIterator<Item = &'a str>) {
        for code in codes {
            if let Some(i) = ERROR_CODES.iter().position(|(c, _, _)| *c == code) {
                self.error_series(i);
            }
        }
    }

    pub fn precreate_retries(&self, causes: &[Cause]) {
        let mut m = self.retries.lock().expect("metrics lock poisoned");
        for cause in causes {
            m.entry(*cause).or_insert_with(|| {
                self.retries_vec
                    .with_label_values(&[self.name.as_str(), &cause.to_string()])
            });
        }
    }

    pub fn retry(&self, cause: Cause) {
        let mut m = self.retries.lock().expect("metrics lock poisoned");
        m.entry(cause)
            .or_insert_with(|| {
                self.retries_vec
                    .with_label_values(&[self.name.as_str(), &cause.to_string()])
            })
            .inc();
    }

    fn stop_series(&self, i: usize) -> &IntCounter {
        self.stops[i].get_or_init(|| {
            self.stops_vec
                .with_label_values(&[self.name.as_str(), StopReason::ALL[i].as_str()])
        })
    }

    pub fn stop(&self, reason: StopReason) {
        if let Some(i) = StopReason::ALL.iter().position(|r| *r == reason) {
            self.stop_series(i).inc();
        }
    }

    fn hedge_series(&self, i: usize) -> &IntCounter {
        self.hedges[i].get_or_init(|| {
            self.hedges_vec
                .with_label_values(&[self.name.as_str(), HedgeResult::ALL[i].as_str()])
        })
    }

    /// `weir_hedges_total{result}` at zero for every result: for an
    /// upstream that hedges (docs/reference/metrics.md#label-values).
    pub fn precreate_hedges(&self) {
        for i in 0..HedgeResult::ALL.len() {
            self.hedge_series(i);
        }
    }

    fn rate_limited(&self) -> &IntCounter {
        self.rate_limited.get_or_init(|| {
            self.rate_limited_vec
                .with_label_values(&[self.name.as_str()])
        })
    }

    /// `weir_rate_limited_total` with a rate limit and `weir_tunnels_open`
    /// with `tunnel = true`, at zero: series for what the upstream's config
    /// can do (docs/reference/metrics.md#label-values).
    /// Also `weir_retry_stops_total{reason}` for every reason but
    /// `rate_limited` without a rate limit, and `circuit_open` without a
    /// breaker.
    pub fn precreate_features(&self, rate_limit: bool, tunnel: bool, breaker: bool) {
        for (i, r) in StopReason::ALL.iter().enumerate() {
            let cannot = (*r == StopReason::RateLimited && !rate_limit)
                || (*r == StopReason::CircuitOpen && !breaker);
            if !cannot {
                self.stop_series(i);
            }
        }
        if rate_limit {
            self.rate_limited();
        }
        if tunnel {
            self.tunnels();
        }
    }

    /// `weir_cache_*` for this upstream, created at zero on first use.
    pub fn cache(&self) -> &cache::CacheSeries {
        self.cache
            .get_or_init(|| self.cache_families.upstream(&self.name))
    }

    /// `weir_hedges_total{result}`.
    pub fn hedge(&self, result: HedgeResult) {
        if let Some(i) = HedgeResult::ALL.iter().position(|r| *r == result) {
            self.hedge_series(i).inc();
        }
    }

    pub fn transition(&self, to: StateKind) {
        if let Some(i) = STATES.iter().position(|s| *s == to) {
            self.transitions[i].inc();
        }
        self.set_breaker(to);
    }

    pub fn set_breaker(&self, current: StateKind) {
        for (i, s) in STATES.iter().enumerate() {
            self.breaker[i].set(i64::from(*s == current));
        }
    }

    pub fn set_budget(&self, tokens: f64) {
        self.budget.set(tokens);
    }

    pub fn set_in_flight(&self, n: u32) {
        self.in_flight.set(i64::from(n));
    }

    /// The `weir_tunnels_open` gauge, raised while a CONNECT tunnel is open.
    pub fn tunnels(&self) -> &IntGauge {
        self.tunnels
            .get_or_init(|| self.tunnels_vec.with_label_values(&[self.name.as_str()]))
    }
}
