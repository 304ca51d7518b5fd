//! The fast path's transport: one attempt is a request written on a pooled
//! (or new) upstream connection and the response head read back, raced
//! against the client going away; what it returns, and how a response to be
//! retried gives its connection back.

use super::head::{self, Framing, Head};
use super::{client_gone, read_more, Pool, Timer};
use crate::policy::{parse_retry_after, Outcome, Pushback};
use crate::proxy::attempt;
use crate::proxy::error::ProxyError;
use crate::proxy::{Upstream, MAX_RESPONSE_HEAD};
use crate::upstream::client::{Failure, SendError};
use crate::upstream::pool::UpstreamIo;
use crate::upstream::Address;
use std::io;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// A response head from the upstream, and the connection it came on.
pub(super) struct H1Answer {
    pub(super) upstream: UpstreamIo,
    /// The address `upstream` is connected to, and its TLS (0: none): its
    /// pool key.
    pub(super) addr: Address,
    pub(super) tag: u64,
    pub(super) status: u16,
    pub(super) head_len: usize,
    pub(super) framing: Framing,
    pub(super) reusable: bool,
    pub(super) retry_after: Option<Duration>,
    /// A proxy's refusal under load (docs/reference/retries.md#pushback).
    pub(super) refused: bool,
}

impl H1Answer {
    /// Lets go of a response that is not relayed (`upstream`: the buffer
    /// its head and what came of its body are in): its connection goes back
    /// to the pool when the whole body is already here and the connection
    /// may be reused.
    pub(super) fn let_go(self, pool: &Pool, upstream: &[u8]) {
        let tail = upstream.len().saturating_sub(self.head_len);
        let whole = match self.framing {
            Framing::Empty => tail == 0,
            Framing::Length(n) => tail as u64 == n,
            Framing::Chunked | Framing::Close => false,
        };
        if self.reusable && whole {
            pool.put(self.addr, self.tag, self.upstream, Instant::now());
        }
    }
}

/// How an attempt failed, classified as on the general path.
pub(super) type Failed = SendError;

/// The fast path's transport: one attempt is a [`send_h1`] over a pooled
/// connection, raced against the client going away (the client's socket is
/// read meanwhile, so a pipelined request is kept and a close is seen).
pub(super) struct FastTransport<'c> {
    /// The client, raced against every wait.
    pub(super) watch: ClientWatch<'c>,
    /// The request as sent (head and body); a traced request's
    /// `traceparent` is rewritten in place for each attempt.
    pub(super) request: &'c mut [u8],
    pub(super) upstream: &'c mut Vec<u8>,
    pub(super) out: &'c mut Vec<u8>,
    /// Set with `out`: where the fields a stored response keeps lie in it.
    pub(super) kept: &'c mut Option<(usize, usize)>,
    pub(super) timer: &'c mut Timer,
    pub(super) pool: &'c Pool,
    pub(super) up: &'c Upstream,
    pub(super) is_head_request: bool,
    /// A keyed write (docs/reference/idempotency.md#idempotency-keys): its attempts go
    /// on when the client leaves, within the request's deadline, so that
    /// their outcome is recorded for a re-send.
    pub(super) detached: bool,
    /// Endpoints that failed this request: a retry goes elsewhere when it
    /// can (docs/reference/endpoints.md#retries-go-elsewhere).
    pub(super) avoid: Vec<Address>,
}

/// The client of one request, watched while weir waits for it (admission):
/// its socket is read meanwhile, so a pipelined request is kept and a close
/// is seen.
pub(super) struct ClientWatch<'c> {
    pub(super) stream: &'c mut TcpStream,
    pub(super) client: &'c mut Vec<u8>,
    pub(super) eof: &'c mut bool,
    /// Bytes of the client buffer that belong to this request.
    pub(super) need: usize,
}

impl attempt::Watch for ClientWatch<'_> {
    async fn unless_gone<F: std::future::Future>(&mut self, f: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            () = client_gone(self.stream, self.client, self.need, self.eof) => None,
            r = f => Some(r),
        }
    }
}

