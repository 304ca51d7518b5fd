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

use super::driver::{drive, Observed, Target};
use super::levels::{self, FigureRow, LevelCell, LoadLevel};
use super::upstream::{ChaosUpstream, Profile};
use super::ScenarioOptions;
use std::net::SocketAddr;
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
        levels::capacity(self.slots, self.service)
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

impl LevelCell for ShedCell {
    fn column(&self) -> &str {
        &self.column
    }
}

/// What `weir chaos overload-shed` measured.
#[derive(Debug, Clone)]
pub struct ShedReport {
    pub shape: ShedShape,
    pub levels: Vec<LoadLevel<ShedCell>>,
}

impl ShedReport {
    /// The cell of `column` at `load`.
    pub fn cell(&self, load: f64, column: &str) -> Option<&ShedCell> {
        levels::find(&self.levels, load, column)
    }
}

/// The upstream: `shape`'s slots and service time, shedding past them.
pub fn profile(shape: &ShedShape) -> Profile {
    levels::capacity_profile(shape.slots, shape.service, None, Some(shape.status))
}

/// One column at `rate` requests a second, on a fresh upstream.
async fn measure(
    shape: &ShedShape,
    opts: &ScenarioOptions,
    column: &'static str,
    rate: f64,
) -> Result<ShedCell, String> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let up = levels::start_upstream(any, profile(shape), opts.seed).await?;
    let load = levels::open_load(rate, shape.step, shape.client_timeout);
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
    let (proxy, state) = levels::start_weir(&up, opts, extra).await?;
    let target = Target::Weir {
        addr: proxy.listen_addr(),
        host: "chaos".into(),
    };
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
    let levels = levels::drive_levels(&shape.levels, columns.len(), |_, load, c| {
        measure(shape, opts, columns[c], shape.capacity() * load)
    })
    .await?;
    Ok(ShedReport {
        shape: shape.clone(),
        levels,
    })
}

/// `weir chaos overload-shed`, as a scenario report.
pub async fn run(opts: &ScenarioOptions) -> Result<super::ScenarioReport, String> {
    let report = measure_all(&ShedShape::default(), opts).await?;
    Ok(super::ScenarioReport {
        shed: Some(report),
        ..levels::scenario_report(super::Scenario::OverloadShed, opts, THROTTLE)?
    })
}

/// The table, in Markdown.
pub fn table(r: &ShedReport) -> String {
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
    levels::write_head(&mut out, &r.levels);
    for l in &r.levels {
        let rows: [FigureRow<'_, ShedCell>; 4] = [
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
        levels::write_level(&mut out, l, cap, &rows);
    }
    out
}

/// The same as JSON.
pub fn json(r: &ShedReport) -> serde_json::Value {
    let per_level = levels::levels_json(&r.levels, |c| {
        serde_json::json!({
            "column": c.column,
            "requests": c.observed.requests,
            "upstream_received_per_sec": c.received_per_sec(),
            "upstream_refused_per_sec": c.shed_per_sec(),
            "goodput_per_sec": c.goodput(),
            "throttled": c.throttled,
        })
    });
    serde_json::json!({
        "scenario": "overload-shed",
        "slots": r.shape.slots,
        "service_ms": r.shape.service.as_secs_f64() * 1000.0,
        "status": r.shape.status,
        "capacity_per_sec": r.shape.capacity(),
        "levels": per_level,
    })
}
