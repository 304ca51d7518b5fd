//! The keyed limiter registry (docs/reference/admission.md#rate-limits): one [`Limiter`] per key, at most
//! `max_keys`, least-recently-used evicted, plus a shared limiter for requests
//! without a key.
//!
//! Owns the bounded registry and its stats. It must not read a clock or scan
//! the registry per request: every operation is O(1) (a hash map into a slab
//! threaded by an intrusive LRU list). Keys come from the data plane, which
//! extracts them per [`KeySource`](super::limiter::KeySource).

use super::limiter::{Left, Limiter, RateLimitParams};
use super::Now;
use std::collections::HashMap;
use std::time::Duration;

/// The registry's counters, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyedStats {
    /// Keys held now.
    pub size: usize,
    /// Keys evicted (least recently used) to stay within `max_keys`.
    pub evictions: u64,
    /// Calls whose `now` was earlier than one already seen.
    pub clock_regressions: u64,
}

const NIL: usize = usize::MAX;

#[derive(Debug, Clone)]
struct KeyedEntry {
    key: Box<str>,
    limiter: Limiter,
    /// Towards the most recently used end.
    prev: usize,
    /// Towards the least recently used end.
    next: usize,
}

/// One upstream's limiters: a shared one for requests without a key, and one
/// per key, at most `max_keys`, the least recently used evicted first.
///
/// A hash map into a slab threaded by an intrusive doubly-linked list: every
/// operation is O(1), with no scan at any registry size. An evicted key that
/// comes back starts with a fresh (full) limiter.
#[derive(Debug, Clone)]
pub struct KeyedLimiter {
    params: RateLimitParams,
    shared: Limiter,
    map: HashMap<Box<str>, usize>,
    nodes: Vec<KeyedEntry>,
    /// Most recently used.
    head: usize,
    /// Least recently used.
    tail: usize,
    evictions: u64,
    regressions: u64,
    last: Now,
}

