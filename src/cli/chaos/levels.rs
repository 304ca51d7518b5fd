//! What `weir chaos overload` and `overload-shed` share, written once: an
//! upstream of a fixed capacity (`slots` served at once for `service`
//! each) driven open loop at multiples of that capacity, one load level at
//! a time, every column on a fresh upstream and a fresh weir; a report of
//! levels of cells; its Markdown table (a row per figure, the level's load
//! in its first row) and its JSON.

use super::driver::{Load, Mode};
use super::upstream::{Capacity, ChaosUpstream, Latency, Profile};
use super::{BreakerTrace, Scenario, ScenarioOptions, ScenarioReport};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::{Proxy, ProxyHandle};
use crate::state::UpstreamState;
use http::Method;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A column's figures at one load level.
pub trait LevelCell {
    /// The column's name.
    fn column(&self) -> &str;
}

/// One load level: its cells, in column order.
#[derive(Debug, Clone)]
pub struct LoadLevel<C> {
    /// Offered load as a multiple of the capacity.
    pub load: f64,
    pub cells: Vec<C>,
}

/// The cell of `column` at `load`.
pub fn find<'a, C: LevelCell>(
    levels: &'a [LoadLevel<C>],
    load: f64,
    column: &str,
) -> Option<&'a C> {
    levels
        .iter()
        .find(|l| (l.load - load).abs() < 1e-9)?
        .cells
        .iter()
        .find(|c| c.column() == column)
}

/// Requests per second of `slots` served at once for `service` each.
pub fn capacity(slots: u32, service: Duration) -> f64 {
    f64::from(slots) / service.as_secs_f64()
}

/// The upstream: `slots` of `service`, past them queueing (`shed: None`)
/// or answering `shed` at once, its slots halving at `halve_at`.
pub fn capacity_profile(
    slots: u32,
    service: Duration,
    halve_at: Option<Duration>,
    shed: Option<u16>,
) -> Profile {
    Profile {
        latency: Latency::Fixed(service),
        capacity: Some(Capacity {
            slots,
            halve_at,
            shed,
        }),
        ..Profile::default()
    }
}

/// `rate` GETs a second for `length`, open loop, the app giving up on each
/// after `client_timeout`.
pub fn open_load(rate: f64, length: Duration, client_timeout: Duration) -> Load {
    Load {
        requests: (rate * length.as_secs_f64()).round() as usize,
        mode: Mode::Open(rate),
        max_time: length,
        method: Method::GET,
        client_timeout,
        keys: None,
    }
}

/// A fresh chaos upstream on `addr` (port 0: any).
pub async fn start_upstream(
    addr: SocketAddr,
    profile: Profile,
    seed: u64,
) -> Result<ChaosUpstream, String> {
    ChaosUpstream::start(addr, profile, seed)
        .await
        .map_err(|e| format!("cannot start the chaos upstream on {addr}: {e}"))
}

/// weir's config: its defaults, `--config`'s `[defaults]` over them, one
/// upstream at `up`, and `extra`.
pub fn config(up: &ChaosUpstream, opts: &ScenarioOptions, extra: &str) -> Result<Config, String> {
    let defaults = toml::to_string(&super::config::user_defaults(opts.config.as_deref())?)
        .map_err(|e| e.to_string())?;
    let src = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n{defaults}\n[upstreams.chaos]\nurl = \"http://{}\"\nhosts = [\"chaos\"]\n{extra}",
        up.addr
    );
    Config::parse(&PathBuf::from("<chaos overload>"), &src).map_err(|e| e.to_string())
}

/// weir in process in front of `up` (its defaults plus `extra`), and its
/// one upstream's live state.
pub async fn start_weir(
    up: &ChaosUpstream,
    opts: &ScenarioOptions,
    extra: &str,
) -> Result<(ProxyHandle, Arc<UpstreamState>), String> {
    let proxy = Proxy::start_with(config(up, opts, extra)?, Arc::new(Metrics::new()))
        .await
        .map_err(|e| e.to_string())?;
    let state = proxy
        .snapshot()
        .upstreams
        .first()
        .map(|u| u.state.clone())
        .ok_or("no upstream state")?;
    Ok((proxy, state))
}

