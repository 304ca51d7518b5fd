//! Configuration (docs/reference/configuration.md#configuration-and-defaults): the text is
//! checked against the raw serde model ([`raw`]) table by table (`schema`:
//! every unknown field and wrong type at once), merged (`[upstreams.NAME]`
//! over `[defaults]` over the built-in defaults), validated (`validate`),
//! and the files it names are loaded ([`files`]), into a typed [`Config`]
//! snapshot. Only validated snapshots are ever handed to the data plane; a
//! file that fails leaves the running config in place.
//!
//! Owns: parsing, defaults, validation, the files a config names, error
//! locations. Must not: touch the network or any live state.

pub mod duration;
pub mod error;
pub mod files;
mod notes;
pub mod overrides;
pub mod raw;
mod schema;
mod state;
mod validate;

pub use error::{ConfigError, ConfigErrors};
pub use notes::{Advice, Severity};
pub use overrides::Overrides;
pub use state::{redact_url, OnUnavailable, RedisTopology, StateBackend, StateConfig};

/// The default config, `config/weir.toml`, built into the binary: what
/// `weir run` serves when no config file is named and none is found
/// (docs/reference/cli.md#config-from-the-command-line).
pub const BUILTIN: &str = include_str!("../../config/weir.toml");

/// How messages, logs and `/config` name [`BUILTIN`] in place of a path.
pub const BUILTIN_NAME: &str = "(built-in default)";
pub use schema::catalogue;

use crate::address::Address;
use crate::policy::{BreakerParams, CacheParams, IdempotencyParams, RateLimitParams, RetryPolicy};
use http::HeaderName;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The `upstream` label of requests that reached no upstream (no route, a
/// malformed request): a fixed value, so a query can select them. No upstream
/// may be named this (the config refuses it).
pub const NO_UPSTREAM: &str = "none";

/// A validated configuration snapshot.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    pub server: ServerConfig,
    /// Where the state a fleet shares is kept (`[state]`).
    pub state: StateConfig,
    /// Spans over OTLP (`[tracing]`).
    pub tracing: TracingConfig,
    /// Sorted by name.
    pub upstreams: Vec<Arc<UpstreamConfig>>,
    /// The effective, merged config in its raw form, for `weir check` and `/config`.
    pub effective: raw::RawConfig,
    /// What this valid config does that its author may not expect
    /// (`weir check`'s warnings and notes, in file order, then by upstream).
    pub advice: Vec<Advice>,
    /// What the command line set over the file; every reload applies it
    /// again.
    pub overrides: Overrides,
    /// SHA-256 of the text it was parsed from, in hex: `/status.json`
    /// compares the file on disk with it (docs/reference/admin.md#status-page).
    pub source_sha256: String,
}

