//! Body types on both sides of the proxy, and the idle-timeout guard on
//! response bodies. Bodies are streamed frame by frame, never collected.

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

pub(crate) use crate::upstream::client::BoxError;

/// The body type weir hands to hyper, in both directions.
pub(crate) use crate::upstream::client::Body;

/// The upstream response body the general path relays: as it comes (no allocation), or with frames
/// read ahead for a gRPC status in its trailers.
pub(crate) type RelayedBody = http_body_util::Either<UpstreamBody, ReadAhead<UpstreamBody>>;

/// An upstream's response body as the upstream side hands it over.
pub(crate) use crate::upstream::body::UpstreamBody;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub(crate) fn empty() -> Body {
    full(Bytes::new())
}

/// Boxes any body whose error converts into a [`BoxError`].
pub(crate) fn boxed<B>(b: B) -> Body
where
    B: HttpBody<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    b.map_err(Into::into).boxed()
}

/// The error a body reports when its upstream stalls past `idle_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent no body data for {0:?} (idle_timeout)")]
pub(crate) struct IdleTimeoutError(pub Duration);

pin_project! {
    /// Fails the body when no frame arrives for `idle` — the bound on streaming
    /// after the response headers, where the request `timeout` no longer applies.
    pub struct IdleTimeout<B> {
        #[pin]
        inner: B,
        #[pin]
        sleep: tokio::time::Sleep,
        idle: Duration,
        // Held until the body ends: the request's concurrency slot.
        hold: Option<crate::state::gate::Slot>,
        progressed: bool,
    }
}

impl<B> IdleTimeout<B> {
    /// `first` is when the first gap would run out (the caller's clock
    /// reading plus `idle`: no clock read here).
    pub(crate) fn new(
        inner: B,
        first: tokio::time::Instant,
        idle: Duration,
        hold: Option<crate::state::gate::Slot>,
    ) -> Self {
        IdleTimeout {
            inner,
            sleep: tokio::time::sleep_until(first),
            idle,
            hold,
            progressed: false,
        }
    }
}

impl<B> HttpBody for IdleTimeout<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(f) => {
                if f.is_none() {
                    this.hold.take();
                }
                // The clock is read (and the timer moved) only when the body
                // has to wait: a body that arrives whole never touches either.
                *this.progressed = true;
                Poll::Ready(f.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                if std::mem::take(this.progressed) {
                    let deadline = tokio::time::Instant::now() + *this.idle;
                    this.sleep.as_mut().reset(deadline);
                }
                ready!(this.sleep.as_mut().poll(cx));
                Poll::Ready(Some(Err(Box::new(IdleTimeoutError(*this.idle)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// Frames read ahead (to look at trailers), then the rest of the body.
    #[derive(Debug)]
    pub struct ReadAhead<B> {
        frames: std::collections::VecDeque<Frame<Bytes>>,
        #[pin]
        rest: Option<B>,
    }
}

impl<B> ReadAhead<B> {
    pub(crate) fn new(frames: Vec<Frame<Bytes>>, rest: Option<B>) -> Self {
        ReadAhead {
            frames: frames.into(),
            rest,
        }
    }
}

impl<B> HttpBody for ReadAhead<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(f) = this.frames.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        match this.rest.as_pin_mut() {
            Some(rest) => rest
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.as_ref().map(|r| r.size_hint());
        ahead_and_rest(&self.frames, rest)
    }
}

/// The size of a body of which `ahead` was read and `rest` is still to
/// come: exact when the rest's is (and no trailers were read, which an
/// HTTP/1.1 peer can only take chunked), so a length the peer declared is
/// kept across the read-ahead.
pub(crate) fn ahead_and_rest<'a>(
    ahead: impl IntoIterator<Item = &'a Frame<Bytes>>,
    rest: Option<SizeHint>,
) -> SizeHint {
    let mut bytes = 0u64;
    let mut trailers = false;
    for f in ahead {
        match f.data_ref() {
            Some(d) => bytes += d.len() as u64,
            None => trailers |= f.is_trailers(),
        }
    }
    let rest = rest.unwrap_or_else(|| SizeHint::with_exact(0));
    let mut hint = SizeHint::new();
    hint.set_lower(bytes.saturating_add(rest.lower()));
    if let Some(upper) = rest.upper() {
        hint.set_upper(bytes.saturating_add(upper));
    }
    if trailers {
        // Keep the lower bound only: an exact length would mean no trailers.
        let mut open = SizeHint::new();
        open.set_lower(hint.lower());
        return open;
    }
    hint
}

pin_project! {
    /// The client's request body, its bytes counted for the access log as
    /// they pass. Unlike a `map_frame`, it keeps the body's size hint: a
    /// body whose length the client declared goes upstream with that
    /// `Content-Length` rather than chunked.
    pub struct Counted<B> {
        #[pin]
        inner: B,
        seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }
}

impl<B> Counted<B> {
    pub(crate) fn new(inner: B, seen: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Self {
        Counted { inner, seen }
    }
}

impl<B> HttpBody for Counted<B>
where
    B: HttpBody<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &polled {
            let n = f.data_ref().map_or(0, |d| d.len() as u64);
            this.seen.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
