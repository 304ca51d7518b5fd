//! The response cache's part in a request, the same for every codec
//! (docs/reference/cache.md#response-cache): what the cache does with a
//! request ([`lookup`] → [`Cached`]), an entry's key, an answer made from an
//! entry, and a key's fill ([`fill`]: concurrent misses coalesced, whether
//! and how a response is stored). What may be stored and for how long, and
//! every decision, are `policy::cache`'s.
//!
//! The steps are the order's (`proxy::order::cache`): an entry answers
//! before admission, a miss coalesces with its key's fill, and after the
//! attempts a response is stored, a 304 refreshes the entry it revalidated,
//! and a failure within an entry's `stale-if-error` is answered by it. This
//! module knows no codec.

pub(crate) mod fill;
pub(crate) mod whole;

use super::attempt::Annotations;
use super::error::ProxyError;
use super::Upstream;
use crate::policy::cache::{CacheRequest, CacheResult, CachedResponse, Decision};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;

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
    /// No entry that may answer it: it goes upstream, marked a miss, and a
    /// `GET`'s response is stored when it may be.
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

/// A request that goes upstream for its key.
#[derive(Debug)]
pub struct Filling {
    /// The entry's key ([`key_of`]).
    pub key: String,
    /// What the request's fields say to the cache (a `HEAD` is never
    /// stored, nor coalesced).
    pub req: CacheRequest,
    /// The entry it revalidates (or, for a `HEAD`, falls back to): it
    /// answers a 304, and a failure within its `stale-if-error`.
    pub entry: Option<Arc<CachedResponse>>,
    /// The upstream's request carries the entry's validators.
    pub conditional: bool,
    /// weir's own refresh of a stale entry (stale-while-revalidate): not
    /// a client's request, so neither counted in
    /// `weir_cache_requests_total` nor coalesced.
    pub background: bool,
}

impl Filling {
    /// A refresh of `entry` in the background, asked with its validators.
    pub(crate) fn refresh(key: String, req: CacheRequest, entry: Arc<CachedResponse>) -> Filling {
        let conditional = entry.etag().is_some() || entry.last_modified().is_some();
        Filling {
            key,
            req,
            entry: Some(entry),
            conditional,
            background: true,
        }
    }

    /// The fill asked again without the entry's validators: a plain miss.
    pub(crate) fn plain(&self) -> Filling {
        Filling {
            key: self.key.clone(),
            req: self.req,
            entry: None,
            conditional: false,
            background: self.background,
        }
    }

    /// Counts a client's request's outcome.
    pub(crate) fn count(&self, up: &Upstream, result: CacheResult) {
        if let Some(c) = up.state.cache().as_mut() {
            self.count_in(c, result);
        }
    }

    /// [`Filling::count`] in a store already locked.
    pub(crate) fn count_in(&self, c: &mut crate::policy::cache::CacheStore, result: CacheResult) {
        if !self.background {
            c.count(result);
        }
    }
}

impl Cached {
    /// A miss whose response may be stored: coalesced with the others of
    /// its key.
    pub fn filling_get(&self) -> Option<&Filling> {
        match self {
            Cached::Fill(f) if !f.req.head && !f.background => Some(f),
            _ => None,
        }
    }

    /// The entry whose validators the upstream's request carries.
    pub fn validated(&self) -> Option<&CachedResponse> {
        match self {
            Cached::Fill(f) if f.conditional => f.entry.as_deref(),
            _ => None,
        }
    }
}

/// What the upstream's cache does with a request: `method`, whether it is
/// keyed (an idempotency key: left alone), its key (made only when
/// needed) and its fields. Nothing is counted here: the order counts what
/// the request comes to.
pub(crate) fn lookup<'a, P>(
    up: &Upstream,
    method: &str,
    keyed: bool,
    key: impl FnOnce() -> String,
    fields: impl Fn() -> P,
) -> Cached
where
    P: Iterator<Item = (&'a [u8], &'a [u8])> + Clone,
{
    if up.config.cache.is_none() {
        return Cached::Off;
    }
    if !matches!(method, "GET" | "HEAD") {
        let Ok(method) = http::Method::from_bytes(method.as_bytes()) else {
            return Cached::Off;
        };
        let key = key();
        return Cached::Invalidates(Box::new(Write { key, method }));
    }
    if keyed {
        return Cached::Off;
    }
    let Ok(req) = CacheRequest::parse(method, fields()) else {
        return Cached::Off;
    };
    let key = key();
    let now = up.state.now();
    let found = match up.state.cache().as_mut() {
        Some(c) => c.lookup(&key, &req, fields(), now),
        None => return Cached::Off,
    };
    let fill = |key: String, entry: Option<Arc<CachedResponse>>, req: CacheRequest| {
        let conditional = !req.head
            && entry
                .as_ref()
                .is_some_and(|e| e.etag().is_some() || e.last_modified().is_some());
        Cached::Fill(Box::new(Filling {
            key,
            req,
            entry,
            conditional,
            background: false,
        }))
    };
    match (found.decision, found.entry) {
        (Decision::Fresh, Some(e)) => Cached::Hit(e),
        (Decision::StaleWhileRevalidate, Some(e)) => Cached::Stale(e, key),
        // A HEAD is answered from a GET's entry, never stored: otherwise it
        // is forwarded as it is, with the entry as the fallback.
        (_, entry) if req.head => fill(key, entry, req),
        (Decision::Revalidate { .. }, Some(e)) => fill(key, Some(e), req),
        (_, _) => fill(key, None, req),
    }
}

