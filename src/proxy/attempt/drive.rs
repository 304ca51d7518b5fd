//! The attempt driver: one loop for both data paths (count, per-try deadline,
//! the breaker's verdict, the retry decision, the backoff and the breaker's
//! second look after it), over a [`Transport`] that sends one attempt; and
//! weir's annotations on what it returns.

use super::admit::{BreakerTicket, Watch};
use crate::policy::{
    decide, Admission, Breaker, DecideInput, Gates, KeyedLimiter, Outcome, RequestFacts,
    RetryBudget, StopReason, Verdict,
};
use crate::proxy::error::ProxyError;
use crate::proxy::upload::Upload;
use crate::proxy::Upstream;
use crate::state::Live;
use http::{HeaderMap, HeaderValue};
use std::time::Duration;
use tokio::time::Instant;

/// The gates of docs/reference/retries.md#the-retry-decision (6–8) on this upstream's live state.
struct LiveGates<'a> {
    breaker: &'a mut Breaker,
    budget: &'a mut RetryBudget,
    limiter: Option<&'a mut KeyedLimiter>,
    /// The fleet's leased bucket, tried before `limiter` (its fallback).
    fleet: Option<crate::state::fleet::FleetBucket>,
    now: Duration,
    key: Option<&'a str>,
    /// The breaker admission for the retry, when granted.
    admission: Option<Admission>,
}

impl Gates for LiveGates<'_> {
    fn budget(&mut self, cost: u32) -> bool {
        self.budget.try_withdraw(cost, self.now)
    }
    fn breaker(&mut self) -> bool {
        match self.breaker.try_acquire(self.now) {
            Ok(a) => {
                self.admission = Some(a);
                true
            }
            Err(_) => false,
        }
    }
    fn limiter(&mut self) -> bool {
        use crate::policy::leased_tokens::Take;
        match self.fleet.as_ref().map(|b| b.take(self.now)) {
            Some(Take::Admit) => return true,
            Some(Take::Refuse { .. }) => return false,
            Some(Take::Fallback) | None => {}
        }
        match self.limiter.as_deref_mut() {
            Some(l) => l.try_acquire(self.key, self.now),
            None => true,
        }
    }
}

/// One request's attempts, as both data paths run them: the budget deposit,
/// the breaker ticket, each attempt's metrics and verdict, and the retry
/// decision with its backoff. The general path
/// (`crate::proxy::general::transport::run`) and the HTTP/1 fast
/// path (`crate::proxy::fast`) differ only in how an attempt is sent.
#[derive(Debug)]
pub(crate) struct Attempts<'a> {
    pub(super) up: &'a Upstream,
    pub(super) ticket: BreakerTicket<'a>,
    pub(super) facts: RequestFacts,
    key: Option<&'a str>,
    /// The request's deadline on arrival: [`Attempts::deadline_at`] moves
    /// it on by the time the upload takes.
    deadline: Instant,
    /// The client lowered its deadline below the upstream's `timeout`.
    lowered: bool,
    /// The request body's upload (docs/reference/deadlines.md#uploads).
    upload: Upload,
    pub(super) made: u32,
    prev_delay: Duration,
    /// The hedge's breaker slot while one is in flight.
    pub(super) hedge_ticket: Option<BreakerTicket<'a>>,
    /// The hedge's concurrency slot while one is in flight: a hedge is an
    /// attempt, and takes a slot like one.
    pub(super) hedge_slot: Option<crate::state::gate::Slot>,
    /// Hedges sent for this request.
    pub(super) hedges: u32,
    /// A write the client keyed (hedged only with `hedge.keyed_writes`).
    pub(super) keyed_write: bool,
    /// The last race's hedge: `Some(true)` when its answer was returned.
    pub(crate) hedged: Option<bool>,
    /// The request's spans, when it is traced (docs/reference/tracing.md#spans).
    pub(crate) trace: Option<crate::trace::Trace>,
    /// A gRPC call: an answer without a status in its head is judged by
    /// the status in its trailers.
    grpc: bool,
    /// That answer's verdict, its attempt and when it was made, until the
    /// trailers come ([`Attempts::take_pending`]).
    pending: Option<Pending>,
    /// The gRPC status of the last answer that had one.
    grpc_status: Option<u8>,
}

/// A gRPC answer's outcome, waiting for its trailers.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) verdict: super::admit::PendingVerdict,
    /// How long the attempt took to its head.
    pub(crate) took: Duration,
}

