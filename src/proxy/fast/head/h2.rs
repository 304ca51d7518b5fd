//! The head of a request the fast path sends to an HTTP/2 upstream: the
//! HTTP/1.1 head [`super::write`] wrote, with every rule of
//! docs/reference/routing.md#header-hygiene applied there, carried over
//! into `http` parts for the HTTP/2 pool's client (`upstream::pool::h2`, on
//! the `h2` crate). Nothing is decided here:
//! `Host` becomes the URI's authority (hyper's client sends it as
//! `:authority`, as on the general path, `exchange::with_upstream`), the
//! upstream's own when the head names none; the framing field goes, since
//! HTTP/2 frames the body itself.

use crate::proxy::Upstream;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery};

/// `Parts` for the HTTP/2 request from the HTTP/1.1 head at the start of
/// `head`; `None` when something in it is not valid in `http`'s types.
/// The head is copied once; the target and every value are slices of it.
pub(super) fn request_parts(up: &Upstream, head: &[u8]) -> Option<http::request::Parts> {
    // The head's fields, and the few weir adds to them.
    let mut fields = [httparse::EMPTY_HEADER; super::MAX_HEADERS + 8];
    let mut req = httparse::Request::new(&mut fields);
    let httparse::Status::Complete(n) = req.parse(head).ok()? else {
        return None;
    };
    let shared = Bytes::copy_from_slice(head.get(..n)?);
    let slice = |part: &[u8]| {
        let r = super::range_in(head, part);
        match r.end <= shared.len() {
            true => shared.slice(r),
            false => Bytes::copy_from_slice(part),
        }
    };
    let mut headers = http::HeaderMap::with_capacity(req.headers.len());
    let mut authority = None;
    for f in req.headers.iter() {
        if f.name == "host" {
            authority = Some(Authority::from_maybe_shared(slice(f.value)).ok()?);
            continue;
        }
        if f.name == "transfer-encoding" {
            continue;
        }
        let name = HeaderName::from_bytes(f.name.as_bytes()).ok()?;
        let value = HeaderValue::from_maybe_shared(slice(f.value)).ok()?;
        headers.append(name, value);
    }
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(up.scheme.clone());
    uri.authority = Some(authority.unwrap_or_else(|| up.config.url.authority.clone()));
    let target = req.path?.as_bytes();
    uri.path_and_query = Some(PathAndQuery::from_maybe_shared(slice(target)).ok()?);
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = http::Method::from_bytes(req.method?.as_bytes()).ok()?;
    parts.uri = http::Uri::from_parts(uri).ok()?;
    parts.version = http::Version::HTTP_2;
    parts.headers = headers;
    Some(parts)
}
