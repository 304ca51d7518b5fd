//! Request coalescing's bookkeeping: per key, the one request fetching it
//! now (a fill: a miss or a foreground revalidation) and whether a
//! background refresh is running. The waiting is the data plane's: `W` is
//! whatever it waits on (a `tokio::sync::watch::Receiver`, say), made by
//! the leader and cloned to each follower, so this stays free of tokio.
//!
//! The protocol: a request whose lookup is a miss or a revalidation calls
//! [`FillRegistry::begin_fill`]. The [`Fill::Leader`] goes upstream,
//! stores what may be stored, then calls [`FillRegistry::end_fill`] and
//! signals its `W`. A [`Fill::Follower`] waits on `W`, bounded by its own
//! deadline, then looks the key up again: an entry stored since it began
//! waiting answers it (`x-weir-cache: coalesced`) whatever its freshness —
//! it was fetched for this request; without one (the response was not
//! storable, or its `Vary` does not match this request) it goes upstream
//! itself. A leader that fails or is cancelled must still call `end_fill`
//! (a drop guard), or its followers wait out their deadlines. The registry
//! holds only keys in progress, so it is bounded by the requests in flight.

use std::collections::{HashMap, HashSet};

/// A request's part in fetching a key ([`FillRegistry::begin_fill`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fill<W> {
    /// It goes upstream for the key, and calls `end_fill` when done.
    Leader,
    /// Another request is fetching the key: wait on this, then look up
    /// again.
    Follower(W),
}

/// The fills and background refreshes in progress, by key.
#[derive(Debug)]
pub struct FillRegistry<W> {
    fills: HashMap<Box<str>, W>,
    refreshes: HashSet<Box<str>>,
}

impl<W> Default for FillRegistry<W> {
    fn default() -> Self {
        FillRegistry {
            fills: HashMap::new(),
            refreshes: HashSet::new(),
        }
    }
}

impl<W: Clone> FillRegistry<W> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The leader for `key` if no fill of it is in progress (`waiter` makes
    /// what its followers will wait on), else a follower with a clone of it.
    pub fn begin_fill(&mut self, key: &str, waiter: impl FnOnce() -> W) -> Fill<W> {
        if let Some(w) = self.fills.get(key) {
            return Fill::Follower(w.clone());
        }
        self.fills.insert(key.into(), waiter());
        Fill::Leader
    }

    /// The leader's fill of `key` is over; returns its waiter.
    pub fn end_fill(&mut self, key: &str) -> Option<W> {
        self.fills.remove(key)
    }

    /// Whether a background refresh of `key` may start: true for the first
    /// caller until [`end_refresh`](Self::end_refresh), false for the rest
    /// (they serve the stale entry without one).
    pub fn begin_refresh(&mut self, key: &str) -> bool {
        if self.refreshes.contains(key) {
            return false;
        }
        self.refreshes.insert(key.into())
    }

    /// The background refresh of `key` is over, whatever its outcome.
    pub fn end_refresh(&mut self, key: &str) {
        self.refreshes.remove(key);
    }

    /// Fills in progress.
    pub fn fills(&self) -> usize {
        self.fills.len()
    }

    /// Background refreshes in progress.
    pub fn refreshes(&self) -> usize {
        self.refreshes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_leader_per_key_and_followers_share_its_waiter() {
        let mut r = FillRegistry::new();
        let mut made = 0;
        let mut begin = |r: &mut FillRegistry<u32>, key: &str| {
            r.begin_fill(key, || {
                made += 1;
                made
            })
        };
        assert_eq!(begin(&mut r, "/a"), Fill::Leader);
        // A hundred concurrent misses: one leader, 99 followers, one waiter.
        for _ in 0..99 {
            assert_eq!(begin(&mut r, "/a"), Fill::Follower(1));
        }
        assert_eq!(begin(&mut r, "/b"), Fill::Leader);
        assert_eq!(r.fills(), 2);
        assert_eq!(r.end_fill("/a"), Some(1));
        assert_eq!(r.end_fill("/a"), None);
        // The next miss leads a new fill.
        assert_eq!(begin(&mut r, "/a"), Fill::Leader);
        assert_eq!(begin(&mut r, "/a"), Fill::Follower(3));
        assert_eq!(r.fills(), 2);
    }

    #[test]
    fn at_most_one_background_refresh_per_key() {
        let mut r: FillRegistry<()> = FillRegistry::new();
        assert!(r.begin_refresh("/a"));
        assert!(!r.begin_refresh("/a"));
        assert!(r.begin_refresh("/b"));
        assert_eq!(r.refreshes(), 2);
        r.end_refresh("/a");
        r.end_refresh("/a");
        assert!(r.begin_refresh("/a"));
        // Refreshes and fills are apart.
        assert_eq!(r.begin_fill("/a", || ()), Fill::Leader);
        assert_eq!(r.refreshes(), 2);
    }
}
