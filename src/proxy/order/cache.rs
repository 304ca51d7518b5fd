//! The response cache as steps of the order, taken once for every codec
//! (docs/reference/cache.md#response-cache):
//!
//! - before admission ([`before`]): a fresh entry answers; a stale one
//!   within its `stale-while-revalidate` answers and is refreshed in the
//!   background; a miss whose response may be stored takes its turn at
//!   its key's fill (the others of the key wait for what it stores);
//! - after the attempts ([`CacheStep`]): a write's success drops its
//!   target's entries; a 304 to a revalidation refreshes the entry, which
//!   answers (one that matches no entry any more: the request is sent
//!   again, plainly); a failure — weir's own or a 5xx — within the entry's
//!   `stale-if-error` is answered by it; a miss's response is read whole
//!   and stored when it may be, then relayed.
//!
//! A codec supplies how to read a response's fields and body and how to
//! write an answer from an entry ([`CacheIo`]); when is this module's.

use super::{Codec, Finished, Steps};
use crate::policy::cache::{on_error, on_not_modified, CacheResult, CachedResponse, Refreshed};
use crate::proxy::attempt::{Annotations, Attempted};
use crate::proxy::cached::fill::{self, EndFill, Turn};
use crate::proxy::cached::{self, Cached, Filling};
use crate::proxy::error::ProxyError;
use crate::proxy::idempotent::Recorder;
use crate::proxy::Upstream;
use crate::state::gate::Slot;
use crate::upstream::Address;
use bytes::Bytes;
use std::sync::Arc;
use tokio::time::Instant;

/// Request and response fields as the cache reads them.
pub(crate) type CacheFields<'a> = [(&'a [u8], &'a [u8])];

/// What a codec supplies to the cache's steps.
pub(crate) trait CacheIo: Codec {
    /// Calls `f` with the request's fields (they select an entry's variant).
    fn request_fields<R>(&self, f: impl FnOnce(&CacheFields<'_>) -> R) -> R;

    /// A response's status.
    fn status(&self, r: &Self::Response) -> u16;

    /// Calls `f` with a response's status and fields.
    fn response_fields<R>(
        &self,
        r: &Self::Response,
        f: impl FnOnce(u16, &CacheFields<'_>) -> R,
    ) -> R;

    /// Answers from an entry; `attempts`: those made, when the answer came
    /// after them (a revalidation, a failure within `stale-if-error`).
    async fn answer_entry(
        &mut self,
        up: &Upstream,
        e: &CachedResponse,
        result: CacheResult,
        attempts: Option<Annotations>,
    ) -> Self::Out;

    /// Starts the one background refresh of a stale entry's key.
    fn refresh(&self, up: &Upstream, e: &Arc<CachedResponse>, key: &str);

    /// Reads `r`'s body whole, up to `limit` bytes, before any of it is
    /// relayed: `Ok(Some)`: its data; `Ok(None)`: it is larger, or has
    /// trailers (relayed as it comes, what was read first); `Err`: it broke
    /// off.
    async fn read_whole(
        &mut self,
        up: &Upstream,
        r: &mut Self::Response,
        limit: usize,
    ) -> Result<Option<Vec<Bytes>>, ProxyError>;

    /// The endpoint that sent a response, when known.
    fn endpoint(&self, r: &Self::Response) -> Option<Address>;

    /// A response that is not relayed (an entry answers instead).
    fn let_go(&mut self, r: Self::Response);

    /// How the cache took part, for the codec's answer or error to say.
    fn mark(&mut self, result: CacheResult);

    /// The request again, without the validators of the entry it
    /// revalidated (a 304 that matches no entry any more); `None` when it
    /// cannot be made again.
    fn plain(&mut self) -> Option<Self::Arrived>;
}

/// A fresh entry answers the request: counted, and written by the codec.
pub(super) async fn hit<C: CacheIo>(up: &Upstream, codec: &mut C, e: &CachedResponse) -> C::Out {
    cached::count(up, CacheResult::Hit);
    codec.answer_entry(up, e, CacheResult::Hit, None).await
}

/// The steps before admission: `Err` when the cache answered (from an
/// entry, or weir's error when the wait for its key's fill outlasted the
/// deadline); `Ok` when the request goes upstream, holding its key's fill
/// when it leads one.
pub(super) async fn before<'a, C: CacheIo>(
    up: &'a Upstream,
    codec: &mut C,
    cached: &'a Cached,
    deadline: Instant,
) -> Result<Option<EndFill<'a>>, C::Out> {
    match cached {
        Cached::Hit(e) => {
            cached::count(up, CacheResult::Hit);
            Err(codec.answer_entry(up, e, CacheResult::Hit, None).await)
        }
        Cached::Stale(e, key) => {
            codec.refresh(up, e, key);
            cached::count(up, CacheResult::Stale);
            Err(codec.answer_entry(up, e, CacheResult::Stale, None).await)
        }
        _ => {
            let Some(f) = cached.filling_get() else {
                return Ok(None);
            };
            let select = |c: &crate::policy::cache::CacheStore| {
                codec.request_fields(|q| c.get(&f.key, q.iter().copied()).cloned())
            };
            match fill::take_turn(up, &f.key, deadline, select).await {
                Turn::Lead(end) => Ok(Some(end)),
                Turn::Alone => Ok(None),
                Turn::Stored(e) => {
                    cached::count(up, CacheResult::Coalesced);
                    Err(codec
                        .answer_entry(up, &e, CacheResult::Coalesced, None)
                        .await)
                }
                Turn::TimedOut => {
                    let e = ProxyError::DeadlineExceeded;
                    Err(failed(up, codec, f, e, None, None).await)
                }
            }
        }
    }
}

/// The entry that answers a failure within its `stale-if-error`.
fn stale_for(up: &Upstream, f: &Filling, failure: bool) -> Option<Arc<CachedResponse>> {
    let e = f.entry.as_ref()?;
    (failure && on_error(e, up.state.now())).then(|| e.clone())
}

/// weir's error `e` to a request that went upstream for its key: answered
/// by the entry within its `stale-if-error`, else weir's, marked a miss.
async fn failed<C: CacheIo>(
    up: &Upstream,
    codec: &mut C,
    f: &Filling,
    e: ProxyError,
    spent: Option<Annotations>,
    endpoint: Option<Address>,
) -> C::Out {
    if let Some(entry) = stale_for(up, f, cached::counts_as_failure(&e)) {
        f.count(up, CacheResult::StaleIfError);
        return (codec.answer_entry(up, &entry, CacheResult::StaleIfError, spent)).await;
    }
    f.count(up, CacheResult::Miss);
    codec.mark(CacheResult::Miss);
    codec.refuse(up, e, spent, endpoint).await
}

/// The cache's steps after admission, around the codec's own.
pub(super) struct CacheStep<'a> {
    pub(super) cached: &'a Cached,
}

