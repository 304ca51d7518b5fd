//! `weir chaos`: a fault-injecting upstream ([`upstream`]), a load driver
//! ([`driver`]) and the scenarios that measure what weir does for a client of
//! a misbehaving upstream — side by side with no proxy at all and with the
//! hand-rolled retry loop people write instead.
//!
//! Each column gets a fresh upstream with the same profile and seed; weir runs
//! in-process on loopback. Nothing here is used by the data plane.

mod breaker_trace;
pub mod catalogue;
pub mod command;
mod config;
pub mod double_submit;
pub mod driver;
pub mod fleet_scale;
pub mod levels;
pub mod overload;
pub mod overload_table;
pub mod redis_failover;
pub mod replicas;
pub mod report;
pub mod shed;
pub mod slow_readers;
pub mod soak;
pub mod timeline;
pub mod upstream;

use crate::metrics::Metrics;
use crate::proxy::Proxy;
use breaker_trace::trace_breaker;
pub use breaker_trace::BreakerTrace;
use driver::{drive, Load, Mode, Observed, Target};
use http::Method;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use upstream::{ChaosUpstream, Latency, Profile, Throttle};

/// The scenarios `weir chaos` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// 5 % of requests answered 503 at random.
    #[value(name = "transient-5")]
    Transient5,
    /// 30 % of requests answered 503 at random, open loop at 1000 requests/s.
    #[value(name = "transient-30")]
    Transient30,
    /// Connections refused for 2 s, then healthy again.
    Outage,
    /// 100 requests/s for 20 s; connections refused from 5 s to 10 s.
    Recovery,
    /// 5 requests/s; the upstream is down for 2 s, as a local app restarting.
    Restart,
    /// Latency ×20 and 50 % 503.
    Brownout,
    /// 429 with `Retry-After: 1` above 200 requests/s.
    #[value(name = "rate-limited")]
    RateLimited,
    /// POSTs; 20 % of attempts processed, then answered too late.
    #[value(name = "post-timeouts")]
    PostTimeouts,
    /// Keyed POSTs the upstream takes 1 s over; the client re-sends each after 300 ms.
    #[value(name = "double-submit")]
    DoubleSubmit,
    /// 200 keys read in a Zipf pattern through weir's cache; connections refused for 5 s.
    #[value(name = "catalogue-outage")]
    CatalogueOutage,
    /// Three replicas, one answering every request 503.
    #[value(name = "bad-replica")]
    BadReplica,
    /// Three replicas, one refusing connections.
    #[value(name = "down-replica")]
    DownReplica,
    /// Three replicas, one taking 1 s per request.
    #[value(name = "slow-replica")]
    SlowReplica,
    /// Three replicas, one failing half its requests.
    #[value(name = "flaky-replica")]
    FlakyReplica,
    /// Three replicas answering in 2–5 ms, each request taking 1 s with probability 2 %.
    #[value(name = "slow-tail")]
    SlowTail,
    /// An upstream serving 20 at once for 20 ms each, at 0.5×–4× its capacity.
    Overload,
    /// The same upstream answering 503 at once past its capacity, at 2× and 4×: weir with and without client-side throttling.
    #[value(name = "overload-shed")]
    OverloadShed,
    /// 12 clients reading an 8 MB answer a byte a second and 12 sending a body a byte a second, beside an app at 20 requests/s: the fixed and the adaptive limit.
    #[value(name = "slow-readers")]
    SlowReaders,
}

impl Scenario {
    pub const ALL: [Scenario; 18] = [
        Scenario::Transient5,
        Scenario::Transient30,
        Scenario::Outage,
        Scenario::Recovery,
        Scenario::Restart,
        Scenario::Brownout,
        Scenario::RateLimited,
        Scenario::PostTimeouts,
        Scenario::DoubleSubmit,
        Scenario::CatalogueOutage,
        Scenario::BadReplica,
        Scenario::DownReplica,
        Scenario::SlowReplica,
        Scenario::FlakyReplica,
        Scenario::SlowTail,
        Scenario::Overload,
        Scenario::OverloadShed,
        Scenario::SlowReaders,
    ];

