//! Backoff delays (docs/reference/retries.md#backoff): grow → cap → jitter → clamp → floor → round.
//!
//! Owns the validated [`BackoffPolicy`], the per-retry [`delay`], and the
//! operator views [`schedule`] and [`envelope`]. It must not sleep, read a
//! clock or draw from a global RNG: the caller hands in a [`Random`], so the
//! same seed always gives the same schedule.

use super::random::{Random, SeededRandom};
use super::PolicyError;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
/// How the undelayed backoff grows with the retry number `n`.
pub enum Growth {
    /// `base · multiplier^(n−1)`.
    Exponential,
    /// `base · n`.
    Linear,
    /// `base`.
    Constant,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
/// How the capped delay `d` is randomised.
pub enum Jitter {
    /// `U[0, d]`.
    Full,
    /// `d/2 + U[0, d/2]`.
    Equal,
    /// `min(max, U[base, 3 · previous])`.
    Decorrelated,
    /// `d` exactly.
    None,
    /// `d · (1 + p · U[−1, 1])`, `0 < p ≤ 1`.
    Proportional(f64),
}

/// A validated backoff policy.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BackoffPolicy {
    /// The first retry's undelayed wait.
    pub base: Duration,
    /// The cap applied after growth, and again after jitter.
    pub max: Duration,
    /// The exponential growth factor (≥ 1).
    pub multiplier: f64,
    /// How the delay grows with the retry number.
    pub growth: Growth,
    /// How the capped delay is randomised.
    pub jitter: Jitter,
    /// Skip the post-jitter clamp, so proportional jitter may exceed `max`.
    pub allow_jitter_above_cap: bool,
}

impl BackoffPolicy {
    /// Validates a backoff policy: `multiplier` finite and ≥ 1, `max ≥ base`,
    /// proportional jitter in `(0, 1]`.
    pub fn try_new(
        base: Duration,
        max: Duration,
        multiplier: f64,
        growth: Growth,
        jitter: Jitter,
        allow_jitter_above_cap: bool,
    ) -> Result<Self, PolicyError> {
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(PolicyError::new(
                "multiplier",
                format!("must be a finite number ≥ 1.0, got {multiplier}"),
            ));
        }
        if max < base {
            return Err(PolicyError::new(
                "max",
                format!("must be ≥ base ({base:?}), got {max:?}"),
            ));
        }
        if let Jitter::Proportional(p) = jitter {
            if !(p > 0.0 && p <= 1.0) {
                return Err(PolicyError::new(
                    "jitter.proportional",
                    format!("must be in (0, 1] — a fraction, not a percent; got {p}"),
                ));
            }
        }
        Ok(BackoffPolicy {
            base,
            max,
            multiplier,
            growth,
            jitter,
            allow_jitter_above_cap,
        })
    }
}

/// The delay before retry `n` (`n = 1` for the first retry), in exactly the
/// order of docs/reference/retries.md#backoff: grow → cap → jitter → clamp → floor → round to
/// whole milliseconds.
///
/// `prev` is the delay actually slept before the previous retry; it only
/// matters for decorrelated jitter, and anything below `base` (including
/// `Duration::ZERO` for the first retry) counts as `base`. `n = 0` is treated
/// as `1`. Growth is computed in `f64` and saturates at `max`, so attempt
/// 10,000 with multiplier 10 neither overflows nor panics. At most one draw is
/// taken from `rng` (none for `Jitter::None`).
pub fn delay(policy: &BackoffPolicy, n: u32, prev: Duration, rng: &mut dyn Random) -> Duration {
    let max = ms(policy.max);
    let d = grown_capped(policy, n);
    let jittered = match policy.jitter {
        Jitter::None => d,
        Jitter::Full => d * unit(rng),
        Jitter::Equal => d / 2.0 + unit(rng) * d / 2.0,
        Jitter::Decorrelated => {
            let (lo, hi) = decorrelated_range(policy, prev);
            (lo + unit(rng) * (hi - lo)).min(max)
        }
        Jitter::Proportional(p) => d * (1.0 + p * (2.0 * unit(rng) - 1.0)),
    };
    finish(policy, jittered)
}

/// Step 1 and 2: the grown delay capped at `max`, in milliseconds.
fn grown_capped(policy: &BackoffPolicy, n: u32) -> f64 {
    let base = ms(policy.base);
    let max = ms(policy.max);
    let n = n.max(1);
    let grown = match policy.growth {
        Growth::Constant => base,
        Growth::Linear => base * f64::from(n),
        Growth::Exponential => {
            // powi takes an i32; past ~1,100 doublings the result is +inf
            // anyway, which `min` below turns into `max`.
            let e = i32::try_from(n - 1).unwrap_or(i32::MAX);
            base * policy.multiplier.powi(e)
        }
    };
    if grown.is_nan() {
        max
    } else {
        grown.min(max)
    }
}

