//! Admission and the attempt loop (docs/behaviour.md#the-life-of-a-request): the data plane enforcing
//! what the policy core decides.
//!
//! Admission, in the order of docs/behaviour.md#admission: the rate limiter (waits up to
//! `max_wait`, never past the deadline, else 429 `rate_limited`), the
//! concurrency gate (503 `overloaded`), the breaker (503 `circuit_open`). Then each attempt: build the
//! request, send it under the per-try timeout, record the breaker's verdict,
//! and ask `policy::decide` — which checks docs/behaviour.md#the-retry-decision in order and asks the budget,
//! breaker and limiter lazily through `LiveGates`. A retry sleeps its delay;
//! everything else returns the last outcome unchanged.
//!
//! Cancellation is structural: when the client goes away hyper drops this
//! future, which drops the sleep or the attempt in flight, and the breaker
//! [`Ticket`] releases its slot without a verdict.

use super::body::{Body, UpstreamBody};
use super::client::Failure;
use super::error::ProxyError;
use super::replay::RequestBody;
use super::Upstream;
use crate::policy::{
    decide, parse_retry_after, Admission, Breaker, DecideInput, Gates, KeyedLimiter, Outcome,
    RequestFacts, RetryBudget, StopReason, Verdict,
};
use crate::state::{Live, UpstreamState};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::Incoming;
use std::time::Duration;
use tokio::time::Instant;

/// A breaker admission that must be recorded or released.
#[derive(Debug)]
pub(crate) struct Ticket<'a> {
    state: &'a UpstreamState,
    admission: Option<Admission>,
}

impl<'a> Ticket<'a> {
    fn new(state: &'a UpstreamState, admission: Admission) -> Self {
        if let Some(t) = &admission.transition {
            state.log_transition(t);
        }
        Ticket {
            state,
            admission: Some(admission),
        }
    }

    /// Records the attempt's verdict (`None`: no verdict, release the slot)
    /// at policy time `now`.
    fn record(&mut self, failure: Option<bool>, now: Duration) {
        let Some(a) = self.admission.take() else {
            return;
        };
        let mut guard = self.state.live();
        let live = &mut *guard;
        let t = match failure {
            Some(f) => live.breaker.record(a, f, now, &mut live.rng),
            None => {
                live.breaker.release(a);
                None
            }
        };
        drop(guard);
        if let Some(t) = t {
            self.state.log_transition(&t);
        }
    }
}

impl Ticket<'_> {
    /// Swaps this admission for a fresh one, taken now.
    fn renew(&mut self) -> Result<(), crate::policy::Refused> {
        let now = self.state.now();
        let r = {
            let mut live = self.state.live();
            if let Some(old) = self.admission.take() {
                live.breaker.release(old);
            }
            live.breaker.try_acquire(now)
        };
        let a = r?;
        if let Some(t) = &a.transition {
            self.state.log_transition(t);
        }
        self.admission = Some(a);
        Ok(())
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.admission.take() {
            self.state.live().breaker.release(a);
        }
    }
}

/// Asks the breaker to admit a first attempt.
pub(crate) fn admit_breaker(state: &UpstreamState) -> Result<Ticket<'_>, ProxyError> {
    admit_breaker_at(state, Instant::now())
}

/// [`admit_breaker`] at `at` (a clock reading the caller already has).
pub(crate) fn admit_breaker_at(
    state: &UpstreamState,
    at: Instant,
) -> Result<Ticket<'_>, ProxyError> {
    let now = state.now_at(at);
    let r = state.live().breaker.try_acquire(now);
    match r {
        Ok(a) => Ok(Ticket::new(state, a)),
        Err(refused) => Err(ProxyError::CircuitOpen {
            retry_after: Some(refused.retry_after),
        }),
    }
}

/// Takes a rate-limit token for a first attempt if one is there at `at`
/// (or the upstream has no limit); `false`: [`admit_rate`] decides.
pub(crate) fn try_rate(up: &Upstream, key: Option<&str>, at: Instant) -> bool {
    if up.config.rate_limit.is_none() {
        return true;
    }
    let now = up.state.now_at(at);
    match up.state.live().limiter.as_mut() {
        Some(l) => l.try_acquire(key, now),
        None => true,
    }
}

