//! The circuit breaker (docs/reference/breaker.md#circuit-breaker).
//!
//! Owns [`Breaker`]: its typed states ([`State`]), the trip rules
//! (consecutive failures; failure share over a window with `min_samples`), the
//! open interval (doubling per consecutive open, ± jitter, capped) and the
//! half-open probe slots. It must not read a clock, sleep, log or draw from a
//! global RNG: `now` and a [`Random`] are passed in, and transitions are
//! *returned* so the data plane logs and counts them.

use super::random::Random;
use super::{Now, PolicyErrors, Scope};
use std::collections::VecDeque;
use std::time::Duration;

/// Validated breaker parameters for one upstream.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BreakerParams {
    /// `false` turns the breaker off: it always admits.
    pub enabled: bool,
    /// Trip after this many failures in a row.
    pub consecutive_failures: u32,
    /// How many recent outcomes the failure share is computed over.
    pub window: u32,
    /// The fewest outcomes in the window before the share may trip it.
    pub min_samples: u32,
    /// Trip when the failure share in the window is at least this.
    pub failure_rate: f64,
    /// Response statuses that count as failures.
    pub failure_statuses: Vec<u16>,
    /// gRPC codes that count as failures (a gRPC answer's outcome is its
    /// `grpc-status`, not its HTTP 200). Set with
    /// [`BreakerParams::with_grpc_failures`].
    pub failure_grpc: Vec<u8>,
    /// The first open interval.
    pub open: Duration,
    /// The longest open interval, jitter included.
    pub max_open: Duration,
    /// ± this fraction of jitter on every open interval.
    pub open_jitter: f64,
    /// Probes admitted at a time while half-open; all must succeed to close.
    pub half_open_probes: u32,
    /// Whether trips and the half-open probe are shared with the fleet
    /// (`breaker.scope`, default [`Scope::Fleet`]; it matters only with a
    /// shared `[state]` backend). Set with [`BreakerParams::with_scope`].
    pub scope: Scope,
    /// A trip rule opens it only once no attempt has succeeded for this
    /// long (docs/reference/breaker.md#trip-rules): the hard-down detector's
    /// guard against random failure at high rates. Zero unless set with
    /// [`BreakerParams::with_failing_for`] (the config's default is 1 s).
    pub failing_for: std::time::Duration,
}

impl BreakerParams {
    /// Whether a response with this status is a failure for the breaker.
    pub fn is_failure_status(&self, status: u16) -> bool {
        self.failure_statuses.contains(&status)
    }

    /// Whether an answer with this gRPC status is a failure for the breaker.
    pub fn is_failure_grpc(&self, code: u8) -> bool {
        self.failure_grpc.contains(&code)
    }

    /// The same parameters with these gRPC codes counted as failures.
    pub fn with_grpc_failures(mut self, codes: Vec<u8>) -> Self {
        self.failure_grpc = codes;
        self
    }

    /// The same parameters with `failing_for`.
    pub fn with_failing_for(mut self, failing_for: Duration) -> Self {
        self.failing_for = failing_for;
        self
    }

