//! The one pool of weir's own HTTP/1.1 upstream connections
//! (docs/reference/endpoints.md#connections): both paths take from it and
//! give back to it, and a connection goes back only when it may carry
//! another request — never one the upstream said it closes, never one with
//! a response left half-read on it.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads one request head; `None` when the connection ended first.
async fn head(s: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(1) => buf.push(b[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// One GET on a new client connection that says it closes; the whole answer.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n");
    let answer = tokio::time::timeout(Duration::from_secs(5), exchange_raw(addr, req.as_bytes()));
    answer.await.expect("weir answered within 5 s")
}

async fn a_connection_outlives_the_client_connection_that_used_it(path: DataPath) {
    let up = RawUpstream::start(|_, mut s| async move {
        while let Some(h) = head(&mut s).await {
            let path = h.split(' ').nth(1).unwrap_or("").to_string();
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{path}",
                path.len()
            );
            if s.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    for i in 0..5 {
        let out = get(weir.addr, &format!("/r{i}")).await;
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with(&format!("/r{i}")),
            "{out}"
        );
        // The lease goes back when the client connection has ended.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        up.connections(),
        1,
        "five client connections, one upstream connection"
    );
}
both_paths!(
    #[tokio::test]
    a_connection_outlives_the_client_connection_that_used_it
);

async fn a_connection_the_upstream_closes_is_never_reused(path: DataPath) {
    // Says `Connection: close` and then keeps the socket open without
    // reading: a connection taken again would hang.
    let up = RawUpstream::start(|_, mut s| async move {
        if head(&mut s).await.is_some() {
            let reply = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok";
            let _ = s.write_all(reply.as_bytes()).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    for _ in 0..3 {
        let out = get(weir.addr, "/").await;
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with("ok"),
            "{out}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(up.connections(), 3);
}
both_paths!(
    #[tokio::test]
    a_connection_the_upstream_closes_is_never_reused
);

async fn a_response_left_half_read_never_answers_the_next_request(path: DataPath) {
    // `/big` is 4 MiB of `x`; anything else is answered with its path.
    let up = RawUpstream::start(|_, mut s| async move {
        while let Some(h) = head(&mut s).await {
            let path = h.split(' ').nth(1).unwrap_or("").to_string();
            let body = match path.as_str() {
                "/big" => vec![b'x'; 4 << 20],
                _ => path.into_bytes(),
            };
            let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
            if s.write_all(reply.as_bytes()).await.is_err() || s.write_all(&body).await.is_err() {
                return;
            }
        }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    // A client that reads the head of /big and a little of its body, then leaves.
    let mut c = TcpStream::connect(weir.addr).await.unwrap();
    c.write_all(b"GET /big HTTP/1.1\r\nHost: svc\r\n\r\n")
        .await
        .unwrap();
    let mut some = vec![0u8; 64 << 10];
    let n = c.read(&mut some).await.unwrap();
    assert!(String::from_utf8_lossy(&some[..n]).starts_with("HTTP/1.1 200"));
    drop(c);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 0..3 {
        let out = get(weir.addr, &format!("/small{i}")).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.ends_with(&format!("\r\n\r\n/small{i}")), "{out:.300}");
    }
}
both_paths!(
    #[tokio::test]
    a_response_left_half_read_never_answers_the_next_request
);
