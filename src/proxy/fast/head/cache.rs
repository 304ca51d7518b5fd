//! What the response cache does with a request on the fast path
//! (docs/reference/cache.md#response-cache): a fresh hit is answered from
//! its entry (`fast::hit`); a miss goes upstream and its response is stored
//! when it may be (`fast::fill`); a write that succeeds drops its target's
//! entries; a stale entry within its `stale-while-revalidate` answers at
//! once and is refreshed in the background; an entry to revalidate is asked
//! for with its validators and answers a 304, or a failure within its
//! `stale-if-error`.

use crate::policy::cache::{CacheRequest, CacheResult, CachedResponse, Decision};
use crate::proxy::Upstream;
use std::sync::Arc;

/// The cache's part in one request.
#[derive(Debug, Default)]
pub enum Cached {
    /// No cache, or a request it leaves alone (a Range, the client's own
    /// conditional, a keyed request): forwarded as it is, unmarked.
    #[default]
    Off,
    /// A fresh entry answers it.
    Hit(Arc<CachedResponse>),
    /// A stale entry within its `stale-while-revalidate` answers it, and
    /// one background request refreshes it.
    Stale(Arc<CachedResponse>, String),
    /// No entry: it goes upstream, marked a miss, and a `GET`'s response is
    /// stored when it may be.
    Fill(Box<Filling>),
    /// A method that is not safe: a success drops every entry of its
    /// target (RFC 9111 §4.4).
    Invalidates(Box<Write>),
}

/// A write to a cached upstream's target.
#[derive(Debug)]
pub struct Write {
    /// The target's key.
    pub key: String,
    pub method: http::Method,
}

/// A miss to fill.
#[derive(Debug)]
pub struct Filling {
    /// The entry's key (`proxy::general::cached::key_of`).
    pub key: String,
    /// What the request's fields say to the cache (a `HEAD` is never
    /// stored, nor coalesced).
    pub req: CacheRequest,
    /// The entry it revalidates (or, for a `HEAD`, falls back to): it
    /// answers a 304, and a failure within its `stale-if-error`.
    pub entry: Option<Arc<CachedResponse>>,
    /// The upstream's request carries the entry's validators.
    pub conditional: bool,
}

impl Cached {
    /// A miss whose response may be stored: coalesced with the others of
    /// its key.
    pub fn filling_get(&self) -> Option<&Filling> {
        match self {
            Cached::Fill(f) if !f.req.head => Some(f),
            _ => None,
        }
    }
}

/// The request's target, as the cache and the fast path read it.
pub(super) struct RequestTarget<'r> {
    pub method: &'r str,
    pub authority: Option<&'r str>,
    pub host: Option<&'r str>,
    pub path_and_query: &'r str,
}

/// What the upstream's cache does with the request; `Err`: it is the
/// general path's (an entry to revalidate or to serve stale).
pub(super) fn visit(
    up: &Upstream,
    t: &RequestTarget<'_>,
    keyed: bool,
    fields: &[httparse::Header<'_>],
) -> Result<Cached, &'static str> {
    let key = || crate::proxy::general::cached::key_of(up, t.authority, t.host, t.path_and_query);
    if !matches!(t.method, "GET" | "HEAD") {
        let Ok(method) = http::Method::from_bytes(t.method.as_bytes()) else {
            return Ok(Cached::Off);
        };
        let key = key();
        return Ok(Cached::Invalidates(Box::new(Write { key, method })));
    }
    if keyed {
        return Ok(Cached::Off);
    }
    let pairs = || fields.iter().map(|f| (f.name.as_bytes(), f.value));
    let Ok(req) = CacheRequest::parse(t.method, pairs()) else {
        return Ok(Cached::Off);
    };
    let key = key();
    let now = up.state.now();
    let mut cache = up.state.cache();
    let Some(c) = cache.as_mut() else {
        return Ok(Cached::Off);
    };
    let found = c.lookup(&key, &req, pairs(), now);
    let fill = |key: String, entry: Option<Arc<CachedResponse>>, req: CacheRequest| {
        let conditional = !req.head
            && entry
                .as_ref()
                .is_some_and(|e| e.etag().is_some() || e.last_modified().is_some());
        Ok(Cached::Fill(Box::new(Filling {
            key,
            req,
            entry,
            conditional,
        })))
    };
    match (found.decision, found.entry) {
        (Decision::Fresh, Some(e)) => {
            c.count(CacheResult::Hit);
            Ok(Cached::Hit(e))
        }
        (Decision::StaleWhileRevalidate, Some(e)) => Ok(Cached::Stale(e, key)),
        (_, entry) if req.head => fill(key, entry, req),
        (Decision::Revalidate { .. }, Some(e)) => fill(key, Some(e), req),
        (_, _) => fill(key, None, req),
    }
}

/// Adds the validators of the entry a request revalidates to the
/// upstream's head in `out` (which ends it): `If-None-Match` and
/// `If-Modified-Since` (RFC 9111 §4.3.1).
pub fn add_validators(c: &Cached, out: &mut Vec<u8>) {
    let Cached::Fill(f) = c else { return };
    let Some(e) = f.entry.as_ref().filter(|_| f.conditional) else {
        return;
    };
    if !out.ends_with(b"\r\n\r\n") {
        return;
    }
    out.truncate(out.len() - 2);
    if let Some(v) = e.etag() {
        super::header(out, b"if-none-match", &v);
    }
    if let Some(v) = e.last_modified() {
        super::header(out, b"if-modified-since", &v);
    }
    out.extend_from_slice(b"\r\n");
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
