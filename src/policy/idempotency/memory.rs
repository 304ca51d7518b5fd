//! The in-memory [`IdempotencyStore`] (docs/reference/idempotency.md#idempotency-keys):
//! one upstream's records in a hash map into a slab threaded by intrusive
//! lists, O(1) per operation, bounded by `max_bytes` with the accounting of
//! [`Entry::bytes`]. Owns eviction and expiry; the decision itself is
//! [`decide`], shared with every other store.

use super::{
    decide, Action, Begin, Claim, Entry, EntryState, Fingerprint, IdempotencyParams,
    IdempotencyStats, IdempotencyStore, Record, StoredResponse,
};
use crate::policy::Now;
use hashbrown::HashTable;
use std::hash::{BuildHasher, RandomState};

const NIL: usize = usize::MAX;

#[derive(Debug, Clone, Copy)]
struct ListLink {
    /// Towards the newest end.
    prev: usize,
    /// Towards the oldest end.
    next: usize,
}

const UNLINKED: ListLink = ListLink {
    prev: NIL,
    next: NIL,
};

#[derive(Debug, Clone, Copy)]
struct List {
    newest: usize,
    oldest: usize,
}

/// The lists: uncertain and completed records (each in eviction order,
/// through link 0), and every record in the order it was last written
/// (through link 1), which with one `ttl` is expiry order.
const UNCERTAIN: usize = 0;
const COMPLETED: usize = 1;
const EXPIRY: usize = 2;

/// The longest key kept in its node rather than in an allocation of its own
/// (a UUID is 36 bytes).
const INLINE_KEY: usize = 46;

/// A record's key: in the node when short, so that comparing it and
/// evicting its record touch no other allocation (a cold one, in a full
/// store), and a new record allocates nothing for it.
#[derive(Debug)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl Key {
    fn new(key: &str) -> Self {
        let k = key.as_bytes();
        match u8::try_from(k.len()) {
            Ok(len) if k.len() <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                bytes[..k.len()].copy_from_slice(k);
                Key::Inline { len, bytes }
            }
            _ => Key::Heap(k.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Heap(b) => b,
        }
    }
}

/// A record's place: its links in the lists, and the record.
#[derive(Debug)]
struct RecordSlot {
    links: [ListLink; 2],
    node: Option<StoredRecord>,
}

#[derive(Debug)]
struct StoredRecord {
    key: Key,
    /// `key`'s hash: an eviction finds the record's place in the table by it
    /// without hashing or reading the key again.
    hash: u64,
    /// Which record this is, for a [`Ticket`]: unique in the store's life.
    serial: u64,
    entry: Entry,
    bytes: usize,
}

/// The record [`MemoryStore::begin_ticket`] took in flight: where it is, and
/// which record it is (a freed slot is reused by another). Its owner
/// finishes it with [`MemoryStore::finish_ticket`] without hashing or
/// comparing the key again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    slot: usize,
    serial: u64,
}

/// The in-memory store: a hash map into a slab threaded by intrusive lists,
/// O(1) per operation, bounded by `max_bytes` (see the module doc).
#[derive(Debug)]
pub struct MemoryStore {
    params: IdempotencyParams,
    /// Slots by their key's hash; the key itself is kept once, in its node.
    map: HashTable<usize>,
    /// Keyed per store, so clients cannot aim their keys at one bucket.
    hasher: RandomState,
    /// The next record's serial; it starts at a random number, so a ticket
    /// of another store (one replaced by a reload) matches nothing here.
    serial: u64,
    /// Each record's links and node side by side: an eviction reads both,
    /// from one place, in a store too large for the CPU's caches.
    slots: Vec<RecordSlot>,
    free: Vec<usize>,
    lists: [List; 3],
    stats: IdempotencyStats,
}

impl MemoryStore {
    pub fn new(params: IdempotencyParams) -> Self {
        let empty = List {
            newest: NIL,
            oldest: NIL,
        };
        let hasher = RandomState::new();
        MemoryStore {
            params,
            map: HashTable::new(),
            serial: hasher.hash_one(0u8),
            hasher,
            slots: Vec::new(),
            free: Vec::new(),
            lists: [empty; 3],
            stats: IdempotencyStats::default(),
        }
    }

    pub fn params(&self) -> &IdempotencyParams {
        &self.params
    }

