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

pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod decide;
pub mod limiter;
pub mod random;
pub mod retry_after;

pub use backoff::{BackoffPolicy, Growth, Jitter};
pub use breaker::BreakerParams;
pub use budget::BudgetParams;
pub use decide::{RetryOn, RetryPolicy};
pub use limiter::RateLimitParams;
pub use random::{Random, SeededRandom};

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

/// Monotonic time as seen by the policy core: a duration since an origin the
/// caller picked.
pub type Now = Duration;
