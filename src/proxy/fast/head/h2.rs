//! The head of a request the fast path sends to an HTTP/2 upstream: the
//! HTTP/1.1 head [`super::write`] wrote, with every rule of
//! docs/reference/routing.md#header-hygiene applied there, carried over
//! into `http` parts for hyper's HTTP/2 client. Nothing is decided here:
//! `Host` becomes the URI's authority (hyper's client sends it as
//! `:authority`, as on the general path, `exchange::with_upstream`), the
//! upstream's own when the head names none; the framing field goes, since
//! HTTP/2 frames the body itself.

use crate::proxy::Upstream;
use http::header::{HeaderName, HeaderValue};
use http::uri::Authority;

/// `Parts` for the HTTP/2 request from the HTTP/1.1 head at the start of
/// `head`; `None` when something in it is not valid in `http`'s types.
pub(super) fn request_parts(up: &Upstream, head: &[u8]) -> Option<http::request::Parts> {
    // The head's fields, and the few weir adds to them.
    let mut fields = [httparse::EMPTY_HEADER; super::MAX_HEADERS + 8];
    let mut req = httparse::Request::new(&mut fields);
    let httparse::Status::Complete(_) = req.parse(head).ok()? else {
        return None;
    };
    let mut headers = http::HeaderMap::with_capacity(req.headers.len());
    let mut authority = None;
    for f in req.headers.iter() {
        if f.name == "host" {
            authority = Some(f.value);
            continue;
        }
        if f.name == "transfer-encoding" {
            continue;
        }
        let name = HeaderName::from_bytes(f.name.as_bytes()).ok()?;
        headers.append(name, HeaderValue::from_bytes(f.value).ok()?);
    }
    let authority = match authority {
        Some(a) => Authority::try_from(a).ok()?,
        None => up.config.url.authority.clone(),
    };
    let uri = http::Uri::builder()
        .scheme(up.scheme.clone())
        .authority(authority)
        .path_and_query(req.path?)
        .build()
        .ok()?;
    let method = http::Method::from_bytes(req.method?.as_bytes()).ok()?;
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.version = http::Version::HTTP_2;
    parts.headers = headers;
    Some(parts)
}
