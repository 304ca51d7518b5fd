//! What the status page remembers per upstream (docs/reference/admin.md#status-page):
//! a fixed ring of counter samples, taken every [`INTERVAL`] off the data
//! plane, and the last [`TRANSITIONS`] breaker transitions. Both are bounded
//! whatever the traffic; nothing here is touched per request (a transition
//! is recorded when it happens, which is rare).

use crate::metrics::ERROR_CODES;
use crate::policy::{StateKind, StopReason, Transition};
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Time between two samples.
pub const INTERVAL: Duration = Duration::from_secs(2);
/// Samples kept: five minutes of intervals, plus the one they start from.
pub const CAPACITY: usize = 151;
/// Breaker transitions kept.
pub const TRANSITIONS: usize = 8;
/// Latency histogram buckets kept (weir's histograms have 14 bounds).
pub const BUCKETS: usize = 16;

/// How many of weir's error codes are refusals: answers weir gave without
/// asking the upstream (rate limited, circuit open, overloaded, …).
pub const REFUSALS: usize = {
    let (mut n, mut i) = (0, 0);
    while i < ERROR_CODES.len() {
        if ERROR_CODES[i].2 {
            n += 1;
        }
        i += 1;
    }
    n
};

/// The refusals' error codes, in [`ERROR_CODES`]' order.
pub const REFUSAL_CODES: [&str; REFUSALS] = {
    let mut out = [""; REFUSALS];
    let (mut i, mut j) = (0, 0);
    while i < ERROR_CODES.len() {
        if ERROR_CODES[i].2 {
            out[j] = ERROR_CODES[i].0;
            j += 1;
        }
        i += 1;
    }
    out
};

/// Cumulative counters of one upstream at one instant, read from its metric
/// series.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Policy-core time of the sample.
    pub at: Duration,
    /// `weir_requests_total`, every code.
    pub requests: u64,
    /// Of those, answered with an upstream status below 500.
    pub successes: u64,
    /// `weir_retries_total`, every cause.
    pub retries: u64,
    /// `weir_hedges_total` sent (won or lost).
    pub hedges: u64,
    /// `weir_retry_stops_total`, in [`StopReason::ALL`]'s order.
    pub stops: [u64; StopReason::ALL.len()],
    /// Of `requests`, weir's refusals, in [`REFUSAL_CODES`]' order.
    pub refusals: [u64; REFUSALS],
    /// `weir_request_duration_seconds`: cumulative count per bucket bound.
    pub le: [u64; BUCKETS],
    /// `weir_request_duration_seconds_count`.
    pub count: u64,
}

/// A breaker transition and when it happened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recorded {
    /// Policy-core time of the transition.
    pub at: Duration,
    pub from: StateKind,
    pub to: StateKind,
    /// When `to` is open: for how long.
    pub open_for: Option<Duration>,
}

/// A copy of one upstream's memory, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    /// When the upstream's live state was created (policy-core time).
    pub created: Duration,
    /// At most [`CAPACITY`], oldest first.
    pub samples: Vec<Sample>,
    /// The histogram's bucket bounds, in seconds (as many as it has, at most
    /// [`BUCKETS`]).
    pub bounds: Vec<f64>,
    /// At most [`TRANSITIONS`], oldest first.
    pub transitions: Vec<Recorded>,
}

#[derive(Debug)]
struct StatusMemory {
    created: Duration,
    /// Grows to [`CAPACITY`] (allocated once), then `head` is overwritten.
    samples: Vec<Sample>,
    /// Where the next sample goes once the ring is full (the oldest).
    head: usize,
    bounds: Vec<f64>,
    transitions: VecDeque<Recorded>,
}

/// One upstream's status memory, behind a lock taken by the sampler, a
/// breaker transition, or a status request — never by an ordinary request.
#[derive(Debug)]
pub struct Recent {
    inner: Mutex<StatusMemory>,
}

