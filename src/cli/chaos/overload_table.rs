//! `weir chaos overload`'s report: the table (Markdown) and the JSON of an
//! [`OverloadReport`] (the scenario itself is `super::overload`).

use super::levels::{self, FigureRow};
use super::overload::*;
use std::time::Duration;

fn ms(d: Option<Duration>) -> String {
    match d {
        None => "—".into(),
        Some(d) => format!("{:.1} ms", d.as_secs_f64() * 1000.0),
    }
}

/// The table, in Markdown.
pub fn table(r: &OverloadReport) -> String {
    use std::fmt::Write as _;
    let s = &r.shape;
    let cap = s.capacity();
    let mut out = format!(
        "scenario: overload — an upstream serving {} requests at once for {} ms each (capacity {cap:.0}/s, the rest queued), the app's timeout {} s, {} s per level\n\n",
        s.slots,
        s.service.as_millis(),
        s.client_timeout.as_secs_f64(),
        s.step.as_secs_f64()
    );
    if let Some(m) = r.measured {
        let _ = writeln!(
            out,
            "measured capacity {m:.0}/s ({} clients straight to the upstream, back to back, {} s: what a slot really takes beyond {} ms); goodput's percentages are of the nominal {cap:.0}/s\n",
            s.slots,
            CALIBRATION.as_secs(),
            s.service.as_millis(),
        );
    }
    levels::write_head(&mut out, &r.levels);
    for l in &r.levels {
        let rows: [FigureRow<'_, Cell>; 5] = [
            ("goodput", &|c| {
                format!("{:.0}/s ({:.0} %)", c.goodput(), c.goodput() * 100.0 / cap)
            }),
            ("p50 answered", &|c| ms(c.percentile(0.50))),
            ("p99 answered", &|c| ms(c.percentile(0.99))),
            ("refused", &|c| match c.refusals {
                None => "—".into(),
                Some(n) => format!("{n} ({:.1} %)", c.refused_percent()),
            }),
            ("client gave up", &|c| {
                format!("{} of {}", c.timed_out(), c.observed.requests)
            }),
        ];
        levels::write_level(&mut out, l, cap, &rows);
        let limits: Vec<String> = l
            .cells
            .iter()
            .map(|c| match (c.column.as_str(), c.settled_limit()) {
                (ADAPTIVE_COLUMN, Some(n)) => n.to_string(),
                _ => "—".into(),
            })
            .collect();
        let _ = writeln!(
            out,
            "| | adaptive limit (second half) | {} |",
            limits.join(" | ")
        );
    }
    let vias: Vec<&str> = r
        .levels
        .first()
        .map(|l| {
            l.cells
                .iter()
                .filter(|c| ![NO_WEIR, FIXED, ADAPTIVE_COLUMN].contains(&c.column.as_str()))
                .map(|c| c.column.as_str())
                .collect()
        })
        .unwrap_or_default();
    if !vias.is_empty() {
        let _ = writeln!(
            out,
            "\n{}: \"refused\" counts the answers other than 2xx that came before the app's timeout (the proxy's own count is in its stats); level i reached it on its address's port + i",
            vias.join(", ")
        );
    }
    if let Some(h) = &r.halving {
        let _ = writeln!(
            out,
            "\nhalving: weir adaptive at {:.0}/s (2×); the upstream's slots go from {} to {} at {} s; the limit is at or below {:.0} (1.5× the new slots) {} after it\n",
            cap * 2.0,
            s.slots,
            h.slots_after,
            h.at.as_secs_f64(),
            f64::from(h.slots_after) * 1.5,
            h.followed()
                .map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_else(|| "never".into())
        );
        let _ = writeln!(out, "| second | goodput | p99 answered | limit (median) |");
        let _ = writeln!(out, "|---|---|---|---|");
        for (i, (g, p99, l)) in h.per_second().into_iter().enumerate() {
            let l = l.map_or_else(|| "—".into(), |l| l.to_string());
            let _ = writeln!(out, "| {i} | {g:.0}/s | {} | {l} |", ms(p99));
        }
    }
    out
}

/// The same as JSON.
pub fn json(r: &OverloadReport) -> serde_json::Value {
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
    let per_level = levels::levels_json(&r.levels, |c| {
        serde_json::json!({
            "column": c.column,
            "requests": c.observed.requests,
            "goodput_per_sec": c.goodput(),
            "p50_answered_ms": ms(c.percentile(0.50)),
            "p99_answered_ms": ms(c.percentile(0.99)),
            "refused": c.refusals,
            "client_gave_up": c.timed_out(),
            "settled_limit": c.settled_limit(),
        })
    });
    serde_json::json!({
        "slots": r.shape.slots,
        "service_ms": r.shape.service.as_secs_f64() * 1000.0,
        "capacity_per_sec": r.shape.capacity(),
        "measured_capacity_per_sec": r.measured,
        "client_timeout_ms": r.shape.client_timeout.as_millis() as u64,
        "levels": per_level,
        "halving": r.halving.as_ref().map(|h| serde_json::json!({
            "at_ms": h.at.as_millis() as u64,
            "slots_after": h.slots_after,
            "followed_ms": h.followed().map(|d| d.as_millis() as u64),
            "per_second": h.per_second().into_iter().map(|(g, p, l)| serde_json::json!({
                "goodput": g, "p99_answered_ms": ms(p), "limit": l,
            })).collect::<Vec<_>>(),
        })),
    })
}
