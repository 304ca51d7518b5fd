//! Idempotency records on the fleet's Redis (docs/reference/fleet.md#fleet-state):
//! tried first when the upstream's state is shared; a call that fails or
//! takes past `[state] timeout` leaves the decision to the instance's own
//! memory store. The finishing calls run in the background: the client is
//! never held back by them.

use super::{Ack, Begun, Recorder};
use crate::config::OnUnavailable;
use crate::policy::idempotency::{Action, Claim, Fingerprint, Record, StoredResponse};
use crate::proxy::error::ProxyError;
use crate::proxy::Upstream;
use crate::state::fleet::StateError;
use crate::state::link::Link;
use std::sync::Arc;
use std::time::Duration;

/// A record kept on Redis: what its finishing call needs.
#[derive(Debug)]
pub(crate) struct RedisRecord {
    link: Arc<Link>,
    fingerprint: Fingerprint,
    ttl: Duration,
}

/// How long a record in flight holds its key on Redis: the request's
/// `timeout` plus the time to read its response (`idle_timeout`, at most
/// 30 s). An instance that dies mid-request frees the key after it.
fn lease(up: &Upstream) -> Duration {
    let cfg = &up.config;
    cfg.timeout + cfg.idle_timeout.min(Duration::from_secs(30))
}

/// The store's `ttl` and `max_response_bytes`, when it is on.
fn params(up: &Upstream) -> Option<(Duration, usize)> {
    let store = up.state.idempotency();
    let p = store.as_ref()?.params();
    Some((p.ttl, p.max_response_bytes))
}

/// `begin` on Redis; `Err`: decide locally. `Err(Some(_))`: the call was
/// made but gave no answer (past `[state] timeout`, or the connection
/// broke), or its claim was not acknowledged by `[state] wait_replicas`, so
/// it may have landed all the same and left the key in flight on Redis,
/// this instance's: whatever the local store decides, that record is to be
/// finished ([`finish_landed`]) or forgotten ([`forget`]) too, or the key
/// is held fleet-wide for the whole lease. With `on_unavailable =
/// "refuse"`, a begin the store could not guard is refused instead
/// (`Ok(Begun::Refused(StateUnavailable))`), and what it may have left is
/// forgotten.
pub(super) async fn begin(
    up: &Upstream,
    link: Arc<Link>,
    key: &str,
    fingerprint: &Fingerprint,
) -> Result<Begun, Option<RedisRecord>> {
    let (ttl, limit) = params(up).ok_or(None)?;
    let action = match (link.fleet)
        .idempotency_begin(&up.state.name, key, fingerprint, lease(up))
        .await
    {
        Ok(a) => a,
        Err(e) => {
            let landed = !matches!(e, StateError::Unavailable | StateError::Setup(_));
            let landed = landed.then(|| RedisRecord {
                link: link.clone(),
                fingerprint: *fingerprint,
                ttl,
            });
            return unguarded(&link, key, landed);
        }
    };
    link.count(&action);
    Ok(match action {
        Action::Forward => {
            let fingerprint = *fingerprint;
            let shared = RedisRecord {
                link,
                fingerprint,
                ttl,
            };
            Begun::Forward(Recorder::new(&up.state, key, limit, Some(shared)))
        }
        Action::Replay(r) => Begun::Replay(r),
        Action::InFlight => Begun::Refused(ProxyError::IdempotencyInFlight),
        Action::Reused => Begun::Refused(ProxyError::IdempotencyKeyReused),
        Action::NotReplayable => Begun::Refused(ProxyError::IdempotencyNotReplayable),
    })
}