    /// The name of weir's column.
    pub fn weir_column(self) -> &'static str {
        match self {
            Scenario::CatalogueOutage => "weir (cache on)",
            _ => "weir",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Transient5 => "transient-5",
            Scenario::Transient30 => "transient-30",
            Scenario::Outage => "outage",
            Scenario::Recovery => "recovery",
            Scenario::Restart => "restart",
            Scenario::Brownout => "brownout",
            Scenario::RateLimited => "rate-limited",
            Scenario::PostTimeouts => "post-timeouts",
            Scenario::DoubleSubmit => "double-submit",
            Scenario::CatalogueOutage => "catalogue-outage",
            Scenario::BadReplica => "bad-replica",
            Scenario::DownReplica => "down-replica",
            Scenario::SlowReplica => "slow-replica",
            Scenario::FlakyReplica => "flaky-replica",
            Scenario::SlowTail => "slow-tail",
            Scenario::Overload => "overload",
            Scenario::OverloadShed => "overload-shed",
            Scenario::SlowReaders => "slow-readers",
        }
    }

    /// The upstream's misbehaviour.
    pub fn profile(self) -> Profile {
        let normal = Latency::Uniform(Duration::from_millis(1), Duration::from_millis(3));
        let base = Profile {
            latency: normal,
            ..Profile::default()
        };
        let down =
            |from: u64, secs: u64| vec![(Duration::from_secs(from), Duration::from_secs(secs))];
        match self {
            Scenario::Transient5 => Profile {
                fail_rate: 0.05,
                ..base
            },
            Scenario::Transient30 => Profile {
                fail_rate: 0.30,
                ..base
            },
            Scenario::Outage => Profile {
                outages: down(1, 2),
                ..base
            },
            Scenario::Recovery => Profile {
                outages: down(5, 5),
                ..base
            },
            Scenario::Restart => Profile {
                outages: down(3, 2),
                ..base
            },
            Scenario::Brownout => Profile {
                fail_rate: 0.5,
                latency: Latency::Uniform(Duration::from_millis(20), Duration::from_millis(60)),
                ..base
            },
            Scenario::RateLimited => Profile {
                throttle: Some(Throttle {
                    rps: 200.0,
                    status: 429,
                    retry_after: 1,
                }),
                ..base
            },
            Scenario::PostTimeouts => Profile {
                hang_rate: 0.2,
                hang: Duration::from_secs(1),
                ..base
            },
            Scenario::DoubleSubmit => Profile {
                latency: Latency::Fixed(double_submit::UPSTREAM_TAKES),
                ..base
            },
            Scenario::CatalogueOutage => Profile {
                outages: down(5, 5),
                cache_control: Some(catalogue::CACHE_CONTROL),
                ..base
            },
            Scenario::Overload => overload::profile(&overload::Shape::default(), None),
            Scenario::OverloadShed => shed::profile(&shed::ShedShape::default()),
            Scenario::SlowReaders => slow_readers::profile(&slow_readers::SlowShape::default()),
            // The misbehaving one of three (the others are healthy).
            s => replicas::faulty(s),
        }
    }

    /// Requests, offered load and method.
    pub fn load(self, requests: Option<usize>, rate: Option<f64>) -> Load {
        let (n, mode, method) = match self {
            Scenario::Transient5 => (2000, Mode::Closed(32), Method::GET),
            Scenario::Transient30 => (3000, Mode::Open(1000.0), Method::GET),
            Scenario::Outage => (1750, Mode::Open(250.0), Method::GET),
            Scenario::Recovery => (2000, Mode::Open(100.0), Method::GET),
            Scenario::Restart => (50, Mode::Open(5.0), Method::GET),
            Scenario::Brownout => (2000, Mode::Closed(32), Method::GET),
            Scenario::RateLimited => (2000, Mode::Open(400.0), Method::GET),
            Scenario::PostTimeouts => (1000, Mode::Closed(32), Method::POST),
            Scenario::DoubleSubmit => (200, Mode::Open(50.0), Method::POST),
            Scenario::CatalogueOutage => (3000, Mode::Open(200.0), Method::GET),
            _ => return replicas::load(requests, rate),
        };
        Load {
            requests: requests.unwrap_or(n),
            mode: rate.map(Mode::Open).unwrap_or(mode),
            max_time: Duration::from_secs(120),
            method,
            client_timeout: match self {
                Scenario::DoubleSubmit => double_submit::CLIENT_TIMEOUT,
                _ => Duration::from_secs(10),
            },
            keys: None,
        }
    }

    /// What this scenario's story sets on top of weir's default policy, as
    /// TOML: a deadline, a per-try timeout, `"429"` in `retry_on`. Never the
    /// breaker or the budget: every figure is the default policy's.
    pub fn settings(self) -> &'static str {
        match self {
            Scenario::Transient5
            | Scenario::Transient30
            | Scenario::Outage
            | Scenario::Recovery
            | Scenario::Restart
            | Scenario::DoubleSubmit
            | Scenario::BadReplica
            | Scenario::DownReplica
            | Scenario::SlowReplica
            | Scenario::FlakyReplica
            | Scenario::SlowTail
            | Scenario::Overload
            | Scenario::OverloadShed
            | Scenario::SlowReaders => "",
            Scenario::Brownout => "[defaults]\ntimeout = \"2s\"\n",
            Scenario::RateLimited => {
                "[defaults.retry]\nretry_on = [\"connect-failure\", \"reset\", \"timeout\", \"429\", \"502\", \"503\", \"504\"]\nmax_retry_after = \"2s\"\n"
            }
            Scenario::PostTimeouts => "[defaults]\ntimeout = \"2s\"\nper_try_timeout = \"250ms\"\n",
            Scenario::CatalogueOutage => "[defaults.cache]\nenabled = true\n",
        }
    }
}