impl attempt::Watch for FastTransport<'_> {
    async fn unless_gone<F: std::future::Future>(&mut self, f: F) -> Option<F::Output> {
        if self.detached {
            return Some(f.await);
        }
        self.watch.unless_gone(f).await
    }
}

impl attempt::Transport for FastTransport<'_> {
    type Response = H1Answer;

    async fn attempt(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
    ) -> Option<(Outcome, Result<H1Answer, ProxyError>)> {
        let mut picked = None;
        let sent = tokio::select! {
            biased;
            // The client went away: the attempt is dropped, the breaker
            // slot released without a verdict.
            () = client_gone(self.watch.stream, self.watch.client, self.watch.need, self.watch.eof), if !self.detached => return None,
            r = send_h1(self.pool, self.up, started, self.request, self.upstream, (self.out, self.kept), self.is_head_request, (&mut self.avoid, &mut picked, None)) => r.map_err(SendError::into_parts),
            () = self.timer.at(try_deadline) => Err(attempt::timed_out(try_deadline, deadline)),
        };
        Some(conclude(self.up, sent, picked, started, &mut self.avoid))
    }

    async fn attempt_hedged(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
        hedging: attempt::Hedging<'_>,
    ) -> Option<attempt::Raced<H1Answer>> {
        let FastTransport {
            watch,
            request,
            upstream,
            out,
            kept,
            timer,
            pool,
            up,
            is_head_request,
            detached,
            avoid,
        } = self;
        let (pool, up, request, head) = (*pool, *up, &**request, *is_head_request);
        let (seen, seen2) = (attempt::Seen::default(), attempt::Seen::default());
        // The hedge's own buffers; its answer is written after what `out`
        // holds already, as the first attempt's would be.
        let (mut up2, mut out2, mut kept2) = (Vec::new(), out.clone(), None);
        let mut avoid2 = avoid.clone();
        let primary = async {
            let mut picked = None;
            let sent = tokio::select! {
                biased;
                r = send_h1(pool, up, started, request, upstream, (out, kept), head, (avoid, &mut picked, Some(&seen))) => r.map_err(SendError::into_parts),
                () = timer.at(try_deadline) => Err(attempt::timed_out(try_deadline, deadline)),
            };
            conclude(up, sent, picked, started, avoid)
        };
        let (buf, out2_, kept2_, avoid2_) = (&mut up2, &mut out2, &mut kept2, &mut avoid2);
        let (seen_, seen2_) = (&seen, &seen2);
        let hedge = move |sent_at: Instant, give_up: Instant| {
            if let Some(a) = seen_.get() {
                avoid2_.push(a);
            }
            let (out2, kept2, avoid2) = (out2_, kept2_, avoid2_);
            async move {
                let mut picked = None;
                let sent = tokio::select! {
                    biased;
                    r = send_h1(pool, up, sent_at, request, buf, (out2, kept2), head, (&mut *avoid2, &mut picked, Some(seen2_))) => r.map_err(SendError::into_parts),
                    () = tokio::time::sleep_until(give_up) => Err(attempt::timed_out(give_up, deadline)),
                };
                conclude(up, sent, picked, sent_at, avoid2)
            }
        };
        let raced = attempt::race(primary, started, hedging, hedge);
        let raced = if *detached {
            raced.await
        } else {
            tokio::select! {
                biased;
                // The client went away: both attempts are dropped.
                () = client_gone(watch.stream, watch.client, watch.need, watch.eof) => return None,
                r = raced => r,
            }
        };
        raced.observe_loser(&up.endpoints, started, (&seen, &seen2));
        if raced.hedge.is_some_and(|h| h.won) {
            // The hedge's answer is the one relayed: its buffers are ours.
            std::mem::swap(*upstream, &mut up2);
            std::mem::swap(*out, &mut out2);
            **kept = kept2;
        }
        for a in avoid2 {
            if !avoid.contains(&a) {
                avoid.push(a);
            }
        }
        Some(raced)
    }

    fn traceparent(&mut self, value: &[u8; 55]) {
        crate::trace::context::set_in_head(self.request, value);
    }

    fn elsewhere(&self) -> bool {
        self.up.endpoints.untried(&self.avoid)
    }

    fn endpoint(&self, r: &Result<H1Answer, ProxyError>) -> Option<Address> {
        match r {
            Ok(x) => Some(x.addr),
            Err(_) => self.avoid.last().copied(),
        }
    }

    /// A response to be retried: its connection goes back to the pool when
    /// the whole body is already here and the connection may be reused.
    fn discard(&mut self, response: Result<H1Answer, ProxyError>) {
        if let Ok(x) = response {
            x.let_go(self.pool, self.upstream);
        }
    }
}

