//! The request body across attempts (docs/reference/retries.md#replaying-the-body).
//!
//! When a retry is possible at all (`max_attempts > 1`), a body of at most
//! `max_replay_body_bytes` is buffered once and replayed for each attempt.
//! A larger body, or one still unfinished at the limit, is streamed: it sits in
//! a shared slot that the first attempt to poll it takes, so after a connect
//! failure — which never polls the body — it is still there to send again.
//! With `max_attempts = 1` the client's body goes straight through, untouched.
//!
//! A request with `Expect: 100-continue` is not read ahead: its body waits
//! behind a [`ContinueGate`] until the upstream answers `100 Continue` (hyper
//! then sends the client its own 100, as it does when a body is first read),
//! so an upstream that refuses the request at once (401, 413) spares the
//! client the upload. Such a body is streamed, never buffered for a replay.

use super::body::{boxed, Body, BoxError};
use crate::policy::BodyFacts;
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How long a body waits for the upstream's `100 Continue` before it is sent
/// anyway: an upstream that ignores the expectation (HTTP/1.0, or one that
/// simply reads) must not stall the request (RFC 9110 §10.1.1). curl waits
/// the same 1 s.
pub(crate) const CONTINUE_WAIT: Duration = Duration::from_secs(1);

/// The client's request body, prepared for one or more attempts.
#[derive(Debug)]
pub(crate) enum RequestBody {
    /// No retry is possible: the client's body, for the one attempt, and its
    /// declared length.
    Direct(Option<Body>, Option<u64>),
    /// Buffered whole: replayed for every attempt.
    Buffered {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// Too large to buffer: streamed once; replayable only while untouched.
    Streamed {
        slot: Arc<Mutex<Option<Body>>>,
        len: Option<u64>,
    },
}

/// How long a body of unknown length may pause before it is treated as a
/// stream (see [`RequestBody::prepare`]). Above Linux's 40 ms delayed ACK, so
/// a client whose socket still uses Nagle's algorithm is not mistaken for a
/// stream; a streaming call that opens with a pause waits this long once.
const READ_AHEAD_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

/// Why a body could not be read ahead.
#[derive(Debug)]
pub(crate) enum Unread {
    /// It broke off, or was malformed.
    Broke(BoxError),
    /// The client sent none of the rest of it for `idle_timeout`
    /// (docs/reference/deadlines.md#uploads).
    Idle,
}

impl From<BoxError> for Unread {
    fn from(e: BoxError) -> Self {
        Unread::Broke(e)
    }
}

impl RequestBody {
    /// Reads up to `limit` bytes of `body` when a retry is possible, each
    /// gap at most `idle`. A body of unknown length is streamed rather than
    /// read ahead when `stream_unknown` (HTTP/2 and gRPC: it may be a
    /// stream the client keeps open while it waits for answers).
    pub(crate) async fn prepare(
        body: Body,
        retry_possible: bool,
        (limit, idle): (u64, std::time::Duration),
        stream_unknown: bool,
    ) -> Result<Self, Unread> {
        let hint = body.size_hint();
        if !retry_possible {
            let len = if body.is_end_stream() {
                Some(0)
            } else {
                hint.exact()
            };
            return Ok(RequestBody::Direct(Some(boxed(body)), len));
        }
        // A body of unknown length on HTTP/2 or gRPC may be a stream the
        // client keeps open while it waits for answers: read ahead only what
        // arrives without a pause (a unary call's message and end of stream
        // come together), then stream the rest.
        let grace = (hint.exact().is_none() && stream_unknown).then_some(READ_AHEAD_GRACE);
        if hint.exact() == Some(0) && body.is_end_stream() {
            return Ok(RequestBody::Buffered {
                data: Bytes::new(),
                trailers: None,
            });
        }
        if hint.lower() > limit {
            // Declared larger than the replay buffer: do not read any of it.
            return Ok(RequestBody::streamed(boxed(body), hint.exact()));
        }
        let mut body = body;
        let mut chunks: VecDeque<Bytes> = VecDeque::new();
        let mut total: u64 = 0;
        loop {
            let next = match grace {
                Some(g) => match tokio::time::timeout(g, body.frame()).await {
                    Ok(f) => f,
                    Err(_) => {
                        let rest = Prefixed::new(chunks, None, body);
                        return Ok(RequestBody::streamed(boxed(rest), None));
                    }
                },
                None => match tokio::time::timeout(idle, body.frame()).await {
                    Ok(f) => f,
                    Err(_) => return Err(Unread::Idle),
                },
            };
            let Some(frame) = next else { break };
            let frame = frame?;
            match frame.into_data() {
                Ok(data) => {
                    total += data.len() as u64;
                    chunks.push_back(data);
                    if total > limit {
                        let rest = Prefixed::new(chunks, None, body);
                        return Ok(RequestBody::streamed(boxed(rest), hint.exact()));
                    }
                }
                Err(frame) => {
                    let trailers = frame.into_trailers().ok();
                    return Ok(RequestBody::Buffered {
                        data: concat(chunks, total),
                        trailers,
                    });
                }
            }
        }
        Ok(RequestBody::Buffered {
            data: concat(chunks, total),
            trailers: None,
        })
    }

    /// The body of an `Expect: 100-continue` request: held behind `gate`
    /// for every attempt, never read ahead (see the module docs).
    pub(crate) fn gated(body: Body, gate: Arc<ContinueGate>, retry_possible: bool) -> Self {
        let len = body.size_hint().exact();
        let gated = boxed(Gated {
            gate,
            inner: body,
            timer: None,
        });
        if retry_possible {
            RequestBody::streamed(gated, len)
        } else {
            RequestBody::Direct(Some(gated), len)
        }
    }

