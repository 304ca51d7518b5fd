//! One upstream's metric handles (docs/reference/metrics.md#metrics), resolved
//! once when its live state is created ([`super::Metrics::upstream`]): the
//! hot path increments a counter it already holds.

use super::possible::{Possible, SeriesSlot};
use super::{cache, idempotency};
use super::{ATTEMPT_RESULTS, BODY_ERRORS, ERROR_CODES, STATES};
use crate::policy::{Cause, HedgeResult, Outcome, StateKind, StopReason};
use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// One upstream's handles, resolved once. The series of what its config
/// may not allow are held in [`SeriesSlot`]s, made by [`UpstreamMetrics::fit`]
/// (and at a first use) and dropped by it when a reload makes them
/// impossible (docs/reference/metrics.md#which-series-exist).
#[derive(Debug)]
pub struct UpstreamMetrics {
    pub(super) name: String,
    pub(super) requests: IntCounterVec,
    pub(super) statuses: Box<[OnceLock<IntCounter>]>,
    /// `weir_requests_total{error}` by [`ERROR_CODES`].
    pub(super) errors: [SeriesSlot<IntCounter>; ERROR_CODES.len()],
    pub(super) request_duration: Histogram,
    /// `weir_upstream_attempts_total{result}` by [`ATTEMPT_RESULTS`].
    pub(super) attempts: [SeriesSlot<IntCounter>; ATTEMPT_RESULTS.len()],
    pub(super) attempts_vec: IntCounterVec,
    pub(super) attempt_duration: Histogram,
    pub(super) retries_vec: IntCounterVec,
    pub(super) retries: Mutex<HashMap<Cause, IntCounter>>,
    /// Created at start for the reasons the upstream's config can give,
    /// else at the first.
    pub(super) stops: [SeriesSlot<IntCounter>; StopReason::ALL.len()],
    pub(super) stops_vec: IntCounterVec,
    pub(super) hedges: [SeriesSlot<IntCounter>; HedgeResult::ALL.len()],
    pub(super) hedges_vec: IntCounterVec,
    pub(super) budget: Gauge,
    pub(super) breaker: [IntGauge; 3],
    pub(super) transitions: [IntCounter; 3],
    pub(super) rate_limited: SeriesSlot<IntCounter>,
    pub(super) rate_limited_vec: IntCounterVec,
    pub(super) in_flight: IntGauge,
    pub(super) tunnels: SeriesSlot<IntGauge>,
    pub(super) tunnels_vec: prometheus::IntGaugeVec,
    /// `weir_upstream_body_errors_total`, by [`BODY_ERRORS`].
    pub(super) body_errors: [IntCounter; 2],
    /// `weir_idempotency_*`, brought up to the store's counts on a scrape,
    /// while the store is on.
    pub(super) idempotency: SeriesSlot<idempotency::IdempotencySeries>,
    pub(super) idempotency_families: idempotency::IdempotencyFamilies,
    /// `weir_cache_*`, brought up to the cache's counts on a scrape, while
    /// the cache is on.
    pub(super) cache: SeriesSlot<cache::CacheSeries>,
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
            self.attempt_series(i).inc();
        }
        self.attempt_duration.observe(took.as_secs_f64());
    }

    fn attempt_series(&self, i: usize) -> std::sync::Arc<IntCounter> {
        self.attempts[i].get_or(|| {
            self.attempts_vec
                .with_label_values(&[self.name.as_str(), ATTEMPT_RESULTS[i]])
        })
    }

    fn error_series(&self, i: usize) -> std::sync::Arc<IntCounter> {
        self.errors[i].get_or(|| {
            let (code, status, _) = ERROR_CODES[i];
            self.requests
                .with_label_values(&[self.name.as_str(), status, code])
        })
    }

    fn retries(&self) -> std::sync::MutexGuard<'_, HashMap<Cause, IntCounter>> {
        self.retries.lock().expect("metrics lock poisoned")
    }

    pub fn retry(&self, cause: Cause) {
        self.retries()
            .entry(cause)
            .or_insert_with(|| {
                self.retries_vec
                    .with_label_values(&[self.name.as_str(), &cause.to_string()])
            })
            .inc();
    }

    fn stop_series(&self, i: usize) -> std::sync::Arc<IntCounter> {
        self.stops[i].get_or(|| {
            self.stops_vec
                .with_label_values(&[self.name.as_str(), StopReason::ALL[i].as_str()])
        })
    }

    pub fn stop(&self, reason: StopReason) {
        if let Some(i) = StopReason::ALL.iter().position(|r| *r == reason) {
            self.stop_series(i).inc();
        }
    }

    fn hedge_series(&self, i: usize) -> std::sync::Arc<IntCounter> {
        self.hedges[i].get_or(|| {
            self.hedges_vec
                .with_label_values(&[self.name.as_str(), HedgeResult::ALL[i].as_str()])
        })
    }

    fn rate_limited(&self) -> std::sync::Arc<IntCounter> {
        self.rate_limited.get_or(|| {
            self.rate_limited_vec
                .with_label_values(&[self.name.as_str()])
        })
    }

    /// Makes the series match what the upstream's config can produce
    /// (docs/reference/metrics.md#which-series-exist): those it can, at zero
    /// when new; those it cannot, removed — at the upstream's creation and
    /// on every reload, so a feature a reload turns off takes its series
    /// with it. A request in flight across the reload may make one again
    /// with its count.
    pub fn fit(&self, can: &Possible) {
        let name = self.name.as_str();
        for (i, (code, status, _)) in ERROR_CODES.iter().enumerate() {
            if can.error(code) {
                self.error_series(i);
            } else if self.errors[i].clear() {
                self.requests
                    .remove_label_values(&[name, status, code])
                    .ok();
            }
        }
        for (i, result) in ATTEMPT_RESULTS.iter().enumerate() {
            if can.result(result) {
                self.attempt_series(i);
            } else if self.attempts[i].clear() {
                self.attempts_vec.remove_label_values(&[name, result]).ok();
            }
        }
        {
            let causes = can.causes();
            let mut retries = self.retries();
            retries.retain(|cause, _| {
                let keep = causes.contains(cause);
                if !keep {
                    let label = cause.to_string();
                    self.retries_vec.remove_label_values(&[name, &label]).ok();
                }
                keep
            });
            for cause in causes {
                retries.entry(cause).or_insert_with(|| {
                    self.retries_vec
                        .with_label_values(&[name, &cause.to_string()])
                });
            }
        }
        for (i, reason) in StopReason::ALL.iter().enumerate() {
            if can.stop(*reason) {
                self.stop_series(i);
            } else if self.stops[i].clear() {
                self.stops_vec
                    .remove_label_values(&[name, reason.as_str()])
                    .ok();
            }
        }
        for (i, result) in HedgeResult::ALL.iter().enumerate() {
            if can.hedge {
                self.hedge_series(i);
            } else if self.hedges[i].clear() {
                self.hedges_vec
                    .remove_label_values(&[name, result.as_str()])
                    .ok();
            }
        }
        if can.rate_limit {
            self.rate_limited();
        } else if self.rate_limited.clear() {
            self.rate_limited_vec.remove_label_values(&[name]).ok();
        }
        if can.tunnel {
            self.tunnels();
        } else if self.tunnels.clear() {
            self.tunnels_vec.remove_label_values(&[name]).ok();
        }
        if can.idempotency {
            self.idempotency();
        } else if self.idempotency.clear() {
            self.idempotency_families.forget(name);
        }
        if can.cache {
            self.cache();
        } else if self.cache.clear() {
            self.cache_families.forget(name);
        }
        self.concurrency.fit(can.adaptive);
    }

    /// `weir_cache_*` for this upstream, created at zero on first use.
    pub fn cache(&self) -> std::sync::Arc<cache::CacheSeries> {
        self.cache
            .get_or(|| self.cache_families.upstream(&self.name))
    }

    /// `weir_idempotency_*` for this upstream, created at zero on first use.
    pub fn idempotency(&self) -> std::sync::Arc<idempotency::IdempotencySeries> {
        self.idempotency
            .get_or(|| self.idempotency_families.upstream(&self.name))
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
    pub fn tunnels(&self) -> std::sync::Arc<IntGauge> {
        self.tunnels
            .get_or(|| self.tunnels_vec.with_label_values(&[self.name.as_str()]))
    }
}
