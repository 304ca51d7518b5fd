//! `[state]`, validated: where the state a fleet of weirs shares is kept
//! and what a keyed write gets when it cannot be relied on
//! (docs/reference/fleet.md#fleet-state).

use std::time::Duration;

/// `[state] backend` (docs/reference/fleet.md#fleet-state).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateBackend {
    /// Every instance keeps its own state (no sharing; every `scope` is the
    /// instance's).
    #[default]
    Memory,
    /// Shared state on a Redis server.
    Redis,
}

/// `[state] on_unavailable`: what a keyed write gets when the shared store
/// cannot be relied on — no primary (Redis down, a failover under way), or
/// its record not acknowledged by `wait_replicas` in `wait_timeout`
/// (docs/reference/fleet.md#when-redis-fails).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnavailable {
    /// Decide with the instance's own store and go ahead; counted and
    /// logged. A repeat through another instance may be delivered again.
    #[default]
    Local,
    /// Refuse the keyed write: 503 `state_unavailable`, `Retry-After: 1`.
    /// Nothing is delivered twice.
    Refuse,
}

/// Where the shared state lives, read off `[state]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisTopology<'a> {
    /// One server (`url`).
    Server(&'a str),
    /// A primary found through Sentinel (`sentinels`, `master_name`).
    Sentinel {
        sentinels: &'a [String],
        master_name: &'a str,
    },
    /// A Redis Cluster (`cluster`, its seed nodes).
    Cluster(&'a [String]),
}

/// `[state]`, validated: where the state a fleet of weirs shares is kept
/// (docs/reference/fleet.md#fleet-state).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateConfig {
    pub backend: StateBackend,
    /// The Redis URL as written (`redis://` or `rediss://`), credentials
    /// included; checked whenever it is set. With `redis`, exactly one of
    /// `url`, `sentinels` and `cluster` is set.
    pub url: Option<String>,
    /// Sentinel URLs (each with its own credentials, if any).
    pub sentinels: Vec<String>,
    /// The primary's name at the Sentinels; set exactly with `sentinels`.
    pub master_name: Option<String>,
    /// A Cluster's seed node URLs.
    pub cluster: Vec<String>,
    /// The primary's ACL user and password and database, with `sentinels`.
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: u16,
    /// Every key weir writes starts with this (default `weir:`).
    pub key_prefix: String,
    /// The longest one call to the backend may take (default 5 ms); past it
    /// the caller decides with local state.
    pub timeout: Duration,
    /// How often the shared breaker state is read (default 1 s).
    pub refresh: Duration,
    /// Replicas that acknowledge a keyed write's claim and record before
    /// weir relies on them (default 0: none asked).
    pub wait_replicas: u8,
    /// How long those acknowledgements may take (default 50 ms).
    pub wait_timeout: Duration,
    /// A keyed write when the store cannot be relied on (default `local`).
    pub on_unavailable: OnUnavailable,
}

impl StateConfig {
    /// The Redis URL when the backend is one Redis server.
    pub fn redis_url(&self) -> Option<&str> {
        match self.topology()? {
            RedisTopology::Server(url) => Some(url),
            _ => None,
        }
    }

    /// Where the shared state lives; `None` with `backend = "memory"`.
    pub fn topology(&self) -> Option<RedisTopology<'_>> {
        if self.backend != StateBackend::Redis {
            return None;
        }
        if let Some(url) = &self.url {
            return Some(RedisTopology::Server(url));
        }
        if let Some(master_name) = &self.master_name {
            return Some(RedisTopology::Sentinel {
                sentinels: &self.sentinels,
                master_name,
            });
        }
        (!self.cluster.is_empty()).then_some(RedisTopology::Cluster(&self.cluster))
    }
}

/// `url` with any password in it replaced by `***`, for logs, `/readyz`
/// and the effective config.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}
