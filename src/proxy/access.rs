//! The access log (docs/reference/logs.md#logs): one line per request, written
//! by both data paths through [`write`], for the requests `[server]
//! access_log` selects. The query string is never logged (it may carry
//! secrets), nor any header value.

use crate::config::AccessLog;
use std::time::Duration;

/// One request, as the access log reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AccessEntry<'a> {
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
    /// A gRPC call's status, as the client got it (its head's, or its
    /// trailers').
    pub(crate) grpc_status: Option<u8>,
    /// A hedge was sent: `true` when its answer was returned.
    pub(crate) hedge: Option<bool>,
    /// The endpoint of the last attempt, when it had one
    /// (docs/reference/endpoints.md#seeing-it).
    pub(crate) endpoint: Option<crate::upstream::Address>,
    pub(crate) took: Duration,
    /// Response body bytes sent to the client, as framed.
    pub(crate) bytes_out: u64,
    /// Who asked, and what they sent.
    pub(crate) who: Who<'a>,
}

/// The client's address, as a request's extension (the connection's
/// service adds it; the general path's line reads it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientAddr(pub crate::address::Address);

/// The request side of a line: the client's address, the request id (the
/// client's `x-request-id`, or the one weir made and forwarded), its
/// `User-Agent`, and the request body bytes it sent.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Who<'a> {
    pub(crate) client: Option<crate::address::Address>,
    pub(crate) request_id: Option<&'a str>,
    pub(crate) user_agent: Option<&'a str>,
    pub(crate) bytes_in: u64,
    /// The trace id, when weir traces the request
    /// (docs/reference/tracing.md#tracing).
    pub(crate) trace_id: Option<&'a str>,
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
pub(crate) fn write(mode: AccessLog, e: &AccessEntry<'_>) {
    if !wanted(mode, e.status, e.error.is_some()) {
        return;
    }
    let path = e.path.split_once('?').map_or(e.path, |(p, _)| p);
    let path = &*inert(path);
    tracing::info!(
        target: "weir::access",
        upstream = e.upstream,
        method = &*inert(e.method),
        path,
        status = e.status,
        error = e.error.unwrap_or("-"),
        attempts = e.attempts.unwrap_or(0),
        retry_stop = e.retry_stop.unwrap_or("-"),
        grpc_status = %e.grpc_status.map_or_else(|| "-".to_string(), |c| c.to_string()),
        hedge = match e.hedge {
            Some(true) => "won",
            Some(false) => "lost",
            None => "-",
        },
        endpoint = %e.endpoint.map_or_else(|| "-".to_string(), |a| a.to_string()),
        duration_ms = e.took.as_micros() as f64 / 1000.0,
        client = %e.who.client.map_or_else(|| "-".to_string(), |a| a.to_string()),
        request_id = e.who.request_id.unwrap_or("-"),
        user_agent = &*inert(e.who.user_agent.unwrap_or("-")),
        bytes_in = e.who.bytes_in,
        bytes_out = e.bytes_out,
        trace_id = e.who.trace_id,
        "request"
    );
}

