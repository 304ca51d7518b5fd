//! What a draining weir does with the connections it holds
//! (docs/reference/shutdown.md#shutdown): an HTTP/2 connection gets a GOAWAY even
//! when it has not sent a request yet, and an idle HTTP/1.1 connection is
//! still closed at `client_idle_timeout` (never held open for ever, say by
//! a listener a reload removed).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use hyper::Request;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn svc(url: &str) -> String {
    format!("[upstreams.svc]\nurl = \"{url}\"\nhosts = [\"svc\"]\n")
}

#[tokio::test]
async fn an_h2_connection_that_sent_no_request_gets_a_goaway() {
    let up = TestUpstream::text("ok").await;
    let mut weir = Weir::with_server_on(
        DataPath::General,
        "shutdown_timeout = \"30s\"",
        &svc(&up.url()),
    )
    .await;
    let (mut send, conn) = h2_connect(weir.addr).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let h = weir.handle.take().unwrap();
    let started = Instant::now();
    let shut = tokio::spawn(async move { h.shutdown(Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The GOAWAY came: no new stream is taken on this connection.
    let r = send
        .send_request(Request::get("http://svc/").body(body("")).unwrap())
        .await;
    assert!(r.is_err(), "a stream was served after the drain began");
    // And with nothing in flight the connection ends: weir stops long
    // before shutdown_timeout.
    tokio::time::timeout(Duration::from_secs(5), shut)
        .await
        .expect("the drain waited on an h2 connection that had said nothing")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let _ = conn.await;
    assert_eq!(up.requests(), 0);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    an_idle_connection_is_closed_at_client_idle_timeout_while_draining
);
async fn an_idle_connection_is_closed_at_client_idle_timeout_while_draining(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let mut weir = Weir::with_server_on(
        path,
        "client_idle_timeout = \"5s\"\nshutdown_timeout = \"60s\"",
        &svc(&up.url()),
    )
    .await;
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"ok") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the answer");
        got.extend_from_slice(&buf[..n]);
    }
    let h = weir.handle.take().unwrap();
    tokio::spawn(async move { h.shutdown(Duration::from_secs(60)).await });
    let start = Instant::now();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(120), s.read_to_end(&mut rest)).await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(7),
        "an idle connection was closed after {took:?} of a drain"
    );
}