impl<C: CacheIo> Steps<C> for CacheStep<'_> {
    fn inert(&self) -> bool {
        matches!(
            self.cached,
            Cached::Off | Cached::Hit(_) | Cached::Stale(..)
        )
    }

    async fn refuse(
        &self,
        up: &Upstream,
        codec: &mut C,
        e: ProxyError,
        spent: Option<Annotations>,
        endpoint: Option<Address>,
    ) -> C::Out {
        match self.cached {
            Cached::Fill(f) => Box::pin(failed(up, codec, f, e, spent, endpoint)).await,
            _ => codec.refuse(up, e, spent, endpoint).await,
        }
    }

    async fn finish(
        &self,
        up: &Upstream,
        codec: &mut C,
        attempted: Attempted<C::Response>,
        spent: Annotations,
        recorder: Option<Recorder>,
        slot: Slot,
    ) -> Finished<C> {
        match self.cached {
            // Boxed: only a cached upstream's requests take these steps,
            // and every request's future would carry them inline.
            Cached::Fill(f) => match Box::pin(settle(up, codec, f, attempted, spent)).await {
                Settled::Relay(attempted) => {
                    let answer = codec.answer(up, attempted, spent, recorder, slot);
                    Finished::Out(answer.await)
                }
                // The slot goes before anything is asked again.
                Settled::Done(done) => done,
            },
            Cached::Invalidates(w) => {
                if let Ok(r) = &attempted.result {
                    let status = codec.status(r);
                    if crate::policy::cache::invalidates(w.method.as_str(), status) {
                        if let Some(c) = up.state.cache().as_mut() {
                            c.invalidate(&w.key);
                        }
                    }
                }
                Finished::Out(codec.answer(up, attempted, spent, recorder, slot).await)
            }
            _ => Finished::Out(codec.answer(up, attempted, spent, recorder, slot).await),
        }
    }
}

/// How the cache's steps after the attempts end for a request that went
/// upstream for its key ([`settle`]).
enum Settled<C: Codec> {
    /// Answered by the codec, marked (a miss, stored or not).
    Relay(Attempted<C::Response>),
    /// Answered otherwise (an entry, weir's error), or to be asked again.
    Done(Finished<C>),
}

