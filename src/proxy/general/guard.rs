//! A request-smuggling guard in front of hyper's HTTP/1 parser.
//!
//! hyper follows RFC 7230 and, given both `Content-Length` and
//! `Transfer-Encoding`, drops the length and reads the body as chunked. A
//! proxy in front of weir may have framed the same bytes by the length; the
//! two would then disagree about where the next request starts. RFC 9112
//! §6.1 lets a server reject such a message, and weir does: 400, connection
//! closed.
//!
//! hyper hides the conflict from the service (the length header is gone by
//! then), so this wrapper follows the framing of each HTTP/1 request on the
//! read side — head, fixed-length or chunked body, next head — and answers
//! a conflicting head itself. It only looks; the bytes hyper reads are the
//! bytes the client sent. HTTP/2 (the prior-knowledge preface), upgrades,
//! CONNECT and anything it cannot follow are passed through untouched, and
//! hyper's own parser remains the one that decides everything else.

use crate::h1;

mod judge;
pub use judge::Refusal;
use judge::{find_head_end, judge, Judged};
pub(crate) use judge::{GuardVerdict, MARKER};
use pin_project_lite::pin_project;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Following {
    /// Holding a request head until it is complete.
    Head,
    /// Skipping a fixed-length body.
    Fixed(u64),
    /// Following a chunked body (`h1`, hyper's rules).
    Chunked(h1::Chunked),
    /// An HTTP/2 connection that has not yet sent its preface and a first
    /// frame header (`seen` bytes so far): passed through, but still timed,
    /// so a client that stops mid-handshake is cut at `header_read_timeout`.
    H2Preface { seen: usize },
    /// No longer following: h2, an upgrade, or something hyper will reject.
    Passthrough,
    /// A chunked body weir's framing refuses: nothing more reaches hyper,
    /// whose next read fails, so the request and the connection end. (hyper
    /// alone would read on past bytes its decoder takes more loosely — a
    /// bare LF after the last chunk — and serve requests the guard never
    /// judged.)
    Cut,
    /// A conflicting head was replaced; nothing more is read from the client.
    Rejected,
}

pin_project! {
    /// Wraps a client connection; see the module docs.
    ///
    /// Request heads are held back until complete (so a conflicting one can
    /// be replaced whole); body bytes are read straight into hyper's buffer.
    pub struct FramingGuard<T> {
        #[pin]
        inner: T,
        state: Following,
        // Bytes read from the client and not yet handed to hyper:
        // `stash[released..ready]` may go now, `stash[ready..]` is a head
        // still being held.
        stash: Vec<u8>,
        released: usize,
        ready: usize,
        max_head: usize,
        // hyper's `header_read_timeout` only starts once hyper is reading a
        // head, and a head held here has not reached hyper yet; so the guard
        // times held heads (and a fresh connection that sends nothing) itself.
        // Armed only when a read would wait: a head that arrives whole costs
        // no timer at all.
        head_timeout: Duration,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
        seen_request: bool,
        // Set once the client sent the HTTP/2 preface: a drain says
        // goodbye to it with a GOAWAY (`proxy::general::conn`).
        h2: Arc<AtomicBool>,
        // Heads counted and the one refused, for the service.
        verdict: Arc<GuardVerdict>,
    }
}

impl<T> FramingGuard<T> {
    pub(crate) fn new(inner: T, max_head: usize, head_timeout: Duration) -> Self {
        FramingGuard {
            inner,
            state: Following::Head,
            stash: Vec::new(),
            released: 0,
            ready: 0,
            max_head,
            head_timeout,
            timer: None,
            seen_request: false,
            h2: Arc::new(AtomicBool::new(false)),
            verdict: Arc::new(GuardVerdict::default()),
        }
    }

    /// What the guard refused, for the service that answers the marker.
    pub(crate) fn verdict(&self) -> Arc<GuardVerdict> {
        Arc::clone(&self.verdict)
    }

    /// Set once the client has sent the HTTP/2 connection preface.
    pub(crate) fn h2_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.h2)
    }
}

