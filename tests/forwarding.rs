//! Forwarding through weir against real upstreams: methods, bodies both ways,
//! HTTP/2 prior knowledge, connection reuse, trailers.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response};

/// Echoes `METHOD PATH` in a header and the request body back.
async fn echo() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let line = format!("{} {}", req.method(), req.uri());
        let host = req
            .headers()
            .get("host")
            .map(|h| h.to_str().unwrap().to_string())
            .unwrap_or_default();
        let b = req.into_body().collect().await.unwrap().to_bytes();
        Response::builder()
            .header("x-seen", line)
            .header("x-seen-host", host)
            .body(body(b))
            .unwrap()
    })
    .await
}

both_paths!(
    #[tokio::test]
    methods_and_bodies_pass_through
);
async fn methods_and_bodies_pass_through(path: DataPath) {
    let up = echo().await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let c = client();
    for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
        let payload = format!("payload for {method}");
        let req = Request::builder()
            .method(method)
            .uri(weir.url("/things/1?x=y"))
            .header("host", "svc")
            .body(body(payload.clone()))
            .unwrap();
        let (parts, b) = read_body(c.request(req).await.unwrap()).await;
        assert_eq!(parts.status, 200, "{method}");
        assert_eq!(parts.headers["x-seen"], format!("{method} /things/1?x=y"));
        assert_eq!(b, payload.as_bytes(), "{method}");
        assert_eq!(parts.headers["x-weir-attempts"], "1");
    }
    let req = Request::head(weir.url("/h"))
        .header("host", "svc")
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(c.request(req).await.unwrap()).await;
    assert_eq!(parts.status, 200);
    assert_eq!(parts.headers["x-seen"], "HEAD /h");
    assert!(b.is_empty());
}

both_paths!(
    #[tokio::test]
    host_is_rewritten_unless_preserved
);
async fn host_is_rewritten_unless_preserved(path: DataPath) {
    let up = echo().await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let (parts, _) = read_body(get(&client(), &weir.url("/"), "svc").await).await;
    assert_eq!(parts.headers["x-seen-host"], up.addr.to_string());

    let weir = Weir::single_on(path, &up.url(), "preserve_host = true").await;
    let (parts, _) = read_body(get(&client(), &weir.url("/"), "SVC:8080").await).await;
    assert_eq!(parts.headers["x-seen-host"], "SVC:8080");
}

