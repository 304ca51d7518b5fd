//! Trace context in and out (docs/reference/tracing.md#trace-context): W3C
//! `traceparent` and B3 single-header read off a request, the sampling
//! decision, and the `traceparent` weir forwards. Pure: no clock, no
//! randomness of its own (the caller passes a draw).
//!
//! A malformed context is ignored as the W3C spec says (a request without
//! one), never refused: wrong length, a character that is not lowercase
//! hex, version `ff`, version `00` with anything after the flags, an
//! all-zero trace id or parent id, or two `traceparent` fields.

/// What a request's fields say about its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Incoming {
    /// No usable context (none, or malformed): a new trace when `sample`
    /// says so.
    #[default]
    None,
    /// A parent to join; `sampled: None` (B3 without a sampling state)
    /// leaves the choice to `sample`.
    Parent {
        trace_id: u128,
        span_id: u64,
        sampled: Option<bool>,
    },
    /// The caller asks that nothing be recorded (sampled flag 0, `b3: 0`).
    Unsampled,
    /// B3 `1` or `d` with no ids: a new trace, recorded.
    Forced,
}

/// The W3C field.
pub const TRACEPARENT: &str = "traceparent";
/// Vendor state: on a traced request, passed on as [`tracestate`] bounds it.
pub const TRACESTATE: &str = "tracestate";
/// B3 single-header, accepted in.
pub const B3: &str = "b3";
/// B3 multi-header fields: not read, and dropped from a traced request,
/// whose upstream is told one context, weir's `traceparent`.
pub const B3_MULTI: [&str; 5] = [
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-parentspanid",
    "x-b3-sampled",
    "x-b3-flags",
];

/// The most `tracestate` list-members kept (W3C Trace Context §3.3.1.1).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;
/// The longest `tracestate` kept, in characters: the 512 the W3C spec asks
/// every vendor to propagate (§3.3.1.5).
pub const MAX_TRACESTATE_LEN: usize = 512;

/// A traced request's `tracestate`, from every field of that name in order
/// (one list, RFC 9110 §5.3), bounded as W3C Trace Context §3.3.1.5 says
/// a vendor may truncate it: empty members and members that are not
/// visible ASCII `key=value` are left out, at most
/// [`MAX_TRACESTATE_MEMBERS`] are kept, and while the list is longer than
/// [`MAX_TRACESTATE_LEN`] members longer than 128 characters go first,
/// then members from the end. `None` when nothing is left.
pub fn tracestate<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<String> {
    let mut members: Vec<&str> = Vec::new();
    'fields: for v in values {
        for m in v.split(|b| *b == b',') {
            if members.len() == MAX_TRACESTATE_MEMBERS {
                break 'fields;
            }
            let m = trim(m);
            let member = (!m.is_empty()
                && m.iter().all(|b| (0x20..0x7f).contains(b))
                && m.iter().skip(1).any(|b| *b == b'='))
            .then(|| std::str::from_utf8(m).ok())
            .flatten();
            if let Some(member) = member {
                members.push(member);
            }
        }
    }
    let len = |ms: &[&str]| {
        ms.iter()
            .map(|m| m.len() + 1)
            .sum::<usize>()
            .saturating_sub(1)
    };
    if len(&members) > MAX_TRACESTATE_LEN {
        members.retain(|m| m.len() <= 128);
    }
    while len(&members) > MAX_TRACESTATE_LEN {
        members.pop();
    }
    (!members.is_empty()).then(|| members.join(","))
}

/// Restates a traced request's context fields in a header map (hyper's
/// path): `tracestate` as [`tracestate`] bounded it (`state`; none when
/// weir started the trace), and no B3 multi-header field. `traceparent`
/// and `b3` are [`set_in_fields`]'s, per attempt.
pub fn restate(h: &mut http::HeaderMap, state: Option<&str>) {
    for name in B3_MULTI {
        h.remove(name);
    }
    h.remove(TRACESTATE);
    if let Some(v) = state.and_then(|s| http::HeaderValue::from_str(s).ok()) {
        h.insert(TRACESTATE, v);
    }
}

/// The context of a request whose fields are `fields`: a valid
/// `traceparent` first, else a valid `b3`, else none.
pub fn read<'a>(fields: impl Iterator<Item = (&'a str, &'a [u8])>) -> Incoming {
    let (mut w3c, mut w3c_count, mut b3) = (None, 0, None);
    for (n, v) in fields {
        // Most fields are neither: told by their length alone.
        if n.len() != TRACEPARENT.len() && n.len() != B3.len() {
            continue;
        }
        if n.eq_ignore_ascii_case(TRACEPARENT) {
            w3c_count += 1;
            w3c = Some(v);
        } else if b3.is_none() && n.eq_ignore_ascii_case(B3) {
            b3 = Some(v);
        }
    }
    if let Some(p) = w3c.filter(|_| w3c_count == 1).and_then(traceparent) {
        return p;
    }
    b3.map_or(Incoming::None, b3_single)
}

