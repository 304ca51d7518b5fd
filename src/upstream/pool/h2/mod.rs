//! weir's own HTTP/2 pool for one endpoint of an upstream that speaks
//! HTTP/2 (`protocol = "h2c"` or `"grpc"`, cleartext or TLS; or `"auto"`
//! over TLS, once the endpoint chose `h2` by ALPN)
//! (docs/reference/endpoints.md#http2-connections). Its connections are
//! opened by `pool::open`, the one dialler, or handed to it open
//! ([`H2Pool::adopt`]: the `auto` dial that found `h2`).
//!
//! Each connection is the `h2` crate's client, driven directly (no
//! dispatch channel or task per request in between): a `SendRequest`, and
//! the connection's task. A request's body goes out from the request's own
//! task while it waits for the response head, and only a body still
//! streaming when the head arrives gets a task of its own ([`stream`]).
//! The pool
//!
//! - multiplexes: a request goes to the open connection with the fewest
//!   streams in flight, and a new connection is dialled only when every
//!   open one has as many as its peer allows (`SETTINGS_MAX_CONCURRENT_STREAMS`,
//!   read off the live connection) or none is open;
//! - dials once for many: requests that find no room wait for the one dial
//!   in progress (a `OnceCell` per dial), so forty requests to a cold
//!   endpoint make one connection, not forty, and a dial that fails fails
//!   them all at once rather than one connect timeout after another;
//! - retires a connection for good once it is going away: a stream refused
//!   by a GOAWAY, a request the connection handed back unsent, or its task
//!   gone. A retired connection finishes the streams it has and takes no
//!   new one; the request that found it so goes to another connection.
//! - closes connections idle longer than the upstream's `idle_timeout`.
//!
//! No per-request checkout: a send is a lock, a scan of a handful of
//! connections and a stream opened on one.

mod stream;

pub use stream::H2Body;

use super::io::FastTls;
use super::UpstreamIo;
use crate::upstream::send::{classify, Body, Failure, SendError};
use crate::upstream::Address;
use bytes::Bytes;
use http_body::Body as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// How many streams a connection is assumed to allow before its peer's
/// SETTINGS say (RFC 9113 §6.5.2 recommends no fewer than 100).
const INITIAL_MAX_STREAMS: usize = 100;

/// How many times one send looks for a connection before it gives up: each
/// time a connection turns out to be going away, the next is tried.
const MAX_TRIES: usize = 4;

/// How many dials one request waits through for room before it takes the
/// newest connection whatever its streams.
const MAX_DIAL_ROUNDS: usize = 4;

/// The result one dial gives every request that waited for it.
type Dialled = Result<Arc<H2Conn>, SendError>;

/// The HTTP/2 connections to one endpoint. Cheap to clone (shared).
#[derive(Clone)]
pub struct H2Pool {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for H2Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = self.shared.state.lock().map(|s| s.conns.len()).unwrap_or(0);
        f.debug_struct("H2Pool").field("open", &open).finish()
    }
}

struct Shared {
    /// Where its connections go, and how.
    dial: DialTo,
    /// The stream limit the endpoint's connections last reported: a new
    /// connection assumes it until its own peer's SETTINGS arrive.
    learned_max: Arc<AtomicUsize>,
    idle_timeout: Duration,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    conns: Vec<Arc<H2Conn>>,
    /// The dial in progress, if any: every request that finds no room waits
    /// on it.
    dialing: Option<Arc<tokio::sync::OnceCell<Dialled>>>,
}

/// An `auto` endpoint has not been dialled yet: its protocol is unknown.
pub(crate) const CHOSE_NONE: u8 = 0;
/// An `auto` endpoint chose HTTP/1.1 by ALPN.
pub(crate) const CHOSE_H1: u8 = 1;
/// An `auto` endpoint chose HTTP/2 by ALPN.
pub(crate) const CHOSE_H2: u8 = 2;

/// How an endpoint's HTTP/2 connections are opened.
pub(crate) struct DialTo {
    pub addr: Address,
    /// TLS, for an `https://` upstream.
    pub tls: Option<Arc<FastTls>>,
    pub connect_timeout: Duration,
    pub meter: crate::metrics::meter::Meter,
    /// An `auto` upstream's endpoint: what it chose by ALPN, set to
    /// HTTP/1.1 when a dial here finds it chose that.
    pub chose: Option<Arc<std::sync::atomic::AtomicU8>>,
}

/// One HTTP/2 connection: its sender, held by the pool (a request clones
/// it to open its stream), and what the pool counts of it.
struct H2Conn {
    send: h2::client::SendRequest<Bytes>,
    stats: Arc<ConnStats>,
}

