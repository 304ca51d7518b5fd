//! weir's own HTTP/1.1 client, over the worker's pooled connections
//! (docs/reference/endpoints.md#connections): the general path's requests
//! from HTTP/2 clients to an upstream spoken to in HTTP/1.1 take it, as the
//! fast path's take its exchange, with no task, channel or buffers of
//! hyper's per request.
//!
//! One request is one exchange on a connection checked out of `pool::h1`:
//! the head written from the request's parts and its body frame by frame
//! (by its `Content-Length`, else chunked; frames ready together go out in
//! one write), raced against the response head, which may come first (an
//! early `413`): then the body goes on being written beside the response's
//! as long as the upstream reads it. The response body ([`H1Body`]) is read
//! as it comes — by length, chunked with its trailers, or to the close —
//! and the connection goes back to the pool when it has ended cleanly, the
//! request was written whole, and neither side said `close`.
//!
//! Failures are classified as hyper's are ([`crate::upstream::send`]):
//! nothing written is `NotSent`, a connection that broke after is `Reset`,
//! a garbled head `BadResponse`, the client's own body failing
//! `ClientBody`.
//!
//! **Which writer of HTTP/1.1 a request to an upstream takes** (the same
//! table is in docs/reference/endpoints.md#connections). All three write on
//! a connection from the one checkout (`upstream::checkout`), dialled by the
//! one dialler (`pool::open`):
//!
//! | request | writer | why this one |
//! |---|---|---|
//! | from an HTTP/1.1 client on the fast path (body held, no upgrade, no `Expect`) | the fast path's own (`proxy::fast::transport`: the client's head rewritten buffer to buffer) | no header map, task or channel per request; the client's bytes go out as they came |
//! | from an HTTP/2 client (the general path), no upgrade, no `Expect` | this module | no task, channel or buffers of hyper's per request; HTTP/2 field names are lower case, so nothing of their case is lost |
//! | from an HTTP/1.1 client on the general path (a large or chunked body, or one handed over) | hyper's client over a lease (`pool::lease::H1Lease`) | hyper keeps the field names' case the client sent, which only its own client writes back |
//! | an upgrade (WebSocket, `CONNECT` over HTTP/1.1) | hyper's client, on a connection of its own | the connection becomes the client's |
//! | with `Expect: 100-continue` | hyper's client over a lease | hyper's interim-response callback opens the body's gate |

mod body;
mod head;

pub(crate) use body::H1Body;

use super::pool::{H1Pool, UpstreamIo};
use super::send::{Body, BoxError, Failure, SendError, MAX_INTERIM_RESPONSES, MAX_RESPONSE_HEAD};
use crate::upstream::Address;
use bytes::{Buf, BytesMut};
use http::{Method, Request, Response};
use http_body::Body as _;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{ready, Context, Poll};
use tokio::io::AsyncWrite;

/// Marks a request for weir's own HTTP/1.1 client (set by the request side
/// on a request it may take; see the module's notes for the rest).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnHttp1;

/// Where a connection goes back when its exchange has ended cleanly.
#[derive(Debug)]
pub(crate) struct GiveBack {
    pub pool: Weak<H1Pool>,
    pub addr: Address,
    /// Its TLS (`FastTls::tag`; 0: cleartext): the pool's key with `addr`.
    pub tag: u64,
}

/// Bytes of request body gathered from frames that are ready together
/// before they are written.
const GATHER: usize = 64 * 1024;

/// The first read's room for a response head (it grows for a larger one).
const HEAD_ROOM: usize = 4 * 1024;

/// How the request's body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// No body.
    Empty,
    /// This much is still to come, by `Content-Length`.
    Length(u64),
    Chunked,
}

/// How the write of a request failed.
#[derive(Debug)]
enum Broke {
    /// The client's body failed (it went away mid-upload, or sent more or
    /// less than its `Content-Length`).
    Body(BoxError),
    /// The connection failed.
    Io(std::io::Error),
}

/// A request on its way out: the bytes encoded and not yet written, and
/// the body frames still to come.
pub(super) struct Sending {
    body: Option<Body>,
    out: Vec<u8>,
    at: usize,
    framing: Out,
    /// Bytes written on the connection so far.
    written: u64,
    flushed: bool,
}

