//! Every connection weir keeps to an upstream (docs/reference/endpoints.md#connections).
//!
//! - [`h1`]: idle HTTP/1.1 connections, cleartext or TLS, one pool per
//!   worker, and the one checkout both data paths take them from: the fast
//!   path writes its request on the raw stream; the general path runs
//!   hyper's HTTP/1.1 client over it for as long as it holds it ([`lease`])
//!   and gives the stream back when the response has ended and the
//!   connection stays open.
//! - [`held`]: a client connection's own leases (the general path keeps the
//!   connection it used last, per endpoint, for its next request); they go
//!   back to [`h1`]'s pool when the client connection ends.
//! - [`h2`]: the HTTP/2 connections of an endpoint of an upstream that
//!   speaks HTTP/2 (`h2c`, `grpc`, or `auto` over TLS where the endpoint
//!   chose `h2` by ALPN).
//!
//! Every one of them is opened by [`open`], the one dialler.

pub(crate) mod h1;
pub mod h2;
pub(crate) mod held;
pub(crate) mod io;
pub(crate) mod lease;

pub(crate) use h1::H1Pool;
pub(crate) use io::UpstreamIo;

use crate::metrics::meter::Metered;
use crate::upstream::send::{Failure, SendError};
use crate::upstream::Address;
use io::FastTls;
use std::time::Duration;
use tokio::net::{TcpStream, UnixStream};

/// The one dialler of upstream connections, of either protocol: a new
/// connection to `addr`, and its TLS handshake when `tls` says (ALPN by
/// the upstream's protocol: [`UpstreamIo::chose_h2`] tells what the
/// upstream chose), each within `timeout`; the socket is
/// metered by `meter`. A TLS failure is [`SendError::tls`], naming its cause
/// (the caller logs it once per cause).
pub(crate) async fn open(
    addr: Address,
    timeout: Duration,
    tls: Option<&FastTls>,
    meter: &crate::metrics::meter::Meter,
) -> Result<UpstreamIo, SendError> {
    let failed = |why: String| SendError::new(Failure::Connect, why);
    let addr = match addr {
        Address::Tcp(addr) => addr,
        Address::Unix(path) => {
            // A socket file: cleartext only (validation refuses TLS to one).
            return match tokio::time::timeout(timeout, UnixStream::connect(path)).await {
                Ok(Ok(s)) => Ok(UpstreamIo::Unix(Metered::new(s, meter))),
                Ok(Err(e)) => Err(failed(format!("{}: {e}", path.display()))),
                Err(_) => Err(failed(format!("connect timed out after {timeout:?}"))),
            };
        }
    };
    let s = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(failed(e.to_string())),
        Err(_) => return Err(failed(format!("connect timed out after {timeout:?}"))),
    };
    let _ = s.set_nodelay(true);
    let s = Metered::new(s, meter);
    let Some(tls) = tls else {
        return Ok(UpstreamIo::Plain(s));
    };
    match tokio::time::timeout(timeout, tls.connector.connect(tls.name.clone(), s)).await {
        Ok(Ok(t)) => Ok(UpstreamIo::Tls(Box::new(t))),
        Ok(Err(e)) => Err(SendError::tls(
            crate::tls::describe_failure(&e).unwrap_or_else(|| e.to_string()),
        )),
        Err(_) => Err(failed(format!("TLS handshake timed out after {timeout:?}"))),
    }
}

/// A TCP connection for a `CONNECT` tunnel to `target` (its name resolved
/// here), made by `give_up`: it becomes the client's byte stream and is
/// never pooled. `Ok(None)`: `give_up` came first.
pub(crate) async fn tunnel(
    target: &(String, u16),
    give_up: tokio::time::Instant,
) -> std::io::Result<Option<tokio::net::TcpStream>> {
    match tokio::time::timeout_at(give_up, tokio::net::TcpStream::connect(target)).await {
        Ok(r) => r.map(Some),
        Err(_) => Ok(None),
    }
}
