//! The fast path's requests to an HTTP/2 upstream (`protocol = "h2c"`):
//! the head `head::plan` carried over into `http` parts, the body held in
//! the client's buffer, sent as attempts of the one driver through the
//! general path's transport (`general::transport::GeneralTransport`: the
//! endpoint's HTTP/2 pool, `upstream::pool::h2`), raced against the client going away
//! as the fast path's own attempts are. The response is written back as
//! HTTP/1.1 by [`super::h2relay`].

use super::transport::ClientWatch;
use super::{client_gone, Ctx, Planned, UpstreamAnswer};
use crate::policy::Outcome;
use crate::proxy::attempt::Attempted;
use crate::proxy::attempt::{self, Attempts};
use crate::proxy::body::RelayedBody;
use crate::proxy::error::ProxyError;
use crate::proxy::general::transport::{GeneralTransport, Outbound};
use crate::proxy::replay::RequestBody;
use crate::proxy::Upstream;
use crate::upstream::Address;
use bytes::Bytes;
use http::Response;
use tokio::time::Instant;

/// The general path's transport, watching the fast path's client.
struct H2Transport<'c, 'p, 'a> {
    inner: GeneralTransport<'p, 'a>,
    watch: ClientWatch<'c>,
    /// A keyed write's attempts go on when the client leaves (see
    /// `transport::FastTransport::detached`).
    detached: bool,
}

impl attempt::Watch for H2Transport<'_, '_, '_> {
    async fn unless_gone<F: std::future::Future>(&mut self, f: F) -> Option<F::Output> {
        if self.detached {
            return Some(f.await);
        }
        self.watch.unless_gone(f).await
    }
}

impl attempt::Transport for H2Transport<'_, '_, '_> {
    type Response = Response<RelayedBody>;

    async fn attempt(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
    ) -> Option<(Outcome, Result<Self::Response, ProxyError>)> {
        let w = &mut self.watch;
        tokio::select! {
            biased;
            // The client went away: the attempt is dropped, the breaker
            // slot released without a verdict.
            () = client_gone(w.stream, w.client, w.need, w.eof), if !self.detached => None,
            r = self.inner.attempt(started, try_deadline, deadline) => r,
        }
    }

    async fn attempt_hedged(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
        hedging: attempt::Hedging<'_>,
    ) -> Option<attempt::Raced<Self::Response>> {
        let w = &mut self.watch;
        let raced = self
            .inner
            .attempt_hedged(started, try_deadline, deadline, hedging);
        tokio::select! {
            biased;
            // The client went away: both attempts are dropped.
            () = client_gone(w.stream, w.client, w.need, w.eof), if !self.detached => None,
            r = raced => r,
        }
    }

    fn discard(&mut self, response: Result<Self::Response, ProxyError>) {
        self.inner.discard(response);
    }

    fn body_facts(&self) -> Option<crate::policy::BodyFacts> {
        self.inner.body_facts()
    }

    fn traceparent(&mut self, value: &[u8; 55]) {
        self.inner.traceparent(value);
    }

    fn elsewhere(&self) -> bool {
        self.inner.elsewhere()
    }

    fn endpoint(&self, r: &Result<Self::Response, ProxyError>) -> Option<Address> {
        self.inner.endpoint(r)
    }
}

impl Ctx<'_> {
    /// Runs the attempts of a request to an HTTP/2 upstream; `None` when
    /// the client went away meanwhile.
    pub(super) async fn attempt_h2(
        &mut self,
        up: &Upstream,
        p: &Planned,
        parts: http::request::Parts,
        attempts: &mut Attempts<'_>,
        t0: Instant,
        detached: bool,
    ) -> Option<Attempted<UpstreamAnswer>> {
        let deadline = attempts.deadline_at(t0);
        let need = p.head_len + p.body_len;
        let body = self.bufs.client.get(p.head_len..need).unwrap_or_default();
        let data = match p.chunked {
            // Its data; a body with trailers never comes this way.
            true => Bytes::from(crate::h1::chunk_data(body).0),
            false => Bytes::copy_from_slice(body),
        };
        let mut plan = Outbound {
            parts,
            body: RequestBody::Buffered {
                data,
                trailers: None,
            },
            deadline,
            has_idempotency_key: p.asked.carries_key,
            grpc_deadline: None,
            single: up.config.retry.max_attempts <= 1,
            upgrade: false,
            grpc: Default::default(),
            continue_gate: None,
            upload: attempts.upload().clone(),
        };
        let mut t = H2Transport {
            inner: GeneralTransport::new(up, self.h2_conn, &mut plan),
            watch: ClientWatch {
                stream: &mut *self.stream,
                client: &mut self.bufs.client,
                eof: &mut self.bufs.eof,
                need,
            },
            detached,
        };
        let driven = attempt::drive(attempts, &mut t, Some(t0)).await?;
        Some(Attempted {
            result: driven.result.map(UpstreamAnswer::H2),
            stop: driven.stop,
            ended: driven.ended,
            last_failed: t.inner.last_failed(),
        })
    }
}
