//! The command line. `main.rs` calls [`main`]; everything an operator can
//! type is defined here, with help written for them.

use crate::config::Config;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "weir",
    version,
    about = "A sidecar resilience proxy: deadlines, safe retries, retry budgets, circuit breaking and limits in front of a flaky upstream.",
    long_about = "weir runs next to your application. Point the application's outbound HTTP at weir's \
listener on localhost; weir forwards each request to the upstream its config names and applies that \
upstream's policy: deadlines, retries with backoff that never replay an unsafe request, a retry budget, \
a circuit breaker, rate and concurrency limits.\n\nStart with `weir check` to see the effective config, \
then `weir run`."
)]
pub struct Cli {
    /// Log level or filter (error, warn, info, debug, trace, or a tracing filter such as
    /// `weir=debug,hyper=info`). RUST_LOG, when set, wins.
    #[arg(long, global = true, default_value = "info", env = "WEIR_LOG_LEVEL")]
    pub log_level: String,
    /// Log line format: `text` for people, `json` for log pipelines.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "WEIR_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct ConfigArg {
    /// The config file.
    #[arg(long, short, env = "WEIR_CONFIG", default_value = "config/weir.toml")]
    pub config: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    #[command(subcommand)]
    pub upstream: Option<ChaosCommand>,
    /// The scenario; all of them when absent.
    #[arg(value_enum)]
    pub scenario: Option<crate::chaos::Scenario>,
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
}

#[derive(Debug, Subcommand)]
pub enum ChaosCommand {
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
        profile: crate::chaos::Scenario,
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

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve traffic: bind the listeners in the config and proxy until SIGTERM or Ctrl-C.
    ///
    /// An invalid config is reported (file, line, column, field) and weir exits 1 without
    /// binding anything. On SIGTERM/SIGINT weir stops accepting, lets in-flight requests
    /// finish for up to `server.shutdown_timeout`, and exits 0.
    Run {
        #[command(flatten)]
        config: ConfigArg,
        /// Worker threads serving traffic, each with its own event loop and its own
        /// SO_REUSEPORT listening sockets (default: the CPUs available to the process).
        #[arg(long, env = "WEIR_WORKERS")]
        workers: Option<usize>,
    },
    /// Validate a config file and print the effective config (every default filled in).
    ///
    /// Exit 0 when valid. Otherwise every error is printed with its file, line, column and
    /// field path, and the exit code is 1 — use it in CI before shipping a config.
    Check {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Show each upstream's retry schedule: every retry's delay range, the worst-case wait.
    ///
    /// For each upstream (or just `--upstream NAME`): the backoff policy, each retry's
    /// delay envelope (min / max after jitter), the worst-case total wait, and a warning
    /// when `max_attempts` attempts cannot fit in `timeout`.
    Schedule {
        #[command(flatten)]
        config: ConfigArg,
        /// Only this upstream.
        #[arg(long)]
        upstream: Option<String>,
    },
    /// Measure what weir does for a client of a misbehaving upstream.
    ///
    /// Starts a fault-injecting upstream, weir (in-process, on its default policy plus the
    /// few settings the scenario's story needs, which the table prints) and a load driver,
    /// and prints one table with three columns: no weir, a naive retry loop (3 attempts,
    /// fixed backoff, no budget, no breaker), and weir. `--config FILE` merges that
    /// file's `[defaults]` over the scenario's settings. Without a SCENARIO every scenario
    /// runs in turn.
    /// `weir chaos upstream` runs the fault-injecting upstream alone, to rehearse your own
    /// policy against it.
    #[command(args_conflicts_with_subcommands = true)]
    Chaos(ChaosArgs),
    /// Ask a running weir whether it is ready: exit 0 when its admin listener answers 200.
    ///
    /// `GET /readyz` (or `--path`) over plain HTTP to the admin listener: `--admin ADDR`,
    /// or the `[server] admin` of the config file (only that field is read, so an invalid
    /// edit waiting to be reloaded does not fail the check). An unspecified address
    /// (0.0.0.0, [::]) is asked on loopback. Prints the status and body; exit 1 on any
    /// other status, a refused connection or no answer within --timeout. For container
    /// health checks: the image has no curl.
    Health {
        #[command(flatten)]
        config: ConfigArg,
        /// The admin listener's address (instead of reading it from the config).
        #[arg(long)]
        admin: Option<std::net::SocketAddr>,
        /// `/readyz` (ready for traffic; 503 while draining) or `/healthz` (alive).
        #[arg(long, default_value = "/readyz")]
        path: String,
        /// Give up after this long, connecting included.
        #[arg(long, default_value = "2s", value_parser = crate::config::duration::parse)]
        timeout: std::time::Duration,
    },
    /// Run the retry decision on a JSON request history and print the verdict as JSON.
    ///
    /// Reads one decision input (contract version 1; see docs/reference/cli.md#weir-decide)
    /// from `--input FILE` or stdin, and prints e.g.
    /// `{"contract_version":1,"decision":"retry","delay_ms":3000,"cause":"status_503"}`.
    /// Exit 1 on malformed input.
    Decide {
        /// The input file; `-` or absent reads stdin.
        #[arg(long)]
        input: Option<PathBuf>,
    },
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_level, cli.log_format);
    match cli.command {
        Command::Check { config } => check(&config.config),
        Command::Run { config, workers } => run(&config.config, workers),
        Command::Schedule { config, upstream } => schedule(&config.config, upstream.as_deref()),
        Command::Decide { input } => decide(input.as_deref()),
        Command::Health {
            config,
            admin,
            path,
            timeout,
        } => crate::health::run(&config.config, admin, &path, timeout),
        Command::Chaos(args) => chaos(args),
    }
}

