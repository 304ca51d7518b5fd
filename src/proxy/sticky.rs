//! Held upstream connections (`HeldConn`), on the general path to a
//! cleartext HTTP/1.1 upstream: each client connection keeps the upstream connection it used
//! last and sends its next request on it, without a shared pool in between.
//! (Not to be confused with `proxy::fast`, which serves plain HTTP/1.1
//! clients without hyper; this serves the requests the general path reads.)
//!
//! An HTTP/1.1 client connection carries one request at a time, so the
//! upstream connection it holds is free again by the time the next request
//! arrives. Measured (bench/RESULTS.md#how-it-got-there), the shared pool's checkout —
//! hashing its key, locking, a spawned task per response — was a large share
//! of weir's CPU per request. Anything else — TLS, HTTP/2, a host name to
//! resolve, or a held connection still busy (an HTTP/2 client's concurrent
//! streams) — takes the endpoint's shared pool in
//! [`crate::upstream::client`].

use super::body::Body;
use crate::state::UpstreamState;
use crate::upstream::client::{Failure, SendError};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What one client connection holds: a connection per endpoint it used
/// lately, at most [`HELD_PER_CLIENT`].
#[derive(Debug, Default)]
pub(crate) struct ConnCtx {
    held: Mutex<Vec<HeldConn>>,
}

/// Endpoints one client connection keeps a connection to: with several
/// replicas, each request may go to another, and a connection dropped on
/// every change of endpoint would be a new connection per request.
const HELD_PER_CLIENT: usize = 4;

#[derive(Debug)]
struct HeldConn {
    /// Which upstream (by identity of its live state) the connection goes to.
    upstream: usize,
    /// Which of its endpoints.
    addr: SocketAddr,
    sender: SendRequest<Body>,
}

fn id(state: &Arc<UpstreamState>) -> usize {
    Arc::as_ptr(state) as usize
}

impl ConnCtx {
    /// The held connection to `state`'s endpoint at `addr`, if it is there
    /// and free (a busy one stays held; the caller uses another).
    pub(crate) fn take(
        &self,
        state: &Arc<UpstreamState>,
        addr: SocketAddr,
    ) -> Option<SendRequest<Body>> {
        let mut held = self.held.lock().ok()?;
        held.retain(|h| !h.sender.is_closed());
        let at = held
            .iter()
            .position(|h| h.upstream == id(state) && h.addr == addr && h.sender.is_ready())?;
        Some(held.swap_remove(at).sender)
    }

    /// Keeps `sender` for this client connection's next request to `addr`
    /// (the oldest held connection makes room).
    pub(crate) fn keep(
        &self,
        state: &Arc<UpstreamState>,
        addr: SocketAddr,
        sender: SendRequest<Body>,
    ) {
        if let Ok(mut held) = self.held.lock() {
            if held.len() >= HELD_PER_CLIENT {
                held.remove(0);
            }
            held.push(HeldConn {
                upstream: id(state),
                addr,
                sender,
            });
        }
    }
}

/// HeldConn upstream connections per upstream, all workers together. Beyond
/// this, client connections share the pool: an application with thousands
/// of connections must not get thousands of upstream connections (measured:
/// ~70 KiB of memory each, and an upstream that did not ask for them).
pub(crate) const MAX_HELD: usize = 128;

/// Opens a new HTTP/1.1 connection to `addr` in a place [`reserve`]d in
/// `live`; the place is given back when the connection closes (or fails).
pub(crate) async fn connect(
    addr: SocketAddr,
    timeout: Duration,
    live: Arc<std::sync::atomic::AtomicUsize>,
    meter: &crate::metrics::meter::Meter,
) -> Result<SendRequest<Body>, SendError> {
    let r = open(addr, timeout, live.clone(), meter).await;
    if r.is_err() {
        live.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
    r
}

/// Takes one of the [`MAX_HELD`] places in `live`, if one is free.
pub(crate) fn reserve(live: &std::sync::atomic::AtomicUsize) -> bool {
    use std::sync::atomic::Ordering;
    if live.fetch_add(1, Ordering::AcqRel) < MAX_HELD {
        true
    } else {
        live.fetch_sub(1, Ordering::AcqRel);
        false
    }
}

async fn open(
    addr: SocketAddr,
    timeout: Duration,
    live: Arc<std::sync::atomic::AtomicUsize>,
    meter: &crate::metrics::meter::Meter,
) -> Result<SendRequest<Body>, SendError> {
    let fail = |kind, message: String| SendError {
        kind,
        message,
        tls: false,
    };
    let stream = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(fail(Failure::Connect, e.to_string())),
        Err(_) => {
            return Err(fail(
                Failure::Connect,
                format!("connect timed out after {timeout:?}"),
            ))
        }
    };
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .preserve_header_case(true)
        .max_buf_size(super::MAX_RESPONSE_HEAD)
        .handshake(TokioIo::new(crate::metrics::meter::Metered::new(
            stream, meter,
        )))
        .await
        .map_err(|e| fail(Failure::Connect, e.to_string()))?;
    tokio::spawn(async move {
        // with_upgrades: a WebSocket handshake may take this connection over.
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
        live.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    });
    Ok(sender)
}

/// Sends on `sender`; classifies a failure as the shared pool's client does.
pub(crate) async fn send(
    sender: &mut SendRequest<Body>,
    req: http::Request<Body>,
) -> Result<http::Response<hyper::body::Incoming>, SendError> {
    sender.send_request(req).await.map_err(|e| SendError {
        kind: Failure::of(&e),
        message: crate::upstream::send::root_cause(&e),
        tls: false,
    })
}