both_paths!(
    #[tokio::test]
    ten_mib_chunked_upload_and_download_are_byte_exact
);
async fn ten_mib_chunked_upload_and_download_are_byte_exact(path: DataPath) {
    let data: Vec<u8> = (0..10 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let data = Bytes::from(data);
    let up = echo().await;
    let weir = Weir::single_on(path, &up.url(), "").await;

    // Upload as a stream of 64 KiB chunks with no Content-Length (chunked).
    let chunks: Vec<Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>> = data
        .chunks(64 * 1024)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let stream = futures_util::stream::iter(chunks);
    let req = Request::post(weir.url("/upload"))
        .header("host", "svc")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap();
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    assert_eq!(parts.status, 200);
    assert_eq!(b.len(), data.len());
    assert!(b == data, "echoed body differs");

    // Download.
    let d = data.clone();
    let up = TestUpstream::start(move |_r| {
        let d = d.clone();
        async move { Response::new(body(d)) }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let (parts, b) = read_body(get(&client(), &weir.url("/big"), "svc").await).await;
    assert_eq!(parts.status, 200);
    assert!(b == data, "downloaded body differs");
}

both_paths!(
    #[tokio::test]
    http2_prior_knowledge_from_the_client
);
async fn http2_prior_knowledge_from_the_client(path: DataPath) {
    let up = echo().await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    // HTTP/2 carries the host in :authority.
    let req = Request::post("http://svc/h2")
        .body(body("over h2"))
        .unwrap();
    let resp = h2_request(weir.addr, req).await;
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let (parts, b) = read_body(resp).await;
    assert_eq!(parts.status, 200, "{parts:?}");
    assert_eq!(b, "over h2");
}

both_paths!(
    #[tokio::test]
    keep_alive_reuses_connections_on_both_sides
);
async fn keep_alive_reuses_connections_on_both_sides(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let c = client();
    for _ in 0..20 {
        let (parts, b) = read_body(get(&c, &weir.url("/"), "svc").await).await;
        assert_eq!(parts.status, 200);
        assert_eq!(b, "ok");
    }
    assert_eq!(up.requests(), 20);
    assert_eq!(
        up.connections(),
        1,
        "weir should reuse its upstream connection"
    );
}

both_paths!(
    #[tokio::test]
    response_trailers_pass_through
);
async fn response_trailers_pass_through(path: DataPath) {
    let up = TestUpstream::start(|_r| async move {
        let frames: Vec<Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>> = vec![
            Ok(Frame::data(Bytes::from_static(b"data"))),
            Ok(Frame::trailers({
                let mut t = http::HeaderMap::new();
                t.insert("grpc-status", "0".parse().unwrap());
                t.insert("x-checksum", "abc".parse().unwrap());
                t
            })),
        ];
        Response::builder()
            .header("trailer", "grpc-status, x-checksum")
            .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
                frames,
            ))))
            .unwrap()
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let req = Request::get(weir.url("/t"))
        .header("host", "svc")
        .header("te", "trailers")
        .body(body(""))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers forwarded");
    assert_eq!(trailers["x-checksum"], "abc");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(collected.to_bytes(), "data");
}

// Issue 53, item 6: response trailers are filtered as request trailers
// are. Before, an upstream's `content-length`, `host`, `authorization` and
// `set-cookie` trailers reached the client, and a `transfer-encoding`,
// `connection` or `te` one made h2 refuse the trailer section: the HTTP/2
// client got RST_STREAM(CANCEL) and lost the body it had half received.

/// Trailer fields weir must drop, as an HTTP/1.1 upstream may send them.
const FORBIDDEN_TRAILERS: [(&str, &str); 7] = [
    ("content-length", "99"),
    ("host", "evil.example"),
    ("authorization", "Bearer leaked"),
    ("set-cookie", "session=leaked"),
    ("transfer-encoding", "chunked"),
    ("connection", "close"),
    ("te", "trailers"),
];
/// The ones an h2c upstream can send at all: h2 refuses the others.
const FORBIDDEN_H2_TRAILERS: [(&str, &str); 5] = [
    ("content-length", "99"),
    ("host", "evil.example"),
    ("authorization", "Bearer leaked"),
    ("set-cookie", "session=leaked"),
    ("te", "trailers"),
];
const GOOD_TRAILERS: [(&str, &str); 2] = [("grpc-status", "0"), ("x-checksum", "abc")];

/// 256 KiB, more than an HTTP/2 stream's first window: a reset after it
/// would find some of it still on its way.
fn long_body() -> Vec<u8> {
    (0..256 * 1024).map(|i| b'a' + (i % 26) as u8).collect()
}

/// The `Trailer` field announcing `fields` (hyper's HTTP/1.1 server sends
/// only the trailer fields a response announces).
fn announce(fields: &[(&str, &str)]) -> String {
    let names: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
    names.join(", ")
}

/// An HTTP/1.1 upstream answering every request on a connection with
/// [`long_body`] chunked, then every forbidden trailer and the good ones.
async fn chunked_upstream_with_trailers() -> RawUpstream {
    RawUpstream::start(|_, mut s| async move {
        use tokio::io::AsyncWriteExt;
        let all: Vec<(&str, &str)> = FORBIDDEN_TRAILERS
            .into_iter()
            .chain(GOOD_TRAILERS)
            .collect();
        while read_head(&mut s).await {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: {}\r\n\r\n",
                announce(&all)
            )
            .into_bytes();
            for chunk in long_body().chunks(16 * 1024) {
                out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                out.extend_from_slice(chunk);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n");
            for (k, v) in &all {
                out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            if s.write_all(&out).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// An h2c upstream (the `h2` crate's server, which sends what hyper's
/// would filter) answering every request with [`long_body`], then the
/// forbidden trailers h2 lets it send and the good ones. Its URL and task.
async fn h2c_upstream_with_trailers() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(s).await else {
                    return;
                };
                let all: Vec<(&str, &str)> = FORBIDDEN_H2_TRAILERS
                    .into_iter()
                    .chain(GOOD_TRAILERS)
                    .collect();
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    let head = Response::builder()
                        .header("trailer", announce(&all))
                        .body(())
                        .unwrap();
                    let Ok(mut send) = respond.send_response(head, false) else {
                        continue;
                    };
                    let _ = send.send_data(Bytes::from(long_body()), false);
                    let mut t = http::HeaderMap::new();
                    for (k, v) in &all {
                        t.append(
                            http::HeaderName::from_static(k),
                            http::HeaderValue::from_static(v),
                        );
                    }
                    send.send_trailers(t).unwrap();
                }
            });
        }
    });
    (url, task)
}

