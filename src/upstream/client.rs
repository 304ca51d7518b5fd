//! The upstream client: pooled connections to one endpoint, with its
//! upstream's `connect_timeout`, protocol and, for `https://`, TLS
//! configuration (ALPN offers h2 and http/1.1 unless the protocol pins one;
//! hyper uses h2 when the upstream picks it). One per endpoint (kept by
//! `upstream::Endpoint`), rebuilt only when how the upstream is reached
//! changes. How a send failed ([`SendError`]) is classified here; the
//! request side turns it into weir's error (`proxy::error`).
//!
//! The host an attempt names travels in its URI's authority, never in a
//! `Host` header: on an HTTP/2 connection it becomes `:authority` (a `Host`
//! beside it is refused by nginx, RFC 9113 §8.3.1), on HTTP/1.1 hyper-util
//! writes it as `Host`. Which of the two a connection speaks is known only
//! after connecting (ALPN), so the choice is left to that point. The
//! connector dials the upstream's configured address whatever the URI says,
//! so a preserved client host never changes where weir connects.

use crate::config::{Protocol, Scheme, UpstreamConfig};
use crate::upstream::connector::{Connector, Dial, Tcp};
pub use crate::upstream::pool::io::FastTls;
use crate::upstream::send::classify_as;
pub use crate::upstream::send::{Body, BoxError, Failure, SendError, MAX_RESPONSE_HEAD};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioTimer};
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

#[derive(Debug, Clone)]
pub struct UpstreamClient {
    pub key: ClientKey,
    inner: ClientPool,
    /// What [`UpstreamClient::for_addr`] builds an endpoint's pool from: the
    /// client settings, and a connector whose TLS server name is fixed (the
    /// `url`'s host or `tls.server_name`), since an endpoint is dialled by
    /// its address.
    per_endpoint: std::sync::Arc<PerEndpoint>,
    scheme: &'static str,
    /// For an `https://` upstream pinned to `protocol = "http1"`: what the
    /// fast path's own TLS connections use.
    pub fast_tls: Option<std::sync::Arc<FastTls>>,
}

/// How a client sends: hyper-util's pool (HTTP/1.1, and `auto`, where ALPN
/// decides per connection), or weir's own HTTP/2 pool for an upstream that
/// speaks HTTP/2 only ([`crate::upstream::pool::h2`]).
#[derive(Debug, Clone)]
enum ClientPool {
    Legacy(Box<Client<Connector, Body>>),
    H2(crate::upstream::pool::h2::H2Pool),
}

/// How an endpoint's pool is built.
#[derive(Debug)]
struct PerEndpoint {
    legacy: hyper_util::client::legacy::Builder,
    connector: HttpsConnector<Tcp>,
    /// HTTP/2 only: weir's own pool.
    h2_only: bool,
    idle_timeout: Duration,
}

impl PerEndpoint {
    fn build(&self, connector: Connector) -> ClientPool {
        if self.h2_only {
            ClientPool::H2(crate::upstream::pool::h2::H2Pool::new(
                connector,
                self.idle_timeout,
            ))
        } else {
            ClientPool::Legacy(Box::new(self.legacy.build(connector)))
        }
    }
}

