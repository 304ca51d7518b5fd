//! The idempotency-key store (docs/reference/idempotency.md#idempotency-keys): the
//! outcome of a keyed write is remembered, and a repeat of it is answered
//! from the record instead of reaching the upstream a second time.
//!
//! Owns: the request [`Fingerprint`] (method, target, SHA-256 of the body,
//! fed chunk by chunk through a [`FingerprintHasher`]); the record of a key
//! ([`Entry`]: in flight, uncertain, completed with a stored response, or
//! completed but not replayable); the pure decision for a keyed request
//! ([`decide`] → [`Action`]); what the end of an exchange records
//! ([`record`], [`recordable`]); the store's contract
//! ([`IdempotencyStore`]) and its bounded in-memory implementation
//! ([`MemoryStore`], in `idempotency/memory.rs`). Pure like the rest of
//! `policy`: no I/O, no clock — every `now` is passed in.
//!
//! **How the data plane calls a store.** The trait is synchronous and takes
//! `&mut self`: every operation of [`MemoryStore`] is O(1) (a hash map into a
//! slab threaded by intrusive lists; `sweep` is O(expired)), so the data
//! plane holds it in a `Mutex` for the length of one call and never across an
//! await. A shared store (Redis, a later issue) cannot be synchronous: the
//! data plane reaches stores through a small enum of its own (`Memory(Mutex<
//! MemoryStore>)`, later `Redis(…)` with async methods of the same names),
//! and this trait is the contract each arm keeps — in particular that
//! [`IdempotencyStore::begin`] decides and records *in flight* atomically,
//! which is what lets one of fifty simultaneous requests through. The trait
//! is object-safe and `Send`, so `Mutex<Box<dyn IdempotencyStore>>` works
//! too.
//!
//! **Byte accounting** ([`Entry::bytes`], bounded by `max_bytes`): per record,
//! [`ENTRY_OVERHEAD`] + the key's bytes + for a completed, replayable record
//! the stored response's field block and body ([`StoredResponse::bytes`]).
//! The constant stands for what a record really costs beyond those bytes:
//! the slab slot and its links, the table's bucket, the key's and the
//! response's allocations, each rounded up by the allocator, with the
//! slab's and the map's spare capacity (measured: RSS of a full store
//! against its accounted bytes, docs/reference/idempotency.md#idempotency-keys).
//! Every record counts; only completed and uncertain ones are
//! evicted (uncertain first: losing one changes no answer to a repeat of the
//! same request, which is forwarded either way; then completed ones, least
//! recently used first). In-flight records are never evicted: each is a request in
//! progress, so they can take the store past `max_bytes` only while that
//! many keyed requests are running.

use super::decide::is_idempotent_method;
use super::{Now, PolicyError};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::fmt;
use std::time::Duration;

mod memory;
mod scope;

pub use memory::{MemoryStore, Ticket};
pub use scope::{default_scope, parse_scope, principal, scoped_key, ScopePart, DEFAULT_SCOPE};

/// The longest idempotency key, in bytes; a longer (or empty) one is a 400.
pub const MAX_KEY_BYTES: usize = 255;

/// The fixed cost counted for every record on top of its bytes (see the
/// module doc; a unit test holds that it covers the slot, its links and
/// the map entry with room to spare).
pub const ENTRY_OVERHEAD: usize = 512;

/// The response header a replay carries (`Idempotent-Replayed: true`).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// An idempotency key from its header value: 1 to [`MAX_KEY_BYTES`] bytes of
/// UTF-8; `None` (answered 400 `bad_request`) otherwise.
pub fn parse_key(value: &[u8]) -> Option<&str> {
    if value.is_empty() || value.len() > MAX_KEY_BYTES {
        return None;
    }
    std::str::from_utf8(value).ok()
}

