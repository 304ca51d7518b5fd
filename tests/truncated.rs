//! An upstream body that ends early is an upstream failure
//! (docs/reference/cache.md#response-cache, #retries): an upstream announces
//! `Content-Length: 5000`, sends 250 bytes and closes. On a cached upstream
//! the client gets the stale entry within its `stale-if-error`, else weir's
//! 502 `upstream_reset`, and nothing is stored; on an upstream without a
//! cache, whose body weir relays as it comes, the client's connection ends
//! short of the length, so no client can take the 250 bytes for the whole
//! body, and the break is counted in `weir_upstream_body_errors_total`.
//! Raw bytes, both paths.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Answers its first `whole` requests with a whole 5000-byte body
/// (`max-age=1, stale-if-error=60`), every later one with 250 of the 5000
/// bytes it announces, then closes.
async fn truncating(whole: usize) -> (RawUpstream, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let up = RawUpstream::start(move |_, mut s| {
        let served = served.clone();
        async move {
            while read_head(&mut s).await {
                let n = served.fetch_add(1, Ordering::SeqCst);
                let head = "HTTP/1.1 200 OK\r\ncontent-length: 5000\r\ncache-control: max-age=1, stale-if-error=60\r\n\r\n";
                let _ = s.write_all(head.as_bytes()).await;
                if n < whole {
                    let _ = s.write_all(&[b'a'; 5000]).await;
                } else {
                    let _ = s.write_all(&[b'b'; 250]).await;
                    let _ = s.flush().await;
                    return;
                }
            }
        }
    })
    .await;
    (up, count)
}

const GET: &[u8] = b"GET /big HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n";

/// The response's status line and the length of the body that came.
fn parse(out: &[u8]) -> (String, usize) {
    let text = String::from_utf8_lossy(out);
    let status = text.lines().next().unwrap_or_default().to_string();
    let body = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |i| out.len() - i - 4);
    (status, body)
}

fn metrics(weir: &Weir) -> String {
    weir.handle.as_ref().unwrap().snapshot().metrics.render()
}

