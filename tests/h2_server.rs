//! weir's HTTP/2 server side (docs/reference/protocols.md#inbound), spoken
//! to with the `h2` crate's client directly, so that what goes on the wire
//! is what the test sees: the limits it announces, a reset stream
//! cancelling its request, the head it writes, and a body larger than
//! every window. Whatever drives the server (hyper's today), these hold.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use http::Request;
use std::time::Duration;

/// An `h2` client connection to `addr`, driven in the background.
async fn connect(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send.ready().await.unwrap()
}

/// Sends a bodiless request and reads the answer whole: its status, head
/// and body, or the stream's error.
async fn fetch(
    send: &mut h2::client::SendRequest<Bytes>,
    req: Request<()>,
) -> Result<(http::response::Parts, Vec<u8>), h2::Error> {
    let (resp, _) = send.send_request(req, true)?;
    let (parts, mut body) = resp.await?.into_parts();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    Ok((parts, got))
}

fn get(path: &str) -> Request<()> {
    Request::get(format!("http://svc{path}")).body(()).unwrap()
}

#[tokio::test]
async fn the_limits_announced_are_the_configured_ones() {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::with_server(
        "max_streams_per_connection = 7\nmax_header_bytes = 8192",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n",
            up.url()
        ),
    )
    .await;
    let mut send = connect(weir.addr).await;
    let (parts, b) = fetch(&mut send, get("/")).await.unwrap();
    assert_eq!((parts.status.as_u16(), &b[..]), (200, &b"ok"[..]));
    assert_eq!(send.current_max_send_streams(), 7);
    // A head over `max_header_bytes` never reaches the upstream; the
    // connection goes on.
    let mut big = get("/big");
    big.headers_mut()
        .insert("x-big", "a".repeat(12 * 1024).parse().unwrap());
    match fetch(&mut send, big).await {
        Ok((parts, _)) => assert_eq!(parts.status.as_u16(), 431),
        Err(e) => assert!(e.is_reset(), "{e}"),
    }
    let (parts, _) = fetch(&mut send, get("/after")).await.unwrap();
    assert_eq!(parts.status.as_u16(), 200);
    assert_eq!(up.requests(), 2);
}

#[tokio::test]
async fn a_reset_stream_gives_back_its_concurrency_slot() {
    // `/hang` is never answered; one slot, no queue: while the first
    // request holds the slot, any other is refused.
    let up = TestUpstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        if req.uri().path() == "/hang" {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        http::Response::new(body("ok"))
    })
    .await;
    let weir = Weir::start(&format!(
        "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\ntimeout = \"60s\"\n\
         [upstreams.svc.concurrency]\nmax_in_flight = 1\nmax_queue = 0\n",
        up.url()
    ))
    .await;
    let mut send = connect(weir.addr).await;
    let (hang, _) = send.send_request(get("/hang"), true).unwrap();
    // The upstream has it: the slot is held.
    for _ in 0..200 {
        if up.requests() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(up.requests(), 1);
    let (parts, _) = fetch(&mut send, get("/refused")).await.unwrap();
    assert_eq!(parts.status.as_u16(), 503);
    // The client resets the stream (dropping its response future sends
    // RST_STREAM): the request is abandoned and its slot freed.
    drop(hang);
    let mut status = 0;
    for _ in 0..200 {
        let (parts, _) = fetch(&mut send, get("/ok")).await.unwrap();
        status = parts.status.as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status, 200);
}

#[tokio::test]
async fn weir_s_own_answers_carry_date_and_length() {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single(&up.url(), "").await;
    let mut send = connect(weir.addr).await;
    let req = Request::get("http://nowhere/").body(()).unwrap();
    let (parts, b) = fetch(&mut send, req).await.unwrap();
    assert_eq!(parts.status.as_u16(), 404);
    assert!(parts.headers.contains_key("date"), "{parts:?}");
    assert_eq!(header(&parts, "content-length"), b.len().to_string());
    assert!(!parts.headers.contains_key("connection"));
}

#[tokio::test]
async fn a_body_larger_than_every_window_moves_both_ways() {
    // The upstream echoes what it read; 3 MiB is three times weir's
    // windows and the client's.
    let up = TestUpstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        use http_body_util::BodyExt;
        let b = req.into_body().collect().await.unwrap().to_bytes();
        http::Response::new(body(b))
    })
    .await;
    let weir = Weir::single(&up.url(), "").await;
    let mut send = connect(weir.addr).await;
    let sent: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let req = Request::post("http://svc/echo")
        .header("content-length", sent.len())
        .body(())
        .unwrap();
    let (resp, mut stream) = send.send_request(req, false).unwrap();
    let upload = {
        let sent = Bytes::from(sent.clone());
        tokio::spawn(async move {
            let mut at = 0;
            while at < sent.len() {
                stream.reserve_capacity(sent.len() - at);
                let n = std::future::poll_fn(|cx| stream.poll_capacity(cx))
                    .await
                    .unwrap()
                    .unwrap();
                let end = at + n == sent.len();
                stream.send_data(sent.slice(at..at + n), end).unwrap();
                at += n;
            }
        })
    };
    let (parts, mut b) = resp.await.unwrap().into_parts();
    assert_eq!(parts.status.as_u16(), 200);
    assert_eq!(header(&parts, "content-length"), sent.len().to_string());
    let mut got = Vec::new();
    while let Some(chunk) = b.data().await {
        let chunk = chunk.unwrap();
        let _ = b.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    upload.await.unwrap();
    assert!(got == sent, "{} bytes back of {}", got.len(), sent.len());
}