/// `claim` on Redis (a request whose body streams); `Ok(None)`: decide
/// locally; `Err`: refused (`on_unavailable = "refuse"`, the store could
/// not guard it). With [`Claim::Forward`], the recorder and the link the
/// fingerprint goes to once the body has passed.
pub(super) async fn claim(
    up: &Upstream,
    link: Arc<Link>,
    key: &str,
) -> Result<Option<(Claim, Option<(Recorder, Arc<Link>)>)>, ProxyError> {
    let Some((ttl, limit)) = params(up) else {
        return Ok(None);
    };
    let claim = match (link.fleet)
        .idempotency_claim(&up.state.name, key, lease(up))
        .await
    {
        Ok(c) => c,
        Err(e) => {
            let landed = !matches!(e, StateError::Unavailable | StateError::Setup(_));
            let landed = landed.then(|| RedisRecord {
                link: link.clone(),
                fingerprint: Fingerprint::PENDING,
                ttl,
            });
            return match unguarded(&link, key, landed) {
                Ok(_) => Err(ProxyError::StateUnavailable),
                Err(landed) => {
                    // A claim is not finished locally: what it may have
                    // left on Redis is dropped.
                    if let Some(l) = landed {
                        forget(l, key);
                    }
                    Ok(None)
                }
            };
        }
    };
    if claim == Claim::InFlight {
        link.count::<()>(&Action::InFlight);
    }
    let forward = (claim == Claim::Forward).then(|| {
        let shared = RedisRecord {
            link: link.clone(),
            fingerprint: Fingerprint::PENDING,
            ttl,
        };
        (Recorder::new(&up.state, key, limit, Some(shared)), link)
    });
    Ok(Some((claim, forward)))
}

/// Fills in a claimed record's fingerprint, in the background.
pub(super) fn fingerprinted(link: Arc<Link>, key: Box<str>, fingerprint: Fingerprint) {
    spawn(async move {
        let _ = (link.fleet)
            .idempotency_fingerprinted(link.upstream(), &key, &fingerprint)
            .await;
    });
}

/// A keyed write the fleet's store could not guard (no primary, no
/// answer, or a claim its replicas did not acknowledge), as `[state]
/// on_unavailable` says: `local` decides with the instance's own store
/// (`Err`, with what the begin may have left on Redis), `refuse` answers
/// 503 `state_unavailable` (and forgets what it may have left). Counted in
/// `weir_state_keyed_fallback_total{action}`.
fn unguarded(
    link: &Link,
    key: &str,
    landed: Option<RedisRecord>,
) -> Result<Begun, Option<RedisRecord>> {
    match link.fleet.on_unavailable() {
        OnUnavailable::Local => {
            link.fleet.metrics().fallback("local");
            Err(landed)
        }
        OnUnavailable::Refuse => {
            link.fleet.metrics().fallback("refused");
            if let Some(l) = landed {
                forget(l, key);
            }
            Ok(Begun::Refused(ProxyError::StateUnavailable))
        }
    }
}

/// Writes how a request ended. In the background, but with `[state]
/// wait_replicas` set the [`Ack`] resolves only once the record is written
/// and acknowledged (or given up on), and the relay holds the response's
/// last bytes until then.
pub(super) fn finish(
    shared: RedisRecord,
    key: Box<str>,
    what: Record,
    response: Option<StoredResponse>,
) -> Ack {
    if matches!(what, Record::Completed | Record::CompletedNotReplayable) {
        shared.link.count_stored();
    }
    let durable = shared.link.fleet.wait_replicas() > 0;
    let task = write_record(shared, key, what, response);
    match (durable, tokio::runtime::Handle::try_current()) {
        (true, Ok(rt)) => Ack(Some(rt.spawn(task))),
        (false, Ok(rt)) => {
            rt.spawn(task);
            Ack::NONE
        }
        (_, Err(_)) => Ack::NONE,
    }
}

/// Drops the record an unanswered `begin` may have left on Redis, when the
/// local store did not forward the request.
pub(super) fn forget(shared: RedisRecord, key: &str) {
    finish_landed(shared, key.into(), Record::Forget, None);
}

/// Writes how a request ended, in the background, uncounted: for a request
/// the local store decided, to the record its unanswered `begin` may have
/// left on Redis (a no-op there unless that record is in flight and this
/// instance's, with this fingerprint).
pub(super) fn finish_landed(
    shared: RedisRecord,
    key: Box<str>,
    what: Record,
    response: Option<StoredResponse>,
) {
    spawn(write_record(shared, key, what, response));
}

/// The finishing call itself.
async fn write_record(
    shared: RedisRecord,
    key: Box<str>,
    what: Record,
    response: Option<StoredResponse>,
) {
    let RedisRecord {
        link,
        fingerprint,
        ttl,
    } = shared;
    let _ = (link.fleet)
        .idempotency_finish(
            link.upstream(),
            &key,
            &fingerprint,
            what,
            response.as_ref(),
            ttl,
        )
        .await;
}

fn spawn<F>(f: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(f);
    }
}
