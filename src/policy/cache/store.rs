//! The in-memory response store ([`CacheStore`]): one upstream's entries
//! in a hash map (key → its newest variant) into a slab; each slot is on
//! one intrusive LRU list and on its key's chain of variants (newest
//! first, at most [`MAX_VARIANTS`]). O(1) per operation but for a walk of
//! one key's variants; bounded by `max_bytes` with the accounting of
//! [`CacheStore::entry_bytes`]. What an entry is good for is
//! [`lookup_decision`]'s to say; this owns where entries live and when
//! they go.

use super::entry::vary_matches;
use super::{
    lookup_decision, CacheParams, CacheRequest, CacheResult, CacheStats, CachedResponse, Decision,
    ENTRY_OVERHEAD, MAX_VARIANTS,
};
use crate::policy::Now;
use std::collections::HashMap;
use std::sync::Arc;

const NIL: usize = usize::MAX;

#[derive(Debug)]
struct StoredVariant {
    /// Shared by the map and every variant of the key.
    key: Arc<str>,
    /// The secondary key (empty without `Vary`).
    vary: Box<[u8]>,
    response: Arc<CachedResponse>,
    bytes: usize,
    /// Towards the most recently used.
    prev: usize,
    /// Towards the least recently used.
    next: usize,
    /// The key's next older variant.
    older: usize,
}

/// What [`CacheStore::lookup`] found.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub decision: Decision,
    /// The entry the decision is about: to serve (`Fresh`,
    /// `StaleWhileRevalidate`), or to keep for a 304 or a failure
    /// (`Revalidate`). `None` with `Miss`.
    pub entry: Option<Arc<CachedResponse>>,
}

impl Lookup {
    fn miss() -> Self {
        Lookup {
            decision: Decision::Miss,
            entry: None,
        }
    }
}

/// One upstream's stored responses, bounded by `max_bytes` (see the
/// module doc of [`crate::policy::cache`]). Keys are the request target
/// sent upstream (path and query): the store is per upstream, so the
/// authority is not part of them, and a HEAD looks up the GET's entry.
#[derive(Debug)]
pub struct CacheStore {
    params: CacheParams,
    map: HashMap<Arc<str>, usize>,
    slots: Vec<Option<StoredVariant>>,
    free: Vec<usize>,
    newest: usize,
    oldest: usize,
    stats: CacheStats,
}

impl CacheStore {
    pub fn new(params: CacheParams) -> Self {
        CacheStore {
            params,
            map: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            newest: NIL,
            oldest: NIL,
            stats: CacheStats::default(),
        }
    }

    pub fn params(&self) -> &CacheParams {
        &self.params
    }

    /// New parameters (a reload): entries keep their freshness; a smaller
    /// `max_bytes` evicts down to it at once.
    pub fn set_params(&mut self, params: CacheParams) {
        self.params = params;
        self.evict();
    }

    /// The accounted size of an entry (see the module doc of
    /// [`crate::policy::cache`]).
    pub fn entry_bytes(key: &str, vary: &[u8], response: &CachedResponse) -> usize {
        ENTRY_OVERHEAD + key.len() + vary.len() + response.object_bytes()
    }

    fn node(&self, i: usize) -> &StoredVariant {
        self.slots[i].as_ref().expect("a linked slot holds a node")
    }

    fn node_mut(&mut self, i: usize) -> &mut StoredVariant {
        self.slots[i].as_mut().expect("a linked slot holds a node")
    }

    /// The variant of `key` a request with `headers` selects: the newest
    /// whose secondary key it has.
    fn find<'a, H>(&self, key: &str, headers: H) -> Option<usize>
    where
        H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
    {
        let mut i = *self.map.get(key)?;
        while i != NIL {
            let n = self.node(i);
            if vary_matches(&n.vary, headers.clone()) {
                return Some(i);
            }
            i = n.older;
        }
        None
    }

