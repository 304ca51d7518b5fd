//! HTTP/1.1 message framing (RFC 9112 §6–§7), written once for every place
//! weir follows HTTP/1 bytes itself: the request-smuggling guard in front of
//! hyper (`proxy::general::guard`) and the fast path (`proxy::fast`), on requests and
//! responses alike.
//!
//! Where a message ends is the request-smuggling boundary: two parsers that
//! disagree about it are the vulnerability. So the rules here are hyper's —
//! the parser that finally reads every request on the general path — byte
//! for byte: `Content-Length` is digits only (no sign, no list, no overflow),
//! several must agree; a `Transfer-Encoding` whose last coding is not
//! `chunked` is refused on a request; the chunked coding accepts exactly what
//! hyper's decoder accepts (hex size, optional whitespace, extensions up to
//! 16 KiB without a bare LF, CRLF everywhere, trailers up to 16 KiB). The
//! property tests (`tests/framing_props.rs`) hold this module against hyper
//! on arbitrary messages. See docs/reference/protocols.md#protocols.
//!
//! It also holds the field lists both directions share: [`HOP_BY_HOP`],
//! and what a trailer section may carry over either protocol
//! ([`allowed_in_trailers`], docs/reference/routing.md#header-hygiene).

/// Longest run of chunk extensions hyper accepts in one body.
const EXTENSIONS_LIMIT: u64 = 16 * 1024;
/// Longest trailer section hyper accepts.
const TRAILERS_LIMIT: usize = 16 * 1024;
/// Most trailer fields hyper accepts (its `max_headers`).
const TRAILERS_COUNT: usize = 100;

/// A `tchar` of RFC 9110 §5.6.2: what a field name is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A `Content-Length` value: 1*DIGIT, no sign, no spaces, no list, and no
/// larger than `u64`.
pub fn content_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |n, b| match b {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(b - b'0')),
        _ => None,
    })
}

/// A response's `Content-Length` value as hyper's client reads it: a list
/// of equal lengths (`2, 2`) is that length (RFC 9110 §8.6 lets a recipient
/// take it so); anything else is what [`content_length`] takes. weir
/// restates it as one value to the client.
pub fn content_length_list(v: &[u8]) -> Option<u64> {
    let mut values = v
        .split(|b| *b == b',')
        .map(|v| content_length(v.trim_ascii()));
    let first = values.next()??;
    values.all(|v| v == Some(first)).then_some(first)
}

/// The elements of a comma-separated field value (`Connection`, `TE`,
/// `Transfer-Encoding`), trimmed of spaces; empty elements included.
pub fn tokens(v: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    v.split(|b| *b == b',').map(|t| t.trim_ascii())
}

/// Whether a comma-separated field value lists `token` (ASCII
/// case-insensitive): `Connection: close`, `TE: trailers`.
pub fn has_token(v: &[u8], token: &[u8]) -> bool {
    tokens(v).any(|t| t.eq_ignore_ascii_case(token))
}

/// Fields that concern only the connection they came on (RFC 9110
/// §7.6.1), plus the proxy credentials meant for weir itself: never
/// forwarded as they came, in either direction, in a head or in a trailer
/// section (besides those a `Connection` field names, and
/// `Transfer-Encoding`, which each side frames itself). `Trailer` is end to
/// end (RFC 9110 §6.6.2) and stays in a head: hyper only sends the trailer
/// fields it announces.
pub const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "upgrade",
];

/// Fields a trailer section must not carry (RFC 9110 §6.5.1): those that
/// frame, route, authenticate or control the message, and `Trailer` itself.
const NOT_IN_TRAILERS: [&str; 11] = [
    "authorization",
    "cache-control",
    "content-encoding",
    "content-length",
    "content-range",
    "content-type",
    "host",
    "max-forwards",
    "set-cookie",
    "trailer",
    "transfer-encoding",
];

