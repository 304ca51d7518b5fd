//! Fleet state (docs/reference/fleet.md#fleet-state): the state a fleet of weirs
//! shares through `[state] backend = "redis"` — breaker trips and the
//! half-open probe ([`breaker`]), fleet-wide token buckets leased in
//! batches ([`limiter`], spent by `policy::leased_tokens`), and the idempotency
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
mod calls;
mod conn;
mod health;
pub mod idempotency;
pub mod limiter;

pub use breaker::ProbeClaim;
pub use limiter::FleetBucket;

use crate::config::{redact_url, OnUnavailable, RedisTopology, StateConfig};
use crate::metrics::state::StateMetrics;
use arc_swap::ArcSwapOption;
use conn::{RedisConn, RedisTarget};
use health::BackendHealth;
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
/// How long a background finishing call waits for the durable
/// connection's turn (see [`Fleet::call_in_turn`]).
pub(super) const PATIENT_TURN: Duration = Duration::from_secs(5);
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
    /// A keyed write's claim was written but not acknowledged by
    /// `[state] wait_replicas` within `wait_timeout`: a failover now could
    /// lose it.
    #[error("not acknowledged by the replicas within wait_timeout")]
    Unreplicated,
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
    /// after I/O errors; and a primary found through Sentinel is looked up
    /// again. `None` until the first connection is made.
    conn: ArcSwapOption<RedisConn>,
    /// A second connection for the calls that wait for replicas (`WAIT`
    /// blocks the connection it is sent on; the breaker's and the
    /// limiter's calls must not queue behind it). Made with `conn` when
    /// `wait_replicas` is set.
    durable: ArcSwapOption<RedisConn>,
    target: RedisTarget,
    prefix: String,
    /// A Cluster: each upstream's name in braces in its keys (a hash tag).
    tagged: bool,
    wait_replicas: u8,
    wait_timeout: std::time::Duration,
    /// One keyed-write call at a time on the durable connection: a `WAIT`
    /// blocks it, and calls sent behind one would pile up in Redis while a
    /// replica is away and land after their callers gave up. A call that
    /// cannot have its turn within its bound is not sent at all.
    durable_turn: tokio::sync::Semaphore,
    on_unavailable: OnUnavailable,
    timeout: Duration,
    refresh: Duration,
    instance: String,
    /// Where the state lives, without passwords, for logs and `/readyz`.
    shown: String,
    health: BackendHealth,
    metrics: StateMetrics,
    wake: Arc<Notify>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("target", &self.inner.shown)
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
        let target = RedisTarget::new(cfg)?;
        tokio::runtime::Handle::try_current()
            .map_err(|_| StateError::Setup("the shared state needs a tokio runtime".into()))?;
        let shown = match cfg.topology() {
            Some(RedisTopology::Server(url)) => redact_url(url),
            Some(RedisTopology::Sentinel {
                sentinels,
                master_name,
            }) => format!(
                "sentinel {master_name} at {}",
                sentinels
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some(RedisTopology::Cluster(nodes)) => format!(
                "cluster at {}",
                nodes
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => String::new(),
        };
        metrics.precreate_ops();
        metrics.set_up(false);
        let wake = Arc::new(Notify::new());
        let inner = Arc::new(FleetShared {
            conn: ArcSwapOption::empty(),
            durable: ArcSwapOption::empty(),
            tagged: target.is_cluster(),
            target,
            prefix: cfg.key_prefix.clone(),
            wait_replicas: cfg.wait_replicas,
            wait_timeout: cfg.wait_timeout,
            durable_turn: tokio::sync::Semaphore::new(1),
            on_unavailable: cfg.on_unavailable,
            timeout: cfg.timeout,
            refresh: cfg.refresh,
            instance: format!("{:016x}", crate::clock::fresh_seed()),
            shown,
            health: BackendHealth::new(),
            metrics,
            wake: Arc::clone(&wake),
        });
        let backoff_cap = (cfg.refresh / 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
        tokio::spawn(supervise(
            Arc::downgrade(&inner),
            Arc::clone(&wake),
            backoff_cap,
        ));
        if let Some((urls, name)) = inner.target.sentinel_urls() {
            let (alive, switched) = (Arc::downgrade(&inner), Arc::downgrade(&inner));
            tokio::spawn(conn::watch_switches(
                urls.to_vec(),
                name.to_string(),
                move || alive.strong_count() > 0,
                move || {
                    if let Some(inner) = switched.upgrade() {
                        // Not the old connection again (its server may
                        // still call itself master, cut off from the
                        // Sentinels): the next one asks them.
                        inner.conn.store(None);
                        inner.durable.store(None);
                        let f = Fleet { inner };
                        f.down(&StateError::Backend(
                            "+switch-master: the primary moved".into(),
                        ));
                    }
                },
            ));
        }
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
        let target = &self.inner.shown;
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

    /// The key `{key_prefix}{kind}:{upstream}:{part}…`; on a Cluster the
    /// upstream's name is in braces (`weir:breaker:{api}:open`), a hash tag:
    /// one upstream's keys share a slot, so each script touches one slot.
    pub fn key(&self, kind: &str, upstream: &str, rest: &[&str]) -> String {
        let mut k = self.inner.prefix.clone();
        k.push_str(kind);
        k.push(':');
        if self.inner.tagged {
            k.push('{');
            k.push_str(upstream);
            k.push('}');
        } else {
            k.push_str(upstream);
        }
        for p in rest {
            k.push(':');
            k.push_str(p);
        }
        k
    }

    /// `[state] on_unavailable`: what a keyed write gets when the store
    /// cannot be relied on.
    pub fn on_unavailable(&self) -> OnUnavailable {
        self.inner.on_unavailable
    }

    /// `[state] wait_replicas`: 0 when no acknowledgement is asked.
    pub fn wait_replicas(&self) -> u8 {
        self.inner.wait_replicas
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
                tracing::warn!(target = %inner.shown, error = %why, held_back, "shared state backend unavailable; deciding with local state until it is back");
            }
        }
        inner.wake.notify_one();
    }

    fn up(&self) {
        let inner = &self.inner;
        if inner.health.set_up(true) {
            inner.metrics.set_up(true);
            if inner.health.came_up() {
                tracing::info!(target = %inner.shown, "shared state backend reachable");
            }
        }
    }

    /// Drops the connection and starts over: a new manager for a server
    /// (which dials on its first command), the primary asked of the
    /// Sentinels again, the Cluster's seed nodes dialled again.
    async fn reconnect(&self) -> Result<(), StateError> {
        let inner = &self.inner;
        let (conn, durable) = inner.target.connect(inner.wait_replicas > 0).await?;
        inner.durable.store(durable.map(Arc::new));
        inner.conn.store(Some(Arc::new(conn)));
        Ok(())
    }

    /// One check of the connection, bounded by [`CONNECT_TIMEOUT`]: `PING`,
    /// or for a primary found through Sentinel `ROLE`, which must still say
    /// `master` (a demoted primary answers PING as before).
    async fn ping(&self) -> Result<(), StateError> {
        let series = self.inner.metrics.op("ping");
        series.commands.inc();
        let Some(conn) = self.inner.conn.load_full() else {
            series.errors.inc();
            return Err(StateError::Unavailable);
        };
        let mut conn = RedisConn::clone(&conn);
        let role = self.inner.target.checks_role();
        let check = async {
            if role {
                let v: redis::Value = redis::cmd("ROLE").query_async(&mut conn).await?;
                let first = match &v {
                    redis::Value::Array(p) => p.first().cloned(),
                    _ => None,
                };
                let r: String = first
                    .map(redis::from_redis_value)
                    .transpose()?
                    .unwrap_or_default();
                Ok::<_, redis::RedisError>((r == "master").then_some(()).ok_or(r))
            } else {
                let p: String = redis::cmd("PING").query_async(&mut conn).await?;
                Ok((p == "PONG").then_some(()).ok_or(p))
            }
        };
        let e = match tokio::time::timeout(CONNECT_TIMEOUT, check).await {
            Ok(Ok(Ok(()))) => return Ok(()),
            Ok(Ok(Err(other))) if role => StateError::Backend(format!(
                "the primary the Sentinels named is now a {other:?}"
            )),
            Ok(Ok(Err(other))) => StateError::Malformed(format!("PING answered {other:?}")),
            Ok(Err(e)) => StateError::Backend(e.to_string()),
            Err(_) => StateError::Timeout(CONNECT_TIMEOUT),
        };
        series.errors.inc();
        self.failed("ping", &e);
        Err(e)
    }
}