impl Sending {
    /// The request's head encoded (origin-form target and `Host` already
    /// set), its framing restated: the client's `Content-Length` kept, else
    /// the body's known length, else chunked
    /// (docs/reference/protocols.md#framing).
    fn new(parts: &http::request::Parts, body: Body) -> Sending {
        use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| crate::h1::content_length(v.as_bytes()));
        let chunked = parts.headers.contains_key(TRANSFER_ENCODING);
        let hint = body.size_hint().exact();
        let mut out = Vec::with_capacity(512);
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let _ = write!(out, "{} {target} HTTP/1.1\r\n", parts.method);
        let mut cookies = 0;
        for (name, value) in &parts.headers {
            // A `Content-Length` that does not parse is not passed on: the
            // body is framed by what weir knows of it.
            if name == CONTENT_LENGTH && (declared.is_none() || chunked) {
                continue;
            }
            if name == http::header::COOKIE {
                cookies += 1;
                continue;
            }
            field(&mut out, name, value);
        }
        // An HTTP/2 client may split its cookies into several fields; HTTP/1.1
        // takes them as one, joined by "; " (RFC 9113 §8.2.3).
        if cookies > 0 {
            out.extend_from_slice(b"cookie: ");
            for (i, v) in parts
                .headers
                .get_all(http::header::COOKIE)
                .iter()
                .enumerate()
            {
                if i > 0 {
                    out.extend_from_slice(b"; ");
                }
                out.extend_from_slice(v.as_bytes());
            }
            out.extend_from_slice(b"\r\n");
        }
        let framing = match (chunked, declared, hint) {
            (true, _, _) => Out::Chunked,
            (false, Some(n), _) => Out::Length(n),
            (false, None, Some(n)) => {
                // RFC 9110 §8.6: a method that gives content a meaning says
                // its length, even when it is none.
                let says = matches!(parts.method, Method::POST | Method::PUT | Method::PATCH);
                if n > 0 || says {
                    let _ = write!(out, "content-length: {n}\r\n");
                }
                Out::Length(n)
            }
            (false, None, None) if body.is_end_stream() => Out::Empty,
            (false, None, None) => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Out::Chunked
            }
        };
        out.extend_from_slice(b"\r\n");
        let body = (framing != Out::Empty && framing != Out::Length(0)).then_some(body);
        Sending {
            body,
            out,
            at: 0,
            framing,
            written: 0,
            flushed: false,
        }
    }

    /// Writes what it can without waiting: `Ready(Ok)` once the request is
    /// written whole and flushed.
    fn poll_send(&mut self, io: &mut UpstreamIo, cx: &mut Context<'_>) -> Poll<Result<(), Broke>> {
        loop {
            // Frames ready now go behind what waits to be written.
            while self.out.len() - self.at < GATHER {
                let Some(body) = self.body.as_mut() else {
                    break;
                };
                match Pin::new(body).poll_frame(cx) {
                    Poll::Pending => break,
                    Poll::Ready(None) => self.end()?,
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(Broke::Body(e))),
                    Poll::Ready(Some(Ok(frame))) => self.encode(frame)?,
                }
            }
            if self.at < self.out.len() {
                match Pin::new(&mut *io).poll_write(cx, &self.out[self.at..]) {
                    Poll::Ready(Ok(0)) => {
                        let e = std::io::Error::from(std::io::ErrorKind::WriteZero);
                        return Poll::Ready(Err(Broke::Io(e)));
                    }
                    Poll::Ready(Ok(n)) => {
                        self.at += n;
                        self.written += n as u64;
                        self.flushed = false;
                        if self.at == self.out.len() {
                            self.out.clear();
                            self.at = 0;
                        }
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(Broke::Io(e))),
                    Poll::Pending => return Poll::Pending,
                }
            }
            // All written: flushed (TLS holds records) before waiting on
            // the body, or at the end.
            if !self.flushed {
                ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(Broke::Io)?;
                self.flushed = true;
            }
            return match self.body {
                None => Poll::Ready(Ok(())),
                Some(_) => Poll::Pending,
            };
        }
    }

    fn encode(&mut self, frame: http_body::Frame<bytes::Bytes>) -> Result<(), Broke> {
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) => match self.framing {
                Out::Length(left) => {
                    let n = data.len() as u64;
                    if n > left {
                        return Err(Broke::Body(
                            "the request body is longer than its Content-Length".into(),
                        ));
                    }
                    self.framing = Out::Length(left - n);
                    self.out.extend_from_slice(&data);
                }
                Out::Chunked => {
                    let _ = write!(self.out, "{:x}\r\n", data.len());
                    self.out.extend_from_slice(&data);
                    self.out.extend_from_slice(b"\r\n");
                }
                Out::Empty => {}
            },
            Err(frame) => {
                // Trailers end the body; only the chunked coding carries them.
                if let (Ok(t), Out::Chunked) = (frame.into_trailers(), self.framing) {
                    self.out.extend_from_slice(b"0\r\n");
                    for (name, value) in t
                        .iter()
                        .filter(|(n, _)| crate::h1::allowed_in_trailers(n.as_str()))
                    {
                        field(&mut self.out, name, value);
                    }
                    self.out.extend_from_slice(b"\r\n");
                    self.body = None;
                    self.framing = Out::Empty;
                }
            }
        }
        Ok(())
    }

    fn end(&mut self) -> Result<(), Broke> {
        self.body = None;
        match self.framing {
            Out::Chunked => self.out.extend_from_slice(b"0\r\n\r\n"),
            Out::Length(0) | Out::Empty => {}
            Out::Length(_) => {
                return Err(Broke::Body(
                    "the request body ended short of its Content-Length".into(),
                ))
            }
        }
        self.framing = Out::Empty;
        Ok(())
    }
}

