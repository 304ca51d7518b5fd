//! A strict reference for where HTTP/1.1 requests end (RFC 9112 §2–§7),
//! written from the RFC's grammar for clarity, not speed. weir's request
//! framing (the guard in front of hyper, `proxy::general::guard`, and `h1`)
//! is held against it by `tests/framing_reference.rs` and by the
//! `framing_differential` fuzz target: on any bytes, the two agree on where
//! each request starts and ends, or weir refuses.
//!
//! Strict on everything that moves a message's end: line structure, field
//! names, `Content-Length`, `Transfer-Encoding`, the chunked coding. Where
//! the RFC lets a recipient be lenient, and weir (through hyper) is, the
//! reference is too, and says so:
//!
//! - a bare LF ends a head's line (RFC 9112 §2.2 MAY), and empty lines
//!   before a request line are skipped (§2.2 SHOULD);
//! - repeated `Content-Length` fields with one value, and leading zeros,
//!   are that value (RFC 9110 §8.6);
//! - a `Transfer-Encoding` decides by its final coding (RFC 9112 §6.3 rule
//!   4); the codings before it do not move the end and are not checked;
//! - a chunk size may be followed by whitespace, and a chunk extension is
//!   everything up to the CRLF that is not CR or LF (the extension is
//!   ignored either way, §7.1.1; hyper reads it so);
//! - the request target and field values are not checked beyond "no CR, LF
//!   or other control": they do not move the end.
//!
//! What is weir's policy rather than the RFC's is modelled as such: CONNECT,
//! and `Upgrade` with `Connection: upgrade`, end HTTP/1 on the connection
//! (a tunnel); `PRI * HTTP/2.0` starts HTTP/2.
#![allow(dead_code, unreachable_pub)]

/// A point in the bytes where something was decided (the same shape as
/// weir's marks, so the two can be compared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefMark {
    /// A valid request head from `start` to `end`.
    Head { start: usize, end: usize },
    /// The request ended here (its body included).
    End(usize),
    /// Nothing after this offset is HTTP/1 requests, and why.
    Stop(usize, RefStop),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefStop {
    /// Not valid HTTP/1.1 here: a server must refuse it.
    Invalid(&'static str),
    /// CONNECT or an accepted upgrade.
    Tunnel,
    /// The HTTP/2 preface.
    Http2,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|b| is_tchar(*b))
}

