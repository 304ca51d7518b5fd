//! HTTP/1.1 heads on the fast path: the client's request head is parsed,
//! routed and written out for the upstream in one pass; the upstream's
//! response head is parsed for its framing and its outcome, then written out
//! for the client. Nothing here does I/O or keeps a header map: header names
//! and values are copied from the buffer they arrived in to the buffer that
//! leaves, with the same hygiene as the general path (docs/reference/routing.md#header-hygiene).
//!
//! Anything this path does not handle itself — another HTTP version, a body
//! too large to hold for a replay, announced with `Expect` or chunked with
//! trailers, an upgrade, gRPC, a target or route it cannot map, trailers
//! asked of an HTTP/2 upstream — makes
//! [`plan`] answer [`Parse::Fallback`], and the connection goes on through
//! hyper (`super::super::server`), which sees the same bytes.

pub mod cache;
mod h2;

use crate::h1;
use crate::policy::RequestFacts;
use crate::proxy::request::{self, Parsed};
use crate::proxy::route::upstream_path;
use crate::proxy::{ListenerRole, Snapshot, Upstream};

mod response;
pub use response::{
    fields, finish_response, parse_response, restate_framing, trailer_section, Annotations,
    ChunkedRelay, Framing, Head, Response,
};

/// The most header fields a head may have on the fast path; a head with more
/// goes to hyper, whose own limit answers it.
pub const MAX_HEADERS: usize = 100;

/// The largest request body the fast path holds (it is always held, so a
/// retry can replay it); a larger one is streamed by the general path.
pub const MAX_BODY: u64 = 1 << 20;

/// The largest request body the fast path sends over TLS (more may wait on
/// an upstream that answered without reading it).
pub const MAX_TLS_BODY: u64 = 64 << 10;

/// A parse that may need more bytes or another path.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse<T> {
    /// The head is not complete yet.
    Partial,
    /// The head is complete and its body chunked; the body's end has not
    /// arrived yet (nor more than a body the fast path holds).
    BodyPending,
    /// Not for the fast path; the reason is for debug logs.
    Fallback(&'static str),
    /// Parsed.
    Done(T),
}

/// A request the fast path takes, after its head was written for the upstream.
#[derive(Debug)]
pub struct Planned {
    /// Index of the upstream in the snapshot.
    pub upstream: usize,
    /// Length of the client's head in the buffer.
    pub head_len: usize,
    /// Length of the body that follows it (`Content-Length`, 0, or the
    /// whole chunked body as it came).
    pub body_len: usize,
    /// The body was chunked: `plan` has written it for the upstream already,
    /// coded anew ([`h1::rechunk`]).
    pub chunked: bool,
    /// The method and idempotency key, for the retry decision.
    pub facts: RequestFacts,
    /// A write replayable only by its idempotency key (hedged only with
    /// `hedge.keyed_writes`).
    pub keyed_write: bool,
    /// A HEAD request: the response has no body, whatever it announces.
    pub is_head_request: bool,
    /// The client asked to close the connection after this response.
    pub close: bool,
    /// What the request says of itself: its deadline, rate key and
    /// idempotency key ([`request::read`]).
    pub asked: Parsed,
    /// A keyed write, for the upstream's idempotency store.
    pub idem: Option<Keyed>,
    /// What the upstream's response cache does with it.
    pub cache: crate::proxy::cached::Cached,
    /// The length of the validators of the entry it revalidates, the last
    /// fields of the upstream's head (`cache::add_validators`).
    pub validators_len: Option<usize>,
    /// Its spans, when weir traces it (docs/reference/tracing.md#spans).
    pub trace: Option<crate::trace::Trace>,
    /// To an HTTP/2 upstream: the request's head for the HTTP/2 pool's client
    /// ([`h2::request_parts`]); its body is the client's, as it came.
    pub h2: Option<Box<http::request::Parts>>,
}

/// A request the upstream's idempotency store applies to
/// (docs/reference/idempotency.md#idempotency-keys): where its method and target (for
/// the fingerprint) are in the head, which stays at the start of the
/// client's buffer while the request is served. Its key is `asked.key`.
#[derive(Debug, Clone)]
pub struct Keyed {
    pub method: std::ops::Range<usize>,
    pub target: std::ops::Range<usize>,
}

