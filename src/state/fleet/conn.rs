//! Where the fleet's commands go (docs/reference/fleet.md#topologies): one
//! server (`url`), the primary a set of Sentinels names (`sentinels`,
//! `master_name`), or a Redis Cluster (`cluster`). [`RedisTarget`] is what
//! `[state]` says; [`RedisConn`] one connection made from it, which the scripts
//! and commands run on alike (it is a `redis::aio::ConnectionLike`).
//!
//! A server's connection and the primary's are a `ConnectionManager`, which
//! redials the same address by itself. Following a failover is the
//! supervisor's: a lost connection, a `READONLY` answer, a heartbeat `ROLE`
//! that is no longer `master`, or a Sentinel's `+switch-master` takes the
//! backend down, and the next connection asks the Sentinels again. A
//! Cluster connection follows `MOVED` and `ASK` and refreshes its slot map
//! by itself (redis-rs's cluster client).

use super::StateError;
use crate::config::{RedisTopology, StateConfig};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::time::Duration;

/// What `[state]` points at, ready to connect.
pub(super) enum RedisTarget {
    Server(redis::Client),
    Sentinel {
        /// redis-rs's Sentinel client: asks each Sentinel in turn for the
        /// primary and checks that it says `master` (`ROLE`).
        sentinel: tokio::sync::Mutex<Sentinel>,
        master_name: String,
        /// How the primary is reached: TLS as the Sentinels are, and the
        /// primary's own user, password and database.
        node: SentinelNodeConnectionInfo,
        /// The Sentinels' URLs, for the `+switch-master` watch.
        urls: Vec<String>,
    },
    Cluster(ClusterClient),
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

impl RedisTarget {
    /// The target of `cfg` (with `backend = "redis"`); nothing is dialled.
    pub(super) fn new(cfg: &StateConfig) -> Result<RedisTarget, StateError> {
        let setup = |e: redis::RedisError| StateError::Setup(e.to_string());
        match cfg.topology() {
            None => Err(StateError::Setup("[state] backend is not redis".into())),
            Some(RedisTopology::Server(url)) => Ok(RedisTarget::Server(
                redis::Client::open(url).map_err(setup)?,
            )),
            Some(RedisTopology::Sentinel {
                sentinels,
                master_name,
            }) => {
                let sentinel = Sentinel::build(sentinels.to_vec()).map_err(setup)?;
                let mut info = redis::RedisConnectionInfo::default().set_db(i64::from(cfg.db));
                if let Some(u) = &cfg.username {
                    info = info.set_username(u);
                }
                if let Some(p) = &cfg.password {
                    info = info.set_password(p);
                }
                let mut node =
                    SentinelNodeConnectionInfo::default().set_redis_connection_info(info);
                if sentinels.iter().all(|u| u.starts_with("rediss:")) {
                    node = node.set_tls_mode(redis::TlsMode::Secure);
                }
                Ok(RedisTarget::Sentinel {
                    sentinel: tokio::sync::Mutex::new(sentinel),
                    master_name: master_name.to_string(),
                    node,
                    urls: sentinels.to_vec(),
                })
            }
            Some(RedisTopology::Cluster(nodes)) => {
                let client = ClusterClient::builder(nodes.to_vec())
                    .connection_timeout(super::CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .build()
                    .map_err(setup)?;
                Ok(RedisTarget::Cluster(client))
            }
        }
    }

    /// `server`, `sentinel` or `cluster`: for `/readyz` and the logs.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            RedisTarget::Server(_) => "server",
            RedisTarget::Sentinel { .. } => "sentinel",
            RedisTarget::Cluster(_) => "cluster",
        }
    }

