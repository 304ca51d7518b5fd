//! Fleet-wide token buckets (docs/reference/fleet.md#fleet-state): the bucket
//! lives in Redis and is changed only by one atomic Lua script
//! ([`Fleet::lease`]), which refills it on Redis's own clock (`TIME`, so
//! instances' clocks never matter) and grants up to the tokens asked for.
//! Instances lease tokens in batches and spend them locally
//! (`policy::leased_tokens::LeasedBucket`); [`FleetBucket`] ties the two together
//! with the fetch in the background, so admission never waits on Redis.
//!
//! Key: `{prefix}rl:{upstream}` for an upstream's shared bucket,
//! `{prefix}rl:{upstream}:{key}` for a keyed limiter's. A hash: `tokens`
//! (may be fractional) and `at` (Redis time of the last change, µs). It
//! expires once it would have refilled to `burst` (plus a second): an
//! absent bucket is a full one.

use super::{Fleet, StateError};
use crate::clock::Clock;
use crate::policy::leased_tokens::{Grant, LeasedBucket, Take};
use crate::policy::Now;
use redis::{Script, Value};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

/// ARGV: rps, burst, want. Returns {granted, ms until the shortfall could
/// have refilled, whole tokens left in the bucket}.
static BUCKET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.replicate_commands then redis.replicate_commands() end
local rps = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
if not rps or not burst or not want or rps <= 0 or burst < 1 or want < 0 then
  return redis.error_reply('weir: bad token bucket arguments')
end
want = math.min(want, burst)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(s[1])
local at = tonumber(s[2])
if tokens == nil or at == nil then
  tokens = burst
elseif now > at then
  tokens = math.min(burst, tokens + (now - at) * rps / 1000000)
else
  tokens = math.min(burst, tokens)
end
local granted = math.max(0, math.min(want, math.floor(tokens)))
tokens = tokens - granted
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'at', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rps * 1000) + 1000)
local wait = 0
if granted < want then wait = math.ceil((want - granted - tokens) / rps * 1000) end
return {granted, wait, math.floor(tokens)}
",
    )
});

impl Fleet {
    /// Leases up to `want` tokens from the fleet bucket of `upstream` (and
    /// `key`, for a keyed limiter) of `rps` and `burst`: one round trip.
    /// Counted in `weir_state_leased_tokens_total{upstream}`.
    pub async fn lease(
        &self,
        upstream: &str,
        key: Option<&str>,
        rps: f64,
        burst: u32,
        want: u32,
    ) -> Result<Grant, StateError> {
        let k = match key {
            None => self.key("rl", upstream, &[]),
            Some(key) => self.key("rl", upstream, &[key]),
        };
        let rate = rps.to_string();
        let v: Value = self
            .call("lease", |mut c| async move {
                BUCKET
                    .key(&k)
                    .arg(&rate)
                    .arg(burst)
                    .arg(want)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let (granted, wait, left) = match &v {
            Value::Array(p) => match p.as_slice() {
                [Value::Int(g), Value::Int(w), Value::Int(l)] => (*g, *w, *l),
                _ => (-1, 0, 0),
            },
            _ => (-1, 0, 0),
        };
        let wanted = want.min(burst);
        let granted = u32::try_from(granted)
            .ok()
            .filter(|g| *g <= wanted)
            .ok_or_else(|| StateError::Malformed(format!("token lease {v:?}")))?;
        self.metrics().leased(upstream).inc_by(u64::from(granted));
        Ok(Grant {
            wanted,
            granted,
            retry_in: Duration::from_millis(u64::try_from(wait).unwrap_or(0)),
            left: u32::try_from(left).unwrap_or(0),
        })
    }
}

/// One fleet-wide bucket as an instance sees it: a [`LeasedBucket`] whose
/// fetches run in the background on the tokio runtime. Cheap to clone.
#[derive(Debug, Clone)]
pub struct FleetBucket {
    inner: Arc<BucketInner>,
}

#[derive(Debug)]
struct BucketInner {
    fleet: Fleet,
    upstream: String,
    key: Option<String>,
    clock: Clock,
    bucket: Mutex<LeasedBucket>,
}

impl FleetBucket {
    /// The bucket of `upstream` (and `key`) of `rps` and `burst`; `clock`
    /// is the one `now` is read from.
    pub fn new(
        fleet: Fleet,
        upstream: &str,
        key: Option<&str>,
        rps: f64,
        burst: u32,
        clock: Clock,
    ) -> Self {
        FleetBucket {
            inner: Arc::new(BucketInner {
                fleet,
                upstream: upstream.to_string(),
                key: key.map(str::to_string),
                clock,
                bucket: Mutex::new(LeasedBucket::new(rps, burst)),
            }),
        }
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, LeasedBucket> {
        self.inner
            .bucket
            .lock()
            .expect("leased bucket lock poisoned")
    }

    /// Asks for one admission at `now` (never waits). On
    /// [`Take::Fallback`] the caller decides with its local fallback limiter
    /// (`RateLimitParams::fallback`). Starts a fetch in the background when
    /// one is due.
    pub fn take(&self, now: Now) -> Take {
        let (take, want) = {
            let mut b = self.bucket();
            let t = b.take(now);
            (t, b.want(now))
        };
        if let Some(want) = want {
            self.fetch(want);
        }
        take
    }

    /// Gives back an admission [`FleetBucket::take`] made (see
    /// `LeasedBucket::give_back`).
    pub fn give_back(&self, now: Now) {
        self.bucket().give_back(now);
    }

    /// New rates (a reload); leased tokens are kept.
    pub fn set_rate(&self, rps: f64, burst: u32) {
        self.bucket().set_rate(rps, burst);
    }

    /// (stock, debt) now, for tests and the status page.
    pub fn position(&self) -> (u32, u32) {
        let b = self.bucket();
        (b.stock(), b.debt())
    }

    fn fetch(&self, want: u32) {
        let me = Arc::clone(&self.inner);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            let now = me.clock.now();
            self.bucket().failed(now);
            return;
        };
        rt.spawn(async move {
            let (rps, burst) = me
                .bucket
                .lock()
                .expect("leased bucket lock poisoned")
                .rate();
            let got = me
                .fleet
                .lease(&me.upstream, me.key.as_deref(), rps, burst, want)
                .await;
            let now = me.clock.now();
            let mut b = me.bucket.lock().expect("leased bucket lock poisoned");
            match got {
                Ok(g) => b.granted(now, g),
                Err(_) => b.failed(now),
            }
        });
    }
}