/// An HTTP/1.1 chunked response read whole, as raw bytes: its head, its
/// body's data, and its trailer lines.
fn dechunk(raw: &str) -> (&str, Vec<u8>, Vec<&str>) {
    let (head, mut rest) = raw.split_once("\r\n\r\n").expect("a response head");
    let mut data = Vec::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size line");
        let n = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if n == 0 {
            rest = after;
            break;
        }
        data.extend_from_slice(&after.as_bytes()[..n]);
        rest = after[n..].strip_prefix("\r\n").expect("CRLF after a chunk");
    }
    let trailers = rest.split("\r\n").take_while(|l| !l.is_empty()).collect();
    (head, data, trailers)
}

/// An HTTP/2 client and an HTTP/1.1 client asking `TE: trailers` both get
/// the whole body, the good trailers, and none of the forbidden ones.
async fn only_allowed_trailers_arrive(weir: &Weir) {
    let forbidden = FORBIDDEN_TRAILERS.map(|(k, _)| k);

    let req = Request::get("http://svc/t")
        .header("te", "trailers")
        .body(body(""))
        .unwrap();
    let resp = h2_request(weir.addr, req).await;
    assert_eq!(resp.status(), 200);
    let collected = resp
        .into_body()
        .collect()
        .await
        .expect("HTTP/2: the whole body, not a reset");
    let trailers = collected.trailers().cloned().expect("HTTP/2: trailers");
    assert!(
        collected.to_bytes() == long_body(),
        "HTTP/2: the body whole"
    );
    for (k, v) in GOOD_TRAILERS {
        assert_eq!(
            trailers.get(k).map(|v| v.as_bytes()),
            Some(v.as_bytes()),
            "HTTP/2: {k}"
        );
    }
    for k in forbidden {
        assert!(
            !trailers.contains_key(k),
            "HTTP/2: a {k} trailer: {trailers:?}"
        );
    }

    let raw = exchange_raw(
        weir.addr,
        b"GET /t HTTP/1.1\r\nHost: svc\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    )
    .await;
    let (head, data, trailers) = dechunk(&raw);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(data == long_body(), "HTTP/1.1: the body whole");
    let trailers: Vec<String> = trailers.iter().map(|l| l.to_ascii_lowercase()).collect();
    for (k, v) in GOOD_TRAILERS {
        assert!(
            trailers.contains(&format!("{k}: {v}")),
            "HTTP/1.1: {k} in {trailers:?}"
        );
    }
    for k in forbidden {
        assert!(
            !trailers.iter().any(|l| l.starts_with(&format!("{k}:"))),
            "HTTP/1.1: a {k} trailer: {trailers:?}"
        );
    }
}

both_paths!(
    #[tokio::test]
    forbidden_trailers_of_an_http1_upstream_are_dropped
);
async fn forbidden_trailers_of_an_http1_upstream_are_dropped(path: DataPath) {
    let up = chunked_upstream_with_trailers().await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    only_allowed_trailers_arrive(&weir).await;
}

both_paths!(
    #[tokio::test]
    forbidden_trailers_of_an_h2c_upstream_are_dropped
);
async fn forbidden_trailers_of_an_h2c_upstream_are_dropped(path: DataPath) {
    let (url, _up) = h2c_upstream_with_trailers().await;
    let weir = Weir::single_on(path, &url, "protocol = \"h2c\"").await;
    only_allowed_trailers_arrive(&weir).await;
}

both_paths!(
    #[tokio::test]
    refused_upstream_is_502_connect_failed
);
async fn refused_upstream_is_502_connect_failed(path: DataPath) {
    let dead = refused_addr().await;
    let weir = Weir::single_on(
        path,
        &format!("http://{dead}"),
        "[upstreams.svc.retry]\nmax_attempts = 1",
    )
    .await;
    let (status, code, json) = json_error(get(&client(), &weir.url("/"), "svc").await).await;
    assert_eq!(status, 502);
    assert_eq!(code, "connect_failed");
    assert_eq!(json["error"], "connect_failed");
    assert_eq!(json["upstream"], "svc");
    assert!(
        json["message"].as_str().unwrap().contains("refused"),
        "{json}"
    );
}

both_paths!(
    #[tokio::test]
    websocket_upgrades_pass_through
);
async fn websocket_upgrades_pass_through(path: DataPath) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The upstream accepts the upgrade, then echoes bytes upper-cased.
    let up = RawUpstream::start(|_n, mut s| async move {
        let mut buf = vec![0u8; 4096];
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            head.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&head).to_lowercase();
        assert!(text.contains("upgrade: websocket"), "{text}");
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n")
            .await
            .unwrap();
        loop {
            let n = match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let upper: Vec<u8> = buf[..n].to_ascii_uppercase();
            if s.write_all(&upper).await.is_err() {
                return;
            }
        }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let mut s = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: svc\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the 101");
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    s.write_all(b"hello over the tunnel").await.unwrap();
    let mut echoed = vec![0u8; 21];
    s.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"HELLO OVER THE TUNNEL");
    assert_eq!(up.connections(), 1);
}