/// How to run a scenario.
#[derive(Debug, Clone, Default)]
pub struct ScenarioOptions {
    pub requests: Option<usize>,
    pub rate: Option<f64>,
    pub seed: u64,
    /// Merge this file's `[defaults]` table over the scenario's settings
    /// (the file wins, field by field).
    pub config: Option<PathBuf>,
    /// Run only the weir column (for tests that check weir's own figures).
    pub weir_only: bool,
    /// The replica scenarios: weir speaks h2c to the replicas.
    pub h2c: bool,
    /// `overload`: proxies already running, measured beside weir's columns.
    pub via: Vec<overload::ViaProxy>,
}

/// One column of the report.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: &'static str,
    pub observed: Observed,
    /// Requests that reached the upstream.
    pub upstream_attempts: u64,
    /// Those that reached it before its first outage began.
    pub upstream_before_outage: Option<u64>,
    /// Attempts whose connection the upstream refused (they never reached it).
    pub refused: u64,
    /// When the upstream came back from its (last) outage, on this column's
    /// timeline (`observed.records`' clock).
    pub back: Option<Duration>,
    pub duplicates: u64,
    /// weir only: breaker transitions by state entered.
    pub transitions: Option<BTreeMap<String, f64>>,
    /// weir only: retry stops by reason.
    pub stops: Option<BTreeMap<String, f64>>,
    /// `double-submit` only: what the re-sending client saw.
    pub resends: Option<double_submit::Resends>,
    /// weir with its cache on: requests by `x-weir-cache` result.
    pub cache: Option<BTreeMap<String, f64>>,
    /// `weir_hedges_total` by result (`slow-tail`).
    pub hedges: Option<BTreeMap<String, f64>>,
    /// The replica scenarios: requests each replica received.
    pub replicas: Option<Vec<u64>>,
}