/// Whether a field may go on in a trailer section weir forwards: a
/// request's to its upstream or a response's to its client, from and to
/// either protocol (docs/reference/routing.md#header-hygiene). Not a
/// [`HOP_BY_HOP`] field, one of [`NOT_IN_TRAILERS`], or an `x-weir-*`
/// one; names compare without case and with `_` read as `-`
/// (`Content_Length`, as CGI-style servers map it). The others are
/// dropped, never made an error: HTTP/2 forbids a connection's own fields
/// (RFC 9113 §8.2.2), and h2 refuses to send a trailer section holding one,
/// which would reset a stream whose body has gone out.
pub fn allowed_in_trailers(name: &str) -> bool {
    let fold = |b: u8| match b {
        b'_' => b'-',
        b => b.to_ascii_lowercase(),
    };
    let is =
        |f: &str| f.len() == name.len() && f.bytes().zip(name.bytes()).all(|(a, b)| a == fold(b));
    let weir = name.len() >= 7
        && b"x-weir-"
            .iter()
            .zip(name.bytes())
            .all(|(a, b)| *a == fold(b));
    !(weir || HOP_BY_HOP.iter().chain(&NOT_IN_TRAILERS).any(|f| is(f)))
}

/// A trailer section with only the fields [`allowed_in_trailers`] lets
/// through, every value of each kept in order.
pub fn filter_trailers(t: http::HeaderMap) -> http::HeaderMap {
    if t.keys().all(|n| allowed_in_trailers(n.as_str())) {
        return t;
    }
    let mut out = http::HeaderMap::with_capacity(t.len());
    for name in t.keys().filter(|n| allowed_in_trailers(n.as_str())) {
        for v in t.get_all(name) {
            out.append(name.clone(), v.clone());
        }
    }
    out
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked`.
pub fn ends_chunked(v: &[u8]) -> bool {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// `Content-Length` (0 when there is none).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Both `Transfer-Encoding` and `Content-Length`: hyper would drop the
    /// length and read chunks, a proxy in front of weir may have framed the
    /// bytes by the length. weir refuses it (RFC 9112 §6.1).
    Conflict,
    /// A message hyper answers with 400: an invalid or disagreeing
    /// `Content-Length`, a `Transfer-Encoding` that does not end in
    /// `chunked`, or one on HTTP/1.0.
    Invalid(&'static str),
}

/// Frames a request from its header fields, in order (`http11`: the request
/// line said HTTP/1.1).
pub fn request_framing<'a>(
    http11: bool,
    fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> RequestFraming {
    let mut length: Option<u64> = None;
    let mut te = false;
    let mut chunked = false;
    let mut cl = false;
    for (name, value) in fields {
        if name.eq_ignore_ascii_case("transfer-encoding") {
            if !http11 {
                return RequestFraming::Invalid("Transfer-Encoding on HTTP/1.0");
            }
            te = true;
            // The last field decides, as in hyper.
            chunked = ends_chunked(value);
        } else if name.eq_ignore_ascii_case("content-length") {
            cl = true;
            // hyper's largest body length is u64::MAX − 2 (the two above are
            // its markers for chunked and close-delimited).
            let Some(n) = content_length(value).filter(|n| *n <= u64::MAX - 2) else {
                return RequestFraming::Invalid("an invalid Content-Length");
            };
            if length.is_some_and(|l| l != n) {
                return RequestFraming::Invalid("Content-Lengths that disagree");
            }
            length = Some(n);
        }
    }
    match (te, cl) {
        (true, true) => RequestFraming::Conflict,
        (true, false) if chunked => RequestFraming::Chunked,
        (true, false) => {
            RequestFraming::Invalid("a Transfer-Encoding that does not end in chunked")
        }
        (false, _) => RequestFraming::Length(length.unwrap_or(0)),
    }
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: HEAD, 204, 304.
    Empty,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// Where the body of a final response ends (RFC 9112 §6.3), from the
/// request's method (`HEAD`), the status, its `Transfer-Encoding` (`Some`:
/// present; `true`: its last coding is `chunked`) and its `Content-Length`;
/// and whether its connection may carry another request after it, as far
/// as its framing goes (`Connection: close` and HTTP/1.0 are the
/// caller's). A message framed two ways is not reused: the next response
/// could be read from the wrong place.
pub fn response_framing(
    is_head_request: bool,
    status: u16,
    chunked: Option<bool>,
    length: Option<u64>,
) -> (Framing, bool) {
    let framing = if is_head_request || status == 204 || status == 304 {
        Framing::Empty
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::Close,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        }
    };
    let reusable = framing != Framing::Close && !(chunked.is_some() && length.is_some());
    (framing, reusable)
}

/// Where [`Chunked::feed`] reports the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// After the last chunk's line (`0\r\n`): the trailer section is the
    /// caller's (the fast path filters it).
    LastChunk,
    /// After the trailer section's final CRLF: the whole message.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Body,
    BodyCr,
    BodyLf,
    EndCr,
    /// In a trailer field's name.
    TrailerName,
    /// In a trailer field's value.
    Trailer,
    TrailerLf,
    EndLf,
    End,
}

/// The chunked transfer coding, followed byte by byte as it passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunked {
    state: ChunkState,
    size: u64,
    extensions: u64,
    trailers: usize,
    fields: usize,
    until: Until,
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked::whole()
    }
}

/// What [`Chunked::step`] found in the bytes it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkStep {
    /// `len` bytes of chunk data start at `at` (what comes before is
    /// coding); the bytes after them are not looked at yet.
    Data { at: usize, len: usize },
    /// Every byte was coding, and the body goes on.
    More,
    /// The body ended after this many bytes.
    Ended(usize),
}

/// Why a chunked body is not valid (hyper refuses the same bytes).
pub const BAD_CHUNKED: &str = "invalid chunked coding";

impl Chunked {
    /// Follows a whole chunked body, trailers included.
    pub fn whole() -> Self {
        Chunked::new(Until::End)
    }

    /// Follows the chunks up to and including the last chunk's line; the
    /// trailer section is left to the caller.
    pub fn until_trailers() -> Self {
        Chunked::new(Until::LastChunk)
    }

    fn new(until: Until) -> Self {
        Chunked {
            state: ChunkState::Start,
            size: 0,
            extensions: 0,
            trailers: 0,
            fields: 0,
            until,
        }
    }

    /// Consumes `bytes`. `Ok(Some(n))`: it ended after the first `n` of them;
    /// `Ok(None)`: more is to come; `Err`: not valid chunked coding.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, &'static str> {
        let mut at = 0;
        loop {
            match self.step(&bytes[at..])? {
                ChunkStep::Data { at: from, len } => at += from + len,
                ChunkStep::More => return Ok(None),
                ChunkStep::Ended(n) => return Ok(Some(at + n)),
            }
        }
    }

    /// Consumes `bytes` up to the first run of chunk data in them, for a
    /// reader that takes the data out ([`ChunkStep`]); the coding around it is
    /// checked as [`Chunked::feed`] checks it.
    pub fn step(&mut self, bytes: &[u8]) -> Result<ChunkStep, &'static str> {
        use ChunkState::*;
        let mut i = 0;
        while i < bytes.len() {
            if self.state == Body {
                let take = self.size.min((bytes.len() - i) as u64);
                self.size -= take;
                if self.size == 0 {
                    self.state = BodyCr;
                }
                return Ok(ChunkStep::Data {
                    at: i,
                    len: take as usize,
                });
            }
            let b = bytes[i];
            i += 1;
            self.state = match (self.state, b) {
                (Start | Size, b) if b.is_ascii_hexdigit() => {
                    let d = u64::from((b as char).to_digit(16).unwrap_or(0));
                    self.size = self
                        .size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(d))
                        .ok_or(BAD_CHUNKED)?;
                    Size
                }
                (Size | SizeLws, b'\t' | b' ') => SizeLws,
                (Size | SizeLws, b';') => Extension,
                (Size | SizeLws | Extension, b'\r') => SizeLf,
                (Extension, b'\n') => return Err(BAD_CHUNKED),
                (Extension, _) => {
                    self.extensions += 1;
                    if self.extensions >= EXTENSIONS_LIMIT {
                        return Err(BAD_CHUNKED);
                    }
                    Extension
                }
                (SizeLf, b'\n') if self.size == 0 => {
                    if self.until == Until::LastChunk {
                        self.state = EndCr;
                        return Ok(ChunkStep::Ended(i));
                    }
                    EndCr
                }
                (SizeLf, b'\n') => Body,
                (BodyCr, b'\r') => BodyLf,
                (BodyLf, b'\n') => Start,
                (EndCr, b'\r') => EndLf,
                // A trailer field, `name: value`, as hyper (httparse) reads
                // it at the end: a token, a colon, visible text.
                (EndCr | TrailerName | Trailer, b) => {
                    self.trailers += 1;
                    if self.trailers > TRAILERS_LIMIT {
                        return Err(BAD_CHUNKED);
                    }
                    match (self.state, b) {
                        (EndCr, b) if is_tchar(b) => {
                            self.fields += 1;
                            if self.fields > TRAILERS_COUNT {
                                return Err(BAD_CHUNKED);
                            }
                            TrailerName
                        }
                        (TrailerName, b) if is_tchar(b) => TrailerName,
                        (TrailerName, b':') => Trailer,
                        (Trailer, b'\r') => TrailerLf,
                        (Trailer, b'\t' | 0x20..=0x7e | 0x80..=0xff) => Trailer,
                        _ => return Err(BAD_CHUNKED),
                    }
                }
                (TrailerLf, b'\n') => EndCr,
                (EndLf, b'\n') => {
                    self.state = End;
                    return Ok(ChunkStep::Ended(i));
                }
                _ => return Err(BAD_CHUNKED),
            };
        }
        Ok(ChunkStep::More)
    }

    /// Whether the end has been reported.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::End
            || (self.until == Until::LastChunk && self.state == ChunkState::EndCr)
    }
}

/// The data of a chunked body that [`Chunked`] has followed (so it is known
/// to be valid), chunk by chunk; after the last one, [`Chunks::rest`] is
/// what follows the last chunk's line (the trailer section). Bytes that
/// were never followed end it rather than panic.
#[derive(Debug)]
pub struct Chunks<'a> {
    body: &'a [u8],
    at: usize,
    ended: bool,
}

impl<'a> Chunks<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        Chunks {
            body,
            at: 0,
            ended: false,
        }
    }

    /// What follows the last chunk's line, once the iterator has ended.
    pub fn rest(&self) -> &'a [u8] {
        self.body.get(self.at..).unwrap_or_default()
    }
}

impl<'a> Iterator for Chunks<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.ended {
            return None;
        }
        let body = self.body;
        let mut at = self.at;
        let mut size = 0u64;
        while let Some(d) = body.get(at).and_then(|b| (*b as char).to_digit(16)) {
            size = size.saturating_mul(16).saturating_add(u64::from(d));
            at += 1;
        }
        // Past whitespace and extensions to the end of the size line.
        let lf = body
            .get(at..)
            .and_then(|r| r.iter().position(|b| *b == b'\n'));
        let chunk = lf.and_then(|lf| {
            let from = at + lf + 1;
            let n = usize::try_from(size).ok()?;
            Some((from, body.get(from..from.checked_add(n)?)?))
        });
        match chunk {
            Some((from, c)) if !c.is_empty() => {
                // Past the chunk and its CRLF.
                self.at = from + c.len() + 2;
                Some(c)
            }
            Some((from, _)) => {
                self.at = from;
                self.ended = true;
                None
            }
            None => {
                self.at = body.len();
                self.ended = true;
                None
            }
        }
    }
}

/// Appends the data of a chunked body that [`Chunked`] has followed to its
/// last chunk's line to `out`, coded anew: each chunk's size in lowercase
/// hex without extensions, then the last chunk and an empty trailer
/// section. What reaches the upstream is the plainest form of the coding,
/// whatever leniency the client's took. Returns the length of the data.
pub fn rechunk(body: &[u8], out: &mut Vec<u8>) -> u64 {
    let mut data = 0u64;
    for chunk in Chunks::new(body) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
        data += chunk.len() as u64;
    }
    out.extend_from_slice(b"0\r\n\r\n");
    data
}

/// The data of a whole chunked body that [`Chunked`] has followed, and
/// whether it carried trailer fields.
pub fn chunk_data(body: &[u8]) -> (Vec<u8>, bool) {
    let mut chunks = Chunks::new(body);
    let mut data = Vec::new();
    for c in chunks.by_ref() {
        data.extend_from_slice(c);
    }
    let trailers = !matches!(chunks.rest(), b"" | b"\r\n");
    (data, trailers)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_trailer_section_keeps_only_what_it_may_carry() {
        for ok in [
            "grpc-status",
            "x-checksum",
            "server-timing",
            "x-weird",
            "digest",
        ] {
            assert!(allowed_in_trailers(ok), "{ok}");
        }
        for no in [
            "content-length",
            "Content_Length",
            "host",
            "authorization",
            "set-cookie",
            "transfer-encoding",
            "connection",
            "te",
            "keep-alive",
            "upgrade",
            "proxy-authorization",
            "trailer",
            "x-weir-attempts",
            "X_Weir_Error",
        ] {
            assert!(!allowed_in_trailers(no), "{no}");
        }
        let mut t = http::HeaderMap::new();
        t.append("x-checksum", http::HeaderValue::from_static("a"));
        t.append("connection", http::HeaderValue::from_static("close"));
        t.append("x-checksum", http::HeaderValue::from_static("b"));
        let kept = filter_trailers(t);
        assert_eq!(kept.len(), 2);
        let values: Vec<_> = kept.get_all("x-checksum").iter().collect();
        assert_eq!(values, ["a", "b"]);
    }

    #[test]
    fn chunked_bodies_are_coded_anew() {
        let body = b"5 ;a=b\r\nhello\r\n00006\r\n world\r\n0\r\n";
        let mut c = Chunked::until_trailers();
        assert_eq!(c.feed(body), Ok(Some(body.len())));
        let mut out = Vec::new();
        assert_eq!(rechunk(body, &mut out), 11);
        assert_eq!(out, b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
        let mut out = Vec::new();
        assert_eq!(rechunk(b"0\r\n", &mut out), 0);
        assert_eq!(out, b"0\r\n\r\n");
        let (data, trailers) = chunk_data(b"5\r\nhello\r\n0\r\n\r\n");
        assert_eq!((&data[..], trailers), (&b"hello"[..], false));
        let (data, trailers) = chunk_data(b"1\r\nx\r\n0\r\nx-sum: 1\r\n\r\n");
        assert_eq!((&data[..], trailers), (&b"x"[..], true));
        // Bytes that were never followed end it rather than panic.
        let mut out = Vec::new();
        assert_eq!(rechunk(b"ff\r\nshort", &mut out), 0);
        assert_eq!(out, b"0\r\n\r\n");
    }

    #[test]
    fn content_length_is_digits_only() {
        assert_eq!(content_length(b"0"), Some(0));
        assert_eq!(content_length(b"1234"), Some(1234));
        for bad in [
            &b""[..],
            b"+5",
            b"-5",
            b" 5",
            b"5 ",
            b"5,5",
            b"0x5",
            b"99999999999999999999",
        ] {
            assert_eq!(
                content_length(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn response_lengths_may_be_lists_of_one_value() {
        assert_eq!(content_length_list(b"2, 2"), Some(2));
        assert_eq!(content_length_list(b"2,2,2"), Some(2));
        assert_eq!(content_length_list(b"7"), Some(7));
        for bad in [&b"2, 3"[..], b"", b",", b"2,", b"+2, 2"] {
            assert_eq!(content_length_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn requests_are_framed_as_hyper_frames_them() {
        use RequestFraming::*;
        let f = |fields: &[(&str, &str)]| {
            request_framing(true, fields.iter().map(|(n, v)| (*n, v.as_bytes())))
        };
        assert_eq!(f(&[]), Length(0));
        assert_eq!(f(&[("Content-Length", "5")]), Length(5));
        assert_eq!(
            f(&[("content-length", "5"), ("content-length", "5")]),
            Length(5)
        );
        assert!(matches!(
            f(&[("content-length", "5"), ("content-length", "6")]),
            Invalid(_)
        ));
        assert!(matches!(f(&[("content-length", "+5")]), Invalid(_)));
        assert_eq!(f(&[("Transfer-Encoding", "gzip, chunked")]), Chunked);
        assert!(matches!(
            f(&[("transfer-encoding", "chunked, gzip")]),
            Invalid(_)
        ));
        // The last Transfer-Encoding field decides.
        assert!(matches!(
            f(&[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "gzip")
            ]),
            Invalid(_)
        ));
        assert_eq!(
            f(&[("transfer-encoding", "chunked"), ("content-length", "3")]),
            Conflict
        );
        assert!(matches!(
            request_framing(false, [("transfer-encoding", &b"chunked"[..])]),
            Invalid(_)
        ));
    }

    fn whole(bytes: &[u8]) -> Result<Option<usize>, &'static str> {
        Chunked::whole().feed(bytes)
    }

    #[test]
    fn chunked_bodies_end_where_they_end() {
        let body = b"5;name=v\r\nhello\r\n0\r\nx-t: 1\r\n\r\nGET";
        assert_eq!(whole(body), Ok(Some(body.len() - 3)));
        assert_eq!(whole(b"A \t;x\r\n0123456789\r\n0\r\n\r\n"), Ok(Some(24)));
        let mut c = Chunked::until_trailers();
        assert_eq!(c.feed(b"3\r\nabc\r\n0\r\nx-t: 1\r\n\r\n"), Ok(Some(11)));
        assert!(c.is_done());
        // Split at every byte.
        let mut c = Chunked::whole();
        let mut end = None;
        for (i, b) in body.iter().enumerate() {
            if let Some(n) = c.feed(std::slice::from_ref(b)).unwrap() {
                end = Some(i + n);
                break;
            }
        }
        assert_eq!(end, Some(body.len() - 3));
    }

    #[test]
    fn what_hyper_refuses_is_refused() {
        for bad in [
            &b"\r\n"[..],
            b"zz\r\n",
            b" 5\r\n",
            b"5 6\r\n",
            b"5\nhello",
            b"5\r\nhelloXX",
            b"5;a\nb\r\n",
            b"1ffffffffffffffff\r\n",
            b"0\r\n\r\r",
        ] {
            assert_eq!(
                whole(bad),
                Err(BAD_CHUNKED),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // More than 16 KiB of trailers; a line that is not a field.
        let mut t = b"0\r\nx: ".to_vec();
        t.extend(std::iter::repeat_n(b'a', 17 * 1024));
        assert_eq!(whole(&t), Err(BAD_CHUNKED));
        assert_eq!(whole(b"0\r\nGET / HTTP/1.1\r\n\r\n"), Err(BAD_CHUNKED));
        assert_eq!(whole(b"0\r\n x: 1\r\n\r\n"), Err(BAD_CHUNKED));
    }
}
