//! Backoff delays (SEMANTICS §2.3): grow → cap → jitter → clamp → floor → round.

use super::PolicyError;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Growth {
    Exponential,
    Linear,
    Constant,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Jitter {
    Full,
    Equal,
    Decorrelated,
    None,
    /// `d · (1 + p · U[−1, 1])`, `0 < p ≤ 1`.
    Proportional(f64),
}

/// A validated backoff policy.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BackoffPolicy {
    pub base: Duration,
    pub max: Duration,
    pub multiplier: f64,
    pub growth: Growth,
    pub jitter: Jitter,
    pub allow_jitter_above_cap: bool,
}

impl BackoffPolicy {
    pub fn try_new(
        base: Duration,
        max: Duration,
        multiplier: f64,
        growth: Growth,
        jitter: Jitter,
        allow_jitter_above_cap: bool,
    ) -> Result<Self, PolicyError> {
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(PolicyError::new(
                "multiplier",
                format!("must be a finite number ≥ 1.0, got {multiplier}"),
            ));
        }
        if max < base {
            return Err(PolicyError::new(
                "max",
                format!("must be ≥ base ({base:?}), got {max:?}"),
            ));
        }
        if let Jitter::Proportional(p) = jitter {
            if !(p > 0.0 && p <= 1.0) {
                return Err(PolicyError::new(
                    "jitter.proportional",
                    format!("must be in (0, 1] — a fraction, not a percent; got {p}"),
                ));
            }
        }
        Ok(BackoffPolicy {
            base,
            max,
            multiplier,
            growth,
            jitter,
            allow_jitter_above_cap,
        })
    }
}
