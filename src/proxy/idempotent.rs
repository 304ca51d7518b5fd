//! Idempotency keys in the data plane (docs/reference/idempotency.md#idempotency-keys):
//! the one place both paths ask the upstream's store what a keyed request
//! gets, answer a replay or a refusal, and record how a forwarded one ended.
//! What the store decides is `policy::idempotency`'s; this module only
//! carries requests and responses to and from it.
//!
//! A request is keyed when its upstream keeps a store, its method is one of
//! the store's `methods` and it carries the `idempotency_header`. Its
//! fingerprint needs its whole body, so a keyed request's body is read
//! before admission (a replay is never held back by the breaker, the rate
//! limit or the concurrency limit) when weir holds it (up to
//! `max_replay_body_bytes`); a body weir streams claims the key first and is
//! fingerprinted on its way to the upstream ([`begin_body`]).

mod detach;
mod fleet;

pub(crate) use detach::{detach, recorded, Forwarded};

use super::error::ProxyError;
use super::Upstream;
use crate::policy::idempotency::{
    Action, Claim, Ending, Fingerprint, FingerprintHasher, IdempotencyStore, Record,
    StoredResponse, Ticket, REPLAYED_HEADER,
};
use crate::state::UpstreamState;
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;

/// What a keyed request gets.
#[derive(Debug)]
pub(crate) enum Begun {
    /// The stored response; the upstream sees nothing.
    Replay(StoredResponse),
    /// weir's 409 or 422.
    Refused(ProxyError),
    /// Forward it, and record its end through the recorder.
    Forward(Recorder),
    /// The store was turned off by a reload meanwhile: forward, record nothing.
    Unrecorded,
}

/// Asks the upstream's store about a keyed request (and records it in
/// flight when it is to be forwarded): the fleet's on Redis when the
/// upstream's state is shared and Redis answers, else the instance's own.
pub(crate) async fn begin(up: &Upstream, key: &str, fingerprint: &Fingerprint) -> Begun {
    // A begin on Redis that went unanswered may have landed: its record
    // there is finished with the local one, or forgotten. (The Redis call
    // is boxed: its future is large, and a request without a fleet would
    // otherwise carry, and copy, room for it.)
    let mut landed = None;
    if let Some(link) = up.state.link() {
        match Box::pin(fleet::begin(up, link, key, fingerprint)).await {
            Ok(b) => return b,
            Err(l) => landed = l,
        }
    }
    let state = &up.state;
    let now = state.now();
    let mut store = state.idempotency();
    let action = store.as_mut().map(|s| {
        let limit = s.params().max_response_bytes;
        let (action, ticket) = s.begin_ticket(key, fingerprint, now);
        (action, ticket, limit)
    });
    drop(store);
    // Not forwarded: the record is dropped (unless this instance has the
    // key in flight: that request finishes the record, its owner's too).
    if !matches!(action, Some((Action::Forward | Action::InFlight, ..))) {
        if let Some(l) = landed.take() {
            fleet::forget(l, key);
        }
    }
    let Some((action, ticket, limit)) = action else {
        return Begun::Unrecorded;
    };
    match action {
        Action::Forward => {
            // The ticket finds the local record; only Redis needs the key.
            let keep_key = landed.is_some() || ticket.is_none();
            Begun::Forward(Recorder {
                state: state.clone(),
                key: keep_key.then(|| key.into()),
                ticket,
                limit,
                shared: None,
                landed: landed.map(Box::new),
                done: false,
            })
        }
        Action::Replay(r) => Begun::Replay(r),
        Action::InFlight => Begun::Refused(ProxyError::IdempotencyInFlight),
        Action::Reused => Begun::Refused(ProxyError::IdempotencyKeyReused),
        Action::NotReplayable => Begun::Refused(ProxyError::IdempotencyNotReplayable),
    }
}

/// How a keyed request that weir answered with one of its own errors ended:
/// after an attempt that may have reached the upstream (a timeout, a reset,
/// a response that did not parse, the deadline), it may have been processed.
pub(crate) fn ending_of(e: &ProxyError) -> Ending {
    match e {
        ProxyError::UpstreamTimeout
        | ProxyError::UpstreamReset(_)
        | ProxyError::BadResponse(_)
        | ProxyError::DeadlineExceeded => Ending::Uncertain,
        _ => Ending::Failed,
    }
}

