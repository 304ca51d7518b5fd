//! How one call to the shared state is made (docs/reference/fleet.md#redis):
//! on the shared connection, bounded by `[state] timeout` and accounted;
//! or, for a keyed write's claim and record with `wait_replicas` set, on
//! the durable connection, in turn, followed by `WAIT`
//! (docs/reference/fleet.md#records-replicated-before-they-are-relied-on).
//! What a failure says about the backend (lost, demoted, too slow) is
//! decided here.

use super::{px, Fleet, RedisConn, StateError, PATIENT_TURN};
use std::future::Future;
use std::time::Duration;

impl Fleet {
    /// Makes one call of `op` (one round trip), bounded by `timeout`, with
    /// its accounting; fails at once while the backend is down. The reply
    /// is read as a bare `Value` and converted here: a well-formed reply of
    /// the wrong type is [`StateError::Malformed`] and leaves the
    /// connection up, where only bytes that are not RESP (or a lost
    /// connection) take the backend for down.
    pub(super) async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, StateError>
    where
        T: redis::FromRedisValue,
        F: FnOnce(RedisConn) -> Fut,
        Fut: Future<Output = redis::RedisResult<redis::Value>>,
    {
        let v = self.call_on(op, false, f).await?;
        redis::from_redis_value::<T>(v).map_err(|e| {
            let e = StateError::Malformed(e.to_string());
            self.inner.metrics.op(op).errors.inc();
            self.failed(op, &e);
            e
        })
    }

    /// Like [`Fleet::call`], for a keyed write's claim or record: with
    /// `wait_replicas` set, the call runs on the durable connection and is
    /// followed by `WAIT wait_replicas wait_timeout` on it, bounded by
    /// `timeout` + `wait_timeout`. Returns the reply and whether the write
    /// was acknowledged (always with `wait_replicas = 0`); one that was not
    /// is counted in `weir_state_unreplicated_total{op}`.
    pub(super) async fn call_durable<T, F, Fut>(
        &self,
        op: &'static str,
        f: F,
    ) -> Result<(T, bool), StateError>
    where
        T: redis::FromRedisValue,
        F: FnOnce(RedisConn) -> Fut,
        Fut: Future<Output = redis::RedisResult<redis::Value>>,
    {
        let n = self.inner.wait_replicas;
        if n == 0 {
            return self.call(op, f).await.map(|v| (v, true));
        }
        let bound = self.inner.timeout + self.inner.wait_timeout;
        let _turn = self.turn(op, bound).await?;
        let ms = px(self.inner.wait_timeout);
        let v = self
            .call_on(op, true, |c| async move {
                let mut wait_on = c.clone();
                let v = f(c).await?;
                // WAIT counts the replicas that have every write this
                // connection made so far, ours among them. An error (a
                // replica answering, a Cluster node without replicas) is
                // no acknowledgement.
                let acked: i64 = redis::cmd("WAIT")
                    .arg(n)
                    .arg(ms)
                    .query_async(&mut wait_on)
                    .await
                    .unwrap_or(0);
                Ok(redis::Value::Array(vec![v, redis::Value::Int(acked)]))
            })
            .await?;
        let malformed = |why: String| {
            let e = StateError::Malformed(why);
            self.inner.metrics.op(op).errors.inc();
            self.failed(op, &e);
            e
        };
        let redis::Value::Array(mut parts) = v else {
            return Err(malformed("WAIT pair".into()));
        };
        let (Some(redis::Value::Int(acked)), Some(v)) = (parts.pop(), parts.pop()) else {
            return Err(malformed("WAIT pair".into()));
        };
        let v = redis::from_redis_value::<T>(v).map_err(|e| malformed(e.to_string()))?;
        let ok = acked >= i64::from(n);
        if !ok {
            self.inner.metrics.unreplicated(op);
            if let Some(held_back) = self.inner.health.error(
                "unreplicated",
                &format!("{acked} of {n} replicas acknowledged"),
                false,
            ) {
                tracing::warn!(
                    op,
                    acked,
                    wanted = n,
                    held_back,
                    "a keyed write's record was not acknowledged by its replicas within wait_timeout"
                );
            }
        }
        Ok((v, ok))
    }

