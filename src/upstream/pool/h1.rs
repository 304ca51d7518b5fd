//! Idle HTTP/1.1 upstream connections, by endpoint and TLS, one pool per
//! accept loop (so per worker runtime: a socket is only ever used on the
//! runtime whose I/O driver it is registered with). Both data paths take
//! from it (what they open is `pool::open`'s): the fast
//! path for one exchange, the general path for a lease
//! ([`super::lease`]).
//!
//! A request takes a connection for its exchange and gives it back when the
//! response body has been read to its end, so the number of upstream
//! connections follows the number of requests in flight, not the number of
//! client connections. The newest idle connection is taken first, which
//! keeps few connections warm and lets the rest age out.

use super::io::UpstreamIo;
use crate::upstream::Address;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Idle connections kept per pool; more are closed.
pub(crate) const MAX_IDLE: usize = 1024;

/// An idle connection older than this is closed rather than used: the
/// upstream may be about to close it (hyper's pool uses the same figure).
pub(crate) const IDLE_FOR: Duration = Duration::from_secs(90);

#[derive(Debug)]
struct Idle {
    addr: Address,
    /// 0 for cleartext; a TLS connection's configuration (`FastTls::tag`).
    tag: u64,
    stream: UpstreamIo,
    since: Instant,
}

/// A pool of idle HTTP/1.1 connections to upstreams, cleartext or TLS.
#[derive(Debug, Default)]
pub(crate) struct H1Pool {
    idle: Mutex<Vec<Idle>>,
}

impl H1Pool {
    /// The newest idle connection to the endpoint at `addr`, made with
    /// `tag`'s TLS (0: cleartext), that is still open.
    pub(crate) fn take(&self, addr: Address, tag: u64, now: Instant) -> Option<UpstreamIo> {
        let mut idle = self.idle.lock().ok()?;
        while let Some(at) = idle.iter().rposition(|i| i.tag == tag && i.addr == addr) {
            let mut i = idle.remove(at);
            if now.saturating_duration_since(i.since) < IDLE_FOR && i.stream.still_open() {
                return Some(i.stream);
            }
        }
        None
    }

    /// Keeps `stream` for the next request to `addr`. Connections idle
    /// for `IDLE_FOR` are closed on the way, and when `MAX_IDLE` are
    /// held the oldest makes room: connections to an upstream nobody asks
    /// for any more cannot crowd out those of one in use.
    pub(crate) fn put(&self, addr: Address, tag: u64, stream: UpstreamIo, now: Instant) {
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        // Oldest first: connections are pushed as they become idle.
        let stale = idle
            .iter()
            .take_while(|i| now.saturating_duration_since(i.since) >= IDLE_FOR)
            .count();
        let over = (idle.len() - stale + 1).saturating_sub(MAX_IDLE);
        idle.drain(..stale + over);
        idle.push(Idle {
            addr,
            tag,
            stream,
            since: now,
        });
    }

    /// Closes idle connections that aged past `IDLE_FOR` or that the
    /// upstream closed, so a burst's leftovers do not linger (half-closed)
    /// after the traffic that needed them is gone.
    pub(crate) fn reap(&self, now: Instant) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.retain_mut(|i| {
                now.saturating_duration_since(i.since) < IDLE_FOR && i.stream.still_open()
            });
        }
    }

    /// Reaps `pool` every `IDLE_FOR` / 3 for as long as it exists.
    pub(crate) async fn reaper(pool: std::sync::Weak<H1Pool>) {
        let mut tick = tokio::time::interval(IDLE_FOR / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match pool.upgrade() {
                Some(p) => p.reap(Instant::now()),
                None => return,
            }
        }
    }
}
