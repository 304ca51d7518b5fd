//! Admission (docs/reference/admission.md#admission): the request's deadline, the rate
//! limit and the concurrency gate up to the body, then the breaker; and the
//! breaker [`BreakerTicket`] every attempt holds until its verdict.

use crate::policy::leased_tokens::Take;
use crate::policy::Admission;
use crate::proxy::error::ProxyError;
use crate::proxy::Upstream;
use crate::state::UpstreamState;
use std::time::Duration;
use tokio::time::Instant;

/// A breaker admission that must be recorded or released.
#[derive(Debug)]
pub(crate) struct BreakerTicket<'a> {
    state: &'a UpstreamState,
    admission: Option<Admission>,
}

impl<'a> BreakerTicket<'a> {
    /// Whether the attempt it admits is a half-open probe.
    pub(super) fn probe(&self) -> bool {
        self.admission.as_ref().is_some_and(|a| a.probe)
    }

    pub(super) fn new(state: &'a UpstreamState, admission: Admission) -> Self {
        if let Some(t) = &admission.transition {
            state.log_transition(t);
        }
        BreakerTicket {
            state,
            admission: Some(admission),
        }
    }

    /// Records the attempt's verdict (`None`: no verdict, release the slot)
    /// at policy time `now`.
    pub(super) fn record(&mut self, failure: Option<bool>, now: Duration) {
        if let Some(a) = self.admission.take() {
            settle(self.state, a, failure, now);
        }
    }

    /// The admission, to be settled later by a [`PendingVerdict`].
    pub(super) fn defer(&mut self, state: &std::sync::Arc<UpstreamState>) -> PendingVerdict {
        PendingVerdict {
            state: state.clone(),
            admission: self.admission.take(),
        }
    }
}

/// Records a verdict on an admission (`None`: no verdict, release it).
fn settle(state: &UpstreamState, a: Admission, failure: Option<bool>, now: Duration) {
    let mut guard = state.live();
    let live = &mut *guard;
    let t = match failure {
        Some(f) => live.breaker.record(a, f, now, &mut live.rng),
        None => {
            live.breaker.release(a);
            None
        }
    };
    drop(guard);
    if let Some(t) = t {
        state.log_transition(&t);
    }
}

/// The breaker's verdict on an attempt whose outcome is known only at the
/// end of its answer: a gRPC call whose status comes in its trailers
/// (docs/reference/breaker.md#what-counts-as-a-failure). Dropped unsettled
/// (the client left), the admission is released with no verdict.
#[derive(Debug)]
pub(crate) struct PendingVerdict {
    state: std::sync::Arc<UpstreamState>,
    admission: Option<Admission>,
}

impl PendingVerdict {
    /// The upstream's live state.
    pub(crate) fn state(&self) -> &UpstreamState {
        &self.state
    }

    /// Records the verdict now.
    pub(crate) fn settle(mut self, failure: Option<bool>) {
        if let Some(a) = self.admission.take() {
            settle(&self.state, a, failure, self.state.now());
        }
    }
}

impl Drop for PendingVerdict {
    fn drop(&mut self) {
        if let Some(a) = self.admission.take() {
            self.state.live().breaker.release(a);
        }
    }
}

impl BreakerTicket<'_> {
    /// Swaps this admission for a fresh one, taken now.
    pub(super) fn renew(&mut self) -> Result<(), crate::policy::Refused> {
        let now = self.state.now();
        let r = {
            let mut live = self.state.live();
            if let Some(old) = self.admission.take() {
                live.breaker.release(old);
            }
            live.breaker.try_acquire(now)
        };
        let a = r?;
        if let Some(t) = &a.transition {
            self.state.log_transition(t);
        }
        self.admission = Some(a);
        Ok(())
    }
}

impl Drop for BreakerTicket<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.admission.take() {
            self.state.live().breaker.release(a);
        }
    }
}

/// Asks the breaker to admit a first attempt at `at` (a clock reading the
/// caller already has).
pub(crate) fn admit_breaker_at(
    state: &UpstreamState,
    at: Instant,
) -> Result<BreakerTicket<'_>, ProxyError> {
    let now = state.now_at(at);
    let r = state.live().breaker.try_acquire(now);
    match r {
        Ok(a) => Ok(BreakerTicket::new(state, a)),
        Err(refused) => Err(ProxyError::CircuitOpen {
            retry_after: Some(refused.retry_after),
        }),
    }
}

/// Where a request's rate-limit token came from, so that it can be given
/// back when weir refuses the request itself ([`refund`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// No limit: nothing was taken.
    Nothing,
    /// The fleet's leased bucket.
    Fleet,
    /// The instance's limiter (for a fleet limit, its fallback share).
    Local,
}

/// Takes a rate-limit token for a first attempt if one is there at `at`
/// (or the upstream has no limit); `None`: [`admit_rate`] decides.
fn try_rate(up: &Upstream, key: Option<&str>, at: Instant) -> Option<Taken> {
    if up.config.rate_limit.is_none() {
        return Some(Taken::Nothing);
    }
    let now = up.state.now_at(at);
    take_rate(up, key, now).ok()
}

/// Takes one token at `now`: from the fleet's leased bucket when the limit
/// is the fleet's and the shared state answers, else from the local
/// limiter (its fallback share, for a fleet limit). `Err`: the time until
/// one may be there.
fn take_rate(up: &Upstream, key: Option<&str>, now: Duration) -> Result<Taken, Option<Duration>> {
    let state = &up.state;
    if let Some(b) = fleet_bucket(up) {
        match b.take(now) {
            Take::Admit => return Ok(Taken::Fleet),
            Take::Refuse { retry_in } => return Err(Some(retry_in)),
            Take::Fallback => {}
        }
    }
    let mut live = state.live();
    let Some(l) = live.limiter.as_mut() else {
        return Ok(Taken::Nothing);
    };
    if l.try_acquire(key, now) {
        Ok(Taken::Local)
    } else {
        Err(l.time_until(key, now))
    }
}

