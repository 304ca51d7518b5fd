//! The general path's attempts: the request rebuilt from a [`Outbound`] for each
//! one and sent through hyper's client (or a held connection); gRPC
//! responses held until their first message.

use super::trailers::{hold_for_trailers, pushback_of};
use crate::policy::{parse_retry_after, Outcome};
use crate::proxy::attempt::Watch;
use crate::proxy::attempt::{drive, timed_out, Attempted, Attempts, Transport};
use crate::proxy::body::{Body, RelayedBody};
use crate::proxy::error::ProxyError;
use crate::proxy::headers::grpc_status;
use crate::proxy::replay::RequestBody;
use crate::proxy::upload::{Expired, Upload};
use crate::proxy::Upstream;
use crate::state::UpstreamState;
use crate::upstream::pool::held::ConnCtx;
use http::request::Parts;
use http::{HeaderMap, Request, Response};
use std::time::Duration;
use tokio::time::Instant;

/// What one request brings to the attempt loop.
#[derive(Debug)]
pub(crate) struct Outbound {
    pub parts: Parts,
    pub body: RequestBody,
    pub deadline: Instant,
    pub has_idempotency_key: bool,
    /// The client's own gRPC deadline (`grpc-timeout` on arrival): each
    /// attempt carries what is left of it. Never weir's `timeout`, which
    /// bounds only the wait for response headers: a stream may outlive it.
    pub grpc_deadline: Option<Instant>,
    /// `max_attempts = 1`: nothing is cloned for a replay.
    pub single: bool,
    /// A connection upgrade: one attempt, never retried.
    pub upgrade: bool,
    /// What gRPC asks of the attempts (see [`GrpcPlan`]).
    pub grpc: GrpcPlan,
    /// `Expect: 100-continue`: the upstream's 100 opens the body's gate.
    pub continue_gate: Option<std::sync::Arc<crate::proxy::replay::ContinueGate>>,
    /// The body's upload: an attempt's timers wait while it comes
    /// (docs/reference/deadlines.md#uploads).
    pub upload: Upload,
}

/// A request's gRPC side, as the attempts need it: known once, when the
/// request is read, not looked up again per attempt.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GrpcPlan {
    /// A gRPC call: an answer without a status in its head waits for its
    /// trailers to be judged (`grpc_tail`).
    pub call: bool,
    /// Hold a gRPC response (up to the replay limit) to read its trailers.
    pub hold_trailers: bool,
}

/// The general path's transport: hyper's client (or a held connection),
/// the request rebuilt from the plan for each attempt. A client that goes
/// away makes hyper drop the whole future, so nothing here watches for it.
/// The fast path sends its requests to an HTTP/2 upstream through it too,
/// wrapped in a watch on its client (`proxy::fast::h2`).
pub(crate) struct GeneralTransport<'p, 'a> {
    up: &'a Upstream,
    conn: &'p ConnCtx,
    plan: &'p mut Outbound,
    /// Endpoints that failed this request (a retry goes elsewhere).
    avoid: Vec<crate::upstream::Address>,
}

impl<'p, 'a> GeneralTransport<'p, 'a> {
    pub(crate) fn new(up: &'a Upstream, conn: &'p ConnCtx, plan: &'p mut Outbound) -> Self {
        GeneralTransport {
            up,
            conn,
            plan,
            avoid: Vec::new(),
        }
    }

    /// The endpoint of the last attempt that failed, if one did.
    pub(crate) fn last_failed(&self) -> Option<crate::upstream::Address> {
        self.avoid.last().copied()
    }
}

impl Watch for GeneralTransport<'_, '_> {
    /// hyper watches the client for us (see [`crate::proxy::attempt::Dropped`]).
    async fn unless_gone<F: std::future::Future>(&mut self, f: F) -> Option<F::Output> {
        crate::proxy::attempt::Dropped.unless_gone(f).await
    }
}

impl Transport for GeneralTransport<'_, '_> {
    type Response = Response<RelayedBody>;

