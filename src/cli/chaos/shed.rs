//! `weir chaos overload-shed` (docs/reference/admission.md#client-side-throttling):
//! the overload upstream's sibling that **sheds** instead of queueing —
//! `slots` requests served at once, each for `service`, and a request that
//! finds every slot taken answered `503` at once (no `Retry-After`, so
//! weir's default policy retries it, within its budget). Driven open loop
//! at 2× and 4× its capacity by an app that gives up after
//! `client_timeout`, each level on a fresh upstream and a fresh weir.
//! Three columns: no weir, weir on its default policy (no throttling), and
//! weir with `[upstreams.chaos.throttle] enabled = true`. Rows per level:
//! what the upstream received and what it refused, per second; goodput (2xx
//! answers within the app's timeout, per second); and what weir's
//! throttle refused (503 `overloaded`, never sent). The targets are
//! checked on a release build by `bench/overload-gate.sh`; `tests/chaos.rs`
//! checks what no timing can change.
//!
//! What a shed costs the upstream is not modelled (it answers at once), so
//! what this shows is the load taken off it, not goodput gained.

use super::driver::{drive, Load, Mode, Observed, Target};
use super::upstream::{Capacity, ChaosUpstream, Latency, Profile};
use super::ScenarioOptions;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use http::Method;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The throttling column's setting over weir's defaults.
pub const THROTTLE: &str = "[upstreams.chaos.throttle]\nenabled = true\n";

/// The three columns.
pub const SHED_NO_WEIR: &str = "no weir";
pub const UNTHROTTLED: &str = "weir, no throttling (default)";
pub const THROTTLED: &str = "weir, throttling";

/// What the scenario runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ShedShape {
    /// Requests the upstream serves at once; the rest are refused.
    pub slots: u32,
    /// How long each takes.
    pub service: Duration,
    /// What a refusal answers.
    pub status: u16,
    /// The app's timeout for a whole request.
    pub client_timeout: Duration,
    /// Offered load, as multiples of the capacity.
    pub levels: Vec<f64>,
    /// How long each level offers its load.
    pub step: Duration,
}

impl Default for ShedShape {
    fn default() -> Self {
        ShedShape {
            slots: 20,
            service: Duration::from_millis(20),
            status: 503,
            client_timeout: Duration::from_secs(1),
            levels: vec![2.0, 4.0],
            step: Duration::from_secs(3),
        }
    }
}

impl ShedShape {
    /// Requests per second the upstream serves.
    pub fn capacity(&self) -> f64 {
        f64::from(self.slots) / self.service.as_secs_f64()
    }
}

/// One column at one level.
#[derive(Debug, Clone)]
pub struct ShedCell {
    pub column: String,
    pub observed: Observed,
    pub step: Duration,
    /// Requests that reached the upstream (retries included).
    pub received: u64,
    /// Those it refused.
    pub shed: u64,
    /// weir's throttle's refusals (`None`: no weir).
    pub throttled: Option<u64>,
}

impl ShedCell {
    fn per_sec(&self, n: u64) -> f64 {
        n as f64 / self.step.as_secs_f64()
    }

    /// Requests the upstream received, per second.
    pub fn received_per_sec(&self) -> f64 {
        self.per_sec(self.received)
    }

    /// Requests the upstream refused, per second.
    pub fn shed_per_sec(&self) -> f64 {
        self.per_sec(self.shed)
    }

    /// 2xx answers within the app's timeout, per second.
    pub fn goodput(&self) -> f64 {
        self.per_sec(self.observed.successes)
    }
}

/// One load level: its cells, in column order.
#[derive(Debug, Clone)]
pub struct ShedLevel {
    pub load: f64,
    pub cells: Vec<ShedCell>,
}

/// What `weir chaos overload-shed` measured.
#[derive(Debug, Clone)]
pub struct ShedReport {
    pub shape: ShedShape,
    pub levels: Vec<ShedLevel>,
}

impl ShedReport {
    /// The cell of `column` at `load`.
    pub fn cell(&self, load: f64, column: &str) -> Option<&ShedCell> {
        self.levels
            .iter()
            .find(|l| (l.load - load).abs() < 1e-9)?
            .cells
            .iter()
            .find(|c| c.column == column)
    }
}

/// The upstream: `shape`'s slots and service time, shedding past them.
pub fn profile(shape: &ShedShape) -> Profile {
    Profile {
        latency: Latency::Fixed(shape.service),
        capacity: Some(Capacity {
            slots: shape.slots,
            halve_at: None,
            shed: Some(shape.status),
        }),
        ..Profile::default()
    }
}

/// One column at `rate` requests a second, on a fresh upstream.
async fn measure(
    shape: &ShedShape,
    opts: &ScenarioOptions,
    column: &'static str,
    rate: f64,
) -> Result<ShedCell, String> {
    let up = ChaosUpstream::start(
        "127.0.0.1:0".parse().map_err(|_| "addr")?,
        profile(shape),
        opts.seed,
    )
    .await
    .map_err(|e| format!("cannot start the chaos upstream: {e}"))?;
    let load = Load {
        requests: (rate * shape.step.as_secs_f64()).round() as usize,
        mode: Mode::Open(rate),
        max_time: shape.step,
        method: Method::GET,
        client_timeout: shape.client_timeout,
        keys: None,
    };
    let counts = |up: &ChaosUpstream| {
        (
            up.counters.received(),
            up.counters.shed.load(std::sync::atomic::Ordering::Relaxed),
        )
    };
    if column == SHED_NO_WEIR {
        let observed = drive(Target::Direct(up.addr), load).await;
        let (received, shed) = counts(&up);
        return Ok(ShedCell {
            column: column.into(),
            observed,
            step: shape.step,
            received,
            shed,
            throttled: None,
        });
    }
    let extra = if column == THROTTLED { THROTTLE } else { "" };
    let cfg = super::overload::config(&up, opts, extra)?;
    let metrics = Arc::new(Metrics::new());
    let proxy = Proxy::start_with(cfg, metrics)
        .await
        .map_err(|e| e.to_string())?;
    let target = Target::Weir {
        addr: proxy.listen_addr(),
        host: "chaos".into(),
    };
    let state = proxy
        .snapshot()
        .upstreams
        .first()
        .map(|u| u.state.clone())
        .ok_or("no upstream state")?;
    let observed = drive(target, load).await;
    let (received, shed) = counts(&up);
    let throttled = state.throttle.view().map_or(0, |v| v.refusals);
    proxy.shutdown(Duration::from_secs(1)).await;
    Ok(ShedCell {
        column: column.into(),
        observed,
        step: shape.step,
        received,
        shed,
        throttled: Some(throttled),
    })
}

