//! Properties of the fast path's head handling (`proxy::fast::head`): bytes
//! from a client or an upstream never panic it, a valid head is always
//! taken whole and rewritten with the general path's hygiene, and a chunked
//! body's end is found however its bytes are split.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use std::path::Path;
use std::sync::Arc;
use weir::config::Config;
use weir::metrics::Metrics;
use weir::proxy::fast::head::{self, ChunkedRelay, Framing, Head, Parse};
use weir::proxy::{ListenerRole, Snapshot};
use weir::state::StateRegistry;
use weir::upstream::reach::ReachRegistry;

fn snapshot() -> Snapshot {
    let src = "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
               [upstreams.svc]\nurl = \"http://127.0.0.1:9\"\nhosts = [\"svc\"]\n";
    let config = Arc::new(Config::parse(Path::new("t.toml"), src).unwrap());
    let metrics = Arc::new(Metrics::new());
    let states = StateRegistry::new(metrics.clone()).sync(&config).unwrap();
    let reaches = ReachRegistry::new();
    let plan = reaches.plan(&config, &metrics).unwrap();
    let reached = reaches.apply(plan, &config, &metrics);
    Snapshot::build(config, states, reached, metrics).unwrap()
}

/// Headers weir never forwards as they came (`x-named` is named by the
/// request's `Connection` field; `Content-Length` and `Host` are rewritten).
fn dropped(n: &str) -> bool {
    matches!(
        n,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "upgrade"
            | "transfer-encoding"
            | "x-named"
            | "content-length"
            | "host"
    ) || n.starts_with("x-weir-")
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,12}",
        Just("keep-alive".to_string()),
        Just("proxy-authorization".to_string()),
        Just("x-weir-anything".to_string()),
        Just("x-named".to_string()),
        Just("te".to_string()),
    ]
}

fn request() -> impl Strategy<Value = (String, Vec<(String, String)>, Vec<u8>)> {
    (
        prop_oneof![
            Just("GET"),
            Just("POST"),
            Just("PUT"),
            Just("DELETE"),
            Just("HEAD")
        ],
        "/[a-z0-9/._-]{0,30}(\\?[a-z0-9=&]{0,10})?",
        proptest::collection::vec((name(), "[ -~]{0,20}"), 0..12),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(method, path, headers, body)| {
            let headers: Vec<(String, String)> = headers
                .into_iter()
                // Fields that send a request to the general path, or that
                // the test sets itself.
                .filter(|(n, _)| {
                    !matches!(
                        n.as_str(),
                        "host"
                            | "content-length"
                            | "transfer-encoding"
                            | "upgrade"
                            | "expect"
                            | "connection"
                            | "content-type"
                            | "grpc-timeout"
                            | "x-weir-timeout-ms"
                    )
                })
                // `TE: trailers` is forwarded (as the last field).
                .filter(|(n, v)| n != "te" || !v.to_ascii_lowercase().contains("trailers"))
                .map(|(n, v)| (n, v.trim().to_string()))
                .collect();
            (format!("{method} {path}"), headers, body)
        })
}