    /// A keyed write's call that waits for no replica (a fingerprint, an
    /// uncertain or forgotten record): with `wait_replicas` set it goes on
    /// the durable connection, in turn, so that it never overtakes the
    /// claim it finishes. These run in the background, and a forget that
    /// is dropped would hold its key in flight for the whole lease, so
    /// they wait for their turn up to [`PATIENT_TURN`].
    pub(super) async fn call_in_turn<T, F, Fut>(
        &self,
        op: &'static str,
        f: F,
    ) -> Result<T, StateError>
    where
        T: redis::FromRedisValue,
        F: FnOnce(RedisConn) -> Fut,
        Fut: Future<Output = redis::RedisResult<redis::Value>>,
    {
        if self.inner.wait_replicas == 0 {
            return self.call(op, f).await;
        }
        let _turn = self.turn(op, PATIENT_TURN).await?;
        let v = self.call_on(op, true, f).await?;
        redis::from_redis_value::<T>(v).map_err(|e| {
            let e = StateError::Malformed(e.to_string());
            self.inner.metrics.op(op).errors.inc();
            self.failed(op, &e);
            e
        })
    }

    /// The durable connection's turn, within `bound`; past it nothing is
    /// sent and the call is [`StateError::Unreplicated`].
    pub(super) async fn turn(
        &self,
        op: &'static str,
        bound: Duration,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, StateError> {
        let inner = &self.inner;
        match tokio::time::timeout(bound, inner.durable_turn.acquire()).await {
            Ok(Ok(p)) => Ok(p),
            _ => {
                inner.metrics.unreplicated(op);
                inner.metrics.op(op).errors.inc();
                let e = StateError::Unreplicated;
                self.failed(op, &e);
                Err(e)
            }
        }
    }

    /// One round trip on the shared connection (or the durable one), its
    /// accounting, and what a failure says about the backend: a lost
    /// connection, a `READONLY` answer (the primary was demoted) or too
    /// many timeouts take it down, and the supervisor connects again.
    pub(super) async fn call_on<F, Fut>(
        &self,
        op: &'static str,
        durable: bool,
        f: F,
    ) -> Result<redis::Value, StateError>
    where
        F: FnOnce(RedisConn) -> Fut,
        Fut: Future<Output = redis::RedisResult<redis::Value>>,
    {
        let inner = &self.inner;
        let series = inner.metrics.op(op);
        let slot = if durable { &inner.durable } else { &inner.conn };
        let conn = match slot.load_full() {
            Some(c) if inner.health.is_up() => c,
            _ => {
                series.errors.inc();
                let e = StateError::Unavailable;
                self.failed(op, &e);
                return Err(e);
            }
        };
        series.commands.inc();
        let start = tokio::time::Instant::now();
        let limit = match durable {
            true => inner.timeout + inner.wait_timeout,
            false => inner.timeout,
        };
        let e = match tokio::time::timeout(limit, f(RedisConn::clone(&conn))).await {
            Ok(Ok(v)) => {
                series.roundtrip.observe(start.elapsed().as_secs_f64());
                inner.health.answered();
                return Ok(v);
            }
            Ok(Err(e)) => {
                let demoted = matches!(
                    e.kind(),
                    redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                );
                let lost = demoted
                    || e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_unrecoverable_error()
                    || e.is_timeout();
                let err = StateError::Backend(e.to_string());
                if demoted {
                    // The server answers, but is a replica now: its
                    // connection is never made good by itself (a manager
                    // redials only after I/O errors, and PING still
                    // passes). The next connection is made anew (and the
                    // Sentinels asked again).
                    inner.conn.store(None);
                    inner.durable.store(None);
                }
                if lost {
                    self.down(&err);
                }
                err
            }
            Err(_) => {
                let err = StateError::Timeout(limit);
                // A durable call waits behind the others' WAITs on its own
                // connection: its timeouts say the replicas are slow, not
                // that the primary is gone, and must not take the breakers'
                // and buckets' backend down with them.
                if !durable && inner.health.timed_out() {
                    self.down(&err);
                }
                err
            }
        };
        series.errors.inc();
        self.failed(op, &e);
        Err(e)
    }
}
