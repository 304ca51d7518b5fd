//! Live per-upstream state, keyed by upstream name so that it outlives any one
//! config snapshot: a reload that keeps an upstream keeps its state (and warm
//! connections); a new upstream starts fresh; a removed one is dropped when
//! the last snapshot (and so the last request) holding it goes away.

use crate::config::{Config, UpstreamConfig};
use crate::proxy::client::{ClientKey, UpstreamClient};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What lives between requests for one upstream.
#[derive(Debug)]
pub struct UpstreamState {
    pub name: String,
    pub client: UpstreamClient,
}

impl UpstreamState {
    fn new(u: &UpstreamConfig) -> Self {
        UpstreamState {
            name: u.name.clone(),
            client: UpstreamClient::new(u),
        }
    }
}

/// All upstreams' live state, by name.
#[derive(Debug, Default)]
pub struct StateRegistry {
    by_name: Mutex<HashMap<String, Arc<UpstreamState>>>,
}

impl StateRegistry {
    /// The state for each of `config`'s upstreams, in the same order: reused
    /// by name where the connection parameters are unchanged, created where
    /// new. Entries for removed upstreams are forgotten here; in-flight
    /// requests still hold them until they finish.
    pub fn sync(&self, config: &Config) -> Vec<Arc<UpstreamState>> {
        let mut map = self.by_name.lock().expect("state registry lock poisoned");
        let out: Vec<Arc<UpstreamState>> = config
            .upstreams
            .iter()
            .map(|u| {
                let reuse = map
                    .get(&u.name)
                    .filter(|s| s.client.key == ClientKey::of(u))
                    .cloned();
                reuse.unwrap_or_else(|| Arc::new(UpstreamState::new(u)))
            })
            .collect();
        map.clear();
        for s in &out {
            map.insert(s.name.clone(), s.clone());
        }
        out
    }
}
