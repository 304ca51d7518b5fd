//! The hyper connection driver: one client connection (plain TCP, TLS, or
//! handed over by the fast path with the bytes it read) served by hyper's
//! HTTP/1.1 and HTTP/2 server behind the request-smuggling guard, drained
//! gracefully when weir stops. The listeners (`crate::proxy::server`) and the fast
//! path (`crate::proxy::fast`) both end here; neither depends on the other.

use super::guard::FramingGuard;
use crate::config::Config;
use crate::proxy::body::boxed;
use crate::proxy::general;
use crate::proxy::{ListenerRole, Snapshot};
use crate::shutdown::stopped;
use crate::state::StateRegistry;
use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

/// State shared by every listener and connection.
#[derive(Debug)]
pub(in crate::proxy) struct ServeState {
    pub(in crate::proxy) snapshot: ArcSwap<Snapshot>,
    pub(in crate::proxy) states: StateRegistry,
    /// Each upstream's endpoints and connections, kept across reloads.
    pub(in crate::proxy) reaches: crate::upstream::reach::ReachRegistry,
    pub(in crate::proxy) connections: Arc<Semaphore>,
    pub(in crate::proxy) draining: AtomicBool,
    /// The span exporter, kept across reloads (`[tracing]`).
    pub(in crate::proxy) tracing: crate::trace::Registry,
}

/// hyper's server, configured from the config's `[server]` table.
pub(in crate::proxy) fn builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        // The guard (`proxy::general::guard`) times request heads from their first
        // byte: hyper's own timer would run from the end of the last
        // response, and cut a kept-alive connection that is merely quiet
        // (`client_idle_timeout` bounds that, in `Activity`).
        .header_read_timeout(None)
        .max_buf_size(config.server.max_header_bytes)
        // Header names go on with the case they came in, as on the fast
        // path: an HTTP/1.1 peer that cares about case sees no difference.
        .preserve_header_case(true)
        .keep_alive(true);
    // Above `max_header_bytes`, so that weir answers a header list over
    // the limit itself (`over_header_limit`): h2 answers one over its own
    // limit with a bare 431, which a gRPC client takes for no status at all.
    let h2_limit = config.server.max_header_bytes.saturating_mul(2);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(h2_limit.min(u32::MAX as usize) as u32)
        .max_concurrent_streams(config.server.max_streams_per_connection);
    b
}

/// Whether an HTTP/2 request's header list is larger than `max` bytes,
/// counted as RFC 9113 §6.5.2 (and h2) count it: each field's name and
/// value and 32 more, the pseudo-fields included. h2 reads up to twice
/// that ([`builder`]), so that weir refuses it with its own 431 — gRPC-shaped
/// for a gRPC request (docs/reference/routing.md#header-hygiene).
pub(in crate::proxy) fn over_header_limit(parts: &http::request::Parts, max: usize) -> bool {
    let field = |name: usize, value: usize| name + value + 32;
    let uri = &parts.uri;
    let pseudo = field(":method".len(), parts.method.as_str().len())
        + field(":scheme".len(), uri.scheme_str().map_or(0, str::len))
        + field(
            ":authority".len(),
            uri.authority().map_or(0, |a| a.as_str().len()),
        )
        + field(
            ":path".len(),
            uri.path_and_query().map_or(0, |p| p.as_str().len()),
        );
    let mut size = pseudo;
    for (name, value) in &parts.headers {
        size += field(name.as_str().len(), value.len());
        if size > max {
            return true;
        }
    }
    size > max
}

/// One client connection's context, however its bytes arrive (plain or TLS).
pub(in crate::proxy) struct ClientConn {
    pub(in crate::proxy) peer: crate::address::Address,
    pub(in crate::proxy) role: ListenerRole,
    pub(in crate::proxy) shared: Arc<ServeState>,
    pub(in crate::proxy) stop: watch::Receiver<bool>,
    pub(in crate::proxy) builder: auto::Builder<TokioExecutor>,
    pub(in crate::proxy) max_head: usize,
    pub(in crate::proxy) head_timeout: Duration,
    /// With no request in flight this long, the connection is closed.
    pub(in crate::proxy) idle_timeout: Duration,
    /// A response the client takes nothing of for this long ends the connection.
    pub(in crate::proxy) write_timeout: Duration,
    /// Abandoned requests per second that end the connection.
    pub(in crate::proxy) max_resets: u32,
    /// The worker's idle upstream connections (`upstream::pool`).
    pub(in crate::proxy) pool: Arc<crate::upstream::pool::H1Pool>,
}

