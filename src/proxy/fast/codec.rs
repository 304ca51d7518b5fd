//! The fast path's part in the one order of a request (`proxy::order`):
//! the body read from the client's buffer, admission watching the client's
//! socket, the attempts over the fast path's own connections (or the
//! endpoint's HTTP/2 pool), and the answer written as HTTP/1.1.

use super::head::{self, Annotations, Planned};
use super::transport::{ClientWatch, FastTransport};
use super::{CacheResult, Ctx, Kept, OwnError, UpstreamAnswer};
use crate::policy::cache::CachedResponse;
use crate::policy::idempotency::StoredResponse;
use crate::policy::RequestFacts;
use crate::proxy::access;
use crate::proxy::attempt::Attempted;
use crate::proxy::attempt::{self, Admitted, Attempts};
use crate::proxy::error::ProxyError;
use crate::proxy::idempotent::{self, Begun, Recorder};
use crate::proxy::order::cache::{CacheFields, CacheIo};
use crate::proxy::order::{Codec, KeyedWrites};
use crate::proxy::upload::Upload;
use crate::proxy::Upstream;
use crate::state::gate::Slot;
use crate::upstream::Address;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// One request on the fast path, as the order serves it.
pub(super) struct FastRequest<'r, 'c> {
    pub(super) ctx: &'r mut Ctx<'c>,
    pub(super) p: &'r Planned,
    pub(super) start: Instant,
    /// A keyed write's body was read before admission, for its fingerprint.
    pub(super) read_first: bool,
    /// How the response cache took part, for the answer to say.
    pub(super) mark: Option<CacheResult>,
    /// What was read of an HTTP/2 upstream's response body for the cache,
    /// relayed first.
    pub(super) ahead: Option<Box<crate::proxy::cached::whole::ReadBefore>>,
    /// An HTTP/2 upstream's request head without the validators it was
    /// sent with, should the 304 match no entry any more.
    pub(super) plain_h2: H2Head,
}

impl FastRequest<'_, '_> {
    /// The request's head and body, as they lie in the client's buffer.
    fn need(&self) -> usize {
        self.p.head_len + self.p.body_len
    }
}

/// The request head the fast path carries into the order: an HTTP/2
/// upstream's (`None`: an HTTP/1.1 upstream's head is the bytes in the
/// client's buffer, rewritten there).
pub(super) type H2Head = Option<Box<http::request::Parts>>;

/// An HTTP/2 upstream's request head without the validators of the entry
/// it revalidates.
pub(super) fn without_validators(p: &http::request::Parts) -> Box<http::request::Parts> {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = p.method.clone();
    parts.uri = p.uri.clone();
    parts.version = p.version;
    parts.headers = p.headers.clone();
    parts.headers.remove(http::header::IF_NONE_MATCH);
    parts.headers.remove(http::header::IF_MODIFIED_SINCE);
    Box::new(parts)
}

impl KeyedWrites for FastRequest<'_, '_> {
    fn keyed(&self) -> bool {
        self.p.idem.is_some()
    }

    async fn begin_keyed(
        &mut self,
        up: &Upstream,
        head: H2Head,
        _deadline: Instant,
        upload: &mut Upload,
    ) -> Result<(Option<Begun>, H2Head), bool> {
        let p = self.p;
        let Some(k) = p.idem.clone() else {
            return Ok((None, head));
        };
        let need = self.need();
        self.read_first = self.ctx.bufs.client.len() < need;
        self.ctx.read_body(up, self.start, p, upload).await?;
        let (method, target) = k.parts(&self.ctx.bufs.client);
        let key = p.asked.key.as_deref().unwrap_or_default();
        let body = &self.ctx.bufs.client[p.head_len..need];
        let fp = idempotent::fingerprint(method, target, body, p.chunked);
        Ok((Some(idempotent::begin(up, key, &fp).await), head))
    }

    async fn replay(&mut self, up: &Upstream, stored: StoredResponse) -> bool {
        self.ctx.replay(up, self.start, self.p, &stored).await
    }
}

impl Codec for FastRequest<'_, '_> {
    /// Whether the client connection stays open for the next request.
    type Out = bool;
    type Response = UpstreamAnswer;
    type Arrived = H2Head;
    type Ready = H2Head;

    fn asked(&self) -> [Option<Duration>; 2] {
        [self.p.asked.lowered, None]
    }

    async fn admit(
        &mut self,
        up: &Upstream,
        key: Option<&str>,
        start: Instant,
        deadline: Instant,
    ) -> Option<Result<Admitted, ProxyError>> {
        let mut watch = ClientWatch {
            stream: &mut *self.ctx.stream,
            client: &mut self.ctx.bufs.client,
            eof: &mut self.ctx.bufs.eof,
            need: self.p.head_len + self.p.body_len,
        };
        attempt::admit(up, key, start, deadline, &mut watch).await
    }