    /// The same parameters with `scope`.
    pub fn with_scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Validates breaker parameters (see each field).
    #[allow(clippy::too_many_arguments)] // one argument per config field, validated together
    pub fn try_new(
        enabled: bool,
        consecutive_failures: u32,
        window: u32,
        min_samples: u32,
        failure_rate: f64,
        failure_statuses: Vec<u16>,
        open: Duration,
        max_open: Duration,
        open_jitter: f64,
        half_open_probes: u32,
    ) -> Result<Self, PolicyErrors> {
        let mut e = PolicyErrors::default();
        e.check(consecutive_failures != 0, "consecutive_failures", || {
            "must be at least 1".into()
        });
        e.check((1..=10_000).contains(&window), "window", || {
            format!("must be between 1 and 10000, got {window}")
        });
        // Judged against a valid window only: a bad window has its own error.
        let window_ok = (1..=10_000).contains(&window);
        e.check(
            min_samples != 0 && (!window_ok || min_samples <= window),
            "min_samples",
            || format!("must be between 1 and window ({window}), got {min_samples}"),
        );
        e.check(
            failure_rate > 0.0 && failure_rate <= 1.0,
            "failure_rate",
            || format!("must be in (0, 1], got {failure_rate}"),
        );
        if let Some(s) = failure_statuses.iter().find(|s| !(100..=599).contains(*s)) {
            e.check(false, "failure_statuses", || {
                format!("{s} is not an HTTP status code (100–599)")
            });
        }
        e.check(!open.is_zero(), "open", || "must be greater than 0".into());
        e.check(max_open >= open, "max_open", || {
            format!("must be ≥ open ({open:?}), got {max_open:?}")
        });
        e.check((0.0..1.0).contains(&open_jitter), "open_jitter", || {
            format!("must be in [0, 1), got {open_jitter}")
        });
        e.check(half_open_probes != 0, "half_open_probes", || {
            "must be at least 1".into()
        });
        e.or_ok(|| BreakerParams {
            enabled,
            consecutive_failures,
            window,
            min_samples,
            failure_rate,
            failure_statuses,
            failure_grpc: Vec::new(),
            open,
            max_open,
            open_jitter,
            half_open_probes,
            scope: Scope::Fleet,
            failing_for: Duration::ZERO,
        })
    }
}

/// The breaker's state, as a type per state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Everything is admitted; outcomes are counted.
    Closed,
    /// Nothing is admitted until `until`.
    Open {
        /// When it turns half-open.
        until: Now,
    },
    /// Up to `half_open_probes` probes at a time.
    HalfOpen {
        /// Probes admitted and not yet recorded or released.
        in_flight: u32,
        /// Probes that succeeded since it turned half-open.
        succeeded: u32,
    },
}

/// The state's name, for logs and the `weir_breaker_state` gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// Admitting.
    Closed,
    /// Refusing.
    Open,
    /// Admitting probes.
    HalfOpen,
}

impl StateKind {
    /// `closed`, `open` or `half_open`: the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Closed => "closed",
            StateKind::Open => "open",
            StateKind::HalfOpen => "half_open",
        }
    }

    /// All kinds, to zero the gauges of the states it is not in.
    pub const ALL: [StateKind; 3] = [StateKind::Closed, StateKind::Open, StateKind::HalfOpen];
}

/// A state change, to be logged at `info` and counted by the data plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state left.
    pub from: StateKind,
    /// The state entered.
    pub to: StateKind,
    /// When `to` is `Open`: for how long.
    pub open_for: Option<Duration>,
}

/// Permission to make one attempt. Hand it back to [`Breaker::record`] with
/// the outcome, or to [`Breaker::release`] when the client went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an admission must be recorded or released, or a half-open probe slot leaks"]
pub struct Admission {
    /// Whether this attempt is a half-open probe.
    pub probe: bool,
    /// The transition taking this admission caused (open → half-open), if any.
    pub transition: Option<Transition>,
    /// The breaker epoch it belongs to; a verdict from an earlier epoch (an
    /// attempt admitted before the last transition) is ignored.
    epoch: u64,
}

/// The breaker refused: answer `503 circuit_open` with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// Time until it may admit again: until half-open while open; one second
    /// while half-open with every probe slot taken (a probe's verdict is
    /// usually known by then, and `Retry-After: 0` would invite a stampede).
    pub retry_after: Duration,
}

/// What the breaker looks like now, for metrics and `/config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateView {
    /// The current state (an open breaker whose interval has passed reads as
    /// half-open).
    pub state: StateKind,
    /// While open: time until it turns half-open.
    pub until_admit: Option<Duration>,
}

