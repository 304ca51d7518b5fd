//! Idle upstream connections of the fast path, one pool per accept loop (so
//! per worker runtime: a socket is only ever used on the runtime whose I/O
//! driver it is registered with).
//!
//! A request takes a connection for its exchange and gives it back when the
//! response body has been read to its end, so the number of upstream
//! connections follows the number of requests in flight, not the number of
//! client connections. The newest idle connection is taken first, which
//! keeps few connections warm and lets the rest age out.

use crate::proxy::resolve::Direct;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Idle connections kept per pool; more are closed.
pub(crate) const MAX_IDLE: usize = 1024;

/// An idle connection older than this is closed rather than used: the
/// upstream may be about to close it (hyper's pool uses the same figure).
pub(crate) const IDLE_FOR: Duration = Duration::from_secs(90);

#[derive(Debug)]
struct Idle {
    addr: SocketAddr,
    stream: TcpStream,
    since: Instant,
}

/// A pool of idle HTTP/1.1 connections to cleartext upstreams.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    idle: Mutex<Vec<Idle>>,
}

impl Pool {
    /// The newest idle connection to one of `direct`'s addresses that is
    /// still open, and its address.
    pub(crate) fn take_for(
        &self,
        direct: &Direct,
        now: Instant,
    ) -> Option<(SocketAddr, TcpStream)> {
        let mut idle = self.idle.lock().ok()?;
        while let Some(at) = idle.iter().rposition(|i| direct.has(i.addr)) {
            let i = idle.remove(at);
            if now.saturating_duration_since(i.since) < IDLE_FOR && still_open(&i.stream) {
                return Some((i.addr, i.stream));
            }
        }
        None
    }

    /// Keeps `stream` for the next request to `addr`. Connections idle
    /// for `IDLE_FOR` are closed on the way, and when `MAX_IDLE` are
    /// held the oldest makes room: connections to an upstream nobody asks
    /// for any more cannot crowd out those of one in use.
    pub(crate) fn put(&self, addr: SocketAddr, stream: TcpStream, now: Instant) {
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
            stream,
            since: now,
        });
    }

    /// Closes idle connections that aged past `IDLE_FOR` or that the
    /// upstream closed, so a burst's leftovers do not linger (half-closed)
    /// after the traffic that needed them is gone.
    pub(crate) fn reap(&self, now: Instant) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.retain(|i| {
                now.saturating_duration_since(i.since) < IDLE_FOR && still_open(&i.stream)
            });
        }
    }

    /// Reaps `pool` every `IDLE_FOR` / 3 for as long as it exists.
    pub(crate) async fn reaper(pool: std::sync::Weak<Pool>) {
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

/// Whether an idle connection is still open, without a system call in the
/// common case: nothing has been seen on it since its last read, so the
/// runtime reports it not readable. When it is readable, a read tells: the
/// upstream closed it, or sent bytes nobody asked for — either way it is
/// not used again.
fn still_open(stream: &TcpStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    match stream.poll_read_ready(&mut cx) {
        Poll::Pending => true,
        Poll::Ready(Err(_)) => false,
        Poll::Ready(Ok(())) => {
            let mut byte = [0u8; 1];
            matches!(stream.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        }
    }
}