    async fn attempt(
        &mut self,
        _started: Instant,
        try_deadline: Instant,
        deadline: Instant,
    ) -> Option<(Outcome, Result<Self::Response, ProxyError>)> {
        let req = build(self.plan);
        let grpc = (self.plan.grpc, deadline, &self.plan.upload);
        Some(
            send(
                self.up,
                self.conn,
                req,
                grpc,
                try_deadline,
                &mut self.avoid,
                None,
            )
            .await,
        )
    }

    async fn attempt_hedged(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
        hedging: crate::proxy::attempt::Hedging<'_>,
    ) -> Option<crate::proxy::attempt::Raced<Self::Response>> {
        let first = build(self.plan);
        let upload = self.plan.upload.clone();
        let grpc = (self.plan.grpc, deadline, &upload);
        let (up, conn) = (self.up, self.conn);
        let (seen, seen2) = (
            crate::proxy::attempt::Seen::default(),
            crate::proxy::attempt::Seen::default(),
        );
        // The hedge's request is built now (cheap: the body is held) so that
        // the first attempt's future borrows nothing the hedge needs.
        let second = build(self.plan);
        let mut hedge_avoid = self.avoid.clone();
        let primary = send(
            up,
            conn,
            first,
            grpc,
            try_deadline,
            &mut self.avoid,
            Some(&seen),
        );
        let raced = crate::proxy::attempt::race(primary, started, hedging, |_sent, give_up| {
            if let Some(a) = seen.get() {
                hedge_avoid.push(a);
            }
            send(
                up,
                conn,
                second,
                grpc,
                give_up,
                &mut hedge_avoid,
                Some(&seen2),
            )
        })
        .await;
        raced.observe_loser(&up.endpoints, started, (&seen, &seen2));
        Some(raced)
    }

    fn discard(&mut self, _response: Result<Self::Response, ProxyError>) {}

    fn body_facts(&self) -> Option<crate::policy::BodyFacts> {
        // The body facts change once a streamed body has been read.
        Some(self.plan.body.facts())
    }

    fn traceparent(&mut self, value: &[u8; 55]) {
        crate::trace::context::set_in_fields(&mut self.plan.parts.headers, value);
    }

    fn elsewhere(&self) -> bool {
        self.up.endpoints.untried(&self.avoid)
    }

    fn endpoint(&self, r: &Result<Self::Response, ProxyError>) -> Option<crate::upstream::Address> {
        match r {
            Ok(resp) => resp
                .extensions()
                .get::<crate::upstream::Served>()
                .map(|s| s.0),
            Err(_) => self.avoid.last().copied(),
        }
    }
}

/// Runs the attempts of a request on the general path until one is returned
/// (`proxy::order` has begun them): the request rebuilt from `plan` for each.
pub(crate) async fn run(
    up: &Upstream,
    conn: &ConnCtx,
    mut plan: Outbound,
    attempts: &mut Attempts<'_>,
) -> Attempted<Response<RelayedBody>> {
    attempts.trace = plan.parts.extensions.get::<crate::trace::Trace>().cloned();
    attempts.set_grpc(plan.grpc.call);
    if plan.upgrade {
        // An upgrade is one attempt, never retried: recorded, not judged.
        let started = Instant::now();
        let try_deadline = attempts.start(started);
        let req = build(&mut plan);
        let grpc = (plan.grpc, plan.deadline, &plan.upload);
        let (outcome, result) =
            send(up, conn, req, grpc, try_deadline, &mut Vec::new(), None).await;
        let ended = Instant::now();
        attempts.record(&outcome, result.as_ref().err(), started, ended);
        return Attempted {
            result,
            stop: None,
            ended,
            last_failed: None,
        };
    }
    attempts.set_keyed_write(
        plan.has_idempotency_key
            && !crate::policy::is_idempotent_method(plan.parts.method.as_str()),
    );
    let mut t = GeneralTransport {
        up,
        conn,
        plan: &mut plan,
        avoid: Vec::new(),
    };
    match drive(attempts, &mut t, None).await {
        Some(d) => Attempted {
            result: d.result,
            stop: d.stop,
            ended: d.ended,
            last_failed: t.last_failed(),
        },
        // Never: this transport does not watch the client (hyper drops us).
        None => Attempted {
            result: Err(ProxyError::DeadlineExceeded),
            stop: None,
            ended: Instant::now(),
            last_failed: None,
        },
    }
}

