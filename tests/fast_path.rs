//! The HTTP/1.1 fast path (`proxy::fast`): what it does with framing,
//! pipelining, pooled upstream connections and the hand-over to the general
//! path. Everything else a client sees is covered by the other suites, which
//! run against whichever path a request takes.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Echoes "METHOD PATH BODY" in the body.
async fn echo() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let line = format!("{} {} ", req.method(), req.uri().path());
        let b = req.into_body().collect().await.unwrap().to_bytes();
        let mut text = line.into_bytes();
        text.extend_from_slice(&b);
        Response::new(body(text))
    })
    .await
}

/// Serves each connection with `reply` for every request head it reads.
async fn raw_upstream(reply: &'static str, close_after: bool) -> RawUpstream {
    RawUpstream::start(move |_, mut s| async move {
        while read_head(&mut s).await {
            if s.write_all(reply.as_bytes()).await.is_err() || close_after {
                return;
            }
        }
    })
    .await
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let up = echo().await;
    let weir = Weir::single(&up.url(), "").await;
    let out = exchange_raw(
        weir.addr,
        b"GET /a HTTP/1.1\r\nHost: svc\r\n\r\n\
          POST /b HTTP/1.1\r\nHost: svc\r\nContent-Length: 3\r\n\r\nxyz\
          GET /c HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    let a = out.find("GET /a ").unwrap();
    let b = out.find("POST /b xyz").unwrap();
    let c = out.find("GET /c ").unwrap();
    assert!(a < b && b < c, "{out}");
    assert_eq!(out.matches("HTTP/1.1 200").count(), 3, "{out}");
    assert_eq!(up.requests(), 3);
}

#[tokio::test]
async fn a_connection_moves_to_the_general_path_without_losing_a_byte() {
    let up = echo().await;
    let weir = Weir::single(&up.url(), "").await;
    // A chunked body with a trailer is not the fast path's: the connection
    // is handed to hyper with everything read so far, the third request
    // included.
    let out = exchange_raw(
        weir.addr,
        b"GET /one HTTP/1.1\r\nHost: svc\r\n\r\n\
          POST /two HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n0\r\nx-sum: 1\r\n\r\n\
          GET /three HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    let one = out.find("GET /one ").unwrap();
    let two = out.find("POST /two hello").unwrap();
    let three = out.find("GET /three ").unwrap();
    assert!(one < two && two < three, "{out}");
    assert_eq!(up.requests(), 3);
    // The general path takes its upstream connection from the same pool:
    // the one the fast path used for the first request serves all three.
    assert_eq!(up.connections(), 1);
}

#[tokio::test]
async fn chunked_request_bodies_stay_on_the_fast_path() {
    let up = echo().await;
    let weir = Weir::single(&up.url(), "").await;
    let out = exchange_raw(
        weir.addr,
        b"GET /one HTTP/1.1\r\nHost: svc\r\n\r\n\
          POST /two HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n1;ext=\"x\"\r\n!\r\n0\r\n\r\n\
          POST /empty HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n\
          GET /three HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    let one = out.find("GET /one ").unwrap();
    let two = out.find("POST /two hello!").unwrap();
    let empty = out.find("POST /empty ").unwrap();
    let three = out.find("GET /three ").unwrap();
    assert!(one < two && two < empty && empty < three, "{out}");
    assert_eq!(out.matches("x-weir-attempts: 1\r\n").count(), 4, "{out}");
    assert_eq!(up.requests(), 4);
    // One pooled upstream connection: no request went through hyper.
    assert_eq!(up.connections(), 1);
}

/// A keyed write (docs/reference/idempotency.md#idempotency-keys) is served
/// by the fast path: forwarded and recorded, then its repeat answered from
/// the record, with requests before and after it on the same connection.
#[tokio::test]
async fn keyed_writes_stay_on_the_fast_path() {
    let up = echo().await;
    let weir = Weir::single(&up.url(), "").await;
    let out = exchange_raw(
        weir.addr,
        b"GET /one HTTP/1.1\r\nHost: svc\r\n\r\n\
          POST /pay HTTP/1.1\r\nHost: svc\r\nIdempotency-Key: k-1\r\nContent-Length: 5\r\n\r\nhello\
          POST /pay HTTP/1.1\r\nHost: svc\r\nIdempotency-Key: k-1\r\nContent-Length: 5\r\n\r\nhello\
          GET /three HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(out.matches("POST /pay hello").count(), 2, "{out}");
    assert_eq!(out.matches("idempotent-replayed: true").count(), 1, "{out}");
    assert!(out.contains("GET /three "), "{out}");
    // The repeat never reached the upstream, and one pooled upstream
    // connection carried the rest: nothing went through hyper.
    assert_eq!(up.requests(), 3);
    assert_eq!(up.connections(), 1);
}

/// weir with a cached upstream `svc` and, beside it, `plain` without a
/// cache: requests to `plain` before and after the cached ones tell which
/// path served the client connection in between (hyper's client would
/// open a connection of its own).
async fn cached_beside_plain(up: &TestUpstream, plain: &TestUpstream) -> Weir {
    Weir::start(&format!(
        "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n[upstreams.svc.cache]\nenabled = true\n\
         [upstreams.plain]\nurl = \"{}\"\nhosts = [\"plain\"]\n",
        up.url(),
        plain.url()
    ))
    .await
}

/// A cached upstream's requests stay on the fast path
/// (docs/reference/cache.md#response-cache): a miss is forwarded and stored,
/// its repeat answered from the entry, a write forwarded and its target's
/// entry dropped, the next read a miss again — all on one client
/// connection and one pooled upstream connection.
#[tokio::test]
async fn cache_misses_and_writes_stay_on_the_fast_path() {
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let n = n.clone();
        async move {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let text = format!("{} {} #{i}", req.method(), req.uri().path());
            Response::builder()
                .header("cache-control", "max-age=60")
                .body(body(text))
                .unwrap()
        }
    })
    .await;
    // A second upstream without a cache: its requests before and after
    // tell which path served the connection in between.
    let plain = echo().await;
    let weir = cached_beside_plain(&up, &plain).await;
    let out = exchange_raw(
        weir.addr,
        b"GET /before HTTP/1.1\r\nHost: plain\r\n\r\n\
          GET /item HTTP/1.1\r\nHost: svc\r\n\r\n\
          GET /item HTTP/1.1\r\nHost: svc\r\n\r\n\
          POST /item HTTP/1.1\r\nHost: svc\r\nContent-Length: 1\r\n\r\nx\
          GET /item HTTP/1.1\r\nHost: svc\r\n\r\n\
          GET /after HTTP/1.1\r\nHost: plain\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        out.contains("GET /before ") && out.contains("GET /after "),
        "{out}"
    );
    // One pooled connection to each upstream: nothing went through hyper,
    // whose client would have opened its own.
    assert_eq!(plain.connections(), 1);
    let marks: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("x-weir-cache: "))
        .collect();
    assert_eq!(marks, ["miss", "hit", "miss"], "{out}");
    let bodies = [
        "GET /item #1",
        "GET /item #1",
        "POST /item #2",
        "GET /item #3",
    ];
    let mut at = 0;
    for b in bodies {
        let i = out[at..]
            .find(b)
            .unwrap_or_else(|| panic!("{b} after {at}: {out}"));
        at += i + b.len();
    }
    assert_eq!(up.requests(), 3);
    assert_eq!(up.connections(), 1);
}

/// Two cached reads on one client connection, `pause` apart, between two
/// requests to an upstream without a cache: the cache's marks on the two
/// reads, the upstream's requests, and whether the connection stayed on the
/// fast path (the plain upstream saw one connection).
async fn two_reads(cache_control: &'static str, pause: Duration) -> (Vec<String>, usize, usize) {
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let n = n.clone();
        async move {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let b = Response::builder()
                .header("cache-control", cache_control)
                .header("etag", "\"v1\"");
            if req
                .headers()
                .get("if-none-match")
                .is_some_and(|v| v == "\"v1\"")
            {
                return b.status(304).body(body("")).unwrap();
            }
            b.body(body(format!("item #{i}"))).unwrap()
        }
    })
    .await;
    let plain = echo().await;
    let weir = cached_beside_plain(&up, &plain).await;
    let mut c = TcpStream::connect(weir.addr).await.unwrap();
    c.write_all(
        b"GET /before HTTP/1.1\r\nHost: plain\r\n\r\nGET /item HTTP/1.1\r\nHost: svc\r\n\r\n",
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let mut b = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("item #1") {
        let n = c.read(&mut b).await.unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&b[..n]);
    }
    tokio::time::sleep(pause).await;
    c.write_all(b"GET /item HTTP/1.1\r\nHost: svc\r\n\r\nGET /after HTTP/1.1\r\nHost: plain\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    c.read_to_end(&mut seen).await.unwrap();
    let out = String::from_utf8_lossy(&seen).into_owned();
    let marks: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix("x-weir-cache: "))
        .map(str::to_string)
        .collect();
    assert_eq!(out.matches("item #1").count(), 2, "{out}");
    assert!(out.contains("GET /after "), "{out}");
    // A background refresh, if any, has gone upstream.
    for _ in 0..100 {
        if up.requests() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (marks, up.requests(), plain.connections())
}