/// The store's parameters (`[….idempotency]`), validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyParams {
    /// How long a record is kept after it was last written.
    pub ttl: Duration,
    /// The whole store's bound, in accounted bytes.
    pub max_bytes: usize,
    /// A response whose [`StoredResponse::bytes`] exceed this is recorded
    /// as not replayable.
    pub max_response_bytes: usize,
    /// The methods a key is honoured on (case-sensitive).
    pub methods: Vec<String>,
    /// What qualifies a key besides itself (`scope`); empty: nothing.
    pub scope: Vec<ScopePart>,
}

impl IdempotencyParams {
    /// Validates the fields; an error names the field, relative to the table.
    pub fn try_new(
        ttl: Duration,
        max_bytes: u64,
        max_response_bytes: u64,
        methods: &[String],
    ) -> Result<Self, PolicyError> {
        if ttl.is_zero() {
            return Err(PolicyError::new("ttl", "must be greater than 0"));
        }
        if max_bytes == 0 {
            return Err(PolicyError::new(
                "max_bytes",
                "must be at least 1 (`enabled = false` turns the store off)",
            ));
        }
        if max_response_bytes > max_bytes {
            return Err(PolicyError::new(
                "max_response_bytes",
                format!("must be ≤ max_bytes ({max_bytes}), got {max_response_bytes}: the store could never hold such a response"),
            ));
        }
        if methods.is_empty() {
            return Err(PolicyError::new(
                "methods",
                "list at least one method (`enabled = false` turns the store off)",
            ));
        }
        for m in methods {
            check_method(m)?;
        }
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Ok(IdempotencyParams {
            ttl,
            max_bytes: size(max_bytes),
            max_response_bytes: size(max_response_bytes),
            methods: methods.to_vec(),
            scope: default_scope(),
        })
    }

    /// With `scope` as written in the config (`None`: the default).
    pub fn with_scope(mut self, scope: Option<&[String]>) -> Result<Self, PolicyError> {
        if let Some(items) = scope {
            self.scope = parse_scope(items)?;
        }
        Ok(self)
    }

    /// Whether a key on a request with this method is honoured.
    pub fn applies_to(&self, method: &str) -> bool {
        self.methods.iter().any(|m| m == method)
    }
}

fn check_method(m: &str) -> Result<(), PolicyError> {
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if m.is_empty() || !m.chars().all(tchar) {
        return Err(PolicyError::new(
            "methods",
            format!(
                "{m:?} is not a method: a method is a token (letters, digits and !#$%&'*+-.^_`|~)"
            ),
        ));
    }
    if is_idempotent_method(m) {
        return Err(PolicyError::new(
            "methods",
            format!("{m} is idempotent by itself and never needs a key: list only methods that are not (POST, PATCH)"),
        ));
    }
    let upper = m.to_ascii_uppercase();
    let known = is_idempotent_method(&upper) || matches!(upper.as_str(), "POST" | "PATCH");
    if upper != m && known {
        return Err(PolicyError::new(
            "methods",
            format!("methods are case-sensitive: {m:?} is not {upper:?}"),
        ));
    }
    if m == "CONNECT" {
        return Err(PolicyError::new(
            "methods",
            "CONNECT opens a tunnel, which has no response to record",
        ));
    }
    Ok(())
}

/// What makes two requests under one key the same request: one SHA-256 over
/// the method, the target and the body (each delimited, so no two requests
/// share an input), 32 bytes however large the request.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    pub sha256: [u8; 32],
}

impl Fingerprint {
    /// The fingerprint of a request whose body is still streaming to the
    /// upstream ([`IdempotencyStore::claim`]): until the body has passed
    /// whole, its record is of the key alone and matches any request.
    pub const PENDING: Fingerprint = Fingerprint { sha256: [0; 32] };

    pub fn is_pending(&self) -> bool {
        *self == Self::PENDING
    }

    /// The fingerprint of a request whose body is all in `body`.
    pub fn new(method: &str, target: &str, body: &[u8]) -> Self {
        let mut h = FingerprintHasher::new(method, target);
        h.update(body);
        h.finish()
    }