impl ClientConn {
    /// A client connection's context on a listener of `role`, as the config
    /// now says (either listener kind; `listen_unix` too).
    pub(in crate::proxy) fn new(
        peer: crate::address::Address,
        role: ListenerRole,
        shared: Arc<ServeState>,
        stop: watch::Receiver<bool>,
        pool: Arc<crate::upstream::pool::H1Pool>,
    ) -> ClientConn {
        let snap = shared.snapshot.load();
        let s = &snap.config.server;
        let (builder, max_head, head_timeout, idle_timeout, write_timeout, max_resets) = (
            builder(&snap.config),
            s.max_header_bytes,
            s.header_read_timeout,
            s.client_idle_timeout,
            s.client_write_timeout,
            s.max_resets_per_second,
        );
        drop(snap);
        ClientConn {
            peer,
            role,
            shared,
            stop,
            builder,
            max_head,
            head_timeout,
            idle_timeout,
            write_timeout,
            max_resets,
            pool,
        }
    }
}

/// One client connection in `weir_client_connections_open`, from accept
/// to its end on either path.
pub(in crate::proxy) struct OpenClient(prometheus::IntGauge);

impl OpenClient {
    pub(in crate::proxy) fn client(metrics: &crate::metrics::Metrics) -> OpenClient {
        let open = metrics.client_connections().clone();
        open.inc();
        OpenClient(open)
    }
}

impl Drop for OpenClient {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pub(in crate::proxy) async fn serve_io<I>(io: I, conn: ClientConn)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let ClientConn {
        peer,
        role,
        shared,
        mut stop,
        builder,
        max_head,
        head_timeout,
        idle_timeout,
        write_timeout,
        max_resets,
        pool,
    } = conn;
    let ctx = Arc::new(crate::upstream::pool::held::ConnCtx::new(pool));
    let guard = FramingGuard::new(io, max_head, head_timeout);
    let h2 = guard.h2_flag();
    // Which HTTP/1 request is the guard's marker for a head it refused.
    let verdict = guard.verdict();
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let activity = Arc::new(Activity::new(max_resets));
    let busy_on = activity.clone();
    // The stop signal each HTTP/1 response reads (draining).
    let draining = stop.clone();
    let svc = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        req.extensions_mut()
            .insert(crate::proxy::access::ClientAddr(peer));
        let snap = shared.snapshot.load_full();
        let role = role.clone();
        let ctx = ctx.clone();
        let h1 = req.version() < http::Version::HTTP_2;
        let connect = req.method() == http::Method::CONNECT;
        let draining = draining.clone();
        let refused = if h1 {
            let n = served.fetch_add(1, Ordering::Relaxed) + 1;
            verdict.refusal(n)
        } else {
            None
        };
        // In flight until its response body is done with (finished, or the
        // stream reset).
        let busy = busy_on.begin();
        async move {
            // Boxed: the request's future is large (every path a request may
            // take, each attempt's state), and hyper moves the future it is
            // given — into an HTTP/2 stream's task, into the HTTP/1
            // dispatcher's slot — once per request. A move of the box is a
            // pointer; of the future itself, tens of KiB of memcpy
            // (`SHAPE=h2-in bench/callgrind.sh`).
            let mut resp = Box::pin(general::handle(&snap, &role, &ctx, req, refused)).await;
            // Draining (docs/reference/shutdown.md#shutdown): every HTTP/1.1
            // response says the connection closes after it, so that the
            // client's pool lets it go between requests, never under one —
            // except one that switches the connection to something else (a
            // 101, a CONNECT's 2xx), which must say so.
            let switched = resp.status() == http::StatusCode::SWITCHING_PROTOCOLS
                || (connect && resp.status().is_success());
            if h1 && !switched && *draining.borrow() {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            // The head is handed over now; until hyper asks for the body,
            // it waits on the client (an HTTP/2 window of 0 never asks).
            busy.handed_now();
            // To an HTTP/1.x client, a body with a `Content-Length` ends
            // when that many bytes have gone: hyper asks no further, and
            // the request is done, not abandoned, though the upstream may
            // end its stream a frame later.
            let left = resp
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| crate::h1::content_length(v.as_bytes()))
                .filter(|_| h1);
            Ok::<_, Infallible>(resp.map(|b| {
                boxed(Holding {
                    inner: b,
                    busy,
                    left,
                })
            }))
        }
    });
    let io = TokioIo::new(guard);
    let conn = builder.serve_connection_with_upgrades(io, svc);
    tokio::pin!(conn);
    // The connection first: a request the fast path handed over with its
    // bytes is parsed in this first poll and so counts as in flight when
    // a drain begins.
    tokio::select! {
        biased;
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "client connection ended with an error");
            }
            return;
        }
        _ = stopped(&mut stop) => {}
        ending = activity.watch(idle_timeout, write_timeout) => {
            if ending == ActivityEnd::Resets {
                // Requests opened and abandoned faster than anyone reads
                // answers (HTTP/2 rapid reset, delayed or not).
                tracing::debug!(%peer, max_resets, "too many abandoned requests; connection closed");
                return;
            }
            if ending == ActivityEnd::Stalled {
                // A client that takes nothing of a response: let it go, and
                // with it every slot its requests hold.
                tracing::debug!(%peer, write_timeout = %crate::config::duration::format(write_timeout), "client stopped reading; connection closed");
                return;
            }
            tracing::debug!(%peer, idle_timeout = %crate::config::duration::format(idle_timeout), "closing an idle client connection");
            // An HTTP/2 goodbye waits for the client to answer a PING; one
            // that never answers is not waited for longer than a head.
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(head_timeout, conn).await;
            return;
        }
    }
    // Draining. HTTP/2 (the preface seen, now or later): a GOAWAY naming
    // the last stream, then the streams in flight finish. HTTP/1.1: the
    // connection stays as it is — an idle one is not closed under a client
    // that may be sending on it this instant; its next response says
    // `Connection: close` (above) and hyper closes it after that. The idle
    // and stalled limits still hold (a listener removed by a reload is
    // never aborted), and whatever is open when `shutdown_timeout` runs out
    // is closed then (`ProxyHandle::shutdown`).
    let mut recheck = tokio::time::interval(Duration::from_millis(100));
    while !h2.load(Ordering::Relaxed) {
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "client connection ended with an error while draining");
                }
                return;
            }
            ending = activity.watch(idle_timeout, write_timeout) => {
                if ending == ActivityEnd::Idle {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(head_timeout, conn).await;
                }
                return;
            }
            _ = recheck.tick() => {}
        }
    }
    conn.as_mut().graceful_shutdown();
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "client connection ended with an error while draining");
    }
}