/// A `traceparent` value (W3C Trace Context, level 1 §3.2), or `None`
/// when it is malformed.
pub fn traceparent(v: &[u8]) -> Option<Incoming> {
    let v = trim(v);
    if v.len() < 55 {
        return None;
    }
    let version = hex(&v[0..2])? as u8;
    // Version ff is invalid; 00 is exactly 55 characters; a later version
    // may append fields after a dash, and is read as 00.
    if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
        return None;
    }
    if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let trace_id = hex(&v[3..35])?;
    let span_id = hex(&v[36..52])? as u64;
    let flags = hex(&v[53..55])? as u8;
    if trace_id == 0 || span_id == 0 {
        return None;
    }
    Some(Incoming::Parent {
        trace_id,
        span_id,
        sampled: Some(flags & 1 == 1),
    })
}

/// A B3 single-header value: `{trace}-{span}[-{sampling}[-{parent}]]` or
/// a sampling state alone (`0`, `1`, `d`); `Incoming::None` when malformed.
pub fn b3_single(v: &[u8]) -> Incoming {
    let v = trim(v);
    match v {
        b"0" => return Incoming::Unsampled,
        b"1" | b"d" => return Incoming::Forced,
        _ => {}
    }
    let mut parts = v.split(|b| *b == b'-');
    let (Some(t), Some(s)) = (parts.next(), parts.next()) else {
        return Incoming::None;
    };
    let sampled = match parts.next() {
        None => None,
        Some(b"1" | b"d") => Some(true),
        Some(b"0") => Some(false),
        Some(_) => return Incoming::None,
    };
    if parts
        .next()
        .is_some_and(|p| p.len() != 16 || hex(p).is_none())
        || parts.next().is_some()
    {
        return Incoming::None;
    }
    let (Some(trace_id), Some(span_id)) = (
        (t.len() == 16 || t.len() == 32).then(|| hex(t)).flatten(),
        (s.len() == 16).then(|| hex(s)).flatten(),
    ) else {
        return Incoming::None;
    };
    if trace_id == 0 || span_id == 0 {
        return Incoming::None;
    }
    if sampled == Some(false) {
        return Incoming::Unsampled;
    }
    Incoming::Parent {
        trace_id,
        span_id: span_id as u64,
        sampled,
    }
}

/// Whether weir records a request: the caller's choice when it made one,
/// else `sample` (a share, 0 to 1) against `draw` (a uniform random u64,
/// asked for only when needed). `Some(parent)`: recorded, joining
/// `parent` (trace id and span id) when there is one.
pub fn decide(
    incoming: Incoming,
    sample: f64,
    draw: impl FnOnce() -> u64,
) -> Option<Option<(u128, u64)>> {
    let by_ratio = |draw: &mut dyn FnMut() -> u64| -> bool {
        sample >= 1.0 || (sample > 0.0 && ((draw() >> 11) as f64) < sample * (1u64 << 53) as f64)
    };
    let mut draw = Some(draw);
    let mut draw = move || draw.take().map_or(0, |d| d());
    match incoming {
        Incoming::Parent {
            trace_id,
            span_id,
            sampled,
        } => match sampled {
            Some(true) => Some(Some((trace_id, span_id))),
            Some(false) => None,
            None => by_ratio(&mut draw).then_some(Some((trace_id, span_id))),
        },
        Incoming::Unsampled => None,
        Incoming::Forced => Some(None),
        Incoming::None => by_ratio(&mut draw).then_some(None),
    }
}

/// `incoming` with the caller's sampling decision left out
/// (`trust_caller_sampling = false`): a context is kept, to be joined if
/// `sample` picks the request; a flag alone (`b3: 0`, `b3: 1`) is nothing.
pub fn untrusted(incoming: Incoming) -> Incoming {
    match incoming {
        Incoming::Parent {
            trace_id, span_id, ..
        } => Incoming::Parent {
            trace_id,
            span_id,
            sampled: None,
        },
        Incoming::Unsampled | Incoming::Forced | Incoming::None => Incoming::None,
    }
}

/// The `traceparent` weir forwards: version 00, sampled. Fixed width, so
/// a head written once can take each attempt's span id in place
/// ([`set_parent`]).
pub fn format(trace_id: u128, span_id: u64) -> [u8; 55] {
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-01";
    write_hex(&trace_id.to_be_bytes(), &mut out[3..35]);
    set_parent(&mut out, span_id);
    out
}

/// Writes `span_id` as the parent-id of a `traceparent` value.
pub fn set_parent(value: &mut [u8; 55], span_id: u64) {
    write_hex(&span_id.to_be_bytes(), &mut value[36..52]);
}

