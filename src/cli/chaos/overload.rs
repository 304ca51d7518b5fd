//! `weir chaos overload` (docs/reference/admission.md#adaptive-limit): an
//! upstream with a fixed capacity — `slots` requests served at once, each
//! for `service`, the rest queued and served in turn even after their
//! client has left, as a thread pool's queue is — driven open loop at
//! 0.5×, 1×, 2× and 4× its capacity (`slots / service` requests a second)
//! by an app that gives up on a request after `client_timeout`. Three
//! columns, each level on a fresh upstream (and a fresh weir): no weir,
//! weir on its default fixed limit (`max_in_flight = 1024`), and weir with
//! `limit = "adaptive"`. Rows per level: goodput (2xx answers within the
//! client's timeout, per second of offered load), p50/p99 of those,
//! weir's refusals (503 `overloaded`) and the requests the client gave up
//! on.
//!
//! A second phase runs the adaptive column alone at 2× the capacity and
//! halves the upstream's slots part-way through: how long the limit takes
//! to follow. The targets are checked on a release build by
//! `bench/overload-gate.sh` (and asserted on the simulated upstream in
//! `policy::adaptive_sim`); `tests/chaos.rs` checks the report's shape.
//!
//! `--via NAME=PROXY,UPSTREAM` adds a column for a proxy that is already
//! running (`bench/overload.sh` runs Envoy's adaptive concurrency filter
//! this way): the same driver sends each level's load to it, and that
//! level's fresh upstream listens where the proxy forwards. Level `i` (from
//! 0, in the order of `levels`) uses PROXY's port + `i` and UPSTREAM's
//! port + `i`, so the proxy can give each level a listener, and a
//! controller, of its own, as weir's columns get a fresh weir per level.

use super::driver::{drive, Observed, Target};
use super::levels::{self, LevelCell, LoadLevel};
use super::upstream::Profile;
use super::ScenarioOptions;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The adaptive column's setting over weir's defaults.
pub const ADAPTIVE: &str = "[upstreams.chaos.concurrency]\nlimit = \"adaptive\"\n";

/// The three columns.
pub const NO_WEIR: &str = "no weir";
pub const FIXED: &str = "weir, fixed limit (default)";
pub const ADAPTIVE_COLUMN: &str = "weir, adaptive";

/// A proxy measured beside weir's columns (`--via NAME=PROXY,UPSTREAM`):
/// at load level `i` requests go to `proxy`'s port + `i`, and that level's
/// upstream listens on `upstream`'s port + `i`, where the proxy forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViaProxy {
    /// The column's name.
    pub name: String,
    pub proxy: SocketAddr,
    pub upstream: SocketAddr,
}

impl ViaProxy {
    /// `NAME=PROXY,UPSTREAM`, e.g. `envoy=127.0.0.1:18500,127.0.0.1:18510`.
    pub fn parse(s: &str) -> Result<ViaProxy, String> {
        let usage = "NAME=PROXY,UPSTREAM, e.g. envoy=127.0.0.1:18500,127.0.0.1:18510";
        let (name, addrs) = s.split_once('=').ok_or(usage)?;
        let (proxy, upstream) = addrs.split_once(',').ok_or(usage)?;
        let addr = |a: &str| {
            a.trim()
                .parse::<SocketAddr>()
                .map_err(|e| format!("{a:?}: {e} ({usage})"))
        };
        let name = name.trim();
        if name.is_empty() {
            return Err(usage.into());
        }
        Ok(ViaProxy {
            name: name.to_string(),
            proxy: addr(proxy)?,
            upstream: addr(upstream)?,
        })
    }

    /// Level `i`'s proxy and upstream addresses.
    pub fn at(&self, i: usize) -> Result<(SocketAddr, SocketAddr), String> {
        let shift = |a: SocketAddr| {
            u16::try_from(i)
                .ok()
                .and_then(|i| a.port().checked_add(i))
                .map(|p| SocketAddr::new(a.ip(), p))
                .ok_or_else(|| format!("{}: no port {} + {i}", self.name, a.port()))
        };
        Ok((shift(self.proxy)?, shift(self.upstream)?))
    }
}

