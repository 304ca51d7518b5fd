//! The response cache's misses and writes on the fast path
//! (docs/reference/cache.md#response-cache): a miss takes its turn at
//! filling its key (coalesced with the others of that key, as on the
//! general path, `proxy::general::cached::take_turn`), goes upstream, and its response is
//! read whole before any of it is relayed when it may be stored, so that a
//! body that breaks off is weir's error and nothing is stored; a write that
//! succeeds drops its target's entries.

use super::head::cache::{request_fields, response_fields, Cached, Filling};
use super::head::{ChunkedRelay, Framing, Planned};
use super::io::read_more;
use super::transport::Exchange;
use super::{Ctx, OwnError};
use crate::policy::cache::{on_not_modified, CacheResult, CachedResponse, Refreshed};
use crate::proxy::error::ProxyError;
use crate::proxy::general::cached::{self, EndFill, Turn};
use crate::proxy::{h1, Upstream};
use std::sync::Arc;
use tokio::time::Instant;

impl Ctx<'_> {
    /// A miss's turn at filling its key: `Ok(Some)` when it leads (the
    /// others wake when the guard drops), `Ok(None)` when it goes upstream
    /// by itself; `Err` when it has been answered (from what the leader
    /// stored, or weir's 504 when its deadline passed first), saying whether
    /// the connection stays open.
    pub(super) async fn take_turn<'a>(
        &mut self,
        up: &'a Upstream,
        start: Instant,
        p: &'a Planned,
        f: &'a Filling,
        deadline: Instant,
    ) -> Result<Option<EndFill<'a>>, bool> {
        let head = self.bufs.client.get(..p.head_len).unwrap_or_default();
        let select = |c: &crate::policy::cache::CacheStore| {
            request_fields(head, |fields| {
                let pairs = fields.iter().map(|h| (h.name.as_bytes(), h.value));
                c.get(&f.key, pairs).cloned()
            })
        };
        match cached::take_turn(up, &f.key, deadline, select).await {
            Turn::Lead(end) => Ok(Some(end)),
            Turn::Alone => Ok(None),
            Turn::Stored(e) => {
                if let Some(c) = up.state.cache().as_mut() {
                    c.count(CacheResult::Coalesced);
                }
                Err(self
                    .cache_answer(up, start, p, &e, CacheResult::Coalesced, None)
                    .await)
            }
            Turn::TimedOut => {
                let f = OwnError {
                    error: ProxyError::DeadlineExceeded,
                    attempts: None,
                    endpoint: None,
                };
                Err(self.fail(up, start, p, f).await)
            }
        }
    }

    /// The entry that answers `error` within its `stale-if-error`, counted,
    /// when the request revalidated one.
    pub(super) fn stale_if_error(
        &self,
        up: &Upstream,
        p: &Planned,
        error: &ProxyError,
    ) -> Option<Arc<CachedResponse>> {
        let Cached::Fill(f) = &p.cache else {
            return None;
        };
        let e = f.entry.as_ref()?;
        let now = up.state.now();
        if !cached::counts_as_failure(error) || !crate::policy::cache::on_error(e, now) {
            return None;
        }
        count(up, CacheResult::StaleIfError);
        Some(e.clone())
    }

    /// Starts the background refresh of a stale entry that answers within
    /// its `stale-while-revalidate` (one per key at a time), and counts the
    /// stale answer.
    pub(super) fn refresh(&self, up: &Upstream, p: &Planned, e: &Arc<CachedResponse>, key: &str) {
        let head = self.bufs.client.get(..p.head_len).unwrap_or_default();
        if let Some(parts) = super::head::cache::request_parts(head) {
            cached::refresh(up, self.pool, &parts, key, e);
        }
        if let Some(c) = up.state.cache().as_mut() {
            c.count(CacheResult::Stale);
        }
    }

    /// What the cache does with an upstream's response, before it is
    /// relayed: a write's success invalidates; a 304 refreshes the entry it
    /// revalidated, which answers, as it does a 5xx within its
    /// `stale-if-error`; a miss's response is stored when it may be, its
    /// body read whole first. `Err`: the body broke off before it was whole.
    pub(super) async fn cache_response(
        &mut self,
        up: &Upstream,
        p: &Planned,
        x: &mut Exchange,
    ) -> Result<FillStep, ProxyError> {
        let f = match &p.cache {
            Cached::Fill(f) => f,
            Cached::Invalidates(w) => {
                if crate::policy::cache::invalidates(w.method.as_str(), x.status) {
                    if let Some(c) = up.state.cache().as_mut() {
                        c.invalidate(&w.key);
                    }
                }
                return Ok(FillStep::Relay(None));
            }
            Cached::Off | Cached::Hit(_) | Cached::Stale(..) => return Ok(FillStep::Relay(None)),
        };
        if let Some(e) = &f.entry {
            let now = up.state.now();
            if f.conditional && x.status == 304 {
                return Ok(self.not_modified(up, p, f, e, now));
            }
            if x.status >= 500 && crate::policy::cache::on_error(e, now) {
                count(up, CacheResult::StaleIfError);
                return Ok(FillStep::Answer(e.clone(), CacheResult::StaleIfError));
            }
        }
        if !f.req.head && x.status < 500 {
            self.store(up, p, f, x).await?;
        }
        count(up, CacheResult::Miss);
        Ok(FillStep::Relay(Some(CacheResult::Miss)))
    }

    /// A 304 to a revalidation (RFC 9111 §4.3.4): the entry, refreshed,
    /// answers; one the 304 does not match is dropped and the request
    /// starts over on the general path, which asks again plainly.
    fn not_modified(
        &self,
        up: &Upstream,
        p: &Planned,
        f: &Filling,
        e: &CachedResponse,
        now: std::time::Duration,
    ) -> FillStep {
        let Some(params) = up.state.cache().as_ref().map(|c| c.params().clone()) else {
            return FillStep::Relay(None);
        };
        let received = up.state.clock.wall();
        let fields = response_fields(&self.bufs.out);
        let fresh = on_not_modified(e, &f.req, fields, &params, now, received);
        let head = self.bufs.client.get(..p.head_len).unwrap_or_default();
        request_fields(head, |r| {
            let req_fields = r.iter().map(|h| (h.name.as_bytes(), h.value));
            let mut cache = up.state.cache();
            let Some(c) = cache.as_mut() else {
                return FillStep::HandOver;
            };
            match fresh {
                Refreshed::Updated(r) => {
                    c.insert(&f.key, req_fields, r.clone());
                    c.count(CacheResult::Revalidated);
                    FillStep::Answer(Arc::new(r), CacheResult::Revalidated)
                }
                Refreshed::NotStorable(r) => {
                    c.remove(&f.key, req_fields);
                    c.count(CacheResult::Revalidated);
                    FillStep::Answer(Arc::new(r), CacheResult::Revalidated)
                }
                Refreshed::Mismatch => {
                    c.remove(&f.key, req_fields);
                    FillStep::HandOver
                }
            }
        })
    }

    /// Stores the response to a miss when it may be stored (the variant
    /// its request selects is dropped when not), its body read whole.
    async fn store(
        &mut self,
        up: &Upstream,
        p: &Planned,
        f: &Filling,
        x: &mut Exchange,
    ) -> Result<(), ProxyError> {
        let head = self.bufs.client.get(..p.head_len).unwrap_or_default();
        let fields = response_fields(&self.bufs.out);
        let status = x.status;
        let to_store = request_fields(head, |r| {
            let req_fields = r.iter().map(|h| (h.name.as_bytes(), h.value));
            cached::to_store(up, &f.key, &f.req, status, fields, req_fields)
        });
        let Some((freshness, limit)) = to_store else {
            return Ok(());
        };
        let Some(body) = self.read_whole(up, x, limit).await? else {
            return Ok(());
        };
        let fields = response_fields(&self.bufs.out);
        let r = CachedResponse::new(status, fields, &[body], freshness, up.state.now());
        let head = self.bufs.client.get(..p.head_len).unwrap_or_default();
        request_fields(head, |r_fields| {
            let req_fields = r_fields.iter().map(|h| (h.name.as_bytes(), h.value));
            cached::insert(up, &f.key, req_fields, r);
        });
        Ok(())
    }

    /// Reads the rest of `x`'s body into the upstream buffer after what
    /// came with its head, each wait bounded by `idle_timeout`. `Ok(Some)`:
    /// the body's data, whole; `Ok(None)`: it is larger than `limit` or has
    /// trailers (relayed as it comes, not stored); `Err`: it broke off.
    async fn read_whole(
        &mut self,
        up: &Upstream,
        x: &mut Exchange,
        limit: usize,
    ) -> Result<Option<Vec<u8>>, ProxyError> {
        if matches!(x.framing, Framing::Length(n) if n > limit as u64) {
            return Ok(None);
        }
        // A chunked body's coding, bounded too.
        let most = limit.saturating_mul(2).saturating_add(4096);
        let mut chunked = ChunkedRelay::default();
        let mut scratch = Vec::new();
        let mut fed = 0;
        let mut closed = false;
        loop {
            let tail = self.bufs.upstream.get(x.head_len..).unwrap_or_default();
            let end = match x.framing {
                Framing::Empty => Some(0),
                Framing::Length(n) => usize::try_from(n).ok().filter(|n| tail.len() >= *n),
                Framing::Close => closed.then_some(tail.len()),
                Framing::Chunked => {
                    scratch.clear();
                    match chunked.feed(&tail[fed..], &mut scratch) {
                        Ok(Some(n)) => Some(fed + n),
                        Ok(None) => {
                            fed = tail.len();
                            None
                        }
                        Err(why) => return Err(ProxyError::UpstreamReset(why.into())),
                    }
                }
            };
            if let Some(end) = end {
                let body = &tail[..end];
                return Ok(match x.framing {
                    Framing::Chunked => {
                        let (data, trailers) = h1::chunk_data(body);
                        (!trailers && data.len() <= limit).then_some(data)
                    }
                    _ => (body.len() <= limit).then(|| body.to_vec()),
                });
            }
            if tail.len() > most || (x.framing == Framing::Close && tail.len() > limit) {
                return Ok(None);
            }
            let had = tail.len();
            let until = Instant::now() + up.config.idle_timeout;
            tokio::select! {
                biased;
                r = read_more(&mut x.upstream, &mut self.bufs.upstream) => match r {
                    Ok(0) if x.framing == Framing::Close => closed = true,
                    Ok(0) | Err(_) => return Err(broke_off(had)),
                    Ok(_) => {}
                },
                () = self.timer.at(until) => return Err(broke_off(had)),
            }
        }
    }
}

/// What becomes of an upstream's response to a request the cache took up.
pub(super) enum FillStep {
    /// Relayed, with the cache's mark.
    Relay(Option<CacheResult>),
    /// Not relayed: the entry answers instead.
    Answer(Arc<CachedResponse>, CacheResult),
    /// Not relayed: the request is served again from the start, on the
    /// general path (a 304 that matches no entry any more).
    HandOver,
}

fn count(up: &Upstream, result: CacheResult) {
    if let Some(c) = up.state.cache().as_mut() {
        c.count(result);
    }
}

/// weir's error for a body that ended before it was whole, as the general path
/// says it.
fn broke_off(had: usize) -> ProxyError {
    ProxyError::UpstreamReset(format!("the response body broke off after {had} bytes"))
}
