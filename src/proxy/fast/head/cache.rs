//! The response cache on the fast path (docs/reference/cache.md#response-cache):
//! what it does with a request, looked up as the head is planned
//! (`proxy::cached::lookup`), the validators of an entry to revalidate
//! written into the upstream's head, and the heads' fields as the cache
//! reads them. The cache's steps are the order's (`proxy::order::cache`).

use crate::proxy::cached::{self, Cached};
use crate::proxy::Upstream;

/// The request's target, as the cache and the fast path read it.
pub(super) struct RequestTarget<'r> {
    pub method: &'r str,
    pub authority: Option<&'r str>,
    pub host: Option<&'r str>,
    pub path_and_query: &'r str,
}

/// What the upstream's cache does with the request
/// (`proxy::cached::lookup`).
pub(super) fn visit(
    up: &Upstream,
    t: &RequestTarget<'_>,
    keyed: bool,
    fields: &[httparse::Header<'_>],
) -> Cached {
    let key = || cached::key_of(up, t.authority, t.host, t.path_and_query);
    let pairs = || fields.iter().map(|f| (f.name.as_bytes(), f.value));
    cached::lookup(up, t.method, keyed, key, pairs)
}

/// Adds the validators of the entry a request revalidates to the
/// upstream's head in `out` (which ends it): `If-None-Match` and
/// `If-Modified-Since` (RFC 9111 §4.3.1). Returns their length (they end
/// the head's fields), for the request to be asked again without them.
pub fn add_validators(c: &Cached, out: &mut Vec<u8>) -> Option<usize> {
    let e = c.validated()?;
    if !out.ends_with(b"\r\n\r\n") {
        return None;
    }
    out.truncate(out.len() - 2);
    let at = out.len();
    if let Some(v) = e.etag() {
        super::header(out, b"if-none-match", &v);
    }
    if let Some(v) = e.last_modified() {
        super::header(out, b"if-modified-since", &v);
    }
    let len = out.len() - at;
    out.extend_from_slice(b"\r\n");
    Some(len)
}

/// Calls `f` with the fields of the request head at the start of `buf`
/// (none when it does not parse: it did when it was planned).
pub fn request_fields<R>(buf: &[u8], f: impl FnOnce(&[httparse::Header<'_>]) -> R) -> R {
    // httparse as `head::parse` calls it (not `parse` itself: a second
    // caller would keep it from being inlined into every request's plan).
    let mut fields = [httparse::EMPTY_HEADER; super::MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => f(req.headers),
        _ => f(&[]),
    }
}

/// The fields of the client's response head that `parse_response` began
/// in `out` (its status line first), as (name, value) pairs.
pub fn response_fields(out: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
    out.split(|b| *b == b'\n').skip(1).filter_map(|line| {
        let line = line.strip_suffix(b"\r")?;
        let colon = line.iter().position(|b| *b == b':')?;
        let (name, value) = line.split_at(colon);
        Some((name, value.get(1..).unwrap_or_default().trim_ascii()))
    })
}

/// The request head at the start of `buf` as `http` parts (for a
/// background refresh, which goes upstream on the general path).
pub fn request_parts(buf: &[u8]) -> Option<http::request::Parts> {
    let mut fields = [httparse::EMPTY_HEADER; super::MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    req.parse(buf).ok()?;
    let mut b = http::Request::builder().method(req.method?).uri(req.path?);
    for f in req.headers.iter() {
        b = b.header(f.name, f.value);
    }
    Some(b.body(()).ok()?.into_parts().0)
}
