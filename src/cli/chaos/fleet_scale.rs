//! `weir chaos fleet --instances N`: what a fleet of N sidecars costs one
//! Redis (docs/reference/fleet.md#cost-at-scale).
//!
//! Starts a `redis-server` of its own (or, with `--cluster`, three in
//! cluster mode, joined by `redis-cli --cluster create`), then N of weir's
//! state clients in this process, each exactly what one weir instance runs:
//! a [`Fleet`] (its connection, its supervisor and heartbeat), the breaker
//! refresher's read every `refresh`, the leased buckets of two upstreams
//! with a fleet rate limit ([`FleetBucket`], as `policy::leased_tokens` spends
//! them), and the idempotency store's begin and record for keyed writes.
//! Each instance offers its request stream: [`UPSTREAMS`] upstreams at
//! [`RPS_PER_UPSTREAM`] requests per second each, [`KEYED_SHARE`] of them
//! keyed writes, and now and then a breaker trip (published, then a probe
//! claimed). Unkeyed requests touch Redis only through the buckets'
//! batched leases; nothing else in a request's path waits on Redis but a
//! keyed write's `begin`.
//!
//! After a warm-up, it reads Redis's own counters over the measured span
//! (`INFO commandstats`, `INFO cpu`) and prints the round trips per
//! proxied request (all of them, and the background's per 100 unkeyed
//! ones per instance), the Redis server's CPU in cores, and the p50/p99 of
//! `begin`.

use super::redis_failover::{until, RedisProcess};
use crate::clock::Clock;
use crate::config::{StateBackend, StateConfig};
use crate::metrics::state::StateMetrics;
use crate::policy::idempotency::{Fingerprint, StoredResponse};
use crate::state::fleet::{Fleet, FleetBucket};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Upstreams per instance.
pub const UPSTREAMS: usize = 10;
/// Requests per second to each.
pub const RPS_PER_UPSTREAM: u32 = 20;
/// The share of requests that are keyed writes.
pub const KEYED_SHARE: f64 = 0.05;
/// The upstreams (of the first ones) with a fleet rate limit, and its rate:
/// above what the fleet offers them, so that it holds without refusing.
const LIMITED: usize = 2;
/// One instance's tick: its requests of a tick go together.
const TICK: Duration = Duration::from_millis(100);
/// A breaker trip per instance per this many ticks, on average.
const TRIP_EVERY_TICKS: u32 = 3000;

/// What to run.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    pub instances: usize,
    /// Before the measured span.
    pub warmup: Duration,
    /// The measured span.
    pub measure: Duration,
    /// Three shards instead of one server.
    pub cluster: bool,
}

/// What the measured span showed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScaleReport {
    pub instances: usize,
    pub topology: &'static str,
    pub seconds: f64,
    /// Requests the instances offered in the span.
    pub requests: u64,
    pub keyed: u64,
    /// Round trips to Redis in the span (each instance's own count, as
    /// `weir_state_commands_total`), and of them the keyed writes'.
    pub round_trips: u64,
    pub keyed_round_trips: u64,
    /// Commands Redis processed (every node; the commands a script runs
    /// count too).
    pub redis_commands: u64,
    /// Redis round trips per proxied request, all of them.
    pub per_request: f64,
    /// The background's (everything but keyed writes) per 100 unkeyed
    /// requests of one instance.
    pub background_per_100_unkeyed: f64,
    /// The Redis servers' CPU (user + system) over the span, in cores.
    pub redis_cpu_cores: f64,
    pub begin_p50_ms: f64,
    pub begin_p99_ms: f64,
    /// Calls that failed (each instance decided locally).
    pub errors: u64,
    /// The background's round trips by kind (`weir_state_commands_total`'s
    /// `op`), per 100 unkeyed requests of an instance, largest first.
    pub background_by_op: Vec<(&'static str, f64)>,
}

