//! What the response cache's steps (`proxy::order::cache`) ask of the
//! general path's codec: the client's fields, a response's fields and its
//! body read whole (relayed after, from what was read), an answer from an
//! entry, the background refresh, and the request asked again plainly.

use super::{ArrivedRequest, GeneralRequest, UnreadBody};
use crate::policy::cache::{CacheResult, CachedResponse};
use crate::proxy::attempt::Annotations;
use crate::proxy::body::RelayedBody;
use crate::proxy::cached::{self, whole};
use crate::proxy::error::ProxyError;
use crate::proxy::idempotent::Forwarded;
use crate::proxy::order::cache::{CacheFields, CacheIo};
use crate::proxy::Upstream;
use bytes::Bytes;
use http::Response;
use std::sync::Arc;

impl CacheIo for GeneralRequest<'_> {
    fn request_fields<R>(&self, f: impl FnOnce(&CacheFields<'_>) -> R) -> R {
        let headers = self.client.as_ref().map(|c| &c.headers);
        let pairs = headers.into_iter().flat_map(|h| h.iter());
        cached::with_fields(pairs.map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())), f)
    }

    fn status(&self, r: &Response<RelayedBody>) -> u16 {
        r.status().as_u16()
    }

    fn response_fields<R>(
        &self,
        r: &Response<RelayedBody>,
        f: impl FnOnce(u16, &CacheFields<'_>) -> R,
    ) -> R {
        let pairs = r.headers().iter();
        let pairs = pairs.map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
        cached::with_fields(pairs, |p| f(r.status().as_u16(), p))
    }

    async fn answer_entry(
        &mut self,
        up: &Upstream,
        e: &CachedResponse,
        result: CacheResult,
        attempts: Option<Annotations>,
    ) -> Forwarded {
        let now = up.state.now();
        let (parts, bytes) = cached::entry_parts(up, e, result, self.head, attempts, now);
        up.state.metrics.status(e.status, self.start.elapsed());
        Ok((
            Response::from_parts(parts, crate::proxy::body::full(bytes)),
            None,
        ))
    }

    fn refresh(&self, up: &Upstream, e: &Arc<CachedResponse>, key: &str) {
        if let Some(client) = &self.client {
            super::refresh::refresh(up, self.conn.pool(), client, key, e);
        }
    }

    async fn read_whole(
        &mut self,
        up: &Upstream,
        r: &mut Response<RelayedBody>,
        limit: usize,
    ) -> Result<Option<Vec<Bytes>>, ProxyError> {
        let mut ahead = whole::ReadBefore::default();
        let idle = up.config.idle_timeout;
        let ended = whole::read(r.body_mut(), limit, idle, &mut ahead).await?;
        let data = ended.then(|| ahead.data.clone());
        self.ahead = Some(ahead);
        Ok(data)
    }

    fn endpoint(&self, r: &Response<RelayedBody>) -> Option<crate::upstream::Address> {
        r.extensions().get::<crate::upstream::Served>().map(|s| s.0)
    }

    fn let_go(&mut self, r: Response<RelayedBody>) {
        drop(r);
    }

    fn mark(&mut self, result: CacheResult) {
        self.mark = Some(result);
    }

    fn plain(&mut self) -> Option<ArrivedRequest> {
        let parts = self.plain.take()?;
        let body = UnreadBody::Streaming(crate::proxy::body::empty());
        Some(ArrivedRequest { parts, body })
    }
}
