//! The load driver: closed loop (N requests in flight) or open loop (R
//! requests per second), bounded in requests and in time. Three clients:
//! straight to the upstream, a naive retry loop, and through weir.

use super::upstream::REQUEST_ID;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How requests are offered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// `n` requests in flight at all times.
    Closed(usize),
    /// `r` requests per second, whatever the responses do.
    Open(f64),
}

#[derive(Debug, Clone)]
pub struct Load {
    pub requests: usize,
    pub mode: Mode,
    /// Stop offering new requests after this long.
    pub max_time: Duration,
    pub method: Method,
    /// The client's own timeout for a whole request.
    pub client_timeout: Duration,
    /// The key each request reads, by request id: request `i` goes to
    /// `/item/{keys[i]}`. `None`: every request goes to `/chaos`.
    pub keys: Option<Arc<[u32]>>,
}

/// Where requests go.
#[derive(Debug, Clone)]
pub enum Target {
    /// Straight to the upstream, one attempt.
    Direct(SocketAddr),
    /// Straight to the upstream, a hand-rolled retry loop: `attempts`
    /// attempts, fixed `backoff`, each bounded by `per_try`, retrying any
    /// error, timeout or 5xx/429, for every method.
    Naive {
        addr: SocketAddr,
        attempts: u32,
        backoff: Duration,
        per_try: Duration,
    },
    /// Through weir's listener, addressed to `host`.
    Weir { addr: SocketAddr, host: String },
    /// Straight to one of several replicas in turn (request `id` to
    /// `addrs[id % n]`), one attempt: a client of a name with several
    /// addresses and no proxy.
    Spread(Vec<SocketAddr>),
}

/// One client request as the driver saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestRecord {
    /// When it was sent, from the start of the run.
    pub start: Duration,
    /// How long until its whole response arrived (or it failed).
    pub latency: Duration,
    /// A 2xx arrived in full.
    pub ok: bool,
    /// The key it read (`Load::keys`), if any.
    pub key: Option<u32>,
}

/// What the client saw.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    pub requests: u64,
    pub successes: u64,
    /// Every request's latency, sorted.
    pub latencies: Vec<Duration>,
    /// Every request, by start time.
    pub records: Vec<RequestRecord>,
    /// When the run started: `records` are offsets from it.
    pub started: Option<Instant>,
    /// Connections the driver itself tried to open to the upstream and that
    /// were refused (only for targets that call the upstream directly).
    pub refused: u64,
}

impl Observed {
    pub fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i =
            ((self.latencies.len() as f64 * p).ceil() as usize).clamp(1, self.latencies.len()) - 1;
        self.latencies[i]
    }

    pub fn later_than(&self, d: Duration) -> u64 {
        self.latencies.iter().filter(|l| **l > d).count() as u64
    }

    /// The figures of `records` from a run that started at `started`.
    pub fn of(mut records: Vec<RequestRecord>, started: Instant, refused: u64) -> Observed {
        records.sort_by_key(|r| r.start);
        let mut latencies: Vec<Duration> = records.iter().map(|r| r.latency).collect();
        latencies.sort();
        Observed {
            requests: records.len() as u64,
            successes: records.iter().filter(|r| r.ok).count() as u64,
            latencies,
            records,
            started: Some(started),
            refused,
        }
    }
}

/// A plain HTTP/1.1 client sending whole bodies, as the driver and the soak use it.
pub(super) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Runs `load` against `target`.
pub async fn drive(target: Target, load: Load) -> Observed {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(http);
    let refused = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let one = |id: u64| {
        let (client, target, load) = (client.clone(), target.clone(), load.clone());
        let refused = refused.clone();
        async move {
            let t0 = Instant::now();
            let key = load.keys.as_ref().and_then(|k| k.get(id as usize).copied());
            let path = key.map_or_else(|| "/chaos".to_string(), |k| format!("/item/{k}"));
            let ok = tokio::time::timeout(
                load.client_timeout,
                request(&client, &target, &load.method, &path, id, &refused),
            )
            .await
            .unwrap_or(false);
            RequestRecord {
                start: t0.duration_since(started),
                latency: t0.elapsed(),
                ok,
                key,
            }
        }
    };
    let results = offer(&load, started, one).await;
    Observed::of(results, started, refused.load(Ordering::Relaxed))
}