    /// New parameters (a reload): records keep their expiry; a smaller
    /// `max_bytes` evicts down to it at once.
    pub fn set_params(&mut self, params: IdempotencyParams) {
        self.params = params;
        self.evict();
    }

    /// `key`'s record, expired or not, without touching it.
    pub fn entry(&self, key: &str) -> Option<&Entry> {
        self.slot(key).map(|i| &self.node(i).entry)
    }

    /// The slot holding `key`'s record.
    fn slot(&self, key: &str) -> Option<usize> {
        self.slot_hashed(key, self.hasher.hash_one(key))
    }

    /// The slot holding `key`'s record, `hash` being its hash.
    fn slot_hashed(&self, key: &str, hash: u64) -> Option<usize> {
        let slots = &self.slots;
        let found = self.map.find(hash, |&i| {
            slots[i]
                .node
                .as_ref()
                .is_some_and(|n| n.hash == hash && n.key.as_bytes() == key.as_bytes())
        });
        found.copied()
    }

    fn node(&self, i: usize) -> &StoredRecord {
        self.slots[i]
            .node
            .as_ref()
            .expect("a mapped slot holds a node")
    }

    fn node_mut(&mut self, i: usize) -> &mut StoredRecord {
        self.slots[i]
            .node
            .as_mut()
            .expect("a mapped slot holds a node")
    }

    /// The list a record's state puts it in, besides [`EXPIRY`].
    fn class(e: &Entry) -> Option<usize> {
        match e.state {
            EntryState::InFlight { .. } => None,
            EntryState::Uncertain => Some(UNCERTAIN),
            EntryState::Completed(_) | EntryState::CompletedNotReplayable => Some(COMPLETED),
        }
    }

    fn push_newest(&mut self, l: usize, i: usize) {
        let s = usize::from(l == EXPIRY);
        let old = self.lists[l].newest;
        self.slots[i].links[s] = ListLink {
            prev: NIL,
            next: old,
        };
        match old {
            NIL => self.lists[l].oldest = i,
            o => self.slots[o].links[s].prev = i,
        }
        self.lists[l].newest = i;
    }

    fn unlink(&mut self, l: usize, i: usize) {
        let s = usize::from(l == EXPIRY);
        let ListLink { prev, next } = self.slots[i].links[s];
        match prev {
            NIL => self.lists[l].newest = next,
            p => self.slots[p].links[s].next = next,
        }
        match next {
            NIL => self.lists[l].oldest = prev,
            n => self.slots[n].links[s].prev = prev,
        }
        self.slots[i].links[s] = UNLINKED;
    }

    fn link_all(&mut self, i: usize) {
        self.push_newest(EXPIRY, i);
        if let Some(l) = Self::class(&self.node(i).entry) {
            self.push_newest(l, i);
        }
    }

    fn unlink_all(&mut self, i: usize) {
        self.unlink(EXPIRY, i);
        if let Some(l) = Self::class(&self.node(i).entry) {
            self.unlink(l, i);
        }
    }

    fn insert(&mut self, key: &str, hash: u64, entry: Entry) -> Ticket {
        let bytes = entry.bytes(key.len());
        let serial = self.serial;
        self.serial = self.serial.wrapping_add(1);
        let node = Some(StoredRecord {
            key: Key::new(key),
            hash,
            serial,
            entry,
            bytes,
        });
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = RecordSlot {
                    links: [UNLINKED; 2],
                    node,
                };
                i
            }
            None => {
                self.slots.push(RecordSlot {
                    links: [UNLINKED; 2],
                    node,
                });
                self.slots.len() - 1
            }
        };
        let slots = &self.slots;
        self.map
            .insert_unique(hash, i, |&j| slots[j].node.as_ref().map_or(0, |n| n.hash));
        self.stats.bytes += bytes;
        self.link_all(i);
        Ticket { slot: i, serial }
    }

    fn remove(&mut self, i: usize) {
        self.unlink_all(i);
        if let Some(n) = self.slots[i].node.take() {
            if let Ok(found) = self.map.find_entry(n.hash, |&j| j == i) {
                found.remove();
            }
            self.stats.bytes -= n.bytes;
        }
        self.free.push(i);
    }

    /// Rewrites slot `i`'s state and expiry; it becomes the newest of its lists.
    fn rewrite(&mut self, i: usize, state: EntryState, expires: Now) {
        self.unlink_all(i);
        let n = self.node_mut(i);
        n.entry.state = state;
        n.entry.expires = expires;
        let bytes = n.entry.bytes(n.key.as_bytes().len());
        let old = std::mem::replace(&mut n.bytes, bytes);
        self.stats.bytes = self.stats.bytes - old + bytes;
        self.link_all(i);
    }

    /// Evicts uncertain records, then completed ones, oldest first, until
    /// the store is within `max_bytes` or only in-flight records are left.
    fn evict(&mut self) {
        while self.stats.bytes > self.params.max_bytes {
            let victim = match self.lists[UNCERTAIN].oldest {
                NIL => self.lists[COMPLETED].oldest,
                u => u,
            };
            if victim == NIL {
                return;
            }
            self.remove(victim);
            self.stats.evicted += 1;
        }
    }

    /// The slot of `key`'s record if it is in flight.
    fn in_flight(&self, key: &str) -> Option<usize> {
        let i = self.slot(key)?;
        matches!(self.node(i).entry.state, EntryState::InFlight { .. }).then_some(i)
    }
}