/// One upstream's circuit breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    params: BreakerParams,
    state: State,
    /// Recent outcomes in the closed state (`true` = failure), at most `window`.
    window: VecDeque<bool>,
    window_failures: u32,
    consecutive: u32,
    /// When the current run of failures began (no success since).
    failing_since: Option<Now>,
    /// Opens since it was last closed by successful probes.
    opens: u32,
    epoch: u64,
    /// The fleet owns the half-open probe (docs/reference/fleet.md#fleet-state):
    /// past its open interval the breaker stays open until
    /// [`Breaker::grant_probe`] (this instance won the probe), or until
    /// the fleet's verdict is adopted.
    fleet_probe: bool,
    /// The probe of this open interval is this instance's to send.
    probe_granted: bool,
    /// Half-open probes admitted since it was made (for `weir chaos`'s
    /// breaker trace: what went out while it was half-open).
    probes: u64,
}

impl Breaker {
    /// A closed breaker with no history.
    pub fn new(params: BreakerParams) -> Self {
        Breaker {
            window: VecDeque::with_capacity(params.window as usize),
            params,
            state: State::Closed,
            window_failures: 0,
            consecutive: 0,
            failing_since: None,
            opens: 0,
            epoch: 0,
            fleet_probe: false,
            probe_granted: false,
            probes: 0,
        }
    }

    /// Whether the half-open probe waits for the fleet's grant (set while
    /// the shared state is up; off, the breaker probes on its own).
    pub fn set_fleet_probe(&mut self, on: bool) {
        self.fleet_probe = on;
    }

    /// This instance owns the probe of the current open interval: once the
    /// interval is over, the next request turns it half-open.
    pub fn grant_probe(&mut self) {
        self.probe_granted = true;
    }

    /// Half-open probes admitted so far.
    pub fn probes(&self) -> u64 {
        self.probes
    }

    /// Whether it is open past its interval, waiting for the fleet's probe.
    pub fn awaits_probe(&self, now: Now) -> bool {
        matches!(self.state, State::Open { until } if now >= until)
            && self.fleet_probe
            && !self.probe_granted
    }

    /// The parameters in force.
    pub fn params(&self) -> &BreakerParams {
        &self.params
    }

    /// The raw state (an expired `Open` stays `Open` until the next
    /// [`Breaker::try_acquire`]; use [`Breaker::state`] for a view).
    pub fn raw_state(&self) -> State {
        self.state
    }

    /// Updates the parameters in place (config reload): the state and history
    /// survive; a shorter window drops its oldest outcomes.
    pub fn set_params(&mut self, params: BreakerParams) {
        self.params = params;
        while self.window.len() > self.params.window as usize {
            if self.window.pop_front() == Some(true) {
                self.window_failures -= 1;
            }
        }
    }

    /// Whether a response with this status is a failure for the breaker.
    pub fn is_failure_status(&self, status: u16) -> bool {
        self.params.is_failure_status(status)
    }

    /// Asks to make one attempt at `now`.
    pub fn try_acquire(&mut self, now: Now) -> Result<Admission, Refused> {
        let mut transition = None;
        if !self.params.enabled {
            return Ok(self.admission(false, None));
        }
        if let State::Open { until } = self.state {
            if now < until {
                return Err(Refused {
                    retry_after: until - now,
                });
            }
            if self.awaits_probe(now) {
                return Err(Refused {
                    retry_after: Duration::from_secs(1),
                });
            }
            transition = Some(self.enter(
                State::HalfOpen {
                    in_flight: 0,
                    succeeded: 0,
                },
                None,
            ));
        }
        match &mut self.state {
            State::Closed => Ok(self.admission(false, transition)),
            State::HalfOpen { in_flight, .. } => {
                if *in_flight < self.params.half_open_probes {
                    *in_flight += 1;
                    self.probes += 1;
                    Ok(self.admission(true, transition))
                } else {
                    Err(Refused {
                        retry_after: Duration::from_secs(1),
                    })
                }
            }
            State::Open { .. } => Err(Refused {
                retry_after: Duration::ZERO,
            }),
        }
    }

