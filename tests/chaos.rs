//! The resilience figures of `weir chaos`, gated with bounded counts and
//! fixed seeds (each test well under 20 s). Real sockets, real time, and
//! every figure on weir's default policy: a scenario sets only what belongs
//! to its story (`Scenario::settings`), never the breaker or the budget.
//!
//! The tests take a lock and run one at a time: they measure rates and
//! recovery times against the clock, and two load drivers on two cores would
//! measure each other.
//!
//! The overload scenarios are the exception: their figures (goodput and
//! p99 against the upstream's capacity and unloaded latency) are speed and
//! latency, so they are measured by `bench/overload-gate.sh` on a release
//! build and asserted deterministically in the simulation
//! (`src/policy/adaptive_sim.rs`); their tests here check that the
//! scenarios run, report what they should, and behave as nothing timed
//! could change.
#![allow(clippy::unwrap_used)]

use std::time::Duration;
use weir::cli::chaos::timeline::{first_success_after, to_success};
use weir::cli::chaos::{run, Column, Scenario, ScenarioOptions, ScenarioReport};

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    crate::common::one_heavy_at_a_time().await
}

fn col<'a>(r: &'a ScenarioReport, name: &str) -> &'a Column {
    r.columns.iter().find(|c| c.name == name).unwrap()
}

/// weir never answers later than its deadline + 50 ms.
fn no_late(r: &ScenarioReport) {
    let limit = r.deadline + Duration::from_millis(50);
    let w = col(r, r.scenario.weir_column());
    assert_eq!(
        w.observed.later_than(limit),
        0,
        "{}: weir answered after the deadline",
        r.scenario.name()
    );
}

fn opens(c: &Column) -> f64 {
    c.transitions
        .as_ref()
        .and_then(|t| t.get("open"))
        .copied()
        .unwrap_or(0.0)
}

