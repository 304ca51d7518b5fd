//! Uploads and the timers (docs/reference/deadlines.md#uploads): `timeout`
//! and `per_try_timeout` wait for the upstream's answer, so the time a
//! client takes to send its body does not count against them; while it
//! comes, `idle_timeout` bounds each gap, and the client's own deadline
//! (`x-weir-timeout-ms`, `grpc-timeout`) covers the whole call, upload
//! included. Issue 54, item 5: 10 gRPC messages 100 ms apart through
//! `per_try_timeout = "500ms"` ended in DEADLINE_EXCEEDED at 553 ms. Time
//! is tokio's paused clock, so the uploads take no real time; but for the
//! gRPC calls over HTTP/2, which run in real time (a second or two each,
//! as tests/grpc.rs does).
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

const MS: Duration = Duration::from_millis(1);

/// An upload: `n` chunks of `size` bytes, `every` apart (the first at
/// once), then, when `stall` is set, that long a silence before its end.
fn upload(n: usize, size: usize, every: Duration, stall: Option<Duration>) -> TestBody {
    let s = futures_util::stream::unfold(0usize, move |i| async move {
        if i == n {
            tokio::time::sleep(stall?).await;
            return None;
        }
        if i > 0 {
            tokio::time::sleep(every).await;
        }
        Some((
            Ok::<_, _>(Frame::data(Bytes::from(vec![b'u'; size]))),
            i + 1,
        ))
    });
    let s: std::pin::Pin<Box<dyn futures_util::Stream<Item = Chunk> + Send + Sync>> = Box::pin(s);
    BodyExt::boxed(StreamBody::new(s))
}

/// An upstream that reads the whole body, waits `then`, and answers 200
/// with the number of bytes it read.
async fn counting(then: Duration) -> TestUpstream {
    TestUpstream::start(move |req: Request<hyper::body::Incoming>| async move {
        let n = req.into_body().collect().await.map(|b| b.to_bytes().len());
        tokio::time::sleep(then).await;
        match n {
            Ok(n) => Response::new(body(n.to_string())),
            Err(_) => Response::builder()
                .status(499)
                .body(body("the body broke off"))
                .unwrap(),
        }
    })
    .await
}

/// A POST of `body` to `svc` through `weir`, with `fields`.
fn post(weir: &Weir, body: TestBody, fields: &[(&str, &str)]) -> Request<TestBody> {
    let mut b = Request::post(weir.url("/upload")).header("host", "svc");
    for (k, v) in fields {
        b = b.header(*k, *v);
    }
    b.body(body).unwrap()
}

/// 48 KiB chunks: the first is held for a replay, the second passes the
/// 64 KiB replay buffer, and the rest of the upload streams through the
/// attempt. `max_attempts = 1` streams all of it (nothing is held).
const STREAMS: [&str; 2] = ["", "[upstreams.svc.retry]\nmax_attempts = 1"];
const CHUNK: usize = 48 * 1024;

both_paths!(
    #[tokio::test(start_paused = true)]
    a_slow_chunked_upload_is_not_cut_by_per_try_timeout
);
async fn a_slow_chunked_upload_is_not_cut_by_per_try_timeout(path: DataPath) {
    let up = counting(Duration::ZERO).await;
    for extra in STREAMS {
        let weir = Weir::single_on(
            path,
            &up.url(),
            &format!("per_try_timeout = \"500ms\"\n{extra}"),
        )
        .await;
        let t0 = Instant::now();
        let req = post(&weir, upload(10, CHUNK, 100 * MS, None), &[]);
        let (parts, b) = read_body(client().request(req).await.unwrap()).await;
        assert_eq!(parts.status, 200, "{extra}: {b:?}");
        assert_eq!(b, (10 * CHUNK).to_string(), "{extra}");
        assert!(t0.elapsed() >= 900 * MS, "{extra}: {:?}", t0.elapsed());
    }
}

