//! The general path's connection driver: one client connection (plain TCP,
//! TLS, or handed over by the fast path with the bytes it read), behind the
//! request-smuggling guard, served by weir's own HTTP/2 server
//! (`super::http2`) when its first bytes are the HTTP/2 preface and by
//! hyper's HTTP/1.1 server otherwise, drained gracefully when weir stops.
//! The listeners (`crate::proxy::server`) and the fast path
//! (`crate::proxy::fast`) both end here; neither depends on the other.

use super::activity::{Activity, ActivityEnd, Holding};
use super::guard::FramingGuard;
use crate::config::Config;
use crate::proxy::body::boxed;
use crate::proxy::general;
use crate::proxy::general::ServeState;
use crate::proxy::ListenerRole;
use crate::shutdown::stopped;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// hyper's HTTP/1.1 server, configured from the config's `[server]` table.
/// HTTP/2 clients never reach it: their preface takes them to weir's own
/// server.
pub(in crate::proxy) fn builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new()).http1_only();
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
    b
}

/// One client connection's context, however its bytes arrive (plain or TLS).
pub(in crate::proxy) struct ClientConn {
    pub(in crate::proxy) peer: SocketAddr,
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
    /// Streams an HTTP/2 client may have open at once.
    pub(in crate::proxy) max_streams: u32,
    /// The worker's idle upstream connections (`upstream::pool`).
    pub(in crate::proxy) pool: Arc<crate::upstream::pool::H1Pool>,
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
        max_streams,
        pool,
    } = conn;
    let ctx = Arc::new(crate::upstream::pool::held::ConnCtx::new(pool));
    let mut guard = FramingGuard::new(io, max_head, head_timeout);
    // Which HTTP/1 request is the guard's marker for a head it refused.
    let verdict = guard.verdict();
    // The first bytes say which server reads the connection: weir's own
    // HTTP/2 server after the preface, hyper's HTTP/1.1 server otherwise.
    let (read, preface) = match opening(&mut guard).await {
        Ok(opened) => opened,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "client connection ended before its first request");
            return;
        }
    };
    let io = super::rewind::Rewind::new(read, guard);
    if preface {
        let conn = super::http2::ClientH2 {
            peer,
            role,
            shared,
            stop,
            max_head,
            max_streams,
            head_timeout,
            idle_timeout,
            write_timeout,
            max_resets,
            ctx,
        };
        return super::http2::serve(io, conn).await;
    }
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let activity = Arc::new(Activity::new(max_resets));
    let busy_on = activity.clone();
    // The stop signal each HTTP/1 response reads (draining).
    let draining = stop.clone();
    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let mut req = req.map(crate::proxy::body::ClientBody::Hyper);
        req.extensions_mut()
            .insert(crate::proxy::access::ClientAddr(peer));
        let snap = shared.snapshot.load_full();
        let role = role.clone();
        let ctx = ctx.clone();
        let connect = req.method() == http::Method::CONNECT;
        let draining = draining.clone();
        let n = served.fetch_add(1, Ordering::Relaxed) + 1;
        let refused = verdict.refusal(n);
        // In flight until its response body is done with (finished, or the
        // stream reset).
        let busy = busy_on.begin();
        async move {
            // Boxed: the request's future is large (every path a request may
            // take, each attempt's state), and hyper moves the future it is
            // given into the HTTP/1 dispatcher's slot once per request. A move of the box is a
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
            if !switched && *draining.borrow() {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            // The head is handed over now; until hyper asks for the body,
            // it waits on the client.
            busy.handed_now();
            Ok::<_, Infallible>(resp.map(|b| boxed(Holding::new(b, busy))))
        }
    });
    let io = TokioIo::new(io);
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
                // answers.
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
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(head_timeout, conn).await;
            return;
        }
    }
    // Draining. The connection stays as it is — an idle one is not closed under a client
    // that may be sending on it this instant; its next response says
    // `Connection: close` (above) and hyper closes it after that. The idle
    // and stalled limits still hold (a listener removed by a reload is
    // never aborted), and whatever is open when `shutdown_timeout` runs out
    // is closed then (`ProxyHandle::shutdown`).
    tokio::select! {
        biased;
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "client connection ended with an error while draining");
            }
        }
        ending = activity.watch(idle_timeout, write_timeout) => {
            if ending == ActivityEnd::Idle {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(head_timeout, conn).await;
            }
        }
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads a connection's first bytes until they either are the HTTP/2
/// preface or cannot be: what was read (to be read again by the server
/// that takes the connection), and which it was. A request head differs
/// from the preface by its second byte at the latest.
async fn opening<I: tokio::io::AsyncRead + Unpin>(io: &mut I) -> std::io::Result<(Vec<u8>, bool)> {
    use tokio::io::AsyncReadExt;
    let mut read = Vec::with_capacity(4096);
    loop {
        if io.read_buf(&mut read).await? == 0 {
            return Ok((read, false));
        }
        if read.len() >= PREFACE.len() {
            let preface = read.starts_with(PREFACE);
            return Ok((read, preface));
        }
        if !PREFACE.starts_with(&read) {
            return Ok((read, false));
        }
    }
}
