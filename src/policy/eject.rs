//! Passive outlier ejection (docs/reference/endpoints.md#ejection): each endpoint's
//! own breaker. Pure: time and the random draw are arguments; the caller
//! (`upstream::Endpoints`) holds the siblings and the cap on how many may
//! be ejected at once.

use crate::policy::Now;
use std::time::Duration;

/// How many recent outcomes an endpoint's failure share is computed over.
pub const WINDOW: u32 = 64;

/// ± this fraction of jitter on every ejection time, so that replicas
/// ejected together do not all come back in the same instant.
pub const JITTER: f64 = 0.2;

/// Validated ejection parameters (`[upstreams.NAME.ejection]`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EjectParams {
    /// Eject after this many failures in a row.
    pub consecutive_failures: u32,
    /// Eject when the endpoint's failure share over its last [`WINDOW`]
    /// outcomes stands at least this far above the mean of its siblings'.
    pub failure_share_above: f64,
    /// The fewest outcomes in the window before the share may eject.
    pub min_samples: u32,
    /// The first ejection's length; each repeat doubles it.
    pub base: Duration,
    /// The longest ejection.
    pub max: Duration,
    /// The largest share of an upstream's endpoints ejected at once.
    pub max_ejected: f64,
}

/// Why an endpoint was ejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// `consecutive_failures` in a row.
    Consecutive,
    /// A failure share well above its siblings'.
    FailureShare,
    /// The probe after an ejection failed.
    ProbeFailed,
}

impl Why {
    /// The label and status-page word.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Consecutive => "consecutive_failures",
            Why::FailureShare => "failure_share",
            Why::ProbeFailed => "probe_failed",
        }
    }
}

/// Where an endpoint stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Takes requests.
    Active,
    /// Takes none until `until`.
    Ejected {
        /// When its probe may go.
        until: Now,
    },
    /// Its ejection is over: the next request to it is the probe, and no
    /// other goes to it until the probe's verdict.
    Probation {
        /// The probe is out.
        probe_out: bool,
    },
}

/// What the balancer may do with an endpoint now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// An ordinary request.
    Open,
    /// One request, as its probe.
    Probe,
    /// None.
    Closed,
}

/// What a recorded outcome asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EjectAction {
    /// Nothing.
    Keep,
    /// Eject for this reason, if the cap allows (the share rule also needs
    /// the siblings' shares: [`Health::share`]).
    Eject(Why),
    /// The probe succeeded: it serves again.
    Restored,
}

/// One endpoint's outcomes and ejection state.
#[derive(Debug, Clone)]
pub struct Health {
    status: Status,
    consecutive: u32,
    /// The last `len` outcomes, newest in bit 0 (`1` = failure).
    ring: u64,
    len: u32,
    /// Ejections in a row (each one longer), forgiven after `max` of health.
    ejections: u32,
    /// When it last came back from an ejection.
    back_at: Option<Now>,
    /// Why it was last ejected.
    why: Option<Why>,
}

impl Default for Health {
    fn default() -> Self {
        Health::new()
    }
}

impl Health {
    /// A healthy endpoint with no history.
    pub fn new() -> Self {
        Health {
            status: Status::Active,
            consecutive: 0,
            ring: 0,
            len: 0,
            ejections: 0,
            back_at: None,
            why: None,
        }
    }

    /// Its status (an ejection whose time is over reads as probation).
    pub fn status(&self, now: Now) -> Status {
        match self.status {
            Status::Ejected { until } if now >= until => Status::Probation { probe_out: false },
            s => s,
        }
    }

    /// Whether it counts against the cap on ejected endpoints.
    pub fn is_out(&self) -> bool {
        !matches!(self.status, Status::Active)
    }

    /// Why it was last ejected.
    pub fn why(&self) -> Option<Why> {
        self.why
    }

