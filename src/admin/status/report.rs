//! `/status.json` (docs/reference/admin.md#status-page): per upstream, the breaker
//! and how long it has been in its state, rates over the last
//! [`RATE_WINDOW`], latency quantiles over the last [`LATENCY_WINDOW`], the
//! live budget, gate and limiter, and the history the sparklines draw.
//! Rates are differences between two samples of the same counters.

use crate::policy::{StateKind, StateView, StopReason};
use crate::proxy::{Snapshot, Upstream};
use crate::state::ring::{Memory, Sample, CAPACITY, INTERVAL, REFUSAL_CODES};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// What the rates (requests, success, refusals, retries, stops) are
/// measured over.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);
/// What p50 and p99 are measured over.
pub const LATENCY_WINDOW: Duration = Duration::from_secs(60);

/// The whole document.
#[derive(Debug, Serialize)]
pub struct Report {
    pub generated_at_unix_ms: u64,
    pub sample_interval_s: f64,
    pub history_s: f64,
    pub draining: bool,
    pub upstreams: Vec<UpstreamReport>,
    /// The last reload and whether the file on disk is the config that
    /// runs (set by the admin listener, which holds the reloader).
    pub reload: Option<crate::admin::reload::ReloadReport>,
}

/// One upstream's row.
#[derive(Debug, Serialize)]
pub struct UpstreamReport {
    pub name: String,
    pub target: String,
    pub breaker: BreakerReport,
    pub window_s: Option<f64>,
    pub requests_per_s: Option<f64>,
    pub success_rate: Option<f64>,
    /// weir's own refusals (answered without asking the upstream), per
    /// error code.
    pub refusals_per_s: Option<BTreeMap<&'static str, f64>>,
    pub refusals_total: BTreeMap<&'static str, u64>,
    pub retries_per_s: Option<f64>,
    /// Hedges sent per second (docs/reference/hedging.md#hedging).
    pub hedges_per_s: Option<f64>,
    pub retry_stops_per_s: Option<BTreeMap<&'static str, f64>>,
    pub retry_stops_total: BTreeMap<&'static str, u64>,
    pub retry_budget_tokens: f64,
    pub in_flight: u32,
    pub queued: u32,
    pub max_in_flight: u32,
    pub max_queue: u32,
    /// The limit in force now and, with `limit = "adaptive"`, its estimates
    /// (docs/reference/admission.md#adaptive-limit).
    pub concurrency: ConcurrencyReport,
    /// Client-side throttling; `None` while it is off
    /// (docs/reference/admission.md#client-side-throttling).
    pub throttle: Option<ThrottleReport>,
    pub rate_limit: Option<RateLimitReport>,
    pub latency_window_s: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub history: Vec<Point>,
    /// Its endpoints (docs/reference/endpoints.md#seeing-it).
    pub endpoints: Vec<crate::upstream::EndpointView>,
}

#[derive(Debug, Serialize)]
pub struct BreakerReport {
    pub enabled: bool,
    pub state: StateKind,
    pub since_s: f64,
    pub half_open_in_s: Option<f64>,
    /// Newest first.
    pub transitions: Vec<TransitionReport>,
}

