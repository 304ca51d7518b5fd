//! Client connections cannot be held open for nothing (a security review:
//! 1,010 sockets sending the HTTP/2 preface and an empty SETTINGS, then
//! nothing, took every one of `max_connections` and weir stopped answering;
//! even the 14-byte partial preface `PRI * HTTP/2.0` was never cut).
//!
//! - The HTTP/2 preface and a first frame must arrive within
//!   `header_read_timeout`.
//! - A connection with no request in flight is closed after
//!   `client_idle_timeout` (HTTP/2 with a GOAWAY).
//! - A request in flight keeps its connection, however long it takes.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::{Request, Response};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame.
const SETTINGS: &[u8] = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00";

async fn weir(up: &TestUpstream) -> Weir {
    Weir::with_server(
        "header_read_timeout = \"2s\"\nclient_idle_timeout = \"5s\"",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
            up.url()
        ),
    )
    .await
}

/// Sends `bytes`, then reads until weir closes the connection; how long
/// that took, or `None` if it stayed open for a minute.
async fn closed_after(weir: &Weir, bytes: &[u8]) -> Option<Duration> {
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    let start = Instant::now();
    s.write_all(bytes).await.unwrap();
    let mut sink = Vec::new();
    match tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut sink)).await {
        Ok(_) => Some(start.elapsed()),
        Err(_) => None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_partial_h2_preface_is_cut_at_header_read_timeout() {
    let up = TestUpstream::text("ok").await;
    let weir = weir(&up).await;
    let took = closed_after(&weir, b"PRI * HTTP/2.0").await;
    assert!(
        took.is_some_and(|t| t >= Duration::from_secs(2) && t < Duration::from_secs(3)),
        "{took:?}"
    );
    // The whole preface without a frame after it: the same.
    let took = closed_after(&weir, PREFACE).await;
    assert!(
        took.is_some_and(|t| t >= Duration::from_secs(2) && t < Duration::from_secs(3)),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_h2_connection_is_closed_at_client_idle_timeout() {
    let up = TestUpstream::text("ok").await;
    let weir = weir(&up).await;
    // Closed at 5 s with a GOAWAY; a client that does not answer the
    // goodbye's PING is let go at most `header_read_timeout` later.
    let took = closed_after(&weir, &[PREFACE, SETTINGS].concat()).await;
    assert!(
        took.is_some_and(|t| t >= Duration::from_secs(5) && t <= Duration::from_secs(8)),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_in_flight_keeps_its_connection() {
    // The upstream takes 8 s, longer than the 5 s idle timeout.
    let up = TestUpstream::start(|_req: Request<hyper::body::Incoming>| async move {
        tokio::time::sleep(Duration::from_secs(8)).await;
        Response::new(body("slow"))
    })
    .await;
    let weir = weir(&up).await;
    let req = Request::get("http://svc/slow").body(body("")).unwrap();
    let resp = h2_request(weir.addr, req).await;
    let (parts, b) = read_body(resp).await;
    assert_eq!((parts.status.as_u16(), &b[..]), (200, &b"slow"[..]));
}

/// Requests that finish are not "abandoned": 300 on one HTTP/2 connection
/// and 300 on one HTTP/1.1 keep-alive connection (general path), faster
/// than the reset limit, all succeed on the same connection.
#[tokio::test]
async fn finished_requests_never_count_as_resets() {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::with_server_on(
        DataPath::General,
        "max_resets_per_second = 10",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
            up.url()
        ),
    )
    .await;
    let (send, conn) = h2_connect(weir.addr).await;
    for i in 0..300 {
        let mut s = send.clone();
        let resp = s
            .send_request(Request::get("http://svc/").body(body("")).unwrap())
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        let (parts, b) = read_body(resp).await;
        assert_eq!(
            (parts.status.as_u16(), &b[..]),
            (200, &b"ok"[..]),
            "request {i}"
        );
    }
    conn.abort();
    gets_on_one_connection(weir.addr, 300, b"ok").await;
}

/// `n` GETs, one after another, on one HTTP/1.1 keep-alive connection to
/// `addr`: each is a 200 with `text`.
async fn gets_on_one_connection(addr: std::net::SocketAddr, n: usize, text: &[u8]) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    for i in 0..n {
        send.ready()
            .await
            .unwrap_or_else(|e| panic!("before request {i}: {e}"));
        let resp = send
            .send_request(
                Request::get("http://svc/")
                    .header("host", "svc")
                    .body(body(""))
                    .unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        let (parts, b) = read_body(resp).await;
        assert_eq!((parts.status.as_u16(), &b[..]), (200, text), "request {i}");
    }
    conn.abort();
}

/// Delayed rapid reset: streams opened and cancelled once the request is
/// under way, faster than `max_resets_per_second`, close the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapidly_reset_streams_close_the_connection() {
    let up = TestUpstream::start(|_req: Request<hyper::body::Incoming>| async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Response::new(body("slow"))
    })
    .await;
    let weir = Weir::with_server(
        "max_resets_per_second = 20",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
            up.url()
        ),
    )
    .await;
    let (send, conn) = h2_connect(weir.addr).await;
    let mut refused = false;
    for _ in 0..200 {
        let mut s = send.clone();
        // Send the request, give it a moment to reach the upstream, cancel.
        let call = tokio::spawn(async move {
            s.send_request(Request::get("http://svc/").body(body("")).unwrap())
                .await
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
        call.abort();
        if conn.is_finished() {
            refused = true;
            break;
        }
    }
    // The connection ends within a second of the limit being crossed.
    let closed = tokio::time::timeout(Duration::from_secs(3), conn).await;
    assert!(
        refused || closed.is_ok(),
        "weir kept a connection resetting 200 streams"
    );
}

/// Reads one response to a GET of `TestUpstream::text("ok")` off `s`
/// (its head, then the two bytes of its body); false when the connection
/// ended first.
async fn read_ok(s: &mut TcpStream) -> bool {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            if got.len() >= i + 4 + 2 {
                return got.starts_with(b"HTTP/1.1 200");
            }
        }
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_keep_alive_connection_idles_for_client_idle_timeout_not_header_read_timeout
);
/// An app's pool reuses a connection after 3 s: `header_read_timeout`
/// (2 s) bounds a head once it has begun, not the quiet between requests,
/// which `client_idle_timeout` (5 s) bounds.
async fn a_keep_alive_connection_idles_for_client_idle_timeout_not_header_read_timeout(
    path: DataPath,
) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::with_server_on(
        path,
        "header_read_timeout = \"2s\"\nclient_idle_timeout = \"5s\"",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
            up.url()
        ),
    )
    .await;
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    let get = b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n";
    s.write_all(get).await.unwrap();
    assert!(read_ok(&mut s).await, "first request");
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.write_all(get).await.unwrap();
    assert!(
        read_ok(&mut s).await,
        "the connection was closed after 3 s between requests"
    );
    // Idle past client_idle_timeout: closed.
    let start = Instant::now();
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut sink)).await;
    let took = start.elapsed();
    assert!(closed.is_ok(), "still open after a minute");
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(7),
        "closed after {took:?}"
    );
    // A head begun and not finished is still cut at header_read_timeout.
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(get).await.unwrap();
    assert!(read_ok(&mut s).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = Instant::now();
    s.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut sink)).await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(3),
        "a partial head was cut after {took:?}"
    );
}

