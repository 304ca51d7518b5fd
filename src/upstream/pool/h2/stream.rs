//! One request's stream on an HTTP/2 connection of the pool, on the `h2`
//! crate directly: the request's body sent as the peer's flow control
//! allows ([`Pump`]), and the response's body read with the window given
//! back as it is consumed ([`H2Body`]).

use crate::upstream::send::{Body, BoxError};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// A request body on its way to the upstream's stream: each frame sent
/// once the stream has some send window (the `h2` crate buffers the rest,
/// bounded by its send buffer), trailers last; a body that fails resets
/// the stream (`CANCEL`), and a stream the peer resets ends it. Its output
/// says whether the client's body failed (the attempt's failure is then
/// the client's, not the upstream's).
pub(super) struct Pump {
    stream: h2::SendStream<Bytes>,
    body: Body,
}

impl Pump {
    pub(super) fn new(stream: h2::SendStream<Bytes>, body: Body) -> Self {
        Pump { stream, body }
    }
}

impl Future for Pump {
    type Output = bool;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let Pump { stream, body } = &mut *self;
        loop {
            // Some window first, so that a body faster than the upstream
            // waits here instead of filling h2's buffer.
            stream.reserve_capacity(1);
            if stream.capacity() == 0 {
                loop {
                    match stream.poll_capacity(cx) {
                        Poll::Ready(Some(Ok(0))) => {}
                        Poll::Ready(Some(Ok(_))) => break,
                        Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(false),
                        Poll::Pending => {
                            // The peer may reset the stream meanwhile.
                            return match stream.poll_reset(cx) {
                                Poll::Ready(_) => Poll::Ready(false),
                                Poll::Pending => Poll::Pending,
                            };
                        }
                    }
                }
            }
            let frame = match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(f) => f,
                Poll::Pending => {
                    stream.reserve_capacity(0);
                    return match stream.poll_reset(cx) {
                        Poll::Ready(_) => Poll::Ready(false),
                        Poll::Pending => Poll::Pending,
                    };
                }
            };
            match frame {
                None => {
                    let _ = stream.send_data(Bytes::new(), true);
                    return Poll::Ready(false);
                }
                Some(Err(_)) => {
                    stream.send_reset(h2::Reason::CANCEL);
                    return Poll::Ready(true);
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let end = body.is_end_stream();
                        if stream.send_data(data, end).is_err() || end {
                            return Poll::Ready(false);
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            let _ = stream.send_trailers(t);
                        }
                        return Poll::Ready(false);
                    }
                },
            }
        }
    }
}

/// A response body on an HTTP/2 stream: its data as it comes, the
/// connection's and the stream's window given back as each frame is
/// handed on, then its trailers.
pub struct H2Body {
    recv: h2::RecvStream,
    /// The data has ended; trailers (if any) are next.
    data_done: bool,
    done: bool,
    /// What is left of the `Content-Length` the upstream declared.
    left: Option<u64>,
}

impl std::fmt::Debug for H2Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Body")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl H2Body {
    pub(super) fn new(recv: h2::RecvStream, content_length: Option<u64>) -> Self {
        let done = recv.is_end_stream();
        H2Body {
            recv,
            data_done: done,
            done,
            left: content_length,
        }
    }
}

impl HttpBody for H2Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    if let Some(left) = &mut this.left {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                None => this.data_done = true,
            }
        }
        let t = ready!(this.recv.poll_trailers(cx));
        this.done = true;
        match t {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(Box::new(e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.is_end_stream() {
            return SizeHint::with_exact(0);
        }
        match self.left {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
