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
//! - [`h2`]: the HTTP/2 connections of an endpoint of an HTTP/2-only
//!   upstream.
//!
//! What still goes through hyper-util's pool (`upstream::client`): an
//! `https://` upstream on `protocol = "auto"`, where ALPN picks HTTP/2 or
//! HTTP/1.1 per connection, and a name that has not resolved yet.

pub(crate) mod h1;
pub mod h2;
pub(crate) mod held;
pub(crate) mod io;
pub(crate) mod lease;

pub(crate) use h1::H1Pool;
pub(crate) use io::UpstreamIo;

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