    fn admission(&self, probe: bool, transition: Option<Transition>) -> Admission {
        Admission {
            probe,
            transition,
            epoch: self.epoch,
        }
    }

    /// Records the verdict of an admitted attempt (`failure` per docs/reference/breaker.md#what-counts-as-a-failure:
    /// connect failure, reset, timeout or a status in `failure_statuses`).
    /// Returns the transition it caused, if any.
    pub fn record(
        &mut self,
        admission: Admission,
        failure: bool,
        now: Now,
        rng: &mut dyn Random,
    ) -> Option<Transition> {
        if !self.params.enabled || admission.epoch != self.epoch {
            return None;
        }
        match self.state {
            State::Closed => {
                self.push(failure, now);
                if self.should_trip(now) {
                    Some(self.trip(now, rng))
                } else {
                    None
                }
            }
            State::HalfOpen {
                in_flight,
                succeeded,
            } if admission.probe => {
                if failure {
                    return Some(self.trip(now, rng));
                }
                let succeeded = succeeded + 1;
                if succeeded >= self.params.half_open_probes {
                    self.opens = 0;
                    self.clear_history();
                    Some(self.enter(State::Closed, None))
                } else {
                    self.state = State::HalfOpen {
                        in_flight: in_flight.saturating_sub(1),
                        succeeded,
                    };
                    None
                }
            }
            _ => None,
        }
    }

    /// The client went away: frees a probe slot without a verdict. A
    /// non-probe admission needs no release, but releasing it is harmless.
    pub fn release(&mut self, admission: Admission) {
        if !admission.probe || admission.epoch != self.epoch {
            return;
        }
        if let State::HalfOpen { in_flight, .. } = &mut self.state {
            *in_flight = in_flight.saturating_sub(1);
        }
    }

    /// The state at `now`, for the `weir_breaker_state` gauge.
    pub fn state(&self, now: Now) -> StateView {
        if !self.params.enabled {
            return StateView {
                state: StateKind::Closed,
                until_admit: None,
            };
        }
        match self.state {
            State::Closed => StateView {
                state: StateKind::Closed,
                until_admit: None,
            },
            State::Open { until } if now < until => StateView {
                state: StateKind::Open,
                until_admit: Some(until - now),
            },
            State::Open { .. } if self.awaits_probe(now) => StateView {
                state: StateKind::Open,
                until_admit: None,
            },
            State::Open { .. } | State::HalfOpen { .. } => StateView {
                state: StateKind::HalfOpen,
                until_admit: None,
            },
        }
    }

    fn push(&mut self, failure: bool, now: Now) {
        if self.window.len() >= self.params.window as usize && self.window.pop_front() == Some(true)
        {
            self.window_failures -= 1;
        }
        self.window.push_back(failure);
        if failure {
            self.window_failures += 1;
            self.consecutive += 1;
            self.failing_since.get_or_insert(now);
        } else {
            self.consecutive = 0;
            self.failing_since = None;
        }
    }

    fn should_trip(&self, now: Now) -> bool {
        // Failing for long enough: random failure at any rate has a
        // success within a second; an upstream that is down has none.
        let long_enough = self
            .failing_since
            .is_some_and(|t| now.saturating_sub(t) >= self.params.failing_for);
        if !long_enough {
            return false;
        }
        if self.consecutive >= self.params.consecutive_failures {
            return true;
        }
        let n = self.window.len() as u32;
        n >= self.params.min_samples
            && f64::from(self.window_failures) >= self.params.failure_rate * f64::from(n)
    }

    fn clear_history(&mut self) {
        self.window.clear();
        self.window_failures = 0;
        self.consecutive = 0;
        self.failing_since = None;
    }

