//! The idempotency store on Redis (docs/reference/fleet.md#fleet-state): the same
//! contract as `policy::idempotency::IdempotencyStore` — `begin` decides
//! ([`decide`](crate::policy::idempotency::decide)'s table) and records *in
//! flight* in one atomic step; the finishing calls act only on a record in
//! flight — as async calls, so that a key re-sent through another instance
//! is answered from the same record.
//!
//! Key: `{prefix}idem:{upstream}:{key}`. A hash:
//!
//! | field | holds |
//! |---|---|
//! | `s` | the state: `f` in flight, `u` uncertain, `c` completed, `n` completed but not replayable |
//! | `fp` | the request's fingerprint, its 32 SHA-256 bytes; 32 zero bytes ([`Fingerprint::PENDING`]) while a claimed request's body streams |
//! | `o` | in flight: the owner's instance id |
//! | `st`, `h`, `b` | completed: the status (decimal), the field block (`name: value\r\n` each), the body |
//!
//! An in-flight record expires after the lease `begin` (or `claim`) is
//! given (so a key whose instance died is free again); every other after
//! `ttl` from its last write. A finishing call writes only a record in
//! flight owned by this instance with the same fingerprint, or a pending
//! one (the lease may have run out and another request taken the key). A
//! request whose body streams claims the key before its fingerprint is known
//! ([`Fleet::idempotency_claim`], then [`Fleet::idempotency_fingerprinted`]);
//! a record with a pending fingerprint matches any request, as in
//! `decide`. There is no `max_bytes` bound here: Redis's own `maxmemory`
//! and the record's `ttl` bound the store.

use super::{px, Fleet, StateError};
use crate::policy::idempotency::{Action, Begin, Claim, Fingerprint, Record, StoredResponse};
use bytes::Bytes;
use redis::{Script, Value};
use std::sync::LazyLock;
use std::time::Duration;

/// ARGV: fingerprint, owner, lease ms. Returns {'forward'}, {'in_flight'},
/// {'reused'}, {'not_replayable'} or {'replay', status, fields, body}.
static BEGIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local r = redis.call('HMGET', KEYS[1], 's', 'fp')
local s, fp = r[1], r[2]
if s and fp ~= ARGV[1] and fp ~= string.rep('\0', 32) then return {'reused'} end
if (not s) or s == 'u' then
  if s then redis.call('DEL', KEYS[1]) end
  redis.call('HSET', KEYS[1], 's', 'f', 'fp', ARGV[1], 'o', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'forward'}
end
if s == 'f' then return {'in_flight'} end
if s == 'n' then return {'not_replayable'} end
if s == 'c' then
  local x = redis.call('HMGET', KEYS[1], 'st', 'h', 'b')
  return {'replay', x[1], x[2], x[3]}
end
return redis.error_reply('weir: unknown idempotency record state')
",
    )
});

/// ARGV: owner, lease ms. Claims the key for a request whose body streams:
/// 'forward' (recorded in flight with a pending fingerprint), 'in_flight',
/// or 'decide' (done: the caller reads the body whole and calls `begin`).
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local s = redis.call('HGET', KEYS[1], 's')
if s == 'f' then return 'in_flight' end
if s == 'c' or s == 'n' then return 'decide' end
if s and s ~= 'u' then return redis.error_reply('weir: unknown idempotency record state') end
if s then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], 's', 'f', 'fp', string.rep('\0', 32), 'o', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 'forward'
",
    )
});

/// ARGV: owner, fingerprint. Fills in the fingerprint of this owner's
/// claimed record. 1 if it did.
static FINGERPRINTED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local r = redis.call('HMGET', KEYS[1], 's', 'o', 'fp')
if r[1] ~= 'f' or r[2] ~= ARGV[1] or r[3] ~= string.rep('\0', 32) then return 0 end
redis.call('HSET', KEYS[1], 'fp', ARGV[2])
return 1
",
    )
});

