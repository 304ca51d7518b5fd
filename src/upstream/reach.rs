//! How weir reaches each upstream, keyed by upstream name so that it
//! outlives any one config snapshot (docs/reference/endpoints.md#endpoints):
//! its endpoints (with their pools, estimates and ejections), what keeps
//! them current (the resolver), how they are reached (the client: TLS, the
//! HTTP/2 pools), and its held connections' count. A reload that keeps an
//! upstream keeps all of it, with new parameters applied in place, and its
//! warm connections unless how it is reached changed; a new upstream starts
//! fresh. The live policy state (`state`) knows nothing of any of this.

use super::client::UpstreamClient;
use super::resolve::{literal, Resolver};
use super::Endpoints;
use crate::clock::Clock;
use crate::config::{Config, UpstreamConfig};
use crate::metrics::Metrics;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One upstream's endpoints and how they are reached.
#[derive(Debug)]
pub struct UpstreamReach {
    pub name: String,
    /// Its endpoints (docs/reference/endpoints.md): kept across reloads.
    pub endpoints: Arc<Endpoints>,
    client: Mutex<UpstreamClient>,
    /// What keeps the endpoints current, and the config it was made from (a
    /// reload that keeps those keeps the resolver).
    resolver: Mutex<(SourceKey, Arc<Resolver>)>,
    /// Upstream connections held by client connections, all workers
    /// together (`pool::held`).
    pub held_conns: Arc<AtomicUsize>,
    /// TLS failures already logged, so each cause is logged once, not per
    /// request.
    tls_logged: Mutex<HashSet<String>>,
}

/// What an upstream's [`Resolver`] is made from: its entries and
/// `resolve_every`.
type SourceKey = (Vec<(String, u16)>, Duration);

fn source_key(u: &UpstreamConfig) -> SourceKey {
    (u.endpoints.entries.clone(), u.resolve_every)
}

/// Starts keeping `endpoints` current from `key`; names get `weir_dns_*`
/// series, an all-literal source has none.
fn make_resolver(
    name: &str,
    key: &SourceKey,
    metrics: &Metrics,
    endpoints: &Arc<Endpoints>,
) -> Arc<Resolver> {
    let named = key.0.iter().any(|e| literal(e).is_none());
    let dns = if named {
        Some(metrics.dns(name))
    } else {
        metrics.forget_dns(name);
        None
    };
    Resolver::start(name, key.0.clone(), key.1, endpoints, dns)
}

impl UpstreamReach {
    fn new(u: &UpstreamConfig, clock: Clock, metrics: &Metrics, client: UpstreamClient) -> Self {
        let key = source_key(u);
        let endpoints = Endpoints::new(
            &u.name,
            clock,
            u.endpoints.params.clone(),
            client.clone(),
            metrics.endpoints().clone(),
        );
        let resolver = make_resolver(&u.name, &key, metrics, &endpoints);
        UpstreamReach {
            name: u.name.clone(),
            endpoints,
            client: Mutex::new(client),
            resolver: Mutex::new((key, resolver)),
            held_conns: Arc::new(AtomicUsize::new(0)),
            tls_logged: Mutex::new(HashSet::new()),
        }
    }

    /// Applies a reloaded config's parameters in place, and a new client
    /// when how the upstream is reached changed.
    fn update(&self, u: &UpstreamConfig, client: Option<UpstreamClient>, metrics: &Metrics) {
        self.endpoints.set_params(u.endpoints.params.clone());
        if let Some(c) = &client {
            self.endpoints.set_client(c.clone());
        }
        let key = source_key(u);
        let mut resolver = self.resolver.lock().expect("resolver lock poisoned");
        if resolver.0 != key {
            // Endpoints the new source still gives keep their state: the
            // set is published by address.
            resolver.1.stop();
            let made = make_resolver(&u.name, &key, metrics, &self.endpoints);
            *resolver = (key, made);
        }
        drop(resolver);
        if let Some(c) = client {
            *self.client.lock().expect("client lock poisoned") = c;
        }
    }

    /// How the next snapshot's requests reach the upstream.
    pub fn client(&self) -> UpstreamClient {
        self.client.lock().expect("client lock poisoned").clone()
    }

    /// Logs a TLS failure the first time its cause is seen for this upstream.
    pub fn log_tls_failure_once(&self, cause: &str) {
        let mut seen = self.tls_logged.lock().expect("tls log lock poisoned");
        if seen.len() < 64 && seen.insert(cause.to_string()) {
            tracing::warn!(upstream = %self.name, cause, "TLS to the upstream failed (logged once per cause)");
        }
    }
}

/// Every upstream's [`UpstreamReach`], by name.
#[derive(Debug, Default)]
pub struct ReachRegistry {
    clock: Clock,
    by_name: Mutex<HashMap<String, Arc<UpstreamReach>>>,
}

/// What a config changes in the registry, read before anything changes
/// ([`ReachRegistry::plan`]).
#[derive(Debug)]
pub struct ReachPlan(Vec<Change>);

#[derive(Debug)]
enum Change {
    Keep(Arc<UpstreamReach>, Option<UpstreamClient>),
    New(UpstreamClient),
}

impl ReachRegistry {
    pub fn new() -> Self {
        ReachRegistry::default()
    }

    /// What `config` changes, with everything that can fail (reading the
    /// upstreams' TLS files) done: on error nothing is touched.
    pub fn plan(&self, config: &Config, metrics: &Metrics) -> Result<ReachPlan, String> {
        let map = self.by_name.lock().expect("reach registry lock poisoned");
        let mut plan = Vec::with_capacity(config.upstreams.len());
        for u in &config.upstreams {
            plan.push(match map.get(&u.name) {
                Some(r) if r.client().key == UpstreamClient::key_of(u)? => {
                    Change::Keep(r.clone(), None)
                }
                Some(r) => {
                    let client = UpstreamClient::new(u, metrics.wire(&u.name))?;
                    Change::Keep(r.clone(), Some(client))
                }
                None => Change::New(UpstreamClient::new(u, metrics.wire(&u.name))?),
            });
        }
        Ok(ReachPlan(plan))
    }

    /// Applies `plan` (made from `config`): each of its upstreams' reach,
    /// in the same order; those of removed upstreams are forgotten here
    /// (requests in flight still hold them until they finish).
    pub fn apply(
        &self,
        plan: ReachPlan,
        config: &Config,
        metrics: &Metrics,
    ) -> Vec<Arc<UpstreamReach>> {
        let out: Vec<Arc<UpstreamReach>> = config
            .upstreams
            .iter()
            .zip(plan.0)
            .map(|(u, change)| match change {
                Change::Keep(r, client) => {
                    r.update(u, client, metrics);
                    r
                }
                Change::New(client) => Arc::new(UpstreamReach::new(u, self.clock, metrics, client)),
            })
            .collect();
        let mut map = self.by_name.lock().expect("reach registry lock poisoned");
        map.clear();
        for r in &out {
            map.insert(r.name.clone(), r.clone());
        }
        out
    }
}
