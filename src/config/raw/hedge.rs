//! `[upstreams.NAME.hedge]` / `[defaults.hedge]`, its raw form and the
//! defaults of a table that is present.

use serde::{Deserialize, Serialize};

/// `[….hedge]`: hedged requests (docs/reference/hedging.md#hedging).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHedge {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// A duration (`"20ms"`) or a percentile (`"p95"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_extra: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hedges: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyed_writes: Option<bool>,
}
mergeable!(RawHedge { enabled, after, max_extra, max_hedges, keyed_writes } nested {});

impl RawHedge {
    /// Defaults for the fields of a `hedge` table that is present.
    pub fn builtin() -> RawHedge {
        RawHedge {
            enabled: Some(true),
            after: Some("p95".into()),
            max_extra: Some(0.05),
            max_hedges: Some(1),
            keyed_writes: Some(false),
        }
    }
}
