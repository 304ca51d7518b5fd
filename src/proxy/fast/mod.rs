//! The HTTP/1.1 fast path: one task per client connection reads each request
//! head, routes it, applies the upstream's policy through the same
//! `Attempts` core as the general path, exchanges it with an HTTP/1.1
//! upstream (cleartext, or TLS with `protocol = "http1"`) over a pooled
//! connection, and relays the response —
//! without a header map, a channel, a second task or a timer per request.
//! To an `h2c` upstream ([`h2`], [`h2relay`]) the head it wrote becomes
//! `http` parts for hyper's HTTP/2 client, sent through the endpoint's
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
//! general hyper path in `super::server`, which serves it from then on. The
//! behaviour a client sees is the same on both paths: the attempts run in
//! the one driver (`attempt::drive`), this path supplies only its
//! `attempt::Transport`, and the behaviour suites run every test on both
//! paths (`both_paths!` in tests/common, with `server.fast_path` off for the
//! general one).

mod fill;
mod h2;
mod h2relay;
pub mod head;
mod hit;
mod io;
pub(crate) mod pool;
mod relay;
mod reply;
mod rewind;
mod stream;
mod transport;

use super::access;
use super::attempt::{self, Attempts};
use super::conn::{serve_io, Conn};
use super::error::ProxyError;
use super::idempotent::{self, Begun, Recorder};
use super::Upstream;
use crate::policy::cache::CacheResult;
use crate::policy::idempotency::StoredResponse;
use head::{Annotations, Parse, Planned};
use io::{client_gone, read_more, write_client, Bufs, Timer};
pub(crate) use pool::Pool;
use reply::ErrorResponse;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use transport::{ClientWatch, FastTransport};

/// Serves a client connection that arrived in cleartext.
pub(super) async fn serve(mut stream: TcpStream, conn: Conn, pool: Arc<Pool>) {
    let mut bufs = Bufs::new();
    let mut waiting = Instant::now();
    // Whether a request was served here: from then on a quiet connection
    // waits for `client_idle_timeout`, not `header_read_timeout`.
    let mut served = false;
    // The stop signal has been seen (it is taken once).
    let mut drained = false;
    let mut timer = Timer::new(waiting);
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
            stop: &conn.stop,
            write_timeout: conn.write_timeout,
            access: snap.config.server.access_log,
            peer: conn.peer,
            hand_over: false,
        };
        let open = ctx.serve(up, planned).await;
        if ctx.hand_over {
            drop(snap);
            let io = rewind::Rewind::new(std::mem::take(&mut bufs.client), stream);
            return serve_io(io, conn).await;
        }
        if !open || *conn.stop.borrow() {
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
    pool: &'c Pool,
    /// Set when weir drains: a response then says `Connection: close`.
    stop: &'c tokio::sync::watch::Receiver<bool>,
    /// `client_write_timeout`: a write to the client that makes no progress
    /// for this long ends the connection.
    write_timeout: Duration,
    /// `[server] access_log`.
    access: crate::config::AccessLog,
    /// The client's address, for the access log.
    peer: std::net::SocketAddr,
    /// The request is to be served again from the start on hyper's path
    /// (`fill::Step::HandOver`): nothing of it has been answered.
    hand_over: bool,
}

