//! weir's own error responses (docs/reference/responses.md#error-responses). One enum; each variant knows its
//! status, its `x-weir-error` code and its metric label in one `match`.

use super::body::{full, Body};
use http::{header, HeaderValue, Response, StatusCode};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("no upstream is configured for this host and path")]
    NoRoute,
    #[error("{0}")]
    BadRequest(String),
    #[error("the request head is larger than max_header_bytes ({0} bytes)")]
    HeadTooLarge(usize),
    #[error(
        "CONNECT is not allowed here: weir opens a tunnel only to an upstream with `tunnel = true`"
    )]
    ConnectNotAllowed,
    #[error("the upstream's rate limit is exhausted")]
    RateLimited { retry_after: Option<Duration> },
    #[error("too many requests are in flight to this upstream")]
    Overloaded,
    #[error("the upstream's circuit breaker is open after repeated failures")]
    CircuitOpen { retry_after: Option<Duration> },
    #[error("could not connect to the upstream: {0}")]
    ConnectFailed(String),
    /// An HTTP/2 stream the upstream did not process (above its GOAWAY's
    /// last stream id, or reset with `REFUSED_STREAM`): safe to send
    /// again elsewhere, and not replayed (docs/reference/protocols.md#http2-refused-streams).
    #[error("the upstream refused the request unprocessed (HTTP/2 GOAWAY or REFUSED_STREAM); it is safe to send again: {0}")]
    RefusedStream(String),
    #[error("the upstream closed or reset the connection before answering: {0}")]
    UpstreamReset(String),
    #[error("the upstream did not answer within the per-try timeout")]
    UpstreamTimeout,
    #[error("the request's deadline passed before the upstream answered")]
    DeadlineExceeded,
    #[error("the upstream's response is not valid HTTP: {0}")]
    BadResponse(String),
    #[error("a request with this idempotency key is in flight; try again when it has finished")]
    IdempotencyInFlight,
    #[error("this idempotency key was used for a different request (method, target or body)")]
    IdempotencyKeyReused,
    #[error("the request with this idempotency key was completed, but its response was not kept to replay")]
    IdempotencyNotReplayable,
    /// A keyed write the fleet's store could not guard, with `[state]
    /// on_unavailable = "refuse"` (docs/reference/fleet.md#when-redis-fails).
    #[error("the shared idempotency store cannot guard this keyed write now (no primary, or its replicas did not acknowledge); nothing was sent upstream: try again")]
    StateUnavailable,
}