    /// The fleet published a trip with `remaining` to run at `now`
    /// (docs/reference/fleet.md#fleet-state): open until then, as if this breaker
    /// had tripped (its next own opening doubles from it), unless it is
    /// already open at least that long — an open interval is only extended.
    /// A half-open breaker re-opens (its probes' verdicts are then ignored).
    /// Returns the transition, if it was not open already.
    pub fn adopt_open(&mut self, remaining: Duration, now: Now) -> Option<Transition> {
        if !self.params.enabled || remaining.is_zero() {
            return None;
        }
        let until = now.saturating_add(remaining);
        match self.state {
            State::Open { until: u } if u >= until => None,
            State::Open { .. } if self.state(now).state == StateKind::Open => {
                self.state = State::Open { until };
                None
            }
            _ => {
                self.opens = self.opens.saturating_add(1);
                self.clear_history();
                Some(self.enter(State::Open { until }, Some(remaining)))
            }
        }
    }

    /// Another instance's probe succeeded: a breaker waiting to probe
    /// (half-open, or open past its interval) closes as its own probes would
    /// close it. One still inside its own open interval stays open.
    pub fn adopt_closed(&mut self, now: Now) -> Option<Transition> {
        let waiting = match self.state {
            State::Open { until } => now >= until,
            State::HalfOpen { .. } => true,
            State::Closed => false,
        };
        if !self.params.enabled || !waiting {
            return None;
        }
        self.opens = 0;
        self.clear_history();
        Some(self.enter(State::Closed, None))
    }

    /// Opens it for `open × 2^(opens−1)`, capped at `max_open`, ± jitter, and
    /// never longer than `max_open`.
    fn trip(&mut self, now: Now, rng: &mut dyn Random) -> Transition {
        self.opens = self.opens.saturating_add(1);
        let interval = self.open_interval(rng.next_f64());
        self.clear_history();
        self.enter(
            State::Open {
                until: now.saturating_add(interval),
            },
            Some(interval),
        )
    }

    /// The open interval for the current `opens` count with draw `r ∈ [0, 1)`.
    pub fn open_interval(&self, r: f64) -> Duration {
        let p = &self.params;
        let doublings = i32::try_from(self.opens.max(1) - 1).unwrap_or(i32::MAX);
        let base = p.open.as_secs_f64() * 2f64.powi(doublings);
        let max = p.max_open.as_secs_f64();
        let capped = base.min(max);
        let r = if r.is_nan() { 0.5 } else { r.clamp(0.0, 1.0) };
        let jittered = capped * (1.0 + p.open_jitter * (2.0 * r - 1.0));
        Duration::from_secs_f64(jittered.clamp(0.0, max))
    }

    fn enter(&mut self, to: State, open_for: Option<Duration>) -> Transition {
        let from = kind(self.state);
        self.state = to;
        self.epoch = self.epoch.wrapping_add(1);
        // Every interval has a probe of its own to win.
        self.probe_granted = false;
        Transition {
            from,
            to: kind(to),
            open_for,
        }
    }
}

