//! The guard's unit tests: framing followed across reads, and what it
//! refuses.
use super::*;

/// Feeds reads through `process`; returns the final state and the bytes hyper would see.
fn run(chunks: &[&[u8]]) -> (Following, Vec<u8>) {
    let (st, out, _) = run_judged(chunks);
    (st, out)
}

/// [`run`], and what the guard told the service.
fn run_judged(chunks: &[&[u8]]) -> (Following, Vec<u8>, GuardVerdict) {
    let mut st = Following::Head;
    let mut stash = Vec::new();
    let mut ready = 0;
    let verdict = GuardVerdict::default();
    for c in chunks {
        stash.extend_from_slice(c);
        let seen = (&AtomicBool::new(false), &verdict);
        process(&mut st, &mut stash, &mut ready, 65536, seen);
    }
    stash.truncate(ready);
    (st, stash, verdict)
}

fn nothing_seen() -> (&'static AtomicBool, &'static GuardVerdict) {
    static H2: AtomicBool = AtomicBool::new(false);
    static V: std::sync::LazyLock<GuardVerdict> = std::sync::LazyLock::new(GuardVerdict::default);
    (&H2, &V)
}

#[test]
fn follows_fixed_and_chunked_bodies_across_reads() {
    let a = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhel";
    let b = b"loGET / HTTP/1.1\r\nHost: x\r\n\r\n";
    let (st, out) = run(&[a, b]);
    assert_eq!(st, Following::Head);
    assert_eq!(out, [&a[..], &b[..]].concat());
    let c = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nx-t: 1\r\n\r\n";
    assert_eq!(run(&[c]).0, Following::Head);
    // Split at every byte.
    let whole = [&c[..], &b"GET / HTTP/1.1\r\n\r\n"[..]].concat();
    let bytes: Vec<&[u8]> = whole.chunks(1).collect();
    let (st, out) = run(&bytes);
    assert_eq!(st, Following::Head);
    assert_eq!(out, whole);
}

#[test]
fn heads_end_at_an_empty_line_however_lines_end() {
    assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\nX"), Some(18));
    assert_eq!(find_head_end(b"GET / HTTP/1.1\nHost: x\n\nX"), Some(24));
    assert_eq!(find_head_end(b"GET / HTTP/1.1\n\r\nX"), Some(17));
    assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
}

#[test]
fn a_partial_head_is_held_back() {
    let (st, out) = run(&[b"GET / HTTP/1.1\r\nHost: x\r\n"]);
    assert_eq!(st, Following::Head);
    assert!(out.is_empty());
}

#[test]
fn conflicting_head_is_replaced_by_the_marker() {
    let ok = b"GET / HTTP/1.1\r\n\r\n";
    let bad =
        b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let joined = [&ok[..], &bad[..]].concat();
    let (st, out, verdict) = run_judged(&[&joined]);
    assert_eq!(st, Following::Rejected);
    assert_eq!(out, [&ok[..], MARKER].concat());
    // The service hears that its second request is the refused one.
    assert_eq!(verdict.refusal(1), None);
    assert_eq!(verdict.refusal(2), Some(Refusal::FramingConflict));
    let (st, out, verdict) = run_judged(&[&bad[..10], &bad[10..]]);
    assert_eq!(st, Following::Rejected);
    assert_eq!(out, MARKER);
    assert_eq!(verdict.refusal(1), Some(Refusal::FramingConflict));
}

/// An upgrade weir would not make (its `Connection` value is not text,
/// so weir and hyper read no `upgrade` in it) but whose bytes name one: a
/// peer reading bytes would take what follows for a tunnel. Refused, with
/// nothing after it reaching hyper; a text value is followed as before.
#[test]
fn an_upgrade_only_the_bytes_ask_for_is_refused() {
    for conn in [&b"\xb3, upgrade"[..], "\u{e9}, upgrade".as_bytes()] {
        let head = [
            &b"GET /ws HTTP/1.1\r\nUpgrade: wocket\r\nConnection: "[..],
            conn,
            b"\r\n\r\nGET /next HTTP/1.1\r\n\r\n",
        ]
        .concat();
        let (st, out, verdict) = run_judged(&[&head]);
        assert_eq!(
            st,
            Following::Rejected,
            "{:?}",
            String::from_utf8_lossy(conn)
        );
        assert_eq!(out, MARKER);
        assert_eq!(verdict.refusal(1), Some(Refusal::InvalidFraming));
    }
    // Not text, and no `upgrade` in it either: an ordinary request.
    let plain = b"GET / HTTP/1.1\r\nUpgrade: wocket\r\nConnection: \xb3\r\n\r\n";
    assert_eq!(run(&[plain]).0, Following::Head);
}

#[test]
fn h2_and_upgrades_pass_through() {
    // The preface alone is still a handshake (timed); with a frame
    // header after it the connection is HTTP/2's.
    assert_eq!(
        run(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]).0,
        Following::H2Preface { seen: 24 }
    );
    assert_eq!(
        run(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\0\0\0\x04\0\0\0\0\0"]).0,
        Following::Passthrough
    );
    assert_eq!(
        run(&[b"PRI * HTTP/2.0"]).0,
        Following::H2Preface { seen: 14 }
    );
    let up = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
    assert_eq!(run(&[up]).0, Following::Passthrough);
}

/// Regression: hyper answered an oversized head with a bare 431 (no body,
/// no `x-weir-error`). It is replaced by the marker weir answers itself,
/// whether the head is still growing or already complete.
#[test]
fn oversized_heads_become_the_too_large_marker() {
    let first = b"GET /a HTTP/1.1\r\n\r\n";
    let big = vec![b'a'; 70_000];
    let (st, out, verdict) = run_judged(&[first, b"GET / HTTP/1.1\r\nx: ", &big]);
    assert_eq!(st, Following::Rejected);
    assert_eq!(out, [&first[..], MARKER].concat());
    assert_eq!(verdict.refusal(2), Some(Refusal::HeadTooLarge));
    let whole = [&b"GET / HTTP/1.1\r\nx: "[..], &big, b"\r\n\r\n"].concat();
    let mut st = Following::Head;
    assert!(matches!(
        scan_slice(&mut st, &whole, 65536, nothing_seen()),
        Scan::Reject(0)
    ));
}

#[test]
fn the_in_place_scan_agrees_with_the_stash() {
    let ok = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /c HTTP/1.1\r\n";
    let mut st = Following::Head;
    let last = ok.windows(6).position(|w| w == b"GET /c").unwrap_or(0);
    assert!(
        matches!(scan_slice(&mut st, ok, 65536, nothing_seen()), Scan::Partial(p) if p == last)
    );
    let bad = b"GET / HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut st = Following::Head;
    assert!(matches!(
        scan_slice(&mut st, bad, 65536, nothing_seen()),
        Scan::Reject(18)
    ));
    let mut st = Following::Head;
    assert!(matches!(
        scan_slice(&mut st, b"GET / HTTP/1.1\r\n\r\n", 65536, nothing_seen()),
        Scan::All
    ));
    assert_eq!(st, Following::Head);
}

#[test]
fn the_marker_is_shorter_than_any_refused_head() {
    // The shortest head the guard refuses: two Host fields.
    let shortest = b"GET / HTTP/1.1\r\nHost:\r\nHost:\r\n\r\n";
    assert!(MARKER.len() < shortest.len());
    let (_, out, verdict) = run_judged(&[shortest]);
    assert_eq!(out, MARKER);
    assert_eq!(verdict.refusal(1), Some(Refusal::InvalidFraming));
}
