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
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::task::{Context, Poll};
use std::time::Duration;

/// A body's error, on either side of the proxy.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type weir hands to hyper, in both directions (the request
/// side names it `proxy::body::Body`).
pub type Body = BoxBody<Bytes, BoxError>;

/// The largest response head weir reads from an upstream.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;

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
    inner: Client<Dial<HttpsConnector<Tcp>>, Body>,
    /// What [`UpstreamClient::for_addr`] builds an endpoint's pool from: the
    /// client settings, and a connector whose TLS server name is fixed (the
    /// `url`'s host or `tls.server_name`), since an endpoint is dialled by
    /// its address.
    per_endpoint: std::sync::Arc<(hyper_util::client::legacy::Builder, HttpsConnector<Tcp>)>,
    scheme: &'static str,
    /// For an `https://` upstream pinned to `protocol = "http1"`: what the
    /// fast path's own TLS connections use.
    pub fast_tls: Option<std::sync::Arc<FastTls>>,
}

/// TLS for the fast path's own upstream connections: the upstream's client
/// configuration with ALPN `http/1.1` alone (the same roots, client
/// certificate and session cache), the name to verify, and a tag that keeps
/// its pooled connections apart from any other upstream's at the same address.
pub struct FastTls {
    pub connector: tokio_rustls::TlsConnector,
    pub name: rustls::pki_types::ServerName<'static>,
    pub tag: u64,
}

impl std::fmt::Debug for FastTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastTls")
            .field("name", &self.name)
            .field("tag", &self.tag)
            .finish_non_exhaustive()
    }
}

impl FastTls {
    fn new(
        u: &UpstreamConfig,
        tls: &crate::config::files::ClientTls,
        name: Option<&str>,
    ) -> Result<Self, String> {
        let host = u.url.host.trim_start_matches('[').trim_end_matches(']');
        let name = name.unwrap_or(host).to_string();
        let server = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| format!("upstream {:?}: TLS server name {name:?}: {e}", u.name))?;
        let mut config = (*tls.config).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tag = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (tls.fingerprint, &name, &u.name).hash(&mut h);
            h.finish() | 1
        };
        Ok(FastTls {
            connector: tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)),
            name: server,
            tag,
        })
    }
}

/// The TCP connector under TLS: hyper-util's, each connection metered.
type Tcp = crate::upstream::meter::MeteredConnector<HttpConnector>;

/// A connector that always dials `target`, whatever URI it is asked for: the
/// URI's authority is the host the request names (`preserve_host`), not an
/// address. TLS's server name comes from `target` too (or `tls.server_name`).
#[derive(Debug, Clone)]
pub(crate) struct Dial<C> {
    inner: C,
    target: http::Uri,
}

impl<C: tower_service::Service<http::Uri>> tower_service::Service<http::Uri> for Dial<C> {
    type Response = C::Response;
    type Error = C::Error;
    type Future = C::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, _named: http::Uri) -> Self::Future {
        self.inner.call(self.target.clone())
    }
}

impl UpstreamClient {
    /// Builds the pool; reads the upstream's TLS files. `meter` counts its
    /// connections and their bytes.
    pub fn new(u: &UpstreamConfig, meter: crate::upstream::meter::Meter) -> Result<Self, String> {
        let tls =
            crate::tls::client_config(u).map_err(|e| format!("upstream {:?}: {e}", u.name))?;
        let server_name = u.tls.as_ref().and_then(|t| t.server_name.clone());
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(u.connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let http = crate::upstream::meter::MeteredConnector { inner: http, meter };
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
        if matches!(u.protocol, Protocol::H2c | Protocol::Grpc) {
            b.http2_only(true);
        }
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
            inner: b.build(connector),
            per_endpoint: std::sync::Arc::new((b, endpoint_connector)),
            scheme,
            fast_tls,
        })
    }

    /// The same client, with a pool of its own, dialling `addr` (one of the
    /// upstream's endpoints) whatever a request names.
    pub fn for_addr(&self, addr: std::net::SocketAddr) -> UpstreamClient {
        let (builder, connector) = &*self.per_endpoint;
        let target = http::Uri::builder()
            .scheme(self.scheme)
            .authority(addr.to_string())
            .path_and_query("/")
            .build()
            .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1/"));
        UpstreamClient {
            key: self.key.clone(),
            inner: builder.build(Dial {
                inner: connector.clone(),
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
        self.inner.request(req).await.map_err(|e| {
            let tls = crate::tls::describe_failure(&e);
            // A TLS failure means the upstream never processed the request,
            // even when (TLS 1.3, a missing client certificate) its alert
            // only arrives after the request was written.
            let kind = if e.is_connect() || tls.is_some() {
                Failure::Connect
            } else if find::<h2::Error>(&e).is_some_and(not_processed) {
                Failure::NotProcessed
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
    /// An HTTP/2 upstream refused the stream unprocessed: it was above the
    /// last stream id of the upstream's GOAWAY, or reset with
    /// `REFUSED_STREAM` (RFC 9113 §6.8, §8.7). The upstream is healthy and
    /// did nothing with it.
    NotProcessed,
    /// The upstream's response could not be parsed (garbled, or a head too
    /// large): it answered, badly.
    BadResponse,
}

/// Whether an HTTP/2 error says the upstream did not process the stream. h2
/// fails every stream above a received GOAWAY's last-stream-id with the
/// GOAWAY's own error (its reason, often `NO_ERROR`); streams at or below it
/// that die later fail with an I/O error instead. So a GOAWAY error from the
/// peer on a stream always means "not processed", whatever its reason.
fn not_processed(e: &h2::Error) -> bool {
    e.is_remote()
        && (e.is_go_away() || (e.is_reset() && e.reason() == Some(h2::Reason::REFUSED_STREAM)))
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
        } else if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
            Failure::BadResponse
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

impl Failure {
    /// The outcome this failure is for the retry decision and the breaker:
    /// the one classification, on either path (docs/reference/retries.md#classifying-an-attempt).
    pub fn outcome(self) -> crate::policy::Outcome {
        use crate::policy::Outcome;
        match self {
            Failure::Connect => Outcome::ConnectFailure,
            Failure::NotSent => Outcome::Reset {
                request_sent: false,
            },
            Failure::ClientBody => Outcome::ClientGone,
            Failure::Reset => Outcome::Reset { request_sent: true },
            Failure::NotProcessed => Outcome::RefusedStream,
            Failure::BadResponse => Outcome::BadResponse,
        }
    }
}

impl SendError {
    /// A failure weir found itself (not from a hyper error).
    pub fn new(kind: Failure, message: impl Into<String>) -> Self {
        SendError {
            kind,
            message: message.into(),
            tls: false,
        }
    }

    /// A TLS handshake that failed: the upstream never saw the request.
    pub fn tls(message: impl Into<String>) -> Self {
        SendError {
            kind: Failure::Connect,
            message: message.into(),
            tls: true,
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
pub(crate) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
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
