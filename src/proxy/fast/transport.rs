//! The fast path's transport: one attempt is a request written on a pooled
//! (or new) upstream connection and the response head read back, raced
//! against the client going away; what it returns, and how a response to be
//! retried gives its connection back.

use super::head::{self, Framing, Head};
use super::{client_gone, read_more, Pool, Timer};
use crate::policy::{parse_retry_after, Outcome};
use crate::proxy::attempt;
use crate::proxy::client::{Failure, SendError};
use crate::proxy::error::ProxyError;
use crate::proxy::{Upstream, MAX_RESPONSE_HEAD};
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// A response head from the upstream, and the connection it came on.
pub(super) struct Exchange {
    pub(super) upstream: TcpStream,
    /// The address `upstream` is connected to (its pool key).
    pub(super) addr: SocketAddr,
    pub(super) status: u16,
    pub(super) head_len: usize,
    pub(super) framing: Framing,
    pub(super) reusable: bool,
    pub(super) retry_after: Option<Duration>,
}

/// How an exchange failed, classified as on the general path.
pub(super) type Failed = SendError;

/// The fast path's transport: one attempt is an [`exchange`] over a pooled
/// connection, raced against the client going away (the client's socket is
/// read meanwhile, so a pipelined request is kept and a close is seen).
pub(super) struct FastTransport<'c> {
    /// The client, raced against every wait.
    pub(super) watch: ClientWatch<'c>,
    pub(super) request: &'c [u8],
    pub(super) upstream: &'c mut Vec<u8>,
    pub(super) out: &'c mut Vec<u8>,
    pub(super) timer: &'c mut Timer,
    pub(super) pool: &'c Pool,
    pub(super) up: &'c Upstream,
    pub(super) head_method: bool,
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
        self.watch.unless_gone(f).await
    }
}

impl attempt::Transport for FastTransport<'_> {
    type Response = Exchange;

    async fn attempt(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
    ) -> Option<(Outcome, Result<Exchange, ProxyError>)> {
        let sent = tokio::select! {
            biased;
            // The client went away: the attempt is dropped, the breaker
            // slot released without a verdict.
            () = client_gone(self.watch.stream, self.watch.client, self.watch.need, self.watch.eof) => return None,
            r = exchange(self.pool, self.up, started, self.request, self.upstream, self.out, self.head_method) => r.map_err(SendError::into_parts),
            () = self.timer.at(try_deadline) => Err(attempt::timed_out(try_deadline, deadline)),
        };
        Some(match sent {
            Ok(x) => (
                Outcome::Response {
                    status: x.status,
                    retry_after: x.retry_after,
                    grpc_status: None,
                },
                Ok(x),
            ),
            Err((outcome, e)) => (outcome, Err(e)),
        })
    }

    /// A response to be retried: its connection goes back to the pool when
    /// the whole body is already here and the connection may be reused.
    fn discard(&mut self, response: Result<Exchange, ProxyError>) {
        let Ok(x) = response else { return };
        let tail = self.upstream.len() - x.head_len;
        let whole = match x.framing {
            Framing::Empty => tail == 0,
            Framing::Length(n) => tail as u64 == n,
            Framing::Chunked | Framing::Close => false,
        };
        if x.reusable && whole {
            self.pool.put(x.addr, x.upstream, Instant::now());
        }
    }
}

/// One attempt: a pooled (or new) connection, the request written, the
/// response head read.
async fn exchange(
    pool: &Pool,
    up: &Upstream,
    now: Instant,
    request: &[u8],
    buf: &mut Vec<u8>,
    out: &mut Vec<u8>,
    head_method: bool,
) -> Result<Exchange, Failed> {
    let no_address = || SendError::new(Failure::Connect, "the upstream has no address of its own");
    let direct = up.direct.as_ref().ok_or_else(no_address)?;
    // An idle connection to any of the upstream's addresses; else a new one
    // to the next address in turn, then the ones after it if it refuses.
    let (addr, mut s) = match pool.take_for(direct, now) {
        Some(found) => found,
        None => {
            let mut tried = 0;
            loop {
                let addr = direct.next().ok_or_else(no_address)?;
                tried += 1;
                match connect(addr, up.config.connect_timeout).await {
                    Ok(s) => break (addr, s),
                    Err(e) if tried >= direct.tries() => return Err(e),
                    Err(_) => {}
                }
            }
        }
    };
    let mut written = 0;
    while written < request.len() {
        let why = match s.try_write(&request[written..]) {
            Ok(n) if n > 0 => {
                written += n;
                continue;
            }
            Ok(_) => "the connection closed".to_string(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The upstream is not reading. It may have answered early
                // (413, 401) without reading the rest: then its answer is
                // what the client gets, and the connection is not reused.
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
        // Nothing written: nothing reached the upstream (a pooled connection
        // found closed), which any method may retry.
        let kind = if written == 0 {
            Failure::NotSent
        } else {
            Failure::Reset
        };
        return Err(SendError::new(kind, why));
    }
    let whole = written == request.len();
    buf.clear();
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
            Err(e) => return Err(SendError::new(Failure::Reset, e.to_string())),
            Ok(_) => {}
        }
        loop {
            match head::parse_response(buf, head_method, || up.state.clock.wall(), out) {
                Ok(None) if buf.len() > MAX_RESPONSE_HEAD => {
                    let why = "the response head is too large";
                    return Err(SendError::new(Failure::BadResponse, why));
                }
                Ok(None) => break,
                Ok(Some(Head::Interim(n))) => {
                    buf.drain(..n);
                }
                Ok(Some(Head::Final(r))) => {
                    let retry_after = r
                        .retry_after
                        .and_then(|v| parse_retry_after(v, up.state.clock.wall()));
                    return Ok(Exchange {
                        upstream: s,
                        addr,
                        status: r.status,
                        head_len: r.head_len,
                        framing: r.framing,
                        reusable: r.reusable && whole,
                        retry_after,
                    });
                }
                Err(why) => return Err(SendError::new(Failure::BadResponse, why)),
            }
        }
    }
}

async fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, Failed> {
    let failed = |why: String| SendError::new(Failure::Connect, why);
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(failed(format!("connect timed out after {timeout:?}"))),
    }
}