/// What the scenario runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Requests the upstream serves at once.
    pub slots: u32,
    /// How long each takes, once it has a slot.
    pub service: Duration,
    /// The app's timeout for a whole request.
    pub client_timeout: Duration,
    /// Offered load, as multiples of the capacity.
    pub levels: Vec<f64>,
    /// How long each level offers its load.
    pub step: Duration,
    /// The halving phase: its length and when the slots halve (`None`: no
    /// such phase).
    pub halving: Option<(Duration, Duration)>,
    /// Run only the adaptive column.
    pub adaptive_only: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            slots: 20,
            service: Duration::from_millis(20),
            client_timeout: Duration::from_secs(1),
            levels: vec![0.5, 1.0, 2.0, 4.0],
            step: Duration::from_secs(3),
            halving: Some((Duration::from_secs(6), Duration::from_secs(2))),
            adaptive_only: false,
        }
    }
}

impl Shape {
    /// Requests per second the upstream serves.
    pub fn capacity(&self) -> f64 {
        levels::capacity(self.slots, self.service)
    }
}

/// One column at one level.
#[derive(Debug, Clone)]
pub struct Cell {
    pub column: String,
    pub observed: Observed,
    /// How long the load was offered.
    pub step: Duration,
    pub client_timeout: Duration,
    /// weir's 503 `overloaded` (weir's columns); for a `--via` proxy, its
    /// answers other than 2xx that came before the client's timeout (its
    /// refusals, as far as the client can tell).
    pub refusals: Option<u64>,
    /// weir's limit, sampled every 50 ms, from the upstream's start.
    pub limits: Vec<(Duration, u32)>,
}

impl Cell {
    /// The answered requests' latencies (2xx within the client's timeout), sorted.
    pub fn answered(&self) -> Vec<Duration> {
        let mut v: Vec<Duration> = self
            .observed
            .records
            .iter()
            .filter(|r| r.ok)
            .map(|r| r.latency)
            .collect();
        v.sort();
        v
    }

    /// Answered requests per second of offered load.
    pub fn goodput(&self) -> f64 {
        self.observed.successes as f64 / self.step.as_secs_f64()
    }

    /// The answered requests' latency at `q` (`None`: none answered).
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        let v = self.answered();
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1;
        v.get(i).copied()
    }

    /// Requests the client gave up on.
    pub fn timed_out(&self) -> u64 {
        self.observed
            .records
            .iter()
            .filter(|r| !r.ok && r.latency >= self.client_timeout)
            .count() as u64
    }

    /// weir's refusals as a share of the requests, in %.
    pub fn refused_percent(&self) -> f64 {
        let n = self.observed.requests.max(1) as f64;
        self.refusals.unwrap_or(0) as f64 * 100.0 / n
    }

    /// The median of the limit's samples in the second half of the run.
    pub fn settled_limit(&self) -> Option<u32> {
        let end = self.limits.last()?.0;
        let mut late: Vec<u32> = self
            .limits
            .iter()
            .filter(|(t, _)| *t * 2 >= end)
            .map(|(_, l)| *l)
            .collect();
        late.sort_unstable();
        late.get(late.len() / 2).copied()
    }
}

impl LevelCell for Cell {
    fn column(&self) -> &str {
        &self.column
    }
}

/// The halving phase (adaptive column).
#[derive(Debug, Clone)]
pub struct Halving {
    /// When the slots halved, from the upstream's start.
    pub at: Duration,
    pub slots_after: u32,
    pub cell: Cell,
}

impl Halving {
    /// From the halving to the first sample of the limit at or below 1.5×
    /// the new slots.
    pub fn followed(&self) -> Option<Duration> {
        let bound = f64::from(self.slots_after) * 1.5;
        self.cell
            .limits
            .iter()
            .find(|(t, l)| *t >= self.at && f64::from(*l) <= bound)
            .map(|(t, _)| *t - self.at)
    }

    /// Per second of the run: goodput, p99 of the answered, the limit's median.
    pub fn per_second(&self) -> Vec<(f64, Option<Duration>, Option<u32>)> {
        let secs = self.cell.step.as_secs() as usize;
        (0..secs)
            .map(|s| {
                let (a, b) = (
                    Duration::from_secs(s as u64),
                    Duration::from_secs(s as u64 + 1),
                );
                let mut ok: Vec<Duration> = self
                    .cell
                    .observed
                    .records
                    .iter()
                    .filter(|r| r.ok && r.start >= a && r.start < b)
                    .map(|r| r.latency)
                    .collect();
                ok.sort();
                let p99 = ok
                    .get(((ok.len() as f64 * 0.99).ceil() as usize).max(1) - 1)
                    .copied();
                let mut l: Vec<u32> = self
                    .cell
                    .limits
                    .iter()
                    .filter(|(t, _)| *t >= a && *t < b)
                    .map(|(_, l)| *l)
                    .collect();
                l.sort_unstable();
                (ok.len() as f64, p99, l.get(l.len() / 2).copied())
            })
            .collect()
    }
}

