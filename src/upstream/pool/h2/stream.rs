//! One request's stream on an HTTP/2 connection of the pool, on the `h2`
//! crate directly: the request's body sent as the peer's flow control
//! allows ([`Pump`]), and the response's body read with the window given
//! back as it is consumed ([`H2Body`]).

use super::OpenStream;
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
    /// Once the response head has arrived: what its body tells when it
    /// ends (`true`: read whole; closed unsent: dropped before its end).
    answered: Option<tokio::sync::oneshot::Receiver<bool>>,
}

impl Pump {
    pub(super) fn new(stream: h2::SendStream<Bytes>, body: Body) -> Self {
        Pump {
            stream,
            body,
            answered: None,
        }
    }

    /// The rest of the request body, sent from a task of its own after the
    /// response head arrived, for no longer than the response lasts: when
    /// the response has ended (whole: `NO_ERROR`, as RFC 9113 §8.1 lets a
    /// complete exchange end) or was dropped (the client left: `CANCEL`),
    /// the stream is reset and the pump ends, though the upstream never
    /// opened its window again. `open` counts the stream on its connection
    /// until both have ended.
    pub(super) async fn until_answered(
        mut self,
        answered: tokio::sync::oneshot::Receiver<bool>,
        open: OpenStream,
    ) {
        self.answered = Some(answered);
        std::future::poll_fn(|cx| Pin::new(&mut self).poll(cx)).await;
        // The body has gone out whole (or failed) while the response goes
        // on: the stream stays counted until the response ends too.
        if let Some(rx) = self.answered.take() {
            let _ = rx.await;
        }
        drop(open);
    }
}

impl Future for Pump {
    type Output = bool;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let Pump {
            stream,
            body,
            answered,
        } = &mut *self;
        if let Some(rx) = answered {
            if let Poll::Ready(whole) = Pin::new(rx).poll(cx) {
                *answered = None;
                let reason = match whole {
                    Ok(true) => h2::Reason::NO_ERROR,
                    _ => h2::Reason::CANCEL,
                };
                stream.send_reset(reason);
                return Poll::Ready(false);
            }
        }
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
                            // A field h2 refuses would reset the stream.
                            let _ = stream.send_trailers(crate::h1::filter_trailers(t));
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
    /// What ends with the response: its stream's count on the connection,
    /// or word to the pump still sending the request body.
    end: End,
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

/// What a response body lets go of when it ends (read whole, failed, or
/// dropped).
pub(super) enum End {
    /// The stream's count on its connection (the request body has gone).
    Hold {
        _open: OpenStream,
    },
    /// The pump still sending the request body: told `true` when the
    /// response was read whole, and by the sender's drop otherwise.
    Tell(tokio::sync::oneshot::Sender<bool>),
    Gone,
}

impl H2Body {
    pub(super) fn new(recv: h2::RecvStream, content_length: Option<u64>, end: End) -> Self {
        let done = recv.is_end_stream();
        let mut body = H2Body {
            recv,
            end,
            data_done: done,
            done,
            left: content_length,
        };
        if done {
            body.ended(true);
        }
        body
    }

    /// The response has ended: whole, or not.
    fn ended(&mut self, whole: bool) {
        if let End::Tell(tell) = std::mem::replace(&mut self.end, End::Gone) {
            let _ = tell.send(whole);
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
                    this.ended(false);
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                None => this.data_done = true,
            }
        }
        let t = ready!(this.recv.poll_trailers(cx));
        this.done = true;
        this.ended(t.is_ok());
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
