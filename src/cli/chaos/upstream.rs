//! The fault-injecting upstream: a real HTTP/1.1 + h2c server that fails on
//! purpose, in the ways `Profile` describes, and counts what it received.
//!
//! Every connection is set to linger 0, so dropping one is a TCP reset. An
//! outage window closes the listener (new connections are refused) and resets
//! the live ones; when it ends the same port is bound again.

use crate::policy::{Random, SeededRandom, TokenBucket};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// The header the load driver sets on every request, to count duplicates.
pub const REQUEST_ID: &str = "x-chaos-request-id";

/// How long responses take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    None,
    Fixed(Duration),
    Uniform(Duration, Duration),
    /// `base` for most requests; `tail` for a share `p` of them.
    LongTail {
        base: Duration,
        p: f64,
        tail: Duration,
    },
    /// Uniform from `lo` to `hi` for most requests; `tail` for a share `p`.
    UniformTail {
        lo: Duration,
        hi: Duration,
        p: f64,
        tail: Duration,
    },
}

/// Above `rps`, answer `status` with `Retry-After: retry_after` seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throttle {
    pub rps: f64,
    pub status: u16,
    pub retry_after: u64,
}

/// A fixed capacity (`weir chaos overload`): `slots` requests served at
/// once, each for the profile's latency, the rest queued in arrival order.
/// A queued request is served when its turn comes whether or not its
/// client is still waiting, as a thread pool's queue is. From `halve_at`
/// after the start, half the slots. With `shed`, nothing is queued: a
/// request that finds every slot taken is answered that status at once
/// (`weir chaos overload-shed`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    pub slots: u32,
    pub halve_at: Option<Duration>,
    pub shed: Option<u16>,
}

/// What the upstream does wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Share of requests answered `fail_status`.
    pub fail_rate: f64,
    pub fail_status: u16,
    /// Share of requests reset before the upstream reads them (not processed).
    pub reset_before: f64,
    /// Share of requests reset after the upstream processed them.
    pub reset_after: f64,
    pub latency: Latency,
    /// Windows `(start, length)` from the upstream's start during which
    /// connections are refused.
    pub outages: Vec<(Duration, Duration)>,
    pub throttle: Option<Throttle>,
    /// Share of requests processed, then answered only after `hang`.
    pub hang_rate: f64,
    pub hang: Duration,
    /// A `Cache-Control` value for every 2xx, making it cacheable.
    pub cache_control: Option<&'static str>,
    /// Serve at most this many at once, queueing the rest.
    pub capacity: Option<Capacity>,
    /// A request whose path starts with `/big` is answered with this many
    /// bytes (`weir chaos slow-readers`).
    pub big_body: Option<usize>,
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            fail_rate: 0.0,
            fail_status: 503,
            reset_before: 0.0,
            reset_after: 0.0,
            latency: Latency::None,
            outages: Vec::new(),
            throttle: None,
            hang_rate: 0.0,
            hang: Duration::from_secs(5),
            cache_control: None,
            capacity: None,
            big_body: None,
        }
    }
}

/// What the upstream counted.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests that reached the upstream (whatever it then did with them).
    pub received: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Requests a full capacity with `shed` refused.
    pub shed: AtomicU64,
    /// Requests received before the first outage began (set when it does).
    pub before_outage: std::sync::OnceLock<u64>,
    /// Deliveries per request id, for non-idempotent methods.
    deliveries: Mutex<HashMap<String, u32>>,
}

impl Counters {
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Deliveries beyond the first of the same non-idempotent request.
    pub fn duplicates(&self) -> u64 {
        let d = self.deliveries.lock().expect("counter lock poisoned");
        d.values().map(|n| u64::from(n.saturating_sub(1))).sum()
    }

    fn delivered(&self, method: &http::Method, id: Option<&str>) {
        if matches!(*method, http::Method::POST | http::Method::PATCH) {
            if let Some(id) = id {
                *self
                    .deliveries
                    .lock()
                    .expect("counter lock poisoned")
                    .entry(id.to_string())
                    .or_insert(0) += 1;
            }
        }
    }
}

/// A running fault-injecting upstream.
#[derive(Debug)]
pub struct ChaosUpstream {
    pub addr: SocketAddr,
    pub counters: Arc<Counters>,
    /// When it started: the profile's outage windows count from here.
    pub started: Instant,
    task: JoinHandle<()>,
    /// The slots of a fixed capacity: closed when dropped, so that the
    /// queued work ends with the upstream.
    pool: Option<Arc<Semaphore>>,
}

impl Drop for ChaosUpstream {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(p) = &self.pool {
            p.close();
        }
    }
}

struct Faults {
    profile: Profile,
    rng: Mutex<SeededRandom>,
    throttle: Mutex<Option<TokenBucket>>,
    started: Instant,
    counters: Arc<Counters>,
    pool: Option<Arc<Semaphore>>,
}

enum Act {
    Answer {
        status: u16,
        retry_after: Option<u64>,
        delay: Duration,
    },
    ResetBefore,
    ResetAfter,
}