// "A 17 s upload under the default 15 s `timeout` is cut at 15 s": a body
// held for a replay (here 1 KiB, with its length) was read under `timeout`.
both_paths!(
    #[tokio::test(start_paused = true)]
    a_slow_upload_is_not_cut_by_timeout
);
async fn a_slow_upload_is_not_cut_by_timeout(path: DataPath) {
    let up = counting(Duration::ZERO).await;
    let weir = Weir::single_on(path, &up.url(), "timeout = \"5s\"").await;
    let t0 = Instant::now();
    let body = upload(10, 100, Duration::from_secs(1), None);
    let req = post(&weir, body, &[("content-length", "1000")]);
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    assert_eq!(parts.status, 200, "{b:?}");
    assert_eq!(b, "1000");
    assert!(t0.elapsed() >= Duration::from_secs(9), "{:?}", t0.elapsed());
}

both_paths!(
    #[tokio::test(start_paused = true)]
    an_upload_that_stops_is_ended_at_idle_timeout
);
async fn an_upload_that_stops_is_ended_at_idle_timeout(path: DataPath) {
    let up = counting(Duration::ZERO).await;
    let weir = Weir::single_on(path, &up.url(), "idle_timeout = \"1s\"").await;
    let stall = Some(Duration::from_secs(10));
    // Streamed (chunked, past the replay buffer), and read ahead for a
    // replay (1 KiB with its length, 100 bytes sent).
    let cases = [
        ("streamed", upload(2, CHUNK, 100 * MS, stall), None),
        ("held", upload(1, 100, MS, stall), Some("1024")),
    ];
    for (what, body, length) in cases {
        let fields: Vec<(&str, &str)> = length.map(|l| ("content-length", l)).into_iter().collect();
        let t0 = Instant::now();
        let resp = client().request(post(&weir, body, &fields)).await;
        let took = t0.elapsed();
        let resp = resp.unwrap();
        let (status, code, json) = json_error(resp).await;
        assert_eq!(
            (status, code.as_str()),
            (504, "deadline_exceeded"),
            "{what}: {json}"
        );
        // One second after the last bytes came (at once, or at 100 ms).
        assert!(
            took >= Duration::from_secs(1) && took < 1300 * MS,
            "{what}: {took:?}"
        );
    }
}

both_paths!(
    #[tokio::test(start_paused = true)]
    the_clients_own_deadline_covers_the_upload
);
async fn the_clients_own_deadline_covers_the_upload(path: DataPath) {
    let up = counting(Duration::ZERO).await;
    for extra in STREAMS {
        let weir = Weir::single_on(path, &up.url(), extra).await;
        let t0 = Instant::now();
        let req = post(
            &weir,
            upload(10, CHUNK, 100 * MS, None),
            &[("x-weir-timeout-ms", "500")],
        );
        let (status, code, json) = json_error(client().request(req).await.unwrap()).await;
        assert_eq!(
            (status, code.as_str()),
            (504, "deadline_exceeded"),
            "{extra}: {json}"
        );
        // (On the fast path the client's deadline counts from the hand-over
        // to the general path, once the body passed the replay buffer.)
        let took = t0.elapsed();
        assert!(took >= 500 * MS && took < 700 * MS, "{extra}: {took:?}");
    }
}

// The timers still run once the body is whole: an upstream that takes 2 s
// to answer after a 900 ms upload is cut 500 ms after the upload's end
// (`per_try_timeout`), and `timeout` likewise.
both_paths!(
    #[tokio::test(start_paused = true)]
    a_slow_answer_after_the_upload_still_times_out
);
async fn a_slow_answer_after_the_upload_still_times_out(path: DataPath) {
    let up = counting(Duration::from_secs(2)).await;
    let cases = [
        ("per_try_timeout = \"500ms\"", "upstream_timeout"),
        ("timeout = \"500ms\"", "deadline_exceeded"),
    ];
    for (extra, error) in cases {
        for streams in STREAMS {
            let config = format!("{extra}\n{streams}");
            let weir = Weir::single_on(path, &up.url(), &config).await;
            let t0 = Instant::now();
            let req = post(&weir, upload(10, CHUNK, 100 * MS, None), &[]);
            let (status, code, json) = json_error(client().request(req).await.unwrap()).await;
            assert_eq!((status, code.as_str()), (504, error), "{config}: {json}");
            let took = t0.elapsed();
            assert!(took >= 1400 * MS && took < 1500 * MS, "{config}: {took:?}");
        }
    }
}

