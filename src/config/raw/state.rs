//! `[state]`, its raw form: where the state a fleet of weirs shares is kept
//! (docs/reference/fleet.md#fleet-state).

use super::super::duration::Dur;
use super::super::{OnUnavailable, StateBackend};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[state]`: the backend of the state a fleet of weirs shares.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawState {
    /// `memory` (default: each instance alone) or `redis`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<StateBackend>,
    /// One Redis server: `redis://host:port/db` or `rediss://…` (TLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Sentinels that know the primary named `master_name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinels: Option<Vec<String>>,
    /// The name the Sentinels know the primary by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master_name: Option<String>,
    /// Seed nodes of a Redis Cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Vec<String>>,
    /// With `sentinels`: the primary's ACL user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// With `sentinels`: the primary's password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// With `sentinels`: the primary's database number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub db: Option<u16>,
    /// Every key weir writes starts with this. Default `weir:`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// The longest one call to the backend may take. Default 5ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Dur>,
    /// How often shared breaker state is read. Default 1s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh: Option<Dur>,
    /// Replicas that acknowledge a keyed write's record before weir relies
    /// on it. Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_replicas: Option<u8>,
    /// How long weir waits for those acknowledgements. Default 50ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_timeout: Option<Dur>,
    /// A keyed write when the store cannot be relied on: `local` or `refuse`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_unavailable: Option<OnUnavailable>,
}
mergeable!(RawState { backend, url, sentinels, master_name, cluster, username, password, db, key_prefix, timeout, refresh, wait_replicas, wait_timeout, on_unavailable } nested {});

impl RawState {
    pub fn builtin() -> Self {
        RawState {
            backend: Some(StateBackend::Memory),
            key_prefix: Some("weir:".into()),
            timeout: Some(Dur(Duration::from_millis(5))),
            refresh: Some(Dur(Duration::from_secs(1))),
            wait_replicas: Some(0),
            wait_timeout: Some(Dur(Duration::from_millis(50))),
            on_unavailable: Some(OnUnavailable::Local),
            ..RawState::default()
        }
    }
}