/// An entry's key: the target the client sent (the upstream's target is a
/// function of it: `strip_prefix`), its path and query — after the host the
/// client named when the upstream is told it (`preserve_host`: one upstream
/// serving several sites keeps each site's entries apart).
pub(crate) fn key_of(
    up: &Upstream,
    authority: Option<&str>,
    host: Option<&str>,
    target: &str,
) -> String {
    if !up.config.preserve_host {
        return target.to_owned();
    }
    let host = authority.or(host).unwrap_or_default().to_ascii_lowercase();
    format!("{host}{target}")
}

/// [`key_of`] a request head as hyper reads it.
pub(crate) fn key(up: &Upstream, uri: &http::Uri, host: Option<&HeaderValue>) -> String {
    let target = uri.path_and_query().map_or("/", |x| x.as_str());
    let authority = uri.authority().map(|a| a.as_str());
    key_of(up, authority, host.and_then(|h| h.to_str().ok()), target)
}

/// Calls `f` with `fields` as a slice: on the stack when there are at most
/// 24 of them (nearly always), else in a vector.
pub(crate) fn with_fields<'a, R>(
    mut fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    f: impl FnOnce(&[(&'a [u8], &'a [u8])]) -> R,
) -> R {
    let empty: &[u8] = &[];
    let mut stack = [(empty, empty); 24];
    let mut n = 0;
    while let Some(p) = fields.next() {
        if n == stack.len() {
            let mut all = stack.to_vec();
            all.push(p);
            all.extend(fields);
            return f(&all);
        }
        stack[n] = p;
        n += 1;
    }
    f(&stack[..n])
}

/// A header map as the policy core reads it.
pub(crate) fn pairs(h: &HeaderMap) -> Vec<(&[u8], &[u8])> {
    h.iter()
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        .collect()
}

/// Counts a request's outcome in `weir_cache_requests_total`.
pub(crate) fn count(up: &Upstream, result: CacheResult) {
    if let Some(c) = up.state.cache().as_mut() {
        c.count(result);
    }
}

/// An answer from `e` at `now`: its fields, `Age`, weir's annotations (no
/// attempt made unless `attempts` says), its body (none for a HEAD, whose
/// `Content-Length` is the entry's).
pub(crate) fn entry_parts(
    up: &Upstream,
    e: &CachedResponse,
    result: CacheResult,
    head: bool,
    attempts: Option<Annotations>,
    now: Duration,
) -> (http::response::Parts, Bytes) {
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::OK);
    let h = &mut parts.headers;
    for (n, v) in e.field_values() {
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n), HeaderValue::from_maybe_shared(v)) {
            h.append(n, v);
        }
    }
    h.insert(http::header::AGE, HeaderValue::from(e.age_secs(now)));
    let spent = attempts.unwrap_or(Annotations {
        attempts: 0,
        stop: None,
        hedge: None,
    });
    let on = up.config.annotate;
    super::attempt::annotate_response(h, &mut parts.extensions, spent, on);
    if on {
        h.insert(CACHE_HEADER, HeaderValue::from_static(result.name()));
    }
    if head {
        h.insert(
            http::header::CONTENT_LENGTH,
            HeaderValue::from(e.body().len()),
        );
        (parts, Bytes::new())
    } else {
        (parts, e.body())
    }
}

/// Marks weir's answer with how the cache took part in it.
pub(crate) fn mark(h: &mut HeaderMap, result: CacheResult) {
    h.insert(CACHE_HEADER, HeaderValue::from_static(result.name()));
}

/// `x-weir-cache`.
const CACHE_HEADER: HeaderName = HeaderName::from_static("x-weir-cache");

/// Adds `e`'s validators to a request's fields as conditionals
/// (`If-None-Match`, `If-Modified-Since`: RFC 9111 §4.3.1).
pub(crate) fn add_validators(h: &mut HeaderMap, e: &CachedResponse) {
    for (name, v) in [
        (http::header::IF_NONE_MATCH, e.etag()),
        (http::header::IF_MODIFIED_SINCE, e.last_modified()),
    ] {
        if let Some(v) = v.and_then(|v| HeaderValue::from_maybe_shared(v).ok()) {
            h.insert(name, v);
        }
    }
}

/// weir's own errors that `stale-if-error` answers for (a 5xx from the
/// upstream counts too): the upstream could not be reached or did not
/// answer, or admission refused.
pub(crate) fn counts_as_failure(e: &ProxyError) -> bool {
    matches!(
        e,
        ProxyError::ConnectFailed(_)
            | ProxyError::RefusedStream(_)
            | ProxyError::UpstreamReset(_)
            | ProxyError::UpstreamTimeout
            | ProxyError::DeadlineExceeded
            | ProxyError::BadResponse(_)
            | ProxyError::CircuitOpen { .. }
            | ProxyError::RateLimited { .. }
            | ProxyError::Overloaded
    )
}
