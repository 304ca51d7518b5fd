//! The path of one request: route → deadline → upstream request hygiene →
//! admission and attempts ([`super::attempt`]) → response hygiene.

use super::attempt::{self, Plan};
use super::body::{boxed, Body, IdleTimeout};
use super::error::ProxyError;
use super::headers;
use super::idempotent::{self, Begun};
use super::replay::RequestBody;
use super::route::{request_host, upstream_path};
use super::{ListenerRole, Snapshot, Upstream};
use crate::metrics::NO_UPSTREAM;
use http::header;
use http::uri::Authority;
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use std::time::Duration;
use tokio::time::Instant;

/// Serves one request from a client.
pub(crate) async fn handle(
    snap: &Snapshot,
    role: &ListenerRole,
    conn: &super::sticky::ConnCtx,
    req: Request<Incoming>,
) -> Response<Body> {
    // An HTTP/1 request that asks to leave HTTP/1 (CONNECT, an upgrade):
    // the request-smuggling guard stops following the connection at its
    // head. When it does not leave — the upstream declines, no route, an
    // error — the connection closes after the answer, so nothing read after
    // it is served unjudged (docs/behaviour.md#upgrades).
    let connect = req.method() == http::Method::CONNECT;
    let leaves = req.version() < Version::HTTP_2
        && (connect || super::upgrade::requested(req.headers()).is_some());
    let mut resp = serve(snap, role, conn, req).await;
    let switched = resp.status() == http::StatusCode::SWITCHING_PROTOCOLS
        || (connect && resp.status().is_success());
    if leaves && !switched {
        resp.headers_mut()
            .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    resp
}

async fn serve(
    snap: &Snapshot,
    role: &ListenerRole,
    conn: &super::sticky::ConnCtx,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let start = Instant::now();
    let log = |upstream: &str, method: &http::Method, uri: &Uri, resp: Response<Body>| {
        access_log(snap, upstream, method, uri, start, resp)
    };
    if parts.uri.path() == super::guard::TOO_LARGE_PATH {
        snap.metrics.header_too_large();
        let limit = snap.config.server.max_header_bytes;
        let resp = ProxyError::HeadTooLarge(limit).to_response(None);
        return log(NO_UPSTREAM, &parts.method, &parts.uri, resp);
    }
    if parts.uri.path() == super::guard::INVALID_PATH {
        snap.metrics.bad_request();
        let resp = ProxyError::BadRequest(
            "the request head is invalid: a Content-Length that is not digits (or too large), Content-Lengths that disagree, a Transfer-Encoding that does not end in chunked, or two Host fields".into(),
        )
        .to_response(None);
        return log(NO_UPSTREAM, &parts.method, &parts.uri, resp);
    }
    if parts.uri.path() == super::guard::CONFLICT_PATH {
        snap.metrics.bad_request();
        let resp = ProxyError::BadRequest(
            "a request may not carry both Content-Length and Transfer-Encoding".into(),
        )
        .to_response(None);
        return log(NO_UPSTREAM, &parts.method, &parts.uri, resp);
    }
    let connect = parts.method == http::Method::CONNECT;
    // A CONNECT's target is `host:port`, with no path: route it as `/`.
    let path = if connect { "/" } else { parts.uri.path() };
    let upstream = match role {
        ListenerRole::Shared => request_host(&parts)
            .and_then(|h| snap.routes.lookup(h, path))
            .and_then(|i| snap.upstreams.get(i)),
        ListenerRole::Dedicated(name) => snap.upstreams.iter().find(|u| &u.config.name == name),
    };
    if connect {
        return tunnel(snap, upstream, parts).await;
    }
    let grpc = is_grpc(&parts.headers);
    let Some(up) = upstream else {
        snap.metrics.no_route();
        let resp = ProxyError::NoRoute.respond(None, grpc);
        return log(NO_UPSTREAM, &parts.method, &parts.uri, resp);
    };
    let method = parts.method.clone();
    let uri = parts.uri.clone();
    let cfg = &up.config;
    // For the response cache's key, should this request invalidate it.
    let host = cfg
        .cache
        .as_ref()
        .and_then(|_| parts.headers.get(header::HOST).cloned());
    // A keyed write (docs/behaviour.md#idempotency-keys); a bad key is
    // forward's to answer (400).
    let idem = parts.headers.get(&cfg.idempotency_header);
    let key = idempotent::key_of(cfg, method.as_str(), idem.map(|v| v.as_bytes()))
        .map(|k| k.map(str::to_owned));
    let body = super::body::boxed(body);
    let cached = cfg.cache.is_some() && matches!(method, http::Method::GET | http::Method::HEAD);
    let forwarded = match key {
        Ok(Some(k)) => detached(up, parts, body, start, grpc, k).await,
        Ok(None) if cached => super::cached::serve(up, conn, parts, body, start, grpc).await,
        key => forward(up, conn, parts, body, start, grpc, key, &mut None).await,
    };
    let resp = match forwarded {
        Ok(resp) if !cached && cfg.cache.is_some() => {
            super::cached::invalidate(up, &method, &uri, host.as_ref(), resp.status().as_u16());
            resp
        }
        Ok(resp) => resp,
        Err(e) => {
            up.state.metrics.error(e.code(), start.elapsed());
            e.respond(Some(&up.config.name), grpc)
        }
    };
    log(&up.config.name, &method, &uri, resp)
}

/// Writes the access-log line for a response weir is about to send; the
/// attempts, stop reason and error come from the annotations weir wrote.
fn access_log(
    snap: &Snapshot,
    upstream: &str,
    method: &http::Method,
    uri: &Uri,
    start: Instant,
    resp: Response<Body>,
) -> Response<Body> {
    let mode = snap.config.server.access_log;
    let status = resp.status().as_u16();
    let h = resp.headers();
    let error = h.get("x-weir-error").and_then(|v| v.to_str().ok());
    if super::access::wanted(mode, status, error.is_some()) {
        let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
        super::access::write(
            mode,
            &super::access::Entry {
                upstream,
                method: method.as_str(),
                path: uri.path(),
                status,
                error,
                attempts: text("x-weir-attempts").and_then(|v| v.parse().ok()),
                retry_stop: text("x-weir-retry-stop"),
                took: start.elapsed(),
            },
        );
    }
    resp
}

/// A keyed write (docs/behaviour.md#idempotency-keys) runs in a task of
/// its own: when its client leaves, its attempts go on within the request's
/// deadline and its response is read to the end and kept, so a re-send is
/// answered from the record instead of reaching the upstream again.
async fn detached(
    up: &Upstream,
    parts: http::request::Parts,
    body: Body,
    start: Instant,
    grpc: bool,
    key: String,
) -> Result<Response<Body>, ProxyError> {
    let up = up.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        // No held connection: it belongs to a client connection.
        let conn = super::sticky::ConnCtx::default();
        let mut capture = None;
        let key = Ok(Some(key));
        let forwarded = forward(&up, &conn, parts, body, start, grpc, key, &mut capture).await;
        match (forwarded, capture) {
            (Ok(resp), Some(c)) => {
                let (head, body) = resp.into_parts();
                let (frames, to_client) = tokio::sync::mpsc::channel(8);
                let _ = tx.send(Ok(Response::from_parts(
                    head,
                    idempotent::channel_body(to_client),
                )));
                idempotent::pump(body, c, frames).await;
            }
            (forwarded, _) => {
                let _ = tx.send(forwarded);
            }
        }
    });
    rx.await
        .unwrap_or_else(|_| Err(ProxyError::UpstreamReset("the request's task ended".into())))
}

