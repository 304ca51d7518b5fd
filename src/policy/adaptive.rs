//! The adaptive concurrency limit (docs/reference/admission.md#adaptive-limit):
//! a gradient controller over the upstream's latency, in the manner of
//! Envoy's adaptive concurrency filter and Netflix's Gradient2.
//!
//! Owns [`AdaptiveParams`] and [`AdaptiveLimit`]. It must not read a clock,
//! sleep or hold requests: the data plane reports each attempt's latency
//! (`record`) and each refusal (`refused`) with `now`, and reads
//! [`AdaptiveLimit::limit`] when a request asks for a slot.
//!
//! How it moves: completions are gathered into windows (`window` long, at
//! least [`MIN_SAMPLES`] answers; only attempts begun since the limit last
//! moved count, so a window judges the limit in force). At each window's close its median
//! latency `m` is compared with the no-load latency `base` (the lowest
//! window median seen since `base` was last measured):
//!
//! ```text
//! gradient = clamp(base × (1 + tolerance) / m, 0.5, 2.0)
//! limit    = limit × gradient                      when gradient < 1
//!            (limit + limit × gradient) / 2        otherwise, within [min, max]
//! ```
//!
//! so the limit grows while latency stays within `tolerance` of its
//! no-load level and shrinks, at once, when the upstream starts queueing. Past an
//! upstream's capacity `N`, latency is `S × limit / N`, and the limit
//! settles where `limit = N × (1 + tolerance)`: the upstream stays busy,
//! its queue short. It grows only while in use (the window's peak in flight
//! reached half the limit), so a quiet spell does not leave it wide open.
//! Until a window's 90th percentile first rises above the tolerance (slow
//! start), it doubles ([`SLOW_START`]) a window while in use, and a window
//! lasts at least two no-load latencies, so that a queue shows before it
//! grows again.
//!
//! `base` goes stale: an upstream can get slower for good (a deploy), and
//! while the limit binds, every window sees some queueing. So every
//! `recheck` it is measured again: when nothing was refused since the last
//! measurement (slow start's refusals do not count) the lowest window
//! median of the period is taken as it is; otherwise a probe holds the limit at `min` until [`MIN_SAMPLES`]
//! attempts begun after the probe started have answered (or
//! [`PROBE_MAX`] passed), and their median is the new `base`. The first
//! `base` is the first window's fastest answer (the window began on an
//! idle upstream, but at the initial limit, which may already queue), and
//! it is rechecked after ten windows rather than a whole `recheck`.
//! The defaults were chosen with the simulation in `adaptive_sim.rs`.

use super::{Now, PolicyErrors};
use std::time::Duration;

/// Answers a window needs before it is judged (and a probe before it ends).
pub const MIN_SAMPLES: usize = 10;
/// Answers a window keeps; a window closes early when it holds this many.
const MAX_SAMPLES: usize = 512;
/// The longest a probe holds the limit at `min`.
pub const PROBE_MAX: Duration = Duration::from_secs(1);

/// Validated parameters of an adaptive limit.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AdaptiveParams {
    /// The fewest requests ever let in at once (≥ 1: never starves).
    pub min: u32,
    /// The most (the concurrency table's `max_in_flight`).
    pub max: u32,
    /// Where the limit starts.
    pub initial: u32,
    /// How far above its no-load level latency may rise before the limit
    /// shrinks, as a fraction (0.25 = 25 %).
    pub tolerance: f64,
    /// How long a window of answers is gathered before the limit moves.
    pub window: Duration,
    /// How often the no-load latency is measured again.
    pub recheck: Duration,
}