/// Runs it and prints the report (or JSON).
pub async fn print(opts: &ScaleOptions, json: bool) -> Result<(), String> {
    let r = run(opts).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "fleet: {} instances on {}, each {UPSTREAMS} upstreams x {RPS_PER_UPSTREAM} requests/s, {:.0} % keyed writes, a fleet rate limit on {LIMITED} upstreams; measured over {:.1} s",
        r.instances,
        r.topology,
        KEYED_SHARE * 100.0,
        r.seconds
    );
    println!(
        "requests {} (keyed {}); round trips {} (keyed writes' {}); commands Redis ran {}",
        r.requests, r.keyed, r.round_trips, r.keyed_round_trips, r.redis_commands
    );
    println!(
        "round trips per request {:.4}; background per 100 unkeyed requests of an instance {:.2} (target <= 1)",
        r.per_request, r.background_per_100_unkeyed
    );
    let parts: Vec<String> = r
        .background_by_op
        .iter()
        .map(|(op, n)| format!("{op} {n:.2}"))
        .collect();
    println!("  the background by kind: {}", parts.join(", "));
    println!(
        "Redis CPU {:.2} cores (target < 0.5); begin p50 {:.2} ms, p99 {:.2} ms; failed calls {}",
        r.redis_cpu_cores, r.begin_p50_ms, r.begin_p99_ms, r.errors
    );
    Ok(())
}

/// The Redis side: one server, or three cluster nodes.
struct Store {
    nodes: Vec<RedisProcess>,
    cluster: bool,
}

impl Store {
    async fn start(cluster: bool, instances: usize) -> Result<Store, String> {
        let clients = (instances * 2 + 100).to_string();
        if !cluster {
            let node = RedisProcess::start(None, &["--maxclients", &clients])?;
            return Ok(Store {
                nodes: vec![node],
                cluster,
            });
        }
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(RedisProcess::start(
                None,
                &[
                    "--maxclients",
                    &clients,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ],
            )?);
        }
        let mut create = std::process::Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("redis-cli (Debian's redis-tools): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        for n in &nodes {
            until(
                Duration::from_secs(20),
                "the cluster",
                || n.ask(&["CLUSTER", "INFO"]),
                |a| a.contains("cluster_state:ok"),
            )
            .await?;
        }
        Ok(Store { nodes, cluster })
    }

    fn config(&self, prefix: &str) -> StateConfig {
        let url = |n: &RedisProcess| format!("redis://127.0.0.1:{}", n.port);
        StateConfig {
            backend: StateBackend::Redis,
            url: (!self.cluster).then(|| url(&self.nodes[0])),
            cluster: match self.cluster {
                true => self.nodes.iter().map(url).collect(),
                false => Vec::new(),
            },
            key_prefix: prefix.to_string(),
            timeout: Duration::from_millis(50),
            refresh: Duration::from_secs(1),
            wait_timeout: Duration::from_millis(50),
            ..StateConfig::default()
        }
    }

    /// (commands processed, CPU seconds) summed over the nodes.
    fn counters(&self) -> (u64, f64) {
        let (mut all, mut cpu) = (0, 0.0);
        for n in &self.nodes {
            let stats = n.ask(&["INFO", "commandstats"]);
            for line in stats.lines() {
                let Some((_, rest)) = line.split_once(":calls=") else {
                    continue;
                };
                all += rest
                    .split(',')
                    .next()
                    .and_then(|c| c.parse::<u64>().ok())
                    .unwrap_or(0);
            }
            let info = n.ask(&["INFO", "cpu"]);
            for line in info.lines() {
                if let Some(v) = line
                    .strip_prefix("used_cpu_sys:")
                    .or_else(|| line.strip_prefix("used_cpu_user:"))
                {
                    cpu += v.trim().parse::<f64>().unwrap_or(0.0);
                }
            }
        }
        (all, cpu)
    }
}

/// The instances' counters, summed.
#[derive(Debug, Default)]
struct Offered {
    requests: AtomicU64,
    keyed: AtomicU64,
    errors: AtomicU64,
}

