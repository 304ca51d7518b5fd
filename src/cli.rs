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
    /// Run the retry decision on a JSON request history and print the verdict as JSON.
    ///
    /// Reads one decision input (contract version 1; see the README's "How weir decides")
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
        Command::Run { config } => run(&config.config),
        Command::Schedule { config, upstream } => schedule(&config.config, upstream.as_deref()),
        Command::Decide { input } => decide(input.as_deref()),
    }
}

fn init_logging(level: &str, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
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

fn run(path: &std::path::Path) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(serve(config))
}

async fn serve(config: Config) -> ExitCode {
    let grace = config.server.shutdown_timeout;
    let path = config.path.clone();
    let names: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
    for u in &config.upstreams {
        if u.url.scheme == crate::config::Scheme::Https {
            tracing::warn!(upstream = %u.name, "https upstreams need TLS origination, which this build does not have yet: requests to it get 502 connect_failed");
        }
    }
    let opts = crate::runtime::Options {
        watch: true,
        sighup: true,
    };
    let rt = match crate::runtime::Runtime::start(config, opts).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        config = %path.display(),
        listen = %rt.proxy.listen_addr(),
        admin = %rt.admin_addr,
        dedicated = ?rt.proxy.upstream_addrs(),
        upstreams = ?names,
        "weir is serving"
    );
    shutdown_signal().await;
    tracing::info!(
        ?grace,
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