impl MemoryStore {
    /// The slot of `key`'s live record (`hash` being its hash); an expired
    /// one is dropped.
    fn live(&mut self, key: &str, hash: u64, now: Now) -> Option<usize> {
        let slot = self.slot_hashed(key, hash);
        if let Some(i) = slot.filter(|&i| self.node(i).entry.expired(now)) {
            self.remove(i);
            self.stats.expired += 1;
            return None;
        }
        slot
    }

    /// [`IdempotencyStore::begin`], with the record taken in flight (on
    /// [`Action::Forward`]) as a ticket for [`Self::finish_ticket`].
    pub fn begin_ticket(
        &mut self,
        key: &str,
        fingerprint: &Fingerprint,
        now: Now,
    ) -> (Begin, Option<Ticket>) {
        let hash = self.hasher.hash_one(key);
        let slot = self.live(key, hash, now);
        let action =
            decide(slot.map(|i| &self.node(i).entry), fingerprint, now).map(StoredResponse::clone);
        let expires = now + self.params.ttl;
        let mut ticket = None;
        match (&action, slot) {
            (Action::Forward, Some(i)) => {
                self.rewrite(i, EntryState::InFlight { since: now }, expires);
                let serial = self.node(i).serial;
                ticket = Some(Ticket { slot: i, serial });
            }
            (Action::Forward, None) => {
                let state = EntryState::InFlight { since: now };
                let entry = Entry::new(*fingerprint, state, expires);
                ticket = Some(self.insert(key, hash, entry));
                self.evict();
            }
            (Action::InFlight, _) => self.stats.in_flight += 1,
            (Action::Reused, _) => self.stats.reused += 1,
            (Action::Replay(_) | Action::NotReplayable, Some(i)) => {
                if matches!(action, Action::Replay(_)) {
                    self.stats.replayed += 1;
                } else {
                    self.stats.not_replayable += 1;
                }
                // Recently used: last to be evicted.
                self.unlink(COMPLETED, i);
                self.push_newest(COMPLETED, i);
            }
            (Action::Replay(_) | Action::NotReplayable, None) => {}
        }
        (action, ticket)
    }

    /// [`IdempotencyStore::finish`] for the record a ticket names, if it is
    /// still that record and still in flight.
    pub fn finish_ticket(
        &mut self,
        t: Ticket,
        what: Record,
        response: Option<StoredResponse>,
        now: Now,
    ) {
        let held = self.slots.get(t.slot).and_then(|s| s.node.as_ref());
        let in_flight = held.is_some_and(|n| {
            n.serial == t.serial && matches!(n.entry.state, EntryState::InFlight { .. })
        });
        if in_flight {
            self.finish_at(t.slot, what, response, now);
        }
    }

