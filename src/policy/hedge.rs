//! Hedged requests (docs/reference/hedging.md#hedging): when to send a
//! second attempt beside a slow first one, and how many may be sent.
//!
//! - [`HedgeParams`]: `after` (a fixed delay, or a percentile of the
//!   upstream's recent latency), `max_extra` (the share of requests that may
//!   carry a hedge), `max_hedges`, `keyed_writes`.
//! - [`LatencyWindow`]: attempt latencies in log-spaced buckets over two
//!   rotating windows, so a percentile follows what the upstream does now
//!   with bounded memory (two arrays of [`BUCKETS`] counters).
//! - [`ExtraLoad`]: credit for hedges: each request earns `max_extra` of
//!   one, a hedge spends one, and the credit never exceeds [`MAX_CREDIT`],
//!   so over any run of requests the hedges are at most
//!   `max_extra × requests + MAX_CREDIT`, whatever the latency does.
//!
//! Pure: the caller passes `now` and every latency.

use super::PolicyErrors;
use std::time::Duration;

/// When a hedge is due.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HedgeAfter {
    /// A fixed delay after the attempt started.
    Fixed(Duration),
    /// This quantile (0.5–0.999) of the upstream's recent attempt latency.
    Percentile(f64),
}

/// `[upstreams.X.hedge]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct HedgeParams {
    pub after: HedgeAfter,
    /// Share of requests that may carry a hedge, 0–1.
    pub max_extra: f64,
    /// Hedges one request may send: 1.
    pub max_hedges: u32,
    /// Writes with an idempotency key may be hedged too.
    pub keyed_writes: bool,
}

impl HedgeParams {
    /// Validates the fields; `after` is `"p50"`–`"p99.9"` or a duration
    /// already parsed by the caller (`fixed`).
    pub fn try_new(
        after: &str,
        fixed: Option<Duration>,
        max_extra: f64,
        max_hedges: u32,
        keyed_writes: bool,
    ) -> Result<Self, PolicyErrors> {
        let mut errors = PolicyErrors::default();
        let after = match (parse_percentile(after), fixed) {
            (Some(q), _) => Some(HedgeAfter::Percentile(q)),
            (None, Some(d)) if !d.is_zero() => Some(HedgeAfter::Fixed(d)),
            (None, Some(_)) => {
                errors.check(false, "after", || {
                    "must be more than 0 (a hedge sent at once doubles every request)".into()
                });
                None
            }
            (None, None) => {
                errors.check(false, "after", || {
                    format!("{after:?} is neither a duration (\"20ms\") nor a percentile from \"p50\" to \"p99.9\"")
                });
                None
            }
        };
        errors.check(
            (0.0..=1.0).contains(&max_extra) && !max_extra.is_nan(),
            "max_extra",
            || format!("must be from 0 to 1 (a share of requests), not {max_extra}"),
        );
        errors.check(max_hedges == 1, "max_hedges", || {
            format!("only 1 is supported (one hedge beside the first attempt), not {max_hedges}")
        });
        match after {
            Some(after) => errors.or_ok(|| HedgeParams {
                after,
                max_extra,
                max_hedges,
                keyed_writes,
            }),
            None => Err(errors),
        }
    }
}

/// `"p95"` → 0.95, `"p99.9"` → 0.999; `None` for anything else or outside
/// p50–p99.9.
pub fn parse_percentile(s: &str) -> Option<f64> {
    let n: f64 = s.strip_prefix('p')?.parse().ok()?;
    (50.0..=99.9)
        .contains(&n)
        .then_some((n * 100.0).round() / 10_000.0)
}

/// Buckets of [`LatencyWindow`]: bucket `i` holds latencies up to
/// `FIRST × GROWTH^i` (100 µs up to about 8 minutes).
pub const BUCKETS: usize = 72;
const FIRST_MICROS: f64 = 100.0;
const GROWTH: f64 = 1.25;
/// A window ends after this many samples or [`WINDOW_TIME`], whichever
/// comes first; the estimate reads the current window and the one before.
const WINDOW_SAMPLES: u32 = 2_000;
const WINDOW_TIME: Duration = Duration::from_secs(10);
/// Fewer samples than this in both windows: no estimate yet (no hedge).
pub const MIN_SAMPLES: u32 = 50;

/// Recent attempt latencies of one upstream.
#[derive(Debug, Clone)]
pub struct LatencyWindow {
    current: [u32; BUCKETS],
    previous: [u32; BUCKETS],
    in_current: u32,
    in_previous: u32,
    started: Duration,
}

