//! The status page on the admin listener (docs/reference/admin.md#status-page):
//! `GET /` (one HTML file, `page.html`, with its script and styles inline)
//! and `GET /status.json`, which the page's script reads every 2 s.
//!
//! - [`ring`]: per upstream, a fixed ring of counter samples and the last
//!   breaker transitions, held in the upstream's live state (so a reload that
//!   adds or removes an upstream adds or removes its history).
//! - [`sample`]: the background task that fills the rings every
//!   [`ring::INTERVAL`], reading the counters the data plane already keeps
//!   (the metric families); the data plane does nothing for it.
//! - [`report`]: `/status.json`, computed from the rings, one fresh sample
//!   and the live policy state.

pub mod report;

use crate::metrics::Metrics;
use crate::policy::StopReason;
use crate::proxy::body::{full, Body};
use crate::proxy::{ProxyHandle, Snapshot};
use crate::state::ring::{self, Sample, BUCKETS, REFUSAL_CODES};
use http::{header, HeaderValue, Response, StatusCode};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// The page: markup, styles and script in one file, nothing fetched from
/// anywhere but `/status.json` on the same listener.
const PAGE: &str = include_str!("page.html");

/// What the page may load: nothing but itself and `/status.json`.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// Samples every upstream of the current snapshot every [`ring::INTERVAL`]
/// until `stop` is set.
pub async fn sample(proxy: Arc<ProxyHandle>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(ring::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = crate::shutdown::stopped(&mut stop) => break,
        }
        sample_once(&proxy.snapshot());
    }
}

/// Takes one sample of every upstream of `snap` into its ring.
pub fn sample_once(snap: &Snapshot) {
    let (mut samples, bounds) = read(&snap.metrics, snap);
    for u in &snap.upstreams {
        // The idempotency stores' expired records go on the same tick.
        u.state.sweep();
        if let Some(s) = samples.remove(&u.state.name) {
            u.state.recent.push(s, &bounds);
        }
    }
}

/// The counters of every upstream of `snap` now, and the request-duration
/// histogram's bucket bounds.
pub(crate) fn read(metrics: &Metrics, snap: &Snapshot) -> (HashMap<String, Sample>, Vec<f64>) {
    let mut out: HashMap<String, Sample> = snap
        .upstreams
        .iter()
        .map(|u| {
            let s = Sample {
                at: u.state.now(),
                ..Sample::default()
            };
            (u.state.name.clone(), s)
        })
        .collect();
    let mut bounds = Vec::new();
    for family in metrics.status_families() {
        let name = family.name().to_string();
        for m in family.get_metric() {
            let label = |l: &str| {
                m.get_label()
                    .iter()
                    .find(|p| p.name() == l)
                    .map(|p| p.value().to_string())
                    .unwrap_or_default()
            };
            let Some(s) = out.get_mut(&label("upstream")) else {
                continue;
            };
            // Counters hold whole numbers; f64 represents them exactly up to 2^53.
            let value = m.get_counter().get_value() as u64;
            match name.as_str() {
                "weir_requests_total" => {
                    s.requests += value;
                    // The upstream's answers below 500; weir's own
                    // answers (a 429, a 404) carry an `error` and are not.
                    let error = label("error");
                    // A gRPC call's outcome is its code: an `Unavailable`
                    // under HTTP 200 is no success.
                    let grpc = label("grpc_code");
                    let grpc_ok = grpc.is_empty()
                        || crate::policy::grpc::CODES
                            .iter()
                            .find(|(_, _, l)| *l == grpc)
                            .is_some_and(|(c, _, _)| {
                                crate::policy::grpc::http_equivalent(*c) < 500
                            });
                    if error.is_empty()
                        && grpc_ok
                        && label("code").parse::<u16>().is_ok_and(|c| c < 500)
                    {
                        s.successes += value;
                    }
                    if let Some(i) = REFUSAL_CODES.iter().position(|c| *c == error) {
                        s.refusals[i] += value;
                    }
                }
                "weir_retries_total" => s.retries += value,
                "weir_hedges_total" => {
                    if matches!(label("result").as_str(), "won" | "lost") {
                        s.hedges += value;
                    }
                }
                "weir_retry_stops_total" => {
                    let reason = label("reason");
                    if let Some(i) = StopReason::ALL.iter().position(|r| r.as_str() == reason) {
                        s.stops[i] += value;
                    }
                }
                "weir_request_duration_seconds" => {
                    let h = m.get_histogram();
                    s.count = h.get_sample_count();
                    for (i, b) in h.get_bucket().iter().take(BUCKETS).enumerate() {
                        s.le[i] = b.cumulative_count();
                    }
                    if bounds.is_empty() {
                        bounds = h
                            .get_bucket()
                            .iter()
                            .take(BUCKETS)
                            .map(|b| b.upper_bound())
                            .collect();
                    }
                }
                _ => {}
            }
        }
    }
    (out, bounds)
}

fn respond(content_type: &'static str, body: String) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// `GET /`: the page.
pub fn page() -> Response<Body> {
    let mut r = respond("text/html; charset=utf-8", PAGE.to_string());
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

/// `GET /status.json`.
pub fn json(reloader: &crate::admin::reload::Reloader) -> Response<Body> {
    let proxy = reloader.proxy();
    let mut report = report::build(&proxy.snapshot(), proxy.draining());
    report.reload = Some(reloader.report());
    let body = serde_json::to_string(&report)
        .unwrap_or_else(|e| format!("{{\"error\":\"cannot encode the status: {e}\"}}"));
    respond("application/json", body)
}
