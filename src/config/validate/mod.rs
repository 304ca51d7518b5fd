//! Stage two: merged raw tables → typed, validated values, and the files
//! they name loaded (`files`). Collects every error it can find rather than
//! stopping at the first (docs/reference/configuration.md#configuration-and-defaults).

use super::error::{ConfigErrors, SpanIndex};
use super::raw::{RawConfig, RawPolicy, RawServer, RawUpstream};
use super::*;
use crate::address::Address;
use std::collections::BTreeMap;

mod ctx;
mod endpoints;
mod files;
mod policy;
mod server;
mod state;
mod tracing;

/// `resolve_every`'s default: Kubernetes Services and headless Services
/// change, and a sidecar should follow within seconds.
const DEFAULT_RESOLVE_EVERY: Duration = Duration::from_secs(5);
pub(super) use ctx::{quote, ErrorSink};
use policy::{breaker, cache, hedge, idempotency, merged, rate_limit, retry_policy};

/// Validates `raw`. `removed` are the fields stage one rejected
/// (`schema::Read`): `raw` has defaults in their place, and no error that
/// rests on one of them is reported.
/// What stage two found: the config or its errors, and in either case the
/// warnings and notes of its fields and the upstreams that validated (for
/// their advice: `weir check` says it beside the errors).
pub(super) struct Validated {
    pub config: Result<Config, ConfigErrors>,
    pub notes: Vec<(super::notes::Severity, super::ConfigError)>,
    pub upstreams: Vec<Arc<UpstreamConfig>>,
}

pub(super) fn validate(
    raw: RawConfig,
    file: &Path,
    idx: &SpanIndex,
    removed: &[String],
) -> Validated {
    let mut cx = ErrorSink::new(file, idx, removed);
    let server_raw = raw.server.clone().merge(RawServer::builtin());
    let server = server::server(&mut cx, &server_raw);
    let state_raw = raw.state.clone().merge(super::raw::RawState::builtin());
    let state = state::state(&mut cx, &state_raw);
    let tracing_raw = raw.tracing.clone().merge(super::raw::RawTracing::builtin());
    let tracing = tracing::tracing(&mut cx, &tracing_raw);
    let defaults = raw.defaults.clone().merge(RawPolicy::builtin());

    let mut upstreams = Vec::new();
    let mut reach = Vec::new();
    let mut effective_upstreams = BTreeMap::new();
    for (name, up) in &raw.upstreams {
        let merged = merged(up.policy(), &raw.defaults, defaults.clone());
        let mut effective = up.clone().with_policy(merged.clone());
        effective
            .resolve_every
            .get_or_insert(super::duration::Dur(DEFAULT_RESOLVE_EVERY));
        effective
            .balance
            .get_or_insert_with(|| super::raw::DEFAULT_BALANCE.into());
        effective
            .max_endpoints
            .get_or_insert(super::raw::DEFAULT_MAX_ENDPOINTS);
        effective.ejection = Some(
            up.ejection
                .clone()
                .unwrap_or_default()
                .merge(super::raw::RawEjection::builtin()),
        );
        effective_upstreams.insert(name.clone(), effective);
        if let Some(u) = upstream(&mut cx, name, up, &merged, &mut reach) {
            upstreams.push(Arc::new(u));
        }
    }
    if raw.upstreams.is_empty() {
        cx.err_given(
            "upstreams",
            &["upstreams".into()],
            "no upstreams configured: add at least one [upstreams.NAME] table with a `url`",
        );
    }
    cross_checks(&mut cx, server.as_ref(), &reach);

    cx.notes.sort_by_key(|(_, e)| (e.line, e.column));
    let notes = std::mem::take(&mut cx.notes);
    let failed = |mut errors: Vec<super::ConfigError>, upstreams| {
        errors.sort_by_key(|e| (e.line, e.column));
        Validated {
            config: Err(ConfigErrors(errors)),
            notes: notes.clone(),
            upstreams,
        }
    };
    if !cx.errors.is_empty() {
        return failed(cx.errors, upstreams);
    }
    let (Some(server), Some(state), Some(tracing)) = (server, state, tracing) else {
        return failed(cx.errors, upstreams);
    };
    let config = Config {
        path: file.to_path_buf(),
        server,
        state,
        tracing,
        upstreams,
        effective: RawConfig {
            server: server_raw,
            state: state::effective(state_raw),
            tracing: tracing::effective(tracing_raw),
            defaults,
            upstreams: effective_upstreams,
        },
        advice: Vec::new(),
        overrides: Overrides::default(),
        source_sha256: String::new(),
    };
    Validated {
        upstreams: config.upstreams.clone(),
        config: Ok(config),
        notes,
    }
}