impl From<crate::state::gate::GateRefusal> for ProxyError {
    fn from(r: crate::state::gate::GateRefusal) -> Self {
        match r {
            crate::state::gate::GateRefusal::Full => ProxyError::Overloaded,
            crate::state::gate::GateRefusal::Deadline => ProxyError::DeadlineExceeded,
        }
    }
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::HeadTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::ConnectNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::Overloaded
            | ProxyError::CircuitOpen { .. }
            | ProxyError::StateUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::ConnectFailed(_)
            | ProxyError::RefusedStream(_)
            | ProxyError::UpstreamReset(_)
            | ProxyError::BadResponse(_) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout | ProxyError::DeadlineExceeded => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::IdempotencyInFlight | ProxyError::IdempotencyNotReplayable => {
                StatusCode::CONFLICT
            }
            ProxyError::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }

    /// The `x-weir-error` value, the JSON `error` field and the metric label.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "no_route",
            ProxyError::BadRequest(_) => "bad_request",
            ProxyError::HeadTooLarge(_) => "header_too_large",
            ProxyError::ConnectNotAllowed => "connect_not_allowed",
            ProxyError::RateLimited { .. } => "rate_limited",
            ProxyError::Overloaded => "overloaded",
            ProxyError::CircuitOpen { .. } => "circuit_open",
            ProxyError::ConnectFailed(_) => "connect_failed",
            ProxyError::RefusedStream(_) => "refused_stream",
            ProxyError::UpstreamReset(_) => "upstream_reset",
            ProxyError::UpstreamTimeout => "upstream_timeout",
            ProxyError::DeadlineExceeded => "deadline_exceeded",
            ProxyError::BadResponse(_) => "bad_response",
            ProxyError::IdempotencyInFlight => "idempotency_in_flight",
            ProxyError::IdempotencyKeyReused => "idempotency_key_reused",
            ProxyError::IdempotencyNotReplayable => "idempotency_not_replayable",
            ProxyError::StateUnavailable => "state_unavailable",
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProxyError::RateLimited { retry_after } | ProxyError::CircuitOpen { retry_after } => {
                *retry_after
            }
            // The first request is likely done within a second.
            ProxyError::IdempotencyInFlight => Some(Duration::from_secs(1)),
            // A failover is over in seconds; a replica's lag in less.
            ProxyError::StateUnavailable => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// The gRPC status a gRPC client gets for this error.
    pub fn grpc_status(&self) -> u8 {
        match self {
            ProxyError::NoRoute => 12,           // UNIMPLEMENTED
            ProxyError::BadRequest(_) => 3,      // INVALID_ARGUMENT
            ProxyError::HeadTooLarge(_) => 8,    // RESOURCE_EXHAUSTED, as gRPC's own metadata limit
            ProxyError::ConnectNotAllowed => 12, // UNIMPLEMENTED
            ProxyError::RateLimited { .. } => 8, // RESOURCE_EXHAUSTED
            ProxyError::UpstreamTimeout | ProxyError::DeadlineExceeded => 4, // DEADLINE_EXCEEDED
            ProxyError::Overloaded
            | ProxyError::CircuitOpen { .. }
            | ProxyError::ConnectFailed(_)
            | ProxyError::RefusedStream(_)
            | ProxyError::UpstreamReset(_)
            | ProxyError::BadResponse(_) => 14, // UNAVAILABLE
            ProxyError::IdempotencyInFlight => 10, // ABORTED
            ProxyError::IdempotencyKeyReused => 3, // INVALID_ARGUMENT
            ProxyError::IdempotencyNotReplayable => 6, // ALREADY_EXISTS
            ProxyError::StateUnavailable => 14,  // UNAVAILABLE: nothing was sent
        }
    }

    /// The response weir sends for this error: gRPC-shaped for a gRPC
    /// request (HTTP 200, trailers-only, `grpc-status`, `grpc-message`),
    /// JSON otherwise.
    pub fn respond(&self, upstream: Option<&str>, grpc: bool) -> Response<Body> {
        if !grpc {
            return self.to_response(upstream);
        }
        let mut resp = Response::new(super::body::empty());
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert(
            "grpc-status",
            HeaderValue::from(u16::from(self.grpc_status())),
        );
        let msg = format!("weir {}: {}", self.code(), self);
        if let Ok(v) = HeaderValue::from_str(&grpc_percent_encode(&msg)) {
            h.insert("grpc-message", v);
        }
        h.insert("x-weir-error", HeaderValue::from_static(self.code()));
        if let Some(secs) = self.retry_after_secs() {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        self.mark_refusal(h);
        resp.extensions_mut().insert(ErrorCode(self.code()));
        resp
    }

    /// Whether this is weir shedding load: a refusal the next proxy in a
    /// chain must not retry (docs/reference/retries.md#pushback).
    pub fn sheds_load(&self) -> bool {
        matches!(
            self,
            ProxyError::Overloaded
                | ProxyError::CircuitOpen { .. }
                | ProxyError::RateLimited { .. }
        )
    }

    /// Marks a refusal that sheds load the way Envoy marks its own, so
    /// that an Envoy in front does not retry it: `x-envoy-overloaded`, and
    /// `x-envoy-ratelimited` for a rate limit (a retry policy's
    /// `envoy-ratelimited` may still opt in to retrying that one).
    fn mark_refusal(&self, h: &mut http::HeaderMap) {
        let name = match self {
            ProxyError::RateLimited { .. } => ENVOY_RATELIMITED,
            _ if self.sheds_load() => ENVOY_OVERLOADED,
            _ => return,
        };
        h.insert(name, HeaderValue::from_static("true"));
    }

    /// The JSON body of weir's own error response (docs/reference/responses.md#error-responses).
    pub fn json_body(&self, upstream: Option<&str>) -> Vec<u8> {
        let mut body = serde_json::json!({
            "error": self.code(),
            "upstream": upstream,
            "message": self.to_string(),
        });
        if let Some(ra) = self.retry_after() {
            body["retry_after_ms"] = serde_json::json!(ra.as_millis() as u64);
        }
        let mut bytes = serde_json::to_vec(&body).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// `Retry-After` in whole seconds, rounded up: a client waiting that
    /// long finds capacity.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after()
            .map(|ra| ra.as_millis().div_ceil(1000).max(1) as u64)
    }

    /// weir's own error response as its head and body bytes: the one place
    /// its status and fields are decided, written out by the general path as
    /// a hyper response ([`ProxyError::to_response`]) and by the fast path
    /// as bytes.
    pub fn parts(&self, upstream: Option<&str>) -> (http::response::Parts, Vec<u8>) {
        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = self.status();
        let h = &mut parts.headers;
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-weir-error", HeaderValue::from_static(self.code()));
        if let Some(secs) = self.retry_after_secs() {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        self.mark_refusal(h);
        if self.closes_connection() {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        parts.extensions.insert(ErrorCode(self.code()));
        (parts, self.json_body(upstream))
    }

    /// Whether the client's connection ends with this answer: after a
    /// request weir could not frame, or a CONNECT it refused, the bytes that
    /// follow cannot be trusted to be a request.
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            ProxyError::BadRequest(_) | ProxyError::HeadTooLarge(_) | ProxyError::ConnectNotAllowed
        )
    }

    pub fn to_response(&self, upstream: Option<&str>) -> Response<Body> {
        let (parts, body) = self.parts(upstream);
        Response::from_parts(parts, full(body))
    }
}

