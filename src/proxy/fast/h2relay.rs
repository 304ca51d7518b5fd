//! The response of an HTTP/2 upstream relayed to an HTTP/1.1 client on the
//! fast path: its head written as HTTP/1.1 with the general path's hygiene
//! (`headers::restate_length`, `headers::strip_hop_by_hop`) and the fast
//! path's annotations ([`head::finish_response`]); framed as hyper's
//! server frames it (docs/reference/protocols.md#protocols): `Content-Length`
//! when the upstream said it or the body is already whole, else chunked;
//! nothing after a HEAD, 204 or 304. The body goes frame by frame, each
//! wait bounded by `idle_timeout`; frames already here go out in one write.
//! Trailers are dropped: a client that asks for them (`TE: trailers`) is
//! served by the general path. How it ended is told as by
//! [`super::relay`].

use super::head::{self, Framing, Planned};
use super::io::{client_gone, write_client};
use super::relay::Relayed;
use super::{Ctx, Kept};
use crate::proxy::{headers, idempotent, Upstream};
use http::header::{CONTENT_LENGTH, DATE};
use std::pin::Pin;
use std::task::Poll;
use tokio::time::Instant;

/// Body bytes gathered for the client before they are written, when frames
/// keep arriving without a wait.
const FLUSH_AT: usize = 64 * 1024;