/// Gives back the token a request took (`taken`) when weir refuses it
/// afterwards — circuit open, concurrency gate full — so that an outage is
/// answered `circuit_open`, not `rate_limited` (docs/reference/admission.md#admission).
pub(crate) fn refund(up: &Upstream, key: Option<&str>, taken: Taken) {
    match taken {
        Taken::Nothing => {}
        Taken::Fleet => {
            if let Some(b) = fleet_bucket(up) {
                b.give_back(up.state.now());
            }
        }
        Taken::Local => {
            if let Some(l) = up.state.live().limiter.as_mut() {
                l.give_back(key);
            }
        }
    }
}

/// The fleet's leased bucket, when the rate limit is the fleet's (the link
/// is not even looked at otherwise).
pub(crate) fn fleet_bucket(up: &Upstream) -> Option<crate::state::fleet::FleetBucket> {
    let scope = up.config.rate_limit.as_ref()?.scope;
    (scope == crate::policy::Scope::Fleet)
        .then(|| up.state.fleet_bucket())
        .flatten()
}

/// Takes a rate-limit token for a first attempt, waiting up to `max_wait` but
/// never past the deadline.
async fn admit_rate(
    up: &Upstream,
    key: Option<&str>,
    deadline: Instant,
) -> Result<Taken, ProxyError> {
    let Some(max_wait) = up.config.rate_limit.as_ref().map(|r| r.max_wait) else {
        return Ok(Taken::Nothing);
    };
    let state = &up.state;
    let give_up = (Instant::now() + max_wait).min(deadline);
    loop {
        let now = state.now();
        let wait = match take_rate(up, key, now) {
            Ok(taken) => return Ok(taken),
            Err(wait) => wait,
        };
        match wait {
            Some(w) if Instant::now().checked_add(w).is_some_and(|t| t <= give_up) => {
                tokio::time::sleep(w).await
            }
            _ => {
                return Err(ProxyError::RateLimited {
                    retry_after: wait.map(|w| w.max(Duration::from_millis(1))),
                })
            }
        }
    }
}

/// Watches the client while weir waits on its behalf.
pub(crate) trait Watch {
    /// Runs `f` unless the client goes away first (`None`).
    fn unless_gone<F: std::future::Future>(
        &mut self,
        f: F,
    ) -> impl std::future::Future<Output = Option<F::Output>>;
}

/// A client hyper watches for us: when it goes away hyper drops the whole
/// request future, so nothing needs racing.
#[derive(Debug)]
pub(crate) struct Dropped;

impl Watch for Dropped {
    async fn unless_gone<F: std::future::Future>(&mut self, f: F) -> Option<F::Output> {
        Some(f.await)
    }
}

/// A request's deadline (docs/reference/deadlines.md#deadlines-and-timeouts): `start`
/// plus the upstream's `timeout`, lowered (never raised) by what the client
/// asked for (`x-weir-timeout-ms`, `grpc-timeout`); and whether the client
/// lowered it.
pub(crate) fn deadline(
    cfg: &crate::config::UpstreamConfig,
    start: Instant,
    asked: [Option<Duration>; 2],
) -> (Instant, bool) {
    let budget = asked.into_iter().flatten().fold(cfg.timeout, Duration::min);
    (start + budget, budget < cfg.timeout)
}

/// Admission up to the request body, in the order of
/// docs/reference/admission.md#admission: the rate limit (waiting up to `max_wait`,
/// never past the deadline), then the concurrency gate. The body is read
/// after this and before the breaker is asked ([`admit_breaker_at`]), so a slow
/// upload never holds a half-open probe slot. Usually a token and a slot are
/// there at once, with no wait and no clock read; when weir has to wait, a
/// client that goes away meanwhile is let go (`None`). A request the gate
/// refuses gets its rate-limit token back.
pub(crate) async fn admit<W: Watch>(
    up: &Upstream,
    key: Option<&str>,
    start: Instant,
    deadline: Instant,
    w: &mut W,
) -> Option<Result<Admitted, ProxyError>> {
    // Client-side throttling first: a request it refuses never reaches
    // the upstream, so it spends no rate-limit token and holds no slot.
    if !up.state.throttle.admit() {
        return Some(Err(ProxyError::Overloaded));
    }
    let mut waited = false;
    let taken = match try_rate(up, key, start) {
        Some(t) => t,
        None => {
            waited = true;
            match w.unless_gone(admit_rate(up, key, deadline)).await? {
                Ok(t) => t,
                Err(e) => return Some(Err(e)),
            }
        }
    };
    let slot = match up.state.gate.try_enter() {
        Some(s) => s,
        None => {
            waited = true;
            let entered = w.unless_gone(up.state.gate.enter(deadline)).await;
            match entered {
                Some(Ok(s)) => s,
                Some(Err(refused)) => {
                    refund(up, key, taken);
                    return Some(Err(refused.into()));
                }
                None => {
                    refund(up, key, taken);
                    return None;
                }
            }
        }
    };
    Some(Ok(Admitted {
        slot,
        waited,
        taken,
    }))
}

/// A request admitted up to its body.
pub(crate) struct Admitted {
    /// Its concurrency slot, held until its response ends.
    pub(crate) slot: crate::state::gate::Slot,
    /// Whether it waited for a token or a slot.
    pub(crate) waited: bool,
    /// Its rate-limit token, for [`refund`] should the breaker refuse it.
    pub(crate) taken: Taken,
}