impl LatencyWindow {
    pub fn new(now: Duration) -> Self {
        LatencyWindow {
            current: [0; BUCKETS],
            previous: [0; BUCKETS],
            in_current: 0,
            in_previous: 0,
            started: now,
        }
    }

    /// Records one attempt's latency (to response headers, or as far as it
    /// got when it was cancelled or timed out).
    pub fn observe(&mut self, latency: Duration, now: Duration) {
        if self.in_current >= WINDOW_SAMPLES || now.saturating_sub(self.started) >= WINDOW_TIME {
            self.previous = self.current;
            self.in_previous = self.in_current;
            self.current = [0; BUCKETS];
            self.in_current = 0;
            self.started = now;
        }
        self.current[bucket(latency)] += 1;
        self.in_current += 1;
    }

    /// The `q` quantile (0–1) of the recent latencies, as its bucket's upper
    /// bound (so a little late rather than early); `None` below
    /// [`MIN_SAMPLES`].
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.in_current + self.in_previous;
        if total < MIN_SAMPLES {
            return None;
        }
        let rank = (f64::from(total) * q).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for i in 0..BUCKETS {
            seen += u64::from(self.current[i]) + u64::from(self.previous[i]);
            if seen >= rank {
                return Some(upper_bound(i));
            }
        }
        Some(upper_bound(BUCKETS - 1))
    }
}

fn bucket(latency: Duration) -> usize {
    let us = latency.as_secs_f64() * 1e6;
    if us <= FIRST_MICROS {
        return 0;
    }
    let i = ((us / FIRST_MICROS).ln() / GROWTH.ln()).ceil() as usize;
    i.min(BUCKETS - 1)
}

fn upper_bound(i: usize) -> Duration {
    Duration::from_secs_f64(FIRST_MICROS * GROWTH.powi(i as i32) / 1e6)
}

/// Hedges that may be sent at once after a quiet spell.
pub const MAX_CREDIT: f64 = 10.0;

/// The credit that bounds hedges to `max_extra` of requests.
#[derive(Debug, Clone, Default)]
pub struct ExtraLoad {
    credit: f64,
}

impl ExtraLoad {
    /// A request that could be hedged earns `max_extra` of a hedge.
    pub fn earn(&mut self, max_extra: f64) {
        self.credit = (self.credit + max_extra).min(MAX_CREDIT);
    }

    /// Gives back a hedge spent but not sent.
    pub fn refund(&mut self) {
        self.credit = (self.credit + 1.0).min(MAX_CREDIT);
    }

