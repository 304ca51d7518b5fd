//! The fast path's relay of an upstream's response to its client: the
//! head, then the body as it comes, each wait bounded by `idle_timeout`; a
//! keyed write's response kept as it passes; and how it ended
//! ([`Relayed`]): a body that breaks off after the head is weir's
//! `upstream_reset` (or `upstream_timeout`), the client's connection ended
//! short of the length (docs/reference/logs.md#logs).

use super::head::{self, Framing, Planned};
use super::io::{client_gone, read_more, write_client};
use super::transport::H1Answer;
use super::Upstream;
use super::{Ctx, Kept};
use crate::proxy::idempotent::{Ack, Capture};
use crate::upstream::Address;
use tokio::time::Instant;

impl Ctx<'_> {
    /// Writes the response head and relays the body as it comes, each wait
    /// for the upstream bounded by `idle_timeout`. Returns whether the client
    /// connection can carry another request.
    pub(super) async fn relay(
        &mut self,
        up: &Upstream,
        addr: Address,
        x: H1Answer,
        kept: Kept,
        p: &Planned,
        ended: Instant,
    ) -> Relayed {
        let annotations = kept.annotations;
        let close = p.close || *self.stop.borrow();
        let need = p.head_len + p.body_len;
        let H1Answer {
            mut upstream,
            tag,
            status,
            head_len,
            framing,
            mut reusable,
            ..
        } = x;
        let idle = up.config.idle_timeout;
        let bufs = &mut *self.bufs;
        // A keyed write's response is kept as it passes, its fields as the
        // client gets them (the head was begun when the upstream's was parsed).
        let mut capture = kept.recorder.map(|r| {
            let hint = match framing {
                Framing::Length(n) => n,
                _ => 0,
            };
            let room = usize::try_from(hint).unwrap_or(usize::MAX).min(r.limit());
            r.capture(status, head::fields(&bufs.out, bufs.kept, room), hint)
        });
        if let Some(r) = kept.cache {
            head::header(&mut bufs.out, b"x-weir-cache", r.name().as_bytes());
        }
        head::finish_response(
            &mut bufs.out,
            annotations,
            close || framing == Framing::Close,
        );
        let head_end = bufs.out.len();
        let tail = &bufs.upstream[head_len..];
        // How much of the body is still to come, and what of `tail` is body.
        let mut chunked = head::ChunkedRelay::default();
        let (mut left, body_now) = match framing {
            Framing::Empty => (Some(0), 0),
            Framing::Length(n) => {
                let have = (tail.len() as u64).min(n);
                (Some(n - have), have as usize)
            }
            Framing::Chunked => match chunked.feed(tail, &mut bufs.out) {
                Ok(Some(end)) => (Some(0), end),
                Ok(None) => (None, tail.len()),
                Err(_) => {
                    // The head goes out; the broken body ends the connection.
                    let _ = write_client(self.stream, &bufs.out, self.write_timeout).await;
                    return Relayed::BROKEN;
                }
            },
            Framing::Close => (None, tail.len()),
        };
        if body_now < tail.len() {
            // Bytes past the end of the response: the connection is not reused.
            reusable = false;
        }
        if framing != Framing::Chunked {
            bufs.out.extend_from_slice(&tail[..body_now]);
        }
        if let Some(c) = capture.as_mut() {
            c.push(&bufs.out[head_end..]);
        }
        if left == Some(0) {
            complete(&mut capture, framing == Framing::Chunked)
                .wait()
                .await;
        }
        // A keyed write's response is read to its end and kept even when
        // its client has left: a re-send gets it from the record.
        let mut client_ok = write_client(self.stream, &bufs.out, self.write_timeout).await;
        if !client_ok && capture.is_none() {
            return Relayed::CLOSED;
        }
        let mut bytes = (bufs.out.len() - head_end) as u64;
        let sent = |r: Relayed, bytes: u64| Relayed { bytes, ..r };
        // The last clock reading: when the connection goes back to the pool.
        let mut last = ended;
        while left != Some(0) {
            bufs.upstream.clear();
            last = Instant::now();
            let until = last + idle;
            let n = tokio::select! {
                biased;
                () = client_gone(self.stream, &mut bufs.client, need, &mut bufs.eof), if client_ok => {
                    if capture.is_none() {
                        return sent(Relayed::CLOSED, bytes);
                    }
                    client_ok = false;
                    continue;
                }
                r = read_more(&mut upstream, &mut bufs.upstream) => match r {
                    Ok(n) => n,
                    Err(_) => return sent(Relayed::BROKEN, bytes),
                },
                () = self.timer.at(until) => {
                    tracing::debug!(upstream = %up.config.name, idle = %crate::config::duration::format(idle), "response body idle; cut");
                    return sent(Relayed::IDLE, bytes);
                }
            };
            if n == 0 {
                // Closed: the end of a close-delimited body, or a cut one
                // (short of its length or its last chunk, so that the client
                // cannot take it for whole); either way the client
                // connection ends here too.
                if framing != Framing::Close {
                    return sent(Relayed::BROKEN, bytes);
                }
                if let Some(c) = capture.take() {
                    // Its bytes are out already: nothing to hold.
                    let _ = c.done();
                }
                return sent(Relayed::CLOSED, bytes);
            }
            let got = &bufs.upstream[..n];
            let (pass, send) = match (framing, left) {
                (Framing::Length(_), Some(l)) => {
                    let take = (n as u64).min(l);
                    left = Some(l - take);
                    (take as usize, &got[..take as usize])
                }
                (Framing::Chunked, _) => {
                    bufs.out.clear();
                    match chunked.feed(got, &mut bufs.out) {
                        Ok(Some(end)) => {
                            left = Some(0);
                            (end, &bufs.out[..])
                        }
                        Ok(None) => (n, &bufs.out[..]),
                        Err(_) => return sent(Relayed::BROKEN, bytes),
                    }
                }
                _ => (n, got),
            };
            if pass < n {
                reusable = false;
            }
            if let Some(c) = capture.as_mut() {
                c.push(send);
            }
            if left == Some(0) {
                complete(&mut capture, framing == Framing::Chunked)
                    .wait()
                    .await;
            }
            if client_ok && !write_client(self.stream, send, self.write_timeout).await {
                if capture.is_none() {
                    return sent(Relayed::CLOSED, bytes);
                }
                client_ok = false;
            }
            if client_ok {
                bytes += send.len() as u64;
            }
        }
        if reusable {
            self.pool.put(addr, tag, upstream, last);
        }
        Relayed {
            // Open unless the head said otherwise: a drain that began after
            // the head went out leaves the connection for its next request.
            open: client_ok && !close && framing != Framing::Close,
            error: None,
            bytes,
        }
    }
}

