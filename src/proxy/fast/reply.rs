//! weir's own error responses, as the fast path writes them.

use super::head::Annotations;
use crate::proxy::attempt;
use crate::proxy::error::ProxyError;

/// weir's own error response (docs/reference/responses.md#error-responses), as the fast path writes it.
pub(super) struct ErrorResponse<'a> {
    pub(super) error: &'a ProxyError,
    pub(super) upstream: &'a str,
    pub(super) annotations: Option<Annotations>,
    pub(super) close: bool,
    /// A response to HEAD announces its body and does not send it.
    pub(super) is_head_request: bool,
    pub(super) date: std::time::SystemTime,
    /// The response cache's mark (`x-weir-cache`).
    pub(super) cache: Option<crate::policy::cache::CacheResult>,
}

impl ErrorResponse<'_> {
    /// Writes [`ProxyError::parts`] as bytes, with the annotations, `Date`
    /// and `Connection: close` when the connection ends.
    pub(super) fn write(&self, out: &mut Vec<u8>) {
        let (mut parts, body) = self.error.parts(Some(self.upstream));
        if let Some(a) = self.annotations {
            attempt::annotate(&mut parts.headers, &a);
        }
        if let Some(r) = self.cache {
            crate::proxy::cached::mark(&mut parts.headers, r);
        }
        let date = httpdate::fmt_http_date(self.date);
        let date = http::HeaderValue::from_str(&date).ok();
        write_parts(
            &parts,
            date.as_ref(),
            &body,
            self.close,
            !self.is_head_request,
            out,
        );
    }
}

/// Writes a response weir makes itself (an error, a replay) as HTTP/1.1
/// bytes: the status line, `date` when given, the fields, `Connection:
/// close` when the connection ends, the body's length, and the body when
/// `send_body` (not for HEAD). A 204 or 304 announces no length.
pub(super) fn write_parts(
    parts: &http::response::Parts,
    date: Option<&http::HeaderValue>,
    body: &[u8],
    close: bool,
    send_body: bool,
    out: &mut Vec<u8>,
) {
    use std::io::Write;
    let status = parts.status;
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    let date = date.map(|d| (&http::header::DATE, d));
    for (name, value) in date.into_iter().chain(&parts.headers) {
        if name == http::header::CONNECTION {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if close || parts.headers.contains_key(http::header::CONNECTION) {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if !matches!(status.as_u16(), 204 | 304) {
        let _ = write!(out, "content-length: {}\r\n", body.len());
    }
    out.extend_from_slice(b"\r\n");
    if send_body && status.as_u16() != 204 && status.as_u16() != 304 {
        out.extend_from_slice(body);
    }
}