/// The request for the next attempt: headers cloned only when a retry is
/// possible (the body says so), the body from the replay buffer or stream.
fn build(plan: &mut Outbound) -> Request<crate::proxy::body::Body> {
    let mut req = Request::new(plan.body.for_attempt());
    *req.method_mut() = plan.parts.method.clone();
    *req.uri_mut() = plan.parts.uri.clone();
    *req.version_mut() = plan.parts.version;
    // The extensions carry the header names' original case (hyper's).
    (*req.headers_mut(), *req.extensions_mut()) = if plan.single {
        // No retry is possible: the one attempt takes the headers.
        (
            std::mem::take(&mut plan.parts.headers),
            std::mem::take(&mut plan.parts.extensions),
        )
    } else {
        (plan.parts.headers.clone(), plan.parts.extensions.clone())
    };
    // Interim responses counted (a flood ends the attempt, see [`send`]),
    // and a `100 Continue` opens the body's gate.
    let interims = Interims::default();
    let (gate, count) = (plan.continue_gate.clone(), interims.clone());
    hyper::ext::on_informational(&mut req, move |r| {
        count.seen();
        if r.status() == http::StatusCode::CONTINUE {
            if let Some(gate) = &gate {
                gate.open();
            }
        }
    });
    req.extensions_mut().insert(interims);
    // A body of unknown length goes chunked, whatever the method: hyper
    // would send a GET's or HEAD's as no body at all, and a body is never
    // dropped silently. (HTTP/2 frames it itself; hyper drops the field.)
    // A length the client declared is kept: hyper frames by the field, and
    // servers that read only `Content-Length` get the body
    // (docs/reference/protocols.md#framing).
    let unknown = {
        use http_body::Body as _;
        let b = req.body();
        b.size_hint().exact().is_none()
            && !b.is_end_stream()
            && !req.headers().contains_key(http::header::CONTENT_LENGTH)
    };
    if unknown {
        req.headers_mut().insert(
            http::header::TRANSFER_ENCODING,
            http::HeaderValue::from_static("chunked"),
        );
    }
    if let Some(grpc_deadline) = plan.grpc_deadline {
        let left = grpc_deadline.saturating_duration_since(Instant::now());
        req.headers_mut().insert(
            "grpc-timeout",
            crate::proxy::headers::grpc_timeout_value(left),
        );
    }
    req
}

/// Sends one attempt; gives up at `try_deadline` (or `deadline`), each moved
/// on by the time the request body's `upload` takes meanwhile.
/// `seen` learns the endpoint picked while the attempt is in flight.
async fn send(
    up: &Upstream,
    conn: &ConnCtx,
    req: Request<crate::proxy::body::Body>,
    (grpc, deadline, upload): (GrpcPlan, Instant, &Upload),
    try_deadline: Instant,
    avoid: &mut Vec<crate::upstream::Address>,
    seen: Option<&crate::proxy::attempt::Seen>,
) -> (Outcome, Result<Response<RelayedBody>, ProxyError>) {
    let started = Instant::now();
    let mut picked = None;
    let mut req = req;
    let interims = req.extensions_mut().remove::<Interims>();
    // Made inside the block that awaits it: made outside and moved in, it
    // would be held twice in this future (once captured, once pinned).
    let sending = async {
        let sending = dispatch(up, conn, req, avoid, &mut picked, seen);
        let Some(interims) = interims else {
            return sending.await;
        };
        let flood = || {
            crate::upstream::client::SendError::new(
                crate::upstream::client::Failure::BadResponse,
                crate::upstream::send::INTERIM_FLOOD,
            )
        };
        // The flood first: hyper's connection task may have read it, and
        // the connection's end after it, before this task is polled.
        tokio::select! {
            biased;
            () = interims.flood() => Err(flood()),
            r = sending => match r {
                Err(_) if interims.flooded() => Err(flood()),
                r => r,
            },
        }
    };
    let (sent, try_deadline, deadline) = upload
        .within(started, try_deadline, deadline, sending)
        .await;
    let (outcome, mut result) = judge(up, (grpc.hold_trailers, deadline), try_deadline, sent).await;
    if let (Ok(r), Some(p)) = (&mut result, &picked) {
        r.extensions_mut().insert(crate::upstream::Served(p.addr()));
        // A gRPC answer whose status is still to come: the endpoint is
        // judged by it, at the trailers (`grpc_tail`).
        if grpc.call && super::grpc_tail::pending(&outcome) {
            let p = picked.take().map(|p| (p, started));
            r.extensions_mut()
                .insert(super::grpc_tail::LateEndpoint::new(p));
        }
    }
    crate::upstream::report(picked, &outcome, &up.config.breaker, started, avoid);
    (outcome, result)
}