/// A forwarded keyed request's record, in flight until [`Recorder::finish`].
/// Dropped unfinished (the client went away, the exchange was cancelled),
/// the record becomes uncertain, so the key is not wedged.
#[derive(Debug)]
pub(crate) struct Recorder {
    state: Arc<UpstreamState>,
    /// The key, unless `ticket` finds the record and none is on Redis.
    key: Option<Box<str>>,
    /// The local record, as the memory store took it in flight.
    ticket: Option<Ticket>,
    /// `max_response_bytes`.
    limit: usize,
    /// Where the record is, when it is on the fleet's Redis. (Boxed, as
    /// `landed`: without a fleet a recorder is small, and cheap to move.)
    shared: Option<Box<fleet::RedisRecord>>,
    /// With the record in the local store: the one an unanswered begin on
    /// Redis may have left there, finished the same way.
    landed: Option<Box<fleet::RedisRecord>>,
    done: bool,
}

impl Recorder {
    fn new(
        state: &Arc<UpstreamState>,
        key: &str,
        limit: usize,
        shared: Option<fleet::RedisRecord>,
    ) -> Self {
        Recorder {
            state: state.clone(),
            key: Some(key.into()),
            ticket: None,
            limit,
            shared: shared.map(Box::new),
            landed: None,
            done: false,
        }
    }

    /// Records how the request ended (with the response to keep, if any).
    /// The [`Ack`] is what the relay waits for before the response's last
    /// bytes go out: the record's acknowledgement by the fleet's replicas
    /// when `[state] wait_replicas` asks for it, else nothing.
    pub(crate) fn finish(mut self, ending: Ending, response: Option<StoredResponse>) -> Ack {
        self.done = true;
        self.write(crate::policy::idempotency::record(ending), response)
    }

    fn write(&mut self, what: Record, response: Option<StoredResponse>) -> Ack {
        if let Some(shared) = self.shared.take() {
            let key = self.key.take().unwrap_or_default();
            return fleet::finish(*shared, key, what, response);
        }
        if let (Some(landed), Some(key)) = (self.landed.take(), &self.key) {
            fleet::finish_landed(*landed, key.clone(), what, response.clone());
        }
        let now = self.state.now();
        if let Some(store) = self.state.idempotency().as_mut() {
            match (self.ticket, &self.key) {
                (Some(t), _) => store.finish_ticket(t, what, response, now),
                (None, Some(key)) => store.finish(key, what, response, now),
                (None, None) => {}
            }
        }
        Ack::NONE
    }