/// Takes a rate-limit token for a first attempt, waiting up to `max_wait` but
/// never past the deadline.
pub(crate) async fn admit_rate(
    up: &Upstream,
    key: Option<&str>,
    deadline: Instant,
) -> Result<(), ProxyError> {
    let Some(max_wait) = up.config.rate_limit.as_ref().map(|r| r.max_wait) else {
        return Ok(());
    };
    let state = &up.state;
    let give_up = (Instant::now() + max_wait).min(deadline);
    loop {
        let now = state.now();
        let wait = {
            let mut live = state.live();
            let Some(l) = live.limiter.as_mut() else {
                return Ok(());
            };
            if l.try_acquire(key, now) {
                return Ok(());
            }
            l.time_until(key, now)
        };
        match wait {
            Some(w) if Instant::now().checked_add(w).is_some_and(|t| t <= give_up) => {
                tokio::time::sleep(w).await
            }
            _ => {
                return Err(ProxyError::RateLimited {
                    retry_after: wait.map(|w| w.max(Duration::from_millis(1))),
                })
            }
        }
    }
}

/// The gates of docs/behaviour.md#the-retry-decision (6–8) on this upstream's live state.
struct LiveGates<'a> {
    breaker: &'a mut Breaker,
    budget: &'a mut RetryBudget,
    limiter: Option<&'a mut KeyedLimiter>,
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
        match self.limiter.as_deref_mut() {
            Some(l) => l.try_acquire(self.key, self.now),
            None => true,
        }
    }
}

/// What one request brings to the attempt loop.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub parts: Parts,
    pub body: RequestBody,
    pub deadline: Instant,
    pub key: Option<&'a str>,
    pub has_idempotency_key: bool,
    /// The client's own gRPC deadline (`grpc-timeout` on arrival): each
    /// attempt carries what is left of it. Never weir's `timeout`, which
    /// bounds only the wait for response headers: a stream may outlive it.
    pub grpc_deadline: Option<Instant>,
    /// `max_attempts = 1`: nothing is cloned for a replay.
    pub single: bool,
    /// The client lowered its deadline below the upstream's `timeout`.
    pub lowered: bool,
    /// A connection upgrade: one attempt, never retried.
    pub upgrade: bool,
    /// Hold a gRPC response (up to the replay limit) to read its trailers.
    pub grpc_trailers: bool,
    /// `Expect: 100-continue`: the upstream's 100 opens the body's gate.
    pub continue_gate: Option<std::sync::Arc<super::replay::ContinueGate>>,
}

/// How the attempt loop ended: the last outcome, and the annotations.
#[derive(Debug)]
pub(crate) struct Finished {
    pub result: Result<Response<UpstreamBody>, ProxyError>,
    pub attempts: u32,
    pub stop: Option<StopReason>,
    /// When the last attempt ended (one clock read shared by what follows).
    pub ended: Instant,
}