/// A byte that may appear in a field value or request target (no CR, LF,
/// NUL or other control; HTAB allowed in values).
fn is_text(b: u8) -> bool {
    b == b'\t' || (0x20..0x7f).contains(&b) || b >= 0x80
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// Splits `bytes` into lines ending in CRLF or LF, up to and including the
/// first empty line: `Some((lines, head_len))`, or `None` when no empty line
/// has arrived yet.
fn head_lines(bytes: &[u8]) -> Option<(Vec<&[u8]>, usize)> {
    let mut lines = Vec::new();
    let mut at = 0;
    loop {
        let lf = at + bytes[at..].iter().position(|b| *b == b'\n')?;
        let line = &bytes[at..lf];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        at = lf + 1;
        if line.is_empty() {
            return Some((lines, at));
        }
        lines.push(line);
    }
}

/// How a valid head frames its body.
enum Body {
    Length(u64),
    Chunked,
    Tunnel,
}

fn judge(lines: &[&[u8]]) -> Result<Body, &'static str> {
    let (request_line, fields) = lines.split_first().ok_or("no request line")?;
    let parts: Vec<&[u8]> = request_line.split(|b| *b == b' ').collect();
    let [method, target, version] = parts[..] else {
        return Err("a request line is method SP target SP version");
    };
    if !is_token(method) {
        return Err("the method is not a token");
    }
    if target.is_empty() || !target.iter().all(|b| is_text(*b) && *b != b'\t') {
        return Err("the target is empty or has controls");
    }
    let http11 = match version {
        b"HTTP/1.1" => true,
        b"HTTP/1.0" => false,
        _ => return Err("not HTTP/1.0 or HTTP/1.1"),
    };
    let mut length: Option<u64> = None;
    let mut te: Option<&[u8]> = None;
    let mut hosts = 0;
    let mut upgrade = false;
    let mut connection_upgrade = false;
    for line in fields {
        let colon = line
            .iter()
            .position(|b| *b == b':')
            .ok_or("a field line without a colon")?;
        let (name, value) = (&line[..colon], trim_ows(&line[colon + 1..]));
        if !is_token(name) {
            return Err("a field name is not a token (no whitespace before the colon)");
        }
        if !value.iter().all(|b| is_text(*b)) {
            return Err("a field value has controls");
        }
        let lower = name.to_ascii_lowercase();
        match &lower[..] {
            b"content-length" => {
                if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
                    return Err("Content-Length is not 1*DIGIT");
                }
                let n = value.iter().try_fold(0u64, |n, d| {
                    n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                });
                let n = n.ok_or("Content-Length overflows")?;
                if length.is_some_and(|l| l != n) {
                    return Err("Content-Lengths disagree");
                }
                length = Some(n);
            }
            b"transfer-encoding" => te = Some(value),
            b"host" => hosts += 1,
            b"upgrade" => upgrade = true,
            b"connection" => {
                connection_upgrade |= value
                    .split(|b| *b == b',')
                    .any(|t| trim_ows(t).eq_ignore_ascii_case(b"upgrade"))
            }
            _ => {}
        }
    }
    if hosts > 1 {
        return Err("more than one Host (RFC 9112 §3.2)");
    }
    let body = match (te, length) {
        (Some(_), _) if !http11 => Err("Transfer-Encoding on HTTP/1.0 (RFC 9112 §6.1)"),
        (Some(_), Some(_)) => Err("both Transfer-Encoding and Content-Length (RFC 9112 §6.1)"),
        (Some(te), None) => {
            let last = te
                .split(|b| *b == b',')
                .map(trim_ows)
                .rfind(|c| !c.is_empty())
                .ok_or("an empty Transfer-Encoding")?;
            if last.eq_ignore_ascii_case(b"chunked") {
                Ok(Body::Chunked)
            } else {
                Err("the final transfer coding is not chunked (RFC 9112 §6.3)")
            }
        }
        (None, n) => Ok(Body::Length(n.unwrap_or(0))),
    }?;
    // A tunnel is judged on a head that is valid in every other way.
    // Upgrade exists in HTTP/1.1 only (RFC 9110 §7.8).
    if method == b"CONNECT" || (http11 && upgrade && connection_upgrade) {
        return Ok(Body::Tunnel);
    }
    Ok(body)
}

/// Where a chunked body starting at `bytes[0]` ends: `Ok(Some(len))`,
/// `Ok(None)` when it has not ended yet, `Err` when it is not valid.
fn chunked_end(bytes: &[u8]) -> Result<Option<usize>, &'static str> {
    let mut at = 0;
    // A line of the chunked coding: strictly CRLF-terminated.
    let line = |at: usize| -> Result<Option<(&[u8], usize)>, &'static str> {
        let Some(cr) = bytes[at..].iter().position(|b| *b == b'\r' || *b == b'\n') else {
            return Ok(None);
        };
        let cr = at + cr;
        if bytes[cr] == b'\n' {
            return Err("a bare LF in the chunked coding");
        }
        match bytes.get(cr + 1) {
            None => Ok(None),
            Some(b'\n') => Ok(Some((&bytes[at..cr], cr + 2))),
            Some(_) => Err("a bare CR in the chunked coding"),
        }
    };
    loop {
        let Some((size_line, next)) = line(at)? else {
            return Ok(None);
        };
        let digits = size_line
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .count();
        if digits == 0 {
            return Err("a chunk size is 1*HEXDIG");
        }
        // OWS, then an extension or nothing (see the module docs).
        let rest = &size_line[digits..];
        let ws = rest
            .iter()
            .take_while(|b| **b == b' ' || **b == b'\t')
            .count();
        if rest.get(ws).is_some_and(|b| *b != b';') {
            return Err("a chunk size is followed by an extension or nothing");
        }
        let size = size_line[..digits].iter().try_fold(0u64, |n, d| {
            n.checked_mul(16)?
                .checked_add(u64::from((*d as char).to_digit(16).unwrap_or(0)))
        });
        let size = size.ok_or("a chunk size overflows")?;
        at = next;
        if size == 0 {
            // The trailer section: field lines, then an empty line.
            loop {
                let Some((field, next)) = line(at)? else {
                    return Ok(None);
                };
                at = next;
                if field.is_empty() {
                    return Ok(Some(at));
                }
                let colon = field
                    .iter()
                    .position(|b| *b == b':')
                    .ok_or("a trailer line without a colon")?;
                if !is_token(&field[..colon]) {
                    return Err("a trailer name is not a token");
                }
                if !field[colon + 1..].iter().all(|b| is_text(*b)) {
                    return Err("a trailer value has controls");
                }
            }
        }
        let Some(data_end) = usize::try_from(size).ok().and_then(|s| at.checked_add(s)) else {
            return Ok(None);
        };
        if bytes.len() < data_end + 2 {
            if bytes.len() > data_end && bytes[data_end] != b'\r' {
                return Err("chunk data is not followed by CRLF");
            }
            return Ok(None);
        }
        if &bytes[data_end..data_end + 2] != b"\r\n" {
            return Err("chunk data is not followed by CRLF");
        }
        at = data_end + 2;
    }
}

