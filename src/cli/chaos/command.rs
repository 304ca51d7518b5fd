//! `weir chaos …` on the command line: the scenarios, the fault-injecting
//! upstream alone, the soak, and the load client of the benchmarks.

use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    #[command(subcommand)]
    pub upstream: Option<ChaosCommand>,
    /// The scenario; all of them when absent.
    #[arg(value_enum)]
    pub scenario: Option<crate::cli::chaos::Scenario>,
    /// Client requests per column (each scenario has its own default).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Offer this many requests per second (open loop) instead of the scenario's load.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seed of the upstream's fault draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Merge this file's `[defaults]` over the scenario's settings (the file wins, field by field).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// The replica scenarios: weir speaks h2c to the replicas.
    #[arg(long)]
    pub h2c: bool,
    /// `overload`: add a column for a proxy already running, NAME=PROXY,UPSTREAM
    /// (repeatable). Load level i (from 0) is sent to PROXY's port + i, and
    /// that level's fresh upstream listens on UPSTREAM's port + i, where the
    /// proxy is to forward it.
    #[arg(long, value_name = "NAME=PROXY,UPSTREAM", value_parser = crate::cli::chaos::overload::ViaProxy::parse)]
    pub via: Vec<crate::cli::chaos::overload::ViaProxy>,
}

