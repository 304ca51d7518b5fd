//! How one attempt uses the endpoints
//! (docs/reference/endpoints.md#connections): [`connect_any`] picks and has
//! `connect` (the checkout's: the pool, else the one dialler `pool::open`)
//! reach it, trying the next endpoint when one refuses; [`report`] gives the
//! attempt's outcome to the endpoint it went to and keeps the request's
//! avoid list.

use super::{Endpoints, Picked};
use crate::upstream::Address;
use std::sync::Arc;

/// The most endpoints one attempt dials when they refuse: a connection
/// that was never made sent nothing, so the next endpoint is tried within
/// the same attempt.
const MAX_DIALS: usize = 3;

/// Picks an endpoint (avoiding `avoid`; `first` when the caller has picked
/// one already) and `connect`s to it; an endpoint that refuses (a connect
/// failure, not TLS) is reported, added to `avoid`, and the next one tried,
/// up to [`MAX_DIALS`] (and never one twice).
/// The endpoint being dialled waits in `slot`, so that an attempt given up
/// mid-connect (its per-try deadline) still reports it; on success it is
/// left there for the attempt's outcome.
pub(crate) async fn connect_any<S, F, Fut>(
    endpoints: &Arc<Endpoints>,
    avoid: &mut Vec<Address>,
    started: tokio::time::Instant,
    slot: &mut Option<Picked>,
    mut connect: F,
) -> Result<S, crate::upstream::client::SendError>
where
    F: FnMut(Address) -> Fut,
    Fut: std::future::Future<Output = Result<S, crate::upstream::client::SendError>>,
{
    use crate::upstream::client::{Failure, SendError};
    let mut tries = 0;
    let mut dialled: Vec<Address> = Vec::new();
    loop {
        if slot.is_none() {
            *slot = endpoints.pick(avoid);
        }
        let Some(addr) = slot.as_ref().map(Picked::addr) else {
            return Err(SendError::new(
                Failure::Connect,
                "the upstream has no endpoint yet (its name has not resolved)",
            ));
        };
        tries += 1;
        match connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => {
                if !avoid.contains(&addr) {
                    avoid.push(addr);
                }
                dialled.push(addr);
                let Some(p) = slot.take() else {
                    return Err(e);
                };
                let n = p.of;
                p.finish(Some(true), started);
                // Another endpoint when one exists that this call has not
                // dialled (the avoid list may hold them all from earlier
                // attempts; then `pick` falls back to any).
                let next = endpoints
                    .pick(avoid)
                    .filter(|q| !dialled.contains(&q.addr()));
                if e.kind != Failure::Connect
                    || e.tls
                    || tries >= n.min(MAX_DIALS)
                    || next.is_none()
                {
                    return Err(e);
                }
                *slot = next;
            }
        }
    }
}

/// Reports an attempt's outcome on the endpoint it went to (when it got
/// one), and notes that endpoint in `avoid` when it failed this request or
/// refused the stream, so that a retry goes elsewhere.
pub(crate) fn report(
    picked: Option<Picked>,
    outcome: &crate::policy::Outcome,
    failures: &crate::policy::BreakerParams,
    started: tokio::time::Instant,
    avoid: &mut Vec<Address>,
) {
    use crate::policy::Outcome;
    let Some(p) = picked else { return };
    let failure = outcome.breaker_failure(failures);
    // Whatever a retry may follow goes elsewhere: a failure, a refused
    // stream, a 429 or 5xx, a gRPC error. With one endpoint there is
    // nowhere else to go (and nothing more to work out).
    let retry_may_follow = || match outcome {
        Outcome::Response {
            status,
            grpc_status,
            ..
        } => *status >= 500 || *status == 429 || grpc_status.is_some_and(|g| g != 0),
        Outcome::ClientGone => false,
        _ => true,
    };
    let elsewhere = p.of > 1 && (failure == Some(true) || retry_may_follow());
    if elsewhere && !avoid.contains(&p.addr()) {
        avoid.push(p.addr());
    }
    p.finish(failure, started);
}

/// The endpoint a response came from, in its extensions on the general
/// path (for the access log).
#[derive(Debug, Clone, Copy)]
pub struct Served(pub Address);
