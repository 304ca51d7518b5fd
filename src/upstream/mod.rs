//! The upstream side (docs/reference/endpoints.md): an upstream's endpoints — the
//! addresses its name resolves to, or a static list — each with its
//! latency estimate, requests in flight, ejection state and general-path
//! connection pool; the balancer that picks one for each attempt; and the
//! resolver that keeps the set current. Both data paths ask [`Endpoints`]
//! for an endpoint and report the attempt's outcome back through the
//! [`Picked`] it returns; neither chooses an address itself.
//!
//! The pure parts are [`balance`] (peak-EWMA, two choices) and [`eject`]
//! (each endpoint's health); this module holds them behind short locks,
//! never across an await.

mod attempt_endpoint;
pub(crate) mod body;
pub(crate) mod checkout;
pub mod client;
pub(crate) mod http1;
pub mod pool;
pub mod reach;
pub mod resolve;
mod seen;
pub mod send;

pub use crate::address::Address;
pub use attempt_endpoint::Served;
pub(crate) use attempt_endpoint::{connect_any, report};

use crate::clock::Clock;
use crate::metrics::endpoints::{EndpointCounts, EndpointFamilies, EndpointMetrics};
use crate::policy::balance::{self, Balance, PeakEwma};
use crate::policy::eject::{self, Availability, EjectAction, Health, Why};
pub use crate::policy::BalanceParams;
use crate::policy::Now;
use crate::upstream::client::UpstreamClient;
use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What an endpoint's balancer reads and its outcomes write.
#[derive(Debug)]
struct Stats {
    ewma: PeakEwma,
    health: Health,
    /// Answers seen so far: the first is not sampled (see `finish`).
    answers: u64,
}

/// One replica of an upstream.
#[derive(Debug)]
pub struct Endpoint {
    pub addr: Address,
    in_flight: AtomicU32,
    stats: Mutex<Stats>,
    /// This endpoint's pool on the general path (HTTP/1.1 or HTTP/2).
    client: ArcSwap<UpstreamClient>,
    pub metrics: EndpointMetrics,
    /// Ejections so far, and when the current one ends (policy time, ms),
    /// for the status page.
    ejections: AtomicU64,
}

/// What the status page and `/metrics` show of an endpoint.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EndpointView {
    pub addr: String,
    /// `active`, `ejected` or `probation` (waiting on its probe).
    pub state: &'static str,
    pub in_flight: u32,
    /// The latency estimate, in milliseconds.
    pub latency_ms: f64,
    pub requests: u64,
    pub failures: u64,
    pub ejections: u64,
    /// Why it was ejected last (while it is out).
    pub why: Option<&'static str>,
    /// Milliseconds until its probe may go (while ejected).
    pub back_in_ms: Option<u64>,
}

impl Endpoint {
    fn new(
        addr: Address,
        client: &UpstreamClient,
        metrics: EndpointMetrics,
        ewma: PeakEwma,
    ) -> Self {
        Endpoint {
            addr,
            in_flight: AtomicU32::new(0),
            stats: Mutex::new(Stats {
                ewma,
                health: Health::new(),
                answers: 0,
            }),
            client: ArcSwap::from_pointee(client.for_addr(addr)),
            metrics,
            ejections: AtomicU64::new(0),
        }
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().expect("endpoint stats lock poisoned")
    }

    /// This endpoint's pool on the general path.
    pub fn client(&self) -> Arc<UpstreamClient> {
        self.client.load_full()
    }

    /// Requests in flight to it now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn view(&self, now: Now) -> EndpointView {
        let s = self.stats();
        let (state, back_in) = match s.health.status(now) {
            eject::Status::Active => ("active", None),
            eject::Status::Ejected { until } => ("ejected", Some(until.saturating_sub(now))),
            eject::Status::Probation { .. } => ("probation", Some(Duration::ZERO)),
        };
        EndpointView {
            addr: self.addr.to_string(),
            state,
            in_flight: self.in_flight(),
            latency_ms: s.ewma.estimate_at(now) / 1e6,
            requests: self.metrics.requests.get(),
            failures: self.metrics.failures.get(),
            ejections: self.ejections.load(Ordering::Relaxed),
            why: if s.health.is_out() {
                s.health.why().map(Why::as_str)
            } else {
                None
            },
            back_in_ms: back_in.map(|d| d.as_millis() as u64),
        }
    }
}

