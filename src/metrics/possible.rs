//! What an upstream's config can make happen, as its series see it
//! (docs/reference/metrics.md#which-series-exist): a series for what can
//! happen exists at zero from the upstream's creation (so a rate or an
//! alert reads 0 before the first event, not nothing), and a series for
//! what cannot happen does not exist at all — and is removed when a reload
//! makes it impossible. The state layer says what is possible from the
//! config ([`Possible`]); [`super::UpstreamMetrics::fit`] makes the series
//! match.

use crate::policy::{Cause, StopReason};
use arc_swap::ArcSwapOption;
use std::sync::Arc;

/// What an upstream's config can produce.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Possible {
    /// It may speak HTTP/2 (`protocol = "h2c"` or `"grpc"`, or `"auto"`
    /// over `https://`): only then can a stream be refused unprocessed
    /// (`refused_stream`).
    pub h2: bool,
    /// The breaker is enabled (`circuit_open`).
    pub breaker: bool,
    /// A `[rate_limit]` (`rate_limited`).
    pub rate_limit: bool,
    /// `tunnel = true` (`weir_tunnels_open`; no `connect_not_allowed`).
    pub tunnel: bool,
    /// Idempotency keys are enabled (`idempotency_*`, `weir_idempotency_*`).
    pub idempotency: bool,
    /// The upstream's state is shared on Redis (`state_unavailable`, with
    /// `idempotency`).
    pub shared: bool,
    /// A `[hedge]` table (`weir_hedges_total`).
    pub hedge: bool,
    /// The response cache is on (`weir_cache_*`).
    pub cache: bool,
    /// `limit = "adaptive"` (`weir_concurrency_latency_seconds`).
    pub adaptive: bool,
    /// The causes `retry_on` lists.
    pub retry_on: Vec<Cause>,
}

/// The error codes no upstream was chosen for (they count under
/// `upstream="none"`).
const NEVER: [&str; 3] = ["no_route", "bad_request", "header_too_large"];

impl Possible {
    /// Whether the upstream can answer with weir's error `code`.
    pub fn error(&self, code: &str) -> bool {
        match code {
            "refused_stream" => self.h2,
            "connect_not_allowed" => !self.tunnel,
            "rate_limited" => self.rate_limit,
            "circuit_open" => self.breaker,
            "state_unavailable" => self.idempotency && self.shared,
            "idempotency_in_flight" | "idempotency_key_reused" | "idempotency_not_replayable" => {
                self.idempotency
            }
            c => !NEVER.contains(&c),
        }
    }

    /// Whether an attempt can end with `result` (`refused_stream` only over
    /// HTTP/2).
    pub fn result(&self, result: &str) -> bool {
        result != "refused_stream" || self.h2
    }

    /// The causes a retry can have: `retry_on`'s, and a refused stream
    /// (always retried) over HTTP/2.
    pub fn causes(&self) -> Vec<Cause> {
        self.retry_on
            .iter()
            .copied()
            .filter(|c| *c != Cause::RefusedStream)
            .chain(self.h2.then_some(Cause::RefusedStream))
            .collect()
    }

    /// Whether a retryable outcome can be stopped for `reason`.
    pub fn stop(&self, reason: StopReason) -> bool {
        match reason {
            StopReason::RateLimited => self.rate_limit,
            StopReason::CircuitOpen => self.breaker,
            _ => true,
        }
    }
}

/// A series' handle that a reload can drop and a later one make again:
/// made at the first use (or by `fit`), read without a lock.
#[derive(Debug)]
pub(super) struct SeriesSlot<T>(ArcSwapOption<T>);

impl<T> Default for SeriesSlot<T> {
    fn default() -> Self {
        SeriesSlot(ArcSwapOption::empty())
    }
}

impl<T> SeriesSlot<T> {
    /// The handle, made by `make` when there is none. Two callers that race
    /// both make it; a metric family hands both the same series.
    pub(super) fn get_or(&self, make: impl FnOnce() -> T) -> Arc<T> {
        if let Some(h) = self.0.load_full() {
            return h;
        }
        let h = Arc::new(make());
        self.0.store(Some(h.clone()));
        h
    }

    /// Drops the handle; `true` when there was one (its series is then the
    /// caller's to remove from its family).
    pub(super) fn clear(&self) -> bool {
        self.0.swap(None).is_some()
    }
}
