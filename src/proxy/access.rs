//! The access log (docs/behaviour.md#logs): one line per request, written
//! by both data paths through [`write`], for the requests `[server]
//! access_log` selects. The query string is never logged (it may carry
//! secrets), nor any header value.

use crate::config::AccessLog;
use std::time::Duration;

/// One request, as the access log reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry<'a> {
    /// The upstream's name, or `none` (`crate::metrics::NO_UPSTREAM`).
    pub(crate) upstream: &'a str,
    pub(crate) method: &'a str,
    /// The path, without the query.
    pub(crate) path: &'a str,
    pub(crate) status: u16,
    /// weir's error code, when weir answered itself.
    pub(crate) error: Option<&'a str>,
    /// Attempts sent upstream (0 when none was).
    pub(crate) attempts: Option<u32>,
    /// Why a retryable outcome was not retried.
    pub(crate) retry_stop: Option<&'a str>,
    /// The endpoint of the last attempt, when it had one
    /// (docs/endpoints.md#seeing-it).
    pub(crate) endpoint: Option<std::net::SocketAddr>,
    pub(crate) took: Duration,
}

/// Whether a request answered with `status` (and weir's error, if any) gets
/// a line.
pub(crate) fn wanted(mode: AccessLog, status: u16, error: bool) -> bool {
    match mode {
        AccessLog::Off => false,
        AccessLog::All => true,
        AccessLog::Errors => error || status >= 500,
    }
}

/// Writes the line (target `weir::access`, level INFO), if `mode` wants it.
pub(crate) fn write(mode: AccessLog, e: &Entry<'_>) {
    if !wanted(mode, e.status, e.error.is_some()) {
        return;
    }
    let path = e.path.split_once('?').map_or(e.path, |(p, _)| p);
    tracing::info!(
        target: "weir::access",
        upstream = e.upstream,
        method = e.method,
        path,
        status = e.status,
        error = e.error.unwrap_or("-"),
        attempts = e.attempts.unwrap_or(0),
        retry_stop = e.retry_stop.unwrap_or("-"),
        endpoint = %e.endpoint.map_or_else(|| "-".to_string(), |a| a.to_string()),
        duration_ms = e.took.as_micros() as f64 / 1000.0,
        "request"
    );
}

/// The method and target of the HTTP/1 request head at the start of `head`
/// (the fast path keeps the client's bytes, not a parsed request). An
/// absolute-form target (`http://user:pass@host/p`) is cut to its path: the
/// authority may carry credentials.
pub(crate) fn request_line(head: &[u8]) -> (&str, &str) {
    fn word(w: Option<&[u8]>) -> &str {
        std::str::from_utf8(w.unwrap_or_default()).unwrap_or("-")
    }
    let start = head
        .iter()
        .position(|b| *b != b'\r' && *b != b'\n')
        .unwrap_or(head.len());
    let line = head[start..]
        .split(|b| *b == b'\n')
        .next()
        .unwrap_or_default();
    let mut words = line.split(|b| *b == b' ');
    let method = word(words.next());
    let target = word(words.next());
    let path = match target.split_once("://") {
        Some((_, rest)) if !target.starts_with('/') => rest.find('/').map_or("/", |i| &rest[i..]),
        _ => target,
    };
    (method, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_mode_logs_weirs_errors_and_5xx() {
        assert!(!wanted(AccessLog::Errors, 200, false));
        assert!(!wanted(AccessLog::Errors, 404, false));
        assert!(wanted(AccessLog::Errors, 503, false));
        assert!(wanted(AccessLog::Errors, 429, true));
        assert!(wanted(AccessLog::All, 200, false));
        assert!(!wanted(AccessLog::Off, 503, true));
        assert_eq!(
            request_line(b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("GET", "/a?b=1")
        );
        assert_eq!(request_line(b""), ("", ""));
        assert_eq!(
            request_line(b"GET http://user:pass@api/charge?x=1 HTTP/1.1\r\n\r\n"),
            ("GET", "/charge?x=1")
        );
        assert_eq!(
            request_line(b"\r\nGET http://api HTTP/1.1\r\n"),
            ("GET", "/")
        );
    }
}
