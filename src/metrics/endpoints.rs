//! The per-endpoint families (docs/reference/endpoints.md#seeing-it): bounded by each
//! upstream's `max_endpoints`, dropped when an endpoint goes away; those of
//! ejection only while an endpoint can be ejected.

use prometheus::{
    Gauge, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The families, registered once.
#[derive(Debug, Clone)]
pub struct EndpointFamilies {
    endpoints: IntGaugeVec,
    requests: IntCounterVec,
    failures: IntCounterVec,
    ejections: IntCounterVec,
    in_flight: IntGaugeVec,
    latency: GaugeVec,
    ejected: IntGaugeVec,
}

/// One endpoint's series. Those of ejection (`weir_endpoint_ejected`,
/// `weir_endpoint_ejections_total`) exist only while the endpoint can be
/// ejected ([`EndpointMetrics::fit`]): never for an upstream's only
/// endpoint (docs/reference/endpoints.md#ejection).
#[derive(Debug, Clone)]
pub struct EndpointMetrics {
    pub requests: IntCounter,
    pub failures: IntCounter,
    pub in_flight: IntGauge,
    pub latency: Gauge,
    ejected: IntGaugeVec,
    ejections: IntCounterVec,
    /// Whether the ejection series exist now.
    ejectable: Arc<AtomicBool>,
    upstream: String,
    endpoint: String,
}

impl EndpointMetrics {
    /// Counts one ejection, by its reason.
    pub fn ejection(&self, reason: &str) {
        self.ejections
            .with_label_values(&[&self.upstream, &self.endpoint, reason])
            .inc();
    }

    /// Sets `weir_endpoint_ejected` (when it exists): read at a scrape.
    pub fn show_ejected(&self, out: bool) {
        if self.ejectable.load(Ordering::Relaxed) {
            self.ejected
                .with_label_values(&[&self.upstream, &self.endpoint])
                .set(i64::from(out));
        }
    }

    /// Makes the ejection series exist, at zero when new, while the
    /// endpoint can be ejected, and removes them when it cannot
    /// (docs/reference/metrics.md#which-series-exist).
    pub fn fit(&self, ejectable: bool) {
        self.ejectable.store(ejectable, Ordering::Relaxed);
        let l = [self.upstream.as_str(), self.endpoint.as_str()];
        for reason in REASONS {
            let r = [l[0], l[1], reason];
            if ejectable {
                self.ejections.with_label_values(&r);
            } else {
                self.ejections.remove_label_values(&r).ok();
            }
        }
        if ejectable {
            self.ejected.with_label_values(&l);
        } else {
            self.ejected.remove_label_values(&l).ok();
        }
    }
}

/// An upstream's `weir_endpoints{state}` gauges: `active` always,
/// `ejected` while one of its endpoints can be ejected.
#[derive(Debug)]
pub struct EndpointCounts {
    family: IntGaugeVec,
    upstream: String,
    ejectable: AtomicBool,
}

impl EndpointCounts {
    /// Sets the gauges: read at a scrape.
    pub fn show(&self, active: usize, ejected: usize) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let u = self.upstream.as_str();
        self.family
            .with_label_values(&[u, "active"])
            .set(count(active));
        if self.ejectable.load(Ordering::Relaxed) {
            self.family
                .with_label_values(&[u, "ejected"])
                .set(count(ejected));
        }
    }

    /// As [`EndpointMetrics::fit`], for `state="ejected"`.
    pub fn fit(&self, ejectable: bool) {
        self.ejectable.store(ejectable, Ordering::Relaxed);
        let l = [self.upstream.as_str(), "ejected"];
        if ejectable {
            self.family.with_label_values(&l);
        } else {
            self.family.remove_label_values(&l).ok();
        }
    }
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

const REASONS: [&str; 3] = ["consecutive_failures", "failure_share", "probe_failed"];

impl EndpointFamilies {
    pub fn register(r: &Registry) -> Self {
        let ig = |name: &str, help: &str, labels: &[&str]| {
            reg(
                r,
                IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition"),
            )
        };
        let ic = |name: &str, help: &str, labels: &[&str]| {
            reg(
                r,
                IntCounterVec::new(Opts::new(name, help), labels)
                    .expect("static metric definition"),
            )
        };
        let ue = &["upstream", "endpoint"];
        EndpointFamilies {
            endpoints: ig("weir_endpoints", "An upstream's endpoints, by state: active or ejected.", &["upstream", "state"]),
            requests: ic("weir_endpoint_requests_total", "Attempts sent to an endpoint.", ue),
            failures: ic("weir_endpoint_failures_total", "Attempts to an endpoint that failed (connect failure, reset, timeout, a failure status).", ue),
            ejections: ic("weir_endpoint_ejections_total", "Ejections of an endpoint, by reason.", &["upstream", "endpoint", "reason"]),
            in_flight: ig("weir_endpoint_in_flight", "Attempts in flight to an endpoint.", ue),
            latency: reg(
                r,
                GaugeVec::new(
                    Opts::new("weir_endpoint_latency_seconds", "An endpoint's latency estimate (peak-EWMA of its response times) that the balancer reads."),
                    ue,
                )
                .expect("static metric definition"),
            ),
            ejected: ig("weir_endpoint_ejected", "1 while an endpoint is ejected (or waiting on its probe), else 0.", ue),
        }
    }

    /// The `weir_endpoints` gauges of one upstream (`active` at zero).
    pub fn counts(&self, upstream: &str) -> EndpointCounts {
        self.endpoints.with_label_values(&[upstream, "active"]);
        EndpointCounts {
            family: self.endpoints.clone(),
            upstream: upstream.to_string(),
            ejectable: AtomicBool::new(false),
        }
    }

    /// One endpoint's series, created at zero (those of ejection by
    /// [`EndpointMetrics::fit`]).
    pub fn endpoint(&self, upstream: &str, endpoint: &str) -> EndpointMetrics {
        let l = [upstream, endpoint];
        EndpointMetrics {
            requests: self.requests.with_label_values(&l),
            failures: self.failures.with_label_values(&l),
            in_flight: self.in_flight.with_label_values(&l),
            latency: self.latency.with_label_values(&l),
            ejected: self.ejected.clone(),
            ejections: self.ejections.clone(),
            ejectable: Arc::new(AtomicBool::new(false)),
            upstream: upstream.to_string(),
            endpoint: endpoint.to_string(),
        }
    }

    /// Drops one endpoint's series (it went away).
    pub fn forget_endpoint(&self, upstream: &str, endpoint: &str) {
        let l = [upstream, endpoint];
        self.requests.remove_label_values(&l).ok();
        self.failures.remove_label_values(&l).ok();
        self.in_flight.remove_label_values(&l).ok();
        self.latency.remove_label_values(&l).ok();
        self.ejected.remove_label_values(&l).ok();
        for reason in REASONS {
            self.ejections
                .remove_label_values(&[upstream, endpoint, reason])
                .ok();
        }
    }

    /// Drops an upstream's `weir_endpoints` gauges.
    pub fn forget(&self, upstream: &str) {
        for s in ["active", "ejected"] {
            self.endpoints.remove_label_values(&[upstream, s]).ok();
        }
    }
}

/// An upstream name's resolution counters (`weir_dns_*`, made by
/// `Metrics::dns`).
#[derive(Debug, Clone)]
pub struct DnsMetrics {
    pub(crate) ok: IntCounter,
    pub(crate) error: IntCounter,
    pub(crate) addresses: IntGauge,
}

impl DnsMetrics {
    /// One resolution: whether it answered, and the addresses in use after it.
    pub fn resolved(&self, ok: bool, addresses: usize) {
        if ok { &self.ok } else { &self.error }.inc();
        self.addresses.set(addresses as i64);
    }
}