impl Keyed {
    /// The method and target, read from the head in `buf`, as bytes (they
    /// are only hashed).
    pub fn parts<'b>(&self, buf: &'b [u8]) -> (&'b [u8], &'b [u8]) {
        let bytes = |r: &std::ops::Range<usize>| buf.get(r.clone()).unwrap_or_default();
        (bytes(&self.method), bytes(&self.target))
    }
}

impl request::RequestHead for Request<'_, '_> {
    fn method(&self) -> &str {
        self.method
    }
    fn authority(&self) -> Option<&str> {
        self.authority
    }
    fn path(&self) -> &str {
        self.path
    }
    fn host_field(&self) -> Option<&str> {
        self.host
    }
    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.fields.iter().map(|f| (f.name, f.value))
    }
}

/// Where `part` (a slice of `buf`) lies in `buf`.
fn range_in(buf: &[u8], part: &[u8]) -> std::ops::Range<usize> {
    let start = (part.as_ptr() as usize).saturating_sub(buf.as_ptr() as usize);
    start..start + part.len()
}

fn eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// The most `Connection` fields a head may have on the fast path.
const MAX_CONNECTION_FIELDS: usize = 16;

/// What the `Connection` fields of a head say: the options weir acts on,
/// and the values themselves, whose other names are hop-by-hop fields.
#[derive(Default)]
struct ConnectionField<'b> {
    values: [&'b [u8]; MAX_CONNECTION_FIELDS],
    count: usize,
    close: bool,
    keep_alive: bool,
    upgrade: bool,
    /// More fields than are kept: the head is not the fast path's.
    overflow: bool,
}

impl<'b> ConnectionField<'b> {
    fn add(&mut self, value: &'b [u8]) {
        // Whether the value names a field besides these three: `keep-alive`
        // and `upgrade` are hop-by-hop fields dropped anyway, and `close`
        // is remembered; a value of only these (nearly every one) need not
        // be searched for each field the head is written with.
        let mut other = false;
        for t in h1::tokens(value) {
            let close = t.eq_ignore_ascii_case(b"close");
            let keep_alive = t.eq_ignore_ascii_case(b"keep-alive");
            let upgrade = t.eq_ignore_ascii_case(b"upgrade");
            self.close |= close;
            self.keep_alive |= keep_alive;
            self.upgrade |= upgrade;
            other |= !(close || keep_alive || upgrade || t.is_empty());
        }
        if !other {
            return;
        }
        if self.count == MAX_CONNECTION_FIELDS {
            self.overflow = true;
            return;
        }
        self.values[self.count] = value;
        self.count += 1;
    }

    /// Whether a `Connection` field names `name`.
    fn names(&self, name: &str) -> bool {
        (self.close && name.eq_ignore_ascii_case("close"))
            || self.values[..self.count]
                .iter()
                .any(|v| h1::has_token(v, name.as_bytes()))
    }
}

/// Bytes a request target may carry on the fast path (RFC 3986's unreserved,
/// sub-delims, `:`, `@`, `/`, `?` and `%`). Anything else — a space, `<`,
/// `"`, a fragment — goes to hyper, which rejects or normalises it.
const TARGET: [bool; 256] = {
    let mut t = [false; 256];
    let ok =
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/?%[]";
    let mut i = 0;
    while i < ok.len() {
        t[ok[i] as usize] = true;
        i += 1;
    }
    t
};

/// What the first pass over a client's head found: the request line and
/// the fields that framing, routing and hygiene need.
struct Request<'h, 'b> {
    method: &'b str,
    /// The target's authority, when it came in absolute form.
    authority: Option<&'b str>,
    path: &'b str,
    path_and_query: &'b str,
    host: Option<&'b str>,
    content_length: Option<u64>,
    /// `Transfer-Encoding: chunked`, the only coding the fast path takes.
    chunked: bool,
    connection: ConnectionField<'b>,
    te_trailers: bool,
    head_len: usize,
    fields: &'h [httparse::Header<'b>],
}

