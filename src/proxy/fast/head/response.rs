//! The upstream's side of the fast path: its response head parsed and
//! rewritten for the client in one pass (framing per RFC 9112 §6.3, hygiene
//! as on the general path), weir's annotations, and a chunked body relayed
//! with its trailer section filtered.

use super::{eq, header, push_u64, ConnectionField, MAX_HEADERS};
use crate::h1;
use crate::proxy::request::dropped as hop_by_hop;

pub use crate::h1::Framing;

/// What the fast path needs from an upstream's response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response<'b> {
    pub status: u16,
    pub head_len: usize,
    pub framing: Framing,
    /// The upstream connection may carry another request after this body.
    pub reusable: bool,
    /// `Retry-After`, as sent.
    pub retry_after: Option<&'b str>,
    /// The answer is a proxy's refusal under load (`x-envoy-overloaded`,
    /// another weir's `x-weir-error: overloaded`, …): read here, before
    /// the `x-weir-*` fields are left out of the client's head
    /// (docs/reference/retries.md#pushback).
    pub refused: bool,
    /// Where in `out` the fields a stored response keeps lie, as one block
    /// (see [`fields`]); `None` when the upstream sent one that must be
    /// left out of it (`Idempotent-Replayed`).
    pub kept: Option<(usize, usize)>,
}

/// A parsed response head.
#[derive(Debug, PartialEq, Eq)]
pub enum Head<'b> {
    /// An interim (1xx) response of this many bytes: dropped, as hyper does.
    Interim(usize),
    /// The final response.
    Final(Response<'b>),
}

/// Parses the upstream's response head at the start of `buf`. `Err`: the
/// upstream sent something that is not an HTTP/1.1 response weir can pass on.
///
/// For a final response it also writes the client's head to `out` (which it
/// clears first), all but its end ([`finish_response`]): the status line;
/// the fields without hop-by-hop and `x-weir-*` ones; the framing restated;
/// and `Date` from `now` when the upstream sent none (RFC 9110 §6.6.1: a
/// forwarding recipient with a clock adds it; the clock is read only then).
/// Parsing once for both keeps the head's bytes in the cache they arrived in.
pub fn parse_response<'b>(
    buf: &'b [u8],
    is_head_request: bool,
    now: impl FnOnce() -> std::time::SystemTime,
    out: &mut Vec<u8>,
) -> Result<Option<Head<'b>>, &'static str> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err("the upstream's response head does not parse"),
    };
    let (Some(status), Some(version)) = (resp.code, resp.version) else {
        return Err("the upstream's response head does not parse");
    };
    if status < 100 {
        return Err("the upstream sent a status code below 100");
    }
    if status == 101 {
        return Err("the upstream switched protocols without a matching upgrade request");
    }
    if (100..200).contains(&status) {
        return Ok(Some(Head::Interim(head_len)));
    }
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let mut close = version == 0;
    let mut retry_after = None;
    let mut connection = ConnectionField::default();
    let mut dated = false;
    let mut replayed = false;
    let mut refused = false;
    for h in resp.headers.iter() {
        let n = h.name;
        dated |= eq(n, "date");
        refused |= crate::proxy::error::marks_refusal(n, h.value);
        replayed |= eq(n, crate::policy::idempotency::REPLAYED_HEADER);
        if eq(n, "content-length") {
            let v = h1::content_length_list(h.value)
                .ok_or("the upstream sent an invalid Content-Length")?;
            if length.is_some_and(|l| l != v) {
                return Err("the upstream sent conflicting Content-Lengths");
            }
            length = Some(v);
        } else if eq(n, "transfer-encoding") {
            chunked = Some(h1::ends_chunked(h.value));
        } else if eq(n, "connection") {
            connection.add(h.value);
        } else if eq(n, "retry-after") {
            retry_after = std::str::from_utf8(h.value).ok().map(str::trim);
        }
    }
    if connection.overflow {
        return Err("the upstream sent too many Connection fields");
    }
    if version == 0 {
        close = !connection.keep_alive;
    }
    close |= connection.close;
    let (framing, reusable) = h1::response_framing(is_head_request, status, chunked, length);
    let reusable = reusable && !close;

    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let fields_start = out.len();
    for h in resp.headers.iter() {
        let n = h.name;
        // The framing fields are restated below, once each.
        let framing_field = eq(n, "transfer-encoding") || eq(n, "content-length");
        if framing_field || hop_by_hop(n) || connection.names(n) {
            continue;
        }
        header(out, n.as_bytes(), h.value);
    }
    if !dated {
        header(out, b"date", httpdate::fmt_http_date(now()).as_bytes());
    }
    // The end-to-end fields end here; the framing is restated after them.
    let kept = (!replayed).then_some((fields_start, out.len()));
    // A body-less response keeps its Content-Length: it describes the
    // representation (HEAD, 304), not this message — except a 204, which
    // must not carry one (RFC 9110 §8.6), as hyper's server drops it.
    let empty_length = length.filter(|_| status != 204 && chunked.is_none());
    restate_framing(framing, empty_length, out);
    Ok(Some(Head::Final(Response {
        status,
        head_len,
        framing,
        reusable,
        retry_after,
        refused,
        kept,
    })))
}

