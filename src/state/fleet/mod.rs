//! Fleet state (docs/reference/fleet.md#fleet-state): the state a fleet of weirs
//! shares through `[state] backend = "redis"` — breaker trips and the
//! half-open probe ([`breaker`]), fleet-wide token buckets leased in
//! batches ([`limiter`], spent by `policy::lease`), and the idempotency
//! store ([`idempotency`]).
//!
//! Owns the connection ([`Fleet`]: a `redis::aio::ConnectionManager`, which
//! reconnects by itself, behind a supervisor that tells up from down), the
//! key layout ([`Fleet::key`]), the Lua scripts, and the accounting of every
//! call (`weir_state_*`, warnings at most once a minute per operation, the
//! `/readyz` line). Every call is bounded by `[state] timeout` and never
//! panics; while the backend is down a call fails at once with
//! [`StateError::Unavailable`], and the caller decides with its local state.
//! Must not: decide policy (that is `policy`), or be called per request on
//! a path that has a local answer (a closed breaker makes no call).

pub mod breaker;
mod health;
pub mod idempotency;
pub mod limiter;

pub use breaker::ProbeClaim;
pub use limiter::FleetBucket;

use crate::config::{redact_url, StateConfig};
use crate::metrics::state::StateMetrics;
use arc_swap::ArcSwap;
use health::BackendHealth;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// How long the supervisor gives one connection attempt (TCP, TLS, PING).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The supervisor's first wait between attempts while the backend is down;
/// it doubles up to half of `refresh` (at most a second), so the shared
/// state is back within `refresh` of the backend.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// While up, the supervisor PINGs this often, so that an instance that
/// makes no call (its breakers closed, no fleet limit, no keyed request)
/// still sees the backend go and come back (it is woken at once when a
/// call finds the backend down).
const HEARTBEAT: Duration = Duration::from_secs(1);

/// Why a call to the shared state gave no answer. Every one is counted in
/// `weir_state_errors_total{op}`; the caller decides with local state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The backend is down (not connected, or stopped answering): no call
    /// was made.
    #[error("the state backend is unavailable")]
    Unavailable,
    /// No answer within `[state] timeout`.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The backend answered with an error, or the connection failed.
    #[error("redis: {0}")]
    Backend(String),
    /// An answer of a shape weir never asks for.
    #[error("malformed reply: {0}")]
    Malformed(String),
    /// The fleet cannot be built: no Redis URL, no tokio runtime.
    #[error("{0}")]
    Setup(String),
}

/// A handle on the shared state; cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<FleetShared>,
}

struct FleetShared {
    /// Replaced by the supervisor whenever a PING fails while the backend
    /// is down: a connection whose handshake read bytes that are not RESP
    /// stays failed inside the manager, which only reconnects by itself
    /// after I/O errors.
    conn: ArcSwap<ConnectionManager>,
    client: redis::Client,
    prefix: String,
    timeout: Duration,
    refresh: Duration,
    instance: String,
    /// The URL without its password, for logs and `/readyz`.
    target: String,
    health: BackendHealth,
    metrics: StateMetrics,
    wake: Arc<Notify>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("target", &self.inner.target)
            .field("instance", &self.inner.instance)
            .field("up", &self.is_up())
            .finish()
    }
}

impl Fleet {
    /// Starts the shared state of `cfg` (which must have `backend =
    /// "redis"`), inside a tokio runtime. Returns at once: the connection
    /// is made in the background and remade whenever it is lost, and until
    /// it is up every call fails with [`StateError::Unavailable`] — so weir
    /// starts, and serves on local state, with Redis down.
    pub fn start(cfg: &StateConfig, metrics: StateMetrics) -> Result<Fleet, StateError> {
        let url = cfg
            .redis_url()
            .ok_or_else(|| StateError::Setup("[state] backend is not redis".into()))?;
        tokio::runtime::Handle::try_current()
            .map_err(|_| StateError::Setup("the shared state needs a tokio runtime".into()))?;
        let client = redis::Client::open(url).map_err(|e| StateError::Setup(e.to_string()))?;
        let conn = manager(&client)?;
        metrics.precreate_ops();
        metrics.set_up(false);
        let wake = Arc::new(Notify::new());
        let inner = Arc::new(FleetShared {
            conn: ArcSwap::from_pointee(conn),
            client,
            prefix: cfg.key_prefix.clone(),
            timeout: cfg.timeout,
            refresh: cfg.refresh,
            instance: format!("{:016x}", crate::clock::fresh_seed()),
            target: redact_url(url),
            health: BackendHealth::new(),
            metrics,
            wake: Arc::clone(&wake),
        });
        let backoff_cap = (cfg.refresh / 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
        tokio::spawn(supervise(Arc::downgrade(&inner), wake, backoff_cap));
        Ok(Fleet { inner })
    }

    /// This instance's id (16 hex digits, random per start): what it writes
    /// as the owner of a probe or an in-flight idempotency record.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance
    }

