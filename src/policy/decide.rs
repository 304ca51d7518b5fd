//! Classification (SEMANTICS §2.1) and the retry decision (§2.2).

use super::{BackoffPolicy, BudgetParams, PolicyError};
use std::time::Duration;

/// gRPC status codes weir understands in `retry_on`.
pub const GRPC_CODES: &[(&str, u8)] = &[
    ("cancelled", 1),
    ("unknown", 2),
    ("deadline-exceeded", 4),
    ("resource-exhausted", 8),
    ("aborted", 10),
    ("internal", 13),
    ("unavailable", 14),
];

/// What `retry_on` lists, compiled into bit sets.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct RetryOn {
    pub connect_failure: bool,
    pub reset: bool,
    pub timeout: bool,
    /// Bit `s - 100` set for each retryable HTTP status `s` in 100..=599.
    statuses: [u64; 8],
    /// Bit `c` set for each retryable gRPC code.
    grpc: u32,
    /// The entries as written, for display.
    pub entries: Vec<String>,
}

impl RetryOn {
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
                    } else if let Some((_, c)) = GRPC_CODES
                        .iter()
                        .find(|(n, _)| *n == other.replace('_', "-"))
                    {
                        on.grpc |= 1 << c;
                    } else {
                        return Err(PolicyError::new(
                            "retry_on",
                            format!(
                                "unknown condition {e:?}: expected connect-failure, reset, timeout, \
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

    pub fn status(&self, s: u16) -> bool {
        if !(100..=599).contains(&s) {
            return false;
        }
        let i = usize::from(s - 100);
        self.statuses[i / 64] & (1 << (i % 64)) != 0
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
    pub retry_on: RetryOn,
    pub max_retry_after: Duration,
    pub max_replay_body_bytes: u64,
    pub min_attempt_time: Duration,
    pub backoff: BackoffPolicy,
    pub budget: BudgetParams,
}

impl RetryPolicy {
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