/// Requests in flight on one connection, since when it has had none, and
/// the frames handed to hyper that the client has not taken: an HTTP/2
/// connection that holds no stream (or an HTTP/1.1 one between requests)
/// for `client_idle_timeout` is closed, so idle sockets cannot take every
/// connection slot; one whose client takes nothing of a response for
/// `client_write_timeout` is dropped, so a client that stops reading cannot
/// hold its requests' slots forever.
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    quiet_since: Mutex<Instant>,
    /// One entry per response body: when it last handed hyper a frame that
    /// hyper has not come back for (hyper asks a body for more only once it
    /// could send what it got — a full socket, or no HTTP/2 window).
    handed: Mutex<Vec<Weak<Mutex<Option<Instant>>>>>,
    /// Woken when a request begins or is abandoned.
    changed: tokio::sync::Notify,
    /// Requests abandoned (their response not finished) in the current
    /// second, and that second's start; above `max_resets`, the connection
    /// ends.
    resets: Mutex<(Instant, u32)>,
    max_resets: u32,
}

/// Why [`Activity::watch`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ActivityEnd {
    Idle,
    Stalled,
    Resets,
}

impl Activity {
    fn new(max_resets: u32) -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            quiet_since: Mutex::new(Instant::now()),
            handed: Mutex::new(Vec::new()),
            changed: tokio::sync::Notify::new(),
            resets: Mutex::new((Instant::now(), 0)),
            max_resets,
        }
    }

    /// Counts an abandoned request; `true` once this second has seen more
    /// than `max_resets`.
    fn abandoned(&self) -> bool {
        let Ok(mut r) = self.resets.lock() else {
            return false;
        };
        let now = Instant::now();
        if now.duration_since(r.0) >= Duration::from_secs(1) {
            *r = (now, 0);
        }
        r.1 += 1;
        r.1 > self.max_resets
    }

    fn too_many_resets(&self) -> bool {
        self.resets
            .lock()
            .is_ok_and(|r| r.1 > self.max_resets && r.0.elapsed() < Duration::from_secs(1))
    }

    fn begin(self: &Arc<Self>) -> Busy {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let handed = Arc::new(Mutex::new(None));
        if let Ok(mut all) = self.handed.lock() {
            // Ended requests are swept now and then, not on every request.
            if all.len() > 2 * before + 16 {
                all.retain(|w| w.strong_count() > 0);
            }
            all.push(Arc::downgrade(&handed));
        }
        // Only the first request in flight moves the watcher's deadline
        // (from the idle one to the write one); later ones need no wake-up.
        if before == 0 {
            self.changed.notify_one();
        }
        Busy {
            activity: self.clone(),
            handed,
            done: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The oldest frame handed to hyper and not yet taken by the client.
    fn oldest_handoff(&self) -> Option<Instant> {
        let all = self.handed.lock().ok()?;
        all.iter()
            .filter_map(|w| w.upgrade())
            .filter_map(|h| h.lock().ok().and_then(|t| *t))
            .min()
    }

    /// Resolves once the connection has had nothing in flight for `idle`,
    /// or a response has waited on the client for `write`.
    async fn watch(&self, idle: Duration, write: Duration) -> ActivityEnd {
        loop {
            if self.too_many_resets() {
                return ActivityEnd::Resets;
            }
            let now = Instant::now();
            let next = if self.in_flight.load(Ordering::Acquire) == 0 {
                let since = self.quiet_since.lock().map(|t| *t).unwrap_or(now);
                if since + idle <= now {
                    return ActivityEnd::Idle;
                }
                since + idle
            } else {
                match self.oldest_handoff() {
                    Some(t) if t + write <= now => return ActivityEnd::Stalled,
                    Some(t) => t + write,
                    None => now + write,
                }
            };
            // A request arriving may bring the next deadline forward.
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = self.changed.notified() => {}
            }
        }
    }
}