impl Ctx<'_> {
    /// The access-log line of the request whose head starts the client
    /// buffer (docs/reference/logs.md#logs); the request line is read only when
    /// a line is written.
    /// `e`'s method and path are filled in here.
    fn access_log(&self, p: &Planned, e: access::Entry<'_>) {
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
            &access::Entry {
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
        // An HTTP/2 upstream's request head, taken before anything borrows
        // the plan for the length of the request.
        let h2_parts = p.h2.take();
        match &p.cache {
            head::cache::Cached::Hit(e) => {
                return (self.cache_answer(up, start, &p, e, CacheResult::Hit, None)).await;
            }
            head::cache::Cached::Stale(e, key) => {
                self.refresh(up, &p, e, key);
                return (self.cache_answer(up, start, &p, e, CacheResult::Stale, None)).await;
            }
            _ => {}
        }
        let cfg = &up.config;
        let (deadline, lowered) = attempt::deadline(cfg, start, [p.asked.lowered, None]);
        // A miss whose response may be stored leads its key's fill, or
        // waits for the one that does.
        // (Boxed, as the cache's other futures: only a cached upstream's
        // requests make them, and every request's future would hold them.)
        let _lead = match p.cache.filling_get() {
            Some(f) => match Box::pin(self.take_turn(up, start, &p, f, deadline)).await {
                Ok(lead) => lead,
                Err(open) => return open,
            },
            None => None,
        };
        let need = p.head_len + p.body_len;
        let fail = |e: ProxyError| OwnError {
            error: e,
            attempts: None,
            endpoint: None,
        };
        // Room for the whole body at once: grown by doubling as it arrives,
        // a 64 KiB body would be copied over and over.
        self.bufs
            .client
            .reserve(need.saturating_sub(self.bufs.client.len()));
        self.bufs.request.reserve(p.body_len);
        // A keyed write's body is read first, for its fingerprint; a repeat
        // is answered from the record before admission could hold it back.
        let mut recorder = None;
        let read_first = p.idem.is_some() && self.bufs.client.len() < need;
        if let Some(k) = p.idem.clone() {
            if let Err(open) = self.read_body(up, start, &p, deadline).await {
                return open;
            }
            let (method, target) = k.parts(&self.bufs.client);
            let key = p.asked.key.as_deref().unwrap_or_default();
            let body = &self.bufs.client[p.head_len..need];
            let fp = idempotent::fingerprint(method, target, body, p.chunked);
            match idempotent::begin(up, key, &fp).await {
                Begun::Replay(stored) => return self.replay(up, start, &p, &stored).await,
                Begun::Refused(e) => return self.fail(up, start, &p, fail(e)).await,
                Begun::Forward(r) => recorder = Some(r),
                Begun::Unrecorded => {}
            }
        }
        let mut watch = ClientWatch {
            stream: &mut *self.stream,
            client: &mut self.bufs.client,
            eof: &mut self.bufs.eof,
            need,
        };
        let admitted =
            attempt::admit(up, p.asked.rate_key.as_deref(), start, deadline, &mut watch).await;
        let (_slot, waited, taken) = match admitted {
            None => return false,
            Some(Ok(a)) => (a.slot, a.waited, a.taken),
            Some(Err(e)) => return self.fail(up, start, &p, fail(e)).await,
        };
        // Nothing waited for (admission, the body): `start` still tells the time.
        let now = Some(start).filter(|_| !waited && !read_first && self.bufs.client.len() >= need);
        if let Err(open) = self.read_body(up, start, &p, deadline).await {
            return open;
        }
        if !p.chunked {
            let body = &self.bufs.client[p.head_len..need];
            self.bufs.request.extend_from_slice(body);
        }
        let t0 = now.unwrap_or_else(Instant::now);
        let ticket = match attempt::admit_breaker_at(&up.state, t0) {
            Ok(t) => t,
            Err(e) => {
                attempt::refund(up, p.asked.rate_key.as_deref(), taken);
                return self.fail(up, start, &p, fail(e)).await;
            }
        };
        let key = p.asked.rate_key.as_deref();
        let begun = Attempts::begin(up, ticket, p.facts, key, deadline, lowered, t0);
        let Ok(mut attempts) = begun else {
            let f = OwnError {
                error: ProxyError::DeadlineExceeded,
                attempts: Some(Annotations {
                    attempts: 0,
                    stop: None,
                    hedge: None,
                }),
                endpoint: None,
            };
            return self.fail(up, start, &p, f).await;
        };
        attempts.set_keyed_write(p.keyed_write);
        attempts.trace = p.trace.clone();
        let detached = recorder.is_some();
        let ended = match h2_parts {
            Some(parts) => {
                let times = (t0, deadline, lowered);
                let h2 = self.attempt_h2(up, &p, *parts, &mut attempts, times, detached);
                h2.await
            }
            None if up.own_h1 => self.attempt_h1(up, &p, &mut attempts, t0, detached).await,
            None => return false,
        };
        let Some((result, stop, ended, last_failed)) = ended else {
            return false;
        };
        let made = attempts.made();
        let spent = Annotations {
            attempts: made,
            stop,
            hedge: attempts.hedged,
        };
        let annotations = cfg.annotate.then_some(spent);
        drop(attempts);
        let took = ended.saturating_duration_since(start);
        match result {
            Ok(x) => {
                // The cache takes part in an HTTP/1.1 upstream's answers
                // (a cached HTTP/2 upstream's requests are the general path's).
                let (x, cache) = match x {
                    Answer::H1(mut x) => {
                        let cached = match p.cache {
                            head::cache::Cached::Off => Ok(fill::Step::Relay(None)),
                            _ => Box::pin(self.cache_response(up, &p, &mut x)).await,
                        };
                        match cached {
                            Ok(fill::Step::Relay(mark)) => (Answer::H1(x), mark),
                            Ok(fill::Step::Answer(e, result)) => {
                                x.let_go(self.pool, &self.bufs.upstream);
                                let spent = Some(spent);
                                return (self.cache_answer(up, start, &p, &e, result, spent)).await;
                            }
                            Ok(fill::Step::HandOver) => {
                                x.let_go(self.pool, &self.bufs.upstream);
                                self.hand_over = true;
                                return false;
                            }
                            Err(error) => {
                                let endpoint = Some(x.addr);
                                let f = OwnError {
                                    error,
                                    attempts: None,
                                    endpoint,
                                };
                                return self.fail(up, start, &p, f).await;
                            }
                        }
                    }
                    h2 => (h2, None),
                };
                let status = x.status();
                up.state.metrics.status(status, took);
                let addr = x.addr();
                let kept = Kept {
                    annotations,
                    recorder,
                    cache: cache.filter(|_| cfg.annotate),
                };
                let relayed = match x {
                    Answer::H1(x) => self.relay(up, x.addr, x, kept, &p, ended).await,
                    Answer::H2(r) => self.relay_h2(up, r, kept, &p).await,
                };
                if let Some(code) = relayed.error {
                    up.state.metrics.body_error(code);
                }
                let entry = access::Entry {
                    upstream: &cfg.name,
                    method: "",
                    path: "",
                    status,
                    error: relayed.error,
                    attempts: Some(made),
                    retry_stop: stop.map(|s| s.as_str()),
                    hedge: spent.hedge,
                    endpoint: addr,
                    took,
                    bytes_out: relayed.bytes,
                    who: access::Who::default(),
                };
                self.access_log(&p, entry);
                relayed.open && !p.close
            }
            Err(error) => {
                if let Some(r) = recorder {
                    r.finish(idempotent::ending_of(&error), None);
                }
                let f = OwnError {
                    error,
                    attempts: Some(spent),
                    endpoint: last_failed,
                };
                self.fail(up, start, &p, f).await
            }
        }
    }

    /// Runs the attempts of a request to an HTTP/1.1 upstream over the
    /// fast path's own connections; `None` when the client went away.
    async fn attempt_h1(
        &mut self,
        up: &Upstream,
        p: &Planned,
        attempts: &mut Attempts<'_>,
        t0: Instant,
        detached: bool,
    ) -> Option<h2::Ended> {
        let need = p.head_len + p.body_len;
        let mut t = FastTransport {
            watch: ClientWatch {
                stream: &mut *self.stream,
                client: &mut self.bufs.client,
                eof: &mut self.bufs.eof,
                need,
            },
            request: &mut self.bufs.request,
            upstream: &mut self.bufs.upstream,
            out: &mut self.bufs.out,
            kept: &mut self.bufs.kept,
            timer: &mut *self.timer,
            pool: self.pool,
            up,
            is_head_request: p.is_head_request,
            detached,
            avoid: Vec::new(),
        };
        let driven = attempt::drive(attempts, &mut t, Some(t0)).await?;
        // A failed attempt's endpoint is the last one it avoids.
        let last_failed = t.avoid.last().copied();
        let result = driven.result.map(Answer::H1);
        Some((result, driven.stop, driven.ended, last_failed))
    }

    /// Reads the rest of the request's body, within the request's deadline.
    /// `Err` says whether the connection stays open when it does not come.
    async fn read_body(
        &mut self,
        up: &Upstream,
        start: Instant,
        p: &Planned,
        deadline: Instant,
    ) -> Result<(), bool> {
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
                    Ok(_) => {}
                },
                () = self.timer.at(deadline) => {
                    let f = OwnError { error: ProxyError::DeadlineExceeded, attempts: None, endpoint: None };
                    return Err(self.fail(up, start, p, f).await);
                }
            }
        }
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
        // An entry within its `stale-if-error` answers a failure
        // (docs/reference/cache.md#response-cache).
        if let Some(e) = self.stale_if_error(up, p, &f.error) {
            let result = CacheResult::StaleIfError;
            return (self.cache_answer(up, start, p, &e, result, None)).await;
        }
        let took = start.elapsed();
        // A miss weir answers itself is the cache's miss too.
        let cache = matches!(p.cache, head::cache::Cached::Fill(_)).then(|| {
            if let Some(c) = up.state.cache().as_mut() {
                c.count(CacheResult::Miss);
            }
            CacheResult::Miss
        });
        up.state.metrics.error(f.error.code(), took);
        let (made, stop, hedge) = match f.attempts {
            Some(a) => (Some(a.attempts), a.stop.map(|s| s.as_str()), a.hedge),
            None => (None, None, None),
        };
        let entry = access::Entry {
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
            cache: cache.filter(|_| up.config.annotate),
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
enum Answer {
    H1(transport::Exchange),
    H2(http::Response<crate::proxy::body::UpstreamBody>),
}

impl Answer {
    fn status(&self) -> u16 {
        match self {
            Answer::H1(x) => x.status,
            Answer::H2(r) => r.status().as_u16(),
        }
    }

    /// The endpoint it came from.
    fn addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Answer::H1(x) => Some(x.addr),
            Answer::H2(r) => r.extensions().get::<crate::upstream::Served>().map(|s| s.0),
        }
    }
}

/// weir's error for the client, with what the attempts added.
struct OwnError {
    error: ProxyError,
    attempts: Option<Annotations>,
    /// The endpoint of the last attempt, if one was made.
    endpoint: Option<std::net::SocketAddr>,
}