/// What `weir chaos overload` measured.
#[derive(Debug, Clone)]
pub struct OverloadReport {
    pub shape: Shape,
    /// What the upstream really serves a second, measured before the
    /// levels ([`measured_capacity`]); `None` when not measured.
    pub measured: Option<f64>,
    pub levels: Vec<LoadLevel<Cell>>,
    pub halving: Option<Halving>,
}

impl OverloadReport {
    /// The cell of `column` at `load`.
    pub fn cell(&self, load: f64, column: &str) -> Option<&Cell> {
        levels::find(&self.levels, load, column)
    }
}

/// The upstream: `shape`'s slots and service time, halving at `halve_at`.
pub fn profile(shape: &Shape, halve_at: Option<Duration>) -> Profile {
    levels::capacity_profile(shape.slots, shape.service, halve_at, None)
}

/// How long [`measured_capacity`] keeps the upstream's slots busy.
pub const CALIBRATION: Duration = Duration::from_secs(2);

/// What the upstream really serves a second: `slots` clients straight to
/// it, each sending its next request as soon as its last is answered, for
/// [`CALIBRATION`]; nothing queues. Below `slots / service` by what a slot
/// takes beyond `service` (the timer's granularity: a 20 ms sleep takes
/// about 21 ms), so goodput is judged against what the upstream can do,
/// as the p99 is against its measured unloaded latency.
pub async fn measured_capacity(shape: &Shape, opts: &ScenarioOptions) -> Result<f64, String> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let up = levels::start_upstream(any, profile(shape, None), opts.seed).await?;
    let load = super::driver::Load {
        // Twice what the nominal capacity could serve in the window: the
        // window, not the count, ends it.
        requests: (shape.capacity() * CALIBRATION.as_secs_f64() * 2.0) as usize
            + shape.slots as usize,
        mode: super::driver::Mode::Closed(shape.slots as usize),
        max_time: CALIBRATION,
        method: http::Method::GET,
        client_timeout: shape.client_timeout,
        keys: None,
    };
    let observed = drive(Target::Direct(up.addr), load).await;
    // Answers started within the window, over the window: the last ones
    // end just after it.
    let answered = observed
        .records
        .iter()
        .filter(|r| r.ok && r.start < CALIBRATION)
        .count();
    Ok(answered as f64 / CALIBRATION.as_secs_f64())
}