/// An upstream's endpoints. Owned by its live state, so a reload keeps the
/// endpoints (their pools, estimates and ejections) that it keeps.
#[derive(Debug)]
pub struct Endpoints {
    upstream: String,
    clock: Clock,
    set: ArcSwap<Vec<Arc<Endpoint>>>,
    params: ArcSwap<BalanceParams>,
    /// What new endpoints' pools are made from.
    client: ArcSwap<UpstreamClient>,
    families: EndpointFamilies,
    counts: EndpointCounts,
    /// Endpoints ejected or on probation now: a count the balancer reads
    /// without a lock, recounted from the set (never adjusted by ±1) under
    /// `changes` whenever an ejection, a return or a new set may change it.
    out: AtomicUsize,
    /// Serialises ejections, returns and new sets, so that two ejections at
    /// once cannot both pass the cap and a count is never of an old set.
    changes: Mutex<()>,
    /// The set is not empty.
    ready: std::sync::atomic::AtomicBool,
    /// Wakes the attempts waiting for the first endpoint
    /// ([`Endpoints::first_resolved`]).
    first: tokio::sync::Notify,
    /// Why the name has not resolved, while no resolution has answered.
    unresolved: Mutex<Option<String>>,
    /// Round robin's turn; also the state of the two-choices draws.
    turn: AtomicUsize,
    seed: AtomicU64,
    /// Set once the set exceeded `max_endpoints`, so it is logged once.
    capped: std::sync::atomic::AtomicBool,
}

/// An endpoint taken for one attempt: counted in flight until dropped.
/// Report the attempt's outcome with [`Picked::finish`]; dropped without
/// one (the client went away), it leaves no verdict.
#[derive(Debug)]
pub struct Picked {
    pub endpoint: Arc<Endpoint>,
    /// The set it was picked from; `None` when it was the only endpoint:
    /// then there is no estimate to keep (nothing to choose between) and
    /// no ejection (one endpoint is never ejected), so the outcome only
    /// counts, and the request path pays for nothing else.
    owner: Option<Arc<Endpoints>>,
    /// Endpoints in the set when it was picked.
    pub(crate) of: usize,
    probe: bool,
    done: bool,
}

impl Drop for Picked {
    fn drop(&mut self) {
        self.endpoint.in_flight.fetch_sub(1, Ordering::Relaxed);
        if self.probe && !self.done {
            self.endpoint.stats().health.release_probe();
        }
    }
}

impl Picked {
    /// The endpoint's address.
    pub fn addr(&self) -> Address {
        self.endpoint.addr
    }

    /// Records the attempt's outcome: `failure` per the breaker's
    /// definition (`None`: no verdict, e.g. a stream the upstream refused
    /// unprocessed), for an attempt started at `started`.
    pub fn finish(mut self, failure: Option<bool>, started: tokio::time::Instant) {
        self.done = true;
        let Some(failure) = failure else {
            if self.probe {
                self.endpoint.stats().health.release_probe();
            }
            return;
        };
        let ep = &self.endpoint;
        ep.metrics.requests.inc();
        if failure {
            ep.metrics.failures.inc();
        }
        let Some(owner) = &self.owner else {
            return;
        };
        let at = tokio::time::Instant::now();
        let took = at.saturating_duration_since(started);
        let now = owner.clock.at(at);
        let params = owner.params.load();
        let verdict = {
            let mut s = ep.stats();
            // An endpoint's first answer carries its connection's set-up
            // (and, for the process's first, one-time costs): as a peak it
            // would keep the endpoint out of the draws for many seconds.
            // A failure always counts.
            s.answers += 1;
            if failure || s.answers > 1 {
                s.ewma.observe_outcome(took, failure, now);
            }
            s.health.record(failure, self.probe, &params.ejection, now)
        };
        match verdict {
            EjectAction::Keep => {}
            EjectAction::Restored => {
                let _changes = owner
                    .changes
                    .lock()
                    .expect("endpoint changes lock poisoned");
                owner.recount(&owner.set.load());
                tracing::info!(upstream = %owner.upstream, endpoint = %ep.addr, "endpoint serves again: its probe succeeded");
            }
            EjectAction::Eject(why) => owner.eject(ep, why, &params, now),
        }
    }
}