/// What the pool counts of one connection; shared with the requests in
/// flight on it and its task.
pub(super) struct ConnStats {
    /// Streams open on it: counted from the request's send until the
    /// stream has ended both ways (the request body sent or abandoned, and
    /// the response body read to its end or dropped), as the peer counts
    /// them against its `SETTINGS_MAX_CONCURRENT_STREAMS`.
    in_flight: AtomicUsize,
    /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS, as the connection task
    /// last saw it.
    max_streams: AtomicUsize,
    /// Set once the connection is going away: it takes no new stream.
    retired: AtomicBool,
    /// When a request last started on it (ms since `epoch`).
    last_used: AtomicU64,
    epoch: Instant,
}

impl H2Conn {
    fn usable(&self, now: Instant, idle: Duration) -> bool {
        let s = &self.stats;
        !s.retired.load(Ordering::Relaxed)
            && (s.in_flight.load(Ordering::Relaxed) > 0 || self.idle_for(now) < idle)
    }

    fn has_room(&self) -> bool {
        let s = &self.stats;
        s.in_flight.load(Ordering::Relaxed) < s.max_streams.load(Ordering::Relaxed).max(1)
    }

    /// Counts one more request in flight on it, started at `now`.
    fn reserve(&self, now: Instant) {
        let s = &self.stats;
        s.in_flight.fetch_add(1, Ordering::Relaxed);
        let ms = now.saturating_duration_since(s.epoch).as_millis() as u64;
        s.last_used.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self, now: Instant) -> Duration {
        let s = &self.stats;
        let at = s.epoch + Duration::from_millis(s.last_used.load(Ordering::Relaxed));
        now.saturating_duration_since(at)
    }
}

/// The connection's task, reporting the peer's stream limit as it
/// changes; when it ends, its connection leaves the pool.
struct ConnTask<F> {
    conn: F,
    /// Polls so far: the peer's limit is read on each of the first few
    /// (its SETTINGS come right after the handshake), then on every 64th
    /// (it rarely changes later, and reading it takes h2's lock).
    polls: u32,
    stats: Arc<ConnStats>,
    learned: Arc<AtomicUsize>,
    pool: std::sync::Weak<Shared>,
}

impl<F> ConnTask<F> {
    /// The connection is gone: it takes nothing more, and the pool lets go
    /// of its sender.
    fn ended(&self) {
        self.stats.retired.store(true, Ordering::Relaxed);
        if let Some(shared) = self.pool.upgrade() {
            if let Ok(mut state) = shared.state.lock() {
                state.conns.retain(|c| !Arc::ptr_eq(&c.stats, &self.stats));
            }
        }
    }
}

