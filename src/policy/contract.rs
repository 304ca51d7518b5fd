//! The JSON decision contract (version 1): what `weir decide` reads and
//! prints, and what the fixture matrix in `tests/fixtures/decisions/` pins.
//!
//! Owns the serde shapes [`DecisionInput`] and [`VerdictJson`] and their
//! translation onto the typed core ([`decide_with`]). It must not decide
//! anything itself, read a clock or draw unseeded randomness: the wall clock
//! an HTTP-date `Retry-After` is measured against is an input field
//! (`now_unix_ms`), and jitter comes from `seed` or an explicit `delay_ms`.
//! Durations are whole milliseconds in fields named `*_ms`.

use super::backoff::{delay, BackoffPolicy, Growth, Jitter};
use super::budget::BudgetParams;
use super::decide::{
    decide_with, BodyFacts, DecideInput, FixedGates, Outcome, RequestFacts, RetryOn, RetryPolicy,
    Verdict,
};
use super::random::SeededRandom;
use super::retry_after::{parse_retry_after, Pushback};
use super::PolicyError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The only contract version this build speaks.
pub const CONTRACT_VERSION: u32 = 1;

/// A decision to make, as JSON.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionInput {
    /// Must be 1.
    pub contract_version: u32,
    /// The request's facts.
    pub request: RequestJson,
    /// Attempts made so far, the one that just ended included.
    pub attempts_made: u32,
    /// How the last attempt ended.
    pub outcome: OutcomeJson,
    /// Time left until the deadline; absent = no deadline.
    #[serde(default)]
    pub time_left_ms: Option<u64>,
    /// Wall-clock time (ms since the Unix epoch) an HTTP-date `Retry-After`
    /// is measured against; absent = the epoch (any date is far future).
    #[serde(default)]
    pub now_unix_ms: Option<u64>,
    /// The upstream's retry policy; absent fields take weir's defaults.
    #[serde(default)]
    pub policy: PolicyJson,
    /// The stateful gates' answers; absent = all admit.
    #[serde(default)]
    pub gates: GatesJson,
    /// Seed of the jitter draw (default 0).
    #[serde(default)]
    pub seed: Option<u64>,
    /// An explicit backoff delay, replacing the drawn one.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// The delay before the previous retry (decorrelated jitter).
    #[serde(default)]
    pub prev_delay_ms: Option<u64>,
    /// Whether the retry can go to an endpoint that has not failed this
    /// request (default false): then it goes at once.
    #[serde(default)]
    pub elsewhere: bool,
}

/// The request, as JSON.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestJson {
    /// The method, case-sensitive (`"GET"`).
    pub method: String,
    /// Whether the idempotency-key header is present.
    #[serde(default)]
    pub idempotency_key: bool,
    /// The body (default: none).
    #[serde(default)]
    pub body: BodyFacts,
}

/// An attempt's outcome, as JSON: `{"kind": "response", "status": 503, ...}`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OutcomeJson {
    /// Response headers arrived.
    Response {
        /// The status code.
        status: u16,
        /// The raw `Retry-After` header value.
        #[serde(default)]
        retry_after: Option<String>,
        /// The gRPC status code.
        #[serde(default)]
        grpc_status: Option<u8>,
        /// The raw `grpc-retry-pushback-ms` value: whole milliseconds to
        /// wait, or (negative, malformed) no retry
        /// (docs/reference/retries.md#pushback).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grpc_retry_pushback_ms: Option<String>,
        /// The answer is a proxy's refusal under load (`x-envoy-overloaded`,
        /// `x-envoy-ratelimited`, another weir's `x-weir-error: overloaded |
        /// circuit_open | rate_limited`); default false.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        refused: bool,
    },
    /// Nothing reached the upstream.
    ConnectFailure,
    /// Reset or closed with no response.
    Reset {
        /// Whether any of the request was written.
        request_sent: bool,
    },
    /// Per-try timeout without response headers.
    Timeout,
    /// An HTTP/2 stream refused unprocessed (above a GOAWAY's last stream
    /// id, or `REFUSED_STREAM`).
    RefusedStream,
    /// A response that is not valid HTTP (garbled or oversized head).
    BadResponse,
    /// The client went away.
    ClientGone,
}

/// The gates' answers, as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatesJson {
    /// The retry budget has a token.
    pub budget_available: bool,
    /// The breaker admits.
    pub breaker_admits: bool,
    /// The limiter has a token now.
    pub limiter_has_token: bool,
}

impl Default for GatesJson {
    fn default() -> Self {
        GatesJson {
            budget_available: true,
            breaker_admits: true,
            limiter_has_token: true,
        }
    }
}

/// A retry policy, as JSON. Defaults as in docs/reference/configuration.md#policy-defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyJson {
    /// Attempts counting the first (default 3).
    pub max_attempts: u32,
    /// Retryable conditions (default connect-failure, reset, timeout, 502–504).
    pub retry_on: Vec<String>,
    /// Longest honoured `Retry-After` (default 60 000).
    pub max_retry_after_ms: u64,
    /// Largest replayable body (default 65 536).
    pub max_replay_body_bytes: u64,
    /// Time an attempt needs at least (default 10).
    pub min_attempt_time_ms: u64,
    /// Backoff (default 25 ms / 1 s / ×2, exponential, full jitter).
    pub backoff: BackoffJson,
    /// Cost of a retry after a timeout (default 2).
    pub timeout_cost: u32,
}