impl Endpoints {
    /// An empty set for `upstream`; [`Endpoints::publish`] fills it.
    pub fn new(
        upstream: &str,
        clock: Clock,
        params: BalanceParams,
        client: UpstreamClient,
        families: EndpointFamilies,
    ) -> Arc<Self> {
        let counts = families.counts(upstream);
        Arc::new(Endpoints {
            upstream: upstream.to_string(),
            clock,
            set: ArcSwap::from_pointee(Vec::new()),
            params: ArcSwap::from_pointee(params),
            client: ArcSwap::from_pointee(client),
            families,
            counts,
            out: AtomicUsize::new(0),
            changes: Mutex::new(()),
            ready: std::sync::atomic::AtomicBool::new(false),
            first: tokio::sync::Notify::new(),
            unresolved: Mutex::new(None),
            turn: AtomicUsize::new(0),
            seed: AtomicU64::new(crate::clock::fresh_seed()),
            capped: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The endpoints now.
    /// An attempt to `addr` that lost a hedge's race was cancelled after
    /// `took`: the endpoint was at least that slow, which its latency
    /// estimate learns (docs/reference/hedging.md#the-race). No verdict.
    pub fn observe_cancelled(&self, addr: Address, took: std::time::Duration) {
        let set = self.set.load();
        if let Some(ep) = set.iter().find(|e| e.addr == addr) {
            let now = self.clock.now();
            ep.stats().ewma.observe_outcome(took, false, now);
        }
    }

    /// The client of the endpoint at `addr`, if it is one.
    pub fn client_of(&self, addr: Address) -> Option<Arc<UpstreamClient>> {
        let set = self.set.load();
        set.iter().find(|e| e.addr == addr).map(|e| e.client())
    }

    pub fn all(&self) -> Arc<Vec<Arc<Endpoint>>> {
        self.set.load_full()
    }

    /// Whether there is an endpoint to send to.
    pub fn ready(&self) -> bool {
        // A flag rather than a look at the set: the fast path asks on
        // every request, and the set's load costs more than this.
        self.ready.load(Ordering::Relaxed)
    }

    /// Applies reloaded parameters in place.
    pub fn set_params(&self, params: BalanceParams) {
        if **self.params.load() != params {
            self.params.store(Arc::new(params));
            self.fit(&self.set.load());
        }
    }

    /// A new pool for every endpoint: how the upstream is reached changed.
    pub fn set_client(&self, client: UpstreamClient) {
        for ep in self.set.load().iter() {
            ep.client.store(Arc::new(client.for_addr(ep.addr)));
        }
        self.client.store(Arc::new(client));
    }

    /// Makes `addrs` the endpoints: those already known keep their state
    /// and pools, new ones start fresh, gone ones get no new request (an
    /// attempt in flight keeps its endpoint until it ends). At most
    /// `max_endpoints` are used.
    pub fn publish(&self, addrs: &[Address]) {
        // A resolution answered: no failure stands any more.
        if let Ok(mut u) = self.unresolved.lock() {
            u.take();
        }
        // In a fixed order: a resolver that rotates its answers is not a
        // change of endpoints.
        let mut sorted = addrs.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let addrs = &sorted[..];
        let cap = self.params.load().max_endpoints as usize;
        let old = self.set.load_full();
        if old.len() == addrs.len().min(cap) && old.iter().zip(addrs).all(|(e, a)| e.addr == *a) {
            return;
        }
        if addrs.len() > cap && !self.capped.swap(true, Ordering::Relaxed) {
            tracing::warn!(upstream = %self.upstream, addresses = addrs.len(), max_endpoints = cap, "more addresses than max_endpoints: the first ones are used");
        }
        let now = self.clock.now();
        let client = self.client.load();
        // A newcomer starts at the best estimate among the endpoints kept
        // (a first set at the default).
        let best = old
            .iter()
            .filter(|e| addrs.contains(&e.addr))
            .map(|e| e.stats().ewma.estimate_at(now))
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))));
        let fresh = || match best {
            Some(ns) => PeakEwma::starting_at(Duration::from_nanos(ns as u64), now),
            None => PeakEwma::new(now),
        };
        let mut next: Vec<Arc<Endpoint>> = Vec::with_capacity(addrs.len().min(cap));
        for a in addrs.iter().take(cap) {
            if next.iter().any(|e| e.addr == *a) {
                continue;
            }
            let kept = old.iter().find(|e| e.addr == *a).cloned();
            next.push(kept.unwrap_or_else(|| {
                let m = self.families.endpoint(&self.upstream, &a.to_string());
                Arc::new(Endpoint::new(*a, &client, m, fresh()))
            }));
        }
        for gone in old
            .iter()
            .filter(|e| !next.iter().any(|n| n.addr == e.addr))
        {
            self.families
                .forget_endpoint(&self.upstream, &gone.addr.to_string());
        }
        tracing::debug!(upstream = %self.upstream, endpoints = next.len(), "endpoints changed");
        let empty = next.is_empty();
        self.fit(&next);
        let _changes = self.changes.lock().expect("endpoint changes lock poisoned");
        self.recount(&next);
        // The set before the flag: a request that sees the flag finds it.
        self.set.store(Arc::new(next));
        if !self.ready.swap(!empty, Ordering::Relaxed) && !empty {
            self.first.notify_waiters();
        }
    }

    /// Counts the endpoints of `set` that are out (hold `changes`).
    fn recount(&self, set: &[Arc<Endpoint>]) -> usize {
        let out = set.iter().filter(|e| e.stats().health.is_out()).count();
        self.out.store(out, Ordering::Relaxed);
        out
    }

    /// A uniform draw in `[0, 1)` (`clock::splitmix64` over an atomic
    /// counter: no lock on the request path).
    fn draw(&self) -> f64 {
        let z = crate::clock::splitmix64(&self.seed);
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Whether an endpoint that has not failed this request (`avoid`) is
    /// there for its retry: then the retry goes at once
    /// (docs/reference/retries.md#backoff). An endpoint a failure ejected
    /// counts only when the pick would still use it.
    pub fn untried(&self, avoid: &[Address]) -> bool {
        if avoid.is_empty() {
            // No attempt has failed on a known endpoint (every answered
            // request, a refused stream, a name not yet resolved): the
            // backoff's rule decides, and the set is not even loaded.
            return false;
        }
        let set = self.set.load();
        let now = self.clock.now();
        set.iter().any(|e| {
            !avoid.contains(&e.addr)
                && !matches!(e.stats().health.availability(now), Availability::Closed)
        })
    }

    /// Picks the endpoint for one attempt, avoiding those in `avoid` (they
    /// failed this request) when another exists. `None`: no endpoint yet
    /// (a name not resolved so far).
    pub fn pick(self: &Arc<Self>, avoid: &[Address]) -> Option<Picked> {
        let set = self.set.load();
        let n = set.len();
        let (endpoint, probe, owner) = match n {
            0 => return None,
            // One endpoint: nothing to choose.
            1 => (set[0].clone(), false, None),
            _ => {
                let (e, probe) = self.choose(&set, avoid)?;
                (e, probe, Some(self.clone()))
            }
        };
        endpoint.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Picked {
            endpoint,
            owner,
            of: n,
            probe,
            done: false,
        })
    }

    fn choose(&self, set: &[Arc<Endpoint>], avoid: &[Address]) -> Option<(Arc<Endpoint>, bool)> {
        let now = self.clock.now();
        let params = self.params.load();
        // More out than the cap allows (endpoints went away meanwhile):
        // balance over all of them, since refusing is worse than trying.
        let panic = self.out.load(Ordering::Relaxed) > cap(set.len(), params.ejection.max_ejected);
        let n = set.len();
        // Strictest first: in, and not failed for this request; then any
        // not failed for it; then any.
        // (The first pass twice: a probe taken by another request meanwhile.)
        for pass in [0, 0, 1, 2] {
            let usable = |e: &Endpoint| -> Option<Availability> {
                if pass < 2 && avoid.contains(&e.addr) {
                    return None;
                }
                if pass > 0 {
                    return Some(Availability::Open);
                }
                match e.stats().health.availability(now) {
                    // Panic: an ejected endpoint is used anyway, and one on
                    // probation still gets its probe, so that it can come
                    // back and the panic end.
                    Availability::Closed if panic => Some(Availability::Open),
                    Availability::Closed => None,
                    a => Some(a),
                }
            };
            let found = match params.balance {
                Balance::RoundRobin => {
                    let start = self.turn.fetch_add(1, Ordering::Relaxed);
                    (0..n)
                        .map(|k| &set[(start + k) % n])
                        .find_map(|e| usable(e).map(|a| (e.clone(), a)))
                }
                Balance::PeakEwma => self.two_choices(set, now, &usable),
            };
            if let Some((e, a)) = found {
                let probe = a == Availability::Probe;
                if probe {
                    let mut s = e.stats();
                    // Another request may have taken the probe meanwhile.
                    if s.health.availability(now) != Availability::Probe {
                        continue;
                    }
                    s.health.take_probe(now);
                }
                return Some((e, probe));
            }
        }
        set.first().map(|e| (e.clone(), false))
    }

    /// Power of two choices: two endpoints at random, the cheaper by
    /// latency × (in flight + 1). When a draw lands on one that may not be
    /// used, a few more draws, then a scan.
    fn two_choices(
        &self,
        set: &[Arc<Endpoint>],
        now: Now,
        usable: &dyn Fn(&Endpoint) -> Option<Availability>,
    ) -> Option<(Arc<Endpoint>, Availability)> {
        let n = set.len();
        let cost = |e: &Endpoint| e.stats().ewma.cost(e.in_flight(), now);
        let mut best: Option<(usize, f64, Availability)> = None;
        for _ in 0..4 {
            let (i, j) = balance::two_of(n, self.draw(), self.draw());
            let mut drawn = 0;
            for k in [i, j] {
                if let Some(a) = usable(&set[k]) {
                    drawn += 1;
                    // An endpoint waiting on its probe takes it first:
                    // its estimate is from before its ejection.
                    let c = if a == Availability::Probe {
                        -1.0
                    } else {
                        cost(&set[k])
                    };
                    if best.is_none_or(|(_, bc, _)| c < bc) {
                        best = Some((k, c, a));
                    }
                }
            }
            if let Some((won, _, a)) = best {
                // The other one lost a draw (balance::LOSS_KEEP) — only
                // on latency (not to a probe), and only while it has
                // nothing in flight: a slow replica's pending answer is its
                // next sample, not yet a reason to try again.
                let lost = if won == i { j } else { i };
                if drawn == 2 && a != Availability::Probe && set[lost].in_flight() == 0 {
                    set[lost].stats().ewma.lost();
                }
                break;
            }
        }
        if best.is_none() {
            for (k, e) in set.iter().enumerate() {
                if let Some(a) = usable(e) {
                    let c = cost(e);
                    if best.is_none_or(|(_, bc, _)| c < bc) {
                        best = Some((k, c, a));
                    }
                }
            }
        }
        best.map(|(k, _, a)| (set[k].clone(), a))
    }

    /// Ejects `ep` for `why`, unless the cap on ejected endpoints is
    /// reached or (for a failure share) its share is not well above its
    /// siblings'.
    fn eject(&self, ep: &Endpoint, why: Why, params: &BalanceParams, now: Now) {
        let p = &params.ejection;
        if why == Why::FailureShare {
            let set = self.set.load();
            let Some(own) = ep.stats().health.share(p.min_samples) else {
                return;
            };
            let others: Vec<f64> = set
                .iter()
                .filter(|e| e.addr != ep.addr)
                .filter_map(|e| e.stats().health.share(p.min_samples))
                .collect();
            if others.is_empty() {
                return;
            }
            let mean = others.iter().sum::<f64>() / others.len() as f64;
            if own - mean < p.failure_share_above {
                return;
            }
        }
        let already_out = why == Why::ProbeFailed;
        let draw = self.draw();
        let _changes = self.changes.lock().expect("endpoint changes lock poisoned");
        let set = self.set.load();
        let member = set.iter().any(|e| std::ptr::eq(Arc::as_ptr(e), ep));
        let out = self.recount(&set);
        let allowed = cap(set.len(), p.max_ejected);
        let mut s = ep.stats();
        if !already_out && (out >= allowed || !member) {
            // At the cap (or no longer an endpoint): it stays in.
            s.health.spare();
            return;
        }
        if !already_out && s.health.is_out() {
            return;
        }
        let length = s.health.eject(why, p, now, draw);
        drop(s);
        if member {
            self.recount(&set);
        }
        ep.ejections.fetch_add(1, Ordering::Relaxed);
        ep.metrics.ejection(why.as_str());
        tracing::info!(
            upstream = %self.upstream,
            endpoint = %ep.addr,
            reason = why.as_str(),
            ejected_for = %crate::config::duration::format(length),
            "endpoint ejected"
        );
    }
}

