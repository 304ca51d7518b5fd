//! One request's exchange with its upstream on the general path, after routing:
//! upstream request hygiene, then the one order of `proxy::order` (deadline
//! → a keyed write's record → admission → body → breaker → attempts), for
//! which this module is hyper's codec ([`GeneralRequest`]: the body prepared
//! for a replay, attempts through hyper's client, response hygiene, and
//! what the response cache's steps ask of a codec). Both a client's
//! request (`proxy::general`) and a stale entry's background refresh
//! (`proxy::general::refresh`) go upstream through [`with_upstream`].

use super::transport::Outbound;
use crate::policy::cache::CacheResult;
use crate::policy::idempotency::StoredResponse;
use crate::policy::RequestFacts;
use crate::proxy::attempt::{self, Annotations, Attempted, Attempts};
use crate::proxy::body::{boxed, Body, IdleTimeout, RelayedBody};
use crate::proxy::cached::{self, whole, Cached};
use crate::proxy::error::ProxyError;
use crate::proxy::headers;
use crate::proxy::idempotent::{self, Begun, Forwarded};
use crate::proxy::order::{self, Codec, KeyedWrites};
use crate::proxy::replay::{RequestBody, Unread};
use crate::proxy::request::Parsed;
use crate::proxy::upload::Upload;
use crate::proxy::Upstream;
use crate::state::gate::Slot;
use http::header;
use http::{Response, Version};
use std::time::Duration;

use tokio::time::Instant;

mod cache_io;
pub(crate) mod refresh;
mod target;

use target::{client_authority, upstream_uri};

/// `parsed`: what the request says of itself ([`request::read`]), or the
/// 400 it earned; `cached`: what the response cache does with it
/// (`proxy::cached::lookup`). A keyed write's is [`keyed`]'s.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn with_upstream(
    up: &Upstream,
    conn: &crate::upstream::pool::held::ConnCtx,
    parts: http::request::Parts,
    body: Body,
    start: Instant,
    is_grpc_request: bool,
    parsed: Result<Parsed, ProxyError>,
    cached: Cached,
) -> Result<Response<Body>, ProxyError> {
    let grpc = is_grpc_request;
    let forwarded = exchange(up, conn, parts, body, start, grpc, parsed, cached).await;
    forwarded.map(|(resp, _)| resp)
}

/// [`with_upstream`] for a keyed write (docs/reference/idempotency.md#idempotency-keys):
/// with the keeping of its response, whose body the caller relays while it
/// records it (`general::detached`); `None` when the response is not to be
/// recorded (a replay, weir's own error, no record).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn keyed(
    up: &Upstream,
    conn: &crate::upstream::pool::held::ConnCtx,
    parts: http::request::Parts,
    body: Body,
    start: Instant,
    is_grpc_request: bool,
    parsed: Parsed,
    cached: Cached,
) -> Result<(Response<Body>, Option<idempotent::Capture>), ProxyError> {
    let grpc = is_grpc_request;
    exchange(up, conn, parts, body, start, grpc, Ok(parsed), cached).await
}

