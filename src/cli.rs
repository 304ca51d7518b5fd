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
    Chaos(crate::chaos::command::ChaosArgs),
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
        Command::Chaos(args) => crate::chaos::command::run(args),
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
            for note in c.notes() {
                eprintln!("{note}");
            }
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
    crate::shutdown::signal().await;
    // The config in force now: a reload may have changed it.
    let grace = rt.proxy.snapshot().config.server.shutdown_timeout;
    tracing::info!(
        grace = %crate::config::duration::format(grace),
        "shutting down: /readyz is 503, no new connections, finishing requests in flight"
    );
    tokio::select! {
        _ = rt.shutdown(grace) => {}
        _ = crate::shutdown::signal() => {
            tracing::warn!("second signal: exiting now");
            return ExitCode::from(130);
        }
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