/// `series{…error or code="upstream_reset"…, upstream="svc"}`.
fn count(weir: &Weir, series: &str) -> usize {
    metrics(weir)
        .lines()
        .find(|l| {
            l.starts_with(&format!("{series}{{"))
                && l.contains("=\"upstream_reset\"")
                && l.contains("upstream=\"svc\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as usize
}

const NO_RETRY: &str = "[upstreams.svc.retry]\nmax_attempts = 1\n";

both_paths!(
    #[tokio::test]
    a_truncated_body_on_a_miss_is_a_502_and_not_stored
);
async fn a_truncated_body_on_a_miss_is_a_502_and_not_stored(path: DataPath) {
    let (up, _) = truncating(0).await;
    let extra = format!("[upstreams.svc.cache]\nenabled = true\n{NO_RETRY}");
    let weir = Weir::single_on(path, &up.url(), &extra).await;
    let out = exchange_raw(weir.addr, GET).await;
    let (status, _) = parse(out.as_bytes());
    assert!(status.starts_with("HTTP/1.1 502"), "{out}");
    assert!(out.contains("x-weir-error: upstream_reset"), "{out}");
    assert_eq!(count(&weir, "weir_requests_total"), 1);
    // Nothing was stored: the next request goes upstream again.
    let _ = exchange_raw(weir.addr, GET).await;
    assert_eq!(up.connections(), 2);
}

both_paths!(
    #[tokio::test]
    a_truncated_body_is_answered_from_an_entry_within_stale_if_error
);
async fn a_truncated_body_is_answered_from_an_entry_within_stale_if_error(path: DataPath) {
    let (up, served) = truncating(1).await;
    let extra = format!("[upstreams.svc.cache]\nenabled = true\n{NO_RETRY}");
    let weir = Weir::single_on(path, &up.url(), &extra).await;
    let out = exchange_raw(weir.addr, GET).await;
    assert_eq!(parse(out.as_bytes()), ("HTTP/1.1 200 OK".into(), 5000));
    // Stale after max-age=1; within stale-if-error=60.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let out = exchange_raw(weir.addr, GET).await;
    assert_eq!(
        parse(out.as_bytes()),
        ("HTTP/1.1 200 OK".into(), 5000),
        "{out}"
    );
    assert!(out.contains("x-weir-cache: stale-if-error"), "{out}");
    assert!(
        !out.contains("bbbb"),
        "the truncated body reached the client"
    );
    // The second request went upstream (on the pooled connection, or a new
    // one), and its truncated answer was not relayed.
    assert_eq!(served.load(Ordering::SeqCst), 2);
}

both_paths!(
    #[tokio::test]
    a_truncated_body_without_a_cache_ends_the_connection_short
);
async fn a_truncated_body_without_a_cache_ends_the_connection_short(path: DataPath) {
    let (up, _) = truncating(0).await;
    let weir = Weir::single_on(path, &up.url(), NO_RETRY).await;
    let out = exchange_raw(weir.addr, GET).await;
    let (status, len) = parse(out.as_bytes());
    // Either weir's 502 before any of the body, or the head and fewer
    // bytes than it announces, then the end of the connection.
    if status.starts_with("HTTP/1.1 200") {
        assert!(out.contains("content-length: 5000"), "{out}");
        assert!(len < 5000, "{len} bytes");
    } else {
        assert!(status.starts_with("HTTP/1.1 502"), "{out}");
    }
    // The head (200) is counted as answered; the break as a body error.
    assert_eq!(
        count(&weir, "weir_upstream_body_errors_total"),
        1,
        "{}",
        metrics(&weir)
    );
}

/// Over HTTP/2 the client's stream is reset: its body read fails rather
/// than ending at 250 bytes. (The reset may overtake the response head
/// when the upstream's body breaks off before the head has left: h2 drops
/// a reset stream's queued frames. Either way the client never takes the
/// body for whole.)
#[tokio::test]
async fn over_http2_a_truncated_body_resets_the_stream() {
    use http_body_util::BodyExt;
    let (up, _) = truncating(0).await;
    let weir = Weir::single_on(DataPath::General, &up.url(), NO_RETRY).await;
    let req = hyper::Request::get("http://svc/big")
        .body(body(""))
        .unwrap();
    let (mut send, _conn) = h2_connect(weir.addr).await;
    let resp = match send.send_request(req).await {
        Ok(r) => r,
        Err(e) => {
            let reset = e.to_string().contains("INTERNAL_ERROR")
                || format!("{e:?}").contains("INTERNAL_ERROR");
            assert!(reset, "{e:?}");
            return;
        }
    };
    assert_eq!(resp.status().as_u16(), 200);
    let got = resp.into_body().collect().await;
    assert!(got.is_err(), "the stream ended as if whole");
}

both_paths!(
    #[tokio::test]
    the_access_log_says_the_body_broke_off
);
async fn the_access_log_says_the_body_broke_off(path: DataPath) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // One capture for the whole binary, whatever thread weir's tasks run
    // on; this request's line is the one with its client's address.
    let logs = Captured::global();
    let (up, _) = truncating(0).await;
    // The default mode, `errors`: a 200 whose body broke off is one.
    let weir = Weir::single_on(path, &up.url(), NO_RETRY).await;
    let mut c = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let me = format!("client={}", c.local_addr().unwrap());
    c.write_all(GET).await.unwrap();
    let _ = c.read_to_end(&mut Vec::new()).await;
    let mine = || -> Vec<String> {
        let all = logs.lines_of("weir::access");
        all.into_iter().filter(|l| l.contains(&me)).collect()
    };
    // The line is written as the connection's task ends (up to 2 s).
    let mut lines = mine();
    for _ in 0..200 {
        if !lines.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        lines = mine();
    }
    assert_eq!(lines.len(), 1, "{lines:?} {:?}", logs.lines_of(""));
    assert!(lines[0].contains("status=200"), "{}", lines[0]);
    assert!(
        lines[0].contains("error=\"upstream_reset\"") || lines[0].contains("error=upstream_reset"),
        "{}",
        lines[0]
    );
}
