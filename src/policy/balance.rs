//! Choosing an endpoint (docs/reference/endpoints.md#balancing): the latency estimate
//! each endpoint keeps (peak-EWMA) and the power-of-two-choices pick over
//! it. Pure: time and the random draws are arguments.

use crate::policy::Now;
use std::time::Duration;

/// The estimate an endpoint starts with, before its first answer: an
/// endpoint nobody has measured is neither favoured nor avoided
/// (linkerd2-proxy's default).
pub const DEFAULT_RTT: Duration = Duration::from_millis(30);

/// How fast an old estimate fades: after `DECAY` without a new sample an
/// estimate has moved 63 % of the way to the next one (linkerd2-proxy's
/// default).
pub const DECAY: Duration = Duration::from_secs(10);

/// The most an estimate keeps of itself per sample below it: however close
/// together samples come, each pulls the estimate at least 5 % of the way
/// toward it, so that one outlier (a pause of the machine) is forgiven
/// within a few dozen answers rather than within [`DECAY`]s of them.
pub const MAX_KEEP: f64 = 0.95;

/// What an estimate keeps of itself each time its endpoint loses a draw
/// with nothing in flight: an endpoint avoided for one slow answer (a
/// pause of the machine, a garbage collection) is tried again after a few
/// hundred draws at most, however short the time they take — time alone
/// ([`DECAY`]) would keep it out for tens of seconds while a few client
/// connections send everything to the others. A replica that is really
/// slow pays for it again on its next answer, and while that answer is
/// pending its estimate does not fade: from 1 s down to 1 ms takes 135
/// lost draws after each slow answer.
pub const LOSS_KEEP: f64 = 0.95;

/// What a failed attempt counts as in the estimate, at least: a replica that
/// answers 503 (or refuses) at once is not a fast replica, and without this
/// the balancer would send it more than its share.
pub const FAILURE_RTT: Duration = Duration::from_secs(1);

/// How an upstream's endpoints are balanced and ejected (from its config).
#[derive(Debug, Clone, PartialEq)]
pub struct BalanceParams {
    pub balance: Balance,
    pub ejection: super::eject::EjectParams,
    /// Endpoints used at most; addresses beyond are left out (and logged).
    pub max_endpoints: u32,
}

/// How the endpoint is picked (`balance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Two endpoints drawn at random; the one with the lower
    /// latency × (in flight + 1) takes the request.
    PeakEwma,
    /// Each request to the next endpoint in turn.
    RoundRobin,
}

impl Balance {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Balance::PeakEwma => "peak_ewma",
            Balance::RoundRobin => "round_robin",
        }
    }
}

/// A peak-sensitive moving average of an endpoint's response time: a
/// sample above the estimate replaces it at once (a replica turning slow is
/// seen on its first slow answer), one below it pulls it down by a weight
/// that grows with the time since the last sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeakEwma {
    /// Nanoseconds.
    estimate: f64,
    at: Now,
}

impl PeakEwma {
    /// An estimate of [`DEFAULT_RTT`] at `now`.
    pub fn new(now: Now) -> Self {
        PeakEwma {
            estimate: DEFAULT_RTT.as_nanos() as f64,
            at: now,
        }
    }

    /// An estimate of `rtt` at `now`: for an endpoint that joins a set
    /// whose others are measured already, at the best of theirs, so that
    /// it is neither starved (a fresh 30 ms beside endpoints measured
    /// below it would never win a draw while nothing is in flight) nor
    /// flooded.
    pub fn starting_at(rtt: Duration, now: Now) -> Self {
        PeakEwma {
            estimate: rtt.as_nanos() as f64,
            at: now,
        }
    }

    /// Takes one response time measured at `now`.
    pub fn observe(&mut self, rtt: Duration, now: Now) {
        let sample = rtt.as_nanos() as f64;
        if sample > self.estimate {
            self.estimate = sample;
        } else {
            let w = self.weight(now).min(MAX_KEEP);
            self.estimate = self.estimate * w + sample * (1.0 - w);
        }
        self.at = self.at.max(now);
    }

    /// Takes one attempt's outcome: a failure counts as at least
    /// [`FAILURE_RTT`].
    pub fn observe_outcome(&mut self, rtt: Duration, failure: bool, now: Now) {
        self.observe(if failure { rtt.max(FAILURE_RTT) } else { rtt }, now);
    }

    /// Its endpoint lost a draw: the estimate fades by [`LOSS_KEEP`].
    pub fn lost(&mut self) {
        self.estimate *= LOSS_KEEP;
    }

    /// The last estimate, in nanoseconds.
    pub fn estimate(&self) -> f64 {
        self.estimate
    }

    /// The estimate at `now`: it fades toward zero while no sample comes,
    /// so an endpoint avoided for being slow is tried again in time
    /// (after about 9 × [`DECAY`] a 1 s estimate reads as 0.1 ms).
    pub fn estimate_at(&self, now: Now) -> f64 {
        self.estimate * self.weight(now)
    }