/// Offers `load.requests` units of work (ids 0, 1, …) as `load.mode` says,
/// none after `load.max_time` from `started`, and collects what each one
/// returns once all have ended.
pub async fn offer<T, F, Fut>(load: &Load, started: Instant, mut one: F) -> Vec<T>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    let mut results: Vec<T> = Vec::with_capacity(load.requests);
    let mut next_id = 0u64;
    match load.mode {
        Mode::Closed(n) => {
            let mut offered = 0usize;
            loop {
                while tasks.len() < n.max(1)
                    && offered < load.requests
                    && started.elapsed() < load.max_time
                {
                    tasks.spawn(one(next_id));
                    next_id += 1;
                    offered += 1;
                }
                match tasks.join_next().await {
                    Some(Ok(r)) => results.push(r),
                    Some(Err(_)) => {}
                    None => break,
                }
            }
        }
        Mode::Open(rps) => {
            let every = Duration::from_secs_f64(1.0 / rps.max(0.001));
            for i in 0..load.requests {
                let at = started + every.mul_f64(i as f64);
                if at.duration_since(started) >= load.max_time {
                    break;
                }
                tokio::time::sleep_until(at).await;
                while let Some(r) = tasks.try_join_next() {
                    if let Ok(r) = r {
                        results.push(r);
                    }
                }
                tasks.spawn(one(next_id));
                next_id += 1;
            }
            while let Some(r) = tasks.join_next().await {
                if let Ok(r) = r {
                    results.push(r);
                }
            }
        }
    }
    results
}

/// One client request; `true` for a 2xx. Connections refused by the upstream
/// are counted in `refused`.
async fn request(
    client: &HttpClient,
    target: &Target,
    method: &Method,
    path: &str,
    id: u64,
    refused: &AtomicU64,
) -> bool {
    let counted = |s: Sent| {
        if s == Sent::Refused {
            refused.fetch_add(1, Ordering::Relaxed);
        }
        s
    };
    match target {
        Target::Direct(addr) => {
            counted(send(client, *addr, None, method, path, id).await) == Sent::Status(true)
        }
        Target::Weir { addr, host } => {
            send(client, *addr, Some(host), method, path, id).await == Sent::Status(true)
        }
        Target::Spread(addrs) => {
            let Some(addr) = addrs.get(id as usize % addrs.len().max(1)) else {
                return false;
            };
            counted(send(client, *addr, None, method, path, id).await) == Sent::Status(true)
        }
        Target::Naive {
            addr,
            attempts,
            backoff,
            per_try,
        } => {
            for i in 0..*attempts {
                let r = tokio::time::timeout(*per_try, send(client, *addr, None, method, path, id))
                    .await;
                match r.map(counted) {
                    Ok(Sent::Status(true)) => return true,
                    Ok(Sent::Final) => return false,
                    _ => {}
                }
                if i + 1 < *attempts {
                    tokio::time::sleep(*backoff).await;
                }
            }
            false
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// A response arrived in full: `true` for a 2xx; `false` for a 5xx or 429.
    Status(bool),
    /// A response a retry would not change (any other 4xx, 3xx).
    Final,
    /// The connection was refused: the upstream never saw the request.
    Refused,
    /// Any other transport failure.
    Failed,
}

/// Sends one attempt.
async fn send(
    client: &HttpClient,
    addr: SocketAddr,
    host: Option<&str>,
    method: &Method,
    path: &str,
    id: u64,
) -> Sent {
    let body = if *method == Method::POST {
        Bytes::from_static(b"{\"amount\":100}")
    } else {
        Bytes::new()
    };
    let mut b = Request::builder()
        .method(method.clone())
        .uri(format!("http://{addr}{path}"))
        .header(REQUEST_ID, id);
    if let Some(h) = host {
        b = b.header(http::header::HOST, h);
    }
    let Ok(req) = b.body(Full::new(body)) else {
        return Sent::Failed;
    };
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Sent::Refused,
        Err(_) => return Sent::Failed,
    };
    let status = resp.status().as_u16();
    // Read the whole body: a response counts when it has fully arrived.
    if resp.into_body().collect().await.is_err() {
        return Sent::Failed;
    }
    match status {
        200..=299 => Sent::Status(true),
        429 | 500.. => Sent::Status(false),
        _ => Sent::Final,
    }
}
