//! The data plane: listeners and connections, routing, the request path,
//! the upstream client, weir's own error responses and header hygiene.
//!
//! A connection task serves requests with the config snapshot current when
//! each request arrives; a request keeps its snapshot to the end, so a reload
//! never changes the rules under a request in flight.

pub(crate) mod access;
pub(crate) mod attempt;
pub(crate) mod body;
pub mod cached;
pub(crate) mod error;
pub mod fast;
pub(crate) mod general;
pub(crate) mod headers;
pub(crate) mod idempotent;
pub(crate) mod listen_unix;
pub(crate) mod order;
pub(crate) mod replay;
pub mod request;
pub(crate) mod route;
mod server;
pub(crate) mod traced;
pub(crate) mod upload;

/// The largest upstream response head weir reads, on either path; a larger
/// one is a `bad_response` (502), not retried.
pub use crate::upstream::client::MAX_RESPONSE_HEAD;

pub use server::{Proxy, ProxyHandle};

use crate::config::{Config, Protocol, Scheme, UpstreamConfig};
use crate::state::UpstreamState;
use std::sync::Arc;

/// Which listener a connection arrived on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ListenerRole {
    /// The shared listener: routed by Host and path.
    Shared,
    /// An upstream's dedicated listener: everything goes to that upstream.
    Dedicated(String),
}

impl std::fmt::Display for ListenerRole {
    /// `shared`, or `upstream NAME` for a dedicated listener (log fields).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenerRole::Shared => f.write_str("shared"),
            ListenerRole::Dedicated(name) => write!(f, "upstream {name}"),
        }
    }
}

/// An upstream as one snapshot sees it: its config and its live state.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub config: Arc<UpstreamConfig>,
    pub state: Arc<UpstreamState>,
    /// The upstream's endpoints (`crate::upstream`): every attempt, on
    /// either path, is sent to one they pick.
    pub endpoints: Arc<crate::upstream::Endpoints>,
    /// weir speaks HTTP/1.1 to it on connections of its own (cleartext
    /// `auto`/`http1`, or TLS pinned to `http1`): the fast path and held
    /// connections apply.
    pub own_h1: bool,
    /// How it is reached, copied from its reach when the snapshot is made.
    pub client: crate::upstream::client::UpstreamClient,
    /// Its endpoints and connections, kept across reloads.
    pub reach: Arc<crate::upstream::reach::UpstreamReach>,
    /// Precomputed per snapshot so the hot path does no string work.
    pub scheme: http::uri::Scheme,
    /// The `Host` sent upstream (unless `preserve_host`).
    pub host: http::HeaderValue,
    pub h2: bool,
}

/// Everything a request needs, published atomically on every (re)load.
impl Upstream {
    /// What the upstream layer's checkout needs of this upstream, for an
    /// attempt on either path (`upstream::checkout`).
    pub(crate) fn checkout(&self) -> crate::upstream::checkout::CheckoutFor<'_> {
        crate::upstream::checkout::CheckoutFor {
            endpoints: &self.endpoints,
            reach: &self.reach,
            client: &self.client,
            own_h1: self.own_h1,
            connect_timeout: self.config.connect_timeout,
            meter: &self.state.metrics.wire,
        }
    }

    /// Sets the gauges that describe the upstream's state and endpoints;
    /// called when `/metrics` is scraped.
    pub fn refresh_gauges(&self) {
        self.state.refresh_gauges();
        self.endpoints.refresh_gauges();
    }
}

#[derive(Debug)]
pub struct Snapshot {
    pub config: Arc<Config>,
    /// Inbound TLS per listener that has it.
    pub acceptors: std::collections::BTreeMap<ListenerRole, Arc<rustls::ServerConfig>>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub routes: route::RouteTable,
    /// Same order as `config.upstreams`.
    pub upstreams: Vec<Upstream>,
    /// `[tracing]`: off until the server sets it (`trace::Registry`).
    pub tracer: crate::trace::Tracer,
}

impl Snapshot {
    /// Builds a snapshot; reads inbound TLS certificates and keys.
    /// `states` and `reaches`: each upstream's live state and reach, in
    /// the config's order.
    pub fn build(
        config: Arc<Config>,
        states: Vec<Arc<UpstreamState>>,
        reaches: Vec<Arc<crate::upstream::reach::UpstreamReach>>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Result<Self, String> {
        let mut acceptors = std::collections::BTreeMap::new();
        if let Some(t) = &config.server.tls {
            let c = crate::tls::server_config(t).map_err(|e| format!("[server] tls: {e}"))?;
            acceptors.insert(ListenerRole::Shared, c);
        }
        for u in &config.upstreams {
            if let Some(t) = &u.listen_tls {
                let c = crate::tls::server_config(t)
                    .map_err(|e| format!("upstream {:?} listen_tls: {e}", u.name))?;
                acceptors.insert(ListenerRole::Dedicated(u.name.clone()), c);
            }
        }
        let upstreams = config
            .upstreams
            .iter()
            .zip(states)
            .zip(reaches)
            .map(|((c, s), r)| Upstream {
                scheme: match c.url.scheme {
                    Scheme::Http => http::uri::Scheme::HTTP,
                    Scheme::Https => http::uri::Scheme::HTTPS,
                },
                h2: matches!(c.protocol, Protocol::H2c | Protocol::Grpc),
                host: http::HeaderValue::from_str(c.url.authority.as_str())
                    .unwrap_or_else(|_| http::HeaderValue::from_static("localhost")),
                endpoints: r.endpoints.clone(),
                own_h1: matches!(
                    (c.url.scheme, c.protocol),
                    (Scheme::Http, Protocol::Auto | Protocol::Http1)
                        | (Scheme::Https, Protocol::Http1)
                ),
                config: c.clone(),
                client: r.client(),
                reach: r,
                state: s,
            })
            .collect();
        Ok(Snapshot {
            metrics,
            acceptors,
            routes: route::RouteTable::new(&config),
            config,
            upstreams,
            tracer: crate::trace::Tracer::off(),
        })
    }
}