/// A value from the request as the access log writes it, the same in both
/// formats (docs/reference/logs.md#logs): a control character, a bidi
/// control (U+202E reverses what follows on a terminal or in a viewer) or
/// an invisible format character written as `\u{…}`, as the text format's
/// quoting writes it; the JSON encoder alone would write them raw.
fn inert(v: &str) -> std::borrow::Cow<'_, str> {
    let acts = |c: char| {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
    };
    if !v.chars().any(acts) {
        return std::borrow::Cow::Borrowed(v);
    }
    let mut out = String::with_capacity(v.len() + 16);
    for c in v.chars() {
        if acts(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A relayed response's body on the general path, watched to its end: the
/// access-log line of a response whose head `wanted` is written when the
/// body ends (or the client leaves), and a body that breaks off after the
/// head was sent — the upstream closed short of its length or last chunk,
/// reset the stream, or went idle past `idle_timeout` — is counted in
/// `weir_upstream_body_errors_total` and logged with its error whatever
/// the mode but `off` (hyper then ends the client's connection or stream
/// short, so that no client takes the part for the whole). The fast path
/// does the same in its relay.
pub(crate) struct Watched {
    inner: super::body::Body,
    line: Option<Line>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// Body bytes passed on so far.
    bytes: u64,
}

/// An owned [`AccessEntry`], waiting for its body's end.
pub(crate) struct Line {
    pub(crate) mode: AccessLog,
    /// Whether the line is written however the body ends (`wanted` at the
    /// head), or only when it breaks off.
    pub(crate) always: bool,
    pub(crate) upstream: String,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) status: u16,
    pub(crate) attempts: Option<u32>,
    pub(crate) retry_stop: Option<String>,
    pub(crate) grpc_status: Option<u8>,
    pub(crate) hedge: Option<bool>,
    pub(crate) endpoint: Option<crate::upstream::Address>,
    pub(crate) took: Duration,
    pub(crate) client: Option<crate::address::Address>,
    pub(crate) request_id: Option<String>,
    pub(crate) user_agent: Option<String>,
    /// The request body's bytes, counted as they are read.
    pub(crate) bytes_in: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    pub(crate) trace_id: Option<String>,
}

impl Line {
    fn write(&self, error: Option<&str>, bytes_out: u64) {
        let bytes_in = self.bytes_in.as_ref();
        write(
            self.mode,
            &AccessEntry {
                upstream: &self.upstream,
                method: &self.method,
                path: &self.path,
                status: self.status,
                error,
                attempts: self.attempts,
                retry_stop: self.retry_stop.as_deref(),
                grpc_status: self.grpc_status,
                hedge: self.hedge,
                endpoint: self.endpoint,
                took: self.took,
                bytes_out,
                who: Who {
                    client: self.client,
                    request_id: self.request_id.as_deref(),
                    user_agent: self.user_agent.as_deref(),
                    bytes_in: bytes_in.map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed)),
                    trace_id: self.trace_id.as_deref(),
                },
            },
        );
    }
}

impl Watched {
    pub(crate) fn new(
        inner: super::body::Body,
        line: Line,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> Self {
        Watched {
            inner,
            line: Some(line),
            metrics,
            bytes: 0,
        }
    }

    fn ended(&mut self, error: Option<&str>) {
        let Some(line) = self.line.take() else { return };
        if let Some(code) = error {
            self.metrics.body_error(&line.upstream, code);
        }
        if line.always || error.is_some() {
            line.write(error, self.bytes);
        }
    }
}

impl http_body::Body for Watched {
    type Data = bytes::Bytes;
    type Error = super::body::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &polled {
            self.bytes += f.data_ref().map_or(0, |d| d.len() as u64);
            if let (Some(t), Some(line)) = (f.trailers_ref(), self.line.as_mut()) {
                line.grpc_status = super::headers::grpc_status(t).or(line.grpc_status);
            }
        }
        match &polled {
            Poll::Ready(None) => self.ended(None),
            Poll::Ready(Some(Err(e))) => {
                let code = match e.is::<super::body::IdleTimeoutError>() {
                    true => "upstream_timeout",
                    false => "upstream_reset",
                };
                self.ended(Some(code));
            }
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.ended(None),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // The client left (or the response was dropped) before the end.
        self.ended(None);
    }
}

/// The first value of the field `name` in the HTTP/1 request head `head`,
/// when it is text (the fast path keeps the client's bytes).
pub(crate) fn field<'h>(head: &'h [u8], name: &str) -> Option<&'h str> {
    head.split(|b| *b == b'\n').skip(1).find_map(|line| {
        let colon = line.iter().position(|b| *b == b':')?;
        let (n, v) = line.split_at(colon);
        if !n.eq_ignore_ascii_case(name.as_bytes()) {
            return None;
        }
        let v = std::str::from_utf8(&v[1..]).ok()?.trim();
        v.bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
            .then_some(v)
    })
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
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nUser-Agent:  curl/8.5 \r\nX: \xff\r\n\r\n";
        assert_eq!(field(head, "user-agent"), Some("curl/8.5"));
        assert_eq!(field(head, "x"), None);
        assert_eq!(field(head, "referer"), None);
    }
}
