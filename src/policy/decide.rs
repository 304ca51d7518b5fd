//! Classification (docs/reference/retries.md#classifying-an-attempt) and the retry decision (docs/reference/retries.md#the-retry-decision).
//!
//! Owns the compiled `retry_on` set, the validated [`RetryPolicy`], the
//! request facts and attempt outcomes, [`classify`] and [`decide`]. It must
//! not do I/O, read a clock, draw randomness of its own or hold state: the
//! stateful gates (budget, breaker, limiter) are asked through [`Gates`], the
//! jitter draw comes from the caller's [`Random`], and time arrives as "time
//! left". The data plane enforces the [`Verdict`]; it never decides itself.

use super::backoff::delay;
use super::random::Random;
use super::retry_after::{ceil_ms, Pushback};
use super::{BackoffPolicy, BudgetParams, PolicyError};
use std::time::Duration;

/// What `retry_on` lists, compiled into bit sets.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct RetryOn {
    /// Retry connect failures (nothing reached the upstream).
    pub connect_failure: bool,
    /// Retry resets after the request was written.
    pub reset: bool,
    /// Retry per-try timeouts without response headers.
    pub timeout: bool,
    /// Bit `s - 100` set for each retryable HTTP status `s` in 100..=599.
    statuses: [u64; 8],
    /// Bit `c` set for each retryable gRPC code.
    grpc: u32,
    /// The entries as written, for display.
    pub entries: Vec<String>,
}

