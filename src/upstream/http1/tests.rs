//! weir's own HTTP/1.1 client against scripted upstreams on real sockets:
//! what goes on the wire, how each framing is read, when a connection goes
//! back to the pool, and how failures are classified.

use super::*;
use crate::metrics::meter::{Meter, Metered};
use crate::upstream::send::Failure;
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that reads a request's head (and `body` bytes more), then
/// writes `answer`; it sends back what it read.
async fn upstream(
    answer: &'static [u8],
    body: usize,
) -> (Address, tokio::task::JoinHandle<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = Address::Tcp(l.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut chunk).await.unwrap();
            if n == 0 {
                return got;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        let head = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        while got.len() < head + body {
            let n = s.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        s.write_all(answer).await.unwrap();
        // Held open a while: the client decides whether to keep it.
        let _ =
            tokio::time::timeout(std::time::Duration::from_millis(300), s.read(&mut chunk)).await;
        got
    });
    (addr, task)
}

async fn connect(addr: Address) -> UpstreamIo {
    let s = TcpStream::connect(addr.tcp().unwrap()).await.unwrap();
    UpstreamIo::Plain(Metered::new(s, &Meter::unregistered()))
}

fn request(method: Method, body: Body) -> Request<Body> {
    let mut r = Request::new(body);
    *r.method_mut() = method;
    *r.uri_mut() = http::Uri::from_static("/path?q=1");
    r.headers_mut()
        .insert("host", http::HeaderValue::from_static("up"));
    r
}

fn full(b: &'static [u8]) -> Body {
    http_body_util::Full::new(Bytes::from_static(b))
        .map_err(|never| match never {})
        .boxed()
}

/// A body of unknown length: `parts` frames, then trailers if given.
fn streamed(parts: Vec<&'static [u8]>, trailers: Option<http::HeaderMap>) -> Body {
    let mut frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> = parts
        .into_iter()
        .map(|p| Ok(http_body::Frame::data(Bytes::from_static(p))))
        .collect();
    if let Some(t) = trailers {
        frames.push(Ok(http_body::Frame::trailers(t)));
    }
    StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

async fn exchange(
    addr: Address,
    pool: &Arc<H1Pool>,
    req: Request<Body>,
) -> Result<Response<H1Body>, SendError> {
    let back = GiveBack {
        pool: Arc::downgrade(pool),
        addr,
        tag: 0,
    };
    send(connect(addr).await, back, req).await
}

fn pooled(pool: &H1Pool, addr: Address) -> bool {
    pool.take(addr, 0, tokio::time::Instant::now()).is_some()
}

#[tokio::test]
async fn a_get_by_length_goes_back_to_the_pool() {
    let (addr, up) = upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
        0,
    )
    .await;
    let pool = Arc::new(H1Pool::default());
    let resp = exchange(addr, &pool, request(Method::GET, full(b"")))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-a"], "1");
    assert_eq!(resp.body().size_hint().exact(), Some(5));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello");
    assert!(pooled(&pool, addr));
    let got = up.await.unwrap();
    assert_eq!(got, b"GET /path?q=1 HTTP/1.1\r\nhost: up\r\n\r\n");
}

#[tokio::test]
async fn a_chunked_response_arrives_with_its_trailers() {
    let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 42\r\n\r\n";
    let (addr, _up) = upstream(answer, 0).await;
    let pool = Arc::new(H1Pool::default());
    let resp = exchange(addr, &pool, request(Method::GET, full(b"")))
        .await
        .unwrap();
    let collected = resp.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-sum"], "42");
    assert_eq!(&collected.to_bytes()[..], b"hello world");
    assert!(pooled(&pool, addr));
}

#[tokio::test]
async fn a_body_to_the_close_is_whole_and_its_connection_not_kept() {
    let (addr, _up) = upstream(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", 0).await;
    let pool = Arc::new(H1Pool::default());
    let resp = exchange(addr, &pool, request(Method::GET, full(b""))).await;
    // The scripted upstream holds the connection 300 ms, then closes.
    let body = resp
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"until the end");
    assert!(!pooled(&pool, addr));
}