/// An attempt's outcome from what [`send_h1`] returned, reported to the
/// endpoint it went to (`picked`).
fn conclude(
    up: &Upstream,
    sent: Result<H1Answer, (Outcome, ProxyError)>,
    picked: Option<crate::upstream::Picked>,
    started: Instant,
    avoid: &mut Vec<Address>,
) -> (Outcome, Result<H1Answer, ProxyError>) {
    let outcome = match &sent {
        Ok(x) => Outcome::Response {
            status: x.status,
            retry_after: None,
            grpc_status: None,
            pushback: None,
        },
        Err((o, _)) => *o,
    };
    crate::upstream::report(picked, &outcome, &up.config.breaker, started, avoid);
    match sent {
        Ok(x) => (
            Outcome::Response {
                status: x.status,
                retry_after: x.retry_after,
                grpc_status: None,
                pushback: Pushback::of(x.refused, None),
            },
            Ok(x),
        ),
        Err((outcome, e)) => (outcome, Err(e)),
    }
}

/// One attempt: an endpoint picked, a pooled (or new) connection to it, the
/// request written, the response head read. The endpoint is left in
/// `picked` for its outcome to be reported.
#[allow(clippy::too_many_arguments)]
async fn send_h1(
    pool: &Pool,
    up: &Upstream,
    now: Instant,
    request: &[u8],
    buf: &mut Vec<u8>,
    (out, kept): (&mut Vec<u8>, &mut Option<(usize, usize)>),
    is_head_request: bool,
    (avoid, picked, seen): (
        &mut Vec<Address>,
        &mut Option<crate::upstream::Picked>,
        Option<&attempt::Seen>,
    ),
) -> Result<H1Answer, Failed> {
    let tag = up.client.fast_tls.as_deref().map_or(0, |t| t.tag);
    // The upstream layer's checkout: an idle connection to the picked
    // endpoint, else a new one (an endpoint that refuses is reported and
    // another tried: nothing was sent).
    let publish = |a: Address| {
        if let Some(seen) = seen {
            seen.set(a);
        }
    };
    // No call at all without a hedge to tell.
    let publish: Option<&(dyn Fn(Address) + Sync)> = match seen {
        Some(_) => Some(&publish),
        None => None,
    };
    let to = up.checkout();
    use crate::upstream::checkout;
    let (mut s, addr) = match checkout::idle(&to, pool, now, avoid, picked, publish)? {
        Some(idle) => idle,
        None => checkout::dial(&to, now, avoid, picked, publish).await?,
    };

    let written = match &mut s {
        UpstreamIo::Plain(tcp) => {
            // Written past the meter (a non-blocking write): counted here.
            let n = write_plain!(tcp.get_mut(), request);
            tcp.meter().sent(n);
            n
        }
        UpstreamIo::Unix(unix) => {
            let n = write_plain!(unix.get_mut(), request);
            unix.meter().sent(n);
            n
        }
        UpstreamIo::Tls(t) => {
            use tokio::io::AsyncWriteExt;
            // rustls takes the request into its records; what reached the
            // upstream is not known, so a failure is a reset, not "not sent".
            let wrote = async { t.write_all(request).await.and(t.flush().await) };
            if let Err(e) = wrote.await {
                return Err(SendError::new(Failure::Reset, e.to_string()));
            }
            request.len()
        }
    };
    let whole = written == request.len();
    buf.clear();
    read_head(
        up,
        s,
        addr,
        tag,
        written,
        whole,
        buf,
        (out, kept),
        is_head_request,
    )
    .await
}

