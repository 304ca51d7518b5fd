//! How weir's breaker behaved during a chaos scenario (the weir column),
//! sampled every few milliseconds: [`BreakerTrace`] and its sampler.

use super::upstream;
use crate::metrics::Metrics;
use crate::policy::StateKind;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How weir's breaker behaved, sampled every few milliseconds (weir column).
#[derive(Debug, Clone, Default)]
pub struct BreakerTrace {
    /// Upstream attempts weir made while its breaker was open throughout.
    pub attempts_while_open: u64,
    /// Times the breaker went half-open.
    pub half_opens: u64,
    /// Upstream attempts made while it was half-open: the probes its
    /// breaker admitted.
    pub attempts_while_half_open: u64,
    /// From the end of the outage to the breaker closing, if it did.
    pub recovery: Option<Duration>,
    /// The open interval in force when the outage ended.
    pub last_open_interval: Option<Duration>,
}

/// Samples the breaker state and the requests the upstream received every
/// 2 ms into `out` until aborted.
///
/// An attempt counts against an open breaker when it reached the upstream
/// between two samples that, with the one before them, all saw the breaker
/// open: it was open for at least a whole interval before the attempt
/// arrived. (weir's own attempt counter counts an attempt when it ends, so
/// one admitted just before the breaker opened and answered after would
/// have counted; so would one admitted just before and read by the
/// upstream just after a single sample.)
pub(super) async fn trace_breaker(
    state: Arc<crate::state::UpstreamState>,
    metrics: Arc<Metrics>,
    upstream: Arc<upstream::Counters>,
    started: Instant,
    outage_end: Option<Duration>,
    out: Arc<std::sync::Mutex<BreakerTrace>>,
) {
    let attempts = || upstream.received();
    let half_opens = || {
        metrics
            .values("weir_breaker_transitions_total", "chaos", "to")
            .get("half_open")
            .copied()
            .unwrap_or(0.0) as u64
    };
    let mut prev_state = StateKind::Closed;
    let mut before_prev = StateKind::Closed;
    let mut prev_attempts = attempts();
    let mut prev_half_opens = half_opens();
    let probes_at_start = state.live().breaker.probes();
    loop {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let (view, open_for, probes) = {
            let now = state.now();
            let live = state.live();
            let b = &live.breaker;
            (b.state(now), b.open_interval(0.5), b.probes())
        };
        let a = attempts();
        let h = half_opens();
        let delta = a.saturating_sub(prev_attempts);
        let mut t = out.lock().expect("trace lock poisoned");
        // An interval in which the breaker went half-open holds probes, even
        // if it was open again by the time of the sample.
        let probed = h > prev_half_opens;
        if let (StateKind::Open, StateKind::Open, StateKind::Open) =
            (before_prev, prev_state, view.state)
        {
            if !probed {
                t.attempts_while_open += delta;
            }
        }
        // Probes are counted when the breaker admits them: attempts are
        // counted when they end, and a sample that sees a probe close the
        // breaker may hold attempts admitted after it, closed.
        t.attempts_while_half_open = probes - probes_at_start;
        t.half_opens = h;
        prev_half_opens = h;
        if let Some(end) = outage_end {
            let elapsed = started.elapsed();
            if elapsed >= end {
                if t.last_open_interval.is_none() && view.state != StateKind::Closed {
                    t.last_open_interval = Some(open_for);
                }
                if t.recovery.is_none()
                    && view.state == StateKind::Closed
                    && prev_state != StateKind::Closed
                {
                    t.recovery = Some(elapsed - end);
                }
            }
        }
        before_prev = prev_state;
        prev_state = view.state;
        prev_attempts = a;
    }
}