/// Follows body framing through `data`; returns how many bytes belong to the
/// current body (all of them, unless the body ends inside `data`).
fn advance_body(state: &mut Following, data: &[u8]) -> usize {
    match state {
        Following::Fixed(n) => {
            let take = (*n).min(data.len() as u64);
            *state = if take == *n {
                Following::Head
            } else {
                Following::Fixed(*n - take)
            };
            take as usize
        }
        Following::Chunked(c) => match c.feed(data) {
            Ok(Some(end)) => {
                *state = Following::Head;
                end
            }
            Ok(None) => data.len(),
            // Not valid chunked coding: nothing from here on reaches hyper.
            Err(_) => {
                *state = Following::Cut;
                0
            }
        },
        Following::Head
        | Following::H2Preface { .. }
        | Following::Passthrough
        | Following::Rejected
        | Following::Cut => 0,
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4) and a frame header: what a
/// client must send within `header_read_timeout`.
const H2_HANDSHAKE: usize = 24 + 9;

/// Moves `ready` forward through the stash as far as framing allows, judging
/// each complete head; replaces a refused head with [`MARKER`].
fn process(
    state: &mut Following,
    stash: &mut Vec<u8>,
    ready: &mut usize,
    max_head: usize,
    seen: (&AtomicBool, &GuardVerdict),
) {
    if matches!(*state, Following::Rejected | Following::Cut) {
        return;
    }
    match scan_slice(state, &stash[*ready..], max_head, seen) {
        Scan::All => *ready = stash.len(),
        Scan::Partial(h) => *ready += h, // hold until the head is complete
        Scan::Cut(at) => {
            stash.truncate(*ready + at);
            *ready = stash.len();
        }
        Scan::Reject(h) => {
            stash.truncate(*ready + h);
            stash.extend_from_slice(MARKER);
            *ready = stash.len();
            *state = Following::Rejected;
        }
    }
}

/// What [`scan_slice`] found in bytes read straight into hyper's buffer.
enum Scan {
    /// Every byte belongs to a complete head or a body.
    All,
    /// A head starting at this offset is not complete yet.
    Partial(usize),
    /// A head weir answers itself starts at this offset: replace it (and
    /// everything after it) with the [`MARKER`].
    Reject(usize),
    /// A chunked body weir refuses goes wrong after this offset: nothing
    /// from here reaches hyper ([`Following::Cut`]).
    Cut(usize),
}

/// Follows framing through `data` in place (also what [`process`] runs on
/// the stash).
fn scan_slice(
    state: &mut Following,
    data: &[u8],
    max_head: usize,
    (h2, verdict): (&AtomicBool, &GuardVerdict),
) -> Scan {
    scan_marked(state, data, max_head, &mut |m| match m {
        Mark::Head { .. } => {
            verdict.heads.fetch_add(1, Ordering::Relaxed);
        }
        Mark::Stop(_, Stop::Http2) => h2.store(true, Ordering::Relaxed),
        Mark::Stop(_, Stop::Refused(why)) => verdict.refuse(why),
        _ => {}
    })
}

/// What the guard decided at an offset of the bytes it scanned: the view
/// [`frame`] reports (the fuzz targets and tests compare it with a strict
/// reference). Production passes a closure that ignores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A request head from `start` to `end`, accepted and followed.
    Head { start: usize, end: usize },
    /// The request before this offset (head and body) ended here.
    End(usize),
    /// The guard stopped following at this offset, and why.
    Stop(usize, Stop),
}

/// Why the guard stopped following a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A head hyper's parser refuses (hyper answers 400 and closes).
    Unparsed,
    /// A chunked body hyper's decoder refuses (hyper ends the connection).
    BadChunked,
    /// A request that turns the connection into a tunnel (CONNECT, an
    /// upgrade): what follows is not HTTP/1.
    Tunnel,
    /// The HTTP/2 preface: hyper's HTTP/2 server reads what follows.
    Http2,
    /// A head weir answers itself (the marker's request) and closes.
    Refused(Refusal),
}