/// Frames a connection's bytes: every head, every end, and where (and why)
/// HTTP/1 requests stop. Incomplete input ends without a final mark.
pub fn frame(bytes: &[u8]) -> Vec<RefMark> {
    let mut marks = Vec::new();
    let mut at = 0;
    loop {
        // Empty lines before a request line.
        loop {
            match &bytes[at..] {
                [b'\n', ..] => at += 1,
                [b'\r', b'\n', ..] => at += 2,
                _ => break,
            }
        }
        if at == bytes.len() {
            return marks;
        }
        if bytes[at..].starts_with(b"PRI * HTTP/2.0") {
            marks.push(RefMark::Stop(at, RefStop::Http2));
            return marks;
        }
        let Some((lines, len)) = head_lines(&bytes[at..]) else {
            return marks;
        };
        let start = at;
        let body = match judge(&lines) {
            Ok(b) => b,
            Err(why) => {
                marks.push(RefMark::Stop(start, RefStop::Invalid(why)));
                return marks;
            }
        };
        if matches!(body, Body::Tunnel) {
            marks.push(RefMark::Stop(start, RefStop::Tunnel));
            return marks;
        }
        at += len;
        marks.push(RefMark::Head { start, end: at });
        match body {
            Body::Tunnel => return marks,
            Body::Length(n) => {
                let left = (bytes.len() - at) as u64;
                if n > left {
                    return marks;
                }
                at += n as usize;
            }
            Body::Chunked => match chunked_end(&bytes[at..]) {
                Ok(Some(n)) => at += n,
                Ok(None) => return marks,
                Err(why) => {
                    marks.push(RefMark::Stop(at, RefStop::Invalid(why)));
                    return marks;
                }
            },
        }
        marks.push(RefMark::End(at));
    }
}

/// Whether weir's marks (from `weir::cli::fuzzing::guard_frame`) agree with the
/// reference's on the same bytes: every head weir accepts and every end it
/// finds is the reference's, mark for mark; weir may stop earlier (a
/// refusal, or a head it still waits for) but never accepts a head where
/// the reference refuses or ends a request elsewhere; a tunnel or HTTP/2 is
/// one for both.
pub fn agree(weir: &[weir::cli::fuzzing::Mark], reference: &[RefMark]) -> Result<(), String> {
    use weir::cli::fuzzing::{Mark, Stop};
    let fail = |k: usize, why: &str| {
        Err(format!(
            "mark {k}: {why}\n  weir:      {weir:?}\n  reference: {reference:?}"
        ))
    };
    for k in 0..weir.len().max(reference.len()) {
        match (weir.get(k), reference.get(k)) {
            (Some(Mark::Head { start, end }), Some(RefMark::Head { start: s, end: e }))
                if (start, end) == (s, e) => {}
            (Some(Mark::End(a)), Some(RefMark::End(b))) if a == b => {}
            (Some(Mark::Stop(a, Stop::Tunnel)), Some(RefMark::Stop(b, RefStop::Tunnel)))
            | (Some(Mark::Stop(a, Stop::Http2)), Some(RefMark::Stop(b, RefStop::Http2)))
                if a == b =>
            {
                return Ok(());
            }
            (Some(Mark::Stop(_, Stop::Tunnel | Stop::Http2)), _) => {
                return fail(k, "weir stops following where the reference does not");
            }
            // weir refuses here (or leaves hyper to refuse): whatever the
            // reference makes of it, nothing after it is forwarded.
            (Some(Mark::Stop(..)), _) => return Ok(()),
            // weir is still waiting; the reference refused.
            (None, Some(RefMark::Stop(_, RefStop::Invalid(_)))) => return Ok(()),
            (None, None) => return Ok(()),
            _ => return fail(k, "weir and the reference frame these bytes differently"),
        }
    }
    Ok(())
}