    /// The hash in lower-case hex.
    pub fn hex(&self) -> String {
        self.sha256.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

/// A [`Fingerprint`] in the making: the body is fed as it streams, with no
/// size limit.
#[derive(Debug, Clone)]
pub struct FingerprintHasher {
    sha: Sha256,
}

impl FingerprintHasher {
    /// Starts with the method and the target (path and query as sent).
    pub fn new(method: impl AsRef<[u8]>, target: impl AsRef<[u8]>) -> Self {
        let mut sha = Sha256::new();
        // Lengths first: "POST" + "/ab" never hashes like "POST/" + "ab".
        // A usual head goes in as one piece (the same input, fewer copies).
        let (m, t) = (method.as_ref(), target.as_ref());
        let mut head = [0u8; 256];
        if let Some(h) = head.get_mut(..16 + m.len() + t.len()) {
            let (ml, rest) = h.split_at_mut(8);
            ml.copy_from_slice(&(m.len() as u64).to_be_bytes());
            let (mb, rest) = rest.split_at_mut(m.len());
            mb.copy_from_slice(m);
            let (tl, tb) = rest.split_at_mut(8);
            tl.copy_from_slice(&(t.len() as u64).to_be_bytes());
            tb.copy_from_slice(t);
            sha.update(h);
        } else {
            for part in [m, t] {
                sha.update((part.len() as u64).to_be_bytes());
                sha.update(part);
            }
        }
        FingerprintHasher { sha }
    }

    /// Feeds the next chunk of the body.
    pub fn update(&mut self, chunk: &[u8]) {
        self.sha.update(chunk);
    }

    pub fn finish(self) -> Fingerprint {
        Fingerprint {
            sha256: self.sha.finalize().into(),
        }
    }
}

/// A response kept for replay: what the upstream sent, weir's own
/// annotations and the framing not included. One buffer (one allocation,
/// and none to split it): the header fields in the order received, each
/// `name: value\r\n`, then the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    buf: Bytes,
    fields_len: usize,
}

impl StoredResponse {
    /// A response from its fields as (name, value) pairs.
    pub fn new<'a>(
        status: u16,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        body: &[u8],
    ) -> Self {
        let mut block = Vec::new();
        for (n, v) in fields {
            push_field(&mut block, n, v);
        }
        let fields_len = block.len();
        block.extend_from_slice(body);
        Self::from_buffer(status, block, fields_len)
    }

    /// A response from its field block and body as they were kept.
    pub fn from_block(status: u16, fields: &[u8], body: &[u8]) -> Self {
        let mut buf = Vec::with_capacity(fields.len() + body.len());
        buf.extend_from_slice(fields);
        buf.extend_from_slice(body);
        Self::from_buffer(status, buf, fields.len())
    }

    /// A response from one buffer holding the field block (its first
    /// `fields_len` bytes, clamped to the buffer), then the body. A buffer
    /// with no spare capacity becomes the record without a copy.
    pub fn from_buffer(status: u16, buf: Vec<u8>, fields_len: usize) -> Self {
        StoredResponse {
            status,
            fields_len: fields_len.min(buf.len()),
            buf: Bytes::from(buf),
        }
    }

    /// The field block: `name: value\r\n` lines.
    pub fn field_block(&self) -> &[u8] {
        &self.buf[..self.fields_len]
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.buf[self.fields_len..]
    }

    /// The body, sharing the record's buffer.
    pub fn body_bytes(&self) -> Bytes {
        self.buf.slice(self.fields_len..)
    }

    /// The fields as (name, value) pairs (not the trailers).
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines()
            .filter(|l| !l.starts_with(b":"))
            .filter_map(split_field)
    }

    /// The trailers as (name, value) pairs: kept in the field block, each
    /// name marked with a leading `:` (no field name can start with one),
    /// so that every store keeps them as it keeps the fields.
    pub fn trailers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines()
            .filter_map(|l| l.strip_prefix(b":"))
            .filter_map(split_field)
    }

    /// Whether it was kept with trailers.
    pub fn has_trailers(&self) -> bool {
        self.trailers().next().is_some()
    }

    fn lines(&self) -> impl Iterator<Item = &[u8]> {
        self.field_block()
            .split(|b| *b == b'\n')
            .filter_map(|line| line.strip_suffix(b"\r"))
    }

    /// Its accounted size: the field block and the body.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }
}

