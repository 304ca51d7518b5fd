//! What every upstream pool dials through: hyper-util's TCP connector,
//! metered, under TLS when the scheme says so, always dialling one fixed
//! target whatever URI a request names.

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use std::task::{Context, Poll};

/// What every pool dials through: a fixed target, TLS when the scheme says so.
pub(crate) type Connector = Dial<HttpsConnector<Tcp>>;

/// The TCP connector under TLS: hyper-util's, each connection metered.
pub(crate) type Tcp = crate::metrics::meter::MeteredConnector<HttpConnector>;

/// A connector that always dials `target`, whatever URI it is asked for: the
/// URI's authority is the host the request names (`preserve_host`), not an
/// address. TLS's server name comes from `target` too (or `tls.server_name`).
#[derive(Debug, Clone)]
pub(crate) struct Dial<C> {
    pub(crate) inner: C,
    pub(crate) target: http::Uri,
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
