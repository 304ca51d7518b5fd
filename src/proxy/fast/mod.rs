//! The HTTP/1.1 fast path: one task per client connection reads each request
//! head, routes it, applies the upstream's policy through the same
//! `Attempts` core as the general path, exchanges it with an HTTP/1.1
//! upstream (cleartext, or TLS with `protocol = "http1"`) over a pooled
//! connection, and relays the response —
//! without a header map, a channel, a second task or a timer per request.
//! To an `h2c` upstream ([`h2`], [`h2relay`]) the head it wrote becomes
//! `http` parts for the HTTP/2 pool's client (on the `h2` crate), sent through the endpoint's
//! HTTP/2 pool as the general path sends them, and the response is
//! written back as HTTP/1.1: the client connection stays here, and
//! hyper's HTTP/1 server, most of such a request's cost, is not in the way.
//!
//! Measured (bench/RESULTS.md#the-fast-path), hyper on both sides of the proxy cost
//! more user-space CPU per request than the kernel's loopback work; nginx
//! and HAProxy do what this module does: copy heads from buffer to buffer.
//!
//! The fast path takes the requests that make up nearly all of a sidecar's
//! traffic: HTTP/1.1, a body (of known length or chunked without trailers)
//! small enough to hold for a replay, to an upstream it speaks HTTP/1.1
//! to or an `h2c` one. Anything else (see
//! [`head::plan`]) hands the connection, with every byte read so far, to the
//! general path (`super::general`), which serves it from then on. The
//! behaviour a client sees is the same on both paths: a request is served
//! in the one order of `proxy::order`, for which this path supplies its
//! codec ([`codec`]) and its `attempt::Transport`, the attempts run in the
//! one driver (`attempt::drive`), and the behaviour suites run every test on both
//! paths (`both_paths!` in tests/common, with `server.fast_path` off for the
//! general one).

mod codec;
mod h2;
mod h2relay;
pub mod head;
mod hit;
mod io;
mod relay;
mod reply;
mod rewind;
mod transport;
mod whole;

use super::access;
use super::error::ProxyError;
use super::general::conn::{serve_io, ClientConn};
use super::idempotent::{self, Recorder};
use super::order;
use super::Upstream;
use crate::policy::cache::CacheResult;
use crate::policy::idempotency::StoredResponse;
pub(crate) use crate::upstream::pool::H1Pool as Pool;
use head::{Annotations, Parse, Planned};
use io::{client_gone, read_more, write_client, Bufs, Timer};
use reply::ErrorResponse;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Serves a client connection that arrived in cleartext.
pub(super) async fn serve(mut stream: TcpStream, conn: ClientConn, pool: Arc<Pool>) {
    let mut bufs = Bufs::new();
    let mut waiting = Instant::now();
    // Whether a request was served here: from then on a quiet connection
    // waits for `client_idle_timeout`, not `header_read_timeout`.
    let mut served = false;
    // The stop signal has been seen (it is taken once).
    let mut drained = false;
    let mut timer = Timer::new(waiting);
    let h2_conn = crate::upstream::pool::held::ConnCtx::new(pool.clone());
    let mut stop = conn.stop.clone();
    let stopping = crate::shutdown::stopped(&mut stop);
    tokio::pin!(stopping);
    loop {
        // A whole request head (and a chunked body), planned.
        let mut pending = false;
        let (snap, planned) = loop {
            if !bufs.client.is_empty() {
                let snap = conn.shared.snapshot.load_full();
                match head::plan(&snap, &conn.role, &bufs.client, &mut bufs.request) {
                    // A head over the limit is hyper's to answer (431).
                    Parse::Done(p) if p.head_len > conn.max_head => {
                        if let Some(t) = &p.trace {
                            t.discard();
                        }
                        break (snap, None);
                    }
                    Parse::Done(p) => break (snap, Some(p)),
                    Parse::Fallback(why) => {
                        tracing::trace!(peer = %conn.peer, why, "to the general path");
                        break (snap, None);
                    }
                    Parse::Partial if bufs.client.len() >= conn.max_head => break (snap, None),
                    Parse::Partial => {}
                    Parse::BodyPending => pending = true,
                }
            }
            if bufs.eof {
                // Everything the client sent before closing has been served.
                let _ = stream.shutdown().await;
                return;
            }
            // Between requests a kept-alive connection may be quiet for
            // `client_idle_timeout`; a head, once begun (or on a fresh
            // connection), must be whole within `header_read_timeout` of
            // its start (docs/reference/deadlines.md#deadlines-and-timeouts, "Client connections").
            let idle = served && bufs.client.is_empty();
            let deadline = match idle {
                true => waiting + conn.idle_timeout,
                false => waiting + conn.head_timeout,
            };
            tokio::select! {
                biased;
                r = read_more(&mut stream, &mut bufs.client) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(_) if idle => waiting = Instant::now(),
                    Ok(_) => {}
                },
                () = timer.at(deadline) => {
                    if !pending {
                        return;
                    }
                    // A chunked body slower than a head may be is hyper's to read.
                    break (conn.shared.snapshot.load_full(), None);
                }
                // Draining: an idle connection is not closed under a client
                // that may be sending on it this instant; its next response
                // says `Connection: close`, and whatever is still idle when
                // `shutdown_timeout` runs out is closed then.
                () = &mut stopping, if bufs.client.is_empty() && !drained => drained = true,
            }
        };
        let Some(planned) = planned else {
            drop(snap);
            let io = rewind::Rewind::new(std::mem::take(&mut bufs.client), stream);
            return serve_io(io, conn).await;
        };
        let Some(up) = snap.upstreams.get(planned.upstream) else {
            return;
        };
        let consumed = planned.head_len + planned.body_len;
        let mut ctx = Ctx {
            stream: &mut stream,
            bufs: &mut bufs,
            timer: &mut timer,
            pool: &pool,
            h2_conn: &h2_conn,
            stop: &conn.stop,
            write_timeout: conn.write_timeout,
            access: snap.config.server.access_log,
            peer: conn.peer,
        };
        // Closed only when the response said so: a drain that begins while
        // a response is on its way leaves the connection open for its next
        // request, which is answered with `Connection: close`
        // (docs/reference/shutdown.md#shutdown). Closing here would race the
        // client's next request on a connection it was told stays open.
        let open = ctx.serve(up, planned).await;
        if !open {
            let _ = stream.shutdown().await;
            return;
        }
        bufs.next_request(consumed);
        waiting = Instant::now();
        served = true;
    }
}