/// An attempt's latency for the adaptive concurrency limit
/// (docs/reference/admission.md#adaptive-limit): an answer's, or a timeout's
/// (as long as it was waited for); a connection that failed says nothing
/// about how loaded the upstream is.
pub(super) fn observe_latency(up: &Upstream, outcome: &Outcome, started: Instant, took: Duration) {
    if matches!(outcome, Outcome::Response { .. } | Outcome::Timeout) {
        up.state.gate.observe(started, took);
    }
}

/// Whether an attempt's outcome waits for the call's trailers: an answer
/// to a gRPC call whose head carried no status.
pub(crate) fn pending(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Response {
            status: 200,
            grpc_status: None,
            ..
        }
    )
}

/// What follows an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Sleep this long ([`Attempts::backoff`]), then attempt again.
    Retry(Duration),
    /// Return this attempt's outcome, with the stop reason when a retryable
    /// outcome was not retried.
    Done(Option<StopReason>),
}

impl<'a> Attempts<'a> {
    /// Deposits the first attempt into the retry budget at `t0` (a clock
    /// reading the caller already has). `deadline`: the request's on
    /// arrival, whether the client lowered it, and the upload that moves it
    /// on. `Err(t0)`: less than `min_attempt_time` is left, and an attempt
    /// started now could only time out and be blamed on the upstream (504
    /// `deadline_exceeded`).
    pub(crate) fn begin(
        up: &'a Upstream,
        ticket: BreakerTicket<'a>,
        facts: RequestFacts,
        key: Option<&'a str>,
        ((deadline, lowered), upload): ((Instant, bool), Upload),
        t0: Instant,
    ) -> Result<Self, Instant> {
        let state = &up.state;
        state.live().budget.deposit(state.now_at(t0));
        let left = upload
            .deadline(deadline, || t0)
            .saturating_duration_since(t0);
        if left < up.config.retry.min_attempt_time {
            return Err(t0);
        }
        Ok(Attempts {
            up,
            ticket,
            facts,
            key,
            deadline,
            lowered,
            upload,
            made: 0,
            prev_delay: Duration::ZERO,
            hedge_ticket: None,
            hedge_slot: None,
            hedges: 0,
            keyed_write: false,
            hedged: None,
            trace: None,
            grpc: false,
            pending: None,
            grpc_status: None,
        })
    }

    /// Marks the request a gRPC call (see [`Attempts::take_pending`]).
    pub(crate) fn set_grpc(&mut self, grpc: bool) {
        self.grpc = grpc;
    }

    /// The returned answer's outcome when it waits for its trailers: a gRPC
    /// call whose head carried no status.
    pub(crate) fn take_pending(&mut self) -> Option<Pending> {
        self.pending.take()
    }

    /// The gRPC status of the last attempt's answer, when it had one (in
    /// its head, or in trailers read before any message).
    pub(crate) fn grpc_status(&self) -> Option<u8> {
        self.grpc_status
    }

    /// Marks the request a write made replayable by its idempotency key.
    pub(crate) fn set_keyed_write(&mut self, keyed: bool) {
        self.keyed_write = keyed;
    }

    /// The request's deadline as it stands at `now`: moved on by the time
    /// its body's upload has taken (docs/reference/deadlines.md#uploads).
    pub(crate) fn deadline_at(&self, now: Instant) -> Instant {
        self.upload.deadline(self.deadline, || now)
    }

    /// The request body's upload.
    pub(crate) fn upload(&self) -> &Upload {
        &self.upload
    }

    /// Attempts made so far.
    pub(crate) fn made(&self) -> u32 {
        self.made
    }

    /// Starts an attempt: counts it, and returns when it must give up (the
    /// per-try timeout, never past the deadline), as it stands now: a body
    /// still to be read moves it on as it comes (`Upload::within`).
    pub(crate) fn start(&mut self, started: Instant) -> Instant {
        self.made += 1;
        let deadline = self.deadline_at(started);
        self.up
            .config
            .per_try_timeout
            .map(|p| (started + p).min(deadline))
            .unwrap_or(deadline)
    }

