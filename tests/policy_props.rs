//! Property tests of the policy core (issue 3): backoff bounds and
//! determinism, the budget's bound, the breaker's probe limit, the limiters'
//! admission bounds — each also with a clock that steps back.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use std::time::Duration;
use weir::policy::breaker::State;
use weir::policy::{
    decide, delay, schedule, Admission, BackoffPolicy, BodyFacts, Breaker, BreakerParams,
    BudgetParams, DecideInput, FixedGates, Growth, Jitter, Outcome, Pushback, RequestFacts,
    RetryBudget, RetryOn, RetryPolicy, SeededRandom, SlidingWindow, TokenBucket, Verdict,
};

fn growth() -> impl Strategy<Value = Growth> {
    prop_oneof![
        Just(Growth::Exponential),
        Just(Growth::Linear),
        Just(Growth::Constant)
    ]
}

fn jitter() -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::Full),
        Just(Jitter::Equal),
        Just(Jitter::Decorrelated),
        Just(Jitter::None),
        (0.001f64..=1.0).prop_map(Jitter::Proportional),
    ]
}

prop_compose! {
    fn backoff(allow_above: bool)(
        base in 0u64..20_000,
        extra in 0u64..120_000,
        multiplier in 1.0f64..=10.0,
        growth in growth(),
        jitter in jitter(),
    ) -> BackoffPolicy {
        BackoffPolicy::try_new(
            Duration::from_millis(base),
            Duration::from_millis(base + extra),
            multiplier,
            growth,
            jitter,
            allow_above,
        ).unwrap()
    }
}

proptest! {
    #[test]
    fn delay_within_zero_and_max(
        p in backoff(false),
        n in 1u32..=20_000,
        prev in 0u64..1_000_000,
        seed in any::<u64>(),
    ) {
        let d = delay(&p, n, Duration::from_millis(prev), &mut SeededRandom::new(seed));
        prop_assert!(d <= p.max, "{d:?} > {:?}", p.max);
    }

    #[test]
    fn above_cap_only_by_proportional_share(
        p in backoff(true),
        n in 1u32..=20_000,
        seed in any::<u64>(),
    ) {
        let d = delay(&p, n, Duration::ZERO, &mut SeededRandom::new(seed));
        let share = match p.jitter { Jitter::Proportional(x) => x, _ => 0.0 };
        let bound = p.max.as_secs_f64() * 1000.0 * (1.0 + share) + 0.5;
        prop_assert!((d.as_millis() as f64) <= bound);
    }

    #[test]
    fn equal_jitter_at_least_half(
        base in 1u64..5_000,
        extra in 0u64..60_000,
        multiplier in 1.0f64..=10.0,
        growth in growth(),
        n in 1u32..=64,
        seed in any::<u64>(),
    ) {
        let p = BackoffPolicy::try_new(
            Duration::from_millis(base),
            Duration::from_millis(base + extra),
            multiplier,
            growth,
            Jitter::Equal,
            false,
        ).unwrap();
        let grown = match growth {
            Growth::Exponential => base as f64 * multiplier.powi(n as i32 - 1),
            Growth::Linear => base as f64 * f64::from(n),
            Growth::Constant => base as f64,
        };
        let d = grown.min((base + extra) as f64);
        let got = delay(&p, n, Duration::ZERO, &mut SeededRandom::new(seed));
        prop_assert!(got.as_millis() as f64 >= d / 2.0 - 0.5, "{got:?} < {d}/2");
        prop_assert!(got.as_millis() as f64 <= d + 0.5);
    }

    #[test]
    fn same_seed_same_schedule(p in backoff(false), seed in any::<u64>(), retries in 0u32..12) {
        prop_assert_eq!(schedule(&p, seed, retries), schedule(&p, seed, retries));
    }
}

/// One budget operation at a time offset (ms) from the previous one, with an
/// optional backwards step of the clock passed in.
#[derive(Debug, Clone)]
enum BudgetOp {
    Deposit,
    Withdraw(u32),
}

