//! The default breaker is a hard-down detector
//! (docs/reference/breaker.md#trip-rules): random partial failure never
//! opens it, a hard outage opens it within 20 attempts or 1 s, whichever is
//! later. The parameters are read
//! from a parsed config with no breaker table, so these tests follow the
//! defaults wherever they are defined.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;
use weir::config::Config;
use weir::policy::{Breaker, BreakerParams, Random, SeededRandom, StateKind};

fn defaults() -> BreakerParams {
    let src = "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"a\"]\n";
    let c = Config::parse(Path::new("weir.toml"), src).unwrap();
    c.upstreams[0].breaker.clone()
}

/// Runs `attempts` attempts, each failing with probability `p` (seeded), one
/// millisecond apart; returns the attempt (1-based) that opened the breaker.
fn first_open(params: &BreakerParams, p: f64, attempts: u32, seed: u64) -> Option<u32> {
    first_open_every(params, p, attempts, seed, Duration::from_millis(1))
}

/// Like [`first_open`], with attempts `every` apart.
fn first_open_every(
    params: &BreakerParams,
    p: f64,
    attempts: u32,
    seed: u64,
    every: Duration,
) -> Option<u32> {
    let mut b = Breaker::new(params.clone());
    let mut outcomes = SeededRandom::new(seed);
    let mut jitter = SeededRandom::new(seed ^ 0x5eed);
    for i in 0..attempts {
        let now = every * i;
        let a = b.try_acquire(now).ok()?;
        let failure = outcomes.next_f64() < p;
        if let Some(t) = b.record(a, failure, now, &mut jitter) {
            if t.to == StateKind::Open {
                return Some(i + 1);
            }
        }
    }
    None
}

#[test]
fn the_defaults_are_the_hard_down_detector() {
    let p = defaults();
    assert!(p.enabled);
    assert_eq!(
        (p.consecutive_failures, p.window, p.min_samples),
        (20, 100, 50)
    );
    assert_eq!(p.failing_for, Duration::from_secs(1));
    assert_eq!(p.failure_rate, 1.0);
    assert_eq!(
        (p.open, p.max_open),
        (Duration::from_secs(1), Duration::from_secs(30))
    );
    assert_eq!((p.open_jitter, p.half_open_probes), (0.2, 1));
}

#[test]
fn thirty_percent_random_failure_never_opens_the_default_breaker() {
    let p = defaults();
    for seed in 0..50 {
        assert_eq!(
            first_open(&p, 0.30, 10_000, seed),
            None,
            "seed {seed}: 30 % independent failure opened the default breaker"
        );
    }
}

#[test]
fn a_hard_outage_opens_the_default_breaker_within_20_attempts_or_1s_whichever_is_later() {
    let p = defaults();
    for per_s in [1u32, 5, 10, 20, 100, 1000, 10_000] {
        let every = Duration::from_secs(1) / per_s;
        // Attempt k (1-based) happens at (k - 1) × every.
        let bound = 20.max(per_s + 1);
        let at = first_open_every(&p, 1.0, 100_000, 7, every);
        assert!(
            at.is_some_and(|n| n <= bound),
            "{per_s}/s: opened at attempt {at:?}, bound {bound}"
        );
    }
}

/// Openings from closed (a failed probe re-opening it is the same episode)
/// in one simulated hour of attempts at `per_s`, each failing independently
/// with probability `p`; an opening's interval passes as the breaker's own
/// clock says, and its probe is the next attempt.
fn openings_in_an_hour(params: &BreakerParams, per_s: u64, p: f64, seed: u64) -> u32 {
    let mut b = Breaker::new(params.clone());
    let mut outcomes = SeededRandom::new(seed);
    let mut jitter = SeededRandom::new(seed ^ 0x5eed);
    let every = Duration::from_nanos(1_000_000_000 / per_s);
    let mut opened = 0;
    for i in 0..per_s * 3600 {
        let now = every * i as u32;
        let Ok(a) = b.try_acquire(now) else {
            continue;
        };
        let failure = outcomes.next_f64() < p;
        if b.record(a, failure, now, &mut jitter)
            .is_some_and(|t| t.to == StateKind::Open && t.from == StateKind::Closed)
        {
            opened += 1;
        }
    }
    opened
}

