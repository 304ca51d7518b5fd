//! Hedged attempts (docs/reference/hedging.md#hedging): a first attempt that
//! has not answered when a hedge is due gets a second one beside it, on
//! another endpoint; the first good answer wins and the other is dropped,
//! which cancels it (HTTP/2: `RST_STREAM(CANCEL)`; HTTP/1.1: its connection
//! is closed, never pooled). Both data paths race their attempts through
//! [`race`]; [`super::drive`] decides whether a hedge may go and keeps the
//! books.

use crate::policy::Outcome;
use crate::proxy::error::ProxyError;
use crate::upstream::Address;
use std::future::Future;
use std::sync::Mutex;
use tokio::time::Instant;

/// What an attempt ends with.
pub(crate) type Ended<R> = (Outcome, Result<R, ProxyError>);

/// What the driver hands a transport for one attempt that may be hedged.
pub(crate) struct Hedging<'h> {
    /// When the hedge is due.
    pub due: Instant,
    /// Asked when the hedge is due: the hedge's own give-up time when it
    /// may go (budget, `max_extra`, breaker, deadline), `None` when not.
    pub permit: &'h mut (dyn FnMut(Instant) -> Option<Instant> + Send),
    /// Whether an answer is one to return (not one the retry policy would
    /// retry): the first such answer wins the race.
    pub good: &'h (dyn Fn(&Outcome) -> bool + Sync),
}

/// The endpoint an attempt went to, published while it is in flight so that
/// its hedge goes elsewhere.
#[derive(Debug, Default)]
pub(crate) struct Seen(Mutex<Option<Address>>);

impl Seen {
    pub(crate) fn set(&self, addr: Address) {
        if let Ok(mut s) = self.0.lock() {
            *s = Some(addr);
        }
    }

    pub(crate) fn get(&self) -> Option<Address> {
        self.0.lock().ok().and_then(|s| *s)
    }
}

/// What a hedge came to, for the driver's books and the annotations.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HedgeRun {
    /// The answer returned is the hedge's.
    pub won: bool,
    /// When the hedge was sent.
    pub sent: Instant,
    /// The other attempt's outcome when it ended first, badly; `None` when it
    /// was cancelled.
    pub other: Option<Outcome>,
    /// When the other attempt ended or was cancelled.
    pub other_ended: Instant,
}

/// One attempt's answer, or a race's.
pub(crate) struct Raced<R> {
    pub outcome: Outcome,
    pub result: Result<R, ProxyError>,
    /// When the attempt whose answer this is started.
    pub started: Instant,
    pub hedge: Option<HedgeRun>,
}

impl<R> Raced<R> {
    /// After a race: the cancelled attempt's endpoint (`first` for the first
    /// attempt's, `hedge` for the hedge's) learns how long it had taken.
    pub(crate) fn observe_loser(
        &self,
        endpoints: &crate::upstream::Endpoints,
        started: Instant,
        (first, hedge): (&Seen, &Seen),
    ) {
        let Some(run) = self.hedge.filter(|r| r.other.is_none()) else {
            return;
        };
        let (addr, began) = if run.won {
            (first.get(), started)
        } else {
            (hedge.get(), run.sent)
        };
        if let Some(a) = addr {
            endpoints.observe_cancelled(a, run.other_ended.saturating_duration_since(began));
        }
    }

    pub(crate) fn single((outcome, result): Ended<R>, started: Instant) -> Self {
        Raced {
            outcome,
            result,
            started,
            hedge: None,
        }
    }
}

/// Runs `primary` (started at `started`); if it has not ended when the hedge
/// is due and the driver permits one, `hedge(now, give_up_at)` beside it.
/// The first good answer wins; a bad first answer leaves the other to
/// finish, and its answer is returned whatever it is.
pub(crate) async fn race<R, P, H, M>(
    primary: P,
    started: Instant,
    hedging: Hedging<'_>,
    hedge: M,
) -> Raced<R>
where
    P: Future<Output = Ended<R>>,
    H: Future<Output = Ended<R>>,
    M: FnOnce(Instant, Instant) -> H,
{
    let mut primary = std::pin::pin!(primary);
    tokio::select! {
        biased;
        r = &mut primary => return Raced::single(r, started),
        () = tokio::time::sleep_until(hedging.due) => {}
    }
    let sent = Instant::now();
    let Some(give_up) = (hedging.permit)(sent) else {
        return Raced::single(primary.await, started);
    };
    let mut second = std::pin::pin!(hedge(sent, give_up));
    let (first, first_is_primary) = tokio::select! {
        r = &mut primary => (r, true),
        r = &mut second => (r, false),
    };
    let ended = Instant::now();
    if (hedging.good)(&first.0) {
        // The winner; dropping the other cancels it.
        let (outcome, result) = first;
        return Raced {
            outcome,
            result,
            started: if first_is_primary { started } else { sent },
            hedge: Some(HedgeRun {
                won: !first_is_primary,
                sent,
                other: None,
                other_ended: ended,
            }),
        };
    }
    // The first to end failed: the other is already the retry.
    let ((outcome, result), started) = if first_is_primary {
        (second.await, sent)
    } else {
        (primary.await, started)
    };
    Raced {
        outcome,
        result,
        started,
        hedge: Some(HedgeRun {
            won: first_is_primary,
            sent,
            other: Some(first.0),
            other_ended: ended,
        }),
    }
}

