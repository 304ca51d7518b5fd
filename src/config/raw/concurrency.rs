//! `[upstreams.NAME.concurrency]` / `[defaults.concurrency]`, its raw form:
//! the fixed limit and the adaptive one (docs/reference/admission.md#adaptive-limit).

use super::super::duration::Dur;
use serde::{Deserialize, Serialize};

/// `[….concurrency]`: how many requests may be in flight to the upstream.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConcurrency {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queue: Option<u32>,
    /// `"fixed"` (default: `max_in_flight`) or `"adaptive"`: the limit
    /// follows the upstream's latency, `max_in_flight` its ceiling
    /// (docs/reference/admission.md#adaptive-limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// The adaptive limit's floor (≥ 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_limit: Option<u32>,
    /// Where the adaptive limit starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_limit: Option<u32>,
    /// How far latency may rise above its no-load level before the
    /// adaptive limit shrinks (0.25 = 25 %).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_tolerance: Option<f64>,
    /// How long answers are gathered before the adaptive limit moves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<Dur>,
    /// How often the no-load latency is measured again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recheck: Option<Dur>,
}
mergeable!(RawConcurrency { max_in_flight, max_queue, limit, min_limit, initial_limit, latency_tolerance, window, recheck } nested {});