/// How many of `n` endpoints may be out at once.
fn cap(n: usize, max_ejected: f64) -> usize {
    (n as f64 * max_ejected).floor() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(max_ejected: f64) -> Arc<Endpoints> {
        let src = "[upstreams.u]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"u\"]\n";
        let c = crate::config::Config::parse(std::path::Path::new("t.toml"), src)
            .unwrap_or_else(|e| panic!("{e}"));
        let u = &c.upstreams[0];
        let meter = crate::metrics::meter::Meter::unregistered();
        let client = UpstreamClient::new(u, meter).unwrap_or_else(|e| panic!("{e}"));
        let mut params = u.endpoints.params.clone();
        params.ejection.max_ejected = max_ejected;
        // Round robin: every other pick is the endpoint a test fails.
        params.balance = Balance::RoundRobin;
        let metrics = crate::metrics::Metrics::new();
        Endpoints::new(
            "u",
            Clock::new(),
            params,
            client,
            metrics.endpoints().clone(),
        )
    }

    fn addr(s: &str) -> Address {
        s.parse().unwrap_or_else(|_| panic!("{s}"))
    }

    /// Fails attempts to `a` until it is ejected (round robin: every
    /// other pick is `a`).
    fn eject(e: &Arc<Endpoints>, a: Address) {
        for _ in 0..40 {
            let p = e.pick(&[]).unwrap_or_else(|| panic!("no endpoint"));
            let failed = p.addr() == a;
            p.finish(Some(failed), tokio::time::Instant::now());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_still_probes_and_ends_when_a_probe_succeeds() {
        let e = endpoints(1.0);
        let (a, b) = (addr("10.0.0.1:80"), addr("10.0.0.2:80"));
        e.publish(&[a, b]);
        eject(&e, a);
        eject(&e, b);
        assert_eq!(e.out.load(Ordering::Relaxed), 2);
        // A reload lowers the cap below what is out: a panic.
        let mut p = (**e.params.load()).clone();
        p.ejection.max_ejected = 0.5;
        e.set_params(p);
        // Both ejections over: the next picks are probes, not plain requests.
        tokio::time::advance(Duration::from_secs(7)).await;
        let first = e.pick(&[]).unwrap_or_else(|| panic!("no endpoint"));
        assert!(first.probe, "a probe in a panic");
        first.finish(Some(false), tokio::time::Instant::now());
        assert_eq!(
            e.out.load(Ordering::Relaxed),
            1,
            "the probe's success is counted"
        );
        let views = e.views();
        assert_eq!(views.iter().filter(|v| v.state == "active").count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn two_ejections_never_pass_the_cap_and_a_removed_endpoint_is_not_counted() {
        let e = endpoints(0.5);
        let (a, b, c) = (
            addr("10.0.0.1:80"),
            addr("10.0.0.2:80"),
            addr("10.0.0.3:80"),
        );
        e.publish(&[a, b, c]);
        eject(&e, a);
        // b fails too, but one of three may be out.
        for _ in 0..60 {
            let p = e.pick(&[]).unwrap_or_else(|| panic!("no endpoint"));
            let failed = p.addr() == b;
            p.finish(Some(failed), tokio::time::Instant::now());
        }
        assert_eq!(e.out.load(Ordering::Relaxed), 1);
        // a goes away while out: nothing out any more, and a probe that
        // comes back late changes nothing.
        e.publish(&[b, c]);
        assert_eq!(e.out.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn at_most_half_may_be_out() {
        assert_eq!(cap(1, 0.5), 0);
        assert_eq!(cap(2, 0.5), 1);
        assert_eq!(cap(3, 0.5), 1);
        assert_eq!(cap(10, 0.5), 5);
    }
}