    /// Spends one hedge; `false` when there is not enough credit.
    pub fn try_spend(&mut self) -> bool {
        if self.credit >= 1.0 {
            self.credit -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What became of a hedge (the `result` label of `weir_hedges_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HedgeResult {
    /// Sent, and its answer is the one relayed.
    Won,
    /// Sent, and the first attempt's answer is the one relayed.
    Lost,
    /// Due, not sent: the request may not be replayed (an unkeyed write, a
    /// keyed one without `keyed_writes`, a streamed body).
    SkippedUnsafe,
    /// Due, not sent: the retry budget could not pay for it.
    SkippedBudget,
    /// Due, not sent: `max_extra` of requests already carry one.
    SkippedExtra,
    /// Due, not sent: the breaker refused it.
    SkippedBreaker,
    /// Due, not sent: too little of the deadline was left for an attempt.
    SkippedDeadline,
    /// Due, not sent: no concurrency slot was free (a hedge takes one like
    /// any attempt).
    SkippedOverloaded,
}

impl HedgeResult {
    pub const ALL: [HedgeResult; 8] = [
        HedgeResult::Won,
        HedgeResult::Lost,
        HedgeResult::SkippedUnsafe,
        HedgeResult::SkippedBudget,
        HedgeResult::SkippedExtra,
        HedgeResult::SkippedBreaker,
        HedgeResult::SkippedDeadline,
        HedgeResult::SkippedOverloaded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HedgeResult::Won => "won",
            HedgeResult::Lost => "lost",
            HedgeResult::SkippedUnsafe => "skipped_unsafe",
            HedgeResult::SkippedBudget => "skipped_budget",
            HedgeResult::SkippedExtra => "skipped_extra",
            HedgeResult::SkippedBreaker => "skipped_breaker",
            HedgeResult::SkippedDeadline => "skipped_deadline",
            HedgeResult::SkippedOverloaded => "skipped_overloaded",
        }
    }
}

/// One upstream's hedging state.
#[derive(Debug, Clone)]
pub struct Hedger {
    pub latency: LatencyWindow,
    pub extra: ExtraLoad,
}

impl Hedger {
    pub fn new(now: Duration) -> Self {
        Hedger {
            latency: LatencyWindow::new(now),
            extra: ExtraLoad::default(),
        }
    }

    /// When a hedge is due after an attempt's start: `None` while a
    /// percentile has too few samples.
    pub fn delay(&self, after: HedgeAfter) -> Option<Duration> {
        match after {
            HedgeAfter::Fixed(d) => Some(d),
            HedgeAfter::Percentile(q) => self.latency.quantile(q),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn percentiles_parse_from_p50_to_p99_9() {
        assert_eq!(parse_percentile("p95"), Some(0.95));
        assert_eq!(parse_percentile("p99.9"), Some(0.999));
        assert_eq!(parse_percentile("p50"), Some(0.5));
        for bad in ["p49", "p100", "95", "p", "pxx", "p99.95", "20ms"] {
            assert_eq!(parse_percentile(bad), None, "{bad}");
        }
    }

    #[test]
    fn bad_params_name_their_field() {
        let e = HedgeParams::try_new("soon", None, 0.05, 1, false).unwrap_err();
        assert_eq!(e.first_field(), Some("after"));
        let e = HedgeParams::try_new("p95", None, 1.5, 1, false).unwrap_err();
        assert_eq!(e.first_field(), Some("max_extra"));
        let e = HedgeParams::try_new("p95", None, 0.05, 0, false).unwrap_err();
        assert_eq!(e.first_field(), Some("max_hedges"));
        let e = HedgeParams::try_new("0ms", Some(Duration::ZERO), 0.05, 1, false).unwrap_err();
        assert_eq!(e.first_field(), Some("after"));
        // Every bad field at once, not one per run.
        let e = HedgeParams::try_new("p101", None, 1.5, 2, false).unwrap_err();
        let fields: Vec<_> = e.0.iter().map(|e| e.field).collect();
        assert_eq!(fields, ["after", "max_extra", "max_hedges"]);
        let p = HedgeParams::try_new("20ms", Some(20 * MS), 0.05, 1, false).unwrap();
        assert_eq!(p.after, HedgeAfter::Fixed(20 * MS));
    }

    #[test]
    fn the_quantile_follows_the_samples_within_a_bucket() {
        let mut w = LatencyWindow::new(Duration::ZERO);
        assert_eq!(w.quantile(0.95), None);
        // 98 % at 2–5 ms, 2 % at 1 s.
        for i in 0..1000u32 {
            let l = if i % 50 == 0 {
                1000 * MS
            } else {
                Duration::from_micros(2000 + u64::from(i % 49) * 61)
            };
            w.observe(l, Duration::ZERO);
        }
        let p95 = w.quantile(0.95).unwrap();
        assert!(p95 >= 4 * MS && p95 <= 7 * MS, "{p95:?}");
        let p99 = w.quantile(0.99).unwrap();
        assert!(p99 >= 900 * MS, "{p99:?}");
    }

    #[test]
    fn old_windows_are_forgotten() {
        let mut w = LatencyWindow::new(Duration::ZERO);
        for _ in 0..500 {
            w.observe(100 * MS, Duration::ZERO);
        }
        // Two windows later only the new latencies count.
        for t in [11, 22] {
            for _ in 0..500 {
                w.observe(2 * MS, Duration::from_secs(t));
            }
        }
        let p99 = w.quantile(0.99).unwrap();
        assert!(p99 < 3 * MS, "{p99:?}");
    }

    #[test]
    fn hedges_stay_within_max_extra_over_any_run() {
        let mut e = ExtraLoad::default();
        let mut hedges = 0;
        // Every request wants a hedge (a brownout).
        for _ in 0..10_000 {
            e.earn(0.05);
            if e.try_spend() {
                hedges += 1;
            }
        }
        assert!(hedges <= 500 + MAX_CREDIT as u32, "{hedges}");
        assert!(hedges >= 495, "{hedges}");
        // No credit at the start: the first request is not hedged.
        let mut e = ExtraLoad::default();
        e.earn(0.05);
        assert!(!e.try_spend());
    }
}