/// A `name: value` line's name and value.
fn split_field(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = line.iter().position(|b| *b == b':')?;
    Some((&line[..colon], line.get(colon + 2..).unwrap_or_default()))
}

/// A block of trailers, each `:name: value\r\n` (see
/// [`StoredResponse::trailers`]).
pub fn trailer_block<'a>(trailers: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in trailers {
        block.push(b':');
        push_field(&mut block, n, v);
    }
    block
}

/// Appends `name: value\r\n` to a field block.
pub fn push_field(block: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    block.extend_from_slice(name);
    block.extend_from_slice(b": ");
    block.extend_from_slice(value);
    block.extend_from_slice(b"\r\n");
}

/// Where a key's request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryState {
    /// Forwarded at `since`; no outcome yet.
    InFlight { since: Now },
    /// The last attempt may or may not have been processed.
    Uncertain,
    /// Done, with the response to replay.
    Completed(StoredResponse),
    /// Done, but the response was too large, streamed or an upgrade.
    CompletedNotReplayable,
}

/// The record of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub fingerprint: Fingerprint,
    pub state: EntryState,
    /// The record counts as absent from this instant on: `ttl` after it was
    /// last written (an in-flight record's expiry is only a backstop against
    /// a request that never reports its end).
    pub expires: Now,
}

impl Entry {
    pub fn new(fingerprint: Fingerprint, state: EntryState, expires: Now) -> Self {
        Entry {
            fingerprint,
            state,
            expires,
        }
    }

    pub fn expired(&self, now: Now) -> bool {
        now >= self.expires
    }

    /// Its accounted size under `key` (see the module doc).
    pub fn bytes(&self, key_len: usize) -> usize {
        let response = match &self.state {
            EntryState::Completed(r) => r.bytes(),
            _ => 0,
        };
        ENTRY_OVERHEAD + key_len + response
    }
}

/// What to do with a keyed request. `R` is how a replay holds the stored
/// response: a reference from [`decide`], a (cheap, shared) clone from a
/// store ([`Begin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<R> {
    /// No live record, or an uncertain one for this request: record it in
    /// flight and forward it (retries as usual).
    Forward,
    /// The same request is in flight: 409 `idempotency_in_flight`.
    InFlight,
    /// Answer with the stored response; the upstream sees nothing.
    Replay(R),
    /// The key was used for a different request: 422 `idempotency_key_reused`.
    Reused,
    /// Done, but nothing to replay: 409 `idempotency_not_replayable`.
    NotReplayable,
}

/// A store's answer to [`IdempotencyStore::begin`].
pub type Begin = Action<StoredResponse>;

impl<R> Action<R> {
    /// The action's name in fixtures and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Forward => "forward",
            Action::InFlight => "in_flight",
            Action::Replay(_) => "replay",
            Action::Reused => "reused",
            Action::NotReplayable => "not_replayable",
        }
    }

    /// weir's error for a refusal, (status, code); `None` for forward and replay.
    pub fn refusal(&self) -> Option<(u16, &'static str)> {
        match self {
            Action::InFlight => Some((409, "idempotency_in_flight")),
            Action::Reused => Some((422, "idempotency_key_reused")),
            Action::NotReplayable => Some((409, "idempotency_not_replayable")),
            Action::Forward | Action::Replay(_) => None,
        }
    }

    /// The `Retry-After` a refusal carries: 1 s while the request is in flight.
    pub fn retry_after(&self) -> Option<Duration> {
        matches!(self, Action::InFlight).then_some(Duration::from_secs(1))
    }

    pub fn map<S>(self, f: impl FnOnce(R) -> S) -> Action<S> {
        match self {
            Action::Forward => Action::Forward,
            Action::InFlight => Action::InFlight,
            Action::Replay(r) => Action::Replay(f(r)),
            Action::Reused => Action::Reused,
            Action::NotReplayable => Action::NotReplayable,
        }
    }
}

