//! Answers from the response cache on the fast path
//! (docs/reference/cache.md#response-cache): whenever the order's cache
//! step (`proxy::order::cache`) answers from an entry, it is written as it
//! is with `Age` and weir's marks.

use super::head::Planned;
use super::{access, reply, write_client, Ctx};
use crate::policy::cache::{CacheResult, CachedResponse};
use crate::proxy::Upstream;
use tokio::time::Instant;

impl Ctx<'_> {
    /// Answers from an entry (a fresh hit, a stale one, what a coalesced
    /// miss's leader stored, or a revalidated one: then with the attempts
    /// made). Returns whether the connection stays open.
    pub(super) async fn cache_answer(
        &mut self,
        up: &Upstream,
        start: Instant,
        p: &Planned,
        e: &CachedResponse,
        result: CacheResult,
        attempts: Option<crate::proxy::attempt::Annotations>,
    ) -> bool {
        let now = up.state.now();
        // The whole entry: `write_parts` states the length (for a HEAD
        // too) and sends the body only to a GET.
        let (mut parts, body) =
            crate::proxy::cached::entry_parts(up, e, result, false, attempts, now);
        parts.headers.remove(http::header::CONTENT_LENGTH);
        self.answer_stored(up, start, p, &parts, &body, !p.is_head_request)
            .await
    }

    /// Writes an answer weir has whole (a replay of a recorded response, a
    /// cache entry): no attempt made. Returns whether the connection stays
    /// open.
    pub(super) async fn answer_stored(
        &mut self,
        up: &Upstream,
        start: Instant,
        p: &Planned,
        parts: &http::response::Parts,
        body: &[u8],
        send_body: bool,
    ) -> bool {
        let status = parts.status.as_u16();
        let took = start.elapsed();
        up.state.metrics.status(status, took);
        let entry = access::AccessEntry {
            grpc_status: None,
            upstream: &up.config.name,
            method: "",
            path: "",
            status,
            error: None,
            attempts: up.config.annotate.then_some(0),
            retry_stop: None,
            hedge: None,
            endpoint: None,
            took,
            bytes_out: if send_body { body.len() as u64 } else { 0 },
            who: access::Who::default(),
        };
        crate::proxy::traced::finish(p.trace.as_ref(), &entry, Some(&parts.headers));
        self.access_log(p, entry);
        let close = p.close || *self.stop.borrow();
        self.bufs.out.clear();
        reply::write_parts(parts, None, body, close, send_body, &mut self.bufs.out);
        write_client(self.stream, &self.bufs.out, self.write_timeout).await && !close
    }
}