impl KeyedLimiter {
    /// An empty registry at `now`.
    pub fn new(params: RateLimitParams, now: Now) -> Self {
        KeyedLimiter {
            shared: Limiter::new(&params, now),
            map: HashMap::new(),
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            evictions: 0,
            regressions: 0,
            last: now,
            params,
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> &RateLimitParams {
        &self.params
    }

    fn observe(&mut self, now: Now) {
        if now < self.last {
            self.regressions += 1;
        } else {
            self.last = now;
        }
    }

    /// Takes a token from `key`'s limiter (the shared one for `None`).
    pub fn try_acquire(&mut self, key: Option<&str>, now: Now) -> bool {
        self.observe(now);
        match key {
            None => self.shared.try_acquire(now),
            Some(k) => {
                let i = self.slot(k, now);
                self.nodes[i].limiter.try_acquire(now)
            }
        }
    }

    /// Gives back a token [`KeyedLimiter::try_acquire`] took for `key` (a
    /// key evicted meanwhile has nothing to give back to).
    pub fn give_back(&mut self, key: Option<&str>) {
        match key {
            None => self.shared.give_back(),
            Some(k) => {
                if let Some(&i) = self.map.get(k) {
                    self.nodes[i].limiter.give_back();
                }
            }
        }
    }

    /// How long until `key`'s limiter could admit (see [`Limiter::time_until`]).
    /// Does not create or touch the key.
    pub fn time_until(&self, key: Option<&str>, now: Now) -> Option<Duration> {
        let limiter = match key {
            None => &self.shared,
            Some(k) => match self.map.get(k) {
                Some(&i) => &self.nodes[i].limiter,
                None => return Limiter::new(&self.params, now).time_until(now),
            },
        };
        limiter.time_until(now)
    }

    /// What the shared limiter (requests without a key) has left at `now`,
    /// without touching it.
    pub fn peek_shared(&self, now: Now) -> Left {
        self.shared.peek(now)
    }

    /// Size, evictions and clock regressions.
    pub fn stats(&self) -> KeyedStats {
        KeyedStats {
            size: self.map.len(),
            evictions: self.evictions,
            clock_regressions: self.regressions,
        }
    }

    /// Updates every limiter in place (config reload; O(keys), once); a
    /// smaller `max_keys` evicts the least recently used down to it.
    pub fn set_params(&mut self, params: RateLimitParams, now: Now) {
        self.shared.set_params(&params, now);
        for n in &mut self.nodes {
            n.limiter.set_params(&params, now);
        }
        self.params = params;
        while self.map.len() > self.params.max_keys {
            let t = self.tail;
            self.unlink(t);
            self.map.remove(&self.nodes[t].key);
            self.evictions += 1;
            // keep the slab dense: move the last node into the hole
            let last = self.nodes.len() - 1;
            self.nodes.swap_remove(t);
            if t != last {
                self.relocate(last, t);
            }
        }
    }

    /// The slab index of `key`'s node, created (evicting if full) and moved to
    /// the most-recently-used end.
    fn slot(&mut self, key: &str, now: Now) -> usize {
        if let Some(&i) = self.map.get(key) {
            if self.head != i {
                self.unlink(i);
                self.push_front(i);
            }
            return i;
        }
        let limiter = Limiter::new(&self.params, now);
        let i = if self.map.len() >= self.params.max_keys && self.tail != NIL {
            let t = self.tail;
            self.unlink(t);
            self.map.remove(&self.nodes[t].key);
            self.evictions += 1;
            self.nodes[t].key = key.into();
            self.nodes[t].limiter = limiter;
            t
        } else {
            self.nodes.push(KeyedEntry {
                key: key.into(),
                limiter,
                prev: NIL,
                next: NIL,
            });
            self.nodes.len() - 1
        };
        self.map.insert(key.into(), i);
        self.push_front(i);
        i
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next].prev = prev;
        }
        self.nodes[i].prev = NIL;
        self.nodes[i].next = NIL;
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.head;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// The node that was at `from` now sits at `to`: repoint its neighbours.
    fn relocate(&mut self, from: usize, to: usize) {
        let (prev, next) = (self.nodes[to].prev, self.nodes[to].next);
        if prev == NIL {
            self.head = to;
        } else {
            self.nodes[prev].next = to;
        }
        if next == NIL {
            self.tail = to;
        } else {
            self.nodes[next].prev = to;
        }
        if let Some(v) = self.map.get_mut(&self.nodes[to].key) {
            debug_assert_eq!(*v, from);
            *v = to;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    fn params(
        bucket: Option<(f64, u32)>,
        window: Option<(u32, Duration)>,
        max_keys: usize,
    ) -> RateLimitParams {
        RateLimitParams::try_new(bucket, window, Some("header:x-tenant"), max_keys, ms(0)).unwrap()
    }

    #[test]
    fn keyed_lru_eviction_and_stats() {
        let p = params(Some((1.0, 1)), None, 2);
        let mut k = KeyedLimiter::new(p, ms(0));
        assert!(k.try_acquire(Some("a"), ms(0)));
        assert!(k.try_acquire(Some("b"), ms(0)));
        assert!(!k.try_acquire(Some("a"), ms(0))); // touches a: b is now LRU
        assert!(k.try_acquire(Some("c"), ms(0))); // evicts b
        assert!(!k.try_acquire(Some("a"), ms(0)));
        assert!(k.try_acquire(Some("b"), ms(0))); // fresh again; evicts c
        assert!(!k.try_acquire(Some("a"), ms(0)));
        assert!(k.try_acquire(None, ms(0)));
        assert!(!k.try_acquire(None, ms(0)));
        assert_eq!(
            k.stats(),
            KeyedStats {
                size: 2,
                evictions: 2,
                clock_regressions: 0
            }
        );
        let mut k2 = KeyedLimiter::new(params(Some((1.0, 1)), None, 2), ms(10));
        let _ = k2.try_acquire(Some("x"), ms(5));
        assert_eq!(k2.stats().clock_regressions, 1);
        assert_eq!(k.time_until(Some("zzz"), ms(0)), Some(Duration::ZERO));
    }

    #[test]
    fn keyed_many_keys_stay_bounded() {
        let p = params(Some((1.0, 1)), None, 100);
        let mut k = KeyedLimiter::new(p, ms(0));
        for i in 0..10_000 {
            let key = format!("k{i}");
            assert!(k.try_acquire(Some(&key), ms(0)));
        }
        assert_eq!(k.stats().size, 100);
        assert_eq!(k.stats().evictions, 9_900);
        // the 100 most recent are still there and still empty
        assert!(!k.try_acquire(Some("k9999"), ms(0)));
        assert!(!k.try_acquire(Some("k9900"), ms(0)));
    }

    #[test]
    fn keyed_set_params_shrinks_and_updates() {
        let p = params(Some((1.0, 1)), None, 10);
        let mut k = KeyedLimiter::new(p, ms(0));
        for key in ["a", "b", "c", "d"] {
            assert!(k.try_acquire(Some(key), ms(0)));
        }
        let _ = k.try_acquire(Some("a"), ms(0)); // a is MRU
        k.set_params(params(Some((1.0, 5)), None, 2), ms(0));
        assert_eq!(k.stats().size, 2);
        assert_eq!(k.stats().evictions, 2);
        // a and d survive with their tokens (empty); b was evicted → fresh
        assert!(!k.try_acquire(Some("a"), ms(0)));
        assert!(!k.try_acquire(Some("d"), ms(0)));
        assert!(k.try_acquire(Some("b"), ms(0)));
        assert_eq!(k.stats().size, 2);
        // the larger burst refills: 5 tokens after 5 s
        assert_eq!(
            (0..10)
                .filter(|_| k.try_acquire(Some("b"), ms(6_000)))
                .count(),
            5
        );
    }
}