#[derive(Debug, Serialize)]
pub struct TransitionReport {
    pub from: StateKind,
    pub to: StateKind,
    pub ago_s: f64,
    pub at_unix_ms: u64,
    pub open_for_s: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct ConcurrencyReport {
    /// `"fixed"` or `"adaptive"`.
    pub mode: &'static str,
    /// Requests that may hold a slot now.
    pub limit: u32,
    /// The adaptive limit's latency estimate and no-load latency.
    pub latency_ms: Option<f64>,
    pub baseline_ms: Option<f64>,
    /// Requests the gate refused `overloaded` since the upstream was created.
    pub refusals: u64,
}

#[derive(Debug, Serialize)]
pub struct ThrottleReport {
    /// The probability a request is refused now.
    pub probability: f64,
    /// Requests (answers and refusals) and accepts within its window.
    pub requests: u64,
    pub accepts: u64,
    /// Requests it refused since the upstream was created.
    pub refusals: u64,
}

#[derive(Debug, Serialize)]
pub struct RateLimitReport {
    pub rps: Option<f64>,
    pub burst: Option<u32>,
    pub tokens: Option<f64>,
    pub window_limit: Option<u32>,
    pub window_s: Option<f64>,
    pub window_remaining: Option<u64>,
    pub keyed: bool,
    pub keys: usize,
}

/// One sparkline point: the interval between two consecutive samples.
#[derive(Debug, Serialize)]
pub struct Point {
    pub ago_s: f64,
    pub requests_per_s: f64,
    pub success_rate: Option<f64>,
    pub retries_per_s: f64,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// The status of every upstream of `snap` now.
pub fn build(snap: &Snapshot, draining: bool) -> Report {
    let (mut live, bounds) = super::read(&snap.metrics, snap);
    let wall = unix_ms(crate::clock::Clock::default().wall());
    let upstreams = snap
        .upstreams
        .iter()
        .map(|u| {
            let now = live.remove(&u.state.name).unwrap_or_default();
            upstream(u, &now, &bounds, wall)
        })
        .collect();
    Report {
        generated_at_unix_ms: wall,
        sample_interval_s: INTERVAL.as_secs_f64(),
        history_s: (INTERVAL * (CAPACITY as u32 - 1)).as_secs_f64(),
        draining,
        upstreams,
        reload: None,
    }
}

/// The newest sample at least `window` before `now` (else the oldest), and
/// the time between it and `now`; `None` when less than a second apart.
fn base<'a>(samples: &'a [Sample], now: &Sample, window: Duration) -> Option<(&'a Sample, f64)> {
    let cut = now.at.checked_sub(window).unwrap_or_default();
    let b = samples
        .iter()
        .rev()
        .find(|s| s.at <= cut)
        .or(samples.first())?;
    let dt = now.at.checked_sub(b.at)?.as_secs_f64();
    (dt >= 1.0).then_some((b, dt))
}

fn upstream(u: &Upstream, now: &Sample, bounds: &[f64], wall: u64) -> UpstreamReport {
    let state = &u.state;
    let memory = state.recent.memory();
    let c = &u.config;
    let (view, enabled, tokens, rate_limit) = {
        let mut live = state.live();
        let view = live.breaker.state(now.at);
        let enabled = live.breaker.params().enabled;
        let tokens = live.budget.balance(now.at);
        let rate_limit = live.limiter.as_ref().map(|l| {
            let p = l.params();
            let left = l.peek_shared(now.at);
            RateLimitReport {
                rps: p.bucket.map(|b| b.0),
                burst: p.bucket.map(|b| b.1),
                tokens: left.bucket_tokens.map(|t| (t * 100.0).floor() / 100.0),
                window_limit: p.window.map(|w| w.0),
                window_s: p.window.map(|w| w.1.as_secs_f64()),
                window_remaining: left.window_remaining,
                keyed: p.key.is_some(),
                keys: l.stats().size,
            }
        });
        (view, enabled, tokens, rate_limit)
    };
    let rates = base(&memory.samples, now, RATE_WINDOW);
    let per_s =
        |f: fn(&Sample) -> u64| rates.map(|(b, dt)| f(now).saturating_sub(f(b)) as f64 / dt);
    let retry_stops_per_s = rates.map(|(b, dt)| {
        StopReason::ALL
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    r.as_str(),
                    now.stops[i].saturating_sub(b.stops[i]) as f64 / dt,
                )
            })
            .collect()
    });
    let refusals_per_s = rates.map(|(b, dt)| {
        REFUSAL_CODES
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    *c,
                    now.refusals[i].saturating_sub(b.refusals[i]) as f64 / dt,
                )
            })
            .collect()
    });
    let latency = base(&memory.samples, now, LATENCY_WINDOW);
    let q = |q: f64| latency.and_then(|(b, _)| quantile(q, b, now, bounds));
    UpstreamReport {
        name: state.name.clone(),
        target: target(u),
        breaker: breaker(&memory, now.at, wall, view, enabled),
        window_s: rates.map(|r| secs(Duration::from_secs_f64(r.1))),
        requests_per_s: per_s(|s| s.requests),
        success_rate: rates.and_then(|(b, _)| share(b, now)),
        refusals_per_s,
        refusals_total: REFUSAL_CODES.iter().copied().zip(now.refusals).collect(),
        retries_per_s: per_s(|s| s.retries),
        hedges_per_s: per_s(|s| s.hedges),
        retry_stops_per_s,
        retry_stops_total: StopReason::ALL
            .iter()
            .enumerate()
            .map(|(i, r)| (r.as_str(), now.stops[i]))
            .collect(),
        retry_budget_tokens: (tokens * 100.0).floor() / 100.0,
        in_flight: state.gate.in_flight(),
        queued: state.gate.queued(),
        max_in_flight: c.concurrency.max_in_flight,
        max_queue: c.concurrency.max_queue,
        concurrency: {
            let g = state.gate.view();
            let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
            ConcurrencyReport {
                mode: if c.concurrency.adaptive.is_some() {
                    "adaptive"
                } else {
                    "fixed"
                },
                limit: g.limit,
                latency_ms: g.latency.map(ms),
                baseline_ms: g.baseline.map(ms),
                refusals: g.refusals,
            }
        },
        throttle: state.throttle.view().map(|t| ThrottleReport {
            probability: (t.probability * 1000.0).round() / 1000.0,
            requests: t.requests,
            accepts: t.accepts,
            refusals: t.refusals,
        }),
        rate_limit,
        latency_window_s: latency.map(|l| secs(Duration::from_secs_f64(l.1))),
        endpoints: u.endpoints.views(),
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        history: history(&memory.samples, now.at),
    }
}

