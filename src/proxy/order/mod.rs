//! The one order a request to an upstream is served in, whichever codec
//! carried it (docs/reference/life-of-a-request.md#the-life-of-a-request):
//!
//! deadline → the response cache (an entry answers, or a miss takes its
//! turn at its key's fill) → a keyed write's record → admission
//! (client-side throttling, rate limit, concurrency) → the request body →
//! the breaker → the attempts → the cache again (the response stored, or a
//! stale entry answering a failure) → the answer, with a keyed write's
//! outcome recorded (forgotten when it ends before any attempt).
//!
//! The codecs supply how each step reads, waits, sends and answers
//! ([`Codec`]): the fast path's HTTP/1.1 (`proxy::fast`), hyper's HTTP/1.1
//! and HTTP/2 (`proxy::general::exchange`), and CONNECT tunnels (`proxy::general::tunnel`).
//! None of them orders the steps itself. Keyed writes ([`KeyedWrites`]) and
//! the response cache ([`cache::CacheIo`]) are a codec's options: the
//! HTTP codecs take them ([`serve_http`]), a tunnel does not ([`serve`]).

pub(crate) mod cache;

use super::attempt::{self, Admitted, Annotations, Attempted, Attempts};
use super::cached::Cached;
use super::error::ProxyError;
use super::idempotent::{self, Begun, Recorder};
use super::upload::Upload;
use super::Upstream;
use crate::policy::idempotency::{Ending, StoredResponse};
use crate::policy::RequestFacts;
use crate::state::gate::Slot;
use crate::upstream::Address;
use cache::{CacheIo, CacheStep};
use std::time::Duration;
use tokio::time::Instant;

/// What one codec supplies to the order ([`serve`]): how a request is
/// read, sent and answered. Each step returns the codec's `Out` when the
/// request ends there: answered, or its client gone. The request itself is
/// handed from step to step ([`Codec::Arrived`] → [`Codec::Ready`] → the
/// attempts), so no step meets a request another step already took.
/// Keyed writes are a codec's option ([`KeyedWrites`]).
pub(crate) trait Codec {
    /// What serving a request ends in.
    type Out;
    /// A response from the upstream, as the codec's transport reads it.
    type Response;
    /// The request as it arrived: what of its head and body the codec
    /// carries into the order.
    type Arrived;
    /// The request made ready for the attempts ([`Codec::body`]).
    type Ready;

    /// The deadlines the client asked for (`x-weir-timeout-ms`,
    /// `grpc-timeout`): they lower the upstream's `timeout`, never raise it.
    /// None by default.
    fn asked(&self) -> [Option<Duration>; 2] {
        [None, None]
    }

    /// Admission up to the body ([`attempt::admit`]), watching the client
    /// while it waits; `None` when the client went away meanwhile. By
    /// default hyper watches the client (it drops the request's future when
    /// the client goes), so nothing is raced.
    async fn admit(
        &mut self,
        up: &Upstream,
        key: Option<&str>,
        start: Instant,
        deadline: Instant,
    ) -> Option<Result<Admitted, ProxyError>> {
        attempt::admit(up, key, start, deadline, &mut attempt::Dropped).await
    }

    /// The request body, ready for the attempts (whole when it is kept for a
    /// replay), with whether it had to be waited for. Its read is timed by
    /// `upload` and bounded by it (`idle_timeout`, the client's own
    /// deadline), not by `timeout` (docs/reference/deadlines.md#uploads).
    async fn body(
        &mut self,
        up: &Upstream,
        arrived: Self::Arrived,
        upload: &mut Upload,
    ) -> Result<(Self::Ready, bool), Self::Out>;

    /// What the retry policy asks of the request (method, key, body).
    fn facts(&self, ready: &Self::Ready) -> RequestFacts;

    /// Runs the attempts over the codec's transport (`t0`: the first one's
    /// start); `None` when the client went away.
    async fn drive(
        &mut self,
        up: &Upstream,
        ready: Self::Ready,
        attempts: &mut Attempts<'_>,
        t0: Instant,
        detached: bool,
    ) -> Option<Attempted<Self::Response>>;