impl UpstreamClient {
    /// Builds the pool; reads the upstream's TLS files. `meter` counts its
    /// connections and their bytes.
    pub fn new(u: &UpstreamConfig, meter: crate::metrics::meter::Meter) -> Result<Self, String> {
        let tls =
            crate::tls::client_config(u).map_err(|e| format!("upstream {:?}: {e}", u.name))?;
        let server_name = u.tls.as_ref().and_then(|t| t.server_name.clone());
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(u.connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let http = crate::metrics::meter::MeteredConnector { inner: http, meter };
        let base = || {
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config((*tls.config).clone())
                .https_or_http()
        };
        let builder = base();
        // An endpoint is dialled by its address: the name to verify is the
        // url's host, unless `tls.server_name` says otherwise.
        let fixed_name = server_name.clone().unwrap_or_else(|| {
            u.url
                .host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string()
        });
        let fixed_name = rustls::pki_types::ServerName::try_from(fixed_name.clone())
            .map_err(|e| format!("upstream {:?}: TLS server name {fixed_name:?}: {e}", u.name))?;
        let endpoint_builder = base()
            .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(fixed_name));
        let builder = match &server_name {
            Some(n) => {
                let name = rustls::pki_types::ServerName::try_from(n.clone())
                    .map_err(|e| format!("upstream {:?}: tls.server_name {n:?}: {e}", u.name))?;
                builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
            }
            None => builder,
        };
        // ALPN by protocol: both (h2 preferred), http/1.1 only, or h2 only.
        let alpn = |b: hyper_rustls::HttpsConnectorBuilder<
            hyper_rustls::builderstates::WantsProtocols1,
        >,
                    http| match u.protocol {
            Protocol::Auto => b.enable_http1().enable_http2().wrap_connector(http),
            Protocol::Http1 => b.enable_http1().wrap_connector(http),
            Protocol::H2c | Protocol::Grpc => b.enable_http2().wrap_connector(http),
        };
        let endpoint_connector = alpn(endpoint_builder, http.clone());
        let connector = alpn(builder, http);
        let scheme = match u.url.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        let target = http::Uri::builder()
            .scheme(scheme)
            .authority(u.url.authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| format!("upstream {:?}: url: {e}", u.name))?;
        let connector = Dial {
            inner: connector,
            target,
        };
        let mut b = Client::builder(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            // The same response-head limit as the fast path.
            .http1_max_buf_size(MAX_RESPONSE_HEAD)
            // Header names as the client wrote them (hyper keeps the case in
            // the request's extensions); responses keep the upstream's.
            .http1_preserve_header_case(true)
            // HTTP/1.1 connections get `Host` from the URI's authority; on
            // HTTP/2 it is `:authority` alone (see the module docs).
            .set_host(true);
        let per_endpoint = PerEndpoint {
            legacy: b,
            connector: endpoint_connector,
            h2_only: matches!(u.protocol, Protocol::H2c | Protocol::Grpc),
            idle_timeout: u.idle_timeout,
        };
        let fast_tls = match (u.url.scheme, u.protocol) {
            (Scheme::Https, Protocol::Http1) => Some(std::sync::Arc::new(FastTls::new(
                u,
                &tls,
                server_name.as_deref(),
            )?)),
            _ => None,
        };
        Ok(UpstreamClient {
            key: ClientKey {
                scheme: u.url.scheme,
                authority: u.url.authority.to_string(),
                protocol: u.protocol,
                connect_timeout: u.connect_timeout,
                server_name,
                tls_files: tls.fingerprint,
            },
            inner: per_endpoint.build(connector),
            per_endpoint: std::sync::Arc::new(per_endpoint),
            scheme,
            fast_tls,
        })
    }

    /// The same client, with a pool of its own, dialling `addr` (one of the
    /// upstream's endpoints) whatever a request names.
    pub fn for_addr(&self, addr: std::net::SocketAddr) -> UpstreamClient {
        let target = http::Uri::builder()
            .scheme(self.scheme)
            .authority(addr.to_string())
            .path_and_query("/")
            .build()
            .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1/"));
        UpstreamClient {
            key: self.key.clone(),
            inner: self.per_endpoint.build(Dial {
                inner: self.per_endpoint.connector.clone(),
                target,
            }),
            per_endpoint: self.per_endpoint.clone(),
            scheme: self.scheme,
            fast_tls: self.fast_tls.clone(),
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

    /// Sends one attempt. Errors are classified here, once, by type — never by
    /// matching message strings.
    pub async fn send(
        &self,
        req: http::Request<Body>,
    ) -> Result<http::Response<hyper::body::Incoming>, SendError> {
        match &self.inner {
            ClientPool::H2(pool) => pool.send(req).await,
            ClientPool::Legacy(client) => client
                .request(req)
                .await
                .map_err(|e| classify_as(&e, e.is_connect())),
        }
    }
}