    /// Records an attempt's outcome (metrics, the breaker's verdict) without
    /// deciding anything: for an upgrade, which is never retried.
    /// `error` is weir's error for a failed attempt.
    pub(crate) fn record(
        &mut self,
        outcome: &Outcome,
        error: Option<&ProxyError>,
        started: Instant,
        ended: Instant,
    ) -> Duration {
        let state = &self.up.state;
        let took = ended.saturating_duration_since(started);
        // The client's upload is no part of the upstream's latency.
        let held = self.upload.held(started, ended);
        let waited = took.saturating_sub(held);
        observe_latency(self.up, outcome, started + held, waited);
        if let Outcome::Response { grpc_status, .. } = outcome {
            self.grpc_status = *grpc_status;
        }
        if self.grpc && pending(outcome) {
            // The call's status is in its trailers: counted, judged and
            // throttled when they come (`proxy::general::grpc_tail`).
            if self.up.config.hedge.is_some() {
                let now = state.now_at(ended);
                state.live().hedge.latency.observe(waited, now);
            }
            let verdict = self.ticket.defer(&self.up.state);
            self.pending = Some(Pending { verdict, took });
            return state.now_at(ended);
        }
        state.metrics.attempt(outcome, took);
        state.throttle.answered(ended, outcome, self.facts.caller);
        if self.up.config.hedge.is_some() {
            let now = state.now_at(ended);
            state.live().hedge.latency.observe(waited, now);
        }
        // A deadline the client lowered itself is the client's doing, not the
        // upstream's: no verdict for the breaker.
        let lowered = self.lowered || self.upload.client_binds(self.deadline, ended);
        let blame = match error {
            Some(ProxyError::DeadlineExceeded) if lowered => None,
            _ => outcome.breaker_failure(&self.up.config.breaker),
        };
        let now = state.now_at(ended);
        self.ticket.record(blame, now);
        now
    }

    /// Records an attempt and decides (docs/reference/retries.md#the-retry-decision) what follows it.
    pub(crate) fn judge(
        &mut self,
        outcome: &Outcome,
        error: Option<&ProxyError>,
        started: Instant,
        ended: Instant,
        elsewhere: bool,
    ) -> Step {
        let now = self.record(outcome, error, started, ended);
        let state = &self.up.state;
        let time_left = self.deadline_at(ended).saturating_duration_since(ended);
        let fleet = super::admit::fleet_bucket(self.up);
        let (verdict, admission) = {
            let mut guard = state.live();
            let Live {
                breaker,
                budget,
                limiter,
                rng,
                ..
            } = &mut *guard;
            let mut gates = LiveGates {
                breaker,
                budget,
                limiter: limiter.as_mut(),
                fleet,
                now,
                key: self.key,
                admission: None,
            };
            let input = DecideInput {
                policy: &self.up.config.retry,
                facts: &self.facts,
                outcome,
                attempts_made: self.made,
                time_left: Some(time_left),
                prev_delay: self.prev_delay,
                elsewhere,
            };
            let v = decide(&input, rng, &mut gates);
            (v, gates.admission.take())
        };
        let name = &self.up.config.name;
        match verdict {
            Verdict::Retry { delay, cause } => {
                tracing::debug!(upstream = %name, attempt = self.made, %cause, delay = %crate::config::duration::format(delay), "retrying");
                if let Some(t) = &self.trace {
                    t.retried(self.made, cause, delay);
                }
                state.metrics.retry(cause);
                if let Some(a) = admission {
                    self.ticket = BreakerTicket::new(state, a);
                }
                Step::Retry(delay)
            }
            Verdict::Stop { reason, cause } => {
                tracing::debug!(upstream = %name, attempts = self.made, %cause, reason = reason.as_str(), "not retrying");
                if let Some(t) = &self.trace {
                    t.stopped(self.made, reason, ended);
                }
                state.metrics.stop(reason);
                if let Some(a) = admission {
                    // Granted by the breaker gate, then refused by a later one.
                    drop(BreakerTicket::new(state, a));
                }
                Step::Done(Some(reason))
            }
            Verdict::NotRetryable | Verdict::Cancelled => Step::Done(None),
        }
    }

    /// Sleeps a retry's delay, then asks the breaker again: it may have
    /// tripped meanwhile, and an open breaker sees nothing while half-open
    /// admits only its probes. `Err(reason)`: it refused, and the last
    /// outcome goes back to the client.
    pub(crate) async fn backoff(&mut self, delay: Duration) -> Result<(), StopReason> {
        tokio::time::sleep(delay).await;
        self.prev_delay = delay;
        if self.ticket.renew().is_err() {
            if let Some(t) = &self.trace {
                t.stopped(self.made, StopReason::CircuitOpen, Instant::now());
            }
            self.up.state.metrics.stop(StopReason::CircuitOpen);
            return Err(StopReason::CircuitOpen);
        }
        Ok(())
    }

