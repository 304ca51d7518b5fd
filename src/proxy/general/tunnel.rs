//! `CONNECT` tunnels. weir is not an open proxy: a `CONNECT` is never
//! forwarded upstream, and a tunnel goes only to a configured address.
//!
//! A `CONNECT host:port` routed (by its host, as any request) to an upstream
//! with `tunnel = true` opens a TCP connection to that upstream's own address
//! (its `url`'s host and port, whatever port the client named) and joins it
//! to the client's connection once weir has answered 200. The pipeline is the
//! request pipeline's: the rate limit and the concurrency gate admit it (the
//! slot is held for the tunnel's whole life), the breaker admits each
//! connect, and a refused or timed-out connect is retried under the upstream's
//! retry policy like any connect failure (nothing was sent). Once joined, the
//! bytes are the client's business: no retries, no timeouts but the
//! upstream's `idle_timeout` between bytes either way. Open tunnels are counted
//! in `weir_tunnels_open`.
//!
//! Any other `CONNECT` gets 405 `connect_not_allowed`.

use crate::policy::{BodyFacts, Outcome, RequestFacts};
use crate::proxy::attempt::{self, Annotations, Attempted, Attempts};
use crate::proxy::body::{empty, Body};
use crate::proxy::error::ProxyError;
use crate::proxy::idempotent::Recorder;
use crate::proxy::order::{self, Codec};
use crate::proxy::Upstream;
use crate::state::gate::Slot;
use http::request::Parts;
use http::{Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Connects to `up` and answers 200, joining the two connections once hyper
/// hands over the client's; or weir's error after the retries. Served in
/// the one order of every request (`proxy::order`); with the attempts made.
pub(crate) async fn open(
    up: &Upstream,
    mut parts: Parts,
    key: Option<&str>,
    start: Instant,
) -> (Result<Response<Body>, ProxyError>, u32) {
    let cfg = &up.config;
    let Some(client) = parts.extensions.remove::<OnUpgrade>() else {
        let e = ProxyError::BadRequest("this connection cannot carry a CONNECT tunnel".into());
        return (Err(e), 0);
    };
    let mut tunnel = Tunnel {
        connect: Connect {
            target: (
                cfg.url.host.trim_matches(['[', ']']).to_string(),
                cfg.url.port,
            ),
            connect_timeout: cfg.connect_timeout,
        },
    };
    order::serve(up, &mut tunnel, client, start, key).await
}

/// A CONNECT as the order serves it: no body, never a keyed write; its
/// attempts are connects, and its answer joins the two connections. The
/// request it carries is the client's connection, once hyper hands it over.
struct Tunnel {
    connect: Connect,
}

/// weir's error or the tunnel's 200, with the attempts made.
type Opened = (Result<Response<Body>, ProxyError>, u32);

impl Codec for Tunnel {
    type Out = Opened;
    /// The connection to the upstream, and the client's to join it to.
    type Response = (TcpStream, OnUpgrade);
    type Arrived = OnUpgrade;
    type Ready = OnUpgrade;

    async fn body(
        &mut self,
        _: &Upstream,
        client: OnUpgrade,
        _: &mut crate::proxy::upload::Upload,
    ) -> Result<(OnUpgrade, bool), Opened> {
        // No body: the tunnel's bytes follow the 200.
        Ok((client, false))
    }

    fn facts(&self, _: &OnUpgrade) -> RequestFacts {
        RequestFacts::new("CONNECT", false, BodyFacts::Empty)
    }

    async fn drive(
        &mut self,
        _: &Upstream,
        client: OnUpgrade,
        attempts: &mut Attempts<'_>,
        _t0: Instant,
        _detached: bool,
    ) -> Option<Attempted<(TcpStream, OnUpgrade)>> {
        // The same attempt driver as every request's: a connect that fails
        // is judged, backed off and retried as any connect failure.
        let driven = attempt::drive(attempts, &mut self.connect, None).await?;
        Some(Attempted {
            result: driven.result.map(|upstream| (upstream, client)),
            stop: driven.stop,
            ended: driven.ended,
            last_failed: None,
        })
    }

    async fn refuse(
        &mut self,
        _: &Upstream,
        error: ProxyError,
        spent: Option<Annotations>,
        _: Option<crate::upstream::Address>,
    ) -> Opened {
        (Err(error), spent.map_or(0, |s| s.attempts))
    }

    fn gone(&mut self) -> Opened {
        (Err(ProxyError::DeadlineExceeded), 0)
    }

    async fn answer(
        &mut self,
        up: &Upstream,
        attempted: Attempted<(TcpStream, OnUpgrade)>,
        spent: Annotations,
        _: Option<Recorder>,
        slot: Slot,
    ) -> Opened {
        let (upstream, client) = match attempted.result {
            Ok(joined) => joined,
            Err(e) => return (Err(e), spent.attempts),
        };
        let _ = upstream.set_nodelay(true);
        join(up, client, upstream, slot);
        let mut resp = Response::new(empty());
        *resp.status_mut() = StatusCode::OK;
        (Ok(resp), spent.attempts)
    }
}

/// A tunnel's attempts: each a TCP connect to the upstream's own address,
/// within the attempt's deadline and `connect_timeout`.
struct Connect {
    target: (String, u16),
    connect_timeout: Duration,
}

impl attempt::Watch for Connect {
    // hyper drops the request's future when its client goes away.
    async fn unless_gone<F: std::future::Future>(&mut self, f: F) -> Option<F::Output> {
        Some(f.await)
    }
}

impl attempt::Transport for Connect {
    type Response = TcpStream;

    async fn attempt(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
    ) -> Option<(Outcome, Result<TcpStream, ProxyError>)> {
        let give_up = try_deadline.min(started + self.connect_timeout);
        let connected = crate::upstream::pool::tunnel(&self.target, give_up).await;
        let error = match connected {
            Ok(Some(upstream)) => {
                let ok = Outcome::Response {
                    status: 200,
                    retry_after: None,
                    grpc_status: None,
                    pushback: None,
                };
                return Some((ok, Ok(upstream)));
            }
            Err(e) => ProxyError::ConnectFailed(e.to_string()),
            Ok(None) if give_up >= deadline => ProxyError::DeadlineExceeded,
            Ok(None) => ProxyError::ConnectFailed(format!(
                "connect timed out after {:?}",
                Instant::now().saturating_duration_since(started)
            )),
        };
        // Every failure before the connection is up is a connect failure:
        // safe to retry whatever the method.
        Some((Outcome::ConnectFailure, Err(error)))
    }

    /// A `CONNECT` is never hedged (it is not replayable): one attempt.
    async fn attempt_hedged(
        &mut self,
        started: Instant,
        try_deadline: Instant,
        deadline: Instant,
        _hedging: attempt::Hedging<'_>,
    ) -> Option<attempt::Raced<TcpStream>> {
        let (outcome, result) = self.attempt(started, try_deadline, deadline).await?;
        Some(attempt::Raced {
            outcome,
            result,
            started,
            hedge: None,
        })
    }

    fn discard(&mut self, _response: Result<TcpStream, ProxyError>) {}
}

/// Joins the client's upgraded connection and the upstream's in the
/// background, holding the concurrency slot and the open-tunnel gauge until
/// either side closes or nothing moves for `idle_timeout`.
fn join(up: &Upstream, client: OnUpgrade, upstream: TcpStream, slot: Slot) {
    let name = up.config.name.clone();
    let idle = up.config.idle_timeout;
    let gauge = up.state.metrics.tunnels().clone();
    tokio::spawn(async move {
        let _slot = slot;
        let client = match client.await {
            Ok(c) => TokioIo::new(c),
            Err(e) => {
                tracing::debug!(upstream = %name, error = %e, "CONNECT: the client's connection was not handed over");
                return;
            }
        };
        gauge.inc();
        let (up_bytes, down_bytes, why) = copy_until_idle(client, upstream, idle).await;
        gauge.dec();
        tracing::debug!(upstream = %name, bytes_up = up_bytes, bytes_down = down_bytes, why, "tunnel closed");
    });
}

/// Copies both ways until either side closes, an error, or `idle` passes
/// with no byte in either direction.
async fn copy_until_idle<A, B>(a: A, b: B, idle: Duration) -> (u64, u64, &'static str)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let (mut up, mut down) = (0u64, 0u64);
    let mut abuf = vec![0u8; 16 * 1024];
    let mut bbuf = vec![0u8; 16 * 1024];
    let (mut a_open, mut b_open) = (true, true);
    let mut last = Instant::now();
    while a_open || b_open {
        let quiet = last + idle;
        tokio::select! {
            r = ar.read(&mut abuf), if a_open => match r {
                Ok(0) | Err(_) => { a_open = false; let _ = bw.shutdown().await; }
                Ok(n) => {
                    if bw.write_all(&abuf[..n]).await.is_err() { return (up, down, "upstream write failed"); }
                    up += n as u64;
                    last = Instant::now();
                }
            },
            r = br.read(&mut bbuf), if b_open => match r {
                Ok(0) | Err(_) => { b_open = false; let _ = aw.shutdown().await; }
                Ok(n) => {
                    if aw.write_all(&bbuf[..n]).await.is_err() { return (up, down, "client write failed"); }
                    down += n as u64;
                    last = Instant::now();
                }
            },
            () = tokio::time::sleep_until(quiet) => return (up, down, "idle_timeout"),
        }
    }
    (up, down, "closed")
}