impl Future for ConnTask<h2::client::Connection<UpstreamIo, Bytes>> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let r = Pin::new(&mut this.conn).poll(cx);
        this.polls = this.polls.wrapping_add(1);
        if this.polls < 16 || this.polls % 64 == 0 {
            let max = this.conn.max_concurrent_send_streams();
            if this.stats.max_streams.swap(max, Ordering::Relaxed) != max {
                this.learned.store(max, Ordering::Relaxed);
            }
        }
        match r {
            Poll::Ready(Ok(())) => {
                this.ended();
                Poll::Ready(())
            }
            Poll::Ready(Err(e)) => {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
                this.ended();
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One stream counted open on its connection until it has ended both
/// ways: held by the attempt until the response head, then by the
/// response body (or, while the request body still streams, by its pump).
pub(super) struct OpenStream(Arc<ConnStats>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl H2Pool {
    /// A pool dialling as `dial` says; connections idle longer than
    /// `idle_timeout` are closed.
    pub(crate) fn new(dial: DialTo, idle_timeout: Duration) -> Self {
        H2Pool {
            shared: Arc::new(Shared {
                dial,
                learned_max: Arc::new(AtomicUsize::new(INITIAL_MAX_STREAMS)),
                idle_timeout,
                state: Mutex::new(PoolState::default()),
            }),
        }
    }

    /// Sends one request on a connection with room, dialling one if none
    /// has. A connection found going away before the stream opened is
    /// retired and the request goes to another; once the stream is open,
    /// what happens to it is the attempt's outcome.
    pub async fn send(
        &self,
        req: http::Request<Body>,
    ) -> Result<http::Response<H2Body>, SendError> {
        let (mut parts, body) = req.into_parts();
        strip_connection_fields(&mut parts.headers);
        let mut last = None;
        for _ in 0..MAX_TRIES {
            let (send, stats) = {
                let conn = self.checkout().await?;
                (conn.send.clone(), conn.stats.clone())
            };
            let open = OpenStream(stats.clone());
            let mut send = match send.ready().await {
                Ok(s) => s,
                Err(e) => {
                    // Going away or gone: nothing was sent on it.
                    stats.retired.store(true, Ordering::Relaxed);
                    let mut err = classify(&e);
                    if err.kind != Failure::NotProcessed {
                        err.kind = Failure::NotSent;
                    }
                    last = Some(err);
                    continue;
                }
            };
            let end = body.is_end_stream();
            let head = http::Request::from_parts(parts, ());
            let (response, stream) = match send.send_request(head, end) {
                Ok(r) => r,
                // A head h2 will not send (a field HTTP/2 forbids): ours to
                // answer, and the connection is fine.
                Err(e) if !(e.is_go_away() || e.is_io() || e.is_remote() || e.is_library()) => {
                    return Err(SendError::new(Failure::ClientBody, e.to_string()));
                }
                Err(e) => {
                    let mut err = classify(&e);
                    stats.retired.store(true, Ordering::Relaxed);
                    if err.kind != Failure::NotProcessed {
                        err.kind = Failure::NotSent;
                    }
                    return Err(err);
                }
            };
            drop(send);
            // The body goes out while the head is awaited; what is left of
            // it when the head arrives (a stream) goes on in a task.
            let mut pump = (!end).then(|| stream::Pump::new(stream, body));
            let mut response = response;
            let mut body_failed = false;
            let got = std::future::poll_fn(|cx| {
                if let Some(p) = pump.as_mut() {
                    if let Poll::Ready(failed) = Pin::new(p).poll(cx) {
                        body_failed = failed;
                        pump = None;
                    }
                }
                Pin::new(&mut response).poll(cx)
            })
            .await;
            return match got {
                Ok(resp) => {
                    let length = resp
                        .headers()
                        .get(http::header::CONTENT_LENGTH)
                        .and_then(|v| crate::h1::content_length(v.as_bytes()));
                    // The stream stays counted open until it has ended both
                    // ways. A body still going out is pumped by a task that
                    // ends when the response does: once the response is
                    // whole, or dropped because the client left, nothing
                    // more of the request is wanted, and its stream is reset
                    // so that its slot on the connection (and what h2 holds
                    // for it) is given back (docs/reference/endpoints.md#http2-connections).
                    let end = match pump {
                        Some(p) => {
                            let (tell, told) = tokio::sync::oneshot::channel();
                            tokio::spawn(p.until_answered(told, open));
                            stream::End::Tell(tell)
                        }
                        None => stream::End::Hold { _open: open },
                    };
                    Ok(resp.map(|recv| H2Body::new(recv, length, end)))
                }
                // The client's body failed, and the stream was reset for it:
                // the client's failure, not the upstream's.
                Err(e) if body_failed => Err(SendError::new(
                    Failure::ClientBody,
                    format!("the client's request body failed ({e})"),
                )),
                Err(e) => {
                    let err = classify(&e);
                    if err.kind == Failure::NotProcessed {
                        // Going away: nothing new goes to this connection.
                        stats.retired.store(true, Ordering::Relaxed);
                    }
                    Err(err)
                }
            };
        }
        Err(last.unwrap_or_else(|| {
            SendError::new(Failure::NotSent, "no HTTP/2 connection took the request")
        }))
    }

    /// A usable connection with room for one more stream, or a new one,
    /// with that stream counted in flight on it (under the lock, so a burst
    /// does not all see the same room).
    async fn checkout(&self) -> Result<Arc<H2Conn>, SendError> {
        let mut dialled = None;
        for _ in 0..MAX_DIAL_ROUNDS {
            let cell = {
                let mut state = self
                    .shared
                    .state
                    .lock()
                    .map_err(|_| SendError::new(Failure::NotSent, "HTTP/2 pool poisoned"))?;
                let now = Instant::now();
                let idle = self.shared.idle_timeout;
                // Dropping a connection's last `SendRequest` closes it (GOAWAY
                // once its streams are done).
                state.conns.retain(|c| c.usable(now, idle));
                let best = state
                    .conns
                    .iter()
                    .filter(|c| c.has_room())
                    .min_by_key(|c| c.stats.in_flight.load(Ordering::Relaxed));
                if let Some(c) = best {
                    c.reserve(now);
                    return Ok(c.clone());
                }
                state
                    .dialing
                    .get_or_insert_with(|| Arc::new(tokio::sync::OnceCell::new()))
                    .clone()
            };
            let shared = self.shared.clone();
            let conn = cell
                .get_or_init(|| async move {
                    // Boxed: a dial (connect, handshake) is most of this
                    // future's size, and every attempt's future, on both
                    // paths, would carry it and copy it layer by layer.
                    let r = Box::pin(shared.dial()).await;
                    if let Ok(state) = &mut shared.state.lock() {
                        state.dialing = None;
                        if let Ok(c) = &r {
                            state.conns.push(c.clone());
                        }
                    }
                    r
                })
                .await
                .clone()?;
            // Back to the scan: the new connection has room for as many
            // streams as its peer allows, and the rest of those who waited
            // dial the next one.
            dialled = Some(conn);
        }
        // Still no room after several dials (a peer allowing next to no
        // streams): the last connection takes it, and h2 queues the stream.
        let conn =
            dialled.ok_or_else(|| SendError::new(Failure::NotSent, "no HTTP/2 connection"))?;
        conn.reserve(Instant::now());
        Ok(conn)
    }
    /// Whether an open connection has room for one more stream now.
    pub(crate) fn has_room(&self) -> bool {
        let now = Instant::now();
        let idle = self.shared.idle_timeout;
        self.shared
            .state
            .lock()
            .is_ok_and(|s| s.conns.iter().any(|c| c.usable(now, idle) && c.has_room()))
    }

    /// Takes a connection already open to the endpoint (an `auto` dial
    /// that found `h2`): its handshake, then it serves as any other.
    pub(crate) async fn adopt(&self, io: UpstreamIo) -> Result<(), SendError> {
        let conn = self.shared.handshake(io).await?;
        if let Ok(state) = &mut self.shared.state.lock() {
            state.conns.push(conn);
        }
        Ok(())
    }
}

impl Shared {
    /// Connects, shakes hands and starts the connection's task.
    async fn dial(self: &Arc<Self>) -> Dialled {
        let d = &self.dial;
        let io = super::open(d.addr, d.connect_timeout, d.tls.as_deref(), &d.meter).await?;
        if let Some(chose) = &d.chose {
            if !io.chose_h2() {
                // The endpoint speaks HTTP/1.1 now: the next attempt leases.
                chose.store(CHOSE_H1, Ordering::Relaxed);
                let why = "the endpoint chose HTTP/1.1 by ALPN";
                return Err(SendError::new(Failure::Connect, why));
            }
        }
        self.handshake(io).await
    }

    /// The HTTP/2 handshake over `io`, and the connection's task started.
    async fn handshake(self: &Arc<Self>, io: UpstreamIo) -> Dialled {
        let assumed = self.learned_max.load(Ordering::Relaxed).max(1);
        let (send, conn) = builder(assumed).handshake(io).await.map_err(|e| {
            // The connection is up but no HTTP/2 came back: nothing of any
            // request was sent.
            SendError::new(
                Failure::Connect,
                format!(
                    "HTTP/2 handshake: {}",
                    crate::upstream::send::root_cause(&e)
                ),
            )
        })?;
        let stats = Arc::new(ConnStats {
            in_flight: AtomicUsize::new(0),
            max_streams: AtomicUsize::new(assumed),
            retired: AtomicBool::new(false),
            last_used: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        tokio::spawn(ConnTask {
            conn,
            polls: 0,
            stats: stats.clone(),
            learned: self.learned_max.clone(),
            pool: Arc::downgrade(self),
        });
        Ok(Arc::new(H2Conn { send, stats }))
    }
}

/// Fields HTTP/2 forbids (RFC 9113 §8.2.2), dropped as hyper's client
/// drops them: the chunked coding the general path names for an HTTP/1.1
/// upstream, and any connection-specific field left.
fn strip_connection_fields(h: &mut http::HeaderMap) {
    use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
    for name in [CONNECTION, TRANSFER_ENCODING, UPGRADE] {
        h.remove(name);
    }
    h.remove("keep-alive");
    h.remove("proxy-connection");
    if h.get(TE).is_some_and(|v| v != "trailers") {
        h.remove(TE);
    }
}

/// The HTTP/2 settings of weir's upstream connections
/// (docs/reference/endpoints.md#http2-connections): `assumed` streams until
/// the peer's SETTINGS say, hyper's client windows (2 MiB a stream, 5 MiB
/// the connection), no server push, and the same response-head limit as
/// HTTP/1.1.
fn builder(assumed: usize) -> h2::client::Builder {
    let mut b = h2::client::Builder::new();
    b.initial_max_send_streams(assumed)
        .initial_window_size(2 * 1024 * 1024)
        .initial_connection_window_size(5 * 1024 * 1024)
        .max_frame_size(16 * 1024)
        .max_send_buffer_size(1024 * 1024)
        .enable_push(false)
        .max_header_list_size(crate::upstream::send::MAX_RESPONSE_HEAD as u32);
    b
}
