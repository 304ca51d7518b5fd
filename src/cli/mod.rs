//! The command line. `main.rs` calls [`main`]; everything an operator can
//! type is defined here, with help written for them.

pub mod chaos;
#[doc(hidden)]
pub mod fuzzing;
pub mod health;

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
    /// The config file [default: config/weir.toml when it exists, else the built-in default,
    /// which is the same]. A file named here must exist.
    #[arg(long, short, env = "WEIR_CONFIG")]
    pub config: Option<PathBuf>,
}

/// Where the config comes from when `--config` does not say.
const DEFAULT_CONFIG: &str = "config/weir.toml";

impl ConfigArg {
    /// The file to read: the one named, else `config/weir.toml` when it
    /// exists; `None`: the built-in default.
    pub fn file(&self) -> Option<PathBuf> {
        match &self.config {
            Some(p) => Some(p.clone()),
            None => {
                let p = PathBuf::from(DEFAULT_CONFIG);
                p.exists().then_some(p)
            }
        }
    }
}

/// Settings over the config file, or a config made on the command line
/// (docs/reference/cli.md#config-from-the-command-line).
#[derive(Debug, clap::Args)]
pub struct OverrideArgs {
    /// Serve the shared listener here (sets `[server] listen`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Serve the admin listener here (sets `[server] admin`).
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<std::net::SocketAddr>,
    /// Set upstream NAME's url, or add upstream NAME, reached with `Host: NAME` (repeatable).
    /// Over the built-in default, these replace its example upstream `app`.
    #[arg(long = "upstream", value_name = "NAME=URL", value_parser = crate::config::overrides::parse_upstream)]
    pub upstreams: Vec<(String, String)>,
}

impl OverrideArgs {
    fn overrides(&self, builtin: bool) -> crate::config::Overrides {
        crate::config::Overrides {
            listen: self.listen,
            admin: self.admin,
            upstreams: self.upstreams.clone(),
            replace_upstreams: builtin,
        }
    }
}

/// The config `run` and `check` use: the file or the built-in default,
/// with the command line's settings over it.
fn load(config: &ConfigArg, over: &OverrideArgs) -> Result<Config, crate::config::ConfigErrors> {
    let file = config.file();
    Config::load_with(file.as_deref(), &over.overrides(file.is_none()))
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
        #[command(flatten)]
        over: OverrideArgs,
        /// Worker threads serving traffic, each with its own event loop and its own
        /// SO_REUSEPORT listening sockets (default: the CPUs available to the process).
        #[arg(long, env = "WEIR_WORKERS")]
        workers: Option<usize>,
    },
    /// Validate a config file and print the effective config (every default filled in).
    ///
    /// Exit 0 when valid. Otherwise every error is printed with its file, line, column and
    /// field path, and the exit code is 1 — use it in CI before shipping a config. Every
    /// warning and note is printed too, errors or not; with --strict a warning exits 1.
    Check {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        over: OverrideArgs,
        /// Exit 1 on any warning too, not only on errors (for CI).
        #[arg(long)]
        strict: bool,
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
    Chaos(crate::cli::chaos::command::ChaosArgs),
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
        Command::Check {
            config,
            over,
            strict,
        } => check(&config, &over, strict),
        Command::Run {
            config,
            over,
            workers,
        } => run(&config, &over, workers),
        Command::Schedule { config, upstream } => schedule(&config, upstream.as_deref()),
        Command::Decide { input } => decide(input.as_deref()),
        Command::Health {
            config,
            admin,
            path,
            timeout,
        } => crate::cli::health::run(config.file().as_deref(), admin, &path, timeout),
        Command::Chaos(args) => crate::cli::chaos::command::run(args),
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
        LogFormat::Text => b.fmt_fields(one_line_fields()).try_init(),
        LogFormat::Json => b.json().flatten_event(true).try_init(),
    };
}

/// The text format's fields as the default writes them (`name=value`, the
/// message bare, strings quoted), but never over two lines: a value written
/// with `%` (an error's Display) may hold line breaks, and a log shipper
/// takes each line for an event. They are escaped as `\n`, `\r`, and other
/// control characters as `\u{…}` (docs/reference/logs.md#logs). JSON escapes
/// them already.
fn one_line_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let raw = format!("{value:?}");
        let text = one_line(&raw);
        match field.name() {
            "message" => write!(w, "{text}"),
            name => write!(w, "{}={text}", name.strip_prefix("r#").unwrap_or(name)),
        }
    })
    .delimited(" ")
}

/// `s` with every control character escaped: one line whatever it holds.
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push('\t'),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `weir check`: the errors, then every warning and note found in the same
/// pass (those of the upstreams that validated, when some did not); with
/// `strict`, a warning fails the check too (docs/reference/cli.md#command-line).
fn check(config: &ConfigArg, over: &OverrideArgs, strict: bool) -> ExitCode {
    let file = config.file();
    let (checked, advice) = Config::load_checked(file.as_deref(), &over.overrides(file.is_none()));
    let warnings = advice.iter().filter(|a| a.is_warning()).count();
    match checked {
        Ok(c) => {
            print!("{}", c.effective_toml());
            for a in &advice {
                eprintln!("{a}");
            }
            if strict && warnings > 0 {
                eprintln!(
                    "{}: {warnings} warning{} (--strict: a warning fails the check)",
                    c.path.display(),
                    if warnings == 1 { "" } else { "s" }
                );
                return ExitCode::FAILURE;
            }
            eprintln!("{}: ok ({} upstreams)", c.path.display(), c.upstreams.len());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            for a in &advice {
                eprintln!("{a}");
            }
            ExitCode::FAILURE
        }
    }
}

