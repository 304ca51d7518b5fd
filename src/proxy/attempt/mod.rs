//! Admission and the attempt loop (docs/reference/life-of-a-request.md#the-life-of-a-request): the data plane enforcing
//! what the policy core decides.
//!
//! Admission, in the order of docs/reference/admission.md#admission: the rate limiter (waits up to
//! `max_wait`, never past the deadline, else 429 `rate_limited`), the
//! concurrency gate (503 `overloaded`), the breaker (503 `circuit_open`). Then each attempt: build the
//! request, send it under the per-try timeout, record the breaker's verdict,
//! and ask `policy::decide` — which checks docs/reference/retries.md#the-retry-decision in order and asks the budget,
//! breaker and limiter lazily through `LiveGates`. A retry sleeps its delay;
//! everything else returns the last outcome unchanged.
//!
//! Cancellation is structural: when the client goes away hyper drops this
//! future, which drops the sleep or the attempt in flight, and the breaker
//! [`BreakerTicket`] releases its slot without a verdict.
mod admit;
mod drive;
mod hedge;

pub(crate) use admit::{admit, admit_breaker_at, deadline, refund, Admitted, Dropped, Watch};
pub use drive::Annotations;
pub(crate) use drive::{
    annotate, annotate_response, annotation_fields, drive, pending, timed_out, Attempted, Attempts,
    Pending, Transport,
};
pub(crate) use hedge::{race, Hedging, Raced, Seen};
