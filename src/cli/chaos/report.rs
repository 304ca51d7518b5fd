//! The `weir chaos` report: one table, three columns side by side, or the
//! same as JSON.

use super::timeline::{first_success_after, per_second, to_success};
use super::{Column, ScenarioReport};
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
pub fn rows(r: &ScenarioReport) -> Vec<(String, Vec<String>)> {
    let late = r.deadline + Duration::from_millis(50);
    let cell = |f: &dyn Fn(&Column) -> String| r.columns.iter().map(f).collect::<Vec<_>>();
    if let Some(mut rows) = super::double_submit::rows(r) {
        rows.push(("breaker transitions".into(), cell(&|c| map(&c.transitions))));
        rows.push(("retry stops".into(), cell(&|c| map(&c.stops))));
        return rows;
    }
    let mut rows = vec![
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
            "attempts refused at connect".into(),
            cell(&|c| c.refused.to_string()),
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
    ];
    // This scenario's own rows, after the client's successes.
    let mut own = super::catalogue::rows(r);
    own.extend(super::replicas::row(r));
    own.extend(tail_rows(r));
    rows.splice(2..2, own);
    if r.columns.iter().any(|c| c.cache.is_some()) {
        rows.push(("cache results".into(), cell(&|c| map(&c.cache))));
    }
    if r.columns.iter().any(|c| c.back.is_some()) {
        let after =
            |d: Option<Duration>| d.map(secs).unwrap_or_else(|| "not within the run".into());
        rows.push((
            "upstream recovery to ≥ 95 % success".into(),
            cell(&|c| {
                after(
                    c.back
                        .and_then(|b| to_success(&c.observed.records, b, 95.0)),
                )
            }),
        ));
        rows.push((
            "first success after the upstream is back".into(),
            cell(&|c| {
                after(
                    c.back
                        .and_then(|b| first_success_after(&c.observed.records, b)),
                )
            }),
        ));
    }
    rows
}