/// `key`: the request's idempotency key, as [`idempotent::key_of`] found it;
/// `capture`: set to the keeping of a keyed write's response, whose body
/// the caller relays ([`detached`]).
#[allow(clippy::too_many_arguments)]
pub(super) async fn forward(
    up: &Upstream,
    conn: &super::sticky::ConnCtx,
    mut parts: http::request::Parts,
    body: Body,
    start: Instant,
    is_grpc_request: bool,
    key: Result<Option<String>, ProxyError>,
    capture: &mut Option<idempotent::Capture>,
) -> Result<Response<Body>, ProxyError> {
    let cfg = &up.config;
    let lowered = headers::weir_timeout(&parts.headers).map_err(ProxyError::BadRequest)?;
    let grpc = headers::grpc_timeout(&parts.headers);
    let (deadline, client_lowered) = attempt::deadline(cfg, start, [lowered, grpc]);
    // A keyed write, with the target the client sent, for its fingerprint.
    let keyed = key?.map(|k| {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        (k, target.to_owned())
    });

    // The host the upstream is told: its own, or the client's with
    // `preserve_host`. It travels as the URI's authority, which the client
    // turns into `:authority` (HTTP/2) or `Host` (HTTP/1.1); see proxy::client.
    let authority = if cfg.preserve_host {
        client_authority(&parts)?
    } else {
        None
    };
    let uri = upstream_uri(up, &parts.method, &parts.uri, authority)?;
    let key = rate_key(cfg, &parts.headers);
    let upgrade = super::upgrade::requested(&parts.headers);
    let on_upgrade = upgrade
        .as_ref()
        .and_then(|_| parts.extensions.remove::<hyper::upgrade::OnUpgrade>());
    headers::strip_hop_by_hop(&mut parts.headers, true);
    if let (Some(u), Some(_)) = (&upgrade, &on_upgrade) {
        super::upgrade::restore(&mut parts.headers, u.clone());
    }
    // Checked after stripping: a key the upstream will not receive does not count.
    let has_idempotency_key = parts.headers.contains_key(&cfg.idempotency_header);
    parts.headers.remove(header::HOST);
    parts.uri = uri;
    parts.version = if up.h2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };

    // An upgrade is one attempt: its body is the connection itself.
    let single = cfg.retry.max_attempts <= 1 || on_upgrade.is_some();
    let stream_unknown = up.h2 || parts.version == Version::HTTP_2 || is_grpc_request;
    let limit = cfg.retry.max_replay_body_bytes;

    // A keyed write's body is read first, for its fingerprint, and a repeat
    // is answered from the record before admission could hold it back.
    let mut recorder = None;
    let (held, body) = match keyed {
        Some((k, target)) => {
            let held = prepare(body, true, limit, stream_unknown, deadline).await?;
            let method = parts.method.as_str();
            match idempotent::begin_body(up, &k, method, &target, &held, deadline).await {
                Begun::Replay(stored) => {
                    up.state.metrics.status(stored.status, start.elapsed());
                    return Ok(idempotent::replay_response(&stored, cfg.annotate));
                }
                Begun::Refused(e) => return Err(e),
                Begun::Forward(r) => recorder = Some(r),
                Begun::Unrecorded => {}
            }
            (Some(held), None)
        }
        None => (None, Some(body)),
    };

    // Admission in the order of docs/behaviour.md#admission: rate limit, concurrency; the body is
    // read (when it is to be kept for a replay) before the breaker is asked,
    // so a slow upload never holds a half-open probe slot.
    let admitted = attempt::admit(up, key.as_deref(), start, deadline, &mut attempt::Dropped).await;
    let (slot, _) = admitted.unwrap_or(Err(ProxyError::DeadlineExceeded))?;

    let continue_gate = (parts.version == Version::HTTP_11
        && body
            .as_ref()
            .is_some_and(|b| !http_body::Body::is_end_stream(b))
        && parts
            .headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue")))
    .then(|| std::sync::Arc::new(super::replay::ContinueGate::default()));
    let body = match (held, body, &continue_gate) {
        (Some(held), _, _) => held,
        (None, Some(body), Some(gate)) => RequestBody::gated(body, gate.clone(), !single),
        (None, Some(body), None) => prepare(body, !single, limit, stream_unknown, deadline).await?,
        (None, None, _) => return Err(ProxyError::BadRequest("no request body".into())),
    };
    let ticket = attempt::admit_breaker(&up.state)?;
    let plan = Plan {
        parts,
        body,
        deadline,
        key: key.as_deref(),
        has_idempotency_key,
        grpc_deadline: grpc.map(|g| start + g),
        single,
        lowered: client_lowered,
        upgrade: on_upgrade.is_some(),
        // gRPC codes sent before the first message can only be acted on
        // when the response is held until then.
        grpc_trailers: is_grpc_request && !single && cfg.retry.retry_on.any_grpc(),
        continue_gate,
    };
    let done = attempt::run(up, conn, plan, ticket).await;
    if let Err(e) = &done.result {
        if let Some(r) = recorder.take() {
            r.finish(idempotent::ending_of(e), None);
        }
    }
    match done.result {
        Ok(mut resp) => {
            let switching = resp.status() == http::StatusCode::SWITCHING_PROTOCOLS;
            let upstream_upgrade = if switching {
                Some(hyper::upgrade::on(&mut resp))
            } else {
                None
            };
            let (mut rparts, rbody) = resp.into_parts();
            let agreed = rparts.headers.get(header::UPGRADE).cloned();
            headers::restate_length(&mut rparts.headers);
            headers::strip_hop_by_hop(&mut rparts.headers, false);
            match (on_upgrade, upstream_upgrade, agreed) {
                (Some(client), Some(upstream), Some(proto)) => {
                    super::upgrade::restore(&mut rparts.headers, proto);
                    super::upgrade::tunnel(client, upstream, cfg.name.clone());
                }
                (_, Some(_), _) => {
                    // A 101 nobody asked for, or without a protocol: refuse it.
                    return Err(ProxyError::UpstreamReset(
                        "the upstream switched protocols without a matching upgrade request".into(),
                    ));
                }
                _ => {}
            }
            // hyper answers in the client's protocol; an HTTP/1.0 upstream must
            // not downgrade the client's connection.
            rparts.version = Version::HTTP_11;
            *capture = recorder.map(|r| {
                let fields = idempotent::kept_fields(&rparts.headers);
                let hint = http_body::Body::size_hint(&rbody).exact().unwrap_or(0);
                r.capture(rparts.status.as_u16(), fields, hint)
            });
            if cfg.annotate {
                attempt::annotate(&mut rparts.headers, done.attempts, done.stop);
            }
            up.state.metrics.status(
                rparts.status.as_u16(),
                done.ended.saturating_duration_since(start),
            );
            let first = done.ended + cfg.idle_timeout;
            let body = IdleTimeout::new(rbody, first, cfg.idle_timeout, Some(slot));
            Ok(Response::from_parts(rparts, boxed(body)))
        }
        Err(e) => {
            up.state
                .metrics
                .error(e.code(), done.ended.saturating_duration_since(start));
            let mut resp = e.respond(Some(&cfg.name), is_grpc_request);
            if cfg.annotate {
                attempt::annotate(resp.headers_mut(), done.attempts, done.stop);
            }
            Ok(resp)
        }
    }
}