/// The decision for a request with `fingerprint` whose key's record is
/// `entry` (`None`: no record). An expired record counts as absent; a record
/// of a different request is [`Action::Reused`] whatever its state.
pub fn decide<'a>(
    entry: Option<&'a Entry>,
    fingerprint: &Fingerprint,
    now: Now,
) -> Action<&'a StoredResponse> {
    let Some(e) = entry.filter(|e| !e.expired(now)) else {
        return Action::Forward;
    };
    if e.fingerprint != *fingerprint && !e.fingerprint.is_pending() {
        return Action::Reused;
    }
    match &e.state {
        EntryState::InFlight { .. } => Action::InFlight,
        EntryState::Uncertain => Action::Forward,
        EntryState::Completed(r) => Action::Replay(r),
        EntryState::CompletedNotReplayable => Action::NotReplayable,
    }
}

/// How a forwarded keyed request ended, as the data plane saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Ending {
    /// The upstream answered `status`. `replayable`: the whole response was
    /// read, within `max_response_bytes`, without trailers, and it is not a
    /// stream (SSE, gRPC) or an upgrade.
    Response { status: u16, replayable: bool },
    /// The request certainly was not processed, or weir answered with one
    /// of its own errors that is not uncertain: connect failure, refused
    /// stream, reset before anything was written, admission refusals.
    Failed,
    /// The last attempt timed out or was reset after the request was
    /// (partly) written: it may have been processed.
    Uncertain,
    /// The client went away while the request was in flight.
    ClientGone,
}

/// How a keyed gRPC call ended, by its status (docs/reference/idempotency.md#grpc):
/// one that says the call was not processed (`UNAVAILABLE`,
/// `RESOURCE_EXHAUSTED`) is a failure, forgotten so that a repeat is
/// forwarded; `CANCELLED` and `DEADLINE_EXCEEDED` may have been processed
/// (uncertain: the repeat is forwarded again); any other is judged as the
/// HTTP status it stands for is (`INTERNAL` as a 500: forgotten; `OK`, or a
/// client error such as `NOT_FOUND`: completed, and replayed).
pub fn grpc_ending(code: u8, replayable: bool) -> Ending {
    use super::grpc::{http_equivalent, not_processed};
    match code {
        _ if not_processed(code) => Ending::Failed,
        1 | 4 => Ending::Uncertain,
        _ => Ending::Response {
            status: http_equivalent(code),
            replayable,
        },
    }
}

/// What an [`Ending`] leaves in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    /// [`IdempotencyStore::complete`] with the response.
    Completed,
    /// [`IdempotencyStore::complete_unreplayable`].
    CompletedNotReplayable,
    /// [`IdempotencyStore::forget`]: the key can be tried again.
    Forget,
    /// [`IdempotencyStore::uncertain`].
    Uncertain,
}

/// Whether a response with `status` is final for its key: one no retry
/// would change — 2xx, 3xx, and 4xx except 408, 409, 425 and 429.
pub fn recordable(status: u16) -> bool {
    matches!(status, 200..=499) && !matches!(status, 408 | 409 | 425 | 429)
}

/// What to record when a keyed request ends. A `101` (an upgrade that
/// happened) is done but never replayable.
pub fn record(ending: Ending) -> Record {
    match ending {
        Ending::Response { status: 101, .. } => Record::CompletedNotReplayable,
        Ending::Response { status, replayable } if recordable(status) => match replayable {
            true => Record::Completed,
            false => Record::CompletedNotReplayable,
        },
        Ending::Response { .. } | Ending::Failed => Record::Forget,
        Ending::Uncertain | Ending::ClientGone => Record::Uncertain,
    }
}