    async fn body(
        &mut self,
        up: &Upstream,
        head: H2Head,
        upload: &mut Upload,
    ) -> Result<(H2Head, bool), bool> {
        let (p, need) = (self.p, self.need());
        let waited = self.read_first || self.ctx.bufs.client.len() < need;
        self.ctx.read_body(up, self.start, p, upload).await?;
        if !p.chunked {
            let body = &self.ctx.bufs.client[p.head_len..need];
            self.ctx.bufs.request.extend_from_slice(body);
        }
        Ok((head, waited))
    }

    fn facts(&self, _: &H2Head) -> RequestFacts {
        self.p.facts
    }

    async fn drive(
        &mut self,
        up: &Upstream,
        head: H2Head,
        attempts: &mut Attempts<'_>,
        t0: Instant,
        detached: bool,
    ) -> Option<Attempted<UpstreamAnswer>> {
        let p = self.p;
        attempts.set_keyed_write(p.keyed_write);
        attempts.trace = p.trace.clone();
        if let Some(parts) = head {
            let h2 = self.ctx.attempt_h2(up, p, *parts, attempts, t0, detached);
            return h2.await;
        }
        if !up.own_h1 {
            return None;
        }
        // An HTTP/1.1 upstream: over the fast path's own connections.
        let ctx = &mut *self.ctx;
        let mut t = FastTransport {
            watch: ClientWatch {
                stream: &mut *ctx.stream,
                client: &mut ctx.bufs.client,
                eof: &mut ctx.bufs.eof,
                need: p.head_len + p.body_len,
            },
            request: &mut ctx.bufs.request,
            upstream: &mut ctx.bufs.upstream,
            out: &mut ctx.bufs.out,
            kept: &mut ctx.bufs.kept,
            timer: &mut *ctx.timer,
            pool: ctx.pool,
            up,
            is_head_request: p.is_head_request,
            detached,
            avoid: Vec::new(),
        };
        let driven = attempt::drive(attempts, &mut t, Some(t0)).await?;
        Some(Attempted {
            result: driven.result.map(UpstreamAnswer::H1),
            stop: driven.stop,
            ended: driven.ended,
            // A failed attempt's endpoint is the last one it avoids.
            last_failed: t.avoid.last().copied(),
        })
    }

    async fn refuse(
        &mut self,
        up: &Upstream,
        error: ProxyError,
        attempts: Option<Annotations>,
        endpoint: Option<Address>,
    ) -> bool {
        let f = OwnError {
            error,
            attempts,
            endpoint,
            cache: self.mark,
        };
        self.ctx.fail(up, self.start, self.p, f).await
    }

    fn gone(&mut self) -> bool {
        false
    }

    async fn answer(
        &mut self,
        up: &Upstream,
        attempted: Attempted<UpstreamAnswer>,
        spent: Annotations,
        recorder: Option<Recorder>,
        _slot: Slot,
    ) -> bool {
        let (ctx, p, start) = (&mut *self.ctx, self.p, self.start);
        let cfg = &up.config;
        let Attempted {
            result,
            stop,
            ended,
            last_failed,
        } = attempted;
        let annotations = cfg.annotate.then_some(spent);
        let took = ended.saturating_duration_since(start);
        let x = match result {
            Ok(x) => x,
            Err(error) => {
                let f = OwnError {
                    error,
                    attempts: Some(spent),
                    endpoint: last_failed,
                    cache: self.mark,
                };
                return ctx.fail(up, start, p, f).await;
            }
        };
        // Each kind relayed where it is matched: moved once, into its relay.
        let (status, addr, relayed) = match x {
            UpstreamAnswer::H1(x) => {
                let (status, addr) = (x.status, x.addr);
                up.state.metrics.status(status, took);
                let kept = Kept {
                    annotations,
                    recorder,
                    cache: self.mark.filter(|_| cfg.annotate),
                };
                let relayed = ctx.relay(up, addr, x, kept, p, ended).await;
                (status, Some(addr), relayed)
            }
            UpstreamAnswer::H2(r) => {
                let status = r.status().as_u16();
                let addr = r.extensions().get::<crate::upstream::Served>().map(|s| s.0);
                up.state.metrics.status(status, took);
                let kept = Kept {
                    annotations,
                    recorder,
                    cache: self.mark.filter(|_| cfg.annotate),
                };
                let relayed = match self.ahead.take() {
                    None => ctx.relay_h2(up, r, kept, p).await,
                    Some(ahead) => {
                        let (parts, body) = r.into_parts();
                        let body = (*ahead).before(crate::proxy::body::boxed(body));
                        let r = http::Response::from_parts(parts, body);
                        ctx.relay_h2(up, r, kept, p).await
                    }
                };
                (status, addr, relayed)
            }
        };
        if let Some(code) = relayed.error {
            up.state.metrics.body_error(code);
        }
        let entry = access::AccessEntry {
            grpc_status: None,
            upstream: &cfg.name,
            method: "",
            path: "",
            status,
            error: relayed.error,
            attempts: Some(spent.attempts),
            retry_stop: stop.map(|s| s.as_str()),
            hedge: spent.hedge,
            endpoint: addr,
            took,
            bytes_out: relayed.bytes,
            who: access::Who::default(),
        };
        ctx.access_log(p, entry);
        relayed.open && !p.close
    }
}

