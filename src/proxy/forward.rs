//! The path of one request: route → deadline → build the upstream request →
//! attempt → response hygiene. Policy (retries, breaker, limits) slots in at
//! `attempt`; nothing here decides policy by itself.

use super::body::{boxed, Body, IdleTimeout};
use super::error::ProxyError;
use super::headers;
use super::route::{prefix_matches, request_host};
use super::{ListenerRole, Snapshot, Upstream};
use http::header::{self, HeaderValue};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use std::time::Duration;
use tokio::time::Instant;

/// Serves one request from a client.
pub async fn handle(
    snap: &Snapshot,
    role: &ListenerRole,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    if parts.uri.path() == super::guard::CONFLICT_PATH {
        return ProxyError::BadRequest(
            "a request may not carry both Content-Length and Transfer-Encoding".into(),
        )
        .to_response(None);
    }
    let upstream = match role {
        ListenerRole::Shared => request_host(&parts)
            .and_then(|h| snap.routes.lookup(h, parts.uri.path()))
            .and_then(|i| snap.upstreams.get(i)),
        ListenerRole::Dedicated(name) => snap.upstreams.iter().find(|u| &u.config.name == name),
    };
    let Some(up) = upstream else {
        return ProxyError::NoRoute.to_response(None);
    };
    let name = up.config.name.as_str();
    match forward(up, parts, body).await {
        Ok(resp) => resp,
        Err(e) => e.to_response(Some(name)),
    }
}

async fn forward(
    up: &Upstream,
    mut parts: http::request::Parts,
    body: Incoming,
) -> Result<Response<Body>, ProxyError> {
    let cfg = &up.config;
    let start = Instant::now();
    let lowered = headers::weir_timeout(&parts.headers).map_err(ProxyError::BadRequest)?;
    let grpc = headers::grpc_timeout(&parts.headers);
    // A request may lower its deadline, never raise it.
    let budget = [Some(cfg.timeout), lowered, grpc]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(cfg.timeout);
    let deadline = start + budget;

    let uri = upstream_uri(up, &parts.uri)?;
    let host = if cfg.preserve_host {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .or_else(|| parts.headers.get(header::HOST).cloned())
    } else {
        HeaderValue::from_str(cfg.url.authority.as_str()).ok()
    };
    headers::strip_hop_by_hop(&mut parts.headers, true);
    if let Some(h) = host {
        parts.headers.insert(header::HOST, h);
    }
    if grpc.is_some() {
        let left = deadline.saturating_duration_since(Instant::now());
        parts
            .headers
            .insert("grpc-timeout", headers::grpc_timeout_value(left));
    }
    let mut out = Request::new(boxed(body));
    *out.method_mut() = parts.method;
    *out.uri_mut() = uri;
    *out.headers_mut() = parts.headers;
    *out.version_mut() = if up.h2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };

    let resp = attempt(up, out, deadline).await?;
    let (mut rparts, rbody) = resp.into_parts();
    headers::strip_hop_by_hop(&mut rparts.headers, false);
    // hyper answers in the client's protocol; an HTTP/1.0 upstream must not
    // downgrade the client's connection.
    rparts.version = Version::HTTP_11;
    if cfg.annotate {
        rparts
            .headers
            .insert("x-weir-attempts", HeaderValue::from_static("1"));
    }
    let body = IdleTimeout::new(rbody, cfg.idle_timeout);
    Ok(Response::from_parts(rparts, boxed(body)))
}

/// One attempt, bounded by the per-try timeout and the request deadline.
async fn attempt(
    up: &Upstream,
    req: Request<Body>,
    deadline: Instant,
) -> Result<Response<Incoming>, ProxyError> {
    let now = Instant::now();
    let try_deadline = up
        .config
        .per_try_timeout
        .map(|p| (now + p).min(deadline))
        .unwrap_or(deadline);
    match tokio::time::timeout_at(try_deadline, up.state.client.send(req)).await {
        Ok(r) => r,
        Err(_) if try_deadline < deadline => Err(ProxyError::UpstreamTimeout),
        Err(_) => Err(ProxyError::DeadlineExceeded),
    }
}

/// Maps the client's target onto the upstream: `strip_prefix`, then the
/// upstream URL's base path; the query is kept as sent.
fn upstream_uri(up: &Upstream, original: &Uri) -> Result<Uri, ProxyError> {
    let cfg = &up.config;
    let path = original.path();
    let mut rest = path;
    if cfg.strip_prefix && cfg.path_prefix != "/" && prefix_matches(&cfg.path_prefix, path) {
        rest = &path[cfg.path_prefix.len()..];
    }
    let mut pq = String::with_capacity(cfg.url.base_path.len() + rest.len() + 16);
    pq.push_str(&cfg.url.base_path);
    if !rest.starts_with('/') {
        pq.push('/');
    }
    pq.push_str(rest);
    if let Some(q) = original.query() {
        pq.push('?');
        pq.push_str(q);
    }
    Uri::builder()
        .scheme(up.scheme.clone())
        .authority(cfg.url.authority.clone())
        .path_and_query(pq)
        .build()
        .map_err(|e| {
            ProxyError::BadRequest(format!(
                "cannot map the request target onto the upstream: {e}"
            ))
        })
}

/// Remaining time until `deadline`, zero if passed.
pub fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