/// A stale entry within its `stale-while-revalidate` is answered on the
/// fast path too, and refreshed once in the background.
#[tokio::test(start_paused = true)]
async fn stale_answers_stay_on_the_fast_path() {
    let swr = "max-age=1, stale-while-revalidate=60";
    let (marks, requests, plain) = two_reads(swr, Duration::from_secs(5)).await;
    assert_eq!(marks, ["miss", "stale"]);
    assert_eq!((requests, plain), (2, 1));
}

/// An entry past its lifetime is revalidated on the fast path: asked for
/// with its validators, and a 304 refreshes it and answers.
#[tokio::test(start_paused = true)]
async fn revalidations_stay_on_the_fast_path() {
    let (marks, requests, plain) = two_reads("max-age=1", Duration::from_secs(5)).await;
    assert_eq!(marks, ["miss", "revalidated"]);
    assert_eq!((requests, plain), (2, 1));
}

/// The upstream sees a chunked body in the plainest form of the coding:
/// sizes in lowercase hex, no extensions, whatever the client sent.
#[tokio::test]
async fn a_chunked_request_body_is_coded_anew() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let up = RawUpstream::start(move |_, mut c| {
        let s = s.clone();
        async move {
            let mut buf = Vec::new();
            let mut b = [0u8; 1024];
            while !buf.ends_with(b"0\r\n\r\n") {
                match c.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&b[..n]),
                }
            }
            s.lock().unwrap().push(buf);
            respond(&mut c, 200, "", "ok").await;
        }
    })
    .await;
    let weir = Weir::single(&up.url(), "").await;
    let out = exchange_raw(
        weir.addr,
        b"POST /x HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n\
          000A ; a=b\r\n0123456789\r\n0\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let sent = String::from_utf8(seen.lock().unwrap().pop().unwrap()).unwrap();
    let (head, body) = sent.split_once("\r\n\r\n").unwrap();
    assert!(head.contains("\r\ntransfer-encoding: chunked"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("content-length"),
        "{head}"
    );
    assert_eq!(body, "a\r\n0123456789\r\n0\r\n\r\n");
}

/// A chunked body that is still coming when a head would have timed out is
/// handed to the general path with what has arrived, not dropped.
#[tokio::test(start_paused = true)]
async fn a_slow_chunked_body_is_handed_over_not_cut() {
    let up = echo().await;
    let weir = Weir::with_server(
        "header_read_timeout = \"1s\"",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
            up.url()
        ),
    )
    .await;
    let mut c = TcpStream::connect(weir.addr).await.unwrap();
    c.write_all(b"POST /slow HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.write_all(b"6\r\n world\r\n0\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("POST /slow hello world"), "{out}");
}