/// The exchange itself: the request made ready for the upstream (its
/// target, its host, hop-by-hop hygiene), then served in the one order of
/// `proxy::order` by [`GeneralRequest`].
#[allow(clippy::too_many_arguments)]
async fn exchange(
    up: &Upstream,
    conn: &crate::upstream::pool::held::ConnCtx,
    mut parts: http::request::Parts,
    body: Body,
    start: Instant,
    is_grpc_request: bool,
    parsed: Result<Parsed, ProxyError>,
    cached: Cached,
) -> Forwarded {
    let cfg = &up.config;
    let parsed = parsed?;
    // The request as the client sent it, when the cache takes part: its
    // fields select an entry's variant, and a background refresh asks
    // for its target again.
    let client = match cached {
        Cached::Off => None,
        _ => Some(copy(&parts)),
    };
    let grpc = headers::grpc_timeout(&parts.headers);
    // A keyed write, with the target the client sent, for its fingerprint.
    let keyed = parsed.key.map(|k| {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        (k, target.to_owned())
    });

    // The host the upstream is told: its own, or the client's with
    // `preserve_host`. It travels as the URI's authority, which the client
    // turns into `:authority` (HTTP/2) or `Host` (HTTP/1.1); see upstream::client.
    let authority = if cfg.preserve_host {
        client_authority(&parts).map_err(|e| unsent(up, &cached, e))?
    } else {
        None
    };
    let uri = upstream_uri(up, &parts.method, &parts.uri, authority);
    let uri = uri.map_err(|e| unsent(up, &cached, e))?;
    let key = parsed.rate_key;
    let upgrade = super::upgrade::requested(&parts.headers);
    let on_upgrade = upgrade
        .as_ref()
        .and_then(|_| parts.extensions.remove::<hyper::upgrade::OnUpgrade>());
    // Two equal lengths (an HTTP/2 client may send the field twice) go
    // upstream as one.
    headers::one_length(&mut parts.headers);
    headers::strip_hop_by_hop(&mut parts.headers, true);
    // The id weir made when the client sent none (docs/reference/logs.md#logs).
    if let Some(id) = parsed.request_id.made_text(&mut [0u8; 32]) {
        if let Ok(v) = http::HeaderValue::from_str(id) {
            parts
                .headers
                .insert(crate::proxy::request::REQUEST_ID_FIELD, v);
        }
    }
    if let (Some(u), Some(_)) = (&upgrade, &on_upgrade) {
        super::upgrade::restore(&mut parts.headers, u.clone());
    }
    parts.headers.remove(header::HOST);
    parts.uri = uri;
    // A method the upstream declares safe to retry is retried and hedged
    // as a GET is (docs/guide/tls-and-grpc.md#grpc-policies).
    let declared = is_grpc_request && cfg.idempotent_methods.contains(parts.uri.path());
    // An HTTP/2 client's request to an upstream spoken to in HTTP/1.1 goes
    // on weir's own HTTP/1.1 client (`upstream::http1`), but for an
    // upgrade and an `Expect: 100-continue` (hyper's interim callback
    // opens the body's gate).
    if parts.version == Version::HTTP_2
        && !up.h2
        && upgrade.is_none()
        && !parts.headers.contains_key(header::EXPECT)
    {
        parts.extensions.insert(crate::upstream::http1::OwnHttp1);
    }
    parts.version = if up.h2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
    // An entry to revalidate: asked with its validators; the request
    // without them is kept, should the 304 match no entry any more.
    let plain = cached.validated().map(|e| {
        let plain = copy(&parts);
        cached::add_validators(&mut parts.headers, e);
        plain
    });
    let mut request = GeneralRequest {
        conn,
        start,
        head: parts.method == http::Method::HEAD,
        client,
        plain,
        mark: None,
        ahead: None,
        asked: [parsed.lowered, grpc],
        keyed,
        has_idempotency_key: parsed.carries_key,
        declared,
        caller: parsed.caller,
        pending: None,
        grpc_status: None,
        // An upgrade is one attempt: its body is the connection itself.
        single: cfg.retry.max_attempts <= 1 || on_upgrade.is_some(),
        stream_unknown: up.h2 || is_grpc_request,
        is_grpc_request,
        on_upgrade,
    };
    let arrived = ArrivedRequest {
        parts,
        body: UnreadBody::Streaming(body),
    };
    order::serve_http(up, &mut request, arrived, start, key.as_deref(), cached).await
}

/// weir's error to a request the cache took up, before its order began:
/// a miss, counted as the order counts one.
fn unsent(up: &Upstream, cached: &Cached, e: ProxyError) -> ProxyError {
    if let Cached::Fill(f) = cached {
        f.count(up, CacheResult::Miss);
    }
    e
}

/// A copy of a request head without a body (its extensions, which only
/// upgrades use, are not copied).
fn copy(p: &http::request::Parts) -> http::request::Parts {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = p.method.clone();
    parts.uri = p.uri.clone();
    parts.version = p.version;
    parts.headers = p.headers.clone();
    parts
}

