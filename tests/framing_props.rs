//! A differential property for weir's one HTTP/1 framing module
//! (`h1`): for arbitrary request heads and bodies, the module (on
//! heads parsed by httparse, as the guard and the fast path parse them) and
//! hyper's server behind the guard — weir's general path — agree on where a
//! request ends, or the module refuses the request and hyper serves nothing
//! after it. Where they disagree, a request could be smuggled past whichever
//! reads the bytes second.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir::h1::{request_framing, Chunked, RequestFraming};

/// What follows every generated request on the same connection.
const NEXT: &[u8] = b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n";

fn framing_field() -> impl Strategy<Value = (String, String)> {
    let cl = prop_oneof![
        Just("0"),
        Just("5"),
        Just("12"),
        Just("+5"),
        Just("5,5"),
        Just("05"),
        Just("-1"),
        Just("99999999999999999999"),
    ];
    let te = prop_oneof![
        Just("chunked"),
        Just("Chunked"),
        Just("gzip, chunked"),
        Just("chunked, gzip"),
        Just("identity"),
        Just("chunked,"),
        Just("x, chunked "),
    ];
    prop_oneof![
        cl.prop_map(|v| ("Content-Length".to_string(), v.to_string())),
        te.prop_map(|v| ("Transfer-Encoding".to_string(), v.to_string())),
    ]
}

/// Body bytes: pieces of chunked coding, valid and not, and plain data.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"5\r\n".to_vec()),
        Just(b"hello\r\n".to_vec()),
        Just(b"0\r\n\r\n".to_vec()),
        Just(b"0\r\n".to_vec()),
        Just(b"x-t: 1\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"3;ext=1\r\nabc\r\n".to_vec()),
        Just(b"3 \t;e\r\nabc\r\n".to_vec()),
        Just(b"c\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"zz".to_vec()),
        Just(b" ".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..8),
    ];
    proptest::collection::vec(piece, 0..6).prop_map(|v| v.concat())
}

/// What the module makes of the first request.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// It ends after this many bytes.
    End(usize),
    /// It is refused (the guard stops following; hyper must refuse it too).
    Refused,
    /// It has not ended within the bytes.
    Incomplete,
}

fn module(bytes: &[u8]) -> Verdict {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut fields);
    let head = match req.parse(bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Verdict::Refused,
    };
    let framing = request_framing(
        req.version == Some(1),
        req.headers.iter().map(|h| (h.name, h.value)),
    );
    match framing {
        RequestFraming::Length(n) => {
            match usize::try_from(n).ok().and_then(|n| head.checked_add(n)) {
                Some(end) if end <= bytes.len() => Verdict::End(end),
                _ => Verdict::Incomplete,
            }
        }
        RequestFraming::Chunked => match Chunked::whole().feed(&bytes[head..]) {
            Ok(Some(n)) => Verdict::End(head + n),
            Ok(None) => Verdict::Incomplete,
            Err(_) => Verdict::Refused,
        },
        RequestFraming::Conflict | RequestFraming::Invalid(_) => Verdict::Refused,
    }
}