/// The steps after the attempts for a request that went upstream for its
/// key ([`CacheStep`]): all but the codec's answer, which the caller
/// awaits outside the box these steps run in.
async fn settle<C: CacheIo>(
    up: &Upstream,
    codec: &mut C,
    f: &Filling,
    attempted: Attempted<C::Response>,
    spent: Annotations,
) -> Settled<C> {
    let Attempted {
        result,
        stop,
        ended,
        last_failed,
    } = attempted;
    let mut r = match result {
        Ok(r) => r,
        Err(e) => {
            if let Some(entry) = stale_for(up, f, cached::counts_as_failure(&e)) {
                f.count(up, CacheResult::StaleIfError);
                let result = CacheResult::StaleIfError;
                let out = codec.answer_entry(up, &entry, result, Some(spent));
                return Settled::Done(Finished::Out(out.await));
            }
            f.count(up, CacheResult::Miss);
            codec.mark(CacheResult::Miss);
            return Settled::Relay(Attempted {
                result: Err(e),
                stop,
                ended,
                last_failed,
            });
        }
    };
    let status = codec.status(&r);
    if let (Some(e), true) = (&f.entry, f.conditional && status == 304) {
        let refreshed = refreshed(up, codec, f, e, &r);
        codec.let_go(r);
        return Settled::Done(match refreshed {
            Some(fresh) => {
                let result = CacheResult::Revalidated;
                let out = codec.answer_entry(up, &fresh, result, Some(spent));
                Finished::Out(out.await)
            }
            // It validated some other response: ask again, plainly.
            None => match codec.plain() {
                Some(again) => Finished::Again(again),
                None => {
                    let e = ProxyError::BadResponse("a 304 that matches no entry".into());
                    Finished::Out(failed(up, codec, f, e, Some(spent), None).await)
                }
            },
        });
    }
    if let Some(entry) = stale_for(up, f, status >= 500) {
        codec.let_go(r);
        f.count(up, CacheResult::StaleIfError);
        let result = CacheResult::StaleIfError;
        let out = codec.answer_entry(up, &entry, result, Some(spent)).await;
        return Settled::Done(Finished::Out(out));
    }
    if !f.req.head && status < 500 {
        if let Err(e) = store(up, codec, f, &mut r).await {
            let endpoint = codec.endpoint(&r);
            codec.let_go(r);
            let out = failed(up, codec, f, e, Some(spent), endpoint).await;
            return Settled::Done(Finished::Out(out));
        }
    }
    f.count(up, CacheResult::Miss);
    codec.mark(CacheResult::Miss);
    Settled::Relay(Attempted {
        result: Ok(r),
        stop,
        ended,
        last_failed,
    })
}

/// A 304 to a revalidation (RFC 9111 §4.3.4): the entry refreshed by
/// its fields, stored again when it may be; `None` when it matches no
/// entry any more (dropped).
fn refreshed<C: CacheIo>(
    up: &Upstream,
    codec: &C,
    f: &Filling,
    e: &CachedResponse,
    r: &C::Response,
) -> Option<Arc<CachedResponse>> {
    let params = up.state.cache().as_ref().map(|c| c.params().clone())?;
    let (now, received) = (up.state.now(), up.state.clock.wall());
    let fresh = codec.response_fields(r, |_, fields| {
        on_not_modified(e, &f.req, fields.iter().copied(), &params, now, received)
    });
    codec.request_fields(|q| {
        let mut cache = up.state.cache();
        let c = cache.as_mut()?;
        let q = q.iter().copied();
        match fresh {
            Refreshed::Updated(r) => {
                c.insert(&f.key, q, r.clone());
                f.count_in(c, CacheResult::Revalidated);
                Some(Arc::new(r))
            }
            Refreshed::NotStorable(r) => {
                c.remove(&f.key, q);
                f.count_in(c, CacheResult::Revalidated);
                Some(Arc::new(r))
            }
            Refreshed::Mismatch => {
                c.remove(&f.key, q);
                None
            }
        }
    })
}

/// Stores the response to a miss when it may be stored (the variant its
/// request selects is dropped when not), its body read whole first.
async fn store<C: CacheIo>(
    up: &Upstream,
    codec: &mut C,
    f: &Filling,
    r: &mut C::Response,
) -> Result<(), ProxyError> {
    let to_store = codec.request_fields(|q| {
        codec.response_fields(r, |status, fields| {
            let (fields, q) = (fields.iter().copied(), q.iter().copied());
            fill::to_store(up, &f.key, &f.req, status, fields, q)
        })
    });
    let Some((freshness, limit)) = to_store else {
        return Ok(());
    };
    let Some(body) = codec.read_whole(up, r, limit).await? else {
        return Ok(());
    };
    let now = up.state.now();
    let entry = codec.response_fields(r, |status, fields| {
        CachedResponse::new(status, fields.iter().copied(), &body, freshness, now)
    });
    codec.request_fields(|q| fill::insert(up, &f.key, q.iter().copied(), entry));
    Ok(())
}