    /// `max_response_bytes`: no more of a response is kept.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Starts keeping a response with `status` and `fields` (a block of
    /// `name: value\r\n` lines as the client gets them, weir's own fields
    /// and the framing left out). The body is appended to the same buffer,
    /// so a kept response is one allocation; `body_hint` is room to make
    /// for it at once (its length, when the head says).
    ///
    /// A response that sets a cookie is kept as not replayable
    /// (docs/reference/idempotency.md#idempotency-keys): a replay of it would
    /// either hand a session to whoever repeats the key or, without the
    /// `Set-Cookie`, not be the response the write got.
    pub(crate) fn capture(self, status: u16, mut fields: Vec<u8>, body_hint: u64) -> Capture {
        let fields_len = fields.len();
        let over = fields_len > self.limit || sets_cookie(&fields);
        if !over {
            let room = usize::try_from(body_hint).unwrap_or(usize::MAX);
            fields.reserve_exact(room.min(self.limit - fields_len));
        }
        let grpc = grpc_answer(&fields);
        Capture {
            over,
            status,
            fields_len,
            buf: fields,
            recorder: Some(self),
            grpc,
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if !self.done {
            // Nobody is left to hold a response for.
            let _ = self.write(Record::Uncertain, None);
        }
    }
}

/// Whether a field block is a gRPC answer's head, and its `grpc-status`
/// when the head has one (a trailers-only answer).
fn grpc_answer(fields: &[u8]) -> Option<Option<u8>> {
    let lines = || fields.split(|b| *b == b'\n');
    let value = |line: &[u8], name: &str| {
        let n = name.len();
        (line.len() > n + 1 && line[..n].eq_ignore_ascii_case(name.as_bytes()) && line[n] == b':')
            .then(|| line[n + 1..].trim_ascii().to_vec())
    };
    lines()
        .filter_map(|l| value(l, "content-type"))
        .any(|v| crate::proxy::request::grpc_content_type(&v))
        .then(|| {
            let status = lines().find_map(|l| value(l, "grpc-status"))?;
            std::str::from_utf8(&status).ok()?.parse().ok()
        })
}

/// Whether a block of `name: value\r\n` lines has a `Set-Cookie`.
fn sets_cookie(fields: &[u8]) -> bool {
    fields
        .split(|b| *b == b'\n')
        .any(|line| line.len() > 11 && line[..11].eq_ignore_ascii_case(b"set-cookie:"))
}

/// Whether a response field is kept with a stored response: not the
/// framing, which a replay restates, nor weir's own annotations.
pub(crate) fn kept(name: &[u8]) -> bool {
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    !(is("content-length")
        || is("transfer-encoding")
        || is("connection")
        || is("keep-alive")
        || is(REPLAYED_HEADER)
        || (name.len() >= 7 && name[..7].eq_ignore_ascii_case(b"x-weir-")))
}

/// A response being relayed to the client and kept, up to
/// `max_response_bytes`, for replays. Dropped before [`Capture::done`] (the
/// body broke off, the client left), the key is recorded as completed
/// without a response to replay: the upstream did answer.
#[derive(Debug)]
pub(crate) struct Capture {
    status: u16,
    /// The field block, then the body as it passes.
    buf: Vec<u8>,
    fields_len: usize,
    /// Past the limit, or not replayable for another reason (a cookie).
    over: bool,
    recorder: Option<Recorder>,
    /// A gRPC answer: `Some(status)` once its `grpc-status` is seen (in the
    /// head or the trailers). The status is its outcome, and what the
    /// record is judged by (docs/reference/idempotency.md#grpc).
    grpc: Option<Option<u8>>,
}

impl Capture {
    /// The next bytes of the body.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        if self.over {
            return;
        }
        let limit = self.recorder.as_ref().map_or(0, |r| r.limit);
        if self.buf.len() + bytes.len() > limit {
            self.spoil();
        } else {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The trailers: kept with the fields, so that a replay ends as the
    /// answer did (a gRPC call's status is in them).
    pub(crate) fn trailers(&mut self, t: &http::HeaderMap) {
        if let Some(g) = self.grpc.as_mut() {
            *g = crate::proxy::headers::grpc_status(t).or(*g);
        }
        if self.over {
            return;
        }
        let block = crate::policy::idempotency::trailer_block(
            t.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
        );
        let limit = self.recorder.as_ref().map_or(0, |r| r.limit);
        if self.buf.len() + block.len() > limit {
            return self.spoil();
        }
        let at = self.fields_len;
        self.buf.splice(at..at, block.iter().copied());
        self.fields_len += block.len();
    }

    /// The response cannot be replayed as it was (over the limit, a stream).
    pub(crate) fn spoil(&mut self) {
        self.over = true;
        self.buf = Vec::new();
    }

    /// The body as it came, chunked: replaced by its data, or spoiled when it
    /// carries trailers.
    pub(crate) fn dechunk(&mut self) {
        if self.over {
            return;
        }
        let (data, trailers) = crate::h1::chunk_data(&self.buf[self.fields_len..]);
        if trailers {
            self.spoil();
        } else {
            self.buf.truncate(self.fields_len);
            self.buf.extend_from_slice(&data);
        }
    }

    /// The whole body has been relayed (all but what waits for the
    /// [`Ack`]).
    pub(crate) fn done(mut self) -> Ack {
        self.end(true)
    }

    fn end(&mut self, whole: bool) -> Ack {
        let Some(recorder) = self.recorder.take() else {
            return Ack::NONE;
        };
        let replayable = whole && !self.over;
        let response = replayable.then(|| {
            StoredResponse::from_buffer(self.status, std::mem::take(&mut self.buf), self.fields_len)
        });
        let ending = match self.grpc {
            Some(Some(code)) => crate::policy::idempotency::grpc_ending(code, replayable),
            _ => Ending::Response {
                status: self.status,
                replayable,
            },
        };
        recorder.finish(ending, response)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.end(false);
    }
}

/// A keyed write's completed record on its way to the fleet's replicas
/// (docs/reference/fleet.md#records-replicated-before-they-are-relied-on):
/// the relay holds the response's last bytes until it resolves, so that a
/// client never has an answer whose record a failover could lose. Empty
/// (resolved at once) without `[state] wait_replicas`. The wait is bounded
/// by the finishing call's own `timeout` + `wait_timeout`.
#[derive(Debug)]
#[must_use = "the relay waits for the record before the last bytes go out"]
pub(crate) struct Ack(Option<tokio::task::JoinHandle<()>>);

impl Ack {
    pub(crate) const NONE: Ack = Ack(None);