/// Every level in turn, each of its `columns` (as many as there are) in
/// turn: `measure(level's index, load, column's index)`.
pub async fn drive_levels<C, F, Fut>(
    loads: &[f64],
    columns: usize,
    mut measure: F,
) -> Result<Vec<LoadLevel<C>>, String>
where
    F: FnMut(usize, f64, usize) -> Fut,
    Fut: Future<Output = Result<C, String>>,
{
    let mut levels = Vec::with_capacity(loads.len());
    for (i, &load) in loads.iter().enumerate() {
        let mut cells = Vec::with_capacity(columns);
        for c in 0..columns {
            cells.push(measure(i, load, c).await?);
        }
        levels.push(LoadLevel { load, cells });
    }
    Ok(levels)
}

/// A scenario's report with no columns of its own: its deadline and
/// probes are weir's defaults'.
pub fn scenario_report(
    scenario: Scenario,
    opts: &ScenarioOptions,
    settings: &'static str,
) -> Result<ScenarioReport, String> {
    let probe = Config::parse(
        &PathBuf::from(format!("<chaos {}>", scenario.name())),
        "[upstreams.chaos]\nurl = \"http://127.0.0.1:9\"\nhosts = [\"chaos\"]\n",
    )
    .map_err(|e| e.to_string())?;
    let up_cfg = probe.upstreams.first().ok_or("no upstream")?.clone();
    Ok(ScenarioReport {
        scenario,
        seed: opts.seed,
        deadline: up_cfg.timeout,
        settings,
        merged: opts.config.clone(),
        half_open_probes: up_cfg.breaker.half_open_probes,
        columns: Vec::new(),
        breaker: BreakerTrace::default(),
        overload: None,
        shed: None,
        slow: None,
    })
}

/// One row of the table: its label and how a cell shows it.
pub type FigureRow<'a, C> = (&'a str, &'a dyn Fn(&C) -> String);

/// The table's head: `| load | | COLUMN | … |` and its rule.
pub fn write_head<C: LevelCell>(out: &mut String, levels: &[LoadLevel<C>]) {
    let heads: Vec<&str> = levels
        .first()
        .map(|l| l.cells.iter().map(LevelCell::column).collect())
        .unwrap_or_default();
    let _ = writeln!(out, "| load | | {} |", heads.join(" | "));
    let _ = writeln!(out, "|---|---|{}", "---|".repeat(heads.len()));
}

/// A level's rows, one per figure; the first names the level
/// (`LOAD× (RATE/s)`, `capacity` × its load).
pub fn write_level<C>(
    out: &mut String,
    level: &LoadLevel<C>,
    capacity: f64,
    rows: &[FigureRow<'_, C>],
) {
    let name = format!("{}× ({:.0}/s)", level.load, capacity * level.load);
    for (i, (label, f)) in rows.iter().enumerate() {
        let first = if i == 0 { name.as_str() } else { "" };
        let cells: Vec<String> = level.cells.iter().map(f).collect();
        let _ = writeln!(out, "| {first} | {label} | {} |", cells.join(" | "));
    }
}

/// The levels as JSON: `[{ "load", "cells": [cell(c), …] }, …]`.
pub fn levels_json<C>(
    levels: &[LoadLevel<C>],
    cell: impl Fn(&C) -> serde_json::Value,
) -> Vec<serde_json::Value> {
    levels
        .iter()
        .map(|l| {
            let cells: Vec<serde_json::Value> = l.cells.iter().map(&cell).collect();
            serde_json::json!({ "load": l.load, "cells": cells })
        })
        .collect()
}
