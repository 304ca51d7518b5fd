//! The admin listener (docs/reference/admin.md#admin-listener): `GET /metrics`, `/healthz`, `/readyz`,
//! `/config`, `POST /reload`, and the status page, `GET /` (or `/status`)
//! and `/status.json` (docs/reference/admin.md#status-page, served by
//! `status`). One rule ([`LOOPBACK_ONLY`], [`refusal`]): every endpoint but
//! `/metrics`, `/healthz` and `/readyz` answers loopback peers only,
//! whatever address the listener binds — the effective config and the
//! status page name every upstream and its target, and a reload is a write
//! — and only requests that name a loopback host. The peer's socket
//! address decides who the peer is, never its `Host`.

pub mod reload;
pub mod status;

use crate::admin::reload::Reloader;
use crate::proxy::body::{full, Body};
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Whether `ip` is a loopback address (IPv4-mapped IPv6 included).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Whether a request to a loopback-only endpoint names a loopback host: a
/// browser on this machine tricked into calling weir (DNS rebinding: a
/// foreign name that resolves to 127.0.0.1) sends that foreign name as
/// `Host`, and a cross-origin page sends its `Origin`. Either is refused,
/// and so is an absolute-form target with a foreign authority (judged as
/// `Host` is) and a request with two `Host` or two `Origin` fields (which
/// one would a proxy in front have judged?); a request without `Host` (not
/// a browser's) is let through.
fn names_loopback<B>(req: &Request<B>) -> bool {
    let loopback_host = |authority: &str| {
        let host = crate::proxy::route::host_of(authority);
        host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(is_loopback)
    };
    // The one value of a field; `Err` when it comes twice.
    let one = |name: header::HeaderName| {
        let mut all = req.headers().get_all(name).into_iter();
        let first = all.next();
        match all.next() {
            Some(_) => Err(()),
            None => Ok(first),
        }
    };
    let (Ok(host), Ok(origin)) = (one(header::HOST), one(header::ORIGIN)) else {
        return false;
    };
    let target_ok = req
        .uri()
        .authority()
        .is_none_or(|a| loopback_host(a.as_str()));
    let host_ok = host.is_none_or(|h| h.to_str().is_ok_and(loopback_host));
    let origin_ok = origin.is_none_or(|o| {
        o.to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .is_some_and(|(_, authority)| loopback_host(authority))
    });
    target_ok && host_ok && origin_ok
}

/// The endpoints only a loopback peer may ask, whatever the method (a
/// wrong one from a loopback peer gets its 405): everything but
/// `/metrics`, `/healthz` and `/readyz`, which kubelet probes and
/// Prometheus reach from outside the pod.
const LOOPBACK_ONLY: [&str; 5] = ["/", "/status", "/status.json", "/config", "/reload"];

/// The endpoints any peer may ask.
const OPEN: [&str; 3] = ["/metrics", "/healthz", "/readyz"];

/// The 403 a request to a [`LOOPBACK_ONLY`] endpoint gets, or `None`: one
/// rule for all of them. A peer whose socket address is not loopback is
/// refused whatever it sends (its `Host` says what it asked for, not who it
/// is); a loopback peer is refused when its request names a foreign host
/// or origin ([`names_loopback`]).
fn refusal<B>(peer: SocketAddr, req: &Request<B>) -> Option<Response<Body>> {
    if !LOOPBACK_ONLY.contains(&req.uri().path()) {
        return None;
    }
    if !is_loopback(peer.ip()) {
        return Some(text(
            StatusCode::FORBIDDEN,
            "this endpoint answers loopback clients only\n",
        ));
    }
    if !names_loopback(req) {
        return Some(text(
            StatusCode::FORBIDDEN,
            "this endpoint answers requests to a loopback host only, without a foreign Origin\n",
        ));
    }
    None
}

/// Where the admin endpoints listen: a TCP address, or a socket file
/// (`admin = "unix:/path"`, removed when the listener closes).
#[derive(Debug)]
pub struct AdminListener(Listener);

#[derive(Debug)]
enum Listener {
    Tcp(TcpListener),
    Unix(
        tokio::net::UnixListener,
        crate::proxy::listen_unix::SocketFile,
    ),
}

