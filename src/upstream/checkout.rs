//! The checkout of an upstream connection for an attempt
//! (docs/reference/endpoints.md#connections), for both data paths: the
//! endpoint picked (and published to the hedge), an idle connection from
//! the worker's pool or a new one from the one dialler (`pool::open`, its
//! TLS failures logged here, once per cause), an endpoint that refuses
//! reported and the next tried. [`send`] is the general path's: a lease
//! of an HTTP/1.1 connection (held by the client connection, or from the
//! pool, or new), or the endpoint's HTTP/2 pool; an `auto` endpoint over
//! TLS answers by ALPN on its dial. [`idle`] then [`dial`] are the fast
//! path's: the raw HTTP/1.1 stream it writes its request on. `proxy/`
//! neither picks nor dials.

use super::body::UpstreamBody;
use super::client::{Failure, SendError, Speaks, UpstreamClient};
use super::http1;
use super::pool::held::{self, ConnCtx};
use super::pool::lease::H1Lease;
use super::reach::UpstreamReach;
use super::send::Body;
use super::{Endpoints, Picked};
use crate::upstream::Address;
use http::{Request, Response};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// What of an upstream an attempt's checkout needs.
pub(crate) struct CheckoutFor<'a> {
    pub endpoints: &'a Arc<Endpoints>,
    /// Its reach: held connections' count, TLS failures logged; its
    /// identity keys a client connection's held leases.
    pub reach: &'a UpstreamReach,
    /// How it is reached (the snapshot's copy).
    pub client: &'a UpstreamClient,
    /// HTTP/1.1 on weir's own connections only.
    pub own_h1: bool,
    pub connect_timeout: Duration,
    pub meter: &'a crate::metrics::meter::Meter,
}

