//! Where both data paths meet tracing (docs/reference/tracing.md#tracing):
//! a routed request's trace begun from its fields, and its server span
//! ended from the access log's entry, which says everything the span
//! does. With `[tracing]` off this is one check per request.

use super::access::AccessEntry;
use super::request::RequestHead;
use super::{Snapshot, Upstream};
use crate::trace::{Finish, SpanStart, Trace};
use tokio::time::Instant;

/// The trace of a routed request, when weir records it: the request's own
/// context joined, or a new trace when `[tracing] sample` picks it.
/// `lowered`: the client's own deadline; `protocol`: `"1.1"` or `"2"`.
#[inline]
pub(crate) fn begin(
    snap: &Snapshot,
    up: &Upstream,
    h: &impl RequestHead,
    lowered: Option<std::time::Duration>,
    protocol: &'static str,
) -> Option<Trace> {
    if !snap.tracer.is_on() {
        return None;
    }
    let cfg = &up.config;
    let b = || SpanStart {
        method: h.method(),
        path: h.path(),
        upstream: &cfg.name,
        deadline: lowered.map_or(cfg.timeout, |l| l.min(cfg.timeout)),
        protocol,
    };
    snap.tracer.begin(|| h.fields(), Instant::now, b)
}

/// Ends `trace`'s server span as the access log's `e` tells it;
/// `headers`: the response's, for the cache's result and a replay.
pub(crate) fn finish(
    trace: Option<&Trace>,
    e: &AccessEntry<'_>,
    headers: Option<&http::HeaderMap>,
) {
    let Some(t) = trace else { return };
    let field = |name: &str| headers?.get(name)?.to_str().ok();
    t.finish(Finish {
        status: e.status,
        error: e.error,
        attempts: e.attempts,
        retry_stop: e.retry_stop,
        took: e.took,
        cache: field("x-weir-cache"),
        replay: field(crate::policy::idempotency::REPLAYED_HEADER) == Some("true"),
    });
}

/// A trace's id as the access log prints it.
pub(crate) fn id<'b>(trace: Option<&Trace>, buf: &'b mut [u8; 32]) -> Option<&'b str> {
    Some(trace?.trace_id_text(buf))
}

/// Whether `name` is a trace-context field weir replaces on a traced
/// request: `traceparent` and `b3` by weir's `traceparent`, `tracestate` by
/// its bounded form ([`crate::trace::context::tracestate`]), and the B3
/// multi-header fields dropped.
pub(crate) fn replaced(name: &str) -> bool {
    use crate::trace::context::{B3, B3_MULTI, TRACEPARENT, TRACESTATE};
    name.eq_ignore_ascii_case(TRACEPARENT)
        || name.eq_ignore_ascii_case(B3)
        || name.eq_ignore_ascii_case(TRACESTATE)
        || (name.len() > 5
            && name[..5].eq_ignore_ascii_case("x-b3-")
            && B3_MULTI.iter().any(|m| name.eq_ignore_ascii_case(m)))
}