/// One request on the general path, as the order serves it.
struct GeneralRequest<'r> {
    conn: &'r crate::upstream::pool::held::ConnCtx,
    start: Instant,
    /// A HEAD: an answer from an entry has no body.
    head: bool,
    /// The request as the client sent it, when the response cache takes
    /// part.
    client: Option<http::request::Parts>,
    /// The request without the validators it was sent with.
    plain: Option<http::request::Parts>,
    /// How the response cache took part, for the answer to say.
    mark: Option<CacheResult>,
    /// What was read of the response's body for the cache, relayed first.
    ahead: Option<whole::ReadBefore>,
    /// `x-weir-timeout-ms`, `grpc-timeout`.
    asked: [Option<Duration>; 2],
    /// A keyed write's key and target, until its record is begun.
    keyed: Option<(String, String)>,
    has_idempotency_key: bool,
    /// A gRPC method declared safe to retry.
    declared: bool,
    /// Who asked, for client-side throttling.
    caller: Option<u64>,
    /// A gRPC answer's outcome, settled at its trailers.
    pending: Option<crate::proxy::attempt::Pending>,
    /// The gRPC status of the answer, when its head (or trailers read
    /// before any message) carried one.
    grpc_status: Option<u8>,
    /// `max_attempts = 1`, or an upgrade: nothing is kept for a replay.
    single: bool,
    /// The body's length may be unknown to the upstream (HTTP/2, gRPC).
    stream_unknown: bool,
    is_grpc_request: bool,
    /// The client's side of an upgrade it asked for.
    on_upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// The request as it arrived: its head, and its body as hyper reads it
/// (or already read whole, for a keyed write's fingerprint).
struct ArrivedRequest {
    parts: http::request::Parts,
    body: UnreadBody,
}

enum UnreadBody {
    Streaming(Body),
    Held(RequestBody),
}

/// The request made ready for the attempts.
struct ReadyRequest {
    parts: http::request::Parts,
    body: RequestBody,
    /// `Expect: 100-continue`: the body waits for the upstream's 100.
    continue_gate: Option<std::sync::Arc<crate::proxy::replay::ContinueGate>>,
}

impl GeneralRequest<'_> {
    /// weir's own error as the response, annotated with the attempts made.
    fn own_error(
        &self,
        up: &Upstream,
        e: ProxyError,
        spent: Annotations,
        ended: Instant,
    ) -> Forwarded {
        let took = ended.saturating_duration_since(self.start);
        if self.is_grpc_request {
            // Counted as the client got it: a trailers-only answer.
            let m = &up.state.metrics;
            m.grpc_call(200, Some(e.code()), e.grpc_status(), took);
        } else {
            up.state.metrics.error(e.code(), took);
        }
        let (mut parts, body) = e
            .respond(Some(&up.config.name), self.is_grpc_request)
            .into_parts();
        let annotate = up.config.annotate;
        attempt::annotate_response(&mut parts.headers, &mut parts.extensions, spent, annotate);
        if let Some(m) = self.mark.filter(|_| annotate) {
            cached::mark(&mut parts.headers, m);
        }
        Ok((Response::from_parts(parts, body), None))
    }
}

