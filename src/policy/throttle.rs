//! Client-side throttling (docs/reference/admission.md#client-side-throttling):
//! the adaptive throttling of Google's SRE book, for an upstream that sheds
//! load itself (429, 503, gRPC `RESOURCE_EXHAUSTED` or `UNAVAILABLE`).
//!
//! Owns [`ThrottleParams`] and [`AdaptiveThrottle`]. Over a sliding `window` it
//! counts the requests weir meant to send (`requests`: every answer the
//! upstream gave, and every request refused here) and the ones the
//! upstream accepted (`accepts`: answers that were no shedding signal), and
//! refuses a new request locally with probability
//!
//! ```text
//! p = max(0, (requests − multiplier × accepts) / (requests + 1))
//! ```
//!
//! capped at `max_reject`, and zero until the window holds `min_requests`.
//! While the upstream accepts more than 1 / `multiplier` of what it is
//! sent, nothing is refused; as it sheds more, weir sends it about
//! `multiplier` times what it accepts, and refuses the rest at once,
//! without a connection, a slot or a retry. Time and the random draw are
//! arguments; it reads no clock.

use super::{Now, PolicyErrors};
use std::time::Duration;

/// The window is kept as this many buckets: it slides a tenth at a time.
const BUCKETS: usize = 10;

/// Validated parameters of client-side throttling.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ThrottleParams {
    /// How many requests per accepted one weir still sends (the SRE book's
    /// K): 2 lets through twice what the upstream accepts.
    pub multiplier: f64,
    /// How far back requests and accepts are counted.
    pub window: Duration,
    /// The highest probability a request is refused with (< 1: some always
    /// reach the upstream, so its recovery is seen).
    pub max_reject: f64,
    /// Requests the window must hold before anything is refused.
    pub min_requests: u32,
}