fn scan_marked(
    state: &mut Following,
    data: &[u8],
    max_head: usize,
    mark: &mut impl FnMut(Mark),
) -> Scan {
    let mut i = 0;
    loop {
        match *state {
            Following::Rejected | Following::Passthrough => return Scan::All,
            Following::Cut => return Scan::Cut(i),
            Following::H2Preface { seen } => {
                let seen = seen + (data.len() - i);
                *state = if seen >= H2_HANDSHAKE {
                    Following::Passthrough
                } else {
                    Following::H2Preface { seen }
                };
                return Scan::All;
            }
            Following::Head => {
                // Empty lines before a request line are skipped (RFC 9112
                // §2.2), CRLF or a bare LF as httparse skips them; a lone CR
                // is left for the parser, which refuses it.
                loop {
                    match data.get(i..).unwrap_or_default() {
                        [b'\n', ..] => i += 1,
                        [b'\r', b'\n', ..] => i += 2,
                        _ => break,
                    }
                }
                if i == data.len() || &data[i..] == b"\r" {
                    return if i == data.len() {
                        Scan::All
                    } else {
                        Scan::Partial(i)
                    };
                }
                let head = &data[i..];
                if head.starts_with(b"PRI * HTTP/2.0") {
                    mark(Mark::Stop(i, Stop::Http2));
                    *state = Following::H2Preface { seen: 0 };
                    continue;
                }
                match find_head_end(head) {
                    None => {
                        if head.len() > max_head {
                            mark(Mark::Stop(i, Stop::Refused(Refusal::HeadTooLarge)));
                            return Scan::Reject(i);
                        }
                        return Scan::Partial(i);
                    }
                    Some(end) if end > max_head => {
                        mark(Mark::Stop(i, Stop::Refused(Refusal::HeadTooLarge)));
                        return Scan::Reject(i);
                    }
                    Some(end) => match judge(&head[..end]) {
                        Judged::Reject(why) => {
                            mark(Mark::Stop(i, Stop::Refused(why)));
                            return Scan::Reject(i);
                        }
                        Judged::Stop(why) => {
                            mark(Mark::Stop(i, why));
                            *state = Following::Passthrough;
                            return Scan::All;
                        }
                        Judged::Next(next) => {
                            mark(Mark::Head {
                                start: i,
                                end: i + end,
                            });
                            *state = next;
                            i += end;
                            if next == Following::Head {
                                mark(Mark::End(i));
                            }
                        }
                    },
                }
            }
            _ => {
                i += advance_body(state, &data[i..]);
                match *state {
                    Following::Head => mark(Mark::End(i)),
                    Following::Cut => {
                        mark(Mark::Stop(i, Stop::BadChunked));
                        return Scan::Cut(i);
                    }
                    _ => {}
                }
                if i == data.len() {
                    return Scan::All;
                }
            }
        }
    }
}

/// What the guard makes of a connection's bytes, read in pieces of the given
/// sizes (the rest in one): every [`Mark`], offsets from the first byte.
/// Used by the fuzz targets (`fuzz/`) and the framing tests.
pub(crate) fn frame(bytes: &[u8], pieces: &[usize], max_head: usize) -> Vec<Mark> {
    let mut state = Following::Head;
    let mut stash = Vec::new();
    let mut ready = 0;
    let mut marks = Vec::new();
    let mut at = 0;
    let ends = pieces
        .iter()
        .scan(0usize, |end, n| {
            *end = (*end + n).min(bytes.len());
            Some(*end)
        })
        .chain(std::iter::once(bytes.len()));
    for end in ends {
        if state == Following::Rejected {
            break;
        }
        if end < at {
            continue;
        }
        stash.extend_from_slice(&bytes[at..end]);
        at = end;
        let base = ready;
        let mut shift = |m: Mark| {
            marks.push(match m {
                Mark::Head { start, end } => Mark::Head {
                    start: start + base,
                    end: end + base,
                },
                Mark::End(e) => Mark::End(e + base),
                Mark::Stop(e, why) => Mark::Stop(e + base, why),
            })
        };
        match scan_marked(&mut state, &stash[ready..], max_head, &mut shift) {
            Scan::All => ready = stash.len(),
            Scan::Partial(h) => ready += h,
            Scan::Reject(..) | Scan::Cut(_) => state = Following::Rejected,
        }
    }
    marks
}