impl Column {
    /// Upstream attempts per client request, counting those refused at
    /// connect: the load put on the upstream's address.
    pub fn amplification(&self) -> f64 {
        if self.observed.requests == 0 {
            return 0.0;
        }
        (self.upstream_attempts + self.refused) as f64 / self.observed.requests as f64
    }

    pub fn success(&self) -> f64 {
        if self.observed.requests == 0 {
            return 0.0;
        }
        self.observed.successes as f64 * 100.0 / self.observed.requests as f64
    }
}

#[derive(Debug, Clone)]
pub struct ScenarioReport {
    pub scenario: Scenario,
    pub seed: u64,
    /// weir's request deadline (`timeout`) in this scenario.
    pub deadline: Duration,
    /// The scenario's own settings over the default policy (TOML).
    pub settings: &'static str,
    /// The file whose `[defaults]` was merged over them, if any.
    pub merged: Option<PathBuf>,
    /// The breaker's `half_open_probes` in force.
    pub half_open_probes: u32,
    pub columns: Vec<Column>,
    pub breaker: BreakerTrace,
    /// `overload`'s own figures (it has no columns of its own).
    pub overload: Option<overload::OverloadReport>,
    /// `overload-shed`'s own figures.
    pub shed: Option<shed::ShedReport>,
    /// `slow-readers`' own figures.
    pub slow: Option<slow_readers::SlowReport>,
}

/// Runs one scenario: three columns, one after the other.
pub async fn run(scenario: Scenario, opts: &ScenarioOptions) -> Result<ScenarioReport, String> {
    // The scenarios with a driver of their own.
    match scenario {
        Scenario::DoubleSubmit => return double_submit::run(opts).await,
        Scenario::Overload => return overload::run(opts).await,
        Scenario::OverloadShed => return shed::run(opts).await,
        Scenario::SlowReaders => return slow_readers::run(opts).await,
        s if replicas::is_replica(s) => return replicas::run(s, opts).await,
        _ => {}
    }
    let mut load = scenario.load(opts.requests, opts.rate);
    load.keys = catalogue::keys(scenario, opts.seed, load.requests);
    let probe = config::weir_config(
        scenario,
        "127.0.0.1:9".parse().map_err(|_| "addr")?,
        opts.config.as_deref(),
    )?;
    let up_cfg = probe.upstreams.first().ok_or("no upstream")?.clone();
    let deadline = up_cfg.timeout;
    let per_try = up_cfg.per_try_timeout.unwrap_or(Duration::from_secs(1));
    let mut columns = Vec::new();

    if !opts.weir_only {
        // 1. No weir.
        let up = start_upstream(scenario, opts.seed).await?;
        let observed = drive(Target::Direct(up.addr), load.clone()).await;
        columns.push(column(scenario, "no weir", observed, &up));
        drop(up);

        // 2. The naive loop: 3 attempts, 100 ms apart, no budget, no breaker.
        let up = start_upstream(scenario, opts.seed).await?;
        let naive = Target::Naive {
            addr: up.addr,
            attempts: 3,
            backoff: Duration::from_millis(100),
            per_try,
        };
        let observed = drive(naive, load.clone()).await;
        columns.push(column(scenario, "naive retries", observed, &up));
        drop(up);
    }

    // 3. weir.
    let (up, proxy, metrics, target) = start_weir(scenario, opts).await?;
    let snap = proxy.snapshot();
    let state = snap
        .upstreams
        .first()
        .map(|u| u.state.clone())
        .ok_or("no upstream state")?;
    let outage_end = outage_end(scenario);
    let started = up.started;
    let trace = Arc::new(std::sync::Mutex::new(BreakerTrace::default()));
    let sampler = tokio::spawn(trace_breaker(
        state,
        metrics.clone(),
        up.counters.clone(),
        started,
        outage_end,
        trace.clone(),
    ));
    let observed = drive(target, load.clone()).await;
    sampler.abort();
    let _ = sampler.await;
    let trace = trace.lock().map(|t| t.clone()).unwrap_or_default();
    let mut col = column(scenario, scenario.weir_column(), observed, &up);
    // weir's connect failures are the attempts the upstream refused.
    col.refused = metrics
        .values("weir_upstream_attempts_total", "chaos", "result")
        .get("connect_failure")
        .copied()
        .unwrap_or(0.0) as u64;
    weir_rows(&mut col, &metrics, &proxy);
    columns.push(col);
    proxy.shutdown(Duration::from_secs(1)).await;

    Ok(ScenarioReport {
        scenario,
        seed: opts.seed,
        deadline,
        settings: scenario.settings(),
        merged: opts.config.clone(),
        half_open_probes: up_cfg.breaker.half_open_probes,
        columns,
        breaker: trace,
        overload: None,
        shed: None,
        slow: None,
    })
}

