//! A response body read by weir's own HTTP/1.1 client ([`H1Body`]).

use super::{head, Broke, GiveBack, Sending};
use crate::h1::{ChunkStep, Chunked, Framing};
use crate::upstream::pool::UpstreamIo;
use crate::upstream::send::BoxError;
use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The most bytes one read of a body asks for.
const READ: usize = 16 * 1024;

/// The longest trailer section read (hyper's limit).
const TRAILERS_LIMIT: usize = 16 * 1024;

/// Where the body stands.
#[derive(Debug)]
enum Reading {
    /// This much is still to come, by `Content-Length`.
    Length(u64),
    Chunked(Chunked),
    /// After the last chunk: the trailer section.
    Trailers,
    /// Until the upstream closes.
    Close,
    Done,
}

/// A response body on one of weir's upstream connections: the bytes read
/// past the head, then the rest as it comes. Its connection goes back to
/// the pool when it ends cleanly; dropped before that, it is closed.
pub(crate) struct H1Body {
    io: Option<UpstreamIo>,
    buf: BytesMut,
    reading: Reading,
    /// The request's body, still being written beside the response's.
    sending: Option<Sending>,
    reusable: bool,
    back: GiveBack,
}

impl std::fmt::Debug for H1Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Body")
            .field("reading", &self.reading)
            .field("buffered", &self.buf.len())
            .finish_non_exhaustive()
    }
}

fn broken(why: &'static str) -> BoxError {
    Box::new(std::io::Error::other(why))
}

impl H1Body {
    pub(super) fn new(
        io: UpstreamIo,
        buf: BytesMut,
        framing: Framing,
        reusable: bool,
        sending: Option<Sending>,
        back: GiveBack,
    ) -> Self {
        let reading = match framing {
            Framing::Empty | Framing::Length(0) => Reading::Done,
            Framing::Length(n) => Reading::Length(n),
            Framing::Chunked => Reading::Chunked(Chunked::until_trailers()),
            Framing::Close => Reading::Close,
        };
        let mut body = H1Body {
            io: Some(io),
            buf,
            reading,
            sending,
            reusable,
            back,
        };
        if matches!(body.reading, Reading::Done) && body.sending.is_none() {
            // No body (HEAD, 204, 304, a length of 0): the connection goes
            // back now, as a server that never polls an ended body would
            // otherwise drop it.
            body.finish();
        }
        body
    }

    /// The body has ended: its connection goes back to the pool when it
    /// may carry another request (nothing read past the end, the request
    /// written whole), else it is closed.
    fn finish(&mut self) {
        self.reading = Reading::Done;
        let Some(io) = self.io.take() else { return };
        if self.reusable && self.buf.is_empty() && self.sending.is_none() {
            if let Some(pool) = self.back.pool.upgrade() {
                pool.put(
                    self.back.addr,
                    self.back.tag,
                    io,
                    tokio::time::Instant::now(),
                );
            }
        }
    }

    /// The body broke off (or its request did): its connection is closed,
    /// never pooled, and nothing more is read.
    fn broken(&mut self) {
        self.reusable = false;
        self.io = None;
        self.reading = Reading::Done;
    }

    /// The next frame from what is buffered; `None`: more must be read.
    fn next_frame(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        loop {
            match &mut self.reading {
                Reading::Done => return None,
                Reading::Length(left) => {
                    if self.buf.is_empty() {
                        return None;
                    }
                    let take = (*left).min(self.buf.len() as u64);
                    *left -= take;
                    let data = self.buf.split_to(take as usize).freeze();
                    if *left == 0 {
                        self.finish();
                    }
                    return Some(Ok(Frame::data(data)));
                }
                Reading::Chunked(c) => {
                    if self.buf.is_empty() {
                        return None;
                    }
                    match c.step(&self.buf) {
                        Ok(ChunkStep::Data { at, len }) => {
                            self.buf.advance(at);
                            return Some(Ok(Frame::data(self.buf.split_to(len).freeze())));
                        }
                        Ok(ChunkStep::More) => {
                            self.buf.clear();
                            return None;
                        }
                        Ok(ChunkStep::Ended(n)) => {
                            self.buf.advance(n);
                            self.reading = Reading::Trailers;
                        }
                        Err(why) => return Some(Err(broken(why))),
                    }
                }
                Reading::Trailers => match head::trailers(&self.buf) {
                    Ok(Some((n, fields))) => {
                        self.buf.advance(n);
                        self.finish();
                        if !fields.is_empty() {
                            return Some(Ok(Frame::trailers(fields)));
                        }
                        return None;
                    }
                    Ok(None) if self.buf.len() > TRAILERS_LIMIT => {
                        return Some(Err(broken("the upstream's trailer section is too large")));
                    }
                    Ok(None) => return None,
                    Err(why) => return Some(Err(broken(why))),
                },
                Reading::Close => {
                    if self.buf.is_empty() {
                        return None;
                    }
                    return Some(Ok(Frame::data(self.buf.split().freeze())));
                }
            }
        }
    }
}

impl HttpBody for H1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        // The request's body goes on beside the response's.
        if let (Some(s), Some(io)) = (this.sending.as_mut(), this.io.as_mut()) {
            match s.poll_send(io, cx) {
                Poll::Pending => {}
                Poll::Ready(Ok(())) => this.sending = None,
                Poll::Ready(Err(Broke::Body(e))) => {
                    // The client's body broke off: the upstream may be
                    // waiting for the rest before it says more, so the
                    // connection is closed and the response ends here, as
                    // hyper's client ends it.
                    this.sending = None;
                    this.broken();
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Err(Broke::Io(_))) => {
                    // The upstream stopped reading (it has answered): the
                    // rest of the request is not sent, and the connection
                    // is not used again.
                    this.sending = None;
                    this.reusable = false;
                }
            }
        }
        loop {
            if let Some(frame) = this.next_frame() {
                if frame.is_err() {
                    this.broken();
                }
                return Poll::Ready(Some(frame));
            }
            if matches!(this.reading, Reading::Done) {
                this.finish();
                return Poll::Ready(None);
            }
            let Some(io) = this.io.as_mut() else {
                return Poll::Ready(None);
            };
            let want = match this.reading {
                Reading::Length(left) => usize::try_from(left).unwrap_or(READ).clamp(512, READ),
                _ => READ,
            };
            if this.buf.capacity() - this.buf.len() < want.min(512) {
                this.buf.reserve(want);
            }
            match tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut this.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    if matches!(this.reading, Reading::Close) {
                        this.reusable = false;
                        this.finish();
                        return Poll::Ready(None);
                    }
                    this.broken();
                    let why = "the upstream closed the connection before the body's end";
                    return Poll::Ready(Some(Err(broken(why))));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.broken();
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.reading, Reading::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.reading {
            Reading::Done => SizeHint::with_exact(0),
            Reading::Length(left) => SizeHint::with_exact(left),
            _ => SizeHint::default(),
        }
    }
}