impl Default for PolicyJson {
    fn default() -> Self {
        PolicyJson {
            max_attempts: 3,
            retry_on: ["connect-failure", "reset", "timeout", "502", "503", "504"]
                .map(String::from)
                .to_vec(),
            max_retry_after_ms: 60_000,
            max_replay_body_bytes: 65_536,
            min_attempt_time_ms: 10,
            backoff: BackoffJson::default(),
            timeout_cost: 2,
        }
    }
}

/// A backoff policy, as JSON.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackoffJson {
    /// Default 25.
    pub base_ms: u64,
    /// Default 1 000.
    pub max_ms: u64,
    /// Default 2.0.
    pub multiplier: f64,
    /// Default exponential.
    pub growth: Growth,
    /// Default full; `{"proportional": 0.2}` for proportional.
    pub jitter: Jitter,
    /// Default false.
    pub allow_jitter_above_cap: bool,
}

impl Default for BackoffJson {
    fn default() -> Self {
        BackoffJson {
            base_ms: 25,
            max_ms: 1_000,
            multiplier: 2.0,
            growth: Growth::Exponential,
            jitter: Jitter::Full,
            allow_jitter_above_cap: false,
        }
    }
}

impl PolicyJson {
    /// Validates into a [`RetryPolicy`] (the budget's own parameters play no
    /// part in one decision; only `timeout_cost` does).
    pub fn to_policy(&self) -> Result<RetryPolicy, PolicyError> {
        let b = &self.backoff;
        let backoff = BackoffPolicy::try_new(
            Duration::from_millis(b.base_ms),
            Duration::from_millis(b.max_ms),
            b.multiplier,
            b.growth,
            b.jitter,
            b.allow_jitter_above_cap,
        )?;
        let budget = BudgetParams::try_new(0.1, 10, Duration::from_secs(10), self.timeout_cost)?;
        RetryPolicy::try_new(
            self.max_attempts,
            RetryOn::parse(&self.retry_on)?,
            Duration::from_millis(self.max_retry_after_ms),
            self.max_replay_body_bytes,
            Duration::from_millis(self.min_attempt_time_ms),
            backoff,
            budget,
        )
    }
}

/// A verdict, as JSON: `{"contract_version": 1, "decision": "retry",
/// "delay_ms": 3000, "cause": "status_503"}` or `{"contract_version": 1,
/// "decision": "stop", "reason": "unsafe", "cause": "timeout"}`, or
/// `"decision": "not_retryable"` / `"cancelled"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct VerdictJson {
    /// Always 1.
    pub contract_version: u32,
    /// The verdict.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// Runs the decision core on a JSON input. An input of another contract
/// version, or with an invalid policy, is an error naming the field.
pub fn decide_json(input: &DecisionInput) -> Result<VerdictJson, PolicyError> {
    if input.contract_version != CONTRACT_VERSION {
        return Err(PolicyError::new(
            "contract_version",
            format!(
                "this weir speaks decision contract version {CONTRACT_VERSION}, got {}",
                input.contract_version
            ),
        ));
    }
    let policy = input.policy.to_policy()?;
    let r = &input.request;
    let facts = RequestFacts::new(&r.method, r.idempotency_key, r.body);
    let now_wall = UNIX_EPOCH + Duration::from_millis(input.now_unix_ms.unwrap_or(0));
    let outcome = to_outcome(&input.outcome, now_wall);
    let prev_delay = Duration::from_millis(input.prev_delay_ms.unwrap_or(0));
    let d = DecideInput {
        policy: &policy,
        facts: &facts,
        outcome: &outcome,
        attempts_made: input.attempts_made,
        time_left: input.time_left_ms.map(Duration::from_millis),
        prev_delay,
        elsewhere: input.elsewhere,
    };
    let mut gates = FixedGates {
        budget: input.gates.budget_available,
        breaker: input.gates.breaker_admits,
        limiter: input.gates.limiter_has_token,
    };
    let mut rng = SeededRandom::new(input.seed.unwrap_or(0));
    let explicit = input.delay_ms.map(Duration::from_millis);
    let mut backoff = || {
        explicit.unwrap_or_else(|| delay(&policy.backoff, d.attempts_made, prev_delay, &mut rng))
    };
    Ok(VerdictJson {
        contract_version: CONTRACT_VERSION,
        verdict: decide_with(&d, &mut backoff, &mut gates),
    })
}

fn to_outcome(o: &OutcomeJson, now_wall: SystemTime) -> Outcome {
    match o {
        OutcomeJson::Response {
            status,
            retry_after,
            grpc_status,
            grpc_retry_pushback_ms,
            refused,
        } => Outcome::Response {
            status: *status,
            retry_after: retry_after
                .as_deref()
                .and_then(|v| parse_retry_after(v, now_wall)),
            grpc_status: *grpc_status,
            pushback: Pushback::of(
                *refused,
                grpc_retry_pushback_ms.as_deref().map(str::as_bytes),
            ),
        },
        OutcomeJson::ConnectFailure => Outcome::ConnectFailure,
        OutcomeJson::Reset { request_sent } => Outcome::Reset {
            request_sent: *request_sent,
        },
        OutcomeJson::Timeout => Outcome::Timeout,
        OutcomeJson::RefusedStream => Outcome::RefusedStream,
        OutcomeJson::BadResponse => Outcome::BadResponse,
        OutcomeJson::ClientGone => Outcome::ClientGone,
    }
}
