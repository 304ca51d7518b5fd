//! What weir puts on the wire, on both HTTP/1.1 data paths: the fast path
//! (an upstream written as an IP literal) and the general path (the same
//! upstream named `localhost`). Every test runs on each and says which.
//!
//! Regressions from a review against real servers: a request head over
//! `max_header_bytes` got hyper's bare 431 (no body, no `x-weir-error`); an
//! oversized or garbled response head was retried as `upstream_reset`; header
//! names kept their case on one path and were lowercased on the other.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The upstream's URL once per data path, labelled with the path
/// ([`weir_on`] starts weir on it).
fn paths(up: &RawUpstream) -> [(&'static str, String); 2] {
    [("fast path", up.url()), ("general path", up.url())]
}

/// The data path a [`paths`] label names.
fn data_path(label: &str) -> DataPath {
    if label == "general path" {
        DataPath::General
    } else {
        DataPath::Fast
    }
}

/// weir with one upstream `svc` at `url`, on the data path `label` names.
async fn weir_on(label: &str, url: &str) -> Weir {
    Weir::single_on(data_path(label), url, "").await
}

/// Writes `bytes` and reads until weir closes the connection.
async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// An upstream answering every request with `reply`, then closing.
async fn replying(reply: String) -> RawUpstream {
    let reply = Arc::new(reply);
    RawUpstream::start(move |_, mut s| {
        let reply = reply.clone();
        async move {
            if read_head(&mut s).await {
                let _ = s.write_all(reply.as_bytes()).await;
            }
        }
    })
    .await
}

fn get_close() -> &'static [u8] {
    b"GET /x HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n"
}

#[tokio::test]
async fn a_garbled_response_head_is_502_bad_response_and_not_retried() {
    let up = replying("NOT HTTP AT ALL\r\n\r\n".into()).await;
    for (path, url) in paths(&up) {
        let before = up.connections();
        let weir = weir_on(path, &url).await;
        let out = exchange(weir.addr, get_close()).await;
        assert!(out.starts_with("HTTP/1.1 502"), "{path}: {out}");
        assert!(out.contains("x-weir-error: bad_response"), "{path}: {out}");
        assert!(out.contains("x-weir-attempts: 1\r\n"), "{path}: {out}");
        assert_eq!(up.connections() - before, 1, "{path}: it was retried");
    }
}

#[tokio::test]
async fn a_200_kb_response_head_is_502_bad_response_and_not_retried() {
    let big = "a".repeat(200 * 1024);
    let up = replying(format!(
        "HTTP/1.1 200 OK\r\nx-big: {big}\r\ncontent-length: 2\r\n\r\nok"
    ))
    .await;
    for (path, url) in paths(&up) {
        let before = up.connections();
        let weir = weir_on(path, &url).await;
        let out = exchange(weir.addr, get_close()).await;
        assert!(
            out.starts_with("HTTP/1.1 502"),
            "{path}: {}",
            &out[..80.min(out.len())]
        );
        assert!(out.contains("x-weir-error: bad_response"), "{path}: {out}");
        assert_eq!(up.connections() - before, 1, "{path}: it was retried");
    }
}

