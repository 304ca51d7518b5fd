//! The upstream client: pooled connections to one upstream, with its
//! `connect_timeout`, its protocol and, for `https://`, its TLS
//! configuration (ALPN offers h2 and http/1.1 unless the protocol pins one;
//! hyper uses h2 when the upstream picks it). One per upstream, owned by its
//! live state and rebuilt only when how the upstream is reached changes.

use super::body::Body;
use super::error::ProxyError;
use crate::config::{Protocol, Scheme, UpstreamConfig};
use hyper_rustls::HttpsConnector;
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
    server_name: Option<String>,
    /// The bytes of the CA, client certificate and key files.
    tls_files: u64,
}

#[derive(Debug, Clone)]
pub struct UpstreamClient {
    pub key: ClientKey,
    inner: Client<HttpsConnector<HttpConnector>, Body>,
}

impl UpstreamClient {
    /// Builds the pool; reads the upstream's TLS files.
    pub fn new(u: &UpstreamConfig) -> Result<Self, String> {
        let tls =
            crate::tls::client_config(u).map_err(|e| format!("upstream {:?}: {e}", u.name))?;
        let server_name = u.tls.as_ref().and_then(|t| t.server_name.clone());
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(u.connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*tls.config).clone())
            .https_or_http();
        let builder = match &server_name {
            Some(n) => {
                let name = rustls::pki_types::ServerName::try_from(n.clone())
                    .map_err(|e| format!("upstream {:?}: tls.server_name {n:?}: {e}", u.name))?;
                builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
            }
            None => builder,
        };
        // ALPN by protocol: both (h2 preferred), http/1.1 only, or h2 only.
        let connector = match u.protocol {
            Protocol::Auto => builder.enable_http1().enable_http2().wrap_connector(http),
            Protocol::Http1 => builder.enable_http1().wrap_connector(http),
            Protocol::H2c | Protocol::Grpc => builder.enable_http2().wrap_connector(http),
        };
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
        Ok(UpstreamClient {
            key: ClientKey {
                scheme: u.url.scheme,
                protocol: u.protocol,
                connect_timeout: u.connect_timeout,
                server_name,
                tls_files: tls.fingerprint,
            },
            inner: b.build(connector),
        })
    }

    /// The key a config would give, without building anything but the TLS files' fingerprint.
    pub fn key_of(u: &UpstreamConfig) -> Result<ClientKey, String> {
        Ok(ClientKey {
            scheme: u.url.scheme,
            protocol: u.protocol,
            connect_timeout: u.connect_timeout,
            server_name: u.tls.as_ref().and_then(|t| t.server_name.clone()),
            tls_files: crate::tls::client_config(u)?.fingerprint,
        })
    }

    /// Sends one attempt. Errors are classified here, once, by type — never by
    /// matching message strings.
    pub async fn send(
        &self,
        req: http::Request<Body>,
    ) -> Result<http::Response<hyper::body::Incoming>, SendError> {
        self.inner.request(req).await.map_err(|e| {
            let tls = crate::tls::describe_failure(&e);
            // A TLS failure means the upstream never processed the request,
            // even when (TLS 1.3, a missing client certificate) its alert
            // only arrives after the request was written.
            let kind = if e.is_connect() || tls.is_some() {
                Failure::Connect
            } else {
                find::<hyper::Error>(&e).map_or(Failure::Reset, Failure::of)
            };
            SendError {
                kind,
                message: tls.clone().unwrap_or_else(|| root_cause(&e)),
                tls: tls.is_some(),
            }
        })
    }
}

/// How an attempt failed before response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Refused, unreachable, DNS, connect timeout, TLS handshake.
    Connect,
    /// The connection closed before any of the request was written.
    NotSent,
    /// The client's request body failed (the client went away mid-upload).
    ClientBody,
    /// The connection reset or closed after the request was (partly) written.
    Reset,
}

impl Failure {
    /// The failure a hyper error stands for, once the connection is up.
    pub fn of(e: &hyper::Error) -> Failure {
        if e.is_canceled() {
            // hyper handed the request back unsent (the connection closed
            // first): nothing reached the upstream.
            Failure::NotSent
        } else if e.is_user() {
            // Our side failed: the client's request body broke off.
            Failure::ClientBody
        } else {
            Failure::Reset
        }
    }
}

#[derive(Debug, Clone)]
pub struct SendError {
    pub kind: Failure,
    pub message: String,
    /// A TLS handshake or certificate failure.
    pub tls: bool,
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
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
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