    /// What the balancer may send it at `now`.
    pub fn availability(&self, now: Now) -> Availability {
        match self.status(now) {
            Status::Active => Availability::Open,
            Status::Probation { probe_out: false } => Availability::Probe,
            Status::Probation { probe_out: true } | Status::Ejected { .. } => Availability::Closed,
        }
    }

    /// The balancer sends it its probe.
    pub fn take_probe(&mut self, now: Now) {
        if matches!(self.status(now), Status::Probation { .. }) {
            self.status = Status::Probation { probe_out: true };
        }
    }

    /// The probe went nowhere (the client left): another may go.
    pub fn release_probe(&mut self) {
        if let Status::Probation { probe_out: true } = self.status {
            self.status = Status::Probation { probe_out: false };
        }
    }

    /// Its failure share over the window, once it has `min` outcomes.
    pub fn share(&self, min: u32) -> Option<f64> {
        (self.len >= min.max(1)).then(|| f64::from(self.ring.count_ones()) / f64::from(self.len))
    }

    /// Records an attempt's outcome (`probe`: it was this endpoint's
    /// probe). An outcome of a request sent before an ejection, arriving
    /// while ejected, changes nothing.
    pub fn record(&mut self, failure: bool, probe: bool, p: &EjectParams, now: Now) -> EjectAction {
        match self.status {
            Status::Probation { .. } if probe => {
                if failure {
                    EjectAction::Eject(Why::ProbeFailed)
                } else {
                    self.status = Status::Active;
                    self.back_at = Some(now);
                    self.clear();
                    EjectAction::Restored
                }
            }
            Status::Active => {
                // The ring is `WINDOW` (64) bits wide: the oldest falls off.
                self.ring = (self.ring << 1) | u64::from(failure);
                self.len = (self.len + 1).min(WINDOW);
                if !failure {
                    self.consecutive = 0;
                    return EjectAction::Keep;
                }
                self.consecutive += 1;
                if self.consecutive >= p.consecutive_failures {
                    EjectAction::Eject(Why::Consecutive)
                } else if self
                    .share(p.min_samples)
                    .is_some_and(|s| s >= p.failure_share_above)
                {
                    EjectAction::Eject(Why::FailureShare)
                } else {
                    EjectAction::Keep
                }
            }
            _ => EjectAction::Keep,
        }
    }

    /// Ejects it at `now` (`draw` uniform in `[0, 1)` for the jitter);
    /// returns for how long.
    pub fn eject(&mut self, why: Why, p: &EjectParams, now: Now, draw: f64) -> Duration {
        if self.back_at.is_some_and(|b| now.saturating_sub(b) >= p.max) {
            // Healthy for a whole `max` since it came back: a new
            // ejection starts short again.
            self.ejections = 0;
        }
        self.ejections = self.ejections.saturating_add(1);
        let grown = p
            .base
            .saturating_mul(1u32 << (self.ejections - 1).min(20))
            .min(p.max);
        let jittered = grown.mul_f64((1.0 + JITTER * (2.0 * draw - 1.0)).max(0.0));
        let length = jittered.min(p.max);
        self.status = Status::Ejected {
            until: now + length,
        };
        self.why = Some(why);
        self.clear();
        length
    }

    /// Keeps it in (the cap refused an ejection): its streak starts over,
    /// so the next verdict needs new failures.
    pub fn spare(&mut self) {
        self.consecutive = 0;
        if matches!(self.status, Status::Probation { .. }) {
            self.status = Status::Active;
        }
    }