impl Faults {
    fn draw(&self) -> f64 {
        self.rng.lock().expect("rng lock poisoned").next_f64()
    }

    fn latency(&self) -> Duration {
        match self.profile.latency {
            Latency::None => Duration::ZERO,
            Latency::Fixed(d) => d,
            Latency::Uniform(a, b) => a + (b.saturating_sub(a)).mul_f64(self.draw()),
            Latency::LongTail { base, p, tail } => {
                if self.draw() < p {
                    tail
                } else {
                    base
                }
            }
            Latency::UniformTail { lo, hi, p, tail } => {
                if self.draw() < p {
                    tail
                } else {
                    lo + (hi.saturating_sub(lo)).mul_f64(self.draw())
                }
            }
        }
    }

    fn decide(&self) -> Act {
        let p = &self.profile;
        if p.reset_before > 0.0 && self.draw() < p.reset_before {
            return Act::ResetBefore;
        }
        if p.reset_after > 0.0 && self.draw() < p.reset_after {
            return Act::ResetAfter;
        }
        if let Some(t) = p.throttle {
            let now = self.started.elapsed();
            let mut b = self.throttle.lock().expect("throttle lock poisoned");
            let bucket =
                b.get_or_insert_with(|| TokenBucket::new(t.rps, t.rps.ceil().max(1.0) as u32, now));
            if !bucket.try_take(1, now) {
                return Act::Answer {
                    status: t.status,
                    retry_after: Some(t.retry_after),
                    delay: Duration::ZERO,
                };
            }
        }
        let mut delay = self.latency();
        if p.hang_rate > 0.0 && self.draw() < p.hang_rate {
            delay = p.hang;
        }
        let status = if p.fail_rate > 0.0 && self.draw() < p.fail_rate {
            p.fail_status
        } else {
            200
        };
        Act::Answer {
            status,
            retry_after: None,
            delay,
        }
    }

    /// The outage window `now` falls in, as its end.
    fn outage_end(&self, now: Duration) -> Option<Duration> {
        self.profile
            .outages
            .iter()
            .find(|(s, len)| now >= *s && now < *s + *len)
            .map(|(s, len)| *s + *len)
    }
}

impl ChaosUpstream {
    /// Binds `addr` (use port 0 for any) and serves `profile` with `seed`.
    pub async fn start(
        addr: SocketAddr,
        profile: Profile,
        seed: u64,
    ) -> std::io::Result<ChaosUpstream> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let started = Instant::now();
        let capacity = profile.capacity;
        let pool = capacity.map(|c| Arc::new(Semaphore::new(c.slots as usize)));
        let faults = Arc::new(Faults {
            profile,
            rng: Mutex::new(SeededRandom::new(seed)),
            throttle: Mutex::new(None),
            started,
            counters: counters.clone(),
            pool: pool.clone(),
        });
        let halving = halve(capacity, pool.clone(), started);
        let task = tokio::spawn(async move {
            tokio::join!(serve(listener, addr, faults), halving);
        });
        Ok(ChaosUpstream {
            addr,
            counters,
            started,
            task,
            pool,
        })
    }
}

/// Takes half the slots away at `halve_at` (for good: its permits are
/// forgotten), as soon as they are free, before any request queued after.
async fn halve(capacity: Option<Capacity>, pool: Option<Arc<Semaphore>>, started: Instant) {
    let (Some(c), Some(pool)) = (capacity, pool) else {
        return;
    };
    let Some(at) = c.halve_at else { return };
    tokio::time::sleep_until(started + at).await;
    let gone = c.slots - c.slots / 2;
    if let Ok(p) = pool.acquire_many_owned(gone).await {
        p.forget();
    }
}

async fn serve(mut listener: TcpListener, addr: SocketAddr, faults: Arc<Faults>) {
    let mut conns = JoinSet::new();
    loop {
        // The next outage boundary, if any: one whose start has passed
        // unseen (this task first ran late, on a loaded machine) begins now.
        let now = faults.started.elapsed();
        let next_outage = faults
            .profile
            .outages
            .iter()
            .filter(|(s, len)| *s + *len > now)
            .map(|(s, _)| *s)
            .min();
        let accepted = match next_outage {
            Some(at) => tokio::select! {
                a = listener.accept() => Some(a),
                _ = tokio::time::sleep_until(faults.started + at) => None,
            },
            None => Some(listener.accept().await),
        };
        match accepted {
            Some(Ok((stream, _))) => {
                // linger 0: dropping a connection resets it.
                let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                let _ = stream.set_nodelay(true);
                faults.counters.connections.fetch_add(1, Ordering::Relaxed);
                while conns.try_join_next().is_some() {}
                conns.spawn(connection(stream, faults.clone()));
            }
            Some(Err(_)) => tokio::time::sleep(Duration::from_millis(5)).await,
            None => {
                // Outage: refuse new connections, reset live ones.
                let Some(end) = faults.outage_end(faults.started.elapsed()) else {
                    continue;
                };
                let _ = faults
                    .counters
                    .before_outage
                    .set(faults.counters.received());
                drop(listener);
                conns.abort_all();
                tokio::time::sleep_until(faults.started + end).await;
                listener = loop {
                    match TcpListener::bind(addr).await {
                        Ok(l) => break l,
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                };
            }
        }
    }
}

async fn connection(stream: tokio::net::TcpStream, faults: Arc<Faults>) {
    let reset = Arc::new(Notify::new());
    let r = reset.clone();
    let svc = service_fn(move |req| {
        let faults = faults.clone();
        let reset = r.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(req, &faults, &reset).await) }
    });
    let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    b.http1().timer(TokioTimer::new());
    let conn = b.serve_connection(TokioIo::new(stream), svc);
    tokio::select! {
        _ = conn => {}
        // Dropping the connection with linger 0 sends the reset.
        _ = reset.notified() => {}
    }
}

