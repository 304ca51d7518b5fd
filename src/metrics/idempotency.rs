//! The idempotency store's series (docs/behaviour.md#idempotency-keys):
//! `weir_idempotency_total{upstream, result}` and
//! `weir_idempotency_bytes{upstream}`. The store counts for itself (its
//! evictions and expiries happen inside it); the counters here follow its
//! [`IdempotencyStats`] by difference when `/metrics` is scraped, so a
//! request pays nothing for them.

use crate::policy::idempotency::IdempotencyStats;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use std::sync::Mutex;

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
pub struct Families {
    total: IntCounterVec,
    bytes: IntGaugeVec,
}

impl Families {
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
        Families { total, bytes }
    }

    /// One upstream's series, created at zero.
    pub fn upstream(&self, name: &str) -> Series {
        Series {
            total: RESULTS.map(|r| self.total.with_label_values(&[name, r])),
            bytes: self.bytes.with_label_values(&[name]),
            seen: Mutex::new([0; 7]),
        }
    }

    pub fn forget(&self, name: &str) {
        for r in RESULTS {
            self.total.remove_label_values(&[name, r]).ok();
        }
        self.bytes.remove_label_values(&[name]).ok();
    }
}

/// One upstream's series and the store counts they last showed.
#[derive(Debug)]
pub struct Series {
    total: [IntCounter; 7],
    bytes: IntGauge,
    seen: Mutex<[u64; 7]>,
}

impl Series {
    /// Brings the series up to `stats`. A store that started anew (its
    /// counts below those seen) adds from zero.
    pub fn show(&self, stats: &IdempotencyStats) {
        let now = counts(stats);
        if let Ok(mut seen) = self.seen.lock() {
            for (i, c) in self.total.iter().enumerate() {
                let from = if now[i] < seen[i] { 0 } else { seen[i] };
                c.inc_by(now[i] - from);
            }
            *seen = now;
        }
        self.bytes
            .set(i64::try_from(stats.bytes).unwrap_or(i64::MAX));
    }
}