fn schedule(config: &ConfigArg, only: Option<&str>) -> ExitCode {
    let file = config.file();
    let config = match Config::load_with(file.as_deref(), &Default::default()) {
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
            config.path.display()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// How to call weir, for the startup line: `curl` through the first
/// upstream with an exact host on the shared listener, or else the first
/// with a dedicated listener (docs/reference/cli.md#config-from-the-command-line).
fn try_it(
    config: &Config,
    listen: std::net::SocketAddr,
    dedicated: &std::collections::BTreeMap<String, std::net::SocketAddr>,
) -> Option<String> {
    for u in &config.upstreams {
        let host = u.hosts.iter().find_map(|h| match h {
            crate::config::HostPattern::Exact(h) => Some(h),
            crate::config::HostPattern::Suffix(_) => None,
        });
        if let Some(host) = host {
            let prefix = u.path_prefix.trim_end_matches('/');
            return Some(format!("curl -H 'Host: {host}' http://{listen}{prefix}/"));
        }
    }
    let (_, addr) = dedicated.iter().next()?;
    Some(format!("curl http://{addr}/"))
}

/// A warning for each listener bound beyond loopback (an unspecified
/// address such as `0.0.0.0`, or any other that is not loopback), saying
/// what it lets other hosts reach (docs/reference/cli.md#command-line).
fn exposure(
    config: &Config,
    listen: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    dedicated: &std::collections::BTreeMap<String, std::net::SocketAddr>,
) -> Vec<(std::net::SocketAddr, String)> {
    let beyond = |a: &std::net::SocketAddr| !a.ip().is_loopback();
    let mut out = Vec::new();
    if beyond(&listen) {
        let routed: Vec<String> = config
            .upstreams
            .iter()
            .filter(|u| !u.hosts.is_empty())
            .map(|u| format!("`{}` ({})", u.name, u.url.origin()))
            .collect();
        let to = if routed.is_empty() {
            "no upstream (none is routed by host)".to_string()
        } else {
            routed.join(", ")
        };
        out.push((
            listen,
            format!(
                "the shared listener is bound beyond loopback: any host that can reach this one on \
                 port {} can send requests through weir, with its policy and its place in the \
                 network, to {to}; bind it to 127.0.0.1 unless other hosts are meant to call it",
                listen.port()
            ),
        ));
    }
    for (name, addr) in dedicated.iter().filter(|(_, a)| beyond(a)) {
        let target = config
            .upstream(name)
            .map(|u| u.url.origin())
            .unwrap_or_default();
        out.push((
            *addr,
            format!(
                "the listener of upstream `{name}` is bound beyond loopback: any host that can \
                 reach this one on port {} can send requests through weir to `{name}` ({target})",
                addr.port()
            ),
        ));
    }
    if beyond(&admin) {
        out.push((
            admin,
            format!(
                "the admin listener is bound beyond loopback: /metrics, /healthz and /readyz \
                 answer any host that can reach this one on port {}; /config, /reload and the \
                 status page still answer loopback peers only",
                admin.port()
            ),
        ));
    }
    out
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

fn run(config: &ConfigArg, over: &OverrideArgs, workers: Option<usize>) -> ExitCode {
    let config = match load(config, over) {
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
    if config.is_builtin() {
        tracing::info!(
            "no config file (none named, no {DEFAULT_CONFIG} here): serving the built-in default, \
             which is {DEFAULT_CONFIG} as shipped; `weir check` prints it"
        );
    }
    // What `weir check` warns about (not its notes) is worth a line here.
    for w in config.warnings() {
        tracing::warn!(config = %config.path.display(), "{w}");
    }
    let path = config.path.clone();
    let names: Vec<String> = config.upstreams.iter().map(|u| u.name.clone()).collect();
    let opts = crate::runtime::Options {
        // The built-in default has no file to watch; SIGHUP and POST
        // /reload read it again, with the command line's settings.
        watch: !config.is_builtin(),
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
    let addrs = rt.proxy.upstream_addrs();
    let dedicated = addrs
        .iter()
        .map(|(n, a)| format!("{n}={a}"))
        .collect::<Vec<_>>()
        .join(",");
    let listen = rt.proxy.listen_addr();
    let example = try_it(&rt.proxy.snapshot().config, listen, &addrs);
    for (address, w) in exposure(&rt.proxy.snapshot().config, listen, rt.admin_addr, &addrs) {
        tracing::warn!(address = %address, "{w}");
    }
    tracing::info!(
        config = %path.display(),
        listen = %listen,
        admin = %rt.admin_addr,
        dedicated = (!dedicated.is_empty()).then_some(dedicated.as_str()),
        upstreams = %names.join(","),
        workers,
        r#try = example.as_deref(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dedicated_listener_beyond_loopback_is_said_with_its_upstream() {
        let src = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
                   [upstreams.pay]\nurl = \"https://pay.example:8443/v1\"\nlisten = \"10.0.0.5:9001\"\n\
                   [upstreams.app]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"app\"]\nlisten = \"127.0.0.1:9002\"\n";
        let config =
            Config::parse(std::path::Path::new("t.toml"), src).unwrap_or_else(|e| panic!("{e}"));
        let local = |p: u16| std::net::SocketAddr::from(([127, 0, 0, 1], p));
        let dedicated = [
            (
                "pay".to_string(),
                "10.0.0.5:9001".parse().unwrap_or(local(1)),
            ),
            ("app".to_string(), local(9002)),
        ]
        .into_iter()
        .collect();
        let w = exposure(&config, local(15001), local(15000), &dedicated);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, "10.0.0.5:9001".parse().unwrap_or(local(1)));
        assert_eq!(
            w[0].1,
            "the listener of upstream `pay` is bound beyond loopback: any host that can reach \
             this one on port 9001 can send requests through weir to `pay` (https://pay.example:8443)"
        );
    }
}