    /// Whether keys need a hash tag: a Cluster runs a script only on keys
    /// of one slot.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
    }

    /// Whether the heartbeat asks `ROLE`: a primary found through Sentinel
    /// may be demoted while weir's connection to it stays up.
    pub(super) fn checks_role(&self) -> bool {
        matches!(self, RedisTarget::Sentinel { .. })
    }

    /// The Sentinels, for the `+switch-master` watch.
    pub(super) fn sentinel_urls(&self) -> Option<(&[String], &str)> {
        match self {
            RedisTarget::Sentinel {
                urls, master_name, ..
            } => Some((urls, master_name)),
            _ => None,
        }
    }

    /// A new connection, and with `durable` a second one to the same
    /// server (for the calls that `WAIT`). A server's dial on their first
    /// command; the Sentinels are asked for the primary now, once for both
    /// (a dead Sentinel is passed over), so that the two cannot end up on
    /// different servers; a Cluster's seed nodes are dialled now. Bounded
    /// by `CONNECT_TIMEOUT`.
    pub(super) async fn connect(
        &self,
        durable: bool,
    ) -> Result<(RedisConn, Option<RedisConn>), StateError> {
        let pair = |client: &redis::Client| -> Result<_, StateError> {
            let one = manager(client).map(RedisConn::Server)?;
            let two = match durable {
                true => Some(manager(client).map(RedisConn::Server)?),
                false => None,
            };
            Ok((one, two))
        };
        match self {
            RedisTarget::Server(client) => pair(client),
            RedisTarget::Sentinel {
                sentinel,
                master_name,
                node,
                ..
            } => {
                bounded(async {
                    let mut s = sentinel.lock().await;
                    let client = s
                        .async_master_for(master_name, Some(node))
                        .await
                        .map_err(|e| StateError::Backend(format!("sentinel: {e}")))?;
                    pair(&client)
                })
                .await
            }
            RedisTarget::Cluster(client) => {
                bounded(async {
                    let dial = || async {
                        client
                            .get_async_connection()
                            .await
                            .map(|c| RedisConn::Cluster(Box::new(c)))
                            .map_err(|e| StateError::Backend(format!("cluster: {e}")))
                    };
                    let one = dial().await?;
                    let two = match durable {
                        true => Some(dial().await?),
                        false => None,
                    };
                    Ok((one, two))
                })
                .await
            }
        }
    }
}

/// The client's own bound on one answer: past the longest a call may
/// wait (`[state] timeout` and `wait_timeout`, at most 1 s each), which
/// weir bounds itself. redis-rs's default, 500 ms, would cut a `WAIT`
/// short.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(2500);

/// `f`, bounded by `CONNECT_TIMEOUT`.
async fn bounded<T>(
    f: impl std::future::Future<Output = Result<T, StateError>>,
) -> Result<T, StateError> {
    match tokio::time::timeout(super::CONNECT_TIMEOUT, f).await {
        Ok(r) => r,
        Err(_) => Err(StateError::Timeout(super::CONNECT_TIMEOUT)),
    }
}

/// A lazy connection manager on `client`: it dials on its first command.
fn manager(client: &redis::Client) -> Result<ConnectionManager, StateError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(super::CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(1)
        .set_min_delay(super::MIN_BACKOFF)
        .set_max_delay(super::MAX_BACKOFF);
    ConnectionManager::new_lazy_with_config(client.clone(), config)
        .map_err(|e| StateError::Setup(e.to_string()))
}

/// One connection to the shared state; cheap to clone (both kinds are
/// multiplexed handles).
#[derive(Clone)]
pub(super) enum RedisConn {
    Server(ConnectionManager),
    Cluster(Box<ClusterConnection>),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Server(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Server(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// How long the `+switch-master` watch waits before it tries the
/// Sentinels again after losing them.
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// Subscribes to `+switch-master` on the first Sentinel that answers and
/// calls `switched` whenever `master_name`'s primary moves. Runs until
/// `alive` says the fleet is gone.
pub(super) async fn watch_switches(
    urls: Vec<String>,
    master_name: String,
    alive: impl Fn() -> bool,
    switched: impl Fn(),
) {
    use futures_util::StreamExt;
    while alive() {
        for url in &urls {
            let Ok(client) = redis::Client::open(url.as_str()) else {
                continue;
            };
            let sub = tokio::time::timeout(super::CONNECT_TIMEOUT, client.get_async_pubsub());
            let Ok(Ok(mut pubsub)) = sub.await else {
                continue;
            };
            // A Sentinel that took the connection and then says nothing
            // is passed over like one that refused it.
            let subscribed =
                tokio::time::timeout(super::CONNECT_TIMEOUT, pubsub.subscribe("+switch-master"));
            if !matches!(subscribed.await, Ok(Ok(()))) {
                continue;
            }
            let mut messages = pubsub.on_message();
            loop {
                let next = tokio::time::timeout(WATCH_RETRY, messages.next()).await;
                if !alive() {
                    return;
                }
                match next {
                    Err(_) => continue,
                    Ok(None) => break,
                    Ok(Some(m)) => {
                        // "<name> <old-ip> <old-port> <new-ip> <new-port>"
                        let text: String = m.get_payload().unwrap_or_default();
                        if text.split(' ').next() == Some(master_name.as_str()) {
                            switched();
                        }
                    }
                }
            }
        }
        tokio::time::sleep(WATCH_RETRY).await;
    }
}
