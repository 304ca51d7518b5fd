//! How the guard judges a complete request head, and what it tells the
//! connection's service about a head it refused.

use super::{Following, Stop};
use crate::h1;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// What hyper is given in place of a head weir answers itself ([`Refusal`]):
/// a request that goes through hyper, so that weir's answer keeps its place
/// behind responses to requests pipelined before it. The request line says
/// nothing: which request it is, and why it was refused, travel out of band
/// ([`GuardVerdict`]), so a client that sends the same bytes gets no refusal.
pub(crate) const MARKER: &[u8] = b"GET / HTTP/1.1\r\n\r\n";

/// Why the guard answers a head itself, with 400 or 431 and
/// `Connection: close`, instead of letting hyper parse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Both `Content-Length` and `Transfer-Encoding` (RFC 9112 §6.1).
    FramingConflict,
    /// A head over `max_header_bytes`: weir's 431 `header_too_large`, with
    /// its JSON error, instead of hyper's bare 431.
    HeadTooLarge,
    /// A head whose framing hyper would refuse (an invalid or disagreeing
    /// `Content-Length`, a `Transfer-Encoding` that does not end in
    /// `chunked`) or with two `Host` fields: weir's 400 with its reason.
    InvalidFraming,
}

/// The guard's word to the connection's service: which request (by its
/// number on the connection, from 1) is the marker, and why. At most one
/// head per connection is refused: nothing is read after it.
#[derive(Debug, Default)]
pub(crate) struct GuardVerdict {
    /// Heads the guard let through to hyper.
    pub(super) heads: AtomicU64,
    /// The number of the refused request (0: none), and why.
    refused_at: AtomicU64,
    why: AtomicU8,
}

impl GuardVerdict {
    pub(super) fn refuse(&self, why: Refusal) {
        self.why.store(why as u8, Ordering::Relaxed);
        let at = self.heads.load(Ordering::Relaxed) + 1;
        self.refused_at.store(at, Ordering::Release);
    }

    /// Whether the `n`th request hyper hands the service (from 1) is the
    /// marker of a refused head, and why.
    pub(crate) fn refusal(&self, n: u64) -> Option<Refusal> {
        if self.refused_at.load(Ordering::Acquire) != n {
            return None;
        }
        Some(match self.why.load(Ordering::Relaxed) {
            x if x == Refusal::FramingConflict as u8 => Refusal::FramingConflict,
            x if x == Refusal::HeadTooLarge as u8 => Refusal::HeadTooLarge,
            _ => Refusal::InvalidFraming,
        })
    }
}

/// Where a request head ends: after the empty line that closes it. Lines
/// may end in CRLF or a bare LF, as httparse (hyper's parser) accepts; a
/// guard that only knew CRLF would take a bare-LF head and the request
/// after it for one head, and never judge the second (a bypass).
pub(super) fn find_head_end(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(p) = b[i..].iter().position(|c| *c == b'\n') {
        let lf = i + p;
        match b.get(lf + 1) {
            Some(b'\n') => return Some(lf + 2),
            Some(b'\r') if b.get(lf + 2) == Some(&b'\n') => return Some(lf + 3),
            _ => i = lf + 1,
        }
    }
    None
}

pub(super) enum Judged {
    /// Answered by weir itself: replaced with the [`MARKER`].
    Reject(Refusal),
    /// No longer followed (hyper decides, or it is not HTTP/1 any more).
    Stop(Stop),
    /// Followed: the body's framing.
    Next(Following),
}

/// Decides a complete request head: conflict, or how its body is framed
/// (`h1`, the rules hyper applies to the same head).
pub(super) fn judge(head: &[u8]) -> Judged {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        // hyper will answer whatever this is; stop following.
        _ => return Judged::Stop(Stop::Unparsed),
    }
    // Only a request weir will upgrade (`Upgrade` with `Connection:
    // upgrade`, as `proxy::general::upgrade` asks; or CONNECT) may turn the
    // connection into something that is not HTTP: stop following then. A
    // bare `Upgrade` is an ordinary request, and what follows it is judged.
    // weir (and hyper) read a `Connection` value only when it is text
    // (visible ASCII and tabs, `HeaderValue::to_str`); `text_only: false`
    // asks the bytes, as a peer reading RFC 9112's token list would.
    let names_upgrade = |text_only: bool| {
        req.headers.iter().any(|h| {
            h.name.eq_ignore_ascii_case("connection")
                && (!text_only || is_text(h.value))
                && h.value
                    .split(|b| *b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
        })
    };
    let has_upgrade = req
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("upgrade"));
    // An upgrade only the bytes ask for (`Connection: \xb3, upgrade`): weir
    // would not upgrade, a peer that reads bytes would, and the two would
    // disagree about whether what follows is HTTP. Refused.
    let names_upgrade_text = names_upgrade(true);
    if has_upgrade && !names_upgrade_text && names_upgrade(false) {
        return Judged::Reject(Refusal::InvalidFraming);
    }
    let names_upgrade = names_upgrade_text;
    // Two Host fields: which one routes is anyone's guess (RFC 9112 §3.2: 400).
    let hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .count();
    if hosts > 1 {
        return Judged::Reject(Refusal::InvalidFraming);
    }
    let fields = req.headers.iter().map(|h| (h.name, h.value));
    let framing = h1::request_framing(req.version == Some(1), fields);
    // A tunnel is judged after its framing: a CONNECT with a bad
    // Content-Length is refused like any request, by weir, with its reason.
    let valid = matches!(
        framing,
        h1::RequestFraming::Length(_) | h1::RequestFraming::Chunked
    );
    // hyper upgrades HTTP/1.1 requests only; an HTTP/1.0 `Upgrade` is an
    // ordinary request, and what follows it is judged.
    let upgrade = req.version == Some(1) && names_upgrade && has_upgrade;
    if valid && (req.method == Some("CONNECT") || upgrade) {
        return Judged::Stop(Stop::Tunnel);
    }
    match framing {
        h1::RequestFraming::Conflict => Judged::Reject(Refusal::FramingConflict),
        h1::RequestFraming::Length(0) => Judged::Next(Following::Head),
        h1::RequestFraming::Length(n) => Judged::Next(Following::Fixed(n)),
        h1::RequestFraming::Chunked => Judged::Next(Following::Chunked(h1::Chunked::whole())),
        // hyper would answer a bare 400: weir answers it, with its reason.
        h1::RequestFraming::Invalid(_) => Judged::Reject(Refusal::InvalidFraming),
    }
}

/// Whether a field value is text weir reads (`http::HeaderValue::to_str`):
/// visible ASCII, spaces and tabs.
fn is_text(v: &[u8]) -> bool {
    v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
}