/// ARGV: owner, fingerprint, what ('c', 'n', 'u' or 'forget'), ttl ms,
/// then for 'c' status, fields, body. 1 if a record in flight of this owner
/// with this fingerprint was written, else 0 (a pending fingerprint on
/// either side — a claimed request's, before or after its body passed —
/// matches: the owner's id is what makes the record this request's).
static FINISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local r = redis.call('HMGET', KEYS[1], 's', 'o', 'fp')
if r[1] ~= 'f' or r[2] ~= ARGV[1] then return 0 end
local pending = string.rep('\0', 32)
if r[3] ~= ARGV[2] and r[3] ~= pending and ARGV[2] ~= pending then return 0 end
if ARGV[3] == 'forget' then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('HDEL', KEYS[1], 'o')
if ARGV[3] == 'c' then
  redis.call('HSET', KEYS[1], 's', 'c', 'st', ARGV[5], 'h', ARGV[6], 'b', ARGV[7])
else
  redis.call('HSET', KEYS[1], 's', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
",
    )
});

fn bulk(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        _ => None,
    }
}

/// A replay's stored response from the script's answer.
fn stored(parts: &[Value]) -> Option<StoredResponse> {
    let [status, fields, body] = parts else {
        return None;
    };
    let status: u16 = std::str::from_utf8(bulk(status)?).ok()?.parse().ok()?;
    if !(100..=599).contains(&status) {
        return None;
    }
    Some(StoredResponse::from_block(
        status,
        bulk(fields)?,
        bulk(body)?,
    ))
}

impl Fleet {
    fn idempotency_key(&self, upstream: &str, key: &str) -> String {
        self.key("idem", upstream, &[key])
    }