/// `scheme://host:port` of the upstream's URL (never its credentials or path).
fn target(u: &Upstream) -> String {
    let url = &u.config.url;
    if url.host.contains(':') && !url.host.starts_with('[') {
        format!("{}://[{}]:{}", u.scheme, url.host, url.port)
    } else {
        format!("{}://{}:{}", u.scheme, url.host, url.port)
    }
}

/// Successes per request between two samples; `None` without requests.
fn share(from: &Sample, to: &Sample) -> Option<f64> {
    let requests = to.requests.saturating_sub(from.requests);
    let ok = to.successes.saturating_sub(from.successes);
    (requests > 0).then(|| ok as f64 / requests as f64)
}

fn breaker(
    memory: &Memory,
    now: Duration,
    wall: u64,
    view: StateView,
    enabled: bool,
) -> BreakerReport {
    let last = memory.transitions.last();
    // An open breaker whose interval has passed reads as half-open before
    // the next request records the transition: it has been half-open since
    // the interval ended.
    let since = match last {
        Some(t) if t.to == view.state => t.at,
        Some(t) if t.to == StateKind::Open && view.state == StateKind::HalfOpen => {
            t.at + t.open_for.unwrap_or_default()
        }
        _ => memory.created,
    };
    BreakerReport {
        enabled,
        state: view.state,
        since_s: secs(now.saturating_sub(since)),
        half_open_in_s: view.until_admit.map(secs),
        transitions: memory
            .transitions
            .iter()
            .rev()
            .map(|t| {
                let ago = now.saturating_sub(t.at);
                TransitionReport {
                    from: t.from,
                    to: t.to,
                    ago_s: secs(ago),
                    at_unix_ms: wall.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(0)),
                    open_for_s: t.open_for.map(secs),
                }
            })
            .collect(),
    }
}