/// The weir column's setup: a fresh upstream, and weir in front of it on
/// the scenario's policy (and `--config`'s), with its own metrics.
async fn start_weir(
    scenario: Scenario,
    opts: &ScenarioOptions,
) -> Result<
    (
        ChaosUpstream,
        crate::proxy::ProxyHandle,
        Arc<Metrics>,
        Target,
    ),
    String,
> {
    let up = start_upstream(scenario, opts.seed).await?;
    let config = config::weir_config(scenario, up.addr, opts.config.as_deref())?;
    let metrics = Arc::new(Metrics::new());
    let proxy = Proxy::start_with(config, metrics.clone())
        .await
        .map_err(|e| e.to_string())?;
    let target = Target::Weir {
        addr: proxy.listen_addr(),
        host: "chaos".into(),
    };
    Ok((up, proxy, metrics, target))
}

/// The rows only weir's column has: breaker transitions, retry stops, and
/// the cache's results when its cache is on.
fn weir_rows(col: &mut Column, metrics: &Metrics, proxy: &crate::proxy::ProxyHandle) {
    col.transitions = Some(metrics.values("weir_breaker_transitions_total", "chaos", "to"));
    col.stops = Some(metrics.values("weir_retry_stops_total", "chaos", "reason"));
    let snap = proxy.snapshot();
    if let Some(u) = snap.upstreams.iter().find(|u| u.config.cache.is_some()) {
        // The cache's series follow its own counts when they are scraped.
        u.refresh_gauges();
        col.cache = Some(metrics.values("weir_cache_requests_total", "chaos", "result"));
    }
}

async fn start_upstream(scenario: Scenario, seed: u64) -> Result<ChaosUpstream, String> {
    ChaosUpstream::start(
        "127.0.0.1:0".parse().map_err(|_| "addr")?,
        scenario.profile(),
        seed,
    )
    .await
    .map_err(|e| format!("cannot start the chaos upstream: {e}"))
}

/// When the scenario's last outage ends, from the upstream's start.
fn outage_end(scenario: Scenario) -> Option<Duration> {
    scenario
        .profile()
        .outages
        .iter()
        .map(|(s, l)| *s + *l)
        .max()
}

fn column(
    scenario: Scenario,
    name: &'static str,
    observed: Observed,
    up: &ChaosUpstream,
) -> Column {
    // The driver's clock starts a little after the upstream's.
    let back = outage_end(scenario).map(|end| {
        let skew = observed
            .started
            .map(|s| s.saturating_duration_since(up.started))
            .unwrap_or_default();
        end.saturating_sub(skew)
    });
    Column {
        name,
        refused: observed.refused,
        back,
        observed,
        upstream_attempts: up.counters.received(),
        upstream_before_outage: up.counters.before_outage.get().copied(),
        duplicates: up.counters.duplicates(),
        transitions: None,
        stops: None,
        resends: None,
        cache: None,
        hedges: None,
        replicas: None,
    }
}