    /// Decides on a keyed request to `upstream` with `fingerprint` and, when
    /// it is to be forwarded, records it in flight, owned by this instance,
    /// for `lease` (the request's deadline plus the time to read its
    /// response: past it, the key counts as free) — one atomic step.
    pub async fn idempotency_begin(
        &self,
        upstream: &str,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Begin, StateError> {
        let k = self.idempotency_key(upstream, key);
        let fp = fingerprint.sha256;
        let owner = self.instance_id().to_string();
        let ms = px(lease);
        let (v, acked): (Value, bool) = self
            .call_durable("idempotency_begin", |mut c| async move {
                BEGIN
                    .key(&k)
                    .arg(&fp[..])
                    .arg(&owner)
                    .arg(ms)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let bad = || StateError::Malformed(format!("idempotency begin {v:?}"));
        let Value::Array(parts) = &v else {
            return Err(bad());
        };
        let Some((tag, rest)) = parts.split_first() else {
            return Err(bad());
        };
        Ok(match (bulk(tag).ok_or_else(bad)?, rest) {
            // Only a forward wrote anything: the claim must have reached
            // the replicas before the request goes upstream.
            (b"forward", []) if !acked => return Err(StateError::Unreplicated),
            (b"forward", []) => Action::Forward,
            (b"in_flight", []) => Action::InFlight,
            (b"reused", []) => Action::Reused,
            (b"not_replayable", []) => Action::NotReplayable,
            (b"replay", r) => Action::Replay(stored(r).ok_or_else(bad)?),
            _ => return Err(bad()),
        })
    }

    /// For a keyed request whose body streams (too large to hold):
    /// claims the key in flight with a pending fingerprint for `lease` when
    /// it has no live record or an uncertain one — atomically, like
    /// [`Fleet::idempotency_begin`]. Report the fingerprint once the body
    /// has passed whole ([`Fleet::idempotency_fingerprinted`]).
    pub async fn idempotency_claim(
        &self,
        upstream: &str,
        key: &str,
        lease: Duration,
    ) -> Result<Claim, StateError> {
        let k = self.idempotency_key(upstream, key);
        let owner = self.instance_id().to_string();
        let ms = px(lease);
        let (v, acked): (Value, bool) = self
            .call_durable("idempotency_begin", |mut c| async move {
                CLAIM.key(&k).arg(&owner).arg(ms).invoke_async(&mut c).await
            })
            .await?;
        match bulk(&v) {
            Some(b"forward") if !acked => Err(StateError::Unreplicated),
            Some(b"forward") => Ok(Claim::Forward),
            Some(b"in_flight") => Ok(Claim::InFlight),
            Some(b"decide") => Ok(Claim::Decide),
            _ => Err(StateError::Malformed(format!("idempotency claim {v:?}"))),
        }
    }

    /// The fingerprint of this instance's claimed request, once its body
    /// has streamed whole. Returns whether the record took it.
    pub async fn idempotency_fingerprinted(
        &self,
        upstream: &str,
        key: &str,
        fingerprint: &Fingerprint,
    ) -> Result<bool, StateError> {
        let k = self.idempotency_key(upstream, key);
        let owner = self.instance_id().to_string();
        let fp = fingerprint.sha256;
        let n: i64 = self
            .call_in_turn("idempotency_finish", |mut c| async move {
                FINGERPRINTED
                    .key(&k)
                    .arg(&owner)
                    .arg(&fp[..])
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    /// The call `record` says to make when a keyed request ends
    /// (`IdempotencyStore::finish`): `response` with
    /// [`Record::Completed`] (without one, completed but not replayable).
    /// Returns whether this instance's record in flight was written. With
    /// `wait_replicas` set, a completed record is acknowledged by the
    /// replicas before this returns (the caller holds the response until
    /// then); one that was not is counted, and the response goes out all
    /// the same — the upstream has processed the write, and the answer is
    /// the client's.
    pub async fn idempotency_finish(
        &self,
        upstream: &str,
        key: &str,
        fingerprint: &Fingerprint,
        what: Record,
        response: Option<&StoredResponse>,
        ttl: Duration,
    ) -> Result<bool, StateError> {
        let (mode, response) = match (what, response) {
            (Record::Completed, Some(r)) => ("c", Some(r)),
            (Record::Completed | Record::CompletedNotReplayable, _) => ("n", None),
            (Record::Uncertain, _) => ("u", None),
            (Record::Forget, _) => ("forget", None),
        };
        let op = match mode {
            "forget" => "idempotency_forget",
            _ => "idempotency_finish",
        };
        let k = self.idempotency_key(upstream, key);
        let fp = fingerprint.sha256;
        let owner = self.instance_id().to_string();
        let ms = px(ttl);
        let (status, fields, body) = match response {
            Some(r) => (
                r.status.to_string(),
                Bytes::copy_from_slice(r.field_block()),
                r.body_bytes(),
            ),
            None => (String::new(), Bytes::new(), Bytes::new()),
        };
        let durable = matches!(mode, "c" | "n");
        let call = |mut c: super::RedisConn| async move {
            let mut inv = FINISH.key(&k);
            inv.arg(&owner).arg(&fp[..]).arg(mode).arg(ms);
            if mode == "c" {
                inv.arg(&status).arg(&fields[..]).arg(&body[..]);
            }
            inv.invoke_async(&mut c).await
        };
        let n: i64 = match durable {
            true => self.call_durable(op, call).await?.0,
            false => self.call_in_turn(op, call).await?,
        };
        Ok(n == 1)
    }

    /// Records the response to replay for `ttl`.
    pub async fn idempotency_complete(
        &self,
        upstream: &str,
        key: &str,
        fingerprint: &Fingerprint,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<bool, StateError> {
        let what = Record::Completed;
        self.idempotency_finish(upstream, key, fingerprint, what, Some(response), ttl)
            .await
    }

    /// Records the key as done, with nothing to replay, for `ttl`.
    pub async fn idempotency_complete_unreplayable(
        &self,
        upstream: &str,
        key: &str,
        fingerprint: &Fingerprint,
        ttl: Duration,
    ) -> Result<bool, StateError> {
        let what = Record::CompletedNotReplayable;
        self.idempotency_finish(upstream, key, fingerprint, what, None, ttl)
            .await
    }

    /// Records that the request may or may not have been processed, for
    /// `ttl`: the same request is forwarded again.
    pub async fn idempotency_uncertain(
        &self,
        upstream: &str,
        key: &str,
        fingerprint: &Fingerprint,
        ttl: Duration,
    ) -> Result<bool, StateError> {
        let what = Record::Uncertain;
        self.idempotency_finish(upstream, key, fingerprint, what, None, ttl)
            .await
    }

    /// Drops this instance's record in flight: the key may be tried again.
    pub async fn idempotency_forget(
        &self,
        upstream: &str,
        key: &str,
        fingerprint: &Fingerprint,
    ) -> Result<bool, StateError> {
        let what = Record::Forget;
        let ttl = Duration::from_millis(1);
        self.idempotency_finish(upstream, key, fingerprint, what, None, ttl)
            .await
    }
}
