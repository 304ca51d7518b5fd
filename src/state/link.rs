//! The data plane's link to the fleet's shared state
//! (docs/reference/fleet.md#fleet-state), one per upstream: what the request
//! paths, the breaker's transitions and the refresher ask of [`Fleet`].
//!
//! - **Breaker** (`breaker.scope = "fleet"`): a trip this instance makes is
//!   published; every opening (its own or the fleet's) starts a *prober* that
//!   waits out the open interval and then claims the fleet's one half-open
//!   probe — won, the local breaker may turn half-open; held by another
//!   instance, it asks again shortly; re-opened or closed by the fleet, it
//!   adopts that. Until then the local breaker stays open past its interval
//!   (`Breaker::set_fleet_probe`). A probe's success is published. The
//!   closed path never touches Redis.
//! - **Rate limit** (`rate_limit.scope = "fleet"`): a [`FleetBucket`] of
//!   leased tokens, spent without waiting on Redis.
//! - **Idempotency**: the store's calls go to Redis first (see
//!   `proxy::idempotent`); this link only counts what Redis answered.
//!
//! With Redis down or slow, every decision falls back to the instance's
//! own state: the breaker probes on its own, the limiter applies its
//! fallback share, the idempotency store is the instance's memory store.

use super::UpstreamState;
use crate::config::UpstreamConfig;
use crate::policy::breaker::State;
use crate::policy::idempotency::IdempotencyStats;
use crate::policy::{Scope, StateKind, Transition};
use crate::state::fleet::{Fleet, FleetBucket, ProbeClaim};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// One upstream's link to the fleet.
#[derive(Debug)]
pub struct Link {
    pub fleet: Fleet,
    upstream: String,
    state: Weak<UpstreamState>,
    /// `breaker.scope = "fleet"`.
    pub breaker: bool,
    /// The leased bucket of `rate_limit.scope = "fleet"`.
    pub bucket: Option<FleetBucket>,
    /// How long a won probe owns the fleet's probe key: the request's
    /// `timeout` (its attempt ends within it).
    probe_lease: Duration,
    /// Bumped at every opening this instance sees: a prober started for an
    /// earlier one stops.
    openings: AtomicU64,
    /// What the Redis idempotency store answered, for
    /// `weir_idempotency_total` (the memory store counts for itself).
    pub idempotency: Mutex<IdempotencyStats>,
}

impl Link {
    pub fn new(fleet: &Fleet, u: &UpstreamConfig, state: &Arc<UpstreamState>) -> Arc<Link> {
        let bucket = u
            .rate_limit
            .as_ref()
            .filter(|r| r.scope == Scope::Fleet)
            .and_then(|r| r.bucket)
            .map(|(rps, burst)| {
                // Its series exists from the start, at zero.
                let _ = fleet.metrics().leased(&u.name);
                FleetBucket::new(fleet.clone(), &u.name, None, rps, burst, state.clock)
            });
        let link = Arc::new(Link {
            fleet: fleet.clone(),
            upstream: u.name.clone(),
            state: Arc::downgrade(state),
            breaker: u.breaker.scope == Scope::Fleet,
            bucket,
            probe_lease: u.timeout,
            openings: AtomicU64::new(0),
            idempotency: Mutex::new(IdempotencyStats::default()),
        });
        link.hold_probes();
        link
    }

    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Counts a decision the Redis store made.
    pub fn count<R>(&self, a: &crate::policy::idempotency::Action<R>) {
        self.idempotency
            .lock()
            .expect("fleet stats lock poisoned")
            .count(a);
    }

    /// Counts an outcome recorded on Redis.
    pub fn count_stored(&self) {
        self.idempotency
            .lock()
            .expect("fleet stats lock poisoned")
            .stored += 1;
    }

    /// Lets the fleet own the half-open probe while the backend is up; with
    /// it down, the breaker probes on its own.
    pub fn hold_probes(&self) {
        if let Some(state) = self.state.upgrade() {
            state
                .live()
                .breaker
                .set_fleet_probe(self.breaker && self.fleet.is_up());
        }
    }

