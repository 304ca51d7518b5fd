//! `[upstreams.NAME.ejection]`, its raw form and built-in defaults.

use super::Dur;
use serde::{Deserialize, Serialize};

/// `[upstreams.NAME.ejection]` (docs/reference/endpoints.md#ejection).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawEjection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_share_above: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_samples: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ejected: Option<f64>,
}
mergeable!(RawEjection { consecutive_failures, failure_share_above, min_samples, base, max, max_ejected } nested {});

impl RawEjection {
    /// The built-in ejection defaults, with their reasons in docs/reference/endpoints.md#ejection.
    pub fn builtin() -> Self {
        use std::time::Duration as D;
        RawEjection {
            consecutive_failures: Some(5),
            failure_share_above: Some(0.3),
            min_samples: Some(20),
            base: Some(Dur(D::from_secs(5))),
            max: Some(Dur(D::from_secs(60))),
            max_ejected: Some(0.5),
        }
    }
}
