//! The default breaker is a hard-down detector (README, "The circuit
//! breaker"): random partial failure never opens it, a hard outage opens it
//! within `consecutive_failures` attempts. The parameters are read from a
//! parsed config with no breaker table, so these tests follow the defaults
//! wherever they are defined.
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
    let mut b = Breaker::new(params.clone());
    let mut outcomes = SeededRandom::new(seed);
    let mut jitter = SeededRandom::new(seed ^ 0x5eed);
    for i in 0..attempts {
        let now = Duration::from_millis(u64::from(i));
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
    assert_eq!(p.failure_rate, 0.8);
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
fn a_hard_outage_opens_the_default_breaker_within_20_attempts() {
    let p = defaults();
    for seed in 0..50 {
        let at = first_open(&p, 1.0, 10_000, seed);
        assert!(at.is_some_and(|n| n <= 20), "seed {seed}: opened at {at:?}");
    }
}

#[test]
fn the_old_defaults_stay_expressible_and_open_on_noise() {
    // sluice's numbers: 5 in a row, ≥ 50 % of the last 20 once there are 5.
    let src = "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"a\"]\n\
               [upstreams.a.breaker]\nconsecutive_failures = 5\nwindow = 20\n\
               min_samples = 5\nfailure_rate = 0.5\nopen = \"30s\"\nmax_open = \"5m\"\n";
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
    // Trip it, then fail every probe.
    for _ in 0..20 {
        let a = b.try_acquire(now).unwrap();
        let _ = b.record(a, true, now, &mut jitter);
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
    // Measured: 4 of these 1,000 runs open it (40 %: none; 60 %: 176).
    let p = defaults();
    let opened = (0..1000)
        .filter(|seed| first_open(&p, 0.5, 10_000, *seed).is_some())
        .count();
    assert!(opened <= 10, "{opened} of 1000 runs opened it");
}
