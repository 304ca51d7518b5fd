//! The target a request goes upstream with: the client's, mapped onto the
//! upstream's URL (`strip_prefix`, its base path), and the host it names.

use crate::proxy::error::ProxyError;
use crate::proxy::route::upstream_path;
use crate::proxy::Upstream;
use http::header;
use http::uri::Authority;
use http::Uri;

/// The host the client named (its target's authority, else `Host`), for
/// `preserve_host`; `None` when it named none.
pub(super) fn client_authority(
    parts: &http::request::Parts,
) -> Result<Option<Authority>, ProxyError> {
    if let Some(a) = parts.uri.authority() {
        return Ok(Some(a.clone()));
    }
    let Some(h) = parts.headers.get(header::HOST) else {
        return Ok(None);
    };
    Authority::try_from(h.as_bytes())
        .map(Some)
        .map_err(|_| ProxyError::BadRequest("the Host header is not a valid host[:port]".into()))
}

/// Maps the client's target onto the upstream: `strip_prefix`, then the
/// upstream URL's base path; the query is kept as sent. The authority is
/// `host` when given (`preserve_host`), else the upstream URL's. `OPTIONS *`
/// (the asterisk form, RFC 9112 §3.2.4; from an HTTP/2 client, `:path` `*`,
/// RFC 9113 §8.3.1, whose URI has an authority too) asks about the server
/// as a whole: it goes upstream as `*`, not mapped onto a path; any other
/// method with that target is a 400.
pub(super) fn upstream_uri(
    up: &Upstream,
    method: &http::Method,
    original: &Uri,
    host: Option<Authority>,
) -> Result<Uri, ProxyError> {
    let cfg = &up.config;
    let authority = host.unwrap_or_else(|| cfg.url.authority.clone());
    let path = original.path();
    if original.path_and_query().map(|p| p.as_str()) == Some("*") {
        if method != http::Method::OPTIONS {
            return Err(ProxyError::BadRequest(
                "the target `*` is only for OPTIONS".into(),
            ));
        }
        return Uri::builder()
            .scheme(up.scheme.clone())
            .authority(authority)
            .path_and_query("*")
            .build()
            .map_err(|e| ProxyError::BadRequest(format!("cannot forward `OPTIONS *`: {e}")));
    }
    // The common case, nothing to rewrite: reuse the target as it came
    // (shared bytes, no allocation).
    if cfg.url.base_path.is_empty() && !cfg.strip_prefix && path.starts_with('/') {
        if let Some(pq) = original.path_and_query() {
            return Uri::builder()
                .scheme(up.scheme.clone())
                .authority(authority)
                .path_and_query(pq.clone())
                .build()
                .map_err(|e| {
                    ProxyError::BadRequest(format!(
                        "cannot map the request target onto the upstream: {e}"
                    ))
                });
        }
    }
    let (base, slash, rest) = upstream_path(cfg, path);
    let mut pq = String::with_capacity(base.len() + rest.len() + 16);
    pq.push_str(base);
    pq.push_str(slash);
    pq.push_str(rest);
    if let Some(q) = original.query() {
        pq.push('?');
        pq.push_str(q);
    }
    Uri::builder()
        .scheme(up.scheme.clone())
        .authority(authority)
        .path_and_query(pq)
        .build()
        .map_err(|e| {
            ProxyError::BadRequest(format!(
                "cannot map the request target onto the upstream: {e}"
            ))
        })
}