impl Recent {
    /// Empty, for an upstream created at `now`.
    pub fn new(now: Duration) -> Self {
        Recent {
            inner: Mutex::new(StatusMemory {
                created: now,
                samples: Vec::with_capacity(CAPACITY),
                head: 0,
                bounds: Vec::new(),
                transitions: VecDeque::with_capacity(TRANSITIONS),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StatusMemory> {
        // The data inside is plain numbers: a panic elsewhere cannot leave it
        // half-written in a way that matters to a status page.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a breaker transition at `now`, forgetting the oldest beyond
    /// [`TRANSITIONS`].
    pub fn transition(&self, now: Duration, t: &Transition) {
        let mut inner = self.lock();
        if inner.transitions.len() >= TRANSITIONS {
            inner.transitions.pop_front();
        }
        inner.transitions.push_back(Recorded {
            at: now,
            from: t.from,
            to: t.to,
            open_for: t.open_for,
        });
    }

    /// Adds a sample, overwriting the oldest once [`CAPACITY`] are held.
    pub fn push(&self, sample: Sample, bounds: &[f64]) {
        let mut inner = self.lock();
        if inner.bounds.as_slice() != bounds {
            inner.bounds = bounds.iter().take(BUCKETS).copied().collect();
        }
        if inner.samples.len() < CAPACITY {
            inner.samples.push(sample);
        } else {
            let head = inner.head;
            inner.samples[head] = sample;
            inner.head = (head + 1) % CAPACITY;
        }
    }

    /// A copy of everything held, oldest first.
    pub fn memory(&self) -> Memory {
        let inner = self.lock();
        let (newer, older) = inner.samples.split_at(inner.head);
        Memory {
            created: inner.created,
            samples: older.iter().chain(newer).copied().collect(),
            bounds: inner.bounds.clone(),
            transitions: inner.transitions.iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Sample {
        Sample {
            at: Duration::from_secs(s),
            requests: s,
            ..Sample::default()
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_capacity_samples_in_order() {
        let r = Recent::new(Duration::ZERO);
        for s in 0..(CAPACITY as u64 * 2 + 7) {
            r.push(at(s), &[0.1]);
        }
        let m = r.memory();
        assert_eq!(m.samples.len(), CAPACITY);
        let first = CAPACITY as u64 + 7;
        let got: Vec<u64> = m.samples.iter().map(|s| s.requests).collect();
        let want: Vec<u64> = (first..first + CAPACITY as u64).collect();
        assert_eq!(got, want);
        assert_eq!(m.bounds, vec![0.1]);
    }

    #[test]
    fn the_ring_never_grows_past_its_first_allocation() {
        let r = Recent::new(Duration::ZERO);
        for s in 0..1000 {
            r.push(at(s), &[]);
        }
        assert_eq!(r.lock().samples.capacity(), CAPACITY);
    }

    #[test]
    fn the_documented_bound_holds() {
        // docs/reference/admin.md#status-page: "at most 52 KiB per upstream".
        let bytes = CAPACITY * std::mem::size_of::<Sample>()
            + TRANSITIONS * std::mem::size_of::<Recorded>()
            + BUCKETS * std::mem::size_of::<f64>();
        assert!(bytes <= 52 * 1024, "{bytes} bytes");
    }

    #[test]
    fn refusals_are_the_answers_weir_gives_without_asking() {
        for c in ["rate_limited", "circuit_open", "overloaded", "bad_request"] {
            assert!(REFUSAL_CODES.contains(&c), "{c}");
        }
        for c in ["connect_failed", "upstream_timeout", "deadline_exceeded"] {
            assert!(!REFUSAL_CODES.contains(&c), "{c}");
        }
    }

    #[test]
    fn transitions_keep_the_last_few() {
        let r = Recent::new(Duration::ZERO);
        for i in 0..20u64 {
            let (from, to) = if i % 2 == 0 {
                (StateKind::Closed, StateKind::Open)
            } else {
                (StateKind::Open, StateKind::HalfOpen)
            };
            let t = Transition {
                from,
                to,
                open_for: None,
            };
            r.transition(Duration::from_secs(i), &t);
        }
        let m = r.memory();
        assert_eq!(m.transitions.len(), TRANSITIONS);
        assert_eq!(m.transitions[0].at, Duration::from_secs(12));
        assert_eq!(m.transitions[TRANSITIONS - 1].at, Duration::from_secs(19));
    }
}