/// The same over HTTP/2: a stream opened 3 s after the last one ended.
#[tokio::test(start_paused = true)]
async fn an_h2_connection_idles_for_client_idle_timeout_not_header_read_timeout() {
    let up = TestUpstream::text("ok").await;
    let weir = weir(&up).await;
    let (send, _conn) = h2_connect(weir.addr).await;
    for _ in 0..2 {
        let mut s = send.clone();
        let resp = s
            .send_request(Request::get("http://svc/").body(body("")).unwrap())
            .await
            .unwrap();
        assert_eq!(read_body(resp).await.1, &b"ok"[..]);
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// A body whose length is whole before its HTTP/2 upstream ends the stream
/// (a frame later) is finished for an HTTP/1.1 client, not abandoned:
/// hyper stops reading at the length and drops the body, and 200 such
/// requests on one keep-alive connection, faster than the reset limit, all
/// succeed on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_whole_before_the_upstream_ends_its_stream_is_not_abandoned() {
    let up = LateEnd::start(200, "whole", Duration::from_millis(2)).await;
    let weir = Weir::with_server_on(
        DataPath::General,
        "max_resets_per_second = 10",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nprotocol = \"h2c\"\nhosts = [\"svc\"]\n",
            up.url
        ),
    )
    .await;
    gets_on_one_connection(weir.addr, 200, b"whole").await;
    assert_eq!(up.served(), 200);
}
