//! Live per-upstream policy state, keyed by upstream name so that it
//! outlives any one config snapshot: a reload that keeps an upstream keeps
//! its breaker, retry budget, limiters, concurrency gate, caches and stores,
//! with the new parameters applied in place; a new upstream starts fresh; a
//! removed one is dropped when the last snapshot — and so the last request —
//! holding it goes away. Its endpoints and connections are the upstream
//! layer's (`upstream::reach`), kept the same way.

pub mod fleet;
pub mod gate;
pub mod link;
pub mod ring;
pub mod throttle;

use crate::clock::{fresh_seed, Clock};
use crate::config::{Config, StateBackend, StateConfig, UpstreamConfig};
use crate::metrics::{Metrics, UpstreamMetrics};
use crate::policy::cache::{CacheStore, FillRegistry};
use crate::policy::idempotency::{IdempotencyStore, MemoryStore};
use crate::policy::{Breaker, KeyedLimiter, RetryBudget, SeededRandom, Transition};
use crate::state::fleet::Fleet;
use crate::state::gate::Gate;
use crate::state::throttle::ThrottleGate;
use link::Link;
use ring::Recent;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The policy state machines of one upstream, behind one short lock: every
/// critical section is a few arithmetic operations, never an await.
#[derive(Debug)]
pub struct Live {
    pub breaker: Breaker,
    pub budget: RetryBudget,
    pub limiter: Option<KeyedLimiter>,
    pub rng: SeededRandom,
    /// Recent latencies and the hedges' credit (docs/reference/hedging.md#hedging).
    pub hedge: crate::policy::Hedger,
}

/// What lives between requests for one upstream.
#[derive(Debug)]
pub struct UpstreamState {
    pub name: String,
    pub clock: Clock,
    live: Mutex<Live>,
    pub gate: Gate,
    /// Client-side throttling (docs/reference/admission.md#client-side-throttling).
    pub throttle: ThrottleGate,
    pub metrics: UpstreamMetrics,
    /// The status page's samples and recent breaker transitions
    /// (docs/reference/admin.md#status-page); bounded, never touched per request.
    pub recent: Recent,
    /// The idempotency-key store (docs/reference/idempotency.md#idempotency-keys);
    /// `None` when `[idempotency] enabled = false`. With the fleet's store
    /// on Redis, this one decides while Redis is away.
    idempotency: Mutex<Option<MemoryStore>>,
    /// The link to the fleet's shared state (docs/reference/fleet.md#fleet-state),
    /// with `[state] backend = "redis"`.
    fleet: arc_swap::ArcSwapOption<Link>,
    /// The response cache (docs/reference/cache.md#response-cache); `None` while
    /// it is off. Locked for one call at a time, never across an await.
    cache: Mutex<Option<CacheStore>>,
    /// The cache's fills and background refreshes in progress.
    pub fills: Mutex<FillRegistry<FillWait>>,
}

/// What a request waiting on another's fill of a cache key waits on: it
/// changes (or closes) when the fill is over.
pub type FillWait = tokio::sync::watch::Receiver<()>;

/// A rate limit as this instance applies it: a fleet bucket's fallback
/// share while the fleet's state is in use (the fleet bucket itself is the
/// link's), the limit as configured otherwise.
fn local_rate(u: &UpstreamConfig, fleet: bool) -> Option<crate::policy::RateLimitParams> {
    let p = u.rate_limit.as_ref()?;
    Some(if fleet { p.fallback() } else { p.clone() })
}

impl UpstreamState {
    fn new(u: &UpstreamConfig, clock: Clock, metrics: &Metrics, fleet: bool) -> Self {
        let now = clock.now();
        let metrics = metrics.upstream(&u.name);
        metrics.set_breaker(crate::policy::StateKind::Closed);
        metrics.fit(&possible(u, fleet));
        UpstreamState {
            name: u.name.clone(),
            clock,
            live: Mutex::new(Live {
                breaker: Breaker::new(u.breaker.clone()),
                budget: RetryBudget::new(u.retry.budget.clone(), now),
                limiter: local_rate(u, fleet).map(|p| KeyedLimiter::new(p, now)),
                rng: SeededRandom::new(fresh_seed()),
                hedge: crate::policy::Hedger::new(now),
            }),
            gate: Gate::new(&u.concurrency, clock),
            throttle: ThrottleGate::new(u.throttle.as_ref(), clock),
            metrics,
            recent: Recent::new(now),
            idempotency: Mutex::new(u.idempotency.clone().map(MemoryStore::new)),
            fleet: arc_swap::ArcSwapOption::empty(),
            cache: Mutex::new(u.cache.clone().map(CacheStore::new)),
            fills: Mutex::new(FillRegistry::new()),
        }
    }