/// One request's attempts, as both data paths run them: the budget deposit,
/// the breaker ticket, each attempt's metrics and verdict, and the retry
/// decision with its backoff. The hyper path ([`run`]) and the HTTP/1 fast
/// path (`super::fast`) differ only in how an attempt is sent.
#[derive(Debug)]
pub(crate) struct Attempts<'a> {
    up: &'a Upstream,
    ticket: Ticket<'a>,
    facts: RequestFacts,
    key: Option<&'a str>,
    deadline: Instant,
    /// The client lowered its deadline below the upstream's `timeout`.
    lowered: bool,
    made: u32,
    prev_delay: Duration,
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
    /// reading the caller already has). `Err(t0)`: less than
    /// `min_attempt_time` is left, and an attempt started now could only
    /// time out and be blamed on the upstream (504 `deadline_exceeded`).
    pub(crate) fn begin(
        up: &'a Upstream,
        ticket: Ticket<'a>,
        facts: RequestFacts,
        key: Option<&'a str>,
        deadline: Instant,
        lowered: bool,
        t0: Instant,
    ) -> Result<Self, Instant> {
        let state = &up.state;
        state.live().budget.deposit(state.now_at(t0));
        if deadline.saturating_duration_since(t0) < up.config.retry.min_attempt_time {
            return Err(t0);
        }
        Ok(Attempts {
            up,
            ticket,
            facts,
            key,
            deadline,
            lowered,
            made: 0,
            prev_delay: Duration::ZERO,
        })
    }

    /// Attempts made so far.
    pub(crate) fn made(&self) -> u32 {
        self.made
    }

    /// Starts an attempt: counts it, and returns when it must give up (the
    /// per-try timeout, never past the deadline).
    pub(crate) fn start(&mut self, started: Instant) -> Instant {
        self.made += 1;
        self.up
            .config
            .per_try_timeout
            .map(|p| (started + p).min(self.deadline))
            .unwrap_or(self.deadline)
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
        state
            .metrics
            .attempt(outcome, ended.saturating_duration_since(started));
        // A deadline the client lowered itself is the client's doing, not the
        // upstream's: no verdict for the breaker.
        let blame = match error {
            Some(ProxyError::DeadlineExceeded) if self.lowered => None,
            _ => outcome.breaker_failure(&self.up.config.breaker),
        };
        let now = state.now_at(ended);
        self.ticket.record(blame, now);
        now
    }

    /// Records an attempt and decides (docs/behaviour.md#the-retry-decision) what follows it.
    pub(crate) fn judge(
        &mut self,
        outcome: &Outcome,
        error: Option<&ProxyError>,
        started: Instant,
        ended: Instant,
    ) -> Step {
        let now = self.record(outcome, error, started, ended);
        let state = &self.up.state;
        let time_left = self.deadline.saturating_duration_since(ended);
        let (verdict, admission) = {
            let mut guard = state.live();
            let Live {
                breaker,
                budget,
                limiter,
                rng,
            } = &mut *guard;
            let mut gates = LiveGates {
                breaker,
                budget,
                limiter: limiter.as_mut(),
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
            };
            let v = decide(&input, rng, &mut gates);
            (v, gates.admission.take())
        };
        let name = &self.up.config.name;
        match verdict {
            Verdict::Retry { delay, cause } => {
                tracing::debug!(upstream = %name, attempt = self.made, %cause, ?delay, "retrying");
                state.metrics.retry(cause);
                if let Some(a) = admission {
                    self.ticket = Ticket::new(state, a);
                }
                Step::Retry(delay)
            }
            Verdict::Stop { reason, cause } => {
                tracing::debug!(upstream = %name, attempts = self.made, %cause, reason = reason.as_str(), "not retrying");
                state.metrics.stop(reason);
                if let Some(a) = admission {
                    // Granted by the breaker gate, then refused by a later one.
                    drop(Ticket::new(state, a));
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
            self.up.state.metrics.stop(StopReason::CircuitOpen);
            return Err(StopReason::CircuitOpen);
        }
        Ok(())
    }
}

/// Watches the client while weir waits on its behalf.
pub(crate) trait Watch {
    /// Runs `f` unless the client goes away first (`None`).
    fn unless_gone<F: std::future::Future>(
        &mut self,
        f: F,
    ) -> impl std::future::Future<Output = Option<F::Output>>;
}

/// A client hyper watches for us: when it goes away hyper drops the whole
/// request future, so nothing needs racing.
#[derive(Debug)]
pub(crate) struct Dropped;

impl Watch for Dropped {
    async fn unless_gone<F: std::future::Future>(&mut self, f: F) -> Option<F::Output> {
        Some(f.await)
    }
}

/// A request's deadline (docs/behaviour.md#deadlines-and-timeouts): `start`
/// plus the upstream's `timeout`, lowered (never raised) by what the client
/// asked for (`x-weir-timeout-ms`, `grpc-timeout`); and whether the client
/// lowered it.
pub(crate) fn deadline(
    cfg: &crate::config::UpstreamConfig,
    start: Instant,
    asked: [Option<Duration>; 2],
) -> (Instant, bool) {
    let budget = asked.into_iter().flatten().fold(cfg.timeout, Duration::min);
    (start + budget, budget < cfg.timeout)
}

/// Admission up to the request body, in the order of
/// docs/behaviour.md#admission: the rate limit (waiting up to `max_wait`,
/// never past the deadline), then the concurrency gate. The body is read
/// after this and before the breaker is asked ([`admit_breaker`]), so a slow
/// upload never holds a half-open probe slot. Usually a token and a slot are
/// there at once, with no wait and no clock read; when weir has to wait, a
/// client that goes away meanwhile is let go (`None`). `Ok((slot, waited))`.
pub(crate) async fn admit<W: Watch>(
    up: &Upstream,
    key: Option<&str>,
    start: Instant,
    deadline: Instant,
    w: &mut W,
) -> Option<Result<(super::gate::Slot, bool), ProxyError>> {
    let mut waited = false;
    if !try_rate(up, key, start) {
        waited = true;
        if let Err(e) = w.unless_gone(admit_rate(up, key, deadline)).await? {
            return Some(Err(e));
        }
    }
    let slot = match up.state.gate.try_enter() {
        Some(s) => s,
        None => {
            waited = true;
            match w.unless_gone(up.state.gate.enter(deadline)).await? {
                Ok(s) => s,
                Err(refused) => return Some(Err(refused.into())),
            }
        }
    };
    Some(Ok((slot, waited)))
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

    /// Lets go of a response that is to be retried (its connection may be
    /// reused when its body is whole).
    fn discard(&mut self, response: Result<Self::Response, ProxyError>);

    /// The request body as the decision sees it now, when an attempt may
    /// have changed it (a streamed body read); `None`: unchanged.
    fn body_facts(&self) -> Option<crate::policy::BodyFacts> {
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
        let (outcome, result) = t.attempt(started, try_deadline, attempts.deadline).await?;
        let ended = Instant::now();
        if let Some(body) = t.body_facts() {
            attempts.facts.body = body;
        }
        match attempts.judge(&outcome, result.as_ref().err(), started, ended) {
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

/// The general path's transport: hyper's client (or a held connection),
/// the request rebuilt from the plan for each attempt. A client that goes
/// away makes hyper drop the whole future, so nothing here watches for it.
struct HyperTransport<'p, 'a> {
    up: &'a Upstream,
    conn: &'p super::sticky::ConnCtx,
    plan: &'p mut Plan<'a>,
}

impl Watch for HyperTransport<'_, '_> {
    async fn unless_gone<F: std::future::Future>(&mut self, f: F) -> Option<F::Output> {
        Some(f.await)
    }
}

impl Transport for HyperTransport<'_, '_> {
    type Response = Response<UpstreamBody>;

    async fn attempt(
        &mut self,
        _started: Instant,
        try_deadline: Instant,
        _deadline: Instant,
    ) -> Option<(Outcome, Result<Self::Response, ProxyError>)> {
        let req = build(self.plan);
        Some(send(self.up, self.conn, req, self.plan, try_deadline).await)
    }

    fn discard(&mut self, _response: Result<Self::Response, ProxyError>) {}

    fn body_facts(&self) -> Option<crate::policy::BodyFacts> {
        // The body facts change once a streamed body has been read.
        Some(self.plan.body.facts())
    }
}

/// Runs attempts until one is returned.
pub(crate) async fn run<'a>(
    up: &'a Upstream,
    conn: &super::sticky::ConnCtx,
    mut plan: Plan<'a>,
    ticket: Ticket<'a>,
) -> Finished {
    let facts = RequestFacts::new(
        plan.parts.method.as_str(),
        plan.has_idempotency_key,
        plan.body.facts(),
    );
    let mut attempts = match Attempts::begin(
        up,
        ticket,
        facts,
        plan.key,
        plan.deadline,
        plan.lowered,
        Instant::now(),
    ) {
        Ok(a) => a,
        Err(t0) => {
            return Finished {
                result: Err(ProxyError::DeadlineExceeded),
                attempts: 0,
                stop: None,
                ended: t0,
            }
        }
    };
    if plan.upgrade {
        // An upgrade is one attempt, never retried: recorded, not judged.
        let started = Instant::now();
        let try_deadline = attempts.start(started);
        let req = build(&mut plan);
        let (outcome, result) = send(up, conn, req, &plan, try_deadline).await;
        let ended = Instant::now();
        attempts.record(&outcome, result.as_ref().err(), started, ended);
        return Finished {
            result,
            attempts: attempts.made(),
            stop: None,
            ended,
        };
    }
    let mut t = HyperTransport {
        up,
        conn,
        plan: &mut plan,
    };
    match drive(&mut attempts, &mut t, None).await {
        Some(d) => Finished {
            result: d.result,
            attempts: attempts.made(),
            stop: d.stop,
            ended: d.ended,
        },
        // Never: this transport does not watch the client (hyper drops us).
        None => Finished {
            result: Err(ProxyError::DeadlineExceeded),
            attempts: attempts.made(),
            stop: None,
            ended: Instant::now(),
        },
    }
}

/// The request for the next attempt: headers cloned only when a retry is
/// possible (the body says so), the body from the replay buffer or stream.
fn build(plan: &mut Plan<'_>) -> Request<super::body::Body> {
    let mut req = Request::new(plan.body.for_attempt());
    *req.method_mut() = plan.parts.method.clone();
    *req.uri_mut() = plan.parts.uri.clone();
    *req.version_mut() = plan.parts.version;
    // The extensions carry the header names' original case (hyper's).
    (*req.headers_mut(), *req.extensions_mut()) = if plan.single {
        // No retry is possible: the one attempt takes the headers.
        (
            std::mem::take(&mut plan.parts.headers),
            std::mem::take(&mut plan.parts.extensions),
        )
    } else {
        (plan.parts.headers.clone(), plan.parts.extensions.clone())
    };
    if let Some(gate) = &plan.continue_gate {
        let gate = gate.clone();
        hyper::ext::on_informational(&mut req, move |r| {
            if r.status() == http::StatusCode::CONTINUE {
                gate.open();
            }
        });
    }
    if let Some(grpc_deadline) = plan.grpc_deadline {
        let left = grpc_deadline.saturating_duration_since(Instant::now());
        req.headers_mut()
            .insert("grpc-timeout", super::headers::grpc_timeout_value(left));
    }
    req
}

/// Sends one attempt; gives up at `try_deadline`.
async fn send(
    up: &Upstream,
    conn: &super::sticky::ConnCtx,
    req: Request<super::body::Body>,
    plan: &Plan<'_>,
    try_deadline: Instant,
) -> (Outcome, Result<Response<UpstreamBody>, ProxyError>) {
    let state = &up.state;
    let sent = tokio::time::timeout_at(try_deadline, dispatch(up, conn, req)).await;
    match sent {
        Ok(Ok(resp)) => {
            let mut grpc = grpc_status(resp.headers());
            let resp =
                if plan.grpc_trailers && grpc.is_none() && resp.status() == http::StatusCode::OK {
                    let limit = up.config.retry.max_replay_body_bytes;
                    let (resp, trailer_status) = hold_for_trailers(resp, limit, try_deadline).await;
                    grpc = trailer_status;
                    resp
                } else {
                    resp.map(UpstreamBody::Left)
                };
            (
                Outcome::Response {
                    status: resp.status().as_u16(),
                    retry_after: retry_after(resp.headers(), state),
                    grpc_status: grpc,
                },
                Ok(resp),
            )
        }
        Ok(Err(e)) => {
            if e.tls {
                state.log_tls_failure_once(&e.message);
            }
            let outcome = match e.kind {
                Failure::Connect => Outcome::ConnectFailure,
                Failure::NotSent => Outcome::Reset {
                    request_sent: false,
                },
                Failure::ClientBody => Outcome::ClientGone,
                Failure::Reset => Outcome::Reset { request_sent: true },
                Failure::NotProcessed => Outcome::RefusedStream,
                Failure::BadResponse => Outcome::BadResponse,
            };
            (outcome, Err(e.into_proxy_error()))
        }
        Err(_) => {
            let (outcome, e) = timed_out(try_deadline, plan.deadline);
            (outcome, Err(e))
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

/// Sends on the client connection's own upstream connection when the fast
/// path applies (see [`super::sticky`]), else through the shared pool.
async fn dispatch(
    up: &Upstream,
    conn: &super::sticky::ConnCtx,
    mut req: Request<Body>,
) -> Result<Response<Incoming>, super::client::SendError> {
    let Some(addr) = up.direct else {
        return up.client.send(req).await;
    };
    let mut sender = match conn.take(&up.state) {
        Some(s) => s,
        None if super::sticky::reserve(&up.state.sticky_conns) => {
            super::sticky::connect(
                addr,
                up.config.connect_timeout,
                up.state.sticky_conns.clone(),
            )
            .await?
        }
        // Over the cap: the shared pool.
        None => return up.client.send(req).await,
    };
    // A connection of our own (always HTTP/1.1) takes the origin form of the
    // target and the authority as Host, as the shared pool's client does.
    if let Some(a) = req.uri().authority() {
        if let Ok(h) = http::HeaderValue::from_str(a.as_str()) {
            req.headers_mut().entry(http::header::HOST).or_insert(h);
        }
    }
    if let Some(pq) = req.uri().path_and_query().cloned() {
        *req.uri_mut() = http::Uri::from(pq);
    }
    let resp = super::sticky::send(&mut sender, req).await?;
    conn.keep(&up.state, sender);
    Ok(resp)
}

pub(crate) fn retry_after(h: &HeaderMap, state: &UpstreamState) -> Option<Duration> {
    let v = h.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(v, state.clock.wall())
}

/// Holds a gRPC response until its first message or its trailers, whichever
/// comes first, to find a `grpc-status` sent before any message (the only
/// kind a retry can act on: once a message is out, the call has started).
/// After the first data frame the response streams as it comes, so a server
/// stream is never held back. Whatever happens, the client gets the same
/// body: the frames held, then the rest.
async fn hold_for_trailers(
    resp: Response<Incoming>,
    limit: u64,
    until: Instant,
) -> (Response<UpstreamBody>, Option<u8>) {
    use http_body_util::BodyExt;
    let (parts, mut body) = resp.into_parts();
    let mut held: Vec<http_body::Frame<bytes::Bytes>> = Vec::new();
    let mut size = 0u64;
    let mut status = None;
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
    let body = super::body::Held::new(held, if rest { Some(body) } else { None });
    (
        Response::from_parts(parts, UpstreamBody::Right(body)),
        status,
    )
}

/// `grpc-status` of a trailers-only response.
fn grpc_status(h: &HeaderMap) -> Option<u8> {
    h.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// weir's annotations on a response (docs/behaviour.md#what-weir-adds-to-responses):
/// `x-weir-attempts` and, when a retryable outcome was not retried,
/// `x-weir-retry-stop`. The one writer of both, for either path: `put` gets
/// each field's name and value.
pub(crate) fn annotation_fields(
    attempts: u32,
    stop: Option<StopReason>,
    mut put: impl FnMut(&'static str, &[u8]),
) {
    let mut digits = [0u8; 10];
    let mut i = digits.len();
    let mut n = attempts;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    put("x-weir-attempts", &digits[i..]);
    if let Some(r) = stop {
        put("x-weir-retry-stop", r.as_str().as_bytes());
    }
}

/// Adds weir's annotations ([`annotation_fields`]) to a response's headers.
pub(crate) fn annotate(h: &mut HeaderMap, attempts: u32, stop: Option<StopReason>) {
    annotation_fields(attempts, stop, |name, value| {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            h.insert(name, v);
        }
    });
}