impl ThrottleParams {
    /// Validates: `multiplier ≥ 1`, a `window` of at least a second,
    /// `0 < max_reject < 1`.
    pub fn try_new(
        multiplier: f64,
        window: Duration,
        max_reject: f64,
        min_requests: u32,
    ) -> Result<Self, PolicyErrors> {
        let mut e = PolicyErrors::default();
        e.check(
            multiplier.is_finite() && (1.0..=100.0).contains(&multiplier),
            "multiplier",
            || format!("must be a number ≥ 1 and ≤ 100, got {multiplier}"),
        );
        e.check(window >= Duration::from_secs(1), "window", || {
            "must be at least 1s".into()
        });
        e.check(
            max_reject.is_finite() && max_reject > 0.0 && max_reject < 1.0,
            "max_reject",
            || format!("must be a number > 0 and < 1, got {max_reject}"),
        );
        e.or_ok(|| ThrottleParams {
            multiplier,
            window,
            max_reject,
            min_requests,
        })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bucket {
    /// Which slice of time it counts (`now / slice`).
    at: u64,
    requests: u64,
    accepts: u64,
}

/// One upstream's client-side throttle ([`ThrottleParams`]); see the module
/// summary.
#[derive(Debug, Clone)]
pub struct AdaptiveThrottle {
    p: ThrottleParams,
    buckets: [Bucket; BUCKETS],
    /// The latest `now` seen (a clock stepping back counts as this).
    seen: Now,
}

impl AdaptiveThrottle {
    pub fn new(p: ThrottleParams) -> Self {
        AdaptiveThrottle {
            p,
            buckets: [Bucket::default(); BUCKETS],
            seen: Duration::ZERO,
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> &ThrottleParams {
        &self.p
    }

    /// Applies reloaded parameters. A new window length starts the counts
    /// afresh (their slices no longer line up); otherwise they are kept.
    pub fn set_params(&mut self, p: ThrottleParams) {
        if p.window != self.p.window {
            self.buckets = [Bucket::default(); BUCKETS];
        }
        self.p = p;
    }

    fn slice(&self) -> u64 {
        let us = self.p.window.as_micros() / BUCKETS as u128;
        u64::try_from(us).unwrap_or(u64::MAX).max(1)
    }

    /// The bucket for `now`, emptied if it last counted an older slice.
    fn bucket(&mut self, now: Now) -> &mut Bucket {
        self.seen = self.seen.max(now);
        let at = u64::try_from(self.seen.as_micros()).unwrap_or(u64::MAX) / self.slice();
        let b = &mut self.buckets[(at % BUCKETS as u64) as usize];
        if b.at != at {
            *b = Bucket {
                at,
                ..Bucket::default()
            };
        }
        b
    }

    /// `(requests, accepts)` within the window ending at `now`.
    pub fn counts(&mut self, now: Now) -> (u64, u64) {
        let at = self.bucket(now).at;
        let oldest = at.saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|b| b.at >= oldest && b.at <= at)
            .fold((0, 0), |(r, a), b| (r + b.requests, a + b.accepts))
    }

    /// The probability a request is refused at `now`.
    pub fn probability(&mut self, now: Now) -> f64 {
        let (requests, accepts) = self.counts(now);
        if requests < u64::from(self.p.min_requests) {
            return 0.0;
        }
        let (r, a) = (requests as f64, accepts as f64);
        ((r - self.p.multiplier * a) / (r + 1.0)).clamp(0.0, self.p.max_reject)
    }

    /// Whether a request may go to the upstream at `now`, given a uniform
    /// `draw` in [0, 1). A refusal counts as a request the upstream did not
    /// accept; one let through is counted when it is answered
    /// ([`AdaptiveThrottle::answered`]).
    pub fn admit(&mut self, now: Now, draw: f64) -> bool {
        let p = self.probability(now);
        if p > 0.0 && draw < p {
            self.bucket(now).requests += 1;
            return false;
        }
        true
    }

    /// The upstream answered at `now`; `accepted`: with no shedding signal.
    pub fn answered(&mut self, now: Now, accepted: bool) {
        let b = self.bucket(now);
        b.requests += 1;
        b.accepts += u64::from(accepted);
    }
}

/// Whether an answer is the upstream shedding load: 429, 503, or gRPC
/// `RESOURCE_EXHAUSTED` (8) or `UNAVAILABLE` (14).
pub fn sheds(status: u16, grpc_status: Option<u8>) -> bool {
    matches!(status, 429 | 503) || matches!(grpc_status, Some(8 | 14))
}

/// Whether an answer names one caller's quota rather than the upstream's
/// load (429, gRPC `RESOURCE_EXHAUSTED`): it counts against that caller
/// only.
pub fn names_quota(status: u16, grpc_status: Option<u8>) -> bool {
    status == 429 || grpc_status == Some(8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    fn params() -> ThrottleParams {
        ThrottleParams::try_new(2.0, 30 * S, 0.9, 20).expect("valid")
    }

    #[test]
    fn a_healthy_upstream_is_never_throttled() {
        let mut t = AdaptiveThrottle::new(params());
        for i in 0..10_000u64 {
            let now = Duration::from_millis(i * 7);
            assert!(t.admit(now, 0.0));
            t.answered(now, true);
        }
        assert_eq!(t.probability(Duration::from_secs(70)), 0.0);
    }

    #[test]
    fn the_probability_is_the_books_formula_capped() {
        let mut t = AdaptiveThrottle::new(params());
        // 100 requests, 30 accepted: (100 − 60) / 101.
        for i in 0..100 {
            t.answered(S, i < 30);
        }
        let p = t.probability(S);
        assert!((p - 40.0 / 101.0).abs() < 1e-9, "{p}");
        // Nothing accepted: capped at max_reject.
        let mut t = AdaptiveThrottle::new(params());
        for _ in 0..100 {
            t.answered(S, false);
        }
        assert_eq!(t.probability(S), 0.9);
    }

    #[test]
    fn nothing_is_refused_below_min_requests() {
        let mut t = AdaptiveThrottle::new(params());
        for _ in 0..19 {
            t.answered(S, false);
        }
        assert_eq!(t.probability(S), 0.0);
        t.answered(S, false);
        assert!(t.probability(S) > 0.0);
    }

    #[test]
    fn a_refusal_counts_as_a_request_not_accepted() {
        let mut t = AdaptiveThrottle::new(params());
        for _ in 0..40 {
            t.answered(S, false);
        }
        assert!(!t.admit(S, 0.0));
        assert_eq!(t.counts(S), (41, 0));
        // A draw above the probability goes through, uncounted until answered.
        assert!(t.admit(S, 0.999));
        assert_eq!(t.counts(S), (41, 0));
    }

    #[test]
    fn old_counts_leave_the_window() {
        let mut t = AdaptiveThrottle::new(params());
        for _ in 0..100 {
            t.answered(S, false);
        }
        assert_eq!(t.counts(28 * S), (100, 0), "still within 30 s");
        assert_eq!(t.counts(40 * S), (0, 0), "a whole window later");
        assert_eq!(t.probability(40 * S), 0.0);
    }

    #[test]
    fn a_clock_stepping_back_is_the_latest_seen() {
        let mut t = AdaptiveThrottle::new(params());
        for _ in 0..100 {
            t.answered(100 * S, false);
        }
        // Earlier readings count into the latest slice, nothing is lost.
        t.answered(S, false);
        assert_eq!(t.counts(S), (101, 0));
    }

    #[test]
    fn a_new_window_starts_afresh_and_other_changes_keep_the_counts() {
        let mut t = AdaptiveThrottle::new(params());
        for _ in 0..50 {
            t.answered(S, false);
        }
        t.set_params(ThrottleParams::try_new(3.0, 30 * S, 0.5, 10).expect("valid"));
        assert_eq!(t.counts(S), (50, 0));
        assert_eq!(t.probability(S), 0.5);
        t.set_params(ThrottleParams::try_new(3.0, 60 * S, 0.5, 10).expect("valid"));
        assert_eq!(t.counts(S), (0, 0));
    }

    #[test]
    fn validation_names_each_field() {
        let e = ThrottleParams::try_new(0.5, Duration::from_millis(10), 1.0, 0)
            .expect_err("three fields out of range");
        let fields: Vec<&str> = e.0.iter().map(|f| f.field).collect();
        assert_eq!(fields, ["multiplier", "window", "max_reject"]);
        assert!(ThrottleParams::try_new(f64::NAN, S, 0.5, 0).is_err());
    }

    #[test]
    fn shedding_signals() {
        assert!(sheds(429, None) && sheds(503, None));
        assert!(sheds(200, Some(8)) && sheds(200, Some(14)));
        assert!(!sheds(500, None) && !sheds(502, None) && !sheds(200, Some(13)));
    }

    proptest! {
        /// The probability stays within [0, max_reject] whatever happens.
        #[test]
        fn the_probability_stays_within_bounds(
            events in proptest::collection::vec((0u64..120_000, any::<bool>(), any::<bool>()), 0..400),
            multiplier in 1.0f64..10.0,
            max_reject in 0.01f64..0.99,
        ) {
            let p = ThrottleParams::try_new(multiplier, 30 * S, max_reject, 5).expect("valid");
            let mut t = AdaptiveThrottle::new(p);
            for (ms, answer, accepted) in events {
                let now = Duration::from_millis(ms);
                if answer {
                    t.answered(now, accepted);
                } else {
                    t.admit(now, 0.5);
                }
                let pr = t.probability(now);
                prop_assert!((0.0..=max_reject).contains(&pr), "{pr}");
            }
        }

        /// An upstream with a capacity of `cap` requests a second (it
        /// accepts the first `cap` of each second and sheds the rest),
        /// offered 100 a second: once a window has passed, what reaches it
        /// is about `multiplier` × `cap` a second, never less than 1 −
        /// `max_reject` of what is offered, and all of it when that is
        /// within `multiplier` × `cap`.
        #[test]
        fn what_reaches_the_upstream_settles_near_k_times_its_capacity(
            cap in 1u32..100,
            multiplier in 1.5f64..4.0,
        ) {
            let p = ThrottleParams::try_new(multiplier, 30 * S, 0.9, 20).expect("valid");
            let mut t = AdaptiveThrottle::new(p);
            let mut rng = crate::policy::SeededRandom::new(u64::from(cap));
            let (mut sent, mut this_second) = (0u32, 0u32);
            // 100 requests a second for two minutes; the last minute counts.
            for i in 0..12_000u64 {
                if i % 100 == 0 {
                    this_second = 0;
                }
                let now = Duration::from_millis(i * 10);
                let go = t.admit(now, crate::policy::Random::next_f64(&mut rng));
                if go {
                    this_second += 1;
                    t.answered(now, this_second <= cap);
                }
                if i >= 6_000 {
                    sent += u32::from(go);
                }
            }
            let per_second = f64::from(sent) / 60.0;
            let expect = (multiplier * f64::from(cap)).clamp(10.0, 100.0);
            prop_assert!(
                per_second >= expect * 0.85 - 1.0 && per_second <= expect * 1.15 + 1.0,
                "{per_second:.1}/s reached the upstream, expected about {expect:.1} (capacity {cap}/s, K {multiplier})"
            );
        }
    }
}