#[allow(clippy::too_many_arguments)]
/// Sends one attempt to an endpoint the balancer picks (left in `picked` for its
/// outcome). Over HTTP/1.1, on a lease from the worker's pool
/// (`upstream::pool`): the one this client connection holds to that
/// endpoint, else a new one it keeps (up to the upstream's cap of held
/// connections), else one for this request. An upgrade gets a connection of
/// its own, never pooled. Over HTTP/2, on the endpoint's HTTP/2 pool. An
/// `auto` endpoint over TLS not dialled yet is dialled here, and its ALPN
/// answer decides (an `h2` connection goes to its HTTP/2 pool).
pub(crate) async fn send(
    up: &CheckoutFor<'_>,
    conn: &ConnCtx,
    mut req: Request<Body>,
    upgrade: bool,
    avoid: &mut Vec<Address>,
    picked: &mut Option<Picked>,
    seen: &(dyn Fn(Address) + Sync),
) -> Result<Response<UpstreamBody>, SendError> {
    let publish = |p: &Picked| seen(p.addr());
    if !up.endpoints.ready() {
        // A name not resolved yet: the attempt waits for the resolver.
        let until = Instant::now() + up.connect_timeout;
        let resolved = up.endpoints.first_resolved(until).await;
        resolved.map_err(|why| SendError::new(Failure::Connect, why))?;
    }
    // What the endpoint speaks: an upstream of HTTP/1.1 only needs no look
    // at it.
    if !up.own_h1 {
        let no_endpoint = || SendError::new(Failure::Connect, "the upstream has no endpoint");
        let p = up.endpoints.pick(avoid).ok_or_else(no_endpoint)?;
        let client = p.endpoint.client();
        // An `auto` endpoint that chose `h2` but has no connection with
        // room dials below: what it answers now decides, in this attempt.
        if client.speaks() == Speaks::H2 && (!client.is_auto() || client.h2_has_room()) {
            publish(&p);
            *picked = Some(p);
            return client.send(req).await.map(|r| r.map(UpstreamBody::from));
        }
        // `auto` over TLS, not dialled yet or HTTP/1.1: a lease, dialled
        // with the upstream's ALPN.
        *picked = Some(p);
    }
    enum Got {
        /// A connection for weir's own HTTP/1.1 client.
        Own(super::pool::UpstreamIo),
        Held(H1Lease, held::Place),
        Once(H1Lease),
        /// An `auto` endpoint chose `h2`: its HTTP/2 pool has the connection.
        H2(Arc<UpstreamClient>),
    }
    // `auto` over TLS: the endpoint dialled says by ALPN what it speaks.
    let auto = !up.own_h1;
    let tls = match auto {
        true => up.client.tls.as_deref(),
        false => up.client.fast_tls.as_deref(),
    };
    let tag = tls.map_or(0, |t| t.tag);
    let id = up.reach as *const UpstreamReach as usize;
    let places = &up.reach.held_conns;
    // weir's own HTTP/1.1 client, for the requests the request side marked.
    let own = up.own_h1 && !upgrade && req.extensions().get::<http1::OwnHttp1>().is_some();
    let got = super::connect_any(
        up.endpoints,
        avoid,
        Instant::now(),
        picked,
        |addr| async move {
            if !upgrade && !own {
                if let Some((lease, place)) = conn.take(id, addr) {
                    return Ok(Got::Held(lease, place));
                }
            }
            let io = match conn.pool().take(addr, tag, Instant::now()) {
                Some(io) => io,
                // Boxed: a dial (connect, TLS, perhaps an HTTP/2 handshake)
                // is most of this future, and the attempt's future, boxed
                // once per request, would carry it inline.
                None => match Box::pin(fresh(up, addr, tls, auto)).await? {
                    Fresh::Io(io) => io,
                    Fresh::H2(client) => return Ok(Got::H2(client)),
                },
            };
            if own {
                return Ok(Got::Own(io));
            }
            if upgrade {
                return Ok(Got::Once(H1Lease::upgradable(io).await?));
            }
            let lease = H1Lease::over(io, conn.pool(), addr, tag).await?;
            Ok(match held::reserve(places) {
                Some(place) => Got::Held(lease, place),
                None => Got::Once(lease),
            })
        },
    )
    .await?;
    let no_endpoint = || SendError::new(Failure::Connect, "the upstream has no endpoint");
    let p = picked.as_ref().ok_or_else(no_endpoint)?;
    publish(p);
    if let Got::H2(client) = &got {
        return client.send(req).await.map(|r| r.map(UpstreamBody::from));
    }
    let addr = p.addr();
    // A connection of our own (always HTTP/1.1) takes the origin form of the
    // target and the authority as Host, as the shared pool's client does.
    if let Some(a) = req.uri().authority() {
        if let Ok(h) = http::HeaderValue::from_str(a.as_str()) {
            req.headers_mut().entry(http::header::HOST).or_insert(h);
        }
    }
    if let Some(pq) = req.uri().path_and_query().cloned() {
        *req.uri_mut() = http::Uri::from(pq);
    }
    name_te(req.headers_mut());
    match got {
        Got::Own(io) => {
            let back = http1::GiveBack {
                pool: Arc::downgrade(conn.pool()),
                addr,
                tag,
            };
            http1::send(io, back, req)
                .await
                .map(|r| r.map(UpstreamBody::from))
        }
        Got::Held(mut lease, place) => {
            let resp = lease.send(req).await?;
            conn.keep(id, addr, lease, place);
            Ok(resp.map(UpstreamBody::from))
        }
        // Given back when dropped: its connection returns to the pool once
        // the response has ended.
        Got::Once(mut lease) => lease.send(req).await.map(|r| r.map(UpstreamBody::from)),
        Got::H2(_) => Err(no_endpoint()),
    }
}

/// The fast path's checkout: a raw HTTP/1.1 connection (cleartext, a
/// socket or weir's own TLS) to an endpoint the balancer picks, left in
/// `picked` for the attempt's outcome and published to `seen` as soon as
/// it is picked (a hedge launched while this one connects goes elsewhere).
/// In two steps, so that the common case is no future at all: [`idle`]
/// picks and takes an idle connection from `pool`; when there is none,
/// [`dial`] opens one, and an endpoint that refuses is reported and
/// another tried.
pub(crate) fn idle(
    up: &CheckoutFor<'_>,
    pool: &super::pool::H1Pool,
    now: Instant,
    avoid: &[Address],
    picked: &mut Option<Picked>,
    seen: Option<&(dyn Fn(Address) + Sync)>,
) -> Result<Option<(super::pool::UpstreamIo, Address)>, SendError> {
    let tag = up.client.fast_tls.as_deref().map_or(0, |t| t.tag);
    let Some(first) = up.endpoints.pick(avoid) else {
        return Err(SendError::new(Failure::Connect, NO_ENDPOINT_YET));
    };
    let at = first.addr();
    *picked = Some(first);
    if let Some(seen) = seen {
        seen(at);
    }
    Ok(pool.take(at, tag, now).map(|io| (io, at)))
}