    /// The weight the old estimate keeps at `now`.
    fn weight(&self, now: Now) -> f64 {
        let elapsed = now.saturating_sub(self.at).as_secs_f64();
        (-elapsed / DECAY.as_secs_f64()).exp()
    }

    /// What sending one more request here at `now` would cost: the
    /// estimate times the requests already waiting on this endpoint, plus
    /// this one.
    pub fn cost(&self, in_flight: u32, now: Now) -> f64 {
        self.estimate_at(now) * (f64::from(in_flight) + 1.0)
    }
}

/// Two distinct indices below `n` from two uniform draws in `[0, 1)`
/// (`n ≥ 2`).
pub fn two_of(n: usize, a: f64, b: f64) -> (usize, usize) {
    let i = ((a * n as f64) as usize).min(n - 1);
    let j = ((b * (n - 1) as f64) as usize).min(n - 2);
    (i, if j >= i { j + 1 } else { j })
}

/// The cheaper of two candidates by cost; a tie goes to the first.
pub fn cheaper(a: (usize, f64), b: (usize, f64)) -> usize {
    if b.1 < a.1 {
        b.0
    } else {
        a.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_slow_answer_raises_the_estimate_at_once() {
        let mut e = PeakEwma::new(Duration::ZERO);
        e.observe(ms(1000), ms(10));
        assert_eq!(e.estimate(), ms(1000).as_nanos() as f64);
    }

    #[test]
    fn fast_answers_pull_it_down_with_time() {
        let mut e = PeakEwma::new(Duration::ZERO);
        e.observe(ms(1000), Duration::ZERO);
        // Right after: moves 5 % (MAX_KEEP).
        e.observe(ms(1), ms(1));
        assert!(e.estimate() > ms(945).as_nanos() as f64);
        assert!(e.estimate() < ms(951).as_nanos() as f64);
        // A decay period later: most of the way down.
        e.observe(ms(1), ms(1) + DECAY);
        assert!(e.estimate() < ms(400).as_nanos() as f64, "{}", e.estimate());
    }

    #[test]
    fn an_outlier_is_forgiven_within_hundreds_of_answers() {
        let mut e = PeakEwma::starting_at(ms(1), Duration::ZERO);
        e.observe(ms(20), Duration::ZERO);
        for i in 0..400u64 {
            e.observe(ms(1), Duration::from_micros(i));
        }
        assert!(e.estimate() < ms(2).as_nanos() as f64, "{}", e.estimate());
    }

    #[test]
    fn an_endpoint_that_keeps_losing_draws_is_tried_again() {
        let mut slow = PeakEwma::starting_at(ms(1), Duration::ZERO);
        slow.observe(ms(20), Duration::ZERO);
        let fast = PeakEwma::starting_at(ms(1), Duration::ZERO);
        let mut losses = 0;
        while slow.cost(0, Duration::ZERO) >= fast.cost(1, Duration::ZERO) {
            slow.lost();
            losses += 1;
        }
        assert!((40..=50).contains(&losses), "{losses}");
        let mut very = PeakEwma::starting_at(ms(1000), Duration::ZERO);
        for _ in 0..135 {
            very.lost();
        }
        assert!(very.estimate() < ms(1).as_nanos() as f64);
    }

    #[test]
    fn in_flight_requests_make_an_endpoint_dearer() {
        let e = PeakEwma::new(Duration::ZERO);
        let now = Duration::ZERO;
        assert!(e.cost(3, now) > e.cost(0, now));
        assert_eq!(e.cost(1, now), 2.0 * e.cost(0, now));
    }

    #[test]
    fn an_unmeasured_estimate_fades_and_a_failure_counts_as_slow() {
        let mut e = PeakEwma::new(Duration::ZERO);
        e.observe_outcome(ms(2), true, Duration::ZERO);
        assert_eq!(e.estimate(), FAILURE_RTT.as_nanos() as f64);
        assert!(e.cost(0, DECAY * 10) < ms(1).as_nanos() as f64);
        assert_eq!(e.cost(0, Duration::ZERO), e.estimate());
    }

    #[test]
    fn two_of_draws_distinct_indices_over_the_whole_range() {
        let mut seen = [[false; 4]; 4];
        for a in 0..40 {
            for b in 0..40 {
                let (i, j) = two_of(4, f64::from(a) / 40.0, f64::from(b) / 40.0);
                assert!(i < 4 && j < 4 && i != j);
                seen[i][j] = true;
            }
        }
        for (i, row) in seen.iter().enumerate() {
            for (j, s) in row.iter().enumerate() {
                assert_eq!(*s, i != j, "pair ({i}, {j})");
            }
        }
        assert_eq!(two_of(2, 0.99, 0.99), (1, 0));
    }
}
