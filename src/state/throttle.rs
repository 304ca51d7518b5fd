//! An upstream's client-side throttle (docs/reference/admission.md#client-side-throttling):
//! the policy core's [`AdaptiveThrottle`] behind one short lock, with its own
//! random draws, asked at admission and told every answer. Off (the
//! default), a request pays one atomic load.

use crate::clock::{fresh_seed, Clock};
use crate::policy::throttle::sheds;
use crate::policy::{AdaptiveThrottle, Outcome, Random, SeededRandom, ThrottleParams};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
pub struct ThrottleGate {
    on: AtomicBool,
    inner: Mutex<Option<(AdaptiveThrottle, SeededRandom)>>,
    /// Requests refused since the upstream was created (kept across a
    /// reload that turns it off and on, so the counter that follows it
    /// never goes back).
    refusals: AtomicU64,
    clock: Clock,
}

/// What the throttle shows (`/metrics`, the status page).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleView {
    /// The probability a request is refused now.
    pub probability: f64,
    /// Requests (answers and refusals) and accepts within the window.
    pub requests: u64,
    pub accepts: u64,
    /// Requests refused since the upstream was created.
    pub refusals: u64,
}

impl ThrottleGate {
    pub fn new(p: Option<&ThrottleParams>, clock: Clock) -> Self {
        let t = ThrottleGate {
            on: AtomicBool::new(false),
            inner: Mutex::new(None),
            refusals: AtomicU64::new(0),
            clock,
        };
        t.set_params(p);
        t
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Option<(AdaptiveThrottle, SeededRandom)>> {
        self.inner.lock().expect("throttle lock poisoned")
    }

    /// Applies reloaded parameters: kept counts when it stays on, afresh
    /// when turned on, dropped when turned off.
    pub fn set_params(&self, p: Option<&ThrottleParams>) {
        let mut inner = self.inner();
        match (inner.as_mut(), p) {
            (Some((t, _)), Some(p)) if t.params() != p => t.set_params(p.clone()),
            (Some(_), Some(_)) => {}
            (None, Some(p)) => {
                *inner = Some((
                    AdaptiveThrottle::new(p.clone()),
                    SeededRandom::new(fresh_seed()),
                ));
            }
            (_, None) => *inner = None,
        }
        self.on.store(inner.is_some(), Ordering::Release);
    }

    /// Whether a request may go on to the upstream now; a refusal is
    /// counted (weir answers 503 `overloaded`). Inlined: while off, the
    /// one atomic load is all a request pays.
    #[inline]
    pub fn admit(&self) -> bool {
        !self.on.load(Ordering::Acquire) || self.admit_on()
    }

    fn admit_on(&self) -> bool {
        let now = self.clock.now();
        let admitted = match self.inner().as_mut() {
            Some((t, rng)) => {
                let draw = rng.next_f64();
                t.admit(now, draw)
            }
            None => true,
        };
        if !admitted {
            self.refusals.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// An attempt ended at `ended` with `outcome`: an answer counts as a
    /// request, accepted unless it was the upstream shedding load. Nothing
    /// else counts (a connect failure or a timeout is the breaker's and the
    /// adaptive limit's to judge).
    #[inline]
    pub fn answered(&self, ended: Instant, outcome: &Outcome) {
        if self.on.load(Ordering::Acquire) {
            self.answered_on(ended, outcome);
        }
    }

    fn answered_on(&self, ended: Instant, outcome: &Outcome) {
        let Outcome::Response {
            status,
            grpc_status,
            ..
        } = *outcome
        else {
            return;
        };
        let now = self.clock.at(ended);
        if let Some((t, _)) = self.inner().as_mut() {
            t.answered(now, !sheds(status, grpc_status));
        }
    }

    /// The throttle now; `None` while it is off.
    pub fn view(&self) -> Option<ThrottleView> {
        let now = self.clock.now();
        let mut inner = self.inner();
        let (t, _) = inner.as_mut()?;
        let (requests, accepts) = t.counts(now);
        Some(ThrottleView {
            probability: t.probability(now),
            requests,
            accepts,
            refusals: self.refusals.load(Ordering::Relaxed),
        })
    }
}
