//! The idempotency store's series (docs/reference/idempotency.md#idempotency-keys):
//! `weir_idempotency_total{upstream, result}` and
//! `weir_idempotency_bytes{upstream}`. The store counts for itself (its
//! evictions and expiries happen inside it); the counters here follow its
//! [`IdempotencyStats`] by difference when `/metrics` is scraped, so a
//! request pays nothing for them.

use super::follow::{self, Follow};
use crate::policy::idempotency::IdempotencyStats;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// The `result` label values, in [`counts`] order.
pub const RESULTS: [&str; 7] = [
    "stored",
    "replayed",
    "in_flight",
    "reused",
    "not_replayable",
    "evicted",
    "expired",
];

fn counts(s: &IdempotencyStats) -> [u64; 7] {
    [
        s.stored,
        s.replayed,
        s.in_flight,
        s.reused,
        s.not_replayable,
        s.evicted,
        s.expired,
    ]
}

/// The two families, registered once.
#[derive(Debug, Clone)]
pub struct IdempotencyFamilies {
    total: IntCounterVec,
    bytes: IntGaugeVec,
}

impl IdempotencyFamilies {
    pub fn register(r: &Registry) -> Self {
        let total = IntCounterVec::new(
            Opts::new(
                "weir_idempotency_total",
                "Idempotency-store events, by result: stored, replayed, in_flight, reused, not_replayable, evicted, expired.",
            ),
            &["upstream", "result"],
        )
        .expect("static metric definition");
        let bytes = IntGaugeVec::new(
            Opts::new(
                "weir_idempotency_bytes",
                "Bytes the idempotency store accounts for now (bounded by max_bytes).",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        r.register(Box::new(total.clone()))
            .expect("metric registered once");
        r.register(Box::new(bytes.clone()))
            .expect("metric registered once");
        IdempotencyFamilies { total, bytes }
    }

    /// One upstream's series, created at zero.
    pub fn upstream(&self, name: &str) -> IdempotencySeries {
        IdempotencySeries {
            total: Follow::new(&self.total, name, RESULTS),
            bytes: self.bytes.with_label_values(&[name]),
        }
    }

    pub fn forget(&self, name: &str) {
        follow::forget(&self.total, name, &RESULTS);
        self.bytes.remove_label_values(&[name]).ok();
    }
}

/// One upstream's series and the store counts they last showed.
#[derive(Debug)]
pub struct IdempotencySeries {
    total: Follow<7>,
    bytes: IntGauge,
}

impl IdempotencySeries {
    /// Brings the series up to `stats`. A store that started anew (its
    /// counts below those seen) adds from zero.
    pub fn show(&self, stats: &IdempotencyStats) {
        self.total.show(counts(stats));
        self.bytes
            .set(i64::try_from(stats.bytes).unwrap_or(i64::MAX));
    }
}