/// Brings the backend up, and back up whenever a call (or the heartbeat)
/// finds it down: connects and checks with a backoff from [`MIN_BACKOFF`]
/// doubling to `cap`; while up, one check per [`HEARTBEAT`]. Ends when the
/// last [`Fleet`] handle is dropped.
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
                // A call that answered within the heartbeat already proved
                // the connection (so an instance whose breaker refresh runs
                // every second makes one background round trip a second,
                // not two); a primary found through Sentinel is asked its
                // ROLE all the same, since a demoted one answers reads.
                if !f.inner.target.checks_role() && f.inner.health.answered_within(HEARTBEAT) {
                    continue;
                }
                if let Err(e) = f.ping().await {
                    f.down(&e);
                }
                continue;
            }
            let connected = match f.inner.conn.load().is_some() {
                true => Ok(()),
                false => f.reconnect().await,
            };
            match connected {
                Ok(()) if f.ping().await.is_ok() => {
                    f.up();
                    backoff = MIN_BACKOFF;
                    continue;
                }
                Ok(()) => {}
                Err(e) => {
                    f.inner.metrics.op("ping").errors.inc();
                    f.failed("ping", &e);
                }
            }
            if let Some(held_back) = f.inner.health.overdue_down() {
                tracing::warn!(target = %f.inner.shown, held_back, "shared state backend still unavailable; deciding with local state until it is back");
            }
            // The next round starts from a new connection.
            f.inner.conn.store(None);
            f.inner.durable.store(None);
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