impl KeyedWrites for GeneralRequest<'_> {
    fn keyed(&self) -> bool {
        self.keyed.is_some()
    }

    async fn begin_keyed(
        &mut self,
        up: &Upstream,
        arrived: ArrivedRequest,
        deadline: Instant,
        upload: &mut Upload,
    ) -> Result<(Option<Begun>, ArrivedRequest), Forwarded> {
        let Some((k, target)) = self.keyed.take() else {
            return Ok((None, arrived));
        };
        let ArrivedRequest { parts, body } = arrived;
        let held = match body {
            UnreadBody::Held(held) => held,
            UnreadBody::Streaming(body) => {
                let limit = up.config.retry.max_replay_body_bytes;
                let body = upload.watch(body);
                let held = prepare(body, true, limit, self.stream_unknown, upload).await;
                held.map_err(Err)?
            }
        };
        let method = parts.method.as_str();
        let begun = idempotent::begin_body(up, &k, method, &target, &held, deadline).await;
        let body = UnreadBody::Held(held);
        Ok((Some(begun), ArrivedRequest { parts, body }))
    }

    async fn replay(&mut self, up: &Upstream, stored: StoredResponse) -> Forwarded {
        let took = self.start.elapsed();
        if self.is_grpc_request {
            let status = |(n, v): (&[u8], &[u8])| {
                let n = n.eq_ignore_ascii_case(b"grpc-status");
                n.then(|| std::str::from_utf8(v).ok()?.parse().ok())?
            };
            let code = stored.fields().chain(stored.trailers()).find_map(status);
            let code = code.unwrap_or_else(|| crate::policy::grpc::from_http(stored.status));
            up.state.metrics.grpc_call(stored.status, None, code, took);
        } else {
            up.state.metrics.status(stored.status, took);
        }
        Ok((
            idempotent::replay_response(&stored, up.config.annotate),
            None,
        ))
    }
}

