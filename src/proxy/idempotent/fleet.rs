//! Idempotency records on the fleet's Redis (docs/reference/fleet.md#fleet-state):
//! tried first when the upstream's state is shared; a call that fails or
//! takes past `[state] timeout` leaves the decision to the instance's own
//! memory store. The finishing calls run in the background: the client is
//! never held back by them.

use super::{Begun, Recorder};
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
/// broke), so it may have landed all the same and left the key in flight
/// on Redis, this instance's: whatever the local store decides, that
/// record is to be finished ([`finish_landed`]) or forgotten ([`forget`])
/// too, or the key is held fleet-wide for the whole lease.
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
        Err(StateError::Unavailable | StateError::Setup(_)) => return Err(None),
        Err(_) => {
            return Err(Some(RedisRecord {
                link,
                fingerprint: *fingerprint,
                ttl,
            }))
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

/// `claim` on Redis (a request whose body streams); `None`: decide locally.
/// With [`Claim::Forward`], the recorder and the link the fingerprint goes
/// to once the body has passed.
pub(super) async fn claim(
    up: &Upstream,
    link: Arc<Link>,
    key: &str,
) -> Option<(Claim, Option<(Recorder, Arc<Link>)>)> {
    let (ttl, limit) = params(up)?;
    let claim = (link.fleet)
        .idempotency_claim(&up.state.name, key, lease(up))
        .await
        .ok()?;
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
    Some((claim, forward))
}

/// Fills in a claimed record's fingerprint, in the background.
pub(super) fn fingerprinted(link: Arc<Link>, key: Box<str>, fingerprint: Fingerprint) {
    spawn(async move {
        let _ = (link.fleet)
            .idempotency_fingerprinted(link.upstream(), &key, &fingerprint)
            .await;
    });
}

/// Writes how a request ended, in the background.
pub(super) fn finish(
    shared: RedisRecord,
    key: Box<str>,
    what: Record,
    response: Option<StoredResponse>,
) {
    if matches!(what, Record::Completed | Record::CompletedNotReplayable) {
        shared.link.count_stored();
    }
    finish_landed(shared, key, what, response);
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
    spawn(async move {
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
    });
}

fn spawn<F>(f: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(f);
    }
}