/// `1 time`, `3 times`.
fn count(n: u64, what: &str) -> String {
    if n == 1 {
        format!("{n} {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Success per second of the run, one line per column (scenarios with an
/// outage only).
fn per_second_table(r: &ScenarioReport) -> Option<String> {
    if r.columns.iter().all(|c| c.back.is_none()) {
        return None;
    }
    let lines: Vec<(&str, Vec<Option<f64>>)> = r
        .columns
        .iter()
        .map(|c| (c.name, per_second(&c.observed.records)))
        .collect();
    let n = lines.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "success per second, % of the requests sent in that second:\n"
    );
    let heads: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let _ = writeln!(out, "| second | {} |", heads.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(n));
    for (name, v) in lines {
        let cells: Vec<String> = (0..n)
            .map(|i| match v.get(i).copied().flatten() {
                Some(p) => format!("{p:.0}"),
                None => "—".into(),
            })
            .collect();
        let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
    }
    Some(out)
}

/// The table, in Markdown (readable in a terminal, pastable in bench/RESULTS.md).
pub fn table(r: &ScenarioReport) -> String {
    if let Some(o) = &r.slow {
        return super::slow_readers::table(o);
    }
    if let Some(o) = &r.shed {
        return super::shed::table(o);
    }
    if let Some(o) = &r.overload {
        return super::overload_table::table(o);
    }
    let mut out = String::new();
    let _ = writeln!(out, "scenario: {} (seed {})\n", r.scenario.name(), r.seed);
    let heads: Vec<&str> = r.columns.iter().map(|c| c.name).collect();
    let _ = writeln!(out, "| | {} |", heads.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(heads.len()));
    for (label, cells) in rows(r) {
        let _ = writeln!(out, "| {label} | {} |", cells.join(" | "));
    }
    if let Some(t) = per_second_table(r) {
        let _ = writeln!(out, "\n{t}");
    }
    let b = &r.breaker;
    let opens = r
        .columns
        .iter()
        .filter_map(|c| c.transitions.as_ref())
        .filter_map(|t| t.get("open"))
        .sum::<f64>();
    if b.half_opens > 0 || b.recovery.is_some() {
        let _ = writeln!(
            out,
            "\nweir's breaker: opened {}; half-open {} ({} allowed at a time), with {} in them; {} while open{}",
            count(opens as u64, "time"),
            count(b.half_opens, "time"),
            count(u64::from(r.half_open_probes), "probe"),
            count(b.attempts_while_half_open, "upstream attempt"),
            count(b.attempts_while_open, "upstream attempt"),
            b.recovery
                .map(|d| format!("; closed {} after the upstream recovered", ms(d)))
                .unwrap_or_default()
        );
    }
    let stories = [super::double_submit::story(r), super::catalogue::story(r)];
    for story in stories.into_iter().flatten() {
        let _ = writeln!(out, "\n{story}");
    }
    let _ = writeln!(out, "\n{}", settings_note(r));
    out
}

/// What weir ran with: its default policy, the scenario's settings and the
/// merged file.
fn settings_note(r: &ScenarioReport) -> String {
    let mut out = String::from("weir's policy: the defaults");
    if r.settings.is_empty() {
        out.push_str(" (this scenario sets nothing)");
    } else {
        let _ = write!(
            out,
            ", with this scenario's settings:\n\n```toml\n{}```",
            r.settings
        );
    }
    if let Some(p) = &r.merged {
        let _ = write!(
            out,
            "\n\nmerged over them: the `[defaults]` table of {}",
            p.display()
        );
    }
    out.push('\n');
    out
}

/// The same as JSON.
pub fn json(r: &ScenarioReport) -> serde_json::Value {
    if let Some(o) = &r.slow {
        return super::slow_readers::json(o);
    }
    if let Some(o) = &r.shed {
        return super::shed::json(o);
    }
    if let Some(o) = &r.overload {
        return super::overload_table::json(o);
    }
    let late = r.deadline + Duration::from_millis(50);
    let cols: Vec<serde_json::Value> = r
        .columns
        .iter()
        .map(|c| {
            let mut v = serde_json::json!({
                "name": c.name,
                "client_requests": c.observed.requests,
                "client_successes": c.observed.successes,
                "success_percent": c.success(),
                "upstream_attempts": c.upstream_attempts,
                "requests_per_replica": c.replicas,
                "attempts_refused_at_connect": c.refused,
                "amplification": c.amplification(),
                "p50_ms": c.observed.percentile(0.50).as_secs_f64() * 1000.0,
                "p99_ms": c.observed.percentile(0.99).as_secs_f64() * 1000.0,
                "max_ms": c.observed.latencies.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
                "later_than_deadline": c.observed.later_than(late),
                "duplicate_deliveries": c.duplicates,
                "breaker_transitions": c.transitions,
                "retry_stops": c.stops,
                "upstream_back_ms": c.back.map(|d| d.as_millis() as u64),
                "recovery_to_95_percent_ms": c.back
                    .and_then(|b| to_success(&c.observed.records, b, 95.0))
                    .map(|d| d.as_millis() as u64),
                "first_success_after_back_ms": c.back
                    .and_then(|b| first_success_after(&c.observed.records, b))
                    .map(|d| d.as_millis() as u64),
                "success_per_second": per_second(&c.observed.records),
            });
            if let Some(rs) = c.resends {
                v["resends"] = serde_json::to_value(rs).unwrap_or_default();
            }
            if let Some(cache) = &c.cache {
                v["cache_results"] = serde_json::to_value(cache).unwrap_or_default();
            }
            if let Some(o) = super::catalogue::json(r, c) {
                v["catalogue"] = o;
            }
            v
        })
        .collect();
    serde_json::json!({
        "scenario": r.scenario.name(),
        "seed": r.seed,
        "deadline_ms": r.deadline.as_millis() as u64,
        "scenario_settings": r.settings,
        "merged_config": r.merged.as_ref().map(|p| p.display().to_string()),
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

/// `slow-tail`'s own rows: p99.9, and the hedges.
fn tail_rows(r: &ScenarioReport) -> Vec<(String, Vec<String>)> {
    if r.scenario != super::Scenario::SlowTail {
        return Vec::new();
    }
    let cell = |f: &dyn Fn(&super::Column) -> String| r.columns.iter().map(f).collect::<Vec<_>>();
    vec![
        (
            "p99.9 latency".into(),
            cell(&|c| ms(c.observed.percentile(0.999))),
        ),
        (
            "hedges".into(),
            cell(&|c| match &c.hedges {
                Some(h) => map(&Some(h.clone())),
                None => "—".into(),
            }),
        ),
    ]
}