    /// weir's own error; `spent`: the attempts' annotations, once they have
    /// begun.
    async fn refuse(
        &mut self,
        up: &Upstream,
        error: ProxyError,
        spent: Option<Annotations>,
        endpoint: Option<Address>,
    ) -> Self::Out;

    /// The client went away: nothing is answered.
    fn gone(&mut self) -> Self::Out;

    /// The attempts' outcome answered: the response relayed (or kept for a
    /// keyed write's record through `recorder`), or the failure as weir's
    /// error. `slot` is held until the response is done with.
    async fn answer(
        &mut self,
        up: &Upstream,
        attempted: Attempted<Self::Response>,
        spent: Annotations,
        recorder: Option<Recorder>,
        slot: Slot,
    ) -> Self::Out;
}

/// A codec that carries keyed writes
/// (docs/reference/idempotency.md#idempotency-keys), served by
/// [`serve_keyed`].
pub(crate) trait KeyedWrites: Codec {
    /// Whether the request carries an idempotency key at all: one that
    /// does not never makes [`KeyedWrites::begin_keyed`]'s future.
    fn keyed(&self) -> bool;

    /// The request's body read as its fingerprint needs (timed by `upload`,
    /// as [`Codec::body`] reads it), and the store asked; `None` when the
    /// request is no keyed write. The request comes back for the steps
    /// that follow.
    async fn begin_keyed(
        &mut self,
        up: &Upstream,
        arrived: Self::Arrived,
        deadline: Instant,
        upload: &mut Upload,
    ) -> Result<(Option<Begun>, Self::Arrived), Self::Out>;

    /// A keyed write's stored response, replayed.
    async fn replay(&mut self, up: &Upstream, stored: StoredResponse) -> Self::Out;
}

/// How the steps after admission end: the codec's own ([`Plain`]), or
/// with the response cache's around them ([`CacheStep`]).
pub(crate) trait Steps<C: Codec> {
    /// Whether they leave this request to the codec alone.
    fn inert(&self) -> bool;

    /// weir's error `e` before or instead of an upstream's answer.
    async fn refuse(
        &self,
        up: &Upstream,
        codec: &mut C,
        e: ProxyError,
        spent: Option<Annotations>,
        endpoint: Option<Address>,
    ) -> C::Out;

    /// The attempts' outcome answered.
    async fn finish(
        &self,
        up: &Upstream,
        codec: &mut C,
        attempted: Attempted<C::Response>,
        spent: Annotations,
        recorder: Option<Recorder>,
        slot: Slot,
    ) -> Finished<C>;
}

/// How the steps after the attempts ended.
pub(crate) enum Finished<C: Codec> {
    /// The request ended: answered, or its client gone.
    Out(C::Out),
    /// The request is to be served again from admission on (a 304 that
    /// validated no entry, asked again without validators).
    Again(C::Arrived),
}

/// The codec's own steps, nothing around them.
pub(crate) struct Plain;

impl<C: Codec> Steps<C> for Plain {
    fn inert(&self) -> bool {
        true
    }

    async fn refuse(
        &self,
        up: &Upstream,
        codec: &mut C,
        e: ProxyError,
        spent: Option<Annotations>,
        endpoint: Option<Address>,
    ) -> C::Out {
        codec.refuse(up, e, spent, endpoint).await
    }

    async fn finish(
        &self,
        up: &Upstream,
        codec: &mut C,
        attempted: Attempted<C::Response>,
        spent: Annotations,
        recorder: Option<Recorder>,
        slot: Slot,
    ) -> Finished<C> {
        Finished::Out(codec.answer(up, attempted, spent, recorder, slot).await)
    }
}