fn opts(requests: usize, weir_only: bool) -> ScenarioOptions {
    ScenarioOptions {
        requests: Some(requests),
        seed: 7,
        weir_only,
        ..ScenarioOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_5_succeeds_999_per_mille() {
    let _one = serial().await;
    let r = run(Scenario::Transient5, &opts(2000, true)).await.unwrap();
    let w = col(&r, "weir");
    assert_eq!(w.observed.requests, 2000);
    assert!(w.success() >= 99.9, "success {:.2} %", w.success());
    assert!(
        w.amplification() <= 1.1,
        "amplification {:.3}",
        w.amplification()
    );
    assert_eq!(opens(w), 0.0, "the breaker opened at 5 % failure");
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_30_is_on_the_independent_failure_frontier() {
    // Open loop at 1000 requests/s (≥ 500/s, so the budget's 10/s reserve is
    // small against the traffic and the ratio bounds the retries).
    let _one = serial().await;
    let r = run(Scenario::Transient30, &opts(3000, true)).await.unwrap();
    let w = col(&r, "weir");
    let amp = w.amplification();
    assert!(amp <= 1.2, "amplification {amp:.3}");
    // Each attempt succeeds with probability 0.7 whatever came before, so no
    // retry policy does better than 0.7 × attempts per request; weir must be
    // within 2 points of that.
    let frontier = 70.0 * amp - 2.0;
    assert!(
        w.success() >= frontier,
        "success {:.2} % < {frontier:.2} % at amplification {amp:.3}",
        w.success()
    );
    assert_eq!(opens(w), 0.0, "the breaker opened at 30 % random failure");
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brownout_beats_no_weir_without_opening_the_breaker() {
    let _one = serial().await;
    let r = run(Scenario::Brownout, &opts(2000, false)).await.unwrap();
    let (w, none) = (col(&r, "weir"), col(&r, "no weir"));
    assert!(
        w.success() >= none.success() + 3.0,
        "weir {:.2} % vs no weir {:.2} %",
        w.success(),
        none.success()
    );
    assert!(
        w.amplification() <= 1.2,
        "amplification {:.3}",
        w.amplification()
    );
    assert_eq!(opens(w), 0.0, "the breaker opened in a brownout");
    assert!(
        col(&r, "naive retries").amplification() > 1.3,
        "the naive loop should amplify"
    );
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_breaker_holds_off_with_one_probe_per_open_interval() {
    let _one = serial().await;
    let r = run(Scenario::Outage, &opts(1750, true)).await.unwrap();
    let w = col(&r, "weir");
    let b = &r.breaker;
    assert!(opens(w) >= 1.0, "a 2 s outage did not open the breaker");
    assert!(b.half_opens >= 1, "the breaker never probed: {b:?}");
    assert_eq!(
        b.attempts_while_open, 0,
        "attempts reached the upstream while the breaker was open: {b:?}"
    );
    assert!(
        b.attempts_while_half_open <= b.half_opens * u64::from(r.half_open_probes),
        "more than one probe per open interval: {b:?}"
    );
    assert!(
        w.amplification() <= 1.1,
        "amplification {:.3} (refused attempts included)",
        w.amplification()
    );
    assert!(b.recovery.is_some(), "the breaker did not close: {b:?}");
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_serves_clients_within_a_second_of_the_upstream() {
    // 15 s of the scenario's 20 (100 requests/s, refused from 5 s to 10 s):
    // the breaker opens for 256–320 ms at a time, so a client is served
    // within 0.5 s of the upstream's return and ≥ 95 % within a second
    // (docs/reference/breaker.md#open); it was 2.6–3.6 s with 1 s doubling.
    let _one = serial().await;
    let r = run(Scenario::Recovery, &opts(1500, true)).await.unwrap();
    let w = col(&r, "weir");
    let back = w.back.unwrap();
    let first = first_success_after(&w.observed.records, back);
    assert!(
        first.is_some_and(|d| d <= Duration::from_millis(500)),
        "first success {first:?} after the upstream recovered"
    );
    let to_95 = to_success(&w.observed.records, back, 95.0);
    assert!(
        to_95.is_some_and(|d| d <= Duration::from_secs(1)),
        "≥ 95 % success only {to_95:?} after the upstream recovered"
    );
    // The dead upstream's share after the first second: one probe per
    // open interval, at most 4 a second (4 s × 4, and one more for the
    // interval the outage ends in).
    let b = &r.breaker;
    assert_eq!(b.attempts_while_open, 0, "{b:?}");
    assert!(b.attempts_while_half_open <= 17, "{b:?}");
    assert!(opens(w) >= 1.0, "a 5 s outage did not open the breaker");
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_lets_clients_back_within_half_a_second() {
    // 5 requests/s; the upstream refuses connections for 2 s from 3 s.
    let _one = serial().await;
    let r = run(Scenario::Restart, &opts(50, true)).await.unwrap();
    let w = col(&r, "weir");
    let back = w.back.unwrap();
    let first = first_success_after(&w.observed.records, back);
    assert!(
        first.is_some_and(|d| d <= Duration::from_millis(500)),
        "first success {first:?} after the app was back"
    );
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_timeouts_are_never_delivered_twice() {
    let _one = serial().await;
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

/// `double-submit`, the harness: the impatient app re-sends every POST after
/// 300 ms and gives up 3 s after its first send (at most 10 sends); straight
/// at an upstream that takes 1 s, no POST is ever answered and the upstream
/// counts every re-send as a duplicate delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_submit_counts_the_impatient_apps_duplicates() {
    let _one = serial().await;
    let r = run(Scenario::DoubleSubmit, &opts(20, false)).await.unwrap();
    let none = col(&r, "no weir");
    let s = none.resends.unwrap();
    assert_eq!(s.posts, 20);
    assert!(s.sends > s.posts && s.sends <= 10 * s.posts, "{s:?}");
    assert_eq!(s.answered, 0, "a 300 ms client got a 1 s answer: {s:?}");
    assert_eq!(none.upstream_attempts, s.sends);
    assert_eq!(none.duplicates, s.sends - s.posts);
    assert!(col(&r, "weir").resends.is_some());
}

/// `double-submit`, the gate: through weir every re-send of a POST whose
/// first send is still running gets 409 + `Retry-After`, and the one after
/// it the recorded answer — one delivery per key, every POST answered 2xx.
/// (weir keeps a keyed exchange going when its client leaves.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_submit_is_delivered_once_per_key_through_weir() {
    let _one = serial().await;
    let r = run(Scenario::DoubleSubmit, &opts(40, false)).await.unwrap();
    let (w, none) = (col(&r, "weir"), col(&r, "no weir"));
    let s = w.resends.unwrap();
    assert_eq!(s.posts, 40);
    assert_eq!(
        w.duplicates, 0,
        "weir delivered a re-sent POST again: {s:?}"
    );
    assert_eq!(w.upstream_attempts, 40, "{s:?}");
    assert_eq!(s.answered, s.posts, "a POST was never answered 2xx: {s:?}");
    // The upstream takes 1 s and the app waits 300 ms: every 2xx is a replay
    // after at least one 409.
    assert_eq!(s.replays, s.answered, "{s:?}");
    assert!(s.in_flight >= s.posts, "{s:?}");
    assert!(
        none.duplicates > 0,
        "the app's re-sends should duplicate without weir"
    );
}

/// `catalogue-outage`: 200 keys read in a Zipf pattern at 200/s, the
/// upstream (`Cache-Control: max-age=1, stale-if-error=60`) refusing
/// connections from 5 s to 10 s. 11 s of the scenario's 15: weir with its
/// cache on answers ≥ 99 % of the reads sent during the outage for keys it
/// had answered before it — through the open breaker too — and sends the
/// upstream well under one request per client request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalogue_outage_serves_stale_for_keys_seen_before_it() {
    use weir::cli::chaos::catalogue::{reads, upstream_per_read};
    let _one = serial().await;
    let r = run(Scenario::CatalogueOutage, &opts(2200, true))
        .await
        .unwrap();
    let w = col(&r, "weir (cache on)");
    let o = reads(&r, w).unwrap();
    assert!(o.seen >= 100 && o.seen_reads >= 500, "{o:?}");
    assert!(
        o.seen_success() >= 99.0,
        "success during the outage for keys seen before it: {:.2} % ({o:?})",
        o.seen_success()
    );
    // Before the outage, cold cache included.
    let per = upstream_per_read(&r, w).unwrap();
    assert!(per <= 0.5, "upstream requests per client request {per:.3}");
    let cache = w.cache.as_ref().unwrap();
    let result = |k: &str| cache.get(k).copied().unwrap_or(0.0);
    assert!(
        result("hit") > 0.0 && result("stale-if-error") > 0.0,
        "{cache:?}"
    );
    // The outage opened the breaker, and the warm cache answered through it.
    assert!(opens(w) >= 1.0, "a 5 s outage did not open the breaker");
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_retries_stay_within_the_budget() {
    let _one = serial().await;
    let r = run(Scenario::RateLimited, &opts(800, true)).await.unwrap();
    let w = col(&r, "weir");
    // Retries ≤ ratio × requests + min_per_sec × ttl.
    let bound = 1.0 + 0.1 + (10.0 * 10.0) / w.observed.requests as f64;
    assert!(
        w.amplification() <= bound + 1e-9,
        "amplification {:.3} > {bound:.3}",
        w.amplification()
    );
    no_late(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_merges_over_the_scenario_settings() {
    let _one = serial().await;
    let dir = tempfile::tempdir().unwrap();
    // A file that sets a retry field keeps the scenario's deadline (2 s)...
    let retry = dir.path().join("retry.toml");
    std::fs::write(&retry, "[defaults.retry]\nmax_attempts = 2\n").unwrap();
    let o = ScenarioOptions {
        config: Some(retry.clone()),
        ..opts(20, true)
    };
    let r = run(Scenario::Brownout, &o).await.unwrap();
    assert_eq!(r.deadline, Duration::from_secs(2));
    assert_eq!(r.merged.as_deref(), Some(retry.as_path()));
    assert!(weir::cli::chaos::report::table(&r).contains(&retry.display().to_string()));
    // ...and one that sets the deadline wins over it.
    let deadline = dir.path().join("deadline.toml");
    std::fs::write(&deadline, "[defaults]\ntimeout = \"3s\"\n").unwrap();
    let o = ScenarioOptions {
        config: Some(deadline),
        ..opts(20, true)
    };
    let r = run(Scenario::Brownout, &o).await.unwrap();
    assert_eq!(r.deadline, Duration::from_secs(3));
    no_late(&r);
}

/// `weir chaos soak` runs the real binary as a child, samples its RSS and
/// fds each interval, judges only what comes after the warm-up, and stops
/// the child when it ends. (Its 10-minute figures are in bench/RESULTS.md; this
/// checks the machinery in seconds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soak_samples_the_weir_process_and_stops_it() {
    use weir::cli::chaos::soak::{run, SoakOptions};
    let _one = serial().await;
    let opts = SoakOptions {
        weir: env!("CARGO_BIN_EXE_weir").into(),
        duration: Duration::from_secs(6),
        interval: Duration::from_secs(1),
        warmup: Duration::from_secs(2),
        rate: 200.0,
        seed: 1,
    };
    let mut shown = 0;
    let r = run(&opts, |_| shown += 1).await.unwrap();
    assert_eq!(shown, r.samples.len());
    assert!(r.samples.len() >= 5, "{:?}", r.samples);
    for s in &r.samples {
        assert!(s.rss_kib > 1024 && s.fds > 3, "{s:?}");
    }
    assert!(r.requests > 600 && r.ok > 0, "{r:?}");
    // Judged on the samples after the warm-up only.
    let judged = r.samples.iter().filter(|s| s.at > opts.warmup).count();
    assert!(judged >= 2 && judged < r.samples.len(), "{r:?}");
    assert!(r.verdict.is_some());
    assert!(
        !std::path::Path::new(&format!("/proc/{}", r.weir_pid)).exists(),
        "the weir child is still running"
    );
}

/// `weir chaos bad-replica | down-replica | slow-replica | flaky-replica`,
/// weir's column, over HTTP/1.1 and h2c: ≥ 99.5 % success at ≤ 1.05
/// upstream attempts per request, and a slow replica kept out of the tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_replica_of_three_costs_nothing_through_weir() {
    let _one = serial().await;
    for h2c in [false, true] {
        for s in [
            Scenario::BadReplica,
            Scenario::DownReplica,
            Scenario::SlowReplica,
            Scenario::FlakyReplica,
        ] {
            let o = ScenarioOptions {
                h2c,
                ..opts(3000, true)
            };
            let r = run(s, &o).await.unwrap();
            let w = col(&r, "weir");
            let what = format!("{} (h2c {h2c})", s.name());
            assert_eq!(w.observed.requests, 3000, "{what}");
            assert!(w.success() >= 99.5, "{what}: success {:.2} %", w.success());
            assert!(
                w.amplification() <= 1.05,
                "{what}: amplification {:.3}",
                w.amplification()
            );
            let served = w.replicas.clone().unwrap();
            assert!(served[0] <= 150, "{what}: the bad replica got {served:?}");
            if s == Scenario::SlowReplica {
                let p99 = w.observed.percentile(0.99);
                assert!(p99 < Duration::from_millis(200), "{what}: p99 {p99:?}");
            }
        }
    }
}

/// `weir chaos overload` runs and reports what it measured: every level in
/// order with every column, counts that add up, the fixed limit at 1024,
/// the adaptive limit within its bounds, the halving phase. Only what a
/// slow or busy machine cannot change is asserted here. The issue's
/// targets (goodput ≥ 90 % of the capacity and p99 ≤ 2× unloaded at 2×
/// and 4×, ≤ 0.1 % refused at 0.5×, a halving followed within 5 s) are
/// timed figures: they are asserted deterministically on the simulated
/// upstream (`src/policy/adaptive_sim.rs`,
/// `the_overload_scenario_meets_the_targets_in_the_simulation`) and
/// measured on real sockets by `bench/overload-gate.sh` on a release build
/// (docs/reference/admission.md#adaptive-limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_reports_every_level_and_column_within_the_limits_bounds() {
    use weir::cli::chaos::overload::{measure_all, Shape, ADAPTIVE_COLUMN, FIXED, NO_WEIR};
    let _one = serial().await;
    // 40 ms (500/s) rather than the scenario's 20: a debug build on two
    // shared cores drives 2000/s more easily than 4000/s.
    let shape = Shape {
        service: Duration::from_millis(40),
        levels: vec![0.5, 4.0],
        step: Duration::from_secs(2),
        halving: Some((Duration::from_secs(3), Duration::from_secs(1))),
        ..Shape::default()
    };
    let r = measure_all(&shape, &opts(0, false)).await.unwrap();
    let table = weir::cli::chaos::overload_table::table(&r);
    // Shown with --nocapture.
    eprintln!("{table}");
    let loads: Vec<f64> = r.levels.iter().map(|l| l.load).collect();
    assert_eq!(loads, [0.5, 4.0]);
    for l in &r.levels {
        let names: Vec<&str> = l.cells.iter().map(|c| c.column.as_str()).collect();
        assert_eq!(names, [NO_WEIR, FIXED, ADAPTIVE_COLUMN], "{table}");
        let planned = (shape.capacity() * l.load * shape.step.as_secs_f64()).round() as u64;
        for c in &l.cells {
            let what = format!("{} at {}×\n{table}", c.column, l.load);
            let o = &c.observed;
            assert!(o.requests > 0 && o.requests <= planned, "{what}");
            assert!(o.successes <= o.requests, "{what}");
            assert!(c.timed_out() <= o.requests, "{what}");
            assert_eq!(c.answered().len() as u64, o.successes, "{what}");
            match c.column.as_str() {
                NO_WEIR => assert!(c.refusals.is_none() && c.limits.is_empty(), "{what}"),
                FIXED => {
                    assert!(c.limits.iter().all(|&(_, n)| n == 1024), "{what}");
                }
                _ => {
                    assert!(!c.limits.is_empty(), "{what}");
                    // min_limit 3, the ceiling max_in_flight 1024.
                    assert!(
                        c.limits.iter().all(|&(_, n)| (3..=1024).contains(&n)),
                        "{what}"
                    );
                }
            }
            if c.column != NO_WEIR {
                assert!(c.refusals.is_some_and(|n| n <= o.requests), "{what}");
            }
        }
    }
    // At 0.5× no more than 250 requests can be in flight (250/s, each
    // given up after 1 s): the fixed limit of 1024 refuses none.
    assert_eq!(r.cell(0.5, FIXED).unwrap().refusals, Some(0), "{table}");
    // At 4× the adaptive limit starts at 12 while 2000 requests a second
    // arrive for 40 ms each: it refuses.
    let four = r.cell(4.0, ADAPTIVE_COLUMN).unwrap();
    assert!(four.refusals.unwrap() > 0, "{table}");
    let h = r.halving.as_ref().unwrap();
    assert_eq!((h.at, h.slots_after), (Duration::from_secs(1), 10));
    assert!(h.cell.limits.iter().any(|&(t, _)| t > h.at), "{table}");
    assert_eq!(h.per_second().len(), 3, "{table}");
    // What the upstream really serves: no more than slots / service, and
    // not far below it (a 40 ms sleep takes 41–42 ms).
    let m = r.measured.unwrap();
    assert!(
        m > 0.5 * shape.capacity() && m <= 1.02 * shape.capacity(),
        "{m} {table}"
    );
    assert!(table.contains("measured capacity"), "{table}");
    let json = weir::cli::chaos::overload_table::json(&r);
    assert_eq!(json["levels"].as_array().map(Vec::len), Some(2));
    assert_eq!(json["measured_capacity_per_sec"].as_f64(), Some(m));
}

/// `weir chaos overload-shed`, one level of 2 s at 4×: with client-side
/// throttling weir refuses some of the load itself and the upstream
/// refuses fewer than without it. How much fewer (at most half) and that
/// goodput holds (≥ 90 % of the unthrottled column's) are timed figures:
/// `bench/overload-gate.sh` measures them on a release build, and the
/// policy core's property test
/// (`what_reaches_the_upstream_settles_near_k_times_its_capacity` in
/// `src/policy/throttle.rs`) asserts what they follow from: what reaches a
/// shedding upstream settles near K × its capacity, never below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_takes_the_refused_load_off_a_shedding_upstream() {
    use weir::cli::chaos::shed::{measure_all, ShedShape, THROTTLED, UNTHROTTLED};
    let _one = serial().await;
    // 40 ms (500/s) rather than 20: a debug build on two shared cores.
    let shape = ShedShape {
        service: Duration::from_millis(40),
        levels: vec![4.0],
        step: Duration::from_secs(2),
        ..ShedShape::default()
    };
    let r = measure_all(&shape, &opts(0, true)).await.unwrap();
    let table = weir::cli::chaos::shed::table(&r);
    eprintln!("{table}");
    let (off, on) = (
        r.cell(4.0, UNTHROTTLED).unwrap(),
        r.cell(4.0, THROTTLED).unwrap(),
    );
    assert!(on.throttled.unwrap_or(0) > 0, "{table}");
    assert_eq!(off.throttled, Some(0), "{table}");
    // Without throttling the upstream refuses about 3× its capacity a
    // second (plus retries); with it, about 1×.
    assert!(on.shed < off.shed, "{table}");
    // Bounded: it stops by itself once the level has been offered.
    for c in [off, on] {
        assert!(
            c.observed.requests > 0 && c.observed.requests <= 4000,
            "{table}"
        );
        assert!(c.shed <= c.received, "{table}");
    }
}

/// `weir chaos slow-readers`, shortened: 4 slow readers and 4 slow
/// uploaders beside an app at 20 requests/s, on both limits. Every request
/// of the app gets through on both, and the report has its rows. (What it
/// rests on, that slow clients hold no adaptive place, is tested in
/// tests/admission.rs, which fails on 6790b03.) The full scenario's
/// figures are in bench/RESULTS.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_leave_the_app_its_requests_on_both_limits() {
    use weir::cli::chaos::slow_readers::{measure_all, SlowShape, ADAPTIVE_COLUMN, FIXED};
    let _one = serial().await;
    let shape = SlowShape {
        length: Duration::from_secs(6),
        attack_at: Duration::from_secs(2),
        readers: 4,
        uploaders: 4,
        // The adaptive limit's floor (3) below the attackers: held by
        // them, it would refuse the app.
        ..SlowShape::default()
    };
    let r = measure_all(&shape, &opts(0, true)).await.unwrap();
    let table = weir::cli::chaos::slow_readers::table(&r);
    eprintln!("{table}");
    for column in [FIXED, ADAPTIVE_COLUMN] {
        let c = r.cells.iter().find(|c| c.column == column).unwrap();
        let (ok, n) = c.success(true);
        assert!(n > 50, "{table}");
        assert_eq!(ok, n, "{column}: {table}");
        assert!(c.read > 0, "the readers read: {table}");
    }
    assert!(table.contains("limit at the end"), "{table}");
}