/// A store's size and counters, for metrics (`weir_idempotency_total`'s
/// `result` label is each counter's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct IdempotencyStats {
    /// Records held now, of every state.
    pub entries: usize,
    /// Their accounted bytes.
    pub bytes: usize,
    /// Outcomes recorded (completed, replayable or not).
    pub stored: u64,
    /// Repeats answered from a record.
    pub replayed: u64,
    /// Repeats refused while the first was in flight.
    pub in_flight: u64,
    /// Requests refused because the key was used for a different request.
    pub reused: u64,
    /// Repeats refused because the record holds no response.
    pub not_replayable: u64,
    /// Records evicted to stay within `max_bytes`.
    pub evicted: u64,
    /// Records dropped because their `ttl` had passed.
    pub expired: u64,
}

impl IdempotencyStats {
    /// Adds another store's counters (the fleet's, to the instance's own).
    pub fn add(&mut self, o: &IdempotencyStats) {
        self.stored += o.stored;
        self.replayed += o.replayed;
        self.in_flight += o.in_flight;
        self.reused += o.reused;
        self.not_replayable += o.not_replayable;
        self.evicted += o.evicted;
        self.expired += o.expired;
    }

    /// Counts a decision a store made.
    pub fn count<R>(&mut self, a: &Action<R>) {
        match a {
            Action::Forward => {}
            Action::InFlight => self.in_flight += 1,
            Action::Replay(_) => self.replayed += 1,
            Action::Reused => self.reused += 1,
            Action::NotReplayable => self.not_replayable += 1,
        }
    }
}

/// A store's answer to [`IdempotencyStore::claim`]: what a keyed request
/// whose body is too large to hold gets before its fingerprint is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// No live record, or an uncertain one: recorded in flight with a
    /// [`Fingerprint::PENDING`] fingerprint; forward the body as it streams
    /// and report its fingerprint when it has passed whole
    /// ([`IdempotencyStore::fingerprinted`]).
    Forward,
    /// The key is in flight: 409, whatever the body.
    InFlight,
    /// The key is done: read the whole body for its fingerprint, then
    /// [`IdempotencyStore::begin`] says replay, reused or not replayable.
    Decide,
}

/// An idempotency store: the records of one upstream's keys.
///
/// The calls after [`begin`](Self::begin) returned [`Action::Forward`]
/// (`complete`, `complete_unreplayable`, `uncertain`, `forget`) act only on a
/// record in flight, and do nothing otherwise (it expired meanwhile).
pub trait IdempotencyStore: Send + fmt::Debug {
    /// Decides on a keyed request ([`decide`]) and, when it is to be
    /// forwarded, records it in flight — one atomic step.
    fn begin(&mut self, key: &str, fingerprint: &Fingerprint, now: Now) -> Begin;
    /// For a request whose body streams: claims the key in flight when it
    /// has no live record or an uncertain one, atomically like `begin`.
    fn claim(&mut self, key: &str, now: Now) -> Claim;
    /// The fingerprint of a claimed request, once its body has streamed
    /// whole; acts only on an in-flight record with a pending fingerprint.
    fn fingerprinted(&mut self, key: &str, fingerprint: &Fingerprint);
    /// Records the response to replay (as not replayable when too large).
    fn complete(&mut self, key: &str, response: StoredResponse, now: Now);
    /// Records the key as done, with nothing to replay.
    fn complete_unreplayable(&mut self, key: &str, now: Now);
    /// Records that the request may or may not have been processed.
    fn uncertain(&mut self, key: &str, now: Now);
    /// Drops the record: the key may be tried again.
    fn forget(&mut self, key: &str);
    /// Drops expired records.
    fn sweep(&mut self, now: Now);
    fn stats(&self) -> IdempotencyStats;