impl<T: AsyncRead> AsyncRead for FramingGuard<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut this = self.project();
        loop {
            if *this.released < *this.ready {
                let n = (*this.ready - *this.released).min(buf.remaining());
                buf.put_slice(&this.stash[*this.released..*this.released + n]);
                *this.released += n;
                if *this.released == this.stash.len() {
                    this.stash.clear();
                    *this.released = 0;
                    *this.ready = 0;
                }
                return Poll::Ready(Ok(()));
            }
            match *this.state {
                // hyper answers the marker and closes; there is nothing more to read.
                Following::Rejected => return Poll::Pending,
                Following::Cut => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "invalid chunked request body",
                    )))
                }
                Following::Passthrough if this.stash.is_empty() => {
                    return this.inner.poll_read(cx, buf)
                }
                // The common case, a keep-alive connection between requests:
                // read straight into hyper's buffer and look at it there.
                Following::Head if this.stash.is_empty() && *this.seen_request => {
                    let before = buf.filled().len();
                    ready!(this.inner.as_mut().poll_read(cx, buf))?;
                    let end = buf.filled().len();
                    if end == before {
                        return Poll::Ready(Ok(())); // EOF
                    }
                    match scan_slice(
                        this.state,
                        &buf.filled()[before..],
                        *this.max_head,
                        (this.h2, this.verdict),
                    ) {
                        Scan::All => return Poll::Ready(Ok(())),
                        Scan::Partial(h) => {
                            // Hold the unfinished head back (slow path from here).
                            this.stash.extend_from_slice(&buf.filled()[before + h..end]);
                            buf.set_filled(before + h);
                            if h == 0 {
                                continue;
                            }
                            return Poll::Ready(Ok(()));
                        }
                        Scan::Cut(at) => {
                            buf.set_filled(before + at);
                            if at == 0 {
                                continue;
                            }
                            return Poll::Ready(Ok(()));
                        }
                        Scan::Reject(h) => {
                            let marker = MARKER;
                            *this.state = Following::Rejected;
                            let at = before + h;
                            if end - at >= marker.len() {
                                buf.filled_mut()[at..at + marker.len()].copy_from_slice(marker);
                                buf.set_filled(at + marker.len());
                            } else {
                                buf.set_filled(at);
                                this.stash.extend_from_slice(marker);
                                *this.ready = this.stash.len();
                                if h == 0 {
                                    continue;
                                }
                            }
                            return Poll::Ready(Ok(()));
                        }
                    }
                }
                Following::Head | Following::Passthrough | Following::H2Preface { .. } => {}
                _ if this.stash.is_empty() => {
                    // Body bytes: straight into hyper's buffer.
                    let before = buf.filled().len();
                    ready!(this.inner.as_mut().poll_read(cx, buf))?;
                    let used = advance_body(this.state, &buf.filled()[before..]);
                    let end = buf.filled().len();
                    if *this.state == Following::Cut {
                        buf.set_filled(before);
                        continue;
                    }
                    if before + used < end {
                        // A new head starts here: hold it back.
                        this.stash
                            .extend_from_slice(&buf.filled()[before + used..end]);
                        buf.set_filled(before + used);
                        process(
                            this.state,
                            this.stash,
                            this.ready,
                            *this.max_head,
                            (this.h2, this.verdict),
                        );
                        if used == 0 {
                            continue;
                        }
                    }
                    return Poll::Ready(Ok(()));
                }
                _ => {}
            }
            let mut tmp = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
            let mut rb = ReadBuf::uninit(&mut tmp);
            if this.inner.as_mut().poll_read(cx, &mut rb)?.is_pending() {
                let waiting_for_head = (*this.state == Following::Head
                    && (*this.ready < this.stash.len() || !*this.seen_request))
                    || matches!(*this.state, Following::H2Preface { .. });
                if !waiting_for_head {
                    return Poll::Pending;
                }
                let timeout = *this.head_timeout;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "request head not received within header_read_timeout",
                    )));
                }
                return Poll::Pending;
            }
            if rb.filled().is_empty() {
                // EOF: hand over whatever is held; hyper reports the cut.
                if *this.ready < this.stash.len() {
                    *this.ready = this.stash.len();
                    *this.state = Following::Passthrough;
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            this.stash.extend_from_slice(rb.filled());
            process(
                this.state,
                this.stash,
                this.ready,
                *this.max_head,
                (this.h2, this.verdict),
            );
            let handshaking = matches!(*this.state, Following::H2Preface { .. });
            if !handshaking && (*this.ready == this.stash.len() || *this.state != Following::Head) {
                // Every held head is complete: stand the timer down.
                *this.timer = None;
                *this.seen_request = true;
            }
        }
    }
}

impl<T: AsyncWrite> AsyncWrite for FramingGuard<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests;