impl RetryOn {
    /// Compiles `retry_on` entries: `connect-failure`, `reset`, `timeout`,
    /// `5xx`, `gateway-error`, status codes and gRPC code names.
    pub fn parse(entries: &[String]) -> Result<Self, PolicyError> {
        let mut on = RetryOn {
            entries: entries.to_vec(),
            ..RetryOn::default()
        };
        for e in entries {
            let lower = e.trim().to_ascii_lowercase();
            match lower.as_str() {
                "connect-failure" => on.connect_failure = true,
                "reset" => on.reset = true,
                "timeout" => on.timeout = true,
                "5xx" => (500..=599).for_each(|s| on.set_status(s)),
                "gateway-error" => [502, 503, 504].into_iter().for_each(|s| on.set_status(s)),
                other => {
                    if let Ok(code) = other.parse::<u16>() {
                        if !(100..=599).contains(&code) {
                            return Err(PolicyError::new(
                                "retry_on",
                                format!("{code} is not an HTTP status code (100–599)"),
                            ));
                        }
                        on.set_status(code);
                    } else if let Some(c) = super::grpc::code_named(other)
                        .filter(|c| super::grpc::RETRYABLE.contains(c))
                    {
                        on.grpc |= 1 << c;
                    } else {
                        let known = [
                            "connect-failure",
                            "reset",
                            "timeout",
                            "5xx",
                            "gateway-error",
                        ]
                        .into_iter()
                        .chain(
                            super::grpc::RETRYABLE.map(|c| super::grpc::CODES[usize::from(c)].1),
                        );
                        let hint = super::suggest::hint(other, known);
                        return Err(PolicyError::new(
                            "retry_on",
                            format!(
                                "unknown condition {e:?}: {hint}expected connect-failure, reset, timeout, \
                                 5xx, gateway-error, a status code, or a gRPC code \
                                 (unavailable, resource-exhausted, deadline-exceeded, internal, cancelled, …)"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(on)
    }

    fn set_status(&mut self, s: u16) {
        let i = usize::from(s - 100);
        self.statuses[i / 64] |= 1 << (i % 64);
    }

    /// Whether HTTP status `s` is listed.
    pub fn status(&self, s: u16) -> bool {
        if !(100..=599).contains(&s) {
            return false;
        }
        let i = usize::from(s - 100);
        self.statuses[i / 64] & (1 << (i % 64)) != 0
    }

    /// Every retry cause this list can produce, for the metric series
    /// created at zero: refused streams (always retried), the failure kinds
    /// listed, each listed status and gRPC code.
    pub fn causes(&self) -> Vec<Cause> {
        let mut out = vec![Cause::RefusedStream];
        if self.connect_failure {
            out.push(Cause::ConnectFailure);
        }
        if self.reset {
            out.push(Cause::Reset);
        }
        if self.timeout {
            out.push(Cause::Timeout);
        }
        out.extend((100..=599).filter(|s| self.status(*s)).map(Cause::Status));
        out.extend((0..32).filter(|c| self.grpc(*c)).map(Cause::Grpc));
        out
    }

    /// Whether any gRPC code is listed.
    pub fn any_grpc(&self) -> bool {
        self.grpc != 0
    }

    pub fn grpc(&self, code: u8) -> bool {
        code < 32 && self.grpc & (1 << code) != 0
    }
}

/// A validated retry policy for one upstream.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RetryPolicy {
    /// Attempts counting the first; 1 disables retries; at most 10.
    pub max_attempts: u32,
    /// The retryable conditions.
    pub retry_on: RetryOn,
    /// The longest `Retry-After` honoured; a longer one stops retrying.
    pub max_retry_after: Duration,
    /// The largest body buffered for replay.
    pub max_replay_body_bytes: u64,
    /// Time an attempt needs at least: a retry must leave this much before
    /// the deadline after its delay.
    pub min_attempt_time: Duration,
    /// The backoff between attempts.
    pub backoff: BackoffPolicy,
    /// The retry budget's parameters.
    pub budget: BudgetParams,
}

impl RetryPolicy {
    /// Validates a retry policy: `1 ≤ max_attempts ≤ 10`.
    pub fn try_new(
        max_attempts: u32,
        retry_on: RetryOn,
        max_retry_after: Duration,
        max_replay_body_bytes: u64,
        min_attempt_time: Duration,
        backoff: BackoffPolicy,
        budget: BudgetParams,
    ) -> Result<Self, PolicyError> {
        if max_attempts == 0 {
            return Err(PolicyError::new(
                "max_attempts",
                "must be at least 1 (1 = no retries)",
            ));
        }
        if max_attempts > 10 {
            return Err(PolicyError::new(
                "max_attempts",
                format!(
                    "{max_attempts} is more than 10: that many attempts turn an outage into a retry storm; \
                     keep max_attempts ≤ 10 and let the retry budget ([retry.budget] ratio) bound the spend"
                ),
            ));
        }
        Ok(RetryPolicy {
            max_attempts,
            retry_on,
            max_retry_after,
            max_replay_body_bytes,
            min_attempt_time,
            backoff,
            budget,
        })
    }
}

/// Whether `method` is idempotent by definition (RFC 9110 §9.2.2): GET, HEAD,
/// OPTIONS, TRACE, PUT, DELETE. Methods are case-sensitive.
pub fn is_idempotent_method(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
}

/// What the data plane knows of the request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum BodyFacts {
    /// No body.
    #[default]
    Empty,
    /// Fully buffered, `len` bytes: replayable when `len ≤ max_replay_body_bytes`.
    Buffered {
        /// The body's size in bytes.
        len: u64,
    },
    /// Streamed to the upstream (too large, or of unknown length).
    Streamed {
        /// The declared length, when known.
        #[serde(default)]
        len: Option<u64>,
        /// Whether any body byte was read from the client. A streamed body is
        /// replayable only after a connect failure that happened before that.
        bytes_read: bool,
    },
}

/// The request's facts that matter to retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts {
    /// The method is idempotent or the request carries an idempotency key.
    pub idempotent: bool,
    /// The request body.
    pub body: BodyFacts,
    /// Who asked, as client-side throttling tells callers apart (a hash
    /// of the rate limit's key, else of the request's credentials); only
    /// with throttling on (docs/reference/admission.md#client-side-throttling).
    pub caller: Option<u64>,
}

impl RequestFacts {
    /// Facts from the method, whether the idempotency-key header is present,
    /// and the body.
    pub fn new(method: &str, has_idempotency_key: bool, body: BodyFacts) -> Self {
        RequestFacts {
            idempotent: has_idempotency_key || is_idempotent_method(method),
            body,
            caller: None,
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Response headers arrived.
    Response {
        /// The status code.
        status: u16,
        /// The parsed `Retry-After` (see
        /// [`parse_retry_after`](super::retry_after::parse_retry_after)).
        retry_after: Option<Duration>,
        /// The gRPC status from a trailers-only response (or buffered trailers).
        grpc_status: Option<u8>,
        /// What the answer says of being retried besides `Retry-After`:
        /// `grpc-retry-pushback-ms`, or a proxy's refusal
        /// (docs/reference/retries.md#pushback).
        pushback: Option<Pushback>,
    },
    /// Nothing reached the upstream: refused, DNS, connect timeout, TLS
    /// handshake.
    ConnectFailure,
    /// The connection was reset or closed with no response. `request_sent =
    /// false` (a pooled connection found closed before any byte was written)
    /// is a connect failure: nothing reached the upstream.
    Reset {
        /// Whether any of the request was written.
        request_sent: bool,
    },
    /// The per-try timeout fired before the response headers.
    Timeout,
    /// An HTTP/2 upstream refused the stream without processing it: above
    /// the last stream id of its GOAWAY, or `REFUSED_STREAM`. A graceful
    /// event of a healthy upstream (it is closing that connection): replayed
    /// at once on another connection for any method, spending no budget and
    /// giving the breaker no verdict.
    RefusedStream,
    /// The upstream answered with something that is not a valid HTTP
    /// response (a garbled or oversized head): it processed the request, and
    /// no retry fixes a server that answers like that.
    BadResponse,
    /// The client went away.
    ClientGone,
}

impl Outcome {
    /// The breaker's verdict (docs/reference/breaker.md#what-counts-as-a-failure): `Some(true)` for a failure
    /// (transport failure, or a status or gRPC code in `failure_statuses`), `Some(false)` for
    /// any other response, `None` when the client went away (no verdict:
    /// release the admission instead).
    pub fn breaker_failure(&self, params: &super::BreakerParams) -> Option<bool> {
        match self {
            Outcome::Response {
                status,
                grpc_status,
                ..
            } => Some(
                params.is_failure_status(*status)
                    || grpc_status.is_some_and(|c| params.is_failure_grpc(c)),
            ),
            Outcome::ConnectFailure
            | Outcome::Reset { .. }
            | Outcome::Timeout
            | Outcome::BadResponse => Some(true),
            Outcome::RefusedStream | Outcome::ClientGone => None,
        }
    }

    /// The `result` label of `weir_upstream_attempts_total`.
    pub fn result_label(&self) -> &'static str {
        match self {
            Outcome::Response { status, .. } => match status {
                500..=599 => "status_5xx",
                400..=499 => "status_4xx",
                _ => "ok",
            },
            Outcome::ConnectFailure
            | Outcome::Reset {
                request_sent: false,
            } => "connect_failure",
            Outcome::Reset { request_sent: true } => "reset",
            Outcome::Timeout => "timeout",
            Outcome::RefusedStream => "refused_stream",
            Outcome::BadResponse => "bad_response",
            Outcome::ClientGone => "cancelled",
        }
    }
}

/// What was retried, for `weir_retries_total{cause}` (values bounded by the
/// configuration's `retry_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Connect failure (or a reset before the request was written).
    ConnectFailure,
    /// A stream an HTTP/2 upstream refused unprocessed (GOAWAY, REFUSED_STREAM).
    RefusedStream,
    /// Reset after the request was written.
    Reset,
    /// Per-try timeout.
    Timeout,
    /// A listed HTTP status.
    Status(u16),
    /// A listed gRPC code.
    Grpc(u8),
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::ConnectFailure => f.write_str("connect_failure"),
            Cause::RefusedStream => f.write_str("refused_stream"),
            Cause::Reset => f.write_str("reset"),
            Cause::Timeout => f.write_str("timeout"),
            Cause::Status(s) => write!(f, "status_{s}"),
            Cause::Grpc(c) => write!(f, "grpc_{}", super::grpc::config_name(*c).replace('-', "_")),
        }
    }
}

impl serde::Serialize for Cause {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Whether a retryable outcome may have been processed by the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Nothing reached the upstream, or it said it did not process it (429):
    /// safe to replay for any method.
    NotProcessed,
    /// The upstream answered (502/503/504, a listed status or gRPC code):
    /// replay only if idempotent.
    Answered,
    /// The request may or may not have been processed (reset after sending,
    /// timeout): replay only if idempotent.
    Uncertain,
}

/// An attempt's outcome, classified (docs/reference/retries.md#classifying-an-attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A response whose status and gRPC code are not in `retry_on`, or a
    /// transport failure whose condition is not in `retry_on`.
    NotRetryable,
    /// Listed in `retry_on`.
    Retryable {
        /// What happened.
        cause: Cause,
        /// Whether the upstream may have processed it.
        delivery: Delivery,
        /// Whether replaying is allowed for this request (not processed, or
        /// idempotent).
        safe: bool,
    },
    /// The client went away: never retried, never counted against the upstream.
    Cancelled,
}

/// Classifies one attempt's outcome for this request (docs/reference/retries.md#classifying-an-attempt).
pub fn classify(outcome: &Outcome, facts: &RequestFacts, retry_on: &RetryOn) -> Class {
    let (cause, delivery) = match *outcome {
        Outcome::ClientGone => return Class::Cancelled,
        Outcome::Response {
            status,
            grpc_status,
            ..
        } => {
            if retry_on.status(status) {
                let delivery = if status == 429 {
                    Delivery::NotProcessed
                } else {
                    Delivery::Answered
                };
                (Cause::Status(status), delivery)
            } else if let Some(code) = grpc_status.filter(|c| retry_on.grpc(*c)) {
                (Cause::Grpc(code), Delivery::Answered)
            } else {
                return Class::NotRetryable;
            }
        }
        Outcome::ConnectFailure
        | Outcome::Reset {
            request_sent: false,
        } if retry_on.connect_failure => (Cause::ConnectFailure, Delivery::NotProcessed),
        // Whatever `retry_on` lists: the upstream asked for another connection.
        Outcome::RefusedStream => (Cause::RefusedStream, Delivery::NotProcessed),
        Outcome::Reset { request_sent: true } if retry_on.reset => {
            (Cause::Reset, Delivery::Uncertain)
        }
        Outcome::Timeout if retry_on.timeout => (Cause::Timeout, Delivery::Uncertain),
        Outcome::ConnectFailure | Outcome::Reset { .. } | Outcome::Timeout => {
            return Class::NotRetryable
        }
        Outcome::BadResponse => return Class::NotRetryable,
    };
    Class::Retryable {
        cause,
        delivery,
        safe: delivery == Delivery::NotProcessed || facts.idempotent,
    }
}

/// Why a retryable outcome was not retried: the first failing check of
/// docs/reference/retries.md#the-retry-decision, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Replaying could repeat a non-idempotent request.
    Unsafe,
    /// The body cannot be replayed.
    Body,
    /// `max_attempts` attempts were made.
    Attempts,
    /// The answer asks not to be retried: a negative or malformed
    /// `grpc-retry-pushback-ms`, or a proxy's refusal under load.
    Pushback,
    /// The upstream's `Retry-After` (or `grpc-retry-pushback-ms`) exceeds
    /// `max_retry_after`.
    RetryAfter,
    /// The delay plus `min_attempt_time` does not fit before the deadline.
    Deadline,
    /// The retry budget has no token.
    Budget,
    /// The breaker does not admit the retry.
    CircuitOpen,
    /// The limiter has no token now.
    RateLimited,
}