/// SHA-256 of a config's text, in hex ([`Config::source_sha256`]).
pub fn text_sha256(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Which requests get an access-log line (docs/reference/logs.md#logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessLog {
    /// None.
    Off,
    /// Those answered with one of weir's errors or a 5xx.
    #[default]
    Errors,
    /// Every request.
    All,
}

/// `[tracing] protocol`: how spans travel to the collector
/// (docs/reference/tracing.md#configuration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TraceProtocol {
    /// OTLP over gRPC (a collector's port 4317).
    #[default]
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (a collector's port 4318).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// `[tracing] exporter`: where finished spans go
/// (docs/reference/tracing.md#without-a-collector).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TraceExporter {
    /// To an OTLP collector at `endpoint`.
    #[default]
    #[serde(rename = "otlp")]
    Otlp,
    /// To standard output, one JSON line a span: no collector needed.
    #[serde(rename = "log")]
    Log,
}

/// `[tracing]`, validated (docs/reference/tracing.md#tracing).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    pub exporter: TraceExporter,
    /// The collector; `None` with the `otlp` exporter: no spans are
    /// recorded, and trace context passes through untouched.
    pub endpoint: Option<String>,
    pub protocol: TraceProtocol,
    /// The share of requests without a trace context that are traced.
    pub sample: f64,
    /// The most requests traced a second.
    pub max_traces_per_second: f64,
    /// Whether a caller's sampled flag decides.
    pub trust_caller_sampling: bool,
    pub service_name: String,
    /// Sent with every export; names lowercase.
    pub headers: Vec<(String, String)>,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            exporter: TraceExporter::Otlp,
            endpoint: None,
            protocol: TraceProtocol::Grpc,
            sample: 0.0,
            max_traces_per_second: 100.0,
            trust_caller_sampling: true,
            service_name: "weir".into(),
            headers: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// A TCP address, or `unix:/path` (a socket file weir makes).
    pub listen: Address,
    pub admin: Address,
    /// The permissions of the socket files weir listens on (`socket_mode`).
    pub socket_mode: u32,
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    /// A client connection with no request in flight this long is closed.
    pub client_idle_timeout: Duration,
    /// A response the client takes none of for this long is abandoned.
    pub client_write_timeout: Duration,
    /// HTTP/2 streams one client connection may have open at once.
    pub max_streams_per_connection: u32,
    /// Requests a connection may abandon per second before it is closed.
    pub max_resets_per_second: u32,
    pub max_header_bytes: usize,
    pub shutdown_timeout: Duration,
    pub tls: Option<ListenerTls>,
    /// Which requests get an access-log line.
    pub access_log: AccessLog,
    /// Whether plain-TCP HTTP/1.1 client connections start on the fast
    /// path. Not part of the TOML schema: always `true` from a file.
    /// Tests set this to false to force every request onto the general path
    /// (hyper), to run one suite on both paths.
    pub fast_path: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 in cleartext; over TLS, whatever ALPN picks.
    Auto,
    Http1,
    H2c,
    Grpc,
}

/// Host matching for the shared listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Lower-cased host, no port.
    Exact(String),
    /// `*.example.com` stored as `.example.com`: matches any name ending in it.
    Suffix(String),
}

impl HostPattern {
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim().trim_end_matches('.').to_ascii_lowercase();
        let valid = |h: &str| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
        };
        if let Some(rest) = t.strip_prefix("*.") {
            if valid(rest) {
                return Ok(HostPattern::Suffix(format!(".{rest}")));
            }
        } else if valid(&t) {
            return Ok(HostPattern::Exact(t));
        }
        Err(format!(
            "invalid host pattern {s:?}: expected a host name (`api.internal`) or a wildcard (`*.api.internal`), without a port"
        ))
    }

    /// `host` must already be lower-cased and stripped of its port.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_str()),
        }
    }

    /// Higher is more specific: an exact name beats any wildcard, a longer
    /// wildcard beats a shorter one.
    pub fn specificity(&self) -> usize {
        match self {
            HostPattern::Exact(_) => usize::MAX,
            HostPattern::Suffix(s) => s.len(),
        }
    }
}

/// The upstream's origin: scheme, authority and optional base path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    pub scheme: Scheme,
    pub authority: http::uri::Authority,
    pub host: String,
    pub port: u16,
    /// Without a trailing slash; empty for none.
    pub base_path: String,
    /// `url = "unix:/run/app.sock"`: the Unix-domain socket it is reached
    /// on. `authority` is then the `authority` setting (default
    /// `localhost`), `host` its host and `port` 0.
    pub socket: Option<std::path::PathBuf>,
}