impl AdminListener {
    /// Listens on `at` (a socket file with `mode`).
    pub async fn bind(at: crate::address::Address, mode: u32) -> std::io::Result<AdminListener> {
        use crate::address::Address;
        match at {
            Address::Tcp(a) => TcpListener::bind(a)
                .await
                .map(|l| AdminListener(Listener::Tcp(l)))
                .map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot listen on {a} (admin): {e}"))
                }),
            Address::Unix(path) => {
                let (l, file) = crate::proxy::listen_unix::bind(path, mode)?;
                let l = tokio::net::UnixListener::from_std(l)?;
                Ok(AdminListener(Listener::Unix(l, file)))
            }
        }
    }

    /// What it is bound to (a TCP port 0 resolved).
    pub fn local(&self) -> std::io::Result<crate::address::Address> {
        match &self.0 {
            Listener::Tcp(l) => l.local_addr().map(crate::address::Address::Tcp),
            Listener::Unix(_, f) => Ok(crate::address::Address::unix(f.path())),
        }
    }
}

/// A client of the admin socket file: local by construction (the file's
/// mode decided who may connect), so taken for loopback.
const SOCKET_PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// Serves the admin endpoints until `stop` is set.
pub async fn serve(
    listener: AdminListener,
    reloader: Arc<Reloader>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(crate::admin::status::sample(
        reloader.proxy().clone(),
        stop.clone(),
    ));
    loop {
        let accepted = tokio::select! {
            a = accept(&listener) => a,
            _ = crate::shutdown::stopped(&mut stop) => break,
        };
        let Some(accepted) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let reloader = reloader.clone();
        match accepted {
            (Accepted::Tcp(s), peer) => tokio::spawn(connection(s, peer, reloader)),
            (Accepted::Unix(s), peer) => tokio::spawn(connection(s, peer, reloader)),
        };
    }
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(listener: &AdminListener) -> Option<(Accepted, SocketAddr)> {
    match &listener.0 {
        Listener::Tcp(l) => l.accept().await.ok().map(|(s, p)| (Accepted::Tcp(s), p)),
        Listener::Unix(l, _) => l
            .accept()
            .await
            .ok()
            .map(|(s, _)| (Accepted::Unix(s), SOCKET_PEER)),
    }
}

async fn connection<S>(stream: S, peer: SocketAddr, reloader: Arc<Reloader>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let reloader = reloader.clone();
        async move { Ok::<_, Infallible>(route(&reloader, peer, req).await) }
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10));
    let _ = b.serve_connection(TokioIo::new(stream), svc).await;
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(full(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// One admin request (no endpoint reads a request body).
pub async fn route<B>(reloader: &Reloader, peer: SocketAddr, req: Request<B>) -> Response<Body> {
    if let Some(refused) = refusal(peer, &req) {
        return refused;
    }
    let proxy = reloader.proxy();
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let snap = proxy.snapshot();
            for u in &snap.upstreams {
                u.refresh_gauges();
            }
            let mut r = text(StatusCode::OK, snap.metrics.render());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        (&Method::GET, "/" | "/status") => crate::admin::status::page(),
        (&Method::GET, "/status.json") => crate::admin::status::json(reloader),
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => {
            // The shared state's health is told, never a reason for 503:
            // without it weir decides with local state.
            let fleet = proxy.fleet().map(|f| f.status_line() + "\n");
            if proxy.draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
            } else {
                text(
                    StatusCode::OK,
                    format!("ready\n{}", fleet.unwrap_or_default()),
                )
            }
        }
        (&Method::GET, "/config") => {
            let mut r = text(StatusCode::OK, proxy.snapshot().config.effective_toml());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/toml"),
            );
            r
        }
        (&Method::POST, "/reload") => match reloader.reload("admin").await {
            Ok(()) => text(StatusCode::OK, "reloaded\n"),
            Err(e) => text(StatusCode::UNPROCESSABLE_ENTITY, format!("{e}\n")),
        },
        (_, path) if LOOPBACK_ONLY.contains(&path) || OPEN.contains(&path) => {
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "admin endpoints: GET / /status /status.json /metrics /healthz /readyz /config, POST /reload\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_peers_are_loopback() {
        let yes = ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"];
        let no = [
            "10.0.0.5",
            "192.168.1.2",
            "0.0.0.0",
            "::",
            "::ffff:10.0.0.1",
            "2001:db8::1",
        ];
        for a in yes {
            assert!(
                is_loopback(a.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))),
                "{a}"
            );
        }
        for a in no {
            assert!(
                !is_loopback(a.parse().unwrap_or(IpAddr::from([127, 0, 0, 1]))),
                "{a}"
            );
        }
    }
}