both_paths!(
    #[tokio::test]
    the_client_connection_is_kept_alive_too
);
async fn the_client_connection_is_kept_alive_too(path: DataPath) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let mut s = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let mut buf = vec![0u8; 4096];
    for i in 0..10 {
        s.write_all(b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        while !got.ends_with(b"ok") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "weir closed the client connection after {i} requests"
            );
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got.starts_with(b"HTTP/1.1 200"));
    }
    assert_eq!(up.connections(), 1);
}

both_paths!(
    #[tokio::test]
    request_trailers_pass_through
);
async fn request_trailers_pass_through(path: DataPath) {
    let up = TestUpstream::start(|req: hyper::Request<hyper::body::Incoming>| async move {
        let collected = req.into_body().collect().await.unwrap();
        let t = collected
            .trailers()
            .and_then(|t| t.get("x-digest"))
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        Response::new(body(t))
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let frames: Vec<Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>> = vec![
        Ok(Frame::data(Bytes::from_static(b"payload"))),
        Ok(Frame::trailers({
            let mut t = http::HeaderMap::new();
            t.insert("x-digest", "sha-256=abc".parse().unwrap());
            t
        })),
    ];
    // HTTP/1.1 only sends trailer fields the head announces.
    let req = Request::post("http://svc/upload")
        .header("trailer", "x-digest")
        .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
            frames,
        ))))
        .unwrap();
    let (parts, b) = read_body(h2_request(weir.addr, req).await).await;
    assert_eq!(parts.status, 200);
    assert_eq!(b, "sha-256=abc");
}

