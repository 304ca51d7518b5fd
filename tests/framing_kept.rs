//! Framing is kept (docs/reference/protocols.md#framing): a request body
//! with `Content-Length` reaches an upstream that reads only
//! `Content-Length` — as Python's `http.server` and most WSGI servers do —
//! with that same `Content-Length` and no `Transfer-Encoding`, whatever its
//! size, on both data paths, from HTTP/1.1 and HTTP/2 clients, keyed or
//! not; and an upstream's `Content-Length` reaches an HTTP/1.1 client.
//!
//! Regression: every body over 64 KiB (the fast path's buffer) went
//! upstream chunked without its length — the general path counted the
//! client's bytes through a `map_frame`, which forgets the body's size, and
//! the read-ahead for a replay did too — so such an upstream read an empty
//! body and answered 200 for an upload that never arrived. The upstreams in
//! the other tests (hyper, nginx) read chunked bodies, so none saw it.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::Request;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the upstream saw of one request.
#[derive(Debug, PartialEq)]
struct Seen {
    content_length: Option<u64>,
    transfer_encoding: Option<String>,
    sha256: String,
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn field(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// An upstream that frames requests by `Content-Length` alone, as
/// `http.server.BaseHTTPRequestHandler` does: no length, no body. It
/// answers what it saw, as `cl te sha256`, or — for `GET /download/N` — N
/// bytes with their `Content-Length`.
async fn length_only_upstream() -> RawUpstream {
    RawUpstream::start(|_, mut s| async move {
        loop {
            let mut buf = Vec::new();
            let mut b = [0u8; 16384];
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                match s.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&b[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            let cl: Option<u64> = field(&head, "content-length").and_then(|v| v.parse().ok());
            let te = field(&head, "transfer-encoding");
            let want = cl.unwrap_or(0) as usize;
            let mut got = buf[head_end..].to_vec();
            while got.len() < want {
                match s.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&b[..n]),
                }
            }
            got.truncate(want);
            let target = head.split(' ').nth(1).unwrap_or("/").to_string();
            let body = match target.strip_prefix("/download/") {
                Some(n) => pattern(n.parse().unwrap_or(0)),
                None => format!(
                    "{} {} {}",
                    cl.map_or("-".into(), |n| n.to_string()),
                    te.as_deref().unwrap_or("-"),
                    hex(&Sha256::digest(&got))
                )
                .into_bytes(),
            };
            let reply = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
            if s.write_all(reply.as_bytes()).await.is_err() || s.write_all(&body).await.is_err() {
                return;
            }
            // A chunked request it cannot read would leave its bytes on the
            // connection: like Python's server, it then closes.
            if te.is_some() {
                return;
            }
        }
    })
    .await
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

fn parse_seen(text: &str) -> Seen {
    let mut it = text.split(' ');
    let cl = it.next().unwrap_or("-");
    let te = it.next().unwrap_or("-");
    Seen {
        content_length: cl.parse().ok(),
        transfer_encoding: (te != "-").then(|| te.to_string()),
        sha256: it.next().unwrap_or("").to_string(),
    }
}

async fn post(w: &Weir, h2: bool, size: usize, key: Option<&str>, method: &str) -> (u16, Seen) {
    let data = pattern(size);
    // Over HTTP/2 the route is the `:authority`.
    let mut req = match h2 {
        true => Request::builder().uri("http://svc/upload"),
        false => Request::builder()
            .uri(w.url("/upload"))
            .header("host", "svc"),
    }
    .method(method)
    .header("content-length", size.to_string());
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let req = req.body(body(data)).unwrap();
    let resp = if h2 {
        h2_request(w.addr, req).await
    } else {
        client().request(req).await.unwrap()
    };
    let (parts, b) = read_body(resp).await;
    (
        parts.status.as_u16(),
        parse_seen(&String::from_utf8_lossy(&b)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_reaches_a_length_only_upstream_on_both_paths() {
    let up = length_only_upstream().await;
    let mut failures = Vec::new();
    for path in [DataPath::Fast, DataPath::General] {
        let w = Weir::single_on(path, &up.url(), "").await;
        for h2 in [false, true] {
            for size in [0usize, 1024, 65_536, 65_537, 1 << 20, 3 << 20] {
                for (key, method) in [(None, "POST"), (Some("k"), "POST"), (None, "PUT")] {
                    // A fresh key each time: a repeat would be a replay.
                    let key = key.map(|k| format!("{k}-{path:?}-{h2}-{size}"));
                    let (status, seen) = post(&w, h2, size, key.as_deref(), method).await;
                    let want = Seen {
                        content_length: Some(size as u64),
                        transfer_encoding: None,
                        sha256: hex(&Sha256::digest(pattern(size))),
                    };
                    if status != 200 || seen != want {
                        failures.push(format!(
                            "{path:?} {} {method} {size} B keyed={}: {status} {seen:?}",
                            if h2 { "h2c" } else { "http/1.1" },
                            key.is_some()
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_length_reaches_an_http1_client() {
    let up = length_only_upstream().await;
    for path in [DataPath::Fast, DataPath::General] {
        let w = Weir::single_on(path, &up.url(), "").await;
        for n in [0usize, 70_000, 8 << 20] {
            let resp = get(&client(), &w.url(&format!("/download/{n}")), "svc").await;
            let (parts, b) = read_body(resp).await;
            assert_eq!(parts.status, 200, "{path:?} {n}");
            assert_eq!(
                header(&parts, "content-length"),
                n.to_string(),
                "{path:?} {n}"
            );
            assert_eq!(header(&parts, "transfer-encoding"), "", "{path:?} {n}");
            assert_eq!(
                hex(&Sha256::digest(&b)),
                hex(&Sha256::digest(pattern(n))),
                "{path:?} {n}"
            );
        }
    }
}
