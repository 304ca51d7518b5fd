//! The resilience figures of `weir chaos`, gated with bounded counts and
//! fixed seeds (each test well under 20 s). Real sockets, real time.
#![allow(clippy::unwrap_used)]

use std::time::Duration;
use weir::chaos::{run, Column, Options, Report, Scenario};

fn col<'a>(r: &'a Report, name: &str) -> &'a Column {
    r.columns.iter().find(|c| c.name == name).unwrap()
}

fn no_late(r: &Report) {
    let limit = r.deadline + Duration::from_millis(50);
    for c in &r.columns {
        if c.name == "weir" {
            assert_eq!(
                c.observed.later_than(limit),
                0,
                "{}: weir answered after the deadline",
                r.scenario.name()
            );
        }
    }
}

fn opts(requests: usize, weir_only: bool) -> Options {
    Options {
        requests: Some(requests),
        seed: 7,
        weir_only,
        ..Options::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_5_default_policy_succeeds_999_per_mille() {
    let r = run(Scenario::Transient5, &opts(2000, true)).await.unwrap();
    let w = col(&r, "weir");
    assert_eq!(w.observed.requests, 2000);
    assert!(w.success() >= 99.9, "success {:.2} %", w.success());
    assert!(
        w.amplification() <= 1.1,
        "amplification {:.3}",
        w.amplification()
    );
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_30_default_policy_keeps_amplification_under_1_2() {
    // Open loop at 1000 requests/s: the min_per_sec reserve (10/s) is small
    // against the traffic, so the ratio (0.1) is what bounds the retries.
    let r = run(Scenario::Transient30, &opts(3000, true)).await.unwrap();
    let w = col(&r, "weir");
    assert!(
        w.amplification() <= 1.2,
        "amplification {:.3}",
        w.amplification()
    );
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_30_budgeted_retries_beat_no_weir() {
    // With the default retry policy and budget, and the breaker off (see the
    // README: the default breaker opens under 30 % random failure).
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("no-breaker.toml");
    std::fs::write(&cfg, "[defaults.breaker]\nenabled = false\n").unwrap();
    let o = Options {
        config: Some(cfg),
        ..opts(3000, false)
    };
    let r = run(Scenario::Transient30, &o).await.unwrap();
    let (w, none) = (col(&r, "weir"), col(&r, "no weir"));
    assert!(
        w.success() > none.success() + 5.0,
        "weir {:.2} % vs no weir {:.2} %",
        w.success(),
        none.success()
    );
    assert!(
        w.amplification() <= 1.2,
        "amplification {:.3}",
        w.amplification()
    );
    assert!(
        col(&r, "naive retries").amplification() > 1.3,
        "the naive loop should amplify"
    );
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_breaker_holds_off_then_recovers() {
    let r = run(Scenario::Outage, &opts(1250, true)).await.unwrap();
    let w = col(&r, "weir");
    let b = &r.breaker;
    assert!(b.half_opens >= 1, "the breaker never probed: {b:?}");
    assert_eq!(
        b.attempts_while_open, 0,
        "attempts reached the upstream while the breaker was open: {b:?}"
    );
    assert!(
        b.attempts_while_half_open <= b.half_opens,
        "more than one probe per open interval: {b:?}"
    );
    // Closed within one open interval (max 1 s + 20 % jitter) plus one probe.
    let recovery = b
        .recovery
        .unwrap_or_else(|| panic!("the breaker did not close after recovery: {b:?}"));
    assert!(
        recovery <= Duration::from_millis(1200 + 300),
        "recovery took {recovery:?}"
    );
    assert!(
        w.amplification() <= 1.1,
        "amplification {:.3}",
        w.amplification()
    );
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_timeouts_are_never_delivered_twice() {
    let r = run(Scenario::PostTimeouts, &opts(400, false))
        .await
        .unwrap();
    assert_eq!(col(&r, "weir").duplicates, 0, "weir replayed a POST");
    // The harness does see duplicates when they happen.
    assert!(
        col(&r, "naive retries").duplicates > 0,
        "the naive loop should duplicate POSTs"
    );
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brownout_and_rate_limited_answer_within_the_deadline() {
    let r = run(Scenario::Brownout, &opts(400, true)).await.unwrap();
    no_late(&r);
    let r = run(Scenario::RateLimited, &opts(800, true)).await.unwrap();
    let w = col(&r, "weir");
    // SEMANTICS §3: retries ≤ ratio × requests + min_per_sec × ttl.
    let bound = 1.0 + 0.1 + (10.0 * 10.0) / w.observed.requests as f64;
    assert!(
        w.amplification() <= bound + 1e-9,
        "amplification {:.3} > {bound:.3}",
        w.amplification()
    );
    no_late(&r);
}
