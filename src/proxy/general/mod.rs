//! The general path: every request the fast path does not serve (h2c and
//! TLS clients, chunked or large bodies, upgrades, gRPC, CONNECT, what the
//! fast path hands over) read and answered by hyper's server, as one codec
//! of the serve order. One name for it in code and docs: "the general path".
//!
//! - `conn`: one client connection under hyper's server (keep-alive, idle
//!   and header-read limits, drain); `guard` in front of it, the
//!   request-smuggling guard over HTTP/1 heads.
//! - this module: one request — route → the response cache
//!   ([`self::cached`]), a keyed write that outlives its client
//!   ([`detached`]), a tunnel (`tunnel`, `upgrade`), or the exchange with
//!   the upstream (`exchange`, the serve order's codec over hyper's types)
//!   → the access log.
//! - `transport`: one attempt sent on the upstream layer's connections
//!   (the attempt driver's transport for this path).

pub(crate) mod conn;
pub(crate) mod exchange;
pub(crate) mod grpc_tail;
pub(crate) mod guard;
mod trailers;
pub(crate) mod transport;
pub(crate) mod tunnel;
pub(crate) mod upgrade;

pub(crate) use self::exchange::refresh::refresh;
use self::exchange::with_upstream;
use self::guard::Refusal;
use super::attempt;
use super::body::Body;
use super::cached::{self, Cached};
use super::error::{ErrorCode, ProxyError};
use super::idempotent;
use super::request::{self, Parsed};
use super::{ListenerRole, Snapshot, Upstream};
use crate::metrics::NO_UPSTREAM;
use http::header;
use http::{Request, Response, Uri, Version};
use http_body::Body as _;
use hyper::body::Incoming;
use std::time::Duration;
use tokio::time::Instant;