    /// The response cache, locked: for one call, never across an await.
    pub fn cache(&self) -> MutexGuard<'_, Option<CacheStore>> {
        self.cache.lock().expect("cache lock poisoned")
    }

    /// The fleet's leased token bucket, with `rate_limit.scope = "fleet"`.
    pub fn fleet_bucket(&self) -> Option<crate::state::fleet::FleetBucket> {
        self.fleet.load().as_ref()?.bucket.clone()
    }

    /// The link to the fleet's shared state, when there is one.
    pub fn link(&self) -> Option<Arc<Link>> {
        self.fleet.load_full()
    }

    /// Applies a reloaded config's parameters in place.
    fn update(&self, u: &UpstreamConfig, fleet: bool) {
        let now = self.clock.now();
        let rate = local_rate(u, fleet);
        self.metrics.fit(&possible(u, fleet));
        {
            let mut live = self.live();
            if live.breaker.params() != &u.breaker {
                live.breaker.set_params(u.breaker.clone());
            }
            if live.budget.params() != &u.retry.budget {
                live.budget.set_params(u.retry.budget.clone());
            }
            match (&mut live.limiter, &rate) {
                (Some(l), Some(p)) if l.params() != p => l.set_params(p.clone(), now),
                (Some(_), Some(_)) => {}
                (slot, p) => *slot = p.clone().map(|p| KeyedLimiter::new(p, now)),
            }
        }
        self.gate.set_limits(&u.concurrency);
        self.throttle.set_params(u.throttle.as_ref());
        {
            let mut store = self.idempotency();
            match (store.as_mut(), &u.idempotency) {
                (Some(s), Some(p)) if s.params() != p => s.set_params(p.clone()),
                (Some(_), Some(_)) => {}
                (_, p) => *store = p.clone().map(MemoryStore::new),
            }
        }
        {
            let mut cache = self.cache();
            match (cache.as_mut(), &u.cache) {
                (Some(c), Some(p)) if c.params() != p => c.set_params(p.clone()),
                (Some(_), Some(_)) => {}
                (_, p) => *cache = p.clone().map(CacheStore::new),
            }
        }
    }

    /// The policy state, locked. Keep the guard for a few operations only.
    pub fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().expect("policy state lock poisoned")
    }

    /// The idempotency-key store, locked: for one call, never across an await.
    pub fn idempotency(&self) -> MutexGuard<'_, Option<MemoryStore>> {
        self.idempotency
            .lock()
            .expect("idempotency store lock poisoned")
    }

    /// Drops the idempotency records whose `ttl` has passed (the status
    /// sampler calls it every second; lookups drop them too).
    pub fn sweep(&self) {
        let now = self.clock.now();
        if let Some(s) = self.idempotency().as_mut() {
            s.sweep(now);
        }
    }

    /// Sets the gauges that describe state; called when `/metrics` is scraped.
    pub fn refresh_gauges(&self) {
        let now = self.clock.now();
        let (state, tokens) = {
            let mut live = self.live();
            let state = live.breaker.state(now).state;
            (state, live.budget.balance(now))
        };
        self.metrics.set_breaker(state);
        self.metrics.set_budget(tokens);
        self.metrics.set_in_flight(self.gate.in_flight());
        let g = self.gate.view();
        self.metrics
            .concurrency
            .show(g.limit, g.latency, g.refusals);
        let t = self.throttle.view().map(|t| (t.probability, t.refusals));
        self.metrics.concurrency.show_throttle(t);
        let cache = self.cache().as_ref().map(|c| c.stats());
        if let Some(stats) = cache {
            self.metrics.cache().show(&stats);
        }
        let stats = self.idempotency().as_ref().map(|s| s.stats());
        if let Some(mut stats) = stats {
            if let Some(link) = self.link() {
                let fleet = *link.idempotency.lock().expect("fleet stats lock poisoned");
                stats.add(&fleet);
            }
            self.metrics.idempotency().show(&stats);
        }
    }

    /// Policy-core time of an instant already read.
    pub fn now_at(&self, i: tokio::time::Instant) -> Duration {
        self.clock.at(i)
    }

    /// Policy-core time for this upstream.
    pub fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Logs and counts a breaker transition this instance's evidence caused
    /// (and publishes it to the fleet, when the breaker is shared).
    pub fn log_transition(&self, t: &Transition) {
        self.log_fleet_transition(t);
        if let Some(link) = self.fleet.load().as_ref() {
            link.own_transition(t);
        }
    }

    /// Logs and counts a breaker transition (one adopted from the fleet is
    /// not published again).
    pub fn log_fleet_transition(&self, t: &Transition) {
        self.metrics.transition(t.to);
        self.recent.transition(self.clock.now(), t);
        tracing::info!(
            upstream = %self.name,
            from = t.from.as_str(),
            to = t.to.as_str(),
            open_for = %t.open_for.map_or_else(|| "-".into(), crate::config::duration::format),
            "circuit breaker transition"
        );
    }
}

/// All upstreams' live state, by name.
#[derive(Debug, Default)]
pub struct StateRegistry {
    clock: Clock,
    metrics: Arc<Metrics>,
    by_name: Mutex<HashMap<String, Arc<UpstreamState>>>,
    /// The shared state in force, with `[state] backend = "redis"`.
    fleet: Mutex<Option<FleetRun>>,
}