    /// Finishes the in-flight record in slot `i`.
    fn finish_at(&mut self, i: usize, what: Record, response: Option<StoredResponse>, now: Now) {
        let expires = now + self.params.ttl;
        let state = match (what, response) {
            (Record::Forget, _) => return self.remove(i),
            (Record::Uncertain, _) => EntryState::Uncertain,
            (Record::Completed, Some(r)) => {
                let whole = self.node(i).bytes + r.bytes();
                let p = &self.params;
                match r.bytes() <= p.max_response_bytes && whole <= p.max_bytes {
                    true => EntryState::Completed(r),
                    false => EntryState::CompletedNotReplayable,
                }
            }
            (Record::Completed | Record::CompletedNotReplayable, _) => {
                EntryState::CompletedNotReplayable
            }
        };
        if !matches!(state, EntryState::Uncertain) {
            self.stats.stored += 1;
        }
        self.rewrite(i, state, expires);
        self.evict();
    }
}

impl IdempotencyStore for MemoryStore {
    fn begin(&mut self, key: &str, fingerprint: &Fingerprint, now: Now) -> Begin {
        self.begin_ticket(key, fingerprint, now).0
    }

    fn claim(&mut self, key: &str, now: Now) -> Claim {
        let hash = self.hasher.hash_one(key);
        let slot = self.live(key, hash, now);
        let state = slot.map(|i| &self.node(i).entry.state);
        match state {
            Some(EntryState::InFlight { .. }) => {
                self.stats.in_flight += 1;
                Claim::InFlight
            }
            Some(EntryState::Completed(_) | EntryState::CompletedNotReplayable) => Claim::Decide,
            None | Some(EntryState::Uncertain) => {
                let state = EntryState::InFlight { since: now };
                let expires = now + self.params.ttl;
                match slot {
                    Some(i) => {
                        self.node_mut(i).entry.fingerprint = Fingerprint::PENDING;
                        self.rewrite(i, state, expires);
                    }
                    None => {
                        let entry = Entry::new(Fingerprint::PENDING, state, expires);
                        self.insert(key, hash, entry);
                        self.evict();
                    }
                }
                Claim::Forward
            }
        }
    }

    fn fingerprinted(&mut self, key: &str, fingerprint: &Fingerprint) {
        if let Some(i) = self.in_flight(key) {
            let e = &mut self.node_mut(i).entry;
            if e.fingerprint.is_pending() {
                e.fingerprint = *fingerprint;
            }
        }
    }

    fn complete(&mut self, key: &str, response: StoredResponse, now: Now) {
        self.finish(key, Record::Completed, Some(response), now);
    }

    fn complete_unreplayable(&mut self, key: &str, now: Now) {
        self.finish(key, Record::CompletedNotReplayable, None, now);
    }

    fn uncertain(&mut self, key: &str, now: Now) {
        self.finish(key, Record::Uncertain, None, now);
    }

    fn forget(&mut self, key: &str) {
        if let Some(i) = self.in_flight(key) {
            self.remove(i);
        }
    }

    fn finish(&mut self, key: &str, what: Record, response: Option<StoredResponse>, now: Now) {
        if let Some(i) = self.in_flight(key) {
            self.finish_at(i, what, response, now);
        }
    }

    /// Drops expired records from the oldest written, stopping at the first
    /// live one: O(expired). (After a clock step back or a shorter `ttl`, a
    /// few expired records may wait behind a live one; a lookup drops those.)
    fn sweep(&mut self, now: Now) {
        loop {
            let i = self.lists[EXPIRY].oldest;
            if i == NIL || !self.node(i).entry.expired(now) {
                return;
            }
            self.remove(i);
            self.stats.expired += 1;
        }
    }

