//! `[upstreams.NAME.cache]` / `[defaults.cache]`, its raw form.

use super::Dur;
use serde::{Deserialize, Serialize};

/// `[….cache]`: the response cache (docs/reference/cache.md#response-cache).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCache {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_object_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_ttl: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_while_revalidate: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_if_error: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_set_cookie: Option<bool>,
}
mergeable!(RawCache { enabled, max_bytes, max_object_bytes, default_ttl, stale_while_revalidate, stale_if_error, store_set_cookie } nested {});