impl StopReason {
    /// The `x-weir-retry-stop` value and `weir_retry_stops_total{reason}` label.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Unsafe => "unsafe",
            StopReason::Body => "body",
            StopReason::Attempts => "attempts",
            StopReason::Pushback => "pushback",
            StopReason::RetryAfter => "retry_after",
            StopReason::Deadline => "deadline",
            StopReason::Budget => "budget",
            StopReason::CircuitOpen => "circuit_open",
            StopReason::RateLimited => "rate_limited",
        }
    }

    /// Every reason, in the order of docs/reference/retries.md#the-retry-decision (to pre-register metric series).
    pub const ALL: [StopReason; 9] = [
        StopReason::Unsafe,
        StopReason::Body,
        StopReason::Attempts,
        StopReason::Pushback,
        StopReason::RetryAfter,
        StopReason::Deadline,
        StopReason::Budget,
        StopReason::CircuitOpen,
        StopReason::RateLimited,
    ];
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The decision for one attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Verdict {
    /// Wait `delay`, then make another attempt.
    Retry {
        /// The backoff delay, or the honoured `Retry-After` or pushback.
        #[serde(rename = "delay_ms", serialize_with = "ser_ms")]
        delay: Duration,
        /// What is being retried.
        cause: Cause,
    },
    /// Retryable, but not retried: return the last outcome unchanged, with
    /// `x-weir-retry-stop: <reason>`.
    Stop {
        /// The first failing check.
        reason: StopReason,
        /// What would have been retried.
        cause: Cause,
    },
    /// Success, or not listed in `retry_on`: return it as it is.
    NotRetryable,
    /// The client went away: nothing to return, nothing to count.
    Cancelled,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The stateful checks of docs/reference/retries.md#the-retry-decision (7–9), asked lazily and in order: a later gate
/// is only asked when every earlier check passed, so a budget token is only
/// withdrawn for a retry that got that far.
pub trait Gates {
    /// Withdraw `cost` tokens from the retry budget; `false` if it cannot.
    fn budget(&mut self, cost: u32) -> bool;
    /// Ask the breaker to admit the retry (keep the admission); `false` if open.
    fn breaker(&mut self) -> bool;
    /// Take a limiter token now (a retry never queues); `false` if none.
    fn limiter(&mut self) -> bool;
}

/// Fixed gate answers, for the JSON contract and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedGates {
    /// The budget has a token.
    pub budget: bool,
    /// The breaker admits.
    pub breaker: bool,
    /// The limiter has a token.
    pub limiter: bool,
}