/// The `q` quantile of the request durations observed between `from` and
/// `to`, in milliseconds, interpolated within its bucket as Prometheus's
/// `histogram_quantile` does; above the last bound it is that bound.
fn quantile(q: f64, from: &Sample, to: &Sample, bounds: &[f64]) -> Option<f64> {
    let total = to.count.saturating_sub(from.count);
    if total == 0 || bounds.is_empty() {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    let mut lower = 0.0;
    for (i, upper) in bounds.iter().enumerate() {
        let cum = to.le[i].saturating_sub(from.le[i]);
        if cum as f64 >= rank && cum > below {
            let into = (rank - below as f64) / (cum - below) as f64;
            let secs = lower + (upper - lower) * into;
            return Some((secs * 1e6).round() / 1e3);
        }
        below = cum;
        lower = *upper;
    }
    Some((lower * 1e6).round() / 1e3)
}

/// One point per pair of consecutive samples, oldest first.
fn history(samples: &[Sample], now: Duration) -> Vec<Point> {
    samples
        .windows(2)
        .filter_map(|w| {
            let dt = w[1].at.checked_sub(w[0].at)?.as_secs_f64();
            (dt > 0.0).then(|| Point {
                ago_s: secs(now.saturating_sub(w[1].at)),
                requests_per_s: w[1].requests.saturating_sub(w[0].requests) as f64 / dt,
                success_rate: share(&w[0], &w[1]),
                retries_per_s: w[1].retries.saturating_sub(w[0].retries) as f64 / dt,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: u64, requests: u64, le: &[u64]) -> Sample {
        let mut s = Sample {
            at: Duration::from_secs(at),
            requests,
            successes: requests,
            count: le.last().copied().unwrap_or(0),
            ..Sample::default()
        };
        s.le[..le.len()].copy_from_slice(le);
        s
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let bounds = [0.001, 0.01, 0.1];
        let from = sample(0, 0, &[0, 0, 0]);
        // 100 requests: 50 under 1 ms, 40 in (1, 10] ms, 10 in (10, 100] ms
        let to = sample(10, 100, &[50, 90, 100]);
        assert_eq!(quantile(0.5, &from, &to, &bounds), Some(1.0));
        assert_eq!(quantile(0.7, &from, &to, &bounds), Some(5.5));
        assert_eq!(quantile(0.99, &from, &to, &bounds), Some(91.0));
        assert_eq!(quantile(0.5, &to, &to, &bounds), None);
    }

    #[test]
    fn quantiles_above_the_last_bound_read_as_it() {
        let bounds = [0.001, 0.01];
        let from = sample(0, 0, &[0, 0]);
        let mut to = sample(10, 10, &[1, 2]);
        to.count = 10;
        assert_eq!(quantile(0.99, &from, &to, &bounds), Some(10.0));
    }

    #[test]
    fn rates_use_the_newest_sample_a_window_old() {
        let samples: Vec<Sample> = (0..10).map(|i| sample(i * 2, i * 20, &[])).collect();
        let now = sample(20, 200, &[]);
        let (b, dt) = base(&samples, &now, RATE_WINDOW).unwrap_or((&now, 0.0));
        assert_eq!(b.at, Duration::from_secs(10));
        assert!((dt - 10.0).abs() < 1e-9);
        // Too young for a window: the oldest; too close: nothing.
        assert_eq!(
            base(&samples[..1], &now, RATE_WINDOW).map(|b| b.1),
            Some(20.0)
        );
        assert!(base(&samples[9..], &sample(18, 0, &[]), RATE_WINDOW).is_none());
    }

    #[test]
    fn history_has_one_point_per_interval() {
        let mut samples: Vec<Sample> = (0..4).map(|i| sample(i * 2, i * 10, &[])).collect();
        samples[3].successes = 25; // 5 of the last 10 failed
        let h = history(&samples, Duration::from_secs(7));
        assert_eq!(h.len(), 3);
        assert_eq!(h[0].ago_s, 5.0);
        assert_eq!(h[0].requests_per_s, 5.0);
        assert_eq!(h[2].success_rate, Some(0.5));
    }
}