/// Serves one request from a client. `refused`: the request is the
/// request-smuggling guard's marker for a head it refused, and why
/// (`proxy::general::guard`): weir answers it with its error and routes nothing.
pub(crate) async fn handle(
    snap: &Snapshot,
    role: &ListenerRole,
    conn: &crate::upstream::pool::held::ConnCtx,
    req: Request<Incoming>,
    refused: Option<Refusal>,
) -> Response<Body> {
    // An HTTP/1 request that asks to leave HTTP/1 (CONNECT, an upgrade):
    // the request-smuggling guard stops following the connection at its
    // head. When it does not leave — the upstream declines, no route, an
    // error — the connection closes after the answer, so nothing read after
    // it is served unjudged (docs/reference/protocols.md#upgrades).
    let connect = req.method() == http::Method::CONNECT;
    let leaves = req.version() < Version::HTTP_2
        && (connect || self::upgrade::requested(req.headers()).is_some());
    let mut resp = serve(snap, role, conn, req, refused).await;
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
    conn: &crate::upstream::pool::held::ConnCtx,
    req: Request<Incoming>,
    refused: Option<Refusal>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let start = Instant::now();
    let mut asker = Asker::of(&parts);
    let log = |upstream: &str, asker: &Asker, resp: Response<Body>| {
        access_log(snap, upstream, asker, start, resp)
    };
    if let Some(why) = refused {
        let resp = match why {
            Refusal::HeadTooLarge => {
                snap.metrics.header_too_large();
                ProxyError::HeadTooLarge(snap.config.server.max_header_bytes)
            }
            Refusal::InvalidFraming => {
                snap.metrics.bad_request();
                ProxyError::BadRequest(
                    "the request head is invalid: a Content-Length that is not digits (or too large), Content-Lengths that disagree, a Transfer-Encoding that does not end in chunked, or two Host fields".into(),
                )
            }
            Refusal::FramingConflict => {
                snap.metrics.bad_request();
                ProxyError::BadRequest(
                    "a request may not carry both Content-Length and Transfer-Encoding".into(),
                )
            }
        };
        return log(NO_UPSTREAM, &asker, resp.to_response(None));
    }
    // An HTTP/2 head over the limit: hyper's h2 read it (up to twice the
    // limit), and weir answers it, gRPC-shaped for gRPC. The stream ends
    // there; the connection, framed by HTTP/2, goes on.
    let max_head = snap.config.server.max_header_bytes;
    if parts.version == Version::HTTP_2 && conn::over_header_limit(&parts, max_head) {
        snap.metrics.header_too_large();
        let mut resp = ProxyError::HeadTooLarge(max_head).respond(None, is_grpc(&parts.headers));
        resp.headers_mut().remove(header::CONNECTION);
        return log(NO_UPSTREAM, &asker, resp);
    }
    if let Some(field) = super::route::userinfo_in(&parts) {
        snap.metrics.bad_request();
        let resp = ProxyError::BadRequest(format!(
            "{field} carries userinfo (`user@`): a request names a host, never credentials in it"
        ))
        .to_response(None);
        return log(NO_UPSTREAM, &asker, resp);
    }
    let connect = parts.method == http::Method::CONNECT;
    let upstream = request::route(snap, role, &parts).and_then(|i| snap.upstreams.get(i));
    if connect {
        return tunnel(snap, upstream, parts).await;
    }
    let grpc = is_grpc(&parts.headers);
    let Some(up) = upstream else {
        snap.metrics.no_route();
        let resp = ProxyError::NoRoute.respond(None, grpc);
        return log(NO_UPSTREAM, &asker, resp);
    };
    let cfg = &up.config;
    // The client's deadline, its rate key, and a keyed write's key
    // (docs/reference/idempotency.md#idempotency-keys); a 400 is the exchange's to answer.
    let parsed = request::read(cfg, &parts);
    if let Ok(p) = &parsed {
        if let Some(made) = p.request_id.made_text(&mut [0u8; 32]) {
            asker.request_id = Some(made.to_string());
        }
    }
    // Its spans, when weir traces it: the attempts find them among the
    // request's extensions (docs/reference/tracing.md#spans).
    let lowered = parsed.as_ref().ok().and_then(|p| p.lowered);
    let protocol = if parts.version == Version::HTTP_2 {
        "2"
    } else {
        "1.1"
    };
    asker.trace = super::traced::begin(snap, up, &parts, lowered, protocol);
    if let Some(t) = &asker.trace {
        crate::trace::context::restate(&mut parts.headers, t.tracestate());
        parts.extensions.insert(t.clone());
    }
    // Counted as it passes; its length, when known, stays known, so the
    // upstream gets the client's `Content-Length` (docs/reference/protocols.md#framing).
    let body = super::body::boxed(super::body::Counted::new(body, asker.bytes_in.clone()));
    // What the response cache does with it
    // (docs/reference/cache.md#response-cache): its steps are the order's.
    let cached = match &parsed {
        Ok(p) if cfg.cache.is_some() => {
            let key = || cached::key(up, &parts.uri, parts.headers.get(header::HOST));
            let fields = cached::pairs(&parts.headers);
            let fields = || fields.iter().copied();
            cached::lookup(up, parts.method.as_str(), p.key.is_some(), key, fields)
        }
        _ => Cached::Off,
    };
    // A miss: weir's own error to it says so too.
    let miss = matches!(cached, Cached::Fill(_));
    let forwarded = match parsed {
        Ok(p) if p.key.is_some() => {
            detached(up, conn.pool(), parts, body, start, grpc, p, cached).await
        }
        // Boxed: an awaited future is held twice in its caller's (once
        // made, once pinned), and this one's caller is every request's
        // future, which hyper moves per request (`SHAPE=h2-in
        // bench/callgrind.sh`).
        parsed => {
            let exchange = with_upstream(up, conn, parts, body, start, grpc, parsed, cached);
            Box::pin(exchange).await
        }
    };
    let resp = match forwarded {
        Ok(resp) => resp,
        Err(e) => {
            let (m, took) = (&up.state.metrics, start.elapsed());
            if grpc {
                m.grpc_call(200, Some(e.code()), e.grpc_status(), took);
            } else {
                m.error(e.code(), took);
            }
            let mut resp = e.respond(Some(&up.config.name), grpc);
            if miss && up.config.annotate {
                cached::mark(resp.headers_mut(), crate::policy::cache::CacheResult::Miss);
            }
            resp
        }
    };
    log(&up.config.name, &asker, resp)
}

/// The request side of a request's access-log line, taken before the
/// request moves on (docs/reference/logs.md#logs).
struct Asker {
    method: http::Method,
    uri: Uri,
    client: Option<crate::address::Address>,
    /// The client's `x-request-id`, or the one weir made and forwarded.
    request_id: Option<String>,
    user_agent: Option<String>,
    /// The request body's bytes, counted as they are read.
    bytes_in: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Its spans, when weir traces it.
    trace: Option<crate::trace::Trace>,
}

impl Asker {
    fn of(parts: &http::request::Parts) -> Asker {
        let text = |name: &str| {
            let v = parts.headers.get(name)?.to_str().ok()?;
            Some(v.to_string())
        };
        Asker {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            client: parts
                .extensions
                .get::<super::access::ClientAddr>()
                .map(|c| c.0),
            request_id: text(request::REQUEST_ID_FIELD)
                .filter(|v| request::given_request_id(v.as_bytes()).is_some())
                .filter(|_| {
                    parts
                        .headers
                        .get_all(request::REQUEST_ID_FIELD)
                        .iter()
                        .count()
                        == 1
                }),
            user_agent: text("user-agent"),
            bytes_in: Default::default(),
            trace: None,
        }
    }
}

