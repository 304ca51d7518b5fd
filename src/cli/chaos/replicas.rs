//! `weir chaos bad-replica | down-replica | slow-replica | flaky-replica | slow-tail`
//! (bench/RESULTS.md#weir-chaos-replica-scenarios): three replicas of one service on
//! 127.0.0.2–4, the first misbehaving — answering every request 503,
//! refusing connections, taking 1 s, or failing half its requests — the
//! others healthy (1–3 ms). Two columns: an application that spreads its
//! requests over the three addresses itself, one attempt each (what a
//! client does with a name of three A records and no proxy), and weir with
//! the three as an upstream's `endpoints`, on its default policy. `--h2c`
//! has weir speak h2c to the replicas. The gates are in `tests/replicas.rs`;
//! `bench/replicas.sh` runs the same against nginx, HAProxy and Envoy.
//!
//! `slow-tail` is the tail without a culprit: all three replicas answer in
//! 2–5 ms, and any request takes 1 s with probability 2 %, independently. A
//! third column runs weir with hedging (`after = "p95"`,
//! docs/reference/hedging.md#hedging); its rows add p99.9 and the hedges.

use super::driver::{drive, Load, Mode, Target};
use super::upstream::{ChaosUpstream, Latency, Profile};
use super::{Column, Scenario, ScenarioOptions, ScenarioReport};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use http::Method;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Whether `s` is one of the replica scenarios.
pub fn is_replica(s: Scenario) -> bool {
    matches!(
        s,
        Scenario::BadReplica
            | Scenario::DownReplica
            | Scenario::SlowReplica
            | Scenario::FlakyReplica
            | Scenario::SlowTail
    )
}

/// `slow-tail`'s replicas, all three alike.
pub fn slow_tail() -> Profile {
    Profile {
        latency: Latency::UniformTail {
            lo: Duration::from_millis(2),
            hi: Duration::from_millis(5),
            p: 0.02,
            tail: Duration::from_secs(1),
        },
        ..Profile::default()
    }
}

/// `slow-tail`'s requests through each weir before the measured run.
pub const WARM_UP: usize = 200;

/// `slow-tail`'s hedging, in weir's third column.
pub const HEDGE: &str = "[upstreams.chaos.hedge]\nafter = \"p95\"\n";

/// The healthy replicas' profile.
fn healthy() -> Profile {
    Profile {
        latency: Latency::Uniform(Duration::from_millis(1), Duration::from_millis(3)),
        ..Profile::default()
    }
}

/// The misbehaving replica's profile.
pub fn faulty(s: Scenario) -> Profile {
    let base = healthy();
    match s {
        Scenario::BadReplica => Profile {
            fail_rate: 1.0,
            ..base
        },
        // From its first millisecond to long after any run: refused.
        Scenario::DownReplica => Profile {
            outages: vec![(Duration::from_millis(1), Duration::from_secs(24 * 3600))],
            ..base
        },
        Scenario::SlowReplica => Profile {
            latency: Latency::Fixed(Duration::from_secs(1)),
            ..base
        },
        Scenario::FlakyReplica => Profile {
            fail_rate: 0.5,
            ..base
        },
        Scenario::SlowTail => slow_tail(),
        _ => base,
    }
}

/// 3,000 GETs from 16 clients.
pub fn load(requests: Option<usize>, rate: Option<f64>) -> Load {
    Load {
        requests: requests.unwrap_or(3000),
        mode: rate.map(Mode::Open).unwrap_or(Mode::Closed(16)),
        max_time: Duration::from_secs(120),
        method: Method::GET,
        client_timeout: Duration::from_secs(10),
        keys: None,
    }
}

/// The three replicas, the misbehaving one first.
async fn start(s: Scenario, seed: u64) -> Result<Vec<ChaosUpstream>, String> {
    let mut out = Vec::new();
    let others = if s == Scenario::SlowTail {
        slow_tail()
    } else {
        healthy()
    };
    for (i, profile) in [faulty(s), others.clone(), others].into_iter().enumerate() {
        let addr: SocketAddr = format!("127.0.0.{}:0", i + 2).parse().map_err(|_| "addr")?;
        let up = ChaosUpstream::start(addr, profile, seed + i as u64)
            .await
            .map_err(|e| format!("cannot start replica {} on {addr}: {e}", i + 1))?;
        out.push(up);
    }
    // The down replica's listener closes at its first millisecond.
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(out)
}

fn column(name: &'static str, observed: super::driver::Observed, ups: &[ChaosUpstream]) -> Column {
    let served: Vec<u64> = ups.iter().map(|u| u.counters.received()).collect();
    Column {
        name,
        refused: observed.refused,
        back: None,
        observed,
        upstream_attempts: served.iter().sum(),
        upstream_before_outage: None,
        duplicates: ups.iter().map(|u| u.counters.duplicates()).sum(),
        transitions: None,
        stops: None,
        resends: None,
        cache: None,
        hedges: None,
        replicas: Some(served),
    }
}