fn url(cx: &mut ErrorSink, name: &str, up: &RawUpstream) -> Option<UpstreamUrl> {
    let field = format!("upstreams.{}.url", quote(name));
    let Some(s) = up.url.as_deref() else {
        cx.err(
            field,
            "missing `url`: where this upstream is, e.g. \"http://127.0.0.1:8080\"",
        );
        return None;
    };
    let bad = |why: &str| format!("invalid url {s:?}: {why}");
    if let Some(path) = s.strip_prefix("unix:") {
        return endpoints::socket_url(cx, name, up, path, &bad);
    }
    if up.authority.is_some() {
        cx.err(
            format!("upstreams.{}.authority", quote(name)),
            "only with a `unix:` url: an http(s) url's own authority is what is sent",
        );
    }
    let uri: http::Uri = match s.parse() {
        Ok(u) => u,
        Err(e) => {
            cx.err(field, bad(&e.to_string()));
            return None;
        }
    };
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        Some(other) => {
            cx.err(
                field,
                bad(&format!("scheme {other:?} is not http or https")),
            );
            return None;
        }
        None => {
            cx.err(
                field,
                bad("expected an absolute URL starting with http:// or https://"),
            );
            return None;
        }
    };
    let Some(authority) = uri.authority().cloned() else {
        cx.err(field, bad("no host"));
        return None;
    };
    if authority.as_str().contains('@') {
        cx.err(field, bad("credentials in the URL are not supported"));
        return None;
    }
    if uri.query().is_some() {
        cx.err(
            field,
            bad("a query string has no meaning on an upstream URL"),
        );
        return None;
    }
    let host = authority.host().to_string();
    if host.is_empty() {
        cx.err(field, bad("no host"));
        return None;
    }
    let port = authority.port_u16().unwrap_or(match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    });
    let base_path = uri.path().trim_end_matches('/').to_string();
    Some(UpstreamUrl {
        scheme,
        authority,
        host,
        port,
        base_path,
        socket: None,
    })
}

/// How an upstream is reached, for the checks across upstreams: taken from
/// every upstream, whatever errors its other fields have, so that a
/// duplicate route is reported with them in one pass.
struct Reach {
    name: String,
    hosts: Vec<HostPattern>,
    path_prefix: String,
    listen: Option<Address>,
}

