//! The response cache's series (docs/reference/cache.md#response-cache):
//! `weir_cache_requests_total{upstream, result}`, `weir_cache_bytes{upstream}`
//! and `weir_cache_evictions_total{upstream}`, following the cache's own
//! [`CacheStats`] on a scrape ([`super::follow`]).

use super::follow::{self, Follow};
use crate::policy::cache::{CacheResult, CacheStats};
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// The `result` label values: what `x-weir-cache` says.
const RESULTS: [CacheResult; 6] = CacheResult::ALL;

/// The three families, registered once.
#[derive(Debug, Clone)]
pub struct CacheFamilies {
    requests: IntCounterVec,
    bytes: IntGaugeVec,
    evictions: IntCounterVec,
}

impl CacheFamilies {
    pub fn register(r: &Registry) -> Self {
        let requests = IntCounterVec::new(
            Opts::new(
                "weir_cache_requests_total",
                "Requests the response cache handled, by result (as x-weir-cache): hit, miss, stale, stale-if-error, revalidated, coalesced.",
            ),
            &["upstream", "result"],
        )
        .expect("static metric definition");
        let bytes = IntGaugeVec::new(
            Opts::new(
                "weir_cache_bytes",
                "Bytes the response cache accounts for now (bounded by max_bytes).",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        let evictions = IntCounterVec::new(
            Opts::new(
                "weir_cache_evictions_total",
                "Response-cache entries evicted for room (by bytes, or past 8 variants of a key).",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        for c in [&requests, &evictions] {
            r.register(Box::new(c.clone()))
                .expect("metric registered once");
        }
        r.register(Box::new(bytes.clone()))
            .expect("metric registered once");
        CacheFamilies {
            requests,
            bytes,
            evictions,
        }
    }

    /// One upstream's series, created at zero.
    pub fn upstream(&self, name: &str) -> CacheSeries {
        CacheSeries {
            requests: Follow::new(&self.requests, name, RESULTS.map(CacheResult::name)),
            evictions: Follow::of([self.evictions.with_label_values(&[name])]),
            bytes: self.bytes.with_label_values(&[name]),
        }
    }

    pub fn forget(&self, name: &str) {
        follow::forget(&self.requests, name, &RESULTS.map(CacheResult::name));
        self.evictions.remove_label_values(&[name]).ok();
        self.bytes.remove_label_values(&[name]).ok();
    }
}

/// One upstream's series.
#[derive(Debug)]
pub struct CacheSeries {
    requests: Follow<6>,
    evictions: Follow<1>,
    bytes: IntGauge,
}

impl CacheSeries {
    /// Brings the series up to `stats`.
    pub fn show(&self, stats: &CacheStats) {
        self.requests.show(RESULTS.map(|r| stats.result(r)));
        self.evictions.show([stats.evictions]);
        self.bytes
            .set(i64::try_from(stats.bytes).unwrap_or(i64::MAX));
    }
}
