//! What a draining weir does with the connections it holds
//! (docs/reference/shutdown.md#shutdown): an HTTP/2 connection gets a GOAWAY even
//! when it has not sent a request yet, and an idle HTTP/1.1 connection is
//! still closed at `client_idle_timeout` (never held open for ever, say by
//! a listener a reload removed), and one a drain finds in the middle of a
//! response is left open for its next request; connections queued in the
//! listener's backlog when it closes are served, not reset.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::Request;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn svc(url: &str) -> String {
    format!("[upstreams.svc]\nurl = \"{url}\"\nhosts = [\"svc\"]\n")
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n";

/// Reads from `s` into `got` until `done(got)`; the connection must not
/// close first.
async fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) {
    let mut buf = [0u8; 1024];
    while !done(got) {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(got));
        got.extend_from_slice(&buf[..n]);
    }
}

/// Begins weir's drain, returns once its listener lets the port go.
async fn begin_drain(weir: &mut Weir, grace: Duration) -> tokio::task::JoinHandle<()> {
    let h = weir.handle.take().unwrap();
    let shut = tokio::spawn(async move { h.shutdown(grace).await });
    let start = Instant::now();
    while TcpStream::connect(weir.addr).await.is_ok() {
        assert!(start.elapsed() < Duration::from_secs(5), "still accepting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shut
}

/// Reads what is left of `s` until weir closes it, within 5 s.
async fn rest_of(s: &mut TcpStream, why: &str) -> String {
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect(why);
    let rest = String::from_utf8_lossy(&rest).to_ascii_lowercase();
    assert!(r.is_ok(), "reset: {r:?} after {rest:?}");
    rest
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
    s.write_all(GET).await.unwrap();
    read_until(&mut s, &mut Vec::new(), |g| g.ends_with(b"ok")).await;
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

both_paths!(
    #[tokio::test]
    a_drain_that_begins_during_a_response_leaves_the_connection_for_its_next_request
);
/// A drain that begins after a response's head went out (without
/// `Connection: close`) does not close the connection after that response:
/// the client was told it stays open and may be sending its next request
/// on it that instant. The next request is answered, with `Connection:
/// close`, and the connection closes after it.
async fn a_drain_that_begins_during_a_response_leaves_the_connection_for_its_next_request(
    path: DataPath,
) {
    let finish = std::sync::Arc::new(tokio::sync::Notify::new());
    let first = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (f, fst) = (finish.clone(), first.clone());
    let up = RawUpstream::start(move |_, mut s| {
        let (finish, first) = (f.clone(), fst.clone());
        async move {
            while read_head(&mut s).await {
                if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    // Half the body now, the rest once the drain has begun.
                    let head = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nok";
                    if s.write_all(head).await.is_err() {
                        return;
                    }
                    finish.notified().await;
                    if s.write_all(b"ok").await.is_err() {
                        return;
                    }
                } else {
                    respond(&mut s, 200, "", "okok").await;
                }
            }
        }
    })
    .await;
    let mut weir = Weir::with_server_on(path, "shutdown_timeout = \"30s\"", &svc(&up.url())).await;
    let mut s = TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(GET).await.unwrap();
    let mut got = Vec::new();
    read_until(&mut s, &mut got, |g| g.windows(4).any(|w| w == b"\r\n\r\n")).await;
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(!head.contains("connection: close"), "{head}");
    let shut = begin_drain(&mut weir, Duration::from_secs(30)).await;
    finish.notify_one();
    read_until(&mut s, &mut got, |g| g.ends_with(b"okok")).await;
    // The connection is still there for the app's next request.
    s.write_all(GET).await.unwrap();
    let rest = rest_of(
        &mut s,
        "the connection was held open after its last response",
    )
    .await;
    assert!(
        rest.starts_with("http/1.1 200"),
        "the next request got {rest:?}"
    );
    assert!(rest.contains("connection: close"), "{rest}");
    assert!(rest.ends_with("okok"), "{rest}");
    tokio::time::timeout(Duration::from_secs(5), shut)
        .await
        .expect("the drain did not end")
        .unwrap();
}

both_paths!(
    #[tokio::test]
    connections_queued_in_the_backlog_at_the_drain_are_served_not_reset
);
/// Connections the kernel completed while weir was not accepting (here,
/// `max_connections` in use) are not reset when the listener closes: the
/// drain takes them, and each is served, with `Connection: close`, once a
/// slot frees.
async fn connections_queued_in_the_backlog_at_the_drain_are_served_not_reset(path: DataPath) {
    queued_at_the_drain(path, true).await;
}

both_paths!(
    #[tokio::test]
    a_queued_connection_no_slot_frees_for_is_served_after_header_read_timeout
);
/// When no slot frees within `header_read_timeout`, a connection taken
/// from the backlog is served without one rather than left waiting for
/// `shutdown_timeout` and then reset.
async fn a_queued_connection_no_slot_frees_for_is_served_after_header_read_timeout(path: DataPath) {
    queued_at_the_drain(path, false).await;
}

/// One idle connection holds the one slot, a second is queued in the
/// backlog with its request sent, the drain begins; the held connection's
/// next request frees the slot (`frees`) or it stays idle.
async fn queued_at_the_drain(path: DataPath, frees: bool) {
    let up = TestUpstream::text("ok").await;
    // Freed, the slot must be what answers the queued connection: a
    // `header_read_timeout` past the test's own 5 s bounds.
    let head = if frees { "30s" } else { "1s" };
    let mut weir = Weir::with_server_on(
        path,
        &format!(
            "max_connections = 1\nheader_read_timeout = \"{head}\"\nshutdown_timeout = \"30s\""
        ),
        &svc(&up.url()),
    )
    .await;
    let mut held = TcpStream::connect(weir.addr).await.unwrap();
    held.write_all(GET).await.unwrap();
    read_until(&mut held, &mut Vec::new(), |g| g.ends_with(b"ok")).await;
    let mut queued = TcpStream::connect(weir.addr).await.unwrap();
    queued.write_all(GET).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        up.requests(),
        1,
        "a second connection was served over the limit"
    );
    let shut = begin_drain(&mut weir, Duration::from_secs(30)).await;
    let start = Instant::now();
    if frees {
        held.write_all(GET).await.unwrap();
        let rest = rest_of(
            &mut held,
            "the held connection stayed open after its answer",
        )
        .await;
        assert!(rest.contains("connection: close"), "{rest}");
    }
    let answer = rest_of(&mut queued, "the queued connection was never answered").await;
    assert!(answer.starts_with("http/1.1 200"), "{answer:?}");
    assert!(answer.contains("connection: close"), "{answer}");
    if !frees {
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(900),
            "no slot waited for: {waited:?}"
        );
    }
    // The held connection goes too (its app closes it), and the drain ends.
    drop(held);
    tokio::time::timeout(Duration::from_secs(5), shut)
        .await
        .expect("the drain did not end")
        .unwrap();
}
