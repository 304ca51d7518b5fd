//! The shared breaker (docs/reference/fleet.md#fleet-state): each instance still
//! counts its own attempts and trips on its own evidence; a trip is
//! *published*, every instance reads the published trips once per
//! `refresh` ([`Fleet::refresh`]) and opens until the published expiry,
//! and one half-open probe is owned fleet-wide per open interval
//! ([`Fleet::claim_probe`]). A closed breaker makes no call.
//!
//! Keys, per upstream: `{prefix}breaker:{upstream}:open` — the owner's
//! instance id, expiring (`PX`) when the fleet may probe; and
//! `{prefix}breaker:{upstream}:probe` — the instance id of the one probe's
//! owner (`PX` the probe lease), or `closed` for a while after its probe
//! succeeded.

use super::{pttl, px, Fleet, StateError};
use redis::{Script, Value};
use std::sync::LazyLock;
use std::time::Duration;

/// Publishes a trip: sets the open key for `ARGV[2]` ms unless it already
/// lasts at least that long (a trip only ever extends the open interval),
/// and clears the probe key (a new interval, a new probe). 1 if it wrote.
static OPEN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ms = tonumber(ARGV[2])
if redis.call('PTTL', KEYS[1]) >= ms then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ms)
redis.call('DEL', KEYS[2])
return 1
",
    )
});

/// Claims the probe: refused while the fleet is open ({'open', ms left});
/// won by the first (`SET NX PX`, {'won', 0}); else {'closed', 0} after a
/// probe succeeded, or {'held', ms left} while another instance probes.
static PROBE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local left = redis.call('PTTL', KEYS[1])
if left > 0 then return {'open', left} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'won', 0} end
if redis.call('GET', KEYS[2]) == 'closed' then return {'closed', 0} end
return {'held', math.max(redis.call('PTTL', KEYS[2]), 0)}
",
    )
});

/// The probe's owner closes the fleet's breaker: the open key goes, and the
/// probe key reads `closed` for `ARGV[2]` ms. 1 if this instance owned it.
static CLOSE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], 'closed', 'PX', ARGV[2])
return 1
",
    )
});

/// The answer to [`Fleet::claim_probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeClaim {
    /// This instance owns the probe for this open interval: send it.
    Won,
    /// Another instance is probing: stay half-open, refuse (`Retry-After`
    /// at most `retry_in`, when its lease runs out).
    Held { retry_in: Duration },
    /// The fleet's breaker is open again for `remaining` (another instance
    /// tripped, or the probe failed): open for that long.
    Open { remaining: Duration },
    /// Another instance's probe succeeded: close without probing.
    Closed,
}

impl Fleet {
    fn breaker_keys(&self, upstream: &str) -> (String, String) {
        (
            self.key("breaker", upstream, &["open"]),
            self.key("breaker", upstream, &["probe"]),
        )
    }

    /// Runs one of the breaker's scripts on `upstream`'s keys (the open
    /// key, the probe key) with this instance's id and `ms`.
    async fn breaker_script<T: redis::FromRedisValue + Send + 'static>(
        &self,
        script: &'static Script,
        op: &'static str,
        upstream: &str,
        ms: Duration,
    ) -> Result<T, StateError> {
        let (open, probe) = self.breaker_keys(upstream);
        let id = self.instance_id().to_string();
        let ms = px(ms);
        self.call(op, |mut c| async move {
            script
                .key(&open)
                .key(&probe)
                .arg(&id)
                .arg(ms)
                .invoke_async(&mut c)
                .await
        })
        .await
    }

    /// Publishes a trip of `upstream`'s breaker open for `open_for` (the
    /// interval this instance just opened for). Only ever extends the
    /// published interval; returns whether it did.
    pub async fn publish_open(
        &self,
        upstream: &str,
        open_for: Duration,
    ) -> Result<bool, StateError> {
        let n: i64 = self
            .breaker_script(&OPEN, "breaker_open", upstream, open_for)
            .await?;
        Ok(n == 1)
    }

    /// How long `upstream`'s published trip lasts still (`PTTL`), if any.
    pub async fn open_remaining(&self, upstream: &str) -> Result<Option<Duration>, StateError> {
        let (open, _) = self.breaker_keys(upstream);
        let ms: i64 = self
            .call("breaker_refresh", |mut c| async move {
                redis::cmd("PTTL").arg(&open).query_async(&mut c).await
            })
            .await?;
        Ok(pttl(ms))
    }

    /// The published trips of `upstreams`, in order, in one round trip (a
    /// pipeline of `PTTL`s; on a Cluster, one per node): what the
    /// refresher reads once per `refresh`.
    pub async fn refresh(&self, upstreams: &[&str]) -> Result<Vec<Option<Duration>>, StateError> {
        if upstreams.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = upstreams.iter().map(|u| self.breaker_keys(u).0).collect();
        let ms: Vec<i64> = if self.inner.tagged {
            // A Cluster refuses a pipeline across slots, and each
            // upstream's keys have a slot of their own: one PTTL each, all
            // at once (the client pipelines them per node).
            self.call("breaker_refresh", |c| async move {
                let each = keys.iter().map(|k| {
                    let mut c = c.clone();
                    async move { redis::cmd("PTTL").arg(k).query_async::<i64>(&mut c).await }
                });
                let ms = futures_util::future::try_join_all(each).await?;
                Ok(Value::Array(ms.into_iter().map(Value::Int).collect()))
            })
            .await?
        } else {
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.cmd("PTTL").arg(k);
            }
            self.call("breaker_refresh", |mut c| async move {
                pipe.query_async(&mut c).await
            })
            .await?
        };
        if ms.len() != upstreams.len() {
            return Err(StateError::Malformed(format!(
                "{} answers to {} PTTLs",
                ms.len(),
                upstreams.len()
            )));
        }
        Ok(ms.into_iter().map(pttl).collect())
    }

    /// Asks to own `upstream`'s half-open probe for `lease` (how long the
    /// probe may take: its attempt's timeout). Exactly one instance wins
    /// per open interval.
    pub async fn claim_probe(
        &self,
        upstream: &str,
        lease: Duration,
    ) -> Result<ProbeClaim, StateError> {
        let v: Value = self
            .breaker_script(&PROBE, "breaker_probe", upstream, lease)
            .await?;
        let bad = || StateError::Malformed(format!("probe claim {v:?}"));
        let Value::Array(parts) = &v else {
            return Err(bad());
        };
        let (tag, ms) = match parts.as_slice() {
            [Value::BulkString(t), Value::Int(ms)] => (t.as_slice(), *ms),
            _ => return Err(bad()),
        };
        let left = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        Ok(match tag {
            b"won" => ProbeClaim::Won,
            b"held" => ProbeClaim::Held { retry_in: left },
            b"open" => ProbeClaim::Open { remaining: left },
            b"closed" => ProbeClaim::Closed,
            _ => return Err(bad()),
        })
    }

    /// This instance's probe of `upstream` succeeded: the fleet's breaker
    /// closes (the open key goes; instances still half-open learn it from
    /// [`Fleet::claim_probe`] for two `refresh` intervals). Does nothing
    /// unless this instance owns the probe; returns whether it did.
    pub async fn publish_closed(&self, upstream: &str) -> Result<bool, StateError> {
        let marker = self.refresh_every() * 2;
        let n: i64 = self
            .breaker_script(&CLOSE, "breaker_close", upstream, marker)
            .await?;
        Ok(n == 1)
    }
}