/// Envoy's mark on a request it refused under load (circuit breaking,
/// overload): Envoy never retries an answer that carries it.
pub(crate) const ENVOY_OVERLOADED: &str = "x-envoy-overloaded";
/// Envoy's mark on a request its rate limit refused: not retried unless
/// the retry policy lists `envoy-ratelimited`.
pub(crate) const ENVOY_RATELIMITED: &str = "x-envoy-ratelimited";
/// weir's codes for the refusals that shed load ([`ProxyError::sheds_load`]).
const LOAD_SHEDDING_CODES: [&str; 3] = ["overloaded", "circuit_open", "rate_limited"];

/// Whether a field of an upstream's answer marks it as a proxy's refusal
/// under load (docs/reference/retries.md#pushback): Envoy's
/// `x-envoy-overloaded` or `x-envoy-ratelimited` (present, whatever its
/// value, as Envoy reads it), or another weir's `x-weir-error` naming one
/// of its load-shedding refusals. Read before the `x-weir-*` fields are
/// stripped; by length first, as every field of every answer passes here.
#[inline]
pub(crate) fn marks_refusal(name: &str, value: &[u8]) -> bool {
    match name.len() {
        12 => {
            name.eq_ignore_ascii_case("x-weir-error")
                && LOAD_SHEDDING_CODES
                    .contains(&std::str::from_utf8(value.trim_ascii()).unwrap_or(""))
        }
        18 => name.eq_ignore_ascii_case(ENVOY_OVERLOADED),
        19 => name.eq_ignore_ascii_case(ENVOY_RATELIMITED),
        _ => false,
    }
}

/// [`marks_refusal`] over a head or trailers.
pub(crate) fn refused_by_proxy(h: &http::HeaderMap) -> bool {
    h.contains_key(ENVOY_OVERLOADED)
        || h.contains_key(ENVOY_RATELIMITED)
        || h.get_all("x-weir-error")
            .iter()
            .any(|v| marks_refusal("x-weir-error", v.as_bytes()))
}

/// The code of weir's own error response (its `x-weir-error`), carried as
/// the response's extension for the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ErrorCode(pub &'static str);

/// gRPC's percent-encoding of `grpc-message`: printable ASCII except `%` as is.
fn grpc_percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A failed send to the upstream as the request side answers it: the
/// upstream side (`upstream::client`) classifies the failure, this side
/// turns it into weir's error for the client.
impl crate::upstream::client::SendError {
    /// The outcome for the decision, and weir's error for the client.
    pub fn into_parts(self) -> (crate::policy::Outcome, ProxyError) {
        (self.kind.outcome(), self.into_proxy_error())
    }

    pub fn into_proxy_error(self) -> ProxyError {
        use crate::upstream::client::Failure;
        match self.kind {
            Failure::Connect | Failure::NotSent => ProxyError::ConnectFailed(self.message),
            Failure::NotProcessed => ProxyError::RefusedStream(self.message),
            Failure::ClientBody => {
                ProxyError::BadRequest(format!("the request body broke off: {}", self.message))
            }
            Failure::Reset => ProxyError::UpstreamReset(self.message),
            Failure::BadResponse => ProxyError::BadResponse(self.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics' table of weir's errors names every error with the
    /// status weir answers it with: `weir_requests_total{code}` is the
    /// status the client saw.
    #[test]
    fn every_error_is_counted_under_its_status() {
        let all = [
            ProxyError::NoRoute,
            ProxyError::BadRequest(String::new()),
            ProxyError::HeadTooLarge(1),
            ProxyError::ConnectNotAllowed,
            ProxyError::RateLimited { retry_after: None },
            ProxyError::Overloaded,
            ProxyError::CircuitOpen { retry_after: None },
            ProxyError::ConnectFailed(String::new()),
            ProxyError::RefusedStream(String::new()),
            ProxyError::UpstreamReset(String::new()),
            ProxyError::UpstreamTimeout,
            ProxyError::DeadlineExceeded,
            ProxyError::BadResponse(String::new()),
            ProxyError::IdempotencyInFlight,
            ProxyError::IdempotencyKeyReused,
            ProxyError::IdempotencyNotReplayable,
            ProxyError::StateUnavailable,
        ];
        assert_eq!(all.len(), crate::metrics::ERROR_CODES.len());
        // What weir marks as shedding load, the next weir reads as such.
        for e in &all {
            let (parts, _) = e.parts(None);
            let code = parts.headers["x-weir-error"].as_bytes();
            assert_eq!(marks_refusal("X-Weir-Error", code), e.sheds_load(), "{e:?}");
            assert_eq!(refused_by_proxy(&parts.headers), e.sheds_load(), "{e:?}");
            let grpc = e.respond(None, true);
            assert_eq!(refused_by_proxy(grpc.headers()), e.sheds_load(), "{e:?}");
        }
        for e in all {
            let row = crate::metrics::ERROR_CODES.iter().find(|r| r.0 == e.code());
            assert_eq!(row.map(|r| r.1), Some(e.status().as_str()), "{e:?}");
        }
    }
}