/// docs/reference/breaker.md#trip-rules: independent random failure at 50, 70 and
/// 85 % over a simulated hour opens the default breaker at most once, at
/// 100, 1,000 and 10,000 attempts per second. At 10 per second "within
/// 20 attempts of a hard outage" means 20 failures in a row are enough,
/// and at 70 % and 85 % random failure such runs come about 9 and 200
/// times an hour (3,600 × 10 × (1 − p) × p²⁰): no rule that reads only
/// outcomes can tell them from an outage. There the test holds the
/// breaker to that arithmetic instead.
#[test]
fn random_failure_opens_the_default_breaker_at_most_once_an_hour() {
    let params = defaults();
    for per_s in [10u64, 100, 1000, 10_000] {
        for p in [0.5, 0.7, 0.85] {
            let opened = openings_in_an_hour(&params, per_s, p, per_s ^ (p * 100.0) as u64);
            let runs_of_20 = 3600.0 * per_s as f64 * (1.0 - p) * p.powi(20);
            eprintln!("{per_s}/s at {p}: {opened} openings in an hour");
            if per_s == 10 && runs_of_20 > 1.0 {
                assert!(
                    f64::from(opened) <= runs_of_20 * 1.5 + 3.0,
                    "{per_s}/s at {p}: {opened} openings, {runs_of_20:.1} runs of 20 expected"
                );
            } else {
                assert!(
                    opened <= 1,
                    "{per_s}/s at {p}: {opened} openings in an hour"
                );
            }
        }
    }
}

#[test]
fn the_old_defaults_stay_expressible_and_open_on_noise() {
    // sluice's numbers: 5 in a row, ≥ 50 % of the last 20 once there are 5.
    let src = "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"a\"]\n\
               [upstreams.a.breaker]\nconsecutive_failures = 5\nwindow = 20\n\
               min_samples = 5\nfailure_rate = 0.5\nopen = \"30s\"\nmax_open = \"5m\"\n\
               failing_for = \"0s\"\n";
    let c = Config::parse(Path::new("weir.toml"), src).unwrap();
    let old = c.upstreams[0].breaker.clone();
    // The reason they are no longer the default: 30 % random failure opens
    // them in every one of these runs.
    for seed in 0..50 {
        assert!(
            first_open(&old, 0.30, 10_000, seed).is_some(),
            "seed {seed}"
        );
    }
}

#[test]
fn open_intervals_double_from_one_second_to_the_cap() {
    let p = defaults();
    let mut b = Breaker::new(p);
    let mut jitter = SeededRandom::new(1);
    let mut now = Duration::ZERO;
    let mut seen = Vec::new();
    // Trip it (20 failures over a second), then fail every probe.
    for _ in 0..21 {
        let a = b.try_acquire(now).unwrap();
        let _ = b.record(a, true, now, &mut jitter);
        now += Duration::from_millis(50);
    }
    for _ in 0..8 {
        let until = b.state(now).until_admit.unwrap();
        seen.push(until.as_secs_f64());
        now += until;
        let a = b.try_acquire(now).unwrap();
        assert!(a.probe);
        let _ = b.record(a, true, now, &mut jitter);
    }
    let nominal = [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0];
    for (got, want) in seen.iter().zip(nominal) {
        assert!(
            *got >= want * 0.8 - 1e-9 && *got <= (want * 1.2).min(30.0) + 1e-9,
            "open intervals {seen:?}"
        );
    }
}

#[test]
fn fifty_percent_random_failure_rarely_opens_the_default_breaker() {
    // Half the attempts failing is still partial failure: retries help there.
    // Measured: none of these 1,000 runs opens it (before `failing_for`:
    // 4; at 60 %, 176).
    let p = defaults();
    let opened = (0..1000)
        .filter(|seed| first_open(&p, 0.5, 10_000, *seed).is_some())
        .count();
    eprintln!("50 %: {opened} of 1000 runs opened it");
    assert!(opened <= 10, "{opened} of 1000 runs opened it");
}
