//! Where the fast path and held connections connect (docs/behaviour.md#upstream):
//! an upstream URL's IP literal, or the addresses its DNS name resolves to.
//!
//! A name is resolved off the request path: a task per upstream asks the
//! system resolver (`getaddrinfo`, on tokio's blocking pool) at start and
//! then every `resolve_every`, and publishes the addresses; new connections
//! take them in turn (round robin). A failed or empty resolution keeps the
//! last good addresses, is logged once until resolution works again, and is
//! counted (`weir_dns_resolutions_total{result="error"}`). Until the first
//! resolution has answered, requests take the general path, whose client
//! resolves for itself.

use arc_swap::ArcSwap;
use prometheus::{IntCounter, IntGauge};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// An upstream name's resolution counters (`weir_dns_*`, made by
/// `Metrics::dns`).
#[derive(Debug, Clone)]
pub struct DnsMetrics {
    pub(crate) ok: IntCounter,
    pub(crate) error: IntCounter,
    pub(crate) addresses: IntGauge,
}

impl DnsMetrics {
    /// One resolution: whether it answered, and the addresses in use after it.
    pub fn resolved(&self, ok: bool, addresses: usize) {
        if ok { &self.ok } else { &self.error }.inc();
        self.addresses.set(addresses as i64);
    }
}

/// How long one resolution may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// An upstream's address for connections weir makes itself.
#[derive(Debug, Clone)]
pub enum Direct {
    /// The URL's host is an IP address.
    Fixed(SocketAddr),
    /// The URL's host is a name, resolved in the background.
    Named(Arc<Resolved>),
}

impl Direct {
    /// Whether there is an address to connect to now.
    pub fn ready(&self) -> bool {
        match self {
            Direct::Fixed(_) => true,
            Direct::Named(r) => !r.addrs.load().is_empty(),
        }
    }

    /// The address for a new connection: the next in turn.
    pub fn next(&self) -> Option<SocketAddr> {
        match self {
            Direct::Fixed(a) => Some(*a),
            Direct::Named(r) => {
                let addrs = r.addrs.load();
                let i = r.turn.fetch_add(1, Ordering::Relaxed);
                addrs.get(i % addrs.len().max(1)).copied()
            }
        }
    }

    /// How many addresses a new connection may try: when one refuses, the
    /// next in turn is tried (a name for `::1` and `127.0.0.1` whose server
    /// listens on one of them), as a resolver-per-connection client would.
    pub fn tries(&self) -> usize {
        match self {
            Direct::Fixed(_) => 1,
            Direct::Named(r) => r.addrs.load().len().clamp(1, 8),
        }
    }

    /// Whether an idle connection to `addr` may serve this upstream: its
    /// address is still one the name resolves to.
    pub fn has(&self, addr: SocketAddr) -> bool {
        match self {
            Direct::Fixed(a) => *a == addr,
            Direct::Named(r) => r.addrs.load().contains(&addr),
        }
    }
}

/// A name's current addresses.
#[derive(Debug)]
pub struct Resolved {
    host: String,
    port: u16,
    addrs: ArcSwap<Vec<SocketAddr>>,
    turn: AtomicUsize,
    /// Set while resolution fails, so the failure is logged once.
    failing: AtomicBool,
}

impl Resolved {
    /// Starts resolving `host:port` every `every` on the current runtime,
    /// until the returned value is dropped; `known` are addresses to use
    /// until the first answer (a reload that changed only `resolve_every`).
    pub fn start(
        upstream: &str,
        host: &str,
        port: u16,
        every: Duration,
        metrics: DnsMetrics,
        known: Arc<Vec<SocketAddr>>,
    ) -> Arc<Resolved> {
        let r = Arc::new(Resolved {
            host: host.to_string(),
            port,
            addrs: ArcSwap::new(known),
            turn: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(refresh(
                Arc::downgrade(&r),
                upstream.to_string(),
                every,
                metrics,
            ));
        }
        r
    }

    /// The addresses now.
    pub fn addrs(&self) -> Arc<Vec<SocketAddr>> {
        self.addrs.load_full()
    }

    /// Asks the resolver once; publishes what it answers. `Err` keeps the
    /// last good addresses.
    async fn resolve(&self) -> Result<usize, String> {
        // A resolver that does not answer is a failure, not a stuck task.
        let lookup = tokio::net::lookup_host((self.host.as_str(), self.port));
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
            .await
            .map_err(|_| format!("no answer within {}s", LOOKUP_TIMEOUT.as_secs()))?
            .map_err(|e| e.to_string())?;
        let mut addrs: Vec<SocketAddr> = Vec::new();
        for a in found {
            if !addrs.contains(&a) {
                addrs.push(a);
            }
        }
        if addrs.is_empty() {
            return Err("no address".into());
        }
        let n = addrs.len();
        if **self.addrs.load() != addrs {
            self.addrs.store(Arc::new(addrs));
        }
        Ok(n)
    }
}

async fn refresh(r: Weak<Resolved>, upstream: String, every: Duration, metrics: DnsMetrics) {
    loop {
        let Some(r) = r.upgrade() else {
            return;
        };
        match r.resolve().await {
            Ok(n) => {
                metrics.resolved(true, n);
                if r.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(%upstream, host = %r.host, addresses = n, "DNS resolution works again");
                }
            }
            Err(e) => {
                metrics.resolved(false, r.addrs.load().len());
                if !r.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        %upstream,
                        host = %r.host,
                        error = %e,
                        kept = r.addrs.load().len(),
                        "DNS resolution failed; keeping the last good addresses (logged once until it works again)"
                    );
                }
            }
        }
        drop(r);
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_connections_take_the_addresses_in_turn() {
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap_or_else(|_| panic!("addr"));
        let b: SocketAddr = "10.0.0.2:80".parse().unwrap_or_else(|_| panic!("addr"));
        let r = Arc::new(Resolved {
            host: "svc".into(),
            port: 80,
            addrs: ArcSwap::from_pointee(Vec::new()),
            turn: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
        });
        let d = Direct::Named(r.clone());
        assert!(!d.ready());
        assert_eq!(d.next(), None);
        r.addrs.store(Arc::new(vec![a, b]));
        assert!(d.ready() && d.has(a) && d.has(b));
        let picks: Vec<_> = (0..4).filter_map(|_| d.next()).collect();
        assert_eq!(picks.len(), 4);
        assert!(picks[0] != picks[1] && picks[0] == picks[2] && picks[1] == picks[3]);
        assert_eq!(d.tries(), 2);
        r.addrs.store(Arc::new(vec![b]));
        assert!(!d.has(a));
        assert_eq!(Direct::Fixed(a).next(), Some(a));
    }
}