    /// Resolves once the record was written and acknowledged, or given up.
    pub(crate) async fn wait(self) {
        if let Some(h) = self.0 {
            let _ = h.await;
        }
    }

    /// Whether there is anything to wait for.
    pub(crate) fn is_pending(&self) -> bool {
        self.0.is_some()
    }

    /// Polls it (a body's `poll_frame`): ready when resolved.
    pub(crate) fn poll_done(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        match self.0.as_mut() {
            None => std::task::Poll::Ready(()),
            Some(h) => {
                std::task::ready!(std::pin::Pin::new(h).poll(cx)).ok();
                self.0 = None;
                std::task::Poll::Ready(())
            }
        }
    }
}

/// The head and body of a replay: the stored status, fields and body, with
/// `Idempotent-Replayed: true` and (when the upstream annotates)
/// `x-weir-attempts: 0`. Fields that no longer parse are left out.
pub(crate) fn replay_parts(
    stored: &StoredResponse,
    annotate: bool,
) -> (http::response::Parts, Bytes) {
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = http::StatusCode::from_u16(stored.status).unwrap_or(http::StatusCode::OK);
    for (n, v) in stored.fields() {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(n),
            http::HeaderValue::from_bytes(v),
        ) {
            parts.headers.append(n, v);
        }
    }
    parts.headers.insert(
        http::HeaderName::from_static(REPLAYED_HEADER),
        http::HeaderValue::from_static("true"),
    );
    let none = super::attempt::Annotations {
        attempts: 0,
        stop: None,
        hedge: None,
    };
    super::attempt::annotate_response(&mut parts.headers, &mut parts.extensions, none, annotate);
    (parts, stored.body_bytes())
}

/// The fingerprint of a keyed request whose whole body weir holds (`chunked`:
/// as it came, chunked; its data is what counts).
pub(crate) fn fingerprint(method: &[u8], target: &[u8], body: &[u8], chunked: bool) -> Fingerprint {
    let mut h = crate::policy::idempotency::FingerprintHasher::new(method, target);
    if chunked {
        for c in crate::h1::Chunks::new(body) {
            h.update(c);
        }
    } else {
        h.update(body);
    }
    h.finish()
}

