//! The `weir chaos` report: one table, three columns side by side, or the
//! same as JSON.

use super::{Column, Report};
use std::fmt::Write as _;
use std::time::Duration;

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

fn map(m: &Option<std::collections::BTreeMap<String, f64>>) -> String {
    match m {
        None => "—".into(),
        Some(m) => {
            let parts: Vec<String> = m
                .iter()
                .filter(|(_, v)| **v > 0.0)
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            if parts.is_empty() {
                "none".into()
            } else {
                parts.join(", ")
            }
        }
    }
}

/// The rows, as (label, one cell per column).
pub fn rows(r: &Report) -> Vec<(String, Vec<String>)> {
    let late = r.deadline + Duration::from_millis(50);
    let cell = |f: &dyn Fn(&Column) -> String| r.columns.iter().map(f).collect::<Vec<_>>();
    vec![
        (
            "client requests".into(),
            cell(&|c| c.observed.requests.to_string()),
        ),
        (
            "client successes".into(),
            cell(&|c| format!("{} ({:.2} %)", c.observed.successes, c.success())),
        ),
        (
            "upstream attempts".into(),
            cell(&|c| c.upstream_attempts.to_string()),
        ),
        (
            "amplification".into(),
            cell(&|c| format!("{:.3}", c.amplification())),
        ),
        (
            "p50 latency".into(),
            cell(&|c| ms(c.observed.percentile(0.50))),
        ),
        (
            "p99 latency".into(),
            cell(&|c| ms(c.observed.percentile(0.99))),
        ),
        (
            "max latency".into(),
            cell(&|c| ms(c.observed.latencies.last().copied().unwrap_or_default())),
        ),
        (
            format!("later than deadline ({})", ms(r.deadline)),
            cell(&|c| c.observed.later_than(late).to_string()),
        ),
        (
            "duplicate POST deliveries".into(),
            cell(&|c| c.duplicates.to_string()),
        ),
        ("breaker transitions".into(), cell(&|c| map(&c.transitions))),
        ("retry stops".into(), cell(&|c| map(&c.stops))),
    ]
}

/// The table, in Markdown (readable in a terminal, pastable in the README).
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "scenario: {} (seed {})\n", r.scenario.name(), r.seed);
    let heads: Vec<&str> = r.columns.iter().map(|c| c.name).collect();
    let _ = writeln!(out, "| | {} |", heads.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(heads.len()));
    for (label, cells) in rows(r) {
        let _ = writeln!(out, "| {label} | {} |", cells.join(" | "));
    }
    let b = &r.breaker;
    if b.half_opens > 0 || b.recovery.is_some() {
        let _ = writeln!(
            out,
            "\nweir's breaker: {} half-open probes windows, {} attempts while half-open, {} while open{}",
            b.half_opens,
            b.attempts_while_half_open,
            b.attempts_while_open,
            b.recovery
                .map(|d| format!(", closed {} after the upstream recovered", ms(d)))
                .unwrap_or_default()
        );
    }
    out
}

/// The same as JSON.
pub fn json(r: &Report) -> serde_json::Value {
    let late = r.deadline + Duration::from_millis(50);
    let cols: Vec<serde_json::Value> = r
        .columns
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name,
                "client_requests": c.observed.requests,
                "client_successes": c.observed.successes,
                "success_percent": c.success(),
                "upstream_attempts": c.upstream_attempts,
                "amplification": c.amplification(),
                "p50_ms": c.observed.percentile(0.50).as_secs_f64() * 1000.0,
                "p99_ms": c.observed.percentile(0.99).as_secs_f64() * 1000.0,
                "max_ms": c.observed.latencies.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
                "later_than_deadline": c.observed.later_than(late),
                "duplicate_deliveries": c.duplicates,
                "breaker_transitions": c.transitions,
                "retry_stops": c.stops,
            })
        })
        .collect();
    serde_json::json!({
        "scenario": r.scenario.name(),
        "seed": r.seed,
        "deadline_ms": r.deadline.as_millis() as u64,
        "columns": cols,
        "breaker": {
            "half_opens": r.breaker.half_opens,
            "attempts_while_open": r.breaker.attempts_while_open,
            "attempts_while_half_open": r.breaker.attempts_while_half_open,
            "recovery_ms": r.breaker.recovery.map(|d| d.as_millis() as u64),
            "last_open_interval_ms": r.breaker.last_open_interval.map(|d| d.as_millis() as u64),
        },
    })
}