fn kind(s: State) -> StateKind {
    match s {
        State::Closed => StateKind::Closed,
        State::Open { .. } => StateKind::Open,
        State::HalfOpen { .. } => StateKind::HalfOpen,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::random::FixedRandom;

    fn params() -> BreakerParams {
        BreakerParams::try_new(
            true,
            5,
            20,
            5,
            0.5,
            vec![500, 502, 503, 504],
            Duration::from_secs(30),
            Duration::from_secs(300),
            0.2,
            1,
        )
        .unwrap()
    }

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    /// Records `n` outcomes through admissions at `now`; returns the last transition.
    fn run(b: &mut Breaker, n: usize, failure: bool, now: Now) -> Option<Transition> {
        let mut last = None;
        for _ in 0..n {
            let a = b.try_acquire(now).unwrap();
            if let Some(t) = b.record(a, failure, now, &mut FixedRandom(0.5)) {
                last = Some(t);
            }
        }
        last
    }

    /// Trips a fresh-params breaker by consecutive failures at `now`.
    fn trip(b: &mut Breaker, now: Now) -> Transition {
        run(b, 5, true, now).unwrap()
    }

    #[test]
    fn a_published_trip_is_adopted_and_only_ever_extends() {
        let mut b = Breaker::new(params());
        let t = b.adopt_open(s(10), s(100)).unwrap();
        assert_eq!(
            (t.from, t.to, t.open_for),
            (StateKind::Closed, StateKind::Open, Some(s(10)))
        );
        assert_eq!(b.raw_state(), State::Open { until: s(110) });
        // Read again at the next refresh: nothing changes; a longer one extends.
        assert_eq!(b.adopt_open(s(9), s(101)), None);
        assert_eq!(b.raw_state(), State::Open { until: s(110) });
        assert_eq!(b.adopt_open(s(20), s(101)), None);
        assert_eq!(b.raw_state(), State::Open { until: s(121) });
        assert!(b.try_acquire(s(120)).is_err());
        // Past it: half-open, and a probe here that fails doubles from it.
        let probe = b.try_acquire(s(121)).unwrap();
        assert!(probe.probe);
        let t = b
            .record(probe, true, s(122), &mut FixedRandom(0.5))
            .unwrap();
        assert_eq!(t.open_for, Some(s(60)), "second opening: 2 × open");
    }

    #[test]
    fn a_half_open_breaker_reopens_or_closes_with_the_fleet() {
        let mut b = Breaker::new(params());
        trip(&mut b, s(0));
        let probe = b.try_acquire(s(40)).unwrap();
        // Another instance's trip: open again; the probe's verdict is moot.
        let t = b.adopt_open(s(5), s(41)).unwrap();
        assert_eq!((t.from, t.to), (StateKind::HalfOpen, StateKind::Open));
        assert_eq!(b.record(probe, false, s(42), &mut FixedRandom(0.5)), None);
        // Inside its interval it stays open whatever the fleet says.
        assert_eq!(b.adopt_closed(s(44)), None);
        assert_eq!(b.state(s(44)).state, StateKind::Open);
        // Waiting to probe, another instance's success closes it.
        let t = b.adopt_closed(s(46)).unwrap();
        assert_eq!((t.from, t.to), (StateKind::Open, StateKind::Closed));
        assert_eq!(b.adopt_closed(s(47)), None);
        // Closed: the next opening starts from `open` again.
        assert_eq!(trip(&mut b, s(50)).open_for, Some(s(30)));
        let mut off = params();
        off.enabled = false;
        assert_eq!(Breaker::new(off).adopt_open(s(5), s(0)), None);
    }

    #[test]
    fn consecutive_failures_trip() {
        let mut p = params();
        p.min_samples = 20; // keep the rate rule out of it
        p.window = 20;
        let mut b = Breaker::new(p);
        assert_eq!(run(&mut b, 4, true, s(0)), None);
        assert_eq!(b.state(s(0)).state, StateKind::Closed);
        let t = run(&mut b, 1, true, s(0)).unwrap();
        assert_eq!((t.from, t.to), (StateKind::Closed, StateKind::Open));
        assert_eq!(t.open_for, Some(s(30)));
        assert_eq!(b.try_acquire(s(10)), Err(Refused { retry_after: s(20) }));
        assert_eq!(b.state(s(10)).until_admit, Some(s(20)));
    }

    #[test]
    fn success_resets_the_consecutive_count() {
        let mut p = params();
        p.min_samples = 20;
        let mut b = Breaker::new(p);
        for _ in 0..3 {
            run(&mut b, 4, true, s(0));
            run(&mut b, 1, false, s(0));
        }
        assert_eq!(b.state(s(0)).state, StateKind::Closed);
    }

    #[test]
    fn failure_rate_trips_with_min_samples() {
        let mut p = params();
        p.consecutive_failures = 100;
        let mut b = Breaker::new(p);
        // 2 failures of 4: 50 %, but below min_samples
        run(&mut b, 2, false, s(0));
        run(&mut b, 2, true, s(0));
        assert_eq!(b.state(s(0)).state, StateKind::Closed);
        // the 5th sample, a success: 2/5 = 40 %, stays closed
        run(&mut b, 1, false, s(0));
        assert_eq!(b.state(s(0)).state, StateKind::Closed);
        // a failure: 3/6 = 50 % → open
        let t = run(&mut b, 1, true, s(0)).unwrap();
        assert_eq!(t.to, StateKind::Open);
    }

    #[test]
    fn window_forgets_old_outcomes() {
        let mut p = params();
        p.consecutive_failures = 100;
        p.window = 10;
        let mut b = Breaker::new(p);
        run(&mut b, 30, false, s(0));
        // the old successes fall out of the window: 5 failures are 50 % of it
        assert_eq!(run(&mut b, 4, true, s(0)), None);
        assert_eq!(
            run(&mut b, 1, true, s(0)).map(|t| t.to),
            Some(StateKind::Open)
        );
    }

    #[test]
    fn half_open_probe_success_closes_and_resets() {
        let mut b = Breaker::new(params());
        trip(&mut b, s(0));
        let a = b.try_acquire(s(30)).unwrap();
        assert!(a.probe);
        assert_eq!(a.transition.map(|t| t.to), Some(StateKind::HalfOpen));
        // exactly one probe at a time
        assert_eq!(b.try_acquire(s(30)), Err(Refused { retry_after: s(1) }));
        let t = b.record(a, false, s(31), &mut FixedRandom(0.5)).unwrap();
        assert_eq!((t.from, t.to), (StateKind::HalfOpen, StateKind::Closed));
        // history cleared: 4 failures do not trip it
        assert_eq!(run(&mut b, 4, true, s(32)), None);
        // interval reset: the next trip opens for `open` again
        assert_eq!(run(&mut b, 1, true, s(32)).unwrap().open_for, Some(s(30)));
    }

    #[test]
    fn probe_failure_reopens_with_doubled_interval_up_to_cap() {
        let mut b = Breaker::new(params());
        let mut now = s(0);
        let t = trip(&mut b, now);
        let mut expected = 30;
        assert_eq!(t.open_for, Some(s(expected)));
        for _ in 0..6 {
            now += b.state(now).until_admit.unwrap();
            let a = b.try_acquire(now).unwrap();
            assert!(a.probe);
            let t = b.record(a, true, now, &mut FixedRandom(0.5)).unwrap();
            assert_eq!((t.from, t.to), (StateKind::HalfOpen, StateKind::Open));
            expected = (expected * 2).min(300);
            assert_eq!(t.open_for, Some(s(expected)));
        }
        assert_eq!(expected, 300);
    }

    #[test]
    fn jitter_bounds_with_fixed_draws() {
        let mut b = Breaker::new(params());
        let a = b.try_acquire(s(0)).unwrap();
        for _ in 0..4 {
            let _ = b.record(a, true, s(0), &mut FixedRandom(0.0));
        }
        let lo = b.record(a, true, s(0), &mut FixedRandom(0.0)).unwrap();
        assert_eq!(lo.open_for, Some(s(24))); // 30 s − 20 %
        let mut b = Breaker::new(params());
        let a = b.try_acquire(s(0)).unwrap();
        for _ in 0..4 {
            let _ = b.record(a, true, s(0), &mut FixedRandom(0.5));
        }
        let hi = b.record(a, true, s(0), &mut FixedRandom(1.0)).unwrap();
        assert_eq!(hi.open_for, Some(s(36))); // 30 s + 20 %
                                              // at the cap, jitter never goes above max_open
        b.opens = 10;
        assert_eq!(b.open_interval(1.0), s(300));
        assert_eq!(b.open_interval(0.0), s(240));
    }

    #[test]
    fn probe_released_without_verdict_frees_its_slot() {
        let mut b = Breaker::new(params());
        trip(&mut b, s(0));
        let a = b.try_acquire(s(40)).unwrap();
        assert!(b.try_acquire(s(40)).is_err());
        b.release(a);
        assert_eq!(b.state(s(40)).state, StateKind::HalfOpen);
        let again = b.try_acquire(s(40)).unwrap();
        assert!(again.probe);
        // the released admission's late verdict is not a probe result twice
        assert_eq!(
            b.record(again, false, s(41), &mut FixedRandom(0.5))
                .map(|t| t.to),
            Some(StateKind::Closed)
        );
    }

    #[test]
    fn several_probes_all_must_succeed() {
        let mut p = params();
        p.half_open_probes = 2;
        let mut b = Breaker::new(p);
        trip(&mut b, s(0));
        let a1 = b.try_acquire(s(30)).unwrap();
        let a2 = b.try_acquire(s(30)).unwrap();
        assert!(b.try_acquire(s(30)).is_err());
        assert_eq!(b.record(a1, false, s(30), &mut FixedRandom(0.5)), None);
        let t = b.record(a2, true, s(30), &mut FixedRandom(0.5)).unwrap();
        assert_eq!(t.to, StateKind::Open);
        assert_eq!(t.open_for, Some(s(60)));
    }

    #[test]
    fn stale_verdicts_are_ignored() {
        let mut b = Breaker::new(params());
        let early = b.try_acquire(s(0)).unwrap();
        trip(&mut b, s(0));
        // an attempt admitted before the trip finishes while open: no effect
        assert_eq!(b.record(early, false, s(1), &mut FixedRandom(0.5)), None);
        assert_eq!(b.state(s(1)).state, StateKind::Open);
    }

    #[test]
    fn disabled_always_admits() {
        let mut p = params();
        p.enabled = false;
        let mut b = Breaker::new(p);
        assert_eq!(run(&mut b, 100, true, s(0)), None);
        assert!(b.try_acquire(s(0)).is_ok());
        assert_eq!(b.state(s(0)).state, StateKind::Closed);
    }

    #[test]
    fn clock_stepping_back_does_not_admit_early() {
        let mut b = Breaker::new(params());
        trip(&mut b, s(100));
        assert!(b.try_acquire(s(50)).is_err());
        assert!(b.try_acquire(s(129)).is_err());
        assert!(b.try_acquire(s(130)).is_ok());
    }

    #[test]
    fn failure_statuses() {
        let b = Breaker::new(params());
        assert!(b.is_failure_status(503));
        assert!(!b.is_failure_status(429));
        assert!(!b.is_failure_status(404));
    }

    /// With the fleet owning the probe, an open breaker stays open past its
    /// interval until it is granted the probe or adopts the fleet's verdict.
    #[test]
    fn a_fleet_probe_waits_for_its_grant() {
        let mut b = Breaker::new(params());
        b.set_fleet_probe(true);
        let mut rng = FixedRandom(0.5);
        let t0 = Duration::ZERO;
        while b.raw_state() == State::Closed {
            let a = b.try_acquire(t0).unwrap();
            let _ = b.record(a, true, t0, &mut rng);
        }
        let State::Open { until } = b.raw_state() else {
            panic!("not open")
        };
        assert!(!b.awaits_probe(t0));
        assert_eq!(
            b.try_acquire(until).unwrap_err().retry_after,
            Duration::from_secs(1)
        );
        assert!(b.awaits_probe(until));
        assert_eq!(b.state(until).state, StateKind::Open);
        b.grant_probe();
        let a = b.try_acquire(until).unwrap();
        assert!(a.probe);
        // It fails: open again, and the next interval needs a grant anew.
        let t = b.record(a, true, until, &mut rng).unwrap();
        assert_eq!(t.to, StateKind::Open);
        let State::Open { until } = b.raw_state() else {
            panic!("not open")
        };
        assert!(b.try_acquire(until).is_err());
        // The fleet's probe succeeded elsewhere: it closes without probing.
        assert_eq!(b.adopt_closed(until).unwrap().to, StateKind::Closed);
        assert!(b.try_acquire(until).is_ok());
    }
}