impl Codec for GeneralRequest<'_> {
    type Out = Forwarded;
    type Response = Response<RelayedBody>;
    type Arrived = ArrivedRequest;
    type Ready = ReadyRequest;

    fn asked(&self) -> [Option<Duration>; 2] {
        self.asked
    }

    async fn body(
        &mut self,
        up: &Upstream,
        arrived: ArrivedRequest,
        upload: &mut Upload,
    ) -> Result<(ReadyRequest, bool), Forwarded> {
        let ArrivedRequest { parts, body } = arrived;
        let body = match body {
            UnreadBody::Held(body) => {
                let continue_gate = None;
                return Ok((
                    ReadyRequest {
                        parts,
                        body,
                        continue_gate,
                    },
                    true,
                ));
            }
            UnreadBody::Streaming(body) => upload.watch(body),
        };
        // `Expect: 100-continue`: the body waits for the upstream's 100.
        let gate = (parts.version == Version::HTTP_11
            && !http_body::Body::is_end_stream(&body)
            && parts
                .headers
                .get(header::EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue")))
        .then(|| std::sync::Arc::new(crate::proxy::replay::ContinueGate::default()));
        let limit = up.config.retry.max_replay_body_bytes;
        let body = match &gate {
            Some(gate) => RequestBody::gated(body, gate.clone(), !self.single),
            None => prepare(body, !self.single, limit, self.stream_unknown, upload)
                .await
                .map_err(Err)?,
        };
        let ready = ReadyRequest {
            parts,
            body,
            continue_gate: gate,
        };
        Ok((ready, true))
    }

    fn facts(&self, ready: &ReadyRequest) -> RequestFacts {
        let method = ready.parts.method.as_str();
        RequestFacts {
            caller: self.caller,
            ..RequestFacts::new(
                method,
                self.has_idempotency_key || self.declared,
                ready.body.facts(),
            )
        }
    }

    async fn drive(
        &mut self,
        up: &Upstream,
        ready: ReadyRequest,
        attempts: &mut Attempts<'_>,
        t0: Instant,
        _detached: bool,
    ) -> Option<Attempted<Response<RelayedBody>>> {
        let cfg = &up.config;
        let plan = Outbound {
            grpc_deadline: self.asked[1].map(|g| self.start + g),
            deadline: attempts.deadline_at(t0),
            upload: attempts.upload().clone(),
            parts: ready.parts,
            body: ready.body,
            has_idempotency_key: self.has_idempotency_key,
            single: self.single,
            upgrade: self.on_upgrade.is_some(),
            grpc: super::transport::GrpcPlan {
                call: self.is_grpc_request,
                // gRPC codes sent before the first message can only be
                // acted on when the response is held until then.
                hold_trailers: self.is_grpc_request
                    && !self.single
                    && cfg.retry.retry_on.any_grpc(),
            },
            continue_gate: ready.continue_gate,
        };
        // Boxed: the attempts' future is most of a request's, and each
        // layer that holds it inline copies it whole when it is made.
        let attempted = Box::pin(super::transport::run(up, self.conn, plan, attempts)).await;
        self.pending = attempts.take_pending();
        self.grpc_status = attempts.grpc_status();
        Some(attempted)
    }

    async fn refuse(
        &mut self,
        up: &Upstream,
        error: ProxyError,
        spent: Option<Annotations>,
        _endpoint: Option<crate::upstream::Address>,
    ) -> Forwarded {
        match spent {
            // Refused before any attempt: the caller answers it.
            None => Err(error),
            Some(spent) => self.own_error(up, error, spent, Instant::now()),
        }
    }

    fn gone(&mut self) -> Forwarded {
        Err(ProxyError::DeadlineExceeded)
    }

    async fn answer(
        &mut self,
        up: &Upstream,
        attempted: Attempted<Response<RelayedBody>>,
        spent: Annotations,
        recorder: Option<idempotent::Recorder>,
        slot: Slot,
    ) -> Forwarded {
        let cfg = &up.config;
        let mut resp = match attempted.result {
            Ok(resp) => resp,
            Err(e) => return self.own_error(up, e, spent, attempted.ended),
        };
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
        match (self.on_upgrade.take(), upstream_upgrade, agreed) {
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
        attempt::annotate_response(
            &mut rparts.headers,
            &mut rparts.extensions,
            spent,
            cfg.annotate,
        );
        if let Some(m) = self.mark.filter(|_| cfg.annotate) {
            cached::mark(&mut rparts.headers, m);
        }
        let took = attempted.ended.saturating_duration_since(self.start);
        let status = rparts.status.as_u16();
        let pending = self.pending.take();
        if !self.is_grpc_request {
            up.state.metrics.status(status, took);
        } else if pending.is_none() {
            let code = headers::grpc_status(&rparts.headers)
                .or(self.grpc_status)
                .unwrap_or_else(|| crate::policy::grpc::from_http(status));
            up.state.metrics.grpc_call(status, None, code, took);
        }
        let first = attempted.ended + cfg.idle_timeout;
        let body = match self.ahead.take() {
            None => boxed(rbody),
            Some(ahead) => ahead.before(boxed(rbody)),
        };
        let body = match pending {
            None => body,
            Some(pending) => {
                let caller = self.caller;
                let endpoint = rparts
                    .extensions
                    .remove::<super::grpc_tail::LateEndpoint>()
                    .and_then(|e| e.take());
                let tail = super::grpc_tail::Tail {
                    endpoint,
                    pending,
                    took,
                    caller,
                };
                boxed(super::grpc_tail::GrpcTail::new(body, tail))
            }
        };
        let body = IdleTimeout::new(body, first, cfg.idle_timeout, Some(slot));
        Ok((Response::from_parts(rparts, boxed(body)), capture))
    }
}

/// Prepares the request body for the attempts (see [`RequestBody::prepare`]):
/// each gap within `idle_timeout` and the whole within the client's own
/// deadline, not `timeout` (docs/reference/deadlines.md#uploads).
async fn prepare(
    body: Body,
    retry_possible: bool,
    limit: u64,
    stream_unknown: bool,
    upload: &Upload,
) -> Result<RequestBody, ProxyError> {
    let bounds = (limit, upload.idle());
    let prepared = RequestBody::prepare(body, retry_possible, bounds, stream_unknown);
    let read = match upload.client() {
        Some(c) => (tokio::time::timeout_at(c, prepared).await).unwrap_or(Err(Unread::Idle)),
        None => prepared.await,
    };
    read.map_err(|e| match e {
        Unread::Broke(e) => {
            ProxyError::BadRequest(format!("the request body could not be read: {e}"))
        }
        Unread::Idle => ProxyError::DeadlineExceeded,
    })
}