/// Runs every level, each column on a fresh upstream and weir.
pub async fn measure_all(shape: &ShedShape, opts: &ScenarioOptions) -> Result<ShedReport, String> {
    let columns: &[&'static str] = if opts.weir_only {
        &[UNTHROTTLED, THROTTLED]
    } else {
        &[SHED_NO_WEIR, UNTHROTTLED, THROTTLED]
    };
    let mut levels = Vec::new();
    for &load in &shape.levels {
        let mut cells = Vec::new();
        for &c in columns {
            cells.push(measure(shape, opts, c, shape.capacity() * load).await?);
        }
        levels.push(ShedLevel { load, cells });
    }
    Ok(ShedReport {
        shape: shape.clone(),
        levels,
    })
}

/// `weir chaos overload-shed`, as a scenario report.
pub async fn run(opts: &ScenarioOptions) -> Result<super::ScenarioReport, String> {
    let report = measure_all(&ShedShape::default(), opts).await?;
    let probe = Config::parse(
        &PathBuf::from("<chaos overload-shed>"),
        "[upstreams.chaos]\nurl = \"http://127.0.0.1:9\"\nhosts = [\"chaos\"]\n",
    )
    .map_err(|e| e.to_string())?;
    let up_cfg = probe.upstreams.first().ok_or("no upstream")?.clone();
    Ok(super::ScenarioReport {
        scenario: super::Scenario::OverloadShed,
        seed: opts.seed,
        deadline: up_cfg.timeout,
        settings: THROTTLE,
        merged: opts.config.clone(),
        half_open_probes: up_cfg.breaker.half_open_probes,
        columns: Vec::new(),
        breaker: super::BreakerTrace::default(),
        overload: None,
        shed: Some(report),
    })
}

/// The table, in Markdown.
pub fn table(r: &ShedReport) -> String {
    use std::fmt::Write as _;
    let s = &r.shape;
    let cap = s.capacity();
    let mut out = format!(
        "scenario: overload-shed — an upstream serving {} requests at once for {} ms each (capacity {cap:.0}/s) and answering {} at once past that, the app's timeout {} s, {} s per level\n\n",
        s.slots,
        s.service.as_millis(),
        s.status,
        s.client_timeout.as_secs_f64(),
        s.step.as_secs_f64()
    );
    let heads: Vec<&str> = r
        .levels
        .first()
        .map(|l| l.cells.iter().map(|c| c.column.as_str()).collect())
        .unwrap_or_default();
    let _ = writeln!(out, "| load | | {} |", heads.join(" | "));
    let _ = writeln!(out, "|---|---|{}", "---|".repeat(heads.len()));
    type Row<'a> = (&'a str, &'a dyn Fn(&ShedCell) -> String);
    for l in &r.levels {
        let load = format!("{}× ({:.0}/s)", l.load, cap * l.load);
        let rows: [Row<'_>; 4] = [
            ("upstream received", &|c| {
                format!("{:.0}/s", c.received_per_sec())
            }),
            ("upstream refused", &|c| {
                format!("{:.0}/s", c.shed_per_sec())
            }),
            ("goodput", &|c| {
                format!("{:.0}/s ({:.0} %)", c.goodput(), c.goodput() * 100.0 / cap)
            }),
            ("refused by weir (throttle)", &|c| match c.throttled {
                None => "—".into(),
                Some(n) => format!("{:.0}/s", c.per_sec(n)),
            }),
        ];
        for (i, (label, f)) in rows.iter().enumerate() {
            let first = if i == 0 { load.as_str() } else { "" };
            let cells: Vec<String> = l.cells.iter().map(f).collect();
            let _ = writeln!(out, "| {first} | {label} | {} |", cells.join(" | "));
        }
    }
    out
}

/// The same as JSON.
pub fn json(r: &ShedReport) -> serde_json::Value {
    let levels: Vec<serde_json::Value> = r
        .levels
        .iter()
        .map(|l| {
            let cells: Vec<serde_json::Value> = l
                .cells
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "column": c.column,
                        "requests": c.observed.requests,
                        "upstream_received_per_sec": c.received_per_sec(),
                        "upstream_refused_per_sec": c.shed_per_sec(),
                        "goodput_per_sec": c.goodput(),
                        "throttled": c.throttled,
                    })
                })
                .collect();
            serde_json::json!({ "load": l.load, "cells": cells })
        })
        .collect();
    serde_json::json!({
        "scenario": "overload-shed",
        "slots": r.shape.slots,
        "service_ms": r.shape.service.as_secs_f64() * 1000.0,
        "status": r.shape.status,
        "capacity_per_sec": r.shape.capacity(),
        "levels": levels,
    })
}