/// Parses the client's request head at the start of `buf`, routes it and,
/// when the fast path takes it, writes the upstream's request head to `out`.
pub fn plan(snap: &Snapshot, role: &ListenerRole, buf: &[u8], out: &mut Vec<u8>) -> Parse<Planned> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let req = match parse(buf, &mut fields) {
        Parse::Done(r) => r,
        Parse::Partial | Parse::BodyPending => return Parse::Partial,
        Parse::Fallback(why) => return Parse::Fallback(why),
    };
    let (up_index, up) = match route(snap, role, &req) {
        Ok(found) => found,
        Err(why) => return Parse::Fallback(why),
    };
    // A 400 (a bad deadline or idempotency key) is the general path's to
    // answer, from the same bytes.
    let Ok(asked) = request::read(&up.config, &req) else {
        return Parse::Fallback("a request weir refuses");
    };
    let cap = up.config.retry.max_replay_body_bytes.min(MAX_BODY);
    let body_len = if req.chunked {
        match chunked_end(&buf[req.head_len..], cap) {
            Parse::Done(n) => n as u64,
            Parse::Partial | Parse::BodyPending => return Parse::BodyPending,
            Parse::Fallback(why) => return Parse::Fallback(why),
        }
    } else {
        req.content_length.unwrap_or(0)
    };
    if body_len > cap {
        return Parse::Fallback("a body too large to hold");
    }
    let cache = match up.config.cache {
        None => crate::proxy::cached::Cached::Off,
        Some(_) => {
            let target = cache::RequestTarget {
                method: req.method,
                authority: req.authority,
                host: req.host,
                path_and_query: req.path_and_query,
            };
            cache::visit(up, &target, asked.key.is_some(), req.fields)
        }
    };
    if body_len > MAX_TLS_BODY && up.client.fast_tls.is_some() {
        // Over TLS the fast path cannot hear an upstream that answers (413,
        // 401) before reading a large body; hyper's client does.
        return Parse::Fallback("a large body to a TLS upstream");
    }
    let trace = crate::proxy::traced::begin(snap, up, &req, asked.lowered, "1.1");
    write(up, &req, &asked, trace.as_ref(), out);
    let validators_len = cache::add_validators(&cache, out);
    let h2 = match up.h2 {
        false => None,
        true => match h2::request_parts(up, out) {
            Some(parts) => Some(Box::new(parts)),
            None => {
                if let Some(t) = &trace {
                    t.discard();
                }
                return Parse::Fallback("a head the HTTP/2 request cannot carry");
            }
        },
    };
    let idem = asked.key.as_ref().map(|_| Keyed {
        method: range_in(buf, req.method.as_bytes()),
        target: range_in(buf, req.path_and_query.as_bytes()),
    });
    let data_len = if req.chunked {
        let start = req.head_len;
        h1::rechunk(&buf[start..start + body_len as usize], out)
    } else {
        body_len
    };
    let body = if data_len == 0 {
        crate::policy::BodyFacts::Empty
    } else {
        crate::policy::BodyFacts::Buffered { len: data_len }
    };
    Parse::Done(Planned {
        upstream: up_index,
        head_len: req.head_len,
        body_len: body_len as usize,
        chunked: req.chunked,
        facts: RequestFacts {
            caller: asked.caller,
            ..RequestFacts::new(req.method, asked.carries_key, body)
        },
        keyed_write: asked.carries_key && !crate::policy::is_idempotent_method(req.method),
        is_head_request: req.method == "HEAD",
        close: req.connection.close,
        asked,
        idem,
        cache,
        validators_len,
        trace,
        h2,
    })
}

/// Where a chunked body at the start of `rest` ends: after its last
/// chunk's line and an empty trailer section. A body with trailers, one that
/// is not valid chunked coding (hyper answers it) or one larger than `cap`
/// is not the fast path's.
fn chunked_end(rest: &[u8], cap: u64) -> Parse<usize> {
    let mut chunks = h1::Chunked::until_trailers();
    let last = match chunks.feed(rest) {
        Ok(Some(n)) => n,
        Ok(None) if rest.len() as u64 > cap => return Parse::Fallback("a body too large to hold"),
        Ok(None) => return Parse::BodyPending,
        Err(_) => return Parse::Fallback("invalid chunked coding"),
    };
    match rest.get(last..last + 2) {
        Some(b"\r\n") => Parse::Done(last + 2),
        Some(_) => Parse::Fallback("a chunked body with trailers"),
        None if rest.get(last) == Some(&b'\n') => Parse::Fallback("a bare LF after the last chunk"),
        None => Parse::BodyPending,
    }
}