#[tokio::test]
async fn upstream_connections_follow_requests_in_flight_not_client_connections() {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single(&up.url(), "").await;
    for _ in 0..10 {
        let out = exchange_raw(
            weir.addr,
            b"GET / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.contains("x-weir-attempts: 1\r\n"), "{out}");
    }
    assert_eq!(up.requests(), 10);
    assert_eq!(
        up.connections(),
        1,
        "one pooled upstream connection serves all"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_upstream_connection_the_upstream_closed_is_not_used() {
    // Answers one request per connection, then closes it without saying so.
    let up = raw_upstream("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", true).await;
    let weir = Weir::single(&up.url(), "").await;
    let c = client();
    let r = get(&c, &weir.url("/"), "svc").await;
    assert_eq!(r.status(), 200);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A POST is never replayed after it was written: had weir sent it on the
    // closed connection, it would get 502 upstream_reset.
    let req = Request::post(weir.url("/"))
        .header("host", "svc")
        .body(body("payload"))
        .unwrap();
    let (parts, b) = read_body(c.request(req).await.unwrap()).await;
    assert_eq!(parts.status, 200, "{b:?}");
    assert_eq!(header(&parts, "x-weir-attempts"), "1");
    assert_eq!(up.connections(), 2);
}

#[tokio::test]
async fn chunked_responses_and_trailers_pass_through_on_a_reused_connection() {
    let up = raw_upstream(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n\
         5\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 11\r\nx-weir-retry-stop: forged\r\n\r\n",
        false,
    )
    .await;
    let weir = Weir::single(&up.url(), "").await;
    let c = client();
    for _ in 0..3 {
        let resp = get(&c, &weir.url("/"), "svc").await;
        assert_eq!(resp.status(), 200);
        let collected = resp.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap();
        assert_eq!(trailers.get("x-sum").unwrap(), "11");
        assert!(
            trailers.get("x-weir-retry-stop").is_none(),
            "a forged trailer passed"
        );
        assert_eq!(collected.to_bytes(), "hello world");
    }
    assert_eq!(up.connections(), 1);
}

#[tokio::test]
async fn a_close_delimited_response_is_relayed_then_the_connection_closes() {
    let up = raw_upstream(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end",
        true,
    )
    .await;
    let weir = Weir::single(&up.url(), "").await;
    let out = exchange_raw(weir.addr, b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("connection: close\r\n"), "{out}");
    assert!(out.ends_with("\r\n\r\nuntil the end"), "{out}");
    // The upstream sent no Date; weir, forwarding it, adds one.
    assert_eq!(out.matches("\r\ndate: ").count(), 1, "{out}");
}

#[tokio::test]
async fn head_responses_keep_their_length_and_carry_no_body() {
    let up = raw_upstream("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", false).await;
    let weir = Weir::single(&up.url(), "").await;
    let out = exchange_raw(
        weir.addr,
        b"HEAD / HTTP/1.1\r\nHost: svc\r\n\r\nHEAD / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(out.matches("HTTP/1.1 200").count(), 2, "{out}");
    assert_eq!(out.matches("content-length: 5\r\n").count(), 2, "{out}");
    assert!(out.ends_with("\r\n\r\n"), "{out}");
    assert_eq!(up.connections(), 1);
}

#[tokio::test]
async fn interim_responses_from_the_upstream_are_dropped() {
    let up = raw_upstream(
        "HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n\
         HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        false,
    )
    .await;
    let weir = Weir::single(&up.url(), "").await;
    let (parts, b) = read_body(get(&client(), &weir.url("/"), "svc").await).await;
    assert_eq!(parts.status, 200);
    assert_eq!(b, "ok");
}

#[tokio::test]
async fn a_large_response_streams_through_intact() {
    let big: Vec<u8> = (0..(3 << 20)).map(|i: u32| (i % 251) as u8).collect();
    let expected = big.clone();
    let up = TestUpstream::start(move |_| {
        let big = big.clone();
        async move { Response::new(body(big)) }
    })
    .await;
    let weir = Weir::single(&up.url(), "").await;
    let (parts, b) = read_body(get(&client(), &weir.url("/"), "svc").await).await;
    assert_eq!(parts.status, 200);
    assert_eq!(b.len(), expected.len());
    assert!(b == expected, "the body arrived altered");
}

#[tokio::test]
async fn a_response_head_that_does_not_parse_is_502_bad_response() {
    let up = raw_upstream("NOT HTTP AT ALL\r\n\r\n", true).await;
    let weir = Weir::single(&up.url(), "[upstreams.svc.retry]\nmax_attempts = 1\n").await;
    let (status, code, _) = json_error(get(&client(), &weir.url("/"), "svc").await).await;
    assert_eq!((status, code.as_str()), (502, "bad_response"));
}

// A body's gaps are bounded by `idle_timeout`, not `timeout`, since issue
// 54 (docs/reference/deadlines.md#uploads).
#[tokio::test(start_paused = true)]
async fn a_body_announced_but_not_sent_in_time_is_504_and_closes() {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single(&up.url(), "idle_timeout = \"1s\"").await;
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nHost: svc\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 504"), "{out}");
    assert!(out.contains("deadline_exceeded"), "{out}");
    assert_eq!(up.requests(), 0);
}

#[tokio::test]
async fn weir_errors_to_head_requests_announce_their_body_without_sending_it() {
    let gone = refused_addr().await;
    let weir = Weir::single(
        &format!("http://{gone}"),
        "[upstreams.svc.retry]\nmax_attempts = 1\n",
    )
    .await;
    let out = exchange_raw(
        weir.addr,
        b"HEAD / HTTP/1.1\r\nHost: svc\r\n\r\nGET / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(out.matches("HTTP/1.1 502").count(), 2, "{out}");
    assert_eq!(
        out.matches("x-weir-error: connect_failed").count(),
        2,
        "{out}"
    );
    // Only the GET carries the JSON body; the HEAD's would be read as the
    // start of the next response.
    assert_eq!(out.matches("{\"error\"").count(), 1, "{out}");
    assert!(out.contains("\r\n\r\nHTTP/1.1 502"), "{out}");
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
}

#[tokio::test]
async fn pipelined_requests_before_a_half_close_are_all_answered() {
    let up = echo().await;
    let weir = Weir::single(&up.url(), "").await;
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(b"GET /a HTTP/1.1\r\nHost: svc\r\n\r\nGET /b HTTP/1.1\r\nHost: svc\r\n\r\n")
        .await
        .unwrap();
    s.shutdown().await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out);
    assert_eq!(out.matches("HTTP/1.1 200").count(), 2, "{out}");
    assert!(out.contains("GET /a ") && out.contains("GET /b "), "{out}");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_while_queued_is_never_sent_upstream() {
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let r = r.clone();
        async move {
            if req.uri().path() == "/slow" {
                r.notified().await;
            }
            Response::new(body("done"))
        }
    })
    .await;
    let weir = Weir::single(
        &up.url(),
        "[upstreams.svc.concurrency]\nmax_in_flight = 1\nmax_queue = 1\n",
    )
    .await;
    let slow = tokio::spawn({
        let url = weir.url("/slow");
        async move { read_body(get(&client(), &url, "svc").await).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut b = TcpStream::connect(weir.addr).await.unwrap();
    b.write_all(b"POST /queued HTTP/1.1\r\nHost: svc\r\nContent-Length: 2\r\n\r\nhi")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(b);
    tokio::time::sleep(Duration::from_millis(50)).await;
    release.notify_one();
    let (parts, _) = slow.await.unwrap();
    assert_eq!(parts.status, 200);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(up.requests(), 1, "the abandoned POST reached the upstream");
}

#[tokio::test(start_paused = true)]
async fn an_upstream_that_answers_before_reading_the_body_is_heard() {
    // Reads the head, refuses the body with 413 and stops reading. (On
    // loopback the kernel's buffers take all of a 1 MiB body, so weir's
    // write does not block here as it can across a network; what this shows
    // is that the early answer reaches the client unchanged.)
    let up = RawUpstream::start(|_, mut s| async move {
        read_head(&mut s).await;
        let _ = s
            .write_all(
                b"HTTP/1.1 413 Too Large\r\ncontent-length: 8\r\nconnection: close\r\n\r\ntoo much",
            )
            .await;
        std::future::pending::<()>().await;
    })
    .await;
    let weir = Weir::single(
        &up.url(),
        "[upstreams.svc.retry]\nmax_replay_body_bytes = 1048576\n",
    )
    .await;
    let req = Request::put(weir.url("/upload"))
        .header("host", "svc")
        .body(body(vec![b'x'; 1_000_000]))
        .unwrap();
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    assert_eq!(parts.status, 413, "{b:?}");
    assert_eq!(b, "too much");
    assert_eq!(header(&parts, "x-weir-attempts"), "1");
}

#[tokio::test(start_paused = true)]
async fn a_response_written_while_draining_says_the_connection_closes() {
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let up = TestUpstream::start(move |_| {
        let r = r.clone();
        async move {
            r.notified().await;
            Response::new(body("late"))
        }
    })
    .await;
    let weir = Weir::single(&up.url(), "").await;
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    weir.handle.as_ref().unwrap().stop_accepting();
    release.notify_one();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("connection: close\r\n"), "{out}");
    assert!(out.ends_with("late"), "{out}");
}

/// A request to an h2c upstream is served by the fast path, which keeps the
/// client connection: the HTTP/1.1 upstream's next request goes out on the
/// same pooled connection as its first (handed to hyper, the connection
/// would reach it on one of hyper's own). Bodies of known length, chunked
/// and none, a HEAD and a 204 on the way, each framed for HTTP/1.1.
#[tokio::test]
async fn requests_to_an_h2c_upstream_stay_on_the_fast_path() {
    let h1 = echo().await;
    let h2 = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        assert_eq!(req.version(), http::Version::HTTP_2);
        let path = req.uri().path().to_string();
        // A field its `Connection` named is dropped on the way.
        let hop = req.headers().contains_key("x-hop");
        let line = format!("{} {path} hop={hop} ", req.method());
        let b = req.into_body().collect().await.unwrap().to_bytes();
        let mut text = line.into_bytes();
        text.extend_from_slice(&b);
        match path.as_str() {
            "/none" => Response::builder().status(204).body(body("")).unwrap(),
            // No length: the body comes in two frames.
            "/stream" => {
                let frames = futures_util::stream::iter([
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(http_body::Frame::data(
                        bytes::Bytes::from_static(b"one,"),
                    )),
                    Ok(http_body::Frame::data(bytes::Bytes::from(text))),
                ]);
                Response::new(BodyExt::boxed(http_body_util::StreamBody::new(frames)))
            }
            _ => Response::new(body(text)),
        }
    })
    .await;
    let weir = Weir::start(&format!(
        "[upstreams.one]\nurl = \"{}\"\nhosts = [\"one\"]\n\
         [upstreams.two]\nurl = \"{}\"\nhosts = [\"two\"]\nprotocol = \"h2c\"\n",
        h1.url(),
        h2.url()
    ))
    .await;
    let out = exchange_raw(
        weir.addr,
        b"GET /a HTTP/1.1\r\nHost: one\r\n\r\n\
          POST /b HTTP/1.1\r\nHost: two\r\nContent-Length: 3\r\nConnection: x-hop\r\nX-Hop: 1\r\n\r\nxyz\
          POST /c HTTP/1.1\r\nHost: two\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
          GET /stream HTTP/1.1\r\nHost: two\r\n\r\n\
          HEAD /h HTTP/1.1\r\nHost: two\r\n\r\n\
          GET /none HTTP/1.1\r\nHost: two\r\n\r\n\
          GET /d HTTP/1.1\r\nHost: one\r\nConnection: close\r\n\r\n",
    )
    .await;
    let find = |s: &str| out.find(s).unwrap_or_else(|| panic!("{s:?} in {out}"));
    let at = [
        find("GET /a "),
        find("POST /b hop=false xyz"),
        find("POST /c hop=false hello"),
        find("4\r\none,\r\n16\r\nGET /stream hop=false \r\n0\r\n\r\n"),
        find("HTTP/1.1 204 No Content"),
        find("GET /d "),
    ];
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{out}");
    assert_eq!(out.matches("HTTP/1.1 200 OK\r\n").count(), 6, "{out}");
    assert_eq!(out.matches("x-weir-attempts: 1\r\n").count(), 7, "{out}");
    // Known lengths restated; the stream chunked.
    assert!(out.contains("content-length: 21\r\n"), "{out}");
    assert!(out.contains("transfer-encoding: chunked\r\n"), "{out}");
    // A HEAD gets the length the upstream announced, and no body.
    assert!(
        out.contains("content-length: 18\r\nx-weir-attempts: 1\r\n\r\nHTTP/1.1 204"),
        "{out}"
    );
    assert_eq!(h1.requests(), 2);
    assert_eq!(h2.requests(), 5);
    assert_eq!(h2.connections(), 1);
    // The second HTTP/1.1 request went out on the fast path's pooled
    // connection: the client connection never left the fast path.
    assert_eq!(h1.connections(), 1);
}

/// An h2c upstream on the fast path: a keyed write is recorded and its
/// repeat answered from the record; a response body that breaks off after
/// its first frame reaches the client cut (no last chunk) and ends the
/// client connection, the pipelined request after it unanswered.
#[tokio::test]
async fn h2c_keyed_writes_are_recorded_and_a_cut_body_ends_the_connection() {
    let up = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        if req.uri().path() == "/cut" {
            // The head and a first frame go out; a moment later, a reset.
            let frames = futures_util::stream::unfold(0, |n| async move {
                let frame: Result<_, Box<dyn std::error::Error + Send + Sync>> = match n {
                    0 => Ok(http_body::Frame::data(bytes::Bytes::from_static(b"first"))),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Err("cut".into())
                    }
                    _ => return None,
                };
                Some((frame, n + 1))
            });
            return Response::new(BodyExt::boxed(http_body_util::StreamBody::new(frames)));
        }
        let b = req.into_body().collect().await.unwrap().to_bytes();
        Response::builder()
            .status(201)
            .header("x-app", "yes")
            .body(body(b))
            .unwrap()
    })
    .await;
    // The binary's one capture: its lines come from weir's tasks, and the
    // path `/cut` is this test's alone.
    let logs = Captured::global();
    let weir = Weir::single(&up.url(), "protocol = \"h2c\"").await;
    let out = exchange_raw(
        weir.addr,
        b"POST /pay HTTP/1.1\r\nHost: svc\r\nIdempotency-Key: k-1\r\nContent-Length: 5\r\n\r\nhello\
          POST /pay HTTP/1.1\r\nHost: svc\r\nIdempotency-Key: k-1\r\nContent-Length: 5\r\n\r\nhello\
          GET /cut HTTP/1.1\r\nHost: svc\r\n\r\n\
          GET /never HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(out.matches("HTTP/1.1 201 Created\r\n").count(), 2, "{out}");
    assert_eq!(out.matches("x-app: yes\r\n").count(), 2, "{out}");
    assert_eq!(out.matches("\r\n\r\nhello").count(), 2, "{out}");
    assert_eq!(out.matches("idempotent-replayed: true").count(), 1, "{out}");
    assert!(out.contains("\r\n\r\n5\r\nfirst\r\n"), "{out}");
    assert!(
        out.ends_with("first\r\n"),
        "the cut body looked whole: {out}"
    );
    assert_eq!(out.matches("HTTP/1.1 ").count(), 3, "{out}");
    // The repeat never reached the upstream, nor did the request after the cut.
    assert_eq!(up.requests(), 2);
    // The cut is weir's `upstream_reset` in the access log (written as the
    // request ends; waited for, up to 2 s).
    let cut = || {
        let lines = logs.lines_of("weir::access");
        lines
            .iter()
            .any(|l| l.contains("/cut") && l.contains("upstream_reset"))
    };
    for _ in 0..200 {
        if cut() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(cut(), "{:#?}", logs.lines_of("weir::access"));
}