#[tokio::test]
async fn a_body_cut_short_is_an_error_and_the_connection_is_not_kept() {
    let (addr, _up) = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", 0).await;
    let pool = Arc::new(H1Pool::default());
    let resp = exchange(addr, &pool, request(Method::GET, full(b"")))
        .await
        .unwrap();
    assert!(resp.into_body().collect().await.is_err());
    assert!(!pooled(&pool, addr));
}

#[tokio::test]
async fn a_known_length_is_said_and_a_post_without_body_says_zero() {
    let (addr, up) = upstream(b"HTTP/1.1 204 No Content\r\n\r\n", 11).await;
    let pool = Arc::new(H1Pool::default());
    let resp = exchange(addr, &pool, request(Method::PUT, full(b"hello world"))).await;
    assert_eq!(resp.unwrap().status(), 204);
    let got = up.await.unwrap();
    assert_eq!(
        got,
        b"PUT /path?q=1 HTTP/1.1\r\nhost: up\r\ncontent-length: 11\r\n\r\nhello world"
    );
    let (addr, up) = upstream(b"HTTP/1.1 204 No Content\r\n\r\n", 0).await;
    let resp = exchange(addr, &pool, request(Method::POST, full(b""))).await;
    assert_eq!(resp.unwrap().status(), 204);
    let got = up.await.unwrap();
    assert_eq!(
        got,
        b"POST /path?q=1 HTTP/1.1\r\nhost: up\r\ncontent-length: 0\r\n\r\n"
    );
}

#[tokio::test]
async fn cookies_split_by_an_http2_client_go_as_one_field() {
    let (addr, up) = upstream(b"HTTP/1.1 204 No Content\r\n\r\n", 0).await;
    let pool = Arc::new(H1Pool::default());
    let mut req = request(Method::GET, full(b""));
    req.headers_mut()
        .append("cookie", http::HeaderValue::from_static("a=1"));
    req.headers_mut()
        .append("x-b", http::HeaderValue::from_static("2"));
    req.headers_mut()
        .append("cookie", http::HeaderValue::from_static("c=3"));
    let resp = exchange(addr, &pool, req).await.unwrap();
    assert_eq!(resp.status(), 204);
    // An ended body gives its connection back without being read.
    assert!(pooled(&pool, addr));
    let got = up.await.unwrap();
    assert_eq!(
        got,
        b"GET /path?q=1 HTTP/1.1\r\nhost: up\r\nx-b: 2\r\ncookie: a=1; c=3\r\n\r\n"
    );
}

#[tokio::test]
async fn an_unknown_length_goes_chunked_with_its_trailers() {
    let wire = b"POST /path?q=1 HTTP/1.1\r\nhost: up\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nx-t: 1\r\n\r\n";
    let head = wire.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let (addr, up) = upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        wire.len() - head,
    )
    .await;
    let pool = Arc::new(H1Pool::default());
    let mut t = http::HeaderMap::new();
    t.insert("x-t", http::HeaderValue::from_static("1"));
    // Not a field a trailer section may carry: dropped.
    t.insert("content-length", http::HeaderValue::from_static("5"));
    let body = streamed(vec![b"abc", b"de"], Some(t));
    let resp = exchange(addr, &pool, request(Method::POST, body))
        .await
        .unwrap();
    resp.into_body().collect().await.unwrap();
    assert!(pooled(&pool, addr));
    assert_eq!(up.await.unwrap(), wire);
}

