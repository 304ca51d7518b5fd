//! Header hygiene: hop-by-hop headers stripped in both directions, `x-weir-*`
//! never crossing weir, and the request's own deadline headers.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;

/// Fields never forwarded as they came, in either direction (besides those
/// a `Connection` field names, and `Transfer-Encoding`, which each side
/// frames itself): RFC 9110 §7.6.1, plus the proxy credentials meant for
/// weir itself. The fast path (`fast::head`) strips the same list.
/// `Trailer` is end to end (RFC 9110 §6.6.2) and stays: hyper only sends
/// the trailer fields it announces.
pub(crate) const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "upgrade",
];

/// Removes hop-by-hop headers, every header the `Connection` header names, and
/// every `x-weir-*` header. `TE: trailers` survives on requests: it is how a
/// client says it accepts trailers, and gRPC requires it end to end.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap, keep_te_trailers: bool) {
    let te_trailers = keep_te_trailers
        && h.get_all(header::TE).iter().any(|v| {
            v.to_str()
                .map(|s| {
                    s.split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
                })
                .unwrap_or(false)
        });
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    h.remove(header::TRANSFER_ENCODING);
    strip_lookalikes(h);
    strip_weir(h);
    if te_trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Restates a response's framing field for the client (RFC 9112 §6.3): a
/// `Content-Length` beside a `Transfer-Encoding` is removed (the body was
/// read as chunks; forwarding the length would promise bytes that never
/// come), and a list of equal lengths (`2, 2`, or the field twice), which
/// hyper accepts, becomes one value. Runs before [`strip_hop_by_hop`], which
/// removes `Transfer-Encoding` itself; the fast path restates the same way
/// (docs/behaviour.md#protocols).
pub(crate) fn restate_length(h: &mut HeaderMap) {
    if h.contains_key(header::TRANSFER_ENCODING) {
        h.remove(header::CONTENT_LENGTH);
        return;
    }
    let mut all = h.get_all(header::CONTENT_LENGTH).iter();
    let single = match (all.next(), all.next()) {
        (None, _) => return,
        (Some(v), None) => !v.as_bytes().contains(&b','),
        _ => false,
    };
    if single {
        return;
    }
    let mut values = h
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .map(|v| super::h1::content_length_list(v.as_bytes()));
    let Some(Some(first)) = values.next() else {
        return;
    };
    if values.all(|v| v == Some(first)) {
        let mut buf = [0u8; 20];
        if let Ok(v) = HeaderValue::from_bytes(decimal(first, &mut buf)) {
            h.insert(header::CONTENT_LENGTH, v);
        }
    }
}

/// Removes every `x-weir-*` header.
pub(crate) fn strip_weir(h: &mut HeaderMap) {
    if !h.keys().any(|k| k.as_str().starts_with("x-weir-")) {
        return;
    }
    let names: Vec<HeaderName> = h
        .keys()
        .filter(|k| k.as_str().starts_with("x-weir-"))
        .cloned()
        .collect();
    for n in names {
        h.remove(n);
    }
}

/// `x-weir-timeout-ms: N`. `Err` carries the reason for a 400.
pub(crate) fn weir_timeout(h: &HeaderMap) -> Result<Option<Duration>, String> {
    let Some(v) = h.get("x-weir-timeout-ms") else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or_else(|| "x-weir-timeout-ms must be a whole number of milliseconds".to_string())
}

/// `grpc-timeout`: up to 8 digits and a unit (H M S m u n). A malformed value
/// is ignored, as gRPC servers do.
pub(crate) fn grpc_timeout(h: &HeaderMap) -> Option<Duration> {
    let s = h.get("grpc-timeout")?.to_str().ok()?;
    if s.len() < 2 || s.len() > 9 {
        return None;
    }
    let (digits, unit) = s.split_at(s.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `grpc-timeout` for the time left, in milliseconds (at most 8 digits).
pub(crate) fn grpc_timeout_value(left: Duration) -> HeaderValue {
    let ms = left.as_millis().min(99_999_999);
    HeaderValue::from(ms as u64)
        .to_str()
        .ok()
        .and_then(|s| HeaderValue::from_str(&format!("{s}m")).ok())
        .unwrap_or_else(|| HeaderValue::from_static("0m"))
}

/// Whether a field name reads as `Content-Length`, `Transfer-Encoding` or
/// `Host` once `_` is taken for `-`, as CGI-style servers (PHP, WSGI) map
/// both to the same variable: `Content_Length` must not reach an upstream
/// that may frame or route by it (nginx drops such names too). Both paths
/// drop them.
pub(crate) fn is_lookalike(name: &str) -> bool {
    name.contains('_')
        && ["content-length", "transfer-encoding", "host"]
            .iter()
            .any(|f| {
                f.len() == name.len()
                    && f.bytes()
                        .zip(name.bytes())
                        .all(|(a, b)| a == b.to_ascii_lowercase() || (a == b'-' && b == b'_'))
            })
}

fn strip_lookalikes(h: &mut HeaderMap) {
    let found: Vec<HeaderName> = h
        .keys()
        .filter(|n| is_lookalike(n.as_str()))
        .cloned()
        .collect();
    for n in found {
        h.remove(n);
    }
}

/// `n` in decimal, written into `buf` without allocating: the digits of a
/// header value weir writes itself (`x-weir-attempts`, `content-length`).
pub(crate) fn decimal(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn connection_named_headers_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("x-weir-attempts", HeaderValue::from_static("9"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers, gzip"));
        strip_hop_by_hop(&mut h, true);
        assert!(h.get("x-secret").is_none());
        assert!(h.get("x-weir-attempts").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert_eq!(h.get(header::TE).unwrap(), "trailers");
        assert_eq!(h.get("x-kept").unwrap(), "1");
    }

    #[test]
    fn framing_fields_are_restated() {
        let restated = |fields: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in fields {
                h.append(*n, HeaderValue::from_static(v));
            }
            restate_length(&mut h);
            h.get_all(header::CONTENT_LENGTH)
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(restated(&[("content-length", "2, 2")]), ["2"]);
        assert_eq!(
            restated(&[("content-length", "2"), ("content-length", "2")]),
            ["2"]
        );
        assert_eq!(restated(&[("content-length", "30")]), ["30"]);
        assert!(restated(&[("content-length", "30"), ("transfer-encoding", "chunked")]).is_empty());
        assert!(restated(&[]).is_empty());
    }

    #[test]
    fn grpc_timeouts_parse() {
        let mut h = HeaderMap::new();
        h.insert("grpc-timeout", HeaderValue::from_static("100m"));
        assert_eq!(grpc_timeout(&h), Some(Duration::from_millis(100)));
        h.insert("grpc-timeout", HeaderValue::from_static("2S"));
        assert_eq!(grpc_timeout(&h), Some(Duration::from_secs(2)));
        h.insert("grpc-timeout", HeaderValue::from_static("123456789S"));
        assert_eq!(grpc_timeout(&h), None);
        h.insert("grpc-timeout", HeaderValue::from_static("5x"));
        assert_eq!(grpc_timeout(&h), None);
        assert_eq!(grpc_timeout_value(Duration::from_millis(1500)), "1500m");
    }

    #[test]
    fn weir_timeout_rejects_garbage() {
        let mut h = HeaderMap::new();
        h.insert("x-weir-timeout-ms", HeaderValue::from_static("100"));
        assert_eq!(weir_timeout(&h), Ok(Some(Duration::from_millis(100))));
        h.insert("x-weir-timeout-ms", HeaderValue::from_static("soon"));
        assert!(weir_timeout(&h).is_err());
    }
}