/// Writes one field line, `name: value`.
fn field(out: &mut Vec<u8>, name: &http::HeaderName, value: &http::HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Sends `req` on `io` (a connection to `back.addr`, checked out or new)
/// and reads the response head; the response's body reads the rest and
/// gives the connection back.
pub(crate) async fn send(
    mut io: UpstreamIo,
    back: GiveBack,
    req: Request<Body>,
) -> Result<Response<H1Body>, SendError> {
    let (parts, body) = req.into_parts();
    let is_head = parts.method == Method::HEAD;
    let mut sending = Some(Sending::new(&parts, body));
    drop(parts);
    let mut buf = BytesMut::with_capacity(HEAD_ROOM);
    let mut interims = 0u32;
    let mut written = 0u64;
    // How the write failed, when it did: said if the read fails too.
    let mut broke: Option<std::io::Error> = None;
    let head = std::future::poll_fn(|cx| {
        if let Some(s) = sending.as_mut() {
            match s.poll_send(&mut io, cx) {
                Poll::Pending => {}
                Poll::Ready(Ok(())) => {
                    written = s.written;
                    sending = None;
                }
                Poll::Ready(Err(Broke::Body(e))) => {
                    let why = format!("the client's request body failed: {e}");
                    return Poll::Ready(Err(SendError::new(Failure::ClientBody, why)));
                }
                // The upstream may have answered and closed its side: what
                // it said is read below, and the read tells how it ended.
                Poll::Ready(Err(Broke::Io(e))) => {
                    written = s.written;
                    sending = None;
                    broke = Some(e);
                }
            }
        }
        let written = sending.as_ref().map_or(written, |s| s.written);
        loop {
            match head::parse(&buf, is_head) {
                Ok(Some(head::UpstreamHead::Interim(n))) => {
                    buf.advance(n);
                    interims += 1;
                    if interims > MAX_INTERIM_RESPONSES {
                        let why = super::send::INTERIM_FLOOD;
                        return Poll::Ready(Err(SendError::new(Failure::BadResponse, why)));
                    }
                    // A turn given up between interims: a flood of them is
                    // always ready, and would hold the task.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Ok(Some(head::UpstreamHead::Final {
                    len,
                    response,
                    framing,
                    reusable,
                })) => {
                    buf.advance(len);
                    return Poll::Ready(Ok((response, framing, reusable)));
                }
                Ok(None) if buf.len() > MAX_RESPONSE_HEAD => {
                    let why = "the response head is too large";
                    return Poll::Ready(Err(SendError::new(Failure::BadResponse, why)));
                }
                Ok(None) => {}
                Err(why) => return Poll::Ready(Err(SendError::new(Failure::BadResponse, why))),
            }
            if buf.capacity() - buf.len() < 512 {
                buf.reserve(HEAD_ROOM);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut io), cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    let (kind, why) = match written {
                        0 => (
                            Failure::NotSent,
                            "the connection closed before the request was written",
                        ),
                        _ => (Failure::Reset, "the connection closed before a response"),
                    };
                    let why = match &broke {
                        Some(e) => format!("{why} (writing: {e})"),
                        None => why.to_string(),
                    };
                    return Poll::Ready(Err(SendError::new(kind, why)));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    // A TLS alert after the handshake (TLS 1.3: a client
                    // certificate refused): the request was never processed.
                    if let Some(why) = crate::tls::describe_failure(&e) {
                        return Poll::Ready(Err(SendError::tls(why)));
                    }
                    let kind = match written {
                        0 => Failure::NotSent,
                        _ => Failure::Reset,
                    };
                    return Poll::Ready(Err(SendError::new(kind, e.to_string())));
                }
            }
        }
    });
    let (response, framing, reusable) = head.await?;
    let body = H1Body::new(io, buf, framing, reusable, sending, back);
    Ok(response.map(|()| body))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