/// Serves one request to `up` in the order of this module's summary, a
/// codec without keyed writes or a cache. `start`: when the request
/// arrived; `key`: its rate-limit key.
pub(crate) async fn serve<C: Codec>(
    up: &Upstream,
    codec: &mut C,
    arrived: C::Arrived,
    start: Instant,
    key: Option<&str>,
) -> C::Out {
    let asked = codec.asked();
    let deadline = attempt::deadline(&up.config, start, asked);
    let mut upload = Upload::new(start, asked, up.config.idle_timeout);
    let clock = (deadline, &mut upload);
    match admitted(up, codec, arrived, start, key, clock, None, &Plain).await {
        Finished::Out(out) => out,
        // Plain steps never ask again.
        Finished::Again(_) => codec.gone(),
    }
}

/// [`serve`] for an HTTP codec, with its steps in order: the cache's part
/// (`cached`, what the cache found for the request) first — a request an
/// entry answers is never admitted — then a keyed write's body, read for
/// its fingerprint, so that a repeat is answered from the record before
/// admission could hold it back.
pub(crate) async fn serve_http<C: KeyedWrites + CacheIo>(
    up: &Upstream,
    codec: &mut C,
    arrived: C::Arrived,
    start: Instant,
    key: Option<&str>,
    cached: Cached,
) -> C::Out {
    let asked = codec.asked();
    let deadline = attempt::deadline(&up.config, start, asked);
    // The time the client's body takes to arrive is set aside
    // (docs/reference/deadlines.md#uploads).
    let mut upload = Upload::new(start, asked, up.config.idle_timeout);
    // Held until the request ends: the key's other misses wait for what
    // this one stores.
    // (Boxed: only a cached upstream's reads take this step, and every
    // request's future would carry it inline.)
    let _lead = match &cached {
        Cached::Off | Cached::Invalidates(_) => None,
        // An entry answers: nothing else of the order is taken.
        Cached::Hit(e) => return cache::hit(up, codec, e).await,
        _ => match Box::pin(cache::before(up, codec, &cached, deadline.0)).await {
            Err(out) => return out,
            Ok(lead) => lead,
        },
    };
    let (begun, arrived) = match codec.keyed() {
        false => (None, arrived),
        true => match codec
            .begin_keyed(up, arrived, deadline.0, &mut upload)
            .await
        {
            Err(out) => return out,
            Ok(b) => b,
        },
    };
    let recorder = match begun {
        None | Some(Begun::Unrecorded) => None,
        Some(Begun::Replay(stored)) => return codec.replay(up, stored).await,
        Some(Begun::Refused(e)) => return codec.refuse(up, e, None, None).await,
        Some(Begun::Forward(r)) => Some(r),
    };
    // One call of the order from admission on (kept inlined: a second
    // call site would make it a layer of its own on every request's polls,
    // `bench/callgrind.sh`); a second turn only when a 304 validated no
    // entry, asked again without validators — a miss, as the cache sees
    // it now.
    let mut plain = None;
    let (mut arrived, mut recorder) = (arrived, recorder);
    loop {
        let step = CacheStep {
            cached: plain.as_ref().unwrap_or(&cached),
        };
        let clock = (deadline, &mut upload);
        // Awaited where it is made: bound to a name first, the future was
        // moved once more, whole.
        match admitted(up, codec, arrived, start, key, clock, recorder, &step).await {
            Finished::Out(out) => return out,
            Finished::Again(_) if plain.is_some() => return codec.gone(),
            Finished::Again(again) => {
                plain = Some(match &cached {
                    Cached::Fill(f) => Cached::Fill(Box::new(f.plain())),
                    _ => Cached::Off,
                });
                (arrived, recorder) = (again, None);
            }
        }
    }
}