/// Sets a traced request's `traceparent` in a header map: weir's, in
/// place of the caller's; a `b3` field goes (the upstream is told one
/// context, the W3C one).
pub fn set_in_fields(h: &mut http::HeaderMap, value: &[u8; 55]) {
    if let Ok(v) = http::HeaderValue::from_bytes(value) {
        h.insert(TRACEPARENT, v);
    }
    h.remove(B3);
}

/// Rewrites the value of the `traceparent` field that weir wrote into an
/// HTTP/1 request head (the first field of that name before the head's
/// end; [`head_field`] wrote it) in place.
pub fn set_in_head(request: &mut [u8], value: &[u8; 55]) {
    const NAME: &[u8] = b"\r\ntraceparent: ";
    let end = request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(0);
    let Some(at) = request[..end].windows(NAME.len()).position(|w| w == NAME) else {
        return;
    };
    let start = at + NAME.len();
    if let Some(slot) = request.get_mut(start..start + value.len()) {
        slot.copy_from_slice(value);
    }
}

/// The `traceparent` field line of a traced request's HTTP/1 head, for
/// [`set_in_head`] to rewrite per attempt.
pub fn head_field(value: &[u8; 55]) -> [u8; 70] {
    let mut line = [0u8; 70];
    line[..13].copy_from_slice(b"traceparent: ");
    line[13..68].copy_from_slice(value);
    line[68..].copy_from_slice(b"\r\n");
    line
}

/// `bytes` as lowercase hex into `out` (twice as long).
pub fn write_hex(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
}

