//! The response cache's misses and writes on the fast path
//! (docs/reference/cache.md#response-cache): a miss takes its turn at
//! filling its key (coalesced with the others of that key, as on hyper's
//! path, `proxy::cached::take_turn`), goes upstream, and its response is
//! read whole before any of it is relayed when it may be stored, so that a
//! body that breaks off is weir's error and nothing is stored; a write that
//! succeeds drops its target's entries.

use super::head::cache::{request_fields, response_fields, Cached, Filling};
use super::head::{ChunkedRelay, Framing, Planned};
use super::io::read_more;
use super::transport::Exchange;
use super::{Ctx, OwnError};
use crate::policy::cache::{CacheResult, CachedResponse};
use crate::proxy::cached::{self, EndFill, Turn};
use crate::proxy::error::ProxyError;
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
                    .cache_answer(up, start, p, &e, CacheResult::Coalesced)
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

    /// Starts the background refresh of a stale entry that answers within
    /// its `stale-while-revalidate` (one per key at a time), and counts the
    /// stale answer.
    pub(super) fn refresh(&self, up: &Upstream, p: &Planned, e: &Arc<CachedResponse>, key: &str) {
        let head = self.bufs.client.get(..p.head_len).unwrap_or_default();
        if let Some(parts) = super::head::cache::request_parts(head) {
            cached::refresh(up, &parts, key, e);
        }
        if let Some(c) = up.state.cache().as_mut() {
            c.count(CacheResult::Stale);
        }
    }

    /// What the cache does with an upstream's response, before it is
    /// relayed: a write's success invalidates; a miss's response is stored
    /// when it may be, its body read whole first. `Ok`: the mark the client's
    /// response carries; `Err`: the body broke off before it was whole.
    pub(super) async fn cache_response(
        &mut self,
        up: &Upstream,
        p: &Planned,
        x: &mut Exchange,
    ) -> Result<Option<CacheResult>, ProxyError> {
        let f = match &p.cache {
            Cached::Fill(f) => f,
            Cached::Invalidates(w) => {
                if crate::policy::cache::invalidates(w.method.as_str(), x.status) {
                    if let Some(c) = up.state.cache().as_mut() {
                        c.invalidate(&w.key);
                    }
                }
                return Ok(None);
            }
            Cached::Off | Cached::Hit(_) | Cached::Stale(..) => return Ok(None),
        };
        if !f.req.head && x.status < 500 {
            self.store(up, p, f, x).await?;
        }
        if let Some(c) = up.state.cache().as_mut() {
            c.count(CacheResult::Miss);
        }
        Ok(Some(CacheResult::Miss))
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

/// weir's error for a body that ended before it was whole, as hyper's path
/// says it.
fn broke_off(had: usize) -> ProxyError {
    ProxyError::UpstreamReset(format!("the response body broke off after {had} bytes"))
}