    fn stats(&self) -> IdempotencyStats {
        IdempotencyStats {
            entries: self.map.len(),
            ..self.stats
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::{record, Ending, Record, ENTRY_OVERHEAD};
    use super::*;
    use std::time::Duration;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn store(max_bytes: u64, max_response_bytes: u64) -> MemoryStore {
        let methods = ["POST".to_string()];
        let p = IdempotencyParams::try_new(s(100), max_bytes, max_response_bytes, &methods);
        MemoryStore::new(p.unwrap())
    }

    fn fp(body: &str) -> Fingerprint {
        Fingerprint::new("POST", "/x", body.as_bytes())
    }

    /// A response of `n` accounted bytes: no fields, a body of `n`.
    fn response(n: usize) -> StoredResponse {
        StoredResponse::from_buffer(201, vec![b'x'; n], 0)
    }

    /// The accounted size of a record under a one-byte key for `fp("…")`.
    const BASE: usize = ENTRY_OVERHEAD + 1;

    #[test]
    fn overhead_covers_a_records_fixed_cost() {
        let fixed = std::mem::size_of::<RecordSlot>() + std::mem::size_of::<usize>() + 1;
        assert!(ENTRY_OVERHEAD >= fixed, "{fixed}");
    }

    /// Keys up to the inline length are kept in their node, longer ones in
    /// an allocation; both are found, told apart and counted by their length.
    #[test]
    fn short_and_long_keys_are_kept_alike() {
        let mut st = store(1 << 20, 1 << 10);
        let keys = [
            "a".repeat(INLINE_KEY),
            "a".repeat(INLINE_KEY + 1),
            "b".repeat(255),
            "a".repeat(INLINE_KEY - 1),
        ];
        for k in &keys {
            assert_eq!(st.begin(k, &fp("x"), s(0)), Action::Forward, "{}", k.len());
            st.complete(k, response(3), s(0));
        }
        for k in &keys {
            assert!(matches!(st.begin(k, &fp("x"), s(1)), Action::Replay(_)));
            assert_eq!(st.begin(k, &fp("y"), s(1)), Action::Reused);
        }
        let lens: usize = keys.iter().map(String::len).sum();
        assert_eq!(st.stats().bytes, 4 * (ENTRY_OVERHEAD + 3) + lens);
    }

    /// A ticket finishes the record it was given for, and nothing else: not
    /// a later record in its reused slot, not a record of another store.
    #[test]
    fn a_ticket_finishes_only_its_own_record() {
        let mut st = store(1 << 20, 1 << 10);
        let (a, t) = st.begin_ticket("k", &fp("a"), s(0));
        assert_eq!((a, t.is_some()), (Action::Forward, true));
        let t = t.unwrap();
        st.finish_ticket(t, Record::Completed, Some(response(10)), s(1));
        assert!(matches!(st.begin("k", &fp("a"), s(2)), Action::Replay(_)));
        // Done already: the ticket no longer names a record in flight.
        st.finish_ticket(t, Record::Forget, None, s(3));
        assert!(st.entry("k").is_some());

        // The record forgotten, its slot goes to the next key.
        let (_, t) = st.begin_ticket("j", &fp("a"), s(4));
        st.finish_ticket(t.unwrap(), Record::Forget, None, s(5));
        let (_, t2) = st.begin_ticket("i", &fp("a"), s(6));
        assert_eq!(t2.unwrap().slot, t.unwrap().slot);
        st.finish_ticket(t.unwrap(), Record::Uncertain, None, s(7));
        assert_eq!(st.begin("i", &fp("a"), s(8)), Action::InFlight);

        // Another store's ticket for the same slot matches nothing.
        let mut other = store(1 << 20, 1 << 10);
        let (_, o) = other.begin_ticket("x", &fp("a"), s(0));
        let foreign = Ticket {
            slot: t2.unwrap().slot,
            serial: o.unwrap().serial,
        };
        st.finish_ticket(foreign, Record::Forget, None, s(9));
        assert_eq!(st.begin("i", &fp("a"), s(10)), Action::InFlight);
        // A replay, a refusal: no ticket.
        assert_eq!(st.begin_ticket("k", &fp("a"), s(11)).1, None);
        assert_eq!(st.begin_ticket("i", &fp("a"), s(11)).1, None);
    }

    #[test]
    fn absent_in_flight_completed_replayed() {
        let mut st = store(1 << 20, 1 << 10);
        assert_eq!(st.begin("k", &fp("a"), s(0)), Action::Forward);
        assert_eq!(st.begin("k", &fp("a"), s(1)), Action::InFlight);
        assert_eq!(st.begin("k", &fp("b"), s(1)), Action::Reused);
        st.complete("k", response(10), s(2));
        let Action::Replay(r) = st.begin("k", &fp("a"), s(3)) else {
            panic!("no replay");
        };
        assert_eq!(r, response(10));
        assert_eq!(st.begin("k", &fp("b"), s(3)), Action::Reused);
        assert_eq!(st.entry("k").unwrap().expires, s(102));
        let stats = st.stats();
        assert_eq!(
            (stats.entries, stats.bytes, stats.stored, stats.replayed),
            (1, BASE + 10, 1, 1)
        );
        assert_eq!((stats.in_flight, stats.reused), (1, 2));
    }

    /// Fifty simultaneous requests with one key (the data plane serialises
    /// `begin` under its lock): exactly one is forwarded.
    #[test]
    fn one_of_fifty_simultaneous_requests_is_forwarded() {
        let mut st = store(1 << 20, 1 << 10);
        let names: Vec<_> = (0..50)
            .map(|_| st.begin("k", &fp("a"), s(0)).name())
            .collect();
        assert_eq!(names.iter().filter(|n| **n == "forward").count(), 1);
        assert_eq!(names.iter().filter(|n| **n == "in_flight").count(), 49);
        assert_eq!(st.stats().in_flight, 49);
    }

    #[test]
    fn uncertain_is_forwarded_again_and_forget_frees_the_key() {
        let mut st = store(1 << 20, 1 << 10);
        assert_eq!(st.begin("k", &fp("a"), s(0)), Action::Forward);
        st.uncertain("k", s(1));
        assert_eq!(st.entry("k").unwrap().state, EntryState::Uncertain);
        assert_eq!(st.begin("k", &fp("b"), s(2)), Action::Reused);
        assert_eq!(st.begin("k", &fp("a"), s(2)), Action::Forward);
        assert_eq!(st.begin("k", &fp("a"), s(2)), Action::InFlight);
        st.forget("k");
        assert!(st.entry("k").is_none());
        assert_eq!(st.begin("k", &fp("b"), s(3)), Action::Forward);
        st.complete_unreplayable("k", s(4));
        assert_eq!(st.begin("k", &fp("b"), s(5)), Action::NotReplayable);
        assert_eq!(st.stats().not_replayable, 1);
        // Finishing calls act on an in-flight record only.
        st.forget("k");
        st.uncertain("k", s(6));
        st.complete("k", response(4), s(6));
        assert_eq!(st.begin("k", &fp("b"), s(7)), Action::NotReplayable);
        assert_eq!(st.stats().stored, 1);
        st.complete("nobody", response(4), s(7));
        assert_eq!(st.stats().entries, 1);
    }

    /// A request whose body streams claims its key before its fingerprint
    /// is known, and reports it when the body has passed.
    #[test]
    fn a_streamed_request_claims_its_key_then_reports_its_fingerprint() {
        let mut st = store(1 << 20, 1 << 10);
        assert_eq!(st.claim("k", s(0)), Claim::Forward);
        assert!(st.entry("k").unwrap().fingerprint.is_pending());
        // While the body streams, any request under the key is in flight.
        assert_eq!(st.claim("k", s(1)), Claim::InFlight);
        assert_eq!(st.begin("k", &fp("b"), s(1)), Action::InFlight);
        st.fingerprinted("k", &fp("a"));
        st.fingerprinted("k", &fp("c")); // only a pending one is set
        assert_eq!(st.entry("k").unwrap().fingerprint, fp("a"));
        st.complete("k", response(3), s(2));
        // Done: the next one reads its body and asks begin.
        assert_eq!(st.claim("k", s(3)), Claim::Decide);
        assert_eq!(st.begin("k", &fp("a"), s(3)), Action::Replay(response(3)));
        assert_eq!(st.begin("k", &fp("b"), s(3)), Action::Reused);
        // An uncertain record is claimed again, its fingerprint pending anew.
        assert_eq!(st.claim("u", s(4)), Claim::Forward);
        st.fingerprinted("u", &fp("a"));
        st.uncertain("u", s(5));
        assert_eq!(st.claim("u", s(6)), Claim::Forward);
        assert!(st.entry("u").unwrap().fingerprint.is_pending());
        // A body that never passed whole leaves a record of the key alone.
        st.uncertain("u", s(7));
        assert_eq!(st.begin("u", &fp("z"), s(8)), Action::Forward);
        // Expired records are absent.
        assert_eq!(st.claim("k", s(200)), Claim::Forward);
        assert_eq!(st.stats().expired, 1);
    }

    #[test]
    fn finish_follows_record() {
        let mut st = store(1 << 20, 1 << 10);
        let cases = [
            (
                Ending::Response {
                    status: 200,
                    replayable: true,
                },
                "replay",
            ),
            (
                Ending::Response {
                    status: 200,
                    replayable: false,
                },
                "not_replayable",
            ),
            (
                Ending::Response {
                    status: 503,
                    replayable: true,
                },
                "forward",
            ),
            (Ending::Failed, "forward"),
            (Ending::Uncertain, "forward"),
            (Ending::ClientGone, "forward"),
        ];
        for (n, (ending, next)) in cases.into_iter().enumerate() {
            let key = format!("k{n}");
            assert_eq!(st.begin(&key, &fp("a"), s(0)), Action::Forward);
            st.finish(&key, record(ending), Some(response(4)), s(1));
            assert_eq!(st.begin(&key, &fp("a"), s(2)).name(), next, "{ending:?}");
        }
        // Completed without the response in hand: nothing to replay.
        assert_eq!(st.begin("z", &fp("a"), s(0)), Action::Forward);
        st.finish("z", Record::Completed, None, s(1));
        assert_eq!(st.begin("z", &fp("a"), s(2)), Action::NotReplayable);
    }

    #[test]
    fn records_expire_lazily_and_by_sweep() {
        let mut st = store(1 << 20, 1 << 10);
        st.begin("a", &fp("a"), s(0));
        st.complete("a", response(4), s(10)); // expires at 110
        st.begin("b", &fp("a"), s(20));
        st.uncertain("b", s(30)); // expires at 130
        st.begin("c", &fp("a"), s(40)); // in flight, backstop at 140
        st.sweep(s(109));
        assert_eq!(st.stats().entries, 3);
        assert!(matches!(st.begin("a", &fp("a"), s(109)), Action::Replay(_)));
        // Lazily, on lookup: expired means absent, whatever the request.
        assert_eq!(st.begin("a", &fp("z"), s(110)), Action::Forward);
        assert_eq!(st.stats().expired, 1);
        // By the sweep, in the order written.
        st.sweep(s(139));
        assert_eq!(st.stats().expired, 2);
        assert!(st.entry("b").is_none() && st.entry("c").is_some());
        st.sweep(s(1_000));
        assert_eq!(st.stats().expired, 4); // "c", and "a"'s new record
        assert_eq!((st.stats().entries, st.stats().bytes), (0, 0));
        assert_eq!(st.begin("c", &fp("a"), s(1_000)), Action::Forward);
    }

    #[test]
    fn eviction_is_lru_with_exact_byte_accounting() {
        // Room for exactly three records of BASE + 100 bytes.
        let max = 3 * (BASE + 100);
        let mut st = store(max as u64, 100);
        for k in ["a", "b", "c"] {
            st.begin(k, &fp(k), s(0));
            st.complete(k, response(100), s(0));
        }
        assert_eq!(st.stats().bytes, max);
        assert_eq!(st.stats().evicted, 0);
        // Touch "a": "b" is now the least recently used.
        assert!(matches!(st.begin("a", &fp("a"), s(1)), Action::Replay(_)));
        // A fourth record in flight takes BASE bytes: "b" goes.
        st.begin("d", &fp("d"), s(2));
        assert_eq!(st.stats().evicted, 1);
        assert!(st.entry("b").is_none());
        assert_eq!(st.stats().bytes, 2 * (BASE + 100) + BASE);
        // Completing it adds 100 bytes: exactly full, nothing goes.
        st.complete("d", response(100), s(3));
        assert_eq!(st.stats().bytes, max);
        assert_eq!(st.stats().evicted, 1);
        // One more in flight: "c" (used before "a" and "d") goes.
        st.begin("e", &fp("e"), s(4));
        assert!(st.entry("c").is_none());
        assert!(st.entry("a").is_some() && st.entry("d").is_some());
        assert_eq!(st.stats().bytes, 2 * (BASE + 100) + BASE);
        assert_eq!(st.stats().evicted, 2);
        // A not-replayable record counts its key and fingerprint only.
        st.complete_unreplayable("e", s(5));
        assert_eq!(st.stats().bytes, 2 * (BASE + 100) + BASE);
        assert_eq!(st.stats().entries, 3);
    }

    #[test]
    fn uncertain_records_are_evicted_before_completed_ones() {
        let mut st = store((3 * BASE + 9) as u64, 10);
        st.begin("a", &fp("a"), s(0));
        st.uncertain("a", s(0));
        st.begin("b", &fp("b"), s(1));
        st.complete("b", response(10), s(1));
        st.begin("c", &fp("c"), s(2)); // over by BASE: the uncertain "a" goes
        assert!(st.entry("a").is_none() && st.entry("b").is_some());
        assert_eq!(st.stats().bytes, 2 * BASE + 10);
    }

    #[test]
    fn in_flight_records_are_never_evicted() {
        let mut st = store((2 * BASE) as u64, 0);
        for k in ["a", "b", "c", "d"] {
            assert_eq!(st.begin(k, &fp(k), s(0)), Action::Forward);
        }
        // Over the bound, and every one still there.
        assert_eq!(st.stats().bytes, 4 * BASE);
        assert_eq!(st.stats().evicted, 0);
        for k in ["a", "b", "c", "d"] {
            assert_eq!(st.begin(k, &fp(k), s(1)), Action::InFlight);
        }
        // Once done they can go: completing "a" evicts it at once.
        st.complete_unreplayable("a", s(2));
        assert!(st.entry("a").is_none());
        assert_eq!(st.stats().evicted, 1);
    }

    #[test]
    fn a_response_over_max_response_bytes_is_not_replayable() {
        let mut st = store(1 << 20, 100);
        st.begin("k", &fp("a"), s(0));
        st.complete("k", response(101), s(1));
        assert_eq!(st.begin("k", &fp("a"), s(2)), Action::NotReplayable);
        assert_eq!(st.stats().bytes, BASE);
        st.begin("j", &fp("a"), s(0));
        st.complete("j", response(100), s(1));
        assert!(matches!(st.begin("j", &fp("a"), s(2)), Action::Replay(_)));
        // One that fits max_response_bytes but not the store with its record.
        let mut st = store((BASE + 99) as u64, 100);
        st.begin("k", &fp("a"), s(0));
        st.complete("k", response(100), s(1));
        assert_eq!(st.begin("k", &fp("a"), s(2)), Action::NotReplayable);
    }

    #[test]
    fn a_smaller_max_bytes_evicts_at_once() {
        let mut st = store(1 << 20, 100);
        for k in ["a", "b", "c"] {
            st.begin(k, &fp(k), s(0));
            st.complete(k, response(100), s(0));
        }
        let methods = ["POST".to_string()];
        let max = (BASE + 100) as u64;
        st.set_params(IdempotencyParams::try_new(s(100), max, 100, &methods).unwrap());
        assert_eq!(st.stats().entries, 1);
        assert!(st.entry("c").is_some());
        assert_eq!(st.stats().evicted, 2);
    }

    #[test]
    fn slots_are_reused_and_the_lists_stay_consistent() {
        let mut st = store(1 << 20, 100);
        for round in 0..50u64 {
            for k in 0..20 {
                let key = format!("k{k}");
                match st.begin(&key, &fp("a"), s(round)) {
                    Action::Forward if k % 3 == 0 => st.uncertain(&key, s(round)),
                    Action::Forward if k % 3 == 1 => st.complete(&key, response(8), s(round)),
                    Action::Forward => st.forget(&key),
                    _ => {}
                }
            }
            st.sweep(s(round));
        }
        assert!(st.slots.len() <= 20);
        let live: usize = st.map.iter().map(|&i| st.node(i).bytes).sum();
        assert_eq!(live, st.stats().bytes);
        // Walked oldest to newest, each list holds what the states say.
        let walk = |l: usize| {
            let (mut n, mut i) = (0, st.lists[l].oldest);
            while i != NIL {
                n += 1;
                i = st.slots[i].links[usize::from(l == EXPIRY)].prev;
            }
            n
        };
        let count = |c: Option<usize>| {
            let class = |i: usize| MemoryStore::class(&st.node(i).entry);
            st.map.iter().filter(|&&i| class(i) == c).count()
        };
        assert_eq!(walk(EXPIRY), st.stats().entries);
        assert_eq!(walk(UNCERTAIN), count(Some(UNCERTAIN)));
        assert_eq!(walk(COMPLETED), count(Some(COMPLETED)));
        st.sweep(s(10_000));
        assert_eq!((st.stats().entries, st.stats().bytes), (0, 0));
    }
}
