//! The upstream client: pooled connections to one upstream, with its
//! `connect_timeout` and protocol. One per upstream, owned by its live state.

use super::body::Body;
use super::error::ProxyError;
use crate::config::{Protocol, Scheme, UpstreamConfig};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::time::Duration;

/// How an upstream is reached; a reload that changes any of these gets a new
/// pool, one that changes none keeps the warm connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKey {
    scheme: Scheme,
    protocol: Protocol,
    connect_timeout: Duration,
}

impl ClientKey {
    pub fn of(u: &UpstreamConfig) -> Self {
        ClientKey {
            scheme: u.url.scheme,
            protocol: u.protocol,
            connect_timeout: u.connect_timeout,
        }
    }
}

#[derive(Debug, Clone)]
pub struct UpstreamClient {
    pub key: ClientKey,
    inner: Client<HttpConnector, Body>,
}

impl UpstreamClient {
    pub fn new(u: &UpstreamConfig) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(u.connect_timeout));
        http.set_nodelay(true);
        let mut b = Client::builder(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            // weir sets Host itself (rewritten, or preserved on request).
            .set_host(false);
        if matches!(u.protocol, Protocol::H2c | Protocol::Grpc) {
            b.http2_only(true);
        }
        UpstreamClient {
            key: ClientKey::of(u),
            inner: b.build(http),
        }
    }

    /// Sends one attempt. Errors are classified here, once, by type — never by
    /// matching message strings.
    pub async fn send(
        &self,
        req: http::Request<Body>,
    ) -> Result<http::Response<hyper::body::Incoming>, SendError> {
        self.inner.request(req).await.map_err(|e| {
            let hyper_err = find::<hyper::Error>(&e);
            let kind = if e.is_connect() {
                Failure::Connect
            } else if hyper_err.is_some_and(|h| h.is_canceled()) {
                // hyper handed the request back unsent (the pooled connection
                // closed first): nothing reached the upstream.
                Failure::NotSent
            } else if hyper_err.is_some_and(|h| h.is_user()) {
                // Our side failed: the client's request body broke off.
                Failure::ClientBody
            } else {
                Failure::Reset
            };
            SendError {
                kind,
                message: root_cause(&e),
            }
        })
    }
}

/// How an attempt failed before response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Refused, unreachable, DNS, connect timeout.
    Connect,
    /// The connection closed before any of the request was written.
    NotSent,
    /// The client's request body failed (the client went away mid-upload).
    ClientBody,
    /// The connection reset or closed after the request was (partly) written.
    Reset,
}

#[derive(Debug, Clone)]
pub struct SendError {
    pub kind: Failure,
    pub message: String,
}

impl SendError {
    pub fn into_proxy_error(self) -> ProxyError {
        match self.kind {
            Failure::Connect | Failure::NotSent => ProxyError::ConnectFailed(self.message),
            Failure::ClientBody => {
                ProxyError::BadRequest(format!("the request body broke off: {}", self.message))
            }
            Failure::Reset => ProxyError::UpstreamReset(self.message),
        }
    }
}

/// The first error of type `T` in `e`'s source chain.
fn find<'a, T: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(t) = c.downcast_ref::<T>() {
            return Some(t);
        }
        cur = c.source();
    }
    None
}

/// The innermost error's message: "Connection refused (os error 111)" rather
/// than "client error (Connect)".
fn root_cause(e: &hyper_util::client::legacy::Error) -> String {
    let mut cur: &dyn std::error::Error = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    let msg = cur.to_string();
    if msg.is_empty() {
        e.to_string()
    } else {
        msg
    }
}