/// What weir adds to a proxied response (docs/reference/responses.md#what-weir-adds-to-responses).
pub use crate::proxy::attempt::Annotations;

/// Ends the client's response head [`parse_response`] began in `out`: the
/// annotations and, when `close`, `Connection: close`.
#[inline]
pub fn finish_response(out: &mut Vec<u8>, annotations: Option<Annotations>, close: bool) {
    if let Some(a) = annotations {
        crate::proxy::attempt::annotation_fields(&a, |name, value| {
            header(out, name.as_bytes(), value)
        });
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes the client's framing field for a body framed as `framing`:
/// `Transfer-Encoding: chunked`, or the `Content-Length` of a body of known
/// length — or `empty_length`, which a body-less response keeps when it
/// describes the representation (a HEAD's, a 304's) rather than this message.
#[inline]
pub fn restate_framing(framing: Framing, empty_length: Option<u64>, out: &mut Vec<u8>) {
    let restated = match framing {
        Framing::Length(n) => Some(n),
        Framing::Empty => empty_length,
        Framing::Chunked => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            None
        }
        Framing::Close => None,
    };
    if let Some(n) = restated {
        out.extend_from_slice(b"content-length: ");
        push_u64(out, n);
        out.extend_from_slice(b"\r\n");
    }
}

/// The fields of the client's response head [`parse_response`] began in
/// `out` (before [`finish_response`]) that a stored response keeps
/// (`idempotent::kept`), as one block of `name: value\r\n` lines: the
/// upstream's end-to-end fields as the client gets them. `kept`: where they
/// lie as one block ([`Response::kept`]), copied as they are; without it
/// the head is read line by line. `room`: what to leave for the body kept
/// after them (its length, when known), so that a body of that length fills
/// the buffer exactly.
pub fn fields(out: &[u8], kept: Option<(usize, usize)>, room: usize) -> Vec<u8> {
    if let Some(block) = kept.and_then(|(a, b)| out.get(a..b)) {
        let mut v = Vec::with_capacity(block.len() + room);
        v.extend_from_slice(block);
        return v;
    }
    let mut block = Vec::with_capacity(out.len() + room);
    for line in out.split_inclusive(|b| *b == b'\n').skip(1) {
        let name = line.split(|b| *b == b':').next().unwrap_or_default();
        if line.ends_with(b"\r\n") && crate::proxy::idempotent::kept(name) {
            block.extend_from_slice(line);
        }
    }
    block
}

/// The largest trailer section relayed.
const MAX_TRAILERS: usize = 16 * 1024;

/// The trailer section at the start of `buf`, as it goes to the client:
/// `Ok(Some(n))` when it ends within `buf` after `n` bytes, with the fields
/// a client may get ([`h1::allowed_in_trailers`]) and the final CRLF written
/// to `out`; `Ok(None)` when more is to come.
pub fn trailer_section(buf: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, &'static str> {
    const BAD: &str = "the upstream sent an invalid trailer section";
    if buf.starts_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
        return Ok(Some(2));
    }
    let mut fields = [httparse::EMPTY_HEADER; 32];
    match httparse::parse_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete((n, fields))) => {
            for f in fields.iter() {
                if h1::allowed_in_trailers(f.name) {
                    header(out, f.name.as_bytes(), f.value);
                }
            }
            out.extend_from_slice(b"\r\n");
            Ok(Some(n))
        }
        Ok(httparse::Status::Partial) if buf.len() <= MAX_TRAILERS => Ok(None),
        Ok(httparse::Status::Partial) | Err(_) => Err(BAD),
    }
}

/// A chunked response body on its way to the client: the chunks pass as
/// they come; the trailer section is held until whole and filtered.
#[derive(Debug)]
pub struct ChunkedRelay {
    chunks: h1::Chunked,
    /// Once the chunks have ended: the trailer section so far.
    trailers: Option<Vec<u8>>,
}

impl Default for ChunkedRelay {
    fn default() -> Self {
        ChunkedRelay {
            chunks: h1::Chunked::until_trailers(),
            trailers: None,
        }
    }
}

impl ChunkedRelay {
    /// Takes `got` from the upstream and appends what goes to the client to
    /// `out`. `Ok(Some(n))`: the body ended after the first `n` bytes.
    pub fn feed(&mut self, got: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, &'static str> {
        let mut used = 0;
        if self.trailers.is_none() {
            match self.chunks.feed(got)? {
                None => {
                    out.extend_from_slice(got);
                    return Ok(None);
                }
                Some(end) => {
                    out.extend_from_slice(&got[..end]);
                    used = end;
                    self.trailers = Some(Vec::new());
                }
            }
        }
        let rest = &got[used..];
        let held = self.trailers.get_or_insert_with(Vec::new);
        if held.is_empty() {
            // Usually the whole section is here: nothing is copied.
            if let Some(n) = trailer_section(rest, out)? {
                return Ok(Some(used + n));
            }
            held.extend_from_slice(rest);
            return Ok(None);
        }
        let before = held.len();
        held.extend_from_slice(rest);
        match trailer_section(held, out)? {
            Some(n) => Ok(Some(used + n.saturating_sub(before))),
            None => Ok(None),
        }
    }
}