impl<'a> super::Attempts<'a> {
    /// When this attempt's hedge is due (`started` + the upstream's `after`),
    /// or `None`: hedging is off, a hedge was sent already, or a percentile
    /// has too few samples yet. Each request asked here earns its share of
    /// `max_extra`.
    pub(crate) fn hedge_due(&mut self, started: Instant) -> Option<Instant> {
        let p = self.up.config.hedge.as_ref()?;
        if self.hedges >= p.max_hedges {
            return None;
        }
        let state = &self.up.state;
        let mut live = state.live();
        if self.made <= 1 && self.hedges == 0 {
            live.hedge.extra.earn(p.max_extra);
        }
        let delay = live.hedge.delay(p.after)?;
        Some(started + delay)
    }

    /// Whether a hedge may go now: the request may be replayed, time is
    /// left for an attempt, `max_extra` has credit, the retry budget pays
    /// for it and the breaker admits it. `Some(give_up_at)` when it goes
    /// (counted as an attempt, its breaker slot held); a skip is counted in
    /// `weir_hedges_total`.
    pub(crate) fn permit_hedge(&mut self, now: Instant) -> Option<Instant> {
        use crate::policy::{BodyFacts, HedgeResult};
        let p = self.up.config.hedge.as_ref()?;
        let state = &self.up.state;
        let retry = &self.up.config.retry;
        let body_ok = match self.facts.body {
            BodyFacts::Empty => true,
            BodyFacts::Buffered { len } => len <= retry.max_replay_body_bytes,
            BodyFacts::Streamed { .. } => false,
        };
        let skip = |r| {
            state.metrics.hedge(r);
            None
        };
        if !self.facts.idempotent || (self.keyed_write && !p.keyed_writes) || !body_ok {
            return skip(HedgeResult::SkippedUnsafe);
        }
        if self.deadline_at(now).saturating_duration_since(now) < retry.min_attempt_time {
            return skip(HedgeResult::SkippedDeadline);
        }
        // A hedge takes a concurrency slot like any attempt.
        let Some(mut slot) = state.gate.try_enter() else {
            return skip(HedgeResult::SkippedOverloaded);
        };
        if !state.gate.try_place(&mut slot) {
            return skip(HedgeResult::SkippedOverloaded);
        }
        let at = state.now_at(now);
        let admission = {
            let mut guard = state.live();
            let live = &mut *guard;
            if !live.hedge.extra.try_spend() {
                drop(guard);
                return skip(HedgeResult::SkippedExtra);
            }
            if !live.budget.try_withdraw(1, at) {
                live.hedge.extra.refund();
                drop(guard);
                return skip(HedgeResult::SkippedBudget);
            }
            match live.breaker.try_acquire(at) {
                Ok(a) => a,
                Err(_) => {
                    live.hedge.extra.refund();
                    drop(guard);
                    return skip(HedgeResult::SkippedBreaker);
                }
            }
        };
        self.hedge_ticket = Some(super::admit::BreakerTicket::new(state, admission));
        self.hedge_slot = Some(slot);
        self.hedges += 1;
        self.made += 1;
        let give_up = self
            .up
            .config
            .per_try_timeout
            .map(|t| (now + t).min(self.deadline_at(now)))
            .unwrap_or_else(|| self.deadline_at(now));
        Some(give_up)
    }

    /// The books after a race with a hedge: the other attempt's outcome (a
    /// failure that ended first) or its cancellation, each on its own
    /// breaker slot, and the slot of the answer kept for its verdict.
    /// `primary_started`: when the first attempt started.
    pub(crate) fn settle_hedge(&mut self, run: &HedgeRun, primary_started: Instant) {
        use crate::policy::HedgeResult;
        let state = &self.up.state;
        let hedge_ticket = self.hedge_ticket.take();
        let other_started = if run.won { primary_started } else { run.sent };
        let took = run.other_ended.saturating_duration_since(other_started);
        let now = state.now_at(run.other_ended);
        let mut other_ticket = match (run.won, hedge_ticket) {
            // The hedge's answer is returned: its slot becomes the request's.
            (true, Some(h)) => Some(std::mem::replace(&mut self.ticket, h)),
            (false, h) => h,
            (true, None) => None,
        };
        match run.other {
            Some(outcome) => {
                state.metrics.attempt(&outcome, took);
                super::drive::observe_latency(self.up, &outcome, other_started, took);
                state
                    .throttle
                    .answered(run.other_ended, &outcome, self.facts.caller);
                let blame = outcome.breaker_failure(&self.up.config.breaker);
                if let Some(t) = &mut other_ticket {
                    t.record(blame, now);
                }
            }
            None => {
                // Cancelled: no verdict; as far as it got is still a latency.
                state.metrics.attempt(&Outcome::ClientGone, took);
            }
        }
        state.live().hedge.latency.observe(took, now);
        drop(other_ticket);
        self.hedge_slot = None;
        state.metrics.hedge(if run.won {
            HedgeResult::Won
        } else {
            HedgeResult::Lost
        });
        self.hedged = Some(run.won);
    }
}