    /// What `req` (with `headers`) gets for `key` at `now`
    /// ([`lookup_decision`]). The entry found becomes the most recently
    /// used; one no request could use any more is dropped (a miss).
    pub fn lookup<'a, H>(&mut self, key: &str, req: &CacheRequest, headers: H, now: Now) -> Lookup
    where
        H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
    {
        let Some(i) = self.find(key, headers) else {
            return Lookup::miss();
        };
        let decision = lookup_decision(&self.node(i).response, req, now);
        if decision == Decision::Miss {
            self.remove_slot(i);
            self.stats.expired += 1;
            return Lookup::miss();
        }
        self.unlink(i);
        self.push_newest(i);
        Lookup {
            decision,
            entry: Some(Arc::clone(&self.node(i).response)),
        }
    }

    /// The entry a request with `headers` selects for `key`, untouched.
    pub fn get<'a, H>(&self, key: &str, headers: H) -> Option<&Arc<CachedResponse>>
    where
        H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
    {
        self.find(key, headers).map(|i| &self.node(i).response)
    }

    /// Stores `response` to a request with `headers` for `key` (it passed
    /// [`super::storable`]). It supersedes every variant the request
    /// selects, whether or not it is kept itself: it is not when its
    /// field block and body exceed `max_object_bytes`, its entry
    /// `max_bytes`, or its secondary key cannot be made. The least
    /// recently used entries are evicted to make room, and the key's
    /// oldest variant past [`MAX_VARIANTS`]. Returns whether it was kept.
    pub fn insert<'a, H>(&mut self, key: &str, headers: H, response: CachedResponse) -> bool
    where
        H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
    {
        self.remove(key, headers.clone());
        let Some(vary) = response.secondary_key(headers) else {
            return false;
        };
        let bytes = Self::entry_bytes(key, &vary, &response);
        if response.object_bytes() > self.params.max_object_bytes || bytes > self.params.max_bytes {
            return false;
        }
        let (key, older) = match self.map.get_key_value(key) {
            Some((k, &head)) => (Arc::clone(k), head),
            None => (Arc::from(key), NIL),
        };
        let node = Some(StoredVariant {
            key: Arc::clone(&key),
            vary,
            response: Arc::new(response),
            bytes,
            prev: NIL,
            next: NIL,
            older,
        });
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = node;
                i
            }
            None => {
                self.slots.push(node);
                self.slots.len() - 1
            }
        };
        self.map.insert(key, i);
        self.push_newest(i);
        self.stats.bytes += bytes;
        self.stats.stored += 1;
        self.trim_variants(i);
        self.evict();
        true
    }

    /// Drops every variant of `key` a request with `headers` selects (a
    /// 304 that validated another response, say). Returns how many.
    pub fn remove<'a, H>(&mut self, key: &str, headers: H) -> usize
    where
        H: IntoIterator<Item = (&'a [u8], &'a [u8])> + Clone,
    {
        let mut n = 0;
        while let Some(i) = self.find(key, headers.clone()) {
            self.remove_slot(i);
            n += 1;
        }
        n
    }

    /// Drops every variant of `key`: a successful unsafe request to it
    /// ([`super::invalidates`]). Returns how many.
    pub fn invalidate(&mut self, key: &str) -> usize {
        let mut n = 0;
        while let Some(&i) = self.map.get(key) {
            self.remove_slot(i);
            n += 1;
        }
        n
    }

    /// Counts a request the cache handled, by how it was answered.
    pub fn count(&mut self, result: CacheResult) {
        let s = &mut self.stats;
        let c = match result {
            CacheResult::Hit => &mut s.hits,
            CacheResult::Miss => &mut s.misses,
            CacheResult::Stale => &mut s.stale,
            CacheResult::StaleIfError => &mut s.stale_if_error,
            CacheResult::Revalidated => &mut s.revalidated,
            CacheResult::Coalesced => &mut s.coalesced,
        };
        *c += 1;
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.slots.len() - self.free.len(),
            ..self.stats
        }
    }

    fn push_newest(&mut self, i: usize) {
        let old = self.newest;
        let n = self.node_mut(i);
        (n.prev, n.next) = (NIL, old);
        match old {
            NIL => self.oldest = i,
            o => self.node_mut(o).prev = i,
        }
        self.newest = i;
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.node(i).prev, self.node(i).next);
        match prev {
            NIL => self.newest = next,
            p => self.node_mut(p).next = next,
        }
        match next {
            NIL => self.oldest = prev,
            n => self.node_mut(n).prev = prev,
        }
    }

    /// Takes slot `i` off its key's chain of variants.
    fn unchain(&mut self, i: usize) {
        let (key, older) = (Arc::clone(&self.node(i).key), self.node(i).older);
        let Some(&head) = self.map.get(&*key) else {
            return;
        };
        if head == i {
            match older {
                NIL => drop(self.map.remove(&*key)),
                o => drop(self.map.insert(key, o)),
            }
            return;
        }
        let mut j = head;
        while j != NIL {
            let next = self.node(j).older;
            if next == i {
                self.node_mut(j).older = older;
                return;
            }
            j = next;
        }
    }

    fn remove_slot(&mut self, i: usize) {
        self.unlink(i);
        self.unchain(i);
        if let Some(n) = self.slots[i].take() {
            self.stats.bytes -= n.bytes;
        }
        self.free.push(i);
    }

    /// Keeps the newest [`MAX_VARIANTS`] of the chain starting at `head`.
    fn trim_variants(&mut self, head: usize) {
        let (mut last, mut n) = (head, 1);
        while n < MAX_VARIANTS && last != NIL {
            last = self.node(last).older;
            n += 1;
        }
        if last == NIL {
            return;
        }
        let mut j = self.node(last).older;
        while j != NIL {
            let older = self.node(j).older;
            self.remove_slot(j);
            self.stats.evictions += 1;
            j = older;
        }
    }

    /// Evicts the least recently used entries until within `max_bytes`.
    fn evict(&mut self) {
        while self.stats.bytes > self.params.max_bytes && self.oldest != NIL {
            self.remove_slot(self.oldest);
            self.stats.evictions += 1;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::{storable, Freshness, ResponseFacts};
    use super::*;
    use std::time::{Duration, SystemTime};

    use crate::policy::cache::tests::HeaderPairs;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn params(max_bytes: usize, max_object_bytes: usize) -> CacheParams {
        CacheParams::try_new(
            max_bytes as u64,
            max_object_bytes as u64,
            s(0),
            s(0),
            s(0),
            false,
        )
        .unwrap()
    }

    fn fresh(lifetime: u64) -> Freshness {
        Freshness {
            lifetime: s(lifetime),
            ..Freshness::default()
        }
    }

    /// A response of `n` body bytes, no fields, fresh for 60 s from `at`.
    fn body(n: usize, at: u64) -> CachedResponse {
        CachedResponse::new(200, [], &[vec![b'x'; n]], fresh(60), s(at))
    }

    fn get(st: &mut CacheStore, key: &str, h: &HeaderPairs, at: u64) -> &'static str {
        let req = CacheRequest::default();
        st.lookup(key, &req, h.iter().copied(), s(at))
            .decision
            .name()
    }

    /// Accounted bytes of an entry with a one-byte key and a body of `n`.
    const fn one(n: usize) -> usize {
        ENTRY_OVERHEAD + 1 + n
    }

    #[test]
    fn overhead_covers_an_entrys_fixed_structures() {
        // Each allocation an entry makes costs at least malloc's 32-byte
        // minimum chunk: the key, the response, its field block and body
        // and their two shared headers, the secondary key.
        let chunk = |n: usize| (n + 8).next_multiple_of(16).max(32);
        let fixed = std::mem::size_of::<Option<StoredVariant>>()
            + std::mem::size_of::<(Arc<str>, usize)>()
            + 1
            + chunk(16 + std::mem::size_of::<CachedResponse>())
            + chunk(16)
            + 5 * 32;
        assert!(ENTRY_OVERHEAD >= fixed, "{fixed}");
        // The slab and the map have up to 2× spare capacity.
        let spare = std::mem::size_of::<Option<StoredVariant>>()
            + 2 * (std::mem::size_of::<(Arc<str>, usize)>() + 1);
        assert!(ENTRY_OVERHEAD >= fixed + spare / 2, "{}", fixed + spare / 2);
    }

    #[test]
    fn lookup_insert_and_the_decisions_by_age() {
        let mut st = CacheStore::new(params(1 << 20, 1 << 16));
        assert_eq!(get(&mut st, "/a", &[], 0), "miss");
        assert!(st.insert("/a", [], body(10, 0)));
        assert_eq!(get(&mut st, "/a", &[], 59), "fresh");
        // Stale, no validator, no windows: of no use, dropped.
        assert_eq!(get(&mut st, "/a", &[], 60), "miss");
        assert_eq!(st.stats().expired, 1);
        assert_eq!((st.stats().entries, st.stats().bytes), (0, 0));
        // A HEAD looks up the GET's entry.
        st.insert("/a", [], body(10, 100));
        let head = CacheRequest {
            head: true,
            ..CacheRequest::default()
        };
        let l = st.lookup("/a", &head, [], s(101));
        assert_eq!(l.decision, Decision::Fresh);
        assert_eq!(l.entry.unwrap().body().len(), 10);
        assert_eq!(st.stats().stored, 2);
    }

    #[test]
    fn a_new_response_supersedes_and_the_bounds_hold() {
        let mut st = CacheStore::new(params(3 * one(100), 100));
        assert!(st.insert("a", [], body(100, 0)));
        assert!(st.insert("a", [], body(50, 1)));
        assert_eq!(st.stats().entries, 1);
        assert_eq!(st.stats().bytes, one(50));
        // Over max_object_bytes: not kept, and the old one is gone too.
        assert!(!st.insert("a", [], body(101, 2)));
        assert_eq!(get(&mut st, "a", &[], 2), "miss");
        assert_eq!((st.stats().entries, st.stats().bytes), (0, 0));
        // The field block counts towards max_object_bytes.
        let r = CachedResponse::new(
            200,
            [(&b"a"[..], &b"b"[..])],
            &[vec![0; 95]],
            fresh(9),
            s(0),
        );
        assert_eq!(r.object_bytes(), 101);
        assert!(!st.insert("f", [], r));
        // A store smaller than one entry keeps nothing.
        let mut tiny = CacheStore::new(params(one(100) - 1, 100));
        assert!(!tiny.insert("a", [], body(100, 0)));
    }

    #[test]
    fn eviction_is_lru_by_bytes_with_exact_accounting() {
        let max = 3 * one(100);
        let mut st = CacheStore::new(params(max, 100));
        for k in ["a", "b", "c"] {
            assert!(st.insert(k, [], body(100, 0)));
        }
        assert_eq!(st.stats().bytes, max);
        // Touch "a": "b" is now the least recently used.
        assert_eq!(get(&mut st, "a", &[], 1), "fresh");
        assert!(st.insert("d", [], body(1, 1)));
        assert_eq!(st.stats().evictions, 1);
        assert!(st.get("b", []).is_none());
        assert_eq!(st.stats().bytes, 2 * one(100) + one(1));
        // A bigger one takes two: "c", then "a".
        st.insert("e", [], body(100, 2));
        assert_eq!(st.stats().evictions, 2);
        assert!(st.get("c", []).is_none() && st.get("a", []).is_some());
        st.insert("f", [], body(100, 2));
        assert!(st.get("a", []).is_none() && st.get("d", []).is_some());
        assert_eq!(st.stats().bytes, one(1) + 2 * one(100));
        // A smaller max_bytes evicts at once.
        st.set_params(params(one(100), 100));
        assert_eq!(st.stats().entries, 1);
        assert!(st.get("f", []).is_some());
    }

    #[test]
    fn variants_are_kept_by_vary_and_bounded() {
        let mut st = CacheStore::new(params(1 << 20, 1 << 16));
        let vary = |tag: u8| {
            let f: &HeaderPairs = &[(b"vary", b"x-tenant")];
            CachedResponse::new(200, f.iter().copied(), &[[tag]], fresh(60), s(0))
        };
        let tenant = |t: &'static str| [(&b"x-tenant"[..], t.as_bytes())];
        for (t, tag) in [("a", b'a'), ("b", b'b')] {
            assert!(st.insert("/v", tenant(t), vary(tag)));
        }
        assert!(st.insert("/v", [], vary(b'-')));
        assert_eq!(st.stats().entries, 3);
        for (t, tag) in [("a", b'a'), ("b", b'b')] {
            let r = st.get("/v", tenant(t)).unwrap();
            assert_eq!(&r.body()[..], &[tag]);
        }
        assert_eq!(&st.get("/v", []).unwrap().body()[..], b"-");
        assert!(st.get("/v", tenant("c")).is_none());
        // Key + secondary key + block + body + the constant.
        let r = st.get("/v", tenant("a")).unwrap();
        let vary_key = b"x-tenant\0a\n".len();
        assert_eq!(r.object_bytes(), b"vary: x-tenant\r\n".len() + 1);
        let all =
            3 * (ENTRY_OVERHEAD + 2 + r.object_bytes()) + 2 * vary_key + b"x-tenant\x01\n".len();
        assert_eq!(st.stats().bytes, all);
        // Replacing one variant leaves the others.
        assert!(st.insert("/v", tenant("a"), vary(b'A')));
        assert_eq!(&st.get("/v", tenant("a")).unwrap().body()[..], b"A");
        assert_eq!(&st.get("/v", tenant("b")).unwrap().body()[..], b"b");
        assert_eq!(st.stats().entries, 3);
        // Past MAX_VARIANTS, the oldest go.
        let names: Vec<String> = (0..MAX_VARIANTS + 2).map(|i| format!("t{i}")).collect();
        for n in &names {
            st.insert("/v", [(&b"x-tenant"[..], n.as_bytes())], vary(b'n'));
        }
        assert_eq!(st.stats().entries, MAX_VARIANTS);
        assert!(st.get("/v", tenant("b")).is_none());
        assert!(st
            .get("/v", [(&b"x-tenant"[..], names[2].as_bytes())])
            .is_some());
        assert!(st
            .get("/v", [(&b"x-tenant"[..], names[1].as_bytes())])
            .is_none());
        assert_eq!(st.stats().evictions, 5);
        // invalidate() drops them all; other keys stay.
        assert!(st.insert("/w", [], vary(b'w')));
        let before = st.stats().entries;
        assert_eq!(st.invalidate("/v"), before - 1);
        assert_eq!(st.invalidate("/v"), 0);
        assert!(st.get("/w", []).is_some() && st.stats().entries == 1);
        for n in &names {
            st.insert("/v", [(&b"x-tenant"[..], n.as_bytes())], vary(b'n'));
        }
        // remove() drops the variant a request selects.
        let last = names[MAX_VARIANTS + 1].as_bytes();
        assert_eq!(st.remove("/v", [(&b"x-tenant"[..], last)]), 1);
        assert_eq!(st.remove("/v", [(&b"x-tenant"[..], last)]), 0);
        assert_eq!(st.stats().entries, MAX_VARIANTS);
    }

    #[test]
    fn vary_star_and_uncacheable_requests_never_reach_the_store() {
        let p = params(1 << 20, 1 << 16);
        let h: &HeaderPairs = &[(b"cache-control", b"max-age=60"), (b"vary", b"*")];
        let f = ResponseFacts::parse(200, h.iter().copied());
        let req = CacheRequest::default();
        assert_eq!(storable(&req, &f, &p, SystemTime::UNIX_EPOCH), None);
    }

    #[test]
    fn counts_and_slot_reuse_keep_the_books_straight() {
        let mut st = CacheStore::new(params(40 * one(8), 100));
        for r in CacheResult::ALL {
            st.count(r);
            st.count(CacheResult::Hit);
        }
        let stats = st.stats();
        for r in CacheResult::ALL {
            let want = if r == CacheResult::Hit { 7 } else { 1 };
            assert_eq!(stats.result(r), want, "{r:?}");
        }
        for round in 0..50u64 {
            for k in 0..60 {
                let key = format!("k{k}");
                match (k + round) % 4 {
                    0 => drop(st.remove(&key, [])),
                    1 => drop(get(&mut st, &key, &[], round * 30)),
                    _ => drop(st.insert(&key, [], body(8, round * 30))),
                }
            }
        }
        assert!(st.slots.len() <= 60);
        let live: usize = st
            .map
            .values()
            .map(|&i| {
                let mut n = 0;
                let mut j = i;
                while j != NIL {
                    n += st.node(j).bytes;
                    j = st.node(j).older;
                }
                n
            })
            .sum();
        assert_eq!(live, st.stats().bytes);
        assert!(st.stats().bytes <= 40 * one(8));
        let (mut walked, mut i) = (0, st.oldest);
        while i != NIL {
            walked += 1;
            i = st.node(i).prev;
        }
        assert_eq!(walked, st.stats().entries);
        assert_eq!(st.map.len(), st.stats().entries);
    }
}