/// One request in flight; its end (drop) may start the quiet period.
#[derive(Debug)]
struct Busy {
    activity: Arc<Activity>,
    handed: Arc<Mutex<Option<Instant>>>,
    /// Its response went out whole (the body said it had ended, or was
    /// read to its end); dropped before that, it was abandoned.
    done: std::sync::atomic::AtomicBool,
}

impl Busy {
    fn handed_now(&self) {
        if let Ok(mut t) = self.handed.lock() {
            *t = Some(Instant::now());
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Acquire) && self.activity.abandoned() {
            self.activity.changed.notify_one();
        }
        if self.activity.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Ok(mut t) = self.activity.quiet_since.lock() {
                *t = Instant::now();
            }
            // The watcher's deadline moves from the write one to the idle
            // one, which may be sooner (`client_idle_timeout` <
            // `client_write_timeout`).
            self.activity.changed.notify_one();
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted as in flight, and
    /// notes each frame it hands to hyper until hyper asks for the next.
    /// Its trailers reach hyper with only the fields a trailer section may
    /// carry (`h1::allowed_in_trailers`, docs/reference/routing.md#header-hygiene):
    /// one h2 refuses would reset the stream after its body.
    struct Holding<B> {
        #[pin]
        inner: B,
        busy: Busy,
        // What an HTTP/1.x client still takes of a `Content-Length` body.
        left: Option<u64>,
    }
}

impl<B: http_body::Body> http_body::Body for Holding<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let r = match this.inner.poll_frame(cx) {
            std::task::Poll::Ready(Some(Ok(f))) if f.is_trailers() => {
                let f = match f.into_trailers() {
                    Ok(t) => http_body::Frame::trailers(crate::h1::filter_trailers(t)),
                    Err(f) => f,
                };
                std::task::Poll::Ready(Some(Ok(f)))
            }
            r => r,
        };
        if let Ok(mut t) = this.busy.handed.lock() {
            *t = match &r {
                std::task::Poll::Ready(Some(Ok(_))) => Some(Instant::now()),
                _ => None,
            };
        }
        // The end, or trailers, which are always the last frame: hyper's
        // HTTP/2 server ends the stream with them and never asks again, so
        // a gRPC response is not taken for one the client abandoned.
        let last = match &r {
            std::task::Poll::Ready(None) => true,
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let (Some(l), Some(d)) = (this.left.as_mut(), frame.data_ref()) {
                    *l = l.saturating_sub(bytes::Buf::remaining(d) as u64);
                }
                frame.is_trailers() || *this.left == Some(0)
            }
            _ => false,
        };
        if last {
            this.busy.done.store(true, Ordering::Release);
        }
        r
    }
    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end {
            // hyper may stop here without asking for the end.
            self.busy.done.store(true, Ordering::Release);
        }
        end
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