    fn clear(&mut self) {
        self.consecutive = 0;
        self.ring = 0;
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> EjectParams {
        EjectParams {
            consecutive_failures: 5,
            failure_share_above: 0.3,
            min_samples: 20,
            base: Duration::from_secs(5),
            max: Duration::from_secs(60),
            max_ejected: 0.5,
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn failures_in_a_row_eject_and_a_success_resets_the_streak() {
        let p = params();
        let mut h = Health::new();
        for _ in 0..4 {
            assert_eq!(h.record(true, false, &p, s(0)), EjectAction::Keep);
        }
        assert_eq!(h.record(false, false, &p, s(0)), EjectAction::Keep);
        for _ in 0..4 {
            assert_eq!(h.record(true, false, &p, s(0)), EjectAction::Keep);
        }
        assert_eq!(
            h.record(true, false, &p, s(0)),
            EjectAction::Eject(Why::Consecutive)
        );
    }

    #[test]
    fn the_share_rule_waits_for_min_samples() {
        let p = params();
        let mut h = Health::new();
        let mut verdicts = Vec::new();
        for i in 0..30 {
            verdicts.push(h.record(i % 2 == 0, false, &p, s(0)));
        }
        // Alternating: never 5 in a row; a share of 0.5 once 20 are in.
        let first = verdicts.iter().position(|v| *v != EjectAction::Keep);
        assert_eq!(first, Some(20));
        assert_eq!(verdicts[20], EjectAction::Eject(Why::FailureShare));
        assert_eq!(h.share(20), Some(0.5));
    }

    #[test]
    fn an_ejection_grows_on_repeat_is_jittered_and_capped() {
        let p = params();
        let mut h = Health::new();
        let mid = 0.5;
        assert_eq!(h.eject(Why::Consecutive, &p, s(0), mid), s(5));
        assert_eq!(h.availability(s(4)), Availability::Closed);
        assert_eq!(h.availability(s(5)), Availability::Probe);
        h.take_probe(s(5));
        assert_eq!(h.availability(s(5)), Availability::Closed);
        assert_eq!(
            h.record(true, true, &p, s(6)),
            EjectAction::Eject(Why::ProbeFailed)
        );
        assert_eq!(h.eject(Why::ProbeFailed, &p, s(6), mid), s(10));
        assert_eq!(h.eject(Why::ProbeFailed, &p, s(16), mid), s(20));
        assert_eq!(h.eject(Why::ProbeFailed, &p, s(36), mid), s(40));
        assert_eq!(h.eject(Why::ProbeFailed, &p, s(76), mid), s(60));
        // The jitter's ends, never above max.
        let low = h.eject(Why::ProbeFailed, &p, s(136), 0.0);
        assert_eq!(low, s(48));
        let high = h.eject(Why::ProbeFailed, &p, s(200), 0.999_999);
        assert_eq!(high, s(60));
        let mut fresh = Health::new();
        assert!(fresh.eject(Why::Consecutive, &p, s(0), 0.999_999) <= s(6));
        assert!(fresh.eject(Why::Consecutive, &p, s(0), 0.0) >= s(4));
    }

    #[test]
    fn a_good_probe_restores_and_a_long_health_forgives() {
        let p = params();
        let mut h = Health::new();
        h.eject(Why::Consecutive, &p, s(0), 0.5);
        h.eject(Why::ProbeFailed, &p, s(5), 0.5); // 10 s
        h.take_probe(s(15));
        assert_eq!(h.record(false, true, &p, s(15)), EjectAction::Restored);
        assert_eq!(h.availability(s(15)), Availability::Open);
        assert!(!h.is_out());
        // Soon again: longer (third in a row).
        let mut again = h.clone();
        assert_eq!(again.eject(Why::Consecutive, &p, s(20), 0.5), s(20));
        // After `max` of health: short again.
        assert_eq!(h.eject(Why::Consecutive, &p, s(15 + 60), 0.5), s(5));
    }

    #[test]
    fn a_released_probe_may_go_again_and_late_outcomes_change_nothing() {
        let p = params();
        let mut h = Health::new();
        h.eject(Why::Consecutive, &p, s(0), 0.5);
        assert_eq!(h.record(true, false, &p, s(1)), EjectAction::Keep);
        h.take_probe(s(5));
        h.release_probe();
        assert_eq!(h.availability(s(5)), Availability::Probe);
        // A non-probe outcome in probation is not the probe's verdict.
        assert_eq!(h.record(false, false, &p, s(5)), EjectAction::Keep);
        assert!(h.is_out());
    }
}
