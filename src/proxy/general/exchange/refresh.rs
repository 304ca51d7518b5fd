//! The background refresh of a stale entry (`stale-while-revalidate`,
//! docs/reference/cache.md#response-cache): one request per key at a time,
//! weir's own, served in the one order on the general path with the entry's
//! validators; the order's cache step stores what it brings.

use crate::policy::cache::{CacheRequest, CachedResponse};
use crate::proxy::cached::{self, Cached, Filling};
use crate::proxy::Upstream;
use crate::upstream::pool::held::ConnCtx;
use http::request::Parts;
use http::Method;
use std::sync::Arc;
use tokio::time::Instant;

/// Starts the one background refresh of `key`, unless one is running:
/// `parts`, the head of the request the stale entry answered.
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
    // A copy of the head (its extensions, which only upgrades use, are not
    // copied), asked as a GET.
    let (mut ask, ()) = http::Request::new(()).into_parts();
    ask.method = Method::GET;
    ask.uri = parts.uri.clone();
    ask.version = parts.version;
    ask.headers = parts.headers.clone();
    let pool = pool.clone();
    tokio::spawn(async move {
        let conn = ConnCtx::new(pool);
        let req = CacheRequest::parse("GET", cached::pairs(&ask.headers)).unwrap_or_default();
        let asked = crate::proxy::request::read(&up.config, &ask).unwrap_or_default();
        let fill = Filling::refresh(key.clone(), req, entry);
        let cached = Cached::Fill(Box::new(fill));
        let body = crate::proxy::body::empty();
        let start = Instant::now();
        let parsed = Ok(asked);
        let sent = super::with_upstream(&up, &conn, ask, body, start, false, parsed, cached);
        // The response is read whole when stored; otherwise let go.
        let _ = sent.await;
        if let Ok(mut f) = up.state.fills.lock() {
            f.end_refresh(&key);
        }
    });
}