proptest! {
    #[test]
    fn budget_admits_at_most_ratio_plus_reserve(
        ratio in 0.0f64..=1.0,
        min_per_sec in 0u32..20,
        ttl_s in 1u64..=10,
        ops in prop::collection::vec(
            (0u64..400, 0u64..3_000, prop_oneof![
                3 => Just(BudgetOp::Deposit),
                2 => (1u32..=3).prop_map(BudgetOp::Withdraw),
            ]),
            1..200,
        ),
    ) {
        let ttl = Duration::from_secs(ttl_s);
        let params = BudgetParams::try_new(ratio, min_per_sec, ttl, 2).unwrap();
        let mut b = RetryBudget::new(params, Duration::ZERO);
        let mut t = Duration::from_secs(5);
        let mut eff = Duration::ZERO;
        // (effective time, deposit?, withdrawn tokens)
        let mut log: Vec<(Duration, bool, u32)> = Vec::new();
        for (dt, back, op) in ops {
            t += Duration::from_millis(dt);
            let now = t.saturating_sub(Duration::from_millis(back * u64::from(back > 2_000)));
            eff = eff.max(now);
            match op {
                BudgetOp::Deposit => { b.deposit(now); log.push((eff, true, 0)); }
                BudgetOp::Withdraw(c) => {
                    let ok = b.try_withdraw(c, now);
                    log.push((eff, false, if ok { c } else { 0 }));
                }
            }
        }
        let deposit = (ratio * 1000.0).round() / 1000.0;
        let reserve = f64::from(min_per_sec) * ttl_s as f64;
        let horizon = ttl - ttl / 10;
        for j in 0..log.len() {
            for i in j..log.len() {
                if log[i].0 - log[j].0 > horizon { break; }
                let withdrawn: u32 = log[j..=i].iter().map(|e| e.2).sum();
                let lo = log[j].0.saturating_sub(ttl);
                let deposits = log[..=i].iter().filter(|e| e.1 && e.0 >= lo).count();
                let bound = deposit * deposits as f64 + reserve + 1e-9;
                prop_assert!(f64::from(withdrawn) <= bound,
                    "window {j}..={i}: {withdrawn} > {bound}");
            }
        }
    }
}

#[derive(Debug, Clone)]
enum BreakerOp {
    Acquire,
    Record(usize, bool),
    Release(usize),
    Advance(u64),
    StepBack(u64),
}

