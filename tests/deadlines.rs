//! Deadlines: `timeout` to response headers, `per_try_timeout`, `idle_timeout`
//! between body chunks, and the request lowering its own deadline. Time is
//! tokio's paused clock: a 2 s test takes milliseconds and cannot flake.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use std::time::Duration;
use tokio::time::Instant;

type Chunk = Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>;

/// Answers after `delay`.
async fn slow(delay: Duration) -> TestUpstream {
    TestUpstream::start(move |_r| async move {
        tokio::time::sleep(delay).await;
        Response::new(body("late"))
    })
    .await
}

/// Sends headers at once, then `n` chunks `every` apart.
async fn dribble(n: usize, every: Duration) -> TestUpstream {
    TestUpstream::start(move |_r| async move {
        let s = futures_util::stream::unfold(0usize, move |i| async move {
            if i == n {
                return None;
            }
            tokio::time::sleep(every).await;
            Some((
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(Bytes::from(
                    format!("{i};"),
                ))),
                i + 1,
            ))
        });
        let s: std::pin::Pin<Box<dyn futures_util::Stream<Item = Chunk> + Send + Sync>> =
            Box::pin(s);
        Response::new(BodyExt::boxed(StreamBody::new(s)))
    })
    .await
}

both_paths!(
    #[tokio::test(start_paused = true)]
    per_try_timeout_is_504_upstream_timeout
);
async fn per_try_timeout_is_504_upstream_timeout(path: DataPath) {
    let up = slow(Duration::from_secs(5)).await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "per_try_timeout = \"1s\"\ntimeout = \"10s\"\n[upstreams.svc.retry]\nmax_attempts = 1",
    )
    .await;
    let start = Instant::now();
    let (status, code, json) = json_error(get(&client(), &weir.url("/"), "svc").await).await;
    assert_eq!((status, code.as_str()), (504, "upstream_timeout"), "{json}");
    let e = start.elapsed();
    assert!(
        e >= Duration::from_secs(1) && e < Duration::from_millis(1100),
        "{e:?}"
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    request_can_lower_its_deadline
);
async fn request_can_lower_its_deadline(path: DataPath) {
    let up = slow(Duration::from_secs(1)).await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let start = Instant::now();
    let req = Request::get(weir.url("/"))
        .header("host", "svc")
        .header("x-weir-timeout-ms", "100")
        .body(body(""))
        .unwrap();
    let (status, code, json) = json_error(client().request(req).await.unwrap()).await;
    assert_eq!(
        (status, code.as_str()),
        (504, "deadline_exceeded"),
        "{json}"
    );
    let e = start.elapsed();
    assert!(
        e >= Duration::from_millis(100) && e < Duration::from_millis(150),
        "{e:?}"
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    request_cannot_raise_its_deadline
);
async fn request_cannot_raise_its_deadline(path: DataPath) {
    let up = slow(Duration::from_secs(3)).await;
    let weir = Weir::single_on(path, &up.url(), "timeout = \"1s\"").await;
    let start = Instant::now();
    let req = Request::get(weir.url("/"))
        .header("host", "svc")
        .header("x-weir-timeout-ms", "60000")
        .body(body(""))
        .unwrap();
    let (status, code, _) = json_error(client().request(req).await.unwrap()).await;
    assert_eq!((status, code.as_str()), (504, "deadline_exceeded"));
    let e = start.elapsed();
    assert!(
        e >= Duration::from_secs(1) && e < Duration::from_millis(1100),
        "{e:?}"
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    grpc_timeout_lowers_the_deadline_and_the_clients_own_is_passed_on
);
async fn grpc_timeout_lowers_the_deadline_and_the_clients_own_is_passed_on(path: DataPath) {
    let up = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let t = req
            .headers()
            .get("grpc-timeout")
            .map(|v| v.to_str().unwrap().to_string());
        tokio::time::sleep(Duration::from_secs(1)).await;
        Response::new(body(t.unwrap_or_default()))
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let req = Request::post(weir.url("/pkg.Svc/Method"))
        .header("host", "svc")
        .header("grpc-timeout", "200m")
        .body(body(""))
        .unwrap();
    let (status, code, _) = json_error(client().request(req).await.unwrap()).await;
    assert_eq!((status, code.as_str()), (504, "deadline_exceeded"));

    let req = Request::post(weir.url("/pkg.Svc/Method"))
        .header("host", "svc")
        .header("grpc-timeout", "5S")
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    assert_eq!(parts.status, 200);
    let ms: u64 = String::from_utf8_lossy(&b)
        .trim_end_matches('m')
        .parse()
        .unwrap();
    assert!(
        (4900..=5000).contains(&ms),
        "grpc-timeout forwarded as {ms}m"
    );

    // Regression: the client's deadline is passed on, not weir's `timeout`
    // (15 s here), which bounds only the wait for response headers: a 60 s
    // server stream was cut at 15 s by the upstream.
    let req = Request::post(weir.url("/pkg.Svc/Method"))
        .header("host", "svc")
        .header("grpc-timeout", "60S")
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    assert_eq!(parts.status, 200);
    let ms: u64 = String::from_utf8_lossy(&b)
        .trim_end_matches('m')
        .parse()
        .unwrap();
    assert!(
        (59_900..=60_000).contains(&ms),
        "grpc-timeout forwarded as {ms}m"
    );

    // Without a client deadline none is invented.
    let req = Request::post(weir.url("/pkg.Svc/Method"))
        .header("host", "svc")
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    assert_eq!(parts.status, 200);
    assert_eq!(b, "", "a grpc-timeout was sent upstream");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    malformed_weir_timeout_is_400
);
async fn malformed_weir_timeout_is_400(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single_on(path, &up.url(), "").await;
    let req = Request::get(weir.url("/"))
        .header("host", "svc")
        .header("x-weir-timeout-ms", "soon")
        .body(body(""))
        .unwrap();
    let (status, code, json) = json_error(client().request(req).await.unwrap()).await;
    assert_eq!((status, code.as_str()), (400, "bad_request"));
    assert!(json["message"]
        .as_str()
        .unwrap()
        .contains("x-weir-timeout-ms"));
    assert_eq!(up.requests(), 0);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_stalled_body_is_cut_at_idle_timeout
);
async fn a_stalled_body_is_cut_at_idle_timeout(path: DataPath) {
    a_stalled_body_is_cut(path, "").await;
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_stalled_body_from_an_h2c_upstream_is_cut_at_idle_timeout
);
async fn a_stalled_body_from_an_h2c_upstream_is_cut_at_idle_timeout(path: DataPath) {
    a_stalled_body_is_cut(path, "protocol = \"h2c\"").await;
}

/// A body that stalls after two chunks, from an upstream configured with
/// `extra`, is cut after `idle_timeout` (1 s).
async fn a_stalled_body_is_cut(path: DataPath, extra: &str) {
    // Two chunks, then silence for 10 s.
    let up = TestUpstream::start(|_r| async move {
        let s = futures_util::stream::unfold(0usize, |i| async move {
            match i {
                0 | 1 => Some((Ok(Frame::data(Bytes::from_static(b"x"))), i + 1)),
                _ => {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    None
                }
            }
        });
        let s: std::pin::Pin<Box<dyn futures_util::Stream<Item = Chunk> + Send + Sync>> =
            Box::pin(s);
        Response::new(BodyExt::boxed(StreamBody::new(s)))
    })
    .await;
    let config = format!("idle_timeout = \"1s\"\n{extra}");
    let weir = Weir::single_on(path, &up.url(), &config).await;
    let resp = get(&client(), &weir.url("/"), "svc").await;
    assert_eq!(resp.status(), 200);
    let start = Instant::now();
    let r = resp.into_body().collect().await;
    assert!(r.is_err(), "the stalled body was not cut");
    let e = start.elapsed();
    assert!(
        e >= Duration::from_secs(1) && e < Duration::from_secs(2),
        "{e:?}"
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    streaming_past_the_timeout_is_not_cut
);
async fn streaming_past_the_timeout_is_not_cut(path: DataPath) {
    // 10 chunks 200 ms apart: a 2 s download through a 1 s request timeout.
    let up = dribble(10, Duration::from_millis(200)).await;
    let weir = Weir::single_on(path, &up.url(), "timeout = \"1s\"").await;
    let start = Instant::now();
    let (parts, b) = read_body(get(&client(), &weir.url("/"), "svc").await).await;
    assert_eq!(parts.status, 200);
    assert_eq!(b, "0;1;2;3;4;5;6;7;8;9;");
    assert!(start.elapsed() >= Duration::from_secs(2));
}

/// An upstream that answers each request with `n` interim responses
/// (`100 Continue`, written in batches), `every` apart (zero: as fast as it
/// can), and then closes without a final one.
async fn interims(n: usize, every: Duration) -> RawUpstream {
    RawUpstream::start(move |_, mut s| async move {
        use tokio::io::AsyncWriteExt;
        if !read_head(&mut s).await {
            return;
        }
        let batch = if every.is_zero() { 50 } else { 1 };
        let bytes = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(batch);
        for _ in 0..n / batch {
            if s.write_all(&bytes).await.is_err() {
                return;
            }
            if !every.is_zero() {
                tokio::time::sleep(every).await;
            }
        }
    })
    .await
}

// Issue 41, item 2: a flood of `100 Continue` used to be read for as long
// as it lasted (the fast path's deadline timer, polled after the read,
// never got a turn; the general path burned a core until the deadline), and
// then retried as a reset. Past 100 interim responses it is now a 502
// `bad_response`, not retried.
both_paths!(
    #[tokio::test(start_paused = true)]
    a_flood_of_interim_responses_is_a_bad_response
);
async fn a_flood_of_interim_responses_is_a_bad_response(path: DataPath) {
    let up = interims(5000, Duration::ZERO).await;
    let weir = Weir::single_on(path, &up.url(), "timeout = \"8s\"\n").await;
    let req = "GET /flood HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n";
    let out = exchange_raw(weir.addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert!(out.contains("x-weir-error: bad_response"), "{out}");
    assert!(out.contains("x-weir-attempts: 1\r\n"), "{out}");
    assert!(out.contains("interim (1xx)"), "{out}");
    assert_eq!(up.connections(), 1);
}

/// The same flood for a client on HTTP/2 (the general path).
#[tokio::test(start_paused = true)]
async fn over_http2_a_flood_of_interim_responses_is_a_bad_response() {
    let up = interims(5000, Duration::ZERO).await;
    let weir = Weir::single_on(DataPath::General, &up.url(), "timeout = \"8s\"\n").await;
    let req = Request::get("http://svc/flood").body(body("")).unwrap();
    let (p, b) = read_body(h2_request(weir.addr, req).await).await;
    assert_eq!(p.status.as_u16(), 502, "{b:?}");
    assert_eq!(header(&p, "x-weir-error"), "bad_response");
    assert_eq!(up.connections(), 1);
}

// Interim responses count against the deadline: fifty of them 100 ms apart
// (below the cap) end in 504 at the deadline, not when they stop.
both_paths!(
    #[tokio::test(start_paused = true)]
    interim_responses_count_against_the_deadline
);
async fn interim_responses_count_against_the_deadline(path: DataPath) {
    let up = interims(50, Duration::from_millis(100)).await;
    let extra = "timeout = \"1s\"\n[upstreams.svc.retry]\nmax_attempts = 1\n";
    let weir = Weir::single_on(path, &up.url(), extra).await;
    let t0 = Instant::now();
    let req = "GET /trickle HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n";
    let out = exchange_raw(weir.addr, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 504"), "{out}");
    assert!(out.contains("x-weir-error: deadline_exceeded"), "{out}");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(2),
        "{took:?}"
    );
}
