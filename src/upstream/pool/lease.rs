//! A lease: an HTTP/1.1 connection checked out of the pool ([`super::h1`])
//! with hyper's HTTP/1.1 client over it, for the general path.
//!
//! The connection's task drives hyper's side of it until the lease comes
//! back (its `SendRequest` handed to the task when the lease is dropped),
//! then waits for hyper to want the next request — the response has been
//! read to its end and the connection stays open (not `Connection: close`,
//! not a body dropped half-read that hyper could not drain) — and takes the
//! stream back from hyper (`without_shutdown`) into the pool. Anything else
//! closes it. A lease held by a client connection ([`super::held`]) comes
//! back when that connection ends; one taken for a single request comes
//! back as soon as its response head has arrived, and its connection goes
//! back to the pool when the response body ends.

use super::h1::H1Pool;
use super::io::UpstreamIo;
use crate::upstream::send::{root_cause, Body, Failure, SendError, MAX_RESPONSE_HEAD};
use crate::upstream::Address;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use std::future::poll_fn;
use std::sync::{Arc, Weak};
use tokio::sync::oneshot;
use tokio::time::Instant;

type Conn = http1::Connection<TokioIo<UpstreamIo>, Body>;

/// An HTTP/1.1 connection weir holds for the general path; given back when
/// dropped.
#[derive(Debug)]
pub(crate) struct H1Lease {
    sender: Option<SendRequest<Body>>,
    back: Option<oneshot::Sender<SendRequest<Body>>>,
}

fn builder() -> http1::Builder {
    let mut b = http1::Builder::new();
    // Header names as the client wrote them (hyper keeps the case in the
    // request's extensions); the same response-head limit as the fast path.
    b.preserve_header_case(true).max_buf_size(MAX_RESPONSE_HEAD);
    b
}

fn handshake_failed(e: &hyper::Error) -> SendError {
    SendError::new(Failure::Connect, e.to_string())
}

impl H1Lease {
    /// hyper's HTTP/1.1 client over `io`, a connection to `addr` with TLS
    /// `tag` (0: cleartext) that goes back to `pool` when the lease ends
    /// and it may be reused.
    pub(crate) async fn over(
        io: UpstreamIo,
        pool: &Arc<H1Pool>,
        addr: Address,
        tag: u64,
    ) -> Result<Self, SendError> {
        let (sender, conn) = builder()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| handshake_failed(&e))?;
        let (back, returned) = oneshot::channel();
        tokio::spawn(run(conn, returned, Arc::downgrade(pool), addr, tag));
        Ok(H1Lease {
            sender: Some(sender),
            back: Some(back),
        })
    }

    /// For a request that asks to upgrade (a WebSocket handshake): the
    /// connection may become the client's, so it is never pooled.
    pub(crate) async fn upgradable(io: UpstreamIo) -> Result<Self, SendError> {
        let (sender, conn) = builder()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| handshake_failed(&e))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(H1Lease {
            sender: Some(sender),
            back: None,
        })
    }

    /// Whether the connection is open and free for a request now.
    pub(crate) fn is_ready(&self) -> bool {
        self.sender
            .as_ref()
            .is_some_and(|s| !s.is_closed() && s.is_ready())
    }

    /// Whether the connection has closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.sender.as_ref().is_none_or(|s| s.is_closed())
    }

    /// Sends `req` (origin-form target and `Host` already set); classifies
    /// a failure as the shared pool's client does.
    pub(crate) async fn send(
        &mut self,
        req: http::Request<Body>,
    ) -> Result<http::Response<hyper::body::Incoming>, SendError> {
        let Some(sender) = self.sender.as_mut() else {
            return Err(SendError::new(
                Failure::NotSent,
                "the connection was given back",
            ));
        };
        sender.send_request(req).await.map_err(|e| {
            // A TLS alert after the handshake (TLS 1.3: a client
            // certificate refused): the request was never processed, as
            // on the fast path.
            if let Some(why) = crate::tls::describe_failure(&e) {
                return SendError::tls(why);
            }
            SendError {
                kind: Failure::of(&e),
                message: root_cause(&e),
                tls: false,
            }
        })
    }
}

impl Drop for H1Lease {
    fn drop(&mut self) {
        if let (Some(s), Some(back)) = (self.sender.take(), self.back.take()) {
            // The task may have ended (the connection closed): then the
            // sender is dropped here, and nothing is pooled.
            let _ = back.send(s);
        }
    }
}

/// The connection's task: hyper's side until the lease comes back, then
/// the stream back into the pool when hyper has finished the last exchange
/// and would take another.
async fn run(
    mut conn: Conn,
    returned: oneshot::Receiver<SendRequest<Body>>,
    pool: Weak<H1Pool>,
    addr: Address,
    tag: u64,
) {
    let ended = |r: Result<(), hyper::Error>| {
        if let Err(e) = r {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    };
    // Biased: hyper's side first on every wake (the common one), and no
    // draw of tokio's random start per poll (measured: the task is most of
    // a leased request's cost beyond hyper's own, `SHAPE=h2-in
    // bench/callgrind.sh`).
    let mut sender = tokio::select! {
        biased;
        r = poll_fn(|cx| conn.poll_without_shutdown(cx)) => return ended(r),
        s = returned => match s {
            Ok(s) => s,
            // Never given back (the lease was lost): finish and close.
            Err(_) => return ended(poll_fn(|cx| conn.poll_without_shutdown(cx)).await),
        },
    };
    // hyper asks for the next request once the response has ended and the
    // connection is kept alive; a closed connection ends the task first.
    let idle = tokio::select! {
        biased;
        r = poll_fn(|cx| conn.poll_without_shutdown(cx)) => {
            ended(r);
            false
        }
        r = sender.ready() => r.is_ok(),
    };
    if !idle {
        return;
    }
    // With no sender left, hyper's dispatcher finishes without closing the
    // stream, and hands it back with whatever it had read past the response.
    drop(sender);
    if poll_fn(|cx| conn.poll_without_shutdown(cx)).await.is_err() {
        return;
    }
    let parts = conn.into_parts();
    if !parts.read_buf.is_empty() {
        // Bytes nobody asked for: the connection is not used again.
        return;
    }
    if let Some(pool) = pool.upgrade() {
        pool.put(addr, tag, parts.io.into_inner(), Instant::now());
    }
}
