//! The policy core: PURE. No tokio, no I/O, no clock reads, no global RNG.
//!
//! Every state machine here takes `now` as an argument (a [`Duration`] since an
//! arbitrary monotonic origin chosen by the caller — the data plane passes the
//! time since its clock's origin, tests pass whatever they like, including a
//! value smaller than the previous one to simulate a clock stepping back) and
//! every random choice comes from an injected [`Random`] source, so the same
//! seed always gives the same behaviour.
//!
//! The data plane (`crate::proxy`) asks these types what to do and does it;
//! nothing here ever calls back into it.

//! Module map:
//!
//! | module | owns |
//! |---|---|
//! | [`backoff`] | delay per retry; `schedule`, `envelope` |
//! | [`retry_after`] | what an answer says of being retried: `Retry-After` against a passed-in wall clock, pushback (`grpc-retry-pushback-ms`, a proxy's refusal) |
//! | [`budget`] | the retry budget (deposit / withdraw / balance) |
//! | [`breaker`] | the circuit breaker state machine |
//! | [`limiter`] | token bucket, sliding window, both combined |
//! | [`adaptive`] | the adaptive concurrency limit: a gradient controller over latency |
//! | `adaptive_sim` | (tests only) a deterministic simulation of the adaptive limit before a queueing upstream, and the sweep its defaults come from |
//! | [`throttle`] | client-side throttling: the SRE book's adaptive throttling for an upstream that sheds |
//! | [`balance`] | the balancer's choice among endpoints: peak-EWMA estimates, two random choices |
//! | [`eject`] | outlier ejection: when an endpoint is taken out and let back |
//! | [`grpc`] | gRPC status codes by name, methods declared safe to retry, which codes say a call was not processed |
//! | [`keyed`] | the per-key limiter registry, bounded, LRU |
//! | [`leased_tokens`] | a fleet-wide bucket's tokens leased in batches and spent locally; the fallback when the shared state is away |
//! | [`idempotency`] | idempotency-key records: fingerprint, `decide`, what to record, the store |
//! | [`cache`] | the response cache: `storable`, `lookup_decision`, `on_error`, `on_not_modified`, `invalidates`, the store, fills in progress |
//! | [`hedge`] | hedged requests: when one is due (a fixed delay or a latency percentile), the credit that bounds them |
//! | [`decide`](mod@decide) | request facts, outcomes, `classify`, `decide`, `Gates` |
//! | [`contract`] | the versioned JSON shapes of `weir decide` |
//! | [`report`] | the text `weir schedule` prints |
//! | [`random`] | the injected random source |

pub mod adaptive;
#[cfg(test)]
pub mod adaptive_sim;
pub mod backoff;
pub mod balance;
pub mod breaker;
pub mod budget;
pub mod cache;
pub mod contract;
pub mod decide;
pub mod eject;
pub mod grpc;
pub mod hedge;
pub mod idempotency;
pub mod keyed;
pub mod leased_tokens;
pub mod limiter;
pub mod random;
pub mod report;
pub mod retry_after;
pub mod suggest;
pub mod throttle;

pub use adaptive::{AdaptiveLimit, AdaptiveParams};
pub use backoff::{delay, envelope, schedule, BackoffPolicy, Envelope, Growth, Jitter};
pub use balance::BalanceParams;
pub use breaker::{
    Admission, Breaker, BreakerParams, Refused, State, StateKind, StateView, Transition,
};
pub use budget::{BudgetParams, RetryBudget};
pub use cache::{
    invalidates, lookup_decision, on_error, on_not_modified, storable, Bypass, CacheParams,
    CacheRequest, CacheResult, CacheStats, CacheStore, CachedResponse, Decision, Fill,
    FillRegistry, Freshness, Lookup, Refreshed, ResponseFacts,
};
pub use contract::{decide_json, DecisionInput, VerdictJson, CONTRACT_VERSION};
pub use decide::{
    classify, decide, decide_with, is_idempotent_method, BodyFacts, Cause, Class, DecideInput,
    Delivery, FixedGates, Gates, Outcome, RequestFacts, RetryOn, RetryPolicy, StopReason, Verdict,
};
pub use hedge::{HedgeAfter, HedgeParams, HedgeResult, Hedger};
pub use idempotency::{
    Action, Begin, Ending, Entry, EntryState, Fingerprint, FingerprintHasher, IdempotencyParams,
    IdempotencyStats, IdempotencyStore, MemoryStore, Record, StoredResponse,
};
pub use keyed::{KeyedLimiter, KeyedStats};
pub use leased_tokens::{LeasedBucket, Take};
pub use limiter::{Left, Limiter, RateLimitParams, SlidingWindow, TokenBucket};
pub use random::{FixedRandom, Random, SeededRandom};
pub use report::{schedule_report, schedule_report_with};
pub use retry_after::{parse_grpc_pushback, parse_retry_after, Pushback};
pub use throttle::{AdaptiveThrottle, ThrottleParams};

use std::time::Duration;

/// A parameter that cannot make a valid policy. The config layer turns it into
/// an error that names the file, line, column and field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct PolicyError {
    /// The field, relative to the policy table (e.g. `jitter.proportional`).
    pub field: &'static str,
    pub message: String,
}

impl PolicyError {
    pub(crate) fn new(field: &'static str, message: impl Into<String>) -> Self {
        PolicyError {
            field,
            message: message.into(),
        }
    }
}

/// Every invalid field of one policy table, in the order of its fields: so
/// one run of `weir check` names them all rather than one per round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyErrors(pub Vec<PolicyError>);

impl PolicyErrors {
    /// Records `field`'s error unless `ok`.
    pub(crate) fn check(
        &mut self,
        ok: bool,
        field: &'static str,
        message: impl FnOnce() -> String,
    ) {
        if !ok {
            self.0.push(PolicyError::new(field, message()));
        }
    }

    /// `value()` when nothing was recorded.
    pub(crate) fn or_ok<T>(self, value: impl FnOnce() -> T) -> Result<T, PolicyErrors> {
        if self.0.is_empty() {
            Ok(value())
        } else {
            Err(self)
        }
    }

    /// The first error's field (tests and the decision contract name one).
    pub fn first_field(&self) -> Option<&'static str> {
        self.0.first().map(|e| e.field)
    }
}

impl std::fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

/// Whose a piece of policy state is (`breaker.scope`, `rate_limit.scope`;
/// docs/reference/fleet.md#fleet-state): this instance's alone, or shared by every
/// instance through the `[state]` backend. With `backend = "memory"` every
/// scope is the instance's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Instance,
    Fleet,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Instance => "instance",
            Scope::Fleet => "fleet",
        }
    }
}

/// Monotonic time as seen by the policy core: a duration since an origin the
/// caller picked.
pub type Now = Duration;