/// Lowercase hex digits, at most 32 of them, as a number.
fn hex(v: &[u8]) -> Option<u128> {
    if v.is_empty() || v.len() > 32 {
        return None;
    }
    v.iter().try_fold(0u128, |n, b| {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some(n << 4 | u128::from(d))
    })
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &v[start..end]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn parent(sampled: Option<bool>) -> Incoming {
        Incoming::Parent {
            trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736,
            span_id: 0x00f067aa0ba902b7,
            sampled,
        }
    }

    #[test]
    fn a_valid_traceparent_is_joined_with_its_sampled_flag() {
        assert_eq!(traceparent(GOOD.as_bytes()), Some(parent(Some(true))));
        let unsampled = GOOD.replace("-01", "-00");
        assert_eq!(traceparent(unsampled.as_bytes()), Some(parent(Some(false))));
        // Other flag bits are not the sampled bit.
        let other = GOOD.replace("-01", "-02");
        assert_eq!(traceparent(other.as_bytes()), Some(parent(Some(false))));
        // Surrounding whitespace is the field's, not the value's.
        assert_eq!(
            traceparent(format!(" {GOOD}\t").as_bytes()),
            Some(parent(Some(true)))
        );
        // A later version may add fields after a dash; read as 00.
        let later = format!("cc{}-what-is-this", &GOOD[2..]);
        assert_eq!(traceparent(later.as_bytes()), Some(parent(Some(true))));
    }

    #[test]
    fn a_malformed_traceparent_is_ignored() {
        let bad = [
            "",
            "00",
            &GOOD[..54],                                               // short
            &format!("{GOOD}-00"),                                     // version 00 is 55 long
            &GOOD.replace("4bf9", "4BF9"),                             // uppercase
            &GOOD.replace("4bf9", "4bg9"),                             // not hex
            &format!("ff{}", &GOOD[2..]),                              // version ff
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // separator
            &format!("cc{}x", &GOOD[2..]),                             // later version, no dash
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x", // flags
        ];
        for v in bad {
            assert_eq!(traceparent(v.as_bytes()), None, "{v:?}");
        }
    }

    #[test]
    fn two_traceparents_are_none_and_b3_is_the_fallback() {
        let fields =
            |v: &[(&'static str, &'static str)]| read(v.iter().map(|(n, v)| (*n, v.as_bytes())));
        assert_eq!(fields(&[("Traceparent", GOOD)]), parent(Some(true)));
        assert_eq!(
            fields(&[("traceparent", GOOD), ("traceparent", GOOD)]),
            Incoming::None
        );
        let b3 = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1";
        assert_eq!(
            fields(&[("traceparent", "junk"), ("b3", b3)]),
            parent(Some(true))
        );
        assert_eq!(fields(&[("x-other", GOOD)]), Incoming::None);
    }

    #[test]
    fn b3_single_header() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        let s = "00f067aa0ba902b7";
        assert_eq!(
            b3_single(format!("{t}-{s}-1").as_bytes()),
            parent(Some(true))
        );
        assert_eq!(
            b3_single(format!("{t}-{s}-d").as_bytes()),
            parent(Some(true))
        );
        assert_eq!(b3_single(format!("{t}-{s}").as_bytes()), parent(None));
        assert_eq!(
            b3_single(format!("{t}-{s}-1-{s}").as_bytes()),
            parent(Some(true))
        );
        assert_eq!(
            b3_single(format!("{t}-{s}-0").as_bytes()),
            Incoming::Unsampled
        );
        assert_eq!(b3_single(b"0"), Incoming::Unsampled);
        assert_eq!(b3_single(b"1"), Incoming::Forced);
        // A 64-bit trace id is the low half.
        assert_eq!(
            b3_single(format!("a3ce929d0e0e4736-{s}-1").as_bytes()),
            Incoming::Parent {
                trace_id: 0xa3ce929d0e0e4736,
                span_id: 0x00f067aa0ba902b7,
                sampled: Some(true)
            }
        );
        for bad in [
            "",
            "2",
            t,
            &format!("{t}-{s}-x"),
            &format!("{t}-0000000000000000-1"),
            &format!("{t}-{s}-1-xyz"),
            &format!("{t}-{s}-1-{s}-more"),
            &format!("{}-{s}-1", &t[1..]),
        ] {
            assert_eq!(b3_single(bad.as_bytes()), Incoming::None, "{bad:?}");
        }
    }

    #[test]
    fn sampling_decisions() {
        let never = || -> u64 { panic!("no draw needed") };
        // The caller's choice stands, whatever `sample` says.
        assert_eq!(
            decide(parent(Some(true)), 0.0, never),
            Some(Some((
                0x4bf92f3577b34da6a3ce929d0e0e4736,
                0x00f067aa0ba902b7
            )))
        );
        assert_eq!(decide(parent(Some(false)), 1.0, never), None);
        assert_eq!(decide(Incoming::Unsampled, 1.0, never), None);
        assert_eq!(decide(Incoming::Forced, 0.0, never), Some(None));
        // Without one, `sample` decides: 0 never, 1 always, no draw either way.
        assert_eq!(decide(Incoming::None, 0.0, never), None);
        assert_eq!(decide(Incoming::None, 1.0, never), Some(None));
        // In between, by the draw.
        assert_eq!(decide(Incoming::None, 0.25, || 0), Some(None));
        assert_eq!(
            decide(Incoming::None, 0.25, || u64::MAX / 4 - 4096),
            Some(None)
        );
        assert_eq!(decide(Incoming::None, 0.25, || u64::MAX / 4 + 4096), None);
        assert_eq!(decide(parent(None), 0.5, || u64::MAX), None);
        assert!(decide(parent(None), 0.5, || 1).is_some());
    }

    #[test]
    fn the_forwarded_traceparent_names_weirs_span() {
        let mut v = format(0x4bf92f3577b34da6a3ce929d0e0e4736, 1);
        assert_eq!(
            &v,
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-01"
        );
        set_parent(&mut v, 0x00f067aa0ba902b7);
        assert_eq!(std::str::from_utf8(&v).unwrap(), GOOD);
        assert_eq!(traceparent(&v), Some(parent(Some(true))));
    }

    #[test]
    fn tracestate_is_bounded_as_w3c_allows() {
        let ts = |vs: &[&str]| tracestate(vs.iter().map(|v| v.as_bytes()));
        assert_eq!(ts(&["a=1, b=2", "c=3"]).as_deref(), Some("a=1,b=2,c=3"));
        assert_eq!(ts(&["", " ,=x, caf\u{e9}=1"]), None);
        let many: Vec<String> = (0..40).map(|i| format!("k{i}=v")).collect();
        let kept = ts(&[&many.join(",")]).unwrap();
        assert_eq!(kept.split(',').count(), 32);
        assert!(kept.ends_with("k31=v"));
        let big = format!("big={}", "x".repeat(200));
        let short: Vec<String> = (0..30)
            .map(|i| format!("m{i:02}={}", "y".repeat(16)))
            .collect();
        let kept = ts(&[&short[..2].join(","), &big, &short[2..].join(",")]).unwrap();
        assert!(!kept.contains("big="), "members over 128 go first");
        assert!(kept.len() <= MAX_TRACESTATE_LEN);
        assert!(
            kept.starts_with("m00=") && !kept.contains("m29="),
            "then from the end"
        );
    }

    #[test]
    fn an_untrusted_flag_leaves_the_decision_to_sample() {
        let p = |sampled| Incoming::Parent {
            trace_id: 7,
            span_id: 9,
            sampled,
        };
        for flag in [Some(true), Some(false), None] {
            assert_eq!(untrusted(p(flag)), p(None));
        }
        for alone in [Incoming::Unsampled, Incoming::Forced, Incoming::None] {
            assert_eq!(untrusted(alone), Incoming::None);
        }
        assert_eq!(decide(untrusted(p(Some(true))), 0.0, || 0), None);
        assert_eq!(
            decide(untrusted(p(Some(false))), 1.0, || 0),
            Some(Some((7, 9)))
        );
    }
}