/// A started [`Fleet`], the `[state]` it was made from, and the links its
/// refresher reads for (it stops when this is dropped).
#[derive(Debug)]
struct FleetRun {
    config: StateConfig,
    fleet: Fleet,
    members: Arc<Mutex<Vec<std::sync::Weak<Link>>>>,
}

impl StateRegistry {
    /// The state for each of `config`'s upstreams, in the same order: kept by
    /// name with parameters updated in place, created where new. Entries for
    /// removed upstreams are forgotten here; in-flight requests still hold
    /// them until they finish.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        StateRegistry {
            clock: Clock::new(),
            metrics,
            by_name: Mutex::new(HashMap::new()),
            fleet: Mutex::new(None),
        }
    }

    /// The shared state in force, if any (for `/readyz`).
    pub fn fleet(&self) -> Option<Fleet> {
        let run = self.fleet.lock().expect("fleet lock poisoned");
        run.as_ref().map(|r| r.fleet.clone())
    }

    /// The shared state `config` asks for: the one in force when `[state]`
    /// is unchanged, else a new one (with its refresher); `None` with the
    /// memory backend.
    fn fleet_for(&self, config: &Config) -> Result<Option<FleetRun>, String> {
        if config.state.backend != StateBackend::Redis {
            // Nothing to be up or down, no command sent: no series.
            self.metrics.state().forget_backend();
            return Ok(None);
        }
        let mut run = self.fleet.lock().expect("fleet lock poisoned");
        if let Some(r) = run.take().filter(|r| r.config == config.state) {
            return Ok(Some(r));
        }
        let fleet = Fleet::start(&config.state, self.metrics.state().clone())
            .map_err(|e| format!("[state]: {e}"))?;
        let members = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(crate::state::link::refresher(
            fleet.clone(),
            Arc::downgrade(&members),
        ));
        Ok(Some(FleetRun {
            config: config.state.clone(),
            fleet,
            members,
        }))
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    ///
    /// Everything that can fail (starting the fleet's shared state) happens
    /// before anything changes: on error nothing is touched and the reload
    /// is refused.
    pub fn sync(&self, config: &Config) -> Result<Vec<Arc<UpstreamState>>, String> {
        let mut map = self.by_name.lock().expect("state registry lock poisoned");
        let run = self.fleet_for(config)?;
        let on = run.is_some();
        let out: Vec<Arc<UpstreamState>> = config
            .upstreams
            .iter()
            .map(|u| match map.get(&u.name) {
                Some(s) => {
                    s.update(u, on);
                    s.clone()
                }
                None => Arc::new(UpstreamState::new(u, self.clock, &self.metrics, on)),
            })
            .collect();
        // Every upstream gets a new link (a reload may change its scopes).
        let mut members = Vec::new();
        for (u, s) in config.upstreams.iter().zip(&out) {
            let link = run.as_ref().map(|r| Link::new(&r.fleet, u, s));
            members.extend(link.as_ref().map(Arc::downgrade));
            s.fleet.store(link);
        }
        if let Some(r) = &run {
            *r.members.lock().expect("fleet members lock poisoned") = members;
        }
        *self.fleet.lock().expect("fleet lock poisoned") = run;
        // A set, not `config.upstream(n)` per name: linear in the upstreams.
        let kept: std::collections::HashSet<&str> =
            config.upstreams.iter().map(|u| u.name.as_str()).collect();
        for gone in map.keys().filter(|n| !kept.contains(n.as_str())) {
            tracing::info!(upstream = %gone, "upstream removed; its state goes with its last request");
            self.metrics.forget(gone);
        }
        map.clear();
        for s in &out {
            map.insert(s.name.clone(), s.clone());
        }
        Ok(out)
    }
}

/// What an upstream's config can produce, for its series
/// (docs/reference/metrics.md#which-series-exist): `refused_stream` only for
/// an upstream that may speak HTTP/2; `rate_limited`, `circuit_open`, the
/// `idempotency_*` codes and series, hedges, the cache's series and the
/// adaptive limit's latency only with their feature on; tunnels only with
/// `tunnel = true` (and then no `connect_not_allowed`); `state_unavailable`
/// only with keys kept on the fleet's Redis.
fn possible(u: &UpstreamConfig, fleet: bool) -> crate::metrics::Possible {
    use crate::config::{Protocol, Scheme};
    crate::metrics::Possible {
        h2: match u.protocol {
            Protocol::H2c | Protocol::Grpc => true,
            Protocol::Auto => u.url.scheme == Scheme::Https,
            Protocol::Http1 => false,
        },
        breaker: u.breaker.enabled,
        rate_limit: u.rate_limit.is_some(),
        tunnel: u.tunnel,
        idempotency: u.idempotency.is_some(),
        shared: fleet,
        hedge: u.hedge.is_some(),
        cache: u.cache.is_some(),
        adaptive: u.concurrency.adaptive.is_some(),
        retry_on: u.retry.retry_on.causes(),
    }
}