#[derive(Debug, Subcommand)]
pub enum ChaosCommand {
    /// Send GETs to a proxy (or a server) from a closed loop of clients and
    /// print what they saw, one line: `TAIL requests successes p50_ms p99_ms
    /// p99.9_ms` (the client of `bench/slow-tail.sh`; each latency is a
    /// whole response, every request counted).
    Load {
        /// Where to send them.
        #[arg(long)]
        target: std::net::SocketAddr,
        /// The `Host` they name.
        #[arg(long, default_value = "svc")]
        host: String,
        #[arg(long, default_value_t = 3000)]
        requests: usize,
        /// Connections, each sending its next request when its last is answered.
        #[arg(long, default_value_t = 16)]
        clients: usize,
    },
    /// Run the weir binary under load against the faulty upstream for a long while, and
    /// fail (exit 1) if its RSS or open fds grow by more than 10 % after the warm-up.
    ///
    /// Prints RSS, fds, requests/s and 2xx share every --interval.
    Soak {
        /// How long to run.
        #[arg(long, default_value = "10m", value_parser = crate::config::duration::parse)]
        duration: std::time::Duration,
        #[arg(long, default_value = "10s", value_parser = crate::config::duration::parse)]
        interval: std::time::Duration,
        /// Samples in this first stretch are shown but not judged.
        #[arg(long, default_value = "1m", value_parser = crate::config::duration::parse)]
        warmup: std::time::Duration,
        /// Requests offered per second (open loop).
        #[arg(long, default_value_t = 2000.0)]
        rate: f64,
        /// The weir binary to run (default: this one).
        #[arg(long)]
        weir: Option<PathBuf>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Keyed writes through two weirs while their Redis primary dies: starts
    /// a primary, a replica and three Sentinels (`redis-server`, which must be
    /// on the PATH), kills the primary halfway, and prints, per setting, the
    /// keys delivered twice, the writes refused, how long the shared state
    /// was gone, and whether the breaker was shared before and after
    /// (docs/reference/fleet.md#when-redis-fails).
    RedisFailover {
        /// Keyed POSTs per second (each is sent again through the other
        /// instance 300 ms later).
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
        /// How long the writes go on; the primary dies halfway.
        #[arg(long, default_value = "6s", value_parser = crate::config::duration::parse)]
        duration: std::time::Duration,
        /// `[state] wait_replicas` values to run (repeatable; default 0 and 1).
        #[arg(long)]
        wait_replicas: Vec<u8>,
        /// `[state] on_unavailable` values to run (repeatable; default local and refuse).
        #[arg(long, value_parser = ["local", "refuse"])]
        on_unavailable: Vec<String>,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// What a fleet of sidecars costs one Redis: N of weir's state clients in
    /// this process (each a whole instance's: connection, heartbeat, breaker
    /// refresher, leased buckets, keyed writes), against a `redis-server` it
    /// starts (or a three-shard Cluster), with 10 upstreams x 20 requests/s
    /// each, 5 % keyed writes; prints Redis round trips per request, Redis's
    /// CPU and `begin`'s p99 (docs/reference/fleet.md#cost-at-scale).
    Fleet {
        #[arg(long, default_value_t = 1000)]
        instances: usize,
        /// Three Redis Cluster shards instead of one server.
        #[arg(long)]
        cluster: bool,
        #[arg(long, default_value = "5s", value_parser = crate::config::duration::parse)]
        warmup: std::time::Duration,
        #[arg(long, default_value = "20s", value_parser = crate::config::duration::parse)]
        measure: std::time::Duration,
        /// Print JSON instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// Run the fault-injecting upstream alone until Ctrl-C.
    ///
    /// Start from a scenario's profile and adjust it: e.g.
    /// `weir chaos upstream --listen 127.0.0.1:8080 --profile transient-30 --latency uniform:5ms-50ms`.
    /// It counts every request it receives, and duplicate deliveries of POSTs by the
    /// `x-chaos-request-id` header.
    Upstream {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Start from this scenario's profile.
        #[arg(long, value_enum, default_value = "transient-5")]
        profile: crate::cli::chaos::Scenario,
        /// Share of requests answered with --fail-status (0–1).
        #[arg(long)]
        fail_rate: Option<f64>,
        /// Status for failed requests.
        #[arg(long)]
        fail_status: Option<u16>,
        /// Share of requests reset before they are read (0–1).
        #[arg(long)]
        reset_before: Option<f64>,
        /// Share of requests reset after they are processed (0–1).
        #[arg(long)]
        reset_after: Option<f64>,
        /// `none`, `fixed:20ms`, `uniform:1ms-50ms` or `tail:2ms,1%,500ms`.
        #[arg(long)]
        latency: Option<String>,
        /// Refuse connections from START for LEN after the upstream starts: `10s+30s`. Repeatable.
        #[arg(long)]
        outage: Vec<String>,
        /// Above this many requests per second, answer 429 with Retry-After.
        #[arg(long)]
        throttle_rps: Option<f64>,
        /// Share of requests processed, then answered only after 5 s (0–1).
        #[arg(long)]
        hang_rate: Option<f64>,
        /// Seed of the fault draws.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Runs `weir chaos …`.
pub fn run(args: ChaosArgs) -> ExitCode {
    let Some(rt) = crate::runtime::build() else {
        return ExitCode::FAILURE;
    };
    if let Some(ChaosCommand::Soak {
        duration,
        interval,
        warmup,
        rate,
        weir,
        seed,
    }) = args.upstream
    {
        let weir = match weir.map_or_else(std::env::current_exe, Ok) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("cannot find the weir binary: {e}");
                return ExitCode::FAILURE;
            }
        };
        let opts = crate::cli::chaos::soak::SoakOptions {
            weir,
            duration,
            interval,
            warmup,
            rate,
            seed,
        };
        return match rt.block_on(crate::cli::chaos::soak::print(&opts)) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("soak: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(ChaosCommand::Fleet {
        instances,
        cluster,
        warmup,
        measure,
        json,
    }) = &args.upstream
    {
        let opts = crate::cli::chaos::fleet_scale::ScaleOptions {
            instances: *instances,
            warmup: *warmup,
            measure: *measure,
            cluster: *cluster,
        };
        return match rt.block_on(crate::cli::chaos::fleet_scale::print(&opts, *json)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fleet: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(ChaosCommand::RedisFailover {
        rate,
        duration,
        wait_replicas,
        on_unavailable,
        json,
    }) = &args.upstream
    {
        use crate::config::OnUnavailable;
        let opts = crate::cli::chaos::redis_failover::FailoverOptions {
            rate: *rate,
            duration: *duration,
            wait_replicas: match wait_replicas.is_empty() {
                true => vec![0, 1],
                false => wait_replicas.clone(),
            },
            on_unavailable: match on_unavailable.is_empty() {
                true => vec![OnUnavailable::Local, OnUnavailable::Refuse],
                false => on_unavailable
                    .iter()
                    .map(|o| match o.as_str() {
                        "refuse" => OnUnavailable::Refuse,
                        _ => OnUnavailable::Local,
                    })
                    .collect(),
            },
        };
        return match rt.block_on(crate::cli::chaos::redis_failover::print(&opts, *json)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("redis-failover: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(ChaosCommand::Load {
        target,
        host,
        requests,
        clients,
    }) = &args.upstream
    {
        use crate::cli::chaos::driver::{drive, Load, Mode, Target};
        let load = Load {
            requests: *requests,
            mode: Mode::Closed((*clients).max(1)),
            max_time: std::time::Duration::from_secs(300),
            method: http::Method::GET,
            client_timeout: std::time::Duration::from_secs(10),
            keys: None,
        };
        let target = Target::Weir {
            addr: *target,
            host: host.clone(),
        };
        let o = rt.block_on(drive(target, load));
        let ms = |q: f64| o.percentile(q).as_secs_f64() * 1000.0;
        println!(
            "TAIL {} {} {:.1} {:.1} {:.1}",
            o.requests,
            o.successes,
            ms(0.50),
            ms(0.99),
            ms(0.999)
        );
        return ExitCode::SUCCESS;
    }
    if let Some(ChaosCommand::Upstream {
        listen,
        profile,
        fail_rate,
        fail_status,
        reset_before,
        reset_after,
        latency,
        outage,
        throttle_rps,
        hang_rate,
        seed,
    }) = args.upstream
    {
        let mut p = profile.profile();
        if let Some(v) = fail_rate {
            p.fail_rate = v;
        }
        if let Some(v) = fail_status {
            p.fail_status = v;
        }
        if let Some(v) = reset_before {
            p.reset_before = v;
        }
        if let Some(v) = reset_after {
            p.reset_after = v;
        }
        if let Some(v) = hang_rate {
            p.hang_rate = v;
        }
        if let Some(rps) = throttle_rps {
            p.throttle = Some(crate::cli::chaos::upstream::Throttle {
                rps,
                status: 429,
                retry_after: 1,
            });
        }
        if let Some(l) = latency {
            match crate::cli::chaos::upstream::parse_latency(&l) {
                Ok(l) => p.latency = l,
                Err(e) => {
                    eprintln!("--latency: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        if !outage.is_empty() {
            p.outages.clear();
        }
        for o in outage {
            match crate::cli::chaos::upstream::parse_outage(&o) {
                Ok(w) => p.outages.push(w),
                Err(e) => {
                    eprintln!("--outage: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        return rt.block_on(async move {
            let up =
                match crate::cli::chaos::upstream::ChaosUpstream::start(listen, p.clone(), seed)
                    .await
                {
                    Ok(u) => u,
                    Err(e) => {
                        eprintln!("cannot listen on {listen}: {e}");
                        return ExitCode::FAILURE;
                    }
                };
            tracing::info!(listen = %up.addr, profile = ?p, "chaos upstream serving");
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(10));
            loop {
                tokio::select! {
                    _ = tick.tick() => tracing::info!(
                        received = up.counters.received(),
                        duplicate_posts = up.counters.duplicates(),
                        "chaos upstream counts"
                    ),
                    _ = crate::shutdown::signal() => break,
                }
            }
            println!(
                "received {} requests, {} duplicate POST deliveries",
                up.counters.received(),
                up.counters.duplicates()
            );
            ExitCode::SUCCESS
        });
    }
    if !args.via.is_empty() && args.scenario != Some(crate::cli::chaos::Scenario::Overload) {
        eprintln!("--via applies to `weir chaos overload` only");
        return ExitCode::FAILURE;
    }
    let opts = crate::cli::chaos::ScenarioOptions {
        requests: args.requests,
        rate: args.rate,
        seed: args.seed,
        config: args.config,
        weir_only: false,
        h2c: args.h2c,
        via: args.via,
    };
    let scenarios: Vec<crate::cli::chaos::Scenario> = match args.scenario {
        Some(s) => vec![s],
        None => crate::cli::chaos::Scenario::ALL.to_vec(),
    };
    rt.block_on(async move {
        let mut all = Vec::new();
        for s in scenarios {
            match crate::cli::chaos::run(s, &opts).await {
                Ok(r) => {
                    if args.json {
                        all.push(crate::cli::chaos::report::json(&r));
                    } else {
                        println!("{}", crate::cli::chaos::report::table(&r));
                    }
                }
                Err(e) => {
                    eprintln!("{}: {e}", s.name());
                    return ExitCode::FAILURE;
                }
            }
        }
        if args.json {
            let v = if all.len() == 1 {
                all.remove(0)
            } else {
                serde_json::Value::Array(all)
            };
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        ExitCode::SUCCESS
    })
}
