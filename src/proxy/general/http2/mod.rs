//! weir's HTTP/2 server: one client connection on the `h2` crate, driven
//! from the connection's own task (docs/reference/protocols.md#http2-clients).
//! Each stream it accepts is a request of the general path, served in the
//! one serve order (`proxy::general::handle`) and answered on its stream
//! ([`stream`]); no task per stream and no service layer in between: a
//! stream's future is boxed once and polled beside the connection.
//!
//! The guards hyper's HTTP/2 server gave are kept: the header list size
//! and concurrent streams weir announces (`max_header_bytes`,
//! `max_streams_per_connection`), hyper's windows, frame size and send
//! buffer, the idle, slow-reader and reset limits of `super::activity`,
//! and on a drain a GOAWAY naming the last stream, after which the streams
//! in flight finish.

mod stream;

use super::activity::{Activity, ActivityEnd};
use super::ServeState;
use crate::proxy::ListenerRole;
use crate::shutdown::stopped;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

/// The windows, frame size and send buffer hyper's HTTP/2 server used
/// (and weir with it, before this server): 1 MiB for the connection and
/// for each stream, 16 KiB frames, 400 KiB buffered per stream.
const WINDOW: u32 = 1024 * 1024;
const MAX_FRAME: u32 = 16 * 1024;
const SEND_BUFFER: usize = 400 * 1024;
/// Streams the client may make the server reset for its errors before the
/// connection is refused (hyper's default, against a flood of bad frames).
const MAX_LOCAL_RESETS: usize = 1024;

/// What one HTTP/2 client connection needs from its listener.
pub(in crate::proxy) struct ClientH2 {
    pub(in crate::proxy) peer: SocketAddr,
    pub(in crate::proxy) role: ListenerRole,
    pub(in crate::proxy) shared: Arc<ServeState>,
    pub(in crate::proxy) stop: watch::Receiver<bool>,
    pub(in crate::proxy) max_head: usize,
    pub(in crate::proxy) max_streams: u32,
    pub(in crate::proxy) head_timeout: Duration,
    pub(in crate::proxy) idle_timeout: Duration,
    pub(in crate::proxy) write_timeout: Duration,
    pub(in crate::proxy) max_resets: u32,
    pub(in crate::proxy) ctx: Arc<crate::upstream::pool::held::ConnCtx>,
}

/// One stream's request, served and answered.
type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serves one client connection whose first bytes were the HTTP/2 preface.
pub(in crate::proxy) async fn serve<I>(io: I, conn: ClientH2)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ClientH2 {
        peer,
        role,
        shared,
        mut stop,
        max_head,
        max_streams,
        head_timeout,
        idle_timeout,
        write_timeout,
        max_resets,
        ctx,
    } = conn;
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_send_buffer_size(SEND_BUFFER)
        .max_local_error_reset_streams(Some(MAX_LOCAL_RESETS))
        .max_header_list_size(max_head.min(u32::MAX as usize) as u32)
        .max_concurrent_streams(max_streams);
    // The preface itself is bounded by the request-smuggling guard in front
    // (`header_read_timeout` for the preface and a frame header).
    let mut h2 = match builder.handshake::<_, bytes::Bytes>(io).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "HTTP/2 handshake failed");
            return;
        }
    };
    let activity = Arc::new(Activity::new(max_resets));
    let watch = activity.watch(idle_timeout, write_timeout);
    tokio::pin!(watch);
    let mut streams: FuturesUnordered<Serving> = FuturesUnordered::new();
    let on = stream::StreamCtx {
        peer,
        role,
        shared,
        ctx,
    };
    let on = Arc::new(on);
    let mut draining = false;
    // Set once the connection is saying goodbye for being idle: a client
    // that never answers the goodbye's PING is let go after a head's time.
    let mut cut: Option<Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            biased;
            accepted = h2.accept() => match accepted {
                Some(Ok((req, respond))) => {
                    let busy = activity.begin();
                    streams.push(Box::pin(stream::serve(on.clone(), req, respond, busy)));
                }
                Some(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "client connection ended with an error");
                    return;
                }
                // The connection is done: gone, or closed after a GOAWAY
                // once its streams finished.
                None => return,
            },
            Some(()) = streams.next(), if !streams.is_empty() => {}
            () = stopped(&mut stop), if !draining => {
                // Draining (docs/reference/shutdown.md#shutdown): a GOAWAY
                // naming the last stream, then the streams in flight finish;
                // whatever is open when `shutdown_timeout` runs out is
                // closed then (`ProxyHandle::shutdown`).
                draining = true;
                if cut.is_none() {
                    h2.graceful_shutdown();
                }
            }
            ending = &mut watch, if cut.is_none() => match ending {
                ActivityEnd::Resets => {
                    // Requests opened and abandoned faster than anyone reads
                    // answers (HTTP/2 rapid reset, delayed or not).
                    tracing::debug!(%peer, max_resets, "too many abandoned requests; connection closed");
                    return;
                }
                ActivityEnd::Stalled => {
                    // A client that takes nothing of a response: let it go,
                    // and with it every slot its requests hold.
                    tracing::debug!(%peer, write_timeout = %crate::config::duration::format(write_timeout), "client stopped reading; connection closed");
                    return;
                }
                ActivityEnd::Idle => {
                    tracing::debug!(%peer, idle_timeout = %crate::config::duration::format(idle_timeout), "closing an idle client connection");
                    // An HTTP/2 goodbye waits for the client to answer a
                    // PING; one that never answers is not waited for longer
                    // than a head.
                    if !draining {
                        h2.graceful_shutdown();
                    }
                    cut = Some(Box::pin(tokio::time::sleep(head_timeout)));
                }
            },
            () = async { if let Some(c) = cut.as_mut() { c.await } }, if cut.is_some() => return,
        }
    }
}
