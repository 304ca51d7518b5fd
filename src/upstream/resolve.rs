//! Where an upstream's endpoints come from (docs/reference/endpoints.md#endpoints):
//! the `url`'s host, or each entry of a static `endpoints` list. An IP
//! literal is an endpoint as it is; a name is resolved off the request
//! path: a task per upstream asks the system resolver (`getaddrinfo`, on
//! tokio's blocking pool) at start and then every `resolve_every`, and
//! publishes every address found to [`Endpoints`]. A failed or empty
//! resolution keeps the last good addresses, is logged once until
//! resolution works again, and is counted
//! (`weir_dns_resolutions_total{result="error"}`). Until the first
//! resolution has answered there is no endpoint: an attempt waits for it
//! (within `connect_timeout`; the fast path hands such a request to the
//! general path), and one that fails is tried again every second until
//! one answers.

use super::Address;
use super::Endpoints;
use crate::metrics::DnsMetrics;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How soon a name that has never resolved is asked again.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// How long one resolution may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// One source of endpoints: a host (IP literal or name) and a port, or
/// `unix:/path` with port 0 (a Unix-domain socket).
pub type HostPort = (String, u16);

/// The literal address of an entry whose host is an IP or a socket path.
pub fn literal((host, port): &HostPort) -> Option<Address> {
    if let Some(path) = host.strip_prefix("unix:") {
        return Some(Address::unix(std::path::Path::new(path)));
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>()
        .ok()
        .map(|ip| Address::Tcp(SocketAddr::new(ip, *port)))
}

/// Keeps an upstream's endpoints current while it lives; dropping it stops
/// the resolving task.
#[derive(Debug)]
pub struct Resolver {
    entries: Vec<HostPort>,
    /// Set while resolution fails, so the failure is logged once.
    failing: AtomicBool,
    /// Set when a reload replaced it: a resolution still in flight must
    /// not publish its (old) addresses over the new source's.
    stopped: AtomicBool,
}

impl Resolver {
    /// Publishes the literal entries now and, when there are names, starts
    /// resolving them every `every` on the current runtime.
    pub fn start(
        upstream: &str,
        entries: Vec<HostPort>,
        every: Duration,
        endpoints: &Arc<Endpoints>,
        dns: Option<DnsMetrics>,
    ) -> Arc<Resolver> {
        let r = Arc::new(Resolver {
            entries,
            failing: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let literals: Vec<Address> = r.entries.iter().filter_map(literal).collect();
        if literals.len() == r.entries.len() {
            endpoints.publish(&literals);
        } else if let (Ok(rt), Some(dns)) = (tokio::runtime::Handle::try_current(), dns) {
            rt.spawn(refresh(
                Arc::downgrade(&r),
                Arc::downgrade(endpoints),
                upstream.to_string(),
                every,
                dns,
            ));
        }
        r
    }

    /// Stops it: nothing it resolves from now on is published.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Asks the resolver once for every name; the addresses of every entry
    /// in order, without repeats. `Err` when a name failed (the last good
    /// addresses are kept).
    async fn resolve(&self) -> Result<Vec<Address>, String> {
        let mut addrs: Vec<Address> = Vec::new();
        for e in &self.entries {
            if let Some(a) = literal(e) {
                if !addrs.contains(&a) {
                    addrs.push(a);
                }
                continue;
            }
            // A resolver that does not answer is a failure, not a stuck task.
            let lookup = tokio::net::lookup_host((e.0.as_str(), e.1));
            let found = tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
                .await
                .map_err(|_| format!("{}: no answer within {}s", e.0, LOOKUP_TIMEOUT.as_secs()))?
                .map_err(|err| format!("{}: {err}", e.0))?;
            let before = addrs.len();
            for a in found.map(Address::Tcp) {
                if !addrs.contains(&a) {
                    addrs.push(a);
                }
            }
            if addrs.len() == before {
                return Err(format!("{}: no address", e.0));
            }
        }
        Ok(addrs)
    }
}

/// The first resolution, as the attempts that wait for it see it.
impl Endpoints {
    /// Waits, until `until`, for the upstream's name to resolve the first
    /// time; `Err` says why it has not (its resolution failed, or nothing
    /// answered by `until`). An attempt never resolves for itself: it
    /// takes the endpoints the resolver publishes.
    pub async fn first_resolved(&self, until: tokio::time::Instant) -> Result<(), String> {
        loop {
            let woken = self.first.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.ready() {
                return Ok(());
            }
            if let Some(why) = self.unresolved.lock().ok().and_then(|u| u.clone()) {
                return Err(format!("the upstream's name has not resolved: {why}"));
            }
            if tokio::time::timeout_at(until, woken).await.is_err() {
                return Err("the upstream's name has not resolved yet".into());
            }
        }
    }

    /// A resolution failed: while none has answered, the attempts waiting
    /// for the first endpoint fail with `why`.
    pub fn resolve_failed(&self, why: &str) {
        if self.ready() {
            return;
        }
        if let Ok(mut u) = self.unresolved.lock() {
            *u = Some(why.to_string());
        }
        self.first.notify_waiters();
    }
}

async fn refresh(
    r: Weak<Resolver>,
    endpoints: Weak<Endpoints>,
    upstream: String,
    every: Duration,
    metrics: DnsMetrics,
) {
    loop {
        let (Some(r), Some(endpoints)) = (r.upgrade(), endpoints.upgrade()) else {
            return;
        };
        let resolved = r.resolve().await;
        if r.stopped.load(Ordering::Relaxed) {
            return;
        }
        match resolved {
            Ok(addrs) => {
                endpoints.publish(&addrs);
                let n = endpoints.all().len();
                metrics.resolved(true, n);
                if r.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(%upstream, addresses = n, "DNS resolution works again");
                }
            }
            Err(e) => {
                endpoints.resolve_failed(&e);
                let kept = endpoints.all().len();
                metrics.resolved(false, kept);
                if !r.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        %upstream,
                        error = %e,
                        kept,
                        "DNS resolution failed; keeping the last good addresses (logged once until it works again)"
                    );
                }
            }
        }
        // Never resolved: soon again, since requests wait for it.
        let next = match endpoints.ready() {
            true => every,
            false => every.min(FIRST_RETRY),
        };
        drop((r, endpoints));
        tokio::time::sleep(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_addresses_and_names_are_not() {
        assert_eq!(
            literal(&("10.0.0.1".into(), 80)),
            "10.0.0.1:80".parse().ok()
        );
        assert_eq!(literal(&("[::1]".into(), 8080)), "[::1]:8080".parse().ok());
        assert_eq!(literal(&("svc.local".into(), 80)), None);
    }
}