#[tokio::test]
async fn a_request_head_over_max_header_bytes_is_weirs_431() {
    let up = replying("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into()).await;
    for (path, url) in paths(&up) {
        let weir = Weir::with_server(
            "max_header_bytes = 16384\n",
            &format!("[upstreams.svc]\nurl = \"{url}\"\nhosts = [\"svc\"]\n"),
        )
        .await;
        // Complete, and still arriving when the limit is crossed.
        let big = "b".repeat(20_000);
        for head in [
            format!("GET / HTTP/1.1\r\nHost: svc\r\nx-big: {big}\r\n\r\n"),
            format!("GET / HTTP/1.1\r\nHost: svc\r\nx-big: {big}"),
        ] {
            let out = exchange(weir.addr, head.as_bytes()).await;
            assert!(out.starts_with("HTTP/1.1 431"), "{path}: {out}");
            assert!(
                out.contains("x-weir-error: header_too_large"),
                "{path}: {out}"
            );
            assert!(
                out.contains("\"error\":\"header_too_large\""),
                "{path}: {out}"
            );
            assert!(
                out.contains("max_header_bytes (16384 bytes)"),
                "{path}: {out}"
            );
        }
        // A request after a normal one on the same connection.
        let two = format!(
            "GET / HTTP/1.1\r\nHost: svc\r\n\r\nGET / HTTP/1.1\r\nHost: svc\r\nx-big: {big}\r\n\r\n"
        );
        let out = exchange(weir.addr, two.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
        assert!(out.contains("HTTP/1.1 431"), "{path}: {out}");
    }
}

#[tokio::test]
async fn header_names_keep_their_case_both_ways() {
    let (up, seen) =
        recording("HTTP/1.1 200 OK\r\nX-Upstream-Case: 1\r\nContent-Length: 2\r\n\r\nok").await;
    for (path, url) in paths(&up) {
        let weir = weir_on(path, &url).await;
        let out = exchange(
            weir.addr,
            b"GET / HTTP/1.1\r\nHost: svc\r\nX-Request-Case: 1\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
        assert!(out.contains("\r\nX-Upstream-Case: 1\r\n"), "{path}: {out}");
        let head = seen.lock().unwrap().pop().unwrap();
        assert!(head.contains("\r\nX-Request-Case: 1\r\n"), "{path}: {head}");
    }
}

/// Regression: a GET whose body came chunked reached the upstream without
/// it (hyper sends no body for a GET of unknown length) and the client got
/// 200. A body is never dropped silently: it goes on, with its length.
#[tokio::test]
async fn a_get_with_a_chunked_body_keeps_its_body() {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s2 = seen.clone();
    let up = RawUpstream::start(move |_, mut s| {
        let seen = s2.clone();
        async move {
            let mut buf = Vec::new();
            let mut b = [0u8; 4096];
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
            loop {
                let n = match tokio::time::timeout_at(deadline, s.read(&mut b)).await {
                    Ok(Ok(n)) if n > 0 => n,
                    _ => break,
                };
                buf.extend_from_slice(&b[..n]);
                let text = String::from_utf8_lossy(&buf);
                if text.contains("\r\n\r\nhello") || text.ends_with("0\r\n\r\n") {
                    break;
                }
            }
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf).into_owned());
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .await;
        }
    })
    .await;
    for (path, url) in paths(&up) {
        for attempts in [1, 3] {
            let weir = Weir::single_on(
                data_path(path),
                &url,
                &format!("[upstreams.svc.retry]\nmax_attempts = {attempts}\n"),
            )
            .await;
            let out = exchange(
                weir.addr,
                b"GET /x HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            )
            .await;
            assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
            let head = seen.lock().unwrap().pop().unwrap();
            assert!(
                head.contains("hello"),
                "{path}, {attempts} attempts: {head}"
            );
        }
    }
}

/// An upstream that records each request head it reads, then answers `reply`.
async fn recording(reply: &'static str) -> (RawUpstream, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s2 = seen.clone();
    let up = RawUpstream::start(move |_, mut s| {
        let seen = s2.clone();
        async move {
            let mut buf = Vec::new();
            let mut b = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&b[..n]),
                }
            }
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf).into_owned());
            let _ = s.write_all(reply.as_bytes()).await;
        }
    })
    .await;
    (up, seen)
}

