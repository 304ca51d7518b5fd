//! HTTP/2 clients to an upstream spoken to in HTTP/1.1 go on weir's own
//! HTTP/1.1 client (docs/reference/endpoints.md#connections): a connection
//! goes back to the worker's pool as each response ends, so clients share
//! them; a body keeps its length, an unknown one goes chunked with its
//! trailers, and a chunked response's trailers reach the client as HTTP/2
//! trailers.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTP/1.1 upstream that reads each request whole (by its
/// `Content-Length` or to its last chunk) and answers `answer`; what it read
/// is kept in `seen`.
async fn keeping(answer: &'static [u8]) -> (RawUpstream, Arc<Mutex<Vec<Vec<u8>>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let up = RawUpstream::start(move |_, mut s| {
        let seen = seen.clone();
        async move {
            let mut buf = Vec::new();
            let mut b = [0u8; 4096];
            loop {
                let whole = |buf: &[u8]| {
                    let head = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
                    let text = String::from_utf8_lossy(&buf[..head]).to_ascii_lowercase();
                    let len = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .map(|v| v.trim().parse::<usize>().unwrap());
                    match len {
                        Some(n) => (buf.len() >= head + n).then_some(head + n),
                        // The last chunk and the trailer section end it.
                        None if text.contains("transfer-encoding: chunked") => {
                            (buf.len() > head && buf.ends_with(b"\r\n\r\n")).then_some(buf.len())
                        }
                        None => Some(head),
                    }
                };
                let end = loop {
                    if let Some(end) = whole(&buf) {
                        break end;
                    }
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                };
                seen.lock().unwrap().push(buf.drain(..end).collect());
                if s.write_all(answer).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (up, kept)
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

#[tokio::test]
async fn h2c_clients_share_the_worker_s_upstream_connections() {
    let (up, _) = keeping(OK).await;
    let weir = Weir::single_on(DataPath::General, &format!("http://{}", up.addr), "").await;
    // Two clients in turn, the first still connected: one upstream
    // connection serves both (hyper's client would hold one per client
    // connection).
    let (mut a, _ca) = h2_connect(weir.addr).await;
    let (mut b, _cb) = h2_connect(weir.addr).await;
    for i in 0..4 {
        let send = if i % 2 == 0 { &mut a } else { &mut b };
        let req = hyper::Request::get("http://svc/x").body(body("")).unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            &resp.into_body().collect().await.unwrap().to_bytes()[..],
            b"ok"
        );
    }
    assert_eq!(up.connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_length_is_kept_and_an_unknown_one_goes_chunked_with_trailers() {
    let (up, seen) = keeping(OK).await;
    let weir = Weir::single_on(DataPath::General, &format!("http://{}", up.addr), "").await;
    let (mut send, _c) = h2_connect(weir.addr).await;
    let req = hyper::Request::post("http://svc/known")
        .body(body("hello"))
        .unwrap();
    assert_eq!(send.send_request(req).await.unwrap().status(), 200);
    // A streamed body with trailers, its length unknown.
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::convert::Infallible>>(4);
    let streamed = http_body_util::StreamBody::new(tokio_stream_of(rx))
        .map_err(|n| match n {})
        .boxed();
    let req = hyper::Request::post("http://svc/streamed")
        .body(streamed)
        .unwrap();
    let answer = tokio::spawn(async move { send.send_request(req).await.map(|r| r.status()) });
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"abc"))))
        .await
        .unwrap();
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"de"))))
        .await
        .unwrap();
    let mut t = http::HeaderMap::new();
    t.insert("x-sum", http::HeaderValue::from_static("5"));
    tx.send(Ok(http_body::Frame::trailers(t))).await.unwrap();
    drop(tx);
    assert_eq!(answer.await.unwrap().unwrap(), 200);
    let seen = seen.lock().unwrap().clone();
    let known = String::from_utf8_lossy(&seen[0]).to_ascii_lowercase();
    assert!(known.starts_with("post /known http/1.1\r\n"), "{known}");
    assert!(known.contains("\r\ncontent-length: 5\r\n"), "{known}");
    assert!(!known.contains("transfer-encoding"), "{known}");
    assert!(known.ends_with("\r\n\r\nhello"), "{known}");
    let streamed = String::from_utf8_lossy(&seen[1]).to_ascii_lowercase();
    assert!(
        streamed.contains("\r\ntransfer-encoding: chunked\r\n"),
        "{streamed}"
    );
    // The chunks as they came, or as the replay buffer joined them.
    let chunks = streamed.split_once("\r\n\r\n").unwrap().1;
    assert!(
        chunks == "3\r\nabc\r\n2\r\nde\r\n0\r\nx-sum: 5\r\n\r\n"
            || chunks == "5\r\nabcde\r\n0\r\nx-sum: 5\r\n\r\n",
        "{streamed}"
    );
}

/// The frames `rx` yields, as a stream.
fn tokio_stream_of<T>(rx: tokio::sync::mpsc::Receiver<T>) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|t| (t, rx)) })
}

#[tokio::test]
async fn a_chunked_response_s_trailers_reach_the_h2c_client() {
    let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-digest: abc\r\n\r\n";
    let (up, _) = keeping(answer).await;
    let weir = Weir::single_on(DataPath::General, &format!("http://{}", up.addr), "").await;
    let (mut send, _c) = h2_connect(weir.addr).await;
    let req = hyper::Request::get("http://svc/t").body(body("")).unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("transfer-encoding").is_none());
    let got = resp.into_body().collect().await.unwrap();
    assert_eq!(got.trailers().unwrap()["x-digest"], "abc");
    assert_eq!(&got.to_bytes()[..], b"hello");
}