/// What a keyed request on the general path gets, from its body as
/// prepared for the attempts. A body weir holds is fingerprinted at once. A
/// body that streams (larger than `max_replay_body_bytes`) claims the key
/// first ([`IdempotencyStore::claim`]) and is fingerprinted as it passes to
/// the upstream; when the key is done, the body is read through for its
/// fingerprint (and not forwarded) to tell a replay from a reused key.
pub(crate) async fn begin_body(
    up: &Upstream,
    key: &str,
    method: &str,
    target: &str,
    body: &super::replay::RequestBody,
    deadline: tokio::time::Instant,
) -> Begun {
    use super::replay::RequestBody;
    let state = &up.state;
    let slot = match body {
        RequestBody::Buffered { data, .. } => {
            return begin(up, key, &Fingerprint::new(method, target, data)).await;
        }
        RequestBody::Streamed { slot, .. } => slot,
        RequestBody::Direct(..) => return Begun::Unrecorded,
    };
    let shared = match up.state.link() {
        Some(link) => match Box::pin(fleet::claim(up, link, key)).await {
            Ok(s) => s,
            Err(refused) => return Begun::Refused(refused),
        },
        None => None,
    };
    let (claim, forward) = match shared {
        Some((claim, Some((r, link)))) => (claim, Some((r, Some(link)))),
        Some((claim, None)) => (claim, None),
        None => {
            let now = state.now();
            let mut store = state.idempotency();
            let Some(store) = store.as_mut() else {
                return Begun::Unrecorded;
            };
            let limit = store.params().max_response_bytes;
            let claim = store.claim(key, now);
            let r =
                (claim == Claim::Forward).then(|| (Recorder::new(state, key, limit, None), None));
            (claim, r)
        }
    };
    let taken = slot.lock().ok().and_then(|mut b| b.take());
    let Some(streamed) = taken else {
        return Begun::Unrecorded;
    };
    let mut hasher = FingerprintHasher::new(method, target);
    match (claim, forward) {
        (Claim::Forward, Some((recorder, link))) => {
            let hashing = Hashing {
                inner: streamed,
                hasher: Some(hasher),
                state: state.clone(),
                link,
                key: key.into(),
            };
            if let Ok(mut b) = slot.lock() {
                *b = Some(super::body::boxed(hashing));
            }
            Begun::Forward(recorder)
        }
        (Claim::InFlight | Claim::Forward, _) => Begun::Refused(ProxyError::IdempotencyInFlight),
        (Claim::Decide, _) => {
            // Read through for the fingerprint; the body is not forwarded.
            let read = tokio::time::timeout_at(deadline, async {
                use http_body_util::BodyExt;
                let mut b = streamed;
                while let Some(frame) = b.frame().await {
                    let frame = frame.map_err(|e| {
                        ProxyError::BadRequest(format!("the request body could not be read: {e}"))
                    })?;
                    if let Some(d) = frame.data_ref() {
                        hasher.update(d);
                    }
                }
                Ok(hasher.finish())
            });
            let fingerprint = match read.await {
                Ok(Ok(fp)) => fp,
                Ok(Err(e)) => return Begun::Refused(e),
                Err(_) => return Begun::Refused(ProxyError::DeadlineExceeded),
            };
            match begin(up, key, &fingerprint).await {
                // The record went (expired, evicted) while the body was read,
                // and the body is spent: the client is to send it again.
                Begun::Forward(r) => {
                    let _ = r.finish(Ending::Failed, None);
                    Begun::Refused(ProxyError::IdempotencyInFlight)
                }
                other => other,
            }
        }
    }
}

/// A claimed request's body on its way to the upstream, fingerprinted as it
/// passes; the fingerprint goes to the store when the body ends whole.
struct Hashing {
    inner: super::body::Body,
    hasher: Option<FingerprintHasher>,
    state: Arc<UpstreamState>,
    /// When the record is on the fleet's Redis.
    link: Option<Arc<crate::state::link::Link>>,
    key: Box<str>,
}

impl http_body::Body for Hashing {
    type Data = Bytes;
    type Error = super::body::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, super::body::BoxError>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        let ended = match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let (Some(d), Some(h)) = (frame.data_ref(), self.hasher.as_mut()) {
                    h.update(d);
                }
                // A sender that knows the length stops polling at its end.
                self.inner.is_end_stream()
            }
            std::task::Poll::Ready(None) => true,
            _ => false,
        };
        if let Some(h) = self.hasher.take_if(|_| ended) {
            let fingerprint = h.finish();
            if let Some(link) = self.link.clone() {
                fleet::fingerprinted(link, self.key.clone(), fingerprint);
            } else if let Some(store) = self.state.idempotency().as_mut() {
                store.fingerprinted(&self.key, &fingerprint);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A replay as the general path sends it.
pub(crate) fn replay_response(
    stored: &StoredResponse,
    annotate: bool,
) -> http::Response<super::body::Body> {
    let (parts, body) = replay_parts(stored, annotate);
    if !stored.has_trailers() {
        return http::Response::from_parts(parts, super::body::full(body));
    }
    // Replayed whole: the messages, then the trailers they ended with.
    let mut trailers = http::HeaderMap::new();
    for (n, v) in stored.trailers() {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(n),
            http::HeaderValue::from_bytes(v),
        ) {
            trailers.append(n, v);
        }
    }
    let frames = vec![
        http_body::Frame::data(body),
        http_body::Frame::trailers(trailers),
    ];
    let body = super::body::ReadAhead::<super::body::Body>::new(frames, None);
    http::Response::from_parts(parts, super::body::boxed(body))
}

/// The fields of a response kept for replays (see [`kept`]), as a block.
pub(crate) fn kept_fields(h: &http::HeaderMap) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in h {
        if kept(n.as_str().as_bytes()) {
            crate::policy::idempotency::push_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
        }
    }
    block
}
