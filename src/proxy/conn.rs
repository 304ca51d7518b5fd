//! The hyper connection driver: one client connection (plain TCP, TLS, or
//! handed over by the fast path with the bytes it read) served by hyper's
//! HTTP/1.1 and HTTP/2 server behind the request-smuggling guard, drained
//! gracefully when weir stops. The listeners (`super::server`) and the fast
//! path (`super::fast`) both end here; neither depends on the other.

use super::forward;
use super::guard::FramingGuard;
use super::{ListenerRole, Snapshot};
use crate::config::Config;
use crate::shutdown::stopped;
use crate::state::StateRegistry;
use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// State shared by every listener and connection.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) snapshot: ArcSwap<Snapshot>,
    pub(super) states: StateRegistry,
    pub(super) connections: Arc<Semaphore>,
    pub(super) draining: AtomicBool,
}

/// hyper's server, configured from the config's `[server]` table.
pub(super) fn builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.server.header_read_timeout)
        .max_buf_size(config.server.max_header_bytes)
        // Header names go on with the case they came in, as on the fast
        // path: an HTTP/1.1 peer that cares about case sees no difference.
        .preserve_header_case(true)
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(config.server.max_header_bytes.min(u32::MAX as usize) as u32);
    b
}

/// One client connection's context, however its bytes arrive (plain or TLS).
pub(super) struct Conn {
    pub(super) peer: SocketAddr,
    pub(super) role: ListenerRole,
    pub(super) shared: Arc<Shared>,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) builder: auto::Builder<TokioExecutor>,
    pub(super) max_head: usize,
    pub(super) head_timeout: Duration,
}

pub(super) async fn serve_io<I>(io: I, conn: Conn)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Conn {
        peer,
        role,
        shared,
        mut stop,
        builder,
        max_head,
        head_timeout,
    } = conn;
    let ctx = Arc::new(super::sticky::ConnCtx::default());
    let svc = service_fn(move |req| {
        let snap = shared.snapshot.load_full();
        let role = role.clone();
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(forward::handle(&snap, &role, &ctx, req).await) }
    });
    let io = TokioIo::new(FramingGuard::new(io, max_head, head_timeout));
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
    }
    conn.as_mut().graceful_shutdown();
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "client connection ended with an error while draining");
    }
}