/// Regressions from a protocol review (each on both paths): two `Host`
/// fields were routed by the first; `Content-Length: 18446744073709551615`
/// was a 431; `Content_Length` went upstream.
#[tokio::test]
async fn odd_request_heads_are_refused_or_cleaned() {
    let (up, seen) =
        recording("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await;
    for (path, url) in paths(&up) {
        let weir = weir_on(path, &url).await;
        for head in [
            "GET / HTTP/1.1\r\nHost: svc\r\nHost: other\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: svc\r\nContent-Length: 18446744073709551615\r\n\r\n",
        ] {
            let out = exchange(weir.addr, head.as_bytes()).await;
            assert!(out.starts_with("HTTP/1.1 400"), "{path}: {head:?}: {out}");
            assert!(out.contains("x-weir-error: bad_request"), "{path}: {out}");
        }
        assert!(
            seen.lock().unwrap().is_empty(),
            "{path}: reached the upstream"
        );
        let out = exchange(
            weir.addr,
            b"GET / HTTP/1.1\r\nHost: svc\r\nContent_Length: 5\r\nTransfer_Encoding: chunked\r\nX_Ok: 1\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
        let head = seen.lock().unwrap().pop().unwrap().to_ascii_lowercase();
        assert!(
            !head.contains("content_length") && !head.contains("transfer_encoding"),
            "{path}: {head}"
        );
        assert!(head.contains("x_ok: 1"), "{path}: {head}");
    }
}

/// A 204 carries no Content-Length (RFC 9110 §8.6), and a response with
/// many Connection fields is relayed, not a 502 (both were the fast path's).
#[tokio::test]
async fn odd_response_heads_are_relayed_cleanly() {
    let (up, _) =
        recording("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await;
    let conns = "Connection: keep-alive\r\n".repeat(6);
    let (up2, _) = recording(Box::leak(
        format!("HTTP/1.1 200 OK\r\n{conns}Content-Length: 2\r\n\r\nok").into_boxed_str(),
    ))
    .await;
    for ((path, url), (_, url2)) in paths(&up).into_iter().zip(paths(&up2)) {
        let weir = weir_on(path, &url).await;
        let out = exchange(weir.addr, get_close()).await;
        assert!(out.starts_with("HTTP/1.1 204"), "{path}: {out}");
        assert!(
            !out.to_ascii_lowercase().contains("content-length"),
            "{path}: {out}"
        );
        let weir = weir_on(path, &url2).await;
        let out = exchange(weir.addr, get_close()).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
    }
}

/// `OPTIONS *` goes upstream as `*` (it was `/*`); `GET *` is a 400. And
/// a response's framing is restated: `Content-Length: 2, 2` becomes `2`,
/// and a length beside a chunked body is dropped (it promised 30 bytes that
/// never came, leaving the client waiting). Both paths.
#[tokio::test]
async fn asterisk_targets_and_response_lengths_are_relayed_correctly() {
    let (up, seen) =
        recording("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
    let (listed, _) =
        recording("HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nConnection: close\r\n\r\nok").await;
    let (both, _) = recording(
        "HTTP/1.1 200 OK\r\nContent-Length: 30\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
    )
    .await;
    for (((path, url), (_, listed)), (_, both)) in
        paths(&up).into_iter().zip(paths(&listed)).zip(paths(&both))
    {
        let weir = weir_on(path, &url).await;
        let out = exchange(
            weir.addr,
            b"OPTIONS * HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
        let head = seen.lock().unwrap().pop().unwrap();
        assert!(head.starts_with("OPTIONS * HTTP/1.1\r\n"), "{path}: {head}");
        let out = exchange(
            weir.addr,
            b"GET * HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 400"), "{path}: {out}");
        assert!(
            seen.lock().unwrap().is_empty(),
            "{path}: GET * went upstream"
        );

        let weir = weir_on(path, &listed).await;
        let out = exchange(weir.addr, get_close()).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
        let lower = out.to_ascii_lowercase();
        assert!(lower.contains("content-length: 2\r\n"), "{path}: {out}");
        assert!(out.ends_with("\r\n\r\nok"), "{path}: {out}");

        let weir = weir_on(path, &both).await;
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            exchange(weir.addr, get_close()),
        )
        .await
        .unwrap_or_else(|_| panic!("{path}: the client was left waiting for the body"));
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
        assert!(
            !out.to_ascii_lowercase().contains("content-length: 30"),
            "{path}: {out}"
        );
    }
}

/// Found by the `response_head` fuzz target: a HEAD response with its
/// length given twice reached the client with both fields (the fast path
/// kept a body-less response's lengths as they came). One, on both paths.
#[tokio::test]
async fn a_head_response_carries_one_length() {
    let (up, _) = recording(
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
    )
    .await;
    for (path, url) in paths(&up) {
        let weir = weir_on(path, &url).await;
        let out = exchange(
            weir.addr,
            b"HEAD / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
        let lower = out.to_ascii_lowercase();
        assert_eq!(
            lower.matches("content-length: 2\r\n").count(),
            1,
            "{path}: {out}"
        );
    }
}

/// An upstream that records each request it reads, head and body (read
/// until the bytes end with `end`), then answers 200 `ok` and closes.
async fn recording_to(end: &'static [u8]) -> (RawUpstream, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s2 = seen.clone();
    let up = RawUpstream::start(move |_, mut s| {
        let seen = s2.clone();
        async move {
            let mut buf = Vec::new();
            let mut b = [0u8; 4096];
            while !(buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.ends_with(end)) {
                match s.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&b[..n]),
                }
            }
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf).into_owned());
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .await;
        }
    })
    .await;
    (up, seen)
}