fn encode(line: &str, headers: &[(String, String)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{line} HTTP/1.1\r\nHost: svc\r\nConnection: x-named, keep-alive\r\n");
    for (n, v) in headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_bytes_from_a_client_are_planned_or_refused_without_panicking(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let snap = snapshot();
        let mut out = Vec::new();
        let _ = head::plan(&snap, &ListenerRole::Shared, &bytes, &mut out);
    }

    #[test]
    fn any_bytes_from_an_upstream_parse_or_fail_without_panicking(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        is_head_request in any::<bool>(),
    ) {
        let _ = head::parse_response(&bytes, is_head_request, || std::time::UNIX_EPOCH, &mut Vec::new());
        let _ = ChunkedRelay::default().feed(&bytes, &mut Vec::new());
    }

    #[test]
    fn a_valid_head_is_taken_whole_and_rewritten_with_hygiene(
        (line, headers, body) in request(),
        cut in any::<prop::sample::Index>(),
    ) {
        let snap = snapshot();
        let bytes = encode(&line, &headers, &body);
        let head_len = bytes.len() - body.len();
        // Every prefix of the head is incomplete, never a wrong answer.
        let at = cut.index(head_len);
        let mut out = Vec::new();
        prop_assert!(matches!(
            head::plan(&snap, &ListenerRole::Shared, &bytes[..at], &mut out),
            Parse::Partial
        ));
        let Parse::Done(p) = head::plan(&snap, &ListenerRole::Shared, &bytes, &mut out) else {
            panic!("not planned: {}", String::from_utf8_lossy(&bytes));
        };
        prop_assert_eq!(p.head_len, head_len);
        prop_assert_eq!(p.body_len, body.len());
        prop_assert_eq!(p.is_head_request, line.starts_with("HEAD "));
        // What goes upstream is a valid head, with the upstream's Host and
        // the body's length, and nothing hop-by-hop.
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut hs);
        prop_assert!(matches!(req.parse(&out), Ok(httparse::Status::Complete(n)) if n == out.len()));
        let sent: Vec<(String, String)> = req
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).into_owned()))
            .collect();
        let host: Vec<&(String, String)> = sent.iter().filter(|(n, _)| n == "host").collect();
        prop_assert_eq!(host.len(), 1);
        prop_assert_eq!(host[0].1.as_str(), "127.0.0.1:9");
        let lens: Vec<&(String, String)> = sent.iter().filter(|(n, _)| n == "content-length").collect();
        prop_assert_eq!(lens.len(), 1);
        prop_assert_eq!(lens[0].1.clone(), body.len().to_string());
        for (n, _) in &sent {
            prop_assert!(n == "host" || n == "content-length" || !dropped(n), "{} was forwarded", n);
        }
        // Every other header goes on, in order; a request without an
        // `x-request-id` gets the one weir made (32 hex digits), last.
        let kept: Vec<(String, String)> = headers
            .iter()
            .filter(|(n, _)| !dropped(n))
            .cloned()
            .collect();
        let mut forwarded: Vec<(String, String)> = sent
            .into_iter()
            .filter(|(n, _)| n != "host" && n != "content-length")
            .collect();
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("x-request-id")) {
            let made = forwarded.pop();
            prop_assert!(
                made.as_ref().is_some_and(|(n, v)| n == "x-request-id" && v.len() == 32),
                "{:?}", made
            );
        }
        prop_assert_eq!(forwarded, kept);
    }

    #[test]
    fn a_chunked_body_ends_where_it_ends_however_it_is_split(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..6),
        trailer in proptest::option::of("x-[a-z]{1,8}: [a-z0-9]{0,8}"),
        splits in proptest::collection::vec(1usize..17, 1..64),
    ) {
        let mut body = Vec::new();
        for c in &chunks {
            body.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            body.extend_from_slice(c);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"0\r\n");
        if let Some(t) = &trailer {
            body.extend_from_slice(t.as_bytes());
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"\r\n");
        let end = body.len();
        body.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let mut c = ChunkedRelay::default();
        let mut out = Vec::new();
        let mut at = 0;
        let mut found = None;
        for s in splits.iter().cycle() {
            let next = (at + s).min(body.len());
            if let Some(n) = c.feed(&body[at..next], &mut out).unwrap() {
                found = Some(at + n);
                break;
            }
            at = next;
            if at == body.len() {
                break;
            }
        }
        prop_assert_eq!(found, Some(end));
        // The client gets the body as it was (the trailers are not weir's).
        prop_assert_eq!(&out[..], &body[..end]);
    }

    #[test]
    fn a_relayed_response_head_is_valid_and_clean(
        status in 200u16..600,
        headers in proptest::collection::vec((name(), "[ -~]{0,20}"), 0..10),
        len in 0u64..100_000,
        attempts in 1u32..4,
    ) {
        let mut raw = format!("HTTP/1.1 {status} Whatever\r\nConnection: x-named\r\n");
        for (n, v) in &headers {
            if ["content-length", "transfer-encoding", "connection", "date"].contains(&n.as_str()) {
                continue;
            }
            raw.push_str(&format!("{n}: {}\r\n", v.trim()));
        }
        raw.push_str(&format!("content-length: {len}\r\n\r\n"));
        let now = || std::time::UNIX_EPOCH;
        let mut out = Vec::new();
        let Ok(Some(Head::Final(r))) = head::parse_response(raw.as_bytes(), false, now, &mut out) else {
            panic!("{raw}");
        };
        let framing = if status == 204 || status == 304 { Framing::Empty } else { Framing::Length(len) };
        prop_assert_eq!(r.framing, framing);
        let a = head::Annotations {
            attempts,
            stop: None,
            hedge: None,
        };
        head::finish_response(&mut out, Some(a), false);
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut hs);
        prop_assert!(matches!(resp.parse(&out), Ok(httparse::Status::Complete(n)) if n == out.len()));
        prop_assert_eq!(resp.code, Some(status));
        let names: Vec<String> = resp.headers.iter().map(|h| h.name.to_ascii_lowercase()).collect();
        for gone in ["connection", "x-named", "keep-alive", "x-weir-anything", "te", "proxy-authorization"] {
            prop_assert!(!names.contains(&gone.to_string()), "{} was relayed", gone);
        }
        // One Content-Length, except on a 204, which must carry none.
        let lengths = usize::from(status != 204);
        prop_assert_eq!(names.iter().filter(|n| *n == "content-length").count(), lengths);
        prop_assert_eq!(names.iter().filter(|n| *n == "date").count(), 1);
        let attempts_seen = resp.headers.iter().find(|h| h.name == "x-weir-attempts").map(|h| h.value.to_vec());
        prop_assert_eq!(attempts_seen, Some(attempts.to_string().into_bytes()));
    }
}