async fn handle(req: Request<Incoming>, faults: &Faults, reset: &Notify) -> Response<Full<Bytes>> {
    faults.counters.received.fetch_add(1, Ordering::Relaxed);
    let act = faults.decide();
    if let Act::ResetBefore = act {
        reset.notify_one();
        return std::future::pending().await;
    }
    let method = req.method().clone();
    let big = faults
        .profile
        .big_body
        .filter(|_| req.uri().path().starts_with("/big"));
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Read the body: the request is processed only once all of it arrived.
    let _ = req.into_body().collect().await;
    faults.counters.delivered(&method, id.as_deref());
    match act {
        Act::ResetAfter | Act::ResetBefore => {
            reset.notify_one();
            std::future::pending().await
        }
        Act::Answer {
            status,
            retry_after,
            delay,
        } => {
            let shed = faults.profile.capacity.and_then(|c| c.shed);
            if let (Some(pool), Some(shed)) = (faults.pool.clone(), shed) {
                // Shedding: a slot now, or the refusal at once.
                let Ok(slot) = pool.try_acquire_owned() else {
                    faults.counters.shed.fetch_add(1, Ordering::Relaxed);
                    let mut r = Response::new(Full::new(Bytes::from_static(b"shed\n")));
                    *r.status_mut() =
                        StatusCode::from_u16(shed).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                    return r;
                };
                let work = tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    drop(slot);
                });
                let _ = work.await;
            } else if let Some(pool) = faults.pool.clone() {
                // Queued for a slot, and served once it has one, whether or
                // not the client is still there.
                let work = tokio::spawn(async move {
                    if let Ok(_slot) = pool.acquire_owned().await {
                        tokio::time::sleep(delay).await;
                    }
                });
                let _ = work.await;
            } else if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let body = match big {
                Some(n) => Bytes::from(vec![b'x'; n]),
                None => Bytes::from_static(b"chaos\n"),
            };
            let mut r = Response::new(Full::new(body));
            *r.status_mut() =
                StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            if let Some(ra) = retry_after {
                r.headers_mut()
                    .insert(http::header::RETRY_AFTER, http::HeaderValue::from(ra));
            }
            if let Some(cc) = faults.profile.cache_control.filter(|_| status < 300) {
                r.headers_mut().insert(
                    http::header::CACHE_CONTROL,
                    http::HeaderValue::from_static(cc),
                );
            }
            r
        }
    }
}

/// `none`, `fixed:20ms`, `uniform:1ms-50ms`, `tail:2ms,1%,500ms`,
/// `tail:2ms-5ms,2%,1s` (a uniform base).
pub fn parse_latency(s: &str) -> Result<Latency, String> {
    let d = crate::config::duration::parse;
    let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
    match kind {
        "none" => Ok(Latency::None),
        "fixed" => Ok(Latency::Fixed(d(rest)?)),
        "uniform" => {
            let (a, b) = rest
                .split_once('-')
                .ok_or("uniform:MIN-MAX, e.g. uniform:1ms-50ms")?;
            Ok(Latency::Uniform(d(a)?, d(b)?))
        }
        "tail" => {
            let parts: Vec<&str> = rest.split(',').collect();
            let [base, p, tail] = parts[..] else {
                return Err("tail:BASE,P%,TAIL, e.g. tail:2ms,1%,500ms".into());
            };
            let p: f64 = p
                .trim_end_matches('%')
                .parse()
                .map_err(|_| format!("invalid share {p:?}"))?;
            if let Some((lo, hi)) = base.split_once('-') {
                return Ok(Latency::UniformTail {
                    lo: d(lo)?,
                    hi: d(hi)?,
                    p: p / 100.0,
                    tail: d(tail)?,
                });
            }
            Ok(Latency::LongTail {
                base: d(base)?,
                p: p / 100.0,
                tail: d(tail)?,
            })
        }
        _ => Err(format!(
            "unknown latency {s:?}: none, fixed:D, uniform:MIN-MAX or tail:BASE[-MAX],P%,TAIL"
        )),
    }
}

/// `START+LEN`, e.g. `10s+30s`.
pub fn parse_outage(s: &str) -> Result<(Duration, Duration), String> {
    let (a, b) = s.split_once('+').ok_or("START+LEN, e.g. 10s+30s")?;
    Ok((
        crate::config::duration::parse(a)?,
        crate::config::duration::parse(b)?,
    ))
}
