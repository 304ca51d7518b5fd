//! weir's own error responses, as the fast path writes them.

use super::head::Annotations;
use crate::proxy::attempt;
use crate::proxy::error::ProxyError;

/// weir's own error response (docs/behaviour.md#error-responses), as the fast path writes it.
pub(super) struct ErrorResponse<'a> {
    pub(super) error: &'a ProxyError,
    pub(super) upstream: &'a str,
    pub(super) annotations: Option<Annotations>,
    pub(super) close: bool,
    /// A response to HEAD announces its body and does not send it.
    pub(super) head_method: bool,
    pub(super) date: std::time::SystemTime,
}

impl ErrorResponse<'_> {
    /// Writes [`ProxyError::parts`] as bytes, with the annotations, `Date`
    /// and `Connection: close` when the connection ends.
    pub(super) fn write(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let (mut parts, body) = self.error.parts(Some(self.upstream));
        if let Some(a) = self.annotations {
            attempt::annotate(&mut parts.headers, a.attempts, a.stop);
        }
        if self.close {
            parts.headers.insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\ndate: {}\r\n",
            parts.status.as_u16(),
            parts.status.canonical_reason().unwrap_or(""),
            httpdate::fmt_http_date(self.date),
        );
        for (name, value) in &parts.headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        let _ = write!(out, "content-length: {}\r\n\r\n", body.len());
        if !self.head_method {
            out.extend_from_slice(&body);
        }
    }
}