    /// A transition this instance's own evidence caused: published.
    pub fn own_transition(self: &Arc<Self>, t: &Transition) {
        if !self.breaker {
            return;
        }
        match (t.from, t.to) {
            (_, StateKind::Open) => {
                let open_for = t.open_for.unwrap_or_default();
                let link = self.clone();
                spawn(async move {
                    let _ = link.fleet.publish_open(&link.upstream, open_for).await;
                });
                self.watch_opening();
            }
            (StateKind::HalfOpen, StateKind::Closed) => {
                let link = self.clone();
                spawn(async move {
                    let _ = link.fleet.publish_closed(&link.upstream).await;
                });
            }
            _ => {}
        }
    }

    /// The fleet published a trip with `remaining` to run: the local
    /// breaker opens at least that long (the refresher, every `refresh`).
    pub fn adopt_open(self: &Arc<Self>, remaining: Duration) {
        let Some(state) = self.state.upgrade() else {
            return;
        };
        let now = state.now();
        let t = state.live().breaker.adopt_open(remaining, now);
        if let Some(t) = t {
            state.log_fleet_transition(&t);
            self.watch_opening();
        }
    }

    /// Starts the prober of the opening just entered.
    fn watch_opening(self: &Arc<Self>) {
        let opening = self.openings.fetch_add(1, Ordering::SeqCst) + 1;
        spawn(self.clone().probe(opening));
    }

    /// Waits out the open interval, then claims the fleet's probe, until the
    /// probe is this instance's or the fleet's verdict is adopted.
    async fn probe(self: Arc<Self>, opening: u64) {
        loop {
            if self.openings.load(Ordering::SeqCst) != opening {
                return;
            }
            let Some(state) = self.state.upgrade() else {
                return;
            };
            let now = state.now();
            let wait = match state.live().breaker.raw_state() {
                State::Open { until } => until.saturating_sub(now),
                _ => return,
            };
            drop(state);
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
                continue;
            }
            let claim = self
                .fleet
                .claim_probe(&self.upstream, self.probe_lease)
                .await;
            let Some(state) = self.state.upgrade() else {
                return;
            };
            if self.openings.load(Ordering::SeqCst) != opening {
                return;
            }
            let now = state.now();
            match claim {
                // Redis is away: the breaker probes on its own.
                Ok(ProbeClaim::Won) | Err(_) => {
                    state.live().breaker.grant_probe();
                    return;
                }
                Ok(ProbeClaim::Held { retry_in }) => {
                    drop(state);
                    let every = self.fleet.refresh_every() / 4;
                    let pause = retry_in.min(every).max(Duration::from_millis(10));
                    tokio::time::sleep(pause).await;
                }
                Ok(ProbeClaim::Open { remaining }) => {
                    // Extends this opening (no transition: it is open).
                    let t = state.live().breaker.adopt_open(remaining, now);
                    if let Some(t) = t {
                        state.log_fleet_transition(&t);
                    }
                }
                Ok(ProbeClaim::Closed) => {
                    let t = state.live().breaker.adopt_closed(now);
                    if let Some(t) = t {
                        state.log_fleet_transition(&t);
                    }
                    return;
                }
            }
        }
    }
}

/// Runs `f` on the runtime at hand (every caller is on one).
fn spawn<F>(f: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(f);
    }
}

/// Reads the fleet's published trips every `refresh` for `members`, for as
/// long as `fleet` is the one in force (the task ends when `alive` drops).
pub async fn refresher(fleet: Fleet, members: Weak<Mutex<Vec<Weak<Link>>>>) {
    let mut tick = tokio::time::interval(fleet.refresh_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(members) = members.upgrade() else {
            return;
        };
        let links: Vec<Arc<Link>> = members
            .lock()
            .expect("fleet members lock poisoned")
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|l| l.breaker)
            .collect();
        drop(members);
        for l in &links {
            l.hold_probes();
        }
        if links.is_empty() || !fleet.is_up() {
            continue;
        }
        let names: Vec<&str> = links.iter().map(|l| l.upstream.as_str()).collect();
        if let Ok(trips) = fleet.refresh(&names).await {
            for (l, trip) in links.iter().zip(trips) {
                if let Some(remaining) = trip {
                    l.adopt_open(remaining);
                }
            }
        }
    }
}