/// weir's config: its defaults, the user's `[defaults]` over them, and the
/// three replicas as one upstream's endpoints.
fn config(
    s: Scenario,
    addrs: &[SocketAddr],
    opts: &ScenarioOptions,
    extra: &str,
) -> Result<Config, String> {
    let list: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let protocol = if opts.h2c { "protocol = \"h2c\"\n" } else { "" };
    let upstream = format!(
        "[upstreams.chaos]\nurl = \"http://{}\"\nhosts = [\"chaos\"]\nendpoints = [{}]\n{protocol}",
        addrs[0],
        list.join(", ")
    );
    let defaults = toml::to_string(&super::config::user_defaults(opts.config.as_deref())?)
        .map_err(|e| e.to_string())?;
    let src = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n{defaults}\n{upstream}{extra}"
    );
    let path = PathBuf::from(format!("<chaos {}>", s.name()));
    Config::parse(&path, &src).map_err(|e| e.to_string())
}

/// Runs one replica scenario: the application alone, then weir.
pub async fn run(s: Scenario, opts: &ScenarioOptions) -> Result<ScenarioReport, String> {
    let load = load(opts.requests, opts.rate);
    let mut columns = Vec::new();
    if !opts.weir_only {
        let ups = start(s, opts.seed).await?;
        let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
        let observed = drive(Target::Spread(addrs), load.clone()).await;
        columns.push(column("no weir (spread, 1 attempt)", observed, &ups));
    }
    let mut runs = vec![(super::Scenario::weir_column(s), "")];
    if s == Scenario::SlowTail {
        runs.push(("weir, hedging after p95", HEDGE));
    }
    let mut up_cfg = None;
    for (name, extra) in runs {
        let ups = start(s, opts.seed).await?;
        let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
        let cfg = config(s, &addrs, opts, extra)?;
        up_cfg = Some(cfg.upstreams.first().ok_or("no upstream")?.clone());
        let metrics = Arc::new(Metrics::new());
        let proxy = Proxy::start_with(cfg, metrics.clone())
            .await
            .map_err(|e| e.to_string())?;
        let target = Target::Weir {
            addr: proxy.listen_addr(),
            host: "chaos".into(),
        };
        // slow-tail: a warm-up first, so that a p95 is known (50 latencies)
        // before the measured run, as in a weir that has been serving; the
        // replicas' counts are of the measured run only.
        let mut before = vec![0; ups.len()];
        if s == Scenario::SlowTail {
            let warm = super::driver::Load {
                requests: WARM_UP,
                ..load.clone()
            };
            drive(target.clone(), warm).await;
            before = ups.iter().map(|u| u.counters.received()).collect();
        }
        let observed = drive(target, load.clone()).await;
        let mut col = column(name, observed, &ups);
        if let Some(served) = &mut col.replicas {
            for (n, b) in served.iter_mut().zip(&before) {
                *n -= b;
            }
            col.upstream_attempts = served.iter().sum();
        }
        col.refused = metrics
            .values("weir_upstream_attempts_total", "chaos", "result")
            .get("connect_failure")
            .copied()
            .unwrap_or(0.0) as u64;
        col.transitions = Some(metrics.values("weir_breaker_transitions_total", "chaos", "to"));
        col.stops = Some(metrics.values("weir_retry_stops_total", "chaos", "reason"));
        if s == Scenario::SlowTail {
            col.hedges = Some(metrics.values("weir_hedges_total", "chaos", "result"));
        }
        columns.push(col);
        proxy.shutdown(Duration::from_secs(1)).await;
    }
    let up_cfg = up_cfg.ok_or("no weir column")?;
    Ok(ScenarioReport {
        scenario: s,
        seed: opts.seed,
        deadline: up_cfg.timeout,
        settings: if opts.h2c {
            "[upstreams.chaos]\nprotocol = \"h2c\"\n"
        } else {
            ""
        },
        merged: opts.config.clone(),
        half_open_probes: up_cfg.breaker.half_open_probes,
        columns,
        breaker: super::BreakerTrace::default(),
        overload: None,
        shed: None,
        slow: None,
    })
}

/// The row of requests each replica received (the misbehaving one first).
pub fn row(r: &ScenarioReport) -> Option<(String, Vec<String>)> {
    if !is_replica(r.scenario) {
        return None;
    }
    let cells = r
        .columns
        .iter()
        .map(|c| match &c.replicas {
            Some(v) => v.iter().map(u64::to_string).collect::<Vec<_>>().join(" / "),
            None => "—".into(),
        })
        .collect();
    let what = if r.scenario == Scenario::SlowTail {
        "requests per replica"
    } else {
        "requests per replica (the misbehaving one first)"
    };
    Some((what.into(), cells))
}