async fn run(opts: &ScaleOptions) -> Result<ScaleReport, String> {
    let store = Store::start(opts.cluster, opts.instances).await?;
    let prefix = format!("scale{:x}:", crate::clock::fresh_seed());
    let cfg = store.config(&prefix);
    let counts = Arc::new(Offered::default());
    let begins: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Traffic starts once every instance is connected.
    let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let names: Arc<Vec<String>> = Arc::new((0..UPSTREAMS).map(|u| format!("up{u}")).collect());
    let mut fleets = Vec::new();
    for i in 0..opts.instances {
        let f = Fleet::start(&cfg, StateMetrics::unregistered()).map_err(|e| e.to_string())?;
        fleets.push(f.clone());
        tokio::spawn(instance(
            i,
            f,
            Run {
                names: names.clone(),
                counts: counts.clone(),
                begins: begins.clone(),
                measuring: measuring.clone(),
                stop: stop.clone(),
                go: go.clone(),
            },
        ));
    }
    let up = async {
        for f in &fleets {
            while !f.is_up() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), up)
        .await
        .map_err(|_| "the instances did not all reach Redis within 60 s".to_string())?;
    go.store(true, Ordering::Relaxed);
    tokio::time::sleep(opts.warmup).await;

    let trips = |ops: &[&str]| -> u64 {
        fleets
            .iter()
            .map(|f| ops.iter().map(|op| f.metrics().commands(op)).sum::<u64>())
            .sum()
    };
    const KEYED: [&str; 3] = [
        "idempotency_begin",
        "idempotency_finish",
        "idempotency_forget",
    ];
    let (c0, cpu0) = store.counters();
    let (t0, kt0) = (trips(&crate::metrics::state::OPS), trips(&KEYED));
    let background_ops: Vec<&'static str> = crate::metrics::state::OPS
        .into_iter()
        .filter(|op| !KEYED.contains(op))
        .collect();
    let by_op0: Vec<u64> = background_ops.iter().map(|op| trips(&[op])).collect();
    let (r0, k0, e0) = (
        counts.requests.load(Ordering::Relaxed),
        counts.keyed.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed),
    );
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(opts.measure).await;
    measuring.store(false, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let (c1, cpu1) = store.counters();
    let round_trips = trips(&crate::metrics::state::OPS) - t0;
    let keyed_round_trips = trips(&KEYED) - kt0;
    let by_op: Vec<(&'static str, u64)> = background_ops
        .iter()
        .zip(by_op0)
        .map(|(op, n0)| (*op, trips(&[op]).saturating_sub(n0)))
        .collect();
    let requests = counts.requests.load(Ordering::Relaxed) - r0;
    let keyed = counts.keyed.load(Ordering::Relaxed) - k0;
    let errors = counts.errors.load(Ordering::Relaxed) - e0;
    // INFO itself is counted: two per node per reading.
    let redis_commands = c1
        .saturating_sub(c0)
        .saturating_sub(2 * store.nodes.len() as u64);
    // Per instance: its unkeyed requests, its background round trips.
    let unkeyed = requests.saturating_sub(keyed).max(1);
    let background = round_trips.saturating_sub(keyed_round_trips);
    // The instances stop before Redis does, so that none of them logs it
    // going away.
    stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(fleets);
    let mut b = begins.lock().map_err(|_| "poisoned")?.clone();
    b.sort();
    let q = |q: f64| {
        b.get(((b.len().max(1) - 1) as f64 * q) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok(ScaleReport {
        instances: opts.instances,
        topology: if opts.cluster {
            "a three-shard Redis Cluster"
        } else {
            "one redis-server"
        },
        seconds,
        requests,
        keyed,
        round_trips,
        keyed_round_trips,
        redis_commands,
        per_request: round_trips as f64 / requests.max(1) as f64,
        background_per_100_unkeyed: background as f64 * 100.0 / unkeyed as f64,
        redis_cpu_cores: (cpu1 - cpu0) / seconds,
        begin_p50_ms: q(0.5),
        begin_p99_ms: q(0.99),
        errors,
        background_by_op: {
            let mut v: Vec<(&'static str, f64)> = by_op
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .map(|(op, n)| (op, n as f64 * 100.0 / unkeyed as f64))
                .collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1));
            v
        },
    })
}

/// What every instance shares with the driver.
struct Run {
    names: Arc<Vec<String>>,
    counts: Arc<Offered>,
    begins: Arc<Mutex<Vec<Duration>>>,
    /// Keyed writes' `begin` times are kept while this is set.
    measuring: Arc<std::sync::atomic::AtomicBool>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Set once every instance is connected: traffic starts.
    go: Arc<std::sync::atomic::AtomicBool>,
}

/// One instance: its breaker refresher, its two leased buckets, and its
/// request stream, until the driver stops it.
async fn instance(i: usize, fleet: Fleet, run: Run) {
    let Run {
        names,
        counts,
        begins,
        measuring,
        stop,
        go,
    } = run;
    while !go.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(i as u64 + 1);
    let clock = Clock::new();
    // The fleet limit sits above what the fleet offers the two upstreams,
    // with `burst` at its default (one second of `rps`).
    let limit = f64::from(RPS_PER_UPSTREAM) * 1.5 * 1000.0;
    let burst = limit.ceil() as u32;
    let buckets: Vec<FleetBucket> = (0..LIMITED)
        .map(|u| FleetBucket::new(fleet.clone(), &names[u], None, limit, burst, clock))
        .collect();
    // The breaker refresher, as `state::link::refresher` runs it.
    {
        let (fleet, names) = (fleet.clone(), names.clone());
        let (counts, stop) = (counts.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(fleet.refresh_every());
            loop {
                tick.tick().await;
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                if !fleet.is_up() {
                    continue;
                }
                let n: Vec<&str> = names.iter().map(String::as_str).collect();
                if fleet.refresh(&n).await.is_err() {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    // Spread the instances' ticks over a tick.
    tokio::time::sleep(TICK.mul_f64(rng.random::<f64>())).await;
    let mut tick = tokio::time::interval(TICK);
    let per_tick = (RPS_PER_UPSTREAM as f64 * TICK.as_secs_f64()).round() as u32;
    let response =
        StoredResponse::from_buffer(201, b"content-type: text/plain\r\ncreated".to_vec(), 26);
    let mut n = 0u64;
    loop {
        tick.tick().await;
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let now = clock.now();
        for (u, name) in names.iter().enumerate() {
            for _ in 0..per_tick {
                counts.requests.fetch_add(1, Ordering::Relaxed);
                if let Some(b) = buckets.get(u) {
                    let _ = b.take(now);
                }
                if rng.random::<f64>() >= KEYED_SHARE {
                    continue;
                }
                counts.keyed.fetch_add(1, Ordering::Relaxed);
                n += 1;
                let key = format!("{i}-{n}");
                let (fleet, name) = (fleet.clone(), name.clone());
                let (counts, begins, measuring) =
                    (counts.clone(), begins.clone(), measuring.clone());
                let response = response.clone();
                tokio::spawn(async move {
                    let fp = Fingerprint::new("POST", "/orders", key.as_bytes());
                    let lease = Duration::from_secs(30);
                    let started = Instant::now();
                    let begun = fleet.idempotency_begin(&name, &key, &fp, lease).await;
                    let took = started.elapsed();
                    if begun.is_err() {
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    if measuring.load(Ordering::Relaxed) {
                        if let Ok(mut b) = begins.lock() {
                            b.push(took);
                        }
                    }
                    let ttl = Duration::from_secs(60);
                    if fleet
                        .idempotency_complete(&name, &key, &fp, &response, ttl)
                        .await
                        .is_err()
                    {
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        }
        if rng.random_range(0..TRIP_EVERY_TICKS) == 0 {
            let name = names[rng.random_range(0..UPSTREAMS)].clone();
            let fleet = fleet.clone();
            tokio::spawn(async move {
                let _ = fleet.publish_open(&name, Duration::from_secs(5)).await;
                let _ = fleet.claim_probe(&name, Duration::from_millis(200)).await;
            });
        }
    }
}
