//! A gRPC response held until its first message or its trailers, so that
//! a `grpc-status` (and a `grpc-retry-pushback-ms`) sent before any message
//! can be retried on (docs/reference/retries.md).

use crate::policy::Pushback;
use crate::proxy::body::RelayedBody;
use crate::proxy::headers::grpc_status;
use http::{HeaderMap, Response};
use tokio::time::Instant;

/// Holds a gRPC response until its first message or its trailers, whichever
/// comes first, to find a `grpc-status` sent before any message (the only
/// kind a retry can act on: once a message is out, the call has started).
/// After the first data frame the response streams as it comes, so a server
/// stream is never held back. Whatever happens, the client gets the same
/// body: the frames held, then the rest. Returns the trailers' gRPC status
/// and pushback, when they came before any message.
pub(super) async fn hold_for_trailers(
    resp: Response<crate::proxy::body::UpstreamBody>,
    limit: u64,
    until: Instant,
) -> (Response<RelayedBody>, Option<u8>, Option<Pushback>) {
    use http_body_util::BodyExt;
    let (parts, mut body) = resp.into_parts();
    let mut held: Vec<http_body::Frame<bytes::Bytes>> = Vec::new();
    let mut size = 0u64;
    let mut status = None;
    let mut pushback = None;
    let mut rest = true;
    loop {
        let frame = match tokio::time::timeout_at(until, body.frame()).await {
            Ok(Some(Ok(f))) => f,
            Ok(None) => {
                rest = false;
                break;
            }
            // An error or the deadline: hand the rest (and the error) on as it comes.
            Ok(Some(Err(_))) | Err(_) => break,
        };
        if let Some(t) = frame.trailers_ref() {
            status = grpc_status(t);
            pushback = pushback_of(t);
        }
        let message = frame.data_ref().is_some_and(|d| !d.is_empty());
        if let Some(d) = frame.data_ref() {
            size += d.len() as u64;
        }
        let is_trailers = frame.is_trailers();
        held.push(frame);
        if is_trailers {
            rest = false;
            break;
        }
        if message || size > limit {
            break;
        }
    }
    let body = crate::proxy::body::ReadAhead::new(held, if rest { Some(body) } else { None });
    (
        Response::from_parts(parts, RelayedBody::Right(body)),
        status,
        pushback,
    )
}

/// What a head or trailers say of retrying the answer
/// (docs/reference/retries.md#pushback): a proxy's refusal, or gRPC's
/// `grpc-retry-pushback-ms`.
pub(super) fn pushback_of(h: &HeaderMap) -> Option<Pushback> {
    let refused = crate::proxy::error::refused_by_proxy(h);
    let grpc = h.get("grpc-retry-pushback-ms").map(|v| v.as_bytes());
    Pushback::of(refused, grpc)
}