fn upstream(
    cx: &mut ErrorSink,
    name: &str,
    up: &RawUpstream,
    p: &RawPolicy,
    reach: &mut Vec<Reach>,
) -> Option<UpstreamConfig> {
    let q = quote(name);
    let n_errors = cx.errors.len();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
    {
        cx.err(
            format!("upstreams.{q}"),
            "upstream names may use letters, digits, `-`, `_` and `.` only (they become metric labels)",
        );
    }
    if name == crate::config::NO_UPSTREAM {
        cx.err(
            format!("upstreams.{q}"),
            "`none` is reserved: it is the metric and log label of requests routed to no upstream",
        );
    }
    let url = url(cx, name, up);

    let mut hosts = Vec::new();
    for (i, h) in up.hosts.iter().flatten().enumerate() {
        match HostPattern::parse(h) {
            Ok(p) => hosts.push(p),
            Err(m) => cx.err(format!("upstreams.{q}.hosts[{i}]"), m),
        }
    }
    let listen = up
        .listen
        .as_deref()
        .and_then(|l| server::addr(cx, &format!("upstreams.{q}.listen"), l));
    if up.hosts.as_ref().is_none_or(|h| h.is_empty()) && up.listen.is_none() {
        cx.err_given(
            format!("upstreams.{q}"),
            &[format!("upstreams.{q}.hosts"), format!("upstreams.{q}.listen")],
            format!("upstream {name:?} is unreachable: give it `hosts` (routed on the shared listener) or a dedicated `listen` address"),
        );
    }
    let raw_prefix = up.path_prefix.as_deref().unwrap_or("/");
    let prefix_ok = raw_prefix.starts_with('/') && !raw_prefix.contains(['?', '#', ' ']);
    if !prefix_ok {
        cx.err(
            format!("upstreams.{q}.path_prefix"),
            format!("path_prefix must be a path starting with `/`, got {raw_prefix:?}"),
        );
    }
    let path_prefix = match raw_prefix.trim_end_matches('/') {
        "" => "/".to_string(),
        p => p.to_string(),
    };
    reach.push(Reach {
        name: name.to_string(),
        hosts: if prefix_ok { hosts.clone() } else { Vec::new() },
        path_prefix: path_prefix.clone(),
        listen,
    });
    let protocol = match up.protocol.as_deref().unwrap_or("auto") {
        "auto" => Protocol::Auto,
        "http1" => Protocol::Http1,
        "h2c" => Protocol::H2c,
        "grpc" => Protocol::Grpc,
        other => {
            cx.err(
                format!("upstreams.{q}.protocol"),
                format!(
                    "unknown protocol {other:?}: {}expected auto, http1, h2c or grpc",
                    crate::policy::suggest::hint(other, ["auto", "http1", "h2c", "grpc"])
                ),
            );
            Protocol::Auto
        }
    };
    let resolve_every = up.resolve_every.map_or(DEFAULT_RESOLVE_EVERY, |d| d.0);
    if resolve_every < Duration::from_millis(100) {
        cx.err(
            format!("upstreams.{q}.resolve_every"),
            "must be at least 100ms (it is how often the upstream's name is resolved)",
        );
    }
    let endpoints = endpoints::endpoints(cx, name, up, url.as_ref());
    let listen_tls = up.listen_tls.as_ref().map(|t| ListenerTls {
        cert: PathBuf::from(&t.cert),
        key: PathBuf::from(&t.key),
    });
    if let Some(t) = &listen_tls {
        files::listener(cx, &format!("upstreams.{q}.listen_tls"), t);
    }
    if listen_tls.is_some() && up.listen.is_none() {
        cx.err_given(
            format!("upstreams.{q}.listen_tls"),
            &[format!("upstreams.{q}.listen")],
            "listen_tls needs a dedicated `listen` address (the shared listener's TLS is [server] tls)",
        );
    }
    if listen_tls.is_some() && listen.is_some_and(|l| l.is_unix()) {
        cx.err_given(
            format!("upstreams.{q}.listen_tls"),
            &[format!("upstreams.{q}.listen")],
            "inbound TLS is for a TCP listener; a unix: socket is reached through the file system",
        );
    }
    let tls = up.tls.as_ref().map(|t| UpstreamTls {
        ca_file: t.ca_file.as_ref().map(PathBuf::from),
        server_name: t.server_name.clone(),
        client_cert: t.client_cert.as_ref().map(PathBuf::from),
        client_key: t.client_key.as_ref().map(PathBuf::from),
    });
    if let Some(t) = &tls {
        files::upstream(cx, &format!("upstreams.{q}.tls"), t);
        if t.client_cert.is_some() != t.client_key.is_some() {
            cx.err_given(
                format!("upstreams.{q}.tls"),
                &[
                    format!("upstreams.{q}.tls.client_cert"),
                    format!("upstreams.{q}.tls.client_key"),
                ],
                "client_cert and client_key go together: set both or neither",
            );
        }
        if url.as_ref().is_some_and(|u| u.scheme == Scheme::Http) {
            cx.err(
                format!("upstreams.{q}.tls"),
                "a [tls] table needs an https:// url",
            );
        }
    }

    let dur = |d: Option<duration::Dur>| d.map(|d| d.0).unwrap_or_default();
    let timeout = dur(p.timeout);
    if timeout.is_zero() {
        let f = cx.policy_path(name, "timeout");
        cx.err(f, "must be greater than 0");
    }
    let per_try_timeout = p.per_try_timeout.map(|d| d.0);
    policy::uploads_note(cx, name);
    if let Some(t) = per_try_timeout.filter(|t| !timeout.is_zero() && *t > timeout) {
        let f = cx.policy_path(name, "per_try_timeout");
        let (t, timeout) = (duration::format(t), duration::format(timeout));
        cx.warn(
            &f,
            format!(
                "{t} is longer than `timeout` ({timeout}), so it never applies: weir ends \
                 every attempt at the request's deadline, {timeout} after it arrived, and \
                 an attempt cut there is not retried; set `per_try_timeout` below \
                 `timeout`, or leave it unset (docs/reference/deadlines.md)"
            ),
        );
    }
    if per_try_timeout.is_some_and(|d| d.is_zero()) {
        let f = cx.policy_path(name, "per_try_timeout");
        cx.err(
            f,
            "must be greater than 0 (leave it unset for \"what is left of timeout\")",
        );
    }
    let connect_timeout = dur(p.connect_timeout);
    if connect_timeout.is_zero() {
        let f = cx.policy_path(name, "connect_timeout");
        cx.err(f, "must be greater than 0");
    }
    let idle_timeout = dur(p.idle_timeout);
    if idle_timeout.is_zero() {
        let f = cx.policy_path(name, "idle_timeout");
        cx.err(f, "must be greater than 0");
    }
    let idem = p.idempotency_header.as_deref().unwrap_or_default();
    let idempotency_header = match HeaderName::from_bytes(idem.as_bytes()) {
        Ok(h) => Some(h),
        Err(_) => {
            let f = cx.policy_path(name, "idempotency_header");
            cx.err(f, format!("{idem:?} is not a valid header name"));
            None
        }
    };

    let retry = retry_policy(cx, name, p);
    let breaker = breaker(cx, name, p);
    let rate_limit = rate_limit(cx, name, p);
    let idempotency = idempotency(cx, name, p);
    let cache = cache(cx, name, p);
    let hedge = hedge(cx, name, p, retry.as_ref());
    let concurrency = policy::concurrency(cx, name, p);
    let throttle = policy::throttle(cx, name, p);
    let idempotent_methods = endpoints::idempotent_methods(cx, name, up);

    if cx.errors.len() > n_errors {
        return None;
    }
    Some(UpstreamConfig {
        name: name.to_string(),
        url: url?,
        hosts,
        path_prefix,
        strip_prefix: up.strip_prefix.unwrap_or(false),
        preserve_host: up.preserve_host.unwrap_or(false),
        tunnel: up.tunnel.unwrap_or(false),
        listen,
        listen_tls,
        protocol,
        resolve_every,
        endpoints: endpoints?,
        tls,
        timeout,
        per_try_timeout,
        connect_timeout,
        idle_timeout,
        annotate: p.annotate.unwrap_or(true),
        idempotency_header: idempotency_header?,
        retry: retry?,
        breaker: breaker?,
        concurrency,
        rate_limit,
        idempotency,
        cache,
        hedge,
        throttle,
        idempotent_methods,
    })
}