#[tokio::test]
async fn the_client_s_content_length_is_kept_for_a_streamed_body() {
    let (addr, up) = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 5).await;
    let pool = Arc::new(H1Pool::default());
    let mut req = request(Method::POST, streamed(vec![b"ab", b"cde"], None));
    req.headers_mut()
        .insert("content-length", http::HeaderValue::from_static("5"));
    exchange(addr, &pool, req).await.unwrap();
    assert_eq!(
        up.await.unwrap(),
        b"POST /path?q=1 HTTP/1.1\r\nhost: up\r\ncontent-length: 5\r\n\r\nabcde"
    );
    // A body longer than it said fails as the client's.
    let (addr, _up) = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 100).await;
    let mut req = request(Method::POST, streamed(vec![b"ab", b"cdefgh"], None));
    req.headers_mut()
        .insert("content-length", http::HeaderValue::from_static("5"));
    let e = exchange(addr, &pool, req).await.unwrap_err();
    assert_eq!(e.kind, Failure::ClientBody);
}

#[tokio::test]
async fn an_early_answer_comes_back_while_the_body_is_unread() {
    // The upstream answers after the head and never reads the body: 8 MiB
    // would fill both sockets' buffers.
    let (addr, _up) = upstream(
        b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\n\r\n",
        0,
    )
    .await;
    let pool = Arc::new(H1Pool::default());
    let big: &'static [u8] = Box::leak(vec![7u8; 8 << 20].into_boxed_slice());
    let got = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        exchange(addr, &pool, request(Method::POST, full(big))),
    )
    .await
    .expect("the early answer, not a hang");
    let resp = got.unwrap();
    assert_eq!(resp.status(), 413);
    drop(resp);
    assert!(!pooled(&pool, addr));
}

#[tokio::test]
async fn a_client_body_that_breaks_off_after_the_answer_ends_the_response() {
    // The upstream answers after the head with a body it sends in two
    // parts, the second only after the whole request (which never comes).
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = Address::Tcp(l.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut b = [0u8; 4096];
        let _ = s.read(&mut b).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfirst")
            .await;
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    });
    let pool = Arc::new(H1Pool::default());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(2);
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    let mut req = request(Method::POST, StreamBody::new(stream).boxed());
    req.headers_mut()
        .insert("content-length", http::HeaderValue::from_static("100"));
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"part"))))
        .await
        .unwrap();
    let resp = exchange(addr, &pool, req).await.unwrap();
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "first");
    tx.send(Err("the client went away".into())).await.unwrap();
    // The response ends with the client's failure, not a 30 s wait.
    let next = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame()).await;
    assert!(matches!(next, Ok(Some(Err(_)))), "{next:?}");
    assert!(!pooled(&pool, addr));
}

#[tokio::test]
async fn interims_are_dropped_and_a_flood_is_a_bad_response() {
    let answer = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    let (addr, _up) = upstream(answer, 0).await;
    let pool = Arc::new(H1Pool::default());
    let resp = exchange(addr, &pool, request(Method::GET, full(b"")))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let flood: &'static [u8] = Box::leak(
        b"HTTP/1.1 102 Processing\r\n\r\n"
            .repeat(101)
            .into_boxed_slice(),
    );
    let (addr, _up) = upstream(flood, 0).await;
    let e = exchange(addr, &pool, request(Method::GET, full(b"")))
        .await
        .unwrap_err();
    assert_eq!(e.kind, Failure::BadResponse);
}

#[tokio::test]
async fn a_close_before_any_answer_is_a_reset_and_garbage_a_bad_response() {
    let (addr, _up) = upstream(b"", 0).await;
    let pool = Arc::new(H1Pool::default());
    // The scripted upstream closes after its hold without a word.
    let e = exchange(addr, &pool, request(Method::GET, full(b"")))
        .await
        .unwrap_err();
    assert_eq!(e.kind, Failure::Reset);
    let (addr, _up) = upstream(b"SMTP ready\r\n\r\n", 0).await;
    let e = exchange(addr, &pool, request(Method::GET, full(b"")))
        .await
        .unwrap_err();
    assert_eq!(e.kind, Failure::BadResponse);
}
