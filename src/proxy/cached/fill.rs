//! A key's fill (docs/reference/cache.md#response-cache), on either path:
//! concurrent misses of one key coalesced behind the first, and whether
//! and how a response to it is stored.

use super::Upstream;
use crate::policy::cache::{
    storable, CacheRequest, CacheStore, CachedResponse, Fill, Freshness, ResponseFacts,
};
use std::sync::Arc;
use tokio::time::Instant;

/// Ends the leader's fill however it ends: the registry forgets it and the
/// followers wake.
pub(crate) struct EndFill<'a> {
    up: &'a Upstream,
    key: &'a str,
    done: tokio::sync::watch::Sender<()>,
}

impl Drop for EndFill<'_> {
    fn drop(&mut self) {
        if let Ok(mut f) = self.up.state.fills.lock() {
            f.end_fill(self.key);
        }
        let _ = self.done.send(());
    }
}

/// A request's turn at filling its key (docs/reference/cache.md#response-cache):
/// concurrent misses of one key are coalesced, the first goes upstream and
/// the others wait for what it stores.
pub(crate) enum Turn<'a> {
    /// The first request for the key: it goes upstream; the others wake
    /// when this is dropped.
    Lead(EndFill<'a>),
    /// The request that went upstream stored an entry this one selects.
    Stored(Arc<CachedResponse>),
    /// The request's deadline passed while it waited.
    TimedOut,
    /// Nothing stored for it: it goes upstream itself.
    Alone,
}

/// Takes a turn at filling `key` ([`Turn`]); `select` picks, after the
/// wait, the entry the waiting request's fields select.
pub(crate) async fn take_turn<'a>(
    up: &'a Upstream,
    key: &'a str,
    deadline: Instant,
    select: impl FnOnce(&CacheStore) -> Option<Arc<CachedResponse>>,
) -> Turn<'a> {
    let (done, waiter) = tokio::sync::watch::channel(());
    let role = (up.state.fills.lock())
        .map(|mut f| f.begin_fill(key, || waiter))
        .unwrap_or(Fill::Leader);
    let mut w = match role {
        Fill::Leader => return Turn::Lead(EndFill { up, key, done }),
        Fill::Follower(w) => w,
    };
    let began = up.state.now();
    let waited = tokio::time::timeout_at(deadline, w.changed()).await;
    let fetched = {
        let cache = up.state.cache();
        let e = cache.as_ref().and_then(select);
        e.filter(|e| e.stored_at >= began)
    };
    match (fetched, waited) {
        (Some(e), _) => Turn::Stored(e),
        (None, Err(_)) => Turn::TimedOut,
        (None, Ok(_)) => Turn::Alone,
    }
}

/// Whether a response with `status` and `fields` to a fill of `key` is
/// stored: its freshness and the largest body stored (`max_object_bytes`).
/// `None`: not stored, and the variant the request's fields select is
/// dropped (a new response supersedes it either way).
pub(crate) fn to_store<'a, 'b, R, Q>(
    up: &Upstream,
    key: &str,
    req: &CacheRequest,
    status: u16,
    fields: R,
    req_fields: Q,
) -> Option<(Freshness, usize)>
where
    R: IntoIterator<Item = (&'a [u8], &'a [u8])>,
    Q: IntoIterator<Item = (&'b [u8], &'b [u8])> + Clone,
{
    let params = up.state.cache().as_ref().map(|c| c.params().clone())?;
    let facts = ResponseFacts::parse(status, fields);
    let stored = storable(req, &facts, &params, up.state.clock.wall());
    if stored.is_none() {
        if let Some(c) = up.state.cache().as_mut() {
            c.remove(key, req_fields);
        }
    }
    stored.map(|f| (f, params.max_object_bytes))
}

/// Stores a response read whole, for a request with `req_fields`.
pub(crate) fn insert<'a, Q>(up: &Upstream, key: &str, req_fields: Q, r: CachedResponse)
where
    Q: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
{
    if let Some(c) = up.state.cache().as_mut() {
        c.insert(key, req_fields, r);
    }
}