/// The range decorrelated jitter draws from: `[base, 3 · max(prev, base)]`.
fn decorrelated_range(policy: &BackoffPolicy, prev: Duration) -> (f64, f64) {
    let base = ms(policy.base);
    let prev = ms(prev).max(base);
    (base, 3.0 * prev)
}

/// Steps 4–6: clamp (unless allowed above the cap), floor at 0, round to whole
/// milliseconds. Rounding never pushes a clamped delay past `max`.
fn finish(policy: &BackoffPolicy, d: f64) -> Duration {
    let max = ms(policy.max);
    let mut d = if d.is_nan() { 0.0 } else { d };
    if !policy.allow_jitter_above_cap {
        d = d.min(max);
    }
    d = d.max(0.0);
    let mut rounded = d.round();
    if !policy.allow_jitter_above_cap && rounded > max {
        rounded = max.floor();
    }
    // `as` saturates for f64 → u64, so even an absurd above-cap delay is safe.
    Duration::from_millis(rounded as u64)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn unit(rng: &mut dyn Random) -> f64 {
    let r = rng.next_f64();
    if r.is_nan() {
        0.0
    } else {
        r.clamp(0.0, 1.0)
    }
}

/// The delays of a run that always fails: `retries` delays drawn from a
/// [`SeededRandom`] seeded with `seed`. The same seed gives the same schedule.
pub fn schedule(policy: &BackoffPolicy, seed: u64, retries: u32) -> Vec<Duration> {
    let mut rng = SeededRandom::new(seed);
    let mut prev = Duration::ZERO;
    (1..=retries)
        .map(|n| {
            let d = delay(policy, n, prev, &mut rng);
            prev = d;
            d
        })
        .collect()
}

/// What a policy can do over `retries` retries, whatever the random draws.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Envelope {
    /// For each retry (index 0 is the first retry), the smallest and largest
    /// delay it can wait.
    pub per_retry: Vec<(Duration, Duration)>,
    /// The sum of the largest delays: the longest a run that always fails can
    /// spend waiting.
    pub worst_case_total: Duration,
}