/// The second step of the fast path's checkout (see [`idle`]): a new
/// connection to the endpoint in `picked`, or to the next one when it
/// refuses.
pub(crate) async fn dial(
    up: &CheckoutFor<'_>,
    now: Instant,
    avoid: &mut Vec<Address>,
    picked: &mut Option<Picked>,
    seen: Option<&(dyn Fn(Address) + Sync)>,
) -> Result<(super::pool::UpstreamIo, Address), SendError> {
    let tls = up.client.fast_tls.as_deref();
    let at = picked.as_ref().map(Picked::addr);
    let connect = |addr| open_logged(up, addr, tls);
    let io = super::connect_any(up.endpoints, avoid, now, picked, connect).await?;
    let addr = picked
        .as_ref()
        .map(Picked::addr)
        .ok_or_else(|| SendError::new(Failure::Connect, NO_ENDPOINT_YET))?;
    if let Some(seen) = seen.filter(|_| Some(addr) != at) {
        seen(addr);
    }
    Ok((io, addr))
}

const NO_ENDPOINT_YET: &str = "the upstream has no endpoint yet";

/// A new connection to `addr` from the one dialler; a TLS failure is
/// logged once per cause for the upstream.
async fn open_logged(
    up: &CheckoutFor<'_>,
    addr: Address,
    tls: Option<&super::pool::io::FastTls>,
) -> Result<super::pool::UpstreamIo, SendError> {
    let opened = super::pool::open(addr, up.connect_timeout, tls, up.meter).await;
    if let Err(e) = &opened {
        if e.tls {
            up.reach.log_tls_failure_once(&e.message);
        }
    }
    opened
}

/// A connection dialled for an attempt.
enum Fresh {
    /// To lease as HTTP/1.1.
    Io(super::pool::UpstreamIo),
    /// An `auto` endpoint chose `h2`: its HTTP/2 pool has the connection.
    H2(Arc<UpstreamClient>),
}

/// Dials `addr` (with `tls`, if any); an `auto` endpoint learns by ALPN
/// what it speaks from now on, and a connection that chose `h2` joins its
/// HTTP/2 pool, never the HTTP/1.1 one.
async fn fresh(
    up: &CheckoutFor<'_>,
    addr: Address,
    tls: Option<&super::pool::io::FastTls>,
    auto: bool,
) -> Result<Fresh, SendError> {
    let io = open_logged(up, addr, tls).await?;
    if !auto {
        return Ok(Fresh::Io(io));
    }
    let client = up.endpoints.client_of(addr);
    let h2 = io.chose_h2();
    if let Some(c) = &client {
        c.learn(h2);
    }
    if !h2 {
        return Ok(Fresh::Io(io));
    }
    let gone = || SendError::new(Failure::NotSent, "the endpoint went away");
    let client = client.ok_or_else(gone)?;
    client.adopt(io).await?;
    Ok(Fresh::H2(client))
}

/// `TE` is hop-by-hop: an HTTP/1.1 request that carries it (`TE: trailers`,
/// the one value weir forwards) names it in `Connection` too (RFC 9110
/// §10.1.4), beside whatever `Connection` already says (`upgrade`).
/// HTTP/2 has no `Connection`: only the HTTP/1.1 sends call this
/// (docs/reference/routing.md#header-hygiene).
fn name_te(h: &mut http::HeaderMap) {
    use http::header::{CONNECTION, TE};
    let named = h
        .get_all(CONNECTION)
        .iter()
        .any(|v| crate::h1::has_token(v.as_bytes(), b"te"));
    if h.contains_key(TE) && !named {
        h.append(CONNECTION, http::HeaderValue::from_static("te"));
    }
}
