//! A keyed write on the general path outlives its client without a task of its
//! own (docs/reference/idempotency.md#idempotency-keys): its exchange runs in
//! the request's future and its response body is kept as it is relayed. Only
//! when hyper drops either of them before its end (the client left) does
//! what is left of it move to a task, which goes on within the request's
//! deadline and reads the response to its end, so that a re-send is answered
//! from the record instead of reaching the upstream again.

use super::{Ack, Capture};
use crate::proxy::body::{self, Body, BoxError};
use crate::proxy::error::ProxyError;
use bytes::Bytes;
use http_body::Body as _;
use http_body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// What an exchange gives (`proxy::general::exchange`, a keyed write's or any
/// other): the response, and the keeping of its body when it is to be
/// recorded.
pub(crate) type Forwarded = Result<(http::Response<Body>, Option<Capture>), ProxyError>;

/// Runs a keyed write's exchange in the caller's future; see [`Detach`].
pub(crate) fn detach<F>(exchange: F) -> Detach<F>
where
    F: Future<Output = Forwarded> + Send + 'static,
{
    Detach {
        exchange: Some(Box::pin(exchange)),
    }
}

/// A keyed write's exchange that, dropped before it ends, is finished in a
/// task: its attempts go on and its response is read to the end and kept.
pub(crate) struct Detach<F: Future<Output = Forwarded> + Send + 'static> {
    exchange: Option<Pin<Box<F>>>,
}

impl<F: Future<Output = Forwarded> + Send + 'static> Future for Detach<F> {
    type Output = Forwarded;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Forwarded> {
        let Some(exchange) = self.exchange.as_mut() else {
            return Poll::Ready(Err(ProxyError::UpstreamReset(
                "the request's exchange was polled after it ended".into(),
            )));
        };
        let out = ready!(exchange.as_mut().poll(cx));
        self.exchange = None;
        Poll::Ready(out)
    }
}

impl<F: Future<Output = Forwarded> + Send + 'static> Drop for Detach<F> {
    fn drop(&mut self) {
        let Some(exchange) = self.exchange.take() else {
            return;
        };
        spawn(async move {
            if let Ok((resp, Some(capture))) = exchange.await {
                read_on(resp.into_body(), capture).await;
            }
        });
    }
}

/// The response of a keyed write, kept as it is relayed.
/// `h1_client`: the client speaks HTTP/1.x, so a body with a
/// `Content-Length` is whole, for it and for the record, once that many
/// bytes have passed (hyper reads no further).
pub(crate) async fn recorded(
    resp: http::Response<Body>,
    capture: Capture,
    h1_client: bool,
) -> http::Response<Body> {
    // No body to wait for: the record is complete before the head goes out
    // (hyper never reads a frame of it, and a repeat sent the instant the
    // client has it must find it completed — and, with `wait_replicas`,
    // acknowledged).
    if resp.body().is_end_stream() {
        capture.done().wait().await;
        return resp;
    }
    let (head, body) = resp.into_parts();
    let left = head
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| crate::h1::content_length(v.as_bytes()))
        .filter(|_| h1_client);
    let mut kept = RecordingBody {
        body,
        capture: Some(capture),
        left,
        held: None,
    };
    if left == Some(0) {
        kept.ended().wait().await;
    }
    http::Response::from_parts(head, body::boxed(kept))
}

/// A response body that keeps what passes ([`Capture`]) and, dropped before
/// its end, is read on to the end in a task.
struct RecordingBody {
    body: Body,
    /// `None` once the body has ended or broken off.
    capture: Option<Capture>,
    /// What an HTTP/1.x client still takes of a `Content-Length` body.
    /// At 0 the record is completed: hyper writes no more and drops the
    /// body without waiting for the upstream to say it ended.
    left: Option<u64>,
    /// The last frame (`None`: the end), held until the record is
    /// acknowledged by the fleet's replicas (`[state] wait_replicas`).
    held: Option<(Option<Frame<Bytes>>, Ack)>,
}

impl RecordingBody {
    /// The body ended whole: the keeping is done.
    fn ended(&mut self) -> Ack {
        match self.capture.take() {
            Some(c) => c.done(),
            None => Ack::NONE,
        }
    }
}

impl http_body::Body for RecordingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some((_, ack)) = this.held.as_mut() {
            ready!(ack.poll_done(cx));
            let (frame, _) = this.held.take().unzip();
            return Poll::Ready(frame.flatten().map(Ok));
        }
        match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(c) = this.capture.as_mut() {
                    keep(c, &frame);
                }
                if let (Some(l), Some(d)) = (this.left.as_mut(), frame.data_ref()) {
                    *l = l.saturating_sub(d.len() as u64);
                }
                // hyper stops polling a body that says it has ended (or,
                // to an HTTP/1.x client, whose length it has written): its
                // last frame ends the keeping.
                if this.body.is_end_stream() || this.left == Some(0) {
                    let ack = this.ended();
                    if ack.is_pending() {
                        this.held = Some((Some(frame), ack));
                        return self.poll_frame(cx);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                // Broke off: completed, with nothing to replay.
                this.capture = None;
                Poll::Ready(Some(Err(e)))
            }
            None => {
                let ack = this.ended();
                if ack.is_pending() {
                    this.held = Some((None, ack));
                    return self.poll_frame(cx);
                }
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for RecordingBody {
    fn drop(&mut self) {
        let Some(capture) = self.capture.take() else {
            return;
        };
        if self.body.is_end_stream() {
            // Nobody is left to hold the answer for.
            let _ = capture.done();
            return;
        }
        let body = std::mem::replace(&mut self.body, body::empty());
        spawn(read_on(body, capture));
    }
}

/// Keeps one frame: its data, or its trailers.
fn keep(capture: &mut Capture, frame: &Frame<Bytes>) {
    if let Some(d) = frame.data_ref() {
        capture.push(d);
    } else if let Some(t) = frame.trailers_ref() {
        capture.trailers(t);
    }
}

/// Reads a response whose client has gone on to its end (each wait bounded
/// by the body's own idle timeout), keeping it.
async fn read_on(mut body: Body, mut capture: Capture) {
    use http_body_util::BodyExt;
    loop {
        match body.frame().await {
            Some(Ok(frame)) => keep(&mut capture, &frame),
            // Broke off: completed, with nothing to replay.
            Some(Err(_)) => return,
            None => {
                let _ = capture.done();
                return;
            }
        }
    }
}

/// What is left of a keyed write goes on in a task; without a runtime
/// (weir is stopping) it is dropped, and the key's record ends as a
/// completed write without a response to replay.
fn spawn(rest: impl Future<Output = ()> + Send + 'static) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(rest);
    }
}