impl Ctx<'_> {
    /// Writes the response head and relays the body. Returns whether the
    /// client connection can carry another request.
    pub(super) async fn relay_h2<B>(
        &mut self,
        up: &Upstream,
        resp: http::Response<B>,
        kept: Kept,
        p: &Planned,
    ) -> Relayed
    where
        B: http_body::Body<Data = bytes::Bytes> + Unpin,
    {
        let (mut parts, mut body) = resp.into_parts();
        headers::restate_length(&mut parts.headers);
        headers::strip_hop_by_hop(&mut parts.headers, false);
        let status = parts.status.as_u16();
        let close = p.close || *self.stop.borrow();
        let need = p.head_len + p.body_len;
        let field = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| crate::h1::content_length(v.as_bytes()));
        let hint = body.size_hint().exact();
        let known = if body.is_end_stream() { Some(0) } else { hint };
        let framing = if p.is_head_request || status == 204 || status == 304 {
            Framing::Empty
        } else {
            field.or(known).map_or(Framing::Chunked, Framing::Length)
        };
        // A keyed write's response is kept as it passes, as on the general
        // path (`exchange::with_upstream`).
        let mut capture = kept.recorder.map(|r| {
            let fields = idempotent::kept_fields(&parts.headers);
            r.capture(status, fields, hint.unwrap_or(0))
        });

        let out = &mut self.bufs.out;
        out.clear();
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(parts.status.as_str().as_bytes());
        out.push(b' ');
        // As hyper's server words it: HTTP/2 carries no reason phrase.
        let reason = parts.status.canonical_reason().unwrap_or("<none>");
        out.extend_from_slice(reason.as_bytes());
        out.extend_from_slice(b"\r\n");
        for (n, v) in &parts.headers {
            if n != CONTENT_LENGTH {
                head::header(out, n.as_str().as_bytes(), v.as_bytes());
            }
        }
        if !parts.headers.contains_key(DATE) {
            let now = httpdate::fmt_http_date(up.state.clock.wall());
            head::header(out, b"date", now.as_bytes());
        }
        // A body-less response keeps the length it announced to a HEAD
        // only, as hyper's server does with a body already at its end.
        let empty_length = field.filter(|_| p.is_head_request && status != 204);
        if let Some(r) = kept.cache {
            head::header(out, b"x-weir-cache", r.name().as_bytes());
        }
        head::restate_framing(framing, empty_length, out);
        head::finish_response(out, kept.annotations, close);
        drop(parts);

        // Bytes in `out` that are the head, not yet written.
        let mut head_left = out.len();
        let mut bytes = 0u64;
        let mut client_ok = true;
        let sent = |r: Relayed, bytes: u64| Relayed { bytes, ..r };
        let mut left = match framing {
            Framing::Length(n) => Some(n),
            _ => None,
        };
        // Whole by its length (the client takes it so): the record is
        // complete, though the upstream may end its stream a frame later.
        if left == Some(0) || framing == Framing::Empty {
            super::relay::complete(&mut capture, false).wait().await;
        }
        let mut done = framing == Framing::Empty || body.is_end_stream();
        let idle = up.config.idle_timeout;
        while !done {
            // A frame already here joins what waits to be written; else
            // that goes out first.
            let polled = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)));
            let next = match polled.await {
                Poll::Ready(f) => f,
                Poll::Pending => {
                    if client_ok && !self.bufs.out.is_empty() {
                        client_ok =
                            write_client(self.stream, &self.bufs.out, self.write_timeout).await;
                        if !client_ok && capture.is_none() {
                            return sent(Relayed::CLOSED, bytes);
                        }
                        bytes += (self.bufs.out.len() - head_left) as u64;
                        head_left = 0;
                        self.bufs.out.clear();
                    }
                    let until = Instant::now() + idle;
                    let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
                    tokio::select! {
                        biased;
                        () = client_gone(self.stream, &mut self.bufs.client, need, &mut self.bufs.eof), if client_ok => {
                            if capture.is_none() {
                                return sent(Relayed::CLOSED, bytes);
                            }
                            client_ok = false;
                            continue;
                        }
                        f = frame => f,
                        () = self.timer.at(until) => {
                            tracing::debug!(upstream = %up.config.name, idle = %crate::config::duration::format(idle), "response body idle; cut");
                            return sent(Relayed::IDLE, bytes);
                        }
                    }
                }
            };
            let data = match next {
                None => {
                    // Short of the length it announced: the client must not
                    // take it for whole.
                    if left.is_some_and(|l| l > 0) {
                        break;
                    }
                    done = true;
                    continue;
                }
                Some(Err(_)) => break,
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => d,
                    Err(f) => {
                        // Trailers: dropped; a response with them is not
                        // replayed as it was.
                        if let (true, Some(c)) = (f.is_trailers(), capture.as_mut()) {
                            c.spoil();
                        }
                        done = body.is_end_stream();
                        continue;
                    }
                },
            };
            if let Some(l) = left.as_mut() {
                match l.checked_sub(data.len() as u64) {
                    Some(rest) => *l = rest,
                    None => break,
                }
            }
            if let Some(c) = capture.as_mut() {
                c.push(&data);
            }
            if left == Some(0) {
                super::relay::complete(&mut capture, false).wait().await;
            }
            if client_ok && !data.is_empty() {
                let out = &mut self.bufs.out;
                if framing == Framing::Chunked {
                    push_hex(out, data.len());
                    out.extend_from_slice(b"\r\n");
                    out.extend_from_slice(&data);
                    out.extend_from_slice(b"\r\n");
                } else {
                    out.extend_from_slice(&data);
                }
            }
            done = body.is_end_stream();
            if !done && client_ok && self.bufs.out.len() >= FLUSH_AT {
                client_ok = write_client(self.stream, &self.bufs.out, self.write_timeout).await;
                if !client_ok && capture.is_none() {
                    return sent(Relayed::CLOSED, bytes);
                }
                bytes += (self.bufs.out.len() - head_left) as u64;
                head_left = 0;
                self.bufs.out.clear();
            }
        }
        if done {
            super::relay::complete(&mut capture, false).wait().await;
        }
        if done && client_ok && framing == Framing::Chunked {
            self.bufs.out.extend_from_slice(b"0\r\n\r\n");
        }
        if client_ok && !self.bufs.out.is_empty() {
            client_ok = write_client(self.stream, &self.bufs.out, self.write_timeout).await;
            if client_ok {
                bytes += (self.bufs.out.len() - head_left) as u64;
            }
        }
        if !done {
            // The body broke off: the head (and what came) went out; the
            // client connection ends here.
            return sent(Relayed::BROKEN, bytes);
        }
        Relayed {
            open: client_ok && !close,
            error: None,
            bytes,
        }
    }
}

/// `n` in hex, as a chunk's size line.
fn push_hex(out: &mut Vec<u8>, n: usize) {
    let mut buf = [0u8; 16];
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}