/// One column at `rate` requests a second for `length`, on a fresh upstream.
async fn measure(
    shape: &Shape,
    opts: &ScenarioOptions,
    column: &'static str,
    rate: f64,
    length: Duration,
    halve_at: Option<Duration>,
) -> Result<Cell, String> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let up = levels::start_upstream(any, profile(shape, halve_at), opts.seed).await?;
    let load = levels::open_load(rate, length, shape.client_timeout);
    let extra = match column {
        NO_WEIR => {
            let observed = drive(Target::Direct(up.addr), load).await;
            return Ok(cell(column, observed, length, shape, None, Vec::new()));
        }
        ADAPTIVE_COLUMN => ADAPTIVE,
        _ => "",
    };
    let (proxy, state) = levels::start_weir(&up, opts, extra).await?;
    let limits = Arc::new(Mutex::new(Vec::new()));
    let (s, out, started) = (state.clone(), limits.clone(), up.started);
    let sampler = tokio::spawn(async move {
        loop {
            let limit = s.gate.view().limit;
            if let Ok(mut v) = out.lock() {
                v.push((started.elapsed(), limit));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let target = Target::Weir {
        addr: proxy.listen_addr(),
        host: "chaos".into(),
    };
    let observed = drive(target, load).await;
    sampler.abort();
    let _ = sampler.await;
    let refusals = state.gate.view().refusals;
    proxy.shutdown(Duration::from_secs(1)).await;
    let limits = limits.lock().map(|v| v.clone()).unwrap_or_default();
    Ok(cell(
        column,
        observed,
        length,
        shape,
        Some(refusals),
        limits,
    ))
}

/// A `--via` proxy's column at level `level`: a fresh upstream on that
/// level's upstream address, the load sent to that level's proxy address.
async fn measure_via(
    shape: &Shape,
    opts: &ScenarioOptions,
    via: &ViaProxy,
    level: usize,
    rate: f64,
) -> Result<Cell, String> {
    let (proxy, upstream) = via.at(level)?;
    let up = levels::start_upstream(upstream, profile(shape, None), opts.seed)
        .await
        .map_err(|e| format!("{}: {e}", via.name))?;
    // Fail at once when nothing listens there, rather than print a column
    // of connection errors (a connection alone: no request, so the proxy's
    // controller sees no sample).
    let mut reached = false;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(proxy).await.is_ok() {
            reached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !reached {
        return Err(format!("{}: nothing listens on {proxy}", via.name));
    }
    let target = Target::Weir {
        addr: proxy,
        host: "chaos".into(),
    };
    let load = levels::open_load(rate, shape.step, shape.client_timeout);
    let observed = drive(target, load).await;
    drop(up);
    let failed = observed
        .records
        .iter()
        .filter(|r| !r.ok && r.latency < shape.client_timeout)
        .count() as u64;
    Ok(cell(
        &via.name,
        observed,
        shape.step,
        shape,
        Some(failed),
        Vec::new(),
    ))
}

fn cell(
    column: &str,
    observed: Observed,
    step: Duration,
    shape: &Shape,
    refusals: Option<u64>,
    limits: Vec<(Duration, u32)>,
) -> Cell {
    Cell {
        column: column.to_string(),
        observed,
        step,
        client_timeout: shape.client_timeout,
        refusals,
        limits,
    }
}

/// Runs the levels, then the halving phase.
pub async fn measure_all(shape: &Shape, opts: &ScenarioOptions) -> Result<OverloadReport, String> {
    let alone = shape.adaptive_only || opts.weir_only;
    let columns: &[&'static str] = if alone {
        &[ADAPTIVE_COLUMN]
    } else {
        &[NO_WEIR, FIXED, ADAPTIVE_COLUMN]
    };
    let vias: &[ViaProxy] = if alone { &[] } else { &opts.via };
    let measured = Some(measured_capacity(shape, opts).await?);
    // weir's columns, then the proxies'.
    let levels = levels::drive_levels(&shape.levels, columns.len() + vias.len(), |i, load, c| {
        let rate = shape.capacity() * load;
        async move {
            match columns.get(c) {
                Some(&column) => measure(shape, opts, column, rate, shape.step, None).await,
                None => measure_via(shape, opts, &vias[c - columns.len()], i, rate).await,
            }
        }
    })
    .await?;
    let mut halving = None;
    if let Some((length, at)) = shape.halving {
        let rate = shape.capacity() * 2.0;
        let cell = measure(shape, opts, ADAPTIVE_COLUMN, rate, length, Some(at)).await?;
        halving = Some(Halving {
            at,
            slots_after: shape.slots / 2,
            cell,
        });
    }
    Ok(OverloadReport {
        shape: shape.clone(),
        measured,
        levels,
        halving,
    })
}

/// `weir chaos overload`, as a scenario report (no columns of its own).
pub async fn run(opts: &ScenarioOptions) -> Result<super::ScenarioReport, String> {
    let shape = Shape::default();
    let report = measure_all(&shape, opts).await?;
    Ok(super::ScenarioReport {
        overload: Some(report),
        ..levels::scenario_report(super::Scenario::Overload, opts, ADAPTIVE)?
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn via_names_a_proxy_and_an_upstream_shifted_by_the_level() {
        let v = ViaProxy::parse("envoy adaptive=127.0.0.1:18500,127.0.0.1:18510").unwrap();
        assert_eq!(v.name, "envoy adaptive");
        let (p, u) = v.at(3).unwrap();
        assert_eq!(
            (p.to_string(), u.to_string()),
            ("127.0.0.1:18503".into(), "127.0.0.1:18513".into())
        );
        for bad in [
            "envoy",
            "=127.0.0.1:1,127.0.0.1:2",
            "e=127.0.0.1:1",
            "e=127.0.0.1,127.0.0.1:2",
        ] {
            assert!(ViaProxy::parse(bad).is_err(), "{bad}");
        }
        let top = ViaProxy::parse("e=127.0.0.1:65535,127.0.0.1:1").unwrap();
        assert!(top.at(1).is_err());
    }
}
