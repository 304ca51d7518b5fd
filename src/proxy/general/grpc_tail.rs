//! A gRPC answer whose status comes in its trailers, judged when they come
//! (docs/guide/tls-and-grpc.md#grpc-policies): its `grpc-status` is the
//! call's outcome for the breaker, client-side throttling and the metrics,
//! never the HTTP 200 its head carried.

use crate::policy::Outcome;
use crate::proxy::attempt::Pending;
use crate::proxy::body::{Body, BoxError};
use crate::upstream::Picked;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// `CANCELLED`: the client left before the status came.
const CANCELLED: u8 = 1;
/// `UNKNOWN`: the answer ended without a status.
const UNKNOWN: u8 = 2;

/// A response body that settles its call's outcome at its trailers (or
/// its end, or its error); dropped before them, the client left.
pub(crate) struct GrpcTail {
    inner: Body,
    pending: Option<Tail>,
}

pub(crate) use crate::proxy::attempt::pending;

/// The endpoint that gave an answer whose status is still to come, in the
/// response's extensions until the exchange hands it to its [`Tail`].
#[derive(Clone)]
pub(crate) struct LateEndpoint(Arc<Mutex<Option<(Picked, Instant)>>>);

impl LateEndpoint {
    pub(crate) fn new(picked: Option<(Picked, Instant)>) -> Self {
        LateEndpoint(Arc::new(Mutex::new(picked)))
    }

    /// The endpoint and when its attempt started.
    pub(crate) fn take(&self) -> Option<(Picked, Instant)> {
        self.0.lock().ok()?.take()
    }
}

/// What is settled at the end.
pub(crate) struct Tail {
    /// The endpoint that answered, judged by the status too.
    pub(crate) endpoint: Option<(Picked, Instant)>,
    pub(crate) pending: Pending,
    /// The request's time to its response head.
    pub(crate) took: Duration,
    /// Who asked, for client-side throttling.
    pub(crate) caller: Option<u64>,
}

impl GrpcTail {
    pub(crate) fn new(inner: Body, tail: Tail) -> Self {
        GrpcTail {
            inner,
            pending: Some(tail),
        }
    }

    /// Settles the call: `code` is its status, `broke` says its body broke
    /// off (a failure whatever the code).
    fn settle(&mut self, code: Option<u8>, broke: bool) {
        let Some(t) = self.pending.take() else {
            return;
        };
        let state = t.pending.verdict.state();
        let outcome = if broke {
            Outcome::Reset { request_sent: true }
        } else {
            Outcome::Response {
                status: 200,
                retry_after: None,
                grpc_status: Some(code.unwrap_or(UNKNOWN)),
                pushback: None,
            }
        };
        state.metrics.attempt(&outcome, t.pending.took);
        let client_got = match outcome {
            Outcome::Response {
                grpc_status: Some(c),
                ..
            } => c,
            _ => crate::policy::grpc::UNAVAILABLE,
        };
        state.metrics.grpc_call(200, None, client_got, t.took);
        state
            .throttle
            .answered(tokio::time::Instant::now(), &outcome, t.caller);
        let failure = outcome.breaker_failure(state.live().breaker.params());
        if let Some((p, started)) = t.endpoint {
            p.finish(failure, started);
        }
        t.pending.verdict.settle(failure);
    }
}

impl http_body::Body for GrpcTail {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(t) = f.trailers_ref() {
                    let code = crate::proxy::headers::grpc_status(t);
                    this.settle(code, false);
                }
            }
            Some(Err(_)) => this.settle(None, true),
            None => this.settle(None, false),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for GrpcTail {
    fn drop(&mut self) {
        // The client left before the status: counted as it saw it, and no
        // verdict for the breaker (the pending verdict releases itself).
        if let Some(t) = self.pending.take() {
            let state = t.pending.verdict.state();
            state.metrics.grpc_call(200, None, CANCELLED, t.took);
        }
    }
}
