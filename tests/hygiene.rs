//! Header hygiene and the guards on what a client may send.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::{Request, Response};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Echoes the request's header names (sorted) in the body.
async fn header_echo() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let mut names: Vec<String> = req.headers().keys().map(|k| k.to_string()).collect();
        names.sort();
        Response::builder()
            .header("x-weir-error", "forged")
            .header("x-weir-attempts", "99")
            .header("connection", "x-upstream-private")
            .header("x-upstream-private", "1")
            .header("x-public", "1")
            .body(body(names.join(",")))
            .unwrap()
    })
    .await
}

async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    // The connection must end: read to EOF.
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

both_paths!(
    #[tokio::test]
    hop_by_hop_and_weir_headers_are_stripped_both_ways
);
async fn hop_by_hop_and_weir_headers_are_stripped_both_ways(path: DataPath) {
    let up = header_echo().await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let req = Request::get(weir.url("/"))
        .header("host", "svc")
        .header("connection", "x-secret")
        .header("x-secret", "do not forward")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("x-weir-timeout-ms", "5000")
        .header("x-weir-anything", "1")
        .header("x-app", "1")
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    let seen = String::from_utf8_lossy(&b).into_owned();
    for gone in [
        "x-secret",
        "keep-alive",
        "proxy-authorization",
        "x-weir-timeout-ms",
        "x-weir-anything",
    ] {
        assert!(
            !seen.split(',').any(|h| h == gone),
            "{gone} reached the upstream: {seen}"
        );
    }
    assert!(seen.split(',').any(|h| h == "x-app"), "{seen}");
    assert_eq!(parts.status, 200);
    assert!(
        parts.headers.get("x-weir-error").is_none(),
        "forged x-weir-error reached the client"
    );
    assert_eq!(parts.headers["x-weir-attempts"], "1");
    assert!(parts.headers.get("x-upstream-private").is_none());
    assert_eq!(parts.headers["x-public"], "1");
}

both_paths!(
    #[tokio::test]
    every_connection_field_counts_and_close_names_a_field_too
);
async fn every_connection_field_counts_and_close_names_a_field_too(path: DataPath) {
    // The common `keep-alive` and `close` options beside a name in a second
    // field; `close` is an option and, as a field name, hop-by-hop as well.
    let up = header_echo().await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let out = raw(
        weir.addr,
        b"GET / HTTP/1.1\r\nHost: svc\r\nConnection: keep-alive\r\nConnection: X-Second\r\n\
          x-second: 1\r\nclose: 1\r\nx-app: 1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let seen = out.rsplit("\r\n\r\n").next().unwrap_or_default();
    for gone in ["x-second", "close", "connection"] {
        assert!(
            !seen.split(',').any(|h| h == gone),
            "{gone} reached the upstream: {seen}"
        );
    }
    assert!(seen.split(',').any(|h| h == "x-app"), "{seen}");
}

both_paths!(
    #[tokio::test]
    content_length_with_transfer_encoding_is_400_and_closed
);
async fn content_length_with_transfer_encoding_is_400_and_closed(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let out = raw(
        weir.addr,
        b"POST / HTTP/1.1\r\nHost: svc\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: svc\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("x-weir-error: bad_request"), "{out}");
    assert_eq!(
        out.matches("HTTP/1.1").count(),
        1,
        "more than one response: {out}"
    );
    assert_eq!(up.requests(), 0);

    // The same after a good request on the same connection.
    let out = raw(
        weir.addr,
        b"GET /first HTTP/1.1\r\nHost: svc\r\n\r\nPOST / HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("HTTP/1.1 400"), "{out}");
    assert_eq!(up.requests(), 1);
}

both_paths!(
    #[tokio::test]
    conflicting_content_lengths_are_400
);
async fn conflicting_content_lengths_are_400(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let out = raw(
        weir.addr,
        b"POST / HTTP/1.1\r\nHost: svc\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    // weir's own error, as every response weir makes (it was hyper's bare 400).
    assert!(out.contains("x-weir-error: bad_request"), "{out}");
    assert!(out.contains("Content-Lengths that disagree"), "{out}");
    assert_eq!(up.requests(), 0);
    // The same for a Transfer-Encoding hyper would refuse and a signed length.
    for head in [
        &b"POST / HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: gzip\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: svc\r\nContent-Length: +5\r\n\r\nabcde",
    ] {
        let out = raw(weir.addr, head).await;
        assert!(out.starts_with("HTTP/1.1 400"), "{out}");
        assert!(out.contains("x-weir-error: bad_request"), "{out}");
    }
    assert_eq!(up.requests(), 0);
}

both_paths!(
    #[tokio::test]
    oversized_request_head_is_431
);
async fn oversized_request_head_is_431(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let big = "a".repeat(100 * 1024);
    let out = raw(
        weir.addr,
        format!("GET / HTTP/1.1\r\nHost: svc\r\nx-big: {big}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 431"), "{out}");
    assert_eq!(up.requests(), 0);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    slow_request_head_is_cut_at_header_read_timeout
);
async fn slow_request_head_is_cut_at_header_read_timeout(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::with_server_on(
        path,
        "header_read_timeout = \"3s\"",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
            up.url()
        ),
    )
    .await;
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    let head = b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n";
    let start = tokio::time::Instant::now();
    let mut sent = 0;
    for b in head {
        if s.write_all(&[*b]).await.is_err() {
            break;
        }
        sent += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Has weir closed the connection?
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => break,
            Err(_) => {}
        }
    }
    let elapsed = start.elapsed();
    assert!(
        sent < head.len(),
        "the whole head was accepted one byte per second"
    );
    assert!(
        elapsed >= Duration::from_secs(3) && elapsed <= Duration::from_secs(5),
        "{elapsed:?}"
    );
    assert_eq!(up.requests(), 0);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_connection_that_sends_nothing_is_closed_at_header_read_timeout
);
async fn a_connection_that_sends_nothing_is_closed_at_header_read_timeout(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::with_server_on(
        path,
        "header_read_timeout = \"2s\"",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
            up.url()
        ),
    )
    .await;
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    let start = tokio::time::Instant::now();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
    assert!(
        matches!(n, Ok(Ok(0)) | Ok(Err(_))),
        "connection still open: {n:?}"
    );
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
}
