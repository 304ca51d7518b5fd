//! The retry budget (SEMANTICS §3): the retry-storm defence.

use super::PolicyError;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BudgetParams {
    /// Tokens deposited by every first attempt.
    pub ratio: f64,
    /// Retries per second always allowed, whatever the deposits.
    pub min_per_sec: u32,
    /// How long a deposit lasts.
    pub ttl: Duration,
    /// Tokens a retry after an uncertain timeout withdraws.
    pub timeout_cost: u32,
}

impl BudgetParams {
    pub fn try_new(
        ratio: f64,
        min_per_sec: u32,
        ttl: Duration,
        timeout_cost: u32,
    ) -> Result<Self, PolicyError> {
        if !ratio.is_finite() || !(0.0..=1000.0).contains(&ratio) {
            return Err(PolicyError::new(
                "ratio",
                format!("must be a finite number ≥ 0, got {ratio}"),
            ));
        }
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
            return Err(PolicyError::new(
                "ttl",
                format!("must be between 1s and 60s, got {ttl:?}"),
            ));
        }
        if timeout_cost == 0 {
            return Err(PolicyError::new("timeout_cost", "must be at least 1"));
        }
        Ok(BudgetParams {
            ratio,
            min_per_sec,
            ttl,
            timeout_cost,
        })
    }
}