    /// `[state] timeout`: the longest any call takes.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// `[state] refresh`: how often the breaker refresher should run.
    pub fn refresh_every(&self) -> Duration {
        self.inner.refresh
    }

    /// Whether the backend is taken for up (calls are made).
    pub fn is_up(&self) -> bool {
        self.inner.health.is_up()
    }

    pub fn metrics(&self) -> &StateMetrics {
        &self.inner.metrics
    }

    /// Waits (tokio time) until the backend is up; false after `limit`.
    pub async fn wait_up(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while !self.is_up() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// One line on the shared state for `/readyz`'s body (it never turns
    /// `/readyz` to 503): `state: redis up (redis://cache:6379/0)`, or
    /// `state: redis unavailable for 12s (40 errors in the last minute):
    /// the last error`.
    pub fn status_line(&self) -> String {
        let (up, since, errors, last) = self.inner.health.summary();
        let target = &self.inner.target;
        let tail = match (errors, last) {
            (0, _) | (_, None) => String::new(),
            (n, Some(e)) => format!(
                " ({n} error{} in the last minute): {e}",
                if n == 1 { "" } else { "s" }
            ),
        };
        match up {
            true => format!("state: redis up ({target}){tail}"),
            false => format!(
                "state: redis unavailable for {}s, deciding with local state ({target}){tail}",
                since.as_secs()
            ),
        }
    }

    /// The key `{key_prefix}{part}:{part}…`.
    pub fn key(&self, parts: &[&str]) -> String {
        let mut k = self.inner.prefix.clone();
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                k.push(':');
            }
            k.push_str(p);
        }
        k
    }

    /// Makes one call of `op` (one round trip), bounded by `timeout`, with
    /// its accounting; fails at once while the backend is down. The reply
    /// is read as a bare `Value` and converted here: a well-formed reply of
    /// the wrong type is [`StateError::Malformed`] and leaves the
    /// connection up, where only bytes that are not RESP (or a lost
    /// connection) take the backend for down.
    async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, StateError>
    where
        T: redis::FromRedisValue,
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<redis::Value>>,
    {
        let inner = &self.inner;
        let series = inner.metrics.op(op);
        if !inner.health.is_up() {
            series.errors.inc();
            let e = StateError::Unavailable;
            self.failed(op, &e);
            return Err(e);
        }
        series.commands.inc();
        let start = tokio::time::Instant::now();
        let conn = ConnectionManager::clone(&inner.conn.load());
        let e = match tokio::time::timeout(inner.timeout, f(conn)).await {
            Ok(Ok(v)) => {
                series.roundtrip.observe(start.elapsed().as_secs_f64());
                inner.health.answered();
                match redis::from_redis_value::<T>(v) {
                    Ok(v) => return Ok(v),
                    Err(e) => StateError::Malformed(e.to_string()),
                }
            }
            Ok(Err(e)) => {
                let lost = e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_unrecoverable_error()
                    || e.is_timeout();
                let err = StateError::Backend(e.to_string());
                if lost {
                    self.down(&err);
                }
                err
            }
            Err(_) => {
                let err = StateError::Timeout(inner.timeout);
                if inner.health.timed_out() {
                    self.down(&err);
                }
                err
            }
        };
        series.errors.inc();
        self.failed(op, &e);
        Err(e)
    }

    /// Counts and (at most once a minute per `op`) logs a failed call.
    fn failed(&self, op: &'static str, e: &StateError) {
        let cause = *e != StateError::Unavailable;
        if let Some(held_back) = self.inner.health.error(op, &e.to_string(), cause) {
            tracing::warn!(
                op,
                error = %e,
                held_back,
                "shared state call failed; deciding with local state"
            );
        }
    }

    fn down(&self, why: &StateError) {
        let inner = &self.inner;
        if inner.health.set_up(false) {
            inner.metrics.set_up(false);
            if let Some(held_back) = inner.health.went_down() {
                tracing::warn!(target = %inner.target, error = %why, held_back, "shared state backend unavailable; deciding with local state until it is back");
            }
        }
        inner.wake.notify_one();
    }

    fn up(&self) {
        let inner = &self.inner;
        if inner.health.set_up(true) {
            inner.metrics.set_up(true);
            if inner.health.came_up() {
                tracing::info!(target = %inner.target, "shared state backend reachable");
            }
        }
    }

    /// Drops the connection and starts over with a new manager (which
    /// dials on its first command).
    fn reconnect(&self) {
        if let Ok(conn) = manager(&self.inner.client) {
            self.inner.conn.store(Arc::new(conn));
        }
    }

    /// One PING on a (re)connecting connection, bounded by [`CONNECT_TIMEOUT`].
    async fn ping(&self) -> Result<(), StateError> {
        let series = self.inner.metrics.op("ping");
        series.commands.inc();
        let mut conn = ConnectionManager::clone(&self.inner.conn.load());
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<String>(&mut conn);
        let e = match tokio::time::timeout(CONNECT_TIMEOUT, ping).await {
            Ok(Ok(p)) if p == "PONG" => return Ok(()),
            Ok(Ok(other)) => StateError::Malformed(format!("PING answered {other:?}")),
            Ok(Err(e)) => StateError::Backend(e.to_string()),
            Err(_) => StateError::Timeout(CONNECT_TIMEOUT),
        };
        series.errors.inc();
        self.failed("ping", &e);
        Err(e)
    }
}