/// The interim (1xx) responses hyper has read for one attempt (its
/// `on_informational` callback counts them); past
/// [`crate::upstream::send::MAX_INTERIM_RESPONSES`], [`Interims::flood`]
/// completes and [`send`] drops the attempt, its connection with it.
#[derive(Clone, Default)]
struct Interims(std::sync::Arc<(std::sync::atomic::AtomicU32, tokio::sync::Notify)>);

impl Interims {
    fn seen(&self) {
        let n = self.0 .0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if n > crate::upstream::send::MAX_INTERIM_RESPONSES {
            self.0 .1.notify_one();
        }
    }

    async fn flood(&self) {
        self.0 .1.notified().await;
    }

    fn flooded(&self) -> bool {
        self.0 .0.load(std::sync::atomic::Ordering::Relaxed)
            > crate::upstream::send::MAX_INTERIM_RESPONSES
    }
}

/// The outcome of a sent attempt, and what the client would get.
async fn judge(
    up: &Upstream,
    (grpc_trailers, deadline): (bool, Instant),
    try_deadline: Instant,
    sent: Result<
        Result<Response<crate::proxy::body::UpstreamBody>, crate::upstream::client::SendError>,
        Expired,
    >,
) -> (Outcome, Result<Response<RelayedBody>, ProxyError>) {
    let state = &up.state;
    match sent {
        Ok(Ok(resp)) => {
            let mut grpc = grpc_status(resp.headers());
            // Read before the `x-weir-*` fields are stripped.
            let mut pushback = pushback_of(resp.headers());
            let resp = if grpc_trailers && grpc.is_none() && resp.status() == http::StatusCode::OK {
                let limit = up.config.retry.max_replay_body_bytes;
                let (resp, trailer_status, trailer_pushback) =
                    hold_for_trailers(resp, limit, try_deadline).await;
                grpc = trailer_status;
                pushback = pushback.or(trailer_pushback);
                resp
            } else {
                resp.map(RelayedBody::Left)
            };
            (
                Outcome::Response {
                    status: resp.status().as_u16(),
                    retry_after: retry_after(resp.headers(), state),
                    grpc_status: grpc,
                    pushback,
                },
                Ok(resp),
            )
        }
        Ok(Err(e)) => {
            if e.tls {
                up.reach.log_tls_failure_once(&e.message);
            }
            let (outcome, error) = e.into_parts();
            (outcome, Err(error))
        }
        Err(expired) => {
            let (outcome, e) = expired
                .idle_parts()
                .unwrap_or_else(|| timed_out(try_deadline, deadline));
            (outcome, Err(e))
        }
    }
}

/// Sends through the one checkout of the upstream layer
/// (`upstream::checkout`), the picked endpoint left in `picked` for the
/// attempt's outcome and told to `seen` (a hedge's race).
async fn dispatch(
    up: &Upstream,
    conn: &ConnCtx,
    req: Request<Body>,
    avoid: &mut Vec<crate::upstream::Address>,
    picked: &mut Option<crate::upstream::Picked>,
    seen: Option<&crate::proxy::attempt::Seen>,
) -> Result<Response<crate::proxy::body::UpstreamBody>, crate::upstream::client::SendError> {
    let to = up.checkout();
    let upgrade = super::upgrade::requested(req.headers()).is_some();
    let publish = |a: crate::upstream::Address| {
        if let Some(s) = seen {
            s.set(a);
        }
    };
    crate::upstream::checkout::send(&to, conn, req, upgrade, avoid, picked, &publish).await
}

pub(crate) fn retry_after(h: &HeaderMap, state: &UpstreamState) -> Option<Duration> {
    let v = h.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(v, state.clock.wall())
}
