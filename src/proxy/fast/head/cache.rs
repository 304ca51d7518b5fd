//! Whether the response cache answers a request on the fast path: only a
//! fresh hit does (`fast::hit` writes it); everything else a cached
//! upstream gets goes to hyper's path, where the cache is written
//! (`proxy::cached`).

use crate::policy::cache::{CacheRequest, CacheResult, CachedResponse, Decision};
use crate::proxy::Upstream;
use std::sync::Arc;

/// The entry that answers this request, when the upstream's cache has a
/// fresh one for it; `None`: hyper's path serves it.
pub(super) fn lookup(
    up: &Upstream,
    method: &str,
    authority: Option<&str>,
    host: Option<&str>,
    target: &str,
    fields: &[httparse::Header<'_>],
) -> Option<Arc<CachedResponse>> {
    let pairs = || fields.iter().map(|f| (f.name.as_bytes(), f.value));
    let req = CacheRequest::parse(method, pairs()).ok()?;
    let key = crate::proxy::cached::key_of(up, authority, host, target);
    let now = up.state.now();
    let mut cache = up.state.cache();
    let c = cache.as_mut()?;
    let found = c.lookup(&key, &req, pairs(), now);
    match (found.decision, found.entry) {
        (Decision::Fresh, Some(e)) => {
            c.count(CacheResult::Hit);
            Some(e)
        }
        _ => None,
    }
}
