//! The concurrency limit's series (docs/reference/admission.md#concurrency):
//! `weir_concurrency_limit{upstream}` (the adaptive limit now, or
//! `max_in_flight`), `weir_concurrency_latency_seconds{upstream}` (the
//! adaptive limit's latency estimate) and
//! `weir_concurrency_refusals_total{upstream}` (requests refused
//! `overloaded`), following the gate's own counts on a scrape; and, for an
//! upstream with client-side throttling on
//! (docs/reference/admission.md#client-side-throttling),
//! `weir_throttle_probability{upstream}` and
//! `weir_throttle_refusals_total{upstream}`.

use super::follow::Follow;
use prometheus::{GaugeVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The families, registered once.
#[derive(Debug, Clone)]
pub struct ConcurrencyFamilies {
    limit: IntGaugeVec,
    latency: GaugeVec,
    refusals: IntCounterVec,
    throttle_p: GaugeVec,
    throttle_refusals: IntCounterVec,
}

impl ConcurrencyFamilies {
    pub fn register(r: &Registry) -> Self {
        let limit = IntGaugeVec::new(
            Opts::new(
                "weir_concurrency_limit",
                "Requests that may hold a slot on the upstream now: the adaptive limit, or max_in_flight.",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        let latency = GaugeVec::new(
            Opts::new(
                "weir_concurrency_latency_seconds",
                "The adaptive limit's latency estimate: the median attempt latency of its last window (0 before one; no series with a fixed limit).",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        let refusals = IntCounterVec::new(
            Opts::new(
                "weir_concurrency_refusals_total",
                "Requests the concurrency gate refused with 503 overloaded.",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        let throttle_p = GaugeVec::new(
            Opts::new(
                "weir_throttle_probability",
                "The probability client-side throttling refuses a request to the upstream now (only with throttle on).",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        let throttle_refusals = IntCounterVec::new(
            Opts::new(
                "weir_throttle_refusals_total",
                "Requests client-side throttling refused with 503 overloaded before they reached the upstream (only with throttle on).",
            ),
            &["upstream"],
        )
        .expect("static metric definition");
        r.register(Box::new(throttle_p.clone()))
            .expect("metric registered once");
        r.register(Box::new(throttle_refusals.clone()))
            .expect("metric registered once");
        r.register(Box::new(limit.clone()))
            .expect("metric registered once");
        r.register(Box::new(latency.clone()))
            .expect("metric registered once");
        r.register(Box::new(refusals.clone()))
            .expect("metric registered once");
        ConcurrencyFamilies {
            limit,
            latency,
            refusals,
            throttle_p,
            throttle_refusals,
        }
    }

    /// One upstream's series, created at zero.
    pub fn upstream(&self, name: &str) -> ConcurrencySeries {
        ConcurrencySeries {
            limit: self.limit.with_label_values(&[name]),
            latency: Adaptive {
                upstream: name.to_string(),
                latency: self.latency.clone(),
                on: AtomicBool::new(false),
            },
            refusals: Follow::of([self.refusals.with_label_values(&[name])]),
            throttle: Throttled {
                upstream: name.to_string(),
                p: self.throttle_p.clone(),
                refusals: self.throttle_refusals.clone(),
                seen: Mutex::new(None),
            },
        }
    }

    pub fn forget(&self, name: &str) {
        self.limit.remove_label_values(&[name]).ok();
        self.latency.remove_label_values(&[name]).ok();
        self.refusals.remove_label_values(&[name]).ok();
        self.throttle_p.remove_label_values(&[name]).ok();
        self.throttle_refusals.remove_label_values(&[name]).ok();
    }
}

/// One upstream's series.
#[derive(Debug)]
pub struct ConcurrencySeries {
    limit: IntGauge,
    latency: Adaptive,
    refusals: Follow<1>,
    throttle: Throttled,
}

/// One upstream's `weir_concurrency_latency_seconds`, present only while
/// its limit is adaptive (a fixed limit has no latency estimate).
#[derive(Debug)]
struct Adaptive {
    upstream: String,
    latency: GaugeVec,
    on: AtomicBool,
}

/// One upstream's throttling series, present only while it is on.
#[derive(Debug)]
struct Throttled {
    upstream: String,
    p: GaugeVec,
    refusals: IntCounterVec,
    /// The refusals last shown, kept while the series are absent so that a
    /// series made again counts only what came after.
    seen: Mutex<Option<u64>>,
}

impl ConcurrencySeries {
    /// Brings the series up to the gate's `limit`, `latency` estimate and
    /// `refusals` since the start.
    pub fn show(&self, limit: u32, latency: Option<Duration>, refusals: u64) {
        self.limit.set(i64::from(limit));
        let a = &self.latency;
        if a.on.load(Ordering::Relaxed) {
            a.latency
                .with_label_values(&[a.upstream.as_str()])
                .set(latency.map_or(0.0, |d| d.as_secs_f64()));
        }
        self.refusals.show([refusals]);
    }

    /// Makes `weir_concurrency_latency_seconds` exist (at 0 until the
    /// adaptive limit's first window) with an adaptive limit, and not
    /// with a fixed one (docs/reference/metrics.md#which-series-exist).
    pub fn fit(&self, adaptive: bool) {
        let a = &self.latency;
        a.on.store(adaptive, Ordering::Relaxed);
        let name = [a.upstream.as_str()];
        if adaptive {
            a.latency.with_label_values(&name);
        } else {
            a.latency.remove_label_values(&name).ok();
        }
    }

    /// Brings the throttling series up to `throttle`'s probability and
    /// refusals (since the upstream was created); `None` (off) removes them,
    /// and they come back from the count at that moment.
    pub fn show_throttle(&self, throttle: Option<(f64, u64)>) {
        let t = &self.throttle;
        let Ok(mut seen) = t.seen.lock() else {
            return;
        };
        let name = [t.upstream.as_str()];
        match throttle {
            Some((p, refusals)) => {
                t.p.with_label_values(&name).set(p);
                let from = seen.filter(|&s| s <= refusals).unwrap_or(0);
                t.refusals.with_label_values(&name).inc_by(refusals - from);
                *seen = Some(refusals);
            }
            None => {
                // Removed; made again from zero when it is turned on, the
                // refusals before counted as seen.
                t.p.remove_label_values(&name).ok();
                t.refusals.remove_label_values(&name).ok();
            }
        }
    }
}
