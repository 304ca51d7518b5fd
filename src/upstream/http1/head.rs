//! An upstream's HTTP/1.1 response head, parsed into the response the
//! general path hands on (hyper's client's rules: httparse's defaults, at
//! most [`MAX_FIELDS`] fields), with where its body ends and whether its
//! connection may carry another request.

use crate::h1::{self, Framing};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode, Version};

/// The most fields a response head (or a trailer section) may carry, as
/// hyper's client and the fast path allow.
pub(super) const MAX_FIELDS: usize = 100;

/// A response head at the start of a buffer.
#[derive(Debug)]
pub(super) enum UpstreamHead {
    /// An interim (1xx) response of this many bytes: dropped, as hyper does.
    Interim(usize),
    /// The final response's head: its length, the response, where its body
    /// ends, and whether the connection may be reused after it.
    Final {
        len: usize,
        response: Response<()>,
        framing: Framing,
        reusable: bool,
    },
}

/// Parses the response head at the start of `buf`; `Ok(None)`: not whole
/// yet. `Err`: not an HTTP/1.1 response weir can pass on.
pub(super) fn parse(
    buf: &[u8],
    is_head_request: bool,
) -> Result<Option<UpstreamHead>, &'static str> {
    const GARBLED: &str = "the upstream's response head does not parse";
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut fields);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(GARBLED),
    };
    let (Some(code), Some(version)) = (resp.code, resp.version) else {
        return Err(GARBLED);
    };
    if code == 101 {
        return Err("the upstream switched protocols without a matching upgrade request");
    }
    if (100..200).contains(&code) {
        return Ok(Some(UpstreamHead::Interim(len)));
    }
    let status =
        StatusCode::from_u16(code).map_err(|_| "the upstream sent an invalid status code")?;
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let (mut close, mut keep_alive) = (false, false);
    for f in resp.headers.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes())
            .map_err(|_| "the upstream sent an invalid field name")?;
        let value = HeaderValue::from_bytes(f.value)
            .map_err(|_| "the upstream sent an invalid field value")?;
        if name == http::header::CONTENT_LENGTH {
            let n = h1::content_length_list(f.value)
                .ok_or("the upstream sent an invalid Content-Length")?;
            if length.is_some_and(|l| l != n) {
                return Err("the upstream sent conflicting Content-Lengths");
            }
            length = Some(n);
        } else if name == http::header::TRANSFER_ENCODING {
            chunked = Some(h1::ends_chunked(f.value));
        } else if name == http::header::CONNECTION {
            for token in h1::tokens(f.value) {
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        headers.append(name, value);
    }
    let (framing, reusable) = h1::response_framing(is_head_request, code, chunked, length);
    // HTTP/1.0 keeps its connection only when it says so.
    let reusable = reusable && !close && (version == 1 || keep_alive);
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = Version::HTTP_11;
    *response.headers_mut() = headers;
    Ok(Some(UpstreamHead::Final {
        len,
        response,
        framing,
        reusable,
    }))
}

/// A trailer section (what follows a chunked body's last chunk line),
/// parsed: `Ok(None)` when not whole yet; `Ok(Some((n, fields)))` when it
/// ended after `n` bytes.
pub(super) fn trailers(buf: &[u8]) -> Result<Option<(usize, HeaderMap)>, &'static str> {
    const BAD: &str = "the upstream sent an invalid trailer section";
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    match httparse::parse_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete((n, fields))) => {
            let mut map = HeaderMap::with_capacity(fields.len());
            for f in fields {
                let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| BAD)?;
                map.append(name, HeaderValue::from_bytes(f.value).map_err(|_| BAD)?);
            }
            Ok(Some((n, map)))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(_) => Err(BAD),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn final_of(raw: &[u8], head: bool) -> (usize, Response<()>, Framing, bool) {
        match parse(raw, head).unwrap().unwrap() {
            UpstreamHead::Final {
                len,
                response,
                framing,
                reusable,
            } => (len, response, framing, reusable),
            UpstreamHead::Interim(_) => panic!("interim"),
        }
    }

    #[test]
    fn framing_and_reuse_follow_rfc9112() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello";
        let (len, r, f, reuse) = final_of(raw, false);
        assert_eq!((len, f, reuse), (raw.len() - 5, Framing::Length(5), true));
        assert_eq!(r.headers()["x-a"], "b");
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert_eq!(final_of(raw, false).2, Framing::Chunked);
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(final_of(raw, true).2, Framing::Empty);
        let raw = b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(final_of(raw, false).2, Framing::Empty);
        // Until close, never reused.
        let (_, _, f, reuse) = final_of(b"HTTP/1.1 200 OK\r\n\r\n", false);
        assert_eq!((f, reuse), (Framing::Close, false));
        // Framed two ways: the chunks win, the connection goes.
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(final_of(raw, false).2, Framing::Chunked);
        assert!(!final_of(raw, false).3);
        let raw = b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n";
        assert!(!final_of(raw, false).3);
        let raw = b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert!(!final_of(raw, false).3);
        let raw = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n";
        assert!(final_of(raw, false).3);
    }

    #[test]
    fn interim_partial_and_garbled_heads() {
        let raw = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n";
        assert!(matches!(
            parse(raw, false),
            Ok(Some(UpstreamHead::Interim(40)))
        ));
        assert!(matches!(
            parse(b"HTTP/1.1 200 OK\r\nA: b\r\n", false),
            Ok(None)
        ));
        assert!(parse(b"HTTP/1.1 101 Switching\r\n\r\n", false).is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n", false).is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false).is_err());
        assert!(parse(b"garbage\r\n\r\n", false).is_err());
    }

    #[test]
    fn trailer_sections() {
        assert_eq!(trailers(b"\r\n").unwrap().unwrap().0, 2);
        let (n, t) = trailers(b"x-sum: 1\r\nx-b: 2\r\n\r\nNEXT")
            .unwrap()
            .unwrap();
        assert_eq!((n, t.len()), (20, 2));
        assert!(trailers(b"x-sum: 1\r\n").unwrap().is_none());
        assert!(trailers(b"bad field\r\n\r\n").is_err());
    }
}
