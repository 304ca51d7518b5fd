//! How an upstream's endpoints are reached (docs/reference/endpoints.md#connections):
//! its TLS, with ALPN by its protocol (`pool::io::FastTls`), and per
//! endpoint what speaks to it: the endpoint's HTTP/2 pool (`pool::h2`) for
//! an upstream that speaks HTTP/2, and, for an `https://` upstream on
//! `protocol = "auto"`, which protocol the endpoint chose by ALPN. HTTP/1.1
//! connections are the worker's (`pool::h1`), opened by the same dialler
//! (`pool::open`). One per endpoint (kept by `upstream::Endpoint`), rebuilt
//! only when how the upstream is reached changes. How a send failed
//! ([`SendError`]) is classified here; the request side turns it into
//! weir's error (`proxy::error`).
//!
//! The host an attempt names travels in its URI's authority: on an HTTP/2
//! connection it becomes `:authority` (a `Host` beside it is refused by
//! nginx, RFC 9113 §8.3.1), on HTTP/1.1 the `Host` field. The dialler
//! connects to the endpoint's address whatever the URI says, so a
//! preserved client host never changes where weir connects.

use crate::config::{Protocol, Scheme, UpstreamConfig};
use crate::upstream::pool::h2::{DialTo, H2Pool, CHOSE_H1, CHOSE_H2, CHOSE_NONE};
pub use crate::upstream::pool::io::FastTls;
pub use crate::upstream::send::{Body, BoxError, Failure, SendError, MAX_RESPONSE_HEAD};
use crate::upstream::Address;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How an upstream is reached; a reload that changes any of these gets a new
/// pool, one that changes none keeps the warm connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKey {
    scheme: Scheme,
    /// Where it connects (`host:port` of the upstream's `url`).
    authority: String,
    protocol: Protocol,
    connect_timeout: Duration,
    server_name: Option<String>,
    /// The bytes of the CA, client certificate and key files.
    tls_files: u64,
}

/// What an attempt to an endpoint goes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaks {
    /// HTTP/1.1 on the worker's connections: a cleartext `http1`/`auto`
    /// upstream, or TLS pinned to `http1`.
    H1,
    /// The endpoint's HTTP/2 pool: `h2c`, `grpc`, or an `auto` endpoint
    /// that chose `h2`.
    H2,
    /// An `auto` endpoint over TLS not dialled yet: the first connection's
    /// ALPN decides.
    Unknown,
}

#[derive(Debug, Clone)]
pub struct UpstreamClient {
    pub key: ClientKey,
    /// TLS for every connection to an `https://` upstream.
    pub tls: Option<Arc<FastTls>>,
    /// For an `https://` upstream pinned to `protocol = "http1"`: what the
    /// fast path's own TLS connections use (the same as `tls`).
    pub fast_tls: Option<Arc<FastTls>>,
    protocol: Protocol,
    connect_timeout: Duration,
    idle_timeout: Duration,
    meter: crate::metrics::meter::Meter,
    /// The endpoint's HTTP/2 pool ([`UpstreamClient::for_addr`]; none for
    /// an upstream that never speaks HTTP/2).
    h2: Option<H2Pool>,
    /// An `auto` endpoint over TLS: what it chose by ALPN (`CHOSE_*`).
    chose: Option<Arc<AtomicU8>>,
}

impl UpstreamClient {
    /// How `u` is reached; reads its TLS files. `meter` counts its
    /// connections and their bytes.
    pub fn new(u: &UpstreamConfig, meter: crate::metrics::meter::Meter) -> Result<Self, String> {
        let tls =
            crate::tls::client_config(u).map_err(|e| format!("upstream {:?}: {e}", u.name))?;
        let server_name = u.tls.as_ref().and_then(|t| t.server_name.clone());
        let upstream_tls = match u.url.scheme {
            Scheme::Https => Some(Arc::new(FastTls::new(u, &tls, server_name.as_deref())?)),
            Scheme::Http => None,
        };
        let fast_tls = upstream_tls
            .clone()
            .filter(|_| u.protocol == Protocol::Http1);
        Ok(UpstreamClient {
            key: ClientKey {
                scheme: u.url.scheme,
                authority: u.url.authority.to_string(),
                protocol: u.protocol,
                connect_timeout: u.connect_timeout,
                server_name,
                tls_files: tls.fingerprint,
            },
            tls: upstream_tls,
            fast_tls,
            protocol: u.protocol,
            connect_timeout: u.connect_timeout,
            idle_timeout: u.idle_timeout,
            meter,
            h2: None,
            chose: None,
        })
    }

