//! An upstream's client-side throttle (docs/reference/admission.md#client-side-throttling):
//! the policy core's [`AdaptiveThrottle`] behind one short lock, with its own
//! random draws, asked at admission and told every answer. Off (the
//! default), a request pays one atomic load.

use crate::clock::{fresh_seed, Clock};
use crate::policy::throttle::{names_quota, sheds};
use crate::policy::{AdaptiveThrottle, Outcome, Random, SeededRandom, ThrottleParams};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::time::Instant;

/// The most callers whose quota answers are counted apart at once; past
/// it, callers with nothing left in their window are let go first.
const MAX_CALLERS: usize = 10_000;

/// One upstream's throttle: the shared one, its random draws, and one per
/// caller that has been answered with a quota signal.
type Inner = (
    AdaptiveThrottle,
    SeededRandom,
    HashMap<u64, AdaptiveThrottle>,
);

#[derive(Debug)]
pub struct ThrottleGate {
    on: AtomicBool,
    inner: Mutex<Option<Inner>>,
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

    fn inner(&self) -> std::sync::MutexGuard<'_, Option<Inner>> {
        self.inner.lock().expect("throttle lock poisoned")
    }

    /// Applies reloaded parameters: kept counts when it stays on, afresh
    /// when turned on, dropped when turned off.
    pub fn set_params(&self, p: Option<&ThrottleParams>) {
        let mut inner = self.inner();
        match (inner.as_mut(), p) {
            (Some((t, _, callers)), Some(p)) if t.params() != p => {
                t.set_params(p.clone());
                callers.values_mut().for_each(|c| c.set_params(p.clone()));
            }
            (Some(_), Some(_)) => {}
            (None, Some(p)) => {
                *inner = Some((
                    AdaptiveThrottle::new(p.clone()),
                    SeededRandom::new(fresh_seed()),
                    HashMap::new(),
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
            Some((t, rng, _)) => {
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

    /// Whether `caller` may go on to the upstream now, as far as its own
    /// quota answers say (weir answers 429 `rate_limited` when not): a
    /// caller the upstream has not told over its quota always may.
    #[inline]
    pub fn admit_caller(&self, caller: Option<u64>) -> bool {
        match caller {
            Some(c) if self.on.load(Ordering::Acquire) => self.admit_caller_on(c),
            _ => true,
        }
    }

    fn admit_caller_on(&self, caller: u64) -> bool {
        let now = self.clock.now();
        let admitted = match self.inner().as_mut() {
            Some((_, rng, callers)) => match callers.get_mut(&caller) {
                Some(t) => {
                    let draw = rng.next_f64();
                    t.admit(now, draw)
                }
                None => true,
            },
            None => true,
        };
        if !admitted {
            self.refusals.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// An attempt of `caller` ended at `ended` with `outcome`: an answer
    /// counts as a request, accepted unless it was the upstream shedding
    /// load (503, gRPC `UNAVAILABLE`). An answer naming one caller's quota
    /// (429, gRPC `RESOURCE_EXHAUSTED`) is that caller's alone: counted
    /// against it, and as served for everyone else, so one caller over its
    /// quota never throttles another. Nothing else counts (a connect
    /// failure or a timeout is the breaker's and the adaptive limit's to
    /// judge).
    #[inline]
    pub fn answered(&self, ended: Instant, outcome: &Outcome, caller: Option<u64>) {
        if self.on.load(Ordering::Acquire) {
            self.answered_on(ended, outcome, caller);
        }
    }

    fn answered_on(&self, ended: Instant, outcome: &Outcome, caller: Option<u64>) {
        let Outcome::Response {
            status,
            grpc_status,
            ..
        } = *outcome
        else {
            return;
        };
        let now = self.clock.at(ended);
        let quota = names_quota(status, grpc_status);
        if let Some((t, _, callers)) = self.inner().as_mut() {
            t.answered(now, quota || !sheds(status, grpc_status));
            let Some(c) = caller else { return };
            if let Some(own) = callers.get_mut(&c) {
                own.answered(now, !quota);
            } else if quota {
                if callers.len() >= MAX_CALLERS {
                    callers.retain(|_, t| t.counts(now).0 > 0);
                    if callers.len() >= MAX_CALLERS {
                        callers.clear();
                    }
                }
                let mut own = AdaptiveThrottle::new(t.params().clone());
                own.answered(now, false);
                callers.insert(c, own);
            }
        }
    }

    /// The throttle now; `None` while it is off.
    pub fn view(&self) -> Option<ThrottleView> {
        let now = self.clock.now();
        let mut inner = self.inner();
        let (t, _, _) = inner.as_mut()?;
        let (requests, accepts) = t.counts(now);
        Some(ThrottleView {
            probability: t.probability(now),
            requests,
            accepts,
            refusals: self.refusals.load(Ordering::Relaxed),
        })
    }
}
