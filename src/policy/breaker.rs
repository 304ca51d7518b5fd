//! The circuit breaker (SEMANTICS §4).

use super::PolicyError;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BreakerParams {
    pub enabled: bool,
    pub consecutive_failures: u32,
    pub window: u32,
    pub min_samples: u32,
    pub failure_rate: f64,
    pub failure_statuses: Vec<u16>,
    pub open: Duration,
    pub max_open: Duration,
    pub open_jitter: f64,
    pub half_open_probes: u32,
}

impl BreakerParams {
    #[allow(clippy::too_many_arguments)] // one argument per config field, validated together
    pub fn try_new(
        enabled: bool,
        consecutive_failures: u32,
        window: u32,
        min_samples: u32,
        failure_rate: f64,
        failure_statuses: Vec<u16>,
        open: Duration,
        max_open: Duration,
        open_jitter: f64,
        half_open_probes: u32,
    ) -> Result<Self, PolicyError> {
        if consecutive_failures == 0 {
            return Err(PolicyError::new(
                "consecutive_failures",
                "must be at least 1",
            ));
        }
        if window == 0 || window > 10_000 {
            return Err(PolicyError::new(
                "window",
                format!("must be between 1 and 10000, got {window}"),
            ));
        }
        if min_samples == 0 || min_samples > window {
            return Err(PolicyError::new(
                "min_samples",
                format!("must be between 1 and window ({window}), got {min_samples}"),
            ));
        }
        if !(failure_rate > 0.0 && failure_rate <= 1.0) {
            return Err(PolicyError::new(
                "failure_rate",
                format!("must be in (0, 1], got {failure_rate}"),
            ));
        }
        if let Some(s) = failure_statuses.iter().find(|s| !(100..=599).contains(*s)) {
            return Err(PolicyError::new(
                "failure_statuses",
                format!("{s} is not an HTTP status code (100–599)"),
            ));
        }
        if open.is_zero() {
            return Err(PolicyError::new("open", "must be greater than 0"));
        }
        if max_open < open {
            return Err(PolicyError::new(
                "max_open",
                format!("must be ≥ open ({open:?}), got {max_open:?}"),
            ));
        }
        if !(0.0..1.0).contains(&open_jitter) {
            return Err(PolicyError::new(
                "open_jitter",
                format!("must be in [0, 1), got {open_jitter}"),
            ));
        }
        if half_open_probes == 0 {
            return Err(PolicyError::new("half_open_probes", "must be at least 1"));
        }
        Ok(BreakerParams {
            enabled,
            consecutive_failures,
            window,
            min_samples,
            failure_rate,
            failure_statuses,
            open,
            max_open,
            open_jitter,
            half_open_probes,
        })
    }
}