/// Completes a keyed write's record once the whole response is in hand,
/// before its last bytes go to the client: a repeat the client sends the
/// instant it has the response (on another connection) is answered from the
/// record, not refused as still in flight. The caller waits for the
/// [`Ack`] before it writes them (the record's replicas, with `[state]
/// wait_replicas`).
pub(super) fn complete(capture: &mut Option<Capture>, chunked: bool) -> Ack {
    match capture.take() {
        Some(mut c) => {
            if chunked {
                c.dechunk();
            }
            c.done()
        }
        None => Ack::NONE,
    }
}

/// How a relayed response ended: whether the client connection can carry
/// another request, and weir's error when the upstream's body broke off
/// after the head was sent.
pub(super) struct Relayed {
    pub(super) open: bool,
    pub(super) error: Option<&'static str>,
    /// Body bytes written to the client, as framed.
    pub(super) bytes: u64,
}

impl Relayed {
    pub(super) const CLOSED: Relayed = Relayed {
        open: false,
        error: None,
        bytes: 0,
    };
    pub(super) const BROKEN: Relayed = Relayed {
        open: false,
        error: Some("upstream_reset"),
        bytes: 0,
    };
    pub(super) const IDLE: Relayed = Relayed {
        open: false,
        error: Some("upstream_timeout"),
        bytes: 0,
    };
}