impl CacheIo for FastRequest<'_, '_> {
    fn request_fields<R>(&self, f: impl FnOnce(&CacheFields<'_>) -> R) -> R {
        let head = self.ctx.bufs.client.get(..self.p.head_len);
        head::cache::request_fields(head.unwrap_or_default(), |fields| {
            let pairs = fields.iter().map(|h| (h.name.as_bytes(), h.value));
            crate::proxy::cached::with_fields(pairs, f)
        })
    }

    fn status(&self, r: &UpstreamAnswer) -> u16 {
        match r {
            UpstreamAnswer::H1(x) => x.status,
            UpstreamAnswer::H2(r) => r.status().as_u16(),
        }
    }

    fn response_fields<R>(
        &self,
        r: &UpstreamAnswer,
        f: impl FnOnce(u16, &CacheFields<'_>) -> R,
    ) -> R {
        match r {
            UpstreamAnswer::H1(x) => {
                // The response head, as it was begun for the client.
                let fields = head::cache::response_fields(&self.ctx.bufs.out);
                crate::proxy::cached::with_fields(fields, |p| f(x.status, p))
            }
            UpstreamAnswer::H2(r) => f(
                r.status().as_u16(),
                &crate::proxy::cached::pairs(r.headers()),
            ),
        }
    }

    async fn answer_entry(
        &mut self,
        up: &Upstream,
        e: &CachedResponse,
        result: CacheResult,
        attempts: Option<Annotations>,
    ) -> bool {
        let (p, start) = (self.p, self.start);
        self.ctx
            .cache_answer(up, start, p, e, result, attempts)
            .await
    }

    fn refresh(&self, up: &Upstream, e: &Arc<CachedResponse>, key: &str) {
        let head = self.ctx.bufs.client.get(..self.p.head_len);
        if let Some(parts) = head::cache::request_parts(head.unwrap_or_default()) {
            crate::proxy::general::refresh(up, self.ctx.pool, &parts, key, e);
        }
    }

    async fn read_whole(
        &mut self,
        up: &Upstream,
        r: &mut UpstreamAnswer,
        limit: usize,
    ) -> Result<Option<Vec<Bytes>>, ProxyError> {
        match r {
            UpstreamAnswer::H1(x) => {
                let whole = Box::pin(self.ctx.read_whole(up, x, limit)).await?;
                Ok(whole.map(|b| vec![Bytes::from(b)]))
            }
            UpstreamAnswer::H2(r) => {
                let mut ahead = crate::proxy::cached::whole::ReadBefore::default();
                let idle = up.config.idle_timeout;
                let body = r.body_mut();
                let ended = crate::proxy::cached::whole::read(body, limit, idle, &mut ahead);
                let ended = ended.await?;
                let data = ended.then(|| ahead.data.clone());
                self.ahead = Some(Box::new(ahead));
                Ok(data)
            }
        }
    }

    fn endpoint(&self, r: &UpstreamAnswer) -> Option<Address> {
        match r {
            UpstreamAnswer::H1(x) => Some(x.addr),
            UpstreamAnswer::H2(r) => r.extensions().get::<crate::upstream::Served>().map(|s| s.0),
        }
    }

    fn let_go(&mut self, r: UpstreamAnswer) {
        if let UpstreamAnswer::H1(x) = r {
            x.let_go(self.ctx.pool, &self.ctx.bufs.upstream);
        }
    }

    fn mark(&mut self, result: CacheResult) {
        self.mark = Some(result);
    }

    fn plain(&mut self) -> Option<H2Head> {
        if let Some(parts) = self.plain_h2.take() {
            return Some(Some(parts));
        }
        // A request without a body, to an HTTP/1.1 upstream: its head
        // written again without the validators.
        let len = self.p.validators_len.filter(|_| self.p.body_len == 0)?;
        let request = &mut self.ctx.bufs.request;
        let end = request.len().checked_sub(2)?;
        if !request.ends_with(b"\r\n\r\n") {
            return None;
        }
        request.drain(end.checked_sub(len)?..end);
        Some(None)
    }
}