/// An h2c upstream that records each request as text — `METHOD :path`,
/// then one `name: value` line per field — and answers 200 `ok`.
async fn h2_recording() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = s2.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let target = req.uri().path_and_query().map_or("", |p| p.as_str());
                    let mut text = format!("{} {target}\n", req.method());
                    for (n, v) in req.headers() {
                        text.push_str(&format!("{n}: {}\n", String::from_utf8_lossy(v.as_bytes())));
                    }
                    seen.lock().unwrap().push(text);
                    let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
                        continue;
                    };
                    let _ = send.send_data(bytes::Bytes::from_static(b"ok"), true);
                }
            });
        }
    });
    (url, seen)
}

/// `OPTIONS *` with an HTTP/2 `:path` of `*` (RFC 9113 §8.3.1): the
/// request an h2c client sends for the asterisk form.
fn h2_options_asterisk() -> http::Request<TestBody> {
    let uri = http::Uri::from_parts({
        let mut p = http::uri::Parts::default();
        p.scheme = Some(http::uri::Scheme::HTTP);
        p.authority = Some(http::uri::Authority::from_static("svc"));
        p.path_and_query = Some(http::uri::PathAndQuery::from_static("*"));
        p
    })
    .unwrap();
    http::Request::options(uri).body(body("")).unwrap()
}

/// `OPTIONS *` asks about the server as a whole (RFC 9112 §3.2.4): it goes
/// upstream as `OPTIONS * HTTP/1.1` to an HTTP/1.1 upstream and with
/// `:path: *` to an h2c one, whether the client sent it over HTTP/1.1 or
/// as HTTP/2's `:path: *`. (On abf590e an h2c client's `OPTIONS *` reached
/// an HTTP/1.1 upstream as `OPTIONS /*`, and an h2c upstream as `:path: /*`.)
async fn options_asterisk_goes_upstream_as_asterisk(path: DataPath) {
    let asterisk = b"OPTIONS * HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n";
    // To an HTTP/1.1 upstream.
    let (up, seen) = recording_to(b"\r\n\r\n").await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let out = exchange_raw(weir.addr, asterisk).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{path:?}: {out}");
    let head = seen.lock().unwrap().pop().unwrap();
    assert!(
        head.starts_with("OPTIONS * HTTP/1.1\r\n"),
        "{path:?}: {head}"
    );
    let resp = h2_request(weir.addr, h2_options_asterisk()).await;
    assert_eq!(resp.status(), 200, "{path:?}, h2c client");
    let head = seen.lock().unwrap().pop().unwrap();
    assert!(
        head.starts_with("OPTIONS * HTTP/1.1\r\n"),
        "{path:?}, h2c client: {head}"
    );
    // To an h2c upstream.
    let (url, seen) = h2_recording().await;
    let weir = Weir::single_on(path, &url, "protocol = \"h2c\"").await;
    let out = exchange_raw(weir.addr, asterisk).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{path:?}, h2c: {out}");
    let head = seen.lock().unwrap().pop().unwrap();
    assert!(head.starts_with("OPTIONS *\n"), "{path:?}, h2c: {head}");
    let resp = h2_request(weir.addr, h2_options_asterisk()).await;
    assert_eq!(resp.status(), 200, "{path:?}, h2c client to h2c");
    let head = seen.lock().unwrap().pop().unwrap();
    assert!(
        head.starts_with("OPTIONS *\n"),
        "{path:?}, h2c client to h2c: {head}"
    );
}
both_paths!(
    #[tokio::test]
    options_asterisk_goes_upstream_as_asterisk
);

/// How many lines of `head` are the field `name` (any case).
fn fields_named(head: &str, name: &str) -> Vec<String> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

/// A POST of `hello` with `content-length: 5` twice, over HTTP/2.
fn h2_length_twice() -> http::Request<TestBody> {
    http::Request::post("http://svc/x")
        .header("content-length", "5")
        .header("content-length", "5")
        .body(body("hello"))
        .unwrap()
}