/// What one request works with.
struct Ctx<'c> {
    stream: &'c mut TcpStream,
    bufs: &'c mut Bufs,
    timer: &'c mut Timer,
    pool: &'c Arc<Pool>,
    /// This client connection as the upstream layer's HTTP/2 checkout sees
    /// it (no held connection: those are HTTP/1.1), made once per
    /// connection.
    h2_conn: &'c crate::upstream::pool::held::ConnCtx,
    /// Set when weir drains: a response then says `Connection: close`.
    stop: &'c tokio::sync::watch::Receiver<bool>,
    /// `client_write_timeout`: a write to the client that makes no progress
    /// for this long ends the connection.
    write_timeout: Duration,
    /// `[server] access_log`.
    access: crate::config::AccessLog,
    /// The client's address, for the access log.
    peer: crate::address::Address,
}

impl Ctx<'_> {
    /// The access-log line of the request whose head starts the client
    /// buffer (docs/reference/logs.md#logs); the request line is read only when
    /// a line is written.
    /// `e`'s method and path are filled in here.
    fn access_log(&self, p: &Planned, e: access::AccessEntry<'_>) {
        crate::proxy::traced::finish(p.trace.as_ref(), &e, None);
        if !access::wanted(self.access, e.status, e.error.is_some()) {
            return;
        }
        let head = self.bufs.client.get(..p.head_len).unwrap_or_default();
        let (method, path) = access::request_line(head);
        let mut id = [0u8; 32];
        let mut trace_id = [0u8; 32];
        let who = access::Who {
            client: Some(self.peer),
            request_id: p.asked.request_id.text(&mut id),
            user_agent: access::field(head, "user-agent"),
            bytes_in: p.body_len as u64,
            trace_id: crate::proxy::traced::id(p.trace.as_ref(), &mut trace_id),
        };
        access::write(
            self.access,
            &access::AccessEntry {
                grpc_status: None,
                method,
                path,
                who,
                ..e
            },
        );
    }

    /// Serves one planned request; returns whether the client connection
    /// stays open for the next one.
    async fn serve(&mut self, up: &Upstream, mut p: Planned) -> bool {
        let start = Instant::now();
        // An HTTP/2 upstream's request head and the cache's part, taken
        // before anything borrows the plan for the length of the request.
        let h2_parts = p.h2.take();
        let cached = std::mem::take(&mut p.cache);
        let plain_h2 = match (&h2_parts, cached.validated()) {
            (Some(parts), Some(_)) => Some(codec::without_validators(parts)),
            _ => None,
        };
        // Room for the whole body at once: grown by doubling as it arrives,
        // a 64 KiB body would be copied over and over.
        let need = p.head_len + p.body_len;
        self.bufs
            .client
            .reserve(need.saturating_sub(self.bufs.client.len()));
        self.bufs.request.reserve(p.body_len);
        let key = p.asked.rate_key.as_deref();
        let mut request = codec::FastRequest {
            ctx: self,
            p: &p,
            start,
            read_first: false,
            mark: None,
            ahead: None,
            plain_h2,
        };
        order::serve_http(up, &mut request, h2_parts, start, key, cached).await
    }

    /// Reads the rest of the request's body, timed by `upload`: each gap
    /// within `idle_timeout`, the whole within the client's own deadline,
    /// and the time it takes not counted against `timeout`
    /// (docs/reference/deadlines.md#uploads). `Err` says whether the
    /// connection stays open when it does not come.
    async fn read_body(
        &mut self,
        up: &Upstream,
        start: Instant,
        p: &Planned,
        upload: &mut crate::proxy::upload::Upload,
    ) -> Result<(), bool> {
        if self.bufs.client.len() >= p.head_len + p.body_len {
            return Ok(());
        }
        let began = Instant::now();
        let mut moved = began;
        while self.bufs.client.len() < p.head_len + p.body_len {
            tokio::select! {
                biased;
                r = read_more(self.stream, &mut self.bufs.client) => match r {
                    Ok(0) | Err(_) => {
                        // The body broke off: as on the general path, a bad request.
                        let e = ProxyError::BadRequest(String::new());
                        up.state.metrics.error(e.code(), start.elapsed());
                        return Err(false);
                    }
                    Ok(_) => moved = Instant::now(),
                },
                () = self.timer.at(upload.gives_up(moved)) => {
                    let f = OwnError { error: ProxyError::DeadlineExceeded, attempts: None, endpoint: None, cache: None };
                    return Err(self.fail(up, start, p, f).await);
                }
            }
        }
        upload.read(began, moved);
        Ok(())
    }

    /// Answers a repeat of a keyed write from its record
    /// (docs/reference/idempotency.md#idempotency-keys). Returns whether the connection
    /// stays open.
    async fn replay(
        &mut self,
        up: &Upstream,
        start: Instant,
        p: &Planned,
        stored: &StoredResponse,
    ) -> bool {
        let (parts, body) = idempotent::replay_parts(stored, up.config.annotate);
        self.answer_stored(up, start, p, &parts, &body, true).await
    }

    /// Answers with weir's own error. Returns whether the connection stays
    /// open: not when the request's body is still unread, nor after a 400.
    async fn fail(&mut self, up: &Upstream, start: Instant, p: &Planned, f: OwnError) -> bool {
        let took = start.elapsed();
        up.state.metrics.error(f.error.code(), took);
        let (made, stop, hedge) = match f.attempts {
            Some(a) => (Some(a.attempts), a.stop.map(|s| s.as_str()), a.hedge),
            None => (None, None, None),
        };
        let entry = access::AccessEntry {
            grpc_status: None,
            upstream: &up.config.name,
            method: "",
            path: "",
            status: f.error.status().as_u16(),
            error: Some(f.error.code()),
            attempts: made,
            retry_stop: stop,
            hedge,
            endpoint: f.endpoint,
            took,
            // weir's JSON error body; a HEAD gets none.
            bytes_out: 0,
            who: access::Who::default(),
        };
        self.access_log(p, entry);
        let close =
            p.close || *self.stop.borrow() || self.bufs.client.len() < p.head_len + p.body_len;
        self.bufs.out.clear();
        let e = ErrorResponse {
            error: &f.error,
            upstream: &up.config.name,
            annotations: f.attempts.filter(|_| up.config.annotate),
            close,
            is_head_request: p.is_head_request,
            date: up.state.clock.wall(),
            cache: f.cache.filter(|_| up.config.annotate),
        };
        e.write(&mut self.bufs.out);
        let ok = write_client(self.stream, &self.bufs.out, self.write_timeout).await;
        ok && !close && !f.error.closes_connection()
    }
}

/// What a response takes along to the client besides itself: weir's
/// annotations, a keyed write's recorder, and the cache's mark.
struct Kept {
    annotations: Option<Annotations>,
    recorder: Option<Recorder>,
    cache: Option<CacheResult>,
}

/// An upstream's answer: an HTTP/1.1 response head in the connection's
/// buffers, or an HTTP/2 response from hyper's client.
enum UpstreamAnswer {
    H1(transport::H1Answer),
    H2(http::Response<crate::proxy::body::RelayedBody>),
}

/// weir's error for the client, with what the attempts added.
struct OwnError {
    error: ProxyError,
    attempts: Option<Annotations>,
    /// The endpoint of the last attempt, if one was made.
    endpoint: Option<crate::upstream::Address>,
    /// How the response cache took part (a miss).
    cache: Option<CacheResult>,
}
