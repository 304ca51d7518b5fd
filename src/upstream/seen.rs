//! What is seen of an upstream's endpoints from outside: the status page's
//! view of each, and the gauges set when `/metrics` is scraped — the
//! ejection series only while an endpoint can be ejected
//! (docs/reference/metrics.md#which-series-exist).

use super::{cap, Endpoint, EndpointView, Endpoints};
use std::sync::Arc;

impl Endpoints {
    /// Each endpoint as the status page shows it.
    pub fn views(&self) -> Vec<EndpointView> {
        let now = self.clock.now();
        self.set.load().iter().map(|e| e.view(now)).collect()
    }

    /// Sets the gauges; called when `/metrics` is scraped.
    pub fn refresh_gauges(&self) {
        let now = self.clock.now();
        let mut ejected = 0;
        let set = self.set.load();
        for e in set.iter() {
            let s = e.stats();
            let out = s.health.is_out();
            ejected += usize::from(out);
            e.metrics.show_ejected(out);
            e.metrics.latency.set(s.ewma.estimate_at(now) / 1e9);
            e.metrics.in_flight.set(i64::from(e.in_flight()));
        }
        self.counts.show(set.len() - ejected, ejected);
    }

    /// Makes the ejection series of `set` exist while one of its endpoints
    /// can be ejected — more than one, and `max_ejected` lets one go — and
    /// not otherwise: an upstream's only endpoint is never ejected
    /// (docs/reference/endpoints.md#ejection).
    pub(super) fn fit(&self, set: &[Arc<Endpoint>]) {
        let n = set.len();
        let ejectable = n > 1 && cap(n, self.params.load().ejection.max_ejected) > 0;
        for e in set {
            e.metrics.fit(ejectable);
        }
        self.counts.fit(ejectable);
    }
}