/// A gRPC client stream over h2c: `n` 5-byte-framed messages `every` apart,
/// then, when `stall` is set, that long a silence before its end.
fn grpc_call(
    n: usize,
    every: Duration,
    stall: Option<Duration>,
    timeout: Option<&str>,
) -> Request<TestBody> {
    let mut b = Request::post("http://svc/weir.interop.Matrix/Upload")
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(t) = timeout {
        b = b.header("grpc-timeout", t);
    }
    let s = futures_util::stream::unfold(0usize, move |i| async move {
        if i == n {
            tokio::time::sleep(stall?).await;
            return None;
        }
        if i > 0 {
            tokio::time::sleep(every).await;
        }
        Some((
            Ok::<_, _>(Frame::data(Bytes::from_static(b"\x00\x00\x00\x00\x02up"))),
            i + 1,
        ))
    });
    let s: std::pin::Pin<Box<dyn futures_util::Stream<Item = Chunk> + Send + Sync>> = Box::pin(s);
    b.body(BodyExt::boxed(StreamBody::new(s))).unwrap()
}

/// A gRPC server that reads the whole client stream and answers one
/// message with OK.
async fn grpc_counting() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let read = req.into_body().collect().await.is_ok();
        let frames: Vec<Chunk> = vec![
            Ok(Frame::data(Bytes::from_static(b"\x00\x00\x00\x00\x02ok"))),
            Ok(Frame::trailers({
                let mut t = http::HeaderMap::new();
                let status = if read { "0" } else { "13" };
                t.insert("grpc-status", status.parse().unwrap());
                t
            })),
        ];
        Response::builder()
            .header("content-type", "application/grpc")
            .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
                frames,
            ))))
            .unwrap()
    })
    .await
}

