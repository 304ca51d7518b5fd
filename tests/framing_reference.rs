//! weir's request framing — the guard in front of hyper, on `h1` —
//! held against a strict reference written from RFC 9112
//! (`tests/reference/rfc9112.rs`): on any bytes, read in any pieces, the two
//! agree on where each request starts and ends, or weir refuses. The same
//! check runs unbounded in the `framing_differential` fuzz target (`fuzz/`);
//! the cases below are its seed corpus's regressions.
#![allow(clippy::unwrap_used)]

#[path = "reference/rfc9112.rs"]
mod reference;

use proptest::prelude::*;
use reference::{agree, frame, RefMark, RefStop};
use weir::cli::fuzzing::{guard_frame, Mark, Refusal, Stop};

const MAX_HEAD: usize = 64 * 1024;

fn check(bytes: &[u8], pieces: &[usize]) -> Vec<Mark> {
    let weir = guard_frame(bytes, pieces, MAX_HEAD);
    let reference = frame(bytes);
    if let Err(e) = agree(&weir, &reference) {
        panic!("{e}\n  bytes: {:?}", String::from_utf8_lossy(bytes));
    }
    weir
}

/// The request a first one tried to hide: framed by both fields.
const SMUGGLED: &[u8] =
    b"POST /conf HTTP/1.1\r\nHost: x\r\nContent-Length: 41\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";

/// The four first requests a security review used to make the guard stop
/// following (issue 16, item 3): each is followed, and the request after it
/// is refused, however the bytes arrive.
#[test]
fn a_first_request_cannot_blind_the_guard() {
    let firsts: [&[u8]; 4] = [
        b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\nhello",
        b"GET /a HTTP/1.1\nHost: x\n\n",
        b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n00000000000000000005\r\nhello\r\n0\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: x\r\nUpgrade: foo\r\n\r\n",
    ];
    for first in firsts {
        let bytes = [first, SMUGGLED].concat();
        for pieces in [&[][..], &[1; 400][..], &[first.len() - 1, 7][..]] {
            let marks = check(&bytes, pieces);
            assert_eq!(
                marks.last(),
                Some(&Mark::Stop(
                    first.len(),
                    Stop::Refused(Refusal::FramingConflict)
                )),
                "{:?}",
                String::from_utf8_lossy(first)
            );
        }
    }
}

/// A lone CR before a request line is not an empty line: httparse refuses
/// it, and so does the guard now (it used to skip it and judge the rest).
#[test]
fn a_lone_cr_is_not_an_empty_line() {
    let marks = check(b"\rGET / HTTP/1.1\r\n\r\n", &[]);
    assert_eq!(marks, [Mark::Stop(0, Stop::Unparsed)]);
    let marks = check(b"\r\n\nGET / HTTP/1.1\r\n\r\n", &[]);
    assert_eq!(marks[0], Mark::Head { start: 3, end: 21 });
    // A CR at the end may be the start of a CRLF: held, not judged.
    assert!(check(b"GET / HTTP/1.1\r\n\r\n\r", &[]).len() == 2);
}

#[test]
fn the_reference_is_strict_where_it_matters() {
    let stop = |b: &[u8]| match frame(b).last() {
        Some(RefMark::Stop(_, RefStop::Invalid(why))) => Some(*why),
        _ => None,
    };
    assert!(stop(b"GET / HTTP/1.1\r\nHost : x\r\n\r\n").is_some());
    assert!(
        stop(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
            .is_some()
    );
    assert!(stop(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n").is_some());
    assert!(stop(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n").is_some());
    assert!(stop(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello").is_some());
    assert!(stop(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n").is_some());
    assert_eq!(
        frame(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 ;x=\"y\"\r\nhello\r\n0\r\nt: 1\r\n\r\nGET"),
        [RefMark::Head { start: 0, end: 47 }, RefMark::End(75)]
    );
    assert_eq!(
        frame(b"CONNECT a:443 HTTP/1.1\r\n\r\n"),
        [RefMark::Stop(0, RefStop::Tunnel)]
    );
}

/// Pieces of requests, valid and not, to build connections from.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"GET / HTTP/1.1\r\n".to_vec()),
        Just(b"POST /p HTTP/1.1\r\n".to_vec()),
        Just(b"GET / HTTP/1.0\n".to_vec()),
        Just(b"CONNECT a:1 HTTP/1.1\r\n".to_vec()),
        Just(b"PRI * HTTP/2.0\r\n".to_vec()),
        Just(b"Host: x\r\n".to_vec()),
        Just(b"Content-Length: 5\r\n".to_vec()),
        Just(b"Content-Length: 05\r\n".to_vec()),
        Just(b"content-length: 0\r\n".to_vec()),
        Just(b"Content-Length: 5, 5\r\n".to_vec()),
        Just(b"Transfer-Encoding: chunked\r\n".to_vec()),
        Just(b"Transfer-Encoding: gzip, chunked\r\n".to_vec()),
        Just(b"Transfer-Encoding: chunked,\r\n".to_vec()),
        Just(b"Upgrade: foo\r\n".to_vec()),
        Just(b"Connection: upgrade\r\n".to_vec()),
        Just(b"X: a\tb\r\n".to_vec()),
        Just(b" folded\r\n".to_vec()),
        Just(b"Bad Name: 1\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"hello".to_vec()),
        Just(b"5\r\nhello\r\n".to_vec()),
        Just(b"5 ;e=1\r\nhello\r\n".to_vec()),
        Just(b"0\r\n\r\n".to_vec()),
        Just(b"0\r\nx-t: 1\r\n\r\n".to_vec()),
        Just(b"00000000000000000005\r\n".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..6),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn weir_and_the_reference_agree_where_requests_end(
        pieces in proptest::collection::vec(piece(), 0..16),
        reads in proptest::collection::vec(0usize..40, 0..6),
    ) {
        let bytes = pieces.concat();
        // However the bytes arrive, the guard decides the same (where in
        // a bad chunked body it noticed is the one thing that may move).
        let same = |marks: Vec<Mark>| -> Vec<Mark> {
            marks
                .into_iter()
                .map(|m| match m {
                    Mark::Stop(_, Stop::BadChunked) => Mark::Stop(0, Stop::BadChunked),
                    m => m,
                })
                .collect()
        };
        let whole = same(check(&bytes, &[]));
        prop_assert_eq!(same(check(&bytes, &reads)), whole);
    }
}