/// Prepares the request body for the attempts (see [`RequestBody::prepare`]),
/// within the request's deadline.
async fn prepare(
    body: Body,
    retry_possible: bool,
    limit: u64,
    stream_unknown: bool,
    deadline: Instant,
) -> Result<RequestBody, ProxyError> {
    let prepared = RequestBody::prepare(body, retry_possible, limit, stream_unknown);
    match tokio::time::timeout_at(deadline, prepared).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => Err(ProxyError::BadRequest(format!(
            "the request body could not be read: {e}"
        ))),
        Err(_) => Err(ProxyError::DeadlineExceeded),
    }
}

/// The rate-limit key of a request: the named header's value, if keyed.
fn rate_key(cfg: &crate::config::UpstreamConfig, h: &http::HeaderMap) -> Option<String> {
    cfg.rate_limit.as_ref().and_then(|r| match &r.key {
        Some(crate::policy::limiter::KeySource::Header(name)) => h
            .get(name.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        None => None,
    })
}

/// A CONNECT: a tunnel to an upstream that allows one, else 405. Never
/// forwarded upstream (see `proxy::tunnel`).
async fn tunnel(
    snap: &Snapshot,
    upstream: Option<&Upstream>,
    parts: http::request::Parts,
) -> Response<Body> {
    let Some(up) = upstream.filter(|u| u.config.tunnel) else {
        let name = upstream.map(|u| u.config.name.as_str());
        match upstream {
            Some(u) => u
                .state
                .metrics
                .error(ProxyError::ConnectNotAllowed.code(), Duration::ZERO),
            None => snap.metrics.connect_not_allowed(),
        }
        tracing::debug!(target = %parts.uri, upstream = ?name, "CONNECT refused");
        return ProxyError::ConnectNotAllowed.to_response(name);
    };
    let start = Instant::now();
    let key = rate_key(&up.config, &parts.headers);
    let (result, attempts) = super::tunnel::open(up, parts, key.as_deref(), start).await;
    let mut resp = match result {
        Ok(resp) => {
            up.state.metrics.status(200, start.elapsed());
            resp
        }
        Err(e) => {
            up.state.metrics.error(e.code(), start.elapsed());
            e.to_response(Some(&up.config.name))
        }
    };
    if up.config.annotate && attempts > 0 {
        attempt::annotate(resp.headers_mut(), attempts, None);
    }
    resp
}

/// The host the client named (its target's authority, else `Host`), for
/// `preserve_host`; `None` when it named none.
fn client_authority(parts: &http::request::Parts) -> Result<Option<Authority>, ProxyError> {
    if let Some(a) = parts.uri.authority() {
        return Ok(Some(a.clone()));
    }
    let Some(h) = parts.headers.get(header::HOST) else {
        return Ok(None);
    };
    Authority::try_from(h.as_bytes())
        .map(Some)
        .map_err(|_| ProxyError::BadRequest("the Host header is not a valid host[:port]".into()))
}

/// Maps the client's target onto the upstream: `strip_prefix`, then the
/// upstream URL's base path; the query is kept as sent. The authority is
/// `host` when given (`preserve_host`), else the upstream URL's. `OPTIONS *`
/// (the asterisk form, RFC 9112 §3.2.4) asks about the server as a whole:
/// it goes upstream as `*`, not mapped onto a path; any other method with
/// that target is a 400.
fn upstream_uri(
    up: &Upstream,
    method: &http::Method,
    original: &Uri,
    host: Option<Authority>,
) -> Result<Uri, ProxyError> {
    let cfg = &up.config;
    let authority = host.unwrap_or_else(|| cfg.url.authority.clone());
    let path = original.path();
    if path == "*" && original.authority().is_none() {
        if method != http::Method::OPTIONS {
            return Err(ProxyError::BadRequest(
                "the target `*` is only for OPTIONS".into(),
            ));
        }
        return Uri::builder()
            .scheme(up.scheme.clone())
            .authority(authority)
            .path_and_query("*")
            .build()
            .map_err(|e| ProxyError::BadRequest(format!("cannot forward `OPTIONS *`: {e}")));
    }
    // The common case, nothing to rewrite: reuse the target as it came
    // (shared bytes, no allocation).
    if cfg.url.base_path.is_empty() && !cfg.strip_prefix && path.starts_with('/') {
        if let Some(pq) = original.path_and_query() {
            return Uri::builder()
                .scheme(up.scheme.clone())
                .authority(authority)
                .path_and_query(pq.clone())
                .build()
                .map_err(|e| {
                    ProxyError::BadRequest(format!(
                        "cannot map the request target onto the upstream: {e}"
                    ))
                });
        }
    }
    let (base, slash, rest) = upstream_path(cfg, path);
    let mut pq = String::with_capacity(base.len() + rest.len() + 16);
    pq.push_str(base);
    pq.push_str(slash);
    pq.push_str(rest);
    if let Some(q) = original.query() {
        pq.push('?');
        pq.push_str(q);
    }
    Uri::builder()
        .scheme(up.scheme.clone())
        .authority(authority)
        .path_and_query(pq)
        .build()
        .map_err(|e| {
            ProxyError::BadRequest(format!(
                "cannot map the request target onto the upstream: {e}"
            ))
        })
}

fn is_grpc(h: &http::HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}