/// The call's `grpc-status` (from the trailers, or a trailers-only
/// answer's headers), its `grpc-message`, and how long it took.
async fn grpc_status(weir: &Weir, req: Request<TestBody>) -> (String, String, Duration) {
    let t0 = Instant::now();
    let resp = h2_request(weir.addr, req).await;
    assert_eq!(resp.status(), 200, "gRPC answers are HTTP 200");
    let (parts, b) = resp.into_parts();
    let collected = b.collect().await.unwrap();
    let took = t0.elapsed();
    let field = |name: &str| {
        let t = collected.trailers().and_then(|t| t.get(name));
        t.or_else(|| parts.headers.get(name))
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    (field("grpc-status"), field("grpc-message"), took)
}

const GRPC: &str = "protocol = \"grpc\"\nper_try_timeout = \"500ms\"\n";

#[tokio::test]
async fn a_grpc_client_stream_is_not_cut_by_per_try_timeout() {
    let up = grpc_counting().await;
    for extra in STREAMS {
        let weir = Weir::single(&up.url(), &format!("{GRPC}{extra}")).await;
        let (status, message, took) = grpc_status(&weir, grpc_call(10, 100 * MS, None, None)).await;
        assert_eq!(status, "0", "{extra}: {message}");
        assert!(took >= 900 * MS, "{extra}: {took:?}");
    }
}

#[tokio::test]
async fn a_grpc_timeout_covers_the_client_stream() {
    let up = grpc_counting().await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let call = grpc_call(10, 100 * MS, None, Some("300m"));
    let (status, message, took) = grpc_status(&weir, call).await;
    assert_eq!(status, "4", "DEADLINE_EXCEEDED: {message}");
    assert!(took >= 300 * MS && took < 900 * MS, "{took:?}");
}

#[tokio::test]
async fn a_grpc_client_stream_that_stops_is_ended_at_idle_timeout() {
    let up = grpc_counting().await;
    let weir = Weir::single(&up.url(), &format!("{GRPC}idle_timeout = \"1s\"\n")).await;
    let call = grpc_call(3, 100 * MS, Some(Duration::from_secs(10)), None);
    let (status, message, took) = grpc_status(&weir, call).await;
    assert_eq!(status, "4", "DEADLINE_EXCEEDED: {message}");
    // One second after the third message (at 200 ms).
    assert!(took >= 1200 * MS && took < 2500 * MS, "{took:?}");
}

/// The change is said by `weir check` where a config sets `timeout` or
/// `per_try_timeout` (once for a `[defaults]` field every upstream
/// shares), and nowhere else.
#[test]
fn weir_check_says_what_changed_where_a_timeout_is_set() {
    let notes = |src: &str| -> Vec<String> {
        let c = weir::config::Config::parse(std::path::Path::new("w.toml"), src).unwrap();
        c.advice
            .iter()
            .map(|a| a.to_string())
            .filter(|n| n.contains("no longer counts the time the request body takes to arrive"))
            .collect()
    };
    let up = |name: &str, extra: &str| {
        format!("[upstreams.{name}]\nurl = \"http://127.0.0.1:1\"\nhosts = [\"{name}\"]\n{extra}")
    };
    let src = format!(
        "[defaults]\ntimeout = \"10s\"\n{}{}",
        up("a", "per_try_timeout = \"1s\"\n"),
        up("b", "")
    );
    let said = notes(&src);
    assert_eq!(said.len(), 2, "{said:#?}");
    assert!(
        said.iter().any(|n| n.starts_with("note: w.toml:2:")
            && n.contains("`defaults.timeout`: `timeout` no longer counts")),
        "{said:#?}"
    );
    assert!(
        said.iter()
            .any(|n| n.contains("`upstreams.a.per_try_timeout`")
                && n.contains("docs/reference/deadlines.md#uploads")),
        "{said:#?}"
    );
    let plain = notes(&up("c", "idle_timeout = \"5s\"\n"));
    assert!(plain.is_empty(), "{plain:#?}");
}

/// `weir_concurrency_latency_seconds{upstream="svc"}`: the adaptive limit's
/// latency estimate.
fn adaptive_latency(weir: &Weir) -> f64 {
    let handle = weir.handle.as_ref().unwrap();
    // Brought up to date as a scrape does.
    handle.snapshot().upstreams[0].refresh_gauges();
    let text = handle.metrics().render();
    text.lines()
        .find(|l| l.starts_with("weir_concurrency_latency_seconds{") && l.contains("\"svc\""))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(f64::NAN)
}

// The adaptive limit measures the upstream, not the client: uploads of
// 300 ms to an upstream that answers at once are no 300 ms latency (the
// general path streams them through the attempt, and its estimate was
// 0.3 s; the fast path reads such a body whole before it takes a place).
both_paths!(
    #[tokio::test(start_paused = true)]
    the_adaptive_limit_leaves_the_upload_out_of_its_samples
);
async fn the_adaptive_limit_leaves_the_upload_out_of_its_samples(path: DataPath) {
    let up = counting(Duration::ZERO).await;
    let config = "[upstreams.svc.retry]\nmax_attempts = 1\n\
                  [upstreams.svc.concurrency]\nlimit = \"adaptive\"";
    let weir = Weir::single_on(path, &up.url(), config).await;
    for i in 0..24 {
        let req = post(&weir, upload(4, 1024, 100 * MS, None), &[]);
        let (parts, _) = read_body(client().request(req).await.unwrap()).await;
        assert_eq!(parts.status, 200, "upload {i}");
    }
    let latency = adaptive_latency(&weir);
    assert!(latency < 0.05, "the adaptive limit's latency: {latency} s");
}
