//! Header hygiene: hop-by-hop headers stripped in both directions, `x-weir-*`
//! never crossing weir, and the request's own deadline headers.

use crate::h1;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;

/// Removes hop-by-hop headers, every header the `Connection` header names, and
/// every `x-weir-*` header. `TE: trailers` survives on requests: it is how a
/// client says it accepts trailers, and gRPC requires it end to end.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap, keep_te_trailers: bool) {
    let te_trailers = keep_te_trailers
        && h.get_all(header::TE)
            .iter()
            .any(|v| h1::has_token(v.as_bytes(), b"trailers"));
    let named = |n: &HeaderName| {
        h.get_all(header::CONNECTION)
            .iter()
            .any(|v| h1::has_token(v.as_bytes(), n.as_str().as_bytes()))
    };
    let gone: Vec<HeaderName> = h
        .keys()
        .filter(|n| super::request::dropped(n.as_str()) || named(n))
        .cloned()
        .collect();
    for n in gone {
        h.remove(n);
    }
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
/// (docs/reference/protocols.md#protocols).
pub(crate) fn restate_length(h: &mut HeaderMap) {
    if h.contains_key(header::TRANSFER_ENCODING) {
        h.remove(header::CONTENT_LENGTH);
        return;
    }
    one_length(h);
}

/// A `Content-Length` given as several equal values (`2, 2`, or the field
/// twice) becomes one field with that value (RFC 9110 §8.6 lets a
/// recipient take them as one); anything else is left as it is. On a
/// request, disagreeing lengths never get here: the guard answers 400 to
/// an HTTP/1.1 client and h2 resets an HTTP/2 client's stream
/// (docs/reference/routing.md#header-hygiene).
pub(crate) fn one_length(h: &mut HeaderMap) {
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
        .map(|v| crate::h1::content_length_list(v.as_bytes()));
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

/// `grpc-status`, in a trailers-only head or in trailers; `None` when
/// absent or not a number that fits a code.
pub(crate) fn grpc_status(h: &HeaderMap) -> Option<u8> {
    h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()
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
}