/// Writes `request` on a cleartext connection (a `TcpStream` or a
/// `UnixStream`: the same calls, no trait of tokio's in common), evaluating
/// to how much was written before the upstream answered early (without
/// reading it all); returns the error from the enclosing function.
macro_rules! write_plain {
    ($s:expr, $request:expr) => {{
        let (s, request): (_, &[u8]) = ($s, $request);
        let mut written = 0;
        while written < request.len() {
            let why = match s.try_write(&request[written..]) {
                Ok(n) if n > 0 => {
                    written += n;
                    continue;
                }
                Ok(_) => "the connection closed".to_string(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The upstream is not reading. It may have answered
                    // early (413, 401) without reading the rest: then its
                    // answer is what the client gets, and the connection is
                    // not reused.
                    tokio::select! {
                        biased;
                        _ = s.readable() => break,
                        r = s.writable() => match r {
                            Ok(()) => continue,
                            Err(e) => e.to_string(),
                        },
                    }
                }
                Err(e) => e.to_string(),
            };
            // Nothing written: nothing reached the upstream (a pooled
            // connection found closed), which any method may retry.
            let kind = if written == 0 {
                Failure::NotSent
            } else {
                Failure::Reset
            };
            return Err(SendError::new(kind, why).into());
        }
        written
    }};
}
use write_plain;

/// Reads the response head for a request of which `written` bytes went out.
#[allow(clippy::too_many_arguments)]
async fn read_head(
    up: &Upstream,
    mut s: UpstreamIo,
    addr: Address,
    tag: u64,
    written: usize,
    whole: bool,
    buf: &mut Vec<u8>,
    (out, kept): (&mut Vec<u8>, &mut Option<(usize, usize)>),
    is_head_request: bool,
) -> Result<H1Answer, Failed> {
    let mut interims = 0;
    loop {
        match read_more(&mut s, buf).await {
            Ok(0) if written == 0 => {
                let why = "the connection closed before the request was written";
                return Err(SendError::new(Failure::NotSent, why));
            }
            Ok(0) => {
                let why = "the connection closed before a response";
                return Err(SendError::new(Failure::Reset, why));
            }
            Err(e) => {
                // A TLS alert after the handshake (TLS 1.3: a client
                // certificate refused): the request was never processed.
                if let Some(why) = crate::tls::describe_failure(&e) {
                    up.reach.log_tls_failure_once(&why);
                    return Err(SendError::tls(why));
                }
                return Err(SendError::new(Failure::Reset, e.to_string()));
            }
            Ok(_) => {}
        }
        loop {
            match head::parse_response(buf, is_head_request, || up.state.clock.wall(), out) {
                Ok(None) if buf.len() > MAX_RESPONSE_HEAD => {
                    let why = "the response head is too large";
                    return Err(SendError::new(Failure::BadResponse, why));
                }
                Ok(None) => break,
                Ok(Some(Head::Interim(n))) => {
                    // Dropped, counted, and a turn given up: a flood of
                    // them is always ready to read, and would otherwise
                    // hold the task (and the deadline's timer, polled
                    // after it) for as long as it lasts.
                    interims += 1;
                    if interims > crate::upstream::send::MAX_INTERIM_RESPONSES {
                        let why = crate::upstream::send::INTERIM_FLOOD;
                        return Err(SendError::new(Failure::BadResponse, why));
                    }
                    buf.drain(..n);
                    tokio::task::yield_now().await;
                }
                Ok(Some(Head::Final(r))) => {
                    *kept = r.kept;
                    let retry_after = r
                        .retry_after
                        .and_then(|v| parse_retry_after(v, up.state.clock.wall()));
                    return Ok(H1Answer {
                        upstream: s,
                        addr,
                        tag,
                        status: r.status,
                        head_len: r.head_len,
                        framing: r.framing,
                        reusable: r.reusable && whole,
                        retry_after,
                        refused: r.refused,
                    });
                }
                Err(why) => return Err(SendError::new(Failure::BadResponse, why)),
            }
        }
    }
}
