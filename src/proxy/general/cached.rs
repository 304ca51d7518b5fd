//! The response cache in the data plane (docs/reference/cache.md#response-cache):
//! a `GET` or `HEAD` to an upstream whose cache is on is looked up before
//! admission and answered from an entry when the entry may answer it (no
//! attempt, nothing admitted); otherwise it goes upstream through
//! `exchange::with_upstream` — coalesced with concurrent misses of its
//! key, with the entry's validators when it is to be revalidated — and the
//! response is stored when it may be, or replaced by the stale entry when
//! it failed within the entry's `stale-if-error`. What may be stored and for how long,
//! and every decision, are `policy::cache`'s; this module carries requests
//! and responses to and from it.
//!
//! The fast path serves the cache's requests itself (`fast::head::cache`,
//! `fast::hit`, `fast::fill`) with this module's shared fill (`fill`:
//! coalescing, what is stored) and background refresh; it hands this path
//! only a request whose 304 matched no entry any more.

use super::exchange::with_upstream;
use crate::policy::cache::{
    on_error, on_not_modified, CacheRequest, CacheResult, CacheStore, CachedResponse, Decision,
    Refreshed,
};
use crate::proxy::attempt::Annotations;
use crate::proxy::body::{self, Body};
use crate::proxy::error::ProxyError;
use crate::proxy::request::Parsed;
use crate::proxy::Upstream;
use crate::upstream::pool::held::ConnCtx;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

mod fill;
pub(crate) use fill::{insert, take_turn, to_store, EndFill, Turn};

/// A header map as the policy core reads it.
fn pairs(h: &HeaderMap) -> Vec<(&[u8], &[u8])> {
    h.iter()
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        .collect()
}

/// An entry's key: the target the client sent (the upstream's target is a
/// function of it: `strip_prefix`), its path and query — after the host the
/// client named when the upstream is told it (`preserve_host`: one upstream
/// serving several sites keeps each site's entries apart).
fn key(up: &Upstream, uri: &http::Uri, host: Option<&HeaderValue>) -> String {
    let target = uri.path_and_query().map_or("/", |x| x.as_str());
    let authority = uri.authority().map(|a| a.as_str());
    key_of(up, authority, host.and_then(|h| h.to_str().ok()), target)
}

/// [`key`] from the parts of a request head as the fast path has them.
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

/// A copy of a request's head for another exchange (its extensions, which
/// only upgrades use, are not copied).
fn copy(p: &Parts, method: Method) -> Parts {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = method;
    parts.uri = p.uri.clone();
    parts.version = p.version;
    parts.headers = p.headers.clone();
    parts
}

/// A non-error response to an unsafe method drops every entry of its
/// target (RFC 9111 §4.4).
pub(crate) fn invalidate(
    up: &Upstream,
    method: &Method,
    uri: &http::Uri,
    host: Option<&HeaderValue>,
    status: u16,
) {
    if crate::policy::cache::invalidates(method.as_str(), status) {
        let key = key(up, uri, host);
        if let Some(c) = up.state.cache().as_mut() {
            c.invalidate(&key);
        }
    }
}

/// Serves a `GET` or `HEAD` with the upstream's cache. `handled`: set when
/// the cache took the request up (not a Range, the client's own
/// conditional…), so that weir's own error to it is marked too
/// ([`mark_error`]).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    up: &Upstream,
    conn: &ConnCtx,
    parts: Parts,
    body: Body,
    start: Instant,
    grpc: bool,
    asked: Parsed,
    handled: &mut bool,
) -> Result<Response<Body>, ProxyError> {
    let parsed = CacheRequest::parse(parts.method.as_str(), pairs(&parts.headers));
    let key = key(up, &parts.uri, parts.headers.get(http::header::HOST));
    let now = up.state.now();
    let lookup = match parsed {
        Ok(req) => {
            let mut cache = up.state.cache();
            let found = cache
                .as_mut()
                .map(|c| c.lookup(&key, &req, pairs(&parts.headers), now));
            found.map(|l| (req, l))
        }
        Err(_) => None,
    };
    let Some((req, lookup)) = lookup else {
        // Left alone (a Range, the client's own conditional, a body…).
        return with_upstream(up, conn, parts, body, start, grpc, Ok(asked)).await;
    };
    *handled = true;
    let x = Visit {
        up,
        conn,
        start,
        grpc,
        asked,
        key,
        req,
        count: true,
    };
    match (lookup.decision, lookup.entry) {
        (Decision::Fresh, Some(e)) => Ok(x.answer(&e, CacheResult::Hit, None)),
        (Decision::StaleWhileRevalidate, Some(e)) => {
            refresh(up, conn.pool(), &parts, &x.key, &e);
            Ok(x.answer(&e, CacheResult::Stale, None))
        }
        // A HEAD is answered from a GET's entry, never stored: otherwise
        // it is forwarded as it is, with the entry as the fallback.
        (_, entry) if x.req.head => x.go(parts, entry, false).await,
        (Decision::Revalidate { .. }, Some(e)) => x.fill(parts, Some(e)).await,
        _ => x.fill(parts, None).await,
    }
}