/// Two identical `Content-Length` fields are one length (RFC 9110 §8.6
/// lets a recipient take them as one): the upstream gets one field, over
/// HTTP/1.1 and over h2c, from an HTTP/1.1 client and from an h2c one.
/// Differing ones stay a 400 (hygiene.rs,
/// `conflicting_content_lengths_are_400`; h2 resets an HTTP/2 client's
/// stream). (On abf590e an h2c client's two fields both went upstream.)
async fn identical_content_lengths_go_upstream_as_one(path: DataPath) {
    let twice = b"POST /x HTTP/1.1\r\nHost: svc\r\nContent-Length: 5\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    let (up, seen) = recording_to(b"hello").await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let out = exchange_raw(weir.addr, twice).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{path:?}: {out}");
    let head = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        fields_named(&head, "content-length"),
        ["5"],
        "{path:?}: {head}"
    );
    assert!(head.ends_with("\r\n\r\nhello"), "{path:?}: {head}");
    let resp = h2_request(weir.addr, h2_length_twice()).await;
    assert_eq!(resp.status(), 200, "{path:?}, h2c client");
    let head = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        fields_named(&head, "content-length"),
        ["5"],
        "{path:?}, h2c client: {head}"
    );
    assert!(
        head.ends_with("\r\n\r\nhello"),
        "{path:?}, h2c client: {head}"
    );

    let (url, seen) = h2_recording().await;
    let weir = Weir::single_on(path, &url, "protocol = \"h2c\"").await;
    let out = exchange_raw(weir.addr, twice).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{path:?}, h2c: {out}");
    let head = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        fields_named(&head, "content-length"),
        ["5"],
        "{path:?}, h2c: {head}"
    );
    let resp = h2_request(weir.addr, h2_length_twice()).await;
    assert_eq!(resp.status(), 200, "{path:?}, h2c client to h2c");
    let head = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        fields_named(&head, "content-length"),
        ["5"],
        "{path:?}, h2c client to h2c: {head}"
    );
}
both_paths!(
    #[tokio::test]
    identical_content_lengths_go_upstream_as_one
);

/// `TE` is hop-by-hop: whoever sends it names it in `Connection` too (RFC
/// 9110 §10.1.4). A client's `TE: trailers` reaches an HTTP/1.1 upstream
/// with `Connection: te`, from an HTTP/1.1 client and from an h2c one; an
/// h2c upstream gets `te: trailers` and no `Connection` (HTTP/2 has none).
/// (On abf590e the HTTP/1.1 upstream got `TE` without `Connection: te`.)
async fn te_trailers_goes_with_connection_te(path: DataPath) {
    let te = b"GET /t HTTP/1.1\r\nHost: svc\r\nTE: trailers\r\nConnection: close\r\n\r\n";
    let names_te = |head: &str| {
        fields_named(head, "connection")
            .iter()
            .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("te")))
    };
    let (up, seen) = recording_to(b"\r\n\r\n").await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let out = exchange_raw(weir.addr, te).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{path:?}: {out}");
    let head = seen.lock().unwrap().pop().unwrap();
    assert_eq!(fields_named(&head, "te"), ["trailers"], "{path:?}: {head}");
    assert!(names_te(&head), "{path:?}: {head}");
    let req = http::Request::get("http://svc/t")
        .header("te", "trailers")
        .body(body(""))
        .unwrap();
    let resp = h2_request(weir.addr, req).await;
    assert_eq!(resp.status(), 200, "{path:?}, h2c client");
    let head = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        fields_named(&head, "te"),
        ["trailers"],
        "{path:?}, h2c client: {head}"
    );
    assert!(names_te(&head), "{path:?}, h2c client: {head}");

    let (url, seen) = h2_recording().await;
    let weir = Weir::single_on(path, &url, "protocol = \"h2c\"").await;
    let out = exchange_raw(weir.addr, te).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{path:?}, h2c: {out}");
    let head = seen.lock().unwrap().pop().unwrap();
    assert_eq!(
        fields_named(&head, "te"),
        ["trailers"],
        "{path:?}, h2c: {head}"
    );
    assert!(
        fields_named(&head, "connection").is_empty(),
        "{path:?}, h2c: {head}"
    );
}
both_paths!(
    #[tokio::test]
    te_trailers_goes_with_connection_te
);