    fn streamed(body: Body, len: Option<u64>) -> Self {
        RequestBody::Streamed {
            slot: Arc::new(Mutex::new(Some(body))),
            len,
        }
    }

    /// The body for the next attempt.
    pub(crate) fn for_attempt(&mut self) -> Body {
        match self {
            RequestBody::Direct(b, _) => b.take().unwrap_or_else(super::body::empty),
            RequestBody::Buffered { data, trailers } => boxed(Replay {
                data: Some(data.clone()).filter(|d| !d.is_empty()),
                trailers: trailers.clone(),
            }),
            RequestBody::Streamed { slot, .. } => boxed(TakingBody {
                slot: slot.clone(),
                body: None,
            }),
        }
    }

    /// What the retry decision needs to know about it.
    pub(crate) fn facts(&self) -> BodyFacts {
        match self {
            // Nothing is kept for a replay; describe it as it is, so a stop is
            // reported as `attempts` rather than `body` where that is the truth.
            RequestBody::Direct(_, Some(0)) => BodyFacts::Empty,
            RequestBody::Direct(_, len) => BodyFacts::Streamed {
                len: *len,
                bytes_read: true,
            },
            RequestBody::Buffered { data, .. } if data.is_empty() => BodyFacts::Empty,
            RequestBody::Buffered { data, .. } => BodyFacts::Buffered {
                len: data.len() as u64,
            },
            RequestBody::Streamed { slot, len } => BodyFacts::Streamed {
                len: *len,
                bytes_read: slot.lock().map(|s| s.is_none()).unwrap_or(true),
            },
        }
    }
}

fn concat(mut chunks: VecDeque<Bytes>, total: u64) -> Bytes {
    if chunks.len() == 1 {
        return chunks.pop_front().unwrap_or_default();
    }
    let mut v = Vec::with_capacity(total as usize);
    for c in chunks {
        v.extend_from_slice(&c);
    }
    Bytes::from(v)
}

/// A buffered body, replayed.
#[derive(Debug)]
struct Replay {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl HttpBody for Replay {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
    fn size_hint(&self) -> SizeHint {
        let len = self.data.as_ref().map_or(0, |d| d.len() as u64);
        if self.trailers.is_some() {
            // Trailers need chunked framing on HTTP/1.1: no exact length.
            let mut h = SizeHint::new();
            h.set_lower(len);
            h
        } else {
            SizeHint::with_exact(len)
        }
    }
}

/// Frames already read from a body (deciding it was too large to hold, or
/// whether a response may be cached), then the rest of it.
#[derive(Debug)]
pub(crate) struct Prefixed {
    prefix: VecDeque<Frame<Bytes>>,
    rest: Option<Body>,
}

impl Prefixed {
    /// `data`, then `trailers` (when one was read), then `rest`.
    pub(crate) fn new(
        data: impl IntoIterator<Item = Bytes>,
        trailers: Option<Frame<Bytes>>,
        rest: Body,
    ) -> Self {
        let mut prefix: VecDeque<Frame<Bytes>> = data.into_iter().map(Frame::data).collect();
        prefix.extend(trailers);
        Prefixed {
            prefix,
            rest: Some(rest),
        }
    }
}

impl HttpBody for Prefixed {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(f) = self.prefix.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }
    fn is_end_stream(&self) -> bool {
        self.prefix.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }
    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.as_ref().map(|r| r.size_hint());
        super::body::ahead_and_rest(&self.prefix, rest)
    }
}

/// Takes the streamed body out of its slot on first poll: from then on it is
/// spent, and the decision core is told so.
struct TakingBody {
    slot: Arc<Mutex<Option<Body>>>,
    body: Option<Body>,
}

impl HttpBody for TakingBody {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.body.is_none() {
            let taken = self.slot.lock().ok().and_then(|mut s| s.take());
            match taken {
                Some(b) => self.body = Some(b),
                None => {
                    return Poll::Ready(Some(Err(
                        "the request body was already sent and cannot be replayed".into(),
                    )))
                }
            }
        }
        match self.body.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }
    fn size_hint(&self) -> SizeHint {
        match (&self.body, self.slot.lock().ok().as_deref()) {
            (Some(b), _) => b.size_hint(),
            (None, Some(Some(b))) => b.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

/// Opened by the upstream's `100 Continue` (hyper's informational callback on
/// the upstream request), or by [`CONTINUE_WAIT`] passing.
#[derive(Debug, Default)]
pub(crate) struct ContinueGate {
    open: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl ContinueGate {
    /// Lets the body through.
    pub(crate) fn open(&self) {
        self.open.store(true, Ordering::Release);
        if let Some(w) = self.waker.lock().ok().and_then(|mut w| w.take()) {
            w.wake();
        }
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }
}

/// The client's body, read only once its gate is open.
struct Gated {
    gate: Arc<ContinueGate>,
    inner: Body,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl HttpBody for Gated {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if !self.gate.is_open() {
            if let Ok(mut w) = self.gate.waker.lock() {
                *w = Some(cx.waker().clone());
            }
            // Checked again after registering, so an open in between is seen.
            if !self.gate.is_open() {
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(CONTINUE_WAIT)));
                if std::future::Future::poll(timer.as_mut(), cx).is_pending() {
                    return Poll::Pending;
                }
                self.gate.open();
            }
        }
        Pin::new(&mut self.inner).poll_frame(cx).map_err(Into::into)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
