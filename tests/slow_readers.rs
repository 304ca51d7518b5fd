//! A client that stops reading cannot hold its slots forever (a security
//! review: 10 HTTP/1 clients requesting a 20 MB body with a 4 KB receive
//! buffer held `max_in_flight = 10` indefinitely; HTTP/2 connections with an
//! initial window of 0 took every slot). A response the client takes
//! nothing of for `client_write_timeout` is abandoned: the connection ends
//! and the slot is free again.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const BIG: usize = 20 << 20;

async fn big_upstream() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        if req.uri().path() == "/big" {
            Response::new(body(Bytes::from(vec![b'x'; BIG])))
        } else {
            Response::new(body("ok"))
        }
    })
    .await
}

fn config(up: &TestUpstream) -> String {
    format!(
        "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n[upstreams.svc.concurrency]\nmax_in_flight = 1\n",
        up.url()
    )
}

both_paths!(
    #[tokio::test(start_paused = true)]
    an_http1_client_that_stops_reading_is_let_go
);
async fn an_http1_client_that_stops_reading_is_let_go(path: DataPath) {
    let up = big_upstream().await;
    let weir = Weir::with_server_on(path, "client_write_timeout = \"2s\"", &config(&up)).await;
    // A client with a small receive buffer that asks for 20 MB and reads
    // nothing.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut stuck = sock.connect(weir.addr).await.unwrap();
    stuck
        .write_all(b"GET /big HTTP/1.1\r\nHost: svc\r\n\r\n")
        .await
        .unwrap();
    // While it holds the only slot, others are turned away...
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _) = status_of(&weir, "/small").await;
    assert_eq!(status, 503, "the slot was not taken by the stuck response");
    // ...and once the write timeout has passed, the slot is free again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, b) = status_of(&weir, "/small").await;
    assert_eq!((status, b.as_str()), (200, "ok"));
    drop(stuck);
}

async fn status_of(weir: &Weir, path: &str) -> (u16, String) {
    let (parts, b) = read_body(get(&client(), &weir.url(path), "svc").await).await;
    (
        parts.status.as_u16(),
        String::from_utf8_lossy(&b).into_owned(),
    )
}

#[tokio::test(start_paused = true)]
async fn an_http2_client_with_a_zero_window_is_let_go() {
    let up = big_upstream().await;
    let weir = Weir::with_server("client_write_timeout = \"2s\"", &config(&up)).await;
    let stream = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let resp = send
        .send_request(Request::get("http://svc/big").body(body("")).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The headers came; no byte of the body can. The slot is held...
    let (status, _) = status_of(&weir, "/small").await;
    assert_eq!(status, 503);
    // ...until the write timeout lets the connection go.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, b) = status_of(&weir, "/small").await;
    assert_eq!((status, b.as_str()), (200, "ok"));
    drop(resp);
    conn.abort();
}