impl AdaptiveParams {
    /// Validates: `1 ≤ min ≤ initial ≤ max`, `0 < tolerance ≤ 10`, a
    /// `window` > 0, a `recheck` of at least ten windows.
    pub fn try_new(
        min: u32,
        max: u32,
        initial: u32,
        tolerance: f64,
        window: Duration,
        recheck: Duration,
    ) -> Result<Self, PolicyErrors> {
        let mut e = PolicyErrors::default();
        e.check(min >= 1, "min", || {
            "must be at least 1 (a limit of 0 would let nothing through)".into()
        });
        e.check(min <= max, "min", || {
            format!("must be at most max_in_flight ({max}), got {min}")
        });
        e.check(initial >= min && initial <= max, "initial", || {
            format!("must be between min ({min}) and max_in_flight ({max}), got {initial}")
        });
        e.check(
            tolerance.is_finite() && tolerance > 0.0 && tolerance <= 10.0,
            "tolerance",
            || format!("must be a number > 0 and ≤ 10, got {tolerance}"),
        );
        e.check(!window.is_zero(), "window", || {
            "must be greater than 0".into()
        });
        e.check(recheck >= window * 10, "recheck", || {
            "must be at least ten windows".into()
        });
        e.or_ok(|| AdaptiveParams {
            min,
            max,
            initial,
            tolerance,
            window,
            recheck,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// The limit follows the gradient.
    Follow,
    /// The limit is held at `min` while the no-load latency is measured;
    /// only attempts begun at or after `since` count.
    Probe { since: Now, samples: Vec<u64> },
}

/// One upstream's adaptive limit ([`AdaptiveParams`]); see the module
/// summary for how it moves.
#[derive(Debug, Clone)]
pub struct AdaptiveLimit {
    p: AdaptiveParams,
    limit: f64,
    phase: Phase,
    /// When the current window began (its first answer).
    opened: Option<Now>,
    /// This window's latencies, in microseconds.
    samples: Vec<u64>,
    /// The most requests in flight this window.
    peak: u32,
    /// The no-load latency, in microseconds.
    base: Option<u64>,
    /// When `base` is next measured again.
    check_at: Now,
    /// The lowest window median since `base` was last measured.
    period_min: Option<u64>,
    /// A request was refused since `base` was last measured.
    refused: bool,
    /// The last window's median (the latency estimate shown).
    last: Option<u64>,
    /// The latest `now` seen (a clock stepping back counts as this).
    seen: Now,
    /// No window has seen latency over the tolerance yet: the limit
    /// doubles ([`SLOW_START`]) a window while in use.
    starting: bool,
    /// When the limit last moved.
    moved: Now,
    /// When the latest answer came.
    answered: Now,
}

/// The default `initial_limit`: low, so that slow start floods no small
/// upstream (docs/reference/admission.md#the-defaults-and-why).
pub const DEFAULT_INITIAL: u32 = 4;

/// Growth a window during slow start: doubling, as TCP's slow start
/// doubles its window each round trip, from a low `initial_limit`.
pub const SLOW_START: f64 = 2.0;

impl AdaptiveLimit {
    pub fn new(p: AdaptiveParams) -> Self {
        AdaptiveLimit {
            limit: f64::from(p.initial),
            p,
            phase: Phase::Follow,
            opened: None,
            samples: Vec::new(),
            peak: 0,
            base: None,
            check_at: Duration::ZERO,
            period_min: None,
            refused: false,
            last: None,
            seen: Duration::ZERO,
            starting: true,
            moved: Duration::ZERO,
            answered: Duration::ZERO,
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> &AdaptiveParams {
        &self.p
    }

    /// Applies reloaded parameters, keeping what was learnt (the limit is
    /// brought within the new bounds).
    pub fn set_params(&mut self, p: AdaptiveParams) {
        self.limit = self.limit.clamp(f64::from(p.min), f64::from(p.max));
        self.p = p;
    }

    /// How many requests may be in flight now: always within `[min, max]`.
    pub fn limit(&self) -> u32 {
        match self.phase {
            Phase::Probe { .. } => self.p.min,
            Phase::Follow => (self.limit.round() as u32).clamp(self.p.min, self.p.max),
        }
    }

    /// The latest window's median latency (the estimate the limit follows).
    pub fn latency(&self) -> Option<Duration> {
        self.last.map(Duration::from_micros)
    }

    /// The no-load latency the limit compares with.
    pub fn baseline(&self) -> Option<Duration> {
        self.base.map(Duration::from_micros)
    }

    /// Whether a probe holds the limit at `min` now.
    pub fn probing(&self) -> bool {
        matches!(self.phase, Phase::Probe { .. })
    }

    /// A request was refused at `now` because the limit was reached.
    pub fn refused(&mut self, now: Now) {
        // During slow start latency has not yet risen: a refusal then is
        // the limit still growing to the upstream, and calls for no probe
        // (which would only refuse more).
        if !self.starting {
            self.refused = true;
        }
        let now = self.tick(now);
        // Refusing, yet no answer for a while: no samples is not bad
        // samples (every place may be held by a request that streams or
        // hangs, and only a timeout would tell). The limit grows back a
        // step, a quarter at least one place, each starved spell, so a
        // limit at its floor is never stuck there.
        // Only once an answer has shown what the upstream's latency is: at
        // the start, a wait for the first answers is no starvation.
        let Some(base) = self.baseline() else { return };
        let quiet = self.p.window.max(base * 4);
        if !self.probing() && now.saturating_sub(self.answered.max(self.moved)) >= quiet {
            let next = (self.limit * 1.25).max(self.limit + 1.0);
            self.limit = next.min(f64::from(self.p.max));
            self.moved = now;
            self.samples.clear();
            self.opened = None;
        }
    }

    /// An attempt begun at `started` answered (or timed out) after `took`,
    /// with `in_flight` requests holding a slot: it may close a window and
    /// move the limit.
    pub fn record(&mut self, started: Now, took: Duration, in_flight: u32, now: Now) {
        let now = self.tick(now);
        self.answered = now;
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        if let Phase::Probe { since, samples } = &mut self.phase {
            if started >= *since {
                samples.push(us);
            }
            self.end_probe(now);
            return;
        }
        self.peak = self.peak.max(in_flight);
        if started < self.moved {
            // Only what began at the latest limit says what it does.
            return;
        }
        let opened = *self.opened.get_or_insert(now);
        self.samples.push(us);
        let full = self.samples.len() >= MAX_SAMPLES;
        let mut long = self.p.window;
        if self.starting {
            // Long enough for what queues to show: two no-load latencies.
            long = long.max(self.baseline().unwrap_or_default() * 2);
        }
        let due = now.saturating_sub(opened) >= long && self.samples.len() >= MIN_SAMPLES;
        if full || due {
            self.close_window(now);
        }
    }

    /// The latest `now` seen; a probe that ran out of time ends here too.
    fn tick(&mut self, now: Now) -> Now {
        self.seen = self.seen.max(now);
        if self.probing() {
            self.end_probe(self.seen);
        }
        self.seen
    }

    fn close_window(&mut self, now: Now) {
        let m = median(&mut self.samples);
        let low = self.samples.iter().copied().min().unwrap_or(m);
        let high = {
            let i = (self.samples.len() * 9 / 10).min(self.samples.len().saturating_sub(1));
            self.samples.select_nth_unstable(i).1.to_owned()
        };
        self.samples.clear();
        self.opened = None;
        let peak = std::mem::take(&mut self.peak);
        self.last = Some(m);
        self.period_min = Some(self.period_min.map_or(m, |p| p.min(m)));
        let base = match self.base {
            Some(b) if b <= m => b,
            Some(_) => {
                self.base = Some(m);
                m
            }
            None => {
                // The first window began on an idle upstream, but at the
                // initial limit, which may already queue: its fastest
                // answer is the no-load latency, looked at again soon.
                self.check_at = now + self.p.window * 10;
                self.base = Some(low);
                low
            }
        };
        let mut gradient = (base as f64 * (1.0 + self.p.tolerance) / m as f64).clamp(0.5, 2.0);
        if f64::from(peak) * 2.0 < self.limit {
            // Not in use: no evidence that more would be served as well.
            gradient = gradient.min(1.0);
        }
        let target = self.limit * gradient;
        // Down at once, up by half the way: a queue is cut within a
        // window, and growth is checked before it goes on.
        if high as f64 > base as f64 * (1.0 + self.p.tolerance) {
            self.starting = false;
        }
        let next = if gradient < 1.0 {
            target
        } else if self.starting && f64::from(peak) * 2.0 >= self.limit {
            self.limit * SLOW_START
        } else {
            (self.limit + target) / 2.0
        };
        let before = self.limit();
        self.limit = next.clamp(f64::from(self.p.min), f64::from(self.p.max));
        if self.limit() != before {
            self.moved = now;
        }
        if now >= self.check_at {
            self.recheck(now);
        }
    }

    fn recheck(&mut self, now: Now) {
        if self.refused {
            self.phase = Phase::Probe {
                since: now,
                samples: Vec::new(),
            };
            self.samples.clear();
            self.opened = None;
            self.peak = 0;
        } else {
            if let Some(p) = self.period_min {
                self.base = Some(p);
            }
            self.restart_period(now);
        }
    }

    fn end_probe(&mut self, now: Now) {
        let Phase::Probe { since, samples } = &mut self.phase else {
            return;
        };
        let enough = samples.len() >= MIN_SAMPLES;
        if !enough && now.saturating_sub(*since) < PROBE_MAX {
            return;
        }
        if !samples.is_empty() {
            self.base = Some(median(samples));
        }
        self.phase = Phase::Follow;
        self.restart_period(now);
    }

    fn restart_period(&mut self, now: Now) {
        self.check_at = now + self.p.recheck;
        self.period_min = None;
        self.refused = false;
    }
}

fn median(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let mid = v.len() / 2;
    *v.select_nth_unstable(mid).1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn params(min: u32, max: u32, initial: u32) -> AdaptiveParams {
        AdaptiveParams::try_new(min, max, initial, 0.25, 100 * MS, Duration::from_secs(30))
            .expect("valid")
    }

    /// An upstream serving `cap` at once in `service` each, the rest
    /// queued, driven closed-loop at `demand` requests in flight (never
    /// more than the limit); runs `for_` and returns the limits seen at
    /// each completion outside a probe. Completions come in batches.
    fn drive(
        a: &mut AdaptiveLimit,
        cap: u32,
        service: Duration,
        demand: u32,
        for_: Duration,
        t0: Now,
    ) -> Vec<u32> {
        let mut now = t0;
        let mut seen = Vec::new();
        while now < t0 + for_ {
            let in_flight = demand.min(a.limit());
            // Latency with `in_flight` sharing `cap` servers (a fluid queue).
            let took = service.mul_f64((f64::from(in_flight) / f64::from(cap)).max(1.0));
            now += service;
            let started = now.saturating_sub(took);
            for _ in 0..in_flight.min(cap) {
                a.record(started, took, in_flight, now);
                if !a.probing() {
                    seen.push(a.limit());
                }
            }
            if demand > in_flight {
                a.refused(now);
            }
        }
        seen
    }

    #[test]
    fn validation_names_each_field() {
        let e = AdaptiveParams::try_new(0, 10, 20, 0.0, Duration::ZERO, Duration::ZERO)
            .expect_err("invalid");
        let fields: Vec<_> = e.0.iter().map(|e| e.field).collect();
        assert_eq!(fields, ["min", "initial", "tolerance", "window"]);
        assert!(AdaptiveParams::try_new(5, 4, 4, 0.25, MS, MS * 10).is_err());
    }

    #[test]
    fn past_capacity_the_limit_settles_near_capacity() {
        let mut a = AdaptiveLimit::new(params(1, 1000, 5));
        let seen = drive(
            &mut a,
            20,
            50 * MS,
            200,
            Duration::from_secs(20),
            Duration::ZERO,
        );
        let tail = &seen[seen.len() / 2..];
        let (lo, hi) = (
            *tail.iter().min().expect("samples"),
            *tail.iter().max().expect("samples"),
        );
        assert!(lo >= 15 && hi <= 40, "limit between {lo} and {hi}");
        assert_eq!(a.baseline(), Some(50 * MS));
    }

    #[test]
    fn an_inflated_first_base_is_measured_again() {
        // Starts at 100 in flight against a capacity of 10: the first
        // window's median is 10× the no-load latency.
        let mut a = AdaptiveLimit::new(params(1, 1000, 100));
        drive(
            &mut a,
            10,
            20 * MS,
            1000,
            Duration::from_secs(5),
            Duration::ZERO,
        );
        assert_eq!(a.baseline(), Some(20 * MS));
        assert!(a.limit() <= 20, "limit {}", a.limit());
    }

    #[test]
    fn halved_capacity_is_followed() {
        let mut a = AdaptiveLimit::new(params(1, 1000, 10));
        let t = Duration::from_secs(10);
        drive(&mut a, 40, 50 * MS, 400, t, Duration::ZERO);
        let before = a.limit();
        drive(&mut a, 20, 50 * MS, 400, Duration::from_secs(3), t);
        let after = a.limit();
        assert!(before >= 40 && after <= 30, "{before} → {after}");
    }

    #[test]
    fn below_capacity_nothing_is_refused_and_a_recheck_does_not_probe() {
        let mut a = AdaptiveLimit::new(params(3, 1000, 20));
        let mut now = Duration::ZERO;
        for _ in 0..2000 {
            now += 10 * MS;
            // 10 in flight against a capacity of 100: no queueing.
            for _ in 0..10 {
                a.record(now.saturating_sub(50 * MS), 50 * MS, 10, now);
                assert!(!a.probing());
                assert!(a.limit() >= 10);
            }
        }
    }

    #[test]
    fn a_slower_upstream_is_learnt_by_a_probe() {
        let mut a = AdaptiveLimit::new(params(2, 1000, 10));
        let t = Duration::from_secs(10);
        drive(&mut a, 20, 10 * MS, 100, t, Duration::ZERO);
        assert_eq!(a.baseline(), Some(10 * MS));
        // Five times slower for good: the limit shrinks, the next recheck
        // probes and learns the new no-load latency, and the limit comes
        // back up to the capacity.
        drive(&mut a, 20, 50 * MS, 100, Duration::from_secs(60), t);
        assert_eq!(a.baseline(), Some(50 * MS));
        assert!(a.limit() >= 20, "limit {}", a.limit());
    }

    /// Answers, each `took`, begun 10 ms apart from `at` with the limit's
    /// worth in flight (the eleventh closes a 100 ms window); returns a
    /// time after the last.
    fn window_of(a: &mut AdaptiveLimit, at: Now, took: &[Duration]) -> Now {
        let in_flight = a.limit();
        let mut end = at;
        for (i, t) in (0u32..).zip(took) {
            let started = at + 10 * MS * i;
            end = started + *t;
            a.record(started, *t, in_flight, end);
        }
        end + MS
    }

    #[test]
    fn the_first_base_is_the_first_windows_fastest_answer() {
        // 12 let in on an upstream of 5 slots: five answer at once, the
        // rest queued behind them.
        let mut a = AdaptiveLimit::new(params(3, 1000, 12));
        let took: Vec<Duration> = (0..12u32).map(|i| 20 * MS * (i / 5 + 1)).collect();
        window_of(&mut a, Duration::ZERO, &took);
        assert_eq!(a.baseline(), Some(20 * MS));
        // The median (40 ms) is 2× that: cut at once to 12 × 1.25 / 2.
        assert_eq!(a.limit(), 8);
    }

    #[test]
    fn slow_start_doubles_a_window_and_ends_at_the_first_rise() {
        let mut a = AdaptiveLimit::new(params(1, 1000, 12));
        let mut at = Duration::ZERO;
        for want in [24, 48] {
            at = window_of(&mut a, at, &[20 * MS; 12]);
            assert_eq!(a.limit(), want);
        }
        // A window whose slowest tenth queued: slow start is over, and
        // the limit moves half way to the gradient's (1.25 at the median).
        let mut took = vec![20 * MS; 8];
        took.extend([50 * MS; 4]);
        at = window_of(&mut a, at, &took);
        assert_eq!(a.limit(), 54);
        // Twice the no-load latency: cut at once, × 1.25 / 2.
        window_of(&mut a, at, &[40 * MS; 12]);
        assert_eq!(a.limit(), 34);
    }

    #[test]
    fn refusals_in_slow_start_call_for_no_probe() {
        // At half the load of an upstream far bigger than the limit:
        // refused while the limit grows, latency never rising.
        let mut a = AdaptiveLimit::new(params(3, 30, 12));
        let mut at = Duration::ZERO;
        for _ in 0..30 {
            a.refused(at);
            at = window_of(&mut a, at, &[20 * MS; 12]);
            assert!(!a.probing());
        }
        assert_eq!(a.limit(), 30);
    }

    #[test]
    fn a_clock_stepping_back_is_the_latest_seen() {
        let mut a = AdaptiveLimit::new(params(1, 100, 10));
        a.record(Duration::from_secs(5), MS, 1, Duration::from_secs(5));
        a.record(Duration::ZERO, MS, 1, Duration::ZERO);
        assert_eq!(a.seen, Duration::from_secs(5));
    }

    /// The input CI found still growing after 2,900 answers (the
    /// steady-state property below): from a limit of 1 at 1 ms answers it
    /// settles, at 2 × 31 + growth, within 6,000.
    #[test]
    fn a_limit_starting_at_one_settles_within_six_thousand_answers() {
        let mut a = AdaptiveLimit::new(params(1, 256, 1));
        let took = MS;
        let mut now = Duration::ZERO;
        let mut last = Vec::new();
        for i in 0..6000 {
            now += took / 4 + MS;
            let in_flight = 31u32.min(a.limit());
            a.record(now.saturating_sub(took), took, in_flight, now);
            if i >= 5800 {
                last.push(a.limit());
            }
        }
        assert!(last.windows(2).all(|w| w[0] == w[1]), "{last:?}");
        assert!(!a.probing());
    }

    proptest! {
        /// Whatever the latencies, load and clock: the limit stays within
        /// its bounds, and at least one request is always let in.
        #[test]
        fn the_limit_stays_within_its_bounds(
            min in 1u32..10, span in 0u32..200, init in 0u32..200,
            events in proptest::collection::vec((0u64..400, 0u64..2_000_000, 0u32..500, any::<bool>()), 1..400),
        ) {
            let max = min + span;
            let initial = min + init.min(span);
            let mut a = AdaptiveLimit::new(params(min, max, initial));
            let mut now = Duration::ZERO;
            for (step_ms, took_us, in_flight, refuse) in events {
                now += Duration::from_millis(step_ms);
                if refuse {
                    a.refused(now);
                } else {
                    let took = Duration::from_micros(took_us);
                    a.record(now.saturating_sub(took), took, in_flight, now);
                }
                let l = a.limit();
                prop_assert!(l >= min.max(1) && l <= max, "limit {l} outside [{min}, {max}]");
            }
        }

        /// Under a constant latency the limit stops moving: at `max` when
        /// the load uses it, wherever it was when it does not.
        #[test]
        fn constant_latency_reaches_a_steady_state(
            took_ms in 1u64..500, demand in 1u32..300, initial in 1u32..100,
        ) {
            let mut a = AdaptiveLimit::new(params(1, 256, initial));
            let took = Duration::from_millis(took_ms);
            let mut now = Duration::ZERO;
            let mut last = Vec::new();
            // From a limit of 1 to its ceiling grows ×1.125 a window: 47
            // windows, 80 answers each at the fastest pace here.
            for i in 0..6000 {
                now += took / 4 + MS;
                let in_flight = demand.min(a.limit());
                a.record(now.saturating_sub(took), took, in_flight, now);
                if i >= 5800 {
                    last.push(a.limit());
                }
            }
            prop_assert!(last.windows(2).all(|w| w[0] == w[1]), "still moving: {:?}", last);
            prop_assert!(!a.probing());
        }

        /// A queueing upstream past its capacity: the limit settles within
        /// a band around the capacity, never at `min` (it does not starve).
        #[test]
        fn overload_settles_near_capacity(cap in 4u32..100, service_ms in 5u64..200) {
            let mut a = AdaptiveLimit::new(params(1, 1000, 10));
            let s = Duration::from_millis(service_ms);
            let seen = drive(&mut a, cap, s, cap * 4, s * 2000, Duration::ZERO);
            let tail = &seen[seen.len() * 3 / 4..];
            let lo = *tail.iter().min().expect("samples");
            let hi = *tail.iter().max().expect("samples");
            prop_assert!(lo >= 1 && lo * 2 >= cap, "fell to {lo} (capacity {cap})");
            prop_assert!(hi <= cap * 2 + 2, "rose to {hi} (capacity {cap})");
        }
    }

    #[test]
    fn a_limit_with_no_answers_grows_back_from_its_floor() {
        let mut a = AdaptiveLimit::new(params(3, 100, 3));
        // Before any answer, waiting is no starvation.
        for i in 0..20 {
            a.refused(MS * 10 * i);
        }
        assert_eq!(a.limit(), 3);
        // Answers at 10 ms set the no-load latency.
        for i in 0..12 {
            a.record(MS * 200 + MS * 15 * i, 10 * MS, 3, MS * 210 + MS * 15 * i);
        }
        assert!(a.baseline().is_some());
        let before = a.limit();
        // Then every place held by requests that never answer: only refusals.
        let mut now = Duration::from_secs(1);
        for _ in 0..50 {
            a.refused(now);
            now += 10 * MS;
        }
        assert!(a.limit() > before, "{} after {before}", a.limit());
        // It grows a step per starved window, not all at once.
        assert!(a.limit() < 40, "{}", a.limit());
    }
}
