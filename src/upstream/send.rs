//! What one send to an upstream is, whichever pool carries it: the body
//! type weir hands to hyper, and how a send failed ([`Failure`],
//! [`SendError`]), classified once, by error type, never by message.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;

/// The largest response head weir reads from an upstream.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// The most interim (1xx) responses weir reads before one attempt's final
/// response (docs/reference/deadlines.md#deadlines-and-timeouts): one more is
/// a flood, answered `502 bad_response` and never retried. A `100
/// Continue`, a few `103 Early Hints` and a `102 Processing` a second for a
/// long operation stay far below it.
pub const MAX_INTERIM_RESPONSES: u32 = 100;

/// [`MAX_INTERIM_RESPONSES`] exceeded, as both paths say it.
pub const INTERIM_FLOOD: &str =
    "the upstream sent more than 100 interim (1xx) responses before a final one";

/// A body's error, on either side of the proxy.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type weir hands to hyper, in both directions (the request
/// side names it `proxy::body::Body`).
pub type Body = BoxBody<Bytes, BoxError>;

/// What a failed send was, from hyper's or h2's error: once, by type, never
/// by matching message strings.
pub(crate) fn classify(e: &(dyn std::error::Error + 'static)) -> SendError {
    classify_as(e, false)
}

/// [`classify`], for an error the pool has already said is a connect failure
/// (`connect`) or not.
pub(crate) fn classify_as(e: &(dyn std::error::Error + 'static), connect: bool) -> SendError {
    let tls = crate::tls::describe_failure(e);
    // A TLS failure means the upstream never processed the request,
    // even when (TLS 1.3, a missing client certificate) its alert
    // only arrives after the request was written.
    let h2 = find::<h2::Error>(e);
    if !connect && tls.is_none() && h2.is_some_and(head_refused) {
        return SendError::new(Failure::BadResponse, H2_HEAD_REFUSED);
    }
    let kind = if connect || tls.is_some() {
        Failure::Connect
    } else if h2.is_some_and(not_processed) {
        Failure::NotProcessed
    } else {
        find::<hyper::Error>(e).map_or(Failure::Reset, Failure::of)
    };
    SendError {
        kind,
        message: tls.clone().unwrap_or_else(|| root_cause(e)),
        tls: tls.is_some(),
    }
}

/// Why an HTTP/2 response head h2 refused is a 502 `bad_response`.
pub const H2_HEAD_REFUSED: &str = "the response head exceeds the 64 KiB limit, or is malformed \
     (HTTP/2: h2 reset the stream with PROTOCOL_ERROR)";
// The message names the limit in words.
const _: () = assert!(MAX_RESPONSE_HEAD == 64 * 1024);

/// Whether h2 itself reset the stream as malformed (`PROTOCOL_ERROR`, a
/// stream error of its own making, not the peer's): what it does with a
/// response head larger than `max_header_list_size` ([`MAX_RESPONSE_HEAD`];
/// RFC 9113 §6.5.2 lets a client discard a response it cannot process),
/// and with a malformed one (a field HTTP/2 forbids, no valid `:status`,
/// RFC 9113 §8.1.1). h2 says no more than that: the two look alike. Either
/// is the upstream answering badly, as an oversized or garbled HTTP/1.1
/// head is (docs/reference/responses.md#error-responses).
fn head_refused(e: &h2::Error) -> bool {
    e.is_library() && e.is_reset() && e.reason() == Some(h2::Reason::PROTOCOL_ERROR)
}

/// How an attempt failed before response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Refused, unreachable, DNS, connect timeout, TLS handshake.
    Connect,
    /// The connection closed before any of the request was written.
    NotSent,
    /// The client's request body failed (the client went away mid-upload).
    ClientBody,
    /// The connection reset or closed after the request was (partly) written.
    Reset,
    /// An HTTP/2 upstream refused the stream unprocessed: it was above the
    /// last stream id of the upstream's GOAWAY, or reset with
    /// `REFUSED_STREAM` (RFC 9113 §6.8, §8.7). The upstream is healthy and
    /// did nothing with it.
    NotProcessed,
    /// The upstream's response could not be parsed (garbled, or a head too
    /// large): it answered, badly.
    BadResponse,
}

/// Whether an HTTP/2 error says the upstream did not process the stream. h2
/// fails every stream above a received GOAWAY's last-stream-id with the
/// GOAWAY's own error (its reason, often `NO_ERROR`); streams at or below it
/// that die later fail with an I/O error instead. So a GOAWAY error from the
/// peer on a stream always means "not processed", whatever its reason.
fn not_processed(e: &h2::Error) -> bool {
    e.is_remote()
        && (e.is_go_away() || (e.is_reset() && e.reason() == Some(h2::Reason::REFUSED_STREAM)))
}

impl Failure {
    /// The failure a hyper error stands for, once the connection is up.
    pub fn of(e: &hyper::Error) -> Failure {
        if e.is_canceled() {
            // hyper handed the request back unsent (the connection closed
            // first): nothing reached the upstream.
            Failure::NotSent
        } else if e.is_user() {
            // Our side failed: the client's request body broke off.
            Failure::ClientBody
        } else if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
            Failure::BadResponse
        } else {
            Failure::Reset
        }
    }
}

#[derive(Debug, Clone)]
pub struct SendError {
    pub kind: Failure,
    pub message: String,
    /// A TLS handshake or certificate failure.
    pub tls: bool,
}

impl Failure {
    /// The outcome this failure is for the retry decision and the breaker:
    /// the one classification, on either path (docs/reference/retries.md#classifying-an-attempt).
    pub fn outcome(self) -> crate::policy::Outcome {
        use crate::policy::Outcome;
        match self {
            Failure::Connect => Outcome::ConnectFailure,
            Failure::NotSent => Outcome::Reset {
                request_sent: false,
            },
            Failure::ClientBody => Outcome::ClientGone,
            Failure::Reset => Outcome::Reset { request_sent: true },
            Failure::NotProcessed => Outcome::RefusedStream,
            Failure::BadResponse => Outcome::BadResponse,
        }
    }
}

impl SendError {
    /// A failure weir found itself (not from a hyper error).
    pub fn new(kind: Failure, message: impl Into<String>) -> Self {
        SendError {
            kind,
            message: message.into(),
            tls: false,
        }
    }

    /// A TLS handshake that failed: the upstream never saw the request.
    pub fn tls(message: impl Into<String>) -> Self {
        SendError {
            kind: Failure::Connect,
            message: message.into(),
            tls: true,
        }
    }
}

/// The first error of type `T` in `e`'s source chain.
fn find<'a, T: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(t) = c.downcast_ref::<T>() {
            return Some(t);
        }
        cur = c.source();
    }
    None
}

/// The innermost error's message: "Connection refused (os error 111)" rather
/// than "client error (Connect)".
pub(crate) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: &dyn std::error::Error = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    let msg = cur.to_string();
    if msg.is_empty() {
        e.to_string()
    } else {
        msg
    }
}
