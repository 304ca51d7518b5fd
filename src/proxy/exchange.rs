//! One request's exchange with its upstream, after routing: deadline →
//! upstream request hygiene → (a keyed write's record) → admission and
//! attempts ([`super::attempt`]) → response hygiene. Both the plain request
//! path (`proxy::general`) and the response cache (`proxy::cached`) go
//! upstream through [`with_upstream`].

use super::attempt::{self, Outbound};
use super::body::{boxed, Body, IdleTimeout};
use super::error::ProxyError;
use super::headers;
use super::idempotent::{self, Begun};
use super::replay::RequestBody;
use super::request::Parsed;
use super::route::upstream_path;
use super::Upstream;
use http::header;
use http::uri::Authority;
use http::{Response, Uri, Version};

use tokio::time::Instant;

/// `parsed`: what the request says of itself ([`request::read`]), or the
/// 400 it earned. A keyed write's is [`keyed`]'s.
pub(crate) async fn with_upstream(
    up: &Upstream,
    conn: &super::sticky::ConnCtx,
    parts: http::request::Parts,
    body: Body,
    start: Instant,
    is_grpc_request: bool,
    parsed: Result<Parsed, ProxyError>,
) -> Result<Response<Body>, ProxyError> {
    let forwarded = exchange(up, conn, parts, body, start, is_grpc_request, parsed).await;
    forwarded.map(|(resp, _)| resp)
}

/// [`with_upstream`] for a keyed write (docs/reference/idempotency.md#idempotency-keys):
/// with the keeping of its response, whose body the caller relays while it
/// records it (`general::detached`); `None` when the response is not to be
/// recorded (a replay, weir's own error, no record).
pub(crate) async fn keyed(
    up: &Upstream,
    conn: &super::sticky::ConnCtx,
    parts: http::request::Parts,
    body: Body,
    start: Instant,
    is_grpc_request: bool,
    parsed: Parsed,
) -> Result<(Response<Body>, Option<idempotent::Capture>), ProxyError> {
    exchange(up, conn, parts, body, start, is_grpc_request, Ok(parsed)).await
}

/// The exchange itself, in the order of this module's summary.
async fn exchange(
    up: &Upstream,
    conn: &super::sticky::ConnCtx,
    mut parts: http::request::Parts,
    body: Body,
    start: Instant,
    is_grpc_request: bool,
    parsed: Result<Parsed, ProxyError>,
) -> Result<(Response<Body>, Option<idempotent::Capture>), ProxyError> {
    let cfg = &up.config;
    let parsed = parsed?;
    let grpc = headers::grpc_timeout(&parts.headers);
    let (deadline, client_lowered) = attempt::deadline(cfg, start, [parsed.lowered, grpc]);
    // A keyed write, with the target the client sent, for its fingerprint.
    let keyed = parsed.key.map(|k| {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        (k, target.to_owned())
    });

    // The host the upstream is told: its own, or the client's with
    // `preserve_host`. It travels as the URI's authority, which the client
    // turns into `:authority` (HTTP/2) or `Host` (HTTP/1.1); see upstream::client.
    let authority = if cfg.preserve_host {
        client_authority(&parts)?
    } else {
        None
    };
    let uri = upstream_uri(up, &parts.method, &parts.uri, authority)?;
    let key = parsed.rate_key;
    let upgrade = super::upgrade::requested(&parts.headers);
    let on_upgrade = upgrade
        .as_ref()
        .and_then(|_| parts.extensions.remove::<hyper::upgrade::OnUpgrade>());
    headers::strip_hop_by_hop(&mut parts.headers, true);
    // The id weir made when the client sent none (docs/reference/logs.md#logs).
    if let Some(id) = parsed.request_id.made_text(&mut [0u8; 32]) {
        if let Ok(v) = http::HeaderValue::from_str(id) {
            parts.headers.insert(super::request::REQUEST_ID_FIELD, v);
        }
    }
    if let (Some(u), Some(_)) = (&upgrade, &on_upgrade) {
        super::upgrade::restore(&mut parts.headers, u.clone());
    }
    let has_idempotency_key = parsed.carries_key;
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
                    return Ok((idempotent::replay_response(&stored, cfg.annotate), None));
                }
                Begun::Refused(e) => return Err(e),
                Begun::Forward(r) => recorder = Some(r),
                Begun::Unrecorded => {}
            }
            (Some(held), None)
        }
        None => (None, Some(body)),
    };

    // Admission in the order of docs/reference/admission.md#admission: rate limit, concurrency; the body is
    // read (when it is to be kept for a replay) before the breaker is asked,
    // so a slow upload never holds a half-open probe slot.
    let admitted = attempt::admit(up, key.as_deref(), start, deadline, &mut attempt::Dropped).await;
    let admitted = admitted.unwrap_or(Err(ProxyError::DeadlineExceeded))?;
    let (slot, taken) = (admitted.slot, admitted.taken);

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
    let ticket = match attempt::admit_breaker(&up.state) {
        Ok(t) => t,
        Err(e) => {
            attempt::refund(up, key.as_deref(), taken);
            return Err(e);
        }
    };
    let plan = Outbound {
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
    // Boxed: held twice in this future otherwise (see `general::serve`).
    let done = Box::pin(attempt::run(up, conn, plan, ticket)).await;
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
            let capture = recorder.map(|r| {
                let fields = idempotent::kept_fields(&rparts.headers);
                let hint = http_body::Body::size_hint(&rbody).exact().unwrap_or(0);
                r.capture(rparts.status.as_u16(), fields, hint)
            });
            let spent = attempt::Annotations {
                attempts: done.attempts,
                stop: done.stop,
                hedge: done.hedge,
            };
            attempt::annotate_response(
                &mut rparts.headers,
                &mut rparts.extensions,
                spent,
                cfg.annotate,
            );
            up.state.metrics.status(
                rparts.status.as_u16(),
                done.ended.saturating_duration_since(start),
            );
            let first = done.ended + cfg.idle_timeout;
            let body = IdleTimeout::new(rbody, first, cfg.idle_timeout, Some(slot));
            Ok((Response::from_parts(rparts, boxed(body)), capture))
        }
        Err(e) => {
            up.state
                .metrics
                .error(e.code(), done.ended.saturating_duration_since(start));
            let (mut parts, body) = e.respond(Some(&cfg.name), is_grpc_request).into_parts();
            let spent = attempt::Annotations {
                attempts: done.attempts,
                stop: done.stop,
                hedge: done.hedge,
            };
            attempt::annotate_response(
                &mut parts.headers,
                &mut parts.extensions,
                spent,
                cfg.annotate,
            );
            Ok((Response::from_parts(parts, body), None))
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
