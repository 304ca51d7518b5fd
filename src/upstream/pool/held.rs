//! Held upstream connections, on the general path to an upstream weir
//! speaks HTTP/1.1 to on connections of its own: each client connection
//! keeps the lease ([`super::lease`]) it used last, per endpoint, and sends
//! its next request on it, without a checkout in between. When the client
//! connection ends, its leases go back to the worker's pool
//! ([`super::h1`]).
//!
//! An HTTP/1.1 client connection carries one request at a time, so the
//! upstream connection it holds is free again by the time the next request
//! arrives. Measured (bench/RESULTS.md#how-it-got-there), a checkout per
//! request — a lock, a spawned task per response — was a large share of
//! weir's CPU per request. A held connection still busy (an HTTP/2 client's
//! concurrent streams) or one over [`MAX_HELD`] is a lease for one request.

use super::h1::H1Pool;
use super::lease::H1Lease;
use crate::upstream::Address;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What one client connection holds: a lease per endpoint it used lately,
/// at most [`HELD_PER_CLIENT`], and the worker's pool its leases come from.
#[derive(Debug)]
pub(crate) struct ConnCtx {
    pool: Arc<H1Pool>,
    held: Mutex<Vec<HeldConn>>,
}

/// Endpoints one client connection keeps a connection to: with several
/// replicas, each request may go to another, and a connection dropped on
/// every change of endpoint would be a new connection per request.
const HELD_PER_CLIENT: usize = 4;

#[derive(Debug)]
struct HeldConn {
    /// Which upstream (by identity of its live state) the connection goes to.
    upstream: usize,
    /// Which of its endpoints.
    addr: Address,
    lease: H1Lease,
    place: Place,
}

/// One of an upstream's [`MAX_HELD`] places for a held connection, given
/// back when dropped.
#[derive(Debug)]
pub(crate) struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Held connections per upstream, all workers together. Beyond this,
/// requests take a lease for one request: an application with thousands of
/// connections must not get thousands of upstream connections (measured:
/// ~70 KiB of memory each, and an upstream that did not ask for them).
pub(crate) const MAX_HELD: usize = 128;

/// Takes one of the [`MAX_HELD`] places in `live`, if one is free.
pub(crate) fn reserve(live: &Arc<AtomicUsize>) -> Option<Place> {
    if live.fetch_add(1, Ordering::AcqRel) < MAX_HELD {
        Some(Place(live.clone()))
    } else {
        live.fetch_sub(1, Ordering::AcqRel);
        None
    }
}

impl ConnCtx {
    /// A client connection's, its leases from `pool` (its worker's).
    pub(crate) fn new(pool: Arc<H1Pool>) -> Self {
        ConnCtx {
            pool,
            held: Mutex::default(),
        }
    }

    /// The pool this client connection's leases come from.
    pub(crate) fn pool(&self) -> &Arc<H1Pool> {
        &self.pool
    }

    /// The held lease to `upstream`'s endpoint at `addr`, if it is there
    /// and free (a busy one stays held; the caller takes another).
    pub(crate) fn take(&self, upstream: usize, addr: Address) -> Option<(H1Lease, Place)> {
        let mut held = self.held.lock().ok()?;
        held.retain(|h| !h.lease.is_closed());
        let at = held
            .iter()
            .position(|h| h.upstream == upstream && h.addr == addr && h.lease.is_ready())?;
        let h = held.swap_remove(at);
        Some((h.lease, h.place))
    }

    /// Keeps `lease` for this client connection's next request to `addr`
    /// (the oldest held one makes room, and goes back to the pool).
    pub(crate) fn keep(&self, upstream: usize, addr: Address, lease: H1Lease, place: Place) {
        if let Ok(mut held) = self.held.lock() {
            if held.len() >= HELD_PER_CLIENT {
                held.remove(0);
            }
            held.push(HeldConn {
                upstream,
                addr,
                lease,
                place,
            });
        }
    }
}