/// A lazy connection manager on `client`: it dials on its first command.
fn manager(client: &redis::Client) -> Result<ConnectionManager, StateError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_number_of_retries(1)
        .set_min_delay(MIN_BACKOFF)
        .set_max_delay(MAX_BACKOFF);
    ConnectionManager::new_lazy_with_config(client.clone(), config)
        .map_err(|e| StateError::Setup(e.to_string()))
}

/// Brings the backend up, and back up whenever a call (or the heartbeat)
/// finds it down: PINGs with a backoff from [`MIN_BACKOFF`] doubling to
/// `cap`; while up, one PING per [`HEARTBEAT`]. Ends when the last [`Fleet`]
/// handle is dropped.
async fn supervise(fleet: Weak<FleetShared>, wake: Arc<Notify>, cap: Duration) {
    let mut backoff = MIN_BACKOFF;
    loop {
        {
            let Some(inner) = fleet.upgrade() else { return };
            let f = Fleet { inner };
            if f.is_up() {
                drop(f);
                if tokio::time::timeout(HEARTBEAT, wake.notified())
                    .await
                    .is_ok()
                {
                    continue;
                }
                let Some(inner) = fleet.upgrade() else { return };
                let f = Fleet { inner };
                if let Err(e) = f.ping().await {
                    f.down(&e);
                }
                continue;
            }
            if f.ping().await.is_ok() {
                f.up();
                backoff = MIN_BACKOFF;
                continue;
            }
            if let Some(held_back) = f.inner.health.overdue_down() {
                tracing::warn!(target = %f.inner.target, held_back, "shared state backend still unavailable; deciding with local state until it is back");
            }
            f.reconnect();
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(cap);
    }
}

/// A duration as whole milliseconds for `PX` and `PEXPIRE`: at least 1
/// (Redis refuses 0).
pub(crate) fn px(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A `PTTL` reply: `Some(time left)` for a key with an expiry, `None` for no
/// key (-2) or one without an expiry (-1, which weir never writes).
pub(crate) fn pttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}
