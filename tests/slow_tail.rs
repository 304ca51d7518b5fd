//! The gate of hedging (docs/reference/hedging.md#hedging): `weir chaos
//! slow-tail` — three replicas answering in 2–5 ms, any request taking 1 s
//! with probability 2 % — through weir with `after = "p95"` has p99 ≤ 30 ms
//! and p99.9 ≤ 60 ms at ≤ 1.06 upstream attempts per request, where weir
//! without hedging has both at about 1 s. 10,000 requests after a warm-up:
//! p99.9 is the 10th slowest, and about 4 in 10,000 are slow twice over (the
//! hedge drew a 1 s answer too), so fewer requests would make the gate a
//! coin toss. In a binary of its own, so that `cargo test` runs nothing
//! beside it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;
use weir::cli::chaos::{run, Scenario, ScenarioOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedging_cuts_the_slow_tail() {
    let opts = ScenarioOptions {
        requests: Some(10_000),
        seed: 7,
        weir_only: true,
        ..ScenarioOptions::default()
    };
    let r = run(Scenario::SlowTail, &opts).await.unwrap();
    let table = weir::cli::chaos::report::table(&r);
    let plain = r.columns.iter().find(|c| c.name == "weir").expect(&table);
    let hedged = r
        .columns
        .iter()
        .find(|c| c.name.contains("hedging"))
        .expect(&table);
    assert_eq!(hedged.observed.successes, 10_000, "{table}");
    // Without hedging, the tail is the slow replies'.
    assert!(
        plain.observed.percentile(0.99) >= Duration::from_millis(900),
        "{table}"
    );
    let p99 = hedged.observed.percentile(0.99);
    let p999 = hedged.observed.percentile(0.999);
    assert!(p99 <= Duration::from_millis(30), "p99 {p99:?}\n{table}");
    assert!(p999 <= Duration::from_millis(60), "p99.9 {p999:?}\n{table}");
    let per_request = hedged.upstream_attempts as f64 / 10_000.0;
    assert!(per_request <= 1.06, "{per_request}\n{table}");
    let won = hedged
        .hedges
        .as_ref()
        .and_then(|h| h.get("won").copied())
        .unwrap_or(0.0);
    assert!(won >= 20.0, "{table}");
}