/// The delay envelope of the first `retries` retries (see [`Envelope`]).
pub fn envelope(policy: &BackoffPolicy, retries: u32) -> Envelope {
    let max = ms(policy.max);
    let base = ms(policy.base);
    let mut per_retry = Vec::with_capacity(retries as usize);
    let mut worst = Duration::ZERO;
    // For decorrelated jitter the largest possible previous delay feeds the
    // next retry's upper bound.
    let mut prev_hi = base;
    for n in 1..=retries {
        let d = grown_capped(policy, n);
        let (lo, hi) = match policy.jitter {
            Jitter::None => (d, d),
            Jitter::Full => (0.0, d),
            Jitter::Equal => (d / 2.0, d),
            Jitter::Decorrelated => {
                let hi = (3.0 * prev_hi.max(base)).min(max);
                prev_hi = hi;
                (base.min(max), hi)
            }
            Jitter::Proportional(p) => (d * (1.0 - p), d * (1.0 + p)),
        };
        let (lo, hi) = (finish(policy, lo), finish(policy, hi));
        worst = worst.saturating_add(hi);
        per_retry.push((lo, hi));
    }
    Envelope {
        per_retry,
        worst_case_total: worst,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::random::FixedRandom;

    fn policy(growth: Growth, jitter: Jitter) -> BackoffPolicy {
        BackoffPolicy::try_new(
            Duration::from_millis(200),
            Duration::from_secs(10),
            2.0,
            growth,
            jitter,
            false,
        )
        .unwrap()
    }

    #[test]
    fn exponential_no_jitter_doubles_then_caps() {
        let p = policy(Growth::Exponential, Jitter::None);
        let s: Vec<u64> = schedule(&p, 1, 8)
            .iter()
            .map(|d| d.as_millis() as u64)
            .collect();
        assert_eq!(s, [200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
    }

    #[test]
    fn linear_and_constant() {
        let p = policy(Growth::Linear, Jitter::None);
        let s = schedule(&p, 1, 3);
        assert_eq!(s, [200, 400, 600].map(Duration::from_millis));
        let p = policy(Growth::Constant, Jitter::None);
        assert_eq!(schedule(&p, 1, 3), [200; 3].map(Duration::from_millis));
    }

    #[test]
    fn jitter_kinds_at_fixed_draws() {
        let full = policy(Growth::Exponential, Jitter::Full);
        assert_eq!(
            delay(&full, 2, Duration::ZERO, &mut FixedRandom(0.5)),
            Duration::from_millis(200)
        );
        let equal = policy(Growth::Exponential, Jitter::Equal);
        assert_eq!(
            delay(&equal, 2, Duration::ZERO, &mut FixedRandom(0.0)),
            Duration::from_millis(200)
        );
        assert_eq!(
            delay(&equal, 2, Duration::ZERO, &mut FixedRandom(1.0)),
            Duration::from_millis(400)
        );
        let prop = policy(Growth::Exponential, Jitter::Proportional(0.2));
        assert_eq!(
            delay(&prop, 1, Duration::ZERO, &mut FixedRandom(0.0)),
            Duration::from_millis(160)
        );
        assert_eq!(
            delay(&prop, 1, Duration::ZERO, &mut FixedRandom(1.0)),
            Duration::from_millis(240)
        );
        let dec = policy(Growth::Exponential, Jitter::Decorrelated);
        assert_eq!(
            delay(&dec, 1, Duration::ZERO, &mut FixedRandom(1.0)),
            Duration::from_millis(600)
        );
        assert_eq!(
            delay(&dec, 5, Duration::from_secs(9), &mut FixedRandom(1.0)),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn clamp_then_allow_above_cap() {
        let mut p = policy(Growth::Constant, Jitter::Proportional(0.5));
        p.base = Duration::from_secs(10);
        assert_eq!(
            delay(&p, 1, Duration::ZERO, &mut FixedRandom(1.0)),
            Duration::from_secs(10)
        );
        p.allow_jitter_above_cap = true;
        assert_eq!(
            delay(&p, 1, Duration::ZERO, &mut FixedRandom(1.0)),
            Duration::from_secs(15)
        );
    }

    #[test]
    fn rounds_to_whole_milliseconds() {
        let p = BackoffPolicy::try_new(
            Duration::from_micros(1_400),
            Duration::from_micros(1_600),
            1.0,
            Growth::Constant,
            Jitter::None,
            false,
        )
        .unwrap();
        assert_eq!(
            delay(&p, 1, Duration::ZERO, &mut FixedRandom(0.0)),
            Duration::from_millis(1)
        );
        let mut q = p.clone();
        q.base = Duration::from_micros(1_600);
        // 1.6 ms rounds to 2 ms, which is above max: it stays at or below max.
        assert_eq!(
            delay(&q, 1, Duration::ZERO, &mut FixedRandom(0.0)),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn huge_attempts_and_multiplier_do_not_overflow() {
        let mut p = policy(Growth::Exponential, Jitter::Full);
        p.multiplier = 10.0;
        for n in [1, 100, 1_000, 10_000, u32::MAX] {
            let d = delay(&p, n, Duration::MAX, &mut FixedRandom(1.0));
            assert!(d <= p.max);
        }
        p.growth = Growth::Linear;
        assert_eq!(
            delay(&p, u32::MAX, Duration::ZERO, &mut FixedRandom(1.0)),
            p.max
        );
        p.jitter = Jitter::Decorrelated;
        assert_eq!(
            delay(&p, 10_000, Duration::MAX, &mut FixedRandom(1.0)),
            p.max
        );
    }

    #[test]
    fn envelope_of_defaults() {
        let p = policy(Growth::Exponential, Jitter::Full);
        let e = envelope(&p, 2);
        assert_eq!(
            e.per_retry,
            vec![
                (Duration::ZERO, Duration::from_millis(200)),
                (Duration::ZERO, Duration::from_millis(400))
            ]
        );
        assert_eq!(e.worst_case_total, Duration::from_millis(600));
    }

    #[test]
    fn schedule_lies_in_envelope() {
        for jitter in [
            Jitter::Full,
            Jitter::Equal,
            Jitter::Decorrelated,
            Jitter::None,
            Jitter::Proportional(0.3),
        ] {
            let p = policy(Growth::Exponential, jitter);
            let e = envelope(&p, 9);
            for seed in 0..50 {
                for (d, (lo, hi)) in schedule(&p, seed, 9).iter().zip(&e.per_retry) {
                    assert!(
                        lo <= d && d <= hi,
                        "{jitter:?}: {d:?} not in [{lo:?}, {hi:?}]"
                    );
                }
            }
        }
    }

    #[test]
    fn proportional_above_one_is_rejected() {
        let err = BackoffPolicy::try_new(
            Duration::from_millis(1),
            Duration::from_millis(2),
            2.0,
            Growth::Exponential,
            Jitter::Proportional(20.0),
            false,
        )
        .unwrap_err();
        assert_eq!(err.field, "jitter.proportional");
    }
}