/// One request the cache handles, going upstream.
struct Visit<'a> {
    up: &'a Upstream,
    conn: &'a ConnCtx,
    start: Instant,
    grpc: bool,
    /// What the client's request said of itself.
    asked: Parsed,
    key: String,
    req: CacheRequest,
    /// Whether it is a client's request (a background refresh is not
    /// counted in `weir_cache_requests_total`).
    count: bool,
}

impl Visit<'_> {
    /// A miss or a revalidation, coalesced ([`take_turn`]).
    async fn fill(
        &self,
        parts: Parts,
        entry: Option<Arc<CachedResponse>>,
    ) -> Result<Response<Body>, ProxyError> {
        let deadline = self.deadline(&parts);
        let select = |c: &CacheStore| c.get(&self.key, pairs(&parts.headers)).cloned();
        match take_turn(self.up, &self.key, deadline, select).await {
            Turn::Lead(_end) => self.go(parts, entry, true).await,
            Turn::Stored(e) => Ok(self.answer(&e, CacheResult::Coalesced, None)),
            Turn::TimedOut => self.failed(entry.as_deref(), ProxyError::DeadlineExceeded),
            Turn::Alone => self.go(parts, entry, true).await,
        }
    }

    /// The request's deadline, as `exchange::with_upstream` sets it.
    fn deadline(&self, parts: &Parts) -> Instant {
        let grpc = crate::proxy::headers::grpc_timeout(&parts.headers);
        let lowered = self.asked.lowered;
        crate::proxy::attempt::deadline(&self.up.config, self.start, [lowered, grpc]).0
    }

    /// Goes upstream (with `entry`'s validators when it has any), then
    /// stores, refreshes, or falls back to `entry`.
    async fn go(
        &self,
        parts: Parts,
        entry: Option<Arc<CachedResponse>>,
        may_store: bool,
    ) -> Result<Response<Body>, ProxyError> {
        let req_headers = parts.headers.clone();
        let mut ask = copy(&parts, parts.method.clone());
        let conditional = match (&entry, may_store) {
            (Some(e), true) => validators(&mut ask.headers, e),
            _ => false,
        };
        let forwarded = self.ask_upstream(ask).await;
        let now = self.up.state.now();
        let resp = match forwarded {
            Ok(resp) => resp,
            Err(e) if counts_as_failure(&e) => return self.failed(entry.as_deref(), e),
            Err(e) => {
                self.count(CacheResult::Miss);
                return Err(e);
            }
        };
        let status = resp.status().as_u16();
        match entry {
            Some(e) if conditional && status == 304 => {
                let params = self.params();
                let Some(params) = params else {
                    return Ok(self.mark(resp, CacheResult::Miss));
                };
                let received = self.up.state.clock.wall();
                let fresh =
                    on_not_modified(&e, &self.req, pairs(resp.headers()), &params, now, received);
                let attempts = resp.extensions().get::<Annotations>().copied();
                let answer = {
                    let mut cache = self.up.state.cache();
                    let c = cache.as_mut();
                    match fresh {
                        Refreshed::Updated(r) => {
                            c.map(|c| c.insert(&self.key, pairs(&req_headers), r.clone()));
                            Some(r)
                        }
                        Refreshed::NotStorable(r) => {
                            c.map(|c| c.remove(&self.key, pairs(&req_headers)));
                            Some(r)
                        }
                        Refreshed::Mismatch => {
                            c.map(|c| c.remove(&self.key, pairs(&req_headers)));
                            None
                        }
                    }
                };
                match answer {
                    Some(r) => Ok(self.answer(&r, CacheResult::Revalidated, attempts)),
                    None => {
                        // It validated some other response: ask again, plainly.
                        let again = self
                            .ask_upstream(copy(&parts, parts.method.clone()))
                            .await?;
                        Ok(self.mark(again, CacheResult::Miss))
                    }
                }
            }
            Some(e) if status >= 500 && on_error(&e, now) => {
                let attempts = resp.extensions().get::<Annotations>().copied();
                self.count(CacheResult::StaleIfError);
                Ok(self.answer_uncounted(&e, CacheResult::StaleIfError, attempts))
            }
            _ if may_store && !self.req.head && status < 500 => {
                self.store(resp, &req_headers, now, entry.as_deref()).await
            }
            _ => Ok(self.mark(resp, CacheResult::Miss)),
        }
    }

    async fn ask_upstream(&self, parts: Parts) -> Result<Response<Body>, ProxyError> {
        let (up, conn, start, grpc) = (self.up, self.conn, self.start, self.grpc);
        with_upstream(
            up,
            conn,
            parts,
            body::empty(),
            start,
            grpc,
            Ok(self.asked.clone()),
        )
        .await
    }

    fn params(&self) -> Option<crate::policy::cache::CacheParams> {
        self.up.state.cache().as_ref().map(|c| c.params().clone())
    }

    /// Stores `resp` when it may be, reading its body whole (within
    /// `max_object_bytes`) first; a new response supersedes the variant its
    /// request selects either way. A body that ends early or breaks off
    /// while it is read is an upstream failure, answered like one (`entry`
    /// within its `stale-if-error`, else weir's 502 `upstream_reset`):
    /// nothing of it has reached the client, and nothing is stored.
    async fn store(
        &self,
        resp: Response<Body>,
        req_headers: &HeaderMap,
        now: Duration,
        entry: Option<&CachedResponse>,
    ) -> Result<Response<Body>, ProxyError> {
        let status = resp.status().as_u16();
        let (up, key, req) = (self.up, &self.key, &self.req);
        let to_store = to_store(
            up,
            key,
            req,
            status,
            pairs(resp.headers()),
            pairs(req_headers),
        );
        let Some((freshness, limit)) = to_store else {
            return Ok(self.mark(resp, CacheResult::Miss));
        };
        let (head, mut rest) = resp.into_parts();
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut size = 0usize;
        let whole = loop {
            match rest.frame().await {
                None => break true,
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => {
                        size += d.len();
                        chunks.push(d);
                        if size > limit {
                            break false;
                        }
                    }
                    // Trailers: relayed, never stored.
                    Err(f) => {
                        let relay = crate::proxy::replay::Prefixed::new(chunks, Some(f), rest);
                        return Ok(self.mark(
                            Response::from_parts(head, body::boxed(relay)),
                            CacheResult::Miss,
                        ));
                    }
                },
                Some(Err(e)) => {
                    let why = format!("the response body broke off after {size} bytes: {e}");
                    return self.failed(entry, ProxyError::UpstreamReset(why));
                }
            }
        };
        if whole {
            let r = CachedResponse::new(status, pairs(&head.headers), &chunks, freshness, now);
            insert(self.up, &self.key, pairs(req_headers), r);
        }
        let relay = crate::proxy::replay::Prefixed::new(chunks, None, rest);
        Ok(self.mark(
            Response::from_parts(head, body::boxed(relay)),
            CacheResult::Miss,
        ))
    }

    /// weir's answer to a failure, or `entry` within its `stale-if-error`.
    fn failed(
        &self,
        entry: Option<&CachedResponse>,
        e: ProxyError,
    ) -> Result<Response<Body>, ProxyError> {
        let now = self.up.state.now();
        match entry {
            Some(en) if on_error(en, now) => Ok(self.answer(en, CacheResult::StaleIfError, None)),
            _ => {
                // weir's own error answers it: a miss (the header is added
                // where the error becomes a response, `mark_error`).
                self.count(CacheResult::Miss);
                Err(e)
            }
        }
    }

    fn count(&self, result: CacheResult) {
        if self.count {
            if let Some(c) = self.up.state.cache().as_mut() {
                c.count(result);
            }
        }
    }

    /// A response from upstream, annotated and counted.
    fn mark(&self, mut resp: Response<Body>, result: CacheResult) -> Response<Body> {
        self.count(result);
        if self.up.config.annotate {
            resp.headers_mut()
                .insert(CACHE_HEADER, HeaderValue::from_static(result.name()));
        }
        resp
    }

    /// An answer from `e`, counted.
    fn answer(
        &self,
        e: &CachedResponse,
        result: CacheResult,
        attempts: Option<Annotations>,
    ) -> Response<Body> {
        self.count(result);
        self.answer_uncounted(e, result, attempts)
    }

    /// An answer from `e` (see [`entry_parts`]).
    fn answer_uncounted(
        &self,
        e: &CachedResponse,
        result: CacheResult,
        attempts: Option<Annotations>,
    ) -> Response<Body> {
        let now = self.up.state.now();
        let (parts, bytes) = entry_parts(self.up, e, result, self.req.head, attempts, now);
        self.up.state.metrics.status(e.status, self.start.elapsed());
        Response::from_parts(parts, body::full(bytes))
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
    crate::proxy::attempt::annotate_response(h, &mut parts.extensions, spent, on);
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

/// weir's own error to a request the cache handled (it counted it as a
/// miss): marked like any other answer.
pub(crate) fn mark_error(up: &Upstream, resp: &mut Response<Body>) {
    if up.config.annotate {
        let miss = HeaderValue::from_static(CacheResult::Miss.name());
        resp.headers_mut().insert(CACHE_HEADER, miss);
    }
}

/// Marks weir's answer with how the cache took part in it.
pub(crate) fn mark(h: &mut HeaderMap, result: CacheResult) {
    h.insert(CACHE_HEADER, HeaderValue::from_static(result.name()));
}

/// `x-weir-cache`.
const CACHE_HEADER: HeaderName = HeaderName::from_static("x-weir-cache");

/// Adds `e`'s validators as conditionals; whether it had any.
fn validators(h: &mut HeaderMap, e: &CachedResponse) -> bool {
    let mut any = false;
    for (name, v) in [
        (http::header::IF_NONE_MATCH, e.etag()),
        (http::header::IF_MODIFIED_SINCE, e.last_modified()),
    ] {
        if let Some(v) = v.and_then(|v| HeaderValue::from_maybe_shared(v).ok()) {
            h.insert(name, v);
            any = true;
        }
    }
    any
}

/// weir's own errors that `stale-if-error` answers for (a 5xx from the
/// upstream counts too): the upstream could not be reached or did not
/// answer, or admission refused.
pub(crate) fn counts_as_failure(e: &ProxyError) -> bool {
    matches!(
        e,
        ProxyError::ConnectFailed(_)
            | ProxyError::UpstreamReset(_)
            | ProxyError::UpstreamTimeout
            | ProxyError::DeadlineExceeded
            | ProxyError::BadResponse(_)
            | ProxyError::CircuitOpen { .. }
            | ProxyError::RateLimited { .. }
            | ProxyError::Overloaded
    )
}

/// Starts the one background refresh of `key` (stale-while-revalidate),
/// unless one is running.
pub(crate) fn refresh(
    up: &Upstream,
    pool: &Arc<crate::upstream::pool::H1Pool>,
    parts: &Parts,
    key: &str,
    entry: &Arc<CachedResponse>,
) {
    let first = up
        .state
        .fills
        .lock()
        .is_ok_and(|mut f| f.begin_refresh(key));
    if !first {
        return;
    }
    let (up, key, entry) = (up.clone(), key.to_owned(), entry.clone());
    let parts = copy(parts, Method::GET);
    let pool = pool.clone();
    tokio::spawn(async move {
        let conn = ConnCtx::new(pool);
        let req = CacheRequest::parse("GET", pairs(&parts.headers)).unwrap_or_default();
        let x = Visit {
            up: &up,
            conn: &conn,
            start: Instant::now(),
            grpc: false,
            asked: crate::proxy::request::read(&up.config, &parts).unwrap_or_default(),
            key,
            req,
            count: false,
        };
        // The response is read whole when stored; otherwise let go.
        let _ = x.go(parts, Some(entry), true).await;
        if let Ok(mut f) = up.state.fills.lock() {
            f.end_refresh(&x.key);
        }
    });
}