impl Gates for FixedGates {
    fn budget(&mut self, _cost: u32) -> bool {
        self.budget
    }
    fn breaker(&mut self) -> bool {
        self.breaker
    }
    fn limiter(&mut self) -> bool {
        self.limiter
    }
}

/// Everything [`decide`] needs besides the gates and the random draw.
#[derive(Debug, Clone, Copy)]
pub struct DecideInput<'a> {
    /// The upstream's retry policy.
    pub policy: &'a RetryPolicy,
    /// The request's facts.
    pub facts: &'a RequestFacts,
    /// How the last attempt ended.
    pub outcome: &'a Outcome,
    /// Attempts made so far, the one that just ended included (≥ 1). The
    /// retry being considered is retry number `attempts_made`.
    pub attempts_made: u32,
    /// Time left until the request's deadline; `None` = no deadline.
    pub time_left: Option<Duration>,
    /// The delay slept before the previous retry (zero before the first);
    /// feeds decorrelated jitter.
    pub prev_delay: Duration,
    /// The retry can go to an endpoint that has not failed this request:
    /// it goes at once, without the backoff, which spares the endpoint
    /// that failed (docs/reference/retries.md#backoff). A `Retry-After` is
    /// still honoured.
    pub elsewhere: bool,
}

/// Decides whether to retry (docs/reference/retries.md#the-retry-decision). The backoff delay is drawn from
/// `rng` only when it is needed (no draw when a check before it fails, or a
/// `Retry-After` or pushback replaces it).
pub fn decide(input: &DecideInput<'_>, rng: &mut dyn Random, gates: &mut dyn Gates) -> Verdict {
    let backoff = &input.policy.backoff;
    decide_with(
        input,
        &mut || delay(backoff, input.attempts_made, input.prev_delay, rng),
        gates,
    )
}