/// The order from admission on; `deadline`: the request's on arrival, and
/// whether the client lowered it; `upload`: its body's, which moves it on.
#[allow(clippy::too_many_arguments)]
async fn admitted<C: Codec, S: Steps<C>>(
    up: &Upstream,
    codec: &mut C,
    arrived: C::Arrived,
    start: Instant,
    key: Option<&str>,
    ((deadline, lowered), upload): ((Instant, bool), &mut Upload),
    mut recorder: Option<Recorder>,
    steps: &S,
) -> Finished<C> {
    // Until the first attempt nothing has reached the upstream: a keyed
    // write that ends before it is forgotten, so its key may be tried again
    // (docs/reference/idempotency.md#idempotency-keys).
    let unsent = |recorder: &mut Option<Recorder>| {
        if let Some(r) = recorder.take() {
            let _ = r.finish(Ending::Failed, None);
        }
    };
    // Admission in the order of docs/reference/admission.md#admission:
    // client-side throttling, rate limit, concurrency; the body is read
    // before the breaker is asked, so a slow upload never holds a half-open
    // probe slot. A keyed write's body, read already, moved the deadline on.
    let by = upload.deadline(deadline, Instant::now);
    let (mut slot, waited, taken) = match codec.admit(up, key, start, by).await {
        None => {
            unsent(&mut recorder);
            return Finished::Out(codec.gone());
        }
        Some(Err(e)) => {
            unsent(&mut recorder);
            return Finished::Out(steps.refuse(up, codec, e, None, None).await);
        }
        Some(Ok(a)) => (a.slot, a.waited, a.taken),
    };
    let (ready, body_waited) = match codec.body(up, arrived, upload).await {
        Ok(r) => r,
        Err(out) => {
            unsent(&mut recorder);
            return Finished::Out(out);
        }
    };
    // The body is whole (or streams): from here the request waits for the
    // upstream, and takes its place under an adaptive limit
    // (docs/reference/admission.md#adaptive-limit). A slow upload never
    // held one.
    if let Err(refused) = up.state.gate.place(&mut slot) {
        attempt::refund(up, key, taken);
        unsent(&mut recorder);
        let e = ProxyError::from(refused);
        return Finished::Out(steps.refuse(up, codec, e, None, None).await);
    }
    // Nothing waited for: `start` still tells the time.
    let t0 = match waited || body_waited {
        true => Instant::now(),
        false => start,
    };
    let ticket = match attempt::admit_breaker_at(&up.state, t0) {
        Ok(t) => t,
        Err(e) => {
            attempt::refund(up, key, taken);
            unsent(&mut recorder);
            return Finished::Out(steps.refuse(up, codec, e, None, None).await);
        }
    };
    let facts = codec.facts(&ready);
    // A caller the upstream told it is over its quota is refused here, on
    // its own account (docs/reference/admission.md#client-side-throttling).
    if !up.state.throttle.admit_caller(facts.caller) {
        attempt::refund(up, key, taken);
        unsent(&mut recorder);
        let e = ProxyError::RateLimited { retry_after: None };
        return Finished::Out(steps.refuse(up, codec, e, None, None).await);
    }
    let clock = ((deadline, lowered), upload.clone());
    let begun = Attempts::begin(up, ticket, facts, key, clock, t0);
    let Ok(mut attempts) = begun else {
        let none = Annotations {
            attempts: 0,
            stop: None,
            hedge: None,
        };
        let e = ProxyError::DeadlineExceeded;
        unsent(&mut recorder);
        return Finished::Out(steps.refuse(up, codec, e, Some(none), None).await);
    };
    let detached = recorder.is_some();
    let Some(attempted) = codec.drive(up, ready, &mut attempts, t0, detached).await else {
        return Finished::Out(codec.gone());
    };
    // The answer is in: delivering it to the client is not the upstream's
    // concurrency.
    slot.answered();
    let spent = Annotations {
        attempts: attempts.made(),
        stop: attempted.stop,
        hedge: attempts.hedged,
    };
    drop(attempts);
    if let Err(e) = &attempted.result {
        if let Some(r) = recorder.take() {
            let _ = r.finish(idempotent::ending_of(e), None);
        }
    }
    // Steps with nothing to do for this request are not a layer around
    // the codec's answer (its future moved once less: `bench/callgrind.sh`).
    if steps.inert() {
        return Finished::Out(codec.answer(up, attempted, spent, recorder, slot).await);
    }
    steps
        .finish(up, codec, attempted, spent, recorder, slot)
        .await
}
