//! `[upstreams.NAME.throttle]` / `[defaults.throttle]`, its raw form:
//! client-side throttling (docs/reference/admission.md#client-side-throttling).

use super::super::duration::Dur;
use serde::{Deserialize, Serialize};

/// `[….throttle]`: refuse locally what an upstream that sheds load would
/// refuse anyway.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawThrottle {
    /// Off by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Requests still sent per accepted one (the SRE book's K).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    /// How far back requests and accepts are counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<Dur>,
    /// The highest probability a request is refused with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_reject: Option<f64>,
    /// Requests the window must hold before anything is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_requests: Option<u32>,
}
mergeable!(RawThrottle { enabled, multiplier, window, max_reject, min_requests } nested {});