    /// Starts the current attempt's span, when the request is traced: the
    /// `traceparent` the attempt carries.
    fn trace_attempt(&self, started: Instant) -> Option<[u8; 55]> {
        let t = self.trace.as_ref()?;
        Some(t.attempt(self.made, started, self.prev_delay, self.ticket.probe()))
    }
}

/// How a data path sends one attempt. Everything else about the attempts —
/// counting, the per-try deadline, the breaker's verdict, the retry decision,
/// the backoff and the breaker's second look after it — is [`drive`]'s, one
/// loop for both paths.
pub(crate) trait Transport: Watch {
    /// What a sent attempt returns (response headers and the connection
    /// they came on).
    type Response;

    /// Sends one attempt, giving up at `try_deadline` (`deadline`: the
    /// request's). `None`: the client went away meanwhile.
    fn attempt(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
    ) -> impl std::future::Future<Output = Option<(Outcome, Result<Self::Response, ProxyError>)>>;

    /// Sends one attempt as [`Transport::attempt`] does and, when it has
    /// not answered by `hedging.due` and `hedging.permit` allows, a hedge
    /// beside it to another endpoint ([`super::race`]).
    fn attempt_hedged(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
        hedging: super::Hedging<'_>,
    ) -> impl std::future::Future<Output = Option<super::Raced<Self::Response>>>;

    /// Lets go of a response that is to be retried (its connection may be
    /// reused when its body is whole).
    fn discard(&mut self, response: Result<Self::Response, ProxyError>);

    /// The request body as the decision sees it now, when an attempt may
    /// have changed it (a streamed body read); `None`: unchanged.
    fn body_facts(&self) -> Option<crate::policy::BodyFacts> {
        None
    }

    /// Puts a traced attempt's `traceparent` on the request it sends next
    /// (docs/reference/tracing.md#trace-context).
    fn traceparent(&mut self, _value: &[u8; 55]) {}

    /// Whether a retry now can go to an endpoint that has not failed this
    /// request: it then goes at once (docs/reference/retries.md#backoff).
    fn elsewhere(&self) -> bool {
        false
    }

    /// The endpoint an attempt that returned `response` went to, when
    /// known: for its span.
    fn endpoint(
        &self,
        _response: &Result<Self::Response, ProxyError>,
    ) -> Option<crate::upstream::Address> {
        None
    }
}

/// How [`drive`] ended: the last attempt's result, the stop reason when a
/// retryable outcome was not retried, and when it ended.
#[derive(Debug)]
pub(crate) struct Driven<R> {
    pub result: Result<R, ProxyError>,
    pub stop: Option<StopReason>,
    pub ended: Instant,
}

/// How the attempts ended, as a codec's transport tells it.
pub(crate) struct Attempted<R> {
    /// The response to answer with, or the last attempt's failure.
    pub(crate) result: Result<R, ProxyError>,
    /// Why a retryable outcome was not retried.
    pub(crate) stop: Option<StopReason>,
    /// When the last attempt ended (one clock read shared by what follows).
    pub(crate) ended: Instant,
    /// The endpoint of the last attempt that failed, if any.
    pub(crate) last_failed: Option<crate::upstream::Address>,
}