    /// The call [`record`] says to make.
    fn finish(&mut self, key: &str, what: Record, response: Option<StoredResponse>, now: Now) {
        match (what, response) {
            (Record::Completed, Some(r)) => self.complete(key, r, now),
            (Record::Completed | Record::CompletedNotReplayable, _) => {
                self.complete_unreplayable(key, now)
            }
            (Record::Forget, _) => self.forget(key),
            (Record::Uncertain, _) => self.uncertain(key, now),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_call_not_processed_is_forgotten_and_ok_is_kept() {
        let rec = |c| record(grpc_ending(c, true));
        assert_eq!(rec(0), Record::Completed);
        assert_eq!(rec(5), Record::Completed);
        assert_eq!(rec(14), Record::Forget);
        assert_eq!(rec(8), Record::Forget);
        assert_eq!(rec(13), Record::Forget);
        assert_eq!(rec(10), Record::Forget);
        assert_eq!(rec(4), Record::Uncertain);
        assert_eq!(rec(1), Record::Uncertain);
        assert_eq!(
            record(grpc_ending(0, false)),
            Record::CompletedNotReplayable
        );
    }

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn fp(body: &str) -> Fingerprint {
        Fingerprint::new("POST", "/charge", body.as_bytes())
    }

    fn response() -> StoredResponse {
        StoredResponse::new(201, [(&b"content-type"[..], &b"text/plain"[..])], b"ok")
    }

    #[test]
    fn fingerprint_of_a_streamed_body_is_that_of_the_whole() {
        let whole = Fingerprint::new("POST", "/a?x=1", b"hello world");
        let mut h = FingerprintHasher::new("POST", "/a?x=1");
        for chunk in [&b"hel"[..], b"", b"lo w", b"orld"] {
            h.update(chunk);
        }
        assert_eq!(h.finish(), whole);
        assert_ne!(Fingerprint::new("PATCH", "/a?x=1", b"hello world"), whole);
        assert_ne!(Fingerprint::new("POST", "/a?x=2", b"hello world"), whole);
        assert_ne!(Fingerprint::new("POST", "/a?x=1", b"hello worle"), whole);
        // The parts are delimited: moving a byte from one to the next changes it.
        assert_ne!(
            Fingerprint::new("POST", "/a", b"b"),
            Fingerprint::new("POST", "/ab", b"")
        );
        assert_ne!(
            Fingerprint::new("POS", "T/a", b""),
            Fingerprint::new("POST", "/a", b"")
        );
        assert!(format!("{whole:?}").starts_with("sha256:"));
        assert_eq!(whole.hex().len(), 64);
    }

    /// The fingerprint is SHA-256 over (u64 BE length, method, u64 BE
    /// length, target, body), whether the head goes in as one piece or, for
    /// a long target, part by part (digests from Python's hashlib).
    #[test]
    fn fingerprint_is_sha256_of_the_delimited_parts() {
        let short = Fingerprint::new("POST", "/orders?x=1", br#"{"a":1}"#);
        assert_eq!(
            short.hex(),
            "d5133d28b9a58d49067906365618cadd13f7584f240422905652e11f008a031b"
        );
        let long = format!("/{}", "p".repeat(300));
        assert_eq!(
            Fingerprint::new("POST", &long, b"body").hex(),
            "0d22f233a89952a2382c4c4124a55eadeb58ee0bcca8dc9138693d476c0b93f4"
        );
    }

    #[test]
    fn keys_are_1_to_255_bytes_of_utf8() {
        assert_eq!(parse_key(b"k-1"), Some("k-1"));
        assert_eq!(parse_key(&[b'a'; 255]).map(str::len), Some(255));
        assert_eq!(parse_key(&[b'a'; 256]), None);
        assert_eq!(parse_key(b""), None);
        assert_eq!(parse_key(&[0xff, 0xfe]), None);
    }

    #[test]
    fn decide_every_transition() {
        let me = fp("a");
        let other = fp("b");
        let entry = |state| Entry::new(me, state, s(100));
        let in_flight = entry(EntryState::InFlight { since: s(0) });
        let uncertain = entry(EntryState::Uncertain);
        let done = entry(EntryState::Completed(response()));
        let unreplayable = entry(EntryState::CompletedNotReplayable);
        let now = s(10);
        let name = |e: Option<&Entry>, f: &Fingerprint| decide(e, f, now).name();
        assert_eq!(name(None, &me), "forward");
        assert_eq!(name(Some(&in_flight), &me), "in_flight");
        assert_eq!(name(Some(&uncertain), &me), "forward");
        assert_eq!(decide(Some(&done), &me, now), Action::Replay(&response()));
        assert_eq!(name(Some(&unreplayable), &me), "not_replayable");
        // A different request under the key: 422 whatever the state.
        for e in [&in_flight, &uncertain, &done, &unreplayable] {
            assert_eq!(name(Some(e), &other), "reused");
        }
        // An expired record is no record, for any request.
        for e in [&in_flight, &uncertain, &done, &unreplayable] {
            assert_eq!(decide(Some(e), &me, s(100)), Action::Forward);
            assert_eq!(decide(Some(e), &other, s(101)), Action::Forward);
        }
    }

    #[test]
    fn refusals_carry_their_status_and_code() {
        let a = |x: Action<()>| (x.refusal(), x.retry_after());
        assert_eq!(a(Action::Forward), (None, None));
        assert_eq!(a(Action::Replay(())), (None, None));
        assert_eq!(
            a(Action::InFlight),
            (Some((409, "idempotency_in_flight")), Some(s(1)))
        );
        assert_eq!(
            a(Action::Reused),
            (Some((422, "idempotency_key_reused")), None)
        );
        assert_eq!(
            a(Action::NotReplayable),
            (Some((409, "idempotency_not_replayable")), None)
        );
    }

    #[test]
    fn what_is_recorded() {
        for st in [200, 201, 204, 301, 304, 400, 401, 403, 404, 410, 422, 499] {
            assert!(recordable(st), "{st}");
            let r = |replayable| {
                record(Ending::Response {
                    status: st,
                    replayable,
                })
            };
            assert_eq!(r(true), Record::Completed, "{st}");
            assert_eq!(r(false), Record::CompletedNotReplayable, "{st}");
        }
        for st in [
            100, 101, 199, 408, 409, 425, 429, 500, 502, 503, 504, 599, 600,
        ] {
            assert!(!recordable(st), "{st}");
        }
        for st in [408, 409, 425, 429, 500, 503, 100, 600] {
            let e = Ending::Response {
                status: st,
                replayable: true,
            };
            assert_eq!(record(e), Record::Forget, "{st}");
        }
        let upgrade = Ending::Response {
            status: 101,
            replayable: true,
        };
        assert_eq!(record(upgrade), Record::CompletedNotReplayable);
        assert_eq!(record(Ending::Failed), Record::Forget);
        assert_eq!(record(Ending::Uncertain), Record::Uncertain);
        assert_eq!(record(Ending::ClientGone), Record::Uncertain);
    }

    #[test]
    fn params_are_validated() {
        let m = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ok = IdempotencyParams::try_new(s(60), 100, 100, &m(&["POST", "PATCH", "LOCK"]));
        let p = ok.unwrap();
        assert!(p.applies_to("POST") && p.applies_to("LOCK"));
        assert!(!p.applies_to("post") && !p.applies_to("GET"));
        let err = |ttl, max, resp, methods: &[&str]| {
            IdempotencyParams::try_new(ttl, max, resp, &m(methods)).unwrap_err()
        };
        assert_eq!(err(s(0), 1, 1, &["POST"]).field, "ttl");
        assert_eq!(err(s(1), 0, 0, &["POST"]).field, "max_bytes");
        assert_eq!(err(s(1), 10, 11, &["POST"]).field, "max_response_bytes");
        assert_eq!(err(s(1), 10, 1, &[]).field, "methods");
        for (method, needle) in [
            ("GET", "idempotent by itself"),
            ("PUT", "never needs a key"),
            ("DELETE", "idempotent by itself"),
            ("PO ST", "not a method"),
            ("", "not a method"),
            ("post", "case-sensitive"),
            ("CONNECT", "tunnel"),
        ] {
            let e = err(s(1), 10, 1, &["POST", method]);
            assert_eq!(e.field, "methods");
            assert!(e.message.contains(needle), "{method}: {}", e.message);
        }
    }
}