/// Parses the client's head: the request line, and one pass over the
/// fields for framing ([`h1`]), routing and hygiene. Anything the fast path
/// does not serve falls back with its reason.
fn parse<'h, 'b>(buf: &'b [u8], fields: &'h mut [httparse::Header<'b>]) -> Parse<Request<'h, 'b>> {
    let mut req = httparse::Request::new(fields);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parse::Partial,
        Err(_) => return Parse::Fallback("the head does not parse"),
    };
    let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else {
        return Parse::Fallback("not HTTP/1.1");
    };
    if method == "CONNECT" {
        return Parse::Fallback("CONNECT");
    }
    if !target.bytes().all(|b| TARGET[b as usize]) {
        return Parse::Fallback("a target with bytes the fast path does not pass");
    }
    // The target: origin form, or the absolute form an HTTP_PROXY client sends.
    let (authority, path_and_query) = if target.starts_with('/') {
        (None, target)
    } else if target.len() > 7 && target.as_bytes()[..7].eq_ignore_ascii_case(b"http://") {
        let rest = &target[7..];
        match rest.find('/') {
            Some(i) => (Some(&rest[..i]), &rest[i..]),
            None => return Parse::Fallback("an absolute target without a path"),
        }
    } else {
        return Parse::Fallback("a target in neither origin nor absolute form");
    };
    if authority.is_some_and(|a| a.is_empty() || a.contains(['?', '#', '@'])) {
        // With userinfo, the general path answers 400.
        return Parse::Fallback("an unusual authority");
    }
    let path = path_and_query
        .split_once('?')
        .map_or(path_and_query, |(p, _)| p);

    let mut host: Option<&str> = None;
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut connection = ConnectionField::default();
    let mut te_trailers = false;
    for h in req.headers.iter() {
        let n = h.name;
        if eq(n, "content-length") {
            let Some(len) = h1::content_length(h.value) else {
                return Parse::Fallback("an invalid Content-Length");
            };
            if content_length.is_some() {
                return Parse::Fallback("more than one Content-Length");
            }
            content_length = Some(len);
        } else if eq(n, "host") {
            if host.is_some() {
                return Parse::Fallback("more than one Host");
            }
            match std::str::from_utf8(h.value) {
                // the general path answers 400.
                Ok(v) if v.contains('@') => return Parse::Fallback("a Host with userinfo"),
                Ok(v) => host = Some(v.trim()),
                Err(_) => return Parse::Fallback("a Host that is not text"),
            }
        } else if eq(n, "connection") {
            connection.add(h.value);
        } else if eq(n, "transfer-encoding") {
            if chunked || !h.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Parse::Fallback("a Transfer-Encoding other than one chunked");
            }
            chunked = true;
        } else if eq(n, "upgrade") {
            return Parse::Fallback("an upgrade");
        } else if eq(n, "expect") {
            return Parse::Fallback("Expect");
        } else if eq(n, "te") {
            te_trailers |= h1::has_token(h.value, b"trailers");
        } else if eq(n, "grpc-timeout")
            || (eq(n, "content-type") && request::grpc_content_type(h.value))
        {
            return Parse::Fallback("gRPC");
        }
    }
    if chunked && content_length.is_some() {
        return Parse::Fallback("Content-Length beside Transfer-Encoding");
    }
    if connection.upgrade || connection.overflow {
        return Parse::Fallback("an unusual Connection field");
    }
    Parse::Done(Request {
        method,
        authority,
        path,
        path_and_query,
        host,
        content_length,
        chunked,
        connection,
        te_trailers,
        head_len,
        fields: req.headers,
    })
}