    /// The same client for `addr`, one of the upstream's endpoints: with a
    /// pool of its own when it may speak HTTP/2.
    pub fn for_addr(&self, addr: Address) -> UpstreamClient {
        let auto_tls = self.protocol == Protocol::Auto && self.tls.is_some();
        let h2_only = matches!(self.protocol, Protocol::H2c | Protocol::Grpc);
        let chose = auto_tls.then(|| Arc::new(AtomicU8::new(CHOSE_NONE)));
        let h2 = (h2_only || auto_tls).then(|| {
            let dial = DialTo {
                addr,
                tls: self.tls.clone(),
                connect_timeout: self.connect_timeout,
                meter: self.meter.clone(),
                chose: chose.clone(),
            };
            H2Pool::new(dial, self.idle_timeout)
        });
        UpstreamClient {
            h2,
            chose,
            ..self.clone()
        }
    }

    /// The key a config would give, without building anything but the TLS files' fingerprint.
    pub fn key_of(u: &UpstreamConfig) -> Result<ClientKey, String> {
        Ok(ClientKey {
            scheme: u.url.scheme,
            authority: u.url.authority.to_string(),
            protocol: u.protocol,
            connect_timeout: u.connect_timeout,
            server_name: u.tls.as_ref().and_then(|t| t.server_name.clone()),
            tls_files: crate::tls::client_config(u)?.fingerprint,
        })
    }

    /// What an attempt to this endpoint goes over now.
    pub fn speaks(&self) -> Speaks {
        match (&self.chose, &self.h2) {
            (Some(c), _) => match c.load(Ordering::Relaxed) {
                CHOSE_H2 => Speaks::H2,
                CHOSE_H1 => Speaks::H1,
                _ => Speaks::Unknown,
            },
            (None, Some(_)) => Speaks::H2,
            (None, None) => Speaks::H1,
        }
    }

    /// An `auto` endpoint over TLS: what it speaks is what it chose.
    pub fn is_auto(&self) -> bool {
        self.chose.is_some()
    }

    /// Whether the endpoint's HTTP/2 pool has a connection with room for
    /// one more stream now.
    pub fn h2_has_room(&self) -> bool {
        self.h2.as_ref().is_some_and(|p| p.has_room())
    }

    /// What a new connection to an `auto` endpoint chose by ALPN: it is
    /// what the next attempts take.
    pub(crate) fn learn(&self, h2: bool) {
        if let Some(c) = &self.chose {
            c.store(if h2 { CHOSE_H2 } else { CHOSE_H1 }, Ordering::Relaxed);
        }
    }

    /// Gives the endpoint's HTTP/2 pool a connection an `auto` dial opened
    /// and found `h2` on.
    pub(crate) async fn adopt(
        &self,
        io: crate::upstream::pool::UpstreamIo,
    ) -> Result<(), SendError> {
        match &self.h2 {
            Some(pool) => pool.adopt(io).await,
            None => Err(SendError::new(Failure::NotSent, "no HTTP/2 pool")),
        }
    }

    /// Sends one attempt on the endpoint's HTTP/2 pool. Errors are
    /// classified here, once, by type — never by matching message strings.
    pub async fn send(
        &self,
        req: http::Request<Body>,
    ) -> Result<http::Response<crate::upstream::pool::h2::H2Body>, SendError> {
        match &self.h2 {
            Some(pool) => pool.send(req).await,
            None => Err(SendError::new(
                Failure::NotSent,
                "the endpoint speaks HTTP/1.1: no HTTP/2 pool",
            )),
        }
    }
}