impl UpstreamUrl {
    /// `scheme://host:port`, or `unix:/path` for a socket: where it goes,
    /// never its credentials or path.
    pub fn origin(&self) -> String {
        if let Some(path) = &self.socket {
            return format!("unix:{}", path.display());
        }
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("{scheme}://[{}]:{}", self.host, self.port)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ConcurrencyParams {
    pub max_in_flight: u32,
    pub max_queue: u32,
    /// `limit = "adaptive"`: the limit follows the upstream's latency
    /// (docs/reference/admission.md#adaptive-limit); `None`: `max_in_flight`.
    pub adaptive: Option<crate::policy::AdaptiveParams>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    pub ca_file: Option<PathBuf>,
    pub server_name: Option<String>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// An upstream's endpoints (docs/reference/endpoints.md).
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointsConfig {
    /// `host:port` entries: the static list, or the `url`'s host and port.
    pub entries: Vec<(String, u16)>,
    /// Whether `entries` came from a static `endpoints` list.
    pub fixed: bool,
    pub params: crate::policy::BalanceParams,
}

/// One upstream, with its effective (merged, validated) policy.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub name: String,
    pub url: UpstreamUrl,
    pub hosts: Vec<HostPattern>,
    /// Normalised: starts with `/`, no trailing slash except for `/` itself.
    pub path_prefix: String,
    pub strip_prefix: bool,
    pub preserve_host: bool,
    /// A `CONNECT` routed here becomes a TCP tunnel to the upstream's
    /// address (its `url`'s host and port); without it, 405.
    pub tunnel: bool,
    pub listen: Option<Address>,
    /// Inbound TLS on the dedicated listener.
    pub listen_tls: Option<ListenerTls>,
    pub protocol: Protocol,
    /// How often a host name in `url` is resolved again (the fast path's
    /// addresses, docs/reference/protocols.md#upstream).
    pub resolve_every: Duration,
    /// Where its endpoints come from, how they are balanced and ejected
    /// (docs/reference/endpoints.md).
    pub endpoints: EndpointsConfig,
    pub tls: Option<UpstreamTls>,
    pub timeout: Duration,
    pub per_try_timeout: Option<Duration>,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub annotate: bool,
    pub idempotency_header: HeaderName,
    pub retry: RetryPolicy,
    pub breaker: BreakerParams,
    pub concurrency: ConcurrencyParams,
    pub rate_limit: Option<RateLimitParams>,
    /// The idempotency-key store (docs/reference/idempotency.md#idempotency-keys);
    /// `None` with `enabled = false`.
    pub idempotency: Option<IdempotencyParams>,
    /// The response cache (docs/reference/cache.md#response-cache); `None` with
    /// `enabled = false`, the default.
    pub cache: Option<CacheParams>,
    /// Hedged requests; `None`: off (docs/reference/hedging.md#hedging).
    pub hedge: Option<crate::policy::HedgeParams>,
    /// Client-side throttling; `None`: off, the default
    /// (docs/reference/admission.md#client-side-throttling).
    pub throttle: Option<crate::policy::ThrottleParams>,
    /// gRPC methods declared safe to retry (`[upstreams.NAME.grpc]
    /// idempotent_methods`; docs/guide/tls-and-grpc.md#grpc-policies).
    pub idempotent_methods: crate::policy::grpc::IdempotentMethods,
}

impl Config {
    /// Reads a config file, then [`Config::parse`].
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let src = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                file: path.to_path_buf(),
                line: 0,
                column: 0,
                field: String::new(),
                message: format!("cannot read the config file: {e}"),
                expected: Vec::new(),
            }])
        })?;
        Config::parse(path, &src)
    }

    /// Parses and validates config text, and loads the files it names
    /// (certificates, keys, CA bundles): the one path `weir check`, `weir
    /// run` and every reload take. `path` names the file in messages.
    /// Every error is reported in one pass, in file order: every unknown
    /// field and wrong type, and every validation error and unreadable file
    /// among the fields that are well-formed — but none that rests on a
    /// field already reported (a required field missing because its value
    /// had the wrong type, a rule across fields that saw a default in its
    /// place).
    pub fn parse(path: &Path, src: &str) -> Result<Config, ConfigErrors> {
        Config::parse_with(path, src, &Overrides::default())
    }

    /// [`Config::load`], or the built-in default when `path` is `None`, with
    /// what the command line sets over it.
    pub fn load_with(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigErrors> {
        Config::load_checked(path, overrides).0
    }

    /// [`Config::load_with`], and the warnings and notes
    /// ([`Config::check_with`]).
    pub fn load_checked(
        path: Option<&Path>,
        overrides: &Overrides,
    ) -> (Result<Config, ConfigErrors>, Vec<Advice>) {
        let Some(path) = path else {
            return Config::check_with(Path::new(BUILTIN_NAME), BUILTIN, overrides);
        };
        match std::fs::read_to_string(path) {
            Ok(src) => Config::check_with(path, &src, overrides),
            Err(e) => (
                Err(ConfigErrors(vec![ConfigError {
                    file: path.to_path_buf(),
                    line: 0,
                    column: 0,
                    field: String::new(),
                    message: format!("cannot read the config file: {e}"),
                    expected: Vec::new(),
                }])),
                Vec::new(),
            ),
        }
    }

    /// [`Config::parse`] with `overrides` set over the text: an error in
    /// what they set names the flag (docs/reference/cli.md#config-from-the-command-line).
    pub fn parse_with(
        path: &Path,
        src: &str,
        overrides: &Overrides,
    ) -> Result<Config, ConfigErrors> {
        Config::check_with(path, src, overrides).0
    }

    /// [`Config::parse_with`], and the warnings and notes found on the way
    /// whether the config is valid or not (`weir check` prints both).
    pub fn check_with(
        path: &Path,
        src: &str,
        overrides: &Overrides,
    ) -> (Result<Config, ConfigErrors>, Vec<Advice>) {
        let idx = error::SpanIndex::new(src);
        let mut read = match schema::read(path, src, &idx) {
            Ok(r) => r,
            Err(e) => return (Err(e), Vec::new()),
        };
        let added = overrides.apply(&mut read.raw);
        let checked = validate::validate(read.raw, path, &idx, &read.removed);
        let locate = |e: ConfigError| overrides.locate(&added, e);
        let advice: Vec<Advice> = checked
            .notes
            .into_iter()
            .map(|(severity, e)| Advice::at(severity, &locate(e)))
            .chain(
                checked
                    .upstreams
                    .iter()
                    .flat_map(|u| notes::upstream_advice(u)),
            )
            .collect();
        if read.errors.is_empty() {
            return match checked.config {
                Ok(mut c) => {
                    c.advice = advice.clone();
                    c.overrides = overrides.clone();
                    c.source_sha256 = text_sha256(src);
                    (Ok(c), advice)
                }
                Err(ConfigErrors(errors)) => (
                    Err(ConfigErrors(errors.into_iter().map(locate).collect())),
                    advice,
                ),
            };
        }
        let mut errors = read.errors;
        if let Err(ConfigErrors(more)) = checked.config {
            errors.extend(more);
        }
        // Stable: at one place, stage one's error comes first.
        errors.sort_by_key(|e| (e.line, e.column));
        let errors = ConfigErrors(errors.into_iter().map(locate).collect());
        (Err(errors), advice)
    }

    /// The warnings of [`Config::advice`] (logged at start and on every
    /// reload).
    pub fn warnings(&self) -> impl Iterator<Item = &str> {
        self.advice
            .iter()
            .filter(|a| a.is_warning())
            .map(|a| a.text.as_str())
    }

    /// Whether this is the built-in default rather than a file's.
    pub fn is_builtin(&self) -> bool {
        self.path == Path::new(BUILTIN_NAME)
    }

    /// The effective config as TOML: every default filled in.
    pub fn effective_toml(&self) -> String {
        toml::to_string_pretty(&self.effective)
            .unwrap_or_else(|e| format!("# cannot render the effective config: {e}\n"))
    }

    pub fn upstream(&self, name: &str) -> Option<&Arc<UpstreamConfig>> {
        self.upstreams.iter().find(|u| u.name == name)
    }
}