/// What hyper's server made of the bytes: each request's method and path, and whether
/// its body was read whole.
fn hyper_reads(bytes: Vec<u8>) -> Vec<(String, bool)> {
    // A paused clock: the read timeout fires only once hyper has done all
    // it can with the bytes, never because the runner stalled.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (client, server) = tokio::io::duplex(1 << 20);
        let s = seen.clone();
        let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let s = s.clone();
            async move {
                let path = format!("{} {}", req.method(), req.uri().path());
                // The guard's markers: weir's service answers them and
                // closes the connection; so does this one.
                let marker = req.uri().path().starts_with("/!weir-");
                let ok = req.into_body().collect().await.is_ok();
                s.lock().unwrap().push((path, ok));
                let mut resp = hyper::Response::new(Full::new(Bytes::new()));
                if marker {
                    resp.headers_mut().insert(
                        hyper::header::CONNECTION,
                        hyper::header::HeaderValue::from_static("close"),
                    );
                }
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        // hyper behind the guard, as weir runs it: where the module refuses
        // a body the guard cuts the connection, so hyper cannot read on.
        let guarded = weir::cli::fuzzing::guard(server, 65536);
        let conn = tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(TokioIo::new(guarded), svc),
        );
        let (mut r, mut w) = tokio::io::split(client);
        let writer = tokio::spawn(async move {
            let _ = w.write_all(&bytes).await;
            let _ = w.shutdown().await;
        });
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_millis(500), r.read_to_end(&mut sink)).await;
        let _ = writer.await;
        conn.abort();
        let out = seen.lock().unwrap().clone();
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_module_and_hyper_agree_where_a_request_ends(
        fields in proptest::collection::vec(framing_field(), 0..3),
        body in body(),
    ) {
        let mut bytes = b"POST /first HTTP/1.1\r\nHost: x\r\n".to_vec();
        for (n, v) in &fields {
            bytes.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
        }
        bytes.extend_from_slice(b"\r\n");
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(NEXT);
        // Where the module says the first request ends, hyper must read its
        // body whole and take the next request from exactly there; where the
        // module refuses it (and the guard stops following), hyper must not
        // go on to the next request either.
        let verdict = module(&bytes);
        let seen = hyper_reads(bytes.clone());
        let hyper_next = seen.get(1).is_some_and(|(p, _)| p == "GET /next");
        match verdict {
            Verdict::End(end) => {
                // hyper skips empty lines before a request line (RFC 9112 §2.2).
                let rest = &bytes[end..];
                let skip = rest.iter().take_while(|b| **b == b'\r' || **b == b'\n').count();
                let next_here = rest[skip..].starts_with(NEXT);
                prop_assert!(
                    seen.first().is_some_and(|(p, ok)| p == "POST /first" && *ok),
                    "hyper did not read the first request whole: {:?}\n{}",
                    seen,
                    String::from_utf8_lossy(&bytes)
                );
                prop_assert_eq!(
                    hyper_next,
                    next_here,
                    "the module ends the request at {}, hyper elsewhere: {:?}\n{}",
                    end,
                    seen,
                    String::from_utf8_lossy(&bytes)
                );
            }
            Verdict::Refused => prop_assert!(
                !hyper_next,
                "the module refuses the request, hyper served the next: {:?}\n{}",
                seen,
                String::from_utf8_lossy(&bytes)
            ),
            Verdict::Incomplete => {}
        }
    }
}

/// A valid chunked body of `chunks`, with an extension on every other chunk
/// and a trailer field.
fn encode_chunked(chunks: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let ext = if i % 2 == 1 { ";ext=1" } else { "" };
        out.extend_from_slice(format!("{:x}{ext}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\nx-trailer: 1\r\n\r\n");
    out
}

proptest! {
    #[test]
    fn a_chunked_body_ends_where_it_ends_however_it_is_split(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..6),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..5),
    ) {
        let body = encode_chunked(&chunks);
        let mut with_next = body.clone();
        with_next.extend_from_slice(NEXT);
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(with_next.len())).collect();
        points.push(with_next.len());
        points.sort_unstable();
        let mut c = Chunked::whole();
        let mut at = 0;
        let mut end = None;
        for p in points {
            if p <= at {
                continue;
            }
            if let Some(n) = c.feed(&with_next[at..p]).unwrap() {
                end = Some(at + n);
                break;
            }
            at = p;
        }
        prop_assert_eq!(end, Some(body.len()));
        // Up to the trailers only: the end of the `0` line.
        let mut c = Chunked::until_trailers();
        let last = body.len() - b"x-trailer: 1\r\n\r\n".len();
        prop_assert_eq!(c.feed(&body).unwrap(), Some(last));
    }
}