/// Checks across upstreams: unique listen addresses and unique (host, prefix) routes.
fn cross_checks(cx: &mut ErrorSink, server: Option<&ServerConfig>, ups: &[Reach]) {
    // Each address taken: by whom, and the field that sets it.
    let mut listens: BTreeMap<Address, (String, String)> = BTreeMap::new();
    // An ephemeral port never collides.
    let ephemeral = |a: &Address| a.tcp().is_some_and(|t| t.port() == 0);
    if let Some(s) = server {
        let by = |f: &str| (format!("[server] {f}"), format!("server.{f}"));
        listens.insert(s.listen, by("listen"));
        if !ephemeral(&s.admin) {
            listens.insert(s.admin, by("admin"));
        }
    }
    for u in ups {
        let Some(l) = u.listen else { continue };
        if ephemeral(&l) {
            continue;
        }
        let field = format!("upstreams.{}.listen", quote(&u.name));
        if let Some((other, at)) = listens.get(&l) {
            let msg = format!("listen address {l} is already used by {other}");
            cx.err_given(field, std::slice::from_ref(at), msg);
        } else {
            listens.insert(l, (format!("upstream {:?}", u.name), field));
        }
    }
    let mut routes: BTreeMap<(String, String), String> = BTreeMap::new();
    for u in ups {
        for (i, h) in u.hosts.iter().enumerate() {
            let key = match h {
                HostPattern::Exact(e) => e.clone(),
                HostPattern::Suffix(s) => format!("*{s}"),
            };
            if let Some(other) = routes.get(&(key.clone(), u.path_prefix.clone())) {
                let msg = format!(
                    "host {key:?} with path_prefix {:?} is already routed to upstream {other:?}: give one of them a different host or path_prefix",
                    u.path_prefix
                );
                cx.err(format!("upstreams.{}.hosts[{i}]", quote(&u.name)), msg);
            } else {
                routes.insert((key, u.path_prefix.clone()), u.name.clone());
            }
        }
    }
}