/// The upstream a parsed request goes to, if the fast path speaks to it.
fn route<'s>(
    snap: &'s Snapshot,
    role: &ListenerRole,
    req: &Request<'_, '_>,
) -> Result<(usize, &'s Upstream), &'static str> {
    let index = request::route(snap, role, req).ok_or("no route")?;
    let up = snap.upstreams.get(index).ok_or("no upstream")?;
    // HTTP/1.1 on connections of its own, or HTTP/2 through the
    // upstream's pool (`protocol = "h2c"`; `grpc` upstreams' requests stay
    // on the general path).
    let h2c = up.h2 && up.config.protocol == crate::config::Protocol::H2c;
    if !(up.own_h1 || h2c) || !up.endpoints.ready() {
        // TLS without `protocol = "http1"`, or a name not resolved yet.
        return Err("an upstream the fast path does not speak to");
    }
    if up.h2 && req.te_trailers {
        // hyper's server relays the trailers such a client asked for.
        return Err("trailers asked of an HTTP/2 upstream");
    }
    Ok((index, up))
}

/// Writes the upstream's head to `out` (which it clears first): the
/// request line with the mapped target, the client's fields but those
/// [`request::dropped`] and those its `Connection` names, `Host`, the
/// framing restated.
/// A traced request's `traceparent` (weir's, rewritten per attempt) goes
/// last, in place of the client's and any `b3`.
fn write(
    up: &Upstream,
    req: &Request<'_, '_>,
    asked: &Parsed,
    trace: Option<&crate::trace::Trace>,
    out: &mut Vec<u8>,
) {
    let cfg = &up.config;
    out.clear();
    out.extend_from_slice(req.method.as_bytes());
    out.push(b' ');
    write_target(up, req.path, req.path_and_query, out);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for h in req.fields.iter() {
        let n = h.name;
        if eq(n, "host")
            || eq(n, "content-length")
            || request::dropped(n)
            || req.connection.names(n)
            || (trace.is_some() && crate::proxy::traced::replaced(n))
            || (matches!(asked.request_id, request::RequestId::Made(_))
                && eq(n, request::REQUEST_ID_FIELD))
        {
            continue;
        }
        header(out, n.as_bytes(), h.value);
    }
    let host_value = if cfg.preserve_host {
        req.authority.or(req.host).map(str::as_bytes)
    } else {
        Some(up.host.as_bytes())
    };
    if let Some(v) = host_value {
        header(out, b"host", v);
    }
    if let Some(len) = req.content_length {
        out.extend_from_slice(b"content-length: ");
        push_u64(out, len);
        out.extend_from_slice(b"\r\n");
    } else if req.chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if req.te_trailers {
        // Hop-by-hop: its sender names it in `Connection` (RFC 9110 §10.1.4).
        out.extend_from_slice(b"te: trailers\r\nconnection: te\r\n");
    }
    // The id weir made when the client sent none it can be known by, in
    // place of what it sent (docs/reference/logs.md#logs).
    if let Some(id) = asked.request_id.made_bytes(&mut [0u8; 32]) {
        header(out, request::REQUEST_ID_FIELD.as_bytes(), id);
    }
    if let Some(t) = trace {
        out.extend_from_slice(&crate::trace::context::head_field(&t.traceparent()));
        if let Some(state) = t.tracestate() {
            header(
                out,
                crate::trace::context::TRACESTATE.as_bytes(),
                state.as_bytes(),
            );
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes the upstream's request target (origin form), mapped as
/// [`upstream_path`] maps it; the query as sent.
fn write_target(up: &Upstream, path: &str, path_and_query: &str, out: &mut Vec<u8>) {
    let cfg = &up.config;
    if cfg.url.base_path.is_empty() && !cfg.strip_prefix {
        out.extend_from_slice(path_and_query.as_bytes());
        return;
    }
    let (base, slash, rest) = upstream_path(cfg, path);
    out.extend_from_slice(base.as_bytes());
    out.extend_from_slice(slash.as_bytes());
    out.extend_from_slice(rest.as_bytes());
    if let Some((_, q)) = path_and_query.split_once('?') {
        out.push(b'?');
        out.extend_from_slice(q.as_bytes());
    }
}

/// Writes one field line, `name: value`.
#[inline]
pub fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

pub(super) fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(crate::proxy::headers::decimal(n, &mut [0u8; 20]));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::StopReason;

    #[test]
    fn chunked_bodies_end_where_they_end() {
        let body =
            b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-t: 1\r\nx-weir-attempts: 9\r\n\r\nNEXT";
        let relayed = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-t: 1\r\n\r\n";
        // Whole, and one byte at a time: the same end, the same bytes out,
        // without the forged trailer.
        let mut r = ChunkedRelay::default();
        let mut out = Vec::new();
        assert_eq!(r.feed(body, &mut out), Ok(Some(body.len() - 4)));
        assert_eq!(out, relayed);
        let mut r = ChunkedRelay::default();
        let mut out = Vec::new();
        let mut end = None;
        for (i, b) in body.iter().enumerate() {
            if let Some(n) = r.feed(std::slice::from_ref(b), &mut out).unwrap() {
                end = Some(i + n);
                break;
            }
        }
        assert_eq!(end, Some(body.len() - 4));
        assert_eq!(out, relayed);
        let mut out = Vec::new();
        assert_eq!(
            ChunkedRelay::default().feed(b"0\r\n\r\n", &mut out),
            Ok(Some(5))
        );
        for bad in [&b"zz\r\n"[..], b"5\r\nhelloXX", b"1ffffffffffffffff\r\n"] {
            assert!(ChunkedRelay::default().feed(bad, &mut Vec::new()).is_err());
        }
    }

    fn parse(b: &[u8], is_head_request: bool) -> Result<Option<Head<'_>>, &'static str> {
        parse_response(
            b,
            is_head_request,
            || std::time::UNIX_EPOCH,
            &mut Vec::new(),
        )
    }

    #[test]
    fn response_framing_follows_rfc_9112() {
        let p = |s: &str, head: bool| match parse(s.as_bytes(), head) {
            Ok(Some(Head::Final(r))) => (r.framing, r.reusable),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            p("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false),
            (Framing::Length(2), true)
        );
        assert_eq!(
            p("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", true),
            (Framing::Empty, true)
        );
        assert_eq!(
            p(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
                false
            ),
            (Framing::Chunked, true)
        );
        assert_eq!(
            p("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", false),
            (Framing::Close, false)
        );
        assert_eq!(
            p("HTTP/1.1 204 No Content\r\n\r\n", false),
            (Framing::Empty, true)
        );
        assert_eq!(
            p(
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
                false
            ),
            (Framing::Length(0), false)
        );
        assert_eq!(
            p("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", false),
            (Framing::Length(0), false)
        );
        assert_eq!(
            p(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
                false
            ),
            (Framing::Chunked, false)
        );
        assert_eq!(
            parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200", false),
            Ok(Some(Head::Interim(25)))
        );
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\n", false), Ok(None));
        assert!(parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            false
        )
        .is_err());
        assert!(parse(b"HTTP/1.1 101 Switching\r\n\r\n", false).is_err());
        assert!(parse(b"garbage\r\n\r\n", false).is_err());
    }

    #[test]
    fn the_client_head_is_clean_and_annotated() {
        let raw = "HTTP/1.1 503 Busy\r\ndate: Sun, 29 Nov 2026 19:00:00 GMT\r\nconnection: x-private\r\nx-private: 1\r\n\
                   x-weir-attempts: 99\r\ntransfer-encoding: chunked\r\nretry-after: 1\r\n\
                   keep-alive: timeout=5\r\nx-app: yes\r\n\r\n";
        let mut out = b"left over".to_vec();
        let later = || std::time::UNIX_EPOCH;
        let Ok(Some(Head::Final(r))) = parse_response(raw.as_bytes(), false, later, &mut out)
        else {
            panic!()
        };
        assert_eq!(r.retry_after, Some("1"));
        let a = Annotations {
            attempts: 2,
            stop: Some(StopReason::Budget),
            hedge: None,
        };
        finish_response(&mut out, Some(a), true);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            "HTTP/1.1 503 Busy\r\ndate: Sun, 29 Nov 2026 19:00:00 GMT\r\nretry-after: 1\r\nx-app: yes\r\n\
             transfer-encoding: chunked\r\nx-weir-attempts: 2\r\n\
             x-weir-retry-stop: budget\r\nconnection: close\r\n\r\n"
        );
    }

    /// The kept fields as one block from the head's range are the ones the
    /// line-by-line filter keeps: framing restated after them, `Date` added
    /// within them; an upstream's `Idempotent-Replayed` means no range.
    #[test]
    fn the_kept_block_is_the_filtered_head() {
        let later = || std::time::UNIX_EPOCH;
        for (raw, plain) in [
            ("HTTP/1.1 201 Created\r\ncontent-type: a/b\r\ncontent-length: 2\r\nx-id: 7\r\n\r\n", true),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\nx-weir-x: 1\r\nx: y\r\n\r\n", true),
            ("HTTP/1.1 204 No Content\r\ndate: Sun, 29 Nov 2026 19:00:00 GMT\r\n\r\n", true),
            ("HTTP/1.1 200 OK\r\nidempotent-replayed: true\r\nx: y\r\ncontent-length: 0\r\n\r\n", false),
        ] {
            let mut out = Vec::new();
            let Ok(Some(Head::Final(r))) = parse_response(raw.as_bytes(), false, later, &mut out)
            else {
                panic!("{raw}")
            };
            assert_eq!(r.kept.is_some(), plain, "{raw}");
            let filtered = fields(&out, None, 0);
            assert_eq!(fields(&out, r.kept, 9), filtered, "{raw}");
            let text = String::from_utf8(filtered).unwrap();
            assert!(text.contains("date: ") && !text.contains("content-length"), "{text}");
            assert!(!text.contains("idempotent-replayed") && !text.contains("x-weir"), "{text}");
        }
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0u64, 7, 10, 65536, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }
}