fn init_logging(level: &str, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: never in a file, a pipe or a
    // container log, and never with NO_COLOR set.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => b.try_init(),
        LogFormat::Json => b.json().flatten_event(true).try_init(),
    };
}

fn check(path: &std::path::Path) -> ExitCode {
    match Config::load(path) {
        Ok(c) => {
            print!("{}", c.effective_toml());
            eprintln!("{}: ok ({} upstreams)", path.display(), c.upstreams.len());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}

fn schedule(path: &std::path::Path, only: Option<&str>) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::FAILURE;
        }
    };
    let mut shown = 0;
    for u in &config.upstreams {
        if only.is_some_and(|n| n != u.name) {
            continue;
        }
        shown += 1;
        print!(
            "{}",
            crate::policy::schedule_report_with(&u.name, &u.retry, u.timeout, u.per_try_timeout)
        );
        println!();
    }
    if shown == 0 {
        eprintln!(
            "no upstream named {:?} in {}",
            only.unwrap_or_default(),
            path.display()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn decide(input: Option<&std::path::Path>) -> ExitCode {
    use std::io::Read as _;
    let mut text = String::new();
    let read = match input {
        Some(p) if p != std::path::Path::new("-") => std::fs::read_to_string(p).map(|t| text = t),
        _ => std::io::stdin().read_to_string(&mut text).map(|_| ()),
    };
    if let Err(e) = read {
        eprintln!("cannot read the decision input: {e}");
        return ExitCode::FAILURE;
    }
    let parsed: crate::policy::DecisionInput = match serde_json::from_str(&text) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("invalid decision input: {e}");
            return ExitCode::FAILURE;
        }
    };
    match crate::policy::decide_json(&parsed) {
        Ok(v) => match serde_json::to_string(&v) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cannot print the verdict: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("invalid decision input: `{}`: {}", e.field, e.message);
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            None
        }
    }
}

fn chaos(args: ChaosArgs) -> ExitCode {
    let Some(rt) = runtime() else {
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
        let opts = crate::chaos::soak::SoakOptions {
            weir,
            duration,
            interval,
            warmup,
            rate,
            seed,
        };
        return match rt.block_on(crate::chaos::soak::print(&opts)) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("soak: {e}");
                ExitCode::FAILURE
            }
        };
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
            p.throttle = Some(crate::chaos::upstream::Throttle {
                rps,
                status: 429,
                retry_after: 1,
            });
        }
        if let Some(l) = latency {
            match crate::chaos::upstream::parse_latency(&l) {
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
            match crate::chaos::upstream::parse_outage(&o) {
                Ok(w) => p.outages.push(w),
                Err(e) => {
                    eprintln!("--outage: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        return rt.block_on(async move {
            let up =
                match crate::chaos::upstream::ChaosUpstream::start(listen, p.clone(), seed).await {
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
                    _ = shutdown_signal() => break,
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
    let opts = crate::chaos::Options {
        requests: args.requests,
        rate: args.rate,
        seed: args.seed,
        config: args.config,
        weir_only: false,
        h2c: args.h2c,
    };
    let scenarios: Vec<crate::chaos::Scenario> = match args.scenario {
        Some(s) => vec![s],
        None => crate::chaos::Scenario::ALL.to_vec(),
    };
    rt.block_on(async move {
        let mut all = Vec::new();
        for s in scenarios {
            match crate::chaos::run(s, &opts).await {
                Ok(r) => {
                    if args.json {
                        all.push(crate::chaos::report::json(&r));
                    } else {
                        println!("{}", crate::chaos::report::table(&r));
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

fn run(path: &std::path::Path, workers: Option<usize>) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::FAILURE;
        }
    };
    let workers = workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    // The control runtime (admin, signals, reloads) is one thread; traffic
    // runs on the workers.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(serve(config, workers))
}

async fn serve(config: Config, workers: usize) -> ExitCode {
    let path = config.path.clone();
    let names: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
    let opts = crate::runtime::Options {
        watch: true,
        sighup: true,
        workers,
    };
    let rt = match crate::runtime::Runtime::start(config, opts).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        config = %path.display(),
        listen = %rt.proxy.listen_addr(),
        admin = %rt.admin_addr,
        dedicated = %rt
            .proxy
            .upstream_addrs()
            .iter()
            .map(|(n, a)| format!("{n}={a}"))
            .collect::<Vec<_>>()
            .join(","),
        upstreams = %names.join(","),
        workers,
        "weir is serving"
    );
    shutdown_signal().await;
    // The config in force now: a reload may have changed it.
    let grace = rt.proxy.snapshot().config.server.shutdown_timeout;
    tracing::info!(
        grace = %crate::config::duration::format(grace),
        "shutting down: /readyz is 503, no new connections, finishing requests in flight"
    );
    tokio::select! {
        _ = rt.shutdown(grace) => {}
        _ = shutdown_signal() => {
            tracing::warn!("second signal: exiting now");
            return ExitCode::from(130);
        }
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