/// Runs attempts over `t` until one is to be returned; `None` when the
/// client went away (every slot released without a verdict). `first`: the
/// first attempt's start, when the caller has just read the clock.
pub(crate) async fn drive<T: Transport>(
    attempts: &mut Attempts<'_>,
    t: &mut T,
    mut first: Option<Instant>,
) -> Option<Driven<T::Response>> {
    loop {
        let started = first.take().unwrap_or_else(Instant::now);
        let try_deadline = attempts.start(started);
        let deadline = attempts.deadline_at(started);
        if let Some(tp) = attempts.trace_attempt(started) {
            t.traceparent(&tp);
        }
        // The attempt whose answer this is: the first, or its hedge.
        let mut n = attempts.made;
        let (outcome, result, started) = match attempts.hedge_due(started) {
            None => {
                let (outcome, result) = t.attempt(started, try_deadline, deadline).await?;
                (outcome, result, started)
            }
            Some(due) => {
                let raced = {
                    let facts = attempts.facts;
                    let up = attempts.up;
                    let retry_on = &up.config.retry.retry_on;
                    let good = move |o: &Outcome| {
                        matches!(
                            crate::policy::classify(o, &facts, retry_on),
                            crate::policy::Class::NotRetryable
                        )
                    };
                    let mut permit = |now| attempts.permit_hedge(now);
                    let hedging = super::Hedging {
                        due,
                        permit: &mut permit,
                        good: &good,
                    };
                    // Boxed: two attempts' futures would otherwise make
                    // every request's future (hedged or not) as large as
                    // both, and each move of it a copy of that much.
                    Box::pin(t.attempt_hedged(started, try_deadline, deadline, hedging)).await?
                };
                if let Some(run) = &raced.hedge {
                    attempts.settle_hedge(run, started);
                    if let Some(tr) = &attempts.trace {
                        // The hedge's span, after the fact; the first
                        // attempt's ends where it was cancelled or failed.
                        tr.attempt(n + 1, run.sent, Duration::ZERO, false);
                        tr.mark_hedge(n + 1);
                        let other = if run.won { n } else { n + 1 };
                        let outcome = run.other.unwrap_or(Outcome::ClientGone);
                        let host = attempts.up.config.url.authority.host();
                        tr.attempt_ended(other, &outcome, None, run.other_ended, None, host);
                    }
                    if run.won {
                        n += 1;
                    }
                }
                (raced.outcome, raced.result, raced.started)
            }
        };
        let ended = Instant::now();
        if let Some(tr) = &attempts.trace {
            let host = attempts.up.config.url.authority.host();
            let error = result.as_ref().err().map(ProxyError::code);
            tr.attempt_ended(n, &outcome, error, ended, t.endpoint(&result), host);
        }
        if let Some(body) = t.body_facts() {
            attempts.facts.body = body;
        }
        let elsewhere = t.elsewhere();
        match attempts.judge(&outcome, result.as_ref().err(), started, ended, elsewhere) {
            Step::Retry(delay) => {
                // The last outcome is kept through the backoff: if the
                // breaker then refuses, it is what the client gets.
                match t.unless_gone(attempts.backoff(delay)).await? {
                    Ok(()) => t.discard(result),
                    Err(stop) => {
                        return Some(Driven {
                            result,
                            stop: Some(stop),
                            ended: Instant::now(),
                        })
                    }
                }
            }
            Step::Done(stop) => {
                return Some(Driven {
                    result,
                    stop,
                    ended,
                })
            }
        }
    }
}

/// The outcome of an attempt that reached `try_deadline` without response
/// headers: the per-try timeout, or the request's deadline.
pub(crate) fn timed_out(try_deadline: Instant, deadline: Instant) -> (Outcome, ProxyError) {
    if try_deadline < deadline {
        (Outcome::Timeout, ProxyError::UpstreamTimeout)
    } else {
        (Outcome::Timeout, ProxyError::DeadlineExceeded)
    }
}

/// weir's annotations on a response (docs/reference/responses.md#what-weir-adds-to-responses):
/// `x-weir-attempts` and, when a retryable outcome was not retried,
/// `x-weir-retry-stop`. The one writer of both, for either path: `put` gets
/// each field's name and value.
pub(crate) fn annotation_fields(a: &Annotations, mut put: impl FnMut(&'static str, &[u8])) {
    let mut digits = [0u8; 20];
    put(
        "x-weir-attempts",
        crate::proxy::headers::decimal(u64::from(a.attempts), &mut digits),
    );
    if let Some(r) = a.stop {
        put("x-weir-retry-stop", r.as_str().as_bytes());
    }
    if let Some(won) = a.hedge {
        put("x-weir-hedge", if won { b"won" } else { b"lost" });
    }
}

/// What a request's attempts came to: how many were made, and why a
/// retryable outcome was not retried. A general-path response carries it as
/// an extension, which the access log and the response cache read; the
/// fields [`annotation_fields`] writes say the same to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Annotations {
    pub attempts: u32,
    pub stop: Option<StopReason>,
    /// A hedge was sent: `true` when its answer is the one returned.
    pub hedge: Option<bool>,
}

/// Adds weir's annotations ([`annotation_fields`]) to a response's headers.
pub(crate) fn annotate(h: &mut HeaderMap, a: &Annotations) {
    annotation_fields(a, |name, value| {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            h.insert(name, v);
        }
    });
}

/// Records `a` on a general-path response (its extensions), and writes it
/// as fields when the upstream annotates (`fields`).
pub(crate) fn annotate_response(
    h: &mut HeaderMap,
    ext: &mut http::Extensions,
    a: Annotations,
    fields: bool,
) {
    ext.insert(a);
    if fields {
        annotate(h, &a);
    }
}