/// Writes the access-log line for a response weir is about to send; the
/// attempts, stop reason and error come from the annotations weir wrote.
fn access_log(
    snap: &Snapshot,
    upstream: &str,
    asker: &Asker,
    start: Instant,
    resp: Response<Body>,
) -> Response<Body> {
    let (method, uri) = (&asker.method, &asker.uri);
    let mode = snap.config.server.access_log;
    let status = resp.status().as_u16();
    let error = resp.extensions().get::<ErrorCode>().map(|c| c.0);
    let wanted = super::access::wanted(mode, status, error.is_some());
    let spent = resp.extensions().get::<attempt::Annotations>().copied();
    let attempts = spent.map(|a| a.attempts);
    let retry_stop = spent.and_then(|a| a.stop).map(|s| s.as_str());
    let hedge = spent.and_then(|a| a.hedge);
    let endpoint = resp
        .extensions()
        .get::<crate::upstream::Served>()
        .map(|s| s.0);
    let took = start.elapsed();
    let mut trace_id = [0u8; 32];
    let trace_id = super::traced::id(asker.trace.as_ref(), &mut trace_id);
    let grpc_status = crate::proxy::headers::grpc_status(resp.headers());
    let entry = super::access::AccessEntry {
        upstream,
        grpc_status,
        method: method.as_str(),
        path: uri.path(),
        status,
        error,
        attempts,
        retry_stop,
        hedge,
        endpoint,
        took,
        bytes_out: 0,
        who: super::access::Who::default(),
    };
    super::traced::finish(asker.trace.as_ref(), &entry, Some(resp.headers()));
    // weir's own answers, and bodies already whole, are logged now; an
    // upstream's body, which may yet break off, is watched to its end.
    let watch = error.is_none() && upstream != NO_UPSTREAM && !resp.body().is_end_stream();
    if !watch {
        if wanted {
            let entry = super::access::AccessEntry {
                bytes_out: resp.body().size_hint().exact().unwrap_or(0),
                who: super::access::Who {
                    client: asker.client,
                    request_id: asker.request_id.as_deref(),
                    user_agent: asker.user_agent.as_deref(),
                    bytes_in: asker.bytes_in.load(std::sync::atomic::Ordering::Relaxed),
                    trace_id,
                },
                ..entry
            };
            super::access::write(mode, &entry);
        }
        return resp;
    }
    let line = super::access::Line {
        mode,
        always: wanted,
        upstream: upstream.to_string(),
        method: method.as_str().to_string(),
        path: uri.path().to_string(),
        status,
        attempts,
        retry_stop: retry_stop.map(str::to_string),
        grpc_status,
        hedge,
        endpoint,
        took,
        client: asker.client,
        request_id: asker.request_id.clone(),
        user_agent: asker.user_agent.clone(),
        bytes_in: Some(asker.bytes_in.clone()),
        trace_id: trace_id.map(str::to_string),
    };
    let (parts, body) = resp.into_parts();
    let watched = super::access::Watched::new(body, line, snap.metrics.clone());
    Response::from_parts(parts, http_body_util::BodyExt::boxed(watched))
}

/// A keyed write (docs/reference/idempotency.md#idempotency-keys): its exchange
/// and its response body outlive the client when it leaves
/// ([`idempotent::detach`]), so that their outcome is recorded for a re-send.
#[allow(clippy::too_many_arguments)]
async fn detached(
    up: &Upstream,
    pool: &std::sync::Arc<crate::upstream::pool::H1Pool>,
    parts: http::request::Parts,
    body: Body,
    start: Instant,
    grpc: bool,
    parsed: Parsed,
    cached: Cached,
) -> Result<Response<Body>, ProxyError> {
    let (up, pool) = (up.clone(), pool.clone());
    let h1_client = parts.version < http::Version::HTTP_2;
    let exchange = async move {
        // Not the client connection's held connections: this exchange may
        // outlive it. What it holds goes back to the pool when it ends.
        let conn = crate::upstream::pool::held::ConnCtx::new(pool);
        self::exchange::keyed(&up, &conn, parts, body, start, grpc, parsed, cached).await
    };
    match idempotent::detach(exchange).await? {
        (resp, Some(capture)) => Ok(idempotent::recorded(resp, capture, h1_client).await),
        (resp, None) => Ok(resp),
    }
}

/// A CONNECT: a tunnel to an upstream that allows one, else 405. Never
/// forwarded upstream (see `proxy::general::tunnel`).
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
    let key = request::rate_key(&up.config, &parts);
    let (result, attempts) = self::tunnel::open(up, parts, key.as_deref(), start).await;
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
    if attempts > 0 {
        let (mut parts, body) = resp.into_parts();
        let spent = attempt::Annotations {
            attempts,
            stop: None,
            hedge: None,
        };
        let on = up.config.annotate;
        attempt::annotate_response(&mut parts.headers, &mut parts.extensions, spent, on);
        resp = Response::from_parts(parts, body);
    }
    resp
}

fn is_grpc(h: &http::HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .is_some_and(|v| request::grpc_content_type(v.as_bytes()))
}