both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    client_connections_beyond_the_held_cap_share_the_pool
);
/// More concurrent client connections than weir holds upstream connections
/// for (128 per upstream): the rest go through the shared pool and succeed.
/// Real time: 140 simultaneous connects on a paused clock would trip the
/// connect timeout when the clock jumps ahead.
async fn client_connections_beyond_the_held_cap_share_the_pool(path: DataPath) {
    let up = TestUpstream::start(|_r| async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        Response::new(body("ok"))
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let mut calls = Vec::new();
    for _ in 0..140 {
        let url = weir.url("/");
        // A client per task: a connection each.
        calls.push(tokio::spawn(async move {
            read_body(get(&client(), &url, "svc").await).await
        }));
    }
    for c in calls {
        let (parts, b) = c.await.unwrap();
        assert_eq!((parts.status.as_u16(), &b[..]), (200, &b"ok"[..]));
    }
    assert_eq!(up.requests(), 140);
}

/// Answers with every `x-request-id` field it received, joined by `|`, in
/// `x-seen-ids` (and how many in `x-seen-id-count`).
async fn ids() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let all: Vec<String> = req
            .headers()
            .get_all("x-request-id")
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        Response::builder()
            .header("x-seen-id-count", all.len().to_string())
            .header("x-seen-ids", all.join("|"))
            .body(body(""))
            .unwrap()
    })
    .await
}

fn made(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

// Issue 41, item 6: a client's `x-request-id` is kept only when it is one
// field of 1 to 128 bytes of visible ASCII; anything else (empty, 60,000
// bytes, a space or a non-ASCII byte, two fields) is replaced by weir's own,
// one field, on both paths. It used to be forwarded as it came: a 60 KB id
// whole, two ids both (the log said the first, a Python app read the
// second), an empty one empty.
both_paths!(
    #[tokio::test]
    a_request_id_is_one_visible_ascii_field_of_at_most_128_bytes
);
async fn a_request_id_is_one_visible_ascii_field_of_at_most_128_bytes(path: DataPath) {
    let up = ids().await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let send = |fields: String| {
        let req = format!("GET /id HTTP/1.1\r\nHost: svc\r\n{fields}Connection: close\r\n\r\n");
        let addr = weir.addr;
        async move {
            let out = exchange_raw(addr, req.as_bytes()).await;
            let get = |name: &str| {
                out.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                    .unwrap_or_default()
                    .to_string()
            };
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            (get("x-seen-id-count"), get("x-seen-ids"))
        }
    };
    let kept = "0f8fad5b-d9cb-469f-a165-70867728950e";
    assert_eq!(
        send(format!("X-Request-Id: {kept}\r\n")).await,
        ("1".into(), kept.to_string())
    );
    let longest = "a".repeat(128);
    assert_eq!(
        send(format!("x-request-id: {longest}\r\n")).await,
        ("1".into(), longest)
    );
    for bad in [
        "x-request-id: \r\n".to_string(),
        format!("x-request-id: {}\r\n", "a".repeat(129)),
        format!("x-request-id: {}\r\n", "a".repeat(60_000)),
        "x-request-id: two words\r\n".to_string(),
        "x-request-id: caf\u{e9}\r\n".to_string(),
        "x-request-id: first\r\nx-request-id: second\r\n".to_string(),
    ] {
        let (count, id) = send(bad.clone()).await;
        assert_eq!(count, "1", "{bad:.60}");
        assert!(made(&id), "{bad:.60}: {id:.80}");
    }
}

/// The same over HTTP/2 (the general path).
#[tokio::test]
async fn over_http2_a_request_id_is_kept_or_replaced_alike() {
    let up = ids().await;
    let weir = Weir::single_on(DataPath::General, &up.url(), "").await;
    let send = |values: &[&str]| {
        let mut req = Request::get("http://svc/id");
        for v in values {
            req = req.header("x-request-id", *v);
        }
        h2_request(weir.addr, req.body(body("")).unwrap())
    };
    let (p, _) = read_body(send(&["order-42"]).await).await;
    assert_eq!(header(&p, "x-seen-ids"), "order-42");
    let long = "a".repeat(60_000);
    for bad in [&[""][..], &[long.as_str()], &["first", "second"]] {
        let (p, _) = read_body(send(bad).await).await;
        assert_eq!(header(&p, "x-seen-id-count"), "1");
        assert!(made(&header(&p, "x-seen-ids")), "{:.40?}", bad);
    }
}