/// [`decide`] with the backoff delay supplied by `backoff_delay` (called at
/// most once) instead of drawn.
pub fn decide_with(
    input: &DecideInput<'_>,
    backoff_delay: &mut dyn FnMut() -> Duration,
    gates: &mut dyn Gates,
) -> Verdict {
    let p = input.policy;
    let (cause, safe) = match classify(input.outcome, input.facts, &p.retry_on) {
        Class::NotRetryable => return Verdict::NotRetryable,
        Class::Cancelled => return Verdict::Cancelled,
        Class::Retryable { cause, safe, .. } => (cause, safe),
    };
    let stop = |reason| Verdict::Stop { reason, cause };
    // 1. unsafe
    if !safe {
        return stop(StopReason::Unsafe);
    }
    // 2. body
    let replayable = match input.facts.body {
        BodyFacts::Empty => true,
        BodyFacts::Buffered { len } => len <= p.max_replay_body_bytes,
        BodyFacts::Streamed { bytes_read, .. } => {
            !bytes_read && matches!(cause, Cause::ConnectFailure | Cause::RefusedStream)
        }
    };
    if !replayable {
        return stop(StopReason::Body);
    }
    // 3. attempts
    if input.attempts_made >= p.max_attempts {
        return stop(StopReason::Attempts);
    }
    // 4. pushback: the answer asks not to be retried
    let (retry_after, pushback) = match input.outcome {
        Outcome::Response {
            retry_after,
            pushback,
            ..
        } => (*retry_after, *pushback),
        _ => (None, None),
    };
    let asked = match pushback {
        Some(Pushback::DoNotRetry | Pushback::Refused) => return stop(StopReason::Pushback),
        // gRPC's own word on the wait outranks an HTTP `Retry-After`.
        Some(Pushback::After(wait)) => Some(wait),
        None => retry_after,
    };
    // 5. retry_after: an honoured wait replaces the computed delay
    let delay = match asked {
        Some(ra) if ra > p.max_retry_after => return stop(StopReason::RetryAfter),
        Some(ra) => ceil_ms(ra),
        // A refused stream goes straight to a new connection: nothing is wrong.
        None if cause == Cause::RefusedStream => Duration::ZERO,
        // Another endpoint has not seen this request: no one to spare.
        None if input.elsewhere => Duration::ZERO,
        None => backoff_delay(),
    };
    // 6. deadline
    if let Some(left) = input.time_left {
        if delay.saturating_add(p.min_attempt_time) > left {
            return stop(StopReason::Deadline);
        }
    }
    // 7. budget
    let cost = match input.outcome {
        Outcome::Timeout => p.budget.timeout_cost,
        // Not a failure: a replay of what the upstream never saw costs nothing.
        Outcome::RefusedStream => 0,
        _ => 1,
    };
    if cost > 0 && !gates.budget(cost) {
        return stop(StopReason::Budget);
    }
    // 8. circuit_open
    if !gates.breaker() {
        return stop(StopReason::CircuitOpen);
    }
    // 9. rate_limited
    if !gates.limiter() {
        return stop(StopReason::RateLimited);
    }
    Verdict::Retry { delay, cause }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::contract::PolicyJson;
    use crate::policy::random::FixedRandom;

    /// Gates that record which were asked.
    #[derive(Default)]
    struct Recording {
        asked: Vec<&'static str>,
        answer: bool,
    }

    impl Gates for Recording {
        fn budget(&mut self, cost: u32) -> bool {
            self.asked
                .push(if cost == 1 { "budget" } else { "budget2" });
            self.answer
        }
        fn breaker(&mut self) -> bool {
            self.asked.push("breaker");
            self.answer
        }
        fn limiter(&mut self) -> bool {
            self.asked.push("limiter");
            self.answer
        }
    }

    fn run(method: &str, outcome: Outcome, attempts: u32, gates: &mut Recording) -> Verdict {
        let policy = PolicyJson::default().to_policy().unwrap();
        let facts = RequestFacts::new(method, false, BodyFacts::Empty);
        let input = DecideInput {
            policy: &policy,
            facts: &facts,
            outcome: &outcome,
            attempts_made: attempts,
            time_left: Some(Duration::from_secs(10)),
            prev_delay: Duration::ZERO,
            elsewhere: false,
        };
        decide(&input, &mut FixedRandom(1.0), gates)
    }

    #[test]
    fn a_retry_to_another_endpoint_goes_at_once_unless_retry_after_says_wait() {
        let policy = PolicyJson::default().to_policy().unwrap();
        let facts = RequestFacts::new("GET", false, BodyFacts::Empty);
        let verdict = |outcome: &Outcome, elsewhere: bool| {
            let input = DecideInput {
                policy: &policy,
                facts: &facts,
                outcome,
                attempts_made: 1,
                time_left: Some(Duration::from_secs(10)),
                prev_delay: Duration::ZERO,
                elsewhere,
            };
            decide(
                &input,
                &mut FixedRandom(1.0),
                &mut FixedGates {
                    budget: true,
                    breaker: true,
                    limiter: true,
                },
            )
        };
        let failed = Outcome::ConnectFailure;
        // The same endpoint again: the backoff (25 ms with full jitter at 1.0).
        assert!(
            matches!(verdict(&failed, false), Verdict::Retry { delay, .. } if delay == Duration::from_millis(25))
        );
        // Another endpoint: at once.
        assert!(matches!(verdict(&failed, true), Verdict::Retry { delay, .. } if delay.is_zero()));
        // The upstream asked for a wait: honoured wherever the retry goes.
        let wait = Outcome::Response {
            status: 503,
            retry_after: Some(Duration::from_secs(2)),
            grpc_status: None,
            pushback: None,
        };
        assert!(
            matches!(verdict(&wait, true), Verdict::Retry { delay, .. } if delay == Duration::from_secs(2))
        );
    }

    /// Pushback (docs/reference/retries.md#pushback): gRPC's
    /// `grpc-retry-pushback-ms` sets the wait or forbids the retry; a
    /// proxy's refusal forbids it. Regression (issue 54): −1 was retried,
    /// and 2000 was retried after the backoff's few milliseconds.
    #[test]
    fn pushback_sets_the_wait_or_stops() {
        let policy = PolicyJson {
            retry_on: ["unavailable", "503"].map(String::from).to_vec(),
            ..PolicyJson::default()
        }
        .to_policy()
        .unwrap();
        let keyed = RequestFacts::new("POST", true, BodyFacts::Empty);
        let post = RequestFacts::new("POST", false, BodyFacts::Empty);
        let answer = |status, grpc_status, retry_after, pushback| Outcome::Response {
            status,
            retry_after,
            grpc_status,
            pushback,
        };
        let unavailable = |p| answer(200, Some(14), None, Some(p));
        let verdict =
            |facts: &RequestFacts, outcome: &Outcome, attempts, left, g: &mut Recording| {
                let input = DecideInput {
                    policy: &policy,
                    facts,
                    outcome,
                    attempts_made: attempts,
                    time_left: Some(Duration::from_millis(left)),
                    prev_delay: Duration::ZERO,
                    elsewhere: true,
                };
                decide(&input, &mut FixedRandom(1.0), g)
            };
        let stop = |reason, cause| Verdict::Stop { reason, cause };
        let (grpc, s503) = (Cause::Grpc(14), Cause::Status(503));
        let mut g = Recording::default();
        // Negative or malformed: no retry, and no gate is asked.
        let no = unavailable(Pushback::DoNotRetry);
        assert_eq!(
            verdict(&keyed, &no, 1, 10_000, &mut g),
            stop(StopReason::Pushback, grpc)
        );
        // A proxy's refusal, HTTP or gRPC alike.
        let refused = answer(503, None, None, Some(Pushback::Refused));
        let get = RequestFacts::new("GET", false, BodyFacts::Empty);
        assert_eq!(
            verdict(&get, &refused, 1, 10_000, &mut g),
            stop(StopReason::Pushback, s503)
        );
        assert!(g.asked.is_empty());
        // The checks before it still come first.
        assert_eq!(
            verdict(&post, &refused, 1, 10_000, &mut g),
            stop(StopReason::Unsafe, s503)
        );
        assert_eq!(
            verdict(&keyed, &no, 3, 10_000, &mut g),
            stop(StopReason::Attempts, grpc)
        );
        // An answer nobody would retry stays not retryable.
        let ok = answer(200, Some(0), None, Some(Pushback::Refused));
        assert_eq!(
            verdict(&keyed, &ok, 1, 10_000, &mut g),
            Verdict::NotRetryable
        );
        // A wait: honoured wherever the retry goes, over a `Retry-After`,
        // bounded by `max_retry_after` and by the deadline.
        let mut yes = Recording {
            answer: true,
            ..Recording::default()
        };
        let wait = |ms| Pushback::After(Duration::from_millis(ms));
        let two_s = answer(
            200,
            Some(14),
            Some(Duration::from_secs(1)),
            Some(wait(2000)),
        );
        assert_eq!(
            verdict(&keyed, &two_s, 1, 10_000, &mut yes),
            Verdict::Retry {
                delay: Duration::from_secs(2),
                cause: grpc
            }
        );
        assert_eq!(
            verdict(&keyed, &unavailable(wait(60_001)), 1, 100_000, &mut g),
            stop(StopReason::RetryAfter, grpc)
        );
        assert_eq!(
            verdict(&keyed, &two_s, 1, 2_005, &mut g),
            stop(StopReason::Deadline, grpc)
        );
        assert!(matches!(
            verdict(&keyed, &unavailable(wait(0)), 1, 10_000, &mut yes),
            Verdict::Retry { delay, .. } if delay.is_zero()
        ));
    }

    #[test]
    fn gates_are_not_asked_when_an_earlier_check_fails() {
        let mut g = Recording::default();
        let v = run("POST", Outcome::Timeout, 1, &mut g);
        assert_eq!(
            v,
            Verdict::Stop {
                reason: StopReason::Unsafe,
                cause: Cause::Timeout
            }
        );
        let v = run("GET", Outcome::ConnectFailure, 3, &mut g);
        assert_eq!(
            v,
            Verdict::Stop {
                reason: StopReason::Attempts,
                cause: Cause::ConnectFailure
            }
        );
        assert!(g.asked.is_empty());
    }

    /// Regression (HTTP/2 GOAWAY): a stream above the upstream's last stream
    /// id was never processed; POSTs came back 502 `unsafe`.
    #[test]
    fn a_refused_stream_is_replayed_at_once_for_any_method_without_budget() {
        let mut g = Recording {
            answer: true,
            ..Recording::default()
        };
        let v = run("POST", Outcome::RefusedStream, 1, &mut g);
        assert_eq!(
            v,
            Verdict::Retry {
                delay: Duration::ZERO,
                cause: Cause::RefusedStream
            }
        );
        // No budget asked: it is not a failure. The breaker and limiter still are.
        assert_eq!(g.asked, ["breaker", "limiter"]);
        let b = crate::policy::BreakerParams::try_new(
            true,
            1,
            1,
            1,
            0.5,
            vec![503],
            Duration::from_secs(1),
            Duration::from_secs(1),
            0.0,
            1,
        )
        .unwrap();
        assert_eq!(Outcome::RefusedStream.breaker_failure(&b), None);
        assert_eq!(Outcome::RefusedStream.result_label(), "refused_stream");
        // max_attempts still holds.
        let v = run("POST", Outcome::RefusedStream, 3, &mut g);
        assert_eq!(
            v,
            Verdict::Stop {
                reason: StopReason::Attempts,
                cause: Cause::RefusedStream
            }
        );
    }

    #[test]
    fn gates_are_asked_in_order_and_lazily() {
        let mut g = Recording::default();
        let v = run("GET", Outcome::ConnectFailure, 1, &mut g);
        assert_eq!(
            v,
            Verdict::Stop {
                reason: StopReason::Budget,
                cause: Cause::ConnectFailure
            }
        );
        assert_eq!(g.asked, ["budget"]);
        let mut g = Recording {
            answer: true,
            ..Recording::default()
        };
        let v = run("GET", Outcome::Timeout, 1, &mut g);
        assert_eq!(
            v,
            Verdict::Retry {
                delay: Duration::from_millis(25),
                cause: Cause::Timeout
            }
        );
        // a timeout withdraws timeout_cost
        assert_eq!(g.asked, ["budget2", "breaker", "limiter"]);
    }

    #[test]
    fn classification_table() {
        let on = RetryOn::parse(
            &[
                "connect-failure",
                "reset",
                "timeout",
                "429",
                "503",
                "unavailable",
            ]
            .map(String::from),
        )
        .unwrap();
        let get = RequestFacts::new("GET", false, BodyFacts::Empty);
        let post = RequestFacts::new("POST", false, BodyFacts::Empty);
        let resp = |status, grpc| Outcome::Response {
            status,
            retry_after: None,
            grpc_status: grpc,
            pushback: None,
        };
        let r = |cause, delivery, safe| Class::Retryable {
            cause,
            delivery,
            safe,
        };
        assert_eq!(classify(&resp(200, None), &post, &on), Class::NotRetryable);
        assert_eq!(classify(&resp(500, None), &get, &on), Class::NotRetryable);
        assert_eq!(
            classify(&resp(429, None), &post, &on),
            r(Cause::Status(429), Delivery::NotProcessed, true)
        );
        assert_eq!(
            classify(&resp(503, None), &post, &on),
            r(Cause::Status(503), Delivery::Answered, false)
        );
        assert_eq!(
            classify(&resp(503, None), &get, &on),
            r(Cause::Status(503), Delivery::Answered, true)
        );
        assert_eq!(
            classify(&resp(200, Some(14)), &post, &on),
            r(Cause::Grpc(14), Delivery::Answered, false)
        );
        assert_eq!(
            classify(&Outcome::ConnectFailure, &post, &on),
            r(Cause::ConnectFailure, Delivery::NotProcessed, true)
        );
        assert_eq!(
            classify(
                &Outcome::Reset {
                    request_sent: false
                },
                &post,
                &on
            ),
            r(Cause::ConnectFailure, Delivery::NotProcessed, true)
        );
        assert_eq!(
            classify(&Outcome::Reset { request_sent: true }, &post, &on),
            r(Cause::Reset, Delivery::Uncertain, false)
        );
        assert_eq!(
            classify(&Outcome::Timeout, &get, &on),
            r(Cause::Timeout, Delivery::Uncertain, true)
        );
        assert_eq!(classify(&Outcome::ClientGone, &get, &on), Class::Cancelled);
        let keyed = RequestFacts::new("POST", true, BodyFacts::Empty);
        assert_eq!(
            classify(&Outcome::Timeout, &keyed, &on),
            r(Cause::Timeout, Delivery::Uncertain, true)
        );
        let none = RetryOn::parse(&[]).unwrap();
        assert_eq!(
            classify(&Outcome::Timeout, &get, &none),
            Class::NotRetryable
        );
    }

    #[test]
    fn idempotent_methods() {
        for m in ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"] {
            assert!(is_idempotent_method(m));
        }
        for m in ["POST", "PATCH", "CONNECT", "get"] {
            assert!(!is_idempotent_method(m));
        }
    }

    #[test]
    fn labels() {
        assert_eq!(Cause::Status(503).to_string(), "status_503");
        assert_eq!(Cause::Grpc(8).to_string(), "grpc_resource_exhausted");
        assert_eq!(StopReason::CircuitOpen.as_str(), "circuit_open");
        assert_eq!(
            Outcome::Reset {
                request_sent: false
            }
            .result_label(),
            "connect_failure"
        );
    }
}