proptest! {
    #[test]
    fn breaker_never_exceeds_half_open_probes(
        probes in 1u32..4,
        jitter in 0.0f64..0.9,
        seed in any::<u64>(),
        ops in prop::collection::vec(prop_oneof![
            4 => Just(BreakerOp::Acquire),
            4 => (any::<usize>(), any::<bool>()).prop_map(|(i, f)| BreakerOp::Record(i, f)),
            1 => any::<usize>().prop_map(BreakerOp::Release),
            2 => (0u64..40_000).prop_map(BreakerOp::Advance),
            1 => (0u64..40_000).prop_map(BreakerOp::StepBack),
        ], 1..300),
    ) {
        let params = BreakerParams::try_new(
            true, 3, 10, 3, 0.5, vec![503],
            Duration::from_secs(5), Duration::from_secs(60), jitter, probes,
        ).unwrap();
        let mut b = Breaker::new(params);
        let mut rng = SeededRandom::new(seed);
        let mut now = Duration::from_secs(100);
        let mut outstanding: Vec<Admission> = Vec::new();
        // probes admitted since the last transition, not yet recorded/released
        let mut probes_now = 0u32;
        for op in ops {
            match op {
                BreakerOp::Acquire => if let Ok(a) = b.try_acquire(now) {
                    if a.transition.is_some() { probes_now = 0; }
                    if a.probe { probes_now += 1; }
                    outstanding.push(a);
                },
                BreakerOp::Record(i, failure) if !outstanding.is_empty() => {
                    let a = outstanding.swap_remove(i % outstanding.len());
                    let before = b.raw_state();
                    let t = b.record(a, failure, now, &mut rng);
                    if t.is_some() {
                        probes_now = 0;
                    } else if a.probe && matches!(before, State::HalfOpen { .. }) && before != b.raw_state() {
                        probes_now = probes_now.saturating_sub(1);
                    }
                }
                BreakerOp::Release(i) if !outstanding.is_empty() => {
                    let a = outstanding.swap_remove(i % outstanding.len());
                    let before = b.raw_state();
                    b.release(a);
                    if before != b.raw_state() { probes_now = probes_now.saturating_sub(1); }
                }
                BreakerOp::Advance(ms) => now += Duration::from_millis(ms),
                BreakerOp::StepBack(ms) => now = now.saturating_sub(Duration::from_millis(ms)),
                _ => {}
            }
            prop_assert!(probes_now <= probes, "{probes_now} probes outstanding");
            if let State::HalfOpen { in_flight, .. } = b.raw_state() {
                prop_assert!(in_flight <= probes);
                prop_assert_eq!(in_flight, probes_now);
            }
        }
    }

    #[test]
    fn bucket_never_exceeds_burst_plus_rate(
        rps in 0.1f64..1_000.0,
        burst in 1u32..100,
        ops in prop::collection::vec((0u64..200, 0u64..5_000, 1u32..4), 1..300),
    ) {
        let start = Duration::from_secs(10);
        let mut b = TokenBucket::new(rps, burst, start);
        let (mut t, mut eff, mut admitted) = (start, start, 0u64);
        for (dt, back, n) in ops {
            t += Duration::from_millis(dt);
            // every fourth-ish op passes a clock that stepped back
            let now = if back > 3_750 { t.saturating_sub(Duration::from_millis(back)) } else { t };
            eff = eff.max(now);
            if b.try_take(n, now) { admitted += u64::from(n); }
            let bound = f64::from(burst) + rps * (eff - start).as_secs_f64() + 1e-6;
            prop_assert!(admitted as f64 <= bound, "{admitted} > {bound}");
        }
    }

    #[test]
    fn window_never_over_admits(
        limit in 1u32..20,
        period_ms in 10u64..10_000,
        ops in prop::collection::vec((0u64..500, 0u64..5_000), 1..300),
    ) {
        let period = Duration::from_millis(period_ms);
        let mut w = SlidingWindow::new(limit, period, Duration::ZERO);
        let (mut t, mut eff) = (Duration::from_secs(1), Duration::ZERO);
        let mut admitted: Vec<Duration> = Vec::new();
        for (dt, back) in ops {
            t += Duration::from_millis(dt);
            let now = if back > 3_750 { t.saturating_sub(Duration::from_millis(back)) } else { t };
            eff = eff.max(now);
            if w.try_take(1, now) {
                admitted.push(eff);
                let in_window = admitted.iter().filter(|a| eff - **a < period).count();
                prop_assert!(in_window <= limit as usize);
            }
        }
    }

    #[test]
    fn a_retry_is_always_safe_replayable_and_in_time(
        method in prop::sample::select(vec!["GET", "POST", "PUT", "PATCH", "DELETE"]),
        key in any::<bool>(),
        body_len in prop::option::of(0u64..200_000),
        outcome in prop_oneof![
            (100u16..600, prop::option::of(0u64..120), prop_oneof![
                Just(None), Just(Some(Pushback::DoNotRetry)), Just(Some(Pushback::Refused)),
                (0u64..120_000).prop_map(|ms| Some(Pushback::After(Duration::from_millis(ms)))),
            ]).prop_map(|(s, ra, pushback)| Outcome::Response {
                status: s, retry_after: ra.map(Duration::from_secs), grpc_status: None, pushback }),
            Just(Outcome::ConnectFailure),
            any::<bool>().prop_map(|s| Outcome::Reset { request_sent: s }),
            Just(Outcome::Timeout),
            Just(Outcome::ClientGone),
        ],
        attempts in 1u32..6,
        left in prop::option::of(0u64..20_000),
        gates in any::<(bool, bool, bool)>(),
        seed in any::<u64>(),
    ) {
        let retry_on = RetryOn::parse(&["connect-failure", "reset", "timeout", "429", "5xx"]
            .map(String::from)).unwrap();
        let backoff = BackoffPolicy::try_new(Duration::from_millis(200), Duration::from_secs(10),
            2.0, Growth::Exponential, Jitter::Full, false).unwrap();
        let budget = BudgetParams::try_new(0.1, 10, Duration::from_secs(10), 2).unwrap();
        let policy = RetryPolicy::try_new(3, retry_on, Duration::from_secs(60), 65_536,
            Duration::from_millis(10), backoff, budget).unwrap();
        let body = body_len.map_or(BodyFacts::Empty, |len| BodyFacts::Buffered { len });
        let facts = RequestFacts::new(method, key, body);
        let input = DecideInput {
            policy: &policy, facts: &facts, outcome: &outcome, attempts_made: attempts,
            time_left: left.map(Duration::from_millis), prev_delay: Duration::ZERO,
            elsewhere: false,
        };
        let mut g = FixedGates { budget: gates.0, breaker: gates.1, limiter: gates.2 };
        let v = decide(&input, &mut SeededRandom::new(seed), &mut g);
        if let Verdict::Retry { delay, .. } = v {
            let not_processed = matches!(outcome,
                Outcome::ConnectFailure | Outcome::Reset { request_sent: false }
                | Outcome::Response { status: 429, .. });
            prop_assert!(facts.idempotent || not_processed);
            prop_assert!(body_len.is_none_or(|l| l <= 65_536));
            prop_assert!(attempts < 3);
            prop_assert!(gates.0 && gates.1 && gates.2);
            // Pushback (docs/reference/retries.md#pushback): a refusal is
            // never retried; an asked wait is the delay, whatever else.
            if let Outcome::Response { pushback: Some(p), .. } = outcome {
                prop_assert!(matches!(p, Pushback::After(d) if d == delay), "{p:?} {delay:?}");
            }
            if let Some(left) = left {
                prop_assert!(delay + Duration::from_millis(10) <= Duration::from_millis(left));
            }
        }
    }
}
